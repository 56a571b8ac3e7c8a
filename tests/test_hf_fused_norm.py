"""patch_rotary(fused=True) fuses Qwen3's, Qwen3-MoE's and Gemma 3's q_norm and k_norm into the
rotation (kernels.norm_rotate): the norms uncalled, logits, gradients and generate equal to the
eager model's; OLMo 2's all-heads norm and Llama's absent one left as they were."""

import copy
import logging
import pickle

import pytest
import torch
import transformers
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    Olmo2Config,
    Olmo2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from posemb import hf
from tolerances import TOL

transformers.logging.set_verbosity_error()

SIZES = dict(
    vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, attn_implementation="eager",
)  # fmt: skip
FAMILIES = {
    "qwen3": (Qwen3ForCausalLM, lambda: Qwen3Config(head_dim=32, **SIZES)),
    "qwen3_moe": (
        Qwen3MoeForCausalLM,
        lambda: Qwen3MoeConfig(
            head_dim=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, **SIZES
        ),
    ),
    "gemma3": (Gemma3ForCausalLM, lambda: Gemma3TextConfig(head_dim=32, **SIZES)),
}


def tiny(family: str, dtype=torch.float32) -> torch.nn.Module:
    cls, config = FAMILIES[family]
    torch.manual_seed(0)
    model = cls(config()).eval()
    with torch.no_grad():  # weights away from their initial ones (and zero) so a wrong form shows
        for module in model.modules():
            for name in ("q_norm", "k_norm"):
                if hasattr(module, name):
                    getattr(module, name).weight.normal_(0.5, 0.3)
    return model.to(dtype)


def _norm_class(model):
    return type(next(m for m in model.modules() if hasattr(m, "q_norm")).q_norm)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_fused_norms_are_not_called_and_logits_and_gradients_equal(family, monkeypatch):
    eager = tiny(family)
    fused = copy.deepcopy(eager)
    names = hf.patch_rotary(fused, fused=True)
    assert "model.layers.0.self_attn.q_norm" in names and "model.layers.1.self_attn.k_norm" in names
    assert set(fused.state_dict()) == set(eager.state_dict())
    cls = _norm_class(eager)
    calls = []
    real = cls.forward
    monkeypatch.setattr(cls, "forward", lambda self, x: calls.append(self) or real(self, x))

    def qk_norms(model):
        return {
            id(m)
            for a in model.modules()
            for n in ("q_norm", "k_norm")
            if (m := getattr(a, n, None))
        }

    ids = torch.randint(0, 97, (2, 13), generator=torch.Generator().manual_seed(1))
    with torch.profiler.profile() as prof:
        out = fused(ids, labels=ids)
    assert not {id(m) for m in calls} & qk_norms(fused)  # the other RMSNorms still run
    ops = {e.key for e in prof.key_averages()}
    assert "posemb::norm_rotate_cpu" in ops
    calls.clear()
    want = eager(ids, labels=ids)
    assert len({id(m) for m in calls} & qk_norms(eager)) == 4  # two per layer, eagerly
    torch.testing.assert_close(out.logits, want.logits, rtol=1e-5, atol=1e-5)
    out.loss.backward()
    want.loss.backward()
    grads = dict(eager.named_parameters())
    for name, p in fused.named_parameters():
        if grads[name].grad is None:
            assert p.grad is None, name
            continue
        torch.testing.assert_close(p.grad, grads[name].grad, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_fused_norms_generate_and_unpatch(family):
    eager = tiny(family)
    fused = copy.deepcopy(eager)
    hf.patch_rotary(fused, fused=True)
    prompt = torch.randint(0, 97, (1, 5), generator=torch.Generator().manual_seed(2))
    kwargs = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(fused.generate(prompt, **kwargs), eager.generate(prompt, **kwargs))
    assert hf.patch_rotary(fused, fused=True) == []  # a second patch changes nothing
    restored = hf.unpatch_rotary(fused)
    assert "model.layers.0.self_attn.q_norm" in restored
    assert not any("forward" in m.__dict__ for m in fused.modules())
    ids = prompt.repeat(2, 2)
    torch.testing.assert_close(fused(ids).logits, eager(ids).logits, rtol=0, atol=0)


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_fused_norms_in_bfloat16_within_its_tolerance(family):
    eager = tiny(family, torch.bfloat16)
    fused = copy.deepcopy(eager)
    hf.patch_rotary(fused, fused=True)
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a, b = fused(ids).logits.float(), eager(ids).logits.float()
    # A few bfloat16 roundings differ (the norm's own two, the rotation's): a handful of ulps
    # of the logits' scale, through two layers.
    tol = 16 * TOL[torch.bfloat16]["rtol"] * b.abs().max().item()
    torch.testing.assert_close(a, b, rtol=0, atol=tol)


def test_a_pickled_or_copied_fused_model_stays_fused():
    fused = tiny("qwen3")
    hf.patch_rotary(fused, fused=True)
    ids = torch.randint(0, 97, (1, 7), generator=torch.Generator().manual_seed(4))
    want = fused(ids).logits
    for other in (copy.deepcopy(fused), pickle.loads(pickle.dumps(fused))):
        attn = other.model.layers[0].self_attn
        assert isinstance(attn.q_norm.__dict__.get("forward"), hf.fused_norm.Deferred)
        assert attn.q_norm.__dict__["forward"]._norm is attn.q_norm
        torch.testing.assert_close(other(ids).logits, want, rtol=0, atol=0)


def test_olmo2_norms_over_all_heads_stay_separate_and_say_why(caplog):
    torch.manual_seed(0)
    eager = Olmo2ForCausalLM(Olmo2Config(**SIZES)).eval()
    fused = copy.deepcopy(eager)
    with caplog.at_level(logging.WARNING, logger="posemb.hf"):
        names = hf.patch_rotary(fused, fused=True)
    assert not any(n.endswith("q_norm") for n in names)
    assert "model.layers.0.self_attn" in names  # the rotation is still fused
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(fused(ids).logits, eager(ids).logits, rtol=1e-5, atol=1e-5)
    # The warning is said once per class, so it may have come from an earlier test.
    assert not caplog.records or "stay separate" in caplog.records[0].getMessage()
    verdict = hf.fused_norm.why_not(fused.model.layers[0].self_attn, 16)
    assert isinstance(verdict, str) and "Olmo2Attention" in verdict


def test_a_family_without_norms_is_patched_as_before():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SIZES)).eval()
    names = hf.patch_rotary(model, fused=True)
    assert names == ["model.rotary_emb", "model.layers.0.self_attn", "model.layers.1.self_attn"]


