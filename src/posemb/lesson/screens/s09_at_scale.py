"""Screen 9, learned against sinusoidal at scale: parameter counts, row gradients, and the lab's
sinusoidal model past its training length.

Its text, its claims with their checks, and its figures: editing this screen is this file
(and its test, ``tests/lesson/test_s09_at_scale.py``).
"""

from __future__ import annotations

import math
from typing import Any, cast

from ..._errors import InputError
from ...lab.schema import Accuracy, LabSummary, ProbeName
from ...lab.style import look
from .. import charts, measure
from ..charts import alt
from ..registry import Control, Figure, Result, claim, exercise, figure, make_figure, screen

SCREEN = screen(
    __name__,
    title="Learned vs sinusoidal absolute embeddings at scale",
    question=("Learned or sinusoidal absolute embeddings: what do they cost, and what do they do?"),
    goal=(
        "Count the parameters of each scheme in a real model and compare how each behaves "
        "inside and past its training length."
    ),
    intuition=(
        "A learned table costs one vector per position (GPT-2: 1,024 x 768); the sinusoidal "
        "table costs nothing and exists at every position. Rows of a learned table beyond "
        "the trained length receive no gradient at all.",
        "The figure at the end of this screen is the lesson's parchment: the sinusoidal "
        "harmonics on the left, a learned table trained by posemb's lab on the right, and "
        "the sum that feeds the first layer at the bottom.",
        "Before it, the designs that models of 2024-26 use instead (NoPE in some layers, "
        "frequencies cut or learned, positions counted from content, learned distance "
        "penalties, sinks, a length-aware softmax), trained side by side by the lab: the "
        "ones whose loss stays flat past the training length are not all the ones that "
        "still find a fact there.",
    ),
    maths=(
        r"X_{\text{in}} = X_{\text{tok}} + W_{\text{pos}},\quad "
        r"W_{\text{pos}}\in\mathbb{R}^{T\times d}",
    ),
    links=(
        (
            "fig-learned-gradients",
            "why a learned table's rows past its training length stay untrained (screen 3)",
        ),
    ),
    trap=(
        "Assuming the sinusoidal encoding extrapolates because it is defined everywhere. "
        "Past the trained length the lab's sinusoidal model keeps almost none of what "
        "context was worth inside it."
    ),
)
"""This screen's text; its number comes from the module's name."""


MOSTLY_LOST = 0.2
"""A model that keeps less than a fifth of the within-training gain has lost most of it. The
sinusoidal claim used :data:`IGNORES_CONTEXT` while the default lab trained on 32 windows a
step with one seed (it kept 0-7%); on 16 windows with two seeds it keeps 12-18%, which is still
most of the gain lost, but no longer "about the unigram entropy", and the claim says so."""


@claim(
    "absolute.parameter_counts",
    SCREEN,
    "A learned table adds L_max x D parameters (1024 x 128 = 131,072 in the lab's LM); a "
    "sinusoidal table adds none.",
)
def _absolute_parameters() -> Result:
    n = measure.param_counts()
    learned, sinusoidal = n["learned"] - n["nope"], n["sinusoidal"] - n["nope"]
    return Result(
        learned == 1024 * 128 and sinusoidal == 0,
        f"parameters beyond NoPE's {n['nope']:,}: learned {learned:,}, sinusoidal {sinusoidal}",
        {"learned": learned, "sinusoidal": sinusoidal},
    )


@claim(
    "sinusoidal.extrapolation_is_not_enabled",
    SCREEN,
    "A fixed sinusoidal table does not make a model extrapolate: past its training length the "
    "lab's sinusoidal model loses more than within it at every length, beyond the spread of its "
    "seeds, and keeps under a fifth of what context is worth within it: most of it is lost.",
    verdict="overstated",
    lesson_says="Fixed, deterministic, enables relative distance extrapolation",
)
def _sinusoidal_extrapolation() -> Result:
    lab = measure.lab_summary()
    rises, past, within = lab.past_vs_within("sinusoidal")
    unigram = lab.unigram
    lens = lab.past_lens
    kept = [lab.context_kept("sinusoidal", n) for n in lens]
    return Result(
        all(rises) and max(kept) < MOSTLY_LOST,
        f"sinusoidal: loss within {lab.train_len} tokens {within:.2f}, past it "
        f"{', '.join(f'{m:.2f}' for m in past)}; unigram entropy {unigram:.2f} nats/char; "
        f"context kept {', '.join(f'{k:.0%}' for k in kept)} ({lab.conditions()})",
        {"within": within, "past": past, "unigram": unigram, "context_kept": kept},
    )


