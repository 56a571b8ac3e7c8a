"""The table of rope types (posemb.hf.rope_types): one row per type, and the row added to prove
it, HunYuan's NTK-alpha, read as transformers' HunYuan modules read it."""

from __future__ import annotations

import warnings

import pytest
import torch

import posemb
from posemb import hf
from posemb.hf import rope_types

transformers = pytest.importorskip("transformers")
hr = pytest.importorskip("hf_reference")

# The text keys of tencent/Hy-MT2-1.8B's config.json as mlx-lm's test mirrors them
# (ml-explore/mlx-lm, its HunYuan config test): "dynamic" with a fixed alpha.
HY_MT2 = {
    "model_type": "hunyuan_v1_dense",
    "vocab_size": 120818,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 32,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_scaling": {"type": "dynamic", "alpha": 1000.0, "factor": 1.0, "mscale": 1.0},
    "max_position_embeddings": 32768,
}


def test_the_public_names_come_from_the_table():
    assert tuple(rope_types.TABLE) == hf.ROPE_TYPES
    for name, row in rope_types.TABLE.items():
        assert hf.ROPE_KEYS[name] == rope_types.COMMON_KEYS | row.keys
        assert row.name == name


@pytest.mark.parametrize("model_type", ["hunyuan_v1_dense", "hunyuan_v1_moe"])
def test_hunyuan_ntk_alpha_matches_transformers_rotary_module(model_type):
    d = {**HY_MT2, "model_type": model_type}
    spec = hf.rope_spec(d)
    assert spec.rope_type == "ntk_alpha"
    assert spec.scaling == posemb.scaling.NTK(1000.0)
    text = hr.hf_config(d)
    _, ref = hr.hf_frequencies(text, None)
    want_inv, want_factor = ref[None]
    inv, factor = spec.scaling.compute(spec.rotary_dim, spec.base)
    rel = ((inv - want_inv).abs() / want_inv.abs()).max().item()
    assert rel <= hr.inv_freq_tolerance(spec.base)
    assert factor == want_factor == 1.0
    # base' = theta * alpha^(d/(d-2)), the frequencies fixed at every length.
    base = 10000.0 * 1000.0 ** (128 / 126)
    assert inv[-1].item() == pytest.approx(base ** (-126 / 128), rel=1e-12)
    far, _ = spec.scaling.compute(spec.rotary_dim, spec.base, seq_len=10**6)
    assert torch.equal(far, inv)


def test_patched_hunyuan_model_gives_the_same_logits():
    d = {k: v for k, v in HY_MT2.items() if k != "model_type"}
    d.update(vocab_size=128, hidden_size=256, intermediate_size=64, num_hidden_layers=2)
    d.update(num_attention_heads=2, num_key_value_heads=1, pad_token_id=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = transformers.AutoConfig.for_model("hunyuan_v1_dense", **d)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    ids = torch.randint(1, 128, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(ids).logits
        hf.patch_rotary(model, fused=True)
        got = model(ids).logits
    assert float((got - want).abs().max()) <= 1e-5


def test_alpha_is_hunyuan_s_only():
    """transformers' other modules read "dynamic" as dynamic NTK and ignore alpha: posemb
    refuses the key there, and the row's own name outside HunYuan."""
    d = {**HY_MT2, "model_type": "llama"}
    with pytest.raises(posemb.InputError, match=r"\['alpha'\] is not read by rope_type 'dynamic'"):
        hf.rope_spec(d)
    d["rope_scaling"] = {"rope_type": "ntk_alpha", "alpha": 1000.0}
    with pytest.raises(posemb.InputError, match="known rope types"):
        hf.rope_spec(d)


def test_a_missing_original_context_is_named_by_the_row_that_needs_it():
    for name, row in rope_types.TABLE.items():
        if not row.needs_original:
            continue
        d = {"model_type": "llama", "rope_theta": 1e4, "head_dim": 64, "rope_scaling": {}}
        d["rope_scaling"] = {"rope_type": name, "factor": 2.0}
        with pytest.raises(posemb.InputError, match="original_max_position_embeddings"):
            hf.rope_spec(d)
