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
import sys
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as _nn_module

from .. import _checks, _renamed, kernels
from .._errors import InputError
from . import rebind

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
        if "forward" in norm.__dict__:
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
    """The fused attention whose forward runs now in this thread, the code object of that
    forward (the caller a deferring norm must have), and the norms that deferred their work to
    its rotation during this call."""

    attention: nn.Module | None = None
    code: types.CodeType | None = None
    deferred: tuple[tuple[Any, float], ...] = ()


_CALL = _Call()


_State = tuple[nn.Module | None, types.CodeType | None, tuple[tuple[Any, float], ...]]


def begin(attention: nn.Module, code: types.CodeType) -> _State:
    """Mark ``attention``'s fused forward, whose code is ``code``, as running in this thread;
    the state before, for :func:`end` (a try/finally, not a context manager: that costs ~1.5
    us a layer at decode)."""
    call = _CALL
    before = call.attention, call.code, call.deferred
    call.attention, call.code, call.deferred = attention, code, ()
    return before


def end(before: _State) -> None:
    """Put back the state :func:`begin` returned (re-entrant)."""
    call = _CALL
    call.attention, call.code, call.deferred = before


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


_CALL_MACHINERY = _nn_module.__file__  # torch's Module.__call__ and _call_impl live here


def _caller() -> tuple[object, types.CodeType | None]:
    """The module torch is calling (the ``self`` of its nearest call frame, or None when the
    forward was called directly) and the code that called it, from the frames above the
    :class:`Deferred` that asks."""
    frame: types.FrameType | None = sys._getframe(2)
    module: object = None
    while frame is not None and frame.f_code.co_filename == _CALL_MACHINERY:
        if module is None:
            module = frame.f_locals.get("self")
        frame = frame.f_back
    return module, None if frame is None else frame.f_code


def _methods(cls: type) -> dict[str, object]:
    """The functions of ``cls`` and its bases below ``nn.Module``: what it computes with."""
    out: dict[str, object] = {}
    for base in reversed(cls.__mro__):
        if issubclass(base, nn.Module) and base is not nn.Module:
            out.update({k: v for k, v in vars(base).items() if callable(v)})
    return out


_DEFER = "_posemb_deferred"  # a deferring norm's own data: (offset, its names, its methods)
_REPLACED = object()  # an earlier release's instance forward, dropped by __setstate__


class DeferredNorm(rebind.Swapped):
    """The class of a q or k norm while posemb's rotation may apply it: a subclass of the
    norm's own class (same names; the class itself is never touched) whose ``forward`` hands
    its input on, and records that it did (the rotation applies the norm), only when nothing
    could tell: called by its own attention's fused forward code (not by a hook, a wrapper or
    other code running inside it), the norm unhooked, its class's methods and its own
    attributes those probed when patched, its eps positive, nothing tracing. Anywhere else it
    computes what its class computes. The weight form probed on this norm (Gemma's ``1 + w``)
    is the norm's own data, so a norm moved to another attention keeps its own; a method binds
    to whichever instance calls it, so a copy or a replica computes with its own weights (an
    earlier release kept a ``Deferred`` bound to the original norm in each ``__dict__``).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is DeferredNorm:  # Deferred(norm, offset, names): an earlier release's pickle
            return _deferred_again(*args, **kwargs)
        return super().__new__(cls)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # type: ignore[misc]
        if self.__dict__.get("forward") is _REPLACED:
            del self.__dict__["forward"]

    @property
    def posemb_offset(self) -> float:
        """The weight form probed on this norm: 0.0 (``w * x``) or 1.0 (``(1 + w) * x``)."""
        return float(self.__dict__[_DEFER][0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base: Any = rebind.base_of(type(self))
        if _checks.tracing():  # under a compiler the norm runs as written, and is fused there
            return base.forward(self, x)
        _, code = _caller()
        call = _CALL
        attention = call.attention
        if (
            attention is None
            or code is not call.code
            or not (
                attention._modules.get("q_norm") is self or attention._modules.get("k_norm") is self
            )
            or not _as_probed(self)
        ):
            return base.forward(self, x)
        call.deferred = (*call.deferred, (self, self.posemb_offset))
        return x


def _as_probed(norm: Any) -> bool:
    record = norm.__dict__.get(_DEFER)
    if record is None:  # made by calling the class (type(norm)(...)): nothing was probed
        return False
    _, names, methods = record
    base = rebind.base_of(type(norm))
    eps = _eps_of(norm)
    return (
        isinstance(eps, float)
        and 0.0 < eps < math.inf
        and norm.__dict__.keys() == names
        and all(getattr(base, k, None) is v for k, v in methods.items())
        and _unhooked(norm)
    )


_deferred_classes: dict[type, type] = {}


def deferred_class(base: Any) -> type:
    """The :class:`DeferredNorm` subclass of norm class ``base`` (one per process)."""
    if base not in _deferred_classes:
        _deferred_classes[base] = rebind.subclass(base, DeferredNorm, {}, (deferred_class, (base,)))
    return _deferred_classes[base]


def _deferring(norm: nn.Module, offset: float) -> None:
    """Swap ``norm`` into its deferring class, with its offset and what was probed."""
    base = rebind.base_of(type(norm))
    norm.__dict__.pop(_DEFER, None)
    names = frozenset(norm.__dict__) | {_DEFER}
    norm.__dict__[_DEFER] = (float(offset), names, _methods(base))
    norm.__class__ = deferred_class(base)


def _deferred_again(
    norm: nn.Module, offset: float = 0.0, names: frozenset[str] | None = None
) -> object:
    """Unpickling a norm an earlier posemb pickled deferring (a ``Deferred`` in its
    ``__dict__``): the norm swapped into its deferring class. Its attributes are not back yet
    (the old forward is among them): what it will hold is its pickled names, this one's
    swapped for the new record's."""
    base = rebind.base_of(type(norm))
    held = (names or frozenset()) - {"forward"} | {_DEFER}
    norm.__dict__[_DEFER] = (float(offset), held, _methods(base))
    norm.__class__ = deferred_class(base)
    return _REPLACED


