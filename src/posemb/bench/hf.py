"""What a ``transformers`` user gains end to end: posemb inside a Llama, against the model as
it ships, in the same run.

Three parts, each timed forward (no grad) and forward+backward (a training step without the
optimizer):

* ``decoder layer``: one ``LlamaDecoderLayer`` on hidden states ``(batch, seq, width)``, with
  the cos/sin tables its model would hand it;
* ``model``: a small full ``LlamaForCausalLM`` (``layers`` decoder layers and the LM head) on
  token ids, the loss against the ids themselves;
* ``rotation``: the rotation alone at one layer's q and k shapes, the way each method calls it
  (transformers' ``apply_rotary_pos_emb``, or posemb's op), times the number of layers: the
  rotation's share of a step is this over the step.

Methods: ``eager`` (unpatched), ``patch_rotary`` (posemb's exact tables, transformers'
rotation), ``patch_rotary fused`` (posemb's tables and op) and, where Liger-Kernel is installed
on a CUDA machine, ``liger`` (its rotation patched into ``modeling_llama``, which is
process-wide, and undone after). Every method times its own deep copy of one model, so the
weights are the same. Steps are timed in rounds, one step of each method per round, so a
noisy neighbour slows all of them alike.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .._errors import InputError
from .._extras import require
from .kernels import bench_device, describe_machine, machine
from .rows import HFRow
from .timing import rounds

PARTS = ("decoder layer", "model", "rotation")
METHODS = ("eager", "patch_rotary", "patch_rotary fused", "liger")


@dataclass(frozen=True)
class Setup:
    """The model measured: a Llama 3 shape scaled down to run on a laptop CPU."""

    layers: int = 4
    width: int = 1024
    heads: int = 16
    kv_heads: int = 4
    intermediate: int = 2816
    vocab: int = 8192
    batch: int = 2
    seq: int = 2048

    @property
    def head_dim(self) -> int:
        return self.width // self.heads


QUICK = Setup(layers=2, width=128, heads=4, kv_heads=2, intermediate=256, vocab=512, seq=64)


def _config(setup: Setup) -> Any:
    from transformers import LlamaConfig

    config_cls: Any = LlamaConfig  # its keyword arguments are not all in the stubs

    return config_cls(
        vocab_size=setup.vocab,
        hidden_size=setup.width,
        intermediate_size=setup.intermediate,
        num_hidden_layers=setup.layers,
        num_attention_heads=setup.heads,
        num_key_value_heads=setup.kv_heads,
        max_position_embeddings=131072,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        attn_implementation="sdpa",
    )


@contextlib.contextmanager
def _liger(model: nn.Module) -> Iterator[None]:
    """Liger-Kernel's rotation in ``modeling_llama`` while the block runs, then the original."""
    from liger_kernel.transformers import apply_liger_kernel_to_llama
    from transformers.models.llama import modeling_llama

    saved = modeling_llama.apply_rotary_pos_emb
    apply_liger_kernel_to_llama(
        rope=True,
        rms_norm=False,
        swiglu=False,
        cross_entropy=False,
        fused_linear_cross_entropy=False,
    )
    try:
        yield
    finally:
        modeling_llama.apply_rotary_pos_emb = saved


def _available(device: torch.device) -> list[str]:
    methods = ["eager", "patch_rotary", "patch_rotary fused"]
    if device.type == "cuda":
        try:
            import liger_kernel.transformers  # noqa: F401

            methods.append("liger")
        except ImportError:
            pass
    return methods


def _models(base: nn.Module, methods: list[str]) -> dict[str, tuple[nn.Module, Any]]:
    """A deep copy of ``base`` per method, patched as the method says, with a factory of the
    context its steps run in: a fresh one per step (a ``@contextmanager`` object can be entered
    once, so one made per method crashed the second round on CUDA)."""
    from ..hf import patch_rotary

    out = {}
    for method in methods:
        model = copy.deepcopy(base)
        if method == "patch_rotary":
            patch_rotary(model)
        elif method == "patch_rotary fused":
            patch_rotary(model, fused=True)
        ctx = functools.partial(_liger, model) if method == "liger" else contextlib.nullcontext
        out[method] = (model, ctx)
    return out


