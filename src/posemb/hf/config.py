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
import difflib
import os
import pathlib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch

from .. import _checks, _extras, _io
from .. import scaling as sc
from .. import temperature as _temperature
from .._errors import InputError
from ..rope import Layout, RotaryEmbedding
from ..temperature import QueryTemperature
from . import rope_types
from .families import CLASS_HEAD_DIM, Family, family_for, partial_default
from .rope_types import ROPE_KEYS, ROPE_TYPES

DEFAULT_THETA = 10000.0  # transformers' default_theta; posemb never assumes it (see rope_spec)

_TEXT_KEYS = ("text_config", "llm_config", "language_config")


@dataclass(frozen=True)
class RopeSpec:
    """Everything posemb needs from a config to build the RoPE of one kind of layer.

    Attributes:
        rope_type: one of :data:`ROPE_TYPES` (legacy spellings resolved).
        head_dim: channels the RoPE acts on: the attention head, or its rotary part for
            multi-head latent attention (``qk_rope_head_dim``), or ``global_head_dim`` for the
            full-attention layers that have one.
        rotary_dim: channels that rotate (``head_dim`` for proportional RoPE).
        base: ``rope_theta`` (or the family's spelling of it).
        scaling: the RoPE scaling.
        max_position_embeddings: as configured (None if absent).
        original_context: the length the model was pre-trained at, when the config says
            (``original_max_position_embeddings``, else ``max_position_embeddings``).
        layout: the pairing the family's checkpoints rotate in.
        mrope_section: multimodal RoPE: frequency pairs per axis (temporal, height, width).
        mrope_interleaved: Qwen3-VL's interleaved assignment of pairs to axes.
        temperature: the position-dependent factor on the queries that the family applies
            beside RoPE (None: none).
        layer_type: the layer type this spec is for (None: every layer).
        model_type: the text config's ``model_type``.
        notes: what a reader should know: defaults taken from ``transformers``, values that
            change nothing, legacy spellings.
    """

    rope_type: str
    head_dim: int
    rotary_dim: int
    base: float
    scaling: sc.RopeScaling
    max_position_embeddings: int | None
    original_context: int | None
    layout: Layout = Layout.HALF
    mrope_section: tuple[int, int, int] | None = None
    mrope_interleaved: bool = False
    temperature: QueryTemperature | None = None
    layer_type: str | None = None
    model_type: str | None = None
    notes: tuple[str, ...] = ()

    def same_rope(self, other: RopeSpec) -> bool:
        """True when both describe the same rotation (ignoring layer type and notes)."""
        return replace(self, layer_type=None, notes=()) == replace(other, layer_type=None, notes=())


@dataclass(frozen=True)
class LayerKind:
    """One kind of layer and what it does with positions.

    Attributes:
        layer_type: the config's name for it (``layer_types`` entry; ``"rope"``/``"nope"`` for
            Llama 4's ``no_rope_layers``); None when one RoPE serves every layer.
        spec: its RoPE, or None for a layer that rotates nothing.
        layers: the indices of the layers of this kind (empty when the config does not list them).
        reason: why a layer kind rotates nothing.
        temperature: the query temperature of a kind without RoPE (Llama 4's NoPE layers).
    """

    layer_type: str | None
    spec: RopeSpec | None
    layers: tuple[int, ...] = ()
    reason: str = ""
    temperature: QueryTemperature | None = None


