"""The flip-flop task: windows that follow the flip-flop rules, probes at a distance, the
control at chance, and a model that follows the rule scoring 1 where the write is present."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from posemb._errors import InputError
from posemb.lab import flipflop as ff
from posemb.lab import retrieval


def _scan(row: list[int]) -> list[int | None]:
    """Written out from the task's definition: the last written bit before each position
    (None before any write), reading the window as a lead bit then instruction-bit pairs."""
    assert row[0] in (ff.BIT0, ff.BIT1)
    last, out = None, []
    for i, t in enumerate(row):
        out.append(last)
        if i % 2 == 1:
            assert t in (ff.WRITE, ff.IGNORE_OP, ff.READ), (i, t)
            if t == ff.WRITE and i + 1 < len(row):
                last = row[i + 1] - ff.BIT0
        else:
            assert t in (ff.BIT0, ff.BIT1), (i, t)
    return out


def test_training_windows_score_every_read_with_the_last_write():
    gen = torch.Generator().manual_seed(0)
    x, y = ff.training_batch(64, 64, gen)
    assert x.shape == y.shape == (64, 64) and x.dtype == y.dtype == torch.int64
    ops = x[:, 1::2]
    assert (ops[:, 0] == ff.WRITE).all()
    share = {op: float((ops == op).float().mean()) for op in (ff.WRITE, ff.READ, ff.IGNORE_OP)}
    assert abs(share[ff.IGNORE_OP] - 0.8) < 0.03 and abs(share[ff.READ] - 0.1) < 0.03
    for row, tgt in zip(x.tolist(), y.tolist(), strict=True):
        memory = _scan(row)
        for i, t in enumerate(row):
            if i % 2 == 1 and t == ff.READ:
                assert tgt[i] == ff.BIT0 + memory[i + 1 if i + 1 < len(row) else i]
                if i + 1 < len(row):  # a read's own bit is the written one, as the rules say
                    assert row[i + 1] == tgt[i]
            else:
                assert tgt[i] == ff.IGNORE, (i, t)


def _even(low: int, high: int, size: int, gen: torch.Generator) -> torch.Tensor:
    return 2 * torch.randint(low // 2, high // 2 + 1, (size,), generator=gen)


@pytest.mark.parametrize("length", [8, 64, 256])
def test_probes_put_the_last_write_at_the_distance_with_only_ignores_after_it(length):
    gen = torch.Generator().manual_seed(1)
    d = _even(ff.MIN_DISTANCE, length - 2, 200, gen)
    x, answers = ff.probes(d, length, gen)
    for row, ans, dist in zip(x.tolist(), answers.tolist(), d.tolist(), strict=True):
        assert row[-1] == ff.READ
        write = length - 1 - dist
        assert row[write] == ff.WRITE and ans == row[write + 1]
        assert all(row[i] == ff.IGNORE_OP for i in range(write + 2, length - 1, 2))
        memory = _scan(row)
        assert memory[-1] == ans - ff.BIT0
        for i in range(1, write, 2):  # reads before it agree with the writes before them
            if row[i] == ff.READ:
                assert row[i + 1] - ff.BIT0 == memory[i + 1]


def _after_the_last_instruction(row: list[int]) -> int:
    """A shortcut a model could learn: the bit after the first of the trailing ignores (which
    a control that kept the removed write's bit would hand it)."""
    i = len(row) - 3
    while i > 1 and row[i] == ff.IGNORE_OP:
        i -= 2
    return row[i + 3] if i + 3 < len(row) else row[i + 1]


def test_the_control_leaves_the_answer_in_no_token_of_the_window():
    gen = torch.Generator().manual_seed(2)
    d = _even(ff.MIN_DISTANCE, 126, 4000, gen)
    x, answers = ff.probes(d, 128, gen, present=False)
    rows = torch.arange(len(d))
    assert (x[rows, 127 - d] == ff.IGNORE_OP).all()
    # Neither the rule (the previous write) nor the bit left where the write was, nor the
    # shortcut above, beats a coin.
    scanned = torch.tensor([-1 if (m := _scan(r)[-1]) is None else m for r in x.tolist()])
    shortcut = torch.tensor([_after_the_last_instruction(r) for r in x.tolist()])
    for guess in (scanned + ff.BIT0, x[rows, 128 - d], shortcut):
        agree = float((guess == answers).float().mean())
        assert abs(agree - ff.CHANCE) < 0.03, agree


@pytest.mark.parametrize("train_len", [24, 40, 64])
def test_evaluation_draws_even_distances_inside_each_bin(train_len, monkeypatch):
    seen = []
    real = ff.probes

    def spy(d, n, gen, present=True):
        seen.append((n, d.clone()))
        return real(d, n, gen, present)

    monkeypatch.setattr(ff, "probes", spy)
    got = ff.evaluate(_Rule(), [train_len, 4 * train_len + 2], train_len, 16, seed=0)
    assert seen and all(((d % 2 == 0) & (d >= 2) & (d <= n - 2)).all() for n, d in seen)
    for n, entry in got.items():
        for label, counts in entry["by_distance"].items():
            lo, hi = (int(x) for x in label.split("-"))
            assert counts["total"] > 0 and any(
                lo <= k <= hi and k % 2 == 0 for k in range(2, int(n) - 1)
            ), label
    for n, entry in got.items():
        want = {
            retrieval.bin_label(lo, hi)
            for lo, hi in retrieval.distance_bins(train_len, int(n))
            if any(k % 2 == 0 for k in range(max(lo + 1, 2), min(hi, int(n) - 2) + 1))
        }
        assert set(entry["by_distance"]) == want, (n, want)


class _Rule(nn.Module):
    """A model that follows the flip-flop rule exactly: logits for the last written bit."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(*x.shape, ff.VOCAB)
        for b, row in enumerate(x.tolist()):
            last = _scan(row)[-1]
            out[b, -1, ff.BIT0 + (last if last is not None else 0)] = 1.0
        return out


def test_the_rule_scores_one_and_the_control_is_at_chance():
    got = ff.evaluate(_Rule(), [64, 256], 64, 64, seed=0)
    for entry in got.values():
        assert entry["anywhere"]["correct"] == entry["anywhere"]["total"] == 64
        for b in entry["by_distance"].values():
            assert b["correct"] == b["total"]
        ctl = entry["control"]
        assert abs(ctl["correct"] / ctl["total"] - ff.CHANCE) < 0.3
    # The probes depend on the seed and the length only.
    assert ff.evaluate(_Rule(), [64], 64, 16, seed=3) == ff.evaluate(_Rule(), [64], 64, 16, 3)


@pytest.mark.parametrize("length", [3, 7, 2, 0, True, 64.0])
def test_windows_that_cannot_end_on_a_read_after_a_write_are_refused(length):
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(InputError, match="even length >= 4"):
        ff.training_batch(4, length, gen)
    with pytest.raises(InputError, match="even length >= 4"):
        ff.evaluate(_Rule(), [64, length], 64, 4, seed=0)


def test_probe_distances_out_of_range_or_odd_are_refused():
    gen = torch.Generator().manual_seed(0)
    for bad in ([0], [3], [63], [64], [], [[2, 4]]):
        with pytest.raises(InputError, match="probe distances"):
            ff.probes(bad, 64, gen)
