"""The Triton kernels of :func:`posemb.kernels.norm_rotate`: QK-norm and RoPE in one pass, forward
and backward, for GPUs (tested on the CPU through Triton's interpreter).

The forward is one launch for q and k, tiled as the rotation is (:mod:`posemb.kernels.triton`):
each program takes a block of tokens by a block of heads by the head's channels, loads the
whole tile, sums each row's squares over the head width (a compile-time constant, so the
reduction is unrolled in registers), scales by the weight, rotates and stores once. The
backward re-reads the input (nothing else is saved), rotates the incoming gradient by -theta,
and forms the input's gradient in the same program; a weight's gradient sums over every row,
so each program writes its own partial sum and one ``sum`` over programs finishes it (a fixed
order: no atomics, the same result every run).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.library import triton_op, wrap_triton

from . import triton as _tr
from .triton import INT32_LIMIT, Config, _cdiv, _extent, _pow2, token_block


@triton.jit
def _row(X, off, live, HALF: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
         BLOCK_TAIL: tl.constexpr, INTERLEAVED: tl.constexpr):  # fmt: skip
    """A (tokens, heads, ...) tile of rows as float32 (first coordinates, second coordinates,
    tail) and each row's sum of squares (tokens, heads)."""
    if INTERLEAVED:
        r = tl.arange(0, 2 * BLOCK_N)[None, None, :]
        x = tl.load(X + off + r, mask=live & (r < 2 * HALF), other=0.0).to(tl.float32)
        ss = tl.sum(x * x, 2)
        a, b = tl.split(tl.reshape(x, (x.shape[0], x.shape[1], BLOCK_N, 2)))
    else:
        j = tl.arange(0, BLOCK_N)[None, None, :]
        m = live & (j < HALF)
        a = tl.load(X + off + j, mask=m, other=0.0).to(tl.float32)
        b = tl.load(X + off + HALF + j, mask=m, other=0.0).to(tl.float32)
        ss = tl.sum(a * a, 2) + tl.sum(b * b, 2)
    tail = 2 * HALF + tl.arange(0, BLOCK_TAIL)[None, None, :]
    t = tl.load(X + off + tail, mask=live & (tail < HEAD_DIM), other=0.0).to(tl.float32)
    return a, b, t, ss + tl.sum(t * t, 2)


@triton.jit
def _weights(W, w_offset, HALF: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_TAIL: tl.constexpr, INTERLEAVED: tl.constexpr):  # fmt: skip
    """The weight's parts plus ``w_offset`` as (1, 1, ...) float32 rows, matching
    :func:`_row` (the weight in its own dtype, converted as loaded)."""
    if INTERLEAVED:
        r = tl.arange(0, 2 * BLOCK_N)[None, None, :]
        w = tl.load(W + r, mask=r < 2 * HALF, other=0.0).to(tl.float32) + w_offset
        wa, wb = tl.split(tl.reshape(w, (1, 1, BLOCK_N, 2)))
    else:
        j = tl.arange(0, BLOCK_N)[None, None, :]
        wa = tl.load(W + j, mask=j < HALF, other=0.0).to(tl.float32) + w_offset
        wb = tl.load(W + HALF + j, mask=j < HALF, other=0.0).to(tl.float32) + w_offset
    tail = 2 * HALF + tl.arange(0, BLOCK_TAIL)[None, None, :]
    wt = tl.load(W + tail, mask=tail < HEAD_DIM, other=0.0).to(tl.float32) + w_offset
    return wa, wb, wt


@triton.jit
def _store_row(
    XO, off, live, a, b, t,
    HALF: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_TAIL: tl.constexpr, INTERLEAVED: tl.constexpr,
):  # fmt: skip
    """Store a tile given as :func:`_row`'s parts, in XO's dtype."""
    if INTERLEAVED:
        r = tl.arange(0, 2 * BLOCK_N)[None, None, :]
        y = tl.reshape(tl.join(a, b), (a.shape[0], a.shape[1], 2 * BLOCK_N))
        tl.store(XO + off + r, y.to(XO.dtype.element_ty), mask=live & (r < 2 * HALF))
    else:
        j = tl.arange(0, BLOCK_N)[None, None, :]
        m = live & (j < HALF)
        tl.store(XO + off + j, a.to(XO.dtype.element_ty), mask=m)
        tl.store(XO + off + HALF + j, b.to(XO.dtype.element_ty), mask=m)
    tail = 2 * HALF + tl.arange(0, BLOCK_TAIL)[None, None, :]
    tl.store(XO + off + tail, t.to(XO.dtype.element_ty), mask=live & (tail < HEAD_DIM))


