"""Longer context without training: change which distance each (query, key) pair is rotated by.

A frequency scaling (:mod:`posemb.scaling`) changes what every pair of channels means and
usually needs fine-tuning. The methods here leave the frequencies alone and map each relative
distance ``d = i - j`` (query position i, key position j) to one the model was trained on:

- :class:`SelfExtend` (Jin et al. 2024, "LLM Maybe LongLM: Self-Extend LLM Context Window
  Without Tuning", ICML, eq. 2-3): neighbours closer than ``window`` W keep ``d``; farther pairs
  use grouped positions, ``(i // G + W - W // G) - j // G`` with group size G.
- :class:`ReRoPE` (Su 2023, "Rectified Rotary Position Embeddings", kexue.fm/archives/9708):
  ``min(d, W)``; the leaky form ``W + (d - W) / k`` beyond the window.
- :class:`DualChunk` (An et al. 2024, "Training-Free Long-Context Scaling of Large Language
  Models", ICML; Qwen2.5-1M's ``dual_chunk_attention_config``): with ``L = chunk_size -
  local_size`` keys sit at ``j mod L``; a query in the key's chunk at ``i mod L``, in the next
  chunk at ``min(i mod L + L, chunk_size)``, farther at ``min(2L - 1, chunk_size)``.

Each may also scale the queries by ``max(1, ln(i + 1) / ln n)`` for a training length n
(``query_scale``; LongLM's ``scale_base``, ReRoPE's ``training_length``).

A distance that is a difference of two positions is a rotation of q and one of k, so the
attention under a method is a few ordinary RoPE attentions: one per *position set* (two for
Self-Extend and ReRoPE, three for Dual Chunk Attention), each pair's logit taken from the set
its region uses. :func:`extended_attention` builds them that way; :meth:`relative_positions`
gives the distances themselves.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch.autograd import forward_ad as _forward_ad

from .. import _checks, kernels
from .._errors import InputError
from ..rope import RotaryEmbedding, XPos
from . import core, masks

F64 = torch.float64
# One position set: where q sits (..., q_len), where k sits (..., k_len), and the pairs whose
# logit it gives (..., q_len, k_len).
PositionSet = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _whole(cls: str, name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(f"{cls}.{name} must be an integer >= {minimum}, got {value!r}")
    return value


class Extension:
    """What the three methods share: the query scaling, the checks, the distances. Each
    method is a frozen dataclass with ``query_scale``: n, a training length, to multiply the
    queries at position i by ``max(1, ln(i + 1) / ln n)``; None leaves them alone."""

    query_scale: int | None
    name: ClassVar[str] = "extension"
    # Whether the distances of pairs with j > i are defined (bidirectional attention).
    bidirectional: ClassVar[bool] = True

    def _check_scale(self) -> None:
        if self.query_scale is not None:
            _whole(type(self).__name__, "query_scale", self.query_scale, 2)

    def relative_positions(
        self, q_positions: torch.Tensor, k_positions: torch.Tensor
    ) -> torch.Tensor:
        """The distance every (query, key) pair is rotated by.

        Args:
            q_positions: integers ``(q_len,)`` or ``(batch, q_len)``: the queries' true positions.
            k_positions: integers ``(k_len,)`` or ``(batch, k_len)``.

        Returns:
            ``(q_len, k_len)`` (or ``(batch, q_len, k_len)``): int64, or float64 where the
            method's distances are not whole (leaky ReRoPE).
        """
        qp = _checks.positions(q_positions, max_dim=2, name="q_positions")
        kp = _checks.positions(k_positions, max_dim=2, name="k_positions")
        nq, nk = (qp.shape[0] if qp.dim() == 2 else 1), (kp.shape[0] if kp.dim() == 2 else 1)
        if 1 not in (nq, nk) and nq != nk:
            raise InputError(
                f"q_positions and k_positions must be for the same batch, got {nq} and {nk} "
                f"sequences"
            )
        i, j = _grid(qp, kp)
        return self._distance(i, j)

    def _distance(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def position_sets(self, qp: torch.Tensor, kp: torch.Tensor) -> list[PositionSet]:
        """The rotations that realise :meth:`relative_positions`: for each set, the positions
        q and k are rotated at (float64) and the pairs whose logit it gives; the regions cover
        every pair once."""
        _, j = _grid(qp, kp)
        return [
            (q_at, k_at, (j >= lo.unsqueeze(-1)) & (j <= hi.unsqueeze(-1)))
            for (q_at, k_at), (lo, hi) in zip(
                self.set_positions(qp, kp), self.key_bounds(qp), strict=True
            )
        ]

    def set_positions(self, qp: torch.Tensor, kp: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
        """Per position set, where q and k are rotated (float64, qp's and kp's shapes)."""
        raise NotImplementedError

    def key_bounds(self, qp: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per position set, the lowest and highest key position (int64, inclusive, qp's shape;
        +-2^62 for none) whose pair with each query the set gives: every set's pairs with one
        query are the keys inside one interval of positions."""
        raise NotImplementedError

    def scale_queries(self, q_positions: torch.Tensor) -> torch.Tensor | None:
        """``max(1, ln(i + 1) / ln n)`` per query position (float64), or None without it."""
        if self.query_scale is None:
            return None
        i = q_positions.to(F64)
        return (torch.log1p(i.clamp_min(0)) / math.log(self.query_scale)).clamp_min(1.0)


