"""Screen 2, adding a position tensor: the sinusoidal shift as a matrix, near-orthogonal random
vectors, the four terms of an additive logit, and constant norms.

Its text, its claims with their checks, and its figures: editing this screen is this file
(and its test, ``tests/lesson/test_s02_absolute.py``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ... import absolute
from ...absolute import sinusoidal_table
from ...freqs import inv_freq
from .. import charts, measure
from ..charts import alt
from ..measure import EXACT, F64
from ..registry import Control, Figure, Result, claim, exercise, figure, make_figure, screen

SCREEN = screen(
    __name__,
    title="Adding a learned or sinusoidal position tensor",
    question=(
        "How does adding a learned or sinusoidal position vector to each token break the symmetry?"
    ),
    goal=(
        "Add positions to token embeddings, X_in = X_tok + W_pos, and see what it does to "
        "the attention logits."
    ),
    intuition=(
        "Give every position its own vector and add it to the token at that position. Two "
        "equal tokens at different places now differ, so attention can tell them apart.",
        "Vaswani et al. (2017) made the position vectors from sines and cosines of "
        "geometrically spaced frequencies; GPT-2 learns a table instead. Either way the "
        "query-key product splits into four parts: token-token, token-position, "
        "position-token and position-position.",
        "The sum does not wash the word out because, in hundreds of dimensions, unrelated "
        "vectors are nearly orthogonal: the cosine of two random directions shrinks like "
        "one over the square root of the dimension.",
    ),
    maths=(
        r"PE_{(p,2i)} = \sin\!\big(p / 10000^{2i/d}\big),\quad "
        r"PE_{(p,2i+1)} = \cos\!\big(p / 10000^{2i/d}\big)",
        r"(X+P)W_Q W_K^\top (X+P)^\top = XW_QW_K^\top X^\top + XW_QW_K^\top P^\top"
        r" + PW_QW_K^\top X^\top + PW_QW_K^\top P^\top",
    ),
    trap=(
        "Fearing that addition destroys the word's meaning. In high dimension the two "
        "signals mostly live in different directions; the model can still read both."
    ),
)
"""This screen's text; its number comes from the module's name."""


@claim(
    "absolute.sinusoidal_shift_is_linear",
    SCREEN,
    "PE(p+k) = M_k PE(p) with M_k built from k alone (independent of p).",
)
def _sinusoidal_shift_is_linear() -> Result:
    d = 768
    p = torch.arange(0, 4096, 7)
    table = sinusoidal_table(p, d, dtype=F64)
    theta = inv_freq(d, dtype=F64)
    worst = 0.0
    for k in (1, 7, 100, 1000):
        c, s = torch.cos(k * theta), torch.sin(k * theta)
        sin_p, cos_p = table[:, 0::2], table[:, 1::2]
        # M_k acts on each (sin, cos) pair with [[c, s], [-s, c]]; it is built from k alone.
        shifted = torch.stack((sin_p * c + cos_p * s, cos_p * c - sin_p * s), -1).flatten(-2)
        worst = max(worst, float((shifted - sinusoidal_table(p + k, d, dtype=F64)).abs().max()))
    return Result(
        worst < 1e-9,
        f"max |M_k PE(p) - PE(p+k)| = {worst:.1e} (d=768, 586 positions, k in 1,7,100,1000)",
        worst,
    )


def random_cosines(dim: int, n: int, seed: int = 4) -> torch.Tensor:
    """Cosine similarities ``(n,)`` of ``n`` pairs of standard normal vectors in R^dim
    (float64, seeded)."""
    g = measure.gen(seed)
    u = torch.randn(n, dim, generator=g, dtype=F64)
    v = torch.randn(n, dim, generator=g, dtype=F64)
    return torch.nn.functional.cosine_similarity(u, v, dim=-1)


@claim(
    "absolute.random_vectors_near_orthogonal",
    SCREEN,
    "Random vectors in R^768 have cosine similarity with std about 1/sqrt(768).",
)
def _random_cosine() -> Result:
    # 5000 pairs estimate the std to ~1% (its standard error is about std / sqrt(2n)).
    d = 768
    cos = random_cosines(d, 5000)
    std, expect = float(cos.std()), 1 / math.sqrt(d)
    return Result(
        abs(std / expect - 1) < 0.05,
        f"std of cosine of random pairs = {std:.4f}; 1/sqrt(768) = {expect:.4f}",
        std,
    )


FOUR_TERMS = ("token-token", "token-pos", "pos-token", "pos-pos")


def four_terms() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """QK^T ``(10, 10)`` of random tokens X plus random positions P (d = 32, d_k = 8, seed 5),
    and its four terms X A X^T, X A P^T, P A X^T, P A P^T with A = W_Q W_K^T, by
    :data:`FOUR_TERMS` name."""
    g = measure.gen(5)
    t, d, dk = 10, 32, 8
    x, p = torch.randn(t, d, generator=g, dtype=F64), torch.randn(t, d, generator=g, dtype=F64)
    wq, wk = torch.randn(d, dk, generator=g, dtype=F64), torch.randn(d, dk, generator=g, dtype=F64)
    lhs = ((x + p) @ wq) @ ((x + p) @ wk).T
    a = wq @ wk.T
    terms = (x @ a @ x.T, x @ a @ p.T, p @ a @ x.T, p @ a @ p.T)
    return lhs, dict(zip(FOUR_TERMS, terms, strict=True))


@claim(
    "absolute.four_term_decomposition",
    SCREEN,
    "With additive positions, QK^T splits into token-token, token-pos, pos-token, pos-pos terms.",
)
def _four_terms() -> Result:
    lhs, terms = four_terms()
    rhs = sum(terms.values(), torch.zeros_like(lhs))
    err = float((lhs - rhs).abs().max() / lhs.abs().max())
    return Result(err < EXACT, f"relative |QK^T - sum of 4 terms| = {err:.1e}", err)


@figure("fig-sinusoidal-table")
def fig_sinusoidal_table(summary: dict[str, Any]) -> Figure:
    """The sinusoidal table as a heatmap: positions by channels."""
    n, d = 64, 32
    table = absolute.sinusoidal_table(n, d, dtype=F64)

    def draw() -> tuple[object, str]:
        rows: list[dict[str, object]] = [
            {"channel": c, "position": p, "PE": charts.rounded(table[p, c], 3)}
            for p in range(n)
            for c in range(d)
        ]
        chart = charts.heat(
            rows,
            "channel",
            "position",
            "PE",
            titles=("channel", "position", "PE"),
            size=(320, 384),
            tick_every=8,
        )
        return charts.spec(chart, rows), f"PE[1, 0] = sin(1) = {float(table[1, 0]):.6f}"

    return make_figure(
        "fig-sinusoidal-table",
        SCREEN,
        "The sinusoidal table",
        "Each row is the vector added at one position (d = 32). Even channels hold sines, odd "
        "ones cosines; the left pairs turn fast, the right ones so slowly that 64 positions "
        "barely move them.",
        "posemb.sinusoidal_table(64, 32)",
        "Heatmap of the 64 x 32 sinusoidal table: fast stripes on the left, near-constant "
        "columns on the right.",
        kind="vega",
        draw=draw,
    )


BASES = {"100": 100.0, "1,000": 1000.0, "10,000": 10000.0, "100,000": 100000.0}


@figure("fig-offset-cosine")
def fig_offset_cosine(summary: dict[str, Any]) -> Figure:
    """cos(PE(p), PE(p + k)) against the offset k."""
    p0, d, ks = 100, 768, torch.arange(0, 257)

    def draw(base: str) -> tuple[object, str]:
        table = absolute.sinusoidal_table(p0 + ks, d, base=BASES[base], dtype=F64)
        cos = torch.nn.functional.cosine_similarity(table[:1], table, dim=-1)
        rows = [
            {"k": int(k), "cos": charts.rounded(c)}
            for k, c in zip(ks.tolist(), cos.tolist(), strict=True)
        ]
        chart = (
            alt.Chart(charts.rows_source())
            .mark_line(aria=False)
            .encode(
                x=alt.X("k:Q", title="offset k"),
                y=alt.Y("cos:Q", title="cos(PE(p), PE(p+k))", scale=alt.Scale(domain=[-0.2, 1])),
                tooltip=["k:Q", alt.Tooltip("cos:Q", format=".4f")],
            )
            .properties(width=charts.WIDE - 140, height=220)
        )
        low = int(cos.argmin())
        return charts.spec(chart, rows), (
            f"cos at k = 1: {float(cos[1]):.6f}; lowest for k <= 256: {float(cos[low]):.4f} "
            f"at k = {low}"
        )

    return make_figure(
        "fig-offset-cosine",
        SCREEN,
        "How alike are nearby positions?",
        "Cosine similarity of the sinusoidal vectors of position p = 100 and p + k (d = 768). It "
        "depends on k alone (each pair contributes cos(k theta_i)); a smaller base makes it fall "
        "faster.",
        "posemb.sinusoidal_table(100 + k, 768, base)",
        "Line of cosine similarity against offset, falling from 1 and levelling off.",
        kind="vega",
        draw=draw,
        controls=[Control("fig-offset-cosine-base", "base", "slider", tuple(BASES), 2)],
    )


DIMS = ("2", "8", "32", "128", "512", "2048", "4096")


COSINE_BIN = 0.25  # bin width in units of 1/sqrt(d): the bars keep their shape as d grows


COSINE_TOP = 0.2  # one y scale for every d (the tallest bar, at d = 2, is 0.19)


COSINE_SPAN = 4.5  # bins cover +-4.5/sqrt(d) (clipped to [-1, 1]): every cosine of 500 pairs


def _cosine_rows(cos: torch.Tensor, sigma: float) -> tuple[list[dict[str, object]], float]:
    """The histogram of ``cos`` ``(n,)`` as bars a :data:`COSINE_BIN` of ``sigma`` wide, and
    the normal curve N(0, sigma^2) as the fraction of pairs expected per bar; and the width."""
    n = len(cos)
    width = COSINE_BIN * sigma
    half = math.ceil(min(1.0, COSINE_SPAN * sigma) / width)
    edges = [max(-1.0, min(1.0, (i - half) * width)) for i in range(2 * half + 1)]
    counts = torch.histc(cos, bins=2 * half, min=-half * width, max=half * width)
    rows = [
        {
            "lo": charts.rounded(lo, 3),
            "hi": charts.rounded(hi, 3),
            "f": charts.rounded(c / n, 3),
            "n": int(c),
            "kind": "bar",
        }
        for lo, hi, c in zip(edges[:-1], edges[1:], counts.tolist(), strict=True)
    ]
    # The normal density N(0, 1/d), as the fraction of pairs expected in one bin.
    xs = [-1 + 2 * i / 400 for i in range(401)]
    rows += [
        {
            "x": charts.rounded(x, 3),
            "f": charts.rounded(
                width * math.exp(-0.5 * (x / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi)), 3
            ),
            "kind": "curve",
        }
        for x in xs
        if abs(x) <= min(1.0, COSINE_SPAN * sigma)
    ]
    return rows, width


def _cosine_chart(rows: list[dict[str, object]], sigma: float, n: int) -> alt.LayerChart:
    """Bars, the normal curve, and dashed rules at ±sigma, labelled."""
    x_scale = alt.Scale(domain=[-1, 1])
    base = alt.Chart(charts.rows_source())
    bars = (
        base.transform_filter("datum.kind == 'bar'")
        .mark_bar(aria=False, color=charts.INK[0], opacity=0.85, stroke="white", strokeWidth=0.3)
        .encode(
            x=alt.X(
                "lo:Q",
                title="cosine of two random vectors",
                scale=x_scale,
                axis=alt.Axis(values=[i / 4 for i in range(-4, 5)], format=".2~f"),
            ),
            x2="hi:Q",
            y=alt.Y(
                "f:Q",
                title=f"fraction of {n} pairs per bin",
                scale=alt.Scale(domain=[0, max(COSINE_TOP, max(float(str(r["f"])) for r in rows))]),
            ),
            y2=alt.datum(0),
            tooltip=[
                alt.Tooltip("lo:Q", title="from"),
                alt.Tooltip("hi:Q", title="to"),
                alt.Tooltip("n:Q", title="pairs"),
            ],
        )
    )
    curve = (
        base.transform_filter("datum.kind == 'curve'")
        .mark_line(aria=False, color=charts.INK[1], strokeWidth=2)
        .encode(x="x:Q", y="f:Q")
    )
    sd = alt.Chart(
        charts.inline_data(
            [
                {"x": charts.rounded(-sigma), "label": "", "tip": "-1/√d"},
                {"x": charts.rounded(sigma), "label": f"±1/√d = ±{sigma:.3g}", "tip": "+1/√d"},
            ]
        )
    ).encode(x="x:Q")
    rules = sd.mark_rule(aria=False, strokeDash=[4, 3], color=charts.INK[6]).encode(
        tooltip=["tip:N", "x:Q"]
    )
    labels = sd.mark_text(aria=False, align="left", dx=3, baseline="top", y=2, fontSize=12).encode(
        text="label:N"
    )
    return bars + curve + rules + labels


@figure("fig-random-cosines")
def fig_random_cosines(summary: dict[str, Any]) -> Figure:
    """Histogram of cosines of random vector pairs, by dimension, beside N(0, 1/d)."""
    n = 500

    def draw(dim: str) -> tuple[object, str]:
        d = int(dim)
        sigma = 1 / math.sqrt(d)
        cos = random_cosines(d, n)
        rows, width = _cosine_rows(cos, sigma)
        chart = _cosine_chart(rows, sigma, n)
        chart = chart.properties(width=charts.WIDE - 80, height=240)
        std = float(cos.std())
        readout = (
            f"d = {d}: std of the cosines {std:.4f}; 1/sqrt(d) = {sigma:.4f} (ratio "
            f"{std / sigma:.3f}); bins {width:.3g} wide"
        )
        if d == 2:
            # The normal curve is the large-d limit; say why the smallest d does not follow it.
            readout += (
                ". In 2 dimensions the cosine is cos(angle) of a uniform angle, so it piles up "
                "near -1 and 1 (an arcsine shape, not a bell): N(0, 1/d) is only the limit as d "
                "grows"
            )
        return charts.spec(chart, rows), readout

    return make_figure(
        "fig-random-cosines",
        SCREEN,
        "Random directions are nearly orthogonal in high dimensions",
        "Cosines of 500 pairs of random Gaussian vectors, as the fraction of pairs in each bin "
        "(bins a quarter of 1/sqrt(d) wide, so every d has the same number of bars), with the "
        "normal curve N(0, 1/d) in orange and dashed lines at ±1/sqrt(d). In 2 dimensions they "
        "spread over [-1, 1]; as d grows they crowd around 0 with standard deviation about "
        "1/sqrt(d), which is why a position vector and a token vector barely interfere.",
        "posemb.lesson.claims.random_cosines(d, 500)",
        "Histogram of cosines that narrows around zero as the dimension slider grows, following "
        "a normal curve of standard deviation 1/sqrt(d).",
        kind="vega",
        draw=draw,
        controls=[
            Control("fig-random-cosines-dim", "dimension d", "slider", DIMS, DIMS.index("512"))
        ],
    )


@figure("fig-four-terms")
def fig_four_terms(summary: dict[str, Any]) -> Figure:
    """QK^T with additive positions as the sum of four terms, each toggled on or off."""
    lhs, terms = four_terms()
    vmax = max(float(lhs.abs().max()), *(float(t.abs().max()) for t in terms.values()))

    def draw(*switches: str) -> tuple[object, str]:
        on = [n for n, s in zip(FOUR_TERMS, switches, strict=True) if s == "on"]
        total = sum((terms[n] for n in on), torch.zeros_like(lhs))
        rows: list[dict[str, object]] = [
            {"key": j, "query": i, "logit": charts.rounded(total[i, j])}
            for i in range(lhs.shape[0])
            for j in range(lhs.shape[1])
        ]
        chart = charts.heat(
            rows,
            "key",
            "query",
            "logit",
            titles=("key position", "query position", "sum of chosen terms"),
            size=(260, 260),
            domain=(-vmax, vmax),
        )
        err = float((lhs - total).abs().max())
        shown = " + ".join(on) if on else "no term"
        return charts.spec(chart, rows), f"{shown}: max |QK^T - sum| = {charts.zero_error(err)}"

    controls = [
        Control(f"fig-four-terms-{name}", name, "toggle", ("off", "on"), 1) for name in FOUR_TERMS
    ]
    return make_figure(
        "fig-four-terms",
        SCREEN,
        "Four terms in every logit",
        "With X + P as input, QK^T = X A X^T + X A P^T + P A X^T + P A P^T (A = W_Q W_K^T): "
        "token-token, token-position, position-token and position-position. Switch terms off "
        "to see what each contributes; all four give QK^T exactly.",
        "posemb.lesson.claims.four_terms()",
        "Heatmap of the 10 x 10 logits built from the chosen terms.",
        kind="vega",
        draw=draw,
        controls=controls,
    )


@figure("fig-norms")
def fig_norms(summary: dict[str, Any]) -> Figure:
    """||PE(p)|| against the norms of token rows and of learned position rows."""
    n, d = 256, 768
    pe = absolute.sinusoidal_table(n, d, dtype=F64).norm(dim=-1)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        tokens = torch.nn.Embedding(n, d).weight.detach().norm(dim=-1)
        learned = absolute.LearnedEmbedding(n, d).weight.detach().norm(dim=-1)
    series = {
        "sinusoidal ||PE(p)||": pe,
        "token rows, N(0, 1) (torch.nn.Embedding)": tokens,
        "learned position rows, N(0, 0.02²)": learned,
    }

    def draw() -> tuple[object, str]:
        rows = [
            {"row": i, "norm": charts.rounded(v), "series": name}
            for name, t in series.items()
            for i, v in enumerate(t.tolist())
        ]
        chart = (
            alt.Chart(charts.rows_source())
            .mark_line(aria=False)
            .encode(
                x=alt.X("row:Q", title="position / row"),
                y=alt.Y(
                    "norm:Q",
                    title="vector norm",
                    scale=alt.Scale(type="log"),
                    axis=alt.Axis(values=[0.1, 0.3, 1, 3, 10, 30, 100]),
                ),
                color=alt.Color(
                    "series:N",
                    title=None,
                    scale=charts.colors(list(series)),
                    legend=alt.Legend(orient="bottom", direction="vertical"),
                ),
                strokeDash=charts.dashes(
                    "series:N",
                    list(series),
                    title=None,
                    legend=alt.Legend(orient="bottom", direction="vertical"),
                ),
                tooltip=["series:N", "row:Q", alt.Tooltip("norm:Q", format=".4f")],
            )
            .properties(width=charts.WIDE - 140, height=240)
        )
        return charts.spec(chart, rows), (
            f"||PE(p)|| = {charts.sig(pe.min())} at every p "
            f"(sqrt(d/2) = {charts.sig(math.sqrt(d / 2))}, "
            f"spread {charts.zero_error(float(pe.max() - pe.min()))}); token rows mean "
            f"{charts.sig(tokens.mean(), 3)}; learned rows mean {charts.sig(learned.mean(), 3)}"
        )

    return make_figure(
        "fig-norms",
        SCREEN,
        "How long is a position vector?",
        "Every sinusoidal position vector has the same norm, sqrt(d/2) = 19.6 at d = 768 (one "
        "unit per sin/cos pair): as long as a token row drawn from N(0, 1) and 35 times a "
        "GPT-2-style learned row at initialisation.",
        "posemb.sinusoidal_table(256, 768).norm(dim=-1); posemb.LearnedEmbedding(256, 768)",
        "Three flat bands of norms on a log scale: token rows near 28, sinusoidal exactly 19.6, "
        "learned rows near 0.55.",
        kind="vega",
        draw=draw,
    )


@exercise(
    SCREEN,
    "Two random directions in 512 dimensions: is their cosine typically near 0.5, or near 0.04?",
    call="posemb.lesson.screens.s02_absolute.random_cosines(512, 500).std()",
    figure="fig-random-cosines",
    state="512",
)
def _random_cosine_size() -> str:
    std = float(random_cosines(512, 500).std())
    return (
        f"Near 0.04: over 500 random pairs the cosine's standard deviation is {std:.4f}, about "
        f"1/sqrt(512) = {1 / math.sqrt(512):.4f}. A position vector added to a token vector is "
        "nearly orthogonal to it, so the two barely interfere."
    )
