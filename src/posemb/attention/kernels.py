"""The fused attention calls :mod:`.core` merges: one forward returning ``(out, lse)`` and one
backward taking the *merged* ``out`` and ``lse``, per device.

- CPU: PyTorch's flash kernel (``aten._scaled_dot_product_flash_attention_for_cpu`` and its
  backward), GQA native, any float dtype, an additive mask broadcast over heads.
- CUDA: PyTorch's memory-efficient kernel (``aten._scaled_dot_product_efficient_attention``
  and its backward, the pair PyTorch's own ring attention merges the same way), which takes an
  additive bias and returns the log-sum-exp. It wants one head count (k and v are repeated),
  a bias whose rows are 16-element aligned, and its log-sum-exp rows padded to 32. Because no
  GPU ran this code when it was written, the pair is checked against the explicit tiles on
  a small problem the first time a (device, dtype, head width) uses it; a kernel that fails
  or disagrees is set aside, with a warning, for the explicit tiles.
- Anything else, or ``fused=False``: the explicit tiles (:func:`_math_forward`), exact, their
  memory bounded by the tile.

A row a call's mask hides whole has no defined ``lse``: callers mark it themselves.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import NamedTuple

import torch

Forward = Callable[..., tuple[torch.Tensor, torch.Tensor]]
Backward = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


class Kernel(NamedTuple):
    """A call's forward ``(q, k, v, mask, scale) -> (out, lse)`` and backward ``(d_out, q, k,
    v, out, lse, mask, scale) -> (dq, dk, dv)``, k and v with q's heads or fewer (GQA)."""

    name: str
    forward: Forward
    backward: Backward


def _flash_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, False, attn_mask=mask, scale=scale
    )
    return out, lse


def _flash_backward(
    d_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        d_out, q, k, v, out, lse, 0.0, False, attn_mask=mask, scale=scale
    )
    return grads[0], grads[1], grads[2]


def _math_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused call written out on one tile: ``(out, lse)`` as the flash kernel returns them
    (a row that sees nothing: zeros, its lse left to the caller); k and v may have fewer heads
    (GQA), as for the flash kernel."""
    k, v = _heads(k, q), _heads(v, q)
    logits = _logits(q, k, mask, scale)
    lse = torch.logsumexp(logits, dim=-1)
    p = torch.exp(logits - lse.nan_to_num(neginf=0.0)[..., None])
    return torch.matmul(p, v), lse


def _math_backward(
    d_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dq, dk, dv, _ = scores_backward(d_out, q, k, v, out, lse, mask, scale)
    return dq, dk, dv


def scores_backward(
    d_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The explicit tile's backward, with the gradient of its logits ``(batch, heads, rows,
    cols)`` too (what an additive score on them receives); ``out`` and ``lse`` the merged
    ones. Two tile-sized buffers, each pass in place (it runs where nothing records a graph:
    a backward that is differentiated again recomputes through :func:`_math_forward`)."""
    kv_heads = k.shape[1]
    k, v = _heads(k, q), _heads(v, q)
    p = _logits(q, k, mask, scale)
    p.sub_(lse[..., None]).exp_()  # the merged softmax's share of this tile
    d_v = torch.matmul(p.transpose(-1, -2), d_out)
    d_logits = torch.matmul(d_out, v.transpose(-1, -2))
    d_logits.sub_((d_out * out).sum(-1, keepdim=True)).mul_(p)
    del p
    d_q = torch.matmul(d_logits, k).mul_(scale)
    d_k = torch.matmul(d_logits.transpose(-1, -2), q).mul_(scale)
    return d_q, _group_sum(d_k, kv_heads), _group_sum(d_v, kv_heads), d_logits


def _logits(
    q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """``q k^T * scale + mask``, a new tensor; in place after the product where nothing
    records a graph."""
    logits = torch.matmul(q, k.transpose(-1, -2))
    graph = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or (
        mask is not None and mask.requires_grad))  # fmt: skip
    if graph:
        return logits * scale if mask is None else logits * scale + mask
    logits.mul_(scale)
    if mask is None:
        return logits
    if logits.shape == torch.broadcast_shapes(logits.shape, mask.shape):
        return logits.add_(mask)
    return logits + mask


