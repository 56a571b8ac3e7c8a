"""Optional dependencies, asked for at the door: a feature whose extra is not installed fails
before it starts, with an ``ImportError`` that names the extra to install (``posemb`` the
command turns it into one line and exit status 2).

Only a missing module counts as missing: any other error raised while importing it (a broken
install, a bug) propagates as it is.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# Import name -> (the distribution pip installs, the posemb extra that brings it).
EXTRAS: dict[str, tuple[str, str]] = {
    "jinja2": ("jinja2", "lesson"),
    "altair": ("altair", "lesson"),
    "vl_convert": ("vl-convert-python", "lesson"),
    "matplotlib": ("matplotlib", "lab"),
    "safetensors": ("safetensors", "hf"),
    "transformers": ("transformers", "hf"),
    "triton": ("triton", "triton"),
    "ninja": ("ninja", "jit"),
}


class MissingExtra(ImportError):
    """An optional dependency of posemb is not installed; the message says which extra brings
    it (``pip install 'posemb[EXTRA]'``)."""


def is_missing(err: ImportError, module: str) -> bool:
    """Is ``err`` the import system saying ``module`` (or a package above it) is absent?"""
    name = getattr(err, "name", None)
    return (
        isinstance(err, ModuleNotFoundError)
        and bool(name)
        and (name == module or module.startswith(f"{name}."))
    )


def _missing_extra(module: str, feature: str, extra: str | None) -> MissingExtra:
    dist, default_extra = EXTRAS.get(module.split(".")[0], (module, None))
    which = extra or default_extra
    fix = f"pip install 'posemb[{which}]'" if which else f"pip install {dist}"
    return MissingExtra(f"{feature} needs {dist}, which is not installed: {fix}")


def missing(err: ImportError, feature: str, extra: str | None = None) -> ImportError:
    """What to raise for ``err``, caught importing an optional module for ``feature``: a
    :class:`MissingExtra` naming the extra when the module absent is one of :data:`EXTRAS`
    (the optional dependency itself), else ``err`` (a broken install, a bug).

    ``raise missing(err, "posemb convert") from None`` in an ``except ImportError`` block.
    """
    module = getattr(err, "name", None) or ""
    if module.split(".")[0] not in EXTRAS or not is_missing(err, module):
        return err
    return _missing_extra(module, feature, extra)


def require(module: str, feature: str, extra: str | None = None) -> ModuleType:
    """Import ``module`` for ``feature``, or raise :class:`MissingExtra` naming the extra.

    Args:
        module: the import name, e.g. ``"altair"`` (a key of :data:`EXTRAS`).
        feature: what needs it, for the message, e.g. ``"posemb lesson"``.
        extra: the posemb extra to name, if not the one :data:`EXTRAS` gives.

    Returns:
        The imported module.
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        if not is_missing(err, module):
            raise  # the module is there but broke, or a dependency of it is missing
        dist, default_extra = EXTRAS.get(module.split(".")[0], (module, None))
        which = extra or default_extra
        fix = f"pip install 'posemb[{which}]'" if which else f"pip install {dist}"
        raise MissingExtra(f"{feature} needs {dist}, which is not installed: {fix}") from None


def require_all(modules: tuple[str, ...], feature: str, extra: str | None = None) -> None:
    """:func:`require` each of ``modules``; the first one missing raises."""
    for module in modules:
        require(module, feature, extra)
