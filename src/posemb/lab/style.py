"""One look per lab variant, shared by the lab's plots and the lesson page's charts.

A variant keeps its look everywhere it is drawn: the report's matplotlib plots
(:func:`posemb.lab.report.write`) and the lesson's Vega-Lite charts read the same table. The
hues are Okabe & Ito's colour-blind-safe palette (2008, "Color Universal Design") for the
trained encodings of the classic suite and Paul Tol's (Tol 2021, "Colour Schemes",
SRON/EPS/TN/09-002) for the rest, each darkened (``colour``, for a light page) or lightened
(``dark``, for a dark one) in lightness only, until it reads at 4.5:1 against the card it is
drawn on (WCAG 2.1, 1.4.3): a colour is legible as text, so more than legible as a line
(1.4.11 asks 3:1).

Colour never carries the difference alone (1.4.1): every variant also has its own ``dash``
pattern and its own matplotlib ``marker`` (Vega has fewer shapes: ``shape`` is the nearest, and
some variants share one). ``dashed`` marks the inference-time scalings and extensions.
:data:`INK` holds the same pairs for what a chart annotates (reference lines, labels, the
hands of a dial).
"""

from __future__ import annotations

from dataclasses import dataclass

from .._errors import InputError

CARDS = {"light": ("#fdfcf8", "#f2efe6"), "dark": ("#16171b", "#24262d")}
"""The backgrounds a chart is drawn on in each colour scheme: the lesson page and its figure
card (``page.css``'s ``--bg`` and ``--panel``); the lab's plots draw on white."""


@dataclass(frozen=True)
class Look:
    """How one variant is drawn: ``colour`` (hex, on a light background), ``dashed`` (an
    inference-time scaling or extension, which the lab's tables and the report group apart),
    its ``marker`` (a matplotlib marker code), ``dark`` (its colour on a dark background) and
    ``dash`` (its line's dash pattern, on and off lengths; () is solid)."""

    colour: str
    dashed: bool
    marker: str
    dark: str = ""
    dash: tuple[int, ...] = ()

    @property
    def shape(self) -> str:
        """The marker as a Vega point shape (the nearest one; circle where none is near)."""
        return _SHAPES.get(self.marker, "circle")


_SHAPES = {
    "o": "circle",
    "s": "square",
    "^": "triangle-up",
    "v": "triangle-down",
    "<": "triangle-left",
    ">": "triangle-right",
    "D": "diamond",
    "d": "diamond",
    "X": "cross",
    "P": "cross",
    "*": "wedge",
    "p": "square",
    "h": "circle",
    "8": "circle",
}

_SOLID: tuple[int, ...] = ()

LOOKS: dict[str, Look] = {
    "learned": Look("#0070AF", False, "o", "#0095E9", (12, 4)),
    "sinusoidal": Look("#B14E00", False, "s", "#EA6700", (6, 3)),
    "nope": Look("#007A59", False, "^", "#00A276", (2, 3)),
    "alibi": Look("#AF437F", False, "v", "#CC79A7", (8, 3, 2, 3)),
    "rope": Look("#8F6300", False, "D", "#E69F00", _SOLID),
    "t5": Look("#1571A5", False, "<", "#56B4E9", (4, 2, 1, 2)),
    "fire": Look("#6B6B6B", False, ">", "#999999", (5, 1, 1, 1)),
    "xpos": Look("#882255", False, "p", "#D967A0", (10, 2, 2, 2, 2, 2)),
    "randomized": Look("#7A6B1F", False, "P", "#DDCC77", (3, 3)),
    "rope+pi": Look("#332288", True, "*", "#9282E0", (6, 4)),
    "rope+ntk": Look("#117733", True, "X", "#18A547", (6, 4, 1, 4)),
    "rope+dynamic": Look("#2F766A", True, "h", "#44AA99", (6, 4, 1, 4, 1, 4)),
    "rope+yarn": Look("#000000", True, "d", "#ECECF1", (5, 5)),
    "rope+llama3": Look("#A94498", True, "8", "#C670B8", (9, 3, 3, 3)),
    # Training-free extensions, inference-time like the scalings (dashed).
    "rope+selfextend": Look("#661100", True, "$S$", "#FF502D", (7, 2)),
    "rope+rerope": Look("#376EA5", True, "$R$", "#6699CC", (7, 2, 1, 2)),
    "rope+dca": Look("#B44B0F", True, "$C$", "#EE7733", (7, 2, 1, 2, 1, 2)),
    # The 2024-26 encodings (posemb.lab.variants.RECENT), trained: Paul Tol's vibrant and light
    # palettes, which the rows above do not use, each with its initial as a marker.
    "p-rope": Look("#C93211", False, "$p$", "#EF6040", (3, 2)),
    "irope": Look("#D11157", False, "$i$", "#F1558D", (5, 2, 1, 2)),
    "rnope-swa": Look("#00796B", False, "$w$", "#00A08E", (1, 2)),
    "fope": Look("#3C4F9E", False, "$f$", "#8CA0F0", (9, 2)),
    "cope": Look("#68711C", False, "$c$", "#BBCC33", (4, 4)),
    "kerple": Look("#6F6F00", False, "$k$", "#AAAA00", (2, 2, 6, 2)),
    "rope+sinks": Look("#BF4015", False, "$s$", "#EE8866", (11, 3)),
    "rope+ssmax": Look("#2C6EAF", False, "$m$", "#77AADD", (3, 1)),
    # Position interpolation fine-tuned past the training length (--finetune-steps): trained.
    "rope+pi+ft": Look("#6E6E25", False, "H", "#999933", (14, 3, 3, 3)),
}
"""Every variant the lab trains, scales or fine-tunes, by name
(:data:`posemb.lab.model.VARIANTS` and ``rope+pi+ft``)."""


INK = {
    "blue": ("#0070AF", "#0095E9"),
    "vermillion": ("#B14E00", "#EA6700"),
    "green": ("#007A59", "#00A276"),
    "pink": ("#AF437F", "#CC79A7"),
    "orange": ("#8F6300", "#E69F00"),
    "sky": ("#1571A5", "#56B4E9"),
    "black": ("#000000", "#ECECF1"),
    "grey": ("#6B6B6B", "#999999"),
    "yellow": ("#746D09", "#F0E442"),
}
"""What a chart annotates with, (light, dark), in the Okabe-Ito order: the same hues as the
variants, at the same contrast."""


def look(variant: str) -> Look:
    """The look of ``variant``.

    Raises:
        ValueError: ``variant`` is not one of :data:`LOOKS`.
    """
    try:
        return LOOKS[variant]
    except KeyError:
        raise InputError(f"variant {variant!r} has no look; known: {', '.join(LOOKS)}") from None


def dark_pairs() -> dict[str, str]:
    """Every light colour of :data:`LOOKS` and :data:`INK` with the colour it becomes on a dark
    background (upper-case hex): what the lesson page swaps in dark mode."""
    pairs = {v.colour.upper(): v.dark.upper() for v in LOOKS.values()}
    for light, dark in INK.values():
        pairs.setdefault(light.upper(), dark.upper())
    return pairs


def contrast(a: str, b: str) -> float:
    """WCAG 2.1's contrast ratio of two hex colours (1 to 21)."""

    def luminance(colour: str) -> float:
        rgb = [int(colour.lstrip("#")[i : i + 2], 16) / 255 for i in (0, 2, 4)]
        lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


__all__ = ["CARDS", "INK", "LOOKS", "Look", "contrast", "dark_pairs", "look"]
