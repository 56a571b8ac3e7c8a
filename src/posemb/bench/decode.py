"""Decode-step benchmark (``posemb bench --decode``): the rotation at one token per step, where
Python around the op costs more than the op, against transformers in the same run.

Llama 3.1 8B's attention shapes (32 q heads, 8 kv heads of 128, theta 500000), one token at
position ~1000 of a KV-cache decode, batch 1 and 8:

* ``layer``: one layer's rotation, every method handed what it gets inside a model:
  transformers' ``apply_rotary_pos_emb`` with its tables formed (the reference), posemb's
  module with the step's positions, ``kernels.rotate`` with tables formed, and the rotation
  ``patch_rotary(model, fused=True)`` puts in transformers' attention (transformers' tables);
* ``step``: a 32-layer step, positions advancing each step so no step reuses another's
  tables: transformers forms its tables once (``LlamaRotaryEmbedding``) and applies them 32
  times; posemb as one module shared by the layers, as a module per layer, and as the fused
  patch (transformers' tables, posemb's op);
* ``model``: a small ``LlamaForCausalLM`` (4 layers, width 1024) decoding one token against a
  256-token cache, eager against ``patch_rotary(model, fused=True)``, with a second eager copy
  of the same model as a control: its ratio is the noise of the measurement;
* ``qwen3``: the same with a ``Qwen3ForCausalLM``, whose q and k norms the patch fuses into the
  rotation (:func:`posemb.kernels.norm_rotate`).

``layer`` calls each method with one step's positions again and again, as a model's layers do:
what it times is every layer but a step's first. ``step`` includes the first.

Each sample times ``calls`` calls; methods run in rounds, one sample of each per round, and
``vs_transformers`` is the median over rounds of (transformers' sample / the method's), so a
noisy neighbour slows both sides of each ratio alike: above 1 the method is faster.
"""

from __future__ import annotations

import copy
import inspect
import statistics
from collections.abc import Callable
from typing import Any

import torch

from .. import kernels
from .._errors import InputError
from .._extras import require
from ..kernels.layout import Layout
from ..rope import RotaryEmbedding
from .kernels import bench_device, describe_machine, machine
from .rows import DecodeRow
from .timing import rounds

LAYERS = 32
HEADS, KV_HEADS, HEAD_DIM, THETA = 32, 8, 128, 500000.0
POSITION = 1000
PREFILL = 256
BATCHES = (1, 8)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
REFERENCE = "transformers"
CONTROL = "transformers, a second copy"


