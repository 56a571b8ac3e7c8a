"""Who bites whom? A bidirectional encoder must read word order to answer.

Sentences are ``[CLS] A verb B`` over 16 entities and 4 verbs; the label is A, the one who acts.
"dog bites man" and "man bites dog" hold the same tokens, so an encoder without positions
(NoPE, bidirectional, hence permutation-equivariant) gives both the same output and can be
right on at most one: held-out accuracy is exactly 50% when it always names one of the two. Any
positional signal breaks the tie.

The split is by unordered pair: both orders of a pair land on the same side, so the test asks
about pairs never seen in training, in both orders (84 pairs train, 36 test). One layer
(:class:`posemb.lab.model.Block`, bidirectional), width 32, 4 heads, 200 full-batch Adam steps
at 1e-2 through the lab's one loop (:func:`posemb.lab.train.train`); seeded and deterministic,
on one thread, about 3.5-5 s per encoding on this project's 2-core machine.

Over seeds 0-2 every encoding with positions answers unseen pairs (ALiBi 0.988 ± 0.011, the
rest 1.000) and NoPE sits at exactly 0.500. With 8 entities (28 pairs: 20 train, 8 test) ALiBi
still fits every training sentence but answers unseen pairs worse (0.875 ± 0.063 held out): it
memorised pairs rather than learning the rule; T5 still generalised there (1.000 on each seed).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import multiprocessing as mp
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from .._errors import InputError
from ..absolute import LearnedEmbedding, SinusoidalEmbedding
from .model import Block
from .stopping import workers_can_start
from .train import adamw, train

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
CHANCE = 0.5
"""Held-out accuracy of always naming one of the two entities of a sentence."""
ENCODINGS = ("nope", "sinusoidal", "learned", "rope", "xpos", "alibi", "t5", "fire")
LEARNED_ROWS = 8  # a sentence has 4 tokens; 8 rows as first published, so seeds reproduce
STEPS = 200
LR = 1e-2
SEEDS = (0, 1, 2)
SMALL_ENTITIES = 8  # 28 pairs: 20 train, 8 held out
MEMORISERS = ("alibi", "t5")  # the encodings that carry position only as an attention bias


@dataclass(frozen=True)
class Data:
    """Token ids ``(n, 4)`` and labels ``(n,)`` (index into ENTITIES) for train and test."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor


def make_data(seed: int = 0, entities: int = len(ENTITIES), test_fraction: float = 0.3) -> Data:
    """All ``[CLS] A verb B`` sentences over the first ``entities`` entities, split by unordered
    pair {A, B} (both orders and every verb of a pair on the same side)."""
    if isinstance(entities, bool) or not isinstance(entities, int):
        raise InputError(f"entities must be an integer, got {entities!r}")
    if not 3 <= entities <= len(ENTITIES):
        raise InputError(
            f"entities must be in [3, {len(ENTITIES)}] (a split needs pairs on both sides), "
            f"got {entities}"
        )
    pairs = list(itertools.combinations(range(entities), 2))
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
    """Embeddings (plus an input-level encoding), bidirectional :class:`~posemb.lab.model.Block`
    layers, CLS readout: ``forward(tokens (b, s)) -> logits (b, len(ENTITIES))``."""

    def __init__(self, encoding: str, width: int = 32, heads: int = 4, layers: int = 1) -> None:
        super().__init__()
        if encoding not in ENCODINGS:
            raise InputError(f"encoding must be one of {', '.join(ENCODINGS)}, got {encoding!r}")
        self.embed = nn.Embedding(len(VOCAB), width)
        self.input_pos: nn.Module | None = None
        attn_encoding = encoding
        if encoding == "sinusoidal":
            self.input_pos, attn_encoding = SinusoidalEmbedding(width), "nope"
        elif encoding == "learned":
            self.input_pos, attn_encoding = LearnedEmbedding(LEARNED_ROWS, width), "nope"
        self.blocks = nn.ModuleList(
            Block(width, heads, attn_encoding, causal=False) for _ in range(layers)
        )
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, len(ENTITIES))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits over entities ``(batch, len(ENTITIES))`` for tokens ``(batch, seq)``."""
        x = self.embed(tokens)
        if self.input_pos is not None:
            x = self.input_pos(x)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x[:, 0]))

    def attention_weights(self, tokens: torch.Tensor) -> torch.Tensor:
        """Attention probabilities of every layer for tokens ``(batch, seq)``:
        ``(layers, batch, heads, seq, seq)``, as :meth:`forward` uses them."""
        x = self.embed(tokens)
        if self.input_pos is not None:
            x = self.input_pos(x)
        weights = []
        for blk in self.blocks:
            assert isinstance(blk, Block)
            weights.append(blk.attention_weights(x))
            x = blk(x)
        return torch.stack(weights)


def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        pred = model(x).argmax(-1)
    return float((pred == y).float().mean())


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """Run on one thread: on matrices this small a second one costs more in synchronisation
    than it saves (4-10x slower on a loaded 2-core machine), and the sums no longer depend on
    the machine's core count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def train_and_score(
    encoding: str, seed: int = 0, entities: int = len(ENTITIES), steps: int = STEPS, lr: float = LR
) -> tuple[float, float]:
    """Train one encoder on :func:`make_data` ``(seed, entities)``; return its (train, held-out)
    accuracy."""
    data = make_data(seed, entities)
    model = trained_encoder(encoding, seed, entities, steps, lr)
    with _one_thread():
        return (
            _accuracy(model, data.train_x, data.train_y),
            _accuracy(model, data.test_x, data.test_y),
        )