def _heads(x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """k or v repeated to q's heads (each kv head serving ``heads / kv_heads`` queries)."""
    return x if x.shape[1] == q.shape[1] else x.repeat_interleave(q.shape[1] // x.shape[1], 1)


def _group_sum(g: torch.Tensor, kv_heads: int) -> torch.Tensor:
    b, h = g.shape[:2]
    return g if h == kv_heads else g.view(b, kv_heads, h // kv_heads, *g.shape[2:]).sum(2)


def _aligned(mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """An additive mask as the memory-efficient kernel reads it: its rows 16-element aligned
    (padded, then cut back), expanded to ``(batch, heads, q_len, k_len)``."""
    width = mask.shape[-1]
    padded = torch.nn.functional.pad(mask, (0, -width % 16))[..., :width]
    return padded.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])


def _efficient_op(*args: object, **kwargs: object) -> tuple[torch.Tensor, ...]:
    return torch.ops.aten._scaled_dot_product_efficient_attention(*args, **kwargs)


def _efficient_op_backward(*args: object, **kwargs: object) -> tuple[torch.Tensor, ...]:
    return torch.ops.aten._scaled_dot_product_efficient_attention_backward(*args, **kwargs)


_NO_SEED = torch.empty((), dtype=torch.long)  # dropout 0: the kernel reads no RNG state


def _efficient_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    k, v = _heads(k, q), _heads(v, q)
    bias = None if mask is None else _aligned(mask, q, k)
    out, lse, _, _ = _efficient_op(q, k, v, bias, True, 0.0, False, scale=scale)
    return out, lse[..., : q.shape[2]].float()


def _efficient_backward(
    d_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    kv_heads = k.shape[1]
    k, v = _heads(k, q), _heads(v, q)
    bias = None if mask is None else _aligned(mask, q, k)
    rows = q.shape[2]
    padded = lse.new_zeros((*lse.shape[:2], rows + -rows % 32), dtype=torch.float32)
    padded[..., :rows] = lse
    dq, dk, dv, _ = _efficient_op_backward(
        d_out.contiguous(),
        q,
        k,
        v,
        bias,
        out.contiguous(),
        padded,
        _NO_SEED,
        _NO_SEED,
        0.0,
        [True, True, True, False],
        False,
        scale=scale,
    )
    return dq, _group_sum(dk, kv_heads), _group_sum(dv, kv_heads)


FLASH_CPU = Kernel("flash (CPU)", _flash_forward, _flash_backward)
EFFICIENT_CUDA = Kernel("memory-efficient (CUDA)", _efficient_forward, _efficient_backward)
TILES = Kernel("explicit tiles", _math_forward, _math_backward)
_checked: dict[tuple[str, torch.dtype, int, int], Kernel] = {}


def kernel_for(q: torch.Tensor, v: torch.Tensor, fused: bool = True) -> Kernel:
    """The kernel the calls of an attention with these q and v run."""
    if not fused:
        return TILES
    if q.device.type == "cpu":
        return FLASH_CPU
    if q.device.type != "cuda":
        return TILES
    key = (str(q.device), q.dtype, q.shape[-1], v.shape[-1])
    if key not in _checked:
        _checked[key] = EFFICIENT_CUDA if _agrees(EFFICIENT_CUDA, q, v) else TILES
    return _checked[key]


def _agrees(kernel: Kernel, q: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether ``kernel`` gives the explicit tiles' output and gradients on a small problem
    of q's device, dtype and head widths: a masked call, GQA, rows not a multiple of 32."""
    gen = torch.Generator(device="cpu").manual_seed(0)

    def make(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(q.device, q.dtype)

    d, dv = q.shape[-1], v.shape[-1]
    qq, kk, vv = make(2, 4, 37, d), make(2, 2, 45, d), make(2, 2, 45, dv)
    mask = torch.zeros(2, 1, 37, 45).masked_fill(
        torch.rand(2, 1, 37, 45, generator=gen) < 0.3, -torch.inf
    )
    mask = mask.to(q.device, q.dtype)
    d_out = make(2, 4, 37, dv)
    tol = 1e-4 if q.dtype in (torch.float32, torch.float64) else 3e-2
    try:
        results = []
        for k in (kernel, TILES):
            out, lse = k.forward(qq, kk, vv, mask, 0.3)
            results.append((out, lse, *k.backward(d_out, qq, kk, vv, out, lse, mask, 0.3)))
        ok = all(
            torch.allclose(a.float(), b.float(), rtol=tol, atol=tol)
            for a, b in zip(*results, strict=True)
        )
    except (RuntimeError, TypeError, ValueError, NotImplementedError) as error:
        ok, why = False, f"{type(error).__name__}: {error}"
    else:
        why = "its results differ from the explicit tiles'"
    if not ok:
        warnings.warn(
            f"posemb: the {kernel.name} attention kernel failed its first-use check on "
            f"{q.device} ({q.dtype}, head widths {d}/{dv}): {why}; the blocked attention uses "
            f"the explicit tiles there (exact, slower)",
            RuntimeWarning,
            stacklevel=3,
        )
    return ok
