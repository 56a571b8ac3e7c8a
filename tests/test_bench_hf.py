"""`posemb bench --hf`: every method timed on every part, kernel shapes refused."""

import csv
import json

import pytest

from posemb import cli


def test_quick_hf_bench_times_every_method_on_every_part(tmp_path, capsys):
    pytest.importorskip("transformers")
    out = tmp_path / "hf.csv"
    assert cli.main(["bench", "--hf", "--quick", "--out", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == len(data["rows"])
    got = {(r["part"], r["mode"], r["method"]) for r in rows}
    for part in ("decoder layer", "model", "rotation"):
        for mode in ("forward", "forward+backward"):
            for method in ("eager", "patch_rotary", "patch_rotary fused"):
                assert (part, mode, method) in got
    for r in data["rows"]:
        assert r["median_ms"] > 0
        assert r["vs_eager"] > 0
        if r["method"] == "eager":
            assert r["vs_eager"] == pytest.approx(1.0)
        if r["part"] != "rotation":
            assert 0 < r["rotation_share"] < 1
    assert {r["setup"] for r in rows} == {"2L w128 h4/2 b2x64"}
    # What patch_rotary fused ran, and the machine in full.
    assert rows[0]["cpu_op"] != "" and rows[0]["python"] != "" and rows[0]["arch"] != ""


def test_hf_bench_refuses_kernel_shapes(capsys):
    pytest.importorskip("transformers")
    assert cli.main(["bench", "--hf", "--quick", "--shapes", "decode"]) == 2
    assert "--shapes names kernel shapes" in capsys.readouterr().err


def test_a_peers_context_is_made_afresh_for_every_step(monkeypatch):
    """On CUDA, Liger's context (a @contextmanager object, which can be entered once) was made
    once per method and entered every round: the bench crashed on its second round. Here a
    fake peer whose every context object refuses a second entry runs every round on the CPU."""
    pytest.importorskip("transformers")
    import contextlib

    from posemb.bench import hf as bench_hf

    made = []

    @contextlib.contextmanager
    def once(model):
        made.append(model)
        yield

    monkeypatch.setattr(bench_hf, "_liger", once)
    monkeypatch.setattr(bench_hf, "_available", lambda dev: ["eager", "liger"])
    rows = bench_hf.run("cpu", quick=True, repeats=3)
    assert {r.method for r in rows} == {"eager", "liger"}
    # 3 parts x 2 modes x (2 warm-ups + 3 rounds): one context made per step, none re-entered
    assert len(made) == 3 * 2 * (2 + 3)
