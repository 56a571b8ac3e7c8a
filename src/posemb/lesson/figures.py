"""The lesson's figures, each computed by posemb's own functions in the same build.

A :class:`Figure` is what the page shows beside one screen of the lesson: a Vega-Lite chart
(built with Altair, data inlined) or a hand-drawn SVG for the lesson's own diagrams (dials,
the blender), in one or more *states*. Controls (sliders, toggles) pick a state; every
combination of control values is precomputed here, with the readout posemb measured for it,
so what the page shows for a state is exactly what posemb computes, with or without
JavaScript (``static_svg`` holds every Vega state rendered by vl-convert).

No number in a figure is typed in: data comes from posemb calls made while building, and each
caption ends with the call, so a reader can reproduce it in a notebook. The lesson's own
quoted numbers (its "2" and "10,000" periods, its 384 pairs) appear only as the reference
lines and labels they are checked against.

Altair and vl-convert are imported here, at module level: this module is only imported by the
page builder (the ``lesson`` extra), never by ``import posemb``.
"""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
import math
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from xml.sax.saxutils import escape

import torch

from .. import _extras, absolute, attention, freqs, rope, scaling
from .._errors import InputError
from ..lab import dog_bites_man as dbm
from ..lab import report
from . import claims

try:
    import altair as alt
    import vl_convert
except ImportError as _import_error:
    raise _extras.missing(_import_error, "posemb's lesson figures", "lesson") from None

F64 = torch.float64

# Okabe & Ito (2008), "Color Universal Design": distinguishable with every common colour
# vision deficiency; yellow last because it is faint on white.
OKABE_ITO = (
    "#0072B2",
    "#D55E00",
    "#009E73",
    "#CC79A7",
    "#E69F00",
    "#56B4E9",
    "#000000",
    "#999999",
    "#F0E442",
)
DIVERGING = "blueorange"  # Vega's blue-orange ramp: no red-green contrast
SEQUENTIAL = "viridis"  # perceptually uniform and colour-blind safe


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


@dataclass(frozen=True)
class Figure:
    """One figure of the page, with every state precomputed.

    ``states`` maps :func:`state_key` of the control values to a Vega-Lite spec (dict, kind
    "vega") or SVG markup (str, kind "svg"); ``readouts`` to the text shown for that state;
    ``static_svg`` (kind "vega") to the spec rendered by vl-convert. ``caption`` ends with
    ``call``, the posemb call that made the data.
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
    def default_key(self) -> str:
        """The state shown first."""
        return state_key([c.values[c.default] for c in self.controls])


def state_key(values: Sequence[str]) -> str:
    """The key of the state with these control values (one per control, in order)."""
    return "|".join(values)


Draw = Callable[..., tuple[object, str]]
"""Called with one display value per control; returns (spec or SVG, readout)."""


def _figure(
    id: str,
    screen: int,
    title: str,
    text: str,
    call: str,
    alt_text: str,
    kind: str,
    draw: Draw,
    controls: Sequence[Control] = (),
) -> Figure:
    """Run ``draw`` for every combination of control values and collect the states."""
    states: dict[str, object] = {}
    readouts: dict[str, str] = {}
    for combo in itertools.product(*(c.values for c in controls)):
        content, readout = draw(*combo)
        states[state_key(combo)] = content
        readouts[state_key(combo)] = readout
    return Figure(
        id=id,
        screen=screen,
        title=title,
        caption=f"{text} Data: {call}",
        call=call,
        alt=alt_text,
        kind=kind,
        states=states,
        readouts=readouts,
        controls=tuple(controls),
    )


WIDE = 820
"""Plot width of a full-width chart: the page shows figures in a ~930 px card."""


def _sig(x: float | torch.Tensor, digits: int = 4) -> str:
    """``x`` for a reader: ``digits`` significant digits, thousands separated, no exponent
    between 1e-3 and 1e15 (61,343 rather than 6.134e+04)."""
    x = float(x)
    if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e15):
        return f"{x:.{digits - 1}e}"
    if abs(x) >= 10 ** (digits - 1):
        return f"{x:,.0f}"
    return f"{_r(x, digits):,g}"


def _err(x: float) -> str:
    """A difference that should be zero: its size, and whether it is float64 rounding."""
    return f"{x:.1e}" + (" (equal up to float64 rounding)" if x < claims.EXACT else "")


FONTS = {
    "axis": {"labelFontSize": 12, "titleFontSize": 13},
    "legend": {"labelFontSize": 12, "titleFontSize": 12, "labelLimit": 0},
    "header": {"labelFontSize": 13, "titleFontSize": 13},
    "title": {"fontSize": 14},
    "text": {"fontSize": 12},
}
"""Every Vega chart's type sizes: at least 12 px, as the page's card shows them at 1:1."""


def _r(x: float | torch.Tensor, digits: int = 4) -> float:
    """``x`` to ``digits`` significant digits: what a chart can show, and a small page."""
    return float(f"{float(x):.{digits}g}")


ROWS = alt.Data(name="rows")
"""Where a chart's rows go: :func:`_spec` puts them in, inline, once Altair is done. Altair
walks and copies every row it is given (tens of ms per state), and the page has ~80 states."""


def _template(chart: alt.TopLevelMixin) -> dict[str, Any]:
    """The chart's Vega-Lite spec with its rows still to come (see :data:`ROWS`)."""
    # Schema validation costs more than building and checks what a test checks once. (Every
    # mark is built with aria=False: an aria label per mark doubles the SVG of a heatmap or
    # scatter, and the figure's alt text and hover tooltips carry the values.)
    return chart.to_dict(validate=False)


def _spec(chart: alt.TopLevelMixin | dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The spec of ``chart`` (a chart or a :func:`_template`) with ``rows`` inlined as its data."""
    spec = _template(chart) if isinstance(chart, alt.TopLevelMixin) else chart

    def fill(node: Any) -> Any:
        if isinstance(node, dict):
            if node == {"name": ROWS.name}:
                return {"values": rows}
            return {k: fill(v) for k, v in node.items()}
        if isinstance(node, list):
            return [fill(v) for v in node]
        return node

    spec = fill(spec)
    config = spec.setdefault("config", {})
    for part, sizes in FONTS.items():
        config[part] = {**sizes, **config.get(part, {})}
    return spec


def _data(rows: list[dict[str, object]]) -> alt.Data:
    """Inline data for a chart's few extra rows (reference lines, labels)."""
    return alt.Data(values=rows)


def _colors(names: Sequence[str]) -> alt.Scale:
    return alt.Scale(domain=list(names), range=list(OKABE_ITO[: len(names)]))


def _heat(
    rows: list[dict[str, object]],
    x: str,
    y: str,
    v: str,
    *,
    titles: tuple[str, str, str],
    size: tuple[int, int],
    diverging: bool = True,
    domain: tuple[float, float] | None = None,
    tick_every: int = 1,
    x_sort: str | None = None,
    y_sort: str | None = None,
) -> alt.Chart:
    """A heatmap of ``rows`` with hover values; ordinal x and y, colour by ``v``."""
    scale: dict[str, Any] = {"scheme": DIVERGING if diverging else SEQUENTIAL}
    if diverging:
        scale["domainMid"] = 0
    if domain is not None:
        scale["domain"] = list(domain)
    xs = sorted({r[x] for r in rows}, key=str) if x_sort is None else None
    ys = sorted({r[y] for r in rows}, key=str) if y_sort is None else None

    def axis(values: list[Any] | None) -> alt.Axis:
        if values is None or tick_every == 1:
            return alt.Axis()
        return alt.Axis(values=[u for u in values if int(str(u)) % tick_every == 0])

    numeric = all(isinstance(r[x], int) for r in rows)
    return (
        alt.Chart(ROWS)
        .mark_rect(aria=False)
        .encode(
            x=alt.X(
                f"{x}:O",
                title=titles[0],
                sort=alt.EncodingSortField(x_sort) if x_sort else "ascending",
                axis=axis(xs if numeric else None),
            ),
            y=alt.Y(
                f"{y}:O",
                title=titles[1],
                sort=alt.EncodingSortField(y_sort) if y_sort else "ascending",
                axis=axis(ys if all(isinstance(r[y], int) for r in rows) else None),
            ),
            color=alt.Color(f"{v}:Q", title=titles[2], scale=alt.Scale(**scale)),
            tooltip=[
                alt.Tooltip(f"{x}:O", title=titles[0]),
                alt.Tooltip(f"{y}:O", title=titles[1]),
                alt.Tooltip(f"{v}:Q", title=titles[2], format=".4g"),
            ],
        )
        .properties(width=size[0], height=size[1])
    )


# --- hand-drawn SVG (the lesson's own diagrams) --------------------------------------------------


def _svg(width: int, height: int, title: str, body: str) -> str:
    """An accessible SVG: ``role="img"`` named by its ``<title>``; text in currentColor so it
    follows the page's light or dark theme."""
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" font-family="sans-serif" font-size="12" '
        f'fill="currentColor"><title>{escape(title)}</title>{body}</svg>'
    )


def _pt(cx: float, cy: float, r: float, angle: float) -> tuple[float, float]:
    """The point at ``angle`` (radians, counter-clockwise from 3 o'clock) on a circle; SVG's
    y axis points down, hence the minus."""
    return round(cx + r * math.cos(angle), 2), round(cy - r * math.sin(angle), 2)


def _hand(cx: float, cy: float, r: float, angle: float, color: str, width: float = 3) -> str:
    x, y = _pt(cx, cy, r, angle)
    return (
        f'<line x1="{cx}" y1="{cy}" x2="{x}" y2="{y}" stroke="{color}" stroke-width="{width}" '
        f'stroke-linecap="round"/><circle cx="{x}" cy="{y}" r="{width + 1}" fill="{color}"/>'
    )


def _arc(cx: float, cy: float, r: float, a0: float, a1: float, color: str) -> str:
    """The arc from angle ``a0`` to ``a1`` (counter-clockwise when a1 > a0)."""
    x0, y0 = _pt(cx, cy, r, a0)
    x1, y1 = _pt(cx, cy, r, a1)
    large = 1 if abs(a1 - a0) % (2 * math.pi) > math.pi else 0
    sweep = 0 if a1 > a0 else 1  # SVG sweeps clockwise on screen for 1
    return (
        f'<path d="M{x0},{y0} A{r},{r} 0 {large} {sweep} {x1},{y1}" fill="none" '
        f'stroke="{color}" stroke-width="2" stroke-dasharray="4 3"/>'
    )


def _dial_face(cx: float, cy: float, r: float, ticks: int = 8) -> str:
    marks = "".join(
        '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="currentColor" stroke-opacity="0.4"/>'.format(
            *_pt(cx, cy, r * 0.9, 2 * math.pi * i / ticks), *_pt(cx, cy, r, 2 * math.pi * i / ticks)
        )
        for i in range(ticks)
    )
    return (
        f'<circle cx="{cx}" cy="{cy}" r="{r}" fill="none" stroke="currentColor" '
        f'stroke-opacity="0.6"/>{marks}'
    )


def _diverging_rgb(v: float, vmax: float) -> str:
    """Blue (negative) - light grey - orange (positive), the colours of :data:`DIVERGING`."""
    t = max(-1.0, min(1.0, v / vmax)) if vmax > 0 else 0.0
    t = math.copysign(math.sqrt(abs(t)), t)  # small values visibly coloured, not near-white
    mid, end = (242, 242, 242), ((0, 114, 178) if t < 0 else (230, 159, 0))
    c = [round(m + abs(t) * (e - m)) for m, e in zip(mid, end, strict=True)]
    return "#{:02x}{:02x}{:02x}".format(*c)


def _angle(v: torch.Tensor) -> float:
    """The angle of a 2D vector, radians."""
    return math.atan2(float(v[1]), float(v[0]))


def _vec(v: torch.Tensor) -> str:
    return "[" + ", ".join(f"{float(x):.4f}" for x in v) + "]"


# --- screen 1: the blender -----------------------------------------------------------------------

ENCODING_NAMES = {"no positions": "none", "sinusoidal": "sinusoidal", "RoPE": "rope"}


BLENDER_CELL = 26  # px per channel: 16 channels make a 416 px strip


