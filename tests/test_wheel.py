"""posemb as a user installs it: the wheel built from this checkout, its contents, and the wheel
installed into a fresh virtual environment with no C++ compiler and no ninja, where the CPU op
must load from the wheel and pass the kernel tests against the reference.

Building and installing take about a minute and a half (most of it pip copying torch into the
new environment); ``test-artifacts/wheel.json`` records the wheel's size and tag and the
first-call time measured there.
"""

from __future__ import annotations

import io
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
from test_front_door import build_script, pip_settings, readme_install_lines

ROOT = pathlib.Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
# The kernel tests and what they import; run inside the new environment.
KERNEL_TESTS = (
    "test_kernels.py", "test_kernels_cpu.py", "tolerances.py", "devices.py", "conftest.py"
)  # fmt: skip

pytestmark = pytest.mark.wheel


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert done.returncode == 0, (
        f"{' '.join(map(str, cmd))}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )
    return done


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, pathlib.Path | float]:
    """The repaired wheel and the sdist, as ``make wheel`` builds them, against this torch."""
    script = build_script()
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse"], capture_output=True).returncode:
        pytest.skip("make wheel builds from a git checkout (it copies the files a clone holds)")
    out = tmp_path_factory.mktemp("dist")
    started = time.perf_counter()
    made = script.build(out)
    return {**made, "wheel_build_s": time.perf_counter() - started}


def test_the_wheel_is_one_platform_wheel_for_every_cpython_with_the_op_inside(built):
    wheel = built["wheel"]
    assert isinstance(wheel, pathlib.Path)
    name, version, py, abi, plat = wheel.stem.split("-")
    assert (name, version) == ("posemb", posemb.__version__)
    assert (py, abi) == ("cp310", "abi3") and plat != "any"
    names = zipfile.ZipFile(wheel).namelist()
    compiled = [n for n in names if n.endswith((".so", ".pyd", ".dylib"))]
    assert compiled == ["posemb/_C.abi3.so"]  # nothing grafted: torch's libraries stay torch's
    assert "posemb/_C.json" in names and "posemb/py.typed" in names
    assert f"posemb-{version}.dist-info/licenses/LICENSE" in names
    assert not [n for n in names if n.startswith("tests/") or "__pycache__" in n]
    meta = zipfile.ZipFile(wheel).read(f"posemb-{version}.dist-info/METADATA").decode()
    assert "Requires-Dist: torch>=2.6" in meta and "Requires-Dist: numpy>=" in meta
    assert "Requires-Dist: ninja" not in meta.split("Provides-Extra")[0]  # only in [jit]
    assert "Classifier: Typing :: Typed" in meta
    # W002 (duplicate files): two vendored Vega packages ship the same licence text.
    _run([sys.executable, "-m", "check_wheel_contents", "--ignore", "W002", str(wheel)])


def test_the_wheel_has_the_lowest_manylinux_tag_its_symbols_allow(built):
    """auditwheel's own reading of the repaired wheel names the tag in its file name, and that
    tag is no higher than torch's own (manylinux_2_28): the op never narrows where torch runs.
    glibc's __libc_single_threaded (2.32) alone had lifted it to 2_34."""
    wheel = built["wheel"]
    assert isinstance(wheel, pathlib.Path)
    plat = wheel.stem.split("-")[-1]
    shown = build_script().manylinux_tag(wheel)
    assert plat == shown, (plat, shown)
    assert int(plat.split("_")[2]) <= 28, plat
    assert wheel.stem.endswith("-cp310-abi3-" + plat)
    # The library itself imports nothing from glibc 2.32 or later (the reason 2_34 was shown).
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection

    with zipfile.ZipFile(wheel) as zf, zf.open("posemb/_C.abi3.so") as f:
        elf = ELFFile(io.BytesIO(f.read()))
        needed = {
            aux.name
            for section in elf.iter_sections()
            if isinstance(section, GNUVerNeedSection)
            for _, auxes in section.iter_versions()
            for aux in auxes
        }
        dynsym = elf.get_section_by_name(".dynsym")
        undefined = {s.name for s in dynsym.iter_symbols() if s["st_shndx"] == "SHN_UNDEF"}
    glibc = [v for v in needed if v.startswith("GLIBC_")]
    assert glibc and max(tuple(map(int, v[6:].split("."))) for v in glibc) <= (2, 28), needed
    assert "__libc_single_threaded" not in undefined


