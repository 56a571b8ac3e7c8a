"""Screen 3, past the trained length: a learned table's untrained rows, what the lab measured for
RoPE and the scalings, and RoPE's zero parameters.

Its text, its claims with their checks, and its figures: editing this screen is this file
(and its test, ``tests/lesson/test_s03_past_training_length.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from ... import absolute, rope
from ..._errors import InputError
from ...lab.schema import Accuracy, LabSummary, Retrieval
from ...lab.style import look
from .. import charts, diagrams, measure
from ..charts import alt
from ..measure import F64
from ..registry import Control, Figure, Result, claim, exercise, figure, make_figure, screen

SCREEN = screen(
    __name__,
    title="Why absolute embeddings fail past the trained length, and RoPE's answer",
    question=(
        "Why do absolute embeddings break past the trained length, and what does rotation change?"
    ),
    goal=(
        "Contrast absolute positions (a vector per index) with RoPE (an angle per index) and "
        "measure what each does past the length it was trained at."
    ),
    intuition=(
        "A learned table has one row per trained position: position 2,049 of a 2,048-row "
        "table simply does not exist, and rows that training never reached never moved from "
        "their initial values.",
        "RoPE instead turns each pair of query and key channels by an angle proportional to "
        "the position. A logit then depends on the difference of two angles, that is on the "
        "distance between the tokens, and RoPE adds no parameters at all.",
        "That does not make a RoPE model work at any length. Past the trained length the "
        "slow pairs reach angles training never showed; the loss curves below, from posemb's "
        "own lab, show RoPE degrading there. Screen 7 shows how the context-extension "
        "scalings remap those angles.",
    ),
    maths=(
        r"\tilde x_t = x_t + p_t \quad\text{(absolute)}\qquad "
        r"\tilde q_m = R_m q,\ \tilde k_n = R_n k \quad\text{(rotary)}",
        r"\langle R_m q, R_n k\rangle = q^\top R_{n-m} k",
    ),
    trap=(
        "Believing RoPE has learnable parameters. It is a fixed rotation of q and k; the "
        "parameter count of a model does not change when RoPE is switched on."
    ),
    terms=(
        (
            "nats/char",
            "the lab's loss: the mean negative log-probability (natural log) a model gives the "
            "next character. Lower is better; 0 would be certainty.",
        ),
        (
            "unigram entropy",
            "the loss of a model that ignores context and predicts each character by its "
            "frequency alone: what a model that has lost all context scores.",
        ),
        (
            "past the training length",
            "positions beyond the window the model was trained on (64 tokens in the lab): "
            "evaluating a 1,024-token window scores the positions past 64 separately.",
        ),
    ),
)
"""This screen's text; its number comes from the module's name."""


IGNORES_CONTEXT = 0.1
"""A model that keeps less than a tenth of the within-training gain is treated as one that
ignores context ("about the unigram entropy")."""


def _learned_row_gradients(window: int = 16) -> tuple[float, float]:
    """(smallest gradient norm of rows < window, largest of rows >= window) after one step."""
    norms = measure.learned_row_gradient_norms(window)
    return float(norms[:window].min()), float(norms[window:].max())


@claim(
    "absolute.learned_rows_past_training_are_untrained",
    SCREEN,
    "A learned table gets no training signal past the training length: the gradient reaches "
    "every row a training window covers and exactly none beyond, and evaluated longer the lab's "
    "learned-position model loses more past that length than within it, at every length. A "
    "table of T_max rows has no row past it; a larger one has rows that were never trained.",
    verdict="incomplete",
    lesson_says="If trained on context window T_(max) = 2048, position t = 2049 has no learned "
    "vector",
)
def _learned_past_length() -> Result:
    lab = measure.lab_summary()
    rises, past, within = lab.past_vs_within("learned")
    trained, untrained = _learned_row_gradients()
    return Result(
        all(rises) and trained > 0 and untrained == 0.0,
        f"one step on 16-token windows, 64-row table: smallest gradient norm of rows 0-15 "
        f"{trained:.1e}, largest of rows 16-63 {untrained:.1e}; lab: loss within "
        f"{lab.train_len} tokens {within:.2f}, past it "
        f"{', '.join(f'{m:.2f}' for m in past)} nats/char ({lab.conditions()})",
        {"within": within, "past": past, "grad_trained": trained, "grad_untrained": untrained},
    )


@claim(
    "rope.extrapolation_is_not_native",
    SCREEN,
    "RoPE alone does not extrapolate: from 4x its training length on, the lab's RoPE model "
    "loses more past that length than within it, beyond the spread of its seeds, and keeps "
    "under a tenth of what context is worth at 16x "
    "(about the unigram entropy); frequency scaling (YaRN, no fine-tuning) recovers part of "
    "the loss, and ALiBi's loss rises at no length.",
    verdict="overstated",
    lesson_says="RoPE allows these models to natively extrapolate from 8k training contexts "
    "to 128k+ production context windows via simple frequency scaling",
)
def _rope_extrapolation() -> Result:
    lab = measure.lab_summary()
    longest = lab.eval_lens[-1]
    _, past, within = lab.past_vs_within("rope")
    far, where = lab.rises_from("rope", measure.FAR)
    rope_m, rope_s = lab.mean_std("rope", longest, "past")
    yarn_m, yarn_s = lab.mean_std("rope+yarn", longest, "past")
    alibi_rises, alibi_past, alibi_within = lab.past_vs_within("alibi")
    ok = (
        far
        and lab.context_kept("rope", longest) < IGNORES_CONTEXT
        and yarn_m + 2 * math.hypot(yarn_s, rope_s) < rope_m
        and not any(alibi_rises)
    )
    return Result(
        ok,
        f"RoPE: within {within:.2f}, past {', '.join(f'{m:.2f}' for m in past)} nats/char, "
        f"above within beyond seed noise at {where} (unigram {lab.unigram:.2f}; "
        f"context kept at {longest}: "
        f"{lab.context_kept('rope', longest):.0%}); RoPE+YaRN at {longest}: "
        f"{yarn_m:.2f}; ALiBi within {alibi_within:.2f}, past {max(alibi_past):.2f} at most "
        f"({lab.conditions()})",
        {
            "rope_past": past,
            "rope_within": within,
            "yarn_longest": yarn_m,
            "alibi_past": alibi_past,
        },
    )


@claim(
    "rope.no_learnable_parameters",
    SCREEN,
    "RoPE adds no parameters: the same LM has as many parameters with RoPE as without "
    "positions (and so does xPos); T5 and FIRE biases add a few.",
)
def _rope_no_parameters() -> Result:
    n = measure.param_counts()
    extra = {k: v - n["nope"] for k, v in n.items() if k != "nope"}
    return Result(
        extra["rope"] == 0 and extra["xpos"] == 0 and extra["t5"] > 0 and extra["fire"] > 0,
        f"parameters beyond NoPE's {n['nope']:,}: RoPE {extra['rope']}, xPos {extra['xpos']}, "
        f"ALiBi {extra['alibi']}, T5 {extra['t5']}, FIRE {extra['fire']}",
        extra,
    )


RACE_MILES = 42  # the trained length: the jerseys printed, the table's rows
RACES = {"a 5-mile race": 5, "the 42-mile race trained on": 42, "a 50-mile race": 50}
"""Each race's last two runners are 3 miles apart: at miles (2, 5), (39, 42) and (47, 50)."""
WATCH_TURN = 2 * math.pi / 12  # one hour on the watch per mile


