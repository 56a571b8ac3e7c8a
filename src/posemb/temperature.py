"""Query temperatures: a factor on each query that grows with the query's position.

Some long-context models multiply the queries by a factor that depends only on the query's
position, so every attention logit of that query scales by it: softmax grows sharper as the
context grows, which keeps attention from flattening over very many keys (the argument of
Nakanishi 2025, "Scalable-Softmax Is Superior for Attention", arXiv:2501.19399, which Meta
cites). Both published forms are a logarithm of a *floored* position, so the factor is exactly
1 over the first stretch of positions, i.e. over the length the model was trained at, and
grows by steps after it:

    Llama 4:         1 + attn_scale * ln(1 + floor((p + 1) / floor_scale))
    Ministral 3 /
    Mistral 4:       1 + beta * ln(1 + floor(p / original_max_position_embeddings))

They differ by one position (Llama 4 counts p + 1 tokens, Mistral p), so Llama 4's first step
is at p = floor_scale - 1 and Mistral's at p = original_max_position_embeddings.

This is separate from RoPE and from a scaling's ``attention_factor``, which is one constant for
all positions. A temperature is a pure function of position; :class:`QueryTemperature` objects
describe one by its scalar parameters (reading them from a config is :mod:`posemb.hf`'s job),
and :class:`posemb.PositionalAttention` applies one to its queries.

Precision. The floor is an integer division of integer positions, exact for every position;
the logarithm is taken in float64 and the result rounded once to the requested dtype.
``transformers`` forms these factors in float32, so its values differ from posemb's float64
ones by float32 rounding (~6e-8 relative).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from . import _checks
from ._errors import InputError
from .freqs import _angle_device

F64 = torch.float64


def _check_not_negative(pos: torch.Tensor, what: str) -> None:
    # A negative position floors to a negative step and the logarithm to -inf or NaN. Checked
    # in eager mode only: the check reads the values on the host, which a traced graph cannot.
    if torch.compiler.is_compiling() or not pos.numel():
        return
    lowest = int(pos.min())
    if lowest < 0:
        raise InputError(
            f"{what} is defined for positions >= 0 (token indices), got position {lowest}"
        )


def _log_of_floored_position(
    positions: object, *, shift: int, length: int, scale: float, dtype: torch.dtype, what: str
) -> torch.Tensor:
    """1 + scale * ln(1 + floor((p + shift) / length)), in float64, cast once to ``dtype``."""
    _checks.float_dtype("dtype", dtype)
    pos = _checks.positions(positions)
    _check_not_negative(pos, what)
    # Integer floor division: exact at every position, unlike a float32 quotient, which rounds
    # n - 1/length up to n once positions pass 2^24.
    steps = torch.div(pos.to(torch.int64) + shift, length, rounding_mode="floor")
    dev = _angle_device(pos.device)
    factor = 1.0 + scale * torch.log1p(steps.to(device=dev, dtype=F64))
    return factor.to(device=pos.device, dtype=dtype)


def llama4_attn_temperature(
    positions: torch.Tensor | list[int] | int,
    *,
    floor_scale: int,
    attn_scale: float,
    dtype: torch.dtype = F64,
) -> torch.Tensor:
    """Llama 4's attention temperature: 1 + attn_scale * ln(1 + floor((p + 1) / floor_scale)).

    Meta's Llama 4 release (``llama-models``, ``models/llama4/model.py``, ``Attention.forward``)
    and ``transformers``' ``Llama4TextAttention.forward`` (``modeling_llama4.py``) multiply the
    queries of the NoPE layers only (``no_rope_layers[i] == 0``) by this factor, when
    ``attn_temperature_tuning`` is true. Llama 4 Scout and Maverick use floor_scale = 8192 and
    attn_scale = 0.1 (the ``transformers`` defaults).

    The factor is exactly 1 for p < floor_scale - 1 and steps up when p + 1 reaches each
    multiple of floor_scale.

    Both implementations take p = start + arange(seq), the index of the token in the sequence
    including the cached ones, not the ``position_ids`` given to RoPE; the two agree unless
    positions are shifted (left padding, packed sequences).

    Args:
        positions: non-negative integer positions, any shape ``P`` (or an int / list of ints).
        floor_scale: the step length in tokens; a positive integer.
        attn_scale: the strength, >= 0 (0 gives factor 1 everywhere).
        dtype: output dtype; computed in float64 and rounded once.

    Returns:
        Tensor of shape ``P`` and dtype ``dtype`` on ``positions``' device: the factor on the
        queries at each position.
    """
    floor_scale = _checks.positive_int("floor_scale", floor_scale)
    attn_scale = _checks.number("attn_scale", attn_scale, minimum=0.0)
    return _log_of_floored_position(
        positions,
        shift=1,
        length=floor_scale,
        scale=attn_scale,
        dtype=dtype,
        what="llama4_attn_temperature",
    )


def llama4_scaling_beta_temperature(
    positions: torch.Tensor | list[int] | int,
    *,
    beta: float,
    original_max_position_embeddings: int,
    dtype: torch.dtype = F64,
) -> torch.Tensor:
    """Mistral's "Llama 4 scaling": 1 + beta * ln(1 + floor(p / original_max_position_embeddings)).

    Mistral's Ministral 3 / Devstral 2 and Mistral 4 models (``transformers``'
    ``get_llama_4_attn_scale`` in ``models/ministral3/modeling_ministral3.py``, reused by
    ``models/mistral4/modeling_mistral4.py``; vLLM's ``_get_llama_4_scaling``) multiply the
    queries of every layer by this factor, after RoPE. Their configs carry beta as
    ``rope_parameters["llama_4_scaling_beta"]`` and the length as
    ``rope_parameters["original_max_position_embeddings"]``, the YaRN scaling's original length
    (Mistral's own ``params.json`` has both under ``llama_4_scaling``).

    The factor is exactly 1 for p < original_max_position_embeddings and steps up at each of
    its multiples: one position later than :func:`llama4_attn_temperature` with the same length.
    The positions are the ``position_ids`` given to RoPE.

    Args:
        positions: non-negative integer positions, any shape ``P`` (or an int / list of ints).
        beta: the strength, >= 0 (published configs use 0.1, and 0.0 to switch it off).
        original_max_position_embeddings: the step length in tokens; a positive integer.
        dtype: output dtype; computed in float64 and rounded once.

    Returns:
        Tensor of shape ``P`` and dtype ``dtype`` on ``positions``' device: the factor on the
        queries at each position.
    """
    beta = _checks.number("beta", beta, minimum=0.0)
    length = _checks.positive_int(
        "original_max_position_embeddings", original_max_position_embeddings
    )
    return _log_of_floored_position(
        positions,
        shift=0,
        length=length,
        scale=beta,
        dtype=dtype,
        what="llama4_scaling_beta_temperature",
    )


@dataclass(frozen=True)
class QueryTemperature:
    """Base class: a factor on the queries that depends on each query's position.

    Subclasses are frozen dataclasses of scalars, validated at construction, whose ``kind`` is
    the config key that switches them on.
    """

    kind: ClassVar[str] = ""

    def factor(
        self, positions: torch.Tensor | list[int] | int, dtype: torch.dtype = F64
    ) -> torch.Tensor:
        """The factor on the queries at ``positions`` (any shape ``P``): a tensor of shape ``P``."""
        raise NotImplementedError

    def formula(self) -> str:
        """The factor as a formula in the position p, with this object's numbers."""
        raise NotImplementedError


@dataclass(frozen=True)
class Llama4AttnTemperature(QueryTemperature):
    """Llama 4's temperature, :func:`llama4_attn_temperature`, for the NoPE layers.

    Args:
        floor_scale: positive integer step length (``transformers`` default 8192).
        attn_scale: strength >= 0 (default 0.1).
    """

    kind: ClassVar[str] = "attn_temperature_tuning"
    floor_scale: int = 8192
    attn_scale: float = 0.1

    def __post_init__(self) -> None:
        _checks.positive_int("Llama4AttnTemperature.floor_scale", self.floor_scale)
        _checks.number("Llama4AttnTemperature.attn_scale", self.attn_scale, minimum=0.0)

    def factor(
        self, positions: torch.Tensor | list[int] | int, dtype: torch.dtype = F64
    ) -> torch.Tensor:
        return llama4_attn_temperature(
            positions, floor_scale=self.floor_scale, attn_scale=self.attn_scale, dtype=dtype
        )

    def formula(self) -> str:
        return f"1 + {self.attn_scale:g} * ln(1 + floor((p + 1) / {self.floor_scale}))"


@dataclass(frozen=True)
class Llama4ScalingBetaTemperature(QueryTemperature):
    """Mistral's temperature, :func:`llama4_scaling_beta_temperature`, for every layer.

    Args:
        beta: strength >= 0 (``rope_parameters["llama_4_scaling_beta"]``).
        original_max_position_embeddings: positive integer step length
            (``rope_parameters["original_max_position_embeddings"]``).
    """

    kind: ClassVar[str] = "llama_4_scaling_beta"
    beta: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        _checks.number("Llama4ScalingBetaTemperature.beta", self.beta, minimum=0.0)
        _checks.positive_int(
            "Llama4ScalingBetaTemperature.original_max_position_embeddings",
            self.original_max_position_embeddings,
        )

    def factor(
        self, positions: torch.Tensor | list[int] | int, dtype: torch.dtype = F64
    ) -> torch.Tensor:
        return llama4_scaling_beta_temperature(
            positions,
            beta=self.beta,
            original_max_position_embeddings=self.original_max_position_embeddings,
            dtype=dtype,
        )

    def formula(self) -> str:
        return f"1 + {self.beta:g} * ln(1 + floor(p / {self.original_max_position_embeddings}))"


def ssmax_factor(visible: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Scalable-Softmax's factor on the queries (Nakanishi 2025, "Scalable-Softmax Is Superior
    for Attention", arXiv:2501.19399, section 2): SSMax(z) = softmax(s * ln(n) * z), so each
    query's logits are multiplied by ``s * ln(n)``, where n is the number of keys that query
    attends over (its softmax's input size) and s a scalar learned per layer and head.

    Unlike the temperatures above it is not floored and not 1 over the training length: it
    grows from 0 at n = 1 (one key, whose weight is 1 whatever the logit) with every key.

    Args:
        visible: ``(batch, q_len)`` or ``(q_len,)`` counts n >= 1 of the keys each query sees.
        s: ``(heads,)`` scales.

    Returns:
        ``(batch, heads, q_len)`` (batch 1 for 1-D counts) in float32 (float64 for float64
        ``s``).
    """
    sc = _checks.float_tensor("s", s)
    if sc.dim() != 1:
        raise InputError(f"s must have shape (heads,), got {tuple(sc.shape)}")
    n = torch.as_tensor(visible)
    if n.dim() == 1:
        n = n[None]
    if n.dim() != 2:
        raise InputError(
            f"visible must have shape (q_len,) or (batch, q_len), got {tuple(n.shape)}"
        )
    dt = _checks.compute_dtype(sc)
    # n = 0 (a query that sees nothing) gives ln 0 = -inf: such a row is zeroed downstream,
    # and a factor of 0 keeps it finite meanwhile.
    log_n = torch.log(n.to(device=sc.device, dtype=dt).clamp(min=1.0))
    return sc.to(dt)[None, :, None] * log_n[:, None, :]


class ScalableSoftmax(torch.nn.Module):
    """SSMax as a module: a learned ``s`` per head (:func:`ssmax_factor`), for
    :class:`posemb.PositionalAttention`'s ``query_temperature``.

    :class:`~posemb.PositionalAttention` counts the keys each query sees (causality and
    padding included) and multiplies the query by ``s_h * ln(n)`` after any rotation, so every
    content logit of that query is scaled (an added bias is not). The paper's Figure 1
    illustrates s = 0.43, posemb's default initial value; with it a query over 64 keys has its
    logits multiplied by 1.79, over 1024 by 2.98.

    Args:
        num_heads: heads.
        init_s: the initial s of every head (> 0).
        learnable: False keeps s fixed (a buffer).
    """

    def __init__(self, num_heads: int, init_s: float = 0.43, learnable: bool = True) -> None:
        super().__init__()
        self.num_heads = _checks.positive_int("num_heads", num_heads)
        value = _checks.number("init_s", init_s, minimum=0.0, strict=True)
        if not isinstance(learnable, bool):
            raise InputError(f"learnable must be True or False, got {learnable!r}")
        s = torch.full((self.num_heads,), value)
        if learnable:
            self.s = torch.nn.Parameter(s)
        else:
            self.register_buffer("s", s)

    def factor(self, visible: torch.Tensor) -> torch.Tensor:
        """``(batch, heads, q_len)`` factors for ``visible`` ``(batch, q_len)`` key counts."""
        return ssmax_factor(visible, self.s)

    def formula(self) -> str:
        """The factor as a formula in n, the number of keys a query sees."""
        return "s_h * ln(n)"

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, learnable={isinstance(self.s, torch.nn.Parameter)}"


TEMPERATURES: dict[str, type[QueryTemperature]] = {
    cls.kind: cls for cls in (Llama4AttnTemperature, Llama4ScalingBetaTemperature)
}


def check(temperature: object) -> QueryTemperature | ScalableSoftmax | None:
    """Return ``temperature`` if it is None, a :class:`QueryTemperature` or a
    :class:`ScalableSoftmax`, else raise."""
    if temperature is None or isinstance(temperature, (QueryTemperature, ScalableSoftmax)):
        return temperature
    names = ", ".join([*(cls.__name__ for cls in TEMPERATURES.values()), "ScalableSoftmax"])
    raise InputError(
        f"query_temperature must be a posemb.temperature object ({names}) or None, "
        f"got {type(temperature).__name__}"
    )


__all__ = [
    "TEMPERATURES",
    "Llama4AttnTemperature",
    "Llama4ScalingBetaTemperature",
    "QueryTemperature",
    "ScalableSoftmax",
    "check",
    "llama4_attn_temperature",
    "llama4_scaling_beta_temperature",
    "ssmax_factor",
]
