"""posemb.lesson.parchment: the square figure of the seed's last screen, drawn from posemb."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from posemb.lesson import parchment

pytest.importorskip("matplotlib")

SVG_NS = "{http://www.w3.org/2000/svg}"
# The seed's texts, typed here on purpose: the test holds the module to the seed.
SEED_TITLE = "Positional Embeddings: Injecting Sequence Order"
SEED_SUBTITLE = (
    "Why Transformers are permutation-invariant and how positional vectors restore order."
)
SEED_FUSION = "Input Representation = Token Embedding + Positional Embedding"


@pytest.fixture(scope="module")
def drawn(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    return parchment.draw_parchment(tmp_path_factory.mktemp("parchment"))


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]


def test_png_is_square_on_cream(drawn: tuple[str, str]) -> None:
    from PIL import Image

    image = Image.open(drawn[0]).convert("RGB")
    w, h = image.size
    assert w == h >= 1000
    cream = _rgb("#fcf0db")
    # Corners and edge midpoints lie outside the sepia frame.
    for x, y in [
        (0, 0),
        (w - 1, 0),
        (0, h - 1),
        (w - 1, h - 1),
        (w // 2, 2),
        (2, h // 2),
        (w // 2, h - 3),
        (w - 3, h // 2),
        (8, 8),
    ]:
        assert image.getpixel((x, y)) == cream, (x, y)
    # ... and the frame itself is drawn (a sepia-dark pixel on the diagonal near a corner).
    diagonal = [image.getpixel((i, i)) for i in range(int(0.015 * w), int(0.035 * w))]
    assert any(sum(p) < 400 for p in diagonal)


def test_svg_keeps_the_seed_texts_as_text(drawn: tuple[str, str]) -> None:
    texts = {"".join(t.itertext()).strip() for t in ET.parse(drawn[1]).iter(f"{SVG_NS}text")}
    assert {SEED_TITLE, SEED_SUBTITLE, SEED_FUSION} <= texts
    assert set(parchment.TEXTS) <= texts
    assert "sin(pos / 10000^(2i/d))" in parchment.SINE_FORMULA
    assert "cos(pos / 10000^(2i/d))" in parchment.COSINE_FORMULA
    svg = Path(drawn[1]).read_text()
    assert "<path" in svg and "<image" in svg  # waves as paths, the strip as an image


def test_output_is_deterministic(drawn: tuple[str, str], tmp_path: Path) -> None:
    again = parchment.draw_parchment(tmp_path)
    for first, second in zip(drawn, again, strict=True):
        assert Path(first).read_bytes() == Path(second).read_bytes()


def test_no_temporary_files_left(drawn: tuple[str, str]) -> None:
    assert sorted(os.listdir(os.path.dirname(drawn[0]))) == ["parchment.png", "parchment.svg"]


def test_out_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "taken"
    f.write_text("x")
    with pytest.raises(ValueError, match="out_dir must be a folder"):
        parchment.draw_parchment(f)
    assert f.read_text() == "x"


def test_shipped_table_is_trained_not_noise() -> None:
    table = parchment.learned_table()
    w = table.weight
    assert tuple(w.shape) == (64, 64)
    init = parchment.initial_table(table.info["vocab"], table.info["run"]["seed"])
    # Training moved it far from its N(0, 0.02^2) start ...
    assert float((w - init).norm() / init.norm()) > 3
    # ... into a smooth table: neighbouring positions alike, unlike its start or shuffled rows.
    smooth = parchment.neighbour_correlation(w)
    shuffled = w[torch.randperm(len(w), generator=torch.Generator().manual_seed(0))]
    assert smooth > 0.5
    assert abs(parchment.neighbour_correlation(init)) < 0.1
    assert abs(parchment.neighbour_correlation(shuffled)) < 0.2
    # The model learned the text, not just positions: loss well under the unigram entropy.
    assert table.info["final_loss"] < 0.7 * table.info["unigram_entropy"]


def test_training_moves_the_table() -> None:
    """A short run of the function that made the shipped table changes it from its start."""
    table = parchment.train_learned_table(steps=8)
    init = parchment.initial_table(table.info["vocab"])
    assert not torch.equal(table.weight, init)
    assert table.info["run"]["steps"] == 8


@pytest.mark.parametrize("steps", [0, -1, 1.5, True])
def test_bad_steps_are_refused(steps: object) -> None:
    with pytest.raises(ValueError, match="steps must be an int >= 1"):
        parchment.train_learned_table(steps=steps)  # type: ignore[arg-type]
