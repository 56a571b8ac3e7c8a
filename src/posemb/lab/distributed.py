"""The lab's process groups: dealing whole jobs to ranks, or training one model data-parallel.

Under ``torchrun`` every rank joins one group (:func:`join`). By default the sweep deals its jobs
round-robin to the ranks (each model trains on one rank). With ``--data-parallel`` every rank
runs every language-model job together, each model wrapped in
:class:`torch.nn.parallel.DistributedDataParallel` (:func:`train_sharded`): every rank draws
the same global batch from the same seeded generator and trains on its contiguous slice, and
DDP averages the gradients, so a step equals the one-process full-batch step up to float
rounding. The small retrieval models and the race are still dealt, one job per rank.

Backends: NCCL when the models train data-parallel on CUDA (the whole group, its barriers
included), gloo otherwise (CPU, and every dealt sweep, whose group only waits at barriers).
Device of a rank: ``cuda:{LOCAL_RANK}`` or the CPU. A rank may wait at a collective for as long
as another rank's job takes, so the group's timeout is ``GROUP_TIMEOUT_HOURS``, not torch's
default.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .._errors import InputError
from .train import train

DEVICES = ("cpu", "cuda", "auto")

# How long a rank waits at a collective. torch's defaults (10 min for NCCL, 30 for gloo) are
# shorter than a rank may wait here: at a phase's end for another rank's last job, or for rank
# 0's evaluation, entropy measurement and report.
GROUP_TIMEOUT_HOURS = 12

# Added to a job's seed, times the rank, for the global generator of ranks > 0 (see train_sharded).
_RANK_SEED_STRIDE = 1_000_003


def resolve_device(name: str) -> str:
    """``"cpu"`` or ``"cuda"`` for a ``--device`` value (``auto``: CUDA when it is available).

    Raises ``ValueError`` for an unknown name, or ``cuda`` where no CUDA GPU is visible.
    """
    if name not in DEVICES:
        raise InputError(f"--device must be one of {', '.join(DEVICES)}, got {name!r}")
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise InputError(
            "--device cuda needs a CUDA GPU, and none is visible here "
            "(torch.cuda.is_available() is False); use --device cpu or --device auto"
        )
    return name


def rank_device(name: str) -> torch.device:
    """The device this process trains on for a ``--device`` value: the CPU, or
    ``cuda:{LOCAL_RANK}`` (one GPU per process on a node, as torchrun numbers them)."""
    if resolve_device(name) == "cpu":
        return torch.device("cpu")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    count = torch.cuda.device_count()
    if local >= count:
        raise InputError(
            f"--device cuda: LOCAL_RANK {local} has no GPU of its own ({count} visible); "
            f"start at most {count} processes per node"
        )
    return torch.device("cuda", local)


def backend_for(device: torch.device) -> str:
    """``"nccl"`` for a model on CUDA (where NCCL is built in), else ``"gloo"``."""
    import torch.distributed as dist

    if device.type == "cuda" and torch.cuda.is_available() and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def join(device: str = "cpu") -> tuple[int, int]:
    """(rank, world size) under torchrun, joining the group; (0, 1) otherwise.

    The backend is :func:`backend_for` the rank's device of ``device`` (a ``--device`` value);
    a group joined earlier in this process is kept as it is.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1
    import torch.distributed as dist

    if not dist.is_initialized():
        dev = rank_device(device)
        backend = backend_for(dev)
        if backend == "nccl":
            # NCCL's collectives (barrier, object broadcasts) run on the current device.
            torch.cuda.set_device(dev)
        from datetime import timedelta

        dist.init_process_group(backend, timeout=timedelta(hours=GROUP_TIMEOUT_HOURS))
    return dist.get_rank(), world


def group(data_parallel: bool) -> tuple[int, int]:
    """(rank, world size) of the group a model trains across: the joined group when
    ``data_parallel`` is set, else (0, 1) (a dealt job trains in one process)."""
    if not data_parallel:
        return 0, 1
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def check_batch(batch: int, world: int) -> None:
    """Raise ``ValueError`` unless ``batch`` windows split evenly over ``world`` ranks."""
    if batch % world:
        raise InputError(
            f"--batch {batch} must be a multiple of the world size {world} for --data-parallel "
            f"(each rank trains on batch / world windows)"
        )


