"""What a training-free extension costs against plain RoPE attention, measured in one run.

For each method and length, ``posemb.extended_attention`` (q and k unrotated) is timed in
alternation with the plain path a model runs: RoPE on q and k, then
``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``. The ratio is the median
of the per-pair ratios (the machines are shared and noisy; pairs see the same state). Beside
the time, the peak memory one call adds above what its inputs hold: on CUDA the allocator's
peak, on the CPU the process's peak resident set (reset before each call through
``/proc/self/clear_refs``; Linux only, else not reported). On the CPU the memory is measured in
a child process of this script with glibc's mmap threshold fixed at 128 KiB, so every tensor's
memory is returned when it is freed and the resident set follows what is live (with the
default, freed memory stays mapped and a second call's peak reads as zero); the times come
from this process, where that setting would slow every allocation down.

Usage: python benchmarks/extension.py [--lengths 2048 8192] [--repeats 5] [--threads N]
    [--device cpu|cuda] [--dtype float32|bfloat16|float16] [--heads 8] [--kv-heads 2]
    [--head-dim 64] [--methods selfextend rerope ...] [--reference]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

from measure import MMAP_THRESHOLD, once, peak_mib

# torch and posemb are imported where used: `gpu.sh --dry-run` parses the arguments only.
DTYPES = ("float32", "bfloat16", "float16")
METHODS = ("selfextend", "rerope", "leaky rerope", "dca")


def methods() -> dict[str, Any]:
    """The extensions timed, by name (Self-Extend's and ReRoPE's window 128, DCA's chunks)."""
    import posemb

    return {
        "selfextend": posemb.SelfExtend(group=8, window=128),
        "rerope": posemb.ReRoPE(window=128),
        "leaky rerope": posemb.ReRoPE(window=128, leak=16.0),
        "dca": posemb.DualChunk(chunk_size=256, local_size=32),
    }


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--methods", nargs="+", choices=METHODS, default=None)
    p.add_argument("--reference", action="store_true", help="time the blocked reference path")
    p.add_argument("--memory-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--parse-only", action="store_true", help=argparse.SUPPRESS)  # gpu.sh
    a = p.parse_args(argv)
    if a.parse_only:
        sys.exit(0)
    if a.heads % a.kv_heads:
        p.error(f"--heads ({a.heads}) must be a multiple of --kv-heads ({a.kv_heads})")
    return a


def _workload(
    a: argparse.Namespace, n: int
) -> tuple[Callable[[], object], dict[str, Callable[[], object]]]:
    """The plain call and each method's call on the same q, k and v of length ``n``."""
    import torch

    import posemb

    device, dtype = torch.device(a.device), getattr(torch, a.dtype)
    rope = posemb.RotaryEmbedding(a.head_dim)
    group = a.heads // a.kv_heads
    torch.manual_seed(0)

    def make(heads: int) -> torch.Tensor:
        return torch.randn(1, heads, n, a.head_dim, device=device, dtype=dtype)

    q, k, v = make(a.heads), make(a.kv_heads), make(a.kv_heads)

    def plain() -> torch.Tensor:
        qr, kr = rope(q, k)
        kr, vv = kr.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        return torch.nn.functional.scaled_dot_product_attention(qr, kr, vv, is_causal=True)

    calls = {}
    for name, method in methods().items():
        if a.methods is None or name in a.methods:
            calls[name] = functools.partial(
                posemb.extended_attention, q, k, v, rope, method, fused=not a.reference
            )
    return plain, calls


def _peaks(a: argparse.Namespace, n: int) -> dict[str, float]:
    """Each call's peak MiB at length ``n``, measured in a child process (see above)."""
    if sys.platform != "linux":
        return {}
    argv = [sys.executable, __file__, "--memory-child", "--lengths", str(n)]
    argv += ["--device", a.device, "--dtype", a.dtype, "--heads", str(a.heads)]
    argv += ["--kv-heads", str(a.kv_heads), "--head-dim", str(a.head_dim)]
    argv += ["--methods", *(a.methods or METHODS)] + (["--reference"] if a.reference else [])
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _memory_child(a: argparse.Namespace) -> None:
    import torch

    plain, calls = _workload(a, a.lengths[0])
    device = torch.device(a.device)
    peaks = {}
    with torch.no_grad():
        for name, fn in {"plain": plain, **calls}.items():
            fn()  # first call: one-time allocations (tables, kernels) are not the call's
            peaks[name] = peak_mib(fn, device)
    print(json.dumps(peaks))


def main(argv: list[str] | None = None) -> None:
    a = _args(argv)
    if a.memory_child:
        return _memory_child(a)
    import torch

    from posemb.bench.kernels import cpu_model

    if a.threads:
        torch.set_num_threads(a.threads)

    device = torch.device(a.device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
    path = "reference (blocked)" if a.reference else "fused (LSE-merged)"
    print(
        f"extended_attention [{path}] vs RoPE + SDPA (causal), {a.dtype}, batch 1, {a.heads} q "
        f"/ {a.kv_heads} kv heads of {a.head_dim}; {where}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}, Python {platform.python_version()}"
    )
    for n in a.lengths:
        plain, calls = _workload(a, n)
        peaks = _peaks(a, n) if device.type == "cpu" else {}
        with torch.no_grad():
            plain()
            base = statistics.median(once(plain, device) for _ in range(a.repeats))
            base_mem = peaks.get("plain") if device.type == "cpu" else peak_mib(plain, device)
            for name, ext in calls.items():
                ext()
                ratios, times = [], []
                for _ in range(a.repeats):
                    r, t = once(plain, device), once(ext, device)
                    ratios.append(t / r)
                    times.append(t)
                mem = peaks.get(name) if device.type == "cpu" else peak_mib(ext, device)
                memory = (
                    f"   peak {mem:7.1f} MiB (plain {base_mem:6.1f}, {mem / base_mem:4.1f}x)"
                    if mem is not None and base_mem
                    else ""
                )
                print(
                    f"  L={n:6d} {name:13s} {1e3 * statistics.median(times):9.1f} ms   "
                    f"plain {1e3 * base:8.1f} ms   ratio {statistics.median(ratios):5.2f}x{memory}"
                )


if __name__ == "__main__":
    main()
