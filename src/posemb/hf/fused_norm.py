"""QK-norm fused into the rotation inside ``transformers`` attention, for
``patch_rotary(model, fused=True)``.

Qwen3, Qwen3-MoE and Gemma 3 normalise each head of q and k (``q_norm``, ``k_norm``: RMSNorm over
head_dim) right before ``apply_rotary_pos_emb``. posemb fuses the pair into one pass
(:func:`posemb.kernels.norm_rotate`): the attention instance's rotation becomes one that also
applies its norms, and the norms' own ``forward`` hands its input on untouched
(:class:`Deferred`), so each norm's arithmetic runs once, inside the op. The norm modules stay
where they are, with their weights: ``state_dict``, checkpoints and optimisers see no change,
and unpatching gives them their class's ``forward`` back.

Only attention classes whose code is known to call the norms right before the rotation, and
nowhere else, are fused (:data:`FAMILIES`); each norm is checked on a probe when patched, and its
epsilon and weight form (Qwen's ``w * x / rms``, Gemma's ``(1 + w) * x / rms``) read from what it
computes. Anything else keeps the rotation fused and the norms separate, and says why
(:func:`why_not`). OLMo 2 and 3 normalise q and k across every head at once, before the reshape
into heads: not a per-head norm, so not fusable into a per-head pass.
"""

from __future__ import annotations

import math
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from .. import kernels
from .._errors import InputError

FAMILIES = ("Qwen3Attention", "Qwen3MoeAttention", "Gemma3Attention")
"""Attention classes whose forward normalises q and k per head and rotates them next."""


@dataclass(frozen=True)
class NormSpec:
    """What an attention's q and k norms compute: y = x / sqrt(mean(x^2) + eps) * (w + offset)."""

    eps: float
    offset: float


def _spec_of(norm: nn.Module, head_dim: int) -> NormSpec | str:
    """The eps and weight form of an RMSNorm module, checked on a probe; or why it is not one."""
    eps = _eps_of(norm)
    weight = getattr(norm, "weight", None)
    if not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
        return f"{type(norm).__name__} has no positive eps (variance_epsilon or eps)"
    if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != (head_dim,):
        return f"{type(norm).__name__}'s weight is not one per channel of a head ({head_dim})"
    forward = type(norm).forward
    g = torch.Generator().manual_seed(0)
    probe = torch.randn(2, 3, 5, head_dim, generator=g).to(weight.device)
    with torch.no_grad():
        got = forward(norm, probe).double()
        x = probe.double()
        normed = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
        # The closer form, and only if close: a weight of 120 puts w and 1 + w within 1%.
        errors = {}
        for offset in (0.0, 1.0):
            want = normed * (weight.double() + offset)
            errors[offset] = float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))
    offset = min(errors, key=errors.__getitem__)
    if errors[offset] <= 1e-5:  # the probe is float32 throughout: a few roundings
        return NormSpec(float(eps), offset)
    return (
        f"{type(norm).__name__} computes neither w * x / rms(x) nor (1 + w) * x / rms(x) on a probe"
    )


def _eps_of(norm: nn.Module) -> object:
    return getattr(norm, "variance_epsilon", getattr(norm, "eps", None))


def why_not(attention: nn.Module, head_dim: int) -> NormSpec | str | None:
    """The norm spec to fuse into ``attention``'s rotation; a reason when it has q and k norms
    that cannot be fused; None when it has none."""
    q_norm, k_norm = getattr(attention, "q_norm", None), getattr(attention, "k_norm", None)
    if not isinstance(q_norm, nn.Module) or not isinstance(k_norm, nn.Module):
        return None
    name = type(attention).__name__
    if name not in FAMILIES:
        return (
            f"{name} is not among the attentions whose per-head q and k norms come right before "
            f"the rotation ({', '.join(FAMILIES)})"
        )
    for norm in (q_norm, k_norm):
        if "forward" in norm.__dict__ and not isinstance(norm.__dict__["forward"], Deferred):
            return f"{type(norm).__name__} already has a forward of its own"
    specs = [_spec_of(norm, head_dim) for norm in (q_norm, k_norm)]
    for spec in specs:
        if isinstance(spec, str):
            return spec
    if specs[0] != specs[1]:
        return f"q_norm and k_norm differ in eps or weight form ({specs[0]} and {specs[1]})"
    assert isinstance(specs[0], NormSpec)
    return specs[0]


