"""Every fused path against the reference: forward, backward, dtypes, layouts, shapes, offsets."""

import pytest
import torch

import posemb
from devices import ON_GPU, device_of
from posemb import Layout, kernels
from posemb.kernels import reference
from tolerances import assert_close

F64 = torch.float64
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
FUSED = ["cpu", "triton"]
DEVICE = device_of("triton")


def tables(positions, rotary_dim, device, base=10000.0):
    return posemb.cos_sin(positions, posemb.inv_freq(rotary_dim, base, dtype=F64).to(device))


def make(shape_q, kv_heads, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    b, _, s, d = shape_q
    q = torch.randn(shape_q, generator=g).to(device=device, dtype=dtype)
    k = torch.randn(b, kv_heads, s, d, generator=g).to(device=device, dtype=dtype)
    return q, k


# (q shape, kv heads, rotary dim): odd length, one head, GQA with one KV head, partial rotary.
CASES = [
    ((2, 4, 217, 64), 1, 64),
    ((1, 1, 3, 16), 1, 16),
    ((2, 3, 33, 80), 3, 48),
    ((3, 2, 1, 128), 2, 128),
]


@pytest.mark.parametrize("backend", FUSED)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", list(Layout))
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[0])))
@pytest.mark.parametrize("batch_positions", [False, True])
def test_forward_and_backward_match_reference(backend, dtype, layout, case, batch_positions):
    shape, kv, rotary = case
    device = device_of(backend)
    q, k = make(shape, kv, dtype, device)
    b, _, s, _ = shape
    g = torch.Generator().manual_seed(1)
    if batch_positions:  # per-sequence positions, as a KV cache at different offsets gives
        pos = torch.randint(0, 1 << 20, (b, s), generator=g).to(device)
    else:
        pos = torch.arange(1000, 1000 + s, device=device)
    cos, sin = tables(pos, rotary, device)
    want_q = reference.rotate(q, cos, sin, layout)
    want_k = reference.rotate(k, cos, sin, layout)
    got_q, got_k = kernels.rotate(q, k, cos, sin, layout=layout, backend=backend)
    assert got_q.dtype == dtype and got_q.shape == q.shape
    assert_close(got_q, want_q, dtype)
    assert_close(got_k, want_k, dtype)

    # Backward: the fused autograd function against autograd through the reference.
    qf, kf = q.clone().requires_grad_(), k.clone().requires_grad_()
    gq, gk = make(shape, kv, dtype, device, seed=2)
    out_q, out_k = kernels.rotate(qf, kf, cos, sin, layout=layout, backend=backend)
    # The registered op's own autograd, not autograd through reference operations.
    assert f"posemb_rotate_{backend}" in type(out_q.grad_fn).__name__
    torch.autograd.backward((out_q, out_k), (gq, gk))
    qr, kr = q.clone().requires_grad_(), k.clone().requires_grad_()
    torch.autograd.backward(
        (reference.rotate(qr, cos, sin, layout), reference.rotate(kr, cos, sin, layout)), (gq, gk)
    )
    assert_close(qf.grad, qr.grad, dtype)
    assert_close(kf.grad, kr.grad, dtype)


@pytest.mark.parametrize("backend", ["reference", *FUSED])
def test_inplace_rotates_in_own_memory(backend):
    device = device_of(backend)
    q, k = make((2, 4, 19, 32), 2, torch.float32, device)
    cos, sin = tables(torch.arange(19, device=device), 24, device)
    want_q, want_k = kernels.rotate(q, k, cos, sin, backend="reference")
    ptr_q, ptr_k = q.data_ptr(), k.data_ptr()
    got_q, got_k = kernels.rotate(q, k, cos, sin, backend=backend, inplace=True)
    assert got_q.data_ptr() == ptr_q and got_k.data_ptr() == ptr_k
    assert_close(q, want_q, torch.float32)
    assert_close(k, want_k, torch.float32)
    with pytest.raises(ValueError, match="inplace=True rotates q and k in their own memory"):
        kernels.rotate(q.requires_grad_(), k, cos, sin, backend=backend, inplace=True)


@pytest.mark.parametrize("backend", FUSED)
def test_strided_input_from_bshd_layout(backend):
    device = device_of(backend)
    x = torch.randn(2, 9, 4, 32, device=device)  # (batch, seq, heads, dim) as projections give
    q = x.transpose(1, 2)  # a view with unit stride in dim only
    cos, sin = tables(torch.arange(9, device=device), 32, device)
    got, _ = kernels.rotate(q, q[:, :1], cos, sin, backend=backend)
    assert_close(got, reference.rotate(q.contiguous(), cos, sin, Layout.HALF), torch.float32)


