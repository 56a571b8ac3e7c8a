import copy
import pickle

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from rotary_embedding_torch import apply_rotary_emb as ret_apply_rotary_emb
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply_rotary_pos_emb

import posemb
from devices import device_of
from posemb import Layout
from tolerances import TOL, assert_close

F64 = torch.float64
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def _tables(positions, rotary_dim, base=10000.0, dtype=F64):
    return posemb.cos_sin(positions, posemb.inv_freq(rotary_dim, base, dtype=F64), dtype)


# --- the three forms ---------------------------------------------------------------------------


@given(
    half_r=st.integers(1, 12),
    positions=st.lists(st.integers(-(1 << 20), 1 << 20), min_size=1, max_size=6),
    layout=st.sampled_from(list(Layout)),
)
def test_elementwise_matrix_complex_forms_agree(half_r, positions, layout):
    r = 2 * half_r
    g = torch.Generator().manual_seed(half_r)
    x = torch.randn(2, 3, len(positions), r, generator=g, dtype=F64)
    pos = torch.tensor(positions)
    theta = posemb.inv_freq(r, dtype=F64)
    cos, sin = _tables(pos, r)
    elementwise = posemb.apply_rope(x, cos, sin, layout)
    mats = torch.stack([posemb.rotation_matrix(p, theta, layout) for p in positions])
    torch.testing.assert_close(elementwise, torch.einsum("sij,bhsj->bhsi", mats, x), **TOL[F64])
    torch.testing.assert_close(elementwise, posemb.rope_complex(x, pos, theta, layout), **TOL[F64])


# --- the algebra of the lesson -----------------------------------------------------------------

positions_st = st.integers(-(1 << 16), 1 << 16)


@given(positions_st, positions_st, st.sampled_from(list(Layout)))
def test_rotation_algebra(m, n, layout):
    theta = posemb.inv_freq(16, dtype=F64)
    rm, rn = posemb.rotation_matrix(m, theta, layout), posemb.rotation_matrix(n, theta, layout)
    # Angles near 2^16 rad carry float64 rounding of ~2^16 * 1e-16.
    tol = {"atol": 1e-10, "rtol": 0}
    torch.testing.assert_close(rm.T @ rn, posemb.rotation_matrix(n - m, theta, layout), **tol)
    torch.testing.assert_close(rm @ rn, posemb.rotation_matrix(m + n, theta, layout), **tol)
    torch.testing.assert_close(rm.T @ rm, torch.eye(16, dtype=F64), **tol)
    assert float(torch.linalg.det(rm)) == pytest.approx(1.0, abs=1e-12)


@given(positions_st, positions_st, st.integers(-(1 << 20), 1 << 20), st.sampled_from(list(Layout)))
def test_logit_depends_on_offset_only(m, n, shift, layout):
    g = torch.Generator().manual_seed(0)
    rope = posemb.RotaryEmbedding(32, layout=layout)
    q, k = torch.randn(2, 1, 1, 1, 32, generator=g, dtype=F64)

    def logit(a, b):
        return (rope.rotate(q, torch.tensor([a])) * rope.rotate(k, torch.tensor([b]))).sum()

    torch.testing.assert_close(logit(m + shift, n + shift), logit(m, n), atol=1e-9, rtol=1e-9)


@given(st.lists(st.integers(-(1 << 30), 1 << 30), min_size=1, max_size=5))
def test_norm_preserved(positions):
    x = torch.randn(1, 2, len(positions), 24, generator=torch.Generator().manual_seed(1), dtype=F64)
    y = posemb.RotaryEmbedding(24).rotate(x, torch.tensor(positions))
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), **TOL[F64])


def test_toy_trace():
    theta = torch.tensor([torch.pi / 4], dtype=F64)
    e1 = torch.tensor([1.0, 0.0], dtype=F64)
    dot = (posemb.rotation_matrix(3, theta) @ e1) @ (posemb.rotation_matrix(1, theta) @ e1)
    assert abs(float(dot)) < 1e-15


