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

import copy
import os
import pathlib
from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch

from .. import _checks, _extras, _io
from .. import temperature as _temperature
from .._errors import InputError
from ..rope import RotaryEmbedding
from ..temperature import QueryTemperature
from . import rope_types, upstream
from .families import Family, family_for
from .kind import Missing, check_keys, read_kind
from .rope_types import ROPE_KEYS, ROPE_TYPES
from .spec import LayerKind, ModelRope, RopeSpec

DEFAULT_THETA = 10000.0  # transformers' default_theta; posemb never assumes it (see rope_spec)

_TEXT_KEYS = ("text_config", "llm_config", "language_config")


def load_config(path: str | os.PathLike[str]) -> dict[str, object]:
    """Read a ``config.json`` (or Meta ``params.json``) as a dict; clear errors for bad files."""
    p = pathlib.Path(path)
    data = _io.read_json(p, "config file")
    if not isinstance(data, dict):
        raise InputError(
            f"config file {str(p)!r} must hold a JSON object, got {type(data).__name__}"
        )
    return data


def _as_dict(config: object) -> dict[str, object]:
    """The config as a dict of its own, its counts and lengths checked (the door every reader
    goes through: absurd sizes are refused before anything is built from them)."""
    # A deep copy: reading (and transformers, when it fills defaults) must never change the
    # caller's dict.
    if isinstance(config, Mapping):
        d = copy.deepcopy(dict(config))
        _checks.config_sizes(d)
        return d
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        d = copy.deepcopy(dict(to_dict()))
        _checks.config_sizes(d)
        return d
    raise InputError(
        "config must be a transformers config or a dict from config.json, "
        f"got {type(config).__name__}"
    )


_num = _checks.number
_int = _checks.positive_int


def _text_part(d: dict[str, object]) -> tuple[dict[str, object], str]:
    """The text model's settings: a nested ``text_config``-like dict when there is one."""
    for key in _TEXT_KEYS:
        sub = d.get(key)
        if sub is not None and not isinstance(sub, dict):
            raise InputError(f"{key} must be a JSON object (the text model's config), got {sub!r}")
        if sub:
            return sub, key
    return d, ""


def _model_type(d: dict[str, object], text: dict[str, object]) -> str | None:
    for where, cfg in (("text config", text), ("config", d)):
        mt = cfg.get("model_type")
        if mt is not None and not isinstance(mt, str):
            raise InputError(f"model_type in the {where} must be a string, got {mt!r}")
    mt = text.get("model_type", d.get("model_type"))
    return mt if isinstance(mt, str) else None


def _rope_dict(text: dict[str, object]) -> tuple[str, dict[str, object], list[str]]:
    """The rope dict as written, the key it came from, and notes about the choice."""
    notes: list[str] = []
    found: dict[str, dict[str, object]] = {}
    for name in ("rope_parameters", "rope_scaling"):
        v = text.get(name)
        if v is not None and not isinstance(v, dict):
            raise InputError(f"{name} must be a JSON object or null, got {v!r}")
        if v:
            found[name] = dict(v)
    if len(found) == 2 and found["rope_scaling"] != found["rope_parameters"]:
        # transformers' convert_rope_params_to_dict: rope_scaling wins when both are set.
        notes.append("both rope_scaling and rope_parameters are set; rope_scaling is read")
    for name in ("rope_scaling", "rope_parameters"):
        if name in found:
            return name, found[name], notes
    return "rope_parameters", {}, notes


def _is_nested(params: dict[str, object], layer_types: list[str] | None) -> bool:
    """True for a rope dict keyed by layer type (its values are dicts or null).

    One key in ``layer_types`` is enough: transformers' Gemma 3 and OLMo 3 classes fill an
    entry for both layer types, and a model with fewer layers than the sliding pattern
    (``Gemma3TextConfig(num_hidden_layers=2)``) lists only ``sliding_attention``; the entry of
    a layer type no layer has is unused, as it is in transformers."""
    if not params or not all(isinstance(v, dict) or v is None for v in params.values()):
        return False
    return layer_types is None or any(k in layer_types for k in params)


