"""`posemb lesson` without a browser: files, bad input, honesty of what the page shows."""

from __future__ import annotations

import copy
import json
import re

import pytest

from posemb import cli
from posemb.lesson import render
from posemb.lesson.screens import SCREEN_TEXT

pytest.importorskip("jinja2")
pytest.importorskip("vl_convert")


@pytest.fixture(scope="module")
def figures(built_figures):
    return built_figures


@pytest.fixture(scope="module")
def built(lesson_build):
    return lesson_build


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


def test_a_failed_claim_exits_1_and_still_writes_the_page(tmp_path, claim_rows, capsys):
    rows = copy.deepcopy(claim_rows)
    rows[2]["passed"] = False
    out = tmp_path / "lesson"
    assert cli.main(["lesson", "--out", str(out), "--claims", _save(tmp_path, rows)]) == 1
    html = (out / "index.html").read_text(encoding="utf-8")
    assert 'class="claim fail"' in html
    assert "file://" in capsys.readouterr().out
