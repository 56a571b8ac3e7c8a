"""Self-Extend, ReRoPE and Dual Chunk Attention inside a ``transformers`` model:
:func:`patch_extension` and :func:`unpatch_extension`.

Each attention module of one model is swapped, like ``patch_rotary(fused=True)`` does, into a
subclass of its own class (:class:`ExtendedAttention`; the class is never touched, other models
of the family are unchanged) whose ``forward`` is the class's with two module-global names
shadowed: ``apply_rotary_pos_emb`` returns q and k *unrotated*, and the attention function is
:func:`posemb.extension.attend`, which rotates each (query, key) pair by the method's distance.
So the KV cache holds unrotated keys: a method may be swapped mid-run, and the keys never carry
a distance chosen for another query.

A cache written that way is not one transformers can read, so it says so. Every cache layer the
patched attention writes is tagged (its class swapped to a subclass that adds nothing but a
check, and that pickles and deep-copies) and records the positions of the keys it holds:

- the patched attention refuses a layer that holds keys it did not write (rotated by
  transformers: start a new cache);
- the plain attention, after :func:`unpatch_extension`, is refused (by a pre-hook the unpatch
  leaves on the text model, before any layer runs; and by the tagged layer when it tries to
  extend it), instead of reading unrotated keys as rotated ones.

The positions come from ``position_ids`` (which every decoder layer passes), so left- and
right-padded batches, sliding-window layers and ``generate`` need nothing more; the mask is
read in the form the model's ``attn_implementation`` passes it (:mod:`.extension_masks`), and
the record of positions follows transformers' crop and reorder (:mod:`.extension_cache`).
"""

from __future__ import annotations

import functools
import types
import warnings
from typing import Any

import torch
from torch import nn

from .. import _checks
from .._errors import InputError
from ..extension import DualChunk, Extension, ReRoPE, SelfExtend, attend
from ..rope import RotaryEmbedding
from . import rebind
from .extension_cache import (
    CacheCheck,
    TaggedCacheGuard,
    dropout_message,
    held,
    inside,
    join,
    layer_of,
    remember,
    restore,
    snapshot,
    tagged_class,
)
from .extension_masks import check_form, visibility

# The families whose attention posemb expresses (model_type of the text config), and which layer
# types it extends: Gemma 3's sliding layers have their own local RoPE and a window far inside
# training, so only its global layers are extended.
FAMILIES: dict[str, frozenset[str] | None] = {
    "llama": None,
    "mistral": None,
    "qwen2": None,
    "qwen3": None,
    "gemma3_text": frozenset({"full_attention"}),
}
# The names a family's forward must call for the shadows to take effect.
_NEEDS = ("apply_rotary_pos_emb", "ALL_ATTENTION_FUNCTIONS")
_KEY = "_posemb_extension"  # the kwarg carrying (method, rope, positions) to the attention
_HOOK = "_posemb_extension_check"  # on the text model: the handle of its CacheCheck pre-hook


