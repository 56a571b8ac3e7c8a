"""Flip-flop: remember the bit of the last write, ignoring every other bit since.

After flip-flop language modelling (Liu et al. 2023, "Exposing Attention Glitches with
Flip-Flop Language Modeling"), the selective-copy task on which CoPE (Golovneva et al. 2024,
"Contextual Position Encoding", section 5) reports its largest gain over RoPE out of
distribution. A window is a string of instructions, each followed by a bit::

    w 1  i 0  i 1  r 1  w 0  i 1  i 1  i 0 ... i 1  r ?   -> answer 0

``w b`` writes ``b``, ``i b`` is ignored, ``r b`` reads: its ``b`` must equal the bit of the most
recent ``w``. The model predicts the bit after every ``r``. The answer is a copy, but of which
token: the bit after the *last* ``w``, among bits that look exactly alike after ``i`` and after
older writes. A position index says how far back a token is; what the task needs is how many
``w`` lie between, which is what CoPE's gates count.

Tokens (``VOCAB`` = 5): ``BIT0``, ``BIT1``, ``WRITE``, ``IGNORE_OP``, ``READ``. Instructions are
drawn with the paper's FFL(0.8) mix: ``w`` 0.1, ``r`` 0.1, ``i`` 0.8 (``P_WRITE``, ``P_READ``),
bits uniformly; the first instruction is a write, so every read has an answer. Windows have an
even ``length``: a lone bit first (the tail of a pair cut off), then pairs, the last one cut
after its instruction, so instructions sit at odd positions (a probe's last is its ``r``).

Training windows score every read (loss at the ``r`` positions, target the last write's bit).
A probe ends on ``r``; the last write is ``distance`` tokens before it (an even number: both are
instructions; :func:`evaluate` draws even distances only), only ignores lie between, and before
it the FFL(0.8) mix (with its reads, each consistent). With a write every ten pairs in
training, a last write more than ~60 tokens back is rare at 64 tokens and never seen farther: a
probe at 16x asks the model to skip up to ~500 ignores, the paper's "sparse"
out-of-distribution test made a test of length. The **control** turns that last write into an
ignore and draws its bit again: the answer is then a bit that appears nowhere in the window, so
``CHANCE`` = 1/2 for any model. (Keeping the bit would not do: it would be the bit after the
first of the trailing ignores, which a model could learn to copy.)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .._errors import InputError
from . import retrieval as _retrieval

BIT0, BIT1, WRITE, IGNORE_OP, READ = range(5)
VOCAB = 5
CHANCE = 0.5
IGNORE = _retrieval.IGNORE
P_WRITE = 0.1
P_READ = 0.1
MIN_DISTANCE = 2  # the last write is the instruction just before the read


def check_sizes(length: int) -> None:
    """Refuse (``InputError``) a window that cannot end on a read after a write: ``length``
    must be even and at least 4 (a bit, a write and its bit, a read)."""
    if isinstance(length, bool) or not isinstance(length, int) or length < 4 or length % 2:
        raise InputError(
            f"flipflop windows must have an even length >= 4 (a bit, then instruction-bit "
            f"pairs ending on a read), got {length!r}"
        )


def _instructions(rows: int, pairs: int, gen: torch.Generator) -> torch.Tensor:
    """``(rows, pairs)`` instructions in the FFL(0.8) mix, the first of each row a write."""
    u = torch.rand(rows, pairs, generator=gen)
    ops = torch.where(
        u < P_WRITE,
        torch.tensor(WRITE),
        torch.where(u < P_WRITE + P_READ, torch.tensor(READ), torch.tensor(IGNORE_OP)),
    )
    ops[:, 0] = WRITE
    return ops


def _fill_reads(ops: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """The bits with every read's bit set to the last write before it; returns, per pair, the
    last written bit so far (``(rows, pairs)``; -1 before any write)."""
    rows, pairs = ops.shape
    last = torch.full((rows,), -1, dtype=torch.int64)
    memory = torch.empty(rows, pairs, dtype=torch.int64)
    for j in range(pairs):
        is_write, is_read = ops[:, j] == WRITE, ops[:, j] == READ
        last = torch.where(is_write, bits[:, j], last)
        bits[:, j] = torch.where(is_read & (last >= 0), last, bits[:, j])
        memory[:, j] = last
    return memory


def _window(ops: torch.Tensor, bits: torch.Tensor, lead: torch.Tensor) -> torch.Tensor:
    """Tokens ``(rows, 1 + 2 * pairs - 1)``: the lead bit, then each pair, the last bit cut."""
    rows, pairs = ops.shape
    body = torch.stack([ops, BIT0 + bits], dim=2).view(rows, 2 * pairs)
    return torch.cat([(BIT0 + lead).view(rows, 1), body[:, :-1]], dim=1)


def training_batch(
    batch: int, length: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of training windows: ``(inputs (batch, length), targets (batch, length))``, the
    target at each ``r`` the bit of the last write before it (``IGNORE`` elsewhere). Draws
    only from ``gen``."""
    check_sizes(length)
    pairs = length // 2
    ops = _instructions(batch, pairs, gen)
    bits = torch.randint(0, 2, (batch, pairs), generator=gen)
    lead = torch.randint(0, 2, (batch,), generator=gen)
    memory = _fill_reads(ops, bits)
    inputs = _window(ops, bits, lead)
    targets = torch.full((batch, length), IGNORE, dtype=torch.int64)
    at = 1 + 2 * torch.arange(pairs)  # instruction positions
    reads = ops == READ
    targets[:, at] = torch.where(reads, BIT0 + memory, torch.tensor(IGNORE))
    return inputs, targets


