"""Self-Extend, ReRoPE and Dual Chunk Attention against references written from the papers'
definitions (issue 33's formulas), pair by pair in float64: never from posemb's own code."""

from __future__ import annotations

import copy
import math
import pickle

import pytest
import torch

import posemb
from extension_definitions import reference_distance
from posemb import InputError
from posemb.extension import DualChunk, ReRoPE, SelfExtend, extended_attention
from tolerances import assert_close

F64 = torch.float64


def rotated(x: torch.Tensor, angle_rate: torch.Tensor, d: float, factor: float, layout: str):
    """One head vector x rotated by distance d: pairs (c, c + r/2) or (2c, 2c + 1) of its first
    r channels turned by d * theta_c and scaled by the attention factor; the rest unchanged."""
    r = 2 * angle_rate.numel()
    out = x.clone()
    for c, theta in enumerate(angle_rate.tolist()):
        a, b = (c, c + r // 2) if layout == "half" else (2 * c, 2 * c + 1)
        cos, sin = math.cos(d * theta) * factor, math.sin(d * theta) * factor
        out[a] = x[a] * cos - x[b] * sin
        out[b] = x[a] * sin + x[b] * cos
    return out


def reference_attention(q, k, v, rope, method, qp, kp, causal=True, padding=None, scale=None):
    """softmax over keys of <R(d_ij) q_i, R(0) k_j> * scale, masked; d_ij from the definitions.
    Queries are first multiplied by max(1, ln(i + 1) / ln n) when the method asks."""
    b, hq, lq, dim = q.shape
    group = hq // k.shape[1]
    top = max(int(qp.max()), int(kp.max())) + 1
    inv, factor = rope.schedule(top)
    s = 1 / math.sqrt(dim) if scale is None else scale
    out = torch.zeros(b, hq, lq, v.shape[-1], dtype=F64)
    for bi in range(b):
        qpos = (qp if qp.dim() == 1 else qp[bi]).tolist()
        kpos = (kp if kp.dim() == 1 else kp[bi]).tolist()
        for h in range(hq):
            for t, i in enumerate(qpos):
                qi = q[bi, h, t].clone()
                if method.query_scale is not None:
                    qi = qi * max(1.0, math.log(i + 1) / math.log(method.query_scale))
                logits = []
                for u, j in enumerate(kpos):
                    if (causal and j > i) or (padding is not None and padding[bi, u]):
                        logits.append(float("-inf"))
                        continue
                    d = reference_distance(method, i, j)
                    kj = rotated(k[bi, h // group, u], inv, 0.0, factor, rope.layout.name.lower())
                    qd = rotated(qi, inv, d, factor, rope.layout.name.lower())
                    logits.append(float(qd @ kj) * s)
                w = torch.tensor(logits, dtype=F64)
                if torch.isinf(w).all():
                    continue  # a query that sees nothing: zeros
                out[bi, h, t] = torch.softmax(w, 0) @ v[bi, h // group].to(F64)
    return out


METHODS = [
    SelfExtend(group=3, window=4),
    SelfExtend(group=2, window=5, query_scale=8),
    ReRoPE(window=4),
    ReRoPE(window=3, leak=2.5),
    DualChunk(chunk_size=7, local_size=2),
    DualChunk(chunk_size=6, local_size=5, query_scale=4),
]
IDS = ["selfextend", "selfextend-scaled", "rerope", "leaky", "dca", "dca-scaled"]


@pytest.mark.parametrize("method", METHODS, ids=IDS)
def test_relative_positions_are_the_definitions(method):
    qp = torch.tensor([0, 1, 5, 9, 13, 20, 31])
    kp = torch.tensor([0, 2, 3, 4, 9, 14, 19, 25, 30, 31])
    got = method.relative_positions(qp, kp)
    want = [[reference_distance(method, i, j) for j in kp.tolist()] for i in qp.tolist()]
    causal = qp[:, None] >= kp[None, :]
    assert got.shape == (7, 10)
    torch.testing.assert_close(got.to(F64)[causal], torch.tensor(want, dtype=F64)[causal])
    # Per sequence: (batch, q_len) and (batch, k_len) give (batch, q_len, k_len).
    batched = method.relative_positions(torch.stack((qp, qp + 3)), torch.stack((kp, kp)))
    assert batched.shape == (2, 7, 10) and torch.equal(batched[0], got)


@pytest.mark.parametrize("method", METHODS, ids=IDS)
@pytest.mark.parametrize(
    ("case", "q_len", "k_len"), [("prefill", 17, 17), ("decode", 1, 23), ("chunked", 5, 19)]
)
def test_extended_attention_is_the_pair_by_pair_definition(method, case, q_len, k_len):
    torch.manual_seed(q_len + k_len)
    rope = posemb.RotaryEmbedding(8)
    q = torch.randn(2, 4, q_len, 8, dtype=F64)
    k, v = torch.randn(2, 2, k_len, 8, dtype=F64), torch.randn(2, 2, k_len, 3, dtype=F64)
    got = extended_attention(q, k, v, rope, method)
    qp, kp = torch.arange(k_len - q_len, k_len), torch.arange(k_len)
    assert_close(got, reference_attention(q, k, v, rope, method, qp, kp), F64)


@pytest.mark.parametrize("method", METHODS, ids=IDS)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "both-ways"])
def test_query_blocks_and_column_boxes_change_nothing(method, causal, monkeypatch):
    """The reference path runs long inputs in query blocks, each set's product over its own
    columns: forced here to blocks of a few rows, with padding and per-sequence positions,
    forward and backward (the fused path's blocks: tests/test_attention_core.py)."""
    if not causal and not method.bidirectional:
        pytest.skip("Dual Chunk Attention is causal only")
    monkeypatch.setattr(
        posemb.attention.extension, "_BLOCK_ELEMENTS", 2 * 4 * 40 * 3
    )  # 3-row blocks
    torch.manual_seed(11)
    rope = posemb.RotaryEmbedding(8)
    q = torch.randn(2, 4, 16, 8, dtype=F64, requires_grad=True)
    k = torch.randn(2, 2, 40, 8, dtype=F64, requires_grad=True)
    v = torch.randn(2, 2, 40, 3, dtype=F64, requires_grad=True)
    kp = torch.stack((torch.arange(40), torch.arange(40) + 5))
    qp = kp[:, 20:36]
    pad = torch.zeros(2, 40, dtype=torch.bool)
    pad[1, :4] = True
    got = extended_attention(q, k, v, rope, method, qp, kp, causal, pad, fused=False)
    if causal:  # the definitions are causal (both ways: the bidirectional test's mirror)
        plain = (t.detach() for t in (q, k, v))
        assert_close(got, reference_attention(*plain, rope, method, qp, kp, causal, pad), F64)
    grads = torch.autograd.grad(got.square().sum(), (q, k, v))
    monkeypatch.setattr(posemb.attention.extension, "_BLOCK_ELEMENTS", 1 << 24)  # one block
    whole = extended_attention(q, k, v, rope, method, qp, kp, causal, pad, fused=False)
    assert_close(got, whole, F64)
    for a, b in zip(grads, torch.autograd.grad(whole.square().sum(), (q, k, v)), strict=True):
        assert_close(a, b, F64)


@pytest.mark.parametrize("method", METHODS[::2], ids=IDS[::2])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_any_rope_partial_scaled_either_layout_and_positions_per_sequence(method, layout):
    torch.manual_seed(3)
    rope = posemb.RotaryEmbedding(
        12, rotary_dim=8, base=500.0, layout=layout, scaling=posemb.scaling.Yarn(4.0, 8)
    )
    q, k = torch.randn(2, 2, 4, 12, dtype=F64), torch.randn(2, 1, 9, 12, dtype=F64)
    v = torch.randn(2, 1, 9, 5, dtype=F64)
    qp = torch.tensor([[20, 21, 22, 23], [5, 9, 13, 30]])
    kp = torch.tensor([[0, 3, 6, 9, 12, 15, 18, 21, 24], [0, 1, 2, 3, 4, 11, 12, 13, 29]])
    got = extended_attention(q, k, v, rope, method, qp, kp)
    assert_close(got, reference_attention(q, k, v, rope, method, qp, kp), F64)


@pytest.mark.parametrize(
    "method", [SelfExtend(4, 32), ReRoPE(32), ReRoPE(32, leak=3.0), DualChunk(40, 8)]
)
def test_inside_the_window_it_is_plain_causal_rope_attention(method):
    torch.manual_seed(0)
    rope = posemb.RotaryEmbedding(16, scaling=posemb.scaling.Linear(2.0))
    q, k = torch.randn(2, 4, 32, 16, dtype=F64), torch.randn(2, 2, 32, 16, dtype=F64)
    v = torch.randn(2, 2, 32, 16, dtype=F64)
    qr, kr = rope(q, k)
    plain = posemb.dot_product_attention(qr, kr, v, causal=True)
    assert_close(extended_attention(q, k, v, rope, method), plain, F64)


@pytest.mark.parametrize("method", METHODS, ids=IDS)
def test_gradients_reach_q_k_and_v_as_the_definition_says(method):
    torch.manual_seed(1)
    rope = posemb.RotaryEmbedding(4)
    leaves = [torch.randn(1, 2, n, 4, dtype=F64, requires_grad=True) for n in (3, 11)]
    q, k = leaves
    v = torch.randn(1, 2, 11, 2, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v: extended_attention(q, k, v, rope, method), (q, k, v)
    )


def test_a_padded_batch_gives_each_row_what_it_gives_alone():
    torch.manual_seed(2)
    rope, method = posemb.RotaryEmbedding(8), SelfExtend(2, 3)
    q, k = torch.randn(2, 2, 6, 8, dtype=F64), torch.randn(2, 2, 6, 8, dtype=F64)
    v = torch.randn(2, 2, 6, 4, dtype=F64)
    # Row 1 is left-padded by two: its real tokens sit at positions 0..3.
    pad = torch.tensor([[False] * 6, [True, True] + [False] * 4])
    pos = torch.tensor([[0, 1, 2, 3, 4, 5], [0, 0, 0, 1, 2, 3]])
    got = extended_attention(q, k, v, rope, method, pos, pos, key_padding_mask=pad)
    alone = extended_attention(q[1:, :, 2:], k[1:, :, 2:], v[1:, :, 2:], rope, method)
    assert_close(got[1:, :, 2:], alone, F64)


def test_bidirectional_attention_mirrors_the_distances():
    torch.manual_seed(4)
    rope = posemb.RotaryEmbedding(8)
    q, k, v = (torch.randn(1, 1, 9, 8, dtype=F64) for _ in range(3))
    for method in (SelfExtend(2, 3), ReRoPE(3), ReRoPE(3, leak=2.0)):
        pos = torch.arange(9)
        got = extended_attention(q, k, v, rope, method, causal=False)
        d = method.relative_positions(pos, pos)
        assert torch.equal(d, -d.T)  # mirrored: a key i - j after is -(its distance before)
        want = _from_distances(q, k, v, rope, d)
        assert_close(got, want, F64)
    with pytest.raises(InputError, match="DualChunk is defined for causal attention only"):
        extended_attention(q, k, v, rope, DualChunk(4, 1), causal=False)


def _from_distances(q, k, v, rope, d):
    """Non-causal attention with logit <R(d_ij) q_i, k_j> (float64 rotation by each d)."""
    inv, factor = rope.schedule(None)
    lay = rope.layout.name.lower()
    logits = torch.empty(q.shape[2], k.shape[2], dtype=F64)
    for i in range(q.shape[2]):
        for j in range(k.shape[2]):
            kj = rotated(k[0, 0, j], inv, 0.0, factor, lay)
            logits[i, j] = rotated(q[0, 0, i], inv, float(d[i, j]), factor, lay) @ kj
    return (torch.softmax(logits / math.sqrt(q.shape[-1]), -1) @ v[0, 0])[None, None]


@pytest.mark.parametrize("method", [ReRoPE(4), ReRoPE(4, query_scale=4)], ids=["-", "scaled"])
def test_low_precision_inputs_compute_in_float32_and_return_their_dtype(method):
    # The scaled case: the query scaling once cast q to float32 and the output followed it.
    torch.manual_seed(5)
    rope = posemb.RotaryEmbedding(16)
    q, k, v = (torch.randn(1, 2, 12, 16) for _ in range(3))
    want = extended_attention(q.double(), k.double(), v.double(), rope, method)
    for dtype in (torch.float32, torch.bfloat16):
        got = extended_attention(q.to(dtype), k.to(dtype), v.to(dtype), rope, method)
        assert got.dtype == dtype
        # Inputs rounded to dtype, then float32 arithmetic: a few of dtype's roundoffs.
        want_d = extended_attention(*(t.to(dtype).double() for t in (q, k, v)), rope, method)
        assert_close(got, want_d, dtype)
    assert want.dtype == F64


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: SelfExtend(0, 4), r"SelfExtend.group must be an integer >= 1, got 0"),
        (lambda: SelfExtend(2, 0), r"SelfExtend.window must be an integer >= 1, got 0"),
        (lambda: SelfExtend(2.0, 4), r"SelfExtend.group must be an integer"),
        (lambda: SelfExtend(True, 4), r"SelfExtend.group must be an integer"),
        (lambda: ReRoPE(0), r"ReRoPE.window must be an integer >= 1"),
        (lambda: ReRoPE(4, leak=1), r"ReRoPE.leak must be a number > 1"),
        (lambda: ReRoPE(4, leak=float("nan")), r"ReRoPE.leak must be a number > 1"),
        (lambda: ReRoPE(4, leak=float("inf")), r"ReRoPE.leak must be finite"),
        (lambda: DualChunk(8, 8), r"DualChunk.local_size must be less than chunk_size \(8\)"),
        (lambda: DualChunk(8, 0), r"DualChunk.local_size must be an integer >= 1"),
        (lambda: DualChunk(1, 1), r"DualChunk.chunk_size must be an integer >= 2"),
        (lambda: SelfExtend(2, 4, query_scale=1), r"SelfExtend.query_scale must be an integer"),
    ],
)
def test_bad_settings_name_the_setting(make, match):
    with pytest.raises(InputError, match=match):
        make()


