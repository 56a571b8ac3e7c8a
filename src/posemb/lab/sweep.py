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

import contextlib
import copy
import dataclasses
import json
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch

from .. import scaling as sc
from .._errors import InputError
from .._io import read_json
from .._owned import OwnedFolder
from . import corpus as _corpus
from . import distributed as _dp
from . import entropy as _entropy
from . import inference as _inference
from . import race as _race
from . import report
from .checkpoints import (
    COMMAND,
    earlier_lab,
    is_lab_file,
    job_paths,
    load_checkpoint,
    load_result,
    save_checkpoint,
    write_file,
)
from .config import (
    DEFAULT_VARIANTS,
    EVAL_SEED,
    FINETUNE_LR_FRACTION,
    TASKS,
    WEIGHT_DECAY,
    LabConfig,
    gpu_config,
    quick_config,
)
from .invocations import INVOCATIONS, closed, read_invocations
from .model import TRAINED, ModelConfig, TinyLM
from .resumable import _progress, _train_resumable
from .stopping import children_ignore_sigint, die_with_parent, stopping, workers_can_start
from .tasks import PROBE_TASKS
from .train import adamw, next_token, per_position_loss, train, warmup_cosine, windows

_POSITION_SEED = 2**31 - 1  # apart from the data generator's seeds (the job's seed itself)


def _race_done(cfg: LabConfig, job: Job, out: str) -> bool:
    _, name, seed, race_seed = job
    ids = cfg.ids(name, seed, "race", race_seed)
    path = job_paths(out, name, seed, "race", race_seed)[1]
    return load_result(path, ids.digest, key=ids.key) is not None


def _own_positions(model: TinyLM, seed: int, rank: int = 0, world: int = 1) -> torch.Generator:
    """Give the job's model its own generator for randomised positions, to be saved in its
    checkpoints: torch's global one is shared with whatever else runs in the process, and a
    checkpoint does not hold it (a resumed run drew other positions)."""
    gen = torch.Generator().manual_seed(_POSITION_SEED + seed)
    model.position_generator, model.position_shard = gen, (rank, world)
    return gen


