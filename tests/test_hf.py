import json
import random
from collections import Counter

import mpmath
import pytest
import torch
import transformers
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

import posemb
from posemb import hf
from posemb import scaling as sc
from posemb.hf import rope_types
from tolerances import TOL, UNIT_ROUNDOFF

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
PER_LAYER = {
    "head_dim": 16,
    "num_attention_heads": 2,
    "max_position_embeddings": 64,
    "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
    },
}


def test_per_layer_type_config():
    config = PER_LAYER
    full, _ = hf.frequencies_from_config(config, layer_type="full_attention")
    local, _ = hf.frequencies_from_config(config, layer_type="sliding_attention")
    torch.testing.assert_close(full, posemb.inv_freq(16, 1e6, dtype=torch.float64) / 8)
    torch.testing.assert_close(local, posemb.inv_freq(16, 1e4, dtype=torch.float64))
    with pytest.raises(ValueError, match="pass layer_type"):
        hf.rope_spec(config)


def tiny_llama(rope_parameters: dict, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rope_parameters=dict(rope_parameters),
        attn_implementation="eager",
        # Larger than the default 0.02 so that a wrong schedule moves the logits by > 1e-2.
        initializer_range=0.05,
    )
    return LlamaForCausalLM(config).eval()


MODEL_ROPES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0},
    "yarn": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    "longrope": {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [1.0 + i / 10 for i in range(8)],
        "long_factor": [2.0 + i for i in range(8)],
        "original_max_position_embeddings": 64,
    },
}


@pytest.mark.parametrize("rope_type", list(MODEL_ROPES))
def test_patched_llama_gives_the_same_logits_beyond_the_original_length(rope_type):
    model = tiny_llama(MODEL_ROPES[rope_type])
    ids = torch.randint(0, 97, (2, 300), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits
        assert hf.patch_rotary(model) == ["model.rotary_emb"]
        assert isinstance(model.model.rotary_emb, hf.HFRotaryEmbedding)
        got = model(ids).logits
        assert float((got - want).abs().max()) <= 1e-5
        # The comparison can fail: a different schedule moves the logits far more than that.
        wrong = dict(MODEL_ROPES[rope_type])
        wrong["rope_theta"] *= 2
        model.model.rotary_emb = hf.HFRotaryEmbedding(
            {**model.config.to_dict(), "rope_parameters": wrong}
        )
        assert float((model(ids).logits - want).abs().max()) > 1e-2


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


def test_hf_rotary_embedding_serves_each_layer_type():
    module = hf.HFRotaryEmbedding(PER_LAYER)
    x = torch.zeros(1, 5, 8, dtype=torch.bfloat16)
    pos = torch.arange(5)[None]
    for layer_type, base, factor in (("full_attention", 1e6, 8.0), ("sliding_attention", 1e4, 1.0)):
        cos, _ = module(x, pos, layer_type=layer_type)
        assert cos.shape == (1, 5, 16) and cos.dtype == torch.bfloat16
        want = posemb.cos_sin(pos, posemb.inv_freq(16, base, dtype=torch.float64) / factor)[0]
        torch.testing.assert_close(cos[..., :8].float(), want, atol=2**-8, rtol=0)
        assert torch.equal(cos[..., :8], cos[..., 8:])  # full-width HALF form
    with pytest.raises(ValueError, match="pass layer_type"):
        module(x, pos)


def tiny_gemma3(rope_parameters: dict, seed: int = 0) -> Gemma3ForCausalLM:
    """Two layers, one sliding and one full attention, each with its own RoPE."""
    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={k: dict(v) for k, v in rope_parameters.items()},
        attn_implementation="eager",
        initializer_range=0.05,
    )
    return Gemma3ForCausalLM(config).eval()


