"""posemb's scores as FlexAttention score functions and block masks (the CUDA path, issue 55),
checked on the CPU through FlexAttention's eager reference (and compiled, for inference)
against the blocked core; and when FlexAttention hands a call to the core, and why."""

from __future__ import annotations

import pytest
import torch

import posemb
from posemb.attention import flex, scores, tiled
from tolerances import TOL, UNIT_ROUNDOFF

pytest.importorskip("torch.nn.attention.flex_attention")


def _score(name):
    torch.manual_seed(4)
    module = posemb.make_encoding(name, 4, 8, causal=True)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return scores.score_of(module, 4)


def _table(score, q_len, k_len, delta):
    lo = delta - (k_len - 1)
    table = score.table(torch.arange(lo, q_len + delta)) if score.distance_only else None
    return table, lo


@pytest.mark.parametrize("name", ["alibi", "t5", "kerple", "fire"])
@pytest.mark.parametrize(
    "visible",
    [scores.Visible(True, None), scores.Visible(True, 5), scores.Visible(False, None)],
    ids=["causal", "window", "both-ways"],
)
def test_the_score_functions_are_the_cores_scores(name, visible):
    """Decode-like shapes too: 7 queries at the end of 24 keys (delta 17)."""
    score = _score(name)
    g = torch.Generator().manual_seed(5)
    for q_len, k_len in ((24, 24), (7, 24)):
        q = torch.randn(1, 4, q_len, 8, generator=g)
        k, v = torch.randn(1, 2, k_len, 8, generator=g), torch.randn(1, 2, k_len, 8, generator=g)
        delta = k_len - q_len
        table, lo = _table(score, q_len, k_len, delta)
        got = flex.attend(q, k, v, score, table, lo, visible, 0.3, delta, compiled=False)
        want = tiled.tiled_attention(q, k, v, score, visible, 0.3)
        torch.testing.assert_close(got, want, **TOL[torch.float32])


@pytest.mark.parametrize("name", ["alibi", "fire"])
@pytest.mark.parametrize("starts", [(100,), (0, 37)], ids=["offset", "per-sequence"])
def test_keys_that_do_not_start_at_zero(name, starts):
    """Positions that are ranges from anywhere: FIRE normalises by the query's own position
    (taking it as ``q_idx + delta`` was 3e-2 off once the keys started at 100)."""
    score = _score(name)
    if name == "fire":  # queries past the threshold, where the normaliser moves, and felt
        with torch.no_grad():
            score.module.threshold.fill_(4.0)
            score.module.mlp[2].weight.mul_(10)
    g = torch.Generator().manual_seed(9)
    b, q_len, k_len = len(starts), 7, 24
    q = torch.randn(b, 4, q_len, 8, generator=g)
    k, v = torch.randn(b, 2, k_len, 8, generator=g), torch.randn(b, 2, k_len, 8, generator=g)
    delta = k_len - q_len
    kp = torch.arange(k_len) + torch.tensor(starts)[:, None]
    qp = kp[:, delta:]
    table, lo = _table(score, q_len, k_len, delta)
    visible = scores.Visible(True, None)
    got = flex.attend(q, k, v, score, table, lo, visible, 0.3, delta, False, qp[:, 0])
    want = tiled.tiled_attention(q, k, v, score, visible, 0.3, qp, kp)
    torch.testing.assert_close(got, want, **TOL[torch.float32])


def test_a_learned_table_gets_its_gradient_through_flexattention():
    score = _score("t5")
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 4, 20, 8, generator=g) for _ in range(3))
    weight = score.module.weight
    grads = []
    for run in ("flex", "core"):
        if run == "flex":
            table, lo = _table(score, 20, 20, 0)
            out = flex.attend(q, k, v, score, table, lo, scores.Visible(), 0.3, 0, False)
        else:
            out = tiled.tiled_attention(q, k, v, score, scores.Visible(), 0.3)
        grads.append(torch.autograd.grad(out.square().sum(), weight)[0])
    torch.testing.assert_close(grads[0], grads[1], **TOL[torch.float32])


def test_compiled_flexattention_on_the_cpu_for_inference():
    score = _score("alibi")
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 4, 128, 16, generator=g) for _ in range(3))
    table, lo = _table(score, 128, 128, 0)
    with torch.no_grad():
        got = flex.attend(q, k, v, score, table.float(), lo, scores.Visible(), 0.25, 0)
    want = tiled.tiled_attention(q, k, v, score, scores.Visible(), 0.25)
    torch.testing.assert_close(got, want, **TOL[torch.float32])


def test_what_flexattention_hands_to_the_core_and_says_why():
    score = _score("alibi")
    q = torch.randn(1, 4, 8, 8)
    assert "CUDA" in flex.why_not(q, score, 0, None, None)
    if torch.cuda.is_available():  # the other reasons, where the device allows them
        cq = q.cuda()
        assert flex.why_not(cq, score, 0, None, None) is None
        assert "sinks" in flex.why_not(cq, score, 0, None, torch.zeros(4, device="cuda"))
        assert "padding" in flex.why_not(cq, score, 0, torch.zeros(1, 8, dtype=bool), None)
        assert "ranges" in flex.why_not(cq, score, None, None, None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA path needs a GPU")
@pytest.mark.parametrize("name", ["alibi", "t5", "kerple", "fire", "sinks", "window"])
def test_on_cuda_every_encoding_is_the_cpus(name, monkeypatch):
    """On CUDA PositionalAttention takes FlexAttention (compiled) where it serves, the core
    otherwise (sinks): output and every gradient equal the CPU's, float32."""
    from posemb.attention import module

    extra = {"sinks": True} if name == "sinks" else {"window": 9} if name == "window" else {}
    enc = "rope" if name in ("sinks", "window") else name
    torch.manual_seed(8)
    cpu = posemb.PositionalAttention(enc, num_heads=4, head_dim=16, causal=True, **extra)
    gpu = __import__("copy").deepcopy(cpu).cuda()
    q, k, v = (torch.randn(2, 4, 300, 16) for _ in range(3))
    monkeypatch.setattr(module, "TILES_FROM", 1)
    results = []
    for att, device in ((cpu, "cpu"), (gpu, "cuda")):
        xs = [t.to(device).requires_grad_() for t in (q, k, v)]
        out = att(*xs)
        grads = torch.autograd.grad(out.square().sum(), [*xs, *att.parameters()])
        results.append([out.cpu(), *(g.cpu() for g in grads)])
    # Another kernel sums the 300 keys in another order: one float32 roundoff a key apart.
    tol = 300 * UNIT_ROUNDOFF[torch.float32]
    for a, b in zip(*results, strict=True):
        scale = max(1.0, float(a.abs().max()))
        torch.testing.assert_close(b, a, rtol=tol, atol=tol * scale)