def _diverging_legend(x: float, y: float, vmax: float, width: float = 320) -> str:
    """A colour bar for :func:`_diverging_rgb` from -vmax to vmax, with numbers under it."""
    steps = 64
    w = round(width / steps + 0.5, 2)  # a hair wider: no gaps between the slices
    body = [
        f'<rect x="{round(x + i * width / steps, 2)}" y="{y}" width="{w}" height="14" '
        f'fill="{_diverging_rgb(vmax * (2 * i / (steps - 1) - 1), vmax)}"/>'
        for i in range(steps)
    ]
    for frac in (0.0, 0.25, 0.5, 0.75, 1.0):
        tx = round(x + frac * width, 2)
        body.append(
            f'<line x1="{tx}" y1="{y + 14}" x2="{tx}" y2="{y + 19}" stroke="currentColor"/>'
            f'<text x="{tx}" y="{y + 32}" text-anchor="middle">{vmax * (2 * frac - 1):.2g}</text>'
        )
    return "".join(body)


def fig_blender(summary: dict[str, Any]) -> Figure:
    """Per-word outputs of one attention layer for 'dog bites man' and 'man bites dog'."""
    outs = claims.dog_bites_man_outputs()
    words = claims.DOG_BITES_MAN
    vmax = max(float(t.abs().max()) for pair in outs.values() for t in pair)
    cell, x0, y0, block = BLENDER_CELL, 200, 56, 3 * (BLENDER_CELL + 6) + 26
    channels = next(iter(outs.values()))[0].shape[1]

    def strip(x: float, y: float, row: list[float], blank_below: float | None = None) -> str:
        out = []
        for j, v in enumerate(row):
            if blank_below is not None and abs(v) < blank_below:
                fill = 'fill="none" stroke="currentColor" stroke-opacity="0.25"'
            else:
                fill = f'fill="{_diverging_rgb(v, vmax)}" stroke="#ffffff" stroke-width="0.5"'
            out.append(
                f'<rect x="{x + j * cell}" y="{y}" width="{cell}" height="{cell}" {fill}>'
                f"<title>channel {j}: {v:.4g}</title></rect>"
            )
        return "".join(out)

    def draw(encoding: str) -> tuple[object, str]:
        out_a, out_b = outs[ENCODING_NAMES[encoding]]
        body = [
            f'<text x="4" y="18" font-weight="bold" font-size="15">each word\'s output, '
            f"{escape(encoding)}</text>",
            f'<text x="4" y="38" font-size="13">{channels} channels per word; the third row is '
            "the difference (blank where the two are identical)</text>",
        ]
        for w, word in enumerate(words):
            y = y0 + w * block
            body.append(
                f'<text x="4" y="{y + cell * 1.5 + 10}" font-weight="bold" font-size="15">'
                f"{word}</text>"
            )
            ia, ib = w, len(words) - 1 - w  # the word's row in each sentence
            a, b = out_a[ia].tolist(), out_b[ib].tolist()
            diff = [u - v for u, v in zip(a, b, strict=True)]
            for s_, (label, row, blank) in enumerate(
                (
                    ("in 'dog bites man'", a, None),
                    ("in 'man bites dog'", b, None),
                    ("difference", diff, claims.EXACT),
                )
            ):
                yy = y + s_ * (cell + 6)
                body.append(
                    f'<text x="{x0 - 8}" y="{yy + cell * 0.7}" font-size="13" '
                    f'text-anchor="end">{escape(label)}</text>'
                )
                body.append(strip(x0, yy, row, blank))
            largest = max(abs(v) for v in diff)
            body.append(
                f'<text x="{x0 + channels * cell + 10}" y="{y + 2 * (cell + 6) + cell * 0.7}" '
                f'font-size="13">largest {largest:.3g}</text>'
            )
        ly = y0 + len(words) * block
        body.append(f'<text x="4" y="{ly + 12}" font-size="13">output value</text>')
        body.append(_diverging_legend(x0, ly, vmax))
        change = claims.word_change(out_a, out_b)
        svg = _svg(
            x0 + channels * cell + 110,
            ly + 44,
            f"Attention outputs of dog, bites and man in both sentences and their difference, "
            f"{encoding}",
            "".join(body),
        )
        words_ = " (zero up to float64 rounding)" if change < claims.EXACT else ""
        return svg, f"largest per-word change between the sentences = {change:.3g}{words_}"

    return _figure(
        "fig-blender",
        1,
        "The blender: the same words, the same outputs",
        "One self-attention layer (random embeddings and projections, float64) reads 'dog bites "
        "man' and 'man bites dog'. Without positions each word gets exactly the same output in "
        "both sentences (the difference rows stay blank): attention only reordered the rows. "
        "Sinusoidal or rotary positions make the outputs differ.",
        "posemb.lesson.claims.dog_bites_man_outputs()",
        "Colour strips of each word's 16-channel attention output in both sentences, and a "
        "third strip of their difference: blank without positions, coloured with sinusoidal or "
        "RoPE positions. A colour bar gives the values.",
        "svg",
        draw,
        [Control("fig-blender-encoding", "positions", "toggle", tuple(ENCODING_NAMES), 0)],
    )


PERMUTATION_STEPS = ("1 inputs X", "2 queries X W_Q", "3 logits QK^T/√d", "4 softmax", "5 output")


def fig_permutation(summary: dict[str, Any]) -> Figure:
    """Step through Attn(P X) = P Attn(X): each intermediate from X and from P X."""
    g = torch.Generator().manual_seed(31)
    d = 6
    words = claims.DOG_BITES_MAN
    x = torch.randn(3, d, generator=g, dtype=F64)
    w = torch.randn(3, d, d, generator=g, dtype=F64) / math.sqrt(d)
    perm = [2, 1, 0]  # 'dog bites man' -> 'man bites dog'
    p = attention.permutation_matrix(perm)

    def steps(inp: torch.Tensor) -> list[torch.Tensor]:
        q, k, v = (inp @ w[i] for i in range(3))
        probs = attention.attention_probs(q[None, None], k[None, None])[0, 0]
        out = attention.dot_product_attention(q[None, None], k[None, None], v[None, None])[0, 0]
        return [inp, q, q @ k.T / math.sqrt(d), probs, out]

    plain, permuted = steps(x), steps(p @ x)

    def draw(step: str) -> tuple[object, str]:
        i = PERMUTATION_STEPS.index(step)
        square = i in (2, 3)  # logits and weights: rows are queries, columns keys
        a, b = plain[i], permuted[i]
        want = p @ a @ p.T if square else p @ a
        err = float((b - want).abs().max())
        rows = []
        for panel, mat, order in (("from X", a, list(range(3))), ("from P X", b, perm)):
            for r in range(mat.shape[0]):
                for c in range(mat.shape[1]):
                    rows.append(
                        {
                            "panel": panel,
                            "row": f"{words[order[r]]}",
                            "i": r,
                            "col": words[order[c]] if square else f"ch {c}",
                            "j": c,
                            "v": _r(mat[r, c]),
                        }
                    )
        chart = (
            _heat(
                rows,
                "col",
                "row",
                "v",
                titles=("key" if square else "channel", "token", step[2:]),
                size=(28 * a.shape[1], 28 * a.shape[0]),
                x_sort="j",
                y_sort="i",
            )
            .facet(column=alt.Column("panel:N", title=None, sort=["from X", "from P X"]))
            .resolve_scale(x="independent", y="independent")
        )
        what = "P f(X) P^T" if square else "P f(X)"
        return _spec(chart, rows), f"max |f(P X) - {what}| = {_err(err)}"

    return _figure(
        "fig-permutation",
        1,
        "Attn(P X) = P Attn(X), step by step",
        "Each step of one attention layer computed from X ('dog bites man') and from P X ('man "
        "bites dog'): every intermediate is the same numbers with rows (and, for the logits and "
        "weights, columns) reordered, so the output is too.",
        "posemb.permutation_matrix([2, 1, 0]); posemb.attention_probs(q, k); "
        "posemb.dot_product_attention(q, k, v)",
        "Two heatmaps per step, from X and from P X, holding the same values in permuted rows.",
        "vega",
        draw,
        [Control("fig-permutation-step", "step", "slider", PERMUTATION_STEPS, 0)],
    )


CAUSAL_LOGIT_STD = 1.0
"""Spread of the last query's logits after :func:`fig_causal_same_token` scales q and k: the
raw logits spread so widely that softmax puts nearly all weight on one key (and 1e-10 on the
token's own copies); at 1 every weight stays within a factor ~10 of 1/600, on a linear axis."""


def fig_causal_same_token(summary: dict[str, Any]) -> Figure:
    """Causal attention weights of the last token over 599 earlier ones."""
    q, k = claims.causal_same_token_qk()
    t = q.shape[0]
    # One factor for q and k alike: the same token still meets the same key, scaled.
    scale = math.sqrt(CAUSAL_LOGIT_STD / float((k[:-1] @ q[-1]).std()))
    q, k = q * scale, k * scale
    rotary = rope.RotaryEmbedding(q.shape[1])
    back = {pos: t - 1 - pos for pos in claims.SAME_TOKEN_AT}

    def draw(encoding: str) -> tuple[object, str]:
        qq, kk = q[None, None], k[None, None]
        if encoding == "RoPE":
            qq, kk = rotary.rotate(qq, torch.arange(t)), rotary.rotate(kk, torch.arange(t))
        probs = attention.attention_probs(qq, kk, causal=True)[0, 0, -1]
        rows = [
            {
                "back": t - 1 - j,
                "w": _r(probs[j]),
                "key": "the same token" if j in back else "other tokens",
            }
            for j in range(t - 1)
            # Every key within 50 steps, then every fifth: the page stays small. The three
            # copies are always drawn.
            if j in back or t - 1 - j <= 50 or (t - 1 - j) % 5 == 0
        ]
        base = alt.Chart(ROWS).encode(
            x=alt.X(
                "back:Q", title="steps back from the last token", scale=alt.Scale(domain=[0, t])
            ),
            y=alt.Y("w:Q", title="attention weight of the last token"),
            color=alt.Color("key:N", title=None, scale=_colors(["the same token", "other tokens"])),
            tooltip=["back:Q", alt.Tooltip("w:Q", format=".4g"), "key:N"],
        )
        others = base.transform_filter("datum.key == 'other tokens'").mark_point(
            aria=False, filled=True, size=14, opacity=0.6
        )
        same = base.transform_filter("datum.key == 'the same token'").mark_point(
            aria=False, filled=True, size=160, shape="diamond"
        )
        uniform = alt.Chart(_data([{"w": _r(1 / t), "label": f"1/{t} (every key alike)"}])).encode(
            y="w:Q"
        )
        rule = uniform.mark_rule(aria=False, strokeDash=[4, 4], color="gray").encode(
            tooltip=["label:N"]
        )
        label = uniform.mark_text(
            aria=False, align="right", baseline="bottom", dy=-2, color="gray", fontSize=12
        ).encode(x=alt.datum(t), text="label:N")
        chart = (rule + label + others + same).properties(width=WIDE - 140, height=260)
        w = [float(probs[pos]) for pos in claims.SAME_TOKEN_AT]
        spread = (max(w) - min(w)) / w[0]
        equal = spread < claims.EXACT
        steps = ", ".join(str(back[pos]) for pos in claims.SAME_TOKEN_AT)
        shown = ", ".join(f"{v:.3g}" for v in w)
        return _spec(chart, rows), (
            f"same weight at {steps} back: {'yes' if equal else 'no'} ({shown}; relative "
            f"spread {spread:.1e}" + (", zero up to float64 rounding)" if equal else ")")
        )

    return _figure(
        "fig-causal-same-token",
        1,
        "A causal mask does not tell near from far",
        "The last of 600 random tokens attends causally to the 599 before it; its own token also "
        "sits 1, 99 and 599 steps back (diamonds). Without positions those three get exactly the "
        "same weight: the mask hides the future but gives no distance. With RoPE they differ. "
        f"(q and k are scaled by one factor so the logits spread by {CAUSAL_LOGIT_STD}: the "
        "weights stay near 1/600 instead of one key taking all. Other keys: all within 50 steps, "
        "then every fifth.)",
        "posemb.attention_probs(q, k, causal=True) on posemb.lesson.claims.causal_same_token_qk()",
        "Scatter of attention weight against steps back on linear axes, the three copies of the "
        "token as large diamonds; they sit at one height without positions and at three "
        "heights with RoPE.",
        "vega",
        draw,
        [Control("fig-causal-encoding", "positions", "toggle", ("no positions", "RoPE"), 0)],
    )


