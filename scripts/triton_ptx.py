"""The Triton kernels of posemb compiled for an H100/H200 (sm_90) on a machine with no GPU: the
speed proxies one can read without running them.

For each case (a shape, a dtype, a layout), the kernel is specialised the way Triton's launcher
specialises a real call (each integer argument and pointer marked 16-divisible where it is, an
integer equal to 1 made a constant), compiled to PTX and assembled with the ptxas that ships with
Triton, and the script reports per kernel:

- ``regs``: registers per thread (ptxas -v); above 128 halves the resident warps on sm_90;
- ``spill``: bytes spilled to local memory, stores + loads (should be 0);
- ``ld`` / ``st``: the global loads and stores of each vector width (v4 of 32-bit = 128-bit);
- ``vec``: the widest global load in bits.

    python scripts/triton_ptx.py                 # the rotation and norm kernels, every case
    python scripts/triton_ptx.py --json out.json

Nothing runs on a device; ``TRITON_INTERPRET`` must be unset. The figures describe code, not
speed: on a GPU, ``benchmarks/gpu.sh`` measures.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import torch

CASES = (
    # name, q shape, k heads, dtype, interleaved, rotary half-width
    ("prefill fp32", (4, 32, 2048, 128), 32, torch.float32, False, 64),
    ("prefill bf16", (4, 32, 2048, 128), 32, torch.bfloat16, False, 64),
    ("prefill bf16 gqa", (4, 32, 2048, 128), 8, torch.bfloat16, False, 64),
    ("prefill bf16 interleaved", (4, 32, 2048, 128), 8, torch.bfloat16, True, 64),
    ("prefill bf16 partial", (4, 32, 2048, 128), 8, torch.bfloat16, False, 32),
    ("prefill bf16 d80 (Phi-2)", (4, 32, 2048, 80), 32, torch.bfloat16, False, 16),
    ("decode bf16 b1", (1, 32, 1, 128), 8, torch.bfloat16, False, 64),
    ("decode bf16 b1 d96, 40 heads", (1, 40, 1, 96), 8, torch.bfloat16, False, 48),
    ("decode bf16 b8", (8, 32, 1, 128), 8, torch.bfloat16, False, 64),
)


class _Capture:
    """Stands in for ``wrap_triton(kernel)``: records the launch instead of running it."""

    calls: ClassVar[list[tuple[Any, tuple, dict]]] = []

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return lambda *args, **kw: self.calls.append((self.kernel, args, kw))


def _captured(run: Callable[[], object]) -> list[tuple[Any, tuple, dict]]:
    """The launches ``run`` makes through the rotation and norm modules' ``wrap_triton``."""
    from posemb.kernels import triton as tr
    from posemb.kernels import triton_norm as tn

    saved = tr.wrap_triton, tn.wrap_triton
    _Capture.calls = []
    tr.wrap_triton = tn.wrap_triton = _Capture  # type: ignore[assignment]
    try:
        run()
    finally:
        tr.wrap_triton, tn.wrap_triton = saved
    return _Capture.calls


def _compile(kernel: Any, args: tuple, kw: dict) -> dict[str, Any]:
    """Specialise like the launcher, compile for sm_90, assemble with ptxas -v; the metrics."""
    import triton
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend, GPUTarget
    from triton.compiler import ASTSource

    fn = kernel  # the JITFunction (its .fn is the plain Python function)
    options = {k: kw[k] for k in ("num_warps", "num_stages") if k in kw}
    constexprs = {k: v for k, v in kw.items() if k not in options}
    signature, consts, attrs = {}, dict(constexprs), {}
    for i, (name, value) in enumerate(zip(fn.arg_names, args, strict=False)):
        kind, spec = native_specialize_impl(BaseBackend, value, False, True, True)
        if kind == "constexpr" or (isinstance(value, int) and value == 1):
            signature[name], consts[name] = "constexpr", value
            continue
        signature[name] = kind
        if spec:
            attrs[(i,)] = BaseBackend.parse_attr(spec)
    for name in constexprs:
        signature[name] = "constexpr"
    target = GPUTarget("cuda", 90, 32)
    src = ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs)
    compiled = triton.compile(src, target=target, options=options)
    ptx = compiled.asm["ptx"]
    return {
        "kernel": fn.__name__,
        "warps": options.get("num_warps", 4),
        **_ptxas(ptx),
        **_vectors(ptx),
    }


