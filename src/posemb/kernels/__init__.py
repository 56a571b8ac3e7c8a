"""Fused RoPE paths and the one entry point that picks among them.

Backends:

- ``"reference"``: :func:`posemb.kernels.reference.apply_rope`, plain PyTorch, any dtype and device.
- ``"cpu"``: the fused C++ loop of :mod:`posemb.kernels.cpu` (float32, bfloat16, float16).
- ``"triton"``: the kernel of :mod:`posemb.kernels.triton`, for CUDA tensors (or CPU tensors
  under ``TRITON_INTERPRET=1``, which is how the tests run it).
- ``"auto"``: the fastest that can run for the tensors at hand; float64 always takes the
  reference. When a fused path is unavailable, the reason is logged once.

The fused paths are registered PyTorch ops (:mod:`posemb.kernels.ops`,
:mod:`posemb.kernels.triton`): ``torch.ops.posemb.rotate_cpu`` / ``rotate_triton`` out of place,
with autograd whose backward is the same kernel rotating by -theta and which keeps nothing but
the tables, and ``rotate_cpu_`` / ``rotate_triton_`` in place. Each has a fake implementation,
so models using them compile with ``torch.compile(fullgraph=True)`` and export. ``inplace=True``
rotates q and k in their own memory (inference) and refuses tensors that require grad.

Where each part lives: the entry points and the checks every path shares in :mod:`.dispatch`;
the CPU path in :mod:`.ops` (its decode fast path in :mod:`.fast`); the Triton path's host side
in :mod:`.triton_path` (with its own decode fast path) and its kernel in :mod:`.triton`; QK-norm
with the rotation in :mod:`.norm`.

This package is the bottom layer of posemb: the pairing convention (:mod:`.layout`), the
reference rotation (:mod:`.reference`) and the fused ops; it imports nothing from the modules,
scalings or interop above it.
"""

from __future__ import annotations

import torch

from .. import _renamed
from . import cpu as _cpu
from . import ops as _ops  # noqa: F401  (registers the Python halves of the CPU ops)
from . import reference
from .dispatch import BACKENDS, resolve_backend, rotate, rotate_cached, triton_unavailable_reason
from .layout import Layout
from .norm import norm_rotate


def status() -> dict[str, str]:
    """Each backend and whether it can run here: ``"available"`` or why not.

    Builds the CPU kernel if it is not built yet, and imports triton (~3 s).
    """
    cpu_reason = _cpu.unavailable_reason()
    triton_reason = triton_unavailable_reason()
    if triton_reason is None and not torch.cuda.is_available():
        triton_reason = "no CUDA device here (tests run the kernel with TRITON_INTERPRET=1)"
    return {
        "reference": "available",
        "cpu": "available" if cpu_reason is None else cpu_reason,
        "triton": "available" if triton_reason is None else triton_reason,
    }


__all__ = [
    "BACKENDS",
    "Layout",
    "norm_rotate",
    "reference",
    "resolve_backend",
    "rotate",
    "rotate_cached",
    "status",
    "triton_unavailable_reason",
]

# rope_cached was the README's name before 0.2.
__getattr__ = _renamed.module_getattr(__name__, {"rope_cached": "rotate_cached"}, globals())