def fig_counting(summary: dict[str, Any]) -> Figure:
    """The 1, 1/2, 1/3 ... signal a causal NoPE layer can read position from."""
    t = 16
    out = claims.counting_signal(t)

    def draw() -> tuple[object, str]:
        rows = [
            {"position": i, "value": _r(out[i], 6), "series": "attention output"} for i in range(t)
        ]
        rows += [
            {"position": i, "value": _r(1 / (i + 1), 6), "series": "1/(i+1)"} for i in range(t)
        ]
        chart = (
            alt.Chart(ROWS)
            .mark_line(aria=False, point=alt.OverlayMarkDef(aria=False))
            .encode(
                x=alt.X("position:Q", title="position i"),
                y=alt.Y("value:Q", title="output"),
                color=alt.Color(
                    "series:N", title=None, scale=_colors(["attention output", "1/(i+1)"])
                ),
                strokeDash=alt.StrokeDash("series:N", legend=None),
                tooltip=["position:Q", alt.Tooltip("value:Q", format=".6f"), "series:N"],
            )
            .properties(width=WIDE - 140, height=220)
        )
        shown = ", ".join(f"{float(v):.4f}" for v in out[:6])
        return _spec(chart, rows), f"outputs at positions 0-5: {shown}"

    return _figure(
        "fig-counting",
        1,
        "But a causal layer can count",
        "Equal logits under a causal mask average over the tokens seen so far; a value present "
        "only at token 0 comes out as 1/(i+1) at position i, a different number at every "
        "position. A causal model without positions can read absolute position from it.",
        "posemb.lesson.claims.counting_signal(16)",
        "Line of the attention output by position, falling 1, 1/2, 1/3, ..., on top of 1/(i+1).",
        "vega",
        draw,
    )


TRAINED_STEPS = 60
"""Steps for the figure's encoder: ``posemb verify`` trains 200 (~5 s here); the RoPE encoder
answers every held-out sentence after 60 already (its readout says so), at a third of the
page's build time."""


@functools.cache
def _trained_rope_encoder() -> dbm.Encoder:
    """The RoPE dog-bites-man encoder on seed 0, :data:`TRAINED_STEPS` steps (memoised)."""
    return dbm.trained_encoder("rope", 0, steps=TRAINED_STEPS)


SENTENCES = ("dog bites man", "man bites dog")


def fig_trained_attention(summary: dict[str, Any]) -> Figure:
    """Attention weights of the trained dog-bites-man RoPE encoder, per head."""
    model = _trained_rope_encoder()
    data = dbm.make_data(0)
    held_out = {tuple(r) for r in data.test_x.tolist()}
    with torch.no_grad():
        accuracy = float((model(data.test_x).argmax(-1) == data.test_y).double().mean())

    def draw(sentence: str) -> tuple[object, str]:
        words = ["[CLS]", *sentence.split()]
        tokens = torch.tensor([[dbm.VOCAB.index(w) for w in words]])
        with torch.no_grad():
            weights = model.attention_weights(tokens)[0, 0]  # (heads, 4, 4) of layer 0
            probs = torch.softmax(model(tokens)[0], -1)
        labels = [f"{i} {w}" for i, w in enumerate(words)]
        rows = [
            {"head": f"head {h}", "query": labels[i], "i": i, "key": labels[j], "j": j}
            | {"weight": _r(weights[h, i, j])}
            for h in range(weights.shape[0])
            for i in range(4)
            for j in range(4)
        ]
        chart = _heat(
            rows,
            "key",
            "query",
            "weight",
            titles=("key", "query", "weight"),
            size=(120, 120),
            diverging=False,
            domain=(0.0, 1.0),
            x_sort="j",
            y_sort="i",
        ).facet(column=alt.Column("head:N", title=None))
        best = int(probs.argmax())
        seen = (
            "held out in training" if tuple(tokens[0].tolist()) in held_out else "seen in training"
        )
        return _spec(chart, rows), (
            f"predicts '{dbm.ENTITIES[best]}' acts (p = {float(probs[best]):.3f}); sentence "
            f"{seen}; held-out accuracy {accuracy:.3f}"
        )

    return _figure(
        "fig-trained-attention",
        1,
        "What a trained RoPE encoder attends to",
        "A one-layer RoPE encoder trained on 'A verb B' as posemb verify trains it (seed 0), "
        f"for {TRAINED_STEPS} steps, reads both sentences; each head's attention weights, rows "
        "the querying token. The same words give different weights in the two orders, and the "
        "[CLS] row names who acts.",
        f"posemb.lab.dog_bites_man.trained_encoder('rope', 0, steps={TRAINED_STEPS})"
        ".attention_weights(tokens)",
        "Four 4x4 heatmaps of attention weights, one per head, for the chosen sentence.",
        "vega",
        draw,
        [Control("fig-trained-attention-sentence", "sentence", "toggle", SENTENCES, 0)],
    )


ACCURACY_WIDTH = WIDE - 120  # room on the right for the rules' labels
TRAINED_CLAIM = "attention.dog_bites_man.trained"
"""The claim whose measured accuracies :func:`fig_trained_accuracy` draws."""


def _trained_accuracies(
    claim_rows: Sequence[dict[str, Any]] | None,
) -> tuple[dict[str, list[float]], float] | None:
    """(accuracy per encoding, one per seed; the pass bar) from the claim's ``posemb verify``
    row, or None when the rows do not include it.

    Raises:
        ValueError: the row's ``value`` is not what the claim measures.
    """
    row = next((r for r in claim_rows or () if r.get("id") == TRAINED_CLAIM), None)
    if row is None:
        return None
    raw = row.get("value")
    value: dict[str, Any] = raw if isinstance(raw, dict) else {}
    ok = isinstance(value.get("bar"), (int, float))
    acc = {k: v for k, v in value.items() if k != "bar"} if ok else {}
    if (
        not ok
        or not acc
        or not all(
            isinstance(v, list) and v and all(isinstance(a, (int, float)) for a in v)
            for v in acc.values()
        )
    ):
        raise InputError(
            f"claim row {TRAINED_CLAIM}: value must be {{encoding: [accuracy per seed], "
            f"'bar': number}}, got {raw!r}"
        )
    return {k: [float(a) for a in v] for k, v in acc.items()}, float(value["bar"])


def fig_trained_accuracy(
    summary: dict[str, Any], claim_rows: Sequence[dict[str, Any]] | None = None
) -> Figure:
    """Held-out accuracy of the dog-bites-man encoder per encoding, from ``posemb verify``."""
    from ..lab import dog_bites_man as dbm

    got = _trained_accuracies(claim_rows)
    # Training every encoding on every seed takes minutes: the build reads what posemb
    # verify measured, or says it did not measure it.
    bar = (
        got[1]
        if got
        else claims._above_chance(claims._independent_answers(len(dbm.make_data(0).test_y)))
    )
    encodings = list(got[0]) if got else list(dbm.ENCODINGS)

    def draw() -> tuple[object, str]:
        rows: list[dict[str, object]] = []
        if got:
            for e, accs in got[0].items():
                mean = statistics.fmean(accs)
                rows.append(
                    {"encoding": e, "acc": _r(mean), "label": f"{mean:.3f}", "kind": "mean"}
                    | {"seeds": len(accs), "above": "yes" if min(accs) > bar else "no"}
                )
                rows += [{"encoding": e, "acc": _r(a), "kind": "seed"} for a in accs]
        x = alt.X(
            "encoding:N",
            title=None,
            sort=encodings,
            scale=alt.Scale(domain=encodings),
            axis=alt.Axis(labelAngle=0),
        )
        y_scale = alt.Scale(domain=[0, 1.08])
        y = alt.Y("acc:Q", title="held-out accuracy", scale=y_scale)
        base = alt.Chart().encode(x=x)  # the rows come once, with the layer
        bars = (
            base.transform_filter("datum.kind == 'mean'")
            .mark_bar(aria=False, width={"band": 0.6})
            .encode(
                y=y,
                color=alt.Color(
                    "above:N",
                    title="every seed above the pass bar",
                    scale=alt.Scale(domain=["yes", "no"], range=[OKABE_ITO[0], OKABE_ITO[7]]),
                    legend=alt.Legend(orient="top"),
                ),
                tooltip=["encoding:N", alt.Tooltip("acc:Q", format=".3f"), "seeds:Q"],
            )
        )
        labels = (
            base.transform_filter("datum.kind == 'mean'")
            .mark_text(aria=False, baseline="bottom", dy=-3, fontSize=12)
            .encode(y="acc:Q", text="label:N")
        )
        seeds = (
            base.transform_filter("datum.kind == 'seed'")
            .mark_point(aria=False, shape="circle", filled=True, size=30, color=OKABE_ITO[6])
            .encode(y="acc:Q", tooltip=["encoding:N", alt.Tooltip("acc:Q", format=".3f")])
        )
        refs = alt.Chart(
            _data(
                [
                    {"y": dbm.CHANCE, "label": f"chance {dbm.CHANCE}"},
                    {"y": _r(bar), "label": f"pass bar {bar:.3f}"},
                ]
            )
        ).encode(y=alt.Y("y:Q", title="held-out accuracy", scale=y_scale))
        rules = refs.mark_rule(aria=False, strokeDash=[5, 3], color=OKABE_ITO[1]).encode(
            tooltip=["label:N"]
        )
        # Labelled beside the plot, where no bar covers them.
        rule_labels = refs.mark_text(
            aria=False, align="left", baseline="middle", dx=6, color=OKABE_ITO[1], fontSize=12
        ).encode(x=alt.value(ACCURACY_WIDTH), text="label:N")
        layers = [rules, rule_labels]
        if got:
            layers = [bars, seeds, labels, *layers]
        else:
            # The x axis still names every encoding, with nothing above it.
            layers.append(base.mark_tick(aria=False, opacity=0).encode(y=alt.datum(0)))
            layers.append(
                alt.Chart(_data([{"t": "not measured in this build"}]))
                .mark_text(aria=False, fontSize=16, color=OKABE_ITO[6])
                .encode(x=alt.value(ACCURACY_WIDTH / 2), y=alt.value(30), text="t:N")
            )
        chart = alt.layer(*layers, data=ROWS).properties(width=ACCURACY_WIDTH, height=260)
        if not got:
            # A chart with no rows still needs its x domain: the encodings, from posemb.
            rows = [{"encoding": e, "kind": "none"} for e in encodings]
            return _spec(chart, rows), (
                f"not measured in this build: the page builder passes posemb verify's rows "
                f"(claim {TRAINED_CLAIM}); chance {dbm.CHANCE}, pass bar {bar:.3f}"
            )
        shown = ", ".join(f"{e} {statistics.fmean(a):.3f}" for e, a in got[0].items())
        n_seeds = len(next(iter(got[0].values())))
        return _spec(chart, rows), (
            f"held-out accuracy, mean of {n_seeds} seeds: {shown}; chance {dbm.CHANCE}, "
            f"pass bar {bar:.3f}"
        )

    return _figure(
        "fig-trained-accuracy",
        1,
        "Trained on 'A verb B': only positions get past chance",
        "The one-layer encoder of posemb verify learns to say who acts in 'A verb B' (16 "
        "entities, pairs held out), once per encoding and seed: bars are the mean held-out "
        "accuracy, dots the seeds. Without positions it stays at chance (0.5) on every seed; "
        "every encoding clears the pass bar, five standard errors of a coin above chance. The "
        "numbers are those of posemb verify's run.",
        f"posemb.lab.dog_bites_man.accuracy_over_seeds() (posemb verify, claim {TRAINED_CLAIM})",
        "Bars of held-out accuracy per encoding with a dashed chance line at 0.5 and a dashed "
        "pass bar near 0.8; NoPE's bar stops at chance, the others reach about 1.",
        "vega",
        draw,
    )


