"""Self-Extend, ReRoPE and Dual Chunk Attention inside a ``transformers`` model:
:func:`patch_extension` and :func:`unpatch_extension`.

Each attention module of one model is rebound, like ``patch_rotary(fused=True)`` does (the class
is never touched, other models of the family are unchanged), to its class's ``forward`` with two
module-global names shadowed: ``apply_rotary_pos_emb`` returns q and k *unrotated*, and the
attention function is :func:`posemb.extension.attend`, which rotates each (query, key) pair by
the method's distance. So the KV cache holds unrotated keys: a method may be swapped mid-run,
and the keys never carry a distance chosen for another query.

A cache written that way is not one transformers can read, so it says so. Every cache layer the
patched attention writes is tagged (its class swapped to a subclass that adds nothing but a
check, and that pickles and deep-copies) and records the positions of the keys it holds:

- the patched attention refuses a layer that holds keys it did not write (rotated by
  transformers: start a new cache);
- the plain attention, after :func:`unpatch_extension`, is refused by the tagged layer when it
  tries to extend it, instead of reading unrotated keys as rotated ones.

The positions come from ``position_ids`` (which every decoder layer passes), so left- and
right-padded batches, sliding-window layers and ``generate`` need nothing more; the mask
transformers builds (causal, padding, sliding window) is applied as given.
"""

from __future__ import annotations

import contextvars
import inspect
import types
from typing import Any

import torch
from torch import nn

from .. import _checks
from .._errors import InputError
from ..extension import DualChunk, Extension, ReRoPE, SelfExtend, attend
from ..rope import RotaryEmbedding
from . import rebind

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
_RECORD = "_posemb_positions"  # on a cache layer: positions of the keys it holds
_inside: contextvars.ContextVar[bool] = contextvars.ContextVar("posemb_extension", default=False)


