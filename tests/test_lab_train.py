"""The lab's one training loop and its schedule."""

import itertools
import math

import pytest
import torch
from torch import nn

from posemb.lab import train as tr


def test_warmup_then_cosine_to_a_tenth():
    steps, peak = 200, 2e-3
    lrs = [tr.warmup_cosine(s, steps, peak) for s in range(steps)]
    warm = steps // 20
    assert lrs[0] == pytest.approx(peak / warm)
    assert lrs[warm - 1] == pytest.approx(peak) and lrs[warm] == pytest.approx(peak)
    assert all(a < b for a, b in itertools.pairwise(lrs[:warm]))
    assert all(a > b for a, b in itertools.pairwise(lrs[warm:]))
    # The decay reaches 10% of the peak at the end of the schedule.
    assert tr.warmup_cosine(steps, steps, peak) == pytest.approx(0.1 * peak)
    assert tr.warmup_cosine(0, 10, peak) == peak  # a run shorter than 20 steps warms up in one


def _toy(seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 16), nn.GELU(), nn.Linear(16, 3))
    x = torch.randn(40, 5)
    y = x[:, :3].argmax(-1)  # a rule the model can learn
    return model, x, y


def test_full_batch_without_clipping_or_decay_is_plain_adam():
    model, x, y = _toy(0)
    last = tr.train(
        model, tr.adamw(model, 1e-2, 0.0), lambda _: (x, y), 30, lambda _: 1e-2, clip=None
    )
    ref, x, y = _toy(0)
    opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    for _ in range(30):
        loss = nn.functional.cross_entropy(ref(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    for a, b in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.equal(a, b)
    assert last == loss.item()
    assert last < math.log(3) / 2  # it learned: well below guessing among 3 classes


def test_steps_resume_where_they_stopped_and_report_progress():
    seen = []

    def record(done, loss):
        seen.append(done)

    model, x, y = _toy(1)
    opt = tr.adamw(model, 1e-2, 0.01)
    lr_at = lambda s: tr.warmup_cosine(s, 20, 1e-2)  # noqa: E731
    tr.train(model, opt, lambda _: (x, y), 8, lr_at, on_step=record)
    tr.train(model, opt, lambda _: (x, y), 20, lr_at, start=8, on_step=record)
    whole, x, y = _toy(1)
    tr.train(whole, tr.adamw(whole, 1e-2, 0.01), lambda _: (x, y), 20, lr_at)
    assert seen == list(range(1, 21))
    for a, b in zip(model.parameters(), whole.parameters(), strict=True):
        assert torch.equal(a, b)
    assert tr.train(model, opt, lambda _: (x, y), 20, lr_at, start=20) is None


def test_clipping_bounds_the_update_of_one_plain_sgd_step():
    model, x, y = _toy(2)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    tr.train(model, opt, lambda _: (x, y), 1, lambda _: 1.0, clip=1e-3)
    moved = torch.cat([(p - b).flatten() for p, b in zip(model.parameters(), before, strict=True)])
    assert float(moved.detach().norm()) == pytest.approx(1e-3, rel=1e-3)


def test_windows_and_per_position_loss_shapes():
    ids = torch.arange(100)
    gen = torch.Generator().manual_seed(0)
    w = tr.windows(ids, 7, 5, gen)
    assert w.shape == (5, 8) and bool((w[:, 1:] - w[:, :-1] == 1).all())
    inputs, targets = tr.next_token(w)
    assert torch.equal(inputs, w[:, :-1]) and torch.equal(targets, w[:, 1:])

    class Uniform(nn.Module):
        def forward(self, tokens):
            return torch.zeros(*tokens.shape, 100)

    loss = tr.per_position_loss(Uniform(), w % 100, chunk=2)
    assert loss.shape == (7,)
    assert torch.allclose(loss, torch.full((7,), math.log(100)))