@pytest.mark.parametrize("backend", ["reference", *FUSED])
@pytest.mark.parametrize("layout", list(Layout))
def test_cached_tables_with_positions_offsets_and_packed_sequences(backend, layout):
    device = device_of(backend)
    rotary, length = 24, 600
    cos, sin = tables(torch.arange(length, device=device), rotary, device)
    q, k = make((3, 4, 7, 32), 2, torch.bfloat16, device)
    # Per-sequence offsets (three KV caches at different lengths).
    offsets = torch.tensor([0, 100, 590], device=device)
    got_q, got_k = kernels.rotate_cached(
        q, k, cos, sin, offsets=offsets, layout=layout, backend=backend
    )
    rows = torch.arange(7, device=device)[None] + offsets[:, None]
    assert_close(got_q, reference.rotate(q, cos[rows], sin[rows], layout), torch.bfloat16)
    assert_close(got_k, reference.rotate(k, cos[rows], sin[rows], layout), torch.bfloat16)
    # Explicit positions.
    pos = torch.tensor([5, 3, 599, 0, 17, 17, 2], device=device)
    got_q, _ = kernels.rotate_cached(q, k, cos, sin, positions=pos, layout=layout, backend=backend)
    assert_close(got_q, reference.rotate(q, cos[pos], sin[pos], layout), torch.bfloat16)
    # Packed sequences of lengths 5, 0, 11 with offsets: (total, heads, dim).
    cu = torch.tensor([0, 5, 5, 16], dtype=torch.int32, device=device)
    pq, pk = make((1, 4, 16, 32), 1, torch.float16, device, seed=3)
    pq, pk = pq[0].transpose(0, 1).contiguous(), pk[0].transpose(0, 1).contiguous()
    off = torch.tensor([10, 20, 30], device=device)
    got_q, got_k = kernels.rotate_cached(
        pq, pk, cos, sin, cu_seqlens=cu, offsets=off, layout=layout, backend=backend
    )
    rows = torch.cat((torch.arange(5, device=device) + 10, torch.arange(11, device=device) + 30))

    def packed_ref(x):
        return reference.rotate(x.transpose(0, 1)[None], cos[rows][None], sin[rows][None], layout)[
            0
        ].transpose(0, 1)

    assert_close(got_q, packed_ref(pq), torch.float16)
    assert_close(got_k, packed_ref(pk), torch.float16)


@pytest.mark.parametrize("backend", ["reference", *FUSED])
def test_offsets_and_cu_seqlens_that_are_strided_views(backend):
    """Issue 54, bug 9: the Triton kernel read ``offsets[b]`` and ``cu_seqlens[b]`` as
    contiguous, so a column of a (batch, 2) table or ``cu[::2]`` was read from the wrong
    memory (errors from 5.4 up to 1e31, past the cache the host had checked)."""
    device = device_of(backend)
    cos, sin = tables(torch.arange(64, device=device), 16, device)
    q, k = make((3, 2, 5, 16), 1, torch.float32, device)
    table = torch.tensor([[3, 900], [7, 901], [11, 902]], device=device)
    offsets = table[:, 0]  # a column: stride 2
    assert offsets.stride(0) == 2
    got_q, got_k = kernels.rotate_cached(q, k, cos, sin, offsets=offsets, backend=backend)
    rows = torch.arange(5, device=device)[None] + offsets[:, None]
    assert_close(got_q, reference.rotate(q, cos[rows], sin[rows], Layout.HALF), torch.float32)
    assert_close(got_k, reference.rotate(k, cos[rows], sin[rows], Layout.HALF), torch.float32)
    pq, pk = q[0].transpose(0, 1).contiguous(), k[0].transpose(0, 1).contiguous()  # (5, H, D)
    cu = torch.tensor([0, 99, 2, 99, 5, 99], dtype=torch.int32, device=device)[::2]
    off = torch.tensor([[40, 0], [9, 0]], device=device)[:, 0]
    got_q, got_k = kernels.rotate_cached(pq, pk, cos, sin, cu_seqlens=cu, offsets=off,
                                         backend=backend)  # fmt: skip
    rows = torch.tensor([40, 41, 9, 10, 11], device=device)
    for got, x in ((got_q, pq), (got_k, pk)):
        want = reference.rotate(x.transpose(0, 1)[None], cos[rows][None], sin[rows][None],
                                Layout.HALF)[0].transpose(0, 1)  # fmt: skip
        assert_close(got, want, torch.float32)


@pytest.mark.parametrize("backend", FUSED)
@pytest.mark.parametrize("which", ["q", "sin"])
def test_a_view_with_the_negative_bit_is_rotated_by_its_values(backend, which):
    """Issue 54, bug 11: the Triton kernel read a ``torch._neg_view`` q or table by its memory,
    not its (negated) values; the remembered decode path must not take one either."""
    device = device_of(backend)
    cos, sin = tables(torch.arange(5, device=device), 16, device)
    q, k = make((1, 2, 5, 16), 1, torch.float32, device)
    want = reference.rotate(q, cos, sin, Layout.HALF)
    for _ in range(2):  # the second call may take a remembered signature
        kernels.rotate(q, k, cos, sin, backend=backend)
    if which == "q":
        flagged, args = torch._neg_view(-q), (cos, sin)
    else:
        flagged, args = q, (cos, torch._neg_view(-sin))
    assert (flagged if which == "q" else args[1]).is_neg()
    for _ in range(2):
        got, _ = kernels.rotate(flagged, k, *args, backend=backend)
        assert_close(got, want, torch.float32)
        got, _ = kernels.rotate(flagged, k, *args)  # auto: the decode path's door
        assert_close(got, want, torch.float32)
    w = torch.rand(16, device=device) + 0.5
    got, _ = kernels.norm_rotate(flagged, k, *args, w, torch._neg_view(-w), 1e-6, backend=backend)
    want = kernels.norm_rotate(q, k, cos, sin, w, w, 1e-6, backend="reference")[0]
    assert_close(got, want, torch.float32)
    with pytest.raises(posemb.InputError, match="negative or conjugate bit"):
        kernels.rotate(torch._neg_view(q.clone()), k.clone(), cos, sin, backend=backend,
                       inplace=True)  # fmt: skip


