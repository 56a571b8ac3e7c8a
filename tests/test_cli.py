"""`posemb verify` and the command line around it (the claims themselves: tests/lesson/)."""

import json
import subprocess
import sys

import pytest

from posemb import cli
from posemb.lesson import claims


def test_verify_json(capsys):
    assert cli.main(["verify", "--json", "--only", "rope.fastest_pair_period"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["verdict"] == "wrong" and row["screen"] == 8
    assert "6.2832" in row["measured"] and "114.6 degrees" in row["measured"]


def test_verify_table(capsys):
    ids = ["attention.permutation_equivariance", "rope.slowest_pair_period"]
    assert cli.main(["verify", "--only", *ids]) == 0
    out = capsys.readouterr().out
    assert out.count("PASS   ") == 2 and "FAIL" not in out
    assert "Screen 1:" in out and "Screen 8:" in out and "lesson wrong" in out


def test_verify_list_and_unknown_id(capsys):
    assert cli.main(["verify", "--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == len(claims.CLAIMS) and listed[0].startswith("1  ")
    assert cli.main(["verify", "--only", "no.such.claim"]) == 2
    assert "unknown claim id(s) no.such.claim" in capsys.readouterr().err


def test_verify_exits_1_when_a_claim_fails(monkeypatch, capsys):
    bad = claims.Claim(
        "x.fails", 2, "a claim that does not hold", lambda: claims.Result(False, "1 != 2", 1.0)
    )
    monkeypatch.setattr(claims, "CLAIMS", [*claims.CLAIMS[:2], bad])
    assert cli.main(["verify"]) == 1
    out = capsys.readouterr().out
    assert "FAIL   x.fails" in out and "2/3 claims hold" in out


def test_python_dash_m_posemb():
    proc = subprocess.run(
        [sys.executable, "-m", "posemb", "verify", "--json", "--only", "rope.toy_trace"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert [r["id"] for r in json.loads(proc.stdout)] == ["rope.toy_trace"]


def test_unknown_subcommand_is_a_usage_error():
    with pytest.raises(SystemExit) as exc:
        cli.main(["frobnicate"])
    assert exc.value.code == 2
