"""The decode fast path (posemb.kernels.fast): taken where it applies, and never a way around a
check, a gradient, a tracer or another step's angles."""

import copy
import pickle
import threading

import pytest
import torch

import posemb
from posemb import kernels
from posemb.kernels import fast
from tolerances import assert_close

needs_op = pytest.mark.skipif(not kernels.cpu.available(), reason="the CPU op is not built here")
pytestmark = needs_op


@pytest.fixture(autouse=True)
def _fresh():
    fast.forget()
    yield
    fast.forget()


def _expected(rope, q, k, positions):
    """The rotation from the module's own cos_sin through the reference, in float64."""
    cos, sin = rope.cos_sin(positions, dtype=torch.float64)
    ref = kernels.reference.apply_rope
    return ref(q.double(), cos, sin, rope.layout), ref(k.double(), cos, sin, rope.layout)


def _qk(batch=1, seq=1, dtype=torch.float32, seed=0, head_dim=64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, 4, seq, head_dim, generator=g).to(dtype)
    k = torch.randn(batch, 2, seq, head_dim, generator=g).to(dtype)
    return q, k


@pytest.fixture
def counted(monkeypatch):
    """Count the calls that went the fast way."""
    calls = []
    real = fast.rotate_cpu

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(fast, "rotate_cpu", spy)
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", list(posemb.Layout))
def test_a_decode_loop_is_fast_after_its_first_step_and_right_at_every_step(counted, dtype, layout):
    rope = posemb.RotaryEmbedding(64, base=500000.0, layout=layout)
    for step in range(6):
        q, k = _qk(batch=2, dtype=dtype, seed=step)
        pos = torch.tensor([[700 + step], [31 + 2 * step]])
        for _layer in range(3):
            got = rope(q, k, pos)
            for g, e in zip(got, _expected(rope, q, k, pos), strict=True):
                assert_close(g, e, dtype)
    # The very first call armed both levels; from then on the module skips its checks where
    # a step's tables are known (2 layers of 3), and a new step's first layer forms them, whose
    # rotation then skips kernels.rotate's checks.
    assert len(counted) == 6 * 3 - 1


def test_positions_written_in_place_or_reallocated_are_read_anew(counted):
    rope = posemb.RotaryEmbedding(64)
    q, k = _qk()
    pos = torch.tensor([[5]])
    rope(q, k, pos)
    for step in range(6, 12):
        pos += 1  # the same tensor object, the same address: its values decide
        assert_close(rope(q, k, pos)[0], _expected(rope, q, k, pos)[0], torch.float32)
        fresh = torch.tensor([[step * 3]])  # a new tensor, possibly at a freed one's address
        assert_close(rope(q, k, fresh)[0], _expected(rope, q, k, fresh)[0], torch.float32)


def test_modules_that_differ_never_share_tables():
    q, k = _qk()
    pos = torch.tensor([[300]])
    mods = [
        posemb.RotaryEmbedding(64),
        posemb.RotaryEmbedding(64, base=500000.0),
        posemb.RotaryEmbedding(64, rotary_dim=32),
        posemb.RotaryEmbedding(64, scaling=posemb.scaling.Linear(4.0)),
        posemb.RotaryEmbedding(64, layout="interleaved"),
    ]
    for _ in range(3):
        for rope in mods:
            got = rope(q, k, pos)
            for g, e in zip(got, _expected(rope, q, k, pos), strict=True):
                assert_close(g, e, torch.float32)


def test_a_module_changed_after_a_call_rotates_by_its_new_settings():
    rope = posemb.RotaryEmbedding(64)
    q, k = _qk()
    pos = torch.tensor([[40]])
    rope(q, k, pos), rope(q, k, pos)
    for change in (
        lambda: setattr(rope, "base", 123456.0),
        lambda: setattr(rope, "rotary_dim", 16),
        lambda: setattr(rope, "scaling", posemb.scaling.Linear(2.0)),
        lambda: setattr(rope, "layout", posemb.Layout.INTERLEAVED),
    ):
        change()
        assert_close(rope(q, k, pos)[0], _expected(rope, q, k, pos)[0], torch.float32)