def _kinds(
    text: dict[str, object], fam: Family, params: dict[str, object], nested: bool
) -> list[tuple[str | None, tuple[int, ...]]]:
    """The layer kinds of a config in order of first use, with their layer indices."""
    if fam.layer_kinds_from_no_rope:
        flags = text.get("no_rope_layers")
        if not flags:
            # Llama4TextConfig builds the pattern from no_rope_layer_interval when the list
            # is null or empty, as Llama 4's published configs leave it.
            raise Missing("no_rope_layers")
        if not isinstance(flags, list) or not all(f in (0, 1) for f in flags):
            raise InputError(f"no_rope_layers must be a list of 0/1 per layer, got {flags!r}")
        layers = text.get("num_hidden_layers")
        if layers is not None and len(flags) != layers:
            raise InputError(
                f"no_rope_layers has {len(flags)} entries, but num_hidden_layers is {layers}: "
                f"one 0/1 flag per layer"
            )
        rope = tuple(i for i, f in enumerate(flags) if f)
        nope = tuple(i for i, f in enumerate(flags) if not f)
        return [(n, ix) for n, ix in (("rope", rope), ("nope", nope)) if ix]
    lt = text.get("layer_types")
    if lt is not None:
        if not isinstance(lt, list) or not lt or not all(isinstance(t, str) and t for t in lt):
            raise InputError(f"layer_types must be a non-empty list of names, got {lt!r}")
        layers = text.get("num_hidden_layers")
        if isinstance(layers, int) and len(lt) != layers:
            raise InputError(
                f"layer_types has {len(lt)} entries, but num_hidden_layers is {layers}: one "
                f"layer type per layer"
            )
        order: dict[str, list[int]] = {}
        for i, t in enumerate(lt):
            order.setdefault(t, []).append(i)
        return [(t, tuple(ix)) for t, ix in order.items()]
    if nested:
        return [(t, ()) for t in params]
    return [(None, ())]


def _class_types(d: dict[str, object], text: dict[str, object]) -> frozenset[str]:
    """The model types whose config classes build the text config: its own and, for a
    composite, the outer one (Voxtral's class gives its Llama text config a head_dim of 128)."""
    return frozenset(t for t in (d.get("model_type"), text.get("model_type")) if isinstance(t, str))


def _attn_temperature(text: dict[str, object], fam: Family) -> QueryTemperature | None:
    """Llama 4's attention temperature of its NoPE layers, when its config turns it on."""
    if fam.temperature != "llama4":
        return None
    tuning = text.get("attn_temperature_tuning")
    if tuning is None:
        raise Missing("attn_temperature_tuning")
    if not isinstance(tuning, bool):
        raise InputError(f"attn_temperature_tuning must be true or false, got {tuning!r}")
    if not tuning:
        return None
    for key in ("floor_scale", "attn_scale"):
        if text.get(key) is None:
            raise Missing(key)
    return _temperature.Llama4AttnTemperature(
        _int("floor_scale", text["floor_scale"]),
        _num("attn_scale", text["attn_scale"], minimum=0),
    )


def _unrotated(
    name: str | None,
    layers: tuple[int, ...],
    fam: Family,
    force: bool,
    window: object,
    temperature: QueryTemperature | None,
) -> LayerKind | None:
    """The layer kind when the family rotates none of its layers (linear attention, EXAONE 4's
    global layers with a window, Llama 4's NoPE layers), else None."""
    if name is not None and name in fam.nope_layer_types:
        return LayerKind(name, None, layers, f"{name} layers have no attention RoPE")
    sliding_only = fam.rope_layers == "sliding_only" or (
        fam.rope_layers == "sliding_if_window" and window is not None
    )
    if name != "sliding_attention" and not force and sliding_only:
        why = "with a sliding window set, " if fam.rope_layers == "sliding_if_window" else ""
        return LayerKind(name, None, layers, f"{fam.name}: {why}only sliding layers rotate")
    if name == "nope" and fam.layer_kinds_from_no_rope:
        return LayerKind(name, None, layers, "no_rope_layers marks them NoPE", temperature)
    return None


