"""Attention sinks (gpt-oss) and scalable softmax (SSMax): the two logit modifiers.

Sinks are checked against transformers' own gpt-oss attention; SSMax against its definition
written out one query at a time.
"""

import copy
import math
import pickle

import pytest
import torch
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

import posemb
from posemb.temperature import ScalableSoftmax, ssmax_factor
from tolerances import TOL, assert_close

F64 = torch.float64


class _GptOssLike(torch.nn.Module):
    """What gpt-oss's eager attention reads from its module: sinks, the GQA group, the mode."""

    def __init__(self, sinks, groups):
        super().__init__()
        self.sinks = torch.nn.Parameter(sinks)
        self.num_key_value_groups = groups
        self.eval()


def _qkv(b=2, h=4, hk=2, sq=6, sk=6, d=8, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, sq, d, generator=g, dtype=dtype)
    k = torch.randn(b, hk, sk, d, generator=g, dtype=dtype)
    v = torch.randn(b, hk, sk, d, generator=g, dtype=dtype)
    return q, k, v


def _additive_causal(sq, sk, dtype):
    i = torch.arange(sq)[:, None] + (sk - sq)
    mask = torch.zeros(sq, sk, dtype=dtype).masked_fill(torch.arange(sk) > i, float("-inf"))
    return mask[None, None]


@pytest.mark.parametrize("sq,sk", [(6, 6), (1, 9), (3, 5)])
def test_sinks_match_transformers_gpt_oss_attention(sq, sk):
    q, k, v = _qkv(sq=sq, sk=sk)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=F64)
    ref, ref_w = eager_attention_forward(
        _GptOssLike(sinks, 2), q, k, v, _additive_causal(sq, sk, F64), scaling=8**-0.5
    )
    got = posemb.dot_product_attention(q, k, v, causal=True, sinks=sinks)
    torch.testing.assert_close(got, ref.transpose(1, 2), **TOL[F64])
    w = posemb.attention_probs(q, k, causal=True, sinks=sinks)
    torch.testing.assert_close(w, ref_w, **TOL[F64])
    assert bool((w.sum(-1) < 1).all())  # the sink takes a share of every row
    pa = posemb.PositionalAttention("nope", num_heads=4, head_dim=8, causal=True, sinks=True)
    pa = pa.double()
    with torch.no_grad():
        pa.sinks.copy_(sinks)
    torch.testing.assert_close(pa(q, k, v), ref.transpose(1, 2), **TOL[F64])
    torch.testing.assert_close(pa.attention_weights(q, k), ref_w, **TOL[F64])


@pytest.mark.parametrize("encoding", ["rope", "alibi"])
def test_sinks_with_an_encoding_padding_and_positions_match_the_weights(encoding):
    torch.manual_seed(0)
    pa = posemb.PositionalAttention(encoding, num_heads=4, head_dim=8, causal=True, sinks=True)
    pa = pa.double()
    with torch.no_grad():
        pa.sinks.normal_()
    q, k, v = _qkv(sq=4, sk=6)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, :3] = True  # left padding
    for kwargs in (
        {},
        {"key_padding_mask": pad},
        {"positions": torch.arange(10, 14), "k_positions": torch.arange(8, 14)},
    ):
        w = pa.attention_weights(q, k, **kwargs)
        want = torch.matmul(w, v.repeat_interleave(2, dim=1))
        torch.testing.assert_close(pa(q, k, v, **kwargs), want, **TOL[F64])


def test_a_query_that_sees_nothing_gives_zeros_with_sinks_and_no_nan_gradients():
    pa = posemb.PositionalAttention("nope", num_heads=2, head_dim=4, causal=True, sinks=True)
    q, k, v = (torch.randn(1, 2, 3, 4, requires_grad=True) for _ in range(3))
    pad = torch.ones(1, 3, dtype=torch.bool)
    out = pa(q, k, v, key_padding_mask=pad)
    assert torch.equal(out, torch.zeros_like(out))
    w = pa.attention_weights(q, k, key_padding_mask=pad)
    assert torch.equal(w, torch.zeros_like(w))
    (out.sum() + w.sum()).backward()
    for t in (q, k, v, pa.sinks):
        assert bool(torch.isfinite(t.grad).all())