def test_bad_calls_are_refused_by_name():
    rope = posemb.RotaryEmbedding(8)
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    cases = [
        (lambda: extended_attention(q, k, v, posemb.XPos(8), ReRoPE(2)), "not xPos"),
        (lambda: extended_attention(q, k, v, rope, ReRoPE(2), scale=float("nan")), "scale must"),
        (lambda: extended_attention(*(t.to("meta") for t in (q, k, v)), rope, ReRoPE(2)),
         "q is on the meta device"),
        (lambda: ReRoPE(2).relative_positions(torch.zeros(2, 3, dtype=torch.long),
                                              torch.zeros(3, 4, dtype=torch.long)),
         "must be for the same batch, got 2 and 3"),
        (lambda: extended_attention(q, k, v, rope, "rerope"), "method must be SelfExtend"),
        (lambda: extended_attention(q, k, v, posemb.RotaryEmbedding(16), ReRoPE(2)),
         "head_dim 16"),
        (lambda: extended_attention(q[:, :, :0, :3], k, v, rope, ReRoPE(2)), "head_dim 8"),
        (lambda: extended_attention(torch.randn(1, 2, 6, 8), k, v, rope, ReRoPE(2)),
         "needs q_len <= k_len"),
        (lambda: extended_attention(q, k, v[:, :, :3], rope, ReRoPE(2)), "v must have shape"),
        (lambda: extended_attention(q, k, v, rope, ReRoPE(2), key_padding_mask=torch.ones(1, 4)),
         "key_padding_mask must be a bool"),
        (lambda: extended_attention(q, k, v, rope, ReRoPE(2), q_positions=torch.arange(3)),
         r"q_positions must have shape \(4,\)"),
    ]  # fmt: skip
    for call, match in cases:
        with pytest.raises(InputError, match=match):
            call()


