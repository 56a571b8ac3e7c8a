"""`posemb bench --decode`: per-layer, per-step and model decode timings against transformers,
paired in one run, written as the other benches write theirs."""

import csv
import json

import pytest

from posemb import cli
from posemb.bench import decode


def test_quick_decode_bench_writes_every_part_paired_with_transformers(tmp_path, capsys):
    out = tmp_path / "decode.csv"
    argv = ["bench", "--decode", "--quick", "--out", str(out), "--json"]
    assert cli.main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == len(data["rows"])
    parts = {(r["part"], int(r["batch"])) for r in rows}
    assert parts == {(p, b) for p in ("layer", "step", "model", "qwen3") for b in decode.BATCHES}
    for part, batch in parts:
        mine = {r["method"]: r for r in rows if (r["part"], int(r["batch"])) == (part, batch)}
        assert float(mine["transformers"]["vs_transformers"]) == 1.0  # paired with itself
        assert "patch_rotary fused" in mine
        for r in mine.values():
            assert float(r["median_us"]) > 0 and float(r["vs_transformers"]) > 0
    layer = {r["method"] for r in rows if r["part"] == "layer"}
    assert {"posemb module", "posemb kernels.rotate"} <= layer
    assert {r["calls"] for r in rows if r["part"] == "layer"} == {str(decode.LAYERS)}
    # a second run may replace the file it wrote; the table names the machine
    assert cli.main(["bench", "--decode", "--quick", "--repeats", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "vs transformers" in text and "torch" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--decode", "--hf"], "different benches"),
        (["--norm", "--decode"], "different benches"),
        (["--norm", "--dtype", "bf16"], "times fp32 and bf16 both"),
        (["--decode", "--shapes", "decode"], "--shapes names kernel shapes"),
    ],
)
def test_decode_bench_refuses_what_it_cannot_run(argv, message, capsys):
    assert cli.main(["bench", "--quick", *argv]) == 2
    assert message in capsys.readouterr().err


def test_decode_bench_refuses_a_file_that_is_not_a_bench_csv(tmp_path, capsys):
    precious = tmp_path / "notes.csv"
    precious.write_text("name,value\nmine,1\n")
    assert cli.main(["bench", "--decode", "--quick", "--out", str(precious)]) != 0
    assert precious.read_text() == "name,value\nmine,1\n"
