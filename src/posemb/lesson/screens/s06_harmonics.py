"""Screen 6, Vaswani's sinusoids as harmonics: wavelengths, the constant norm, and float64 angles.
Its text, its claims with their checks, and its figures: editing this screen is this file (and its
test, ``tests/lesson/test_s06_harmonics.py``)."""

from __future__ import annotations

import math
from typing import Any
from xml.sax.saxutils import escape

import torch

from ... import absolute, freqs
from ...absolute import sinusoidal_table
from ...freqs import cos_sin, inv_freq, wavelengths
from .. import charts, diagrams, measure
from ..charts import alt
from ..measure import F64
from ..registry import Control, Figure, Result, claim, exercise, figure, make_figure, screen

SCREEN = screen(
    __name__,
    title="Vaswani sinusoids as harmonics",
    question="How do the sinusoids encode positions as harmonics, and where do they stop?",
    goal=(
        "Compute the frequencies and wavelengths of the sinusoidal table (d = 768) and read "
        "what they say about short and long distances."
    ),
    intuition=(
        "The channels form a bank of oscillators from fast to slow. The fastest pair turns "
        "once every 2 pi = 6.28 positions and separates neighbours; the slowest barely moves "
        "within a document and says roughly where in a long text a token is.",
        "Every position gets a vector of the same length, and a fixed shift k acts on the "
        "table as a rotation of each pair, which is why the encoding offers a way to read "
        "relative offsets. Whether a model trained on short texts uses the unseen phase "
        "combinations of long ones is an empirical question, answered below.",
    ),
    maths=(
        r"\omega_i = 10000^{-2i/d},\quad \lambda_i = 2\pi/\omega_i",
        r"\lVert PE(p)\rVert = \sqrt{d/2}\ \text{ for every } p",
    ),
    trap=(
        "Reading 'defined for every position' as 'works at every position'. The formula "
        "never runs out, but the model's weights were fitted to the positions it saw."
    ),
)
"""This screen's text; its number comes from the module's name."""


@claim(
    "sinusoidal.wavelengths_768",
    SCREEN,
    "At d=768 the wavelengths of channels 0, 32, 128, 383 are 6.28, 13.54, 135.37, "
    "61,342.74 tokens.",
)
def _wavelengths_768() -> Result:
    lam = wavelengths(768)
    quoted = {0: 6.28, 32: 13.54, 128: 135.37, 383: 61342.74}
    got = {i: float(lam[i]) for i in quoted}
    # The lesson rounds to 2 decimals: half a unit in the last place.
    ok = all(abs(got[i] - v) <= 0.005 for i, v in quoted.items())
    shown = ", ".join(f"lambda_{i} = {got[i]:,.2f}" for i in quoted)
    return Result(ok, shown, {str(i): v for i, v in got.items()})


@claim(
    "sinusoidal.constant_norm",
    SCREEN,
    "Every position's sinusoidal vector has the same length, sqrt(d/2) (19.60 at d=768): "
    "sin^2 + cos^2 = 1 in each of the d/2 pairs, so no position has a larger magnitude.",
    verdict="wrong",
    lesson_says="attention projection weights never observed the high-magnitude phase "
    "alignments of unseen positions",
)
def _sinusoidal_norm() -> Result:
    d = 768
    pos = torch.cat(
        (torch.arange(0, 4096), torch.randint(0, 1 << 30, (4096,), generator=measure.gen(11)))
    )
    norms = sinusoidal_table(pos, d, dtype=F64).norm(dim=-1)
    want = math.sqrt(d / 2)
    err = float((norms - want).abs().max())
    return Result(
        err < 1e-9,
        f"||PE(p)|| over 8,192 positions up to 2^30: {float(norms.min()):.6f} to "
        f"{float(norms.max()):.6f}; sqrt(384) = {want:.6f}",
        err,
    )


