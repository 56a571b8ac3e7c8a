import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import T5Config
from transformers.models.t5.modeling_t5 import T5Attention

import posemb
from devices import device_of
from posemb.bias import relative_positions
from tolerances import TOL, assert_close

F64 = torch.float64


def published_slopes(n):
    """Press et al.'s rule restated: 2^(-8i/m) for the m = 2^floor(log2 n) heads, then the odd
    steps 2^(-8(2i+1)/(2m)) of the next power of two."""
    m = 2 ** math.floor(math.log2(n))
    return [2 ** (-8 * (i + 1) / m) for i in range(m)] + [
        2 ** (-8 * (2 * i + 1) / (2 * m)) for i in range(n - m)
    ]


@pytest.mark.parametrize("n", range(1, 65))
def test_alibi_slopes_follow_the_published_rule(n):
    got = posemb.alibi_slopes(n)
    assert got.shape == (n,)
    torch.testing.assert_close(
        got, torch.tensor(published_slopes(n), dtype=F64), rtol=1e-14, atol=0
    )


def test_alibi_slopes_for_12_heads():
    extra = posemb.alibi_slopes(12)[8:]
    torch.testing.assert_close(extra, torch.tensor([2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5], dtype=F64))


def test_alibi_bias_by_hand():
    bias = posemb.alibi_bias(torch.tensor([0.5, 0.25]), torch.arange(3), torch.arange(3))
    hand = torch.tensor([[0, 1, 2], [1, 0, 1], [2, 1, 0]], dtype=torch.float32)
    assert bias.shape == (1, 2, 3, 3)
    torch.testing.assert_close(bias[0, 0], -0.5 * hand)
    torch.testing.assert_close(bias[0, 1], -0.25 * hand)
    # A decode step: one query at position 9 over keys 0..9.
    step = posemb.alibi_bias(torch.tensor([0.5]), torch.tensor([9]), torch.arange(10))
    torch.testing.assert_close(step[0, 0, 0], -0.5 * torch.arange(9, -1, -1, dtype=torch.float32))


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 20), (64, 512)])
def test_t5_buckets_and_bias_match_transformers(bidirectional, num_buckets, max_distance):
    config = T5Config(
        d_model=16,
        d_kv=4,
        num_heads=4,
        relative_attention_num_buckets=num_buckets,
        relative_attention_max_distance=max_distance,
        is_decoder=not bidirectional,
    )
    theirs = T5Attention(config, has_relative_attention_bias=True)
    ours = posemb.T5Bias(4, num_buckets, max_distance, bidirectional=bidirectional)
    with torch.no_grad():
        ours.weight.copy_(theirs.relative_attention_bias.weight)
        for q_len, k_len in ((1, 1), (37, 37), (5, 700)):
            # compute_bias puts queries at 0..q_len-1 and keys at 0..k_len-1.
            want = theirs.compute_bias(q_len, k_len)
            assert torch.equal(ours(torch.arange(q_len), torch.arange(k_len)), want)


@given(st.integers(-5000, 5000), st.booleans())
def test_t5_buckets_in_range_and_monotone(rel, bidirectional):
    b = posemb.t5_relative_bucket(torch.tensor([rel, rel + 1]), bidirectional)
    assert int(b.min()) >= 0 and int(b.max()) < 32
    if not bidirectional and rel < 0:
        assert int(b[0]) >= int(b[1])  # farther in the past: same or later bucket


def test_fire_bias_shape_gradients_and_normalisation():
    torch.manual_seed(0)
    fire = posemb.FireBias(3)
    bias = fire(torch.arange(6), torch.arange(6))
    assert bias.shape == (1, 3, 6, 6)
    # Same distance, same normalising position: same bias; the diagonal is f(0) everywhere.
    diag = torch.diagonal(bias[0], dim1=-2, dim2=-1)
    torch.testing.assert_close(diag, fire.mlp(torch.zeros(1, 1)).T.expand(3, 6))
    bias.sum().backward()
    assert fire.c.grad is not None and fire.mlp[0].weight.grad is not None
    # Progressive interpolation: the MLP's inputs stay in [0, 1] for any length.
    seen = []
    hook = fire.mlp[0].register_forward_hook(lambda mod, inp, out: seen.append(inp[0].detach()))
    fire(torch.tensor([100_000]), torch.arange(0, 100_001, 1000))
    hook.remove()
    assert float(seen[0].min()) >= 0.0 and float(seen[0].max()) <= 1.0
    assert float(seen[0].max()) == pytest.approx(1.0)  # the farthest key maps to the end


