"""The blocked core (calls merged by log-sum-exp, :mod:`posemb.attention.core`) through
``extended_attention``
against the blocked reference path, forward and backward: every method, dtypes, decode,
chunked prefill, padding, per-sequence positions, GQA, both ways, windows and additive masks,
query blocks forced small; and what it must never do (form a ``q_len x k_len`` tensor)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import posemb
from posemb.attention import core as _lse
from posemb.attention import kernels as _lse_kernels
from posemb.attention.extension import (
    DualChunk,
    ReRoPE,
    SelfExtend,
    Visibility,
    _ranges,
    attend,
    extended_attention,
)
from tolerances import TOL, TOL_SECOND, assert_close_at_scale

F64 = torch.float64
METHODS = [
    SelfExtend(group=3, window=5),
    SelfExtend(group=2, window=4, query_scale=6),
    ReRoPE(window=6),
    ReRoPE(window=4, leak=3.0),
    DualChunk(chunk_size=9, local_size=3),
]
IDS = ["selfextend", "selfextend-scaled", "rerope", "leaky", "dca"]
# (batch, q_len, k_len, v_dim, padding): prefill, decode, chunked prefill, padded, odd widths.
SHAPES = {
    "prefill": (2, 37, 37, 8, False),
    "decode": (2, 1, 50, 8, True),
    "chunked": (3, 20, 45, 5, True),
    "wide-v": (1, 30, 30, 12, False),
}


@pytest.fixture(autouse=True)
def _small_blocks(monkeypatch):
    """Blocks of 16 queries, leaves of 4: the block, core and edge logic on small inputs."""
    monkeypatch.setattr(_lse, "_ROWS", 16)
    monkeypatch.setattr(_lse, "_LEAF", 4)
    monkeypatch.setattr(_lse, "_TILE", 64)
    monkeypatch.setattr(_lse, "_BACK_COLS", 24)


def _inputs(shape, dtype, seed=0):
    b, lq, lk, dv, padded = shape
    torch.manual_seed(seed)
    q = torch.randn(b, 4, lq, 8, dtype=dtype, requires_grad=True)
    k = torch.randn(b, 2, lk, 8, dtype=dtype, requires_grad=True)
    v = torch.randn(b, 2, lk, dv, dtype=dtype, requires_grad=True)
    kp = torch.arange(lk) + 3 * torch.arange(b)[:, None]  # per-sequence offsets
    qp = kp[:, lk - lq :]
    pad = None
    if padded:
        pad = torch.zeros(b, lk, dtype=torch.bool)
        pad[0, :5] = True  # left padding
        pad[-1, -3:] = True  # right padding
    return q, k, v, qp, kp, pad


def _both(q, k, v, fn):
    """fn's output and the gradients of a fixed weighting of it, for fused and reference."""
    results = []
    for fused in (True, False):
        out = fn(fused)
        weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
        results.append((out, *torch.autograd.grad((out * weight).sum(), (q, k, v))))
    return results


def _close(results, dtype):
    fused, reference = results
    for a, b in zip(fused, reference, strict=True):
        # Both paths compute in float32 or better and round once: 2u apart at most (the
        # table's bound for two correct results), on values of order one.
        torch.testing.assert_close(a.to(F64), b.to(F64), **TOL[dtype])


@pytest.mark.parametrize("method", METHODS, ids=IDS)
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "both-ways"])
def test_the_fused_path_is_the_reference_path(method, shape, causal):
    if not causal and not method.bidirectional:
        pytest.skip("Dual Chunk Attention is causal only")
    rope = posemb.RotaryEmbedding(8)
    q, k, v, qp, kp, pad = _inputs(shape, F64)

    def run(fused):
        return extended_attention(q, k, v, rope, method, qp, kp, causal, pad, fused=fused)

    _close(_both(q, k, v, run), F64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("method", METHODS[::2], ids=IDS[::2])
def test_the_fused_path_in_each_dtype(method, dtype):
    """Both paths compute in float32 for the half types and round once to q's dtype."""
    rope = posemb.RotaryEmbedding(8, layout="interleaved")
    q, k, v, qp, kp, pad = _inputs(SHAPES["chunked"], dtype, seed=1)

    def run(fused):
        return extended_attention(q, k, v, rope, method, qp, kp, True, pad, fused=fused)

    results = _both(q, k, v, run)
    assert results[0][0].dtype == dtype
    if dtype != torch.float32:  # gradients: a float32 chain rounded once (see _close)
        for a, b in zip(results[0], results[1], strict=True):
            torch.testing.assert_close(a.float(), b.float(), rtol=4 * 2.0**-8, atol=4 * 2.0**-7)
        return
    _close(results, dtype)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "both-ways"])
