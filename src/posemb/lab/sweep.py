"""`posemb lab`: train each encoding at one length, evaluate it at longer ones.

The sweep's settings (:class:`LabConfig`), its jobs, their files and the processes that run
them. One job per trained encoding and seed runs in its own worker process (two 1-thread
workers beat one 2-thread process by ~25% on a 2-core machine). The ``rope`` job also evaluates
the inference-time scalings (PI, NTK, dynamic NTK, YaRN) on its trained weights. Training is
:func:`posemb.lab.train.train`; the report is :mod:`posemb.lab.report`.

Every job writes its checkpoint (every ``checkpoint_every`` steps) and its result atomically
under ``--out``; a killed run restarted with the same arguments skips finished jobs and resumes
the others from their last checkpoint. A checkpoint or result made with other settings, or one
that cannot be read, is refused with a message that names the file.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import multiprocessing as mp
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .. import _checks
from .. import scaling as sc
from .._io import atomic_write, atomic_write_bytes
from .._version import __version__
from . import corpus as _corpus
from . import report
from .model import SCALINGS, TRAINED, VARIANTS, ModelConfig, TinyLM, check_heads, scaling_for
from .train import adamw, next_token, per_position_loss, train, warmup_cosine, windows

DEFAULT_VARIANTS = ("learned", "sinusoidal", "nope", "alibi", "rope", *SCALINGS)
EVAL_SEED = 1234  # the held-out windows are the same for every variant and seed
WEIGHT_DECAY = 0.01
FINETUNE_LR_FRACTION = 0.5  # of --lr, constant: a short fine-tune of a trained model

_POSITIVE = ("train_len", "steps", "width", "layers", "heads", "batch", "eval_windows")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class LabConfig:
    """Everything that determines the numbers (hashed into checkpoints and results).

    Validated at construction: a bad value raises ``ValueError`` naming the setting (as its
    ``posemb lab`` flag), the value and what is allowed. Sequences are stored as tuples.
    """

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

    def __post_init__(self) -> None:
        for name in ("variants", "eval_lens", "seeds"):
            value = getattr(self, name)
            if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
                raise ValueError(f"{_flag(name)} must be a sequence, got {value!r}")
            object.__setattr__(self, name, tuple(value))
        if not self.variants:
            raise ValueError("--variants must name at least one variant")
        unknown = [str(v) for v in self.variants if v not in VARIANTS]
        if unknown:
            raise ValueError(
                f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}"
            )
        if len(set(self.variants)) != len(self.variants):
            raise ValueError(f"--variants must not repeat a variant, got {list(self.variants)}")
        for name in (*_POSITIVE, "checkpoint_every", "workers"):
            _checks.positive_int(_flag(name), getattr(self, name))
        check_heads(self.width, self.heads)
        lens = self.eval_lens
        if not lens or not all(_is_int(n) for n in lens) or list(lens) != sorted(set(lens)):
            raise ValueError(
                f"--eval-lens must be one or more integers in increasing order, got {list(lens)}"
            )
        if lens[0] < self.train_len:
            raise ValueError(
                f"--eval-lens must be >= --train-len {self.train_len} (the lab measures "
                f"lengths past training), got {list(lens)}"
            )
        seeds = self.seeds
        if not seeds or not all(_is_int(s) and s >= 0 for s in seeds):
            raise ValueError(
                f"--seeds must be one or more non-negative integers, got {list(seeds)}"
            )
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"--seeds must not repeat a seed, got {list(seeds)}")
        _checks.number("--lr", self.lr, minimum=0.0, strict=True)
        if not isinstance(self.corpus, str) or not self.corpus:
            raise ValueError(
                f"--corpus must be {_corpus.DEFAULT!r} or a path to a UTF-8 text file, got "
                f"{self.corpus!r}"
            )
        ft_steps, ft_len = self.finetune_steps, self.finetune_len
        if not _is_int(ft_steps) or ft_steps < 0:
            raise ValueError(f"--finetune-steps must be an integer >= 0, got {ft_steps!r}")
        if ft_len is not None and not _is_int(ft_len):
            raise ValueError(f"--finetune-len must be an integer or None, got {ft_len!r}")
        if ft_steps and (ft_len or 0) <= self.train_len:
            raise ValueError(
                f"--finetune-len must exceed --train-len {self.train_len} (fine-tuning extends "
                f"the context), got {ft_len}"
            )
        if ft_len is not None and not ft_steps:
            raise ValueError(
                f"--finetune-len {ft_len} needs --finetune-steps > 0 (it would be ignored)"
            )

    def digest(self, encoding: str, seed: int) -> str:
        """A hash of what a job's numbers depend on."""
        d = {k: v for k, v in asdict(self).items() if k not in ("variants", "seeds", "workers")}
        d |= {"encoding": encoding, "seed": seed, "posemb": __version__}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def quick_config(**overrides: Any) -> LabConfig:
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
    return dataclasses.replace(base, **overrides)


# --- files ---------------------------------------------------------------------------------


def job_paths(out: str, encoding: str, seed: int) -> tuple[str, str]:
    """(checkpoint, result) files of one job under ``out``."""
    return (
        os.path.join(out, "checkpoints", f"{encoding}-seed{seed}.pt"),
        os.path.join(out, "runs", f"{encoding}-seed{seed}.json"),
    )


def _save_checkpoint(state: dict, path: str) -> None:
    atomic_write(path, lambda tmp: torch.save(state, tmp))


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


