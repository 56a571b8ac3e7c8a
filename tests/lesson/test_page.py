"""`posemb lesson` without a browser: files, bad input, honesty of what the page shows."""

from __future__ import annotations

import copy
import json
import re
import shutil

import pytest

from posemb import cli
from posemb.lesson import page, render
from posemb.lesson.screens import SCREEN_TEXT

pytest.importorskip("jinja2")
pytest.importorskip("vl_convert")


@pytest.fixture(scope="module")
def figures(built_figures):
    return built_figures


@pytest.fixture(scope="module")
def built(lesson_build):
    return lesson_build


@pytest.fixture
def figures_reused(monkeypatch, figures):
    """Builds take this run's figures instead of making them again (9 s a build): the tests
    that use it are about the folder and the claims, which every build still does itself."""
    from posemb.lesson import figures as module

    monkeypatch.setattr(module, "build_figures", lambda *a, **k: figures)


def test_the_folder_holds_what_the_issue_lists(built):
    names = {p.name for p in built.folder.iterdir()}
    assert {"index.html", "parchment.png", "parchment.svg", "claims.json", "manifest.json"} <= names
    manifest = json.loads((built.folder / "manifest.json").read_text())
    assert [s["number"] for s in manifest["screens"]] == list(range(1, 10))
    assert all(s["figures"] for s in manifest["screens"])  # every screen draws something


def test_build_time_with_saved_claims(built):
    # The issue's bar is 20 s on the 2-core machine (measured about 9-10 s); a loose bound
    # here, since these machines are shared.
    assert built.seconds < 60, built.seconds


def test_page_size_and_no_network(built):
    html = built.index.read_text(encoding="utf-8")
    assert built.bytes <= 8_000_000, built.bytes
    # Nothing is fetched: no src/href/url() pointing at http(s). (Licence texts and comments
    # may mention addresses; loading attributes may not.)
    assert not re.search(r"""(src|href)\s*=\s*["']https?://""", html)
    assert not re.search(r"""url\(\s*["']?https?://""", html)
    assert "sourceMappingURL" not in html


def test_every_figure_has_alt_text_caption_and_call(built, figures):
    html = built.index.read_text(encoding="utf-8")
    for f in figures:
        assert f.alt and f.caption and f.call in f.caption, f.id
        assert f'id="{f.id}"' in html and f'id="{f.id}-view"' in html
    assert html.count("<figcaption>") == len(figures) + 1  # + the parchment


def test_every_claim_appears_on_exactly_one_screen(built, claim_rows):
    html = built.index.read_text(encoding="utf-8")
    for r in claim_rows:
        assert html.count(f'id="claim-{r["id"]}"') == 1, r["id"]
        section = html.split(f'id="screen-{r["screen"]}"')[1].split('<section class="screen"')[0]
        assert f'id="claim-{r["id"]}"' in section


def test_a_changed_measurement_changes_the_page(claim_rows, figures):
    rows = copy.deepcopy(claim_rows)
    rows[0]["measured"] = "a value posemb did not measure: 12345.678"
    rows[1]["passed"] = False
    html = render.render_page(SCREEN_TEXT, rows, figures, "p.png", "p.svg")
    assert "a value posemb did not measure: 12345.678" in html
    assert f"<strong>1 failed</strong>: {rows[1]['id']}" in html


def test_claim_text_is_escaped(claim_rows, figures):
    rows = copy.deepcopy(claim_rows)
    rows[0]["claim"] = "a < b and <script>alert(1)</script>"
    html = render.render_page(SCREEN_TEXT, rows, figures, "p.png", "p.svg")
    assert "a &lt; b and &lt;script&gt;" in html


def test_the_parchment_is_square_and_cream(built):
    from PIL import Image  # matplotlib depends on pillow

    img = Image.open(built.folder / "parchment.png").convert("RGB")
    assert img.width == img.height
    assert img.getpixel((2, 2)) == (0xFC, 0xF0, 0xDB)
    svg = (built.folder / "parchment.svg").read_text(encoding="utf-8")
    assert "Positional Embeddings: Injecting Sequence Order" in svg


