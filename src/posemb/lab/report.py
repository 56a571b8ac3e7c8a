"""The lab's report: the summary of a sweep, its Markdown table, its plots, and the compact
summary of the default run that ships with posemb.

``src/posemb/lab/data/default_summary.json`` is :func:`compact` of ``docs/lab/results.json``
(the default protocol, ``posemb lab``); ``python scripts/make_lab_summary.py``
regenerates it, and a test checks that it still matches.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import math
import os
import platform
from collections.abc import Callable, Sequence
from dataclasses import asdict
from importlib import resources
from typing import TYPE_CHECKING, Any, cast

import torch

from .._errors import InputError
from .._io import atomic_write_bytes
from .._version import __version__
from . import checkpoints as _checkpoints
from .invocations import how_it_ran, invocation, machine_description, one_invocation
from .plots import draw as _plots
from .race import RACE_UNIT
from .schema import Probe, Summary
from .tasks import PROBE_TASKS

if TYPE_CHECKING:
    from .config import LabConfig
    from .corpus import Corpus

logger = logging.getLogger("posemb.lab")

DEFAULT_SUMMARY = "default_summary.json"
RECENT_SUMMARY = "recent_summary.json"
SHIPPED_SUMMARIES = {"classic": DEFAULT_SUMMARY, "recent": RECENT_SUMMARY}
"""The suites whose :func:`compact` summary ships in ``lab/data`` (the lesson reads them)."""


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
    workers: int | None = None,
    threads: int | None = None,
    *,
    runs: Sequence[dict] | None = None,
) -> dict[str, object]:
    """The sweep's summary (what results.json holds) from its jobs' results.

    ``results[variant][str(eval_len)]`` holds ``all`` and ``past`` (:func:`mean_std` over seeds
    of the mean loss over all positions / past the training length; ``past`` absent at the
    training length) and ``curve`` (the per-position loss, averaged over seeds).

    ``runs`` are the sweep's invocations (:func:`invocation`, the last one this), so that a
    resumed sweep's report gives every invocation's wall time and how its phases ran;
    without them, one invocation of ``wall`` seconds with ``workers`` x ``threads``.
    """
    lm = [r for r in results if r.get("kind", "lm") == "lm"]
    table: dict[str, dict[str, dict[str, object]]] = {}
    extra = ("rope+pi+ft",) if cfg.finetune_steps else ()
    for variant in (*cfg.variants, *extra):
        per_len: dict[str, dict[str, object]] = {}
        for n in cfg.eval_lens:
            key = str(n)
            rows = [r["variants"][variant][key] for r in lm if variant in r["variants"]]
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
        if per_len:
            table[variant] = per_len
    race = [r for r in results if r.get("kind") == "race"]
    return {
        "config": {k: v for k, v in asdict(cfg).items()},
        "corpus": {
            "name": data.name,
            "source": data.source,
            "characters": len(data.ids),
            "vocab": len(data.vocab),
        },
        "unigram_entropy": data.unigram_entropy(),
        "results": table,
        "coincide": coincident(table),
        # The race trains a retrieval model of its own; that is not the retrieval task.
        **{task: _probe_summary(cfg, results, task) for task in PROBE_TASKS},
        "entropy": _entropy_summary(cfg, lm) if "entropy" in cfg.tasks and lm else None,
        "race": _race_summary(cfg, race) if race else None,
        "train_seconds": {_job_name(r): r["train_seconds"] for r in results},
        "wall_seconds": wall,
        "invocations": list(runs) if runs else [one_invocation(wall, workers, threads)],
        "versions": {
            "posemb": __version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "machine": machine_description(cfg.device),
    }


def _job_name(r: dict) -> str:
    kind = r.get("kind", "lm")
    name = f"{r['encoding']}-seed{r['seed']}"
    if kind == "race":
        return f"race-{name}-race{r['race_seed']}"
    return name if kind == "lm" else f"{kind}-{name}"


def accuracy(counts: Sequence[dict]) -> dict[str, object]:
    """Accuracy of one or more runs' ``{"correct", "total"}``: ``{"mean", "std", "n"}`` over
    runs (as :func:`mean_std`), the pooled ``correct`` and ``total``, and ``se``, the binomial
    standard error of the pooled accuracy (the noise of the probes themselves)."""
    stats: dict[str, object] = dict(mean_std([c["correct"] / c["total"] for c in counts]))
    correct, total = sum(c["correct"] for c in counts), sum(c["total"] for c in counts)
    p = correct / total
    stats |= {"correct": correct, "total": total, "se": math.sqrt(p * (1 - p) / total)}
    return stats


def noise(e: dict) -> float | None:
    """The standard error of a :func:`mean_std` or :func:`accuracy` entry: its ``se`` where it
    has one (the binomial one for accuracies, which also holds for one seed; a race accuracy's,
    None for one model seed), std / sqrt(n) otherwise (None for n = 1)."""
    if "se" in e:
        return None if e["se"] is None else float(e["se"])
    if e.get("std") is None:
        return None
    return float(e["std"]) / math.sqrt(int(e["n"]))


def differs(a: dict, b: dict) -> bool | None:
    """Whether two means differ by more than twice their combined standard error; None when a
    single seed leaves the noise unknown."""
    sa, sb = noise(a), noise(b)
    if sa is None or sb is None:
        return None
    return abs(float(a["mean"]) - float(b["mean"])) > 2 * math.hypot(sa, sb)


def coincident(table: dict) -> list[list[str]]:
    """Groups of variants whose mean loss is the same (to 1e-9) at every length: one line in a
    plot hides the others (``rope+dynamic`` is ``rope+ntk`` when a window is scored in one
    call). Plots draw the first and name the group in the legend."""
    groups: list[list[str]] = []
    for variant, per_len in table.items():
        key = [(n, e["all"]["mean"]) for n, e in sorted(per_len.items())]
        for g in groups:
            other = [(n, e["all"]["mean"]) for n, e in sorted(table[g[0]].items())]
            if len(other) == len(key) and all(
                n1 == n2 and abs(a - b) < 1e-9 for (n1, a), (n2, b) in zip(key, other, strict=True)
            ):
                g.append(variant)
                break
        else:
            groups.append([variant])
    return [g for g in groups if len(g) > 1]


def _probe_summary(cfg: LabConfig, results: Sequence[dict], task: str) -> dict[str, object] | None:
    """A probe task's accuracies by variant and length, by distance, with chance and sizes;
    None when the sweep did not run the task."""
    rows = [r for r in results if r.get("kind") == task]
    if not rows or task not in cfg.tasks:
        return None
    probe_task = PROBE_TASKS[task]
    variants: dict[str, dict[str, object]] = {}
    pooled: dict[str, dict[str, object]] = {}
    names = [v for v in cfg.variants if any(v in r["variants"] for r in rows)]
    for variant in names:
        runs = [r["variants"][variant] for r in rows if variant in r["variants"]]
        per_len: dict[str, object] = {}
        bins: dict[str, list[dict]] = {}
        for n in cfg.eval_lens:
            at = [run[str(n)] for run in runs]
            by_d = {}
            for label in at[0]["by_distance"]:
                counts = [a["by_distance"][label] for a in at]
                by_d[label] = accuracy(counts)
                bins.setdefault(label, []).extend(counts)
            per_len[str(n)] = {
                "anywhere": accuracy([a["anywhere"] for a in at]),
                "control": accuracy([a["control"] for a in at]),
                "by_distance": by_d,
            }
        variants[variant] = per_len
        pooled[variant] = {label: accuracy(c) for label, c in bins.items()}
    sizes = dict(zip(probe_task.size_fields, probe_task.sizes(cfg), strict=True))
    return {
        "chance": probe_task.chance,
        # The retrieval task's one size keeps its first name (the lesson and schema read it).
        **({"facts": cfg.retrieval_facts} if task == "retrieval" else {}),
        "sizes": sizes,
        "description": probe_task.description,
        "probes": cfg.retrieval_probes,
        "final_train_loss": {
            f"{r['encoding']}-seed{r['seed']}": r["final_train_loss"] for r in rows
        },
        "variants": variants,
        "by_distance": pooled,
    }


def _entropy_summary(cfg: LabConfig, rows: Sequence[dict]) -> dict[str, object]:
    from . import entropy

    variants: dict[str, dict[str, object]] = {}
    for r in rows:
        for variant in r.get("entropy", {}):
            variants.setdefault(variant, {})
    for variant in variants:
        runs = [r["entropy"][variant] for r in rows if variant in r.get("entropy", {})]
        modes: dict[str, object] = {}
        for mode in ("off", "on"):
            per_len = {}
            for n in cfg.eval_lens:
                at = [run[mode][str(n)] for run in runs]
                layers = [mean_std(list(v)) for v in zip(*(a["entropy"] for a in at), strict=True)]
                per_len[str(n)] = {
                    "layers": layers,
                    "mean": mean_std([sum(a["entropy"]) / len(a["entropy"]) for a in at]),
                    "loss": mean_std([a["loss"] for a in at]),
                    "past": mean_std([a["past"] for a in at])
                    if at[0]["past"] is not None
                    else None,
                }
            modes[mode] = per_len
        variants[variant] = modes
    return {
        "uniform": {str(n): entropy.uniform_entropy(n) for n in cfg.eval_lens},
        "windows": cfg.entropy_windows,
        "variants": variants,
    }


def _race_summary(cfg: LabConfig, rows: Sequence[dict]) -> dict[str, object]:
    """The race by entrant, milestone N and length, over model seeds.

    The independent unit is the model seed: the fine-tuning seeds of one model are repeated
    fine-tunings of the same model (at N = 0, copies of it), so each model seed's number is
    first the mean over its race seeds. ``loss_past`` is :func:`mean_std` of those means
    (``n`` model seeds) with ``runs``, the jobs behind them; ``retrieval`` is
    :func:`_race_accuracy`.
    """
    entrants: dict[str, dict[str, object]] = {}
    for entrant in cfg.race_entrants:
        by_seed: dict[int, list[dict]] = {}
        for r in rows:
            if r["encoding"] == entrant:
                by_seed.setdefault(int(r["seed"]), []).append(r["milestones"])
        if not by_seed:
            continue
        per_step: dict[str, object] = {}
        for step in cfg.race_steps:
            at = [[run[str(step)] for run in runs] for _, runs in sorted(by_seed.items())]
            first = at[0][0]
            loss: dict[str, object] = {}
            for n in first["loss_past"]:
                means = [sum(a["loss_past"][n] for a in s) / len(s) for s in at]
                loss[n] = mean_std(means) | {"runs": sum(map(len, at))}
            per_step[str(step)] = {
                "loss_past": loss,
                "retrieval": {
                    n: _race_accuracy([[a["retrieval"][n] for a in s] for s in at])
                    for n in first["retrieval"]
                },
            }
        entrants[entrant] = per_step
    return {
        "race_len": cfg.race_len,
        "eval_lens": list(cfg.race_eval_lens()),
        "steps": list(cfg.race_steps),
        "runs": len(cfg.seeds) * len(cfg.race_seeds),
        "seeds": list(cfg.seeds),
        "race_seeds": list(cfg.race_seeds),
        "unit": RACE_UNIT,
        "entrants": entrants,
    }


def _race_accuracy(by_seed: Sequence[Sequence[dict]]) -> dict[str, object]:
    """A race accuracy from each model seed's race runs' ``{"correct", "total"}``.

    ``mean``, ``std``, ``n``: over model seeds of each one's mean over its race seeds.
    ``correct`` and ``total`` pool every run; ``probes`` is one run's ``total``: every run is
    scored on the same probes (drawn from ``EVAL_SEED``), so the binomial noise of the probe
    set is that of ``probes``, not of ``total``, however many models or copies answered them.
    ``se`` adds that probe noise to std / sqrt(n) in quadrature (two models that happen to
    score alike do not make a gap certain); None for one model seed, whose spread is unknown.
    """
    accs = [sum(c["correct"] / c["total"] for c in s) / len(s) for s in by_seed]
    stats = mean_std(accs)
    correct = sum(c["correct"] for s in by_seed for c in s)
    total = sum(c["total"] for s in by_seed for c in s)
    probes = min(c["total"] for s in by_seed for c in s)
    p = correct / total
    std = stats["std"]
    se = (
        None
        if std is None
        else math.hypot(float(std) / math.sqrt(len(accs)), math.sqrt(p * (1 - p) / probes))
    )
    return {
        **stats,
        "runs": sum(map(len, by_seed)),
        "correct": correct,
        "total": total,
        "probes": probes,
        "se": se,
    }


def write(summary: dict, out: str) -> list[str]:
    """Write results.json, results.md and the plots under ``out`` (the lab's folder: files
    it did not write are never replaced); remove the plots an earlier report of this folder
    drew that this one does not (a task dropped); record the plots' paths in
    ``summary["plots"]`` and return them."""
    folder = _checkpoints.folder(out)
    folder.write_bytes("results.json", json.dumps(summary, indent=2).encode())
    folder.write_bytes("results.md", markdown(summary).encode())
    plots = _plots(summary, out)
    drawn = {os.path.relpath(p, out) for p in plots}
    folder.prune(keep=lambda rel: rel not in _checkpoints.PLOT_FILES or rel in drawn)
    summary["plots"] = plots
    return plots


def compact(summary: dict) -> Summary:
    """What the lesson's claims and figures need from a sweep's summary (results.json), without
    the per-position curves.

    Returns ``{"corpus": {"name", "characters", "vocab"}, "unigram_entropy", "train_len",
    "eval_lens", "config", "versions", "results", "coincide", "retrieval", "multikey",
    "vartrack", "flipflop", "entropy", "race"}``
    where ``results[variant][str(eval_len)]`` is ``{"all": {"mean", "std", "n"}, "past":
    {"mean", "std", "n"} or None}``: the loss in nats/char over all positions and past the
    training length (None at the training length), mean over ``n`` seeds, ``std`` None when
    ``n`` is 1. ``retrieval`` keeps accuracy by length (``anywhere``, ``control``) and by
    distance pooled over lengths, and ``multikey``, ``vartrack`` and ``flipflop`` the same with
    their sizes;
    ``entropy`` the per-layer means and the mean over layers; ``race`` is kept whole. A task
    the sweep did not run is None.
    JSON-ready (lists, not tuples).
    """
    cfg = json.loads(json.dumps(summary["config"]))
    r = summary.get("retrieval")
    e = summary.get("entropy")
    out: dict[str, Any] = {
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
        "coincide": summary.get("coincide") or [],
        "retrieval": None
        if not r
        else {
            "chance": r["chance"],
            "facts": r["facts"],
            "probes": r["probes"],
            "variants": {
                v: {n: {k: x[k] for k in ("anywhere", "control")} for n, x in per_len.items()}
                for v, per_len in r["variants"].items()
            },
            "by_distance": r["by_distance"],
        },
        **{task: _compact_probe(summary.get(task)) for task in PROBE_TASKS if task != "retrieval"},
        "entropy": None
        if not e
        else {
            "uniform": e["uniform"],
            "variants": {
                v: {
                    mode: {
                        n: {"layers": [x["mean"] for x in at["layers"]], "mean": at["mean"]}
                        for n, at in per_len.items()
                    }
                    for mode, per_len in modes.items()
                }
                for v, modes in e["variants"].items()
            },
        },
        "race": summary.get("race"),
    }
    return cast(Summary, out)


def _compact_probe(task: dict | None) -> Probe | None:
    """A probe task's part of :func:`compact` (``multikey``, ``vartrack``, ``flipflop``):
    chance, its size,
    accuracy by length (``anywhere``, ``control``), and by distance pooled over lengths."""
    if not task:
        return None
    out = {
        "chance": task["chance"],
        "sizes": dict(task["sizes"]),
        "probes": task["probes"],
        "variants": {
            v: {n: {k: x[k] for k in ("anywhere", "control")} for n, x in per_len.items()}
            for v, per_len in task["variants"].items()
        },
        "by_distance": task["by_distance"],
    }
    return cast(Probe, out)


def write_default_summary(
    results_json: str, out: str | None = None, *, suite: str = "classic"
) -> str:
    """Write :func:`compact` of the sweep summary ``results_json`` to ``out`` (default: the
    packaged summary of ``suite``, ``lab/data/default_summary.json`` for the default
    ``classic`` suite, ``lab/data/recent_summary.json`` for ``recent``), atomically; return
    the path written."""
    if suite not in SHIPPED_SUMMARIES:
        raise InputError(
            f"suite: {suite!r} has no shipped summary; one of {list(SHIPPED_SUMMARIES)}"
        )
    with open(results_json, encoding="utf-8") as f:
        small = compact(json.load(f))
    if out is None:
        out = os.path.join(os.path.dirname(__file__), "data", SHIPPED_SUMMARIES[suite])
    atomic_write_bytes(out, (json.dumps(small, indent=1) + "\n").encode())
    return out


def default_summary() -> Summary:
    """The shipped :func:`compact` summary of the default lab run (``docs/lab/results.json``);
    :class:`posemb.lab.schema.LabSummary` reads it."""
    return _shipped(DEFAULT_SUMMARY)


def recent_summary() -> Summary:
    """The shipped :func:`compact` summary of ``posemb lab --suite recent``
    (``docs/lab/recent/results.json``): the 2024-26 encodings beside RoPE and NoPE, with the
    multikey, variable-tracking and flip-flop tasks."""
    return _shipped(RECENT_SUMMARY)


def _shipped(name: str) -> Summary:
    text = resources.files("posemb.lab").joinpath(f"data/{name}").read_text("utf-8")
    return cast(Summary, json.loads(text))


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
        f"Loss in nats/char on held-out {summary['corpus']['name']} text"
        f"{_source(summary['corpus'])}; each cell is "
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
    for group in summary.get("coincide") or []:
        lines.append(
            f"\n{' and '.join(group)} give the same loss at every length (one line in the plot)."
        )
    if len(cfg["seeds"]) == 1:
        lines.append(
            "\nOne seed: the spread over seeds is unknown, so no difference in this table is "
            "called beyond noise (run with --seeds 0 1 for that)."
        )
    elif verdict := _loss_noise(summary):
        lines.append("\n" + verdict)
    lines += [
        "",
        f"{cfg['layers']} layers, width {cfg['width']}, {cfg['heads']} heads, {cfg['steps']} "
        f"steps of batch {cfg['batch']} x {train}, AdamW {cfg['lr']}; {how_it_ran(summary)}; "
        f"torch {summary['versions']['torch']}.",
        "A learned table has no trained row past its training length: its 'past' numbers use "
        "rows that were never trained (only weight decay touched them), which is what such a model "
        "does when run longer.",
    ]
    parts: list[Callable[[dict], str]] = [functools.partial(_probe_md, task=t) for t in PROBE_TASKS]
    for part in (*parts, _entropy_md, _race_md):
        text = part(summary)
        if text:
            lines += ["", text]
    return "\n".join(lines) + "\n"


def _source(corpus: dict) -> str:
    """`` (from <where>)`` for a summary that records its corpus's source; empty otherwise."""
    where = corpus.get("source")
    return f" (from {where})" if where else ""


