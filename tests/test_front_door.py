"""The front door as a newcomer meets it: the README's install lines, each run verbatim in a
fresh virtual environment, and ``make demo`` from a fresh copy of the checkout on a PATH that
has no ninja, then on one with no C++ compiler either.

Each PATH is a folder of links to ordinary tools (make, the shell, coreutils, Python) and,
for the first, the compiler; never ninja. The first must build the op with the venv's own
ninja (the jit extra's, which the Makefile puts first on PATH); the second must say once that
there is no op and run the demo on the reference rotation. The README's wheel line runs in
``tests/test_wheel.py``, where the wheel is built. About four minutes in all (three fresh
environments, torch copied into each, and the demo twice); ``test-artifacts/front_door.json``
records each step's time. The claims are the suite's own, run once per run
(``claims_file``): make demo finds them up to date.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
TOOLS = ("make", "sh", "bash", "env", "touch", "rm", "mkdir", "cp", "mv", "ln", "cat", "ls",
         "which", "uname", "sed", "grep", "tr", "head", "tail", "date", "dirname",
         "find")  # fmt: skip
COMPILER = ("c++", "g++", "gcc", "cc", "cpp", "as", "ld")

pytestmark = pytest.mark.front_door
_times: dict[str, float] = {}
# pip's settings for every fresh environment the suite makes. PIP_COMPILE=0 skips writing
# bytecode at install (half of a torch install here: 13 s against 26 s); Python writes it on
# first import, for the modules a run imports: these environments do not pass on
# PYTHONDONTWRITEBYTECODE. (PIP_NO_COMPILE=1 does not do this: pip reads a negative option's
# variable as the option's own value, so it turns compiling on.)
PIP_ENV = {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_COMPILE": "0"}


# The user's pip settings that say where packages come from and how to reach them; nothing
# that changes how pip builds or installs (PIP_NO_BUILD_ISOLATION, PIP_CONFIG_FILE, ...).
PIP_SOURCES = ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CERT",
               "PIP_DEFAULT_TIMEOUT", "PIP_TRUSTED_HOST", "PIP_PROXY")  # fmt: skip


def pip_settings() -> dict[str, str]:
    """Where the user's pip takes packages from (:data:`PIP_SOURCES`), with :data:`PIP_ENV`.
    So the fresh environments get the torch the suite's own venv has: on the project's
    machines PIP_FIND_LINKS holds the CPU build (2.13.0+cpu, which outranks the index's
    2.13.0) that constraints.txt pins; without it pip takes the index's CUDA build, 3 GB
    more. The op is the same against either: it uses only the stable ABI's CPU calls."""
    return {**{k: v for k, v in os.environ.items() if k in PIP_SOURCES}, **PIP_ENV}


def build_script():
    """scripts/build_wheel.py (what ``make wheel`` runs), loaded by path."""
    path = ROOT / "scripts" / "build_wheel.py"
    spec = importlib.util.spec_from_file_location("build_wheel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def readme_install_lines() -> list[str]:
    """The shell lines of the README's install section that install something, comments
    dropped, in their order."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Install", 1)[1].split("\n## ", 1)[0]
    lines = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        for line in block.splitlines():
            line = line.split("  #", 1)[0].strip()
            if line.startswith("pip install") or "&& pip install" in line:
                lines.append(line)
    return lines


def _timed(name: str, cmd: list[str], **kw) -> subprocess.CompletedProcess:
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)
    _times[name] = round(time.perf_counter() - started, 1)
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "front_door.json").write_text(json.dumps(_times, indent=2) + "\n")
    assert done.returncode == 0, f"{name}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


def _path(folder: pathlib.Path, compiler: bool) -> str:
    """A bin folder of links to the ordinary tools (and the compiler, if asked), as PATH."""
    folder.mkdir()
    python = pathlib.Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}"
    (folder / "python3").symlink_to(python.resolve())
    for tool in TOOLS + (COMPILER if compiler else ()):
        found = shutil.which(tool)
        if found is not None:
            (folder / tool).symlink_to(os.path.realpath(found))
    for tool in ("ninja", *(() if compiler else COMPILER)):
        assert shutil.which(tool, path=str(folder)) is None, tool
    return str(folder)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> pathlib.Path:
    """A fresh copy of the checkout: the files a clone would hold, no .venv, no build."""
    script = build_script()
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse"], capture_output=True).returncode:
        pytest.skip("needs a git checkout to know which files a clone holds")
    return script.copy_project(tmp_path_factory.mktemp("clone") / "posemb")


def _env(base: pathlib.Path, path: str, name: str) -> dict[str, str]:
    """This user's environment (HOME keeps pip's configuration and cache) with the given PATH
    and an empty extension cache."""
    keep = ("HOME", "USER", "TMPDIR", "SSL_CERT_FILE", "CI")
    return {
        **{k: v for k, v in os.environ.items() if k in keep},
        "PATH": path,
        "LANG": "C.UTF-8",
        "TORCH_EXTENSIONS_DIR": str(base / f"torch_extensions-{name}"),  # nothing to reuse
        # make's set-up leaves the bytecode to Python, as pip does here (PIP_COMPILE=0).
        "BYTECODE": "0",
        **pip_settings(),
    }


def _op(venv: pathlib.Path, env: dict[str, str], cwd: pathlib.Path) -> dict | None:
    done = _timed("posemb kernels", [str(venv / "bin" / "posemb"), "kernels", "--json"],
                  env=env, cwd=cwd)  # fmt: skip
    return json.loads(done.stdout)["cpu_op"]


def _claims_hold(checkout: pathlib.Path) -> None:
    rows = json.loads((checkout / ".venv" / "claims.json").read_text())
    assert len(rows) >= 30 and all(r["passed"] for r in rows), [r for r in rows if not r["passed"]]
    assert (checkout / "posemb-lesson" / "index.html").stat().st_size > 1_000_000


def _claims_of_this_run(checkout: pathlib.Path, claims_file: pathlib.Path) -> None:
    """The suite's claims (run once per run, tests/conftest.py) as the checkout's own, newer
    than its sources: make demo takes them instead of running every claim a second and third
    time (a minute each). ``posemb verify`` itself runs in the second demo's environment."""
    (checkout / ".venv").mkdir(exist_ok=True)
    shutil.copyfile(claims_file, checkout / ".venv" / "claims.json")
    os.utime(checkout / ".venv" / "claims.json")


