"""Re-rotating the keys a ``transformers`` cache holds, when the model's RoPE schedule changes
while it is live.

Phi-3's LongRoPE (and dynamic NTK) picks its frequencies by the sequence length: once a
generation passes ``original_max_position_embeddings``, new tokens rotate with the long factors
while the keys cached before the switch keep the short ones, so cached decoding stops agreeing
with a fresh prefill of the same tokens (transformers PR #33129, llama.cpp #8995 and
onnxruntime-genai #1161 are this bug). :func:`rerotate_cache` turns each cached key from the
schedule of one length to that of another, with the angle difference formed in float64
(:meth:`posemb.RotaryEmbedding.rerotate`). That makes the first changed layer's keys what a
fresh prefill writes; every later layer's keys and values were computed from what the layers
before attended under the old schedule, which no rotation undoes, so a deeper cache is refused
unless asked to approximate, and :func:`schedule_changes` says when a fresh prefill is due.
"""

from __future__ import annotations

import torch

from .. import _checks
from .._errors import InputError
from ..rope import RotaryEmbedding
from ..scaling import cached_compute
from .config import model_rope
from .spec import ModelRope, RopeSpec


def _layer_specs(mr: ModelRope, layers: int) -> list[RopeSpec | None]:
    rotating = [k for k in mr.kinds if k.spec is not None]
    specs: list[RopeSpec | None] = []
    for i in range(layers):
        listed = [k for k in mr.kinds if i in k.layers]
        if listed:
            specs.append(listed[0].spec)
        elif len(rotating) == 1 and len(mr.kinds) == 1:
            specs.append(rotating[0].spec)
        else:
            raise InputError(
                f"the config does not say which layer kind layer {i} is, so its cached keys "
                f"cannot be re-rotated"
            )
    return specs


def _module(spec: RopeSpec) -> RotaryEmbedding:
    if spec.mrope_section is not None:
        raise InputError(
            "multimodal RoPE keys turn by three position axes; rerotate_cache re-rotates "
            "text positions only"
        )
    return RotaryEmbedding(
        spec.head_dim, base=spec.base, rotary_dim=spec.rotary_dim, scaling=spec.scaling,
        layout=spec.layout,
    )  # fmt: skip


def _holds_keys(layer: object) -> bool:
    keys = getattr(layer, "keys", None)
    return isinstance(keys, torch.Tensor) and keys.numel() > 0


def _changes(spec: RopeSpec, from_length: int, to_length: int) -> bool:
    """Whether the spec's frequencies or attention factor differ between the two lengths (read
    from the schedule alone, so an M-RoPE spec answers too)."""

    def at(n: int) -> tuple[torch.Tensor, float]:
        return cached_compute(spec.scaling, spec.rotary_dim, spec.base, "cpu", n)

    (inv_a, fa), (inv_b, fb) = at(from_length), at(to_length)
    return fa != fb or not torch.equal(inv_a, inv_b)


def _changed_layers(config: object, layers: int, from_length: int, to_length: int) -> list[int]:
    specs = _layer_specs(model_rope(config), layers)
    return [
        i for i, spec in enumerate(specs)
        if spec is not None and _changes(spec, from_length, to_length)
    ]  # fmt: skip


def schedule_changes(config: object, from_length: int, to_length: int) -> bool:
    """Does any layer's RoPE schedule differ between a sequence of ``from_length`` tokens and
    one of ``to_length``? When it does, the keys cached at ``from_length`` are stale for the
    coming forward: LongRoPE once, as it passes its original length; dynamic NTK at every
    step past it.

    The exact remedy is to run that forward without the cache over every token so far (a
    fresh prefill), which is what transformers' Phi-3 ``generate`` does; :func:`rerotate_cache`
    is the cheap one, exact only for a model with one rotating layer.
    """
    from_length = _checks.positive_int("from_length", from_length)
    to_length = _checks.positive_int("to_length", to_length)
    mr = model_rope(config)
    rotating = [k.spec for k in mr.kinds if k.spec is not None]
    return any(_changes(spec, from_length, to_length) for spec in rotating)