# --- against other implementations -------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(2, 4, 17, 64), (1, 1, 1, 8), (3, 2, 217, 32)])
def test_half_layout_matches_transformers(dtype, shape):
    g = torch.Generator().manual_seed(0)
    b, _, s, d = shape
    q = torch.randn(shape, generator=g).to(dtype)
    k = torch.randn(b, 1, s, d, generator=g).to(dtype)
    pos = torch.randint(0, 100_000, (b, s), generator=g)
    cos, sin = _tables(pos, d, dtype=dtype)
    # transformers wants full-width tables: the same angle on channels j and j + d/2.
    hf_q, hf_k = hf_apply_rotary_pos_emb(q, k, torch.cat((cos, cos), -1), torch.cat((sin, sin), -1))
    assert_close(posemb.apply_rope(q, cos, sin, Layout.HALF), hf_q, dtype)
    assert_close(posemb.apply_rope(k, cos, sin, Layout.HALF), hf_k, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("head_dim,rotary_dim", [(64, 64), (64, 32), (10, 6)])
def test_interleaved_layout_matches_rotary_embedding_torch(dtype, head_dim, rotary_dim):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 33, head_dim, generator=g).to(dtype)
    pos = torch.arange(7, 40)
    angles = posemb.angles(pos, posemb.inv_freq(rotary_dim, dtype=F64))
    # rotary-embedding-torch takes angles repeated per pair: (seq, r/2) -> (seq, r) interleaved.
    freqs = angles.repeat_interleave(2, dim=-1).to(dtype)
    want = ret_apply_rotary_emb(freqs, x)
    cos, sin = _tables(pos, rotary_dim, dtype=dtype)
    assert_close(posemb.apply_rope(x, cos, sin, Layout.INTERLEAVED), want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", list(Layout))
def test_low_precision_against_float64_reference(dtype, layout):
    g = torch.Generator().manual_seed(2)
    x64 = torch.randn(2, 3, 217, 48, generator=g, dtype=F64)
    x = x64.to(dtype)
    pos = torch.randint(0, 1 << 20, (2, 217), generator=g)
    want = posemb.apply_rope(x.to(F64), *_tables(pos, 32), layout)
    # Tables come in the precision the computation runs in: float64 for float64, else float32.
    table_dtype = F64 if dtype == F64 else torch.float32
    got = posemb.apply_rope(x, *_tables(pos, 32, dtype=table_dtype), layout)
    assert got.dtype == dtype
    assert_close(got, want, dtype)


def test_partial_rotary_passes_channels_through():
    x = torch.randn(1, 2, 5, 16)
    cos, sin = _tables(torch.arange(5), 6, dtype=torch.float32)
    for layout in Layout:
        y = posemb.apply_rope(x, cos, sin, layout)
        assert torch.equal(y[..., 6:], x[..., 6:])
        full = posemb.apply_rope(x[..., :6], cos, sin, layout)
        assert torch.equal(y[..., :6], full)


def test_apply_rope_autograd_is_inverse_rotation():
    # The gradient of a rotation is the rotation by -theta: rotating the upstream gradient back.
    x = torch.randn(1, 2, 9, 16, dtype=F64, requires_grad=True)
    pos = torch.arange(100, 109)
    cos, sin = _tables(pos, 16)
    upstream = torch.randn(1, 2, 9, 16, dtype=F64)
    posemb.apply_rope(x, cos, sin).backward(upstream)
    torch.testing.assert_close(x.grad, posemb.apply_rope(upstream, cos, -sin), **TOL[F64])
    assert torch.autograd.gradcheck(
        lambda t: posemb.apply_rope(t, cos, sin, Layout.INTERLEAVED), (x,)
    )


# --- the module --------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", list(Layout))
def test_module_gqa_positions_and_offsets(layout):
    rope = posemb.RotaryEmbedding(32, base=500000.0, rotary_dim=24, layout=layout)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 8, 11, 32, generator=g)
    k = torch.randn(2, 1, 11, 32, generator=g)
    qr, kr = rope(q, k)
    cos, sin = posemb.cos_sin(torch.arange(11), posemb.inv_freq(24, 500000.0, dtype=F64))
    torch.testing.assert_close(qr, posemb.apply_rope(q, cos, sin, layout), **TOL[torch.float32])
    torch.testing.assert_close(kr, posemb.apply_rope(k, cos, sin, layout), **TOL[torch.float32])
    # A decode step at position t equals row t of the full forward.
    q5, k5 = rope(q[:, :, 5:6], k[:, :, 5:6], torch.tensor([5]))
    torch.testing.assert_close(q5, qr[:, :, 5:6], **TOL[torch.float32])
    torch.testing.assert_close(k5, kr[:, :, 5:6], **TOL[torch.float32])
    # Batch-dependent positions: each row rotates by its own.
    pos = torch.stack((torch.arange(11), torch.arange(100, 111)))
    qb, _ = rope(q, k, pos)
    torch.testing.assert_close(qb[0], qr[0], **TOL[torch.float32])
    q_shift, _ = rope(q[1:], k[1:], torch.arange(100, 111))
    torch.testing.assert_close(qb[1:], q_shift, **TOL[torch.float32])