@pytest.mark.parametrize("fill", ["bool", -1e4, "min"])
def test_windows_and_masks_as_transformers_passes_them(causal, fill):
    """A sliding window and an additive or bool mask (a -1e4 fill lowers a logit, it does not
    hide the key; a finfo.min fill hides it) through both paths."""
    rope = posemb.RotaryEmbedding(8)
    method = SelfExtend(group=2, window=4)
    q, k, v, qp, kp, _ = _inputs(SHAPES["prefill"], F64, seed=2)
    torch.manual_seed(5)
    keep = torch.rand(2, 1, 37, 37) > 0.3
    if fill == "bool":
        bias = keep
    else:
        low = torch.finfo(F64).min if fill == "min" else fill
        bias = torch.zeros(2, 1, 37, 37, dtype=F64).masked_fill(~keep, low)
    vis = Visibility(causal=causal, window=9, bias=bias)

    def run(fused):
        return attend(q, k, v, rope, method, qp, kp, vis, 0.3, fused=fused)

    _close(_both(q, k, v, run), F64)


def test_a_query_that_sees_no_key_gets_zeros_and_no_gradient():
    rope = posemb.RotaryEmbedding(8)
    q, k, v, qp, kp, _ = _inputs((2, 6, 6, 8, False), F64)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1] = True  # the second sequence is all padding
    out = extended_attention(q, k, v, rope, ReRoPE(window=3), qp, kp, True, pad)
    assert out[1].abs().max() == 0
    (gq,) = torch.autograd.grad(out.sum(), (q,))
    assert gq[1].abs().max() == 0 and gq[0].abs().max() > 0


def test_the_explicit_tiles_other_devices_run_are_the_flash_kernel():
    """:func:`posemb.attention.core.attention` with ``fused=False`` runs the tiles written out
    (what a device without the CPU flash kernel runs): the same output and gradients."""
    torch.manual_seed(4)
    method, (b, lq, lk) = SelfExtend(group=2, window=5), (2, 23, 23)
    qp = torch.arange(lk)[None].expand(b, -1)
    pad = torch.zeros(b, lk, dtype=torch.bool)
    pad[0, :3] = True
    ranges = _ranges(method, qp, qp, Visibility(pad=pad))
    assert ranges is not None
    qs = [torch.randn(b, 4, lq, 8, dtype=F64, requires_grad=True) for _ in range(3)]
    ks = [torch.randn(b, 2, lk, 8, dtype=F64, requires_grad=True) for _ in range(3)]
    v = torch.randn(b, 2, lk, 6, dtype=F64, requires_grad=True)
    runs = []
    for fused in (True, False):
        out = _lse.attention(qs, ks, v, ranges, 0.4, fused=fused)
        runs.append((out, *torch.autograd.grad(out.square().sum(), (*qs, *ks, v))))
    for a, b in zip(*runs, strict=True):
        torch.testing.assert_close(a, b, **TOL[F64])


def test_keys_out_of_order_take_the_reference_path():
    """A packed batch (positions restart inside a sequence): no key ranges, the reference."""
    method = ReRoPE(window=3)
    kp = torch.cat((torch.arange(10), torch.arange(6)))
    assert _ranges(method, kp, kp, Visibility()) is None
    pad = torch.zeros(1, 16, dtype=torch.bool)
    pad[0, 10:] = True  # the restart is padding: ordered again
    assert _ranges(method, kp, kp, Visibility(pad=pad)) is not None
    rope = posemb.RotaryEmbedding(8)
    q, k, v = (torch.randn(1, 2, 16, 8, dtype=F64) for _ in range(3))
    got = extended_attention(q, k, v, rope, method, kp, kp)
    want = extended_attention(q, k, v, rope, method, kp, kp, fused=False)
    torch.testing.assert_close(got, want, **TOL[F64])


