"""Fused RoPE paths and the one entry point that picks among them.

Backends:

- ``"reference"``: :func:`posemb.kernels.reference.apply_rope`, plain PyTorch, any dtype and device.
- ``"cpu"``: the fused C++ loop of :mod:`posemb.kernels.cpu` (float32, bfloat16, float16).
- ``"triton"``: the kernel of :mod:`posemb.kernels.triton`, for CUDA tensors (or CPU tensors
  under ``TRITON_INTERPRET=1``, which is how the tests run it).
- ``"auto"``: the fastest that can run for the tensors at hand; float64 always takes the
  reference. When a fused path is unavailable, the reason is logged once.

The fused paths are registered PyTorch ops (:mod:`posemb.kernels.ops`,
:mod:`posemb.kernels.triton`): ``torch.ops.posemb.rotate_cpu`` / ``rotate_triton`` out of place,
with autograd whose backward is the same kernel rotating by -theta and which keeps nothing but
the tables, and ``rotate_cpu_`` / ``rotate_triton_`` in place. Each has a fake implementation,
so models using them compile with ``torch.compile(fullgraph=True)`` and export. ``inplace=True``
rotates q and k in their own memory (inference) and refuses tensors that require grad.

This package is the bottom layer of posemb: the pairing convention (:mod:`.layout`), the
reference rotation (:mod:`.reference`) and the fused ops; it imports nothing from the modules,
scalings or interop above it.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch.autograd import forward_ad as _forward_ad

from .. import _checks, _extras, _renamed
from .._errors import BackendUnavailable, InputError
from . import cpu as _cpu
from . import fast as _fast
from . import ops as _ops  # noqa: F401  (registers the Python halves of the CPU ops)
from . import overlap as _overlap
from . import reference
from .layout import Layout, as_layout
from .norm import norm_rotate

logger = logging.getLogger("posemb.kernels")

BACKENDS = ("auto", "reference", "cpu", "triton")
_logged: set[str] = set()


def _log_once(key: str, message: str) -> None:
    if key not in _logged:
        _logged.add(key)
        logger.warning(message)


def triton_unavailable_reason() -> str | None:
    """Why the Triton backend cannot run here, or None (importing triton takes ~3 s)."""
    try:
        from . import triton as _  # noqa: F401
    except ImportError as err:
        return str(_extras.missing(err, "the Triton backend", "triton"))
    return None


def status() -> dict[str, str]:
    """Each backend and whether it can run here: ``"available"`` or why not.

    Builds the CPU kernel if it is not built yet, and imports triton (~3 s).
    """
    cpu_reason = _cpu.unavailable_reason()
    triton_reason = triton_unavailable_reason()
    if triton_reason is None and not torch.cuda.is_available():
        triton_reason = "no CUDA device here (tests run the kernel with TRITON_INTERPRET=1)"
    return {
        "reference": "available",
        "cpu": "available" if cpu_reason is None else cpu_reason,
        "triton": "available" if triton_reason is None else triton_reason,
    }


def resolve_backend(backend: str, x: torch.Tensor) -> str:
    """The concrete backend ('reference', 'cpu' or 'triton') for ``x``.

    Raises ``ValueError`` for an unknown name or a backend that does not fit the device, and
    ``RuntimeError`` when an explicitly requested backend is not available.
    """
    if backend not in BACKENDS:
        raise InputError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    on_cuda = x.device.type == "cuda"
    if backend == "auto":
        if x.dtype not in _cpu.DTYPES:
            return "reference"
        if on_cuda:
            reason = triton_unavailable_reason()
            if reason is None:
                return "triton"
            _log_once("triton", f"posemb: Triton RoPE unavailable ({reason}); using the reference")
            return "reference"
        if x.device.type == "cpu" and _cpu.available():
            return "cpu"
        return "reference"
    if backend == "cpu":
        if x.device.type != "cpu":
            raise InputError(f"backend='cpu' needs CPU tensors, got a tensor on {x.device}")
        if x.dtype not in _cpu.DTYPES:
            raise InputError(f"backend='cpu' supports float32, bfloat16, float16, got {x.dtype}")
        reason = _cpu.unavailable_reason()
        if reason is not None:
            raise BackendUnavailable(f"backend='cpu' is unavailable: {reason}")
    if backend == "triton":
        reason = triton_unavailable_reason()
        if reason is not None:
            raise BackendUnavailable(f"backend='triton' is unavailable: {reason}")
        from .triton import interpreting

        if not on_cuda and not interpreting():
            raise InputError(
                f"backend='triton' needs CUDA tensors, got a tensor on {x.device} (set "
                f"TRITON_INTERPRET=1 to run it on the CPU for testing)"
            )
        if x.dtype not in _cpu.DTYPES:
            raise InputError(f"backend='triton' supports float32, bfloat16, float16, got {x.dtype}")
    return backend


def _check_pair(q: object, k: object, varlen: bool) -> tuple[torch.Tensor, torch.Tensor]:
    q = _checks.float_tensor("q", q)
    k = _checks.float_tensor("k", k)
    want = "(total, heads, head_dim)" if varlen else "(batch, heads, seq, head_dim)"
    dims = 3 if varlen else 4
    for name, t in (("q", q), ("k", k)):
        _checks.not_meta(name, t)
        if t.dim() != dims:
            raise InputError(f"{name} must have shape {want}, got shape {tuple(t.shape)}")
        if t.numel() and t.stride(-1) != 1:
            raise InputError(
                f"{name} must have unit stride in its last dimension (got strides "
                f"{t.stride()}); pass {name}.contiguous()"
            )
    same = (0, 2, 3) if not varlen else (0, 2)
    if any(q.shape[i] != k.shape[i] for i in same) or q.dtype != k.dtype or q.device != k.device:
        raise InputError(
            f"q and k must agree in every dimension but heads, and in dtype and device; got "
            f"q {tuple(q.shape)} {q.dtype} {q.device}, k {tuple(k.shape)} {k.dtype} {k.device}"
        )
    return q, k


def _key_tables(
    cos: torch.Tensor, k_cos: object, k_sin: object
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Optional separate tables for k (xPos): both or neither, shaped like cos."""
    if k_cos is None and k_sin is None:
        return None, None
    if k_cos is None or k_sin is None:
        raise InputError("k_cos and k_sin go together: pass both or neither")
    kc = _checks.float_tensor("k_cos", k_cos)
    ks = _checks.float_tensor("k_sin", k_sin)
    if kc.shape != cos.shape or ks.shape != cos.shape or kc.device != cos.device:
        raise InputError(
            f"k_cos and k_sin must have cos's shape {tuple(cos.shape)} and device, got "
            f"{tuple(kc.shape)} and {tuple(ks.shape)}"
        )
    return kc, ks


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float32).contiguous()


