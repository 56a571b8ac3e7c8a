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


def _rsqrt_calls(model, *args, **kwargs):
    """The output of model(*args) and how many RMS norms ran as aten ops (one rsqrt each)."""
    with torch.profiler.profile() as prof:
        out = model(*args, **kwargs)
    counts = {e.key: e.count for e in prof.key_averages()}
    return out, counts.get("aten::rsqrt", 0), counts


@pytest.mark.parametrize("family", list(FAMILIES))
def test_fused_norms_are_not_called_and_logits_and_gradients_equal(family):
    eager = tiny(family)
    fused = copy.deepcopy(eager)
    names = hf.patch_rotary(fused, fused=True)
    assert "model.layers.0.self_attn.q_norm" in names and "model.layers.1.self_attn.k_norm" in names
    assert set(fused.state_dict()) == set(eager.state_dict())
    ids = torch.randint(0, 97, (2, 13), generator=torch.Generator().manual_seed(1))
    out, fused_norms, ops = _rsqrt_calls(fused, ids, labels=ids)
    assert "posemb::norm_rotate_cpu" in ops
    want, eager_norms, _ = _rsqrt_calls(eager, ids, labels=ids)
    assert eager_norms - fused_norms == 4  # q_norm and k_norm of two layers ran inside the op
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
        assert isinstance(attn.q_norm, hf.fused_norm.DeferredNorm)
        assert "forward" not in attn.q_norm.__dict__
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


def test_patching_adds_no_module_and_only_posembs_names_to_the_modeling_module():
    import sys

    from transformers.models.qwen3 import modeling_qwen3

    before_modules, before_names = set(sys.modules), set(vars(modeling_qwen3))
    model = tiny("qwen3")
    hf.patch_rotary(model, fused=True)
    hf.unpatch_rotary(model)
    hf.patch_rotary(model, fused=True)
    assert set(sys.modules) == before_modules
    added = set(vars(modeling_qwen3)) - before_names
    assert all(n.startswith("_posemb_") for n in added)
    assert set(hf.rebind.installed(modeling_qwen3)) >= added


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


# --- What the model holds now: weights written without a version bump, hooks, meta, cycles ----


def _pair(family="qwen3"):
    eager = tiny(family)
    fused = copy.deepcopy(eager)
    hf.patch_rotary(fused, fused=True)
    return eager, fused


def _same_logits(fused, eager, ids, no_grad=True):
    with torch.set_grad_enabled(not no_grad):
        a, b = fused(ids).logits, eager(ids).logits
    torch.testing.assert_close(a, b, **TOL[torch.float32])


def _norm_weights(model):
    return [
        getattr(m, n).weight for m in model.modules() for n in ("q_norm", "k_norm") if hasattr(m, n)
    ]


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
@pytest.mark.parametrize(
    "make",
    [
        lambda ps: torch.optim.AdamW(ps, lr=0.05, fused=True),
        lambda ps: torch.optim.Adam(ps, lr=0.05, fused=True),
        lambda ps: torch.optim.SGD(ps, lr=0.5, momentum=0.9, fused=True),
    ],
    ids=["adamw", "adam", "sgd"],
)
def test_fused_optimizer_steps_between_evaluations_are_seen(family, make):
    eager, fused = _pair(family)
    ids = torch.randint(0, 97, (2, 6), generator=torch.Generator().manual_seed(20))
    _same_logits(fused, eager, ids)  # the first evaluation, before any step
    steps = [make(_norm_weights(m)) for m in (eager, fused)]
    g = torch.Generator().manual_seed(21)
    for _ in range(3):
        grads = [torch.randn(w.shape, generator=g) for w in _norm_weights(eager)]
        for opt, model in zip(steps, (eager, fused), strict=True):
            for w, grad in zip(_norm_weights(model), grads, strict=True):
                w.grad = grad.clone()
            opt.step()
        _same_logits(fused, eager, ids)
    # What made this a bug: the fused step writes the weights without a version bump.
    w = _norm_weights(fused)[0]
    version = w._version
    steps[1].step()
    assert w._version == version


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_writes_through_data_between_evaluations_are_seen(family):
    eager, fused = _pair(family)
    ids = torch.randint(0, 97, (1, 7), generator=torch.Generator().manual_seed(22))
    _same_logits(fused, eager, ids)
    for model in (eager, fused):
        for w in _norm_weights(model):
            w.data.mul_(1.7)
            w.data.add_(0.3)
    _same_logits(fused, eager, ids)
    for model in (eager, fused):  # numpy views write the same memory, no counter at all
        _norm_weights(model)[1].detach().numpy()[:] *= -0.5
    _same_logits(fused, eager, ids)
    _same_logits(fused, eager, ids, no_grad=False)  # the autograd path reads them too