class _Largest(TorchDispatchMode):
    """The most elements of any tensor an operation returns while the mode is on."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("method", METHODS[::2], ids=IDS[::2])
def test_no_tensor_grows_with_q_len_times_k_len(method, monkeypatch):
    """Issue 48's bug 7: the position sets' (q_len, k_len) distance grids and pair masks made
    memory grow with L^2 whatever the block. At L = 4,096 (one head) nothing the fused path
    forms, forward or backward, holds more than a mask tile (2^21 elements, L^2 / 8)."""
    monkeypatch.setattr(_lse, "_ROWS", 512)
    monkeypatch.setattr(_lse, "_LEAF", 64)
    monkeypatch.setattr(_lse, "_TILE", 1 << 21)
    n = 4096
    rope = posemb.RotaryEmbedding(8)
    q, k, v = (torch.randn(1, 1, n, 8, requires_grad=True) for _ in range(3))
    pad = torch.zeros(1, n, dtype=torch.bool)
    pad[0, :7] = True
    with _Largest() as seen:
        out = extended_attention(q, k, v, rope, method, key_padding_mask=pad)
        out.sum().backward()
    assert seen.largest <= n * n // 8


class _FakeEfficient:
    """The memory-efficient CUDA kernel's contract as PyTorch states it, on the CPU: one head
    count, bias rows 16-element aligned, the log-sum-exp padded to 32 rows (garbage there)."""

    @staticmethod
    def forward(q, k, v, bias, compute_lse, dropout, is_causal, *, scale):
        assert compute_lse and dropout == 0 and not is_causal
        assert q.shape[1] == k.shape[1] == v.shape[1], "one head count"
        assert bias is None or bias.stride(-2) % 16 == 0, "attn_bias is not correctly aligned"
        out, lse = _lse_kernels._math_forward(q, k, v, bias, scale)
        rows = q.shape[2]
        padded = torch.full((*lse.shape[:2], rows + -rows % 32), torch.inf, dtype=torch.float32)
        padded[..., :rows] = lse
        return out, padded, torch.empty(()), torch.empty(())

    @staticmethod
    def backward(d_out, q, k, v, bias, out, lse, seed, offset, dropout, mask, is_causal, *, scale):
        assert lse.shape[-1] % 32 == 0 and list(mask) == [True, True, True, False]
        assert q.shape[1] == k.shape[1]
        assert bias is None or bias.stride(-2) % 16 == 0
        grads = _lse_kernels._math_backward(
            d_out, q, k, v, out, lse[..., : q.shape[2]], bias, scale
        )
        return (*grads, None)


def test_the_cuda_kernel_glue_against_its_stated_contract(monkeypatch):
    """The CUDA path (never run on a GPU when written) through a stand-in honouring the
    kernel's contract: heads repeated and summed back, bias aligned, lse cut and re-padded."""
    monkeypatch.setattr(_lse_kernels, "_efficient_op", _FakeEfficient.forward)
    monkeypatch.setattr(_lse_kernels, "_efficient_op_backward", _FakeEfficient.backward)
    rope = posemb.RotaryEmbedding(8)
    q, k, v, qp, kp, pad = _inputs(SHAPES["chunked"], torch.float32, seed=3)

    def run(fused):
        if fused:
            monkeypatch.setattr(_lse, "kernel_for", lambda *a, **kw: _lse_kernels.EFFICIENT_CUDA)
        else:
            monkeypatch.setattr(_lse, "kernel_for", _lse_kernels.kernel_for)
        return extended_attention(q, k, v, rope, METHODS[0], qp, kp, True, pad)

    _close(_both(q, k, v, run), torch.float32)
    q32 = torch.randn(1, 2, 3, 8)
    assert _lse_kernels._agrees(_lse_kernels.EFFICIENT_CUDA, q32, q32)


def test_a_kernel_failing_its_first_use_check_is_set_aside_with_a_warning():
    def wrong(q, k, v, mask, scale):
        out, lse = _lse_kernels._math_forward(q, k, v, mask, scale)
        return out + 1e-3, lse

    bad = _lse_kernels.Kernel("wrong", wrong, _lse_kernels._math_backward)
    q = torch.randn(1, 2, 3, 8)
    with pytest.warns(RuntimeWarning, match="first-use check"):
        assert not _lse_kernels._agrees(bad, q, q)


