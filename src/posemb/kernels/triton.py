"""The Triton RoPE kernel for GPUs: one launch rotates q and k, forward and backward.

Each program takes a 3-D tile, a block of tokens of one sequence by a block of heads (of q, or
of k: GQA's different head counts share one launch, q's head blocks first) by the rotary
pairs, loads the whole tile before it stores anything, rotates it in float32 with the cos/sin
rows of its tokens (loaded once, shared by every head of the tile) and stores in the output
dtype. The head width and the rotary width are compile-time constants, so address arithmetic
folds and the loads of a row are full-width vector loads (128-bit where the strides allow,
which Triton's launcher proves per call by specialising each stride divisible by 16). The
interleaved layout loads each row whole and splits it into its pairs in registers, rather
than loading every other element.

The table row of a token is its position: given (``positions``), or its index in the
sequence, plus a per-sequence ``offsets`` entry (a KV-cache step), plus
``table_batch_stride * b`` when the table holds one block of rows per sequence. Packed
variable-length batches (``cu_seqlens``) index tokens by sequence start. The backward pass is
the same kernel with ``CONJ``: rotating by -theta is the transpose of rotating by theta.

Offsets are formed in int32 unless some tensor of the call spans 2^31 elements or more
(``WIDE``): a (4, 32, 32768, 128) tensor already holds 2^29 elements, and a packed batch of
long sequences passes 2^31; below that, 64-bit offsets only cost registers.

The tile shape and warp count come from :func:`config`, keyed on the head width, the element
size, the layout and whether the call is a decode step (a few tokens) or a prefill.

Tested on the CPU through Triton's interpreter (``TRITON_INTERPRET=1``), which runs each program
as Python: tests keep to a few programs per launch.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.library import triton_op, wrap_triton

from .._errors import InputError
from .ops import backward_by_conjugate, setup_context

INT32_LIMIT = 2**31


def interpreter_tiles() -> bool:
    """Whether launches take the interpreter's tiles (few programs, each large: it runs them
    one by one in Python) rather than :func:`config`'s. Tests patch this to run the GPU's
    tiles through the interpreter."""
    return interpreting()


def _pow2(n: int) -> int:
    """The smallest power of two >= n (n >= 1). Plain Python: triton's own helpers are
    constexpr functions, ~4 us a call on the host, and a launch used seven."""
    return 1 << (n - 1).bit_length()


def _floor_pow2(n: int) -> int:
    """The largest power of two <= n, and 1 for n < 1 (a tile side must be a power of two:
    ``tl.arange`` refuses any other length)."""
    return 1 << (n.bit_length() - 1) if n >= 1 else 1


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (tests)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _rotate_tile(
    X, XO, x_off, o_off, live, c, s,
    HALF: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_TAIL: tl.constexpr, INTERLEAVED: tl.constexpr, COPY_TAIL: tl.constexpr,
):  # fmt: skip
    """Rotate the rows at ``x_off`` (a (tokens, heads, 1) tile of row starts) into ``o_off``.

    ``live`` masks the tile's rows; ``c`` and ``s`` are (tokens, 1, BLOCK_N) float32.
    """
    if INTERLEAVED:
        # The row's 2 * HALF rotary channels in one contiguous load, split into (2j, 2j + 1).
        r = tl.arange(0, 2 * BLOCK_N)[None, None, :]
        m = live & (r < 2 * HALF)
        x = tl.load(X + x_off + r, mask=m, other=0.0).to(tl.float32)
        a, b = tl.split(tl.reshape(x, (x.shape[0], x.shape[1], BLOCK_N, 2)))
        y = tl.reshape(tl.join(a * c - b * s, b * c + a * s), x.shape)
        tl.store(XO + o_off + r, y.to(XO.dtype.element_ty), mask=m)
    else:
        j = tl.arange(0, BLOCK_N)[None, None, :]
        m = live & (j < HALF)
        a = tl.load(X + x_off + j, mask=m, other=0.0).to(tl.float32)
        b = tl.load(X + x_off + HALF + j, mask=m, other=0.0).to(tl.float32)
        tl.store(XO + o_off + j, (a * c - b * s).to(XO.dtype.element_ty), mask=m)
        tl.store(XO + o_off + HALF + j, (b * c + a * s).to(XO.dtype.element_ty), mask=m)
    if COPY_TAIL:
        # Channels past the rotary part pass through; only needed when out is not x.
        tail = 2 * HALF + tl.arange(0, BLOCK_TAIL)[None, None, :]
        tm = live & (tail < HEAD_DIM)
        tl.store(XO + o_off + tail, tl.load(X + x_off + tail, mask=tm, other=0.0), mask=tm)


@triton.jit
def token_block(seq_len, BLOCK_T: tl.constexpr, WIDE: tl.constexpr):
    """This program's tokens ``t`` (BLOCK_T of them) and sequence ``b``: every sequence's
    token blocks share grid axis 0, the only one allowed more than 65535 programs (a packed
    batch may hold more sequences than that); 64-bit where the call is ``WIDE``."""
    t_blocks = tl.cdiv(seq_len, BLOCK_T)
    b = tl.program_id(0) // t_blocks
    t = (tl.program_id(0) % t_blocks) * BLOCK_T + tl.arange(0, BLOCK_T)
    if WIDE:
        t = t.to(tl.int64)
        b = b.to(tl.int64)
    return t, b


@triton.jit
def _rope_kernel(
    Q, K, QO, KO, COS, SIN, POS, OFF, CU,
    seq_len, n_q_heads, n_k_heads,
    q_sb, q_sh, q_st, k_sb, k_sh, k_st,
    qo_sb, qo_sh, qo_st, ko_sb, ko_sh, ko_st,
    table_row_stride, table_batch_stride, pos_sb, pos_st,
    HALF: tl.constexpr, HEAD_DIM: tl.constexpr,
    INTERLEAVED: tl.constexpr, CONJ: tl.constexpr, HAS_POS: tl.constexpr,
    HAS_OFF: tl.constexpr, VARLEN: tl.constexpr, COPY_TAIL: tl.constexpr, WIDE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_TAIL: tl.constexpr,
):  # fmt: skip
    t, b = token_block(seq_len, BLOCK_T, WIDE)  # head blocks on axis 1
    if VARLEN:
        start = tl.load(CU + b)
        length = tl.load(CU + b + 1) - start
        token = start + t  # row of the packed (total, heads, dim) tensors
        batch = b * 0
    else:
        length = seq_len
        token = t
        batch = b
    t_live = t < length

    # Table rows: int64 always (a position is any int64; the row was checked on the host).
    if HAS_POS:
        row = tl.load(POS + b * pos_sb + t * pos_st, mask=t_live, other=0).to(tl.int64)
    else:
        row = t.to(tl.int64)
    if HAS_OFF:
        row += tl.load(OFF + b).to(tl.int64)
    row += b.to(tl.int64) * table_batch_stride
    j = tl.arange(0, BLOCK_N)
    at = (row[:, None] * table_row_stride + j[None, :])[:, None, :]
    tm = (t_live[:, None] & (j < HALF)[None, :])[:, None, :]
    c = tl.load(COS + at, mask=tm, other=1.0).to(tl.float32)
    s = tl.load(SIN + at, mask=tm, other=0.0).to(tl.float32)
    if CONJ:
        s = -s

    # Head blocks on axis 1: q's first, then k's.
    q_blocks = tl.cdiv(n_q_heads, BLOCK_H)
    pid_h = tl.program_id(1)
    hh = tl.arange(0, BLOCK_H)
    if pid_h < q_blocks:
        h = pid_h * BLOCK_H + hh
        if WIDE:
            h = h.to(tl.int64)
        live = (t_live[:, None] & (h < n_q_heads)[None, :])[:, :, None]
        x_off = (batch * q_sb + token * q_st)[:, None] + (h * q_sh)[None, :]
        o_off = (batch * qo_sb + token * qo_st)[:, None] + (h * qo_sh)[None, :]
        _rotate_tile(
            Q, QO, x_off[:, :, None], o_off[:, :, None], live, c, s,
            HALF, HEAD_DIM, BLOCK_N, BLOCK_TAIL, INTERLEAVED, COPY_TAIL,
        )  # fmt: skip
    else:
        h = (pid_h - q_blocks) * BLOCK_H + hh
        if WIDE:
            h = h.to(tl.int64)
        live = (t_live[:, None] & (h < n_k_heads)[None, :])[:, :, None]
        x_off = (batch * k_sb + token * k_st)[:, None] + (h * k_sh)[None, :]
        o_off = (batch * ko_sb + token * ko_st)[:, None] + (h * ko_sh)[None, :]
        _rotate_tile(
            K, KO, x_off[:, :, None], o_off[:, :, None], live, c, s,
            HALF, HEAD_DIM, BLOCK_N, BLOCK_TAIL, INTERLEAVED, COPY_TAIL,
        )  # fmt: skip


class Config(NamedTuple):
    """A launch's tile and warps: tokens and heads per program, warps per program."""

    block_t: int
    block_h: int
    num_warps: int


