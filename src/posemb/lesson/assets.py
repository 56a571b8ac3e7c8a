"""The front-end libraries the lesson page inlines: KaTeX and the Vega runtime, with licences.

They ship inside posemb (``lesson/vendor/``, written by ``scripts/vendor_lesson_assets.py`` from
their npm releases) so the page is one file that opens from ``file://`` with the network off.
Every file is checked against the sha256 recorded in ``vendor/VERSIONS.json`` before it is used:
an edited or truncated vendored file raises ``ValueError`` instead of reaching a reader's browser.

What is returned is ready to sit inside ``<style>`` / ``<script>`` elements:

- :func:`katex_css`: KaTeX's stylesheet with its woff2 fonts embedded as ``data:`` URIs (the
  stylesheet names relative font files, which a single-file page does not have);
- :func:`katex_js`: KaTeX, then its auto-render extension (``renderMathInElement``);
- :func:`vega_js`: Vega, Vega-Lite, then vega-embed (``vegaEmbed``, tooltips included);
- :func:`licences`: name, version and licence text of every vendored package, for the credits.

Source-map comments are removed: a browser with its developer tools open would otherwise try to
fetch ``*.map`` files that are not shipped.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

from .._errors import InputError

VERSIONS = "VERSIONS.json"
# Load order matters: vega-lite compiles to Vega specs, vega-embed wraps both.
VEGA_FILES = ("vega/vega.min.js", "vega-lite/vega-lite.min.js", "vega-embed/vega-embed.min.js")
KATEX_JS_FILES = ("katex/katex.min.js", "katex/contrib/auto-render.min.js")
KATEX_CSS = "katex/katex.min.css"

_SOURCE_MAP_JS = re.compile(r"^[ \t]*//[#@] sourceMappingURL=\S*[ \t]*$\n?", re.MULTILINE)
_SOURCE_MAP_CSS = re.compile(r"/\*[#@] sourceMappingURL=[^*]*\*/")
# One @font-face source list: url(fonts/X.woff2) format("woff2"),url(fonts/X.woff) ...
_FONT_SRC = re.compile(r"src:(url\([^)]*\)\s*format\([^)]*\)\s*,?\s*)+")
_WOFF2_URL = re.compile(r"url\((fonts/[A-Za-z0-9_-]+\.woff2)\)")


@dataclass(frozen=True)
class Licence:
    """A vendored package and its licence: ``text`` is the package's own licence file.

    ``bundled_in`` names the package whose browser bundle compiles this one in (vega-embed
    carries vega-tooltip and a few helpers); None for a package vendored as itself.
    """

    name: str
    version: str
    spdx: str
    text: str
    bundled_in: str | None = None


def vendor_root() -> Traversable:
    """The folder of vendored files inside the installed package."""
    return resources.files("posemb.lesson").joinpath("vendor")


def _root(vendor: Traversable | None) -> Traversable:
    return vendor_root() if vendor is None else vendor


def versions(vendor: Traversable | None = None) -> dict[str, Any]:
    """``VERSIONS.json``: per package its version, npm integrity and every file's sha256."""
    return json.loads(_root(vendor).joinpath(VERSIONS).read_text(encoding="utf-8"))


def _expected_hashes(manifest: dict[str, Any]) -> dict[str, str]:
    hashes: dict[str, str] = {}
    for pkg in manifest["packages"]:
        hashes.update(pkg["files"])
        for bundled in pkg.get("bundles", ()):
            hashes.update(bundled["files"])
    return hashes


