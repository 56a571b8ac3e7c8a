"""The fused CPU path: posemb's C++ ops ``posemb::rotate_cpu`` and ``rotate_cpu_``, found and
loaded here, in this order:

1. **wheel**: the library built into the installed package (``posemb/_C.abi3.so``). It is
   written against PyTorch's stable ABI for torch >= 2.10 (:mod:`posemb.kernels.build`), so it
   loads into any such torch without a compiler; older torch is refused with the reason.
2. **jit**: in a source checkout, the same sources compiled on first use by
   ``torch.utils.cpp_extension`` (needs a C++ compiler and ``pip install 'posemb[jit]'`` for
   ninja; ~3 s once, cached under ``TORCH_EXTENSIONS_DIR``).
3. Otherwise the reference, with one warning that names why (for a failed build, its last
   lines).

Nothing is loaded or compiled at import. :func:`info` says which source was loaded and which
instruction-set variant runs; ``posemb kernels`` prints it.

Why this form. Applying RoPE is memory-bound: the least it can cost is one read and one write
of x. The op reads each element once, rotates the pair in registers and writes it back, with
threads from torch's own pool (``torch.set_num_threads`` holds) and work in tiles of tokens
so that a tile of the cos/sin table stays in cache while every head passes over it. The row
loop is compiled for a baseline, AVX2 (+FMA, F16C), AVX-512 and AVX-512 with AVX512_BF16, and
the best one this CPU runs is picked at load time;
``POSEMB_CPU_VARIANT=baseline|avx2|avx512|avx512_bf16`` forces one (an unknown
name, or one this CPU cannot run, is an error). ``posemb bench`` measures it.

A killed process must not hang the next JIT load. torch guards every load with a ``lock`` file
it creates and deletes itself; a process killed inside that window leaves it behind, and
every later load polls for it forever (this hung a CI run for 90 minutes). posemb therefore
takes an ``flock`` on ``posemb.flock`` in the build folder around torch's call: the kernel
releases an flock when its holder dies, so a ``lock`` found while holding it was left by a
dead process, or by a loader that takes no flock (an older posemb, another host on a
filesystem whose flocks are per host). To spare the second kind, it is removed only once it
is ``_STALE_AFTER`` seconds old; until then the load waits as torch would.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import importlib.machinery
import json
import logging
import os
import pathlib
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator

import torch

from .._errors import BackendUnavailable, InputError
from . import build as _build

logger = logging.getLogger("posemb.kernels")

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
VARIANT_ENV = "POSEMB_CPU_VARIANT"
JIT_NAME = "posemb_cpu"
_PACKAGE = pathlib.Path(__file__).resolve().parent.parent
_lock = threading.Lock()
_loaded: Loaded | None = None
_error: str | None = None
_on_load: list[Callable[[], None]] = []
_STALE_AFTER = 180.0  # seconds: far longer than any build of this kernel takes


@dataclasses.dataclass(frozen=True)
class Loaded:
    """What was loaded: from where, and which instruction-set variant runs.

    Attributes:
        source: ``"wheel"`` (built into the installed package) or ``"jit"`` (compiled here).
        path: the shared library.
        variant: the running variant: ``"baseline"``, ``"avx2"``, ``"avx512"`` or
            ``"avx512_bf16"``.
        variant_reason: why that variant runs.
        variants: every compiled variant and whether this CPU can run it.
        torch_headers: the torch version whose headers compiled the library.
        torch_target: the oldest torch it loads into (its stable-ABI target).
        skipped: why an earlier source in the order was not used (e.g. a stale in-tree build).
        load_seconds: how long finding, building and loading took in this process.
    """

    source: str
    path: str
    variant: str
    variant_reason: str
    variants: dict[str, bool]
    torch_headers: str
    torch_target: str
    skipped: tuple[str, ...]
    load_seconds: float


def _torch_version() -> tuple[int, int]:
    parts = torch.__version__.split("+")[0].split(".")
    return int(parts[0]), int(parts[1])


def _abi_version(value: int) -> str:
    return f"{value >> 56}.{(value >> 48) & 0xFF}"


def prebuilt_path() -> pathlib.Path | None:
    """The library built into this install (``posemb/_C.*``), or None."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = _PACKAGE / f"{_build.LIBRARY}{suffix}"
        if path.exists():
            return path
    return None


