"""The vision tower's RoPE of a multimodal config: which axial layout, head size and base.

A multimodal ``config.json`` nests its image encoder under ``vision_config``. Towers that rotate
their patches (Qwen2-VL to Qwen3.5, GLM-4V, EXAONE 4.5, Pixtral, Llama 4, Gemma 4) map to a
preset of :class:`posemb.AxialRotaryEmbedding` (each tested against the transformers module it
names); towers with absolute position embeddings (SigLIP, CLIP, Mllama) are reported as having
no RoPE; any other tower is refused by name, never guessed. Several RoPE towers also add a
learned absolute embedding to their patches before the first layer (Qwen3-VL, Qwen3.5,
GLM-4.1V, Llama 4, Gemma 4); that is a weight of the model, outside what this module reads.

The tower is read through ``transformers``' config class for the model (the ``hf`` extra): the
vision blocks of published files leave head counts and bases to their class defaults, and
their key names differ by family (``embed_dim`` or ``hidden_size``, ``num_heads`` or
``num_attention_heads``).
"""

from __future__ import annotations

import copy
from typing import Any, TypedDict

from .. import _extras
from .._errors import InputError
from ..axial import PRESETS, AxialRotaryEmbedding

# Vision model_type (or the outer model_type, where the block names none) -> axial preset.
# Published files name the Qwen and GLM towers after the model; transformers' own config
# classes (and the files they save) add "_vision".
_BY_MODEL = {
    "qwen2_vl": "qwen2_vl",
    "qwen2_5_vl": "qwen2_5_vl",
    "qwen3_vl": "qwen3_vl",
    "qwen3_vl_moe": "qwen3_vl",
    "qwen3_5": "qwen3_5",
    "qwen3_5_moe": "qwen3_5",
    "glm4v": "glm4v",
    "glm4v_moe": "glm4v",
    "exaone4_5": "exaone4_5",
    "llama4": "llama4",
    "gemma4": "gemma4",
}
ROPE_TOWERS: dict[str, str] = {
    **_BY_MODEL,
    **{f"{name}_vision": preset for name, preset in _BY_MODEL.items()},
    "llama4_vision_model": "llama4",
    "pixtral": "pixtral",
}

# Towers that add position embeddings to their patches instead of rotating them.
ABSOLUTE_TOWERS: dict[str, str] = {
    "siglip_vision_model": "SigLIP adds a learned position embedding to each patch",
    "siglip2_vision_model": "SigLIP 2 adds learned position embeddings, resized to the image",
    "clip_vision_model": "CLIP adds a learned position embedding to each patch",
    "mllama_vision_model": "Mllama adds learned (gated) position embeddings per tile and patch",
}


class VisionReport(TypedDict):
    """What :func:`vision_report` finds; ``preset`` is None for a tower without RoPE, and the
    layout fields are then None too."""

    model_type: str
    tower: str
    preset: str | None
    module: str | None
    reason: str | None
    head_dim: int | None
    heads: int | None
    base: float | None
    split: list[int] | None
    order: str | None
    frequencies: str | None
    layout: str | None
    coordinates: list[str] | None
    start: int | None


def _towers(config: object) -> tuple[str, str, dict[str, object]]:
    """(outer model_type, tower model_type, the config as a dict)."""
    from .config import _as_dict

    d = _as_dict(config)
    outer = d.get("model_type")
    block = d.get("vision_config")
    if not isinstance(outer, str):
        raise InputError("config has no model_type, so its vision tower cannot be named")
    if not isinstance(block, dict):
        raise InputError(f"model_type {outer!r} has no vision_config: no vision tower to read")
    tower = block.get("model_type")
    return outer, tower if isinstance(tower, str) and tower else outer, d


def _vision_config(outer: str, d: dict[str, object]) -> Any:
    transformers = _extras.require("transformers", "reading a vision tower's RoPE", "hf")
    if outer not in transformers.CONFIG_MAPPING:
        raise InputError(
            f"transformers {transformers.__version__} has no config class for model_type "
            f"{outer!r}, so its vision tower's defaults cannot be read"
        )
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        keep = {k: v for k, v in copy.deepcopy(d).items() if k != "model_type"}
        return transformers.AutoConfig.for_model(outer, **keep).vision_config
    finally:
        transformers.logging.set_verbosity(verbosity)


def _empty(outer: str, tower: str, reason: str) -> VisionReport:
    return VisionReport(
        model_type=outer, tower=tower, preset=None, module=None, reason=reason, head_dim=None,
        heads=None, base=None, split=None, order=None, frequencies=None, layout=None,
        coordinates=None, start=None,
    )  # fmt: skip


