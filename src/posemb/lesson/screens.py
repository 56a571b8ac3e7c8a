"""The lesson's nine screens in posemb's own words: question, goal, intuition, maths, trap.

The order, the questions and the facts follow the user's lesson
(``shared/seed/positional-embedding-lesson.txt``); the prose is posemb's. Numbers are not typed
here: every figure and every measured value on the page comes from posemb in the same build
(:mod:`posemb.lesson.figures`, :mod:`posemb.lesson.claims`). Maths is TeX, rendered by the
vendored KaTeX in the browser (the TeX source is what a reader without JavaScript sees).
"""

from __future__ import annotations

from dataclasses import dataclass

from .claims import SCREENS


@dataclass(frozen=True)
class Screen:
    """One screen of the page.

    Attributes:
        number: 1..9, the lesson's order.
        title: the short title (:data:`posemb.lesson.claims.SCREENS`).
        question: the screen's question.
        goal: what a reader can do after it.
        intuition: paragraphs, plain text.
        maths: display formulas, TeX.
        trap: the common mistake, and why it is one.
    """

    number: int
    title: str
    question: str
    goal: str
    intuition: tuple[str, ...]
    maths: tuple[str, ...]
    trap: str


def _s(number: int, **kw: object) -> Screen:
    return Screen(number=number, title=SCREENS[number], **kw)  # type: ignore[arg-type]


SCREEN_TEXT: tuple[Screen, ...] = (
    _s(
        1,
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
    ),
    _s(
        2,
        question=(
            "How does adding a learned or sinusoidal position vector to each token break the "
            "symmetry?"
        ),
        goal=(
            "Add positions to token embeddings, X_in = X_tok + W_pos, and see what it does to "
            "the attention logits."
        ),
        intuition=(
            "Give every position its own vector and add it to the token at that position. Two "
            "equal tokens at different places now differ, so attention can tell them apart.",
            "Vaswani et al. (2017) made the position vectors from sines and cosines of "
            "geometrically spaced frequencies; GPT-2 learns a table instead. Either way the "
            "query-key product splits into four parts: token-token, token-position, "
            "position-token and position-position.",
            "The sum does not wash the word out because, in hundreds of dimensions, unrelated "
            "vectors are nearly orthogonal: the cosine of two random directions shrinks like "
            "one over the square root of the dimension.",
        ),
        maths=(
            r"PE_{(p,2i)} = \sin\!\big(p / 10000^{2i/d}\big),\quad "
            r"PE_{(p,2i+1)} = \cos\!\big(p / 10000^{2i/d}\big)",
            r"(X+P)W_Q W_K^\top (X+P)^\top = XW_QW_K^\top X^\top + XW_QW_K^\top P^\top"
            r" + PW_QW_K^\top X^\top + PW_QW_K^\top P^\top",
        ),
        trap=(
            "Fearing that addition destroys the word's meaning. In high dimension the two "
            "signals mostly live in different directions; the model can still read both."
        ),
    ),
    _s(
        3,
        question=(
            "Why do absolute embeddings break past the trained length, and what does rotation "
            "change?"
        ),
        goal=(
            "Contrast absolute positions (a vector per index) with RoPE (an angle per index) and "
            "measure what each does past the length it was trained at."
        ),
        intuition=(
            "A learned table has one row per trained position: position 2,049 of a 2,048-row "
            "table simply does not exist, and rows that training never reached never moved from "
            "their initial values.",
            "RoPE instead turns each pair of query and key channels by an angle proportional to "
            "the position. A logit then depends on the difference of two angles, that is on the "
            "distance between the tokens, and RoPE adds no parameters at all.",
            "That does not make a RoPE model work at any length. Past the trained length the "
            "slow pairs reach angles training never showed; the loss curves below, from posemb's "
            "own lab, show RoPE degrading there, and the context-extension scalings (position "
            "interpolation, NTK, YaRN, Llama 3) exist to remap those angles.",
        ),
        maths=(
            r"\tilde x_t = x_t + p_t \quad\text{(absolute)}\qquad "
            r"\tilde q_m = R_m q,\ \tilde k_n = R_n k \quad\text{(rotary)}",
            r"\langle R_m q, R_n k\rangle = q^\top R_{n-m} k",
        ),
        trap=(
            "Believing RoPE has learnable parameters. It is a fixed rotation of q and k; the "
            "parameter count of a model does not change when RoPE is switched on."
        ),
    ),
    _s(
        4,
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
        trap=(
            "Mixing RoPE up with sinusoidal embeddings. Sinusoids are added to the token; RoPE "
            "multiplies q and k by an orthogonal matrix and never changes their length."
        ),
    ),
    _s(
        5,
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
    ),
    _s(
        6,
        question="How do the sinusoids encode positions as harmonics, and where do they stop?",
        goal=(
            "Compute the frequencies and wavelengths of the sinusoidal table (d = 768) and read "
            "what they say about short and long distances."
        ),
        intuition=(
            "The channels form a bank of oscillators from fast to slow. The fastest pair turns "
            "once every 2 pi = 6.28 positions and separates neighbours; the slowest barely moves "
            "within a document and says roughly where in a long text a token is.",
            "Every position gets a vector of the same length, and a fixed shift k acts on the "
            "table as a rotation of each pair, which is why the encoding offers a way to read "
            "relative offsets. Whether a model trained on short texts uses the unseen phase "
            "combinations of long ones is an empirical question, answered below.",
        ),
        maths=(
            r"\omega_i = 10000^{-2i/d},\quad \lambda_i = 2\pi/\omega_i",
            r"\lVert PE(p)\rVert = \sqrt{d/2}\ \text{ for every } p",
        ),
        trap=(
            "Reading 'defined for every position' as 'works at every position'. The formula "
            "never runs out, but the model's weights were fitted to the positions it saw."
        ),
    ),
    _s(
        7,
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
    ),
    _s(
        8,
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
        ),
        maths=(
            r"R_m = \operatorname{diag}\big(R_m^{(0)}, \dots, R_m^{(d/2-1)}\big),\quad "
            r"\lVert R_m x\rVert = \lVert x\rVert",
            r"\text{elementwise: } x\odot\cos(m\theta) + \operatorname{rot}(x)\odot\sin(m\theta)",
        ),
        trap=(
            "Thinking RoPE spins the whole vector in one d-dimensional rotation. It is d/2 "
            "separate planar rotations at different speeds."
        ),
    ),
    _s(
        9,
        question=(
            "Learned or sinusoidal absolute embeddings: what do they cost, and what do they do?"
        ),
        goal=(
            "Count the parameters of each scheme in a real model and compare how each behaves "
            "inside and past its training length."
        ),
        intuition=(
            "A learned table costs one vector per position (GPT-2: 1,024 x 768); the sinusoidal "
            "table costs nothing and exists at every position. Rows of a learned table beyond "
            "the trained length receive no gradient at all.",
            "The figure at the end of this screen is the lesson's parchment: the sinusoidal "
            "harmonics on the left, a learned table trained by posemb's lab on the right, and "
            "the sum that feeds the first layer at the bottom.",
        ),
        maths=(
            r"X_{\text{in}} = X_{\text{tok}} + W_{\text{pos}},\quad "
            r"W_{\text{pos}}\in\mathbb{R}^{T\times d}",
        ),
        trap=(
            "Assuming the sinusoidal encoding extrapolates because it is defined everywhere. "
            "Past the trained length the lab's sinusoidal model keeps almost none of what "
            "context was worth inside it."
        ),
    ),
)

__all__ = ["SCREEN_TEXT", "Screen"]
