"""The fine-tuning race: continue a trained RoPE model at a longer length under each scaling.

Chen et al. 2023 (position interpolation) fine-tune for 1000 steps and report that PI adapts
within a few hundred while plain RoPE trained on longer windows ("direct extrapolation")
barely moves; Peng et al. 2023 (YaRN) report that YaRN needs fewer steps than PI (400 vs
1000 for Llama 2 at 64k). The lab runs that race on its own models: the RoPE character LM and
the RoPE retrieval model, each continued at ``race_len = s * train_len`` for N steps with the
schedule of each scaling at factor ``s`` (plain ``rope`` is the "no scaling" entrant), scored
after N = each milestone on loss past the original length and on retrieval accuracy.

Every entrant of one (model seed, race seed) sees the same fine-tuning batches in the same
order, so differences between scalings are paired; the spread over race seeds (and model seeds)
says which differences exceed the noise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .. import scaling as sc
from .._errors import InputError
from . import retrieval
from .model import TinyLM, scaling_for
from .train import adamw, next_token, per_position_loss, train, windows

ENTRANTS = ("rope", "rope+pi", "rope+ntk", "rope+yarn", "rope+llama3")

RACE_UNIT = "model seed"
"""What a race statistic's ``n`` counts (the report's race summary); summaries without
``race["unit"]`` pooled every (model seed, race seed) run as if independent."""


def schedule(entrant: str, train_len: int, length: int) -> sc.RopeScaling | None:
    """The RoPE schedule of ``entrant`` for windows of ``length`` (None: plain RoPE)."""
    if entrant not in ENTRANTS:
        raise InputError(f"unknown race entrant {entrant!r}; known: {', '.join(ENTRANTS)}")
    return None if entrant == "rope" else scaling_for(entrant, train_len, length)


@dataclass(frozen=True)
class RaceSetup:
    """What one race job needs besides the two models (all from :class:`LabConfig`)."""

    entrant: str
    train_len: int
    race_len: int
    milestones: tuple[int, ...]
    eval_lens: tuple[int, ...]
    lm_batch: int
    lm_lr: float
    retrieval_batch: int
    retrieval_lr: float
    retrieval_facts: int
    probes: int
    weight_decay: float


def _scale(models: Sequence[TinyLM], entrant: str, train_len: int, length: int) -> None:
    for m in models:
        m.set_scaling(schedule(entrant, train_len, length))


def score(
    lm: TinyLM,
    ret: TinyLM,
    setup: RaceSetup,
    held: dict[int, torch.Tensor],
    probe_seed: int,
) -> dict[str, dict[str, object]]:
    """Loss past ``train_len`` (nats/char) and retrieval counts at each of ``setup.eval_lens``,
    with the entrant's schedule for that length (its factor s = length / train_len).

    Returns ``{"loss_past": {str(n): float}, "retrieval": {str(n): {"correct", "total"}}}``.
    The models are left at the schedule of ``race_len``.
    """
    out: dict[str, dict[str, object]] = {"loss_past": {}, "retrieval": {}}
    for n in setup.eval_lens:
        _scale((lm, ret), setup.entrant, setup.train_len, n)
        curve = per_position_loss(lm, held[n])
        out["loss_past"][str(n)] = float(curve[setup.train_len :].mean())
        gen = torch.Generator().manual_seed(probe_seed * 1_000_003 + n)
        out["retrieval"][str(n)] = retrieval.anywhere(
            ret, n, setup.retrieval_facts, setup.probes, gen
        )
    _scale((lm, ret), setup.entrant, setup.train_len, setup.race_len)
    return out


def run(
    lm: TinyLM,
    ret: TinyLM,
    setup: RaceSetup,
    train_ids: torch.Tensor,
    held: dict[int, torch.Tensor],
    gen: torch.Generator,
    probe_seed: int,
    state: dict | None = None,
    on_milestone: Callable[[dict], None] | None = None,
) -> dict[str, dict[str, dict[str, object]]]:
    """Fine-tune ``lm`` and ``ret`` (in place) at ``race_len`` under ``setup.entrant``, scoring
    them at every milestone.

    Args:
        lm, ret: the trained RoPE character LM and RoPE retrieval model.
        setup: the race's settings.
        train_ids: the corpus's training ids ``(n,)``.
        held: held-out LM windows ``(count, n + 1)`` for each evaluation length n.
        gen: draws the fine-tuning batches (the same seed for every entrant: paired batches).
        probe_seed: seeds the retrieval probes (the same for every entrant and milestone).
        state: what ``on_milestone`` last received, to resume from (None: start).
        on_milestone: called with the resumable state after each milestone is scored.

    Returns:
        ``{str(N): score(...)}`` for each milestone N.
    """
    L, n = setup.train_len, setup.race_len
    lm_batch = max(1, setup.lm_batch * L // n)  # same tokens per step as pre-training
    ret_batch = max(1, setup.retrieval_batch * L // n)
    facts = min(retrieval.KEYS, setup.retrieval_facts * n // L, n // 2)  # same fact density
    lm_opt = adamw(lm, setup.lm_lr, setup.weight_decay)
    ret_opt = adamw(ret, setup.retrieval_lr, setup.weight_decay)
    results: dict[str, dict[str, dict[str, object]]] = {}
    done = 0
    if state is not None:
        lm.load_state_dict(state["lm"])
        ret.load_state_dict(state["ret"])
        lm_opt.load_state_dict(state["lm_opt"])
        ret_opt.load_state_dict(state["ret_opt"])
        gen.set_state(state["generator"])
        results, done = dict(state["results"]), int(state["done"])
    _scale((lm, ret), setup.entrant, L, n)
    for milestone in setup.milestones:
        if str(milestone) in results:
            continue
        # One batch of each per step, drawn in this order: a resumed race draws what it would have.
        lm_step = lambda _: next_token(windows(train_ids, n, lm_batch, gen))  # noqa: E731
        train(lm, lm_opt, lm_step, milestone, lambda _: setup.lm_lr, start=done)
        ret_step = lambda _: retrieval.training_batch(ret_batch, n, facts, gen)  # noqa: E731
        train(ret, ret_opt, ret_step, milestone, lambda _: setup.retrieval_lr, start=done)
        done = milestone
        results[str(milestone)] = score(lm, ret, setup, held, probe_seed)
        if on_milestone is not None:
            on_milestone(
                {
                    "lm": lm.state_dict(),
                    "ret": ret.state_dict(),
                    "lm_opt": lm_opt.state_dict(),
                    "ret_opt": ret_opt.state_dict(),
                    "generator": gen.get_state(),
                    "results": results,
                    "done": done,
                }
            )
    lm.set_scaling(None)
    ret.set_scaling(None)
    return results
