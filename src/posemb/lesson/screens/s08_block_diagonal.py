"""Screen 8, block-diagonal Givens rotations: the group identities, the three forms, the layouts,
and the periods of the fastest and slowest pairs.

Its text, its claims with their checks, and its figures: editing this screen is this file
(and its test, ``tests/lesson/test_s08_block_diagonal.py``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ... import freqs, rope
from ...axial import AxialRotaryEmbedding, patch_positions
from ...freqs import cos_sin, inv_freq
from ...rope import Layout, apply_rope, rope_complex, rotation_matrix
from .. import charts, measure
from ..charts import alt
from ..measure import EXACT, F64
from ..registry import Control, Figure, Result, claim, exercise, figure, make_figure, screen

SCREEN = screen(
    __name__,
    title="Block-diagonal Givens rotations",
    question=(
        "How does a block-diagonal matrix of Givens rotations turn a long vector in many "
        "independent planes?"
    ),
    goal=(
        "Build the block-diagonal rotation, show it preserves norms, and see the two ways "
        "implementations pair channels (interleaved and rotate-half)."
    ),
    intuition=(
        "Split the head into d/2 pairs and give each pair its own small rotation: the big "
        "matrix is block-diagonal, so each plane turns without touching the others, and the "
        "whole vector keeps its length.",
        "Which channels form a pair is a convention. RoFormer and Meta pair neighbours "
        "(2i, 2i+1); GPT-NeoX and Hugging Face pair channel j with j + d/2. They are "
        "different matrices, and weights trained in one need a permutation to run in the "
        "other.",
        "The fastest pair turns once every 2 pi = 6.28 tokens (1 radian per token), not "
        "once every 2; the slowest, at d = 768, once every 61,343 tokens, not 10,000.",
        "Nothing forces every block to read the same number. A vision transformer cuts an "
        "image into patches and gives half the blocks a patch's row and the other half its "
        "column (axial RoPE, as in Qwen2-VL, Pixtral and Llama 4's vision towers). Then a "
        "logit depends on how far apart two patches are down and how far across, each in its "
        "own blocks. Numbering the patches along the flattened rows instead scores by distance "
        "along that line: the last patch of a row looks adjacent to the first of the next, "
        "and the patch directly below looks a whole row away.",
    ),
    maths=(
        r"R_m = \operatorname{diag}\big(R_m^{(0)}, \dots, R_m^{(d/2-1)}\big),\quad "
        r"\lVert R_m x\rVert = \lVert x\rVert",
        r"\text{elementwise: } x\odot\cos(m\theta) + \operatorname{rot}(x)\odot\sin(m\theta)",
    ),
    terms=(
        (
            "interleaved (INTERLEAVED)",
            "pairs neighbouring channels (0, 1), (2, 3), ...: RoFormer's paper, GPT-J, Meta's "
            "Llama code. posemb.Layout.INTERLEAVED.",
        ),
        (
            "rotate_half (HALF)",
            "pairs channel j with j + head_dim/2: GPT-NeoX and Hugging Face's Llama. The same "
            "rotation on reordered channels; a checkpoint must be read with the pairing it was "
            "trained with. posemb.Layout.HALF.",
        ),
    ),
    trap=(
        "Thinking RoPE spins the whole vector in one d-dimensional rotation. It is d/2 "
        "separate planar rotations at different speeds."
    ),
)
"""This screen's text; its number comes from the module's name."""


@claim("rope.group_homomorphism", SCREEN, "R_m R_n = R_(m+n).")
def _rope_group() -> Result:
    err = measure.worst_identity_error(lambda rm, rn: rm @ rn, lambda m, n: m + n)
    return Result(err < EXACT, f"max |R_m R_n - R_(m+n)| = {err:.1e} (d=128, 12 pairs)", err)


@claim("rope.determinant_and_orthogonality", SCREEN, "det R_m = 1 and R_m^T R_m = I.")
def _rope_det() -> Result:
    theta = inv_freq(128, dtype=F64)
    mats = [rotation_matrix(m, theta) for m in (0, 1, 17, 4096, 65_537, 1 << 20)]
    det = max(abs(float(torch.linalg.det(r)) - 1) for r in mats)
    orth = max(float((r.T @ r - torch.eye(128, dtype=F64)).abs().max()) for r in mats)
    return Result(
        max(det, orth) < EXACT,
        f"max |det R_m - 1| = {det:.1e}, max |R_m^T R_m - I| = {orth:.1e} (6 positions)",
        {"det": det, "orthogonality": orth},
    )


@claim(
    "rope.three_forms_agree",
    SCREEN,
    "The elementwise, block-diagonal matrix and complex-number forms of RoPE agree, in both "
    "pairings, and with their defaults they use the same one.",
)
def _three_forms() -> Result:
    g = measure.gen(9)
    theta = inv_freq(32, dtype=F64)
    x = torch.randn(1, 2, 9, 32, generator=g, dtype=F64)
    pos = torch.tensor([0, 1, 2, 3, 17, 250, 4096, 65_537, 1 << 20])
    cos, sin = cos_sin(pos, theta, dtype=F64)

    def forms(*layout: Layout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mats = torch.stack([rotation_matrix(int(p), theta, *layout) for p in pos])
        return (
            apply_rope(x, cos, sin, *layout),
            rope_complex(x, pos, theta, *layout),
            torch.einsum("sij,bhsj->bhsi", mats, x),
        )

    worst = 0.0
    for args in ((Layout.HALF,), (Layout.INTERLEAVED,), ()):
        elementwise, complex_form, matrix_form = forms(*args)
        worst = max(
            worst,
            float((elementwise - complex_form).abs().max()),
            float((elementwise - matrix_form).abs().max()),
        )
    return Result(
        worst < EXACT,
        f"max difference between elementwise, matrix and complex forms = {worst:.1e} "
        f"(half, interleaved, and each function's default)",
        worst,
    )


def _turns_per_step(dim: int, pair: int, positions: torch.Tensor) -> float:
    """Angle (rad) that ``apply_rope`` turns one pair by per step, read from its output.

    A unit vector in the pair's plane is rotated to each position; the angle of the result
    (atan2) is unwrapped and fitted by least squares against the position. Positions must
    be close enough that the pair turns less than pi between neighbours.
    """
    theta = inv_freq(dim, dtype=F64)
    x = torch.zeros(1, 1, len(positions), dim, dtype=F64)
    x[..., pair] = 1.0  # HALF pairing: the plane is channels (pair, pair + dim/2)
    cos, sin = cos_sin(positions, theta, dtype=F64)
    y = apply_rope(x, cos, sin, Layout.HALF)[0, 0]
    angle = torch.atan2(y[:, pair + dim // 2], y[:, pair])
    step = torch.diff(angle)
    step = torch.remainder(step + math.pi, 2 * math.pi) - math.pi  # unwrap
    unwrapped = torch.cat((angle[:1], angle[0] + torch.cumsum(step, 0)))
    p = positions.to(F64)
    pc = p - p.mean()
    return float((pc * (unwrapped - unwrapped.mean())).sum() / (pc * pc).sum())


@claim(
    "rope.fastest_pair_period",
    SCREEN,
    "The fastest pair (theta_0 = 1 rad per step) completes a turn every 2*pi ~ 6.28 steps; "
    "after 2 steps it has turned 114.6 degrees, not 360.",
    verdict="wrong",
    lesson_says="Couple 1 spins fast (one full spin every 2 steps)",
)
def _fastest_pair_period() -> Result:
    per_step = _turns_per_step(768, 0, torch.arange(0, 64))
    period = 2 * math.pi / per_step
    after_two = math.degrees(2 * per_step) % 360
    return Result(
        abs(period - 2 * math.pi) < 1e-9 and abs(after_two - 360 * (after_two > 180)) > 1,
        f"measured from apply_rope (d=768, pair 0, positions 0-63): {per_step:.6f} rad per "
        f"step, one turn every {period:.4f} steps; after 2 steps {after_two:.1f} degrees",
        {"period": period, "degrees_after_2_steps": after_two},
    )


@claim(
    "rope.slowest_pair_period",
    SCREEN,
    "The slowest pair turns once per 61,342.7 steps at d=768 (2*pi*10000^(766/768)), not once "
    "per 10,000.",
    verdict="wrong",
    lesson_says="Couple 384 spins like a giant grandfather clock (one spin every 10,000 steps)",
)
def _slowest_pair_period() -> Result:
    # The lesson's own figure for channel 383 on its sinusoid screen; 0.05 is half a unit in
    # its last quoted place.
    stated = 61_342.7
    # 1000 steps turn the slowest pair ~0.1 rad: far below pi, so the unwrap is exact.
    period = 2 * math.pi / _turns_per_step(768, 383, torch.arange(0, 70_000, 1000))
    return Result(
        abs(period - stated) < 0.05 and abs(period - 10_000) > 1,
        f"measured from apply_rope (d=768, pair 383, positions 0-69,000): one turn every "
        f"{period:,.1f} steps; stated {stated:,.1f}; the lesson's 10,000 is off by "
        f"{period / 10_000:.2f}x",
        period,
    )


@claim(
    "rope.layouts_are_different_pairings",
    SCREEN,
    "rotate_half pairs channel j with j + d/2, not (2i-1, 2i) as the Givens matrix on the "
    "same screen does; the two agree only after permuting channels, and the lesson does not "
    "say which pairing it means.",
    verdict="incomplete",
    lesson_says="x_(rotated) = x ⊙ cos(mθ) + rotate_half(x) ⊙ sin(mθ)",
)
def _layouts_differ() -> Result:
    g = measure.gen(10)
    d = 16
    theta = inv_freq(d, dtype=F64)
    x = torch.randn(1, 1, 5, d, generator=g, dtype=F64)
    cos, sin = cos_sin(torch.arange(5), theta, dtype=F64)
    half = apply_rope(x, cos, sin, Layout.HALF)
    inter = apply_rope(x, cos, sin, Layout.INTERLEAVED)
    gap = float((half - inter).abs().max())
    # The same rotation, once the channels are reordered: HALF channel j is interleaved 2j,
    # HALF channel j + d/2 is interleaved 2j + 1.
    order = torch.cat((torch.arange(0, d, 2), torch.arange(1, d, 2)))
    again = apply_rope(x[..., order], cos, sin, Layout.HALF)
    same = float((again - inter[..., order]).abs().max())
    return Result(
        gap > 0.1 and same < EXACT,
        f"rotate_half vs interleaved pairs on the same vector differ by {gap:.2f}; "
        f"after reordering channels by {same:.1e}",
        {"different": gap, "after_permutation": same},
    )


LAYOUTS = ("rotate_half (HALF)", "interleaved (INTERLEAVED)")


GIVENS_POSITIONS = ("1", "3", "10", "100", "1000")  # at d = 16 the slow pairs turn visibly


@figure("fig-givens")
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
            {"column": j, "row": i, "R": charts.rounded(r[i, j], 3)}
            for i in range(d)
            for j in (i, partner[i][1])
        ]
        heat = charts.heat(
            rows,
            "column",
            "row",
            "R",
            titles=("column", "row", "R_m"),
            size=(320, 320),
            domain=(-1.0, 1.0),
            tick_every=1,
        )
        blocks = charts.inline_data(
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
            .mark_rect(aria=False, fill=None, stroke=charts.INK[6], strokeWidth=1.5)
            .encode(x="column:O", y="row:O", tooltip=["pair:N"])
        )
        chart = heat + outline
        det = float(torch.linalg.det(r))
        orth = float((r.T @ r - torch.eye(d, dtype=F64)).abs().max())
        return charts.spec(chart, rows), (
            f"det R_m = {det:.6f} (error {abs(det - 1):.1e}); "
            f"max |R_m^T R_m - I| = {charts.zero_error(orth)}"
        )

    return make_figure(
        "fig-givens",
        SCREEN,
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
        kind="vega",
        draw=draw,
        controls=[
            Control("fig-givens-layout", "pairing", "toggle", LAYOUTS, 1),
            Control("fig-givens-position", "position m", "slider", GIVENS_POSITIONS, 2),
        ],
    )


FORM_POSITIONS = ("0", "3", "250", "65537", "1048576")


FORMS = ("elementwise (apply_rope)", "Givens matrix (rotation_matrix)", "complex (rope_complex)")


@figure("fig-three-forms")
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
            {"channel": c, "value": charts.rounded(v, 6), "form": name}
            for name, t in outs.items()
            for c, v in enumerate(t.tolist())
        ]
        chart = (
            alt.Chart(charts.rows_source())
            .mark_point(aria=False, filled=True, size=70)
            .encode(
                x=alt.X("channel:O", title="channel"),
                xOffset=alt.XOffset("form:N", sort=list(FORMS)),
                y=alt.Y("value:Q", title="R_m x"),
                # One legend for both channels: the same field, title and order.
                color=alt.Color(
                    "form:N", title=None, scale=charts.colors(list(FORMS)), sort=list(FORMS)
                ),
                shape=alt.Shape("form:N", title=None, sort=list(FORMS)),
                tooltip=["form:N", "channel:O", alt.Tooltip("value:Q", format=".6f")],
            )
            .properties(width=charts.WIDE - 140, height=220)
        )
        err = max(float((outs[FORMS[0]] - t).abs().max()) for t in outs.values())
        return charts.spec(chart, rows), (
            f"m = {m}: max difference between the three forms = {charts.zero_error(err)}"
        )

    return make_figure(
        "fig-three-forms",
        SCREEN,
        "Three ways to write one rotation",
        "One vector (d = 8) rotated to position m three ways: elementwise cos/sin as kernels do "
        "it, the block-diagonal Givens matrix of the paper, and multiplication by e^(i m theta) "
        "in the complex plane. The three agree to float64 rounding.",
        "posemb.apply_rope(x, cos, sin); posemb.rotation_matrix(m, theta); "
        "posemb.rope_complex(x, [m], theta)",
        "Three markers per channel at the same height: the forms agree.",
        kind="vega",
        draw=draw,
        controls=[Control("fig-three-forms-position", "position m", "slider", FORM_POSITIONS, 2)],
    )


LESSON_PERIODS = {"lesson: 'every 2 steps'": 2.0, "lesson: 'every 10,000 steps'": 10000.0}


PERIOD_TABLES = {
    "a RoPE head, head_dim 64 (32 pairs)": 64,
    "a RoPE head, head_dim 128 (64 pairs)": 128,
    "the sinusoidal table, d = 768 (384 pairs)": 768,
}
"""What the periods are of: one RoPE head (head_dim / 2 pairs, screen 5), or the lesson's
sinusoidal table over the whole model width."""


@figure("fig-periods")
def fig_periods(summary: dict[str, Any]) -> Figure:
    """The period of every pair of a RoPE head or of the d = 768 table, against the lesson's
    "2" and "10,000"."""

    def draw(of: str) -> tuple[object, str]:
        d = PERIOD_TABLES[of]
        lam = freqs.wavelengths(d)
        rows = [{"pair": i, "period": charts.rounded(v)} for i, v in enumerate(lam.tolist())]
        # Points, not bars: a bar needs a baseline, and a log axis has no zero.
        points = (
            alt.Chart(charts.rows_source())
            .mark_point(aria=False, filled=True, size=30 if d < 768 else 10)
            .encode(
                x=alt.X("pair:Q", title="pair i", scale=alt.Scale(domain=[0, d // 2])),
                y=alt.Y("period:Q", title="period (steps per turn)", scale=alt.Scale(type="log")),
                tooltip=["pair:Q", alt.Tooltip("period:Q", format=",.2f")],
            )
        )
        refs = alt.Chart(
            charts.inline_data([{"label": k, "period": v} for k, v in LESSON_PERIODS.items()])
        ).encode(y="period:Q")
        rules = refs.mark_rule(aria=False, color=charts.INK[1], strokeDash=[5, 3]).encode(
            tooltip=["label:N"]
        )
        labels = refs.mark_text(aria=False, align="left", dx=4, dy=-6, color=charts.INK[1]).encode(
            text="label:N", x=alt.datum(0)
        )
        chart = (points + rules + labels).properties(width=charts.WIDE - 140, height=240)
        return charts.spec(chart, rows), (
            f"{len(lam)} pairs; fastest: {float(lam[0]):.6f} steps per turn; slowest: "
            f"{float(lam[-1]):,.1f}"
        )

    return make_figure(
        "fig-periods",
        SCREEN,
        "How fast the couples spin",
        "Steps per full turn of each pair (base 10,000), for one RoPE head (head_dim / 2 pairs, "
        "as screen 5 counts them) or for the lesson's sinusoidal table over d = 768. The "
        "fastest pair turns once per 2 pi = 6.28 steps, not every 2; the slowest of the d = 768 "
        "table once per 61,342.7 steps, not 10,000: the dashed lines are the lesson's numbers.",
        "posemb.wavelengths(head_dim)",
        "Points rising on a log scale from 6.28 to the slowest pair's period, with dashed lines "
        "at 2 and 10,000.",
        kind="vega",
        draw=draw,
        controls=[Control("fig-periods-of", "pairs of", "toggle", tuple(PERIOD_TABLES), 1)],
    )


@exercise(
    SCREEN,
    "After 2 steps, how far has the fastest pair turned: a full turn, or less?",
    call="posemb.angles(2, posemb.inv_freq(128))[0]",
    figure="fig-periods",
    state="a RoPE head, head_dim 128 (64 pairs)",
)
def _two_steps() -> str:
    turned = math.degrees(float(freqs.angles(2, freqs.inv_freq(128, dtype=F64))[0]))
    return (
        f"{turned:.1f}°, under a third of a turn: the fastest pair turns 1 radian per step, so "
        "a full turn takes 2·pi = 6.28 steps."
    )


GRID = 9
"""Patches per side of the axial figure's image."""

