"""The lesson page in a real browser: Debian's Chromium driven by Playwright, from file://.

Checks what a learner meets: no console or page errors, no request leaves file:/data:, every
figure is drawn at a useful size, every control moved by the keyboard changes its figure and
shows the readout posemb computed for that state (from manifest.json), every control is reached
by Tab with a visible focus ring, and axe-core (vendored in tests/vendor) finds no WCAG 2.1 A/AA
violation in light and dark mode, at 1280, 400 and 320 px. What axe cannot see is in
test_a11y.py. ``make screenshots`` keeps a screenshot of each screen under test-artifacts/lesson/
(``make test`` does not: they check nothing). Under CI=true a
missing browser fails the test.
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from browser import CUT_TEXT, SMALL_TEXT, axe_violations, open_every_fold, summary

ARTIFACTS = pathlib.Path(__file__).resolve().parents[2] / "test-artifacts" / "lesson"


def _open(browser, index: pathlib.Path, scheme: str):
    context = browser.new_context(color_scheme=scheme, viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    requests: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: requests.append(r.url))
    page.goto(index.as_uri())
    page.wait_for_load_state("load")
    page.wait_for_timeout(500)  # vega views render asynchronously
    return context, page, errors, requests


def _save_screen(page, anchor: str, path: pathlib.Path) -> None:
    """Save one screen (a section 1,500-4,800 px tall) as a picture for reviewers.

    A locator screenshot scrolls the section into view and waits for two animation frames with
    the same box; on a starved CI machine that wait ran past 30 s once. These pictures assert
    nothing, so they come from a full-page capture clipped to the section's box instead, and
    only where ``POSEMB_SCREENSHOTS`` is not 0 (``make test`` sets 0, ``make screenshots`` 1).
    """
    if os.environ.get("POSEMB_SCREENSHOTS", "1") == "0":
        return
    box = page.evaluate(
        """(a) => { const r = document.getElementById(a).getBoundingClientRect();
                    return {x: r.left + scrollX, y: r.top + scrollY,
                            width: r.width, height: r.height}; }""",
        anchor,
    )
    page.screenshot(path=str(path), full_page=True, clip=box)


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_page_loads_offline_and_clean(browser, lesson_build, scheme):
    manifest = json.loads((lesson_build.folder / "manifest.json").read_text())
    context, page, errors, requests = _open(browser, lesson_build.index, scheme)
    try:
        assert not errors, errors
        assert all(u.startswith(("file:", "data:", "blob:")) for u in requests), requests
        for fig in manifest["figures"]:
            target = "img" if fig["kind"] == "img" else f"#{fig['id']}-view"
            el = page.locator(f"#{fig['id']} {target}" if fig["kind"] == "img" else target)
            box = el.first.bounding_box()
            assert box and box["width"] > 150 and box["height"] > 60, (fig["id"], box)
        # KaTeX rendered the maths.
        assert page.locator(".math .katex").count() == page.locator(".math").count() > 0
        violations = axe_violations(page)
        assert not violations, summary(violations)
        if scheme == "light":
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            for s in manifest["screens"]:
                _save_screen(page, s["anchor"], ARTIFACTS / f"{s['anchor']}.png")
    finally:
        context.close()


def _press(page, control: dict) -> int:
    """Move a control one step by keyboard; return the new index."""
    n = len(control["values"])
    if control["kind"] == "slider":
        page.focus(f"#{control['id']}")
        key = "ArrowRight" if control["default"] < n - 1 else "ArrowLeft"
    else:
        page.focus(f"input[name='{control['id']}']:checked")
        key = "ArrowRight" if control["default"] < n - 1 else "ArrowLeft"
    page.keyboard.press(key)
    return control["default"] + (1 if key == "ArrowRight" else -1)


def test_every_control_changes_its_figure_and_readout(browser, lesson_build):
    manifest = json.loads((lesson_build.folder / "manifest.json").read_text())
    context, page, errors, _ = _open(browser, lesson_build.index, "light")
    try:
        for fig in manifest["figures"]:
            for i, control in enumerate(fig["controls"]):
                view = page.locator(f"#{fig['id']}-view")
                before = view.inner_html()
                index = _press(page, control)
                values = [c["values"][c["default"]] for c in fig["controls"]]
                values[i] = control["values"][index]
                key = "|".join(values)
                page.wait_for_timeout(150)
                readout = page.locator(f"#{fig['id']}-readout").inner_text()
                assert readout == fig["readouts"][key], (fig["id"], control["id"], key)
                assert view.get_attribute("data-state") == key
                assert view.inner_html() != before, (fig["id"], control["id"])
                # Back to the default state before the next control.
                page.keyboard.press("ArrowLeft" if index > control["default"] else "ArrowRight")
                page.wait_for_timeout(100)
                assert view.get_attribute("data-state") == "|".join(
                    c["values"][c["default"]] for c in fig["controls"]
                )
        assert not errors, errors
    finally:
        context.close()


def test_every_control_is_reached_by_tab_with_a_visible_focus(browser, lesson_build):
    manifest = json.loads((lesson_build.folder / "manifest.json").read_text())
    want = {c["id"] for f in manifest["figures"] for c in f["controls"]}
    context, page, _, _ = _open(browser, lesson_build.index, "light")
    try:
        seen: set[str] = set()
        for _ in range(400 + 4 * len(want)):
            page.keyboard.press("Tab")
            info = page.evaluate(
                """() => { const el = document.activeElement;
                  const s = getComputedStyle(el);
                  return {id: el.id, name: el.name || '', outline: s.outlineStyle,
                          width: parseFloat(s.outlineWidth) || 0}; }"""
            )
            ident = info["id"] if info["id"] in want else info["name"]
            if ident in want:
                assert info["outline"] != "none" and info["width"] >= 2, (ident, info)
                seen.add(ident)
            if seen == want:
                break
        assert seen == want, sorted(want - seen)
    finally:
        context.close()


def _layout(page) -> list[dict]:
    """Per screen: the top of its heading and of its first figure, in page pixels."""
    return page.evaluate(
        """() => [...document.querySelectorAll('section.screen')].map(s => {
             const h = s.querySelector('h2').getBoundingClientRect().top + scrollY;
             const f = s.querySelector('figure.fig');
             return {id: s.id, heading: h,
                     figure: f ? f.getBoundingClientRect().top + scrollY : null}; })"""
    )


def test_each_screen_shows_its_figure_first_and_folds_its_evidence(browser, lesson_build):
    """A learner meets the question, a short intuition and the main figure within the first
    screenful (900 px at 960 px wide); the checks and corrections wait, folded, until asked."""
    manifest = json.loads((lesson_build.folder / "manifest.json").read_text())
    context = browser.new_context(viewport={"width": 960, "height": 900})
    page = context.new_page()
    try:
        page.goto(lesson_build.index.as_uri())
        page.wait_for_timeout(500)
        for s in _layout(page):
            assert s["figure"] is not None and s["figure"] - s["heading"] <= 900, s
        claims = page.locator("li.claim")
        assert claims.count() == sum(len(s["claims"]) for s in manifest["screens"])
        assert all(not c.is_visible() for c in claims.all())
        for details in page.locator("details.evidence").all():
            details.locator("summary").click()
        assert all(c.is_visible() for c in claims.all())
        # The claim ids live only in the folded part.
        ids = page.evaluate(
            "() => [...document.querySelectorAll('code')].filter(c => "
            "!c.closest('details.evidence') && /^[a-z]+\\\\.[a-z_.]+$/.test(c.textContent))"
            ".map(c => c.textContent)"
        )
        assert ids == [], ids
    finally:
        context.close()


def test_every_exercise_reveals_what_posemb_computed_and_shows_its_state(browser, lesson_build):
    manifest = json.loads((lesson_build.folder / "manifest.json").read_text())
    exercises = manifest["exercises"]
    assert sorted(e["screen"] for e in exercises) == [s["number"] for s in manifest["screens"]]
    figures = {f["id"]: f for f in manifest["figures"]}
    context, page, errors, _ = _open(browser, lesson_build.index, "light")
    try:
        for e in exercises:
            box = page.locator(f"#exercise-{e['screen']}")
            answer = box.locator(".answer")
            assert not answer.is_visible()
            box.locator("summary").click()
            assert answer.is_visible() and answer.inner_text() == e["answer"]
            box.locator("button.show").click()
            page.wait_for_timeout(200)
            view = page.locator(f"#{e['figure']}-view")
            assert view.get_attribute("data-state") == e["state"], e
            readout = page.locator(f"#{e['figure']}-readout").inner_text()
            assert readout == figures[e["figure"]]["readouts"][e["state"]]
        assert not errors, errors
    finally:
        context.close()


@pytest.mark.parametrize("width", [400, 320])
def test_a_phone_sized_window_scrolls_only_down_and_keeps_text_readable(
    browser, lesson_build, width
):
    """320 px is 1280 px at 400% zoom (WCAG 1.4.10): the page reflows, whatever cannot shrink
    scrolls inside its card and takes focus, and axe finds nothing, every fold open."""
    context = browser.new_context(viewport={"width": width, "height": 800})
    page = context.new_page()
    try:
        page.goto(lesson_build.index.as_uri())
        page.wait_for_timeout(800)
        assert page.locator("details").count() > 40
        unopened = open_every_fold(page)
        assert not unopened, unopened
        page.wait_for_timeout(300)
        scroll = page.evaluate("() => document.documentElement.scrollWidth")
        assert scroll == width, scroll
        violations = axe_violations(page)
        assert not violations, summary(violations)
        # A narrowed chart keeps the ends of its axis (the lab's longest length was dropped).
        ticks = page.evaluate(
            "() => [...document.querySelectorAll('#fig-lab-loss-view .role-axis-label text')]"
            ".filter(t => t.getAttribute('opacity') !== '0').map(t => t.textContent)"
        )
        assert {"64", "1,024"} <= set(ticks), ticks
        small = page.evaluate(SMALL_TEXT)
        assert not small, small[:10]
        cut = page.evaluate(CUT_TEXT)
        assert not cut, cut[:10]
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        for anchor in page.eval_on_selector_all("section.screen", "els => els.map(e => e.id)"):
            _save_screen(page, anchor, ARTIFACTS / f"{anchor}-{width}px.png")
    finally:
        context.close()


def _near_white(png: bytes) -> float:
    import io

    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    pixels = list(img.getdata())
    return sum(1 for r, g, b in pixels if min(r, g, b) > 235) / len(pixels)


def test_dark_mode_draws_no_white_boxes(browser, lesson_build):
    manifest = json.loads((lesson_build.folder / "manifest.json").read_text())
    context, page, errors, _ = _open(browser, lesson_build.index, "dark")
    try:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        for fig in manifest["figures"]:
            if fig["kind"] == "img":
                continue  # the parchment is a cream picture on purpose
            shot = page.locator(f"#{fig['id']}").screenshot()
            assert _near_white(shot) < 0.05, fig["id"]
        for s in manifest["screens"]:
            _save_screen(page, s["anchor"], ARTIFACTS / f"{s['anchor']}-dark.png")
        assert not errors, errors
    finally:
        context.close()
