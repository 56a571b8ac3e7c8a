"""Benchmarks: posemb's kernels against bandwidth references and other libraries."""