@given(st.integers(-2000, 2000), st.integers(-2000, 2000), st.integers(-3000, 3000))
def test_xpos_logit_depends_on_distance_only(m, n, shift):
    xpos = posemb.XPos(16)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, 1, 1, 16, generator=g, dtype=F64)

    def logit(a, b):
        qr, kr = xpos(q, k, torch.tensor([a]), k_positions=torch.tensor([b]))
        return (qr * kr).sum()

    torch.testing.assert_close(logit(m + shift, n + shift), logit(m, n), rtol=1e-9, atol=1e-12)


def test_xpos_decays_with_distance_and_scales_up_queries():
    xpos = posemb.XPos(16)
    s = xpos.scales(torch.tensor([0, 512, 1024]))
    assert torch.equal(s[0], torch.ones(8, dtype=F64))
    assert bool((s[2] < s[1]).all()) and bool((s[1] < 1).all())
    k = xpos.scales(torch.tensor([0, 512, 1024]), role="key")
    torch.testing.assert_close(k * s, torch.ones_like(s), **TOL[F64])
    torch.testing.assert_close(s[1], posemb.xpos_zeta(16, 0.4), **TOL[F64])


def test_xpos_rotate_needs_a_role_and_forward_uses_both():
    xpos = posemb.XPos(16)
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 2, 3, 5, 16, generator=g, dtype=F64)
    pos = torch.arange(100, 105)
    with pytest.raises(TypeError):
        xpos.rotate(q, pos)  # no silent query-side default
    with pytest.raises(ValueError, match="role must be 'query' or 'key'"):
        xpos.rotate(q, pos, role="value")
    fq, fk = xpos(q, k, pos)
    torch.testing.assert_close(fq, xpos.rotate(q, pos, role="query"), **TOL[F64])
    torch.testing.assert_close(fk, xpos.rotate(k, pos, role="key"), **TOL[F64])
    # Query and key sides differ by the decay squared, so swapping them is not harmless.
    assert float((xpos.rotate(k, pos, role="query") - fk).abs().max()) > 1e-2


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_modules_follow_dtype_moves(dtype):
    """.to() reaches every tensor a bias module computes from, and half-precision detours
    leave nothing degraded behind."""
    q, k = torch.arange(40, 50), torch.arange(0, 50)
    alibi = posemb.AlibiBias(12)
    want = posemb.alibi_bias(posemb.alibi_slopes(12), q, k)  # float64 slopes: exact
    moved = alibi.to(dtype)
    assert moved.slopes.dtype == dtype and moved(q, k).dtype == dtype
    assert_close(moved(q, k), want, dtype)
    assert torch.equal(posemb.AlibiBias(12).half().double()(q, k), want)
    assert "slopes" not in alibi.state_dict()  # derived from num_heads, not saved

    torch.manual_seed(0)
    for module in (posemb.T5Bias(4), posemb.FireBias(4)):
        ref = module.double()(q, k)
        if dtype in (torch.float32, torch.float64):
            out = module.to(dtype)(q, k)
            assert out.dtype == dtype
            assert_close(out, ref, dtype)

    xpos = posemb.XPos(16)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 2, 10, 16, generator=g, dtype=F64)
    ref = xpos.rotate(x, torch.arange(300, 310), role="key")
    out = xpos.to(dtype).rotate(x.to(dtype), torch.arange(300, 310), role="key")
    assert out.dtype == dtype
    assert_close(out, ref, dtype)