@pytest.mark.parametrize("backend", FUSED)
def test_module_backends_agree(backend):
    device = device_of(backend)
    q, k = make((2, 8, 13, 64), 2, torch.float32, device)
    scaling = posemb.scaling.Yarn(4.0, 8)
    fused = posemb.RotaryEmbedding(64, rotary_dim=32, scaling=scaling, backend=backend)
    ref = posemb.RotaryEmbedding(64, rotary_dim=32, scaling=scaling, backend="reference")
    pos = torch.arange(40, 53, device=device)
    for a, b in zip(fused(q, k, pos), ref(q, k, pos), strict=True):
        assert_close(a, b, torch.float32)


def test_auto_picks_a_fused_path_and_reference_for_float64():
    x = torch.zeros(1, 1, 2, 8)
    assert kernels.resolve_backend("auto", x) == "cpu"
    assert kernels.resolve_backend("auto", x.double()) == "reference"


def test_gradcheck_reference_in_float64():
    x = torch.randn(1, 2, 5, 8, dtype=F64, requires_grad=True)
    cos, sin = tables(torch.arange(5), 8, "cpu")
    assert torch.autograd.gradcheck(lambda t: reference.rotate(t, cos, sin, "half"), (x,))


@pytest.mark.parametrize("backend", FUSED)
@pytest.mark.parametrize("needs", ["q", "k"])
def test_a_side_without_gradient_costs_no_work(monkeypatch, backend, needs):
    """When only q (or only k) needs a gradient, the backward rotates no head of the other."""
    seen = []
    if backend != "cpu":
        from posemb.kernels import triton as tr

        real = tr.launch
        monkeypatch.setattr(
            tr,
            "launch",
            lambda q, k, *a, **kw: seen.append((q.shape[1], k.shape[1])) or real(q, k, *a, **kw),
        )
    q, k = make((1, 4, 9, 16), 2, torch.float32, device_of(backend))
    cos, sin = tables(torch.arange(9, device=q.device), 16, q.device)
    (q if needs == "q" else k).requires_grad_()
    out_q, out_k = kernels.rotate(q, k, cos, sin, backend=backend)
    seen.clear()
    if backend == "cpu":  # the backward's one call of the op, as the profiler saw its inputs
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    record_shapes=True) as prof:  # fmt: skip
            (out_q if needs == "q" else out_k).sum().backward()
        calls = [e.input_shapes[:2] for e in prof.events() if e.name == "posemb::rotate_cpu"]
        assert calls == (
            [[[1, 4, 9, 16], [1, 0, 9, 16]]] if needs == "q" else [[[1, 0, 9, 16], [1, 2, 9, 16]]]
        )
    else:  # one launch over both sides
        (out_q if needs == "q" else out_k).sum().backward()
        assert seen == ([(4, 0)] if needs == "q" else [(0, 2)])


def _op_cases(device):
    """Arguments for opcheck: dtypes, layouts, partial rotary, GQA, per-sequence tables,
    positions far out, and key tables of their own (xPos)."""
    g = torch.Generator().manual_seed(5)
    for dtype in DTYPES:
        for (b, h, s, d), kv, rotary in CASES[1:]:
            for interleaved in (False, True):
                q = torch.randn(b, h, s, d, generator=g).to(device=device, dtype=dtype)
                k = torch.randn(b, kv, s, d, generator=g).to(device=device, dtype=dtype)
                pos = torch.randint(0, 1 << 20, (b, s), generator=g).to(device)
                cos, sin = (t.float().contiguous() for t in tables(pos, rotary, device))
                key = (cos * 0.5, sin * 0.5) if interleaved else (None, None)
                yield q, k, cos, sin, *key, interleaved


@pytest.mark.parametrize("inplace", [False, True])
def test_opcheck_cpu_ops(inplace):
    from posemb.kernels import cpu

    assert cpu.load() is not None, cpu.unavailable_reason()
    op = torch.ops.posemb.rotate_cpu_ if inplace else torch.ops.posemb.rotate_cpu
    for q, k, cos, sin, kc, ks, interleaved in _op_cases("cpu"):
        if not inplace:
            q, k = q.requires_grad_(), k.requires_grad_()
        torch.library.opcheck(op.default, (q, k, cos, sin, kc, ks, interleaved, False))


