"""The lesson's screens, one module each: ``s01_blender.py`` ... ``s09_at_scale.py``.

Each module holds its screen's text (:data:`SCREEN`, a :class:`Screen`), its claims with
their checks and its figure builders, registered as the module is imported (see
:mod:`posemb.lesson.registry`). The modules are found by name here, in order, so the number of
screens is the number of modules: adding a screen is adding a module, and the page, the claim
table and ``posemb verify`` follow. The order, the questions and the facts follow the user's
lesson (``shared/seed/positional-embedding-lesson.txt``); the prose is posemb's.
"""

from __future__ import annotations

import importlib
import pkgutil

from ..registry import SCREEN_LIST, Screen, screen_number

MODULES: tuple[str, ...] = tuple(
    sorted(
        m.name
        for m in pkgutil.iter_modules(__path__)
        if not m.ispkg and m.name[:1] == "s" and m.name[1:3].isdigit()
    )
)
"""The screen modules' names, in screen order."""

for _name in MODULES:
    importlib.import_module(f"{__name__}.{_name}")

SCREEN_TEXT: tuple[Screen, ...] = tuple(SCREEN_LIST)
"""Every screen's text, in order."""

if [s.number for s in SCREEN_TEXT] != list(range(1, len(SCREEN_TEXT) + 1)) or [
    screen_number(m) for m in MODULES
] != [s.number for s in SCREEN_TEXT]:
    raise RuntimeError(f"the screen modules must be numbered 1..n, one each: {MODULES}")

__all__ = ["MODULES", "SCREEN_TEXT", "Screen"]
