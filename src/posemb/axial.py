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

``frequencies="mixed"`` is RoPE-Mixed (the same paper, section 3.3): every pair of every head
turns by a learned mix of all axes, ``θ_x·x + θ_y·y``, so a head can attend along a diagonal.

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
from .kernels.layout import Layout, as_layout, pairs, unpairs

ORDERS = ("blocks", "alternate", "chunks")
FREQUENCIES = ("per_axis", "shared", "mixed")


@dataclass(frozen=True)
class AxialLayout:
    """Where each axis's pairs sit in a head.

    Attributes:
        order: "blocks" (all of axis 0's pairs, then axis 1's, ..., paired by ``layout`` over
            the whole head), "alternate" (pair 0 to axis 0, pair 1 to axis 1, ... in turn) or
            "chunks" (axis a owns the a-th contiguous slice of channels, paired by ``layout``
            within its slice, as Gemma 4's vision tower splits the head).
        frequencies: "per_axis" (each axis the 1D RoPE frequencies of its own pairs) or
            "shared" (one 1D list over the whole head, dealt to the axes in turn: axis a gets
            every axes-th frequency from the a-th).
        layout: how channels pair up (:class:`~posemb.Layout`).
        module: the transformers module this layout reproduces, for the record.
        coordinates: what the model's coordinate columns are, in its order: ("h", "w") for
            row then column, ("x", "y") for column then row.
        start: the coordinate of the first patch (Llama 4 counts from 1).
    """

    order: str
    frequencies: str
    layout: Layout
    module: str
    coordinates: tuple[str, ...] = ("h", "w")
    start: int = 0


_QWEN = AxialLayout("blocks", "per_axis", Layout.HALF, "Qwen2VLVisionRotaryEmbedding")

PRESETS: dict[str, AxialLayout] = {
    # cos = cat(h, w, h, w) over head_dim, rotate_half.
    "qwen2_vl": _QWEN,
    "qwen2_5_vl": AxialLayout(_QWEN.order, _QWEN.frequencies, _QWEN.layout,
                              "Qwen2_5_VLVisionRotaryEmbedding"),
    "qwen3_vl": AxialLayout(_QWEN.order, _QWEN.frequencies, _QWEN.layout,
                            "Qwen3VLVisionRotaryEmbedding"),
    "qwen3_5": AxialLayout(_QWEN.order, _QWEN.frequencies, _QWEN.layout,
                           "Qwen3_5VisionRotaryEmbedding"),
    "glm4v": AxialLayout(_QWEN.order, _QWEN.frequencies, _QWEN.layout,
                         "Glm4vVisionRotaryEmbedding"),
    "exaone4_5": AxialLayout(_QWEN.order, _QWEN.frequencies, _QWEN.layout,
                             "Exaone4_5_VisionRotaryEmbedding"),
    # One list over head_dim, evens to h and odds to w, in blocks.
    "pixtral": AxialLayout("blocks", "shared", Layout.HALF, "PixtralVisionRotaryEmbedding"),
    # Complex pairs (2j, 2j+1): the first half of the pairs turn by x + 1, the rest by y + 1.
    # torchtune's VisionRotaryPositionalEmbeddings is the same rotation.
    "llama4": AxialLayout("blocks", "per_axis", Layout.INTERLEAVED,
                          "Llama4VisionRotaryEmbedding", ("x", "y"), start=1),
    # apply_multidimensional_rope: x's half of the channels, then y's, each rotate_half.
    "gemma4": AxialLayout("chunks", "per_axis", Layout.HALF, "Gemma4VisionRotaryEmbedding",
                          ("x", "y")),
}  # fmt: skip
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