def _checkpoint_missing(cfg: LabConfig, kind: str, encoding: str, seed: int, out: str) -> bool:
    """Whether a later job needs this one's finished checkpoint and it is gone (deleted by
    hand): the job then trains again, which gives the same model."""
    if "race" not in cfg.tasks or encoding != "rope":
        return False
    race = [j for j in all_jobs(cfg)[1] if j[2] == seed]
    if all(_race_done(cfg, job, out) for job in race):
        return False  # every race job of this model is finished: nothing needs it
    steps = cfg.steps if kind == "lm" else cfg.retrieval_steps
    ids = cfg.ids(encoding, seed, kind)
    ckpt = load_checkpoint(job_paths(out, encoding, seed, kind)[0], ids.train_digest, ids.train_key)
    return ckpt is None or int(ckpt["step"]) != steps


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
    encoding, seed, train_seconds, final_train_loss, device and data_parallel_ranks (where the
    model trained) and, per variant and evaluation length, the mean loss over all positions,
    past the training length, and per position.

    The model trains and is evaluated on ``cfg.device``. With ``cfg.data_parallel`` in a
    joined process group (:func:`posemb.lab.distributed.join`) every rank must call this
    together: the model trains over all ranks (:func:`posemb.lab.distributed.train_sharded`),
    rank 0 alone writes checkpoints, evaluates and writes the result, and every rank returns
    that result.
    """
    ckpt_path, result_path = job_paths(out, encoding, seed)
    ids = cfg.ids(encoding, seed, "lm")
    rank, world = _dp.group(cfg.data_parallel)
    done = load_result(result_path, ids.digest, ids.train_digest, ids.key)
    retrain = done is not None and _checkpoint_missing(cfg, "lm", encoding, seed, out)
    _dp.agree(int(done is not None) + int(retrain), f"finished results in {result_path}", world)
    if done is not None and not retrain:
        return done
    device = _dp.rank_device(cfg.device)
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
    model = TinyLM(mcfg).to(device)  # initialised on the CPU: the same weights on any device
    opt = adamw(model, cfg.lr, WEIGHT_DECAY)
    gen = torch.Generator().manual_seed(seed)
    positions = _own_positions(model, seed, rank, world)
    # Every rank draws the whole batch from the same generator (a one-process run's data) and
    # trains on its slice; the generator's state in a checkpoint is then every rank's.
    last_loss, train_s = _train_resumable(
        model,
        opt,
        {"generator": gen, "position_generator": positions},
        batch_at=lambda _: next_token(windows(data.train, cfg.train_len, cfg.batch, gen)),
        steps=cfg.steps,
        lr_at=lambda s: warmup_cosine(s, cfg.steps, cfg.lr),
        ckpt_path=ckpt_path,
        ids=ids,
        out=out,
        every=cfg.checkpoint_every,
        label=f"{encoding} seed {seed}",
        slot=slot,
        quiet=quiet,
        rank=rank,
        world=world,
    )
    if rank != 0:
        return _dp.from_rank0(None, world)
    if done is not None:  # retrained only for the checkpoint a later job needs
        return _dp.from_rank0(done, world)

    evals, entropy = _evaluate_lm(model, cfg, encoding, data, gen, device)
    result = {
        **ids.stamp(),
        "kind": "lm",
        "encoding": encoding,
        "seed": seed,
        "train_seconds": train_s,
        "final_train_loss": last_loss,
        "device": str(device),
        "data_parallel_ranks": world,
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
        "entropy": entropy,
    }
    write_file(out, result_path, json.dumps(result).encode())
    return _dp.from_rank0(result, world)


def _evaluate_lm(
    model: TinyLM,
    cfg: LabConfig,
    encoding: str,
    data: _corpus.Corpus,
    gen: torch.Generator,
    device: torch.device,
) -> tuple[dict[str, dict[int, torch.Tensor]], dict[str, object]]:
    """Per variant and evaluation length, the loss at each position on the fixed held-out
    windows (the rope model also under each inference-time scaling asked for, and fine-tuned
    with PI); and, with the entropy task, each variant's attention entropy."""
    eval_gen = torch.Generator().manual_seed(EVAL_SEED)
    held = {
        n: windows(data.held_out, n, cfg.eval_windows, eval_gen).to(device) for n in cfg.eval_lens
    }
    evals = {encoding: {n: _loss_curve(model, held[n]) for n in cfg.eval_lens}}
    if encoding == "rope":
        for variant in _inference.INFERENCE:
            if variant in cfg.variants:
                per_len = {}
                for n in cfg.eval_lens:
                    _inference.use(model, variant, cfg.train_len, n)
                    per_len[n] = _loss_curve(model, held[n])
                evals[variant] = per_len
        _inference.use(model, None, cfg.train_len, 0)
        if cfg.finetune_steps:
            evals["rope+pi+ft"] = _finetune_pi(model, cfg, data, gen, held)
    entropy: dict[str, object] = {}
    if "entropy" in cfg.tasks:
        few = {n: w[: cfg.entropy_windows] for n, w in held.items()}
        for variant in _entropy.variants_of(encoding, cfg.variants):
            entropy[variant] = _entropy.measure(model, variant, few, cfg.train_len)
    return evals, entropy


def _loss_curve(model: TinyLM, w: torch.Tensor) -> torch.Tensor:
    """:func:`per_position_loss` on the CPU (the result reads it position by position)."""
    return per_position_loss(model, w).cpu()


def retrieval_model(cfg: LabConfig, encoding: str, task: str = "retrieval") -> TinyLM:
    """The untrained model of a probe ``task`` (:data:`posemb.lab.tasks.PROBE_TASKS`) for
    ``encoding``: a :class:`TinyLM` over the task's tokens, of the probe models' shape."""
    return TinyLM(
        ModelConfig(
            vocab=PROBE_TASKS[task].module.VOCAB,
            encoding=encoding,
            width=cfg.retrieval_width,
            layers=cfg.retrieval_layers,
            heads=cfg.heads,
            train_len=cfg.train_len,
            max_len=max(cfg.eval_lens),
        )
    )


