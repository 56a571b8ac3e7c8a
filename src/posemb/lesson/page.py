"""``posemb lesson``: the lesson as one offline page, every figure and claim from this build.

:func:`build_lesson` writes a folder (``index.html``, ``parchment.png``, ``parchment.svg``,
``claims.json``, ``manifest.json``); it builds every file before it writes one, writes each
atomically, and owns only the files it wrote (``.posemb-owned.json`` lists them): a folder
holding anything else is refused, and nothing it did not write is ever removed.
``index.html`` inlines everything it needs (KaTeX with its fonts, vega/vega-lite/vega-embed,
the figures' data) and opens from ``file://`` with no network. The claims are this build's
``posemb verify`` rows, or a saved ``posemb verify --save`` file from the same posemb version
with the same claim ids.
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from .. import _extras
from .._errors import InputError
from .._io import read_json
from .._owned import OwnedFolder
from .._version import __version__
from . import claims as _claims
from . import registry
from .screens import SCREEN_TEXT

ROW_KEYS: dict[str, tuple[type, ...]] = {
    "id": (str,),
    "claim": (str,),
    "passed": (bool,),
    "measured": (str,),
    "value": (object,),  # any JSON; a figure that draws it checks its shape
    "screen": (int,),
    "screen_title": (str,),
    "verdict": (str,),
    "lesson_says": (str, type(None)),
    "posemb": (str,),
}
"""Every key of a ``posemb verify --save`` row (:meth:`posemb.lesson.registry.Claim.run`) and
the types its JSON value may have."""

_JSON_TYPES = {
    str: "a string",
    bool: "true or false",
    int: "an integer",
    type(None): "null",
    object: "any JSON value",
}


@dataclass(frozen=True)
class LessonBuild:
    """What :func:`build_lesson` wrote: the folder, the page, and the claims that failed."""

    folder: pathlib.Path
    index: pathlib.Path
    failed: tuple[str, ...]
    seconds: float
    bytes: int


def _shown(value: object) -> str:
    # A hand-edited value may be a whole paragraph; the error stays one readable line.
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_row_shape(name: str, row: dict[str, object]) -> None:
    """Refuse a ``--claims`` row (``name`` says which, in which file) that does not have exactly
    the keys of :data:`ROW_KEYS` with their types, or whose verdict posemb does not know."""
    unknown = sorted(set(row) - set(ROW_KEYS))
    if unknown:
        raise InputError(
            f"{name} has unknown key(s) {', '.join(map(repr, unknown))}; a row has exactly "
            f"{', '.join(ROW_KEYS)}"
        )
    for key, types in ROW_KEYS.items():
        if key not in row:
            raise InputError(
                f"{name} has no {key!r} (a posemb verify --save file from posemb "
                f"{__version__} has one)"
            )
        # JSON true is a Python int too; a screen of true is not screen 1.
        value = row[key]
        if not isinstance(value, types) or (isinstance(value, bool) and int in types):
            allowed = " or ".join(_JSON_TYPES[t] for t in types)
            raise InputError(f"{name}: {key!r} must be {allowed}, got {_shown(value)}")
    if row["verdict"] not in _claims.VERDICTS:
        raise InputError(
            f"{name}: 'verdict' must be one of {', '.join(_claims.VERDICTS)}, got "
            f"{_shown(row['verdict'])}"
        )


def load_claims(path: str | os.PathLike[str]) -> list[dict[str, object]]:
    """Read a ``posemb verify --save`` file and check it belongs to this build.

    Every row must have exactly the keys of :data:`ROW_KEYS`, with their types; what a row
    repeats from its claim (screen, screen title, verdict, the quote of the source lesson, the
    claim's text) must be what this build registers, so a hand-edited file cannot put a row on
    a screen that does not exist or present a quote posemb never made.

    Raises:
        ValueError: unreadable or truncated JSON, rows of the wrong shape (a key missing,
            unknown or of the wrong type, a verdict posemb does not know), another posemb
            version, claim ids that are not exactly this build's (missing, unknown or
            repeated), or a row that differs from its registered claim.
    """
    p = pathlib.Path(path)
    where = f"--claims file {str(p)!r}"
    rows = read_json(p, "--claims file")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise InputError(f"{where} must hold a list of claim rows (as posemb verify --save writes)")
    names: list[str] = []
    for i, row in enumerate(rows):
        cid = row.get("id")
        name = f"{where}: row {i}" + (f" (claim {cid})" if isinstance(cid, str) else "")
        names.append(name)
        # Another version's rows may have other keys: say the version, not the key.
        if isinstance(row.get("posemb"), str) and row["posemb"] != __version__:
            raise InputError(
                f"{where} was written by posemb {row['posemb']}, this is {__version__}: run "
                f"posemb verify --save again"
            )
        _check_row_shape(name, row)
    got = [str(r["id"]) for r in rows]
    claims = {c.id: c for c in _claims.CLAIMS}
    seen: dict[str, list[int]] = {}
    for i, cid in enumerate(got):
        seen.setdefault(cid, []).append(i)
    repeated = [
        f"{cid} (rows {', '.join(map(str, at))})" for cid, at in seen.items() if len(at) > 1
    ]
    if repeated:
        raise InputError(
            f"{where} has more than one row for a claim; repeated: {'; '.join(repeated)} "
            f"(posemb verify --save writes one row per claim)"
        )
    if set(got) != set(claims):
        missing = sorted(set(claims) - set(got))
        extra = sorted(set(got) - set(claims))
        raise InputError(
            f"{where} does not match this build's claims (missing: "
            f"{', '.join(missing) or 'none'}; unknown: {', '.join(extra) or 'none'})"
        )
    # What a row repeats from its claim is shown as posemb's own words (the screen it sits on,
    # its quote of the source lesson and the verdict on it): a file may not change them.
    for name, row in zip(names, rows, strict=True):
        c = claims[str(row["id"])]
        want = {
            "screen": c.screen,
            "screen_title": _claims.SCREENS[c.screen],
            "verdict": c.verdict,
            "lesson_says": c.lesson_says,
            "claim": c.claim,
        }
        for key, expected in want.items():
            if row[key] != expected:
                raise InputError(
                    f"{name}: {key!r} is {_shown(row[key])}, but claim {c.id} of posemb "
                    f"{__version__} has {key} {_shown(expected)}: run posemb verify --save again"
                )
    order = {cid: i for i, cid in enumerate(claims)}
    return sorted(rows, key=lambda r: order[str(r["id"])])


COMMAND = "posemb lesson"
PAGE_FILES = ("parchment.png", "parchment.svg", "claims.json", "manifest.json", "index.html")


def _earlier_lesson(folder: pathlib.Path, present: list[str]) -> set[str]:
    """Of a folder without an ownership manifest, the files an earlier posemb lesson wrote:
    its ``manifest.json`` says it is one, and lists them (only the page's own names count)."""
    try:
        listed = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return set()
    if not isinstance(listed, dict) or not isinstance(listed.get("posemb"), str):
        return set()
    files = listed.get("files")
    if not isinstance(files, list):
        return set()
    return set(present) & set(files) & set(PAGE_FILES)


def build_lesson(
    out: str | os.PathLike[str] = "posemb-lesson",
    rows: Sequence[dict[str, object]] | None = None,
    *,
    force: bool = False,
) -> LessonBuild:
    """Build the page into ``out``.

    The folder is checked before anything is computed (:class:`posemb._owned.OwnedFolder`): a
    new or empty folder, or one this command wrote, whose files are replaced and whose
    earlier files that this build does not write are removed. A folder holding anything else
    (a user's file, or one of the page's files edited since) is refused, unless ``force``:
    then the page is written beside them and they are kept. Every file is built first and
    written atomically after, so a failed build leaves the folder as it was.

    Args:
        out: the folder to write.
        rows: claim rows (:func:`posemb.lesson.claims.run_all` or :func:`load_claims`); None
            runs every claim now.
        force: write into a folder holding files this command did not write (never removing
            them).

    Returns:
        The :class:`LessonBuild`.
    """
    # At the door: nothing is computed or written without the lesson extra.
    _extras.require_all(("jinja2", "altair", "vl_convert", "matplotlib"), "posemb lesson", "lesson")
    from . import figures as _figures
    from . import parchment as _parchment
    from . import render

    start = time.perf_counter()
    folder = OwnedFolder.claim(
        out, COMMAND, force=force, adopt=_earlier_lesson, writes=PAGE_FILES.__contains__
    )
    rows = list(rows) if rows is not None else _claims.run_all()
    figs = _figures.build_figures(claim_rows=rows)
    exercises = registry.exercises()
    with tempfile.TemporaryDirectory(prefix="posemb-lesson-") as tmp:
        png, svg = (pathlib.Path(p) for p in _parchment.draw_parchment(tmp))
        html = render.render_page(SCREEN_TEXT, rows, figs, png.name, svg.name, exercises)
        manifest = render.manifest(SCREEN_TEXT, rows, figs, [png.name, svg.name], exercises)
        files = {
            "parchment.png": png.read_bytes(),
            "parchment.svg": svg.read_bytes(),
            "claims.json": json.dumps(list(rows), indent=2).encode(),
            "manifest.json": json.dumps(manifest, indent=2).encode(),
            "index.html": html.encode(),  # last: the page appears once all it shows is there
        }
    for name, data in files.items():
        folder.write_bytes(name, data)
    folder.prune(keep=lambda rel: rel in files)
    index = folder.path / "index.html"
    failed = tuple(str(r["id"]) for r in rows if not r["passed"])
    return LessonBuild(
        folder=pathlib.Path(out),
        index=pathlib.Path(out) / "index.html",
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
