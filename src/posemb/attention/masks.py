"""What each call of the blocked core (:mod:`.core`) reads: the call itself (:class:`Call`),
a distance-only score as a table its calls view (:class:`Table`), and everything a call's mask
is made from (:class:`Masks`), with :func:`hard`, an attention mask as an additive bias."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .scores import Score

INF = float("inf")


@dataclass(frozen=True)
class Call:
    """One fused call: queries ``r0:r1`` of set ``s`` against keys ``c0:c1``. ``kind`` says
    what mask it reads: ``"none"``; ``"tile"`` (made for it: ranges that differ row by row,
    padding, a bias, a tile score); ``"hankel"`` (a view of the distance table, the call's
    queries reversed, plus a tile score's tile where there is one)."""

    s: int
    r0: int
    r1: int
    c0: int
    c1: int
    kind: str = "none"

    @property
    def masked(self) -> bool:
        return self.kind != "none"

    @property
    def flipped(self) -> bool:
        return self.kind == "hankel"


class Table:
    """A distance-only score as the calls read it: ``values`` ``(heads, n)`` at distances
    ``lo .. lo + n - 1`` (``-inf`` where hidden), in the calls' dtype, and ``delta``, the
    distance of row ``r`` and key column ``c`` being ``r - c + delta``."""

    def __init__(self, values: torch.Tensor, lo: int, delta: int) -> None:
        self.values, self.lo, self.delta = values, lo, delta
        # Hankel views read it. Not detached: a recomputed backward differentiates through it.
        self.rev = values.flip(-1).contiguous()

    @property
    def hi(self) -> int:
        return self.lo + self.values.shape[-1] - 1

    def start(self, c: Call) -> int:
        """Where call ``c``'s Hankel view starts in :attr:`rev` (its distance ``Dmax``)."""
        return self.hi - ((c.r1 - 1) - c.c0 + self.delta)

    def hankel(self, c: Call) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Call ``c``'s mask ``(1, heads, n, C)`` over its reversed rows (a view), and the
        rows it hides whole ``(1, heads, n)`` in their own order, or None."""
        n, cols = c.r1 - c.r0, c.c1 - c.c0
        start = self.start(c)
        span = self.rev[:, start : start + n + cols - 1]
        mask = span.as_strided((1, span.shape[0], n, cols), (0, span.stride(0), 1, 1))
        seen = torch.nn.functional.pad(torch.isfinite(span).cumsum(-1), (1, 0))
        count = seen[:, cols : cols + n] - seen[:, :n]  # reversed row i' sees t = i'..i'+C-1
        hidden = (count == 0).flip(-1)[None]
        return mask, hidden if bool(hidden.any()) else None

    def index(self, c: Call, shape: tuple[int, int]) -> torch.Tensor:
        """The distance index (into :attr:`values`) of every element of Hankel call ``c``'s tile
        ``(n, C)`` as its mask lays it out (reversed rows)."""
        n, cols = shape
        i = torch.arange(n, device=self.rev.device)[:, None]
        j = torch.arange(cols, device=self.rev.device)[None, :]
        return self.values.shape[-1] - 1 - (self.start(c) + i + j)


def _add_table_grad(grad: torch.Tensor, ds: torch.Tensor, index: torch.Tensor) -> None:
    """Add a call's logit gradients ``ds`` ``(B, heads, n, C)`` into the table's gradient
    ``(heads, N)``: each element to its distance (summed along the call's diagonals)."""
    flat = (ds[0] if ds.shape[0] == 1 else ds.sum(0)).reshape(ds.shape[1], -1)
    keep = (index >= 0) & (index < grad.shape[-1])
    if not bool(keep.all()):
        flat, index = flat[:, keep.reshape(-1)], index[keep]
    grad.index_add_(1, index.reshape(-1), flat.to(grad.dtype))


@dataclass(frozen=True)
class Masks:
    """What every call's mask is made from.

    - ``starts``/``ends``: per position set, the first and one-past-last key index each query
      sees, ``(B, q_len)`` int64 NumPy arrays (B is 1 or the batch), or None where a
      :class:`Table` says what is hidden; ``first``: per set, the key column its keys tensor
      starts at.
    - ``pad``: ``(batch, k_len)`` bool NumPy array (True: hidden) or None.
    - ``bias``: an additive bias broadcasting to ``(batch, heads, q_len, k_len)`` (see
      :func:`hard`) or None; ``shift``: per row, subtracted from it (:func:`row_shift`).
    - ``table``: a distance-only score and what is hidden, or None; ``score``: a score said
      per tile (FIRE), or None; ``qp``/``kp``: the positions ``(B, q_len)``/``(B, k_len)``
      (int64 tensors) a gathered table or a tile score reads.

    NumPy for the ranges: planning a long call takes thousands of small reads, each ~10x
    cheaper there than a tensor op.
    """

    starts: list[np.ndarray] | None = None
    ends: list[np.ndarray] | None = None
    pad: np.ndarray | None = None
    bias: torch.Tensor | None = None
    first: tuple[int, ...] = ()
    shift: torch.Tensor | None = None
    table: Table | None = None
    score: Score | None = None
    qp: torch.Tensor | None = None
    kp: torch.Tensor | None = None
    # What a mask function allows, per tile: (r0, r1, c0, c1) -> bool (B or 1, 1 or heads,
    # r1 - r0, c1 - c0), True where the key is seen (a flex BlockMask's mask_mod).
    allow: Callable[[int, int, int, int], torch.Tensor] | None = None

    def span(self, s: int) -> tuple[int, int] | None:
        """The key columns set ``s`` takes any pair from, or None for a set no query uses
        (a decode step rotates only these keys for it)."""
        assert self.starts is not None and self.ends is not None
        live = self.starts[s] < self.ends[s]
        if not live.any():
            return None
        return int(self.starts[s][live].min()), int(self.ends[s][live].max())

    def keep(self, sets: list[int], first: list[int]) -> Masks:
        """Only ``sets``, their keys tensors starting at columns ``first``."""
        assert self.starts is not None and self.ends is not None
        return dataclasses.replace(
            self,
            starts=[self.starts[s] for s in sets],
            ends=[self.ends[s] for s in sets],
            first=tuple(first),
        )

    def keys(self, ks: Sequence[torch.Tensor], c: Call) -> torch.Tensor:
        """Call ``c``'s keys from its set's tensor."""
        at = self.first[c.s] if self.first else 0
        return ks[c.s][:, :, c.c0 - at : c.c1 - at]

    def clear(self, c0: int, c1: int) -> bool:
        """Whether keys ``c0:c1`` need no mask beyond the ranges: no score, no bias, no
        padding there."""
        plain = self.bias is None and self.table is None and self.score is None
        plain = plain and self.allow is None
        return plain and (self.pad is None or not self.pad[:, c0:c1].any())

    def mask(
        self, c: Call, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The additive mask of call ``c``, ``(B, 1 or heads, rows, cols)`` (a view for a
        Hankel call: rows reversed), and the rows it hides whole (``(B, 1 or heads, rows)``
        bool, in their own order), or None if none."""
        if c.kind == "hankel" and self.table is not None:
            mask, hidden = self.table.hankel(c)  # the calls' dtype: still a view
            if self.score is not None:  # a score said per tile, on top of the table's
                qp, kp = self._positions(c)
                tile = self.score.tile(qp, kp).to(mask.dtype)
                mask = tile.add_(mask) if not tile.requires_grad else tile + mask
            return mask.to(dtype), hidden
        return self._tile(c, dtype, device)

    def _tile(
        self, c: Call, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        wide = torch.promote_types(dtype, torch.float32)  # formed wide, rounded once
        add: torch.Tensor | None = None
        if self.starts is not None and self.ends is not None:
            cols = np.arange(c.c0, c.c1)
            a = self.starts[c.s][:, c.r0 : c.r1, None]
            e = self.ends[c.s][:, c.r0 : c.r1, None]
            seen = (cols >= a) & (cols < e)
            if self.pad is not None:
                seen = seen & ~self.pad[:, None, c.c0 : c.c1]
            add = torch.from_numpy(np.where(seen, 0.0, -np.inf)[:, None]).to(device, wide)
        elif self.pad is not None:
            pad = np.where(self.pad[:, None, None, c.c0 : c.c1], -np.inf, 0.0)
            add = torch.from_numpy(pad).to(device, wide)
        for part in self._scores(c, wide):
            add = part if add is None else add + part
        if self.allow is not None:
            allowed = self.allow(c.r0, c.r1, c.c0, c.c1).to(device)
            part = torch.zeros(allowed.shape, dtype=wide, device=device)
            part.masked_fill_(~allowed, -INF)
            add = part if add is None else add + part
        if self.bias is not None:  # a dimension of size 1 broadcasts: not sliced
            bias = self.bias
            bias = bias[..., c.r0 : c.r1, :] if bias.shape[-2] > 1 else bias
            bias = bias[..., c.c0 : c.c1] if bias.shape[-1] > 1 else bias
            part = hard(bias, torch.promote_types(wide, bias.dtype))
            if self.shift is not None:
                part = part - self.shift[..., c.r0 : c.r1, None].to(part.dtype)
            add = part if add is None else add + part
        assert add is not None
        add = add.to(dtype)
        hidden = (add == -INF).all(-1)
        return add, hidden if bool(hidden.any()) else None

    def _scores(self, c: Call, wide: torch.dtype) -> list[torch.Tensor]:
        """Call ``c``'s scores as tiles ``(B, heads, rows, cols)``: the table gathered at the
        positions' distances, and the tile score."""
        parts = []
        if self.table is not None or self.score is not None:
            qp, kp = self._positions(c)
            if self.table is not None:
                d = qp.unsqueeze(-1) - kp.unsqueeze(-2)  # (B, rows, cols)
                index = d - self.table.lo
                values = self.table.values
                inside = (index >= 0) & (index < values.shape[-1])
                got = values[:, index.clamp(0, values.shape[-1] - 1)].movedim(0, 1)
                parts.append(got.masked_fill(~inside[:, None], -INF).to(wide))
            if self.score is not None:
                parts.append(self.score.tile(qp, kp).to(wide))
        return parts

    def _positions(self, c: Call) -> tuple[torch.Tensor, torch.Tensor]:
        """Call ``c``'s query and key positions, the rows as its kernel sees them."""
        assert self.qp is not None and self.kp is not None
        qp = self.qp[:, c.r0 : c.r1]
        return qp.flip(-1) if c.flipped else qp, self.kp[:, c.c0 : c.c1]


def hard(bias: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An attention mask as an additive bias in ``dtype``: a bool mask (True: seen) is 0 or
    -inf; an additive one is kept, its entries at or below half its dtype's lowest (the fill
    transformers uses for a hidden key) made -inf, so a query hidden from every key is one."""
    if bias.dtype == torch.bool:
        return torch.zeros(bias.shape, dtype=dtype, device=bias.device).masked_fill_(~bias, -INF)
    floor = torch.finfo(bias.dtype).min / 2
    return bias.to(dtype).masked_fill(bias <= floor, -INF)


__all__ = ["Call", "Masks", "Table", "hard"]
