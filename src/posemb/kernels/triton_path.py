"""The Triton path's host side: what :func:`posemb.kernels.rotate` and
:func:`~posemb.kernels.rotate_cached` do once they have picked the Triton kernel, and the
decode fast path that keeps a CUDA call's host time to a few microseconds.

A decode step on a GPU launches one rotation per layer for a few tokens: the kernel takes
microseconds and the host work around it is the step's cost (on one H200, a call through the
registered op took 137 us against transformers' 107 us for its five small kernels). So:

- the checks run once per signature (shapes, strides, dtypes, device, ``requires_grad``, grad
  mode, layout) and are remembered, as the CPU path's are (:mod:`posemb.kernels.fast`); a call
  with the signature of the last one that passed goes straight to :func:`eager`;
- where nothing traces and nothing needs a gradient, the kernel is launched directly, not
  through the registered op's dispatcher, autograd wrapper and ``wrap_triton``;
- nothing reads a tensor's values on the host (no ``.item()``, ``.tolist()``, ``.cpu()``), so
  a call never waits for the GPU and can be captured in a CUDA graph.

Importing :mod:`posemb.kernels.triton` (and triton) is deferred to the first call here.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd import forward_ad as _forward_ad

from .. import _checks
from .layout import Layout
from .ops import plain_eager

Signature = tuple[object, ...]

_last: Signature | None = None
_plan: tuple[Signature, Any] | None = None  # (signature, its triton.Plan or None)


def plain(q: object, k: object) -> bool:
    """CUDA tensors that nothing traces and nothing differentiates (see
    :func:`posemb.kernels.fast.plain`, its CPU twin)."""
    return (
        type(q) is torch.Tensor
        and type(k) is torch.Tensor
        and q.is_cuda
        and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad))
        and _forward_ad._current_level < 0
        and not _checks.tracing()
    )


def _tensor(t: torch.Tensor) -> Signature:
    return (t.shape, t.stride(), t.dtype, t.device, t.requires_grad)


def unflagged(*tensors: torch.Tensor) -> bool:
    """No tensor carries the negative or conjugate bit: a kernel launched directly reads
    memory, and such a view's memory is not its values (the registered ops go through the
    dispatcher, which resolves the bits first)."""
    for t in tensors:  # noqa: SIM110 (a loop, not any() of a generator: every decode step)
        if t.is_neg() or t.is_conj():
            return False
    return True


def signature(
    q: torch.Tensor, k: torch.Tensor, cos: object, sin: object, layout: object
) -> Signature | None:
    """What the checks of a :func:`posemb.kernels.rotate` call read (None if a table is no
    tensor): every tensor's shape, strides, dtype, device and ``requires_grad``, the layout
    and the grad mode."""
    if type(cos) is not torch.Tensor or type(sin) is not torch.Tensor:
        return None
    if not unflagged(q, k, cos, sin):  # never remembered: the direct launch would misread it
        return None
    return (_tensor(q), _tensor(k), _tensor(cos), _tensor(sin), layout, torch.is_grad_enabled())


def norm_signature(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: object,
    sin: object,
    q_weight: object,
    k_weight: object,
    eps: object,
    weight_offset: object,
    layout: object,
) -> Signature | None:
    """What the checks of a :func:`posemb.kernels.norm_rotate` call read: the rotation's
    signature, the weights' (shape, strides, dtype, device, ``requires_grad``) and eps and
    the offset by type and value (a NaN never equals itself, so it is always checked)."""
    if type(eps) not in (int, float) or type(weight_offset) not in (int, float):
        return None  # a tensor's == would read it; the full path refuses or converts it
    sig = signature(q, k, cos, sin, layout)
    if sig is None or type(q_weight) is not torch.Tensor or type(k_weight) is not torch.Tensor:
        return None
    if not unflagged(q_weight, k_weight):
        return None
    return (sig, _tensor(q_weight), _tensor(k_weight), type(eps), eps,
            type(weight_offset), weight_offset)  # fmt: skip


_last_norm: Signature | None = None


def remember_norm(sig: Signature | None) -> None:
    """Record the signature of a norm_rotate call that passed every check and took
    :func:`posemb.kernels.triton_norm.eager`."""
    global _last_norm
    if sig is not None and not _checks.tracing():
        _last_norm = sig


def known_norm(sig: Signature | None) -> bool:
    """Whether ``sig`` is that of the last norm_rotate call that passed every check."""
    return sig is not None and sig == _last_norm


def remember(sig: Signature | None) -> None:
    """Record the signature of a call that passed every check and took the Triton kernel."""
    global _last
    if sig is not None and not _checks.tracing():
        _last = sig


def known(sig: Signature | None) -> bool:
    """Whether ``sig`` is that of the last call that passed every check."""
    return sig is not None and sig == _last


def forget() -> None:
    """Drop the remembered signatures and plan (tests)."""
    global _last, _plan, _last_norm
    _last = _plan = _last_norm = None


def rows(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Tables as the kernel reads them: ``(rows, n)`` views where they can be, with unit stride
    in n and one row stride for both, in their own float dtype (the kernel converts each
    value to float32 as it loads it: no cast kernel per call, as transformers' bf16 tables
    needed before)."""
    n = cos.shape[-1]
    c, s = cos.reshape(-1, n), sin.reshape(-1, n)
    if c.stride(-1) != 1 or s.stride(-1) != 1 or c.stride(0) != s.stride(0):
        c, s = c.contiguous(), s.contiguous()
    return c, s


