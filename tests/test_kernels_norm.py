"""kernels.norm_rotate (QK-norm + RoPE in one pass) against its definition: values and gradients
over dtypes, layouts, partial rotary, GQA, odd shapes and both weight forms; refusals; the ops'
opcheck, compile and export."""

import pytest
import torch

import posemb
from devices import ON_GPU, device_of
from posemb import Layout, kernels
from posemb.kernels import norm
from tolerances import UNIT_ROUNDOFF, assert_close

F64 = torch.float64
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
BACKENDS = ["reference", "cpu", "triton"]
# (q shape, kv heads, rotary dim): GQA, one head, partial rotary with an odd-sized tail, one
# token (decode), a head of 6 channels.
CASES = [
    ((2, 4, 37, 64), 2, 64),
    ((1, 1, 3, 16), 1, 16),
    ((2, 3, 9, 80), 1, 48),
    ((3, 2, 1, 128), 2, 128),
    ((1, 2, 5, 6), 2, 4),
]


def _inputs(case, dtype, device, per_batch=False, seed=0):
    (b, h, s, d), kv, rotary = case
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, s, d, generator=g).mul(3).to(device=device, dtype=dtype)
    k = torch.randn(b, kv, s, d, generator=g).to(device=device, dtype=dtype)
    # cpu: the float64 tables are formed on the CPU, then moved with q and k
    pos = torch.randint(0, 1 << 16, (b, s) if per_batch else (s,), generator=g)
    inv = posemb.inv_freq(rotary, 10000.0, dtype=F64)
    cos, sin = (t.to(device) for t in posemb.cos_sin(pos, inv))
    qw = (1 + 0.2 * torch.randn(d, generator=g)).to(device)
    kw = (1 + 0.2 * torch.randn(d, generator=g)).to(device)
    return q, k, cos, sin, qw, kw


def _want(q, k, cos, sin, qw, kw, eps, offset, layout):
    wide = (t.to(device="cpu", dtype=F64) for t in (q, k, cos, sin, qw, kw))
    return norm.reference(*wide, eps, offset, layout)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", list(Layout))
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[0])))
@pytest.mark.parametrize("offset", [0.0, 1.0], ids=["qwen-w", "gemma-1+w"])
def test_values_match_the_definition(backend, dtype, layout, case, offset):
    if backend == "triton" and case[0][2] > 9 and not ON_GPU:
        case = ((case[0][0], case[0][1], 9, case[0][3]), case[1], case[2])  # the interpreter
    device = device_of(backend)
    q, k, cos, sin, qw, kw = _inputs(case, dtype, device, per_batch=case[0][0] > 1)
    got = kernels.norm_rotate(q, k, cos, sin, qw, kw, 1e-6, offset, layout=layout, backend=backend)
    for g, w, x in zip(
        got, _want(q, k, cos, sin, qw, kw, 1e-6, offset, layout), (q, k), strict=True
    ):
        assert g.dtype == x.dtype and g.shape == x.shape
        assert_close(g.cpu(), w, dtype)


def _grads(fn, inputs, cotangents, needs):
    leaves = [
        t.detach().clone().requires_grad_(bool(n)) for t, n in zip(inputs, needs, strict=True)
    ]
    pairs = [(o, c) for o, c in zip(fn(*leaves), cotangents, strict=True) if o.requires_grad]
    torch.autograd.backward([o for o, _ in pairs], [c for _, c in pairs])
    return [t.grad for t in leaves]