def _record(model, name, out):
    attn = model.model.layers[0].self_attn
    return getattr(attn, name).register_forward_hook(lambda m, args, y: out.append(y.detach()))


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_a_recording_hook_on_a_fused_norm_sees_the_normalised_tensor(family):
    eager, fused = _pair(family)
    ids = torch.randint(0, 97, (2, 6), generator=torch.Generator().manual_seed(23))
    seen = {"eager": [], "fused": []}
    handles = [_record(eager, "q_norm", seen["eager"]), _record(fused, "q_norm", seen["fused"])]
    _same_logits(fused, eager, ids)
    torch.testing.assert_close(seen["fused"][0], seen["eager"][0], **TOL[torch.float32])
    for h in handles:
        h.remove()
    _, fused_norms, _ = _rsqrt_calls(fused, ids)  # unhooked again: fused again
    _, eager_norms, _ = _rsqrt_calls(eager, ids)
    assert eager_norms - fused_norms == 4


@pytest.mark.parametrize("kind", ["forward", "pre", "global", "backward"])
def test_a_hook_that_edits_a_fused_norm_is_applied_once(kind):
    eager, fused = _pair("qwen3")
    ids = torch.randint(0, 97, (2, 6), generator=torch.Generator().manual_seed(24))
    handles = []
    for model in (eager, fused):
        norm = model.model.layers[1].self_attn.k_norm
        if kind == "forward":
            handles.append(norm.register_forward_hook(lambda m, a, y: y + 0.5))
        elif kind == "pre":
            handles.append(norm.register_forward_pre_hook(lambda m, a: (a[0] * 3.0,)))
        elif kind == "backward":
            handles.append(norm.register_full_backward_hook(lambda m, gi, go: (gi[0] * 2.0,)))
    if kind == "global":
        from torch.nn.modules.module import register_module_forward_hook

        def edit(m, a, y):
            return y + 0.5 if type(m).__name__.endswith("RMSNorm") and y.shape[-1] == 32 else y

        handles.append(register_module_forward_hook(edit))
    try:
        out, want = fused(ids, labels=ids), eager(ids, labels=ids)
        torch.testing.assert_close(out.logits, want.logits, **TOL[torch.float32])
        out.loss.backward()
        want.loss.backward()
        a = fused.model.layers[0].self_attn.q_proj.weight.grad
        b = eager.model.layers[0].self_attn.q_proj.weight.grad
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    finally:
        for h in handles:
            h.remove()


def test_a_direct_call_of_a_fused_norm_returns_the_normalised_tensor():
    eager, fused = _pair("gemma3")
    x = torch.randn(2, 5, 4, 32, generator=torch.Generator().manual_seed(25))
    for name in ("q_norm", "k_norm"):
        got = getattr(fused.model.layers[0].self_attn, name)(x)
        want = getattr(eager.model.layers[0].self_attn, name)(x)
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_norm_class_forward_replaced_after_patching_is_what_runs(monkeypatch):
    eager, fused = _pair("qwen3")
    ids = torch.randint(0, 97, (1, 6), generator=torch.Generator().manual_seed(26))
    cls = _norm_class(eager)
    real = cls.forward
    monkeypatch.setattr(cls, "forward", lambda self, x: real(self, x) * 0.5)
    _same_logits(fused, eager, ids)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_meta_device_model_fuses_its_norms_once_loaded(family, caplog):
    eager = tiny(family)
    cls, config = FAMILIES[family]
    with torch.device("meta"):
        model = cls(config()).eval()
    with caplog.at_level(logging.WARNING, logger="posemb.hf"):
        names = hf.patch_rotary(model, fused=True)
    assert "model.layers.0.self_attn" in names
    assert not any(n.endswith("_norm") for n in names)
    verdict = hf.fused_norm.why_not(model.model.layers[0].self_attn, 32)
    assert isinstance(verdict, str) and "meta device" in verdict
    model.to_empty(device="cpu")  # what a loader does, then the checkpoint's weights
    model.load_state_dict(eager.state_dict())
    for name, buffer in model.named_buffers():  # non-persistent ones are the loader's to set
        buffer.copy_(eager.get_buffer(name))
    ids = torch.randint(0, 97, (2, 6), generator=torch.Generator().manual_seed(27))
    _same_logits(model, eager, ids)  # fused rotation, norms separate
    names = hf.patch_rotary(model, fused=True)
    assert names == [
        f"model.layers.{i}.self_attn{part}" for i in (0, 1) for part in ("", ".q_norm", ".k_norm")
    ]
    _, fused_norms, _ = _rsqrt_calls(model, ids)
    _, eager_norms, _ = _rsqrt_calls(eager, ids)
    assert eager_norms - fused_norms == 4
    _same_logits(model, eager, ids)
    assert hf.patch_rotary(model, fused=True) == []