def test_opcheck_cpu_into_op():
    """The eager path's op, rotating into outputs the caller allocated."""
    from posemb.kernels import cpu

    assert cpu.load() is not None, cpu.unavailable_reason()
    op = torch.ops.posemb._rotate_cpu_into.default
    for q, k, cos, sin, kc, ks, interleaved in _op_cases("cpu"):
        outs = (torch.empty_like(q), torch.empty_like(k))
        torch.library.opcheck(op, (q, k, *outs, cos, sin, kc, ks, interleaved, False))
        want = kernels.rotate(q, k, cos, sin, k_cos=kc, k_sin=ks, backend="reference",
                              layout="interleaved" if interleaved else "half")  # fmt: skip
        op(q, k, *outs, cos, sin, kc, ks, interleaved, False)
        assert_close(outs[0], want[0], q.dtype)
        assert_close(outs[1], want[1], q.dtype)


# Triton's CPU interpreter copies every argument to host memory, which fake tensors cannot do:
# on the CPU the fake-tensor and AOT checks run only on the CPU op; benchmarks/gpu.sh runs all.
TRITON_OPCHECKS = (
    ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    if ON_GPU
    else ("test_schema", "test_autograd_registration")
)


@pytest.mark.parametrize("inplace", [False, True])
def test_opcheck_triton_ops(inplace):
    from posemb.kernels import triton as _  # noqa: F401  (registers the ops)

    op = torch.ops.posemb.rotate_triton_ if inplace else torch.ops.posemb.rotate_triton
    # The interpreter runs each program in Python: a few cases keep this test short.
    for i, (q, k, cos, sin, kc, ks, interleaved) in enumerate(_op_cases(DEVICE)):
        if i % 4:
            continue
        if not inplace and q.dtype == torch.float32:
            q, k = q.requires_grad_(), k.requires_grad_()
        n = cos.shape[-1]
        flat = (cos.reshape(-1, n), sin.reshape(-1, n))
        kflat = (None, None) if kc is None else (kc.reshape(-1, n), ks.reshape(-1, n))
        args = (q, k, *flat, *kflat, interleaved, False, None, None, None, 0, q.shape[2])
        torch.library.opcheck(op.default, args, test_utils=TRITON_OPCHECKS)


q4 = torch.zeros(2, 3, 5, 8)
c5, s5 = tables(torch.arange(5), 8, "cpu")


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (
            lambda: kernels.rotate(q4, q4, c5, s5, backend="gpu"),
            ValueError,
            "backend must be one of auto, reference, cpu, triton",
        ),
        (
            lambda: kernels.rotate(q4.double(), q4.double(), c5, s5, backend="cpu"),
            ValueError,
            "backend='cpu' supports float32",
        ),
        (
            lambda: kernels.rotate(q4[..., ::2], q4[..., ::2], c5[:, :2], s5[:, :2]),
            ValueError,
            "unit stride in its last dimension",
        ),
        (lambda: kernels.rotate(q4, q4[:, :, :4], c5, s5), ValueError, "q and k must agree"),
        (lambda: kernels.rotate(q4, q4, c5[:4], s5[:4]), ValueError, "does not match q"),
        (
            lambda: kernels.rotate(q4, q4, c5.to("meta"), s5.to("meta")),
            ValueError,
            "cos is on meta",
        ),
        (
            lambda: kernels.rotate(q4[0], q4[0], c5, s5),
            ValueError,
            r"q must have shape \(batch, heads, seq, head_dim\)",
        ),
        (
            lambda: kernels.rotate_cached(q4, q4, c5, s5, offsets=1),
            ValueError,
            r"position 5 is outside \[0, 5\) of the cached cos/sin table of 5 rows",
        ),
        (
            lambda: kernels.rotate_cached(q4, q4, c5, s5, positions=torch.tensor([0, 1, 2, 3, -1])),
            ValueError,
            "position -1 is outside",
        ),
        (
            lambda: kernels.rotate_cached(
                q4[0].transpose(0, 1),
                q4[0].transpose(0, 1),
                c5,
                s5,
                cu_seqlens=torch.tensor([0, 3, 2, 5]),
            ),
            ValueError,
            "cu_seqlens must be non-decreasing",
        ),
        (
            lambda: kernels.rotate_cached(
                q4[0].transpose(0, 1),
                q4[0].transpose(0, 1),
                c5,
                s5,
                cu_seqlens=torch.tensor([0, 3, 4]),
            ),
            ValueError,
            "cu_seqlens must start at 0 and end at the total length 5",
        ),
        (
            lambda: kernels.rotate_cached(q4, q4, c5, s5, offsets=torch.tensor([0, 1, 2])),
            ValueError,
            r"offsets must have shape \(2,\)",
        ),
        (lambda: posemb.RotaryEmbedding(8, backend="cuda"), ValueError, "backend must be one of"),
    ],
)
def test_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_triton_backend_refuses_cpu_tensors_outside_the_interpreter(monkeypatch):
    if ON_GPU:
        pytest.skip("a GPU is present")
    # Imported first: triton fixes a kernel's mode (interpreted or compiled) when the module
    # defining it is imported, and every later test of this worker needs the interpreter.
    from posemb.kernels import triton as _  # noqa: F401

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="backend='triton' needs CUDA tensors"):
        kernels.rotate(q4, q4, c5, s5, backend="triton")


