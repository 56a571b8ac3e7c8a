"""Where a lab job's files live and how they are read back: a checkpoint and a result per job
under ``--out``, written atomically through the folder's ownership manifest
(:class:`posemb._owned.OwnedFolder`: the lab never overwrites or removes a file it did not
write), refused (naming the file) when they were made with other settings or cannot be read.

A checkpoint carries the digest of what training depends on; a result carries that one too
(``train_digest``) and the digest of what its evaluation read. A result whose evaluation
differs but whose training is the same is stale, not foreign: the job evaluates its finished
model again (:func:`load_result` returns None for it).
"""

from __future__ import annotations

import json
import os
import pathlib
import re

import torch

from .._errors import InputError
from .._io import read_json
from .._owned import OwnedFolder

COMMAND = "posemb lab"
PLOT_FILES = (
    "loss_vs_length.png",
    "loss_vs_position.png",
    "retrieval.png",
    "probes.png",
    "entropy.png",
    "race.png",
)
LAB_FILES = ("protocol.json", "invocations.json", "results.json", "results.md", *PLOT_FILES)
_JOB_FILES = (("runs", ".json"), ("checkpoints", ".pt"))


# The probe tasks' job kinds (posemb.lab.tasks.PROBE_TASKS; named here, below that table).
PROBE_KINDS = ("retrieval", "multikey", "vartrack", "flipflop")


def job_paths(
    out: str, encoding: str, seed: int, kind: str = "lm", race_seed: int | None = None
) -> tuple[str, str]:
    """(checkpoint, result) files of one job under ``out``."""
    if kind == "race":
        name = f"race-{encoding}-seed{seed}-race{race_seed}"
    elif kind in PROBE_KINDS:
        name = f"{kind}-{encoding}-seed{seed}"
    elif kind == "lm":
        name = f"{encoding}-seed{seed}"
    else:
        raise InputError(f"unknown job kind {kind!r}; known: lm, {', '.join(PROBE_KINDS)}, race")
    return (
        os.path.join(out, "checkpoints", f"{name}.pt"),
        os.path.join(out, "runs", f"{name}.json"),
    )


def folder(out: str) -> OwnedFolder:
    """The lab's handle on ``out`` for writing (its command already claimed it)."""
    return OwnedFolder.open(out, COMMAND)


def write_file(out: str, path: str, data: bytes) -> None:
    """Write ``path`` (a file under ``out``) atomically, as the lab's own."""
    folder(out).write_bytes(os.path.relpath(path, out), data)


# A job's file name (job_paths): a variant's name (letters, digits, "+", "-") and its seeds.
_JOB_NAME = re.compile(
    r"(?:(?:retrieval|multikey|vartrack|flipflop)-)?[a-z0-9+-]+-seed\d+|race-[a-z0-9+-]+-seed\d+-race\d+"
)


def is_lab_file(rel: str) -> bool:
    """Whether a relative path is one the lab writes: its report files and plots, or a job's
    result or checkpoint by the lab's naming (never a user's ``my_plot.png``)."""
    p = pathlib.PurePosixPath(rel)
    if len(p.parts) == 1:
        return rel in LAB_FILES
    if len(p.parts) != 2 or (p.parts[0], p.suffix) not in _JOB_FILES:
        return False
    return _JOB_NAME.fullmatch(p.stem) is not None


def earlier_lab(root: pathlib.Path, present: list[str]) -> set[str]:
    """Of a folder without an ownership manifest, the files an earlier posemb lab wrote (it
    is taken over when that is all of them): a readable ``protocol.json`` of the lab, and
    files of the lab's names, results among them that read as results."""
    try:
        protocol = json.loads((root / "protocol.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return set()
    if not isinstance(protocol, dict) or "posemb" not in protocol:
        return set()

    def looks_like_a_result(rel: str) -> bool:
        if not rel.startswith("runs/"):
            return True
        try:
            done = json.loads((root / rel).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return False
        return isinstance(done, dict) and isinstance(done.get("digest"), str)

    return {rel for rel in present if is_lab_file(rel) and looks_like_a_result(rel)}


def save_checkpoint(state: dict, path: str, out: str) -> None:
    """Write a checkpoint under ``out`` atomically."""
    folder(out).write(os.path.relpath(path, out), lambda tmp: torch.save(state, tmp))


def _differences(theirs: object, ours: dict | None) -> str:
    if not isinstance(theirs, dict) or ours is None:
        return ""
    diff = [
        f"{k} {theirs.get(k)!r} != {ours.get(k)!r}"
        for k in sorted(set(ours) | set(theirs))
        if theirs.get(k) != ours.get(k)
    ]
    return f" ({'; '.join(diff[:3])})" if diff else ""


def load_checkpoint(path: str, digest: str, key: dict | None = None) -> dict | None:
    """A job's checkpoint, None where there is none.

    Args:
        path: the file.
        digest: what the checkpoint must carry (:meth:`LabConfig.digest`).
        key: the settings behind ``digest`` (:meth:`LabConfig.job_key`), to name what differs.

    Raises:
        ValueError: the file cannot be read, or was made with other settings.
    """
    if not os.path.exists(path):
        return None
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a truncated or foreign file: refuse, never overwrite silently
        raise InputError(
            f"checkpoint {path} cannot be read ({type(err).__name__}); delete it to start that "
            f"job again"
        ) from err
    if not isinstance(ckpt, dict) or ckpt.get("digest") != digest:
        theirs = ckpt.get("digest") if isinstance(ckpt, dict) else "?"
        why = _differences(ckpt.get("settings") if isinstance(ckpt, dict) else None, key)
        raise InputError(
            f"checkpoint {path} was made with other settings{why} (digest {theirs} != "
            f"{digest}); use another --out or delete it"
        )
    return ckpt


def load_result(
    path: str, digest: str, train_digest: str | None = None, key: dict | None = None
) -> dict | None:
    """A job's finished result; None where there is none, or where it is stale.

    A result is stale when only its evaluation differs: its ``train_digest`` is
    ``train_digest`` (the job then evaluates its finished model again).

    Raises:
        ValueError: the file cannot be read or is not a result, or its model was trained
            with other settings.
    """
    if not os.path.exists(path):
        return None
    done = read_json(path, "result")
    if not isinstance(done, dict) or not isinstance(done.get("digest"), str):
        raise InputError(f"result {path} is not a posemb lab result; delete it to rerun")
    if done["digest"] == digest:
        return done
    if train_digest is not None and done.get("train_digest") == train_digest:
        return None
    why = _differences(done.get("settings"), key)
    raise InputError(
        f"result {path} was made with other settings{why}; use another --out or delete it"
    )


__all__ = [
    "COMMAND",
    "LAB_FILES",
    "PLOT_FILES",
    "earlier_lab",
    "folder",
    "is_lab_file",
    "job_paths",
    "load_checkpoint",
    "load_result",
    "save_checkpoint",
    "write_file",
]
