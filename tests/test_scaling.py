import math

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

import posemb
from posemb import scaling as sc
from tolerances import TOL

F64 = torch.float64
dims = st.sampled_from([4, 8, 16, 32, 64, 96, 128, 256])
bases = st.floats(100.0, 1e7)
lengths = st.integers(16, 65536)
factors = st.floats(1.0, 64.0)


def default(d, b):
    return posemb.inv_freq(d, b, dtype=F64)


def at_factor_one(orig, d, seq_len):
    # Dynamic NTK is the identity at factor 1 only up to the original length (see below).
    dynamic = [sc.DynamicNTK(1.0, orig)] if seq_len is None or seq_len <= orig else []
    return [
        sc.Linear(1),
        sc.NTK(1.0),
        *dynamic,
        sc.Yarn(1.0, orig),
        sc.Llama3(1.0, 1.0, 4.0, orig),
        sc.LongRope((1.0,) * (d // 2), (1.0,) * (d // 2), orig),
        sc.Proportional(1.0, 1.0),
    ]


@given(dims, bases, lengths, st.one_of(st.none(), st.integers(1, 1 << 20)))
def test_every_scaling_at_factor_one_is_default(d, b, orig, seq_len):
    want = default(d, b)
    for schedule in at_factor_one(orig, d, seq_len):
        inv, factor = schedule.compute(d, b, seq_len)
        torch.testing.assert_close(inv, want, rtol=1e-12, atol=0, msg=repr(schedule))
        assert factor == 1.0, schedule


@given(dims, bases, factors)
def test_linear_is_default_over_factor(d, b, s):
    inv, _ = sc.Linear(s).compute(d, b)
    torch.testing.assert_close(inv, default(d, b) / s, rtol=1e-15, atol=0)


@given(dims, bases, factors, lengths, st.floats(1.5, 64), st.floats(0.05, 1.4), st.booleans())
def test_yarn_lies_between_default_over_s_and_default(d, b, s, orig, fast, slow, truncate):
    inv, factor = sc.Yarn(s, orig, beta_fast=fast, beta_slow=slow, truncate=truncate).compute(d, b)
    want = default(d, b)
    assert bool((inv <= want * (1 + 1e-12)).all())
    assert bool((inv >= want / s * (1 - 1e-12)).all())
    assert factor == pytest.approx(0.1 * math.log(s) + 1 if s > 1 else 1.0)
    # Fast pairs keep their frequency, slow ones are fully interpolated (when both bands exist).
    bands = sc.Yarn(s, orig, beta_fast=fast, beta_slow=slow, truncate=truncate).bands(d, b)
    for i, band in enumerate(bands):
        if band == "extrapolate":
            assert float(inv[i]) == pytest.approx(float(want[i]), rel=1e-12)
        elif band == "interpolate":
            assert float(inv[i]) == pytest.approx(float(want[i]) / s, rel=1e-12)


def test_yarn_attention_factor_variants():
    assert sc.Yarn(16.0, 4096).effective_attention_factor() == pytest.approx(0.1 * math.log(16) + 1)
    assert sc.Yarn(16.0, 4096, attention_factor=0.7).effective_attention_factor() == 0.7
    deepseek = sc.Yarn(40.0, 4096, mscale=1.0, mscale_all_dim=0.707)
    want = (0.1 * math.log(40) + 1) / (0.1 * 0.707 * math.log(40) + 1)
    assert deepseek.effective_attention_factor() == pytest.approx(want)
    # As in transformers: mscale without mscale_all_dim does not enter the factor.
    assert (
        sc.Yarn(40.0, 4096, mscale=2.0).effective_attention_factor()
        == sc.Yarn(40.0, 4096).effective_attention_factor()
    )


@given(dims.filter(lambda d: d >= 4), bases, factors, lengths, st.integers(1, 1 << 20))
def test_dynamic_ntk_is_default_up_to_original_length(d, b, s, orig, seq_len):
    schedule = sc.DynamicNTK(s, orig)
    inv, _ = schedule.compute(d, b, seq_len)
    if seq_len <= orig:
        torch.testing.assert_close(inv, default(d, b), rtol=1e-12, atol=0)
    else:
        # Beyond it: the base grows, the fastest pair stays, all others slow down.
        assume(s > 1.001)
        assert float(inv[0]) == 1.0
        assert bool((inv[1:] < default(d, b)[1:]).all())


def test_dynamic_ntk_at_factor_one_still_grows_the_base_past_l():
    # The formula b * (s l / L - (s - 1))^(d/(d-2)) is b * (l / L)^(d/(d-2)) at s = 1: past L the
    # base grows with the length whatever the factor; the factor only sets how fast.
    inv, _ = sc.DynamicNTK(1.0, 16).compute(4, 100.0, seq_len=32)
    torch.testing.assert_close(inv, default(4, 100.0 * 2.0**2), rtol=1e-12, atol=0)


def test_dynamic_ntk_matches_the_vllm_static_form_at_s_times_l():
    d, b, s, orig = 128, 10000.0, 4.0, 2048
    inv, _ = sc.DynamicNTK(s, orig).compute(d, b, seq_len=int(s * orig))
    static_base = b * (s * s - (s - 1)) ** (d / (d - 2))
    torch.testing.assert_close(inv, default(d, static_base), rtol=1e-12, atol=0)


@given(dims.filter(lambda d: d >= 4), bases, factors)
def test_ntk_keeps_fastest_and_divides_slowest_by_s(d, b, s):
    inv, _ = sc.NTK(s).compute(d, b)
    want = default(d, b)
    assert float(inv[0]) == 1.0
    assert float(inv[-1]) == pytest.approx(float(want[-1]) / s, rel=1e-9)


def test_llama3_bands_for_llama_3_1():
    schedule = sc.Llama3(8.0, 1.0, 4.0, 8192)
    bands = schedule.bands(128, 500000.0)
    assert (bands.count("high (kept)"), bands.count("low (scaled)"), bands.count("smoothed")) == (
        29,
        29,
        6,
    )
    inv, factor = schedule.compute(128, 500000.0)
    want = default(128, 500000.0)
    assert factor == 1.0
    for i, band in enumerate(bands):
        ratio = float(want[i] / inv[i])
        if band == "high (kept)":
            assert ratio == 1.0
        elif band == "low (scaled)":
            assert ratio == pytest.approx(8.0)
        else:
            assert 1.0 < ratio < 8.0


def test_longrope_switches_at_original_length():
    short, long = (1.0, 2.0, 4.0, 8.0), (3.0, 5.0, 7.0, 9.0)
    schedule = sc.LongRope(short, long, 4096, factor=32.0)
    want = default(8, 10000.0)
    inv_short, factor = schedule.compute(8, 10000.0, seq_len=4096)
    inv_long, _ = schedule.compute(8, 10000.0, seq_len=4097)
    torch.testing.assert_close(inv_short, want / torch.tensor(short, dtype=F64))
    torch.testing.assert_close(inv_long, want / torch.tensor(long, dtype=F64))
    assert factor == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    assert sc.LongRope(short, long, 4096).effective_attention_factor() == 1.0


def test_proportional_rotates_a_fraction_over_the_whole_head():
    inv, _ = sc.Proportional(0.25, 2.0).compute(16, 10000.0)
    want = default(16, 10000.0) / 2
    torch.testing.assert_close(inv[:2], want[:2])
    assert torch.equal(inv[2:], torch.zeros(6, dtype=F64))


def test_module_applies_attention_factor_and_schedule():
    yarn = sc.Yarn(4.0, 64)
    rope = posemb.RotaryEmbedding(32, scaling=yarn)
    q = torch.randn(1, 2, 5, 32, dtype=F64)
    out = rope.rotate(q)
    torch.testing.assert_close(
        out.norm(dim=-1), q.norm(dim=-1) * yarn.effective_attention_factor(), **TOL[F64]
    )
    inv, factor = yarn.compute(32, 10000.0)
    cos, sin = posemb.cos_sin(torch.arange(5), inv, F64)
    torch.testing.assert_close(out, posemb.apply_rope(q, cos * factor, sin * factor), **TOL[F64])


def test_module_recomputes_dynamic_schedule_per_call_without_state():
    schedule = sc.DynamicNTK(4.0, 64)
    rope = posemb.RotaryEmbedding(16, scaling=schedule)
    q = torch.randn(1, 1, 1, 16, dtype=F64)

    def expected(pos, seq_len):
        inv, _ = schedule.compute(16, 10000.0, seq_len)
        return posemb.apply_rope(q, *posemb.cos_sin(torch.tensor([pos]), inv, F64))

    # A long call first, then a shorter one still above the original length: the second must
    # use its own length (transformers' module would keep the longer one's frequencies).
    torch.testing.assert_close(rope.rotate(q, torch.tensor([999])), expected(999, 1000), **TOL[F64])
    torch.testing.assert_close(rope.rotate(q, torch.tensor([199])), expected(199, 200), **TOL[F64])
    torch.testing.assert_close(rope.rotate(q, torch.tensor([10])), expected(10, 11), **TOL[F64])
    assert not any(True for _ in rope.buffers())


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: sc.Linear(0.9), r"Linear.factor must be a finite number >= 1, got 0.9"),
        (lambda: sc.NTK(float("inf")), "NTK.factor must be a finite number"),
        (
            lambda: sc.DynamicNTK(2.0, 0),
            "DynamicNTK.original_max_position_embeddings must be a positive",
        ),
        (
            lambda: sc.Yarn(2.0, 4096, beta_fast=1.0, beta_slow=32.0),
            "Yarn.beta_fast must not be less than beta_slow",
        ),
        (lambda: sc.Yarn(0.5, 4096), "Yarn.factor must be a finite number >= 1"),
        (
            lambda: sc.Yarn(2.0, 4096, attention_factor=0.0),
            "Yarn.attention_factor must be a finite number > 0",
        ),
        (lambda: sc.Yarn(2.0, 4096, truncate="yes"), "Yarn.truncate must be true or false"),
        (
            lambda: sc.Llama3(8.0, 4.0, 2.0, 8192),
            "Llama3.low_freq_factor must not exceed high_freq_factor",
        ),
        (
            lambda: sc.Llama3(8.0, 0.0, 4.0, 8192),
            "Llama3.low_freq_factor must be a finite number > 0",
        ),
        (
            lambda: sc.LongRope((1.0, 2.0), (1.0,), 4096),
            "short_factor and long_factor must have the same length",
        ),
        (
            lambda: sc.LongRope((1.0, -2.0), (1.0, 1.0), 4096),
            r"LongRope.short_factor\[1\] must be a finite number > 0",
        ),
        (lambda: sc.LongRope("12", "12", 4096), "LongRope.short_factor must be a list of numbers"),
        (lambda: sc.LongRope((1.0,) * 3, (1.0,) * 3, 4096).compute(8, 1e4), "rotary_dim 8 needs 4"),
        (lambda: sc.Proportional(1.5), r"Proportional.partial_rotary_factor must be in \[0, 1\]"),
        (lambda: sc.NTK(2.0).compute(2, 1e4), "NTK needs an even rotary_dim >= 4"),
        (lambda: sc.Default().compute(7, 1e4), "even rotary_dim"),
    ],
)
def test_bad_schedules(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("factor", [1.0, 2.0, 4.0, 31.25])
def test_vllm_ntk_is_not_bloc97_ntk(factor):
    """vLLM's "ntk": theta'_i = (b s)^(-2i/d) / s^(2/d). It meets bloc97's form at the slowest
    pair (both divide it by s) and departs from it everywhere else, the fastest pair included."""
    d, b = 128, 10000.0
    got, attn = sc.VllmNTK(factor).compute(d, b)
    i = torch.arange(d // 2, dtype=torch.float64)
    want = (b * factor) ** (-2 * i / d) / factor ** (2 / d)
    torch.testing.assert_close(got, want, rtol=1e-15, atol=0)
    assert attn == 1.0
    bloc97, _ = sc.NTK(factor).compute(d, b)
    default, _ = sc.Default().compute(d, b)
    assert float(got[-1]) == pytest.approx(float(default[-1]) / factor, rel=1e-12)
    assert float(bloc97[-1]) == pytest.approx(float(default[-1]) / factor, rel=1e-12)
    assert float(got[0]) == pytest.approx(factor ** (-2 / d), rel=1e-15)
    assert float(bloc97[0]) == 1.0
    if factor > 1:
        assert float((got[:-1] - bloc97[:-1]).abs().min()) > 0
    with pytest.raises(ValueError, match=r"VllmNTK\.factor must be a finite number >= 1"):
        sc.VllmNTK(0.5)


def test_vllm_ntk_by_hand():
    """vLLM's steps done by hand at d = 4, b = 1e4, s = 4: base' = 4e4, inv = 1 / base'^(i/2)
    = [1, 0.005], divided by s^(2/d) = 2."""
    got, _ = sc.VllmNTK(4.0).compute(4, 10000.0)
    assert got.tolist() == pytest.approx([0.5, 0.0025], rel=1e-15)
    with pytest.raises(ValueError):
        sc.VllmNTK(0.5)


def test_one_cache_of_scaled_frequencies_serves_rope_and_mrope():
    import posemb

    sc_ = posemb.scaling.Yarn(4.0, 64)
    posemb.scaling._COMPUTED.clear()
    rope = posemb.RotaryEmbedding(32, base=1e4, scaling=sc_)
    rope.cos_sin(torch.arange(8))
    assert len(posemb.scaling._COMPUTED) == 1
    mrope = posemb.MRotaryEmbedding(32, base=1e4, mrope_section=[4, 6, 6], scaling=sc_)
    mrope.cos_sin(torch.zeros(3, 1, 8, dtype=torch.long))
    assert len(posemb.scaling._COMPUTED) == 1  # the same scaling, dim, base, device: one entry
    inv, factor = posemb.scaling.cached_compute(sc_, 32, 1e4, "cpu")
    assert torch.equal(inv, sc_.compute(32, 1e4)[0]) and factor == sc_.compute(32, 1e4)[1]
    # A length-dependent scaling keeps one entry per length that matters, never a stale one.
    dyn = posemb.scaling.DynamicNTK(2.0, 16)
    short = posemb.scaling.cached_compute(dyn, 32, 1e4, "cpu", 8)[0]
    long = posemb.scaling.cached_compute(dyn, 32, 1e4, "cpu", 64)[0]
    assert torch.equal(short, dyn.compute(32, 1e4, 8)[0])
    assert torch.equal(long, dyn.compute(32, 1e4, 64)[0]) and not torch.equal(short, long)