# --- screen 2: additive positions ----------------------------------------------------------------


def fig_sinusoidal_table(summary: dict[str, Any]) -> Figure:
    """The sinusoidal table as a heatmap: positions by channels."""
    n, d = 64, 32
    table = absolute.sinusoidal_table(n, d, dtype=F64)

    def draw() -> tuple[object, str]:
        rows: list[dict[str, object]] = [
            {"channel": c, "position": p, "PE": _r(table[p, c], 3)}
            for p in range(n)
            for c in range(d)
        ]
        chart = _heat(
            rows,
            "channel",
            "position",
            "PE",
            titles=("channel", "position", "PE"),
            size=(320, 384),
            tick_every=8,
        )
        return _spec(chart, rows), f"PE[1, 0] = sin(1) = {float(table[1, 0]):.6f}"

    return _figure(
        "fig-sinusoidal-table",
        2,
        "The sinusoidal table",
        "Each row is the vector added at one position (d = 32). Even channels hold sines, odd "
        "ones cosines; the left pairs turn fast, the right ones so slowly that 64 positions "
        "barely move them.",
        "posemb.sinusoidal_table(64, 32)",
        "Heatmap of the 64 x 32 sinusoidal table: fast stripes on the left, near-constant "
        "columns on the right.",
        "vega",
        draw,
    )


BASES = {"100": 100.0, "1,000": 1000.0, "10,000": 10000.0, "100,000": 100000.0}


def fig_offset_cosine(summary: dict[str, Any]) -> Figure:
    """cos(PE(p), PE(p + k)) against the offset k."""
    p0, d, ks = 100, 768, torch.arange(0, 257)

    def draw(base: str) -> tuple[object, str]:
        table = absolute.sinusoidal_table(p0 + ks, d, base=BASES[base], dtype=F64)
        cos = torch.nn.functional.cosine_similarity(table[:1], table, dim=-1)
        rows = [{"k": int(k), "cos": _r(c)} for k, c in zip(ks.tolist(), cos.tolist(), strict=True)]
        chart = (
            alt.Chart(ROWS)
            .mark_line(aria=False)
            .encode(
                x=alt.X("k:Q", title="offset k"),
                y=alt.Y("cos:Q", title="cos(PE(p), PE(p+k))", scale=alt.Scale(domain=[-0.2, 1])),
                tooltip=["k:Q", alt.Tooltip("cos:Q", format=".4f")],
            )
            .properties(width=WIDE - 140, height=220)
        )
        low = int(cos.argmin())
        return _spec(chart, rows), (
            f"cos at k = 1: {float(cos[1]):.6f}; lowest for k <= 256: {float(cos[low]):.4f} "
            f"at k = {low}"
        )

    return _figure(
        "fig-offset-cosine",
        2,
        "How alike are nearby positions?",
        "Cosine similarity of the sinusoidal vectors of position p = 100 and p + k (d = 768). It "
        "depends on k alone (each pair contributes cos(k theta_i)); a smaller base makes it fall "
        "faster.",
        "posemb.sinusoidal_table(100 + k, 768, base)",
        "Line of cosine similarity against offset, falling from 1 and levelling off.",
        "vega",
        draw,
        [Control("fig-offset-cosine-base", "base", "slider", tuple(BASES), 2)],
    )


DIMS = ("2", "8", "32", "128", "512", "2048", "4096")


COSINE_BIN = 0.25  # bin width in units of 1/sqrt(d): the bars keep their shape as d grows
COSINE_TOP = 0.2  # one y scale for every d (the tallest bar, at d = 2, is 0.19)
COSINE_SPAN = 4.5  # bins cover +-4.5/sqrt(d) (clipped to [-1, 1]): every cosine of 500 pairs


def fig_random_cosines(summary: dict[str, Any]) -> Figure:
    """Histogram of cosines of random vector pairs, by dimension, beside N(0, 1/d)."""
    n = 500

    def draw(dim: str) -> tuple[object, str]:
        d = int(dim)
        sigma = 1 / math.sqrt(d)
        cos = claims.random_cosines(d, n)
        width = COSINE_BIN * sigma
        half = math.ceil(min(1.0, COSINE_SPAN * sigma) / width)
        edges = [max(-1.0, min(1.0, (i - half) * width)) for i in range(2 * half + 1)]
        counts = torch.histc(cos, bins=2 * half, min=-half * width, max=half * width)
        rows = [
            {"lo": _r(lo, 3), "hi": _r(hi, 3), "f": _r(c / n, 3), "n": int(c), "kind": "bar"}
            for lo, hi, c in zip(edges[:-1], edges[1:], counts.tolist(), strict=True)
        ]
        # The normal density N(0, 1/d), as the fraction of pairs expected in one bin.
        xs = [-1 + 2 * i / 400 for i in range(401)]
        rows += [
            {
                "x": _r(x, 3),
                "f": _r(
                    width * math.exp(-0.5 * (x / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi)), 3
                ),
                "kind": "curve",
            }
            for x in xs
            if abs(x) <= min(1.0, COSINE_SPAN * sigma)
        ]
        x_scale = alt.Scale(domain=[-1, 1])
        base = alt.Chart(ROWS)
        bars = (
            base.transform_filter("datum.kind == 'bar'")
            .mark_bar(aria=False, color=OKABE_ITO[0], opacity=0.85, stroke="white", strokeWidth=0.3)
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
                    scale=alt.Scale(
                        domain=[0, max(COSINE_TOP, max(float(str(r["f"])) for r in rows))]
                    ),
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
            .mark_line(aria=False, color=OKABE_ITO[1], strokeWidth=2)
            .encode(x="x:Q", y="f:Q")
        )
        sd = alt.Chart(
            _data(
                [
                    {"x": _r(-sigma), "label": "", "tip": "-1/√d"},
                    {"x": _r(sigma), "label": f"±1/√d = ±{sigma:.3g}", "tip": "+1/√d"},
                ]
            )
        ).encode(x="x:Q")
        rules = sd.mark_rule(aria=False, strokeDash=[4, 3], color=OKABE_ITO[6]).encode(
            tooltip=["tip:N", "x:Q"]
        )
        labels = sd.mark_text(
            aria=False, align="left", dx=3, baseline="top", y=2, fontSize=12
        ).encode(text="label:N")
        chart = (bars + curve + rules + labels).properties(width=WIDE - 80, height=240)
        std = float(cos.std())
        return _spec(chart, rows), (
            f"d = {d}: std of the cosines {std:.4f}; 1/sqrt(d) = {sigma:.4f} (ratio "
            f"{std / sigma:.3f}); bins {width:.3g} wide"
        )

    return _figure(
        "fig-random-cosines",
        2,
        "Random directions are nearly orthogonal in high dimensions",
        "Cosines of 500 pairs of random Gaussian vectors, as the fraction of pairs in each bin "
        "(bins a quarter of 1/sqrt(d) wide, so every d has the same number of bars), with the "
        "normal curve N(0, 1/d) in orange and dashed lines at ±1/sqrt(d). In 2 dimensions they "
        "spread over [-1, 1]; as d grows they crowd around 0 with standard deviation about "
        "1/sqrt(d), which is why a position vector and a token vector barely interfere.",
        "posemb.lesson.claims.random_cosines(d, 500)",
        "Histogram of cosines that narrows around zero as the dimension slider grows, following "
        "a normal curve of standard deviation 1/sqrt(d).",
        "vega",
        draw,
        [Control("fig-random-cosines-dim", "dimension d", "slider", DIMS, DIMS.index("512"))],
    )


def fig_four_terms(summary: dict[str, Any]) -> Figure:
    """QK^T with additive positions as the sum of four terms, each toggled on or off."""
    lhs, terms = claims.four_terms()
    vmax = max(float(lhs.abs().max()), *(float(t.abs().max()) for t in terms.values()))

    def draw(*switches: str) -> tuple[object, str]:
        on = [n for n, s in zip(claims.FOUR_TERMS, switches, strict=True) if s == "on"]
        total = sum((terms[n] for n in on), torch.zeros_like(lhs))
        rows: list[dict[str, object]] = [
            {"key": j, "query": i, "logit": _r(total[i, j])}
            for i in range(lhs.shape[0])
            for j in range(lhs.shape[1])
        ]
        chart = _heat(
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
        return _spec(chart, rows), f"{shown}: max |QK^T - sum| = {_err(err)}"

    controls = [
        Control(f"fig-four-terms-{name}", name, "toggle", ("off", "on"), 1)
        for name in claims.FOUR_TERMS
    ]
    return _figure(
        "fig-four-terms",
        2,
        "Four terms in every logit",
        "With X + P as input, QK^T = X A X^T + X A P^T + P A X^T + P A P^T (A = W_Q W_K^T): "
        "token-token, token-position, position-token and position-position. Switch terms off "
        "to see what each contributes; all four give QK^T exactly.",
        "posemb.lesson.claims.four_terms()",
        "Heatmap of the 10 x 10 logits built from the chosen terms.",
        "vega",
        draw,
        controls,
    )


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
            {"row": i, "norm": _r(v), "series": name}
            for name, t in series.items()
            for i, v in enumerate(t.tolist())
        ]
        chart = (
            alt.Chart(ROWS)
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
                    scale=_colors(list(series)),
                    legend=alt.Legend(orient="bottom", direction="vertical"),
                ),
                tooltip=["series:N", "row:Q", alt.Tooltip("norm:Q", format=".4f")],
            )
            .properties(width=WIDE - 140, height=240)
        )
        return _spec(chart, rows), (
            f"||PE(p)|| = {_sig(pe.min())} at every p (sqrt(d/2) = {_sig(math.sqrt(d / 2))}, "
            f"spread {_err(float(pe.max() - pe.min()))}); token rows mean "
            f"{_sig(tokens.mean(), 3)}; learned rows mean {_sig(learned.mean(), 3)}"
        )

    return _figure(
        "fig-norms",
        2,
        "How long is a position vector?",
        "Every sinusoidal position vector has the same norm, sqrt(d/2) = 19.6 at d = 768 (one "
        "unit per sin/cos pair): as long as a token row drawn from N(0, 1) and 35 times a "
        "GPT-2-style learned row at initialisation.",
        "posemb.sinusoidal_table(256, 768).norm(dim=-1); posemb.LearnedEmbedding(256, 768)",
        "Three flat bands of norms on a log scale: token rows near 28, sinusoidal exactly 19.6, "
        "learned rows near 0.55.",
        "vega",
        draw,
    )


# --- screen 3: absolute vs rotary, and context extension ----------------------------------------

TABLE_ROWS = 32
LOOKUPS = ("0", "31", "32", "47")


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
                "norm": _r(v.norm()) if isinstance(v, torch.Tensor) else 0.0,
                "row": "has a row" if isinstance(v, torch.Tensor) else "no row: ValueError",
                "chosen": p == pick,
            }
            for p, v in looked.items()
        ]
        base = alt.Chart(ROWS).encode(
            x=alt.X("position:O", title="position", axis=alt.Axis(values=list(range(0, 48, 8)))),
            tooltip=["position:O", alt.Tooltip("norm:Q", format=".4f"), "row:N"],
        )
        bars = base.mark_bar(aria=False).encode(
            y=alt.Y("norm:Q", title="||W_pos[p]||"),
            color=alt.Color(
                "row:N", title=None, scale=_colors(["has a row", "no row: ValueError"])
            ),
            opacity=alt.condition("datum.chosen", alt.value(1.0), alt.value(0.45)),
        )
        missing = (
            base.transform_filter("datum.row != 'has a row'")
            .mark_point(aria=False, shape="cross", size=60, filled=True)
            .encode(y=alt.datum(0), color=alt.value(OKABE_ITO[1]))
        )
        chart = (bars + missing).properties(width=WIDE - 140, height=200)
        v = looked[pick]
        text = (
            f"W_pos[{pick}] = {_vec(v[:4])[:-1]}, ...], norm {float(v.norm()):.4f}"
            if isinstance(v, torch.Tensor)
            else f"position {pick}: {v.split('.')[0]}"
        )
        return _spec(chart, rows), text

    return _figure(
        "fig-learned-no-row",
        3,
        "A learned table ends where it ends",
        f"A learned table of {TABLE_ROWS} rows (GPT-2's initialisation, N(0, 0.02²)) looked up "
        "at positions 0-47: every position past the last row is refused, because there is no "
        "vector to add.",
        f"posemb.LearnedEmbedding({TABLE_ROWS}, 8)(x, positions)",
        "Bars of row norms for positions 0-31 and crosses for 32-47, where the table has no row.",
        "vega",
        draw,
        [Control("fig-learned-no-row-position", "position", "slider", LOOKUPS, 1)],
    )


