"""The KV cache under :func:`posemb.hf.patch_extension`: tagged layers that know the positions
of the unrotated keys they hold, through every change transformers makes to them.

A layer the patched attention writes is *tagged*: its class swapped for a subclass (made once
per transformers layer class; it pickles and deep-copies) whose ``update`` refuses the plain
attention, and whose ``crop``, ``reorder_cache``, ``batch_repeat_interleave`` and
``batch_select_indices`` carry the position record along: each runs transformers' own method
once on a stand-in layer whose keys are the positions, so the record is cut, reordered or
repeated exactly as the keys are (a sliding layer's crop keeps its last keys, a full layer's
its first; beam search reorders rows).
"""

from __future__ import annotations

import contextvars
import copy
from typing import Any

import torch
from torch import nn

from .. import _checks
from .._errors import InputError

RECORD = "_posemb_positions"  # on a cache layer: positions (batch or 1, keys) of its keys
_KEYS = "_posemb_keys"  # the keys tensor the record describes
inside: contextvars.ContextVar[bool] = contextvars.ContextVar("posemb_extension", default=False)


def layer_of(cache: object, layer_idx: int | None) -> Any:
    """The cache layer an attention writes, or None without a cache (or before it exists)."""
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


def held(layer: Any, batch: int) -> torch.Tensor | None:
    """The positions of the keys a cache layer holds (None when it holds none), checked."""
    if layer is None or not getattr(layer, "is_initialized", False):
        return None
    stored, rows = layer.keys.shape[-2], layer.keys.shape[0]
    if stored and batch != rows:
        raise InputError(f"the call is for {batch} sequences, the cache holds {rows}")
    record = getattr(layer, RECORD, None)
    if record is None:
        if not stored:
            return None
        raise InputError(
            "this cache holds keys that patch_extension did not write (rotated by transformers); "
            "start a new cache (or none) with the patched model"
        )
    if layer.__dict__.get(_KEYS) is not layer.keys or record.shape[1] != stored:
        raise InputError(
            f"this cache layer's keys were changed outside patch_extension and the cache "
            f"methods it follows (crop, reorder_cache, batch_repeat_interleave, "
            f"batch_select_indices): it holds {stored} keys, the record {record.shape[1]}"
        )
    return record


def join(record: torch.Tensor, qp: torch.Tensor) -> torch.Tensor:
    """The held positions followed by the call's, ``(batch, held + q_len)``."""
    b = max(record.shape[0], qp.shape[0])
    if {record.shape[0], qp.shape[0]} - {1, b}:
        raise InputError(
            f"position_ids are for {qp.shape[0]} sequences, the cache holds {record.shape[0]}"
        )
    return torch.cat((record.expand(b, -1), qp.to(record.device).expand(b, -1)), dim=1)


def remember(layer: Any, positions: torch.Tensor) -> None:
    """After the patched attention wrote ``layer``: tag it, record its keys' positions."""
    tag(layer)
    stored = layer.keys.shape[-2]
    setattr(layer, RECORD, positions[:, positions.shape[1] - stored :])
    layer.__dict__[_KEYS] = layer.keys


_STATE = ("keys", "values", "is_initialized", "cumulative_length", RECORD, _KEYS)


def snapshot(layer: Any) -> tuple[type, dict[str, Any]] | None:
    """What a refused call must leave as it was (a dynamic layer replaces its tensors when it
    appends, so keeping the references keeps the state)."""
    if layer is None:
        return None
    return type(layer), {n: layer.__dict__[n] for n in _STATE if n in layer.__dict__}


def restore(layer: Any, state: tuple[type, dict[str, Any]] | None) -> None:
    if layer is None or state is None:
        return
    cls, attrs = state
    for name in _STATE:
        if name in attrs:
            layer.__dict__[name] = attrs[name]
        else:
            layer.__dict__.pop(name, None)
    layer.__class__ = cls


