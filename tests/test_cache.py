"""RotatedKVCache: eviction with sinks, and schedule switches, equal to a fresh prefill."""

import pytest
import torch

import posemb
from posemb import scaling
from posemb.attention import dot_product_attention
from tolerances import assert_close

F64 = torch.float64
D, ORIGINAL = 16, 16


def _stream(n, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 4, n, D, generator=g, dtype=dtype)
    k = torch.randn(1, 2, n, D, generator=g, dtype=dtype)
    v = torch.randn(1, 2, n, 8, generator=g, dtype=dtype)
    return q, k, v


def _attend(q, keys, values):
    """The last query's output over every key: GQA by repeating the kv heads."""
    rep = q.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)
    return dot_product_attention(q[:, :, -1:], keys, values)


SCHEDULES = {
    "default": None,
    "linear": scaling.Linear(4.0),
    "yarn": scaling.Yarn(4.0, ORIGINAL),
    "llama3": scaling.Llama3(4.0, 1.0, 4.0, ORIGINAL),
}


@pytest.mark.parametrize("name", SCHEDULES)
def test_sinks_and_eviction_equal_recomputing_the_kept_tokens(name):
    rope = posemb.RotaryEmbedding(D, scaling=SCHEDULES[name])
    cache = posemb.RotatedKVCache(rope, sink=2, window=6)
    q, k, v = _stream(40, dtype=F64)
    for t in range(40):
        qr, keys, values = cache.step(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1])
        # From scratch: the kept tokens (the sinks, then the latest) at positions 0..n-1.
        kept = list(range(min(2, t + 1))) + list(range(max(2, t + 1 - 6), t + 1))
        fresh_q, fresh_k = rope(q[:, :, kept], k[:, :, kept])
        assert keys.shape[2] == len(kept) <= 8
        torch.testing.assert_close(keys, fresh_k, rtol=0, atol=1e-12)
        torch.testing.assert_close(values, v[:, :, kept])
        got, want = _attend(qr, keys, values), _attend(fresh_q, fresh_k, v[:, :, kept])
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert cache.rotations == 40 - 8


def test_float32_keys_evicted_many_times_stay_at_rounding():
    rope = posemb.RotaryEmbedding(D)
    cache = posemb.RotatedKVCache(rope, sink=1, window=4)
    q, k, v = _stream(400)
    for t in range(400):
        _, keys, _ = cache.step(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1])
    kept = [0, *range(396, 400)]
    _, fresh = rope(q[:, :, kept], k[:, :, kept])
    assert_close(keys, fresh, torch.float32)


def _longrope():
    half = D // 2
    return scaling.LongRope(
        short_factor=tuple(1.0 + 0.1 * i for i in range(half)),
        long_factor=tuple(2.0 + 0.5 * i for i in range(half)),
        original_max_position_embeddings=ORIGINAL,
        factor=4.0,
    )


@pytest.mark.parametrize(
    "schedule", [_longrope(), scaling.DynamicNTK(4.0, ORIGINAL)], ids=["longrope", "dynamic"]
)
def test_a_schedule_switch_past_the_original_length_reads_as_a_fresh_prefill(schedule):
    rope = posemb.RotaryEmbedding(D, scaling=schedule)
    q, k, v = _stream(24, dtype=F64)
    cache = posemb.RotatedKVCache(rope)
    naive_keys = []
    for t in range(24):
        qr, keys, _ = cache.step(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1])
        # What a cache that never re-rotates holds: each key as it was rotated when it came.
        naive_keys.append(rope.rotate(k[:, :, t : t + 1], torch.tensor([t])))
    fresh_q, fresh_k = rope(q, k)  # the whole sequence prefilled: one schedule for every key
    torch.testing.assert_close(keys, fresh_k, rtol=0, atol=1e-12)
    logits = (qr[:, :, -1:] @ keys.repeat_interleave(2, 1).transpose(-1, -2))[0, :, 0]
    fresh = (fresh_q[:, :, -1:] @ fresh_k.repeat_interleave(2, 1).transpose(-1, -2))[0, :, 0]
    naive = torch.cat(naive_keys, dim=2).repeat_interleave(2, 1)
    stale = (qr[:, :, -1:] @ naive.transpose(-1, -2))[0, :, 0]
    assert float((logits - fresh).abs().max()) < 1e-12
    gap = float((stale - fresh).abs().max())
    assert gap > 1e-2, gap  # the bug the switch removes: keys of the old schedule
    print(f"{type(schedule).__name__}: stale-key logit gap {gap:.3g}")
    assert cache.rotations >= 1


