"""The lesson's figures, each computed by posemb's own functions in the same build.

A :class:`Figure` is what the page shows beside one screen of the lesson: a Vega-Lite chart
(built with Altair, data inlined) or a hand-drawn SVG for the lesson's own diagrams (dials,
the blender), in one or more *states*. Controls (sliders, toggles) pick a state; every
combination of control values is precomputed here, with the readout posemb measured for it,
so what the page shows for a state is exactly what posemb computes. ``static_svg`` holds the
first state of a Vega figure rendered by vl-convert: what a reader sees before the script runs,
or without it (the other states need the script's controls anyway).

No number in a figure is typed in: data comes from posemb calls made while building, and each
caption ends with the call, so a reader can reproduce it in a notebook. The lesson's own
quoted numbers (its "2" and "10,000" periods, its 384 pairs) appear only as the reference
lines and labels they are checked against.

The builders live in the screen modules (:mod:`posemb.lesson.screens`), registered with
:func:`posemb.lesson.registry.figure`; this module builds and renders them. Altair and
vl-convert are imported here, at module level: this module is only imported by the page
builder (the ``lesson`` extra), never by ``import posemb``.
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Mapping, Sequence
from typing import Any

from .. import _extras
from .._errors import InputError
from ..lab import report

try:
    import altair  # noqa: F401  (asked for at the door: the builders need it)
    import vl_convert
except ImportError as _import_error:
    raise _extras.missing(_import_error, "posemb's lesson figures", "lesson") from None

from . import (
    charts,
    screens,  # noqa: F401  (importing the screens registers every figure)
)
from .registry import BUILDERS, PREPARE, READS_CLAIMS, Control, Figure, state_key

ROWS = charts.rows_source()
"""The data source every chart is built on (:func:`posemb.lesson.charts.rows_source`)."""


def _build(id: str, lab: Mapping[str, Any], claim_rows: Sequence[dict[str, Any]] | None) -> Figure:
    if id in READS_CLAIMS:
        return BUILDERS[id](lab, claim_rows)
    return BUILDERS[id](lab)


def _render_jobs(
    figure: Figure, pool: concurrent.futures.Executor
) -> list[tuple[Figure, str, concurrent.futures.Future[str]]]:
    """Queue the vl-convert render of a "vega" figure's first state (the one the page shows
    before its script runs)."""
    if figure.kind != "vega":
        return []
    key = figure.default_key
    spec = figure.states[key]
    if not isinstance(spec, dict):
        raise TypeError(f"figure {figure.id}: a vega state must be a spec (dict)")
    return [(figure, key, pool.submit(vl_convert.vegalite_to_svg, spec))]


def _workers() -> int:
    try:
        return max(2, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(2, os.cpu_count() or 1)


def build_figure(
    id: str,
    summary: dict[str, Any] | None = None,
    claim_rows: Sequence[dict[str, Any]] | None = None,
) -> Figure:
    """Build one figure by id, rendered (``summary`` and ``claim_rows`` as in
    :func:`build_figures`)."""
    if id not in BUILDERS:
        raise InputError(f"unknown figure {id!r}; known: {', '.join(BUILDERS)}")
    figure = _build(id, report.default_summary() if summary is None else summary, claim_rows)
    with concurrent.futures.ThreadPoolExecutor(_workers()) as pool:
        for fig, key, job in _render_jobs(figure, pool):
            fig.static_svg[key] = job.result()
    return figure


def build_figures(
    summary: dict[str, Any] | None = None,
    claim_rows: Sequence[dict[str, Any]] | None = None,
) -> list[Figure]:
    """Every figure of the page, computed and rendered now, in screen order.

    The encoder behind the trained-attention figure trains on one thread while the other
    figures are computed, and vl-convert renders states as they are queued: on two cores the
    build takes about as long as the training plus the last renders, not the sum of all.

    Args:
        summary: a lab summary as :func:`posemb.lab.report.compact` writes it; default the
            one that ships with posemb (:func:`posemb.lab.report.default_summary`).
        claim_rows: the rows of ``posemb verify`` (as ``--save`` writes them: dicts with
            ``id`` and ``value``); the trained-accuracy figure draws the accuracies its claim
            measured. Default None: that figure says "not measured in this build" (training
            every encoding on every seed takes minutes).

    Raises:
        ValueError: a claim row a figure reads does not hold what its claim measures.
    """
    lab = report.default_summary() if summary is None else summary
    with concurrent.futures.ThreadPoolExecutor(_workers() + len(PREPARE)) as pool:
        prepared = {id: pool.submit(work) for id, work in PREPARE.items()}
        figures, jobs = [], []
        for id in BUILDERS:
            if id not in prepared:
                figures.append(_build(id, lab, claim_rows))
                jobs += _render_jobs(figures[-1], pool)
        for id, work in prepared.items():
            work.result()
            figures.append(_build(id, lab, claim_rows))
            jobs += _render_jobs(figures[-1], pool)
        for fig, key, job in jobs:
            fig.static_svg[key] = job.result()
    order = list(BUILDERS)
    return sorted(figures, key=lambda f: (f.screen, order.index(f.id)))


__all__ = [
    "BUILDERS",
    "ROWS",
    "Control",
    "Figure",
    "build_figure",
    "build_figures",
    "state_key",
]