def _jersey(mile: int) -> str | None:
    """The runner's jersey: the learned table's row for this mile, or None where the table of
    :data:`RACE_MILES` rows refuses it (posemb's own lookup)."""
    table = absolute.LearnedEmbedding(RACE_MILES, 2)
    try:
        table(torch.zeros(1, 1, 2), torch.tensor([mile - 1]))
    except InputError:
        return None
    return f"#{mile}"


def _watch(mile: int) -> float:
    """The angle of the runner's watch hand: RoPE's rotation of one pair by mile x the turn."""
    hand = rope.rotation_matrix(mile, torch.tensor([WATCH_TURN], dtype=F64)) @ torch.tensor(
        [1.0, 0.0], dtype=F64
    )
    return diagrams.angle(hand)


def _race_svg(race: str, miles: tuple[int, int]) -> tuple[str, str, float]:
    body = [
        '<text x="10" y="24" font-weight="bold">jerseys: a number added to each runner</text>',
        '<text x="380" y="24" font-weight="bold">watches: each hand turned by the mile</text>',
    ]
    shirts = []
    for j, mile in enumerate(miles):
        x, shirt = 60 + 150 * j, _jersey(mile)
        shirts.append(shirt or f"mile {mile}: no shirt")
        colour = charts.INK[j]
        body.append(
            f'<rect x="{x - 45}" y="50" width="90" height="110" rx="18" fill="none" '
            f'stroke="{colour}" stroke-width="3" stroke-dasharray="{"" if shirt else "6 4"}"/>'
            f'<text x="{x}" y="112" text-anchor="middle" font-size="22">{shirt or "?"}</text>'
            f'<text x="{x}" y="185" text-anchor="middle">mile {mile}</text>'
        )
        cx = 440 + 150 * j
        body.append(diagrams.dial_face(cx, 105, 55, ticks=12))
        # A watch counts clockwise from 12: the same rotation, drawn as a watch shows it.
        body.append(diagrams.hand(cx, 105, 50, math.pi / 2 - _watch(mile), colour))
        body.append(f'<text x="{cx}" y="185" text-anchor="middle">mile {mile}</text>')
    apart = math.degrees((_watch(miles[1]) - _watch(miles[0])) % (2 * math.pi))
    hours = apart / 30
    body.append(
        f'<text x="380" y="215">hands {apart:.1f}° apart: {hours:.0f} hours on the watch</text>'
    )
    title = f"Jerseys against watches in {race}"
    return diagrams.svg(700, 230, title, "".join(body)), "; ".join(shirts), hours


