"""Which modules patch_rotary touches (posemb.hf.targets): the text model's, decided by the
config each module holds, never posemb's own; a second patch, a vision tower beside the text
model, and a fused model saved with torch.save (issue 31, items 1, 2 and 7)."""

from __future__ import annotations

import io

import pytest
import torch

import posemb
from posemb import hf
from posemb.hf import targets
from posemb.hf.fused import is_fused
from test_hf_fused import FUSED, _ids
from test_hf_patch_models import _tiny

transformers = pytest.importorskip("transformers")

SEVEN = [
    "llama__llama-3.1-8b-instruct.json",
    "qwen2__qwen2.5-7b-instruct.json",
    "gemma3__gemma-3-4b-it.json",
    "phi3__phi-4.json",
    "olmo3__olmo-3.1-32b-instruct.json",
    "cohere__c4ai-command-r-v01.json",
    "gpt_neox__dolly-v2-3b.json",
]


def _mistral3_with_pixtral():
    text = transformers.MistralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    )  # fmt: skip
    vision = transformers.PixtralVisionConfig(
        hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        image_size=32, patch_size=8, head_dim=8,
    )  # fmt: skip
    config = transformers.Mistral3Config(
        vision_config=vision, text_config=text, image_token_index=5, spatial_merge_size=2
    )
    torch.manual_seed(0)
    return transformers.Mistral3ForConditionalGeneration(config).eval()


def _image_batch():
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(6, 64, (1, 10), generator=g)
    ids[0, 2:6] = 5  # 16 patches of 8 px, merged 2 x 2: four image tokens
    return {"input_ids": ids, "pixel_values": torch.randn(1, 3, 32, 32, generator=g),
            "image_sizes": torch.tensor([[32, 32]])}  # fmt: skip


def test_a_pixtral_tower_is_left_alone_and_the_model_reads_images():
    # PixtralAttention has no "Vision" in its name: fused=True rebound it, and any image then
    # failed ("unsqueeze_dim must be 1 or 2, got 0").
    model = _mistral3_with_pixtral()
    batch = _image_batch()
    with torch.no_grad():
        want = model(**batch).logits
    names = hf.patch_rotary(model, fused=True)
    assert names and all(n.startswith("model.language_model.") for n in names), names
    tower = model.model.vision_tower
    assert not any(is_fused(m) for m in tower.modules())
    assert not any(isinstance(m, hf.HFRotaryEmbedding) for m in tower.modules())
    with torch.no_grad():
        got = model(**batch).logits
    assert float((got - want).abs().max()) <= 1e-5


@pytest.mark.parametrize("name", SEVEN, ids=[n.split("__")[0] for n in SEVEN])
def test_patching_twice_changes_nothing_and_unpatching_restores(name):
    # A second patch replaced posemb's own RotaryEmbedding children (rotary_emb.ropes.*): the
    # forward died on a bare AssertionError and unpatch_rotary raised AttributeError.
    model = _tiny(name, FUSED[name])
    ids = _ids()
    with torch.no_grad():
        want = model(ids).logits
    first = hf.patch_rotary(model)
    assert hf.patch_rotary(model) == []
    fused = hf.patch_rotary(model, fused=True)  # fusing a model patched without it
    assert fused and not set(fused) & set(first)
    assert hf.patch_rotary(model, fused=True) == []
    assert not any(
        isinstance(m, posemb.RotaryEmbedding) and n.split(".")[-2] != "ropes"
        for n, m in model.named_modules()
    )
    with torch.no_grad():
        assert float((model(ids).logits - want).abs().max()) <= 1e-5
    assert sorted(hf.unpatch_rotary(model)) == sorted(first + fused)
    assert not any(targets.is_posemb(m) or is_fused(m) for m in model.modules())
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want)


def test_a_fused_model_saved_with_torch_save_loads_fused():
    # The rebound forward pickled as the class's eager one while the mark survived: 0 fused
    # calls after loading, and patch_rotary(m2, fused=True) refused.
    name = "llama__llama-3.1-8b-instruct.json"
    model = _tiny(name, FUSED[name])
    ids = _ids()
    hf.patch_rotary(model, fused=True)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    # Counted by the profiler: a decode-shaped call may reach the op without kernels.rotate
    # (posemb.kernels.fast).
    with torch.no_grad(), torch.profiler.profile() as prof:
        got = loaded(ids).logits
        want = model(ids).logits
    calls = [e.name for e in prof.events() if e.name.startswith("posemb::")]
    assert len(calls) == 2 * model.config.num_hidden_layers, calls  # both models fused
    assert torch.equal(got, want)
    assert hf.patch_rotary(loaded, fused=True) == []
    assert len(hf.unpatch_rotary(loaded)) == model.config.num_hidden_layers + 1


def test_granite_swa_rotary_modules_with_their_own_config_copies_are_all_patched():
    # Each of model.rotary_embs holds a deep copy of the config with its own rope_theta: the
    # equality rule kept the copy equal to the text config and dropped the other (a partial
    # patch), and the forward then read rotary_emb.config, which posemb's module lacked.
    config = transformers.GraniteSWAConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, layer_rope_theta=[1e4, 5e5],
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.GraniteSWAForCausalLM(config).eval()
    ids = _ids()[:, :12] % 64
    with torch.no_grad():
        want = model(ids).logits
    names = hf.patch_rotary(model, fused=True)
    rotary = [n for n, m in model.named_modules() if type(m).__name__.endswith("RotaryEmbedding")]
    assert all(n in names for n in rotary if n.count(".") <= 2), (rotary, names)
    with torch.no_grad():
        assert float((model(ids).logits - want).abs().max()) <= 1e-5


def test_an_instance_forward_posemb_did_not_set_is_refused_and_hooks_are_kept():
    # patch_fused overwrote whatever instance forward a module had (a wrapper's), silently.
    import functools

    name = "llama__llama-3.1-8b-instruct.json"
    model = _tiny(name, FUSED[name])
    attn = model.model.layers[0].self_attn
    attn.forward = functools.partial(type(attn).forward, attn)
    with pytest.raises(ValueError, match="already has its own forward"):
        hf.patch_rotary(model, fused=True)
    assert type(model.model.rotary_emb).__name__ == "LlamaRotaryEmbedding"  # nothing changed
    del attn.forward
    # An accelerate-style hook (its forward calls _old_forward): fused beneath it, kept.
    calls = []
    attn._hf_hook = object()
    attn._old_forward = attn.forward

    def hooked(*args, **kwargs):
        calls.append(1)
        return attn._old_forward(*args, **kwargs)

    attn.forward = hooked
    hf.patch_rotary(model, fused=True)
    assert is_fused(attn)
    with torch.no_grad():
        model(_ids())
    assert calls == [1]
    hf.unpatch_rotary(model)
    assert not is_fused(attn) and attn.forward is hooked


def test_a_fused_forward_shows_the_signature_of_the_bound_method():
    import inspect

    name = "llama__llama-3.1-8b-instruct.json"
    model = _tiny(name, FUSED[name])
    attn = model.model.layers[0].self_attn
    before = inspect.signature(attn.forward)
    hf.patch_rotary(model, fused=True)
    assert inspect.signature(attn.forward) == before  # no self
