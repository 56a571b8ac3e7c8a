"""Lab settings and helpers the lab's tests share: a sweep small enough to train in seconds, and
a way to kill a job mid-training."""

import dataclasses

import pytest
import torch

from posemb.lab import sweep

TINY = dataclasses.replace(
    sweep.quick_config(),
    variants=("sinusoidal", "rope", "rope+ntk"),
    train_len=16,
    eval_lens=(16, 32),
    steps=20,
    width=32,
    layers=1,
    heads=2,
    batch=4,
    eval_windows=2,
    checkpoint_every=10,
    workers=1,
    tasks=("lm",),  # retrieval, entropy and the race: tests/test_lab_tasks.py
)


def crash_after(monkeypatch, steps, run):
    """Run ``run`` with the optimiser failing at step ``steps + 1`` (a kill mid-training)."""
    calls = {"n": 0}
    real = torch.optim.AdamW.step

    def crashing(self, *a, **k):
        calls["n"] += 1
        if calls["n"] > steps:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(torch.optim.AdamW, "step", crashing)
    with pytest.raises(KeyboardInterrupt):
        run()
    monkeypatch.setattr(torch.optim.AdamW, "step", real)
