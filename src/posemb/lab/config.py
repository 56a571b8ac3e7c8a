"""The lab's settings: :class:`LabConfig` (what a sweep trains and measures, validated; its
protocol and the digest that ties checkpoints and results to it) and the presets
(:func:`quick_config`, :func:`gpu_config`). Running them is :mod:`posemb.lab.sweep`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import _checks
from .._errors import InputError
from .._version import __version__
from . import corpus as _corpus
from . import distributed as _dp
from . import multikey as _multikey
from . import race as _race
from . import retrieval as _retrieval
from . import vartrack as _vartrack
from .model import EXTENSIONS, SCALINGS, VARIANTS, check_heads
from .tasks import PROBE_TASKS
from .variants import CLASSIC, RECENT

INFERENCE = SCALINGS + EXTENSIONS
TASKS = ("lm", "retrieval", "entropy", "race", "multikey", "vartrack", "flipflop")
# Two suites: the encodings of 2017-2023 on the lab's first tasks (the default, within the
# 20-minute budget on the 2-core machine; docs/lab's first findings), and those of 2024-26
# beside RoPE and NoPE on the long-context tasks (longer: docs/lab.md says how long and why);
# "all" runs both in one folder.
SUITES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "classic": (CLASSIC + INFERENCE, ("lm", "retrieval", "entropy", "race")),
    "recent": (
        ("rope", "nope", *RECENT),
        ("lm", "retrieval", "multikey", "vartrack", "flipflop", "entropy"),
    ),
    "all": (VARIANTS, TASKS),
}
DEFAULT_VARIANTS, DEFAULT_TASKS = SUITES["classic"]
EVAL_SEED = 1234  # the held-out windows are the same for every variant and seed
WEIGHT_DECAY = 0.01
FINETUNE_LR_FRACTION = 0.5  # of --lr, constant: a short fine-tune of a trained model

_POSITIVE = (
    "train_len",
    "steps",
    "width",
    "layers",
    "heads",
    "batch",
    "eval_windows",
    "retrieval_steps",
    "retrieval_width",
    "retrieval_layers",
    "retrieval_batch",
    "retrieval_probes",
    "entropy_windows",
    "multikey_needles",
    "multikey_steps",
    "vartrack_hops",
    "vartrack_chains",
    "vartrack_steps",
    "flipflop_steps",
)
# Settings that change no job's numbers, or that say which jobs run rather than what they do.
# device and data_parallel change numbers by float rounding only, as the thread count does
# (other kernels, other summation orders; tests/test_lab_distributed.py bounds it): hashing them
# would refuse to resume a CPU checkpoint on a GPU or under torchrun. Each LM result records both.
_NOT_PROTOCOL = (
    "variants",
    "seeds",
    "tasks",
    "workers",
    "race_seeds",
    "race_entrants",
    "device",
    "data_parallel",
)
# What a trained model depends on (with the corpus's content and the longest length), and
# what only its evaluation reads: LabConfig.job_key keeps them apart.
_LM_TRAIN_KEYS = ("train_len", "steps", "width", "layers", "heads", "batch", "lr")
_LM_EVAL_KEYS = ("eval_lens", "eval_windows", "entropy_windows", "finetune_len", "finetune_steps")
# What every probe task's model depends on (PROBE_TASKS adds its own sizes and steps).
_PROBE_TRAIN_KEYS = (
    "train_len",
    "heads",
    "retrieval_width",
    "retrieval_layers",
    "retrieval_batch",
    "retrieval_lr",
)
_RETRIEVAL_EVAL_KEYS = ("eval_lens", "retrieval_probes")
_RACE_KEYS = ("eval_lens", "eval_windows", "retrieval_probes", "race_len", "race_steps")
# The flags posemb lab has; other settings are named as LabConfig fields in errors.
_CLI_FLAGS = frozenset(
    (
        "variants",
        "train_len",
        "eval_lens",
        "steps",
        "seeds",
        "corpus",
        "workers",
        "finetune_len",
        "finetune_steps",
        "tasks",
        "retrieval_steps",
        "multikey_steps",
        "multikey_needles",
        "vartrack_steps",
        "vartrack_hops",
        "vartrack_chains",
        "flipflop_steps",
        "race_len",
        "race_steps",
        "race_seeds",
        "batch",
        "device",
        "data_parallel",
    )
)


def _json_ready(d: dict[str, object]) -> dict[str, object]:
    # As a result file holds it (lists, not tuples), so that a key read back compares equal.
    return json.loads(json.dumps(d))


def _flag(name: str) -> str:
    """How an error names a setting: its ``posemb lab`` flag, or the field where none exists."""
    if name in _CLI_FLAGS:
        return "--" + name.replace("_", "-")
    return f"LabConfig.{name}"


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class LabConfig:
    """Everything that determines the numbers (hashed into checkpoints and results), and how
    the jobs run (``workers``, ``device``, ``data_parallel``: not hashed, see ``_NOT_PROTOCOL``).

    Validated at construction: a bad value raises ``ValueError`` naming the setting (as its
    ``posemb lab`` flag), the value and what is allowed. Sequences are stored as tuples.
    """

    variants: tuple[str, ...] = DEFAULT_VARIANTS
    train_len: int = 64
    eval_lens: tuple[int, ...] = (64, 128, 256, 512, 1024)
    steps: int = 500
    seeds: tuple[int, ...] = (0,)
    corpus: str = _corpus.DEFAULT
    width: int = 128
    layers: int = 4
    heads: int = 4
    batch: int = 16  # x 64 tokens; 32 took the default protocol past 15 minutes
    lr: float = 2e-3
    eval_windows: int = 16
    checkpoint_every: int = 100
    finetune_len: int | None = None
    finetune_steps: int = 0
    tasks: tuple[str, ...] = DEFAULT_TASKS
    retrieval_steps: int = 600
    retrieval_width: int = 64
    retrieval_layers: int = 2
    retrieval_batch: int = 32
    retrieval_lr: float = 3e-3
    retrieval_facts: int = 4
    retrieval_probes: int = 64
    entropy_windows: int = 4
    multikey_needles: int = _multikey.NEEDLES
    multikey_steps: int = 800  # learned at ~400-700 steps (width 64, 8 needles, 3 seeds)
    vartrack_hops: int = _vartrack.HOPS
    vartrack_chains: int = _vartrack.CHAINS
    vartrack_steps: int = 2000  # learned at ~1,250-1,500 (width 64, 8 chains, 2 seeds)
    # Every variant but NoPE ends below 0.007 nats at 64 tokens (2 seeds; NoPE 0.24-0.35).
    flipflop_steps: int = 600
    race_len: int = 256
    race_steps: tuple[int, ...] = (0, 25, 50, 100, 200)
    race_seeds: tuple[int, ...] = (0, 1)
    race_entrants: tuple[str, ...] = _race.ENTRANTS
    workers: int = field(default=2, compare=False)
    device: str = field(default="cpu", compare=False)
    data_parallel: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        # In this order, so that the first refusal is the same whatever else is wrong.
        self._check_names()
        self._check_training()
        self._check_tasks()
        self._check_run()

    def _check_names(self) -> None:
        """Sequences, variants, tasks and race entrants: known names, once each."""
        for name in (
            "variants",
            "eval_lens",
            "seeds",
            "tasks",
            "race_steps",
            "race_seeds",
            "race_entrants",
        ):
            value = getattr(self, name)
            if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
                raise InputError(f"{_flag(name)} must be a sequence, got {value!r}")
            object.__setattr__(self, name, tuple(value))
        if not self.variants:
            raise InputError("--variants must name at least one variant")
        unknown = [str(v) for v in self.variants if v not in VARIANTS]
        if unknown:
            raise InputError(
                f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}"
            )
        if len(set(self.variants)) != len(self.variants):
            raise InputError(f"--variants must not repeat a variant, got {list(self.variants)}")
        for name, known in (("tasks", TASKS), ("race_entrants", _race.ENTRANTS)):
            value = getattr(self, name)
            bad = [str(v) for v in value if v not in known]
            if not value or bad or len(set(value)) != len(value):
                raise InputError(
                    f"{_flag(name)} must name one or more of {', '.join(known)} once each, got "
                    f"{list(value)}"
                )

    def _check_training(self) -> None:
        """Sizes, lengths, seeds and learning rates of the language-model jobs."""
        for name in (*_POSITIVE, "checkpoint_every", "workers"):
            _checks.positive_int(_flag(name), getattr(self, name))
        check_heads(self.width, self.heads)
        lens = self.eval_lens
        if not lens or not all(_is_int(n) for n in lens) or list(lens) != sorted(set(lens)):
            raise InputError(
                f"--eval-lens must be one or more integers in increasing order, got {list(lens)}"
            )
        if lens[0] < self.train_len:
            raise InputError(
                f"--eval-lens must be >= --train-len {self.train_len} (the lab measures "
                f"lengths past training), got {list(lens)}"
            )
        seeds = self.seeds
        if not seeds or not all(_is_int(s) and s >= 0 for s in seeds):
            raise InputError(
                f"--seeds must be one or more non-negative integers, got {list(seeds)}"
            )
        if len(set(seeds)) != len(seeds):
            raise InputError(f"--seeds must not repeat a seed, got {list(seeds)}")
        _checks.number(_flag("lr"), self.lr, minimum=0.0, strict=True)
        _checks.number(_flag("retrieval_lr"), self.retrieval_lr, minimum=0.0, strict=True)

    def _check_tasks(self) -> None:
        """The retrieval and race tasks' settings."""
        check_heads(self.retrieval_width, self.heads)
        lens = self.eval_lens
        facts = self.retrieval_facts
        if not _is_int(facts) or not 1 <= facts <= _retrieval.KEYS:
            raise InputError(
                f"{_flag('retrieval_facts')} must be an integer in 1..{_retrieval.KEYS}, got "
                f"{facts!r}"
            )
        # Only the tasks that train a retrieval model place facts in a training window.
        if {"retrieval", "race"} & set(self.tasks) and 2 * facts > self.train_len:
            raise InputError(
                f"--train-len {self.train_len} is too short for the retrieval task's "
                f"{facts} facts (two positions each, {_flag('retrieval_facts')}): use "
                f"--train-len {2 * facts} or more, or --tasks without retrieval and race"
            )
        for name, task in PROBE_TASKS.items():
            if name != "retrieval" and name in self.tasks:
                for n in (self.train_len, *lens):  # flipflop windows must be even
                    try:
                        task.module.check_sizes(*task.sizes(self), n)
                    except InputError as err:
                        flag = "--train-len" if n == self.train_len else "--eval-lens"
                        raise InputError(f"{flag} {n} for the {name} task: {err}") from None
        if "race" in self.tasks:
            race_len = self.race_len
            if not _is_int(race_len) or not self.train_len < race_len <= lens[-1]:
                raise InputError(
                    f"--race-len must be an integer above --train-len {self.train_len} and at "
                    f"most the longest --eval-lens {lens[-1]}, got {race_len!r}"
                )
            steps = self.race_steps
            if not all(_is_int(n) and n >= 0 for n in steps) or list(steps) != sorted(set(steps)):
                raise InputError(
                    f"--race-steps must be one or more integers >= 0 in increasing order, got "
                    f"{list(steps)}"
                )
            rs = self.race_seeds
            if not rs or not all(_is_int(r) and r >= 0 for r in rs) or len(set(rs)) != len(rs):
                raise InputError(
                    f"--race-seeds must be one or more distinct non-negative integers, got "
                    f"{list(rs)}"
                )

    def _check_run(self) -> None:
        """The corpus, fine-tuning, device and data parallelism."""
        if not isinstance(self.corpus, str) or not self.corpus:
            raise InputError(
                f"--corpus must be {_corpus.DEFAULT!r} or a path to a UTF-8 text file, got "
                f"{self.corpus!r}"
            )
        ft_steps, ft_len = self.finetune_steps, self.finetune_len
        if not _is_int(ft_steps) or ft_steps < 0:
            raise InputError(f"--finetune-steps must be an integer >= 0, got {ft_steps!r}")
        if ft_len is not None and not _is_int(ft_len):
            raise InputError(f"--finetune-len must be an integer or None, got {ft_len!r}")
        if ft_steps and (ft_len or 0) <= self.train_len:
            raise InputError(
                f"--finetune-len must exceed --train-len {self.train_len} (fine-tuning extends "
                f"the context), got {ft_len}"
            )
        if ft_len is not None and not ft_steps:
            raise InputError(
                f"--finetune-len {ft_len} needs --finetune-steps > 0 (it would be ignored)"
            )
        if self.device not in _dp.DEVICES:  # whether CUDA is there is checked when run
            raise InputError(
                f"--device must be one of {', '.join(_dp.DEVICES)}, got {self.device!r}"
            )
        if not isinstance(self.data_parallel, bool):
            raise InputError(f"--data-parallel must be True or False, got {self.data_parallel!r}")

    def job_key(
        self,
        encoding: str,
        seed: int,
        kind: str = "lm",
        race_seed: int | None = None,
        *,
        stage: str = "result",
    ) -> dict[str, object]:
        """What one job's numbers depend on, and nothing else.

        ``stage="train"`` is what its checkpoint depends on: the training settings, the
        corpus's content (:func:`posemb.lab.corpus.content_id`, never its path) and the
        longest evaluation length (a learned table's size, a randomised position's range).
        ``stage="result"`` adds what only its evaluation reads (the lengths, windows, the
        scalings and tasks asked for), so that adding a variant or a task re-evaluates a
        finished model instead of training it again. A race job has one key for both.
        """
        kinds = ("lm", *PROBE_TASKS, "race")
        if kind not in kinds:
            raise InputError(f"unknown job kind {kind!r}; known: {', '.join(kinds)}")
        if stage not in ("train", "result"):
            raise InputError(f"unknown stage {stage!r}; known: train, result")
        d = asdict(self)
        base = {"kind": kind, "encoding": encoding, "seed": seed, "posemb": __version__}
        base |= {"max_len": max(self.eval_lens)}
        lm_train = base | {k: d[k] for k in _LM_TRAIN_KEYS}
        lm_train["corpus"] = _corpus.content_id(self.corpus)
        probe = PROBE_TASKS["retrieval" if kind in ("lm", "race") else kind]
        probe_keys = (*_PROBE_TRAIN_KEYS, *probe.size_fields, probe.steps_field)
        ret_train = base | {k: d[k] for k in probe_keys}
        # The rope jobs also evaluate the scalings and extensions asked for: another set is
        # another result.
        scalings = sorted(v for v in self.variants if v in INFERENCE) if encoding == "rope" else []
        if kind == "race":
            rope = {k: v for k, v in lm_train.items() if k not in ("kind", "encoding")}
            key = rope | ret_train | {k: d[k] for k in _RACE_KEYS} | {"race_seed": race_seed}
            return _json_ready(key)
        if kind == "lm":
            evaluation = {k: d[k] for k in _LM_EVAL_KEYS} | {"scalings": scalings}
            if encoding != "rope":  # only the rope model is fine-tuned with PI
                evaluation = {k: v for k, v in evaluation.items() if not k.startswith("finetune")}
            evaluation["entropy"] = "entropy" in self.tasks
            train = lm_train
        else:
            evaluation = {k: d[k] for k in _RETRIEVAL_EVAL_KEYS} | {"scalings": scalings}
            train = ret_train
        return _json_ready(train if stage == "train" else train | evaluation)

    def digest(
        self,
        encoding: str,
        seed: int,
        kind: str = "lm",
        race_seed: int | None = None,
        *,
        stage: str = "result",
    ) -> str:
        """A hash of :meth:`job_key`: 16 hex digits a checkpoint (``stage="train"``) or a
        result (``stage="result"``) carries."""
        key = self.job_key(encoding, seed, kind, race_seed, stage=stage)
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]

    def protocol(self) -> dict[str, object]:
        """The settings an ``--out`` folder's results depend on (written to protocol.json)."""
        d = {k: v for k, v in asdict(self).items() if k not in _NOT_PROTOCOL}
        # The corpus is its content, not where it was read from (results.json keeps the path).
        del d["corpus"]
        d["corpus_sha256"] = _corpus.content_id(self.corpus)
        return json.loads(json.dumps(d | {"posemb": __version__}))

    def ids(self, name: str, seed: int, kind: str = "lm", race_seed: int | None = None) -> JobIds:
        """The :class:`JobIds` of one job."""
        return JobIds.of(self, name, seed, kind, race_seed)

    def check_corpus(self, data: _corpus.Corpus) -> None:
        """Refuse a corpus too short for the windows the sweep draws from its training part
        (training, fine-tuning, the race), before any model trains."""
        needs = [("--train-len", self.train_len)]
        if self.finetune_steps and self.finetune_len:
            needs.append(("--finetune-len", self.finetune_len))
        if "race" in self.tasks:
            needs.append(("--race-len", self.race_len))
        for flag, length in needs:
            if len(data.train) < length + 2:  # a window is length + 1 characters, at any offset
                raise InputError(
                    f"corpus {data.name!r} has {len(data.train):,} training characters: too few "
                    f"for {flag} {length} windows (needs {length + 2:,})"
                )

    def race_eval_lens(self) -> tuple[int, ...]:
        """Where the race scores: the race length and twice it (when evaluated at all)."""
        return tuple(n for n in (self.race_len, 2 * self.race_len) if n <= self.eval_lens[-1])


