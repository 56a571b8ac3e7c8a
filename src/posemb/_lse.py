"""Attention over key ranges taken by fused calls, merged exactly by log-sum-exp.

Training-free extension rotates each (query, key) pair by one of a few *position sets*; the
pairs a set gives form, for every query, one contiguous range of keys (when the keys' positions
increase along the sequence). So the attention is a sum over ranges: for a block of queries and
each set, a fused attention call over the columns its ranges span returns its output and the
log-sum-exp of its rows, and the calls combine exactly as ``out = sum_c exp(lse_c - lse) out_c``
with ``lse = logsumexp_c(lse_c)`` (the identity flash attention's split-K and ring attention
rest on). Where a call's ranges differ row by row, a small additive mask of that call's tile
says which keys it covers; where every row of the block sees the same columns, there is none.
No ``(q_len, k_len)`` tensor exists: the largest is a call's mask tile.

The backward needs no gradient of the log-sum-exp: each call's backward kernel, handed the
*merged* output and log-sum-exp, recomputes that call's share of the merged softmax and the
merged ``rowsum(dO * out)``, which is the exact gradient of the merged attention restricted to
that call's keys (how ring attention's backward is built).

The fused kernel is PyTorch's: on the CPU its flash kernel (``aten._scaled_dot_product_flash_
attention_for_cpu``, which returns the log-sum-exp and has its backward); elsewhere the same
calls run as explicit tiles (:func:`_math_forward`), exact and bounded in memory by the tile.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from . import _lse_kernels
from ._lse_kernels import Kernel, kernel_for

INF = float("inf")


def blind(dtype: torch.dtype) -> float:
    """The log-sum-exp of a row a call hides whole: the dtype's lowest finite value, so merging
    needs no nan handling, and below any real one (a logit below it is -inf in this dtype; a
    fixed -1e30 lost to rows whose logits are that low, at a scale of 1e31). A row that sees
    nothing anywhere keeps exactly it (``lowest + log 2`` rounds back to it)."""
    return torch.finfo(dtype).min


# A block's queries: at most this many rows per call (and a masked call's tile at most
# _TILE elements per head, its columns split to stay under it).
_ROWS = 1024
_LEAF = 128
_TILE = 1 << 21


@dataclass(frozen=True)
class Call:
    """One fused call: queries ``r0:r1`` of set ``s`` against keys ``c0:c1``; ``masked`` when
    the rows' ranges (or padding, or a bias) differ across the tile."""

    s: int
    r0: int
    r1: int
    c0: int
    c1: int
    masked: bool


