"""Fused RoPE paths and the one entry point that picks among them.

Backends:

- ``"reference"``: :func:`posemb.kernels.reference.apply_rope`, plain PyTorch, any dtype and device.
- ``"cpu"``: the fused C++ loop of :mod:`posemb.kernels.cpu` (float32, bfloat16, float16).
- ``"triton"``: the kernel of :mod:`posemb.kernels.triton`, for CUDA tensors (or CPU tensors
  under ``TRITON_INTERPRET=1``, which is how the tests run it).
- ``"auto"``: the fastest that can run for the tensors at hand; float64 always takes the
  reference. When a fused path is unavailable, the reason is logged once.

Training through a fused path uses :class:`RotaryFunction`, whose backward is the same kernel
rotating by -theta; it keeps nothing but cos and sin. ``inplace=True`` rotates q and k in their
own memory (inference) and refuses tensors that require grad.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from .. import _checks, _renamed
from . import cpu as _cpu
from . import reference
from .layout import Layout, as_layout

logger = logging.getLogger("posemb.kernels")

BACKENDS = ("auto", "reference", "cpu", "triton")
_logged: set[str] = set()


def _log_once(key: str, message: str) -> None:
    if key not in _logged:
        _logged.add(key)
        logger.warning(message)


def triton_unavailable_reason() -> str | None:
    """Why the Triton backend cannot run here, or None."""
    try:
        from . import triton as _  # noqa: F401
    except ImportError as err:
        return f"triton is not installed ({err}); pip install triton"
    return None


def resolve_backend(backend: str, x: torch.Tensor) -> str:
    """The concrete backend ('reference', 'cpu' or 'triton') for ``x``.

    Raises ``ValueError`` for an unknown name or a backend that does not fit the device, and
    ``RuntimeError`` when an explicitly requested backend is not available.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
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
        if x.device.type == "cpu" and _cpu.load() is not None:
            return "cpu"
        return "reference"
    if backend == "cpu":
        if x.device.type != "cpu":
            raise ValueError(f"backend='cpu' needs CPU tensors, got a tensor on {x.device}")
        if x.dtype not in _cpu.DTYPES:
            raise ValueError(f"backend='cpu' supports float32, bfloat16, float16, got {x.dtype}")
        reason = _cpu.unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"backend='cpu' is unavailable: {reason}")
    if backend == "triton":
        reason = triton_unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"backend='triton' is unavailable: {reason}")
        from .triton import interpreting

        if not on_cuda and not interpreting():
            raise ValueError(
                f"backend='triton' needs CUDA tensors, got a tensor on {x.device} (set "
                f"TRITON_INTERPRET=1 to run it on the CPU for testing)"
            )
        if x.dtype not in _cpu.DTYPES:
            raise ValueError(f"backend='triton' supports float32, bfloat16, float16, got {x.dtype}")
    return backend


# A launcher rotates (q, k) with fixed tables: launcher(q, k, conjugate, inplace) -> (q', k').
Launcher = Callable[[torch.Tensor, torch.Tensor, bool, bool], tuple[torch.Tensor, torch.Tensor]]


class RotaryFunction(torch.autograd.Function):
    """Autograd for a fused rotation: backward rotates the gradients by -theta.

    Rotation is linear and orthogonal (times the attention factor), so dL/dx = R^T dL/dy, and
    R^T is the same kernel with the sine negated. Nothing is saved but the launcher, which
    holds cos and sin; gradients flow to q and k, not to the tables.
    """

    @staticmethod
    def forward(ctx, q, k, launcher):
        ctx.launcher = launcher
        return launcher(q, k, False, False)

    @staticmethod
    def backward(ctx, grad_q, grad_k):
        # An output that did not reach the loss has no gradient: stand in zero heads for it.
        gq = grad_q if grad_q is not None else grad_k[:, :0]
        gk = grad_k if grad_k is not None else grad_q[:, :0]
        dq, dk = ctx.launcher(_unit_last(gq), _unit_last(gk), True, False)
        return (dq if grad_q is not None else None), (dk if grad_k is not None else None), None


