"""Screen 7, the carousel: the logit against the offset, its sign, decay as a bound, and scaling
without fine-tuning.

Its text, its claims with their checks, and its figures: editing this screen is this file
(and its test, ``tests/lesson/test_s07_carousel.py``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ... import absolute, rope
from ...freqs import inv_freq
from ...rope import RotaryEmbedding
from .. import charts, measure
from ..measure import F64
from ..registry import Control, Figure, Result, claim, figure, make_figure, screen

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
    ),
    maths=(
        r"\langle R_{m+s}\,q, R_{n+s}\,k\rangle = \langle R_m q, R_n k\rangle",
        r"z_i = q_{2i} + \mathrm{i}\,q_{2i+1},\quad z_i \mapsto z_i\,e^{\mathrm{i}m\theta_i}",
    ),
    trap=(
        "Applying RoPE to the token embeddings at the input. It is applied to q and k inside "
        "every attention layer, right before their product."
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


@claim(
    "rope.no_decay_for_random_vectors",
    SCREEN,
    "RoFormer's long-term decay is a bound, not a behaviour: for random q and k the logits are "
    "as large at distance 10,000 as at 0 (within sampling noise), while the bound falls more "
    "than fivefold.",
    verdict="n/a",
)
def _rope_no_decay() -> Result:
    g = measure.gen(13)
    d, n = 128, 4096
    rope = RotaryEmbedding(d)
    q = torch.randn(1, 1, n, d, generator=g, dtype=F64)
    k = torch.randn(1, 1, n, d, generator=g, dtype=F64)
    rq = rope.rotate(q, torch.zeros(n, dtype=torch.int64))
    theta = inv_freq(d, dtype=F64)
    rms, bound = {}, {}
    for r in (0, 1, 10, 100, 1000, 10_000):
        rk = rope.rotate(k, torch.full((n,), r))
        rms[r] = float((rq * rk).sum(-1).pow(2).mean().sqrt())
        # Su et al. 2021, section 3.4.3: (1/(d/2)) sum_j |S_j|, S_j = sum_{i<j} e^{i r theta_i}.
        s = torch.cumsum(torch.polar(torch.ones_like(theta), r * theta), 0)
        bound[r] = float(s.abs().mean())
    spread = max(rms.values()) / min(rms.values()) - 1
    fall = bound[0] / bound[10_000]
    # An RMS over n samples has a relative standard error of about 1 / sqrt(2n) (1.1% here).
    noise = 1 / math.sqrt(2 * n)
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
