"""Reference scaled dot-product attention, written out so that checks can see every step.

softmax(Q K^T / sqrt(d) + bias) V, with an optional causal mask (Vaswani et al. 2017, eq. 1).
This is the oracle for the lesson's claims and for faster paths, not a fast path itself.
"""

from __future__ import annotations

import math

import torch

from . import _checks


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def attention_probs(
    q: torch.Tensor,
    k: torch.Tensor,
    causal: bool = False,
    bias: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention weights softmax(q k^T * scale + bias), masked if ``causal``.

    Args:
        q: ``(batch, heads, q_len, head_dim)``.
        k: ``(batch, kv_heads, k_len, head_dim)``; ``heads`` must be a multiple of
            ``kv_heads`` (grouped-query attention shares each k head among a group of q heads).
        causal: mask keys after the query. With ``q_len < k_len`` the queries are the last
            ``q_len`` positions (a decode step over a KV cache): query i sees keys
            ``j <= i + k_len - q_len``.
        bias: additive logits bias broadcastable to ``(batch, heads, q_len, k_len)``.
        scale: logit scale; default ``1 / sqrt(head_dim)``.

    Returns:
        ``(batch, heads, q_len, k_len)`` in float32 (float64 for float64 input); rows sum to 1.
    """
    q = _checks.float_tensor("q", q)
    k = _checks.float_tensor("k", k)
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(
            f"q and k must have shape (batch, heads, seq, head_dim), got {tuple(q.shape)} "
            f"and {tuple(k.shape)}"
        )
    if q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must share batch and head_dim, got q {tuple(q.shape)} and k {tuple(k.shape)}"
        )
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"q heads ({q.shape[1]}) must be a multiple of k heads ({k.shape[1]})")
    q_len, k_len = q.shape[2], k.shape[2]
    if causal and q_len > k_len:
        raise ValueError(f"causal attention needs q_len <= k_len, got {q_len} > {k_len}")
    dt = _compute_dtype(q)
    kk = k.to(dt).repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    logits = torch.matmul(q.to(dt), kk.transpose(-1, -2)) * s
    if bias is not None:
        b = _checks.float_tensor("bias", bias)
        try:
            logits = logits + b.to(dt)
        except RuntimeError as err:
            raise ValueError(
                f"bias of shape {tuple(b.shape)} does not broadcast to "
                f"{tuple(logits.shape)} (batch, heads, q_len, k_len)"
            ) from err
    if causal:
        i = torch.arange(q_len, device=q.device)[:, None] + (k_len - q_len)
        j = torch.arange(k_len, device=q.device)[None, :]
        logits = logits.masked_fill(j > i, float("-inf"))
    return torch.softmax(logits, dim=-1)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    bias: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Reference attention: ``attention_probs(q, k, causal, bias, scale) @ v``.

    Args:
        q: ``(batch, heads, q_len, head_dim)``.
        k: ``(batch, kv_heads, k_len, head_dim)``.
        v: ``(batch, kv_heads, k_len, v_dim)``.
        causal, bias, scale: as in :func:`attention_probs`.

    Returns:
        ``(batch, heads, q_len, v_dim)`` in ``q``'s dtype.
    """
    p = attention_probs(q, k, causal=causal, bias=bias, scale=scale)
    v = _checks.float_tensor("v", v)
    if v.dim() != 4 or v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"v must have shape (batch, kv_heads, k_len, v_dim) matching k {tuple(k.shape[:3])}, "
            f"got {tuple(v.shape)}"
        )
    vv = v.to(p.dtype).repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    return torch.matmul(p, vv).to(q.dtype)


def permutation_matrix(perm: torch.Tensor | list[int]) -> torch.Tensor:
    """The matrix P with ``(P @ X)[i] = X[perm[i]]``, for stating equivariance.

    Args:
        perm: a permutation of ``0 .. n-1``.

    Returns:
        float64 tensor of shape ``(n, n)``.
    """
    p = _checks.positions(perm, max_dim=1, name="perm")
    n = p.shape[0]
    if not torch.equal(torch.sort(p).values, torch.arange(n)):
        raise ValueError(f"perm must be a permutation of 0..{n - 1}, got {p.tolist()}")
    return torch.eye(n, dtype=torch.float64)[p]
