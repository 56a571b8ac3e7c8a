"""What each encoding's attention costs against plain causal attention, measured in one run.

For each encoding and length, ``posemb.PositionalAttention`` (ALiBi, T5's buckets, FIRE,
KERPLE log and power, a window of 256 and sinks with no positional encoding, ``rope-window``:
RoPE with a window of 256, its rotation included) is timed in alternation with
``torch.nn.functional.scaled_dot_product_attention(is_causal=True)`` on the same q, k and v;
the ratio is the median of the per-pair ratios (the machines are shared and noisy; pairs see
the same state). ``--mode forward`` times the forward alone (no gradient), ``--mode both`` a
forward and backward (q, k, v and the encoding's parameters). Beside the time, the peak memory
a call adds above its inputs (see ``measure.py``: on the CPU from a child process).

``--explicit`` times the path before issue 55 (the whole ``(q_len, k_len)`` bias handed to
SDPA) instead of the blocked core; ``--json`` writes the rows, and ``--plot`` draws one or
more such files (time and memory against length, one line per encoding, plain SDPA as the
floor, the blocked core solid and the explicit path dashed) as an SVG, for the docs.

Usage: python benchmarks/attention.py [--lengths 2048 8192] [--mode forward both]
    [--encodings alibi t5 fire kerple kerple-power window sinks rope-window] [--repeats 5]
    [--threads N]
    [--device cpu|cuda] [--dtype float32|bfloat16|float16] [--batch 1] [--heads 8]
    [--head-dim 64] [--explicit] [--json PATH] [--plot OUT.svg FILE.json ...]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from measure import MMAP_THRESHOLD, once, peak_mib

if TYPE_CHECKING:
    import torch

# torch and posemb are imported where used: `gpu.sh --dry-run` parses the arguments only.
DTYPES = ("float32", "bfloat16", "float16")
ENCODINGS = ("alibi", "t5", "fire", "kerple", "kerple-power", "window", "sinks", "rope-window")
DEFAULT = ENCODINGS[:-1]
MODES = ("forward", "both")
WINDOW = 256


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
    p.add_argument("--mode", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--encodings", nargs="+", choices=ENCODINGS, default=list(DEFAULT))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--explicit", action="store_true", help="time the explicit bias instead")
    p.add_argument("--json", default=None, help="write the rows here")
    p.add_argument("--plot", nargs="+", default=None, metavar="PATH", help="OUT.svg IN.json...")
    p.add_argument("--no-memory", action="store_true", help="skip the peak memory")
    p.add_argument("--memory-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--parse-only", action="store_true", help=argparse.SUPPRESS)  # gpu.sh
    a = p.parse_args(argv)
    if a.parse_only:
        sys.exit(0)
    if a.plot is not None and len(a.plot) < 2:
        p.error("--plot takes the SVG to write and one or more JSON files of rows")
    return a


def attention(name: str, heads: int, head_dim: int) -> Any:
    """The ``PositionalAttention`` of an encoding the benchmark names."""
    import posemb

    kw: dict[str, Any] = {"num_heads": heads, "head_dim": head_dim, "causal": True}
    if name == "window":  # the core's window alone (RoPE's own rotation aside)
        return posemb.PositionalAttention("nope", window=WINDOW, **kw)
    if name == "sinks":
        return posemb.PositionalAttention("nope", sinks=True, **kw)
    if name == "rope-window":  # issue 55's row: RoPE's rotation of q and k included
        return posemb.PositionalAttention("rope", window=WINDOW, **kw)
    if name == "kerple-power":
        return posemb.PositionalAttention("kerple", kind="power", **kw)
    return posemb.PositionalAttention(name, **kw)


def _workload(
    a: argparse.Namespace, n: int, mode: str
) -> tuple[Callable[[], object], dict[str, Callable[[], object]]]:
    """The plain call and each encoding's call on the same q, k and v of length ``n``."""
    import torch

    from posemb.attention import module

    device, dtype = torch.device(a.device), getattr(torch, a.dtype)
    grad = mode == "both"
    torch.manual_seed(0)

    def make() -> torch.Tensor:
        shape = (a.batch, a.heads, n, a.head_dim)
        return torch.randn(shape, device=device, dtype=dtype, requires_grad=grad)

    q, k, v = make(), make(), make()
    if a.explicit:
        module.TILES_FROM = 1 << 62  # the explicit path, whatever the length

    def run(fn: Callable[[], torch.Tensor]) -> Callable[[], object]:
        def call() -> object:
            with torch.set_grad_enabled(grad):
                out = fn()
                if grad:
                    out.sum().backward()
                return None

        return call

    def plain() -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    calls = {}
    for name in a.encodings:
        att = attention(name, a.heads, a.head_dim).to(device, dtype)
        calls[name] = run(lambda att=att: att(q, k, v))
    return run(plain), calls


