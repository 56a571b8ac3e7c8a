"""What a screen module registers: its :class:`Screen` text, its claims, its figures.

Each module of :mod:`posemb.lesson.screens` (``s01_blender.py`` ... ``s09_at_scale.py``) calls
:func:`screen` once with its own ``__name__``; the screen's number comes from the module's name
(``sNN_``), never from a number typed elsewhere. Its checks are registered with :func:`claim`,
its figure builders with :func:`figure`; both registries fill in the order the screens are
imported, so they are in the lesson's order with no sort.

A check measures with posemb's own functions and must be able to fail for the reason its claim
states: no check compares a formula with itself. Where the lesson says something else, the claim
quotes it (``lesson_says``) with a ``verdict`` on how it fails; the check then tests the
corrected statement, so a passing row means "posemb measured the truth", and the verdict says
whether the lesson agrees with it.

This module needs neither Altair nor vl-convert: ``posemb verify`` registers every screen
without the ``lesson`` extra.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._errors import InputError
from .._version import __version__

# --- screens -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Screen:
    """One screen of the page.

    Attributes:
        number: 1.., the lesson's order (from the module's name, ``sNN_...``).
        title: the short title.
        question: the screen's question.
        goal: what a reader can do after it.
        intuition: paragraphs, plain text.
        maths: display formulas, TeX.
        trap: the common mistake, and why it is one.
        terms: (name, definition) rows shown where the names first appear, under
            ``terms_title``.
        links: (figure id, text) pointers to a figure another screen draws, where this screen
            uses its result (a lab result is drawn once, where it teaches).
    """

    number: int
    title: str
    question: str
    goal: str
    intuition: tuple[str, ...]
    maths: tuple[str, ...]
    trap: str
    terms: tuple[tuple[str, str], ...] = ()
    terms_title: str = "Words used on this screen"
    links: tuple[tuple[str, str], ...] = ()


SCREENS: dict[int, str] = {}
"""Screen number -> title, for every screen module imported so far."""

SCREEN_LIST: list[Screen] = []
"""Every registered screen, in the order of their modules."""

_MODULE = re.compile(r"s(\d\d)_[a-z0-9_]+")


def screen_number(module: str) -> int:
    """The screen number of a screen module: ``...screens.s05_clock_tower`` -> 5.

    Raises:
        ValueError: the module's last name is not ``sNN_<words>``.
    """
    last = module.rsplit(".", 1)[-1]
    m = _MODULE.fullmatch(last)
    if m is None:
        raise InputError(f"screen module {module!r}: its name must be sNN_<words>, e.g. s05_clock")
    return int(m.group(1))


def screen(module: str, title: str, **text: Any) -> Screen:
    """Register the screen of ``module`` (pass ``__name__``) and return it.

    ``text`` holds the other fields of :class:`Screen` (question, goal, intuition, maths, trap).
    """
    number = screen_number(module)
    if number in SCREENS:
        raise InputError(f"screen {number} is registered twice (module {module!r})")
    s = Screen(number=number, title=title, **text)
    SCREENS[number] = title
    SCREEN_LIST.append(s)
    return s


# --- claims --------------------------------------------------------------------------------------

VERDICTS = ("holds", "wrong", "overstated", "incomplete", "n/a")
"""holds: the lesson says the same; wrong / overstated / incomplete: it does not, and
``lesson_says`` quotes it; n/a: the lesson does not say it (posemb adds the check)."""


@dataclass(frozen=True)
class Result:
    """What a check measured: ``passed``, a human-readable ``measured`` string, raw ``value``."""

    passed: bool
    measured: str
    value: object  # JSON-ready: a number, a list or a dict of them


Check = Callable[[], Result]


@dataclass(frozen=True)
class Claim:
    """One checked statement. ``verdict`` is 'holds' when the lesson says the same thing."""

    id: str
    screen: int
    claim: str
    check: Check
    verdict: str = "holds"
    lesson_says: str | None = None

    def __post_init__(self) -> None:
        if self.screen not in SCREENS:
            raise InputError(
                f"claim {self.id}: screen must be a registered screen "
                f"({', '.join(map(str, SCREENS)) or 'none yet'}), got {self.screen!r}"
            )
        if self.verdict not in VERDICTS:
            raise InputError(f"claim {self.id}: verdict must be one of {VERDICTS}")
        if (self.lesson_says is not None) != (self.verdict not in ("holds", "n/a")):
            raise InputError(
                f"claim {self.id}: a verdict that corrects the lesson quotes it (lesson_says), "
                f"and only such a verdict does"
            )

    def run(self) -> dict[str, object]:
        """Run the check; return the row as a JSON-ready dict."""
        r = self.check()
        return {
            "id": self.id,
            "claim": self.claim,
            "passed": bool(r.passed),
            "measured": r.measured,
            "value": r.value,
            "screen": self.screen,
            "screen_title": SCREENS[self.screen],
            "verdict": self.verdict,
            "lesson_says": self.lesson_says,
            "posemb": __version__,
        }


CLAIMS: list[Claim] = []
"""Every claim, in the order of the lesson's screens and, within a screen, of definition."""


