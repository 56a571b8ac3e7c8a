"""`posemb lab`: the sweep writes its reports, workers and ranks agree, and the quick protocol
finds what it claims."""

import dataclasses
import json
import math
import os
import re

import pytest
import torch

from lab_configs import TINY, crash_after
from posemb import cli
from posemb._errors import InputError
from posemb.lab import report, sweep


def test_cli_errors_are_one_line_and_write_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    for args, match in (
        (["--steps", "0"], "--steps must be a positive integer"),
        (["--variants", "rope", "nonsense"], "unknown variant"),
        (["--train-len", "64", "--eval-lens", "32"], "--eval-lens must be >= --train-len"),
        (["--corpus", str(tmp_path / "missing.txt")], "does not exist"),
    ):
        assert cli.main(["lab", "--quick", "--out", str(out), *args]) == 2
        err = capsys.readouterr().err
        assert match in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_sweep_writes_reports_and_workers_agree(tmp_path):
    one = sweep.run(TINY, str(tmp_path / "one"), quiet=True)
    two = sweep.run(dataclasses.replace(TINY, workers=2), str(tmp_path / "two"), quiet=True)
    # One 2-thread process and two 1-thread workers sum in different orders: equal to rounding.
    for variant, per_len in one["results"].items():
        for n, entry in per_len.items():
            other = two["results"][variant][n]
            assert entry["all"]["mean"] == pytest.approx(other["all"]["mean"], rel=1e-4)
    data = json.loads((tmp_path / "one" / "results.json").read_text())
    assert set(data["results"]) == {"sinusoidal", "rope", "rope+ntk"}
    # "past" is the mean over positions train_len.. of the curve (stored rounded to 1e-4), and
    # a model trained for 20 steps beats guessing uniformly over the vocabulary.
    rope = data["results"]["rope"]["32"]
    curve = rope["curve"]
    assert rope["past"]["mean"] == pytest.approx(sum(curve[16:]) / 16, abs=1e-4)
    assert rope["past"]["mean"] != pytest.approx(sum(curve[:16]) / 16, abs=1e-3)
    assert 0 < rope["past"]["mean"] < math.log(data["corpus"]["vocab"])
    assert "past" not in data["results"]["rope"]["16"]  # no position past 16 in 16 tokens
    md = (tmp_path / "one" / "results.md").read_text()
    assert "| rope+ntk |" in md and md == report.markdown(data)


def test_quick_protocol_sinusoidal_collapses_past_training_length_alibi_does_not(tmp_path):
    summary = sweep.run(sweep.quick_config(tasks=("lm",)), str(tmp_path), quiet=True)
    longest = str(max(sweep.quick_config().eval_lens))
    past = {v: summary["results"][v][longest]["past"]["mean"] for v in ("sinusoidal", "alibi")}
    assert past["sinusoidal"] > past["alibi"], past


def test_quick_runs_every_task_of_the_recent_suite(tmp_path, capsys):
    """--quick with any task of the suites: each sized to the 32-token window (vartrack's
    default 8 chains need 56 positions, and the run once exited 2 naming no flag)."""
    from posemb.lab.config import SUITES

    tasks = SUITES["recent"][1]
    short = ["--steps", "3", "--retrieval-steps", "3", "--multikey-steps", "3"]
    short += ["--vartrack-steps", "3", "--flipflop-steps", "3"]
    argv = ["lab", "--quick", "--variants", "rope", "--tasks", *tasks, *short]
    assert cli.main([*argv, "--out", str(tmp_path / "q")]) == 0
    data = json.loads((tmp_path / "q" / "results.json").read_text())
    for task in ("multikey", "vartrack", "flipflop", "retrieval"):
        assert task in json.dumps(data), task
    capsys.readouterr()
    # Sizes a window cannot hold are refused naming the flags that set them.
    argv = [*argv, "--vartrack-chains", "5", "--out", str(tmp_path / "r")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--vartrack-chains 5 with --vartrack-hops 1 need 35 positions" in err
    assert not (tmp_path / "r").exists()


def test_finetune_adds_a_position_interpolation_variant(tmp_path):
    cfg = dataclasses.replace(TINY, variants=("rope+pi",), finetune_len=32, finetune_steps=5)
    summary = sweep.run(cfg, str(tmp_path), quiet=True)
    assert set(summary["results"]) == {"rope+pi", "rope+pi+ft"}
    # The fine-tune changed the weights (other numbers than rope+pi at the same scaling s = 2)
    # and left a model that still beats guessing uniformly over the vocabulary.
    ft = summary["results"]["rope+pi+ft"]["32"]["past"]["mean"]
    assert ft != pytest.approx(summary["results"]["rope+pi"]["32"]["past"]["mean"], abs=1e-4)
    assert 0 < ft < math.log(summary["corpus"]["vocab"])


def _rank_main(rank, world, port, out, queue):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world)
    )
    torch.set_num_threads(1)
    summary = sweep.run(dataclasses.replace(TINY, workers=1), out, quiet=True)
    queue.put((rank, None if summary is None else summary["results"]))
    import torch.distributed as dist

    dist.destroy_process_group()


