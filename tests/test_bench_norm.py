"""`posemb bench --norm`: kernels.norm_rotate against the two steps it fuses, the rotation alone
and torch.compile, paired in one run."""

import csv

from posemb import cli


def test_quick_norm_bench_pairs_every_method_with_the_two_steps(tmp_path, capsys):
    out = tmp_path / "norm.csv"
    assert cli.main(["bench", "--norm", "--quick", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "vs two-step" in text
    rows = list(csv.DictReader(out.open()))
    assert {(r["dtype"], r["mode"]) for r in rows} == {
        (d, m) for d in ("fp32", "bf16") for m in ("forward", "forward+backward")
    }
    forward = {r["method"] for r in rows if r["mode"] == "forward"}
    assert forward == {"norm_rotate", "rms_norm + rotate", "rotate alone", "torch.compile"}
    backward = {r["method"]: r for r in rows if r["mode"] == "forward+backward"}
    assert "rotate alone" not in backward
    assert backward["norm_rotate"]["compared_with"] == "torch.compile"
    for r in rows:
        assert float(r["median_ms"]) > 0 and float(r["vs_two_step"]) > 0 and float(r["gbps"]) > 0
