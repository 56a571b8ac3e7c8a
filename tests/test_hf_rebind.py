"""posemb.hf.rebind: a patched attention's forward reads its modeling module's globals live, so a
tool that wraps one of them later (attention capture, attention editing) is followed by every
patched model, whatever the order of patches in the process."""

import copy
import inspect

import pytest
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.models.llama import modeling_llama
from transformers.models.qwen3 import modeling_qwen3

import posemb
from posemb import hf
from posemb.hf import rebind
from tolerances import TOL

transformers.logging.set_verbosity_error()

SIZES = dict(
    vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, attn_implementation="eager",
)  # fmt: skip


def _llama():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**SIZES)).eval()


def _qwen3():
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(head_dim=32, **SIZES)).eval()
    with torch.no_grad():
        for m in model.modules():
            for n in ("q_norm", "k_norm"):
                if hasattr(m, n):
                    getattr(m, n).weight.normal_(0.5, 0.3)
    return model


def _editing_wrap(module, monkeypatch):
    """Wrap the module's eager attention as an attention-editing tool does; the calls made."""
    calls = []
    real = module.eager_attention_forward

    def edited(*args, **kwargs):
        calls.append(1)
        out, weights = real(*args, **kwargs)
        return out * 0.5, weights

    monkeypatch.setattr(module, "eager_attention_forward", edited)
    return calls


@pytest.mark.parametrize(
    ("make", "module"), [(_llama, modeling_llama), (_qwen3, modeling_qwen3)], ids=["llama", "qwen3"]
)
def test_a_wrap_made_after_the_first_patch_is_followed_by_every_fused_model(
    make, module, monkeypatch
):
    first = make()
    hf.patch_rotary(first, fused=True)  # the process's first patch of the family
    eager = make()
    later = copy.deepcopy(eager)
    calls = _editing_wrap(module, monkeypatch)
    hf.patch_rotary(later, fused=True)
    ids = torch.randint(0, 97, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = eager(ids).logits
        assert len(calls) == 2  # the unpatched model follows the wrap, one call per layer
        for model in (first, later):
            calls.clear()
            torch.testing.assert_close(model(ids).logits, want, **TOL[torch.float32])
            assert len(calls) == 2


def test_an_extended_forward_reads_the_modules_own_globals(monkeypatch):
    eager = _llama()
    extended = copy.deepcopy(eager)
    hf.patch_extension(extended, posemb.SelfExtend(group=2, window=64))  # inside the window
    forward = extended.model.layers[0].self_attn.forward
    inner = inspect.unwrap(forward.__func__)
    assert inner.__globals__ is vars(modeling_llama)  # live, not a copy
    calls = []
    real = modeling_llama.apply_rotary_pos_emb

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", counted)
    ids = torch.randint(0, 97, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got = extended(ids).logits
        assert not calls  # the two names posemb replaces stay posemb's
        torch.testing.assert_close(got, eager(ids).logits, **TOL[torch.float32])
    assert {"_posemb_unrotated", "_posemb_extended_interface"} <= set(
        rebind.installed(modeling_llama)
    )


def test_only_global_reads_are_renamed():
    def uses_an_attribute(x):
        return x.apply_rotary_pos_emb

    with pytest.raises(ValueError, match="other than as a global"):
        rebind.rebuilt(uses_an_attribute, {"apply_rotary_pos_emb": "_posemb_x"})

    def reads_a_global(x):
        return apply_rotary_pos_emb(x)  # noqa: F821 (resolved in the rebuilt function's globals)

    got = rebind.rebuilt(reads_a_global, {"apply_rotary_pos_emb": "_posemb_test_double"})
    globals()["_posemb_test_double"] = lambda x: 2 * x
    try:
        assert got(3) == 6
        assert got.__globals__ is globals()  # live: the function's own module
    finally:
        del globals()["_posemb_test_double"]
    with pytest.raises(ValueError, match="_posemb_"):
        rebind.install(__name__, "not_prefixed", 1)
