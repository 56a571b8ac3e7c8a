#!/usr/bin/env python3
"""Vendor the one front-end file the documentation site needs from npm, once, into docs/.

Material for MkDocs' ``offline`` plugin makes search work from ``file://`` with a small Web
Worker shim (iframe-worker, MIT), which it would load from unpkg.com on every page view. The
site must open with the network off, so the shim ships in ``docs/assets/vendor/iframe-worker/``
and ``mkdocs.yml`` names it in ``extra.polyfills`` (the plugin then adds no URL of its own).
This script fetches the release with ``npm pack``, checks it against the integrity the registry
reports, and copies the shim and its licence; ``VERSION.json`` records version, integrity and
the file's sha256, which ``tests/test_docs.py`` checks.

Run from the repository root (needs ``npm`` and the network; the site itself never does)::

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

NAME, VERSION = "iframe-worker", "1.0.4"
OUT = Path(__file__).resolve().parents[1] / "docs" / "assets" / "vendor" / NAME
FILES = {"package/shim/index.js": "shim.js", "package/LICENSE": "LICENSE"}


def main() -> None:
    with tempfile.TemporaryDirectory() as work:
        info = json.loads(
            subprocess.run(
                ["npm", "view", f"{NAME}@{VERSION}", "dist", "--json"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        )
        subprocess.run(
            ["npm", "pack", f"{NAME}@{VERSION}"], cwd=work, check=True, capture_output=True
        )
        tgz = Path(work) / f"{NAME}-{VERSION}.tgz"
        algo, _, want = info["integrity"].partition("-")
        got = base64.b64encode(hashlib.sha512(tgz.read_bytes()).digest()).decode()
        if algo != "sha512" or got != want:
            raise SystemExit(f"{NAME}@{VERSION}: the tarball does not match the registry")
        OUT.mkdir(parents=True, exist_ok=True)
        with tarfile.open(tgz) as tar:
            for member, name in FILES.items():
                data = tar.extractfile(member)
                assert data is not None
                (OUT / name).write_bytes(data.read())
    record = {
        "name": NAME,
        "version": VERSION,
        "integrity": info["integrity"],
        "sha256": {n: hashlib.sha256((OUT / n).read_bytes()).hexdigest() for n in FILES.values()},
    }
    (OUT / "VERSION.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
