"""The variable-tracking task: chains of assignments, probes at a distance, the control, chance."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

from posemb._errors import InputError
from posemb.lab import retrieval
from posemb.lab import vartrack as vt
from posemb.lab.model import ModelConfig, TinyLM
from posemb.lab.train import adamw, train, warmup_cosine


def _is_name(t: int) -> bool:
    return vt.NAME0 <= t < vt.NAME0 + vt.NAMES


def _is_root(t: int) -> bool:
    return vt.ROOT0 <= t < vt.ROOT0 + vt.NAMES * vt.VALUES


def _parse(row: list[int]) -> tuple[dict[int, tuple[int, int | str]], list[tuple[int, int]]]:
    """A window read back: its assignments ``{variable: (position, source)}`` (source a value
    for a root, ``"x<n>"`` for variable n) and its queries ``[(position of the queried
    variable, variable)]``; asserts that each variable is assigned once, that every non-filler
    token belongs to one assignment or query and that nothing overlaps."""
    assigned: dict[int, tuple[int, int | str]] = {}
    queries = []
    used: set[int] = set()
    for i, t in enumerate(row):
        if i in used:
            continue
        if t == vt.QUERY:
            assert _is_name(row[i + 1]), (i, row)
            queries.append((i + 1, row[i + 1] - vt.NAME0))
            used |= {i, i + 1}
        elif _is_root(t):
            x, v = divmod(t - vt.ROOT0, vt.VALUES)
            assert x not in assigned
            assigned[x] = (i, v)
            used.add(i)
        elif _is_name(t):
            assert _is_name(row[i + 1]), (i, row)
            x = t - vt.NAME0
            assert x not in assigned
            assigned[x] = (i, f"x{row[i + 1] - vt.NAME0}")
            used |= {i, i + 1}
    for i, t in enumerate(row):
        assert (i in used) == (t >= vt.FILLER), (i, t)
    return assigned, queries


def _trace(assigned: dict[int, tuple[int, int | str]], x: int) -> tuple[int, list[int]]:
    """The value of variable ``x`` and the positions of its chain's assignments, root first;
    asserts that each is written after the one it reads."""
    at = []
    source: int | str = f"x{x}"
    while isinstance(source, str):
        pos, source = assigned[int(source[1:])]
        at.append(pos)
    at.reverse()
    assert at == sorted(at)
    return source, at


def test_training_windows_hold_whole_chains_each_variable_queried_after_it():
    gen = torch.Generator().manual_seed(0)
    hops, chains = 2, 3
    x, y = vt.training_batch(64, 48, hops, chains, gen)
    assert x.shape == y.shape == (64, 48) and x.dtype == y.dtype == torch.int64
    for row, tgt in zip(x.tolist(), y.tolist(), strict=True):
        assigned, queries = _parse(row)
        roots = [v for v, (_, s) in assigned.items() if isinstance(s, int)]
        assert len(roots) == chains and len(assigned) == chains * (hops + 1)
        assert sorted(x for _, x in queries) == sorted(assigned)  # every variable, once
        for at, var in queries:
            value, chain = _trace(assigned, var)
            assert chain[-1] < at - 1  # after the variable's assignment
            assert tgt[at] == vt.ANSWER0 + value
        ends = [v for v in assigned if all(s != f"x{v}" for _, s in assigned.values())]
        assert len(ends) == chains and all(len(_trace(assigned, e)[1]) == hops + 1 for e in ends)
        assert sorted(i for i, t in enumerate(tgt) if t != vt.IGNORE) == sorted(
            a for a, _ in queries
        )


def test_generators_are_deterministic_under_a_seed():
    def draw(seed: int) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        x, y = vt.training_batch(8, 32, 1, 4, gen)
        p, a = vt.probes([4, 10, 31], 32, 1, 4, gen)
        return [x, y, p, a]

    assert all(torch.equal(u, v) for u, v in zip(draw(5), draw(5), strict=True))
    assert not torch.equal(draw(5)[0], draw(6)[0])


def test_training_layouts_cover_every_place():
    # Roots land anywhere their chain's hop and two queries (six positions) still fit after
    # them, at both parities (no alignment to the two-token items); nothing overlaps (parsed).
    gen = torch.Generator().manual_seed(2)
    x, _ = vt.training_batch(3000, 16, 1, 2, gen)
    is_root = (x >= vt.ROOT0) & (x < vt.QUERY)
    assert is_root.any(dim=0).nonzero().flatten().tolist() == list(range(10))
    for row in x[:200].tolist():
        _parse(row)


@pytest.mark.parametrize("present", [True, False])
@pytest.mark.parametrize(("hops", "chains"), [(1, 4), (3, 3)])
def test_probes_put_the_root_at_the_asked_distance_or_leave_it_out(present, hops, chains):
    gen = torch.Generator().manual_seed(1)
    least = vt.min_distance(hops)
    d = torch.tensor([least, least + 1, 63, 30, 62, 17])
    x, ans = vt.probes(d, 64, hops, chains, gen, present=present)
    assert x.shape == (6, 64) and ans.shape == (6,)
    for row, dist, a in zip(x.tolist(), d.tolist(), ans.tolist(), strict=True):
        assigned, queries = _parse(row)
        assert row[62] == vt.QUERY and queries == [(63, row[63] - vt.NAME0)]
        var = queries[0][1]
        roots = [v for v, (_, s) in assigned.items() if isinstance(s, int)]
        if present:
            value, chain = _trace(assigned, var)
            assert len(chain) == hops + 1 and chain[0] == 63 - dist and chain[-1] + 1 < 62
            assert a == vt.ANSWER0 + value
            assert len(roots) == chains
        else:
            # The chain's hops are there, its root is not: its first variable has no value.
            with pytest.raises(KeyError):
                _trace(assigned, var)
            assert row[63 - dist] < vt.FILLER and len(roots) == chains - 1
        # The distractor chains are whole, over other variables.
        assert len(assigned) == chains * (hops + 1) - (0 if present else 1)
        for r in roots:
            assert sum(_trace_end(assigned, v) == r for v in assigned) == hops + 1


def _trace_end(assigned: dict[int, tuple[int, int | str]], x: int) -> int | None:
    """The root variable of ``x``'s chain, or None if the chain has no root."""
    source: int | str = f"x{x}"
    while isinstance(source, str):
        x = int(source[1:])
        if x not in assigned:
            return None
        source = assigned[x][1]
    return x


