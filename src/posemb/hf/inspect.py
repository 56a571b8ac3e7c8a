"""What a config's RoPE does, frequency by frequency: the report behind ``posemb inspect``."""

from __future__ import annotations

import math
from typing import TypedDict, cast

from .. import _checks
from .._errors import InputError
from ..freqs import wavelengths
from ..mrope import describe_mrope_axes
from ..scaling import Default, Yarn
from .config import RopeSpec, model_rope
from .long_context import extension_from_config


class InspectReport(TypedDict):
    """The JSON object ``posemb inspect --json`` prints (see :func:`inspect_report`)."""

    rope_type: str
    head_dim: int
    rotary_dim: int
    base: float
    attention_factor: float
    seq_len: int | None
    original_context: int | None
    max_position_embeddings: int | None
    scaling: str
    inv_freq: list[float]
    wavelengths: list[float | None]
    scale: list[float | None]
    bands: list[str] | None
    less_than_one_turn: list[int]
    model_type: str | None
    layer_type: str | None
    layers: list[int]
    layout: str
    mrope: str | None
    temperature: str | None
    notes: list[str]


class NoRopeReport(TypedDict):
    """A layer kind that rotates nothing, in :func:`inspect_model`."""

    layer_type: str | None
    layers: list[int]
    rope: None
    reason: str
    temperature: str | None


class ModelReport(TypedDict):
    """The JSON object ``posemb inspect --json`` prints for a config with layer kinds."""

    model_type: str | None
    family: str
    text_config: str
    resolved_from: str
    layer_types: dict[str, InspectReport | NoRopeReport]


def inspect_report(
    config: object,
    seq_len: int | None = None,
    layer_type: str | None = None,
    *,
    strict: bool = True,
) -> InspectReport:
    """Describe a config's RoPE as a JSON-ready dict.

    Args:
        config: a ``transformers`` config object or a ``config.json`` dict.
        seq_len: current sequence length, for dynamic and longrope.
        layer_type: for configs with per-layer-type RoPE.
        strict: as in :func:`posemb.hf.model_rope` (False: unknown rope keys only warn).

    Returns:
        The spec's fields (``rope_type``, ``head_dim``, ``rotary_dim``, ``base``,
        ``original_context``, ``max_position_embeddings``, ``scaling``), ``attention_factor``,
        ``seq_len``, and per frequency pair (lists of ``rotary_dim // 2``): ``inv_freq``,
        ``wavelengths`` in tokens, ``scale`` (unscaled over scaled frequency), ``bands`` (None
        for methods without bands); ``less_than_one_turn`` lists the pairs whose unscaled
        wavelength exceeds the original context; ``model_type``, ``layer_type``, ``layers``
        (their indices), ``layout``, ``mrope`` (which pairs follow which axis), ``temperature``
        (the query temperature's formula) and ``notes``.
    """
    kind = model_rope(config, strict=strict).kind(layer_type)
    if kind.spec is None:
        raise InputError(f"layer type {layer_type!r} has no RoPE: {kind.reason}")
    report = _report(kind.spec, kind.layers, seq_len)
    report["notes"] += extension_from_config(config)[1]
    return report


def _report(spec: RopeSpec, layers: tuple[int, ...], seq_len: int | None) -> InspectReport:
    if seq_len is not None:
        _checks.positive_int("seq_len", seq_len)
    inv, factor = spec.scaling.compute(spec.rotary_dim, spec.base, seq_len)
    default, _ = Default().compute(spec.rotary_dim, spec.base)
    ctx = spec.original_context
    inv_l = inv.tolist()
    # Proportional RoPE may leave pairs unrotated (inv_freq 0): no wavelength, no scale.
    lam = [2 * math.pi / f if f > 0 else None for f in inv_l]
    # Judged on the unscaled wavelengths, the ones pre-training saw: pairs slower than the
    # original context never completed a turn there, which is what the scalings act on.
    slow = (
        []
        if ctx is None
        else [i for i, w in enumerate(wavelengths(spec.rotary_dim, spec.base).tolist()) if w > ctx]
    )
    notes = list(spec.notes)
    if spec.model_type in ("deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2"):
        y = spec.scaling
        if isinstance(y, Yarn) and y.mscale_all_dim:
            m = 0.1 * y.mscale_all_dim * math.log(y.factor) + 1 if y.factor > 1 else 1.0
            notes.append(
                f"DeepSeek's attention also multiplies its softmax scale by (0.1 * mscale_all_dim "
                f"* ln(factor) + 1)^2 = {m * m:.6g} (modeling_deepseek_v3.py), beside RoPE"
            )
    return {
        "rope_type": spec.rope_type,
        "head_dim": spec.head_dim,
        "rotary_dim": spec.rotary_dim,
        "base": spec.base,
        "attention_factor": factor,
        "seq_len": seq_len,
        "original_context": ctx,
        "max_position_embeddings": spec.max_position_embeddings,
        "scaling": repr(spec.scaling),
        "inv_freq": inv_l,
        "wavelengths": lam,
        "scale": [d / f if f > 0 else None for d, f in zip(default.tolist(), inv_l, strict=True)],
        "bands": spec.scaling.bands(spec.rotary_dim, spec.base),
        "less_than_one_turn": slow,
        "model_type": spec.model_type,
        "layer_type": spec.layer_type,
        "layers": list(layers),
        "layout": spec.layout.name,
        "mrope": None
        if spec.mrope_section is None
        else describe_mrope_axes(spec.mrope_section, spec.mrope_interleaved),
        "temperature": None if spec.temperature is None else spec.temperature.formula(),
        "notes": notes,
    }


