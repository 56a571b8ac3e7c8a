"""Attention entropy by window length, with and without an attention factor.

YaRN (Peng et al. 2023, section 3.4 and appendix A.2) multiplies the logits by
``(0.1 ln s + 1)^2`` (its factor on cos and sin, squared) because attention spreads out, its
entropy grows, as a model reads windows ``s`` times longer than it was trained on. The lab
measures that premise on its trained models: the mean entropy of each layer's attention rows
at each evaluation length, with the factor off and on, for every trained encoding and every
inference-time RoPE scaling, next to ``ln(i + 1)``, the entropy of a row that attends
uniformly to the ``i + 1`` keys it may see.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch

from .. import scaling as sc
from .model import SCALINGS, TinyLM, scaling_for
from .train import per_position_loss


def yarn_factor(s: float) -> float:
    """YaRN's attention factor ``0.1 ln s + 1`` for ``s > 1`` (1 otherwise)."""
    return 0.1 * math.log(s) + 1 if s > 1 else 1.0


def row_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of attention rows ``(..., q, k)`` -> ``(..., q)``; 0 log 0 = 0."""
    w = weights.to(torch.float64)
    return -(w * torch.where(w > 0, w.log(), torch.zeros_like(w))).sum(-1)


def uniform_entropy(length: int) -> float:
    """Mean over the rows of a causal window of ``length`` of ``ln(i + 1)``: the entropy of
    attention spread evenly over every visible key."""
    return sum(math.log(i + 1) for i in range(length)) / length


def layer_entropy(model: TinyLM, tokens: torch.Tensor, chunk: int = 2) -> list[float]:
    """Mean attention entropy (nats) per layer of ``model`` on windows ``(n, length)``: the mean
    over windows, heads and query positions. Eval mode, no gradients."""
    model.eval()
    totals: list[float] = []
    with torch.no_grad():
        for part in tokens.split(chunk):
            per_layer = [
                float(row_entropy(w).mean()) * len(part) for w in model.iter_attention_weights(part)
            ]
            totals = (
                per_layer if not totals else [a + b for a, b in zip(totals, per_layer, strict=True)]
            )
    return [t / len(tokens) for t in totals]


def _without_factor(scaling: sc.RopeScaling) -> sc.RopeScaling:
    if isinstance(scaling, sc.Yarn):
        return dataclasses.replace(scaling, attention_factor=1.0)
    return scaling


def measure(
    model: TinyLM,
    variant: str,
    windows: dict[int, torch.Tensor],
    train_len: int,
) -> dict[str, dict[str, dict[str, object]]]:
    """Entropy and loss of ``model`` as ``variant`` (its trained encoding, or a ``rope+...``
    scaling of a RoPE model) at each window length, with the attention factor off and on.

    ``windows[length]`` are held-out windows ``(n, length + 1)`` (inputs and next tokens).
    "off": no temperature (YaRN with attention_factor 1); "on": logits times
    ``yarn_factor(s)^2`` with ``s = length / train_len`` (YaRN's own factor, or
    :meth:`TinyLM.set_logit_scale` for every other variant). Returns
    ``{"off"|"on": {str(length): {"entropy": [per layer], "loss": all positions, "past":
    positions past train_len or None}}}``. The model is left unscaled.
    """
    out: dict[str, dict[str, dict[str, object]]] = {"off": {}, "on": {}}
    for n, w in sorted(windows.items()):
        s = max(1.0, n / train_len)
        scaling = scaling_for(variant, train_len, n) if variant in SCALINGS else None
        for mode in ("off", "on"):
            if mode == "on" and s == 1.0:
                out["on"][str(n)] = out["off"][str(n)]  # the factor is 1 at the training length
                continue
            if scaling is None:
                model.set_scaling(None)
            else:
                model.set_scaling(scaling if mode == "on" else _without_factor(scaling))
            own = isinstance(scaling, sc.Yarn)  # YaRN brings its factor on cos and sin
            model.set_logit_scale(yarn_factor(s) ** 2 if mode == "on" and not own else 1.0)
            curve = per_position_loss(model, w)
            out[mode][str(n)] = {
                "entropy": [round(e, 5) for e in layer_entropy(model, w[:, :-1])],
                "loss": float(curve.mean()),
                "past": float(curve[train_len:].mean()) if n > train_len else None,
            }
    model.set_scaling(None)
    model.set_logit_scale(1.0)
    return out


def variants_of(encoding: str, variants: Sequence[str]) -> list[str]:
    """The variants whose entropy a trained ``encoding`` model gives: itself, and for ``rope``
    the scalings among ``variants``."""
    return [encoding] + ([v for v in variants if v in SCALINGS] if encoding == "rope" else [])
