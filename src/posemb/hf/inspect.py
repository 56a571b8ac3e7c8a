"""What a config's RoPE does, frequency by frequency: the report behind ``posemb inspect``."""

from __future__ import annotations

import math
from typing import TypedDict

from ..freqs import wavelengths
from ..scaling import Default
from .config import frequencies_from_config, rope_spec


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


def inspect_report(
    config: object, seq_len: int | None = None, layer_type: str | None = None
) -> InspectReport:
    """Describe a config's RoPE as a JSON-ready dict.

    Args:
        config: a ``transformers`` config object or a ``config.json`` dict.
        seq_len: current sequence length, for dynamic and longrope.
        layer_type: for configs with per-layer-type RoPE.

    Returns:
        The spec's fields (``rope_type``, ``head_dim``, ``rotary_dim``, ``base``,
        ``original_context``, ``max_position_embeddings``, ``scaling``), ``attention_factor``,
        ``seq_len``, and per frequency pair (lists of ``rotary_dim // 2``): ``inv_freq``,
        ``wavelengths`` in tokens, ``scale`` (unscaled over scaled frequency), ``bands`` (None
        for methods without bands); ``less_than_one_turn`` lists the pairs whose unscaled
        wavelength exceeds the original context.
    """
    spec = rope_spec(config, layer_type)
    inv, factor = frequencies_from_config(config, seq_len, layer_type)
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
    }


def format_inspect(r: InspectReport) -> str:
    """Render :func:`inspect_report` as text: a header and one row per frequency."""

    def num(v: object, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lines = [
        f"rope_type {r['rope_type']}   head_dim {r['head_dim']}   rotary_dim {r['rotary_dim']}   "
        f"base {r['base']:g}   attention_factor {r['attention_factor']:.6g}",
        f"original context {num(r['original_context'], ',')} tokens   "
        f"max_position_embeddings {num(r['max_position_embeddings'], ',')}   "
        f"seq_len {num(r['seq_len'], ',')}",
        f"scaling {r['scaling']}",
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


__all__ = ["InspectReport", "format_inspect", "inspect_report"]