GRID_BASE = 10.0
"""The axial figure's frequency base: RoPE-Mixed's ViT base (Heo et al. 2024), fast enough that
a 9-patch image shows the logit fall and rise again (base 100 keeps every logit above 0.45)."""

GRID_QUERIES = ("row 2, column 2", "row 4, column 6", "row 7, column 3")
GRID_VIEWS = ("axial: row and column", "1D: position along the flattened rows")


def _grid_logits(query: tuple[int, int], view: str) -> torch.Tensor:
    """The logit of one query vector at ``query`` against the same vector as a key at every
    patch of the grid: ``(GRID, GRID)``, float64."""
    d = 32
    x = torch.ones(1, 1, 1, d, dtype=F64) / math.sqrt(d)
    grid = patch_positions(GRID, GRID)
    if view == GRID_VIEWS[0]:
        rope_ = AxialRotaryEmbedding(d, base=GRID_BASE, backend="reference")
        q, _ = rope_(x, x, torch.tensor([query], dtype=F64))
        keys = x.expand(1, 1, GRID * GRID, d)
        k, _ = rope_(keys, keys, grid)
    else:
        theta = inv_freq(d, GRID_BASE, dtype=F64)
        flat = grid[:, 0] * GRID + grid[:, 1]
        c, s_ = cos_sin(torch.tensor([query[0] * GRID + query[1]]), theta, dtype=F64)
        q = apply_rope(x, c, s_)
        c, s_ = cos_sin(flat.long(), theta, dtype=F64)
        k = apply_rope(x.expand(1, 1, GRID * GRID, d), c, s_)
    return (q[0, 0] @ k[0, 0].T).reshape(GRID, GRID)