def _loss_noise(summary: dict) -> str:
    """Which neighbouring variants (ordered by loss past the training length) differ, at every
    evaluation length past training (not the list's tail: with no length at the training
    length itself, the first was skipped, silently)."""
    cfg, table = summary["config"], summary["results"]
    out = []
    for n in (n for n in cfg["eval_lens"] if n > cfg["train_len"]):
        rows = sorted(
            ((v, e[str(n)]["past"]) for v, e in table.items() if e.get(str(n), {}).get("past")),
            key=lambda r: r[1]["mean"],
        )
        if len(rows) < 2:  # one variant has no neighbour to differ from
            continue
        ties = [
            f"{a} ~ {b}" for (a, ea), (b, eb) in itertools.pairwise(rows) if not differs(ea, eb)
        ]
        out.append(f"at {n}: " + (", ".join(ties) if ties else "every neighbour differs"))
    if not out:  # no length past training, or one variant: no verdict to give
        return ""
    return "Within noise (neighbours by loss past training, gap < 2 standard errors): " + (
        "; ".join(out)
    )


def _acc(e: dict | None) -> str:
    if not e:
        return "-"
    text = f"{e['mean']:.2f}"
    if e.get("std") is not None:
        text += f" ± {e['std']:.2f}"
    return text


def _len_head(lens: Sequence[int], train: int) -> str:
    return " | ".join(f"{n} ({n // train}x)" if n % train == 0 else str(n) for n in lens)