def test_two_gloo_ranks_agree_with_one_process(tmp_path):
    import socket

    import torch.multiprocessing as tmp_mp

    with socket.socket() as sock:  # a free loopback port for the rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = tmp_mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_rank_main, args=(r, 2, port, str(tmp_path / "dist"), queue))
        for r in range(2)
    ]
    for p in procs:
        p.start()
    got = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert got[1] is None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the ranks ran 1 thread each: sum in the same order
    try:
        single = sweep.run(dataclasses.replace(TINY, workers=1), str(tmp_path / "one"), quiet=True)
    finally:
        torch.set_num_threads(threads)
    for variant, per_len in single["results"].items():
        for n, entry in per_len.items():
            assert entry["all"]["mean"] == pytest.approx(
                got[0][variant][n]["all"]["mean"], rel=1e-5
            )


# --- misuse: folders, corpora, resumes and reports that must not mislead (issue 29) ----------


def _files(root):
    return {
        os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), "rb").read()
        for d, _, fs in os.walk(root)
        for f in fs
    }


def test_a_folder_with_the_users_results_and_no_protocol_is_refused(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "results.md").write_text("my results")
    (out / "results.json").write_text('{"mine": true}')
    before = _files(out)
    assert cli.main(["lab", "--quick", "--tasks", "lm", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did not write (results.json, results.md)" in err[0]
    assert _files(out) == before
    # --force writes beside a user's files but never over them: these stand where the lab
    # writes its report, so it is refused before any training.
    assert cli.main(["lab", "--quick", "--tasks", "lm", "--out", str(out), "--force"]) == 2
    assert "never replaces them" in capsys.readouterr().err
    assert _files(out) == before


def test_a_users_file_added_to_a_lab_folder_is_refused_then_kept_with_force(tmp_path, capsys):
    out = tmp_path / "lab"
    sweep.run(TINY, str(out), quiet=True)
    (out / "notes.txt").write_text("what I saw")
    with pytest.raises(ValueError, match=r"did not write \(notes\.txt\)"):
        sweep.run(TINY, str(out), quiet=True)
    sweep.run(TINY, str(out), quiet=True, force=True)
    assert (out / "notes.txt").read_text() == "what I saw"
    # An edit of the lab's own report is the user's now: refused, not overwritten.
    (out / "results.md").write_text("annotated")
    with pytest.raises(ValueError, match=r"changed since posemb lab wrote them \(results\.md\)"):
        sweep.preflight(TINY, str(out))


def _corpus(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(120))


def test_the_corpus_is_its_content_not_its_path(tmp_path, monkeypatch):
    c = tmp_path / "c.txt"
    cfg = dataclasses.replace(TINY, corpus=_corpus(c, TEXT))
    out = str(tmp_path / "out")
    sweep.run(cfg, out, quiet=True)
    # The same path with another text: refused (it kept the old losses beside a new entropy).
    lines = TEXT.splitlines(keepends=True)
    _corpus(c, "".join(reversed(lines)))
    with pytest.raises(ValueError, match="corpus_sha256"):
        sweep.run(cfg, out, quiet=True)
    # A relative path from another folder naming another text: refused too.
    other = tmp_path / "elsewhere"
    other.mkdir()
    _corpus(other / "c.txt", TEXT.upper())
    monkeypatch.chdir(other)
    with pytest.raises(ValueError, match="corpus_sha256"):
        sweep.run(dataclasses.replace(TINY, corpus="c.txt"), out, quiet=True)
    # The same text under another name is the same corpus: every job is reused.
    _corpus(other / "copy.txt", TEXT)
    stamps = {p: os.path.getmtime(os.path.join(out, p)) for p in _files(out) if "runs/" in p}
    sweep.run(dataclasses.replace(TINY, corpus="copy.txt"), out, quiet=True)
    assert stamps == {p: os.path.getmtime(os.path.join(out, p)) for p in stamps}


def test_a_checkpoint_of_another_text_is_refused_before_training_on_it(tmp_path, monkeypatch):
    c = tmp_path / "c.txt"
    cfg = dataclasses.replace(TINY, corpus=_corpus(c, TEXT))
    out = str(tmp_path / "out")
    crash_after(monkeypatch, 15, lambda: sweep.run_job(cfg, "rope", 0, out, quiet=True))
    _corpus(c, "".join(sorted(TEXT.splitlines(keepends=True))))  # shuffled lines
    with pytest.raises(ValueError, match=r"was made with other settings \(corpus "):
        sweep.run_job(cfg, "rope", 0, out, quiet=True)
    _corpus(c, TEXT.replace("o", "\u00f8"))  # another character set: was a load_state_dict error
    with pytest.raises(ValueError, match=r"was made with other settings \(corpus "):
        sweep.run_job(cfg, "rope", 0, out, quiet=True)


def test_a_killed_randomized_job_resumes_to_the_same_result(tmp_path, monkeypatch):
    cfg = dataclasses.replace(TINY, variants=("randomized",))
    whole = sweep.run_job(cfg, "randomized", 0, str(tmp_path / "a"), quiet=True)
    out = str(tmp_path / "b")
    crash_after(monkeypatch, 15, lambda: sweep.run_job(cfg, "randomized", 0, out, quiet=True))
    torch.manual_seed(12345)  # whatever else the process drew in between
    torch.rand(1000)
    resumed = sweep.run_job(cfg, "randomized", 0, out, quiet=True)
    assert resumed["final_train_loss"] == whole["final_train_loss"]
    assert resumed["variants"] == whole["variants"]


def test_a_resumed_report_says_how_it_ran(tmp_path):
    out = str(tmp_path / "out")
    sweep.run(TINY, out, quiet=True)
    second = sweep.run(dataclasses.replace(TINY, workers=2), out, quiet=True)
    runs = second["invocations"]
    assert len(runs) == 2 and [p["workers"] for p in runs[0]["phases"]] == [1]
    assert runs[1]["phases"][0]["jobs"] == 2  # sinusoidal and rope, both read back
    md = (tmp_path / "out" / "results.md").read_text()
    assert "over 2 invocations (resumed 1 time(s)" in md
    assert f"{os.cpu_count()} cores" in md and second["machine"]["cpu"] in md
    assert json.loads((tmp_path / "out" / "invocations.json").read_text()) == runs


@pytest.mark.parametrize("bad", [b"null", b"[]", b"[1]", b"\x8b\xff\x00garbage"])
@pytest.mark.parametrize("name", ["runs/rope-seed0.json", "protocol.json"])
def test_unreadable_result_and_protocol_files_are_refused_by_name(tmp_path, bad, name):
    out = tmp_path / "out"
    sweep.run(TINY, str(out), quiet=True)
    (out / name).write_bytes(bad)
    # posemb's own error (the CLI's one line), not a TypeError or a UnicodeDecodeError.
    with pytest.raises(InputError, match="changed since posemb lab wrote them"):
        sweep.run(TINY, str(out), quiet=True)
    with pytest.raises(InputError, match=re.escape(name.split("/")[-1])):
        sweep.run(TINY, str(out), quiet=True, force=True)


@pytest.mark.parametrize("where", ["/proc/posemb-lab", "a-file/child"])
def test_an_unwritable_out_is_refused_before_training(tmp_path, capsys, where):
    (tmp_path / "a-file").write_text("x")
    out = where if where.startswith("/") else str(tmp_path / where)
    assert cli.main(["lab", "--quick", "--tasks", "lm", "--out", out]) == 2
    assert "cannot be written" in capsys.readouterr().err


def test_a_finetune_longer_than_the_corpus_is_refused_before_training(tmp_path, capsys):
    c = _corpus(tmp_path / "c.txt", TEXT[:3000])
    argv = ["lab", "--quick", "--tasks", "lm", "--corpus", c, "--out", str(tmp_path / "o")]
    argv += ["--eval-lens", "32", "64", "--finetune-len", "4000", "--finetune-steps", "5"]
    assert cli.main(argv) == 2
    assert "too few for --finetune-len 4000" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


TINY_RACE = dataclasses.replace(
    TINY,
    variants=("rope",),
    tasks=("lm", "race"),
    retrieval_steps=10,
    retrieval_width=16,
    retrieval_probes=8,
    race_len=32,
    race_steps=(0, 2),
    race_seeds=(0,),
    race_entrants=("rope", "rope+pi"),
)


def test_deleted_job_files_are_made_again(tmp_path):
    out = tmp_path / "out"
    first = sweep.run(TINY_RACE, str(out), quiet=True)
    os.unlink(out / "checkpoints" / "rope-seed0.pt")
    os.unlink(out / "runs" / "race-rope+pi-seed0-race0.json")
    again = sweep.run(TINY_RACE, str(out), quiet=True)  # was: "run its job first", forever
    assert again["race"] == first["race"] and again["results"] == first["results"]


def test_adding_a_variant_or_a_task_reevaluates_without_training_and_stale_plots_go(tmp_path):
    out = tmp_path / "out"
    sweep.run(TINY_RACE, str(out), quiet=True)
    assert (out / "race.png").exists()
    ckpt = out / "checkpoints" / "rope-seed0.pt"
    stamp = os.path.getmtime(ckpt)
    more = dataclasses.replace(TINY_RACE, variants=("rope", "rope+ntk"), tasks=("lm", "entropy"))
    summary = sweep.run(more, str(out), quiet=True)
    assert "rope+ntk" in summary["results"] and summary["entropy"]
    assert os.path.getmtime(ckpt) == stamp  # the trained model was reused, not retrained
    assert not (out / "race.png").exists()  # the race was dropped: its plot with it
    assert (out / "checkpoints" / "race-rope-seed0-race0.pt").exists()  # job files are kept


def test_a_race_without_the_retrieval_task_reports_without_crashing(tmp_path):
    cfg = dataclasses.replace(TINY_RACE, variants=("sinusoidal",), tasks=("race",))
    summary = sweep.run(cfg, str(tmp_path / "out"), quiet=True)  # crashed in _retrieval_md
    assert summary["retrieval"] is None and summary["race"]
    assert "fine-tuning race" in (tmp_path / "out" / "results.md").read_text()


def test_a_killed_then_resumed_sweep_counts_the_killed_invocation(tmp_path, monkeypatch):
    out = str(tmp_path / "out")
    crash_after(monkeypatch, 25, lambda: sweep.run(TINY, out, quiet=True))  # mid second job
    summary = sweep.run(TINY, out, quiet=True)
    first, second = summary["invocations"]
    assert first["interrupted"] and first["wall_seconds"] > 0 and first["phases"] == []
    assert not second.get("interrupted") and len(second["phases"]) == 1
    md = (tmp_path / "out" / "results.md").read_text()
    assert "over 2 invocations (resumed 1 time(s), 1 after it was interrupted" in md
    # A job's training time covers every invocation that trained it, not only the last.
    resumed = json.loads((tmp_path / "out" / "runs" / "sinusoidal-seed0.json").read_text())
    ckpt = torch.load(tmp_path / "out" / "checkpoints" / "sinusoidal-seed0.pt", weights_only=True)
    assert resumed["train_seconds"] == pytest.approx(ckpt["seconds"], rel=0.2)


def test_force_writes_beside_a_users_file_in_a_folder_without_a_manifest(tmp_path):
    # Was refused ("claim the folder first") by the writes after --force's claim passed.
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    sweep.run(TINY, str(out), quiet=True, force=True)
    assert (out / "notes.txt").read_text() == "mine" and (out / "results.md").exists()


def test_an_earlier_labs_folder_is_taken_over_but_never_a_users_files_in_it(tmp_path, capsys):
    out = tmp_path / "old"
    sweep.run(TINY, str(out), quiet=True)
    os.unlink(out / ".posemb-owned.json")  # as a posemb before manifests left it
    (out / "my_plot.png").write_text("my plot")
    (out / "runs" / "my-notes.json").write_text("{}")
    with pytest.raises(InputError, match=r"did not write \(my_plot\.png, runs/my-notes\.json"):
        sweep.run(TINY, str(out), quiet=True)
    assert not (out / ".posemb-owned.json").exists()  # a refusal writes nothing
    os.unlink(out / "my_plot.png")
    os.unlink(out / "runs" / "my-notes.json")
    sweep.run(TINY, str(out), quiet=True)  # only the lab's own files: taken over
    assert "results.md" in json.loads((out / ".posemb-owned.json").read_text())["files"]


def test_a_killed_randomized_retrieval_job_resumes_to_the_same_result(tmp_path, monkeypatch):
    cfg = dataclasses.replace(
        TINY_RACE, variants=("randomized",), tasks=("retrieval",), retrieval_steps=20
    )
    whole = sweep.run_retrieval_job(cfg, "randomized", 0, str(tmp_path / "a"), quiet=True)
    out = str(tmp_path / "b")
    crash_after(
        monkeypatch, 15, lambda: sweep.run_retrieval_job(cfg, "randomized", 0, out, quiet=True)
    )
    torch.manual_seed(999)
    resumed = sweep.run_retrieval_job(cfg, "randomized", 0, out, quiet=True)
    assert resumed["final_train_loss"] == whole["final_train_loss"]
    assert resumed["variants"] == whole["variants"]


def test_deleting_checkpoints_after_a_finished_race_retrains_nothing(tmp_path):
    out = tmp_path / "out"
    sweep.run(TINY_RACE, str(out), quiet=True)
    for ckpt in (out / "checkpoints").iterdir():
        ckpt.unlink()
    again = sweep.run(TINY_RACE, str(out), quiet=True)
    assert not any((out / "checkpoints").iterdir())  # nothing needed them: none came back
    assert again["invocations"][-1]["phases"][0]["jobs"] == 2


def test_a_second_lab_run_into_a_running_folder_is_refused(tmp_path):
    from posemb._owned import OwnedFolder
    from posemb.lab.checkpoints import COMMAND

    out = tmp_path / "out"
    held = OwnedFolder(out, COMMAND).running()  # as a posemb lab running there holds it
    with held, pytest.raises(InputError, match="being written by another posemb lab run"):
        sweep.run(TINY, str(out), quiet=True)
    assert not (out / "protocol.json").exists()


def test_the_race_scores_at_lengths_eval_lens_does_not_list(tmp_path):
    """Issue 56, bug 5: the race scores at --race-len and twice it, but held-out windows were
    drawn only at the listed --eval-lens, so it died after all the training with a bare
    KeyError (the settings check had accepted it). Its lengths are drawn as well now."""
    lens = TINY_RACE.eval_lens
    cfg = dataclasses.replace(
        TINY_RACE, variants=("sinusoidal",), tasks=("race",), eval_lens=(lens[0], lens[-1] * 4)
    )
    assert not set(cfg.race_eval_lens()) <= set(cfg.eval_lens)
    summary = sweep.run(cfg, str(tmp_path / "out"), quiet=True)
    assert summary["race"]
