"""The CPU op itself: every instruction-set variant this machine can run against the reference,
exact conversions, how the library is found and loaded, and what it says when it is not."""

import ctypes
import logging
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch

import posemb
from posemb import Layout, kernels
from posemb.kernels import build, cpu, reference
from test_kernels import CASES, DTYPES, make, tables
from tolerances import assert_close

LOADED = cpu.load()
# Rotary halves that are not a multiple of 8 (18, 6) run the scalar loop after the vector one.
VARIANT_CASES = [*CASES, ((2, 3, 11, 40), 1, 36), ((1, 2, 5, 12), 2, 12)]
VARIANTS = list(LOADED.variants) if LOADED else ["baseline", "avx2", "avx512", "avx512_bf16"]


@pytest.fixture(params=VARIANTS)
def variant(request):
    """Run the test under each compiled variant; one this CPU cannot execute is skipped."""
    assert LOADED is not None, cpu.unavailable_reason()
    if not LOADED.variants[request.param]:
        pytest.skip(f"this CPU cannot run the {request.param} variant")
    before = cpu.use_variant(request.param)
    yield request.param
    cpu.use_variant(before)


def test_the_op_is_loaded_with_its_source_and_variant():
    assert LOADED is not None, cpu.unavailable_reason()
    assert LOADED.source in ("wheel", "jit")
    assert LOADED.variants["baseline"] is True
    assert LOADED.variants.get(LOADED.variant)
    assert LOADED.torch_target == "{}.{}".format(*build.TARGET)
    # The best variant this CPU runs is the default (unless the environment forces one).
    if os.environ.get(cpu.VARIANT_ENV, "auto") == "auto":
        assert LOADED.variant == [n for n, ok in LOADED.variants.items() if ok][-1]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", list(Layout))
@pytest.mark.parametrize("case", VARIANT_CASES, ids=lambda c: "x".join(map(str, c[0])))
def test_each_variant_matches_the_reference_forward_and_backward(variant, dtype, layout, case):
    shape, kv, rotary = case
    q, k = make(shape, kv, dtype, "cpu")
    b, _, s, _ = shape
    pos = torch.randint(0, 1 << 20, (b, s), generator=torch.Generator().manual_seed(3))
    cos, sin = tables(pos, rotary, "cpu")
    got_q, got_k = kernels.rotate(q, k, cos, sin, layout=layout, backend="cpu")
    assert_close(got_q, reference.rotate(q, cos, sin, layout), dtype)
    assert_close(got_k, reference.rotate(k, cos, sin, layout), dtype)
    qf, kf = q.clone().requires_grad_(), k.clone().requires_grad_()
    gq, gk = make(shape, kv, dtype, "cpu", seed=2)
    torch.autograd.backward(
        kernels.rotate(qf, kf, cos, sin, layout=layout, backend="cpu"), (gq, gk)
    )
    qr, kr = q.clone().requires_grad_(), k.clone().requires_grad_()
    torch.autograd.backward(
        (reference.rotate(qr, cos, sin, layout), reference.rotate(kr, cos, sin, layout)), (gq, gk)
    )
    assert_close(qf.grad, qr.grad, dtype)
    assert_close(kf.grad, kr.grad, dtype)
    # In place, through the same variant.
    q2, k2 = q.clone(), k.clone()
    kernels.rotate(q2, k2, cos, sin, layout=layout, backend="cpu", inplace=True)
    assert_close(q2, got_q, dtype)
    assert_close(k2, got_k, dtype)


def _every_bit_pattern(dtype: torch.dtype) -> torch.Tensor:
    """All 65,536 values of a 16-bit type (NaNs, infinities, subnormals), as (1, 1, 512, 128)."""
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    return bits.view(dtype).reshape(1, 1, 512, 128)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", list(Layout))
@pytest.mark.parametrize("scale", [1.0, 0.7, 3.3, 2.0**-20, 1000.0])
def test_each_variant_converts_every_half_value_exactly(variant, dtype, layout, scale):
    """With sin = 0 each output is the input times cos, rounded once: the kernel's loads,
    float32 products and rounding stores must give the reference's bits exactly (round to
    nearest even, subnormals, overflow to infinity, NaN kept NaN). Values are compared, so
    +0 equals -0: a fused multiply-subtract of a product that underflows keeps its sign where
    the reference's separate rounding gives +0."""
    x = _every_bit_pattern(dtype)
    cos = torch.full((512, 64), scale, dtype=torch.float64)
    sin = torch.zeros(512, 64, dtype=torch.float64)
    got, _ = kernels.rotate(x, x[:, :0], cos, sin, layout=layout, backend="cpu")
    want = reference.rotate(x.float(), cos, sin, layout).to(dtype)
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(got[~nan].double(), want[~nan].double())


