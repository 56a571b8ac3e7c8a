"""How the fused CPU op is compiled: one description for the wheel (``setup.py``) and for the
just-in-time build of a source checkout (:mod:`posemb.kernels.cpu`), so the two cannot drift.

The op is written against PyTorch's stable ABI and targets torch 2.10, its first release with
``torch::stable::parallel_for``: a library built once loads into torch 2.10 and every later
release without a rebuild, and it includes no Python header, so one wheel serves every CPython
(``abi3``). ``TORCH_TARGET_VERSION`` also makes torch's non-stable headers refuse to compile,
so nothing outside the stable ABI can creep in.

Instruction sets are not taken from the building machine: the row loop is compiled once per
variant (``rows_baseline.cpp``, ``rows_avx2.cpp``, ``rows_avx512.cpp``,
``rows_avx512_bf16.cpp``, each setting its own target in the source) and the library picks one
at run time. The flags here are the same on
every machine.

This module imports nothing but the standard library: ``setup.py`` loads it by path.
"""

from __future__ import annotations

import hashlib
import pathlib
import sys

CSRC = pathlib.Path(__file__).with_name("csrc")
SOURCES = (
    "ops.cpp",
    "rows_baseline.cpp",
    "rows_avx2.cpp",
    "rows_avx512.cpp",
    "rows_avx512_bf16.cpp",
    "fire.cpp",
)
HEADERS = ("rope.h", "rows.inc", "norm.inc", "avx512.inc")
# The stable ABI's version this library needs at run time (major, minor).
TARGET = (2, 10)
LIBRARY = "_C"  # posemb/_C.abi3.so in the wheel


def source_paths() -> list[pathlib.Path]:
    """The files compiled into the op (sources, then the headers they include)."""
    return [CSRC / name for name in SOURCES + HEADERS]


def source_hash() -> str:
    """A short hash of every source file: a prebuilt library records the sources it came
    from, so a source checkout can tell when its in-tree build is stale."""
    digest = hashlib.sha256()
    for path in source_paths():
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cflags() -> list[str]:
    """Compiler flags for every source (the instruction sets are set inside the sources)."""
    major, minor = TARGET
    return [
        "-O3",
        # `omp simd` vectorisation hints without an OpenMP runtime: threads come from torch.
        "-fopenmp-simd",
        "-fvisibility=hidden",
        f"-DTORCH_TARGET_VERSION=0x{major:02x}{minor:02x}000000000000",
        f"-DPOSEMB_SOURCE_HASH=0x{source_hash()}ULL",
    ]


def ldflags() -> list[str]:
    """Linker flags: on Linux, drop the symbol table (the wheel's library shrank from 895 KB)
    and link only the torch libraries whose symbols are used (libtorch_cpu: the stable C shim)."""
    if sys.platform.startswith("linux"):
        return ["-s", "-Wl,--as-needed"]
    return []