class Deferred:
    """A norm's ``forward`` while posemb's rotation applies it: returns its input as it is.

    Pickles as the norm it stands for, so a saved fused model loads fused."""

    def __init__(self, norm: nn.Module) -> None:
        self._norm = norm

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def __reduce__(self) -> tuple[object, ...]:
        return (Deferred, (self._norm,))


def defer(attention: nn.Module) -> list[str]:
    """Make ``attention``'s q and k norms hand their input on (the rotation applies them); the
    names of the norms deferred, relative to the attention."""
    for name in ("q_norm", "k_norm"):
        norm = getattr(attention, name)
        norm.forward = Deferred(norm)
    return ["q_norm", "k_norm"]


def restore(attention: nn.Module) -> list[str]:
    """Undo :func:`defer` (beneath an accelerate hook too, which keeps the forward it wraps as
    ``_old_forward``); the names of the norms restored."""
    restored = []
    for name in ("q_norm", "k_norm"):
        norm = getattr(attention, name, None)
        if not isinstance(norm, nn.Module):
            continue
        if isinstance(norm.__dict__.get("forward"), Deferred):
            del norm.forward
            restored.append(name)
        elif isinstance(norm.__dict__.get("_old_forward"), Deferred):
            norm.__dict__["_old_forward"] = types.MethodType(type(norm).forward, norm)
            restored.append(name)
    return restored


def _deferred(norm: nn.Module) -> bool:
    """Whether ``norm``'s forward (or the one an accelerate hook wraps) is this norm's
    :class:`Deferred`: it hands its input on, so the rotation must apply it."""
    for key in ("forward", "_old_forward"):
        f = norm.__dict__.get(key)
        if isinstance(f, Deferred):
            return f._norm is norm
    return False


def norm_rotation(attention: nn.Module, spec: NormSpec) -> Callable[..., tuple]:
    """``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` that first applies
    ``attention``'s q and k norms, in one pass (``cat([c, c])`` tables, rotate_half pairs).

    q ``(B, Hq, S, D)`` and k ``(B, Hk, S, D)`` as the attention hands them (its norms deferred:
    not yet normalised), cos and sin ``(B, S, r)``; returns ``(q', k')`` in q's dtype.

    It holds the attention weakly: its globals live in ``sys.modules`` until the attention is
    collected, which a strong reference would prevent. Its norms are read at each call (they
    may not exist yet when a pickled model is being rebuilt).
    """
    owner = weakref.ref(attention)

    def apply_rotary_pos_emb(
        q: torch.Tensor,
        k: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        unsqueeze_dim: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if unsqueeze_dim != 1:
            raise InputError(f"unsqueeze_dim must be 1 here, got {unsqueeze_dim}")
        n = cos.shape[-1] // 2
        attention = owner()
        assert attention is not None  # it is calling this
        q_norm, k_norm = attention.q_norm, attention.k_norm
        assert isinstance(q_norm, nn.Module) and isinstance(k_norm, nn.Module)
        q_deferred, k_deferred = _deferred(q_norm), _deferred(k_norm)
        eps = _eps_of(q_norm)
        if q_deferred and k_deferred and eps == _eps_of(k_norm) and isinstance(eps, float):
            q_weight, k_weight = q_norm.weight, k_norm.weight
            assert isinstance(q_weight, torch.Tensor) and isinstance(k_weight, torch.Tensor)
            # A decode step's layers: the tables cut once per step, the op called directly.
            out = _DERIVED(q, k, cos, sin, (q_weight, k_weight, eps, spec.offset))
            if out is not None:
                return out
            return kernels.norm_rotate(
                q, k, cos[..., :n], sin[..., :n], q_weight, k_weight, eps, spec.offset
            )
        # A norm replaced since (its own forward ran already) or q's and k's epsilons made to
        # differ: each deferred norm applied here as its class computes it, then the rotation.
        if q_deferred:
            q = type(q_norm).forward(q_norm, q)
        if k_deferred:
            k = type(k_norm).forward(k_norm, k)
        return kernels.rotate(q, k, cos[..., :n], sin[..., :n])

    apply_rotary_pos_emb.__doc__ = "posemb's fused QK-norm and rotation (rotate_half pairs)."
    return apply_rotary_pos_emb


# One for every fused attention: a step's tables are cut once for all its layers.
_DERIVED = kernels.fast.DerivedRotation(lambda t: t[..., : t.shape[-1] // 2], False)


__all__ = ["FAMILIES", "Deferred", "NormSpec", "defer", "norm_rotation", "restore", "why_not"]