def _load_result(path: str, digest: str) -> dict | None:
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            done = json.load(f)
    except (OSError, json.JSONDecodeError):
        raise ValueError(f"result {path} cannot be read; delete it to rerun") from None
    if done.get("digest") == digest:
        return done
    raise ValueError(f"result {path} was made with other settings; use another --out or delete it")


# --- one job -------------------------------------------------------------------------------------


def run_job(
    cfg: LabConfig,
    encoding: str,
    seed: int,
    out: str,
    slot: int = 0,
    quiet: bool = False,
) -> dict[str, object]:
    """Train ``encoding`` with ``seed`` (resuming from a checkpoint), evaluate, save the result.

    Returns the job's result (also written to ``runs/<encoding>-seed<seed>.json``): its digest,
    encoding, seed, train_seconds, final_train_loss and, per variant and evaluation length,
    the mean loss over all positions, past the training length, and per position.
    """
    ckpt_path, result_path = job_paths(out, encoding, seed)
    digest = cfg.digest(encoding, seed)
    done = _load_result(result_path, digest)
    if done is not None:
        return done
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
    opt = adamw(model, cfg.lr, WEIGHT_DECAY)
    gen = torch.Generator().manual_seed(seed)
    step, started, last_loss = 0, time.time(), None
    ckpt = _load_checkpoint(ckpt_path, digest)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        gen.set_state(ckpt["generator"])
        step, last_loss = int(ckpt["step"]), ckpt.get("loss")

    bar = _progress(cfg.steps, f"{encoding} seed {seed}", slot, quiet, initial=step)

    def on_step(done: int, loss: float) -> None:
        bar(1, loss)
        if done % cfg.checkpoint_every == 0 or done == cfg.steps:
            state = {
                "digest": digest,
                "step": done,
                "model": model.state_dict(),
                "optimizer": opt.state_dict(),
                "generator": gen.get_state(),
                "loss": loss,
            }
            _save_checkpoint(state, ckpt_path)

    loss = train(
        model,
        opt,
        lambda _: next_token(windows(data.train, cfg.train_len, cfg.batch, gen)),
        cfg.steps,
        lambda s: warmup_cosine(s, cfg.steps, cfg.lr),
        start=step,
        on_step=on_step,
    )
    last_loss = last_loss if loss is None else loss
    bar(0, None, close=True)
    train_s = time.time() - started

    eval_gen = torch.Generator().manual_seed(EVAL_SEED)
    held = {n: windows(data.held_out, n, cfg.eval_windows, eval_gen) for n in cfg.eval_lens}
    evals = {encoding: {n: per_position_loss(model, held[n]) for n in cfg.eval_lens}}
    if encoding == "rope":
        for variant in SCALINGS:
            if variant in cfg.variants:
                per_len = {}
                for n in cfg.eval_lens:
                    model.set_scaling(scaling_for(variant, cfg.train_len, n))
                    per_len[n] = per_position_loss(model, held[n])
                evals[variant] = per_len
        model.set_scaling(None)
        if cfg.finetune_steps:
            evals["rope+pi+ft"] = _finetune_pi(model, cfg, data, gen, held)
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
    atomic_write_bytes(result_path, json.dumps(result).encode())
    return result


def _finetune_pi(
    model: TinyLM,
    cfg: LabConfig,
    data: _corpus.Corpus,
    gen: torch.Generator,
    held: dict[int, torch.Tensor],
) -> dict[int, torch.Tensor]:
    """Position interpolation with a short fine-tune at the longer length (Chen et al. 2023,
    section 3): positions scaled by s = finetune_len / train_len, ``finetune_steps`` steps on
    windows of finetune_len at the same tokens per step, then evaluated with that s (and with
    n / train_len for lengths past finetune_len)."""
    ft = copy.deepcopy(model)
    if cfg.finetune_len is None:
        raise ValueError("--finetune-steps needs --finetune-len")  # LabConfig ensures it
    length = cfg.finetune_len
    s_ft = length / cfg.train_len
    ft.set_scaling(sc.Linear(s_ft))
    batch = max(1, cfg.batch * cfg.train_len // length)
    lr = cfg.lr * FINETUNE_LR_FRACTION
    train(
        ft,
        adamw(ft, lr, WEIGHT_DECAY),
        lambda _: next_token(windows(data.train, length, batch, gen)),
        cfg.finetune_steps,
        lambda _: lr,
    )
    out = {}
    for n in cfg.eval_lens:
        ft.set_scaling(sc.Linear(max(s_ft, n / cfg.train_len)))
        out[n] = per_position_loss(ft, held[n])
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


# --- the sweep ------------------------------------------------------------------------------------


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


def run(cfg: LabConfig, out: str, quiet: bool = False) -> dict[str, Any] | None:
    """Run (or resume) the sweep into ``out``; write results.json, results.md and plots.

    Under ``torchrun`` (gloo, CPU) the jobs are dealt round-robin to the ranks, each rank runs
    its share with its own workers, and rank 0 writes the report once all have finished; ``out``
    must be a folder every rank can read (the same machine, or a shared filesystem). Only rank
    0 returns the summary (:func:`posemb.lab.report.summarise`, plus ``plots``: the files
    written). Each model trains on one rank: the sweep is what is distributed.
    """
    data = _corpus.load(cfg.corpus, min_held_out=max(cfg.eval_lens) + 2)  # fail before any worker
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
    summary = report.summarise(cfg, data, results, time.time() - started, workers, threads)
    report.write(summary, out)
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
    return summary