def rerotate_cache(
    config: object,
    cache: object,
    *,
    from_length: int,
    to_length: int,
    approximate: bool = False,
    positions: torch.Tensor | None = None,
) -> int:
    """Re-rotate every key of a ``transformers`` cache from the RoPE schedule of a sequence of
    ``from_length`` tokens to that of ``to_length``, in place.

    Call it before the forward whose length crosses a schedule's switch (LongRoPE passing its
    original length, every step of dynamic NTK), with the length the cache was written at and
    the length of that forward. Layers whose schedule is the same at both lengths, and layers
    without RoPE, are left untouched.

    Only the first layer whose schedule changed comes out as a fresh prefill would write it.
    The keys and values of every later layer were computed from hidden states that the layers
    before attended under the old schedule, and no rotation changes that: on a 2-layer Phi-3
    with LongRoPE (tests/test_hf_cache.py), re-rotating cut the worst logit gap past the
    switch from 5.5e-3 to 9.5e-4, not to 0. So a cache with keys in any layer after the first
    changed one is refused unless ``approximate=True`` says that is wanted; the exact remedy
    is a fresh prefill (see :func:`schedule_changes`).

    Args:
        config: the model's config (``model.config``, or a config.json dict).
        cache: a ``transformers`` cache with ``layers[i].keys`` ``(batch, kv_heads, seq,
            head_dim)`` holding every token so far (``DynamicCache``).
        from_length: tokens in the cache, the length its keys were rotated for.
        to_length: the length of the coming forward.
        approximate: re-rotate a cache whose later layers cannot come out exact.
        positions: where the cached keys sit, ``(from_length,)`` or ``(batch, from_length)``;
            default ``0 .. from_length - 1`` for every row. A **padded batch must pass its
            rows' positions** (a row left-padded by 3 has its first key at 0 in slot 3): for
            the position ids transformers forms from an attention mask, pass
            ``(mask.long().cumsum(-1) - 1).clamp(min=0)``. Re-rotating a padded row as if it
            were not padded is worse than not re-rotating it; the cache cannot tell.

    Returns:
        How many layers' keys were re-rotated.

    Raises:
        ValueError: a layer after the first whose schedule changes holds keys (without
            ``approximate``), a length that is not a positive integer, a layer
            keeps another number of keys than ``from_length`` (a sliding window), a
            multimodal RoPE, or a config whose layers' kinds are not listed.
    """
    layers = getattr(cache, "layers", None)
    if not isinstance(layers, list):
        raise InputError(
            f"cache must be a transformers Cache with .layers, got {type(cache).__name__}"
        )
    from_length = _checks.positive_int("from_length", from_length)
    to_length = _checks.positive_int("to_length", to_length)
    changed = _changed_layers(config, len(layers), from_length, to_length)
    # Every layer after the first changed one read hidden states attended under the old
    # schedule, whether or not its own RoPE changed (a NoPE layer included).
    later = (
        [j for j in range(changed[0] + 1, len(layers)) if _holds_keys(layers[j])] if changed else []
    )
    if later and not approximate:
        raise InputError(
            f"the schedule changes in layer {changed[0]}: layer {later[0]}'s keys and values "
            f"were computed from what layer {changed[0]} attended under the old schedule, so "
            f"re-rotating cannot make them what a fresh prefill writes; run the forward "
            f"without the cache over all {to_length} tokens (exact), or pass "
            f"approximate=True to re-rotate anyway"
        )
    specs = _layer_specs(model_rope(config), len(layers))
    pos = torch.arange(from_length) if positions is None else _positions(positions, from_length)
    # Every layer is checked before any is re-rotated: a refusal leaves the cache as it was.
    todo = []
    for i in changed:
        keys = getattr(layers[i], "keys", None)
        if keys is None or keys.numel() == 0:
            continue
        if keys.shape[-2] != from_length:
            raise InputError(
                f"layer {i} holds {keys.shape[-2]} keys but from_length is {from_length}: "
                f"rerotate_cache needs every token's key (no sliding window); the cache is "
                f"unchanged"
            )
        if pos.dim() == 2 and pos.shape[0] not in (1, keys.shape[0]):
            raise InputError(
                f"positions has {pos.shape[0]} rows but the cache holds {keys.shape[0]}"
            )
        spec = specs[i]
        assert spec is not None
        todo.append((i, keys, _module(spec)))
    done = 0
    for i, keys, rope in todo:
        at = pos.to(keys.device)
        layers[i].keys = rope.rerotate(keys, at, at, from_length=from_length, to_length=to_length)
        done += 1
    return done


def _positions(positions: object, from_length: int) -> torch.Tensor:
    pos = _checks.positions(positions, max_dim=2)
    if pos.shape[-1] != from_length:
        raise InputError(
            f"positions must have shape ({from_length},) or (batch, {from_length}), one per "
            f"cached key, got shape {tuple(pos.shape)}"
        )
    _checks.within_limit("positions", pos)
    return pos


__all__ = ["rerotate_cache", "schedule_changes"]