@dataclass(frozen=True)
class Ranges:
    """What every call's mask is made from: per set, the first and one-past-last key index each
    query sees, ``(B, q_len)`` int64 NumPy arrays (B is 1 or the batch); key padding ``(batch,
    k_len)`` bool NumPy array (True: hidden) or None; an additive bias tensor broadcasting to
    ``(batch, heads, q_len, k_len)`` (see :func:`hard`) or None. NumPy: planning a long call
    takes thousands of small reads, each ~10x cheaper there than a tensor op."""

    starts: list[np.ndarray]
    ends: list[np.ndarray]
    pad: np.ndarray | None
    bias: torch.Tensor | None
    first: tuple[int, ...] = ()  # per set: the key column its keys tensor starts at (0)
    # Per query row, subtracted from the bias: the largest bias the row sees (see
    # :func:`row_shift`), ``(B or 1, heads or 1, q_len)``; None for none.
    shift: torch.Tensor | None = None

    def span(self, s: int) -> tuple[int, int] | None:
        """The key columns set ``s`` takes any pair from, or None for a set no query uses
        (a decode step rotates only these keys for it)."""
        live = self.starts[s] < self.ends[s]
        if not live.any():
            return None
        return int(self.starts[s][live].min()), int(self.ends[s][live].max())

    def keep(self, sets: list[int], first: list[int]) -> Ranges:
        """Only ``sets``, their keys tensors starting at columns ``first``."""
        return dataclasses.replace(
            self,
            starts=[self.starts[s] for s in sets],
            ends=[self.ends[s] for s in sets],
            first=tuple(first),
        )

    def keys(self, ks: Sequence[torch.Tensor], c: Call) -> torch.Tensor:
        """Call ``c``'s keys from its set's tensor."""
        at = self.first[c.s] if self.first else 0
        return ks[c.s][:, :, c.c0 - at : c.c1 - at]

    def clear(self, c0: int, c1: int) -> bool:
        """Whether keys ``c0:c1`` need no mask beyond the ranges: no bias, no padding there."""
        return self.bias is None and (self.pad is None or not self.pad[:, c0:c1].any())

    def mask(
        self, c: Call, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The additive mask of call ``c``, ``(B, 1 or heads, rows, cols)``, 0 or -inf; and
        the rows it hides whole (``(B, 1 or heads, rows)`` bool), or None if none."""
        cols = np.arange(c.c0, c.c1)
        a = self.starts[c.s][:, c.r0 : c.r1, None]
        e = self.ends[c.s][:, c.r0 : c.r1, None]
        seen = (cols >= a) & (cols < e)
        if self.pad is not None:
            seen = seen & ~self.pad[:, None, c.c0 : c.c1]
        fill = np.where(seen, 0.0, -np.inf)[:, None]
        if self.bias is not None:  # a dimension of size 1 broadcasts: not sliced
            bias = self.bias
            bias = bias[..., c.r0 : c.r1, :] if bias.shape[-2] > 1 else bias
            bias = bias[..., c.c0 : c.c1] if bias.shape[-1] > 1 else bias
            # Formed in float32 or wider and rounded once to the calls' dtype: a half-type
            # call (CUDA) would otherwise round the bias before the shift (and -inf - -inf)
            wide = torch.promote_types(torch.promote_types(dtype, bias.dtype), torch.float32)
            add = torch.from_numpy(fill).to(device, wide) + hard(bias, wide)
            if self.shift is not None:
                add = add - self.shift[..., c.r0 : c.r1, None].to(wide)
            add = add.to(dtype)
            hidden = (add == -INF).all(-1)
            return add, hidden if bool(hidden.any()) else None
        add = torch.from_numpy(fill).to(device, dtype)
        blind_rows = np.logical_not(seen.any(axis=-1))
        if not blind_rows.any():
            return add, None
        return add, torch.from_numpy(np.expand_dims(blind_rows, 1)).to(device)


def hard(bias: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An attention mask as an additive bias in ``dtype``: a bool mask (True: seen) is 0 or
    -inf; an additive one is kept, its entries at or below half its dtype's lowest (the fill
    transformers uses for a hidden key) made -inf, so a query hidden from every key is one."""
    if bias.dtype == torch.bool:
        return torch.zeros(bias.shape, dtype=dtype, device=bias.device).masked_fill_(~bias, -INF)
    floor = torch.finfo(bias.dtype).min / 2
    return bias.to(dtype).masked_fill(bias <= floor, -INF)


def plan(ranges: Ranges, q_len: int) -> list[tuple[int, int, list[Call]]]:
    """Each block of :data:`_ROWS` queries ``(r0, r1)`` and its calls (see :func:`_calls`)."""
    blocks = []
    for r0 in range(0, q_len, _ROWS):
        r1 = min(q_len, r0 + _ROWS)
        calls: list[Call] = []
        for s in range(len(ranges.starts)):
            calls += _calls(ranges, s, r0, r1, 0, 1 << 62)
        blocks.append((r0, r1, calls))
    return blocks


def _calls(ranges: Ranges, s: int, r0: int, r1: int, x0: int, x1: int) -> list[Call]:
    """Set ``s``'s calls for queries ``r0:r1`` over keys ``x0:x1``: an unmasked call over
    the core of columns every row sees whole (none where padding or a bias lies there), and
    the edges on either side split by halving the rows until each half's columns are tight
    (so a masked call computes few pairs it then hides), masked below :data:`_LEAF` rows."""
    a = ranges.starts[s][:, r0:r1].clip(x0, x1)
    e = ranges.ends[s][:, r0:r1].clip(x0, x1)
    live = a < e
    if not live.any():
        return []
    c0, c1 = int(a[live].min()), int(e[live].max())
    lo, hi = int(a.max()), int(e.min())
    if live.all() and hi - lo >= min(_LEAF, c1 - c0) and ranges.clear(lo, hi):
        core = [Call(s, r0, r1, lo, hi, False)]
        return _calls(ranges, s, r0, r1, c0, lo) + core + _calls(ranges, s, r0, r1, hi, c1)
    if r1 - r0 > _LEAF:
        mid = (r0 + r1) // 2
        return _calls(ranges, s, r0, mid, c0, c1) + _calls(ranges, s, mid, r1, c0, c1)
    width = max(1, _TILE // max(1, (r1 - r0) * a.shape[0]))
    return [Call(s, r0, r1, x, min(c1, x + width), True) for x in range(c0, c1, width)]


def _tile(x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    return x[:, :, lo:hi]


class _Merged(torch.autograd.Function):
    """The merged attention of every call; inputs: the sets' rotated queries and keys (each
    with the full heads), v, then the bias where it needs a gradient. Gradients flow to each
    as :mod:`posemb._lse` describes; the bias's from each call's logit gradients."""

    @staticmethod
    def forward(ctx, blocks, ranges, scale, kernel: Kernel, n_sets, *tensors):
        qs, ks, v = tensors[:n_sets], tensors[n_sets : 2 * n_sets], tensors[2 * n_sets]
        forward = kernel.forward
        b, h, q_len = qs[0].shape[:3]
        wide = torch.promote_types(v.dtype, torch.float32)  # merged in float32 or wider
        out = v.new_zeros((b, h, q_len, v.shape[-1]), dtype=wide)
        lse = v.new_full((b, h, q_len), blind(wide), dtype=wide)
        for _, _, calls in blocks:
            for c in calls:
                mask, hidden = ranges.mask(c, v.dtype, v.device) if c.masked else (None, None)
                o, m = forward(
                    _tile(qs[c.s], c.r0, c.r1),
                    ranges.keys(ks, c),
                    _tile(v, c.c0, c.c1),
                    mask,
                    scale,
                )
                if hidden is not None:  # a row the mask hides whole has no lse (0 or nan)
                    hidden = hidden.expand_as(m)
                    m = m.to(wide).masked_fill(hidden, blind(wide))
                    o = o.masked_fill(hidden[..., None], 0.0)
                _merge(out[:, :, c.r0 : c.r1], lse[:, :, c.r0 : c.r1], o, m)
        lse.masked_fill_(lse == blind(wide), -INF)  # rows that saw no key anywhere
        ctx.blocks, ctx.ranges, ctx.scale, ctx.kernel, ctx.n_sets = (
            blocks,
            ranges,
            scale,
            kernel,
            n_sets,
        )
        out = out.to(v.dtype)
        ctx.save_for_backward(*tensors, out, lse)
        return out

    @staticmethod
    def backward(ctx, d_out):
        n = ctx.n_sets
        saved = ctx.saved_tensors
        qs, ks, v, out, lse = saved[:n], saved[n : 2 * n], saved[2 * n], saved[-2], saved[-1]
        with_bias = len(saved) > 2 * n + 3  # the bias is an input: it needs a gradient
        if torch.is_grad_enabled():  # create_graph: a double backward will follow
            bias = saved[2 * n + 1] if with_bias else None
            grads = _differentiated(ctx, qs, ks, v, d_out, bias)
            return (None, None, None, None, None, *grads)
        unseen = lse == -INF  # rows that saw no key: zero output, zero gradient
        d_out = d_out.masked_fill(unseen[..., None], 0.0).contiguous()
        lse = lse.masked_fill(unseen, INF)
        wide = lse.dtype  # gradients summed over calls in float32 or wider
        d_qs = [torch.zeros_like(q, dtype=wide) for q in qs]
        d_ks = [torch.zeros_like(k, dtype=wide) for k in ks]
        d_v = torch.zeros_like(v, dtype=wide)
        bias = ctx.ranges.bias
        d_bias = torch.zeros_like(bias, dtype=wide) if with_bias else None
        for _, _, calls in ctx.blocks:
            for c in calls:
                mask = ctx.ranges.mask(c, v.dtype, v.device)[0] if c.masked else None
                tiles = (
                    _tile(d_out, c.r0, c.r1),
                    _tile(qs[c.s], c.r0, c.r1),
                    ctx.ranges.keys(ks, c),
                    _tile(v, c.c0, c.c1),
                    _tile(out, c.r0, c.r1),
                    lse[:, :, c.r0 : c.r1],
                    mask,
                    ctx.scale,
                )
                if d_bias is not None:  # the explicit tile: its logits' gradient is the bias's
                    dq, dk, dv, ds = _lse_kernels.scores_backward(*tiles)
                    _add_bias_grad(d_bias, ds, c)
                else:
                    dq, dk, dv = ctx.kernel.backward(*tiles)
                d_qs[c.s][:, :, c.r0 : c.r1] += dq
                ctx.ranges.keys(d_ks, c).add_(dk)
                d_v[:, :, c.c0 : c.c1] += dv
        grads = [g.to(t.dtype) for g, t in zip((*d_qs, *d_ks, d_v), (*qs, *ks, v), strict=True)]
        if d_bias is not None:
            grads.append(d_bias.to(bias.dtype))
        return (None, None, None, None, None, *grads)


def _add_bias_grad(d_bias: torch.Tensor, ds: torch.Tensor, c: Call) -> None:
    """Add call ``c``'s logit gradients ``ds`` ``(batch, heads, rows, cols)`` into the bias's
    ``d_bias`` (4-D), summed over every dimension the bias broadcasts along."""
    dims = [i for i in (0, 1) if d_bias.shape[i] == 1 and ds.shape[i] != 1]  # 0 too
    rows, cols = d_bias.shape[-2] > 1, d_bias.shape[-1] > 1
    dims += [i for i, keep in ((2, rows), (3, cols)) if not keep]
    if dims:
        ds = ds.sum(dims, keepdim=True)
    view = d_bias[..., c.r0 : c.r1, :] if rows else d_bias
    view = view[..., c.c0 : c.c1] if cols else view
    view += ds


def _differentiated(
    ctx: Any,
    qs: tuple,
    ks: tuple,
    v: torch.Tensor,
    d_out: torch.Tensor,
    bias: torch.Tensor | None,
) -> list[torch.Tensor]:
    """The backward as operations autograd can differentiate again: the merged attention
    recomputed from explicit tiles and merged out of place, then its gradient with
    ``create_graph`` (the flash kernels' backward has no derivative of its own). ``bias`` is
    the saved bias where it wants a gradient (the masks are rebuilt from it, so the second
    derivative reaches it too)."""
    inputs = (*qs, *ks, v)
    ranges = ctx.ranges
    if bias is not None:
        ranges = dataclasses.replace(ranges, bias=bias)
        inputs = (*inputs, bias)
    with torch.enable_grad():
        out = _recomputed(ctx.blocks, ranges, ctx.scale, qs, ks, v)
    grads = torch.autograd.grad(out, inputs, d_out, create_graph=True, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for g, t in zip(grads, inputs, strict=True)]


def _recomputed(
    blocks: list, ranges: Ranges, scale: float, qs: tuple, ks: tuple, v: torch.Tensor
) -> torch.Tensor:
    """The merged attention from explicit tiles, every step differentiable twice: each call's
    rows folded into the block's by the largest log-sum-exp (no logaddexp: its derivative's
    derivative is nan where one side is the blind sentinel)."""
    b, h = qs[0].shape[:2]
    wide = torch.promote_types(v.dtype, torch.float32)
    rows = []
    for r0, r1, calls in blocks:
        out = v.new_zeros((b, h, r1 - r0, v.shape[-1]), dtype=wide)
        lse = v.new_full((b, h, r1 - r0), blind(wide), dtype=wide)
        for c in calls:
            mask, hidden = ranges.mask(c, v.dtype, v.device) if c.masked else (None, None)
            if mask is not None and hidden is not None:  # computed as seen, then dropped
                mask = mask.masked_fill(hidden[..., None], 0.0)
            tiles = (_tile(qs[c.s], c.r0, c.r1), ranges.keys(ks, c), _tile(v, c.c0, c.c1))
            o, m = _lse_kernels.TILES.forward(*tiles, mask, scale)
            if hidden is not None:
                hidden = hidden.expand_as(m)
                m = m.to(wide).masked_fill(hidden, blind(wide))
                o = o.masked_fill(hidden[..., None], 0.0)
            before, after = c.r0 - r0, r1 - c.r1  # the call's rows placed in the block's
            o = torch.nn.functional.pad(o.to(wide), (0, 0, before, after))
            m = torch.nn.functional.pad(m.to(wide), (before, after), value=blind(wide))
            top = torch.maximum(lse, m)
            keep, take = (lse - top).exp(), (m - top).exp()
            total = keep + take
            out = (out * keep.unsqueeze(-1) + o * take.unsqueeze(-1)) / total.unsqueeze(-1)
            lse = top + total.log()
        rows.append(out)
    return torch.cat(rows, dim=2).to(v.dtype)


def _merge(out: torch.Tensor, lse: torch.Tensor, o: torch.Tensor, m: torch.Tensor) -> None:
    """Fold one call's rows ``(o, m)`` into the running ``(out, lse)`` views, in place (``m``
    is finite: a blind row's is :func:`blind`). The two are weighed relative to the larger
    log-sum-exp and normalised by the weights' sum, not by ``exp(lse)``: two calls whose
    log-sum-exps round to the same large value (a fill of -1e9 on every key) weigh 1/2 each."""
    top = torch.maximum(lse, m)
    keep = torch.sub(lse, top).exp_()
    take = torch.sub(m, top).exp_()
    total = keep + take
    out.mul_((keep / total).unsqueeze_(-1)).add_(o * (take / total).unsqueeze_(-1))
    lse.copy_(top.add_(total.log_()))


def row_shift(ranges: Ranges, blocks: list, dtype: torch.dtype) -> torch.Tensor:
    """Per query row, the largest bias among the keys it sees, ``(B or 1, heads or 1, q_len)``
    (0 for a row that sees none): subtracted from the row's bias, it changes no softmax, and
    keeps every call's log-sum-exp near the scale of the logits. Without it a row whose keys all
    carry a large finite fill (a padded query row under a hand-written -1e9 mask) has
    log-sum-exps that round to the fill in float32, and the calls cannot be weighed."""
    shift: torch.Tensor | None = None
    assert ranges.bias is not None
    for _, _, calls in blocks:
        for c in calls:
            tile = ranges.mask(c, dtype, ranges.bias.device)[0].amax(-1)
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
    ranges: Ranges,
    scale: float,
    fused: bool = True,
) -> torch.Tensor:
    """Softmax attention whose query ``i`` takes its logits with key ``j`` from set ``s``
    where ``ranges.starts[s][i] <= j < ranges.ends[s][i]`` (the sets' ranges disjoint), plus
    ``ranges.bias``, with padded keys hidden.

    Args:
        qs: per set, queries ``(batch, heads, q_len, dim)`` rotated by its positions.
        ks: per set, keys ``(batch, kv_heads, k_len, dim)``, kv_heads dividing heads.
        v: ``(batch, kv_heads, k_len, v_dim)``.
        ranges: see :class:`Ranges`; a bias of fewer than 4 dimensions is read as
            broadcasting from the right, and gets its gradient where it requires one.
        scale: the logit scale.
        fused: False runs the explicit tiles on the CPU too (what other devices run).

    Returns:
        ``(batch, heads, q_len, v_dim)`` in v's dtype; zeros for a query that sees no key.
    """
    d, dv = qs[0].shape[-1], v.shape[-1]
    if dv != d and fused and v.device.type == "cpu":  # the flash kernel wants one head size
        if dv < d:
            return attention(qs, ks, _pad(v, d), ranges, scale)[..., :dv]
        qs, ks = [_pad(q, dv) for q in qs], [_pad(k, dv) for k in ks]
    # The flash kernels read the last dimension as unit-stride whatever its stride says (a
    # transposed or step-sliced v gave wrong outputs): such a tensor is copied once, here.
    qs, ks, v = [_unit(q) for q in qs], [_unit(k) for k in ks], _unit(v)
    bias = ranges.bias
    if bias is not None and bias.dim() < 4:
        bias = bias.view((1,) * (4 - bias.dim()) + tuple(bias.shape))
        ranges = dataclasses.replace(ranges, bias=bias)
    blocks = plan(ranges, qs[0].shape[2])
    if bias is not None and ranges.shift is None and blocks and _needs_shift(bias):
        dtype = torch.promote_types(bias.dtype, torch.float32)
        with torch.no_grad():
            ranges = dataclasses.replace(ranges, shift=row_shift(ranges, blocks, dtype))
    kernel = kernel_for(qs[0], v, fused)
    extra = (bias,) if bias is not None and bias.requires_grad else ()
    return _Merged.apply(blocks, ranges, scale, kernel, len(qs), *qs, *ks, v, *extra)


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 or x.shape[-1] <= 1 else x.contiguous()


def _pad(x: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[-1]))