def test_patched_gemma3_uses_each_layer_types_rope():
    model = tiny_gemma3(PER_LAYER["rope_parameters"])
    ids = torch.randint(0, 97, (2, 300), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits
        assert hf.patch_rotary(model) == ["model.rotary_emb"]
        assert float((model(ids).logits - want).abs().max()) <= 1e-5
        # Each layer type's child is the one its layers read: a wrong base in either shows.
        for layer_type in PER_LAYER["rope_parameters"]:
            wrong = {k: dict(v) for k, v in PER_LAYER["rope_parameters"].items()}
            wrong[layer_type]["rope_theta"] *= 2
            model.model.rotary_emb = hf.HFRotaryEmbedding(
                {**model.config.to_dict(), "rope_parameters": wrong}
            )
            assert float((model(ids).logits - want).abs().max()) > 1e-2, layer_type


# --- HFRotaryEmbedding moved across dtypes and devices -----------------------------------------

PLAIN = {
    "head_dim": 16,
    "hidden_size": 32,
    "num_attention_heads": 2,
    "max_position_embeddings": 64,
    # YaRN's attention factor (~1.14) is applied to cos and sin, so a dropped factor shows.
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 1e4,
        "factor": 4.0,
        "original_max_position_embeddings": 16,
    },
}
N_POSITIONS = 64


def rotary_pair(kind: str) -> tuple[hf.HFRotaryEmbedding, torch.nn.Module, list]:
    """posemb's module, transformers' (float32, as built) and the layer types to call."""
    if kind == "plain":
        config = LlamaConfig(vocab_size=8, **json.loads(json.dumps(PLAIN)))
        return hf.HFRotaryEmbedding(config), LlamaRotaryEmbedding(config), [None]
    config = Gemma3TextConfig(
        vocab_size=8,
        hidden_size=32,
        head_dim=16,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_hidden_layers=2,
        max_position_embeddings=N_POSITIONS,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters=json.loads(json.dumps(PER_LAYER["rope_parameters"])),
    )
    layer_types = ["full_attention", "sliding_attention"]
    return hf.HFRotaryEmbedding(config), Gemma3RotaryEmbedding(config), layer_types


def vs_transformers_tol(dtype: torch.dtype, factor: float) -> dict[str, float]:
    """The table's tolerance for the coarser of ``dtype`` and float32, plus transformers' drift.

    transformers' tables are float32 (cast to ``dtype``) formed from float32 angles, which are
    off by up to ~N * 2^-24 at N positions (measured in
    test_float32_tables_drift_in_transformers_not_in_posemb); twice that, times the attention
    factor, is added to the absolute tolerance.
    """
    coarse = dtype if UNIT_ROUNDOFF[dtype] > UNIT_ROUNDOFF[torch.float32] else torch.float32
    drift = 2 * N_POSITIONS * 2.0**-24 * factor
    return {"rtol": TOL[coarse]["rtol"], "atol": TOL[coarse]["atol"] + drift}


MOVES = {
    "to(float64)": lambda m: m.to(torch.float64),
    "double()": lambda m: m.double(),
    "float()": lambda m: m.float(),
    "to(bfloat16)": lambda m: m.to(torch.bfloat16),
    "bfloat16()": lambda m: m.bfloat16(),
}
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("move", list(MOVES))
@pytest.mark.parametrize("kind", ["plain", "per_layer_type"])
def test_hf_rotary_embedding_moves_and_matches_transformers(kind, move, device):
    ours, theirs, layer_types = rotary_pair(kind)
    names = {n for n, _ in ours.named_modules()}
    children = {"ropes." + k for k in ours.ropes}
    assert children <= names and len(children) == len(layer_types)
    before = {n: id(m) for n, m in ours.named_modules()}
    moved = MOVES[move](ours).to(device)
    # The children moved with their parent (no copy left behind in a plain dict) and, holding
    # no tensors, have nothing to save: a transformers state dict has no inv_freq to load either.
    assert moved is ours and {n: id(m) for n, m in moved.named_modules()} == before
    assert moved.state_dict() == {}
    theirs = theirs.to(device)  # float32: transformers' tables are float32 whatever x is
    dtype = {"to(float64)": torch.float64, "double()": torch.float64, "float()": torch.float32}
    dtype = dtype.get(move, torch.bfloat16)
    x = torch.zeros(1, dtype=dtype, device=device)
    gen = torch.Generator().manual_seed(0)
    pos = torch.randint(0, N_POSITIONS, (2, 37), generator=gen).to(device)
    for layer_type in layer_types:
        kwargs = {} if layer_type is None else {"layer_type": layer_type}
        got, want = moved(x, pos, **kwargs), theirs(x, pos, **kwargs)
        factor = hf.frequencies_from_config(
            PLAIN if kind == "plain" else PER_LAYER, layer_type=layer_type
        )[1]
        spec = hf.rope_spec(PLAIN if kind == "plain" else PER_LAYER, layer_type)
        inv, _ = spec.scaling.compute(spec.rotary_dim, spec.base)
        for g, w, exact in zip(
            got, want, posemb.cos_sin(pos.cpu(), inv, torch.float64), strict=True
        ):
            assert g.dtype == dtype and g.device.type == device and g.shape == (2, 37, 16)
            torch.testing.assert_close(g, w, **vs_transformers_tol(dtype, factor))
            # float64 tables are posemb's own (transformers' are float32), to float64 precision.
            exact = factor * torch.cat((exact, exact), -1)
            torch.testing.assert_close(g.cpu().double(), exact.to(dtype).double(), **TOL[dtype])


