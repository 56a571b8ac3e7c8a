"""An encoding's attention through the blocked core (:mod:`.core`): the score said per call,
causality, a sliding window, key padding, explicit positions and sinks, with no ``(q_len,
k_len)`` tensor anywhere, forward or backward.

Two plans, by what the positions are:

- **ranges** (every sequence's query and key positions are ``start + 0, 1, 2, ...`` with one
  distance between the two starts, as in prefill, a decode step or a chunk over a cache):
  row r's distance to key column c is ``r - c + delta``, so a distance-only score is one
  table and every call's mask a view of it (:func:`.core.square_plan`); a score said per tile
  (FIRE) runs the same calls with tiles of bounded size;
- **anything else** (positions with gaps or out of order, key padding): per query the range of
  keys its causality and window allow, found by binary search where the key positions
  increase (all keys otherwise), and each call's mask a tile made from the positions
  (:func:`.core.range_plan`).
"""

from __future__ import annotations

import torch

from .. import _checks
from . import flex
from .core import attention, range_plan, square_plan
from .masks import Masks, Table
from .scores import NoScore, Score, Visible

# Elements of a score's tile per call (FIRE), at most: on this project's CPU 2^19 ran fastest
# (2.0x plain attention at 2,048 tokens with the fused op, 2.5x at 2^18: more calls, each
# with its fixed cost; larger tiles fall out of cache). Where the attention's own output is
# small the tile is cut to a quarter of it (not below 2^17), so that it adds at most about a
# quarter to plain attention's peak memory (2 MiB beside 4.8 MiB at 2,048 tokens, 8x64).
SCORE_TILE = 1 << 19


