import math

import mpmath
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posemb
from posemb.freqs import TWO_PI


@pytest.mark.parametrize("dim,base", [(2, 10000.0), (64, 10000.0), (128, 500000.0), (768, 1e4)])
def test_inv_freq_matches_formula(dim, base):
    got = posemb.inv_freq(dim, base, dtype=torch.float64)
    want = torch.tensor([base ** (-2 * i / dim) for i in range(dim // 2)], dtype=torch.float64)
    assert got.shape == (dim // 2,)
    torch.testing.assert_close(got, want, rtol=1e-15, atol=0)
    assert got[0] == 1.0
    assert bool((got[1:] < got[:-1]).all())


def test_inv_freq_dtype_and_single_rounding():
    f64 = posemb.inv_freq(128, dtype=torch.float64)
    f32 = posemb.inv_freq(128)
    assert f32.dtype == torch.float32
    assert torch.equal(f32, f64.float())


def test_wavelengths_are_two_pi_over_frequency():
    lam = posemb.wavelengths(768)
    assert lam.dtype == torch.float64
    torch.testing.assert_close(
        lam * posemb.inv_freq(768, dtype=torch.float64), torch.full_like(lam, TWO_PI)
    )
    # The lesson's figures for d = 768.
    for i, quoted in ((0, 6.28), (32, 13.54), (128, 135.37), (383, 61342.74)):
        assert float(lam[i]) == pytest.approx(quoted, abs=0.006)


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4)])
def test_cos_sin_shapes_and_dtype(shape):
    pos = torch.randint(-100, 100, shape)
    cos, sin = posemb.cos_sin(pos, posemb.inv_freq(16, dtype=torch.float64), dtype=torch.bfloat16)
    assert cos.shape == sin.shape == (*shape, 8)
    assert cos.dtype == sin.dtype == torch.bfloat16


def test_angles_reduced_into_one_turn():
    a = posemb.angles(
        torch.tensor([-(1 << 30), -1, 0, 1, 1 << 40]), posemb.inv_freq(64, dtype=torch.float64)
    )
    assert a.dtype == torch.float64
    assert bool((a >= 0).all()) and bool((a < TWO_PI).all())


def _exact_cos(p: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    mpmath.mp.dps = 40
    vals = [mpmath.cos(p * mpmath.power(base, mpmath.mpf(-2 * i) / dim)) for i in range(dim // 2)]
    return torch.tensor([float(v) for v in vals], dtype=torch.float64)


def test_float64_angles_exact_at_2_pow_20():
    # The bar: at position 2^20, d = 128, cos within 1e-6 of the exact value.
    p = 1 << 20
    exact = _exact_cos(p, 128)
    cos, _ = posemb.cos_sin(torch.tensor([p]), posemb.inv_freq(128, dtype=torch.float64))
    err = float((cos[0].double() - exact).abs().max())
    assert err <= 1e-6
    # ...and the naive float32 product really is off by centiradians there (measured ~2.3e-2),
    # which is why posemb does not form angles in float32.
    naive = torch.cos(torch.tensor([float(p)]) * posemb.inv_freq(128))
    assert float((naive.double() - exact).abs().max()) > 1e-2


@given(st.integers(-(1 << 24), 1 << 24), st.integers(-(1 << 24), 1 << 24))
def test_angles_add_modulo_a_turn(p, q):
    theta = posemb.inv_freq(32, dtype=torch.float64)
    a = posemb.angles(torch.tensor([p, q, p + q]), theta)
    diff = torch.remainder(a[0] + a[1] - a[2] + math.pi, TWO_PI) - math.pi
    assert float(diff.abs().max()) < 1e-8


@given(st.lists(st.integers(-(1 << 30), 1 << 30), min_size=1, max_size=8))
def test_cos_sin_on_unit_circle(positions):
    cos, sin = posemb.cos_sin(
        torch.tensor(positions), posemb.inv_freq(16, dtype=torch.float64), torch.float64
    )
    torch.testing.assert_close(cos**2 + sin**2, torch.ones_like(cos))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"dim": 7}, "dim must be even"),
        ({"dim": 0}, "dim must be a positive integer"),
        ({"dim": 8.0}, "dim must be a positive integer"),
        ({"dim": True}, "dim must be a positive integer"),
        ({"dim": 8, "base": 1.0}, "base must be finite and greater than 1"),
        ({"dim": 8, "base": float("nan")}, "base must be finite"),
        ({"dim": 8, "base": "10000"}, "base must be a real number"),
        ({"dim": 8, "dtype": torch.int64}, "dtype must be one of"),
    ],
)
def test_inv_freq_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        posemb.inv_freq(**kwargs)


@pytest.mark.parametrize(
    "positions,inv,match",
    [
        (torch.tensor([0.0, 1.0]), posemb.inv_freq(8), "positions must have an integer dtype"),
        (torch.tensor([True]), posemb.inv_freq(8), "positions must have an integer dtype"),
        ("0123", posemb.inv_freq(8), "positions must be an integer tensor"),
        (torch.arange(3), posemb.inv_freq(8)[None], r"inv_freq must have shape \(n,\)"),
        (torch.arange(3), torch.arange(4), "inv_freq must have a floating dtype"),
    ],
)
def test_cos_sin_bad_input(positions, inv, match):
    with pytest.raises(ValueError, match=match):
        posemb.cos_sin(positions, inv)


def test_cos_sin_accepts_python_ints():
    cos, _ = posemb.cos_sin([0, 1, 2], posemb.inv_freq(4, dtype=torch.float64), torch.float64)
    assert float(cos[1, 0]) == pytest.approx(math.cos(1.0), abs=1e-15)
