"""Hand-drawn SVG for the lesson's own diagrams (dials, arcs, the blender's colour strips).

Text and strokes are in ``currentColor`` so that a diagram follows the page's light or dark
theme; every function returns markup, nothing is drawn with a plotting library.
"""

from __future__ import annotations

import math
from xml.sax.saxutils import escape

import torch


def svg(width: int, height: int, title: str, body: str, *, scale: float = 1) -> str:
    """An accessible SVG: ``role="img"`` named by its ``<title>``; text in currentColor so it
    follows the page's light or dark theme. ``scale`` enlarges the drawing on the page (its
    width and height) without changing its coordinates (the viewBox). Text is at least 12
    units: the page shrinks a diagram to its card only while that stays 10 px or more."""
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{round(width * scale)}" height="{round(height * scale)}" role="img" '
        f'font-family="sans-serif" font-size="12" '
        f'fill="currentColor"><title>{escape(title)}</title>{body}</svg>'
    )


def point(cx: float, cy: float, r: float, angle: float) -> tuple[float, float]:
    """The point at ``angle`` (radians, counter-clockwise from 3 o'clock) on a circle; SVG's
    y axis points down, hence the minus."""
    return round(cx + r * math.cos(angle), 2), round(cy - r * math.sin(angle), 2)


def hand(cx: float, cy: float, r: float, angle: float, color: str, width: float = 3) -> str:
    x, y = point(cx, cy, r, angle)
    return (
        f'<line x1="{cx}" y1="{cy}" x2="{x}" y2="{y}" stroke="{color}" stroke-width="{width}" '
        f'stroke-linecap="round"/><circle cx="{x}" cy="{y}" r="{width + 1}" fill="{color}"/>'
    )


def arc(cx: float, cy: float, r: float, a0: float, a1: float, color: str) -> str:
    """The arc from angle ``a0`` to ``a1`` (counter-clockwise when a1 > a0)."""
    x0, y0 = point(cx, cy, r, a0)
    x1, y1 = point(cx, cy, r, a1)
    large = 1 if abs(a1 - a0) % (2 * math.pi) > math.pi else 0
    sweep = 0 if a1 > a0 else 1  # SVG sweeps clockwise on screen for 1
    return (
        f'<path d="M{x0},{y0} A{r},{r} 0 {large} {sweep} {x1},{y1}" fill="none" '
        f'stroke="{color}" stroke-width="2" stroke-dasharray="4 3"/>'
    )


def dial_face(cx: float, cy: float, r: float, ticks: int = 8) -> str:
    marks = "".join(
        '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="currentColor" stroke-opacity="0.4"/>'.format(
            *point(cx, cy, r * 0.9, 2 * math.pi * i / ticks),
            *point(cx, cy, r, 2 * math.pi * i / ticks),
        )
        for i in range(ticks)
    )
    return (
        f'<circle cx="{cx}" cy="{cy}" r="{r}" fill="none" stroke="currentColor" '
        f'stroke-opacity="0.6"/>{marks}'
    )


def diverging_rgb(v: float, vmax: float) -> str:
    """Blue (negative) - light grey - orange (positive), the colours of :data:`DIVERGING`."""
    t = max(-1.0, min(1.0, v / vmax)) if vmax > 0 else 0.0
    t = math.copysign(math.sqrt(abs(t)), t)  # small values visibly coloured, not near-white
    mid, end = (242, 242, 242), ((0, 114, 178) if t < 0 else (230, 159, 0))
    c = [round(m + abs(t) * (e - m)) for m, e in zip(mid, end, strict=True)]
    return "#{:02x}{:02x}{:02x}".format(*c)


def angle(v: torch.Tensor) -> float:
    """The angle of a 2D vector, radians."""
    return math.atan2(float(v[1]), float(v[0]))


def vec(v: torch.Tensor) -> str:
    return "[" + ", ".join(f"{float(x):.4f}" for x in v) + "]"


def diverging_legend(x: float, y: float, vmax: float, width: float = 320) -> str:
    """A colour bar for :func:`diverging_rgb` from -vmax to vmax, with numbers under it."""
    steps = 64
    w = round(width / steps + 0.5, 2)  # a hair wider: no gaps between the slices
    body = [
        f'<rect x="{round(x + i * width / steps, 2)}" y="{y}" width="{w}" height="14" '
        f'fill="{diverging_rgb(vmax * (2 * i / (steps - 1) - 1), vmax)}"/>'
        for i in range(steps)
    ]
    for frac in (0.0, 0.25, 0.5, 0.75, 1.0):
        tx = round(x + frac * width, 2)
        body.append(
            f'<line x1="{tx}" y1="{y + 14}" x2="{tx}" y2="{y + 19}" stroke="currentColor"/>'
            f'<text x="{tx}" y="{y + 32}" text-anchor="middle">{vmax * (2 * frac - 1):.2g}</text>'
        )
    return "".join(body)