def test_hf_rotary_embedding_checks_its_inputs():
    module = hf.HFRotaryEmbedding(PLAIN)
    x = torch.zeros(1)
    with pytest.raises(ValueError, match=r"position_ids must have shape \(seq,\) or \(batch"):
        module(x, torch.zeros(1, 2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="position_ids must have an integer dtype"):
        module(x, torch.zeros(1, 3))
    with pytest.raises(ValueError, match="x must have a floating dtype"):
        module(torch.zeros(1, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="one RoPE for every layer"):
        module(x, torch.zeros(1, 3, dtype=torch.long), layer_type="full_attention")


# --- how far transformers' float32 tables drift (documented in posemb.hf) -----------------------

U32 = 2.0**-24


def exact_tables(n: int, dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of p * base^(-2i/dim), full-width HALF form, for p < n.

    The frequencies come from mpmath (40 digits) and are rounded once to float64; the float64
    angles p * theta_i are then off by at most ~n * 2^-53 rad, below 1e-11 here.
    """
    mpmath.mp.dps = 40
    inv = torch.tensor(
        [float(mpmath.power(base, mpmath.mpf(-2 * i) / dim)) for i in range(dim // 2)],
        dtype=torch.float64,
    )
    a = torch.arange(n, dtype=torch.float64)[:, None] * inv
    return torch.cos(a).repeat(1, 2), torch.sin(a).repeat(1, 2)


@pytest.mark.parametrize("n", [2048, 8192])
@pytest.mark.parametrize("base", [1e4, 5e5])
def test_float32_tables_drift_in_transformers_not_in_posemb(base, n):
    config = {
        "head_dim": 128,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "vocab_size": 8,
        "rope_parameters": {"rope_type": "default", "rope_theta": base},
    }
    x, pos = torch.zeros(1), torch.arange(n)[None]
    ours = hf.HFRotaryEmbedding(config)(x, pos)
    theirs = LlamaRotaryEmbedding(LlamaConfig(**config))(x, pos)

    def err(a, b):
        return float((a[0].double() - b.double()).abs().max())

    for o, t, e in zip(ours, theirs, exact_tables(n, 128, base), strict=True):
        assert err(o, e) <= U32  # one float32 rounding of the exact value
        # transformers' float32 angles drift by ~N * 2^-24 (0.94-1.2 times that measured):
        # if it ever forms them exactly the lower bar fails and posemb.hf's docstring is stale.
        assert 0.5 * n * U32 < err(t, e) < 2 * n * U32
        assert err(o, t[0][None]) < 2 * n * U32


def test_moving_to_bfloat16_rounds_transformers_frequencies_not_posembs():
    config = {
        "head_dim": 128,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "vocab_size": 8,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
    }
    x, pos = torch.zeros(1, dtype=torch.bfloat16), torch.arange(2048)[None]
    theirs = LlamaRotaryEmbedding(LlamaConfig(**config))
    want, _ = theirs(x, pos)
    moved_theirs, _ = theirs.to(torch.bfloat16)(x, pos)
    ours, _ = hf.HFRotaryEmbedding(config).to(torch.bfloat16)(x, pos)
    assert float((moved_theirs.float() - want.float()).abs().max()) > 0.5
    assert float((ours.float() - want.float()).abs().max()) <= 2**-8  # one bfloat16 ulp below 1


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
