"""The fused path of ``extended_attention`` (calls merged by log-sum-exp, :mod:`posemb._lse`)
against the blocked reference path, forward and backward: every method, dtypes, decode,
chunked prefill, padding, per-sequence positions, GQA, both ways, windows and additive masks,
query blocks forced small; and what it must never do (form a ``q_len x k_len`` tensor)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import posemb
from posemb import _lse, _lse_kernels
from posemb.extension import (
    DualChunk,
    ReRoPE,
    SelfExtend,
    Visibility,
    _ranges,
    attend,
    extended_attention,
)
from tolerances import TOL

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
    """:func:`posemb._lse.attention` with ``fused=False`` runs the tiles written out (what a
    device without the CPU flash kernel runs): the same output and gradients."""
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
