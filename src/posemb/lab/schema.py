"""The lab summary's schema: the records :func:`posemb.lab.report.compact` writes, and their
reader.

The shipped summary (``lab/data/default_summary.json``) is JSON: :class:`Summary` and the
records under it say what each key holds, so that mypy checks every place that reads one.
:class:`LabSummary` answers the questions the report, the lesson's claims and its figures ask
of it (the loss of a variant at a length, whether it rises past the training length beyond seed
noise, how much of what context is worth it keeps), in one place, with a clear error for a
summary that lacks what is asked.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, cast, get_args

from .._errors import InputError


class Stat(TypedDict):
    """A mean over ``n`` seeds; ``std`` the sample standard deviation (None for one seed)."""

    mean: float
    std: float | None
    n: int


class Accuracy(Stat):
    """An accuracy over seeds, with the pooled counts and their binomial standard error."""

    correct: int
    total: int
    se: float


class LossAt(TypedDict):
    """Loss (nats/char) at one evaluation length: over all positions, and past the training
    length (None at the training length, where nothing lies past it)."""

    all: Stat
    past: Stat | None


class RetrievalAt(TypedDict):
    """Retrieval accuracy at one length: a fact anywhere in the window, and the control."""

    anywhere: Accuracy
    control: Accuracy


class Retrieval(TypedDict):
    """The retrieval task: chance, its size, accuracy by variant and length, and by distance
    from fact to query (pooled over lengths)."""

    chance: float
    facts: int
    probes: int
    variants: dict[str, dict[str, RetrievalAt]]
    by_distance: dict[str, dict[str, Accuracy]]


class Probe(TypedDict):
    """A probe task beside retrieval (``multikey``, ``vartrack``, ``flipflop``): chance, its
    size fields (:data:`posemb.lab.tasks.PROBE_TASKS`), probes per length and seed, accuracy
    by variant and length, and by distance from the queried fact to the query (pooled over
    lengths)."""

    chance: float
    sizes: dict[str, int]
    probes: int
    variants: dict[str, dict[str, RetrievalAt]]
    by_distance: dict[str, dict[str, Accuracy]]


class EntropyAt(TypedDict):
    """Attention entropy at one length: per layer, and the mean over layers."""

    layers: list[float]
    mean: Stat


class Entropy(TypedDict):
    """Attention entropy: a uniform head's by length, and each variant's, scaling off and on."""

    uniform: dict[str, float]
    variants: dict[str, dict[str, dict[str, EntropyAt]]]


class _Corpus(TypedDict):
    name: str
    characters: int
    vocab: int


class CorpusInfo(_Corpus, total=False):
    """The corpus the lab trained on (``source``: where its text came from, the embedded Bible
    or a file's absolute path; absent from summaries written before it was recorded)."""

    source: str


class Summary(TypedDict):
    """What :func:`posemb.lab.report.compact` returns and the shipped summary holds.

    ``results[variant][str(eval_len)]`` is a :class:`LossAt`; ``config`` is the run's
    :class:`posemb.lab.config.LabConfig` as a dict; ``retrieval``, ``multikey``, ``vartrack``,
    ``flipflop``, ``entropy`` and ``race`` are None for a sweep that did not run them (absent
    from a summary written before the task existed).
    """

    corpus: CorpusInfo
    unigram_entropy: float
    train_len: int
    eval_lens: list[int]
    config: dict[str, Any]
    versions: dict[str, str]
    results: dict[str, dict[str, LossAt]]
    coincide: list[list[str]]
    retrieval: Retrieval | None
    multikey: Probe | None
    vartrack: Probe | None
    flipflop: Probe | None
    entropy: Entropy | None
    race: dict[str, Any] | None


Part = Literal["all", "past"]
ProbeName = Literal["retrieval", "multikey", "vartrack", "flipflop"]

_CONFIG_KEYS = ("train_len", "eval_lens", "seeds", "layers")


@dataclass(frozen=True)
class LabSummary:
    """A lab summary, read. Build it with :meth:`of`, which checks what the readers need."""

    data: Summary

    @classmethod
    def of(cls, data: Mapping[str, Any] | LabSummary) -> LabSummary:
        """Check ``data`` (a :class:`Summary`, as JSON gives it) and wrap it.

        Raises:
            ValueError: a key the readers need is missing, or a result has no loss within the
                training length.
        """
        if isinstance(data, LabSummary):
            return data
        for key in ("unigram_entropy", "config", "results"):
            if key not in data:
                raise InputError(f"lab summary: no {key!r} (compact() of a sweep writes one)")
        for key in _CONFIG_KEYS:
            if key not in data["config"]:
                raise InputError(f"lab summary: config has no {key!r}")
        train = str(data["config"]["train_len"])
        for variant, per_len in data["results"].items():
            if not per_len.get(train, {}).get("all"):
                raise InputError(
                    f"lab summary: results[{variant!r}] has no loss at the training length {train}"
                )
        return cls(cast(Summary, data))

    @property
    def train_len(self) -> int:
        """The training length, tokens."""
        return int(self.data["config"]["train_len"])

    @property
    def eval_lens(self) -> list[int]:
        """The evaluation lengths, tokens, ascending (the first is the training length)."""
        return [int(n) for n in self.data["config"]["eval_lens"]]

    @property
    def past_lens(self) -> list[int]:
        """The evaluation lengths past the training length."""
        return [n for n in self.eval_lens if n != self.train_len]

    @property
    def unigram(self) -> float:
        """The corpus's unigram entropy, nats/char: the loss of a model that ignores context."""
        return float(self.data["unigram_entropy"])

    @property
    def variants(self) -> list[str]:
        """The variants with loss results, in the sweep's order."""
        return list(self.data["results"])

    def loss(self, variant: str, n: int, part: Part = "all") -> Stat | None:
        """The loss of ``variant`` at eval length ``n`` over ``part``; None where absent (past
        the training length, at the training length)."""
        at = self.data["results"][variant].get(str(n))
        return None if at is None else at[part]

    def mean_std(self, variant: str, n: int, part: Part) -> tuple[float, float]:
        """(mean, std) loss of ``variant`` at ``n`` over ``part``; std 0 for one seed.

        Raises:
            ValueError: the summary has no such loss.
        """
        e = self.loss(variant, n, part)
        if e is None:
            raise InputError(f"lab summary: no {part!r} loss for {variant!r} at {n}")
        return float(e["mean"]), float(e.get("std") or 0.0)

    def past_vs_within(self, variant: str) -> tuple[list[bool], list[float], float]:
        """Per length past training: is the loss past the training length above the loss
        within it, beyond seed noise? Returns (one verdict per length, past means, within).

        Noise is two standard deviations of the difference of single runs (seed spreads added
        in quadrature): stricter than the standard error of a mean over seeds.
        """
        within, w_std = self.mean_std(variant, self.train_len, "all")
        verdicts, past = [], []
        for n in self.past_lens:
            m, s = self.mean_std(variant, n, "past")
            past.append(m)
            verdicts.append(m - within > 2 * math.hypot(s, w_std))
        return verdicts, past, within

    def context_kept(self, variant: str, n: int) -> float:
        """The share of what context is worth within the training length that a model keeps
        past it, at eval length ``n``: (unigram - loss past) / (unigram - loss within). 1 keeps
        it all, 0 is a model that ignores context, below 0 is worse than ignoring it."""
        within, _ = self.mean_std(variant, self.train_len, "all")
        past, _ = self.mean_std(variant, n, "past")
        return (self.unigram - past) / (self.unigram - within)

    def rises_from(self, variant: str, factor: int) -> tuple[bool, str]:
        """Does ``variant`` lose more past the training length than within it, beyond seed
        noise (:meth:`past_vs_within`), at every length from ``factor`` x the training length
        on? Returns the answer and the lengths where it does, for a measured text."""
        rises, _, _ = self.past_vs_within(variant)
        lens = self.past_lens
        far = [r for r, n in zip(rises, lens, strict=True) if n >= factor * self.train_len]
        where = [str(n) for r, n in zip(rises, lens, strict=True) if r]
        return bool(far) and all(far), ", ".join(where) or "none"

    def accuracy(self, task: ProbeName, variant: str, n: int) -> Accuracy:
        """The accuracy of ``variant`` on probe ``task`` with the fact anywhere in an
        ``n``-token window: mean over seeds, its spread, and the pooled counts.

        Raises:
            ValueError: ``task`` is not a probe task, or the summary has no such task,
                variant or length.
        """
        results = self._probe(task)
        at = results["variants"].get(variant, {}).get(str(n))
        if at is None:
            raise InputError(f"lab summary: no {task!r} accuracy for {variant!r} at {n}")
        return at["anywhere"]

    def chance(self, task: ProbeName) -> float:
        """The chance accuracy of probe ``task`` (one over the answers a guess picks from)."""
        return float(self._probe(task)["chance"])

    def _probe(self, task: ProbeName) -> Retrieval | Probe:
        if task not in get_args(ProbeName):
            raise InputError(
                f"lab summary: {task!r} is not a probe task; one of {get_args(ProbeName)}"
            )
        results = self.data.get(task)
        if not results:
            raise InputError(f"lab summary: no {task!r} results; run `posemb lab` with that task")
        return results

    def conditions(self) -> str:
        """The run's conditions in one line, for a measured text."""
        cfg = self.data["config"]
        return (
            f"lab: {cfg['layers']}-layer char LM trained at {cfg['train_len']} tokens, "
            f"{len(cfg['seeds'])} seeds, lengths {cfg['eval_lens'][0]}-{cfg['eval_lens'][-1]}"
        )


__all__ = [
    "Accuracy",
    "CorpusInfo",
    "Entropy",
    "EntropyAt",
    "LabSummary",
    "LossAt",
    "Part",
    "Probe",
    "ProbeName",
    "Retrieval",
    "RetrievalAt",
    "Stat",
    "Summary",
]
