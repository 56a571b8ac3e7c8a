"""What posemb reads from a config: :class:`RopeSpec` for one kind of layer, :class:`LayerKind`
(which layers share it) and :class:`ModelRope` (every kind of one model). Built by
:mod:`posemb.hf.config`; importable from there too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .. import scaling as sc
from .._errors import InputError
from ..rope import Layout
from ..temperature import QueryTemperature


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


__all__ = ["LayerKind", "ModelRope", "RopeSpec"]
