"""PositionalAttention through the blocked core (issue 55) against its explicit path (the
``(q_len, k_len)`` bias handed to SDPA, which ``attention_probs`` checks against the written-out
definition), forward and backward, every learned piece included: every bias encoding, windows,
sinks, GQA, decode steps and chunks over a cache, explicit positions, key padding, each dtype,
second derivatives; blocks forced small so that every call kind and block edge is crossed; and
what it must never do (form a ``q_len x k_len`` tensor)."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import posemb
from posemb.attention import core, module, scores
from tolerances import TOL, TOL_SECOND, UNIT_ROUNDOFF, assert_close_at_scale

F64 = torch.float64
# "fire-torch": FIRE with its fused CPU op held off (the torch path other devices run).
ENCODINGS = ["alibi", "t5", "kerple", "kerple-power", "fire", "fire-torch", "rope", "nope"]


@pytest.fixture(autouse=True)
def _fire_path(request, monkeypatch):
    spec = getattr(request.node, "callspec", None)
    if spec is not None and spec.params.get("name") == "fire-torch":
        monkeypatch.setattr(scores, "_FUSED_OFF", True)


# The core's block sizes as it ships them, before _small_blocks shrinks them.
CORE_BLOCKS = {n: getattr(core, n) for n in ("_SQUARE", "_ROWS", "_LEAF", "_TILE", "_BACK_COLS")}


@pytest.fixture(autouse=True)
def _small_blocks(monkeypatch):
    """Blocks of 16 queries (squares of 16, leaves of 4, tiles of 512 elements): every call
    kind and block edge on inputs of a few dozen tokens."""
    monkeypatch.setattr(core, "_SQUARE", 16)
    monkeypatch.setattr(core, "_ROWS", 16)
    monkeypatch.setattr(core, "_LEAF", 4)
    monkeypatch.setattr(core, "_TILE", 512)
    monkeypatch.setattr(core, "_BACK_COLS", 24)


def _attention(name, dtype=F64, **kw):
    extra = {"kind": "power"} if name == "kerple-power" else {}
    enc = {"kerple-power": "kerple", "fire-torch": "fire"}.get(name, name)
    torch.manual_seed(1)
    att = posemb.PositionalAttention(enc, num_heads=4, head_dim=8, **extra, **kw).to(dtype)
    with torch.no_grad():  # learned pieces away from their initial values
        for p in att.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return att


def _inputs(b, lq, lk, dtype=F64, kv=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, 4, lq, 8, generator=g, dtype=F64).to(dtype).requires_grad_()
    k = torch.randn(b, kv, lk, 8, generator=g, dtype=F64).to(dtype).requires_grad_()
    v = torch.randn(b, kv, lk, 8, generator=g, dtype=F64).to(dtype).requires_grad_()
    return q, k, v


def _both(att, q, k, v, monkeypatch, **call):
    """Output and gradients (q, k, v, then every parameter) through the tiles and through the
    explicit path."""
    runs = []
    params = [p for p in att.parameters() if p.requires_grad]
    for tiles in (True, False):
        monkeypatch.setattr(module, "TILES_FROM", 1 if tiles else 1 << 60)
        out = att(q, k, v, **call)
        weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
        grads = torch.autograd.grad((out * weight).sum(), (q, k, v, *params))
        runs.append((out, *grads))
    return runs


def _close(runs, dtype, terms=1):
    """Output and q, k, v gradients within the table's tolerance; each parameter's gradient,
    a sum over every (query, key) pair taken in another order on either side, within one
    roundoff per term (``terms`` of them) of the same scale."""
    out, dq, dk, dv, *params = zip(*runs, strict=True)
    for a, b in (out, dq, dk, dv):
        assert_close_at_scale(a, b, dtype)
    tol = max(TOL[dtype]["rtol"], terms * UNIT_ROUNDOFF[dtype])
    for a, b in params:
        scale = max(1.0, float(b.abs().max()))
        torch.testing.assert_close(a, b, rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("name", ENCODINGS)
@pytest.mark.parametrize(
    "setting",
    [{"causal": True}, {"causal": False}, {"causal": True, "window": 7},
     {"causal": True, "sinks": True}],
    ids=["causal", "both-ways", "window", "sinks"],
)  # fmt: skip
def test_the_tiles_are_the_explicit_path(name, setting, monkeypatch):
    att = _attention(name, **setting)
    if att.sinks is not None:
        with torch.no_grad():
            att.sinks.normal_()
    q, k, v = _inputs(2, 45, 45)
    _close(_both(att, q, k, v, monkeypatch), F64, terms=2 * 45 * 45)


@pytest.mark.parametrize("name", ["alibi", "t5", "fire", "fire-torch", "rope"])
@pytest.mark.parametrize(
    "shape", [(2, 1, 50), (2, 13, 50), (1, 50, 50)], ids=["decode", "chunk", "prefill"]
)
def test_decode_steps_and_chunks_over_a_cache(name, shape, monkeypatch):
    """The queries are the last q_len of the k_len positions (a cache before them)."""
    b, lq, lk = shape
    att = _attention(name, causal=True, window=20 if name == "rope" else None)
    q, k, v = _inputs(b, lq, lk, kv=4)
    _close(_both(att, q, k, v, monkeypatch), F64, terms=b * lq * lk)


@pytest.mark.parametrize("name", ["alibi", "t5", "kerple", "fire", "rope"])
@pytest.mark.parametrize("where", ["offset", "per-sequence", "gaps", "shuffled"])
def test_explicit_positions(name, where, monkeypatch):
    """Positions that are ranges (an offset: the table's path) and positions that are not
    (per-sequence offsets, gaps, keys out of order: tiles from the positions)."""
    att = _attention(name, causal=True, window=9 if name == "rope" else None)
    q, k, v = _inputs(2, 30, 30)
    pos = {
        "offset": torch.arange(30) + 100,
        "per-sequence": torch.arange(30) + torch.tensor([[0], [7]]),
        "gaps": torch.arange(30) * 3,
        "shuffled": torch.randperm(30, generator=torch.Generator().manual_seed(2)),
    }[where]
    _close(_both(att, q, k, v, monkeypatch, positions=pos, k_positions=pos), F64, 2 * 30 * 30)


@pytest.mark.parametrize("name", ["alibi", "t5", "fire", "nope"])
@pytest.mark.parametrize(
    "case", ["after, causal", "after, both ways", "before, both ways", "more queries"]
)
def test_queries_far_from_the_keys(name, case, monkeypatch):
    """Queries many blocks past (or before) every key, and more queries than keys with the
    default positions: the distance table reaches every distance a call reads (it was cut at
    ``q_len + k_len`` and a view read past it)."""
    causal = case == "after, causal"
    att = _attention(name, causal=causal, sinks=name == "nope")
    lq, lk, q_at = {
        "after, causal": (30, 20, 90), "after, both ways": (30, 20, 90),
        "before, both ways": (20, 30, -80), "more queries": (70, 12, None),
    }[case]  # fmt: skip
    q, k, v = _inputs(2, lq, lk)
    call = {} if q_at is None else {"positions": torch.arange(lq) + q_at,
                                    "k_positions": torch.arange(lk)}  # fmt: skip
    _close(_both(att, q, k, v, monkeypatch, **call), F64, terms=2 * lq * lk)


@pytest.mark.parametrize("name", ["alibi", "t5", "fire", "fire-torch", "rope"])
def test_key_padding_on_either_side_and_inside(name, monkeypatch):
    att = _attention(name, causal=True, sinks=True, window=11 if name == "rope" else None)
    with torch.no_grad():
        att.sinks.normal_()
    q, k, v = _inputs(3, 40, 40)
    pad = torch.zeros(3, 40, dtype=torch.bool)
    pad[0, :6] = True  # left
    pad[1, -5:] = True  # right
    pad[2, 10:14] = True  # a hole
    _close(_both(att, q, k, v, monkeypatch, key_padding_mask=pad), F64, terms=3 * 40 * 40)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["alibi", "t5", "fire", "fire-torch"])
def test_each_dtype_against_the_float64_definition(name, dtype, monkeypatch):
    """The tiles compute in float32 (the table, the merge) and round once to the input's
    dtype: within one rounding of the float64 definition. (The explicit path rounds its bias
    to the input's dtype first, so it is the float64 definition that is compared here.)"""
    monkeypatch.setattr(module, "TILES_FROM", 1)
    att = _attention(name, causal=True).to(dtype)
    q, k, v = (t.detach().to(dtype) for t in _inputs(2, 40, 40))
    got = att(q, k, v)
    assert got.dtype == dtype
    # The definition at the same (rounded) inputs and parameters, in float64.
    want = copy.deepcopy(att).to(F64)(q.double(), k.double(), v.double())
    assert_close_at_scale(got, want.detach(), dtype)


@pytest.mark.parametrize("name", ["alibi", "t5", "kerple", "fire"])
def test_second_derivatives_are_the_explicit_paths(name, monkeypatch):
    att = _attention(name, causal=True, sinks=True)
    q, k, v = _inputs(1, 33, 33)
    params = [p for p in att.parameters() if p.requires_grad]
    second = []
    for tiles in (True, False):
        monkeypatch.setattr(module, "TILES_FROM", 1 if tiles else 1 << 60)
        out = att(q, k, v)
        gq, *gp = torch.autograd.grad(out.square().sum(), (q, *params), create_graph=True)
        penalty = gq.square().sum() + sum(g.square().sum() for g in gp)
        second.append(torch.autograd.grad(penalty, (q, k, v, *params)))
    for a, b in zip(*second, strict=True):
        assert_close_at_scale(a, b, F64, TOL_SECOND)


def test_a_copied_pickled_module_and_a_second_call_give_the_same(monkeypatch):
    monkeypatch.setattr(module, "TILES_FROM", 1)
    att = _attention("t5", causal=True, sinks=True)
    q, k, v = _inputs(2, 30, 30)
    first = att(q, k, v)
    for other in (att, copy.deepcopy(att), pickle.loads(pickle.dumps(att))):
        torch.testing.assert_close(other(q, k, v), first, rtol=0, atol=0)


def test_the_rule_small_calls_explicit_large_calls_tiled(monkeypatch):
    """Below TILES_FROM pairs the explicit path serves (a few small tensors), from it the
    core; plain causal RoPE always stays with SDPA's causal flag."""
    seen = []
    real = module.PositionalAttention._tiled
    monkeypatch.setattr(
        module.PositionalAttention, "_tiled", lambda self, *a: seen.append(1) or real(self, *a)
    )
    att = posemb.PositionalAttention("alibi", num_heads=2, head_dim=8, causal=True)
    small = torch.randn(1, 2, 8, 8)
    att(small, small, small)
    assert not seen
    monkeypatch.setattr(module, "TILES_FROM", 64)
    att(small, small, small)
    assert seen == [1]
    rope = posemb.PositionalAttention("rope", num_heads=2, head_dim=8, causal=True)
    rope(small, small, small)
    assert seen == [1]


class _Largest(TorchDispatchMode):
    """The most elements of any tensor an operation returns while the mode is on."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("name", ["alibi", "t5", "fire"])
def test_no_tensor_grows_with_q_len_times_k_len(name, monkeypatch):
    """At 8,192 tokens (one head of 8) nothing the tiles form, forward or backward, holds more
    than a small fraction of the (q_len, k_len) grid: the explicit bias alone would hold it
    whole (67M elements)."""
    # The core's own block sizes, not _small_blocks' (its 24-column backward chunks made
    # 2,800 tiles here: FIRE took 20 s, 2 s with these), then half its tile.
    for block, value in CORE_BLOCKS.items():
        monkeypatch.setattr(core, block, value)
    monkeypatch.setattr(core, "_TILE", 1 << 20)
    n = 8192
    att = posemb.PositionalAttention(name, num_heads=1, head_dim=8, causal=True)
    q, k, v = (torch.randn(1, 1, n, 8, requires_grad=True) for _ in range(3))
    with _Largest() as seen:
        att(q, k, v).sum().backward()
    assert seen.largest <= n * n // 32


@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("tiles", [False, True], ids=["explicit-size", "core-size"])
def test_forward_mode_ad_gives_the_jvp(sinks, tiles, monkeypatch):
    """A dual query through a call of either size (the core's merge and SDPA's fused CPU
    kernels have no forward-mode derivative: such a call takes SDPA's math form), against a
    central difference."""
    import torch.autograd.forward_ad as fwad

    monkeypatch.setattr(module, "TILES_FROM", 1 if tiles else 1 << 60)
    att = _attention("alibi", causal=True, sinks=sinks)
    q, k, v = (t.detach() for t in _inputs(1, 20, 20))
    tangent = torch.randn(q.shape, generator=torch.Generator().manual_seed(3), dtype=F64)
    with fwad.dual_level():
        got = fwad.unpack_dual(att(fwad.make_dual(q, tangent), k, v)).tangent
    eps = 1e-6
    with torch.no_grad():
        want = (att(q + eps * tangent, k, v) - att(q - eps * tangent, k, v)) / (2 * eps)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["fire", "fire-torch"])
def test_fires_gradients_keep_their_digits_far_from_position_zero(name, monkeypatch):
    """Positions from 5,000 in float32: every parameter's gradient through the tiles within a
    few hundred float32 roundoffs (at the scale of the largest) of the float64 definition
    (``c``'s, through per-row sums, was 6e-7 relative at 2,048 tokens, 2.5e-6 through
    autograd over each tile's x)."""
    att = _attention(name, causal=True)
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 4, 96, 8, generator=g, dtype=F64) for _ in range(3))
    pos = torch.arange(5000, 5096)
    runs = []
    for dtype, tiles in ((torch.float32, True), (F64, False)):
        monkeypatch.setattr(module, "TILES_FROM", 1 if tiles else 1 << 60)
        a = copy.deepcopy(att).to(dtype)
        out = a(q.to(dtype), k.to(dtype), v.to(dtype), positions=pos, k_positions=pos)
        weight = torch.linspace(-1, 1, out.numel(), dtype=dtype).view_as(out)
        runs.append(torch.autograd.grad((out * weight).sum(), list(a.parameters())))
    scale = max(float(w.abs().max()) for w in runs[1])
    for got, want in zip(*runs, strict=True):
        err = float((got.double() - want).abs().max())
        assert err <= 256 * UNIT_ROUNDOFF[torch.float32] * scale


@pytest.mark.parametrize("frozen", ["c threshold", "mlp", "mlp threshold", "c"])
@pytest.mark.parametrize("name", ["fire", "fire-torch"])
def test_fire_with_some_parameters_frozen(name, frozen, monkeypatch):
    """Only the parameters that require grad get one, as on the explicit path (a frozen MLP,
    or a frozen c and threshold, leaves a piece of the backward with no graph: it crashed)."""
    att = _attention(name, causal=True)
    for pname, p in att.encoding.named_parameters():
        if pname.split(".")[0] in frozen.split():
            p.requires_grad_(False)
    q, k, v = _inputs(2, 40, 40)
    _close(_both(att, q, k, v, monkeypatch), F64, terms=2 * 40 * 40)


def test_second_derivatives_where_k_and_v_need_no_gradient(monkeypatch):
    """A gradient penalty in q alone (k and v constants): the recomputed backward asks autograd
    only for what requires grad (it asked for k and v too, and failed)."""
    att = _attention("fire", causal=True)
    q, k, v = _inputs(1, 33, 33)
    k, v = k.detach(), v.detach()
    second = []
    for tiles in (True, False):
        monkeypatch.setattr(module, "TILES_FROM", 1 if tiles else 1 << 60)
        (gq,) = torch.autograd.grad(att(q, k, v).square().sum(), (q,), create_graph=True)
        second.append(torch.autograd.grad(gq.square().sum(), (q,)))
    assert_close_at_scale(second[0][0], second[1][0], F64, TOL_SECOND)


def test_a_frozen_fire_parameter_edited_before_the_backward_is_refused(monkeypatch):
    """The backward recomputes FIRE's tiles from its parameters; one edited in place after the
    forward (frozen, so autograd does not watch it) would give the wrong gradients silently."""
    monkeypatch.setattr(module, "TILES_FROM", 1)
    att = _attention("fire", causal=True)
    att.encoding.c.requires_grad_(False)
    q, k, v = _inputs(1, 40, 40)
    out = att(q, k, v)
    with torch.no_grad():
        att.encoding.c.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified in place between the forward and the"):
        out.sum().backward()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_fire_past_its_pieces(dtype, monkeypatch):
    """A bfloat16 or float16 FIRE module whose x runs past its last breakpoint + 1 (the half
    square above a call's diagonal): the lookup's cells are found in float32 (in bfloat16 the
    last, 4095, rounded to 4096, one past the end), and the result is the float64
    definition's within the dtype's table."""
    monkeypatch.setattr(module, "TILES_FROM", 1)
    torch.manual_seed(4)
    att = posemb.PositionalAttention("fire", num_heads=4, head_dim=8, causal=True)
    with torch.no_grad():
        for p in att.encoding.mlp.parameters():
            p.normal_(0, 1)
        att.encoding.c.fill_(0.3)
        att.encoding.threshold.fill_(20.0)
    q, k, v = (t.detach() for t in _inputs(2, 80, 80, kv=4))
    with torch.no_grad():
        got = att.to(dtype)(q.to(dtype), k.to(dtype), v.to(dtype))
        monkeypatch.setattr(module, "TILES_FROM", 1 << 60)
        want = att.to(F64)(*(t.to(dtype).double() for t in (q, k, v)))
    assert_close_at_scale(got.double(), want, dtype)