@claim(
    "precision.float64_angles",
    SCREEN,
    "The sinusoids are defined at every position, but only exact angles deliver them: "
    "posemb's cos at position 2^20 is within 1e-6 of exact; a float32 product is not.",
    verdict="n/a",
)
def _float32_angles() -> Result:
    pos = torch.tensor([1 << 20])
    exact = torch.cos(pos.to(F64)[:, None] * inv_freq(128, dtype=F64))
    naive = torch.cos(pos.float()[:, None] * inv_freq(128, dtype=torch.float32))
    ours, _ = cos_sin(pos, inv_freq(128, dtype=F64), dtype=torch.float32)
    naive_err = float((naive.double() - exact).abs().max())
    ours_err = float((ours.double() - exact).abs().max())
    return Result(
        ours_err <= 1e-6 and naive_err > 1e-3,
        f"cos error at position 2^20, d=128: float32 product {naive_err:.1e}, "
        f"posemb {ours_err:.1e}",
        {"float32_product": naive_err, "posemb": ours_err},
    )


SHIFT_D = 16  # a small table: its pairs turn at visibly different speeds
SHIFT_P = 3  # the position p the shift starts from
SHIFT_PAIRS = ("0", "2", "5")
SHIFT_KS = ("1", "2", "3", "5")
SHIFT_VIEWS = ("shift the position vector", "rotate q and k instead")


def _pair_angle(table: torch.Tensor, row: int, pair: int) -> float:
    """The angle of one (sin, cos) pair of a sinusoidal table row, read from its values:
    the point (cos wp, sin wp) on the unit circle."""
    return math.atan2(float(table[row, 2 * pair]), float(table[row, 2 * pair + 1]))


def _shift_svg(pair: int, k: int, omega: float, angles: tuple[float, float], view: str) -> str:
    cx, cy, r = 150, 150, 110
    a0, a1 = angles
    turn = a1 if a1 >= a0 else a1 + 2 * math.pi
    arc = diagrams.arc(cx, cy, 45, a0, turn, charts.INK[2])
    if view == SHIFT_VIEWS[0]:
        hands = [
            diagrams.hand(cx, cy, r, a0, charts.INK[0]),
            diagrams.hand(cx, cy, r, a1, charts.INK[1]),
        ]
        lines = [
            (charts.INK[0], f"PE(p) at p = {SHIFT_P}: angle p·ω"),
            (charts.INK[1], f"PE(p + k) at p + k = {SHIFT_P + k}"),
            (charts.INK[2], f"the shift: a turn by k·ω = {k * omega:.4f} rad"),
            ("currentColor", "the same turn at every p: PE(p + k) = R(kω) PE(p)"),
        ]
    else:
        hands = [
            diagrams.hand(cx, cy, r, a1, charts.INK[0]),
            diagrams.hand(cx, cy, r * 0.75, a0, charts.INK[1]),
        ]
        lines = [
            (charts.INK[0], f"q turned to m = {SHIFT_P + k}: R_m q"),
            (charts.INK[1], f"k turned to n = {SHIFT_P}: R_n k"),
            (charts.INK[2], f"between them: (m - n)·ω = {k * omega:.4f} rad"),
            ("currentColor", "RoPE: the same rotation, on q and k (screen 4's dials)"),
        ]
    text = "".join(
        f'<text x="290" y="{60 + 26 * j}" fill="{c}">{escape(t)}</text>'
        for j, (c, t) in enumerate(lines)
    )
    title = f"Pair {pair}, shift k = {k}: {view}"
    head = f'<text x="290" y="30" font-weight="bold">pair {pair}: ω = {omega:.4g} rad/step</text>'
    body = diagrams.dial_face(cx, cy, r) + arc + "".join(hands) + head + text
    return diagrams.svg(700, 300, title, body)


