"""The lab's report: the compact summary of the default run that ships with posemb."""

import itertools
import json
import math
import os

import pytest

from posemb.lab import report
from posemb.lab.model import EXTENSIONS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FULL = os.path.join(ROOT, "docs", "lab", "results.json")
RECENT = os.path.join(ROOT, "docs", "lab", "recent", "results.json")


def _full(path=FULL):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def test_shipped_summary_is_the_compact_default_run():
    # If this fails, docs/lab/results.json changed: run `python scripts/make_lab_summary.py`.
    assert report.default_summary() == report.compact(_full())


def test_shipped_recent_summary_is_the_compact_recent_run():
    # If this fails: `python scripts/make_lab_summary.py --suite recent`.
    small = report.recent_summary()
    assert small == report.compact(_full(RECENT))
    full = _full(RECENT)
    for task in ("multikey", "vartrack"):
        assert small[task]["chance"] == full[task]["chance"] and small[task]["sizes"]
        assert set(small[task]["variants"]) == set(full["config"]["variants"])
        for variant, per_len in full[task]["variants"].items():
            for n, at in per_len.items():
                assert small[task]["variants"][variant][n] == {
                    k: at[k] for k in ("anywhere", "control")
                }
    # The default run has no such task: its summary says so rather than leaving the key out.
    assert report.default_summary()["multikey"] is None


def test_write_default_summary_refuses_a_suite_with_no_shipped_summary(tmp_path):
    with pytest.raises(ValueError, match="suite: 'all'"):
        report.write_default_summary(FULL, str(tmp_path / "s.json"), suite="all")
    assert not (tmp_path / "s.json").exists()


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
        "multikey",
        "vartrack",
        "flipflop",
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
    # Entropy reads attention weights, which the extensions' attention does not hand out.
    assert set(small["entropy"]["variants"]) == variants - set(EXTENSIONS)
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


RACE_ENTRANTS = ("rope", "rope+pi", "rope+yarn")
BASE_LOSS = {"rope": 3.0, "rope+pi": 2.6, "rope+yarn": 2.22}
BASE_CORRECT = {"rope": 20, "rope+pi": 40, "rope+yarn": 60}


def _race(seeds, steps, loss, correct, probes=64):
    """The race summary of jobs (entrant, model seed, race seed 0 and 1) whose result at
    milestone N is ``loss(entrant, seed, race_seed, N)`` past the training length (+ 0.5 at
    512 tokens) and ``correct(...)`` of ``probes`` retrieval probes, at 256 and 512 tokens."""
    from posemb.lab.config import LabConfig

    cfg = LabConfig(seeds=seeds, race_seeds=(0, 1), race_steps=steps, race_entrants=RACE_ENTRANTS)
    rows = []
    for entrant, seed, rs in itertools.product(RACE_ENTRANTS, seeds, (0, 1)):
        at = {}
        for step in steps:
            k = (entrant, seed, rs, step)
            at[str(step)] = {
                "loss_past": {"256": loss(*k), "512": loss(*k) + 0.5},
                "retrieval": {n: {"correct": correct(*k), "total": probes} for n in ("256", "512")},
            }
        rows.append(
            {"kind": "race", "encoding": entrant, "seed": seed, "race_seed": rs, "milestones": at}
        )
    return report._race_summary(cfg, rows)


def test_one_model_seed_calls_no_race_gap_beyond_noise():
    # N = 0 fine-tunes nothing: both race seeds of the one model are the same model, the same
    # numbers. Counting them as two runs gave "2.22 ± 0.00" and "beats rope, rope+pi".
    race = _race((0,), (0,), lambda e, *_: BASE_LOSS[e], lambda e, *_: BASE_CORRECT[e])
    md = report._race_md({"race": race})
    assert "beats" not in md and "± 0.00" not in md and "±" not in md
    assert "| rope+yarn | 2.22 |" in md
    assert "One model seed: the spread over models is unknown" in md
    assert md.count("no gap is called beyond noise.") == 4  # 2 lengths x 2 metrics
    yarn, rope = race["entrants"]["rope+yarn"]["0"], race["entrants"]["rope"]["0"]
    for metric in ("loss_past", "retrieval"):
        assert report.differs(yarn[metric]["256"], rope[metric]["256"]) is None
    loss, acc = yarn["loss_past"]["256"], yarn["retrieval"]["256"]
    assert loss == {"mean": 2.22, "std": None, "n": 1, "runs": 2}
    assert acc["n"] == 1 and acc["std"] is None and acc["se"] is None and acc["probes"] == 64
    assert race["unit"] == "model seed" and race["runs"] == 2