def _query_at(label: str) -> tuple[int, int]:
    row, col = label.replace("row ", "").replace("column ", "").split(", ")
    return int(row), int(col)


def _same_offsets(a: torch.Tensor, qa: tuple[int, int], b: torch.Tensor, qb: tuple[int, int]):
    """Largest difference of two logit maps at every offset (down, across) both contain."""
    worst = 0.0
    for dr in range(-GRID + 1, GRID):
        for dc in range(-GRID + 1, GRID):
            ra, ca, rb, cb = qa[0] + dr, qa[1] + dc, qb[0] + dr, qb[1] + dc
            if 0 <= ra < GRID and 0 <= ca < GRID and 0 <= rb < GRID and 0 <= cb < GRID:
                worst = max(worst, abs(float(a[ra, ca] - b[rb, cb])))
    return worst


def _grid_readout(query: tuple[int, int], view: str, logits: torch.Tensor) -> str:
    first = _query_at(GRID_QUERIES[0])
    spread = _same_offsets(logits, query, _grid_logits(first, view), first)
    # In raster order the last patch of a row and the first of the next are neighbours.
    row = min(query[0], GRID - 2)
    end = _grid_logits((row, GRID - 1), view)
    left, wrapped = float(end[row, GRID - 2]), float(end[row + 1, 0])
    same = f"offset for offset, this map differs from the one around {first} by {spread:.1e}"
    if view == GRID_VIEWS[0]:
        return (
            f"{same}; the last patch of row {row} scores the first of row {row + 1} "
            f"{wrapped:.3f}, well below its left-hand neighbour ({left:.3f})"
        )
    return (
        f"{same}, but the last patch of row {row} scores the first of row {row + 1} "
        f"{wrapped:.3f}, as high as its left-hand neighbour ({left:.3f}): flattening made "
        f"them neighbours"
    )


