"""Scaled dot-product attention with any posemb encoding: :class:`PositionalAttention`, and
:func:`make_encoding` by name.

Rotary encodings turn q and k; bias encodings add a score to the logits; CoPE adds logits
computed from q and the content logits. The attention itself is PyTorch's scaled dot-product
attention where it can serve (no score, or a bias small enough that writing it whole costs
less than the calls), and otherwise the blocked core (:mod:`.tiled`), which never forms the
``(q_len, k_len)`` score.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd import forward_ad as _forward_ad

from .. import _checks
from .._errors import InputError
from ..bias import AlibiBias, FireBias, KerpleBias, T5Bias
from ..cope import CoPE
from ..fope import FourierRotaryEmbedding
from ..rope import RotaryEmbedding, XPos
from ..temperature import QueryTemperature, ScalableSoftmax
from ..temperature import check as _check_temperature
from .reference import _check_sinks, attention_probs

# --- one entry point for every encoding ----------------------------------------------------------

ATTENTION_ENCODINGS = ("nope", "rope", "xpos", "alibi", "t5", "fire", "kerple", "cope", "fope")
INPUT_ENCODINGS = ("sinusoidal", "learned")


def make_encoding(
    name: str, num_heads: int, head_dim: int, causal: bool = False, **kwargs: Any
) -> nn.Module | None:
    """Build an attention-level encoding by name (None for "nope").

    Args:
        name: one of :data:`ATTENTION_ENCODINGS`.
        num_heads: attention heads.
        head_dim: channels per head.
        causal: T5 buckets become one-directional for causal attention.
        kwargs: passed to the encoding's constructor (e.g. ``base``, ``scaling`` for RoPE,
            ``kind`` for KERPLE, ``max_positions`` for CoPE, ``train_len`` for FoPE, whose
            one coefficient set is then shared by every head: pass a
            :class:`FourierRotaryEmbedding` built with ``num_heads`` for one set per head).
    """
    if name in INPUT_ENCODINGS:
        raise InputError(
            f"encoding {name!r} is added to the token embeddings, not inside attention: use "
            f"posemb.{'SinusoidalEmbedding' if name == 'sinusoidal' else 'LearnedEmbedding'} on "
            f"the input and encoding='nope' here"
        )
    builders = {
        "nope": lambda: None,
        "rope": lambda: RotaryEmbedding(head_dim, **kwargs),
        "xpos": lambda: XPos(head_dim, **kwargs),
        "alibi": lambda: AlibiBias(num_heads, **kwargs),
        "t5": lambda: T5Bias(num_heads, bidirectional=not causal, **kwargs),
        "fire": lambda: FireBias(num_heads, **kwargs),
        "kerple": lambda: KerpleBias(num_heads, **kwargs),
        "cope": lambda: CoPE(head_dim, **kwargs),
        "fope": lambda: FourierRotaryEmbedding(head_dim, **kwargs),
    }
    needs = {"cope": "max_positions", "fope": "train_len"}
    if name in needs and needs[name] not in kwargs:
        raise InputError(
            f"encoding {name!r} needs {needs[name]}= (e.g. the training length), got none"
        )
    if name not in builders:
        raise InputError(
            f"unknown encoding {name!r}; known: {', '.join(ATTENTION_ENCODINGS)} (and "
            f"{', '.join(INPUT_ENCODINGS)} at the input)"
        )
    return builders[name]()


class PositionalAttention(nn.Module):
    """Scaled dot-product attention with any posemb encoding, by name or as a module.

    Rotary encodings (RoPE, xPos, FoPE) turn q and k; bias encodings (ALiBi, T5 buckets, FIRE,
    KERPLE) add to the logits; CoPE adds logits computed from q and the content logits; NoPE
    does neither. The work is done by ``torch.nn.functional.scaled_dot_product_attention``,
    with ``is_causal=True`` whenever no bias or mask is needed, and otherwise a bias built for
    the shapes of this call only.

    Positions work for every encoding: queries default to the last ``q_len`` of ``k_len``
    positions, so a decode step (one query over a cache of k and v, not yet rotated) gives the
    same output as the same row of the full forward. A query that may see no key (every key
    masked by causality, explicit positions or ``key_padding_mask``) gets zero weights and a
    zero output, in :meth:`forward`, :meth:`attention_weights` and :func:`attention_probs`
    alike; causal attention with more queries than keys needs explicit positions.

    Args:
        encoding: a name from :data:`ATTENTION_ENCODINGS`, an encoding module
            (``RotaryEmbedding``, ``XPos``, ``FourierRotaryEmbedding``, ``AlibiBias``,
            ``T5Bias``, ``FireBias``, ``KerpleBias``, ``CoPE``) or None.
        num_heads: query heads.
        head_dim: channels per head.
        causal: mask keys at later positions than the query.
        query_temperature: a :class:`posemb.temperature.QueryTemperature` (Llama 4's or
            Mistral's), each query multiplied by its factor at the query's position, the same
            position RoPE turns it by, so every logit of that query scales by it; or a
            :class:`posemb.temperature.ScalableSoftmax` (SSMax), each query multiplied by
            ``s_h * ln(n)`` with n the number of keys it sees in this call.
        sinks: a learned attention-sink logit per head (gpt-oss; see :func:`attention_probs`),
            the parameter ``sinks`` ``(num_heads,)``, initially 0 (a sink as strong as a key
            whose logit is 0).
        window: sliding-window attention (Mistral 7B, Gemma 2-3, Cohere2's local layers):
            a query at position p sees keys at p - window < position <= p; causal only.
        kwargs: passed to the encoding's constructor when ``encoding`` is a name.
    """

    sinks: torch.Tensor | None

    def __init__(
        self,
        encoding: str | nn.Module | None = "rope",
        *,
        num_heads: int,
        head_dim: int,
        causal: bool = False,
        query_temperature: QueryTemperature | ScalableSoftmax | None = None,
        sinks: bool = False,
        window: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        self.num_heads = _checks.positive_int("num_heads", num_heads)
        self.head_dim = _checks.positive_int("head_dim", head_dim)
        self.causal = bool(causal)
        if window is not None:
            window = _checks.positive_int("window", window)
            if not self.causal:
                raise InputError(f"window={window} needs causal=True (a window looks back only)")
        self.window = window
        self.query_temperature = _check_temperature(query_temperature)
        temp = self.query_temperature
        if isinstance(temp, ScalableSoftmax) and temp.num_heads != self.num_heads:
            raise InputError(
                f"query_temperature has {temp.num_heads} heads, attention has {num_heads}"
            )
        if not isinstance(sinks, bool):
            raise InputError(f"sinks must be True or False, got {sinks!r}")
        self.register_parameter("sinks", nn.Parameter(torch.zeros(num_heads)) if sinks else None)
        if isinstance(encoding, str):
            self.name = encoding
            self.encoding = make_encoding(encoding, num_heads, head_dim, causal, **kwargs)
        else:
            self.encoding = encoding
            self.name = "nope" if encoding is None else type(encoding).__name__
        self.kind = _kind_of(self.encoding, num_heads, head_dim)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A module pickled before sinks and windows existed had neither.
        state.setdefault("window", None)
        state.get("_parameters", {}).setdefault("sinks", None)
        super().__setstate__(state)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attend.

        Args:
            q: ``(batch, heads, q_len, head_dim)``.
            k: ``(batch, kv_heads, k_len, head_dim)``, not rotated (heads a divisor of q's).
            v: ``(batch, kv_heads, k_len, v_dim)``.
            positions: query positions ``(q_len,)`` or ``(batch, q_len)``; default the last
                q_len of 0..k_len-1. RoPE turns the queries by them and the query temperature,
                if any, is taken at them.
            k_positions: key positions ``(k_len,)`` or ``(batch, k_len)``; default 0..k_len-1.
            key_padding_mask: bool ``(batch, k_len)``, True where a key is padding.

        Returns:
            ``(batch, heads, q_len, v_dim)`` in q's dtype.
        """
        _checks.float_tensor("v", v)
        if v.dim() != 4:
            raise InputError(f"v must have shape (batch, heads, seq, dim), got {tuple(v.shape)}")
        call = self._rotated(q, k, positions, k_positions, key_padding_mask)
        if v.shape[:3] != call.k.shape[:3]:
            raise InputError(
                f"k and v must be (batch={q.shape[0]}, kv_heads dividing {q.shape[1]}, k_len, "
                f"...), got k {tuple(call.k.shape)} and v {tuple(v.shape)}"
            )
        if self._takes_tiles(call):
            return self._tiled(call, v)
        q, k, attn, is_causal = self._masked(call)
        if self.sinks is not None:
            k, v, attn = _append_sink(q, k, v, attn, is_causal, self.sinks)
            is_causal = False
        # SDPA shares each k/v head among its group of q heads itself; no copies of k and v.
        gqa = q.shape[1] != k.shape[1]
        with _math_under_forward_ad():
            if attn is None:
                return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=gqa)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn, enable_gqa=gqa)

    def _takes_tiles(self, call: _Call) -> bool:
        """Whether this call runs through the blocked core (:mod:`.tiled`) rather than SDPA
        with a ``(q_len, k_len)`` bias or mask.

        The rule: a call that SDPA serves alone (no score, no window, no sink, the causal flag
        on positions 0..n-1, or no mask at all) stays there; CoPE (whose gates need every
        content logit) and a traced call (the plan reads positions) stay with the explicit
        path; any other call takes the tiles once its ``(q_len, k_len)`` grid reaches
        :data:`TILES_FROM` pairs, where writing the score whole costs more than the calls
        (measured: ``benchmarks/attention.py``). Below it a few small tensors are cheaper than
        a plan of calls."""
        if self.kind == "cope" or _checks.tracing() or _forward_ad._current_level >= 0:
            return False  # (the core's merge has no forward-mode derivative either)
        plain = self.kind not in ("bias",) and self.window is None and self.sinks is None
        if plain and call.pad is None and (call.default or not self.causal):
            return False
        return call.q.shape[2] * call.k.shape[2] >= TILES_FROM

    def _tiled(self, call: _Call, v: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` through the blocked core."""
        from .scores import Visible, score_of
        from .tiled import tiled_attention

        q = call.q
        visible = Visible(causal=self.causal, window=self.window)
        temp = self.query_temperature
        if temp is not None:
            factor: torch.Tensor | None
            if isinstance(temp, ScalableSoftmax):
                from .tiled import visible_counts

                n = visible_counts(visible, call.qp, call.kp, call.pad).to(q.device)
                factor = temp.factor(n).to(_checks.compute_dtype(q))[..., None]
            else:
                factor = _query_factor(temp, q, call.qp, None, self.causal, call.k.shape[2])
            assert factor is not None
            q = (q.to(factor.dtype) * factor).to(q.dtype)
        score = score_of(self.encoding, self.num_heads)
        scale = 1.0 / math.sqrt(q.shape[-1])
        sinks = None if self.sinks is None else _check_sinks(self.sinks, q.shape[1])
        return tiled_attention(
            q, call.k, v, score, visible, scale, call.qp, call.kp, call.pad, sinks
        )

    def attention_weights(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The attention probabilities that :meth:`forward` multiplies v by.

        The same rotation, query temperature, bias and mask as :meth:`forward` (both go through
        one preparation step), written out as :func:`attention_probs`, so
        ``forward(q, k, v, ...) == attention_weights(q, k, ...) @ v`` up to rounding (v's
        heads repeated for grouped-query attention).

        Args:
            q: as in :meth:`forward`.
            k: as in :meth:`forward`.
            positions: as in :meth:`forward`.
            k_positions: as in :meth:`forward`.
            key_padding_mask: as in :meth:`forward`.

        Returns:
            ``(batch, heads, q_len, k_len)`` in float32 (float64 for float64 input); each row
            sums to 1 over the keys it may see (less with sinks).
        """
        q, k, attn, is_causal = self._prepare(q, k, positions, k_positions, key_padding_mask)
        return attention_probs(q, k, causal=is_causal, bias=_as_bias(attn, q), sinks=self.sinks)

    def _prepare(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor | None,
        k_positions: torch.Tensor | None,
        key_padding_mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, bool]:
        """Check shapes; rotate and temper q and k; build the bias or mask of this call.

        Returns ``(q, k, attn, is_causal)``: q and k as attention sees them, ``attn`` None,
        a bool mask (True where a key may be seen) or a float bias broadcastable to
        ``(batch, heads, q_len, k_len)``, and whether the plain causal mask applies on top
        (only when ``attn`` is None).
        """
        return self._masked(self._rotated(q, k, positions, k_positions, key_padding_mask))

    def _rotated(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor | None,
        k_positions: torch.Tensor | None,
        key_padding_mask: torch.Tensor | None,
    ) -> _Call:
        """Check shapes and positions; rotate q and k by a rotary encoding."""
        b, q_len, k_len = self._check_qk(q, k, positions)
        default_positions = positions is None and k_positions is None
        kp = _checks.positions_for(
            "k_positions", k_positions, batch=b, length=k_len, device=k.device
        )
        qp = _checks.positions_for(
            "positions", positions, batch=b, length=q_len, device=q.device, start=k_len - q_len
        )
        if not default_positions:  # the causal mask subtracts them: keep clear of int64's ends
            _checks.within_limit("positions", qp)
            _checks.within_limit("k_positions", kp)
        pad = _check_padding(key_padding_mask, b, k_len)
        enc = self.encoding
        if isinstance(enc, XPos):
            q, k = enc(q, k, qp, k_positions=kp)
        elif isinstance(enc, (RotaryEmbedding, FourierRotaryEmbedding)):
            q, k = enc.rotate(q, qp), enc.rotate(k, kp)
        return _Call(q, k, qp, kp, pad, default_positions)

    def _masked(self, call: _Call) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, bool]:
        """The explicit path's bias or mask of a rotated call (see :meth:`_prepare`)."""
        q, k, qp, kp, pad = call.q, call.k, call.qp, call.kp, call.pad
        q_len, k_len = q.shape[2], k.shape[2]
        enc = self.encoding
        # SDPA's own causal flag is the fast path, but it cannot be combined with any other
        # mask or bias, and it assumes positions 0..n-1 for both q and k.
        fast_causal = (
            call.default
            and q_len == k_len
            and self.kind not in ("bias", "cope")
            and pad is None
            and self.window is None
        )
        mask = None  # a boolean mask, True where a key may be seen; SDPA takes it as it is
        if self.causal and not fast_causal:
            rel = kp.unsqueeze(-2) - qp.unsqueeze(-1)  # (q, k) or (b, q, k)
            mask = rel <= 0
            if self.window is not None:
                mask = mask & (rel > -self.window)
            mask = mask[None, None] if mask.dim() == 2 else mask[:, None]
        if pad is not None:
            keep = ~pad[:, None, None, :]
            mask = keep if mask is None else mask & keep
        factor = _query_factor(self.query_temperature, q, qp, mask, self.causal, k_len)
        plain_q = q
        if factor is not None:  # formed in float32 or wider, rounded once to q's dtype
            q = (q.to(factor.dtype) * factor).to(q.dtype)
        bias = None
        if isinstance(enc, (AlibiBias, T5Bias, FireBias, KerpleBias)):
            bias = enc(qp, kp).to(q.dtype)
        elif isinstance(enc, CoPE):
            # The gates count from the content logits as CoPE defines them; a temperature then
            # scales the query's whole logit, CoPE's term included (it is q . e[p]).
            bias = _cope_bias(enc, plain_q, k, mask)
            if factor is not None:
                bias = (bias.to(factor.dtype) * factor).to(q.dtype)
        if bias is None and mask is None:
            return q, k, None, self.causal
        attn = mask if bias is None else bias
        if bias is not None and mask is not None:
            attn = torch.where(mask, bias, float("-inf"))
        return q, k, attn, False

    def _check_qk(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor | None
    ) -> tuple[int, int, int]:
        """Refuse q and k this attention cannot take; return ``(batch, q_len, k_len)``."""
        for name, t in (("q", q), ("k", k)):
            _checks.float_tensor(name, t)
            if t.dim() != 4:
                raise InputError(
                    f"{name} must have shape (batch, heads, seq, dim), got {tuple(t.shape)}"
                )
        b, hq, q_len, d = q.shape
        if d != self.head_dim or k.shape[-1] != d or hq != self.num_heads:
            raise InputError(
                f"q and k must have {self.num_heads} / any heads and head_dim {self.head_dim}, "
                f"got q {tuple(q.shape)} and k {tuple(k.shape)}"
            )
        if k.shape[0] != b or hq % k.shape[1]:
            raise InputError(
                f"k must be (batch={b}, kv_heads dividing {hq}, k_len, head_dim), got k "
                f"{tuple(k.shape)}"
            )
        k_len = k.shape[2]
        if self.causal and positions is None and q_len > k_len:
            # The default puts the queries at the last q_len of the k_len positions: the first
            # ones would sit before every key and see nothing.
            raise InputError(
                f"causal attention needs q_len <= k_len (the queries are the last q_len of the "
                f"k_len positions), got {q_len} > {k_len}; pass positions for queries "
                f"elsewhere"
            )
        return b, q_len, k_len

    def extra_repr(self) -> str:
        text = f"encoding={self.name!r}, num_heads={self.num_heads}, causal={self.causal}"
        if isinstance(self.query_temperature, QueryTemperature):
            text += f", query_temperature={self.query_temperature!r}"
        if self.sinks is not None:
            text += ", sinks=True"
        if self.window is not None:
            text += f", window={self.window}"
        return text


# A call's (q_len, k_len) grid from which the blocked core serves it (see
# PositionalAttention._takes_tiles): 256 x 256 pairs, about where a bias written whole and
# handed to SDPA stops being cheaper than the core's calls on this project's CPU.
TILES_FROM = 256 * 256


@dataclass(frozen=True)
class _Call:
    """One call of :class:`PositionalAttention` after its checks and rotation: q and k as
    attention sees them, positions ``(q_len,)`` or ``(b, q_len)`` and likewise for keys, the
    key padding (or None), and whether the positions were the default ones."""

    q: torch.Tensor
    k: torch.Tensor
    qp: torch.Tensor
    kp: torch.Tensor
    pad: torch.Tensor | None
    default: bool


_ROTARY = (RotaryEmbedding, FourierRotaryEmbedding)
_BIASES = (AlibiBias, T5Bias, FireBias, KerpleBias)


def _math_under_forward_ad() -> contextlib.AbstractContextManager:
    """SDPA's math backend where a dual tensor may pass (torch's fused CPU kernels have no
    forward-mode derivative); nothing otherwise."""
    if _forward_ad._current_level < 0:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.MATH)


def _kind_of(enc: nn.Module | None, num_heads: int, head_dim: int) -> str:
    """How :class:`PositionalAttention` applies ``enc``: none, xpos, rotary, bias or cope."""
    if enc is None:
        return "none"
    if isinstance(enc, XPos):
        return "xpos"
    if isinstance(enc, FourierRotaryEmbedding) and num_heads % enc.num_heads:
        raise InputError(
            f"FoPE has {enc.num_heads} coefficient sets, which cannot split {num_heads} heads "
            f"into equal groups (num_heads must divide the head count of q and of k)"
        )
    if isinstance(enc, _ROTARY):
        return "rotary"
    if isinstance(enc, _BIASES):
        if enc.num_heads != num_heads:
            raise InputError(
                f"the bias encoding has {enc.num_heads} heads, attention has {num_heads}"
            )
        return "bias"
    if isinstance(enc, CoPE):
        if enc.head_dim != head_dim:
            raise InputError(f"CoPE has head_dim {enc.head_dim}, attention has {head_dim}")
        return "cope"
    names = ", ".join(c.__name__ for c in (XPos, *_ROTARY, *_BIASES, CoPE))
    raise InputError(
        f"encoding must be a name ({', '.join(ATTENTION_ENCODINGS)}), a posemb encoding module "
        f"({names}) or None, got {type(enc).__name__}"
    )


def _check_padding(pad: object, b: int, k_len: int) -> torch.Tensor | None:
    if pad is None:
        return None
    if not isinstance(pad, torch.Tensor) or pad.dtype != torch.bool or pad.shape != (b, k_len):
        raise InputError(
            f"key_padding_mask must be a bool tensor of shape ({b}, {k_len}), True at "
            f"padding, got {getattr(pad, 'dtype', type(pad).__name__)} "
            f"{tuple(getattr(pad, 'shape', ()))}"
        )
    return pad


def _as_bias(attn: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor | None:
    """An SDPA mask as a logits bias: a bool mask ("may attend") becomes 0 or -inf."""
    if attn is None or attn.dtype != torch.bool:
        return attn
    bias = torch.zeros(attn.shape, dtype=_checks.compute_dtype(q), device=q.device)
    return bias.masked_fill(~attn, float("-inf"))


def _visible(mask: torch.Tensor | None, causal: bool, q_len: int, k_len: int) -> torch.Tensor:
    """``(batch or 1, q_len)`` counts of the keys each query may see (SSMax's n)."""
    if mask is not None:
        return mask.sum(dim=-1).amax(dim=1)  # a mask is (b or 1, 1, q, k)
    if causal:  # default positions: query i (of the last q_len) sees keys 0..i
        return torch.arange(k_len - q_len + 1, k_len + 1)[None]
    return torch.full((1, q_len), k_len)


def _cope_bias(
    cope: CoPE, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """CoPE's logits for this call, with -inf where ``mask`` (bool) hides a key."""
    dt = _checks.compute_dtype(q)
    kk = k.to(dt).repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    logits = torch.matmul(q.to(dt), kk.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    return cope(q, logits).to(q.dtype)


def _append_sink(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn: torch.Tensor | None,
    is_causal: bool,
    sinks: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """k, v and a float bias with one more key: a zero key (logit 0) and a zero value, biased
    by each head's sink logit, so that SDPA's softmax includes the sink and its output gains
    nothing from it; exactly the sink column of :func:`attention_probs`."""
    b, h, q_len, _ = q.shape
    k_len = k.shape[2]
    sinks = _check_sinks(sinks, h)
    bias = _as_bias(attn, q)
    if bias is None:
        bias = torch.zeros((1, 1, q_len, k_len), dtype=_checks.compute_dtype(q), device=q.device)
        if is_causal:
            i = torch.arange(q_len, device=q.device)[:, None] + (k_len - q_len)
            bias = bias.masked_fill(torch.arange(k_len, device=q.device) > i, float("-inf"))
    bias = bias.expand(b, h, q_len, k_len)
    col = sinks.to(bias.dtype)[None, :, None, None].expand(b, h, q_len, 1)
    zero_k = k.new_zeros((*k.shape[:2], 1, k.shape[3]))
    zero_v = v.new_zeros((*v.shape[:2], 1, v.shape[3]))
    attn_sink = torch.cat([bias, col], dim=-1).to(q.dtype)
    return torch.cat([k, zero_k], dim=2), torch.cat([v, zero_v], dim=2), attn_sink


def _query_factor(
    temperature: QueryTemperature | ScalableSoftmax | None,
    q: torch.Tensor,
    positions: torch.Tensor,
    mask: torch.Tensor | None,
    causal: bool,
    k_len: int,
) -> torch.Tensor | None:
    """What each query ``(batch, heads, q_len, head_dim)`` is multiplied by, broadcastable to
    ``(batch, heads, q_len, 1)`` in float32 (float64 for float64 q); None without one.

    A :class:`QueryTemperature` is taken at the query positions ``(q_len,)`` or ``(1 or batch,
    q_len)``; :class:`ScalableSoftmax` at the number of keys each query sees. Kept in the wider
    dtype so that a half-precision q is rounded once, not twice.
    """
    if temperature is None:
        return None
    dt = _checks.compute_dtype(q)
    if isinstance(temperature, ScalableSoftmax):
        visible = _visible(mask, causal, q.shape[2], k_len).to(q.device)
        return temperature.factor(visible).to(dt)[..., None]  # (b or 1, heads, q_len, 1)
    f = temperature.factor(positions, dtype=dt)
    return f[:, None, :, None] if f.dim() == 2 else f[None, None, :, None]
