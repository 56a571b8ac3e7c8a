import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posemb
from tolerances import TOL


def test_sinusoidal_table_is_vaswani_interleaved():
    d = 10
    table = posemb.sinusoidal_table(6, d, dtype=torch.float64)
    assert table.shape == (6, d)
    for p in range(6):
        for i in range(d // 2):
            w = 10000.0 ** (-2 * i / d)
            assert float(table[p, 2 * i]) == pytest.approx(math.sin(p * w), abs=1e-14)
            assert float(table[p, 2 * i + 1]) == pytest.approx(math.cos(p * w), abs=1e-14)


def test_sinusoidal_table_length_equals_positions():
    assert torch.equal(posemb.sinusoidal_table(9, 16), posemb.sinusoidal_table(torch.arange(9), 16))
    batch = posemb.sinusoidal_table(torch.tensor([[0, 1], [5, 6]]), 16)
    assert batch.shape == (2, 2, 16)
    assert torch.equal(batch[1], posemb.sinusoidal_table(torch.tensor([5, 6]), 16))
    assert posemb.sinusoidal_table(0, 4).shape == (0, 4)


@given(st.integers(0, 1 << 20), st.integers(-5000, 5000))
def test_sinusoidal_shift_is_a_fixed_linear_map(p, k):
    # PE(p + k) = M_k PE(p); on each (sin, cos) pair M_k = [[cos kw, sin kw], [-sin kw, cos kw]].
    d = 64
    w = posemb.inv_freq(d, dtype=torch.float64)
    c, s = torch.cos(k * w), torch.sin(k * w)
    pe = posemb.sinusoidal_table(torch.tensor([p]), d, dtype=torch.float64)[0]
    sin_p, cos_p = pe[0::2], pe[1::2]
    shifted = torch.stack((c * sin_p + s * cos_p, -s * sin_p + c * cos_p), -1).flatten()
    want = posemb.sinusoidal_table(torch.tensor([p + k]), d, dtype=torch.float64)[0]
    torch.testing.assert_close(shifted, want, atol=1e-9, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_sinusoidal_embedding_adds_table(dtype):
    emb = posemb.SinusoidalEmbedding(32)
    x = torch.randn(2, 5, 32, dtype=dtype)
    y = emb(x)
    assert y.dtype == dtype
    torch.testing.assert_close(y, x + posemb.sinusoidal_table(5, 32, dtype=dtype), **TOL[dtype])
    assert list(emb.parameters()) == []


def test_sinusoidal_embedding_positions_and_offset():
    emb = posemb.SinusoidalEmbedding(16)
    x = torch.zeros(2, 3, 16)
    pos = torch.tensor([[10, 11, 12], [0, 1, 2]])
    y = emb(x, pos)
    assert torch.equal(y[0], posemb.sinusoidal_table(torch.tensor([10, 11, 12]), 16))
    assert torch.equal(y[1], posemb.sinusoidal_table(3, 16))
    # Any length works: there is no table to run out of.
    assert emb(torch.zeros(1, 3, 16), torch.tensor([1 << 30, 1 << 30, 7])).isfinite().all()


def test_learned_init_std_and_shape():
    torch.manual_seed(0)
    emb = posemb.LearnedEmbedding(1024, 768)
    assert emb.weight.shape == (1024, 768)
    # 786k samples estimate the std to ~0.1%.
    assert float(emb.weight.detach().std()) == pytest.approx(0.02, rel=0.01)
    assert float(posemb.LearnedEmbedding(64, 8, init_std=0.0).weight.detach().abs().max()) == 0.0


def test_learned_adds_rows_and_trains_only_those():
    emb = posemb.LearnedEmbedding(8, 4)
    x = torch.randn(2, 3, 4)
    pos = torch.tensor([[5, 6, 7], [0, 1, 2]])
    y = emb(x, pos)
    torch.testing.assert_close(y, x + emb.weight[pos])
    y.sum().backward()
    assert torch.equal(emb.weight.grad[3:5], torch.zeros(2, 4))
    assert torch.equal(emb.weight.grad[[0, 1, 2, 5, 6, 7]], torch.full((6, 4), 1.0))


@pytest.mark.parametrize("bad", [8, 100, -1])
def test_learned_refuses_positions_outside_table(bad):
    emb = posemb.LearnedEmbedding(8, 4)
    with pytest.raises(
        ValueError, match=rf"position {bad} is outside \[0, 8\).*cannot extrapolate"
    ):
        emb(torch.zeros(1, 2, 4), torch.tensor([0, bad]))


def test_learned_refuses_default_positions_past_max_len():
    with pytest.raises(ValueError, match="position 8 is outside"):
        posemb.LearnedEmbedding(8, 4)(torch.zeros(1, 9, 4))


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: posemb.LearnedEmbedding(0, 4), "max_len must be a positive integer"),
        (
            lambda: posemb.LearnedEmbedding(4, 4, init_std=-1),
            "init_std must be a finite number >= 0",
        ),
        (lambda: posemb.SinusoidalEmbedding(5), "dim must be even"),
        (lambda: posemb.SinusoidalEmbedding(4, base=0.5), "base must be finite"),
        (
            lambda: posemb.SinusoidalEmbedding(4)(torch.zeros(2, 3, 6)),
            r"x must have shape \(batch, seq, 4\)",
        ),
        (lambda: posemb.SinusoidalEmbedding(4)(torch.zeros(3, 4)), r"x must have shape"),
        (
            lambda: posemb.SinusoidalEmbedding(4)(torch.zeros(2, 3, 4, dtype=torch.long)),
            "x must have a floating dtype",
        ),
        (
            lambda: posemb.SinusoidalEmbedding(4)(torch.zeros(2, 3, 4), torch.arange(4)),
            r"positions must have shape \(3,\) or \(2, 3\)",
        ),
        (
            lambda: posemb.SinusoidalEmbedding(4)(torch.zeros(2, 3, 4), torch.zeros(3)),
            "integer dtype",
        ),
        (
            lambda: posemb.LearnedEmbedding(8, 4)(
                torch.zeros(2, 3, 4), torch.zeros(3, 3, dtype=torch.long)
            ),
            "positions must have shape",
        ),
        (lambda: posemb.sinusoidal_table(-1, 4), "positions_or_length must be a length >= 0"),
        (
            lambda: posemb.sinusoidal_table(torch.tensor([0.5]), 4),
            "positions_or_length must have an integer dtype",
        ),
    ],
)
def test_absolute_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
