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

import functools
import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from . import _checks, kernels
from ._errors import InputError
from .rope import RotaryEmbedding, XPos

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
        raise NotImplementedError

    def scale_queries(self, q_positions: torch.Tensor) -> torch.Tensor | None:
        """``max(1, ln(i + 1) / ln n)`` per query position (float64), or None without it."""
        if self.query_scale is None:
            return None
        i = q_positions.to(F64)
        return (torch.log1p(i.clamp_min(0)) / math.log(self.query_scale)).clamp_min(1.0)


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

    def position_sets(self, qp: torch.Tensor, kp: torch.Tensor) -> list[PositionSet]:
        g, s, w = self.group, self._shift(), self.window
        i, j = _grid(qp, kp)
        d = i - j
        qf, kf = qp.to(F64), kp.to(F64)
        qg, kg = torch.div(qp, g, rounding_mode="floor"), torch.div(kp, g, rounding_mode="floor")
        return [
            (qf, kf, d.abs() < w),
            ((qg + s).to(F64), kg.to(F64), d >= w),
            (qg.to(F64), (kg + s).to(F64), d <= -w),
        ]


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

    def position_sets(self, qp: torch.Tensor, kp: torch.Tensor) -> list[PositionSet]:
        w = self.window
        i, j = _grid(qp, kp)
        d = i - j
        qf, kf = qp.to(F64), kp.to(F64)
        if self.leak is None:
            # Any q and k positions W apart (or -W) give every far pair the same distance.
            zq, zk = torch.zeros_like(qf), torch.zeros_like(kf)
            return [(qf, kf, d.abs() < w), (zq + w, zk, d >= w), (zq, zk + w, d <= -w)]
        k = self.leak
        shift = w - w / k
        return [
            (qf, kf, d.abs() < w),
            (qf / k + shift, kf / k, d >= w),
            (qf / k, kf / k + shift, d <= -w),
        ]


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

    def position_sets(self, qp: torch.Tensor, kp: torch.Tensor) -> list[PositionSet]:
        key = torch.remainder(kp, self.chunk_len).to(F64)
        regions = self._regions(*_grid(qp, kp))
        return [
            (q.to(F64), key, r) for q, r in zip(self._query_positions(qp), regions, strict=True)
        ]


def _rotate(
    x: torch.Tensor,
    at: torch.Tensor,
    inv: torch.Tensor,
    factor: float,
    rope: RotaryEmbedding,
    dt: torch.dtype,
) -> torch.Tensor:
    """x rotated at (possibly fractional) positions ``at``: float64 angles, the rope's layout,
    in ``dt``."""
    if at.dim() == 2 and at.shape[0] == 1:
        at = at[0]  # one row of positions serves every sequence
    angles = at.to(F64).unsqueeze(-1) * inv.to(at.device, F64)
    cos, sin = (angles.cos() * factor).to(dt), (angles.sin() * factor).to(dt)
    x = x.to(dt)
    return kernels.rotate(x, x[:, :0], cos, sin, layout=rope.layout, backend="reference")[0]


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


