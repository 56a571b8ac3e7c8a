"""One look per lab variant, shared by the lab's plots and the lesson page's charts.

A variant keeps its colour everywhere it is drawn: the report's matplotlib plots
(:func:`posemb.lab.report.write`) and the lesson's Vega-Lite charts read the same table. The
trained encodings come first, in Okabe & Ito's colour-blind-safe palette (2008, "Color
Universal Design"), without sky blue beside blue at a band's opacity; the rest, and the
inference-time scalings, take Paul Tol's muted palette (Tol 2021, "Colour Schemes",
SRON/EPS/TN/09-002). Scalings are also dashed in the plots, so a colour never has to carry
the difference alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._errors import InputError


@dataclass(frozen=True)
class Look:
    """How one variant is drawn: ``colour`` (hex), ``dashed`` (an inference-time scaling) and
    its ``marker`` (a matplotlib marker code)."""

    colour: str
    dashed: bool
    marker: str


LOOKS: dict[str, Look] = {
    "learned": Look("#0072B2", False, "o"),
    "sinusoidal": Look("#D55E00", False, "s"),
    "nope": Look("#009E73", False, "^"),
    "alibi": Look("#CC79A7", False, "v"),
    "rope": Look("#E69F00", False, "D"),
    "t5": Look("#56B4E9", False, "<"),
    "fire": Look("#999999", False, ">"),
    "xpos": Look("#882255", False, "p"),
    "randomized": Look("#DDCC77", False, "P"),
    "rope+pi": Look("#332288", True, "*"),
    "rope+ntk": Look("#117733", True, "X"),
    "rope+dynamic": Look("#44AA99", True, "h"),
    "rope+yarn": Look("#000000", True, "d"),
    "rope+llama3": Look("#AA4499", True, "8"),
    # Training-free extensions, inference-time like the scalings (dashed).
    "rope+selfextend": Look("#661100", True, "$S$"),
    "rope+rerope": Look("#6699CC", True, "$R$"),
    "rope+dca": Look("#EE7733", True, "$C$"),
    # The 2024-26 encodings (posemb.lab.variants.RECENT), trained: Paul Tol's vibrant and light
    # palettes, which the rows above do not use, each with its initial as a marker.
    "p-rope": Look("#CC3311", False, "$p$"),
    "irope": Look("#EE3377", False, "$i$"),
    "rnope-swa": Look("#009988", False, "$w$"),
    "fope": Look("#0077BB", False, "$f$"),
    "cope": Look("#BBCC33", False, "$c$"),
    "kerple": Look("#AAAA00", False, "$k$"),
    "rope+sinks": Look("#EE8866", False, "$s$"),
    "rope+ssmax": Look("#77AADD", False, "$m$"),
    # Position interpolation fine-tuned past the training length (--finetune-steps): trained.
    "rope+pi+ft": Look("#999933", False, "H"),
}
"""Every variant the lab trains, scales or fine-tunes, by name
(:data:`posemb.lab.model.VARIANTS` and ``rope+pi+ft``)."""


def look(variant: str) -> Look:
    """The look of ``variant``.

    Raises:
        ValueError: ``variant`` is not one of :data:`LOOKS`.
    """
    try:
        return LOOKS[variant]
    except KeyError:
        raise InputError(f"variant {variant!r} has no look; known: {', '.join(LOOKS)}") from None


__all__ = ["LOOKS", "Look", "look"]
