"""What the attention benchmarks share: a timed call, and the peak memory one call adds.

Times are a call's wall clock with the device synchronised before and after. The peak memory
is, on CUDA, the allocator's peak above what was allocated before the call; on the CPU, the
process's peak resident set (reset before the call through ``/proc/self/clear_refs``; Linux
only, else not reported) above the resident set before it, which follows what is live only
where freed memory is returned at once: the benchmarks measure it in a child process whose
glibc mmap threshold is fixed at 128 KiB (``MALLOC_MMAP_THRESHOLD_``), and time in the parent,
where that setting would slow every allocation down.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# Every tensor above this many bytes gets its own mapping in the memory child, so freeing it
# returns it to the system and the resident set follows what is live.
MMAP_THRESHOLD = "131072"


def sync(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def once(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds one call of ``fn`` takes."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def _rss_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def peak_mib(fn: Callable[[], object], device: torch.device) -> float | None:
    """MiB one call of ``fn`` takes at its peak above what was held before it."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM, the peak resident set, to the current one
    except OSError:
        return None
    before = _rss_kib("VmRSS")
    fn()
    peak = _rss_kib("VmHWM")
    return None if before is None or peak is None else (peak - before) / 1024
