"""Screen 7, the carousel: the logit against the offset, its sign, decay as a bound, scaling
without fine-tuning, and the training-free methods that re-map distances instead.

Its text, its claims with their checks, and its figures: editing this screen is this file
(and its test, ``tests/lesson/test_s07_carousel.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ... import absolute, rope, scaling
from ...freqs import inv_freq
from ...rope import RotaryEmbedding
from ...rope import apply_rope as rope_apply
from .. import charts, diagrams, measure
from ..charts import alt
from ..measure import F64
from ..registry import Control, Figure, Result, claim, exercise, figure, make_figure, screen

SCREEN = screen(
    __name__,
    title="RoPE relative distance (the carousel)",
    question="Why does the RoPE logit keep only the relative distance, and what does it keep?",
    goal=(
        "Show that shifting both positions leaves the logit unchanged, and that the logit "
        "still tells 'k steps before' from 'k steps after'."
    ),
    intuition=(
        "Two riders on a carousel stay the same distance apart however far the platform "
        "turns. RoPE rotates queries by m and keys by n; a common shift of both cancels.",
        "The logit is not symmetric in the distance: a key k steps back and one k steps "
        "ahead give different scores unless q equals k. For random q and k the typical size "
        "of the logit does not shrink with distance; the long-term decay RoFormer proves is "
        "an upper bound, not what random vectors do.",
        "Past the trained length, stretching the clocks (the scalings below) is one answer. "
        "The other, used without any training since 2024, keeps the clocks and changes which "
        "distance each pair is shown: the last figure draws Self-Extend, ReRoPE and Dual "
        "Chunk Attention doing it.",
    ),
    maths=(
        r"\langle R_{m+s}\,q, R_{n+s}\,k\rangle = \langle R_m q, R_n k\rangle",
        r"z_i = q_{2i} + \mathrm{i}\,q_{2i+1},\quad z_i \mapsto z_i\,e^{\mathrm{i}m\theta_i}",
    ),
    trap=(
        "Applying RoPE to the token embeddings at the input. It is applied to q and k inside "
        "every attention layer, right before their product."
    ),
    links=(
        ("fig-lab-loss", "what a RoPE model does past its training length, measured on screen 3"),
    ),
)
"""This screen's text; its number comes from the module's name."""


@claim(
    "rope.scaling_alone_is_partial",
    SCREEN,
    "Frequency scaling without fine-tuning recovers part of what RoPE loses past its training "
    "length, not all of it: in the lab, RoPE+YaRN at the longest length is better than plain "
    "RoPE there but still clearly worse than within the training length.",
    verdict="overstated",
    lesson_says="enabling context extension from 2K to 32K, 128K, and 1M tokens via frequency "
    "scaling (YaRN, LongLoRA)",
)
def _rope_scaling_partial() -> Result:
    lab = measure.lab_summary()
    longest = lab.eval_lens[-1]
    train = lab.train_len
    within, w_s = lab.mean_std("rope", train, "all")
    rope_m, rope_s = lab.mean_std("rope", longest, "past")
    yarn_m, yarn_s = lab.mean_std("rope+yarn", longest, "past")
    ok = yarn_m + 2 * math.hypot(yarn_s, rope_s) < rope_m and yarn_m - within > 2 * math.hypot(
        yarn_s, w_s
    )
    return Result(
        ok,
        f"loss at {longest} tokens, past the training length {train}: RoPE {rope_m:.2f}, "
        f"RoPE+YaRN {yarn_m:.2f}; within the training length {within:.2f} nats/char "
        f"({lab.conditions()}). LongLoRA is a fine-tuning method, not a scaling.",
        {"rope_past": rope_m, "yarn_past": yarn_m, "within": within},
    )


def _logit(rope: RotaryEmbedding, q: torch.Tensor, k: torch.Tensor, m: int, n: int) -> float:
    """<R_m q, R_n k> for single vectors ``q``, ``k`` of shape (1, 1, 1, d)."""
    rq = rope.rotate(q, torch.tensor([m]))
    rk = rope.rotate(k, torch.tensor([n]))
    return float((rq * rk).sum())


@claim("rope.logit_depends_on_offset_only", SCREEN, "<R_m q, R_n k> depends on m - n only.")
def _rope_logit_relative() -> Result:
    g = measure.gen(8)
    rope = RotaryEmbedding(128)
    q = torch.randn(1, 1, 1, 128, generator=g, dtype=F64)
    k = torch.randn(1, 1, 1, 128, generator=g, dtype=F64)
    base = _logit(rope, q, k, 10, 3)
    shifted = [_logit(rope, q, k, 10 + s, 3 + s) for s in (1, 1000, 123_457)]
    err = max(abs(v - base) for v in shifted) / abs(base)
    return Result(
        err < 1e-9,
        f"logit(m=10,n=3) = {base:.6f}; shifted by 1, 1000, 123457: max relative change {err:.1e}",
        err,
    )


@claim(
    "rope.logit_tells_before_from_after",
    SCREEN,
    "The logit depends on the signed offset: a key k steps before the query scores differently "
    "from one k steps after (unlike ALiBi's -m|i - j|); only q = k gives a symmetric logit.",
    verdict="n/a",
)
def _rope_signed_offset() -> Result:
    g = measure.gen(12)
    rope = RotaryEmbedding(128)
    q = torch.randn(1, 1, 1, 128, generator=g, dtype=F64)
    k = torch.randn(1, 1, 1, 128, generator=g, dtype=F64)
    m = 1000
    gaps, sym = {}, 0.0
    for off in (1, 5, 100):
        before, after = _logit(rope, q, k, m, m - off), _logit(rope, q, k, m, m + off)
        gaps[off] = abs(before - after) / max(abs(before), abs(after))
        sym = max(sym, abs(_logit(rope, q, q, m, m - off) - _logit(rope, q, q, m, m + off)))
    return Result(
        min(gaps.values()) > 1e-2 and sym < 1e-9,
        "relative |logit(-k) - logit(+k)| for random q, k: "
        + ", ".join(f"k={o}: {v:.2f}" for o, v in gaps.items())
        + f"; with q = k: {sym:.1e}",
        {str(o): v for o, v in gaps.items()},
    )


DECAY_PAIRS = 4096
DECAY_CURVES = ("random q and k (RMS)", "q = k (mean)", "RoFormer's bound")


def decay_curves(distances: Sequence[int]) -> dict[str, dict[int, float]]:
    """The RoPE logit against the distance r between query and key (d = 128): its RMS over
    4,096 random (q, k) pairs, its mean when q = k, and RoFormer's upper bound
    (Su et al. 2021, section 3.4.3), by :data:`DECAY_CURVES` name, each ``{r: value}``."""
    g = measure.gen(13)
    d, n = 128, DECAY_PAIRS
    rope = RotaryEmbedding(d)
    q = torch.randn(1, 1, n, d, generator=g, dtype=F64)
    k = torch.randn(1, 1, n, d, generator=g, dtype=F64)
    rq = rope.rotate(q, torch.zeros(n, dtype=torch.int64))
    theta = inv_freq(d, dtype=F64)
    rms, same, bound = {}, {}, {}
    for r in distances:
        rk = rope.rotate(k, torch.full((n,), r))
        rms[r] = float((rq * rk).sum(-1).pow(2).mean().sqrt())
        same[r] = float((rq * rope.rotate(q, torch.full((n,), r))).sum(-1).mean())
        # (1/(d/2)) sum_j |S_j|, S_j = sum_{i<j} e^{i r theta_i}.
        s = torch.cumsum(torch.polar(torch.ones_like(theta), r * theta), 0)
        bound[r] = float(s.abs().mean())
    return dict(zip(DECAY_CURVES, (rms, same, bound), strict=True))


@claim(
    "rope.no_decay_for_random_vectors",
    SCREEN,
    "RoFormer's long-term decay is a bound, not a behaviour: for random q and k the logits are "
    "as large at distance 10,000 as at 0 (within sampling noise), while the bound falls more "
    "than fivefold.",
    verdict="n/a",
)
def _rope_no_decay() -> Result:
    curves = decay_curves((0, 1, 10, 100, 1000, 10_000))
    rms, bound = curves[DECAY_CURVES[0]], curves[DECAY_CURVES[2]]
    spread = max(rms.values()) / min(rms.values()) - 1
    fall = bound[0] / bound[10_000]
    # An RMS over n samples has a relative standard error of about 1 / sqrt(2n) (1.1% here).
    noise = 1 / math.sqrt(2 * DECAY_PAIRS)
    return Result(
        spread < 5 * noise and fall > 5,
        "RMS logit of 4,096 random pairs (d=128) at distance 0..10,000: "
        + ", ".join(f"{v:.2f}" for v in rms.values())
        + f" (spread {spread:.1%}, 5 standard errors {5 * noise:.1%}); RoFormer bound "
        f"{bound[0]:.1f} -> {bound[10_000]:.2f} ({fall:.0f}x lower)",
        {"rms": list(rms.values()), "bound": list(bound.values())},
    )


LOGIT_ENCODINGS = ("RoPE", "additive sinusoidal")


@figure("fig-logit-mn")
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
            {"n": j, "m": i, "logit": charts.rounded(logits[i, j])}
            for i in range(n_pos)
            for j in range(n_pos)
        ]
        chart = charts.heat(
            rows,
            "n",
            "m",
            "logit",
            titles=("key position n", "query position m", "logit"),
            size=(288, 288),
            tick_every=4,
        )
        return charts.spec(chart, rows), (
            f"logit(m=10, n=3) = {float(logits[10, 3]):.6f}; "
            f"logit(m=20, n=13) = {float(logits[20, 13]):.6f}"
        )

    return make_figure(
        "fig-logit-mn",
        SCREEN,
        "The carousel: only m - n matters",
        "The logit of one fixed query and key (d = 16) placed at every query position m and key "
        "position n. With RoPE each diagonal (constant m - n) has one colour: the carousel's "
        "turn cancels. With the sinusoids added instead, the pattern depends on m and n "
        "themselves.",
        "posemb.RotaryEmbedding(16).rotate(q, positions)",
        "24 x 24 heatmap of logits; diagonal stripes for RoPE, no clean stripes for additive.",
        kind="vega",
        draw=draw,
        controls=[Control("fig-logit-mn-encoding", "positions", "toggle", LOGIT_ENCODINGS, 0)],
    )


WHERE_MODES = ("RoPE", "absolute (sinusoidal or learned)")


def _box(x: float, y: float, w: float, h: float, text: str, *, on: bool = False) -> str:
    """A labelled box of the network diagram; ``on`` marks where position enters."""
    colour = charts.INK[1] if on else "currentColor"
    width = 3 if on else 1.2
    return (
        f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="6" fill="none" '
        f'stroke="{colour}" stroke-width="{width}"/>'
        f'<text x="{x + w / 2}" y="{y + h / 2 + 5}" text-anchor="middle">{text}</text>'
    )


def _arrow(x0: float, y0: float, x1: float, y1: float) -> str:
    return (
        f'<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y1}" stroke="currentColor" '
        f'stroke-width="1.5" marker-end="url(#where-arrow)"/>'
    )


def _shift_change(mode: str) -> float:
    """How much one logit moves when both positions shift by 5 (d = 16, seeded): zero up to
    rounding for RoPE, not for an absolute encoding added to x."""
    g = measure.gen(31)
    x = torch.randn(2, 16, generator=g, dtype=F64)
    wq, wk = torch.randn(2, 16, 16, generator=g, dtype=F64)
    m, n, shift = 9, 4, 5
    if mode == WHERE_MODES[0]:
        rot = RotaryEmbedding(16)
        q, k = (x[0] @ wq)[None, None, None], (x[1] @ wk)[None, None, None]

        def logit(a: int, b: int) -> float:
            qa = rot.rotate(q, torch.tensor([a]))
            kb = rot.rotate(k, torch.tensor([b]))
            return float((qa * kb).sum())
    else:
        table = absolute.sinusoidal_table(m + shift + 1, 16, dtype=F64)

        def logit(a: int, b: int) -> float:
            return float(((x[0] + table[a]) @ wq) @ ((x[1] + table[b]) @ wk))

    return abs(logit(m + shift, n + shift) - logit(m, n))


@figure("fig-where-rope-acts")
def fig_where_rope_acts(summary: dict[str, Any]) -> Figure:
    """Where position enters the network: on q and k in every layer (RoPE), or once, added to
    the token embedding (absolute)."""

    def draw(mode: str) -> tuple[object, str]:
        rotary = mode == WHERE_MODES[0]
        body = [
            '<defs><marker id="where-arrow" viewBox="0 0 10 10" refX="9" refY="5" '
            'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
            '<path d="M0,0 L10,5 L0,10 z" fill="currentColor"/></marker></defs>',
            _box(10, 120, 90, 40, "token ids"),
            _arrow(100, 140, 130, 140),
            _box(130, 120, 110, 40, "embedding"),
            _box(130, 200, 110, 40, "+ position p", on=True) if not rotary else "",
            _arrow(185, 200, 185, 160) if not rotary else "",
            _arrow(240, 140, 290, 78),
            _arrow(240, 140, 290, 140),
            _arrow(240, 140, 290, 202),
            '<rect x="270" y="20" width="470" height="240" rx="10" fill="none" '
            'stroke="currentColor" stroke-dasharray="6 4"/>',
            '<text x="280" y="40" font-weight="bold">every attention layer</text>',
            _box(290, 60, 70, 36, "W_Q"),
            _box(290, 122, 70, 36, "W_K"),
            _box(290, 184, 70, 36, "W_V"),
            _arrow(360, 78, 390, 78),
            _arrow(360, 140, 390, 140),
            _arrow(360, 202, 530, 202),
            _box(390, 60, 90, 36, "R_m q" if rotary else "q", on=rotary),
            _box(390, 122, 90, 36, "R_n k" if rotary else "k", on=rotary),
            _arrow(480, 78, 520, 110),
            _arrow(480, 140, 520, 120),
            _box(520, 96, 100, 36, "softmax(q·k)"),
            _box(530, 184, 90, 36, "v untouched"),
            _arrow(620, 114, 650, 150),
            _arrow(620, 202, 650, 170),
            _box(650, 140, 80, 36, "weights·v"),
        ]
        svg = diagrams.svg(750, 280, f"Where position enters the network: {mode}", "".join(body))
        change = _shift_change(mode)
        if rotary:
            said = f"shift both positions by 5: the logit moves {change:.1e} (float64 rounding)"
        else:
            said = f"shift both positions by 5: the logit moves {change:.3g}"
        return svg, said

    return make_figure(
        "fig-where-rope-acts",
        SCREEN,
        "Where RoPE acts: on q and k, in every layer",
        "An absolute encoding adds a position vector to each token once, before the first layer; "
        "every later product carries it along with the token. RoPE adds nothing to the tokens: in "
        "every attention layer it turns q by its position m and k by its position n just before "
        "their product, and leaves v alone, so what a value carries is never rotated. The "
        "readout shifts both positions by 5 and measures one logit before and after.",
        "posemb.RotaryEmbedding(16).rotate(q, positions); posemb.sinusoidal_table(n, 16)",
        "A diagram from token ids to the attention output; the highlighted boxes are where "
        "position enters: the position vector added to the embedding, or the rotations R_m q "
        "and R_n k inside every attention layer.",
        kind="svg",
        draw=draw,
        controls=[Control("fig-where-rope-acts-mode", "positions", "toggle", WHERE_MODES, 0)],
    )


DECAY_DISTANCES = (0, *sorted({round(10 ** (i / 6)) for i in range(25)}))
"""0, then about six distances a decade from 1 to 10,000."""


@figure("fig-rope-decay")
def fig_rope_decay(summary: dict[str, Any]) -> Figure:
    """The RoPE logit against distance, for random q and k, for q = k, and RoFormer's bound,
    each relative to distance 0: what the decay claim measures."""
    curves = decay_curves(DECAY_DISTANCES)

    def draw() -> tuple[object, str]:
        rows = [
            {"curve": name, "distance": r, "value": charts.rounded(v / c[0])}
            for name, c in curves.items()
            for r, v in c.items()
            if r > 0
        ]
        chart = (
            alt.Chart(charts.rows_source())
            .mark_line(aria=False, strokeWidth=2.5, point=alt.OverlayMarkDef(aria=False, size=25))
            .encode(
                x=alt.X(
                    "distance:Q",
                    title="distance between query and key (tokens)",
                    scale=alt.Scale(type="log"),
                ),
                y=alt.Y("value:Q", title="relative to distance 0"),
                color=alt.Color(
                    "curve:N",
                    title=None,
                    scale=charts.colors(DECAY_CURVES),
                    sort=None,
                    legend=charts.line_legend(),
                ),
                strokeDash=charts.dashes(
                    "curve:N", DECAY_CURVES, title=None, sort=None, legend=charts.line_legend()
                ),
                tooltip=["curve:N", "distance:Q", alt.Tooltip("value:Q", format=".3f")],
            )
            .properties(width=charts.WIDE - 200, height=260)
        )
        far = DECAY_DISTANCES[-1]
        shown = "; ".join(f"{n} {c[far] / c[0]:.3f}" for n, c in curves.items())
        return charts.spec(chart, rows), f"at distance {far:,}, relative to 0: {shown}"

    return make_figure(
        "fig-rope-decay",
        SCREEN,
        "Does the RoPE logit decay with distance?",
        "The logit of a query and a key r tokens apart, relative to r = 0 (d = 128, 4,096 random "
        "pairs). For random q and k its typical size (RMS) stays flat at every distance. When "
        "q = k the logit does fall, as the pairs turn out of step. RoFormer's long-term decay is "
        "an upper bound that falls with r, which is not what random vectors do. (Each curve is "
        "divided by its own value at r = 0: compare their shapes, not their heights.)",
        "posemb.lesson.screens.s07_carousel.decay_curves(distances)",
        "Three lines on a log distance axis: the random-pair RMS flat near 1, the q = k mean "
        "falling towards 0, and RoFormer's bound falling more than fivefold.",
        kind="vega",
        draw=draw,
    )


DRIFT_SHIFTS, DRIFT_EVERY = 4000, 200
DRIFT_METHODS = ("posemb rerotate (float64 turn, float32 key)", "composed float32 tables")


def drift_curves() -> dict[str, list[tuple[int, float]]]:
    """A float32 key (head_dim 128, base 500,000) moved one position at a time: its relative
    distance from the key rotated directly at the same position, every :data:`DRIFT_EVERY`
    shifts, for posemb's re-rotation and for composing float32 one-step tables."""
    rope = RotaryEmbedding(128, base=500000.0)
    k0 = torch.randn(1, 2, 1, 128, generator=measure.gen(23))
    step = inv_freq(128, base=500000.0)
    c, s = torch.cos(step)[None], torch.sin(step)[None]
    ours = composed = rope.rotate(k0, torch.tensor([0]))
    curves: dict[str, list[tuple[int, float]]] = {m: [] for m in DRIFT_METHODS}
    for p in range(1, DRIFT_SHIFTS + 1):
        ours = rope.rerotate(ours, torch.tensor([p - 1]), torch.tensor([p]))
        composed = rope_apply(composed, c, s)
        if p % DRIFT_EVERY == 0:
            exact = rope.rotate(k0.double(), torch.tensor([p]))
            for name, got in zip(DRIFT_METHODS, (ours, composed), strict=True):
                curves[name].append((p, float((got.double() - exact).norm() / exact.norm())))
    return curves


