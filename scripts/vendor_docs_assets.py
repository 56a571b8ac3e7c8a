#!/usr/bin/env python3
"""Vendor the front-end files the documentation site and its browser tests need from npm, once.

Material for MkDocs' ``offline`` plugin makes search work from ``file://`` with a small Web
Worker shim (iframe-worker, MIT), which it would load from unpkg.com on every page view. The
site must open with the network off, so the shim ships in ``docs/assets/vendor/iframe-worker/``
and ``mkdocs.yml`` names it in ``extra.polyfills`` (the plugin then adds no URL of its own).

The browser tests audit the lesson and the site with axe-core (MPL-2.0), Deque's accessibility
engine, which ships in ``tests/vendor/axe-core/``: the tests run offline and never fetch it.

This script fetches each release with ``npm pack``, checks it against the integrity the registry
reports, and copies the named files and the licence; each ``VERSION.json`` records version,
integrity and the files' sha256, which the tests check before using them.

Run from the repository root (needs ``npm`` and the network; the site and the tests never do)::

    python scripts/vendor_docs_assets.py
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (name, version, folder, tarball member -> vendored name)
PACKAGES = (
    (
        "iframe-worker",
        "1.0.4",
        ROOT / "docs" / "assets" / "vendor" / "iframe-worker",
        {"package/shim/index.js": "shim.js", "package/LICENSE": "LICENSE"},
    ),
    (
        "axe-core",
        "4.14.1",
        ROOT / "tests" / "vendor" / "axe-core",
        {"package/axe.min.js": "axe.min.js", "package/LICENSE": "LICENSE"},
    ),
)


def vendor(name: str, version: str, out: Path, files: dict[str, str]) -> None:
    """Fetch ``name@version``, check its sha512 against the registry's, copy ``files`` into
    ``out`` and write ``out/VERSION.json``."""
    with tempfile.TemporaryDirectory() as work:
        info = json.loads(
            subprocess.run(
                ["npm", "view", f"{name}@{version}", "dist", "--json"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        )
        subprocess.run(
            ["npm", "pack", f"{name}@{version}"], cwd=work, check=True, capture_output=True
        )
        tgz = Path(work) / f"{name}-{version}.tgz"
        algo, _, want = info["integrity"].partition("-")
        got = base64.b64encode(hashlib.sha512(tgz.read_bytes()).digest()).decode()
        if algo != "sha512" or got != want:
            raise SystemExit(f"{name}@{version}: the tarball does not match the registry")
        out.mkdir(parents=True, exist_ok=True)
        with tarfile.open(tgz) as tar:
            for member, target in files.items():
                data = tar.extractfile(member)
                assert data is not None
                (out / target).write_bytes(data.read())
    record = {
        "name": name,
        "version": version,
        "integrity": info["integrity"],
        "sha256": {n: hashlib.sha256((out / n).read_bytes()).hexdigest() for n in files.values()},
    }
    (out / "VERSION.json").write_text(json.dumps(record, indent=2) + "\n")


def main() -> None:
    for name, version, out, files in PACKAGES:
        vendor(name, version, out, files)


if __name__ == "__main__":
    main()
