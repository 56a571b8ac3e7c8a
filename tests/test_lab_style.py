"""One look per lab variant, the same in the lab's plots and the lesson's charts."""

import pytest

from posemb.lab import plots
from posemb.lab.model import EXTENSIONS, SCALINGS, VARIANTS
from posemb.lab.style import LOOKS, look


def test_every_variant_has_its_own_colour_and_inference_time_variants_are_dashed():
    assert set(LOOKS) == {*VARIANTS, "rope+pi+ft"}  # the fine-tuned PI of --finetune-steps
    colours = [v.colour for v in LOOKS.values()]
    assert len(set(colours)) == len(colours)
    assert len({v.marker for v in LOOKS.values()}) == len(LOOKS)
    assert {name for name, v in LOOKS.items() if v.dashed} == {*SCALINGS, *EXTENSIONS}


def test_the_plots_and_the_page_use_the_same_colour():
    for name in VARIANTS:
        assert plots._style(name)["color"] == look(name).colour
    with pytest.raises(ValueError, match=r"variant 'rope\+nope' has no look; known: learned, "):
        look("rope+nope")
