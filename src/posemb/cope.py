"""Contextual Position Encoding (CoPE): positions counted by the attention itself.

Golovneva, Wang, Weston, Sukhbaatar 2024, "Contextual Position Encoding: Learning to Count
What's Important", arXiv:2405.18719, section 3. A relative encoding counts every token between
query i and key j; CoPE lets query i decide which tokens count (words, sentences, a variable):

    gate      g_it  = sigmoid(q_i . k_t)                                    (Eq. 3)
    position  p_ij  = sum_{t=j..i} g_it     (causal; in general all t >= j)  (Eq. 4)
    embedding e[p]  = (p - floor p) e[ceil p] + (1 - p + floor p) e[floor p]  (Eq. 5)
    logit     q_i . (k_j + e[p_ij])                                         (Eq. 6)

A position is fractional, so e[p] interpolates two rows of a learned ``(max_positions,
head_dim)`` table; as in the paper's "Computation" paragraph, q_i . e[r] is formed once for
every integer row r and the interpolation is applied to those scalars (Eq. 5 is linear in e).
Positions are clamped at ``max_positions - 1``. They never exceed k_len (every gate is at most
1), so ``max_positions = k_len + 1`` never clamps (the authors' code uses block size + 1); the
paper also allows a cap well below the context, since only the counted tokens advance p.

Scaling. The gates take the logits as given, which include 1/sqrt(head_dim): the paper's code
listing and the released code (facebookresearch/RAM, ``projects/cope``) both take
sigmoid(q.k / sqrt(d)); the paper's equations omit the scale, as for plain attention. The term
returned, q_i . e[p_ij], is *not* divided by sqrt(d): the listing adds it to logits that were
already divided. The released training code by default divides the sum q.k + q.e by sqrt(d)
instead (its ``--cope-nodiv`` flag gives the listing's form). The two differ by a constant on a
learned table (e_released = sqrt(d) e_here), so they express the same functions and differ only
in the table's effective initial scale and step size; pass ``q / sqrt(d)`` for the default.

Masking. A logit of -inf has gate sigmoid(-inf) = 0 exactly, so a masked key is not counted
(Eq. 4 is a reverse cumulative sum over all keys t >= j; a causal mask leaves t <= i). The term
returned there is 0, not q . e[p]: adding it keeps the logit -inf, its gradient is 0 rather
than NaN, and a fully masked row gives zeros.

Precision. Arithmetic is in float32 (float64 for float64 input), rounded once to the logits'
dtype; positions stay in that compute dtype, since bfloat16 cannot tell position 257 from 256.
"""

from __future__ import annotations

import torch
from torch import nn

from . import _checks
from ._errors import InputError


def _table_rows(value: object) -> int:
    """``max_positions`` checked: at least rows 0 and 1 (with a lone row every p clamps to 0)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise InputError(
            f"max_positions must be an integer >= 2 (table rows 0 .. max_positions - 1), "
            f"got {value!r}"
        )
    return value


def cope_positions(attn_logits: torch.Tensor, max_positions: int) -> torch.Tensor:
    """Contextual positions p_ij of Eq. 4, clamped at ``max_positions - 1``.

    Args:
        attn_logits: ``(batch, heads, q_len, k_len)`` (any ``(..., q_len, k_len)`` works),
            already divided by sqrt(head_dim), -inf where masked.
        max_positions: rows of the table the positions index, >= 2.

    Returns:
        ``(batch, heads, q_len, k_len)`` in float32 (float64 for float64 input): for query i
        and key j the sum of the gates sigmoid(logit_it) over keys t >= j, in
        ``[0, max_positions - 1]``.
    """
    logits = _checks.float_tensor("attn_logits", attn_logits)
    if logits.dim() < 2:
        raise InputError(
            f"attn_logits must have shape (..., q_len, k_len), got shape {tuple(logits.shape)}"
        )
    limit = _table_rows(max_positions)
    gates = torch.sigmoid(logits.to(_checks.compute_dtype(logits)))
    # Flipped rather than row total minus prefix sum: that difference cancels, and in float32
    # it can leave a small negative position for the last keys of a row.
    return gates.flip(-1).cumsum(-1).flip(-1).clamp(max=limit - 1)


class CoPE(nn.Module):
    """Contextual position logits q_i . e[p_ij] (Eq. 5-6), to add to the attention logits.

    Args:
        head_dim: channels per head.
        max_positions: rows of the learned table ``embedding``, >= 2; positions clamp at
            ``max_positions - 1``.
        init_std: the table is drawn from N(0, init_std^2); the default 0 gives zeros, as both
            the paper's listing and the released code initialise it, so a fresh CoPE adds
            nothing and attention starts as plain content attention (the table still learns:
            its gradient is q_i times the interpolation weights).
    """

    def __init__(self, head_dim: int, max_positions: int, init_std: float = 0.0) -> None:
        super().__init__()
        self.head_dim = _checks.head_width("head_dim", _checks.positive_int("head_dim", head_dim))
        self.max_positions = _table_rows(max_positions)
        self.init_std = _checks.number("init_std", init_std, minimum=0.0)
        self.embedding = nn.Parameter(torch.empty(self.max_positions, self.head_dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw the table again from N(0, init_std^2) (zeros for init_std 0)."""
        nn.init.normal_(self.embedding, mean=0.0, std=self.init_std)

    def forward(self, q: torch.Tensor, attn_logits: torch.Tensor) -> torch.Tensor:
        """The logits CoPE adds for every query and key.

        Args:
            q: queries ``(batch, heads, q_len, head_dim)``, as they entered q . k.
            attn_logits: ``(batch, heads, q_len, k_len)``, q . k / sqrt(head_dim) with -inf
                where masked; they set the gates (Eq. 3).

        Returns:
            ``(batch, heads, q_len, k_len)`` in the logits' dtype: q_i . e[p_ij], not divided
            by sqrt(head_dim) (see the module's notes), and 0 where the logit is -inf.
        """
        q = _checks.heads_tensor("q", q, self.head_dim)
        logits = _checks.float_tensor("attn_logits", attn_logits)
        if logits.dim() != 4 or logits.shape[:3] != q.shape[:3]:
            b, h, n, _ = q.shape
            raise InputError(
                f"attn_logits must have shape (batch, heads, q_len, k_len) = ({b}, {h}, {n}, "
                f"k_len) to match q, got shape {tuple(logits.shape)}"
            )
        dtype = torch.promote_types(_checks.compute_dtype(q), _checks.compute_dtype(logits))
        pos = cope_positions(logits.to(dtype), self.max_positions)
        # q . e[r] for every row r once, (batch, heads, q_len, max_positions): a product per
        # row rather than per (query, key) pair, which Eq. 5's linearity allows.
        z = q.to(dtype) @ self.embedding.to(dtype).T
        # A NaN logit (a bug upstream) must come out as NaN, not as an out-of-range gather
        # index (a device-side assert on CUDA): its row index is taken as 0, its w stays NaN.
        p = pos.detach().nan_to_num(0.0)
        lo = p.floor()
        z_floor = z.gather(-1, lo.long())
        z_ceil = z.gather(-1, p.ceil().long())
        w = pos - lo  # the gradient reaches the gates through w only; floor and ceil are steps
        out = z_floor + w * (z_ceil - z_floor)  # (1 - w) q.e[floor p] + w q.e[ceil p], Eq. 5
        return out.masked_fill(torch.isneginf(logits), 0.0).to(logits.dtype)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, max_positions={self.max_positions}, "
            f"init_std={self.init_std:g}"
        )


__all__ = ["CoPE", "cope_positions"]
