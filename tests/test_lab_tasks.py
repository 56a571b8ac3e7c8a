"""The lab's tasks run in a sweep: the ``--quick`` protocol's directions for retrieval, entropy
and the fine-tuning race (which must hold even at that size), the protocol file, bad input."""

import dataclasses
import json
import math
import os
import shutil

import pytest

from posemb import cli
from posemb import scaling as sc
from posemb.lab import race, report, sweep

QUICK_TASKS = sweep.quick_config(
    variants=("nope", "rope", "rope+pi", "rope+ntk", "rope+dynamic"),
    workers=2,
    # LabConfig's own default (the quick preset cuts it), for the test of a folder written
    # before the setting existed: such a folder resumes only where the setting keeps it.
    flipflop_steps=sweep.LabConfig().flipflop_steps,
)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("lab") / "quick")
    return out, sweep.run(QUICK_TASKS, out, quiet=True)


def test_quick_retrieval_is_learned_at_1x_and_chance_without_the_fact(quick):
    _, s = quick
    r = s["retrieval"]
    for variant, per_len in r["variants"].items():
        # The model was never shown the queried fact in these windows: it can only guess.
        ctl = report.accuracy([e["control"] for e in per_len.values()])
        assert ctl["correct"] / ctl["total"] <= r["chance"] + 3 * math.sqrt(
            r["chance"] * (1 - r["chance"]) / ctl["total"]
        ), variant
    for variant in ("nope", "rope"):
        at_1x = r["variants"][variant]["32"]["anywhere"]["mean"]
        assert at_1x > 3 * r["chance"], (variant, at_1x)


def test_quick_entropy_grows_with_length_and_the_factor_lowers_it(quick):
    _, s = quick
    e = s["entropy"]["variants"]
    lens = s["config"]["eval_lens"]
    for variant in ("nope", "rope"):
        off = [e[variant]["off"][str(n)]["mean"]["mean"] for n in lens]
        assert off == sorted(off) and off[-1] > off[0] + 0.2, (variant, off)
        for n in lens[1:]:
            # A temperature > 1 on the logits sharpens every row of the first layer.
            assert (
                e[variant]["on"][str(n)]["layers"][0]["mean"]
                < e[variant]["off"][str(n)]["layers"][0]["mean"]
            )
    assert set(e) == {"nope", "rope", "rope+pi", "rope+ntk", "rope+dynamic"}


def test_quick_race_starts_where_inference_time_scaling_is_and_pi_recovers(quick):
    _, s = quick
    rc = s["race"]
    n = str(rc["race_len"])
    assert rc["runs"] == 2 and set(rc["entrants"]) == {"rope", "rope+pi", "rope+yarn"}
    first, last = str(rc["steps"][0]), str(rc["steps"][-1])
    # N = 0 is the trained model under the schedule: the sweep's own rope+pi number.
    pi = rc["entrants"]["rope+pi"]
    assert pi[first]["loss_past"][n]["mean"] == pytest.approx(
        s["results"]["rope+pi"][n]["past"]["mean"], rel=1e-6
    )
    # Both race seeds start from the same model: one independent unit (the model seed), so
    # the spread is unknown, not zero.
    assert pi[first]["loss_past"][n]["std"] is None and pi[first]["loss_past"][n]["runs"] == 2
    # Position interpolation without fine-tuning is far off; a few steps recover most of it.
    assert pi[last]["loss_past"][n]["mean"] < pi[first]["loss_past"][n]["mean"] - 0.1


def test_quick_report_names_coinciding_lines_and_writes_every_plot(quick):
    out, s = quick
    assert ["rope+ntk", "rope+dynamic"] in s["coincide"]
    with open(os.path.join(out, "results.md"), encoding="utf-8") as f:
        md = f.read()
    assert "rope+ntk and rope+dynamic give the same loss at every length" in md
    assert "Retrieval accuracy" in md and "Attention entropy" in md and "fine-tuning race" in md
    names = {os.path.basename(p) for p in s["plots"]}
    assert names == {
        "loss_vs_length.png",
        "loss_vs_position.png",
        "retrieval.png",
        "entropy.png",
        "race.png",
    }


def test_a_finished_race_is_read_back_and_a_resumed_one_gives_the_same_numbers(quick):
    out, _ = quick
    job = ("race", "rope+pi", 0, 1)
    again = sweep._run_one(QUICK_TASKS, job, out)
    ckpt, result = sweep.job_paths(out, "rope+pi", 0, "race", 1)
    os.remove(result)  # the checkpoint holds every milestone: nothing is trained again
    assert sweep._run_one(QUICK_TASKS, job, out)["milestones"] == again["milestones"]
    assert os.path.exists(ckpt)


