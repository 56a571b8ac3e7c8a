"""Atomic file writes: a reader never sees a half-written file, a crash leaves none behind."""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
from collections.abc import Callable

from ._errors import InputError


def share(path: str | os.PathLike[str]) -> None:
    """Give a temporary file the permissions a plain ``open()`` would: mkstemp makes it
    private (0600), and the page, plots and checkpoints are meant to be shared."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def atomic_write(path: str | os.PathLike[str], write: Callable[[str], object]) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it onto ``path``.

    The rename is atomic on POSIX filesystems because the temporary file is in the same
    folder; on any failure the temporary file is removed and ``path`` is left as it was.

    Args:
        path: the file to create or replace (its folder is created if missing).
        write: writes the complete content to the path it is given.
    """
    target = os.path.abspath(os.fspath(path))
    folder = os.path.dirname(target)
    os.makedirs(folder, exist_ok=True)
    name = os.path.basename(target)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        share(tmp)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """:func:`atomic_write` of a bytes payload."""

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)

    atomic_write(path, write)


def read_json(path: str | os.PathLike[str], what: str) -> object:
    """Parse a JSON file; a missing, unreadable or truncated file is a one-line ValueError.

    Args:
        path: the file.
        what: how errors name it, e.g. ``"config file"`` or ``"--claims file"``.
    """
    p = pathlib.Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{what} {str(p)!r} does not exist") from None
    except IsADirectoryError:
        raise InputError(f"{what} {str(p)!r} is a directory, not a file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{what} {str(p)!r} cannot be read as UTF-8 text: {err}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(
            f"{what} {str(p)!r} is not valid JSON (line {err.lineno}, column {err.colno}: "
            f"{err.msg}); a truncated file looks like this"
        ) from None
