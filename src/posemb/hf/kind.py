"""One layer kind's :class:`~posemb.hf.spec.RopeSpec` from its rope dict and the text config,
in named steps: the rope type (its row of :mod:`posemb.hf.rope_types`), the base, the rotary
fraction and dimension, the layout, the context lengths, the scaling, M-RoPE, the query
temperature. A key the file leaves to its class's default raises :class:`Missing`, which
:mod:`posemb.hf.config` resolves through transformers and reads again.
"""

from __future__ import annotations

import difflib
import warnings

from .. import _checks
from .. import temperature as _temperature
from .._errors import InputError
from ..mrope import mrope_axes
from ..rope import Layout
from . import rope_types
from .families import CLASS_HEAD_DIM, Family, partial_default
from .rope_types import ROPE_KEYS
from .spec import RopeSpec

_num = _checks.number
_int = _checks.positive_int


class Missing(Exception):
    """A key the file leaves to the model class's default (resolved through transformers)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def check_keys(
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
    text: dict[str, object], fam: Family, layer_type: str | None, class_types: frozenset[str]
) -> tuple[int, str]:
    """Channels the RoPE acts on, and the key that said so; bounded before any table exists."""
    value, key = _read_head_dim(text, fam, layer_type, class_types)
    derived = " (hidden_size / num_attention_heads)" if key == "hidden_size" else ""
    _checks.head_width(key, value, derived)
    return value, key


def _read_head_dim(
    text: dict[str, object], fam: Family, layer_type: str | None, class_types: frozenset[str]
) -> tuple[int, str]:
    if fam.rope_head_dim_key is not None:
        v = text.get(fam.rope_head_dim_key)
        if v is None:
            raise Missing(fam.rope_head_dim_key)
        return _int(fam.rope_head_dim_key, v), fam.rope_head_dim_key
    if fam.global_head_dim_key is not None and layer_type == "full_attention":
        key = fam.global_head_dim_key
        if text.get(key) is None:
            raise Missing(key)
        return _int(key, text[key]), key
    if text.get("head_dim") is not None:
        return _int("head_dim", text["head_dim"]), "head_dim"
    if class_types & CLASS_HEAD_DIM:
        raise Missing("head_dim")  # its class's own default, read through the class
    hidden = text.get("hidden_size", text.get("n_embd"))
    heads = text.get("num_attention_heads", text.get("n_head"))
    if hidden is None:
        raise Missing("head_dim")
    if heads is None:
        raise Missing("num_attention_heads")
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


def _rope_type(
    p: dict[str, object], fam: Family, src: str, model_type: str | None, notes: list[str]
) -> tuple[str, rope_types.RopeType]:
    """The rope type the dict names (legacy spellings and family aliases resolved), its row."""
    raw_type = p.get("rope_type") or p.get("type") or "default"
    legacy = p.get("type")
    aliases = fam.rope_type_aliases
    named = p.get("rope_type")
    for key, value in (("rope_type", named), ("type", legacy)):
        if value is not None and not isinstance(value, str):  # a list is not even hashable
            raise InputError(f"{src}[{key!r}] must be a string, got {value!r}")
    if named and legacy and aliases.get(legacy, legacy) != aliases.get(named, named):  # type: ignore[call-overload]
        raise InputError(
            f"{src}['rope_type'] is {named!r} but {src}['type'] is {legacy!r}; "
            f"they must agree (or give only rope_type)"
        )
    if not isinstance(raw_type, str):
        raise InputError(f"{src}['rope_type'] must be a string, got {raw_type!r}")
    rope_type = aliases.get(raw_type, raw_type)
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
    return rope_type, row


def _base(
    p: dict[str, object], text: dict[str, object], fam: Family, src: str, layer_type: str | None
) -> float | None:
    """The base: the rope dict, then the family's own spelling (which its class reads instead of
    the generic one), the top level, a base fixed by the modeling code; never a silent default.
    None when the file leaves it to the class (resolved after the rest is checked, so that the
    file's own mistakes are named first)."""
    theta = p.get("rope_theta")
    if theta is None and fam.local_theta_key is not None and layer_type == "sliding_attention":
        key = str(fam.local_theta_key)
        theta = text.get(key)
        if theta is None:
            raise Missing(key)
    if theta is None and fam.theta_key is not None:
        theta = text.get(fam.theta_key)
        _agree(fam.theta_key, theta, "rope_theta", text.get("rope_theta"), fam)
        if theta is None:
            raise Missing(fam.theta_key)
    if theta is None:
        theta = text.get("rope_theta")
    if theta is None and fam.fixed_theta is not None:
        theta = fam.fixed_theta
    return None if theta is None else _num(f"{src}['rope_theta']", theta, minimum=1, strict=True)


def _partial(
    p: dict[str, object],
    text: dict[str, object],
    fam: Family,
    model_type: str | None,
    notes: list[str],
) -> float:
    """The rotary fraction: the dict, the family's spelling or the generic key, else the class
    default; an explicit null is not an absent key (transformers then rotates the whole head,
    Phi-2 and StableLM 2), where a missing key gets the class's default."""
    generic = "partial_rotary_factor"
    raw = p.get(generic)
    if raw is None and fam.partial_key is not None:
        raw = text.get(fam.partial_key)
        _agree(fam.partial_key, raw, generic, text.get(generic), fam)
    elif raw is None:
        raw = text.get(generic)
    class_partial = partial_default(model_type, fam)
    places = ((p, generic), (text, generic), (text, fam.partial_key))
    said_null = any(k is not None and k in where and where[k] is None for where, k in places)
    if raw is None and class_partial is not None and said_null:
        notes.append(
            f"partial_rotary_factor is null: the whole head rotates, as in transformers 5.24 "
            f"(the {model_type!r} class default {class_partial} is for a file without the key)"
        )
    elif raw is None and class_partial is not None:
        raw = class_partial
        notes.append(
            f"partial_rotary_factor not set: the {model_type!r} class default {class_partial} "
            f"(as in transformers 5.24)"
        )
    # 0 is meaningful for proportional RoPE (no pair rotates); elsewhere the rotary-dimension
    # check rejects it.
    partial = 1.0 if raw is None else _num(generic, raw, minimum=0)
    if partial > 1:
        raise InputError(f"partial_rotary_factor must be in [0, 1], got {partial!r}")
    return partial


def _rotary_dim(
    text: dict[str, object], fam: Family, rope_type: str, head_dim: int, partial: float
) -> int:
    """Channels that rotate: the family's own key, the whole head (proportional), or the
    fraction of the head; even and >= 2."""
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
    return rotary_dim


def _layout(text: dict[str, object], fam: Family) -> Layout:
    layout = fam.default_layout
    if fam.layout_key is not None and text.get(fam.layout_key) is not None:
        flag = text[fam.layout_key]
        if not isinstance(flag, bool):
            raise InputError(f"{fam.layout_key} must be true or false, got {flag!r}")
        layout = Layout.INTERLEAVED if flag else Layout.HALF
    return layout


def _context(
    p: dict[str, object], text: dict[str, object], src: str, row: rope_types.RopeType
) -> tuple[int | None, int | None]:
    """(max_position_embeddings, original_max_position_embeddings), the second required by
    the rope types that scale from it."""
    max_pos = text.get("max_position_embeddings", text.get("n_positions"))
    max_len = None if max_pos is None else _int("max_position_embeddings", max_pos)
    raw = text.get("original_max_position_embeddings")
    if raw is None:
        raw = p.get("original_max_position_embeddings")
    orig = None if raw is None else _int("original_max_position_embeddings", raw)
    if row.needs_original and orig is None:
        raise InputError(
            f"{src}['original_max_position_embeddings'] is missing: rope_type {row.name!r} needs "
            f"the pre-training context length (a positive integer)"
        )
    return max_len, orig


def _mrope(
    p: dict[str, object], src: str, fam: Family, rotary_dim: int, notes: list[str]
) -> tuple[tuple[int, int, int] | None, bool]:
    """M-RoPE's (mrope_section, interleaved), (None, False) without a section."""
    if p.get("mrope_section") is None:
        return None, False
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
    try:
        # At reading, not at the first forward: a patched model must be able to run.
        mrope_axes(section, interleaved)
    except InputError as err:
        raise InputError(f"{src}: {err}") from None
    return section, interleaved


def _query_temperature(
    p: dict[str, object], src: str, fam: Family, orig: int | None, notes: list[str]
) -> _temperature.QueryTemperature | None:
    """Mistral's llama_4_scaling_beta temperature, where the family applies one."""
    if fam.temperature != "llama4_beta" or p.get("llama_4_scaling_beta") is None:
        return None
    beta = _num(f"{src}['llama_4_scaling_beta']", p["llama_4_scaling_beta"], minimum=0)
    length = p.get("original_max_position_embeddings", orig)
    if length is None:
        raise Missing("original_max_position_embeddings")
    if beta == 0:
        notes.append("llama_4_scaling_beta is 0: the query temperature is 1 at every position")
    return _temperature.Llama4ScalingBetaTemperature(
        beta, _int("original_max_position_embeddings", length)
    )


def read_kind(
    text: dict[str, object],
    fam: Family,
    model_type: str | None,
    src: str,
    p: dict[str, object] | None,
    layer_type: str | None,
    strict: bool,
    checked: set[int],
    class_types: frozenset[str] = frozenset(),
) -> RopeSpec:
    """One layer kind's RopeSpec from its rope dict ``p`` (as written) and the text config
    (``checked``: ids of rope dicts whose keys were already checked; ``class_types``: the model
    types whose config classes build this text config, :data:`CLASS_HEAD_DIM` is asked of)."""
    notes: list[str] = []
    p = dict(p or {})
    rope_type, row = _rope_type(p, fam, src, model_type, notes)
    if id(p) not in checked:
        notes += check_keys(src, p, rope_type, fam, strict)
    base = _base(p, text, fam, src, layer_type)
    head_dim, _ = _head_dim(text, fam, layer_type, class_types | {model_type or ""})
    partial = _partial(p, text, fam, model_type, notes)
    rotary_dim = _rotary_dim(text, fam, rope_type, head_dim, partial)
    layout = _layout(text, fam)
    max_pos, orig = _context(p, text, src, row)
    reading = rope_types.RopeDict(src, p, rope_type, rotary_dim, partial, max_pos, orig or 0)
    scaling = rope_types.read(reading)
    notes += reading.notes
    if base is None:
        raise Missing("rope_theta")
    section, interleaved = _mrope(p, src, fam, rotary_dim, notes)
    temperature = _query_temperature(p, src, fam, orig, notes)
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


__all__ = ["Missing", "check_keys", "read_kind"]