def test_mixed_dtypes_compute_in_the_widest():
    torch.manual_seed(7)
    rope, method = posemb.RotaryEmbedding(8), SelfExtend(2, 3)
    q, k, v = (torch.randn(1, 2, 6, 8, dtype=F64) for _ in range(3))
    want = extended_attention(q, k.float().double(), v, rope, method)
    got = extended_attention(q, k.float(), v, rope, method)
    assert got.dtype == F64
    assert_close(got, want, F64)


def test_the_methods_pickle_copy_compare_and_hash():
    for method in METHODS:
        assert pickle.loads(pickle.dumps(method)) == method == copy.deepcopy(method)
        assert hash(method) == hash(copy.deepcopy(method))
    assert SelfExtend(2, 4) != SelfExtend(2, 5)
    assert repr(ReRoPE(4, leak=2)) == "ReRoPE(window=4, leak=2.0, query_scale=None)"


def test_a_decode_step_over_a_cache_of_unrotated_keys_matches_the_prefill():
    """The last row of a prefill is the decode step of its last token over the others."""
    torch.manual_seed(6)
    rope = posemb.RotaryEmbedding(8)
    q, k, v = (torch.randn(1, 2, 30, 8, dtype=F64) for _ in range(3))
    for method in METHODS:
        full = extended_attention(q, k, v, rope, method)
        step = extended_attention(q[:, :, -1:], k, v, rope, method)
        assert_close(step, full[:, :, -1:], F64)
