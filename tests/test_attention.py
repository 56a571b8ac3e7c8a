import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posemb
from tolerances import TOL

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
        posemb.attention(q, k, v, causal=causal, bias=bias), want, **TOL[F64]
    )


def test_decode_step_sees_the_whole_cache():
    q, k, v = _qkv(sq=9, sk=9)
    full = posemb.attention(q, k, v, causal=True)
    step = posemb.attention(q[:, :, -1:], k, v, causal=True)
    torch.testing.assert_close(step, full[:, :, -1:], **TOL[F64])


@given(st.permutations(list(range(6))))
def test_permutation_equivariance(perm):
    q, k, v = _qkv(sq=6, sk=6, hk=4, seed=1)
    p = torch.tensor(perm)
    out = posemb.attention(q[:, :, p], k[:, :, p], v[:, :, p])
    torch.testing.assert_close(out, posemb.attention(q, k, v)[:, :, p], **TOL[F64])
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
            lambda: posemb.attention(*_qkv(h=3, hk=2)),
            r"q heads \(3\) must be a multiple of k heads \(2\)",
        ),
        (
            lambda: posemb.attention(*_qkv(sq=9, sk=4), causal=True),
            "causal attention needs q_len <= k_len",
        ),
        (
            lambda: posemb.attention(_qkv()[0][0], *_qkv()[1:]),
            r"q and k must have shape \(batch, heads, seq, head_dim\)",
        ),
        (
            lambda: posemb.attention(_qkv()[0][..., :4], *_qkv()[1:]),
            "q and k must share batch and head_dim",
        ),
        (lambda: posemb.attention(*_qkv()[:2], _qkv()[2][:, :, :3]), "v must have shape"),
        (lambda: posemb.attention(*_qkv(), bias=torch.zeros(3, 3, dtype=F64)), "bias of shape"),
        (
            lambda: posemb.attention(*_qkv(), bias=torch.zeros(7, 7, dtype=torch.long)),
            "bias must have a floating dtype",
        ),
        (lambda: posemb.permutation_matrix([0, 0, 1]), "perm must be a permutation of 0..2"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