@figure("fig-axial-grid")
def fig_axial_grid(summary: dict[str, Any]) -> Figure:
    """Logits of one query patch against every patch of a 9 x 9 image, axial or flattened."""

    def draw(where: str, view: str) -> tuple[object, str]:
        query = _query_at(where)
        logits = _grid_logits(query, view)
        rows = [
            {"row": r, "column": c, "logit": charts.rounded(float(logits[r, c])),
             "query": (r, c) == query}
            for r in range(GRID) for c in range(GRID)
        ]  # fmt: skip
        cells = alt.Chart().mark_rect(aria=False).encode(
            x=alt.X("column:O", title="column"),
            y=alt.Y("row:O", title="row"),
            color=alt.Color(
                "logit:Q", title="logit",
                scale=alt.Scale(scheme="blueorange", domain=[-1, 1]),
            ),
            tooltip=["row:O", "column:O", alt.Tooltip("logit:Q", format=".3f")],
        )  # fmt: skip
        marker = (
            alt.Chart()
            .mark_point(aria=False, shape="cross", size=160, filled=True, color="black")
            .encode(x="column:O", y="row:O")
            .transform_filter("datum.query")
        )
        chart = alt.layer(cells, marker, data=charts.rows_source()).properties(
            width=300, height=300
        )
        return charts.spec(chart, rows), _grid_readout(query, view, logits)

    return make_figure(
        "fig-axial-grid",
        SCREEN,
        "RoPE on an image: blocks turned by row and by column",
        f"A {GRID} x {GRID} grid of image patches. One query vector sits at the cross; each "
        "cell is its logit with the same vector as a key at that patch (head_dim 32, base "
        "10). Axial RoPE turns 8 pairs by the row and 8 by the column, so the peak is round: "
        "a patch one step down scores like a patch one step across. Numbering the patches "
        "along the flattened rows instead (1D RoPE) gives stripes: the end of one row scores "
        "the start of the next as a neighbour, and the patch below scores as 9 steps away. "
        "Both patterns move with the query unchanged; they differ in what counts as near.",
        "posemb.AxialRotaryEmbedding(32, base=10.0)(q, k, posemb.axial.patch_positions(9, 9))",
        "A 9 by 9 heat map with a cross on the query patch. Axial: an orange peak centred on "
        "the cross, the same shape wherever the cross is. 1D: horizontal bands that wrap "
        "from one row's end to the next row's start.",
        kind="vega",
        draw=draw,
        controls=[
            Control("fig-axial-grid-query", "query patch", "slider", GRID_QUERIES, 0),
            Control("fig-axial-grid-positions", "positions", "toggle", GRID_VIEWS, 0),
        ],
    )
