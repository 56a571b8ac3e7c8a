"""The fused CPU rotation as registered PyTorch ops: ``torch.ops.posemb.rotate_cpu`` (out of
place, differentiable) and ``torch.ops.posemb.rotate_cpu_`` (in place).

The ops and their CPU kernels are defined in C++ (``csrc/ops.cpp``, loaded by
:mod:`posemb.kernels.cpu`); their Python halves are registered here through
:mod:`torch.library` once the library is loaded, so that a model using them traces: each op
has a fake implementation that states its output shapes without running (``torch.compile``
and ``torch.export`` see an opaque node, not a graph break), and the out-of-place op has its
autograd. The backward of a rotation by theta is the same kernel rotating
by -theta (R^T = R(-theta)), so nothing is saved but the cos/sin tables, and a side (q or k)
that needs no gradient costs no work: it is passed with zero heads.

:func:`cpu_pair` is the CPU path's call of them, from :mod:`posemb.kernels.dispatch`.

The Triton kernel registers the same pair of ops (``rotate_triton``, ``rotate_triton_``) in
:mod:`posemb.kernels.triton`, imported only when a Triton path is used.

Shapes (checked by :func:`posemb.kernels.rotate`, not here): q ``(B, Hq, S, D)``, k ``(B, Hk, S,
D)``, unit stride in D; cos, sin (and the key tables) float32 contiguous ``(1 or B, S, r/2)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .._errors import BackendUnavailable
from . import cpu as _cpu
from .layout import Layout


def rotate_cpu(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    k_cos: Tensor | None,
    k_sin: Tensor | None,
    interleaved: bool,
    conjugate: bool,
) -> tuple[Tensor, Tensor]:
    """Rotate q by (cos, sin) and k by the key tables (default the same) into new tensors:
    ``torch.ops.posemb.rotate_cpu``, loaded first if needed (differentiable)."""
    _require()
    q_out, k_out = torch.ops.posemb.rotate_cpu(q, k, cos, sin, k_cos, k_sin, interleaved, conjugate)
    return q_out, k_out


def rotate_cpu_(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    k_cos: Tensor | None,
    k_sin: Tensor | None,
    interleaved: bool,
    conjugate: bool,
) -> None:
    """Rotate q and k in their own memory: ``torch.ops.posemb.rotate_cpu_`` (inference: not
    differentiable)."""
    _require()
    torch.ops.posemb.rotate_cpu_(q, k, cos, sin, k_cos, k_sin, interleaved, conjugate)


def _require() -> None:
    if _cpu.load() is None:
        raise BackendUnavailable(
            f"the fused CPU RoPE op is unavailable: {_cpu.unavailable_reason()}"
        )


def _fake_rotate_cpu(q, k, cos, sin, k_cos, k_sin, interleaved, conjugate):
    return torch.empty_like(q), torch.empty_like(k)


def _fake_rotate_cpu_(q, k, cos, sin, k_cos, k_sin, interleaved, conjugate):
    return None


def _fake_rotate_cpu_into(
    q, k, q_out, k_out, cos, sin, k_cos, k_sin, interleaved, conjugate, table_form=0
):
    return None


def unit_last(x: Tensor) -> Tensor:
    """``x`` with unit stride in its last dimension (incoming gradients may be expanded)."""
    return x if x.stride(-1) == 1 else x.contiguous()


def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    """Save only what the backward needs: the tables and the flags (shared by both ops)."""
    _, _, cos, sin, k_cos, k_sin, interleaved, conjugate, *rest = inputs
    ctx.save_for_backward(cos, sin, k_cos, k_sin)
    ctx.interleaved, ctx.conjugate, ctx.rest = interleaved, conjugate, rest


def backward_by_conjugate(op: Callable[..., tuple[Tensor, Tensor]]) -> Callable[..., tuple]:
    """The backward of rotation op ``op``: the same op rotating the gradients by -theta."""

    def backward(ctx: Any, grad_q: Tensor, grad_k: Tensor) -> tuple:
        cos, sin, k_cos, k_sin = ctx.saved_tensors
        # An empty side gets no gradient at all: an empty one would still be scattered back
        # through the view it came from (rotating only q as ``rotate(x, x[:, :0], ...)``
        # spent 150 ms of 300 filling and adding a zero gradient of x's size).
        need_q = ctx.needs_input_grad[0] and grad_q.numel() > 0
        need_k = ctx.needs_input_grad[1] and grad_k.numel() > 0
        # A side that needs no gradient is passed with zero heads: no work is done for it.
        gq = unit_last(grad_q) if need_q else grad_q[:, :0]
        gk = unit_last(grad_k) if need_k else grad_k[:, :0]
        dq, dk = op(gq, gk, cos, sin, k_cos, k_sin, ctx.interleaved, not ctx.conjugate, *ctx.rest)
        return (dq if need_q else None, dk if need_k else None) + (None,) * (6 + len(ctx.rest))

    return backward


def _register_cpu() -> None:
    """The Python halves of the C++ ops, registered once the library has defined them."""
    torch.library.register_fake("posemb::rotate_cpu", _fake_rotate_cpu)
    torch.library.register_fake("posemb::rotate_cpu_", _fake_rotate_cpu_)
    torch.library.register_fake("posemb::_rotate_cpu_into", _fake_rotate_cpu_into)
    torch.library.register_autograd(
        "posemb::rotate_cpu",
        backward_by_conjugate(torch.ops.posemb.rotate_cpu),
        setup_context=setup_context,
    )


_cpu.on_load(_register_cpu)


def f32(t: torch.Tensor) -> torch.Tensor:
    """``t`` as float32 and contiguous (itself when it is already)."""
    return t.to(torch.float32).contiguous()


def plain_eager(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Nothing traces these tensors and nothing needs their gradient: the functional op can
    be skipped (compile, export and autograd always go through it)."""
    return (
        type(q) is torch.Tensor
        and type(k) is torch.Tensor
        and not torch.compiler.is_compiling()
        and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad))
    )


def cpu_pair(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cos: torch.Tensor | None,
    k_sin: torch.Tensor | None,
    layout: Layout,
    inplace: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.ops.posemb.rotate_cpu`` / ``rotate_cpu_`` on per-token tables."""

    def table(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else f32(t if t.dim() == 3 else t[None])

    c, s, kc, ks = table(cos), table(sin), table(k_cos), table(k_sin)
    assert c is not None and s is not None
    interleaved = layout is Layout.INTERLEAVED
    if inplace:
        torch.ops.posemb.rotate_cpu_.default(q, k, c, s, kc, ks, interleaved, False)
        return q, k
    if plain_eager(q, k):
        # The functional op with its autograd kernel (registered from Python) took 17-19 us
        # for a decode step's q and k even when nothing needs a gradient, and a decode step
        # calls this once per layer; allocating here and rotating into the outputs took 9 us.
        q_out, k_out = torch.empty_like(q), torch.empty_like(k)
        torch.ops.posemb._rotate_cpu_into.default(
            q, k, q_out, k_out, c, s, kc, ks, interleaved, False
        )
        return q_out, k_out
    q_out, k_out = torch.ops.posemb.rotate_cpu.default(q, k, c, s, kc, ks, interleaved, False)
    return q_out, k_out


__all__ = ["cpu_pair", "f32", "plain_eager", "rotate_cpu", "rotate_cpu_"]
