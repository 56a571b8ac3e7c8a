"""Query temperatures: hand values, properties, and the attention of transformers' Llama 4 and
Ministral 3 layers reproduced with posemb's factor."""

import dataclasses
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posemb
from posemb import temperature as tp
from tolerances import TOL, assert_close

F64 = torch.float64
HEADS, KV, HEAD = 4, 2, 8

# --- the formulas ---------------------------------------------------------------------------


def test_llama4_by_hand():
    # floor_scale 4: p + 1 reaches 4 at p = 3, 8 at p = 7, 12 at p = 11.
    got = tp.llama4_attn_temperature(torch.arange(12), floor_scale=4, attn_scale=0.5)
    want = [1.0] * 3 + [1 + 0.5 * math.log(2)] * 4 + [1 + 0.5 * math.log(3)] * 4
    want += [1 + 0.5 * math.log(4)]
    assert got.dtype == F64
    torch.testing.assert_close(got, torch.tensor(want, dtype=F64), **TOL[F64])
    # Llama 4 Scout / Maverick: floor_scale 8192, attn_scale 0.1; 1 until p = 8190.
    scout = tp.Llama4AttnTemperature()
    assert scout.factor([0, 8190, 8191]).tolist() == [1.0, 1.0, 1 + 0.1 * math.log(2)]


def test_scaling_beta_by_hand():
    # original length 4: the first step is at p = 4 itself, one position after Llama 4's.
    got = tp.llama4_scaling_beta_temperature(
        torch.arange(9), beta=0.3, original_max_position_embeddings=4
    )
    want = [1.0] * 4 + [1 + 0.3 * math.log(2)] * 4 + [1 + 0.3 * math.log(3)]
    torch.testing.assert_close(got, torch.tensor(want, dtype=F64), **TOL[F64])
    # Devstral Small 2: beta 0.1 over 8192 positions; Devstral 2 123B switches it off (beta 0).
    assert tp.Llama4ScalingBetaTemperature(0.1, 8192).factor([8191, 8192]).tolist() == [
        1.0,
        1 + 0.1 * math.log(2),
    ]
    assert torch.equal(
        tp.Llama4ScalingBetaTemperature(0.0, 4096).factor(torch.arange(10**6, 10**6 + 9)),
        torch.ones(9, dtype=F64),
    )


@given(
    st.integers(1, 10**5),
    st.floats(0.0, 2.0, allow_nan=False),
    st.integers(0, 2**40),
)
def test_one_inside_the_first_stretch_steps_at_multiples_and_monotone(length, scale, p):
    l4 = tp.Llama4AttnTemperature(length, scale)
    mis = tp.Llama4ScalingBetaTemperature(scale, length)
    f = l4.factor(torch.tensor([p, p + 1]))
    assert float(f[0]) <= float(f[1])
    # The two published forms are one position apart.
    assert torch.equal(f, mis.factor(torch.tensor([p + 1, p + 2])))
    # Exactly 1 before the first step; at every multiple it rises to 1 + scale * ln(1 + k).
    k = (p + 1) // length
    assert float(f[0]) == pytest.approx(1.0 + scale * math.log1p(k), rel=TOL[F64]["rtol"])
    if k == 0:
        assert float(f[0]) == 1.0
    if scale >= 1e-6 and k > 0 and k * length >= 2:
        step = torch.tensor([k * length - 2, k * length - 1])
        low, high = l4.factor(step).tolist()
        assert low < high


def test_exact_at_far_positions_and_in_every_dtype():
    # A float32 quotient (p + 1) / 3 rounds up to the next integer here; the integer floor does not.
    p = torch.tensor([3 * 2**30 - 2, 3 * 2**30 - 1])
    f = tp.llama4_attn_temperature(p, floor_scale=3, attn_scale=0.1)
    assert f.tolist() == [1 + 0.1 * math.log1p(2**30 - 1), 1 + 0.1 * math.log1p(2**30)]
    pos = torch.arange(40).view(2, 20)
    want = tp.llama4_attn_temperature(pos, floor_scale=4, attn_scale=0.5)
    assert want.shape == (2, 20)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        got = tp.llama4_attn_temperature(pos, floor_scale=4, attn_scale=0.5, dtype=dtype)
        assert got.dtype == dtype and torch.equal(got, want.to(dtype))  # rounded once


