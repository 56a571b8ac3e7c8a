"""The lab: corpus, config checks, resumable jobs, the quick protocol's finding."""

import dataclasses
import json
import math
import os

import pytest
import torch

from posemb import cli
from posemb.lab import corpus, report, sweep

TINY = dataclasses.replace(
    sweep.quick_config(),
    variants=("sinusoidal", "rope", "rope+ntk"),
    train_len=16,
    eval_lens=(16, 32),
    steps=20,
    width=32,
    layers=1,
    heads=2,
    batch=4,
    eval_windows=2,
    checkpoint_every=10,
    workers=1,
    tasks=("lm",),  # retrieval, entropy and the race: tests/test_lab_tasks.py
)


def test_default_corpus_is_the_kjv():
    c = corpus.load()
    assert c.name == "kjv" and len(c.ids) > 4_000_000
    text = corpus.load_text()[1]
    assert text.startswith("In the beginning God created the heaven and the earth.\n")
    assert text.count("\n") == 31102  # every verse of the KJV, one per line
    assert 2.9 < c.unigram_entropy() < 3.1


def test_corpus_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        corpus.load(tmp_path / "none.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    with pytest.raises(ValueError, match="is empty"):
        corpus.load(empty)
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(ValueError, match="is not UTF-8 text"):
        corpus.load(latin1)
    short = tmp_path / "short.txt"
    short.write_text("abc" * 100)
    with pytest.raises(ValueError, match="too short for evaluation windows of 1,026"):
        corpus.load(short, min_held_out=1026)


@pytest.mark.parametrize(
    "change,match",
    [
        ({"variants": ()}, "--variants must name at least one variant"),
        ({"variants": "rope"}, "--variants must be a sequence, got 'rope'"),
        ({"variants": ("rope", "wavelet")}, "unknown variant.* wavelet; known: learned"),
        ({"variants": ("rope", "rope")}, r"--variants must not repeat a variant, got \['rope'"),
        ({"train_len": 0}, "--train-len must be a positive integer, got 0"),
        ({"steps": 0}, "--steps must be a positive integer, got 0"),
        ({"steps": 2.5}, "--steps must be a positive integer, got 2.5"),
        ({"steps": True}, "--steps must be a positive integer, got True"),
        ({"width": 0}, "--width must be a positive integer, got 0"),
        ({"layers": 0}, "--layers must be a positive integer, got 0"),
        ({"heads": 0}, "--heads must be a positive integer, got 0"),
        ({"batch": -1}, "--batch must be a positive integer, got -1"),
        ({"eval_windows": 0}, "--eval-windows must be a positive integer, got 0"),
        ({"checkpoint_every": 0}, "--checkpoint-every must be a positive integer, got 0"),
        ({"workers": 0}, "--workers must be a positive integer, got 0"),
        ({"width": 30}, "width 30 must split into 2 heads of even size"),
        ({"width": 34}, "width 34 must split into 2 heads of even size"),
        ({"eval_lens": ()}, r"--eval-lens must be one or more integers in increasing order"),
        ({"eval_lens": (32, 16)}, r"increasing order, got \[32, 16\]"),
        ({"eval_lens": (16, 16, 32)}, r"increasing order, got \[16, 16, 32\]"),
        ({"eval_lens": (16, 32.0)}, r"increasing order, got \[16, 32.0\]"),
        ({"eval_lens": (8, 32)}, "--eval-lens must be >= --train-len 16"),
        ({"seeds": ()}, r"--seeds must be one or more non-negative integers, got \[\]"),
        ({"seeds": (-1,)}, r"non-negative integers, got \[-1\]"),
        ({"seeds": (0, 0.5)}, r"non-negative integers, got \[0, 0.5\]"),
        ({"seeds": (0, 1, 0)}, r"--seeds must not repeat a seed, got \[0, 1, 0\]"),
        ({"lr": -1}, "--lr must be a finite number > 0, got -1"),
        ({"lr": 0.0}, "--lr must be a finite number > 0, got 0.0"),
        ({"lr": float("nan")}, "--lr must be a finite number > 0, got nan"),
        ({"lr": float("inf")}, "--lr must be a finite number > 0, got inf"),
        ({"lr": True}, "--lr must be a finite number > 0, got True"),
        ({"lr": "1e-3"}, "--lr must be a finite number > 0, got '1e-3'"),
        ({"corpus": ""}, "--corpus must be 'kjv' or a path to a UTF-8 text file, got ''"),
        ({"corpus": None}, "--corpus must be 'kjv' or a path .* got None"),
        ({"finetune_steps": -1}, "--finetune-steps must be an integer >= 0, got -1"),
        ({"finetune_steps": 5, "finetune_len": 16}, "--finetune-len must exceed --train-len 16"),
        ({"finetune_steps": 5}, "--finetune-len must exceed --train-len 16.* got None"),
        ({"finetune_steps": 5, "finetune_len": 32.0}, "--finetune-len must be an integer or"),
        ({"finetune_len": 32}, "--finetune-len 32 needs --finetune-steps > 0"),
    ],
)
def test_config_errors(change, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(TINY, **change)


def test_config_sequences_become_tuples_and_defaults_are_valid():
    cfg = dataclasses.replace(TINY, eval_lens=[16, 64], seeds=[2, 1], variants=["rope"])
    assert cfg.eval_lens == (16, 64) and cfg.seeds == (2, 1) and cfg.variants == ("rope",)
    assert cfg == dataclasses.replace(TINY, eval_lens=(16, 64), seeds=(2, 1), variants=("rope",))
    sweep.LabConfig()  # the default protocol and the quick one construct
    sweep.quick_config()


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


def test_interrupted_job_resumes_to_the_same_numbers(tmp_path, monkeypatch):
    whole = sweep.run_job(TINY, "rope", 0, str(tmp_path / "a"), quiet=True)
    # Crash at step 15: the step-10 checkpoint survives, no result is written.
    calls = {"n": 0}
    real_step = torch.optim.AdamW.step

    def crashing(self, *a, **k):
        calls["n"] += 1
        if calls["n"] > 15:
            raise KeyboardInterrupt
        return real_step(self, *a, **k)

    monkeypatch.setattr(torch.optim.AdamW, "step", crashing)
    with pytest.raises(KeyboardInterrupt):
        sweep.run_job(TINY, "rope", 0, str(tmp_path / "b"), quiet=True)
    ckpt, result = sweep.job_paths(str(tmp_path / "b"), "rope", 0)
    assert os.path.exists(ckpt) and not os.path.exists(result)
    assert torch.load(ckpt, weights_only=True)["step"] == 10
    monkeypatch.setattr(torch.optim.AdamW, "step", real_step)
    resumed = sweep.run_job(TINY, "rope", 0, str(tmp_path / "b"), quiet=True)
    assert resumed["variants"] == whole["variants"]
    # A crash after training, before the result: the final checkpoint is reused, no step rerun.
    os.unlink(result)
    again = sweep.run_job(TINY, "rope", 0, str(tmp_path / "b"), quiet=True)
    assert again["variants"] == whole["variants"]
    # A finished job is not run again.
    mtime = os.path.getmtime(result)
    assert sweep.run_job(TINY, "rope", 0, str(tmp_path / "b"), quiet=True) == again
    assert os.path.getmtime(result) == mtime


def test_mismatched_or_corrupt_checkpoints_are_refused(tmp_path):
    out = str(tmp_path)
    sweep.run_job(TINY, "sinusoidal", 0, out, quiet=True)
    ckpt, result = sweep.job_paths(out, "sinusoidal", 0)
    os.unlink(result)
    with pytest.raises(ValueError, match="was made with other settings"):
        sweep.run_job(dataclasses.replace(TINY, lr=1e-3), "sinusoidal", 0, out, quiet=True)
    with open(ckpt, "wb") as f:
        f.write(b"not a checkpoint")
    with pytest.raises(ValueError, match="cannot be read"):
        sweep.run_job(TINY, "sinusoidal", 0, out, quiet=True)


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