def _bad_calls(q, k, pos):
    """Calls the full path refuses, each differing from (q, k, pos) in one respect."""
    return {
        "float positions": (q, k, pos.float()),
        "bool positions": (q, k, pos.bool()),
        "positions of another length": (q, k, torch.tensor([[1, 2]])),
        "positions of another batch": (q, k, torch.tensor([[1], [2], [3]])),
        "meta positions": (q, k, torch.empty(1, 1, dtype=torch.long, device="meta")),
        "q of another head_dim": (q[..., :32], k, pos),
        "q not unit stride in head_dim": (q[..., ::2].repeat(1, 1, 1, 2)[..., ::2], k, pos),
        "k of another dtype": (q, k.double(), pos),
        "k of another seq": (q, torch.cat([k, k], 2), pos),
        "q 3-d": (q[0], k, pos),
        "q an integer tensor": (q.long(), k, pos),
        "k not a tensor": (q, k.tolist(), pos),
    }


@pytest.mark.parametrize("bad", list(_bad_calls(*_qk(), torch.tensor([[9]]))))
def test_every_refusal_holds_after_the_fast_path_is_armed(bad):
    q, k = _qk()
    pos = torch.tensor([[9]])
    args = _bad_calls(q, k, pos)[bad]
    with pytest.raises(ValueError) as fresh_error:
        posemb.RotaryEmbedding(64)(*args)
    rope = posemb.RotaryEmbedding(64)
    rope(q, k, pos), rope(q, k, pos)  # armed
    with pytest.raises(ValueError) as armed_error:
        rope(*args)
    assert str(armed_error.value) == str(fresh_error.value)
    # the refused call changed nothing: the next good one is right
    assert_close(rope(q, k, pos)[0], _expected(rope, q, k, pos)[0], torch.float32)


def _rot_back(rope, g, pos):
    """The gradient of a rotation: ``g`` rotated by -theta."""
    cos, sin = rope.cos_sin(pos, dtype=torch.float64)
    return kernels.reference.apply_rope(g.double(), cos, -sin, rope.layout)


def test_gradients_and_dual_numbers_take_the_full_path(counted):
    rope = posemb.RotaryEmbedding(64)
    q, k = _qk()
    pos = torch.tensor([[77]])
    rope(q, k, pos), rope(q, k, pos)
    armed = len(counted)
    qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
    qr, kr = rope(qg, kg, pos)
    wq, wk = _qk(seed=5)
    ((qr * wq).sum() + (kr * wk).sum()).backward()
    assert_close(qg.grad, _rot_back(rope, wq, pos), torch.float32)
    assert_close(kg.grad, _rot_back(rope, wk, pos), torch.float32)
    import torch.autograd.forward_ad as fwad

    with fwad.dual_level():
        qd = fwad.make_dual(q, wq)
        tangent = fwad.unpack_dual(rope(qd, k, pos)[0]).tangent
    assert_close(tangent, _expected(rope, wq, wk, pos)[0], torch.float32)
    assert len(counted) == armed  # neither went the fast way


def test_a_table_that_needs_a_gradient_gets_it_after_a_no_grad_call():
    q, k = _qk()
    cos, sin = posemb.RotaryEmbedding(64).cos_sin(torch.tensor([[3]]))
    cos.requires_grad_()
    with torch.no_grad():
        kernels.rotate(q, k, cos, sin), kernels.rotate(q, k, cos, sin)  # armed, grad off
    kernels.rotate(q, k, cos, sin)[0].sum().backward()
    assert cos.grad is not None and cos.grad.abs().sum() > 0


def test_an_explicit_backend_is_never_served_by_the_fast_path(monkeypatch):
    q, k = _qk()
    cos, sin = posemb.RotaryEmbedding(64).cos_sin(torch.tensor([[3]]))
    kernels.rotate(q, k, cos, sin, backend="cpu"), kernels.rotate(q, k, cos, sin)
    monkeypatch.setattr(kernels.cpu, "unavailable_reason", lambda: "no compiler (injected)")
    with pytest.raises(posemb.BackendUnavailable, match="injected"):
        kernels.rotate(q, k, cos, sin, backend="cpu")