def _prebuilt_refusal(path: pathlib.Path) -> str | None:
    """Why the prebuilt library must not be loaded here, or None. It is never opened to
    find out: opening registers its ops, and a second library could then not register."""
    target = _build.TARGET
    if _torch_version() < target:
        return (
            f"the prebuilt op needs torch >= {target[0]}.{target[1]} (its stable ABI); this is "
            f"torch {torch.__version__}"
        )
    if _build.CSRC.exists():  # a source checkout: is the in-tree build of these sources?
        try:
            built = json.loads(path.with_name(f"{_build.LIBRARY}.json").read_text())["sources"]
        except (OSError, ValueError, KeyError, TypeError):
            built = None
        if built != _build.source_hash():
            return f"the in-tree build {path.name} is stale (its sources have changed)"
    return None


def _jit_refusal() -> str | None:
    """Why the JIT build cannot be tried here, or None."""
    if not _build.CSRC.exists():
        return "this install has no sources to build one"
    target = _build.TARGET
    if _torch_version() < target:
        return (
            f"building the op needs torch >= {target[0]}.{target[1]} (its stable ABI); this is "
            f"torch {torch.__version__}"
        )
    if shutil.which("c++") is None and shutil.which("g++") is None:
        return "no C++ compiler (c++/g++) on PATH to build one"
    return _ninja_refusal()


def _ninja_refusal() -> str | None:
    """Why torch's builder would not find ninja, or None.

    torch runs ``ninja --version`` from PATH. The ninja package (the ``jit`` extra) keeps its
    binary in its own folder, a venv's ``bin`` that need not be on PATH (a venv used without
    activating it, as the Makefile does): that folder is put on this process's PATH. A system
    ninja (Debian's ninja-build) serves as well without the package.
    """
    from torch.utils.cpp_extension import is_ninja_available

    try:
        import ninja

        folder = getattr(ninja, "BIN_DIR", None)
    except ImportError:
        folder = None
    path = os.environ.get("PATH", "")
    if folder and os.path.isdir(folder) and folder not in path.split(os.pathsep):
        os.environ["PATH"] = folder + (os.pathsep + path if path else "")
    if is_ninja_available():
        return None
    return (
        "no ninja to build one: none on PATH and no ninja package (pip install 'posemb[jit]', "
        "or a system ninja-build)"
    )


def _build_error(err: BaseException) -> str:
    """A failed build's reason: its first line and the compiler's last lines."""
    lines = [line for line in str(err).splitlines() if line.strip()]
    if len(lines) <= 12:
        return "\n".join(lines)
    return "\n".join([lines[0], "...", *lines[-10:]])


def _jit_build(verbose: bool) -> str:
    """Compile the sources into torch's extension cache (if needed) and load them; the
    library's path. Raises what torch's builder raises."""
    from torch.utils.cpp_extension import load as build

    folder = _build_folder(JIT_NAME)
    if not _is_built(JIT_NAME):
        # A first call otherwise looks like a hang: say what the wait is, once.
        print(
            f"posemb: building the fused CPU RoPE op {JIT_NAME} (once per machine, ~3-10 s; "
            f"`posemb kernels --build` does it ahead of time)",
            file=sys.stderr,
            flush=True,
        )
    with _exclusive(folder):
        path = build(
            JIT_NAME,
            sources=[str(_build.CSRC / name) for name in _build.SOURCES],
            extra_cflags=_build.cflags(),
            extra_ldflags=_build.ldflags(),
            build_directory=folder,  # None: torch's own choice
            is_python_module=False,  # a plain library, loaded with torch.ops.load_library
            verbose=verbose,
        )
    return str(path)


def _choose_variant(lib: ctypes.CDLL) -> tuple[str, str, dict[str, bool]]:
    """Pick the variant to run (the best this CPU can, unless ``POSEMB_CPU_VARIANT`` says);
    its name, why, and every variant with whether it can run here."""
    lib.posemb_variant_name.restype = ctypes.c_char_p
    names = [lib.posemb_variant_name(i).decode() for i in range(lib.posemb_variant_count())]
    runs = {name: bool(lib.posemb_variant_can_run(i)) for i, name in enumerate(names)}
    wanted = os.environ.get(VARIANT_ENV, "auto").strip().lower() or "auto"
    if wanted == "auto":
        best = names[lib.posemb_variant_active()]
        others = [n for n in names if not runs[n]]
        why = "the widest this CPU runs"
        if others:
            why += f" (it cannot run {', '.join(others)})"
        return best, why, runs
    if wanted not in names:
        raise InputError(f"{VARIANT_ENV} must be auto or one of {', '.join(names)}, got {wanted!r}")
    if not runs[wanted]:
        can = [n for n in names if runs[n]]
        raise InputError(
            f"{VARIANT_ENV}={wanted}: this CPU cannot run the {wanted} variant; it can run "
            f"{', '.join(can)}"
        )
    lib.posemb_variant_use(names.index(wanted))
    return wanted, f"forced by {VARIANT_ENV}={wanted}", runs


