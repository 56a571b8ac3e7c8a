"""What the browser tests share: Debian's Chromium, and axe-core's WCAG 2.1 A/AA audit.

axe-core is vendored from its npm release in ``tests/vendor/axe-core/`` by
``scripts/vendor_docs_assets.py`` (checked here against the sha256 recorded there), so the
audit runs offline and every machine runs the same rules.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pathlib
import shutil
import textwrap

import pytest

AXE = pathlib.Path(__file__).resolve().parent / "vendor" / "axe-core"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WCAG_21_AA = ("wcag2a", "wcag2aa", "wcag21a", "wcag21aa")
"""axe's tags for every success criterion of WCAG 2.0 and 2.1 at levels A and AA."""


def browser_or_skip() -> str:
    """The Chromium to drive; skips without it or Playwright (fails under ``CI=true``)."""
    missing = []
    if CHROMIUM is None:
        missing.append("Debian's chromium (apt-get install chromium)")
    if importlib.util.find_spec("playwright") is None:
        missing.append("the playwright package")
    if missing:
        message = "no browser test without " + " and ".join(missing)
        if os.environ.get("CI") == "true":
            pytest.fail(message + " (.ci/run installs them)")
        pytest.skip(message)
    assert CHROMIUM is not None
    return CHROMIUM


def axe_script() -> pathlib.Path:
    """The vendored ``axe.min.js``, after checking it is the recorded release."""
    record = json.loads((AXE / "VERSION.json").read_text())
    script = AXE / "axe.min.js"
    digest = hashlib.sha256(script.read_bytes()).hexdigest()
    assert digest == record["sha256"]["axe.min.js"], "tests/vendor/axe-core was edited"
    return script


def axe_violations(page, include: str | None = None) -> list[dict]:
    """Every WCAG 2.1 A/AA violation axe-core finds on ``page`` (or inside ``include``, a CSS
    selector), whatever its impact."""
    if not page.evaluate("() => typeof window.axe === 'object'"):
        page.add_script_tag(path=str(axe_script()))
    return page.evaluate(
        """async ([include, tags]) => (await axe.run(include ? {include: [include]} : document,
             {runOnly: {type: 'tag', values: tags}, resultTypes: ['violations']})).violations""",
        [include, list(WCAG_21_AA)],
    )


def summary(violations: list[dict]) -> list[tuple[str, str, int, list]]:
    """Violations as (rule, help, count, first targets): what an assertion message shows."""
    return [
        (v["id"], v["help"], len(v["nodes"]), [n["target"] for n in v["nodes"][:3]])
        for v in violations
    ]


def open_every_fold(page, selector: str = "details") -> list[str]:
    """Open every closed ``selector`` fold as a reader does, one after another, by a click on
    its summary, in one round trip (Playwright's click per fold took 7.5 s for the lesson's
    45 at 320 px). Each fold's toggle handlers run, and a frame is drawn, before the next
    summary is checked, so a layout an opened fold makes is the one the next click meets.
    Returns the folds whose summary a reader could not click (no box, or another element on
    top of its centre: what Playwright's click refuses) or that a click left closed."""
    return page.evaluate(
        """async (selector) => {
          const failed = [];
          const frame = () => new Promise((r) => requestAnimationFrame(() => r()));
          for (const fold of document.querySelectorAll(selector)) {
            if (fold.open) continue;
            const summary = fold.querySelector(':scope > summary');
            const name = (summary ? summary.textContent : fold.outerHTML).trim().slice(0, 60);
            if (!summary) { failed.push('no summary: ' + name); continue; }
            summary.scrollIntoView({block: 'center'});
            await frame();
            const r = summary.getBoundingClientRect();
            const top = r.width && r.height
              ? document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2) : null;
            if (!top || !summary.contains(top)) { failed.push('covered: ' + name); continue; }
            const toggled = new Promise((r) => fold.addEventListener('toggle', r, {once: true}));
            summary.click();
            if (!fold.open) { failed.push('still closed: ' + name); continue; }
            await toggled;
            await frame();
          }
          return failed;
        }""",
        selector,
    )


SMALL_TEXT = """() => [...document.querySelectorAll('main p, main li, main td, main th, '
     + 'main figcaption, main summary, .view svg text')]
   .filter(el => el.getClientRects().length && el.textContent.trim())
   .map(el => {
     let px = parseFloat(getComputedStyle(el).fontSize);
     if (el instanceof SVGElement) {
       const svg = el.ownerSVGElement, vb = svg.viewBox.baseVal;
       px *= vb && vb.width ? svg.getBoundingClientRect().width / vb.width : 1;
     }
     return {text: el.textContent.trim().slice(0, 40), px};
   }).filter(x => x.px < 9.95)"""
"""Script: text rendered under 10 px (a scaled-down SVG's text at its scale)."""


CUT_TEXT = textwrap.dedent(
    """() => [...document.querySelectorAll('.view svg text')]
       .filter(t => t.textContent.trim() && t.getAttribute('opacity') !== '0'
                    && t.getClientRects().length)
       .map(t => { const r = t.getBoundingClientRect();
                   const s = t.ownerSVGElement.getBoundingClientRect();
                   return {fig: t.closest('figure').id, text: t.textContent.slice(0, 40),
                           out: Math.max(s.left - r.left, r.right - s.right,
                                         s.top - r.top, r.bottom - s.bottom)}; })
       .filter(x => x.out > 1)"""
)
"""Script: chart text drawn partly outside its SVG, where no scrolling can reach it."""
