"""The retrieval task: training windows, probes at a distance, distance bins."""

import pytest
import torch

from posemb.lab import retrieval


def test_training_windows_query_each_fact_once_after_it():
    gen = torch.Generator().manual_seed(0)
    x, y = retrieval.training_batch(64, 32, 4, gen)
    assert x.shape == y.shape == (64, 32)
    for row, tgt in zip(x.tolist(), y.tolist(), strict=True):
        facts = {
            (t - retrieval.FACT0) // retrieval.VALUES: (i, (t - retrieval.FACT0) % retrieval.VALUES)
            for i, t in enumerate(row)
            if retrieval.FACT0 <= t < retrieval.QUERY0
        }
        queries = [
            (i, t - retrieval.QUERY0)
            for i, t in enumerate(row)
            if retrieval.QUERY0 <= t < retrieval.ANSWER0
        ]
        assert len(facts) == len(queries) == 4  # distinct keys
        for i, key in queries:
            at, value = facts[key]
            assert at < i and tgt[i] == retrieval.ANSWER0 + value
        assert sum(t != retrieval.IGNORE for t in tgt) == 4
        assert all(t < retrieval.FILLER for t in row if t < retrieval.FACT0)


@pytest.mark.parametrize("present", [True, False])
def test_probes_put_the_fact_at_the_asked_distance_or_leave_it_out(present):
    gen = torch.Generator().manual_seed(1)
    d = torch.tensor([1, 5, 63, 30])
    x, ans = retrieval.probes(d, 64, 4, gen, present=present)
    for row, dist, a in zip(x.tolist(), d.tolist(), ans.tolist(), strict=True):
        key = row[-1] - retrieval.QUERY0
        assert 0 <= key < retrieval.KEYS
        fact = retrieval.FACT0 + key * retrieval.VALUES + (a - retrieval.ANSWER0)
        with_key = [
            i
            for i, t in enumerate(row)
            if retrieval.FACT0 <= t < retrieval.QUERY0
            and (t - retrieval.FACT0) // retrieval.VALUES == key
        ]
        assert with_key == ([63 - dist] if present else [])
        if present:
            assert row[63 - dist] == fact
        others = [t for t in row if retrieval.FACT0 <= t < retrieval.QUERY0]
        assert len(others) == (4 if present else 3)


def test_probe_and_fact_errors():
    gen = torch.Generator()
    with pytest.raises(ValueError, match=r"probe distances must be in 1\.\.63"):
        retrieval.probes([64], 64, 4, gen)
    with pytest.raises(ValueError, match=r"--retrieval-facts must be 1\.\.16"):
        retrieval.training_batch(2, 64, 17, gen)


def test_distance_bins_do_not_depend_on_the_length():
    assert retrieval.distance_bins(64, 64) == [(0, 8), (8, 16), (16, 32), (32, 64)]
    long = retrieval.distance_bins(64, 1024)
    assert long[:4] == retrieval.distance_bins(64, 64) and long[-1] == (512, 1024)
    assert [retrieval.bin_label(*b) for b in long[4:6]] == ["65-128", "129-256"]