@dataclass(frozen=True)
class ModelRope:
    """What a whole config says about positions: its layer kinds, in order of first use.

    Attributes:
        model_type: the text config's ``model_type``.
        family: the rule that read it (a :class:`~posemb.hf.families.Family` name).
        text_config: where the text model's settings were read (``""`` for the top level,
            e.g. ``"text_config"``).
        kinds: the layer kinds.
        resolved_from: the ``transformers`` config class that filled keys the file leaves to
            the class defaults ("" when none were needed).
    """

    model_type: str | None
    family: str
    text_config: str
    kinds: tuple[LayerKind, ...]
    resolved_from: str = ""

    @property
    def per_layer_type(self) -> bool:
        """True when the config distinguishes layer kinds."""
        return not (len(self.kinds) == 1 and self.kinds[0].layer_type is None)

    def kind(self, layer_type: str | None) -> LayerKind:
        """The kind named ``layer_type``; None picks the single RoPE shared by every kind."""
        names = [k.layer_type for k in self.kinds]
        if not self.per_layer_type:
            if layer_type is not None:
                raise InputError(
                    f"layer_type {layer_type!r} given, but this config has one RoPE for every layer"
                )
            return self.kinds[0]
        if layer_type is None:
            with_rope = [k for k in self.kinds if k.spec is not None]
            specs = [k.spec for k in with_rope]
            first = specs[0] if specs else None
            if first is not None and all(s is not None and s.same_rope(first) for s in specs):
                return replace(with_rope[0], layer_type=None, spec=replace(first, layer_type=None))
            raise InputError(
                f"this config gives each layer type its own RoPE ({', '.join(map(repr, names))}); "
                f"pass layer_type"
            )
        for k in self.kinds:
            if k.layer_type == layer_type:
                return k
        raise InputError(
            f"layer_type {layer_type!r} is not a layer type of this config; allowed: "
            f"{', '.join(map(repr, names))}"
        )


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
    # A deep copy: reading (and transformers, when it fills defaults) must never change the
    # caller's dict.
    if isinstance(config, Mapping):
        return copy.deepcopy(dict(config))
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        return copy.deepcopy(dict(to_dict()))
    raise InputError(
        "config must be a transformers config or a dict from config.json, "
        f"got {type(config).__name__}"
    )


_num = _checks.number
_int = _checks.positive_int


class _Missing(Exception):
    """A key the file leaves to the model class's default (resolved through transformers)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


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
    """True for a rope dict keyed by layer type (its values are dicts or null)."""
    if not params or not all(isinstance(v, dict) or v is None for v in params.values()):
        return False
    return layer_types is None or all(k in layer_types for k in params)


def _kinds(
    text: dict[str, object], fam: Family, params: dict[str, object], nested: bool
) -> list[tuple[str | None, tuple[int, ...]]]:
    """The layer kinds of a config in order of first use, with their layer indices."""
    if fam.layer_kinds_from_no_rope:
        flags = text.get("no_rope_layers")
        if not flags:
            # Llama4TextConfig builds the pattern from no_rope_layer_interval when the list
            # is null or empty, as Llama 4's published configs leave it.
            raise _Missing("no_rope_layers")
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


def _check_keys(
    where: str, p: dict[str, object], rope_type: str, fam: Family, strict: bool
) -> list[str]:
    """Refuse (or, lenient, list) rope keys that the rope type does not read."""
    allowed = ROPE_KEYS[rope_type] | fam.rope_keys
    unknown = sorted(k for k in p if k not in allowed)
    if not unknown:
        return []
    if strict:
        k = unknown[0]
        close = difflib.get_close_matches(k, sorted(allowed), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise InputError(
            f"{where}[{k!r}] is not read by rope_type {rope_type!r}{hint}; allowed keys: "
            f"{', '.join(sorted(allowed))} (strict=False / --lenient ignores it with a warning)"
        )
    warnings.warn(
        f"{where}: ignored keys not read by rope_type {rope_type!r}: {', '.join(unknown)}",
        UserWarning,
        stacklevel=4,
    )
    return [f"ignored keys (lenient): {', '.join(unknown)}"]


def _head_dim(
    text: dict[str, object], fam: Family, layer_type: str | None, model_type: str | None
) -> tuple[int, str]:
    """Channels the RoPE acts on, and the key that said so."""
    if fam.rope_head_dim_key is not None:
        v = text.get(fam.rope_head_dim_key)
        if v is None:
            raise _Missing(fam.rope_head_dim_key)
        return _int(fam.rope_head_dim_key, v), fam.rope_head_dim_key
    if fam.global_head_dim_key is not None and layer_type == "full_attention":
        key = fam.global_head_dim_key
        if text.get(key) is None:
            raise _Missing(key)
        return _int(key, text[key]), key
    if text.get("head_dim") is not None:
        return _int("head_dim", text["head_dim"]), "head_dim"
    if model_type in CLASS_HEAD_DIM:
        raise _Missing("head_dim")  # its class's own default, read through the class
    hidden = text.get("hidden_size", text.get("n_embd"))
    heads = text.get("num_attention_heads", text.get("n_head"))
    if hidden is None:
        raise _Missing("head_dim")
    if heads is None:
        raise _Missing("num_attention_heads")
    return _int("hidden_size", hidden) // _int("num_attention_heads", heads), "hidden_size"


def _agree(key: str, value: object, generic: str, generic_value: object, fam: Family) -> None:
    """Refuse a generic key that the family's class ignores when it says something else."""
    if generic_value is None or generic_value == value:
        return
    said = "absent" if value is None else f"{value!r}"
    raise InputError(
        f"{generic} is {generic_value!r}, but {fam.name}'s config class reads {key} ({said}) and "
        f"ignores {generic}; give {key} the intended value (or make them agree)"
    )