def shard(batch: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s contiguous slice ``(b / world, ...)`` of a global batch ``(b, ...)``."""
    b = len(batch)
    check_batch(b, world)
    per = b // world
    return batch[rank * per : (rank + 1) * per]


def _collective_device() -> torch.device:
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def agree(value: int, what: str, world: int) -> None:
    """Raise ``ValueError`` on every rank unless all ``world`` ranks passed the same ``value``.

    Ranks that resume from different checkpoints (``--out`` not shared) would otherwise wait
    forever for each other's gradients.
    """
    if world <= 1:
        return
    import torch.distributed as dist

    t = torch.tensor([value, -value], dtype=torch.int64, device=_collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    high, low = int(t[0]), -int(t[1])
    if high != low:
        raise InputError(
            f"the ranks see different {what} ({low} to {high}): --out must be one folder "
            f"every rank reads (the same machine or a shared filesystem)"
        )


def from_rank0(obj: Any, world: int) -> Any:
    """Rank 0's ``obj`` on every rank (pickled); ``obj`` itself when ``world`` is 1."""
    if world <= 1:
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def train_sharded(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    batch_at: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    steps: int,
    lr_at: Callable[[int], float],
    *,
    rank: int = 0,
    world: int = 1,
    start: int = 0,
    on_step: Callable[[int, float], None] | None = None,
) -> float | None:
    """:func:`posemb.lab.train.train`, data-parallel over ``world`` ranks.

    Args:
        model: the model, already on this rank's device with the same weights on every rank
            (DDP also broadcasts rank 0's).
        opt: its optimizer, over ``model.parameters()``.
        batch_at: step -> the step's GLOBAL batch ``(inputs (b, ...), targets (b, ...))`` (CPU
            is fine), drawn by every rank from the same seeded generator; rank r trains on
            rows ``[r * b / world, (r + 1) * b / world)``, moved to the model's device.
        steps, lr_at, start: as for :func:`~posemb.lab.train.train`.
        rank, world: this process's rank and the group's size; ``world`` 1 trains the whole
            batch in this process, without DDP or a group.
        on_step: called on every rank as ``on_step(steps_done, loss)`` with the mean of the
            ranks' losses: the whole batch's loss when every row weighs the same in it (the
            language model: every row has as many targets).

    Returns:
        The last step's training loss (that mean), or None when no step ran.

    With ``world`` > 1 the global random generator of ranks > 0 is reseeded (from the job's
    seed and the rank), so that a model drawing from it in the forward pass draws differently
    on each rank. The lab's :class:`~posemb.lab.model.TinyLM` does not: it draws randomised
    positions from its own generator, the whole batch's on every rank (``position_shard``),
    so it matches a one-process run up to float rounding, as every other variant does.
    """
    device = next(model.parameters()).device

    def local(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = batch_at(step)
        if world > 1:
            inputs, targets = shard(inputs, rank, world), shard(targets, rank, world)
        return inputs.to(device), targets.to(device)

    if world <= 1:
        return train(model, opt, local, steps, lr_at, start=start, on_step=on_step)
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if not dist.is_initialized() or dist.get_world_size() != world or dist.get_rank() != rank:
        raise InputError(
            f"rank {rank} of {world} needs a joined process group of that size (see join())"
        )
    if rank:
        torch.manual_seed(torch.initial_seed() + _RANK_SEED_STRIDE * rank)
    ddp = DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None
    )
    last: float | None = None

    def reduced(done: int, loss: float) -> None:
        nonlocal last
        t = torch.tensor([loss], dtype=torch.float64, device=_collective_device())
        dist.all_reduce(t)  # SUM: gloo has no AVG
        last = float(t) / world
        if on_step is not None:
            on_step(done, last)

    train(ddp, opt, local, steps, lr_at, start=start, on_step=reduced)
    return last