def test_a_thousand_patch_and_unpatch_cycles_keep_memory_flat():
    import gc
    import tracemalloc

    model = tiny("qwen3")

    def cycles(n):
        for _ in range(n):
            hf.patch_rotary(model, fused=True)
            hf.unpatch_rotary(model)
        gc.collect()

    cycles(20)  # the one-off costs: forms probed, code renamed, warnings logged
    tracemalloc.start()
    try:
        cycles(100)
        first, _ = tracemalloc.get_traced_memory()
        cycles(900)
        last, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # A leak of ~1 KB a cycle (the finalizer each patch registered) would be ~900 KB here.
    assert last - first < 64 * 1024, (first, last)


# --- What a second attack found: callers other than the attention, wrappers, moved norms ------


def _wrap_forward(norm):
    inner = norm.forward
    norm.forward = lambda x: inner(x) * 2.0 + 0.1


def _accelerate_hook(norm):
    norm._old_forward, norm._hf_hook = norm.forward, object()
    norm.forward = lambda *a: norm._old_forward(*a) * 3.0


def _moved_gemma_norms(model):
    attn, donor = model.model.layers[0].self_attn, _pair("gemma3")[0].model.layers[0].self_attn
    attn.q_norm, attn.k_norm = donor.q_norm, donor.k_norm  # offset 1 + w in a Qwen3 attention


def _eps_zero(model):
    for layer in model.model.layers:
        layer.self_attn.q_norm.variance_epsilon = layer.self_attn.k_norm.variance_epsilon = 0.0


def _own_norm_method(model):
    model.model.layers[0].self_attn.q_norm._norm = lambda x: x * 0.5  # (Gemma's forward calls it)


@pytest.mark.parametrize(
    ("family", "change"),
    [
        ("qwen3", lambda m: _wrap_forward(m.model.layers[0].self_attn.q_norm)),
        ("gemma3", lambda m: _accelerate_hook(m.model.layers[1].self_attn.k_norm)),
        ("qwen3", _moved_gemma_norms),
        ("qwen3", _eps_zero),
        ("gemma3", _own_norm_method),
    ],
    ids=["wrapped-forward", "accelerate-hook", "moved-norms", "eps-zero", "own-method"],
)
def test_a_norm_changed_after_patching_computes_as_eager(family, change):
    eager, fused = _pair(family)
    torch.manual_seed(3)  # _moved_gemma_norms builds one donor per model: the same weights
    change(eager)
    torch.manual_seed(3)
    change(fused)
    _same_logits(fused, eager, torch.randint(0, 97, (2, 6), generator=torch.Generator()))


def test_a_norm_called_from_a_hook_inside_the_attention_is_applied_there():
    eager, fused = _pair("qwen3")
    seen = {}
    for tag, model in (("eager", eager), ("fused", fused)):
        attn = model.model.layers[0].self_attn

        def hook(module, args, y, attn=attn, tag=tag):
            seen[tag] = attn.q_norm(y.view(*y.shape[:-1], -1, 32))
            return y + 0.1 * attn.k_norm(y.view(*y.shape[:-1], -1, 32)).flatten(-2)

        attn.q_proj.register_forward_hook(hook)
    _same_logits(fused, eager, torch.randint(0, 97, (2, 6), generator=torch.Generator()))
    torch.testing.assert_close(seen["fused"], seen["eager"], rtol=0, atol=0)
    _, fused_norms, _ = _rsqrt_calls(fused, torch.ones(1, 3, dtype=torch.long))
    _, eager_norms, _ = _rsqrt_calls(eager, torch.ones(1, 3, dtype=torch.long))
    assert eager_norms - fused_norms == 4  # the attention's own calls are still fused


def test_a_shallow_copy_of_a_fused_norm_computes_as_itself():
    eager, fused = _pair("qwen3")
    x = torch.randn(1, 4, 2, 32, generator=torch.Generator().manual_seed(4))
    for model in (eager, fused):
        attn = model.model.layers[0].self_attn
        twin = copy.copy(attn.q_norm)  # its class and record of what was probed, shared
        twin.variance_epsilon = 0.25
        attn.q_norm = twin
    torch.testing.assert_close(
        fused.model.layers[0].self_attn.q_norm(x), eager.model.layers[0].self_attn.q_norm(x)
    )
    _same_logits(fused, eager, torch.randint(0, 97, (2, 6), generator=torch.Generator()))


