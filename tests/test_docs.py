"""The documentation: the README front door and the site `make docs` builds.

The site is built strictly (a warning, a broken link or a docstring griffe cannot read fails
it), every Python block on every page runs as written, the tables that mirror the code are
held to it, and a real browser opens every page from file:// with the network unused.
"""

import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.glob("*.md"))
ARTIFACTS = ROOT / "test-artifacts"


def _text(path: pathlib.Path) -> str:
    return path.read_text(encoding="utf-8")


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.name)
def test_every_python_block_runs(page):
    blocks = re.findall(r"```python\n(.*?)```", _text(page), re.S)
    for block in blocks:
        exec(compile(block, str(page), "exec"), {})


def test_the_readme_is_a_short_front_door():
    text = _text(README)
    assert len(text.splitlines()) <= 200
    for page in PAGES:
        if page.name not in ("changelog.md",):
            assert f"(docs/{page.name})" in text, page.name


def test_the_lesson_page_lists_every_claim():
    from posemb.lesson import claims

    text = _text(DOCS / "lesson.md")
    missing = [c.id for c in claims.CLAIMS if f"(`{c.id}`)" not in text]
    assert not missing


def test_the_interop_page_lists_every_hf_family():
    from posemb.hf import families

    text = _text(DOCS / "hf.md")
    missing = [
        f.name for f in (*families.FAMILIES, families.GENERIC) if f"| {f.name} |" not in text
    ]
    assert not missing


def test_the_layout_section_names_every_module():
    """The design page's layout of the code is the tree: every module of src/posemb is named
    there, a sub-package's modules in its entry."""
    text = _text(DOCS / "design.md")
    block = text.split("## Layout of the code", 1)[1].split("\n## ", 1)[0]
    tree = block.split("src/posemb/\n", 1)[1]
    entries = re.split(r"\n(?=  \S)", tree)  # one per top-level name, continuation lines joined
    by_package = {e.split()[0].rstrip("/"): e for e in entries if e.split()}
    missing = []
    for path in sorted((ROOT / "src" / "posemb").rglob("*.py")):
        rel = path.relative_to(ROOT / "src" / "posemb")
        if rel.name == "__init__.py" and len(rel.parts) > 1:
            continue  # a package's __init__ is its entry
        if len(rel.parts) == 1:
            if not re.search(rf"\b{re.escape(rel.name)}\b", tree):
                missing.append(str(rel))
        elif rel.name not in by_package.get(rel.parts[0], ""):
            missing.append(str(rel))
    assert not missing, missing


_SHAPE = re.compile(r"\(([a-z_0-9]+|\.\.\.)(, ?([a-z_0-9/ +*]+|\.\.\.))*,?\)|shape|scalar")


def test_every_public_name_is_documented_with_its_shapes():
    """Every function and class in posemb.__all__ has a docstring; where it takes or returns
    tensors, the docstring gives their shapes."""
    import inspect

    import torch

    import posemb

    undocumented, shapeless = [], []
    for name in posemb.__all__:
        obj = getattr(posemb, name)
        if not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue
        doc = inspect.getdoc(obj) or ""
        if not doc.strip():
            undocumented.append(name)
            continue
        target = obj.forward if inspect.isclass(obj) and hasattr(obj, "forward") else obj
        try:
            hints = " ".join(str(v) for v in inspect.signature(target).parameters.values())
            hints += str(inspect.signature(target).return_annotation)
        except (TypeError, ValueError):
            hints = ""
        if "Tensor" in hints:
            docs = doc + (inspect.getdoc(target) or "")
            if not _SHAPE.search(docs):
                shapeless.append(name)
    assert torch  # the hints above name torch.Tensor
    assert not undocumented and not shapeless, (undocumented, shapeless)


def test_the_vendored_search_shim_is_the_recorded_release():
    out = DOCS / "assets" / "vendor" / "iframe-worker"
    record = json.loads(_text(out / "VERSION.json"))
    for name, digest in record["sha256"].items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest, name