def test_probes_and_control_differ_only_by_the_root():
    d = torch.tensor([4, 20, 40])
    x, a = vt.probes(d, 48, 1, 4, torch.Generator().manual_seed(3))
    c, b = vt.probes(d, 48, 1, 4, torch.Generator().manual_seed(3), present=False)
    assert torch.equal(a, b)
    assert (x != c).nonzero().tolist() == [[r, 47 - k] for r, k in enumerate(d.tolist())]


def test_bad_sizes_and_distances_are_refused_naming_the_setting():
    gen = torch.Generator()
    with pytest.raises(
        InputError,
        match=r"--vartrack-chains 5 with --vartrack-hops 1 need 35 positions .* 32",
    ):
        vt.training_batch(2, 32, 1, 5, gen)
    with pytest.raises(InputError, match=r"--vartrack-chains 6 with --vartrack-hops 2 need 18 "):
        vt.check_sizes(2, 6, 4096)
    with pytest.raises(InputError, match=r"--vartrack-hops must be an integer >= 1, got 0"):
        vt.check_sizes(0, 2, 64)
    with pytest.raises(InputError, match=r"--vartrack-chains must be an integer >= 1"):
        vt.check_sizes(1, 1.5, 64)  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"probe distances must be in 4\.\.63"):
        vt.probes([3], 64, 1, 4, gen)
    with pytest.raises(InputError, match=r"probe distances must be in 8\.\.63"):
        vt.probes([64], 64, 3, 2, gen)
    vt.check_sizes(1, 8, 56)  # the most that fits: 8 chains * 7 positions, 16 variables