FACTORS = ("1", "2", "4", "8", "16", "32")
SCALING_DIM, SCALING_BASE, SCALING_LEN = 128, 500000.0, 8192  # Llama 3.1's head and schedule


SCALING_METHODS = ("default", "PI (linear)", "NTK", "YaRN", "Llama 3")
SCALING_DASHES = ([1, 0], [10, 4], [2, 3], [1, 0], [6, 3, 1, 3])
SCALING_WIDTHS = (2, 2, 2.5, 5, 2)  # YaRN wide and under the others: Llama 3 runs along it
SCALING_MIDDLE_PAIR = 32  # the middle pair: where YaRN's and Llama 3's ramps disagree
CHANGED = 1e-9  # relative change of a wavelength that counts as "changed" (float64 rounding)


def fig_scaling(summary: dict[str, Any]) -> Figure:
    """How PI, NTK, YaRN and Llama 3 remap each pair's wavelength at a factor s."""

    def schedules(s: float) -> dict[str, tuple[torch.Tensor, float]]:
        methods: dict[str, scaling.RopeScaling] = {
            "default": scaling.Default(),
            "PI (linear)": scaling.Linear(s),
            "NTK": scaling.NTK(s),
            "YaRN": scaling.Yarn(s, SCALING_LEN),
            "Llama 3": scaling.Llama3(s, 1.0, 4.0, SCALING_LEN),
        }
        return {n: m.compute(SCALING_DIM, SCALING_BASE) for n, m in methods.items()}

    def draw(factor: str) -> tuple[object, str]:
        got = schedules(float(factor))
        default = got["default"][0]
        rows = [
            {
                "pair": i,
                "method": name,
                "wavelength": _r(2 * math.pi / float(inv[i])),
                "ratio": _r(float(default[i] / inv[i])),
                "w": SCALING_WIDTHS[SCALING_METHODS.index(name)],
            }
            # YaRN first: its wide line is drawn under Llama 3's, which runs along it.
            for name, (inv, _) in sorted(got.items(), key=lambda kv: kv[0] != "YaRN")
            for i in range(inv.shape[0])
        ]
        top = max(float(str(r["wavelength"])) for r in rows)
        decades = [10**e for e in range(0, math.ceil(math.log10(top)) + 1)]
        lines = (
            alt.Chart(ROWS)
            .mark_line(aria=False)
            .encode(
                x=alt.X("pair:Q", title="pair i (0 turns fastest)"),
                y=alt.Y(
                    "wavelength:Q",
                    title="wavelength (tokens per turn)",
                    scale=alt.Scale(type="log"),
                    axis=alt.Axis(values=decades, format="~s"),
                ),
                color=alt.Color(
                    "method:N",
                    title="schedule",
                    scale=_colors(SCALING_METHODS),
                    sort=list(SCALING_METHODS),
                ),
                strokeDash=alt.StrokeDash(
                    "method:N",
                    title="schedule",
                    scale=alt.Scale(domain=list(SCALING_METHODS), range=list(SCALING_DASHES)),
                    sort=list(SCALING_METHODS),
                ),
                strokeWidth=alt.StrokeWidth("w:Q", scale=None, legend=None),
                tooltip=[
                    "method:N",
                    "pair:Q",
                    alt.Tooltip("wavelength:Q", format=",.1f"),
                    alt.Tooltip("ratio:Q", title="new / default", format=".3f"),
                ],
            )
        )
        trained = alt.Chart(
            _data([{"y": SCALING_LEN, "label": f"trained length {SCALING_LEN:,} tokens"}])
        ).encode(y="y:Q")
        rule = trained.mark_rule(aria=False, strokeDash=[4, 4], color="gray").encode(
            tooltip=["label:N"]
        )
        label = trained.mark_text(
            aria=False, align="left", baseline="bottom", dx=4, dy=-3, color="gray", fontSize=12
        ).encode(x=alt.datum(0), text="label:N")
        chart = (
            (lines + rule + label)
            .properties(width=WIDE - 140, height=300)
            .configure_axis(grid=True, gridOpacity=0.5)
        )
        last = SCALING_DIM // 2 - 1
        changed = ", ".join(
            f"{name} {int(((inv - default).abs() > CHANGED * default).sum())}"
            for name, (inv, _) in got.items()
            if name != "default"
        )
        mid = ", ".join(
            f"{name} {2 * math.pi / float(inv[SCALING_MIDDLE_PAIR]):,.0f}"
            for name, (inv, _) in got.items()
        )
        yarn_factor = got["YaRN"][1]
        return _spec(chart, rows), (
            f"s = {factor}: pairs changed (of {last + 1}): {changed}; pair "
            f"{SCALING_MIDDLE_PAIR}'s wavelength: {mid}; YaRN attention factor {yarn_factor:.4f}"
        )

    return _figure(
        "fig-scaling",
        3,
        "Stretching RoPE's clocks for longer contexts",
        f"Wavelength of each of the {SCALING_DIM // 2} pairs of a head_dim {SCALING_DIM}, base "
        f"{SCALING_BASE:,.0f} RoPE (Llama 3.1's) after each scaling with factor s, trained "
        f"length {SCALING_LEN} (dashed grey). PI stretches every pair by s; NTK leaves the "
        "fastest pair and stretches the slowest by s; YaRN and Llama 3 keep pairs that turn many "
        "times within the trained length and stretch only the slow ones (the readout counts the "
        "pairs each method changes).",
        f"posemb.scaling.Yarn(s, {SCALING_LEN}).compute({SCALING_DIM}, {SCALING_BASE})",
        "Lines of wavelength (log scale) against pair index for the default schedule and four "
        "scalings, each with its own colour and dash pattern; they fan out as the factor grows.",
        "vega",
        draw,
        [Control("fig-scaling-factor", "scaling factor s", "slider", FACTORS, 3)],
    )


LOSS_PARTS = ("past the training length", "all positions")
SHOWN_VARIANTS = ("learned", "sinusoidal", "nope", "alibi", "rope", "rope+yarn")


def _encoding_colours(variants: Sequence[str]) -> tuple[alt.Scale, alt.Color]:
    """The lab figures' colour per encoding, the same in each of them: the scale (for bands,
    without a legend) and the colour channel of the lines, which carries the legend."""
    # Okabe-Ito without sky blue, which sits too close to blue at a band's opacity.
    palette = [c for c in OKABE_ITO if c != "#56B4E9"]
    scale = alt.Scale(domain=list(variants), range=palette[: len(variants)])
    legend = alt.Legend(symbolType="stroke", symbolStrokeWidth=3, symbolOpacity=1)
    return scale, alt.Color("variant:N", title="encoding", scale=scale, legend=legend)


def fig_lab_loss(summary: dict[str, Any]) -> Figure:
    """The lab's loss against evaluation length, mean and seed spread, from its summary."""
    cfg = summary["config"]
    train_len, lens = int(cfg["train_len"]), [int(n) for n in cfg["eval_lens"]]
    variants = [v for v in summary["results"] if v in SHOWN_VARIANTS] or list(summary["results"])
    unigram = float(summary["unigram_entropy"])

    def cell(variant: str, n: int, part: str) -> tuple[float, float, int] | None:
        e = summary["results"][variant][str(n)]
        # At the training length nothing lies past it: the curve starts from the loss within.
        got = e["past"] if part == "past" and n != train_len else e["all"]
        if not got:
            return None
        return float(got["mean"]), float(got.get("std") or 0.0), int(got.get("n") or 1)

    def draw(which: str) -> tuple[object, str]:
        part = "past" if which == LOSS_PARTS[0] else "all"
        rows = []
        for v in variants:
            for n in lens:
                c = cell(v, n, part)
                if c is not None:
                    m, s, k = c
                    rows.append(
                        {"variant": v, "length": n, "loss": _r(m), "lo": _r(m - s), "hi": _r(m + s)}
                        | {"std": _r(s), "seeds": k}
                    )
        lo = min([r["lo"] for r in rows] + [unigram])
        hi = max([r["hi"] for r in rows] + [unigram])
        y_scale = alt.Scale(domain=[math.floor(lo * 10 - 1) / 10, math.ceil(hi * 10 + 1) / 10])
        x = alt.X(
            "length:Q",
            title="evaluation length (tokens)",
            scale=alt.Scale(type="log", base=2),
            axis=alt.Axis(values=lens),
        )
        colors, line_colour = _encoding_colours(variants)
        # The band takes no legend: its swatches would be the band's pale fill.
        band = (
            alt.Chart(ROWS)
            .mark_area(aria=False, opacity=0.15)
            .encode(
                x=x,
                y=alt.Y("lo:Q", scale=y_scale),
                y2="hi:Q",
                color=alt.Color("variant:N", scale=colors, legend=None),
            )
        )
        line = (
            alt.Chart(ROWS)
            .mark_line(aria=False, strokeWidth=2.5, point=alt.OverlayMarkDef(aria=False, size=50))
            .encode(
                x=x,
                y=alt.Y("loss:Q", title="loss (nats/char)", scale=y_scale),
                color=line_colour,
                tooltip=[
                    "variant:N",
                    "length:Q",
                    alt.Tooltip("loss:Q", format=".3f"),
                    alt.Tooltip("std:Q", format=".3f"),
                    "seeds:Q",
                ],
            )
        )
        marks = alt.Chart(
            _data(
                [
                    {
                        "y": _r(unigram),
                        "x": lens[-1],
                        "label": f"unigram entropy {unigram:.2f} (ignores context)",
                    }
                ]
            )
        )
        rule = marks.mark_rule(aria=False, strokeDash=[4, 4], color="gray").encode(
            y="y:Q", tooltip=["label:N", "y:Q"]
        )
        rule_label = marks.mark_text(
            aria=False, align="right", baseline="bottom", dy=-3, color="gray", fontSize=12
        ).encode(y="y:Q", x="x:Q", text="label:N")
        trained = alt.Chart(_data([{"x": train_len, "label": f"trained at {train_len}"}])).encode(
            x=alt.X("x:Q")
        )
        train_rule = trained.mark_rule(aria=False, color=OKABE_ITO[6], strokeDash=[2, 2]).encode(
            tooltip=["label:N"]
        )
        train_label = trained.mark_text(
            aria=False, align="left", baseline="top", dx=4, y=4, fontSize=12
        ).encode(text="label:N")
        chart = (
            (band + train_rule + train_label + rule + rule_label + line)
            .resolve_legend(color="independent")
            .properties(width=WIDE - 130, height=300)
        )
        longest = lens[-1]
        shown = "; ".join(
            f"{v} {c[0]:.3f} ± {c[1]:.3f}"
            for v in variants
            if (c := cell(v, longest, part)) is not None
        )
        return _spec(chart, rows), (
            f"loss {which} at {longest} tokens (trained at {train_len}): {shown}; unigram "
            f"{unigram:.3f}"
        )

    return _figure(
        "fig-lab-loss",
        3,
        "What the lab measured past the training length",
        f"The lab's {cfg['layers']}-layer character LM trained at {train_len} tokens and "
        f"evaluated longer, per encoding: mean loss over {len(cfg['seeds'])} seeds with the seed "
        "spread (one standard deviation) as a band. Past the training length sinusoidal and "
        "plain RoPE models lose most of what context gave them; ALiBi does not.",
        "posemb.lab.report.default_summary()",
        "Lines of loss against evaluation length (log scale) per encoding, with shaded seed "
        "spread and a dashed unigram line.",
        "vega",
        draw,
        [Control("fig-lab-loss-part", "loss over", "toggle", LOSS_PARTS, 0)],
    )