@figure("fig-jersey-vs-watch")
def fig_jersey_vs_watch(summary: dict[str, Any]) -> Figure:
    """The source lesson's two pictures side by side: a number added to each runner (an
    absolute table) against a watch hand turned by the distance run (RoPE)."""

    def draw(race: str) -> tuple[object, str]:
        last = RACES[race]
        svg, shirts, hours = _race_svg(race, (last - 3, last))
        return svg, f"jerseys: {shirts}; watches: {hours:.0f} hours apart"

    return make_figure(
        "fig-jersey-vs-watch",
        SCREEN,
        "Race numbers on jerseys, or a watch on every runner",
        f"The last two runners of a race, 3 miles apart. A jersey is a number added to the "
        f"runner: a learned table of {RACE_MILES} rows prints {RACE_MILES} of them, and a runner "
        "past mile 42 gets none (posemb's table refuses the lookup). A watch turns its hand one "
        "hour per mile, as RoPE turns a pair by its position: two runners' hands are 3 hours "
        "apart in any race, because only the angle between them is read.",
        f"posemb.LearnedEmbedding({RACE_MILES}, 2)(x, positions); posemb.rotation_matrix(m, w)",
        "Two runners with jersey numbers on the left, their watches on the right; in the 50-mile "
        "race the jerseys are blank while the watches still show 3 hours between the hands.",
        kind="svg",
        draw=draw,
        controls=[Control("fig-jersey-race", "race", "toggle", tuple(RACES), 0)],
    )


TABLE_ROWS = 32


LOOKUPS = ("0", "31", "32", "47")


