"""Variable tracking: follow a chain of assignments through filler back to its value.

After RULER's variable-tracking task (Hsieh et al. 2024, "RULER: What's the Real Context Size
of Your Long-Context Language Models?", VT): a chain ``X1 = v``, ``X2 = X1``, ... scattered in
filler among **distractor chains** over other variables, then a query for the chain's last
variable, answered by the chain's value ``v``. As in RULER, ``hops`` counts the
variable-to-variable assignments (RULER's ``num_hops``): a chain has ``hops + 1`` assignments
over ``hops + 1`` distinct variables. Unlike RULER, which asks for every variable holding a
value, the query asks for one variable's value, so that the answer is one token.

Tokens (``VOCAB`` = 169)::

    X1 = v     ROOT(X1, v)          one token, as retrieval's facts (NAMES * VALUES of them)
    X2 = X1    NAME(X2) NAME(X1)    two tokens: the variable assigned, then its source
    X2 ?       QUERY NAME(X2)       the answer, ANSWER(v), is read at the name

    ... ROOT(Y1, w) ... ROOT(X1, v) ... Y2 Y1 ... X2 X1 ... QUERY X2  -> ANSWER(v)  (1 hop)

``FILLER`` = 16 filler tokens, ``NAMES`` = 16 variable tokens, ``NAMES * VALUES`` = 128 root
tokens, one ``QUERY`` marker, ``VALUES`` = 8 answer tokens (used nowhere else).

Why this shape: each lookup costs a layer. A hop is a two-token binding, as a
:mod:`posemb.lab.multikey` needle (the source belongs to the variable just before it: a
previous-token step, which is where the encoding comes in), while the root is one token that a
source name finds by content alone, in the same layer as that step. A chain of ``hops`` hops
then needs ``hops + 1`` layers, so the lab's 2-layer model can learn the default chain. A
two-token root ``X1 v`` would need one more layer (to find the value beside the name); in a
pilot neither 2 nor 3 layers learned that form in 1,500-3,000 steps.

Training windows hold ``chains`` chains, each written in order, then queried for **every one
of its variables** (in random order, after the chain; loss at the query positions only):
``chains * (4 * hops + 3)`` positions. The queries for ``X1`` take one lookup (a retrieval
fact) and teach the content step that the hops then reuse; asked only for the chains' ends, a
width-64 model learned nothing beyond the shortcut below in 1,500 steps. Defaults: ``HOPS`` =
1 (``vartrack_hops``: ``X1 = v``, ``X2 = X1``; RULER's VT has 4) and ``CHAINS`` = 8
(``vartrack_chains``: 56 of 64 positions, every variable in use), because, as with multikey's
needles, denser windows learn sooner.

Measured (2 layers, RoPE, 64 tokens, batch 32, AdamW 3e-3, warm-up + cosine): the hop is
learned in a sudden drop of the loss, late and seed-dependent: at ~1,250 steps of a 2,500-step
run (width 64, 8 chains, seed 0), ~2,500 of 4,000 with 4 chains, and not within 1,500-step
runs (seed 1 at width 64, seed 0 at width 32). Before it, a model reads the roots' values and
guesses among them: ~35-45% on the probes, well above ``CHANCE`` and never near 100%.

A probe has the query ``QUERY X_last`` in its last two positions, the queried chain's root
``distance`` tokens before the last one (``min_distance(hops) = 2 * hops + 2 <= distance <=
length - 1``), the chain's hops at random places in order between the root and the query,
and the ``chains - 1`` distractor chains (other variables, values drawn independently)
anywhere else, each in order. The **control** removes the root (filler there; all else
stays), so the value is nowhere in the window but by coincidence in another chain, and a
model that does not read the queried chain's root scores ``CHANCE`` = 1 / ``VALUES``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from .._errors import InputError
from . import retrieval as _retrieval

FILLER = 16
NAMES = 16
VALUES = 8
NAME0 = FILLER  # variable x is token NAME0 + x (assigned, as a source, in the query)
ROOT0 = NAME0 + NAMES  # the root "x = v" is token ROOT0 + x * VALUES + v
QUERY = ROOT0 + NAMES * VALUES  # the query marker, followed by the variable asked for
ANSWER0 = QUERY + 1  # the answer v is token ANSWER0 + v
VOCAB = ANSWER0 + VALUES
CHANCE = 1 / VALUES
IGNORE = _retrieval.IGNORE
HOPS = 1  # the default chain: X1 = v, X2 = X1 (LabConfig.vartrack_hops)
CHAINS = 8  # the default number of chains, one queried (LabConfig.vartrack_chains)


def min_distance(hops: int) -> int:
    """The shortest probe distance: the root, then ``hops`` two-token assignments, all before
    the query's two tokens."""
    return 2 * hops + 2