def test_learned_sinks_train_and_copy():
    torch.manual_seed(0)
    pa = posemb.PositionalAttention("rope", num_heads=2, head_dim=4, causal=True, sinks=True)
    assert pa.sinks.shape == (2,) and bool((pa.sinks == 0).all())
    assert "sinks" in dict(pa.named_parameters()) and "sinks=True" in repr(pa)
    q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))
    pa(q, k, v).square().sum().backward()
    assert pa.sinks.grad is not None and bool(pa.sinks.grad.ne(0).all())
    for other in (copy.deepcopy(pa), pickle.loads(pickle.dumps(pa))):
        torch.testing.assert_close(other(q, k, v), pa(q, k, v))
    # Without sinks there is no parameter, and the result is the plain attention's.
    plain = posemb.PositionalAttention("rope", num_heads=2, head_dim=4, causal=True)
    assert plain.sinks is None and "sinks" not in dict(plain.named_parameters())


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: posemb.PositionalAttention(num_heads=2, head_dim=4, sinks=1), "sinks must be"),
        (
            lambda: posemb.attention_probs(
                torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), sinks=torch.zeros(3)
            ),
            r"sinks must have shape \(heads,\) = \(2,\)",
        ),
    ],
)
def test_bad_sinks_are_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --- SSMax ---------------------------------------------------------------------------------------


def ssmax_by_hand(q, k, v, s, visible_mask):
    """softmax(s_h ln(n_i) q_i.k_j / sqrt(d)) over the keys query i sees, one (b, h, i) at a
    time; n_i is how many keys that is."""
    b, h, sq, d = q.shape
    out = torch.zeros(b, h, sq, v.shape[-1], dtype=F64)
    group = h // k.shape[1]
    for bi in range(b):
        for hi in range(h):
            for i in range(sq):
                seen = [j for j in range(k.shape[2]) if visible_mask[bi, i, j]]
                if not seen:
                    continue
                f = float(s[hi]) * math.log(len(seen))
                logits = torch.stack([f * q[bi, hi, i] @ k[bi, hi // group, j] for j in seen])
                p = torch.softmax(logits / math.sqrt(d), dim=0)
                out[bi, hi, i] = sum(p[t] * v[bi, hi // group, j] for t, j in enumerate(seen))
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_ssmax_matches_its_definition_with_padding_and_decode(causal):
    s = torch.tensor([0.43, 0.2, 1.0, 0.7], dtype=F64)
    ss = ScalableSoftmax(4).double()
    with torch.no_grad():
        ss.s.copy_(s)
    pa = posemb.PositionalAttention(
        "nope", num_heads=4, head_dim=8, causal=causal, query_temperature=ss
    )
    q, k, v = _qkv(sq=6, sk=6)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, :2] = True
    tri = torch.ones(6, 6).tril().bool() if causal else torch.ones(6, 6, dtype=torch.bool)
    for p in (None, pad):
        vis = tri[None].expand(2, 6, 6) & (~p[:, None, :] if p is not None else True)
        want = ssmax_by_hand(q, k, v, s, vis)
        torch.testing.assert_close(pa(q, k, v, key_padding_mask=p), want, **TOL[F64])
        w = pa.attention_weights(q, k, key_padding_mask=p)
        torch.testing.assert_close(w @ v.repeat_interleave(2, dim=1), want, **TOL[F64])
    # A decode step: the last query over the cache is the last row of the full forward.
    step = pa(q[:, :, -1:], k, v)
    torch.testing.assert_close(step, pa(q, k, v)[:, :, -1:], **TOL[F64])


def test_ssmax_factor_by_hand_and_gradients():
    s = torch.tensor([0.5, 2.0])
    f = ssmax_factor(torch.tensor([[1, 2, 64]]), s)
    want = (
        torch.tensor([[[0.0, 0.5 * math.log(2), 0.5 * math.log(64)]]])
        * torch.tensor([1.0, 4.0])[None, :, None]
    )
    assert f.shape == (1, 2, 3)
    assert_close(f, want, torch.float32)
    ss = ScalableSoftmax(2, init_s=0.3)
    pa = posemb.PositionalAttention(
        "rope", num_heads=2, head_dim=4, causal=True, query_temperature=ss
    )
    q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))
    pa(q, k, v).square().sum().backward()
    assert ss.s.grad is not None and bool(ss.s.grad.ne(0).all())
    assert "query_temperature.s" in dict(pa.named_parameters())
    fixed = ScalableSoftmax(2, learnable=False)
    assert "s" in dict(fixed.named_buffers()) and not list(fixed.parameters())
    for other in (copy.deepcopy(pa), pickle.loads(pickle.dumps(pa))):
        torch.testing.assert_close(other(q, k, v), pa(q, k, v))


def test_ssmax_bf16_within_the_table():
    ss = ScalableSoftmax(4)
    pa = posemb.PositionalAttention(
        "rope", num_heads=4, head_dim=8, causal=True, query_temperature=ss
    )
    q, k, v = (t.bfloat16() for t in _qkv(dtype=torch.float32))
    got = pa(q, k, v)
    assert got.dtype == torch.bfloat16
    # The same bf16 values in float64: only posemb's own rounding separates the two.
    assert_close(got, pa.double()(q.double(), k.double(), v.double()), torch.bfloat16)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: ScalableSoftmax(2, init_s=0.0), "init_s"),
        (lambda: ScalableSoftmax(0), "num_heads"),
        (
            lambda: posemb.PositionalAttention(
                num_heads=4, head_dim=8, query_temperature=ScalableSoftmax(2)
            ),
            "query_temperature has 2 heads, attention has 4",
        ),
        (lambda: ssmax_factor(torch.ones(2), torch.ones(2, 2)), r"s must have shape \(heads,\)"),
    ],
)
def test_bad_ssmax_settings_are_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("window", [1, 3, 10])
def test_sliding_window_with_sinks_matches_gpt_oss_sliding_layers(window):
    """gpt-oss alternates full and sliding-window layers, both with sinks."""
    q, k, v = _qkv(sq=7, sk=7, seed=3)
    sinks = torch.tensor([1.0, -0.5, 0.0, 3.0], dtype=F64)
    i, j = torch.arange(7)[:, None], torch.arange(7)[None, :]
    hidden = (j > i) | (j <= i - window)
    mask = torch.zeros(7, 7, dtype=F64).masked_fill(hidden, float("-inf"))[None, None]
    ref, _ = eager_attention_forward(_GptOssLike(sinks, 2), q, k, v, mask, scaling=8**-0.5)
    pa = posemb.PositionalAttention(
        "nope", num_heads=4, head_dim=8, causal=True, sinks=True, window=window
    ).double()
    with torch.no_grad():
        pa.sinks.copy_(sinks)
    torch.testing.assert_close(pa(q, k, v), ref.transpose(1, 2), **TOL[F64])
    # Without sinks, a window of 1 sees only its own key: the output is v itself.
    if window == 1:
        plain = posemb.PositionalAttention("rope", num_heads=4, head_dim=8, causal=True, window=1)
        torch.testing.assert_close(plain.double()(q, k, v), v.repeat_interleave(2, dim=1))


