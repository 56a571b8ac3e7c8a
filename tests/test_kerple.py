"""KERPLE (Chi et al. 2022) against its two kernels written out pair by pair."""

import copy
import math
import pickle

import pytest
import torch

import posemb
from posemb.bias import kerple_bias
from tolerances import TOL, assert_close

F64 = torch.float64


def kernel_by_hand(r1, r2, qp, kp, kind):
    """The paper's shifted kernels, one (head, i, j) at a time, in Python floats."""
    out = torch.empty(len(r1), len(qp), len(kp), dtype=F64)
    for h, (a, b) in enumerate(zip(r1.tolist(), r2.tolist(), strict=True)):
        for i, m in enumerate(qp):
            for j, n in enumerate(kp):
                d = abs(m - n)
                out[h, i, j] = -a * math.log(1 + b * d) if kind == "log" else -a * d**b
    return out


@pytest.mark.parametrize("kind", ["log", "power"])
@pytest.mark.parametrize(
    "qp,kp", [(list(range(7)), list(range(7))), ([9], list(range(10))), ([3, 40], [0, 5, 41])]
)
def test_both_kernels_match_the_definition(kind, qp, kp):
    torch.manual_seed(0)
    m = posemb.KerpleBias(3, kind=kind)
    got = m(torch.tensor(qp), torch.tensor(kp))
    r1, r2 = m.r1.detach(), m.r2.detach()
    want = kernel_by_hand(r1, r2, qp, kp, kind)
    assert got.shape == (1, 3, len(qp), len(kp))
    assert_close(got[0], want, torch.float32)
    # Float64 parameters give float64 bias, to float64 accuracy.
    got64 = kerple_bias(r1.double(), r2.double(), torch.tensor(qp), torch.tensor(kp), kind)
    torch.testing.assert_close(
        got64[0], kernel_by_hand(r1.double(), r2.double(), qp, kp, kind), **TOL[F64]
    )


def test_parameters_are_positive_and_drawn_as_the_authors_draw_them():
    torch.manual_seed(1)
    log = posemb.KerpleBias(4096, kind="log")
    power = posemb.KerpleBias(4096, kind="power")
    for m, spans in ((log, (2.0, 1.0)), (power, (1.0, 2.0))):
        for r, span in zip((m.r1.detach(), m.r2.detach()), spans, strict=True):
            assert r.shape == (4096,) and bool((r > 0).all())
            assert 0.0 < float(r.min()) <= 0.012 and span - 0.01 < float(r.max()) <= span
            assert abs(float(r.mean()) - span / 2) < 0.05  # uniform over [0, span)
    assert float(power.r2.detach().max()) <= 2.0


def test_power_exponent_stays_in_its_range_whatever_training_does():
    m = posemb.KerpleBias(2, kind="power")
    with torch.no_grad():
        m.raw_r2.copy_(torch.tensor([-1e4, 1e4]))
        m.raw_r1.copy_(torch.tensor([-1e4, 50.0]))
    r1, r2 = m.r1.detach(), m.r2.detach()
    assert float(r2.min()) > 0 and float(r2.max()) <= 2.0
    assert float(r1.min()) >= torch.tensor(0.01).item()  # the floor, in float32


@pytest.mark.parametrize("kind", ["log", "power"])
def test_gradients_reach_both_parameters_and_are_finite_at_distance_zero(kind):
    m = posemb.KerpleBias(2, kind=kind).double()
    pos = torch.arange(6)
    m(pos, pos).sum().backward()
    for p in (m.raw_r1, m.raw_r2):
        assert (
            p.grad is not None and bool(torch.isfinite(p.grad).all()) and bool(p.grad.ne(0).all())
        )
    r1 = m.r1.detach().requires_grad_()
    r2 = m.r2.detach().clamp(max=1.9).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: kerple_bias(a, b, pos, pos, kind), (r1, r2))


def test_batched_positions_and_attention_use():
    torch.manual_seed(2)
    m = posemb.KerpleBias(4)
    qp = torch.tensor([[0, 1, 2], [5, 6, 7]])
    got = m(qp, qp)
    assert got.shape == (2, 4, 3, 3)
    torch.testing.assert_close(got[0], got[1])  # relative: a shift changes nothing
    attn = posemb.PositionalAttention(m, num_heads=4, head_dim=8, causal=True)
    q, k, v = (torch.randn(2, 4, 3, 8) for _ in range(3))
    out = attn(q, k, v, positions=qp, k_positions=qp)
    bias = torch.where(torch.ones(3, 3).tril().bool(), got, float("-inf"))
    want = posemb.dot_product_attention(q, k, v, bias=bias)
    assert_close(out, want, torch.float32)
    by_name = posemb.PositionalAttention("kerple", num_heads=4, head_dim=8, kind="power")
    assert isinstance(by_name.encoding, posemb.KerpleBias) and by_name.encoding.kind == "power"


def test_copies_and_pickles_give_the_same_bias():
    m = posemb.KerpleBias(3, kind="power")
    pos = torch.arange(5)
    for other in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        torch.testing.assert_close(other(pos, pos), m(pos, pos))
    assert "kind='power'" in repr(m)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: posemb.KerpleBias(4, kind="exp"), "kind must be one of log, power, got 'exp'"),
        (lambda: posemb.KerpleBias(0), "num_heads"),
        (lambda: posemb.KerpleBias(2)(torch.arange(3), torch.arange(3.0)), "k_positions"),
        (
            lambda: kerple_bias(torch.ones(2), torch.ones(3), [0], [0]),
            "r1 and r2 must both have shape",
        ),
    ],
)
def test_bad_settings_are_refused_by_name(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize(
    "r1,r2,kind",
    [
        ([1.0], [-1.0], "log"),
        ([-1.0], [1.0], "log"),
        ([1.0], [5.0], "power"),
        ([1.0], [0.0], "power"),
    ],
)
def test_the_function_refuses_values_outside_the_kernels_ranges(r1, r2, kind):
    """kerple_bias with r2 = -1 gave NaN and inf; r1 = -1 an anti-local bias; power r2 = 5."""
    with pytest.raises(ValueError, match=f"KERPLE-{kind} needs r1 > 0"):
        kerple_bias(torch.tensor(r1), torch.tensor(r2), torch.arange(4), torch.arange(4), kind)
