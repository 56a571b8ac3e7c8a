"""Which channels of a head form a rotation plane: the pairing convention every rotation uses.

Both are in wide use and neither is wrong; mixing them up gives a model that runs and is
quietly wrong (see :func:`posemb.permute_layout`).
"""

from __future__ import annotations

import enum

import torch

from .._errors import InputError


class Layout(str, enum.Enum):
    """Which channels of a head form a rotation plane."""

    HALF = "half"
    """Channel j pairs with j + r/2 (GPT-NeoX / Llama ``rotate_half``)."""
    INTERLEAVED = "interleaved"
    """Channel 2j pairs with 2j + 1 (RoFormer / GPT-J / Meta)."""


def as_layout(layout: object) -> Layout:
    """Return ``layout`` as a :class:`Layout`, accepting its string value."""
    try:
        return Layout(layout)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in Layout)
        raise InputError(f"layout must be a posemb.Layout ({allowed}), got {layout!r}") from None


def pairs(x: torch.Tensor, layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
    """Split the last dimension (size r) into the two coordinates of each plane, ``(..., r/2)``."""
    n = x.shape[-1] // 2
    if layout is Layout.HALF:
        return x[..., :n], x[..., n:]
    return x[..., 0::2], x[..., 1::2]


def unpairs(a: torch.Tensor, b: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Inverse of :func:`pairs`: two ``(..., r/2)`` tensors back to ``(..., r)``."""
    if layout is Layout.HALF:
        return torch.cat((a, b), dim=-1)
    return torch.stack((a, b), dim=-1).flatten(-2)
