"""Screen 5, the clock tower: head_dim / 2 pairs per head, the toy trace, the norm kept, and the
dials.  Its text, its claims with their checks, and its figures: editing this screen is this file
(and its test, ``tests/lesson/test_s05_clock_tower.py``)."""

from __future__ import annotations

import math
from typing import Any
from xml.sax.saxutils import escape

import torch

from ... import freqs, rope
from ...absolute import sinusoidal_table
from ...freqs import inv_freq
from ...rope import RotaryEmbedding, rotation_matrix
from .. import charts, diagrams, measure
from ..measure import EXACT, F64
from ..registry import Control, Figure, Result, claim, exercise, figure, make_figure, screen

SCREEN = screen(
    __name__,
    title="RoPE through 2D Givens rotations (the clock tower)",
    question="How do 2D Givens rotations turn word distance into an angle?",
    goal=(
        "Rotate each channel pair at its own frequency and follow the lesson's toy trace "
        "(theta = pi/4, m = 3, n = 1) to a logit of 0."
    ),
    intuition=(
        "Picture each channel pair as a clock hand. A token at position m turns every hand "
        "by m ticks, each hand at its own speed. Comparing two tokens compares their hands, "
        "and the difference of the hands is set by the distance alone.",
        "With theta = pi/4 a query at 3 sits at 135 degrees and a key at 1 at 45 degrees: "
        "they are perpendicular, so q = k = (1, 0) gives a logit of exactly 0.",
    ),
    maths=(
        r"\theta_i = 10000^{-2i/d},\quad i = 0,\dots,d/2-1",
        r"\langle R_3 q, R_1 k\rangle = \cos\big((3-1)\tfrac{\pi}{4}\big) = 0"
        r"\quad(q = k = (1,0))",
    ),
    trap=(
        "Treating RoPE as one more vector added to the token. It is a product: lengths stay "
        "the same and only directions turn."
    ),
)
"""This screen's text; its number comes from the module's name."""