@pytest.mark.parametrize("backend", ["cpu", "triton"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", list(Layout))
@pytest.mark.parametrize("case", CASES[:3] + CASES[4:], ids=lambda c: "x".join(map(str, c[0])))
@pytest.mark.parametrize(
    "needs",
    [(1, 1, 1, 1), (1, 0, 0, 0), (0, 1, 0, 1), (0, 0, 1, 0)],
    ids=lambda n: "".join(map(str, n)),
)
def test_gradients_match_the_definition(backend, dtype, layout, case, needs):
    if backend == "triton" and not ON_GPU and (dtype != torch.float32 or needs != (1, 1, 1, 1)):
        pytest.skip("the interpreter runs each program in Python: one case per shape")
    device = device_of(backend)
    q, k, cos, sin, qw, kw = _inputs(case, dtype, device, per_batch=True, seed=3)
    g = torch.Generator().manual_seed(9)
    gq = torch.randn(q.shape, generator=g).to(device, dtype)
    gk = torch.randn(k.shape, generator=g).to(device, dtype)
    offset = 1.0 if needs[0] else 0.0

    def fused(q, k, qw, kw):
        return kernels.norm_rotate(
            q, k, cos, sin, qw, kw, 1e-5, offset, layout=layout, backend=backend
        )

    def definition(q, k, qw, kw):
        # The definition in float64 on the CPU, from .cpu() copies of the backend's tensors.
        c, s = cos.cpu().double(), sin.cpu().double()
        return norm.reference(q, k, c, s, qw, kw, 1e-5, offset, layout)

    got = _grads(fused, (q, k, qw, kw), (gq, gk), needs)
    wide = [t.cpu().double() for t in (q, k, qw, kw)]
    want = _grads(definition, wide, (gq.cpu().double(), gk.cpu().double()), needs)
    rows = q.shape[0] * q.shape[2] * (q.shape[1] + k.shape[1])
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if not needs[i]:
            assert a is None
            continue
        if i < 2:  # per element: a few roundings in float32, one to the dtype
            assert_close(a.cpu(), b, dtype)
        else:  # a weight's gradient sums a term per row (inputs rounded to dtype: 16 u each)
            tol = 16 * UNIT_ROUNDOFF[torch.float32] * rows * b.abs().max().item()
            torch.testing.assert_close(a.cpu().double(), b, rtol=0, atol=max(tol, 1e-12))


def test_strided_inputs_and_in_place_agree_with_out_of_place():
    case = ((2, 4, 7, 32), 2, 32)
    q, k, cos, sin, qw, kw = _inputs(case, torch.float32, "cpu")
    want = kernels.norm_rotate(q, k, cos, sin, qw, kw, 1e-6)
    # (batch, seq, heads, head_dim) transposed, and q and k as views of one qkv buffer
    qkv = torch.cat([q, k, k], 1).transpose(1, 2).contiguous().transpose(1, 2)
    qv, kv = qkv[:, :4], qkv[:, 4:6]
    got = kernels.norm_rotate(qv, kv, cos, sin, qw, kw, 1e-6)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    with torch.no_grad():
        kernels.norm_rotate(qv, kv, cos, sin, qw, kw, 1e-6, inplace=True)
    torch.testing.assert_close(qv, want[0], rtol=0, atol=0)
    torch.testing.assert_close(kv, want[1], rtol=0, atol=0)
    torch.testing.assert_close(qkv[:, 6:], k, rtol=0, atol=0)  # a neighbour left alone


def _bad(q, k, cos, sin, qw, kw):
    """Calls each refused with a ValueError naming what is wrong."""
    return {
        "q_weight": (q, k, cos, sin, qw[:-1], kw, 1e-6),
        "k_weight": (q, k, cos, sin, qw, kw[None], 1e-6),
        "q_weight must be a torch.Tensor": (q, k, cos, sin, qw.tolist(), kw, 1e-6),
        "floating dtype": (q, k, cos, sin, qw.long(), kw, 1e-6),
        "eps must be a finite number > 0, got 0": (q, k, cos, sin, qw, kw, 0.0),
        "eps must be a finite number > 0, got -1": (q, k, cos, sin, qw, kw, -1e-6),
        "eps must be a finite number > 0, got nan": (q, k, cos, sin, qw, kw, float("nan")),
        "eps must be a finite number > 0, got True": (q, k, cos, sin, qw, kw, True),
        "unit stride": (q.transpose(2, 3), k, cos, sin, qw, kw, 1e-6),
        "meta": (q, k, cos, sin, qw.to("meta"), kw, 1e-6),
        "frequencies": (q, k, torch.cat([cos, cos], -1), torch.cat([sin, sin], -1), qw, kw, 1e-6),
    }


@pytest.mark.parametrize("what", list(_bad(*_inputs(CASES[0], torch.float32, "cpu"))))
@pytest.mark.parametrize("backend", ["auto", "reference", "cpu"])
def test_bad_inputs_are_refused_by_name(what, backend):
    args = _bad(*_inputs(CASES[0], torch.float32, device_of(backend)))[what]
    with pytest.raises(ValueError, match=what.split(" must")[0] if " must" in what else what):
        kernels.norm_rotate(*args, backend=backend)


def test_weight_offset_and_in_place_refusals():
    q, k, cos, sin, qw, kw = _inputs(CASES[1], torch.float32, "cpu")
    with pytest.raises(ValueError, match="weight_offset"):
        kernels.norm_rotate(q, k, cos, sin, qw, kw, 1e-6, float("inf"))
    with pytest.raises(ValueError, match="inplace=True"):
        kernels.norm_rotate(q, k, cos, sin, qw.requires_grad_(), kw, 1e-6, inplace=True)
    before = q.clone()
    with pytest.raises(ValueError):
        kernels.norm_rotate(q, k, cos, sin, qw.detach()[:3], kw, 1e-6, inplace=True)
    torch.testing.assert_close(q, before, rtol=0, atol=0)  # a refused call wrote nothing


def _op_cases():
    """Each dtype, each case past the first and each layout at least once: opcheck tests the
    registration (schema, fake kernel, autograd, compiled dispatch), which no value changes;
    the values of every combination are the tests above. (All 24 combinations took 49 s of
    the suite, for the same checks.)"""
    combos = [(0, 1, False), (1, 2, True), (2, 3, False), (0, 4, True), (1, 1, True)]
    for dtype_index, case_index, interleaved in combos:
        dtype = DTYPES[dtype_index % len(DTYPES)]
        q, k, cos, sin, qw, kw = _inputs(CASES[case_index], dtype, "cpu", per_batch=True)
        yield q, k, cos.contiguous(), sin.contiguous(), qw, kw, interleaved


def test_opcheck_cpu_norm_rotate_ops():
    from posemb.kernels import cpu

    assert cpu.load() is not None, cpu.unavailable_reason()
    for q, k, cos, sin, qw, kw, interleaved in _op_cases():
        args = (q.requires_grad_(), k.requires_grad_(), cos, sin, qw.requires_grad_(), kw)
        torch.library.opcheck(torch.ops.posemb.norm_rotate_cpu.default, (*args, 1e-6, interleaved))
        plain = tuple(t.detach().clone() for t in args)
        torch.library.opcheck(
            torch.ops.posemb.norm_rotate_cpu_.default, (*plain, 1e-6, interleaved)
        )
        outs = (torch.empty_like(plain[0]), torch.empty_like(plain[1]))
        torch.library.opcheck(
            torch.ops.posemb._norm_rotate_cpu_into.default,
            (plain[0], plain[1], *outs, *plain[2:], 1e-6, 1.0, interleaved),
        )
        grads = (torch.randn_like(plain[0]), torch.randn_like(plain[1]))
        torch.library.opcheck(
            torch.ops.posemb.norm_rotate_cpu_backward.default,
            (*grads, *plain, 1e-6, interleaved, True, False, True, True),
        )


def test_compile_fullgraph_and_export_match_eager():
    q, k, cos, sin, qw, kw = _inputs(CASES[0], torch.float32, "cpu")

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qw, self.kw = torch.nn.Parameter(qw.clone()), torch.nn.Parameter(kw.clone())

        def forward(self, q, k):
            return kernels.norm_rotate(q, k, cos, sin, self.qw, self.kw, 1e-6, 1.0)

    block = Block()
    want = block(q, k)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    got = compiled(q.requires_grad_(), k)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    got[0].sum().backward()
    assert q.grad is not None and block.qw.grad is not None
    program = torch.export.export(block, (q.detach(), k))
    assert "norm_rotate_cpu" in str(program.graph)
    for g, w in zip(program.module()(q.detach(), k), want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_opcheck_triton_norm_rotate_ops():
    from posemb.kernels import triton_norm

    checks = (
        (
            "test_schema",
            "test_autograd_registration",
            "test_faketensor",
            "test_aot_dispatch_dynamic",
        )
        if ON_GPU
        else ("test_schema", "test_autograd_registration")  # the interpreter cannot fake
    )
    device = device_of("triton")
    for i, (q, k, cos, sin, qw, kw, interleaved) in enumerate(_op_cases()):
        if i % 5:
            continue
        q, k, qw, kw = (t.to(device) for t in (q, k, qw, kw))
        n = cos.shape[-1]
        c, s = (t.to(device).reshape(-1, n) for t in (cos, sin))
        args = (q, k, c, s, qw, kw, 1e-6, interleaved, q.shape[2])
        grad_args = (q.requires_grad_(q.dtype == torch.float32), *args[1:])
        torch.library.opcheck(triton_norm.norm_rotate_triton_op, grad_args, test_utils=checks)
        plain = tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args)
        torch.library.opcheck(triton_norm.norm_rotate_triton_op_, plain, test_utils=checks)


@pytest.mark.parametrize("backend", ["cpu", "triton"])
def test_in_place_matches_out_of_place(backend):
    device = device_of(backend)
    q, k, cos, sin, qw, kw = _inputs(((2, 3, 5, 40), 1, 24), torch.bfloat16, device, True)
    want = kernels.norm_rotate(q, k, cos, sin, qw, kw, 1e-6, 1.0, backend=backend)
    got = kernels.norm_rotate(q, k, cos, sin, qw, kw, 1e-6, 1.0, backend=backend, inplace=True)
    assert got[0] is q and got[1] is k
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["cpu", "triton"])
@pytest.mark.parametrize("layout", list(Layout))
def test_a_differentiated_backward_matches_the_definitions_second_derivatives(backend, layout):
    """Gradient penalties and Hessian-vector products differentiate the backward: the fused
    backward op has no autograd of its own, and its second derivatives came out zero (a q
    norm weight's gradient 0 where the definition gives ~1e3)."""
    device = device_of(backend)
    q, k, cos, sin, qw, kw = _inputs(CASES[2], torch.float32, device, per_batch=True, seed=5)

    def second(fn):
        leaves = [t.detach().clone().double().requires_grad_() for t in (q, k, qw, kw)]
        if fn is kernels.norm_rotate:
            leaves = [t.detach().float().requires_grad_() for t in leaves]
        lq, lk, lqw, lkw = leaves
        c, s = (t.to(leaves[0].dtype) for t in (cos, sin))
        out = fn(lq, lk, c, s, lqw, lkw, 1e-5, 1.0, layout=layout, **kw_of(fn))
        first = torch.autograd.grad(
            sum(o.square().sum() for o in out), [lq, lqw], create_graph=True
        )
        (first[0].square().sum() + first[1].square().sum()).backward()
        return [None if t.grad is None else t.grad.cpu().double() for t in leaves]

    def kw_of(fn):
        return {"backend": backend} if fn is kernels.norm_rotate else {}

    got, want = second(kernels.norm_rotate), second(norm.reference)
    assert want[0] is not None and want[2] is not None  # q and its weight: second order
    for a, b in zip(got, want, strict=True):
        if b is None:  # k's side does not reach q's gradient
            assert a is None or not a.any()
            continue
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3 * b.abs().max().item())