@pytest.mark.parametrize("dtype", DTYPES)
def test_module_keeps_dtype(dtype):
    q = torch.randn(1, 2, 3, 8).to(dtype)
    qr, kr = posemb.RotaryEmbedding(8)(q, q)
    assert qr.dtype == kr.dtype == dtype


def test_linear_scaling_schedule():
    theta = posemb.inv_freq(16, dtype=F64)
    inv, factor = posemb.scaling.Linear(4.0).compute(16, 10000.0)
    torch.testing.assert_close(inv, theta / 4, rtol=1e-15, atol=0)
    assert factor == 1.0
    assert torch.equal(posemb.scaling.Linear(1).compute(16, 10000.0)[0], theta)
    # Position interpolation: position 4m under Linear(4) is position m under Default.
    q = torch.randn(1, 1, 3, 16, dtype=F64)
    pi = posemb.RotaryEmbedding(16, scaling=posemb.scaling.Linear(4.0))
    torch.testing.assert_close(
        pi.rotate(q, torch.tensor([0, 4, 8])), posemb.RotaryEmbedding(16).rotate(q), **TOL[F64]
    )


def test_assigning_another_scaling_is_never_served_a_cached_table():
    # Regression: the table cache was keyed without the scaling, so a trained model whose
    # schedule the lab swapped kept rotating with the first one it had cached.
    q = torch.randn(1, 1, 6, 16, dtype=F64)
    rope = posemb.RotaryEmbedding(16)
    plain = rope.rotate(q)
    rope.scaling = posemb.scaling.Linear(4.0)
    expected = posemb.RotaryEmbedding(16, scaling=posemb.scaling.Linear(4.0)).rotate(q)
    torch.testing.assert_close(rope.rotate(q), expected, rtol=0, atol=0)
    assert not torch.allclose(rope.rotate(q), plain)
    rope.scaling = posemb.scaling.Default()
    torch.testing.assert_close(rope.rotate(q), plain, rtol=0, atol=0)


# --- layout conversion -------------------------------------------------------------------------


@pytest.mark.parametrize("rotary_dim", [None, 8])
def test_permute_layout_gives_identical_attention(rotary_dim):
    g = torch.Generator().manual_seed(4)
    hidden, heads, kv_heads, head_dim, seq = 40, 4, 2, 12, 9
    wq = torch.randn(heads * head_dim, hidden, generator=g, dtype=F64) / 6
    bq = torch.randn(heads * head_dim, generator=g, dtype=F64)
    wk = torch.randn(kv_heads * head_dim, hidden, generator=g, dtype=F64) / 6
    wv = torch.randn(kv_heads * head_dim, hidden, generator=g, dtype=F64) / 6
    x = torch.randn(2, seq, hidden, generator=g, dtype=F64)

    def run(wq_, bq_, wk_, layout):
        def heads_of(t, n):  # (b, s, n * hd) -> (b, n, s, hd)
            return t.view(2, seq, n, head_dim).transpose(1, 2)

        rope = posemb.RotaryEmbedding(head_dim, rotary_dim=rotary_dim, layout=layout)
        q, k = rope(heads_of(x @ wq_.T + bq_, heads), heads_of(x @ wk_.T, kv_heads))
        return posemb.dot_product_attention(q, k, heads_of(x @ wv.T, kv_heads), causal=True)

    meta = run(wq, bq, wk, Layout.INTERLEAVED)
    conv = [
        posemb.permute_layout(w, n, Layout.HALF, rotary_dim)
        for w, n in ((wq, heads), (bq, heads), (wk, kv_heads))
    ]
    hf = run(*conv, Layout.HALF)
    torch.testing.assert_close(hf, meta, **TOL[F64])
    # Without the conversion the model runs and is quietly wrong.
    assert float((run(wq, bq, wk, Layout.HALF) - meta).abs().max()) > 1e-2
    # Round trip restores the weights exactly.
    back = posemb.permute_layout(conv[0], heads, Layout.INTERLEAVED, rotary_dim)
    assert torch.equal(back, wq)


