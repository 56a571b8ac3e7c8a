import json
import subprocess
import sys

import pytest

from posemb import cli
from posemb.lesson import claims


def test_every_claim_holds_as_measured():
    rows = claims.run_all()
    failed = [(r["id"], r["measured"]) for r in rows if not r["passed"]]
    assert not failed


def test_claims_are_well_formed():
    ids = [c.id for c in claims.CLAIMS]
    assert len(ids) == len(set(ids))
    for c in claims.CLAIMS:
        assert c.verdict in ("holds", "wrong", "overstated", "incomplete", "n/a")
        # A claim that corrects the lesson quotes what the lesson said.
        assert (c.lesson_says is not None) == (c.verdict not in ("holds", "n/a"))


def test_claims_required_by_the_issue_are_present():
    ids = {c.id for c in claims.CLAIMS}
    for needed in (
        "attention.permutation_equivariance",
        "attention.dog_bites_man.no_positions",
        "attention.dog_bites_man.with_positions",
        "attention.causal_logit_blind_to_distance",
        "absolute.sinusoidal_shift_is_linear",
        "sinusoidal.wavelengths_768",
        "absolute.random_vectors_near_orthogonal",
        "absolute.four_term_decomposition",
        "rope.norm_preserved",
        "rope.relative_composition",
        "rope.group_homomorphism",
        "rope.determinant_and_orthogonality",
        "rope.logit_depends_on_offset_only",
        "rope.toy_trace",
        "rope.fastest_pair_period",
    ):
        assert needed in ids


def test_verify_json(capsys):
    assert cli.main(["verify", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == len(claims.CLAIMS)
    for row in rows:
        assert {"id", "claim", "passed", "measured"} <= row.keys()
        assert row["passed"] is True
    wrong = {r["id"]: r for r in rows if r["verdict"] == "wrong"}
    assert "6.2832" in wrong["rope.fastest_pair_period"]["measured"]


def test_verify_table(capsys):
    assert cli.main(["verify"]) == 0
    out = capsys.readouterr().out
    assert out.count("PASS   ") == len(claims.CLAIMS)
    assert "lesson wrong" in out and "FAIL" not in out


def test_verify_exits_1_when_a_claim_fails(monkeypatch, capsys):
    bad = claims.Claim(
        "x.fails", "test", "a claim that does not hold", lambda: claims.Result(False, "1 != 2", 1.0)
    )
    monkeypatch.setattr(claims, "CLAIMS", (*claims.CLAIMS[:2], bad))
    assert cli.main(["verify"]) == 1
    out = capsys.readouterr().out
    assert "FAIL   x.fails" in out and "2/3 claims hold" in out


def test_command_line_entry_point():
    proc = subprocess.run(
        [sys.executable, "-m", "posemb", "verify", "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[0]["id"] == "attention.permutation_equivariance"


def test_unknown_subcommand_is_a_usage_error():
    with pytest.raises(SystemExit) as exc:
        cli.main(["frobnicate"])
    assert exc.value.code == 2