def _layer_steps(models, setup, dtype, device) -> dict[str, tuple[Callable, Callable]]:
    """One decoder layer per method, on hidden states and its model's tables."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(setup.batch, setup.seq, setup.width, generator=g).to(device, dtype)
    pos = torch.arange(setup.seq, device=device).expand(setup.batch, -1)
    grad = torch.randn(x.shape, generator=g).to(device, dtype)
    steps = {}
    for method, (model, ctx) in models.items():
        inner = model.model
        layer = inner.layers[0]
        with torch.no_grad():
            tables = inner.rotary_emb(x, pos)

        def forward(layer=layer, tables=tables, ctx=ctx):
            with ctx(), torch.no_grad():
                return layer(x, position_embeddings=tables, position_ids=pos)

        def both(layer=layer, tables=tables, ctx=ctx):
            xg = x.detach().requires_grad_()
            with ctx():
                out = layer(xg, position_embeddings=tables, position_ids=pos)
                out = out[0] if isinstance(out, tuple) else out
                out.backward(grad)
            layer.zero_grad(set_to_none=True)

        steps[method] = (forward, both)
    return steps


def _model_steps(models, setup, device) -> dict[str, tuple[Callable, Callable]]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, setup.vocab, (setup.batch, setup.seq), generator=g).to(device)
    steps = {}
    for method, (model, ctx) in models.items():

        def forward(model=model, ctx=ctx):
            with ctx(), torch.no_grad():
                return model(input_ids=ids).logits

        def both(model=model, ctx=ctx):
            with ctx():
                model(input_ids=ids, labels=ids).loss.backward()
            model.zero_grad(set_to_none=True)

        steps[method] = (forward, both)
    return steps


def _rotation_steps(models, setup, dtype, device) -> dict[str, tuple[Callable, Callable]]:
    """The rotation alone, as each method's attention calls it, times the layer count."""
    from transformers.models.llama import modeling_llama

    from ..hf.fused import fused_rotation
    from ..kernels import Layout

    g = torch.Generator().manual_seed(2)
    shape = (setup.batch, setup.seq, setup.head_dim)
    q = torch.randn(shape[0], setup.heads, *shape[1:], generator=g).to(device, dtype)
    k = torch.randn(shape[0], setup.kv_heads, *shape[1:], generator=g).to(device, dtype)
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    steps = {}
    fused = fused_rotation(Layout.HALF)
    for method, (model, ctx) in models.items():
        pos = torch.arange(setup.seq, device=device).expand(setup.batch, -1)
        with torch.no_grad():
            cos, sin = model.model.rotary_emb(q, pos)

        def rotate(a, b, method=method, cos=cos, sin=sin):
            fn = fused if method == "patch_rotary fused" else modeling_llama.apply_rotary_pos_emb
            return fn(a, b, cos, sin)

        def forward(rotate=rotate, ctx=ctx):
            with ctx(), torch.no_grad():
                for _ in range(setup.layers):
                    rotate(q, k)

        def both(rotate=rotate, ctx=ctx):
            with ctx():
                for _ in range(setup.layers):
                    qg, kg = q.detach().requires_grad_(), k.detach().requires_grad_()
                    torch.autograd.backward(rotate(qg, kg), (gq, gk))

        steps[method] = (forward, both)
    return steps


