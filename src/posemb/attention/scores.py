"""What each encoding adds to the attention logits, said for the positions of a call: the score
functions the blocked core (:mod:`.core`) evaluates per call and FlexAttention
(:mod:`.flex`) evaluates per element.

A score depends on the query position ``i`` and the key position ``j``. Most depend on the
distance ``d = i - j`` alone, and say so with :meth:`Score.table` (per head, the score at each
distance a call spans: O(L) memory, however long the call); FIRE's normaliser depends on the
query's own position, so it says its score per tile with :meth:`Score.tile`. Causality and a
sliding window are scores too (``-inf`` where a key is hidden), folded into the same table.
Every method is plain torch, differentiable in the encoding's parameters: the core's backward
reduces each call's logit gradients into the table (or the tile) and autograd takes it from
there to T5's buckets, FIRE's MLP or KERPLE's r1 and r2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..bias import AlibiBias, FireBias, KerpleBias, T5Bias, kerple_bias, t5_relative_bucket

INF = float("inf")


@dataclass(frozen=True)
class Visible:
    """Which distances ``d = i - j`` a query may attend to: ``causal`` hides ``d < 0``, a
    ``window`` w hides ``d >= w`` (and ``|d| >= w`` without ``causal``)."""

    causal: bool = True
    window: int | None = None

    def hidden(self, d: torch.Tensor) -> torch.Tensor | None:
        """Bool, True where the distance ``d`` (any shape) is hidden; None for none."""
        out = None
        if self.causal:
            out = d < 0
        if self.window is not None:
            far = d >= self.window if self.causal else d.abs() >= self.window
            out = far if out is None else out | far
        return out

    def span(self) -> tuple[float, float]:
        """The lowest and highest distance seen (inclusive; +-inf for none)."""
        lo = 0.0 if self.causal else -INF
        hi = INF
        if self.window is not None:
            hi = float(self.window - 1)
            lo = lo if self.causal else -hi
        return lo, hi


class Score:
    """An encoding's additive score. Subclasses set :attr:`distance_only` and implement
    :meth:`table` (distance-only) or :meth:`tile`; :attr:`module` holds the parameters."""

    distance_only: bool = True
    num_heads: int
    # The encoding module whose parameters the score reads (typed loosely: each subclass
    # knows its own).
    module: Any = None

    def parameters(self) -> list[torch.Tensor]:
        """The tensors the score is differentiable in (those that require grad)."""
        if self.module is None:
            return []
        return [p for p in self.module.parameters() if p.requires_grad]

    def table(self, d: torch.Tensor) -> torch.Tensor:
        """``(heads, n)``: the score at integer distances ``d`` ``(n,)``, in float32 or wider."""
        raise NotImplementedError

    def tile(self, qp: torch.Tensor, kp: torch.Tensor) -> torch.Tensor:
        """``(B, heads, R, C)``: the score of queries at ``qp`` ``(B, R)`` and keys at ``kp``
        ``(B, C)`` (B may be 1 on either side)."""
        d = qp.unsqueeze(-1) - kp.unsqueeze(-2)  # (B, R, C)
        lo = int(d.min())
        values = self.table(torch.arange(lo, int(d.max()) + 1, device=d.device))
        return values[:, d - lo].movedim(0, 1)  # (B, heads, R, C)

    def release(self) -> None:
        """Let go of what the score keeps between its tiles (a call's end)."""

    def param_grads(
        self, qp: torch.Tensor, kp: torch.Tensor, ds: torch.Tensor
    ) -> list[torch.Tensor | None]:
        """What the logit gradients ``ds`` ``(B or 1, heads, R, C)`` of the tile at ``qp``
        and ``kp`` give each of :meth:`parameters` (None where one is unused): by autograd
        through :meth:`tile`."""
        wanted = self.parameters()
        if not wanted:
            return []
        with torch.enable_grad():
            tile = self.tile(qp, kp)
            if tile.shape[0] == 1 and ds.shape[0] > 1:
                ds = ds.sum(0, keepdim=True)
            return list(torch.autograd.grad(tile, wanted, ds.to(tile.dtype), allow_unused=True))


class NoScore(Score):
    """No score (RoPE, NoPE): zeros, for the causality and window folded in."""

    def __init__(self, num_heads: int, dtype: torch.dtype = torch.float32) -> None:
        self.num_heads, self.dtype = num_heads, dtype

    def table(self, d: torch.Tensor) -> torch.Tensor:
        return torch.zeros((self.num_heads, d.numel()), dtype=self.dtype, device=d.device)


class Alibi(Score):
    """ALiBi, ``-m_h |d|`` (Press et al. 2022): the module's slopes."""

    def __init__(self, module: AlibiBias) -> None:
        self.module, self.num_heads = module, module.num_heads

    def table(self, d: torch.Tensor) -> torch.Tensor:
        m = self.module.slopes
        dt = torch.promote_types(m.dtype, torch.float32)
        return -m.to(dt)[:, None] * d.abs().to(dt)[None]


class T5(Score):
    """T5's learned bucket per head (Raffel et al. 2020), ``weight[bucket(-d)]``."""

    def __init__(self, module: T5Bias) -> None:
        self.module, self.num_heads = module, module.num_heads

    def table(self, d: torch.Tensor) -> torch.Tensor:
        t5 = self.module
        buckets = t5_relative_bucket(-d, t5.bidirectional, t5.num_buckets, t5.max_distance)
        return t5.weight[buckets].T  # (heads, n)


class Kerple(Score):
    """KERPLE's log or power kernel (Chi et al. 2022) of ``|d|``."""

    def __init__(self, module: KerpleBias) -> None:
        self.module, self.num_heads = module, module.num_heads

    def table(self, d: torch.Tensor) -> torch.Tensor:
        k = self.module
        z = torch.zeros(1, dtype=torch.int64, device=d.device)
        return kerple_bias(k.r1, k.r2, d, z, k.kind)[0, :, :, 0]  # (heads, n)


class Fire(Score):
    """FIRE (Li et al. 2023), ``f(psi(|d|) / psi(max(L, i)))`` with ``psi(x) = log(1 + c x)``:
    its normaliser depends on the query's position, so it is said per tile, not per distance.

    ``f`` is the module's MLP, ``W2 relu(W1 x + b1) + b2`` on one input: a continuous
    piecewise-linear function whose pieces change where a hidden unit turns on or off (at
    most one breakpoint per unit). A tile reads ``A_p x + B_p`` for the piece p its x falls
    in, each piece's slope and intercept summed once from the units it has on (a handful of
    numbers per head), not the 32 hidden values of every pair: the same function, a few
    roundings apart, for a fraction of the memory traffic. The core's backward takes a tile's
    logit gradients to every parameter with :meth:`param_grads` (no graph over the tile); a
    tile made where a graph is recorded (a backward that is differentiated again) goes
    through autograd.
    """

    distance_only = False

    def __init__(self, module: FireBias) -> None:
        self.module, self.num_heads = module, module.num_heads
        # The pieces, read once per attention call where nothing records a graph (the score
        # object lives for one call); made anew for each tile a graph runs through.
        self._memo: tuple[torch.Tensor, ...] | None = None
        self._buffers: dict[str, torch.Tensor] = {}
        # The last tile's positions and x (see _x_of).
        self._last: tuple[torch.Tensor, ...] | None = None

    def tile(self, qp: torch.Tensor, kp: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return self._tile_into(qp, kp)
        x = self._x(qp, kp)
        breaks, slope, intercept = self.pieces()
        piece = pieces_of(x.detach().reshape(-1), breaks)
        return _PieceLookup.apply(x, slope, intercept, piece).movedim(0, 1)

    def _x(self, qp: torch.Tensor, kp: torch.Tensor) -> torch.Tensor:
        """The MLP's input ``psi(|d|) / psi(max(qp, L))``, ``(B, R, C)``, in the MLP's dtype."""
        dt, c, norm = self._norm(qp)
        if torch.is_grad_enabled():
            dist = (qp.unsqueeze(-1) - kp.unsqueeze(-2)).abs().to(dt)
            return torch.log1p(c * dist) / norm.unsqueeze(-1)
        # The same operations in place: one tile-sized temporary at a time (peak memory).
        dist = (qp.unsqueeze(-1) - kp.unsqueeze(-2)).abs_()
        return dist.to(dt).mul_(c).log1p_().div_(norm.unsqueeze(-1))

    def _norm(self, qp: torch.Tensor) -> tuple[torch.dtype, torch.Tensor, torch.Tensor]:
        """The MLP's dtype, ``|c|`` and each query's normaliser ``psi(max(qp, |L|))`` ``(B, R)``,
        made as the module makes them (ties at the threshold split as its backward splits)."""
        fire = self.module
        dt = fire.c.dtype
        c = fire.c.abs()
        return dt, c, torch.log1p(c * torch.maximum(qp.to(dt), fire.threshold.abs()))

    def _pieces_once(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self._memo is None:
            with torch.no_grad():
                self._memo = self.pieces()
        return self._memo  # type: ignore[return-value]

    def _x_of(self, qp: torch.Tensor, kp: torch.Tensor) -> torch.Tensor:
        """The tile's x ``(B, R, C)``, nothing recorded; the last tile's is kept, as the
        backward reads each call's tile twice (its mask, then the gradients)."""
        last = self._last
        if last is not None and _same(last[0], qp) and _same(last[1], kp):
            return last[2]
        with torch.no_grad():
            x = self._x(qp, kp)
        self._last = (qp.clone(), kp.clone(), x)
        return x

    def _lookup(self, qp: torch.Tensor, kp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The tile's x ``(B, R, C)`` and each pair's piece ``(B * R * C,)``, nothing recorded.
        Only the breakpoints within x's range are looked up (the others are below or above
        every value: a constant count), so a far breakpoint of an untrained MLP does not
        coarsen the lookup's cells."""
        breaks = self._pieces_once()[0]
        x = self._x_of(qp, kp)
        flat = x.reshape(-1)
        lo, hi = torch.aminmax(flat) if flat.numel() else (flat.new_zeros(()),) * 2
        if not bool(torch.isfinite(lo) & torch.isfinite(hi)):
            return x, torch.searchsorted(breaks, flat)
        below = int((breaks < lo).sum())
        inside = breaks[below : int((breaks < hi).sum())]
        return x, pieces_of(flat, inside).add_(below)

    def _tile_into(self, qp: torch.Tensor, kp: torch.Tensor) -> torch.Tensor:
        """:meth:`tile` where nothing records a graph, into a buffer of this score's: the
        tile is valid until the next one. Each fresh tile-sized tensor costs its page faults
        (~1 ms for 4 MiB here, as much as the lookup itself); a reused one does not. On the
        CPU, the fused op writes it in one pass (``csrc/fire.cpp``)."""
        breaks, slope, intercept = self._pieces_once()
        heads = slope.shape[1]
        if _fused(slope, self.module.c):
            x = self._x_of(qp, kp)
            b, n = x.shape[0], x[0].numel()
            out = self._buffer("tile", b * heads * n, x.dtype).view(b, heads, n)
            torch.ops.posemb._fire_tile_cpu(x.reshape(b, n), breaks, slope, intercept, out)
            return out.view(b, heads, *x.shape[1:])
        x, piece = self._lookup(qp, kp)
        n = piece.numel()
        out = self._buffer("tile", heads * n, slope.dtype).view(heads, n)
        part = self._buffer("part", heads * n, slope.dtype).view(heads, n)
        torch.index_select(intercept.T.contiguous(), 1, piece, out=out)
        torch.index_select(slope.T.contiguous(), 1, piece, out=part)
        out.addcmul_(part, x.reshape(1, -1))
        return out.view(heads, *x.shape).movedim(0, 1)

    def release(self) -> None:
        # The buffers would otherwise live from the forward to the backward: 4 MiB a layer.
        self._buffers.clear()
        self._last = None

    def _buffer(self, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A flat buffer of at least ``numel`` elements, kept for the score's next tile."""
        have = self._buffers.get(name)
        if have is None or have.numel() < numel or have.dtype != dtype:
            have = torch.empty(numel, dtype=dtype, device=self.module.c.device)
            self._buffers[name] = have
        return have[:numel]

    def param_grads(
        self, qp: torch.Tensor, kp: torch.Tensor, ds: torch.Tensor
    ) -> list[torch.Tensor | None]:
        """What the tile's logit gradients ``ds`` ``(B or 1, heads, R, C)`` give each of
        :meth:`parameters`, with no graph over the tile and few tile-sized temporaries (the
        backward's peak memory): each piece's slope and intercept gradient summed in float64
        (see :class:`_PieceLookup`); x's gradient ``g = sum_h ds_h A_h`` taken to ``c`` and the
        threshold through per-row sums (:meth:`_x_surrogate`)."""
        wanted = self.parameters()
        if not wanted:
            return []
        breaks, slope, _ = self._pieces_once()
        x = self._x_of(qp, kp)
        if x.shape[0] == 1 and ds.shape[0] > 1:
            ds = ds.sum(0, keepdim=True)
        ds = ds.expand(x.shape[0], *ds.shape[1:])
        if _fused(slope, x):
            heads, (b, n) = slope.shape[1], (x.shape[0], x[0].numel())
            flat = ds.to(x.dtype).reshape(b, heads, n).contiguous()
            d_x, sums = torch.ops.posemb._fire_grads_cpu(flat, x.reshape(b, n), breaks, slope)
            d_slope, d_intercept = sums[0], sums[1]
        else:
            d_x, d_slope, d_intercept = self._grads_by_lookup(qp, kp, ds)
        with torch.enable_grad():
            _, slope, intercept = self.pieces()
            through_x = self._x_surrogate(qp, kp, x, d_x.view_as(x))
            pairs = [
                (out, g)
                for out, g in (
                    (slope, d_slope.to(slope.dtype)),
                    (intercept, d_intercept.to(slope.dtype)),
                    (through_x, torch.ones_like(through_x)),
                )
                if out.requires_grad  # a frozen MLP (or c and threshold) makes no graph
            ]
            if not pairs:
                return [None] * len(wanted)
            outs, grads = zip(*pairs, strict=True)
            return list(torch.autograd.grad(outs, wanted, grads, allow_unused=True))

    def _grads_by_lookup(
        self, qp: torch.Tensor, kp: torch.Tensor, ds: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`param_grads`' sums in torch: ``d_x`` ``(B * R * C,)``, and per piece and
        head the slope's and the intercept's gradient (float64)."""
        x, piece = self._lookup(qp, kp)
        slope = self._pieces_once()[1]
        heads, n = slope.shape[1], piece.numel()
        flat = ds.movedim(1, 0).reshape(heads, n)
        d_x = torch.zeros(n, dtype=x.dtype, device=x.device)
        for h in range(heads):  # a head at a time: no (heads, n) buffer beside the tile's
            d_x.addcmul_(flat[h].to(x.dtype), slope[:, h].take(piece))
        d_slope, d_intercept = _piece_sums(flat, x.reshape(-1), piece, slope.shape[0], self)
        return d_x, d_slope, d_intercept

    def _x_surrogate(
        self, qp: torch.Tensor, kp: torch.Tensor, x: torch.Tensor, d_x: torch.Tensor
    ) -> torch.Tensor:
        """A scalar whose gradient in ``c`` and the threshold is ``sum d_x * dx/dtheta``, its
        graph over rows only. With ``x = u / n_i``, ``u = log1p(c |d|)``, ``n_i = log1p(c
        max(qp_i, L))``: ``sum_j d_x dx/dtheta = a_i / n_i du/dc - b_i / n_i dn_i/dtheta``,
        where ``a_i = sum_j d_x |d| / (1 + c |d|)`` and ``b_i = sum_j d_x x`` are taken without
        a graph; ``c a_i / n_i`` and ``b_i log n_i`` then give autograd the rest (n_i made as
        the module makes it, so ties at the threshold split as its backward splits them)."""
        dt, c, norm = self._norm(qp)
        with torch.no_grad():
            dist = (qp.unsqueeze(-1) - kp.unsqueeze(-2)).abs_().to(dt)
            factor = torch.mul(dist, c).add_(1).reciprocal_().mul_(dist).mul_(d_x)
            a = factor.sum(-1)  # (B, R)
            del factor
            b = torch.mul(d_x, x).sum(-1)
        return (c * (a / norm.detach())).sum() - (b * norm.log()).sum()

    def pieces(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The MLP as pieces: breakpoints ``(m,)`` increasing, and per piece (``m + 1``) the
        slope and intercept ``(m + 1, heads)`` (differentiable in the MLP's parameters)."""
        first, last = self.module.mlp[0], self.module.mlp[2]
        w1, b1 = first.weight[:, 0], first.bias  # (hidden,)
        with torch.no_grad():
            turning = w1 != 0
            breaks = (-b1[turning] / w1[turning]).unique()  # sorted
            # One point inside each piece: between breakpoints, and beyond either end.
            inner = (breaks[1:] + breaks[:-1]) / 2
            ends = torch.stack((breaks[:1] - 1, breaks[-1:] + 1)) if breaks.numel() else None
            if ends is None:
                probe = torch.zeros(1, dtype=w1.dtype, device=w1.device)
            else:
                probe = torch.cat((ends[0], inner, ends[1]))
            on = (probe[:, None] * w1 + b1 > 0).to(w1.dtype)  # (pieces, hidden)
        slope = (on * w1) @ last.weight.T  # (pieces, heads)
        intercept = (on * b1) @ last.weight.T + last.bias
        return breaks, slope, intercept


class _PieceLookup(torch.autograd.Function):
    """``slope[piece] * x + intercept[piece]`` per head, ``(heads, *x.shape)``.

    Its backward sums each piece's gradient over every pair of the tile that falls in it:
    ``index_add`` adds ~10^5-10^6 terms per slot one after another, which in float32 left the
    MLP's gradient ~100 roundoffs off (10x the explicit path's error); the sums are taken in
    float64. Written in differentiable ops, so second derivatives go through it."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, slope: torch.Tensor, intercept: torch.Tensor, piece: torch.Tensor
    ) -> torch.Tensor:
        ctx.save_for_backward(x, slope, piece)
        # index_select along a tiny table's columns: ~5x the speed of advanced indexing.
        a = torch.index_select(slope.T, 1, piece).view(-1, *x.shape)  # (heads, *x.shape)
        b = torch.index_select(intercept.T, 1, piece).view(-1, *x.shape)
        return torch.addcmul(b, a, x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, slope, piece = ctx.saved_tensors
        heads = g.shape[0]
        flat = g.reshape(heads, -1)
        gx = gs = gi = None
        if ctx.needs_input_grad[0]:
            gx = (torch.index_select(slope.T, 1, piece).view_as(g) * g).sum(0)
        wide = torch.float64 if g.device.type != "mps" else torch.float32  # (MPS has none)
        room = torch.zeros(heads, slope.shape[0], dtype=wide, device=g.device)
        if ctx.needs_input_grad[1]:
            terms = (flat * x.reshape(1, -1)).to(wide)
            gs = room.index_add(1, piece, terms).T.to(slope.dtype)
        if ctx.needs_input_grad[2]:
            gi = room.index_add(1, piece, flat.to(wide)).T.to(slope.dtype)
        return gx, gs, gi, None


def _fused(pieces: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether the fused CPU op (``csrc/fire.cpp``) takes a tile: the pieces and x in one
    dtype, float32 or float64, on the CPU, where posemb's library loads (else torch)."""
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
        return False
    if pieces.dtype != x.dtype or pieces.device != x.device:
        return False
    if _FUSED_OFF:
        return False
    from ..kernels import cpu

    return cpu.load(announce=False) is not None and hasattr(torch.ops.posemb, "_fire_tile_cpu")


# Set by the tests to hold the torch path to the op.
_FUSED_OFF = False


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.device == b.device and bool(torch.equal(a, b))


def _piece_sums(
    flat: torch.Tensor, x: torch.Tensor, piece: torch.Tensor, pieces: int, owner: Fire
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per piece and head, ``sum ds * x`` and ``sum ds`` over the pairs in the piece
    ``(pieces, heads)``, in float64 (MPS: float32): ``flat`` ``(heads, n)``, ``x`` and
    ``piece`` ``(n,)``. The widened copy is a reused buffer, taken a chunk at a time."""
    heads, n = flat.shape
    wide = torch.float64 if flat.device.type != "mps" else torch.float32
    room = torch.zeros(2, heads, pieces * _SPREAD, dtype=wide, device=flat.device)
    step = max(1, _SUM_CHUNK // max(1, heads))
    spread = torch.arange(min(n, step), device=flat.device) % _SPREAD
    for a in range(0, n, step):
        b = min(n, a + step)
        slot = piece[a:b] * _SPREAD + spread[: b - a]
        terms = owner._buffer("wide", heads * (b - a), wide).view(heads, b - a)
        terms.copy_(flat[:, a:b])
        room[1].index_add_(1, slot, terms)
        terms.mul_(x[a:b].to(wide))
        room[0].index_add_(1, slot, terms)
    sums = room.view(2, heads, pieces, _SPREAD).sum(-1)
    return sums[0].T, sums[1].T


# Pairs of a piece come in runs (x grows along a row), so adding each into one slot waits on
# the previous add to it; neighbours go to _SPREAD slots per piece, summed at the end (2.6x
# faster here).
_SPREAD = 8


# Elements of the float64 copy :func:`_piece_sums` holds at once (512 KiB).
_SUM_CHUNK = 1 << 16

# Cells of the lookup that finds a value's piece (pieces_of): fine enough that no two of a
# trained MLP's breakpoints share one, coarse enough to stay in cache.
_CELLS = 4096


def pieces_of(x: torch.Tensor, breaks: torch.Tensor) -> torch.Tensor:
    """``torch.searchsorted(breaks, x)`` (the number of breakpoints below each value), by a
    lookup: ~6 cheap passes over x where a binary search over a few dozen breakpoints cost
    ~16 ns a value on this project's CPU. The breakpoints' span is cut into :data:`_CELLS`
    equal cells; a cell holds the count of breakpoints below it and the one breakpoint inside
    it (if any), which the value is compared with. A value a rounding from a cell's edge may
    read the cell next to it; where a breakpoint sits there too it may then take the piece on
    the other side of it, which FIRE's function (continuous at its breakpoints) gives the same
    value for. Where two breakpoints share a cell, the binary search runs. The cells are
    found in float32 or wider (bfloat16 cannot hold the last cell's number, 4095); a NaN
    counts every breakpoint, as in searchsorted."""
    if breaks.numel() == 0:
        return torch.zeros(x.shape, dtype=torch.int64, device=x.device)
    wide = torch.promote_types(x.dtype, torch.float32)
    lo = float(breaks[0]) - 1.0
    width = (float(breaks[-1]) + 1.0 - lo) / _CELLS
    cell = ((breaks.to(wide) - lo) / width).floor().clamp(0, _CELLS - 1).long()
    if cell.numel() > 1 and bool((cell[1:] == cell[:-1]).any()):
        return torch.searchsorted(breaks.to(x.dtype), x)
    below = torch.searchsorted(cell, torch.arange(_CELLS, device=x.device))  # cells < j
    inside = torch.full((_CELLS,), float("inf"), dtype=x.dtype, device=x.device)
    inside[cell] = breaks.to(x.dtype)
    at = ((x.to(wide) - lo) / width).floor_().nan_to_num_(0.0).clamp_(0, _CELLS - 1).long()
    got = torch.index_select(below, 0, at) + (x > torch.index_select(inside, 0, at))
    nan = torch.isnan(x)
    return got.masked_fill_(nan, breaks.numel()) if bool(nan.any()) else got


def score_of(encoding: nn.Module | None, num_heads: int) -> Score:
    """The score of a posemb bias encoding (NoScore for a rotary one or none)."""
    if isinstance(encoding, AlibiBias):
        return Alibi(encoding)
    if isinstance(encoding, T5Bias):
        return T5(encoding)
    if isinstance(encoding, KerpleBias):
        return Kerple(encoding)
    if isinstance(encoding, FireBias):
        return Fire(encoding)
    return NoScore(num_heads)


__all__ = ["T5", "Alibi", "Fire", "Kerple", "NoScore", "Score", "Visible", "score_of"]