_FAR = 1 << 62  # a key bound no position reaches


def _window_bounds(qp: torch.Tensor, w: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Self-Extend's and ReRoPE's three sets: keys closer than ``w`` either way, ``w`` or more
    before the query, ``w`` or more after it."""
    i = qp.to(torch.int64)
    far = torch.full_like(i, _FAR)
    return [(i - w + 1, i + w - 1), (-far, i - w), (i + w, far)]


def _grid(qp: torch.Tensor, kp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Query and key positions broadcast to ``(..., q_len, k_len)``."""
    return qp.to(torch.int64).unsqueeze(-1), kp.to(torch.int64).unsqueeze(-2)


@dataclass(frozen=True)
class SelfExtend(Extension):
    """Self-Extend (Jin et al. 2024): neighbour attention inside ``window``, grouped beyond.

    Args:
        group: G, the group size: past the window, G positions share one.
        window: W, the neighbour window: pairs with ``|i - j| < W`` keep their distance.
        query_scale: see :class:`Extension`.
    """

    group: int
    window: int
    query_scale: int | None = None
    name: ClassVar[str] = "selfextend"

    def __post_init__(self) -> None:
        _whole("SelfExtend", "group", self.group, 1)
        _whole("SelfExtend", "window", self.window, 1)
        self._check_scale()

    def _shift(self) -> int:
        return self.window - self.window // self.group

    def _distance(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        g, s = self.group, self._shift()
        d = i - j
        far = (i // g + s) - j // g
        # Keys after the query (bidirectional use): the same rule, mirrored.
        far_after = i // g - (j // g + s)
        return torch.where(d >= self.window, far, torch.where(d <= -self.window, far_after, d))

    def set_positions(self, qp: torch.Tensor, kp: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
        g, s = self.group, self._shift()
        qg, kg = torch.div(qp, g, rounding_mode="floor"), torch.div(kp, g, rounding_mode="floor")
        return [
            (qp.to(F64), kp.to(F64)),
            ((qg + s).to(F64), kg.to(F64)),
            (qg.to(F64), (kg + s).to(F64)),
        ]

    def key_bounds(self, qp: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return _window_bounds(qp, self.window)


@dataclass(frozen=True)
class ReRoPE(Extension):
    """ReRoPE (Su 2023): distances capped at ``window``; with ``leak`` k, growing 1/k as fast.

    Args:
        window: W: pairs with ``|i - j| < W`` keep their distance; farther ones are rotated by
            W (``leak`` None) or ``W + (|i - j| - W) / leak`` (leaky ReRoPE), sign kept.
        leak: k > 1, or None for the hard cap.
        query_scale: see :class:`Extension` (ReRoPE's ``training_length``).
    """

    window: int
    leak: float | None = None
    query_scale: int | None = None
    name: ClassVar[str] = "rerope"

    def __post_init__(self) -> None:
        _whole("ReRoPE", "window", self.window, 1)
        leak = self.leak
        if leak is not None:
            if isinstance(leak, bool) or not isinstance(leak, int | float) or not leak > 1:
                raise InputError(f"ReRoPE.leak must be a number > 1 (or None), got {leak!r}")
            if not math.isfinite(leak):
                raise InputError(f"ReRoPE.leak must be finite, got {leak!r}")
            object.__setattr__(self, "leak", float(leak))
        self._check_scale()

    def _distance(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        d, w = i - j, self.window
        if self.leak is None:
            return d.clamp(-w, w)
        df = d.to(F64)
        far = w + (df.abs() - w) / self.leak
        return torch.where(d.abs() >= w, far.copysign(df), df)

    def set_positions(self, qp: torch.Tensor, kp: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
        w = self.window
        qf, kf = qp.to(F64), kp.to(F64)
        if self.leak is None:
            # Any q and k positions W apart (or -W) give every far pair the same distance.
            zq, zk = torch.zeros_like(qf), torch.zeros_like(kf)
            return [(qf, kf), (zq + w, zk), (zq, zk + w)]
        k = self.leak
        shift = w - w / k
        return [(qf, kf), (qf / k + shift, kf / k), (qf / k, kf / k + shift)]

    def key_bounds(self, qp: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return _window_bounds(qp, self.window)


@dataclass(frozen=True)
class DualChunk(Extension):
    """Dual Chunk Attention (An et al. 2024), as Qwen2.5-1M's ``dual_chunk_attention_config``
    describes it: intra-chunk, successive-chunk and inter-chunk positions.

    Args:
        chunk_size: C, the longest distance the model was trained on (Qwen2.5-1M: 262144).
        local_size: the local window kept exact across a chunk boundary (Qwen2.5-1M: 8192);
            the chunks are ``L = chunk_size - local_size`` long.
        query_scale: see :class:`Extension`.

    Defined for causal attention only: keys in a later chunk than the query have no position.
    """

    chunk_size: int
    local_size: int
    query_scale: int | None = None
    name: ClassVar[str] = "dca"
    bidirectional: ClassVar[bool] = False

    def __post_init__(self) -> None:
        _whole("DualChunk", "chunk_size", self.chunk_size, 2)
        _whole("DualChunk", "local_size", self.local_size, 1)
        if self.local_size >= self.chunk_size:
            raise InputError(
                f"DualChunk.local_size must be less than chunk_size ({self.chunk_size}), got "
                f"{self.local_size}"
            )
        self._check_scale()

    @property
    def chunk_len(self) -> int:
        """L = chunk_size - local_size, the length of a chunk."""
        return self.chunk_size - self.local_size

    def _query_positions(self, qp: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Where a query sits: in its key's chunk, in the next one, and farther."""
        c, n = self.chunk_size, self.chunk_len
        intra = torch.remainder(qp, n)
        succ = (intra + n).clamp_max(c)
        inter = torch.full_like(qp, min(2 * n - 1, c))
        return intra, succ, inter

    def _regions(self, i: torch.Tensor, j: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n = self.chunk_len
        ci, cj = torch.div(i, n, rounding_mode="floor"), torch.div(j, n, rounding_mode="floor")
        return ci <= cj, ci == cj + 1, ci > cj + 1

    def _distance(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        key = torch.remainder(j, self.chunk_len)
        intra, succ, inter = self._query_positions(i)
        same, nxt, _ = self._regions(i, j)
        return torch.where(same, intra, torch.where(nxt, succ, inter)) - key

    def set_positions(self, qp: torch.Tensor, kp: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
        key = torch.remainder(kp, self.chunk_len).to(F64)
        return [(q.to(F64), key) for q in self._query_positions(qp)]

    def key_bounds(self, qp: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        # The query's chunk and after it; the chunk before; every chunk before that.
        n = self.chunk_len
        start = torch.div(qp.to(torch.int64), n, rounding_mode="floor") * n
        far = torch.full_like(start, _FAR)
        return [(start, far), (start - n, start - 1), (-far, start - n - 1)]


def _rotate(
    x: torch.Tensor,
    at: torch.Tensor,
    inv: torch.Tensor,
    factor: float,
    rope: RotaryEmbedding,
    dt: torch.dtype,
    backend: str = "reference",
) -> torch.Tensor:
    """x rotated at (possibly fractional) positions ``at``: float64 angles, the rope's layout,
    in ``dt``, by ``backend``."""
    if at.dim() == 2 and at.shape[0] == 1:
        at = at[0]  # one row of positions serves every sequence
    angles = at.to(F64).unsqueeze(-1) * inv.to(at.device, F64)
    cos, sin = (angles.cos() * factor).to(dt), (angles.sin() * factor).to(dt)
    x = x.to(dt)
    if x.stride(-1) != 1:  # the rotation kernels read the channels at unit stride
        x = x.contiguous()
    return kernels.rotate(x, x[:, :0], cos, sin, layout=rope.layout, backend=backend)[0]


def _rows(t: torch.Tensor) -> torch.Tensor:
    """Per-query values ``(q_len,)`` or ``(batch, q_len)`` shaped to scale
    ``(batch, heads, q_len, dim)``."""
    return t.unsqueeze(-1) if t.dim() == 1 else t[:, None, :, None]


def _pairs(mask: torch.Tensor) -> torch.Tensor:
    """A pair mask ``(q_len, k_len)`` or ``(batch, q_len, k_len)`` shaped for the logits."""
    return mask if mask.dim() == 2 else mask.unsqueeze(1)


def _shapes(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: RotaryEmbedding
) -> tuple[int, int, int, int]:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise InputError(
                f"{name} must have shape (batch, heads, seq, dim), got {tuple(t.shape)}"
            )
    b, hq, q_len, d = q.shape
    if d != rope.head_dim or k.shape[-1] != d:
        raise InputError(
            f"q and k must have head_dim {rope.head_dim} (the rope's), got q {tuple(q.shape)} "
            f"and k {tuple(k.shape)}"
        )
    if k.shape[0] != b or not k.shape[1] or hq % k.shape[1]:
        raise InputError(
            f"k must be (batch={b}, kv_heads dividing {hq}, k_len, head_dim), got {tuple(k.shape)}"
        )
    if v.shape[:3] != k.shape[:3]:
        raise InputError(
            f"v must have shape (batch, kv_heads, k_len, v_dim) matching k {tuple(k.shape[:3])}, "
            f"got {tuple(v.shape)}"
        )
    return b, hq, q_len, d


@dataclass(frozen=True)
class Visibility:
    """Which keys a query may see, and an additive bias on what it sees: the attention mask in
    the one form :func:`attend` applies (:func:`posemb.hf.extension.visibility` reads every
    form transformers passes into it).

    Args:
        causal: hide keys at later positions than the query.
        window: a sliding window: hide keys ``window`` or more positions before the query
            (and, without ``causal``, after it); None for none.
        pad: bool ``(batch, k_len)``, True where a key is padding (hidden from every query).
        bias: added to the logits, broadcasting to ``(batch, heads, q_len, k_len)``: float
            (entries at or below half the dtype's lowest, or -inf, hide the key) or bool
            (True: seen).
        by_index: ``causal`` and ``window`` count key *indices*, not positions: the query in
            row r of q_len sees the keys at indices up to ``r + k_len - q_len`` (and, with a
            window, after ``r + k_len - q_len - window``). What transformers means by
            ``is_causal`` and by flash attention's window, whatever the positions say (two
            sequences packed in one row, positions restarting at 0, are one sequence to it).
        segment: int ``(batch or 1, k_len)`` ids by key index, or None: a query (row r is
            key index ``r + k_len - q_len``) sees only the keys of its own segment (flash
            attention's packed sequences, split where the positions restart).
        allow: a mask function ``(r0, r1, c0, c1) -> bool (batch or 1, 1 or heads, r1 - r0,
            c1 - c0)``, True where query row r may see key column c, evaluated per tile (a
            flex ``BlockMask``'s ``mask_mod``); or None.
    """

    causal: bool = True
    window: int | None = None
    pad: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    by_index: bool = False
    segment: torch.Tensor | None = None
    allow: Callable[[int, int, int, int], torch.Tensor] | None = None

    def hidden(self, qp: torch.Tensor, kp: torch.Tensor) -> torch.Tensor | None:
        """The hard part as a bool grid broadcasting to ``(batch, heads, q_len, k_len)``
        (True: hidden), for the reference path; None where nothing is hidden."""
        i, j = _grid(qp, kp)
        if self.by_index:
            q_len, k_len = qp.shape[-1], kp.shape[-1]
            i = torch.arange(q_len, device=qp.device).unsqueeze(-1) + (k_len - q_len)
            j = torch.arange(k_len, device=qp.device).unsqueeze(-2)
        hidden = None
        if self.causal:
            hidden = j > i
        if self.window is not None:
            far = (i - j >= self.window) if self.causal else ((i - j).abs() >= self.window)
            hidden = far if hidden is None else hidden | far
        hidden = None if hidden is None else _pairs(hidden)
        if self.pad is not None:
            pad = self.pad.to(qp.device)[:, None, None, :]
            hidden = pad if hidden is None else hidden | pad
        if self.bias is not None:
            wide = torch.promote_types(self.bias.dtype, torch.float32)  # bool: float32
            soft = masks.hard(self.bias, wide) == -masks.INF
            hidden = soft if hidden is None else hidden | soft
        if self.allow is not None:  # the reference path: the whole grid at once
            banned = ~self.allow(0, qp.shape[-1], 0, kp.shape[-1]).to(qp.device)
            hidden = banned if hidden is None else hidden | banned
        if self.segment is not None:
            seg = self.segment.to(qp.device)
            other = (seg[:, seg.shape[-1] - qp.shape[-1] :, None] != seg[:, None, :])[:, None]
            hidden = other if hidden is None else hidden | other
        return hidden


def _visibility(causal: bool, padding: torch.Tensor | None, b: int, k_len: int) -> Visibility:
    """extended_attention's causal flag and key padding mask, checked."""
    if padding is not None:
        if not isinstance(padding, torch.Tensor) or padding.dtype != torch.bool:
            raise InputError("key_padding_mask must be a bool tensor (True where a key is padding)")
        if tuple(padding.shape) != (b, k_len):
            raise InputError(
                f"key_padding_mask must have shape ({b}, {k_len}), got {tuple(padding.shape)}"
            )
    return Visibility(causal=causal, pad=padding)


def extended_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rope: RotaryEmbedding,
    method: Extension,
    q_positions: torch.Tensor | None = None,
    k_positions: torch.Tensor | None = None,
    causal: bool = True,
    key_padding_mask: torch.Tensor | None = None,
    scale: float | None = None,
    fused: bool = True,
) -> torch.Tensor:
    """Attention with q and k unrotated, each pair rotated by ``method``'s distance.

    Args:
        q: ``(batch, heads, q_len, head_dim)``, not rotated.
        k: ``(batch, kv_heads, k_len, head_dim)``, not rotated (a decode step's cache holds
            keys unrotated); ``heads`` a multiple of ``kv_heads``.
        v: ``(batch, kv_heads, k_len, v_dim)``.
        rope: the model's :class:`~posemb.RotaryEmbedding` (any scaling, partial rotary, either
            layout); its frequencies and attention factor are used, at the length
            ``max position + 1`` of the call for a length-dependent scaling.
        method: :class:`SelfExtend`, :class:`ReRoPE` or :class:`DualChunk`.
        q_positions: ``(q_len,)`` or ``(batch, q_len)`` true positions; default the last
            q_len of the k_len positions, as :class:`~posemb.PositionalAttention` places them.
        k_positions: ``(k_len,)`` or ``(batch, k_len)``; default ``0 .. k_len - 1``.
        causal: mask keys at later positions than the query (Dual Chunk Attention needs it).
        key_padding_mask: bool ``(batch, k_len)``, True where a key is padding.
        scale: logit scale; default ``1 / sqrt(head_dim)``.
        fused: take the attention as fused calls merged by log-sum-exp where it can (below);
            False always takes the blocked reference path.

    Returns:
        ``(batch, heads, q_len, v_dim)`` in q's dtype. A query that may see no key gets zeros.

    Memory and work: with ``fused`` (the default), whenever every sequence's key positions
    increase along it (padding aside), each position set's pairs with a query are one range of
    keys, and the attention is a few fused attention calls per block of 1,024 queries, merged
    exactly by their log-sum-exp (:mod:`posemb.attention.core`; the CPU's flash kernel,
    explicit tiles
    elsewhere); nothing of size ``q_len x k_len`` is formed, and gradients flow through it.
    Otherwise (keys out of order, as in a packed batch; tracing) the reference path runs:
    queries in blocks whose logits hold at most 2^24 elements, each set's product over the
    columns its pairs occupy, plus ``(q_len, k_len)`` pair masks.
    """
    q, k, v = (_checks.float_tensor(n, t) for n, t in (("q", q), ("k", k), ("v", v)))
    for name, t in (("q", q), ("k", k), ("v", v)):
        _checks.not_meta(name, t)  # the regions and the length are read from values
    _not_mapped(q_positions=q_positions, k_positions=k_positions, key_padding_mask=key_padding_mask)
    if not isinstance(rope, RotaryEmbedding) or isinstance(rope, XPos):
        raise InputError(
            f"rope must be a posemb.RotaryEmbedding, not xPos (which scales q and k by their "
            f"positions, what a re-mapped distance cannot express), got {type(rope).__name__}"
        )
    if not isinstance(method, (SelfExtend, ReRoPE, DualChunk)):
        raise InputError(
            f"method must be SelfExtend, ReRoPE or DualChunk, got {type(method).__name__}"
        )
    if not causal and not method.bidirectional:
        raise InputError(f"{type(method).__name__} is defined for causal attention only")
    b, _, q_len, d = _shapes(q, k, v, rope)
    k_len = k.shape[2]
    if causal and q_positions is None and q_len > k_len:
        raise InputError(
            f"causal attention needs q_len <= k_len (the queries are the last q_len of the "
            f"k_len positions), got {q_len} > {k_len}; pass q_positions"
        )
    qp = _checks.positions_for(
        "q_positions", q_positions, batch=b, length=q_len, device=q.device, start=k_len - q_len
    )
    kp = _checks.positions_for("k_positions", k_positions, batch=b, length=k_len, device=k.device)
    _checks.within_limit("q_positions", qp)
    _checks.within_limit("k_positions", kp)
    s = 1.0 / math.sqrt(d) if scale is None else _checks.number("scale", scale, minimum=0.0)
    vis = _visibility(causal, key_padding_mask, b, k_len)  # checked before any work
    return attend(q, k, v, rope, method, qp, kp, vis, s, fused=fused)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rope: RotaryEmbedding,
    method: Extension,
    qp: torch.Tensor,
    kp: torch.Tensor,
    vis: Visibility,
    s: float,
    fused: bool = True,
) -> torch.Tensor:
    """:func:`extended_attention` after its checks: positions ``qp`` ``(q_len,)`` or ``(batch,
    q_len)`` and ``kp`` likewise, ``vis`` what each query may see, ``s`` the logit scale.
    Returns ``(batch, heads, q_len, v_dim)`` in q's dtype (the patched transformers
    attention's core)."""
    out_dtype = q.dtype
    _not_mapped(q_positions=qp, k_positions=kp, key_padding_mask=vis.pad, segment=vis.segment)
    vis = _checked_bias(vis, (q.shape[0], q.shape[1], q.shape[2], k.shape[2]))
    if q.numel() == 0 or k.shape[2] == 0:  # nothing to attend, or nothing to attend to
        return nothing_seen(q, k, v, vis.bias).to(out_dtype)
    top = max(int(t.max()) for t in (qp, kp) if t.numel()) if qp.numel() or kp.numel() else 0
    inv, factor = rope.schedule(top + 1)
    # One arithmetic dtype for all three: float64 if any is, else float32.
    dt = functools.reduce(torch.promote_types, (_checks.compute_dtype(t) for t in (q, k, v)))
    temper = method.scale_queries(qp)
    if temper is not None:  # per query row; it commutes with the rotation
        q = q.to(dt) * _rows(temper.to(q.device, dt))
    # Forward-mode AD (dual tensors) has no rule in the fused calls' autograd function: the
    # blocked path, plain torch, carries the tangents.
    direct = fused and not _checks.tracing() and _forward_ad._current_level < 0
    ranges = _ranges(method, qp, kp, vis) if direct else None
    if ranges is None:
        return _reference(q, k, v, rope, method, qp, kp, vis, s, (inv, factor, dt)).to(out_dtype)
    # The calls run in float32 or wider, but a GPU's in the half type they were given (its
    # kernels merge in float32 all the same): tensor cores, half the memory traffic.
    half = out_dtype in (torch.float16, torch.bfloat16) and q.device.type == "cuda"
    calls = out_dtype if half else dt
    qs, ks, used, first = [], [], [], []
    for index, (q_at, k_at) in enumerate(method.set_positions(qp, kp)):
        span = ranges.span(index)
        if span is None:  # no query takes a pair from this set
            continue
        lo, hi = span  # a decode step rotates only the keys this set's pairs use
        used.append(index)
        first.append(lo)
        qs.append(_rotate(q, q_at, inv, factor, rope, dt, "auto").to(calls))
        ks.append(
            _rotate(k[:, :, lo:hi], k_at[..., lo:hi], inv, factor, rope, dt, "auto").to(calls)
        )
    if not used:  # no query sees any key: zeros, connected to the inputs (zero gradients)
        return nothing_seen(q, k, v, vis.bias).to(out_dtype)
    ranges = ranges.keep(used, first)
    return core.attention(qs, ks, v.to(calls), ranges, s).to(out_dtype)


def _not_mapped(**named: object) -> None:
    """Refuse positions or a mask that ``torch.func.vmap`` maps over: the position sets, the
    ranges and the largest position are read from their values, which a batched tensor does
    not give (q, k and v may be mapped over; so may these, one call per row)."""
    if torch._C._functorch.maybe_current_level() is None:
        return
    for name, t in named.items():
        if isinstance(t, torch.Tensor) and torch._C._functorch.is_batchedtensor(t):
            raise InputError(
                f"{name} is mapped over by torch.func.vmap, and extended attention reads its "
                f"values (the position sets and the distances); map over q, k and v only, "
                f"or call it once per row"
            )


def _checked_bias(vis: Visibility, shape: tuple[int, int, int, int]) -> Visibility:
    """``vis`` with its bias checked against the logits' ``shape`` (batch, heads, q_len,
    k_len) and viewed as 4-D (a bias of fewer dimensions broadcasts from the right)."""
    bias = vis.bias
    if bias is None:
        return vis
    if not isinstance(bias, torch.Tensor) or not (
        bias.is_floating_point() or bias.dtype == torch.bool
    ):
        raise InputError(
            f"bias must be a float or bool tensor broadcasting to (batch, heads, q_len, "
            f"k_len) = {shape}, got {getattr(bias, 'dtype', type(bias).__name__)}"
        )
    fits = bias.dim() <= 4 and all(
        n in (1, want) for n, want in zip(reversed(bias.shape), reversed(shape), strict=False)
    )
    if not fits:
        raise InputError(
            f"bias of shape {tuple(bias.shape)} does not broadcast to (batch, heads, q_len, "
            f"k_len) = {shape}"
        )
    if bias.dim() < 4:
        bias = bias.view((1,) * (4 - bias.dim()) + tuple(bias.shape))
    return dataclasses.replace(vis, bias=bias)


class _NothingSeen(torch.autograd.Function):
    """Zeros ``(batch, heads, q_len, v_dim)`` for an attention in which no query sees any key,
    with a zero gradient for every input (as torch's attention gives), not an output cut off
    from autograd."""

    @staticmethod
    def forward(ctx, shape, dtype, *inputs):
        ctx.metas = [(t.shape, t.dtype) for t in inputs]
        return inputs[0].new_zeros(shape, dtype=dtype)

    @staticmethod
    def backward(ctx, d_out):
        return (None, None, *(d_out.new_zeros(s, dtype=dt) for s, dt in ctx.metas))


def nothing_seen(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The output of an attention whose queries see no key: zeros ``(batch, heads, q_len,
    v_dim)`` in q's dtype, differentiable (zero gradients) for q, k, v and a float bias."""
    inputs = [q, k, v] + ([bias] if bias is not None and bias.is_floating_point() else [])
    return _NothingSeen.apply((*q.shape[:3], v.shape[-1]), q.dtype, *inputs)


def _ranges(
    method: Extension, qp: torch.Tensor, kp: torch.Tensor, vis: Visibility
) -> masks.Masks | None:
    """Per set, the range of key indices each query takes its pairs from, when every
    sequence's unpadded key positions are in increasing order (None otherwise: the reference
    path serves it). Padded keys take the position before them (they are hidden anyway)."""
    if vis.segment is not None:  # packed sequences: their positions restart, out of order
        return None
    qp2 = (qp if qp.dim() == 2 else qp.unsqueeze(0)).to("cpu", torch.int64)
    keys = (kp if kp.dim() == 2 else kp.unsqueeze(0)).to("cpu", torch.int64)
    pad = None
    if vis.pad is not None:
        pad = vis.pad.to("cpu")
        keys = keys.expand(pad.shape[0], -1).masked_fill(pad, -_FAR)
    ordered = keys.cummax(-1).values
    if not torch.equal(ordered, keys) and (pad is None or not _ordered_unpadded(keys, pad)):
        return None
    rows = max(qp2.shape[0], ordered.shape[0])
    ordered = ordered.expand(rows, -1).contiguous()
    starts, ends = [], []
    by_position = not vis.by_index
    for lo, hi in method.key_bounds(qp2):
        if vis.causal and by_position:
            hi = torch.minimum(hi, qp2)
        if vis.window is not None and by_position:
            lo = torch.maximum(lo, qp2 - vis.window + 1)
            if not vis.causal:
                hi = torch.minimum(hi, qp2 + vis.window - 1)
        lo, hi = lo.expand(rows, -1).contiguous(), hi.expand(rows, -1).contiguous()
        start = torch.searchsorted(ordered, lo)
        end = torch.searchsorted(ordered, hi, right=True)
        if vis.by_index:
            start, end = _index_bounds(vis, start, end, ordered.shape[-1])
        starts.append(start.numpy())
        ends.append(end.numpy())
    pad_np = None if pad is None else pad.numpy()
    return masks.Masks(starts, ends, pad_np, vis.bias, allow=vis.allow)


def _index_bounds(
    vis: Visibility, start: torch.Tensor, end: torch.Tensor, k_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Key index ranges ``(rows, q_len)`` narrowed by causality and the window counted in
    indices (:attr:`Visibility.by_index`): row r is the key index ``r + k_len - q_len``."""
    at = torch.arange(start.shape[-1]) + (k_len - start.shape[-1])
    if vis.causal:
        end = torch.minimum(end, at + 1)
    if vis.window is not None:
        start = torch.maximum(start, at - vis.window + 1)
        if not vis.causal:
            end = torch.minimum(end, at + vis.window)
    return start, torch.maximum(end, start)


def _ordered_unpadded(keys: torch.Tensor, pad: torch.Tensor) -> bool:
    """Whether each row's unpadded positions never decrease (padding may sit anywhere)."""
    filled = keys.cummax(-1).values
    return bool((filled == keys)[~pad].all())


def _reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rope: RotaryEmbedding,
    method: Extension,
    qp: torch.Tensor,
    kp: torch.Tensor,
    vis: Visibility,
    s: float,
    schedule: tuple[torch.Tensor, float, torch.dtype],
) -> torch.Tensor:
    """The blocked path: each block's logits written out, each pair's from its set."""
    inv, factor, dt = schedule
    b, hq, q_len = q.shape[:3]
    k_len = k.shape[2]
    group = hq // k.shape[1]
    hidden = vis.hidden(qp, kp)
    seen = None if hidden is None else ~hidden
    if seen is not None and seen.dim() > 2:  # a pair is computed if any sequence sees it
        seen = seen.flatten(0, -3).any(0)
    sets = []
    for q_at, k_at, region in method.position_sets(qp, kp):
        live = region if seen is None else region & seen  # the pairs it gives that are seen
        if bool(live.any()):
            qr = _rotate(q, q_at, inv, factor, rope, dt)
            kr = _rotate(k, k_at, inv, factor, rope, dt).repeat_interleave(group, dim=1)
            sets.append((qr, kr, region, live))
    if not sets:
        return nothing_seen(q, k, v, vis.bias)
    vv = v.to(dt).repeat_interleave(group, dim=1)
    out = vv.new_zeros((b, hq, q_len, v.shape[-1]))
    rows = max(1, min(q_len, _BLOCK_ELEMENTS // max(1, b * hq * k_len)))
    for r0 in range(0, q_len, rows):
        r1 = min(q_len, r0 + rows)
        block = _block(sets, hidden, vis.bias, r0, r1, s, (b, hq, k_len), dt)
        if block is not None:
            logits, c0, c1 = block
            blind = (logits == float("-inf")).all(dim=-1, keepdim=True)
            p = torch.softmax(logits.masked_fill_(blind, 0.0), dim=-1).masked_fill(blind, 0.0)
            out[:, :, r0:r1] = torch.matmul(p, vv[:, :, c0:c1])
    return out


# A query block's logits hold at most this many elements (64 MiB in float32).
_BLOCK_ELEMENTS = 1 << 24


def _block(
    sets: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]],
    hidden: torch.Tensor | None,
    bias: torch.Tensor | None,
    r0: int,
    r1: int,
    s: float,
    shape: tuple[int, int, int],
    dt: torch.dtype,
) -> tuple[torch.Tensor, int, int] | None:
    """The logits of queries ``r0:r1`` over the columns ``c0:c1`` some set gives a seen pair
    in, each pair's from the set whose region holds it, hidden pairs ``-inf``, plus the bias;
    None when no pair of the block is seen. Each set's product is taken over its own columns
    only (the near window is a band, the causal far part a prefix), not over every key."""
    boxes = []
    for qr, kr, region, live in sets:
        cols = live[..., r0:r1, :].reshape(-1, live.shape[-1]).any(0).nonzero()
        if cols.numel():
            boxes.append((qr, kr, region, int(cols[0]), int(cols[-1]) + 1))
    if not boxes:
        return None
    c0, c1 = min(bx[3] for bx in boxes), max(bx[4] for bx in boxes)
    b, hq, _ = shape
    logits = torch.full(
        (b, hq, r1 - r0, c1 - c0), float("-inf"), dtype=dt, device=sets[0][0].device
    )
    for qr, kr, region, lo, hi in boxes:
        part = torch.matmul(qr[:, :, r0:r1], kr[:, :, lo:hi].transpose(-1, -2)) * s
        # -inf outside its region; the regions are disjoint, so at each pair one set's logit
        # is finite and the running maximum takes exactly it.
        part.masked_fill_(~_pairs(region[..., r0:r1, lo:hi]), float("-inf"))
        if part.requires_grad or _checks.tracing() or _forward_ad._current_level >= 0:
            # Autograd and torch.func transforms (vmap has no rule for maximum's out=): no
            # writes into views; padded to the block instead.
            padded = torch.nn.functional.pad(part, (lo - c0, c1 - hi), value=float("-inf"))
            logits = torch.maximum(logits, padded)
        else:
            view = logits[..., lo - c0 : hi - c0]
            torch.maximum(view, part, out=view)
    if bias is not None:  # the soft part; the hard part is in hidden
        soft = _rows_of(bias, r0, r1)
        soft = masks.hard(soft[..., c0:c1] if soft.shape[-1] > 1 else soft, dt)
        soft = soft.masked_fill(soft == float("-inf"), 0.0)
        logits = logits + (soft - _row_top(soft, logits, hidden, r0, r1, c0, c1))
    if hidden is not None:  # (..., q_len or 1, k_len): a padding mask has one row for all
        rows = _rows_of(hidden, r0, r1)
        rows = rows[..., c0:c1] if rows.shape[-1] > 1 else rows
        logits = logits.masked_fill(rows, float("-inf"))
    return logits, c0, c1


def _row_top(
    soft: torch.Tensor,
    logits: torch.Tensor,
    hidden: torch.Tensor | None,
    r0: int,
    r1: int,
    c0: int,
    c1: int,
) -> torch.Tensor:
    """Per row, the largest bias among the keys it sees (0 where it sees none), detached:
    subtracted from the row it changes no softmax, and keeps a large fill on every key (-1e9)
    from rounding the logits away (as :func:`posemb.attention.core.row_shift` does for the
    fused path)."""
    seen = torch.isfinite(logits)
    if hidden is not None:
        rows = _rows_of(hidden, r0, r1)
        seen = seen & ~(rows[..., c0:c1] if rows.shape[-1] > 1 else rows)
    top = soft.detach().expand_as(logits).masked_fill(~seen, -float("inf")).amax(-1, keepdim=True)
    return top.masked_fill(top == -float("inf"), 0.0)


def _rows_of(t: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
    return t[..., r0:r1, :] if t.shape[-2] > 1 else t


__all__ = [
    "DualChunk",
    "Extension",
    "ReRoPE",
    "SelfExtend",
    "Visibility",
    "extended_attention",
]