def test_tight_windows_still_place_every_chain():
    # The smallest window the size check allows, at every distance.
    hops, chains = 2, 3
    n = chains * (4 * hops + 3)
    d = torch.arange(vt.min_distance(hops), n)
    x, _ = vt.probes(d, n, hops, chains, torch.Generator().manual_seed(7))
    for row in x.tolist():
        assigned, _ = _parse(row)
        assert len(assigned) == chains * (hops + 1)


class Oracle(nn.Module):
    """Follows the chain: from the queried variable back through its assignments to the root,
    answering the root's value (a fixed answer when there is no root). Logits ``(b, s,
    VOCAB)``."""

    def __init__(self, wrong_chain: bool = False) -> None:
        super().__init__()
        self.wrong_chain = wrong_chain  # answer another chain's value instead

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(*x.shape, vt.VOCAB)
        for b, row in enumerate(x.tolist()):
            assigned, _ = _parse(row)
            root = _trace_end(assigned, row[-1] - vt.NAME0)
            roots = [v for v, (_, s) in assigned.items() if isinstance(s, int)]
            if self.wrong_chain:
                root = next((r for r in roots if r != root), None)
            guess = vt.ANSWER0
            if root is not None:
                guess = vt.ANSWER0 + int(assigned[root][1])
            out[b, -1, guess] = 1.0
        return out


def _within_chance(hits: int, total: int) -> bool:
    return abs(hits / total - vt.CHANCE) <= 3 * math.sqrt(vt.CHANCE * (1 - vt.CHANCE) / total)


def test_a_model_that_cannot_see_the_root_scores_chance():
    res: Any = vt.evaluate(Oracle(), [32, 64], 32, 1, 4, 300, seed=0)
    for entry in res.values():
        assert entry["anywhere"] == {"correct": 300, "total": 300}
        assert all(b["correct"] == b["total"] for b in entry["by_distance"].values())
        assert _within_chance(entry["control"]["correct"], entry["control"]["total"])
    # Another chain's value says nothing about this one's: values are drawn independently.
    other: Any = vt.evaluate(Oracle(wrong_chain=True), [64], 32, 1, 4, 300, seed=0)["64"]
    assert _within_chance(other["anywhere"]["correct"], 300)
    assert _within_chance(other["control"]["correct"], 150)


def test_evaluate_is_shaped_as_retrieval_and_repeatable():
    a: Any = vt.evaluate(Oracle(), [32, 64], 32, 1, 2, 8, seed=1)
    assert a == vt.evaluate(Oracle(), [32, 64], 32, 1, 2, 8, seed=1)
    assert set(a) == {"32", "64"}
    for n, entry in a.items():
        assert set(entry) == {"anywhere", "by_distance", "control"}
        bins = [retrieval.bin_label(*b) for b in retrieval.distance_bins(32, int(n))]
        assert list(entry["by_distance"]) == bins  # 1-4 keeps its distance 4
        assert entry["anywhere"]["total"] == 8 and entry["control"]["total"] == 4


def test_a_small_rope_model_beats_chance_and_stays_at_chance_without_the_root():
    """A few hundred steps teach the direct lookups (a root fact by its variable's name) and
    the shortcut of answering some chain's value, about 1 / chains on the probes; following
    the hop takes thousands of steps (see the module's docstring). Either way a model that
    cannot see the root must be at chance."""
    torch.manual_seed(0)
    model = TinyLM(
        ModelConfig(vocab=vt.VOCAB, encoding="rope", width=32, layers=2, heads=4, train_len=32)
    )
    steps, lr = 500, 3e-3
    gen = torch.Generator().manual_seed(0)
    train(
        model,
        adamw(model, lr, 0.01),
        lambda _: vt.training_batch(32, 32, 1, 3, gen),
        steps,
        lambda s: warmup_cosine(s, steps, lr),
    )
    res: Any = vt.evaluate(model, [32], 32, 1, 3, 256, seed=0)["32"]
    assert res["anywhere"]["correct"] / 256 > 2 * vt.CHANCE, res
    assert _within_chance(res["control"]["correct"], res["control"]["total"]), res