@claim(
    "rope.pairs_per_head",
    SCREEN,
    "RoPE turns head_dim / 2 pairs in each attention head, not d_model / 2: 32 pairs for a "
    "768-wide model with 12 heads, 64 for Llama 3.1 8B (hidden 4096, 32 heads); the 384 pairs "
    "of d = 768 belong to the sinusoidal table, which spans the whole model width.",
    verdict="wrong",
    lesson_says="Imagine a grand clock tower with 384 pairs of clock hands.",
)
def _rope_pairs_per_head() -> Result:
    from ...hf import rope_spec

    base_768 = RotaryEmbedding(768 // 12).cos_sin(torch.arange(2))[0].shape[-1]
    llama = rope_spec(
        {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "rope_theta": 5e5}
    )
    pairs_llama = len(inv_freq(llama.rotary_dim, llama.base))
    sinusoidal_pairs = sinusoidal_table(1, 768).shape[-1] // 2
    return Result(
        base_768 == 32 and pairs_llama == 64 and sinusoidal_pairs == 384,
        f"pairs per head: {base_768} (d_model 768, 12 heads), {pairs_llama} (Llama 3.1 8B); "
        f"the sinusoidal table of d = 768 has {sinusoidal_pairs} pairs",
        {"d768_12_heads": base_768, "llama_3_1_8b": pairs_llama, "sinusoidal_768": 384},
    )


@claim(
    "rope.toy_trace",
    SCREEN,
    "theta = pi/4, m = 3, n = 1, q = k = [1, 0]: R_3 q = [-sqrt(2)/2, sqrt(2)/2] and the "
    "rotated dot product is 0.",
)
def _toy_trace() -> Result:
    theta = torch.tensor([math.pi / 4], dtype=F64)
    e1 = torch.tensor([1.0, 0.0], dtype=F64)
    q3 = rotation_matrix(3, theta) @ e1
    k1 = rotation_matrix(1, theta) @ e1
    dot = float(q3 @ k1)
    h = math.sqrt(2) / 2
    ok = abs(dot) < EXACT and torch.allclose(q3, torch.tensor([-h, h], dtype=F64))
    return Result(
        ok,
        f"R_3 q = [{q3[0]:.4f}, {q3[1]:.4f}], R_1 k = [{k1[0]:.4f}, {k1[1]:.4f}], "
        f"<R_3 q, R_1 k> = {dot:.1e}",
        dot,
    )


@claim("rope.norm_preserved", SCREEN, "Rotation preserves the norm: ||R_m x|| = ||x||.")
def _rope_norm() -> Result:
    g = measure.gen(7)
    x = torch.randn(2, 4, 64, 128, generator=g, dtype=F64)
    pos = torch.randint(0, 1 << 20, (2, 64), generator=g)
    y = RotaryEmbedding(128).rotate(x, pos)
    err = float(((y.norm(dim=-1) - x.norm(dim=-1)).abs() / x.norm(dim=-1)).max())
    return Result(err < EXACT, f"max relative | ||R_m x|| - ||x|| | = {err:.1e}", err)


HEAD_DIMS = ("64", "128")


DIAL_POSITIONS = ("1", "2", "3", "10", "100", "1000", "10000")


@figure("fig-pair-dials")
def fig_pair_dials(summary: dict[str, Any]) -> Figure:
    """One dial per rotated pair of a head, each turned to position m."""

    def draw(head_dim: str, position: str) -> tuple[object, str]:
        hd, m = int(head_dim), int(position)
        a = freqs.angles(m, freqs.inv_freq(hd, dtype=F64))  # (hd/2,) in [0, 2 pi)
        per_row, r, gap = 8, 26, 66  # dials large enough to read each hand
        body = []
        for i, ang in enumerate(a.tolist()):
            cx, cy = 34 + (i % per_row) * gap, 34 + (i // per_row) * gap
            body.append(
                f'<circle cx="{cx}" cy="{cy}" r="{r}" fill="none" stroke="currentColor" '
                f'stroke-opacity="0.5"/>'
            )
            body.append(diagrams.hand(cx, cy, r - 3, ang, charts.INK[0], width=2.5))
        rows = -(-len(a) // per_row)
        body.append(
            f'<text x="4" y="{rows * gap + 30}">pair 0 top left, pair '
            f"{len(a) - 1} bottom right; m = {m}</text>"
        )
        svg = diagrams.svg(
            per_row * gap + 8,
            rows * gap + 40,
            f"{len(a)} dials, the pairs of a head of {hd} channels, at position {m}",
            "".join(body),
        )
        return svg, (
            f"{len(a)} pairs (head_dim {hd}); at m = {m}: pair 0 at "
            f"{math.degrees(float(a[0])):.1f}°, pair {len(a) - 1} at "
            f"{math.degrees(float(a[-1])):.4f}°"
        )

    return make_figure(
        "fig-pair-dials",
        SCREEN,
        "The clock tower has head_dim/2 dials, not 384",
        "Every rotated pair of one attention head as a dial at position m. RoPE turns each head "
        "separately, so a head has head_dim/2 pairs: 32 for GPT-2-sized heads (768 / 12 = 64 "
        "channels), 64 for Llama's 128. The lesson's 384 pairs is d_model/2 for d_model = 768, "
        "the count for a sinusoidal table, not for RoPE.",
        "posemb.angles(m, posemb.inv_freq(head_dim))",
        "A grid of small dials; the first turn visibly with position, the last barely move.",
        kind="svg",
        draw=draw,
        controls=[
            Control("fig-pair-dials-head-dim", "head_dim", "toggle", HEAD_DIMS, 0),
            Control("fig-pair-dials-position", "position m", "slider", DIAL_POSITIONS, 2),
        ],
    )


TRACE_STEPS = (
    "1 start: q = k = [1, 0]",
    "2 turn q to m = 3",
    "3 turn k to n = 1",
    "4 the angle between",
    "5 the dot product",
)


@figure("fig-toy-trace")
def fig_toy_trace(summary: dict[str, Any]) -> Figure:
    """The lesson's toy trace: theta = pi/4, m = 3, n = 1, q = k = [1, 0]."""
    theta = torch.tensor([measure.TOY_THETA], dtype=F64)
    e1 = torch.tensor([1.0, 0.0], dtype=F64)
    q3 = rope.rotation_matrix(3, theta) @ e1
    k1 = rope.rotation_matrix(1, theta) @ e1
    dot = float(q3 @ k1)
    between = math.degrees(diagrams.angle(q3) - diagrams.angle(k1))

    def draw(step: str) -> tuple[object, str]:
        i = TRACE_STEPS.index(step)
        cx, cy, r = 120, 120, 90
        qv, kv = (e1 if i < 1 else q3), (e1 if i < 2 else k1)
        body = [diagrams.dial_face(cx, cy, r)]
        if i >= 3:
            body.append(
                diagrams.arc(cx, cy, 34, diagrams.angle(kv), diagrams.angle(qv), charts.INK[2])
            )
        body.append(diagrams.hand(cx, cy, r, diagrams.angle(qv), charts.INK[0]))
        body.append(diagrams.hand(cx, cy, r * 0.8, diagrams.angle(kv), charts.INK[1]))
        lines = [
            (charts.INK[0], f"q = {diagrams.vec(qv)}"),
            (charts.INK[1], f"k = {diagrams.vec(kv)}"),
            ("currentColor", "theta = pi/4 per step"),
        ]
        readout = [
            f"q = k = {diagrams.vec(e1)}, theta = {measure.TOY_THETA:.6f} rad",
            f"R_3 q = {diagrams.vec(q3)} ({math.degrees(diagrams.angle(q3)):.1f}°)",
            f"R_1 k = {diagrams.vec(k1)} ({math.degrees(diagrams.angle(k1)):.1f}°)",
            f"angle between = {between:.1f}° = (3 - 1) x 45°",
            f"<R_3 q, R_1 k> = {dot:.1e}"
            + (" (0 up to float64 rounding)" if abs(dot) < EXACT else ""),
        ][i]
        if i >= 3:
            lines.append(("currentColor", f"between: {between:.1f}°"))
        if i >= 4:
            lines.append(("currentColor", f"dot product = {dot:.1e}"))
        body.extend(
            f'<text x="250" y="{40 + 22 * j}" fill="{c}">{escape(t)}</text>'
            for j, (c, t) in enumerate(lines)
        )
        title = f"Toy trace, step {step}"
        return diagrams.svg(470, 240, title, "".join(body), scale=2), readout

    return make_figure(
        "fig-toy-trace",
        SCREEN,
        "The lesson's toy trace, one step at a time",
        "theta = pi/4, q = k = [1, 0]: the query turns to 135° at m = 3, the key to 45° at n = 1; "
        "90° apart, their dot product is 0 (to float64 rounding). The key's hand is drawn shorter "
        "only so that both show.",
        "posemb.rotation_matrix(3, torch.tensor([math.pi / 4])) @ q",
        "A dial on which the query and key hands turn step by step to 135 and 45 degrees.",
        kind="svg",
        draw=draw,
        controls=[Control("fig-toy-trace-step", "step", "slider", TRACE_STEPS, 0)],
    )


@exercise(
    SCREEN,
    "How many pairs does one attention head of Llama 3.1 8B turn (hidden size 4,096, 32 "
    "heads): 2,048, 384 or 64?",
    call="posemb.inv_freq(4096 // 32).shape[0]",
    figure="fig-pair-dials",
    state="128|3",
)
def _pairs_per_head() -> str:
    pairs = int(freqs.inv_freq(4096 // 32).shape[0])
    return (
        f"{pairs}: RoPE turns the pairs of one head, head_dim / 2 = 128 / 2. The 2,048 pairs of "
        "the model width belong to nothing in RoPE, and the lesson's 384 are d_model / 2 of a "
        "768-wide model's sinusoidal table."
    )