def _read_kind(
    text: dict[str, object],
    fam: Family,
    model_type: str | None,
    src: str,
    p: dict[str, object] | None,
    layer_type: str | None,
    strict: bool,
    checked: set[int],
) -> RopeSpec:
    """One layer kind's RopeSpec from its rope dict ``p`` (as written) and the text config."""
    notes: list[str] = []
    p = dict(p or {})
    raw_type = p.get("rope_type") or p.get("type") or "default"
    legacy = p.get("type")
    aliases = fam.rope_type_aliases
    if (
        p.get("rope_type")
        and legacy
        and aliases.get(legacy, legacy) != aliases.get(p["rope_type"], p["rope_type"])  # type: ignore[call-overload]
    ):
        raise InputError(
            f"{src}['rope_type'] is {p['rope_type']!r} but {src}['type'] is {legacy!r}; "
            f"they must agree (or give only rope_type)"
        )
    if not isinstance(raw_type, str):
        raise InputError(f"{src}['rope_type'] must be a string, got {raw_type!r}")
    rope_type = fam.rope_type_aliases.get(raw_type, raw_type)
    if rope_type != raw_type:
        notes.append(f"legacy rope type {raw_type!r} read as {rope_type!r}")
    rope_type = rope_types.resolve(rope_type, p, model_type)
    row = rope_types.TABLE.get(rope_type)
    if row is None or (row.model_types is not None and model_type not in row.model_types):
        known = [n for n, t in rope_types.TABLE.items() if t.model_types is None]
        raise InputError(
            f"{src}['rope_type'] is {raw_type!r}; known rope types: {', '.join(known)}"
        )
    if row.note:
        notes.append(row.note)
    if id(p) not in checked:
        notes += _check_keys(src, p, rope_type, fam, strict)

    # The base: the rope dict, then the family's own spelling (which its class reads instead of
    # the generic one), the top level, a base fixed by the modeling code; never a silent default.
    local = fam.local_theta_key is not None and layer_type == "sliding_attention"
    theta = p.get("rope_theta")
    if theta is None and local:
        key = str(fam.local_theta_key)
        theta = text.get(key)
        if theta is None:
            raise _Missing(key)
    if theta is None and fam.theta_key is not None:
        theta = text.get(fam.theta_key)
        _agree(fam.theta_key, theta, "rope_theta", text.get("rope_theta"), fam)
        if theta is None:
            raise _Missing(fam.theta_key)
    if theta is None:
        theta = text.get("rope_theta")
    if theta is None and fam.fixed_theta is not None:
        theta = fam.fixed_theta
    # A missing base is resolved after the rest is checked, so that the file's own mistakes
    # are named first.
    base = None if theta is None else _num(f"{src}['rope_theta']", theta, minimum=1, strict=True)

    head_dim, _ = _head_dim(text, fam, layer_type, model_type)
    partial_raw = p.get("partial_rotary_factor")
    if partial_raw is None and fam.partial_key is not None:
        partial_raw = text.get(fam.partial_key)
        _agree(
            fam.partial_key,
            partial_raw,
            "partial_rotary_factor",
            text.get("partial_rotary_factor"),
            fam,
        )
    elif partial_raw is None:
        partial_raw = text.get("partial_rotary_factor")
    class_partial = partial_default(model_type, fam)
    # An explicit null is not an absent key: transformers then rotates the whole head (Phi-2
    # and StableLM 2 with "partial_rotary_factor": null), where a missing key gets the class's
    # default.
    places = (
        (p, "partial_rotary_factor"),
        (text, "partial_rotary_factor"),
        (text, fam.partial_key),
    )
    said_null = any(k is not None and k in where and where[k] is None for where, k in places)
    if partial_raw is None and class_partial is not None and said_null:
        notes.append(
            f"partial_rotary_factor is null: the whole head rotates, as in transformers 5.24 "
            f"(the {model_type!r} class default {class_partial} is for a file without the key)"
        )
    elif partial_raw is None and class_partial is not None:
        partial_raw = class_partial
        notes.append(
            f"partial_rotary_factor not set: the {model_type!r} class default {class_partial} "
            f"(as in transformers 5.24)"
        )
    # 0 is meaningful for proportional RoPE (no pair rotates); elsewhere the rotary-dimension
    # check below rejects it.
    partial = 1.0 if partial_raw is None else _num("partial_rotary_factor", partial_raw, minimum=0)
    if partial > 1:
        raise InputError(f"partial_rotary_factor must be in [0, 1], got {partial!r}")
    if fam.rotary_dim_key is not None:
        rd = text.get(fam.rotary_dim_key)
        if rd is None:
            raise InputError(
                f"{fam.rotary_dim_key} is null: transformers' {fam.tested_with.split(' ')[0]} then "
                f"forms frequencies over hidden_size, not the head; posemb does not read this"
            )
        rotary_dim = _int(fam.rotary_dim_key, rd)
        if rotary_dim > head_dim:
            raise InputError(
                f"{fam.rotary_dim_key} {rotary_dim} exceeds the head dimension {head_dim}"
            )
    elif rope_type == "proportional":
        rotary_dim = head_dim
    else:
        rotary_dim = int(head_dim * partial)
    if rotary_dim < 2 or rotary_dim % 2:
        raise InputError(
            f"rotary dimension int(head_dim * partial_rotary_factor) = {rotary_dim} must be even "
            f"and >= 2 (head_dim={head_dim}, partial_rotary_factor={partial})"
        )

    layout = fam.default_layout
    if fam.layout_key is not None and text.get(fam.layout_key) is not None:
        flag = text[fam.layout_key]
        if not isinstance(flag, bool):
            raise InputError(f"{fam.layout_key} must be true or false, got {flag!r}")
        layout = Layout.INTERLEAVED if flag else Layout.HALF

    max_pos = text.get("max_position_embeddings", text.get("n_positions"))
    if max_pos is not None:
        max_pos = _int("max_position_embeddings", max_pos)
    raw_orig = text.get("original_max_position_embeddings")
    if raw_orig is None:
        raw_orig = p.get("original_max_position_embeddings")
    orig = None if raw_orig is None else _int("original_max_position_embeddings", raw_orig)
    if row.needs_original and orig is None:
        raise InputError(
            f"{src}['original_max_position_embeddings'] is missing: rope_type {rope_type!r} needs "
            f"the pre-training context length (a positive integer)"
        )

    reading = rope_types.RopeDict(src, p, rope_type, rotary_dim, partial, max_pos, orig or 0)
    scaling = rope_types.read(reading)
    notes += reading.notes
    if base is None:
        raise _Missing("rope_theta")

    section: tuple[int, int, int] | None = None
    interleaved = False
    if p.get("mrope_section") is not None:
        raw = p["mrope_section"]
        if not (isinstance(raw, list) and len(raw) == 3):
            raise InputError(f"{src}['mrope_section'] must be a list of 3 integers, got {raw!r}")
        s0, s1, s2 = (_int(f"{src}['mrope_section'][{i}]", x) for i, x in enumerate(raw))
        section = (s0, s1, s2)
        if sum(section) != rotary_dim // 2:
            raise InputError(
                f"{src}['mrope_section'] {list(section)} sums to {sum(section)}, but the rotary "
                f"dimension has {rotary_dim // 2} pairs"
            )
        flag = p.get("mrope_interleaved", False)
        if not isinstance(flag, bool):
            raise InputError(f"{src}['mrope_interleaved'] must be true or false, got {flag!r}")
        interleaved = flag
        if fam.mrope_assignment is not None:
            # No transformers module reads mrope_interleaved: each family's code fixes it.
            interleaved = fam.mrope_assignment == "interleaved"
            if "mrope_interleaved" in p and flag != interleaved:
                notes.append(
                    f"mrope_interleaved is {str(flag).lower()}, but {fam.name}'s module always "
                    f"assigns pairs {fam.mrope_assignment}: read as transformers does"
                )

    temperature = None
    if fam.temperature == "llama4_beta" and p.get("llama_4_scaling_beta") is not None:
        beta = _num(f"{src}['llama_4_scaling_beta']", p["llama_4_scaling_beta"], minimum=0)
        length = p.get("original_max_position_embeddings", orig)
        if length is None:
            raise _Missing("original_max_position_embeddings")
        temperature = _temperature.Llama4ScalingBetaTemperature(
            beta, _int("original_max_position_embeddings", length)
        )
        if beta == 0:
            notes.append("llama_4_scaling_beta is 0: the query temperature is 1 at every position")

    return RopeSpec(
        rope_type=rope_type,
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        base=base,
        scaling=scaling,
        max_position_embeddings=max_pos,
        original_context=orig if orig is not None else max_pos,
        layout=layout,
        mrope_section=section,
        mrope_interleaved=interleaved,
        temperature=temperature,
        layer_type=layer_type,
        model_type=model_type,
        notes=tuple(notes),
    )