def test_rotate_refuses_what_it_refused_before_it_was_armed():
    q, k = _qk()
    cos, sin = posemb.RotaryEmbedding(64).cos_sin(torch.tensor([[3]]))
    kernels.rotate(q, k, cos, sin), kernels.rotate(q, k, cos, sin)
    bad = {
        "tables too wide": (q, k, torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)),
        "sin of another shape": (q, k, cos, sin[..., :8]),
        "a table of two tokens": (q, k, cos.expand(1, 2, 32), sin.expand(1, 2, 32)),
        "cos an integer tensor": (q, k, cos.long(), sin),
        "k strided in head_dim": (q, k.repeat(1, 1, 1, 2)[..., ::2], cos, sin),
    }
    for name, args in bad.items():
        with pytest.raises(ValueError):
            kernels.rotate(*args)
            pytest.fail(name)


def test_a_copied_or_pickled_module_rotates_alike():
    rope = posemb.RotaryEmbedding(64, base=50000.0)
    q, k = _qk()
    pos = torch.tensor([[123]])
    want = rope(q, k, pos)
    rope(q, k, pos)
    for other in (copy.deepcopy(rope), pickle.loads(pickle.dumps(rope))):
        for _ in range(2):
            for g, e in zip(other(q, k, pos), want, strict=True):
                torch.testing.assert_close(g, e, rtol=0, atol=0)


def test_threads_decoding_different_positions_each_get_their_own():
    rope = posemb.RotaryEmbedding(64)
    q, k = _qk()
    errors = []

    def decode(start):
        for step in range(150):
            pos = torch.tensor([[start + step]])
            got = rope(q, k, pos)[0]
            want = _expected(rope, q, k, pos)[0]
            if not torch.allclose(got.double(), want, atol=1e-5):
                errors.append((start, step))

    threads = [threading.Thread(target=decode, args=(s,)) for s in (0, 5000)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert errors == []


def test_a_subclass_forms_its_own_tables(counted):
    class Doubled(posemb.RotaryEmbedding):
        def _cos_sin(self, pos, dtype, device, seq_len):
            cos, sin = super()._cos_sin(pos, dtype, device, seq_len)
            return 2 * cos, 2 * sin

    plain, doubled = posemb.RotaryEmbedding(64), Doubled(64)
    q, k = _qk()
    pos = torch.tensor([[50]])
    for _ in range(3):
        want = plain(q, k, pos)[0]
        assert_close(doubled(q, k, pos)[0], 2 * want, torch.float32)


def test_compile_and_export_after_eager_calls_leave_eager_right():
    rope = posemb.RotaryEmbedding(64)
    q, k = _qk()
    pos = torch.tensor([[11]])
    rope(q, k, pos), rope(q, k, pos)
    compiled = torch.compile(lambda a, b, p: rope(a, b, p), fullgraph=True, backend="eager")
    other = torch.tensor([[4000]])
    assert_close(compiled(q, k, other)[0], _expected(rope, q, k, other)[0], torch.float32)

    class Wrap(torch.nn.Module):
        def forward(self, a, b, p):
            return rope(a, b, p)

    torch.export.export(Wrap(), (q, k, torch.tensor([[20]])))
    for p in (pos, other, torch.tensor([[20]])):
        assert_close(rope(q, k, p)[0], _expected(rope, q, k, p)[0], torch.float32)


# --- the rotation patch_rotary(fused=True) puts in transformers' attention ---------------------


def _hf_tables(positions, head_dim=64, dtype=torch.float32):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, num_key_value_heads=2)
    x = torch.zeros(1, dtype=dtype)
    return LlamaRotaryEmbedding(config)(x, positions)


def _hf_apply(q, k, cos, sin):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    return apply_rotary_pos_emb(q, k, cos, sin)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_fused_rotation_follows_each_steps_tables(dtype):
    from posemb.hf.fused import fused_rotation

    fused = fused_rotation(posemb.Layout.HALF)
    for step in range(4):
        q, k = _qk(batch=2, dtype=dtype, seed=step)
        cos, sin = _hf_tables(torch.tensor([[900 + step], [3 * step]]), dtype=dtype)
        for _layer in range(3):
            for got, want in zip(fused(q, k, cos, sin), _hf_apply(q, k, cos, sin), strict=True):
                assert_close(got, want.float(), dtype)


