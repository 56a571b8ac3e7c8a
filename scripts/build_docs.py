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


def _looks_like_an_earlier_site(root: pathlib.Path) -> bool:
    # Before the manifest existed, `make docs` left an mkdocs site with the lesson inside.
    try:
        head = (root / "index.html").read_text(encoding="utf-8")[:4000]
    except (OSError, UnicodeDecodeError):
        return False
    return 'name="generator" content="mkdocs-' in head and (root / "lesson").is_dir()


def _build(into: pathlib.Path) -> set[str]:
    """The site and the lesson in it, built into ``into``; the files, relative."""
    from posemb.lesson import page

    env = os.environ | {"NO_MKDOCS_2_WARNING": "1"}
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(into)]
    subprocess.run(cmd, check=True, env=env)
    page.build_lesson(into / "lesson")
    files = {p.relative_to(into).as_posix() for p in into.rglob("*") if p.is_file()}
    return {rel for rel in files if not rel.startswith("lesson/.posemb-")}  # the site lists them


def main(argv: list[str]) -> int:
    from posemb._errors import InputError
    from posemb._owned import OwnedFolder

    target = pathlib.Path(argv[0] if argv else "site")
    with tempfile.TemporaryDirectory(prefix="posemb-site-") as tmp:
        built = pathlib.Path(tmp) / "site"
        try:
            try:
                folder = OwnedFolder.claim(target, COMMAND)
                files = _build(built)
            except InputError:
                if not _looks_like_an_earlier_site(target):
                    raise
                # An earlier make docs' site: only what this build writes is taken as its own
                # (anything else there stays a file it did not write, and is refused).
                files = _build(built)
                folder = OwnedFolder.claim(target, COMMAND, adopt=lambda _r, _p: files)
        except InputError as err:
            print(f"make docs: error: {err}", file=sys.stderr)
            return 2
        folder.settle()
        for rel in sorted(files):
            folder.write_bytes(rel, (built / rel).read_bytes())
    folder.prune(keep=files.__contains__)
    print(f"open file://{folder.path / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
