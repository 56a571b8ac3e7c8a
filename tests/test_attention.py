import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posemb
from tolerances import TOL, assert_close

F64 = torch.float64


def _qkv(b=2, h=4, hk=2, sq=7, sk=7, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(b, h, sq, d, generator=g, dtype=F64),
        torch.randn(b, hk, sk, d, generator=g, dtype=F64),
        torch.randn(b, hk, sk, d + 3, generator=g, dtype=F64),
    )


@pytest.mark.parametrize("causal", [False, True])
def test_matches_torch_sdpa(causal):
    q, k, v = _qkv()
    bias = torch.randn(1, 4, 7, 7, dtype=F64)
    want = torch.nn.functional.scaled_dot_product_attention(
        q,
        k.repeat_interleave(2, 1),
        v.repeat_interleave(2, 1),
        attn_mask=bias
        if not causal
        else bias + torch.full((7, 7), float("-inf"), dtype=F64).triu(1),
    )
    torch.testing.assert_close(
        posemb.dot_product_attention(q, k, v, causal=causal, bias=bias), want, **TOL[F64]
    )


def test_decode_step_sees_the_whole_cache():
    q, k, v = _qkv(sq=9, sk=9)
    full = posemb.dot_product_attention(q, k, v, causal=True)
    step = posemb.dot_product_attention(q[:, :, -1:], k, v, causal=True)
    torch.testing.assert_close(step, full[:, :, -1:], **TOL[F64])


@given(st.permutations(list(range(6))))
def test_permutation_equivariance(perm):
    q, k, v = _qkv(sq=6, sk=6, hk=4, seed=1)
    p = torch.tensor(perm)
    out = posemb.dot_product_attention(q[:, :, p], k[:, :, p], v[:, :, p])
    torch.testing.assert_close(out, posemb.dot_product_attention(q, k, v)[:, :, p], **TOL[F64])
    mat = posemb.permutation_matrix(p)
    torch.testing.assert_close(mat @ q[0, 0], q[0, 0, p], rtol=0, atol=0)


def test_probabilities_rows_sum_to_one_and_respect_mask():
    q, k, _ = _qkv(sq=5, sk=8)
    p = posemb.attention_probs(q, k, causal=True)
    torch.testing.assert_close(p.sum(-1), torch.ones(2, 4, 5, dtype=F64))
    # Query i of the last 5 sits at position i + 3 and sees keys 0..i+3.
    assert float(p[..., 0, 4:].abs().max()) == 0.0
    assert float(p[..., 0, :4].min()) > 0.0