def _layer_rules(
    text: dict[str, object],
    fam: Family,
    src: str,
    params: dict[str, object],
    *,
    nested: bool,
    splits: bool,
) -> tuple[object, bool]:
    """Check what a family with per-layer rules needs from the file before any layer is read;
    return its sliding window and whether its force-rope flag is set."""
    if (splits or fam.rope_layers != "all") and text.get("layer_types") is None:
        # Which layers are sliding comes from the class (Gemma 3's sliding_window_pattern,
        # EXAONE 4's LLLG); reading one RoPE for all would be wrong on some layers.
        raise Missing("layer_types")
    if fam.scaling_on is not None and not nested and src.endswith("rope_parameters") and params:
        raise InputError(
            f"{src} is a single rope dict, which {fam.name}'s config class does not apply to any "
            f"layer type; give it as rope_scaling (the {fam.scaling_on} layers' scaling) or per "
            f"layer type"
        )
    window = text.get("sliding_window")
    if fam.rope_layers != "all" and "sliding_window" not in text:
        raise Missing("sliding_window")
    force = False
    if fam.force_rope_key is not None:
        flag = text.get(fam.force_rope_key, False)
        if not isinstance(flag, bool):
            raise InputError(f"{fam.force_rope_key} must be true or false, got {flag!r}")
        force = flag
    return window, force


def _read(d: dict[str, object], strict: bool) -> ModelRope:
    """Read every layer kind; raises Missing for a key left to the class default."""
    text, where = _text_part(d)
    model_type = _model_type(d, text)
    fam = family_for(model_type, set(text))
    if fam.no_rope_unless is not None and text.get(fam.no_rope_unless):
        raise InputError(
            f"model_type {model_type!r} with {fam.no_rope_unless}: true uses no RoPE; there is "
            f"nothing to read"
        )
    src, params, notes = _rope_dict(text)
    prefix = f"{where}." if where else ""
    src = prefix + src
    lt = text.get("layer_types")
    nested = _is_nested(params, lt if isinstance(lt, list) else None)
    kinds_out: list[LayerKind] = []
    checked: set[int] = set()
    # The file's own layer list is checked before anything is left to the class defaults.
    kinds = _kinds(text, fam, params, nested)
    temperature = _attn_temperature(text, fam)
    splits = fam.scaling_on is not None or fam.local_theta_key is not None
    window, force = _layer_rules(text, fam, src, params, nested=nested, splits=splits)
    for name, layers in kinds:
        where_kind = src if not nested else f"{src}[{name!r}]"
        unrotated = _unrotated(name, layers, fam, force, window, temperature)
        if unrotated is not None:
            kinds_out.append(unrotated)
            continue
        if nested:
            entry = params.get(name) if name is not None else None
            if name not in params:
                if not splits:
                    # transformers builds tables only for the layer types the rope dict names;
                    # the others (LFM's conv blocks, Dory's MLP blocks) do not rotate.
                    kinds_out.append(LayerKind(name, None, layers, f"{src} has no entry for it"))
                    continue
                # Gemma 3 / OLMo 3 / ModernBERT classes fill a missing layer type with plain
                # RoPE at that layer type's base.
                entry = {"rope_type": "default"}
            elif entry is None:
                kinds_out.append(LayerKind(name, None, layers, f"{where_kind} is null"))
                continue
            p: dict[str, object] = dict(entry)  # type: ignore[call-overload]
        elif fam.scaling_on is not None and name not in (None, fam.scaling_on):
            # Gemma 3 / OLMo 3: a flat rope_scaling is the full-attention layers' scaling;
            # the other layers rotate plainly at their own base (configuration_gemma3.py,
            # configuration_olmo3.py), never at a base given inside rope_scaling.
            if params:
                rope_type = params.get("rope_type") or params.get("type") or "default"
                if isinstance(rope_type, str) and rope_type in ROPE_KEYS:
                    notes += check_keys(src, params, rope_type, fam, strict)
                checked.add(id(params))
            p = {"rope_type": "default"}
        else:
            p = params
        spec = read_kind(
            text, fam, model_type, where_kind, p, name, strict, checked, _class_types(d, text)
        )
        if p is params:
            checked.add(id(params))
        spec = replace(spec, notes=tuple(notes) + spec.notes)
        kinds_out.append(LayerKind(name, spec, layers))
    if not any(k.spec is not None for k in kinds_out):
        raise InputError(f"model_type {model_type!r}: no layer of this config uses RoPE")
    return ModelRope(model_type, fam.name, where, tuple(kinds_out))


