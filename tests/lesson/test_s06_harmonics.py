"""Screen 6: sinusoids as harmonics; wavelengths and the constant norm."""

from posemb.absolute import sinusoidal_table
from posemb.freqs import wavelengths
from posemb.lesson.screens import s06_harmonics as s06


def test_the_norm_claim_fails_when_positions_differ_in_length(broken):
    def uneven(p, d, **kw):
        return sinusoidal_table(p, d, **kw) * (1 + p[:, None] % 2)

    assert not broken("sinusoidal.constant_norm", "sinusoidal_table", uneven)


def test_the_wavelength_claim_fails_on_another_base(broken):
    assert not broken(
        "sinusoidal.wavelengths_768", "wavelengths", lambda d: wavelengths(d, 10001.0)
    )


def test_the_bridge_turns_each_pair_by_k_omega(by_id):
    fig = by_id["fig-shift-is-rotation"]
    assert len(fig.states) == len(s06.SHIFT_PAIRS) * len(s06.SHIFT_KS) * len(s06.SHIFT_VIEWS)
    for key, readout in fig.readouts.items():
        err = float(readout.rsplit("difference ", 1)[1].rstrip(")"))
        assert err < 1e-12, (key, readout)
    rope_view = next(k for k in fig.states if k.endswith(s06.SHIFT_VIEWS[1]))
    assert "R_m q" in fig.states[rope_view]