def _unit_last(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _check_pair(q: object, k: object, varlen: bool) -> tuple[torch.Tensor, torch.Tensor]:
    q = _checks.float_tensor("q", q)
    k = _checks.float_tensor("k", k)
    want = "(total, heads, head_dim)" if varlen else "(batch, heads, seq, head_dim)"
    dims = 3 if varlen else 4
    for name, t in (("q", q), ("k", k)):
        if t.dim() != dims:
            raise ValueError(f"{name} must have shape {want}, got shape {tuple(t.shape)}")
        if t.numel() and t.stride(-1) != 1:
            raise ValueError(
                f"{name} must have unit stride in its last dimension (got strides "
                f"{t.stride()}); pass {name}.contiguous()"
            )
    same = (0, 2, 3) if not varlen else (0, 2)
    if any(q.shape[i] != k.shape[i] for i in same) or q.dtype != k.dtype or q.device != k.device:
        raise ValueError(
            f"q and k must agree in every dimension but heads, and in dtype and device; got "
            f"q {tuple(q.shape)} {q.dtype} {q.device}, k {tuple(k.shape)} {k.dtype} {k.device}"
        )
    return q, k


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float32).contiguous()


def _rotate(
    q: torch.Tensor,
    k: torch.Tensor,
    launcher: Launcher,
    backend: str,
    inplace: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)
    if inplace:
        if needs_grad:
            raise ValueError(
                "inplace=True rotates q and k in their own memory, which autograd cannot "
                "differentiate; use inplace=False for training, or run under torch.no_grad()"
            )
        return launcher(q, k, False, True)
    if needs_grad and backend != "reference":
        return RotaryFunction.apply(q, k, launcher)
    return launcher(q, k, False, False)


def _reference_launcher(
    cos: torch.Tensor, sin: torch.Tensor, layout: Layout, to_bhsd: Callable, from_bhsd: Callable
) -> Launcher:
    def run(q, k, conjugate, inplace):
        outs = []
        for x in (q, k):
            y = from_bhsd(reference.rotate(to_bhsd(x), cos, sin, layout, conjugate))
            outs.append(x.copy_(y) if inplace else y)
        return outs[0], outs[1]

    return run


def _cpu_launcher(
    cos: torch.Tensor, sin: torch.Tensor, layout: Layout, to_bhsd: Callable
) -> Launcher:
    cos3, sin3 = (
        _f32(cos if cos.dim() == 3 else cos[None]),
        _f32(sin if sin.dim() == 3 else sin[None]),
    )
    interleaved = layout is Layout.INTERLEAVED

    def run(q, k, conjugate, inplace):
        outs = []
        for x in (q, k):
            out = x if inplace else torch.empty_like(x)
            _cpu.rope_apply(to_bhsd(x), cos3, sin3, to_bhsd(out), interleaved, conjugate)
            outs.append(out)
        return outs[0], outs[1]

    return run