def test_race_standard_error_is_over_model_seeds_not_runs():
    # Model seed s shifts every number; race seed r shifts it a little after fine-tuning.
    def loss(e, s, r, step):
        return BASE_LOSS[e] + 0.1 * s + (0.01 * r if step else 0.0)

    def correct(e, s, r, step):
        return BASE_CORRECT[e] + 4 * s + (r if step else 0)

    race = _race((0, 1), (0, 25), loss, correct)
    for step in (0, 25):
        e = race["entrants"]["rope+pi"][str(step)]["loss_past"]["256"]
        want = report.mean_std(
            [(loss("rope+pi", s, 0, step) + loss("rope+pi", s, 1, step)) / 2 for s in (0, 1)]
        )
        # The standard error of the two model-seed means, not of four runs (~42% too small at
        # N = 0, where each model counted twice).
        assert report.noise(e) == pytest.approx(want["std"] / math.sqrt(2))
        assert e["mean"] == pytest.approx(want["mean"]) and e["std"] == pytest.approx(want["std"])
        assert e["n"] == 2 and e["runs"] == 4
        a = race["entrants"]["rope+pi"][str(step)]["retrieval"]["256"]
        w = report.mean_std(
            [
                (correct("rope+pi", s, 0, step) + correct("rope+pi", s, 1, step)) / 128
                for s in (0, 1)
            ]
        )
        p = a["correct"] / a["total"]
        # Every run answers the same 64 probes: their noise is that of 64, not of 4 x 64.
        assert report.noise(a) == pytest.approx(
            math.hypot(w["std"] / math.sqrt(2), math.sqrt(p * (1 - p) / 64))
        )
        assert a["mean"] == pytest.approx(w["mean"]) and a["std"] == pytest.approx(w["std"])
        assert a["n"] == 2 and a["runs"] == 4 and a["probes"] == 64 and a["total"] == 256
    md = report._race_md({"race": race})
    assert "over 2 model seed(s) [0, 1], each the mean of its fine-tuning seeds [0, 1]" in md
    verdict = "beyond noise (2 standard errors over 2 model seeds) it beats rope+pi, rope."
    assert md.count(verdict) == 4


def test_an_old_race_summary_still_reads_and_calls_nothing():
    # The race of the run shipped before issue 33 (docs/lab/results.json at 964a48a), which
    # pooled race seeds as independent runs; the shipped one now counts model seeds.
    with open(os.path.join(ROOT, "tests", "data", "lab_race_pooled.json"), encoding="utf-8") as f:
        race = json.load(f)
    assert "unit" not in race and "unit" in _full()["race"]
    md = report._race_md({"race": race})
    assert "mean ± std over 4 runs" in md and "beats" not in md
    assert "counts every fine-tuning seed as an independent model" in md
    assert report.default_summary()["race"] == _full()["race"]


def test_the_recent_suites_shipped_report_is_its_results():
    """docs/lab/recent/results.md is what the report makes of the shipped results.json, and
    that run is the recent suite with every probe task's control at chance."""
    folder = os.path.join(ROOT, "docs", "lab", "recent")
    with open(os.path.join(folder, "results.json"), encoding="utf-8") as f:
        summary = json.load(f)
    with open(os.path.join(folder, "results.md"), encoding="utf-8") as f:
        assert report.markdown(summary) == f.read()
    from posemb.lab.config import SUITES

    variants, tasks = SUITES["recent"]
    assert tuple(summary["config"]["variants"]) == variants
    assert tuple(summary["config"]["tasks"]) == tasks
    for task in ("retrieval", "multikey", "vartrack"):
        r = summary[task]
        for variant, per_len in r["variants"].items():
            ctl = [e["control"] for e in per_len.values()]
            rate = sum(c["correct"] for c in ctl) / sum(c["total"] for c in ctl)
            # Pooled over lengths: 160 probes a variant, so 4 binomial standard errors.
            se = math.sqrt(r["chance"] * (1 - r["chance"]) / sum(c["total"] for c in ctl))
            assert abs(rate - r["chance"]) < 4 * se, (task, variant, rate)


def test_the_noise_verdict_covers_every_length_past_training():
    """Issue 56, bug 7: the verdict started at the second evaluation length, so with
    --train-len 32 --eval-lens 64 128 --seeds 0 1 the spreads at 64 were shown but its
    "within noise" line covered 128 only, and nothing said 64 was skipped."""

    def past(mean):
        return {"mean": mean, "std": 0.01, "n": 2, "seeds": [mean - 0.01, mean + 0.01]}

    summary = {
        "config": {"eval_lens": [64, 128], "train_len": 32},
        "results": {
            "a": {"64": {"past": past(2.0)}, "128": {"past": past(2.5)}},
            "b": {"64": {"past": past(2.001)}, "128": {"past": past(3.5)}},
        },
    }
    line = report._loss_noise(summary)
    assert "at 64: a ~ b" in line and "at 128: every neighbour differs" in line
    summary["config"] = {"eval_lens": [32, 64, 128], "train_len": 32}  # 32: not past training
    assert "at 32" not in report._loss_noise(summary)
    # Nothing past training, or one variant alone: no verdict line at all (an attack saw
    # "Within noise (...): " with nothing after it, and "every neighbour differs" for one).
    summary["config"] = {"eval_lens": [32], "train_len": 32}
    assert report._loss_noise(summary) == ""
    summary["config"] = {"eval_lens": [64, 128], "train_len": 32}
    del summary["results"]["b"]
    assert report._loss_noise(summary) == ""