@pytest.fixture(scope="session")
def site(tmp_path_factory, lesson_build):
    """The site built strictly, as `make docs` builds it, with this session's lesson inside."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    out = tmp_path_factory.mktemp("site") / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, env=env,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    assert done.returncode == 0, done.stderr[-4000:]
    assert "WARNING" not in done.stderr, done.stderr[-4000:]
    shutil.copytree(lesson_build.folder, out / "lesson")
    pages = sorted(
        p for p in out.rglob("*.html") if p.parent.name != "lesson" and p.name != "404.html"
    )
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    ARTIFACTS.mkdir(exist_ok=True)
    report = {"pages": len(pages), "build_seconds": round(seconds, 1), "bytes": size}
    (ARTIFACTS / "docs.json").write_text(json.dumps(report, indent=2))
    return out


def test_the_site_holds_no_bytecode_and_no_build_hook(site):
    # mkdocs imports docs/hooks.py (leaving docs/__pycache__) and copied both into the site.
    strays = [p.relative_to(site).as_posix() for p in site.rglob("*")
              if p.name == "__pycache__" or p.suffix in (".py", ".pyc")]  # fmt: skip
    assert strays == []


def test_the_cli_page_is_the_parser(site):
    from posemb import cli

    html = _text(site / "cli.html")
    for name in cli.build_parser()._subparsers._group_actions[0].choices:
        assert f"posemb {name}" in html, name


def test_the_site_opens_offline_in_a_browser(site, browser):
    """Every page from file://: no console error, no request but the site's own files, every
    link to a page or an anchor of the site resolving, and the lesson loading inside it."""
    # 404.html is for a web server (it links the site's assets from /, wherever it is shown).
    pages = sorted(
        p
        for p in site.rglob("*.html")
        if "lesson" not in p.relative_to(site).parts and p.name != "404.html"
    )
    context = browser.new_context()
    page = context.new_page()
    errors, requests = [], []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: requests.append(r.url))
    broken = []
    for path in [*pages, site / "lesson" / "index.html"]:
        page.goto(path.as_uri())
        page.wait_for_load_state("load")
        links = page.evaluate("() => [...document.querySelectorAll('a[href]')].map(a => a.href)")
        for href in links:
            if not href.startswith("file:"):
                continue
            target, _, anchor = href.partition("#")
            file = pathlib.Path(target.removeprefix("file://"))
            if file.is_dir():
                file = file / "index.html"
            if not file.exists() or (
                anchor and file.suffix == ".html" and f'id="{anchor}"' not in _text(file)
            ):
                broken.append((path.name, href))
    # The lesson is one of the navigation's entries, on every page.
    page.goto((site / "index.html").as_uri())
    page.click("nav >> text=The lesson page")
    page.wait_for_load_state("load")
    assert page.url.endswith("lesson/index.html")
    assert page.locator("section.screen").count() == 9
    # Search works from disk (the vendored worker shim, the inlined index).
    page.goto((site / "index.html").as_uri())
    page.wait_for_timeout(1000)
    page.keyboard.press("s")
    page.keyboard.type("rotary_from_config")
    page.wait_for_timeout(1500)
    hits = page.locator(".md-search-result__item").count()
    context.close()
    assert not errors, errors[:10]
    assert all(u.startswith(("file:", "data:", "blob:")) for u in requests), [
        u for u in requests if not u.startswith(("file:", "data:", "blob:"))
    ][:10]
    assert not broken, broken[:20]
    assert hits > 0


# WCAG 2.1 AA (issue 36). Every page mkdocs builds from docs/ is opened in light and dark mode
# at 1280 px; the API page (wide signatures and tables) and the front page also at 320 px, the
# width 1.4.10 Reflow names, in light mode only: the palette does not change with the width, nor
# the layout with the scheme, and axe takes 10 s over the API page's 23,000 elements. The lesson
# page inside the site is the lesson tests' to audit, and 404.html is a web server's.
SITE_PAGES = [p.with_suffix(".html").name for p in PAGES]
SITE_VIEWS = [(name, scheme, 1280) for name in SITE_PAGES for scheme in ("light", "dark")] + [
    ("api.html", "light", 320),
    ("index.html", "light", 320),
]


@pytest.fixture(scope="module", params=SITE_VIEWS, ids=lambda v: "-".join(map(str, v)))
def site_view(request, site, browser):
    """One page of the site open in one scheme and width. Module scope: pytest runs every test
    of a view before opening the next, so each page loads once per view (the API page takes
    3 s)."""
    name, scheme, width = request.param
    context = browser.new_context(color_scheme=scheme, viewport={"width": width, "height": 900})
    page = context.new_page()
    page.goto((site / name).as_uri())
    yield page
    context.close()


def test_the_site_passes_axe_wcag_21_aa(site_view):
    from browser import axe_violations, summary

    violations = axe_violations(site_view)
    assert not violations, summary(violations)


# Every token class the theme colours (material's main.css: Pygments' short names), one line
# each, and again on a highlighted line (hl_lines), whose background differs. The pages use
# only some of them; the next page that shows a diff or a shell prompt uses the others.
_SYNTAX_PROBE = """(classes) => {
  const line = classes.map((name) => `<span class="${name}">token_${name}</span>`).join('\\n');
  const block = document.createElement('div');
  block.className = 'highlight';
  block.id = 'syntax-probe';
  block.innerHTML = `<pre><code>${line}\\n<span class="hll">${line}</span></code></pre>`;
  document.querySelector('.md-content article').append(block);
}"""


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_every_syntax_colour_of_the_site_reads_at_4_5_to_1(site, browser, scheme):
    from browser import axe_violations, summary

    css = " ".join(_text(f) for f in site.glob("assets/**/*.css"))
    classes = sorted(set(re.findall(r"\.highlight \.([\w-]+)", css)) - {"hll"})
    assert len(classes) > 50  # Pygments' tokens, as material names them
    context = browser.new_context(color_scheme=scheme)
    page = context.new_page()
    page.goto((site / "index.html").as_uri())
    page.evaluate(_SYNTAX_PROBE, classes)
    violations = axe_violations(page, include="#syntax-probe")
    context.close()
    assert not violations, summary(violations)


# axe tags these best-practice, so the WCAG run above leaves them out; they are what a screen
# reader's landmark and dialog lists show (material's table of contents once nested a named
# <nav> per heading, the same class names twice on the API page, and its search was unnamed).
_BEST_PRACTICE = """async () => {
  const rules = axe.getRules(['best-practice']).map(r => r.ruleId)
    .filter(id => id.startsWith('landmark-') || id === 'aria-dialog-name');
  return (await axe.run(document, {runOnly: {type: 'rule', values: rules},
                                   resultTypes: ['violations']})).violations;
}"""


def test_the_sites_landmarks_are_unique_and_its_dialogs_named(site_view):
    from browser import axe_script, summary

    if not site_view.evaluate("() => typeof window.axe === 'object'"):
        site_view.add_script_tag(path=str(axe_script()))
    violations = site_view.evaluate(_BEST_PRACTICE)
    assert not violations, summary(violations)


def test_every_site_page_has_one_h1(site_view):
    """One h1 per page: the page's title, the top of its outline (index.md had three)."""
    titles = site_view.locator("h1").all_inner_texts()
    assert len(titles) == 1, titles


