"""The definition :func:`posemb.kernels.norm_rotate` computes, in plain torch: what every
backend is tested against, and what a backward that is itself differentiated runs (the fused
backward ops have no derivative of their own). Below both the CPU op's Python halves
(:mod:`.norm`) and the Triton op (:mod:`.triton_norm`), so neither imports the other."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import _checks
from .layout import Layout
from .reference import apply_rope


def reference(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    q_weight: Tensor,
    k_weight: Tensor,
    eps: float,
    weight_offset: float = 0.0,
    layout: Layout | str = Layout.HALF,
) -> tuple[Tensor, Tensor]:
    """The definition, in plain torch: RMSNorm of each head row, then the rotation, in the
    compute dtype, rounded once (shapes as :func:`norm_rotate`)."""

    def one(x: Tensor, w: Tensor) -> Tensor:
        compute = _checks.compute_dtype(x)
        xf = x.to(compute)
        scale = torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
        normed = xf * scale * (w.to(compute) + weight_offset)
        return apply_rope(normed, cos, sin, layout).to(x.dtype)

    return one(q, q_weight), one(k, k_weight)


def differentiable_grads(
    grads: tuple[Tensor, Tensor],
    saved: tuple[Tensor, ...],
    need: tuple[bool, bool, bool, bool],
    eps: float,
    interleaved: bool,
) -> tuple[Tensor | None, ...]:
    """The gradients of q, k and the two (offset) weights through the definition, with the
    graph kept: for a backward that is itself differentiated (``create_graph=True``: gradient
    penalties, Hessian-vector products, MAML). The fused backward ops have no autograd of
    their own, so their second derivatives would silently be zero.

    ``saved`` is the forward's ``(q, k, cos, sin, q_weight, k_weight)`` with tables ``(1 or B,
    S, n)``; ``need`` says which of q, k and the weights want a gradient.
    """
    q, k, cos, sin, qw, kw = saved
    c, s = (t if t.shape[0] > 1 else t[0] for t in (cos, sin))
    lay = Layout.INTERLEAVED if interleaved else Layout.HALF
    with torch.enable_grad():
        out = reference(q, k, c, s, qw, kw, eps, 0.0, lay)
        wanted = [t for t, n in zip((q, k, qw, kw), need, strict=True) if n]
        got = iter(torch.autograd.grad(out, wanted, grads, create_graph=True, allow_unused=True))
    return tuple(next(got) if n else None for n in need)


__all__ = ["differentiable_grads", "reference"]
