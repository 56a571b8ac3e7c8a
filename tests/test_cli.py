"""`posemb verify` and the command line around it (the claims themselves: tests/lesson/)."""

import json
import subprocess
import sys

import pytest

import posemb
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


# --- single-file outputs: a user's file is never replaced, a bad path is refused first ----------


@pytest.fixture
def no_claims_run(monkeypatch):
    """Fail the test if the claims run: every refusal here comes before the minute they take."""

    def ran(*a, **k):
        raise AssertionError("the claims ran before the output path was checked")

    monkeypatch.setattr(claims, "run_all", ran)


def test_verify_save_refuses_a_users_file_and_an_unwritable_path_first(
    tmp_path, capsys, no_claims_run
):
    theirs = tmp_path / "thesis.json"
    theirs.write_text('{"chapter": 1}')
    assert cli.main(["verify", "--save", str(theirs)]) == 2
    assert "not an earlier output" in capsys.readouterr().err
    assert theirs.read_text() == '{"chapter": 1}'
    for bad in ("/proc/posemb-x/claims.json", str(theirs / "claims.json"), str(tmp_path)):
        assert cli.main(["verify", "--save", bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and ("cannot be written" in err[0] or "is a folder" in err[0])


def test_verify_save_replaces_its_own_earlier_output(tmp_path, monkeypatch, capsys):
    row = {"id": "x", "claim": "c", "passed": True, "measured": "m", "screen": 1}
    row |= {"verdict": "holds", "posemb": "0", "screen_title": "t"}
    monkeypatch.setattr(claims, "run_all", lambda only=None: [row])
    path = tmp_path / "claims.json"
    assert cli.main(["verify", "--save", str(path)]) == 0
    assert cli.main(["verify", "--save", str(path)]) == 0  # its own file: replaced
    other = tmp_path / "other.json"
    other.write_text("mine")
    assert cli.main(["verify", "--save", str(other), "--force"]) == 0
    assert json.loads(other.read_text()) == [row]
    capsys.readouterr()


def test_bench_out_refuses_a_users_file_before_timing(tmp_path, capsys, monkeypatch):
    from posemb.bench import kernels

    monkeypatch.setattr(kernels, "run", lambda **k: pytest.fail("benchmarked first"))
    theirs = tmp_path / "data.csv"
    theirs.write_text("a,b\n1,2\n")
    assert cli.main(["bench", "--quick", "--out", str(theirs)]) == 2
    assert "not an earlier output" in capsys.readouterr().err
    assert theirs.read_text() == "a,b\n1,2\n"
    assert cli.main(["bench", "--quick", "--out", "/proc/posemb-x/b.csv"]) == 2
    assert "cannot be written" in capsys.readouterr().err


def test_the_verify_tally_counts_only_corrections_whose_check_passed():
    row = {"claim": "c", "measured": "m", "screen": 1, "screen_title": "t", "posemb": "0"}
    rows = [
        row | {"id": "a", "passed": True, "verdict": "wrong", "lesson_says": "x"},
        row | {"id": "b", "passed": False, "verdict": "overstated", "lesson_says": "y"},
        row | {"id": "c", "passed": True, "verdict": "holds", "lesson_says": None},
    ]
    head = cli.format_table(rows).splitlines()[0]
    assert "2/3 claims hold" in head and "imprecise on 1 of them" in head
    assert "1 more correction(s) failed their check" in head


@pytest.mark.parametrize(
    "argv",
    [["bench", "--quick", "--out", ""], ["verify", "--save", ""], ["lab", "--quick", "--out", ""],
     ["lesson", "--out", " "]],
)  # fmt: skip
def test_an_empty_output_path_is_refused_before_any_work(argv, capsys):
    # An unset $VAR gave "" and the command ran with no output (bench, verify) or into the
    # default folder (lab).
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 2 and "must be a path, got an empty string" in capsys.readouterr().err


def test_version_names_the_package_version(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"posemb {posemb.__version__}"
