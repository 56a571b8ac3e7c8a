"""The lab report's plots (matplotlib, when installed), written into the lab's folder under
the names :data:`posemb.lab.checkpoints.PLOT_FILES` lists, each variant in its one look
(:mod:`posemb.lab.style`).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from .. import _extras
from . import checkpoints as _checkpoints
from .race import RACE_UNIT

if TYPE_CHECKING:
    from matplotlib.figure import Figure

logger = logging.getLogger("posemb.lab")


def draw(summary: dict, out: str) -> list[str]:
    """PNG plots when matplotlib is installed; the list of files written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        logger.warning("posemb: lab plots not drawn: %s", _extras.missing(err, "drawing them"))
        return []
    cfg = summary["config"]
    lens, train = cfg["eval_lens"], cfg["train_len"]
    written = []
    hidden = {v: g for g in summary.get("coincide") or [] for v in g[1:]}
    names = {g[0]: " = ".join(g) for g in summary.get("coincide") or []}
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for variant, per_len in summary["results"].items():
        if variant in hidden:
            continue  # drawn under the first of its group, whose label names it
        xs = [n for n in lens if per_len.get(str(n), {}).get("past")]
        ys = [per_len[str(n)]["past"]["mean"] for n in xs]
        if xs:
            ax.plot(xs, ys, **_style(variant), label=names.get(variant, variant))
    ax.axhline(summary["unigram_entropy"], color="grey", ls=":", label="unigram entropy")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel(f"loss past position {train} (nats/char)")
    ax.set_title("Loss beyond the training length")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # off the lines
    written.append(_save_figure(fig, os.path.join(out, "loss_vs_length.png")))

    longest = str(max(lens))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    curves = {
        v: per_len[longest]["curve"]
        for v, per_len in summary["results"].items()
        if per_len.get(longest, {}).get("curve")
    }
    for variant, (label, curve) in _merged(curves).items():
        k = max(1, len(curve) // 64)  # smooth over k positions
        smooth = [sum(curve[i : i + k]) / len(curve[i : i + k]) for i in range(0, len(curve), k)]
        style = _style(variant) | {"marker": None}
        ax.plot([i * k for i in range(len(smooth))], smooth, **style, label=label)
    ax.axvline(train, color="grey", ls="--", label="training length")
    ax.set_xlabel(f"position in a {longest}-token window")
    ax.set_ylabel("loss (nats/char)")
    ax.set_title("Loss by position")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    written.append(_save_figure(fig, os.path.join(out, "loss_vs_position.png")))
    for plot in (plot_retrieval, plot_probes, plot_entropy, plot_race):
        written += plot(summary, out, plt)
    return written


def _style(variant: str) -> dict[str, Any]:
    """The variant's look in a matplotlib plot (:mod:`posemb.lab.style`, shared with the
    lesson's charts): its colour, marker and dash pattern, each its own."""
    from .style import look

    v = look(variant)
    return {"color": v.colour, "marker": v.marker, "ls": (0, v.dash) if v.dash else "-"}


def _merged(series: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """Series that are exactly equal drawn once: ``{first variant: (label, data)}`` where
    the label names every variant of the group ("rope+ntk = rope+dynamic")."""
    out: dict[str, tuple[str, Any]] = {}
    for variant, data in series.items():
        twin = next((v for v, (_, d) in out.items() if d == data), None)
        if twin is None:
            out[variant] = (variant, data)
        else:
            out[twin] = (f"{out[twin][0]} = {variant}", data)
    return out


def _accuracy_by_length(ax: Any, task: dict, lens: list[int], spread: str) -> None:
    """A probe task's accuracy with the fact anywhere, by window length, one line per variant
    (equal lines drawn once), with bars of ``spread`` ("se" or "std"; none drawn as 0)."""
    points = {
        v: [
            (n, p[str(n)]["anywhere"]["mean"], p[str(n)]["anywhere"][spread] or 0.0)
            for n in lens
            if str(n) in p
        ]
        for v, p in task["variants"].items()
    }
    for variant, (label, pts) in _merged(points).items():
        xs, ys, err = zip(*pts, strict=True)
        ax.errorbar(xs, ys, yerr=err, **_style(variant), capsize=2, label=label)


def plot_retrieval(summary: dict, out: str, plt: Any) -> list[str]:
    r = summary.get("retrieval")
    if not r:
        return []
    lens, train = summary["config"]["eval_lens"], summary["config"]["train_len"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    _accuracy_by_length(ax, r, lens, "se")
    bins = list(next(iter(r["by_distance"].values())))
    by_distance = {
        v: [(j, p[b]["correct"] / p[b]["total"]) for j, b in enumerate(bins) if b in p]
        for v, p in r["by_distance"].items()
    }
    for variant, (label, points) in _merged(by_distance).items():
        xs, ys = zip(*points, strict=True)
        bx.plot(xs, ys, **_style(variant), label=label)
    for a in (ax, bx):
        a.axhline(r["chance"], color="grey", ls=":", label="chance")
        a.set_ylim(0, 1.02)
        a.set_ylabel("retrieval accuracy")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"window length (tokens; trained at {train})")
    ax.set_title("Fact at a random depth")
    bx.set_xticks(range(len(bins)), bins, rotation=30, fontsize=7)
    bx.axvline(
        next((j for j, b in enumerate(bins) if int(b.split("-")[1]) >= train), 0) + 0.5,
        color="grey",
        ls="--",
    )
    bx.set_xlabel("distance from fact to query (tokens; pooled over lengths)")
    bx.set_title("By distance")
    ax.legend(fontsize=7, ncol=2)
    return [_save_figure(fig, os.path.join(out, "retrieval.png"))]


PROBE_PANELS = {
    "multikey": "Multi-key needles: the queried key's value",
    "vartrack": "Variable tracking: the queried variable's value",
    "flipflop": "Flip-flop: the last written bit",
}
"""The probe tasks beside one-fact retrieval drawn in ``probes.png``, with their titles."""


def plot_probes(summary: dict, out: str, plt: Any) -> list[str]:
    """Accuracy by window length of each probe task the sweep ran beyond one-fact retrieval
    (multikey, vartrack, flipflop), one panel each, against chance. Bars: one standard
    deviation over seeds, or with one seed the binomial standard error of its probes (the
    legend says which)."""
    tasks = [t for t in PROBE_PANELS if summary.get(t)]
    if not tasks:
        return []
    lens, train = summary["config"]["eval_lens"], summary["config"]["train_len"]
    seeds = len(summary["config"]["seeds"])
    spread = "std" if seeds > 1 else "se"
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4.5), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        r = summary[task]
        _accuracy_by_length(ax, r, lens, spread)
        ax.axhline(r["chance"], color="grey", ls=":", label="chance")
        ax.set_ylim(0, 1.02)
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"window length (tokens; trained at {train})")
        ax.set_ylabel("accuracy")
        ax.set_title(PROBE_PANELS[task], fontsize=10)
    bars = f"bars: ± std over {seeds} seeds" if seeds > 1 else "one seed; bars: standard error"
    axes[0][0].legend(fontsize=7, ncol=2, title=bars, title_fontsize=7)
    return [_save_figure(fig, os.path.join(out, "probes.png"))]