# A link in running text must differ from the text by more than colour (1.4.1). Running text:
# the nearest enclosing block holds text besides the link; headings are titles, not running
# text (their permalink appears on hover). axe checks this by colour contrast only.
_PLAIN_LINKS = """() => {
  const blockOf = (el) => {
    let e = el.parentElement;
    while (e && /^(inline|contents)/.test(getComputedStyle(e).display)) e = e.parentElement;
    return e;
  };
  return [...document.querySelectorAll('.md-content a[href]')].filter((a) => {
    const block = blockOf(a);
    return a.getClientRects().length && block && !a.closest('h1, h2, h3, h4, h5, h6')
      && block.textContent.trim() !== a.textContent.trim()
      && !getComputedStyle(a).textDecorationLine.includes('underline');
  }).map((a) => a.outerHTML.slice(0, 120));
}"""


def test_links_in_the_sites_running_text_are_underlined(site_view):
    assert site_view.evaluate(_PLAIN_LINKS) == []


# Every dialog's accessible name, as aria-labelledby or aria-label give it.
_DIALOG_NAMES = """() => [...document.querySelectorAll('[role="dialog"], dialog')].map((d) => {
  const ids = (d.getAttribute('aria-labelledby') || '').split(/\\s+/).filter(Boolean);
  const by = ids.map((id) => document.getElementById(id)?.textContent || '').join(' ');
  return (by || d.getAttribute('aria-label') || '').trim();
})"""


