"""Screen 1: the blender's claims fail when what they claim is broken; its figures draw them."""

import math

import pytest
import torch
from json_nodes import walk

import posemb
from posemb.attention import attention_probs, dot_product_attention
from posemb.lab import dog_bites_man as dbm
from posemb.lesson import figures, measure
from posemb.lesson.screens import s01_blender as s01


def _recency_probs(q, k, causal):
    """Attention that prefers recent keys: the same key no longer gets the same weight."""
    recency = torch.arange(k.shape[2], dtype=q.dtype) * 0.01
    return attention_probs(q, k, causal=causal, bias=recency)


def test_the_same_key_claim_fails_when_attention_prefers_recent_keys(broken):
    assert not broken("attention.causal_same_key_same_weight", "attention_probs", _recency_probs)


def test_the_counting_claim_fails_when_attention_ignores_the_mask(broken):
    # An attention that ignores the mask's count: every position sees the same average.
    def unmasked(q, k, v, causal):
        return dot_product_attention(q, k, v, causal=False)

    assert not broken("attention.causal_mask_leaks_position", "dot_product_attention", unmasked)


@pytest.fixture
def measured(claim_rows, monkeypatch):
    """The trained accuracies this run's claims measured (``claim_rows``: 44 models trained
    once per suite), put where the two claims read them: their verdicts are checked on the
    real numbers and on broken ones without training again (66 s on a worker that had not
    run the claims)."""
    value = {r["id"]: r["value"] for r in claim_rows}
    big = {k: v for k, v in value["attention.dog_bites_man.trained"].items() if k != "bar"}
    small = value["attention.dog_bites_man.small_task_memorises"]
    assert list(big) == list(dbm.ENCODINGS) and set(small) == set(dbm.MEMORISERS)
    # A copy per call, as the real functions give: the trained claim pops NoPE from its dict.
    monkeypatch.setattr(dbm, "accuracy_over_seeds", lambda *a, **k: dict(big))
    monkeypatch.setattr(dbm, "memorisation", lambda *a, **k: dict(small))
    return big, small


def test_memorisation_claim_fails_without_a_drop(monkeypatch, claim_of, measured):
    claim = claim_of("attention.dog_bites_man.small_task_memorises")
    big, real = measured
    assert claim.run()["passed"]
    no_drop = {**real, "alibi": {"train": real["alibi"]["train"], "held_out": big["alibi"] * 4}}
    monkeypatch.setattr(dbm, "memorisation", lambda *a, **k: no_drop)
    assert not claim.run()["passed"]
    t5_drops = {**real, "t5": {"train": real["t5"]["train"], "held_out": [0.8] * 10}}
    monkeypatch.setattr(dbm, "memorisation", lambda *a, **k: t5_drops)
    assert not claim.run()["passed"]


def test_dog_bites_man_claims_fail_on_a_weak_encoding(monkeypatch, claim_of, measured):
    real, _ = measured
    assert claim_of("attention.dog_bites_man.trained").run()["passed"]
    weak = {**real, "alibi": [0.55, 0.6, 0.58]}
    monkeypatch.setattr(dbm, "accuracy_over_seeds", lambda *a, **k: dict(weak))
    assert not claim_of("attention.dog_bites_man.trained").run()["passed"]
    leaky = {**real, "nope": [0.5, 0.52, 0.5]}
    monkeypatch.setattr(dbm, "accuracy_over_seeds", lambda *a, **k: dict(leaky))
    assert not claim_of("attention.dog_bites_man.trained").run()["passed"]


def test_bar_for_above_chance_is_five_standard_errors_of_independent_answers():
    assert measure.above_chance(100) == pytest.approx(0.75)
    # 288 held-out sentences are 72 ordered pairs asked with 4 verbs each.
    assert measure.independent_answers(288) == 72
    assert measure.above_chance(72) == pytest.approx(0.5 + 2.5 / math.sqrt(72))


def test_the_blender_shows_the_measured_word_change(by_id):
    outs = measure.dog_bites_man_outputs()
    for label, name in s01.ENCODING_NAMES.items():
        assert f"{measure.word_change(*outs[name]):.3g}" in by_id["fig-blender"].readouts[label]


def test_trained_attention_is_the_models_own(by_id):
    fig = by_id["fig-trained-attention"]
    model = s01._trained_rope_encoder()
    tokens = torch.tensor(
        [[posemb.lab.dog_bites_man.VOCAB.index(w) for w in ("[CLS]", "dog", "bites", "man")]]
    )
    with torch.no_grad():
        w = model.attention_weights(tokens)[0, 0]
    rows = fig.states["dog bites man"]["data"]["values"]
    got = {(r["head"], r["i"], r["j"]): r["weight"] for r in rows}
    for (h, i, j), v in got.items():
        assert v == pytest.approx(float(w[int(h.split()[-1]), i, j]), rel=1e-3, abs=1e-6)
    assert len(got) == w.numel()


