"""LabConfig: every setting checked at the door, sequences kept as tuples."""

import dataclasses
import re

import pytest

from lab_configs import TINY
from posemb.lab import sweep
from posemb.lab.config import TASKS, LabConfig
from posemb.lab.tasks import PROBE_TASKS


@pytest.mark.parametrize(
    "change,match",
    [
        ({"variants": ()}, "--variants must name at least one variant"),
        ({"variants": "rope"}, "--variants must be a sequence, got 'rope'"),
        ({"variants": ("rope", "wavelet")}, "unknown variant.* wavelet; known: learned"),
        ({"variants": ("rope", "rope")}, r"--variants must not repeat a variant, got \['rope'"),
        ({"train_len": 0}, "--train-len must be a positive integer, got 0"),
        ({"steps": 0}, "--steps must be a positive integer, got 0"),
        ({"steps": 2.5}, "--steps must be a positive integer, got 2.5"),
        ({"steps": True}, "--steps must be a positive integer, got True"),
        ({"width": 0}, "LabConfig.width must be a positive integer, got 0"),
        ({"layers": 0}, "LabConfig.layers must be a positive integer, got 0"),
        ({"heads": 0}, "LabConfig.heads must be a positive integer, got 0"),
        ({"batch": -1}, "--batch must be a positive integer, got -1"),
        ({"eval_windows": 0}, "LabConfig.eval_windows must be a positive integer, got 0"),
        ({"checkpoint_every": 0}, "LabConfig.checkpoint_every must be a positive integer, got 0"),
        ({"workers": 0}, "--workers must be a positive integer, got 0"),
        ({"width": 30}, "width 30 must split into 2 heads of even size"),
        ({"width": 34}, "width 34 must split into 2 heads of even size"),
        ({"eval_lens": ()}, r"--eval-lens must be one or more integers in increasing order"),
        ({"eval_lens": (32, 16)}, r"increasing order, got \[32, 16\]"),
        ({"eval_lens": (16, 16, 32)}, r"increasing order, got \[16, 16, 32\]"),
        ({"eval_lens": (16, 32.0)}, r"increasing order, got \[16, 32.0\]"),
        ({"eval_lens": (8, 32)}, "--eval-lens must be >= --train-len 16"),
        ({"seeds": ()}, r"--seeds must be one or more non-negative integers, got \[\]"),
        ({"seeds": (-1,)}, r"non-negative integers, got \[-1\]"),
        ({"seeds": (0, 0.5)}, r"non-negative integers, got \[0, 0.5\]"),
        ({"seeds": (0, 1, 0)}, r"--seeds must not repeat a seed, got \[0, 1, 0\]"),
        ({"lr": -1}, "LabConfig.lr must be a finite number > 0, got -1"),
        ({"lr": 0.0}, "LabConfig.lr must be a finite number > 0, got 0.0"),
        ({"lr": float("nan")}, "LabConfig.lr must be a finite number > 0, got nan"),
        ({"lr": float("inf")}, "LabConfig.lr must be a finite number > 0, got inf"),
        ({"lr": True}, "LabConfig.lr must be a finite number > 0, got True"),
        ({"lr": "1e-3"}, "LabConfig.lr must be a finite number > 0, got '1e-3'"),
        ({"corpus": ""}, "--corpus must be 'kjv' or a path to a UTF-8 text file, got ''"),
        ({"corpus": None}, "--corpus must be 'kjv' or a path .* got None"),
        ({"finetune_steps": -1}, "--finetune-steps must be an integer >= 0, got -1"),
        ({"finetune_steps": 5, "finetune_len": 16}, "--finetune-len must exceed --train-len 16"),
        ({"finetune_steps": 5}, "--finetune-len must exceed --train-len 16.* got None"),
        ({"finetune_steps": 5, "finetune_len": 32.0}, "--finetune-len must be an integer or"),
        ({"finetune_len": 32}, "--finetune-len 32 needs --finetune-steps > 0"),
    ],
)
def test_config_errors(change, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(TINY, **change)


def test_errors_name_flags_posemb_lab_has_and_retrieval_facts_only_bind_its_tasks():
    # Was refused naming --retrieval-facts, a flag posemb lab does not have, for a run that
    # trains no retrieval model.
    cfg = dataclasses.replace(TINY, train_len=4, eval_lens=(4, 8), tasks=("lm",))
    assert cfg.train_len == 4
    with pytest.raises(
        ValueError, match=r"--train-len 4 is too short .* LabConfig.retrieval_facts"
    ):
        dataclasses.replace(cfg, tasks=("lm", "retrieval"))
    from posemb.cli import build_parser

    flags = {a for act in build_parser()._subparsers._group_actions[0].choices["lab"]._actions
             for a in act.option_strings}  # fmt: skip
    for change in ({"width": 0}, {"lr": 0.0}, {"retrieval_facts": 99}, {"train_len": 0}):
        with pytest.raises(ValueError) as err:
            dataclasses.replace(TINY, **change)
        named = re.findall(r"--[a-z-]+", str(err.value))
        assert set(named) <= flags, f"{err.value} names a flag posemb lab does not have"


def test_config_sequences_become_tuples_and_defaults_are_valid():
    cfg = dataclasses.replace(TINY, eval_lens=[16, 64], seeds=[2, 1], variants=["rope"])
    assert cfg.eval_lens == (16, 64) and cfg.seeds == (2, 1) and cfg.variants == ("rope",)
    assert cfg == dataclasses.replace(TINY, eval_lens=(16, 64), seeds=(2, 1), variants=("rope",))
    sweep.LabConfig()  # the default protocol and the quick one construct
    sweep.quick_config()


def test_every_protocol_setting_is_in_some_jobs_digest():
    # sweep.preflight lets a folder written before a setting existed resume while that setting
    # keeps its default, relying on each job's digest to refuse what the setting changes: that
    # holds only if every protocol setting reaches some job's key.
    cfg = LabConfig(tasks=TASKS)
    keys: set[str] = set()
    for kind in ("lm", *PROBE_TASKS, "race"):
        keys |= set(cfg.job_key("rope", 0, kind, 0 if kind == "race" else None))
    keys |= {"corpus_sha256"}  # the job keys hold the same content id as "corpus"
    changes_no_number = {"checkpoint_every"}  # how often a checkpoint is written
    assert set(cfg.protocol()) - keys == changes_no_number


def test_a_flipflop_length_that_is_odd_is_refused_naming_its_flag():
    with pytest.raises(ValueError, match=r"--eval-lens 99 for the flipflop task: .*even length"):
        LabConfig(eval_lens=(64, 99), tasks=("lm", "flipflop"))
    with pytest.raises(ValueError, match=r"--train-len 63 for the flipflop task"):
        LabConfig(train_len=63, eval_lens=(64, 128), tasks=("flipflop",))