def run(
    device: str = "cpu",
    quick: bool = False,
    repeats: int | None = None,
    dtype: str = "fp32",
    progress: Callable[[str], None] | None = None,
) -> list[HFRow]:
    """Time the decoder layer, the small model and the rotation alone for every method.

    Args:
        device: "cpu" or "cuda".
        quick: a tiny model and 2 repeats: proves the harness works (CI), measures nothing.
        repeats: timed rounds per part and mode (default 5; 3 for the model on CPU).
        dtype: "fp32" or "bf16" (parameters and activations).
        progress: called with a line per measurement.
    """
    require("transformers", "posemb bench --hf")

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    if dtype not in dtypes:
        raise InputError(f"dtype must be one of {', '.join(dtypes)}, got {dtype!r}")
    dev = bench_device(device)
    setup = QUICK if quick else Setup()
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model_cls: Any = LlamaForCausalLM  # its decorated .to() confuses the type stubs
    base = model_cls(_config(setup)).to(dev, dtypes[dtype]).train()
    models = _models(base, _available(dev))
    del base

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    meta = {
        "setup": f"{setup.layers}L w{setup.width} h{setup.heads}/{setup.kv_heads} "
        f"b{setup.batch}x{setup.seq}",
        "dtype": dtype,
        **machine(dev),
    }
    parts = {
        "rotation": _rotation_steps(models, setup, dtypes[dtype], dev),
        "decoder layer": _layer_steps(models, setup, dtypes[dtype], dev),
        "model": _model_steps(models, setup, dev),
    }
    reps = repeats or (2 if quick else 5)
    rows: list[HFRow] = []
    for part, steps in parts.items():
        n = reps if (part != "model" or quick or dev.type == "cuda" or repeats) else 3
        for mode, index in (("forward", 0), ("forward+backward", 1)):
            times = rounds({m: s[index] for m, s in steps.items()}, n, sync)
            rows += _rows(part, mode, times, meta, progress)
    _shares(rows, setup)
    return rows


def _rows(part, mode, times, meta, progress) -> list[HFRow]:
    rows = []
    eager = statistics.median(times["eager"])
    for method, ts in times.items():
        med = statistics.median(ts)
        q = statistics.quantiles(ts, n=5) if len(ts) > 1 else [med] * 4
        rows.append(HFRow(part, mode, method, med, q[0], q[-1], eager / med, None, **meta))
        if progress:
            progress(f"{part:14} {mode:16} {method:20} {med:10.1f} ms")
    return rows


def _shares(rows: list[HFRow], setup: Setup) -> None:
    """The rotation's share: its time over the step's; a decoder layer has one rotation, the
    model ``layers`` of them (the rotation rows hold ``layers`` rotations)."""
    rotation = {(r.mode, r.method): r.median_ms for r in rows if r.part == "rotation"}
    for r in rows:
        if r.part == "rotation" or (r.mode, r.method) not in rotation:
            continue
        per = rotation[(r.mode, r.method)] / (1 if r.part == "model" else setup.layers)
        r.rotation_share = per / r.median_ms if r.median_ms > 0 else None


def summary(rows: list[HFRow]) -> str:
    """A one-screen table: per part and mode, each method's time, speed-up and rotation share."""
    if not rows:
        return "no measurements"
    r0 = rows[0]
    lines = [
        f"posemb bench --hf: Llama {r0.setup}, {r0.dtype}, {describe_machine(r0)}",
        f"{'part':14} {'mode':16} {'method':20} {'median ms':>10} {'p20-p80 ms':>17} "
        f"{'vs eager':>9} {'rotation share':>14}",
    ]
    for r in rows:
        share = "-" if r.rotation_share is None else f"{100 * r.rotation_share:.1f}%"
        spread = f"{r.p20_ms:.1f}-{r.p80_ms:.1f}"
        lines.append(
            f"{r.part:14} {r.mode:16} {r.method:20} {r.median_ms:10.1f} {spread:>17} "
            f"{r.vs_eager:8.2f}x {share:>14}"
        )
    return "\n".join(lines)


def __getattr__(name: str) -> object:
    # is_bench_csv moved to posemb.bench.outputs (its code to posemb.bench.rows, below
    # every bench, which this module imports anyway).
    if name == "is_bench_csv":
        import warnings

        warnings.warn(
            "posemb.bench.hf.is_bench_csv is moved to posemb.bench.outputs.is_bench_csv",
            DeprecationWarning,
            stacklevel=2,
        )
        from .rows import is_bench_csv

        return is_bench_csv
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["METHODS", "PARTS", "HFRow", "Setup", "run", "summary"]
