"""Retrieval past the training length: facts scattered in filler, then a query for one of them.

In the spirit of passkey retrieval (Mohtashami & Jaggi 2023) and associative recall (Ba et al.
2016; Arora et al. 2023, "Zoology"), made small enough to train on a laptop CPU in seconds:

- a **fact** is one token standing for a (key, value) pair, ``KEYS x VALUES`` of them;
- a **query** is one token per key, and the model's answer at the query is the value's
  **answer** token (``VALUES`` of them, used nowhere else);
- **filler** tokens fill the rest of the window.

A fact is one token so that retrieval needs no binding of neighbouring tokens: a model matches
the query's key to the fact's key by content, which every encoding, NoPE included, learns at the
training length (the lab reports its 1x accuracy). What varies with the encoding is whether
that match survives distances and window lengths never seen in training. Chance is 1 / VALUES:
the best a model that does not see the fact can do. A **control** probe removes the queried
fact from the window; a model scoring above chance there would be reading something other
than the fact (the tests hold it at chance).

Training windows hold ``facts`` facts, each queried once later in the window, and the loss is
taken at the query positions only. Probes put one query at the last position and its fact at a
chosen distance before it, with ``facts - 1`` other facts (other keys) elsewhere.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from .._errors import InputError
from .memory import model_heads, windows_per_pass

FILLER = 16
KEYS = 16
VALUES = 8
FACT0 = FILLER  # fact (k, v) is token FACT0 + k * VALUES + v
QUERY0 = FACT0 + KEYS * VALUES  # query for key k is QUERY0 + k
ANSWER0 = QUERY0 + KEYS  # answer v is ANSWER0 + v
VOCAB = ANSWER0 + VALUES
CHANCE = 1 / VALUES
IGNORE = -100  # cross_entropy's ignore_index: no loss at filler, fact and answer positions


def _check_facts(facts: int, length: int) -> None:
    if not 1 <= facts <= KEYS or 2 * facts > length:
        raise InputError(
            f"--retrieval-facts must be 1..{KEYS} with two positions per fact in a window of "
            f"{length}, got {facts}"
        )


def training_batch(
    batch: int, length: int, facts: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of training windows: ``(inputs (batch, length), targets (batch, length))``.

    Each window holds ``facts`` facts with distinct keys, each followed somewhere later by its
    query; ``targets`` is the answer token at query positions and ``IGNORE`` elsewhere.
    """
    _check_facts(facts, length)
    inputs = torch.randint(0, FILLER, (batch, length), generator=gen)
    targets = torch.full((batch, length), IGNORE, dtype=torch.int64)
    keys = torch.argsort(torch.rand(batch, KEYS, generator=gen), dim=1)[:, :facts]
    values = torch.randint(0, VALUES, (batch, facts), generator=gen)
    slots = torch.argsort(torch.rand(batch, length, generator=gen), dim=1)[:, : 2 * facts]
    first = torch.minimum(slots[:, :facts], slots[:, facts:])
    second = torch.maximum(slots[:, :facts], slots[:, facts:])
    inputs.scatter_(1, first, FACT0 + keys * VALUES + values)
    inputs.scatter_(1, second, QUERY0 + keys)
    targets.scatter_(1, second, ANSWER0 + values)
    return inputs, targets