@figure("fig-rerotate-drift")
def fig_rerotate_drift(summary: dict[str, Any]) -> Figure:
    """How far a cached key drifts when it is moved position by position: posemb's float64
    turn against composing float32 tables."""
    curves = drift_curves()

    def draw() -> tuple[object, str]:
        rows = [
            {"method": m, "shifts": n, "error": charts.rounded(e)}
            for m, pts in curves.items()
            for n, e in pts
        ]
        chart = (
            alt.Chart(charts.rows_source())
            .mark_line(aria=False, strokeWidth=2.5, point=alt.OverlayMarkDef(aria=False, size=20))
            .encode(
                x=alt.X("shifts:Q", title="single-position shifts of one cached key"),
                y=alt.Y(
                    "error:Q",
                    title="relative error against rotating it directly",
                    scale=alt.Scale(type="log"),
                ),
                color=alt.Color(
                    "method:N",
                    title=None,
                    scale=charts.colors(DRIFT_METHODS),
                    sort=None,
                    legend=charts.line_legend(),
                ),
                strokeDash=charts.dashes(
                    "method:N", DRIFT_METHODS, title=None, sort=None, legend=charts.line_legend()
                ),
                tooltip=["method:N", "shifts:Q", alt.Tooltip("error:Q", format=".2e")],
            )
            .properties(width=charts.WIDE - 220, height=240)
        )
        last = {m: pts[-1][1] for m, pts in curves.items()}
        shown = "; ".join(f"{m} {e:.2e}" for m, e in last.items())
        return charts.spec(chart, rows), f"after {DRIFT_SHIFTS:,} shifts: {shown}"

    return make_figure(
        "fig-rerotate-drift",
        SCREEN,
        "Moving a cached key, one position at a time",
        "A KV cache that evicts old tokens moves the kept keys to new positions (attention "
        "sinks, context shift). Composing float32 one-step tables repeats the same rounding "
        "of the step's angle every time, so the key drifts steadily. posemb turns it by the "
        "difference of two float64 angles and rounds the key once per move: what is left is "
        "what storing it in float32 costs, and it grows more slowly.",
        "posemb.RotaryEmbedding(128, base=500000.0).rerotate(k, [p - 1], [p])",
        "Two lines of error on a log scale against the number of shifts: the composed float32 "
        "tables rising steadily above posemb's re-rotation.",
        kind="vega",
        draw=draw,
    )