def test_double_backward_through_fused_norms_matches_eager():
    eager, fused = _pair("qwen3")
    ids = torch.randint(0, 97, (1, 5), generator=torch.Generator().manual_seed(5))
    grads = []
    for model in (eager, fused):
        e = model.get_input_embeddings()(ids).detach().requires_grad_()
        (g,) = torch.autograd.grad(
            model(inputs_embeds=e).logits.square().sum(), e, create_graph=True
        )
        g.square().sum().backward()  # a gradient penalty
        grads.append(model.model.layers[0].self_attn.q_norm.weight.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-4 * grads[0].abs().max())


@pytest.mark.parametrize("how", ["replica", "copy"])
@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_a_replicated_fused_attention_runs_its_own_projections_and_norms(family, how):
    """Issue 54, bug 10 with fused norms: a DataParallel replica (or a copy given its own
    submodules) of a fused Qwen3 or Gemma 3 attention, with its own q projection and q and k
    norms, computes with them, not the original's (logits were off by 0.3)."""
    eager, fused = _pair(family)
    torch.manual_seed(6)
    changes = {}
    for model in (eager, fused):
        attention = model.model.layers[1].self_attn
        if how == "replica":
            other = attention._replicate_for_data_parallel()
        else:
            other = copy.copy(attention)
            other._modules = dict(other._modules)
        for name in ("q_proj", "q_norm", "k_norm"):
            setattr(other, name, copy.deepcopy(getattr(attention, name)))
            if name not in changes:
                changes[name] = torch.randn_like(getattr(other, name).weight)
            with torch.no_grad():
                getattr(other, name).weight.add_(changes[name])
        model.model.layers[1].self_attn = other
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(7))
    _same_logits(fused, eager, ids)


@pytest.mark.parametrize("how", ["direct", "vmap", "compile"])
def test_a_replicated_deferring_norm_computes_with_its_own_weights_everywhere(how):
    """Found by an audit after issue 54: under tracing (vmap, torch.compile) or called by
    ``.forward`` directly, a replica of a deferring norm ran the original norm's forward
    (its weights and eps: off by 2.27)."""
    eager, fused = _pair("qwen3")
    x = torch.randn(1, 4, 2, 32, generator=torch.Generator().manual_seed(9))
    outs = []
    for model in (eager, fused):
        norm = model.model.layers[0].self_attn.q_norm
        replica = norm._replicate_for_data_parallel()
        replica.weight = torch.nn.Parameter(norm.weight.detach() * 2.0)
        if how == "direct":
            outs.append(replica.forward(x))
        elif how == "vmap":
            outs.append(torch.func.vmap(replica)(x))
        else:
            outs.append(torch.compile(replica, backend="eager", fullgraph=True)(x))
    torch.testing.assert_close(outs[1], outs[0], **TOL[torch.float32])


def test_a_model_an_earlier_release_pickled_with_deferred_norms_loads_fused():
    """A norm pickled by an earlier posemb held ``Deferred(norm, offset, names)`` in its
    ``__dict__``; loading it swaps the norm into its deferring class."""
    eager, fused = _pair("qwen3")

    class OldDeferred:
        def __init__(self, norm, offset, names):
            self.args = (norm, offset, names)

        def __reduce__(self):
            return (hf.fused_norm.DeferredNorm, self.args)

    for layer in fused.model.layers:
        for name in ("q_norm", "k_norm"):
            norm = getattr(layer.self_attn, name)
            hf.fused_norm.restore(layer.self_attn)
            names = frozenset(norm.__dict__) | {"forward"}
            norm.__dict__["forward"] = OldDeferred(norm, 0.0, names)
    loaded = pickle.loads(pickle.dumps(fused))
    norm = loaded.model.layers[0].self_attn.q_norm
    assert isinstance(norm, hf.fused_norm.DeferredNorm) and "forward" not in norm.__dict__
    ids = torch.randint(0, 97, (2, 6), generator=torch.Generator().manual_seed(10))
    _, fused_norms, _ = _rsqrt_calls(loaded, ids)
    _, eager_norms, _ = _rsqrt_calls(eager, ids)
    assert eager_norms - fused_norms == 4  # deferring again
    _same_logits(loaded, eager, ids)