@pytest.mark.parametrize(
    "call,match",
    [
        (
            lambda: posemb.dot_product_attention(*_qkv(h=3, hk=2)),
            r"q heads \(3\) must be a multiple of k heads \(2\)",
        ),
        (
            lambda: posemb.dot_product_attention(*_qkv(sq=9, sk=4), causal=True),
            "causal attention needs q_len <= k_len",
        ),
        (
            lambda: posemb.dot_product_attention(_qkv()[0][0], *_qkv()[1:]),
            r"q and k must have shape \(batch, heads, seq, head_dim\)",
        ),
        (
            lambda: posemb.dot_product_attention(_qkv()[0][..., :4], *_qkv()[1:]),
            "q and k must share batch and head_dim",
        ),
        (
            lambda: posemb.dot_product_attention(*_qkv()[:2], _qkv()[2][:, :, :3]),
            "v must have shape",
        ),
        (
            lambda: posemb.dot_product_attention(*_qkv(), bias=torch.zeros(3, 3, dtype=F64)),
            "bias of shape",
        ),
        (
            lambda: posemb.dot_product_attention(*_qkv(), bias=torch.zeros(7, 7, dtype=torch.long)),
            "bias must have a floating dtype",
        ),
        (lambda: posemb.permutation_matrix([0, 0, 1]), "perm must be a permutation of 0..2"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --- PositionalAttention -------------------------------------------------------------------------

from posemb.attention import ATTENTION_ENCODINGS  # noqa: E402


def naive(pa, q, k, v, qp, kp, pad=None):
    """Softmax attention written out: rotate or bias, mask by positions, no SDPA."""
    if pa.kind == "rotary":
        q, k = pa.encoding.rotate(q, qp), pa.encoding.rotate(k, kp)
    elif pa.kind == "xpos":
        q, k = pa.encoding(q, k, qp, k_positions=kp)
    bias = torch.zeros(1, 1, q.shape[2], k.shape[2], dtype=q.dtype)
    if pa.kind == "bias":
        bias = bias + pa.encoding(qp, kp).to(q.dtype)
    if pa.causal:
        bias = bias.masked_fill(kp[None, :] > qp[:, None], float("-inf"))
    if pad is not None:
        bias = bias.masked_fill(pad[:, None, None, :], float("-inf"))
    if pa.kind == "cope":  # its gates read the masked content logits (tests/test_cope.py)
        kk = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        logits = q @ kk.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias
        bias = bias + pa.encoding(q, logits)
    return posemb.dot_product_attention(q, k, v, bias=bias)


# The settings an encoding cannot do without, and a CoPE table that is not zero (its default,
# which would add nothing and test nothing).
REQUIRED = {"cope": {"max_positions": 6, "init_std": 0.5}, "fope": {"train_len": 8}}


def _pa(encoding, **kwargs):
    return posemb.PositionalAttention(encoding, **kwargs, **REQUIRED.get(encoding, {}))


@pytest.mark.parametrize("encoding", ATTENTION_ENCODINGS)
@pytest.mark.parametrize("causal", [False, True])
def test_positional_attention_matches_naive_softmax(encoding, causal):
    torch.manual_seed(0)
    pa = _pa(encoding, num_heads=4, head_dim=8, causal=causal).double()
    q, k, v = _qkv(b=2, h=4, hk=2, sq=7, sk=7, d=8)
    v = v[..., :8]
    pos = torch.arange(7)
    torch.testing.assert_close(pa(q, k, v), naive(pa, q, k, v, pos, pos), **TOL[F64])
    # Offset positions and a padded key.
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, 2] = True
    qp, kp = torch.arange(50, 57), torch.arange(50, 57)
    got = pa(q, k, v, positions=qp, k_positions=kp, key_padding_mask=pad)
    torch.testing.assert_close(got, naive(pa, q, k, v, qp, kp, pad), **TOL[F64])


@pytest.mark.parametrize("encoding", ATTENTION_ENCODINGS)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_weights_are_what_forward_multiplies_v_by(encoding, causal):
    torch.manual_seed(0)
    temp = posemb.temperature.Llama4AttnTemperature(floor_scale=4, attn_scale=0.5)
    pa = _pa(encoding, num_heads=4, head_dim=8, causal=causal, query_temperature=temp).double()
    q, k, v = _qkv(b=2, h=4, hk=2, sq=5, sk=7, d=8)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, 2] = True
    calls = [
        {},  # the fast path: SDPA's own causal flag, no mask
        {"positions": torch.arange(50, 55), "k_positions": torch.arange(48, 55)},
        {"key_padding_mask": pad},
    ]
    for kwargs in calls:
        if not kwargs and causal:
            qq, kk, vv = q, k[:, :, :5], v[:, :, :5]  # the fast causal path needs q_len == k_len
        else:
            qq, kk, vv = q, k, v
        w = pa.attention_weights(qq, kk, **kwargs)
        assert w.shape == (2, 4, qq.shape[2], kk.shape[2])
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:3], dtype=F64), **TOL[F64])
        want = pa(qq, kk, vv, **kwargs)
        torch.testing.assert_close(w @ vv.repeat_interleave(2, 1), want, **TOL[F64])
    if causal:  # a later key gets exactly zero weight
        weights = pa.attention_weights(q[:, :, :5], k[:, :, :5]).detach()
        assert float(weights[..., 0, 1:].abs().max()) == 0


@pytest.mark.parametrize("encoding", ATTENTION_ENCODINGS)
def test_decoding_token_by_token_equals_full_forward(encoding):
    torch.manual_seed(1)
    pa = _pa(encoding, num_heads=4, head_dim=8, causal=True).double()
    q, k, v = _qkv(b=2, h=4, hk=1, sq=11, sk=11, d=8, seed=2)
    full = pa(q, k, v)
    steps = [pa(q[:, :, t : t + 1], k[:, :, : t + 1], v[:, :, : t + 1]) for t in range(11)]
    torch.testing.assert_close(torch.cat(steps, dim=2), full, **TOL[F64])


