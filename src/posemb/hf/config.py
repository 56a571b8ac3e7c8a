"""Reading Hugging Face configs: the RoPE a config describes and its attention shape.

The only place in posemb that reads model configs. It accepts a ``transformers`` config object
or a plain ``config.json`` dict, in the 5.x form (``rope_parameters`` holding ``rope_type``,
``rope_theta``, ...) and the 4.x form (``rope_scaling`` with ``type``/``rope_type`` beside a
top-level ``rope_theta``), with ``head_dim`` (or ``hidden_size / num_attention_heads``),
``partial_rotary_factor`` and ``max_position_embeddings``; :func:`attention_shape` also reads
Meta's ``params.json``. Where the reading deliberately differs from ``transformers`` is listed
in :mod:`posemb.hf`.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from .. import _checks
from .. import scaling as sc
from ..rope import Layout, RotaryEmbedding

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")
DEFAULT_THETA = 10000.0  # transformers' default_theta when a config names none


@dataclass(frozen=True)
class RopeSpec:
    """Everything posemb needs from a config to build its rotary embedding.

    Attributes:
        rope_type: one of :data:`ROPE_TYPES`.
        head_dim: channels per attention head.
        rotary_dim: channels that rotate (``head_dim`` for proportional RoPE).
        base: ``rope_theta``.
        scaling: the RoPE scaling.
        max_position_embeddings: as configured (None if absent).
        original_context: the length the model was pre-trained at, when the config says
            (``original_max_position_embeddings``, else ``max_position_embeddings``).
    """

    rope_type: str
    head_dim: int
    rotary_dim: int
    base: float
    scaling: sc.RopeScaling
    max_position_embeddings: int | None
    original_context: int | None


def load_config(path: str | os.PathLike[str]) -> dict[str, object]:
    """Read a ``config.json`` (or Meta ``params.json``) as a dict; clear errors for bad files."""
    p = pathlib.Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"config file {str(p)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"config file {str(p)!r} cannot be read as UTF-8 text: {err}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"config file {str(p)!r} is not valid JSON (line {err.lineno}, column {err.colno}: "
            f"{err.msg}); a truncated download looks like this"
        ) from None
    if not isinstance(data, dict):
        raise ValueError(
            f"config file {str(p)!r} must hold a JSON object, got {type(data).__name__}"
        )
    return data


def _as_dict(config: object) -> dict[str, object]:
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    raise ValueError(
        "config must be a transformers config or a dict from config.json, "
        f"got {type(config).__name__}"
    )


_num = _checks.number
_int = _checks.positive_int


def _is_nested(params: object) -> bool:
    """True for a rope dict keyed by layer type (its values are dicts or null)."""
    return (
        isinstance(params, dict)
        and bool(params)
        and all(isinstance(v, dict) or v is None for v in params.values())
    )


def _raw_rope_params(d: dict[str, object]) -> tuple[str, dict[str, object]]:
    """The config's rope dict as written (maybe keyed by layer type) and its key, for errors."""
    if d.get("rope_parameters"):
        src, params = "rope_parameters", d["rope_parameters"]
    elif d.get("rope_scaling"):
        src, params = "rope_scaling", d["rope_scaling"]
    else:
        src, params = "rope_parameters", {}
    if not isinstance(params, dict):
        raise ValueError(f"{src} must be a JSON object, got {params!r}")
    return src, params


def _rope_params(d: dict[str, object], layer_type: str | None) -> tuple[str, dict[str, object]]:
    """The rope dict of one layer type and the name to quote in errors."""
    src, params = _raw_rope_params(d)
    if _is_nested(params):
        kinds = ", ".join(repr(k) for k in params)
        if layer_type is None:
            raise ValueError(f"{src} is given per layer type ({kinds}); pass layer_type")
        if layer_type not in params:
            raise ValueError(f"layer_type {layer_type!r} is not in {src}; allowed: {kinds}")
        entry = params[layer_type]
        if not isinstance(entry, dict):
            raise ValueError(f"{src}[{layer_type!r}] is null: that layer type has no RoPE")
        return f"{src}[{layer_type!r}]", dict(entry)
    if layer_type is not None:
        raise ValueError(f"layer_type {layer_type!r} given, but {src} is not per layer type")
    return src, dict(params)


def rope_layer_types(config: object) -> tuple[str, ...] | None:
    """The layer types a config gives RoPE to, or None when one RoPE serves every layer.

    Args:
        config: a ``transformers`` config object or a ``config.json`` dict.

    Returns:
        For a rope dict keyed by layer type (Gemma 3 style), its keys whose value is not null,
        in the config's order; None for a plain rope dict (or none at all).
    """
    _, params = _raw_rope_params(_as_dict(config))
    if not _is_nested(params):
        return None
    return tuple(k for k, v in params.items() if v is not None)


