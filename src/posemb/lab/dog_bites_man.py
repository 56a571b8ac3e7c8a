"""Who bites whom? A bidirectional encoder must read word order to answer.

Sentences are ``[CLS] A verb B`` over 16 entities and 4 verbs; the label is A, the one who acts.
"dog bites man" and "man bites dog" hold the same tokens, so an encoder without positions
(NoPE, bidirectional, hence permutation-equivariant) gives both the same output and can be
right on at most one: held-out accuracy is exactly 50% when it always names one of the two. Any
positional signal breaks the tie.

The split is by unordered pair: both orders of a pair land on the same side, so the test asks
about pairs never seen in training, in both orders (84 pairs train, 36 test). One layer, width
32, 4 heads, 200 full-batch Adam steps at 1e-2; each encoding trains in about 1.5 s on a 2-core
CPU, seeded and deterministic. With 8 entities (19 training pairs) the bias encodings memorised
pairs instead of learning the rule (ALiBi 0.69, T5 0.88 held out): the data size matters more
than the step count here.
"""

from __future__ import annotations

import functools
import itertools
import random
from dataclasses import dataclass

import torch
from torch import nn

from ..absolute import LearnedEmbedding, SinusoidalEmbedding
from ..attention import PositionalAttention

ENTITIES = (
    "dog",
    "man",
    "cat",
    "child",
    "bird",
    "fox",
    "horse",
    "snake",
    "woman",
    "wolf",
    "bee",
    "crow",
    "goat",
    "rat",
    "owl",
    "bear",
)
VERBS = ("bites", "chases", "sees", "follows")
VOCAB = ("[CLS]", *ENTITIES, *VERBS)
ENCODINGS = ("nope", "sinusoidal", "learned", "rope", "xpos", "alibi", "t5", "fire")


@dataclass(frozen=True)
class Data:
    """Token ids ``(n, 4)`` and labels ``(n,)`` (index into ENTITIES) for train and test."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor


def make_data(seed: int = 0, test_fraction: float = 0.3) -> Data:
    """All ``[CLS] A verb B`` sentences, split by unordered pair {A, B}."""
    pairs = list(itertools.combinations(range(len(ENTITIES)), 2))
    random.Random(seed).shuffle(pairs)
    n_test = max(1, round(len(pairs) * test_fraction))
    split = {"test": pairs[:n_test], "train": pairs[n_test:]}
    out = {}
    for name, chosen in split.items():
        xs, ys = [], []
        for a, b in chosen:
            for first, second in ((a, b), (b, a)):
                for v in range(len(VERBS)):
                    xs.append([0, 1 + first, 1 + len(ENTITIES) + v, 1 + second])
                    ys.append(first)
        out[name] = (torch.tensor(xs), torch.tensor(ys))
    return Data(*out["train"], *out["test"])


class Encoder(nn.Module):
    """Embeddings (plus an input-level encoding), pre-norm attention + MLP blocks, CLS readout."""

    def __init__(self, encoding: str, width: int = 32, heads: int = 4, layers: int = 1) -> None:
        super().__init__()
        self.embed = nn.Embedding(len(VOCAB), width)
        self.input_pos: nn.Module | None = None
        attn_encoding = encoding
        if encoding == "sinusoidal":
            self.input_pos, attn_encoding = SinusoidalEmbedding(width), "nope"
        elif encoding == "learned":
            self.input_pos, attn_encoding = LearnedEmbedding(8, width), "nope"
        self.heads, self.head_dim = heads, width // heads
        self.blocks = nn.ModuleList()
        for _ in range(layers):
            self.blocks.append(
                nn.ModuleDict(
                    {
                        "norm1": nn.LayerNorm(width),
                        "qkv": nn.Linear(width, 3 * width),
                        "attn": PositionalAttention(
                            attn_encoding, num_heads=heads, head_dim=self.head_dim
                        ),
                        "out": nn.Linear(width, width),
                        "norm2": nn.LayerNorm(width),
                        "mlp": nn.Sequential(
                            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
                        ),
                    }
                )
            )
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, len(ENTITIES))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits over entities ``(batch, len(ENTITIES))`` for tokens ``(batch, seq)``."""
        x = self.embed(tokens)
        if self.input_pos is not None:
            x = self.input_pos(x)
        b, s, w = x.shape
        for blk in self.blocks:
            qkv = blk["qkv"](blk["norm1"](x)).view(b, s, 3, self.heads, self.head_dim)
            q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # (b, h, s, d) each
            a = blk["attn"](q, k, v).transpose(1, 2).reshape(b, s, w)
            x = x + blk["out"](a)
            x = x + blk["mlp"](blk["norm2"](x))
        return self.head(self.norm(x[:, 0]))


def train_and_test(encoding: str, seed: int = 0, steps: int = 200, lr: float = 1e-2) -> float:
    """Train one encoder; return its held-out accuracy."""
    data = make_data(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Encoder(encoding)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        for _ in range(steps):
            loss = nn.functional.cross_entropy(model(data.train_x), data.train_y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        pred = model(data.test_x).argmax(-1)
    return float((pred == data.test_y).float().mean())


def run(encodings: tuple[str, ...] = ENCODINGS, seed: int = 0) -> dict[str, float]:
    """Held-out accuracy per encoding (memoised: the run is deterministic)."""
    return dict(_run(tuple(encodings), seed))


@functools.lru_cache(maxsize=8)
def _run(encodings: tuple[str, ...], seed: int) -> tuple[tuple[str, float], ...]:
    return tuple((e, train_and_test(e, seed)) for e in encodings)


CHANCE = 0.5
