"""FIRE's fused CPU op (``csrc/fire.cpp``: ``posemb::_fire_tile_cpu`` and ``_fire_grads_cpu``)
against the torch lookup it replaces and the float64 sums; what it refuses; and a FIRE score
that takes it giving what the torch path gives, tile and every parameter's gradient."""

from __future__ import annotations

import pytest
import torch

import posemb
from posemb.attention import scores
from posemb.kernels import cpu
from tolerances import UNIT_ROUNDOFF

F32, F64 = torch.float32, torch.float64


@pytest.fixture(autouse=True)
def _op():
    if cpu.load(announce=False) is None:
        pytest.skip(f"posemb's CPU library does not load here: {cpu.unavailable_reason()}")


def _case(dtype, b, n, heads, m, seed=0):
    """x with runs (sorted stretches, as a row of FIRE's x), values exactly at breakpoints,
    beyond both ends and a NaN; breaks increasing; a slope and intercept per piece."""
    g = torch.Generator().manual_seed(seed)
    breaks = (torch.randn(m, generator=g, dtype=F64) * 0.5).unique().to(dtype)
    x = torch.rand(b, n, generator=g, dtype=F64).to(dtype) * 3 - 1
    if n > 8:
        x[:, : n // 2] = x[:, : n // 2].sort(-1).values
        x[0, 1] = float("nan")
        x[-1, 3] = -5.0
        x[-1, 4] = 7.0
        if breaks.numel():
            x[0, 5 : 5 + min(breaks.numel(), n - 5)] = breaks[: n - 5]
    pieces = breaks.numel() + 1
    slope = torch.randn(pieces, heads, generator=g, dtype=F64).to(dtype)
    intercept = torch.randn(pieces, heads, generator=g, dtype=F64).to(dtype)
    return x, breaks, slope, intercept


SHAPES = [(1, 1, 1, 0), (1, 257, 3, 5), (2, 1000, 8, 32), (1, 0, 4, 3), (3, 37, 1, 1)]


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_the_fused_tile_is_the_lookup(dtype, shape):
    """Each pair's piece is searchsorted's (a NaN included), its value slope * x + intercept
    within a rounding of the torch path's."""
    x, breaks, slope, intercept = _case(dtype, *shape)
    b, n, heads = shape[:3]
    out = torch.full((b, heads, n), 123.0, dtype=dtype)
    torch.ops.posemb._fire_tile_cpu(x, breaks, slope, intercept, out)
    piece = torch.searchsorted(breaks, x)
    want = torch.addcmul(intercept[piece], slope[piece], x[..., None]).movedim(-1, 1)
    u = UNIT_ROUNDOFF[dtype]
    torch.testing.assert_close(out, want, rtol=4 * u, atol=4 * u * 5, equal_nan=True)


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_the_fused_gradients_are_the_float64_sums(dtype, shape):
    """d_x is ``sum_h ds_h slope[p, h]``; per piece and head, ``sum ds * x`` and ``sum ds``
    within a few roundoffs of the float64 sums (NaN pairs carry a NaN, as in torch)."""
    x, breaks, slope, _ = _case(dtype, *shape)
    x = x.nan_to_num(0.25)
    b, n, heads = shape[:3]
    g = torch.Generator().manual_seed(1)
    ds = torch.randn(b, heads, n, generator=g, dtype=F64).to(dtype)
    d_x, sums = torch.ops.posemb._fire_grads_cpu(ds, x, breaks, slope)
    piece = torch.searchsorted(breaks, x)
    want_dx = (ds.double() * slope.double()[piece].movedim(-1, 1)).sum(1)
    u = UNIT_ROUNDOFF[dtype]
    torch.testing.assert_close(d_x.double(), want_dx, rtol=16 * u, atol=16 * u * heads)
    flat = ds.double().movedim(1, 0).reshape(heads, -1)
    room = torch.zeros(heads, slope.shape[0], dtype=F64)
    want = torch.stack(
        (
            room.index_add(1, piece.reshape(-1), flat * x.double().reshape(1, -1)).T,
            room.index_add(1, piece.reshape(-1), flat).T,
        )
    )
    assert sums.dtype == F64 and sums.shape == (2, slope.shape[0], heads)
    torch.testing.assert_close(sums, want, rtol=1e-12, atol=1e-12 * max(1, n))


def test_the_fused_ops_refuse_what_they_cannot_read():
    x, breaks, slope, intercept = _case(F32, 1, 40, 2, 4)
    out = torch.empty(1, 2, 40)
    bad = [
        (x.double(), breaks, slope, intercept, out),  # dtypes differ
        (x.t().contiguous().t(), breaks, slope, intercept, out),  # (1, 40) strided: fine
        (x[:, ::2], breaks, slope, intercept, torch.empty(1, 2, 20)),  # not contiguous
        (x, breaks, slope[:-1], intercept, out),  # a piece short
        (x, breaks, slope, intercept, torch.empty(1, 3, 40)),  # heads differ
        (x.half(), breaks.half(), slope.half(), intercept.half(), out.half()),  # float16
    ]
    for i, args in enumerate(bad):
        if i == 1:
            torch.ops.posemb._fire_tile_cpu(*args)
            continue
        with pytest.raises(RuntimeError, match="posemb::_fire"):
            torch.ops.posemb._fire_tile_cpu(*args)
    with pytest.raises(RuntimeError, match="ds must be"):
        torch.ops.posemb._fire_grads_cpu(torch.empty(1, 2, 39), x, breaks, slope)


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("batch", [1, 2])
def test_a_fire_score_through_the_op_is_the_torch_paths(dtype, batch, monkeypatch):
    """A FIRE score's tile and its gradient into every parameter (the MLP, c, the threshold)
    through the op equal the torch path's: queries before and past the threshold, keys on
    both sides of them, positions per sequence."""
    torch.manual_seed(5)
    fire = posemb.FireBias(4, init_threshold=20.0).to(dtype)
    with torch.no_grad():
        for p in fire.parameters():
            p.add_(0.3 * torch.randn_like(p))
    qp = torch.arange(10, 49)[None].expand(batch, -1) + torch.arange(batch)[:, None]
    kp = torch.arange(0, 61)[None].expand(batch, -1).contiguous()
    ds = torch.randn(batch, 4, 39, 61, dtype=dtype)
    runs = []
    for off in (False, True):
        monkeypatch.setattr(scores, "_FUSED_OFF", off)
        score = scores.Fire(fire)
        with torch.no_grad():
            tile = score.tile(qp, kp).clone()
            grads = score.param_grads(qp, kp, ds)
        runs.append((tile, grads))
    (tile, grads), (want, want_grads) = runs
    u = UNIT_ROUNDOFF[dtype]
    torch.testing.assert_close(tile, want, rtol=16 * u, atol=16 * u)
    assert len(grads) == len(want_grads) == len(scores.Fire(fire).parameters())
    for a, b in zip(grads, want_grads, strict=True):
        scale = max(1.0, float(b.abs().max()))
        torch.testing.assert_close(a, b, rtol=64 * u * 39 * 61, atol=64 * u * 39 * 61 * scale)
