"""QK-norm and RoPE in one pass: :func:`norm_rotate`.

Qwen3, Gemma 3, OLMo 2 and many models of 2025 normalise each head of q and k (RMSNorm over
head_dim, Zhang and Sennrich 2019) right before rotating them. Done as two steps that is two
memory-bound passes over q and k, each reading and writing them whole; fused, each head's row is
read once, normalised and rotated in registers, and written once. Serving engines ship the
forward alone (vLLM's ``fused_qk_norm_rope``, from TensorRT-LLM); posemb's also has its
backward in one pass, so it serves training.

For each head row x (head_dim D, the first r = 2n channels rotating)::

    y = R(theta) (x / sqrt(mean(x^2) + eps) * (w + weight_offset))

in float32 (float64 for float64 input), rounded once to x's dtype. ``weight_offset=1.0`` is
Gemma's ``1 + w``; Qwen3's ``Qwen3RMSNorm`` rounds the normalised value to the input dtype
before the weight multiplies it, which this rounds once instead (within one rounding of it).
OLMo 2's norm spans every head at once (before the reshape into heads), so its mean is not a
row's: it stays two passes.

Backends as :func:`posemb.kernels.rotate`'s: the reference (plain torch, differentiable by
autograd), the CPU op ``torch.ops.posemb.norm_rotate_cpu`` (every instruction-set variant, with
a backward op of its own: nothing is saved but the inputs, and the gradient of a side or weight
that needs none is not computed), and the Triton op on CUDA.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from .. import _checks
from .._errors import InputError
from . import cpu as _cpu
from .layout import Layout, as_layout
from .norm_reference import differentiable_grads, reference


def _weight(name: str, w: object, x: Tensor) -> Tensor:
    w = _checks.float_tensor(name, w)
    if w.dim() != 1 or w.shape[0] != x.shape[-1]:
        raise InputError(
            f"{name} must have shape (head_dim,) = ({x.shape[-1]},), got {tuple(w.shape)}"
        )
    if w.device != x.device:
        raise InputError(f"{name} is on {w.device} but q and k are on {x.device}; move it")
    return w


def _offset(weight_offset: object) -> float:
    if (
        isinstance(weight_offset, bool)
        or not isinstance(weight_offset, (int, float))
        or not math.isfinite(weight_offset)
    ):
        raise InputError(f"weight_offset must be a finite number, got {weight_offset!r}")
    return float(weight_offset)


def norm_rotate(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    q_weight: Tensor,
    k_weight: Tensor,
    eps: float,
    weight_offset: float = 0.0,
    *,
    layout: Layout | str = Layout.HALF,
    backend: str = "auto",
    inplace: bool = False,
) -> tuple[Tensor, Tensor]:
    """RMSNorm each head of q and k, then rotate them, in one pass.

    Args:
        q: ``(batch, q_heads, seq, head_dim)``; any strides but unit stride in head_dim.
        k: ``(batch, kv_heads, seq, head_dim)``; kv_heads may differ (GQA/MQA).
        cos: ``(seq, r/2)`` or ``(batch, seq, r/2)`` per-token table, r <= head_dim (partial
            rotary rotates the first r channels; every channel is normalised).
        sin: the same shape.
        q_weight: ``(head_dim,)`` the q norm's weight.
        k_weight: ``(head_dim,)`` the k norm's weight.
        eps: added to the mean square; > 0.
        weight_offset: added to each weight (1.0 for Gemma's ``1 + w``).
        layout: pairing of channels.
        backend: one of :data:`posemb.kernels.BACKENDS`.
        inplace: write into q and k (inference; refuses tensors that require grad).

    Returns:
        ``(q, k)`` normalised and rotated, dtypes kept.
    """
    from . import triton_path
    from .dispatch import check_pair, pick_backend, refuse_inplace_grad

    memo = None
    if backend == "auto" and not inplace and triton_path.plain(q, k):
        # A CUDA decode step: the signature of the last call that passed every check below
        # and took the direct launch goes straight to it (as kernels.rotate's does).
        memo = triton_path.norm_signature(q, k, cos, sin, q_weight, k_weight, eps,
                                          weight_offset, layout)  # fmt: skip
        if triton_path.known_norm(memo):
            from .triton_norm import eager

            interleaved = as_layout(layout) is Layout.INTERLEAVED
            return eager(q, k, cos, sin, q_weight, k_weight, float(eps), float(weight_offset),
                         interleaved)  # fmt: skip
    q, k = check_pair(q, k, varlen=False)
    cos, sin, _ = _checks.cos_sin_tables(cos, sin, q, (2, 3))
    _checks.per_token_tables(cos, q, "q")
    qw, kw = _weight("q_weight", q_weight, q), _weight("k_weight", k_weight, k)
    eps_ = _checks.number("eps", eps, minimum=0.0, strict=True)
    offset = _offset(weight_offset)
    lay = as_layout(layout)
    which = pick_backend(backend, q, cos, sin)
    refuse_inplace_grad(inplace, q, k, cos, sin, qw, kw)
    if which == "reference" or (inplace and _checks.tracing()):
        q_out, k_out = reference(q, k, cos, sin, qw, kw, eps_, offset, lay)
        if inplace:
            return q.copy_(q_out), k.copy_(k_out)
        return q_out, k_out
    if which == "triton" and not inplace and eager_ok(q, k, qw, kw, cos, sin):
        from .triton_norm import eager

        triton_path.remember_norm(memo)
        return eager(q, k, cos, sin, qw, kw, eps_, offset, lay is Layout.INTERLEAVED)
    c = _table(cos, which)
    s = _table(sin, which)
    # The offset is added here, in float32, so autograd carries the weights' gradient through.
    wq = qw.to(torch.float32) + offset
    wk = kw.to(torch.float32) + offset
    interleaved = lay is Layout.INTERLEAVED
    if which == "cpu":
        if inplace:
            torch.ops.posemb.norm_rotate_cpu_.default(q, k, c, s, wq, wk, eps_, interleaved)
            return q, k
        op = torch.ops.posemb.norm_rotate_cpu.default
        q_out, k_out = op(q, k, c, s, wq, wk, eps_, interleaved)
        return q_out, k_out
    from .triton_norm import norm_rotate_triton

    return norm_rotate_triton(q, k, c, s, wq, wk, eps_, interleaved, inplace)


def eager_ok(q: Tensor, k: Tensor, qw: Tensor, kw: Tensor, *tables: Tensor) -> bool:
    """Nothing traces these tensors and no gradient is wanted of them or the weights: the
    registered op (its dispatcher, autograd wrapper and weight casts) can be skipped."""
    from .dispatch import needs_grad
    from .ops import plain_eager
    from .triton_path import unflagged

    return (
        plain_eager(q, k)
        and not _checks.tracing()
        and not needs_grad(qw, kw)
        and unflagged(q, k, qw, kw, *tables)
    )


def _table(t: Tensor, which: str) -> Tensor:
    """A per-token table as the op reads it: float32, contiguous, ``(1 or B, S, n)``."""
    t = t if t.dim() == 3 else t[None]
    return t.to(torch.float32).contiguous()


# --- the CPU op's Python halves ---------------------------------------------------------------


def _fake(q, k, cos, sin, q_weight, k_weight, eps, interleaved):
    return torch.empty_like(q), torch.empty_like(k)


def _fake_(q, k, cos, sin, q_weight, k_weight, eps, interleaved):
    return None


def _fake_backward(grad_q, grad_k, q, k, cos, sin, qw, kw, eps, interleaved, nq, nk, nqw, nkw):
    def side(need: bool, x: Tensor) -> Tensor:
        return torch.empty_like(x) if need else x.new_empty(0)

    def weight(need: bool, w: Tensor) -> Tensor:
        return w.new_empty(w.shape[0] if need else 0)

    return side(nq, q), side(nk, k), weight(nqw, qw), weight(nkw, kw)


def _fake_into(
    q, k, q_out, k_out, cos, sin, q_weight, k_weight, eps, offset, interleaved, table_form=0
):
    return None


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    q, k, cos, sin, qw, kw, eps, interleaved = inputs
    ctx.save_for_backward(q, k, cos, sin, qw, kw)
    ctx.eps, ctx.interleaved = eps, interleaved


def _backward(ctx: Any, grad_q: Tensor, grad_k: Tensor) -> tuple:
    from .ops import unit_last

    q, k, cos, sin, qw, kw = ctx.saved_tensors
    need = ctx.needs_input_grad
    if torch.is_grad_enabled():  # the backward is differentiated too
        dq, dk, dqw, dkw = differentiable_grads(
            (grad_q, grad_k), ctx.saved_tensors, (need[0], need[1], need[4], need[5]),
            ctx.eps, ctx.interleaved,
        )  # fmt: skip
        return dq, dk, None, None, dqw, dkw, None, None
    dq, dk, dqw, dkw = torch.ops.posemb.norm_rotate_cpu_backward.default(
        unit_last(grad_q), unit_last(grad_k), q, k, cos, sin, qw, kw, ctx.eps,
        ctx.interleaved, need[0], need[1], need[4], need[5],
    )  # fmt: skip
    return (
        dq if need[0] else None,
        dk if need[1] else None,
        None,
        None,
        dqw if need[4] else None,
        dkw if need[5] else None,
        None,
        None,
    )


def _register() -> None:
    torch.library.register_fake("posemb::norm_rotate_cpu", _fake)
    torch.library.register_fake("posemb::norm_rotate_cpu_", _fake_)
    torch.library.register_fake("posemb::norm_rotate_cpu_backward", _fake_backward)
    torch.library.register_fake("posemb::_norm_rotate_cpu_into", _fake_into)
    torch.library.register_autograd(
        "posemb::norm_rotate_cpu", _backward, setup_context=_setup_context
    )


_cpu.on_load(_register)


__all__ = ["norm_rotate", "reference"]
