"""posemb's scores as FlexAttention ``score_mod`` functions and its masks as block masks: the
attention of every encoding on CUDA, compiled by PyTorch into one fused kernel (Dong et al.
2024, "Flex Attention: A Programming Model for Generating Optimized Attention Kernels";
PyTorch's blog measured ~90% of FlashAttention-2's forward speed and ~85% of its backward).

A distance-only score (ALiBi, T5's buckets, KERPLE, causality, a window) is the same
per-distance table the blocked core reads (:mod:`.scores`), captured by the ``score_mod`` and
indexed at ``q_idx - kv_idx``; a learned table gets its gradient through FlexAttention's
support for captured tensors that require grad. FIRE evaluates its MLP per element inside the
kernel (its hidden units unrolled). Causality and the window are also a block mask, so the
kernel skips the blocks they hide.

What FlexAttention cannot serve here falls back to the blocked core (:func:`why_not` says
why): not CUDA (FlexAttention compiles for the CPU for inference only, without a backward),
sinks (a term outside the softmax's keys), key padding or positions that are not a range.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch

from .scores import Fire, Score, Visible

logger = logging.getLogger("posemb.attention")
_said: set[str] = set()


def why_not(
    q: torch.Tensor,
    score: Score,
    delta: int | None,
    pad: torch.Tensor | None,
    sinks: torch.Tensor | None,
) -> str | None:
    """Why FlexAttention does not serve this call (the blocked core does), or None.

    Args:
        q: the queries (their device decides).
        score: the encoding's score.
        delta: the distance of row r and key column c is ``r - c + delta`` (positions that
            are ranges), or None (anything else).
        pad: the key padding, or None.
        sinks: the sink logits, or None.
    """
    if q.device.type != "cuda":
        return f"FlexAttention's backward runs on CUDA only; this call is on {q.device.type}"
    if not hasattr(torch.nn.attention, "flex_attention"):
        return f"torch {torch.__version__} has no FlexAttention"
    if sinks is not None:
        return "sinks are a term of the merge outside the keys"
    if pad is not None:
        return "key padding (a per-sequence mask) is read per tile by the core"
    if delta is None:
        return "the positions are not ranges (gaps or out of order)"
    if q.dtype == torch.float64:
        return "FlexAttention's kernels take float16, bfloat16 and float32"
    return None


def score_mod(
    score: Score,
    table: torch.Tensor | None,
    lo: int,
    delta: int,
    q_start: torch.Tensor | None = None,
) -> Callable:
    """The ``score_mod`` of ``score``: ``s + table[h, q_idx - kv_idx + delta - lo]`` for a
    distance-only score (``table`` ``(heads, n)`` at distances ``lo ..``), FIRE's MLP per
    element otherwise. ``q_start``: int64 ``(batch,)``, each sequence's first query position
    (FIRE normalises by the query's position, not only the distance); default ``delta``
    (keys from position 0)."""
    if isinstance(score, Fire):
        return _fire_mod(score, delta, q_start)
    assert table is not None

    def mod(s: torch.Tensor, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> torch.Tensor:
        return s + table[h, q_idx - kv_idx + (delta - lo)]

    return mod


def _fire_mod(score: Fire, delta: int, q_start: torch.Tensor | None) -> Callable:
    fire: Any = score.module
    first, last = fire.mlp[0], fire.mlp[2]
    hidden = first.weight.shape[0]

    def mod(s: torch.Tensor, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> torch.Tensor:
        dt = fire.c.dtype
        c = fire.c.abs()
        # The distance is q - kv + delta whatever the positions start at; the position that
        # normalises it is the query's own.
        qpos = (q_idx + (delta if q_start is None else q_start[b])).to(dt)
        dist = (q_idx + delta - kv_idx).abs().to(dt)
        x = torch.log1p(c * dist) / torch.log1p(c * torch.maximum(qpos, fire.threshold.abs()))
        acc = last.bias[h]
        for j in range(hidden):  # unrolled into the kernel
            unit = torch.relu(first.weight[j, 0] * x + first.bias[j])
            acc = acc + last.weight[h, j] * unit
        return s + acc.to(s.dtype)

    return mod


def mask_mod(visible: Visible, delta: int) -> Callable:
    """The ``mask_mod`` of causality and the window: True where query row q (at ``q +
    delta`` against key column kv) may see the key."""

    def mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> torch.Tensor:
        d = q_idx + delta - kv_idx
        seen = d == d  # all True, traced
        if visible.causal:
            seen = seen & (d >= 0)
        if visible.window is not None:
            far = d if visible.causal else d.abs()
            seen = seen & (far < visible.window)
        return seen

    return mod


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    score: Score,
    table: torch.Tensor | None,
    lo: int,
    visible: Visible,
    scale: float,
    delta: int,
    compiled: bool = True,
    q_start: torch.Tensor | None = None,
) -> torch.Tensor:
    """FlexAttention with ``score`` and ``visible`` (see :func:`score_mod`,
    :func:`mask_mod`): ``(batch, heads, q_len, v_dim)`` in q's dtype; ``compiled=False`` runs
    FlexAttention's eager reference (any device, small shapes: how the tests check the score
    functions on the CPU). ``q_start``: int64 ``(1 or batch,)``, each sequence's first query
    position (default ``delta``: keys from position 0)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    q_len = q.shape[2]
    k_len = k.shape[2]
    blocks = None
    if visible.causal or visible.window is not None:
        blocks = create_block_mask(
            mask_mod(visible, delta), None, None, q_len, k_len, device=q.device
        )
    run: Any = _compiled() if compiled else flex_attention
    if q_start is not None:
        q_start = q_start.to(q.device, torch.int64).reshape(-1).expand(q.shape[0]).contiguous()
    mod = score_mod(score, table, lo, delta, q_start)
    gqa = q.shape[1] != k.shape[1]
    out = run(q, k, v, score_mod=mod, block_mask=blocks, scale=scale, enable_gqa=gqa)
    assert isinstance(out, torch.Tensor)
    return out


@functools.cache
def _compiled() -> Callable:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def say_once(reason: str) -> None:
    """Log, once per reason, that a CUDA call took the blocked core instead."""
    if reason not in _said:
        _said.add(reason)
        logger.info("posemb: the blocked core serves this attention, not FlexAttention: %s", reason)


__all__ = ["attend", "mask_mod", "say_once", "score_mod", "why_not"]
