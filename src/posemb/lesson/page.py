"""``posemb lesson``: the lesson as one offline page, every figure and claim from this build.

:func:`build_lesson` writes a folder (``index.html``, ``parchment.png``, ``parchment.svg``,
``claims.json``, ``manifest.json``) into a temporary sibling and renames it into place, so a
failed build leaves the previous folder (or nothing) behind. ``index.html`` inlines everything it
needs (KaTeX with its fonts, vega/vega-lite/vega-embed, the figures' data) and opens from
``file://`` with no network. The claims are this build's ``posemb verify`` rows, or a saved
``posemb verify --save`` file from the same posemb version with the same claim ids.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from .. import _extras
from .._errors import InputError
from .._io import read_json
from .._version import __version__
from . import claims as _claims
from . import registry
from .screens import SCREEN_TEXT

ROW_KEYS: dict[str, tuple[type, ...]] = {
    "id": (str,),
    "claim": (str,),
    "passed": (bool,),
    "measured": (str,),
    "screen": (int,),
    "verdict": (str,),
    "posemb": (str,),
}


@dataclass(frozen=True)
class LessonBuild:
    """What :func:`build_lesson` wrote: the folder, the page, and the claims that failed."""

    folder: pathlib.Path
    index: pathlib.Path
    failed: tuple[str, ...]
    seconds: float
    bytes: int


def load_claims(path: str | os.PathLike[str]) -> list[dict[str, object]]:
    """Read a ``posemb verify --save`` file and check it belongs to this build.

    Raises:
        ValueError: unreadable or truncated JSON, rows of the wrong shape, another posemb
            version, or claim ids that are not exactly this build's.
    """
    p = pathlib.Path(path)
    rows = read_json(p, "--claims file")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise InputError(f"--claims file {str(p)!r} must hold a list of claim rows")
    for i, row in enumerate(rows):
        for key, types in ROW_KEYS.items():
            if not isinstance(row.get(key), types):
                raise InputError(
                    f"--claims file {str(p)!r}: row {i} has no valid {key!r} (a posemb verify "
                    f"--save file from posemb {__version__} has one)"
                )
        if row["posemb"] != __version__:
            raise InputError(
                f"--claims file {str(p)!r} was written by posemb {row['posemb']}, this is "
                f"{__version__}: run posemb verify --save again"
            )
    got = [str(r["id"]) for r in rows]
    want = [c.id for c in _claims.CLAIMS]
    if sorted(got) != sorted(want) or len(set(got)) != len(got):
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))
        raise InputError(
            f"--claims file {str(p)!r} does not match this build's claims (missing: "
            f"{', '.join(missing) or 'none'}; unknown: {', '.join(extra) or 'none'})"
        )
    order = {cid: i for i, cid in enumerate(want)}
    return sorted(rows, key=lambda r: order[str(r["id"])])


def _check_out(out: pathlib.Path) -> None:
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {str(out)!r} is a file; give a folder for the lesson")
    if out.is_dir() and any(out.iterdir()) and not (out / "manifest.json").exists():
        raise InputError(
            f"--out {str(out)!r} is a folder with other files in it; give an empty or new folder "
            f"(or one a previous posemb lesson wrote)"
        )


def build_lesson(
    out: str | os.PathLike[str] = "posemb-lesson",
    rows: Sequence[dict[str, object]] | None = None,
) -> LessonBuild:
    """Build the page into ``out``.

    Args:
        out: the folder to write (created, or replaced if a previous lesson is there).
        rows: claim rows (:func:`posemb.lesson.claims.run_all` or :func:`load_claims`); None
            runs every claim now.

    Returns:
        The :class:`LessonBuild`.
    """
    # At the door: nothing is computed or written without the lesson extra.
    _extras.require_all(("jinja2", "altair", "vl_convert", "matplotlib"), "posemb lesson", "lesson")
    from . import figures as _figures
    from . import parchment as _parchment
    from . import render

    start = time.perf_counter()
    target = pathlib.Path(out)
    _check_out(target)
    rows = list(rows) if rows is not None else _claims.run_all()
    figs = _figures.build_figures(claim_rows=rows)
    exercises = registry.exercises()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    # mkdtemp makes the folder private; the lesson is meant to be opened and shared.
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)
    try:
        png, svg = (pathlib.Path(p) for p in _parchment.draw_parchment(tmp))
        html = render.render_page(SCREEN_TEXT, rows, figs, png.name, svg.name, exercises)
        (tmp / "index.html").write_text(html, encoding="utf-8")
        (tmp / "claims.json").write_text(json.dumps(list(rows), indent=2), encoding="utf-8")
        manifest = render.manifest(SCREEN_TEXT, rows, figs, [png.name, svg.name], exercises)
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
        if target.exists():
            old = target.with_name(f".{target.name}-old-{os.getpid()}")
            target.rename(old)
            tmp.rename(target)
            shutil.rmtree(old)
        else:
            tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    index = target / "index.html"
    failed = tuple(str(r["id"]) for r in rows if not r["passed"])
    return LessonBuild(
        folder=target,
        index=index,
        failed=failed,
        seconds=time.perf_counter() - start,
        bytes=index.stat().st_size,
    )


def build_summary(b: LessonBuild) -> dict[str, object]:
    """The build as a JSON-ready dict (what ``posemb lesson`` reports)."""
    d = asdict(b)
    d["folder"], d["index"] = str(b.folder), str(b.index)
    return d


__all__ = ["LessonBuild", "build_lesson", "build_summary", "load_claims"]