def test_the_baseline_can_be_forced_from_the_environment():
    code = (
        "import torch, posemb\n"
        "from posemb.kernels import cpu, reference\n"
        "info = cpu.load()\n"
        "q = torch.randn(2, 3, 17, 48).bfloat16()\n"
        "cos, sin = posemb.cos_sin(torch.arange(17), posemb.inv_freq(48, dtype=torch.float64))\n"
        "got, _ = posemb.kernels.rotate(q, q[:, :1], cos, sin, backend='cpu')\n"
        "err = (got.float() - reference.rotate(q, cos, sin, 'half').float()).abs().max().item()\n"
        "print(info.variant, '|', info.variant_reason, '|', err)\n"
    )
    env = {**os.environ, cpu.VARIANT_ENV: "baseline"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    name, why, err = done.stdout.strip().split(" | ")
    assert name == "baseline" and why == f"forced by {cpu.VARIANT_ENV}=baseline"
    assert float(err) <= 2**-7  # one bfloat16 rounding of values below 2


def test_a_bad_variant_in_the_environment_is_an_error(monkeypatch):
    lib = ctypes.CDLL(LOADED.path)
    monkeypatch.setenv(cpu.VARIANT_ENV, "sse9")
    with pytest.raises(ValueError, match=r"POSEMB_CPU_VARIANT must be auto or one of baseline"):
        cpu._choose_variant(lib)
    unrunnable = [n for n, ok in LOADED.variants.items() if not ok]
    if unrunnable:
        monkeypatch.setenv(cpu.VARIANT_ENV, unrunnable[0])
        with pytest.raises(ValueError, match=f"this CPU cannot run the {unrunnable[0]} variant"):
            cpu._choose_variant(lib)
    active = LOADED.variants and list(LOADED.variants)[lib.posemb_variant_active()]
    assert active == cpu.info().variant  # the library still runs what posemb says it runs


def test_use_variant_refuses_an_unknown_name():
    with pytest.raises(ValueError, match="variant must be one of baseline, avx2"):
        cpu.use_variant("neon")


def torch_imports(library: str) -> list[str] | None:
    """The symbols ``library`` imports (``nm -D -u``), or None without binutils' nm."""
    nm = shutil.which("nm")
    if nm is None:
        return None
    out = subprocess.run([nm, "-D", "-u", library], capture_output=True, text=True, check=True)
    return [line.split()[-1] for line in out.stdout.splitlines() if line.strip()]


def assert_stable_abi_only(library: str) -> None:
    """No C++ symbol of torch (c10::, at::, torch::) and no Python C API is imported: the
    library survives a new torch release. Its torch imports are the C shim's functions."""
    symbols = torch_imports(library)
    if symbols is None:
        pytest.skip("needs binutils' nm")
    cpp = [s for s in symbols if s.startswith(("_ZN3c10", "_ZN2at", "_ZN5torch", "_ZNK3c10"))]
    assert cpp == []
    assert any(s.startswith("aoti_torch_") for s in symbols)
    assert not any(s.startswith(("Py", "_Py")) for s in symbols)


def test_the_library_calls_torch_only_through_the_stable_c_shim():
    assert_stable_abi_only(LOADED.path)


def test_the_op_checks_its_arguments_in_cpp():
    """Called directly (torch.ops), bad arguments raise instead of reading out of bounds."""
    q = torch.randn(1, 2, 5, 16)
    cos = torch.ones(1, 5, 8)
    with pytest.raises(RuntimeError, match="cos has shape"):
        torch.ops.posemb.rotate_cpu(q, q, cos[:, :4], cos[:, :4], None, None, False, False)
    with pytest.raises(RuntimeError, match="contiguous float32"):
        torch.ops.posemb.rotate_cpu(q, q, cos.double(), cos, None, None, False, False)
    with pytest.raises(RuntimeError, match="float32, bfloat16 or float16"):
        torch.ops.posemb.rotate_cpu(q.double(), q.double(), cos, cos, None, None, False, False)
    with pytest.raises(RuntimeError, match="unit stride"):
        torch.ops.posemb.rotate_cpu(q.transpose(2, 3), q, cos, cos, None, None, False, False)
    # A per-batch cos beside a shared sin would read sin past its end.
    q2, cos2 = torch.randn(2, 2, 5, 16), torch.ones(2, 5, 8)
    with pytest.raises(RuntimeError, match="sin must have cos's shape"):
        torch.ops.posemb.rotate_cpu(q2, q2, cos2, cos2[:1], None, None, False, False)
    with pytest.raises(RuntimeError, match="k_sin k_cos's"):
        torch.ops.posemb.rotate_cpu(q2, q2, cos2, cos2, cos2, cos2[:1], False, False)
    # Written tensors: no element twice (an expanded k), outputs apart from inputs.
    k_expanded = torch.randn(2, 1, 5, 16).expand(2, 4, 5, 16)
    with pytest.raises(RuntimeError, match="must not overlap"):
        torch.ops.posemb.rotate_cpu_(q2, k_expanded, cos2, cos2, None, None, False, False)
    with pytest.raises(RuntimeError, match="must not share memory"):
        torch.ops.posemb._rotate_cpu_into(
            q2, q2, q2, torch.empty_like(q2), cos2, cos2, None, None, False, False
        )
    qkv = torch.randn(2, 5, 3, 2, 16)  # one fused buffer: q and k interleave in memory
    q3, k3 = qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2)
    want_q, want_k = kernels.rotate(q3, k3, cos2, cos2 * 0, backend="reference")
    torch.ops.posemb.rotate_cpu_(q3, k3, cos2, cos2 * 0, None, None, False, False)
    assert torch.equal(q3, want_q) and torch.equal(k3, want_k)


