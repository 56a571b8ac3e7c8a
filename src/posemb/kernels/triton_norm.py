"""The Triton kernels of :func:`posemb.kernels.norm_rotate`: QK-norm and RoPE in one pass, forward
and backward, for GPUs (tested on the CPU through Triton's interpreter).

Each program takes a block of tokens of one sequence and one head, loads each row as its three
parts (the first and second coordinates of every rotation plane, and the channels past the
rotary part), sums their squares for the norm, scales, rotates and stores once. The backward
re-reads the input (nothing else is saved), rotates the incoming gradient by -theta, and forms
the input's gradient in the same program; a weight's gradient sums over every row, so each
program writes its own partial sum and one ``sum`` over programs finishes it (a fixed order: no
atomics, the same result every run).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.library import triton_op, wrap_triton

from .triton import interpreting


@triton.jit
def _parts(X, off, first, second, tail, mask, tail_mask):
    a = tl.load(X + off + first, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(X + off + second, mask=mask, other=0.0).to(tl.float32)
    t = tl.load(X + off + tail, mask=tail_mask, other=0.0).to(tl.float32)
    return a, b, t


@triton.jit
def _program(
    seq_len, half, head_dim,
    INTERLEAVED: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_TAIL: tl.constexpr,
):  # fmt: skip
    """This program's tokens t, sequence b and head h; the pair index j; the channels of each
    plane's first and second coordinate and of the tail past the rotary part, with masks."""
    t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    b = tl.program_id(1).to(tl.int64)
    h = tl.program_id(2).to(tl.int64)
    t_mask = t < seq_len
    j = tl.arange(0, BLOCK_N)
    mask = t_mask[:, None] & (j < half)[None, :]
    if INTERLEAVED:
        first = 2 * j[None, :]
        second = first + 1
    else:
        first = j[None, :]
        second = first + half
    tail = 2 * half + tl.arange(0, BLOCK_TAIL)[None, :]
    tail_mask = t_mask[:, None] & (tail < head_dim)
    return t, b, h, j, mask, first, second, tail, tail_mask


@triton.jit
def _norm_rotate_kernel(
    X, XO, W, COS, SIN,
    seq_len, half, head_dim, eps,
    x_sb, x_sh, x_st, o_sb, o_sh, o_st,
    table_row_stride, table_batch_stride,
    INTERLEAVED: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_TAIL: tl.constexpr,
):  # fmt: skip
    t, b, h, j, mask, first, second, tail, tail_mask = _program(
        seq_len, half, head_dim, INTERLEAVED, BLOCK_T, BLOCK_N, BLOCK_TAIL
    )
    off = (b * x_sb + h * x_sh + t * x_st)[:, None]
    a, bb, tt = _parts(X, off, first, second, tail, mask, tail_mask)
    ss = tl.sum(a * a, 1) + tl.sum(bb * bb, 1) + tl.sum(tt * tt, 1)
    r = (1.0 / tl.sqrt(ss / head_dim + eps))[:, None]
    wa = tl.load(W + first, mask=(j < half)[None, :], other=0.0)
    wb = tl.load(W + second, mask=(j < half)[None, :], other=0.0)
    wt = tl.load(W + tail, mask=tail < head_dim, other=0.0)
    a = a * r * wa
    bb = bb * r * wb
    table = (t + b * table_batch_stride)[:, None] * table_row_stride + j[None, :]
    c = tl.load(COS + table, mask=mask, other=1.0)
    s = tl.load(SIN + table, mask=mask, other=0.0)
    o = (b * o_sb + h * o_sh + t * o_st)[:, None]
    tl.store(XO + o + first, (a * c - bb * s).to(XO.dtype.element_ty), mask=mask)
    tl.store(XO + o + second, (bb * c + a * s).to(XO.dtype.element_ty), mask=mask)
    tl.store(XO + o + tail, (tt * r * wt).to(XO.dtype.element_ty), mask=tail_mask)


