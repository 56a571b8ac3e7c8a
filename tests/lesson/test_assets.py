"""posemb.lesson.assets: the vendored KaTeX and Vega files, checked and made inline-ready."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from importlib import resources
from pathlib import Path

import pytest

from posemb.lesson import assets

WANT = {"katex", "vega", "vega-lite", "vega-embed"}


@pytest.fixture
def vendor_copy(tmp_path: Path) -> Path:
    """A writable copy of the shipped vendor folder."""
    with resources.as_file(assets.vendor_root()) as src:
        return Path(shutil.copytree(src, tmp_path / "vendor"))


def test_versions_list_every_package_with_integrity_and_hashes() -> None:
    manifest = assets.versions()
    names = {p["name"] for p in manifest["packages"]}
    assert names == WANT
    root = assets.vendor_root()
    for pkg in manifest["packages"]:
        assert pkg["integrity"].startswith("sha512-")
        assert re.fullmatch(r"\d+\.\d+\.\d+", pkg["version"])
        for path, digest in pkg["files"].items():
            assert hashlib.sha256(root.joinpath(path).read_bytes()).hexdigest() == digest
    embed = next(p for p in manifest["packages"] if p["name"] == "vega-embed")
    # Hover tooltips come from vega-tooltip, compiled into vega-embed's bundle.
    assert "vega-tooltip" in {b["name"] for b in embed["bundles"]}


def test_every_shipped_vendor_file_is_recorded() -> None:
    """Nothing sits in the vendor folder without a recorded hash (no stray, unchecked file)."""
    with resources.as_file(assets.vendor_root()) as root:
        on_disk = {
            str(p.relative_to(root))
            for p in root.rglob("*")
            if p.is_file() and p.name != "VERSIONS.json"
        }
    recorded: set[str] = set()
    for pkg in assets.versions()["packages"]:
        recorded |= set(pkg["files"])
        for b in pkg.get("bundles", ()):
            recorded |= set(b["files"])
    assert on_disk == recorded


def test_assets_are_non_empty_and_define_their_globals() -> None:
    css, katex, vega = assets.katex_css(), assets.katex_js(), assets.vega_js()
    assert len(css) > 100_000  # the fonts are inside
    assert len(katex) > 100_000 and len(vega) > 500_000
    assert "renderMathInElement" in katex and "katex" in katex
    assert "vegaEmbed" in vega and "vegaLite" in vega
    # Load order: vega first, vega-embed (which needs both) last.
    assert vega.index("vega-lite") < vega.index("vegaEmbed=")


def test_katex_fonts_are_embedded_and_nothing_is_fetched() -> None:
    css = assets.katex_css()
    urls = re.findall(r"url\(([^)]*)\)", css)
    assert len(urls) == css.count("@font-face") == 20
    assert all(u.startswith("data:font/woff2;base64,") for u in urls)
    assert "@import" not in css


@pytest.mark.parametrize("name", ["katex_css", "katex_js", "vega_js"])
def test_no_source_map_or_fetchable_reference(name: str) -> None:
    text = getattr(assets, name)()
    assert "sourceMappingURL" not in text
    assert "</script" not in text.lower()
    # URLs left in the bundles are XML namespaces, schema ids and help links: strings, never
    # passed to fetch/XHR by the page (the browser test checks no request leaves file:/data:).
    for url in re.findall(r"https?://[^\s\"'`)]+", text):
        assert not url.endswith((".js", ".css", ".woff2", ".woff", ".ttf", ".map")), url


def test_licences_credit_every_package() -> None:
    found = {lic.name: lic for lic in assets.licences()}
    assert set(found) >= WANT
    assert found["katex"].spdx == "MIT" and "Khan Academy" in found["katex"].text
    assert found["vega-tooltip"].bundled_in == "vega-embed"
    assert all(lic.text.strip() and lic.version for lic in found.values())


def test_tampered_file_is_refused(vendor_copy: Path) -> None:
    target = vendor_copy / "vega" / "vega.min.js"
    target.write_bytes(target.read_bytes().replace(b"vega", b"vegA", 1))
    with pytest.raises(ValueError, match=re.escape("vega/vega.min.js has sha256")):
        assets.vega_js(vendor=vendor_copy)
    assert assets.katex_js(vendor=vendor_copy)  # the untouched files still load


def test_tampered_font_is_refused(vendor_copy: Path) -> None:
    font = vendor_copy / "katex" / "fonts" / "KaTeX_Main-Regular.woff2"
    font.write_bytes(font.read_bytes()[:-1])
    with pytest.raises(ValueError, match=re.escape("KaTeX_Main-Regular.woff2 has sha256")):
        assets.katex_css(vendor=vendor_copy)


def test_unlisted_file_is_refused(vendor_copy: Path) -> None:
    manifest = json.loads((vendor_copy / "VERSIONS.json").read_text())
    katex = next(p for p in manifest["packages"] if p["name"] == "katex")
    del katex["files"]["katex/contrib/auto-render.min.js"]
    (vendor_copy / "VERSIONS.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="path must be a vendored file"):
        assets.katex_js(vendor=vendor_copy)


def test_source_map_comment_is_stripped(vendor_copy: Path) -> None:
    """The shipped vega-lite bundle ends with one; prove the stripping, not just its absence."""
    raw = (vendor_copy / "vega-lite" / "vega-lite.min.js").read_text()
    assert "//# sourceMappingURL=" in raw
    assert "sourceMappingURL" not in assets.vega_js(vendor=vendor_copy)