def probes(
    distances: Sequence[int] | torch.Tensor,
    length: int,
    gen: torch.Generator,
    present: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Probe windows of ``length`` tokens ending on ``r``, one per distance: ``(inputs (n,
    length), answers (n,))``.

    The last write is ``distance`` tokens before the final ``r`` (even, in ``MIN_DISTANCE..
    length - 2``: instructions sit two apart). Only ignores lie between; before it, the
    FFL(0.8) mix. ``answers`` is the last write's bit token. With ``present=False`` that write
    is an ignore and its bit is drawn again: the control.
    """
    check_sizes(length)
    d = torch.as_tensor(distances, dtype=torch.int64)
    if (
        d.ndim != 1
        or len(d) == 0
        or int(d.min()) < MIN_DISTANCE
        or int(d.max()) > length - 2
        or bool((d % 2).any())
    ):
        raise InputError(
            f"probe distances must be even, in {MIN_DISTANCE}..{length - 2} (an instruction "
            f"before the final read), got {d.tolist()}"
        )
    n, pairs = len(d), length // 2
    ops = _instructions(n, pairs, gen)
    bits = torch.randint(0, 2, (n, pairs), generator=gen)
    lead = torch.randint(0, 2, (n,), generator=gen)
    last = pairs - 1 - d // 2  # the pair of the last write
    j = torch.arange(pairs).view(1, pairs)
    ops = torch.where(j > last.view(n, 1), torch.tensor(IGNORE_OP), ops)
    ops[torch.arange(n), last] = WRITE
    ops[:, -1] = READ
    answers = BIT0 + bits[torch.arange(n), last]
    _fill_reads(ops, bits)  # reads before the last write agree with the writes before them
    if not present:
        ops[torch.arange(n), last] = IGNORE_OP
        bits[torch.arange(n), last] = torch.randint(0, 2, (n,), generator=gen)
        _fill_reads(ops, bits)
    return _window(ops, bits, lead), answers


def evaluate(
    model: nn.Module, lengths: Sequence[int], train_len: int, count: int, seed: int
) -> dict[str, dict[str, object]]:
    """Flip-flop counts of ``model`` at each length, shaped as
    :func:`posemb.lab.retrieval.evaluate`'s (``anywhere``, ``by_distance``, ``control``), from
    probes that depend only on ``seed`` and the length, at even distances (a bin with none is
    left out). ``model`` maps ``(b, length)`` tokens
    to ``(b, length, VOCAB)`` logits; its answer is the argmax at the last position."""
    for n in lengths:
        check_sizes(n)

    def make(d: torch.Tensor, n: int, gen: torch.Generator, present: bool) -> _retrieval.Probes:
        return probes(d, n, gen, present)

    return _retrieval.evaluate_probes(
        model, lengths, train_len, count, seed, make, least=MIN_DISTANCE, step=2
    )