def test_a_window_needs_causal_attention_and_a_positive_size():
    with pytest.raises(ValueError, match="window=4 needs causal=True"):
        posemb.PositionalAttention(num_heads=2, head_dim=4, window=4)
    with pytest.raises(ValueError, match="window"):
        posemb.PositionalAttention(num_heads=2, head_dim=4, causal=True, window=0)


# --- what the review found (each failed before its fix) ------------------------------------------


def test_cope_counts_from_the_content_logits_and_a_temperature_scales_its_whole_logit():
    torch.manual_seed(0)
    cope = posemb.CoPE(8, 9, init_std=1.0).double()
    ss = ScalableSoftmax(4).double()
    pa = posemb.PositionalAttention(
        cope, num_heads=4, head_dim=8, causal=True, query_temperature=ss
    )
    q, k, v = _qkv(hk=4, sq=7, sk=7, seed=5)
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    content = (q @ k.transpose(-1, -2) / math.sqrt(8)).masked_fill(~causal, float("-inf"))
    term = cope(q, content)  # its gates read the content logits, untempered

    def attend(f):  # f times each query's whole logit, then the mask (0 x -inf is no logit)
        return torch.softmax((f * (content + term)).masked_fill(~causal, float("-inf")), -1) @ v

    want = attend(ssmax_factor(torch.arange(1, 8), ss.s.detach())[..., None])  # (1, 4, 7, 1)
    torch.testing.assert_close(pa(q, k, v), want, **TOL[F64])
    temp = posemb.temperature.Llama4AttnTemperature(floor_scale=3, attn_scale=0.5)
    pa = posemb.PositionalAttention(
        cope, num_heads=4, head_dim=8, causal=True, query_temperature=temp
    )
    want = attend(temp.factor(torch.arange(7))[None, None, :, None])
    torch.testing.assert_close(pa(q, k, v), want, **TOL[F64])


def test_sinks_are_checked_in_forward_and_must_be_finite():
    pa = posemb.PositionalAttention("nope", num_heads=4, head_dim=8, causal=True, sinks=True)
    q, k, v = _qkv(dtype=torch.float32)
    pa.sinks = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match=r"sinks must have shape \(heads,\) = \(4,\)"):
        pa(q, k, v)
    with pytest.raises(ValueError, match="sinks must be finite"):
        posemb.attention_probs(q, k, sinks=torch.tensor([0.0, float("-inf"), 0.0, 0.0]))


def test_settings_an_encoding_cannot_do_without_are_refused_by_name():
    with pytest.raises(ValueError, match="'cope' needs max_positions="):
        posemb.PositionalAttention("cope", num_heads=4, head_dim=8)
    with pytest.raises(ValueError, match="'fope' needs train_len="):
        posemb.PositionalAttention("fope", num_heads=4, head_dim=8)
    fope = posemb.FourierRotaryEmbedding(8, train_len=16, num_heads=3)
    with pytest.raises(ValueError, match="FoPE has 3 coefficient sets"):
        posemb.PositionalAttention(fope, num_heads=4, head_dim=8)
    with pytest.raises(ValueError, match="learnable must be True or False"):
        ScalableSoftmax(4, learnable=1)
