"""On a CUDA GPU only: a decode step through posemb is captured in a CUDA graph and replayed with
new positions (the rotation, norm_rotate and a fused Llama with a static cache), and the CUDA
path never synchronises with the host (``torch.cuda.set_sync_debug_mode("error")``): serving
engines run decode under CUDA graphs, which forbid a host read in the call. Skipped on a host
without a GPU; `benchmarks/gpu.sh` runs it where one is lent."""

import copy

import pytest
import torch

import posemb
from posemb import kernels
from tolerances import assert_close

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

F64 = torch.float64
DEV = "cuda"


def _counted_checks(monkeypatch):
    """A list that grows by one each time a rotation's checks run; nothing remembered."""
    from posemb.kernels import dispatch, triton_path

    triton_path.forget()
    checked = []
    real = dispatch.check_pair
    monkeypatch.setattr(
        dispatch, "check_pair", lambda *a, **kw: checked.append(1) or real(*a, **kw)
    )
    return checked


def _decode_inputs(batch=2, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, 32, 1, 128, generator=g).to(DEV, dtype)
    k = torch.randn(batch, 8, 1, 128, generator=g).to(DEV, dtype)
    return q, k


def _tables(pos):
    inv = posemb.inv_freq(128, 500000.0, dtype=F64).to(DEV)
    return posemb.cos_sin(pos, inv)