@dataclasses.dataclass(frozen=True)
class _Library:
    """A library whose ops are registered in this process: once one is, no other may be."""

    path: str
    source: str
    skipped: tuple[str, ...]
    seconds: float


_library: _Library | None = None


def _describe(library: _Library) -> Loaded:
    """Choose the variant and read what the library says of itself; raises ``ValueError``
    for a bad ``POSEMB_CPU_VARIANT`` (every call, until it is fixed)."""
    lib = ctypes.CDLL(library.path)
    lib.posemb_torch_headers.restype = ctypes.c_uint64
    lib.posemb_torch_target.restype = ctypes.c_uint64
    variant, why, runs = _choose_variant(lib)
    return Loaded(
        source=library.source,
        path=library.path,
        variant=variant,
        variant_reason=why,
        variants=runs,
        torch_headers=_abi_version(lib.posemb_torch_headers()),
        torch_target=_abi_version(lib.posemb_torch_target()),
        skipped=library.skipped,
        load_seconds=library.seconds,
    )


def _find(verbose: bool) -> _Library | None:
    """Load the wheel's library, else the JIT build's; None (and ``_error`` set) when
    neither loads. A library that failed to open registered nothing, so the next is tried."""
    global _error
    started = time.perf_counter()
    skipped: list[str] = []
    path = prebuilt_path()
    if path is not None:
        refusal = _prebuilt_refusal(path)
        if refusal is None:
            try:
                torch.ops.load_library(str(path))
                return _Library(str(path), "wheel", (), time.perf_counter() - started)
            except OSError as err:  # e.g. a glibc older than the one it was built against
                refusal = f"the prebuilt op {path.name} does not load here: {err}"
        skipped.append(refusal)
    reason = _jit_refusal()
    if reason is None:
        try:
            built = _jit_build(verbose)
            return _Library(built, "jit", tuple(skipped), time.perf_counter() - started)
        except Exception as err:  # a build failure must not break the reference path
            reason = f"building the op failed:\n{_build_error(err)}"
    _error = "; ".join([*(skipped or ["no prebuilt op in this install"]), reason])
    return None


NOTE = "posemb-unavailable.txt"  # in torch's build folder: the reason last announced
NOTE_LIFETIME_S = 24 * 3600


def _announce(reason: str, announce: bool) -> None:
    """Warn why the reference runs, once per machine where the op cannot even be tried.

    A machine with no compiler or no ninja stays that way from one process to the next, and
    ``make demo`` runs five posemb processes: each used to warn. The first process to find a
    reason writes it to ``NOTE`` in torch's build folder; a later one that finds the same
    reason there, written within a day, logs it at DEBUG. A failed build is never quieted (it
    is a fault to report), a note is written only when the reason was shown (WARNING enabled,
    or ``announce=False``: the caller says it), and ``posemb kernels`` always says the reason.
    An unwritable cache writes no note: every process warns, as before."""
    folder = _build_folder(JIT_NAME)
    note = pathlib.Path(folder) / NOTE if folder else None
    try:
        # A note a day old is said again: whoever saw it then may not be the one running now.
        fresh = note is not None and time.time() - note.stat().st_mtime < NOTE_LIFETIME_S
        said = fresh and note is not None and note.read_text(encoding="utf-8") == reason
    except (OSError, UnicodeDecodeError):
        said = False
    failed = reason.startswith("building the op failed") or "; building the op failed" in reason
    shown = not announce or logger.isEnabledFor(logging.WARNING)  # someone was told
    if announce and (failed or not said):
        logger.warning("posemb: fused CPU RoPE unavailable (%s); using the reference", reason)
    else:
        logger.debug("posemb: fused CPU RoPE unavailable (%s); using the reference", reason)
    if note is not None and not said and not failed and shown:
        tmp = note.with_name(f".{NOTE}.{os.getpid()}.tmp")
        try:
            tmp.write_text(reason, encoding="utf-8")
            os.replace(tmp, note)
        except OSError:  # a read-only cache: every process warns, as before
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)