def _f32_or_none(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else _f32(t)


def _plain_eager(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Nothing traces these tensors and nothing needs their gradient: the functional op can
    be skipped (compile, export and autograd always go through it)."""
    return (
        type(q) is torch.Tensor
        and type(k) is torch.Tensor
        and not torch.compiler.is_compiling()
        and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad))
    )


def _needs_grad(*tensors: torch.Tensor | None) -> bool:
    if not torch.is_grad_enabled():
        return False
    for t in tensors:  # noqa: SIM110 (a loop, not any() of a generator: every decode step)
        if t is not None and t.requires_grad:
            return True
    return False


def _refuse_inplace_grad(inplace: bool, q: torch.Tensor, k: torch.Tensor, *tables: object) -> None:
    if not inplace:
        return
    if _needs_grad(q, k, *(t for t in tables if isinstance(t, torch.Tensor))):
        raise InputError(
            "inplace=True rotates q and k in their own memory, which autograd cannot "
            "differentiate (q, k or a cos/sin table requires grad); use inplace=False for "
            "training, or run under torch.no_grad()"
        )
    _overlap.written_apart(q, k)


def _pick_backend(backend: str, q: torch.Tensor, *tables: torch.Tensor | None) -> str:
    """:func:`resolve_backend`, but the reference where a fused op cannot give the answer:

    - under a ``torch.func`` transform (vmap, grad, jacrev, jvp) or forward-mode AD
      (``torch.autograd.forward_ad.dual_level``): the ops have no batching rule, their
      autograd is not a functorch one and they have no forward derivative (the tangent was
      dropped); the reference is plain torch;
    - where a table needs a gradient: the fused ops differentiate with respect to q and k
      only (the tables are constants of a model), and a learned or scaled table must still
      get its gradient (issue 30, item 6).
    """
    which = resolve_backend(backend, q)
    if which == "reference":
        return which
    if torch._C._functorch.maybe_current_level() is not None:
        return "reference"
    if _forward_ad._current_level >= 0:
        return "reference"  # a dual q or k: the fused ops have no forward-mode derivative
    if _needs_grad(*tables):
        _log_once(
            f"table-grad-{which}",
            f"posemb: cos/sin tables that require grad take the reference rotation (the "
            f"{which} op has no gradient for them)",
        )
        return "reference"
    return which


def _reference_pair(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cos: torch.Tensor | None,
    k_sin: torch.Tensor | None,
    layout: Layout,
    inplace: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain PyTorch: traceable as it is, so it needs no registered op."""
    qr = reference.rotate(q, cos, sin, layout)
    kr = reference.rotate(
        k, cos if k_cos is None else k_cos, sin if k_sin is None else k_sin, layout
    )
    if inplace:
        return q.copy_(qr), k.copy_(kr)
    return qr, kr


def _cpu_pair(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cos: torch.Tensor | None,
    k_sin: torch.Tensor | None,
    layout: Layout,
    inplace: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.ops.posemb.rotate_cpu`` / ``rotate_cpu_`` on per-token tables."""

    def table(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else _f32(t if t.dim() == 3 else t[None])

    c, s, kc, ks = table(cos), table(sin), table(k_cos), table(k_sin)
    assert c is not None and s is not None
    interleaved = layout is Layout.INTERLEAVED
    if inplace:
        torch.ops.posemb.rotate_cpu_.default(q, k, c, s, kc, ks, interleaved, False)
        return q, k
    if _plain_eager(q, k):
        # The functional op with its autograd kernel (registered from Python) took 17-19 us
        # for a decode step's q and k even when nothing needs a gradient, and a decode step
        # calls this once per layer; allocating here and rotating into the outputs took 9 us.
        q_out, k_out = torch.empty_like(q), torch.empty_like(k)
        torch.ops.posemb._rotate_cpu_into.default(
            q, k, q_out, k_out, c, s, kc, ks, interleaved, False
        )
        return q_out, k_out
    q_out, k_out = torch.ops.posemb.rotate_cpu.default(q, k, c, s, kc, ks, interleaved, False)
    return q_out, k_out


def _traced_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cos: torch.Tensor | None,
    k_sin: torch.Tensor | None,
    lay: Layout,
    which: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """In place while torch traces: the overlap check has no storage to read there, so the
    rotation is formed out of place and written back, which rotates every element once even
    when q and k share some (a fused in-place op turned a shared head twice under compile)."""
    q_out, k_out = rotate(
        q, k, cos, sin, k_cos=k_cos, k_sin=k_sin, layout=lay, backend=which, inplace=False
    )
    return q.copy_(q_out), k.copy_(k_out)


def rotate(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    k_cos: torch.Tensor | None = None,
    k_sin: torch.Tensor | None = None,
    layout: Layout | str = Layout.HALF,
    backend: str = "auto",
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k by per-token tables, through the chosen backend.

    The fused backends run as registered ops (``torch.ops.posemb.rotate_cpu``,
    ``rotate_triton`` and their in-place ``_`` forms), so this traces under ``torch.compile``
    and ``torch.export``; their backward rotates the gradients by -theta.

    Args:
        q: ``(batch, q_heads, seq, head_dim)``; any strides but unit stride in head_dim.
        k: ``(batch, kv_heads, seq, head_dim)``; kv_heads may differ (GQA/MQA).
        cos: ``(seq, r/2)`` or ``(batch, seq, r/2)`` (attention factor already applied).
        sin: the same shape.
        k_cos: the cos table for k when it differs from q's (xPos); default ``cos``.
        k_sin: the same, for sin; default ``sin``.
        layout: pairing of channels.
        backend: one of :data:`BACKENDS`.
        inplace: write into q and k (no autograd).

    Returns:
        ``(q, k)`` rotated, dtypes kept.
    """
    signature = None
    if backend == "auto" and not inplace and k_cos is None and k_sin is None and _fast.plain(q, k):
        signature = _fast.rotate_signature(q, k, cos, sin, layout)
        if _fast.known_rotate(signature):  # every check below has passed for this signature
            lay = as_layout(layout)
            return _fast.rotate_cpu(
                q, k, _fast.op_table(cos), _fast.op_table(sin), lay is Layout.INTERLEAVED
            )
    q, k = _check_pair(q, k, varlen=False)
    cos, sin, _ = _checks.cos_sin_tables(cos, sin, q, (2, 3))
    _checks.per_token_tables(cos, q, "q")
    k_cos, k_sin = _key_tables(cos, k_cos, k_sin)
    lay = as_layout(layout)
    which = _pick_backend(backend, q, cos, sin, k_cos, k_sin)
    _refuse_inplace_grad(inplace, q, k, cos, sin, k_cos, k_sin)
    if inplace and _checks.tracing():
        return _traced_inplace(q, k, cos, sin, k_cos, k_sin, lay, which)
    if which == "reference":
        return _reference_pair(q, k, cos, sin, k_cos, k_sin, lay, inplace)
    if which == "cpu":
        if signature is not None:
            _fast.remember_rotate(signature)
        return _cpu_pair(q, k, cos, sin, k_cos, k_sin, lay, inplace)
    from . import triton as _tr  # noqa: F401  (registers the Triton ops; ~3 s to import)

    n = cos.shape[-1]
    stride = q.shape[2] if cos.dim() == 3 and cos.shape[0] > 1 else 0
    c, s = _f32(cos.reshape(-1, n)), _f32(sin.reshape(-1, n))
    kc = None if k_cos is None else _f32(k_cos.reshape(-1, n))
    ks = None if k_sin is None else _f32(k_sin.reshape(-1, n))
    flags = _triton_flags(lay, table_batch_stride=stride)
    if inplace:
        torch.ops.posemb.rotate_triton_(q, k, c, s, kc, ks, **flags)
        return q, k
    q_out, k_out = torch.ops.posemb.rotate_triton(q, k, c, s, kc, ks, **flags)
    return q_out, k_out


def _triton_flags(
    lay: Layout,
    positions: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int = 0,
    table_batch_stride: int = 0,
) -> dict[str, Any]:
    """The Triton ops' arguments after the tables, by name (forward: not conjugated)."""
    return {
        "interleaved": lay is Layout.INTERLEAVED,
        "conjugate": False,
        "positions": positions,
        "offsets": offsets,
        "cu_seqlens": cu_seqlens,
        "max_seqlen": max_seqlen,
        "table_batch_stride": table_batch_stride,
    }


def _cache_rows(
    q: torch.Tensor,
    cos: torch.Tensor,
    positions: torch.Tensor | None,
    offsets: torch.Tensor | int | None,
    cu_seqlens: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, int]:
    """Check :func:`rotate_cached`'s position arguments against ``q`` and the cache; return
    the table row of every token ``(batch, seq)``, the checked positions ``(batch, seq)``,
    offsets ``(batch,)`` and cu_seqlens ``(batch + 1,)`` (None where not given), and the
    longest sequence."""
    varlen = cu_seqlens is not None
    dev = q.device
    if varlen:
        if positions is not None:
            raise InputError("positions and cu_seqlens exclude each other: pass offsets instead")
        cu = _checks.positions(cu_seqlens, max_dim=1, name="cu_seqlens").to(dev)
        total = q.shape[0]
        if cu.numel() < 2 or int(cu[0]) != 0 or int(cu[-1]) != total:
            shown = cu.tolist() if cu.numel() <= 8 else f"[{int(cu[0])}, ..., {int(cu[-1])}]"
            raise InputError(
                f"cu_seqlens must start at 0 and end at the total length {total}, got {shown}"
            )
        if bool((cu[1:] < cu[:-1]).any()):
            raise InputError("cu_seqlens must be non-decreasing (sequence starts in order)")
        batch, seq_len = cu.numel() - 1, int((cu[1:] - cu[:-1]).max())
    else:
        batch, seq_len, cu = q.shape[0], q.shape[2], None
    pos = None
    if positions is not None:
        pos = _checks.positions_for("positions", positions, batch=batch, length=seq_len, device=dev)
        if pos.dim() == 1:
            pos = pos[None]
    off = None
    if offsets is not None:
        if isinstance(offsets, int) and not isinstance(offsets, bool):
            off = torch.full((batch,), offsets, dtype=torch.int64, device=dev)
        else:
            off = _checks.positions(offsets, max_dim=1, name="offsets").to(dev)
            if off.shape[0] != batch:
                raise InputError(f"offsets must have shape ({batch},), got {tuple(off.shape)}")
    for name, t in (("positions", pos), ("offsets", off)):
        if t is not None:  # a position plus an offset near 2^63 wrapped into a valid row
            _checks.within_limit(name, t)
    rows = reference.table_rows(batch, seq_len, pos, off, cu, device=dev)
    _checks.within_table(
        rows,
        cos.shape[0],
        f"the cached cos/sin table of {cos.shape[0]} rows",
        "build the cache for more positions",
    )
    return rows, pos, off, cu, seq_len


def rotate_cached(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    positions: torch.Tensor | None = None,
    offsets: torch.Tensor | int | None = None,
    cu_seqlens: torch.Tensor | None = None,
    layout: Layout | str = Layout.HALF,
    backend: str = "auto",
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k by rows of a cos/sin cache: the serving form (KV cache, packed batches).

    The row of a token is ``positions[b, t]`` (or its index t), plus ``offsets[b]``; with
    ``cu_seqlens`` the tensors are packed ``(total, heads, head_dim)`` and t counts from each
    sequence's start.

    Args:
        q: ``(batch, q_heads, seq, head_dim)``, or ``(total, q_heads, head_dim)`` with cu_seqlens.
        k: the same with kv_heads.
        cos: ``(rows, r/2)`` cache (e.g. ``RotaryEmbedding.cos_sin(torch.arange(L))[0]``).
        sin: the same shape.
        positions: ``(seq,)`` or ``(batch, seq)`` integer rows (not with cu_seqlens).
        offsets: per-sequence ``(batch,)`` integers or one int, added to each row.
        cu_seqlens: ``(batch + 1,)`` increasing integers from 0 to total.
        layout: as in :func:`rotate`.
        backend: as in :func:`rotate`.
        inplace: as in :func:`rotate`.

    Returns:
        ``(q, k)`` rotated.
    """
    varlen = cu_seqlens is not None
    q, k = _check_pair(q, k, varlen=varlen)
    _checks.cos_sin_tables(cos, sin, q, (2,))
    rows, pos, off, cu, seq_len = _cache_rows(q, cos, positions, offsets, cu_seqlens)
    lay = as_layout(layout)
    which = _pick_backend(backend, q, cos, sin)
    _refuse_inplace_grad(inplace, q, k, cos, sin)
    if inplace and _checks.tracing():
        q_out, k_out = rotate_cached(
            q, k, cos, sin, positions=positions, offsets=offsets, cu_seqlens=cu_seqlens,
            layout=lay, backend=which,
        )  # fmt: skip
        return q.copy_(q_out), k.copy_(k_out)  # as in rotate: every element turned once
    if which == "triton":
        from . import triton as _tr  # noqa: F401  (registers the Triton ops)

        flags = _triton_flags(lay, pos, off, cu, max_seqlen=seq_len if varlen else 0)
        if inplace:
            torch.ops.posemb.rotate_triton_(q, k, _f32(cos), _f32(sin), None, None, **flags)
            return q, k
        q_out, k_out = torch.ops.posemb.rotate_triton(
            q, k, _f32(cos), _f32(sin), None, None, **flags
        )
        return q_out, k_out
    # Reference and CPU: gather the rows into per-token tables, rotate (B, H, S, D) views of
    # the packed (total, H, D) tensors.
    c, s = cos[rows], sin[rows]
    pair = _cpu_pair if which == "cpu" else _reference_pair
    if not varlen:
        return pair(q, k, c, s, None, None, lay, inplace)
    qv, kv = q.permute(1, 0, 2)[None], k.permute(1, 0, 2)[None]  # (1, H, total, D) views
    q_out, k_out = pair(qv, kv, c[None], s[None], None, None, lay, inplace)
    if inplace:
        return q, k
    return q_out[0].permute(1, 0, 2), k_out[0].permute(1, 0, 2)


__all__ = [
    "BACKENDS",
    "Layout",
    "norm_rotate",
    "reference",
    "resolve_backend",
    "rotate",
    "rotate_cached",
    "status",
    "triton_unavailable_reason",
]

# rope_cached was the README's name before 0.2.
__getattr__ = _renamed.module_getattr(__name__, {"rope_cached": "rotate_cached"}, globals())
