#!/usr/bin/env python3
"""Vendor the lesson page's front-end libraries from their npm releases, once, into the package.

The page posemb builds must open from ``file://`` with the network off, so the maths renderer
(KaTeX) and the chart runtime (Vega, Vega-Lite, vega-embed) ship inside posemb, in
``src/posemb/lesson/vendor/``. This script fetches each release with ``npm pack`` (the registry's
own client), checks the tarball against the integrity the registry reports, copies out only the
minified browser bundles, KaTeX's woff2 fonts and each package's licence, and writes
``vendor/VERSIONS.json``: name, version, tarball integrity and the sha256 of every vendored file,
which :mod:`posemb.lesson.assets` checks before it inlines anything.

vega-embed's browser bundle has its own dependencies compiled in (vega-tooltip draws the hover
tooltips); their licences are vendored beside it, at the lowest version its ``package.json``
allows (the licence text does not change within those ranges).

Run from the repository root (needs ``npm`` and the network; posemb itself never does)::

    python scripts/vendor_lesson_assets.py

To move to a new release, change :data:`PACKAGES`, rerun, look at the diff and commit it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

VENDOR = Path(__file__).resolve().parents[1] / "src" / "posemb" / "lesson" / "vendor"
LICENCE_NAMES = ("LICENSE", "LICENSE.md", "LICENSE.txt", "LICENCE", "COPYING")


@dataclass(frozen=True)
class Package:
    """An npm release and what to take from it: tarball path (under ``package/``) -> vendored path
    (under ``vendor/<name>/``). A regular expression key copies every match to the same folder."""

    name: str
    version: str
    files: dict[str, str] = field(default_factory=dict)
    role: str = ""


PACKAGES = (
    Package(
        "katex",
        "0.19.1",
        {
            "dist/katex.min.js": "katex.min.js",
            "dist/katex.min.css": "katex.min.css",
            # Renders $...$ spans after load, so templates can keep the TeX source as text.
            "dist/contrib/auto-render.min.js": "contrib/auto-render.min.js",
            # Every browser posemb supports reads woff2; the woff and ttf copies are not taken.
            r"re:dist/fonts/[A-Za-z0-9_-]+\.woff2": "fonts/",
        },
        role="maths",
    ),
    Package("vega", "6.4.0", {"build/vega.min.js": "vega.min.js"}, role="charts"),
    Package("vega-lite", "6.5.0", {"build/vega-lite.min.js": "vega-lite.min.js"}, role="charts"),
    Package("vega-embed", "7.3.0", {"build/vega-embed.min.js": "vega-embed.min.js"}, role="charts"),
)


def npm(*args: str, cwd: Path) -> str:
    """Run ``npm`` and return its stdout; fail loudly with its stderr."""
    done = subprocess.run(["npm", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"npm {' '.join(args)} failed:\n{done.stderr}")
    return done.stdout


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch(name: str, version: str, work: Path) -> tuple[tarfile.TarFile, dict]:
    """Download ``name@version`` with ``npm pack``; check its sha512 against the registry's."""
    dist = json.loads(npm("view", f"{name}@{version}", "dist", "license", "--json", cwd=work))
    integrity = dist["dist"]["integrity"]
    packed = json.loads(npm("pack", f"{name}@{version}", "--json", cwd=work))[0]
    tgz = work / packed["filename"]
    algo, _, want = integrity.partition("-")
    got = base64.b64encode(hashlib.new(algo, tgz.read_bytes()).digest()).decode()
    if algo != "sha512" or got != want:
        sys.exit(f"{name}@{version}: tarball {algo} {got} does not match the registry's {want}")
    meta = {
        "name": name,
        "version": version,
        "license": dist.get("license"),
        "tarball": dist["dist"]["tarball"],
        "integrity": integrity,
    }
    return tarfile.open(tgz), meta