def test_objects_are_frozen_hashable_and_print_their_formula():
    t = tp.Llama4AttnTemperature(floor_scale=4, attn_scale=0.5)
    assert repr(t) == "Llama4AttnTemperature(floor_scale=4, attn_scale=0.5)"
    assert t.formula() == "1 + 0.5 * ln(1 + floor((p + 1) / 4))"
    m = tp.Llama4ScalingBetaTemperature(beta=0.1, original_max_position_embeddings=8192)
    assert (
        repr(m) == "Llama4ScalingBetaTemperature(beta=0.1, original_max_position_embeddings=8192)"
    )
    assert m.formula() == "1 + 0.1 * ln(1 + floor(p / 8192))"
    assert {t, m, tp.Llama4AttnTemperature(4, 0.5)} == {t, m}
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.attn_scale = 1.0  # type: ignore[misc]
    assert {
        "attn_temperature_tuning": tp.Llama4AttnTemperature,
        "llama_4_scaling_beta": tp.Llama4ScalingBetaTemperature,
    } == tp.TEMPERATURES


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: tp.Llama4AttnTemperature(0, 0.1), "floor_scale must be a positive integer, got 0"),
        (lambda: tp.Llama4AttnTemperature(8192.5, 0.1), "floor_scale must be a positive integer"),
        (
            lambda: tp.Llama4AttnTemperature(8192, -0.1),
            r"attn_scale must be a finite number >= 0, got -0.1",
        ),
        (
            lambda: tp.Llama4ScalingBetaTemperature(float("nan"), 4),
            "Llama4ScalingBetaTemperature.beta must be a finite number >= 0, got nan",
        ),
        (
            lambda: tp.Llama4ScalingBetaTemperature(0.1, 0),
            "original_max_position_embeddings must be a positive integer, got 0",
        ),
        (
            lambda: tp.llama4_attn_temperature([0, -2], floor_scale=4, attn_scale=0.1),
            "defined for positions >= 0.*got position -2",
        ),
        (
            lambda: tp.llama4_scaling_beta_temperature(
                torch.tensor([0.5]), beta=0.1, original_max_position_embeddings=4
            ),
            "positions must have an integer dtype",
        ),
        (
            lambda: tp.llama4_attn_temperature(
                [1], floor_scale=4, attn_scale=0.1, dtype=torch.int64
            ),
            "dtype must be one of",
        ),
        (
            lambda: posemb.PositionalAttention(
                "nope", num_heads=2, head_dim=4, query_temperature="llama4"
            ),
            "query_temperature must be a posemb.temperature object",
        ),
    ],
)
def test_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --- against transformers -------------------------------------------------------------------
#
# transformers forms both factors in float32 (positions.float()), so its layers, run in float64,
# agree with posemb's float64 factor to float32 rounding: the float32 row of the table.


def _hidden(batch, seq, seed=0):
    return torch.randn(batch, seq, HEADS * HEAD, generator=torch.Generator().manual_seed(seed))


def _causal(q_len, k_len):
    """Additive mask (1, 1, q_len, k_len): the queries are the last q_len of k_len tokens."""
    i = torch.arange(q_len)[:, None] + (k_len - q_len)
    future = torch.arange(k_len)[None, :] > i
    return torch.zeros(1, 1, q_len, k_len, dtype=F64).masked_fill(future, -math.inf)


def _heads(proj, x, heads):
    """(b, s, width) through a projection, split into (b, heads, s, HEAD)."""
    b, s, _ = x.shape
    return proj(x).view(b, s, heads, HEAD).transpose(1, 2)


def _posemb_layer(layer, x, pa, x_prefix=None, **kw):
    """transformers' projections around posemb's attention; ``x_prefix`` tokens are cached."""
    full = x if x_prefix is None else torch.cat([x_prefix, x], dim=1)
    q = _heads(layer.q_proj, x, HEADS)
    k, v = _heads(layer.k_proj, full, KV), _heads(layer.v_proj, full, KV)
    out = pa(q, k, v, **kw)  # (b, HEADS, s, HEAD)
    b, s, _ = x.shape
    return layer.o_proj(out.transpose(1, 2).reshape(b, s, HEADS * HEAD))


