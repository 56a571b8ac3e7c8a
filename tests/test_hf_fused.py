"""patch_rotary(model, fused=True): the rotation of a real transformers model runs through
posemb's op, once per attention layer, with the unpatched model's logits and gradients; the
family's eager rotate_half no longer runs; families posemb cannot fuse are refused by name with
nothing changed; unpatch_rotary restores the model."""

from __future__ import annotations

import copy
import importlib
import pickle
import sys

import pytest
import torch

from posemb import hf
from posemb.hf.fused import is_fused
from test_hf_patch_models import CASES, _tiny

transformers = pytest.importorskip("transformers")

FUSED = {
    "llama__llama-3.1-8b-instruct.json": {"num_hidden_layers": 2},
    "qwen2__qwen2.5-7b-instruct.json": {"num_hidden_layers": 2},
    "mistral3__devstral-small-2-24b-instruct.json": CASES[
        "mistral3__devstral-small-2-24b-instruct.json"
    ],
    "gemma3__gemma-3-4b-it.json": CASES["gemma3__gemma-3-4b-it.json"],
    "phi3__phi-4.json": {"num_hidden_layers": 2},
    "gpt_neox__dolly-v2-3b.json": {"num_hidden_layers": 2},  # rotary_pct 0.25: partial
    "olmo3__olmo-3.1-32b-instruct.json": CASES["olmo3__olmo-3.1-32b-instruct.json"],
    "cohere__c4ai-command-r-v01.json": {"num_hidden_layers": 2},  # interleaved pairs
    # Complex freqs_cis on (batch, seq, heads, dim); every fourth layer has no RoPE.
    "llama4__llama-4-scout-17b-16e-instruct.json": CASES[
        "llama4__llama-4-scout-17b-16e-instruct.json"
    ],
    # The rotary part of MLA, pairs interleaved in the checkpoint, returned de-interleaved.
    "deepseek_v3__deepseek-v3.json": CASES["deepseek_v3__deepseek-v3.json"],
    # Phi-1 splits off the rotated half before calling the rotation; gpt-oss's tables hold
    # one entry per pair.
    "phi__phi-1.json": {"num_hidden_layers": 2},
    "gpt_oss__gpt-oss-120b.json": CASES["gpt_oss__gpt-oss-120b.json"],
}
# GPT-J's module hands out a stacked sin/cos buffer and its attention rotates one tensor at a
# time: neither its tables nor its rotation are replaced.
REFUSED = {"gptj__gpt-j-6b.json": ("stacked sin/cos buffer", {"hidden_size": 256})}


def _ids() -> torch.Tensor:
    return torch.randint(1, 128, (2, 24), generator=torch.Generator().manual_seed(1))


def _logits_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    logits = model(ids).logits
    logits.float().square().mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), grads


def _attention_layers(model) -> int:
    return sum(1 for m in model.modules() if is_fused(m))


def _rotating_layers(model) -> int:
    """Fused attention layers that rotate (Llama 4's NoPE layers do not)."""
    fused = [m for m in model.modules() if is_fused(m)]
    return sum(1 for m in fused if getattr(m, "use_rope", True))


@pytest.mark.parametrize("name", sorted(FUSED), ids=[n.split("__")[0] for n in sorted(FUSED)])
def test_fused_model_matches_the_eager_model(name, monkeypatch):
    model = _tiny(name, FUSED[name])
    ids = _ids()
    want, want_grads = _logits_and_grads(model, ids)
    names = hf.patch_rotary(model, fused=True)
    layers = _attention_layers(model)
    assert layers == model.config.num_hidden_layers and len(names) > layers
    # The family's eager rotation must not run: make it fail if anything calls it.
    modeling = sys.modules[type(model).__module__]

    def no_eager(*args, **kwargs):
        raise AssertionError("the eager rotation ran")

    eager_names = ("rotate_half", "apply_rotary_pos_emb", "apply_rotary_emb", "_apply_rotary_emb")
    for eager_name in (*eager_names, "apply_rotary_pos_emb_interleave"):
        if hasattr(modeling, eager_name):
            monkeypatch.setattr(modeling, eager_name, no_eager)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got, grads = _logits_and_grads(model, ids)
    calls = [e.name for e in prof.events() if e.name.startswith("posemb::")]
    # Forward: one op call per layer (q and k together); backward: one per layer. Qwen3 and
    # Gemma 3 normalise q and k in the same op (kernels.norm_rotate).
    ops = ("posemb::rotate_cpu", "posemb::norm_rotate_cpu", "posemb::norm_rotate_cpu_backward")
    assert sum(calls.count(op) for op in ops) == 2 * _rotating_layers(model), calls
    assert float((got - want).abs().max()) <= 1e-5
    assert grads.keys() == want_grads.keys()
    for key, g in grads.items():
        assert float((g - want_grads[key]).abs().max()) <= 1e-5, key
    monkeypatch.undo()
    restored = hf.unpatch_rotary(model)
    assert set(restored) == set(names)
    assert _attention_layers(model) == 0
    assert not any(isinstance(m, hf.HFRotaryEmbedding) for m in model.modules())
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want)