def _peaks(a: argparse.Namespace, n: int, mode: str) -> dict[str, float]:
    """Each call's peak MiB at length ``n``, measured in a child process (``measure.py``)."""
    if sys.platform != "linux" or a.no_memory:
        return {}
    argv = [sys.executable, __file__, "--memory-child", "--lengths", str(n), "--mode", mode]
    argv += ["--device", a.device, "--dtype", a.dtype, "--heads", str(a.heads)]
    argv += ["--batch", str(a.batch), "--head-dim", str(a.head_dim)]
    argv += ["--encodings", *a.encodings] + (["--explicit"] if a.explicit else [])
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD}
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode != 0:  # out of memory, most likely: say so, keep the times
        print(f"  (memory child failed at L={n}: {done.stderr.strip()[-200:]})")
        return {}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _memory_child(a: argparse.Namespace) -> None:
    import torch

    plain, calls = _workload(a, a.lengths[0], a.mode[0])
    device = torch.device(a.device)
    peaks = {}
    for name, fn in {"plain": plain, **calls}.items():
        fn()  # first call: one-time allocations (tables, kernels) are not the call's
        peaks[name] = peak_mib(fn, device)
    print(json.dumps(peaks))


def measure(a: argparse.Namespace) -> list[dict[str, Any]]:
    """Every (mode, length, encoding) row, printed as it is measured."""
    import torch

    device = torch.device(a.device)
    rows = []
    for mode in a.mode:
        for n in a.lengths:
            plain, calls = _workload(a, n, mode)
            peaks = _peaks(a, n, mode) if device.type == "cpu" else {}
            plain()
            base = statistics.median(once(plain, device) for _ in range(a.repeats))
            base_mem = peaks.get("plain") if device.type == "cpu" else peak_mib(plain, device)
            rows.append(_row(a, mode, n, "plain", base, 1.0, base_mem, base_mem))
            for name, fn in calls.items():
                fn()
                ratios, times = [], []
                for _ in range(a.repeats):
                    r, t = once(plain, device), once(fn, device)
                    ratios.append(t / r)
                    times.append(t)
                mem = peaks.get(name) if device.type == "cpu" else peak_mib(fn, device)
                rows.append(
                    _row(a, mode, n, name, statistics.median(times),
                         statistics.median(ratios), mem, base_mem)
                )  # fmt: skip
    return rows


def _row(
    a: argparse.Namespace,
    mode: str,
    n: int,
    name: str,
    seconds: float,
    ratio: float,
    mem: float | None,
    base_mem: float | None,
) -> dict[str, Any]:
    path = "plain" if name == "plain" else ("explicit" if a.explicit else "tiled")
    row = {
        "mode": mode,
        "length": n,
        "encoding": name,
        "path": path,
        "ms": 1e3 * seconds,
        "ratio": ratio,
        "peak_mib": mem,
        "memory_ratio": None if mem is None or not base_mem else mem / base_mem,
    }
    memory = (
        f"   peak {mem:8.1f} MiB ({row['memory_ratio']:4.2f}x plain)"
        if mem is not None and base_mem
        else ""
    )
    print(
        f"  {mode:7s} L={n:6d} {name:13s} {row['ms']:10.1f} ms   ratio {ratio:5.2f}x{memory}",
        flush=True,
    )
    return row


def plot(out: str, files: list[str]) -> None:
    """Time and peak memory against length: one line per encoding and path (plain SDPA the
    floor, the blocked core solid, the explicit bias dashed), one panel per mode."""
    import altair as alt
    import vl_convert

    rows = [r for path in files for r in json.loads(pathlib.Path(path).read_text())["rows"]]
    data = alt.Data(values=rows)
    dash = alt.StrokeDash(
        "path:N",
        scale=alt.Scale(domain=["tiled", "explicit", "plain"], range=[[1, 0], [5, 3], [1, 0]]),
    )
    lengths = sorted({r["length"] for r in rows})
    axis = alt.Axis(values=lengths, format="d", labelAngle=0)
    scale = alt.Scale(type="log", base=2, domain=[lengths[0], lengths[-1]])
    base = alt.Chart(data).encode(
        x=alt.X("length:Q", scale=scale, axis=axis, title="tokens"),
        color=alt.Color("encoding:N"),
        strokeDash=dash,
        detail="path:N",
    )
    time = base.mark_line(point=True).encode(
        y=alt.Y("ms:Q", scale=alt.Scale(type="log"), title="time (ms)")
    )
    memory = base.mark_line(point=True).encode(
        y=alt.Y("peak_mib:Q", scale=alt.Scale(type="log"), title="peak memory (MiB)")
    )
    panels = []
    for mode in dict.fromkeys(r["mode"] for r in rows):
        keep = alt.datum.mode == mode
        pair = alt.hconcat(
            time.transform_filter(keep).properties(width=260, height=200, title=mode),
            memory.transform_filter(keep).properties(width=260, height=200, title=mode),
        )
        panels.append(pair)
    chart = alt.vconcat(*panels).properties(
        title="Each encoding against plain causal SDPA (benchmarks/attention.py)"
    )
    svg = vl_convert.vegalite_to_svg(chart.to_json())
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        f.write(svg)
    os.replace(tmp, out)


def main(argv: list[str] | None = None) -> None:
    a = _args(argv)
    if a.memory_child:
        return _memory_child(a)
    if a.plot is not None:
        return plot(a.plot[0], a.plot[1:])
    import torch

    from posemb.bench.kernels import cpu_model

    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
    path = "explicit bias" if a.explicit else "blocked core"
    machine = (
        f"{where}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
        f"Python {platform.python_version()}"
    )
    print(
        f"PositionalAttention [{path}] vs causal SDPA, {a.dtype}, batch {a.batch}, {a.heads} "
        f"heads of {a.head_dim}, causal; {machine}"
    )
    rows = measure(a)
    if a.json:
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"machine": machine, "rows": rows}, f, indent=1)
        os.replace(tmp, a.json)


if __name__ == "__main__":
    main()
