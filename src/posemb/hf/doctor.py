"""Where the installed ``transformers`` reads a config differently from what the file says, or
cannot read it: the "transformers reads this differently" part of ``posemb inspect``.

posemb reads the file as written. For each layer kind, every field transformers' rotary module
uses is compared as a value with the file's meaning: ``rope_theta``, ``rope_type``,
``factor``, ``original_max_position_embeddings`` (from transformers' standardized
``rope_parameters``), the rotary width and the attention factor (from the rotary module it
builds from the same dict, :mod:`posemb.hf.upstream`); each that differs is one row. Where
none does, the frequencies are compared too, so a misreading no field explains still shows
up, without a rule written for it. (Frequencies alone missed a base of 500,001 read as
500,000: a change of 2e-6, under float32's rounding of transformers' table.)

Two found this way (transformers 5.24): OLMo 3's ``Olmo3Config`` gives its sliding-window
layers a ``rope_theta`` of 500,000 whatever the file says, and Phi-3's config class cannot
read the published ``"su"`` spelling of LongRoPE at all (a ``KeyError``).

Nothing changes in what posemb reads: :func:`posemb.hf.rotary_from_config` keeps the file's
values, and :func:`posemb.hf.patch_rotary` on a loaded model follows the model's own config
object, which is transformers' reading, so a patched model computes what it computed before.
"""

from __future__ import annotations

import math
from typing import TypedDict

import torch

from .. import _extras
from .config import model_rope
from .spec import RopeSpec
from .upstream import (
    Frequencies,
    NoConfigClass,
    TooLarge,
    frequencies,
    one_line,
    rope_parameters,
    text_config,
)

# transformers computes inv_freq in float32: (ln(base) + 4) * 2^-24 relative at most (about 1e-6
# for base 500,000); anything past 1e-5 is a different reading, not rounding.
RTOL = 1e-5
CANNOT = "cannot read this config"


class Difference(TypedDict):
    """One place where transformers' reading differs from the file's."""

    layer_type: str | None
    key: str
    config: object
    transformers: object
    why: str


class TransformersCheck(TypedDict):
    """The comparison with transformers, as ``posemb inspect --json`` prints it."""

    transformers: str | None
    summary: str
    differs: list[Difference] | None


def transformers_differs(
    config: dict[str, object], *, layer_type: str | None = None, strict: bool = True
) -> TransformersCheck:
    """Compare posemb's reading of a ``config.json`` dict with the installed transformers'.

    Args:
        config: the file's dict (a transformers config object is transformers' reading
            already: there is nothing to compare, and this raises ``TypeError``).
        layer_type: compare only this layer kind (default: every kind).
        strict: as in :func:`posemb.hf.model_rope` (False: unknown rope keys only warn).

    Returns:
        ``transformers`` (its version, or None when it is not installed), ``summary`` (one
        line: how many layer kinds are read differently), and ``differs``: one
        :class:`Difference` per field of a layer kind read differently (several for one kind
        when several of its fields differ; an empty list when every kind agrees; None when the
        check was skipped).
    """
    if not isinstance(config, dict):
        raise TypeError("transformers_differs compares a config.json dict with transformers")
    m = model_rope(config, strict=strict)  # posemb's reading first: refusals before imports
    kinds = [k for k in m.kinds if layer_type is None or k.layer_type == layer_type]
    try:
        import transformers
    except ImportError as err:
        if not _extras.is_missing(err, "transformers"):
            return _skipped(None, f"transformers fails to import ({one_line(err)})")
        return _skipped(None, "transformers is not installed (pip install 'posemb[hf]')")
    except Exception as err:  # a broken install (a torch it was not built for): not ours
        return _skipped(None, f"transformers fails to import ({one_line(err)})")
    version = transformers.__version__
    if not isinstance(config.get("model_type"), str):
        return _skipped(version, "the config names no model_type, which transformers needs")
    try:
        tf = text_config({k: v for k, v in config.items() if not k.startswith("__")})
    except NoConfigClass as err:
        return _cannot_read(config, version, str(err), on_model_type=True)
    except Exception as err:  # transformers cannot build the config: say what it raised
        return _cannot_read(config, version, f"transformers {version} raises {one_line(err)}")
    try:
        cls, theirs = frequencies(tf)
    except TooLarge as err:
        return _skipped(version, f"{err}, more than posemb builds to compare")
    except Exception as err:  # MemoryError included: never "no module" when it failed
        said = f"transformers {version} fails building its rotary module: {one_line(err)}"
        return _cannot_read(config, version, said)
    if cls is None:
        return _skipped(version, f"transformers {version} builds no rotary module for "
                        f"{type(tf).__name__} to compare with")  # fmt: skip
    differs = []
    who = f"{cls} (transformers {version})"
    for kind in kinds:
        if kind.spec is not None:
            differs += _compare(kind.spec, kind.layer_type if m.per_layer_type else None, tf,
                                theirs, who)  # fmt: skip
    which = "every layer kind" if layer_type is None else f"layer kind {layer_type}"
    said = (
        f"transformers {version} ({cls}) reads {which} as the file says"
        if not differs
        else f"transformers {version} ({cls}) reads {len({d['layer_type'] for d in differs})} "
        f"of {len(kinds)} layer kind(s) differently from the file"
    )
    return {"transformers": version, "summary": said, "differs": differs}


def _skipped(version: str | None, why: str) -> TransformersCheck:
    return {"transformers": version, "summary": f"check skipped: {why}", "differs": None}