def test_norms_that_differ_from_the_definition_are_not_fused():
    model = tiny("qwen3")
    attn = model.model.layers[0].self_attn
    attn.k_norm.variance_epsilon = 1e-3  # q and k norms now disagree in eps
    assert "differ" in hf.fused_norm.why_not(attn, 32)
    names = hf.patch_rotary(model, fused=True)
    assert "model.layers.0.self_attn.q_norm" not in names
    assert "model.layers.1.self_attn.q_norm" in names


def test_compile_fullgraph_of_a_fused_qwen3():
    eager = tiny("qwen3")
    fused = copy.deepcopy(eager)
    hf.patch_rotary(fused, fused=True)
    ids = torch.randint(0, 97, (1, 6), generator=torch.Generator().manual_seed(6))
    compiled = torch.compile(fused, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(ids).logits, eager(ids).logits, rtol=1e-5, atol=1e-5)


def test_a_collected_fused_model_leaves_nothing_in_sys_modules():
    import gc
    import sys

    before = {n for n in sys.modules if ".norms" in n}
    model = tiny("qwen3")
    hf.patch_rotary(model, fused=True)
    assert len({n for n in sys.modules if ".norms" in n} - before) == 2  # one per attention
    del model
    gc.collect()
    assert {n for n in sys.modules if ".norms" in n} <= before


def test_inference_mode_then_training_on_a_fused_model():
    eager = tiny("qwen3")
    fused = copy.deepcopy(eager)
    hf.patch_rotary(fused, fused=True)
    prompt = torch.randint(0, 97, (1, 4), generator=torch.Generator().manual_seed(7))
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        got = fused.generate(prompt, **kwargs)
        want = eager.generate(prompt, **kwargs)
    assert torch.equal(got, want)
    fused.train()
    out = fused(prompt, labels=prompt)  # tables formed under inference_mode must not leak
    out.loss.backward()
    assert fused.model.layers[0].self_attn.q_norm.weight.grad is not None