FACTORS = ("1", "2", "4", "8", "16", "32")


SCALING_DIM, SCALING_BASE, SCALING_LEN = 128, 500000.0, 8192  # Llama 3.1's head and schedule


SCALING_METHODS = ("default", "PI (linear)", "NTK", "YaRN", "Llama 3")


SCALING_DASHES = ([1, 0], [10, 4], [2, 3], [1, 0], [6, 3, 1, 3])


SCALING_WIDTHS = (2, 2, 2.5, 5, 2)  # YaRN wide and under the others: Llama 3 runs along it


SCALING_MIDDLE_PAIR = 32  # the middle pair: where YaRN's and Llama 3's ramps disagree


CHANGED = 1e-9  # relative change of a wavelength that counts as "changed" (float64 rounding)


def _schedules(s: float) -> dict[str, tuple[torch.Tensor, float]]:
    """(inverse frequencies, attention factor) of each schedule at factor ``s``."""
    methods: dict[str, scaling.RopeScaling] = {
        "default": scaling.Default(),
        "PI (linear)": scaling.Linear(s),
        "NTK": scaling.NTK(s),
        "YaRN": scaling.Yarn(s, SCALING_LEN),
        "Llama 3": scaling.Llama3(s, 1.0, 4.0, SCALING_LEN),
    }
    return {n: m.compute(SCALING_DIM, SCALING_BASE) for n, m in methods.items()}


