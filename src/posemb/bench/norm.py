"""QK-norm + RoPE benchmark (``posemb bench --norm``): :func:`posemb.kernels.norm_rotate` against
the two steps it fuses, in the same run.

At prefill shapes (q ``(4, 32, 2048, 128)``, k ``(4, 8, 2048, 128)``, Llama 3 8B / Qwen3 8B
attention; fp32 and bf16), forward and forward+backward:

* ``norm_rotate``: posemb's one pass;
* ``rms_norm + rotate``: ``torch.nn.functional.rms_norm`` of q and k, then
  :func:`posemb.kernels.rotate` (the reference every ratio is over);
* ``rotate alone``: the rotation without any norm (forward only): what one pass over q and k
  costs, so ``norm_rotate`` over it is the norm's price;
* ``torch.compile``: the two steps (``rms_norm`` and the reference rotation) compiled by
  Inductor, which fuses them itself; its compile time is reported apart.

Methods run in rounds, one sample of each per round; each ratio is the median over rounds of
the paired ratio, so a noisy neighbour slows both sides alike. GB/s counts the least traffic:
one read and one write of q and k (the backward: reads of q, k and their gradients, a write of
each input's gradient).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from .. import kernels
from ..kernels.reference import apply_rope
from ..rope import RotaryEmbedding
from .kernels import bench_device, describe_machine, machine
from .rows import NormRow
from .timing import rounds

SHAPE_Q, SHAPE_K = (4, 32, 2048, 128), (4, 8, 2048, 128)
QUICK_Q, QUICK_K = (1, 4, 64, 64), (1, 2, 64, 64)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
EPS = 1e-6
TWO_STEP = "rms_norm + rotate"


def _methods(q, k, cos, sin, qw, kw) -> dict[str, Callable[..., tuple]]:
    """Each method as f(q, k, qw, kw) -> (q', k')."""
    d = q.shape[-1]

    def two_step(q, k, qw, kw):
        qn = torch.nn.functional.rms_norm(q, (d,), qw, EPS)
        kn = torch.nn.functional.rms_norm(k, (d,), kw, EPS)
        return kernels.rotate(qn, kn, cos, sin)

    def reference(q, k, qw, kw):
        qn = torch.nn.functional.rms_norm(q, (d,), qw, EPS)
        kn = torch.nn.functional.rms_norm(k, (d,), kw, EPS)
        return apply_rope(qn, cos, sin), apply_rope(kn, cos, sin)

    return {
        "norm_rotate": lambda q, k, qw, kw: kernels.norm_rotate(q, k, cos, sin, qw, kw, EPS),
        TWO_STEP: two_step,
        "rotate alone": lambda q, k, qw, kw: kernels.rotate(q, k, cos, sin),
        "torch.compile": torch.compile(reference, dynamic=False),
    }


def _step(fn, q, k, qw, kw, grads, backward: bool) -> Callable[[], object]:
    if not backward:

        def forward() -> object:
            with torch.no_grad():
                return fn(q, k, qw, kw)

        return forward

    def both() -> object:
        leaves = [t.detach().requires_grad_() for t in (q, k, qw, kw)]
        out = fn(*leaves)
        torch.autograd.backward(out, grads)
        return [t.grad for t in leaves]

    return both


def run(
    device: str = "cpu",
    quick: bool = False,
    repeats: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[NormRow]:
    """Time every method at the prefill shapes, fp32 and bf16, forward and forward+backward.

    Args:
        device: "cpu" or "cuda".
        quick: small shapes, 2 rounds: proves the harness works (CI), measures nothing.
        repeats: rounds per measurement (default 7 on CPU, 30 on GPU).
        progress: called with a line per measurement.
    """
    dev = bench_device(device)
    meta = machine(dev)
    shape_q, shape_k = (QUICK_Q, QUICK_K) if quick else (SHAPE_Q, SHAPE_K)
    reps = repeats or (2 if quick else (7 if dev.type == "cpu" else 30))
    rows: list[NormRow] = []
    for dtype_name, dtype in DTYPES.items():
        g = torch.Generator().manual_seed(0)
        q = torch.randn(shape_q, generator=g).to(dev, dtype)
        k = torch.randn(shape_k, generator=g).to(dev, dtype)
        qw = (1 + 0.1 * torch.randn(shape_q[-1], generator=g)).to(dev, dtype)
        kw = (1 + 0.1 * torch.randn(shape_q[-1], generator=g)).to(dev, dtype)
        cos, sin = RotaryEmbedding(shape_q[-1]).cos_sin(torch.arange(shape_q[2]), device=dev)
        grads = (torch.randn_like(q), torch.randn_like(k))
        methods = _methods(q, k, cos, sin, qw, kw)
        for mode, backward in (("forward", False), ("forward+backward", True)):
            steps = {
                name: _step(fn, q, k, qw, kw, grads, backward)
                for name, fn in methods.items()
                if not (backward and name == "rotate alone")
            }
            first = {}
            for name, step in steps.items():
                t0 = time.perf_counter()
                step()
                first[name] = (time.perf_counter() - t0) * 1e3
            sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
            times = rounds(steps, reps, sync)
            moved = (q.numel() + k.numel()) * q.element_size() * (5 if backward else 2)
            where = ("x".join(map(str, shape_q)) + "+" + "x".join(map(str, shape_k)), dtype_name)
            rows += _rows(where, mode, times, first, moved, meta, progress)
    return rows


def _rows(where, mode, times, first, moved, meta, progress) -> list[NormRow]:
    base = times[TWO_STEP]
    other = "rotate alone" if mode == "forward" else "torch.compile"
    rows = []
    for method, ts in times.items():
        med = statistics.median(ts)
        qs = statistics.quantiles(ts, n=5) if len(ts) > 1 else [med] * 4
        speedup = statistics.median(b / t for b, t in zip(base, ts, strict=True) if t > 0)
        versus = statistics.median(t / o for t, o in zip(ts, times[other], strict=True) if o > 0)
        gbps = moved / (med * 1e-3) / 1e9 if med > 0 else None
        rows.append(
            NormRow(where[0], where[1], mode, method, med, qs[0], qs[-1], gbps, speedup,
                    versus, other, first[method], **meta)
        )  # fmt: skip
        if progress:
            progress(f"{where[1]:5} {mode:16} {method:18} {med:9.1f} ms  {speedup:5.2f}x two-step")
    return rows


def summary(rows: list[NormRow]) -> str:
    """A one-screen table per dtype and mode."""
    if not rows:
        return "no measurements"
    r0 = rows[0]
    lines = [
        f"posemb bench --norm: q+k {r0.shape}, {describe_machine(r0)}",
        f"{'dtype':5} {'mode':16} {'method':18} {'median ms':>10} {'GB/s':>7} "
        f"{'vs two-step':>11} {'time / paired':>22}",
    ]
    for r in rows:
        gbps = "-" if r.gbps is None else f"{r.gbps:.1f}"
        versus = "-" if r.vs_method is None else f"{r.vs_method:.2f}x {r.compared_with}"
        lines.append(
            f"{r.dtype:5} {r.mode:16} {r.method:18} {r.median_ms:10.1f} {gbps:>7} "
            f"{r.vs_two_step:10.2f}x {versus:>22}"
        )
    lines.append(
        "vs two-step: its time over the method's (>1: faster); time / paired: the method's time "
        "over rotate alone (forward) or torch.compile (forward+backward); medians over rounds"
    )
    return "\n".join(lines)


__all__ = ["NormRow", "run", "summary"]
