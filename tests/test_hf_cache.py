"""hf.rerotate_cache and hf.schedule_changes inside real transformers models (Phi-3 with
LongRoPE, Llama with dynamic NTK), against a fresh prefill of the same tokens."""

from __future__ import annotations

import pytest
import torch

from posemb import hf

transformers = pytest.importorskip("transformers")

ORIGINAL = 16  # the pre-training length of the tiny models
EXACT = 1e-5  # float32 logits of these models, the same tokens in another order of sums


def _tiny(kind: str, layers: int = 2) -> torch.nn.Module:
    common = dict(
        vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4 * ORIGINAL,
    )  # fmt: skip
    if kind == "longrope":
        g = torch.Generator().manual_seed(5)
        short = (1 + torch.rand(8, generator=g)).tolist()
        long = (2 + 6 * torch.rand(8, generator=g)).sort().values.tolist()
        config = transformers.Phi3Config(
            **common, original_max_position_embeddings=ORIGINAL, pad_token_id=0,
            eos_token_id=1, bos_token_id=1,
            rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                             "short_factor": short, "long_factor": long},
        )  # fmt: skip
        cls = transformers.Phi3ForCausalLM
    else:
        common["max_position_embeddings"] = ORIGINAL
        config = transformers.LlamaConfig(
            **common, rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0}
        )
        cls = transformers.LlamaForCausalLM
    torch.manual_seed(0)
    return cls(config).eval()


def _decode(model, ids, prefill: int, how: str) -> list[float]:
    """Decode ids[:, prefill:] one token at a time with a cache; the worst logit difference of
    each step from a fresh prefill. ``how`` handles a schedule change: "stale" (ignore it, as
    transformers' cache does), "rerotate", "approximate" or "prefill" (run without the cache)."""
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids[:, :prefill], cache=cache, use_cache=True)
        gaps = []
        for t in range(prefill, ids.shape[1]):
            fresh = model(ids[:, : t + 1]).logits[:, -1]
            if how == "prefill" and hf.schedule_changes(model.config, t, t + 1):
                cache = transformers.DynamicCache(config=model.config)
                step = model(ids[:, : t + 1], cache=cache, use_cache=True).logits[:, -1]
            else:
                if how in ("rerotate", "approximate"):
                    hf.rerotate_cache(model.config, cache, from_length=t, to_length=t + 1,
                                      approximate=how == "approximate")  # fmt: skip
                step = model(ids[:, t : t + 1], cache=cache, use_cache=True).logits[:, -1]
            gaps.append(float((step - fresh).abs().max()))
    return gaps


IDS = torch.randint(1, 97, (2, 2 * ORIGINAL), generator=torch.Generator().manual_seed(1))
START = ORIGINAL - 4  # four tokens before the switch, sixteen after it


@pytest.mark.parametrize("kind", ["longrope", "dynamic"])
def test_one_rotating_layer_rerotated_decodes_as_a_fresh_prefill(kind):
    model = _tiny(kind, layers=1)
    stale = _decode(model, IDS, START, "stale")
    fixed = _decode(model, IDS, START, "rerotate")
    assert max(stale[:4]) < EXACT and min(stale[4:]) > 10 * EXACT, stale
    assert max(fixed) < EXACT, fixed
    print(f"{kind}, 1 layer: worst gap past the switch {max(stale[4:]):.2g} stale, "
          f"{max(fixed):.2g} re-rotated")  # fmt: skip


@pytest.mark.parametrize("kind", ["longrope", "dynamic"])
def test_deeper_caches_are_refused_and_a_fresh_prefill_at_the_switch_is_exact(kind):
    model = _tiny(kind)
    with pytest.raises(ValueError, match="layer 1's keys and values were computed from"):
        _decode(model, IDS, START, "rerotate")
    stale = _decode(model, IDS, START, "stale")
    approx = _decode(model, IDS, START, "approximate")
    exact = _decode(model, IDS, START, "prefill")
    assert min(stale[4:]) > 10 * EXACT and max(exact) < EXACT, (stale, exact)
    assert max(approx[4:]) < max(stale[4:]) / 3  # closer, never exact
    assert min(approx[4:]) > EXACT
    print(
        f"{kind}, 2 layers: worst gap past the switch {max(stale[4:]):.2g} stale, "
        f"{max(approx[4:]):.2g} re-rotated (approximate), {max(exact):.2g} re-prefilled"
    )


def test_longrope_changes_schedule_once_and_dynamic_ntk_at_every_step():
    phi, llama = _tiny("longrope").config, _tiny("dynamic").config
    steps = range(ORIGINAL - 3, ORIGINAL + 5)
    assert [t for t in steps if hf.schedule_changes(phi, t, t + 1)] == [ORIGINAL]
    assert [t for t in steps if hf.schedule_changes(llama, t, t + 1)] == list(range(ORIGINAL, 21))


