"""`posemb bench`: the kernel harness writes its long-format CSV and JSON."""

import csv
import json

import pytest
import torch

from posemb import cli


def test_quick_bench_writes_long_format_csv_and_json(tmp_path, capsys):
    out = tmp_path / "deep" / "results.csv"
    argv = ["bench", "--quick", "--shapes", "decode", "--repeats", "2", "--out", str(out)]
    assert cli.main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "cpu_kernel_load_s" in data["one_off"]
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == len(data["rows"])
    assert {r["dtype"] for r in rows} == {"fp32", "bf16"}
    assert {r["mode"] for r in rows} == {"forward", "backward", "both"}
    methods = {r["method"] for r in rows}
    assert {"bandwidth: x.mul_(1.0)", "transformers eager", "posemb cpu in-place"} <= methods
    # Bandwidth ratios come from runs paired with the reference (the median of per-pair
    # ratios), so they need not equal the ratio of the rows' medians; HF ratios are row for row.
    by = {(r["dtype"], r["mode"], r["method"]): r for r in rows if r["shape_name"] == "decode"}
    for dtype in ("fp32", "bf16"):
        fused = by[(dtype, "forward", "posemb cpu in-place")]
        assert 0 < float(fused["vs_bandwidth"]) < float("inf")
        assert float(by[(dtype, "forward", "posemb cpu")]["vs_bandwidth"]) > 0
        eager = by[(dtype, "forward", "transformers eager")]
        want = float(eager["median_ms"]) / float(fused["median_ms"])
        assert float(fused["vs_hf_eager"]) == pytest.approx(want, rel=1e-9)
    # The decode-step rows: a 32-layer step per method, against transformers in the same run.
    steps = [r for r in rows if r["shape_name"].startswith("decode-32L")]
    assert {r["method"] for r in steps} >= {"posemb module, shared", "transformers eager"}
    assert all(r["vs_hf_eager"] for r in steps)
    assert "torch.compile reference" in methods
    for key in ("torch", "posemb", "device", "threads", "timestamp", "first_call_ms", "gbps"):
        assert rows[0][key] != ""
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".tmp")]


def test_bench_without_gpu_is_a_clear_error(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: this test is about machines without one")
    assert cli.main(["bench", "--device", "cuda", "--quick"]) == 2
    assert "no CUDA device is available" in capsys.readouterr().err