def _unrotated(q: torch.Tensor, k: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """The family's ``apply_rotary_pos_emb`` under the patch: q and k stay unrotated."""
    return q, k


def _extended_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: object,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """An attention interface of transformers' signature: q ``(B, Hq, S, D)``, k and v ``(B,
    Hk, T, D)`` unrotated; returns ``((B, S, Hq, D), None)`` as eager attention does."""
    method, rope, positions = kwargs[_KEY]
    if dropout:  # checked before the cache was touched; a direct call is checked here
        raise InputError(dropout_message(dropout))
    k_len = key.shape[2]
    qp = kwargs["position_ids"]
    kp = positions[:, -k_len:]
    shape = (query.shape[0], query.shape[2], k_len)
    vis = visibility(module, attention_mask, kwargs, qp, kp, shape)
    s = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
    out = attend(query, key, value, rope, method, qp, kp, vis, s)
    return out.transpose(1, 2).contiguous(), None


class _Interface:
    """``ALL_ATTENTION_FUNCTIONS`` in the shadowed module: every implementation is posemb's."""

    def get_interface(self, implementation: object, default: object = None) -> Any:
        return _extended_attention

    def __getitem__(self, implementation: object) -> Any:
        return _extended_attention


def _renames(module_name: str) -> dict[str, str]:
    """The two names the extended forward reads as posemb's, installed in the modeling module
    (:mod:`posemb.hf.rebind`: every other global is read live, as the class's forward reads it)."""
    return {
        "apply_rotary_pos_emb": rebind.install(
            module_name, f"{rebind.PREFIX}unrotated", _unrotated
        ),
        "ALL_ATTENTION_FUNCTIONS": rebind.install(
            module_name, f"{rebind.PREFIX}extended_interface", _Interface()
        ),
    }


class ExtendedAttention(rebind.Swapped):
    """The class of an attention module under :func:`patch_extension`: a subclass of its own
    class and of this one (same names; the class itself is never touched) whose ``forward`` is
    the class's with q and k left unrotated and posemb's attention. The method and the rope
    are the module's own (an attribute, so patching again swaps the method in place).

    Before the forward runs, the call is checked (dropout, the mask's form, the cache layer it
    will write: a cache of rotated keys, another kind of cache, a batch that does not match the
    keys' positions), and a call that fails inside leaves the layer as it was; after it, the
    layer records the positions of its keys. Copies, replicas and pickles keep the class and
    compute with their own weights (see :class:`posemb.hf.rebind.Swapped`).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is ExtendedAttention:  # ExtendedForward(module, method, rope): an old pickle
            return _extended_again(*args, **kwargs)
        return super().__new__(cls)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # type: ignore[misc]
        if self.__dict__.get("forward") is _REPLACED:
            del self.__dict__["forward"]

    @property
    def posemb_extension(self) -> tuple[Extension, RotaryEmbedding]:
        """The method and the model's rope this attention runs under."""
        return self.__dict__[_STATE]


_STATE = "_posemb_extension_state"
_REPLACED = object()  # an earlier release's instance forward, dropped by __setstate__
_extended_classes: dict[type, type] = {}


def extended_class(base: Any) -> type:
    """The :class:`ExtendedAttention` subclass of attention class ``base`` (one per process)."""
    if base not in _extended_classes:
        forward = base.forward
        assert isinstance(forward, types.FunctionType)  # _plan checked it
        fn = rebind.rebuilt(forward, _renames(base.__module__))
        _extended_classes[base] = rebind.subclass(
            base, ExtendedAttention, {"forward": _checked_forward(fn)}, (extended_class, (base,))
        )
    return _extended_classes[base]


def _extended_again(module: nn.Module, method: Extension, rope: RotaryEmbedding) -> object:
    """Unpickling a model an earlier posemb pickled under patch_extension (its forward was an
    instance attribute): the module's class swapped, the method and rope kept."""
    module.__class__ = extended_class(type(module))
    module.__dict__[_STATE] = (method, rope)
    return _REPLACED


def _checked_forward(fn: types.FunctionType) -> Any:
    """The extended ``forward``: the call checked, ``fn`` run, the cache layer's record kept."""

    @functools.wraps(fn)  # inspect.signature follows __wrapped__ to the class's parameters
    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        method, rope = self.__dict__[_STATE]
        qp = kwargs.get("position_ids")
        if not isinstance(qp, torch.Tensor):
            raise InputError(
                f"{type(self).__name__} under patch_extension needs position_ids (the "
                f"decoder layer passes them); got {type(qp).__name__}"
            )
        qp = _checks.positions(qp, max_dim=2, name="position_ids")
        qp = qp.unsqueeze(0) if qp.dim() == 1 else qp
        _checks.within_limit("position_ids", qp)
        dropout = getattr(self, "attention_dropout", 0.0) if self.training else 0.0
        if dropout:
            raise InputError(dropout_message(dropout))
        check_form(kwargs.get("attention_mask", args[2] if len(args) > 2 else None))
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        layer = layer_of(cache, getattr(self, "layer_idx", None))
        states = kwargs.get("hidden_states", args[0] if args else None)
        batch = states.shape[0] if isinstance(states, torch.Tensor) else qp.shape[0]
        record = held(layer, batch)
        positions = qp if record is None else join(record, qp)
        kwargs.update(position_ids=qp, **{_KEY: (method, rope, positions)})
        before = snapshot(layer)
        token = inside.set(True)
        try:
            out = fn(self, *args, **kwargs)
        except BaseException:
            restore(layer, before)
            raise
        finally:
            inside.reset(token)
        layer = layer_of(cache, getattr(self, "layer_idx", None))
        if layer is not None:
            remember(layer, positions)
        return out

    return forward


def __getattr__(name: str) -> type:
    """Unpickling a tagged cache layer: its class, made again from transformers' own; and
    ``ExtendedForward``, the name :class:`ExtendedAttention` had before this release."""
    if name == "ExtendedForward":
        warnings.warn(
            f"{__name__}.ExtendedForward is renamed {__name__}.ExtendedAttention (the patched "
            f"module's class, no longer an object in its __dict__)",
            DeprecationWarning,
            stacklevel=2,
        )
        return ExtendedAttention
    if name.startswith("Unrotated"):
        from transformers import cache_utils

        base = getattr(cache_utils, name.removeprefix("Unrotated"), None)
        if isinstance(base, type):
            return tagged_class(base)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The text model's attention modules: those whose class's forward rotates q and k."""
    from .targets import text_modules

    found = []
    for name, module in text_modules(model):
        forward = getattr(rebind.base_of(type(module)), "forward", None)
        if not isinstance(forward, types.FunctionType):
            continue
        from .fused import _innermost

        names = _innermost(forward).__code__.co_names
        if any(n.startswith("apply_rotary") for n in names):
            found.append((name, module))
    return found


def _plan(model: nn.Module, method: Extension) -> list[tuple[str, nn.Module, RotaryEmbedding]]:
    """What patch_extension will change, every refusal made before anything is."""
    from .config import rotary_from_config
    from .fused import _innermost, is_fused
    from .targets import text_config

    if not isinstance(method, (SelfExtend, ReRoPE, DualChunk)):
        raise InputError(
            f"method must be posemb.SelfExtend, ReRoPE or DualChunk, got {type(method).__name__}"
        )
    config = text_config(model)
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES:
        raise InputError(
            f"patch_extension expresses the attention of {', '.join(sorted(FAMILIES))}; this "
            f"{type(model).__name__} is {model_type!r}"
        )
    kinds = FAMILIES[model_type]
    ropes: dict[str | None, RotaryEmbedding] = {}
    plan: list[tuple[str, nn.Module, RotaryEmbedding]] = []
    for name, module in _attention_modules(model):
        layer_type = getattr(module, "layer_type", None)
        if kinds is not None and layer_type not in kinds:
            continue
        if isinstance(method, DualChunk) and not getattr(module, "is_causal", True):
            raise InputError(f"{name} attends both ways; DualChunk is defined for causal only")
        current = module.__dict__.get("forward")
        if isinstance(module, ExtendedAttention) and current is None:
            plan.append((name, module, module.posemb_extension[1]))
            continue
        if is_fused(module) or current is not None or "_old_forward" in module.__dict__:
            raise InputError(
                f"{name} ({type(module).__name__}) already has its own forward "
                f"({type(current).__name__}); patch_extension rebinds the class's forward "
                f"(unpatch_rotary a fused model first)"
            )
        own = rebind.base_of(type(module)).forward
        missing = [n for n in _NEEDS if n not in _innermost(own).__code__.co_names]
        if missing:
            raise InputError(
                f"{type(module).__name__} does not call {', '.join(missing)}; patch_extension "
                f"cannot express its attention"
            )
        if getattr(module, "attn_logit_softcapping", None) is not None:
            raise InputError(
                f"{type(module).__name__} caps its logits (attn_logit_softcapping), which "
                f"patch_extension's attention does not"
            )
        if layer_type not in ropes:
            ropes[layer_type] = rotary_from_config(config, layer_type if kinds else None)
        rope = ropes[layer_type]
        if getattr(module, "head_dim", rope.head_dim) != rope.head_dim:
            raise InputError(
                f"{name} has head_dim {module.head_dim}, its config's RoPE {rope.head_dim}"
            )
        _same_width(model, layer_type if kinds else None, rope)
        plan.append((name, module, rope))
    if not plan:
        raise InputError(f"no attention of this {type(model).__name__} rotates q and k by RoPE")
    return plan


def _same_width(model: nn.Module, layer_type: str | None, rope: RotaryEmbedding) -> None:
    """Refuse a config whose rotary width transformers does not use: its rotary module's
    ``inv_freq`` has one entry per rotated pair (Llama and Qwen3 ignore
    ``partial_rotary_factor`` and rotate the whole head; posemb reads the config's width)."""
    names = ("inv_freq",) if layer_type is None else (f"{layer_type}_inv_freq", "inv_freq")
    for module in model.modules():
        if not type(module).__name__.endswith("RotaryEmbedding"):
            continue
        buffers = dict(module.named_buffers(recurse=False))
        inv = next((buffers[n] for n in names if n in buffers), None)
        if inv is not None and 2 * inv.numel() != rope.rotary_dim:
            raise InputError(
                f"transformers' {type(module).__name__} rotates {2 * inv.numel()} channels of "
                f"each head, the config's RoPE {rope.rotary_dim} (partial_rotary_factor, which "
                f"this family ignores); patch_extension refuses the disagreement: remove "
                f"partial_rotary_factor from the config, or set it to what the model rotates"
            )
        return


def _text_model(model: nn.Module, modules: list[nn.Module]) -> nn.Module | None:
    """The module whose ``layers`` hold the patched attention (the decoder the cache is
    passed to), or None."""
    inside_ = {id(m) for m in modules}
    for candidate in model.modules():
        layers = getattr(candidate, "layers", None)
        if isinstance(layers, nn.ModuleList) and any(id(m) in inside_ for m in layers.modules()):
            return candidate
    return None


def _hook(model: nn.Module, plan: list[tuple[str, nn.Module, RotaryEmbedding]]) -> None:
    """Install (or refresh) the pre-hook that checks the cache whole before layer 0 runs."""
    text = _text_model(model, [module for _, module, _ in plan])
    if text is None:
        return
    _install(text, CacheCheck([module for _, module, _ in plan]))


def _install(text: nn.Module, hook: CacheCheck | TaggedCacheGuard) -> None:
    """``hook`` as the text model's one posemb pre-hook (replacing the one before)."""
    old = text.__dict__.get(_HOOK)
    if old is not None:
        old.remove()
    text.__dict__[_HOOK] = text.register_forward_pre_hook(hook, with_kwargs=True)


def patch_extension(model: nn.Module, method: Extension) -> list[str]:
    """Run ``model``'s attention under a training-free context extension.

    Every attention layer of the text model (Gemma 3: its global layers) attends as
    :func:`posemb.extended_attention` does: q and k unrotated, each pair rotated by the
    method's distance, the query scaling applied when the method asks. ``generate`` and the
    ``DynamicCache`` work as before; the cache then holds unrotated keys and refuses to be
    extended by the unpatched model. Patching again with another method swaps it in place (the
    cache stays valid: its keys are unrotated).

    Args:
        model: a ``transformers`` Llama, Mistral, Qwen2, Qwen3 or Gemma 3 model (any head:
            ``*ForCausalLM``, the base model); random or trained weights.
        method: :class:`posemb.SelfExtend`, :class:`posemb.ReRoPE` or
            :class:`posemb.DualChunk`.

    Returns:
        The dotted names of the attention modules patched.

    Raises:
        ValueError: another family, an attention the patch cannot express (softcapped logits,
            a forward that is not the family's, a fused model), a bad method; nothing is
            changed.
    """
    plan = _plan(model, method)
    classes = [extended_class(rebind.base_of(type(module))) for _, module, _ in plan]
    for (_, module, rope), cls in zip(plan, classes, strict=True):
        module.__class__ = cls
        module.__dict__[_STATE] = (method, rope)
    _hook(model, plan)
    return [name for name, _, _ in plan]


def unpatch_extension(model: nn.Module) -> list[str]:
    """Give every attention module :func:`patch_extension` swapped its own class
    back; the dotted names restored. A cache filled under the patch stays unrotated and is
    refused by the restored model before its first layer runs (a pre-hook stays on the text
    model for that): start a new one."""
    restored = []
    for name, module in model.named_modules():
        if isinstance(module, ExtendedAttention):
            module.__class__ = rebind.base_of(type(module))
            module.__dict__.pop(_STATE, None)
            restored.append(name)
        if _HOOK in module.__dict__:  # a cache the patch wrote stays refused as a whole
            _install(module, TaggedCacheGuard())
    return restored


def extension_of(model: nn.Module) -> Extension | None:
    """The method :func:`patch_extension` set on ``model``, or None."""
    for module in model.modules():
        if isinstance(module, ExtendedAttention):
            return module.posemb_extension[0]
    return None


__all__ = [
    "FAMILIES",
    "ExtendedAttention",
    "extended_class",
    "extension_of",
    "patch_extension",
    "unpatch_extension",
]