# How the library is found ---------------------------------------------------------------------


def test_a_prebuilt_library_that_does_not_open_falls_through_to_the_jit_build(
    monkeypatch, tmp_path
):
    """dlopen failing (an older glibc) registers nothing, so the next source is tried."""
    broken = tmp_path / "_C.abi3.so"
    broken.write_bytes(b"not a library")
    monkeypatch.setattr(cpu, "prebuilt_path", lambda: broken)
    monkeypatch.setattr(cpu, "_prebuilt_refusal", lambda path: None)
    monkeypatch.setattr(cpu, "_jit_refusal", lambda: "no C++ compiler (c++/g++) on PATH")
    monkeypatch.setattr(cpu, "_error", None)
    assert cpu._find(verbose=False) is None
    assert cpu._error.startswith("the prebuilt op _C.abi3.so does not load here: ")
    assert cpu._error.endswith("; no C++ compiler (c++/g++) on PATH")


def test_a_prebuilt_op_is_refused_on_a_torch_before_its_stable_abi(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu, "_torch_version", lambda: (2, 9))
    reason = cpu._prebuilt_refusal(tmp_path / "_C.abi3.so")
    assert reason is not None and "needs torch >= 2.10 (its stable ABI)" in reason
    assert "building the op needs torch >= 2.10" in (cpu._jit_refusal() or "")


def test_a_stale_in_tree_build_is_refused(tmp_path):
    (tmp_path / "_C.json").write_text('{"sources": "0123456789abcdef"}')
    assert "is stale" in (cpu._prebuilt_refusal(tmp_path / "_C.abi3.so") or "")
    (tmp_path / "_C.json").write_text(f'{{"sources": "{build.source_hash()}"}}')
    assert cpu._prebuilt_refusal(tmp_path / "_C.abi3.so") is None
    (tmp_path / "_C.json").unlink()  # no record: not trusted
    assert "is stale" in (cpu._prebuilt_refusal(tmp_path / "_C.abi3.so") or "")


def test_a_failed_build_warns_once_with_its_last_lines(monkeypatch, caplog):
    monkeypatch.setattr(cpu, "_loaded", None)
    monkeypatch.setattr(cpu, "_library", None)
    monkeypatch.setattr(cpu, "_error", None)
    monkeypatch.setattr(cpu, "prebuilt_path", lambda: None)
    monkeypatch.setattr(cpu, "_jit_refusal", lambda: None)
    steps = [f"step {i}" for i in range(30)]
    last = "rows.inc:12: error: 'frobnicate' was not declared"
    log = "\n".join(["Error building extension 'posemb_cpu'", *steps, last])

    def fail(verbose):
        raise RuntimeError(log)

    monkeypatch.setattr(cpu, "_jit_build", fail)
    with caplog.at_level(logging.WARNING, logger="posemb.kernels"):
        assert cpu.load() is None and cpu.load() is None
    warnings = [r.getMessage() for r in caplog.records if r.name == "posemb.kernels"]
    assert len(warnings) == 1
    assert "Error building extension" in warnings[0] and "'frobnicate'" in warnings[0]
    assert "step 0" not in warnings[0]  # the middle is cut, the first and last lines kept
    assert "'frobnicate'" in (cpu.unavailable_reason() or "")