@figure("fig-shift-is-rotation")
def fig_shift_is_rotation(summary: dict[str, Any]) -> Figure:
    """The bridge from sinusoids to RoPE: shifting a position by k turns each (sin, cos) pair
    by k·ω; RoPE does that turn to q and k instead of adding it to x."""
    omega = freqs.inv_freq(SHIFT_D, dtype=F64)
    table = absolute.sinusoidal_table(SHIFT_P + int(SHIFT_KS[-1]) + 1, SHIFT_D, dtype=F64)

    def draw(pair_s: str, k_s: str, view: str) -> tuple[object, str]:
        pair, k = int(pair_s), int(k_s)
        w = float(omega[pair])
        a0, a1 = _pair_angle(table, SHIFT_P, pair), _pair_angle(table, SHIFT_P + k, pair)
        moved = (a1 - a0) % (2 * math.pi)
        err = abs(moved - (k * w) % (2 * math.pi))
        readout = (
            f"pair {pair}: from p = {SHIFT_P} to p + k = {SHIFT_P + k} the point turned "
            f"{moved:.4f} rad; k·ω = {k * w:.4f} rad (difference {err:.1e})"
        )
        return _shift_svg(pair, k, w, (a0, a1), view), readout

    return make_figure(
        "fig-shift-is-rotation",
        SCREEN,
        "A shift of position is a rotation of each pair",
        f"One (sin, cos) pair of the d = {SHIFT_D} sinusoidal table as a point on a circle, at "
        f"p = {SHIFT_P} and at p + k. Moving k positions along turns the point by k·ω, whatever "
        "p is: that is the linear map M_k of screen 2, pair by pair. Fast pairs turn far, slow "
        "ones hardly at all. The second view is RoPE's step: instead of adding the point to x, "
        "turn q by its position and k by its own, and the angle between them is the same "
        "(m - n)·ω, as on screen 4's dials.",
        f"posemb.sinusoidal_table(positions, {SHIFT_D}); posemb.inv_freq({SHIFT_D})",
        "A dial with two hands, the pair at p and at p + k, and the arc of k·omega between them; "
        "in the second view the hands are q and k rotated by RoPE.",
        kind="svg",
        draw=draw,
        controls=[
            Control("fig-shift-pair", "pair", "toggle", SHIFT_PAIRS, 0),
            Control("fig-shift-k", "shift k", "slider", SHIFT_KS, 1),
            Control("fig-shift-view", "view", "toggle", SHIFT_VIEWS, 0),
        ],
    )


WAVE_PARTS = ("sin", "cos")


WAVE_LEGEND = {
    "orient": "top",
    "direction": "horizontal",
    "labelExpr": "datum.label == 'sin' ? 'sin (channel 2i)' : 'cos (channel 2i+1)'",
}


WAVE_PAIRS = ("0", "32", "128", "383")  # the lesson's channels on its harmonics screen


WAVE_RANGES = {"0-128": 128, "0-1,024": 1024, "0-65,536": 65536}


WAVE_SAMPLES = 256  # points per panel at most: a wider range samples every k-th position


WAVE_MIN_SAMPLES = 6  # per turn: a pair that turns faster is drawn as a band, not aliased


def _wave_rows(
    d: int, pairs: list[int], n: int, step: int
) -> tuple[list[dict[str, object]], list[int]]:
    """sin and cos of each pair of the width-``d`` table at positions 0..n by ``step``, or a
    band for a pair too fast to draw at that step; and the pairs drawn as bands."""
    lam = freqs.wavelengths(d)
    pos = torch.arange(0, n + 1, step)
    table = absolute.sinusoidal_table(pos, d, dtype=F64)
    rows: list[dict[str, object]] = []
    fast = []
    for i in pairs:
        if float(lam[i]) / step < WAVE_MIN_SAMPLES:
            fast.append(i)
            turns = n / float(lam[i])
            rows += [
                {"pair": i, "p": x, "lo": -1, "hi": 1, "k": "band"}
                | {"note": f"{turns:,.0f} turns: too fast to draw at this range"}
                for x in (0, n)
            ]
            continue
        rows += [
            {"pair": i, "p": int(p), "v": charts.rounded(table[j, 2 * i + c], 3), "c": name}
            for c, name in ((0, "sin"), (1, "cos"))
            for j, p in enumerate(pos.tolist())
        ]
    return rows, fast