def trained_encoder(
    encoding: str, seed: int = 0, entities: int = len(ENTITIES), steps: int = STEPS, lr: float = LR
) -> Encoder:
    """The encoder :func:`train_and_score` trains on :func:`make_data` ``(seed, entities)``, in
    eval mode: seeded and single-threaded, so the same weights every time."""
    data = make_data(seed, entities)
    with _one_thread(), torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Encoder(encoding)
        # Full batch, constant rate, no clipping, no weight decay (Adam).
        train(
            model,
            adamw(model, lr, weight_decay=0.0),
            lambda _: (data.train_x, data.train_y),
            steps,
            lambda _: lr,
            clip=None,
        )
    return model.eval()


def train_and_test(encoding: str, seed: int = 0, steps: int = STEPS, lr: float = LR) -> float:
    """Train one encoder on the 16-entity task; return its held-out accuracy."""
    return train_and_score(encoding, seed, steps=steps, lr=lr)[1]


def run(encodings: tuple[str, ...] = ENCODINGS, seed: int = 0) -> dict[str, float]:
    """Held-out accuracy per encoding (memoised: the run is deterministic)."""
    scores = _scores([(e, seed, len(ENTITIES)) for e in encodings])
    return {e: held for e, (_, held) in zip(encodings, scores, strict=True)}


def accuracy_over_seeds(
    encodings: tuple[str, ...] = ENCODINGS, seeds: tuple[int, ...] = SEEDS
) -> dict[str, list[float]]:
    """Held-out accuracy on the 16-entity task per encoding, one entry per seed (in ``seeds``
    order); memoised, as every run is deterministic."""
    jobs = [(e, s, len(ENTITIES)) for e in encodings for s in seeds]
    held = iter(h for _, h in _scores(jobs))
    return {e: [next(held) for _ in seeds] for e in encodings}


def memorisation(
    seeds: tuple[int, ...] = SEEDS,
    entities: int = SMALL_ENTITIES,
    encodings: tuple[str, ...] = MEMORISERS,
) -> dict[str, dict[str, list[float]]]:
    """On a small task the bias-only encodings memorise pairs instead of learning the rule.

    Returns ``{encoding: {"train": [...], "held_out": [...]}}``: train and held-out accuracy
    on :func:`make_data` ``(seed, entities)``, one entry per seed (in ``seeds`` order). With
    8 entities (20 training pairs) ALiBi fits every training sentence but answers unseen pairs
    worse than on the 16-entity task (:func:`accuracy_over_seeds`). Memoised.
    """
    scores = iter(_scores([(e, s, entities) for e in encodings for s in seeds]))
    out: dict[str, dict[str, list[float]]] = {}
    for e in encodings:
        pairs = [next(scores) for _ in seeds]
        out[e] = {"train": [t for t, _ in pairs], "held_out": [h for _, h in pairs]}
    return out


_SCORES: dict[tuple[str, int, int], tuple[float, float]] = {}


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _scores(jobs: list[tuple[str, int, int]]) -> list[tuple[float, float]]:
    """(train, held-out) accuracy for each (encoding, seed, entities), memoised.

    Jobs not yet run are spread over one single-threaded worker process per core: each run is
    seeded and single-threaded, so a worker gives the same numbers as this process would, and
    the runs of ``posemb verify`` take half the time on two cores.
    """
    missing = [j for j in dict.fromkeys(jobs) if j not in _SCORES]
    workers = min(len(missing), _cores())
    if workers > 1 and workers_can_start():
        # Not multiprocessing.Pool: it replaces a worker that dies at start forever (a script
        # without a __main__ guard: each worker runs it again and fails); this pool raises.
        ctx = mp.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            done = list(pool.map(train_and_score, *zip(*missing, strict=True)))
    else:
        done = [train_and_score(*j) for j in missing]
    _SCORES.update(zip(missing, done, strict=True))
    return [_SCORES[j] for j in jobs]