def test_permute_layout_row_order():
    w = torch.arange(8.0)[:, None].repeat(1, 3)  # one head of 8 rows, row i holds i
    out = posemb.permute_layout(w, 1, "half")
    # Interleaved pairs (0,1), (2,3), (4,5), (6,7) become half-layout rows (j, j + 4).
    assert out[:, 0].tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    assert posemb.permute_layout(w, 1, "interleaved")[:, 0].tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert torch.equal(w[:, 0], torch.arange(8.0))  # input untouched


# --- bad input ---------------------------------------------------------------------------------

x4 = torch.zeros(2, 3, 5, 8)
c5, s5 = _tables(torch.arange(5), 8, dtype=torch.float32)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: posemb.RotaryEmbedding(7), "rotary_dim must be even"),
        (lambda: posemb.RotaryEmbedding(8, rotary_dim=5), "rotary_dim must be even"),
        (
            lambda: posemb.RotaryEmbedding(8, rotary_dim=10),
            "rotary_dim must be <= head_dim = 8, got 10",
        ),
        (lambda: posemb.RotaryEmbedding(8, base=1.0), "base must be finite and greater than 1"),
        (lambda: posemb.RotaryEmbedding(8, base=-3), "base must be finite and greater than 1"),
        (lambda: posemb.RotaryEmbedding(8, layout="neox"), "layout must be a posemb.Layout"),
        (
            lambda: posemb.RotaryEmbedding(8, scaling={"rope_type": "linear"}),
            "scaling must be a posemb.scaling",
        ),
        (lambda: posemb.scaling.Linear(0.5), r"Linear.factor must be a finite number >= 1"),
        (
            lambda: posemb.RotaryEmbedding(8)(x4, x4, torch.arange(5.0)),
            "positions must have an integer dtype",
        ),
        (
            lambda: posemb.RotaryEmbedding(8)(x4, x4, torch.arange(6)),
            r"positions must have shape \(5,\) or \(2, 5\)",
        ),
        (
            lambda: posemb.RotaryEmbedding(8)(x4, x4, torch.zeros(2, 5, 1, dtype=torch.long)),
            "positions must have shape",
        ),
        (
            lambda: posemb.RotaryEmbedding(8)(x4, torch.zeros(2, 3, 5, 6)),
            r"k must have shape \(batch, heads, seq, head_dim=8\)",
        ),
        (
            lambda: posemb.RotaryEmbedding(8)(x4, torch.zeros(2, 3, 4, 8)),
            "q and k must share batch and seq",
        ),
        (lambda: posemb.RotaryEmbedding(8)(x4.long(), x4), "q must have a floating dtype"),
        (lambda: posemb.apply_rope(x4.int(), c5, s5), "x must have a floating dtype"),
        (
            lambda: posemb.apply_rope(x4[0], c5, s5),
            r"x must have shape \(batch, heads, seq, head_dim\)",
        ),
        (lambda: posemb.apply_rope(x4, c5[:4], s5[:4]), "does not match x"),
        (
            lambda: posemb.apply_rope(x4, c5[None].repeat(3, 1, 1), s5[None].repeat(3, 1, 1)),
            "does not match x",
        ),
        (lambda: posemb.apply_rope(x4, c5, s5[:, :2]), "cos and sin must have the same shape"),
        (
            lambda: posemb.apply_rope(x4, c5[None, None], s5[None, None]),
            r"cos and sin must have the same shape with 2 or 3 dimensions",
        ),
        (lambda: posemb.apply_rope(x4[..., :6], c5, s5), "8 channels would rotate"),
        (lambda: posemb.apply_rope(x4, c5.long(), s5), "cos must have a floating dtype"),
        (
            lambda: posemb.permute_layout(torch.zeros(10, 4), 3, "half"),
            "divisible by num_heads = 3",
        ),
        (
            lambda: posemb.permute_layout(torch.zeros(12, 4), 2, "half", rotary_dim=8),
            "rotary_dim must be <= head_dim = 6",
        ),
        (
            lambda: posemb.permute_layout(torch.zeros(12, 4), 0, "half"),
            "num_heads must be a positive integer",
        ),
        (lambda: posemb.permute_layout(torch.zeros(12, 4), 2, "sideways"), "layout must be"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_the_three_forms_share_one_default_layout():
    """apply_rope, rotation_matrix and rope_complex called with defaults rotate the same planes."""
    g = torch.Generator().manual_seed(3)
    theta = posemb.inv_freq(16, dtype=F64)
    x = torch.randn(1, 1, 4, 16, generator=g, dtype=F64)
    pos = torch.tensor([0, 3, 50, 1000])
    cos, sin = posemb.cos_sin(pos, theta, dtype=F64)
    elementwise = posemb.apply_rope(x, cos, sin)
    mats = torch.stack([posemb.rotation_matrix(int(p), theta) for p in pos])
    torch.testing.assert_close(torch.einsum("sij,bhsj->bhsi", mats, x), elementwise, **TOL[F64])
    torch.testing.assert_close(posemb.rope_complex(x, pos, theta), elementwise, **TOL[F64])
    assert posemb.RotaryEmbedding(16).layout is posemb.Layout.HALF


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_rotary_module_survives_dtype_moves(dtype):
    """RotaryEmbedding keeps no tensors: .to()/.half() cannot degrade its float64 angles."""
    rope = posemb.RotaryEmbedding(16, scaling=posemb.scaling.Yarn(4.0, 64))
    g = torch.Generator().manual_seed(4)
    x = torch.randn(1, 2, 6, 16, generator=g, dtype=F64)
    pos = torch.tensor([0, 1, 1000, 4095, 65_536, 1 << 20])
    want = rope.rotate(x, pos)
    moved = rope.half().to(dtype)
    assert list(moved.state_dict()) == []
    got = moved.rotate(x.to(dtype), pos)
    assert got.dtype == dtype
    assert_close(got, want, dtype)


# --- re-rotation of cached keys -------------------------------------------------------------


@pytest.mark.parametrize("layout", [posemb.Layout.HALF, posemb.Layout.INTERLEAVED])
@pytest.mark.parametrize("rotary_dim", [None, 8])
def test_rerotate_equals_rotating_at_the_new_positions(layout, rotary_dim):
    g = torch.Generator().manual_seed(3)
    k = torch.randn(2, 3, 7, 16, generator=g, dtype=torch.float64)
    rope = posemb.RotaryEmbedding(16, rotary_dim=rotary_dim, layout=layout)
    start = torch.randint(0, 5000, (2, 7), generator=g)
    end = torch.randint(0, 5000, (2, 7), generator=g)
    moved = rope.rerotate(rope.rotate(k, start), start, end)
    torch.testing.assert_close(moved, rope.rotate(k, end), rtol=0, atol=1e-12)
    # The fused path, in float32, within that dtype's rounding.
    k32 = k.float()
    fused = rope.rerotate(rope.rotate(k32, start), start, end, fused=True)
    assert_close(fused, rope.rotate(k32, end), torch.float32)


def test_rerotate_from_another_schedule_and_its_attention_factor():
    g = torch.Generator().manual_seed(4)
    k = torch.randn(1, 2, 5, 32, generator=g, dtype=torch.float64)
    plain = posemb.RotaryEmbedding(32)
    yarn = posemb.RotaryEmbedding(32, scaling=posemb.scaling.Yarn(4.0, 64))
    pos = torch.arange(5) * 7
    moved = yarn.rerotate(plain.rotate(k, pos), pos, pos + 3, source=plain)
    torch.testing.assert_close(moved, yarn.rotate(k, pos + 3), rtol=0, atol=1e-12)


def test_rerotate_is_differentiable():
    rope = posemb.RotaryEmbedding(8)
    k = torch.randn(1, 1, 3, 8, dtype=torch.float64, requires_grad=True)
    start, end = torch.tensor([1, 5, 9]), torch.tensor([0, 1, 2])
    assert torch.autograd.gradcheck(lambda x: rope.rerotate(x, start, end), (k,))


def _relative_error(x, exact):
    return float((x.double() - exact).norm() / exact.norm())


def test_ten_thousand_shifts_cost_rounding_not_angle():
    """A float32 key shifted one position at a time, 10,000 times: posemb's re-rotation lands
    where storing the exactly rotated key in float32 after every shift lands (simulated here
    with the float64 Givens matrix), with no angle error on top; composing float32 tables (or
    applying one rounded delta every time) drifts much further."""
    rope = posemb.RotaryEmbedding(128, base=500000.0)
    k0 = torch.randn(1, 4, 1, 128, generator=torch.Generator().manual_seed(5))
    inv = posemb.inv_freq(128, base=500000.0)
    c, s = torch.cos(inv)[None], torch.sin(inv)[None]  # float32 tables of one step
    step64 = posemb.rotation_matrix(1, posemb.inv_freq(128, base=500000.0, dtype=torch.float64))
    ours = rope.rotate(k0, torch.tensor([0]))
    stored, composed = ours.clone(), ours.clone()
    for p in range(10_000):
        ours = rope.rerotate(ours, torch.tensor([p]), torch.tensor([p + 1]))
        stored = (stored.double() @ step64.T).float()  # the exact turn, then one rounding
        composed = posemb.apply_rope(composed, c, s)
    exact = rope.rotate(k0.double(), torch.tensor([10_000]))
    error = _relative_error(ours, exact)
    storage, drift = _relative_error(stored, exact), _relative_error(composed, exact)
    assert error < 1.5 * storage and error < 3e-5, (error, storage)
    assert drift > 8 * error, (drift, error)
    print(f"10,000 shifts: posemb {error:.2e}, storage alone {storage:.2e}, composed {drift:.2e}")


def test_rerotate_refuses_another_geometry():
    rope = posemb.RotaryEmbedding(16)
    k = torch.randn(1, 1, 2, 16)
    pos = torch.arange(2)
    with pytest.raises(ValueError, match=r"source\.layout is"):
        rope.rerotate(k, pos, pos, source=posemb.RotaryEmbedding(16, layout="interleaved"))
    with pytest.raises(ValueError, match="XPos keys carry a position-dependent scale"):
        rope.rerotate(k, pos, pos, source=posemb.XPos(16))
    with pytest.raises(ValueError, match="to_positions must have shape"):
        rope.rerotate(k, pos, torch.arange(3))


@pytest.mark.parametrize("backend", ["reference", "cpu", "auto"])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32])
def test_small_integer_positions_are_positions_not_masks(backend, dtype):
    # uint8 positions indexed the table as a boolean mask (rotating by 0, 1, 2, 3 where they
    # said 1, 1, 1, 3) and int8 / int16 raised IndexError (issue 30, item 2).
    if backend == "cpu" and not posemb.kernels.cpu.available():
        pytest.skip("no CPU op here")
    rope = posemb.RotaryEmbedding(8, backend=backend)
    dev = device_of(backend)
    q = torch.randn(2, 2, 4, 8, device=dev)
    for pos in ([1, 1, 1, 3], [[1, 1, 1, 3], [0, 2, 4, 6]]):
        want = rope(q, q, torch.tensor(pos, dtype=torch.int64, device=dev))
        got = rope(q, q, torch.tensor(pos, dtype=dtype, device=dev))
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    cos, _ = rope.cos_sin(torch.tensor([3, 3], dtype=dtype, device=dev))
    assert torch.equal(cos, rope.cos_sin(torch.tensor([3, 3], device=dev))[0])


