"""Swapping posemb's rotary tables into a ``transformers`` model.

The attention code of the model is left alone: :class:`HFRotaryEmbedding` honours the same
contract as the ``*RotaryEmbedding`` module it replaces (the form of the tables its family's
attention expects, see :attr:`posemb.hf.families.Family.tables`), with the tables computed by
posemb from the model's config. Query temperatures (Llama 4, Ministral 3) are applied by the
model's attention from its config, so they are untouched by the swap.

What :class:`HFRotaryEmbedding` keeps: each rotary module's tables formed in the family's
layout (``_forms``), keyed on the module's key, device and dtype and held beside the posemb
table they were formed from, which is itself keyed on everything it is a function of (device,
dtype, scaling, base, rotary_dim, length bucket: :class:`posemb.RotaryEmbedding`); and the
last decode step's memo (``_decode``), checked against the module it came from (held, so never
another's) and that module's scaling, base and rotary_dim at each call. Neither reads a version
counter or a data pointer, and neither is handed out: callers get gathered copies.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import _checks
from .._errors import InputError
from ..mrope import mrope_cos_sin
from ..rope import RotaryEmbedding
from .config import ModelRope, RopeSpec, model_rope
from .families import FLOAT32_TABLES, family_for

# ModuleDict keys must be non-empty strings; this one holds the RoPE of a config that has one
# for every layer. Lookups go through ``layer_types``, so a layer type of the same name in
# another config cannot be mistaken for it.
_EVERY_LAYER = "every_layer"


class HFRotaryEmbedding(nn.Module):
    """Drop-in replacement for a ``transformers`` ``*RotaryEmbedding`` module.

    ``forward(x, position_ids[, layer_type])`` returns what the replaced module returns, in
    ``x``'s dtype (float32 where the family's module keeps float32, OLMo 3) with the attention
    factor applied: ``(cos, sin)`` each ``(batch, seq,
    rotary_dim)`` in the ``cat([cos, cos])`` form ``rotate_half`` expects (most families), in the
    pairwise-repeated form (GLM-4V), or complex ``cos + i sin`` ``(batch, seq, rotary_dim / 2)``
    (Llama 4, DeepSeek-V2). Multimodal RoPE configs take ``position_ids`` of shape ``(3,
    batch, seq)`` (temporal, height, width). Angles are formed in float64 and length-dependent
    scalings are recomputed per call, so no state changes in forward.

    The per-layer-type :class:`~posemb.RotaryEmbedding` modules are registered children
    (``ropes``); they hold no tensors, which is why moving this module to bfloat16 cannot round
    its frequencies.

    Args:
        config: the model's config (object or dict).
    """

    def __init__(self, config: object) -> None:
        super().__init__()
        # Kept as the replaced module keeps it: Granite-SWA's model reads
        # rotary_emb.config.rope_parameters to pick a layer's module.
        self.config = config
        self.model: ModelRope = model_rope(config)
        fam = family_for(self.model.model_type, set())
        if fam.tables == "table":
            raise InputError(
                f"{fam.name}'s rotary module hands out a stacked sin/cos buffer by position, not "
                f"tables per call; patch_rotary does not replace it (hf.rotary_from_config gives "
                f"posemb's module for the same config)"
            )
        self.tables = fam.tables
        self.float32_tables = self.model.model_type in FLOAT32_TABLES
        kinds = [k for k in self.model.kinds if k.spec is not None]
        if not self.model.per_layer_type:
            self.layer_types: tuple[str, ...] | None = None
        else:
            self.layer_types = tuple(str(k.layer_type) for k in kinds)
            for lt in self.layer_types:
                if not lt or "." in lt:
                    raise InputError(
                        f"layer type {lt!r} cannot name a submodule: it must be non-empty and "
                        f"contain no '.'"
                    )
        self._forms: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self._decode: tuple | None = None
        self.ropes = nn.ModuleDict(
            {(k.layer_type or _EVERY_LAYER): _module(k.spec) for k in kinds if k.spec is not None}
        )

    def _spec(self, layer_type: str | None) -> tuple[str, RopeSpec]:
        kind = self.model.kind(layer_type)
        if kind.spec is None:
            raise InputError(f"layer_type {layer_type!r} has no RoPE: {kind.reason}")
        key = kind.layer_type or _EVERY_LAYER
        if layer_type is None and self.layer_types is not None:
            key = self.layer_types[0]  # every rotating kind shares this spec (kind() checked)
        return key, kind.spec

    def forward(
        self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
        """Tables for ``position_ids``; ``x`` only gives dtype and device.

        Args:
            x: any floating tensor; its dtype and device are the outputs'.
            position_ids: integers ``(batch, seq)`` (or ``(seq,)``); ``(3, batch, seq)`` for
                multimodal RoPE.
            layer_type: for a per-layer-type config, which layer type; None when every
                rotating layer shares one RoPE.

        Returns:
            The replaced module's tables (see the class docstring).
        """
        hit = self._decode_hit(x, position_ids, layer_type)
        if hit is not None:
            return hit
        _checks.float_tensor("x", x)
        key, spec = self._spec(layer_type)
        # float32 tables cast to x's dtype round exactly as transformers' do; a float64 caller
        # asked for more than float32 can give, and gets the float64 tables.
        compute = _checks.compute_dtype(x)
        if spec.mrope_section is not None:
            if not isinstance(position_ids, torch.Tensor):
                raise InputError("position_ids must be a tensor for multimodal RoPE")
            seq_len = int(position_ids.max()) + 1 if position_ids.numel() else None
            inv, factor = spec.scaling.compute(spec.rotary_dim, spec.base, seq_len)
            cos, sin = mrope_cos_sin(
                position_ids.to(x.device),
                inv.to(x.device),
                spec.mrope_section,
                spec.mrope_interleaved,
                attention_factor=factor,
                dtype=compute,
            )
        else:
            pos = _checks.positions(position_ids, max_dim=2, name="position_ids").to(x.device)
            rope = self.ropes[key]
            assert isinstance(rope, RotaryEmbedding)
            table = rope._explicit_table(pos, x) if self.tables != "complex" else None
            if table is not None:
                # One gather from the cached table already in the family's form: a decode
                # step's tables took 120 us formed from the angles, twice transformers' 55 us.
                formed = self._in_form(key, table, compute if self.float32_tables else x.dtype)
                self._remember(x, position_ids, layer_type, key, rope, formed)
                both = formed[:, pos]
                return both[0], both[1]
            cos, sin = rope.cos_sin(pos, dtype=compute, device=x.device)
        if self.tables == "complex":
            return torch.complex(cos.float(), sin.float())
        out = compute if self.float32_tables else x.dtype
        if self.tables == "half_width":
            return cos.to(out), sin.to(out)
        if self.tables == "interleaved":
            return cos.repeat_interleave(2, -1).to(out), sin.repeat_interleave(2, -1).to(out)
        return torch.cat((cos, cos), -1).to(out), torch.cat((sin, sin), -1).to(out)

    def _in_form(self, rope_key: str, table: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """A module's cached ``(2, rows, r/2)`` cos/sin stack in this family's form and
        ``dtype``: one entry per layer type, device and dtype, formed again when the module
        hands out another stack (the entry holds the stack, so its identity is never
        another's)."""
        key = (rope_key, table.device, dtype)
        hit = self._forms.get(key)
        if hit is not None and hit[0] is table:
            return hit[1]
        # Never an inference tensor (as RotaryEmbedding's own tables): one formed under
        # inference_mode and kept would break every later call that trains.
        with torch.inference_mode(False):
            if self.tables == "half_width":
                formed = table.to(dtype)
            elif self.tables == "interleaved":
                formed = table.repeat_interleave(2, -1).to(dtype)
            else:
                formed = torch.cat((table, table), -1).to(dtype)
        if not _checks.tracing():
            self._forms[key] = (table, formed)
        return formed

    def _decode_hit(
        self, x: object, position_ids: object, layer_type: str | None
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A decode step's tables gathered from the table the last call formed, where that call
        was shaped as this one and passed every check; None otherwise.

        A model calls this once per step before its layers, with caches cold from the layers
        before: there each Python step counts, and the full path's ~60 cost 120-140 us where
        transformers' module took 88 us (a 2-layer Llama decoding, 2 threads).
        """
        memo = self._decode
        if (
            memo is None
            or _checks.tracing()  # first: a tracer must not guard on the memo
            or type(x) is not torch.Tensor
            or type(position_ids) is not torch.Tensor
            or memo[0] != (layer_type, x.dtype, x.is_cpu, position_ids.dtype, position_ids.dim())
            or not position_ids.is_cpu
            or position_ids.numel() > 64
        ):
            return None
        _, key, rope, scaling, base, rotary_dim, formed = memo
        current = self.ropes._modules.get(key)
        if (
            current is not rope
            or not isinstance(rope, RotaryEmbedding)
            or rope._scaling is not scaling
            or rope._base != base
            or rope._rotary_dim != rotary_dim
        ):
            return None  # the module was replaced or changed since: the full path forms tables
        values = position_ids.flatten().tolist()
        if not values or min(values) < 0 or max(values) >= formed.shape[1]:
            return None
        both = formed[:, position_ids]
        return both[0], both[1]

    def _remember(
        self, x: torch.Tensor, position_ids: object, layer_type: str | None, key: str,
        rope: RotaryEmbedding, formed: torch.Tensor,
    ) -> None:  # fmt: skip
        """Keep what :meth:`_decode_hit` needs after a call that passed every check."""
        if (
            type(x) is torch.Tensor
            and type(position_ids) is torch.Tensor
            and x.is_cpu
            and position_ids.is_cpu
            and position_ids.dtype in (torch.int32, torch.int64)
            and not rope.scaling.depends_on_length  # then any row of the table serves
            and not _checks.tracing()
        ):
            sig = (layer_type, x.dtype, x.is_cpu, position_ids.dtype, position_ids.dim())
            self._decode = (sig, key, rope, rope._scaling, rope._base, rope._rotary_dim, formed)

    def __getstate__(self) -> dict[str, object]:
        state = super().__getstate__()
        state["_forms"], state["_decode"] = {}, None  # caches: a copy forms its own
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        state.setdefault("_forms", {})
        state.setdefault("_decode", None)
        super().__setstate__(state)


def _module(spec: RopeSpec) -> RotaryEmbedding:
    # The HALF layout only fixes how cos_sin's tables are ordered; the family's attention code
    # pairs the channels itself.
    return RotaryEmbedding(
        spec.head_dim, base=spec.base, rotary_dim=spec.rotary_dim, scaling=spec.scaling
    )


def patch_rotary(model: nn.Module, fused: bool = False) -> list[str]:
    """Replace every ``transformers`` rotary-embedding module of ``model``'s text model with
    posemb's.

    This is the supported swap: the model's attention receives the same tables, computed by
    posemb from the model's config. Which modules are the text model's is decided by the config
    each holds (:mod:`posemb.hf.targets`): a vision tower's modules (Pixtral's in Mistral 3,
    Qwen2-VL's) hold their vision config and are left alone, rotary and attention alike (see
    :mod:`posemb.mrope` for posemb's version of their tables). A second call changes nothing
    already patched, and ``fused=True`` on a patched model fuses its attention.

    With ``fused=True`` each attention module of this model (not of other models of the
    family) also rotates q and k through posemb's registered op instead of the eager
    ``apply_rotary_pos_emb`` (see :mod:`posemb.hf.fused`); a family whose rotation posemb does
    not express is refused with ``ValueError`` naming it, after nothing was changed.

    Args:
        model: a ``transformers`` model (e.g. ``LlamaForCausalLM``).
        fused: also route the rotation through posemb's op.

    Returns:
        The dotted names of the replaced modules (and, with ``fused``, of the attention
        modules rebound).
    """
    from . import targets

    found, present = [], 0
    for name, module in list(targets.text_modules(model)):
        if isinstance(module, HFRotaryEmbedding):
            present += 1  # patched before: a second patch leaves it (and adds fused=True)
            continue
        # "Vision" in a class name is a second guard: a vision tower's rotary module whose
        # config is not found would be read from the text config, which is not its own.
        if not name or not targets.is_rotary(module) or "Vision" in type(module).__name__:
            continue
        config = getattr(module, "config", None) or targets.text_config(model)
        if config is None:
            raise InputError(
                f"{name} ({type(module).__name__}) has no config to read its RoPE from"
            )
        found.append((name, module, HFRotaryEmbedding(config)))
    if not found and not present:
        raise InputError(
            "no transformers rotary-embedding module of the text model was found to replace"
        )
    rebound: list[str] = []
    if fused:
        from . import fused as _fused

        first = (
            found[0][2]
            if found
            else next(m for _, m in targets.text_modules(model) if isinstance(m, HFRotaryEmbedding))
        )
        spec = next(k.spec for k in first.model.kinds if k.spec is not None)
        rebound = _fused.patch_fused(model, spec.head_dim, spec.rotary_dim)
    for name, module, new in found:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        # Kept unregistered (no parameters, not in named_modules) for unpatch_rotary.
        object.__setattr__(new, "_replaced", module)
        # No buffers to move: the tables are built on the device of each call's input.
        setattr(parent, attr, new)
    return [name for name, _, _ in found] + rebound


def unpatch_rotary(model: nn.Module) -> list[str]:
    """Undo :func:`patch_rotary`: the original rotary modules and attention ``forward``s come
    back; the dotted names restored."""
    from . import fused as _fused

    restored = _fused.unpatch_fused(model)
    for name, module in list(model.named_modules()):
        original = (
            getattr(module, "_replaced", None) if isinstance(module, HFRotaryEmbedding) else None
        )
        if original is not None:
            parent_name, _, attr = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, attr, original)
            restored.append(name)
    return restored


__all__ = ["HFRotaryEmbedding", "patch_rotary", "unpatch_rotary"]