def test_nope_is_blind_and_alibi_encoding_objects():
    nope = posemb.PositionalAttention("nope", num_heads=2, head_dim=4)
    q, k, v = _qkv(b=1, h=2, hk=2, sq=5, sk=5, d=4)
    perm = torch.tensor([3, 0, 4, 1, 2])
    out = nope(q.float(), k.float(), v[..., :4].float())
    permuted = nope(q[:, :, perm].float(), k[:, :, perm].float(), v[:, :, perm, :4].float())
    torch.testing.assert_close(permuted, out[:, :, perm])
    alibi = posemb.PositionalAttention(posemb.AlibiBias(2), num_heads=2, head_dim=4)
    assert alibi.kind == "bias"


@pytest.mark.parametrize(
    "call,match",
    [
        (
            lambda: posemb.PositionalAttention("rotary", num_heads=2, head_dim=4),
            "unknown encoding 'rotary'; known: nope, rope, xpos, alibi, t5, fire",
        ),
        (
            lambda: posemb.PositionalAttention("sinusoidal", num_heads=2, head_dim=4),
            "added to the token embeddings",
        ),
        (
            lambda: posemb.PositionalAttention(torch.nn.Linear(2, 2), num_heads=2, head_dim=4),
            "encoding must be a name",
        ),
        (
            lambda: posemb.PositionalAttention(posemb.AlibiBias(3), num_heads=2, head_dim=4),
            "the bias encoding has 3 heads",
        ),
        (
            lambda: posemb.PositionalAttention("alibi", num_heads=0, head_dim=4),
            "num_heads must be a positive integer",
        ),
        (
            lambda: posemb.PositionalAttention("t5", num_heads=2, head_dim=4, num_buckets=1),
            "num_buckets must be >= 4",
        ),
        (
            lambda: posemb.PositionalAttention("rope", num_heads=2, head_dim=4)(
                *_qkv(h=2, hk=2, d=8)
            ),
            "head_dim 4",
        ),
        (
            lambda: posemb.PositionalAttention("rope", num_heads=4, head_dim=8)(
                *_qkv(h=4, hk=3, d=8)
            ),
            "kv_heads dividing 4",
        ),
        (
            lambda: posemb.PositionalAttention("nope", num_heads=4, head_dim=8)(
                *_qkv(), key_padding_mask=torch.zeros(2, 7)
            ),
            "key_padding_mask must be a bool tensor of shape",
        ),
        (
            lambda: posemb.PositionalAttention("nope", num_heads=4, head_dim=8)(
                *_qkv(), positions=torch.arange(3)
            ),
            r"positions must have shape \(7,\)",
        ),
    ],
)
def test_positional_attention_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("encoding", ["nope", "rope", "alibi"])
def test_gqa_and_masks_reach_sdpa_as_they_are(monkeypatch, encoding):
    """k and v keep their kv_heads (SDPA groups them itself), and a mask with no bias stays a
    boolean mask rather than a float tensor of -inf."""
    import torch.nn.functional as F

    seen = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append((k.shape[1], v.shape[1], kw.get("attn_mask"), kw.get("enable_gqa")))
        return real(q, k, v, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    pa = _pa(encoding, num_heads=4, head_dim=8, causal=True).double()
    q, k, v = _qkv(b=2, h=4, hk=1, sq=6, sk=6, d=8)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[0, 1] = True
    out = pa(q, k, v[..., :8], key_padding_mask=pad)
    torch.testing.assert_close(
        out, naive(pa, q, k, v[..., :8], torch.arange(6), torch.arange(6), pad), **TOL[F64]
    )
    k_heads, v_heads, mask, gqa = seen[-1]
    assert (k_heads, v_heads, gqa) == (1, 1, True)
    if encoding == "alibi":
        assert mask.dtype == torch.float64  # a bias is a float tensor by nature
    else:
        assert mask.dtype == torch.bool


# --- query temperature ---------------------------------------------------------------------------

TEMPERATURES = [
    posemb.temperature.Llama4AttnTemperature(floor_scale=4, attn_scale=0.5),
    posemb.temperature.Llama4ScalingBetaTemperature(beta=0.3, original_max_position_embeddings=3),
]


def _scaled(q, temperature, qp):
    """q times the factor at each query's position, in float64."""
    f = temperature.factor(qp)
    return q * (f[:, None, :, None] if f.dim() == 2 else f[:, None])


@pytest.mark.parametrize("temperature", TEMPERATURES, ids=lambda t: t.kind)
@pytest.mark.parametrize("encoding", ATTENTION_ENCODINGS)
def test_query_temperature_scales_each_query_at_its_position(encoding, temperature):
    if encoding == "cope":
        pytest.skip(
            "CoPE's gates read the untempered logits, so scaling q first is not its reference: "
            "tests/test_logit_modifiers.py holds it against its own"
        )
    pa = _pa(encoding, num_heads=4, head_dim=8, causal=True, query_temperature=temperature).double()
    plain = _pa(encoding, num_heads=4, head_dim=8, causal=True).double()
    plain.load_state_dict(pa.state_dict())
    q, k, v = _qkv(b=2, h=4, hk=2, sq=13, sk=13, d=8, seed=3)
    v = v[..., :8]
    pos = torch.arange(13)
    # Scaling a query commutes with its rotation (both act on the query alone), so the
    # temperature can be applied before the naive path rotates.
    want = naive(plain, _scaled(q, temperature, pos), k, v, pos, pos)
    torch.testing.assert_close(pa(q, k, v), want, **TOL[F64])
    # Offset and per-row positions: the factor is taken at the positions RoPE uses.
    qp = torch.stack([torch.arange(20, 33), torch.arange(5, 18)])
    got = pa(q, k, v, positions=qp, k_positions=qp)
    for row in range(2):
        want = naive(
            plain,
            _scaled(q[row : row + 1], temperature, qp[row]),
            k[row : row + 1],
            v[row : row + 1],
            qp[row],
            qp[row],
        )
        torch.testing.assert_close(got[row : row + 1], want, **TOL[F64])


@pytest.mark.parametrize("temperature", TEMPERATURES, ids=lambda t: t.kind)
def test_query_temperature_agrees_with_attention_probs_and_decoding(temperature):
    pa = posemb.PositionalAttention(
        "rope", num_heads=4, head_dim=8, causal=True, query_temperature=temperature
    ).double()
    q, k, v = _qkv(b=2, h=4, hk=1, sq=11, sk=11, d=8, seed=4)
    full = pa(q, k, v)
    pos = torch.arange(11)
    qr = pa.encoding.rotate(_scaled(q, temperature, pos), pos)
    probs = posemb.attention_probs(qr, pa.encoding.rotate(k, pos), causal=True)
    torch.testing.assert_close(full, probs @ v.repeat_interleave(4, dim=1), **TOL[F64])
    # One token at a time over a growing cache: each query is tempered at its own position.
    steps = [pa(q[:, :, t : t + 1], k[:, :, : t + 1], v[:, :, : t + 1]) for t in range(11)]
    torch.testing.assert_close(torch.cat(steps, dim=2), full, **TOL[F64])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, F64])