def run_probe_job(
    cfg: LabConfig,
    task: str,
    encoding: str,
    seed: int,
    out: str,
    slot: int = 0,
    quiet: bool = False,
) -> dict[str, object]:
    """Train the model of probe ``task`` for ``encoding`` at the training length (resuming
    from its checkpoint), probe it at every evaluation length (for ``rope`` also under each
    scaling and extension in ``cfg.variants``), save and return the result: ``{"kind": task,
    "encoding", "seed", "train_seconds", "final_train_loss", "variants": {variant:
    evaluate(...)}}``, the task module's ``evaluate`` counts.
    """
    probe_task = PROBE_TASKS[task]
    sizes, steps = probe_task.sizes(cfg), getattr(cfg, probe_task.steps_field)
    ckpt_path, result_path = job_paths(out, encoding, seed, task)
    ids = cfg.ids(encoding, seed, task)
    done = load_result(result_path, ids.digest, ids.train_digest, ids.key)
    retrain = done is not None and _checkpoint_missing(cfg, task, encoding, seed, out)
    if done is not None and not retrain:
        return done
    torch.manual_seed(seed)
    model = retrieval_model(cfg, encoding, task)
    opt = adamw(model, cfg.retrieval_lr, WEIGHT_DECAY)
    gen = torch.Generator().manual_seed(seed)
    positions = _own_positions(model, seed)
    loss, train_s = _train_resumable(
        model,
        opt,
        {"generator": gen, "position_generator": positions},
        batch_at=lambda _: probe_task.module.training_batch(
            cfg.retrieval_batch, cfg.train_len, *sizes, gen
        ),
        steps=steps,
        lr_at=lambda s: warmup_cosine(s, steps, cfg.retrieval_lr),
        ckpt_path=ckpt_path,
        ids=ids,
        out=out,
        every=cfg.checkpoint_every,
        label=f"{task} {encoding} seed {seed}",
        slot=slot,
        quiet=quiet,
    )
    if done is not None:  # retrained only for the checkpoint the race needs
        return done

    def probe(lengths: tuple[int, ...]) -> dict[str, dict[str, object]]:
        return probe_task.module.evaluate(
            model, lengths, cfg.train_len, *sizes, cfg.retrieval_probes, EVAL_SEED
        )

    variants = {encoding: probe(cfg.eval_lens)}
    if encoding == "rope":
        for variant in _inference.INFERENCE:
            if variant in cfg.variants:
                per_len = {}
                for n in cfg.eval_lens:
                    _inference.use(model, variant, cfg.train_len, n)
                    per_len[str(n)] = probe((n,))[str(n)]
                variants[variant] = per_len
        _inference.use(model, None, cfg.train_len, 0)
    result = {
        **ids.stamp(),
        "kind": task,
        "encoding": encoding,
        "seed": seed,
        "train_seconds": train_s,
        "final_train_loss": loss,
        "variants": variants,
    }
    write_file(out, result_path, json.dumps(result).encode())
    return result


def run_retrieval_job(
    cfg: LabConfig, encoding: str, seed: int, out: str, slot: int = 0, quiet: bool = False
) -> dict[str, object]:
    """:func:`run_probe_job` of the one-fact retrieval task."""
    return run_probe_job(cfg, "retrieval", encoding, seed, out, slot, quiet)


def _trained(cfg: LabConfig, out: str, seed: int) -> tuple[TinyLM, TinyLM]:
    """The finished RoPE LM and RoPE retrieval model of ``seed`` from their checkpoints."""
    data_vocab = len(_corpus.load(cfg.corpus, min_held_out=max(cfg.eval_lens) + 2).vocab)
    lm = TinyLM(
        ModelConfig(
            vocab=data_vocab,
            encoding="rope",
            width=cfg.width,
            layers=cfg.layers,
            heads=cfg.heads,
            train_len=cfg.train_len,
            max_len=max(cfg.eval_lens),
        )
    )
    ret = retrieval_model(cfg, "rope")
    for model, kind, steps in ((lm, "lm", cfg.steps), (ret, "retrieval", cfg.retrieval_steps)):
        path = job_paths(out, "rope", seed, kind)[0]
        ids = cfg.ids("rope", seed, kind)
        ckpt = load_checkpoint(path, ids.train_digest, ids.train_key)
        if ckpt is None or int(ckpt["step"]) != steps:  # phase one retrains a missing one
            raise InputError(f"the race needs the finished checkpoint {path}; run its job first")
        model.load_state_dict(ckpt["model"])
    return lm, ret


