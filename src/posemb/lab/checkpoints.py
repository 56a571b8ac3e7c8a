"""Where a lab job's files live and how they are read back: a checkpoint and a result per job
under ``--out``, written atomically, refused (naming the file) when they were made with other
settings or cannot be read, never overwritten silently.
"""

from __future__ import annotations

import json
import os

import torch

from .._errors import InputError
from .._io import atomic_write


def job_paths(
    out: str, encoding: str, seed: int, kind: str = "lm", race_seed: int | None = None
) -> tuple[str, str]:
    """(checkpoint, result) files of one job under ``out``."""
    name = {
        "lm": f"{encoding}-seed{seed}",
        "retrieval": f"retrieval-{encoding}-seed{seed}",
        "race": f"race-{encoding}-seed{seed}-race{race_seed}",
    }[kind]
    return (
        os.path.join(out, "checkpoints", f"{name}.pt"),
        os.path.join(out, "runs", f"{name}.json"),
    )


def save_checkpoint(state: dict, path: str) -> None:
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def load_checkpoint(path: str, digest: str) -> dict | None:
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
        raise InputError(
            f"checkpoint {path} was made with other settings (digest "
            f"{ckpt.get('digest') if isinstance(ckpt, dict) else '?'} != {digest}); use another "
            f"--out or delete it"
        )
    return ckpt


def load_result(path: str, digest: str) -> dict | None:
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            done = json.load(f)
    except (OSError, json.JSONDecodeError):
        raise InputError(f"result {path} cannot be read; delete it to rerun") from None
    if done.get("digest") == digest:
        return done
    raise InputError(f"result {path} was made with other settings; use another --out or delete it")


# --- one job -------------------------------------------------------------------------------------


__all__ = ["job_paths", "load_checkpoint", "load_result", "save_checkpoint"]