def _read(d: dict[str, object], strict: bool) -> ModelRope:
    """Read every layer kind; raises _Missing for a key left to the class default."""
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
    temperature = None
    if fam.temperature == "llama4":
        tuning = text.get("attn_temperature_tuning")
        if tuning is None:
            raise _Missing("attn_temperature_tuning")
        if not isinstance(tuning, bool):
            raise InputError(f"attn_temperature_tuning must be true or false, got {tuning!r}")
        if tuning:
            for key in ("floor_scale", "attn_scale"):
                if text.get(key) is None:
                    raise _Missing(key)
            temperature = _temperature.Llama4AttnTemperature(
                _int("floor_scale", text["floor_scale"]),
                _num("attn_scale", text["attn_scale"], minimum=0),
            )
    splits = fam.scaling_on is not None or fam.local_theta_key is not None
    if (splits or fam.rope_layers != "all") and text.get("layer_types") is None:
        # Which layers are sliding comes from the class (Gemma 3's sliding_window_pattern,
        # EXAONE 4's LLLG); reading one RoPE for all would be wrong on some layers.
        raise _Missing("layer_types")
    if fam.scaling_on is not None and not nested and src.endswith("rope_parameters") and params:
        raise InputError(
            f"{src} is a single rope dict, which {fam.name}'s config class does not apply to any "
            f"layer type; give it as rope_scaling (the {fam.scaling_on} layers' scaling) or per "
            f"layer type"
        )
    window = text.get("sliding_window")
    if fam.rope_layers != "all" and "sliding_window" not in text:
        raise _Missing("sliding_window")
    force = False
    if fam.force_rope_key is not None:
        flag = text.get(fam.force_rope_key, False)
        if not isinstance(flag, bool):
            raise InputError(f"{fam.force_rope_key} must be true or false, got {flag!r}")
        force = flag
    for name, layers in kinds:
        where_kind = src if not nested else f"{src}[{name!r}]"
        if name is not None and name in fam.nope_layer_types:
            kinds_out.append(LayerKind(name, None, layers, f"{name} layers have no attention RoPE"))
            continue
        if (
            name != "sliding_attention"
            and not force
            and (
                fam.rope_layers == "sliding_only"
                or (fam.rope_layers == "sliding_if_window" and window is not None)
            )
        ):
            why = "with a sliding window set, " if fam.rope_layers == "sliding_if_window" else ""
            kinds_out.append(
                LayerKind(name, None, layers, f"{fam.name}: {why}only sliding layers rotate")
            )
            continue
        if name == "nope" and fam.layer_kinds_from_no_rope:
            kinds_out.append(
                LayerKind(name, None, layers, "no_rope_layers marks them NoPE", temperature)
            )
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
                    notes += _check_keys(src, params, rope_type, fam, strict)
                checked.add(id(params))
            p = {"rope_type": "default"}
        else:
            p = params
        spec = _read_kind(text, fam, model_type, where_kind, p, name, strict, checked)
        if p is params:
            checked.add(id(params))
        spec = replace(spec, notes=tuple(notes) + spec.notes)
        kinds_out.append(LayerKind(name, spec, layers))
    if not any(k.spec is not None for k in kinds_out):
        raise InputError(f"model_type {model_type!r}: no layer of this config uses RoPE")
    return ModelRope(model_type, fam.name, where, tuple(kinds_out))