def test_changing_base_rotary_dim_or_scaling_after_a_call_serves_no_stale_table():
    # The table key lacked base and rotary_dim: a changed base kept rotating at 10,000 (error
    # 0.27-0.39), a new rotary_dim gave errors of 2-3, and scaling = None an AttributeError.
    q = torch.randn(1, 2, 6, 16)
    rope = posemb.RotaryEmbedding(16)
    rope(q, q)
    rope.base = 500000.0
    assert torch.equal(rope(q, q)[0], posemb.RotaryEmbedding(16, base=500000.0)(q, q)[0])
    rope.rotary_dim = 8
    fresh = posemb.RotaryEmbedding(16, base=500000.0, rotary_dim=8)
    assert torch.equal(rope(q, q)[0], fresh(q, q)[0])
    rope.scaling = posemb.scaling.Linear(2.0)
    rope.scaling = None
    assert torch.equal(rope(q, q)[0], fresh(q, q)[0])
    for name, bad, match in (
        ("base", -1.0, "base must be finite"),
        ("rotary_dim", 7, "rotary_dim must be even"),
        ("rotary_dim", 32, "rotary_dim must be <= head_dim = 16"),
        ("scaling", "yarn", "scaling must be a posemb.scaling object"),
    ):
        with pytest.raises(ValueError, match=match):
            setattr(rope, name, bad)
    assert (rope.base, rope.rotary_dim) == (500000.0, 8)  # a refused value changes nothing


