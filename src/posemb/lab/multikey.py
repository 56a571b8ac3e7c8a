"""Multi-key needle in a haystack: two-token needles, one key asked for at the end.

After RULER's multi-key NIAH tasks (Hsieh et al. 2024, "RULER: What's the Real Context Size of
Your Long-Context Language Models?", MK-NIAH): several needles "the value of key k is v" stand
in filler, and the query names one key. The needles that are not queried carry **other keys**,
so a model must match the query's key to the right needle among needles that look alike.

Unlike :mod:`posemb.lab.retrieval`, where a fact is one token, a needle here is **two
neighbouring tokens**, a key then its value::

    ... filler  KEY_k VALUE_v  filler ... KEY_j VALUE_w ... filler  QUERY KEY_k  -> answer VALUE_v

The value token alone does not say whose value it is: the model must bind it to the key just
before it, a previous-token step, before it can match the query's key (an induction-head
mechanism, Olsson et al. 2022; Zoology's multi-query associative recall, Arora et al. 2023).
That binding is positional (the neighbour one place back), so the encoding matters at every
distance, not only past the training length. Two layers suffice.

Tokens (``VOCAB`` = 49): ``FILLER`` = 16 filler tokens, ``KEYS`` = 16 key tokens (the same
token in a needle and in the query that asks for it), ``VALUES`` = 16 value tokens (the answer
is the needle's value token itself: the model copies it), one ``QUERY`` marker. Keys in a window
are distinct; values are drawn independently (two needles may share a value), so that a model
which does not see the queried needle cannot do better than ``CHANCE`` = 1 / ``VALUES``, even
one that reads every other needle: the control probes rely on it.

A training window holds ``needles`` needles and queries each once, somewhere after it (loss
at the query positions only): ``4 * needles`` positions. Default ``NEEDLES`` = 8
(``multikey_needles``): half of a 64-token window, because the binding is learned in a sudden
drop of the loss (the induction-head phase change) that comes sooner the more needles a window
holds; a 2-layer RoPE model of width 64 at 64 tokens learned 8 needles in ~500 steps (width
32: ~700), RULER's 4 (MK-NIAH-1 has 4 keys) only after ~1,200 (one seed each). Before the
drop a model answers the value of some needle: ~30% with 4 needles, ~18% with 8.

A probe has the query in its last two positions, the queried needle ``distance`` tokens before
the last one (its key at ``length - 1 - distance``, its value after it; so ``MIN_DISTANCE`` = 3
<= distance <= length - 1) and ``needles - 1`` distractor needles elsewhere, every layout
equally likely. The **control** leaves the queried needle out (filler there, the distractors
where they would be).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from .._errors import InputError
from . import retrieval as _retrieval

FILLER = 16
KEYS = 16
VALUES = 16
KEY0 = FILLER  # key k is token KEY0 + k (in its needle and in the query for it)
VALUE0 = KEY0 + KEYS  # value v is token VALUE0 + v (in its needle and as the answer)
QUERY = VALUE0 + VALUES  # the query marker, followed by the key asked for
VOCAB = QUERY + 1
CHANCE = 1 / VALUES
IGNORE = _retrieval.IGNORE
NEEDLES = 8  # the default number of needles (LabConfig.multikey_needles)
MIN_DISTANCE = 3  # a needle's two tokens end before the query's two


def check_sizes(needles: int, length: int) -> None:
    """Refuse (``InputError``) a number of needles that the windows of ``length`` cannot hold.

    A training window holds each needle and its query (two tokens each): ``4 * needles``
    positions. Probes then always fit (they need ``2 * needles + 2``, with room to spare
    however the queried needle splits the window).
    """
    if isinstance(needles, bool) or not isinstance(needles, int) or not 1 <= needles <= KEYS:
        raise InputError(
            f"--multikey-needles must be an integer in 1..{KEYS} (one key each), got {needles!r}"
        )
    if 4 * needles > length:
        raise InputError(
            f"--multikey-needles {needles} needs {4 * needles} positions (each needle "
            f"and its query, two tokens each) in a window of {length}, which holds at most "
            f"{length // 4}"
        )


def pair_starts(rows: int, length: int, count: int, gen: torch.Generator) -> torch.Tensor:
    """Starts ``(rows, count)``, ascending, of ``count`` non-overlapping two-token blocks in a
    window of ``length`` (``2 * count <= length``), uniform over all such layouts.

    Stars and bars: a layout is a choice of ``count`` of the ``length - count`` items (a block
    is one item of width two, a filler position one of width one).
    """
    items = length - count
    pick = torch.argsort(torch.rand(rows, items, generator=gen), dim=1)[:, :count]
    return pick.sort(dim=1).values + torch.arange(count)


def _log_layouts(span: int, blocks: int) -> float:
    """log of the number of ways to lay ``blocks`` two-token blocks in ``span`` positions."""
    if blocks < 0 or 2 * blocks > span:
        return -math.inf
    return (
        math.lgamma(span - blocks + 1)
        - math.lgamma(blocks + 1)
        - math.lgamma(span - 2 * blocks + 1)
    )


def place_around(anchor: int, length: int, others: int, gen: torch.Generator) -> list[int]:
    """Starts of ``others`` two-token blocks in a probe window whose last two positions hold
    the query and whose queried needle starts at ``anchor``: anywhere free, in random order,
    every layout equally likely. Raises ``InputError`` when they cannot fit (which
    :func:`check_sizes` rules out)."""
    left = anchor  # positions [0, anchor)
    right = length - 4 - anchor  # positions [anchor + 2, length - 2)
    # How many lie left of the needle: drawn in proportion to the layouts each count allows.
    weights = [_log_layouts(left, k) + _log_layouts(right, others - k) for k in range(others + 1)]
    top = max(weights)
    if top == -math.inf:
        raise InputError(
            f"{others} two-token needles do not fit around one at {anchor} in a window of {length}"
        )
    probs = torch.tensor([math.exp(w - top) for w in weights], dtype=torch.float64)
    k = int(torch.multinomial(probs, 1, generator=gen))
    starts = pair_starts(1, left, k, gen)[0].tolist() if k else []
    if others > k:
        starts += (pair_starts(1, right, others - k, gen)[0] + anchor + 2).tolist()
    order = torch.randperm(len(starts), generator=gen).tolist() if starts else []
    return [starts[i] for i in order]


def training_batch(
    batch: int, length: int, needles: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of training windows: ``(inputs (batch, length), targets (batch, length))``.

    Each window holds ``needles`` needles ``KEY_k VALUE_v`` with distinct keys, each queried
    once somewhere after it by ``QUERY KEY_k``; ``targets`` is ``VALUE_v`` at the query's key
    position and ``IGNORE`` elsewhere. Draws only from ``gen``.
    """
    check_sizes(needles, length)
    inputs = torch.randint(0, FILLER, (batch, length), generator=gen)
    targets = torch.full((batch, length), IGNORE, dtype=torch.int64)
    keys = torch.argsort(torch.rand(batch, KEYS, generator=gen), dim=1)[:, :needles]
    values = torch.randint(0, VALUES, (batch, needles), generator=gen)
    starts = pair_starts(batch, length, 2 * needles, gen)
    # Blocks to needles at random; the earlier block of each pair is the needle.
    roles = torch.argsort(torch.rand(batch, 2 * needles, generator=gen), dim=1)
    roles = roles.view(batch, needles, 2).sort(dim=2).values.view(batch, -1)
    at = torch.gather(starts, 1, roles).view(batch, needles, 2)
    needle_at, query_at = at[..., 0], at[..., 1]
    inputs.scatter_(1, needle_at, KEY0 + keys)
    inputs.scatter_(1, needle_at + 1, VALUE0 + values)
    inputs.scatter_(1, query_at, torch.full_like(query_at, QUERY))
    inputs.scatter_(1, query_at + 1, KEY0 + keys)
    targets.scatter_(1, query_at + 1, VALUE0 + values)
    return inputs, targets


