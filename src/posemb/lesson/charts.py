"""Vega-Lite charts for the lesson's figures (built with Altair), and numbers for a reader.

Altair is imported on first use, not when a screen module is imported: ``posemb verify``
registers every screen (its claims and its figure builders) without the ``lesson`` extra, and
only building a figure needs Altair.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from .. import _extras, _renamed
from ..lab import style
from .measure import EXACT

if TYPE_CHECKING:
    import altair as alt
else:

    class _Altair:
        """altair, imported when a chart is first built (a missing extra is named then)."""

        def __getattr__(self, name: str) -> Any:
            module = _extras.require("altair", "posemb's lesson figures", "lesson")
            return getattr(module, name)

    alt = _Altair()

INK = tuple(light for light, _ in style.INK.values())
"""Okabe & Ito's hues (2008, "Color Universal Design", distinguishable with every common colour
vision deficiency) at 4.5:1 on the figure card, in their order: blue, vermillion, green, pink,
orange, sky, black, grey, yellow (:data:`posemb.lab.style.INK`; the page swaps each for its
dark-mode partner)."""


DIVERGING = "blueorange"  # Vega's blue-orange ramp: no red-green contrast


SEQUENTIAL = "viridis"  # perceptually uniform and colour-blind safe


WIDE = 820
"""Plot width of a full-width chart: the page shows figures in a ~930 px card."""


def sig(x: float | torch.Tensor, digits: int = 4) -> str:
    """``x`` for a reader: ``digits`` significant digits, thousands separated, no exponent
    between 1e-3 and 1e15 (61,343 rather than 6.134e+04)."""
    x = float(x)
    if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e15):
        return f"{x:.{digits - 1}e}"
    if abs(x) >= 10 ** (digits - 1):
        return f"{x:,.0f}"
    return f"{rounded(x, digits):,g}"


def zero_error(x: float) -> str:
    """A difference that should be zero: its size, and whether it is float64 rounding."""
    return f"{x:.1e}" + (" (equal up to float64 rounding)" if x < EXACT else "")


FONTS = {
    "axis": {"labelFontSize": 12, "titleFontSize": 13},
    "legend": {"labelFontSize": 12, "titleFontSize": 12, "labelLimit": 0},
    "header": {"labelFontSize": 13, "titleFontSize": 13},
    "title": {"fontSize": 14},
    "text": {"fontSize": 12},
}
"""Every Vega chart's type sizes: at least 12 px, as the page's card shows them at 1:1."""


def rounded(x: float | torch.Tensor, digits: int = 4) -> float:
    """``x`` to ``digits`` significant digits: what a chart can show, and a small page."""
    return float(f"{float(x):.{digits}g}")


ROWS_NAME = "rows"
"""The named data source a chart's rows go into: :func:`spec` puts them in, inline, once
Altair is done. Altair walks and copies every row it is given (tens of ms per state), and the
page has ~80 states."""


@functools.cache
def rows_source() -> alt.Data:
    """The data source every chart is built on (:data:`ROWS_NAME`), filled by :func:`spec`."""
    return alt.Data(name=ROWS_NAME)


def template(chart: alt.TopLevelMixin) -> dict[str, Any]:
    """The chart's Vega-Lite spec with its rows still to come (see :data:`ROWS_NAME`)."""
    # Schema validation costs more than building and checks what a test checks once. (Every
    # mark is built with aria=False: an aria label per mark doubles the SVG of a heatmap or
    # scatter, and the figure's alt text and hover tooltips carry the values.)
    return chart.to_dict(validate=False)