def test_a_view_spanning_2_to_the_31_elements_takes_64_bit_offsets():
    """As the rotation's: past 2^31 elements the norm kernels' offsets are 64-bit."""
    device = device_of("triton")
    b, h, s, d = shape = (3, 2, 3, 32)  # the third sequence starts at 2^31 (strides 2^30)
    storage = torch.empty((1 << 31) + h * s * d, dtype=torch.float16, device=device)
    q = storage.as_strided(shape, (1 << 30, s * d, d, 1))
    q.copy_(torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(device, q.dtype))
    q.requires_grad_()
    k, cos, sin, qw, kw = _inputs(((b, 1, s, d), 1, d), torch.float16, device)[1:]
    got = kernels.norm_rotate(q, k, cos, sin, qw, kw, 1e-6, backend="triton")
    want = _want(q.detach(), k, cos, sin, qw, kw, 1e-6, 0.0, Layout.HALF)
    for g, w in zip(got, want, strict=True):
        assert_close(g, w.to(device), torch.float16)
    (grad,) = torch.autograd.grad(got[0].float().sum(), q)
    qd = q.detach().to("cpu", F64).requires_grad_()
    out = norm.reference(qd, *(t.to("cpu", F64) for t in (k, cos, sin, qw, kw)), 1e-6, 0.0,
                         Layout.HALF)[0]  # fmt: skip
    (want_grad,) = torch.autograd.grad(out.sum(), qd)
    assert_close(grad, want_grad.to(device), torch.float16)