def _batch_stride(cos: torch.Tensor, q: torch.Tensor) -> int:
    """The table rows to skip per sequence: 0 for one table for all, seq for one per
    sequence."""
    return q.shape[2] if cos.dim() == 3 and cos.shape[0] > 1 else 0


def eager(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    layout: Layout,
    sig: Signature | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Checked q, k and per-token tables rotated out of place by a direct launch (nothing
    traces, nothing needs a gradient): no dispatcher, no autograd node. With the call's
    signature ``sig``, the launch's plan (grid, strides, compile-time arguments) is reused
    from the last call of that signature: it depends on nothing else."""
    global _plan
    from . import triton as _tr

    stride = _batch_stride(cos, q)
    c, s = rows(cos, sin)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    if sig is not None and _plan is not None and _plan[0] == sig:
        plan = _plan[1]
    else:
        plan = _tr.plan(
            q, k, q_out, k_out, c, interleaved=layout is Layout.INTERLEAVED, conjugate=False,
            table_batch_stride=stride,
        )  # fmt: skip
        if sig is not None:
            _plan = (sig, plan)
    if plan is not None:
        _tr.run(plan, q, k, q_out, k_out, c, s, traceable=False)
    return q_out, k_out


def flags(
    layout: Layout,
    positions: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int = 0,
    table_batch_stride: int = 0,
) -> dict[str, Any]:
    """The Triton ops' arguments after the tables, by name (forward: not conjugated)."""
    return {
        "interleaved": layout is Layout.INTERLEAVED,
        "conjugate": False,
        "positions": positions,
        "offsets": offsets,
        "cu_seqlens": cu_seqlens,
        "max_seqlen": max_seqlen,
        "table_batch_stride": table_batch_stride,
    }


def pair(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cos: torch.Tensor | None,
    k_sin: torch.Tensor | None,
    layout: Layout,
    inplace: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Checked q ``(B, Hq, S, D)`` and k ``(B, Hk, S, D)`` rotated by per-token tables
    ``(S, n)`` or ``(1 or B, S, n)`` (and k's own, for xPos)."""
    from . import triton as _tr  # noqa: F401  (registers the Triton ops; ~3 s to import)

    direct = not inplace and k_cos is None and plain_eager(q, k) and not _checks.tracing()
    if direct and unflagged(q, k, cos, sin):
        return eager(q, k, cos, sin, layout)
    stride = _batch_stride(cos, q)
    c, s = rows(cos, sin)
    kc, ks = (None, None) if k_cos is None or k_sin is None else rows(k_cos, k_sin)
    args = flags(layout, table_batch_stride=stride)
    if inplace:
        torch.ops.posemb.rotate_triton_(q, k, c, s, kc, ks, **args)
        return q, k
    q_out, k_out = torch.ops.posemb.rotate_triton(q, k, c, s, kc, ks, **args)
    return q_out, k_out


def cached(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    layout: Layout,
    positions: torch.Tensor | None,
    offsets: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    seq_len: int,
    inplace: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Checked q and k rotated by rows of a cache ``(rows, n)`` (see
    :func:`posemb.kernels.rotate_cached`; positions ``(1 or B, S)``, offsets ``(B,)``)."""
    from . import triton as _tr  # noqa: F401  (registers the Triton ops)

    args = flags(layout, positions, offsets, cu_seqlens,
                 max_seqlen=seq_len if cu_seqlens is not None else 0)  # fmt: skip
    if inplace:
        torch.ops.posemb.rotate_triton_(q, k, *rows(cos, sin), None, None, **args)
        return q, k
    q_out, k_out = torch.ops.posemb.rotate_triton(q, k, *rows(cos, sin), None, None, **args)
    return q_out, k_out