def test_dynamic_ntk_decoding_past_its_length_keeps_no_table_per_step():
    # Past L every decode step is a new length and a new base: each step formed and kept a
    # (2, p + 1, r/2) table for one token (300 steps from p = 2000 held ~140 MB in 256 tables).
    ntk = posemb.scaling.DynamicNTK(2.0, 1024)
    rope = posemb.RotaryEmbedding(64, scaling=ntk)
    q = torch.randn(1, 2, 1, 64)
    rope(q, q, torch.tensor([5]))  # within L: one table serves every step
    assert rope.table_builds == 1
    for p in range(2000, 2040):
        got, _ = rope(q, q, torch.tensor([p]))
        inv, _ = ntk.compute(64, 10000.0, seq_len=p + 1)
        want = posemb.apply_rope(q.double(), *posemb.cos_sin(torch.tensor([p]), inv, F64))
        assert_close(got, want, torch.float32)
    prefill = torch.randn(1, 2, 1500, 64)
    got, _ = rope(prefill, prefill)  # default positions past L: computed, not kept either
    inv, _ = ntk.compute(64, 10000.0, seq_len=1500)
    assert_close(got, posemb.apply_rope(prefill.double(), *_tables_of(1500, inv)), torch.float32)
    assert rope.table_builds == 1 and len(rope._tables) == 1