RETRIEVAL_VIEWS = ("window length", "distance from fact to query")


def fig_lab_retrieval(summary: dict[str, Any]) -> Figure:
    """The lab's retrieval accuracy past the training length, by window length or by the
    distance from the fact to the query, next to chance; from its summary."""
    cfg = summary["config"]
    r = summary.get("retrieval")
    if not r:
        raise InputError(
            "the lab summary has no retrieval results; run `posemb lab` with the retrieval task"
        )
    train_len, lens = int(cfg["train_len"]), [int(n) for n in cfg["eval_lens"]]
    variants = [v for v in r["variants"] if v in SHOWN_VARIANTS] or list(r["variants"])
    chance = float(r["chance"])
    bins = list(next(iter(r["by_distance"].values())))
    colors, line_colour = _encoding_colours(variants)

    def draw(view: str) -> tuple[object, str]:
        rows = []
        for v in variants:
            if view == RETRIEVAL_VIEWS[0]:
                points = [(n, r["variants"][v][str(n)]["anywhere"]) for n in lens]
            else:
                points = [(b, r["by_distance"][v][b]) for b in bins if b in r["by_distance"][v]]
            for at, acc in points:
                m, se = float(acc["mean"]), float(acc.get("se") or 0.0)
                rows.append(
                    {"variant": v, "x": at, "accuracy": _r(m), "se": _r(se)}
                    | {"lo": _r(max(0.0, m - se)), "hi": _r(min(1.0, m + se))}
                )
        if view == RETRIEVAL_VIEWS[0]:
            x = alt.X(
                "x:Q",
                title=f"window length (tokens; trained at {train_len})",
                scale=alt.Scale(type="log", base=2),
                axis=alt.Axis(values=lens),
            )
            far = str(lens[-1])
        else:
            x = alt.X(
                "x:O",
                title="distance from fact to query (tokens; pooled over lengths)",
                sort=bins,
                axis=alt.Axis(labelAngle=0),
            )
            far = bins[-1]
        y = alt.Y("accuracy:Q", title="retrieval accuracy", scale=alt.Scale(domain=[0, 1]))
        band = (
            alt.Chart(ROWS)
            .mark_rule(aria=False, opacity=0.6, strokeWidth=1.5)
            .encode(x=x, y=alt.Y("lo:Q", scale=alt.Scale(domain=[0, 1])), y2="hi:Q")
            .encode(color=alt.Color("variant:N", scale=colors, legend=None))
        )
        line = (
            alt.Chart(ROWS)
            .mark_line(aria=False, strokeWidth=2.5, point=alt.OverlayMarkDef(aria=False, size=50))
            .encode(
                x=x,
                y=y,
                color=line_colour,
                tooltip=[
                    "variant:N",
                    alt.Tooltip("x:N", title=view),
                    alt.Tooltip("accuracy:Q", format=".3f"),
                    alt.Tooltip("se:Q", format=".3f", title="standard error"),
                ],
            )
        )
        marks = alt.Chart(_data([{"y": chance, "label": f"chance {chance:.3f}"}]))
        rule = marks.mark_rule(aria=False, strokeDash=[4, 4], color="gray").encode(
            y="y:Q", tooltip=["label:N", "y:Q"]
        )
        rule_label = marks.mark_text(
            aria=False, align="left", baseline="bottom", dy=-3, x=4, color="gray", fontSize=12
        ).encode(y="y:Q", text="label:N")
        # The x axis starts at the training length and its title names it: no rule there.
        layers = band + rule + rule_label + line
        chart = layers.resolve_legend(color="independent").properties(width=WIDE - 130, height=300)
        if view == RETRIEVAL_VIEWS[0]:
            shown = "; ".join(
                f"{v} {r['variants'][v][far]['anywhere']['mean']:.2f}" for v in variants
            )
            where = f"at {far} tokens (trained at {train_len})"
        else:
            shown = "; ".join(
                f"{v} {r['by_distance'][v][far]['mean']:.2f}"
                for v in variants
                if far in r["by_distance"][v]
            )
            where = f"with the fact {far} tokens before the query"
        return _spec(chart, rows), f"retrieval accuracy {where}: {shown}; chance {chance:.3f}"

    return _figure(
        "fig-lab-retrieval",
        3,
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
        "vega",
        draw,
        [Control("fig-lab-retrieval-by", "accuracy by", "toggle", RETRIEVAL_VIEWS, 0)],
    )


# --- screens 4, 5, 7: the rotation and its dials ----------------------------------------------

TOY_THETA = math.pi / 4  # the lesson's toy angle per step
MN = tuple(str(i) for i in range(7))


def fig_dials_mn(summary: dict[str, Any]) -> Figure:
    """A query at m and a key at n on one dial; their logit depends on m - n only."""
    # One random 2D vector as both query and key (as in the lesson's trace, q = k): the angle
    # between the hands is then (m - n) theta itself.
    q = torch.randn(2, generator=torch.Generator().manual_seed(41), dtype=F64)
    k = q
    theta = torch.tensor([TOY_THETA], dtype=F64)

    def draw(m_s: str, n_s: str) -> tuple[object, str]:
        m, n = int(m_s), int(n_s)
        qm = rope.rotation_matrix(m, theta) @ q
        kn = rope.rotation_matrix(n, theta) @ k
        logit = float(qm @ kn)
        cx, cy, r = 120, 120, 90
        aq, ak = _angle(qm), _angle(kn)
        # Hands of fixed length: the angle between them is what moves; the lengths
        # (||q||, ||k||, unchanged by rotation) are written beside the dial.
        between = math.degrees((aq - ak) % (2 * math.pi))
        body = [
            _dial_face(cx, cy, r),
            _arc(cx, cy, 30, ak, aq if aq > ak else aq + 2 * math.pi, OKABE_ITO[2]),
            _hand(cx, cy, r, aq, OKABE_ITO[0]),
            _hand(cx, cy, r * 0.75, ak, OKABE_ITO[1]),
            f'<text x="250" y="40" fill="{OKABE_ITO[0]}">query R_m q, m = {m}</text>',
            f'<text x="250" y="60" fill="{OKABE_ITO[1]}">key R_n k, n = {n}</text>',
            f'<text x="250" y="90">m - n = {m - n}</text>',
            f'<text x="250" y="110" fill="{OKABE_ITO[2]}">angle between {between:.1f}°</text>',
            f'<text x="250" y="130">logit = {logit:.4f}</text>',
            f'<text x="250" y="160" font-size="10">q = k = {_vec(q)}</text>',
        ]
        svg = _svg(
            430, 240, f"Dial with the query turned to m = {m} and the key to n = {n}", "".join(body)
        )
        return svg, f"m = {m}, n = {n}, m - n = {m - n}: <R_m q, R_n k> = {logit:.6f}"

    return _figure(
        "fig-dials-mn",
        4,
        "Turn both hands by the same amount: the logit stays",
        "One 2D vector (random, fixed) as query at position m and as key at position n, turned "
        "by theta = pi/4 per step. Moving m and n together turns both hands alike; the angle "
        "between them, and so the logit q^T R_(n-m) k, stays the same.",
        "posemb.rotation_matrix(m, torch.tensor([math.pi / 4])) @ q",
        "A dial with two hands, query and key; the logit shown depends only on m - n.",
        "svg",
        draw,
        [
            Control("fig-dials-m", "query position m", "slider", MN, 3),
            Control("fig-dials-n", "key position n", "slider", MN, 1),
        ],
    )


TRACE_STEPS = (
    "1 start: q = k = [1, 0]",
    "2 turn q to m = 3",
    "3 turn k to n = 1",
    "4 the angle between",
    "5 the dot product",
)


def fig_toy_trace(summary: dict[str, Any]) -> Figure:
    """The lesson's toy trace: theta = pi/4, m = 3, n = 1, q = k = [1, 0]."""
    theta = torch.tensor([TOY_THETA], dtype=F64)
    e1 = torch.tensor([1.0, 0.0], dtype=F64)
    q3 = rope.rotation_matrix(3, theta) @ e1
    k1 = rope.rotation_matrix(1, theta) @ e1
    dot = float(q3 @ k1)
    between = math.degrees(_angle(q3) - _angle(k1))

    def draw(step: str) -> tuple[object, str]:
        i = TRACE_STEPS.index(step)
        cx, cy, r = 120, 120, 90
        qv, kv = (e1 if i < 1 else q3), (e1 if i < 2 else k1)
        body = [_dial_face(cx, cy, r)]
        if i >= 3:
            body.append(_arc(cx, cy, 34, _angle(kv), _angle(qv), OKABE_ITO[2]))
        body.append(_hand(cx, cy, r, _angle(qv), OKABE_ITO[0]))
        body.append(_hand(cx, cy, r * 0.8, _angle(kv), OKABE_ITO[1]))
        lines = [
            (OKABE_ITO[0], f"q = {_vec(qv)}"),
            (OKABE_ITO[1], f"k = {_vec(kv)}"),
            ("currentColor", "theta = pi/4 per step"),
        ]
        readout = [
            f"q = k = {_vec(e1)}, theta = {TOY_THETA:.6f} rad",
            f"R_3 q = {_vec(q3)} ({math.degrees(_angle(q3)):.1f}°)",
            f"R_1 k = {_vec(k1)} ({math.degrees(_angle(k1)):.1f}°)",
            f"angle between = {between:.1f}° = (3 - 1) x 45°",
            f"<R_3 q, R_1 k> = {dot:.1e}"
            + (" (0 up to float64 rounding)" if abs(dot) < claims.EXACT else ""),
        ][i]
        if i >= 3:
            lines.append(("currentColor", f"between: {between:.1f}°"))
        if i >= 4:
            lines.append(("currentColor", f"dot product = {dot:.1e}"))
        body.extend(
            f'<text x="250" y="{40 + 22 * j}" fill="{c}">{escape(t)}</text>'
            for j, (c, t) in enumerate(lines)
        )
        return _svg(470, 240, f"Toy trace, step {step}", "".join(body)), readout

    return _figure(
        "fig-toy-trace",
        5,
        "The lesson's toy trace, one step at a time",
        "theta = pi/4, q = k = [1, 0]: the query turns to 135° at m = 3, the key to 45° at n = 1; "
        "90° apart, their dot product is 0 (to float64 rounding).",
        "posemb.rotation_matrix(3, torch.tensor([math.pi / 4])) @ q",
        "A dial on which the query and key hands turn step by step to 135 and 45 degrees.",
        "svg",
        draw,
        [Control("fig-toy-trace-step", "step", "slider", TRACE_STEPS, 0)],
    )


HEAD_DIMS = ("64", "128")
DIAL_POSITIONS = ("1", "2", "3", "10", "100", "1000", "10000")