def test_a_layer_after_the_switch_is_stale_even_when_its_own_rope_is_unchanged():
    """Layer 1 rotates nothing (NoPE), yet its keys come from what layer 0 attended."""
    config = transformers.Llama4TextConfig(
        vocab_size=97, hidden_size=64, intermediate_size=128, intermediate_size_mlp=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=ORIGINAL, no_rope_layers=[1, 0],
        rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0},
    )  # fmt: skip
    keys = [torch.randn(1, 2, 20, 16), torch.randn(1, 2, 20, 16)]
    cache = type("Cache", (), {"layers": [type("L", (), {"keys": k})() for k in keys]})()
    with pytest.raises(ValueError, match="layer 1's keys and values were computed from"):
        hf.rerotate_cache(config, cache, from_length=20, to_length=21)
    assert hf.rerotate_cache(config, cache, from_length=20, to_length=21, approximate=True) == 1
    torch.testing.assert_close(cache.layers[1].keys, keys[1], rtol=0, atol=0)  # NoPE: untouched
    with pytest.raises(ValueError, match="from_length must be a positive integer"):
        hf.schedule_changes(config, -5, 3)


def test_caches_without_every_key_or_not_caches_are_refused():
    model = _tiny("longrope", layers=1)
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        model(torch.ones(1, 5, dtype=torch.long), cache=cache, use_cache=True)
    with pytest.raises(ValueError, match="layer 0 holds 5 keys but from_length is 6"):
        hf.rerotate_cache(model.config, cache, from_length=6, to_length=40)
    with pytest.raises(ValueError, match="cache must be a transformers Cache"):
        hf.rerotate_cache(model.config, object(), from_length=5, to_length=6)
    assert hf.rerotate_cache(model.config, cache, from_length=5, to_length=6) == 0  # no change
    assert hf.rerotate_cache(model.config, cache, from_length=5, to_length=40) == 1


def _padded_decode(model, ids, mask, prefill, positions_given):
    """Row 1 left-padded: decode with the cache re-rotated at each step (with or without the
    rows' positions); the worst logit gap of row 1 from a fresh prefill, per step."""
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
    cache = transformers.DynamicCache(config=model.config)
    gaps = []
    with torch.no_grad():
        model(ids[:, :prefill], attention_mask=mask[:, :prefill], position_ids=pos[:, :prefill],
              cache=cache, use_cache=True)  # fmt: skip
        for t in range(prefill, ids.shape[1]):
            fresh = model(ids[:, : t + 1], attention_mask=mask[:, : t + 1],
                          position_ids=pos[:, : t + 1]).logits[:, -1]  # fmt: skip
            # The schedule reads the batch's longest row: row 0, unpadded.
            hf.rerotate_cache(model.config, cache, from_length=t, to_length=t + 1,
                              positions=pos[:, :t] if positions_given else None)  # fmt: skip
            step = model(ids[:, t : t + 1], attention_mask=mask[:, : t + 1],
                         position_ids=pos[:, t : t + 1], cache=cache, use_cache=True)  # fmt: skip
            gaps.append(float((step.logits[1, -1] - fresh[1]).abs().max()))
    return gaps


def test_a_left_padded_batch_rerotates_each_row_at_its_own_positions():
    # The keys of a row left-padded by 3 sit at 0.. from slot 3: re-rotating them as slots
    # 0.. left row 1 off by 2.3e-3 (worse than not re-rotating), row 0 exact.
    model = _tiny("longrope", layers=1)
    ids = IDS[:, : START + 8].clone()  # four steps before the switch, four after
    mask = torch.ones_like(ids)
    mask[1, :3], ids[1, :3] = 0, 0
    wrong = _padded_decode(model, ids, mask, START, positions_given=False)
    right = _padded_decode(model, ids, mask, START, positions_given=True)
    assert max(right) < EXACT, right
    assert max(wrong[4:]) > 10 * EXACT, wrong
    with pytest.raises(ValueError, match="positions must have shape"):
        hf.rerotate_cache(model.config, transformers.DynamicCache(config=model.config),
                          from_length=4, to_length=5, positions=torch.arange(3))  # fmt: skip


def test_schedule_changes_answers_for_an_mrope_config():
    # A decode loop written as the docs show crashed on Qwen2-VL ("multimodal RoPE keys turn by
    # three position axes"): its schedule does not change with the length.
    import json
    import pathlib

    data = pathlib.Path(__file__).parent / "data" / "hf_configs"
    config = json.loads((data / "qwen2_vl__qwen2-vl-2b-instruct-awq.json").read_text())
    assert hf.schedule_changes(config, 10, 11) is False
    assert hf.schedule_changes(config, 40000, 40001) is False


def test_a_refused_rerotation_leaves_every_layer_as_it_was():
    # Layer 0 was re-rotated before layer 1's short cache was refused.
    model = _tiny("longrope", layers=2)
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        model(IDS[:, :6], cache=cache, use_cache=True)
    cache.layers[1].keys = cache.layers[1].keys[:, :, :4]
    before = cache.layers[0].keys.clone()
    with pytest.raises(ValueError, match="the cache is unchanged"):
        hf.rerotate_cache(model.config, cache, from_length=6, to_length=2 * ORIGINAL,
                          approximate=True)  # fmt: skip
    assert torch.equal(cache.layers[0].keys, before)