def load(verbose: bool = False, announce: bool = True) -> Loaded | None:
    """Load the op (building it first in a source checkout); None if it cannot be had.

    The first failure is logged once at WARNING with its reason (once per machine where the op
    cannot be tried, see :func:`_announce`; never with ``announce=False``); later calls return
    None. Raises ``ValueError`` for a ``POSEMB_CPU_VARIANT`` that is unknown or cannot run here.
    """
    global _loaded, _library
    if _loaded is not None or _error is not None:
        return _loaded
    with _lock:
        if _loaded is not None or _error is not None:
            return _loaded
        if _library is None:
            library = _find(verbose)
            if library is None:
                _announce(str(_error), announce)
                return None
            for hook in _on_load:
                hook()
            _library = library
        _loaded = _describe(_library)
        return _loaded


def on_load(hook: Callable[[], None]) -> None:
    """Run ``hook`` once the op is loaded (now, if it is): the Python halves of the ops
    (fake implementations, autograd) can only be registered on ops that exist."""
    _on_load.append(hook)
    if _library is not None:
        hook()


def info() -> Loaded | None:
    """What :func:`load` loaded, or None (loads it if needed)."""
    return load()


def use_variant(name: str) -> str:
    """Run instruction-set variant ``name`` from now on (tests force each one); the name of
    the variant that ran before. Raises ``ValueError`` if it is unknown or cannot run here."""
    global _loaded
    loaded = load()
    if loaded is None:
        raise BackendUnavailable(f"the fused CPU RoPE op is unavailable: {_error}")
    if name not in loaded.variants:
        raise InputError(f"variant must be one of {', '.join(loaded.variants)}, got {name!r}")
    if not loaded.variants[name]:
        raise InputError(f"this CPU cannot run the {name} variant")
    lib = ctypes.CDLL(loaded.path)
    lib.posemb_variant_use(list(loaded.variants).index(name))
    _loaded = dataclasses.replace(loaded, variant=name, variant_reason="set by use_variant")
    return loaded.variant


def _build_folder(name: str) -> str | None:
    """torch's build folder for extension ``name`` (created if missing), so that posemb's
    lock and torch's build share it; None if torch's private helper for it has moved."""
    # Importing torch's builder logs "No CUDA runtime is found" on a CPU machine: noise when
    # posemb only asks where its note lives (the op not being built at all).
    builder_log = logging.getLogger("torch.utils.cpp_extension")
    level = builder_log.level
    builder_log.setLevel(logging.ERROR)
    try:
        from torch.utils.cpp_extension import _get_build_directory

        return str(_get_build_directory(name, verbose=False))
    except (ImportError, TypeError, AttributeError):
        return None
    except OSError:  # an unwritable cache (a read-only image, HOME=/nonexistent)
        return None
    finally:
        builder_log.setLevel(level)


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
    """Can the fused CPU path run here? Loads (or builds) it if needed, except inside
    ``torch.compile``, where it answers from what this process has loaded: tracing must not
    build (or lock)."""
    if torch.compiler.is_compiling():
        return _loaded is not None
    return load() is not None


def unavailable_reason() -> str | None:
    """Why the fused CPU path cannot run, or None if it can (loads it if needed)."""
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
    """Rotate ``x`` into ``out`` (``out`` may be ``x``: in place) through the op.

    Args:
        x: ``(B, H, S, D)`` CPU tensor, unit stride in D, float32/bfloat16/float16.
        cos, sin: float32 contiguous ``(1 or B, S, r/2)``.
        out: like ``x``.
        interleaved: pair (2j, 2j+1) instead of (j, j + r/2).
        conjugate: rotate by -theta (the backward pass).

    Returns:
        ``out``.
    """
    if load() is None:
        raise BackendUnavailable(f"the fused CPU RoPE op is unavailable: {_error}")
    none = x[:, :0]  # a side with no heads costs nothing
    if out is x:
        torch.ops.posemb.rotate_cpu_(x, none, cos, sin, None, None, interleaved, conjugate)
    else:
        into = torch.ops.posemb._rotate_cpu_into
        into(x, none, out, out[:, :0], cos, sin, None, None, interleaved, conjugate)
    return out
