"""QK-norm fused into the rotation inside ``transformers`` attention, for
``patch_rotary(model, fused=True)``.

Qwen3, Qwen3-MoE and Gemma 3 normalise each head of q and k (``q_norm``, ``k_norm``: RMSNorm over
head_dim) right before ``apply_rotary_pos_emb``. posemb fuses the pair into one pass
(:func:`posemb.kernels.norm_rotate`): while a fused attention's ``forward`` runs, its norms hand
their input on untouched (:class:`Deferred`) and its rotation applies them, so each norm's
arithmetic runs once, inside the op. The norm modules stay where they are, with their weights:
``state_dict``, checkpoints and optimisers see no change, and unpatching gives them their
class's ``forward`` back.

A norm defers only where nothing could tell: inside its own attention's fused forward, with no
hook of any kind on it (its own or global: a hook would see or edit the un-normalised tensor),
its class's ``forward`` still the one probed when patched, and nothing tracing (under
``torch.compile`` the norm runs as written and the compiler fuses it). Anywhere else, a direct
call ``attn.q_norm(x)`` included, the norm computes as its class does, and the rotation does not
normalise again: each call records which norms deferred (:data:`_CALL`, per thread), and the
rotation applies exactly those.

Only attention classes whose code is known to call the norms right before the rotation, and
nowhere else, are fused (:data:`FAMILIES`); each norm is checked on a probe when patched, and its
epsilon and weight form (Qwen's ``w * x / rms``, Gemma's ``(1 + w) * x / rms``) read from what it
computes. The weights themselves are read at every call, never kept. Anything else keeps the
rotation fused and the norms separate, and says why (:func:`why_not`): a norm on the meta device
(weights not loaded yet) among them; patching again once they are loaded fuses it. OLMo 2 and 3
normalise q and k across every head at once, before the reshape into heads: not a per-head norm,
so not fusable into a per-head pass.
"""

from __future__ import annotations

import math
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.modules import module as _nn_module

from .. import _checks, kernels
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
    if weight.is_meta:
        return (
            f"{type(norm).__name__}'s weight is on the meta device (not loaded yet), so its "
            f"form cannot be probed; patch_rotary(model, fused=True) again after loading fuses it"
        )
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
    if q_norm is k_norm:
        return "q_norm and k_norm are one module"
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


class _Call(threading.local):
    """The fused attention whose forward runs now in this thread, its norms' form, and the
    norms of it that deferred their work to its rotation during this call."""

    attention: nn.Module | None = None
    spec: NormSpec | None = None
    deferred: tuple[nn.Module, ...] = ()


_CALL = _Call()


_State = tuple[nn.Module | None, NormSpec | None, tuple[nn.Module, ...]]


def begin(attention: nn.Module, spec: NormSpec) -> _State:
    """Mark ``attention``'s fused forward, whose norms compute ``spec``, as running in this
    thread; the state before, for :func:`end` (a try/finally, not a context manager: that
    costs ~1.5 us a layer at decode)."""
    call = _CALL
    before = call.attention, call.spec, call.deferred
    call.attention, call.spec, call.deferred = attention, spec, ()
    return before


def end(before: _State) -> None:
    """Put back the state :func:`begin` returned (re-entrant)."""
    call = _CALL
    call.attention, call.spec, call.deferred = before


def _unhooked(norm: nn.Module) -> bool:
    """No hook could see the norm's input or output: none of its own, none global."""
    return not (
        norm._forward_hooks
        or norm._forward_pre_hooks
        or norm._backward_hooks
        or norm._backward_pre_hooks
        or _nn_module._global_forward_hooks
        or _nn_module._global_forward_pre_hooks
        or _nn_module._global_backward_hooks
        or _nn_module._global_backward_pre_hooks
    )