FLAT = 0.1
"""A loss past the training length that rises less than this (nats/char) from 2x to 16x is
flat: two seed spreads of the flattest variants' losses (at most 0.05 between the two seeds of
the shipped run)."""


def _rise(lab: LabSummary, variant: str) -> float:
    """How much the loss past the training length rises from 2x to the longest window."""
    lens = lab.past_lens
    return lab.mean_std(variant, lens[-1], "past")[0] - lab.mean_std(variant, lens[0], "past")[0]


def _spread(acc: Accuracy) -> float:
    """An accuracy's noise: the spread between seeds, or the binomial standard error of its
    pooled probes where that is larger (two seeds can agree by luck)."""
    return max(float(acc.get("std") or 0.0), float(acc["se"]))


def _difference(lab: LabSummary, a: str, b: str, n: int) -> tuple[float, float]:
    """(one-token retrieval of ``a`` minus ``b`` at ``n``, two noises of that difference)."""
    x, y = lab.accuracy("retrieval", a, n), lab.accuracy("retrieval", b, n)
    return float(x["mean"]) - float(y["mean"]), 2 * math.hypot(_spread(x), _spread(y))


@claim(
    "lab.recent.flat_loss_is_not_retrieval",
    SCREEN,
    "Among the encodings of 2024-26, a flat loss past the training length is not retrieval: "
    "RNoPE-SWA's and KERPLE's losses rise by under 0.1 nats/char from 2x to 16x while RoPE's "
    "rises by over 1; yet at 16x RNoPE-SWA finds a one-token fact under half the time and no "
    "more often than RoPE (within noise), while KERPLE finds it more than twice as often as "
    "RoPE (beyond noise).",
)
def _flat_loss_is_not_retrieval() -> Result:
    lab = measure.recent_lab_summary()
    n = lab.eval_lens[-1]
    rise = {v: _rise(lab, v) for v in ("rnope-swa", "kerple", "rope")}
    acc = {
        v: float(lab.accuracy("retrieval", v, n)["mean"]) for v in ("rnope-swa", "kerple", "rope")
    }
    swa, swa_noise = _difference(lab, "rnope-swa", "rope", n)
    kerple, kerple_noise = _difference(lab, "kerple", "rope", n)
    holds = (
        rise["rnope-swa"] < FLAT
        and rise["kerple"] < FLAT
        and rise["rope"] > 1.0
        and acc["rnope-swa"] < 0.5
        and swa <= swa_noise
        and kerple > kerple_noise
        and acc["kerple"] > 2 * acc["rope"]
    )
    return Result(
        holds,
        "rise of the loss past the training length from 2x to 16x: "
        + ", ".join(f"{v} {r:+.2f}" for v, r in rise.items())
        + f"; one-token retrieval at {n}: "
        + ", ".join(f"{v} {a:.2f}" for v, a in acc.items())
        + f" (RNoPE-SWA - RoPE {swa:+.2f}, KERPLE - RoPE {kerple:+.2f}; noise {swa_noise:.2f}, "
        f"{kerple_noise:.2f}; chance {lab.chance('retrieval'):.3f}; {lab.conditions()})",
        {"rise": rise, "retrieval": acc, "swa_minus_rope": swa, "kerple_minus_rope": kerple},
    )