def rotate(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    layout: Layout | str = Layout.HALF,
    backend: str = "auto",
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k by per-token tables, through the chosen backend.

    Args:
        q: ``(batch, q_heads, seq, head_dim)``; any strides but unit stride in head_dim.
        k: ``(batch, kv_heads, seq, head_dim)``; kv_heads may differ (GQA/MQA).
        cos, sin: ``(seq, r/2)`` or ``(batch, seq, r/2)`` (attention factor already applied).
        layout: pairing of channels.
        backend: one of :data:`BACKENDS`.
        inplace: write into q and k (no autograd).

    Returns:
        ``(q, k)`` rotated, dtypes kept.
    """
    q, k = _check_pair(q, k, varlen=False)
    _checks.cos_sin_tables(cos, sin, q, (2, 3))
    _checks.per_token_tables(cos, q, "q")
    lay = as_layout(layout)
    which = resolve_backend(backend, q)
    if which == "reference":
        launcher = _reference_launcher(cos, sin, lay, lambda x: x, lambda x: x)
    elif which == "cpu":
        launcher = _cpu_launcher(cos, sin, lay, lambda x: x)
    else:
        launcher = _triton_launcher(
            _f32(cos.reshape(-1, cos.shape[-1])),
            _f32(sin.reshape(-1, sin.shape[-1])),
            lay,
            table_batch_stride=q.shape[2] if cos.dim() == 3 and cos.shape[0] > 1 else 0,
        )
    return _rotate(q, k, launcher, which, inplace)


def _triton_launcher(
    cos: torch.Tensor,
    sin: torch.Tensor,
    layout: Layout,
    positions: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int | None = None,
    table_batch_stride: int = 0,
) -> Launcher:
    from . import triton as _tr

    def run(q, k, conjugate, inplace):
        q_out = q if inplace else torch.empty_like(q)
        k_out = k if inplace else torch.empty_like(k)
        _tr.launch(
            q,
            k,
            q_out,
            k_out,
            cos,
            sin,
            interleaved=layout is Layout.INTERLEAVED,
            conjugate=conjugate,
            positions=positions,
            offsets=offsets,
            cu_seqlens=cu_seqlens,
            max_seqlen=max_seqlen,
            table_batch_stride=table_batch_stride,
        )
        return q_out, k_out

    return run


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
        cos, sin: ``(rows, r/2)`` caches (e.g. ``RotaryEmbedding.cos_sin(torch.arange(L))``).
        positions: ``(seq,)`` or ``(batch, seq)`` integer rows (not with cu_seqlens).
        offsets: per-sequence ``(batch,)`` integers or one int, added to each row.
        cu_seqlens: ``(batch + 1,)`` increasing integers from 0 to total.
        layout, backend, inplace: as in :func:`rotate`.

    Returns:
        ``(q, k)`` rotated.
    """
    varlen = cu_seqlens is not None
    q, k = _check_pair(q, k, varlen=varlen)
    _checks.cos_sin_tables(cos, sin, q, (2,))
    dev = q.device
    if varlen:
        if positions is not None:
            raise ValueError("positions and cu_seqlens exclude each other: pass offsets instead")
        cu = _checks.positions(cu_seqlens, max_dim=1, name="cu_seqlens").to(dev)
        total = q.shape[0]
        if cu.numel() < 2 or int(cu[0]) != 0 or int(cu[-1]) != total:
            shown = cu.tolist() if cu.numel() <= 8 else f"[{int(cu[0])}, ..., {int(cu[-1])}]"
            raise ValueError(
                f"cu_seqlens must start at 0 and end at the total length {total}, got {shown}"
            )
        if bool((cu[1:] < cu[:-1]).any()):
            raise ValueError("cu_seqlens must be non-decreasing (sequence starts in order)")
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
                raise ValueError(f"offsets must have shape ({batch},), got {tuple(off.shape)}")
    rows = reference.table_rows(batch, seq_len, pos, off, cu, device=dev)
    _checks.within_table(
        rows,
        cos.shape[0],
        f"the cached cos/sin table of {cos.shape[0]} rows",
        "build the cache for more positions",
    )
    lay = as_layout(layout)
    which = resolve_backend(backend, q)
    if which == "triton":
        launcher = _triton_launcher(
            _f32(cos), _f32(sin), lay, pos, off, cu, seq_len if varlen else None
        )
        return _rotate(q, k, launcher, which, inplace)
    # Reference and CPU: gather the rows into per-token tables, rotate (B, H, S, D) views.
    c, s = cos[rows], sin[rows]
    if varlen:

        def to_bhsd(x):  # (total, H, D) -> (1, H, total, D), a view
            return x.permute(1, 0, 2)[None]

        def from_bhsd(x):
            return x[0].permute(1, 0, 2)

        c, s = c[None], s[None]
    else:

        def to_bhsd(x):
            return x

        from_bhsd = to_bhsd
    if which == "cpu":
        launcher = _cpu_launcher(c, s, lay, to_bhsd)
    else:
        launcher = _reference_launcher(c, s, lay, to_bhsd, from_bhsd)
    return _rotate(q, k, launcher, which, inplace)


__all__ = [
    "BACKENDS",
    "Layout",
    "RotaryFunction",
    "reference",
    "resolve_backend",
    "rotate",
    "rotate_cached",
    "triton_unavailable_reason",
]

# rope_cached was the README's name before 0.2.
__getattr__ = _renamed.module_getattr(__name__, {"rope_cached": "rotate_cached"}, globals())