def read_vendored(path: str, vendor: Traversable | None = None) -> bytes:
    """The bytes of one vendored file, after checking them against ``VERSIONS.json``.

    Args:
        path: relative to the vendor folder, e.g. ``"katex/katex.min.js"``.
        vendor: another vendor folder (tests); default the one that ships with posemb.

    Raises:
        ValueError: ``path`` is not a vendored file, or its sha256 differs from the recorded one.
    """
    root = _root(vendor)
    expected = _expected_hashes(versions(root))
    if path not in expected:
        raise InputError(
            f"path must be a vendored file listed in {VERSIONS}, got {path!r} "
            f"(e.g. {', '.join(sorted(expected)[:3])}, ...)"
        )
    data = root.joinpath(path).read_bytes()
    got = hashlib.sha256(data).hexdigest()
    if got != expected[path]:
        raise InputError(
            f"vendored file {path} has sha256 {got}, but {VERSIONS} records {expected[path]}: "
            f"it was altered; rerun scripts/vendor_lesson_assets.py"
        )
    return data


def _inline_js(path: str, vendor: Traversable | None) -> str:
    text = read_vendored(path, vendor).decode("utf-8")
    # An HTML parser ends a <script> element at the first "</script", wherever it stands.
    if "</script" in text.lower():
        raise InputError(f"vendored file {path} contains '</script' and cannot be inlined")
    return _SOURCE_MAP_JS.sub("", text).rstrip() + "\n"


def _concat_js(paths: tuple[str, ...], vendor: Traversable | None) -> str:
    # ";" between files: a bundle that ends without one must not run into the next one's "(".
    return ";\n".join(_inline_js(p, vendor) for p in paths)


def katex_js(vendor: Traversable | None = None) -> str:
    """KaTeX then its auto-render extension, for one ``<script>``: defines ``katex`` and
    ``renderMathInElement``."""
    return _concat_js(KATEX_JS_FILES, vendor)


def vega_js(vendor: Traversable | None = None) -> str:
    """Vega, Vega-Lite and vega-embed in load order, for one ``<script>``: defines ``vega``,
    ``vegaLite`` and ``vegaEmbed``. Pass ``actions: false`` to vegaEmbed: its action menu links
    to the online Vega editor."""
    return _concat_js(VEGA_FILES, vendor)


def katex_css(vendor: Traversable | None = None) -> str:
    """KaTeX's stylesheet with each ``@font-face`` reduced to its woff2 file as a ``data:`` URI.

    Raises:
        ValueError: a vendored file was altered, or a font face names no vendored woff2 file.
    """
    css = read_vendored(KATEX_CSS, vendor).decode("utf-8")
    fonts: dict[str, str] = {}

    def embed(match: re.Match[str]) -> str:
        woff2 = _WOFF2_URL.search(match.group(0))
        if woff2 is None:
            raise InputError(f"KaTeX font face without a woff2 source: {match.group(0)[:80]!r}")
        rel = woff2.group(1)
        if rel not in fonts:
            data = read_vendored(f"katex/{rel}", vendor)
            fonts[rel] = base64.b64encode(data).decode("ascii")
        # woff and ttf fallbacks are dropped: not shipped, and every current browser reads woff2.
        return f'src:url(data:font/woff2;base64,{fonts[rel]}) format("woff2")'

    css = _FONT_SRC.sub(embed, css)
    css = _SOURCE_MAP_CSS.sub("", css)
    left = [u for u in re.findall(r"url\(([^)]*)\)", css) if not u.startswith("data:")]
    if left:
        raise InputError(f"KaTeX stylesheet still refers to files after embedding: {left[:3]}")
    return css


def licences(vendor: Traversable | None = None) -> list[Licence]:
    """Every vendored package with its licence text, packages first, then what vega-embed's
    bundle compiles in."""
    root = _root(vendor)
    out: list[Licence] = []
    bundled: list[Licence] = []
    for pkg in versions(root)["packages"]:
        text = read_vendored(pkg["licence_file"], root).decode("utf-8")
        out.append(Licence(pkg["name"], pkg["version"], pkg["license"], text))
        for dep in pkg.get("bundles", ()):
            dep_text = read_vendored(dep["licence_file"], root).decode("utf-8")
            bundled.append(
                Licence(dep["name"], dep["version"], dep["license"], dep_text, pkg["name"])
            )
    return out + bundled