def test_reschedule_moves_the_cache_to_another_scaling():
    q, k, v = _stream(10, dtype=F64)
    cache = posemb.RotatedKVCache(posemb.RotaryEmbedding(D))
    for t in range(10):
        cache.step(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1])
    other = posemb.RotaryEmbedding(D, scaling=scaling.Linear(2.0))
    cache.reschedule(other)
    _, fresh = other(q, k)
    torch.testing.assert_close(cache.keys, fresh, rtol=0, atol=1e-12)


def test_bad_caches_are_refused():
    with pytest.raises(ValueError, match="rope must be a RotaryEmbedding"):
        posemb.RotatedKVCache(posemb.XPos(D))
    with pytest.raises(ValueError, match="sink must be an integer >= 0, got -1"):
        posemb.RotatedKVCache(posemb.RotaryEmbedding(D), sink=-1)
    with pytest.raises(ValueError, match="window must be a positive integer"):
        posemb.RotatedKVCache(posemb.RotaryEmbedding(D), window=0)
    cache = posemb.RotatedKVCache(posemb.RotaryEmbedding(D), sink=0, window=2)
    q, k, v = _stream(3)
    with pytest.raises(ValueError, match="does not fit a window of 2"):
        cache.step(q, k, v)
    with pytest.raises(ValueError, match="must hold the same new tokens"):
        cache.step(q[:, :, :1], k, v)
    with pytest.raises(ValueError, match=r"the new rope.s is 8"):
        cache.reschedule(posemb.RotaryEmbedding(D, rotary_dim=8))


def _state(cache):
    return (len(cache), cache.rotations, cache.keys.clone(), cache.values.clone())


@pytest.mark.parametrize(
    ("what", "shape_k", "shape_v", "dtype"),
    [
        ("batch", (2, 2, 1, 16), (2, 2, 1, 8), torch.float32),
        ("kv heads", (1, 1, 1, 16), (1, 1, 1, 8), torch.float32),
        ("head_dim", (1, 2, 1, 8), (1, 2, 1, 8), torch.float32),
        ("v_dim", (1, 2, 1, 16), (1, 2, 1, 4), torch.float32),
        ("dtype", (1, 2, 1, 16), (1, 2, 1, 8), torch.float64),
        ("v's length", (1, 2, 1, 16), (1, 2, 2, 8), torch.float32),
    ],
)
def test_a_bad_step_changes_nothing(what, shape_k, shape_v, dtype):
    # A step of another batch, kv-head count or head_dim had already evicted a token and
    # re-rotated the rest when it failed (batch and heads with torch's RuntimeError from cat).
    cache = posemb.RotatedKVCache(posemb.RotaryEmbedding(16), sink=1, window=3)
    g = torch.Generator().manual_seed(0)
    for _ in range(4):  # full: the next step evicts
        cache.step(*(torch.randn(1, n, 1, d, generator=g) for n, d in ((4, 16), (2, 16), (2, 8))))
    before = _state(cache)
    q = torch.randn(shape_k[0], 4, shape_k[2], shape_k[3]).to(dtype)
    with pytest.raises(ValueError):
        cache.step(q, torch.randn(shape_k).to(dtype), torch.randn(shape_v).to(dtype))
    after = _state(cache)
    assert after[:2] == before[:2], what
    assert torch.equal(after[2], before[2]) and torch.equal(after[3], before[3]), what


def test_reschedule_refuses_what_the_constructor_refuses():
    # XPos on an empty cache was accepted (the first eviction then failed); a string raised
    # AttributeError.
    for cache in (posemb.RotatedKVCache(posemb.RotaryEmbedding(16)),):
        for bad in (posemb.XPos(16), "yarn", None):
            with pytest.raises(ValueError, match="rope must be a RotaryEmbedding"):
                cache.reschedule(bad)
        assert type(cache.rope) is posemb.RotaryEmbedding
