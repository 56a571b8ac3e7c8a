"""How many windows the lab evaluates at once on the CPU, so that attention-sized tensors stay
where the C allocator reuses them.

glibc serves an allocation above its mmap threshold (dynamic, at most 32 MiB on 64-bit Linux)
with fresh pages from the kernel and returns them on free, so every such tensor is paid for
again in page faults. A float32 ``(windows, heads, n, n)`` tensor passes that at n = 1,024 with
two windows of four heads, and CoPE's positions and gathers make a dozen of them per layer.
Measured on the 2-core AMD EPYC: a 2-layer CoPE model answering 64 flip-flop probes of 1,024
tokens took 64 s in chunks of 32 windows, 71% of it in the kernel, and 27 s one window at a
time. At n >= 1,024 even one window's int64 gather indices (32 MiB) are still mmapped; one
window is as low as a chunk goes. Evaluation batches only share weights, so the chunk changes
no number beyond float rounding. On a GPU the caching allocator reuses memory: no cap there.
"""

from __future__ import annotations

import torch

from .._errors import InputError

PAIR_BYTES = 16 << 20
"""The largest float32 ``(windows, heads, n, n)`` tensor a CPU chunk may make: half the largest
mmap threshold."""


def windows_per_pass(length: int, heads: int, most: int, device: torch.device | str = "cpu") -> int:
    """How many windows of ``length`` tokens to run at once through a model with ``heads``
    heads on ``device``: ``most`` off the CPU; on it at most ``most``, at least one, and few
    enough that a float32 ``(windows, heads, length, length)`` tensor stays within
    :data:`PAIR_BYTES`.

    Raises:
        ValueError: ``length``, ``heads`` or ``most`` below 1.
    """
    for name, value in (("length", length), ("heads", heads), ("most", most)):
        if value < 1:
            raise InputError(f"windows_per_pass: {name} must be >= 1, got {value}")
    if torch.device(device).type != "cpu":
        return most
    return max(1, min(most, PAIR_BYTES // (4 * heads * length * length)))


def model_heads(model: object) -> int:
    """The attention heads of a lab model (:class:`posemb.lab.model.TinyLM` keeps them in its
    config); 1 for a model that does not say (its chunk is then sized for one head)."""
    return int(getattr(getattr(model, "cfg", None), "heads", 1))


__all__ = ["PAIR_BYTES", "model_heads", "windows_per_pass"]