def _unrotated(q: torch.Tensor, k: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """The family's ``apply_rotary_pos_emb`` under the patch: q and k stay unrotated."""
    return q, k


def _extended_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """An attention interface of transformers' signature: q ``(B, Hq, S, D)``, k and v ``(B,
    Hk, T, D)`` unrotated; returns ``((B, S, Hq, D), None)`` as eager attention does."""
    method, rope, positions = kwargs[_KEY]
    if dropout:
        raise InputError(
            f"patch_extension runs attention without dropout; got dropout {dropout} (call "
            f"model.eval(), or set attention_dropout to 0)"
        )
    k_len = key.shape[2]
    qp = kwargs["position_ids"]
    kp = positions[:, -k_len:]
    hidden = _hidden(module, attention_mask, qp, kp, k_len)
    s = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
    out = attend(query, key, value, rope, method, qp, kp, hidden, s)
    return out.transpose(1, 2).contiguous(), None


def _hidden(
    module: nn.Module,
    mask: torch.Tensor | None,
    qp: torch.Tensor,
    kp: torch.Tensor,
    k_len: int,
) -> torch.Tensor:
    """True where a key is hidden, from the mask transformers built: None (causal, no padding:
    from the positions), ``(B, T)`` padding (flash-attention form), or ``(B, 1, S, T)`` bool
    (True: seen) or additive."""
    causal = (kp.unsqueeze(-2) > qp.unsqueeze(-1)).unsqueeze(1)
    if mask is None:
        return causal if getattr(module, "is_causal", True) else torch.zeros_like(causal)
    if mask.shape[-1] != k_len:
        raise InputError(
            f"the attention mask covers {mask.shape[-1]} keys, the cache returned {k_len}; "
            f"patch_extension needs a DynamicCache"
        )
    if mask.dim() == 2:
        return (mask == 0)[:, None, None, :] | causal
    if mask.dtype == torch.bool:
        return ~mask
    return mask < torch.finfo(mask.dtype).min / 2


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


class ExtendedForward:
    """The ``forward`` of one attention module under :func:`patch_extension`.

    Its class's ``forward`` with q and k left unrotated and posemb's attention; before it runs,
    the cache layer it will write is checked (a cache of rotated keys, another kind of cache, a
    batch that does not match the keys' positions are refused with nothing changed), and after
    it, the layer records the positions of its keys. Pickles as the module and the method.
    """

    def __init__(self, module: nn.Module, method: Extension, rope: RotaryEmbedding) -> None:
        self._module, self.method, self.rope = module, method, rope
        forward = type(module).forward
        assert isinstance(forward, types.FunctionType)  # _plan checked it
        fn = rebind.rebuilt(forward, _renames(type(module).__module__))
        self._bound = types.MethodType(fn, module)
        self.__signature__ = inspect.signature(self._bound)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        qp = kwargs.get("position_ids")
        if not isinstance(qp, torch.Tensor):
            raise InputError(
                f"{type(self._module).__name__} under patch_extension needs position_ids (the "
                f"decoder layer passes them); got {type(qp).__name__}"
            )
        qp = _checks.positions(qp, max_dim=2, name="position_ids")
        qp = qp.unsqueeze(0) if qp.dim() == 1 else qp
        _checks.within_limit("position_ids", qp)
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        layer = _layer(cache, getattr(self._module, "layer_idx", None))
        states = kwargs.get("hidden_states", args[0] if args else None)
        batch = states.shape[0] if isinstance(states, torch.Tensor) else qp.shape[0]
        held = _held(layer, qp, batch)
        positions = qp if held is None else _join(held, qp)
        kwargs.update(position_ids=qp, **{_KEY: (self.method, self.rope, positions)})
        token = _inside.set(True)
        try:
            out = self._bound(*args, **kwargs)
        finally:
            _inside.reset(token)
        layer = _layer(cache, getattr(self._module, "layer_idx", None))
        if layer is not None:
            _tag(layer)
            stored = layer.keys.shape[-2]
            setattr(layer, _RECORD, positions[:, positions.shape[1] - stored :])
            layer.__dict__["_posemb_keys"] = layer.keys
        return out

    def __reduce__(self) -> tuple[Any, ...]:
        return (ExtendedForward, (self._module, self.method, self.rope))


def _layer(cache: object, layer_idx: int | None) -> Any:
    """The cache layer this attention writes, or None without a cache (or before it exists)."""
    if cache is None:
        return None
    from transformers.cache_utils import DynamicCache

    if not isinstance(cache, DynamicCache) or type(cache).__name__ != "DynamicCache":
        raise InputError(
            f"patch_extension needs a DynamicCache (keys appended as they come), got "
            f"{type(cache).__name__}"
        )
    if layer_idx is None:
        raise InputError("the attention module has no layer_idx to find its cache layer by")
    layers = cache.layers
    return layers[layer_idx] if layer_idx < len(layers) else None


def _held(layer: Any, qp: torch.Tensor, batch: int) -> torch.Tensor | None:
    """The positions of the keys a cache layer holds (None when it holds none), checked."""
    if layer is None or not getattr(layer, "is_initialized", False):
        return None
    stored, rows = layer.keys.shape[-2], layer.keys.shape[0]
    if stored and batch != rows:
        raise InputError(f"the call is for {batch} sequences, the cache holds {rows}")
    record = getattr(layer, _RECORD, None)
    if record is None:
        if not stored:
            return None
        raise InputError(
            "this cache holds keys that patch_extension did not write (rotated by transformers); "
            "start a new cache (or none) with the patched model"
        )
    if layer.__dict__.get("_posemb_keys") is not layer.keys:
        # Changed outside the patched attention (crop, reorder, offload): positions shared by
        # every row survive it; per-row positions cannot be matched to reordered rows.
        if record.shape[0] > 1 and not bool((record == record[:1]).all()):
            raise InputError(
                "this cache was cropped or reordered outside the patched attention, and its "
                "rows hold keys at different positions; patch_extension cannot tell which row "
                "is which"
            )
        record = record[:1, :stored] if record.shape[1] >= stored else None
        if record is None:
            raise InputError("this cache holds more keys than patch_extension recorded")
    if record.shape[1] != stored:
        raise InputError(
            f"this cache layer holds {stored} keys but patch_extension recorded {record.shape[1]}"
        )
    return record


def _join(held: torch.Tensor, qp: torch.Tensor) -> torch.Tensor:
    b = max(held.shape[0], qp.shape[0])
    if {held.shape[0], qp.shape[0]} - {1, b}:
        raise InputError(
            f"position_ids are for {qp.shape[0]} sequences, the cache holds {held.shape[0]}"
        )
    return torch.cat((held.expand(b, -1), qp.to(held.device).expand(b, -1)), dim=1)


def _checked_update(self: Any, *args: Any, **kwargs: Any) -> Any:
    if not _inside.get():
        raise InputError(
            "this cache holds unrotated keys written under hf.patch_extension; the attention "
            "extending it now would read them as rotated. Patch the model again to go on, or "
            "start a new cache"
        )
    return super(type(self), self).update(*args, **kwargs)


_tagged: dict[type, type] = {}


def _tagged_class(base: type) -> type:
    """A subclass of a transformers cache layer whose ``update`` refuses plain attention."""
    if base not in _tagged:
        cls = type(f"Unrotated{base.__name__}", (base,), {"update": _checked_update})
        cls.__module__ = __name__
        _tagged[base] = cls
    return _tagged[base]


def _tag(layer: Any) -> None:
    base = type(layer)
    if base.__module__ != __name__:
        layer.__class__ = _tagged_class(base)


def __getattr__(name: str) -> type:
    """Unpickling a tagged cache layer: its class, made again from transformers' own."""
    if name.startswith("Unrotated"):
        from transformers import cache_utils

        base = getattr(cache_utils, name.removeprefix("Unrotated"), None)
        if isinstance(base, type):
            return _tagged_class(base)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The text model's attention modules: those whose class's forward rotates q and k."""
    from .targets import text_modules

    found = []
    for name, module in text_modules(model):
        forward = getattr(type(module), "forward", None)
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
    plan = []
    for name, module in _attention_modules(model):
        layer_type = getattr(module, "layer_type", None)
        if kinds is not None and layer_type not in kinds:
            continue
        if isinstance(method, DualChunk) and not getattr(module, "is_causal", True):
            raise InputError(f"{name} attends both ways; DualChunk is defined for causal only")
        current = module.__dict__.get("forward")
        if isinstance(current, ExtendedForward):
            plan.append((name, module, current.rope))
            continue
        if is_fused(module) or current is not None or "_old_forward" in module.__dict__:
            raise InputError(
                f"{name} ({type(module).__name__}) already has its own forward "
                f"({type(current).__name__}); patch_extension rebinds the class's forward "
                f"(unpatch_rotary a fused model first)"
            )
        missing = [n for n in _NEEDS if n not in _innermost(type(module).forward).__code__.co_names]
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
        plan.append((name, module, rope))
    if not plan:
        raise InputError(f"no attention of this {type(model).__name__} rotates q and k by RoPE")
    return plan


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
    for _, module, rope in plan:
        current = module.__dict__.get("forward")
        if isinstance(current, ExtendedForward):
            current.method = method
        else:
            module.forward = ExtendedForward(module, method, rope)
    return [name for name, _, _ in plan]


def unpatch_extension(model: nn.Module) -> list[str]:
    """Give every attention module :func:`patch_extension` rebound its class's ``forward``
    back; the dotted names restored. A cache filled under the patch stays unrotated and is
    refused by the restored attention: start a new one."""
    restored = []
    for name, module in model.named_modules():
        if isinstance(module.__dict__.get("forward"), ExtendedForward):
            del module.forward
            restored.append(name)
    return restored


def extension_of(model: nn.Module) -> Extension | None:
    """The method :func:`patch_extension` set on ``model``, or None."""
    for module in model.modules():
        forward = module.__dict__.get("forward")
        if isinstance(forward, ExtendedForward):
            return forward.method
    return None


__all__ = ["FAMILIES", "ExtendedForward", "extension_of", "patch_extension", "unpatch_extension"]
