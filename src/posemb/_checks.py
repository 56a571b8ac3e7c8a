"""Argument checks shared by the public functions.

Every check raises ``ValueError`` whose message names the argument, the value it got and what
is allowed, so that a bad call fails at the door rather than deep inside a broadcast.
"""

from __future__ import annotations

import math

import torch

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def positive_int(name: str, value: object) -> int:
    """Return ``value`` as an int if it is a positive integer, else raise ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def number(name: str, value: object, *, minimum: float, strict: bool = False) -> float:
    """Return ``value`` as a float if it is a finite real >= ``minimum`` (> if ``strict``)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = value > minimum if strict else value >= minimum
    if not ok:
        rel = ">" if strict else ">="
        raise ValueError(f"{name} must be a finite number {rel} {minimum:g}, got {value!r}")
    return float(value)  # type: ignore[arg-type]


def even_int(name: str, value: object) -> int:
    """Return ``value`` if it is a positive even integer (a count of rotated channel pairs)."""
    positive_int(name, value)
    if value % 2:
        raise ValueError(f"{name} must be even (channels rotate in pairs), got {value!r}")
    return value


def base(value: object) -> float:
    """Return the frequency base as a float if it is finite and greater than 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"base must be a real number greater than 1, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value <= 1.0:
        raise ValueError(
            f"base must be finite and greater than 1 (frequencies base^(-2i/d) must decrease), "
            f"got {value!r}"
        )
    return value


def float_tensor(name: str, x: object) -> torch.Tensor:
    """Return ``x`` if it is a floating-point tensor of a dtype posemb computes with."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOAT_DTYPES:
        raise ValueError(
            f"{name} must have a floating dtype (float16, bfloat16, float32, float64), "
            f"got {x.dtype}"
        )
    return x


def float_dtype(name: str, dtype: object) -> torch.dtype:
    """Return ``dtype`` if it is one of the floating dtypes posemb produces."""
    if dtype not in _FLOAT_DTYPES:
        raise ValueError(
            f"{name} must be one of float16, bfloat16, float32, float64, got {dtype!r}"
        )
    return dtype  # type: ignore[return-value]


def positions(
    value: object, *, max_dim: int | None = None, name: str = "positions"
) -> torch.Tensor:
    """Return ``value`` as an integer tensor of positions.

    Python ints and sequences of ints are accepted and converted; tensors must already have an
    integer dtype, because a float position (0.5) has no meaning for a lookup and silently
    rounding it would hide a bug upstream.
    """
    if isinstance(value, torch.Tensor):
        t = value
    elif isinstance(value, (list, tuple, range)) or (
        isinstance(value, int) and not isinstance(value, bool)
    ):
        try:
            t = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as err:
            raise ValueError(f"{name} must be integers, got {value!r}") from err
    else:
        raise ValueError(
            f"{name} must be an integer tensor or a sequence of ints, got {type(value).__name__}"
        )
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{name} must have an integer dtype, got {t.dtype}")
    if max_dim is not None and not 1 <= t.dim() <= max_dim:
        shapes = "(seq,)" if max_dim == 1 else "(seq,) or (batch, seq)"
        raise ValueError(f"{name} must have shape {shapes}, got shape {tuple(t.shape)}")
    return t
