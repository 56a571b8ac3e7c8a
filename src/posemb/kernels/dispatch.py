"""Which path rotates a call, and the checks every path shares: :func:`rotate` (per-token
tables) and :func:`rotate_cached` (rows of a cos/sin cache), the public entry points that
:mod:`posemb.kernels` re-exports.

Each call is checked once here (shapes, dtypes, devices, tables, the in-place rules), a backend
is picked (:func:`resolve_backend`, then :func:`pick_backend` for what a fused op cannot serve),
and the call goes to one path, each in a file of its own:

- the reference: :mod:`.reference` (plain torch, traceable, any dtype and device);
- the CPU op: :func:`.ops.cpu_pair`, with its decode fast path in :mod:`.fast`;
- the Triton kernel: :mod:`.triton_path` (the host side, with its own decode fast path) and
  :mod:`.triton` (the kernel and its registered ops).

A decode step repeats one signature (shapes, strides, dtypes, device) with new values: the last
signature that passed every check is remembered per path, and a call with the same signature
goes straight to its kernel (:mod:`.fast`, :mod:`.triton_path`).
"""

from __future__ import annotations

import logging

import torch
from torch.autograd import forward_ad as _forward_ad

from .. import _checks, _extras
from .._errors import BackendUnavailable, InputError
from . import cpu as _cpu
from . import fast as _fast
from . import overlap as _overlap
from . import reference
from . import triton_path as _triton_path
from .layout import Layout, as_layout
from .ops import cpu_pair

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


def check_pair(q: object, k: object, varlen: bool) -> tuple[torch.Tensor, torch.Tensor]:
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


def key_tables(
    cos: torch.Tensor, k_cos: object, k_sin: object
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Optional separate tables for k (xPos): both or neither, shaped like cos."""
    if k_cos is None and k_sin is None:
        return None, None
    if k_cos is None or k_sin is None:
        raise InputError("k_cos and k_sin go together: pass both or neither")
    kc = _checks.float_tensor("k_cos", k_cos)
    ks = _checks.float_tensor("k_sin", k_sin)
    if (
        kc.shape != cos.shape
        or ks.shape != cos.shape
        or kc.device != cos.device
        or ks.device != cos.device
    ):
        raise InputError(
            f"k_cos and k_sin must have cos's shape {tuple(cos.shape)} and device, got "
            f"{tuple(kc.shape)} and {tuple(ks.shape)}"
        )
    return kc, ks


def needs_grad(*tensors: torch.Tensor | None) -> bool:
    if not torch.is_grad_enabled():
        return False
    for t in tensors:  # noqa: SIM110 (a loop, not any() of a generator: every decode step)
        if t is not None and t.requires_grad:
            return True
    return False


def refuse_inplace_grad(inplace: bool, q: torch.Tensor, k: torch.Tensor, *tables: object) -> None:
    if not inplace:
        return
    if needs_grad(q, k, *(t for t in tables if isinstance(t, torch.Tensor))):
        raise InputError(
            "inplace=True rotates q and k in their own memory, which autograd cannot "
            "differentiate (q, k or a cos/sin table requires grad); use inplace=False for "
            "training, or run under torch.no_grad()"
        )
    for name, t in (("q", q), ("k", k)):
        if t.is_neg() or t.is_conj():
            raise InputError(
                f"inplace=True cannot write into {name}: it is a view with the negative or "
                f"conjugate bit set, whose memory is not its values; pass "
                f"{name}.resolve_neg() or use inplace=False"
            )
    _overlap.written_apart(q, k)


def pick_backend(backend: str, q: torch.Tensor, *tables: torch.Tensor | None) -> str:
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
    if needs_grad(*tables):
        _log_once(
            f"table-grad-{which}",
            f"posemb: cos/sin tables that require grad take the reference rotation (the "
            f"{which} op has no gradient for them)",
        )
        return "reference"
    return which


def reference_pair(
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


def traced_inplace(
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
    signature = triton_signature = None
    if backend == "auto" and not inplace and k_cos is None and k_sin is None:
        # A decode step: the signature of the last call that passed every check goes straight
        # to its kernel (posemb.kernels.fast for the CPU op, triton_path for CUDA).
        if _fast.plain(q, k) and q.is_cpu:
            signature = _fast.rotate_signature(q, k, cos, sin, layout)
            if _fast.known_rotate(signature):
                lay = as_layout(layout)
                return _fast.rotate_cpu(
                    q, k, _fast.op_table(cos), _fast.op_table(sin), lay is Layout.INTERLEAVED
                )
        elif _triton_path.plain(q, k):
            triton_signature = _triton_path.signature(q, k, cos, sin, layout)
            if _triton_path.known(triton_signature):
                return _triton_path.eager(q, k, cos, sin, as_layout(layout), triton_signature)
    q, k = check_pair(q, k, varlen=False)
    cos, sin, _ = _checks.cos_sin_tables(cos, sin, q, (2, 3))
    _checks.per_token_tables(cos, q, "q")
    k_cos, k_sin = key_tables(cos, k_cos, k_sin)
    lay = as_layout(layout)
    which = pick_backend(backend, q, cos, sin, k_cos, k_sin)
    refuse_inplace_grad(inplace, q, k, cos, sin, k_cos, k_sin)
    if inplace and _checks.tracing():
        return traced_inplace(q, k, cos, sin, k_cos, k_sin, lay, which)
    if which == "reference":
        return reference_pair(q, k, cos, sin, k_cos, k_sin, lay, inplace)
    if which == "cpu":
        if signature is not None:
            _fast.remember_rotate(signature)
        return cpu_pair(q, k, cos, sin, k_cos, k_sin, lay, inplace)
    _triton_path.remember(triton_signature)
    return _triton_path.pair(q, k, cos, sin, k_cos, k_sin, lay, inplace)


def cache_rows(
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
    q, k = check_pair(q, k, varlen=varlen)
    _checks.cos_sin_tables(cos, sin, q, (2,))
    rows, pos, off, cu, seq_len = cache_rows(q, cos, positions, offsets, cu_seqlens)
    lay = as_layout(layout)
    which = pick_backend(backend, q, cos, sin)
    refuse_inplace_grad(inplace, q, k, cos, sin)
    if inplace and _checks.tracing():
        q_out, k_out = rotate_cached(
            q, k, cos, sin, positions=positions, offsets=offsets, cu_seqlens=cu_seqlens,
            layout=lay, backend=which,
        )  # fmt: skip
        return q.copy_(q_out), k.copy_(k_out)  # as in rotate: every element turned once
    if which == "triton":
        return _triton_path.cached(q, k, cos, sin, lay, pos, off, cu, seq_len, inplace)
    # Reference and CPU: gather the rows into per-token tables, rotate (B, H, S, D) views of
    # the packed (total, H, D) tensors.
    c, s = cos[rows], sin[rows]
    pair = cpu_pair if which == "cpu" else reference_pair
    if not varlen:
        return pair(q, k, c, s, None, None, lay, inplace)
    qv, kv = q.permute(1, 0, 2)[None], k.permute(1, 0, 2)[None]  # (1, H, total, D) views
    q_out, k_out = pair(qv, kv, c[None], s[None], None, None, lay, inplace)
    if inplace:
        return q, k
    return q_out[0].permute(1, 0, 2), k_out[0].permute(1, 0, 2)