def _resolve(d: dict[str, object], missing: str, model_type: str | None) -> dict[str, object]:
    """The config as ``transformers``' config class completes it, for a key the file omits."""
    what = f"model_type {model_type!r}" if model_type else "a config without model_type"
    try:
        import transformers
    except ImportError as err:
        if not _extras.is_missing(err, "transformers"):
            raise
        raise _extras.MissingExtra(
            f"{what} does not set {missing!r} and leaves it to the model class's default; "
            f"posemb does not guess it: add the key, or install transformers to read the "
            f"default (pip install 'posemb[hf]')"
        ) from None
    outer_type = d.get("model_type")
    if not isinstance(outer_type, str):
        raise InputError(
            f"{what} does not set {missing!r}, and without model_type no class default can be read"
        )
    if outer_type not in transformers.CONFIG_MAPPING:
        raise InputError(
            f"{what} does not set {missing!r}, and transformers {transformers.__version__} has no "
            f"config class for model_type {outer_type!r} to read its default from"
        )
    try:
        text = upstream.text_config(d)  # keys that say nothing about RoPE left out
        with upstream.quiet(transformers):
            out: dict[str, object] = dict(text.to_dict())
    except Exception as err:  # transformers refused the dict: said in one line, chained
        raise InputError(
            f"{what} does not set {missing!r}, and transformers {transformers.__version__} cannot "
            f"build its config to read the default ({upstream.one_line(err)})"
        ) from err
    out["__resolved_from__"] = type(text).__name__
    return out


def _mentions(d: object, key: str) -> bool:
    """True when ``key`` is set (not null) anywhere in a nested config dict."""
    if isinstance(d, dict):
        return any((k == key and v is not None) or _mentions(v, key) for k, v in d.items())
    return False


def model_rope(config: object, *, strict: bool = True) -> ModelRope:
    """Read what a config says about positions, layer kind by layer kind.

    Handles the text model's settings nested under ``text_config``/``llm_config``/
    ``language_config``, per-layer-type RoPE (``layer_types``, nested ``rope_parameters``,
    Gemma 3's ``rope_local_base_freq``, OLMo 3's full-attention-only YaRN, Llama 4's
    ``no_rope_layers``), the family keys of :mod:`posemb.hf.families` and legacy spellings.

    A key the file leaves to the model class's default (e.g. ``rope_theta`` in Gemma 3's
    published configs) is read through ``transformers``' config class when it is installed, and
    said in each spec's notes; without it the call raises. posemb never assumes a default base.

    Args:
        config: a ``transformers`` config object or a ``config.json`` dict.
        strict: a rope key that the rope type does not read raises (False: warns and notes it).

    Returns:
        The :class:`ModelRope`.
    """
    d = _as_dict(config)
    try:
        return _read(d, strict)
    except Missing as err:
        missing = err.key
    text, _ = _text_part(d)
    model_type = _model_type(d, text)
    filled = _resolve(d, missing, model_type)
    cls = str(filled.pop("__resolved_from__"))
    try:
        out = _read(filled, strict)
    except Missing as again:
        raise InputError(
            f"model_type {model_type!r}: {again.key!r} is missing even after transformers' "
            f"{cls} filled its defaults"
        ) from None
    # transformers falls back to max_position_embeddings for a missing original length; posemb
    # refuses that (see posemb.hf, difference 4), also when other keys came from the class.
    if not _mentions(d, "original_max_position_embeddings"):
        for k in out.kinds:
            if k.spec is not None and rope_types.TABLE[k.spec.rope_type].needs_original:
                raise InputError(
                    f"original_max_position_embeddings is missing: rope_type "
                    f"{k.spec.rope_type!r} needs the pre-training context length (a positive "
                    f"integer)"
                )
    note = f"{missing} not in the file: every value read from transformers' {cls} defaults"
    kinds = tuple(
        replace(k, spec=replace(k.spec, notes=(note, *k.spec.notes))) if k.spec else k
        for k in out.kinds
    )
    return replace(out, kinds=kinds, resolved_from=cls)


