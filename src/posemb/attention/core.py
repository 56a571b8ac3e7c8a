"""The blocked attention core: softmax attention with any encoding's score, taken as fused
attention calls over blocks of queries and merged exactly by log-sum-exp. No tensor grows
with ``q_len x k_len``: the largest is one call's mask tile, and most calls have none.

**Calls and their merge.** The attention of a block of queries is a sum over ranges of keys:
each range is one fused call of the kernel (:mod:`.kernels`) returning its output and the
log-sum-exp of its rows, and the calls combine exactly, two at a time, each weighed against the
larger log-sum-exp and normalised by the weights' sum (``out = sum_c w_c out_c / sum_c w_c``,
``w_c = exp(lse_c - max lse)``: how flash attention's split-K and ring attention combine). A
per-head attention sink (gpt-oss) is one more term of the merge, with a zero value.

**Scores.** An encoding adds a score to each logit (:mod:`.scores`). Where it depends on the
distance ``d = pos(i) - pos(j)`` alone (ALiBi, T5's buckets, KERPLE, a sliding window,
causality) and the positions are a range, a call's scores are read from one per-head table
over the distances the attention spans (O(L) memory): reversing the call's queries (row
``i' = R - 1 - i``) makes its distance ``Dmax - (i' + j)``, so the mask the kernel reads,
``T[h, Dmax - i' - j]``, is a Hankel matrix: ``as_strided`` over the reversed table, with
strides ``(1, 1)``, zero bytes, causality included (its ``-inf`` is in the table: the part
above the diagonal the kernel then computes is a block's half square, cheaper on this CPU than
a materialised mask under the kernel's causal flag). Elsewhere (FIRE, whose normaliser
depends on the query's position; positions that are not a range; key padding; a bias given
whole; the position sets of a training-free extension) each call's mask is a tile, bounded in
size.

**Backward.** Each call's backward kernel, handed the *merged* output and log-sum-exp,
recomputes that call's share of the merged softmax: the exact gradient for q, k and v on that
call's keys (ring attention's identity). Where a score has learned parameters (or the bias
requires grad) the call's logit gradients are recomputed as an explicit tile and reduced: for a
table, summed along the call's (anti-)diagonals into the gradient of each distance; for a tile
score, through autograd of the tile into the parameters. A sink's gradient is
``-sum_i p_sink(i) rowsum(dO_i * out_i)``. A backward that is itself differentiated
(``create_graph``) recomputes the merged attention from explicit tiles merged out of place, so
second derivatives are autograd's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from . import kernels as _kernels
from .kernels import Kernel, kernel_for
from .masks import Call, Masks, Table, _add_table_grad
from .scores import Visible

INF = float("inf")
# A block's queries: at most this many rows per call (and a masked call's tile at most
# _TILE elements per head, its columns split to stay under it).
_ROWS = 1024
_LEAF = 128
_TILE = 1 << 21
# Queries per block where a table's calls run: small enough that the half square above the
# diagonal each block computes and hides costs little (1/8 more work at 2,048 tokens), large
# enough that a call's fixed cost is spread over many keys.
_SQUARE = 256


# --- plans: which calls ---------------------------------------------------------------------

Block = tuple[int, int, list[Call]]


def square_plan(
    q_len: int, k_len: int, delta: int, visible: Visible, tiles: int | None = None
) -> list[Block]:
    """The calls of a distance-only score on positions that are ranges (row ``r``'s distance
    to key column ``c`` is ``r - c + delta``): per block of :data:`_SQUARE` queries, one
    Hankel call over the keys some row of the block may see (what the others may not is
    ``-inf`` in the table). ``tiles``: where the score is also said per tile (FIRE), the
    block's calls are at most that many columns wide (the tile it adds)."""
    lo_d, hi_d = visible.span()
    blocks = []
    for r0 in range(0, q_len, _SQUARE):
        r1 = min(q_len, r0 + _SQUARE)
        c_lo = 0 if hi_d == INF else max(0, int(r0 + delta - hi_d))
        c_hi = k_len if lo_d == -INF else min(k_len, int(r1 - 1 + delta - lo_d) + 1)
        width = max(1, c_hi - c_lo if tiles is None else tiles)
        calls = [
            Call(0, r0, r1, c, min(c_hi, c + width), "hankel") for c in range(c_lo, c_hi, width)
        ]
        blocks.append((r0, r1, calls))
    return blocks


