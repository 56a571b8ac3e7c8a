"""Reference scaled dot-product attention, written out so that checks can see every step.

softmax(Q K^T / sqrt(d) + bias) V, with an optional causal mask (Vaswani et al. 2017, eq. 1).
This is the oracle for the lesson's claims and for faster paths, not a fast path itself.
"""

from __future__ import annotations

import math

import torch

from .. import _checks
from .._errors import InputError


def attention_probs(
    q: torch.Tensor,
    k: torch.Tensor,
    causal: bool = False,
    bias: torch.Tensor | None = None,
    scale: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention weights softmax(q k^T * scale + bias), masked if ``causal``.

    Args:
        q: ``(batch, heads, q_len, head_dim)``.
        k: ``(batch, kv_heads, k_len, head_dim)``; ``heads`` must be a multiple of
            ``kv_heads`` (grouped-query attention shares each k head among a group of q heads).
        causal: mask keys after the query. With ``q_len < k_len`` the queries are the last
            ``q_len`` positions (a decode step over a KV cache): query i sees keys
            ``j <= i + k_len - q_len``.
        bias: additive logits bias broadcastable to ``(batch, heads, q_len, k_len)``; -inf
            hides a key.
        scale: logit scale; default ``1 / sqrt(head_dim)``.
        sinks: ``(heads,)`` attention-sink logits, as gpt-oss has them (OpenAI 2025,
            "gpt-oss-120b & gpt-oss-20b Model Card"; ``transformers``' ``modeling_gpt_oss``):
            each head's softmax gets one more column holding its sink logit, dropped after the
            softmax, so a row's weights sum to less than 1 and a head can attend to nothing.

    Returns:
        ``(batch, heads, q_len, k_len)`` in float32 (float64 for float64 input); rows sum to 1
        (less with sinks), but a query that may see no key (every logit -inf) gets a row of
        zeros, the weights ``torch.nn.functional.scaled_dot_product_attention`` gives it
        (softmax would give NaN).
    """
    q = _checks.float_tensor("q", q)
    k = _checks.float_tensor("k", k)
    if q.dim() != 4 or k.dim() != 4:
        raise InputError(
            f"q and k must have shape (batch, heads, seq, head_dim), got {tuple(q.shape)} "
            f"and {tuple(k.shape)}"
        )
    if q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise InputError(
            f"q and k must share batch and head_dim, got q {tuple(q.shape)} and k {tuple(k.shape)}"
        )
    if q.shape[1] % k.shape[1]:
        raise InputError(f"q heads ({q.shape[1]}) must be a multiple of k heads ({k.shape[1]})")
    q_len, k_len = q.shape[2], k.shape[2]
    if causal and q_len > k_len:
        raise InputError(
            f"causal attention needs q_len <= k_len (the queries are the last q_len of the "
            f"k_len positions), got {q_len} > {k_len}"
        )
    dt = _checks.compute_dtype(q)
    kk = k.to(dt).repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    logits = torch.matmul(q.to(dt), kk.transpose(-1, -2)) * s
    if bias is not None:
        b = _checks.float_tensor("bias", bias)
        try:
            logits = logits + b.to(dt)
        except RuntimeError as err:
            raise InputError(
                f"bias of shape {tuple(b.shape)} does not broadcast to "
                f"{tuple(logits.shape)} (batch, heads, q_len, k_len)"
            ) from err
    if causal:
        i = torch.arange(q_len, device=q.device)[:, None] + (k_len - q_len)
        j = torch.arange(k_len, device=q.device)[None, :]
        logits = logits.masked_fill(j > i, float("-inf"))
    if sinks is not None:
        return _probs_with_sinks(logits, sinks)
    # One rule for a query that sees nothing, here and in PositionalAttention (issue 30,
    # item 9): zero weights, as SDPA gives; a NaN logit still gives NaN.
    # The row's logits are set to 0 first: a softmax of all -inf is NaN, and its gradient would
    # reach every key through the matmul even where the row is zeroed after it.
    blind = (logits == float("-inf")).all(dim=-1, keepdim=True)
    return torch.softmax(logits.masked_fill(blind, 0.0), dim=-1).masked_fill(blind, 0.0)


def _check_sinks(sinks: object, heads: int) -> torch.Tensor:
    """``sinks`` as a float ``(heads,)`` tensor of finite logits, else ``ValueError``."""
    sk = _checks.float_tensor("sinks", sinks)
    if sk.shape != (heads,):
        raise InputError(f"sinks must have shape (heads,) = ({heads},), got {tuple(sk.shape)}")
    # A sink of -inf is no sink, and a row that sees no key would then be all -inf (NaN).
    if not _checks.tracing() and not bool(torch.isfinite(sk).all()):
        raise InputError(f"sinks must be finite logits, got {sk.tolist()}")
    return sk


def _probs_with_sinks(logits: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Softmax over ``logits`` ``(b, h, q, k)`` with one sink column per head, then dropped."""
    sk = _check_sinks(sinks, logits.shape[1])
    col = sk.to(logits.dtype)[None, :, None, None].expand(*logits.shape[:3], 1)
    # The sink is always finite, so a row that sees no key puts all its weight on the sink
    # and its keys get zeros: the same zero row as without sinks, and no NaN.
    return torch.softmax(torch.cat([logits, col], dim=-1), dim=-1)[..., :-1]


def dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    bias: torch.Tensor | None = None,
    scale: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reference attention: ``attention_probs(q, k, causal, bias, scale) @ v``.

    Written out step by step as the oracle for the lesson's claims and for
    :class:`PositionalAttention`; it is not a fast path.

    Args:
        q: ``(batch, heads, q_len, head_dim)``.
        k: ``(batch, kv_heads, k_len, head_dim)``.
        v: ``(batch, kv_heads, k_len, v_dim)``.
        causal: as in :func:`attention_probs`.
        bias: as in :func:`attention_probs`.
        scale: as in :func:`attention_probs`.
        sinks: ``(heads,)`` sink logits, as in :func:`attention_probs`.

    Returns:
        ``(batch, heads, q_len, v_dim)`` in ``q``'s dtype.
    """
    p = attention_probs(q, k, causal=causal, bias=bias, scale=scale, sinks=sinks)
    v = _checks.float_tensor("v", v)
    if v.dim() != 4 or v.shape[:3] != k.shape[:3]:
        raise InputError(
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
        raise InputError(f"perm must be a permutation of 0..{n - 1}, got {p.tolist()}")
    return torch.eye(n, dtype=torch.float64)[p]


__all__ = ["attention_probs", "dot_product_attention", "permutation_matrix"]
