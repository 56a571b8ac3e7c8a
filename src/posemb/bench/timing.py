"""What every bench shares: timing methods in rounds, so that a slow moment of a shared machine
falls on every method alike (the paired ratios of ``posemb bench --hf``, ``--decode`` and
``--norm``), and the host's share of each call.

Each sample is timed twice: until the call returns to Python (the *host* time: checks,
dispatch, launches; on a GPU the kernels may still be running) and until the device has
finished (``sync``). On the CPU the two agree, as the work happens in the call; on a GPU a
decode-sized call whose host time exceeds its device time is bound by the host, and the host
time is what a CUDA graph removes.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def rounds(
    steps: dict[str, Callable[[], object]],
    repeats: int,
    sync: Callable[[], None],
    host: dict[str, list[float]] | None = None,
) -> dict[str, list[float]]:
    """Each step timed ``repeats`` times, one of each per round (ms), after two warm-ups.

    Returns ``{name: [ms per sample]}`` until ``sync`` returned; with ``host``, also fills
    ``host[name]`` with the ms until the step returned (before ``sync``).
    """
    for step in steps.values():
        step()
        step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    if host is not None:
        host.update({name: [] for name in steps})
    names = list(steps)
    for i in range(repeats):
        # Each round starts with another method: none always runs first (after the previous
        # round's last step has left the allocator in its state).
        for name in names[i % len(names) :] + names[: i % len(names)]:
            step = steps[name]
            sync()
            t0 = time.perf_counter()
            step()
            t1 = time.perf_counter()
            sync()
            times[name].append((time.perf_counter() - t0) * 1e3)
            if host is not None:
                host[name].append((t1 - t0) * 1e3)
    return times


__all__ = ["rounds"]