def claim(
    id: str,
    screen: int | Screen,
    text: str,
    *,
    verdict: str = "holds",
    lesson_says: str | None = None,
) -> Callable[[Check], Check]:
    """Register the decorated check as the measurement of one claim of ``screen``."""
    number = screen.number if isinstance(screen, Screen) else screen

    def register(check: Check) -> Check:
        if any(c.id == id for c in CLAIMS):
            raise InputError(f"claim id {id!r} is registered twice")
        CLAIMS.append(Claim(id, number, text, check, verdict, lesson_says))
        return check

    return register


# --- figures -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Control:
    """One slider or toggle of a figure.

    ``values`` are the states as display strings, in order (a slider steps through them);
    ``default`` is the index of the state shown first (and without JavaScript).
    """

    id: str
    label: str
    kind: str
    values: tuple[str, ...]
    default: int

    def __post_init__(self) -> None:
        if self.kind not in ("slider", "toggle"):
            raise InputError(f"control {self.id}: kind must be 'slider' or 'toggle'")
        if not 0 <= self.default < len(self.values):
            raise InputError(f"control {self.id}: default {self.default} is not a value index")


def state_key(values: Sequence[str]) -> str:
    """The key of the state with these control values (one per control, in order).

    The page's script builds the same key (``page.js`` reads the separator from the page, which
    :func:`posemb.lesson.render.render_page` writes from :data:`STATE_SEPARATOR`).
    """
    return STATE_SEPARATOR.join(values)


STATE_SEPARATOR = "|"
"""What joins the control values of a state's key (display strings never contain it)."""


