"""Screen 1, attention without positions is a blender: permutation equivariance, the two sentences,
the causal mask's counting signal, and small encoders trained to tell who acts.

Its text, its claims with their checks, and its figures: editing this screen is this file
(and its test, ``tests/lesson/test_s01_blender.py``).
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from typing import Any
from xml.sax.saxutils import escape

import torch

from ... import attention, rope
from ..._errors import InputError
from ...attention import attention_probs, permutation_matrix
from ...lab import dog_bites_man as dbm
from .. import charts, diagrams, measure
from ..charts import alt
from ..measure import EXACT, F64, above_chance, independent_answers, seed_drop, seed_mean, seed_std
from ..registry import Control, Figure, Result, claim, exercise, figure, make_figure, screen

SCREEN = screen(
    __name__,
    title="Why attention treats 'dog bites man' and 'man bites dog' alike",
    question=(
        "Why does self-attention without positions give 'dog bites man' and 'man bites dog' "
        "the same reading?"
    ),
    goal=(
        "Show that attention without positions is permutation equivariant, "
        "Attn(PX) = P Attn(X), and say why word order has to be put in by hand."
    ),
    intuition=(
        "Attention compares every token with every other token through dot products of "
        "their projections. Nothing in those products records where a token stood: shuffle "
        "the rows of the input and the same pairs meet with the same scores, so the outputs "
        "are the same rows, shuffled the same way.",
        "For a sentence this means the word 'dog' gets exactly the same vector whether it "
        "bites or is bitten. The figures below run posemb's attention on both sentences and "
        "compare the per-word outputs with and without a position signal.",
        "A causal mask does not rescue this on its own. It hides the future, but among the "
        "visible keys a token seen 1 step back and 599 steps back get the same score; what "
        "leaks through is only how many keys are visible, a weak counting signal.",
    ),
    maths=(
        r"\tilde X = PX,\quad \tilde Q = PQ,\ \tilde K = PK,\ \tilde V = PV",
        r"\operatorname{softmax}\!\Big(\tfrac{PQK^\top P^\top}{\sqrt{d_k}}\Big) PV"
        r" = P\,\operatorname{softmax}\!\Big(\tfrac{QK^\top}{\sqrt{d_k}}\Big)V",
    ),
    trap=(
        "Thinking the causal mask already tells the model where tokens are. It limits which "
        "keys a query sees, but says nothing about how far back a visible key is."
    ),
    terms_title="The encodings on this page",
    terms=(
        ("NoPE", "no positions at all: attention sees a bag of tokens (a causal mask aside)."),
        (
            "sinusoidal, learned",
            "absolute: a vector per position added to each token before the first layer, fixed "
            "sines and cosines (Vaswani et al. 2017) or a trained table (GPT-2, BERT).",
        ),
        (
            "RoPE, xPos",
            "rotary: q and k turned by an angle proportional to their position in every layer, "
            "so a logit sees only their distance (Su et al. 2021); xPos adds a decay to it.",
        ),
        ("ALiBi", "a fixed penalty on each logit, proportional to the distance |i - j|."),
        (
            "T5, FIRE",
            "a learned bias on each logit as a function of the distance: T5 in log-spaced "
            "buckets, FIRE through a small network of the normalised distance.",
        ),
    ),
)
"""This screen's text; its number comes from the module's name."""


@claim(
    "attention.permutation_equivariance",
    SCREEN,
    "Unmasked self-attention is permutation equivariant: Attn(PX) = P Attn(X).",
)
def _permutation_equivariance() -> Result:
    g = measure.gen(0)
    x = torch.randn(7, 16, generator=g, dtype=F64)
    w = torch.randn(3, 16, 16, generator=g, dtype=F64) / 4
    worst = 0.0
    for _ in range(20):
        p = permutation_matrix(torch.randperm(7, generator=g))
        err = (measure.self_attention(p @ x, w) - p @ measure.self_attention(x, w)).abs().max()
        worst = max(worst, float(err))
    return Result(worst < EXACT, f"max |Attn(PX) - P Attn(X)| = {worst:.1e} over 20 P", worst)


@claim(
    "attention.softmax_commutes",
    SCREEN,
    "Row-wise softmax commutes with permuting rows and columns together.",
)
def _softmax_commutes() -> Result:
    g = measure.gen(1)
    a = torch.randn(9, 9, generator=g, dtype=F64)
    p = permutation_matrix(torch.randperm(9, generator=g))
    err = float((torch.softmax(p @ a @ p.T, -1) - p @ torch.softmax(a, -1) @ p.T).abs().max())
    return Result(err < EXACT, f"max |softmax(PAP^T) - P softmax(A) P^T| = {err:.1e}", err)


def _dog_bites_man() -> dict[str, float]:
    """Largest per-word output change between the two sentences, for each encoding."""
    return {
        name: measure.word_change(*pair) for name, pair in measure.dog_bites_man_outputs().items()
    }


@claim(
    "attention.dog_bites_man.no_positions",
    SCREEN,
    "Without positions, 'dog bites man' and 'man bites dog' give each word the same output.",
)
def _dog_bites_man_without_positions() -> Result:
    diff = _dog_bites_man()["none"]
    return Result(
        diff < EXACT,
        f"max |out_a(word) - out_b(word)| = {diff:.1e}: same outputs, only reordered",
        diff,
    )


@claim(
    "attention.dog_bites_man.with_positions",
    SCREEN,
    "With sinusoidal or rotary positions, the two sentences give different outputs.",
)
def _dog_bites_man_with_positions() -> Result:
    diffs = _dog_bites_man()
    sin_d, rope_d = diffs["sinusoidal"], diffs["rope"]
    return Result(
        min(sin_d, rope_d) > 1e-2,
        f"max per-word change: sinusoidal {sin_d:.3f}, RoPE {rope_d:.3f}",
        {"sinusoidal": sin_d, "rope": rope_d},
    )


@claim(
    "attention.dog_bites_man.trained",
    SCREEN,
    "A bidirectional encoder trained to say who acts in 'A verb B' (16 entities, held-out "
    "pairs) is at chance without positions and clearly above chance with any encoding, on "
    "every seed.",
)
def _dog_bites_man_trained() -> Result:

    acc = dbm.accuracy_over_seeds()
    nope = acc.pop("nope")
    bar = above_chance(independent_answers(len(dbm.make_data(0).test_y)))
    worst = min(min(v) for v in acc.values())
    shown = ", ".join(f"{k} {seed_mean(v):.3f} ± {seed_std(v):.3f}" for k, v in acc.items())
    return Result(
        all(abs(a - dbm.CHANCE) < 1e-9 for a in nope) and worst > bar,
        f"held-out accuracy over {len(nope)} seeds (mean ± std): NoPE "
        f"{seed_mean(nope):.3f} ± {seed_std(nope):.3f}; {shown}; bar for 'clearly above chance' "
        f"{bar:.3f}, lowest single seed {worst:.3f}",
        {"nope": nope, **acc, "bar": bar},
    )


SMALL_TASK_SEEDS = tuple(range(10))  # small-task runs are cheap (~1 s); the effect is ~0.1


@claim(
    "attention.dog_bites_man.small_task_memorises",
    SCREEN,
    "On a small task (8 entities, 20 training pairs) ALiBi, whose only positional signal is a "
    "distance penalty, fits every training sentence but loses held-out accuracy against the "
    "16-entity task: it memorises pairs; T5's learned buckets do not lose it.",
    verdict="n/a",
)
def _dog_bites_man_small_task() -> Result:

    small = dbm.memorisation(seeds=SMALL_TASK_SEEDS)
    big = dbm.accuracy_over_seeds()
    rows, ok = [], True
    for enc in ("alibi", "t5"):
        drop, se = seed_drop(big[enc], small[enc]["held_out"])
        fits = min(small[enc]["train"]) == 1.0
        # Three standard errors of the difference: a drop, or none, beyond seed noise.
        ok = ok and fits and (drop > 3 * se if enc == "alibi" else drop < 3 * se)
        rows.append(
            f"{enc}: train {seed_mean(small[enc]['train']):.3f}, held-out "
            f"{seed_mean(small[enc]['held_out']):.3f} ± {seed_std(small[enc]['held_out']):.3f} "
            f"(16 entities {seed_mean(big[enc]):.3f}; drop {drop:.3f}, 3 standard errors "
            f"{3 * se:.3f})"
        )
    return Result(
        ok,
        "; ".join(rows) + f"; {len(SMALL_TASK_SEEDS)} seeds small, {len(big['alibi'])} large",
        small,
    )


@claim(
    "attention.causal_same_key_same_weight",
    SCREEN,
    "Under a causal mask alone, the same key 1, 99 and 599 steps back gets the same attention "
    "weight: the mask hides the future but does not tell near from far.",
)
def _causal_logit_blind_to_distance() -> Result:
    q, k = measure.causal_same_token_qk()
    probs = attention_probs(q[None, None], k[None, None], causal=True)[0, 0, -1]
    w = probs[list(measure.SAME_TOKEN_AT)]
    spread = float((w - w[0]).abs().max() / w[0])
    return Result(
        spread < EXACT,
        f"causal attention weight on one token 1, 99, 599 steps back: relative spread {spread:.1e}",
        spread,
    )


@claim(
    "attention.causal_mask_leaks_position",
    SCREEN,
    "A causal layer without positions can still read absolute position by counting: "
    "attending uniformly to a value present at token 0 outputs 1/(i+1) at position i.",
    verdict="overstated",
    lesson_says="explicit positional encodings are required (with a causal mask)",
)
def _causal_mask_leaks_position() -> Result:
    t = 6
    out = measure.counting_signal(t)
    expected = 1.0 / torch.arange(1, t + 1, dtype=F64)
    err = float((out - expected).abs().max())
    shown = ", ".join(f"{float(o):.3f}" for o in out)
    return Result(
        err < EXACT and len(set(round(float(o), 9) for o in out)) == t,
        f"causal NoPE output at positions 0..5: {shown} (all distinct)",
        out.tolist(),
    )


ENCODING_NAMES = {"no positions": "none", "sinusoidal": "sinusoidal", "RoPE": "rope"}


BLENDER_CELL = 26  # px per channel: 16 channels make a 416 px strip


def _strip(x: float, y: float, row: list[float], vmax: float, blank_below: float | None) -> str:
    """One word's output as a strip of coloured channel cells (blank where ``|v|`` is below
    ``blank_below``)."""
    cell = BLENDER_CELL
    out = []
    for j, v in enumerate(row):
        if blank_below is not None and abs(v) < blank_below:
            fill = 'fill="none" stroke="currentColor" stroke-opacity="0.25"'
        else:
            fill = f'fill="{diagrams.diverging_rgb(v, vmax)}" stroke="#ffffff" stroke-width="0.5"'
        out.append(
            f'<rect x="{x + j * cell}" y="{y}" width="{cell}" height="{cell}" {fill}>'
            f"<title>channel {j}: {v:.4g}</title></rect>"
        )
    return "".join(out)


@figure("fig-blender")
def fig_blender(summary: dict[str, Any]) -> Figure:
    """Per-word outputs of one attention layer for 'dog bites man' and 'man bites dog'."""
    outs = measure.dog_bites_man_outputs()
    words = measure.DOG_BITES_MAN
    vmax = max(float(t.abs().max()) for pair in outs.values() for t in pair)
    cell, x0, y0, block = BLENDER_CELL, 200, 56, 3 * (BLENDER_CELL + 6) + 26
    channels = next(iter(outs.values()))[0].shape[1]

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
                    ("difference", diff, EXACT),
                )
            ):
                yy = y + s_ * (cell + 6)
                body.append(
                    f'<text x="{x0 - 8}" y="{yy + cell * 0.7}" font-size="13" '
                    f'text-anchor="end">{escape(label)}</text>'
                )
                body.append(_strip(x0, yy, row, vmax, blank))
            largest = max(abs(v) for v in diff)
            body.append(
                f'<text x="{x0 + channels * cell + 10}" y="{y + 2 * (cell + 6) + cell * 0.7}" '
                f'font-size="13">largest {largest:.3g}</text>'
            )
        ly = y0 + len(words) * block
        body.append(f'<text x="4" y="{ly + 12}" font-size="13">output value</text>')
        body.append(diagrams.diverging_legend(x0, ly, vmax))
        change = measure.word_change(out_a, out_b)
        svg = diagrams.svg(
            x0 + channels * cell + 110,
            ly + 44,
            f"Attention outputs of dog, bites and man in both sentences and their difference, "
            f"{encoding}",
            "".join(body),
        )
        words_ = " (zero up to float64 rounding)" if change < EXACT else ""
        return svg, f"largest per-word change between the sentences = {change:.3g}{words_}"

    return make_figure(
        "fig-blender",
        SCREEN,
        "The blender: the same words, the same outputs",
        "One self-attention layer (random embeddings and projections, float64) reads 'dog bites "
        "man' and 'man bites dog'. Without positions each word gets exactly the same output in "
        "both sentences (the difference rows stay blank): attention only reordered the rows. "
        "Sinusoidal or rotary positions make the outputs differ.",
        "posemb.lesson.claims.dog_bites_man_outputs()",
        "Colour strips of each word's 16-channel attention output in both sentences, and a "
        "third strip of their difference: blank without positions, coloured with sinusoidal or "
        "RoPE positions. A colour bar gives the values.",
        kind="svg",
        draw=draw,
        controls=[Control("fig-blender-encoding", "positions", "toggle", tuple(ENCODING_NAMES), 0)],
    )


PERMUTATION_STEPS = ("1 inputs X", "2 queries X W_Q", "3 logits QK^T/√d", "4 softmax", "5 output")


@figure("fig-permutation")
def fig_permutation(summary: dict[str, Any]) -> Figure:
    """Step through Attn(P X) = P Attn(X): each intermediate from X and from P X."""
    g = torch.Generator().manual_seed(31)
    d = 6
    words = measure.DOG_BITES_MAN
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
                            "v": charts.rounded(mat[r, c]),
                        }
                    )
        chart = (
            charts.heat(
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
        return charts.spec(chart, rows), f"max |f(P X) - {what}| = {charts.zero_error(err)}"

    return make_figure(
        "fig-permutation",
        SCREEN,
        "Attn(P X) = P Attn(X), step by step",
        "Each step of one attention layer computed from X ('dog bites man') and from P X ('man "
        "bites dog'): every intermediate is the same numbers with rows (and, for the logits and "
        "weights, columns) reordered, so the output is too.",
        "posemb.permutation_matrix([2, 1, 0]); posemb.attention_probs(q, k); "
        "posemb.dot_product_attention(q, k, v)",
        "Two heatmaps per step, from X and from P X, holding the same values in permuted rows.",
        kind="vega",
        draw=draw,
        controls=[Control("fig-permutation-step", "step", "slider", PERMUTATION_STEPS, 0)],
    )


CAUSAL_LOGIT_STD = 1.0
"""Spread of the last query's logits after :func:`fig_causal_same_token` scales q and k: the
raw logits spread so widely that softmax puts nearly all weight on one key (and 1e-10 on the
token's own copies); at 1 every weight stays within a factor ~10 of 1/600, on a linear axis."""


CAUSAL_ENCODINGS = ("no positions", "RoPE")


def _causal_chart(t: int) -> alt.TopLevelMixin:
    """The three copies' weights as bars, side by side per encoding, and the uniform 1/t."""
    bars = (
        alt.Chart(charts.rows_source())
        .mark_bar(aria=False)
        .encode(
            x=alt.X(
                "back:O",
                title="steps back from the last token to its own token",
                axis=alt.Axis(labelAngle=0),
            ),
            xOffset=alt.XOffset("encoding:N", sort=list(CAUSAL_ENCODINGS)),
            y=alt.Y("w:Q", title="attention weight of the last token"),
            color=alt.Color(
                "encoding:N", title=None, scale=charts.colors(CAUSAL_ENCODINGS), sort=None
            ),
            tooltip=["encoding:N", "back:O", alt.Tooltip("w:Q", format=".5g")],
        )
    )
    uniform = alt.Chart(
        charts.inline_data([{"w": charts.rounded(1 / t), "label": f"1/{t}: every key alike"}])
    ).encode(y="w:Q")
    rule = uniform.mark_rule(aria=False, strokeDash=[4, 4], color=charts.INK[7]).encode(
        tooltip=["label:N"]
    )
    label = uniform.mark_text(
        aria=False, align="right", baseline="bottom", dy=-2, color=charts.INK[7], fontSize=12
    ).encode(x=alt.value({"expr": "width"}), text="label:N")
    return (bars + rule + label).properties(width=charts.WIDE - 300, height=240)


@figure("fig-causal-same-token")
def fig_causal_same_token(summary: dict[str, Any]) -> Figure:
    """The causal attention weights the last token gives its own token 1, 99 and 599 steps
    back, without positions and with RoPE."""
    q, k = measure.causal_same_token_qk()
    t = q.shape[0]
    # One factor for q and k alike: the same token still meets the same key, scaled.
    scale = math.sqrt(CAUSAL_LOGIT_STD / float((k[:-1] @ q[-1]).std()))
    q, k = q * scale, k * scale
    rotary = rope.RotaryEmbedding(q.shape[1])
    at = torch.arange(t)
    weights = {}
    for encoding in CAUSAL_ENCODINGS:
        qq, kk = q[None, None], k[None, None]
        if encoding == "RoPE":
            qq, kk = rotary.rotate(qq, at), rotary.rotate(kk, at)
        probs = attention.attention_probs(qq, kk, causal=True)[0, 0, -1]
        weights[encoding] = [float(probs[pos]) for pos in measure.SAME_TOKEN_AT]
    backs = [t - 1 - pos for pos in measure.SAME_TOKEN_AT]

    def draw() -> tuple[object, str]:
        rows = [
            {"encoding": e, "back": b, "w": charts.rounded(w, 6)}
            for e, ws in weights.items()
            for b, w in zip(backs, ws, strict=True)
        ]
        parts = []
        for e, w in weights.items():
            spread = (max(w) - min(w)) / w[0]
            same = "the same" if spread < EXACT else "not the same"
            parts.append(f"{e}: {same} ({', '.join(f'{v:.4g}' for v in w)}; spread {spread:.1e})")
        return charts.spec(_causal_chart(t), rows), "weights 1, 99, 599 back: " + "; ".join(parts)

    return make_figure(
        "fig-causal-same-token",
        SCREEN,
        "A causal mask does not tell near from far",
        "The last of 600 random tokens attends causally to the 599 before it; its own token also "
        "sits 1, 99 and 599 steps back. Without positions the three copies get exactly the same "
        "weight: the mask hides the future but gives no distance. With RoPE they differ. (q and "
        f"k are scaled by one factor so the logits spread by {CAUSAL_LOGIT_STD}: the weights stay "
        "near 1/600 instead of one key taking all.)",
        "posemb.attention_probs(q, k, causal=True) on posemb.lesson.measure.causal_same_token_qk()",
        "Bars of the attention weight on the three copies of the last token, 1, 99 and 599 steps "
        "back: equal without positions, three different heights with RoPE.",
        kind="vega",
        draw=draw,
    )


@figure("fig-counting")
def fig_counting(summary: dict[str, Any]) -> Figure:
    """The 1, 1/2, 1/3 ... signal a causal NoPE layer can read position from."""
    t = 16
    out = measure.counting_signal(t)

    names, key = ("attention output", "1/(i+1)"), charts.line_legend()

    def draw() -> tuple[object, str]:
        rows = [
            {"position": i, "value": charts.rounded(out[i], 6), "series": "attention output"}
            for i in range(t)
        ]
        rows += [
            {"position": i, "value": charts.rounded(1 / (i + 1), 6), "series": "1/(i+1)"}
            for i in range(t)
        ]
        chart = (
            alt.Chart(charts.rows_source())
            .mark_line(aria=False, point=alt.OverlayMarkDef(aria=False))
            .encode(
                x=alt.X("position:Q", title="position i"),
                y=alt.Y("value:Q", title="output"),
                color=alt.Color("series:N", title=None, scale=charts.colors(names), legend=key),
                strokeDash=charts.dashes("series:N", names, title=None, legend=key),
                tooltip=["position:Q", alt.Tooltip("value:Q", format=".6f"), "series:N"],
            )
            .properties(width=charts.WIDE - 140, height=220)
        )
        shown = ", ".join(f"{float(v):.4f}" for v in out[:6])
        return charts.spec(chart, rows), f"outputs at positions 0-5: {shown}"

    return make_figure(
        "fig-counting",
        SCREEN,
        "But a causal layer can count",
        "Equal logits under a causal mask average over the tokens seen so far; a value present "
        "only at token 0 comes out as 1/(i+1) at position i, a different number at every "
        "position. A causal model without positions can read absolute position from it.",
        "posemb.lesson.claims.counting_signal(16)",
        "Line of the attention output by position, falling 1, 1/2, 1/3, ..., on top of 1/(i+1).",
        kind="vega",
        draw=draw,
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


@figure("fig-trained-attention", prepare=_trained_rope_encoder)
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
            | {"weight": charts.rounded(weights[h, i, j])}
            for h in range(weights.shape[0])
            for i in range(4)
            for j in range(4)
        ]
        chart = charts.heat(
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
        return charts.spec(chart, rows), (
            f"predicts '{dbm.ENTITIES[best]}' acts (p = {float(probs[best]):.3f}); sentence "
            f"{seen}; held-out accuracy {accuracy:.3f}"
        )

    return make_figure(
        "fig-trained-attention",
        SCREEN,
        "What a trained RoPE encoder attends to",
        "A one-layer RoPE encoder trained on 'A verb B' as posemb verify trains it (seed 0), "
        f"for {TRAINED_STEPS} steps, reads both sentences; each head's attention weights, rows "
        "the querying token. The same words give different weights in the two orders, and the "
        "[CLS] row names who acts.",
        f"posemb.lab.dog_bites_man.trained_encoder('rope', 0, steps={TRAINED_STEPS})"
        ".attention_weights(tokens)",
        "Four 4x4 heatmaps of attention weights, one per head, for the chosen sentence.",
        kind="vega",
        draw=draw,
        controls=[Control("fig-trained-attention-sentence", "sentence", "toggle", SENTENCES, 0)],
    )


Y_TITLE = "held-out accuracy"
ACCURACY_WIDTH = charts.WIDE - 120  # room on the right for the rules' labels


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


def _accuracy_rows(accuracies: dict[str, list[float]], bar: float) -> list[dict[str, object]]:
    """The chart's rows: one mean per encoding (above the bar on every seed or not), one dot
    per seed."""
    rows: list[dict[str, object]] = []
    for e, accs in accuracies.items():
        mean = statistics.fmean(accs)
        rows.append(
            {
                "encoding": e,
                "acc": charts.rounded(mean),
                "label": f"{mean:.3f}",
                "kind": "mean",
            }
            | {"seeds": len(accs), "above": "yes" if min(accs) > bar else "no"}
        )
        rows += [{"encoding": e, "acc": charts.rounded(a), "kind": "seed"} for a in accs]
    return rows


def _listed(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _accuracy_caption(accuracies: dict[str, list[float]], bar: float) -> str:
    """What the accuracy chart shows, in words, from the rows it draws: whether the encoding
    without positions stays at chance, which encodings clear the pass bar on every seed and
    which do not."""
    said: list[str] = []
    if "nope" in accuracies:
        nope = accuracies["nope"]
        said.append(
            f"Without positions, nope stays at chance ({dbm.CHANCE}) on every seed"
            if all(abs(a - dbm.CHANCE) < 1e-9 for a in nope)
            else f"Without positions, nope is not at chance ({dbm.CHANCE}) on every seed (mean "
            f"{statistics.fmean(nope):.3f})"
        )
    means = {str(r["encoding"]): r for r in _accuracy_rows(accuracies, bar) if r["kind"] == "mean"}
    with_positions = [e for e in means if e != "nope"]
    clear = [e for e in with_positions if means[e]["above"] == "yes"]
    short = [e for e in with_positions if means[e]["above"] == "no"]
    bar_words = f"the pass bar ({bar:.3f}, five standard errors of a coin above chance)"
    lowest = [f"{e} does not (lowest seed {min(accuracies[e]):.3f})" for e in short]
    if clear:
        verb = "clears" if len(clear) == 1 else "clear"
        said.append(f"{_listed(clear)} {verb} {bar_words} on every seed")
    elif short:
        said.append(f"no encoding with positions clears {bar_words} on every seed")
    return "; ".join(said + lowest) + "."


@figure("fig-trained-accuracy", reads_claims=True)
def fig_trained_accuracy(
    summary: dict[str, Any], claim_rows: Sequence[dict[str, Any]] | None = None
) -> Figure:
    """Held-out accuracy of the dog-bites-man encoder per encoding, from ``posemb verify``."""

    got = _trained_accuracies(claim_rows)
    # Training every encoding on every seed takes minutes: the build reads what posemb
    # verify measured, or says it did not measure it.
    bar = got[1] if got else above_chance(independent_answers(len(dbm.make_data(0).test_y)))
    encodings = list(got[0]) if got else list(dbm.ENCODINGS)

    def draw() -> tuple[object, str]:
        rows = _accuracy_rows(got[0], bar) if got else []
        refs = [(dbm.CHANCE, f"chance {dbm.CHANCE}"), (bar, f"pass bar {bar:.3f}")]
        chart = charts.seed_bars(
            encodings, refs, width=ACCURACY_WIDTH, measured=got is not None, y_title=Y_TITLE
        )
        if not got:
            # A chart with no rows still needs its x domain: the encodings, from posemb.
            rows = [{"encoding": e, "kind": "none"} for e in encodings]
            return charts.spec(chart, rows), (
                f"not measured in this build: the page builder passes posemb verify's rows "
                f"(claim {TRAINED_CLAIM}); chance {dbm.CHANCE}, pass bar {bar:.3f}"
            )
        shown = ", ".join(f"{e} {statistics.fmean(a):.3f}" for e, a in got[0].items())
        n_seeds = len(next(iter(got[0].values())))
        return charts.spec(chart, rows), (
            f"held-out accuracy, mean of {n_seeds} seeds: {shown}; chance {dbm.CHANCE}, "
            f"pass bar {bar:.3f}"
        )

    setup = (
        "The one-layer encoder of posemb verify is trained to say who acts in 'A verb B' (16 "
        "entities, pairs held out), once per encoding and seed: bars are the mean held-out "
        "accuracy, dots the seeds."
    )
    lines = f"a dashed chance line at {dbm.CHANCE} and a dashed pass bar at {bar:.3f}"
    # The caption says what was measured, never what the claim hopes for.
    if got:
        text = f"{setup} {_accuracy_caption(*got)} The numbers are those of posemb verify's run."
        means = ", ".join(f"{e} {statistics.fmean(a):.2f}" for e, a in got[0].items())
        alt_text = f"Bars of held-out accuracy per encoding ({means}) with {lines}."
    else:
        text = (
            f"{setup} Not measured in this build: the page builder passes posemb verify's rows "
            f"(claim {TRAINED_CLAIM})."
        )
        alt_text = f"The encodings along the x axis with {lines}, and no bars: not measured."
    return make_figure(
        "fig-trained-accuracy",
        SCREEN,
        "Trained on 'A verb B': only positions get past chance",
        text,
        f"posemb.lab.dog_bites_man.accuracy_over_seeds() (posemb verify, claim {TRAINED_CLAIM})",
        alt_text,
        kind="vega",
        draw=draw,
    )


@exercise(
    SCREEN,
    "Without positions, does the word 'dog' get a different output in 'man bites dog' than in "
    "'dog bites man'?",
    call="posemb.lesson.measure.word_change(*measure.dog_bites_man_outputs()['none'])",
    figure="fig-blender",
    state="no positions",
)
def _dog_changes() -> str:
    outs = measure.dog_bites_man_outputs()
    none, sinusoidal = (measure.word_change(*outs[e]) for e in ("none", "sinusoidal"))
    return (
        f"No. Its output changes by {none:.1e}, float64 rounding: attention only reordered the "
        f"rows. With sinusoidal positions added it changes by {sinusoidal:.3g}."
    )
