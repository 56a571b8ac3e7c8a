"""What a training-free extension costs against plain RoPE attention, measured in one run.

For each method and length, ``posemb.extended_attention`` (q and k unrotated) is timed in
alternation with the plain path a model runs: RoPE on q and k, then
``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``. The ratio is the median
of the per-pair ratios (the machines are shared and noisy; pairs see the same state).

Usage: python benchmarks/extension.py [--lengths 512 2048] [--repeats 5] [--threads N]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

import posemb


def _once(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from posemb.bench.kernels import cpu_model

    print(
        f"extended_attention vs RoPE + SDPA (causal), float32, batch 1, 8 q heads / 2 kv heads, "
        f"head_dim 64; {cpu_model()}, {torch.get_num_threads()} threads, torch "
        f"{torch.__version__}, Python {platform.python_version()}"
    )
    rope = posemb.RotaryEmbedding(64)
    methods = {
        "selfextend": posemb.SelfExtend(group=8, window=128),
        "rerope": posemb.ReRoPE(window=128),
        "leaky rerope": posemb.ReRoPE(window=128, leak=16.0),
        "dca": posemb.DualChunk(chunk_size=256, local_size=32),
    }
    for n in args.lengths:
        torch.manual_seed(0)
        q, k, v = torch.randn(1, 8, n, 64), torch.randn(1, 2, n, 64), torch.randn(1, 2, n, 64)

        def plain(q=q, k=k, v=v):
            qr, kr = rope(q, k)
            kr, vv = kr.repeat_interleave(4, 1), v.repeat_interleave(4, 1)
            return torch.nn.functional.scaled_dot_product_attention(qr, kr, vv, is_causal=True)

        with torch.no_grad():
            plain()
            base = statistics.median(_once(plain) for _ in range(args.repeats))
            for name, method in methods.items():

                def ext(method=method, q=q, k=k, v=v):
                    return posemb.extended_attention(q, k, v, rope, method)

                ext()
                ratios, times = [], []
                for _ in range(args.repeats):
                    r, t = _once(plain), _once(ext)
                    ratios.append(t / r)
                    times.append(t)
                print(
                    f"  L={n:5d} {name:13s} {1e3 * statistics.median(times):9.1f} ms   "
                    f"plain {1e3 * base:7.1f} ms   ratio {statistics.median(ratios):5.1f}x"
                )


if __name__ == "__main__":
    main()