@figure("fig-learned-no-row")
def fig_learned_no_row(summary: dict[str, Any]) -> Figure:
    """A learned table has a row for each of its positions and none past them."""
    d = 8
    with torch.random.fork_rng():
        torch.manual_seed(0)
        table = absolute.LearnedEmbedding(TABLE_ROWS, d)
    looked: dict[int, torch.Tensor | str] = {}
    for p in range(int(LOOKUPS[-1]) + 1):
        try:
            looked[p] = table(torch.zeros(1, 1, d), torch.tensor([p]))[0, 0].detach()
        except InputError as err:  # the figure shows posemb's refusal itself
            looked[p] = str(err)

    def draw(position: str) -> tuple[object, str]:
        pick = int(position)
        rows = [
            {
                "position": p,
                "norm": charts.rounded(v.norm()) if isinstance(v, torch.Tensor) else 0.0,
                "row": "has a row" if isinstance(v, torch.Tensor) else "no row: ValueError",
                "chosen": p == pick,
            }
            for p, v in looked.items()
        ]
        base = alt.Chart(charts.rows_source()).encode(
            x=alt.X("position:O", title="position", axis=alt.Axis(values=list(range(0, 48, 8)))),
            tooltip=["position:O", alt.Tooltip("norm:Q", format=".4f"), "row:N"],
        )
        bars = base.mark_bar(aria=False).encode(
            y=alt.Y("norm:Q", title="||W_pos[p]||"),
            color=alt.Color(
                "row:N", title=None, scale=charts.colors(["has a row", "no row: ValueError"])
            ),
            opacity=alt.condition("datum.chosen", alt.value(1.0), alt.value(0.45)),
        )
        missing = (
            base.transform_filter("datum.row != 'has a row'")
            .mark_point(aria=False, shape="cross", size=60, filled=True)
            .encode(y=alt.datum(0), color=alt.value(charts.INK[1]))
        )
        chart = (bars + missing).properties(width=charts.WIDE - 140, height=200)
        v = looked[pick]
        text = (
            f"W_pos[{pick}] = {diagrams.vec(v[:4])[:-1]}, ...], norm {float(v.norm()):.4f}"
            if isinstance(v, torch.Tensor)
            else f"position {pick}: {v.split('.')[0]}"
        )
        return charts.spec(chart, rows), text

    return make_figure(
        "fig-learned-no-row",
        SCREEN,
        "A learned table ends where it ends",
        f"A learned table of {TABLE_ROWS} rows (GPT-2's initialisation, N(0, 0.02²)) looked up "
        "at positions 0-47: every position past the last row is refused, because there is no "
        "vector to add.",
        f"posemb.LearnedEmbedding({TABLE_ROWS}, 8)(x, positions)",
        "Bars of row norms for positions 0-31 and crosses for 32-47, where the table has no row.",
        kind="vega",
        draw=draw,
        controls=[Control("fig-learned-no-row-position", "position", "slider", LOOKUPS, 1)],
    )


