"""What every bench shares: timing methods in rounds, so that a slow moment of a shared machine
falls on every method alike (the paired ratios of ``posemb bench --hf``, ``--decode`` and
``--norm``)."""

from __future__ import annotations

import time
from collections.abc import Callable


def rounds(steps: dict[str, Callable[[], object]], repeats: int, sync: Callable[[], None]):
    """Each step timed ``repeats`` times, one of each per round (ms), after two warm-ups."""
    for step in steps.values():
        step()
        step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    for i in range(repeats):
        # Each round starts with another method: none always runs first (after the previous
        # round's last step has left the allocator in its state).
        for name in names[i % len(names) :] + names[: i % len(names)]:
            step = steps[name]
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            times[name].append((time.perf_counter() - t0) * 1e3)
    return times


__all__ = ["rounds"]