@pytest.mark.parametrize("shape", [(1, 1, 1, 37), (2, 1, 37, 1), (1, 4, 1, 1)])
def test_a_bias_that_broadcasts_over_rows_or_columns(shape):
    """A bias of size 1 along the queries or the keys (a padding-style row mask) applies to
    every call's tile, however the rows are split (found by an attack: the rows were sliced)."""
    rope = posemb.RotaryEmbedding(8)
    q, k, v, qp, kp, _ = _inputs(SHAPES["prefill"], F64, seed=6)
    torch.manual_seed(7)
    bias = torch.randn(shape, dtype=F64)
    bias = bias.masked_fill(torch.rand(shape) < 0.2, -torch.inf)
    vis = Visibility(causal=True, bias=bias)

    def run(fused):
        return attend(q, k, v, rope, ReRoPE(window=5), qp, kp, vis, 0.3, fused=fused)

    _close(_both(q, k, v, run), F64)


@pytest.mark.parametrize("method", METHODS[::2], ids=IDS[::2])
def test_second_derivatives_are_the_reference_paths(method):
    """A double backward (create_graph) differentiates explicit tiles recomputed in the
    backward: the flash kernels' backward has no derivative of its own."""
    rope = posemb.RotaryEmbedding(8)
    q, k, v, qp, kp, pad = _inputs(SHAPES["chunked"], F64, seed=8)
    second = []
    for fused in (True, False):
        out = extended_attention(q, k, v, rope, method, qp, kp, True, pad, fused=fused)
        (gv,) = torch.autograd.grad(out.square().sum(), (v,), create_graph=True)
        second.append(torch.autograd.grad(gv.sum(), (q, k, v)))
    for a, b in zip(*second, strict=True):
        torch.testing.assert_close(a, b, **TOL[F64])


# --- issue 54: what an attack found the fused path got wrong ------------------------------------


def _strided(x, how):
    """x with the same values but a last dimension that is not unit-stride."""
    if how == "transposed":
        return x.detach().transpose(-1, -2).contiguous().transpose(-1, -2).requires_grad_()
    wide = torch.zeros(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype)
    wide[..., ::2] = x.detach()
    return wide.requires_grad_()  # the leaf; its [..., ::2] view is what attention sees


@pytest.mark.parametrize("how", ["transposed", "stepped"])
@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_a_last_dimension_that_is_not_unit_stride(which, how):
    """Bug 1: the CPU flash kernel reads the last dimension as unit-stride whatever its stride;
    a transposed or step-sliced tensor gave an output off by 1.85."""
    rope = posemb.RotaryEmbedding(8)
    q, k, v, qp, kp, pad = _inputs((3, 20, 45, 8, True), F64, seed=9)  # v as wide as q: no pad
    leaf = _strided({"q": q, "k": k, "v": v}[which], how)
    seen = leaf if how == "transposed" else leaf[..., ::2]
    assert seen.stride(-1) != 1
    args = {"q": q, "k": k, "v": v, which: seen}
    out = extended_attention(args["q"], args["k"], args["v"], rope, METHODS[0], qp, kp, True, pad)
    want = extended_attention(q, k, v, rope, METHODS[0], qp, kp, True, pad, fused=False)
    torch.testing.assert_close(out, want, **TOL[F64])
    (got,) = torch.autograd.grad(out.sum(), (leaf,))
    (expected,) = torch.autograd.grad(want.sum(), ({"q": q, "k": k, "v": v}[which],))
    got = got if how == "transposed" else got[..., ::2]
    torch.testing.assert_close(got, expected, **TOL[F64])


@pytest.mark.parametrize("method", METHODS, ids=IDS)
def test_second_derivatives_through_q_and_k(method):
    """Bug 2: a gradient penalty through q or k (not only v) was nan in every method with more
    than one position set: logaddexp's second derivative where one side is the blind -1e30."""
    rope = posemb.RotaryEmbedding(8)
    q, k, v, qp, kp, pad = _inputs(SHAPES["chunked"], F64, seed=10)
    second = []
    for fused in (True, False):
        out = extended_attention(q, k, v, rope, method, qp, kp, True, pad, fused=fused)
        gq, gk = torch.autograd.grad(out.square().sum(), (q, k), create_graph=True)
        second.append(torch.autograd.grad(gq.square().sum() + gk.sum(), (q, k, v)))
    for a, b in zip(*second, strict=True):
        assert torch.isfinite(a).all()
        assert_close_at_scale(a, b, F64, TOL_SECOND)