def rope_spec(config: object, layer_type: str | None = None) -> RopeSpec:
    """Read the RoPE description out of a config.

    Args:
        config: a ``transformers`` config object or a ``config.json`` dict (4.x or 5.x form).
        layer_type: for configs with per-layer-type RoPE (Gemma 3 style), which one.

    Returns:
        A validated :class:`RopeSpec`.
    """
    d = _as_dict(config)
    src, p = _rope_params(d, layer_type)
    rope_type = p.get("rope_type") or p.get("type") or "default"
    if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"{src}['rope_type'] is {rope_type!r}; known rope types: {', '.join(ROPE_TYPES)}"
        )
    theta = p.get("rope_theta", d.get("rope_theta"))
    base = (
        DEFAULT_THETA
        if theta is None
        else _num(f"{src}['rope_theta']", theta, minimum=1, strict=True)
    )

    head_dim = d.get("head_dim")
    if head_dim is None:
        hidden, heads = d.get("hidden_size"), d.get("num_attention_heads")
        if hidden is None or heads is None:
            raise ValueError("config needs head_dim, or hidden_size and num_attention_heads")
        head_dim = _int("hidden_size", hidden) // _int("num_attention_heads", heads)
    head_dim = _int("head_dim", head_dim)
    partial = p.get("partial_rotary_factor", d.get("partial_rotary_factor"))
    # 0 is meaningful for proportional RoPE (no pair rotates); elsewhere the rotary-dimension
    # check below rejects it.
    partial = 1.0 if partial is None else _num("partial_rotary_factor", partial, minimum=0)
    if partial > 1:
        raise ValueError(f"partial_rotary_factor must be in [0, 1], got {partial!r}")
    rotary_dim = head_dim if rope_type == "proportional" else int(head_dim * partial)
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(
            f"rotary dimension int(head_dim * partial_rotary_factor) = {rotary_dim} must be even "
            f"and >= 2 (head_dim={head_dim}, partial_rotary_factor={partial})"
        )

    max_pos = d.get("max_position_embeddings")
    if max_pos is not None:
        max_pos = _int("max_position_embeddings", max_pos)
    raw_orig = d.get("original_max_position_embeddings")
    if raw_orig is None:
        raw_orig = p.get("original_max_position_embeddings")
    orig = None if raw_orig is None else _int("original_max_position_embeddings", raw_orig)
    if rope_type in ("yarn", "llama3", "longrope") and orig is None:
        raise ValueError(
            f"{src}['original_max_position_embeddings'] is missing: rope_type {rope_type!r} needs "
            f"the pre-training context length (a positive integer)"
        )
    original = orig or 0  # set wherever it is read: the check above

    def factor(required: bool = True, default: float = 1.0) -> float:
        f = p.get("factor")
        if f is None:
            if required:
                raise ValueError(
                    f"{src}['factor'] is missing: rope_type {rope_type!r} needs a number >= 1"
                )
            return default
        return _num(f"{src}['factor']", f, minimum=1)

    def opt(key: str) -> float | None:
        v = p.get(key)
        return None if v is None else _num(f"{src}[{key!r}]", v, minimum=0)

    try:
        scaling: sc.RopeScaling
        if rope_type == "default":
            scaling = sc.Default()
        elif rope_type == "linear":
            scaling = sc.Linear(factor())
        elif rope_type == "dynamic":
            if max_pos is None:
                raise ValueError(
                    "max_position_embeddings is missing: rope_type 'dynamic' scales from it"
                )
            scaling = sc.DynamicNTK(factor(), max_pos)
        elif rope_type == "yarn":
            truncate = p.get("truncate", True)
            if not isinstance(truncate, bool):
                raise ValueError(f"{src}['truncate'] must be true or false, got {truncate!r}")
            scaling = sc.Yarn(
                factor(),
                original,
                # transformers reads a null or 0 beta as its default (32 / 1).
                beta_fast=opt("beta_fast") or 32.0,
                beta_slow=opt("beta_slow") or 1.0,
                mscale=opt("mscale"),
                mscale_all_dim=opt("mscale_all_dim"),
                attention_factor=opt("attention_factor"),
                truncate=truncate,
            )
        elif rope_type == "llama3":
            for key in ("low_freq_factor", "high_freq_factor"):
                if p.get(key) is None:
                    raise ValueError(f"{src}[{key!r}] is missing: rope_type 'llama3' needs it")
            scaling = sc.Llama3(
                factor(),
                _num(f"{src}['low_freq_factor']", p["low_freq_factor"], minimum=0, strict=True),
                _num(f"{src}['high_freq_factor']", p["high_freq_factor"], minimum=0, strict=True),
                original,
            )
        elif rope_type == "longrope":
            lists: dict[str, tuple[float, ...]] = {}
            for key in ("short_factor", "long_factor"):
                v = p.get(key)
                if isinstance(v, list) and len(v) == rotary_dim // 2:
                    lists[key] = tuple(
                        _num(f"{src}[{key!r}][{i}]", x, minimum=0, strict=True)
                        for i, x in enumerate(v)
                    )
                else:
                    got = f"{len(v)} entries" if isinstance(v, list) else repr(v)
                    raise ValueError(
                        f"{src}[{key!r}] must be a list of rotary_dim/2 = {rotary_dim // 2} "
                        f"numbers, got {got}"
                    )
            derived = None if max_pos is None else max_pos / original
            if p.get("factor") is None and derived is None:
                raise ValueError(
                    f"{src}['factor'] is missing and max_position_embeddings too: rope_type "
                    f"'longrope' needs one of them"
                )
            scaling = sc.LongRope(
                lists["short_factor"],
                lists["long_factor"],
                original,
                factor=max(factor(required=False, default=derived or 1.0), 1.0),
                attention_factor=opt("attention_factor"),
            )
        else:  # proportional
            scaling = sc.Proportional(partial, factor(required=False, default=1.0))
    except ValueError as err:
        msg = str(err)
        raise ValueError(msg if msg.startswith(src) else f"{src}: {msg}") from None

    return RopeSpec(
        rope_type=rope_type,
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        base=base,
        scaling=scaling,
        max_position_embeddings=max_pos,
        original_context=orig if orig is not None else max_pos,
    )