def defer(attention: nn.Module, spec: NormSpec) -> list[str]:
    """Swap ``attention``'s q and k norms into their :class:`DeferredNorm` class, with the
    weight form ``spec`` probed on them; the names of the norms, relative to the attention."""
    for name in ("q_norm", "k_norm"):
        _deferring(getattr(attention, name), spec.offset)
    return ["q_norm", "k_norm"]


def restore(attention: nn.Module) -> list[str]:
    """Undo :func:`defer` (beneath an accelerate hook too, which keeps the forward it wraps as
    ``_old_forward``); the names of the norms restored."""
    restored = []
    for name in ("q_norm", "k_norm"):
        norm = getattr(attention, name, None)
        if not isinstance(norm, DeferredNorm):
            continue
        base: Any = rebind.base_of(type(norm))
        norm.__class__ = base
        norm.__dict__.pop(_DEFER, None)
        if isinstance(norm.__dict__.get("_old_forward"), types.MethodType):
            norm.__dict__["_old_forward"] = types.MethodType(base.forward, norm)
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
    call, the weight form (the offset) from what was probed on each norm when patched.
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
        attention, deferred = call.attention, call.deferred
        if attention is None or not deferred:
            return _plain_rotation(q, k, cos, sin, n)
        call.deferred = ()  # applied once, here
        q_norm, k_norm = attention._modules["q_norm"], attention._modules["k_norm"]
        assert q_norm is not None and k_norm is not None
        q_def = next((off for norm, off in deferred if norm is q_norm), None)
        k_def = next((off for norm, off in deferred if norm is k_norm), None)
        eps = _eps_of(q_norm)
        if (
            q_def is not None
            and k_def is not None
            and q_def == k_def
            and eps == _eps_of(k_norm)
            and isinstance(eps, float)
        ):
            q_weight, k_weight = q_norm.weight, k_norm.weight
            assert isinstance(q_weight, torch.Tensor) and isinstance(k_weight, torch.Tensor)
            # A decode step's layers: the op called directly, the weights as they are now.
            out = _DERIVED(q, k, cos, sin, (q_weight, k_weight, eps, q_def))
            if out is not None:
                return out
            return kernels.norm_rotate(
                q, k, cos[..., :n], sin[..., :n], q_weight, k_weight, eps, q_def
            )
        # q's and k's epsilons or weight forms differ: each deferred norm applied here as its
        # class computes it, then the rotation.
        if q_def is not None:
            q = rebind.base_of(type(q_norm)).forward(q_norm, q)
        if k_def is not None:
            k = rebind.base_of(type(k_norm)).forward(k_norm, k)
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
    "DeferredNorm",
    "NormSpec",
    "begin",
    "defer",
    "deferred_class",
    "end",
    "norm_rotation",
    "restore",
    "why_not",
]

# Before this release a deferring norm held a Deferred object in its __dict__.
__getattr__ = _renamed.module_getattr(__name__, {"Deferred": "DeferredNorm"}, globals())