@triton.jit
def _norm_rotate_backward_kernel(
    X, G, DX, W, COS, SIN, DWP,
    seq_len, n_heads, half, head_dim, eps,
    x_sb, x_sh, x_st, g_sb, g_sh, g_st, d_sb, d_sh, d_st,
    table_row_stride, table_batch_stride,
    INTERLEAVED: tl.constexpr,
    NEED_DX: tl.constexpr,
    NEED_DW: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_TAIL: tl.constexpr,
):  # fmt: skip
    t, b, h, j, mask, first, second, tail, tail_mask = _program(
        seq_len, half, head_dim, INTERLEAVED, BLOCK_T, BLOCK_N, BLOCK_TAIL
    )
    xa, xb, xt = _parts(X, (b * x_sb + h * x_sh + t * x_st)[:, None], first, second, tail, mask,
                        tail_mask)  # fmt: skip
    ga, gb, gt = _parts(G, (b * g_sb + h * g_sh + t * g_st)[:, None], first, second, tail, mask,
                        tail_mask)  # fmt: skip
    ss = tl.sum(xa * xa, 1) + tl.sum(xb * xb, 1) + tl.sum(xt * xt, 1)
    r = (1.0 / tl.sqrt(ss / head_dim + eps))[:, None]
    table = (t + b * table_batch_stride)[:, None] * table_row_stride + j[None, :]
    c = tl.load(COS + table, mask=mask, other=1.0)
    s = tl.load(SIN + table, mask=mask, other=0.0)
    # The gradient at the normalised row: g rotated by -theta.
    na = ga * c + gb * s
    nb = gb * c - ga * s
    xa = xa * r
    xb = xb * r
    xt = xt * r
    if NEED_DW:
        p = ((tl.program_id(0) * tl.num_programs(1) + b) * n_heads + h) * head_dim
        tl.store(DWP + p + first, tl.sum(na * xa, 0)[None, :], mask=(j < half)[None, :])
        tl.store(DWP + p + second, tl.sum(nb * xb, 0)[None, :], mask=(j < half)[None, :])
        tl.store(DWP + p + tail, tl.sum(gt * xt, 0)[None, :], mask=tail < head_dim)
    if NEED_DX:
        wa = tl.load(W + first, mask=(j < half)[None, :], other=0.0)
        wb = tl.load(W + second, mask=(j < half)[None, :], other=0.0)
        wt = tl.load(W + tail, mask=tail < head_dim, other=0.0)
        ha, hb, ht = na * wa, nb * wb, gt * wt
        m = (tl.sum(ha * xa, 1) + tl.sum(hb * xb, 1) + tl.sum(ht * xt, 1)) / head_dim
        m = m[:, None]
        d = (b * d_sb + h * d_sh + t * d_st)[:, None]
        tl.store(DX + d + first, (r * (ha - xa * m)).to(DX.dtype.element_ty), mask=mask)
        tl.store(DX + d + second, (r * (hb - xb * m)).to(DX.dtype.element_ty), mask=mask)
        tl.store(DX + d + tail, (r * (ht - xt * m)).to(DX.dtype.element_ty), mask=tail_mask)


def _blocks(x: Tensor, half: int) -> tuple[int, tuple[int, int, int], dict[str, int]]:
    b, h, s, d = x.shape
    block_t = triton.next_power_of_2(min(s, 256)) if interpreting() else (4 if s <= 4 else 16)
    grid = (triton.cdiv(s, block_t), b, h)
    sizes = {
        "BLOCK_T": block_t,
        "BLOCK_N": triton.next_power_of_2(max(half, 1)),
        "BLOCK_TAIL": triton.next_power_of_2(max(d - 2 * half, 1)),
    }
    return block_t, grid, sizes


def _forward(x: Tensor, out: Tensor, w: Tensor, cos: Tensor, sin: Tensor, eps: float,
             interleaved: bool, table_batch_stride: int) -> None:  # fmt: skip
    if x.numel() == 0:
        return
    half = cos.shape[-1]
    _, grid, sizes = _blocks(x, half)
    wrap_triton(_norm_rotate_kernel)[grid](
        x, out, w, cos, sin, x.shape[2], half, x.shape[3], eps,
        *x.stride()[:3], *out.stride()[:3], cos.stride(0), table_batch_stride,
        INTERLEAVED=interleaved, **sizes,
    )  # fmt: skip


