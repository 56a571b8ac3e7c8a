"""`posemb bench --quick` runs and writes what it promises; it measures nothing worth quoting."""

import csv
import json

import pytest
import torch

from posemb import cli


def test_quick_bench_writes_long_format_csv(tmp_path, capsys):
    out = tmp_path / "deep" / "results.csv"
    code = cli.main(["bench", "--quick", "--shapes", "decode", "--repeats", "2", "--out", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "bandwidth: x.mul_(1.0)" in text and "transformers eager" in text
    rows = list(csv.DictReader(out.open()))
    assert {r["dtype"] for r in rows} == {"fp32", "bf16"}
    assert {r["mode"] for r in rows} == {"forward", "backward", "both"}
    fused = [r for r in rows if r["method"] == "posemb cpu in-place"]
    assert fused and all(float(r["vs_bandwidth"]) > 0 for r in fused)
    for key in ("torch", "posemb", "device", "threads", "timestamp", "first_call_ms", "gbps"):
        assert rows[0][key] != ""
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".tmp")]


def test_quick_bench_json(capsys):
    assert cli.main(["bench", "--quick", "--shapes", "decode", "--repeats", "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rows"] and "cpu_kernel_load_s" in data["one_off"]


def test_bench_without_gpu_is_a_clear_error(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: this test is about machines without one")
    assert cli.main(["bench", "--device", "cuda", "--quick"]) == 2
    assert "no CUDA device is available" in capsys.readouterr().err