@pytest.mark.parametrize("name", sorted(REFUSED), ids=[n.split("__")[0] for n in sorted(REFUSED)])
def test_a_family_posemb_cannot_fuse_is_refused_and_left_unchanged(name):
    reason, sizes = REFUSED[name]
    model = _tiny(name, {"num_hidden_layers": 2, **sizes})
    ids = _ids()
    with torch.no_grad():
        want = model(ids).logits
        with pytest.raises(ValueError, match=reason):
            hf.patch_rotary(model, fused=True)
        assert _attention_layers(model) == 0
        assert not any(isinstance(m, hf.HFRotaryEmbedding) for m in model.modules())
        assert torch.equal(model(ids).logits, want)


def test_fusing_one_model_leaves_another_of_its_family_eager():
    name = "llama__llama-3.1-8b-instruct.json"
    fused, eager = _tiny(name, FUSED[name]), _tiny(name, FUSED[name])
    hf.patch_rotary(fused, fused=True)
    cpu = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=cpu) as prof, torch.no_grad():
        eager(_ids())
    assert not [e for e in prof.events() if e.name.startswith("posemb::")]
    with torch.profiler.profile(activities=cpu) as prof, torch.no_grad():
        fused(_ids())
    assert [e for e in prof.events() if e.name.startswith("posemb::")]


