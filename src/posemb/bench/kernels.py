"""RoPE benchmark: posemb's paths against the memory-bandwidth limit and other libraries.

Applying RoPE is memory-bound, so every method is timed on the same tensors in the same run as
two bandwidth references: ``x.mul_(1.0)`` (one read and one write in place, the floor for an
in-place rotation) and ``torch.empty_like(x).copy_(x)`` (a fresh output, the floor for an
out-of-place one). Ratios against them, and against ``transformers``' eager
``apply_rotary_pos_emb``, are what to quote: the machines are shared and noisy, absolute times
only hold for the machine they came from. GB/s counts the minimum traffic: one read and one
write of q and k per pass (forward or backward).

Every method rotates a q and a k of the shape named (no GQA, so every method moves the same
bytes), as an attention layer calls it. A fresh output's pages cost about as much as the
rotation on Linux (4 KB faults, each zeroed); posemb's CPU op asks for huge pages for its
outputs (``POSEMB_HUGEPAGES=0`` turns that off), so its out-of-place ratio against
``empty_like.copy_`` (which gets none) can fall below 1.
"""

from __future__ import annotations

import csv
import datetime as _dt
import functools
import io
import logging
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

import torch

from .. import kernels
from .._errors import InputError
from .._io import atomic_write_bytes
from .._version import __version__
from ..kernels.reference import apply_rope
from ..rope import RotaryEmbedding
from .rows import MACHINE_FIELDS, Machine, Row

logger = logging.getLogger("posemb.bench")

SHAPES = {
    "prefill": (4, 32, 2048, 128),
    "decode": (64, 32, 1, 128),
    "long": (1, 8, 32768, 128),
}
QUICK_SHAPES = {"prefill": (2, 4, 256, 64), "decode": (8, 4, 1, 64), "long": (1, 2, 1024, 64)}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
MODES = ("forward", "backward", "both")


# The peers a run compares with, by distribution name; None where not installed.
PEERS = {
    "transformers": "transformers",
    "rotary_embedding_torch": "rotary-embedding-torch",
    "triton": "triton",
    "liger_kernel": "liger-kernel",
    "flash_attn": "flash-attn",
}


def bench_device(device: str) -> torch.device:
    """``device`` as a torch.device a bench can time on ("cpu", or "cuda" where present)."""
    if device not in ("cpu", "cuda"):
        raise InputError(f"device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA device is available here")
    return torch.device(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_paired(
    fn: Callable[[], object], ref: Callable[[], object], device: torch.device, repeats: int
) -> tuple[float, list[float], float, float]:
    """``fn`` timed in alternation with its bandwidth reference ``ref``: first-call time,
    steady-state times (ms), the median of the per-pair ratios fn/ref, and the median host
    time (ms until ``fn`` returned, before the device finished). Measured apart, the
    reference at the start of a run and a method a minute later, the ratio drifted by 1.2x
    to 1.6x on a shared machine; pairs see the same machine state."""
    first, _ = _time(fn, device, 0)  # the first call, and one to warm up

    def once(f: Callable[[], object]) -> tuple[float, float]:
        _sync(device)
        t0 = time.perf_counter()
        f()
        t1 = time.perf_counter()
        _sync(device)
        return (time.perf_counter() - t0) * 1e3, (t1 - t0) * 1e3

    times, ratios, host = [], [], []
    for _ in range(repeats):
        (r, _), (t, h) = once(ref), once(fn)
        times.append(t)
        host.append(h)
        ratios.append(t / r if r > 0 else float("nan"))
    return first, times, statistics.median(ratios), statistics.median(host)


def _time(
    fn: Callable[[], object], device: torch.device, repeats: int
) -> tuple[float, list[float]]:
    """First-call time and the steady-state times, in ms."""
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    first = (time.perf_counter() - t0) * 1e3
    fn()  # a second warm-up: allocator and caches settle
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return first, times


def _version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # not installed
        return None


Pair = tuple[torch.Tensor, torch.Tensor]


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux; ``platform`` elsewhere): ``x86_64``
    alone said nothing about which machine a time came from."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("model name", "Model", "cpu model")):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _cpu_op() -> str | None:
    from ..kernels import cpu

    loaded = cpu.load()
    return f"{loaded.source} {loaded.variant}" if loaded else None