def run_race_job(
    cfg: LabConfig,
    entrant: str,
    seed: int,
    race_seed: int,
    out: str,
    slot: int = 0,
    quiet: bool = False,
) -> dict[str, object]:
    """One entrant of the fine-tuning race (:mod:`posemb.lab.race`) from the RoPE models of
    ``seed``, with fine-tuning batches drawn from ``race_seed``; resumes at the last milestone.

    Returns (and saves) ``{"kind": "race", "encoding": entrant, "seed", "race_seed",
    "train_seconds", "milestones": {str(N): race.score(...)}}``.
    """
    ckpt_path, result_path = job_paths(out, entrant, seed, "race", race_seed)
    ids = cfg.ids(entrant, seed, "race", race_seed)
    done = load_result(result_path, ids.digest, key=ids.key)
    if done is not None:
        return done
    data = _corpus.load(cfg.corpus, min_held_out=max(cfg.eval_lens) + 2)
    lm, ret = _trained(cfg, out, seed)
    state = load_checkpoint(ckpt_path, ids.digest, ids.key)
    setup = _race.RaceSetup(
        entrant=entrant,
        train_len=cfg.train_len,
        race_len=cfg.race_len,
        milestones=cfg.race_steps,
        eval_lens=cfg.race_eval_lens(),
        lm_batch=cfg.batch,
        lm_lr=cfg.lr * FINETUNE_LR_FRACTION,
        retrieval_batch=cfg.retrieval_batch,
        retrieval_lr=cfg.retrieval_lr * FINETUNE_LR_FRACTION,
        retrieval_facts=cfg.retrieval_facts,
        probes=cfg.retrieval_probes,
        weight_decay=WEIGHT_DECAY,
    )
    eval_gen = torch.Generator().manual_seed(EVAL_SEED)
    held = {n: windows(data.held_out, n, cfg.eval_windows, eval_gen) for n in cfg.eval_lens}
    # The race also scores at its own lengths (the race length and twice it), which need not
    # be among --eval-lens: drawn after the listed ones, so their draws are as before.
    for n in cfg.race_eval_lens():
        if n not in held:
            held[n] = windows(data.held_out, n, cfg.eval_windows, eval_gen)
    # Paired: every entrant of (seed, race_seed) draws the same batches.
    gen = torch.Generator().manual_seed(100_003 * (seed + 1) + race_seed)
    started = time.time()
    earlier = float(state.get("seconds", 0.0)) if state else 0.0
    bar = _progress(len(cfg.race_steps), f"race {entrant} {seed}/{race_seed}", slot, quiet)

    def on_milestone(st: dict) -> None:
        bar(1, None)
        st = st | {"digest": ids.digest, "settings": ids.key}
        save_checkpoint(st | {"seconds": earlier + time.time() - started}, ckpt_path, out)

    milestones = _race.run(
        lm, ret, setup, data.train, held, gen, EVAL_SEED, state=state, on_milestone=on_milestone
    )
    bar(0, None, close=True)
    result = {
        **ids.stamp(),
        "kind": "race",
        "encoding": entrant,
        "seed": seed,
        "race_seed": race_seed,
        "train_seconds": earlier + time.time() - started,
        "milestones": milestones,
    }
    write_file(out, result_path, json.dumps(result).encode())
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
        raise InputError("--finetune-steps needs --finetune-len")  # LabConfig ensures it
    length = cfg.finetune_len
    s_ft = length / cfg.train_len
    ft.set_scaling(sc.Linear(s_ft))
    batch = max(1, cfg.batch * cfg.train_len // length)
    lr = cfg.lr * FINETUNE_LR_FRACTION
    device = next(ft.parameters()).device
    train(
        ft,
        adamw(ft, lr, WEIGHT_DECAY),
        lambda _: next_token(windows(data.train, length, batch, gen).to(device)),
        cfg.finetune_steps,
        lambda _: lr,
    )
    out = {}
    for n in cfg.eval_lens:
        ft.set_scaling(sc.Linear(max(s_ft, n / cfg.train_len)))
        out[n] = _loss_curve(ft, held[n])
    return out


Job = tuple[str, str, int, int | None]  # (kind, encoding or entrant, seed, race seed)


def _run_one(cfg: LabConfig, job: Job, out: str, slot: int = 0, quiet: bool = True) -> dict:
    kind, name, seed, race_seed = job
    if kind == "lm":
        return run_job(cfg, name, seed, out, slot, quiet)
    if kind in PROBE_TASKS:
        return run_probe_job(cfg, kind, name, seed, out, slot, quiet)
    return run_race_job(cfg, name, seed, race_seed or 0, out, slot, quiet)


def _worker(args: tuple) -> dict[str, object]:
    cfg, job, out, slot, quiet, threads = args
    torch.set_num_threads(threads)
    return _run_one(cfg, job, out, slot, quiet)


# --- the sweep ------------------------------------------------------------------------------------


def jobs_for(cfg: LabConfig) -> list[tuple[str, int]]:
    """(trained encoding, seed) pairs of the character LM: scalings, entropy of scalings and
    the race need the rope model."""
    encodings = [v for v in cfg.variants if v in TRAINED]
    needs_rope = (
        any(v in _inference.INFERENCE for v in cfg.variants)
        or cfg.finetune_steps
        or "race" in cfg.tasks
    )
    if needs_rope and "rope" not in encodings:
        encodings.append("rope")
    if not {"lm", "entropy", "race"} & set(cfg.tasks):
        return []
    if not {"lm", "entropy"} & set(cfg.tasks):
        encodings = ["rope"]  # the race alone needs only the rope model
    return [(e, s) for e in encodings for s in cfg.seeds]


def all_jobs(cfg: LabConfig) -> tuple[list[Job], list[Job]]:
    """The sweep's jobs in two phases: training (LMs, retrieval models), then the race, which
    continues phase one's RoPE models."""
    first: list[Job] = [("lm", e, s, None) for e, s in jobs_for(cfg)]
    encodings = [v for v in cfg.variants if v in TRAINED]
    if any(v in _inference.INFERENCE for v in cfg.variants) and "rope" not in encodings:
        encodings.append("rope")
    for task in PROBE_TASKS:
        need = list(encodings) if task in cfg.tasks else []
        if task == "retrieval" and "race" in cfg.tasks and "rope" not in need:
            need.append("rope")  # the race continues the rope retrieval model
        first += [(task, e, s, None) for e in need for s in cfg.seeds]
    # The rope jobs also evaluate every inference variant asked for (the extensions' exact
    # attention costs 10-20x an SDPA call), so they start first and the others fill the
    # remaining workers meanwhile (their retrieval job is the longest of the phase).
    first.sort(key=lambda job: (job[1] != "rope", job[0] == "lm"))
    second: list[Job] = []
    if "race" in cfg.tasks:
        second = [
            ("race", e, s, r) for s in cfg.seeds for r in cfg.race_seeds for e in cfg.race_entrants
        ]
    return first, second


_distributed = _dp.join  # the group logic lives in distributed.py; its old name stays here


def _finished(cfg: LabConfig, job: Job, out: str) -> dict:
    """A job's result from its file (``ValueError`` if it is missing or from other settings).

    The report reads results this way, never through ``run_job``: in a data-parallel sweep
    that would wait for the other ranks, which are already waiting for the report."""
    kind, name, seed, race_seed = job
    path = job_paths(out, name, seed, kind, race_seed)[1]
    ids = cfg.ids(name, seed, kind, race_seed)
    done = load_result(path, ids.digest, key=ids.key)
    if done is None:
        raise InputError(f"result {path} is missing: a rank did not finish its jobs")
    return done


PROTOCOL = "protocol.json"


_PROTOCOL_DEFAULTS = {
    f.name: json.loads(json.dumps(f.default))
    for f in dataclasses.fields(LabConfig)
    if f.default is not dataclasses.MISSING
}
"""Each LabConfig setting's default as protocol.json holds it (lists, not tuples; only plain
defaults: a setting with a default factory never counts as added)."""


def preflight(cfg: LabConfig, out: str, force: bool = False) -> OwnedFolder:
    """Refuse, before anything is written, an ``out`` the sweep must not write: a file; a
    folder holding files the lab did not write or that changed since (unless ``force``,
    which writes beside them and keeps them; :class:`posemb._owned.OwnedFolder`); a folder
    that cannot be written; a protocol.json with other settings; or any job's result or
    checkpoint made with other settings or unreadable (``ValueError`` naming the file).
    Returns the claimed folder (:meth:`~posemb._owned.OwnedFolder.settle` it before writing).
    """
    folder = OwnedFolder.claim(out, COMMAND, force=force, adopt=earlier_lab, writes=is_lab_file)
    path = os.path.join(out, PROTOCOL)
    if os.path.exists(path):
        theirs = read_json(path, "protocol file")
        if not isinstance(theirs, dict):
            raise InputError(f"{path} is not a posemb lab protocol; use another --out")
        ours = cfg.protocol()
        # A setting this posemb added since the folder was written is no difference while it
        # keeps its default: it names a task the folder never ran, or every job's own digest
        # (checked below) covers what it changes.
        added = {k for k in set(ours) - set(theirs) if ours[k] == _PROTOCOL_DEFAULTS.get(k)}
        diff = [
            f"{k} {theirs.get(k)!r} != {ours.get(k)!r}"
            for k in sorted((set(ours) | set(theirs)) - added)
            if theirs.get(k) != ours.get(k)
        ]
        if diff:
            raise InputError(
                f"--out {out} holds results of another protocol ({'; '.join(diff[:3])}); use "
                f"another --out"
            )
    first, second = all_jobs(cfg)
    for kind, name, seed, race_seed in first + second:
        ckpt, result = job_paths(out, name, seed, kind, race_seed)
        ids = cfg.ids(name, seed, kind, race_seed)
        if kind == "race":
            if load_result(result, ids.digest, key=ids.key) is None:
                load_checkpoint(ckpt, ids.digest, ids.key)
        elif load_result(result, ids.digest, ids.train_digest, ids.key) is None:
            load_checkpoint(ckpt, ids.train_digest, ids.train_key)
    read_invocations(out)
    return folder


def _phases(
    cfg: LabConfig, out: str, rank: int, world: int, data_parallel: bool, quiet: bool
) -> list[dict[str, object]]:
    """Run both phases' jobs (this rank's share); how each phase ran."""
    ran: list[dict[str, object]] = []
    for label, phase in zip(("training", "race"), all_jobs(cfg), strict=True):
        if not phase:
            continue
        if data_parallel:
            # The group lives in this process: its jobs run here, all ranks together.
            for job in (j for j in phase if j[0] == "lm"):
                _run_one(cfg, job, out, quiet=quiet)
            phase = [j for j in phase if j[0] != "lm"]
        jobs = phase[rank::world]
        workers = max(1, min(cfg.workers, len(jobs)))
        # Each job on the threads a worker would have had: the same numbers either way.
        threads = max(1, torch.get_num_threads() // workers)
        if workers > 1 and not workers_can_start():
            if not quiet:
                print("posemb lab: this program's __main__ cannot be run again (a script read "
                      "from standard input?), so no worker process can start; the jobs run "
                      "in this process", file=sys.stderr)  # fmt: skip
            workers = 1
        args = [(cfg, job, out, i % workers, quiet, threads) for i, job in enumerate(jobs)]
        started = time.time()
        if workers == 1:
            for a in args:
                _worker(a)
        else:
            spawn = mp.get_context("spawn")
            # A stop (lab/stopping.py) leaves the with by an exception: the workers are
            # terminated here, and end themselves if this process dies first.
            me = (os.getpid(),)
            # Ctrl-C reaches the whole process group: this process answers, for them too.
            with _huge_pages_in_workers(), children_ignore_sigint():
                pool = spawn.Pool(workers, die_with_parent, me)
            with pool:
                try:
                    pool.map(_worker, args, chunksize=1)
                except BaseException:
                    pool.terminate()
                    pool.join()  # the workers gone, and the pool's own resources released
                    raise
        ran.append(
            {
                "phase": label,
                "jobs": len(jobs),
                "workers": workers,
                "threads_per_worker": threads,
                "ranks": world,
                "seconds": time.time() - started,
            }
        )
        if world > 1:
            import torch.distributed as dist

            dist.barrier()  # phase two reads phase one's checkpoints
    return ran


@contextlib.contextmanager
def _huge_pages_in_workers() -> Iterator[None]:
    """Workers spawned inside start with PyTorch's CPU allocator asking for transparent huge
    pages (``THP_MEM_ALLOC_ENABLE=1``; 2 MiB-aligned tensors of 2 MiB or more, madvised) unless
    the caller set the variable. Long evaluations allocate attention-sized tensors the C
    allocator returns to the kernel; with 4 KiB pages every one is paid for again in page
    faults (a 2-layer CoPE model's 1,024-token probes: 64 s, 12 M faults; with huge pages
    35 s). Only where memory comes from changes, never a number. A run with one worker trains
    in this process, whose allocator has long started: it keeps 4 KiB pages (set the variable
    before starting Python to change that)."""
    key = "THP_MEM_ALLOC_ENABLE"
    before = os.environ.get(key)
    if before is None:
        os.environ[key] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)


def run(
    cfg: LabConfig, out: str, quiet: bool = False, force: bool = False
) -> dict[str, Any] | None:
    """Run (or resume) the sweep into ``out``; write results.json, results.md and plots.

    Phase one trains every LM and retrieval model; phase two runs the fine-tuning race from
    the RoPE models. Under ``torchrun`` each phase's jobs are dealt round-robin to the ranks
    (over gloo), each rank runs its share with its own workers, and rank 0 writes the report
    once all have finished. With ``cfg.data_parallel`` the language-model jobs run on every
    rank instead, one after another, each model trained data-parallel over all ranks (NCCL on
    CUDA, else gloo; ``cfg.batch`` a multiple of the world size); the retrieval and race jobs
    are still dealt. Either way ``out`` must be a folder every rank can read (the same
    machine, or a shared filesystem). Only rank 0 returns the summary
    (:func:`posemb.lab.report.summarise`, plus ``plots``: the files written).

    ``out`` is checked before anything runs (:func:`preflight`); with ``force`` the sweep
    writes beside files it did not write, keeping them. A second run into the same ``out``
    while this one runs is refused (:meth:`posemb._owned.OwnedFolder.running`). Every
    invocation is recorded in ``invocations.json`` (when, how long, workers and threads per
    phase, the machine), so the report of a resumed sweep says so.
    """
    _dp.resolve_device(cfg.device)
    data = _corpus.load(cfg.corpus, min_held_out=max(cfg.eval_lens) + 2)  # fail before any worker
    cfg.check_corpus(data)
    # A dealt sweep's group only waits at barriers: gloo does that whatever the device.
    rank, world = _dp.join(cfg.device if cfg.data_parallel else "cpu")
    data_parallel = cfg.data_parallel and world > 1
    if data_parallel:
        _dp.check_batch(cfg.batch, world)
    elif cfg.data_parallel and not quiet:
        print(
            "posemb lab: --data-parallel outside torchrun (WORLD_SIZE unset or 1): one process "
            "trains every model",
            file=sys.stderr,
        )
    preflight(cfg, out, force=force)  # before the lock: a refusal creates nothing
    with stopping():  # SIGTERM / SIGINT: Stopped, the workers ended, what finished kept
        if rank != 0:
            return _sweep(cfg, out, data, rank, world, data_parallel, quiet, force)
        with OwnedFolder(out, COMMAND).running():
            return _sweep(cfg, out, data, rank, world, data_parallel, quiet, force)


def _sweep(
    cfg: LabConfig,
    out: str,
    data: _corpus.Corpus,
    rank: int,
    world: int,
    data_parallel: bool,
    quiet: bool,
    force: bool,
) -> dict[str, Any] | None:
    """:func:`run` once the folder is checked (and, on rank 0, held): the phases, the record
    of this invocation, and the report."""
    claimed = preflight(cfg, out, force=force)  # again, held: no other run came in between
    started = time.time()
    earlier = closed(read_invocations(out), out, started)
    if rank == 0:
        claimed.settle()
        write_file(out, os.path.join(out, PROTOCOL), json.dumps(cfg.protocol(), indent=1).encode())
        # Recorded now, so that a killed invocation is still counted when the sweep resumes.
        begun = [*earlier, report.invocation(started, None, [], cfg.device)]
        write_file(out, os.path.join(out, INVOCATIONS), json.dumps(begun, indent=1).encode())
    phases = _phases(cfg, out, rank, world, data_parallel, quiet)
    if rank != 0:
        import torch.distributed as dist

        dist.barrier()  # wait for rank 0's report, then leave together
        return None
    first, second = all_jobs(cfg)
    results = [_finished(cfg, job, out) for job in first + second]
    wall = time.time() - started
    runs = [*earlier, report.invocation(started, wall, phases, cfg.device)]
    write_file(out, os.path.join(out, INVOCATIONS), json.dumps(runs, indent=1).encode())
    summary = report.summarise(cfg, data, results, wall, runs=runs)
    report.write(summary, out)
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
    return summary


# Settings and files moved to posemb.lab.config and posemb.lab.checkpoints; their names stay
# importable from here.
__all__ = [
    "DEFAULT_VARIANTS",
    "TASKS",
    "LabConfig",
    "all_jobs",
    "gpu_config",
    "job_paths",
    "jobs_for",
    "preflight",
    "quick_config",
    "run",
    "run_job",
    "run_probe_job",
    "run_race_job",
    "run_retrieval_job",
]