@figure("fig-learned-gradients")
def fig_learned_gradients(summary: dict[str, Any]) -> Figure:
    """Gradient norm of each learned row after a step on 16-token windows."""
    window = 16
    norms = measure.learned_row_gradient_norms(window)

    def draw() -> tuple[object, str]:
        kinds = ["within the training window", "past it"]
        rows = [
            {"row": i, "grad": charts.rounded(v), "where": kinds[i >= window]}
            for i, v in enumerate(norms.tolist())
        ]
        x = alt.X(
            "row:O",
            title="row of W_pos",
            axis=alt.Axis(values=list(range(0, len(norms), 8)), labelAngle=0),
        )
        tip = ["row:O", alt.Tooltip("grad:Q", format=".3e"), "where:N"]
        bars = (
            alt.Chart()
            .transform_filter("datum.grad > 0")
            .mark_bar(aria=False, color=charts.INK[0])
            .encode(x=x, y=alt.Y("grad:Q", title="gradient norm"), tooltip=tip)
        )
        # A zero bar has no height: rows without gradient get a marker on the axis.
        zeros = (
            alt.Chart()
            .transform_filter("datum.grad == 0")
            .mark_point(aria=False, shape="diamond", filled=True, size=40, color=charts.INK[1])
            .encode(x=x, y="grad:Q", tooltip=tip)
        )
        top = charts.rounded(float(norms.max()))
        past = [i for i, v in enumerate(norms.tolist()) if i >= window and v == 0]
        notes = (
            alt.Chart(
                charts.inline_data(
                    [
                        {
                            "row": past[len(past) // 2] if past else window,
                            "y": charts.rounded(top * 0.12),
                            "label": f"rows {window}-{len(norms) - 1}: exactly 0"
                            if len(past) == len(norms) - window
                            else f"{len(past)} rows past the window: exactly 0",
                        }
                    ]
                )
            )
            .mark_text(aria=False, fontSize=13, color=charts.INK[1])
            .encode(x=alt.X("row:O"), y="y:Q", text="label:N")
        )
        chart = alt.layer(bars, zeros, notes, data=charts.rows_source()).properties(
            width=charts.WIDE - 100, height=220
        )
        late = float(norms[window:].max())
        return charts.spec(chart, rows), (
            f"smallest gradient norm of rows 0-{window - 1}: {float(norms[:window].min()):.3g}; "
            f"largest of rows {window}-{len(norms) - 1}: "
            + ("exactly 0" if late == 0 else f"{late:.3g}")
        )

    return make_figure(
        "fig-learned-gradients",
        SCREEN,
        "Rows past the training length never learn",
        f"One training step of the lab's LM with a 64-row learned table on {window}-token "
        "windows: every row a window covers gets a gradient, every row past it exactly zero. "
        "Those rows stay at their random initialisation.",
        f"posemb.lesson.claims.learned_row_gradient_norms({window})",
        "Bars of gradient norm for rows 0-15 and diamonds at zero, labelled exactly 0, for "
        "rows 16-63.",
        kind="vega",
        draw=draw,
    )


LOSS_PARTS = ("past the training length", "all positions")


SHOWN_VARIANTS = ("learned", "sinusoidal", "nope", "alibi", "rope", "rope+yarn")


def _encoding_colours(variants: Sequence[str]) -> tuple[alt.Scale, alt.Color]:
    """The lab figures' colour per encoding, the lab's plots' own (:mod:`posemb.lab.style`):
    the scale (for bands, without a legend) and the colour channel of the lines, which carries
    the legend."""
    scale = alt.Scale(domain=list(variants), range=[look(v).colour for v in variants])
    legend = alt.Legend(symbolType="stroke", symbolStrokeWidth=3, symbolOpacity=1)
    return scale, alt.Color("variant:N", title="encoding", scale=scale, legend=legend)


def _encoding_marks(variants: Sequence[str], legend: bool) -> dict[str, Any]:
    """The other two channels of a variant's look, so that colour never tells lines apart
    alone: its dash pattern (in the colour's legend, titled "encoding", or in none where the
    lines are named at their ends) and its points' shape."""
    shown = {"title": "encoding"} if legend else {"legend": None}
    domain = list(variants)
    dashes = [list(look(v).dash) or [1, 0] for v in variants]
    shapes = [look(v).shape for v in variants]
    return {
        "strokeDash": alt.StrokeDash(
            "variant:N", scale=alt.Scale(domain=domain, range=dashes), **shown
        ),
        # The legend's symbols are strokes (they show the dash); a shape would replace them.
        "shape": alt.Shape("variant:N", scale=alt.Scale(domain=domain, range=shapes), legend=None),
    }


def _length_axis(lens: Sequence[int]) -> alt.Axis:
    """The axis of the lab's lengths (doubling): labels flush with the plot's ends, and on a
    narrow screen every other one dropped from the second (an odd count keeps both ends)."""
    return alt.Axis(values=list(lens), labelFlush=True, labelOverlap="parity")


def _end_labels(rows: list[dict[str, object]], domain: list[float], height: int) -> list[dict]:
    """Each line's name at its last point, nudged apart to one 14 px text line each (two lines
    that end together would print their names over each other)."""
    last: dict[str, dict[str, object]] = {}
    for r in rows:
        last[str(r["variant"])] = r  # rows go by length within a variant
    gap = 14 * (domain[1] - domain[0]) / height
    ends = sorted(last.values(), key=lambda r: float(str(r["loss"])))
    placed: list[float] = []
    for r in ends:
        y = float(str(r["loss"]))
        placed.append(y if not placed else max(y, placed[-1] + gap))
    # Pushed up past the top, the highest come back down, the gap kept.
    for i in range(len(placed) - 1, -1, -1):
        placed[i] = min(placed[i], domain[1] - gap * (len(placed) - 1 - i))
    return [
        {"variant": r["variant"], "length": r["length"], "y": charts.rounded(y)}
        for r, y in zip(ends, placed, strict=True)
    ]


def _loss_at(lab: LabSummary, variant: str, n: int, part: str) -> tuple[float, float, int] | None:
    """(mean, std, seeds) of ``variant``'s loss at ``n``; at the training length nothing lies
    past it, so the curve of the loss past it starts from the loss within."""
    got = lab.loss(variant, n, "past" if part == "past" and n != lab.train_len else "all")
    if not got:
        return None
    return float(got["mean"]), float(got.get("std") or 0.0), int(got.get("n") or 1)


def _loss_rows(lab: LabSummary, variants: Sequence[str], part: str) -> list[dict[str, object]]:
    """One row per variant and length: the mean loss and its seed band."""
    rows: list[dict[str, object]] = []
    for v in variants:
        for n in lab.eval_lens:
            c = _loss_at(lab, v, n, part)
            if c is not None:
                m, s, k = c
                rows.append(
                    {
                        "variant": v,
                        "length": n,
                        "loss": charts.rounded(m),
                        "lo": charts.rounded(m - s),
                        "hi": charts.rounded(m + s),
                    }
                    | {"std": charts.rounded(s), "seeds": k}
                )
    return rows


def _loss_chart(
    lab: LabSummary, variants: Sequence[str], rows: list[dict[str, object]]
) -> alt.TopLevelMixin:
    """Loss lines with seed bands, the unigram line and the training length."""
    lens, unigram, train_len = lab.eval_lens, lab.unigram, lab.train_len
    lo = min([float(str(r["lo"])) for r in rows] + [unigram])
    hi = max([float(str(r["hi"])) for r in rows] + [unigram])
    domain = [math.floor(lo * 10 - 1) / 10, math.ceil(hi * 10 + 1) / 10]
    y_scale = alt.Scale(domain=domain)
    x = alt.X(
        "length:Q",
        title="evaluation length (tokens)",
        scale=alt.Scale(type="log", base=2),
        axis=_length_axis(lens),
    )
    colors, _ = _encoding_colours(variants)
    # No legend: each line is named at its end, where a reader's eye already is.
    line_colour = alt.Color("variant:N", scale=colors, legend=None)
    band = (
        alt.Chart(charts.rows_source())
        .mark_area(aria=False, opacity=0.15)
        .encode(
            x=x,
            y=alt.Y("lo:Q", scale=y_scale),
            y2="hi:Q",
            color=line_colour,
        )
    )
    line = (
        alt.Chart(charts.rows_source())
        .mark_line(
            aria=False, strokeWidth=2.5, point=alt.OverlayMarkDef(aria=False, size=50, filled=True)
        )
        .encode(
            x=x,
            y=alt.Y("loss:Q", title="loss (nats/char)", scale=y_scale),
            color=line_colour,
            **_encoding_marks(variants, legend=False),
            tooltip=[
                "variant:N",
                "length:Q",
                alt.Tooltip("loss:Q", format=".3f"),
                alt.Tooltip("std:Q", format=".3f"),
                "seeds:Q",
            ],
        )
    )
    # Short enough to fit a 320 px screen's plot (screen 3's terms say what it is).
    label = f"unigram entropy {unigram:.2f}"
    marks = alt.Chart(
        charts.inline_data([{"y": charts.rounded(unigram), "x": lens[-1], "label": label}])
    )
    rule = marks.mark_rule(aria=False, strokeDash=[4, 4], color=charts.INK[7]).encode(
        y="y:Q", tooltip=["label:N", "y:Q"]
    )
    rule_label = marks.mark_text(
        aria=False, align="right", baseline="bottom", dy=-3, color=charts.INK[7], fontSize=12
    ).encode(y="y:Q", x="x:Q", text="label:N")
    trained = alt.Chart(
        charts.inline_data([{"x": train_len, "label": f"trained at {train_len}"}])
    ).encode(x=alt.X("x:Q"))
    train_rule = trained.mark_rule(aria=False, color=charts.INK[6], strokeDash=[2, 2]).encode(
        tooltip=["label:N"]
    )
    train_label = trained.mark_text(
        aria=False, align="left", baseline="top", dx=4, y=4, fontSize=12
    ).encode(text="label:N")
    names = (
        alt.Chart(charts.inline_data(_end_labels(rows, domain, LOSS_HEIGHT)))
        .mark_text(aria=False, align="left", baseline="middle", dx=9, fontSize=12)
        .encode(x=x, y=alt.Y("y:Q", scale=y_scale), text="variant:N", color=line_colour)
    )
    return (band + train_rule + train_label + rule + rule_label + line + names).properties(
        width=charts.WIDE - 150, height=LOSS_HEIGHT
    )


LOSS_HEIGHT = 300


@figure("fig-lab-loss")
def fig_lab_loss(summary: dict[str, Any]) -> Figure:
    """The lab's loss against evaluation length, mean and seed spread, from its summary."""
    lab = LabSummary.of(summary)
    cfg, train_len = lab.data["config"], lab.train_len
    variants = [v for v in lab.variants if v in SHOWN_VARIANTS] or lab.variants

    def draw(which: str) -> tuple[object, str]:
        part = "past" if which == LOSS_PARTS[0] else "all"
        rows = _loss_rows(lab, variants, part)
        chart = _loss_chart(lab, variants, rows)
        longest = lab.eval_lens[-1]
        shown = "; ".join(
            f"{v} {c[0]:.3f} ± {c[1]:.3f}"
            for v in variants
            if (c := _loss_at(lab, v, longest, part)) is not None
        )
        return charts.spec(chart, rows), (
            f"loss {which} at {longest} tokens (trained at {train_len}): {shown}; unigram "
            f"{lab.unigram:.3f}"
        )

    return make_figure(
        "fig-lab-loss",
        SCREEN,
        "What the lab measured past the training length",
        f"The lab's {cfg['layers']}-layer character LM trained at {train_len} tokens and "
        f"evaluated longer, per encoding: mean loss over {len(cfg['seeds'])} seeds with the seed "
        "spread (one standard deviation) as a band. Past the training length sinusoidal and "
        "plain RoPE models lose most of what context gave them; ALiBi does not.",
        "posemb.lab.report.default_summary()",
        "Lines of loss against evaluation length (log scale) per encoding, with shaded seed "
        "spread and a dashed unigram line.",
        kind="vega",
        draw=draw,
        controls=[Control("fig-lab-loss-part", "loss over", "toggle", LOSS_PARTS, 0)],
    )


RETRIEVAL_VIEWS = ("window length", "distance from fact to query")


def _retrieval_points(
    r: Retrieval, variant: str, view: str, lens: list[int], bins: list[str]
) -> list[tuple[int | str, Accuracy]]:
    """(x, accuracy) of ``variant``: by window length, or by distance from fact to query."""
    if view == RETRIEVAL_VIEWS[0]:
        return [(n, r["variants"][variant][str(n)]["anywhere"]) for n in lens]
    return [(b, r["by_distance"][variant][b]) for b in bins if b in r["by_distance"][variant]]


def _retrieval_rows(
    r: Retrieval, variants: Sequence[str], view: str, lens: list[int], bins: list[str]
) -> list[dict[str, object]]:
    """One row per variant and x: the accuracy and a band of one standard error."""
    rows: list[dict[str, object]] = []
    for v in variants:
        for at, acc in _retrieval_points(r, v, view, lens, bins):
            m, se = float(acc["mean"]), float(acc.get("se") or 0.0)
            row: dict[str, object] = {"variant": v, "x": at}
            row |= {"accuracy": charts.rounded(m), "se": charts.rounded(se)}
            row |= {"lo": charts.rounded(max(0.0, m - se)), "hi": charts.rounded(min(1.0, m + se))}
            rows.append(row)
    return rows


def _retrieval_x(view: str, train_len: int, lens: list[int], bins: list[str]) -> alt.X:
    if view == RETRIEVAL_VIEWS[0]:
        return alt.X(
            "x:Q",
            title=f"window length (tokens; trained at {train_len})",
            scale=alt.Scale(type="log", base=2),
            axis=_length_axis(lens),
        )
    return alt.X(
        "x:O",
        title="distance from fact to query (tokens; pooled over lengths)",
        sort=bins,
        axis=alt.Axis(labelAngle=0),
    )


def _retrieval_chart(
    x: alt.X, variants: Sequence[str], view: str, chance: float
) -> alt.TopLevelMixin:
    """Accuracy lines with standard-error rules, and chance."""
    colors, line_colour = _encoding_colours(variants)
    y = alt.Y("accuracy:Q", title="retrieval accuracy", scale=alt.Scale(domain=[0, 1]))
    band = (
        alt.Chart(charts.rows_source())
        .mark_rule(aria=False, opacity=0.6, strokeWidth=1.5)
        .encode(x=x, y=alt.Y("lo:Q", scale=alt.Scale(domain=[0, 1])), y2="hi:Q")
        .encode(color=alt.Color("variant:N", scale=colors, legend=None))
    )
    line = (
        alt.Chart(charts.rows_source())
        .mark_line(
            aria=False, strokeWidth=2.5, point=alt.OverlayMarkDef(aria=False, size=50, filled=True)
        )
        .encode(
            x=x,
            y=y,
            color=line_colour,
            **_encoding_marks(variants, legend=True),
            tooltip=[
                "variant:N",
                alt.Tooltip("x:N", title=view),
                alt.Tooltip("accuracy:Q", format=".3f"),
                alt.Tooltip("se:Q", format=".3f", title="standard error"),
            ],
        )
    )
    marks = alt.Chart(charts.inline_data([{"y": chance, "label": f"chance {chance:.3f}"}]))
    rule = marks.mark_rule(aria=False, strokeDash=[4, 4], color=charts.INK[7]).encode(
        y="y:Q", tooltip=["label:N", "y:Q"]
    )
    rule_label = marks.mark_text(
        aria=False, align="left", baseline="bottom", dy=-3, x=4, color=charts.INK[7], fontSize=12
    ).encode(y="y:Q", text="label:N")
    # The x axis starts at the training length and its title names it: no rule there.
    layers = band + rule + rule_label + line
    return layers.resolve_legend(color="independent").properties(
        width=charts.WIDE - 130, height=300
    )


@figure("fig-lab-retrieval")
def fig_lab_retrieval(summary: dict[str, Any]) -> Figure:
    """The lab's retrieval accuracy past the training length, by window length or by the
    distance from the fact to the query, next to chance; from its summary."""
    lab = LabSummary.of(summary)
    r = lab.data.get("retrieval")
    if not r:
        raise InputError(
            "the lab summary has no retrieval results; run `posemb lab` with the retrieval task"
        )
    cfg, train_len, lens = lab.data["config"], lab.train_len, lab.eval_lens
    variants = [v for v in r["variants"] if v in SHOWN_VARIANTS] or list(r["variants"])
    chance = float(r["chance"])
    bins = list(next(iter(r["by_distance"].values())))

    def draw(view: str) -> tuple[object, str]:
        rows = _retrieval_rows(r, variants, view, lens, bins)
        chart = _retrieval_chart(_retrieval_x(view, train_len, lens, bins), variants, view, chance)
        if view == RETRIEVAL_VIEWS[0]:
            far = str(lens[-1])
            shown = "; ".join(
                f"{v} {r['variants'][v][far]['anywhere']['mean']:.2f}" for v in variants
            )
            where = f"at {far} tokens (trained at {train_len})"
        else:
            far = bins[-1]
            shown = "; ".join(
                f"{v} {r['by_distance'][v][far]['mean']:.2f}"
                for v in variants
                if far in r["by_distance"][v]
            )
            where = f"with the fact {far} tokens before the query"
        return charts.spec(chart, rows), f"retrieval accuracy {where}: {shown}; chance {chance:.3f}"

    return make_figure(
        "fig-lab-retrieval",
        SCREEN,
        "Loss is not retrieval: finding a fact far back",
        f"The lab's retrieval task: {r['facts']} facts (a key and its value in one token) "
        "scattered in filler, then a query for one key; a small model per encoding trained at "
        f"{train_len} tokens answers at longer windows. Every encoding answers at 1x. Past it "
        "the two measures part: ALiBi, whose loss above stays flat, loses far facts too, if more "
        "slowly than plain RoPE, and RoPE with YaRN's scaling finds them at every distance. "
        f"Points: mean over {len(cfg['seeds'])} seeds; bars: one binomial standard error of "
        "the pooled probes (the spread between seeds is not drawn).",
        "posemb.lab.report.default_summary()['retrieval']",
        "Lines of retrieval accuracy per encoding against window length (log scale) or "
        "against the distance from the fact to the query, with a dashed chance line: every "
        "line starts near 1; ALiBi and plain RoPE fall towards chance as the fact moves away, "
        "RoPE with YaRN stays near 1.",
        kind="vega",
        draw=draw,
        controls=[Control("fig-lab-retrieval-by", "accuracy by", "toggle", RETRIEVAL_VIEWS, 0)],
    )


@exercise(
    SCREEN,
    f"A learned table has {TABLE_ROWS} rows, positions 0-{TABLE_ROWS - 1}. What does position "
    f"{TABLE_ROWS} get?",
    call=f"posemb.LearnedEmbedding({TABLE_ROWS}, 8)(x, torch.tensor([{TABLE_ROWS}]))",
    figure="fig-learned-no-row",
    state=str(TABLE_ROWS),
)
def _past_the_last_row() -> str:
    table = absolute.LearnedEmbedding(TABLE_ROWS, 8)
    try:
        table(torch.zeros(1, 1, 8), torch.tensor([TABLE_ROWS]))
    except InputError as err:
        return f"Nothing: there is no row to add, and posemb refuses the lookup: {err}"
    return "A row: this table did not refuse the position."
