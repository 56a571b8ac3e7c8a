"""The lesson's mathematical claims, each as a check that measures something.

Every :class:`Claim` names the lesson screen it comes from, states what posemb checks, and
computes a measured value with posemb's own functions. Where the lesson says something else,
``lesson_says`` quotes it and ``verdict`` says how it fails; the check then tests the corrected
statement, so a passing row means "posemb measured the truth", and the verdict column says
whether the lesson agrees with it.

All checks run in float64 on the CPU with fixed seeds, so the measured numbers are the same on
every run on a given machine; the whole set takes about a second.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..absolute import LearnedEmbedding, sinusoidal_table
from ..attention import attention, attention_probs, permutation_matrix
from ..freqs import cos_sin, inv_freq, wavelengths
from ..rope import Layout, RotaryEmbedding, apply_rope, rope_complex, rotation_matrix

F64 = torch.float64
# float64 rounding after a few hundred multiply-adds: an identity that holds exactly in real
# arithmetic must come within this of zero, and a broken one misses by many orders more.
EXACT = 1e-10

# Lesson screens, by their question, shortened.
S_BLENDER = "1. Why attention treats 'dog bites man' and 'man bites dog' alike"
S_ADDITIVE = "2. Adding a learned or sinusoidal position tensor"
S_ABS_VS_ROPE = "3. Why absolute embeddings fail past the trained length"
S_PROOF = "4. Proof that RoPE logits depend on m - n"
S_GIVENS_2D = "5. RoPE through 2D Givens rotations"
S_SINUSOIDAL = "6. Vaswani sinusoids as harmonics"
S_CAROUSEL = "7. RoPE relative distance (carousel)"
S_BLOCKS = "8. Block-diagonal Givens rotations"
S_POSEMB = "posemb design rule (not in the lesson)"


@dataclass(frozen=True)
class Result:
    """What a check measured: ``passed``, a human-readable ``measured`` string, raw ``value``."""

    passed: bool
    measured: str
    value: float | list[float] | dict[str, float]


@dataclass(frozen=True)
class Claim:
    """One checked statement. ``verdict`` is 'holds' when the lesson says the same thing."""

    id: str
    screen: str
    claim: str
    check: Callable[[], Result]
    verdict: str = "holds"
    lesson_says: str | None = None

    def run(self) -> dict[str, object]:
        """Run the check; return the row as a JSON-ready dict."""
        r = self.check()
        return {
            "id": self.id,
            "claim": self.claim,
            "passed": bool(r.passed),
            "measured": r.measured,
            "value": r.value,
            "screen": self.screen,
            "verdict": self.verdict,
            "lesson_says": self.lesson_says,
        }


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _self_attention(x: torch.Tensor, w: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """One-head self-attention of ``x`` ``(T, d)`` with stacked projections ``w`` ``(3, d, d)``."""
    q, k, v = (x @ w[i] for i in range(3))
    return attention(q[None, None], k[None, None], v[None, None], causal=causal)[0, 0]


# --- screen 1 ----------------------------------------------------------------------------------


def _permutation_equivariance() -> Result:
    g = _gen(0)
    x = torch.randn(7, 16, generator=g, dtype=F64)
    w = torch.randn(3, 16, 16, generator=g, dtype=F64) / 4
    worst = 0.0
    for _ in range(20):
        p = permutation_matrix(torch.randperm(7, generator=g))
        worst = max(worst, (_self_attention(p @ x, w) - p @ _self_attention(x, w)).abs().max())
    worst = float(worst)
    return Result(worst < EXACT, f"max |Attn(PX) - P Attn(X)| = {worst:.1e} over 20 P", worst)


def _softmax_commutes() -> Result:
    g = _gen(1)
    a = torch.randn(9, 9, generator=g, dtype=F64)
    p = permutation_matrix(torch.randperm(9, generator=g))
    err = float((torch.softmax(p @ a @ p.T, -1) - p @ torch.softmax(a, -1) @ p.T).abs().max())
    return Result(err < EXACT, f"max |softmax(PAP^T) - P softmax(A) P^T| = {err:.1e}", err)


def _dog_bites_man() -> dict[str, float]:
    """Largest per-word output change between the two sentences, for each encoding."""
    g = _gen(2)
    d = 16
    emb = dict(zip(("dog", "bites", "man"), torch.randn(3, d, generator=g, dtype=F64), strict=True))
    w = torch.randn(3, d, d, generator=g, dtype=F64) / math.sqrt(d)
    a_words, b_words = ("dog", "bites", "man"), ("man", "bites", "dog")
    xa = torch.stack([emb[t] for t in a_words])
    xb = torch.stack([emb[t] for t in b_words])
    rope = RotaryEmbedding(d, layout=Layout.HALF)

    def rope_attn(x: torch.Tensor) -> torch.Tensor:
        q, k, v = (x @ w[i] for i in range(3))
        qr, kr = rope(q[None, None], k[None, None])
        return attention(qr, kr, v[None, None])[0, 0]

    pe = sinusoidal_table(3, d, dtype=F64)
    outs = {
        "none": (_self_attention(xa, w), _self_attention(xb, w)),
        "sinusoidal": (_self_attention(xa + pe, w), _self_attention(xb + pe, w)),
        "rope": (rope_attn(xa), rope_attn(xb)),
    }
    # Compare each word with itself across the sentences: sentence b lists the words reversed.
    return {name: float((oa - ob.flip(0)).abs().max()) for name, (oa, ob) in outs.items()}


def _dog_bites_man_without_positions() -> Result:
    diff = _dog_bites_man()["none"]
    return Result(
        diff < EXACT,
        f"max |out_a(word) - out_b(word)| = {diff:.1e}: same outputs, only reordered",
        diff,
    )


def _dog_bites_man_with_positions() -> Result:
    diffs = _dog_bites_man()
    sin_d, rope_d = diffs["sinusoidal"], diffs["rope"]
    return Result(
        min(sin_d, rope_d) > 1e-2,
        f"max per-word change: sinusoidal {sin_d:.3f}, RoPE {rope_d:.3f}",
        {"sinusoidal": sin_d, "rope": rope_d},
    )


def _dog_bites_man_trained() -> Result:
    from ..lab import dog_bites_man

    acc = dog_bites_man.run()
    nope = acc.pop("nope")
    worst = min(acc.values())
    shown = ", ".join(f"{k} {v:.3f}" for k, v in acc.items())
    return Result(
        nope <= dog_bites_man.CHANCE + 1e-9 and worst > 0.95,
        f"held-out accuracy: NoPE {nope:.3f}; {shown}",
        {"nope": nope, **acc},
    )


def _causal_logit_blind_to_distance() -> Result:
    g = _gen(3)
    d, t = 16, 600
    x = torch.randn(t, d, generator=g, dtype=F64)
    # The query's own token also sits 1, 99 and 599 steps back.
    x[[0, 500, 598]] = x[599].clone()
    wq, wk = torch.randn(2, d, d, generator=g, dtype=F64)
    probs = attention_probs((x @ wq)[None, None], (x @ wk)[None, None], causal=True)[0, 0, 599]
    w = probs[[598, 500, 0]]
    spread = float((w - w[0]).abs().max() / w[0])
    return Result(
        spread < EXACT,
        f"causal attention weight on one token 1, 99, 599 steps back: relative spread {spread:.1e}",
        spread,
    )


def _causal_mask_leaks_position() -> Result:
    # A uniform causal average of a value present only at the first token is 1/(i+1) at
    # position i: the count of visible tokens is an absolute position signal.
    t = 6
    q = torch.zeros(1, 1, t, 4, dtype=F64)
    v = torch.zeros(1, 1, t, 1, dtype=F64)
    v[..., 0, 0] = 1.0
    out = attention(q, q, v, causal=True)[0, 0, :, 0]
    expected = 1.0 / torch.arange(1, t + 1, dtype=F64)
    err = float((out - expected).abs().max())
    shown = ", ".join(f"{float(o):.3f}" for o in out)
    return Result(err < EXACT, f"causal NoPE output at positions 0..5: {shown}", out.tolist())


# --- screen 2 ----------------------------------------------------------------------------------


def _sinusoidal_shift_is_linear() -> Result:
    d = 768
    p = torch.arange(0, 4096, 7)
    table = sinusoidal_table(p, d, dtype=F64)
    theta = inv_freq(d, dtype=F64)
    worst = 0.0
    for k in (1, 7, 100, 1000):
        c, s = torch.cos(k * theta), torch.sin(k * theta)
        sin_p, cos_p = table[:, 0::2], table[:, 1::2]
        # M_k acts on each (sin, cos) pair with [[c, s], [-s, c]]; it is built from k alone.
        shifted = torch.stack((sin_p * c + cos_p * s, cos_p * c - sin_p * s), -1).flatten(-2)
        worst = max(worst, float((shifted - sinusoidal_table(p + k, d, dtype=F64)).abs().max()))
    return Result(
        worst < 1e-9,
        f"max |M_k PE(p) - PE(p+k)| = {worst:.1e} (d=768, 586 positions, k in 1,7,100,1000)",
        worst,
    )


def _random_cosine() -> Result:
    g = _gen(4)
    # 5000 pairs estimate the std to ~1% (its standard error is about std / sqrt(2n)).
    d, n = 768, 5000
    u, v = torch.randn(n, d, generator=g, dtype=F64), torch.randn(n, d, generator=g, dtype=F64)
    cos = torch.nn.functional.cosine_similarity(u, v, dim=-1)
    std, expect = float(cos.std()), 1 / math.sqrt(d)
    return Result(
        abs(std / expect - 1) < 0.05,
        f"std of cosine of random pairs = {std:.4f}; 1/sqrt(768) = {expect:.4f}",
        std,
    )


def _four_terms() -> Result:
    g = _gen(5)
    t, d, dk = 10, 32, 8
    x, p = torch.randn(t, d, generator=g, dtype=F64), torch.randn(t, d, generator=g, dtype=F64)
    wq, wk = torch.randn(d, dk, generator=g, dtype=F64), torch.randn(d, dk, generator=g, dtype=F64)
    lhs = ((x + p) @ wq) @ ((x + p) @ wk).T
    a = wq @ wk.T
    rhs = x @ a @ x.T + x @ a @ p.T + p @ a @ x.T + p @ a @ p.T
    err = float((lhs - rhs).abs().max() / lhs.abs().max())
    return Result(err < EXACT, f"relative |QK^T - sum of 4 terms| = {err:.1e}", err)


def _wavelengths_768() -> Result:
    lam = wavelengths(768)
    quoted = {0: 6.28, 32: 13.54, 128: 135.37, 383: 61342.74}
    got = {i: float(lam[i]) for i in quoted}
    ok = all(abs(got[i] - v) <= 0.006 * max(1.0, v / 1000) for i, v in quoted.items())
    shown = ", ".join(f"lambda_{i} = {got[i]:,.2f}" for i in quoted)
    return Result(ok, shown, {str(i): v for i, v in got.items()})


def _learned_has_no_row() -> Result:
    table = LearnedEmbedding(2048, 8)
    x = torch.zeros(1, 1, 8)
    table(x, torch.tensor([2047]))
    try:
        table(x, torch.tensor([2048]))
    except ValueError:
        return Result(True, "row 2047 exists; position 2048 raises ValueError", 2048.0)
    return Result(False, "position 2048 was looked up without error", 2048.0)


# --- RoPE screens --------------------------------------------------------------------------------


def _rope_matrices(d: int = 128) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    g = _gen(6)
    pairs = [(int(a), int(b)) for a, b in torch.randint(-5000, 50000, (12, 2), generator=g)]
    return inv_freq(d, dtype=F64), pairs


def _worst_identity_error(
    lhs: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    rhs: Callable[[int, int], int],
) -> float:
    """max |lhs(R_m, R_n) - R_rhs(m, n)| over the fixed (m, n) pairs, d = 128.

    Angles up to 5e4 rad carry float64 rounding of ~5e4 * 1.1e-16, so ~1e-11 is exact here.
    """
    theta, pairs = _rope_matrices()
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


def _rope_relative() -> Result:
    err = _worst_identity_error(lambda rm, rn: rm.T @ rn, lambda m, n: n - m)
    return Result(err < EXACT, f"max |R_m^T R_n - R_(n-m)| = {err:.1e} (d=128, 12 pairs)", err)


def _rope_group() -> Result:
    err = _worst_identity_error(lambda rm, rn: rm @ rn, lambda m, n: m + n)
    return Result(err < EXACT, f"max |R_m R_n - R_(m+n)| = {err:.1e} (d=128, 12 pairs)", err)


def _rope_det() -> Result:
    theta, pairs = _rope_matrices()
    dets = [float(torch.linalg.det(rotation_matrix(m, theta))) for m, _ in pairs]
    err = max(abs(v - 1) for v in dets)
    orth = max(
        float(
            (rotation_matrix(m, theta).T @ rotation_matrix(m, theta) - torch.eye(128, dtype=F64))
            .abs()
            .max()
        )
        for m, _ in pairs
    )
    return Result(
        max(err, orth) < EXACT,
        f"max |det R_m - 1| = {err:.1e}, max |R_m^T R_m - I| = {orth:.1e}",
        {"det": err, "orthogonality": orth},
    )


def _rope_norm() -> Result:
    g = _gen(7)
    x = torch.randn(2, 4, 64, 128, generator=g, dtype=F64)
    pos = torch.randint(0, 1 << 20, (2, 64), generator=g)
    y = RotaryEmbedding(128).rotate(x, pos)
    err = float(((y.norm(dim=-1) - x.norm(dim=-1)).abs() / x.norm(dim=-1)).max())
    return Result(err < EXACT, f"max relative | ||R_m x|| - ||x|| | = {err:.1e}", err)


def _rope_logit_relative() -> Result:
    g = _gen(8)
    rope = RotaryEmbedding(128)
    q = torch.randn(1, 1, 1, 128, generator=g, dtype=F64)
    k = torch.randn(1, 1, 1, 128, generator=g, dtype=F64)

    def logit(m: int, n: int) -> float:
        return float((rope.rotate(q, torch.tensor([m])) * rope.rotate(k, torch.tensor([n]))).sum())

    base = logit(10, 3)
    shifted = [logit(10 + s, 3 + s) for s in (1, 1000, 123_457)]
    err = max(abs(v - base) for v in shifted) / abs(base)
    return Result(
        err < 1e-9,
        f"logit(m=10,n=3) = {base:.6f}; shifted by 1, 1000, 123457: max relative change {err:.1e}",
        err,
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


def _rope_no_parameters() -> Result:
    n = sum(p.numel() for p in RotaryEmbedding(128).parameters())
    return Result(n == 0, f"RotaryEmbedding(128) has {n} parameters", float(n))


def _three_forms() -> Result:
    g = _gen(9)
    theta = inv_freq(32, dtype=F64)
    x = torch.randn(1, 2, 9, 32, generator=g, dtype=F64)
    pos = torch.tensor([0, 1, 2, 3, 17, 250, 4096, 65_537, 1 << 20])
    worst = 0.0
    for lay in Layout:
        cos, sin = cos_sin(pos, theta, dtype=F64)
        elementwise = apply_rope(x, cos, sin, lay)
        complex_form = rope_complex(x, pos, theta, lay)
        mats = torch.stack([rotation_matrix(int(p), theta, lay) for p in pos])
        matrix_form = torch.einsum("sij,bhsj->bhsi", mats, x)
        worst = max(
            worst,
            float((elementwise - complex_form).abs().max()),
            float((elementwise - matrix_form).abs().max()),
        )
    return Result(
        worst < EXACT,
        f"max difference between elementwise, matrix and complex forms = {worst:.1e}",
        worst,
    )


def _fastest_pair_period() -> Result:
    lam = float(wavelengths(768)[0])
    return Result(
        abs(lam - 2 * math.pi) < 1e-12,
        f"theta_0 = 1 rad/step, so one full turn takes {lam:.4f} steps",
        lam,
    )


def _slowest_pair_period() -> Result:
    lam768, lam128 = float(wavelengths(768)[-1]), float(wavelengths(128)[-1])
    ok = lam768 > 6 * 10000 and lam128 > 5 * 10000
    return Result(
        ok,
        f"slowest pair turns once per {lam768:,.1f} steps at d=768 "
        f"({lam128:,.1f} at head_dim 128); 2*pi*10000 = {2 * math.pi * 1e4:,.1f} is the limit",
        {"d768": lam768, "d128": lam128},
    )


def _layouts_differ() -> Result:
    g = _gen(10)
    d = 16
    theta = inv_freq(d, dtype=F64)
    x = torch.randn(1, 1, 5, d, generator=g, dtype=F64)
    pos = torch.arange(5)
    cos, sin = cos_sin(pos, theta, dtype=F64)
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


CLAIMS: tuple[Claim, ...] = (
    Claim(
        "attention.permutation_equivariance",
        S_BLENDER,
        "Unmasked self-attention is permutation equivariant: Attn(PX) = P Attn(X).",
        _permutation_equivariance,
    ),
    Claim(
        "attention.softmax_commutes",
        S_BLENDER,
        "Row-wise softmax commutes with permuting rows and columns together.",
        _softmax_commutes,
    ),
    Claim(
        "attention.dog_bites_man.no_positions",
        S_BLENDER,
        "Without positions, 'dog bites man' and 'man bites dog' give each word the same output.",
        _dog_bites_man_without_positions,
    ),
    Claim(
        "attention.dog_bites_man.with_positions",
        S_BLENDER,
        "With sinusoidal or rotary positions, the two sentences give different outputs.",
        _dog_bites_man_with_positions,
    ),
    Claim(
        "attention.dog_bites_man.trained",
        S_BLENDER,
        "A bidirectional encoder trained to say who acts in 'A verb B' stays at chance (50%) "
        "without positions and exceeds 95% with any encoding.",
        _dog_bites_man_trained,
    ),
    Claim(
        "attention.causal_logit_blind_to_distance",
        S_BLENDER,
        "A causal mask alone does not make a logit depend on how far back the key is.",
        _causal_logit_blind_to_distance,
    ),
    Claim(
        "attention.causal_mask_leaks_position",
        S_BLENDER,
        "A causal mask does let a layer recover absolute position by counting visible tokens.",
        _causal_mask_leaks_position,
        verdict="overstated",
        lesson_says="explicit positional encodings are required (with a causal mask)",
    ),
    Claim(
        "absolute.sinusoidal_shift_is_linear",
        S_ADDITIVE,
        "PE(p+k) = M_k PE(p) with M_k built from k alone (independent of p).",
        _sinusoidal_shift_is_linear,
    ),
    Claim(
        "absolute.random_vectors_near_orthogonal",
        S_ADDITIVE,
        "Random vectors in R^768 have cosine similarity with std about 1/sqrt(768).",
        _random_cosine,
    ),
    Claim(
        "absolute.four_term_decomposition",
        S_ADDITIVE,
        "With additive positions, QK^T splits into token-token, token-pos, pos-token, "
        "pos-pos terms.",
        _four_terms,
    ),
    Claim(
        "absolute.learned_table_has_no_row_past_max_len",
        S_ABS_VS_ROPE,
        "A learned table of 2048 rows has no vector for position 2048 or later.",
        _learned_has_no_row,
    ),
    Claim(
        "sinusoidal.wavelengths_768",
        S_SINUSOIDAL,
        "At d=768 the wavelengths of channels 0, 32, 128, 383 are 6.28, 13.54, 135.37, "
        "61,342.74 tokens.",
        _wavelengths_768,
    ),
    Claim(
        "rope.fastest_pair_period",
        S_BLOCKS,
        "The fastest pair (theta_0 = 1 rad) completes a turn every 2*pi ~ 6.28 steps.",
        _fastest_pair_period,
        verdict="wrong",
        lesson_says="Couple 1 spins fast (one full spin every 2 steps)",
    ),
    Claim(
        "rope.slowest_pair_period",
        S_BLOCKS,
        "The slowest pair turns once per ~61,343 steps at d=768, not once per 10,000.",
        _slowest_pair_period,
        verdict="wrong",
        lesson_says="Couple 384 spins like a giant grandfather clock (one spin every 10,000 steps)",
    ),
    Claim(
        "rope.norm_preserved",
        S_GIVENS_2D,
        "Rotation preserves the norm: ||R_m x|| = ||x||.",
        _rope_norm,
    ),
    Claim(
        "rope.relative_composition",
        S_PROOF,
        "R_m^T R_n = R_(n-m).",
        _rope_relative,
    ),
    Claim(
        "rope.group_homomorphism",
        S_BLOCKS,
        "R_m R_n = R_(m+n).",
        _rope_group,
    ),
    Claim(
        "rope.determinant_and_orthogonality",
        S_BLOCKS,
        "det R_m = 1 and R_m^T R_m = I.",
        _rope_det,
    ),
    Claim(
        "rope.logit_depends_on_offset_only",
        S_CAROUSEL,
        "<R_m q, R_n k> depends on m - n only.",
        _rope_logit_relative,
    ),
    Claim(
        "rope.toy_trace",
        S_PROOF,
        "theta = pi/4, m = 3, n = 1, q = k = [1, 0]: the rotated dot product is 0.",
        _toy_trace,
    ),
    Claim(
        "rope.no_learnable_parameters",
        S_ABS_VS_ROPE,
        "RoPE has no learnable parameters.",
        _rope_no_parameters,
    ),
    Claim(
        "rope.three_forms_agree",
        S_BLOCKS,
        "The elementwise, block-diagonal matrix and complex-number forms of RoPE agree.",
        _three_forms,
    ),
    Claim(
        "rope.layouts_are_different_pairings",
        S_BLOCKS,
        "rotate_half pairs channel j with j + d/2, not (2i-1, 2i) as the Givens matrix on the "
        "same screen does; the two agree only after permuting channels.",
        _layouts_differ,
        verdict="incomplete",
        lesson_says="x_rotated = x * cos(m theta) + rotate_half(x) * sin(m theta), beside a "
        "Givens matrix on planes (2i-1, 2i), with no word on the pairing",
    ),
    Claim(
        "precision.float64_angles",
        S_POSEMB,
        "posemb's cos at position 2^20 is within 1e-6 of exact; a float32 product is not.",
        _float32_angles,
        verdict="n/a",
    ),
)


def run_all() -> list[dict[str, object]]:
    """Run every claim in order; return the rows (see :meth:`Claim.run`)."""
    return [c.run() for c in CLAIMS]


__all__ = ["CLAIMS", "Claim", "Result", "run_all"]