def test_randomized_positions():
    g = torch.Generator().manual_seed(0)
    pos = posemb.randomized_positions(50, 400, batch=3, generator=g)
    assert pos.shape == (3, 50)
    assert bool((pos[:, 1:] > pos[:, :-1]).all()) and int(pos.min()) >= 0 and int(pos.max()) < 400
    again = posemb.randomized_positions(
        50, 400, batch=3, generator=torch.Generator().manual_seed(0)
    )
    assert torch.equal(pos, again)
    wrapper = posemb.RandomizedPositions(400)
    assert wrapper(2, 7).shape == (2, 7)
    assert torch.equal(wrapper.eval()(2, 7), torch.arange(7).expand(2, 7))


def test_relative_positions_sign():
    rel = relative_positions(torch.tensor([5]), torch.tensor([3, 5, 8]))
    assert rel.tolist() == [[-2, 0, 3]]


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: posemb.alibi_slopes(0), "num_heads must be a positive integer, got 0"),
        (lambda: posemb.AlibiBias(-2), "num_heads must be a positive integer"),
        (
            lambda: posemb.t5_relative_bucket(torch.tensor([1]), num_buckets=1),
            "num_buckets must be >= 4",
        ),
        (
            lambda: posemb.t5_relative_bucket(torch.tensor([1]), False, num_buckets=1),
            "num_buckets must be >= 2",
        ),
        (
            lambda: posemb.t5_relative_bucket(torch.tensor([1]), num_buckets=32, max_distance=8),
            "max_distance must exceed the 8 exact buckets",
        ),
        (
            lambda: posemb.t5_relative_bucket(torch.tensor([1.5])),
            "relative_position must have an integer dtype",
        ),
        (lambda: posemb.T5Bias(4, num_buckets=3), "num_buckets must be >= 4"),
        (lambda: posemb.FireBias(4, init_c=0), "init_c must be a finite number > 0"),
        (lambda: posemb.randomized_positions(10, 5), "max_len must be >= seq_len = 10"),
        (lambda: posemb.XPos(16, gamma=0), "gamma must be a finite number > 0"),
        (
            lambda: posemb.alibi_bias(torch.ones(2, 2), torch.arange(2), torch.arange(2)),
            r"slopes must have shape \(heads,\)",
        ),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("backend", ["cpu", "triton"])
def test_xpos_fused_matches_reference_forward_and_backward(backend):
    """xPos runs through the fused op with key tables of its own; gradients flow back."""
    device = device_of(backend)
    g = torch.Generator().manual_seed(6)
    q = torch.randn(2, 4, 9, 16, generator=g).to(device)
    k = torch.randn(2, 2, 9, 16, generator=g).to(device)
    pos = torch.arange(300, 309, device=device)
    ref, fused = posemb.XPos(16, backend="reference"), posemb.XPos(16, backend=backend)
    qr, kr = q.clone().requires_grad_(), k.clone().requires_grad_()
    qf, kf = q.clone().requires_grad_(), k.clone().requires_grad_()
    want, got = ref(qr, kr, pos), fused(qf, kf, pos)
    for w, o in zip(want, got, strict=True):
        assert_close(o, w, torch.float32)
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    torch.autograd.backward(want, (gq, gk))
    torch.autograd.backward(got, (gq, gk))
    assert_close(qf.grad, qr.grad, torch.float32)
    assert_close(kf.grad, kr.grad, torch.float32)


def test_xpos_center_can_follow_the_call():
    g = torch.Generator().manual_seed(7)
    q, k = torch.randn(2, 1, 2, 100, 16, generator=g, dtype=F64)
    follow, fixed = posemb.XPos(16, center=None), posemb.XPos(16, center=50)
    for a, b in zip(follow(q, k), fixed(q, k), strict=True):
        torch.testing.assert_close(a, b, **TOL[F64])  # 100 tokens: centre (99 + 1) // 2 = 50
    # Logits depend on the distance only, whatever the centre.
    qf, kf = follow(q, k)
    qc, kc = posemb.XPos(16, center=0)(q, k)
    torch.testing.assert_close(qf @ kf.transpose(-1, -2), qc @ kc.transpose(-1, -2), **TOL[F64])
    with pytest.raises(ValueError, match="needs center= given"):
        follow.rotate(q, role="query")
    torch.testing.assert_close(follow.rotate(q, role="query", center=50), qf, **TOL[F64])
