"""The page's HTML (Jinja2, autoescaped) and its manifest, from screens, claim rows and figures.

Kept apart from :mod:`posemb.lesson.page`, which does the files, so that a test can render a
page from rows it changed and see the change (nothing on the page is typed by hand).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from importlib import resources
from typing import Any

from .._version import __version__
from .registry import STATE_SEPARATOR, Exercise, Screen, state_key

_SCRIPT_END = re.compile(r"</(script)", re.IGNORECASE)


def _inline(js: str) -> str:
    """Text that is safe inside a <script> element: no early end tag."""
    return _SCRIPT_END.sub(r"<\\/\1", js)


def _json_inline(obj: object) -> str:
    # "</" cannot appear inside a script element; JSON allows the escaped solidus.
    return json.dumps(obj, separators=(",", ":")).replace("</", "<\\/")


def _static(name: str) -> str:
    return (resources.files("posemb.lesson") / "static" / name).read_text(encoding="utf-8")


def _page_js() -> str:
    # The script builds a state's key as state_key does; the separator is written once, in
    # posemb.lesson.registry, and put into the script here.
    js = _static("page.js")
    if "POSEMB_STATE_SEPARATOR" not in js:
        raise RuntimeError("page.js must join control values with POSEMB_STATE_SEPARATOR")
    return js.replace("POSEMB_STATE_SEPARATOR", json.dumps(STATE_SEPARATOR))


def dark_palette_css() -> str:
    """CSS that swaps each chart colour of :mod:`posemb.lab.style` for its dark-mode partner:
    a colour that reads at 4.5:1 on the light card reads at under 3:1 on the dark one, and no
    single colour reads on both. On screen only: print keeps the light ones."""
    from ..lab import style

    rules = []
    for light, dark in style.dark_pairs().items():
        for attr in ("fill", "stroke"):
            rules.append(f'.view svg [{attr}="{light}" i] {{ {attr}: {dark}; }}')
    body = "\n".join(rules)
    return f"\n@media screen and (prefers-color-scheme: dark) {{\n{body}\n}}\n"


def default_key(fig: Any) -> str:
    """The state key of a figure's first state."""
    return state_key([c.values[c.default] for c in fig.controls])


def _by_screen(items: Sequence[Any], screen: Any, numbers: Sequence[int]) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {n: [] for n in numbers}
    for it in items:
        out[int(screen(it))].append(it)
    return out


def _figure_data(figs: Sequence[Any]) -> dict[str, object]:
    return {
        f.id: {
            "kind": f.kind,
            "alt": f.alt,
            "controls": [
                {"id": c.id, "kind": c.kind, "values": list(c.values), "default": c.default}
                for c in f.controls
            ],
            "states": f.states,
            "readouts": f.readouts,
        }
        for f in figs
    }


_VERDICT_WORDS = {
    "wrong": "gets {n} wrong",
    "overstated": "overstates {n}",
    "incomplete": "leaves {n} incomplete",
}
_NUMBERS = {1: "one", 2: "two", 3: "three", 4: "four"}


def _count(n: int, noun: str) -> str:
    return f"{_NUMBERS.get(n, str(n))} {noun}{'' if n == 1 else 's'}"


def evidence_summary(rows: Sequence[dict[str, object]]) -> str:
    """The one line a screen's folded checks show: how many hold, and what the source lesson
    gets wrong, e.g. "5 of 5 checks hold; the source lesson overstates one thing".

    Only a correction whose check passed says the source lesson is wrong; one whose check
    failed in this build is counted apart, as not established."""
    held = sum(1 for r in rows if r["passed"])
    line = f"{held} of {len(rows)} checks hold in this build"
    parts = []
    for verdict, words in _VERDICT_WORDS.items():
        n = sum(1 for r in rows if r["verdict"] == verdict and r["passed"])
        if n:
            parts.append(words.format(n=_count(n, "thing")))
    if parts:
        line += "; the source lesson " + " and ".join(parts)
    failed = sum(1 for r in rows if r["verdict"] in _VERDICT_WORDS and not r["passed"])
    if failed:
        checks = "its check" if failed == 1 else "their checks"
        line += f"; {_count(failed, 'correction')} failed {checks}"
    return line + " (open to see them)"


