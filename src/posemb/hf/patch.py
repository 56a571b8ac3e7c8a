"""Swapping posemb's rotary tables into a ``transformers`` model.

The attention code of the model is left alone: :class:`HFRotaryEmbedding` honours the same
``(cos, sin)`` contract as the ``*RotaryEmbedding`` module it replaces, with the tables computed
by posemb from the model's config.
"""

from __future__ import annotations

import torch
from torch import nn

from .config import rope_layer_types, rotary_from_config


class HFRotaryEmbedding(nn.Module):
    """Drop-in replacement for a ``transformers`` ``*RotaryEmbedding`` module.

    ``forward(x, position_ids)`` returns ``(cos, sin)``, each ``(batch, seq, rotary_dim)`` in
    ``x``'s dtype with the attention factor applied, in the full-width HALF form
    (``cat([cos, cos])``) that ``apply_rotary_pos_emb`` expects. Angles are formed in float64
    and dynamic schedules are recomputed per call, so no state changes in forward.

    Args:
        config: the model's config (object or dict).
    """

    def __init__(self, config: object) -> None:
        super().__init__()
        layer_types = rope_layer_types(config)
        if layer_types is None:
            self.ropes = {None: rotary_from_config(config)}
        else:
            self.ropes = {lt: rotary_from_config(config, layer_type=lt) for lt in layer_types}

    def forward(
        self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tables for ``position_ids`` ``(batch, seq)``; ``x`` only gives dtype and device."""
        if layer_type not in self.ropes:
            raise ValueError(
                f"layer_type {layer_type!r} has no RoPE here; known: {list(self.ropes)}"
            )
        rope = self.ropes[layer_type]
        cos, sin = rope.cos_sin(position_ids, dtype=torch.float32, device=x.device)
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
