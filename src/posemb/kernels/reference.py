"""The oracle every fused path is tested against: posemb's plain ``apply_rope``, plus the row
arithmetic of the cached-table form (positions, offsets, packed sequences) written out."""

from __future__ import annotations

import torch

from ..rope import Layout, apply_rope

__all__ = ["apply_rope", "rotate", "table_rows"]


def table_rows(
    batch: int,
    seq_len: int,
    positions: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Row of the cos/sin table for every token.

    Args:
        batch, seq_len: sequences and tokens per sequence (ignored with ``cu_seqlens``).
        positions: ``(1 or batch, seq_len)`` rows; default the token index.
        offsets: ``(batch,)`` added per sequence.
        cu_seqlens: ``(batch + 1,)`` starts of packed sequences.

    Returns:
        ``(batch, seq_len)`` int64 rows, or ``(total,)`` for packed sequences.
    """
    if cu_seqlens is not None:
        cu = cu_seqlens.to(torch.int64)
        lengths = cu[1:] - cu[:-1]
        seq = torch.repeat_interleave(torch.arange(len(lengths), device=cu.device), lengths)
        rows = torch.arange(int(cu[-1]), device=cu.device) - cu[:-1][seq]
        if offsets is not None:
            rows = rows + offsets.to(torch.int64)[seq]
        return rows
    if positions is not None:
        rows = positions.to(torch.int64).expand(batch, seq_len)
    else:
        rows = torch.arange(seq_len, device=device).expand(batch, seq_len)
    if offsets is not None:
        rows = rows + offsets.to(torch.int64)[:, None]
    return rows


def rotate(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    layout: Layout | str,
    conjugate: bool = False,
) -> torch.Tensor:
    """``apply_rope`` with ``conjugate`` rotating by -theta (the transpose, for backward)."""
    return apply_rope(x, cos, -sin if conjugate else sin, layout)
