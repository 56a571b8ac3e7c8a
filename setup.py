"""Builds posemb's fused CPU op into the wheel; everything else is in pyproject.toml.

The op is compiled against the torch of the build environment, on its stable ABI (see
src/posemb/kernels/build.py). pip's default build isolation makes a fresh environment that
holds no torch, so a wheel is built with torch installed and no isolation (``make wheel``
does this, and repairs the wheel to a manylinux tag):

    pip install --no-build-isolation .

POSEMB_BUILD_OP=1 makes a build without torch an error, 0 skips the op (a pure-Python wheel).
With the default (auto) a wheel built where torch cannot be imported is an error too, since
pip would otherwise install a wheel with no op and say so only under ``pip -v``; an editable
install (``pip install -e .``) needs no prebuilt op and builds none: a source checkout compiles
the op on first use where a compiler and ninja exist (posemb[jit]), else runs the reference
rotation.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import sys

from setuptools import setup

ROOT = pathlib.Path(__file__).resolve().parent
MODES = ("auto", "0", "1")
# setup.py runs for each of pip's build hooks; these commands compile nothing, and importing
# torch for each of them was 2 s (pip runs the first two before every wheel it builds). Only a
# command line that names one of them and nothing that may compile skips the op.
NO_OP_COMMANDS = ("egg_info", "dist_info", "sdist")
BUILD_PREFIXES = ("bdist", "build", "install", "develop", "editable", "easy_install")


def _compiles_nothing(argv: list[str]) -> bool:
    """Whether ``setup.py argv`` runs only commands that compile nothing."""
    return any(a in NO_OP_COMMANDS for a in argv) and not any(
        a.startswith(BUILD_PREFIXES) for a in argv
    )


NO_TORCH = """
posemb: torch cannot be imported in this build environment, so the wheel would carry no
prebuilt CPU op. pip builds in an isolated environment by default, and that holds no torch.
Install torch first, then build without isolation:

    pip install torch setuptools
    pip install --no-build-isolation <this sdist or checkout>

or install from a checkout in place (pip install -e .: the op is compiled on first use), or
set POSEMB_BUILD_OP=0 for a wheel without the op (it runs the reference rotation).
"""


def _kernel_build():
    """posemb/kernels/build.py, loaded by path: importing posemb would import torch."""
    path = ROOT / "src" / "posemb" / "kernels" / "build.py"
    spec = importlib.util.spec_from_file_location("_posemb_kernel_build", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _op_options() -> dict:
    mode = os.environ.get("POSEMB_BUILD_OP", "auto")
    if mode not in MODES:
        raise SystemExit(f"POSEMB_BUILD_OP must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "0" or (mode == "auto" and _compiles_nothing(sys.argv[1:])):
        return {}
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        if mode == "1" or "bdist_wheel" in sys.argv:
            raise SystemExit(NO_TORCH) from None
        return {}  # metadata, an sdist or an editable install: no op is compiled for these
    kb = _kernel_build()
    import torch

    have = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    if have < kb.TARGET:
        why = f"torch {torch.__version__} is older than the op's stable ABI ({kb.TARGET})"
        if mode == "1":
            raise SystemExit(f"POSEMB_BUILD_OP=1, but {why}")
        print(f"posemb: {why}, so the wheel carries no prebuilt CPU op", file=sys.stderr)
        return {}
    relative = [str((kb.CSRC / name).relative_to(ROOT)) for name in kb.SOURCES]
    ext = CppExtension(
        f"posemb.{kb.LIBRARY}",
        relative,
        extra_compile_args=kb.cflags(),
        extra_link_args=kb.ldflags(),
        # The headers too: setuptools rebuilds only when a listed file is newer than the
        # library, and the record below must describe what was compiled.
        depends=[str((kb.CSRC / name).relative_to(ROOT)) for name in kb.HEADERS],
        py_limited_api=True,
    )

    class Build(BuildExtension):
        """Also writes posemb/_C.json: the sources the library was built from, which a
        source checkout compares with its own to tell a stale in-tree build."""

        def run(self) -> None:
            super().run()
            folder = pathlib.Path(self.get_ext_fullpath(ext.name)).parent
            record = folder / f"{kb.LIBRARY}.json"
            tmp = record.with_suffix(".json.tmp")
            tmp.write_text(json.dumps({"sources": kb.source_hash()}) + "\n")
            os.replace(tmp, record)

    return {
        "ext_modules": [ext],
        "cmdclass": {"build_ext": Build},
        # No Python.h in the op: one wheel for every CPython from 3.10 on.
        "options": {"bdist_wheel": {"py_limited_api": "cp310"}},
    }


setup(**_op_options())
