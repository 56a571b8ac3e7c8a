"""Screen 9: learned against sinusoidal at scale; parameter counts, extrapolation."""

from posemb.lesson import measure


def test_the_parameter_claim_fails_when_the_sinusoidal_table_is_learned(broken):
    counts = measure.param_counts()
    fault = {**counts, "sinusoidal": counts["nope"] + 768}
    assert not broken("absolute.parameter_counts", "param_counts", lambda: fault)


def test_the_extrapolation_claim_fails_when_sinusoidal_keeps_its_loss(broken, fake_lab):
    flat = fake_lab(sinusoidal_flat=True)
    assert not broken("sinusoidal.extrapolation_is_not_enabled", "lab_summary", lambda: flat)
