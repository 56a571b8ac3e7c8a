"""posemb reads every published config.json in tests/data/hf_configs as transformers does.

Each file is read strictly (an unknown rope key would fail), and every layer kind's inverse
frequencies and attention factor are compared with transformers' own rotary module built from
the same dict; length-dependent rope types also at 4x the original length.
"""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

from posemb import hf

hr = pytest.importorskip("hf_reference")

DATA = pathlib.Path(__file__).parent / "data" / "hf_configs"
FILES = sorted(DATA.glob("*.json"))


def _load(path: pathlib.Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _compare(d: dict, seq_len: int | None) -> list[tuple[str, str, float]]:
    """Per layer kind: (layer type, rope type, worst relative inv_freq difference)."""
    text = hr.hf_config(d)
    cls, ref = hr.hf_frequencies(text, seq_len)
    assert ref, f"no transformers rotary module found for {d['model_type']}"
    model = hf.model_rope(d)
    rows = []
    for kind in model.kinds:
        if kind.spec is None:
            continue
        expected = ref.get(kind.layer_type, ref.get(None))
        assert expected is not None, (kind.layer_type, sorted(map(str, ref)))
        spec = kind.spec
        inv, factor = spec.scaling.compute(spec.rotary_dim, spec.base, seq_len)
        want_inv, want_factor = expected
        assert inv.shape == want_inv.shape, (kind.layer_type, cls)
        rel = ((inv - want_inv).abs() / want_inv.abs().clamp_min(1e-300)).max().item()
        assert rel <= hr.inv_freq_tolerance(spec.base), (kind.layer_type, rel)
        assert factor == pytest.approx(want_factor, rel=1e-12, abs=1e-12), kind.layer_type
        rows.append((str(kind.layer_type), spec.rope_type, rel))
    assert rows
    return rows


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_published_config_matches_transformers(path):
    d = _load(path)
    _compare(d, None)
    spec_types = {k.spec.rope_type for k in hf.model_rope(d).kinds if k.spec}
    if spec_types & {"dynamic", "longrope"}:
        orig = next(k.spec.original_context for k in hf.model_rope(d).kinds if k.spec)
        _compare(d, 4 * orig)
        _compare(d, max(orig // 2, 1))


def test_the_set_covers_the_families_the_issue_names():
    types = {_load(f)["model_type"] for f in FILES}
    rope_types = set()
    for f in FILES:
        d = _load(f)
        rope_types |= {k.spec.rope_type for k in hf.model_rope(d).kinds if k.spec}
    assert len(FILES) >= 25
    for need in ("deepseek_v3", "gemma3", "olmo3", "qwen2_5_vl", "qwen3_5", "mllama", "llama4"):
        assert need in types, need
    for need in ("default", "linear", "yarn", "llama3", "proportional"):
        assert need in rope_types, need


def test_deepseek_v3_rotates_its_rope_part_interleaved():
    d = _load(DATA / "deepseek_v3__deepseek-v3.json")
    spec = hf.rope_spec(d)
    assert (spec.head_dim, spec.rotary_dim) == (64, 64)  # qk_rope_head_dim, not 7168 / 128 = 56
    assert spec.layout is hf.Layout.INTERLEAVED if hasattr(hf, "Layout") else True
    rope = hf.rotary_from_config(d)
    assert rope.rotary_dim == 64 and rope.layout.name == "INTERLEAVED"
    assert hf.rope_spec({**d, "rope_interleave": False}).layout.name == "HALF"


def test_gemma3_layer_types_differ_and_defaults_are_said():
    d = _load(DATA / "gemma3__gemma-3-27b-it.json")
    m = hf.model_rope(d)
    assert m.resolved_from == "Gemma3TextConfig"
    local = m.kind("sliding_attention").spec
    glob = m.kind("full_attention").spec
    assert (local.base, local.rope_type) == (10000.0, "default")
    assert (glob.base, glob.rope_type, glob.scaling.factor) == (1e6, "linear", 8.0)
    assert any("read from transformers' Gemma3TextConfig defaults" in n for n in glob.notes)
    with pytest.raises(ValueError, match="pass layer_type"):
        hf.rope_spec(d)


def test_olmo3_yarn_only_on_full_attention():
    m = hf.model_rope(_load(DATA / "olmo3__olmo-3.1-32b-instruct.json"))
    assert m.kind("sliding_attention").spec.rope_type == "default"
    assert m.kind("full_attention").spec.rope_type == "yarn"
    assert len(m.kind("full_attention").layers) == 16
    assert len(m.kind("sliding_attention").layers) == 48


def test_layer_kinds_without_rope_say_why():
    qwen = hf.model_rope(_load(DATA / "qwen3_5__qwen3.5-9b.json"))
    assert qwen.kind("linear_attention").spec is None
    assert hf.rope_spec(_load(DATA / "qwen3_5__qwen3.5-9b.json")).mrope_section == (11, 11, 10)
    exaone = _load(DATA / "exaone4__exaone-4.0-32b.json")
    with pytest.raises(ValueError, match="full_attention' has no RoPE: EXAONE 4"):
        hf.rope_spec(exaone, "full_attention")
    assert hf.rope_spec(exaone).layer_type is None  # the one RoPE of every rotating layer


def test_llama4_nope_layers_carry_the_temperature():
    m = hf.model_rope(_load(DATA / "llama4__llama-4-scout-17b-16e-instruct.json"))
    nope = m.kind("nope")
    assert nope.spec is None and nope.temperature is not None
    assert nope.layers == tuple(range(3, 48, 4))
    f = nope.temperature.factor(torch.tensor([0, 8190, 8191, 3 * 8192 - 1]))
    assert f[:2].tolist() == [1.0, 1.0] and f[2] > 1 and f[3] > f[2]
    assert m.kind("rope").spec.layout.name == "INTERLEAVED"


def test_ministral3_temperature_and_its_off_switch():
    on = hf.rope_spec(_load(DATA / "mistral3__devstral-small-2-24b-instruct.json"))
    assert on.temperature.beta == 0.1 and on.temperature.original_max_position_embeddings == 8192
    off = hf.rope_spec(_load(DATA / "ministral3__devstral-2-123b-instruct.json"))
    assert any("llama_4_scaling_beta is 0" in n for n in off.notes)


def test_kimi_k2_reads_as_deepseek_v3():
    d = _load(DATA / "kimi_k2__kimi-k2-instruct.json")
    _compare(d, None)


@pytest.mark.parametrize("interleave", [True, False])
def test_deepseek_layout_rotates_as_transformers_attention(interleave):
    """rotary_from_config's layout is the pairing DeepSeek-V3's attention rotates: the attention
    logits q_m . k_n from posemb's module equal those after transformers' apply_rotary_pos_emb
    (or its _interleave variant, which also reorders the channels, so logits are compared)."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds

    d = {**_load(DATA / "deepseek_v3__deepseek-v3.json"), "rope_interleave": interleave}
    text = hr.hf_config(d)
    theirs = ds.DeepseekV3RotaryEmbedding(config=text)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 9, 64, dtype=torch.float64, generator=gen)
    k = torch.randn(1, 2, 9, 64, dtype=torch.float64, generator=gen)
    pos = torch.arange(9)[None]
    cos, sin = theirs(q.float(), pos)
    fn = ds.apply_rotary_pos_emb_interleave if interleave else ds.apply_rotary_pos_emb
    wq, wk = fn(q, k, cos.double(), sin.double())
    want = wq @ wk.transpose(-1, -2)
    gq, gk = hf.rotary_from_config(d)(q, k, pos[0])
    # transformers' float32 tables at positions < 9: a few float32 roundings per term.
    assert float((gq @ gk.transpose(-1, -2) - want).abs().max()) < 1e-4
    oq, ok = hf.rotary_from_config({**d, "rope_interleave": not interleave})(q, k, pos[0])
    assert float((oq @ ok.transpose(-1, -2) - want).abs().max()) > 1e-1


def test_exaone_4_5_full_layers_rotate_nothing():
    m = hf.model_rope(_load(DATA / "exaone4_5__exaone-4.5-33b.json"))
    assert m.kind("full_attention").spec is None
    assert "only sliding layers rotate" in m.kind("full_attention").reason
    assert m.kind("sliding_attention").spec is not None


@pytest.mark.parametrize("key", ["llm_config", "language_config"])
def test_text_settings_nested_under_other_names(key):
    """InternVL keeps its language model under llm_config, DeepSeek-VL2 under language_config."""
    text = _load(DATA / "qwen2__qwen2.5-7b-instruct.json")
    outer = {"model_type": "internvl_chat", key: text, "vision_config": {"hidden_size": 8}}
    assert hf.model_rope(outer).text_config == key
    assert hf.rope_spec(outer) == hf.rope_spec(text)


def _variant(name: str, change) -> dict:
    d = _load(DATA / name)
    change(d.get("text_config", d))
    return d


VARIANTS = {
    # Gemma 3 in transformers 5's nested form, one layer type left for the class to fill.
    "gemma3 nested, sliding entry missing": (
        "gemma3__gemma-3-27b-it.json",
        lambda t: t.update(
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0}},
            layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 10
            + ["sliding_attention"] * 2,
            rope_theta=1e6,
            rope_local_base_freq=1e4,
        ),
    ),
    # OLMo 3 with a base inside rope_scaling: the full layers take it, the sliding ones not.
    "olmo3 base inside rope_scaling": (
        "olmo3__olmo-3.1-32b-instruct.json",
        lambda t: t["rope_scaling"].update(rope_theta=1e6),
    ),
    "exaone4 without a sliding window": (
        "exaone4__exaone-4.0-32b.json",
        lambda t: t.update(sliding_window=None),
    ),
    "gpt_neox with agreeing generic keys": (
        "gpt_neox__dolly-v2-3b.json",
        lambda t: t.update(rope_theta=10000, partial_rotary_factor=0.25),
    ),
    "llama4 with explicit no_rope_layers": (
        "llama4__llama-4-scout-17b-16e-instruct.json",
        lambda t: t.update(
            no_rope_layers=[int((i + 1) % 3 != 0) for i in range(48)],
            attn_temperature_tuning=True,
            floor_scale=8192,
            attn_scale=0.1,
        ),
    ),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variants_of_published_configs_match_transformers(variant):
    name, change = VARIANTS[variant]
    _compare(_variant(name, change), None)


def test_exaone4_without_a_window_rotates_every_layer():
    d = _variant("exaone4__exaone-4.0-32b.json", lambda t: t.update(sliding_window=None))
    assert all(k.spec is not None for k in hf.model_rope(d).kinds)


def test_gpt_neox_generic_keys_that_its_class_ignores_are_refused():
    d = _variant("gpt_neox__dolly-v2-3b.json", lambda t: t.update(rope_theta=1e6))
    with pytest.raises(ValueError, match=r"rope_theta is 1000000\.0, but GPT-NeoX"):
        hf.model_rope(d)
    d = _variant("gpt_neox__dolly-v2-3b.json", lambda t: t.update(partial_rotary_factor=0.5))
    with pytest.raises(ValueError, match=r"reads rotary_pct \(0\.25\) and ignores"):
        hf.model_rope(d)


def test_reading_never_changes_the_callers_dict():
    d = _load(DATA / "gemma3__gemma-3-4b-it.json")  # resolved through transformers
    before = json.dumps(d, sort_keys=True)
    hf.model_rope(d)
    hf.model_rope(d)
    assert json.dumps(d, sort_keys=True) == before


def test_llama4_flags_must_cover_every_layer():
    d = _variant(
        "llama4__llama-4-scout-17b-16e-instruct.json",
        lambda t: t.update(no_rope_layers=[1, 0] * 10),
    )
    with pytest.raises(ValueError, match="no_rope_layers has 20 entries, but num_hidden_layers"):
        hf.model_rope(d)


def test_modernbert_bases_per_layer_type():
    """ModernBERT's keys (global_rope_theta, local_rope_theta, global_attn_every_n_layers, as in
    answerdotai/ModernBERT-base; typed here, no published copy was found) read as transformers."""
    d = {
        "model_type": "modernbert",
        "global_rope_theta": 160000.0,
        "local_rope_theta": 10000.0,
        "hidden_size": 768,
        "num_attention_heads": 12,
        "num_hidden_layers": 22,
        "global_attn_every_n_layers": 3,
        "local_attention": 128,
        "max_position_embeddings": 8192,
    }
    rows = _compare(d, None)
    bases = {k.layer_type: k.spec.base for k in hf.model_rope(d).kinds}
    assert bases == {"full_attention": 160000.0, "sliding_attention": 10000.0}
    assert len(rows) == 2