@pytest.mark.parametrize("inplace", [False, True])
def test_opcheck_triton_ops_with_positions_offsets_and_packed_sequences(inplace):
    from posemb.kernels import triton as _  # noqa: F401  (registers the ops)

    op = torch.ops.posemb.rotate_triton_ if inplace else torch.ops.posemb.rotate_triton
    g = torch.Generator().manual_seed(8)
    cos, sin = (t.float().contiguous().to(DEVICE) for t in tables(torch.arange(64), 16, "cpu"))
    q = torch.randn(2, 3, 5, 16, generator=g).to(DEVICE)
    k = torch.randn(2, 1, 5, 16, generator=g).to(DEVICE)
    pos = torch.tensor([[3, 9, 10, 20, 40]], device=DEVICE)
    off = torch.tensor([0, 7], device=DEVICE)
    grad = not inplace
    cases = [
        (q.requires_grad_(grad), k.requires_grad_(grad), pos, off, None, 0),
        # Packed: sequences of 2 and 4 tokens, (total, heads, head_dim).
        (
            torch.randn(6, 3, 16, generator=g).to(DEVICE).requires_grad_(grad),
            torch.randn(6, 1, 16, generator=g).to(DEVICE).requires_grad_(grad),
            None,
            off,
            torch.tensor([0, 2, 6], device=DEVICE),
            4,
        ),
    ]
    for qq, kk, p, o, cu, max_len in cases:
        args = (qq, kk, cos, sin, None, None, False, False, p, o, cu, max_len, 0)
        torch.library.opcheck(op.default, args, test_utils=TRITON_OPCHECKS)


# --- in place: nothing written twice (issue 30, item 5 and item 10's expanded k) ---------------


def _overlapping_views(device):
    """(name, q, k) pairs an in-place rotation must refuse: each writes some element twice."""
    x = torch.randn(1, 3, 4, 8, device=device)
    flat = torch.randn(100, device=device)
    half = flat.as_strided((1, 2, 4, 8), (64, 32, 8, 1), 4)  # rows half over x's rows
    expanded = torch.randn(1, 1, 4, 8, device=device).expand(1, 2, 4, 8)
    return [
        ("k is a head of q", x, x[:, :1]),
        ("q is a head of k", x[:, 2:], x),
        ("k half over q", flat.as_strided((1, 2, 4, 8), (64, 32, 8, 1), 0), half),
        ("expanded k", torch.randn(1, 2, 4, 8, device=device), expanded),
        (
            "k's rows overlap",
            torch.randn(1, 1, 4, 8, device=device),
            flat.as_strided((1, 1, 4, 8), (32, 32, 5, 1)),
        ),
    ]


@pytest.mark.parametrize("backend", ["reference", *FUSED])
@pytest.mark.parametrize("case", range(5))
def test_inplace_refuses_q_and_k_that_share_elements(backend, case):
    # rope(x, x[:, :1], inplace=True) turned head 0 twice on the CPU op and once on the
    # reference; an expanded k raised a RuntimeError from C++ or from PyTorch.
    device = device_of(backend)
    name, q, k = _overlapping_views(device)[case]
    before = (q.clone(), k.clone())
    rope = posemb.RotaryEmbedding(8, backend=backend)
    with pytest.raises(ValueError, match="inplace=True writes"):
        rope(q, k, inplace=True)
    assert torch.equal(q, before[0]) and torch.equal(k, before[1]), name  # nothing written
    with pytest.raises(ValueError, match="inplace=True writes"):
        tables_ = rope.cos_sin(torch.arange(8, device=device))
        kernels.rotate_cached(q, k, *tables_, inplace=True, backend=backend)
    rope(q, k)  # out of place nothing is written: every such pair is fine


@pytest.mark.parametrize("backend", ["reference", *FUSED])
def test_inplace_rotates_disjoint_heads_of_one_packed_buffer(backend):
    # q, k and v as views of one (batch, seq, heads, dim) projection share memory but no
    # element: in place must keep working for them.
    qkv = torch.randn(2, 5, 12, 8, device=device_of(backend)).transpose(1, 2)
    q, k = qkv[:, :8], qkv[:, 8:10]
    rope = posemb.RotaryEmbedding(8, backend=backend)
    want = rope(q.clone(), k.clone())
    v = qkv[:, 10:].clone()
    rope(q, k, inplace=True)
    assert torch.equal(q, want[0]) and torch.equal(k, want[1]) and torch.equal(qkv[:, 10:], v)


# --- gradients reach the tables (issue 30, item 6) ---------------------------------------------


def _grads(backend, cached, q_grad, device):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 3, 5, 8, generator=g).to(device).requires_grad_(q_grad)
    k = torch.randn(2, 1, 5, 8, generator=g).to(device)
    pos = torch.arange(9, device=device)
    cos, sin = (t.clone().requires_grad_() for t in tables(pos, 8, device))
    if cached:
        offsets = torch.tensor([0, 4], device=device)
        qo, ko = kernels.rotate_cached(q, k, cos, sin, offsets=offsets, backend=backend)
    else:
        qo, ko = kernels.rotate(q, k, cos[2:7], sin[2:7], backend=backend)
    ((qo * torch.linspace(-1, 1, 8, device=device)).sum() + (ko**2).sum()).backward()
    return [t.grad.cpu() for t in (cos, sin, q) if t.grad is not None]


