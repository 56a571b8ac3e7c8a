"""The lab's report: the compact summary of the default run that ships with posemb."""

import json
import math
import os

from posemb.lab import report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FULL = os.path.join(ROOT, "docs", "lab", "results.json")


def _full():
    with open(FULL, encoding="utf-8") as f:
        return json.load(f)


def test_shipped_summary_is_the_compact_default_run():
    # If this fails, docs/lab/results.json changed: run `python scripts/make_lab_summary.py`.
    assert report.default_summary() == report.compact(_full())


def test_compact_keeps_every_mean_and_drops_the_curves():
    full = _full()
    small = report.compact(full)
    assert set(small) == {
        "corpus",
        "unigram_entropy",
        "train_len",
        "eval_lens",
        "config",
        "versions",
        "results",
        "coincide",
        "retrieval",
        "entropy",
        "race",
    }
    assert small["train_len"] == 64 and small["eval_lens"] == [64, 128, 256, 512, 1024]
    assert small["corpus"]["name"] == "kjv" and small["config"] == full["config"]
    assert set(small["results"]) == set(full["config"]["variants"])
    for variant, per_len in full["results"].items():
        assert set(small["results"][variant]) == {str(n) for n in small["eval_lens"]}
        for n, entry in per_len.items():
            got = small["results"][variant][n]
            assert set(got) == {"all", "past"}
            assert got["all"] == entry["all"] and got["past"] == entry.get("past")
            assert (got["past"] is None) == (int(n) == small["train_len"])
            assert got["all"]["n"] == len(full["config"]["seeds"])
            # Losses in nats/char of trained models: every one beats uniform guessing.
            assert 0 < got["all"]["mean"] < math.log(small["corpus"]["vocab"])
    # At its training length a trained model beats the unigram entropy.
    assert small["results"]["rope"]["64"]["all"]["mean"] < small["unigram_entropy"]
    assert len(json.dumps(small)) < len(json.dumps(full)) / 5
    # The default run measures every task for every encoding, so the page can draw them.
    variants = set(full["config"]["variants"])
    assert set(small["retrieval"]["variants"]) == variants
    assert set(small["entropy"]["variants"]) == variants
    assert set(small["race"]["entrants"]) == set(full["config"]["race_entrants"])
    assert ["rope+ntk", "rope+dynamic"] in small["coincide"]
    for per_len in small["retrieval"]["variants"].values():
        for e in per_len.values():
            assert 0 <= e["anywhere"]["mean"] <= 1 and e["control"]["total"] > 0


def test_write_default_summary_round_trips(tmp_path):
    out = report.write_default_summary(FULL, str(tmp_path / "s.json"))
    with open(out, encoding="utf-8") as f:
        assert json.load(f) == report.compact(_full())


def test_mean_std_is_the_sample_deviation():
    assert report.mean_std([1.0]) == {"mean": 1.0, "std": None, "n": 1}
    got = report.mean_std([1.0, 2.0, 3.0])
    assert got["mean"] == 2.0 and got["std"] == 1.0 and got["n"] == 3
