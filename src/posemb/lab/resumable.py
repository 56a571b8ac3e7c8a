"""Training that survives being stopped: a job's checkpoints, every generator it draws from
saved in them, its progress bar, and its time summed over every invocation that trained it.
Shared by every job of the sweep (:mod:`posemb.lab.sweep`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from . import distributed as _dp
from .checkpoints import load_checkpoint, save_checkpoint
from .config import JobIds
from .model import TinyLM


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


def _train_resumable(
    model: TinyLM,
    opt: torch.optim.Optimizer,
    generators: dict[str, torch.Generator],
    *,
    batch_at: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    steps: int,
    lr_at: Callable[[int], float],
    ckpt_path: str,
    ids: JobIds,
    out: str,
    every: int,
    label: str,
    slot: int,
    quiet: bool,
    rank: int = 0,
    world: int = 1,
) -> tuple[float | None, float]:
    """Train from the checkpoint at ``ckpt_path`` if there is one (refused if made with other
    settings), saving one every ``every`` steps and at the end; the last loss and the seconds
    spent training, over every invocation that trained this job (a checkpoint keeps them).
    Every generator the job draws from is in ``generators`` (by name) and in each checkpoint.

    ``batch_at`` gives the step's whole batch; with ``world`` > 1 rank ``rank`` trains on its
    slice (:func:`posemb.lab.distributed.train_sharded`), every rank resumes from the same
    checkpoint (checked) and rank 0 alone writes them.
    """
    step, last, earlier = 0, None, 0.0
    started = time.time()
    ckpt = load_checkpoint(ckpt_path, ids.train_digest, ids.train_key)
    if ckpt is not None:
        earlier = float(ckpt.get("seconds", 0.0))
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        for name, g in generators.items():
            g.set_state(ckpt[name])
        step, last = int(ckpt["step"]), ckpt.get("loss")
    _dp.agree(step, f"checkpoint steps in {ckpt_path}", world)
    bar = _progress(steps, label, slot, quiet or rank != 0, initial=step)

    def on_step(done: int, loss: float) -> None:
        bar(1, loss)
        if rank == 0 and (done % every == 0 or done == steps):
            state = {
                "digest": ids.train_digest,
                "settings": ids.train_key,
                "step": done,
                "model": model.state_dict(),
                "optimizer": opt.state_dict(),
                "loss": loss,
                "seconds": earlier + time.time() - started,
            }
            state |= {name: g.get_state() for name, g in generators.items()}
            save_checkpoint(state, ckpt_path, out)

    loss = _dp.train_sharded(
        model, opt, batch_at, steps, lr_at, rank=rank, world=world, start=step, on_step=on_step
    )
    bar(0, None, close=True)
    return (last if loss is None else loss), earlier + time.time() - started