def _tables_of(n, inv):
    return posemb.cos_sin(torch.arange(n), inv, F64)


@pytest.mark.parametrize("backend", ["auto", "cpu"])
def test_vmap_and_jacrev_run_over_a_fused_module(backend):
    # "Batching rule not implemented for posemb::_rotate_cpu_into" and "must override the
    # setup_context staticmethod": under torch.func the fused backends now take the reference.
    if backend == "cpu" and not posemb.kernels.cpu.available():
        pytest.skip("no CPU op here")
    rope = posemb.RotaryEmbedding(8, backend=backend)
    dev = device_of(backend)
    q = torch.randn(3, 1, 2, 4, 8, device=dev)
    pos = torch.tensor([[3, 4, 5, 6], [0, 1, 2, 3], [9, 9, 9, 9]], device=dev)
    loop = torch.stack([rope(x, x, p)[0] for x, p in zip(q, pos, strict=True)])
    assert_close(torch.func.vmap(lambda x, p: rope(x, x, p)[0])(q, pos), loop, torch.float32)
    at_zero = torch.stack([rope(x, x)[0] for x in q])
    assert_close(torch.func.vmap(lambda x: rope(x, x)[0])(q), at_zero, torch.float32)
    reference = posemb.RotaryEmbedding(8, backend="reference")
    jac = torch.func.jacrev(lambda x: rope(x, x, pos[0])[1])(q[0])
    want = torch.func.jacrev(lambda x: reference(x, x, pos[0])[1])(q[0])
    assert_close(jac, want, torch.float32)
    dynamic = posemb.RotaryEmbedding(8, scaling=posemb.scaling.DynamicNTK(2.0, 4))
    with pytest.raises(ValueError, match="vmap over positions cannot"):
        torch.func.vmap(lambda p: dynamic(q[0], q[0], p)[0])(pos)
    got = torch.func.vmap(lambda x: dynamic(x, x, pos[0])[0])(q)[1]
    assert_close(got, dynamic(q[1], q[1], pos[0])[0], torch.float32)