def test_the_fused_rotation_sees_tables_written_in_place():
    from posemb.hf.fused import fused_rotation

    fused = fused_rotation(posemb.Layout.HALF)
    q, k = _qk()
    cos, sin = _hf_tables(torch.tensor([[10]]))
    fused(q, k, cos, sin), fused(q, k, cos, sin)
    new_cos, new_sin = _hf_tables(torch.tensor([[4321]]))
    cos.copy_(new_cos), sin.copy_(new_sin)
    assert_close(fused(q, k, cos, sin)[0], _hf_apply(q, k, new_cos, new_sin)[0], torch.float32)


def test_the_fused_rotation_refuses_and_differentiates_as_before():
    from posemb.hf.fused import fused_rotation

    fused = fused_rotation(posemb.Layout.HALF)
    q, k = _qk()
    cos, sin = _hf_tables(torch.tensor([[10]]))
    fused(q, k, cos, sin), fused(q, k, cos, sin)  # the tables are derived and kept
    for bad in (
        (q, k[:, :, :, :32], cos, sin),  # head_dim differs
        (q, torch.cat([k, k]), cos, sin),  # batch differs
        (q, k.double(), cos, sin),  # dtype differs
        (q[..., ::2].repeat(1, 1, 1, 2)[..., ::2], k, cos, sin),  # not unit stride
    ):
        with pytest.raises(ValueError):
            fused(*bad)
    # float64 takes the reference, right to float64
    wide = (q.double(), k.double(), cos.double(), sin.double())
    assert_close(fused(*wide)[0], _hf_apply(*wide)[0], torch.float64)
    # gradients reach q, k and tables that ask for one
    qg, cg = q.clone().requires_grad_(), cos.clone().requires_grad_()
    fused(qg, k, cg, sin)[0].sum().backward()
    qh, ch = q.clone().requires_grad_(), cos.clone().requires_grad_()
    _hf_apply(qh, k, ch, sin)[0].sum().backward()
    assert_close(qg.grad, qh.grad, torch.float32)
    # posemb reads cat([c, c]) as the c it repeats, so c's gradient is both halves' sum
    assert_close(cg.grad[..., :32], ch.grad[..., :32] + ch.grad[..., 32:], torch.float32)


# --- patch_rotary's table module at decode ------------------------------------------------------


def _gemma_tables():
    from transformers import Gemma3TextConfig

    from hf_reference import PER_LAYER

    config = Gemma3TextConfig(
        vocab_size=8, hidden_size=32, head_dim=16, num_attention_heads=2, num_key_value_heads=1,
        num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"],
        rope_parameters=copy.deepcopy(PER_LAYER["rope_parameters"]),
    )  # fmt: skip
    return posemb.hf.HFRotaryEmbedding(config)


