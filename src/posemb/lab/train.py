"""The lab's one training loop, its learning-rate schedule, batches and per-position evaluation.

Every model the lab trains goes through :func:`train`: the character LMs of ``posemb lab``
(random windows, warm-up + cosine, clipped AdamW, checkpoints through ``on_step``), their
position-interpolation fine-tune, and the dog-bites-man encoders (full batch, constant rate).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from .memory import model_heads, windows_per_pass

WARMUP_DIVISOR = 20  # warm up over the first 5% of the steps
FINAL_LR_FRACTION = 0.1  # cosine decay ends at 10% of the peak rate, not 0
CLIP_NORM = 1.0


def warmup_cosine(step: int, steps: int, peak: float) -> float:
    """Learning rate at ``step`` (0-based) of ``steps``: linear warm-up over the first
    ``steps / 20`` steps (at least one), then cosine decay from ``peak`` to ``peak / 10``."""
    warm = max(1, steps // WARMUP_DIVISOR)
    if step < warm:
        return peak * (step + 1) / warm
    t = (step - warm) / max(1, steps - warm)
    floor = FINAL_LR_FRACTION
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


def adamw(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """The optimizer of every lab model (with ``weight_decay=0`` it is Adam)."""
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)


def windows(ids: torch.Tensor, length: int, count: int, gen: torch.Generator) -> torch.Tensor:
    """``count`` random windows of ``length + 1`` consecutive ids ``(n,)``: ``(count, length + 1)``
    (inputs are ``[:, :-1]``, next-token targets ``[:, 1:]``). Draws once from ``gen``."""
    starts = torch.randint(0, len(ids) - length - 1, (count,), generator=gen)
    return torch.stack([ids[s : s + length + 1] for s in starts.tolist()])


def next_token(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs ``(b, L)`` and targets ``(b, L)`` of windows ``(b, L + 1)``."""
    return w[:, :-1], w[:, 1:]


def train(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    batch_at: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    steps: int,
    lr_at: Callable[[int], float],
    *,
    clip: float | None = CLIP_NORM,
    start: int = 0,
    on_step: Callable[[int, float], None] | None = None,
) -> float | None:
    """Train ``model`` with cross-entropy from step ``start`` up to ``steps``.

    Args:
        model: maps inputs to logits ``(b, classes)`` or ``(b, s, classes)``.
        opt: its optimizer (its state restored by the caller when resuming).
        batch_at: step -> (inputs, targets ``(b,)`` or ``(b, s)``); called once per step, in
            order, so a generator it draws from advances exactly as the steps do.
        steps: the step count to reach.
        lr_at: step -> learning rate, set on every parameter group before the step.
        clip: maximum gradient norm, or None for no clipping.
        start: the first step (the steps already done by a resumed run).
        on_step: called as ``on_step(steps_done, loss)`` after each step (progress, checkpoints).

    Returns:
        The last step's training loss, or None when no step ran.
    """
    model.train()
    last = None
    for step in range(start, steps):
        inputs, targets = batch_at(step)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        logits = model(inputs)
        # Classes to dim 1, as cross_entropy wants: (b, s, c) -> (b, c, s); (b, c) unchanged.
        loss = nn.functional.cross_entropy(logits.movedim(-1, 1), targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        last = loss.item()
        if on_step is not None:
            on_step(step + 1, last)
    return last


def per_position_loss(model: nn.Module, w: torch.Tensor, chunk: int = 4) -> torch.Tensor:
    """Next-token loss (nats/token) at each position, averaged over windows ``(n, L + 1)``:
    shape ``(L,)``. Runs at most ``chunk`` windows at a time (fewer for long windows:
    :mod:`posemb.lab.memory`), in eval mode, without gradients."""
    model.eval()
    losses = []
    chunk = windows_per_pass(w.shape[-1] - 1, model_heads(model), chunk, w.device)
    with torch.no_grad():
        for part in w.split(chunk):
            inputs, targets = next_token(part)
            loss = nn.functional.cross_entropy(
                model(inputs).transpose(1, 2), targets, reduction="none"
            )
            losses.append(loss)
    return torch.cat(losses).mean(0)
