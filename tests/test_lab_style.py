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


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_every_colour_reads_as_text_on_the_page_and_its_card(scheme):
    """WCAG 2.1 1.4.3: 4.5:1 for text, so a line (1.4.11, 3:1) is more than visible; each
    variant's and each annotation's colour in the scheme it is drawn in."""
    from posemb.lab.style import CARDS, INK, contrast

    colours = {n: (v.colour if scheme == "light" else v.dark) for n, v in LOOKS.items()}
    colours |= {f"ink {n}": pair[scheme == "dark"] for n, pair in INK.items()}
    low = [
        (name, c, bg, round(contrast(c, bg), 2))
        for name, c in colours.items()
        for bg in CARDS[scheme]
        if contrast(c, bg) < 4.5
    ]
    assert not low, low


def test_colour_is_never_the_only_difference():
    """WCAG 1.4.1: two variants differ in dash pattern and in marker too."""
    assert len({v.dash for v in LOOKS.values()}) == len(LOOKS)
    assert all(v.dash for v in LOOKS.values() if v.dashed)
    # The lesson's charts name their lines too; Vega's shapes are the nearest to the markers.
    assert look("learned").shape == "circle" and look("rope").shape == "diamond"
    assert look("nope").shape == "triangle-up" and look("p-rope").shape == "circle"


def test_contrast_is_wcags_ratio():
    from posemb.lab.style import contrast

    assert contrast("#000000", "#FFFFFF") == pytest.approx(21.0)
    assert contrast("#767676", "#ffffff") == pytest.approx(4.54, abs=0.005)
    assert contrast("#777777", "#FFFFFF") < 4.5 < contrast("#757575", "#FFFFFF")
    assert contrast("#FFFFFF", "#0070AF") == contrast("#0070AF", "#FFFFFF")


def test_the_cards_are_the_pages():
    """The backgrounds the contrast is measured on are the lesson page's own."""
    import importlib.resources
    import re

    from posemb.lab.style import CARDS

    css = importlib.resources.files("posemb.lesson").joinpath("static/page.css").read_text()
    light, dark = (
        re.findall(r"--(bg|panel): (#[0-9a-f]{6})", block) for block in css.split("@media", 2)[:2]
    )
    assert dict(light) == dict(zip(("bg", "panel"), CARDS["light"], strict=True))
    assert dict(dark) == dict(zip(("bg", "panel"), CARDS["dark"], strict=True))


def test_the_dark_page_has_a_partner_for_every_colour():
    from posemb.lab.style import dark_pairs
    from posemb.lesson.render import dark_palette_css

    css = dark_palette_css()
    assert css.lstrip().startswith("@media screen and (prefers-color-scheme: dark)")
    for light, dark in dark_pairs().items():
        assert f'[fill="{light}" i] {{ fill: {dark}; }}' in css
        assert f'[stroke="{light}" i] {{ stroke: {dark}; }}' in css