def fig_pair_dials(summary: dict[str, Any]) -> Figure:
    """One dial per rotated pair of a head, each turned to position m."""

    def draw(head_dim: str, position: str) -> tuple[object, str]:
        hd, m = int(head_dim), int(position)
        a = freqs.angles(m, freqs.inv_freq(hd, dtype=F64))  # (hd/2,) in [0, 2 pi)
        per_row, r, gap = 16, 13, 34
        body = []
        for i, ang in enumerate(a.tolist()):
            cx, cy = 20 + (i % per_row) * gap, 20 + (i // per_row) * gap
            body.append(
                f'<circle cx="{cx}" cy="{cy}" r="{r}" fill="none" stroke="currentColor" '
                f'stroke-opacity="0.5"/>'
            )
            body.append(_hand(cx, cy, r - 2, ang, OKABE_ITO[0], width=1.5))
        rows = -(-len(a) // per_row)
        body.append(
            f'<text x="4" y="{rows * gap + 22}" font-size="11">pair 0 top left, pair '
            f"{len(a) - 1} bottom right; m = {m}</text>"
        )
        svg = _svg(
            per_row * gap + 8,
            rows * gap + 30,
            f"{len(a)} dials, the pairs of a head of {hd} channels, at position {m}",
            "".join(body),
        )
        return svg, (
            f"{len(a)} pairs (head_dim {hd}); at m = {m}: pair 0 at "
            f"{math.degrees(float(a[0])):.1f}°, pair {len(a) - 1} at "
            f"{math.degrees(float(a[-1])):.4f}°"
        )

    return _figure(
        "fig-pair-dials",
        5,
        "The clock tower has head_dim/2 dials, not 384",
        "Every rotated pair of one attention head as a dial at position m. RoPE turns each head "
        "separately, so a head has head_dim/2 pairs: 32 for GPT-2-sized heads (768 / 12 = 64 "
        "channels), 64 for Llama's 128. The lesson's 384 pairs is d_model/2 for d_model = 768, "
        "the count for a sinusoidal table, not for RoPE.",
        "posemb.angles(m, posemb.inv_freq(head_dim))",
        "A grid of small dials; the first turn visibly with position, the last barely move.",
        "svg",
        draw,
        [
            Control("fig-pair-dials-head-dim", "head_dim", "toggle", HEAD_DIMS, 0),
            Control("fig-pair-dials-position", "position m", "slider", DIAL_POSITIONS, 2),
        ],
    )


LOGIT_ENCODINGS = ("RoPE", "additive sinusoidal")


def fig_logit_mn(summary: dict[str, Any]) -> Figure:
    """Logit of a fixed query and key over (m, n): RoPE gives stripes of constant m - n."""
    n_pos, d = 24, 16
    g = torch.Generator().manual_seed(42)
    q, k = torch.randn(2, d, generator=g, dtype=F64)
    pos = torch.arange(n_pos)
    rotary = rope.RotaryEmbedding(d)

    def draw(encoding: str) -> tuple[object, str]:
        if encoding == "RoPE":
            rq = rotary.rotate(q.expand(1, 1, n_pos, d), pos)[0, 0]
            rk = rotary.rotate(k.expand(1, 1, n_pos, d), pos)[0, 0]
        else:
            pe = absolute.sinusoidal_table(n_pos, d, dtype=F64)
            rq, rk = q + pe, k + pe
        logits = rq @ rk.T  # (m, n)
        rows: list[dict[str, object]] = [
            {"n": j, "m": i, "logit": _r(logits[i, j])} for i in range(n_pos) for j in range(n_pos)
        ]
        chart = _heat(
            rows,
            "n",
            "m",
            "logit",
            titles=("key position n", "query position m", "logit"),
            size=(288, 288),
            tick_every=4,
        )
        return _spec(chart, rows), (
            f"logit(m=10, n=3) = {float(logits[10, 3]):.6f}; "
            f"logit(m=20, n=13) = {float(logits[20, 13]):.6f}"
        )

    return _figure(
        "fig-logit-mn",
        7,
        "The carousel: only m - n matters",
        "The logit of one fixed query and key (d = 16) placed at every query position m and key "
        "position n. With RoPE each diagonal (constant m - n) has one colour: the carousel's "
        "turn cancels. With the sinusoids added instead, the pattern depends on m and n "
        "themselves.",
        "posemb.RotaryEmbedding(16).rotate(q, positions)",
        "24 x 24 heatmap of logits; diagonal stripes for RoPE, no clean stripes for additive.",
        "vega",
        draw,
        [Control("fig-logit-mn-encoding", "positions", "toggle", LOGIT_ENCODINGS, 0)],
    )


# --- screens 6 and 8: harmonics, Givens blocks ---------------------------------------------------

WAVE_PAIRS = ("0", "32", "128", "383")  # the lesson's channels on its harmonics screen


WAVE_RANGES = {"0-128": 128, "0-1,024": 1024, "0-65,536": 65536}
WAVE_SAMPLES = 256  # points per panel at most: a wider range samples every k-th position
WAVE_MIN_SAMPLES = 6  # per turn: a pair that turns faster is drawn as a band, not aliased


def fig_waves(summary: dict[str, Any]) -> Figure:
    """sin and cos of the lesson's four pairs (d = 768), stacked, over a chosen range."""
    d = 768
    pairs = [int(p) for p in WAVE_PAIRS]
    lam = freqs.wavelengths(d)
    titles = {i: f"pair {i}: wavelength {_sig(lam[i])} tokens" for i in pairs}

    header = " : ".join(f"datum.value == {i} ? '{titles[i]}'" for i in pairs) + " : ''"

    def draw(span: str) -> tuple[object, str]:
        n = WAVE_RANGES[span]
        step = max(1, n // WAVE_SAMPLES)
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
                {"pair": i, "p": int(p), "v": _r(table[j, 2 * i + c], 3), "c": name}
                for c, name in ((0, "sin"), (1, "cos"))
                for j, p in enumerate(pos.tolist())
            ]
        x = alt.X("p:Q", title="position", scale=alt.Scale(domain=[0, n], nice=False))
        lines = (
            alt.Chart()
            .transform_filter("datum.k != 'band'")
            .mark_line(aria=False, strokeWidth=1.5, clip=True)
            .encode(
                x=x,
                y=alt.Y("v:Q", title="PE", scale=alt.Scale(domain=[-1, 1])),
                color=alt.Color(
                    "c:N",
                    title=None,
                    scale=_colors(["sin", "cos"]),
                    legend=alt.Legend(
                        orient="top",
                        direction="horizontal",
                        labelExpr="datum.label == 'sin' ? 'sin (channel 2i)' "
                        ": 'cos (channel 2i+1)'",
                    ),
                ),
                tooltip=["pair:N", alt.Tooltip("p:Q", title="position"), "c:N", "v:Q"],
            )
        )
        band = (
            alt.Chart()
            .transform_filter("datum.k == 'band'")
            .mark_area(aria=False, color=OKABE_ITO[7], opacity=0.35)
            .encode(x=x, y="lo:Q", y2="hi:Q", tooltip=["pair:N", "note:N"])
        )
        note = (
            alt.Chart()
            .transform_filter("datum.k == 'band' && datum.p == 0")
            .mark_text(aria=False, align="left", dx=6, fontSize=12)
            .encode(x=x, y=alt.datum(0), text="note:N")
        )
        chart = (
            alt.layer(band, note, lines, data=ROWS)
            .properties(width=WIDE - 60, height=64)
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
        drawn = ", ".join(f"pair {i} {_sig(lam[i])}" for i in pairs)
        shown = f"positions 0-{n:,}"
        if fast:
            which = ", ".join(map(str, fast))
            shown += f" (pair{'s' if len(fast) > 1 else ''} {which} too fast to draw)"
        return _spec(chart, rows), f"{shown}; wavelengths in tokens: {drawn}"

    return _figure(
        "fig-waves",
        6,
        "The hands of the grandfather clock",
        "The sine and cosine channels of the lesson's four pairs of the d = 768 sinusoidal table "
        "on one position axis: pair 0 repeats every 2 pi = 6.28 tokens; pair 383 has a "
        "wavelength of 61,342.74 tokens and hardly moves in 128 positions. Widen the range to "
        "watch the slow pairs turn (a pair too fast to draw at the range is a grey band).",
        "posemb.sinusoidal_table(positions, 768); posemb.wavelengths(768)",
        "Four stacked panels of sine and cosine waves, pairs 0, 32, 128 and 383, each titled "
        "with its wavelength; the range slider widens the shared position axis.",
        "vega",
        draw,
        [Control("fig-waves-range", "positions", "slider", tuple(WAVE_RANGES), 0)],
    )


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
            {"position": int(p), "error": _r(e), "method": name}
            for name, t in errs.items()
            for p, e in zip(pos.tolist(), t.tolist(), strict=True)
            if e > 0  # a log axis has no zero; an exact cos is simply not drawn
        ]
        chart = (
            alt.Chart(ROWS)
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
                    scale=_colors(list(errs)),
                    legend=alt.Legend(orient="top"),
                ),
                tooltip=["method:N", "position:Q", alt.Tooltip("error:Q", format=".2e")],
            )
            .properties(width=WIDE - 140, height=240)
        )
        at = pos.tolist().index(2**20)
        shown = "; ".join(f"{name} {float(t[at]):.1e}" for name, t in errs.items())
        return _spec(chart, rows), f"at position 2^20: {shown}"

    return _figure(
        "fig-float32-angles",
        6,
        "The sinusoids are defined everywhere; float32 angles are not",
        "Largest cos error over the 64 pairs of a head_dim 128 table, against an exact float64 "
        "reference. A float32 product position x inv_freq loses digits as positions grow "
        "(about 0.03 at 2^20); posemb forms angles in float64 and stays at float32 rounding.",
        "posemb.cos_sin(positions, posemb.inv_freq(128, dtype=torch.float64))",
        "Two lines of error against position (log-log): one rising to 1e-2, one flat near 1e-7.",
        "vega",
        draw,
    )


FORM_POSITIONS = ("0", "3", "250", "65537", "1048576")
FORMS = ("elementwise (apply_rope)", "Givens matrix (rotation_matrix)", "complex (rope_complex)")


def fig_three_forms(summary: dict[str, Any]) -> Figure:
    """The elementwise, matrix and complex forms of RoPE on one vector."""
    d = 8
    x = torch.randn(1, 1, 1, d, generator=torch.Generator().manual_seed(43), dtype=F64)
    theta = freqs.inv_freq(d, dtype=F64)

    def draw(position: str) -> tuple[object, str]:
        m = int(position)
        cos, sin = freqs.cos_sin(torch.tensor([m]), theta, dtype=F64)
        outs = {
            FORMS[0]: rope.apply_rope(x, cos, sin)[0, 0, 0],
            FORMS[1]: rope.rotation_matrix(m, theta) @ x[0, 0, 0],
            FORMS[2]: rope.rope_complex(x, torch.tensor([m]), theta)[0, 0, 0],
        }
        rows = [
            {"channel": c, "value": _r(v, 6), "form": name}
            for name, t in outs.items()
            for c, v in enumerate(t.tolist())
        ]
        chart = (
            alt.Chart(ROWS)
            .mark_point(aria=False, filled=True, size=70)
            .encode(
                x=alt.X("channel:O", title="channel"),
                xOffset=alt.XOffset("form:N", sort=list(FORMS)),
                y=alt.Y("value:Q", title="R_m x"),
                color=alt.Color("form:N", title=None, scale=_colors(list(FORMS))),
                shape=alt.Shape("form:N", legend=None, sort=list(FORMS)),
                tooltip=["form:N", "channel:O", alt.Tooltip("value:Q", format=".6f")],
            )
            .properties(width=WIDE - 140, height=220)
        )
        err = max(float((outs[FORMS[0]] - t).abs().max()) for t in outs.values())
        return _spec(chart, rows), (
            f"m = {m}: max difference between the three forms = {_err(err)}"
        )

    return _figure(
        "fig-three-forms",
        8,
        "Three ways to write one rotation",
        "One vector (d = 8) rotated to position m three ways: elementwise cos/sin as kernels do "
        "it, the block-diagonal Givens matrix of the paper, and multiplication by e^(i m theta) "
        "in the complex plane. The three agree to float64 rounding.",
        "posemb.apply_rope(x, cos, sin); posemb.rotation_matrix(m, theta); "
        "posemb.rope_complex(x, [m], theta)",
        "Three markers per channel at the same height: the forms agree.",
        "vega",
        draw,
        [Control("fig-three-forms-position", "position m", "slider", FORM_POSITIONS, 2)],
    )


LAYOUTS = ("rotate_half (HALF)", "interleaved (INTERLEAVED)")
GIVENS_POSITIONS = ("1", "3", "10", "100", "1000")  # at d = 16 the slow pairs turn visibly
# only from m ~ 100 on (pair 7 turns 1e-4 rad per step)


