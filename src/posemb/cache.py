"""A KV cache of rotated keys that can evict tokens and change schedule, exactly.

StreamingLLM-style attention (Xiao et al. 2023, "Efficient Streaming Language Models with
Attention Sinks") keeps the first few tokens (the sinks) and a window of recent ones, and gives
the kept tokens contiguous positions inside the cache, so a key cached at one position must be
moved to another. A schedule that depends on the length (Phi-3's LongRoPE switching to its long
factors past ``original_max_position_embeddings``, dynamic NTK changing its base) rotates a
fresh prefill of the whole sequence with other frequencies than the ones the cached keys were
rotated with (transformers PR #33129, llama.cpp #8995 and onnxruntime-genai #1161 are this
bug). :class:`RotatedKVCache` does both with :meth:`posemb.RotaryEmbedding.rerotate`: the
difference of two float64 angles per pair, applied once, never a composition of rounded
tables.

That makes one layer's cache exact. In a model of several layers the keys and values of
every later layer were computed from hidden states that the layers before attended with the
old positions or schedule (and, after an eviction, with the evicted tokens); no rotation
changes that. StreamingLLM accepts it for eviction by design; for a schedule switch the exact
remedy is a fresh prefill at the switch (:func:`posemb.hf.schedule_changes`), and
:func:`posemb.hf.rerotate_cache` refuses a transformers cache that re-rotation cannot make
exact unless asked to approximate.
"""

from __future__ import annotations

import torch

from . import _checks
from ._errors import InputError
from .rope import RotaryEmbedding, XPos


