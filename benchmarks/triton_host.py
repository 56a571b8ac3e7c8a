"""The host's share of a Triton rotation call, measured on a machine with no GPU.

At decode shapes the kernel takes microseconds and the call is what the host does around it:
argument checks, backend choice, the registered op's dispatcher and autograd wrapper, output
allocation, ``wrap_triton``, and Triton's own launcher. Everything but the last can be timed on
the CPU: this script runs posemb's Triton path on CPU tensors (``TRITON_INTERPRET=1``, so the
backend accepts them) with the kernel replaced by a stub that launches nothing, and reports the
median microseconds per call of:

- ``rotate, full checks``: ``kernels.rotate(..., backend="triton")``, every check, then the
  path it picks (a direct launch where nothing traces and no gradient is wanted);
- ``registered op``: ``torch.ops.posemb.rotate_triton`` on checked tables (the path of a call
  that wants a gradient or is traced);
- ``remembered signature``: what ``kernels.rotate`` does for a CUDA call whose signature
  passed every check before (the signature compared, then the direct launch);
- ``one torch op (add)``: ``torch.add`` of the same q, a floor for anything that allocates.

Triton's launcher (binding and specialising the arguments, the driver call) is not in these
figures: it needs a GPU. ``PYTHONPATH=<older checkout>/src`` times an older posemb the same way.

    python benchmarks/triton_host.py [--calls 3000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: CPU tensors are accepted

import torch

import posemb
from posemb import kernels
from posemb.kernels import triton as tr


class _NoLaunch:
    """Stands in for the kernel: ``kernel[grid](...)`` does nothing."""

    def __getitem__(self, grid: object) -> Callable[..., None]:
        return lambda *args, **kw: None


def _median_us(fn: Callable[[], object], calls: int, rounds: int = 7) -> float:
    fn()
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(per)


def _methods(batch: int) -> dict[str, Callable[[], object]]:
    """The calls timed at Llama 3.1 8B's decode shapes, one token per sequence."""
    q = torch.randn(batch, 32, 1, 128, dtype=torch.bfloat16)
    k = torch.randn(batch, 8, 1, 128, dtype=torch.bfloat16)
    pos = torch.full((batch, 1), 1000)
    cos, sin = posemb.cos_sin(pos, posemb.inv_freq(128, 500000.0, dtype=torch.float64))
    cos, sin = cos.float().contiguous(), sin.float().contiguous()
    flat = cos.reshape(-1, 64), sin.reshape(-1, 64)
    stride = 1 if batch > 1 else 0
    timed: dict[str, Callable[[], object]] = {
        "rotate, full checks": lambda: kernels.rotate(q, k, cos, sin, backend="triton"),
        "registered op": lambda: torch.ops.posemb.rotate_triton(
            q, k, *flat, None, None, False, False, None, None, None, 0, stride
        ),
        "one torch op (add)": lambda: torch.add(q, 1),
    }
    try:
        from posemb.kernels import triton_path
    except ImportError:  # an older posemb: no remembered path
        return timed
    sig = triton_path.signature(q, k, cos, sin, "half")
    eager = triton_path.eager
    kw = {"sig": sig} if "sig" in eager.__code__.co_varnames else {}
    layout = kernels.Layout.HALF

    def remembered() -> object:
        if triton_path.signature(q, k, cos, sin, "half") == sig:
            return eager(q, k, cos, sin, layout, **kw)
        raise AssertionError("signature changed")

    timed["remembered signature"] = remembered
    return timed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000, help="calls per round (7 rounds)")
    a = parser.parse_args(argv)
    torch.set_num_threads(1)
    tr._rope_kernel = _NoLaunch()  # type: ignore[assignment]
    tr.wrap_triton = lambda kernel: kernel  # type: ignore[assignment]
    for batch in (1, 8):
        print(f"batch {batch}: q ({batch}, 32, 1, 128), k ({batch}, 8, 1, 128), bf16, launch "
              "stubbed")  # fmt: skip
        for name, fn in _methods(batch).items():
            print(f"  {name:24} {_median_us(fn, a.calls):7.1f} us per call")
    print(f"posemb {posemb.__version__} from {os.path.dirname(posemb.__file__)}, "
          f"torch {torch.__version__}, 1 thread")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
