"""The lab summary's schema holds the shipped summary, and LabSummary reads it."""

import copy
import typing

import pytest

from posemb.lab import report
from posemb.lab.schema import (
    Accuracy,
    EntropyAt,
    LabSummary,
    LossAt,
    Probe,
    Retrieval,
    RetrievalAt,
    Stat,
    Summary,
)


def _keys(td):
    return set(typing.get_type_hints(td))


def test_the_shipped_summary_has_the_schemas_keys():
    s = report.default_summary()
    assert set(s) == _keys(Summary)
    for per_len in s["results"].values():
        for at in per_len.values():
            assert set(at) == _keys(LossAt)
            assert set(at["all"]) == _keys(Stat)
            assert at["past"] is None or set(at["past"]) == _keys(Stat)
    r = s["retrieval"]
    assert set(r) == _keys(Retrieval)
    for per_len in r["variants"].values():
        for at in per_len.values():
            assert set(at) == _keys(RetrievalAt)
            assert set(at["anywhere"]) == _keys(Accuracy)
    for modes in s["entropy"]["variants"].values():
        for per_len in modes.values():
            for at in per_len.values():
                assert set(at) == _keys(EntropyAt)


def test_the_recent_summary_has_the_schemas_keys_and_answers_accuracy():
    s = report.recent_summary()
    assert set(s) == _keys(Summary)
    lab = LabSummary.of(s)
    for task in ("multikey", "vartrack"):
        assert set(s[task]) == _keys(Probe)
        at = s[task]["variants"]["rope"]["1024"]["anywhere"]
        assert set(at) == _keys(Accuracy)
        assert lab.accuracy(task, "rope", 1024) == at
        assert lab.chance(task) == s[task]["chance"] and 0 < lab.chance(task) < 1
    assert (
        lab.accuracy("retrieval", "cope", 64)
        == s["retrieval"]["variants"]["cope"]["64"]["anywhere"]
    )
    with pytest.raises(ValueError, match="no 'multikey' accuracy for 'alibi' at 1024"):
        lab.accuracy("multikey", "alibi", 1024)
    with pytest.raises(ValueError, match="no 'multikey' accuracy for 'rope' at 100"):
        lab.accuracy("multikey", "rope", 100)
    with pytest.raises(ValueError, match="'entropy' is not a probe task"):
        lab.accuracy("entropy", "rope", 1024)
    # The default run has no multikey task: asked for it, the reader says so.
    with pytest.raises(ValueError, match="no 'multikey' results"):
        LabSummary.of(report.default_summary()).chance("multikey")


def test_the_reader_answers_from_the_summary():
    s = report.default_summary()
    lab = LabSummary.of(s)
    assert LabSummary.of(lab) is lab
    train, longest = s["config"]["train_len"], s["config"]["eval_lens"][-1]
    assert lab.train_len == train and lab.eval_lens == s["config"]["eval_lens"]
    assert lab.past_lens == s["config"]["eval_lens"][1:]
    assert lab.unigram == s["unigram_entropy"] and lab.variants == list(s["results"])
    assert lab.loss("rope", train, "past") is None
    past = s["results"]["rope"][str(longest)]["past"]
    assert lab.mean_std("rope", longest, "past") == (past["mean"], past["std"])
    within = s["results"]["rope"][str(train)]["all"]["mean"]
    kept = (s["unigram_entropy"] - past["mean"]) / (s["unigram_entropy"] - within)
    assert lab.context_kept("rope", longest) == pytest.approx(kept, rel=1e-12)
    rises, means, _ = lab.past_vs_within("alibi")
    assert len(rises) == len(means) == len(lab.past_lens) and not any(rises)
    assert lab.rises_from("rope", 4)[0] and "lab: 4-layer char LM" in lab.conditions()
    with pytest.raises(ValueError, match="no 'past' loss for 'rope' at 64"):
        lab.mean_std("rope", train, "past")


@pytest.mark.parametrize(
    "damage,message",
    [
        (lambda s: s.pop("results"), "no 'results'"),
        (lambda s: s["config"].pop("seeds"), "config has no 'seeds'"),
        (
            lambda s: s["results"]["rope"].pop("64"),
            r"results\['rope'\] has no loss at the training",
        ),
    ],
)
def test_a_summary_without_what_readers_need_is_refused(damage, message):
    s = copy.deepcopy(report.default_summary())
    damage(s)
    with pytest.raises(ValueError, match=message):
        LabSummary.of(s)