def score_tile(out_elements: int) -> int:
    """Elements of a score's tile per call for an attention whose output has
    ``out_elements`` (see :data:`SCORE_TILE`)."""
    return min(SCORE_TILE, max(SCORE_TILE // 4, out_elements // 4))


# A table over more distances than this (positions far apart) is not made: each tile reads the
# score at its own distances instead.
_TABLE_MOST = 1 << 22


def tiled_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    score: Score | None,
    visible: Visible,
    scale: float,
    qp: torch.Tensor | None = None,
    kp: torch.Tensor | None = None,
    pad: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    fused: bool = True,
) -> torch.Tensor:
    """Attention of q over k and v with ``score`` added to its logits.

    Args:
        q: ``(batch, heads, q_len, head_dim)``, rotated already if the encoding rotates.
        k: ``(batch, kv_heads, k_len, head_dim)``, kv_heads dividing heads.
        v: ``(batch, kv_heads, k_len, v_dim)``.
        score: the encoding's score (:mod:`.scores`), or None for none.
        visible: causality and the window, by position.
        scale: the logit scale.
        qp: query positions ``(q_len,)`` or ``(batch, q_len)``; default the last q_len of
            ``0 .. k_len - 1``.
        kp: key positions ``(k_len,)`` or ``(batch, k_len)``; default ``0 .. k_len - 1``.
        pad: bool ``(batch, k_len)``, True where a key is padding; or None.
        sinks: ``(heads,)`` sink logits, or None.
        fused: False runs the explicit tiles (what other devices run).

    Returns:
        ``(batch, heads, q_len, v_dim)`` in q's dtype; zeros for a query that sees no key (and
        no sink).
    """
    b, h, q_len = q.shape[:3]
    k_len = k.shape[2]
    score = NoScore(h) if score is None else score
    # The calls in float32 or wider (half inputs: the table and the merge stay exact).
    dt = torch.promote_types(torch.promote_types(q.dtype, k.dtype), torch.float32)
    q_, k_, v_ = q.to(dt), k.to(dt), v.to(dt)
    qp2 = _rows(qp, b, q_len, k_len - q_len, q.device)
    kp2 = _rows(kp, b, k_len, 0, q.device)
    delta = _delta(qp2, kp2) if pad is None else None
    if q.device.type == "cuda":  # FlexAttention where it can serve the call
        reason = flex.why_not(q, score, delta, pad, sinks)
        if reason is None and delta is not None:
            return _flex(q, k, v, score, visible, scale, delta, qp2[:, 0])
        flex.say_once(str(reason))
    if delta is not None:
        budget = score_tile(b * h * q_len * v.shape[-1])
        masks, blocks = _square(score, visible, qp2, kp2, delta, (q_len, k_len, budget), dt)
    else:
        masks, blocks = _general(score, visible, qp2, kp2, pad, dt)
    out = attention([q_], [k_], v_, masks, scale, fused, blocks=blocks, sinks=sinks)
    return out.to(q.dtype)


def _flex(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    score: Score,
    visible: Visible,
    scale: float,
    delta: int,
    q_start: torch.Tensor,
) -> torch.Tensor:
    """The call through FlexAttention: the score's table over every distance the call spans
    (what is hidden is the block mask's); ``q_start`` ``(1 or batch,)`` each sequence's first
    query position (FIRE's normaliser)."""
    q_len, k_len = q.shape[2], k.shape[2]
    lo = delta - (k_len - 1)
    table = None
    if score.distance_only:
        d = torch.arange(lo, q_len + delta, device=q.device)
        table = score.table(d).to(torch.float32)
    return flex.attend(q, k, v, score, table, lo, visible, scale, delta, q_start=q_start)


def _rows(
    pos: torch.Tensor | None, b: int, n: int, start: int, device: torch.device
) -> torch.Tensor:
    """Positions as int64 ``(1 or b, n)`` on ``device`` (default ``start + arange(n)``)."""
    if pos is None:
        return (torch.arange(n, device=device) + start)[None]
    pos = pos.to(device, torch.int64)
    return pos[None] if pos.dim() == 1 else pos


def _delta(qp: torch.Tensor, kp: torch.Tensor) -> int | None:
    """``qp[b, r] - kp[b, c] - (r - c)``, one number for every sequence where each row of
    positions is a range ``start + 0, 1, 2, ...``; None otherwise."""
    if _checks.tracing():
        return None  # the values decide the plan: a traced call takes the general one
    q0, k0 = qp[:, :1], kp[:, :1]
    steps_q = torch.arange(qp.shape[-1], device=qp.device)
    steps_k = torch.arange(kp.shape[-1], device=kp.device)
    if not (torch.equal(qp, q0 + steps_q) and torch.equal(kp, k0 + steps_k)):
        return None
    starts = (q0 - k0).unique() if qp.numel() and kp.numel() else torch.zeros(1)
    return int(starts[0]) if starts.numel() == 1 else None


def _square(
    score: Score,
    visible: Visible,
    qp: torch.Tensor,
    kp: torch.Tensor,
    delta: int,
    sizes: tuple[int, int, int],
    dt: torch.dtype,
) -> tuple[Masks, list]:
    """The ranges plan: one table of the visible distances (and the score, where it is a
    function of the distance), every call a view of it. ``sizes``: q_len, k_len and the
    elements of a score's tile (:func:`score_tile`)."""
    q_len, k_len, budget = sizes
    tiles = None if score.distance_only else 0
    from .core import _SQUARE

    # Every distance a call's view reads: those of the whole (q_len, k_len) square, or, where
    # the visible distances are bounded, within a block's height of them (a block's call
    # spans the keys some of its rows may see).
    lo_seen, hi_seen = visible.span()
    low, high = delta - (k_len - 1), q_len - 1 + delta
    if lo_seen != -float("inf"):
        low = max(low, int(lo_seen) - _SQUARE + 1)
    if hi_seen != float("inf"):
        high = min(high, int(hi_seen) + _SQUARE - 1)
    low, high = min(low, high), max(low, high)
    d = torch.arange(low, high + 1, device=qp.device)
    values = _visible_table(score if score.distance_only else NoScore(score.num_heads), visible, d)
    table = Table(values.to(dt), low, delta)
    if not score.distance_only:
        tiles = max(1, budget // max(1, score.num_heads * min(q_len, _SQUARE)))
    blocks = square_plan(q_len, k_len, delta, visible, tiles)
    tile_score = None if score.distance_only else score
    return Masks(table=table, score=tile_score, qp=qp, kp=kp), blocks


def _visible_table(score: Score, visible: Visible, d: torch.Tensor) -> torch.Tensor:
    """``(heads, n)``: the score at distances ``d``, -inf where the distance is hidden."""
    values = score.table(d)
    hidden = visible.hidden(d)
    return values if hidden is None else values.masked_fill(hidden, -float("inf"))


def _general(
    score: Score,
    visible: Visible,
    qp: torch.Tensor,
    kp: torch.Tensor,
    pad: torch.Tensor | None,
    dt: torch.dtype,
) -> tuple[Masks, list]:
    """The general plan: per query the keys its causality and window allow (a range where
    the key positions increase), the score and what is hidden read per tile."""
    starts, ends = _key_ranges(visible, qp, kp)
    span = int(qp.max()) - int(kp.min()), int(qp.min()) - int(kp.max())
    low, high = span[1], span[0]
    pad_np = None if pad is None else pad.to("cpu").numpy()
    if high - low + 1 <= _TABLE_MOST:
        d = torch.arange(low, high + 1, device=qp.device)
        values = _visible_table(score if score.distance_only else NoScore(score.num_heads),
                                visible, d)  # fmt: skip
        table = Table(values.to(dt), low, 0)
        masks = Masks([starts], [ends], pad_np, table=table, qp=qp, kp=kp,
                      score=None if score.distance_only else score)  # fmt: skip
    else:  # positions far apart: each tile reads the score and what is hidden itself
        masks = Masks([starts], [ends], pad_np, score=_Hidden(score, visible), qp=qp, kp=kp)
    return masks, range_plan(masks, qp.shape[-1])


def _key_ranges(visible: Visible, qp: torch.Tensor, kp: torch.Tensor):
    """Per query, the first and one-past-last key index it may see, ``(B, q_len)`` int64
    NumPy arrays: a binary search of the allowed distances where every row of key positions
    increases; every key otherwise (the tiles hide what is not allowed)."""
    rows = max(qp.shape[0], kp.shape[0])
    qpc, kpc = qp.to("cpu"), kp.to("cpu").expand(rows, -1).contiguous()
    q_len = qp.shape[-1]
    lo_seen, hi_seen = visible.span()
    if kpc.shape[-1] > 1 and not bool((kpc[:, 1:] >= kpc[:, :-1]).all()):
        full = torch.full((rows, q_len), kpc.shape[-1], dtype=torch.int64)
        return torch.zeros_like(full).numpy(), full.numpy()
    qpc = qpc.expand(rows, -1).contiguous()
    far = 1 << 62
    first = qpc - (far if hi_seen == float("inf") else int(hi_seen))
    last = qpc - (-far if lo_seen == -float("inf") else int(lo_seen))
    starts = torch.searchsorted(kpc, first.clamp(-far, far))
    ends = torch.searchsorted(kpc, last.clamp(-far, far), right=True)
    return starts.numpy(), ends.numpy()


def visible_counts(
    visible: Visible, qp: torch.Tensor, kp: torch.Tensor, pad: torch.Tensor | None
) -> torch.Tensor:
    """How many keys each query sees, ``(B or 1, q_len)`` (scalable softmax's n), counted
    in blocks of rows so that nothing of size ``q_len x k_len`` is formed.

    Args:
        visible: causality and the window, by position.
        qp: query positions ``(q_len,)`` or ``(B, q_len)``.
        kp: key positions ``(k_len,)`` or ``(B, k_len)``.
        pad: bool ``(B, k_len)``, True at padding; or None.
    """
    qp2, kp2 = (qp[None] if qp.dim() == 1 else qp), (kp[None] if kp.dim() == 1 else kp)
    rows = max(1, (1 << 22) // max(1, kp2.numel()))
    counts = []
    for r0 in range(0, qp2.shape[-1], rows):
        d = qp2[:, r0 : r0 + rows, None] - kp2[:, None, :]  # (B, rows, k_len)
        hidden = visible.hidden(d)
        seen = torch.ones_like(d, dtype=torch.bool) if hidden is None else ~hidden
        if pad is not None:
            seen = seen & ~pad[:, None, :]
        counts.append(seen.sum(-1))
    return torch.cat(counts, dim=-1)


class _Hidden(Score):
    """A score with what ``visible`` hides folded in, said per tile from the positions."""

    def __init__(self, score: Score, visible: Visible) -> None:
        self.inner, self.visible = score, visible
        self.num_heads, self.distance_only, self.module = score.num_heads, False, score.module

    def tile(self, qp: torch.Tensor, kp: torch.Tensor) -> torch.Tensor:
        d = qp.unsqueeze(-1) - kp.unsqueeze(-2)
        if self.inner.distance_only:
            found, where = torch.unique(d, return_inverse=True)
            out = self.inner.table(found)[:, where].movedim(0, 1)
        else:
            out = self.inner.tile(qp, kp)
        hidden = self.visible.hidden(d)
        return out if hidden is None else out.masked_fill(hidden[:, None], -float("inf"))

    def release(self) -> None:
        self.inner.release()

    def param_grads(
        self, qp: torch.Tensor, kp: torch.Tensor, ds: torch.Tensor
    ) -> list[torch.Tensor | None]:
        # What is hidden carries no gradient (its softmax share is zero): the inner score's.
        return self.inner.param_grads(qp, kp, ds)


__all__ = ["tiled_attention", "visible_counts"]
