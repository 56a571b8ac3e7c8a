"""Measurements more than one screen uses, and those both a screen's claims and its figures use.

A claim's check and the figure beside it read the same numbers from the same call here, so
what the page draws is what the check measured. The lab readers (:func:`lab_summary` and the
functions that take its summary) read the default ``posemb lab`` run that ships with posemb
(:func:`posemb.lab.report.default_summary`): what a screen quotes is what the lab measured,
not a number typed in a screen module.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

import torch

from ..absolute import sinusoidal_table
from ..attention import dot_product_attention
from ..freqs import inv_freq
from ..lab.schema import LabSummary
from ..rope import RotaryEmbedding, rotation_matrix

F64 = torch.float64


# float64 rounding after a few hundred multiply-adds: an identity that holds exactly in real
# arithmetic must come within this of zero, and a broken one misses by many orders more.
EXACT = 1e-10


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def self_attention(x: torch.Tensor, w: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """One-head self-attention of ``x`` ``(T, d)`` with stacked projections ``w`` ``(3, d, d)``."""
    q, k, v = (x @ w[i] for i in range(3))
    return dot_product_attention(q[None, None], k[None, None], v[None, None], causal=causal)[0, 0]


DOG_BITES_MAN = ("dog", "bites", "man")


def dog_bites_man_outputs() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """One-head self-attention outputs ``(3, 16)`` for 'dog bites man' and 'man bites dog'
    (rows in sentence order), per encoding: ``{"none", "sinusoidal", "rope"}`` -> (a, b).

    Random embeddings and projections (seed 2), float64; the page draws these same outputs.
    """
    g = gen(2)
    d = 16
    emb = dict(zip(DOG_BITES_MAN, torch.randn(3, d, generator=g, dtype=F64), strict=True))
    w = torch.randn(3, d, d, generator=g, dtype=F64) / math.sqrt(d)
    xa = torch.stack([emb[t] for t in DOG_BITES_MAN])
    xb = torch.stack([emb[t] for t in reversed(DOG_BITES_MAN)])
    rope = RotaryEmbedding(d)

    def rope_attn(x: torch.Tensor) -> torch.Tensor:
        q, k, v = (x @ w[i] for i in range(3))
        qr, kr = rope(q[None, None], k[None, None])
        return dot_product_attention(qr, kr, v[None, None])[0, 0]

    pe = sinusoidal_table(3, d, dtype=F64)
    return {
        "none": (self_attention(xa, w), self_attention(xb, w)),
        "sinusoidal": (self_attention(xa + pe, w), self_attention(xb + pe, w)),
        "rope": (rope_attn(xa), rope_attn(xb)),
    }


def word_change(out_a: torch.Tensor, out_b: torch.Tensor) -> float:
    """Largest change of one word's output between the two sentences: sentence b lists the
    words reversed, so row i of a is compared with row 2 - i of b."""
    return float((out_a - out_b.flip(0)).abs().max())


SAME_TOKEN_AT = (598, 500, 0)
"""Where :func:`causal_same_token_qk` repeats the last (600th) token: 1, 99, 599 steps back."""


def causal_same_token_qk() -> tuple[torch.Tensor, torch.Tensor]:
    """Queries and keys ``(600, 16)`` of 600 random tokens in which the last token's own
    token also sits 1, 99 and 599 steps back (positions 598, 500, 0); seed 3, float64."""
    g = gen(3)
    d, t = 16, 600
    x = torch.randn(t, d, generator=g, dtype=F64)
    x[list(SAME_TOKEN_AT)] = x[t - 1].clone()
    wq, wk = torch.randn(2, d, d, generator=g, dtype=F64)
    return x @ wq, x @ wk


def counting_signal(t: int) -> torch.Tensor:
    """Output ``(t,)`` of a causal NoPE layer with equal logits everywhere that attends to a
    value present at token 0 only: 1/(i+1) at position i (float64)."""
    q = torch.zeros(1, 1, t, 4, dtype=F64)
    v = torch.zeros(1, 1, t, 1, dtype=F64)
    v[..., 0, 0] = 1.0
    return dot_product_attention(q, q, v, causal=True)[0, 0, :, 0]


def seed_mean(xs: Sequence[float]) -> float:
    """The mean over seeds."""
    return statistics.fmean(xs)


def seed_std(xs: Sequence[float]) -> float:
    """Sample standard deviation (0 for a single value)."""
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def seed_drop(big: Sequence[float], small: Sequence[float]) -> tuple[float, float]:
    """(mean(big) - mean(small), its standard error from the seed-to-seed spread of each)."""
    se = math.sqrt(seed_std(big) ** 2 / len(big) + seed_std(small) ** 2 / len(small))
    return seed_mean(big) - seed_mean(small), se


def above_chance(n_independent: int) -> float:
    """Accuracy a coin at 50% reaches with probability < 3e-7 on ``n_independent`` answers.

    Five standard errors of a fair coin, 0.5 / sqrt(n): "clearly above chance" as a number.
    """
    return 0.5 + 5 * 0.5 / math.sqrt(n_independent)


def independent_answers(n_sentences: int) -> int:
    """Held-out answers that can be wrong independently: one per ordered pair (A, B).

    The four verbs of one ordered pair ask the same question (who acts, A or B), so their
    answers are counted once; this makes the bar stricter, not looser.
    """
    from ..lab import dog_bites_man as dbm

    return n_sentences // len(dbm.VERBS)


def lab_summary() -> LabSummary:
    """The shipped summary of the default ``posemb lab`` run (see posemb.lab.report), read."""
    from ..lab import report

    return LabSummary.of(report.default_summary())


def recent_lab_summary() -> LabSummary:
    """The shipped summary of ``posemb lab --suite recent`` (the encodings of 2024-26 beside
    RoPE and NoPE, with the multikey, variable-tracking and flip-flop tasks), read."""
    from ..lab import report

    return LabSummary.of(report.recent_summary())


FAR = 4
"""RoPE's loss past the training length is claimed above the loss within it from ``FAR`` x
the training length on. At 2x the default run's two seeds lose 0.13 and 0.05 nats more past it
than within it: an excess within their spread, so no claim is made there."""


def param_counts() -> dict[str, int]:
    """Parameters of the lab's LM (width 128, 4 layers, 1024 positions) per encoding."""
    from ..lab.model import ModelConfig, TinyLM

    counts = {}
    for enc in ("nope", "sinusoidal", "learned", "rope", "xpos", "alibi", "t5", "fire"):
        model = TinyLM(ModelConfig(vocab=80, encoding=enc, width=128, layers=4, max_len=1024))
        counts[enc] = sum(p.numel() for p in model.parameters())
    return counts


