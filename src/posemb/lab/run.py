"""`posemb lab`: train each encoding at one length, evaluate it at longer ones, report.

One job per trained encoding and seed runs in its own worker process (two 1-thread workers beat
one 2-thread process by ~25% on a 2-core machine). The ``rope`` job also evaluates the
inference-time scalings (PI, NTK, dynamic NTK, YaRN) on its trained weights.

Every job writes its checkpoint (every ``checkpoint_every`` steps) and its result atomically
under ``--out``; a killed run restarted with the same arguments skips finished jobs and resumes
the others from their last checkpoint. A checkpoint or result made with other settings, or one
that cannot be read, is refused with a message that names the file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import multiprocessing as mp
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch

import posemb

from .. import scaling as sc
from .._io import atomic_write, atomic_write_bytes
from . import corpus as _corpus
from .model import SCALINGS, TRAINED, VARIANTS, ModelConfig, TinyLM, scaling_for

DEFAULT_VARIANTS = ("learned", "sinusoidal", "nope", "alibi", "rope", *SCALINGS)
EVAL_SEED = 1234  # the held-out windows are the same for every variant and seed


@dataclass(frozen=True)
class LabConfig:
    """Everything that determines the numbers (hashed into checkpoints and results)."""

    variants: tuple[str, ...] = DEFAULT_VARIANTS
    train_len: int = 64
    eval_lens: tuple[int, ...] = (64, 128, 256, 512, 1024)
    steps: int = 500
    seeds: tuple[int, ...] = (0,)
    corpus: str = _corpus.DEFAULT
    width: int = 128
    layers: int = 4
    heads: int = 4
    batch: int = 32
    lr: float = 2e-3
    eval_windows: int = 16
    checkpoint_every: int = 100
    finetune_len: int | None = None
    finetune_steps: int = 0
    workers: int = field(default=2, compare=False)

    def validate(self) -> None:
        """Raise ``ValueError`` for settings that cannot run."""
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown:
            raise ValueError(
                f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}"
            )
        if not self.variants:
            raise ValueError("--variants must name at least one variant")
        for name in ("train_len", "steps", "width", "layers", "heads", "batch", "eval_windows"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} must be a positive integer, got {v!r}")
        if self.width % self.heads or (self.width // self.heads) % 2:
            raise ValueError(f"width {self.width} must split into {self.heads} heads of even size")
        low = [n for n in self.eval_lens if n < self.train_len]
        if not self.eval_lens or low:
            raise ValueError(
                f"--eval-lens must be >= --train-len {self.train_len} (the lab measures "
                f"lengths past training), got {list(self.eval_lens)}"
            )
        if self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")
        if self.finetune_steps < 0:
            raise ValueError(f"--finetune-steps must be >= 0, got {self.finetune_steps}")
        if self.finetune_steps and (self.finetune_len or 0) <= self.train_len:
            raise ValueError(
                f"--finetune-len must exceed --train-len {self.train_len} (fine-tuning extends "
                f"the context), got {self.finetune_len}"
            )

    def digest(self, encoding: str, seed: int) -> str:
        """A hash of what a job's numbers depend on."""
        d = {k: v for k, v in asdict(self).items() if k not in ("variants", "seeds", "workers")}
        d |= {"encoding": encoding, "seed": seed, "posemb": posemb.__version__}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def quick_config(**overrides: object) -> LabConfig:
    """A small protocol that runs in well under a minute: proves the lab works, and still shows
    sinusoidal collapsing past its training length while ALiBi does not."""
    base = LabConfig(
        variants=("sinusoidal", "alibi", "rope", "rope+pi"),
        train_len=32,
        eval_lens=(32, 64, 128),
        steps=300,
        width=64,
        layers=2,
        heads=4,
        batch=16,
        lr=3e-3,
        eval_windows=8,
        checkpoint_every=50,
    )
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]


# --- files ---------------------------------------------------------------------------------


def _atomic_write(path: str, data: bytes) -> None:
    atomic_write_bytes(path, data)


def _atomic_save(obj: object, path: str) -> None:
    atomic_write(path, lambda tmp: torch.save(obj, tmp))


def _paths(out: str, encoding: str, seed: int) -> tuple[str, str]:
    return (
        os.path.join(out, "checkpoints", f"{encoding}-seed{seed}.pt"),
        os.path.join(out, "runs", f"{encoding}-seed{seed}.json"),
    )


def _load_checkpoint(path: str, digest: str) -> dict | None:
    if not os.path.exists(path):
        return None
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a truncated or foreign file: refuse, never overwrite silently
        raise ValueError(
            f"checkpoint {path} cannot be read ({type(err).__name__}); delete it to start that "
            f"job again"
        ) from None
    if not isinstance(ckpt, dict) or ckpt.get("digest") != digest:
        raise ValueError(
            f"checkpoint {path} was made with other settings (digest "
            f"{ckpt.get('digest') if isinstance(ckpt, dict) else '?'} != {digest}); use another "
            f"--out or delete it"
        )
    return ckpt