def _probe_md(summary: dict, task: str) -> str:
    r = summary.get(task)
    if not r or not r["variants"]:
        return ""
    cfg = summary["config"]
    lens, train = cfg["eval_lens"], cfg["train_len"]
    worst_se = max(
        e["anywhere"]["se"] for per_len in r["variants"].values() for e in per_len.values()
    )
    noise = f"Binomial standard error at most {worst_se:.2f} per cell" + (
        ", ± std over seeds." if len(cfg["seeds"]) > 1 else "."
    )
    if task == "retrieval":
        head = (
            f"Retrieval accuracy ({r['facts']} facts per window, the query last, its fact at a "
            f"random depth; {r['probes']} probes per length and seed; chance "
            f"{r['chance']:.3f}). {noise} Control: the queried fact removed, pooled over lengths."
        )
    else:
        sizes = "".join(f"; {k} {v}" for k, v in r["sizes"].items())
        head = (
            f"{PROBE_TASKS[task].title} accuracy ({r['description']}{sizes}; {r['probes']} probes "
            f"per length and seed; chance {r['chance']:.3f}). {noise} Control: what the answer "
            f"depends on removed, pooled over lengths."
        )
    lines = [
        head,
        "",
        f"| variant | {_len_head(lens, train)} | control |",
        "|" + "---|" * (len(lens) + 2),
    ]
    for variant, per_len in r["variants"].items():
        cells = [_acc(per_len.get(str(n), {}).get("anywhere")) for n in lens]
        ctl = [e["control"] for e in per_len.values()]
        rate = sum(c["correct"] for c in ctl) / sum(c["total"] for c in ctl)
        lines.append(f"| {variant} | " + " | ".join(cells) + f" | {rate:.2f} |")
    bins = list(next(iter(r["by_distance"].values())))
    lines += [
        "",
        "By distance between fact and query (pooled over lengths; training distances end at "
        f"{train - 1}):",
        "",
        "| variant | " + " | ".join(bins) + " |",
        "|" + "---|" * (len(bins) + 1),
    ]
    for variant, per_bin in r["by_distance"].items():
        cells = [
            f"{per_bin[b]['correct'] / per_bin[b]['total']:.2f}" if b in per_bin else "-"
            for b in bins
        ]
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _entropy_md(summary: dict) -> str:
    e = summary.get("entropy")
    if not e:
        return ""
    cfg = summary["config"]
    lens, train = cfg["eval_lens"], cfg["train_len"]
    lines = [
        "Attention entropy (nats; mean over layers, heads, query positions and "
        f"{e['windows']} held-out windows), attention factor off / on (logits x (0.1 ln s + "
        "1)^2, s = length / training length); 'uniform' attends evenly to every visible key.",
        "",
        f"| variant | {_len_head(lens, train)} |",
        "|" + "---|" * (len(lens) + 1),
        "| uniform | " + " | ".join(f"{e['uniform'][str(n)]:.2f}" for n in lens) + " |",
    ]
    for variant, modes in e["variants"].items():
        cells = []
        for n in lens:
            off, on = modes["off"][str(n)]["mean"]["mean"], modes["on"][str(n)]["mean"]["mean"]
            cells.append(f"{off:.2f}" if n == train else f"{off:.2f} / {on:.2f}")
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _race_md(summary: dict) -> str:
    r = summary.get("race")
    if not r:
        return ""
    steps = r["steps"]
    models = len(r["seeds"])
    by_model = r.get("unit") == RACE_UNIT
    lines = [
        f"The fine-tuning race: the RoPE models continued at {r['race_len']} tokens for N steps "
        f"under each schedule; "
        + (
            f"mean{' ± std' if models > 1 else ''} over {models} model seed(s) {r['seeds']}, "
            f"each the mean of its fine-tuning seeds {r['race_seeds']} (fine-tunings of one "
            "model are repeated measurements of it, not independent models; at N=0 they are "
            "the same model)."
            if by_model
            else f"mean ± std over {r['runs']} runs (model seeds {r['seeds']} x fine-tuning "
            f"seeds {r['race_seeds']})."
        ),
    ]
    if not by_model:
        why = (
            "This summary's spread counts every fine-tuning seed as an independent model, so no "
            "gap in it is called beyond noise (a new run counts model seeds)."
        )
    elif models == 1:
        why = (
            "One model seed: the spread over models is unknown, so no gap in the race is called "
            "beyond noise (run with --seeds 0 1 for that)."
        )
    else:
        why = ""
    if why:
        lines.append("\n" + why)
    for n in r["eval_lens"]:
        for metric, label in (
            ("loss_past", "loss past the training length"),
            ("retrieval", "retrieval accuracy"),
        ):
            lines += [
                "",
                f"{label} at {n} tokens:",
                "",
                "| entrant | " + " | ".join(f"N={k}" for k in steps) + " |",
                "|" + "---|" * (len(steps) + 1),
            ]
            for entrant, per_step in r["entrants"].items():
                cells = [_acc(per_step[str(k)][metric][str(n)]) for k in steps]
                lines.append(f"| {entrant} | " + " | ".join(cells) + " |")
            last = str(steps[-1])
            rows = sorted(
                ((e, p[last][metric][str(n)]) for e, p in r["entrants"].items()),
                key=lambda t: t[1]["mean"],
                reverse=metric == "retrieval",
            )
            best, best_e = rows[0]
            verdicts = [(e, differs(best_e, x)) for e, x in rows[1:]]
            if why or any(v is None for _, v in verdicts):
                lines.append(f"\nAt N={last} the best is {best}; no gap is called beyond noise.")
                continue
            beaten = [e for e, v in verdicts if v]
            lines.append(
                f"\nAt N={last} the best is {best}; beyond noise (2 standard errors over "
                f"{models} model seeds) it beats " + (", ".join(beaten) if beaten else "none") + "."
            )
    return "\n".join(lines)


__all__ = [
    "DEFAULT_SUMMARY",
    "RECENT_SUMMARY",
    "SHIPPED_SUMMARIES",
    "accuracy",
    "coincident",
    "compact",
    "default_summary",
    "differs",
    "how_it_ran",
    "invocation",
    "machine_description",
    "markdown",
    "mean_std",
    "noise",
    "recent_summary",
    "summarise",
    "write",
    "write_default_summary",
]