def learned_row_gradient_norms(window: int = 16) -> torch.Tensor:
    """Gradient norm ``(64,)`` of each row of a 64-row learned table after one training step of
    the lab's LM on ``window``-token windows (seeded)."""
    from ..absolute import LearnedEmbedding
    from ..lab.model import ModelConfig, TinyLM

    with torch.random.fork_rng():
        torch.manual_seed(0)
        cfg = ModelConfig(vocab=80, encoding="learned", width=32, layers=1, heads=2, max_len=64)
        model = TinyLM(cfg)
    table = model.input_pos
    assert isinstance(table, LearnedEmbedding)
    tokens = torch.randint(0, 80, (8, window + 1), generator=gen(14))
    logits = model(tokens[:, :-1])
    torch.nn.functional.cross_entropy(logits.transpose(1, 2), tokens[:, 1:]).backward()
    assert table.weight.grad is not None
    return table.weight.grad.norm(dim=-1)


def worst_identity_error(
    lhs: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    rhs: Callable[[int, int], int],
) -> float:
    """max |lhs(R_m, R_n) - R_rhs(m, n)| over 12 fixed (m, n) pairs, d = 128.

    Angles up to 5e4 rad carry float64 rounding of ~5e4 * 1.1e-16, so ~1e-11 is exact here.
    """
    theta = inv_freq(128, dtype=F64)
    pairs = torch.randint(-5000, 50000, (12, 2), generator=gen(6)).tolist()
    return max(
        float(
            (
                lhs(rotation_matrix(m, theta), rotation_matrix(n, theta))
                - rotation_matrix(rhs(m, n), theta)
            )
            .abs()
            .max()
        )
        for m, n in pairs
    )


F64 = torch.float64


TOY_THETA = math.pi / 4  # the lesson's toy angle per step