def patch_positions(
    height: int,
    width: int,
    *,
    coordinates: tuple[str, ...] = ("h", "w"),
    start: int = 0,
    cls: str | None = None,
    merge: int = 1,
) -> torch.Tensor:
    """Coordinates of a ``height`` x ``width`` grid of patches, in row-major order (or
    block-major over ``merge`` x ``merge`` blocks, the token order of the Qwen and GLM towers,
    whose merger joins each block into one token).

    Args:
        height: patches per column.
        width: patches per row.
        coordinates: the column order, ("h", "w") or ("x", "y") (x is the column index).
        start: the first patch's coordinate on each axis.
        cls: "first" or "last" adds one token with NaN coordinates (left unrotated) there.
        merge: side of the blocks the tokens are ordered by (1: plain row-major); it must
            divide height and width.

    Returns:
        ``(height * width [+ 1], 2)`` float64 coordinates.
    """
    height = _checks.positive_int("height", height)
    width = _checks.positive_int("width", width)
    merge = _checks.positive_int("merge", merge)
    if height % merge or width % merge:
        raise InputError(
            f"merge {merge} must divide height and width, got height={height}, width={width}"
        )
    if tuple(coordinates) not in (("h", "w"), ("x", "y")):
        raise InputError(f"coordinates must be ('h', 'w') or ('x', 'y'), got {coordinates!r}")
    if cls not in (None, "first", "last"):
        raise InputError(f"cls must be None, 'first' or 'last', got {cls!r}")
    rows, cols = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    grid = torch.stack((rows, cols) if coordinates[0] == "h" else (cols, rows), -1)
    blocks = grid.reshape(height // merge, merge, width // merge, merge, 2).transpose(1, 2)
    grid = blocks.reshape(-1, 2).to(torch.float64) + start
    nan = torch.full((1, 2), float("nan"), dtype=torch.float64)
    if cls == "first":
        return torch.cat((nan, grid))
    return torch.cat((grid, nan)) if cls == "last" else grid


def mixed_init(head_dim: int, heads: int, axes: int, base: float) -> torch.Tensor:
    """RoPE-Mixed's starting frequencies (Heo et al. 2024, section 3.3): ``(heads, head_dim /
    2, axes)``.

    The head's magnitudes are ``base^(-4i / head_dim)`` for i < head_dim / 4, each used twice:
    pair i points along a random direction φ of the head, pair i + head_dim / 4 along φ + π/2.
    The paper mixes two axes; for 3 the time component starts at 0 (time is not encoded until
    training moves it). The paper uses base 10.
    """
    quarter = head_dim // 4
    if quarter < 1 or head_dim % 4:
        raise InputError(f"frequencies 'mixed' needs head_dim divisible by 4, got {head_dim}")
    heads = _checks.positive_int("heads", heads)
    if axes not in (2, 3):
        raise InputError(f"axes must be 2 or 3, got {axes!r}")
    mag = base ** (-4.0 * torch.arange(quarter, dtype=torch.float64) / head_dim)
    phi = torch.rand(heads, 1, dtype=torch.float64) * 2 * math.pi
    direction = torch.cat((phi.expand(heads, quarter), phi.expand(heads, quarter) + math.pi / 2), 1)
    out = torch.zeros(heads, 2 * quarter, axes, dtype=torch.float64)
    out[..., 0] = torch.cat((mag, mag)) * torch.cos(direction)
    out[..., 1] = torch.cat((mag, mag)) * torch.sin(direction)
    return out


def _split(pairs_: int, axes: int, split: tuple[int, ...] | None) -> tuple[int, ...]:
    if split is None:
        if pairs_ % axes:
            raise InputError(
                f"head_dim / 2 = {pairs_} pairs do not split equally over {axes} axes; "
                f"give split, pairs per axis summing to {pairs_}"
            )
        split = (pairs_ // axes,) * axes
    if len(split) != axes or sum(split) != pairs_ or min(split) < 1:
        raise InputError(
            f"split must give each of the {axes} axes at least one pair and sum to "
            f"{pairs_}, got {split!r}"
        )
    return tuple(int(n) for n in split)


class AxialRotaryEmbedding(nn.Module):
    """Rotates queries and keys by their coordinates on 2 or 3 axes.

    Args:
        head_dim: channels per head of q and k (all of them rotate).
        axes: 2 (height, width) or 3 (time, height, width).
        base: frequency base of every axis (10000 in Qwen2-VL's vision tower).
        split: pairs per axis, summing to head_dim / 2; default an equal share each.
        order: "blocks", "alternate" or "chunks" (see :class:`AxialLayout`).
        layout: channel pairing (:class:`~posemb.Layout`).
        backend: as in :class:`~posemb.RotaryEmbedding`; learned ("mixed") frequencies always
            rotate in plain PyTorch, as their tables need gradients.
        frequencies: "per_axis", "shared" (see :class:`AxialLayout`) or "mixed" (learned,
            per key head: RoPE-Mixed; split and order do not apply, and the paper's base is
            10, not this default).
        heads: key heads, for "mixed" (query heads share their key head's frequencies).
        coordinates: names of the coordinate columns, for :meth:`grid`; default ("h", "w")
            or ("t", "h", "w").
        start: the first patch's coordinate, for :meth:`grid`.
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
        heads: int | None = None,
        coordinates: tuple[str, ...] | None = None,
        start: int = 0,
    ) -> None:
        super().__init__()
        self.head_dim = _checks.even_int("head_dim", head_dim)
        if axes not in (2, 3):
            raise InputError(f"axes must be 2 or 3, got {axes!r}")
        self.axes = axes
        self.base = _checks.base(base)
        if frequencies == "mixed" and (split is not None or order != "blocks"):
            raise InputError(
                f"frequencies 'mixed' turn every pair by every axis: split and order do not "
                f"apply, got split={split!r}, order={order!r}"
            )
        pairs_ = head_dim // 2
        self.split = (pairs_,) if frequencies == "mixed" else _split(pairs_, axes, split)
        if order not in ORDERS:
            raise InputError(f"order must be one of {', '.join(map(repr, ORDERS))}, got {order!r}")
        if frequencies not in FREQUENCIES:
            raise InputError(
                f"frequencies must be one of {', '.join(map(repr, FREQUENCIES))}, got "
                f"{frequencies!r}"
            )
        if len(set(self.split)) != 1 and (order == "alternate" or frequencies == "shared"):
            raise InputError(
                f"order {order!r} with frequencies {frequencies!r} needs an equal split: "
                f"the axes take pairs or frequencies in turn"
            )
        self.order, self.frequencies = order, frequencies
        self.layout = as_layout(layout)
        if backend not in kernels.BACKENDS:
            raise InputError(
                f"backend must be one of {', '.join(kernels.BACKENDS)}, got {backend!r}"
            )
        self.backend = backend
        self.coordinates = tuple(coordinates or (("h", "w") if axes == 2 else ("t", "h", "w")))
        if len(self.coordinates) != axes or len(set(self.coordinates)) != axes:
            raise InputError(
                f"coordinates must name each of the {axes} axes once, got {coordinates!r}"
            )
        self.start = _checks.nonnegative_int("start", start)
        self.mixed: nn.Parameter | None = None
        if frequencies == "mixed":
            if backend in ("cpu", "triton"):
                raise InputError(
                    f"backend {backend!r} cannot learn frequencies (the fused ops treat their "
                    f"tables as constants); use 'auto' or 'reference' with frequencies 'mixed'"
                )
            if heads is None:
                raise InputError(
                    "frequencies 'mixed' learns frequencies per key head: give heads, the "
                    "number of key heads"
                )
            n = _checks.positive_int("heads", heads)
            self.mixed = nn.Parameter(mixed_init(self.head_dim, n, axes, self.base).float())
        elif heads is not None:
            raise InputError(
                f"heads is for frequencies 'mixed' (per-head learned frequencies), got "
                f"heads={heads!r} with frequencies {frequencies!r}"
            )

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
            frequencies=p.frequencies, coordinates=p.coordinates, start=p.start,
        )  # fmt: skip

    def grid(self, height: int, width: int, cls: str | None = None, merge: int = 1) -> torch.Tensor:
        """This module's coordinates of a ``height`` x ``width`` image (:func:`patch_positions`
        with its coordinate order and start; ``merge=2`` orders the tokens as the Qwen and GLM
        towers do): ``(height * width [+ 1], 2)``."""
        if self.axes != 2:
            raise InputError("grid is for 2 axes; build 3-axis coordinates directly")
        return patch_positions(
            height, width, coordinates=self.coordinates, start=self.start, cls=cls, merge=merge
        )

    def pair_axes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """For each of the head's pairs, the axis that turns it and its frequency: ``(axis,
        inv_freq)``, each ``(head_dim / 2,)`` (inv_freq float64). Not for "mixed", where
        every pair turns by every axis (see ``mixed``)."""
        if self.mixed is not None:
            raise InputError("frequencies 'mixed' turn each pair by every axis; read .mixed")
        if self.frequencies == "shared":
            full = inv_freq(self.head_dim, self.base, dtype=torch.float64)
            per_axis = [full[a :: self.axes] for a in range(self.axes)]
        else:
            per_axis = [inv_freq(2 * n, self.base, dtype=torch.float64) for n in self.split]
        if self.order == "alternate":
            axis = torch.arange(self.head_dim // 2) % self.axes
            return axis, torch.stack(per_axis, dim=1).flatten()
        axis = torch.cat([torch.full((n,), a) for a, n in enumerate(self.split)])
        return axis, torch.cat(per_axis)

    def _coords(self, positions: object) -> torch.Tensor:
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
        return coords

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token tables for coordinates ``positions`` ``(..., axes)`` (integers or floats;
        NaN for a token left unrotated): ``(cos, sin)``, each ``(..., head_dim / 2)``; with
        frequencies "mixed", ``(..., heads, seq, head_dim / 2)`` and differentiable in
        ``mixed``."""
        coords = self._coords(positions)
        unrotated = torch.isnan(coords).any(-1, keepdim=True)
        coords = coords.nan_to_num(0.0)
        if self.mixed is not None:
            # float64 angles whatever the parameter's dtype: a bfloat16 copy of the module
            # would otherwise round coordinates and products too.
            angle = torch.einsum("...sa,hpa->...hsp", coords, self.mixed.double())
            unrotated = unrotated.unsqueeze(-3)
        else:
            axis, freq = self.pair_axes()
            angle = coords[..., axis.to(coords.device)] * freq.to(coords.device)
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
        if self.mixed is not None:
            return self._mixed(q, k, pos)
        cos, sin = self.cos_sin(pos, _checks.compute_dtype(q))
        if cos.dim() == 3 and cos.shape[0] == 1:
            cos, sin = cos[0], sin[0]
        if self.order != "chunks":
            return kernels.rotate(q, k, cos, sin, layout=self.layout, backend=self.backend)
        outs, lo = [], 0
        for n in self.split:  # each axis's slice of channels is a head of its own
            c, s = cos[..., lo : lo + n], sin[..., lo : lo + n]
            sl = slice(2 * lo, 2 * (lo + n))
            outs.append(
                kernels.rotate(q[..., sl], k[..., sl], c, s, layout=self.layout,
                               backend=self.backend)
            )  # fmt: skip
            lo += n
        return torch.cat([o[0] for o in outs], -1), torch.cat([o[1] for o in outs], -1)

    def _mixed(
        self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.mixed is not None
        heads = self.mixed.shape[0]
        if k.shape[1] != heads or q.shape[1] % heads:
            raise InputError(
                f"frequencies 'mixed' were made for {heads} key heads: k must have {heads} "
                f"heads and q a multiple of them, got {k.shape[1]} and {q.shape[1]}"
            )
        compute = _checks.compute_dtype(q)
        cos, sin = self.cos_sin(pos, compute)  # (..., heads, seq, pairs)
        if cos.dim() == 3:
            cos, sin = cos[None], sin[None]

        def turn(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
            a, b = pairs(x.to(compute), self.layout)
            return unpairs(a * c - b * s, b * c + a * s, self.layout).to(x.dtype)

        group = q.shape[1] // heads
        qc, qs = cos.repeat_interleave(group, 1), sin.repeat_interleave(group, 1)
        return turn(q, qc, qs), turn(k, cos, sin)

    def extra_repr(self) -> str:
        if self.mixed is not None:
            return (
                f"head_dim={self.head_dim}, axes={self.axes}, base={self.base:g}, "
                f"frequencies='mixed', heads={self.mixed.shape[0]}, layout={self.layout.value}"
            )
        return (
            f"head_dim={self.head_dim}, axes={self.axes}, base={self.base:g}, "
            f"split={self.split}, order={self.order!r}, frequencies={self.frequencies!r}, "
            f"layout={self.layout.value}"
        )


__all__ = ["PRESETS", "AxialLayout", "AxialRotaryEmbedding", "mixed_init", "patch_positions"]
