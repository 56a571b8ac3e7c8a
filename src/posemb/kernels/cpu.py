"""The fused CPU path: a small C++ extension, compiled on first use and cached.

Why this form. Applying RoPE is memory-bound: the least it can cost is one read and one write
of x. Measured on a 2-core machine (x of shape (4, 32, 2048, 128), 2 threads, ``posemb bench``):
``x.mul_(1.0)`` takes 3-6 ms in fp32; the eager ``x*cos + rotate_half(x)*sin`` 160-400 ms (several
passes and four temporaries); ``torch.compile`` of the halves form 83 ms; this extension, one
pass in place with the pair rotated in registers, 4.0 ms (fp32) and 4.5 ms (bf16). Three choices
made the difference, each measured: OpenMP threads through ``at::parallel_for``; a loop the
compiler can vectorise (``omp simd`` on the pair loop, bit casts for bfloat16, AVX-512 where the
CPU has it: bfloat16 rounding is integer work); and rows in (batch, token, head) order, so a
token's cos/sin row is read once for all heads instead of the whole table once per head
(fp32 in place went from 1.6x to 1.1x ``mul_``). A numba loop reached the fp32 speed too, but
numba has no bfloat16 or float16, and ``torch.compile`` brings a compile per shape. An
out-of-place call costs what ``torch.empty_like(x).copy_(x)`` costs (1.1-1.3x): the page faults
of the fresh 134 MB output dominate both (``THP_MEM_ALLOC_ENABLE=1`` halves them).

The extension takes 20-30 s to compile once per machine (cached under ``TORCH_EXTENSIONS_DIR``);
nothing is compiled at import.

A killed process must not hang the next one. torch guards every load (not only a first build)
with a ``lock`` file that it creates and deletes itself; a process killed inside that window
leaves the file behind, and every later load of the same extension polls for it forever (this
hung a CI run for 90 minutes at ``posemb kernels --build``). posemb therefore takes an ``flock``
on ``posemb.flock`` in the build folder around torch's call: the kernel releases an flock when
its holder dies, so a ``lock`` file found while holding it was left by a dead process, or by
a loader that does not take the flock (an older posemb sharing the cache, another host on a
filesystem whose flocks are per host). To spare the second kind, the file is removed only
once it is ``_STALE_AFTER`` seconds old (a build takes 20-30 s; a load, one); until then the
load waits as torch would. Where flock is unavailable (Windows, some network filesystems)
torch's lock alone is used, as before.

Where it cannot run (no C++ compiler, no ninja, a failed build) posemb falls back to the
reference and says so once through ``logging``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from types import ModuleType

import torch

logger = logging.getLogger("posemb.kernels")

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_SOURCE = pathlib.Path(__file__).with_name("rope_cpu.cpp")
_lock = threading.Lock()
_ext: ModuleType | None = None
_error: str | None = None
_STALE_AFTER = 180.0  # seconds: far longer than any build of this kernel takes


def _flags() -> tuple[str, list[str]]:
    """Compiler flags for this CPU, and a name that keeps builds for different flags apart."""
    capability = torch.backends.cpu.get_cpu_capability()
    flags = ["-O3", "-fopenmp"]
    if capability in ("AVX2", "AVX512"):
        # AVX2 + FMA for 8-wide float math, F16C for float16 conversions.
        flags += ["-mavx2", "-mfma", "-mf16c"]
    if capability == "AVX512":
        # 16 lanes: the bfloat16 rounding is integer work that a 2-core machine feels.
        flags += [
            "-mavx512f",
            "-mavx512bw",
            "-mavx512vl",
            "-mavx512dq",
            "-mprefer-vector-width=512",
        ]
    return f"posemb_rope_cpu_{capability.lower()}", flags


def load(verbose: bool = False) -> ModuleType | None:
    """Build (first call on a machine) or load the extension; None if it cannot be had.

    The first failure is logged once at WARNING with its reason; later calls return None.
    """
    global _ext, _error
    if _ext is not None or _error is not None:
        return _ext
    with _lock:
        if _ext is not None or _error is not None:
            return _ext
        if shutil.which("c++") is None and shutil.which("g++") is None:
            _error = "no C++ compiler (c++/g++) on PATH"
        else:
            try:
                import ninja  # noqa: F401  (torch's extension builder needs it)
            except ImportError:
                _error = "the ninja package is not installed"
        if _error is None:
            from torch.utils.cpp_extension import load as build

            name, flags = _flags()
            if not _is_built(name):
                # A first call otherwise looks like a hang: say what the wait is, once.
                print(
                    f"posemb: building the fused CPU RoPE kernel {name} (once per machine, "
                    f"20-30 s; `posemb kernels --build` does it ahead of time)",
                    file=sys.stderr,
                    flush=True,
                )
            try:
                folder = _build_folder(name)
                with _exclusive(folder):
                    _ext = build(
                        name,
                        sources=[str(_SOURCE)],
                        extra_cflags=flags,
                        extra_ldflags=["-fopenmp"],
                        build_directory=folder,  # None: torch's own choice
                        verbose=verbose,
                    )
            except Exception as err:  # a build failure must not break the reference path
                _error = f"building the extension failed: {str(err).splitlines()[0][:300]}"
        if _error is not None:
            logger.warning("posemb: fused CPU RoPE unavailable (%s); using the reference", _error)
        return _ext


def _build_folder(name: str) -> str | None:
    """torch's build folder for extension ``name`` (created if missing), so that posemb's
    lock and torch's build share it; None if torch's private helper for it has moved."""
    try:
        from torch.utils.cpp_extension import _get_build_directory

        return str(_get_build_directory(name, verbose=False))
    except (ImportError, TypeError, AttributeError):
        return None


@contextlib.contextmanager
def _exclusive(folder: str | None) -> Iterator[None]:
    """Hold an flock on ``folder/posemb.flock``; under it, remove torch's ``lock`` file once
    it is stale (see the module docstring). Without a folder or flock: nothing (torch's own
    lock alone)."""
    try:
        import fcntl
    except ImportError:
        fcntl = None  # type: ignore[assignment]
    if folder is None or fcntl is None:
        yield
        return
    with open(os.path.join(folder, "posemb.flock"), "a") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        except OSError:  # a filesystem without flock: torch's own lock alone, as before
            yield
            return
        try:
            _clear_stale_lock(os.path.join(folder, "lock"))
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _clear_stale_lock(path: str, stale_after: float | None = None) -> None:
    """Wait while torch's lock file ``path`` is younger than ``stale_after`` seconds (a live
    loader that takes no flock); remove it once it is older (left by a dead process)."""
    limit = _STALE_AFTER if stale_after is None else stale_after
    said = False
    while True:
        try:
            age = time.time() - os.path.getmtime(path)
        except FileNotFoundError:
            return
        if age >= limit:
            logger.warning(
                "posemb: removing %s (%.0f s old), left by a process killed while loading "
                "the kernel",
                path,
                age,
            )
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
            return
        if not said:
            print(
                f"posemb: waiting for {path} (another process is loading the kernel; removed "
                f"if it is still there {limit:.0f} s after it was made)",
                file=sys.stderr,
                flush=True,
            )
            said = True
        time.sleep(0.2)


def _is_built(name: str) -> bool:
    """Is a build of extension ``name`` already in torch's extension cache?"""
    folder = _build_folder(name)
    if folder is None:  # a private helper: if it moves, say nothing rather than fail
        return True
    return os.path.exists(os.path.join(folder, f"{name}.so"))


