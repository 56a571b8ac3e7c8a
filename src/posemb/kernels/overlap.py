"""Whether an in-place rotation would write one element twice.

Rotating in place reads a pair and writes it back; if two written pairs share memory, the
result depends on the order the backend writes in (issue 30: head 0 of ``rope(x, x[:, :1],
inplace=True)`` turned twice on the CPU op and once on the reference). PyTorch's own checks
look within one tensor and answer "too hard" for most views; these answer exactly, for the
tensors posemb rotates: unit stride in the last dimension (a head vector, or "row", is
contiguous), so two tensors share an element exactly when a row of one meets a row of the other.

Comparing every row costs O(rows log rows), too much for a prefill in place; the common cases
are decided from shapes and strides alone: separate buffers (a decode step, ~3 us), views of
one buffer whose outer dimensions stack the blocks apart (a packed QKV projection, batch- or
heads-first), and views whose shared dimensions repeat a small block of heads.
"""

from __future__ import annotations

import torch

from .. import _checks
from .._errors import InputError

Dims = list[tuple[int, int]]  # (size, stride) per dimension, the last (unit-stride) one left out


def _starts(offset: int, dims: Dims) -> torch.Tensor:
    """The storage offset of every row: ``offset`` plus each index times its stride."""
    starts = torch.full((), offset, dtype=torch.int64)
    for size, stride in dims:
        starts = starts[..., None] + torch.arange(size, dtype=torch.int64) * stride
    return starts.flatten()


def _end(offset: int, dims: Dims, width: int) -> int:
    """One past the last element a block of rows reaches."""
    return offset + sum((n - 1) * st for n, st in dims) + width


def _stacks_apart(dims: Dims, extent: int) -> bool:
    """Whether ``dims`` place copies of a block ``extent`` elements long apart from each other:
    sorted by stride, each stride clears everything the smaller ones span."""
    for size, stride in sorted(dims, key=lambda ns: ns[1]):
        if size == 1:
            continue
        if stride < extent:
            return False
        extent += stride * (size - 1)
    return True


def _rows_meet(a: torch.Tensor, b: torch.Tensor, width: int) -> bool:
    """Whether a row ``[x, x + width)`` with x in ``a`` meets one starting in sorted ``b``."""
    at = torch.searchsorted(b, a - width + 1)
    inside = at < b.numel()
    return bool((b[at[inside]] < a[inside] + width).any())


def _dims(t: torch.Tensor) -> Dims:
    return [(n, st) for n, st in zip(t.shape[:-1], t.stride()[:-1], strict=True) if n > 1]


def overlaps_itself(t: torch.Tensor) -> bool:
    """Whether two rows of a non-empty ``t`` share memory (an expanded view)."""
    if t.is_contiguous():
        return False
    width = t.shape[-1]
    if _stacks_apart(_dims(t), width):
        return False
    if torch._debug_has_internal_overlap(t) == 1:
        return True
    # Rows of one width overlap somewhere exactly when two neighbours in sorted order do.
    s = _starts(int(t.storage_offset()), _dims(t)).sort().values
    return bool((s[1:] - s[:-1] < width).any())


def _views_meet(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether a row of q meets a row of k, two views of one storage."""
    width = q.shape[-1]
    oq, ok = int(q.storage_offset()), int(k.storage_offset())
    same = [
        d
        for d in range(q.dim() - 1)
        if q.shape[d] == k.shape[d] and q.stride(d) == k.stride(d) and q.shape[d] > 1
    ]
    shared: Dims = sorted(((q.shape[d], q.stride(d)) for d in same), key=lambda ns: -ns[1])
    own_q = [(q.shape[d], q.stride(d)) for d in range(q.dim() - 1) if d not in same]
    own_k = [(k.shape[d], k.stride(d)) for d in range(k.dim() - 1) if d not in same]

    def extent(dims: Dims) -> int:
        return max(_end(oq, dims + own_q, width), _end(ok, dims + own_k, width)) - min(oq, ok)

    # Outer dimensions both walk alike whose stride clears all the rest (batch, and in a
    # heads-first buffer the heads' block) repeat one pattern apart: set them aside.
    while shared and shared[0][1] >= extent(shared[1:]):
        shared = shared[1:]
    if _end(oq, shared + own_q, width) <= ok or _end(ok, shared + own_k, width) <= oq:
        return False
    if _stacks_apart(shared, extent([])):
        # Inner shared dimensions (seq of a seq-first buffer) repeat the block of heads apart.
        qs, ks = _starts(oq, own_q), _starts(ok, own_k)
    else:
        qs, ks = _starts(oq, shared + own_q), _starts(ok, shared + own_k)
    return _rows_meet(qs, ks.sort().values, width)


def written_apart(q: torch.Tensor, k: torch.Tensor) -> None:
    """Refuse a q or k that an in-place rotation would write some element of twice.

    Args:
        q: ``(..., head_dim)`` with unit stride in head_dim.
        k: the same number of dimensions and head_dim.

    Raises:
        ValueError: an expanded or self-overlapping q or k, or a q and k that share elements.
    """
    if _checks.tracing():
        return
    for name, t in (("q", q), ("k", k)):
        # Each alone, even beside an empty other (RotaryEmbedding.rotate passes k = x[:, :0]).
        if t.numel() and overlaps_itself(t):
            raise InputError(
                f"inplace=True writes {name}, but {name} has elements that share memory (an "
                f"expanded or overlapping view, strides {t.stride()}); pass "
                f"{name}.contiguous() or inplace=False"
            )
    if not q.numel() or not k.numel():
        return
    sq, sk = q.untyped_storage(), k.untyped_storage()
    q0, k0 = sq.data_ptr(), sk.data_ptr()
    if q0 != k0 and (q0 + sq.nbytes() <= k0 or k0 + sk.nbytes() <= q0):
        return
    if q0 == k0 and q.element_size() == k.element_size() and not _views_meet(q, k):
        return
    if q0 != k0 or q.element_size() != k.element_size():
        # Storages that alias in part (torch.frombuffer twice): nothing cheap is exact.
        raise InputError(
            "inplace=True writes q and k, but their storages overlap in memory; pass separate "
            "tensors, or inplace=False"
        )
    raise InputError(
        "inplace=True writes q and k, but they share elements (k is a view of q's heads, or "
        "the reverse), so the result would depend on the order of the writes; pass separate "
        "tensors, or inplace=False"
    )
