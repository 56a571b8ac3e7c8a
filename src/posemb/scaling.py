"""RoPE frequency schedules: how a rotary embedding picks its frequencies.

A schedule maps ``(rotary_dim, base)`` (and, for length-dependent methods, the current sequence
length) to ``(inv_freq, attention_factor)``: the float64 frequencies of the rotated pairs and a
factor that multiplies cos and sin (so the attention logits scale by its square). This is the
contract Hugging Face's ``ROPE_INIT_FUNCTIONS`` use, which keeps configs portable.

Schedules are frozen dataclasses validated at construction; they are hashable, so a module can
memoise its tables on them. Rotation code never sees a schedule, only cos and sin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .freqs import inv_freq as _default_inv_freq


@dataclass(frozen=True)
class RopeScaling:
    """Base class of all schedules; subclasses override :meth:`compute`."""

    def compute(
        self, rotary_dim: int, base: float, seq_len: int | None = None
    ) -> tuple[torch.Tensor, float]:
        """Return ``(inv_freq, attention_factor)``.

        Args:
            rotary_dim: number of rotated channels; even.
            base: frequency base; must exceed 1.
            seq_len: current sequence length, for schedules that depend on it; ignored otherwise.

        Returns:
            float64 tensor of shape ``(rotary_dim // 2,)`` and a float.
        """
        raise NotImplementedError


@dataclass(frozen=True)
class Default(RopeScaling):
    """The unscaled RoPE schedule of Su et al. 2021, eq. 15: theta_i = base^(-2i/d)."""

    def compute(
        self, rotary_dim: int, base: float, seq_len: int | None = None
    ) -> tuple[torch.Tensor, float]:
        return _default_inv_freq(rotary_dim, base, dtype=torch.float64), 1.0


@dataclass(frozen=True)
class Linear(RopeScaling):
    """Position interpolation (Chen et al. 2023, "Extending Context Window of Large Language
    Models via Positional Interpolation", eq. 4): position m is read as m / factor, which is the
    same as dividing every frequency by ``factor``.

    Args:
        factor: the context extension ratio s >= 1; ``factor == 1`` is :class:`Default`.
    """

    factor: float

    def __post_init__(self) -> None:
        f = self.factor
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f):
            raise ValueError(f"factor must be a finite number >= 1, got {f!r}")
        if f < 1:
            raise ValueError(f"factor must be >= 1 (it is the context extension ratio), got {f!r}")

    def compute(
        self, rotary_dim: int, base: float, seq_len: int | None = None
    ) -> tuple[torch.Tensor, float]:
        inv, _ = Default().compute(rotary_dim, base)
        return inv / float(self.factor), 1.0


def check(scaling: object) -> RopeScaling:
    """Return ``scaling`` (``None`` means :class:`Default`) if it is a schedule."""
    if scaling is None:
        return Default()
    if not isinstance(scaling, RopeScaling):
        raise ValueError(
            f"scaling must be a posemb.scaling schedule (Default, Linear) or None, "
            f"got {type(scaling).__name__}"
        )
    return scaling


__all__ = ["Default", "Linear", "RopeScaling", "check"]