@dataclass(frozen=True)
class JobIds:
    """A job's identities (:meth:`LabConfig.ids`): what its result and its checkpoint depend on
    (:meth:`LabConfig.job_key`), and their digests."""

    key: dict
    digest: str
    train_key: dict
    train_digest: str

    @classmethod
    def of(
        cls, cfg: LabConfig, name: str, seed: int, kind: str, race_seed: int | None = None
    ) -> JobIds:
        args = (name, seed, kind, race_seed)
        return cls(
            key=cfg.job_key(*args),
            digest=cfg.digest(*args),
            train_key=cfg.job_key(*args, stage="train"),
            train_digest=cfg.digest(*args, stage="train"),
        )

    def stamp(self) -> dict[str, object]:
        """What a result records of them."""
        return {"digest": self.digest, "train_digest": self.train_digest, "settings": self.key}


def quick_config(**overrides: Any) -> LabConfig:
    """A small protocol that runs in well under a minute: proves the lab works, and still shows
    sinusoidal collapsing past its training length while ALiBi does not."""
    base = LabConfig(
        variants=("sinusoidal", "alibi", "rope", "rope+pi"),
        train_len=32,
        eval_lens=(32, 64, 128),
        steps=300,
        width=64,
        layers=2,
        heads=4,
        batch=16,
        lr=3e-3,
        eval_windows=8,
        checkpoint_every=50,
        retrieval_steps=400,
        retrieval_width=32,
        retrieval_lr=1e-2,
        retrieval_probes=32,
        entropy_windows=2,
        race_len=64,
        race_steps=(0, 20, 40),
        race_entrants=("rope", "rope+pi", "rope+yarn"),
        # Every task of the suites sized to the 32-token window (vartrack's default 8 chains
        # need 56 positions; multikey's 8 needles fill it exactly), and a few hundred steps
        # each: --tasks may name any of them with --quick.
        multikey_needles=4,
        multikey_steps=200,
        vartrack_chains=4,
        vartrack_steps=200,
        flipflop_steps=200,
    )
    return dataclasses.replace(base, **overrides)