def _full_path(module, x, position_ids, layer_type=None):
    """The tables as a fresh copy of the module forms them (no decode memo)."""
    return copy.deepcopy(module)(x, position_ids, layer_type)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_patched_tables_follow_every_step_and_layer_type(dtype):
    module = _gemma_tables()
    x = torch.zeros(1, dtype=dtype)
    for step in range(5):
        pos = torch.tensor([[40 + step], [3 * step]])
        for layer_type in ("sliding_attention", "full_attention", "full_attention"):
            got = module(x, pos, layer_type)
            for g, w in zip(got, _full_path(module, x, pos, layer_type), strict=True):
                torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_patched_tables_refuse_and_widen_as_before():
    module = _gemma_tables()
    x = torch.zeros(1)
    pos = torch.tensor([[5]])
    module(x, pos, "full_attention"), module(x, pos, "full_attention")  # remembered
    with pytest.raises(ValueError):
        module(x, pos.float(), "full_attention")
    with pytest.raises(ValueError):
        module(x, pos, "no_such_layer_type")
    with pytest.raises(ValueError):
        module(x.long(), pos, "full_attention")
    # uint8 positions are positions, never a mask; negative and far ones are formed directly
    for p in (torch.tensor([[7]], dtype=torch.uint8), torch.tensor([[-3]]), torch.tensor([[9999]])):
        got = module(x, p, "full_attention")
        want = _full_path(module, x, p.long(), "full_attention")
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_patched_tables_follow_a_changed_module_and_survive_a_copy():
    module = _gemma_tables()
    x = torch.zeros(1)
    pos = torch.tensor([[12]])
    before = module(x, pos, "full_attention")
    module(x, pos, "full_attention")
    module.ropes["full_attention"].base = 1234.0
    after = module(x, pos, "full_attention")
    assert not torch.equal(after[0], before[0])
    for g, w in zip(after, _full_path(module, x, pos, "full_attention"), strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    for other in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
        for g, w in zip(other(x, pos, "full_attention"), after, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_a_derived_table_that_later_needs_a_gradient_gets_it():
    from posemb.hf.fused import fused_rotation

    fused = fused_rotation(posemb.Layout.HALF)
    q, k = _qk()
    cos, sin = _hf_tables(torch.tensor([[10]]))
    fused(q, k, cos, sin), fused(q, k, cos, sin)  # derived and kept
    cos.requires_grad_()
    out = fused(q, k, cos, sin)[0]
    assert out.grad_fn is not None
    out.sum().backward()
    assert cos.grad is not None and cos.grad.abs().sum() > 0


def test_jit_trace_after_eager_calls_bakes_no_table():
    rope = posemb.RotaryEmbedding(64)
    q, k = _qk()
    rope(q, k, torch.tensor([[5]])), rope(q, k, torch.tensor([[5]]))
    traced = torch.jit.trace(lambda a, b, p: rope(a, b, p)[0], (q, k, torch.tensor([[5]])))
    other = torch.tensor([[9]])
    assert_close(traced(q, k, other), _expected(rope, q, k, other)[0], torch.float32)


def test_fused_rotation_under_inference_mode_and_after():
    from posemb.hf.fused import fused_rotation

    fused = fused_rotation(posemb.Layout.HALF)
    q, k = _qk()
    with torch.inference_mode():
        cos, sin = _hf_tables(torch.tensor([[10]]))
        for _ in range(2):
            assert_close(fused(q, k, cos, sin)[0], _hf_apply(q, k, cos, sin)[0], torch.float32)
    cos2, sin2 = _hf_tables(torch.tensor([[11]]))
    assert_close(fused(q, k, cos2, sin2)[0], _hf_apply(q, k, cos2, sin2)[0], torch.float32)


# --- The _into ops read tables and norm weights as a model holds them ---------------------------

_FORMS = {  # what each form reads of a (B, S, w) table, as a view
    0: lambda t: t,
    1: lambda t: t[..., : t.shape[-1] // 2],
    2: lambda t: t[..., ::2],
}


def _loose(batch, seq, n, form, dtype, seed):
    """cos and sin (batch, seq, w) in ``dtype`` whose ``form`` view is (batch, seq, n), made from
    a non-contiguous source (every other row of a wider tensor)."""
    g = torch.Generator().manual_seed(seed)
    angles = torch.rand(batch, seq, n, generator=g, dtype=torch.float64) * 6.0
    width = {0: n, 1: 2 * n, 2: 2 * n}[form]

    def table(values):
        full = {0: values, 1: torch.cat((values, values), -1)}.get(form)
        if full is None:
            full = values.repeat_interleave(2, -1)
        wide = torch.zeros(batch, 2 * seq, width, dtype=dtype)
        wide[:, ::2] = full.to(dtype)
        return wide[:, ::2]  # seq stride 2 * width: never contiguous past one token

    return table(angles.cos()), table(angles.sin())


@pytest.mark.parametrize("form", [0, 1, 2])
@pytest.mark.parametrize("table_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("batch", "seq", "tables_batch"), [(1, 1, 1), (3, 1, 3), (3, 5, 1)])
@pytest.mark.parametrize("layout", list(posemb.Layout))
def test_the_into_op_reads_tables_of_any_dtype_and_strides(
    form, table_dtype, batch, seq, tables_batch, layout
):
    assert kernels.cpu.load() is not None
    q, k = _qk(batch=batch, seq=seq, seed=form, head_dim=22)  # partial rotary: n = 5 of 11 pairs
    cos, sin = _loose(tables_batch, seq, 5, form, table_dtype, seed=seq)
    outs = (torch.empty_like(q), torch.empty_like(k))
    interleaved = layout is posemb.Layout.INTERLEAVED
    torch.ops.posemb._rotate_cpu_into.default(
        q, k, *outs, cos, sin, None, None, interleaved, False, form
    )
    c, s = _FORMS[form](cos).float(), _FORMS[form](sin).float()
    for got, x in zip(outs, (q, k), strict=True):
        assert_close(got, kernels.reference.apply_rope(x, c, s, layout), torch.float32)
    torch.library.opcheck(
        torch.ops.posemb._rotate_cpu_into.default,
        (q, k, *outs, cos, sin, None, None, interleaved, False, form),
    )


@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_norm_into_op_reads_weights_of_any_dtype_with_their_offset(weight_dtype, offset, dtype):
    assert kernels.cpu.load() is not None
    q, k = _qk(batch=2, seq=3, dtype=dtype, seed=7, head_dim=16)
    cos, sin = _loose(2, 3, 8, 1, dtype, seed=8)
    g = torch.Generator().manual_seed(9)
    qw, kw = (torch.randn(16, generator=g).to(weight_dtype) for _ in range(2))
    outs = (torch.empty_like(q), torch.empty_like(k))
    op = torch.ops.posemb._norm_rotate_cpu_into.default
    op(q, k, *outs, cos, sin, qw, kw, 1e-6, offset, False, 1)
    c, s = _FORMS[1](cos).float(), _FORMS[1](sin).float()
    want = kernels.norm.reference(q, k, c, s, qw.float(), kw.float(), 1e-6, offset)
    for got, w in zip(outs, want, strict=True):
        assert_close(got, w, dtype)
    torch.library.opcheck(op, (q, k, *outs, cos, sin, qw, kw, 1e-6, offset, False, 1))


def test_the_into_ops_refuse_what_does_not_fit():
    assert kernels.cpu.load() is not None
    q, k = _qk(batch=2, seq=3, head_dim=16)
    outs = (torch.empty_like(q), torch.empty_like(k))
    cos, sin = _loose(2, 3, 8, 1, torch.float32, seed=1)
    rotate = torch.ops.posemb._rotate_cpu_into.default
    norm = torch.ops.posemb._norm_rotate_cpu_into.default
    w = torch.ones(16)
    for call, match in (
        (lambda: rotate(q, k, *outs, cos, sin, None, None, False, False, 3), "table_form"),
        (lambda: rotate(q, k, *outs, cos, sin[:, :2], None, None, False, False, 1), "fit"),
        (lambda: rotate(q, k, *outs, cos, sin[:1], None, None, False, False, 1), "cos's shape"),
        (lambda: rotate(q, k, *outs, cos.double(), sin, None, None, False, False, 1), "float32"),
        (lambda: norm(q, k, *outs, cos, sin, w[:8], w, 1e-6, 0.0, False, 1), "head_dim"),
        (lambda: norm(q, k, *outs, cos, sin, w.double(), w, 1e-6, 0.0, False, 1), "float32"),
        (lambda: norm(q, k, *outs, cos, sin, w[::2].repeat(2), w, 0.0, 0.0, False, 1), "eps"),
    ):
        with pytest.raises(RuntimeError, match=match):
            call()


def test_the_fused_rotation_sees_tables_written_through_data():
    from posemb.hf.fused import fused_rotation

    fused = fused_rotation(posemb.Layout.HALF)
    for dtype in (torch.float32, torch.bfloat16):  # read as they are, and packed
        q, k = _qk(batch=2, dtype=dtype)
        cos, sin = _hf_tables(torch.tensor([[10], [11]]), dtype=dtype)
        fused(q, k, cos, sin), fused(q, k, cos, sin)
        new_cos, new_sin = _hf_tables(torch.tensor([[4321], [7]]), dtype=dtype)
        version = cos._version
        cos.data.copy_(new_cos), sin.data.copy_(new_sin)
        assert cos._version == version  # no bump: nothing keyed on it may trust it
        want = _hf_apply(q, k, new_cos, new_sin)
        for got, w in zip(fused(q, k, cos, sin), want, strict=True):
            assert_close(got, w.float(), dtype)