def probes(
    distances: Sequence[int] | torch.Tensor,
    length: int,
    facts: int,
    gen: torch.Generator,
    present: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Probe windows of ``length`` tokens, one per distance: ``(inputs (n, length), answers (n,))``.

    The query is the last token; its fact sits ``distance`` tokens before it (1 <= distance <
    length), and ``facts - 1`` facts with other keys fill other random positions. With
    ``present=False`` the queried fact is left out (filler in its place): the control.
    """
    _check_facts(facts, length)
    d = torch.as_tensor(distances, dtype=torch.int64)
    if d.ndim != 1 or len(d) == 0 or int(d.min()) < 1 or int(d.max()) >= length:
        raise InputError(f"probe distances must be in 1..{length - 1}, got {d.tolist()}")
    n = len(d)
    inputs = torch.randint(0, FILLER, (n, length), generator=gen)
    keys = torch.argsort(torch.rand(n, KEYS, generator=gen), dim=1)[:, :facts]
    values = torch.randint(0, VALUES, (n, facts), generator=gen)
    query_at = length - 1
    fact_at = query_at - d
    # Distractors anywhere but the query and the queried fact's positions.
    order = torch.argsort(torch.rand(n, length, generator=gen), dim=1)
    rows = torch.arange(n)
    taken = torch.zeros(n, length, dtype=torch.bool)
    taken[rows, query_at] = True
    taken[rows, fact_at] = True
    free = torch.gather(~taken, 1, order)
    # Stable sort puts the free positions first, in their random order.
    pick = torch.gather(order, 1, torch.argsort((~free).to(torch.int8), dim=1, stable=True))
    others = pick[:, : facts - 1]
    inputs.scatter_(1, others, FACT0 + keys[:, 1:] * VALUES + values[:, 1:])
    if present:
        inputs[rows, fact_at] = FACT0 + keys[:, 0] * VALUES + values[:, 0]
    inputs[rows, query_at] = QUERY0 + keys[:, 0]
    return inputs, ANSWER0 + values[:, 0]


def correct(model: nn.Module, inputs: torch.Tensor, answers: torch.Tensor, chunk: int = 32) -> int:
    """How many probes ``(n, length)`` the model answers right (argmax at the last position),
    run at most ``chunk`` at a time (fewer for long windows: :mod:`posemb.lab.memory`)."""
    model.eval()
    hits = 0
    chunk = windows_per_pass(inputs.shape[-1], model_heads(model), chunk, inputs.device)
    with torch.no_grad():
        for part, ans in zip(inputs.split(chunk), answers.split(chunk), strict=True):
            hits += int((model(part)[:, -1].argmax(-1) == ans).sum())
    return hits


def distance_bins(train_len: int, length: int) -> list[tuple[int, int]]:
    """Distance bins ``(lo, hi]`` for probes in a window of ``length``: eighths, quarters and
    halves of ``train_len``, then doublings of it, up to the first edge >= ``length - 1``.
    The edges do not depend on ``length`` (so bins pool across lengths); probes in the last bin
    stop at ``length - 1``."""
    edges = [0, *sorted({train_len // k for k in (8, 4, 2) if train_len // k >= 1})]
    e = train_len
    while edges[-1] < length - 1:
        edges.append(e)
        e *= 2
    return [(lo, hi) for lo, hi in itertools.pairwise(edges) if lo < length - 1]


def bin_label(lo: int, hi: int) -> str:
    """How a bin is written in results: ``"lo-hi"`` for ``lo < d <= hi``."""
    return f"{lo + 1}-{hi}"


def anywhere(
    model: nn.Module, length: int, facts: int, count: int, gen: torch.Generator
) -> dict[str, int]:
    """``{"correct", "total"}`` on ``count`` probes of ``length`` with the fact at a distance
    uniform over 1..length-1 (a needle at a random depth), drawn from ``gen``."""
    d = torch.randint(1, length, (count,), generator=gen)
    x, a = probes(d, length, facts, gen)
    return {"correct": correct(model, x, a), "total": count}


def evaluate(
    model: nn.Module,
    lengths: Sequence[int],
    train_len: int,
    facts: int,
    count: int,
    seed: int,
) -> dict[str, dict[str, object]]:
    """Retrieval counts of ``model`` at each length: ``{str(length): {"anywhere": {"correct",
    "total"}, "by_distance": {bin: {"correct", "total"}}, "control": {"correct", "total"}}}``.

    ``anywhere``: ``count`` probes with the distance uniform over 1..length-1 (a needle at a
    random depth); ``by_distance``: ``count // 2`` probes per :func:`distance_bins` bin, uniform
    within it; ``control``: ``count // 2`` probes without the fact. The probes depend only on
    ``seed`` and the length, so every model sees the same ones.
    """

    def make(d: torch.Tensor, n: int, gen: torch.Generator, present: bool) -> Probes:
        return probes(d, n, facts, gen, present)

    return evaluate_probes(model, lengths, train_len, count, seed, make, least=1)


Probes = tuple[torch.Tensor, torch.Tensor]


def evaluate_probes(
    model: nn.Module,
    lengths: Sequence[int],
    train_len: int,
    count: int,
    seed: int,
    make: Callable[[torch.Tensor, int, torch.Generator, bool], Probes],
    least: int,
    step: int = 1,
) -> dict[str, dict[str, object]]:
    """A probe task's counts at each length (every task's ``evaluate``): ``make(distances
    (n,), length, generator, present)`` gives ``(inputs (n, length), answers (n,))`` with what
    the answer depends on at each distance (``present=False``: left out, the control), and
    ``least`` is the shortest distance the task can place; distances are multiples of ``step``
    (flip-flop places its write an even number of tokens back). The shape of the result and the
    order of the draws are :func:`evaluate`'s; a :func:`distance_bins` bin holding no such
    distance is left out."""
    out: dict[str, dict[str, object]] = {}
    for n in lengths:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + n)
        x, a = make(_anywhere(least, n, count, step, gen), n, gen, True)
        entry: dict[str, object] = {"anywhere": {"correct": correct(model, x, a), "total": count}}
        per_bin = {}
        for lo, hi in distance_bins(train_len, n):
            d = _distances(max(lo + 1, least), min(hi, n - 1), max(1, count // 2), step, gen)
            if d is None:
                continue
            x, a = make(d, n, gen, True)
            per_bin[bin_label(lo, hi)] = {"correct": correct(model, x, a), "total": len(d)}
        entry["by_distance"] = per_bin
        d_ctl = _anywhere(least, n, max(1, count // 2), step, gen)
        x, a = make(d_ctl, n, gen, False)
        entry["control"] = {"correct": correct(model, x, a), "total": len(d_ctl)}
        out[str(n)] = entry
    return out


def _distances(
    first: int, last: int, size: int, step: int, gen: torch.Generator
) -> torch.Tensor | None:
    """``size`` distances uniform over the multiples of ``step`` in ``first..last``; None when
    there is none. With ``step`` 1 it is one ``randint`` over the range, as every task drew
    before flip-flop needed a step."""
    if step == 1:
        return torch.randint(first, last + 1, (size,), generator=gen) if first <= last else None
    lo, hi = -(-first // step), last // step
    if lo > hi:
        return None
    return torch.randint(lo, hi + 1, (size,), generator=gen) * step


def _anywhere(least: int, n: int, size: int, step: int, gen: torch.Generator) -> torch.Tensor:
    """Distances anywhere in a window of ``n``: :func:`_distances` over ``least..n - 1``."""
    d = _distances(least, n - 1, size, step, gen)
    if d is None:
        raise InputError(f"no probe distance of step {step} in {least}..{n - 1}")
    return d


def binomial_std(p: float, n: int) -> float:
    """Standard error of an accuracy ``p`` measured on ``n`` independent probes."""
    return math.sqrt(max(p * (1 - p), 0.0) / n) if n else float("nan")