def test_the_licence_metadata_names_every_licence_the_wheel_ships(built):
    """posemb's MIT and the vendored page runtime's licences (VERSIONS.json), each file in the
    wheel's licences folder."""
    wheel = built["wheel"]
    assert isinstance(wheel, pathlib.Path)
    names = zipfile.ZipFile(wheel).namelist()
    info = f"posemb-{posemb.__version__}.dist-info"
    meta = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    (expression,) = re.findall(r"^License-Expression: (.+)$", meta, re.M)
    vendor = ROOT / "src" / "posemb" / "lesson" / "vendor"
    listed = json.loads((vendor / "VERSIONS.json").read_text())

    def licences(entry: dict) -> set[str]:
        return {entry["license"]}.union(*(licences(b) for b in entry.get("bundles", [])))

    wanted = {"MIT"}.union(*(licences(pkg) for pkg in listed["packages"]))
    assert set(expression.split(" AND ")) == wanted, (expression, wanted)
    for path in vendor.rglob("LICENSE"):
        rel = path.relative_to(ROOT).as_posix()
        assert f"{info}/licenses/{rel}" in names, rel


def test_the_extras_floors_and_bounds(built):
    """Each extra installs what its feature needs, at versions that work: matplotlib 3.7.0
    crashes on import with numpy 2; triton past the tested minor is kept out."""
    wheel = built["wheel"]
    assert isinstance(wheel, pathlib.Path)
    meta = zipfile.ZipFile(wheel).read(f"posemb-{posemb.__version__}.dist-info/METADATA")
    from packaging.requirements import Requirement
    from packaging.version import Version

    requires = [Requirement(r) for r in re.findall(r"^Requires-Dist: (.+)$", meta.decode(), re.M)]

    def named(name: str) -> list[Requirement]:
        return [r for r in requires if r.name == name]

    matplotlib = named("matplotlib")
    assert matplotlib and all(not r.specifier.contains("3.8.4") for r in matplotlib), matplotlib
    assert all(r.specifier.contains("3.9.0") for r in matplotlib), matplotlib
    triton = named("triton")
    assert triton and all(r.specifier.contains("3.7.1") for r in triton), triton
    assert not any(r.specifier.contains("3.9.0") for r in triton), triton
    numpy = [r for r in named("numpy") if r.marker is None]  # the base install's, no extra
    assert numpy and numpy[0].specifier.contains(str(Version("2.4.6"))), requires


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
                   "src/posemb/kernels/csrc/ops.cpp", "tests/test_kernels.py",
                   "mkdocs.yml", "docs/index.md", "docs/lab/results.json",
                   "scripts/build_docs.py"):  # fmt: skip
        assert needed in names, needed
    junk = [
        n
        for n in names
        if n.endswith((".so", ".o", ".pyc", "_C.json"))
        or "__pycache__" in n
        or n.startswith(("build/", "test-artifacts/", ".venv/"))
    ]
    assert junk == []


def test_the_sdists_shipped_tests_find_what_they_read(built, tmp_path):
    """The tests that read the project's files (the README, docs/, scripts/, the lab's results)
    pass from the unpacked sdist, as a packager runs them (the site build is left out: it is
    the same build, two minutes; the wheel tests need a git checkout and skip)."""
    sdist = built["sdist"]
    assert isinstance(sdist, pathlib.Path)
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path, filter="data")
    (unpacked,) = tmp_path.iterdir()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/test_docs.py", "tests/test_lab_report.py", "tests/test_tree.py",
         "-k", "not site and not cli_page and not make_docs"],
        cwd=unpacked, capture_output=True, text=True,
    )  # fmt: skip
    tail = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 0 and "passed" in tail, done.stdout[-3000:]


def test_an_isolated_build_of_the_sdist_fails_loudly(built, fresh_env):
    """pip's default isolation hides torch from the build: it used to give a wheel without the
    op, saying so only under -v. Now the build stops, and pip shows why without -v."""
    done = subprocess.run(
        [str(fresh_env["python"]), "-m", "pip", "install", "--no-deps", "-q",
         "--disable-pip-version-check", str(built["sdist"])],
        capture_output=True, text=True, env=fresh_env["env"], cwd=fresh_env["base"],
    )  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode != 0, said[-3000:]
    assert "torch cannot be imported in this build environment" in said, said[-3000:]
    assert "--no-build-isolation" in said


def _pip_cache_dir() -> str:
    """This user's pip download cache (``pip cache dir``); "" where pip has none."""
    done = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True,
                          text=True)  # fmt: skip
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else ""