@pytest.mark.parametrize("shape", [(3, 4, 20, 45), (3, 1, 20, 45), (1, 1, 1, 45), (45,)])
def test_a_bias_that_requires_grad_gets_its_gradient(shape):
    """Bug 3: the mask tiles were built from the bias outside the autograd function's inputs,
    so a learned bias silently got no gradient (the reference gives it). A bias of fewer
    dimensions broadcasts from the right."""
    rope = posemb.RotaryEmbedding(8)
    q, k, v, qp, kp, pad = _inputs(SHAPES["chunked"], F64, seed=11)
    torch.manual_seed(12)
    bias = torch.randn(shape, dtype=F64).requires_grad_()
    runs = []
    for fused in (True, False):
        out = attend(q, k, v, rope, METHODS[0], qp, kp, Visibility(pad=pad, bias=bias), 0.3, fused)
        weight = torch.linspace(-1, 1, out.numel(), dtype=F64).view_as(out)
        runs.append((out, *torch.autograd.grad((out * weight).sum(), (q, k, v, bias))))
    for a, b in zip(*runs, strict=True):
        torch.testing.assert_close(a, b, **TOL[F64])
    assert runs[0][-1].abs().max() > 0


def test_a_bias_that_requires_grad_has_second_derivatives():
    rope = posemb.RotaryEmbedding(8)
    q, k, v, qp, kp, pad = _inputs(SHAPES["chunked"], F64, seed=13)
    bias = torch.randn(3, 1, 20, 45, dtype=F64, requires_grad=True)
    second = []
    for fused in (True, False):
        out = attend(q, k, v, rope, METHODS[2], qp, kp, Visibility(pad=pad, bias=bias), 0.3, fused)
        (gb,) = torch.autograd.grad(out.square().sum(), (bias,), create_graph=True)
        second.append(torch.autograd.grad(gb.square().sum(), (q, bias)))
    for a, b in zip(*second, strict=True):
        assert_close_at_scale(a, b, F64, TOL_SECOND)


@pytest.mark.parametrize("fill", [-1e4, -1e9, -1e30])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "reference"])
def test_a_row_whose_keys_all_carry_one_large_fill(fill, fused):
    """Bug 4: every call's log-sum-exp of such a row rounds to the fill in float32, and the
    merge weighed each call by 1 (the row got the sum of their outputs, off by 0.88). The
    softmax does not see a constant added to a row: the answer is that row without it."""
    rope = posemb.RotaryEmbedding(8)
    q, k, v, qp, kp, _ = _inputs(SHAPES["prefill"], torch.float32, seed=14)
    bias = torch.zeros(2, 1, 37, 37)
    bias[:, :, 9] = fill  # a padded query row under a hand-written mask
    bias[1, :, 20, :10] = fill  # and a row where only some keys carry it
    out = attend(q, k, v, rope, METHODS[0], qp, kp, Visibility(bias=bias), 0.3, fused=fused)
    want_bias = bias.double()
    want_bias[:, :, 9] = 0.0
    args = (q.double(), k.double(), v.double(), rope, METHODS[0], qp, kp)
    want = attend(*args, Visibility(bias=want_bias), 0.3, fused=False)
    torch.testing.assert_close(out.double(), want, **TOL[torch.float32])


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "reference"])
def test_vmap_over_extended_attention(fused):
    """Bug 5: torch.func.vmap died in the blocked path ("Batching rule not implemented for
    aten::maximum.out"); the docs say torch.func transforms take the reference."""
    rope = posemb.RotaryEmbedding(8)
    torch.manual_seed(15)
    q, k, v = (torch.randn(3, 1, 2, 12, 8, dtype=F64) for _ in range(3))

    def one(q, k, v):
        return extended_attention(q, k, v, rope, METHODS[0], fused=fused)

    got = torch.func.vmap(one)(q, k, v)
    want = torch.stack([one(q[i], k[i], v[i]) for i in range(3)])
    torch.testing.assert_close(got, want, **TOL[F64])


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "reference"])
@pytest.mark.parametrize("shape", [(), (37,), (37, 37), (4, 1, 37)])
def test_a_bias_of_fewer_dimensions_broadcasts_from_the_right(shape, fused):
    """Bug 6: a 1-D or 0-d bias, which broadcasts as Visibility's docstring says, died with a
    bare IndexError in both paths."""
    rope = posemb.RotaryEmbedding(8)
    q, k, v, qp, kp, _ = _inputs(SHAPES["prefill"], F64, seed=16)
    bias = torch.randn(shape, dtype=F64)
    full = bias.view((1,) * (4 - bias.dim()) + tuple(bias.shape)).expand(2, 4, 37, 37)
    args = (q, k, v, rope, METHODS[2], qp, kp)
    got = attend(*args, Visibility(bias=bias), 0.3, fused=fused)
    want = attend(*args, Visibility(bias=full.contiguous()), 0.3, fused=False)
    torch.testing.assert_close(got, want, **TOL[F64])