def inspect_model(
    config: object, seq_len: int | None = None, *, strict: bool = True
) -> ModelReport | InspectReport:
    """Describe every layer kind of a config: :func:`inspect_report` per kind.

    Args:
        config: a ``transformers`` config object or a ``config.json`` dict.
        seq_len: current sequence length, for dynamic and longrope.
        strict: as in :func:`posemb.hf.model_rope`.

    Returns:
        For a config with one RoPE for every layer, its :class:`InspectReport`; otherwise a
        :class:`ModelReport` keyed by layer type, kinds without RoPE saying why.
    """
    m = model_rope(config, strict=strict)
    extension = extension_from_config(config)[1]
    if not m.per_layer_type:
        spec = m.kinds[0].spec
        assert spec is not None  # model_rope refuses a config where nothing rotates
        report = _report(spec, m.kinds[0].layers, seq_len)
        report["notes"] += extension
        return report
    kinds: dict[str, InspectReport | NoRopeReport] = {}
    for k in m.kinds:
        name = str(k.layer_type)
        if k.spec is None:
            kinds[name] = {
                "layer_type": k.layer_type,
                "layers": list(k.layers),
                "rope": None,
                "reason": k.reason,
                "temperature": None if k.temperature is None else k.temperature.formula(),
            }
        else:
            report = _report(k.spec, k.layers, seq_len)
            report["notes"] += extension
            kinds[name] = report
    return {
        "model_type": m.model_type,
        "family": m.family,
        "text_config": m.text_config,
        "resolved_from": m.resolved_from,
        "layer_types": kinds,
    }


def format_model(r: ModelReport | InspectReport) -> str:
    """Render :func:`inspect_model`: every layer kind, one after another."""
    if "layer_types" not in r:
        return format_inspect(r)
    model = cast(ModelReport, r)
    head = f"model_type {model['model_type']}   family {model['family']}"
    if model["text_config"]:
        head += f"   (read from {model['text_config']})"
    out = [head]
    for name, k in model["layer_types"].items():
        out += ["", f"=== layer type {name} ({len(k['layers'])} layers) ==="]
        if k.get("rope", "") is None:
            out.append(f"no RoPE: {k['reason']}")  # type: ignore[typeddict-item]
            if k["temperature"]:
                out.append(f"query temperature {k['temperature']}")
        else:
            out.append(format_inspect(k))  # type: ignore[arg-type]
    return "\n".join(out)


def format_inspect(r: InspectReport) -> str:
    """Render :func:`inspect_report` as text: a header and one row per frequency."""

    def num(v: object, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lines = [
        f"rope_type {r['rope_type']}   head_dim {r['head_dim']}   rotary_dim {r['rotary_dim']}   "
        f"base {r['base']:g}   attention_factor {r['attention_factor']:.6g}   "
        f"layout {r['layout']}",
        f"original context {num(r['original_context'], ',')} tokens   "
        f"max_position_embeddings {num(r['max_position_embeddings'], ',')}   "
        f"seq_len {num(r['seq_len'], ',')}",
        f"scaling {r['scaling']}",
    ]
    if r["mrope"]:
        lines.append(f"multimodal RoPE: {r['mrope']}")
    if r["temperature"]:
        lines.append(f"query temperature {r['temperature']}")
    lines += [f"note: {n}" for n in r["notes"]]
    lines += [
        "",
        f"{'i':>4}  {'inv_freq':>12}  {'wavelength':>14}  {'scale':>9}  band",
    ]
    bands = r["bands"] or [""] * len(r["inv_freq"])
    for i, (f, w, s, b) in enumerate(
        zip(r["inv_freq"], r["wavelengths"], r["scale"], bands, strict=True)
    ):
        lines.append(f"{i:>4}  {f:>12.6e}  {num(w, '>14,.2f')}  {num(s, '>9.4f')}  {b}")
    slow = r["less_than_one_turn"]
    lines.append("")
    if r["original_context"] is None:
        lines.append("the config names no context length, so turns per context are not known")
    elif slow:
        lines.append(
            f"{len(slow)} of {len(r['inv_freq'])} frequencies complete less than one turn within "
            f"the original context of {r['original_context']:,} tokens at their unscaled "
            f"wavelength: pairs {_ranges(slow)}"
        )
    else:
        lines.append(
            f"every frequency completes at least one turn within {r['original_context']:,} tokens"
        )
    return "\n".join(lines)


def _ranges(idx: list[int]) -> str:
    """[3, 4, 5, 9] -> '3-5, 9'."""
    runs: list[list[int]] = []
    for i in idx:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in runs)


__all__ = [
    "InspectReport",
    "ModelReport",
    "NoRopeReport",
    "format_inspect",
    "format_model",
    "inspect_model",
    "inspect_report",
]