def _scaling_chart(rows: Sequence[Mapping[str, object]]) -> alt.TopLevelMixin:
    """Wavelength lines per schedule on a log axis, and the trained length."""
    top = max(float(str(r["wavelength"])) for r in rows)
    decades = [10**e for e in range(0, math.ceil(math.log10(top)) + 1)]
    lines = (
        alt.Chart(charts.rows_source())
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
                scale=charts.colors(SCALING_METHODS),
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
        charts.inline_data([{"y": SCALING_LEN, "label": f"trained length {SCALING_LEN:,} tokens"}])
    ).encode(y="y:Q")
    rule = trained.mark_rule(aria=False, strokeDash=[4, 4], color=charts.INK[7]).encode(
        tooltip=["label:N"]
    )
    label = trained.mark_text(
        aria=False, align="left", baseline="bottom", dx=4, dy=-3, color=charts.INK[7], fontSize=12
    ).encode(x=alt.datum(0), text="label:N")
    return (
        (lines + rule + label)
        .properties(width=charts.WIDE - 140, height=300)
        .configure_axis(grid=True, gridOpacity=0.5)
    )


@figure("fig-scaling")
def fig_scaling(summary: dict[str, Any]) -> Figure:
    """How PI, NTK, YaRN and Llama 3 remap each pair's wavelength at a factor s."""

    def draw(factor: str) -> tuple[object, str]:
        got = _schedules(float(factor))
        default = got["default"][0]
        rows = [
            {
                "pair": i,
                "method": name,
                "wavelength": charts.rounded(2 * math.pi / float(inv[i])),
                "ratio": charts.rounded(float(default[i] / inv[i])),
                "w": SCALING_WIDTHS[SCALING_METHODS.index(name)],
            }
            # YaRN first: its wide line is drawn under Llama 3's, which runs along it.
            for name, (inv, _) in sorted(got.items(), key=lambda kv: kv[0] != "YaRN")
            for i in range(inv.shape[0])
        ]
        chart = _scaling_chart(rows)
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
        return charts.spec(chart, rows), (
            f"s = {factor}: pairs changed (of {last + 1}): {changed}; pair "
            f"{SCALING_MIDDLE_PAIR}'s wavelength: {mid}; YaRN attention factor {yarn_factor:.4f}"
        )

    return make_figure(
        "fig-scaling",
        SCREEN,
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
        kind="vega",
        draw=draw,
        controls=[Control("fig-scaling-factor", "scaling factor s", "slider", FACTORS, 3)],
    )