def test_make_demo_with_no_ninja_on_path_builds_the_op_with_the_venvs_own(
    checkout, tmp_path, claims_file
):
    _claims_of_this_run(checkout, claims_file)
    env = _env(tmp_path, _path(tmp_path / "bin", compiler=True), "no-ninja")
    done = _timed("make demo (no ninja)", ["make", "demo"], env=env, cwd=checkout)
    assert "posemb verify" not in done.stdout  # the claims were up to date
    _claims_hold(checkout)
    op = _op(checkout / ".venv", env, checkout)
    assert op is not None and op["source"] == "jit", op


def test_make_demo_with_no_compiler_says_so_once_and_runs_the_reference(checkout, tmp_path):
    """After the first test's demo: its install stamp and its built op removed, the same
    checkout again with neither a compiler nor ninja on PATH."""
    if not (checkout / ".venv" / "bin" / "python").exists():
        pytest.skip("runs after the no-ninja demo, in its checkout")
    (checkout / ".venv" / ".installed-demo").unlink(missing_ok=True)
    env = _env(tmp_path, _path(tmp_path / "bin", compiler=False), "no-compiler")
    done = _timed("make demo (no compiler)", ["make", "demo"], env=env, cwd=checkout)
    said = done.stdout + done.stderr
    # Said once, by the install step; the posemb processes after it stay quiet.
    assert said.count("no C++ compiler (c++/g++) on PATH") == 1, said[-3000:]
    assert "posemb kernels: no fused CPU op here" in said
    assert "Traceback" not in said
    # Nothing the page is made from changed since the first demo: it is not built again.
    assert "the lesson page is up to date: file://" in done.stdout, said[-3000:]
    assert "posemb lesson" not in done.stdout
    # A page the user edited since is not called up to date: posemb lesson refuses it.
    page = checkout / "posemb-lesson" / "index.html"
    kept = page.read_bytes()
    page.write_text("my annotated copy")
    edited = subprocess.run(["make", "demo"], env=env, cwd=checkout, capture_output=True,
                            text=True)  # fmt: skip
    assert edited.returncode != 0 and "up to date" not in edited.stdout, edited.stdout
    assert "changed since posemb lesson wrote them (index.html)" in edited.stderr, edited.stderr
    assert page.read_text() == "my annotated copy"
    page.write_bytes(kept)
    os.utime(checkout / "posemb-lesson" / ".posemb-owned.json")
    _claims_hold(checkout)
    assert _op(checkout / ".venv", env, checkout) is None
    # posemb verify in this environment, on the reference rotation: a claim that rotates,
    # saved where make demo keeps them (its own file, replaced), quiet about the compiler.
    verify = [str(checkout / ".venv" / "bin" / "posemb"), "verify", "--only",
              "rope.toy_trace", "--save", str(checkout / ".venv" / "claims.json")]  # fmt: skip
    done = _timed("posemb verify (no compiler)", verify, env=env, cwd=checkout)
    assert "no C++ compiler" not in done.stdout + done.stderr
    assert [r["id"] for r in json.loads((checkout / ".venv" / "claims.json").read_text())] == [
        "rope.toy_trace"
    ]


def test_each_readme_install_line_works_verbatim_in_a_fresh_venv(checkout, tmp_path):
    """The checkout's lines in their order, in one new venv (the first in a fresh one): the
    editable install, its extras, then the build against the torch already there."""
    lines = [ln for ln in readme_install_lines() if ".whl" not in ln]
    assert lines[0] == "pip install -c constraints.txt -e '.[jit]'", lines
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    path = _path(tmp_path / "bin", compiler=True)
    env = _env(tmp_path, f"{venv / 'bin'}{os.pathsep}{path}", "readme")
    for i, line in enumerate(lines):
        _timed(f"readme line {i + 1}", ["/bin/sh", "-c", line], env=env, cwd=checkout)
        done = _timed("posemb --version", [str(venv / "bin" / "posemb"), "--version"], env=env)
        assert done.stdout.strip().startswith("posemb "), done.stdout
    # The last line built the op into the installed package: it loads with no build.
    op = _op(venv, env, tmp_path)
    assert op is not None and op["source"] == "wheel", op