def vision_report(config: object) -> VisionReport:
    """The vision tower's RoPE of ``config`` (a config.json dict or transformers config).

    Raises:
        ValueError: no vision_config, or a tower posemb has no preset for (named).
        ImportError: transformers is not installed (the ``hf`` extra).
    """
    outer, tower, d = _towers(config)
    if tower in ABSOLUTE_TOWERS:
        return _empty(outer, tower, f"no RoPE: {ABSOLUTE_TOWERS[tower]}")
    if tower not in ROPE_TOWERS:
        raise InputError(
            f"posemb has no axial preset for the vision tower {tower!r} of {outer!r}; known "
            f"RoPE towers: {', '.join(sorted(ROPE_TOWERS))}; towers without RoPE: "
            f"{', '.join(sorted(ABSOLUTE_TOWERS))}"
        )
    block = d["vision_config"]
    assert isinstance(block, dict)  # _towers checked it
    _check_block(block, tower)
    v = _vision_config(outer, d)  # a transformers config class: its fields differ by family
    if not hasattr(v, "to_dict"):
        raise InputError(
            f"model_type {outer!r}'s config class has no vision tower, so its vision_config "
            f"block ({tower!r}) is not one transformers reads; give the config of a model that "
            f"has one"
        )
    heads = _field(v, tower, "num_attention_heads", "num_heads")
    width = _field(v, tower, "embed_dim", "hidden_size")  # Qwen2-VL: hidden_size is the merger's
    head_dim = _field(v, tower, "head_dim") if getattr(v, "head_dim", None) else width // heads
    if head_dim < 2:
        raise InputError(
            f"vision_config of {tower!r} gives heads {head_dim} wide ({width} / {heads} heads); "
            f"a head must hold at least one rotated pair"
        )
    params = getattr(v, "rope_parameters", None) or {}
    kind = params.get("rope_type", "default")
    if kind not in ("default", "axial"):
        raise InputError(
            f"the vision tower {tower!r} of {outer!r} has rope_type {kind!r}; its presets are "
            f"plain axial RoPE ('default' or 'axial'), and posemb does not guess a scaled one"
        )
    theta = params.get("rope_theta")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)):
        raise InputError(
            f"vision_config of {tower!r}: rope_theta must be a number greater than 1, got {theta!r}"
        )
    base = float(theta)
    name = ROPE_TOWERS[tower]
    rope = AxialRotaryEmbedding.preset(name, head_dim, base=base)
    p = PRESETS[name]
    return VisionReport(
        model_type=outer, tower=tower, preset=name, module=p.module, reason=None,
        head_dim=head_dim, heads=heads, base=base, split=list(rope.split), order=p.order,
        frequencies=p.frequencies, layout=p.layout.value, coordinates=list(p.coordinates),
        start=p.start,
    )  # fmt: skip


def _check_block(block: dict[str, object], tower: str) -> None:
    """The file's own vision_config values, before transformers' class reads them (Pixtral's
    divides by num_attention_heads in its constructor)."""
    for key in ("num_attention_heads", "num_heads", "head_dim", "hidden_size", "embed_dim"):
        value = block.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise InputError(
                f"vision_config of {tower!r}: {key} must be a positive integer, got {value!r}"
            )
    head_dim, heads = (
        block.get("head_dim"),
        block.get("num_attention_heads") or block.get("num_heads"),
    )
    width = block.get("embed_dim") or block.get("hidden_size")  # as vision_report reads them
    if head_dim is None and isinstance(heads, int) and isinstance(width, int):
        if width % heads:
            raise InputError(
                f"vision_config of {tower!r}: hidden size {width} is not divisible by its "
                f"{heads} heads"
            )
        head_dim = width // heads
    if isinstance(head_dim, int) and head_dim % 4:
        # An axial tower splits each head between two axes, in pairs: transformers' classes
        # refuse other widths in their constructors with their own error types.
        raise InputError(
            f"vision_config of {tower!r}: heads {head_dim} wide cannot be split into pairs "
            f"for two axes; allowed are multiples of 4"
        )
    theta = block.get("rope_theta")
    if theta is not None and (isinstance(theta, bool) or not isinstance(theta, (int, float))):
        raise InputError(
            f"vision_config of {tower!r}: rope_theta must be a number greater than 1, got {theta!r}"
        )


def _field(v: object, tower: str, *names: str) -> int:
    """The first of ``names`` the vision config sets, as a positive integer."""
    for key in names:
        value = getattr(v, key, None)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(
                    f"vision_config of {tower!r}: {key} must be a positive integer, got {value!r}"
                )
            return value
    raise InputError(f"vision_config of {tower!r} sets none of {', '.join(names)}")


def vision_rotary_from_config(config: object) -> AxialRotaryEmbedding:
    """posemb's module for the vision tower of ``config``: the preset :func:`vision_report`
    names, with the tower's head_dim and base.

    Raises:
        ValueError: as :func:`vision_report`, and for a tower without RoPE (named, with why).
    """
    r = vision_report(config)
    if r["preset"] is None:
        raise InputError(
            f"the vision tower {r['tower']!r} of {r['model_type']!r} has {r['reason']}"
        )
    assert r["head_dim"] is not None and r["base"] is not None
    return AxialRotaryEmbedding.preset(r["preset"], r["head_dim"], base=r["base"])


def format_vision(r: VisionReport) -> str:
    """:func:`vision_report`'s finding as text, ending in the line that builds the module."""
    head = f"vision tower {r['tower']!r} of {r['model_type']!r}"
    if r["preset"] is None:
        return f"{head}: {r['reason']}"
    coords = ", ".join(r["coordinates"] or [])
    return "\n".join(
        [
            f"{head}: axial RoPE, preset {r['preset']!r} (equal to transformers' {r['module']})",
            f"  head_dim {r['head_dim']} ({r['heads']} heads), base {r['base']:g}",
            f"  pairs per axis {r['split']}, order {r['order']}, frequencies "
            f"{r['frequencies']}, layout {r['layout']}",
            f"  coordinates ({coords}), first patch at {r['start']}",
            f"  posemb.AxialRotaryEmbedding.preset({r['preset']!r}, {r['head_dim']}, "
            f"base={r['base']!r})",
        ]
    )


__all__ = [
    "ABSOLUTE_TOWERS",
    "ROPE_TOWERS",
    "VisionReport",
    "format_vision",
    "vision_report",
    "vision_rotary_from_config",
]