# Top-level keys of a config.json that no rope formula reads (dtype, quantization, code and
# provenance), not handed to transformers' config class when posemb asks it for a default.
_NOT_ROPE_KEYS = frozenset(
    {
        "torch_dtype",
        "dtype",
        "quantization_config",
        "auto_map",
        "architectures",
        "transformers_version",
        "_name_or_path",
    }
)


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
    # transformers logs its own validation warnings while building the config; posemb reports
    # what matters in the spec's notes, so they are silenced for this one call.
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    # Keys that say nothing about RoPE are left out: a bad one (a torch_dtype of 1e308) made
    # the class raise IndexError converting it back to a string.
    kept = {k: v for k, v in d.items() if k != "model_type" and k not in _NOT_ROPE_KEYS}
    try:
        cfg = transformers.AutoConfig.for_model(outer_type, **copy.deepcopy(kept))
        text = cfg.get_text_config(decoder=True)
        out: dict[str, object] = dict(text.to_dict())
    except Exception as err:  # transformers refused the dict: said in one line, chained
        said = " ".join(str(err).split())
        said = said if len(said) <= 300 else said[:297] + "..."
        raise InputError(
            f"{what} does not set {missing!r}, and transformers {transformers.__version__} cannot "
            f"build its config to read the default ({type(err).__name__}: {said})"
        ) from err
    finally:
        transformers.logging.set_verbosity(verbosity)
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
    except _Missing as err:
        missing = err.key
    text, _ = _text_part(d)
    model_type = _model_type(d, text)
    filled = _resolve(d, missing, model_type)
    cls = str(filled.pop("__resolved_from__"))
    try:
        out = _read(filled, strict)
    except _Missing as again:
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
