"""``make docs``: the documentation site into a folder posemb owns, the lesson inside it.

mkdocs empties its ``--site-dir`` before it builds, whatever is in it; this script builds into
a temporary folder instead and copies the result into the target through posemb's ownership
rule (:class:`posemb._owned.OwnedFolder`): a target holding files that ``make docs`` did not
write is refused before anything is built, and only files it wrote are ever replaced or
removed.

Usage: python scripts/build_docs.py [SITE_DIR]   (default: site)
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tempfile

COMMAND = "make docs"


def _earlier_site(root: pathlib.Path, present: list[str]) -> bool:
    # Before the manifest existed `make docs` left an mkdocs site with the lesson inside.
    index = root / "index.html"
    try:
        head = index.read_text(encoding="utf-8")[:4000]
    except (OSError, UnicodeDecodeError):
        return False
    return 'name="generator" content="mkdocs-' in head and "lesson/index.html" in present


def main(argv: list[str]) -> int:
    from posemb._errors import InputError
    from posemb._owned import OwnedFolder
    from posemb.lesson import page

    target = argv[0] if argv else "site"
    try:
        folder = OwnedFolder.claim(target, COMMAND, adopt=_earlier_site)
    except InputError as err:
        print(f"make docs: error: {err}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="posemb-site-") as tmp:
        built = pathlib.Path(tmp) / "site"
        env = os.environ | {"NO_MKDOCS_2_WARNING": "1"}
        cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(built)]
        subprocess.run(cmd, check=True, env=env)
        page.build_lesson(built / "lesson")
        written = set()
        for path in sorted(p for p in built.rglob("*") if p.is_file()):
            rel = path.relative_to(built).as_posix()
            if rel.startswith("lesson/.posemb-"):
                continue  # the lesson's own manifest: the site's lists its files
            folder.write_bytes(rel, path.read_bytes())
            written.add(rel)
    folder.prune(keep=written.__contains__)
    print(f"open file://{folder.path / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
