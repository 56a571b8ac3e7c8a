"""patch_rotary in tiny random models built from published configs: the same logits.

Each model keeps its published config's RoPE settings (rope type, base, scaling, layer kinds,
rotary fraction, layout) and shrinks only its sizes, so that it runs on a CPU in a fraction of a
second. The patched model must give the unpatched model's logits (float32, within a few float32
roundings of transformers' float32 tables), and a RoPE with another base must move them: the
comparison can fail.
"""

from __future__ import annotations

import copy
import json
import pathlib

import pytest
import torch

from posemb import hf

transformers = pytest.importorskip("transformers")
pytest.importorskip("hf_reference")  # quiets transformers' logging

DATA = pathlib.Path(__file__).parent / "data" / "hf_configs"
SMALL = {
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 128,
    "pad_token_id": 0,
}
# Sizes per published config; everything about RoPE stays as published.
CASES = {
    "deepseek_v3__deepseek-v3.json": {
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "q_lora_rank": 32,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "v_head_dim": 16,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "moe_intermediate_size": 32,
        "n_group": 2,
        "topk_group": 1,
        "n_shared_experts": 1,
    },
    "gemma3__gemma-3-4b-it.json": {"num_hidden_layers": 6, "head_dim": 32, "sliding_window": 8},
    "olmo3__olmo-3.1-32b-instruct.json": {
        "num_hidden_layers": 4,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
        "sliding_window": 8,
    },
    "gpt_neox__dolly-v2-3b.json": {"num_hidden_layers": 2},
    "llama4__llama-4-scout-17b-16e-instruct.json": {
        "num_hidden_layers": 4,
        "head_dim": 32,
        "intermediate_size_mlp": 64,
        "num_local_experts": 2,
        "attention_chunk_size": 16,
        "floor_scale": 8,
    },
    "exaone4__exaone-4.0-32b.json": {
        "num_hidden_layers": 4,
        "head_dim": 32,
        "sliding_window": 8,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
    },
    "mistral3__devstral-small-2-24b-instruct.json": {"num_hidden_layers": 2, "head_dim": 32},
    "gpt_oss__gpt-oss-120b.json": {
        "num_hidden_layers": 2,
        "head_dim": 32,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_local_experts": 2,
        "num_experts_per_tok": 1,
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 8,
    },
    "cohere__c4ai-command-r-v01.json": {"num_hidden_layers": 2},
}


def _tiny(name: str, sizes: dict) -> torch.nn.Module:
    d = json.loads((DATA / name).read_text())
    text = dict(d.get("text_config", d))
    text.update(SMALL)
    text.update(sizes)
    mt = text.pop("model_type")
    text.pop("quantization_config", None)
    cfg = transformers.AutoConfig.for_model(mt, **text)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def _other_base(config: object) -> dict:
    """The config with every rope base times 10 (top level, rope dicts, per layer type)."""

    def walk(v):
        if isinstance(v, dict):
            return {
                k: (x * 10 if k in ("rope_theta", "rotary_emb_base") else walk(x))
                for k, x in v.items()
            }
        return v

    return walk(config.to_dict())