def plot_entropy(summary: dict, out: str, plt: Any) -> list[str]:
    e = summary.get("entropy")
    if not e:
        return []
    lens = summary["config"]["eval_lens"]
    layers = len(next(iter(e["variants"].values()))["off"][str(lens[0])]["layers"])
    fig, axes = plt.subplots(2, layers, figsize=(3.2 * layers, 6.5), sharey=True, squeeze=False)
    for row, mode in enumerate(("off", "on")):
        for layer in range(layers):
            ax = axes[row][layer]
            ax.plot(
                lens, [e["uniform"][str(n)] for n in lens], color="grey", ls=":", label="uniform"
            )
            curves = {
                v: [m[mode][str(n)]["layers"][layer]["mean"] for n in lens]
                for v, m in e["variants"].items()
            }
            for variant, (label, ys) in _merged(curves).items():
                ax.plot(lens, ys, **_style(variant), ms=3, label=label)
            ax.set_xscale("log", base=2)
            ax.set_title(f"layer {layer + 1}, factor {mode}", fontsize=9)
            if row == 1:
                ax.set_xlabel("window length")
        axes[row][0].set_ylabel("attention entropy (nats)")
    # Below the panels: inside one, the legend hid that panel's lines.
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=7, fontsize=8, frameon=False)
    return [_save_figure(fig, os.path.join(out, "entropy.png"), bottom=0.1)]


def plot_race(summary: dict, out: str, plt: Any) -> list[str]:
    r = summary.get("race")
    if not r:
        return []
    n = str(r["race_len"])
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    for entrant, per_step in r["entrants"].items():
        for a, metric in ((ax, "loss_past"), (bx, "retrieval")):
            ys = [per_step[str(k)][metric][n]["mean"] for k in r["steps"]]
            std = [per_step[str(k)][metric][n]["std"] for k in r["steps"]]
            # One model seed: no bars, rather than bars of 0 that look like certainty.
            err = None if any(x is None for x in std) else std
            a.errorbar(r["steps"], ys, yerr=err, **_style(entrant), capsize=2, label=entrant)
    ax.set_ylabel(f"loss past position {summary['config']['train_len']} at {n} (nats/char)")
    bx.set_ylabel(f"retrieval accuracy at {n}")
    bx.axhline(
        summary["retrieval"]["chance"] if summary.get("retrieval") else 0.125,
        color="grey",
        ls=":",
        label="chance",
    )
    for a in (ax, bx):
        a.set_xlabel(f"fine-tuning steps at {n} tokens")
    if r.get("unit") != RACE_UNIT:
        bars = "bars: ± std over runs"
    elif len(r["seeds"]) > 1:
        bars = f"bars: ± std over {len(r['seeds'])} model seeds"
    else:
        bars = "one model seed: spread unknown"
    ax.set_title(f"The fine-tuning race: language modelling ({bars})", fontsize=10)
    bx.set_title("The fine-tuning race: retrieval", fontsize=10)
    ax.legend(fontsize=8)
    return [_save_figure(fig, os.path.join(out, "race.png"))]


def _save_figure(fig: Figure, path: str, bottom: float = 0.0) -> str:
    """Write ``fig`` atomically as a PNG, keeping the lowest ``bottom`` of it for a legend."""
    import matplotlib.pyplot as plt

    out, name = os.path.split(path)
    if name not in _checkpoints.PLOT_FILES:  # the names an earlier report's plots are known by
        raise RuntimeError(f"plot {name} is not in posemb.lab.checkpoints.PLOT_FILES")
    fig.tight_layout(rect=(0.0, bottom, 1.0, 1.0))
    _checkpoints.folder(out).write(name, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)
    return path


__all__ = ["PROBE_PANELS", "draw", "plot_entropy", "plot_probes", "plot_race", "plot_retrieval"]
