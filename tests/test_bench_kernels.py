"""`posemb bench`: the kernel harness writes its long-format CSV and JSON."""

import csv
import json
import pathlib

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
    assert "torch.compile reference" in methods
    for key in ("torch", "posemb", "device", "threads", "timestamp", "first_call_ms", "gbps",
                "python", "arch", "rotary_embedding_torch", "cpu_op"):  # fmt: skip
        assert rows[0][key] != "", key
    if "model name" in pathlib.Path("/proc/cpuinfo").read_text(errors="replace"):
        assert rows[0]["device_name"] != rows[0]["arch"]  # the CPU's model, not "x86_64"
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".tmp")]


def test_bench_without_gpu_is_a_clear_error(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: this test is about machines without one")
    assert cli.main(["bench", "--device", "cuda", "--quick"]) == 2
    assert "no CUDA device is available" in capsys.readouterr().err


def test_the_machine_line_names_cpu_python_libraries_and_what_is_absent(monkeypatch):
    import platform

    from posemb.bench import kernels as bench

    monkeypatch.setattr(bench, "_version", lambda d: None if d == "flash-attn" else "1.2")
    m = bench.machine(torch.device("cpu"))
    assert m["python"] == platform.python_version() and m["arch"] == platform.machine()
    assert m["absent"] == "flash-attn" and m["flash_attn"] is None
    assert m["rotary_embedding_torch"] == "1.2"
    line = bench.describe_machine(bench.Row("s", "1", "fp32", "forward", "m", 1, 1, 1, None,
                                            None, None, 1, **m))  # fmt: skip
    assert f"Python {platform.python_version()}" in line and "rotary-embedding-torch 1.2" in line
    assert line.count("flash-attn") == 1 and "not installed: flash-attn" in line
    assert bench.cpu_model() in line


def test_an_earlier_bench_csv_is_still_recognised_as_ours():
    """--out overwrites only a bench CSV: one written before the machine's columns counts."""
    from posemb.bench import hf as bench_hf
    from posemb.bench.kernels import MACHINE_FIELDS, Row
    from posemb.bench.outputs import is_bench_csv

    fields = list(Row.__dataclass_fields__)
    assert fields[-1] == "host_ms"  # the newest column, added at the end
    before_host = fields[:-1]
    assert is_bench_csv((",".join(before_host) + "\n1,2\n").encode())
    old = [f for f in before_host if f not in MACHINE_FIELDS]
    assert is_bench_csv((",".join(old) + "\n1,2\n").encode())
    # Never written: the machine's columns missing but the host time there.
    assert not is_bench_csv(",".join(f for f in fields if f not in MACHINE_FIELDS).encode())
    old_hf = [f for f in bench_hf.HFRow.__dataclass_fields__
              if f not in (*MACHINE_FIELDS, "cpu_op", "triton")]  # fmt: skip
    assert old_hf[-1] == "timestamp"
    assert is_bench_csv(",".join(old_hf).encode())
    assert not is_bench_csv(b"name,value\n")


def test_the_old_name_of_is_bench_csv_still_works_with_a_warning():
    from posemb.bench import hf as bench_hf
    from posemb.bench.outputs import is_bench_csv

    with pytest.warns(DeprecationWarning, match="posemb.bench.outputs.is_bench_csv"):
        assert bench_hf.is_bench_csv is is_bench_csv
