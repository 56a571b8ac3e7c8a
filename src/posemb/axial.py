"""Axial RoPE: rotary embeddings over 2 or 3 axes (height and width of image patches, or time,
height and width of video), as vision transformers use them.

Each axis owns a group of the head's rotation pairs and turns them by that axis's coordinate:
for an image patch at row h and column w, the pairs of the height group turn by h·θ and those
of the width group by w·θ, so the logit between two patches depends on their offset along each
axis separately (Heo et al. 2024, "Rotary Position Embedding for Vision Transformer", section
3.2, "RoPE-Axial"). Within a group the frequencies are those of 1D RoPE over the group's
channels, ``base^(-2i/(2 n))`` for its n pairs. Coordinates may be integers (patch indices) or
floats (normalised coordinates); a token whose coordinates are NaN (a class token, a register)
is not rotated.

How the groups sit in the head differs between models; :data:`PRESETS` names each layout with
the transformers module it reproduces (tested against it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from . import _checks, kernels
from ._errors import InputError
from .freqs import inv_freq
from .kernels.layout import Layout, as_layout


@dataclass(frozen=True)
class AxialLayout:
    """Where each axis's pairs sit in a head.

    Attributes:
        order: "blocks" (all of axis 0's pairs, then axis 1's, ...) or "alternate" (pair 0 to
            axis 0, pair 1 to axis 1, ... in turn).
        frequencies: "per_axis" (each axis the 1D RoPE frequencies of its own pairs) or
            "shared" (one 1D list over the whole head, dealt to the axes in turn: axis a gets
            every axes-th frequency from the a-th).
        layout: how channels pair up (:class:`~posemb.Layout`).
        module: the transformers module this layout reproduces, for the record.
    """

    order: str
    frequencies: str
    layout: Layout
    module: str


PRESETS: dict[str, AxialLayout] = {
    # Qwen2VLVisionRotaryEmbedding: cos = cat(h, w, h, w) over head_dim, rotate_half.
    "qwen2_vl": AxialLayout("blocks", "per_axis", Layout.HALF, "Qwen2VLVisionRotaryEmbedding"),
    # PixtralVisionRotaryEmbedding: one list over head_dim, evens to h and odds to w, in blocks.
    "pixtral": AxialLayout("blocks", "shared", Layout.HALF, "PixtralVisionRotaryEmbedding"),
}
"""Axial layouts by the name of the model family whose vision tower uses them."""


def _coordinates(positions: object) -> torch.Tensor:
    if isinstance(positions, torch.Tensor):
        return positions
    try:
        return torch.as_tensor(positions)
    except (TypeError, ValueError, RuntimeError):
        raise InputError(
            f"positions must be a tensor (or nested lists) of coordinates, got "
            f"{type(positions).__name__}"
        ) from None


class AxialRotaryEmbedding(nn.Module):
    """Rotates queries and keys by their coordinates on 2 or 3 axes.

    Args:
        head_dim: channels per head of q and k (all of them rotate).
        axes: 2 (height, width) or 3 (time, height, width).
        base: frequency base of every axis (10000 in Qwen2-VL's vision tower).
        split: pairs per axis, summing to head_dim / 2; default an equal share each.
        order: "blocks" or "alternate" (see :class:`AxialLayout`).
        frequencies: "per_axis" or "shared" (see :class:`AxialLayout`).
        layout: channel pairing (:class:`~posemb.Layout`).
        backend: as in :class:`~posemb.RotaryEmbedding`.
    """

    def __init__(
        self,
        head_dim: int,
        axes: int = 2,
        base: float = 10000.0,
        split: tuple[int, ...] | None = None,
        order: str = "blocks",
        layout: Layout | str = Layout.HALF,
        backend: str = "auto",
        frequencies: str = "per_axis",
    ) -> None:
        super().__init__()
        self.head_dim = _checks.even_int("head_dim", head_dim)
        if axes not in (2, 3):
            raise InputError(f"axes must be 2 or 3, got {axes!r}")
        self.axes = axes
        self.base = _checks.base(base)
        pairs = head_dim // 2
        if split is None:
            if pairs % axes:
                raise InputError(
                    f"head_dim / 2 = {pairs} pairs do not split equally over {axes} axes; "
                    f"give split, pairs per axis summing to {pairs}"
                )
            split = (pairs // axes,) * axes
        if len(split) != axes or sum(split) != pairs or min(split) < 1:
            raise InputError(
                f"split must give each of the {axes} axes at least one pair and sum to "
                f"{pairs}, got {split!r}"
            )
        self.split = tuple(int(n) for n in split)
        if order not in ("blocks", "alternate"):
            raise InputError(f"order must be 'blocks' or 'alternate', got {order!r}")
        if order == "alternate" and len(set(self.split)) != 1:
            raise InputError("order 'alternate' needs an equal split: pairs take axes in turn")
        self.order = order
        if frequencies not in ("per_axis", "shared"):
            raise InputError(f"frequencies must be 'per_axis' or 'shared', got {frequencies!r}")
        if frequencies == "shared" and len(set(self.split)) != 1:
            raise InputError("frequencies 'shared' needs an equal split: axes take them in turn")
        self.frequencies = frequencies
        self.layout = as_layout(layout)
        if backend not in kernels.BACKENDS:
            raise InputError(
                f"backend must be one of {', '.join(kernels.BACKENDS)}, got {backend!r}"
            )
        self.backend = backend

    @classmethod
    def preset(
        cls, name: str, head_dim: int, base: float = 10000.0, backend: str = "auto"
    ) -> AxialRotaryEmbedding:
        """The axial RoPE of a model family's vision tower (:data:`PRESETS`).

        Raises:
            ValueError: an unknown name.
        """
        if name not in PRESETS:
            raise InputError(f"unknown axial preset {name!r}; known: {', '.join(PRESETS)}")
        p = PRESETS[name]
        return cls(
            head_dim, 2, base, order=p.order, layout=p.layout, backend=backend,
            frequencies=p.frequencies,
        )  # fmt: skip

    def pair_axes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """For each of the head's pairs, the axis that turns it and its frequency: ``(axis,
        inv_freq)``, each ``(head_dim / 2,)`` (inv_freq float64)."""
        if self.frequencies == "shared":
            full = inv_freq(self.head_dim, self.base, dtype=torch.float64)
            per_axis = [full[a :: self.axes] for a in range(self.axes)]
        else:
            per_axis = [inv_freq(2 * n, self.base, dtype=torch.float64) for n in self.split]
        if self.order == "blocks":
            axis = torch.cat([torch.full((n,), a) for a, n in enumerate(self.split)])
            freq = torch.cat(per_axis)
        else:
            axis = torch.arange(self.head_dim // 2) % self.axes
            freq = torch.stack(per_axis, dim=1).flatten()
        return axis, freq

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token tables for coordinates ``positions`` ``(..., axes)`` (integers or floats;
        NaN for a token left unrotated): ``(cos, sin)``, each ``(..., head_dim / 2)``."""
        pos = _coordinates(positions)
        if pos.dim() < 1 or pos.shape[-1] != self.axes:
            raise InputError(
                f"positions must end in {self.axes} coordinates (one per axis), got shape "
                f"{tuple(pos.shape)}"
            )
        if pos.is_complex() or pos.dtype == torch.bool:
            raise InputError(f"positions must be integers or floats, got {pos.dtype}")
        coords = pos.to(torch.float64)
        if torch.isinf(coords).any():
            raise InputError("positions must be finite (NaN marks a token left unrotated)")
        axis, freq = self.pair_axes()
        unrotated = torch.isnan(coords).any(-1, keepdim=True)
        angle = coords.nan_to_num(0.0)[..., axis.to(coords.device)] * freq.to(coords.device)
        angle = torch.remainder(angle, 2 * math.pi)
        cos, sin = torch.cos(angle), torch.sin(angle)
        cos = torch.where(unrotated, torch.ones_like(cos), cos)
        sin = torch.where(unrotated, torch.zeros_like(sin), sin)
        return cos.to(dtype), sin.to(dtype)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate queries and keys by their tokens' coordinates.

        Args:
            q: ``(batch, q_heads, seq, head_dim)``.
            k: ``(batch, kv_heads, seq, head_dim)``.
            positions: ``(seq, axes)`` or ``(batch, seq, axes)`` coordinates.

        Returns:
            ``(q, k)`` rotated, each with its input's shape and dtype.
        """
        q = _checks.heads_tensor("q", q, self.head_dim)
        k = _checks.heads_tensor("k", k, self.head_dim)
        pos = _coordinates(positions).to(q.device)
        batch_ok = pos.dim() == 2 or pos.shape[0] in (1, q.shape[0])
        if pos.shape[-2:-1] != (q.shape[2],) or pos.dim() not in (2, 3) or not batch_ok:
            raise InputError(
                f"positions must have shape ({q.shape[2]}, {self.axes}) or (batch, "
                f"{q.shape[2]}, {self.axes}), got {tuple(pos.shape)}"
            )
        cos, sin = self.cos_sin(pos, _checks.compute_dtype(q))
        if cos.dim() == 3 and cos.shape[0] == 1:
            cos, sin = cos[0], sin[0]
        return kernels.rotate(q, k, cos, sin, layout=self.layout, backend=self.backend)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, axes={self.axes}, base={self.base:g}, "
            f"split={self.split}, order={self.order!r}, frequencies={self.frequencies!r}, "
            f"layout={self.layout.value}"
        )


__all__ = ["PRESETS", "AxialLayout", "AxialRotaryEmbedding"]