def test_causal_figure_shows_the_three_copies_weights(by_id):
    fig = by_id["fig-causal-same-token"]
    readout = fig.readouts[""]
    assert "no positions: the same" in readout and "RoPE: not the same" in readout
    rows = next(
        n["values"] for n in walk(fig.states[""]) if "values" in n and "encoding" in n["values"][0]
    )
    assert sorted({r["back"] for r in rows}) == [1, 99, 599]
    none = [r["w"] for r in rows if r["encoding"] == "no positions"]
    assert len(set(none)) == 1
    # Not saturated: every weight within a factor 10 of uniform attention over 600 keys.
    assert all(1 / 6000 < r["w"] < 10 / 600 for r in rows)


def test_the_exercise_answer_is_measured_not_typed(monkeypatch):
    from posemb.lesson import registry

    (before,) = [e for e in registry.exercises() if e.screen == 1]
    assert "float64 rounding" in before.answer
    monkeypatch.setattr(measure, "word_change", lambda a, b: 0.5)
    (after,) = [e for e in registry.exercises() if e.screen == 1]
    assert after.answer != before.answer and "0.5" in after.answer


def _trained_row(value):
    return {"id": s01.TRAINED_CLAIM, "value": value}


def test_trained_accuracy_draws_the_verify_rows_it_is_given(by_id):
    default = by_id["fig-trained-accuracy"]
    assert default.readouts[""].startswith("not measured in this build")
    value = {"nope": [0.5, 0.5], "rope": [0.9375, 0.875], "bar": 0.7946}
    rows = [{"id": "something.else", "value": 1.0}, _trained_row(value)]
    fig = figures.build_figure("fig-trained-accuracy", claim_rows=rows)
    assert "nope 0.500, rope 0.906" in fig.readouts[""]
    assert "pass bar 0.795" in fig.readouts[""]
    drawn = fig.states[""]["data"]["values"]
    means = {r["encoding"]: r["acc"] for r in drawn if r["kind"] == "mean"}
    assert means == {"nope": 0.5, "rope": pytest.approx(0.90625, rel=1e-3)}
    assert sorted(r["acc"] for r in drawn if r["kind"] == "seed") == [0.5, 0.5, 0.875, 0.9375]
    # Rows from a run without this claim (posemb verify --only ...): not measured.
    other = figures.build_figure("fig-trained-accuracy", claim_rows=rows[:1])
    assert other.readouts[""].startswith("not measured in this build")


@pytest.mark.parametrize("value", [0.5, {"nope": [0.5]}, {"bar": 0.8}, {"nope": "x", "bar": 0.8}])
def test_trained_accuracy_refuses_a_row_that_is_not_the_claims(value):
    with pytest.raises(ValueError, match=s01.TRAINED_CLAIM):
        figures.build_figure("fig-trained-accuracy", claim_rows=[_trained_row(value)])


def test_trained_accuracy_caption_says_what_was_measured():
    # ALiBi's lowest seed is under the bar: the caption must say so, not that every encoding
    # clears it (before: the same sentence whatever was measured).
    value = {"nope": [0.5, 0.5], "rope": [0.9375, 0.875], "alibi": [0.55, 0.9], "bar": 0.7946}
    fig = figures.build_figure("fig-trained-accuracy", claim_rows=[_trained_row(value)])
    assert "every encoding clears" not in fig.caption
    assert "rope clears the pass bar (0.795" in fig.caption
    assert "alibi does not (lowest seed 0.550)" in fig.caption
    assert "nope stays at chance (0.5) on every seed" in fig.caption
    # No positions above chance is said too, with its mean.
    leaky = {**value, "nope": [0.5, 0.6]}
    fig = figures.build_figure("fig-trained-accuracy", claim_rows=[_trained_row(leaky)])
    assert "nope is not at chance (0.5) on every seed (mean 0.550)" in fig.caption
    everyone = {**value, "alibi": [0.85, 0.9]}
    fig = figures.build_figure("fig-trained-accuracy", claim_rows=[_trained_row(everyone)])
    assert "rope and alibi clear the pass bar (0.795" in fig.caption
    # Nothing measured: the caption claims no result.
    fig = figures.build_figure("fig-trained-accuracy", claim_rows=[])
    assert "clear" not in fig.caption and "not measured in this build" in fig.caption.lower()