def machine(dev: torch.device) -> dict[str, Any]:
    """Where and when a benchmark ran: the device and its model name, architecture, Python,
    threads, the CPU op's source, the versions of torch, posemb and each peer (None and listed
    in ``absent`` where not installed), a UTC timestamp (shared by ``posemb bench`` and
    ``posemb bench --hf``)."""
    peers = {field: _version(dist) for field, dist in PEERS.items()}
    return {
        "device": dev.type,
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else cpu_model(),
        "arch": platform.machine(),
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "posemb": __version__,
        **peers,
        "absent": " ".join(PEERS[f] for f, v in peers.items() if v is None),
        "cpu_op": _cpu_op() if dev.type == "cpu" else None,
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def describe_machine(r: Any) -> str:
    """One line naming a run's machine and libraries, from any of its rows."""
    libs = ", ".join(
        f"{dist} {getattr(r, f)}" for f, dist in PEERS.items() if getattr(r, f, None) is not None
    )
    line = (
        f"{r.device} ({r.device_name}, {r.arch}), {r.threads} threads, Python {r.python}, "
        f"torch {r.torch}, posemb {r.posemb}" + (f", {libs}" if libs else "")
    )
    if r.cpu_op:
        line += f", CPU op: {r.cpu_op}"
    if r.absent:
        line += f"; not installed: {', '.join(r.absent.split())}"
    return f"{line}; {r.timestamp}"


def _methods(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, device: torch.device
) -> dict[str, tuple[str, Callable[[torch.Tensor, torch.Tensor], Pair]]]:
    """name -> (kind, f(q, k) -> (q_out, k_out)), kind 'inplace', 'outofplace' or 'reference'.
    ``x`` is only used to pick posemb's backend and to probe third-party calls."""
    fused = kernels.resolve_backend("auto", x)
    methods: dict[str, tuple[str, Callable[[torch.Tensor, torch.Tensor], Pair]]] = {
        f"posemb {fused} in-place": (
            "inplace",
            lambda q, k: kernels.rotate(q, k, cos, sin, backend=fused, inplace=True),
        ),
        f"posemb {fused}": (
            "outofplace",
            lambda q, k: kernels.rotate(q, k, cos, sin, backend=fused),
        ),
        "posemb reference": (
            "outofplace",
            lambda q, k: (apply_rope(q, cos, sin), apply_rope(k, cos, sin)),
        ),
        # The peer a torch.compile user would write: Inductor fusing the plain reference.
        # Its compile time lands in first_call_ms.
        "torch.compile reference": (
            "outofplace",
            torch.compile(
                lambda q, k: (apply_rope(q, cos, sin), apply_rope(k, cos, sin)), dynamic=False
            ),
        ),
    }
    full_cos, full_sin = (
        torch.cat((cos, cos), -1).to(x.dtype)[None],
        torch.cat((sin, sin), -1).to(x.dtype)[None],
    )
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        methods["transformers eager"] = (
            "outofplace",
            lambda q, k: apply_rotary_pos_emb(q, k, full_cos, full_sin),
        )
    except ImportError:
        pass
    try:
        from rotary_embedding_torch import apply_rotary_emb

        angles = torch.atan2(sin, cos).repeat_interleave(2, -1)  # interleaved angle per channel
        methods["rotary-embedding-torch"] = (
            "outofplace",
            lambda q, k: (apply_rotary_emb(angles, q), apply_rotary_emb(angles, k)),
        )
    except ImportError:
        pass
    if device.type == "cuda":
        methods.update(_gpu_peers(cos, sin, full_cos, full_sin))
    # A library whose call fails on a small slice (an API change, a missing GPU feature) is
    # left out of this run rather than aborting it.
    probe = x[:1, :1]
    usable = {}
    for name, (kind, fn) in methods.items():
        if name.startswith("posemb"):
            usable[name] = (kind, fn)
            continue
        try:
            with torch.no_grad():
                fn(probe.clone(), probe.clone())
            usable[name] = (kind, fn)
        except Exception as err:  # third-party code: report and go on
            logger.warning("posemb bench: leaving out %s: %s: %s", name, type(err).__name__, err)
    return usable


def _gpu_peers(
    cos: torch.Tensor, sin: torch.Tensor, full_cos: torch.Tensor, full_sin: torch.Tensor
) -> dict[str, tuple[str, Callable[[torch.Tensor, torch.Tensor], Pair]]]:
    """The CUDA-only peers that are installed: Liger-Kernel's and flash-attn's rotations."""
    peers: dict[str, tuple[str, Callable[[torch.Tensor, torch.Tensor], Pair]]] = {}
    try:
        from liger_kernel.ops.rope import LigerRopeFunction

        peers["liger-kernel"] = (
            "outofplace",
            lambda q, k: LigerRopeFunction.apply(q, k, full_cos, full_sin),
        )
    except ImportError:
        pass
    try:
        from flash_attn.layers.rotary import apply_rotary_emb as fa_rotary

        def fa(t: torch.Tensor) -> torch.Tensor:
            # flash-attn wants (batch, seq, heads, dim)
            return fa_rotary(t.transpose(1, 2), cos.to(t.dtype), sin.to(t.dtype)).transpose(1, 2)

        peers["flash-attn"] = ("outofplace", lambda q, k: (fa(q), fa(k)))
    except ImportError:
        pass
    return peers


def run(
    device: str = "cpu",
    quick: bool = False,
    repeats: int | None = None,
    shapes: list[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[Row], dict[str, float]]:
    """Run the benchmark; return its rows and one-off costs (``cpu_kernel_load_s``: finding,
    and in a source checkout compiling, the CPU op).

    Args:
        device: "cpu" or "cuda".
        quick: small shapes and 2 repeats: proves the harness works (CI), measures nothing.
        repeats: timed repetitions per measurement (default 5 on CPU, 50 on GPU).
        shapes: subset of :data:`SHAPES` names.
        progress: called with a line per measurement.
    """
    dev = bench_device(device)
    table = QUICK_SHAPES if quick else SHAPES
    names = shapes or list(table)
    for n in names:
        if n not in table:
            raise InputError(f"unknown shape {n!r}; known: {', '.join(table)}")
    reps = repeats or (2 if quick else (5 if dev.type == "cpu" else 50))
    one_off: dict[str, float] = {}
    if dev.type == "cpu":
        t0 = time.perf_counter()
        from ..kernels import cpu

        cpu.load()
        one_off["cpu_kernel_load_s"] = time.perf_counter() - t0
    meta = machine(dev)
    rows: list[Row] = []
    for shape_name in names:
        for dtype_name in DTYPES:
            rows += _measure(shape_name, table[shape_name], dtype_name, dev, reps, meta, progress)
    _ratios(rows)
    return rows, one_off


def _row(
    where: tuple[str, tuple[int, ...], str],
    mode: str,
    method: str,
    *,
    first: float,
    times: list[float],
    traffic: int,
    meta: dict[str, Any],
) -> Row:
    """One row from a method's timings: median and 20/80th percentiles, GB/s of ``traffic``
    bytes. ``where`` is (shape name, shape, dtype name)."""
    shape_name, shape, dtype_name = where
    med = statistics.median(times)
    q = statistics.quantiles(times, n=5) if len(times) > 1 else [med] * 4
    gbps = traffic / (med * 1e-3) / 1e9 if med > 0 else None
    shape_text = "x".join(map(str, shape))
    return Row(
        shape_name,
        shape_text,
        dtype_name,
        mode,
        method,
        med,
        q[0],
        q[-1],
        gbps,
        None,
        None,
        first,
        **meta,
    )


def _measure(
    shape_name: str,
    shape: tuple[int, ...],
    dtype_name: str,
    dev: torch.device,
    reps: int,
    meta: dict[str, Any],
    progress: Callable[[str], None] | None,
) -> list[Row]:
    """Every method on one shape and dtype: forward, and forward+backward where it applies."""
    q = torch.randn(shape, device=dev, dtype=DTYPES[dtype_name])
    k = torch.randn(shape, device=dev, dtype=DTYPES[dtype_name])
    rope = RotaryEmbedding(shape[-1], backend="reference")
    cos, sin = rope.cos_sin(torch.arange(shape[2], device=dev), device=dev)
    nbytes = 2 * q.numel() * q.element_size()  # q and k
    rows: list[Row] = []
    forward_ms: dict[str, float] = {}

    def record(
        mode: str,
        method: str,
        first: float,
        times: list[float],
        traffic: int,
        vs_bandwidth: float | None = None,
        host_ms: float | None = None,
    ) -> None:
        where = (shape_name, shape, dtype_name)
        row = _row(where, mode, method, first=first, times=times, traffic=traffic, meta=meta)
        row = replace(row, vs_bandwidth=vs_bandwidth, host_ms=host_ms)
        if mode == "forward":
            forward_ms[method] = row.median_ms
        rows.append(row)
        if progress:
            progress(f"{shape_name} {dtype_name} {mode:8} {method:28} {row.median_ms:9.3f} ms")

    # Bandwidth references, forward only: q and k each read and written once.
    def mul() -> object:
        return q.mul_(1.0), k.mul_(1.0)

    def copy() -> object:
        return torch.empty_like(q).copy_(q), torch.empty_like(k).copy_(k)

    first, times = _time(mul, dev, reps)
    record("forward", "bandwidth: x.mul_(1.0)", first, times, 2 * nbytes)
    first, times = _time(copy, dev, reps)
    record("forward", "bandwidth: empty_like.copy_", first, times, 2 * nbytes)
    grads = (torch.randn_like(q), torch.randn_like(k))
    for method, (kind, fn) in _methods(q, cos, sin, dev).items():
        with torch.no_grad():
            ref = mul if kind == "inplace" else copy
            first, times, ratio, host = _time_paired(functools.partial(fn, q, k), ref, dev, reps)
        record("forward", method, first, times, 2 * nbytes, ratio, host)
        if kind == "inplace":
            continue  # in place is the inference path: no autograd
        qg, kg = q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_()

        def both(fn=fn, qg=qg, kg=kg):
            qg.grad = kg.grad = None
            torch.autograd.backward(fn(qg, kg), grads)

        first, times = _time(both, dev, reps)
        record("both", method, first, times, 4 * nbytes)
        # Backward alone, as autograd users pay it: forward+backward minus forward.
        fwd = forward_ms[method]
        record("backward", method, first, [max(t - fwd, 0.0) for t in times], 2 * nbytes)
    return rows


def _ratios(rows: list[Row]) -> None:
    """Fill vs_bandwidth (in-place methods vs mul_, others vs copy_) and vs_hf_eager."""
    by = {(r.shape_name, r.dtype, r.mode, r.method): r for r in rows}
    for r in rows:
        key = (r.shape_name, r.dtype)
        if r.method.startswith("bandwidth"):
            continue
        if r.mode == "forward" and r.vs_bandwidth is None:  # not timed in pairs
            ref = (
                "bandwidth: x.mul_(1.0)"
                if r.method.endswith("in-place")
                else "bandwidth: empty_like.copy_"
            )
            bw = by.get((*key, "forward", ref))
            if bw and bw.median_ms > 0:
                r.vs_bandwidth = r.median_ms / bw.median_ms
        hf = by.get((*key, r.mode, "transformers eager"))
        if hf and r.median_ms > 0:
            r.vs_hf_eager = hf.median_ms / r.median_ms


def write_csv(rows: list[Any], path: str) -> None:
    """Write rows (dataclasses of one kind: :class:`Row`, ``bench.hf.HFRow``) as a
    long-format CSV, atomically (temporary file, then rename)."""
    buf = io.StringIO()
    fields = list(asdict(rows[0]).keys()) if rows else list(Row.__dataclass_fields__)
    writer = csv.DictWriter(buf, fieldnames=fields)
    writer.writeheader()
    for r in rows:
        writer.writerow(asdict(r))
    atomic_write_bytes(path, buf.getvalue().encode("utf-8"))


def summary(rows: list[Row], one_off: dict[str, float]) -> str:
    """A one-screen table: per shape, dtype and mode, each method's time and ratios."""
    if not rows:
        return "no measurements"
    r0 = rows[0]
    lines = [f"posemb bench: {describe_machine(r0)}"]
    lines += [f"one-off: {k} = {v:.2f}" for k, v in one_off.items()]
    lines.append(
        f"{'shape':8} {'dtype':5} {'mode':8} {'method':30} {'median ms':>10} {'GB/s':>7} "
        f"{'x bandwidth':>11} {'vs HF eager':>11} {'host us':>8}"
    )

    def f(v: float | None, fmt: str, width: int, unit: str = "") -> str:
        return ("-" if v is None else format(v, fmt) + unit).rjust(width)

    order = {m: i for i, m in enumerate(MODES)}
    for r in sorted(rows, key=lambda r: (r.shape_name, r.dtype, order[r.mode])):
        lines.append(
            f"{r.shape_name:8} {r.dtype:5} {r.mode:8} {r.method:30} {r.median_ms:10.3f} "
            f"{f(r.gbps, '.1f', 7)} {f(r.vs_bandwidth, '.2f', 11, 'x')} "
            f"{f(r.vs_hf_eager, '.1f', 11, 'x')} "
            f"{f(None if r.host_ms is None else 1e3 * r.host_ms, '.1f', 8)}"
        )
    lines.append("host us: until the call returned, before the device finished (forward rows)")
    return "\n".join(lines)


__all__ = [
    "MACHINE_FIELDS",
    "MODES",
    "QUICK_SHAPES",
    "SHAPES",
    "Machine",
    "Row",
    "cpu_model",
    "describe_machine",
    "machine",
    "run",
    "summary",
    "write_csv",
]