@pytest.fixture(scope="module")
def fresh_env(built, tmp_path_factory) -> dict[str, object]:
    """A new virtual environment where the README's wheel line installed the wheel (and then
    pytest and hypothesis), and an environment for it with nothing on PATH but its own bin/:
    no compiler, no ninja."""
    base = tmp_path_factory.mktemp("user")
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    py = venv / "bin" / "python"
    env = {
        "PATH": str(venv / "bin"),
        "HOME": str(base),
        "TORCH_EXTENSIONS_DIR": str(base / "torch_extensions"),  # empty: nothing to reuse
        "LANG": "C.UTF-8",
        **pip_settings(),
    }
    # pip's download cache only saves the network (torch is ~200 MB); what a new user lacks,
    # a built op and any configuration file, stays out through HOME. (pip's settings from the
    # environment stay: they chose the CPU torch the suite's own venv has, not a 3 GB CUDA
    # build that took 50 s of the install here.)
    if cache := _pip_cache_dir():
        env["PIP_CACHE_DIR"] = cache
    # The line after `make wheel &&` (the `built` fixture ran what make wheel runs), verbatim,
    # where a user would run it: a checkout holding constraints.txt and dist/.
    (line,) = [ln for ln in readme_install_lines() if ".whl" in ln]
    command = line.split("&&", 1)[1].strip()
    (base / "dist").mkdir()
    shutil.copy2(built["wheel"], base / "dist")
    shutil.copy2(ROOT / "constraints.txt", base)
    started = time.perf_counter()
    _run(["/bin/sh", "-c", command], env=env, cwd=base)
    install_s = time.perf_counter() - started
    _run([str(py), "-m", "pip", "install", "-q", "-c", "constraints.txt", "pytest", "hypothesis"],
         env=env, cwd=base)  # fmt: skip
    return {"python": py, "venv": venv, "env": env, "base": base, "install_s": install_s}


def test_the_base_install_prints_nothing(fresh_env):
    """No "Failed to initialize NumPy" from torch (numpy is declared), no notice of a build."""
    env, venv = fresh_env["env"], fresh_env["venv"]
    done = _run([str(venv / "bin" / "posemb"), "--version"], env=env)
    assert done.stderr == "" and done.stdout.strip().endswith(posemb.__version__), done
    x = "torch.ones(1, 1, 2, 8)"
    code = f"import posemb, torch; posemb.RotaryEmbedding(8)({x}, {x})"
    done = _run([str(fresh_env["python"]), "-c", code], env=env)
    assert done.stdout == "" and done.stderr == "", done.stderr


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
        # FIRE's tile op is in the same library, and the attention core takes it.
        "x = torch.randn(1, 2, 300, 8)\n"
        "att = posemb.PositionalAttention('fire', num_heads=2, head_dim=8, causal=True)\n"
        "with torch.profiler.profile() as prof:\n"
        "    att(x, x, x)\n"
        "print(any(e.name == 'posemb::_fire_tile_cpu' for e in prof.events()))\n"
    )
    done = _run([str(fresh_env["python"]), "-c", code], env=env)
    timed, fire = done.stdout.split("\n")[:2]
    assert fire == "True", done.stdout
    import_s, first_call_s = map(float, timed.split())
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
    """The CPU op's tests against the installed wheel: every variant this CPU runs against
    the reference, forward, backward and in place, every half value converted, opcheck (the
    dispatch tests of test_kernels.py are the suite's; they took 20 s more here)."""
    tests = pathlib.Path(fresh_env["base"]) / "tests"
    tests.mkdir()
    for name in KERNEL_TESTS:
        shutil.copy2(ROOT / "tests" / name, tests / name)
    done = _run(
        [str(fresh_env["python"]), "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-k", "not triton", "--rootdir", str(tests), str(tests / "test_kernels_cpu.py")],
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


@pytest.mark.parametrize(
    ("argv", "mode", "compiles"),
    [
        (["egg_info"], "auto", False),
        (["dist_info", "--output-dir", "/tmp/x", "--keep-egg-info"], "auto", False),
        (["sdist", "--formats", "gztar"], "auto", False),
        (["bdist_wheel", "--dist-dir", "/tmp/x"], "auto", True),
        # A metadata or sdist command beside one that builds still builds the op.
        (["sdist", "bdist_wheel"], "auto", True),
        (["-q", "egg_info", "build_ext"], "auto", True),
        (["egg_info"], "1", True),  # POSEMB_BUILD_OP=1 keeps every command's checks
    ],
)
def test_setup_py_skips_the_op_only_for_commands_that_compile_nothing(
    argv, mode, compiles, monkeypatch
):
    """setup.py imports torch (2 s) only where a command may compile: a wheel built beside an
    sdist (``setup.py sdist bdist_wheel``) must still carry the op."""
    import setuptools

    seen = []
    monkeypatch.setattr(setuptools, "setup", lambda **kw: seen.append(kw))
    monkeypatch.setattr(sys, "argv", ["setup.py", *argv])
    monkeypatch.setenv("POSEMB_BUILD_OP", mode)
    code = compile((ROOT / "setup.py").read_text(), str(ROOT / "setup.py"), "exec")
    exec(code, {"__name__": "__main__", "__file__": str(ROOT / "setup.py")})
    assert bool(seen[0].get("ext_modules")) == compiles, seen[0]