def _captured(fn, *static):
    """``fn(*static)`` warmed up on a side stream, then captured; the graph and its outputs."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*static)
    return graph, out


def test_the_rotation_replays_in_a_cuda_graph_with_new_positions():
    q, k = _decode_inputs()
    cos, sin = _tables(torch.tensor([[5], [900]], device=DEV))
    static = [q.clone(), k.clone(), cos.clone(), sin.clone()]
    graph, out = _captured(kernels.rotate, *static)
    for step in range(1, 4):
        nq, nk = _decode_inputs(seed=step)
        c, s = _tables(torch.tensor([[5 + step], [900 + 7 * step]], device=DEV))
        for dst, src in zip(static, (nq, nk, c, s), strict=True):
            dst.copy_(src)
        graph.replay()
        want = kernels.rotate(nq, nk, c, s, backend="reference")
        for got, w in zip(out, want, strict=True):
            assert_close(got, w, torch.bfloat16)


def test_norm_rotate_replays_in_a_cuda_graph_with_new_positions():
    q, k = _decode_inputs()
    cos, sin = _tables(torch.tensor([[3], [40]], device=DEV))
    g = torch.Generator().manual_seed(9)
    qw, kw = (1 + 0.2 * torch.randn(2, 128, generator=g)).to(DEV)

    def step(q, k, cos, sin):
        return kernels.norm_rotate(q, k, cos, sin, qw, kw, 1e-6, 1.0)

    static = [q.clone(), k.clone(), cos.clone(), sin.clone()]
    graph, out = _captured(step, *static)
    for i in range(1, 4):
        nq, nk = _decode_inputs(seed=10 + i)
        c, s = _tables(torch.tensor([[3 + i], [40 + i]], device=DEV))
        for dst, src in zip(static, (nq, nk, c, s), strict=True):
            dst.copy_(src)
        graph.replay()
        want = kernels.norm.reference(nq, nk, c, s, qw, kw, 1e-6, 1.0)
        for got, w in zip(out, want, strict=True):
            assert_close(got, w, torch.bfloat16)


def test_the_cuda_path_never_synchronises_with_the_host():
    """Inputs are made (copies from the host count as syncs) and each call made once before
    the check is switched on; then every call, first path and remembered path, runs under it."""
    q, k = _decode_inputs()
    pos = torch.tensor([[5], [900]], device=DEV)
    cos, sin = _tables(pos)
    rope = posemb.RotaryEmbedding(128, base=500000.0)
    ones = torch.ones(128, device=DEV)
    inv = posemb.inv_freq(128, dtype=F64).to(DEV)
    qc, kc = q.clone(), k.clone()

    def calls():
        kernels.rotate(q, k, cos, sin)
        kernels.rotate(qc, kc, cos, sin, inplace=True)
        kernels.norm_rotate(q, k, cos, sin, ones, ones, 1e-6)
        rope(q, k, pos)
        posemb.cos_sin(pos, inv)

    calls()  # warm: the tables a module keeps per device are formed here
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(2):  # the second call too: nothing remembered may read back
            calls()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_a_repeated_decode_call_skips_the_checks_and_still_refuses_a_changed_one(monkeypatch):
    """The CUDA decode fast path: the second call with one signature runs no check and gives
    the full path's answer; a call whose signature changed (dtype, strides, grad) is checked
    again, so bad input is refused as before."""
    checked = _counted_checks(monkeypatch)
    q, k = _decode_inputs()
    cos, sin = _tables(torch.tensor([[5], [900]], device=DEV))
    first = kernels.rotate(q, k, cos, sin)
    second = kernels.rotate(q, k, cos, sin)
    assert len(checked) == 1
    want = kernels.rotate(q, k, cos, sin, backend="reference")
    for a, b, w in zip(first, second, want, strict=True):
        assert torch.equal(a, b)
        assert_close(b, w, torch.bfloat16)
    kernels.rotate(q.float(), k.float(), cos, sin)  # another dtype: checked again
    assert len(checked) == 2
    with pytest.raises(ValueError, match="cos has 65 frequencies"):
        wide = torch.zeros(2, 1, 65, device=DEV)
        kernels.rotate(q, k, wide, wide)
    qg = q.float().requires_grad_()
    out, _ = kernels.rotate(qg, k.float(), cos, sin)
    assert out.grad_fn is not None  # a gradient wanted: the registered op, not the fast path


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=97, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval().to(DEV)


def _prefilled(model, ids):
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=32)
    with torch.no_grad():
        model(ids, past_key_values=cache, cache_position=torch.arange(ids.shape[1], device=DEV))
    return cache


def test_a_fused_llama_decode_step_replays_in_a_cuda_graph_and_never_syncs():
    eager = _llama()
    fused = copy.deepcopy(eager)
    posemb.hf.patch_rotary(fused, fused=True)
    prompt = torch.randint(0, 97, (1, 8), generator=torch.Generator().manual_seed(1)).to(DEV)
    cache, twin = _prefilled(fused, prompt), _prefilled(eager, prompt)
    token = torch.zeros(1, 1, dtype=torch.long, device=DEV)
    at = torch.tensor([8], device=DEV)

    def step(token, at):
        with torch.no_grad():
            return fused(
                token, past_key_values=cache, cache_position=at, position_ids=at[None]
            ).logits

    # transformers' StaticLayer (5.24) writes at its own device counter, not at
    # cache_position: the warm-up steps advance it, so it is put back after the capture.
    counters = [
        (layer, layer.cumulative_length.clone())
        for layer in cache.layers
        if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)
    ]
    torch.cuda.set_sync_debug_mode("error")
    try:
        graph, out = _captured(step, token, at)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for layer, counter in counters:
        layer.cumulative_length.copy_(counter)
    for i, t in enumerate((11, 42, 7)):
        token.fill_(t)
        at.fill_(8 + i)
        graph.replay()
        with torch.no_grad():
            want = eager(token.clone(), past_key_values=twin, cache_position=at.clone(),
                         position_ids=at[None].clone()).logits  # fmt: skip
        assert_close(out, want, torch.float32)


def test_a_repeated_norm_rotate_call_skips_the_checks_and_still_refuses_a_changed_one(
    monkeypatch,
):
    """norm_rotate's CUDA decode path: the second call with one signature (weights, eps and
    offset included) runs no check; a changed eps or weight is checked again."""
    checked = _counted_checks(monkeypatch)
    q, k = _decode_inputs()
    cos, sin = _tables(torch.tensor([[5], [900]], device=DEV))
    qw = torch.linspace(0.5, 1.5, 128, device=DEV)
    kw = torch.linspace(1.5, 0.5, 128, device=DEV)
    first = kernels.norm_rotate(q, k, cos, sin, qw, kw, 1e-6, 1.0)
    second = kernels.norm_rotate(q, k, cos, sin, qw, kw, 1e-6, 1.0)
    assert len(checked) == 1
    want = kernels.norm.reference(q, k, cos, sin, qw, kw, 1e-6, 1.0)
    for a, b, w in zip(first, second, want, strict=True):
        assert torch.equal(a, b)
        assert_close(b, w, torch.bfloat16)
    with pytest.raises(ValueError, match="eps"):
        kernels.norm_rotate(q, k, cos, sin, qw, kw, 0.0, 1.0)
    with pytest.raises(ValueError, match="q_weight"):
        kernels.norm_rotate(q, k, cos, sin, qw[:64], kw, 1e-6, 1.0)


def test_a_packed_batch_of_more_than_65535_sequences():
    """CUDA caps grid axes 1 and 2 at 65535: sequences share axis 0 with their token blocks."""
    n = 70_000
    g = torch.Generator().manual_seed(4)
    q = torch.randn(n, 2, 64, generator=g).to(DEV)
    k = torch.randn(n, 1, 64, generator=g).to(DEV)
    cu = torch.arange(n + 1, device=DEV, dtype=torch.int32)  # one token each
    inv = posemb.inv_freq(64, dtype=F64).to(DEV)
    cos, sin = posemb.cos_sin(torch.arange(8, device=DEV), inv)
    off = torch.randint(0, 7, (n,), generator=g).to(DEV)
    got_q, got_k = kernels.rotate_cached(q, k, cos, sin, cu_seqlens=cu, offsets=off)
    want_q, want_k = kernels.rotate_cached(
        q, k, cos, sin, cu_seqlens=cu, offsets=off, backend="reference"
    )
    assert_close(got_q, want_q, torch.float32)
    assert_close(got_k, want_k, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extended_attention_on_the_gpu_is_its_reference(dtype):
    """Issue 48's CUDA path: the memory-efficient kernel passes its first-use check (no
    fallback to the explicit tiles) and gives the blocked reference's output and gradients."""
    import warnings

    from posemb.attention import kernels as _lse_kernels

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, 700, 64, generator=g) for h in (8, 2, 2))
    q, k, v = (t.to(DEV, dtype).requires_grad_() for t in (q, k, v))
    rope = posemb.RotaryEmbedding(64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert _lse_kernels.kernel_for(q, v) is _lse_kernels.EFFICIENT_CUDA
    for method in (posemb.SelfExtend(group=4, window=64), posemb.DualChunk(256, 32)):
        runs = []
        for fused in (True, False):
            out = posemb.extended_attention(q, k, v, rope, method, fused=fused)
            runs.append((out, *torch.autograd.grad(out.float().square().sum(), (q, k, v))))
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        for a, b in zip(*runs, strict=True):
            torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)
