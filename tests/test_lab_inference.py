"""The lab's inference-time variants: each extension sized so that no pair at any evaluation
length meets a distance training did not show, set and unset on a trained model."""

from __future__ import annotations

import pytest
import torch

import posemb
from posemb import InputError
from posemb.lab import inference
from posemb.lab.model import EXTENSIONS, SCALINGS, ModelConfig, TinyLM

LENGTHS = (64, 128, 256, 512, 1024, 4096)


@pytest.mark.parametrize("variant", EXTENSIONS)
@pytest.mark.parametrize("train_len", [32, 64, 512])
def test_every_distance_stays_inside_training_at_every_length(variant, train_len):
    for n in (train_len, *(m for m in LENGTHS if m > train_len)):
        method = inference.extension_for(variant, train_len, n)
        pos = torch.arange(n)
        d = method.relative_positions(pos, pos)
        causal = pos[:, None] >= pos[None, :]
        assert float(d[causal].min()) >= 0 and float(d[causal].max()) <= train_len - 1, (n, method)


def test_selfextend_takes_the_smallest_group_that_fits():
    for n in (128, 512, 1024):
        g = inference.selfextend_group(64, 16, n)
        assert (n - 1) // g + 16 - 16 // g <= 63
        assert g == 1 or (n - 1) // (g - 1) + 16 - 16 // (g - 1) > 63
    assert inference.selfextend_group(64, 16, 64) == 1  # nothing to extend at 1x


def _model(encoding: str = "rope") -> TinyLM:
    torch.manual_seed(0)
    return TinyLM(ModelConfig(vocab=20, encoding=encoding, width=32, layers=2, heads=2)).eval()


def test_use_sets_one_variant_and_none_gives_the_model_back():
    model, x = _model(), torch.randint(0, 20, (2, 96))
    with torch.no_grad():
        plain = model(x)
        for variant in (*EXTENSIONS, *SCALINGS):
            inference.use(model, variant, 64, 96)
            assert not torch.equal(model(x), plain), variant
            inference.use(model, None, 64, 96)
            assert torch.equal(model(x), plain), variant
        # An extension after a scaling drops the scaling (one variant at a time).
        inference.use(model, "rope+pi", 64, 96)
        inference.use(model, "rope+rerope", 64, 96)
        own = [r.scaling for r in _model().rotary_modules()]
        assert [r.scaling for r in model.rotary_modules()] == own


def test_an_extension_within_its_window_is_the_plain_model():
    model, x = _model(), torch.randint(0, 20, (2, 40))
    with torch.no_grad():
        plain = model(x)
        model.set_extension(posemb.SelfExtend(group=4, window=64))
        torch.testing.assert_close(model(x), plain, rtol=1e-5, atol=1e-5)


def test_misuse_is_refused_by_name():
    with pytest.raises(InputError, match="this model is 'alibi'"):
        _model("alibi").set_extension(posemb.ReRoPE(8))
    with pytest.raises(InputError, match="unknown inference variant 'rope\\+nope'"):
        inference.use(_model(), "rope+nope", 64, 128)
    with pytest.raises(InputError, match="unknown extension variant"):
        inference.extension_for("rope+pi", 64, 128)
    model = _model()
    model.set_extension(posemb.ReRoPE(8))
    with pytest.raises(InputError, match="not formed under an extension"):
        model.attention_weights(torch.randint(0, 20, (1, 16)))