def rope_layer_types(config: object, *, strict: bool = True) -> tuple[str, ...] | None:
    """The layer types a config gives RoPE to, or None when one RoPE serves every layer.

    Args:
        config: a ``transformers`` config object or a ``config.json`` dict.
        strict: as in :func:`model_rope`.

    Returns:
        The layer kinds that rotate, in order of first use; None for a config without layer
        kinds (one rope dict, no ``layer_types``).
    """
    m = model_rope(config, strict=strict)
    if not m.per_layer_type:
        return None
    return tuple(k.layer_type for k in m.kinds if k.spec is not None and k.layer_type)


def rope_spec(config: object, layer_type: str | None = None, *, strict: bool = True) -> RopeSpec:
    """Read the RoPE of one kind of layer out of a config.

    Args:
        config: a ``transformers`` config object or a ``config.json`` dict (4.x or 5.x form).
        layer_type: for configs with layer kinds whose RoPE differs, which one (see
            :func:`rope_layer_types`); None when every rotating layer shares one.
        strict: as in :func:`model_rope`.

    Returns:
        A validated :class:`RopeSpec`.
    """
    kind = model_rope(config, strict=strict).kind(layer_type)
    if kind.spec is None:
        raise InputError(f"layer type {layer_type!r} has no RoPE: {kind.reason}")
    return kind.spec


def frequencies_from_config(
    config: object,
    seq_len: int | None = None,
    layer_type: str | None = None,
    *,
    strict: bool = True,
) -> tuple[torch.Tensor, float]:
    """``(inv_freq, attention_factor)`` for a config, as ``transformers``' rope init computes.

    Args:
        config: a ``transformers`` config object or a ``config.json`` dict.
        seq_len: current sequence length, for dynamic and longrope.
        layer_type: for per-layer-type configs.
        strict: as in :func:`model_rope`.

    Returns:
        float64 tensor ``(rotary_dim // 2,)`` and the factor on cos and sin.
    """
    spec = rope_spec(config, layer_type, strict=strict)
    if seq_len is not None:
        _int("seq_len", seq_len)
    return spec.scaling.compute(spec.rotary_dim, spec.base, seq_len)


def rotary_from_config(
    config: object, layer_type: str | None = None, *, strict: bool = True
) -> RotaryEmbedding:
    """A :class:`RotaryEmbedding` for a config, in the layout its checkpoints rotate in.

    ``head_dim`` of the module is the channels RoPE acts on (for multi-head latent attention the
    rotary part of the head, ``qk_rope_head_dim``). Multimodal RoPE (``mrope_section``) needs
    3D positions: use :func:`posemb.mrope` with the spec's section instead.
    """
    spec = rope_spec(config, layer_type, strict=strict)
    return RotaryEmbedding(
        spec.head_dim,
        base=spec.base,
        rotary_dim=spec.rotary_dim,
        layout=spec.layout,
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
        raise InputError("config has neither num_attention_heads nor n_heads")
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
            raise InputError(f"dim {dim} is not divisible by n_heads {heads}")
        head_dim = dim // heads
    return AttentionShape(heads, kv, head_dim, rotary)


__all__ = [
    "DEFAULT_THETA",
    "ROPE_KEYS",
    "ROPE_TYPES",
    "AttentionShape",
    "LayerKind",
    "ModelRope",
    "RopeSpec",
    "attention_shape",
    "frequencies_from_config",
    "load_config",
    "model_rope",
    "rope_layer_types",
    "rope_spec",
    "rotary_from_config",
]
