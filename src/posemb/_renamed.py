"""Old public names kept working, with a warning, after a rename."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping


def module_getattr(
    module: str, renamed: Mapping[str, str], namespace: Mapping[str, object]
) -> Callable[[str], object]:
    """A module-level ``__getattr__`` that serves each old name in ``renamed`` as its new one.

    Args:
        module: the module's dotted name, for the message.
        renamed: old name -> new name.
        namespace: the module's ``globals()``, where the new names live.
    """

    def __getattr__(name: str) -> object:
        if name in renamed:
            new = renamed[name]
            warnings.warn(
                f"{module}.{name} is renamed {module}.{new}", DeprecationWarning, stacklevel=2
            )
            return namespace[new]
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