def render_page(
    screens: Sequence[Screen],
    rows: Sequence[dict[str, object]],
    figs: Sequence[Any],
    parchment_png: str,
    parchment_svg: str,
    exercises: Sequence[Exercise] = (),
) -> str:
    """The whole ``index.html`` as a string.

    Args:
        screens: every :class:`~posemb.lesson.registry.Screen` text, in order.
        rows: claim rows (what ``posemb verify --save`` writes).
        figs: :class:`posemb.lesson.registry.Figure` objects.
        parchment_png: file name of the parchment PNG beside ``index.html``.
        parchment_svg: same, SVG.
        exercises: the screens' questions with their answers
            (:func:`posemb.lesson.registry.exercises`).
    """
    import jinja2

    from . import assets

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("posemb.lesson", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    first_view = {
        f.id: (f.states[default_key(f)] if f.kind == "svg" else f.static_svg[default_key(f)])
        for f in figs
    }
    wrong = [r for r in rows if r["verdict"] not in ("holds", "n/a")]
    numbers = [s.number for s in screens]
    claims_by_screen = _by_screen(rows, lambda r: r["screen"], numbers)
    failed = [str(r["id"]) for r in rows if not r["passed"]]
    return env.get_template("index.html.j2").render(
        version=__version__,
        screens=screens,
        claims_by_screen=claims_by_screen,
        evidence_summary={n: evidence_summary(rs) for n, rs in claims_by_screen.items()},
        exercises_by_screen={e.screen: e for e in exercises},
        wrong_by_screen=_by_screen(wrong, lambda r: r["screen"], numbers),
        figs_by_screen=_by_screen(figs, lambda f: f.screen, numbers),
        first_view=first_view,
        default_key={f.id: default_key(f) for f in figs},
        figure_titles={f.id: f.title for f in figs},
        passed=sum(1 for r in rows if r["passed"]),
        total=len(rows),
        failed=failed,
        # A correction whose check failed in this build is not established: not counted.
        corrections=sum(1 for r in wrong if r["passed"]),
        unconfirmed=sum(1 for r in wrong if not r["passed"]),
        parchment_png=parchment_png,
        parchment_svg=parchment_svg,
        parchment_alt=(
            "A square cream parchment titled 'Positional Embeddings: Injecting Sequence Order': "
            "on the left, sinusoidal waves of several frequencies with their formula; on the "
            "right, the rows of a trained learned position table as a coloured strip; at the "
            "bottom, the formula adding token and position embeddings."
        ),
        licences=assets.licences(),
        figures_json=_json_inline(_figure_data(figs)),
        katex_css=assets.katex_css(),
        katex_js=_inline(assets.katex_js()),
        vega_js=_inline(assets.vega_js()),
        page_css=_static("page.css") + dark_palette_css(),
        page_js=_inline(_page_js()),
    )


def manifest(
    screens: Sequence[Screen],
    rows: Sequence[dict[str, object]],
    figs: Sequence[Any],
    files: Sequence[str],
    exercises: Sequence[Exercise] = (),
) -> dict[str, object]:
    """What the page holds, for tests and tools: every figure, its data call, every control and
    the readout it must show in each state, and the claims per screen."""
    return {
        "posemb": __version__,
        "files": ["index.html", "claims.json", "manifest.json", *files],
        "screens": [
            {
                "number": s.number,
                "title": s.title,
                "anchor": f"screen-{s.number}",
                "claims": [r["id"] for r in rows if r["screen"] == s.number],
                "figures": [f.id for f in figs if f.screen == s.number],
            }
            for s in screens
        ],
        "figures": [
            {
                "id": f.id,
                "screen": f.screen,
                "title": f.title,
                "call": f.call,
                "kind": f.kind,
                "alt": f.alt,
                "caption": f.caption,
                "controls": [
                    {
                        "id": c.id,
                        "label": c.label,
                        "kind": c.kind,
                        "values": list(c.values),
                        "default": c.default,
                    }
                    for c in f.controls
                ],
                "default_state": default_key(f),
                "readouts": f.readouts,
            }
            for f in figs
        ]
        + [
            {
                "id": "fig-parchment",
                "screen": screens[-1].number,
                "title": "The parchment",
                "call": "posemb.lesson.parchment.draw_parchment(folder)",
                "kind": "img",
                "alt": "the parchment figure",
                "caption": "",
                "controls": [],
                "default_state": "",
                "readouts": {},
            }
        ],
        "exercises": [
            {"screen": e.screen, "prompt": e.prompt, "answer": e.answer, "call": e.call}
            | {"figure": e.figure, "state": e.state}
            for e in exercises
        ],
    }


__all__ = ["default_key", "evidence_summary", "manifest", "render_page"]
