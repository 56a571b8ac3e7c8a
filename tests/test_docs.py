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


def test_the_site_opens_offline_in_a_browser(site):
    """Every page from file://: no console error, no request but the site's own files, every
    link to a page or an anchor of the site resolving, and the lesson loading inside it."""
    from lesson.test_browser import _browser_or_skip

    chromium = _browser_or_skip()
    from playwright.sync_api import sync_playwright

    # 404.html is for a web server (it links the site's assets from /, wherever it is shown).
    pages = sorted(
        p
        for p in site.rglob("*.html")
        if "lesson" not in p.relative_to(site).parts and p.name != "404.html"
    )
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
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
            links = page.evaluate(
                "() => [...document.querySelectorAll('a[href]')].map(a => a.href)"
            )
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
        browser.close()
    assert not errors, errors[:10]
    assert all(u.startswith(("file:", "data:", "blob:")) for u in requests), [
        u for u in requests if not u.startswith(("file:", "data:", "blob:"))
    ][:10]
    assert not broken, broken[:20]
    assert hits > 0


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