def available() -> bool:
    """Can the fused CPU path run here? Builds it if needed, except inside ``torch.compile``,
    where it answers from what this process has loaded: tracing must not build (or lock)."""
    if torch.compiler.is_compiling():
        return _ext is not None
    return load() is not None


def unavailable_reason() -> str | None:
    """Why the fused CPU path cannot run, or None if it can (builds it if needed)."""
    load()
    return _error


def rope_apply(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    out: torch.Tensor,
    interleaved: bool,
    conjugate: bool = False,
) -> torch.Tensor:
    """Rotate ``x`` into ``out`` (``out`` may be ``x``: in place). Arguments are checked by
    the caller (:func:`posemb.kernels.rotate`).

    Args:
        x: ``(B, H, S, D)`` CPU tensor, unit stride in D, float32/bfloat16/float16.
        cos, sin: float32 contiguous ``(1 or B, S, r/2)``.
        out: like ``x``.
        interleaved: pair (2j, 2j+1) instead of (j, j + r/2).
        conjugate: rotate by -theta (the backward pass).

    Returns:
        ``out``.
    """
    ext = load()
    if ext is None:
        raise RuntimeError(f"the fused CPU RoPE kernel is unavailable: {_error}")
    ext.rope_apply(x, cos, sin, out, interleaved, conjugate)
    return out
