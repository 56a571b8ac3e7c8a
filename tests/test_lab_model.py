"""The lab's model: its configuration's checks and the one block every lab model stacks."""

import dataclasses

import pytest
import torch

from posemb.lab import dog_bites_man as dbm
from posemb.lab.model import Block, ModelConfig, TinyLM

CFG = ModelConfig(vocab=11, encoding="rope", width=16, layers=2, heads=2, train_len=8, max_len=32)


@pytest.mark.parametrize(
    "change,match",
    [
        ({"vocab": 0}, "vocab must be a positive integer, got 0"),
        ({"width": -16}, "width must be a positive integer, got -16"),
        ({"layers": 0}, "layers must be a positive integer, got 0"),
        ({"heads": 1.0}, "heads must be a positive integer, got 1.0"),
        ({"train_len": 0}, "train_len must be a positive integer, got 0"),
        ({"max_len": True}, "max_len must be a positive integer, got True"),
        ({"encoding": "wavelet"}, "encoding must be one of learned, .* got 'wavelet'"),
        ({"encoding": "rope+pi"}, "encoding must be one of .* got 'rope\\+pi'"),
        ({"width": 18, "heads": 4}, "width 18 must split into 4 heads of even size"),
        ({"width": 12, "heads": 4}, "width 12 must split into 4 heads of even size"),
        ({"max_len": 4}, "max_len must be >= train_len 8 .* got 4"),
    ],
)
def test_model_config_errors(change, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(CFG, **change)


def test_lm_and_encoder_stack_the_same_block_causal_and_not():
    lm = TinyLM(CFG)
    enc = dbm.Encoder("rope")
    assert all(type(b) is Block for b in (*lm.blocks, *enc.blocks))
    assert all(b.attn.causal for b in lm.blocks)
    assert not any(b.attn.causal for b in enc.blocks)
    # The keys of the LM's checkpoints are those of the per-block dicts it had before (T5's
    # bias table is a parameter, so attention has keys too).
    t5 = TinyLM(dataclasses.replace(CFG, encoding="t5")).state_dict()
    names = {k.split(".")[2] for k in t5 if k.startswith("blocks.")}
    assert names == {"norm1", "qkv", "attn", "proj", "norm2", "mlp"}


def test_causal_block_ignores_later_tokens_and_the_bidirectional_one_does_not():
    torch.manual_seed(0)
    x = torch.randn(2, 6, 16)
    changed = x.clone()
    changed[:, 4:] = torch.randn(2, 2, 16)
    causal, both = Block(16, 2, "rope", causal=True), Block(16, 2, "rope", causal=False)
    assert torch.equal(causal(x)[:, :4], causal(changed)[:, :4])
    assert not torch.allclose(both(x)[:, :4], both(changed)[:, :4])
    assert causal(x).shape == (2, 6, 16)


def test_block_rejects_heads_that_do_not_split_the_width():
    with pytest.raises(ValueError, match="width 16 must split into 3 heads of even size"):
        Block(16, 3, "nope", causal=True)


def test_block_attention_weights_are_what_it_attends_with():
    torch.manual_seed(0)
    blk = Block(16, 2, "rope", causal=True).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    with torch.no_grad():
        w = blk.attention_weights(x)  # (batch, heads, seq, seq)
        q, k, v = blk._qkv(x)
        torch.testing.assert_close(w @ v, blk.attn(q, k, v))
    assert w.shape == (2, 2, 5, 5) and float(w[0, 0, 0, 1:].abs().max()) == 0
