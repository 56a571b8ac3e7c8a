"""Relative encodings that add a bias to the attention logits, and position sampling.

logits[h, i, j] = q_i . k_j / sqrt(d) + bias[h, i, j], where the bias depends on the query and
key positions only. Every function here builds the bias for the positions at hand: there is no
``max_len x max_len`` buffer, so any length works and memory follows the actual shapes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from . import _checks
from ._errors import InputError


def _pos(name: str, value: object) -> torch.Tensor:
    """Positions ``(len,)`` or ``(batch, len)`` as an int64 tensor (any length: a bias is built
    for the call's own query and key positions)."""
    return _checks.positions(value, max_dim=2, name=name).to(torch.int64)


def relative_positions(q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
    """``k_pos[j] - q_pos[i]`` for every query i and key j.

    Args:
        q_positions: ``(q_len,)`` or ``(batch, q_len)`` integers.
        k_positions: ``(k_len,)`` or ``(batch, k_len)`` integers.

    Returns:
        int64 ``(q_len, k_len)`` or ``(batch, q_len, k_len)``; negative for keys in the past.
    """
    q, k = _pos("q_positions", q_positions), _pos("k_positions", k_positions)
    if q.dim() == k.dim() == 2 and 1 not in (q.shape[0], k.shape[0]) and q.shape[0] != k.shape[0]:
        raise InputError(
            f"q_positions and k_positions must have one batch (or 1), got {q.shape[0]} and "
            f"{k.shape[0]}"
        )
    # Near 2^62 the difference overflowed int64 (ALiBi gave +5.8e17, T5 an IndexError).
    _checks.within_limit("q_positions", q)
    _checks.within_limit("k_positions", k)
    return k.unsqueeze(-2) - q.unsqueeze(-1)


# --- ALiBi ---------------------------------------------------------------------------------------


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """Per-head ALiBi slopes m_h (Press et al. 2022, "Train Short, Test Long", section 3).

    For n heads, a power of two, the slopes are the geometric sequence starting at
    2^(-8/n) with that same ratio: 2^(-8/n), 2^(-16/n), ..., 2^-8. For other counts the
    official code takes the slopes of the nearest lower power of two, 2^k, and adds every other
    slope of 2^(k+1) heads until there are n: 12 heads are the 8-head slopes 2^-1 .. 2^-8 plus
    2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5.

    Args:
        num_heads: number of attention heads, >= 1.

    Returns:
        float64 tensor ``(num_heads,)``.
    """
    n = _checks.positive_int("num_heads", num_heads)

    def geometric(count: int) -> list[float]:
        start = 2.0 ** (-8.0 / count)
        return [start ** (i + 1) for i in range(count)]

    lower = 1 << (n.bit_length() - 1)  # the largest power of two <= n
    slopes = geometric(lower)
    if lower < n:
        slopes += geometric(2 * lower)[0::2][: n - lower]
    return torch.tensor(slopes, dtype=torch.float64)


def alibi_bias(
    slopes: torch.Tensor, q_positions: torch.Tensor, k_positions: torch.Tensor
) -> torch.Tensor:
    """ALiBi bias -m_h |k_pos - q_pos| (Press et al. 2022, eq. in section 3).

    Symmetric in the distance, so the same call serves causal attention (where only keys in
    the past are visible) and bidirectional use. Not scaled by 1/sqrt(d): it is added after
    the scaled dot product. The product is formed in float32 (float64 for float64 slopes) and
    rounded once to the slopes' dtype, so half-precision slopes do not also round distances.

    Args:
        slopes: ``(heads,)`` from :func:`alibi_slopes`; its dtype is the output's.
        q_positions: ``(len,)`` or ``(batch, len)`` integers.
        k_positions: the same, for the keys.

    Returns:
        ``(1 or batch, heads, q_len, k_len)`` in ``slopes``' dtype, on its device.
    """
    m = _checks.float_tensor("slopes", slopes)
    if m.dim() != 1:
        raise InputError(f"slopes must have shape (heads,), got {tuple(m.shape)}")
    rel = relative_positions(q_positions, k_positions).to(m.device).abs()
    if rel.dim() == 2:
        rel = rel[None]
    dt = _checks.compute_dtype(m)
    return (-m.to(dt)[None, :, None, None] * rel[:, None].to(dt)).to(m.dtype)


class AlibiBias(nn.Module):
    """ALiBi as a module: no parameters, the bias for the positions of each call.

    The slopes are a buffer, so they follow ``.to()``/``.cuda()``/``.double()`` and set the
    bias dtype; each move re-forms them from :func:`alibi_slopes` in float64 and rounds once,
    so ``.half().double()`` does not leave half-precision slopes behind. Not in the
    ``state_dict``: they are a function of the head count.

    Args:
        num_heads: number of heads; slopes follow :func:`alibi_slopes`.
    """

    slopes: torch.Tensor

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.num_heads = _checks.positive_int("num_heads", num_heads)
        self.register_buffer(
            "slopes", alibi_slopes(num_heads).to(torch.get_default_dtype()), persistent=False
        )

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> AlibiBias:
        super()._apply(fn, recurse)
        self.slopes = alibi_slopes(self.num_heads).to(self.slopes.device, self.slopes.dtype)
        return self

    def forward(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """The bias for these positions, in the slopes' dtype.

        ``q_positions`` is ``(q_len,)`` or ``(batch, q_len)``, ``k_positions`` likewise with
        k_len; the bias is ``(batch, heads, q_len, k_len)``, with batch 1 for 1-D positions.
        """
        return alibi_bias(self.slopes, q_positions, k_positions)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"


# --- T5 ------------------------------------------------------------------------------------------


def _check_buckets(num_buckets: object, max_distance: object, bidirectional: bool) -> int:
    nb = _checks.positive_int("num_buckets", num_buckets)
    if nb < 2 or (bidirectional and nb < 4):
        need = 4 if bidirectional else 2
        raise InputError(
            f"num_buckets must be >= {need} ({'half per direction, ' if bidirectional else ''}"
            f"half of those exact), got {nb}"
        )
    md = _checks.positive_int("max_distance", max_distance)
    exact = (nb // 2 if bidirectional else nb) // 2
    if md <= exact:
        raise InputError(
            f"max_distance must exceed the {exact} exact buckets (num_buckets={nb}"
            f"{', bidirectional' if bidirectional else ''}): the log-spaced buckets span "
            f"distances {exact}..max_distance; got max_distance={md}"
        )
    return nb


def t5_relative_bucket(
    relative_position: torch.Tensor,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> torch.Tensor:
    """T5's relative-position buckets (Raffel et al. 2020, section 2.1; their Mesh TensorFlow code).

    Distances below half the buckets (per direction) get a bucket each; larger ones share
    log-spaced buckets up to ``max_distance``, beyond which all fall in the last bucket.
    Bidirectional attention gives keys after the query their own half of the buckets. The
    arithmetic (float32 log, truncation) is T5's, so buckets are identical to ``transformers``'.

    Args:
        relative_position: integer ``k_pos - q_pos``, any shape.
        bidirectional: separate buckets for keys after the query (encoders); causal otherwise.
        num_buckets: total buckets (>= 4 bidirectional, >= 2 causal).
        max_distance: distance where the last bucket starts; > the exact buckets.

    Returns:
        int64 buckets, same shape, in ``[0, num_buckets)``.
    """
    rel = _checks.positions(relative_position, name="relative_position").to(torch.int64)
    _checks.within_limit("relative_position", rel, 2 * _checks.POSITION_LIMIT)  # no overflow
    nb = _check_buckets(num_buckets, max_distance, bidirectional)
    bucket = torch.zeros_like(rel)
    if bidirectional:
        nb //= 2
        bucket += (rel > 0).to(torch.int64) * nb
        dist = rel.abs()
    else:
        dist = (-rel).clamp(min=0)  # keys in the future all share bucket 0
    exact = nb // 2
    small = dist < exact
    # float32 as in T5: the truncation below must land on the same integers.
    large = exact + (
        torch.log(dist.to(torch.float32) / exact) / math.log(max_distance / exact) * (nb - exact)
    ).to(torch.int64)
    large = large.clamp(max=nb - 1)
    return bucket + torch.where(small, dist, large)


class T5Bias(nn.Module):
    """A learned bias per head and bucket, indexed by :func:`t5_relative_bucket`.

    Args:
        num_heads: heads.
        num_buckets: as in :func:`t5_relative_bucket`.
        max_distance: as in :func:`t5_relative_bucket`.
        bidirectional: as in :func:`t5_relative_bucket` (T5 uses 32 buckets and distance 128,
            bidirectional in the encoder, causal in the decoder).
        init_std: std of the initial biases.
    """

    def __init__(
        self,
        num_heads: int,
        num_buckets: int = 32,
        max_distance: int = 128,
        bidirectional: bool = True,
        init_std: float = 0.02,
    ) -> None:
        super().__init__()
        self.num_heads = _checks.positive_int("num_heads", num_heads)
        _check_buckets(num_buckets, max_distance, bidirectional)
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.bidirectional = bool(bidirectional)
        self.weight = nn.Parameter(torch.empty(num_buckets, num_heads))
        nn.init.normal_(self.weight, std=_checks.number("init_std", init_std, minimum=0.0))

    def forward(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """The learned bias for these positions.

        ``q_positions`` is ``(q_len,)`` or ``(batch, q_len)``, ``k_positions`` likewise with
        k_len; the bias is ``(batch, heads, q_len, k_len)``, with batch 1 for 1-D positions.
        """
        rel = relative_positions(q_positions, k_positions).to(self.weight.device)
        buckets = t5_relative_bucket(rel, self.bidirectional, self.num_buckets, self.max_distance)
        bias = self.weight[buckets]  # (..., q, k, heads)
        if bias.dim() == 3:
            bias = bias[None]
        return bias.permute(0, 3, 1, 2)

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_buckets={self.num_buckets}, "
            f"max_distance={self.max_distance}, bidirectional={self.bidirectional}"
        )


# --- FIRE ----------------------------------------------------------------------------------------


class FireBias(nn.Module):
    """FIRE, Li et al. 2023 ("Functional Interpolation for Relative Positions Improves Long
    Context Transformers"), eq. 4: bias[h, i, j] = f(psi(i - j) / psi(max(L, i)))[h], with
    psi(x) = log(c x + 1) and f a small MLP shared by positions, one output per head.

    The log compresses long distances; dividing by psi of the query position ("progressive
    interpolation") maps every distance into [0, 1], so a longer context never feeds the MLP
    inputs it has not seen; the learned threshold L keeps short contexts from being stretched.
    Architecture as the paper describes it: a two-layer MLP of width 32 with ReLU, learnable
    c and L. The initial c = 0.1 and L = 512 are posemb's choice. For bidirectional use
    the distance is |i - j|; causal attention only sees i >= j.

    Args:
        num_heads: heads.
        hidden: MLP width.
        init_c: initial c (> 0).
        init_threshold: initial L (> 0), in tokens.
    """

    def __init__(
        self, num_heads: int, hidden: int = 32, init_c: float = 0.1, init_threshold: float = 512.0
    ) -> None:
        super().__init__()
        self.num_heads = _checks.positive_int("num_heads", num_heads)
        hidden = _checks.positive_int("hidden", hidden)
        self.c = nn.Parameter(
            torch.tensor(_checks.number("init_c", init_c, minimum=0, strict=True))
        )
        self.threshold = nn.Parameter(
            torch.tensor(_checks.number("init_threshold", init_threshold, minimum=0, strict=True))
        )
        self.mlp = nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, num_heads))

    def forward(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """The learned bias for these positions.

        ``q_positions`` is ``(q_len,)`` or ``(batch, q_len)``, ``k_positions`` likewise with
        k_len; the bias is ``(batch, heads, q_len, k_len)``, with batch 1 for 1-D positions.
        """
        q = _pos("q_positions", q_positions).to(self.c.device)
        dt = self.c.dtype  # the MLP's dtype (float32 unless the module was converted)
        dist = relative_positions(q, k_positions).to(self.c.device).abs().to(dt)
        c = self.c.abs()  # psi must stay increasing whatever sign training gives c

        def psi(x: torch.Tensor) -> torch.Tensor:
            return torch.log1p(c * x)

        norm = psi(torch.maximum(q.to(dt), self.threshold.abs()))
        x = psi(dist) / norm.unsqueeze(-1)
        bias = self.mlp(x.unsqueeze(-1))  # (..., q, k, heads)
        if bias.dim() == 3:
            bias = bias[None]
        return bias.permute(0, 3, 1, 2)


# --- KERPLE --------------------------------------------------------------------------------------

KERPLE_KINDS = ("log", "power")
_KERPLE_EPS = 1e-2  # the authors' code clamps both parameters at 0.01 (chijames/KERPLE)


def kerple_bias(
    r1: torch.Tensor,
    r2: torch.Tensor,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    kind: str = "log",
) -> torch.Tensor:
    """KERPLE's bias (Chi et al. 2022, "KERPLE: Kernelized Relative Positional Embedding for
    Length Extrapolation", NeurIPS 2022, section 4.2, the two shifted kernels it trains with):

        log:    -r1 * log(1 + r2 * |i - j|)        r1, r2 > 0
        power:  -r1 * |i - j| ** r2                r1 > 0, 0 < r2 <= 2

    Both are conditionally positive definite kernels turned into a logits bias; the constant
    shift the paper's derivation adds drops out of the softmax. Formed in float32 (float64 for
    float64 parameters) and returned in ``r1``'s dtype.

    Args:
        r1: ``(heads,)`` positive scales.
        r2: ``(heads,)`` positive rates (log) or exponents in (0, 2] (power).
        q_positions: ``(q_len,)`` or ``(batch, q_len)`` integers.
        k_positions: the same, for the keys.
        kind: "log" or "power".

    Returns:
        ``(1 or batch, heads, q_len, k_len)``; 0 on the diagonal, negative elsewhere.
    """
    if kind not in KERPLE_KINDS:
        raise InputError(f"kind must be one of {', '.join(KERPLE_KINDS)}, got {kind!r}")
    a = _checks.float_tensor("r1", r1)
    b = _checks.float_tensor("r2", r2)
    if a.dim() != 1 or b.shape != a.shape:
        raise InputError(
            f"r1 and r2 must both have shape (heads,), got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    if not _checks.tracing():  # the kernels' ranges; a traced graph cannot read the values
        top = 2.0 if kind == "power" else math.inf
        if not bool((a > 0).all()) or not bool(((b > 0) & (b <= top)).all()):
            raise InputError(
                f"KERPLE-{kind} needs r1 > 0 and "
                f"{'0 < r2 <= 2' if kind == 'power' else 'r2 > 0'}, got r1 {a.tolist()} and "
                f"r2 {b.tolist()}"
            )
    dt = _checks.compute_dtype(a)
    dist = relative_positions(q_positions, k_positions).to(a.device).abs().to(dt)
    if dist.dim() == 2:
        dist = dist[None]
    dist = dist[:, None]  # (batch, 1, q, k) against (1, heads, 1, 1)
    s1, s2 = a.to(dt)[None, :, None, None], b.to(dt)[None, :, None, None]
    if kind == "log":
        bias = -s1 * torch.log1p(s2 * dist)
    else:
        # 0 ** r2 is 0 with an infinite derivative in r2 at 0: keep the distance-0 entries out
        # of the power so that gradients stay finite.
        safe = torch.where(dist > 0, dist, torch.ones_like(dist))
        bias = torch.where(dist > 0, -s1 * safe**s2, torch.zeros_like(dist * s1))
    return bias.to(a.dtype)


def _inverse_softplus(y: torch.Tensor) -> torch.Tensor:
    return y + torch.log(-torch.expm1(-y))


class KerpleBias(nn.Module):
    """KERPLE as a module: learned positive ``r1``, ``r2`` per head (:func:`kerple_bias`).

    The authors' code keeps each parameter positive by clamping its ``.data`` at 0.01 in every
    forward (and the power's exponent at 2), which mutates state inside ``forward`` and stops
    the gradient at the clamp. posemb keeps unconstrained parameters and maps them:
    ``r = 0.01 + softplus(raw)``, and the power's exponent ``r2 = 0.01 + 1.99 * sigmoid(raw)``,
    so every value the paper allows is reachable and gradients never vanish at a bound. The
    initial values are drawn as the authors draw them: the log kernel's r1 (their p) uniform
    in [0, 2) and r2 (their a) in [0, 1); the power kernel's r1 (a) in [0, 1) and r2 (p) in
    [0, 2); each raised to at least 0.01.

    Args:
        num_heads: heads.
        kind: "log" (the paper's best, KERPLE-log) or "power".
    """

    def __init__(self, num_heads: int, kind: str = "log") -> None:
        super().__init__()
        self.num_heads = _checks.positive_int("num_heads", num_heads)
        if kind not in KERPLE_KINDS:
            raise InputError(f"kind must be one of {', '.join(KERPLE_KINDS)}, got {kind!r}")
        self.kind = kind
        spans = (2.0, 1.0) if kind == "log" else (1.0, 2.0)
        r1, r2 = ((torch.rand(num_heads) * s).clamp(min=_KERPLE_EPS) for s in spans)
        self.raw_r1 = nn.Parameter(self._to_raw(r1, exponent=False))
        self.raw_r2 = nn.Parameter(self._to_raw(r2, exponent=kind == "power"))

    @staticmethod
    def _to_raw(r: torch.Tensor, exponent: bool) -> torch.Tensor:
        # Values at the 0.01 floor would invert to -inf: nudge them just above it.
        r = r.clamp(min=_KERPLE_EPS * 1.001)
        if exponent:
            r = r.clamp(max=2.0 - 1e-3)
            return torch.logit((r - _KERPLE_EPS) / (2.0 - _KERPLE_EPS))
        return _inverse_softplus(r - _KERPLE_EPS)

    @property
    def r1(self) -> torch.Tensor:
        """``(heads,)`` positive scales."""
        return _KERPLE_EPS + torch.nn.functional.softplus(self.raw_r1)

    @property
    def r2(self) -> torch.Tensor:
        """``(heads,)`` positive rates (log) or exponents in (0, 2] (power)."""
        if self.kind == "power":
            return _KERPLE_EPS + (2.0 - _KERPLE_EPS) * torch.sigmoid(self.raw_r2)
        return _KERPLE_EPS + torch.nn.functional.softplus(self.raw_r2)

    def forward(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """The bias for these positions, in the parameters' dtype.

        ``q_positions`` is ``(q_len,)`` or ``(batch, q_len)``, ``k_positions`` likewise with
        k_len; the bias is ``(batch, heads, q_len, k_len)``, with batch 1 for 1-D positions.
        """
        return kerple_bias(self.r1, self.r2, q_positions, k_positions, self.kind)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, kind={self.kind!r}"


# --- randomised positions ------------------------------------------------------------------------


def randomized_positions(
    seq_len: int,
    max_len: int,
    batch: int = 1,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Sorted positions drawn without replacement from ``[0, max_len)`` (Ruoss et al. 2023,
    "Randomized Positional Encodings Boost Length Generalization of Transformers", section 3).

    Training on such positions exposes a model to position values up to ``max_len`` while it
    only ever sees ``seq_len`` tokens, so a longer test sequence brings no unseen values.

    Args:
        seq_len: tokens per sequence.
        max_len: size of the range sampled, >= seq_len; at least the longest length the
            model will be evaluated at.
        batch: independent draws, one per sequence.
        generator: for reproducible draws.

    Returns:
        int64 ``(batch, seq_len)``, increasing along each row.
    """
    n = _checks.positive_int("seq_len", seq_len)
    m = _checks.positive_int("max_len", max_len)
    if m < n:
        raise InputError(f"max_len must be >= seq_len = {n} to draw distinct positions, got {m}")
    _checks.positive_int("batch", batch)
    keys = torch.rand(batch, m, generator=generator)
    picked = keys.topk(n, dim=-1).indices
    return picked.sort(dim=-1).values.to(device)


class RandomizedPositions(nn.Module):
    """Training-time wrapper: sampled sorted positions in training mode, 0..n-1 in eval mode.

    Usable with any encoding that takes positions (RoPE, ALiBi, T5, FIRE, sinusoidal).

    Args:
        max_len: the range positions are drawn from during training.
    """

    def __init__(self, max_len: int) -> None:
        super().__init__()
        self.max_len = _checks.positive_int("max_len", max_len)

    def forward(
        self,
        batch: int,
        seq_len: int,
        device: torch.device | str | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """``(batch, seq_len)`` positions for this step."""
        if self.training:
            return randomized_positions(seq_len, self.max_len, batch, generator, device)
        return torch.arange(seq_len, device=device).expand(batch, seq_len)

    def extra_repr(self) -> str:
        return f"max_len={self.max_len}"