def extract(tar: tarfile.TarFile, member: str, dest: Path) -> None:
    """Copy one regular file out of the tarball (never a link, never outside ``dest``)."""
    info = tar.getmember(f"package/{member}")
    if not info.isfile():
        sys.exit(f"{member} is not a regular file in the tarball")
    source = tar.extractfile(info)
    assert source is not None
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(source.read())


def licence_member(tar: tarfile.TarFile) -> str:
    names = {m.name.removeprefix("package/") for m in tar.getmembers() if m.isfile()}
    for candidate in LICENCE_NAMES:
        if candidate in names:
            return candidate
    sys.exit(f"no licence file among {sorted(n for n in names if '/' not in n)}")


def vendor_package(pkg: Package, work: Path, out: Path) -> dict:
    """Vendor one package into ``out/<name>/`` and return its VERSIONS.json entry."""
    tar, meta = fetch(pkg.name, pkg.version, work)
    root = out / pkg.name
    members = [m.name.removeprefix("package/") for m in tar.getmembers() if m.isfile()]
    copied: list[Path] = []
    for source, target in pkg.files.items():
        if source.startswith("re:"):
            matches = sorted(m for m in members if re.fullmatch(source[3:], m))
            if not matches:
                sys.exit(f"{pkg.name}: nothing matches {source}")
            for m in matches:
                extract(tar, m, root / target / Path(m).name)
                copied.append(root / target / Path(m).name)
        else:
            extract(tar, source, root / target)
            copied.append(root / target)
    lic = licence_member(tar)
    extract(tar, lic, root / "LICENSE")
    copied.append(root / "LICENSE")
    manifest_file = tar.extractfile("package/package.json")
    assert manifest_file is not None
    manifest = json.loads(manifest_file.read())
    tar.close()
    entry = {
        **meta,
        "role": pkg.role,
        "licence_file": f"{pkg.name}/LICENSE",
        "files": {str(p.relative_to(out)): sha256(p) for p in sorted(copied)},
    }
    if pkg.name == "vega-embed":
        entry["bundles"] = vendor_bundled(manifest.get("dependencies", {}), work, root / "bundled")
    return entry


def vendor_bundled(deps: dict[str, str], work: Path, out: Path) -> list[dict]:
    """Licences of the dependencies compiled into a browser bundle, at their lowest allowed
    version (``^1.2.3`` -> ``1.2.3``)."""
    entries = []
    for name, spec in sorted(deps.items()):
        version = spec.lstrip("^~=")
        if not re.fullmatch(r"\d+\.\d+\.\d+", version):
            sys.exit(f"vega-embed dependency {name}: cannot pin the range {spec!r}")
        tar, meta = fetch(name, version, work)
        target = out / name / "LICENSE"
        extract(tar, licence_member(tar), target)
        tar.close()
        rel = str(target.relative_to(out.parents[1]))
        entries.append({**meta, "range": spec, "licence_file": rel, "files": {rel: sha256(target)}})
    return entries


def main() -> None:
    if shutil.which("npm") is None:
        sys.exit("npm is needed to vendor the lesson's front-end libraries")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "packs"
        work.mkdir()
        # Build the new tree beside the old one and swap at the end: a failed run leaves the
        # committed vendor folder as it was.
        staged = Path(tmp) / "vendor"
        staged.mkdir()
        packages = [vendor_package(p, work, staged) for p in PACKAGES]
        versions = {
            "generated_by": "scripts/vendor_lesson_assets.py",
            "registry": "https://registry.npmjs.org/",
            "packages": packages,
        }
        (staged / "VERSIONS.json").write_text(json.dumps(versions, indent=2) + "\n")
        old = VENDOR.with_name("vendor.old")
        if VENDOR.exists():
            os.replace(VENDOR, old)
        shutil.copytree(staged, VENDOR)
        shutil.rmtree(old, ignore_errors=True)
    total = sum(p.stat().st_size for p in VENDOR.rglob("*") if p.is_file())
    print(f"vendored {len(PACKAGES)} packages into {VENDOR} ({total / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
