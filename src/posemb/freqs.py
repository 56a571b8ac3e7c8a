"""Frequencies, wavelengths and cos/sin tables: the arithmetic every encoding shares.

Sinusoidal tables (Vaswani et al. 2017, section 3.5) and rotary embeddings (Su et al. 2021,
eq. 15) use the same geometric ladder of angular frequencies

    theta_i = base^(-2i/d),   i = 0 .. d/2 - 1,

and a position p turns pair i by the angle p * theta_i.

Precision. The angle p * theta_i is the one place where positional arithmetic loses accuracy
silently. At p = 2^20 the angle of the fastest pair is about 1e6 rad; a float32 number near 1e6
has a spacing of 0.0625, so a float32 product is off by up to ~0.03 rad, and a float32
``inv_freq`` carries a relative rounding of ~6e-8 that the product multiplies by 1e6 as well.
posemb therefore forms angles in float64 from a float64 ``inv_freq``, reduces them into
[0, 2*pi) while still in float64, and casts only the final cos/sin. The float64 angle is off by
about |angle| * 1.1e-16, so cos/sin stay within float32 rounding (< 1e-7) for positions below
about 2^29 at theta_0 = 1; a test checks 2^20 against an exact reference.
"""

from __future__ import annotations

import math

import torch

from . import _checks
from ._errors import InputError

TWO_PI = 2.0 * math.pi


def inv_freq(
    dim: int,
    base: float = 10000.0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Angular frequencies theta_i = base^(-2i/dim) of the rotated channel pairs.

    Vaswani et al. 2017, section 3.5 (the sinusoid of dimension 2i has wavelength
    2*pi * base^(2i/d)); Su et al. 2021, eq. 15 (Theta = {theta_i = 10000^(-2(i-1)/d)}, one-based).

    Args:
        dim: number of channels that carry position; even (channels come in pairs).
        base: the geometric ratio spread over the channels; must exceed 1.
        dtype: output dtype. The values are computed in float64 and rounded once; pass
            ``torch.float64`` when the result feeds :func:`cos_sin` at large positions.
        device: output device.

    Returns:
        Tensor of shape ``(dim // 2,)``, decreasing from 1.0.
    """
    _checks.head_width("dim", _checks.even_int("dim", dim))
    b = _checks.base(base)
    _checks.float_dtype("dtype", dtype)
    exponent = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    return torch.pow(b, -exponent).to(dtype=dtype, device=device)


def wavelengths(dim: int, base: float = 10000.0) -> torch.Tensor:
    """Wavelengths 2*pi / theta_i in tokens: how many positions one full turn of pair i takes.

    Args:
        dim: number of channels that carry position; even.
        base: frequency base; must exceed 1.

    Returns:
        float64 tensor of shape ``(dim // 2,)``, increasing from 2*pi towards 2*pi*base.
    """
    return TWO_PI / inv_freq(dim, base, dtype=torch.float64)


def _angle_device(device: torch.device) -> torch.device:
    # Apple's MPS backend has no float64; the angles are formed on the CPU instead.
    return torch.device("cpu") if device.type == "mps" else device


def angles(positions: torch.Tensor | list[int] | int, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotation angles p * theta_i in float64, reduced into [0, 2*pi).

    Args:
        positions: integer tensor of any shape ``P`` (or a Python int / list of ints).
        inv_freq: frequencies of shape ``(n,)``; float64 gives full precision, a float32
            ``inv_freq`` is used exactly as its (already rounded) values say.

    Returns:
        float64 tensor of shape ``P + (n,)`` on ``inv_freq``'s device.
    """
    pos = _checks.positions(positions)
    _checks.within_limit("positions", pos)
    freqs = _checks.float_tensor("inv_freq", inv_freq)
    if freqs.dim() != 1:
        raise InputError(f"inv_freq must have shape (n,), got shape {tuple(freqs.shape)}")
    dev = _angle_device(freqs.device)
    pos64 = pos.to(device=dev, dtype=torch.float64)
    theta = freqs.to(device=dev, dtype=torch.float64)
    raw = pos64.unsqueeze(-1) * theta
    # Reducing in float64 keeps the angle exact to ~1e-16 * |angle|; a later float32 cos of an
    # unreduced 1e6-rad angle would lose everything after the third decimal.
    return torch.remainder(raw, TWO_PI)


def cos_sin(
    positions: torch.Tensor | list[int] | int,
    inv_freq: torch.Tensor,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine and sine of p * theta_i, formed in float64 and cast once to ``dtype``.

    Args:
        positions: integer tensor of any shape ``P``, e.g. ``(seq,)`` or ``(batch, seq)``.
        inv_freq: frequencies of shape ``(n,)`` (see :func:`inv_freq`).
        dtype: output dtype.

    Returns:
        ``(cos, sin)``, each of shape ``P + (n,)`` and dtype ``dtype``, on ``inv_freq``'s device.
    """
    _checks.float_dtype("dtype", dtype)
    a = angles(positions, inv_freq)
    return (
        torch.cos(a).to(dtype=dtype, device=inv_freq.device),
        torch.sin(a).to(dtype=dtype, device=inv_freq.device),
    )
