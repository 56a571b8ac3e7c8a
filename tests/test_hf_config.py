"""Reading configs (``posemb.hf.config``): every rope type's schedule equal to transformers' on
random configs, both JSON forms and config objects, per-layer types, and bad configs refused."""

import json
import random
from collections import Counter

import pytest
import torch
import transformers
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

import posemb
from hf_reference import PER_LAYER
from posemb import hf
from posemb import scaling as sc
from posemb.hf import rope_types

transformers.logging.set_verbosity_error()  # its warnings are about configs we build on purpose


N_CONFIGS = 200


def random_config(rope_type: str, rng: random.Random) -> dict:
    """A valid config.json-style dict with randomised RoPE parameters."""
    head_dim = rng.choice([16, 32, 64, 80, 96, 128, 256])
    # Llama's default-rope path ignores partial_rotary_factor, so only scalings get a fraction.
    partial = 1.0 if rope_type == "default" else rng.choice([1.0, 1.0, 0.5, 0.25, 0.75])
    if int(head_dim * partial) % 2 or int(head_dim * partial) < 4:
        partial = 1.0
    orig = rng.choice([128, 512, 2048, 4096, 8192, 32768])
    factor = round(rng.uniform(1.0, 64.0), 3)
    # transformers forms base ** (2i / d) in float32, whose exponent rounding alone costs up to
    # ln(base) * 6e-8 relative: beyond base ~1e6 its own error passes the 1e-6 bar. Bases are
    # drawn from the range models use (RoFormer 1e4, Llama 3 5e5, Qwen 2.5 1e6).
    params = {
        "rope_type": rope_type,
        "rope_theta": rng.choice([1e4, 5e5, 1e6, 10 ** rng.uniform(3, 6)]),
    }
    if partial != 1.0:
        params["partial_rotary_factor"] = partial
    rotary = int(head_dim * partial)
    if rope_type in ("linear", "dynamic", "yarn", "llama3"):
        params["factor"] = factor
    if rope_type in ("yarn", "llama3", "longrope"):
        params["original_max_position_embeddings"] = orig
    if rope_type == "yarn":
        slow = rng.choice([1.0, 0.5, 2.0])
        params |= {"beta_fast": rng.choice([32.0, 16.0, 64.0]), "beta_slow": slow}
        params["truncate"] = rng.choice([True, False])
        if rng.random() < 0.3:
            params |= {"mscale": rng.uniform(0.5, 2), "mscale_all_dim": rng.uniform(0.5, 2)}
        if rng.random() < 0.2:
            params["attention_factor"] = rng.uniform(0.5, 2.0)
    if rope_type == "llama3":
        low = rng.choice([0.5, 1.0, 2.0])
        params |= {"low_freq_factor": low, "high_freq_factor": low * rng.choice([2.0, 4.0, 8.0])}
    if rope_type == "longrope":
        params["short_factor"] = [rng.uniform(1.0, 4.0) for _ in range(rotary // 2)]
        params["long_factor"] = [rng.uniform(1.0, 64.0) for _ in range(rotary // 2)]
        if rng.random() < 0.5:
            params["factor"] = factor
    if rope_type == "proportional":
        params["partial_rotary_factor"] = rng.choice([0.0, 0.25, 0.5, 1.0])
        if rng.random() < 0.5:
            params["factor"] = factor
    return {
        "head_dim": head_dim,
        "hidden_size": head_dim * 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": int(orig * max(factor, 1.0)),
        "vocab_size": 8,
        "num_hidden_layers": 1,
        "intermediate_size": 8,
        "rope_parameters": params,
    }


def transformers_schedule(config: dict, seq_len):
    c = LlamaConfig(**json.loads(json.dumps(config)))
    rope_type = config["rope_parameters"]["rope_type"]
    if rope_type == "default":
        return LlamaRotaryEmbedding.compute_default_rope_parameters(c)
    return ROPE_INIT_FUNCTIONS[rope_type](c, None, seq_len)


# "ntk" is vLLM's rope type (GTE v1.5 configs use it); transformers has no init function for it.
# Rows only some families read (HunYuan's ntk_alpha) are compared with their own modules in
# test_hf_rope_types.py.
@pytest.mark.parametrize(
    "rope_type",
    [t for t, row in rope_types.TABLE.items() if t != "ntk" and row.model_types is None],
)
def test_schedule_parity_with_transformers(rope_type):
    rng = random.Random(f"posemb-{rope_type}")
    worst = 0.0
    for _ in range(N_CONFIGS):
        config = random_config(rope_type, rng)
        orig = config["rope_parameters"].get("original_max_position_embeddings", 4096)
        seq_len = rng.choice([None, rng.randint(1, orig), rng.randint(orig + 1, 40 * orig)])
        want, want_factor = transformers_schedule(config, seq_len)
        got, got_factor = hf.frequencies_from_config(config, seq_len=seq_len)
        assert got.shape == want.shape
        want = want.double()
        nonzero = want != 0
        assert torch.equal(got == 0, ~nonzero)
        if not bool(nonzero.any()):
            continue
        rel = (got - want).abs()[nonzero] / want[nonzero]
        bar = parity_bar(config, got)[nonzero]
        assert bool((rel <= bar).all()), (config, seq_len, float((rel / bar).max()))
        assert got_factor == want_factor, (config, got_factor, want_factor)
        worst = max(worst, float(rel.max()))
    print(f"{rope_type}: worst relative inv_freq difference {worst:.2e} over {N_CONFIGS} configs")


def parity_bar(config: dict, got: torch.Tensor) -> torch.Tensor:
    """Per-frequency relative bar: 1e-6, times the scale inside blended bands.

    Inside YaRN's ramp and Llama 3's smoothed band the result is a blend w a + (1 - w) a / s.
    transformers forms the weight w in float32; its rounding moves the result by about
    u * a, which relative to the result is u times the scale a / result (up to s = 64 here).
    The bar grows by that same scale there, so it measures posemb against transformers' own
    precision rather than against float32 noise; everywhere else it is the flat 1e-6.
    """
    spec = hf.rope_spec(config)
    bar = torch.full_like(got, 1e-6)
    bands = spec.scaling.bands(spec.rotary_dim, spec.base) or []
    scale = posemb.inv_freq(spec.rotary_dim, spec.base, dtype=torch.float64) / got
    for i, band in enumerate(bands):
        if band in ("ramp", "smoothed"):
            bar[i] = 1e-6 * float(scale[i])
    return bar


def test_config_object_and_both_json_forms_agree():
    v5 = {
        "head_dim": 128,
        "num_attention_heads": 32,
        "max_position_embeddings": 131072,
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    }
    v4 = {k: v for k, v in v5.items() if k != "rope_parameters"}
    v4["rope_theta"] = 500000.0
    v4["rope_scaling"] = {k: v for k, v in v5["rope_parameters"].items() if k != "rope_theta"}
    v4["rope_scaling"]["type"] = v4["rope_scaling"].pop("rope_type")
    obj = LlamaConfig(hidden_size=4096, vocab_size=8, **json.loads(json.dumps(v5)))
    a, b, c = (hf.frequencies_from_config(x) for x in (v5, v4, obj))
    assert torch.equal(a[0], b[0]) and torch.equal(a[0], c[0])
    assert a[1] == b[1] == c[1] == 1.0
    spec = hf.rope_spec(v5)
    bands = Counter(spec.scaling.bands(spec.rotary_dim, spec.base))
    assert bands == {"high (kept)": 29, "low (scaled)": 29, "smoothed": 6}


def test_phi3_style_longrope_config():
    # Phi-3 keeps original_max_position_embeddings at the top level and gives no factor.
    config = {
        "hidden_size": 3072,
        "num_attention_heads": 32,
        "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [2.0] * 48},
    }
    spec = hf.rope_spec(config)
    assert spec.rotary_dim == 96 and spec.original_context == 4096
    _, factor = hf.frequencies_from_config(config)
    assert factor == pytest.approx(
        (1 + torch.log(torch.tensor(32.0)) / torch.log(torch.tensor(4096.0))) ** 0.5
    )


# Gemma 3 style: one rope dict per layer type.


def test_per_layer_type_config():
    config = PER_LAYER
    full, _ = hf.frequencies_from_config(config, layer_type="full_attention")
    local, _ = hf.frequencies_from_config(config, layer_type="sliding_attention")
    torch.testing.assert_close(full, posemb.inv_freq(16, 1e6, dtype=torch.float64) / 8)
    torch.testing.assert_close(local, posemb.inv_freq(16, 1e4, dtype=torch.float64))
    with pytest.raises(ValueError, match="pass layer_type"):
        hf.rope_spec(config)


def test_rotary_from_config_builds_the_module():
    config = {
        "hidden_size": 256,
        "num_attention_heads": 4,
        "partial_rotary_factor": 0.5,
        "rope_theta": 1e4,
    }
    rope = hf.rotary_from_config(config)
    assert (rope.head_dim, rope.rotary_dim, rope.layout, rope.scaling) == (
        64,
        32,
        posemb.Layout.HALF,
        sc.Default(),
    )


BASE = {
    "head_dim": 64,
    "num_attention_heads": 4,
    "max_position_embeddings": 4096,
    "rope_theta": 1e4,
}


def cfg(**params):
    return {**BASE, "rope_parameters": params}


@pytest.mark.parametrize(
    "config,match",
    [
        (
            cfg(rope_type="linear"),
            r"rope_parameters\['factor'\] is missing: rope_type 'linear' needs a number >= 1",
        ),
        (cfg(rope_type="dynamic"), r"rope_parameters\['factor'\] is missing"),
        (cfg(rope_type="yarn", original_max_position_embeddings=512), r"\['factor'\] is missing"),
        (
            cfg(
                rope_type="llama3",
                low_freq_factor=1,
                high_freq_factor=4,
                original_max_position_embeddings=512,
            ),
            r"\['factor'\] is missing",
        ),
        (
            cfg(rope_type="linear", factor=0.5),
            r"rope_parameters\['factor'\] must be a finite number >= 1, got 0.5",
        ),
        (
            cfg(
                rope_type="yarn",
                factor=4,
                original_max_position_embeddings=512,
                beta_fast=1,
                beta_slow=2,
            ),
            "beta_fast must not be less than beta_slow",
        ),
        (
            cfg(
                rope_type="llama3",
                factor=8,
                low_freq_factor=4,
                high_freq_factor=1,
                original_max_position_embeddings=512,
            ),
            "low_freq_factor must not exceed high_freq_factor",
        ),
        (
            cfg(
                rope_type="llama3",
                factor=8,
                high_freq_factor=4,
                original_max_position_embeddings=512,
            ),
            r"\['low_freq_factor'\] is missing",
        ),
        (
            cfg(
                rope_type="longrope",
                short_factor=[1.0] * 31,
                long_factor=[1.0] * 32,
                original_max_position_embeddings=512,
            ),
            r"\['short_factor'\] must be a list of rotary_dim/2 = 32 numbers, got 31 entries",
        ),
        (
            cfg(
                rope_type="longrope",
                short_factor=[1.0] * 32,
                long_factor=None,
                original_max_position_embeddings=512,
            ),
            r"\['long_factor'\] must be a list",
        ),
        (
            cfg(rope_type="ntk_by_parts"),
            "known rope types: default, linear, dynamic, yarn, longrope, llama3, proportional",
        ),
        (
            cfg(rope_type="yarn", factor=4.0),
            r"\['original_max_position_embeddings'\] is missing: rope_type 'yarn'",
        ),
        (
            cfg(rope_type="llama3", factor=8, low_freq_factor=1, high_freq_factor=4),
            "original_max_position_embeddings'] is missing",
        ),
        (
            cfg(rope_type="default", rope_theta=1.0),
            r"rope_parameters\['rope_theta'\] must be a finite number > 1",
        ),
        (
            {"head_dim": 64},
            "a config without model_type does not set 'rope_theta'",
        ),
        (
            {"num_attention_heads": 4, "rope_theta": 1e4},
            "a config without model_type does not set 'head_dim'",
        ),
        ({**BASE, "head_dim": 63}, "rotary dimension .* = 63 must be even"),
        ({**BASE, "partial_rotary_factor": 1.5}, r"partial_rotary_factor must be in \[0, 1\]"),
        (
            {
                **BASE,
                "rope_scaling": {"type": "dynamic", "factor": 2.0},
                "max_position_embeddings": None,
            },
            "max_position_embeddings is missing",
        ),
        ({**BASE, "rope_scaling": "linear"}, "rope_scaling must be a JSON object"),
        ([1, 2], "config must be a transformers config or a dict"),
    ],
)
def test_bad_configs(config, match):
    with pytest.raises(ValueError, match=match):
        hf.rope_spec(config)


def test_load_config_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        hf.load_config(tmp_path / "missing.json")
    trunc = tmp_path / "trunc.json"
    trunc.write_text('{"rope_scaling": {"type": "yarn", "fac')
    with pytest.raises(ValueError, match=r"is not valid JSON \(line 1"):
        hf.load_config(trunc)
    arr = tmp_path / "arr.json"
    arr.write_text("[1, 2]")
    with pytest.raises(ValueError, match="must hold a JSON object"):
        hf.load_config(arr)
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="cannot be read as UTF-8"):
        hf.load_config(binary)


def test_vllm_ntk_type_reads_as_vllm_ntk_with_a_note():
    config = {
        "model_type": "new",
        "head_dim": 64,
        "rope_theta": 160000.0,
        "rope_scaling": {"type": "ntk", "factor": 2.0},
    }
    spec = hf.rope_spec(config)
    assert spec.scaling == sc.VllmNTK(2.0)
    assert any("vLLM" in n for n in spec.notes)


def test_an_interleaved_mrope_section_posemb_cannot_run_is_refused_when_read():
    # Accepted by model_rope and patch_rotary, refused at the first forward: a patched model
    # that could not run.
    config = {
        "model_type": "qwen3_vl_text", "hidden_size": 32, "num_attention_heads": 4,
        "head_dim": 8, "rope_theta": 5000000.0,
        "rope_scaling": {"rope_type": "default", "mrope_section": [1, 1, 2],
                         "mrope_interleaved": True},
    }  # fmt: skip
    with pytest.raises(ValueError, match="cannot be interleaved over 4 pairs"):
        hf.model_rope(config)