def _checked_update(self: Any, *args: Any, **kwargs: Any) -> Any:
    if not inside.get():
        raise InputError(
            "this cache holds unrotated keys written under hf.patch_extension; the attention "
            "extending it now would read them as rotated. Patch the model again to go on, or "
            "start a new cache"
        )
    return super(type(self), self).update(*args, **kwargs)


def _follow(name: str) -> Any:
    """A cache method that changes the keys' rows or length, made to change the record alike."""

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        base = getattr(super(type(self), self), name)
        record = self.__dict__.get(RECORD)
        if record is not None and self.__dict__.get(_KEYS) is self.keys:
            stand_in = copy.copy(self)
            stand_in.__class__ = type(self).__mro__[1]
            rows = record.to(torch.float64).expand(self.keys.shape[0], -1)[:, None, :, None]
            stand_in.keys = stand_in.values = rows.contiguous()
            getattr(stand_in, name)(*args, **kwargs)
            record = stand_in.keys[:, 0, :, 0].to(record.dtype)
        out = base(*args, **kwargs)
        if record is not None:
            setattr(self, RECORD, record)
            self.__dict__[_KEYS] = self.keys
        return out

    method.__name__ = name
    return method


_FOLLOWED = ("crop", "reorder_cache", "batch_repeat_interleave", "batch_select_indices")
_tagged: dict[type, type] = {}


def tagged_class(base: type) -> type:
    """A subclass of a transformers cache layer whose ``update`` refuses plain attention and
    whose row and length changes carry the record along."""
    if base not in _tagged:
        methods: dict[str, Any] = {"update": _checked_update}
        methods.update({n: _follow(n) for n in _FOLLOWED if hasattr(base, n)})
        cls = type(f"Unrotated{base.__name__}", (base,), methods)
        cls.__module__ = "posemb.hf.extension"
        _tagged[base] = cls
    return _tagged[base]


def tag(layer: Any) -> None:
    if type(layer).__name__.startswith("Unrotated") and type(layer) in _tagged.values():
        return
    layer.__class__ = tagged_class(type(layer))


def dropout_message(dropout: float) -> str:
    return (
        f"patch_extension runs attention without dropout; got dropout {dropout} (call "
        f"model.eval(), or set attention_dropout to 0)"
    )


class CacheCheck:
    """A forward pre-hook on the text model: what would refuse a call inside a patched layer
    is checked before layer 0 runs, so a refused call appends nothing anywhere (a model whose
    first layers are not patched, as Gemma 3's sliding layers, would write them first): every
    patched layer's cache, dropout in training mode, the ``position_ids`` passed. Pickles and
    deep-copies with the model (it holds the patched attention modules)."""

    def __init__(self, modules: list[nn.Module]) -> None:
        self.modules = modules

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        for attention in self.modules:
            dropout = getattr(attention, "attention_dropout", 0.0) if attention.training else 0.0
            if dropout:
                raise InputError(dropout_message(dropout))
        qp = kwargs.get("position_ids")
        if isinstance(qp, torch.Tensor):
            _checks.within_limit("position_ids", _checks.positions(qp, name="position_ids"))
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if cache is None:
            return
        states = kwargs.get("inputs_embeds")
        ids = kwargs.get("input_ids", args[0] if args else None)
        source = states if isinstance(states, torch.Tensor) else ids
        batch = source.shape[0] if isinstance(source, torch.Tensor) else None
        for attention in self.modules:
            layer = layer_of(cache, getattr(attention, "layer_idx", None))
            if layer is not None and getattr(layer, "is_initialized", False):
                held(layer, layer.keys.shape[0] if batch is None else batch)


class TaggedCacheGuard:
    """The pre-hook :func:`~posemb.hf.unpatch_extension` leaves on the text model: a cache
    holding layers the patch wrote (unrotated keys) is refused before layer 0 runs, where the
    first layer to read one might come after others appended (Gemma 3)."""

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        layers = getattr(cache, "layers", None) or ()
        if any(type(layer) in _tagged.values() for layer in layers):
            raise InputError(
                "this cache holds unrotated keys written under hf.patch_extension; the "
                "unpatched model would read them as rotated. Patch the model again to go on, "
                "or start a new cache"
            )