def _wave_chart(n: int, header: str) -> alt.TopLevelMixin:
    """One panel per pair, sin and cos lines (or the too-fast band), headed by ``header``."""
    x = alt.X("p:Q", title="position", scale=alt.Scale(domain=[0, n], nice=False))
    lines = (
        alt.Chart()
        .transform_filter("datum.k != 'band'")
        .mark_line(aria=False, strokeWidth=1.5, clip=True)
        .encode(
            x=x,
            y=alt.Y("v:Q", title="PE", scale=alt.Scale(domain=[-1, 1])),
            color=alt.Color("c:N", title=None, scale=charts.colors(WAVE_PARTS), legend=WAVE_LEGEND),
            strokeDash=charts.dashes("c:N", WAVE_PARTS, title=None, legend=WAVE_LEGEND),
            tooltip=["pair:N", alt.Tooltip("p:Q", title="position"), "c:N", "v:Q"],
        )
    )
    band = (
        alt.Chart()
        .transform_filter("datum.k == 'band'")
        .mark_area(aria=False, color=charts.INK[7], opacity=0.35)
        .encode(x=x, y="lo:Q", y2="hi:Q", tooltip=["pair:N", "note:N"])
    )
    note = (
        alt.Chart()
        .transform_filter("datum.k == 'band' && datum.p == 0")
        .mark_text(aria=False, align="left", dx=6, fontSize=12)
        .encode(x=x, y=alt.datum(0), text="note:N")
    )
    return (
        alt.layer(band, note, lines, data=charts.rows_source())
        .properties(width=charts.WIDE - 60, height=64)
        .facet(
            row=alt.Row(
                "pair:O",
                title=None,
                sort="ascending",
                header=alt.Header(
                    labelAngle=0,
                    labelAlign="left",
                    labelAnchor="start",
                    labelOrient="top",
                    labelExpr=header,
                    labelFontSize=13,
                    labelFontWeight="bold",
                ),
            )
        )
        .properties(spacing=8)
    )