def _cannot_read(
    config: dict[str, object], version: str, error: str, on_model_type: bool = False
) -> TransformersCheck:
    """The one row of a config transformers cannot build: on the model type when transformers
    has no class for it, on the rope dict's type when its error is about RoPE, else on the
    config as a whole."""
    name = "rope_scaling" if config.get("rope_scaling") else "rope_parameters"
    rope = config.get(name)
    about_rope = "rope" in error.lower()
    if on_model_type:
        key, value = "model_type", config.get("model_type")
    elif about_rope and isinstance(rope, dict) and ("type" in rope or "rope_type" in rope):
        key = f"{name}.type" if "type" in rope else f"{name}.rope_type"
        value = rope.get("type", rope.get("rope_type"))
    else:  # a key transformers refuses that is not about positions: the file as a whole
        key, value = "config", config.get("model_type")
    row: Difference = {
        "layer_type": None,
        "key": key,
        "config": value,
        "transformers": CANNOT,
        "why": f"{error}; posemb reads the file as written",
    }
    return {
        "transformers": version,
        "summary": f"transformers {version} cannot read this config",
        "differs": [row],
    }


def _show(v: object) -> str:
    """A value as a reader writes it: 500000, not 500000.0; strings quoted."""
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e16:
        return str(int(v))
    return repr(v) if isinstance(v, str) else str(v)


def _close(a: object, b: object) -> bool:
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(float(a), float(b), rel_tol=RTOL, abs_tol=0.0)
    return a == b


def _compare(
    spec: RopeSpec, layer_type: str | None, tf: object, theirs: Frequencies, who: str
) -> list[Difference]:
    """The differences for one layer kind, or []: one per field of transformers' rope
    parameters that its rotary module reads otherwise than the file means (base, type,
    factor, original context, rotary width, attention factor), each compared as a value,
    not through the frequencies (a base of 500,001 read as 500,000 moves them by 2e-6,
    under float32's rounding of transformers' own table); then, where no field explains
    frequencies that differ beyond that rounding, the frequencies themselves."""
    inv, factor = spec.scaling.compute(spec.rotary_dim, spec.base)
    inv = inv.to(torch.float64)
    got = theirs.get(layer_type, theirs.get(None))  # one table for every layer kind: None
    if got is None:
        return []  # transformers builds no table for this kind: nothing to compare
    t_inv, t_factor = got
    params = rope_parameters(tf, layer_type)
    where = "these layers" if layer_type is None else f"the {layer_type} layers"
    rows = [
        _row(layer_type, *found)
        for found in _fields(spec, params, inv, factor, t_inv, t_factor, who, where)
    ]
    same_shape = t_inv.shape == inv.shape
    if rows or (
        same_shape and torch.allclose(t_inv, inv, rtol=RTOL, atol=0.0) and _close(t_factor, factor)
    ):
        return rows
    off = ((t_inv - inv).abs() > RTOL * inv.abs()).nonzero().flatten().tolist()
    why = f"{who} computes {len(off)} of {inv.numel()} frequencies of {where} differently"
    return [_row(layer_type, f"inv_freq[{off[0]}]", float(inv[off[0]]), float(t_inv[off[0]]), why)]


# Fields are compared as values: any difference past float64's rounding is a difference.
_FIELD_RTOL = 1e-12


def _fields(
    spec: RopeSpec,
    params: dict[str, object],
    inv: torch.Tensor,
    factor: float,
    t_inv: torch.Tensor,
    t_factor: float,
    who: str,
    where: str,
) -> list[tuple[str, object, object, str]]:
    """``(key, the file's value, transformers' value, why)`` for each field that differs."""
    ours = {
        "rope_theta": spec.base,
        "rope_type": spec.rope_type,
        "factor": getattr(spec.scaling, "factor", None),
        "original_max_position_embeddings": spec.original_context,
    }
    found = []
    for key, value in ours.items():
        other = params.get(key)
        if value is not None and other is not None and not _same(value, other):
            why = f"{who} rotates {where} with {key} {_show(other)}, not {_show(value)}"
            found.append((key, value, other, why))
    if t_inv.shape != inv.shape:
        width = 2 * t_inv.numel()
        why = f"{who} rotates {width} channels of {where}, not {spec.rotary_dim}"
        found.append(("rotary_dim", spec.rotary_dim, width, why))
    if not _close(t_factor, factor):
        why = f"{who} scales the attention of {where} by {t_factor:g}, not {factor:g}"
        found.append(("attention_factor", factor, t_factor, why))
    return found


def _same(a: object, b: object) -> bool:
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(float(a), float(b), rel_tol=_FIELD_RTOL, abs_tol=0.0)
    return a == b


def _row(layer_type: str | None, key: str, config: object, tf: object, why: str) -> Difference:
    plain = config.item() if isinstance(config, torch.Tensor) else config
    return {"layer_type": layer_type, "key": key, "config": plain, "transformers": tf, "why": why}


def format_differs(check: TransformersCheck) -> str:
    """The text section of ``posemb inspect``: its summary, then one line per difference."""
    lines = ["", "=== transformers reads this differently ===" if check["differs"] else "",
             check["summary"]]  # fmt: skip
    for d in check["differs"] or []:
        where = d["layer_type"] or "every layer"
        if d["transformers"] == CANNOT:
            lines.append(f"{d['key']} {_show(d['config'])}: {d['why']}")
            continue
        lines.append(
            f"{where}: {d['key']} is {_show(d['config'])} in the file, "
            f"{_show(d['transformers'])} in transformers: {d['why']}"
        )
    return "\n".join(line for i, line in enumerate(lines) if line or i == 0)


__all__ = ["Difference", "TransformersCheck", "format_differs", "transformers_differs"]