def test_query_temperature_in_every_dtype(monkeypatch, dtype):
    """The queries SDPA sees are the exact products, rounded to q's dtype (the factor and
    product in float32 for the half types: at most one float32 rounding more)."""
    import torch.nn.functional as F

    seen = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append(q)
        return real(q, k, v, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    temperature = TEMPERATURES[0]
    pa = posemb.PositionalAttention("nope", num_heads=4, head_dim=8, query_temperature=temperature)
    q, k, v = (t.to(dtype) for t in _qkv(sq=9, sk=9, seed=5))
    out = pa(q, k, v)
    assert out.dtype == dtype
    want = _scaled(q.double(), temperature, torch.arange(9))
    assert seen[-1].dtype == dtype
    assert_close(seen[-1], want, dtype)
    # Without a temperature, the module's queries reach SDPA untouched; attn_scale 0 is 1.
    no_temp = posemb.PositionalAttention("nope", num_heads=4, head_dim=8)
    assert torch.equal(no_temp(q, k, v), real(q, k, v, enable_gqa=True))
    one = posemb.temperature.Llama4AttnTemperature(floor_scale=4, attn_scale=0.0)
    same = posemb.PositionalAttention("nope", num_heads=4, head_dim=8, query_temperature=one)
    assert torch.equal(same(q, k, v), no_temp(q, k, v))
    assert "query_temperature=Llama4AttnTemperature(floor_scale=4, attn_scale=0.5)" in repr(pa)
    assert "query_temperature" not in repr(no_temp)


# --- a query that sees no key: one rule (issue 30, item 9) -------------------------------------


@pytest.mark.parametrize("encoding", ATTENTION_ENCODINGS)
def test_a_query_that_sees_no_key_gets_zeros_everywhere(encoding):
    # Causal with more queries than keys returned zero rows from forward and NaN rows from
    # attention_weights, while attention_probs refused: now the default geometry is refused
    # by all three, and a query that sees nothing is zeros in all three.
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, 8, generator=g) for n in (5, 3, 3))
    attn = _pa(encoding, num_heads=2, head_dim=8, causal=True)
    for call in (lambda: attn(q, k, v), lambda: attn.attention_weights(q, k)):
        with pytest.raises(ValueError, match="causal attention needs q_len <= k_len"):
            call()
    with pytest.raises(ValueError, match="causal attention needs q_len <= k_len"):
        posemb.attention_probs(q, k, causal=True)
    pos = torch.tensor([[-2, -1, 0, 1, 2], [0, 1, 2, 3, 4]])  # row 0: two queries before every key
    pad = torch.tensor([[False, False, False], [True, True, True]])  # row 1: every key padding
    out = attn(q, k, v, positions=pos, key_padding_mask=pad)
    w = attn.attention_weights(q, k, positions=pos, key_padding_mask=pad)
    assert torch.isfinite(w).all() and torch.isfinite(out).all()
    assert (w[0, :, :2] == 0).all() and (out[0, :, :2] == 0).all()
    assert (w[1] == 0).all() and (out[1] == 0).all()
    assert torch.allclose(w[0, :, 2:].sum(-1), torch.ones(2, 3))
    assert_close(out, w @ v.float(), torch.float32)