def _fresh_load(monkeypatch, reason: str) -> None:
    """A new process's first load, where the op cannot be tried for ``reason``."""
    monkeypatch.setattr(cpu, "_loaded", None)
    monkeypatch.setattr(cpu, "_library", None)
    monkeypatch.setattr(cpu, "_error", None)
    monkeypatch.setattr(cpu, "prebuilt_path", lambda: None)
    monkeypatch.setattr(cpu, "_jit_refusal", lambda: reason)


def test_a_machine_that_cannot_build_says_so_in_its_first_process_only(
    monkeypatch, caplog, tmp_path
):
    """make demo's five processes warned five times; the note in the build folder makes the
    first one say it, and a changed reason (or a failed build) is said again."""
    monkeypatch.setattr(cpu, "_build_folder", lambda name: str(tmp_path))

    def warnings(reason: str, announce: bool = True) -> list[str]:
        _fresh_load(monkeypatch, reason)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="posemb.kernels"):
            assert cpu.load(announce=announce) is None and cpu.load() is None
        return [r.getMessage() for r in caplog.records if r.name == "posemb.kernels"]

    no_cc = "no C++ compiler (c++/g++) on PATH to build one"
    assert warnings(no_cc, announce=False) == []  # posemb kernels --build says it itself
    assert (tmp_path / cpu.NOTE).read_text() == f"no prebuilt op in this install; {no_cc}"
    assert warnings(no_cc) == []  # a later process: already said
    (tmp_path / cpu.NOTE).unlink()
    assert len(warnings(no_cc)) == 1 and warnings(no_cc) == []
    assert len(warnings("no ninja to build one")) == 1  # a new reason is news
    failed = "building the op failed:\nrows.inc:1: error"
    assert len(warnings(failed)) == 1 and len(warnings(failed)) == 1  # a fault, every time

    def read_only(src, dst):
        raise PermissionError(13, "Read-only file system", str(dst))

    monkeypatch.setattr(cpu.os, "replace", read_only)  # a cache it cannot write: warns each time
    assert len(warnings("no ninja, again")) == 1 and len(warnings("no ninja, again")) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [cpu.NOTE]  # no half-written note left