@exercise(
    SCREEN,
    "Stretching a 8,192-token RoPE by s = 8: which scalings leave pair 0, the fastest, exactly "
    "as it was?",
    call="posemb.scaling.Yarn(8, 8192).compute(128, 500000.0) (and Linear, NTK, Llama3)",
    figure="fig-scaling",
    state="8",
)
def _which_keep_pair_0() -> str:
    got = _schedules(8.0)
    default = got["default"][0]
    kept = [
        name
        for name, (inv, _) in got.items()
        if name != "default" and abs(float(inv[0] - default[0])) <= CHANGED * float(default[0])
    ]
    moved = [name for name in got if name not in kept and name != "default"]

    def listed(names: list[str]) -> str:
        return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"

    verb = "changes" if len(moved) == 1 else "change"
    return (
        f"{listed(kept)} keep it; {listed(moved)} {verb} it. A pair that turns many "
        "times within the trained length has seen every angle already, so the ramp-based "
        "scalings leave it alone and stretch only the slow pairs."
    )


EXTENSION_METHODS = ("plain RoPE", "Self-Extend", "ReRoPE", "Dual Chunk")
EXTENSION_WINDOWS = ("4", "8")
EXTENSION_GROUPS = ("2", "4")
EXTENSION_LEN = 24  # 16 states of 300 pairs: the page carries every state