def check_sizes(hops: int, chains: int, length: int) -> None:
    """Refuse (``InputError``) a chain length or number of chains that windows of ``length``
    cannot hold: ``hops >= 1``, ``chains >= 1``, ``chains * (hops + 1) <= NAMES`` distinct
    variables and ``chains * (4 * hops + 3) <= length`` positions for a training window (each
    chain's root, hops and the queries of its variables). Probes then always fit."""
    for flag, v in (("--vartrack-hops", hops), ("--vartrack-chains", chains)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"{flag} must be an integer >= 1, got {v!r}")
    if chains * (hops + 1) > NAMES:
        raise InputError(
            f"--vartrack-chains {chains} with --vartrack-hops {hops} need "
            f"{chains * (hops + 1)} distinct variables ({hops + 1} a chain); there are {NAMES}: "
            f"allowed chains * (hops + 1) <= {NAMES}"
        )
    need = chains * (4 * hops + 3)
    if need > length:
        raise InputError(
            f"--vartrack-chains {chains} with --vartrack-hops {hops} need {need} "
            f"positions (each chain's root, {hops} two-token hops and {hops + 1} two-token "
            f"queries) in a window of {length}: allowed chains * (4 * hops + 3) <= {length}"
        )


def _chains(
    rows: int, chains: int, hops: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct variables ``(rows, chains, hops + 1)`` (chain c's assignment i sets
    ``names[:, c, i]``) and independent values ``(rows, chains)``."""
    pick = torch.argsort(torch.rand(rows, NAMES, generator=gen), dim=1)[:, : chains * (hops + 1)]
    values = torch.randint(0, VALUES, (rows, chains), generator=gen)
    return pick.view(rows, chains, hops + 1), values


def _write(
    inputs: torch.Tensor, at: torch.Tensor, names: torch.Tensor, values: torch.Tensor
) -> None:
    """Write chains into ``inputs (rows, length)`` in place: chain c's root at ``at[:, c, 0]``
    and its hop i (two tokens: the variable, its source) from ``at[:, c, i]`` (``at``,
    ``names``: ``(rows, chains, hops + 1)``; ``values``: ``(rows, chains)``)."""
    rows = inputs.shape[0]
    inputs.scatter_(1, at[..., 0], ROOT0 + names[..., 0] * VALUES + values)
    hop_at = at[..., 1:].reshape(rows, -1)
    inputs.scatter_(1, hop_at, (NAME0 + names[..., 1:]).reshape(rows, -1))
    inputs.scatter_(1, hop_at + 1, (NAME0 + names[..., :-1]).reshape(rows, -1))


def training_batch(
    batch: int, length: int, hops: int, chains: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of training windows: ``(inputs (batch, length), targets (batch, length))``.

    Each window holds ``chains`` chains of ``hops + 1`` assignments over distinct variables,
    each written in order at random places, then queried for each of its variables in random
    order (``QUERY X``, somewhere after the chain's last assignment); ``targets`` is the
    chain's answer token at each query's variable and ``IGNORE`` elsewhere. Every layout of
    the items (a root is one token wide, hops and queries two) is equally likely. Draws only
    from ``gen``.
    """
    check_sizes(hops, chains, length)
    per = 2 * hops + 2  # items of a chain: root, hops, then its hops + 1 queries
    count = chains * per
    inputs = torch.randint(0, FILLER, (batch, length), generator=gen)
    targets = torch.full((batch, length), IGNORE, dtype=torch.int64)
    names, values = _chains(batch, chains, hops, gen)
    # Stars and bars over items of widths 1 and 2: choose the items' ranks among the
    # ``length - chains * (2 * hops + 1)`` items (filler included), then add the extra width
    # of the wide items before each.
    items = length - chains * (2 * hops + 1)
    ranks = torch.argsort(torch.rand(batch, items, generator=gen), dim=1)[:, :count]
    ranks = ranks.sort(dim=1).values
    # Items to chains at random; within a chain, in order of position.
    roles = torch.argsort(torch.rand(batch, count, generator=gen), dim=1)
    roles = roles.view(batch, chains, per).sort(dim=2).values.view(batch, -1)
    wide = torch.ones(batch, chains, per, dtype=torch.int64)
    wide[..., 0] = 0
    extra = torch.empty(batch, count, dtype=torch.int64).scatter_(1, roles, wide.view(batch, -1))
    starts = ranks + torch.cumsum(extra, dim=1) - extra
    at = torch.gather(starts, 1, roles).view(batch, chains, per)
    _write(inputs, at[..., : hops + 1], names, values)
    query_at = at[..., hops + 1 :].reshape(batch, -1)
    asked = torch.argsort(torch.rand(batch, chains, hops + 1, generator=gen), dim=2)
    asked = torch.gather(names, 2, asked).view(batch, -1)
    inputs.scatter_(1, query_at, torch.full_like(query_at, QUERY))
    inputs.scatter_(1, query_at + 1, NAME0 + asked)
    answers = (ANSWER0 + values).repeat_interleave(hops + 1, dim=1)
    targets.scatter_(1, query_at + 1, answers)
    return inputs, targets


def _log_layouts(span: int, widths: Sequence[int], runs: Sequence[int]) -> float:
    """log of the number of layouts of chains in order, in ``span`` positions: items of
    ``widths`` whose chains (of ``runs`` items each) interleave in any way."""
    w, m = sum(widths), len(widths)
    if w > span:
        return -math.inf
    # Stars and bars (m items among span - w + m) times the interleavings (a multinomial).
    places = math.lgamma(span - w + m + 1) - math.lgamma(m + 1) - math.lgamma(span - w + 1)
    return places + math.lgamma(m + 1) - sum(math.lgamma(r + 1) for r in runs)


def _spread(
    start: int, span: int, runs: Sequence[Sequence[int]], gen: torch.Generator
) -> list[list[int]]:
    """Starts of the items of chains ``runs`` (each a list of item widths, in order) laid in
    positions ``[start, start + span)``, the chains interleaved at random, every layout equally
    likely: a list per chain. The widths must fit."""
    labels = torch.tensor([c for c, run in enumerate(runs) for _ in run], dtype=torch.int64)
    if len(labels) == 0:
        return [[] for _ in runs]
    order = labels[torch.randperm(len(labels), generator=gen)].tolist()
    nth = [0] * len(runs)
    widths = []
    for c in order:
        widths.append(runs[c][nth[c]])
        nth[c] += 1
    items = span - sum(widths) + len(widths)
    ranks = torch.randperm(items, generator=gen)[: len(widths)].sort().values.tolist()
    out: list[list[int]] = [[] for _ in runs]
    extra = 0
    for c, rank, w in zip(order, ranks, widths, strict=True):
        out[c].append(start + rank + extra)
        extra += w - 1
    return out


def _around(
    root_at: int, length: int, hops: int, others: int, gen: torch.Generator
) -> tuple[list[int], list[list[int]]]:
    """Where a probe's chains go around the queried root at ``root_at`` (the query in the last
    two positions): ``(hop_starts (hops,), [item_starts (hops + 1,) per distractor chain])``.

    The queried chain's hops lie between its root and the query; each of the ``others``
    distractor chains (root, then hops) lies wholly before or wholly after the root, how many
    before drawn in proportion to the layouts that allows, the layouts then uniform."""
    chain = [1] + [2] * hops
    left, right = root_at, length - 3 - root_at  # [0, root_at) and [root_at + 1, length - 2)
    weights = []
    for k in range(others + 1):
        runs_right = [hops] + [hops + 1] * (others - k)
        weights.append(
            math.lgamma(others + 1)
            - math.lgamma(k + 1)
            - math.lgamma(others - k + 1)
            + _log_layouts(left, chain * k, [hops + 1] * k)
            + _log_layouts(right, [2] * hops + chain * (others - k), runs_right)
        )
    top = max(weights)
    if top == -math.inf:
        raise InputError(f"{others} chains of {hops} hops do not fit around a root at {root_at}")
    k = int(torch.multinomial(torch.tensor(weights).sub(top).exp(), 1, generator=gen))
    before = set(torch.randperm(others, generator=gen)[:k].tolist())
    placed_left = iter(_spread(0, left, [chain] * k, gen))
    placed_right = _spread(root_at + 1, right, [[2] * hops] + [chain] * (others - k), gen)
    rest = iter(placed_right[1:])
    return placed_right[0], [
        next(placed_left) if c in before else next(rest) for c in range(others)
    ]


def probes(
    distances: Sequence[int] | torch.Tensor,
    length: int,
    hops: int,
    chains: int,
    gen: torch.Generator,
    present: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Probe windows of ``length`` tokens, one per distance: ``(inputs (n, length), answers (n,))``.

    The last two tokens are the query ``QUERY X_last``; the queried chain's root sits
    ``distance`` tokens before the last one (``min_distance(hops) <= distance < length``), its
    hops at random places in order between the root and the query; ``chains - 1`` chains over
    other variables lie, each in order and wholly before or after the root, in the positions
    left (values drawn independently of the queried one). ``answers`` is the chain's
    answer token. With ``present=False`` the root is left out (filler in its place, all else
    as it would be): the control.
    """
    check_sizes(hops, chains, length)
    least = min_distance(hops)
    d = torch.as_tensor(distances, dtype=torch.int64)
    if d.ndim != 1 or len(d) == 0 or int(d.min()) < least or int(d.max()) >= length:
        raise InputError(
            f"probe distances must be in {least}..{length - 1} (a chain of {hops} hops, its "
            f"assignments before the query's two tokens), got {d.tolist()}"
        )
    n = len(d)
    inputs = torch.randint(0, FILLER, (n, length), generator=gen)
    names, values = _chains(n, chains, hops, gen)
    root_at = length - 1 - d
    at = torch.empty(n, chains, hops + 1, dtype=torch.int64)
    for row, anchor in enumerate(root_at.tolist()):
        inner, others = _around(anchor, length, hops, chains - 1, gen)
        at[row] = torch.tensor([[anchor, *inner], *others], dtype=torch.int64)
    rows = torch.arange(n)
    under_root = inputs[rows, root_at]
    _write(inputs, at, names, values)
    if not present:
        inputs[rows, root_at] = under_root
    inputs[:, -2] = QUERY
    inputs[:, -1] = NAME0 + names[:, 0, -1]
    return inputs, ANSWER0 + values[:, 0]


def anywhere(
    model: nn.Module, length: int, hops: int, chains: int, count: int, gen: torch.Generator
) -> dict[str, int]:
    """``{"correct", "total"}`` on ``count`` probes of ``length`` with the root at a distance
    uniform over ``min_distance(hops)..length - 1``, drawn from ``gen``."""
    d = torch.randint(min_distance(hops), length, (count,), generator=gen)
    x, a = probes(d, length, hops, chains, gen)
    return {"correct": _retrieval.correct(model, x, a), "total": count}


def evaluate(
    model: nn.Module,
    lengths: Sequence[int],
    train_len: int,
    hops: int,
    chains: int,
    count: int,
    seed: int,
) -> dict[str, dict[str, object]]:
    """Variable-tracking counts of ``model`` at each length, shaped as
    :func:`retrieval.evaluate`'s: ``{str(length): {"anywhere": {"correct", "total"},
    "by_distance": {bin: {"correct", "total"}}, "control": {"correct", "total"}}}``.

    The distance is the root's from the last token. ``anywhere``: ``count`` probes at a
    distance uniform over ``min_distance(hops)..length - 1``; ``by_distance``: ``count // 2``
    probes per :func:`retrieval.distance_bins` bin, uniform within it from
    ``min_distance(hops)`` on (a bin wholly below it is left out); ``control``: ``count // 2``
    probes without the root. The probes depend only on ``seed`` and the length. ``model`` maps
    ``(b, length)`` tokens to ``(b, length, VOCAB)`` logits; its answer is the argmax at the
    last position.
    """
    for n in lengths:
        check_sizes(hops, chains, n)

    def make(d: torch.Tensor, n: int, gen: torch.Generator, present: bool) -> _retrieval.Probes:
        return probes(d, n, hops, chains, gen, present)

    return _retrieval.evaluate_probes(
        model, lengths, train_len, count, seed, make, least=min_distance(hops)
    )