@pytest.mark.parametrize("backend", FUSED)
@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("q_grad", [False, True])
def test_tables_that_require_grad_get_their_gradient_on_every_backend(backend, cached, q_grad):
    # The fused ops differentiated with respect to q and k only: cos.grad was None on
    # auto/cpu, and with only the tables requiring grad backward() failed.
    device = device_of(backend)
    got = _grads(backend, cached, q_grad, device)
    want = _grads("reference", cached, q_grad, "cpu")
    assert len(got) == len(want) == 2 + q_grad
    for a, b in zip(got, want, strict=True):
        assert_close(a, b, torch.float32)
    cos, sin = (t.requires_grad_() for t in tables(torch.arange(5, device=device), 8, device))
    q = torch.randn(1, 1, 5, 8, device=device)
    with pytest.raises(ValueError, match="a cos/sin table requires grad"):
        kernels.rotate(q, q.clone(), cos, sin, backend=backend, inplace=True)


@pytest.mark.parametrize("backend", ["reference", *FUSED])
def test_rotating_one_tensor_in_place_checks_it_alone(backend):
    # rotate() passes an empty k; the check skipped q then (the reference accepted rows that
    # overlap by half; the CPU op raised a RuntimeError from C++).
    rope = posemb.RotaryEmbedding(8, backend=backend)
    device = device_of(backend)
    for x in (
        torch.randn(64, device=device).as_strided((1, 1, 3, 8), (64, 64, 4, 1)),
        torch.randn(1, 1, 3, 8, device=device).expand(1, 2, 3, 8),
    ):
        with pytest.raises(ValueError, match="inplace=True writes q"):
            rope.rotate(x, inplace=True)


def test_in_place_under_compile_turns_a_shared_head_once():
    # The check has no storage to read while tracing; the fused in-place op turned head 0 of
    # rope(x, x[:, :1], inplace=True) twice under torch.compile (error 3.0).
    rope = posemb.RotaryEmbedding(8)
    x = torch.randn(1, 3, 4, 8)
    want = posemb.RotaryEmbedding(8, backend="reference")(x, x)[0]
    with torch.no_grad():
        # aot_eager: the tracing and functionalisation that went wrong, without a C++ build
        fn = torch.compile(lambda t: rope(t, t[:, :1], inplace=True), backend="aot_eager")
        fn(x)
    assert_close(x, want, torch.float32)


def test_rotate_cached_positions_and_offsets_cannot_wrap_into_a_row():
    cos, sin = posemb.RotaryEmbedding(8).cos_sin(torch.arange(8))
    q = torch.randn(1, 1, 1, 8)
    with pytest.raises(ValueError, match="positions must lie within"):
        kernels.rotate_cached(q, q, cos, sin, positions=torch.tensor([-(1 << 63)]),
                              offsets=torch.tensor([-(1 << 63) + 3]))  # fmt: skip


def _spanning(shape, dtype, device, seed):
    """A (3, H, S, D) view whose sequences start 2^30 elements apart, so the third starts at
    2^31: each stride fits 32 bits (Triton passes it as int32), their product does not. The
    storage is allocated, not touched: only the view's elements are written."""
    _, h, s, d = shape
    storage = torch.empty((1 << 31) + h * s * d, dtype=dtype, device=device)
    x = storage.as_strided(shape, (1 << 30, s * d, d, 1))
    g = torch.Generator().manual_seed(seed)
    x.copy_(torch.randn(shape, generator=g).to(device=device, dtype=dtype))
    return x


@pytest.mark.parametrize("layout", list(Layout))
@pytest.mark.parametrize("inplace", [False, True])
def test_a_view_spanning_2_to_the_31_elements_takes_64_bit_offsets(layout, inplace):
    """Offsets are 32-bit unless a tensor of the call spans 2^31 elements; past that, a
    32-bit offset would wrap and rotate the wrong memory."""
    device = device_of("triton")
    q = _spanning((3, 2, 3, 64), torch.float16, device, seed=0)
    k = torch.randn(3, 1, 3, 64, generator=torch.Generator().manual_seed(1)).to(device, F64)
    k = k.to(torch.float16)
    cos, sin = tables(torch.arange(40, 43, device=device), 64, device)
    want_q = reference.rotate(q.clone(), cos, sin, layout)
    want_k = reference.rotate(k, cos, sin, layout)
    got_q, got_k = kernels.rotate(q, k, cos, sin, layout=layout, backend="triton", inplace=inplace)
    assert (got_q.data_ptr() == q.data_ptr()) == inplace
    assert_close(got_q, want_q, torch.float16)
    assert_close(got_k, want_k, torch.float16)


