"""Swapping posemb's rotary tables into a ``transformers`` model.

The attention code of the model is left alone: :class:`HFRotaryEmbedding` honours the same
``(cos, sin)`` contract as the ``*RotaryEmbedding`` module it replaces, with the tables computed
by posemb from the model's config.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import _checks
from ..rope import RotaryEmbedding
from .config import rope_layer_types, rotary_from_config

# ModuleDict keys must be non-empty strings; this one holds the RoPE of a config that has one
# for every layer. Lookups go through ``layer_types``, so a layer type of the same name in
# another config cannot be mistaken for it.
_EVERY_LAYER = "every_layer"


class HFRotaryEmbedding(nn.Module):
    """Drop-in replacement for a ``transformers`` ``*RotaryEmbedding`` module.

    ``forward(x, position_ids)`` returns ``(cos, sin)``, each ``(batch, seq, rotary_dim)`` in
    ``x``'s dtype with the attention factor applied, in the full-width HALF form
    (``cat([cos, cos])``) that ``apply_rotary_pos_emb`` expects. Angles are formed in float64
    and length-dependent scalings are recomputed per call, so no state changes in forward.

    The per-layer-type :class:`~posemb.RotaryEmbedding` modules are registered children
    (``ropes``), so ``named_modules``, ``.to()`` and ``state_dict`` see them; they hold no
    tensors, which is why moving this module to bfloat16 cannot round its frequencies.

    Args:
        config: the model's config (object or dict); a rope dict keyed by layer type (Gemma 3
            style) gives one child per layer type that has RoPE.
    """

    def __init__(self, config: object) -> None:
        super().__init__()
        self.layer_types = rope_layer_types(config)
        if self.layer_types is None:
            self.ropes = nn.ModuleDict({_EVERY_LAYER: rotary_from_config(config)})
        else:
            for lt in self.layer_types:
                if not lt or "." in lt:
                    raise ValueError(
                        f"layer type {lt!r} cannot name a submodule: it must be non-empty and "
                        f"contain no '.'"
                    )
            self.ropes = nn.ModuleDict(
                {lt: rotary_from_config(config, layer_type=lt) for lt in self.layer_types}
            )

    def forward(
        self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tables for ``position_ids`` ``(batch, seq)``; ``x`` only gives dtype and device.

        Args:
            x: any floating tensor; its dtype and device are the outputs'.
            position_ids: integers ``(batch, seq)`` (or ``(seq,)``).
            layer_type: for a per-layer-type config, which layer type; None otherwise.

        Returns:
            ``(cos, sin)``, each ``position_ids.shape + (rotary_dim,)``.
        """
        _checks.float_tensor("x", x)
        pos = _checks.positions(position_ids, max_dim=2, name="position_ids")
        known = [None] if self.layer_types is None else list(self.layer_types)
        if layer_type not in known:
            raise ValueError(f"layer_type {layer_type!r} has no RoPE here; known: {known}")
        rope = self.ropes[_EVERY_LAYER if layer_type is None else layer_type]
        assert isinstance(rope, RotaryEmbedding)
        # float32 tables cast to x's dtype round exactly as transformers' do; a float64 caller
        # asked for more than float32 can give, and gets the float64 tables.
        compute = _checks.compute_dtype(x)
        cos, sin = rope.cos_sin(pos, dtype=compute, device=x.device)
        return torch.cat((cos, cos), -1).to(x.dtype), torch.cat((sin, sin), -1).to(x.dtype)


def patch_rotary(model: nn.Module) -> list[str]:
    """Replace every ``transformers`` rotary-embedding module in ``model`` with posemb's.

    This is the supported swap: the model's attention code is untouched and receives the same
    ``(cos, sin)`` contract, computed by posemb from the model's config.

    Args:
        model: a ``transformers`` model (e.g. ``LlamaForCausalLM``).

    Returns:
        The dotted names of the replaced modules.
    """
    replaced = []
    for name, module in list(model.named_modules()):
        cls = type(module).__name__
        if not name or not cls.endswith("RotaryEmbedding") or isinstance(module, HFRotaryEmbedding):
            continue
        config = getattr(module, "config", None) or getattr(model, "config", None)
        if config is None:
            raise ValueError(f"{name} ({cls}) has no config to read its RoPE from")
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        # No buffers to move: the tables are built on the device of each call's input.
        setattr(parent, attr, HFRotaryEmbedding(config))
        replaced.append(name)
    if not replaced:
        raise ValueError(
            "no module whose class name ends in 'RotaryEmbedding' was found to replace"
        )
    return replaced


__all__ = ["HFRotaryEmbedding", "patch_rotary"]