def _save(tmp_path, rows) -> str:
    path = tmp_path / "claims.json"
    path.write_text(json.dumps(rows), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda rows: rows[:-1], "does not match this build's claims"),
        (lambda rows: [{**r, "posemb": "0.0.1"} for r in rows], "written by posemb 0.0.1"),
        (lambda rows: [{k: v for k, v in r.items() if k != "passed"} for r in rows], "'passed'"),
    ],
)
def test_bad_claims_files_exit_2_and_write_nothing(tmp_path, capsys, claim_rows, change, match):
    out = tmp_path / "out"
    assert (
        cli.main(
            ["lesson", "--out", str(out), "--claims", _save(tmp_path, change(list(claim_rows)))]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert match in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_truncated_claims_file_and_file_as_out(tmp_path, capsys, claim_rows):
    path = tmp_path / "claims.json"
    path.write_text(json.dumps(claim_rows)[:500], encoding="utf-8")
    assert cli.main(["lesson", "--out", str(tmp_path / "o"), "--claims", str(path)]) == 2
    assert "truncated" in capsys.readouterr().err
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    assert cli.main(["lesson", "--out", str(afile), "--claims", _save(tmp_path, claim_rows)]) == 2
    assert "is a file" in capsys.readouterr().err
    assert afile.read_text() == "keep me"
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert cli.main(["lesson", "--out", str(other), "--claims", _save(tmp_path, claim_rows)]) == 2
    assert (other / "notes.txt").read_text() == "mine"


def test_a_failed_claim_exits_1_and_still_writes_the_page(
    tmp_path, claim_rows, capsys, figures_reused
):
    rows = copy.deepcopy(claim_rows)
    rows[2]["passed"] = False
    out = tmp_path / "lesson"
    assert cli.main(["lesson", "--out", str(out), "--claims", _save(tmp_path, rows)]) == 1
    html = (out / "index.html").read_text(encoding="utf-8")
    assert 'class="claim fail"' in html
    assert "file://" in capsys.readouterr().out


# --- hand-edited claims files: refused at the door, naming file, row, claim, field and value ---

FAILED_CORRECTION = "rope.extrapolation_is_not_native"  # screen 3, verdict "overstated"
PAIRS = "rope.pairs_per_head"  # screen 5, verdict "wrong"


def _edit(rows, claim_id, **changes):
    """The rows with one claim's row changed: keys set as given, the keys in ``drop`` gone."""
    out = copy.deepcopy(list(rows))
    row = next(r for r in out if r["id"] == claim_id)
    for key in changes.pop("drop", ()):
        del row[key]
    row.update(changes)
    return out


@pytest.mark.parametrize(
    "change,words",
    [
        # Before: a KeyError deep in the page's render.
        (lambda rows: _edit(rows, PAIRS, screen=99), ["'screen'", "99", "screen 5"]),
        # Before: jinja2's UndefinedError for r.lesson_says.
        (lambda rows: _edit(rows, PAIRS, drop=["lesson_says"]), ["no 'lesson_says'"]),
        # Before: the page was built with these.
        (
            lambda rows: _edit(rows, PAIRS, verdict="bogus"),
            ["'verdict'", "'bogus'", "holds, wrong, overstated, incomplete, n/a"],
        ),
        (lambda rows: _edit(rows, PAIRS, screen=1), ["'screen'", "is 1", "screen 5"]),
        (lambda rows: _edit(rows, PAIRS, verdict="holds"), ["'verdict'", "'wrong'"]),
        (lambda rows: _edit(rows, PAIRS, lesson_says=None), ["'lesson_says'", "None"]),
        (lambda rows: _edit(rows, PAIRS, lesson_says=7), ["'lesson_says'", "7", "null"]),
        (lambda rows: _edit(rows, PAIRS, claim="made up"), ["'claim'", "'made up'"]),
        (lambda rows: _edit(rows, PAIRS, screen=True), ["'screen'", "True", "an integer"]),
        (lambda rows: _edit(rows, PAIRS, measured=1.5), ["'measured'", "1.5", "a string"]),
        (lambda rows: _edit(rows, PAIRS, screen_title=None), ["'screen_title'", "a string"]),
        (lambda rows: _edit(rows, PAIRS, drop=["value"]), ["no 'value'"]),
        (lambda rows: _edit(rows, PAIRS, extra=1), ["unknown key", "'extra'"]),
    ],
    ids=[
        "screen-99",
        "no-quote",
        "unknown-verdict",
        "other-screen",
        "other-verdict",
        "quote-null",
        "quote-not-text",
        "other-claim-text",
        "screen-true",
        "measured-number",
        "title-null",
        "no-value",
        "unknown-key",
    ],
)
def test_a_hand_edited_row_is_refused_naming_what_is_wrong(
    tmp_path, capsys, claim_rows, change, words
):
    out = tmp_path / "out"
    path = _save(tmp_path, change(claim_rows))
    assert cli.main(["lesson", "--out", str(out), "--claims", path]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    row = next(i for i, r in enumerate(claim_rows) if r["id"] == PAIRS)
    for word in [repr(path), f"row {row}", PAIRS, *words]:
        assert word in err, (word, err)
    assert not out.exists()


def test_a_repeated_row_is_refused_naming_the_repeated_id(tmp_path, capsys, claim_rows):
    rows = [*claim_rows, claim_rows[3]]
    out = tmp_path / "out"
    assert cli.main(["lesson", "--out", str(out), "--claims", _save(tmp_path, rows)]) == 2
    err = capsys.readouterr().err
    # Before: "does not match this build's claims (missing: none; unknown: none)".
    assert "missing: none; unknown: none" not in err
    assert f"{claim_rows[3]['id']} (rows 3, {len(claim_rows)})" in err and "repeated" in err
    assert not out.exists()


# --- a correction whose check failed is not presented as established ---


def _tally(html):
    return " ".join(html.split('id="tally">')[1].split("</p>")[0].split())


def _correction(html, claim_id):
    return html.split(f'data-claim="{claim_id}"')[1].split("</div>")[0]


def test_a_failed_correction_is_not_presented_as_holding(claim_rows, figures):
    from markupsafe import escape

    rows = copy.deepcopy(claim_rows)
    row = next(r for r in rows if r["id"] == FAILED_CORRECTION)
    row["passed"] = False
    corrects = [r for r in rows if r["verdict"] not in ("holds", "n/a")]
    html = render.render_page(SCREEN_TEXT, rows, figures, "p.png", "p.svg")
    # Before: the tally counted every correction and the box said "What holds instead".
    assert f"{len(corrects) - 1} of them correct the source lesson" in _tally(html)
    box = _correction(html, FAILED_CORRECTION)
    assert "What holds instead" not in box
    assert f"this build's check FAILED:</span> {escape(row['claim'])}" in box
    # Corrections whose checks passed still read as established.
    assert f"What holds instead:</span> {escape(corrects[0]['claim'])}" in _correction(
        html, corrects[0]["id"]
    )
    section = html.split('id="screen-3"')[1].split('<section class="screen"')[0]
    summary = section.split('<details class="evidence"')[1].split("</summary>")[0]
    assert "overstates" not in summary and "failed its check" in summary


def test_the_evidence_line_counts_only_corrections_whose_check_passed():
    def row(verdict, passed):
        return {"verdict": verdict, "passed": passed}

    rows = [row("holds", True), row("wrong", True), row("wrong", False), row("overstated", False)]
    line = render.evidence_summary(rows)
    # Before: "... gets two things wrong and overstates one thing".
    assert line.startswith(
        "2 of 4 checks hold in this build; the source lesson gets one thing wrong"
    )
    assert "overstates" not in line and "two corrections failed their checks" in line
    assert render.evidence_summary([row("wrong", False)]) == (
        "0 of 1 checks hold in this build; one correction failed its check (open to see them)"
    )


# --- --out: the command owns only the files it wrote (issue 29) ------------------------------


def _tree(root):
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_a_folder_with_someone_elses_manifest_is_refused_and_nothing_is_deleted(
    tmp_path, capsys, claim_rows
):
    # Was: any folder holding a manifest.json was taken for a lesson and removed whole.
    site = tmp_path / "site"
    (site / "sub").mkdir(parents=True)
    (site / "manifest.json").write_text('{"name": "app"}')
    (site / "thesis.tex").write_text("important")
    (site / "sub" / "data.csv").write_text("x")
    before = _tree(site)
    claims_file = _save(tmp_path, claim_rows)
    assert cli.main(["lesson", "--claims", claims_file, "--out", str(site)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did not write" in err[0] and "thesis.tex" in err[0]
    assert _tree(site) == before
    # --force writes beside them, but manifest.json stands where the page writes its own.
    assert cli.main(["lesson", "--claims", claims_file, "--out", str(site), "--force"]) == 2
    assert "never replaces them" in capsys.readouterr().err
    assert _tree(site) == before


def test_a_rebuild_keeps_a_users_notes_only_with_force_and_removes_only_its_own(
    tmp_path, capsys, claim_rows, figures_reused
):
    out = tmp_path / "lesson"
    claims_file = _save(tmp_path, claim_rows)
    assert cli.main(["lesson", "--claims", claims_file, "--out", str(out)]) == 0
    (out / "my-notes.md").write_text("notes")
    assert cli.main(["lesson", "--claims", claims_file, "--out", str(out)]) == 2
    assert "did not write (my-notes.md)" in capsys.readouterr().err
    # An earlier build's file that this build does not write goes; the user's notes stay.
    (out / "parchment.svg").unlink()
    assert cli.main(["lesson", "--claims", claims_file, "--out", str(out), "--force"]) == 0
    assert (out / "my-notes.md").read_text() == "notes"
    names = {p.name for p in out.iterdir()}
    assert names == {*page.PAGE_FILES, ".posemb-owned.json", "my-notes.md"}
    # A page the user edited is theirs now.
    (out / "index.html").write_text("my annotated copy")
    assert cli.main(["lesson", "--claims", claims_file, "--out", str(out)]) == 2
    assert "changed since posemb lesson wrote them (index.html)" in capsys.readouterr().err


def test_an_earlier_posembs_lesson_folder_is_taken_over(
    tmp_path, claim_rows, lesson_build, figures_reused
):
    old = tmp_path / "old"
    shutil.copytree(lesson_build.folder, old)
    (old / ".posemb-owned.json").unlink()  # as a posemb before manifests left it
    page.build_lesson(old, claim_rows)
    assert set(json.loads((old / ".posemb-owned.json").read_text())["files"]) == set(
        page.PAGE_FILES
    )


@pytest.mark.parametrize("where", [".", "/proc/posemb-lesson", "a-file/child"])
def test_out_dot_and_unwritable_folders_exit_2_before_building(
    tmp_path, monkeypatch, capsys, claim_rows, where
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("x")
    claims_file = _save(tmp_path, claim_rows)
    monkeypatch.setattr(
        "posemb.lesson.figures.build_figures", lambda **k: pytest.fail("built before --out")
    )
    assert cli.main(["lesson", "--claims", claims_file, "--out", where]) == 2
    err = capsys.readouterr().err
    assert ("cannot be written" in err) or ("did not write" in err), err
    assert (tmp_path / "a-file").read_text() == "x"