@triton.jit
def _tables(COS, SIN, t, t_live, b, table_row_stride, table_batch_stride,
            HALF: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """The cos and sin rows of tokens ``t`` of sequence ``b``, as (tokens, 1, BLOCK_N)."""
    j = tl.arange(0, BLOCK_N)
    row = t.to(tl.int64) + b.to(tl.int64) * table_batch_stride
    at = (row[:, None] * table_row_stride + j[None, :])[:, None, :]
    m = (t_live[:, None] & (j < HALF)[None, :])[:, None, :]
    c = tl.load(COS + at, mask=m, other=1.0).to(tl.float32)
    return c, tl.load(SIN + at, mask=m, other=0.0).to(tl.float32)


@triton.jit
def _norm_rotate_tile(
    X, XO, W, w_offset, off, o_off, live, c, s, eps,
    HALF: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_TAIL: tl.constexpr, INTERLEAVED: tl.constexpr,
):  # fmt: skip
    a, b, t, ss = _row(X, off, live, HALF, HEAD_DIM, BLOCK_N, BLOCK_TAIL, INTERLEAVED)
    r = (1.0 / tl.sqrt(ss / HEAD_DIM + eps))[:, :, None]
    wa, wb, wt = _weights(W, w_offset, HALF, HEAD_DIM, BLOCK_N, BLOCK_TAIL, INTERLEAVED)
    a = a * r * wa
    b = b * r * wb
    _store_row(XO, o_off, live, a * c - b * s, b * c + a * s, t * r * wt,
               HALF, HEAD_DIM, BLOCK_N, BLOCK_TAIL, INTERLEAVED)  # fmt: skip


@triton.jit
def _norm_rotate_kernel(
    Q, K, QO, KO, QW, KW, COS, SIN,
    seq_len, n_q_heads, n_k_heads, eps, w_offset,
    q_sb, q_sh, q_st, k_sb, k_sh, k_st,
    qo_sb, qo_sh, qo_st, ko_sb, ko_sh, ko_st,
    table_row_stride, table_batch_stride,
    HALF: tl.constexpr, HEAD_DIM: tl.constexpr, INTERLEAVED: tl.constexpr, WIDE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_TAIL: tl.constexpr,
):  # fmt: skip
    t, b = token_block(seq_len, BLOCK_T, WIDE)  # as the rotation's grid; heads on axis 1
    t_live = t < seq_len
    c, s = _tables(COS, SIN, t, t_live, b, table_row_stride, table_batch_stride, HALF, BLOCK_N)
    q_blocks = tl.cdiv(n_q_heads, BLOCK_H)
    pid_h = tl.program_id(1)
    hh = tl.arange(0, BLOCK_H)
    if pid_h < q_blocks:
        h = pid_h * BLOCK_H + hh
        if WIDE:
            h = h.to(tl.int64)
        live = (t_live[:, None] & (h < n_q_heads)[None, :])[:, :, None]
        off = ((b * q_sb + t * q_st)[:, None] + (h * q_sh)[None, :])[:, :, None]
        o_off = ((b * qo_sb + t * qo_st)[:, None] + (h * qo_sh)[None, :])[:, :, None]
        _norm_rotate_tile(Q, QO, QW, w_offset, off, o_off, live, c, s, eps,
                          HALF, HEAD_DIM, BLOCK_N, BLOCK_TAIL, INTERLEAVED)  # fmt: skip
    else:
        h = (pid_h - q_blocks) * BLOCK_H + hh
        if WIDE:
            h = h.to(tl.int64)
        live = (t_live[:, None] & (h < n_k_heads)[None, :])[:, :, None]
        off = ((b * k_sb + t * k_st)[:, None] + (h * k_sh)[None, :])[:, :, None]
        o_off = ((b * ko_sb + t * ko_st)[:, None] + (h * ko_sh)[None, :])[:, :, None]
        _norm_rotate_tile(K, KO, KW, w_offset, off, o_off, live, c, s, eps,
                          HALF, HEAD_DIM, BLOCK_N, BLOCK_TAIL, INTERLEAVED)  # fmt: skip


@triton.jit
def _norm_rotate_backward_kernel(
    X, G, DX, W, COS, SIN, DWP,
    seq_len, n_heads, eps,
    x_sb, x_sh, x_st, g_sb, g_sh, g_st, d_sb, d_sh, d_st,
    table_row_stride, table_batch_stride,
    HALF: tl.constexpr, HEAD_DIM: tl.constexpr, INTERLEAVED: tl.constexpr,
    NEED_DX: tl.constexpr, NEED_DW: tl.constexpr, WIDE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_TAIL: tl.constexpr,
):  # fmt: skip
    t, b = token_block(seq_len, BLOCK_T, WIDE)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    if WIDE:
        h = h.to(tl.int64)
    t_live = t < seq_len
    live = (t_live[:, None] & (h < n_heads)[None, :])[:, :, None]
    x_off = ((b * x_sb + t * x_st)[:, None] + (h * x_sh)[None, :])[:, :, None]
    g_off = ((b * g_sb + t * g_st)[:, None] + (h * g_sh)[None, :])[:, :, None]
    xa, xb, xt, ss = _row(X, x_off, live, HALF, HEAD_DIM, BLOCK_N, BLOCK_TAIL, INTERLEAVED)
    ga, gb, gt, _ = _row(G, g_off, live, HALF, HEAD_DIM, BLOCK_N, BLOCK_TAIL, INTERLEAVED)
    r = (1.0 / tl.sqrt(ss / HEAD_DIM + eps))[:, :, None]
    c, s = _tables(COS, SIN, t, t_live, b, table_row_stride, table_batch_stride, HALF, BLOCK_N)
    # The gradient at the normalised row: g rotated by -theta.
    na = ga * c + gb * s
    nb = gb * c - ga * s
    xa = xa * r
    xb = xb * r
    xt = xt * r
    if NEED_DW:
        p = tl.program_id(0).to(tl.int64) * tl.num_programs(1) + tl.program_id(1)
        p = p * HEAD_DIM
        da = tl.sum(tl.sum(na * xa, 0), 0)[None, None, :]
        db = tl.sum(tl.sum(nb * xb, 0), 0)[None, None, :]
        dt = tl.sum(tl.sum(gt * xt, 0), 0)[None, None, :]
        everywhere = tl.full((1, 1, 1), 1, tl.int1)
        _store_row(DWP + p, 0, everywhere, da, db, dt,
                   HALF, HEAD_DIM, BLOCK_N, BLOCK_TAIL, INTERLEAVED)  # fmt: skip
    if NEED_DX:
        wa, wb, wt = _weights(W, 0.0, HALF, HEAD_DIM, BLOCK_N, BLOCK_TAIL, INTERLEAVED)
        ha, hb, ht = na * wa, nb * wb, gt * wt
        m = (tl.sum(ha * xa, 2) + tl.sum(hb * xb, 2) + tl.sum(ht * xt, 2)) / HEAD_DIM
        m = m[:, :, None]
        d_off = ((b * d_sb + t * d_st)[:, None] + (h * d_sh)[None, :])[:, :, None]
        _store_row(DX, d_off, live, r * (ha - xa * m), r * (hb - xb * m), r * (ht - xt * m),
                   HALF, HEAD_DIM, BLOCK_N, BLOCK_TAIL, INTERLEAVED)  # fmt: skip


def _shape(x: Tensor, heads: int, half: int, interleaved: bool) -> tuple[Config, dict[str, Any]]:
    """The tile of a launch over ``x`` ``(B, H, S, D)`` (``heads``: the most heads of one
    side), and the compile-time sizes."""
    s, d = x.shape[2], x.shape[3]
    cfg = _tr.tile(d, half, x.element_size(), interleaved, s, heads)
    sizes = {
        "HALF": half,
        "HEAD_DIM": d,
        "INTERLEAVED": interleaved,
        "BLOCK_T": cfg.block_t,
        "BLOCK_H": cfg.block_h,
        "BLOCK_N": _pow2(max(half, 1)),
        "BLOCK_TAIL": _pow2(max(d - 2 * half, 1)),
    }
    return cfg, sizes


def _wide(*tensors: Tensor) -> bool:
    return max(_extent(t) for t in tensors) >= INT32_LIMIT


def _forward(q: Tensor, k: Tensor, q_out: Tensor, k_out: Tensor, qw: Tensor, kw: Tensor,
             cos: Tensor, sin: Tensor, eps: float, interleaved: bool,
             table_batch_stride: int, w_offset: float = 0.0,
             traceable: bool = True) -> None:  # fmt: skip
    """One launch normalising and rotating q into q_out and k into k_out (may be in place);
    each weight is read plus ``w_offset``. ``traceable=False`` launches directly (eager
    inference), not through ``wrap_triton``."""
    n_q, n_k = q.shape[1], k.shape[1]
    if q.shape[0] * q.shape[2] == 0 or n_q + n_k == 0:
        return
    cfg, sizes = _shape(q, max(n_q, n_k), cos.shape[-1], interleaved)
    grid = (_cdiv(q.shape[2], cfg.block_t) * q.shape[0],
            _cdiv(n_q, cfg.block_h) + _cdiv(n_k, cfg.block_h), 1)  # fmt: skip
    kernel = wrap_triton(_norm_rotate_kernel) if traceable else _norm_rotate_kernel
    kernel[grid](
        q, k, q_out, k_out, qw, kw, cos, sin, q.shape[2], n_q, n_k, eps, w_offset,
        *q.stride()[:3], *k.stride()[:3], *q_out.stride()[:3], *k_out.stride()[:3],
        cos.stride(0), table_batch_stride,
        WIDE=_wide(q, k, q_out, k_out), num_warps=cfg.num_warps, **sizes,
    )  # fmt: skip


@triton_op("posemb::norm_rotate_triton", mutates_args=())
def norm_rotate_triton_op(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, q_weight: Tensor, k_weight: Tensor,
    eps: float, interleaved: bool, table_batch_stride: int,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """QK-norm and rotation out of place: cos and sin float32 ``(rows, r/2)``, weights float32
    ``(head_dim,)`` with any offset applied (checked by the caller)."""
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    _forward(q, k, q_out, k_out, q_weight, k_weight, cos, sin, eps, interleaved,
             table_batch_stride)  # fmt: skip
    return q_out, k_out


@triton_op("posemb::norm_rotate_triton_", mutates_args=("q", "k"))
def norm_rotate_triton_op_(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, q_weight: Tensor, k_weight: Tensor,
    eps: float, interleaved: bool, table_batch_stride: int,
) -> None:  # fmt: skip
    """The same in q's and k's own memory (inference)."""
    _forward(q, k, q, k, q_weight, k_weight, cos, sin, eps, interleaved, table_batch_stride)


def _backward_side(
    g: Tensor, x: Tensor, w: Tensor, cos: Tensor, sin: Tensor, eps: float, interleaved: bool,
    table_batch_stride: int, need_x: bool, need_w: bool,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    dx = torch.empty_like(x) if need_x else x.new_empty(0)
    dw = torch.zeros_like(w) if need_w else w.new_empty(0)
    if x.numel() == 0 or not (need_x or need_w):
        return dx, dw
    cfg, sizes = _shape(x, x.shape[1], cos.shape[-1], interleaved)
    grid = (_cdiv(x.shape[2], cfg.block_t) * x.shape[0], _cdiv(x.shape[1], cfg.block_h), 1)
    programs = grid[0] * grid[1] * grid[2]
    partial = torch.empty(programs, x.shape[3], device=x.device, dtype=torch.float32)
    wrap_triton(_norm_rotate_backward_kernel)[grid](
        x, g, dx if need_x else x, w, cos, sin, partial,
        x.shape[2], x.shape[1], eps,
        *x.stride()[:3], *g.stride()[:3], *(dx.stride()[:3] if need_x else (0, 0, 0)),
        cos.stride(0), table_batch_stride,
        NEED_DX=need_x, NEED_DW=need_w, WIDE=_wide(x, g, dx if need_x else x),
        num_warps=cfg.num_warps, **sizes,
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
        from .norm_reference import differentiable_grads

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


def eager(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, q_weight: Tensor, k_weight: Tensor,
    eps: float, offset: float, interleaved: bool,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Out of place where nothing traces and nothing needs a gradient: one direct launch that
    reads the tables and the weights in their own dtypes and adds ``offset`` to each weight
    as it loads it (no cast, add or copy kernel per call). Tables ``(S, n)`` or
    ``(1 or B, S, n)``, weights ``(head_dim,)``."""
    from .triton_path import rows

    stride = q.shape[2] if cos.dim() == 3 and cos.shape[0] > 1 else 0
    c, s = rows(cos, sin)
    # The kernel reads a weight at unit stride: a strided or expanded one is copied.
    q_weight = q_weight if q_weight.stride(0) == 1 else q_weight.contiguous()
    k_weight = k_weight if k_weight.stride(0) == 1 else k_weight.contiguous()
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    _forward(q, k, q_out, k_out, q_weight, k_weight, c, s, eps, interleaved, stride,
             w_offset=offset, traceable=False)  # fmt: skip
    return q_out, k_out


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


__all__ = ["eager", "norm_rotate_triton"]
