"""The lab's report: the summary of a sweep, its Markdown table, its plots, and the compact
summary of the default run that ships with posemb.

``src/posemb/lab/data/default_summary.json`` is :func:`compact` of ``docs/lab/results.json``
(the default protocol, ``posemb lab --seeds 0 1``); ``python scripts/make_lab_summary.py``
regenerates it, and a test checks that it still matches.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Sequence
from dataclasses import asdict
from importlib import resources
from typing import TYPE_CHECKING

import torch

from .._io import atomic_write, atomic_write_bytes
from .._version import __version__

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from .corpus import Corpus
    from .sweep import LabConfig

DEFAULT_SUMMARY = "default_summary.json"


def mean_std(values: Sequence[float]) -> dict[str, float | int | None]:
    """``{"mean", "std", "n"}`` of one or more values; ``std`` is the sample standard deviation
    (n - 1 in the denominator), None for a single value."""
    n = len(values)
    mean = sum(values) / n
    std = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5 if n > 1 else None
    return {"mean": mean, "std": std, "n": n}


def summarise(
    cfg: LabConfig,
    data: Corpus,
    results: Sequence[dict],
    wall: float,
    workers: int,
    threads: int,
) -> dict[str, object]:
    """The sweep's summary (what results.json holds) from its jobs' results.

    ``results[variant][str(eval_len)]`` holds ``all`` and ``past`` (:func:`mean_std` over seeds
    of the mean loss over all positions / past the training length; ``past`` absent at the
    training length) and ``curve`` (the per-position loss, averaged over seeds).
    """
    table: dict[str, dict[str, dict[str, object]]] = {}
    extra = ("rope+pi+ft",) if cfg.finetune_steps else ()
    for variant in (*cfg.variants, *extra):
        per_len: dict[str, dict[str, object]] = {}
        for n in cfg.eval_lens:
            key = str(n)
            rows = [r["variants"][variant][key] for r in results if variant in r["variants"]]
            if not rows:
                continue
            entry: dict[str, object] = {}
            for part in ("all", "past"):
                vals = [x[part] for x in rows if x[part] is not None]
                if vals:
                    entry[part] = mean_std(vals)
            entry["curve"] = [
                sum(c) / len(c) for c in zip(*(x["curve"] for x in rows), strict=True)
            ]
            per_len[key] = entry
        table[variant] = per_len
    return {
        "config": {k: v for k, v in asdict(cfg).items()},
        "corpus": {"name": data.name, "characters": len(data.ids), "vocab": len(data.vocab)},
        "unigram_entropy": data.unigram_entropy(),
        "results": table,
        "train_seconds": {f"{r['encoding']}-seed{r['seed']}": r["train_seconds"] for r in results},
        "wall_seconds": wall,
        "workers": workers,
        "threads_per_worker": threads,
        "versions": {
            "posemb": __version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "machine": platform.machine(),
    }


def write(summary: dict, out: str) -> list[str]:
    """Write results.json, results.md and the plots under ``out``; record the plots' paths in
    ``summary["plots"]`` and return them."""
    atomic_write_bytes(os.path.join(out, "results.json"), json.dumps(summary, indent=2).encode())
    atomic_write_bytes(os.path.join(out, "results.md"), markdown(summary).encode())
    plots = _plots(summary, out)
    summary["plots"] = plots
    return plots


def compact(summary: dict) -> dict[str, object]:
    """What a lesson claim needs from a sweep's summary (results.json), without the curves.

    Returns ``{"corpus": {"name", "characters", "vocab"}, "unigram_entropy", "train_len",
    "eval_lens", "config", "versions", "results"}`` where ``results[variant][str(eval_len)]``
    is ``{"all": {"mean", "std", "n"}, "past": {"mean", "std", "n"} or None}``: the loss in
    nats/char over all positions and past the training length (None at the training length),
    mean over ``n`` seeds, ``std`` None when ``n`` is 1. JSON-ready (lists, not tuples).
    """
    cfg = json.loads(json.dumps(summary["config"]))
    return {
        "corpus": dict(summary["corpus"]),
        "unigram_entropy": summary["unigram_entropy"],
        "train_len": cfg["train_len"],
        "eval_lens": list(cfg["eval_lens"]),
        "config": cfg,
        "versions": dict(summary["versions"]),
        "results": {
            variant: {
                n: {"all": dict(e["all"]), "past": dict(e["past"]) if e.get("past") else None}
                for n, e in per_len.items()
            }
            for variant, per_len in summary["results"].items()
        },
    }


def write_default_summary(results_json: str, out: str | None = None) -> str:
    """Write :func:`compact` of the sweep summary ``results_json`` to ``out`` (default: the
    packaged ``lab/data/default_summary.json``), atomically; return the path written."""
    with open(results_json, encoding="utf-8") as f:
        small = compact(json.load(f))
    if out is None:
        out = os.path.join(os.path.dirname(__file__), "data", DEFAULT_SUMMARY)
    atomic_write_bytes(out, (json.dumps(small, indent=1) + "\n").encode())
    return out


def default_summary() -> dict[str, object]:
    """The shipped :func:`compact` summary of the default lab run (``docs/lab/results.json``)."""
    text = resources.files("posemb.lab").joinpath(f"data/{DEFAULT_SUMMARY}").read_text("utf-8")
    return json.loads(text)


def markdown(summary: dict) -> str:
    """The report table: loss (nats/char) over all positions and past the training length."""
    cfg = summary["config"]
    lens = cfg["eval_lens"]
    train = cfg["train_len"]
    head = (
        "| variant | "
        + " | ".join(f"{n} ({n // train}x)" if n % train == 0 else str(n) for n in lens)
        + " |"
    )
    lines = [
        f"Loss in nats/char on held-out {summary['corpus']['name']} text; each cell is "
        f"all positions / positions past the training length ({train}), mean over "
        f"{len(cfg['seeds'])} seed(s){' ± std' if len(cfg['seeds']) > 1 else ''}. Unigram "
        f"entropy {summary['unigram_entropy']:.2f}.",
        "",
        head,
        "|" + "---|" * (len(lens) + 1),
    ]

    def cell(e: dict | None) -> str:
        if not e:
            return "-"
        s = f"{e['mean']:.2f}"
        if e.get("std") is not None:
            s += f" ± {e['std']:.2f}"
        return s

    for variant, per_len in summary["results"].items():
        cells = []
        for n in lens:
            e = per_len.get(str(n), {})
            cells.append(cell(e.get("all")) + " / " + cell(e.get("past")))
        label = variant + (" (untrained rows past train_len)" if variant == "learned" else "")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"{cfg['layers']} layers, width {cfg['width']}, {cfg['heads']} heads, {cfg['steps']} "
        f"steps of batch {cfg['batch']} x {train}, AdamW {cfg['lr']}; {summary['workers']} "
        f"worker(s) x {summary['threads_per_worker']} thread(s), {summary['wall_seconds']:.0f} s "
        f"wall; torch {summary['versions']['torch']}.",
        "A learned table has no trained row past its training length: its 'past' numbers use "
        "rows that were never updated, which is what such a model does when run longer.",
    ]
    return "\n".join(lines) + "\n"


def _plots(summary: dict, out: str) -> list[str]:
    """PNG plots when matplotlib is installed; the list of files written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    cfg = summary["config"]
    lens, train = cfg["eval_lens"], cfg["train_len"]
    written = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for variant, per_len in summary["results"].items():
        xs = [n for n in lens if per_len.get(str(n), {}).get("past")]
        ys = [per_len[str(n)]["past"]["mean"] for n in xs]
        if xs:
            ax.plot(xs, ys, marker="o", label=variant)
    ax.axhline(summary["unigram_entropy"], color="grey", ls=":", label="unigram entropy")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel(f"loss past position {train} (nats/char)")
    ax.set_title("Loss beyond the training length")
    ax.legend(fontsize=7, ncol=2)
    written.append(_save_figure(fig, os.path.join(out, "loss_vs_length.png")))

    longest = str(max(lens))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for variant, per_len in summary["results"].items():
        curve = per_len.get(longest, {}).get("curve")
        if curve:
            k = max(1, len(curve) // 64)  # smooth over k positions
            smooth = [
                sum(curve[i : i + k]) / len(curve[i : i + k]) for i in range(0, len(curve), k)
            ]
            ax.plot([i * k for i in range(len(smooth))], smooth, label=variant)
    ax.axvline(train, color="grey", ls="--", label="training length")
    ax.set_xlabel(f"position in a {longest}-token window")
    ax.set_ylabel("loss (nats/char)")
    ax.set_title("Loss by position")
    ax.legend(fontsize=7, ncol=2)
    written.append(_save_figure(fig, os.path.join(out, "loss_vs_position.png")))
    return written


def _save_figure(fig: Figure, path: str) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)
    return path