def test_an_unwritable_cache_warns_and_falls_back_instead_of_raising(monkeypatch, caplog, tmp_path):
    """The note's folder is torch's build folder, which torch creates: where it cannot (a
    read-only image, HOME=/nonexistent) the first rotation raised NotADirectoryError."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(blocker / "below"))
    _fresh_load(monkeypatch, "no C++ compiler (c++/g++) on PATH to build one")
    with caplog.at_level(logging.WARNING, logger="posemb.kernels"):
        assert cpu.load() is None
    assert [r.name for r in caplog.records] == ["posemb.kernels"]  # torch's builder quiet


def test_a_note_nobody_saw_or_a_day_old_one_is_said_again(monkeypatch, caplog, tmp_path):
    monkeypatch.setattr(cpu, "_build_folder", lambda name: str(tmp_path))
    reason = "no prebuilt op in this install; no ninja"
    _fresh_load(monkeypatch, "no ninja")
    with caplog.at_level(logging.ERROR, logger="posemb.kernels"):  # warnings not shown
        assert cpu.load() is None
    assert not (tmp_path / cpu.NOTE).exists()  # so no note: the next process warns
    (tmp_path / cpu.NOTE).write_text(reason)
    old = (tmp_path / cpu.NOTE).stat().st_mtime - cpu.NOTE_LIFETIME_S - 1
    os.utime(tmp_path / cpu.NOTE, (old, old))
    _fresh_load(monkeypatch, "no ninja")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="posemb.kernels"):
        assert cpu.load() is None
    assert [r.name for r in caplog.records] == ["posemb.kernels"]  # a stale note: said again
    assert time.time() - (tmp_path / cpu.NOTE).stat().st_mtime < 60


def test_without_compiler_or_ninja_the_reason_names_the_fix(monkeypatch):
    monkeypatch.setattr(cpu.shutil, "which", lambda name: None)
    assert "no C++ compiler (c++/g++) on PATH" in (cpu._jit_refusal() or "")
    monkeypatch.setattr(cpu.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setitem(sys.modules, "ninja", None)  # import ninja -> ImportError
    from torch.utils import cpp_extension

    # No package and no ninja on PATH (a system ninja-build alone would serve: it is how
    # torch finds one).
    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: False)
    assert "pip install 'posemb[jit]'" in (cpu._jit_refusal() or "")


def test_first_build_says_so_on_stderr(monkeypatch, capsys, tmp_path):
    import contextlib

    from torch.utils import cpp_extension

    monkeypatch.setattr(cpu, "_is_built", lambda name: False)
    monkeypatch.setattr(cpu, "_build_folder", lambda name: str(tmp_path))
    monkeypatch.setattr(cpu, "_exclusive", lambda folder: contextlib.nullcontext())
    monkeypatch.setattr(cpp_extension, "load", lambda name, **kw: str(tmp_path / "lib.so"))
    assert cpu._jit_build(verbose=False) == str(tmp_path / "lib.so")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "building the fused CPU RoPE op" in err


def test_kernels_command_says_where_the_op_came_from(capsys):
    import json

    from posemb import cli

    assert cli.main(["kernels", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cpu"] == "available"
    op = report["cpu_op"]
    assert op["source"] == LOADED.source and op["variant"] == cpu.info().variant
    assert set(op["variants"]) == set(LOADED.variants)
    assert cli.main(["kernels"]) == 0
    text = capsys.readouterr().out
    assert f"cpu op     {LOADED.source}" in text and "variant" in text


# The JIT build's locks (a source checkout) -----------------------------------------------------

jit_only = pytest.mark.skipif(
    LOADED is None or LOADED.source != "jit", reason="the op here is not the JIT build"
)


def _cache_copy(tmp_path, monkeypatch) -> tuple[str, dict[str, str]]:
    """A copy of this machine's JIT build folder under a private TORCH_EXTENSIONS_DIR, so that
    a test can leave lock files in it without touching the user's cache."""
    real = cpu._build_folder(cpu.JIT_NAME)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    folder = cpu._build_folder(cpu.JIT_NAME)
    for entry in os.listdir(real):
        if entry not in ("lock", "posemb.flock"):
            shutil.copy2(os.path.join(real, entry), folder)
    return folder, {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}


_LOAD = "from posemb.kernels import cpu; assert cpu.load() is not None, cpu.unavailable_reason()"


