"""Absolute additive encodings: a vector per position, added to the token embedding.

x_in[b, t] = x_tok[b, t] + P[t]. Two ways to get P:

- Sinusoidal (Vaswani et al. 2017, section 3.5): a fixed table, defined for every position.
- Learned (Gehring et al. 2017; GPT-2, Radford et al. 2019): a trained ``(max_len, dim)`` table,
  with no row at all for a position at or past ``max_len``.
"""

from __future__ import annotations

import torch
from torch import nn

from . import _checks
from ._errors import InputError
from .freqs import cos_sin, inv_freq


def sinusoidal_table(
    positions_or_length: int | torch.Tensor | list[int],
    dim: int,
    base: float = 10000.0,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The sinusoidal position table of Vaswani et al. 2017, section 3.5.

    PE[p, 2i] = sin(p * theta_i), PE[p, 2i+1] = cos(p * theta_i), theta_i = base^(-2i/dim).

    Sine and cosine are interleaved as in the paper. Several popular implementations
    (tensor2tensor's ``get_timing_signal_1d``, fairseq) concatenate all sines then all cosines
    instead; the two differ by a fixed permutation of channels, which matters only when loading
    weights trained with the other one.

    Args:
        positions_or_length: an int ``n`` for positions ``0 .. n-1``, or integer positions of any
            shape ``P``.
        dim: model width; even.
        base: frequency base; must exceed 1.
        dtype: output dtype (the angles are formed in float64 regardless).

    Returns:
        Tensor of shape ``(n, dim)`` or ``P + (dim,)``.
    """
    _checks.even_int("dim", dim)
    if isinstance(positions_or_length, int) and not isinstance(positions_or_length, bool):
        if positions_or_length < 0:
            raise InputError(
                f"positions_or_length must be a length >= 0 or integer positions, "
                f"got {positions_or_length}"
            )
        positions = torch.arange(positions_or_length)
    else:
        positions = _checks.positions(positions_or_length, name="positions_or_length")
    cos, sin = cos_sin(positions, inv_freq(dim, base, dtype=torch.float64), dtype=dtype)
    # (..., dim/2, 2) -> (..., dim): sin lands on even channels, cos on odd ones.
    return torch.stack((sin, cos), dim=-1).flatten(-2)


def _default_positions(x: torch.Tensor, positions: object) -> torch.Tensor:
    """Positions for an additive encoding of ``x`` of shape ``(batch, seq, dim)``."""
    return _checks.positions_for(
        "positions", positions, batch=x.shape[0], length=x.shape[1], device=x.device
    )


def _check_input(x: object, dim: int) -> torch.Tensor:
    x = _checks.float_tensor("x", x)
    if x.dim() != 3 or x.shape[-1] != dim:
        raise InputError(f"x must have shape (batch, seq, {dim}), got shape {tuple(x.shape)}")
    return x


class SinusoidalEmbedding(nn.Module):
    """Adds the fixed sinusoidal table to token embeddings; any length, no parameters.

    Args:
        dim: model width; even.
        base: frequency base; must exceed 1.
    """

    def __init__(self, dim: int, base: float = 10000.0) -> None:
        super().__init__()
        self.dim = _checks.even_int("dim", dim)
        self.base = _checks.base(base)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Return ``x + PE[positions]``.

        Args:
            x: token embeddings ``(batch, seq, dim)``.
            positions: ``(seq,)`` or ``(batch, seq)`` integers; default ``0 .. seq-1``.

        Returns:
            Tensor shaped and typed like ``x``.
        """
        x = _check_input(x, self.dim)
        pos = _default_positions(x, positions)
        table = sinusoidal_table(pos, self.dim, self.base, dtype=x.dtype)
        return x + table

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base:g}"


class LearnedEmbedding(nn.Module):
    """A trained table of ``max_len`` position vectors added to token embeddings (GPT-2 style).

    Initialised from N(0, init_std^2). OpenAI's GPT-2 code initialised its ``wpe`` table with
    std 0.01 (and ``wte`` with 0.02); 0.02 for both is the common re-implementation choice
    (Hugging Face's ``initializer_range``, nanoGPT), hence the default here.

    A learned table cannot extrapolate: positions at or past ``max_len`` have no row, and a
    lookup there raises ``ValueError`` rather than silently reading a wrapped or clamped row.

    Args:
        max_len: number of positions with a row.
        dim: model width.
        init_std: standard deviation of the initial values.
    """

    def __init__(self, max_len: int, dim: int, init_std: float = 0.02) -> None:
        super().__init__()
        self.max_len = _checks.positive_int("max_len", max_len)
        self.dim = _checks.positive_int("dim", dim)
        self.init_std = _checks.number("init_std", init_std, minimum=0.0)
        self.weight = nn.Parameter(torch.empty(max_len, dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw the table again from N(0, init_std^2)."""
        nn.init.normal_(self.weight, mean=0.0, std=self.init_std)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Return ``x + W[positions]``.

        Args:
            x: token embeddings ``(batch, seq, dim)``.
            positions: ``(seq,)`` or ``(batch, seq)`` integers in ``[0, max_len)``;
                default ``0 .. seq-1``.

        Returns:
            Tensor shaped like ``x``.
        """
        x = _check_input(x, self.dim)
        pos = _default_positions(x, positions)
        _checks.within_table(
            pos,
            self.max_len,
            f"this learned table (max_len={self.max_len})",
            "an absolute learned table has no row for a position it was not built with and "
            "cannot extrapolate. Use a relative encoding (RoPE, ALiBi) or a larger max_len",
        )
        return x + self.weight[pos].to(x.dtype)

    def extra_repr(self) -> str:
        return f"max_len={self.max_len}, dim={self.dim}, init_std={self.init_std:g}"
