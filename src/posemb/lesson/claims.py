"""The lesson's claims, each beside the check that measures it (``posemb verify``).

The claims live in the screen modules (:mod:`posemb.lesson.screens`), each registered with
:func:`claim` beside the screen it comes from; this module gathers them (:data:`CLAIMS`, in
the lesson's order) and runs them (:func:`run_all`). Most checks run in float64 on the CPU
with fixed seeds in well under a second; the trained dog-bites-man rows train small encoders
(tens of seconds), and the extrapolation rows read the summary of the default lab run that
ships with posemb (:func:`posemb.lab.report.default_summary`), so what they quote is what
``posemb lab`` measured, not a number typed in.

The measurements a figure also draws (:func:`dog_bites_man_outputs`, :func:`four_terms`, ...)
are importable from here as before; they live in :mod:`posemb.lesson.measure` or in their
screen's module.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._errors import InputError
from . import screens  # noqa: F401  (importing the screens registers every claim)
from .measure import (
    DOG_BITES_MAN,
    EXACT,
    F64,
    SAME_TOKEN_AT,
    causal_same_token_qk,
    counting_signal,
    dog_bites_man_outputs,
    learned_row_gradient_norms,
    param_counts,
    word_change,
)
from .registry import CLAIMS, SCREENS, VERDICTS, Check, Claim, Result, claim
from .screens.s02_absolute import FOUR_TERMS, four_terms, random_cosines


def run_all(only: Sequence[str] | None = None) -> list[dict[str, object]]:
    """Run the claims (all, or those whose id is in ``only``); return their rows.

    Raises:
        ValueError: an id in ``only`` names no claim.
    """
    if only is not None:
        known = {c.id for c in CLAIMS}
        unknown = [i for i in only if i not in known]
        if unknown:
            raise InputError(
                f"unknown claim id(s) {', '.join(unknown)}; `posemb verify --list` shows them"
            )
    return [c.run() for c in CLAIMS if only is None or c.id in only]


__all__ = [
    "CLAIMS",
    "DOG_BITES_MAN",
    "EXACT",
    "F64",
    "FOUR_TERMS",
    "SAME_TOKEN_AT",
    "SCREENS",
    "VERDICTS",
    "Check",
    "Claim",
    "Result",
    "causal_same_token_qk",
    "claim",
    "counting_signal",
    "dog_bites_man_outputs",
    "four_terms",
    "learned_row_gradient_norms",
    "param_counts",
    "random_cosines",
    "run_all",
    "word_change",
]