def probes(
    distances: Sequence[int] | torch.Tensor,
    length: int,
    needles: int,
    gen: torch.Generator,
    present: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Probe windows of ``length`` tokens, one per distance: ``(inputs (n, length), answers (n,))``.

    The last two tokens are the query ``QUERY KEY_k``; the queried needle's key sits
    ``distance`` tokens before the last one (``MIN_DISTANCE <= distance < length``), its value
    right after it; ``needles - 1`` needles with other keys fill other random free positions.
    ``answers`` is the queried needle's value token. With ``present=False`` the queried needle
    is left out (filler in its place, distractors where they would be): the control.
    """
    check_sizes(needles, length)
    d = torch.as_tensor(distances, dtype=torch.int64)
    if d.ndim != 1 or len(d) == 0 or int(d.min()) < MIN_DISTANCE or int(d.max()) >= length:
        raise InputError(
            f"probe distances must be in {MIN_DISTANCE}..{length - 1} (a needle's two tokens "
            f"before the query's two), got {d.tolist()}"
        )
    n = len(d)
    inputs = torch.randint(0, FILLER, (n, length), generator=gen)
    keys = torch.argsort(torch.rand(n, KEYS, generator=gen), dim=1)[:, :needles]
    values = torch.randint(0, VALUES, (n, needles), generator=gen)
    needle_at = length - 1 - d
    for row, anchor in enumerate(needle_at.tolist()):
        others = place_around(anchor, length, needles - 1, gen)
        if others:
            at = torch.tensor(others)
            inputs[row, at] = KEY0 + keys[row, 1:]
            inputs[row, at + 1] = VALUE0 + values[row, 1:]
    rows = torch.arange(n)
    if present:
        inputs[rows, needle_at] = KEY0 + keys[:, 0]
        inputs[rows, needle_at + 1] = VALUE0 + values[:, 0]
    inputs[:, -2] = QUERY
    inputs[:, -1] = KEY0 + keys[:, 0]
    return inputs, VALUE0 + values[:, 0]


def anywhere(
    model: nn.Module, length: int, needles: int, count: int, gen: torch.Generator
) -> dict[str, int]:
    """``{"correct", "total"}`` on ``count`` probes of ``length`` with the needle at a distance
    uniform over ``MIN_DISTANCE..length - 1`` (a needle at a random depth), drawn from ``gen``."""
    d = torch.randint(MIN_DISTANCE, length, (count,), generator=gen)
    x, a = probes(d, length, needles, gen)
    return {"correct": _retrieval.correct(model, x, a), "total": count}


def evaluate(
    model: nn.Module,
    lengths: Sequence[int],
    train_len: int,
    needles: int,
    count: int,
    seed: int,
) -> dict[str, dict[str, object]]:
    """Multi-key counts of ``model`` at each length, shaped as :func:`retrieval.evaluate`'s:
    ``{str(length): {"anywhere": {"correct", "total"}, "by_distance": {bin: {"correct",
    "total"}}, "control": {"correct", "total"}}}``.

    ``anywhere``: ``count`` probes at a distance uniform over ``MIN_DISTANCE..length - 1``;
    ``by_distance``: ``count // 2`` probes per :func:`retrieval.distance_bins` bin, uniform
    within it from ``MIN_DISTANCE`` on (a bin wholly below it is left out); ``control``:
    ``count // 2`` probes without the queried needle. The probes depend only on ``seed`` and
    the length, so every model sees the same ones. ``model`` maps ``(b, length)`` tokens to
    ``(b, length, VOCAB)`` logits; its answer is the argmax at the last position.
    """
    for n in lengths:
        check_sizes(needles, n)

    def make(d: torch.Tensor, n: int, gen: torch.Generator, present: bool) -> _retrieval.Probes:
        return probes(d, n, needles, gen, present)

    return _retrieval.evaluate_probes(
        model, lengths, train_len, count, seed, make, least=MIN_DISTANCE
    )
