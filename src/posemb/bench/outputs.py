"""Which files a bench's ``--out`` may replace: an earlier bench CSV of any kind (the
recogniser lives with the rows, :mod:`posemb.bench.rows`; this is its public name)."""

from __future__ import annotations

from .rows import is_bench_csv

__all__ = ["is_bench_csv"]
