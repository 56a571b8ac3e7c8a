"""posemb as a user installs it: the wheel built from this checkout, its contents, and the wheel
installed into a fresh virtual environment with no C++ compiler and no ninja, where the CPU op
must load from the wheel and pass the kernel tests against the reference.

Building and installing take about a minute and a half (most of it pip copying torch into the
new environment); ``test-artifacts/wheel.json`` records the wheel's size and tag and the
first-call time measured there.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile

import pytest

import posemb

ROOT = pathlib.Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
# The kernel tests and what they import; run inside the new environment.
KERNEL_TESTS = ("test_kernels.py", "test_kernels_cpu.py", "tolerances.py", "conftest.py")

pytestmark = pytest.mark.wheel


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert done.returncode == 0, (
        f"{' '.join(map(str, cmd))}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )
    return done


def _source_copy(dest: pathlib.Path) -> pathlib.Path:
    """The checkout's files (tracked, or new and not ignored) copied to ``dest``: the build
    then sees what a clone would, and writes its build/ and egg-info there."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if listed.returncode != 0:
        pytest.skip("needs a git checkout to know which files are the project's")
    for name in filter(None, listed.stdout.split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, pathlib.Path | float]:
    """The wheel and the sdist, built from a copy of the checkout against this torch."""
    base = tmp_path_factory.mktemp("build")
    src = _source_copy(base / "src")
    out = base / "dist"
    env = {**os.environ, "POSEMB_BUILD_OP": "1"}
    started = time.perf_counter()
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(src)],
        env=env,
    )  # fmt: skip
    wheel_s = time.perf_counter() - started
    _run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "-o", str(out), str(src)])
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return {"wheel": wheel, "sdist": sdist, "wheel_build_s": wheel_s}


def test_the_wheel_is_one_platform_wheel_for_every_cpython_with_the_op_inside(built):
    wheel = built["wheel"]
    assert isinstance(wheel, pathlib.Path)
    name, version, py, abi, plat = wheel.stem.split("-")
    assert (name, version) == ("posemb", posemb.__version__)
    assert (py, abi) == ("cp310", "abi3") and plat != "any"
    names = zipfile.ZipFile(wheel).namelist()
    compiled = [n for n in names if n.endswith((".so", ".pyd", ".dylib"))]
    assert compiled == ["posemb/_C.abi3.so"]
    assert "posemb/_C.json" in names and "posemb/py.typed" in names
    assert f"posemb-{version}.dist-info/licenses/LICENSE" in names
    assert not [n for n in names if n.startswith("tests/") or "__pycache__" in n]
    meta = zipfile.ZipFile(wheel).read(f"posemb-{version}.dist-info/METADATA").decode()
    assert "License-Expression: MIT" in meta and "Requires-Dist: torch>=2.6" in meta
    assert "Requires-Dist: ninja" not in meta.split("Provides-Extra")[0]  # only in [jit]
    assert "Classifier: Typing :: Typed" in meta
    # W002 (duplicate files): two vendored Vega packages ship the same licence text.
    _run([sys.executable, "-m", "check_wheel_contents", "--ignore", "W002", str(wheel)])


def test_the_wheels_library_uses_only_the_stable_abi(built, tmp_path):
    from test_kernels_cpu import assert_stable_abi_only

    wheel = built["wheel"]
    assert isinstance(wheel, pathlib.Path)
    library = zipfile.ZipFile(wheel).extract("posemb/_C.abi3.so", tmp_path)
    assert_stable_abi_only(library)


def test_the_sdist_has_the_sources_and_no_build_outputs(built):
    sdist = built["sdist"]
    assert isinstance(sdist, pathlib.Path)
    with tarfile.open(sdist) as tar:
        names = [n.split("/", 1)[1] for n in tar.getnames() if "/" in n]
    for needed in ("setup.py", "pyproject.toml", "LICENSE", "CHANGELOG.md", "CITATION.cff",
                   "src/posemb/kernels/csrc/rope.h", "src/posemb/kernels/csrc/rows.inc",
                   "src/posemb/kernels/csrc/ops.cpp", "tests/test_kernels.py"):  # fmt: skip
        assert needed in names, needed
    junk = [
        n
        for n in names
        if n.endswith((".so", ".o", ".pyc", "_C.json"))
        or "__pycache__" in n
        or n.startswith(("build/", "test-artifacts/", ".venv/"))
    ]
    assert junk == []


