"""How a lab sweep ran: each invocation of it (``invocations.json``: when, its wall time, its
phases' jobs and workers x threads, the machine), a killed one's time estimated when the sweep
resumes, and the sentence the report says it in.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import platform
from collections.abc import Sequence
from typing import Any

import torch

from .._errors import InputError
from .._io import read_json

INVOCATIONS = "invocations.json"


def machine_description(device: str = "cpu") -> dict[str, object]:
    """Where a sweep ran: the OS, the processor (its model name where Linux says it), cores,
    torch's threads and, on CUDA, the GPU's name."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    out: dict[str, object] = {
        "system": f"{platform.system()} {platform.release()}",
        "architecture": platform.machine(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
    return out


def invocation(
    started: float, wall: float | None, phases: Sequence[dict], device: str = "cpu"
) -> dict[str, object]:
    """One invocation of a sweep as ``invocations.json`` records it: when it started (UTC, and
    as a Unix time), its wall time (None while it runs: one that stays None was killed), how
    each phase ran (jobs, workers, threads per worker, ranks, seconds) and the machine."""
    when = _dt.datetime.fromtimestamp(started, _dt.timezone.utc).isoformat(timespec="seconds")
    return {
        "started": when,
        "started_unix": started,
        "wall_seconds": wall,
        "phases": [dict(p) for p in phases],
        "machine": machine_description(device),
    }


def one_invocation(wall: float, workers: int | None, threads: int | None) -> dict[str, object]:
    """An invocation as a summary without ``runs`` records it (:func:`~posemb.lab.report.summarise`
    called directly): its wall time and workers x threads, when and where unknown."""
    phase = {"phase": "all", "workers": workers, "threads_per_worker": threads}
    return {"started": None, "wall_seconds": wall, "phases": [phase], "machine": None}


def how_it_ran(summary: dict) -> str:
    """The report's sentence on how the sweep ran: invocations (a resumed sweep says so),
    their wall time, each phase's workers x threads, and the machine."""
    runs = summary.get("invocations")
    if not runs:  # a summary from before invocations were recorded
        return f"{summary.get('wall_seconds', 0):.0f} s wall"
    total = sum(float(r["wall_seconds"] or 0.0) for r in runs)
    killed = sum(1 for r in runs if r.get("interrupted"))
    last = runs[-1]
    phases = (
        ", ".join(
            f"{p['phase']}: {p.get('jobs', '?')} job(s) on {p['workers']} worker(s) x "
            f"{p['threads_per_worker']} thread(s)"
            + (f" x {p['ranks']} ranks" if p.get("ranks", 1) > 1 else "")
            for p in last["phases"]
        )
        or "every job already done"
    )
    text = f"{'about ' if killed else ''}{total:.0f} s wall"
    if len(runs) > 1:
        text += (
            f" over {len(runs)} invocations (resumed {len(runs) - 1} time(s)"
            + (
                f", {killed} after it was interrupted: its time runs to the last file it wrote"
                if killed
                else ""
            )
            + f"; this one {float(last['wall_seconds'] or 0.0):.0f} s)"
        )
    text += f"; {phases}"
    m = summary.get("machine")
    if isinstance(m, dict):
        text += (
            f"; on {m.get('cpu')} ({m.get('cores')} cores, {m.get('architecture')}, "
            f"{m.get('system')})" + (f" with {m['gpu']}" if m.get("gpu") else "")
        )
    return text


def read_invocations(out: str) -> list[dict[str, Any]]:
    """The earlier invocations of this sweep (how each ran), from ``invocations.json``."""
    path = os.path.join(out, INVOCATIONS)
    if not os.path.exists(path):
        return []
    runs = read_json(path, "invocations file")
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        raise InputError(f"{path} is not a posemb lab invocations file; use another --out")
    return runs


def closed(runs: list[dict[str, Any]], out: str, now: float) -> list[dict[str, Any]]:
    """``runs`` with each invocation that never finished (killed) given the wall time up to
    the last file the sweep wrote before ``now``: an estimate, marked as one."""
    stamps = []
    for root, _dirs, files in os.walk(out):
        stamps += [os.path.getmtime(os.path.join(root, f)) for f in files]
    out_runs = []
    for i, r in enumerate(runs):
        if r.get("wall_seconds") is None and isinstance(r.get("started_unix"), (int, float)):
            start = float(r["started_unix"])
            nxt = runs[i + 1].get("started_unix", now) if i + 1 < len(runs) else now
            last = max((t for t in stamps if start <= t < float(nxt)), default=start)
            r = r | {"wall_seconds": last - start, "interrupted": True}
        out_runs.append(r)
    return out_runs


__all__ = [
    "INVOCATIONS",
    "closed",
    "how_it_ran",
    "invocation",
    "machine_description",
    "one_invocation",
    "read_invocations",
]