def _hidden(
    qp: torch.Tensor,
    kp: torch.Tensor,
    causal: bool,
    padding: torch.Tensor | None,
    b: int,
    k_len: int,
) -> torch.Tensor | None:
    """True where a key is hidden from a query: later than it (causal), or padding."""
    hidden = None
    if causal:
        i, j = _grid(qp, kp)
        hidden = _pairs(j > i)
    if padding is not None:
        if not isinstance(padding, torch.Tensor) or padding.dtype != torch.bool:
            raise InputError("key_padding_mask must be a bool tensor (True where a key is padding)")
        if tuple(padding.shape) != (b, k_len):
            raise InputError(
                f"key_padding_mask must have shape ({b}, {k_len}), got {tuple(padding.shape)}"
            )
        pad = padding.to(qp.device)[:, None, None, :]
        hidden = pad if hidden is None else hidden | pad
    return hidden


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

    Returns:
        ``(batch, heads, q_len, v_dim)`` in q's dtype. A query that may see no key gets zeros.

    Memory and work: queries run in blocks whose logits hold at most 2^24 elements (64 MiB in
    float32), never the whole ``(batch, heads, q_len, k_len)`` when it is larger; in each
    block a position set's product is taken over the columns its pairs occupy (Self-Extend's
    and ReRoPE's window is a band, the causal far part a prefix), plus the ``(q_len, k_len)``
    pair masks. The q and k rotations are done once per set (two for Self-Extend and ReRoPE
    under causal attention, three both ways and for Dual Chunk Attention; a set no seen pair
    uses is skipped).
    """
    q, k, v = (_checks.float_tensor(n, t) for n, t in (("q", q), ("k", k), ("v", v)))
    for name, t in (("q", q), ("k", k), ("v", v)):
        _checks.not_meta(name, t)  # the regions and the length are read from values
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
    hidden = _hidden(qp, kp, causal, key_padding_mask, b, k_len)  # checked before any work
    return attend(q, k, v, rope, method, qp, kp, hidden, s)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rope: RotaryEmbedding,
    method: Extension,
    qp: torch.Tensor,
    kp: torch.Tensor,
    hidden: torch.Tensor | None,
    s: float,
) -> torch.Tensor:
    """:func:`extended_attention` after its checks: positions ``qp`` ``(q_len,)`` or ``(batch,
    q_len)`` and ``kp`` likewise, ``hidden`` a bool mask broadcasting to ``(batch, heads,
    q_len, k_len)`` (True: the key is not seen), ``s`` the logit scale. Returns ``(batch,
    heads, q_len, v_dim)`` in q's dtype (the patched transformers attention's core)."""
    b, hq, q_len = q.shape[:3]
    k_len, out_dtype = k.shape[2], q.dtype
    top = max(int(t.max()) for t in (qp, kp) if t.numel()) if qp.numel() or kp.numel() else 0
    inv, factor = rope.schedule(top + 1)
    # One arithmetic dtype for all three: float64 if any is, else float32.
    dt = functools.reduce(torch.promote_types, (_checks.compute_dtype(t) for t in (q, k, v)))
    temper = method.scale_queries(qp)
    if temper is not None:  # per query row; it commutes with the rotation
        q = q.to(dt) * _rows(temper.to(q.device, dt))
    group = hq // k.shape[1]
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
    vv = v.to(dt).repeat_interleave(group, dim=1)
    out = vv.new_zeros((b, hq, q_len, v.shape[-1]))
    rows = max(1, min(q_len, _BLOCK_ELEMENTS // max(1, b * hq * k_len)))
    for r0 in range(0, q_len, rows):
        r1 = min(q_len, r0 + rows)
        block = _block(sets, hidden, r0, r1, s, (b, hq, k_len), dt)
        if block is not None:
            logits, c0, c1 = block
            blind = (logits == float("-inf")).all(dim=-1, keepdim=True)
            p = torch.softmax(logits.masked_fill_(blind, 0.0), dim=-1).masked_fill(blind, 0.0)
            out[:, :, r0:r1] = torch.matmul(p, vv[:, :, c0:c1])
    return out.to(out_dtype)


# A query block's logits hold at most this many elements (64 MiB in float32).
_BLOCK_ELEMENTS = 1 << 24


def _block(
    sets: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]],
    hidden: torch.Tensor | None,
    r0: int,
    r1: int,
    s: float,
    shape: tuple[int, int, int],
    dt: torch.dtype,
) -> tuple[torch.Tensor, int, int] | None:
    """The logits of queries ``r0:r1`` over the columns ``c0:c1`` some set gives a seen pair
    in, each pair's from the set whose region holds it, hidden pairs ``-inf``; None when no
    pair of the block is seen. Each set's product is taken over its own columns only (the
    near window is a band, the causal far part a prefix), not over every key."""
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
        if part.requires_grad:  # autograd: no writes into views; padded to the block instead
            padded = torch.nn.functional.pad(part, (lo - c0, c1 - hi), value=float("-inf"))
            logits = torch.maximum(logits, padded)
        else:
            view = logits[..., lo - c0 : hi - c0]
            torch.maximum(view, part, out=view)
    if hidden is not None:  # (..., q_len or 1, k_len): a padding mask has one row for all
        rows = hidden[..., r0:r1, :] if hidden.shape[-2] > 1 else hidden
        logits.masked_fill_(rows[..., c0:c1], float("-inf"))
    return logits, c0, c1


__all__ = ["DualChunk", "Extension", "ReRoPE", "SelfExtend", "extended_attention"]