def frequencies_from_config(
    config: object, seq_len: int | None = None, layer_type: str | None = None
) -> tuple[torch.Tensor, float]:
    """``(inv_freq, attention_factor)`` for a config, as ``transformers``' rope init computes.

    Args:
        config: a ``transformers`` config object or a ``config.json`` dict.
        seq_len: current sequence length, for dynamic and longrope.
        layer_type: for per-layer-type configs.

    Returns:
        float64 tensor ``(rotary_dim // 2,)`` and the factor on cos and sin.
    """
    spec = rope_spec(config, layer_type)
    if seq_len is not None:
        _int("seq_len", seq_len)
    return spec.scaling.compute(spec.rotary_dim, spec.base, seq_len)


def rotary_from_config(config: object, layer_type: str | None = None) -> RotaryEmbedding:
    """A :class:`RotaryEmbedding` (HALF layout, as Hugging Face weights are) for a config."""
    spec = rope_spec(config, layer_type)
    return RotaryEmbedding(
        spec.head_dim,
        base=spec.base,
        rotary_dim=spec.rotary_dim,
        layout=Layout.HALF,
        scaling=spec.scaling,
    )


@dataclass(frozen=True)
class AttentionShape:
    """Head counts and dimensions of q/k projections, read from a config."""

    num_heads: int
    num_kv_heads: int
    head_dim: int | None
    rotary_dim: int | None


def attention_shape(config: object) -> AttentionShape:
    """Read head counts from a Hugging Face ``config.json`` or a Meta ``params.json``.

    Args:
        config: config object or dict. HF keys: ``num_attention_heads``, ``num_key_value_heads``
            (default: as many as q), ``head_dim``/``partial_rotary_factor``; Meta keys:
            ``n_heads``, ``n_kv_heads``.

    Returns:
        The :class:`AttentionShape`; ``head_dim``/``rotary_dim`` are None when not derivable.
    """
    d = _as_dict(config)
    heads = d.get("num_attention_heads", d.get("n_heads"))
    if heads is None:
        raise ValueError("config has neither num_attention_heads nor n_heads")
    heads = _int("num_attention_heads", heads)
    kv = d.get("num_key_value_heads", d.get("n_kv_heads"))
    kv = heads if kv is None else _int("num_key_value_heads", kv)
    head_dim = rotary = None
    if d.get("head_dim") is not None or d.get("hidden_size") is not None:
        # A Hugging Face config: its RoPE description must be valid to say what rotates.
        spec = rope_spec(d)
        head_dim, rotary = spec.head_dim, spec.rotary_dim
    elif d.get("dim") is not None:  # Meta's params.json: every channel of a head rotates
        dim = _int("dim", d["dim"])
        if dim % heads:
            raise ValueError(f"dim {dim} is not divisible by n_heads {heads}")
        head_dim = dim // heads
    return AttentionShape(heads, kv, head_dim, rotary)


__all__ = [
    "DEFAULT_THETA",
    "ROPE_TYPES",
    "AttentionShape",
    "RopeSpec",
    "attention_shape",
    "frequencies_from_config",
    "load_config",
    "rope_layer_types",
    "rope_spec",
    "rotary_from_config",
]
