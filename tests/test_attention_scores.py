"""Each encoding's score as the blocked core and FlexAttention read it (a table per distance,
or FIRE's tile) against the encoding module's own bias, and what is hidden by causality and a
window."""

from __future__ import annotations

import pytest
import torch

import posemb
from posemb.attention import scores
from tolerances import TOL, UNIT_ROUNDOFF

F64 = torch.float64


def _module(name, causal=True):
    torch.manual_seed(3)
    enc = "kerple" if name.startswith("kerple") else name
    extra = {"kind": "power"} if name == "kerple-power" else {}
    module = posemb.make_encoding(enc, 4, 8, causal=causal, **extra).double()
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return module


@pytest.mark.parametrize("name", ["alibi", "t5", "kerple", "kerple-power"])
@pytest.mark.parametrize("causal", [True, False])
def test_a_table_is_the_modules_bias_at_each_distance(name, causal):
    module = _module(name, causal)
    score = scores.score_of(module, 4)
    assert score.distance_only
    qp, kp = torch.arange(40), torch.arange(40) + 3
    want = module(qp, kp)[0]  # (heads, q, k)
    d = qp[:, None] - kp[None, :]
    lo = int(d.min())
    table = score.table(torch.arange(lo, int(d.max()) + 1))
    torch.testing.assert_close(table[:, d - lo].to(F64), want, **TOL[F64])


@pytest.mark.parametrize("threshold", [4.0, 512.0])
def test_fires_tile_is_its_mlp_in_pieces(threshold):
    """FIRE's MLP read as pieces (slope and intercept per piece) gives the MLP's bias: below
    and past the threshold, at per-sequence positions, with its gradients."""
    module = posemb.FireBias(4, init_threshold=threshold).double()
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn_like(p))
    score = scores.score_of(module, 4)
    assert not score.distance_only
    qp = torch.arange(30)[None] + torch.tensor([[0], [9]])
    kp = torch.arange(30)[None].expand(2, -1)
    got = score.tile(qp, kp)
    want = module(qp, kp)
    torch.testing.assert_close(got, want, **TOL[F64])
    g = torch.randn_like(got)
    params = list(module.parameters())
    # Each parameter's gradient sums over every element of the tile, in another order on
    # either side: at most one roundoff per term apart, at the scale of the largest.
    terms = got.numel()
    u = UNIT_ROUNDOFF[F64]
    for a, b in zip(
        torch.autograd.grad(got, params, g), torch.autograd.grad(want, params, g), strict=True
    ):
        scale = max(1.0, float(b.abs().max()))
        torch.testing.assert_close(a, b, rtol=terms * u, atol=terms * u * scale)


def test_fires_pieces_are_the_mlp_between_every_breakpoint():
    module = posemb.FireBias(3).double()
    breaks, slope, intercept = scores.Fire(module).pieces()
    assert bool((breaks[1:] > breaks[:-1]).all())
    x = torch.linspace(-3, 3, 2001, dtype=F64)
    piece = torch.searchsorted(breaks, x)
    got = slope[piece] * x[:, None] + intercept[piece]
    torch.testing.assert_close(got, module.mlp(x[:, None]).detach(), **TOL[F64])


@pytest.mark.parametrize(
    ("visible", "hidden"),
    [
        (scores.Visible(True, None), [True, True, False, False, False, False]),
        (scores.Visible(True, 2), [True, True, False, False, True, True]),
        (scores.Visible(False, 2), [True, False, False, False, True, True]),
        (scores.Visible(False, None), [False] * 6),
    ],
)
def test_what_causality_and_a_window_hide(visible, hidden):
    d = torch.tensor([-2, -1, 0, 1, 2, 3])
    got = visible.hidden(d)
    assert (got.tolist() if got is not None else [False] * 6) == hidden
    lo, hi = visible.span()
    assert [not (lo <= x <= hi) for x in d.tolist()] == hidden


def test_rotary_encodings_and_none_have_no_score():
    for enc in (None, posemb.RotaryEmbedding(8)):
        score = scores.score_of(enc, 4)
        assert isinstance(score, scores.NoScore)
        assert score.table(torch.arange(-3, 4)).abs().max() == 0


def test_the_piece_lookup_is_the_binary_search():
    """FIRE's piece of each value by a lookup of cells is ``searchsorted``'s answer, but within
    a rounding of a breakpoint (where the function is the same on both sides); two breakpoints
    in one cell take the binary search itself."""
    g = torch.Generator().manual_seed(9)
    for m in (0, 1, 5, 32):
        breaks = (torch.randn(m, generator=g, dtype=F64) * 2).unique()
        x = torch.cat((torch.randn(3000, generator=g, dtype=F64) * 3, breaks, breaks + 1e-12))
        got, want = scores.pieces_of(x, breaks), torch.searchsorted(breaks, x)
        differ = got != want
        if bool(differ.any()):
            near = (x[differ, None] - breaks[None]).abs().min(-1).values
            assert bool((near < 1e-9).all())
    close = torch.tensor([0.0, 1e-9, 1.0], dtype=F64)  # two in one cell
    x = torch.linspace(-2, 2, 101, dtype=F64)
    assert torch.equal(scores.pieces_of(x, close), torch.searchsorted(close, x))


def test_fires_piece_gradients_keep_their_digits_over_a_large_tile():
    """A tile of 2^20 pairs whose logit gradients cancel row by row (as a softmax's do): each
    piece's slope and intercept gradient, a sum of ~10^5 such terms, within a few float32
    roundoffs of the float64 sum (added one after another in float32 it lost 2-3 digits)."""
    torch.manual_seed(11)
    fire = posemb.FireBias(4)
    with torch.no_grad():
        for p in fire.parameters():
            p.add_(0.3 * torch.randn_like(p))
    score = scores.Fire(fire)
    # As FIRE's x: growing along each row (with the distance); the gradient of one sign
    # near the query, the other far from it, so that each piece's terms share a sign.
    x_parts = torch.linspace(0, 1, 1024).expand(1, 1024, 1024).contiguous()
    breaks, slope, intercept = score.pieces()
    piece = scores.pieces_of(x_parts.reshape(-1), breaks)
    g = torch.rand(4, 1, 1024, 1024) * torch.linspace(1, -1, 1024)
    g = g - g.mean(-1, keepdim=True)  # every row's gradient sums to zero
    got = torch.autograd.grad(
        (scores._PieceLookup.apply(x_parts, slope, intercept, piece) * g).sum(),
        (slope, intercept),
    )
    # The definition: each piece's sums, taken in float64.
    flat = g.reshape(4, -1).double()
    sums = torch.zeros(4, slope.shape[0], dtype=torch.float64)
    want = (
        sums.index_add(1, piece, flat * x_parts.reshape(1, -1).double()).T,
        sums.index_add(1, piece, flat).T,
    )
    for a, b in zip(got, want, strict=True):
        scale = float(b.abs().max())
        assert float((a.double() - b).abs().max()) <= 16 * UNIT_ROUNDOFF[torch.float32] * scale


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_piece_lookup_in_each_dtype_past_its_cells_and_at_nan(dtype):
    """Values far past the breakpoints on both sides, and a NaN, in each float dtype: the
    binary search's answer (the cells are found in float32 or wider)."""
    breaks = torch.tensor([-0.75, -0.1, 0.3, 1.2], dtype=dtype)
    x = torch.cat((torch.linspace(-40, 40, 801), torch.tensor([float("nan"), 2.2, -1.76])))
    x = x.to(dtype)
    assert torch.equal(scores.pieces_of(x, breaks), torch.searchsorted(breaks, x))