@pytest.mark.parametrize("shape", [(5,), (2, 4, 37, 36), (1, 2, 3, 4, 5)])
def test_a_bias_that_does_not_broadcast_is_refused_by_name(shape):
    rope = posemb.RotaryEmbedding(8)
    q, k, v, qp, kp, _ = _inputs(SHAPES["prefill"], F64, seed=16)
    with pytest.raises(posemb.InputError, match=r"bias of shape .* does not broadcast"):
        attend(q, k, v, rope, METHODS[0], qp, kp, Visibility(bias=torch.zeros(shape)), 0.3)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "reference"])
@pytest.mark.parametrize("case", ["queries-first", "all-padding"])
def test_no_query_sees_any_key_gives_zeros_with_zero_gradients(case, fused):
    """Bug 8: the output was zeros cut off from autograd (``backward`` raised), and the two
    paths disagreed; torch's attention gives a connected output with zero gradients."""
    rope = posemb.RotaryEmbedding(8)
    q, k, v, qp, kp, _ = _inputs((2, 6, 9, 8, False), F64, seed=17)
    pad = None
    if case == "queries-first":
        qp = qp - 40  # every query before every key
    else:
        pad = torch.ones(2, 9, dtype=torch.bool)
    out = extended_attention(q, k, v, rope, METHODS[0], qp, kp, True, pad, fused=fused)
    assert out.shape == (2, 4, 6, 8) and out.abs().max() == 0 and out.requires_grad
    out.sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and t.grad.abs().max() == 0


@pytest.mark.parametrize("fill", [-3e3, -2e4, -1e5, -1e9])
def test_half_type_calls_shift_the_bias_before_rounding_it(fill):
    """Found by an audit after issue 54: with calls in a half type (CUDA's), the bias was
    rounded to it before the row's shift was subtracted: -inf - -inf (nan) past fp16's range,
    and the per-key differences rounded away below it. Here the explicit tiles in float16 on
    the CPU stand for them."""
    torch.manual_seed(18)
    b, h, n, d = 1, 2, 6, 8
    q, k, v = (torch.randn(b, h, n, d, dtype=F64) for _ in range(3))
    bias = torch.zeros(1, 1, n, n, dtype=F64)
    bias[..., 5, :] = fill + torch.arange(n)  # one row: a large fill, keys a logit apart
    ranges = _lse.Masks(
        [np.zeros((1, n), dtype=np.int64)], [np.arange(1, n + 1, dtype=np.int64)[None]], None, bias
    )
    want = _lse.attention([q], [k], v, ranges, d**-0.5, fused=False)
    got = _lse.attention([q.half()], [k.half()], v.half(), ranges, d**-0.5, fused=False)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, **TOL[torch.float16])


def test_a_float64_bias_beyond_float32s_range_is_a_bias_in_both_paths():
    """Found by an audit: the reference path read a float64 bias through float32 to find the
    hidden keys, so -1e39 (finite in float64) hid them: a row whose keys all carry it came out
    zeros (off by 0.47); softmax does not see a constant added to the row."""
    rope = posemb.RotaryEmbedding(8)
    q, k, v, qp, kp, _ = _inputs(SHAPES["prefill"], F64, seed=19)
    bias = torch.zeros(2, 1, 37, 37, dtype=F64)
    bias[:, :, 30] = -1e39
    args = (q, k, v, rope, METHODS[0], qp, kp)
    want = attend(*args, Visibility(), 0.3, fused=False)
    for fused in (True, False):
        got = attend(*args, Visibility(bias=bias), 0.3, fused=fused)
        torch.testing.assert_close(got, want, **TOL[F64])


