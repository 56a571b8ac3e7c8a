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
        if not isinstance(rope, RotaryEmbedding) or isinstance(rope, XPos):
            raise InputError(
                f"rope must be a RotaryEmbedding (XPos scales keys by position, which eviction "
                f"cannot move exactly), got {type(rope).__name__}"
            )
        self.rope = rope
        self.sink = _checks.nonnegative_int("sink", sink)
        self.window = None if window is None else _checks.positive_int("window", window)
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.rotations = 0
        """How many times cached keys were re-rotated (evictions and schedule switches)."""

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def _moved(self, keep: torch.Tensor, new_len: int) -> None:
        """Keep the cached tokens at indices ``keep`` and re-rotate them from their positions
        and the current length to ``0 .. len(keep) - 1`` in the schedule of ``new_len``."""
        assert self.keys is not None and self.values is not None
        old_len = len(self)
        self.keys = self.rope.rerotate(
            self.keys[:, :, keep],
            keep,
            torch.arange(len(keep)),
            from_length=old_len,
            to_length=new_len,
        )
        self.values = self.values[:, :, keep]
        self.rotations += 1

    def step(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Add one step's tokens and return what its queries attend to.

        Args:
            q: ``(batch, q_heads, t, head_dim)`` queries of the t new tokens, not rotated.
            k: ``(batch, kv_heads, t, head_dim)`` their keys, not rotated.
            v: ``(batch, kv_heads, t, v_dim)`` their values.

        Returns:
            ``(q, keys, values)``: q rotated at the new tokens' positions, and every kept key
            ``(batch, kv_heads, len, head_dim)`` (rotated) and value, the new ones last.
        """
        t = k.shape[2]
        if q.shape[2] != t or v.shape[2] != t or v.shape[:2] != k.shape[:2]:
            raise InputError(
                f"q, k and v must hold the same new tokens, got q {tuple(q.shape)}, "
                f"k {tuple(k.shape)}, v {tuple(v.shape)}"
            )
        n = len(self)
        if self.window is not None and n + t > self.sink + self.window:
            if t > self.window:
                raise InputError(f"a step of {t} tokens does not fit a window of {self.window}")
            drop = n + t - (self.sink + self.window)
            keep = torch.cat((torch.arange(min(self.sink, n)), torch.arange(self.sink + drop, n)))
            self._moved(keep, len(keep) + t)
            n = len(self)
        elif n and self._schedule_changes(n, n + t):
            self._moved(torch.arange(n), n + t)
        positions = torch.arange(n, n + t, device=k.device)
        q, k = self.rope(q, k, positions)
        self.keys = k if self.keys is None else torch.cat((self.keys, k), dim=2)
        self.values = v if self.values is None else torch.cat((self.values, v), dim=2)
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
            ValueError: ``rope`` has another geometry (head_dim, rotary_dim, layout).
        """
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


__all__ = ["RotatedKVCache"]
