"""The lab's trained variants: what each puts in each layer, and that each trains."""

import copy
import math
import pickle
import re

import pytest
import torch

import posemb
from posemb.lab import checkpoints, style
from posemb.lab.config import SUITES, LabConfig
from posemb.lab.model import VARIANTS, ModelConfig, TinyLM
from posemb.lab.tasks import PROBE_TASKS
from posemb.lab.variants import CLASSIC, RECENT, TRAINED, layer_plans
from posemb.temperature import Llama4AttnTemperature, ScalableSoftmax


def _model(encoding, layers=4, train_len=16):
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab=20, encoding=encoding, width=32, heads=4, layers=layers, train_len=train_len
    )
    return TinyLM(cfg)


def _attn(model):
    return [blk.attn for blk in model.blocks]


def test_each_recent_variant_puts_what_its_paper_says_in_each_layer():
    p = _attn(_model("p-rope"))
    assert all(isinstance(a.encoding.scaling, posemb.scaling.Proportional) for a in p)
    inv, _ = p[0].encoding.schedule(None)
    assert int((inv == 0).sum()) == 1  # head_dim 8: 4 pairs, the slowest quarter unrotated

    irope = _attn(_model("irope"))
    assert [a.kind for a in irope] == ["rotary"] * 3 + ["none"]
    assert irope[-1].query_temperature == Llama4AttnTemperature(floor_scale=16, attn_scale=0.1)
    assert all(a.query_temperature is None for a in irope[:3])

    swa = _attn(_model("rnope-swa"))
    assert [(a.kind, a.window) for a in swa] == [("rotary", 8)] * 3 + [("none", None)]

    fope = _attn(_model("fope"))
    assert all(isinstance(a.encoding, posemb.FourierRotaryEmbedding) for a in fope)
    assert fope[0].encoding.num_heads == 4 and fope[0].encoding.train_len == 16
    # 2 pi / 16 = 0.39: of 10000^(-2i/8) = 1, 0.1, 0.01, 0.001 only the first turns in training.
    assert fope[0].encoding.kept == 1

    cope = _attn(_model("cope"))
    assert all(isinstance(a.encoding, posemb.CoPE) and a.encoding.max_positions == 16 for a in cope)
    assert all(a.encoding.kind == "log" for a in _attn(_model("kerple")))
    assert all(a.sinks is not None and a.sinks.shape == (4,) for a in _attn(_model("rope+sinks")))
    ssmax = _attn(_model("rope+ssmax"))
    assert all(isinstance(a.query_temperature, ScalableSoftmax) for a in ssmax)
    assert ssmax[0].query_temperature is not ssmax[1].query_temperature  # s per layer


def test_the_classic_variants_build_the_models_they_built_before():
    """The layer plans must not change a classic model: same parameters, same draws."""
    for encoding in CLASSIC:
        plans = layer_plans(encoding, 4, 4, 64)
        assert all(not p.kwargs and p.window is None and not p.sinks for p in plans)
        assert all(p.temperature is None for p in plans)
    names = {n for n, _ in _model("t5").named_parameters()}
    assert "blocks.0.attn.encoding.weight" in names and not any("sinks" in n for n in names)


@pytest.mark.parametrize("encoding", RECENT)
def test_every_recent_variant_trains_copies_and_has_a_look(encoding):
    model = _model(encoding)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, 20, (2, 17))
    losses = []
    for _ in range(5):
        logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    model.eval()
    longer = torch.randint(0, 20, (1, 40))  # past the training length
    out = model(longer)
    for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        torch.testing.assert_close(other(longer), out)
    weights = model.attention_weights(longer)
    assert len(weights) == 4 and all(bool(torch.isfinite(w).all()) for w in weights)
    assert style.look(encoding).dashed is False


def test_hybrids_need_two_layers_and_unknown_variants_are_refused():
    with pytest.raises(ValueError, match="irope needs 2 or more layers"):
        layer_plans("irope", 1, 4, 64)
    with pytest.raises(ValueError, match="encoding must be one of"):
        layer_plans("rope+alibi", 4, 4, 64)


def test_suites_job_files_and_probe_tasks_agree():
    assert set(TRAINED) <= set(VARIANTS) and set(RECENT).isdisjoint(CLASSIC)
    for variants, tasks in SUITES.values():
        LabConfig(variants=variants, tasks=tasks)  # valid as they stand
    classic_v, classic_t = SUITES["classic"]
    assert (LabConfig().variants, LabConfig().tasks) == (classic_v, classic_t)
    assert set(SUITES["all"][0]) == set(VARIANTS)
    assert tuple(PROBE_TASKS) == checkpoints.PROBE_KINDS
    for kind in ("lm", *PROBE_TASKS):
        for variant in ("p-rope", "rnope-swa", "rope+ssmax"):
            ckpt, result = checkpoints.job_paths("out", variant, 3, kind)
            for path in (ckpt, result):
                assert checkpoints.is_lab_file(path[len("out/") :]), path
    assert not checkpoints.is_lab_file("runs/my-notes.json")
    with pytest.raises(ValueError, match="unknown job kind 'lesson'"):
        checkpoints.job_paths("out", "rope", 0, "lesson")


def test_set_scaling_none_gives_p_rope_back_its_own_schedule():
    """The entropy and scaling evaluations call set_scaling(None) between variants; for p-RoPE
    that must not leave plain RoPE behind (it did: p-RoPE measured as RoPE)."""
    model = _model("p-rope")
    own = model.rotary_modules()[0].scaling
    model.set_scaling(posemb.scaling.Linear(2.0))
    assert isinstance(model.rotary_modules()[0].scaling, posemb.scaling.Linear)
    model.set_scaling(None)
    assert all(r.scaling == own for r in model.rotary_modules())
    rope = _model("rope")
    rope.set_scaling(None)
    assert isinstance(rope.rotary_modules()[0].scaling, posemb.scaling.Default)


@pytest.mark.parametrize("encoding", ["irope", "rnope-swa", "rope+sinks", "rope+ssmax", "cope"])
def test_an_extension_is_refused_where_it_would_drop_part_of_the_attention(encoding):
    """extended_attention is plain RoPE attention: it asserted on a NoPE layer and silently
    dropped sinks and SSMax (outputs off by 0.5 and 0.06)."""
    model = _model(encoding)
    with pytest.raises(ValueError, match=re.escape(f"this model is '{encoding}'")):
        model.set_extension(posemb.SelfExtend(group=2, window=4))
    assert all(b.extension is None for b in model.blocks)  # nothing changed
    _model("rope").set_extension(posemb.SelfExtend(group=2, window=4))  # still fine


def test_task_sizes_that_cannot_fit_the_training_window_are_refused_by_setting():
    with pytest.raises(ValueError, match=r"--vartrack-chains 8 .* window of 32"):
        LabConfig(train_len=32, eval_lens=(32, 64), tasks=("lm", "vartrack"))
    with pytest.raises(ValueError, match=r"--multikey-needles 9 needs 36 positions"):
        LabConfig(train_len=32, eval_lens=(32, 64), tasks=("multikey",), multikey_needles=9)
    # A run without the task is not held to its sizes.
    LabConfig(train_len=32, eval_lens=(32, 64), tasks=("lm",), multikey_needles=9)