# --- from a fresh attack after issue 54's fixes --------------------------------------------


@pytest.mark.parametrize("scale", [1e29, 1e31, 1e33])
def test_logits_below_any_fixed_sentinel_still_attend(scale):
    """A row's log-sum-exp at or below -1e30 lost the merge to the blind sentinel, which was
    -1e30: zeros (off by 2.57 at a scale of 1e33). The sentinel is the dtype's lowest."""
    rope = posemb.RotaryEmbedding(8)
    torch.manual_seed(20)
    q, k, v = (torch.randn(1, 1, 4, 8) for _ in range(3))
    qr, kr = rope(q, k)
    want = torch.nn.functional.scaled_dot_product_attention(qr, kr, v, is_causal=True, scale=scale)
    got = extended_attention(q, k, v, rope, ReRoPE(window=10_000), scale=scale)
    torch.testing.assert_close(got, want, **TOL[torch.float32])


def test_an_empty_batch_or_no_heads_gives_an_empty_output_and_gradient():
    """The fused path crashed on batch 0 (an expand in the planning) and on a broadcast bias
    that requires grad when a dimension was 0 (its gradient was not reduced)."""
    rope = posemb.RotaryEmbedding(8)
    for qs, ks in (((0, 2, 3, 8), (0, 1, 5, 8)), ((1, 0, 3, 8), (1, 1, 5, 8))):
        q = torch.randn(qs, requires_grad=True)
        k, v = torch.randn(ks), torch.randn(ks)
        pad = torch.zeros(qs[0], 5, dtype=torch.bool)
        out = extended_attention(q, k, v, rope, ReRoPE(2), key_padding_mask=pad)
        assert out.shape == (*qs[:3], 8)
        bias = torch.zeros(1, 1, 3, 5, requires_grad=True)
        qp, kp = torch.arange(2, 5), torch.arange(5)
        attend(q, k, v, rope, ReRoPE(2), qp, kp, Visibility(bias=bias), 0.3).sum().backward()
        assert bias.grad is not None and bias.grad.abs().max() == 0


@pytest.mark.parametrize("mapped", ["key_padding_mask", "q_positions"])
def test_vmap_over_positions_or_padding_is_refused_by_name(mapped):
    """vmap over them died with torch's "data-dependent control flow" or ".item()": refused by
    name (they are read as values); vmap over q, k and v works."""
    rope = posemb.RotaryEmbedding(8)
    q, k, v = torch.randn(3, 1, 2, 5, 8), torch.randn(3, 1, 1, 7, 8), torch.randn(3, 1, 1, 7, 8)
    given = {
        "key_padding_mask": torch.zeros(3, 1, 7, dtype=torch.bool),
        "q_positions": torch.arange(2, 7).expand(3, 5),
    }[mapped]

    def one(q, k, v, x):
        return extended_attention(q, k, v, rope, METHODS[0], **{mapped: x})

    with pytest.raises(posemb.InputError, match=f"{mapped} is mapped over"):
        torch.func.vmap(one)(q, k, v, given)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "reference"])
def test_forward_mode_ad_gives_the_jvp(fused):
    """Dual tensors died in both paths (maximum's out= and the fused calls' autograd function
    have no forward rule): they take the blocked path out of place."""
    import torch.autograd.forward_ad as fwd

    rope = posemb.RotaryEmbedding(8)
    q, k, v, qp, kp, pad = _inputs(SHAPES["chunked"], F64, seed=21)
    q, k, v = q.detach(), k.detach(), v.detach()
    tangent = torch.randn_like(q)

    def run(q):
        return extended_attention(q, k, v, rope, METHODS[0], qp, kp, True, pad, fused=fused)

    with fwd.dual_level():
        got = fwd.unpack_dual(run(fwd.make_dual(q, tangent))).tangent
    _, want = torch.func.jvp(run, (q,), (tangent,))
    torch.testing.assert_close(got, want, **TOL[F64])
