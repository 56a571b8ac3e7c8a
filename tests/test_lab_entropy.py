"""Attention entropy, and the inference-time scalings it is measured under."""

import dataclasses
import math

import pytest
import torch

from posemb import scaling as sc
from posemb.lab import entropy
from posemb.lab.model import ModelConfig, TinyLM, scaling_for


def test_entropy_of_uniform_rows_and_the_reference():
    w = torch.full((1, 1, 1, 8), 1 / 8)
    assert float(entropy.row_entropy(w)) == pytest.approx(math.log(8))
    assert float(entropy.row_entropy(torch.tensor([1.0, 0.0, 0.0]))) == 0.0
    assert entropy.uniform_entropy(3) == pytest.approx((0 + math.log(2) + math.log(3)) / 3)
    assert entropy.yarn_factor(1.0) == 1.0 and entropy.yarn_factor(math.e) == pytest.approx(1.1)


def test_yarn_factor_on_cos_and_sin_is_the_logit_scale_squared():
    torch.manual_seed(0)
    model = TinyLM(
        ModelConfig(vocab=12, encoding="rope", width=16, layers=2, heads=2, train_len=8, max_len=64)
    )
    x = torch.randint(0, 12, (2, 32))
    yarn = scaling_for("rope+yarn", 8, 32)
    assert isinstance(yarn, sc.Yarn) and yarn.effective_attention_factor() > 1
    model.set_scaling(yarn)
    own = model.attention_weights(x)
    model.set_scaling(dataclasses.replace(yarn, attention_factor=1.0))
    model.set_logit_scale(yarn.effective_attention_factor() ** 2)
    for a, b in zip(own, model.attention_weights(x), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_scalings_change_a_trained_models_numbers():
    # The lab swaps schedules on one model: each must be in force (a stale table once hid them).
    torch.manual_seed(0)
    model = TinyLM(
        ModelConfig(vocab=12, encoding="rope", width=16, layers=1, heads=2, train_len=8, max_len=64)
    )
    model.eval()
    x = torch.randint(0, 12, (1, 32))
    outs = {}
    for v in ("rope", "rope+pi", "rope+ntk", "rope+yarn", "rope+llama3"):
        model.set_scaling(None if v == "rope" else scaling_for(v, 8, 32))
        outs[v] = model(x)
    for a in outs:
        for b in outs:
            if a < b:
                assert not torch.allclose(outs[a], outs[b]), (a, b)
