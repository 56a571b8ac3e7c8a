"""The reference rotation every fused path is tested against, plus the row arithmetic of the
cached-table form (positions, offsets, packed sequences) written out.

:func:`apply_rope` is the plain elementwise form: for each plane (a, b), a' = a cos - b sin and
b' = b cos + a sin (Su et al. 2021, section 3.4.2, the computationally efficient form, in
either pairing).
"""

from __future__ import annotations

import torch

from .. import _checks
from .._errors import InputError
from .layout import Layout, as_layout, pairs, unpairs


def _check_rope_input(x: object, cos: object, sin: object) -> tuple[torch.Tensor, int]:
    x = _checks.float_tensor("x", x)
    if x.dim() != 4:
        raise InputError(
            f"x must have shape (batch, heads, seq, head_dim), got shape {tuple(x.shape)}"
        )
    cos_t, _, n = _checks.cos_sin_tables(cos, sin, x)
    _checks.per_token_tables(cos_t, x)
    return x, n


def apply_rope(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    layout: Layout | str = Layout.HALF,
) -> torch.Tensor:
    """Rotate the first r channels of every head by the angles whose cos and sin are given.

    The plain reference that every fast path is tested against: for each plane (a, b),
    a' = a cos - b sin and b' = b cos + a sin. The arithmetic runs in float32 (float64 for
    float64 input) and the result is rounded once to ``x``'s dtype, so half-precision inputs
    are not rounded between the two products.

    Args:
        x: ``(batch, heads, seq, head_dim)``.
        cos: ``(seq, r/2)`` or ``(batch, seq, r/2)``, with r <= head_dim.
        sin: same shape as ``cos``.
        layout: which channels form a plane (:class:`Layout`).

    Returns:
        Tensor shaped and typed like ``x``; channels ``r:`` pass through unchanged.
    """
    x, n = _check_rope_input(x, cos, sin)
    lay = as_layout(layout)
    compute = _checks.compute_dtype(x)
    # (seq, n) -> (1, 1, seq, n); (batch, seq, n) -> (batch, 1, seq, n): broadcast over heads.
    c = cos.to(compute)
    s = sin.to(compute)
    c, s = (c[None, None], s[None, None]) if c.dim() == 2 else (c[:, None], s[:, None])
    a, b = pairs(x[..., : 2 * n].to(compute), lay)
    rotated = unpairs(a * c - b * s, b * c + a * s, lay).to(x.dtype)
    return torch.cat((rotated, x[..., 2 * n :]), dim=-1)


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
