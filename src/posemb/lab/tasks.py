"""The lab's probe tasks, one table: what each trains on, how it is scored, and its settings.

A probe task trains a small model of its own per encoding and seed at the training length, then
probes it at every evaluation length, with the answer at a known distance and a control probe
that removes what the answer depends on (a model reading anything else scores at chance there):

- ``retrieval`` (:mod:`posemb.lab.retrieval`): one-token facts, one queried;
- ``multikey`` (:mod:`posemb.lab.multikey`): two-token needles, one key queried among other
  keys (RULER's multi-key needle in a haystack);
- ``vartrack`` (:mod:`posemb.lab.vartrack`): a chain of assignments, the value of its last
  variable queried (RULER's variable tracking);
- ``flipflop`` (:mod:`posemb.lab.flipflop`): the bit of the last write among ignored bits
  (flip-flop language modelling; CoPE's selective-copy test).

Each module has the same faces (``VOCAB``, ``CHANCE``, ``training_batch(batch, length, *sizes,
gen)``, ``evaluate(model, lengths, train_len, *sizes, count, seed)``, ``check_sizes(*sizes,
length)``), so one job runs them all (:func:`posemb.lab.sweep.run_probe_job`). They share the
probe model's shape, batch and learning rate (``retrieval_width``, ``retrieval_layers``,
``retrieval_batch``, ``retrieval_lr``, ``retrieval_probes``); each has its own sizes and steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

from . import flipflop, multikey, retrieval, vartrack


@dataclass(frozen=True)
class ProbeTask:
    """One probe task: its ``name`` (a ``--tasks`` entry and a job kind), the ``module`` that
    makes and scores its windows, the LabConfig fields giving its sizes (in the order its
    functions take them) and its training steps, a line for the report, and its name in
    prose."""

    name: str
    module: ModuleType
    size_fields: tuple[str, ...]
    steps_field: str
    description: str
    title: str

    def sizes(self, cfg: Any) -> tuple[int, ...]:
        """This task's sizes from a :class:`posemb.lab.config.LabConfig`."""
        return tuple(getattr(cfg, f) for f in self.size_fields)

    @property
    def chance(self) -> float:
        """The accuracy of a model that cannot see what the answer depends on."""
        return float(self.module.CHANCE)


PROBE_TASKS: dict[str, ProbeTask] = {
    t.name: t
    for t in (
        ProbeTask(
            "retrieval",
            retrieval,
            ("retrieval_facts",),
            "retrieval_steps",
            "one-token facts in filler, the query last, its fact at a random depth",
            "Retrieval",
        ),
        ProbeTask(
            "multikey",
            multikey,
            ("multikey_needles",),
            "multikey_steps",
            "two-token needles (key, value) in filler, one key queried among other keys",
            "Multi-key needle",
        ),
        ProbeTask(
            "vartrack",
            vartrack,
            ("vartrack_hops", "vartrack_chains"),
            "vartrack_steps",
            "chains of assignments in filler, the value of one chain's last variable queried",
            "Variable tracking",
        ),
        ProbeTask(
            "flipflop",
            flipflop,
            (),
            "flipflop_steps",
            "write/ignore/read instructions with a bit each, the last written bit read",
            "Flip-flop",
        ),
    )
}


__all__ = ["PROBE_TASKS", "ProbeTask"]
