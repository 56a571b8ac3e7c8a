"""`posemb lab`: the sweep writes its reports, workers and ranks agree, and the quick protocol
finds what it claims."""

import dataclasses
import json
import math
import os

import pytest
import torch

from lab_configs import TINY
from posemb import cli
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
