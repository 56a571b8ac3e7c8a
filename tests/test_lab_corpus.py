"""The lab's corpus: the embedded KJV, and what a bad corpus file gets."""

import pytest

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