@pytest.fixture(scope="module")
def fresh_env(built, tmp_path_factory) -> dict[str, object]:
    """A new virtual environment with the wheel (and the pinned torch, pytest, hypothesis)
    installed, and an environment for it with nothing on PATH but its own bin/: no compiler,
    no ninja."""
    base = tmp_path_factory.mktemp("user")
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    py = venv / "bin" / "python"
    started = time.perf_counter()
    _run(
        [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
         "-c", str(ROOT / "constraints.txt"), str(built["wheel"]), "pytest", "hypothesis"],
    )  # fmt: skip
    install_s = time.perf_counter() - started
    env = {
        "PATH": str(venv / "bin"),
        "HOME": str(base),
        "TORCH_EXTENSIONS_DIR": str(base / "torch_extensions"),  # empty: nothing to reuse
        "LANG": "C.UTF-8",
    }
    return {"python": py, "venv": venv, "env": env, "base": base, "install_s": install_s}


def test_the_new_environment_has_no_compiler_and_no_ninja(fresh_env):
    path = str(fresh_env["env"]["PATH"])
    for tool in ("c++", "g++", "gcc", "cc", "clang++", "ninja"):
        assert shutil.which(tool, path=path) is None, tool
    code = "import importlib.util; print(importlib.util.find_spec('ninja'))"
    done = _run([str(fresh_env["python"]), "-c", code], env=fresh_env["env"])
    assert done.stdout.strip() == "None"


def test_the_installed_op_loads_from_the_wheel_without_a_build(fresh_env, built):
    env, venv = fresh_env["env"], fresh_env["venv"]
    done = _run([str(venv / "bin" / "posemb"), "kernels", "--json"], env=env)
    report = json.loads(done.stdout)
    assert report["cpu"] == "available"
    op = report["cpu_op"]
    assert op["source"] == "wheel" and op["skipped"] == []
    assert pathlib.Path(op["path"]).is_relative_to(venv), op["path"]
    assert op["variants"]["baseline"] is True and op["variants"][op["variant"]] is True
    # The first fused call in a new process, timed from before `import posemb`.
    code = (
        "import time, torch\n"
        "t0 = time.perf_counter()\n"
        "import posemb\n"
        "q = torch.randn(1, 8, 64, 128); k = torch.randn(1, 2, 64, 128)\n"
        "cos, sin = posemb.cos_sin(torch.arange(64), posemb.inv_freq(128, dtype=torch.float64))\n"
        "t1 = time.perf_counter()\n"
        "posemb.kernels.rotate(q, k, cos, sin, backend='cpu')\n"
        "t2 = time.perf_counter()\n"
        "print(t1 - t0, t2 - t1)\n"
    )
    done = _run([str(fresh_env["python"]), "-c", code], env=env)
    import_s, first_call_s = map(float, done.stdout.split())
    assert "building" not in done.stderr
    assert not os.path.exists(env["TORCH_EXTENSIONS_DIR"])  # nothing was compiled
    assert first_call_s < 5.0  # a load, not a build (the JIT build took 20-30 s before)
    wheel = built["wheel"]
    assert isinstance(wheel, pathlib.Path)
    ARTIFACTS.mkdir(exist_ok=True)
    record = {
        "wheel": wheel.name,
        "wheel_bytes": wheel.stat().st_size,
        "library_bytes": zipfile.ZipFile(wheel).getinfo("posemb/_C.abi3.so").file_size,
        "wheel_build_s": round(float(built["wheel_build_s"]), 1),
        "install_s": round(float(fresh_env["install_s"]), 1),
        "import_posemb_s": round(import_s, 3),
        "first_cpu_call_s": round(first_call_s, 3),
        "variant": op["variant"],
        "variants": op["variants"],
    }
    (ARTIFACTS / "wheel.json").write_text(json.dumps(record, indent=2) + "\n")


def test_the_kernel_tests_pass_in_the_new_environment(fresh_env):
    """The kernel tests and opcheck, against the installed wheel (the Triton ones need
    triton, which a user of the CPU op does not install)."""
    tests = pathlib.Path(fresh_env["base"]) / "tests"
    tests.mkdir()
    for name in KERNEL_TESTS:
        shutil.copy2(ROOT / "tests" / name, tests / name)
    done = _run(
        [str(fresh_env["python"]), "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-k", "not triton", "--rootdir", str(tests), str(tests)],
        env=fresh_env["env"],
        cwd=tests,
    )  # fmt: skip
    summary = done.stdout.strip().splitlines()[-1]
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    assert "failed" not in summary and "error" not in summary and passed >= 150, summary


def test_the_version_has_one_source():
    """pyproject reads the version from posemb/_version.py; the changelog's newest release
    and CITATION.cff name the same one."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject and "\nversion =" not in pyproject.split("[tool")[0]
    changelog = (ROOT / "CHANGELOG.md").read_text()
    newest = re.search(r"^## \[(\d+\.\d+\.\d+)\]", changelog, re.M)
    assert newest is not None and newest.group(1) == posemb.__version__
    assert f"\nversion: {posemb.__version__}\n" in (ROOT / "CITATION.cff").read_text()