def _layer(q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor) -> dict[str, Callable]:
    """One layer's rotation, each method with what a model hands it."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    from ..hf.fused import fused_rotation

    hf_rope = LlamaRotaryEmbedding(_config(LlamaConfig)).to(q.device)
    hf_cos, hf_sin = hf_rope(q, pos)
    rope = RotaryEmbedding(HEAD_DIM, base=THETA)
    cos, sin = rope.cos_sin(pos, device=q.device)
    fused = fused_rotation(Layout.HALF)
    return {
        REFERENCE: lambda: apply_rotary_pos_emb(q, k, hf_cos, hf_sin),
        "posemb module": lambda: rope(q, k, pos),
        "posemb kernels.rotate": lambda: kernels.rotate(q, k, cos, sin),
        "patch_rotary fused": lambda: fused(q, k, hf_cos, hf_sin),
    }


def _step(q: torch.Tensor, k: torch.Tensor) -> dict[str, Callable]:
    """A 32-layer step whose positions advance every call (no step's tables reused)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    from ..hf.fused import fused_rotation

    hf_rope = LlamaRotaryEmbedding(_config(LlamaConfig)).to(q.device)
    shared = RotaryEmbedding(HEAD_DIM, base=THETA)
    per_layer = [RotaryEmbedding(HEAD_DIM, base=THETA) for _ in range(LAYERS)]
    fused = fused_rotation(Layout.HALF)
    counter = [POSITION]

    def positions() -> torch.Tensor:
        counter[0] += 1
        return torch.full((q.shape[0], 1), counter[0], device=q.device)

    def hf_step() -> object:
        cos, sin = hf_rope(q, positions())
        return [apply_rotary_pos_emb(q, k, cos, sin) for _ in range(LAYERS)]

    def fused_step() -> object:
        cos, sin = hf_rope(q, positions())
        return [fused(q, k, cos, sin) for _ in range(LAYERS)]

    def shared_step() -> object:
        pos = positions()
        return [shared(q, k, pos) for _ in range(LAYERS)]

    def per_layer_step() -> object:
        pos = positions()
        return [m(q, k, pos) for m in per_layer]

    return {
        REFERENCE: hf_step,
        "posemb module, shared": shared_step,
        "posemb module per layer": per_layer_step,
        "patch_rotary fused": fused_step,
    }


def _config(config_cls: Any) -> Any:
    return config_cls(
        hidden_size=HEADS * HEAD_DIM,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        rope_parameters={"rope_type": "default", "rope_theta": THETA},
    )


def _model(
    batch: int, dtype: torch.dtype, device: torch.device, quick: bool, family: str = "llama"
) -> dict[str, Callable]:
    """A small Llama (or Qwen3, whose q and k norms the patch fuses too) decoding one token
    against a cache of :data:`PREFILL` tokens, cropped back after each step so every step sees
    the same length."""
    import transformers
    from transformers import DynamicCache

    from ..hf import patch_rotary

    width, heads = (128, 4) if quick else (1024, 16)
    name = {"llama": "Llama", "qwen3": "Qwen3"}[family]
    config_cls: Any = getattr(transformers, f"{name}Config")
    config = config_cls(
        vocab_size=8192, hidden_size=width, intermediate_size=width * 11 // 4,
        num_hidden_layers=2 if quick else 4, num_attention_heads=heads,
        num_key_value_heads=heads // 4, head_dim=width // heads,
        rope_parameters={"rope_type": "default", "rope_theta": THETA},
        attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    model_cls: Any = getattr(transformers, f"{name}ForCausalLM")
    base = model_cls(config).to(device, dtype).eval()
    # Every method its own copy of one model, and a second unpatched copy: the spread between
    # two identical models is the noise a ratio here should be read against.
    eager, control, fused = (copy.deepcopy(base) for _ in range(3))
    patch_rotary(fused, fused=True)
    prompt = torch.randint(0, 8192, (batch, PREFILL), device=device)
    token = prompt[:, -1:]
    # transformers 5.24 renamed past_key_values to cache (the old name warns).
    cache_arg = "cache" if "cache" in inspect.signature(eager.forward).parameters else None
    steps = {}
    for name, model in ((REFERENCE, eager), (CONTROL, control), ("patch_rotary fused", fused)):
        cache = DynamicCache(config=config)
        with torch.no_grad():
            model(prompt, use_cache=True, **{cache_arg or "past_key_values": cache})

        def step(model=model, cache=cache) -> object:
            with torch.no_grad():
                out = model(token, use_cache=True, **{cache_arg or "past_key_values": cache})
            _crop(cache, PREFILL)
            return out

        steps[name] = step
    return steps


def _crop(cache: Any, length: int) -> None:
    """Cut the cache back to ``length`` tokens (crop's argument became a count to remove,
    negative, in transformers 5.x; before, it was the length to keep)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        try:
            cache.crop(-extra)
        except ValueError:
            cache.crop(length)


def run(
    device: str = "cpu",
    quick: bool = False,
    repeats: int | None = None,
    dtype: str = "fp32",
    progress: Callable[[str], None] | None = None,
) -> list[DecodeRow]:
    """Time each part at batch 1 and 8 (see the module docstring).

    Args:
        device: "cpu" or "cuda".
        quick: small shapes, 3 rounds: proves the harness works (CI), measures nothing.
        repeats: rounds per part (default 200 for ``layer``, 60 for ``step``, 40 for each model).
        dtype: "fp32" or "bf16", of q, k and the model.
        progress: called with a line per measurement.
    """
    require("transformers", "posemb bench --decode")
    if dtype not in DTYPES:
        raise InputError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    dev = bench_device(device)
    if dev.type == "cpu":
        kernels.cpu.load()
    meta = machine(dev)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    rows: list[DecodeRow] = []
    for batch in BATCHES:
        g = torch.Generator().manual_seed(batch)
        q = torch.randn(batch, HEADS, 1, HEAD_DIM, generator=g).to(dev, DTYPES[dtype])
        k = torch.randn(batch, KV_HEADS, 1, HEAD_DIM, generator=g).to(dev, DTYPES[dtype])
        pos = torch.full((batch, 1), POSITION, device=dev)
        parts = {
            "layer": (_layer(q, k, pos), LAYERS, 200),
            "step": (_step(q, k), 1, 60),
            "model": (_model(batch, DTYPES[dtype], dev, quick), 1, 40),
            "qwen3": (_model(batch, DTYPES[dtype], dev, quick, "qwen3"), 1, 40),
        }
        for part, (methods, calls, default) in parts.items():
            reps = repeats or (3 if quick else default)
            host: dict[str, list[float]] = {}
            with torch.no_grad():
                times = rounds(_repeated(methods, calls), reps, sync, host)
            rows += _rows(part, batch, dtype, calls, times, host, meta, progress)
    return rows


def _repeated(methods: dict[str, Callable], calls: int) -> dict[str, Callable]:
    def many(f: Callable) -> Callable:
        def go() -> None:
            for _ in range(calls):
                f()

        return go

    return {name: many(f) for name, f in methods.items()}


def _rows(part, batch, dtype, calls, times, host, meta, progress) -> list[DecodeRow]:
    reference = times[REFERENCE]
    rows = []
    for method, ts in times.items():
        per = [1e3 * t / calls for t in ts]  # ms per sample -> us per call
        med = statistics.median(per)
        qs = statistics.quantiles(per, n=5) if len(per) > 1 else [med] * 4
        ratio = statistics.median(r / t for r, t in zip(reference, ts, strict=True) if t > 0)
        host_us = statistics.median(1e3 * t / calls for t in host[method])
        rows.append(DecodeRow(part, batch, dtype, method, med, qs[0], qs[-1], ratio, calls,
                              host_us, **meta))  # fmt: skip
        if progress:
            progress(f"{part:6} b{batch:<2} {method:26} {med:9.1f} us  {ratio:5.2f}x  "
                     f"host {host_us:.1f} us")  # fmt: skip
    return rows


def summary(rows: list[DecodeRow]) -> str:
    """A one-screen table: per part and batch, each method's time and ratio to transformers."""
    if not rows:
        return "no measurements"
    r0 = rows[0]
    lines = [
        f"posemb bench --decode: Llama 3.1 8B attention shapes ({HEADS}/{KV_HEADS} heads of "
        f"{HEAD_DIM}), {r0.dtype}, {describe_machine(r0)}",
        f"{'part':6} {'batch':>5} {'method':26} {'median us':>10} {'p20-p80 us':>15} "
        f"{'vs transformers':>15} {'host us':>8}",
    ]
    for r in rows:
        spread = f"{r.p20_us:.1f}-{r.p80_us:.1f}"
        ratio = "-" if r.vs_transformers is None else f"{r.vs_transformers:.2f}x"
        lines.append(
            f"{r.part:6} {r.batch:5} {r.method:26} {r.median_us:10.1f} {spread:>15} {ratio:>15} "
            f"{r.host_us:8.1f}"
        )
    lines.append(
        "vs transformers: the median over rounds of its time over the method's (>1: faster); "
        "host us: until the call returned, before the device finished (on the CPU, the same)"
    )
    return "\n".join(lines)


__all__ = ["BATCHES", "DecodeRow", "run", "summary"]
