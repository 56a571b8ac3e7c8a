"""The lab's corpus: the embedded KJV, and what a bad corpus file gets."""

import json
import pathlib

import pytest
import torch

from posemb.lab import corpus


def test_default_corpus_is_the_kjv():
    c = corpus.load()
    assert c.name == "kjv" and len(c.ids) > 4_000_000
    text = corpus.load_text()[1]
    assert text.startswith("In the beginning God created the heaven and the earth.\n")
    assert text.count("\n") == 31102  # every verse of the KJV, one per line
    assert 2.9 < c.unigram_entropy() < 3.1


def test_corpus_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        corpus.load(tmp_path / "none.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    with pytest.raises(ValueError, match="is empty"):
        corpus.load(empty)
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(ValueError, match="is not UTF-8 text"):
        corpus.load(latin1)
    short = tmp_path / "short.txt"
    short.write_text("abc" * 100)
    with pytest.raises(ValueError, match="too short for evaluation windows of 1,026"):
        corpus.load(short, min_held_out=1026)


def test_a_file_named_as_the_embedded_corpus_is_refused_not_replaced(tmp_path, monkeypatch, capsys):
    """Issue 56, bug 6: --corpus kjv with a file named kjv in the working folder took the
    embedded Bible, silently (4,137,848 characters where the file held 20,000). Which was
    meant cannot be told: refused, naming both, before anything is read; ./kjv is the file.
    Nothing typed is the embedded text, file or not (an attack found the default refused)."""
    from posemb import cli
    from posemb.lab import corpus

    monkeypatch.chdir(tmp_path)
    (tmp_path / "kjv").write_text("In the beginning was a short text. " * 600)
    with pytest.raises(ValueError, match="names the embedded Bible, and a file 'kjv'"):
        corpus.refuse_shadowed("kjv")
    corpus.refuse_shadowed(None)
    corpus.refuse_shadowed("./kjv")
    assert cli.main(["lab", "--quick", "--corpus", "kjv", "--out", str(tmp_path / "o")]) == 2
    assert "names the embedded Bible, and a file 'kjv'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # refused before anything ran
    data = corpus.load("./kjv")
    assert len(data.ids) == 35 * 600 and data.source == str(tmp_path / "kjv")
    # "kjv" in the library, and the CLI's default, are the embedded text.
    assert corpus.load(None).source == corpus.EMBEDDED
    assert corpus.source("kjv") == corpus.EMBEDDED
    assert corpus.content_id("kjv") == corpus.content_id(None) != corpus.content_id("./kjv")


def test_the_lab_without_a_corpus_takes_the_embedded_one_beside_a_file_named_kjv(
    tmp_path, monkeypatch
):
    """The attack's case: no --corpus, a file named kjv here: the settings pass (the run is
    handed to a stand-in for the sweep, after the corpus check)."""
    from posemb import cli
    from posemb.lab import sweep

    monkeypatch.chdir(tmp_path)
    (tmp_path / "kjv").write_text("In the beginning was a short text. " * 600)
    seen = {}

    def run(cfg, out, **kw):
        seen["corpus"] = cfg.corpus
        return None

    monkeypatch.setattr(sweep, "run", run)
    assert cli.main(["lab", "--quick", "--out", str(tmp_path / "o")]) == 0
    assert seen["corpus"] == "kjv"


def test_the_results_say_where_the_corpus_came_from(tmp_path):
    """The summary records the corpus's source and results.md says it beside its name."""
    from posemb.lab import report

    path = tmp_path / "text.txt"
    path.write_text("abc " * 5000)
    data = corpus.load(str(path))
    assert data.source == str(path)
    summary = {"corpus": {"name": data.name, "source": data.source, "characters": 1, "vocab": 1}}
    shipped = pathlib.Path(__file__).parent.parent / "docs" / "lab" / "results.json"
    full = json.loads(shipped.read_text())
    first = report.markdown({**full, "corpus": summary["corpus"]})
    assert f"held-out text.txt text (from {path})" in first.splitlines()[0]


def test_the_encoding_is_the_sorted_characters_and_their_indices():
    # The table by code point against the plain reading: ASCII, accents, CJK, an emoji beyond
    # the 16-bit plane, a NUL, and a character that repeats.
    text = "In the beginning\x00 éé 起初 \U0001f600 God\n" * 3
    vocab, ids = corpus._encode(text)
    assert vocab == "".join(sorted(set(text)))
    assert ids.dtype == torch.int64 and ids.tolist() == [vocab.index(c) for c in text]
    empty, none = corpus._encode("")
    assert empty == "" and none.shape == (0,) and none.dtype == torch.int64