def _ptxas(ptx: str) -> dict[str, int]:
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "k.ptx"
        path.write_text(ptx)
        done = subprocess.run(
            [get_ptxas(90).path, "-v", "--gpu-name=sm_90a", str(path), "-o", str(path) + ".o"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    log = done.stderr
    regs = int(re.search(r"Used (\d+) registers", log).group(1))  # type: ignore[union-attr]
    spill = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", log)]
    return {"regs": regs, "spill": sum(spill)}


def _vectors(ptx: str) -> dict[str, Any]:
    loads = collections.Counter(
        re.findall(r"ld\.global(?:\.[a-z_]+)*?(\.v[248])?\.[bfsu](\d+)", ptx)
    )
    stores = collections.Counter(
        re.findall(r"st\.global(?:\.[a-z_]+)*?(\.v[248])?\.[bfsu](\d+)", ptx)
    )

    def bits(key: tuple[str, str]) -> int:
        return int(key[0][2:] if key[0] else 1) * int(key[1])

    def shown(c: collections.Counter) -> str:
        return " ".join(f"{n}x{bits(k)}" for k, n in sorted(c.items(), key=lambda kv: -bits(kv[0])))

    return {"ld": shown(loads), "st": shown(stores), "vec": max(map(bits, loads), default=0)}


def _rotation_cases() -> Iterator[tuple[str, Callable[[], object]]]:
    from posemb.kernels import triton as tr

    for name, shape, kh, dtype, inter, half in CASES:

        def run(shape=shape, kh=kh, dtype=dtype, inter=inter, half=half) -> None:
            q = torch.empty(shape, dtype=dtype, device="meta")
            k = torch.empty((shape[0], kh, *shape[2:]), dtype=dtype, device="meta")
            cos = torch.empty((shape[2], half), dtype=torch.float32, device="meta")
            tr.launch(q, k, q, k, cos, cos, interleaved=inter, conjugate=False)

        yield f"rotate {name}", run


def _norm_cases() -> Iterator[tuple[str, Callable[[], object]]]:
    from posemb.kernels import triton_norm as tn

    for name, shape, kh, dtype, inter, half in CASES:
        if inter or half * 2 != shape[-1]:
            continue

        def run(shape=shape, kh=kh, dtype=dtype, inter=inter, half=half) -> None:
            q = torch.empty(shape, dtype=dtype, device="meta")
            k = torch.empty((shape[0], kh, *shape[2:]), dtype=dtype, device="meta")
            cos = torch.empty((shape[2], half), dtype=torch.float32, device="meta")
            w = torch.empty(shape[-1], dtype=torch.float32, device="meta")
            try:
                tn._forward(q, k, q, k, w, w, cos, cos, 1e-6, inter, 0)
            except TypeError:  # the kernels before 0.3: one launch per side (for comparison)
                tn._forward(q, q, w, cos, cos, 1e-6, inter, 0)
                tn._forward(k, k, w, cos, cos, 1e-6, inter, 0)

        yield f"norm {name}", run


def report() -> list[dict[str, Any]]:
    """One row per (case, launched kernel): the metrics of :func:`_compile`."""
    rows = []
    for case, run in (*_rotation_cases(), *_norm_cases()):
        for kernel, args, kw in _captured(run):
            rows.append({"case": case, **_compile(kernel, _real(args), kw)})
    return rows


def _real(args: tuple) -> tuple:
    """Meta tensors replaced by 16-byte-aligned CPU stand-ins of one element (the compile reads
    dtypes and alignment, never memory); the launcher would see device pointers."""
    return tuple(torch.empty(16, dtype=a.dtype) if isinstance(a, torch.Tensor) else a for a in args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=pathlib.Path, help="also write the rows as JSON here")
    a = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        parser.error("unset TRITON_INTERPRET: the interpreter compiles nothing")
    rows = report()
    print(
        f"{'case':38} {'kernel':26} {'warps':>5} {'regs':>5} {'spill':>5} {'vec':>4}  "
        "loads / stores"
    )
    for r in rows:
        print(f"{r['case']:38} {r['kernel']:26} {r['warps']:5} {r['regs']:5} {r['spill']:5} "
              f"{r['vec']:4}  {r['ld']} / {r['st']}")  # fmt: skip
    if a.json:
        tmp = a.json.with_suffix(".tmp")
        tmp.write_text(json.dumps(rows, indent=2) + "\n")
        tmp.replace(a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