@pytest.mark.parametrize("offset", [0.0, 1.0], ids=["qwen-w", "gemma-1+w"])
def test_triton_reads_weights_and_tables_in_the_models_dtype(offset):
    """A bf16 model hands bf16 norm weights and (cut, strided) bf16 tables: the kernel reads
    them as they are, adds the offset in float32, and matches the definition on the same
    values."""
    device = device_of("triton")
    q, k, cos, sin, qw, kw = _inputs(((2, 4, 5, 64), 2, 64), torch.bfloat16, device, True)
    qw, kw = qw.bfloat16(), kw.bfloat16()
    cut = tuple(torch.cat([t, t], -1).bfloat16()[..., :32] for t in (cos, sin))
    got = kernels.norm_rotate(q, k, *cut, qw, kw, 1e-6, offset, backend="triton")
    want = _want(q, k, *cut, qw, kw, 1e-6, offset, Layout.HALF)
    for g, w in zip(got, want, strict=True):
        assert_close(g, w.to(device), torch.bfloat16)


def test_a_remembered_norm_rotate_call_skips_the_checks_and_a_changed_one_is_checked(
    monkeypatch, triton_decode_path_on_this_host
):
    """norm_rotate's decode path on CUDA (here through the interpreter): the repeated call
    runs no check and equals the definition; a changed eps, offset or weight is checked."""
    from posemb.kernels import dispatch

    device = triton_decode_path_on_this_host
    checked = []
    real = dispatch.check_pair
    monkeypatch.setattr(
        dispatch, "check_pair", lambda *a, **kw: checked.append(1) or real(*a, **kw)
    )
    q, k, cos, sin, qw, kw = _inputs(((2, 4, 1, 32), 2, 32), torch.bfloat16, device, True)
    first = kernels.norm_rotate(q, k, cos, sin, qw, kw, 1e-6, 1.0)
    second = kernels.norm_rotate(q, k, cos, sin, qw, kw, 1e-6, 1.0)
    assert len(checked) == 1
    for a, b, w in zip(first, second, _want(q, k, cos, sin, qw, kw, 1e-6, 1.0, "half"),
                       strict=True):  # fmt: skip
        assert torch.equal(a, b)
        assert_close(b, w.to(device), torch.bfloat16)
    kernels.norm_rotate(q, k, cos, sin, qw, kw, 1e-5, 1.0)  # another eps: checked
    assert len(checked) == 2
    with pytest.raises(ValueError, match="eps"):
        kernels.norm_rotate(q, k, cos, sin, qw, kw, float("nan"), 1.0)
    with pytest.raises(ValueError, match="weight_offset"):
        kernels.norm_rotate(q, k, cos, sin, qw, kw, 1e-6, float("inf"))
    with pytest.raises(ValueError, match="q_weight"):
        kernels.norm_rotate(q, k, cos, sin, qw[:16], kw, 1e-6, 1.0)


