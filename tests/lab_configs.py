"""Lab settings the lab's tests share: a sweep small enough to train in seconds."""

import dataclasses

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