def extension_method(name: str, window: int, group: int) -> Any:
    """The method a state of ``fig-extension-distances`` draws (None for plain RoPE): the window
    is Self-Extend's and ReRoPE's W and Dual Chunk's local size; the group is Self-Extend's G,
    leaky ReRoPE's slope 1/G, and Dual Chunk's chunk of G windows (chunk_size G·W)."""
    from ...extension import DualChunk, ReRoPE, SelfExtend

    if name == "Self-Extend":
        return SelfExtend(group=group, window=window)
    if name == "ReRoPE":
        return ReRoPE(window=window, leak=float(group))
    if name == "Dual Chunk":
        return DualChunk(chunk_size=group * window, local_size=window)
    return None


@figure("fig-extension-distances")
def fig_extension_distances(summary: dict[str, Any]) -> Figure:
    """The distance each training-free method rotates every (query, key) pair by."""
    pos = torch.arange(EXTENSION_LEN)

    def draw(name: str, window: str, group: str) -> tuple[object, str]:
        method = extension_method(name, int(window), int(group))
        d = pos[:, None] - pos[None, :] if method is None else method.relative_positions(pos, pos)
        rows: list[dict[str, object]] = [
            {"j": j, "i": i, "distance": charts.rounded(d[i, j])}
            for i in range(EXTENSION_LEN)
            for j in range(i + 1)
        ]
        chart = charts.heat(
            rows,
            "j",
            "i",
            "distance",
            titles=("key position j", "query position i", "distance rotated by"),
            size=(288, 288),
            diverging=False,
            domain=(0, EXTENSION_LEN - 1),
            tick_every=4,
        )
        causal = pos[:, None] >= pos[None, :]
        longest = float(d[causal].max())
        exact = int((d[causal] == (pos[:, None] - pos[None, :])[causal]).sum())
        return charts.spec(chart, rows), (
            f"{name}: the longest distance any pair meets is {longest:g} (of "
            f"{EXTENSION_LEN - 1}); {exact} of {int(causal.sum())} pairs keep their true distance"
        )

    return make_figure(
        "fig-extension-distances",
        SCREEN,
        "Longer context without training: re-mapped distances",
        f"The distance each (query i, key j) pair of a {EXTENSION_LEN}-token window is rotated by. "
        "A scaling (above) changes the clocks; these methods keep the clocks and change which "
        "distance a pair is shown, so that none is longer than training saw. Self-Extend keeps "
        "neighbours closer than the window W and groups farther positions by G; leaky ReRoPE "
        "keeps the window and grows 1/G as fast beyond it; Dual Chunk Attention (chunk_size "
        "G·W, local window W) splits the sequence into chunks of (G - 1)·W tokens, and does "
        "nothing where a chunk is longer than the window shown. "
        "posemb.extended_attention attends exactly so, and hf.patch_extension does it inside a "
        "transformers model.",
        "posemb.SelfExtend(G, W).relative_positions(positions, positions) (and ReRoPE, DualChunk)",
        "Lower-triangular heatmap of distances, light near the diagonal and darker away from it; "
        "with a method the colour stops growing past the window.",
        kind="vega",
        draw=draw,
        controls=[
            Control("fig-extension-method", "method", "toggle", EXTENSION_METHODS, 1),
            Control("fig-extension-window", "window W", "slider", EXTENSION_WINDOWS, 1),
            Control("fig-extension-group", "group G", "slider", EXTENSION_GROUPS, 1),
        ],
    )