def test_the_triton_decode_path_reuses_a_plan_only_for_its_own_signature(monkeypatch):
    """triton_path.eager (what a remembered CUDA call runs) keeps the last launch's plan for
    its signature: a call of another shape, strides or layout plans afresh, and each result
    is the reference's."""
    from posemb.kernels import triton as tr
    from posemb.kernels import triton_path

    triton_path.forget()
    device = device_of("triton")
    planned = []
    real = tr.plan
    monkeypatch.setattr(tr, "plan", lambda *a, **kw: planned.append(1) or real(*a, **kw))
    calls = [
        ((2, 4, 1, 32), 2, "half"),
        ((2, 4, 1, 32), 2, "half"),  # the same signature: the plan is reused
        ((3, 4, 1, 32), 2, "half"),  # another batch
        ((3, 4, 1, 32), 2, "interleaved"),  # another layout
        ((3, 4, 1, 32), 2, "interleaved"),
    ]
    for i, (shape, kv, layout) in enumerate(calls):
        q, k = make(shape, kv, torch.bfloat16, device, seed=i)
        cos, sin = tables(torch.randint(0, 1000, (shape[0], 1)).to(device), 32, device)
        lay = Layout(layout)
        sig = triton_path.signature(q, k, cos, sin, lay)
        got_q, got_k = triton_path.eager(q, k, cos, sin, lay, sig)
        assert_close(got_q, reference.rotate(q, cos, sin, lay), torch.bfloat16)
        assert_close(got_k, reference.rotate(k, cos, sin, lay), torch.bfloat16)
    assert len(planned) == 3
    triton_path.forget()


@pytest.mark.parametrize("table_dtype", [torch.bfloat16, torch.float32, F64])
def test_triton_reads_tables_in_their_own_dtype_and_strides(table_dtype):
    """transformers hands (B, S, r) tables in the model's dtype, cut to their first half (a
    strided view): the kernel reads them as they are, each value as float32, and rotates as
    the reference does with the float32 tables (no cast or copy made per call)."""
    device = device_of("triton")
    q, k = make((2, 4, 5, 64), 2, torch.bfloat16, device, seed=4)
    pos = torch.randint(0, 4000, (2, 5), generator=torch.Generator().manual_seed(2)).to(device)
    cos, sin = tables(pos, 64, device)
    full = (torch.cat([cos, cos], -1).to(table_dtype), torch.cat([sin, sin], -1).to(table_dtype))
    cut = tuple(t[..., :32] for t in full)  # what the fused patch passes: stride 64 per row
    assert cut[0].stride() == (5 * 64, 64, 1)
    got_q, got_k = kernels.rotate(q, k, *cut, backend="triton")
    c, s = (t.float() for t in cut)
    assert_close(got_q, reference.rotate(q, c, s, "half"), torch.bfloat16)
    assert_close(got_k, reference.rotate(k, c, s, "half"), torch.bfloat16)


def test_a_remembered_triton_call_skips_the_checks_and_a_changed_one_is_checked(
    monkeypatch, triton_decode_path_on_this_host
):
    """A decode step's repeated call runs no check and gives the full path's answer; a
    changed signature (dtype, strides, requires_grad) is checked again and refused as before."""
    from posemb.kernels import dispatch

    device = triton_decode_path_on_this_host
    checked = []
    real = dispatch.check_pair
    monkeypatch.setattr(
        dispatch, "check_pair", lambda *a, **kw: checked.append(1) or real(*a, **kw)
    )
    q, k = make((2, 4, 1, 32), 2, torch.bfloat16, device)
    cos, sin = tables(torch.tensor([[7], [300]], device=device), 32, device)
    first = kernels.rotate(q, k, cos, sin)
    second = kernels.rotate(q, k, cos, sin)
    assert len(checked) == 1
    for a, b, x in zip(first, second, (q, k), strict=True):
        assert torch.equal(a, b)
        assert_close(b, reference.rotate(x, cos, sin, "half"), torch.bfloat16)
    kernels.rotate(q.float(), k.float(), cos, sin)  # another dtype: checked
    assert len(checked) == 2
    wide = torch.zeros(2, 1, 17, device=device)
    with pytest.raises(ValueError, match="cos has 17 frequencies"):
        kernels.rotate(q, k, wide, wide)
    with pytest.raises(ValueError, match="q and k must agree"):
        kernels.rotate(q, k[:1], cos, sin)
    out, _ = kernels.rotate(q.float().requires_grad_(), k.float(), cos, sin)
    assert out.grad_fn is not None  # a gradient wanted: the registered op


@pytest.mark.parametrize("which", ["q", "cos"])
def test_the_remembered_triton_path_never_takes_a_negative_view(
    triton_decode_path_on_this_host, which
):
    """Issue 54, bug 11 on the CUDA decode path: a signature like a remembered one but with
    the negative bit would be launched directly, reading memory, not values."""
    device = triton_decode_path_on_this_host
    q, k = make((2, 4, 1, 32), 2, torch.float32, device)
    cos, sin = tables(torch.tensor([[7], [300]], device=device), 32, device)
    for _ in range(2):
        kernels.rotate(q, k, cos, sin)  # remembered
    if which == "q":
        got, _ = kernels.rotate(torch._neg_view(-q), k, cos, sin)
    else:
        got, _ = kernels.rotate(q, k, torch._neg_view(-cos), sin)
    assert_close(got, reference.rotate(q, cos, sin, "half"), torch.float32)
    w = torch.rand(32, device=device) + 0.5
    for _ in range(2):
        kernels.norm_rotate(q, k, cos, sin, w, w, 1e-6)
    got, _ = kernels.norm_rotate(q, k, cos, sin, torch._neg_view(-w), w, 1e-6)
    want, _ = kernels.norm_rotate(q, k, cos, sin, w, w, 1e-6, backend="reference")
    assert_close(got, want, torch.float32)