@figure("fig-waves")
def fig_waves(summary: dict[str, Any]) -> Figure:
    """sin and cos of the lesson's four pairs (d = 768), stacked, over a chosen range."""
    d = 768
    pairs = [int(p) for p in WAVE_PAIRS]
    lam = freqs.wavelengths(d)
    titles = {i: f"pair {i}: wavelength {charts.sig(lam[i])} tokens" for i in pairs}

    header = " : ".join(f"datum.value == {i} ? '{titles[i]}'" for i in pairs) + " : ''"

    def draw(span: str) -> tuple[object, str]:
        n = WAVE_RANGES[span]
        step = max(1, n // WAVE_SAMPLES)
        rows, fast = _wave_rows(d, pairs, n, step)
        chart = _wave_chart(n, header)
        drawn = ", ".join(f"pair {i} {charts.sig(lam[i])}" for i in pairs)
        shown = f"positions 0-{n:,}"
        if fast:
            which = ", ".join(map(str, fast))
            shown += f" (pair{'s' if len(fast) > 1 else ''} {which} too fast to draw)"
        return charts.spec(chart, rows), f"{shown}; wavelengths in tokens: {drawn}"

    return make_figure(
        "fig-waves",
        SCREEN,
        "The hands of the grandfather clock",
        "The sine and cosine channels of the lesson's four pairs of the d = 768 sinusoidal table "
        "on one position axis: pair 0 repeats every 2 pi = 6.28 tokens; pair 383 has a "
        "wavelength of 61,342.74 tokens and hardly moves in 128 positions. Widen the range to "
        "watch the slow pairs turn (a pair too fast to draw at the range is a grey band).",
        "posemb.sinusoidal_table(positions, 768); posemb.wavelengths(768)",
        "Four stacked panels of sine and cosine waves, pairs 0, 32, 128 and 383, each titled "
        "with its wavelength; the range slider widens the shared position axis.",
        kind="vega",
        draw=draw,
        controls=[Control("fig-waves-range", "positions", "slider", tuple(WAVE_RANGES), 0)],
    )


@figure("fig-float32-angles")
def fig_float32_angles(summary: dict[str, Any]) -> Figure:
    """cos error of a float32 angle product against posemb's float64 angles, by position."""
    d = 128
    pos = torch.tensor([2**e for e in range(0, 25)])
    exact = torch.cos(pos.to(F64)[:, None] * freqs.inv_freq(d, dtype=F64))
    naive = torch.cos(pos.float()[:, None] * freqs.inv_freq(d, dtype=torch.float32))
    ours, _ = freqs.cos_sin(pos, freqs.inv_freq(d, dtype=F64), dtype=torch.float32)
    errs = {
        "float32 positions x inv_freq": (naive.double() - exact).abs().amax(-1),
        "posemb.cos_sin (float64 angles)": (ours.double() - exact).abs().amax(-1),
    }

    def draw() -> tuple[object, str]:
        rows = [
            {"position": int(p), "error": charts.rounded(e), "method": name}
            for name, t in errs.items()
            for p, e in zip(pos.tolist(), t.tolist(), strict=True)
            if e > 0  # a log axis has no zero; an exact cos is simply not drawn
        ]
        chart = (
            alt.Chart(charts.rows_source())
            .mark_line(aria=False, point=alt.OverlayMarkDef(aria=False))
            .encode(
                x=alt.X(
                    "position:Q",
                    scale=alt.Scale(type="log", base=2),
                    title="position",
                    # Every fourth power of 2, and 2^20 (the lesson's million tokens) among them.
                    axis=alt.Axis(
                        values=[2**e for e in range(0, 25, 4)],
                        labelExpr="'2^' + round(log(datum.value) / LN2)",
                    ),
                ),
                y=alt.Y(
                    "error:Q",
                    scale=alt.Scale(type="log"),
                    title="max |cos error|",
                    axis=alt.Axis(values=[10.0**-e for e in range(0, 10)], format=".0e"),
                ),
                color=alt.Color(
                    "method:N",
                    title=None,
                    scale=charts.colors(list(errs)),
                    legend=charts.line_legend(orient="top"),
                ),
                strokeDash=charts.dashes(
                    "method:N", list(errs), title=None, legend=charts.line_legend(orient="top")
                ),
                tooltip=["method:N", "position:Q", alt.Tooltip("error:Q", format=".2e")],
            )
            .properties(width=charts.WIDE - 140, height=240)
        )
        at = pos.tolist().index(2**20)
        shown = "; ".join(f"{name} {float(t[at]):.1e}" for name, t in errs.items())
        return charts.spec(chart, rows), f"at position 2^20: {shown}"

    return make_figure(
        "fig-float32-angles",
        SCREEN,
        "The sinusoids are defined everywhere; float32 angles are not",
        "Largest cos error over the 64 pairs of a head_dim 128 table, against an exact float64 "
        "reference. A float32 product position x inv_freq loses digits as positions grow "
        "(about 0.03 at 2^20); posemb forms angles in float64 and stays at float32 rounding.",
        "posemb.cos_sin(positions, posemb.inv_freq(128, dtype=torch.float64))",
        "Two lines of error against position (log-log): one rising to 1e-2, one flat near 1e-7.",
        kind="vega",
        draw=draw,
    )


@exercise(
    SCREEN,
    "Pair 0 of the sinusoidal table, the fastest: does it repeat every 2 positions, or every "
    "2·pi = 6.28?",
    call="posemb.wavelengths(768)[0]",
    figure="fig-waves",
    state="0-128",
)
def _fastest_period() -> str:
    lam = float(wavelengths(768)[0])
    return (
        f"Every {lam:.4f} positions: its frequency is 1 radian per step, so a full turn takes "
        '2·pi steps, not 2 (the source lesson\'s "one full spin every 2 steps" is off by pi).'
    )
