"""The in-place overlap check against brute force over random strided views (issue 30, item 5)."""

import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posemb.kernels import overlap

BUFFER = 400


def _elements(offset, dims, width):
    """Every element offset of a view, with repeats (brute force)."""
    out = []
    for idx in itertools.product(*(range(n) for n, _ in dims)):
        start = offset + sum(i * s for i, (_, s) in zip(idx, dims, strict=True))
        out.extend(range(start, start + width))
    return out


view = st.tuples(
    st.integers(0, 60),  # storage offset
    st.lists(st.tuples(st.integers(1, 4), st.integers(0, 40)), min_size=3, max_size=3),
)


@given(
    width=st.integers(1, 6),
    a=view,
    b=view,
    alike=st.lists(st.booleans(), min_size=3, max_size=3),
)
def test_written_apart_refuses_exactly_what_brute_force_finds(width, a, b, alike):
    # q and k as (d0, d1, d2, width) views of one buffer; k's sizes may differ from q's in
    # any dimension (the kernels check that batch and seq agree, not this). ``alike`` gives k
    # some of q's dimensions, as views of one packed buffer have, to reach the fast paths.
    b = (b[0], [da if same else db for da, db, same in zip(a[1], b[1], alike, strict=True)])
    buf = torch.zeros(BUFFER)
    views = []
    for offset, dims in (a, b):
        if _elements(offset, dims, width) and max(_elements(offset, dims, width)) >= BUFFER:
            return
        sizes = [n for n, _ in dims] + [width]
        strides = [s for _, s in dims] + [1]
        views.append((buf.as_strided(sizes, strides, offset), _elements(offset, dims, width)))
    (q, eq), (k, ek) = views
    clash = len(set(eq)) < len(eq) or len(set(ek)) < len(ek) or bool(set(eq) & set(ek))
    if clash:
        with pytest.raises(ValueError, match="inplace=True writes"):
            overlap.written_apart(q, k)
    else:
        overlap.written_apart(q, k)


@pytest.mark.parametrize("seq", [1, 7])
@pytest.mark.parametrize("heads_first", [False, True])
def test_packed_projections_are_decided_from_strides(monkeypatch, seq, heads_first):
    # A packed QKV buffer (seq- or heads-first) must not need every row compared: that
    # took 16-23 ms at seq 4,096, as long as the rotation.
    seen = []
    real = overlap._starts
    monkeypatch.setattr(overlap, "_starts", lambda o, d: seen.append(d) or real(o, d))
    shape = (2, 48, seq, 16) if heads_first else (2, seq, 48, 16)
    qkv = torch.randn(shape)
    if not heads_first:
        qkv = qkv.transpose(1, 2)
    overlap.written_apart(qkv[:, :32], qkv[:, 32:40])
    assert all(len(d) <= 1 for d in seen), seen  # at most the heads' rows
    with pytest.raises(ValueError, match="share elements"):
        overlap.written_apart(qkv[:, :33], qkv[:, 32:40])
