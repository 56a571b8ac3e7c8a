"""The Triton RoPE kernel for GPUs: one launch rotates q and k, forward and backward.

Each program takes a block of tokens of one sequence and a group of heads (of q, then of k:
GQA's different head counts share one launch), loads the cos/sin rows of those tokens once,
and rotates every head of the group with them in float32, storing in the output dtype. The
table row of a token is its position: given (``positions``), or its index in the sequence,
plus a per-sequence ``offsets`` entry (a KV-cache step), plus ``table_batch_stride * b`` when
the table holds one block of rows per sequence. Packed variable-length batches (``cu_seqlens``)
index tokens by sequence start. The backward pass is the same kernel with ``CONJ``: rotating by
-theta is the transpose of rotating by theta.

Offsets are formed in int64: a (4, 32, 32768, 128) tensor already holds 2^29 elements, and a
packed batch of long sequences passes 2^31.

Tested on the CPU through Triton's interpreter (``TRITON_INTERPRET=1``), which runs each program
as Python: tests keep to a few programs per launch.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.library import triton_op, wrap_triton

from .._errors import InputError
from .ops import backward_by_conjugate, setup_context


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (tests)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _rotate_head(
    X,
    XO,
    x_off,
    o_off,
    first,
    second,
    c,
    s,
    mask,
    tail,
    tail_mask,
    COPY_TAIL: tl.constexpr,
):
    a = tl.load(X + x_off + first, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(X + x_off + second, mask=mask, other=0.0).to(tl.float32)
    out_a = a * c - b * s
    out_b = b * c + a * s
    tl.store(XO + o_off + first, out_a.to(XO.dtype.element_ty), mask=mask)
    tl.store(XO + o_off + second, out_b.to(XO.dtype.element_ty), mask=mask)
    if COPY_TAIL:
        # Channels past the rotary part pass through; only needed when out is not x.
        v = tl.load(X + x_off + tail, mask=tail_mask, other=0.0)
        tl.store(XO + o_off + tail, v, mask=tail_mask)


@triton.jit
def _rope_kernel(
    Q,
    K,
    QO,
    KO,
    COS,
    SIN,
    POS,
    OFF,
    CU,
    seq_len,
    n_q_heads,
    n_k_heads,
    half,
    head_dim,
    q_sb,
    q_sh,
    q_st,
    k_sb,
    k_sh,
    k_st,
    qo_sb,
    qo_sh,
    qo_st,
    ko_sb,
    ko_sh,
    ko_st,
    table_row_stride,
    table_batch_stride,
    pos_sb,
    pos_st,
    INTERLEAVED: tl.constexpr,
    CONJ: tl.constexpr,
    HAS_POS: tl.constexpr,
    HAS_OFF: tl.constexpr,
    VARLEN: tl.constexpr,
    COPY_TAIL: tl.constexpr,
    HEADS_PER_PROGRAM: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_TAIL: tl.constexpr,
):
    # Token blocks on grid axis 0, the only one allowed more than 65535 programs.
    t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    b = tl.program_id(1).to(tl.int64)
    if VARLEN:
        start = tl.load(CU + b).to(tl.int64)
        length = tl.load(CU + b + 1).to(tl.int64) - start
        token = start + t  # row of the packed (total, heads, dim) tensors
        batch = b * 0
    else:
        length = seq_len
        token = t
        batch = b
    t_mask = t < length

    if HAS_POS:
        row = tl.load(POS + b * pos_sb + t * pos_st, mask=t_mask, other=0).to(tl.int64)
    else:
        row = t
    if HAS_OFF:
        row += tl.load(OFF + b).to(tl.int64)
    row += b * table_batch_stride

    j = tl.arange(0, BLOCK_N)
    mask = t_mask[:, None] & (j < half)[None, :]
    table = row[:, None] * table_row_stride + j[None, :]
    c = tl.load(COS + table, mask=mask, other=1.0)
    s = tl.load(SIN + table, mask=mask, other=0.0)
    if CONJ:
        s = -s
    if INTERLEAVED:
        first = 2 * j[None, :]
        second = first + 1
    else:
        first = j[None, :]
        second = first + half
    tail = 2 * half + tl.arange(0, BLOCK_TAIL)[None, :]
    tail_mask = t_mask[:, None] & (tail < head_dim)

    h0 = tl.program_id(2) * HEADS_PER_PROGRAM
    for i in range(HEADS_PER_PROGRAM):
        h = (h0 + i).to(tl.int64)
        if h < n_q_heads:
            x_off = (batch * q_sb + h * q_sh + token * q_st)[:, None]
            o_off = (batch * qo_sb + h * qo_sh + token * qo_st)[:, None]
            _rotate_head(Q, QO, x_off, o_off, first, second, c, s, mask, tail, tail_mask, COPY_TAIL)
        elif h < n_q_heads + n_k_heads:
            hk = h - n_q_heads
            x_off = (batch * k_sb + hk * k_sh + token * k_st)[:, None]
            o_off = (batch * ko_sb + hk * ko_sh + token * ko_st)[:, None]
            _rotate_head(K, KO, x_off, o_off, first, second, c, s, mask, tail, tail_mask, COPY_TAIL)


def _strides(x: torch.Tensor, varlen: bool) -> tuple[int, int, int]:
    """(batch, head, token) strides of a (B, H, S, D) or packed (total, H, D) tensor."""
    if varlen:
        return 0, x.stride(1), x.stride(0)
    return x.stride(0), x.stride(1), x.stride(2)


def launch(
    q: torch.Tensor,
    k: torch.Tensor,
    q_out: torch.Tensor,
    k_out: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    interleaved: bool,
    conjugate: bool,
    positions: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int | None = None,
    table_batch_stride: int = 0,
    copy_tail: bool = True,
) -> None:
    """Run the kernel once over q and k (checked by the caller, see posemb.kernels).

    Args:
        q, k: ``(B, Hq, S, D)`` / ``(B, Hk, S, D)``, or packed ``(total, H, D)`` with
            ``cu_seqlens``; unit stride in D.
        q_out, k_out: outputs shaped like q and k (may be q and k: in place).
        cos, sin: float32 tables ``(rows, D_r/2)`` with unit stride in the last dimension.
        interleaved: pair (2j, 2j+1) instead of (j, j + r/2).
        conjugate: rotate by -theta (backward).
        positions: int ``(1 or B, S)`` table rows, or None for the token index.
        offsets: int ``(B,)`` added to every row of a sequence, or None.
        cu_seqlens: int ``(B+1,)`` sequence starts for packed tensors, with ``max_seqlen``.
        table_batch_stride: rows to skip per sequence (a table of B blocks of S rows).
        copy_tail: copy the channels past the rotary part (out of place; in place they stay).
    """
    varlen = cu_seqlens is not None
    half = cos.shape[-1]
    head_dim = q.shape[-1]
    if cu_seqlens is not None:
        if max_seqlen is None:
            raise InputError("max_seqlen is required with cu_seqlens")
        batch, seq_len = cu_seqlens.shape[0] - 1, int(max_seqlen)
    else:
        batch, seq_len = q.shape[0], q.shape[2]
    n_q, n_k = q.shape[1], k.shape[1]  # heads sit in dim 1 of both layouts
    heads = n_q + n_k
    if batch == 0 or seq_len == 0 or heads == 0:
        return
    if interpreting():
        # The interpreter runs programs one by one in Python: few, large programs.
        block_t, per_program = triton.next_power_of_2(min(seq_len, 256)), heads
    else:
        block_t, per_program = (4 if seq_len <= 4 else 16), min(heads, 4)
    grid = (triton.cdiv(seq_len, block_t), batch, triton.cdiv(heads, per_program))
    dummy = cos  # unused pointer arguments still need a tensor
    pos_sb = pos_st = 0
    if positions is not None:
        pos_sb = positions.stride(0) if positions.shape[0] > 1 else 0
        pos_st = positions.stride(1)
    # wrap_triton lets torch.compile see the kernel inside the registered op.
    wrap_triton(_rope_kernel)[grid](
        q,
        k,
        q_out,
        k_out,
        cos,
        sin,
        positions if positions is not None else dummy,
        offsets if offsets is not None else dummy,
        cu_seqlens if cu_seqlens is not None else dummy,
        seq_len,
        n_q,
        n_k,
        half,
        head_dim,
        *_strides(q, varlen),
        *_strides(k, varlen),
        *_strides(q_out, varlen),
        *_strides(k_out, varlen),
        cos.stride(0),
        table_batch_stride,
        pos_sb,
        pos_st,
        INTERLEAVED=interleaved,
        CONJ=conjugate,
        HAS_POS=positions is not None,
        HAS_OFF=offsets is not None,
        VARLEN=varlen,
        COPY_TAIL=copy_tail and head_dim > 2 * half,
        HEADS_PER_PROGRAM=per_program,
        BLOCK_T=block_t,
        BLOCK_N=triton.next_power_of_2(half),
        BLOCK_TAIL=triton.next_power_of_2(max(head_dim - 2 * half, 1)),
    )


def _launch_both(
    q: Tensor,
    k: Tensor,
    q_out: Tensor,
    k_out: Tensor,
    cos: Tensor,
    sin: Tensor,
    k_cos: Tensor | None,
    k_sin: Tensor | None,
    interleaved: bool,
    conjugate: bool,
    positions: Tensor | None,
    offsets: Tensor | None,
    cu_seqlens: Tensor | None,
    max_seqlen: int,
    table_batch_stride: int,
    copy_tail: bool,
) -> None:
    common = dict(
        interleaved=interleaved,
        conjugate=conjugate,
        positions=positions,
        offsets=offsets,
        cu_seqlens=cu_seqlens,
        max_seqlen=max_seqlen if cu_seqlens is not None else None,
        table_batch_stride=table_batch_stride,
        copy_tail=copy_tail,
    )
    if k_cos is None or k_sin is None:
        launch(q, k, q_out, k_out, cos, sin, **common)  # type: ignore[arg-type]
        return
    # Keys with their own tables (xPos): one launch per side, the other passed with no heads.
    launch(q, k[:, :0], q_out, k_out[:, :0], cos, sin, **common)  # type: ignore[arg-type]
    launch(q[:, :0], k, q_out[:, :0], k_out, k_cos, k_sin, **common)  # type: ignore[arg-type]


@triton_op("posemb::rotate_triton", mutates_args=())
def rotate_triton(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    k_cos: Tensor | None,
    k_sin: Tensor | None,
    interleaved: bool,
    conjugate: bool,
    positions: Tensor | None,
    offsets: Tensor | None,
    cu_seqlens: Tensor | None,
    max_seqlen: int,
    table_batch_stride: int,
) -> tuple[Tensor, Tensor]:
    """The Triton rotation as a registered op, out of place (see :func:`launch`)."""
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    _launch_both(
        q, k, q_out, k_out, cos, sin, k_cos, k_sin, interleaved, conjugate,
        positions, offsets, cu_seqlens, max_seqlen, table_batch_stride, True,
    )  # fmt: skip
    return q_out, k_out


@triton_op("posemb::rotate_triton_", mutates_args=("q", "k"))
def rotate_triton_(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    k_cos: Tensor | None,
    k_sin: Tensor | None,
    interleaved: bool,
    conjugate: bool,
    positions: Tensor | None,
    offsets: Tensor | None,
    cu_seqlens: Tensor | None,
    max_seqlen: int,
    table_batch_stride: int,
) -> None:
    """The Triton rotation in place (inference: not differentiable)."""
    _launch_both(
        q, k, q, k, cos, sin, k_cos, k_sin, interleaved, conjugate,
        positions, offsets, cu_seqlens, max_seqlen, table_batch_stride, False,
    )  # fmt: skip


rotate_triton.register_autograd(backward_by_conjugate(rotate_triton), setup_context=setup_context)