def spec(chart: alt.TopLevelMixin | dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The spec of ``chart`` (a chart or a :func:`template`) with ``rows`` inlined as its data."""
    out = template(chart) if isinstance(chart, alt.TopLevelMixin) else chart

    def fill(node: Any) -> Any:
        if isinstance(node, dict):
            if node == {"name": ROWS_NAME}:
                return {"values": rows}
            return {k: fill(v) for k, v in node.items()}
        if isinstance(node, list):
            return [fill(v) for v in node]
        return node

    out = fill(out)
    # No white box: the chart draws on the card, in light and dark mode alike (page.css gives
    # its axes and legends the page's colours in dark mode).
    out.setdefault("background", "transparent")
    config = out.setdefault("config", {})
    for part, sizes in FONTS.items():
        config[part] = {**sizes, **config.get(part, {})}
    return out


def inline_data(rows: list[dict[str, object]]) -> alt.Data:
    """Inline data for a chart's few extra rows (reference lines, labels)."""
    return alt.Data(values=rows)


def colors(names: Sequence[str]) -> alt.Scale:
    return alt.Scale(domain=list(names), range=list(INK[: len(names)]))


def line_legend(**legend: Any) -> dict[str, Any]:
    """A legend whose symbols are short lines, so they show each series' dash (a line chart
    with points would show filled circles, told apart by colour alone)."""
    return {"symbolType": "stroke", "symbolStrokeWidth": 2.5, **legend}


DASHES = ((1, 0), (6, 3), (2, 2), (8, 3, 2, 3), (4, 2, 1, 2), (10, 2, 2, 2))
"""Line patterns for a chart's series, in :func:`colors` order: solid first."""


def dashes(field: str, names: Sequence[str], **channel: Any) -> alt.StrokeDash:
    """A dash pattern per series of ``field``, beside its colour from :func:`colors`, so that
    colour never tells lines apart alone (WCAG 1.4.1). ``channel`` (title, legend, sort) must
    match the colour channel's, which merges the two legends into one."""
    scale = alt.Scale(domain=list(names), range=[list(d) for d in DASHES[: len(names)]])
    return alt.StrokeDash(field, scale=scale, **channel)


def heat(
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
        alt.Chart(rows_source())
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


def seed_bars(
    categories: Sequence[str],
    refs: Sequence[tuple[float, str]],
    *,
    width: int,
    measured: bool,
    y_title: str,
) -> alt.TopLevelMixin:
    """Bars of a mean per category (rows of kind "mean": ``encoding``, ``acc``, ``label``,
    ``above``, ``seeds``) with each seed as a dot (kind "seed") and dashed reference lines
    ``refs`` (value, label) labelled beside the plot. Not ``measured``: the axis and the lines,
    and "not measured in this build" where the bars would be."""
    encodings = list(categories)
    x = alt.X(
        "encoding:N",
        title=None,
        sort=encodings,
        scale=alt.Scale(domain=encodings),
        axis=alt.Axis(labelAngle=0),
    )
    y_scale = alt.Scale(domain=[0, 1.08])
    y = alt.Y("acc:Q", title=y_title, scale=y_scale)
    base = alt.Chart().encode(x=x)  # the rows come once, with the layer
    bars = (
        base.transform_filter("datum.kind == 'mean'")
        .mark_bar(aria=False, width={"band": 0.6})
        .encode(
            y=y,
            color=alt.Color(
                "above:N",
                title="every seed above the pass bar",
                scale=alt.Scale(domain=["yes", "no"], range=[INK[0], INK[7]]),
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
        .mark_point(aria=False, shape="circle", filled=True, size=30, color=INK[6])
        .encode(y="acc:Q", tooltip=["encoding:N", alt.Tooltip("acc:Q", format=".3f")])
    )
    lines = alt.Chart(inline_data([{"y": rounded(v), "label": t} for v, t in refs])).encode(
        y=alt.Y("y:Q", title=y_title, scale=y_scale)
    )
    rules = lines.mark_rule(aria=False, strokeDash=[5, 3], color=INK[1]).encode(tooltip=["label:N"])
    # Labelled beside the plot, where no bar covers them.
    rule_labels = lines.mark_text(
        aria=False,
        align="left",
        baseline="middle",
        dx=6,
        color=INK[1],
        fontSize=12,
    ).encode(x=alt.value({"expr": "width"}), text="label:N")
    layers = [rules, rule_labels]
    if measured:
        layers = [bars, seeds, labels, *layers]
    else:
        # The x axis still names every encoding, with nothing above it.
        layers.append(base.mark_tick(aria=False, opacity=0).encode(y=alt.datum(0)))
        layers.append(
            alt.Chart(inline_data([{"t": "not measured in this build"}]))
            .mark_text(aria=False, fontSize=16, color=INK[6])
            .encode(x=alt.value({"expr": "width / 2"}), y=alt.value(30), text="t:N")
        )
    return alt.layer(*layers, data=rows_source()).properties(width=width, height=260)


# OKABE_ITO held the palette at its published values, which read under 4.5:1 on the card; INK
# holds the same hues at the contrast the page needs.
__getattr__ = _renamed.module_getattr(__name__, {"OKABE_ITO": "INK"}, globals())
