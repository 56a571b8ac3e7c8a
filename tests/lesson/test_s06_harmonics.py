"""Screen 6: sinusoids as harmonics; wavelengths and the constant norm."""

from posemb.absolute import sinusoidal_table
from posemb.freqs import wavelengths


def test_the_norm_claim_fails_when_positions_differ_in_length(broken):
    def uneven(p, d, **kw):
        return sinusoidal_table(p, d, **kw) * (1 + p[:, None] % 2)

    assert not broken("sinusoidal.constant_norm", "sinusoidal_table", uneven)


def test_the_wavelength_claim_fails_on_another_base(broken):
    assert not broken(
        "sinusoidal.wavelengths_768", "wavelengths", lambda d: wavelengths(d, 10001.0)
    )