def range_plan(masks: Masks, q_len: int) -> list[Block]:
    """Each block of :data:`_ROWS` queries ``(r0, r1)`` and its calls (see :func:`_calls`),
    where each query's keys are per-set ranges (:attr:`Masks.starts`)."""
    assert masks.starts is not None
    blocks = []
    for r0 in range(0, q_len, _ROWS):
        r1 = min(q_len, r0 + _ROWS)
        calls: list[Call] = []
        for s in range(len(masks.starts)):
            calls += _calls(masks, s, r0, r1, 0, 1 << 62)
        blocks.append((r0, r1, calls))
    return blocks


def _calls(masks: Masks, s: int, r0: int, r1: int, x0: int, x1: int) -> list[Call]:
    """Set ``s``'s calls for queries ``r0:r1`` over keys ``x0:x1``: an unmasked call over
    the core of columns every row sees whole (none where a score, padding or a bias lies
    there), and the edges on either side split by halving the rows until each half's columns
    are tight (so a masked call computes few pairs it then hides), masked below :data:`_LEAF`
    rows."""
    assert masks.starts is not None and masks.ends is not None
    a = masks.starts[s][:, r0:r1].clip(x0, x1)
    e = masks.ends[s][:, r0:r1].clip(x0, x1)
    live = a < e
    if not live.any():
        return []
    c0, c1 = int(a[live].min()), int(e[live].max())
    lo, hi = int(a.max()), int(e.min())
    if live.all() and hi - lo >= min(_LEAF, c1 - c0) and masks.clear(lo, hi):
        core = [Call(s, r0, r1, lo, hi)]
        return _calls(masks, s, r0, r1, c0, lo) + core + _calls(masks, s, r0, r1, hi, c1)
    if r1 - r0 > _LEAF:
        mid = (r0 + r1) // 2
        return _calls(masks, s, r0, mid, c0, c1) + _calls(masks, s, mid, r1, c0, c1)
    width = max(1, _TILE // max(1, (r1 - r0) * a.shape[0]))
    return [Call(s, r0, r1, x, min(c1, x + width), "tile") for x in range(c0, c1, width)]


# --- the merged attention and its gradients -----------------------------------------------


@dataclass(frozen=True)
class Inputs:
    """How the merged attention's tensor inputs are laid out: each set's queries, each set's
    keys, v, then where present the bias (it requires grad), the table's values (they
    require grad), the sinks ``(heads,)``, and a tile score's parameters."""

    sets: int
    bias: bool = False
    table: bool = False
    sinks: bool = False
    params: int = 0

    def split(self, tensors: Sequence[torch.Tensor]) -> dict[str, Any]:
        n = self.sets
        out: dict[str, Any] = {"qs": tuple(tensors[:n]), "ks": tuple(tensors[n : 2 * n])}
        at = 2 * n
        out["v"] = tensors[at]
        at += 1
        for name in ("bias", "table", "sinks"):
            out[name] = tensors[at] if getattr(self, name) else None
            at += getattr(self, name)
        out["params"] = tuple(tensors[at : at + self.params])
        return out


def _tile(x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    return x[:, :, lo:hi]


def _rows(x: torch.Tensor, c: Call) -> torch.Tensor:
    """Call ``c``'s rows of ``x`` ``(B, H, L, ...)`` as its kernel sees them (reversed for a
    Hankel call)."""
    t = x[:, :, c.r0 : c.r1]
    return t.flip(2) if c.flipped else t


def _row_values(x: torch.Tensor, c: Call) -> torch.Tensor:
    """As :func:`_rows`, for per-row values ``(B, H, L)``."""
    t = x[:, :, c.r0 : c.r1]
    return t.flip(-1) if c.flipped else t


class _Merged(torch.autograd.Function):
    """The merged attention of every call (see the module's docstring)."""

    @staticmethod
    def forward(ctx, blocks, masks, scale, kernel: Kernel, layout: Inputs, *tensors):
        t = layout.split(tensors)
        qs, ks, v = t["qs"], t["ks"], t["v"]
        b, h, q_len = qs[0].shape[:3]
        wide = torch.promote_types(v.dtype, torch.float32)  # merged in float32 or wider
        out = v.new_zeros((b, h, q_len, v.shape[-1]), dtype=wide)
        low = blind(wide)
        lse = v.new_full((b, h, q_len), low, dtype=wide)
        sinks = t["sinks"]
        for r0, r1, calls in blocks:
            for c in calls:
                mask, hidden = masks.mask(c, v.dtype, v.device) if c.masked else (None, None)
                o, m = kernel.forward(
                    _rows(qs[c.s], c), masks.keys(ks, c), _tile(v, c.c0, c.c1), mask, scale
                )
                if c.flipped:
                    o, m = o.flip(2), m.flip(-1)
                m = m.to(wide)
                if hidden is not None:  # a row the mask hides whole has no lse (0 or nan)
                    hidden = hidden.expand_as(m)
                    m = m.masked_fill(hidden, low)
                    o = o.masked_fill(hidden[..., None], 0.0)
                _merge(out[:, :, c.r0 : c.r1], lse[:, :, c.r0 : c.r1], o, m)
            if sinks is not None:  # one more term: a logit per head, a zero value
                _fold_sink(out[:, :, r0:r1], lse[:, :, r0:r1], sinks.to(wide))
        lse.masked_fill_(lse == low, -INF)  # rows that saw no key anywhere
        if masks.score is not None:
            masks.score.release()
        ctx.blocks, ctx.masks, ctx.scale, ctx.kernel, ctx.layout = (
            blocks, masks, scale, kernel, layout,
        )  # fmt: skip
        ctx.versions = _versions(masks)
        out = out.to(v.dtype)
        ctx.save_for_backward(*tensors, out, lse)
        return out

    @staticmethod
    def backward(ctx, d_out):
        saved = ctx.saved_tensors
        tensors, out, lse = saved[:-2], saved[-2], saved[-1]
        layout: Inputs = ctx.layout
        t = layout.split(tensors)
        _check_versions(ctx.versions)
        if torch.is_grad_enabled():  # create_graph: a double backward will follow
            return (None,) * 5 + tuple(_differentiated(ctx, t, tensors, d_out))
        qs = t["qs"]
        unseen = lse == -INF  # rows that saw no key: zero output, zero gradient
        if bool(unseen.any()):  # (a copy of d_out only where one is needed)
            d_out = d_out.masked_fill(unseen[..., None], 0.0)
            lse = lse.masked_fill(unseen, INF)
        d_out = d_out.contiguous()
        wide = lse.dtype  # gradients summed over calls in float32 or wider
        grads = Grads(t, wide)
        masks: Masks = ctx.masks
        learned = layout.bias or layout.table or layout.params > 0
        width = _back_cols(qs[0], learned)
        for _, _, calls in ctx.blocks:
            for c in _split(calls, width):
                _call_backward(ctx, grads, c, learned, d_out, out, lse)
        if masks.score is not None:
            masks.score.release()
        if t["sinks"] is not None:  # p_sink(i) = exp(sink - lse_i); d sink = -sum p * D_i
            rowsum = (d_out.to(wide) * out.to(wide)).sum(-1)
            p_sink = (t["sinks"].to(wide)[None, :, None] - lse).exp()
            grads.sinks = -(p_sink * rowsum).sum((0, 2))
        return (None,) * 5 + tuple(grads.result(t, layout))


# A call's columns in the backward, at most: its key gradients (and, for a learned score, its
# explicit tiles) are made per column chunk, so a call over 8,192 keys does not hold 8 MiB
# gradients of k and v (or four 64 MiB tiles) at once beside the accumulators.
_BACK_COLS = 512
# A learned score's explicit tiles (its mask, softmax share and logit gradients live at once):
# at most this many elements each where columns allow (not under _BACK_MIN columns). At 2,048
# tokens, 8 heads, 512 columns made the three 12 MiB beside plain attention's ~22 MiB.
_BACK_TILE = 1 << 19
_BACK_MIN = 128


def _back_cols(q: torch.Tensor, learned: bool) -> int:
    """The backward's column chunk for queries ``q`` ``(B, heads, rows, D)``."""
    if not learned:
        return _BACK_COLS
    rows = q.shape[0] * q.shape[1] * min(q.shape[2], _SQUARE)
    return min(_BACK_COLS, max(_BACK_MIN, _BACK_TILE // max(1, rows)))


def _split(calls: list[Call], width: int = _BACK_COLS) -> list[Call]:
    """The calls as the backward runs them: a Hankel or tile call's columns cut into chunks of
    at most ``width`` (each chunk's share of the merged softmax is exact on its own: the ring
    identity holds for any split of the keys)."""
    out = []
    for c in _coalesced(calls):
        if c.kind not in ("hankel", "tile") or c.c1 - c.c0 <= width:
            out.append(c)
            continue
        out += [
            dataclasses.replace(c, c0=x, c1=min(c.c1, x + width)) for x in range(c.c0, c.c1, width)
        ]
    return out


def _versions(masks: Masks) -> list[tuple[torch.Tensor, int]]:
    """The version of every parameter a tile score (FIRE) reads: the backward recomputes its
    tiles from them, frozen ones included, which autograd does not watch."""
    module = masks.score.module if masks.score is not None else None
    return [] if module is None else [(p, p._version) for p in module.parameters()]


def _check_versions(versions: list[tuple[torch.Tensor, int]]) -> None:
    for p, version in versions:
        if p._version != version:
            raise RuntimeError(
                "a parameter of the attention's encoding was modified in place between the "
                "forward and the backward; the backward recomputes the encoding's scores from "
                "it, so run the forward again after changing it"
            )


def _coalesced(calls: list[Call]) -> list[Call]:
    """Neighbouring calls of the same rows and kind as one (a Hankel view or a tile is
    defined over any columns): the forward's tiles may be narrower than the backward's."""
    out: list[Call] = []
    for c in calls:
        last = out[-1] if out else None
        if (
            last is not None
            and c.kind in ("hankel", "tile")
            and (last.s, last.r0, last.r1, last.kind, last.c1) == (c.s, c.r0, c.r1, c.kind, c.c0)
        ):
            out[-1] = dataclasses.replace(last, c1=c.c1)
        else:
            out.append(c)
    return out


def _call_backward(
    ctx: Any,
    grads: Grads,
    c: Call,
    learned: bool,
    d_out: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
) -> None:
    """Call ``c``'s share of the gradients into ``grads``. A function of its own so that its
    tiles are gone before the next call's are made (the backward's peak memory)."""
    masks: Masks = ctx.masks
    qs, ks, v = grads.inputs["qs"], grads.inputs["ks"], grads.inputs["v"]
    mask = masks.mask(c, v.dtype, v.device)[0] if c.masked else None
    tiles = (
        _rows(d_out, c), _rows(qs[c.s], c), masks.keys(ks, c),
        _tile(v, c.c0, c.c1), _rows(out, c), _row_values(lse, c), mask, ctx.scale,
    )  # fmt: skip
    if learned and c.masked:  # the explicit tile: its logits' gradient too
        dq, dk, dv, ds = _kernels.scores_backward(*tiles)
        del tiles, mask
        grads.scores(masks, c, ds)
        del ds
    else:
        dq, dk, dv = ctx.kernel.backward(*tiles)
    if c.flipped:
        dq = dq.flip(2)
    grads.qs[c.s][:, :, c.r0 : c.r1] += dq
    masks.keys(grads.ks, c).add_(dk)
    grads.v[:, :, c.c0 : c.c1] += dv


def _fold_sink(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> None:
    """Fold a sink logit per head ``(heads,)`` into the rows ``(out, lse)`` in place: one more
    term of the merge, with a zero value (the rows' outputs shrink by their share)."""
    s = sinks[None, :, None]
    top = torch.maximum(lse, s)
    keep = torch.sub(lse, top).exp_()
    total = torch.sub(s, top).exp_().add_(keep)
    out.mul_((keep / total).unsqueeze_(-1))
    lse.copy_(top.add_(total.log_()))


class Grads:
    """The gradients being summed over calls, in float32 or wider."""

    def __init__(self, t: dict[str, Any], wide: torch.dtype) -> None:
        self.inputs = t
        self.qs = [torch.zeros_like(q, dtype=wide) for q in t["qs"]]
        self.ks = [torch.zeros_like(k, dtype=wide) for k in t["ks"]]
        self.v = torch.zeros_like(t["v"], dtype=wide)
        self.bias = None if t["bias"] is None else torch.zeros_like(t["bias"], dtype=wide)
        self.table = None if t["table"] is None else torch.zeros_like(t["table"], dtype=wide)
        self.params = [torch.zeros_like(p, dtype=wide) for p in t["params"]]
        self.sinks: torch.Tensor | None = None

    def scores(self, masks: Masks, c: Call, ds: torch.Tensor) -> None:
        """Call ``c``'s logit gradients ``ds`` ``(B, heads, rows, cols)`` (its kernel's
        layout) into every learned piece of its mask."""
        if self.table is not None and masks.table is not None:
            if c.kind == "hankel":
                rows, cols = ds.shape[-2:]
                _add_table_grad(self.table, ds, masks.table.index(c, (rows, cols)))
            else:
                qp, kp = masks._positions(c)
                index = qp.unsqueeze(-1) - kp.unsqueeze(-2) - masks.table.lo  # (B, n, C)
                if index.shape[0] == 1:
                    _add_table_grad(self.table, ds, index[0])
                else:
                    for b in range(ds.shape[0]):
                        _add_table_grad(self.table, ds[b : b + 1], index[b])
        if self.bias is not None:
            _add_bias_grad(self.bias, ds.flip(2) if c.flipped else ds, c)
        if self.params and masks.score is not None:
            qp, kp = masks._positions(c)
            got = masks.score.param_grads(qp, kp, ds)
            for acc, g in zip(self.params, got, strict=True):
                if g is not None:
                    acc += g

    def result(self, t: dict[str, Any], layout: Inputs) -> list[torch.Tensor | None]:
        out: list[torch.Tensor | None] = [
            g.to(x.dtype) for g, x in zip((*self.qs, *self.ks, self.v),
                                          (*t["qs"], *t["ks"], t["v"]), strict=True)
        ]  # fmt: skip
        for name in ("bias", "table", "sinks"):
            if getattr(layout, name):
                g = getattr(self, name)
                out.append(None if g is None else g.to(t[name].dtype))
        out += [g.to(p.dtype) for g, p in zip(self.params, t["params"], strict=True)]
        return out


def _add_bias_grad(d_bias: torch.Tensor, ds: torch.Tensor, c: Call) -> None:
    """Add call ``c``'s logit gradients ``ds`` ``(batch, heads, rows, cols)`` into the bias's
    ``d_bias`` (4-D), summed over every dimension the bias broadcasts along."""
    dims = [i for i in (0, 1) if d_bias.shape[i] == 1 and ds.shape[i] > 1]
    rows, cols = d_bias.shape[-2] > 1, d_bias.shape[-1] > 1
    dims += [i for i, keep in ((2, rows), (3, cols)) if not keep]
    if dims:
        ds = ds.sum(dims, keepdim=True)
    view = d_bias[..., c.r0 : c.r1, :] if rows else d_bias
    view = view[..., c.c0 : c.c1] if cols else view
    view += ds


def _merge(out: torch.Tensor, lse: torch.Tensor, o: torch.Tensor, m: torch.Tensor) -> None:
    """Fold one call's rows ``(o, m)`` into the running ``(out, lse)`` views, in place (``m``
    is finite: a blind row's is :func:`blind`). The two are weighed relative to the larger
    log-sum-exp and normalised by the weights' sum, not by ``exp(lse)``: two calls whose
    log-sum-exps round to the same large value (a fill of -1e9 on every key) weigh 1/2 each."""
    top = torch.maximum(lse, m)
    keep = torch.sub(lse, top).exp_()
    take = torch.sub(m, top).exp_()
    total = keep + take
    out.mul_((keep / total).unsqueeze_(-1)).addcmul_(o, (take / total).unsqueeze_(-1))
    lse.copy_(top.add_(total.log_()))


def _differentiated(
    ctx: Any, t: dict[str, Any], tensors: Sequence[torch.Tensor], d_out: torch.Tensor
) -> list[torch.Tensor | None]:
    """The backward as operations autograd can differentiate again: the merged attention
    recomputed from explicit tiles and merged out of place, its masks rebuilt from the saved
    (differentiable) bias, table and score, then its gradient with ``create_graph`` (the
    flash kernels' backward has no derivative of its own)."""
    masks: Masks = ctx.masks
    if t["bias"] is not None:
        masks = dataclasses.replace(masks, bias=t["bias"])
    if t["table"] is not None and masks.table is not None:
        table = Table(t["table"], masks.table.lo, masks.table.delta)
        masks = dataclasses.replace(masks, table=table)
    with torch.enable_grad():
        out = _recomputed(ctx.blocks, masks, ctx.scale, t)
    wanted = [x for x in tensors if x.requires_grad]  # (k and v may need none)
    got = iter(torch.autograd.grad(out, wanted, d_out, create_graph=True, allow_unused=True))
    grads = [next(got) if x.requires_grad else None for x in tensors]
    return [
        None if not x.requires_grad else torch.zeros_like(x) if g is None else g
        for g, x in zip(grads, tensors, strict=True)
    ]


def _recomputed(blocks: list[Block], masks: Masks, scale: float, t: dict[str, Any]) -> torch.Tensor:
    """The merged attention from explicit tiles, every step differentiable twice: each call's
    rows folded into its block's by the larger log-sum-exp (no logaddexp: its derivative's
    derivative is nan where one side is the blind sentinel)."""
    qs, ks, v = t["qs"], t["ks"], t["v"]
    b, h = qs[0].shape[:2]
    wide = torch.promote_types(v.dtype, torch.float32)
    low = blind(wide)
    rows = []
    for r0, r1, calls in blocks:
        out = v.new_zeros((b, h, r1 - r0, v.shape[-1]), dtype=wide)
        lse = v.new_full((b, h, r1 - r0), low, dtype=wide)
        for c in calls:
            mask, hidden = masks.mask(c, v.dtype, v.device) if c.masked else (None, None)
            if mask is not None and hidden is not None:  # computed as seen, then dropped
                seen_back = hidden.flip(-1) if c.flipped else hidden
                mask = mask.masked_fill(seen_back[..., None], 0.0)
            o, m = _kernels.TILES.forward(
                _rows(qs[c.s], c), masks.keys(ks, c), _tile(v, c.c0, c.c1), mask, scale
            )
            if c.flipped:
                o, m = o.flip(2), m.flip(-1)
            m = m.to(wide)
            if hidden is not None:
                hidden = hidden.expand_as(m)
                m, o = m.masked_fill(hidden, low), o.masked_fill(hidden[..., None], 0.0)
            before, after = c.r0 - r0, r1 - c.r1  # the call's rows placed in the block's
            o = torch.nn.functional.pad(o.to(wide), (0, 0, before, after))
            m = torch.nn.functional.pad(m, (before, after), value=low)
            out, lse = _merged_pair(out, lse, o, m)
        rows.append((out, lse))
    out = torch.cat([o for o, _ in rows], dim=2)
    if t["sinks"] is not None:
        lse = torch.cat([m for _, m in rows], dim=-1)
        sink = t["sinks"].to(wide)[None, :, None].expand_as(lse)
        out, _ = _merged_pair(out, lse, torch.zeros_like(out), sink)
    return out.to(v.dtype)


def _merged_pair(
    out: torch.Tensor, lse: torch.Tensor, o: torch.Tensor, m: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_merge` out of place, for autograd."""
    top = torch.maximum(lse, m)
    keep, take = (lse - top).exp(), (m - top).exp()
    total = keep + take
    merged = (out * keep.unsqueeze(-1) + o * take.unsqueeze(-1)) / total.unsqueeze(-1)
    return merged, top + total.log()


def blind(dtype: torch.dtype) -> float:
    """The log-sum-exp of a row a call hides whole: the dtype's lowest finite value, so merging
    needs no nan handling, and below any real one (a logit below it is -inf in this dtype; a
    fixed -1e30 lost to rows whose logits are that low, at a scale of 1e31). A row that sees
    nothing anywhere keeps exactly it (``lowest + log 2`` rounds back to it)."""
    return torch.finfo(dtype).min


def row_shift(masks: Masks, blocks: list[Block], dtype: torch.dtype) -> torch.Tensor:
    """Per query row, the largest bias among the keys it sees, ``(B or 1, heads or 1, q_len)``
    (0 for a row that sees none): subtracted from the row's bias, it changes no softmax, and
    keeps every call's log-sum-exp near the scale of the logits. Without it a row whose keys all
    carry a large finite fill (a padded query row under a hand-written -1e9 mask) has
    log-sum-exps that round to the fill in float32, and the calls cannot be weighed."""
    shift: torch.Tensor | None = None
    assert masks.bias is not None
    for _, _, calls in blocks:
        for c in calls:
            tile = masks.mask(c, dtype, masks.bias.device)[0].amax(-1)
            if shift is None:
                shift = tile.new_full((*tile.shape[:2], blocks[-1][1]), -INF)
            part = shift[..., c.r0 : c.r1]
            torch.maximum(part, tile, out=part)
    assert shift is not None
    return shift.masked_fill_(shift == -INF, 0.0)


# A bias whose finite entries all lie within this of 0 needs no shift: its rows' log-sum-exps
# are of the order of the logits', as without a bias.
_SHIFT_FREE = 16.0


def _needs_shift(bias: torch.Tensor) -> bool:
    """Whether a float bias has a finite entry (one not hiding its key) beyond
    :data:`_SHIFT_FREE`; read in slices of rows, so nothing of the bias's size is formed."""
    if bias.dtype == torch.bool:
        return False
    floor = torch.finfo(bias.dtype).min / 2
    step = max(1, (1 << 22) // max(1, bias[..., :1, :].numel()))
    for r0 in range(0, bias.shape[-2], step):
        part = bias[..., r0 : r0 + step, :]
        if bool(((part.abs() > _SHIFT_FREE) & (part > floor)).any()):
            return True
    return False


def attention(
    qs: list[torch.Tensor],
    ks: list[torch.Tensor],
    v: torch.Tensor,
    masks: Masks,
    scale: float,
    fused: bool = True,
    *,
    blocks: list[Block] | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softmax attention over calls merged by log-sum-exp.

    Args:
        qs: per set, queries ``(batch, heads, q_len, dim)`` (one set but for a training-free
            extension's position sets).
        ks: per set, keys ``(batch, kv_heads, k_len, dim)``, kv_heads dividing heads.
        v: ``(batch, kv_heads, k_len, v_dim)``.
        masks: what the calls' masks are made of (:class:`Masks`); a bias of fewer than 4
            dimensions is read as broadcasting from the right, and gets its gradient where it
            requires one, as do the table's values and a tile score's parameters.
        scale: the logit scale.
        fused: False runs the explicit tiles on the CPU too (what other devices run).
        blocks: the calls (:func:`square_plan`); default :func:`range_plan` of ``masks``.
        sinks: ``(heads,)`` sink logits, or None.

    Returns:
        ``(batch, heads, q_len, v_dim)`` in v's dtype; zeros for a query that sees no key (and
        no sink).
    """
    d, dv = qs[0].shape[-1], v.shape[-1]
    if dv != d and fused and v.device.type == "cpu":  # the flash kernel wants one head size
        if dv < d:
            out = attention(qs, ks, _pad(v, d), masks, scale, blocks=blocks, sinks=sinks)
            return out[..., :dv]
        qs, ks = [_pad(q, dv) for q in qs], [_pad(k, dv) for k in ks]
    # The flash kernels read the last dimension as unit-stride whatever its stride says (a
    # transposed or step-sliced v gave wrong outputs): such a tensor is copied once, here.
    qs, ks, v = [_unit(q) for q in qs], [_unit(k) for k in ks], _unit(v)
    bias = masks.bias
    if bias is not None and bias.dim() < 4:
        bias = bias.view((1,) * (4 - bias.dim()) + tuple(bias.shape))
        masks = dataclasses.replace(masks, bias=bias)
    if blocks is None:
        blocks = range_plan(masks, qs[0].shape[2])
    if bias is not None and masks.shift is None and blocks and _needs_shift(bias):
        dtype = torch.promote_types(bias.dtype, torch.float32)
        with torch.no_grad():
            masks = dataclasses.replace(masks, shift=row_shift(masks, blocks, dtype))
    kernel = kernel_for(qs[0], v, fused)
    extra: list[torch.Tensor] = []
    layout = Inputs(len(qs))
    if bias is not None and bias.requires_grad:
        layout, extra = dataclasses.replace(layout, bias=True), [*extra, bias]
    table = masks.table
    if table is not None and table.values.requires_grad:
        layout, extra = dataclasses.replace(layout, table=True), [*extra, table.values]
    if sinks is not None:
        layout, extra = dataclasses.replace(layout, sinks=True), [*extra, sinks]
    params = masks.score.parameters() if masks.score is not None else []
    if params:
        layout, extra = dataclasses.replace(layout, params=len(params)), [*extra, *params]
    return _Merged.apply(blocks, masks, scale, kernel, layout, *qs, *ks, v, *extra)


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 or x.shape[-1] <= 1 else x.contiguous()


def _pad(x: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[-1]))