def gpu_config(**overrides: Any) -> LabConfig:
    """``--preset gpu``: closer to the ALiBi paper's setting (Press et al. 2022 train at 512
    tokens and compare sinusoidal, rotary, T5 bias and ALiBi on longer inputs), for one GPU.

    Train at 512 characters, evaluate at 512-8192 (1x-16x); 8 layers, width 512, 8 heads
    (25.2M parameters outside the 63-character embedding and output layers); 2,000 steps of
    32 windows (16,384 tokens a step, 32.8M tokens: ~8 passes over the 3.9M training
    characters of the KJV, so watch the held-out loss); on CUDA. The learning rate, 1e-3, is
    a guess for this width, not tuned. ``rope+yarn`` costs only evaluation. Tasks: loss and
    attention entropy; retrieval and the race are the CPU protocol's (their small models and
    the race's fine-tuning run on the CPU whatever ``--device`` says).

    Expected run time: about 15-20 minutes on one H200. This is an ESTIMATE from FLOPs, not a
    measurement (it was written on a CPU-only machine):

    - per step, 6 N T = 6 x 25.2e6 x 16,384 = 2.48e12 FLOPs for the weights (forward 2,
      backward 4 per parameter and token), plus attention 3 x 4 B L^2 d x layers =
      3 x 4 x 32 x 512^2 x 512 x 8 = 0.41e12 (scores and weighted sum, forward and backward,
      the causal half not subtracted), plus 0.003e12 for the output layer: ~2.9e12;
    - 2,000 steps: 5.8e15 FLOPs per trained model, 4 models (sinusoidal, rope, t5, alibi):
      2.3e16;
    - assumed sustained throughput 20-25e12 FLOP/s: torch computes float32 matmuls without
      TF32 by default, and an H200's float32 peak is ~67e12 FLOP/s; small matmuls, layer
      norms, GELU and AdamW take a share of that: 3.9-4.8 minutes per model, 15-19 minutes for
      four; evaluation (16 windows at each length, 3 variants on the rope model) adds ~3e13
      FLOPs per pass, seconds.

    The same arithmetic for the default model (4 layers, width 128) at 32 windows of 128
    tokens gives 2.2e10 FLOPs a step, and the project's 2-core CPU measures 440-520 ms a step
    there (~47e9 FLOP/s), so the FLOP count is of the right size; the GPU's sustained fraction
    is the uncertain part. ``--data-parallel`` over N GPUs divides the training time by up to
    N (``--batch`` must be a multiple of N).
    """
    base = LabConfig(
        variants=("sinusoidal", "rope", "t5", "alibi", "rope+yarn"),
        train_len=512,
        eval_lens=(512, 1024, 2048, 4096, 8192),
        steps=2000,
        width=512,
        layers=8,
        heads=8,
        batch=32,
        lr=1e-3,
        eval_windows=16,
        checkpoint_every=250,
        workers=1,
        device="cuda",
        tasks=("lm", "entropy"),
    )
    return dataclasses.replace(base, **overrides)


__all__ = [
    "DEFAULT_VARIANTS",
    "EVAL_SEED",
    "FINETUNE_LR_FRACTION",
    "TASKS",
    "WEIGHT_DECAY",
    "JobIds",
    "LabConfig",
    "gpu_config",
    "quick_config",
]