def test_a_norm_replaced_or_changed_after_patching_is_still_applied_once():
    eager = tiny("qwen3")
    fused = copy.deepcopy(eager)
    hf.patch_rotary(fused, fused=True)
    ids = torch.randint(0, 97, (1, 8), generator=torch.Generator().manual_seed(8))
    # A new q_norm with the same weights: its own forward runs, the rotation must not norm again.
    for model in (eager, fused):
        attn = model.model.layers[0].self_attn
        new = type(attn.q_norm)(32, eps=attn.q_norm.variance_epsilon)
        new.load_state_dict(attn.q_norm.state_dict())
        attn.q_norm = new
    torch.testing.assert_close(fused(ids).logits, eager(ids).logits, rtol=1e-5, atol=1e-5)
    # An epsilon changed on a deferred norm (q and k now differ): read at the call.
    for model in (eager, fused):
        model.model.layers[1].self_attn.k_norm.variance_epsilon = 0.5
    torch.testing.assert_close(fused(ids).logits, eager(ids).logits, rtol=1e-5, atol=1e-5)


def test_unpatch_beneath_an_accelerate_hook_restores_the_norms():
    eager = tiny("qwen3")
    fused = copy.deepcopy(eager)
    hf.patch_rotary(fused, fused=True)
    for module in fused.modules():  # what accelerate's add_hook_to_module does to a module
        if "forward" in module.__dict__:
            module._old_forward = module.__dict__.pop("forward")
            module._hf_hook = object()
            module.forward = lambda *a, _m=module, **k: _m._old_forward(*a, **k)
    restored = hf.unpatch_rotary(fused)
    assert "model.layers.0.self_attn.k_norm" in restored
    ids = torch.randint(0, 97, (1, 8), generator=torch.Generator().manual_seed(9))
    torch.testing.assert_close(fused(ids).logits, eager(ids).logits, rtol=1e-5, atol=1e-5)


def test_gemma_weights_far_from_zero_keep_their_one_plus_w_form():
    model = tiny("gemma3")
    attn = model.model.layers[0].self_attn
    with torch.no_grad():
        attn.q_norm.weight.fill_(120.0)
        attn.k_norm.weight.fill_(120.0)
    assert hf.fused_norm.why_not(attn, 32).offset == 1.0
    eager = copy.deepcopy(model)
    hf.patch_rotary(model, fused=True)
    ids = torch.randint(0, 97, (1, 8), generator=torch.Generator().manual_seed(10))
    want = eager(ids).logits
    torch.testing.assert_close(
        model(ids).logits, want, rtol=1e-4, atol=1e-4 * want.abs().max().item()
    )


def test_patch_and_unpatch_in_a_loop_keep_nothing_in_sys_modules():
    import sys

    model = tiny("qwen3")
    before = {n for n in sys.modules if ".norms" in n}
    for _ in range(3):
        hf.patch_rotary(model, fused=True)
        hf.unpatch_rotary(model)
    assert {n for n in sys.modules if ".norms" in n} == before


def test_a_no_grad_step_takes_the_direct_op_and_sees_weights_changed_in_place():
    eager = tiny("qwen3")
    fused = copy.deepcopy(eager)
    hf.patch_rotary(fused, fused=True)
    # Five tokens: with one, attention has one key and a rescaled q changes nothing.
    ids = torch.randint(0, 97, (2, 5), generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        fused(ids), fused(ids)
        with torch.profiler.profile() as prof:
            got = fused(ids).logits
        assert "posemb::_norm_rotate_cpu_into" in {e.key for e in prof.key_averages()}
        torch.testing.assert_close(got, eager(ids).logits, rtol=1e-5, atol=1e-5)
        for model in (eager, fused):  # an optimiser's step writes the weights in place
            model.model.layers[1].self_attn.q_norm.weight.mul_(1.7)
        torch.testing.assert_close(fused(ids).logits, eager(ids).logits, rtol=1e-5, atol=1e-5)


def test_weights_swapped_by_data_assignment_or_a_dtype_move_are_read_again():
    eager = tiny("qwen3")
    fused = copy.deepcopy(eager)
    hf.patch_rotary(fused, fused=True)
    ids = torch.randint(0, 97, (1, 5), generator=torch.Generator().manual_seed(12))
    with torch.no_grad():
        fused(ids), fused(ids)  # the weights' float32 forms are kept
        for model in (eager, fused):  # no version bump: the memory itself is new
            w = model.model.layers[0].self_attn.k_norm.weight
            w.data = w.data * 1.5
        torch.testing.assert_close(fused(ids).logits, eager(ids).logits, rtol=1e-5, atol=1e-5)
        eager, fused = eager.to(torch.bfloat16), fused.to(torch.bfloat16)
        a, b = fused(ids).logits.float(), eager(ids).logits.float()
    tol = 16 * TOL[torch.bfloat16]["rtol"] * b.abs().max().item()
    torch.testing.assert_close(a, b, rtol=0, atol=tol)