def test_another_protocols_out_is_refused_before_anything_is_written(quick, capsys):
    out, _ = quick
    before = sorted(os.walk(out))
    stamps = {f: os.path.getmtime(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs}
    with pytest.raises(ValueError, match=r"holds results of another protocol .*steps 300 != 200"):
        sweep.run(dataclasses.replace(QUICK_TASKS, steps=200), out, quiet=True)
    code = cli.main(["lab", "--quick", "--steps", "200", "--out", out])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "another protocol" in err[0]
    assert sorted(os.walk(out)) == before
    assert stamps == {
        f: os.path.getmtime(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs
    }
    # Fewer trained encodings is the same protocol: their jobs are reused, not refused; another
    # set of scalings is the same trained rope model, evaluated again (not refused either).
    fewer = ("rope", "rope+pi", "rope+ntk", "rope+dynamic")
    sweep.preflight(dataclasses.replace(QUICK_TASKS, variants=fewer), out)
    sweep.preflight(dataclasses.replace(QUICK_TASKS, variants=("rope",)), out)


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--tasks", "lm", "qa"], "--tasks must name one or more of lm, retrieval, entropy, race"),
        (["--variants", "rope+longrope"], "unknown variant"),
        (["--eval-lens", "16", "64"], "--eval-lens must be >= --train-len 32"),
        (["--race-len", "32"], "--race-len must be an integer above --train-len 32"),
        (
            ["--race-steps", "20", "0"],
            "--race-steps must be one or more integers >= 0 in increasing order",
        ),
        (["--race-seeds", "1", "1"], "--race-seeds must be one or more distinct"),
    ],
)
def test_bad_lab_input_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, argv, match):
    out = tmp_path / "out"
    assert cli.main(["lab", "--quick", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match.split(" .*")[0] in err[0], err
    assert not out.exists()


def test_a_corpus_too_small_for_the_windows_is_refused(tmp_path, capsys):
    small = tmp_path / "small.txt"
    small.write_text("in the beginning " * 20)
    out = tmp_path / "out"
    assert cli.main(["lab", "--quick", "--corpus", str(small), "--out", str(out)]) == 2
    assert "too short for evaluation windows" in capsys.readouterr().err
    assert not out.exists()


def test_race_entrants_and_schedules():
    assert race.schedule("rope", 64, 256) is None
    assert race.schedule("rope+llama3", 64, 256) == sc.Llama3(4.0, 1.0, 4.0, 64)
    with pytest.raises(ValueError, match="unknown race entrant 'rope\\+xl'"):
        race.schedule("rope+xl", 64, 256)


def test_protocol_is_json_and_leaves_out_what_only_picks_jobs():
    p = sweep.LabConfig().protocol()
    assert json.loads(json.dumps(p)) == p
    assert not {"variants", "seeds", "tasks", "workers", "race_seeds", "race_entrants"} & set(p)
    # Adding a scaling changes only the rope jobs' digests.
    a, b = sweep.LabConfig(), sweep.LabConfig(variants=("rope", "alibi"))
    assert a.digest("alibi", 0) == b.digest("alibi", 0)
    assert a.digest("rope", 0) != b.digest("rope", 0)
    assert a.digest("rope", 0, "race", 0) != a.digest("rope", 0, "race", 1)


def test_a_folder_written_before_a_setting_existed_resumes_while_it_keeps_its_default(
    quick, tmp_path
):
    out, _ = quick
    old = str(tmp_path / "old")
    shutil.copytree(out, old)
    path = os.path.join(old, "protocol.json")
    with open(path, encoding="utf-8") as f:
        protocol = json.load(f)
    del protocol["flipflop_steps"]  # as posemb wrote it before the flipflop task
    with open(path, "w", encoding="utf-8") as f:
        json.dump(protocol, f)
    # force: the edit above is not the lab's own; what is checked is the protocol.
    sweep.preflight(QUICK_TASKS, old, force=True)
    other = dataclasses.replace(QUICK_TASKS, flipflop_steps=QUICK_TASKS.flipflop_steps + 1)
    with pytest.raises(ValueError, match=r"another protocol \(flipflop_steps None != "):
        sweep.preflight(other, old, force=True)
