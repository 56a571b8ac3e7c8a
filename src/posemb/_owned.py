"""The files a posemb command owns: one rule for every command that writes a folder or a file.

A command that writes a folder (``posemb lesson --out``, ``posemb lab --out``) keeps a manifest
in it, ``.posemb-owned.json``: every file it wrote, by relative path, with the SHA-256 of what it
wrote. Before it computes anything, :meth:`OwnedFolder.claim` refuses a folder that holds a file
the manifest does not list, a listed file someone changed since, or a manifest of another
command, and it checks that the folder can be written (leaving nothing behind). A file is
written atomically, and its new hash is registered before the rename, so a crash at any point
leaves a manifest that accepts what is on disk. Nothing is removed unless the manifest lists
it with the hash it has now: a user's file, or a user's edit of one of ours, is never lost.
``force=True`` (the commands' ``--force``) writes beside files the command did not write, and
over its own files that someone edited; it still never removes or replaces a file it did not
write (one standing where the command must write is refused up front).

A command that writes one file (``posemb verify --save``, ``posemb bench --out``) cannot keep a
manifest beside it: :func:`check_output_file` tells its own earlier output by content and
refuses to replace anything else without ``force``.

Several processes may write one folder at once (the lab's workers): the manifest is read,
changed and replaced under an exclusive ``flock`` of the folder itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pathlib
import re
import tempfile
import time
from collections.abc import Callable, Iterator

from ._errors import InputError
from ._io import share

MANIFEST = ".posemb-owned.json"
LOCK = ".posemb-owned.lock"  # held by a command for the whole of its run (OwnedFolder.running)
_TMP = ".posemb-tmp-"  # every temporary file of this module starts so; never a user's file
_TMP_NAME = re.compile(re.escape(_TMP) + r".+\.[a-z0-9_]{8}\.tmp")  # tempfile's 8 characters
_STALE_TMP_SECONDS = 3600  # a write in progress takes seconds; older is a killed one's
_FORMAT = 1
_LISTED = 5  # paths named in a refusal


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The hex SHA-256 of a file's bytes, read in 1 MiB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _names(paths: list[str]) -> str:
    shown = ", ".join(paths[:_LISTED])
    return shown + (f" and {len(paths) - _LISTED} more" if len(paths) > _LISTED else "")


def probe_writable(folder: str | os.PathLike[str], what: str) -> None:
    """Refuse a folder that cannot be created or written, and leave nothing behind.

    Creates the folder (and missing parents) and a temporary file in it, then removes both:
    a read-only mount, a path under a file, or ``/proc`` is refused by a ``ValueError``
    naming ``what`` before any work is done.
    """
    p = pathlib.Path(os.path.abspath(os.fspath(folder)))
    for attempt in range(3):
        try:
            _probe(p)
            return
        except OSError as err:
            if isinstance(err, FileNotFoundError) and attempt < 2:
                continue  # another process (a rank) removed the folder it had just probed
            raise InputError(
                f"{what} {str(folder)!r} cannot be written ({err.strerror or err}); give a "
                f"folder you can write"
            ) from None


def _probe(p: pathlib.Path) -> None:
    created: list[pathlib.Path] = []
    for parent in (p, *p.parents):
        if parent.exists():
            break
        created.append(parent)
    try:
        for d in reversed(created):
            d.mkdir(exist_ok=True)
        if not p.is_dir():
            raise NotADirectoryError(20, "Not a directory")
        fd, tmp = tempfile.mkstemp(dir=p, prefix=f"{_TMP}probe.", suffix=".tmp")
        os.close(fd)
        os.unlink(tmp)
    finally:
        for d in created:
            with contextlib.suppress(OSError):
                d.rmdir()


def check_output_file(
    path: str | os.PathLike[str],
    what: str,
    is_ours: Callable[[bytes], bool],
    *,
    force: bool = False,
) -> None:
    """Refuse, before any work, an output file that posemb cannot or must not write.

    Args:
        path: the file a command will write atomically.
        what: how errors name it, e.g. ``"--save"``.
        is_ours: tells from an existing file's bytes whether this command wrote it (then it
            may be replaced).
        force: replace any existing file.

    Raises:
        ValueError: ``path`` is a folder, an existing file this command did not write (without
            ``force``), or in a folder that cannot be written.
    """
    p = pathlib.Path(path)
    if p.is_dir():
        raise InputError(f"{what} {str(p)!r} is a folder; give a file name")
    if p.exists() and not p.is_file():  # a pipe or a device: reading it to check could hang
        raise InputError(f"{what} {str(p)!r} is not a regular file; give a file name")
    if p.exists() and not force:
        try:
            ours = is_ours(p.read_bytes())
        except OSError:
            ours = False
        if not ours:
            raise InputError(
                f"{what} {str(p)!r} exists and is not an earlier output of this command; "
                f"give another name, or pass --force to replace it"
            )
    probe_writable(p.parent if str(p.parent) else ".", f"the folder of {what}")


class OwnedFolder:
    """A folder one posemb command writes, with the manifest of the files it wrote.

    Get one with :meth:`claim` (every check, before a command computes anything) or
    :meth:`open` (a worker writing into a folder its command already claimed). Picklable, so
    a worker process can be handed one.

    Args:
        path: the folder.
        command: who writes it, e.g. ``"posemb lab"``; a manifest of another is refused.
        force: accept a folder holding files the manifest does not list (kept, never
            replaced), or lists with another hash (edited: replaced when written again).
    """

    def __init__(self, path: str | os.PathLike[str], command: str, force: bool = False) -> None:
        self.path = pathlib.Path(os.path.abspath(os.fspath(path)))
        self.command = command
        self.force = bool(force)
        self._pending: dict[str, str] = {}  # adopted, written into the manifest by settle()

    def __repr__(self) -> str:
        return f"OwnedFolder({str(self.path)!r}, {self.command!r}, force={self.force})"

    # --- reading ------------------------------------------------------------------------

    def _read(self) -> dict[str, list[str]] | None:
        """The manifest's files, or None where the folder has no manifest."""
        p = self.path / MANIFEST
        if not p.exists():
            return None
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            data = None
        files = data.get("files") if isinstance(data, dict) else None
        if not isinstance(files, dict) or not all(
            _relative(k) and isinstance(v, list) and all(isinstance(h, str) for h in v)
            for k, v in files.items()
        ):
            raise InputError(
                f"{p} is not a readable posemb manifest; posemb cannot tell which files in "
                f"{str(self.path)!r} are its own: give another folder"
            )
        if data.get("command") != self.command:
            raise InputError(
                f"{str(self.path)!r} was written by {data.get('command')!r}, not "
                f"{self.command}: give another folder"
            )
        return files

    def owned(self) -> dict[str, list[str]]:
        """Relative path -> the hashes the manifest accepts for it (empty without one)."""
        return self._read() or {}

    def _on_disk(self) -> list[str]:
        """Every entry below the folder that is not a folder: files, and links of any kind
        (a link to a folder is listed, never followed: it is not the command's)."""
        out = []
        for root, dirs, files in os.walk(self.path):
            links = [d for d in dirs if os.path.islink(os.path.join(root, d))]
            for name in [*files, *links]:
                rel = pathlib.PurePath(os.path.relpath(os.path.join(root, name), self.path))
                if rel.as_posix() not in (MANIFEST, LOCK) and not _TMP_NAME.fullmatch(name):
                    out.append(rel.as_posix())
        return sorted(out)

    def _hash(self, rel: str) -> str | None:
        """The file's SHA-256, None for a link or anything that is not a readable file (the
        command writes plain files only, so such a thing is never its own)."""
        p = self.path / rel
        if p.is_symlink() or not p.is_file():
            return None
        try:
            return sha256_file(p)
        except OSError:
            return None

    # --- claiming -----------------------------------------------------------------------

    @classmethod
    def claim(
        cls,
        path: str | os.PathLike[str],
        command: str,
        *,
        what: str = "--out",
        force: bool = False,
        adopt: Callable[[pathlib.Path, list[str]], set[str]] | None = None,
        writes: Callable[[str], bool] | None = None,
    ) -> OwnedFolder:
        """Check ``path`` for ``command`` before it writes anything; nothing is written.

        Args:
            path: the folder (it need not exist).
            command: the command that will write it.
            what: how errors name the folder (the flag).
            force: accept files the command did not write (they are kept, never replaced
                or removed) and its own files edited since (replaced when written again).
            adopt: for a folder without a manifest, ``adopt(path, files)`` returns those of
                ``files`` an earlier posemb wrote (before manifests existed). Where that is
                all of them, they become the command's own; :meth:`settle` records them.
            writes: ``writes(rel)`` says whether the command may write ``rel``; with
                ``force``, a file it did not write at such a path is refused now, as
                :meth:`write` would refuse it later.

        Raises:
            ValueError: ``path`` is a file; the folder holds files the command did not write
                or that changed since it wrote them (without ``force``); it holds another
                command's manifest; or it cannot be written.
        """
        self = cls(path, command, force)
        if self.path.exists() and not self.path.is_dir():
            raise InputError(f"{what} {str(path)!r} is a file; give a folder")
        probe_writable(self.path, what)
        if self.path.is_dir():
            self._check_contents(what, adopt, writes or (lambda rel: False))
        return self

    def _check_contents(
        self,
        what: str,
        adopt: Callable[[pathlib.Path, list[str]], set[str]] | None,
        writes: Callable[[str], bool],
    ) -> None:
        files = self._read()
        present = self._on_disk()
        earlier: set[str] = set()
        if files is None and present and adopt is not None:
            earlier = adopt(self.path, present) & set(present)
            if earlier == set(present):
                self._pending = {rel: self._hash(rel) or "" for rel in present}
                return
        foreign = [rel for rel in present if rel not in (files or {})]
        in_the_way = [rel for rel in foreign if writes(rel)]
        if self.force and in_the_way:
            raise InputError(
                f"{what} {str(self.path)!r} holds files that {self.command} did not write where "
                f"it writes its own ({_names(in_the_way)}); --force keeps files it did not "
                f"write and never replaces them: move them, or give another folder"
            )
        listed = files or {}
        changed = [rel for rel in present if rel in listed and self._hash(rel) not in listed[rel]]
        if (foreign or changed) and not self.force:
            # What is not the command's first: an earlier posemb's files are not the problem.
            foreign.sort(key=lambda rel: rel in earlier)
            parts = []
            if foreign:
                parts.append(f"files {self.command} did not write ({_names(foreign)})")
            if changed:
                parts.append(f"files changed since {self.command} wrote them ({_names(changed)})")
            raise InputError(
                f"{what} {str(self.path)!r} holds {' and '.join(parts)}; move them or give "
                f"another folder; --force writes beside files it did not write (kept) and "
                f"replaces its own edited ones"
            )

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Hold the folder for one run of the command: a second run into it (its checks and
        writes would interleave with this one's) is refused at once, naming it.

        An ``flock`` on ``.posemb-owned.lock``, released when the run ends or its process
        dies; the file itself stays (empty), one of the command's own.
        """
        for attempt in range(5):
            self.path.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
                break
            except FileNotFoundError:
                # Another process's probe_writable removed the folder it had just made
                # (the lab's ranks claim one folder at once): make it again.
                if attempt == 4:
                    raise
                time.sleep(0.01 * (attempt + 1))
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise InputError(
                    f"{str(self.path)!r} is being written by another {self.command} run; wait "
                    f"for it to finish, or give another folder"
                ) from None
            yield
        finally:
            os.close(fd)

    def settle(self) -> None:
        """Record the files :meth:`claim` adopted (the caller's own checks have passed), and
        remove temporary files that a killed write of this command left behind."""
        with self._locked():
            if self._pending and self._read() is None:
                self._write_manifest({rel: [h] for rel, h in self._pending.items() if h})
            self._pending = {}
            cutoff = time.time() - _STALE_TMP_SECONDS
            for root, _dirs, names in os.walk(self.path):
                for name in names:
                    p = os.path.join(root, name)
                    if _TMP_NAME.fullmatch(name) and os.path.getmtime(p) < cutoff:
                        with contextlib.suppress(OSError):
                            os.unlink(p)

    @classmethod
    def open(cls, path: str | os.PathLike[str], command: str) -> OwnedFolder:
        """A folder ``command`` already claimed, to write into (refused only where another
        command's manifest is there; every write refuses a file the command did not write)."""
        self = cls(path, command)
        if self.path.is_dir():
            self._read()
        return self

    # --- writing ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _write_manifest(self, files: dict[str, list[str]]) -> None:
        body = {
            "format": _FORMAT,
            "command": self.command,
            "about": f"the files {self.command} wrote here, with their SHA-256; it never "
            "removes or overwrites a file this list does not hold with that hash",
            "files": dict(sorted(files.items())),
        }
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=f"{_TMP}{MANIFEST}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(body, f, indent=1)
            share(tmp)
            os.replace(tmp, self.path / MANIFEST)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def write(self, rel: str, writer: Callable[[str], object]) -> pathlib.Path:
        """Write ``rel`` (a relative path) atomically: ``writer(tmp)`` writes the whole file.

        The new file's hash is accepted, beside the one on disk, before the rename, so a crash
        between the two leaves a manifest that accepts what is there.

        Raises:
            ValueError: ``rel`` leaves the folder (or passes through a link); or a file is
                there that this command did not write, or that changed since it wrote it
                (unless ``force``, which replaces the command's own edited files only).
        """
        target = self._target(rel)
        rel = target.relative_to(self.path).as_posix()
        target.parent.mkdir(parents=True, exist_ok=True)
        self._target(rel)  # again: the folders now exist, and none may be a link
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f"{_TMP}{target.name}.", suffix=".tmp")
        os.close(fd)
        try:
            writer(tmp)
            share(tmp)
            new = sha256_file(tmp)
            with self._locked():
                files = self._read() or {}
                files |= {k: [h] for k, h in self._pending.items() if h and k not in files}
                accepted = files.get(rel, [])
                now = self._hash(rel) if (target.exists() or target.is_symlink()) else None
                if (target.exists() or target.is_symlink()) and (
                    rel not in files or (now not in accepted and not self.force)
                ):
                    why = (
                        "did not write it" if rel not in files else "wrote it, and it changed since"
                    )
                    raise InputError(f"{target} is there and {self.command} {why}; not replaced")
                files[rel] = [h for h in (now, new) if h is not None and h in (*accepted, new)]
                self._write_manifest(files)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return target

    def write_bytes(self, rel: str, data: bytes) -> pathlib.Path:
        """:meth:`write` of a bytes payload."""
        return self.write(rel, lambda tmp: pathlib.Path(tmp).write_bytes(data))

    def remove(self, rel: str) -> bool:
        """Remove ``rel`` if this command wrote it and it is unchanged; whether it was."""
        target = self._target(rel)
        rel = target.relative_to(self.path).as_posix()
        with self._locked():
            files = self._read() or {}
            if rel not in files:
                return False
            if target.exists() or target.is_symlink():
                if self._hash(rel) not in files[rel]:
                    return False  # someone changed or replaced it: theirs now
                target.unlink()
            del files[rel]
            self._write_manifest(files)
        parent = target.parent
        while parent != self.path:
            try:
                parent.rmdir()  # only an empty folder goes
            except OSError:
                break
            parent = parent.parent
        return True

    def prune(self, keep: Callable[[str], bool]) -> list[str]:
        """Remove every file this command wrote for which ``keep(rel)`` is false (an output a
        later run did not write again); the paths removed."""
        return [rel for rel in sorted(self.owned()) if not keep(rel) and self.remove(rel)]

    def _target(self, rel: str) -> pathlib.Path:
        target = pathlib.Path(os.path.abspath(self.path / rel))
        if target == self.path / MANIFEST or self.path not in target.parents:
            raise InputError(f"{rel!r} is not a file inside {str(self.path)!r}")
        # No folder between the root and the file may be a link (it could lead anywhere).
        for folder in target.parents:
            if folder == self.path:
                break
            if folder.is_symlink():
                raise InputError(f"{rel!r} passes through the link {folder}; not written")
        return target


def _relative(rel: object) -> bool:
    """Whether a manifest key is a plain relative path inside the folder."""
    if not isinstance(rel, str) or not rel or rel.startswith("/"):
        return False
    parts = pathlib.PurePosixPath(rel).parts
    return ".." not in parts and "." not in parts and rel == pathlib.PurePosixPath(rel).as_posix()


__all__ = ["LOCK", "MANIFEST", "OwnedFolder", "check_output_file", "probe_writable", "sha256_file"]