@pytest.mark.parametrize("head_dim", [6, 64, 80, 96, 128, 160, 256])
def test_every_tile_side_is_a_power_of_two(head_dim):
    """tl.arange takes only powers of two: a tile side from the table that is not one fails to
    compile on a GPU (head width 80 gave 12 tokens a program)."""
    from posemb.kernels.triton import config

    for elem_size in (2, 4):
        for tokens in (1, 2, 3, 4, 5, 17, 2048):
            for heads in (1, 3, 8, 32, 40, 64):
                cfg = config(head_dim, elem_size, False, tokens, heads)
                for side in (cfg.block_t, cfg.block_h):
                    assert side >= 1 and side & (side - 1) == 0, (head_dim, tokens, heads, cfg)


@pytest.mark.parametrize("interpreter", [True, False], ids=["interpreter", "gpu-table"])
def test_every_tile_is_within_tritons_element_limit(interpreter, monkeypatch):
    """Issue 56, bug 1: the interpreter's tiles were sized without Triton's cap of 2^20
    elements a tensor (73 heads of width 92 over 423 tokens: 2^21). Every tile either table
    chooses (no launch), for the rotation and the norm kernels alike (one chooser), has sides
    that are powers of two and holds at most 2^20 elements of its widest row part."""
    from posemb.kernels import triton as tr

    monkeypatch.setattr(tr, "interpreter_tiles", lambda: interpreter)
    heads_all = [1, 2, 3, 7, 8, 31, 32, 40, 64, 73, 100, 127, 128]
    widths = [2, 6, 8, 32, 64, 80, 92, 96, 112, 128, 160, 192, 256]
    for head_dim in widths:
        for half in {head_dim // 2, max(1, head_dim // 4)}:
            width = max(2 * tr._pow2(half), tr._pow2(max(head_dim - 2 * half, 1)))
            for elem_size in (2, 4):
                for tokens in (1, 2, 3, 4, 5, 17, 255, 256, 423, 1000, 4096):
                    for heads in heads_all:
                        for interleaved in (False, True):
                            cfg = tr.tile(head_dim, half, elem_size, interleaved, tokens, heads)
                            where = (head_dim, half, elem_size, tokens, heads, cfg)
                            for side in (cfg.block_t, cfg.block_h):
                                assert side >= 1 and side & (side - 1) == 0, where
                            assert cfg.block_t * cfg.block_h * width <= tr.MAX_TILE, where


@pytest.mark.parametrize("dtype", DTYPES)
def test_73_heads_of_width_92_run_under_the_interpreter(dtype):
    """Liger-Kernel's vision shape (423 tokens, 73 heads, head width 92) through the Triton
    rotation and the fused norm: it failed to compile under the interpreter."""
    device = device_of("triton")
    q, k = make((1, 73, 423, 92), 1, dtype, device)
    cos, sin = tables(torch.arange(423, device=device), 92, device)
    got_q, got_k = kernels.rotate(q, k, cos, sin, backend="triton")
    assert_close(got_q, reference.rotate(q, cos, sin, Layout.HALF), dtype)
    assert_close(got_k, reference.rotate(k, cos, sin, Layout.HALF), dtype)
    w = torch.rand(92, device=device) + 0.5
    got_q, got_k = kernels.norm_rotate(q, k, cos, sin, w, w, 1e-6, backend="triton")
    want_q, want_k = kernels.norm_rotate(q, k, cos, sin, w, w, 1e-6, backend="reference")
    assert_close(got_q, want_q, dtype)
    assert_close(got_k, want_k, dtype)


@pytest.mark.parametrize(
    ("shape", "kv", "rotary"), [((2, 5, 17, 80), 3, 80), ((1, 40, 1, 96), 8, 64)]
)
def test_the_gpu_tiles_rotate_as_the_reference(monkeypatch, shape, kv, rotary):
    """The tile table's own tiles (not the interpreter's few large ones), for head widths
    that are not powers of two, several token and head blocks, GQA, partial rotary."""
    from posemb.kernels import triton as tr

    monkeypatch.setattr(tr, "interpreter_tiles", lambda: False)
    device = device_of("triton")
    q, k = make(shape, kv, torch.bfloat16, device, seed=6)
    cos, sin = tables(torch.arange(50, 50 + shape[2], device=device), rotary, device)
    qg, kg = q.float().requires_grad_(), k.float().requires_grad_()
    got_q, got_k = kernels.rotate(qg, kg, cos, sin, backend="triton")
    assert_close(got_q, reference.rotate(q.float(), cos, sin, "half"), torch.float32)
    assert_close(got_k, reference.rotate(k.float(), cos, sin, "half"), torch.float32)
    (got_q.sum() + got_k.sum()).backward()
    qr, kr = q.float().requires_grad_(), k.float().requires_grad_()
    (
        reference.rotate(qr, cos, sin, "half").sum() + reference.rotate(kr, cos, sin, "half").sum()
    ).backward()
    assert_close(qg.grad, qr.grad, torch.float32)
    assert_close(kg.grad, kr.grad, torch.float32)