# --- one job -------------------------------------------------------------------------------------


def _windows(ids: torch.Tensor, length: int, count: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(ids) - length - 1, (count,), generator=gen)
    return torch.stack([ids[s : s + length + 1] for s in starts.tolist()])


def _evaluate(model: TinyLM, windows: torch.Tensor) -> torch.Tensor:
    """Per-position loss (nats/char) averaged over windows ``(n, L + 1)``: shape ``(L,)``."""
    model.eval()
    losses = []
    with torch.no_grad():
        for w in windows.split(4):
            logits = model(w[:, :-1])
            loss = torch.nn.functional.cross_entropy(
                logits.transpose(1, 2), w[:, 1:], reduction="none"
            )
            losses.append(loss)
    return torch.cat(losses).mean(0)


def run_job(
    cfg: LabConfig,
    encoding: str,
    seed: int,
    out: str,
    slot: int = 0,
    quiet: bool = False,
) -> dict[str, object]:
    """Train ``encoding`` with ``seed`` (resuming from a checkpoint), evaluate, save the result."""
    ckpt_path, result_path = _paths(out, encoding, seed)
    digest = cfg.digest(encoding, seed)
    if os.path.exists(result_path):
        try:
            with open(result_path, encoding="utf-8") as f:
                done = json.load(f)
        except (OSError, json.JSONDecodeError):
            raise ValueError(f"result {result_path} cannot be read; delete it to rerun") from None
        if done.get("digest") == digest:
            return done
        raise ValueError(
            f"result {result_path} was made with other settings; use another --out or delete it"
        )
    data = _corpus.load(cfg.corpus, min_held_out=max(cfg.eval_lens) + 2)
    mcfg = ModelConfig(
        vocab=len(data.vocab),
        encoding=encoding,
        width=cfg.width,
        layers=cfg.layers,
        heads=cfg.heads,
        train_len=cfg.train_len,
        max_len=max(cfg.eval_lens),
    )
    torch.manual_seed(seed)
    model = TinyLM(mcfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    step, started, last_loss = 0, time.time(), None
    ckpt = _load_checkpoint(ckpt_path, digest)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        gen.set_state(ckpt["generator"])
        step, last_loss = int(ckpt["step"]), ckpt.get("loss")

    def lr_at(s: int) -> float:  # linear warm-up, cosine decay to 10%
        warm = max(1, cfg.steps // 20)
        if s < warm:
            return cfg.lr * (s + 1) / warm
        t = (s - warm) / max(1, cfg.steps - warm)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    bar = _progress(cfg.steps, f"{encoding} seed {seed}", slot, quiet, initial=step)
    model.train()
    while step < cfg.steps:
        batch = _windows(data.train, cfg.train_len, cfg.batch, gen)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        last_loss = loss.item()
        bar(1, last_loss)
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            state = {
                "digest": digest,
                "step": step,
                "model": model.state_dict(),
                "optimizer": opt.state_dict(),
                "generator": gen.get_state(),
                "loss": last_loss,
            }
            _atomic_save(state, ckpt_path)
    bar(0, None, close=True)
    train_s = time.time() - started

    eval_gen = torch.Generator().manual_seed(EVAL_SEED)
    windows = {n: _windows(data.held_out, n, cfg.eval_windows, eval_gen) for n in cfg.eval_lens}
    evals = {encoding: {n: _evaluate(model, windows[n]) for n in cfg.eval_lens}}
    if encoding == "rope":
        for variant in SCALINGS:
            if variant in cfg.variants:
                per_len = {}
                for n in cfg.eval_lens:
                    model.set_scaling(scaling_for(variant, cfg.train_len, n))
                    per_len[n] = _evaluate(model, windows[n])
                evals[variant] = per_len
        model.set_scaling(None)
        if cfg.finetune_steps:
            evals["rope+pi+ft"] = _finetune_pi(model, cfg, data, gen, windows)
    result = {
        "digest": digest,
        "encoding": encoding,
        "seed": seed,
        "train_seconds": train_s,
        "final_train_loss": last_loss,
        "variants": {
            v: {
                str(n): {
                    "all": float(curve.mean()),
                    "past": float(curve[cfg.train_len :].mean()) if n > cfg.train_len else None,
                    "curve": [round(float(x), 4) for x in curve],
                }
                for n, curve in per_len.items()
            }
            for v, per_len in evals.items()
        },
    }
    _atomic_write(result_path, json.dumps(result).encode())
    return result


def _finetune_pi(
    model: TinyLM,
    cfg: LabConfig,
    data: _corpus.Corpus,
    gen: torch.Generator,
    windows: dict[int, torch.Tensor],
) -> dict[int, torch.Tensor]:
    """Position interpolation with a short fine-tune at the longer length (Chen et al. 2023,
    section 3): positions scaled by s = finetune_len / train_len, ``finetune_steps`` steps on
    windows of finetune_len at the same tokens per step, then evaluated with that s (and with
    n / train_len for lengths past finetune_len)."""
    import copy

    ft = copy.deepcopy(model)
    length = int(cfg.finetune_len)  # type: ignore[arg-type]
    s_ft = length / cfg.train_len
    ft.set_scaling(sc.Linear(s_ft))
    batch = max(1, cfg.batch * cfg.train_len // length)
    opt = torch.optim.AdamW(ft.parameters(), lr=cfg.lr * 0.5, weight_decay=0.01)
    ft.train()
    for _ in range(cfg.finetune_steps):
        w = _windows(data.train, length, batch, gen)
        loss = torch.nn.functional.cross_entropy(ft(w[:, :-1]).transpose(1, 2), w[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ft.parameters(), 1.0)
        opt.step()
    out = {}
    for n in cfg.eval_lens:
        ft.set_scaling(sc.Linear(max(s_ft, n / cfg.train_len)))
        out[n] = _evaluate(ft, windows[n])
    return out


def _progress(
    total: int, label: str, slot: int, quiet: bool, initial: int = 0
) -> Callable[..., None]:
    """A tqdm bar on stderr (a no-op when quiet or tqdm is missing)."""
    if quiet:
        return lambda *a, **k: None
    try:
        from tqdm import tqdm
    except ImportError:
        return lambda *a, **k: None
    bar = tqdm(total=total, initial=initial, desc=label, position=slot, leave=False, ncols=90)

    def update(n: int, loss: float | None, close: bool = False) -> None:
        if n:
            bar.update(n)
        if loss is not None and bar.n % 10 == 0:
            bar.set_postfix(loss=f"{loss:.3f}")
        if close:
            bar.close()

    return update


def _worker(args: tuple) -> dict[str, object]:
    cfg, encoding, seed, out, slot, quiet, threads = args
    torch.set_num_threads(threads)
    return run_job(cfg, encoding, seed, out, slot, quiet)


# --- the sweep and its report ---------------------------------------------------------------------


def jobs_for(cfg: LabConfig) -> list[tuple[str, int]]:
    """(trained encoding, seed) pairs: scalings need the rope model."""
    encodings = [v for v in cfg.variants if v in TRAINED]
    needs_rope = any(v in SCALINGS for v in cfg.variants) or cfg.finetune_steps
    if needs_rope and "rope" not in encodings:
        encodings.append("rope")
    return [(e, s) for e in encodings for s in cfg.seeds]


def _distributed() -> tuple[int, int]:
    """(rank, world size) under torchrun, joining the gloo group; (0, 1) otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return dist.get_rank(), world


def run(cfg: LabConfig, out: str, quiet: bool = False) -> dict[str, object] | None:
    """Run (or resume) the sweep into ``out``; write results.json, results.md and plots.

    Under ``torchrun`` (gloo, CPU) the jobs are dealt round-robin to the ranks, each rank runs
    its share with its own workers, and rank 0 writes the report once all have finished; ``out``
    must be a folder every rank can read (the same machine, or a shared filesystem). Only rank
    0 returns the summary. Each model trains on one rank: the sweep is what is distributed.
    """
    cfg.validate()
    _corpus.load(cfg.corpus, min_held_out=max(cfg.eval_lens) + 2)  # fail before any worker
    started = time.time()
    rank, world = _distributed()
    all_jobs = jobs_for(cfg)
    jobs = all_jobs[rank::world]
    workers = max(1, min(cfg.workers, len(jobs)))
    threads = max(1, torch.get_num_threads() // workers)
    args = [(cfg, e, s, out, i % workers, quiet, threads) for i, (e, s) in enumerate(jobs)]
    if workers == 1:
        results = [_worker(a) for a in args]
    else:
        with mp.get_context("spawn").Pool(workers) as pool:
            results = pool.map(_worker, args, chunksize=1)
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
        if rank != 0:
            dist.barrier()  # wait for rank 0's report, then leave together
            return None
        # Rank 0 reads every job's result from disk: finished jobs are not run again.
        results = [run_job(cfg, e, s, out, quiet=True) for e, s in all_jobs]
    summary = _summarise(cfg, results, time.time() - started, workers, threads)
    _atomic_write(os.path.join(out, "results.json"), json.dumps(summary, indent=2).encode())
    _atomic_write(os.path.join(out, "results.md"), markdown(summary).encode())
    plots = _plots(summary, out)
    summary["plots"] = plots
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
    return summary


def _summarise(
    cfg: LabConfig, results: Sequence[dict], wall: float, workers: int, threads: int
) -> dict[str, object]:
    data = _corpus.load(cfg.corpus, min_held_out=max(cfg.eval_lens) + 2)
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
                    mean = sum(vals) / len(vals)
                    std = (
                        (sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5
                        if len(vals) > 1
                        else None
                    )
                    entry[part] = {"mean": mean, "std": std, "n": len(vals)}
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
            "posemb": posemb.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "machine": platform.machine(),
    }


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


def _save_figure(fig: object, path: str) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()  # type: ignore[attr-defined]
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[arg-type]
    return path