def test_attention_probs_gives_zeros_for_a_hidden_row_and_keeps_nan():
    q, k = torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    bias = torch.zeros(3, 3)
    bias[1] = float("-inf")
    p = posemb.attention_probs(q, k, bias=bias)
    assert (p[0, 0, 1] == 0).all() and torch.allclose(p[0, 0, [0, 2]].sum(-1), torch.ones(2))
    q[0, 0, 2, 0] = float("nan")  # a NaN is a bug upstream: it must still show
    assert torch.isnan(posemb.attention_probs(q, k, bias=bias)[0, 0, 2]).all()


def test_a_hidden_row_leaves_the_gradients_finite():
    # The zero row was a NaN softmax underneath: backward carried NaN into all of k.grad, even
    # from a loss on the healthy row only (SDPA's gradients are finite).
    q = torch.randn(1, 1, 2, 4, requires_grad=True)
    k = torch.randn(1, 1, 3, 4, requires_grad=True)
    bias = torch.zeros(1, 1, 2, 3)
    bias[..., 0, :] = float("-inf")
    posemb.attention_probs(q, k, bias=bias)[:, :, 1].sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()
    assert (q.grad[0, 0, 0] == 0).all()


def test_explicit_positions_near_int64_are_refused_not_masked_wrong():
    # The causal mask subtracts positions: q at 2^62 and keys near -2^62 gave an all-zero output.
    attn = posemb.PositionalAttention("nope", num_heads=1, head_dim=4, causal=True)
    q, k = torch.randn(1, 1, 1, 4), torch.randn(1, 1, 2, 4)
    with pytest.raises(ValueError, match="positions must lie within"):
        attn(
            q,
            k,
            k,
            positions=torch.tensor([1 << 62]),
            k_positions=torch.tensor([-(1 << 62) - 1, -(1 << 62) - 2]),
        )
