"""What axe-core cannot see on the lesson page: what a chart says to a screen reader, where
focus goes, what a control announces, the values behind a chart, chart colours, and print.

axe checks the page's HTML (names, roles, contrast of HTML text, focusable scroll regions); it
reads no SVG colour and no chart description, and it never prints. Each test here drives the
page in Debian's Chromium as a reader would.
"""

from __future__ import annotations

import json

import pytest

from browser import CUT_TEXT, SMALL_TEXT
from posemb.lab import style


def _page(browser, lesson_build, scheme="light", width=1280):
    context = browser.new_context(color_scheme=scheme, viewport={"width": width, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(lesson_build.index.as_uri())
    page.wait_for_load_state("load")
    page.wait_for_timeout(600)  # vega views render asynchronously
    return context, page, errors


@pytest.fixture(scope="module")
def manifest(lesson_build):
    return json.loads((lesson_build.folder / "manifest.json").read_text())


def _names(page, view: str) -> dict:
    """The view's role and accessible name as Chromium computes them, and the text a screen
    reader could reach inside it (not under aria-hidden)."""
    return page.evaluate(
        """(sel) => { const v = document.querySelector(sel);
             const exposed = [...v.querySelectorAll('text, title, desc')]
               .filter(t => !t.closest('[aria-hidden=true]') && t.textContent.trim());
             return {role: v.getAttribute('role'), label: v.getAttribute('aria-label'),
                     exposed: exposed.length}; }""",
        view,
    )


def test_every_chart_is_named_by_what_it_shows_and_reads_out_nothing_else(
    browser, lesson_build, manifest
):
    """vega-embed replaces the view's role and label with its own; the spec's description
    (the alt text and the state's readout) is what it writes, and the drawing is hidden."""
    context, page, errors = _page(browser, lesson_build)
    try:
        for fig in manifest["figures"]:
            if fig["kind"] == "img":
                continue
            view = f"#{fig['id']}-view"
            got = _names(page, view)
            readout = fig["readouts"][fig["default_state"]]
            role = "graphics-document" if fig["kind"] == "vega" else "img"
            assert got == {"role": role, "label": f"{fig['alt']} Shown: {readout}", "exposed": 0}
        # A new state is a new description.
        page.focus("#fig-lab-loss input[type=radio]:checked")
        page.keyboard.press("ArrowRight")
        page.wait_for_timeout(300)
        fig = next(f for f in manifest["figures"] if f["id"] == "fig-lab-loss")
        label = _names(page, "#fig-lab-loss-view")["label"]
        assert label.endswith(fig["readouts"]["all positions"]), label
        assert not errors, errors
    finally:
        context.close()


def test_every_control_announces_its_change_once(manifest):
    """A control that moves changes the readout, the one live region a screen reader hears (a
    slider's own value is its aria-valuetext, and its visible echo is not live)."""
    for fig in manifest["figures"]:
        controls, readouts = fig["controls"], fig["readouts"]
        for key, text in readouts.items():
            values = key.split("|")
            for i, c in enumerate(controls):
                for other in c["values"]:
                    if other == values[i]:
                        continue
                    moved = "|".join([*values[:i], other, *values[i + 1 :]])
                    assert readouts[moved] != text, (fig["id"], c["id"], key, moved)


def test_the_sliders_echo_is_not_a_second_live_region(browser, lesson_build):
    context, page, _ = _page(browser, lesson_build)
    try:
        live = page.evaluate(
            "() => [...document.querySelectorAll('output')].map(o => o.getAttribute('aria-live'))"
        )
        assert live and set(live) == {"off"}
        readouts = page.locator(".readout[aria-live=polite]").count()
        assert readouts == page.locator("figure.fig .view").count()
    finally:
        context.close()


def test_a_show_button_takes_focus_to_the_figure_it_names(browser, lesson_build, manifest):
    titles = {f["id"]: f["title"] for f in manifest["figures"]}
    context, page, errors = _page(browser, lesson_build, width=960)
    try:
        buttons = page.locator("button.show")
        names = [b.text_content() for b in buttons.all()]
        assert len(set(names)) == len(names) == len(manifest["exercises"])
        for e in manifest["exercises"]:
            box = page.locator(f"#exercise-{e['screen']}")
            box.locator("summary").click()
            button = box.locator("button.show")
            assert button.inner_text().endswith(titles[e["figure"]]), button.inner_text()
            button.focus()
            page.keyboard.press("Enter")
            page.wait_for_timeout(200)
            where = page.evaluate(
                """() => { const el = document.activeElement; const r = el.getBoundingClientRect();
                     return {id: el.id, top: r.top, name: el.getAttribute('aria-labelledby')}; }"""
            )
            assert where["id"] == e["figure"] and abs(where["top"]) < 5, (e["figure"], where)
            assert where["name"] == f"{e['figure']}-title"
            # The next Tab stays with the figure just shown.
            page.keyboard.press("Tab")
            inside = page.evaluate(
                "(id) => document.getElementById(id).contains(document.activeElement)",
                e["figure"],
            )
            assert inside, e["figure"]
        assert not errors, errors
    finally:
        context.close()


def test_a_charts_values_are_in_a_table_that_follows_its_state(browser, lesson_build):
    """What a sighted reader reads from hovering: the tooltips' fields over the state's rows."""
    context, page, errors = _page(browser, lesson_build)
    try:
        box = page.locator("details.values[data-fig='fig-lab-loss']")
        box.locator("summary").click()
        page.wait_for_timeout(200)
        table = box.locator("table")
        heads = table.locator("thead th").all_inner_texts()
        assert heads[:3] == ["variant", "length", "loss"], heads
        first = table.locator("tbody").inner_text()
        assert table.locator("tbody tr").count() > 10
        page.focus("#fig-lab-loss input[type=radio]:checked")
        page.keyboard.press("ArrowRight")
        page.wait_for_timeout(300)
        assert table.locator("tbody").inner_text() != first  # the other state's losses
        # What tells rows apart leads: a facet's panel, the field a layer is filtered on.
        for fig, lead in (("fig-permutation", "panel"), ("fig-trained-accuracy", "kind")):
            other = page.locator(f"details.values[data-fig='{fig}']")
            other.locator("summary").click()
            page.wait_for_timeout(200)
            assert other.locator("thead th").first.inner_text() == lead, fig
        # Numbers as the tooltips format them.
        counts = page.locator("details.values[data-fig='fig-param-counts']")
        counts.locator("summary").click()
        page.wait_for_timeout(200)
        assert "131,072" in counts.locator("tbody").inner_text()
        # Every chart has one, with rows.
        for box in page.locator("details.values").all():
            box.locator("summary").click()
        page.wait_for_timeout(300)
        empty = page.evaluate(
            """() => [...document.querySelectorAll('details.values')]
                 .filter(d => !d.querySelector('tbody tr')).map(d => d.dataset.fig)"""
        )
        assert empty == [], empty
        assert not errors, errors
    finally:
        context.close()


_COLOURS = """(pairs) => {
  const hex = c => { const m = c.match(/\\d+(\\.\\d+)?/g).map(Number);
                     return '#' + m.slice(0, 3).map(x => x.toString(16).padStart(2, '0'))
                                   .join('').toUpperCase(); };
  const out = [];
  for (const el of document.querySelectorAll('.view svg [fill], .view svg [stroke]')) {
    if (!el.getClientRects().length) continue;
    for (const attr of ['fill', 'stroke']) {
      const given = (el.getAttribute(attr) || '').toUpperCase();
      if (!(given in pairs)) continue;
      out.push({fig: el.closest('figure').id, attr, given,
                shown: hex(getComputedStyle(el)[attr]), text: el.tagName === 'text'});
    }
  }
  return out; }"""


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_chart_colours_read_on_the_card_in_both_schemes(browser, lesson_build, scheme):
    """axe reads no SVG: every palette colour a chart draws is shown, in this scheme, as the
    colour that meets 4.5:1 (text) or 3:1 (lines, marks) on the card."""
    pairs = style.dark_pairs()
    card = style.CARDS[scheme][1]
    context, page, _ = _page(browser, lesson_build, scheme=scheme)
    try:
        drawn = page.evaluate(_COLOURS, pairs)
        assert len({d["fig"] for d in drawn}) >= 10, drawn[:5]
        for d in drawn:
            want = d["given"] if scheme == "light" else pairs[d["given"]]
            assert d["shown"] == want, d
            assert style.contrast(d["shown"], card) >= (4.5 if d["text"] else 3.0), d
    finally:
        context.close()


def test_print_opens_the_folds_keeps_figures_whole_and_prints_light(browser, lesson_build):
    """Printing from dark mode: light colours (dark text, no dark card), every answer and check
    opened on beforeprint and folded again after, figures never split across pages."""
    context, page, errors = _page(browser, lesson_build, scheme="dark")
    try:
        closed = page.locator("details:not([open]):not(.values)").count()
        assert closed >= 18
        # Chromium fires beforeprint and afterprint around page.pdf(), as around a real print:
        # what was still folded while printing is recorded after page.js has had its turn.
        page.evaluate(
            """() => window.addEventListener('beforeprint', () => { window.foldedWhilePrinting =
                 document.querySelectorAll('details:not([open]):not(.values)').length; })"""
        )
        pdf = page.pdf(format="A4")
        assert pdf.startswith(b"%PDF") and len(pdf) > 100_000
        assert page.evaluate("() => window.foldedWhilePrinting") == 0
        assert page.locator("details:not([open]):not(.values)").count() == closed
        # What the printed page looks like, in the print media, folds opened.
        page.emulate_media(media="print")
        page.evaluate("() => window.dispatchEvent(new Event('beforeprint'))")
        looks = page.evaluate(
            """() => { const s = el => getComputedStyle(document.querySelector(el));
                 const tick = document.querySelector('.view svg text');
                 return {fg: s('body').color, bg: s('html').backgroundColor,
                         tick: getComputedStyle(tick).fill,
                         figure: s('figure.fig').breakInside,
                         shown: s('.answer').display, buttons: s('button.show').display}; }"""
        )
        assert looks["bg"] == "rgb(255, 255, 255)", looks
        assert looks["fg"] in ("rgb(29, 29, 31)", "rgb(0, 0, 0)"), looks
        assert looks["tick"] in ("rgb(0, 0, 0)", "rgb(29, 29, 31)"), looks
        assert looks["figure"] == "avoid" and looks["shown"] != "none", looks
        assert page.locator(".control output").first.is_visible()  # a control prints its value
        page.evaluate("() => window.dispatchEvent(new Event('afterprint'))")
        assert page.locator("details:not([open]):not(.values)").count() == closed
        assert not errors, errors
    finally:
        context.close()


def test_a_chart_is_drawn_again_for_a_narrower_window_keeping_its_text_readable(
    browser, lesson_build
):
    """Zooming after the page loaded narrows every card: charts are fitted again, not scaled
    down with their text (WCAG 1.4.4 and 1.4.10)."""
    context, page, errors = _page(browser, lesson_build)
    try:
        for width in (640, 400, 320):
            page.set_viewport_size({"width": width, "height": 900})
            page.wait_for_timeout(1500)
            small = page.evaluate(SMALL_TEXT)
            assert not small, (width, small[:10])
            cut = page.evaluate(CUT_TEXT)
            assert not cut, (width, cut[:10])
            assert page.evaluate("() => document.documentElement.scrollWidth") == width
        assert not errors, errors
    finally:
        context.close()