def test_a_module_pickled_before_the_checked_properties_still_loads():
    # Old pickles hold base, rotary_dim and scaling under their plain names, which the
    # properties hid: r.base and forward raised AttributeError after torch.load.
    rope = posemb.RotaryEmbedding(8, base=500000.0)
    q = torch.randn(1, 1, 3, 8)
    rope(q, q)
    for name in ("base", "rotary_dim", "scaling"):
        rope.__dict__[name] = rope.__dict__.pop("_" + name)
    loaded = pickle.loads(pickle.dumps(rope))
    assert (loaded.base, loaded.rotary_dim) == (500000.0, 8)
    assert torch.equal(loaded(q, q)[0], posemb.RotaryEmbedding(8, base=500000.0)(q, q)[0])
    fresh = posemb.RotaryEmbedding(8)
    fresh(q, q)
    assert not copy.deepcopy(fresh)._tables and fresh._tables  # a cache is not carried


def test_tables_formed_under_inference_mode_serve_training_later():
    rope = posemb.RotaryEmbedding(8)
    q = torch.randn(1, 1, 3, 8)
    with torch.inference_mode():
        rope(q, q)  # was kept as an inference tensor: "cannot be saved for backward" below
    x = q.clone().requires_grad_()
    rope(x, x)[0].sum().backward()
    assert x.grad is not None


def test_forward_mode_ad_keeps_the_tangent_on_a_fused_module():
    from torch.autograd import forward_ad

    q, t = torch.randn(1, 1, 3, 8), torch.randn(1, 1, 3, 8)
    with forward_ad.dual_level():
        out, _ = posemb.RotaryEmbedding(8)(forward_ad.make_dual(q, t), q)
        tangent = forward_ad.unpack_dual(out).tangent  # was None on auto/cpu, silently
    assert tangent is not None
    assert_close(tangent, posemb.RotaryEmbedding(8, backend="reference")(t, t)[0], torch.float32)


def test_uint64_positions_beyond_int64_are_refused_not_wrapped():
    q = torch.randn(1, 1, 1, 8)
    with pytest.raises(ValueError, match="uint64 values of 2"):
        posemb.RotaryEmbedding(8)(q, q, torch.tensor([2**64 - 1], dtype=torch.uint64))


def test_xpos_rerotate_blames_itself_not_a_source_nobody_passed():
    k, p = torch.randn(1, 1, 3, 16), torch.arange(3)
    with pytest.raises(ValueError, match="XPos keys carry a position-dependent scale; they"):
        posemb.XPos(16).rerotate(k, p, p)


@pytest.mark.parametrize(
    "positions",
    [[[700]], [5, 6, 7, 8], [[3, 4, 5]], [9, 7, 8], [[1, 2], [2, 3]], [0, 2_000_000_000]],
    ids=["decode", "run", "run-batch1", "unordered", "batch2", "far-gap"],
)
def test_explicit_positions_rotate_as_their_own_tables_say(positions):
    # A decode step's consecutive positions take a slice of the cached table (a view), other
    # sets a gather or a direct computation; every way must equal cos_sin at those positions.
    rope = posemb.RotaryEmbedding(16)
    pos = torch.tensor(positions)
    batch = pos.shape[0] if pos.dim() == 2 else 1
    q = torch.randn(batch, 3, pos.shape[-1], 16, dtype=torch.float64)
    k = torch.randn(batch, 1, pos.shape[-1], 16, dtype=torch.float64)
    got_q, got_k = rope(q, k, pos)
    cos, sin = rope.cos_sin(pos, dtype=torch.float64)
    want_q, want_k = posemb.kernels.rotate(q, k, cos, sin, backend="reference")
    torch.testing.assert_close(got_q, want_q, rtol=0, atol=1e-12)
    torch.testing.assert_close(got_k, want_k, rtol=0, atol=1e-12)
    # The cached table is read, never written: a second call gives the same.
    again_q, _ = rope(q, k, pos)
    torch.testing.assert_close(again_q, got_q, rtol=0, atol=0)