@figure("fig-param-counts")
def fig_param_counts(summary: dict[str, Any]) -> Figure:
    """Parameters each encoding adds to the lab's LM."""
    counts = measure.param_counts()
    nope = counts["nope"]

    def draw() -> tuple[object, str]:
        rows = [
            {"encoding": e, "extra": n - nope, "label": f"+{n - nope:,}"}
            for e, n in counts.items()
            if e != "nope"
        ]
        base = alt.Chart().encode(
            y=alt.Y(
                "encoding:N",
                title=None,
                sort=[
                    str(r["encoding"]) for r in sorted(rows, key=lambda r: -int(str(r["extra"])))
                ],
            ),
            tooltip=["encoding:N", alt.Tooltip("extra:Q", format=",")],
        )
        bars = base.mark_bar(aria=False, color=charts.INK[0]).encode(
            x=alt.X("extra:Q", title=f"parameters beyond NoPE's {nope:,}")
        )
        # A bar of 0 (or 512 beside 131,072) has no width to see: every bar says its number.
        zero = base.mark_tick(aria=False, color=charts.INK[0], thickness=2).encode(x=alt.datum(0))
        values = base.mark_text(aria=False, align="left", dx=5, fontSize=12).encode(
            x="extra:Q", text="label:N"
        )
        chart = alt.layer(bars, zero, values, data=charts.rows_source()).properties(
            width=charts.WIDE - 200, height=240
        )
        shown = ", ".join(f"{e} +{n - nope:,}" for e, n in counts.items() if e != "nope")
        return charts.spec(chart, rows), f"beyond NoPE's {nope:,}: {shown}"

    return make_figure(
        "fig-param-counts",
        SCREEN,
        "What each encoding costs in parameters",
        "Parameters of the lab's character LM (width 128, 4 layers, 1,024 positions) beyond the "
        "same model without positions. A learned table adds L_max x D; sinusoids, RoPE, xPos "
        "and ALiBi add none; T5 buckets and FIRE a few.",
        "posemb.lesson.claims.param_counts()",
        "Horizontal bars, each labelled with its count: learned far ahead at +131,072, T5 and "
        "FIRE a few hundred, the others 0.",
        kind="vega",
        draw=draw,
    )


@exercise(
    SCREEN,
    "How many parameters does a learned position table add to the lab's LM (1,024 positions, "
    "width 128), and how many does a sinusoidal one add?",
    call="posemb.lesson.measure.param_counts()",
    figure="fig-param-counts",
    state="",
)
def _table_parameters() -> str:
    counts = measure.param_counts()
    learned, sinusoidal = counts["learned"] - counts["nope"], counts["sinusoidal"] - counts["nope"]
    return (
        f"The learned table adds {learned:,} (1,024 x 128), the sinusoidal one {sinusoidal:,}: "
        "it is computed, not learned. RoPE adds none either."
    )


RECENT_MEASURES = {
    "loss past the training length": "loss",
    "one-fact retrieval": "retrieval",
    "multi-key needles": "multikey",
    "variable tracking": "vartrack",
    "flip-flop": "flipflop",
}
"""The recent-suite figure's measures: the toggle's label and the summary's task."""

RECENT_WINDOWS = ("128", "256", "512", "1024")
"""The windows the recent-suite figure shows, all past the training length of 64."""


def _recent_rows(lab: LabSummary, measure_: str, n: int) -> list[dict[str, object]]:
    """One row per variant of the recent suite: mean and seed spread of ``measure_`` (a task of
    :data:`RECENT_MEASURES`) at window ``n``."""
    rows: list[dict[str, object]] = []
    for v in lab.variants:
        if measure_ == "loss":
            stat = lab.loss(v, n, "past")
            if stat is None:
                raise InputError(f"recent lab summary: no loss past the training length at {n}")
        else:
            stat = lab.accuracy(cast(ProbeName, measure_), v, n)
        m, s = float(stat["mean"]), float(stat.get("std") or 0.0)
        row: dict[str, object] = {"variant": v, "value": charts.rounded(m)}
        row |= {"lo": charts.rounded(m - s), "hi": charts.rounded(m + s)}
        # One seed has no spread to show: "± 0.00" would read as certainty.
        row |= {"label": f"{m:.2f} ± {s:.2f}" if stat["n"] > 1 else f"{m:.2f}"}
        rows.append(row)
    return rows


def _loss_domain(lab: LabSummary, refs: list[tuple[float, str]]) -> list[float]:
    """The loss axis: every variant's loss past the training length at every window, with its
    spread, and the reference lines, on one scale for all windows (so a slider step moves the
    dots, not the axis)."""
    values = [v for v, _ in refs]
    for variant in lab.variants:
        for n in lab.past_lens:
            m, s = lab.mean_std(variant, n, "past")
            values += [m - s, m + s]
    return [math.floor(min(values) * 10) / 10, math.ceil(max(values) * 10) / 10]