class RotatedKVCache:
    """Rotated keys and their values for one attention layer.

    The cache gives its tokens positions ``0 .. len - 1`` in the order they are kept; every
    step rotates the new queries and keys at the next positions, in the schedule of the
    length the cache then holds. When that schedule differs from the one the cached keys were
    rotated in, they are re-rotated first, so the keys always read as a fresh prefill of the
    kept tokens would have rotated them.

    Args:
        rope: the module that rotates this layer's q and k.
        sink: tokens at the start that every eviction keeps (StreamingLLM uses 4).
        window: recent tokens kept beside the sinks; None keeps every token.

    Raises:
        ValueError: a rope that is not a plain rotation (XPos), or a bad sink or window.
    """

    def __init__(self, rope: RotaryEmbedding, *, sink: int = 4, window: int | None = None):
        self.rope = _check_rope(rope)
        self.sink = _checks.nonnegative_int("sink", sink)
        self.window = None if window is None else _checks.positive_int("window", window)
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.rotations = 0
        """How many times cached keys were re-rotated (evictions and schedule switches)."""

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def _moved(self, keep: torch.Tensor, new_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached tokens at indices ``keep``, re-rotated from their positions and the
        current length to ``0 .. len(keep) - 1`` in the schedule of ``new_len``: new keys and
        values, the cache unchanged."""
        assert self.keys is not None and self.values is not None
        keys = self.rope.rerotate(
            self.keys[:, :, keep],
            keep,
            torch.arange(len(keep)),
            from_length=len(self),
            to_length=new_len,
        )
        return keys, self.values[:, :, keep]

    def _check_step(self, q: object, k: object, v: object) -> tuple[torch.Tensor, ...]:
        """Every check of a step, before anything changes: the new tokens' shapes against each
        other and against what the cache holds."""
        q = _checks.heads_tensor("q", q, self.rope.head_dim)
        k = _checks.heads_tensor("k", k, self.rope.head_dim)
        v = _checks.float_tensor("v", v)
        t = k.shape[2]
        if (
            v.dim() != 4 or q.shape[2] != t or v.shape[2] != t or v.shape[:2] != k.shape[:2]
            or q.shape[0] != k.shape[0] or q.shape[1] % k.shape[1]
        ):  # fmt: skip
            raise InputError(
                f"q, k and v must hold the same new tokens of one batch (q heads a multiple of "
                f"k's), got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
            )
        if self.keys is not None and self.values is not None:
            held = (self.keys.shape[:2], self.keys.shape[3], self.values.shape[3])
            new = (k.shape[:2], k.shape[3], v.shape[3])
            same_kind = (k.dtype, k.device, v.dtype) == (
                self.keys.dtype, self.keys.device, self.values.dtype
            )  # fmt: skip
            if held != new or not same_kind:
                raise InputError(
                    f"this step's k {tuple(k.shape)} {k.dtype} and v {tuple(v.shape)} do not "
                    f"match the cache's keys {tuple(self.keys.shape)} {self.keys.dtype} and "
                    f"values {tuple(self.values.shape)} (batch, kv heads, head_dim, v_dim, "
                    f"dtype and device stay the same); the cache is unchanged"
                )
        if self.window is not None and t > self.window:
            raise InputError(f"a step of {t} tokens does not fit a window of {self.window}")
        return q, k, v

    def step(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Add one step's tokens and return what its queries attend to.

        Everything is checked, and the new tokens rotated, before the cache changes: a bad
        step raises ``ValueError`` with the cache as it was (nothing evicted or re-rotated).

        Args:
            q: ``(batch, q_heads, t, head_dim)`` queries of the t new tokens, not rotated.
            k: ``(batch, kv_heads, t, head_dim)`` their keys, not rotated.
            v: ``(batch, kv_heads, t, v_dim)`` their values.

        Returns:
            ``(q, keys, values)``: q rotated at the new tokens' positions, and every kept key
            ``(batch, kv_heads, len, head_dim)`` (rotated) and value, the new ones last.
        """
        q, k, v = self._check_step(q, k, v)
        t, n = k.shape[2], len(self)
        keep = None
        if self.window is not None and n + t > self.sink + self.window:
            drop = n + t - (self.sink + self.window)
            keep = torch.cat((torch.arange(min(self.sink, n)), torch.arange(self.sink + drop, n)))
        elif n and self._schedule_changes(n, n + t):
            keep = torch.arange(n)
        kept = n if keep is None else len(keep)
        q, k = self.rope(q, k, torch.arange(kept, kept + t, device=k.device))
        keys, values = (self.keys, self.values) if keep is None else self._moved(keep, kept + t)
        # Only now, with every step done, does the cache change.
        self.keys = k if keys is None else torch.cat((keys, k), dim=2)
        self.values = v if values is None else torch.cat((values, v), dim=2)
        self.rotations += keep is not None
        return q, self.keys, self.values

    def _schedule_changes(self, old_len: int, new_len: int) -> bool:
        scaling = self.rope.scaling
        return scaling.depends_on_length and (
            scaling.length_key(old_len) != scaling.length_key(new_len)
        )

    def reschedule(self, rope: RotaryEmbedding) -> None:
        """Rotate the cache with ``rope`` from now on (another scaling, say), re-rotating the
        cached keys into its schedule.

        Raises:
            ValueError: ``rope`` is not a plain rotation (XPos, anything else), or has another
                geometry (head_dim, rotary_dim, layout); the cache is then unchanged.
        """
        rope = _check_rope(rope)
        for field in ("head_dim", "rotary_dim", "layout"):
            if getattr(rope, field) != getattr(self.rope, field):
                raise InputError(
                    f"source.{field} is {getattr(self.rope, field)!r}, the new rope's is "
                    f"{getattr(rope, field)!r}: a key rotated in one geometry cannot be "
                    f"re-rotated into another"
                )
        if self.keys is not None:
            n = len(self)
            pos = torch.arange(n)
            self.keys = rope.rerotate(
                self.keys, pos, pos, source=self.rope, from_length=n, to_length=n
            )
            self.rotations += 1
        self.rope = rope


def _check_rope(rope: object) -> RotaryEmbedding:
    """The constructor's and :meth:`RotatedKVCache.reschedule`'s one rule for a rope."""
    if not isinstance(rope, RotaryEmbedding) or isinstance(rope, XPos):
        raise InputError(
            f"rope must be a RotaryEmbedding (XPos scales keys by position, which eviction "
            f"cannot move exactly), got {type(rope).__name__}"
        )
    return rope


__all__ = ["RotatedKVCache"]