@triton_op("posemb::norm_rotate_triton", mutates_args=())
def norm_rotate_triton_op(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, q_weight: Tensor, k_weight: Tensor,
    eps: float, interleaved: bool, table_batch_stride: int,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """QK-norm and rotation out of place: cos and sin float32 ``(rows, r/2)``, weights float32
    ``(head_dim,)`` with any offset applied (checked by the caller)."""
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    _forward(q, q_out, q_weight, cos, sin, eps, interleaved, table_batch_stride)
    _forward(k, k_out, k_weight, cos, sin, eps, interleaved, table_batch_stride)
    return q_out, k_out


@triton_op("posemb::norm_rotate_triton_", mutates_args=("q", "k"))
def norm_rotate_triton_op_(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, q_weight: Tensor, k_weight: Tensor,
    eps: float, interleaved: bool, table_batch_stride: int,
) -> None:  # fmt: skip
    """The same in q's and k's own memory (inference)."""
    _forward(q, q, q_weight, cos, sin, eps, interleaved, table_batch_stride)
    _forward(k, k, k_weight, cos, sin, eps, interleaved, table_batch_stride)


def _backward_side(
    g: Tensor, x: Tensor, w: Tensor, cos: Tensor, sin: Tensor, eps: float, interleaved: bool,
    table_batch_stride: int, need_x: bool, need_w: bool,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    dx = torch.empty_like(x) if need_x else x.new_empty(0)
    dw = torch.zeros_like(w) if need_w else w.new_empty(0)
    if x.numel() == 0 or not (need_x or need_w):
        return dx, dw
    half = cos.shape[-1]
    _, grid, sizes = _blocks(x, half)
    programs = grid[0] * grid[1] * grid[2]
    partial = torch.empty(programs, x.shape[3], device=x.device, dtype=torch.float32)
    wrap_triton(_norm_rotate_backward_kernel)[grid](
        x, g, dx if need_x else x, w, cos, sin, partial,
        x.shape[2], x.shape[1], half, x.shape[3], eps,
        *x.stride()[:3], *g.stride()[:3], *(dx.stride()[:3] if need_x else (0, 0, 0)),
        cos.stride(0), table_batch_stride,
        INTERLEAVED=interleaved, NEED_DX=need_x, NEED_DW=need_w, **sizes,
    )  # fmt: skip
    if need_w:
        dw = partial.sum(0)
    return dx, dw


@triton_op("posemb::norm_rotate_triton_backward", mutates_args=())
def norm_rotate_triton_backward(
    grad_q: Tensor, grad_k: Tensor, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor,
    q_weight: Tensor, k_weight: Tensor, eps: float, interleaved: bool, table_batch_stride: int,
    need_q: bool, need_k: bool, need_q_weight: bool, need_k_weight: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """The gradients of q, k and the two weights (empty where not needed)."""
    common = (cos, sin, eps, interleaved, table_batch_stride)
    dq, dqw = _backward_side(grad_q, q, q_weight, *common, need_q, need_q_weight)
    dk, dkw = _backward_side(grad_k, k, k_weight, *common, need_k, need_k_weight)
    return dq, dk, dqw, dkw


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    q, k, cos, sin, qw, kw, eps, interleaved, stride = inputs
    ctx.save_for_backward(q, k, cos, sin, qw, kw)
    ctx.eps, ctx.interleaved, ctx.stride = eps, interleaved, stride


def _backward(ctx: Any, grad_q: Tensor, grad_k: Tensor) -> tuple:
    from .ops import unit_last

    q, k, cos, sin, qw, kw = ctx.saved_tensors
    need = ctx.needs_input_grad
    if torch.is_grad_enabled():  # the backward is differentiated too: through the definition
        from .norm import differentiable_grads

        batch = q.shape[0] if ctx.stride else 1
        tables = (cos.view(batch, -1, cos.shape[-1]), sin.view(batch, -1, sin.shape[-1]))
        saved = (q, k, *tables, qw, kw)
        dq, dk, dqw, dkw = differentiable_grads(
            (grad_q, grad_k), saved, (need[0], need[1], need[4], need[5]), ctx.eps,
            ctx.interleaved,
        )  # fmt: skip
        return (dq, dk, None, None, dqw, dkw) + (None,) * 3
    dq, dk, dqw, dkw = norm_rotate_triton_backward(
        unit_last(grad_q), unit_last(grad_k), q, k, cos, sin, qw, kw, ctx.eps,
        ctx.interleaved, ctx.stride, need[0], need[1], need[4], need[5],
    )  # fmt: skip
    grads = (dq, dk, None, None, dqw, dkw)
    return tuple(g if n else None for g, n in zip(grads, need[:6], strict=True)) + (None,) * 3


norm_rotate_triton_op.register_autograd(_backward, setup_context=_setup_context)


def norm_rotate_triton(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, q_weight: Tensor, k_weight: Tensor,
    eps: float, interleaved: bool, inplace: bool,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Dispatch from :func:`posemb.kernels.norm_rotate` (tables ``(1 or B, S, n)`` float32
    contiguous, weights float32 with any offset applied)."""
    n = cos.shape[-1]
    stride = q.shape[2] if cos.shape[0] > 1 else 0
    c, s = cos.reshape(-1, n), sin.reshape(-1, n)
    if inplace:
        norm_rotate_triton_op_(q, k, c, s, q_weight, k_weight, eps, interleaved, stride)
        return q, k
    q_out, k_out = norm_rotate_triton_op(q, k, c, s, q_weight, k_weight, eps, interleaved, stride)
    return q_out, k_out


__all__ = ["norm_rotate_triton"]