def _recent_chart(
    lab: LabSummary, measure_: str, x_title: str, refs: list[tuple[float, str]]
) -> alt.TopLevelMixin:
    """Dots of each variant's mean with its seed spread as a bar, and labelled reference
    lines; the variants keep the lab's order and look (:mod:`posemb.lab.style`)."""
    variants = lab.variants
    scale = alt.Scale(domain=variants, range=[look(v).colour for v in variants])
    domain = [0.0, 1.0] if measure_ != "loss" else _loss_domain(lab, refs)
    x = alt.X("value:Q", title=x_title, scale=alt.Scale(domain=domain, clamp=True))
    y = alt.Y("variant:N", title=None, sort=variants)
    base = alt.Chart().encode(y=y)
    spread = base.mark_rule(aria=False, strokeWidth=3).encode(
        x=alt.X("lo:Q", scale=alt.Scale(domain=domain, clamp=True)),
        x2="hi:Q",
        color=alt.Color("variant:N", scale=scale, legend=None),
    )
    dots = base.mark_point(aria=False, filled=True, opacity=1, size=90).encode(
        x=x,
        color=alt.Color("variant:N", scale=scale, legend=None),
        tooltip=["variant:N", alt.Tooltip("label:N", title="mean ± std over seeds")],
    )
    values = base.mark_text(aria=False, align="left", dx=10, dy=-9, fontSize=11).encode(
        x="value:Q", text="label:N"
    )
    marks = alt.Chart(charts.inline_data([{"x": v, "label": t} for v, t in refs]))
    rules = marks.mark_rule(aria=False, strokeDash=[4, 4], color=charts.INK[7]).encode(
        x="x:Q", tooltip=["label:N", "x:Q"]
    )
    rule_labels = marks.mark_text(
        aria=False, align="left", baseline="top", dx=3, y=-14, color=charts.INK[7], fontSize=11
    ).encode(x="x:Q", text="label:N")
    layers = alt.layer(spread, dots, values, data=charts.rows_source()) + rules + rule_labels
    return layers.properties(width=charts.WIDE - 220, height=26 * len(variants))


@figure("fig-lab-recent")
def fig_lab_recent(summary: dict[str, Any]) -> Figure:
    """The recent suite (2024-26 encodings beside RoPE and NoPE) at one window past the
    training length: loss, or accuracy on one of the three probe tasks, mean and seed spread.

    ``summary`` (the default run's) is not what it draws: it reads the recent suite's shipped
    summary (:func:`posemb.lab.report.recent_summary`)."""
    lab = measure.recent_lab_summary()
    cfg, train = lab.data["config"], lab.train_len
    within, _ = lab.mean_std("rope", train, "all")
    designs = [v for v in lab.variants if v not in ("rope", "nope")]

    def draw(which: str, window: str) -> tuple[object, str]:
        task, n = RECENT_MEASURES[which], int(window)
        rows = _recent_rows(lab, task, n)
        if task == "loss":
            refs = [(lab.unigram, "unigram"), (within, f"RoPE within {train}")]
            title = f"loss past position {train} in a {n}-token window (nats/char)"
        else:
            refs = [(lab.chance(cast(ProbeName, task)), "chance")]
            title = f"{which} accuracy in a {n}-token window"
        chart = _recent_chart(lab, task, title, refs)
        shown = "; ".join(f"{r['variant']} {r['label']}" for r in rows)
        return charts.spec(chart, rows), f"{which} at {n} tokens (trained at {train}): {shown}"

    return make_figure(
        "fig-lab-recent",
        SCREEN,
        "The encodings of 2024-26 past the training length",
        f"posemb lab --suite recent: RoPE, NoPE and {len(designs)} designs of 2024-26 "
        f"({', '.join(designs)}), each trained at {train} tokens and measured in longer "
        "windows. Dots: mean over "
        f"{len(cfg['seeds'])} seeds; bars: one standard deviation between seeds. Holding the "
        "loss and holding a fact are different things: compare the toggles.",
        "posemb.lab.report.recent_summary()",
        "Dots per encoding, one row each, on a horizontal scale of loss or accuracy, with the "
        "seed spread as a bar and dashed reference lines (chance, or the unigram entropy and "
        "RoPE's loss within its training length).",
        kind="vega",
        draw=draw,
        controls=[
            Control("fig-lab-recent-measure", "measure", "toggle", tuple(RECENT_MEASURES), 0),
            Control("fig-lab-recent-window", "window", "slider", RECENT_WINDOWS, 3),
        ],
    )