@pytest.mark.parametrize("name", sorted(CASES), ids=[n.split("__")[0] for n in sorted(CASES)])
def test_patched_tiny_model_gives_the_same_logits(name):
    model = _tiny(name, CASES[name])
    ids = torch.randint(1, 128, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits
        replaced = hf.patch_rotary(model)
        assert replaced
        got = model(ids).logits
        assert float((got - want).abs().max()) <= 1e-5
        for module_name in replaced:
            parent, _, attr = module_name.rpartition(".")
            holder = model.get_submodule(parent) if parent else model
            setattr(
                holder,
                attr,
                hf.HFRotaryEmbedding(
                    _other_base(holder.config if hasattr(holder, "config") else model.config)
                ),
            )
        moved = float((model(ids).logits - want).abs().max())
        # The equality bar would catch a wrong base several times over (Cohere, whose logits
        # are scaled by 1/16, moves least: 8.7e-5).
        assert moved > 5 * 1e-5, moved


def test_patched_longrope_model_past_its_original_length():
    """MiniCPM-V 4's published LongRoPE (on its Llama-style language model) switches to the
    long factors past the original length: the patched model follows at 20 and at 40 tokens."""
    d = json.loads((DATA / "minicpmv__minicpm-v-4.json").read_text())
    keys = ("rope_scaling", "rope_theta", "head_dim")
    text = {k: copy.deepcopy(d[k]) for k in keys} | SMALL
    text |= {"num_hidden_layers": 2, "num_attention_heads": 1, "hidden_size": 128}
    text["rope_scaling"]["original_max_position_embeddings"] = 24
    text["max_position_embeddings"] = 24 * 4
    cfg = transformers.LlamaConfig(**text)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for length in (20, 40):
            ids = torch.randint(1, 128, (1, length), generator=torch.Generator().manual_seed(2))
            fresh = transformers.LlamaForCausalLM(cfg).eval()
            fresh.load_state_dict(model.state_dict())
            want = fresh(ids).logits
            hf.patch_rotary(fresh)
            assert float((fresh(ids).logits - want).abs().max()) <= 1e-5, length


def _qwen2_vl_with_an_image() -> tuple[torch.nn.Module, dict]:
    """A tiny Qwen2-VL from its published config, and inputs with one image of 4 x 6 patches."""
    d = json.loads((DATA / "qwen2_vl__qwen2-vl-2b-instruct-awq.json").read_text())
    for key in ("quantization_config", "model_type"):
        d.pop(key)
    d |= {"hidden_size": 256, "intermediate_size": 64, "num_attention_heads": 2}
    d |= {"num_key_value_heads": 1, "num_hidden_layers": 2}
    d["vision_config"] = {
        **{"depth": 1, "embed_dim": 32, "hidden_size": 256, "num_heads": 2, "mlp_ratio": 2},
        **{"patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3},
    }
    cfg = transformers.AutoConfig.for_model("qwen2_vl", **d)
    torch.manual_seed(0)
    model = transformers.Qwen2VLForConditionalGeneration(cfg).eval()
    grid = torch.tensor([[1, 4, 6]])  # one frame of 4 x 6 patches, merged 2 x 2: 6 tokens
    image = [cfg.vision_start_token_id] + [cfg.image_token_id] * 6 + [cfg.vision_end_token_id]
    ids = torch.tensor([[11, 12, *image, 13, 14, 15]])
    inputs = {
        "input_ids": ids,
        "pixel_values": torch.randn(
            24, 3 * 2 * 14 * 14, generator=torch.Generator().manual_seed(3)
        ),
        "image_grid_thw": grid,
        "mm_token_type_ids": (ids == cfg.image_token_id).long(),
    }
    return model, inputs


def test_patched_qwen2_vl_with_an_image():
    """Qwen2-VL's published M-RoPE ([16, 24, 24], legacy "mrope" spelling) with one image: the
    text model gets (3, batch, seq) positions from get_rope_index and posemb's tables for them."""
    model, inputs = _qwen2_vl_with_an_image()
    with torch.no_grad():
        want = model(**inputs).logits
        assert model.model.rope_deltas.item() == -3  # the image's tokens share positions
        assert hf.patch_rotary(model) == ["model.language_model.rotary_emb"]
        assert float((model(**inputs).logits - want).abs().max()) <= 1e-5
        # Another assignment of pairs to axes moves the logits: the 3D positions are used.
        text = model.config.text_config.to_dict()
        text["rope_parameters"] = {**text["rope_parameters"], "mrope_section": [24, 24, 16]}
        model.model.language_model.rotary_emb = hf.HFRotaryEmbedding(text)
        assert float((model(**inputs).logits - want).abs().max()) > 5e-5
