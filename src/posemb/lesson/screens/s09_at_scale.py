"""Screen 9, learned against sinusoidal at scale: parameter counts, row gradients, and the lab's
sinusoidal model past its training length.

Its text, its claims with their checks, and its figures: editing this screen is this file
(and its test, ``tests/lesson/test_s09_at_scale.py``).
"""

from __future__ import annotations

from typing import Any

from .. import charts, measure
from ..charts import alt
from ..registry import Figure, Result, claim, exercise, figure, make_figure, screen

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
        bars = base.mark_bar(aria=False, color=charts.OKABE_ITO[0]).encode(
            x=alt.X("extra:Q", title=f"parameters beyond NoPE's {nope:,}")
        )
        # A bar of 0 (or 512 beside 131,072) has no width to see: every bar says its number.
        zero = base.mark_tick(aria=False, color=charts.OKABE_ITO[0], thickness=2).encode(
            x=alt.datum(0)
        )
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