def test_the_gpu_tiles_normalise_as_the_definition(monkeypatch):
    """norm_rotate with the tile table's own tiles (not the interpreter's few large ones):
    head width 80 (not a power of two), partial rotary, GQA, several token and head blocks;
    values, and gradients of q, k and both weights (partial sums over programs whose tiles
    are partly masked), as the parametrized tests check them."""
    from posemb.kernels import triton as tr

    monkeypatch.setattr(tr, "interpreter_tiles", lambda: False)
    case = ((2, 5, 17, 80), 3, 48)
    for layout in Layout:
        test_values_match_the_definition("triton", torch.float32, layout, case, 1.0)
        test_gradients_match_the_definition("triton", torch.float32, layout, case, (1, 1, 1, 1))


@pytest.mark.parametrize("form", ["strided", "expanded"])
def test_weights_of_any_strides(form):
    """A weight that is a strided view or an expanded scalar reads as its values."""
    device = device_of("triton")
    q, k, cos, sin, _, _ = _inputs(((1, 2, 3, 8), 1, 8), torch.float32, device)
    if form == "strided":
        w = torch.randn(16, generator=torch.Generator().manual_seed(3)).to(device)[::2]
    else:
        w = torch.tensor(0.5, device=device).expand(8)
    got = kernels.norm_rotate(q, k, cos, sin, w, w, 1e-6, backend="triton")
    want = _want(q, k, cos, sin, w, w, 1e-6, 0.0, Layout.HALF)
    for g, x in zip(got, want, strict=True):
        assert_close(g, x.to(device), torch.float32)
