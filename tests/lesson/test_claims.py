"""The claims as a whole: every one holds, names its screen, and the registry refuses bad ones.

Each claim's own test, that it fails when what it claims is broken, is in its screen's test
module (``test_s01_blender.py`` ... ``test_s09_at_scale.py``).
"""

import pytest

from posemb.lesson import claims, registry, screens


def test_every_claim_holds_as_measured(claim_rows):
    failed = [(r["id"], r["measured"]) for r in claim_rows if not r["passed"]]
    assert not failed


def test_every_screen_has_a_claim_and_every_claim_a_screen(claim_rows):
    assert list(claims.SCREENS) == [s.number for s in screens.SCREEN_TEXT]
    assert {r["screen"] for r in claim_rows} == set(claims.SCREENS)
    assert [r["screen"] for r in claim_rows] == sorted(r["screen"] for r in claim_rows)
    ids = [c.id for c in claims.CLAIMS]
    assert len(ids) == len(set(ids))


def test_a_correction_quotes_the_lesson():
    with pytest.raises(ValueError, match="quotes it"):
        claims.Claim("x.y", 1, "text", lambda: claims.Result(True, "", 0.0), verdict="wrong")
    with pytest.raises(
        ValueError, match=r"screen must be a registered screen \(1, 2, .*9\), got 10"
    ):
        claims.Claim("x.y", 10, "text", lambda: claims.Result(True, "", 0.0))
    with pytest.raises(ValueError, match="registered twice"):
        claims.claim("rope.toy_trace", 5, "again")(lambda: claims.Result(True, "", 0.0))


def test_the_screens_are_the_modules_numbered_in_order():
    assert len(screens.MODULES) == len(screens.SCREEN_TEXT) == 9  # the seed lesson's nine
    for name, s in zip(screens.MODULES, screens.SCREEN_TEXT, strict=True):
        assert registry.screen_number(name) == s.number
        module = getattr(screens, name)
        assert module.SCREEN is s
        # A screen's claims and figures are defined in its own module.
        for c in claims.CLAIMS:
            if c.screen == s.number:
                assert c.check.__module__ == module.__name__, c.id
    for bad in ("posemb.lesson.screens.clock", "s5_clock", "s05-clock"):
        with pytest.raises(ValueError, match="sNN_"):
            registry.screen_number(bad)
    with pytest.raises(ValueError, match="screen 5 is registered twice"):
        registry.screen("s05_again", "again", question="", goal="", intuition=(), maths=(), trap="")


def test_a_figure_id_is_registered_once():
    with pytest.raises(ValueError, match="figure id 'fig-blender' is registered twice"):
        registry.figure("fig-blender")(lambda summary: None)