def fig_givens(summary: dict[str, Any]) -> Figure:
    """The block-diagonal rotation matrix R_m in both channel pairings."""
    d = 16
    theta = freqs.inv_freq(d, dtype=F64)

    def draw(layout: str, position: str) -> tuple[object, str]:
        lay = rope.Layout.HALF if layout == LAYOUTS[0] else rope.Layout.INTERLEAVED
        r = rope.rotation_matrix(int(position), theta, lay)
        # Which channels each pair rotates together: (2p, 2p+1) interleaved, (p, p + d/2) half.
        partner = {}
        for p in range(d // 2):
            a, b = (p, p + d // 2) if lay == rope.Layout.HALF else (2 * p, 2 * p + 1)
            partner[a], partner[b] = (p, b), (p, a)
        # Only the entries a pair owns: every other entry is exactly 0 and stays blank (a quarter
        # of the page's bytes for this figure, and a blank reads as "nothing" at a glance).
        rows: list[dict[str, object]] = [
            {"column": j, "row": i, "R": _r(r[i, j], 3)}
            for i in range(d)
            for j in (i, partner[i][1])
        ]
        heat = _heat(
            rows,
            "column",
            "row",
            "R",
            titles=("column", "row", "R_m"),
            size=(320, 320),
            domain=(-1.0, 1.0),
            tick_every=1,
        )
        blocks = _data(
            [
                {
                    "column": j,
                    "row": i,
                    "pair": f"pair {partner[i][0]}: channels {i}, {partner[i][1]}",
                }
                for i in range(d)
                for j in (i, partner[i][1])
            ]
        )
        outline = (
            alt.Chart(blocks)
            .mark_rect(aria=False, fill=None, stroke=OKABE_ITO[6], strokeWidth=1.5)
            .encode(x="column:O", y="row:O", tooltip=["pair:N"])
        )
        chart = heat + outline
        det = float(torch.linalg.det(r))
        orth = float((r.T @ r - torch.eye(d, dtype=F64)).abs().max())
        return _spec(chart, rows), (
            f"det R_m = {det:.6f} (error {abs(det - 1):.1e}); max |R_m^T R_m - I| = {_err(orth)}"
        )

    return _figure(
        "fig-givens",
        8,
        "The ballroom: 2 x 2 blocks on the diagonal",
        "R_m for d = 16 (base 10,000): one 2 x 2 rotation per pair, blank cells are exactly 0; "
        "the outlined cells are each pair's four entries. Interleaved pairing (RoFormer, GPT-J, "
        "Meta's Llama code) puts the blocks on the diagonal; rotate_half (GPT-NeoX, Hugging "
        "Face Llama) pairs channel j with j + 8, the same rotation with channels reordered. At "
        "m = 1 the slow pairs barely turn and R_m looks like the identity; at m = 100 or 1000 "
        "they visibly do.",
        "posemb.rotation_matrix(m, posemb.inv_freq(16), layout)",
        "16 x 16 heatmap of the rotation matrix with each pair's entries outlined: diagonal "
        "2 x 2 blocks, or two offset diagonals for rotate_half.",
        "vega",
        draw,
        [
            Control("fig-givens-layout", "pairing", "toggle", LAYOUTS, 1),
            Control("fig-givens-position", "position m", "slider", GIVENS_POSITIONS, 2),
        ],
    )


LESSON_PERIODS = {"lesson: 'every 2 steps'": 2.0, "lesson: 'every 10,000 steps'": 10000.0}


def fig_periods(summary: dict[str, Any]) -> Figure:
    """The period of every pair at d = 768 against the lesson's "2" and "10,000"."""
    d = 768
    lam = freqs.wavelengths(d)

    def draw() -> tuple[object, str]:
        rows = [{"pair": i, "period": _r(v)} for i, v in enumerate(lam.tolist())]
        # Points, not bars: a bar needs a baseline, and a log axis has no zero.
        bars = (
            alt.Chart(ROWS)
            .mark_point(aria=False, filled=True, size=10)
            .encode(
                x=alt.X("pair:Q", title="pair i", scale=alt.Scale(domain=[0, d // 2])),
                y=alt.Y("period:Q", title="period (steps per turn)", scale=alt.Scale(type="log")),
                tooltip=["pair:Q", alt.Tooltip("period:Q", format=",.2f")],
            )
        )
        refs = alt.Chart(
            _data([{"label": k, "period": v} for k, v in LESSON_PERIODS.items()])
        ).encode(y="period:Q")
        rules = refs.mark_rule(aria=False, color=OKABE_ITO[1], strokeDash=[5, 3]).encode(
            tooltip=["label:N"]
        )
        labels = refs.mark_text(aria=False, align="left", dx=4, dy=-6, color=OKABE_ITO[1]).encode(
            text="label:N", x=alt.datum(0)
        )
        chart = (bars + rules + labels).properties(width=WIDE - 140, height=240)
        return _spec(chart, rows), (
            f"fastest pair: {float(lam[0]):.6f} steps per turn; slowest: {float(lam[-1]):,.1f}"
        )

    return _figure(
        "fig-periods",
        8,
        "How fast the couples spin",
        "Steps per full turn for each of the 384 pairs at d = 768. The fastest turns once per "
        "2 pi = 6.28 steps, not every 2; the slowest once per 61,342.7 steps, not 10,000: the "
        "dashed lines are the lesson's numbers.",
        "posemb.wavelengths(768)",
        "384 points rising on a log scale from 6.28 to 61,343, with dashed lines at 2 and 10,000.",
        "vega",
        draw,
    )


# --- screen 9: learned vs sinusoidal at scale ----------------------------------------------------


def fig_param_counts(summary: dict[str, Any]) -> Figure:
    """Parameters each encoding adds to the lab's LM."""
    counts = claims.param_counts()
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
        bars = base.mark_bar(aria=False, color=OKABE_ITO[0]).encode(
            x=alt.X("extra:Q", title=f"parameters beyond NoPE's {nope:,}")
        )
        # A bar of 0 (or 512 beside 131,072) has no width to see: every bar says its number.
        zero = base.mark_tick(aria=False, color=OKABE_ITO[0], thickness=2).encode(x=alt.datum(0))
        values = base.mark_text(aria=False, align="left", dx=5, fontSize=12).encode(
            x="extra:Q", text="label:N"
        )
        chart = alt.layer(bars, zero, values, data=ROWS).properties(width=WIDE - 200, height=240)
        shown = ", ".join(f"{e} +{n - nope:,}" for e, n in counts.items() if e != "nope")
        return _spec(chart, rows), f"beyond NoPE's {nope:,}: {shown}"

    return _figure(
        "fig-param-counts",
        9,
        "What each encoding costs in parameters",
        "Parameters of the lab's character LM (width 128, 4 layers, 1,024 positions) beyond the "
        "same model without positions. A learned table adds L_max x D; sinusoids, RoPE, xPos "
        "and ALiBi add none; T5 buckets and FIRE a few.",
        "posemb.lesson.claims.param_counts()",
        "Horizontal bars, each labelled with its count: learned far ahead at +131,072, T5 and "
        "FIRE a few hundred, the others 0.",
        "vega",
        draw,
    )


def fig_learned_gradients(summary: dict[str, Any]) -> Figure:
    """Gradient norm of each learned row after a step on 16-token windows."""
    window = 16
    norms = claims.learned_row_gradient_norms(window)

    def draw() -> tuple[object, str]:
        kinds = ["within the training window", "past it"]
        rows = [
            {"row": i, "grad": _r(v), "where": kinds[i >= window]}
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
            .mark_bar(aria=False, color=OKABE_ITO[0])
            .encode(x=x, y=alt.Y("grad:Q", title="gradient norm"), tooltip=tip)
        )
        # A zero bar has no height: rows without gradient get a marker on the axis.
        zeros = (
            alt.Chart()
            .transform_filter("datum.grad == 0")
            .mark_point(aria=False, shape="diamond", filled=True, size=40, color=OKABE_ITO[1])
            .encode(x=x, y="grad:Q", tooltip=tip)
        )
        top = _r(float(norms.max()))
        past = [i for i, v in enumerate(norms.tolist()) if i >= window and v == 0]
        notes = (
            alt.Chart(
                _data(
                    [
                        {
                            "row": past[len(past) // 2] if past else window,
                            "y": _r(top * 0.12),
                            "label": f"rows {window}-{len(norms) - 1}: exactly 0"
                            if len(past) == len(norms) - window
                            else f"{len(past)} rows past the window: exactly 0",
                        }
                    ]
                )
            )
            .mark_text(aria=False, fontSize=13, color=OKABE_ITO[1])
            .encode(x=alt.X("row:O"), y="y:Q", text="label:N")
        )
        chart = alt.layer(bars, zeros, notes, data=ROWS).properties(width=WIDE - 100, height=220)
        late = float(norms[window:].max())
        return _spec(chart, rows), (
            f"smallest gradient norm of rows 0-{window - 1}: {float(norms[:window].min()):.3g}; "
            f"largest of rows {window}-{len(norms) - 1}: "
            + ("exactly 0" if late == 0 else f"{late:.3g}")
        )

    return _figure(
        "fig-learned-gradients",
        9,
        "Rows past the training length never learn",
        f"One training step of the lab's LM with a 64-row learned table on {window}-token "
        "windows: every row a window covers gets a gradient, every row past it exactly zero. "
        "Those rows stay at their random initialisation.",
        f"posemb.lesson.claims.learned_row_gradient_norms({window})",
        "Bars of gradient norm for rows 0-15 and diamonds at zero, labelled exactly 0, for "
        "rows 16-63.",
        "vega",
        draw,
    )


# --- the registry ---------------------------------------------------------------------------------

BUILDERS: dict[str, Callable[[dict[str, Any]], Figure]] = {
    "fig-blender": fig_blender,
    "fig-permutation": fig_permutation,
    "fig-causal-same-token": fig_causal_same_token,
    "fig-counting": fig_counting,
    "fig-trained-attention": fig_trained_attention,
    "fig-trained-accuracy": fig_trained_accuracy,
    "fig-sinusoidal-table": fig_sinusoidal_table,
    "fig-offset-cosine": fig_offset_cosine,
    "fig-random-cosines": fig_random_cosines,
    "fig-four-terms": fig_four_terms,
    "fig-norms": fig_norms,
    "fig-learned-no-row": fig_learned_no_row,
    "fig-scaling": fig_scaling,
    "fig-lab-loss": fig_lab_loss,
    "fig-lab-retrieval": fig_lab_retrieval,
    "fig-dials-mn": fig_dials_mn,
    "fig-toy-trace": fig_toy_trace,
    "fig-pair-dials": fig_pair_dials,
    "fig-waves": fig_waves,
    "fig-float32-angles": fig_float32_angles,
    "fig-logit-mn": fig_logit_mn,
    "fig-three-forms": fig_three_forms,
    "fig-givens": fig_givens,
    "fig-periods": fig_periods,
    "fig-param-counts": fig_param_counts,
    "fig-learned-gradients": fig_learned_gradients,
}
"""Every figure's builder by id; :func:`build_figures` returns them in screen order."""


TRAINED = "fig-trained-attention"  # needs the ~5 s training of a small encoder
READS_CLAIMS = {"fig-trained-accuracy": fig_trained_accuracy}
"""Builders that also take ``posemb verify``'s rows (``claim_rows``)."""


def _build(id: str, lab: dict[str, Any], claim_rows: Sequence[dict[str, Any]] | None) -> Figure:
    if id in READS_CLAIMS:
        return READS_CLAIMS[id](lab, claim_rows)
    return BUILDERS[id](lab)


def _render_jobs(
    figure: Figure, pool: concurrent.futures.Executor
) -> list[tuple[Figure, str, concurrent.futures.Future[str]]]:
    """Queue vl-convert renders of every state of a "vega" figure."""
    if figure.kind != "vega":
        return []
    return [
        (figure, key, pool.submit(vl_convert.vegalite_to_svg, spec))
        for key, spec in figure.states.items()
        if isinstance(spec, dict)
    ]


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
    with concurrent.futures.ThreadPoolExecutor(_workers() + 1) as pool:
        training = pool.submit(_trained_rope_encoder)
        figures, jobs = [], []
        for id in BUILDERS:
            if id != TRAINED:
                figures.append(_build(id, lab, claim_rows))
                jobs += _render_jobs(figures[-1], pool)
        training.result()
        figures.append(BUILDERS[TRAINED](lab))
        jobs += _render_jobs(figures[-1], pool)
        for fig, key, job in jobs:
            fig.static_svg[key] = job.result()
    order = list(BUILDERS)
    return sorted(figures, key=lambda f: (f.screen, order.index(f.id)))


__all__ = [
    "BUILDERS",
    "Control",
    "Figure",
    "build_figure",
    "build_figures",
    "state_key",
]