def test_fused_llama_generates_the_same_tokens_with_a_kv_cache():
    name = "llama__llama-3.1-8b-instruct.json"
    model = _tiny(name, FUSED[name])
    prompt = _ids()[:1, :8]
    args = {"max_new_tokens": 20, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        want = model.generate(prompt, **args)
        hf.patch_rotary(model, fused=True)
        got = model.generate(prompt, **args)
    assert torch.equal(got, want) and got.shape[1] == 28


def test_fused_llama_compiles_with_fullgraph():
    name = "llama__llama-3.1-8b-instruct.json"
    model = _tiny(name, FUSED[name])
    ids = _ids()
    with torch.no_grad():
        want = model(ids).logits
        hf.patch_rotary(model, fused=True)
        compiled = torch.compile(model, fullgraph=True)
        compiled(ids)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            got = compiled(ids).logits
    assert float((got - want).abs().max()) <= 1e-5
    in_graph = [
        e
        for e in prof.events()
        if e.name == "posemb::rotate_cpu"
        and e.cpu_parent is not None
        and e.cpu_parent.name.startswith("## Call CompiledFxGraph")
    ]
    assert in_graph  # the op runs inside the compiled graph, not beside it


def test_fused_bf16_model_is_within_the_bf16_tolerance():
    """In bfloat16 transformers rounds each product of q * cos + rotate_half(q) * sin; posemb
    rounds once. Per rotation that differs by about one bfloat16 rounding: the logits are
    compared with the table's bfloat16 tolerance, scaled by their size."""
    from tolerances import TOL

    name = "llama__llama-3.1-8b-instruct.json"
    model = _tiny(name, FUSED[name]).to(torch.bfloat16)
    ids = _ids()
    with torch.no_grad():
        want = model(ids).logits.float()
        hf.patch_rotary(model, fused=True)
        got = model(ids).logits.float()
    scale = float(want.abs().max())
    assert float((got - want).abs().max()) <= TOL[torch.bfloat16]["rtol"] * scale


def test_fused_qwen2_vl_with_an_image_uses_its_3d_positions():
    """The text attention of Qwen2-VL rotates through posemb's op with the M-RoPE tables of
    an image's 3D positions; the vision tower's own patch RoPE is left as it is."""
    from test_hf_patch_models import _qwen2_vl_with_an_image

    model, inputs = _qwen2_vl_with_an_image()
    model = model.float()  # its published dtype is float16: compare in float32
    inputs["pixel_values"] = inputs["pixel_values"].float()
    with torch.no_grad():
        want = model(**inputs).logits
        names = hf.patch_rotary(model, fused=True)
        assert names[0] == "model.language_model.rotary_emb"
        assert all("visual" not in n for n in names)
        assert _attention_layers(model) == model.config.text_config.num_hidden_layers
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            got = model(**inputs).logits
    assert float((got - want).abs().max()) <= 1e-5
    assert [e for e in prof.events() if e.name == "posemb::_rotate_cpu_into"]


def _phi3_vision_text(layers: int = 2) -> torch.nn.Module:
    """A tiny Phi-3 with Phi-3-vision-128k-instruct's LongRoPE factors (head_dim 96, 48 pairs).
    transformers 5.24 cannot read the file's ``"type": "su"`` (see hf_reference), so the model
    is built from it with the type's current name, ``longrope``."""
    import json

    from test_hf_patch_models import DATA, SMALL

    d = json.loads((DATA / "phi3__phi-3-vision-128k-instruct.json").read_text())
    d["rope_scaling"] = {**d["rope_scaling"], "type": "longrope"}
    d.update(SMALL)
    d.update(hidden_size=192, num_attention_heads=2, num_key_value_heads=1)
    d.update(num_hidden_layers=layers, sliding_window=None)
    d.pop("model_type")
    cfg = transformers.AutoConfig.for_model("phi3", **d)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


@pytest.mark.parametrize("length", [24, 4100], ids=["short-factors", "long-factors"])
def test_fused_phi3_longrope_before_and_past_its_original_length(length):
    """Phi-3's LongRoPE switches from its short to its long factors past
    original_max_position_embeddings (4096): the fused model follows it, logits and gradients."""
    model = _phi3_vision_text()
    assert model.config.rope_parameters["original_max_position_embeddings"] == 4096
    ids = torch.randint(1, 128, (1, length), generator=torch.Generator().manual_seed(2))
    want, want_grads = _logits_and_grads(model, ids)
    hf.patch_rotary(model, fused=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got, grads = _logits_and_grads(model, ids)
    calls = [e.name for e in prof.events() if e.name == "posemb::rotate_cpu"]
    assert len(calls) == 2 * model.config.num_hidden_layers
    assert float((got - want).abs().max()) <= 1e-5
    for key, g in grads.items():
        assert float((g - want_grads[key]).abs().max()) <= 1e-5, key
    # The two lengths really are rotated by different factors.
    rope = hf.HFRotaryEmbedding(model.config)
    x = torch.zeros(1, 1, 1, 96)
    short = rope(x, torch.arange(24)[None])[0][0, 5]
    long = rope(x, torch.arange(4100)[None])[0][0, 5]
    assert not torch.allclose(short, long)


def test_a_rotation_of_another_form_is_refused_by_the_probe(monkeypatch):
    """A family whose function posemb's forms do not reproduce (here Llama's, rotating the
    other way) is refused when patched, nothing changed: never fused and silently wrong."""
    from transformers.models.llama import modeling_llama

    name = "llama__llama-3.1-8b-instruct.json"
    model = _tiny(name, FUSED[name])
    original = modeling_llama.apply_rotary_pos_emb

    def backwards(q, k, cos, sin, unsqueeze_dim=1):
        return original(q, k, cos, -sin, unsqueeze_dim)

    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", backwards)
    with pytest.raises(ValueError, match="none of the forms posemb fuses"):
        hf.patch_rotary(model, fused=True)
    assert _attention_layers(model) == 0
    assert not any(isinstance(m, hf.HFRotaryEmbedding) for m in model.modules())


def test_fused_deepseek_v2_complex_rotation_on_heads_first():
    """DeepSeek-V2 rotates with complex freqs_cis on (batch, heads, seq, dim), where Llama 4's
    are (batch, seq, heads, dim). No published DeepSeek-V2 config is kept as data, so the tiny
    model takes the config class's defaults for RoPE (rope_theta 10000, no scaling)."""
    cfg = transformers.DeepseekV2Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        q_lora_rank=None,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=16,
        v_head_dim=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        n_shared_experts=1,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    ids = _ids()
    want, want_grads = _logits_and_grads(model, ids)
    hf.patch_rotary(model, fused=True)
    assert _attention_layers(model) == 2
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got, grads = _logits_and_grads(model, ids)
    assert [e.name for e in prof.events()].count("posemb::rotate_cpu") == 4
    assert float((got - want).abs().max()) <= 1e-5
    for key, g in grads.items():
        assert float((g - want_grads[key]).abs().max()) <= 1e-5, key


def test_glm4v_text_rotation_is_the_interleaved_partial_form():
    """GLM-4V's text attention rotates interleaved pairs of the first half of each head on
    repeated tables (its rotate_half_llm). Its model class needs an image processor to build,
    so the form is checked on the probe, as patch_rotary checks it, for the published file's
    head_dim 128 and partial_rotary_factor 0.5."""
    from posemb.hf import fused

    importlib.import_module("transformers.models.glm4v.modeling_glm4v")
    form = fused._form_of("transformers.models.glm4v.modeling_glm4v", fused.ROTATION, 128, 64)
    assert "pairs (2j, 2j+1) on repeated tables" in form.label


def _own_projection(attention, how):
    """A copy of ``attention`` with its own q_proj (a new random weight), made as a DataParallel
    replica makes it or as copy.copy does (then given its own submodule dict)."""
    if how == "replica":
        other = attention._replicate_for_data_parallel()
    else:
        other = copy.copy(attention)
        other._modules = dict(other._modules)
    old = other.q_proj
    other.q_proj = torch.nn.Linear(old.in_features, old.out_features, bias=old.bias is not None)
    with torch.no_grad():
        other.q_proj.weight.copy_(torch.randn_like(old.weight))
        if old.bias is not None:
            other.q_proj.bias.copy_(torch.randn_like(old.bias))
    return other


@pytest.mark.parametrize("how", ["replica", "copy"])
@pytest.mark.parametrize(
    "name",
    ["llama__llama-3.1-8b-instruct.json", "qwen2__qwen2.5-7b-instruct.json",
     "gemma3__gemma-3-4b-it.json"],
    ids=["llama", "qwen2", "gemma3"],
)  # fmt: skip
def test_a_copied_or_replicated_fused_attention_runs_its_own_weights(name, how):
    """Issue 54, bug 10: the fused forward sat in the attention's __dict__, bound to the module
    it was made for, so an nn.DataParallel replica or a copy computed with the original's
    projections and norms (logits off by 0.2-0.9). A fused module is now of a fused subclass of
    its own class, whose forward binds to whichever instance calls it."""
    torch.manual_seed(3)
    eager, fused = _tiny(name, FUSED[name]), _tiny(name, FUSED[name])
    hf.patch_rotary(fused, fused=True)
    layer = 1 if "gemma" in name else 0  # Gemma 3's second layer is global
    for model in (eager, fused):
        torch.manual_seed(4)
        attention = model.model.layers[layer].self_attn
        model.model.layers[layer].self_attn = _own_projection(attention, how)
    assert is_fused(fused.model.layers[layer].self_attn)
    with torch.no_grad():
        gap = (fused(_ids()).logits - eager(_ids()).logits).abs().max()
    assert float(gap) <= 1e-5


def test_a_fused_model_pickles_deep_copies_and_unpatches_as_its_class():
    name = "qwen2__qwen2.5-7b-instruct.json"
    model = _tiny(name, FUSED[name])
    hf.patch_rotary(model, fused=True)
    attention = model.model.layers[0].self_attn
    assert isinstance(attention, hf.fused.FusedAttention)
    assert type(attention).__name__ == "Qwen2Attention" and "forward" not in attention.__dict__
    with torch.no_grad():
        want = model(_ids()).logits
        for again in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            assert _attention_layers(again) == 2
            assert torch.equal(again(_ids()).logits, want)
    with pytest.warns(DeprecationWarning, match="FusedAttention"):
        assert hf.fused.FusedForward is hf.fused.FusedAttention
    hf.unpatch_rotary(model)
    assert type(model.model.layers[0].self_attn).__mro__[1] is torch.nn.Module


class _OldFusedForward:
    """What an earlier posemb kept in a fused attention's __dict__: it pickled as
    ``_fused_again(module, forms, norms)``."""

    def __init__(self, module):
        self.module = module

    def __reduce__(self):
        return (hf.fused._fused_again, (self.module, (0,), None))


def test_a_model_an_earlier_release_pickled_fused_loads_fused():
    name = "llama__llama-3.1-8b-instruct.json"
    model = _tiny(name, FUSED[name])
    with torch.no_grad():
        want = model(_ids()).logits
    for layer in model.model.layers:
        layer.self_attn.__dict__["forward"] = _OldFusedForward(layer.self_attn)
    loaded = pickle.loads(pickle.dumps(model))
    assert _attention_layers(loaded) == 2
    assert all("forward" not in layer.self_attn.__dict__ for layer in loaded.model.layers)
    with torch.no_grad():
        assert float((loaded(_ids()).logits - want).abs().max()) <= 1e-5