def _llama4(floor_scale=4, attn_scale=0.5, tuning=True):
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention

    config = transformers.Llama4TextConfig(
        vocab_size=16,
        hidden_size=HEADS * HEAD,
        intermediate_size=16,
        intermediate_size_mlp=16,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=KV,
        head_dim=HEAD,
        no_rope_layers=[1, 0],  # 1: RoPE; layer 1 is the NoPE layer
        attn_temperature_tuning=tuning,
        floor_scale=floor_scale,
        attn_scale=attn_scale,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return config, [Llama4TextAttention(config, i).double().eval() for i in range(2)]


def _nope_attention(temperature):
    return posemb.PositionalAttention(
        "nope", num_heads=HEADS, head_dim=HEAD, causal=True, query_temperature=temperature
    )


@torch.no_grad()
def test_llama4_nope_layer_matches_transformers_prefill_and_decode():
    config, (_, nope) = _llama4(floor_scale=4, attn_scale=0.5)
    from transformers import DynamicCache

    assert nope.use_rope == 0
    x = _hidden(2, 19).double()  # positions 0..18: factor steps at 3, 7, 11, 15
    theirs = nope(x, position_embeddings=None, attention_mask=_causal(19, 19))[0]
    temp = tp.Llama4AttnTemperature(floor_scale=4, attn_scale=0.5)
    assert_close(_posemb_layer(nope, x, _nope_attention(temp)), theirs, torch.float32)

    # With a cache, transformers takes positions from the cache's length: a prefill of 11 tokens
    # then 8 more at positions 11..18, which posemb's default positions give too.
    cache = DynamicCache(config=config)
    nope(x[:, :11], None, _causal(11, 11), cache=cache)
    step = nope(x[:, 11:], None, _causal(8, 19), cache=cache)[0]
    assert_close(step, theirs[:, 11:], torch.float32)
    ours = _posemb_layer(nope, x[:, 11:], _nope_attention(temp), x_prefix=x[:, :11])
    assert_close(ours, step, torch.float32)

    # The test can fail: a step one token off, or Mistral's p / L in place of (p + 1) / L.
    for wrong in (
        tp.Llama4AttnTemperature(floor_scale=5, attn_scale=0.5),
        tp.Llama4AttnTemperature(floor_scale=4, attn_scale=0.4),
        tp.Llama4ScalingBetaTemperature(beta=0.5, original_max_position_embeddings=4),
        None,
    ):
        got = _posemb_layer(nope, x, _nope_attention(wrong))
        assert not torch.allclose(got, theirs, **TOL[torch.float32]), wrong


@torch.no_grad()
def test_transformers_llama4_tempers_only_its_nope_layers():
    """The flag changes the NoPE layer and leaves the RoPE layer alone (what a config reader
    must know: the temperature belongs to the layers with ``no_rope_layers[i] == 0``)."""
    config, on = _llama4(tuning=True)
    from transformers.models.llama4.modeling_llama4 import Llama4TextRotaryEmbedding

    _, off = _llama4(tuning=False)
    x = _hidden(1, 19, seed=3).double()
    freqs = Llama4TextRotaryEmbedding(config)(x, torch.arange(19)[None])
    rope_on = on[0](x, freqs, _causal(19, 19))[0]
    rope_off = off[0](x, freqs, _causal(19, 19))[0]
    assert torch.equal(rope_on, rope_off)
    nope_off = off[1](x, None, _causal(19, 19))[0]
    assert not torch.allclose(on[1](x, None, _causal(19, 19))[0], nope_off)
    assert_close(_posemb_layer(off[1], x, _nope_attention(None)), nope_off, torch.float32)


def _ministral3(beta=0.3, original=4):
    transformers = pytest.importorskip("transformers")
    from transformers.models.ministral3.modeling_ministral3 import (
        Ministral3Attention,
        Ministral3RotaryEmbedding,
    )

    config = transformers.Ministral3Config(
        vocab_size=16,
        hidden_size=HEADS * HEAD,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=HEADS,
        num_key_value_heads=KV,
        head_dim=HEAD,
        max_position_embeddings=4 * original,
        # The shape of Ministral 3 / Devstral configs, with a short original length.
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": original,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "llama_4_scaling_beta": beta,
        },
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return config, Ministral3Attention(config, 0).double().eval(), Ministral3RotaryEmbedding(config)


@torch.no_grad()
def test_ministral3_attention_matches_transformers():
    _, layer, rotary = _ministral3(beta=0.3, original=4)
    x = _hidden(2, 13, seed=1).double()
    # Row 1 starts at position 6 (a continued or packed sequence): Mistral's factor follows the
    # position_ids given to RoPE, not the token index.
    pos = torch.stack([torch.arange(13), torch.arange(6, 19)])
    theirs = layer(x, rotary(x, pos), _causal(13, 13), position_ids=pos)[0]

    def ours(temperature):
        # The reference rotation: this test is about the factor, and needs no compiled kernel.
        yarn = posemb.scaling.Yarn(4.0, 4)
        rope = posemb.RotaryEmbedding(HEAD, base=10000.0, scaling=yarn, backend="reference")
        pa = posemb.PositionalAttention(
            rope, num_heads=HEADS, head_dim=HEAD, causal=True, query_temperature=temperature
        )
        return _posemb_layer(layer, x, pa, positions=pos, k_positions=pos)

    assert_close(ours(tp.Llama4ScalingBetaTemperature(0.3, 4)), theirs, torch.float32)
    for wrong in (
        tp.Llama4ScalingBetaTemperature(0.3, 5),
        tp.Llama4ScalingBetaTemperature(0.2, 4),
        tp.Llama4AttnTemperature(floor_scale=4, attn_scale=0.3),
        None,
    ):
        assert not torch.allclose(ours(wrong), theirs, **TOL[torch.float32]), wrong


def test_scaling_beta_factor_matches_transformers_function():
    pytest.importorskip("transformers")
    from transformers.models.ministral3.modeling_ministral3 import get_llama_4_attn_scale

    pos = torch.arange(0, 2**20, 331)[None]
    for beta, length in ((0.1, 16384), (0.1, 8192), (0.3, 3), (0.0, 4096)):
        theirs = get_llama_4_attn_scale(pos, beta, length)[:, 0, :, 0]  # (1, 1, seq, 1) in
        ours = tp.llama4_scaling_beta_temperature(
            pos, beta=beta, original_max_position_embeddings=length
        )
        assert_close(theirs, ours, torch.float32)