@jit_only
def test_a_lock_left_by_a_killed_process_does_not_hang_the_next_load(tmp_path, monkeypatch):
    # torch polls its `lock` file forever; one left by a killed `posemb kernels --build` hung CI.
    folder, env = _cache_copy(tmp_path, monkeypatch)
    lock = os.path.join(folder, "lock")
    open(lock, "w").close()
    old = time.time() - 3600
    os.utime(lock, (old, old))
    done = subprocess.run(
        [sys.executable, "-c", _LOAD], env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    assert "left by a process killed while loading the kernel" in done.stderr
    assert not os.path.exists(lock)


def test_a_young_lock_is_waited_for_then_cleared(tmp_path, capsys):
    # A lock younger than the limit may belong to a live loader that takes no flock.
    lock = tmp_path / "lock"
    lock.touch()
    started = time.time()
    cpu._clear_stale_lock(str(lock), stale_after=1.0)
    assert 0.9 <= time.time() - started < 30 and not lock.exists()
    assert "waiting for" in capsys.readouterr().err
    cpu._clear_stale_lock(str(lock), stale_after=1.0)  # no file: returns at once


def _blocked_on_flock(pid: int) -> bool:
    """Is process ``pid`` waiting for an flock (a '->' line of /proc/locks)?"""
    with open("/proc/locks") as f:
        return any("->" in line and " FLOCK " in line and f" {pid} " in line for line in f)


@jit_only
@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="needs Linux's /proc/locks")
def test_a_live_build_is_waited_for_not_robbed(tmp_path, monkeypatch):
    import fcntl

    folder, env = _cache_copy(tmp_path, monkeypatch)
    lock = os.path.join(folder, "lock")
    old = time.time() - 3600  # old enough to be cleared, were its holder not alive
    with open(os.path.join(folder, "posemb.flock"), "a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # another posemb process is mid-build
        open(lock, "w").close()
        os.utime(lock, (old, old))
        waiting = subprocess.Popen(
            [sys.executable, "-c", _LOAD], env=env, stderr=subprocess.PIPE, text=True
        )
        try:
            deadline = time.time() + 120
            while not _blocked_on_flock(waiting.pid) and time.time() < deadline:
                assert waiting.poll() is None, "the load ran past a held flock"
                time.sleep(0.1)
            assert _blocked_on_flock(waiting.pid) and os.path.exists(lock)
        except BaseException:
            waiting.kill()
            raise
        os.remove(lock)  # the live build ends: torch removes its lock, then the flock goes
        fcntl.flock(held.fileno(), fcntl.LOCK_UN)
    _, err = waiting.communicate(timeout=180)
    assert waiting.returncode == 0, err
    assert "left by a process killed" not in err


def test_rope_apply_still_rotates_into_out_and_in_place():
    x = torch.randn(1, 2, 7, 32)
    cos, sin = (t.float()[None].contiguous() for t in tables(torch.arange(7), 32, "cpu"))
    want = reference.rotate(x, cos[0], sin[0], Layout.HALF)
    out = torch.empty_like(x)
    assert cpu.rope_apply(x, cos, sin, out, False) is out
    assert_close(out, want, torch.float32)
    assert cpu.rope_apply(x, cos, sin, x, False) is x
    assert_close(x, want, torch.float32)
    assert posemb.__version__  # the package imported is the one under test


def test_rotating_only_q_scatters_no_gradient_back_through_the_empty_k():
    x = torch.randn(2, 4, 64, 32, requires_grad=True)
    cos, sin = tables(torch.arange(64)[None], 32, "cpu")
    grad = torch.randn_like(x)
    with torch.profiler.profile() as prof:
        kernels.rotate(x, x[:, :0], cos, sin, backend="cpu")[0].backward(grad)
    names = {e.name for e in prof.events()}
    assert "aten::slice_backward" not in names  # a zero gradient of x's size, then an add
    want = reference.rotate(grad, cos, sin, Layout.HALF, conjugate=True)
    assert_close(x.grad, want, torch.float32)


def test_a_gradient_shared_with_another_consumer_is_left_intact():
    # Autograd hands one gradient tensor to both inputs of an add: a backward that rotated
    # it in place would corrupt w.grad.
    x = torch.randn(2, 4, 64, 32, requires_grad=True)
    w = torch.zeros(2, 4, 64, 32, requires_grad=True)
    cos, sin = tables(torch.arange(64)[None], 32, "cpu")
    y, _ = kernels.rotate(x, x[:, :0], cos, sin, backend="cpu")
    (y + w).sum().backward()
    assert torch.equal(w.grad, torch.ones_like(w))


def _smaps_kb(t: torch.Tensor) -> tuple[int, int]:
    """(kB of ``t``'s memory in mappings advised for huge pages, kB of it backed by them):
    ``hg`` in /proc/self/smaps' VmFlags, and AnonHugePages, over the mappings that hold it (the
    advice splits a mapping, so its unaligned ends are mappings of their own)."""
    start = t.data_ptr()
    stop = start + t.numel() * t.element_size()
    advised, huge, overlap = 0, 0, 0
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                overlap = max(0, min(hi, stop) - max(lo, start))
            elif head == "AnonHugePages:" and overlap:
                huge += int(line.split()[1])
            elif head == "VmFlags:" and "hg" in line.split()[1:]:
                advised += overlap // 1024
    return advised, huge


def _advised_kb(t: torch.Tensor) -> int:
    """kB of ``t``'s memory in mappings advised for huge pages (:func:`_smaps_kb`)."""
    return _smaps_kb(t)[0]


def _kernel_gives_huge_pages() -> bool:
    """Whether an 8 MiB mapping advised as the op advises its outputs is backed by huge pages
    now: the kernel gives them only while it finds free 2 MiB blocks (after long runs on a
    fragmented machine it may not, and then no advice can help)."""
    import mmap

    size = 8 << 20
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # (shared: shmem)
    try:
        m.madvise(mmap.MADV_HUGEPAGE)
        m.write(b"\1" * size)
        view = torch.frombuffer(m, dtype=torch.uint8)
        huge = _smaps_kb(view)[1] > 0
        del view
        return huge
    finally:
        m.close()


def _backed_when_the_kernel_gives(make) -> bool | None:
    """Whether the tensor ``make()`` returns is backed by huge pages on a try where a plain
    advised mapping made just before it was: True on the first such try, False if three such
    tries gave it none (advice after the first write gives none, however free the memory),
    None if the kernel gave the probe none on every try (nothing to learn)."""
    probed = False
    for _ in range(3):
        if not _kernel_gives_huge_pages():
            continue
        probed = True
        if _smaps_kb(make())[1] >= 32 * 1024:
            return True
    return False if probed else None


def _thp_mode() -> str | None:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            text = f.read()
    except OSError:
        return None
    return text.split("[")[1].split("]")[0]


@pytest.mark.skipif(_thp_mode() not in ("madvise", "always"), reason="no transparent huge pages")
def test_large_outputs_are_advised_for_huge_pages():
    # 64 MB outputs: glibc maps anything over 32 MB freshly (a smaller one may reuse heap
    # pages that earlier tests touched, which no advice changes); without the advice, under
    # THP "madvise", such a mapping faults in 4 KB pages.
    q = torch.randn(1, 16, 1024, 1024)
    cos, sin = tables(torch.arange(1024)[None], 1024, "cpu")
    qg = q.clone().requires_grad_()  # the autograd op allocates its outputs in C++

    def autograd_path():
        return kernels.rotate(qg, qg[:, :0], cos, sin, backend="cpu")[0]

    def eager_path():  # allocates in Python and passes the outputs in
        with torch.no_grad():
            return kernels.rotate(q, q[:, :0], cos, sin, backend="cpu")[0]

    got_q = autograd_path()
    assert_close(got_q.detach(), reference.rotate(q, cos, sin, Layout.HALF), torch.float32)
    for path in (autograd_path, eager_path):
        # The advice is given (all but the 2 MiB-aligned ends of 64 MiB) ...
        assert _advised_kb(path()) >= 60 * 1024
        # ... and before the first write: where the kernel gives huge pages at all (a fresh
        # run failed by chance when this asked for them once), the output gets them.
        assert _backed_when_the_kernel_gives(path) is not False


@pytest.mark.skipif(_thp_mode() not in ("madvise", "always"), reason="no transparent huge pages")
def test_posemb_hugepages_0_turns_the_advice_off():
    code = (
        "import torch, test_kernels_cpu as t\n"
        "from posemb import kernels\n"
        "q = torch.randn(1, 16, 1024, 1024)\n"
        "cos, sin = t.tables(torch.arange(1024)[None], 1024, 'cpu')\n"
        "out, _ = kernels.rotate(q, q[:, :0], cos, sin, backend='cpu')\n"
        "print(t._advised_kb(out))\n"
    )
    env = {**os.environ, "POSEMB_HUGEPAGES": "0"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) == 0


def test_ninja_is_found_the_way_torch_finds_it(monkeypatch, tmp_path):
    # torch runs `ninja --version` from PATH, posemb checked `import ninja`: the jit extra's
    # ninja in an unactivated venv's bin failed the build ("Ninja is required"), and a system
    # ninja-build without the package was refused.
    pytest.importorskip("ninja")
    monkeypatch.setenv("PATH", str(tmp_path))  # no ninja, no compiler: only the package
    assert cpu._ninja_refusal() is None
    import ninja

    assert os.environ["PATH"].split(os.pathsep)[0] == ninja.BIN_DIR
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setitem(sys.modules, "ninja", None)  # no package either
    assert "no ninja to build one" in cpu._ninja_refusal()


def test_kernels_build_if_possible_says_why_once_and_goes_on(monkeypatch, capsys):
    from posemb import cli

    announced = []
    monkeypatch.setattr(
        cpu, "load", lambda verbose=False, announce=True: announced.append(announce)
    )
    monkeypatch.setattr(cpu, "unavailable_reason", lambda: "no C++ compiler (injected)")
    assert cli.main(["kernels", "--build"]) == 1
    capsys.readouterr()
    assert cli.main(["kernels", "--build", "--if-possible"]) == 0
    err = capsys.readouterr().err
    assert err.count("no C++ compiler (injected)") == 1 and "reference rotation" in err
    assert announced == [False, False]  # the command says it; the op's own warning would repeat it