class Deferred:
    """A norm's ``forward`` while posemb's rotation may apply it.

    Inside its attention's fused forward, unhooked, with its class's forward the one probed and
    nothing tracing, it hands its input on and records that it did (the rotation applies it);
    anywhere else it computes what its class computes. Pickles as the norm it stands for, so a
    saved fused model loads fused.
    """

    def __init__(self, norm: nn.Module) -> None:
        self._norm = norm
        self._probed = type(norm).forward

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        norm = self._norm
        forward = type(norm).forward
        if _checks.tracing():
            return forward(norm, x)
        call = _CALL
        attention = call.attention
        if (
            attention is None
            or forward is not self._probed
            or not _unhooked(norm)
            or not (
                attention._modules.get("q_norm") is norm or attention._modules.get("k_norm") is norm
            )
        ):
            return forward(norm, x)
        call.deferred = (*call.deferred, norm)
        return x

    def __reduce__(self) -> tuple[object, ...]:
        return (Deferred, (self._norm,))


def defer(attention: nn.Module) -> list[str]:
    """Install :class:`Deferred` as ``attention``'s q and k norms' ``forward``; the names of the
    norms, relative to the attention."""
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


def _plain_rotation(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    out = _DERIVED(q, k, cos, sin)
    if out is not None:
        return out
    return kernels.rotate(q, k, cos[..., :n], sin[..., :n])


def norm_rotation() -> Callable[..., tuple]:
    """``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` that first applies the running
    attention's q and k norms where they deferred to it (:func:`begin`), in one pass
    (``cat([c, c])`` tables, rotate_half pairs); a plain rotation where none did.

    q ``(B, Hq, S, D)`` and k ``(B, Hk, S, D)`` as the attention hands them, cos and sin
    ``(B, S, r)``; returns ``(q', k')`` in q's dtype. The norms' eps and weights are read at each
    call, the weight form (the offset) from the spec probed when the attention was patched.
    """

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
        if _checks.tracing():
            return _plain_rotation(q, k, cos, sin, n)  # no norm deferred while tracing
        call = _CALL
        attention, spec, deferred = call.attention, call.spec, call.deferred
        if attention is None or spec is None or not deferred:
            return _plain_rotation(q, k, cos, sin, n)
        call.deferred = ()  # applied once, here
        q_norm, k_norm = attention._modules["q_norm"], attention._modules["k_norm"]
        assert q_norm is not None and k_norm is not None
        q_deferred = any(m is q_norm for m in deferred)
        k_deferred = any(m is k_norm for m in deferred)
        eps = _eps_of(q_norm)
        if q_deferred and k_deferred and eps == _eps_of(k_norm) and isinstance(eps, float):
            q_weight, k_weight = q_norm.weight, k_norm.weight
            assert isinstance(q_weight, torch.Tensor) and isinstance(k_weight, torch.Tensor)
            # A decode step's layers: the op called directly, the weights as they are now.
            out = _DERIVED(q, k, cos, sin, (q_weight, k_weight, eps, spec.offset))
            if out is not None:
                return out
            return kernels.norm_rotate(
                q, k, cos[..., :n], sin[..., :n], q_weight, k_weight, eps, spec.offset
            )
        # q's and k's epsilons made to differ since: each deferred norm applied here as its
        # class computes it, then the rotation.
        if q_deferred:
            q = type(q_norm).forward(q_norm, q)
        if k_deferred:
            k = type(k_norm).forward(k_norm, k)
        return _plain_rotation(q, k, cos, sin, n)

    apply_rotary_pos_emb.__doc__ = "posemb's fused QK-norm and rotation (rotate_half pairs)."
    return apply_rotary_pos_emb


# What every fused attention with norms rotates through: it keeps nothing between calls.
_DERIVED = kernels.fast.DerivedRotation(1, False)
NORM_ROTATION = norm_rotation()
"""The one ``apply_rotary_pos_emb`` of every attention whose norms are fused."""


__all__ = [
    "FAMILIES",
    "NORM_ROTATION",
    "Deferred",
    "NormSpec",
    "begin",
    "defer",
    "end",
    "norm_rotation",
    "restore",
    "why_not",
]