DECODE_TOKENS = 4
"""Sequences this short are decode steps (or speculative ones): one tile spans every head."""


def config(head_dim: int, elem_size: int, interleaved: bool, tokens: int, heads: int) -> Config:
    """The tile for one launch, from the head width, the element size in bytes, the layout,
    the tokens per sequence and the most heads of one side.

    A program moves a tile of about 8 K elements (16 KB in bf16, 32 KB in fp32: enough
    loads in flight per SM to cover HBM latency with a few resident programs) and each thread
    holds 16 to 32 elements of each half, which keeps the registers per thread at or under 128
    with no spills (the sm_90 compile in ``scripts/triton_ptx.py`` reports both). Decode steps
    take every head of a side in one tile, as the work is a few rows. ``interleaved`` does not
    change the tile: its rows are loaded whole, as the half layout's are.
    """
    del interleaved  # same tile; kept in the key so a tuned table may tell them apart
    heads_p2 = _pow2(max(heads, 1))
    if tokens <= DECODE_TOKENS:
        block_t = _pow2(tokens)
        block_h = min(heads_p2, _floor_pow2(4096 // (block_t * head_dim)))
        warps = 4 if block_t * block_h * head_dim >= 2048 else 1
        return Config(block_t, block_h, warps)
    target = 8192 if elem_size <= 2 else 4096
    block_h = min(heads_p2, 8)
    block_t = min(_pow2(tokens), _floor_pow2(target // (block_h * head_dim)))
    warps = 8 if block_t * block_h * head_dim >= 8192 else 4
    return Config(block_t, block_h, warps)


# Triton refuses a tensor of more elements than this in a kernel (TRITON_MAX_TENSOR_NUMEL).
MAX_TILE = 1 << 20


def tile(
    head_dim: int, half: int, elem_size: int, interleaved: bool, tokens: int, heads: int
) -> Config:
    """The tile of a launch of the rotation or the norm kernels: the interpreter's (few
    programs, each large: it runs them one at a time in Python) or :func:`config`'s, then
    capped so that its widest tensor, ``block_t x block_h x`` the widest row part the kernels
    hold (a whole interleaved row, ``2 x BLOCK_N``, or the tail), stays within
    :data:`MAX_TILE` (73 heads of width 92 over 423 tokens made a 2^21-element tile that the
    interpreter refused). Every side a power of two."""
    if interpreter_tiles():
        cfg = Config(_pow2(min(tokens, 256)), _pow2(max(heads, 1)), 4)
    else:
        cfg = config(head_dim, elem_size, interleaved, tokens, heads)
    width = max(2 * _pow2(max(half, 1)), _pow2(max(head_dim - 2 * half, 1)))
    block_t, block_h = cfg.block_t, cfg.block_h
    while block_t * block_h * width > MAX_TILE and block_t > 1:
        block_t //= 2
    while block_t * block_h * width > MAX_TILE and block_h > 1:
        block_h //= 2
    return Config(block_t, block_h, cfg.num_warps)


def _strides(x: torch.Tensor, varlen: bool) -> tuple[int, int, int]:
    """(batch, head, token) strides of a (B, H, S, D) or packed (total, H, D) tensor."""
    if varlen:
        return 0, x.stride(1), x.stride(0)
    return x.stride(0), x.stride(1), x.stride(2)


def _extent(x: torch.Tensor) -> int:
    """One past the farthest element of ``x`` from its first, in elements."""
    if x.numel() == 0:
        return 0
    return 1 + sum((n - 1) * st for n, st in zip(x.shape, x.stride(), strict=True))


class Plan(NamedTuple):
    """What a launch needs besides its tensors: the grid, the integer arguments (sizes and
    strides) and the compile-time ones. A function of the tensors' shapes, strides and dtypes
    and the flags only, so a decode step can reuse the last one (:mod:`.triton_path`)."""

    grid: tuple[int, int, int]
    ints: tuple[int, ...]
    consts: dict[str, object]


def plan(
    q: torch.Tensor,
    k: torch.Tensor,
    q_out: torch.Tensor,
    k_out: torch.Tensor,
    cos: torch.Tensor,
    *,
    interleaved: bool,
    conjugate: bool,
    positions: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int | None = None,
    table_batch_stride: int = 0,
    copy_tail: bool = True,
) -> Plan | None:
    """The :class:`Plan` of a launch over these tensors (see :func:`launch`), or None where
    there is nothing to rotate."""
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
    if batch == 0 or seq_len == 0 or n_q + n_k == 0:
        return None
    cfg = tile(head_dim, half, q.element_size(), interleaved, seq_len, max(n_q, n_k))
    grid = (
        _cdiv(seq_len, cfg.block_t) * batch,
        _cdiv(n_q, cfg.block_h) + _cdiv(n_k, cfg.block_h),
        1,
    )
    pos_sb = pos_st = 0
    if positions is not None:
        pos_sb = positions.stride(0) if positions.shape[0] > 1 else 0
        pos_st = positions.stride(1)
    ints = (
        seq_len, n_q, n_k,
        *_strides(q, varlen), *_strides(k, varlen),
        *_strides(q_out, varlen), *_strides(k_out, varlen),
        cos.stride(0), table_batch_stride, pos_sb, pos_st,
    )  # fmt: skip
    consts: dict[str, object] = {
        "HALF": half,
        "HEAD_DIM": head_dim,
        "INTERLEAVED": interleaved,
        "CONJ": conjugate,
        "HAS_POS": positions is not None,
        "HAS_OFF": offsets is not None,
        "VARLEN": varlen,
        "COPY_TAIL": copy_tail and head_dim > 2 * half,
        "WIDE": max(_extent(t) for t in (q, k, q_out, k_out)) >= INT32_LIMIT,
        "BLOCK_T": cfg.block_t,
        "BLOCK_H": cfg.block_h,
        "BLOCK_N": _pow2(half),
        "BLOCK_TAIL": _pow2(max(head_dim - 2 * half, 1)),
        "num_warps": cfg.num_warps,
    }
    return Plan(grid, ints, consts)


def run(
    p: Plan,
    q: torch.Tensor,
    k: torch.Tensor,
    q_out: torch.Tensor,
    k_out: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    traceable: bool = True,
) -> None:
    """Launch the kernel by plan ``p`` (made by :func:`plan` for tensors of these shapes,
    strides and dtypes)."""
    dummy = cos  # unused pointer arguments still need a tensor
    # The kernel reads offsets[b] and cu_seqlens[b] at unit stride (a column of a (batch, 2)
    # table, or cu[::2], was read from the wrong memory): one small copy where they are not.
    offsets = offsets if offsets is None or offsets.stride(-1) == 1 else offsets.contiguous()
    if cu_seqlens is not None and cu_seqlens.stride(-1) != 1:
        cu_seqlens = cu_seqlens.contiguous()
    kernel = wrap_triton(_rope_kernel) if traceable else _rope_kernel
    kernel[p.grid](
        q, k, q_out, k_out, cos, sin,
        positions if positions is not None else dummy,
        offsets if offsets is not None else dummy,
        cu_seqlens if cu_seqlens is not None else dummy,
        *p.ints, **p.consts,
    )  # fmt: skip


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
    traceable: bool = True,
) -> None:
    """Run the kernel once over q and k (checked by the caller, see posemb.kernels).

    Args:
        q, k: ``(B, Hq, S, D)`` / ``(B, Hk, S, D)``, or packed ``(total, H, D)`` with
            ``cu_seqlens``; unit stride in D.
        q_out, k_out: outputs shaped like q and k (may be q and k: in place).
        cos, sin: tables ``(rows, D_r/2)`` of any float dtype (read as float32), with unit
            stride in the last dimension and one row stride for both.
        interleaved: pair (2j, 2j+1) instead of (j, j + r/2).
        conjugate: rotate by -theta (backward).
        positions: int ``(1 or B, S)`` table rows, or None for the token index.
        offsets: int ``(B,)`` added to every row of a sequence, or None.
        cu_seqlens: int ``(B+1,)`` sequence starts for packed tensors, with ``max_seqlen``.
        table_batch_stride: rows to skip per sequence (a table of B blocks of S rows).
        copy_tail: copy the channels past the rotary part (out of place; in place they stay).
        traceable: launch through ``wrap_triton`` (inside the registered ops, which
            torch.compile traces); the eager fast path launches the kernel directly.
    """
    p = plan(
        q, k, q_out, k_out, cos, interleaved=interleaved, conjugate=conjugate,
        positions=positions, offsets=offsets, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
        table_batch_stride=table_batch_stride, copy_tail=copy_tail,
    )  # fmt: skip
    if p is not None:
        run(p, q, k, q_out, k_out, cos, sin, positions, offsets, cu_seqlens, traceable)


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