@dataclass(frozen=True)
class Figure:
    """One figure of the page, with every state precomputed.

    ``states`` maps :func:`state_key` of the control values to a Vega-Lite spec (dict, kind
    "vega") or SVG markup (str, kind "svg"); ``readouts`` to the text shown for that state;
    ``static_svg`` (kind "vega") to the spec rendered by vl-convert. ``caption`` is ``text``
    followed by ``call``, the posemb call that made the data.
    """

    id: str
    screen: int
    title: str
    caption: str
    call: str
    alt: str
    kind: str
    states: dict[str, object]
    readouts: dict[str, str]
    controls: tuple[Control, ...] = ()
    static_svg: dict[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The caption without its data line: what the figure shows, for a reader."""
        return self.caption.removesuffix(f" Data: {self.call}")

    @property
    def default_key(self) -> str:
        """The state shown first."""
        return state_key([c.values[c.default] for c in self.controls])


Draw = Callable[..., tuple[object, str]]
"""Called with one display value per control; returns (spec or SVG, readout)."""


def make_figure(
    id: str,
    screen: int | Screen,
    title: str,
    text: str,
    call: str,
    alt_text: str,
    *,
    kind: str,
    draw: Draw,
    controls: Sequence[Control] = (),
) -> Figure:
    """Run ``draw`` for every combination of control values and collect the states.

    The four texts come first, in the order a reader meets them (title, caption text, the posemb
    call that made the data, the alt text); what makes the figure is passed by name.
    """
    ids = [c.id for c in controls]
    # The page gives the figure's view the id f"{id}-view"; an element id must be unique.
    if len(set(ids)) != len(ids) or f"{id}-view" in ids:
        raise InputError(f"{id}: control ids must be unique and not {id}-view, got {ids}")
    states: dict[str, object] = {}
    readouts: dict[str, str] = {}
    combos = list(itertools.product(*(c.values for c in controls)))
    for combo in combos:
        content, readout = draw(*combo)
        states[state_key(combo)] = content
        readouts[state_key(combo)] = readout
    readouts = _announced(controls, combos, readouts)
    if kind == "vega":
        for key, spec in states.items():
            states[key] = described(spec, alt_text, readouts[key])
    return Figure(
        id=id,
        screen=screen.number if isinstance(screen, Screen) else screen,
        title=title,
        caption=f"{text} Data: {call}",
        call=call,
        alt=alt_text,
        kind=kind,
        states=states,
        readouts=readouts,
        controls=tuple(controls),
    )


def _announced(
    controls: Sequence[Control], combos: list[tuple[str, ...]], readouts: dict[str, str]
) -> dict[str, str]:
    """The readouts, each led by the value of every control that can change the picture but
    not the readout: the readout is the live region a screen reader hears when a control
    moves, and a move it does not announce leaves a listener with a figure changed unheard."""
    silent = [
        i
        for i, c in enumerate(controls)
        if any(
            a[:i] == b[:i] and a[i + 1 :] == b[i + 1 :] and a[i] != b[i]
            and readouts[state_key(a)] == readouts[state_key(b)]
            for a in combos
            for b in combos
        )
    ]  # fmt: skip
    if not silent:
        return readouts
    out = {}
    for combo in combos:
        lead = "; ".join(f"{controls[i].label}: {combo[i]}" for i in silent)
        out[state_key(combo)] = f"{lead}. {readouts[state_key(combo)]}"
    return out


def described(spec: object, alt_text: str, readout: str) -> dict[str, Any]:
    """A Vega-Lite state with its text alternative: ``description`` (which Vega writes as the
    chart's ``aria-label``) is the alt text and what this state shows, and no mark, axis or
    legend is exposed to assistive technology (each tick label would be read out, one by one,
    after it; page.js also hides the drawn chart, facet headers included). The values a
    sighted reader hovers for are in the figure's data table."""
    if not isinstance(spec, dict):
        raise TypeError("a vega state must be a spec (dict)")
    out = dict(spec)
    out["description"] = f"{alt_text} Shown: {readout}"
    out["config"] = {**out.get("config", {}), "aria": False}
    return out


Builder = Callable[..., Figure]
"""A figure builder: called with the lab summary (and, if it reads claims, the claim rows)."""

BUILDERS: dict[str, Builder] = {}
"""Every figure's builder by id, in the order the screens registered them."""

READS_CLAIMS: set[str] = set()
"""Builders that also take ``posemb verify``'s rows (``claim_rows``)."""

PREPARE: dict[str, Callable[[], object]] = {}
"""Slow work a builder needs first (training a small model), run beside the other figures."""


def figure(
    id: str, *, reads_claims: bool = False, prepare: Callable[[], object] | None = None
) -> Callable[[Builder], Builder]:
    """Register the decorated function as the builder of figure ``id``.

    Args:
        id: the figure's id on the page (``fig-...``); the builder's figure must carry it.
        reads_claims: the builder takes the claim rows as its second argument.
        prepare: a call (cached by the builder's module) that the renderer starts on its own
            thread before the other figures, so slow training overlaps the rest of the build.
    """

    def register(build: Builder) -> Builder:
        if id in BUILDERS:
            raise InputError(f"figure id {id!r} is registered twice")
        BUILDERS[id] = build
        if reads_claims:
            READS_CLAIMS.add(id)
        if prepare is not None:
            PREPARE[id] = prepare
        return build

    return register


# --- exercises -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Exercise:
    """A question a screen asks its reader: predict, then reveal.

    ``answer`` is computed by posemb when the page is built (a call, never typed), ``call`` says
    which, and ``figure`` / ``state`` name the figure state that shows it (a :func:`state_key`
    of that figure's control values).
    """

    screen: int
    prompt: str
    answer: str
    call: str
    figure: str
    state: str


Answer = Callable[[], str]

EXERCISES: list[tuple[int, str, str, str, str, Answer]] = []
"""Every exercise as registered: (screen, prompt, call, figure, state, answer function)."""


def exercise(
    screen: int | Screen, prompt: str, *, call: str, figure: str, state: str
) -> Callable[[Answer], Answer]:
    """Register the decorated function as the answer to ``prompt`` (run when the page is
    built, so a changed measurement changes the answer)."""
    number = screen.number if isinstance(screen, Screen) else screen

    def register(answer: Answer) -> Answer:
        if any(e[0] == number for e in EXERCISES):
            raise InputError(f"screen {number} already has an exercise")
        EXERCISES.append((number, prompt, call, figure, state, answer))
        return answer

    return register


def exercises() -> list[Exercise]:
    """Every exercise with its answer computed now, in screen order."""
    return [
        Exercise(screen=n, prompt=p, answer=answer(), call=c, figure=f, state=st)
        for n, p, c, f, st, answer in sorted(EXERCISES, key=lambda e: e[0])
    ]


__all__ = [
    "BUILDERS",
    "CLAIMS",
    "EXERCISES",
    "PREPARE",
    "READS_CLAIMS",
    "SCREENS",
    "SCREEN_LIST",
    "STATE_SEPARATOR",
    "VERDICTS",
    "Answer",
    "Builder",
    "Check",
    "Claim",
    "Control",
    "Draw",
    "Exercise",
    "Figure",
    "Result",
    "Screen",
    "claim",
    "described",
    "exercise",
    "exercises",
    "figure",
    "make_figure",
    "screen",
    "screen_number",
    "state_key",
]