def test_the_sites_search_dialog_is_named(site_view):
    names = site_view.evaluate(_DIALOG_NAMES)
    assert names and all(names), names  # material's search is one


# What scrolls inside the content (a code block, a wide table, a signature) and does scroll
# here: each must take the keyboard focus (2.1.1; then the arrow keys scroll it) and show it
# (2.4.7). Focusing each one after a key press is what a keyboard user's Tab does to it.
_UNREACHABLE_SCROLLERS = """() => {
  const bad = [];
  for (const el of document.querySelectorAll('.md-content *')) {
    const style = getComputedStyle(el);
    if (!/auto|scroll/.test(style.overflowX + ' ' + style.overflowY)) continue;
    if (el.scrollWidth <= el.clientWidth && el.scrollHeight <= el.clientHeight) continue;
    el.focus();
    const ring = getComputedStyle(el).outlineStyle;
    if (el.tabIndex < 0 || document.activeElement !== el || ring === 'none') {
      bad.push([el.outerHTML.slice(0, 100), el.tabIndex, ring]);
    }
  }
  return bad;
}"""


def test_what_scrolls_in_the_site_takes_the_keyboard_focus(site_view):
    site_view.keyboard.press("Shift")  # the browser then shows focus as for the Tab key
    assert site_view.evaluate(_UNREACHABLE_SCROLLERS) == []


def test_make_docs_refuses_a_site_folder_holding_a_users_files(tmp_path):
    """mkdocs empties its --site-dir; make docs builds elsewhere and refuses such a folder
    before building anything."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "thesis.tex").write_text("important")
    script = ROOT / "scripts" / "build_docs.py"
    done = subprocess.run(
        [sys.executable, str(script), str(site)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and "did not write (thesis.tex)" in done.stderr, done.stderr
    assert sorted(p.name for p in site.iterdir()) == ["thesis.tex"]


def test_make_docs_takes_over_an_earlier_site_but_not_a_users_file_in_it(tmp_path, monkeypatch):
    """A site an earlier make docs left (no manifest) is taken over file by file: only what this
    build writes; a user's notes in it are refused (they were adopted, then pruned, before)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_docs", ROOT / "scripts" / "build_docs.py")
    build_docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_docs)
    page = '<html><head><meta name="generator" content="mkdocs-1.6"></head></html>'

    def fake_build(into):
        (into / "lesson").mkdir(parents=True)
        (into / "index.html").write_text(page + "new")
        (into / "lesson" / "index.html").write_text("lesson")
        return {"index.html", "lesson/index.html"}

    monkeypatch.setattr(build_docs, "_build", fake_build)
    site = tmp_path / "site"
    (site / "lesson").mkdir(parents=True)
    (site / "index.html").write_text(page)
    (site / "lesson" / "index.html").write_text("old lesson")
    (site / "my-notes.md").write_text("mine")
    assert build_docs.main([str(site)]) == 2
    assert (site / "my-notes.md").read_text() == "mine"
    assert (site / "index.html").read_text() == page  # nothing written
    (site / "my-notes.md").unlink()
    assert build_docs.main([str(site)]) == 0
    assert (site / "index.html").read_text() == page + "new"
