"""Self-Extend, ReRoPE and Dual Chunk Attention written from issue 33's formulas, one (i, j)
pair at a time: the references test_extension.py and test_hf_extension.py hold posemb to. Never
derived from posemb's own code."""

from __future__ import annotations

from posemb.extension import ReRoPE, SelfExtend


def selfextend_distance(i: int, j: int, group: int, window: int) -> int:
    """Jin et al. 2024: neighbours keep i - j; farther pairs use grouped positions."""
    if i - j < window:
        return i - j
    return (i // group + window - window // group) - j // group


def rerope_distance(i: int, j: int, window: int, leak: float | None) -> float:
    """Su 2023: min(i - j, W); leaky: W + (i - j - W) / k beyond the window."""
    d = i - j
    if d < window:
        return d
    return window if leak is None else window + (d - window) / leak


def dca_distance(i: int, j: int, chunk_size: int, local_size: int) -> int:
    """An et al. 2024 as issue 33 states it: keys at j mod L; the query at i mod L in the key's
    chunk, min(i mod L + L, C) in the next, min(2L - 1, C) farther."""
    n = chunk_size - local_size
    if i // n == j // n:
        q = i % n
    elif i // n == j // n + 1:
        q = min(i % n + n, chunk_size)
    else:
        q = min(2 * n - 1, chunk_size)
    return q - j % n


def reference_distance(method, i: int, j: int) -> float:
    if isinstance(method, SelfExtend):
        return selfextend_distance(i, j, method.group, method.window)
    if isinstance(method, ReRoPE):
        return rerope_distance(i, j, method.window, method.leak)
    return dca_distance(i, j, method.chunk_size, method.local_size)
