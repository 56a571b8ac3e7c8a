"""Text for the lab: the embedded King James Bible, or any UTF-8 file, as character ids.

The default corpus ships with posemb (``data/kjv.txt.xz``, 0.9 MB): the King James Version
(1611, public domain) from Debian's ``bible-kjv`` 4.38 packages, one verse per line, verse
numbers and chapter headings removed; ``scripts/make_kjv_corpus.sh`` regenerates it
byte for byte. No network is used.

The last ``held_out`` fraction of the text is never trained on; evaluation windows are drawn
from it with a fixed seed, so every variant is scored on the same characters.
"""

from __future__ import annotations

import functools
import hashlib
import lzma
import math
import os
from dataclasses import dataclass
from importlib import resources

import numpy as np
import torch

from .._errors import InputError

DEFAULT = "kjv"


@dataclass(frozen=True)
class Corpus:
    """A character-level corpus: ``ids`` (int64), the ``vocab`` string and where held-out begins."""

    name: str
    ids: torch.Tensor
    vocab: str
    split: int
    source: str = ""
    """Where the text came from: the embedded Bible, or the file's absolute path."""

    @property
    def train(self) -> torch.Tensor:
        return self.ids[: self.split]

    @property
    def held_out(self) -> torch.Tensor:
        return self.ids[self.split :]

    def unigram_entropy(self) -> float:
        """Entropy in nats/char of the training characters' frequencies: the no-context floor."""
        counts = torch.bincount(self.train, minlength=len(self.vocab)).to(torch.float64)
        p = counts[counts > 0] / counts.sum()
        return float(-(p * p.log()).sum())


def load_text(path: str | os.PathLike[str] | None = None) -> tuple[str, str]:
    """``(name, text)`` of the default corpus or a UTF-8 file; clear errors otherwise.
    ``"kjv"`` always names the embedded text (a file of that name is read as ``"./kjv"``);
    ``posemb lab --corpus kjv`` typed where such a file lies is refused by the CLI
    (:func:`refuse_shadowed`), since which one was meant cannot be told there."""
    if path is None or str(path) == DEFAULT:
        data = resources.files("posemb.lab").joinpath("data/kjv.txt.xz").read_bytes()
        return DEFAULT, lzma.decompress(data).decode("utf-8")
    p = os.fspath(path)
    if not os.path.isfile(p):
        raise InputError(f"corpus {p!r} does not exist or is not a file")
    try:
        with open(p, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as err:
        raise InputError(
            f"corpus {p!r} is not UTF-8 text (byte {err.start}: {err.reason})"
        ) from None
    if not text.strip():
        raise InputError(f"corpus {p!r} is empty")
    return os.path.basename(p), text


EMBEDDED = "embedded in posemb (posemb/lab/data/kjv.txt.xz)"


def refuse_shadowed(name: str | None) -> None:
    """Refuse ``name`` when it is the embedded corpus's name and a file of that name is in the
    working folder: ``--corpus kjv`` typed there may mean either (issue 56: the embedded text
    was taken silently). ``None`` (nothing typed) is the embedded text, never refused.

    Raises:
        InputError: naming both and how to pick each.
    """
    if name == DEFAULT and os.path.isfile(DEFAULT):
        raise InputError(
            f"--corpus {DEFAULT} names the embedded Bible, and a file {DEFAULT!r} is in the "
            f"working folder {os.getcwd()!r}: pass ./{DEFAULT} to train on the file, or leave "
            f"--corpus out for the embedded text"
        )


def source(path: str | os.PathLike[str] | None = None) -> str:
    """Where a corpus's text comes from: :data:`EMBEDDED`, or the file's absolute path."""
    if path is None or str(path) == DEFAULT:
        return EMBEDDED
    return os.path.abspath(os.fspath(path))


def content_id(path: str | os.PathLike[str] | None = None) -> str:
    """The SHA-256 (hex, first 16 digits) of a corpus's text as UTF-8: what identifies it in
    a lab job's digest and protocol. A path says where a text is, not which: an edited file,
    or a relative path run from another folder, is another corpus."""
    if path is None or str(path) == DEFAULT:
        return _text_id(DEFAULT, 0, 0)
    p = os.path.abspath(os.fspath(path))
    try:
        st = os.stat(p)
    except OSError:
        load_text(p)  # the clear error
        raise
    return _text_id(p, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _text_id(path: str, size: int, mtime_ns: int) -> str:
    # Keyed by size and modification time as well, so a file replaced in place is read again.
    _, text = load_text(path)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def load(
    path: str | os.PathLike[str] | None = None,
    held_out: float = 0.05,
    min_held_out: int = 0,
) -> Corpus:
    """Load and encode a corpus.

    Args:
        path: a UTF-8 text file, or None / "kjv" for the embedded Bible.
        held_out: fraction of the text (at its end) kept for evaluation.
        min_held_out: characters the held-out part must have (the longest evaluation window).

    Returns:
        The :class:`Corpus`.
    """
    name, text = load_text(path)
    vocab, ids = _encode(text)
    split = len(text) - max(math.ceil(len(text) * held_out), 1)
    if len(text) - split < min_held_out or split < min_held_out:
        raise InputError(
            f"corpus {name!r} has {len(text):,} characters: too short for evaluation windows of "
            f"{min_held_out:,} characters (needs {min_held_out:,} held out and as many to train on)"
        )
    return Corpus(name, ids, vocab, split, source(path))


def _encode(text: str) -> tuple[str, torch.Tensor]:
    """The text's characters, sorted by code point, and each character's index in them
    ``(len(text),)`` int64. Through a table indexed by code point: a dict lookup per
    character took 0.6 s of every lab run's 4.1 M-character Bible (loaded three times a
    run), this 0.03 s."""
    if not text:
        return "", torch.zeros(0, dtype=torch.int64)
    codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
    present = np.zeros(int(codes.max()) + 1, dtype=bool)
    present[codes] = True
    points = np.flatnonzero(present)
    table = np.zeros(present.size, dtype=np.int64)
    table[points] = np.arange(points.size)
    return "".join(map(chr, points.tolist())), torch.from_numpy(table[codes])
