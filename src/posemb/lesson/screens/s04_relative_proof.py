"""Screen 4, RoPE logits depend on m - n: the composition identity, and the lab's evidence that a
kept norm is not seamless extrapolation.

Its text, its claims with their checks, and its figures: editing this screen is this file
(and its test, ``tests/lesson/test_s04_relative_proof.py``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ... import rope
from ...freqs import cos_sin, inv_freq
from ...rope import apply_rope
from .. import charts, diagrams, measure
from ..measure import EXACT, F64
from ..registry import Control, Figure, Result, claim, exercise, figure, make_figure, screen

SCREEN = screen(
    __name__,
    title="Proof that RoPE logits depend on m - n",
    question="Why does the RoPE logit depend only on the distance m - n?",
    goal=(
        "Derive the 2D rotation, show that the product of two rotations is a rotation by the "
        "difference, and check a small case by hand."
    ),
    intuition=(
        "Treat a pair of channels as a point in the plane. Rotating the query by m steps and "
        "the key by n steps, then measuring how aligned they are, only sees the angle "
        "between them, which is (m - n) steps' worth.",
        "In matrix terms, a rotation's transpose undoes it, so the query's rotation and the "
        "key's rotation combine into one rotation by n - m. Shift both positions by the same "
        "amount and nothing changes.",
    ),
    maths=(
        r"R_m = \begin{pmatrix}\cos m\theta & -\sin m\theta\\ \sin m\theta & \cos m\theta"
        r"\end{pmatrix},\qquad R_m^\top R_m = I",
        r"R_m^\top R_n = R_{n-m}\ \Rightarrow\ \langle R_m q, R_n k\rangle = "
        r"q^\top R_{n-m}k = g(q, k, n-m)",
    ),
    links=(
        ("fig-lab-loss", "what this kept norm does not buy past the training length (screen 3)"),
    ),
    trap=(
        "Mixing RoPE up with sinusoidal embeddings. Sinusoids are added to the token; RoPE "
        "multiplies q and k by an orthogonal matrix and never changes their length."
    ),
)
"""This screen's text; its number comes from the module's name."""


@claim(
    "rope.norm_kept_but_not_seamless",
    SCREEN,
    "Rotation keeps every query and key length exactly (to float64 rounding), but that does not "
    "make length extrapolation seamless: from 4x its training length on, the lab's RoPE model "
    "loses more past that length than within it, beyond the spread of its seeds.",
    verdict="overstated",
    lesson_says="RoPE is multiplicative and orthogonal (Rx), preserving vector magnitude and "
    "enabling seamless length extrapolation",
)
def _rope_norm_not_seamless() -> Result:
    x = torch.randn(4, 3, 257, 128, dtype=F64, generator=measure.gen(11))
    rot = apply_rope(x, *cos_sin(torch.arange(257) * 97, inv_freq(128, dtype=F64), dtype=F64))
    norm_err = float((rot.norm(dim=-1) - x.norm(dim=-1)).abs().max())
    lab = measure.lab_summary()
    _, past, within = lab.past_vs_within("rope")
    far, where = lab.rises_from("rope", measure.FAR)
    return Result(
        norm_err < 1e-12 and far,
        f"max | ||R_m x|| - ||x|| | = {norm_err:.1e} over 257 positions up to 24,832; lab RoPE "
        f"loss within {within:.2f}, past {', '.join(f'{m:.2f}' for m in past)} nats/char, "
        f"above within beyond seed noise at {where} ({lab.conditions()})",
        {"norm_error": norm_err, "rope_past": past, "rope_within": within},
    )


@claim("rope.relative_composition", SCREEN, "R_m^T R_n = R_(n-m).")
def _rope_relative() -> Result:
    err = measure.worst_identity_error(lambda rm, rn: rm.T @ rn, lambda m, n: n - m)
    return Result(err < EXACT, f"max |R_m^T R_n - R_(n-m)| = {err:.1e} (d=128, 12 pairs)", err)


MN = tuple(str(i) for i in range(7))
DIAL_SCALE = 2  # the lesson's dials, drawn large enough to read the hands


@figure("fig-dials-mn")
def fig_dials_mn(summary: dict[str, Any]) -> Figure:
    """A query at m and a key at n on one dial; their logit depends on m - n only."""
    # One random 2D vector as both query and key (as in the lesson's trace, q = k): the angle
    # between the hands is then (m - n) theta itself.
    q = torch.randn(2, generator=torch.Generator().manual_seed(41), dtype=F64)
    k = q
    theta = torch.tensor([measure.TOY_THETA], dtype=F64)

    def draw(m_s: str, n_s: str) -> tuple[object, str]:
        m, n = int(m_s), int(n_s)
        qm = rope.rotation_matrix(m, theta) @ q
        kn = rope.rotation_matrix(n, theta) @ k
        logit = float(qm @ kn)
        cx, cy, r = 120, 120, 90
        aq, ak = diagrams.angle(qm), diagrams.angle(kn)
        # Hands of fixed length: the angle between them is what moves; the lengths
        # (||q||, ||k||, unchanged by rotation) are written beside the dial.
        between = math.degrees((aq - ak) % (2 * math.pi))
        body = [
            diagrams.dial_face(cx, cy, r),
            diagrams.arc(cx, cy, 30, ak, aq if aq > ak else aq + 2 * math.pi, charts.INK[2]),
            diagrams.hand(cx, cy, r, aq, charts.INK[0]),
            diagrams.hand(cx, cy, r * 0.75, ak, charts.INK[1]),
            f'<text x="250" y="40" fill="{charts.INK[0]}">query R_m q, m = {m}</text>',
            f'<text x="250" y="60" fill="{charts.INK[1]}">key R_n k, n = {n}</text>',
            f'<text x="250" y="90">m - n = {m - n}</text>',
            f'<text x="250" y="110" fill="{charts.INK[2]}">angle between {between:.1f}°</text>',
            f'<text x="250" y="130">logit = {logit:.4f}</text>',
            f'<text x="250" y="160">q = k = {diagrams.vec(q)}</text>',
        ]
        title = f"Dial with the query turned to m = {m} and the key to n = {n}"
        svg = diagrams.svg(430, 240, title, "".join(body), scale=DIAL_SCALE)
        return svg, f"m = {m}, n = {n}, m - n = {m - n}: <R_m q, R_n k> = {logit:.6f}"

    return make_figure(
        "fig-dials-mn",
        SCREEN,
        "Turn both hands by the same amount: the logit stays",
        "One 2D vector (random, fixed) as query at position m and as key at position n, turned "
        "by theta = pi/4 per step. Moving m and n together turns both hands alike; the angle "
        "between them, and so the logit q^T R_(n-m) k, stays the same. (The key's hand is drawn "
        "shorter only so that both show; rotation keeps their lengths equal.)",
        "posemb.rotation_matrix(m, torch.tensor([math.pi / 4])) @ q",
        "A dial with two hands, query and key; the logit shown depends only on m - n.",
        kind="svg",
        draw=draw,
        controls=[
            Control("fig-dials-m", "query position m", "slider", MN, 3),
            Control("fig-dials-n", "key position n", "slider", MN, 1),
        ],
    )


@exercise(
    SCREEN,
    "A query at m = 6 and a key at n = 4, each turned theta = pi/4 per step: what angle lies "
    "between the two hands?",
    call="posemb.rotation_matrix(6, theta) @ q, posemb.rotation_matrix(4, theta) @ q",
    figure="fig-dials-mn",
    state="6|4",
)
def _angle_between() -> str:
    q = torch.tensor([1.0, 0.0], dtype=F64)
    theta = torch.tensor([measure.TOY_THETA], dtype=F64)
    a = diagrams.angle(rope.rotation_matrix(6, theta) @ q)
    b = diagrams.angle(rope.rotation_matrix(4, theta) @ q)
    between = math.degrees((a - b) % (2 * math.pi))
    return (
        f"{between:.1f}°: (m - n) theta = 2 x 45°. Only the difference counts: m = 3, n = 1 "
        "gives the same angle, and the same logit."
    )
