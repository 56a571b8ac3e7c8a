"""FoPE (posemb.fope) against its definition (Hua et al. 2025, arXiv:2412.17739), written out
here with explicit loops over batch, head, position, pair and frequency, in Python floats."""

import copy
import math
import pickle

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posemb
from posemb import Layout
from posemb._errors import InputError
from posemb.fope import FoPE, FourierRotaryEmbedding
from tolerances import TOL, assert_close

F64 = torch.float64


def _ladder(head_dim, base):
    """omega_i = base^(-2i/d): RoPE's frequencies, before clipping."""
    return [base ** (-2 * i / head_dim) for i in range(head_dim // 2)]


def _kept(module):
    """Indices of the pairs whose frequency survives: omega_i >= 2*pi/L (all without clipping)."""
    floor = 2 * math.pi / module.train_len if module.clip_floor else 0.0
    return [i for i, w in enumerate(_ladder(module.head_dim, module.base)) if w >= floor]


def reference(x, positions, module):
    """FoPE of x ``(batch, heads, seq, head_dim)`` at ``positions`` (a batch x seq list), float64.

    Pair d of head h at position m, when kept: C = sum_j A^cos[g][j][d] cos(omega_j m) and
    S = sum_j A^sin[g][j][d] sin(omega_j m) over the kept frequencies j, g = h // (heads /
    num_heads); (a, b) -> (a C - b S, b C + a S). A clipped pair is left as it is.
    """
    batch, heads, seq, dim = x.shape
    n, group = dim // 2, heads // module.num_heads
    omega = _ladder(dim, module.base)
    kept = _kept(module)
    coef_c = module.cos_coef.detach().double().tolist()
    coef_s = module.sin_coef.detach().double().tolist()
    out = x.detach().double().clone()
    for b in range(batch):
        for h in range(heads):
            g = h // group
            for t in range(seq):
                m = positions[b][t]
                for d in kept:
                    i, o = (d, d + n) if module.layout is Layout.HALF else (2 * d, 2 * d + 1)
                    xa, xb = float(x[b, h, t, i]), float(x[b, h, t, o])
                    col = kept.index(d)
                    c = sum(coef_c[g][r][col] * math.cos(omega[j] * m) for r, j in enumerate(kept))
                    s = sum(coef_s[g][r][col] * math.sin(omega[j] * m) for r, j in enumerate(kept))
                    out[b, h, t, i] = xa * c - xb * s
                    out[b, h, t, o] = xb * c + xa * s
    return out


def _f64_tol(max_position):
    # The float64 angle p * omega (and its reduction into [0, 2 pi)) carries a rounding of about
    # |p| * 1e-16 (posemb.freqs), which the table's 64 roundoffs do not cover past small |p|.
    tol = TOL[F64]
    return {"rtol": tol["rtol"], "atol": tol["atol"] * (1 + max_position)}


def _positions_list(positions, batch, seq):
    if positions is None:
        return [list(range(seq))] * batch
    rows = positions.tolist()
    return [rows] * batch if positions.dim() == 1 else rows * (batch // len(rows))


POSITIONS = {
    "default": lambda b, s: None,
    "seq": lambda b, s: torch.arange(s) * 3 - 4,
    "batch_offset": lambda b, s: torch.arange(s) + torch.tensor([[0], [1000]]),
}


# --- clipping ----------------------------------------------------------------------------------


@given(
    half=st.integers(1, 40),
    base=st.floats(1.5, 1e6),
    train_len=st.integers(1, 1 << 20),
    num_heads=st.integers(1, 3),
)
def test_clipped_frequencies_are_those_below_the_floor(half, base, train_len, num_heads):
    m = FoPE(2 * half, base, train_len=train_len, num_heads=num_heads)
    ladder = posemb.inv_freq(2 * half, base, dtype=F64)
    for i, (got, w) in enumerate(zip(m.inv_freq.tolist(), ladder.tolist(), strict=True)):
        assert got == (0.0 if w < 2 * math.pi / train_len else w), i
    k = len(_kept(m))
    assert m.kept == k
    assert m.cos_coef.shape == m.sin_coef.shape == (num_heads, k, k)
    off = FoPE(2 * half, base, train_len=train_len, clip_floor=False)
    assert torch.equal(off.inv_freq, ladder)


@pytest.mark.parametrize("train_len", [8, 9, 10, 11])
def test_a_frequency_on_the_floor_is_kept(train_len):
    # base = (L / 2 pi)^2 puts omega_1 = base^(-1/2) exactly on the floor 2 pi / L (in float64,
    # for these L): "too slow" is strictly below it (the paper's omega < 2 pi / L).
    base = (train_len / (2 * math.pi)) ** 2
    m = FoPE(4, base, train_len=train_len)
    assert float(m.inv_freq[1]) == 2 * math.pi / train_len
    assert m.kept == 2


def test_official_configuration_keeps_a_quarter_of_the_head():
    # head_dim 64, base 10000, L = 512 (the paper's 60M C4 run): omega_i >= 2 pi / 512 for i < 16.
    assert FoPE(64, train_len=512).kept == 16
    assert FoPE(8, train_len=6).kept == 0  # omega_0 = 1 < 2 pi / 6: every pair clipped


@pytest.mark.parametrize("layout", list(Layout))
def test_clipped_pairs_are_unchanged_by_position(layout):
    m = FoPE(10, train_len=300, num_heads=2, sigma=0.5, layout=layout)  # keeps 3 of 5 pairs
    x = torch.randn(2, 4, 6, 10, generator=torch.Generator().manual_seed(0))
    pos = torch.tensor([[0, 1, 299, 300, -7, 1 << 40], [5, 17, 1 << 20, 3, 2, 1]])
    y = m.rotate(x, pos)
    clipped = [3, 4, 8, 9] if layout is Layout.HALF else [6, 7, 8, 9]
    assert torch.equal(y[..., clipped], x[..., clipped])
    assert not torch.equal(y, x)
    c, s = m.cos_sin(pos, dtype=F64)
    assert c.shape == s.shape == (2, 6, 2, 5)
    assert bool((c[..., 3:] == 1).all()) and bool((s[..., 3:] == 0).all())


# --- reduction to RoPE -------------------------------------------------------------------------


@pytest.mark.parametrize("layout", list(Layout))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("kind", list(POSITIONS))
@pytest.mark.parametrize("unclipped", [{"clip_floor": False}, {"train_len": 10**9}])
def test_no_extra_coefficients_and_no_clipping_is_rope(layout, dtype, kind, unclipped):
    kwargs = {"train_len": 64, **unclipped}
    fope = FoPE(16, 500.0, num_heads=2, sigma=0.0, layout=layout, **kwargs)
    rope = posemb.RotaryEmbedding(16, 500.0, layout=layout, backend="reference")
    assert fope.kept == 8
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 7, 4, 16, generator=g).transpose(1, 2).to(dtype)  # strided, as in models
    k = torch.randn(2, 2, 7, 16, generator=g).to(dtype)
    pos = POSITIONS[kind](2, 7)
    got, want = fope(q, k, pos), rope(q, k, pos)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == dtype
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# --- the Fourier series ------------------------------------------------------------------------

HEADS = [(4, 2, 2), (3, 3, 1), (4, 4, 4), (6, 1, 1)]  # (q heads, kv heads, num_heads)


@pytest.mark.parametrize("layout", list(Layout))
@pytest.mark.parametrize("kind", list(POSITIONS))
@pytest.mark.parametrize("heads", HEADS, ids=str)
def test_matches_definition(layout, kind, heads):
    q_heads, kv_heads, num_heads = heads
    torch.manual_seed(2)
    m = FoPE(10, train_len=300, num_heads=num_heads, sigma=0.3, layout=layout).double()
    assert m.kept == 3  # odd sizes: 5 pairs, 3 kept, 2 clipped
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, q_heads, 7, 10, generator=g, dtype=F64)
    k = torch.randn(2, kv_heads, 7, 10, generator=g, dtype=F64)
    pos = POSITIONS[kind](2, 7)
    rows = _positions_list(pos, 2, 7)
    tol = _f64_tol(max(abs(p) for row in rows for p in row))
    q_out, k_out = m(q, k, pos)
    torch.testing.assert_close(q_out, reference(q, rows, m), **tol)
    torch.testing.assert_close(k_out, reference(k, rows, m), **tol)
    torch.testing.assert_close(m.rotate(k, pos), k_out, rtol=0, atol=0)


@pytest.mark.parametrize("init", ["normal", "xavier"])
def test_matches_definition_without_clipping(init):
    torch.manual_seed(4)
    m = FoPE(6, 100.0, train_len=2, num_heads=2, sigma=0.7, clip_floor=False, init=init)
    x = torch.randn(1, 2, 5, 6, generator=torch.Generator().manual_seed(5), dtype=F64)
    torch.testing.assert_close(m.rotate(x), reference(x, [list(range(5))], m), **_f64_tol(4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", list(Layout))
def test_low_precision_within_the_table(dtype, layout):
    torch.manual_seed(6)
    m = FoPE(10, train_len=300, num_heads=2, sigma=0.2, layout=layout)
    x = torch.randn(2, 4, 7, 10, generator=torch.Generator().manual_seed(7)).to(dtype)
    got = m.rotate(x, torch.arange(7) + 40)
    assert got.dtype == dtype
    assert_close(got, reference(x.double(), [list(range(40, 47))] * 2, m), dtype)


# --- the coefficients --------------------------------------------------------------------------


def test_initial_coefficients():
    torch.manual_seed(8)
    zero = FoPE(16, train_len=10**6, num_heads=3, sigma=0.0)
    assert torch.equal(zero.cos_coef, torch.eye(8).expand(3, 8, 8))
    m = FoPE(256, train_len=10**9, sigma=0.25)  # 128 x 128 draws per table
    for coef in (m.cos_coef, m.sin_coef):
        assert float((coef[0] - torch.eye(128)).std()) == pytest.approx(0.25, rel=0.03)
    assert not torch.equal(m.cos_coef, m.sin_coef)  # separate series for cos and sin
    x = FoPE(256, train_len=10**9, num_heads=4, sigma=0.5, init="xavier")
    # torch's fans for (heads, k, k): fan_in = k * k, fan_out = heads * k.
    want = 0.5 * math.sqrt(2 / (128 * 128 + 4 * 128))
    assert float((x.cos_coef - torch.eye(128)).std()) == pytest.approx(want, rel=0.03)


def test_learnable_flag():
    fixed = FoPE(8, train_len=100, num_heads=2)
    assert not fixed.cos_coef.requires_grad and not fixed.sin_coef.requires_grad
    assert set(fixed.state_dict()) == {"cos_coef", "sin_coef"}  # the draw travels with a model
    learned = FoPE(8, train_len=100, num_heads=2, learnable=True)
    x = torch.randn(1, 2, 3, 8, requires_grad=True)
    learned.rotate(x).square().sum().backward()
    assert x.grad is not None and learned.cos_coef.grad is not None
    assert float(learned.sin_coef.grad.abs().sum()) > 0


@pytest.mark.parametrize("layout", list(Layout))
def test_gradcheck(layout):
    torch.manual_seed(9)
    m = FoPE(6, 100.0, train_len=100, num_heads=2, sigma=0.4, learnable=True, layout=layout)
    m = m.double()
    assert m.kept == 2
    g = torch.Generator().manual_seed(10)
    x = torch.randn(2, 4, 3, 6, generator=g, dtype=F64, requires_grad=True)
    pos = torch.tensor([[0, 2, 5], [7, 1, 3]])

    def f(x, cos_coef, sin_coef):
        params = {"cos_coef": cos_coef, "sin_coef": sin_coef}
        # Through forward, with a GQA k of 2 heads sliced from x: both paths reach x.
        return torch.func.functional_call(m, params, (x, x[:, 1:3], pos), strict=True)

    assert torch.autograd.gradcheck(f, (x, m.cos_coef, m.sin_coef))


# --- refusals and round trips ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"head_dim": 9}, r"head_dim must be even .*got 9"),
        ({"head_dim": 0}, r"head_dim must be a positive integer, got 0"),
        ({"train_len": 0}, r"train_len must be a positive integer, got 0"),
        ({"train_len": 512.0}, r"train_len must be a positive integer, got 512\.0"),
        ({"sigma": -0.1}, r"sigma must be a finite number >= 0, got -0\.1"),
        ({"sigma": math.nan}, r"sigma must be a finite number >= 0, got nan"),
        ({"num_heads": 0}, r"num_heads must be a positive integer, got 0"),
        ({"base": 1.0}, r"base must be finite and greater than 1.*got 1\.0"),
        ({"learnable": "yes"}, r"learnable must be True or False, got 'yes'"),
        ({"clip_floor": 1}, r"clip_floor must be True or False, got 1"),
        ({"layout": "diagonal"}, r"layout must be a posemb\.Layout .*got 'diagonal'"),
        ({"init": "uniform"}, r"init must be one of normal, xavier, got 'uniform'"),
    ],
)
def test_bad_settings_refused(kwargs, match):
    args = {"head_dim": 10, "train_len": 300, **kwargs}
    with pytest.raises(InputError, match=match) as err:
        FoPE(**args)
    assert isinstance(err.value, ValueError)


def test_bad_inputs_refused():
    m = FoPE(10, train_len=300, num_heads=2)
    x = torch.randn(2, 4, 7, 10)
    cases = [
        (lambda: m.rotate(x[0]), r"x must have shape \(batch, heads, seq, head_dim=10\), got"),
        (lambda: m.rotate(x[..., :8]), r"head_dim=10\), got shape \(2, 4, 7, 8\)"),
        (lambda: m.rotate(x[:, :3]), r"x has 3 heads, not a multiple of num_heads=2"),
        (lambda: m.rotate(x.long()), r"x must have a floating dtype"),
        (lambda: m(x, x[:1]), r"q and k must share batch and seq"),
        (lambda: m.rotate(x, torch.arange(6)), r"positions must have shape \(7,\) or \(2, 7\)"),
        (lambda: m.rotate(x, torch.zeros(7)), r"positions must have an integer dtype"),
    ]
    for call, match in cases:
        with pytest.raises(InputError, match=match):
            call()


def test_pickle_and_deepcopy_round_trip():
    torch.manual_seed(11)
    m = FourierRotaryEmbedding(10, train_len=300, num_heads=2, sigma=0.3, learnable=True)
    x = torch.randn(1, 4, 5, 10)
    for other in (pickle.loads(pickle.dumps(m)), copy.deepcopy(m)):
        assert type(other) is FourierRotaryEmbedding and repr(other) == repr(m)
        assert other.cos_coef.requires_grad
        torch.testing.assert_close(other.rotate(x), m.rotate(x), rtol=0, atol=0)
        with torch.no_grad():
            other.cos_coef.zero_()
        assert not torch.equal(other.rotate(x), m.rotate(x))  # a copy, not a view
    fresh = FoPE(10, train_len=300, num_heads=2, sigma=0.3)
    fresh.load_state_dict(m.state_dict())
    torch.testing.assert_close(fresh.rotate(x), m.rotate(x), rtol=0, atol=0)
