"""The decode fast path: a call shaped like one that already passed every check goes straight
to the CPU op.

A decode step rotates one token per layer, 32 to 80 times, with tensors whose shapes, strides,
dtypes and devices are the same each time; only their values change. At those sizes the op
itself takes a few microseconds and the Python around it (argument checks, backend choice,
table lookup) took 3-5x that, which made a decode step through posemb slower than through
transformers (issue 35). Every check :func:`posemb.kernels.rotate` makes reads only that
signature, never a value, so the signature of the last call that passed them all and took the
CPU op is kept, and a call with the same signature skips them: it refuses nothing the full
path would accept and accepts nothing it would refuse.

Only the plainest calls qualify (:func:`plain`): real ``torch.Tensor`` s, out of place, no
gradient wanted, nothing tracing, no forward-mode AD, the ``"auto"`` backend with the op loaded.
Anything else, including every call under ``torch.compile`` or ``torch.export``, takes the full
path, and nothing is remembered while tracing.

The tables a rotary module forms for a decode step's positions are also kept
(:class:`TableMemo`), keyed on the position *values* (read on the host, as the full path reads
them anyway), never on a tensor's identity: a positions tensor freed and another allocated at
the same address, or written in place, can never be served another step's angles.

What each cache here is keyed on (nothing rests on a version counter, a data pointer or a
tensor's identity; a fused optimizer step and a write through ``.data`` bump no counter):

- ``_last_rotate``: the signature of the last call that passed every check (shapes, strides,
  dtypes, devices, ``requires_grad``, grad mode, layout). It selects which checks to skip, never
  a value: what is computed is always computed from the call's own tensors.
- :data:`TABLES`: one entry, keyed on the rotary module's type, scaling, base and rotary_dim and
  the positions' shape and values: everything the tables are a function of.
- :class:`DerivedRotation`: nothing. The ``_into`` ops read the model's tables and the norms'
  weights as they are at each call, in their own dtype and strides.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.autograd import forward_ad as _forward_ad

from .. import _checks
from .._checks import (  # bound once: DerivedRotation makes _checks.tracing()'s test inline
    _FAKE_MODE,
    _PROXY_MODE,
    _dispatch_mode,
    _functorch_level,
    _is_compiling,
    _jit_tracing,
)
from . import cpu as _cpu

Signature = tuple[object, ...]

SMALL = 64
"""Most positions a call may carry to use the table memo (a decode step has batch x tokens)."""

_grad_enabled = torch.is_grad_enabled
_tracing = _checks.tracing


def plain(q: object, k: object) -> bool:
    """Eager tensors that nothing traces and nothing differentiates, with the CPU op loaded.

    A gradient wanted for q or k (or for a table: the caller's signature holds the tables'
    requires_grad flags) needs the autograd op, and a tracer or ``torch.func`` transform
    needs the full path's choices; the fast path serves neither.
    """
    return (
        type(q) is torch.Tensor
        and type(k) is torch.Tensor
        and _cpu._loaded is not None
        and not (_grad_enabled() and (q.requires_grad or k.requires_grad))
        and _forward_ad._current_level < 0
        and not _tracing()
    )


def tensor_signature(t: torch.Tensor) -> Signature:
    """What the checks read of a tensor: shape, strides, dtype, device, requires_grad."""
    return (t.shape, t.stride(), t.dtype, t.is_cpu, t.requires_grad)


def rotate_signature(
    q: torch.Tensor, k: torch.Tensor, cos: object, sin: object, layout: object
) -> Signature | None:
    """The signature of a :func:`posemb.kernels.rotate` call (None if a table is no tensor)."""
    if type(cos) is not torch.Tensor or type(sin) is not torch.Tensor:
        return None
    return (
        tensor_signature(q),
        tensor_signature(k),
        tensor_signature(cos),
        tensor_signature(sin),
        layout,
        torch.is_grad_enabled(),  # a table that requires grad takes the reference only then
    )


_last_rotate: Signature | None = None


def remember_rotate(signature: Signature | None) -> None:
    """Record the signature of a call that passed every check and took the CPU op."""
    global _last_rotate
    if signature is not None and not _checks.tracing():
        _last_rotate = signature


def known_rotate(signature: Signature | None) -> bool:
    """Whether ``signature`` is that of the last call that passed every check."""
    return signature is not None and signature == _last_rotate


def forget() -> None:
    """Drop every remembered signature and table (tests; after swapping the CPU op)."""
    global _last_rotate
    _last_rotate = None
    TABLES.clear()
    from . import triton_path

    triton_path.forget()


def rotate_cpu(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The CPU op on checked tensors: cos and sin float32, contiguous, ``(1 or B, S, n)``."""
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    torch.ops.posemb._rotate_cpu_into.default(
        q, k, q_out, k_out, cos, sin, None, None, interleaved, False
    )
    return q_out, k_out


def op_table(t: torch.Tensor) -> torch.Tensor:
    """A per-token table as the CPU op reads it: float32, contiguous, ``(1 or B, S, n)``."""
    t = t if t.dim() == 3 else t[None]
    return t.to(torch.float32).contiguous()


def position_values(positions: torch.Tensor) -> tuple[int, ...] | None:
    """A small CPU positions tensor's values (one host copy), or None where there are many or
    they live on a device (reading them would be a sync per layer)."""
    if not positions.is_cpu or positions.numel() > SMALL:
        return None
    return tuple(positions.flatten().tolist())


class TableMemo:
    """The op-ready tables of the last decode step, shared by every module that forms the
    same ones: a model whose layers each own a rotary module forms them once per step.

    The key holds all a table depends on (the module's type, scaling, base, rotary_dim and
    the positions' shape and values); one entry is kept, so memory never grows.
    """

    def __init__(self) -> None:
        self._entry: tuple[Signature, torch.Tensor, torch.Tensor] | None = None

    def get(self, key: Signature) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The tables stored under ``key``, or None."""
        entry = self._entry  # one read: another thread may replace it meanwhile
        if entry is not None and entry[0] == key:
            return entry[1], entry[2]
        return None

    def put(self, key: Signature, cos: torch.Tensor, sin: torch.Tensor) -> None:
        """Keep ``(cos, sin)`` under ``key`` (never while tracing: those are not real)."""
        if not _checks.tracing():
            self._entry = (key, cos, sin)

    def clear(self) -> None:
        """Forget the entry."""
        self._entry = None


TABLES = TableMemo()


TABLE_FORMS = (0, 1, 2)
"""What the ``_into`` ops read of a table: all of it, its first half, every other entry."""


class DerivedRotation:
    """The rotation ``patch_rotary(model, fused=True)`` puts in transformers' attention, for
    the calls the CPU op serves: the op reads the part of each table it needs (``form``) in the
    table's own dtype and strides, and the norm weights as the module holds them.

    Inside a model each Python call and attribute chain is taken with cold caches: there the
    signature path cost 107 us per layer where transformers' own rotation cost 77 us and the
    op with its two allocations 51 us (a 2-layer Llama decoding, 2 threads). So this is one
    flat call: the checks the op does not make (device, q and k agreeing in batch and
    head_dim, nothing tracing or differentiating) inline, the rest left to the op, whose
    refusal sends the call to the full path, which names what is wrong.

    Nothing is kept between calls. An earlier version kept each step's tables cut and cast to
    float32, and the norms' weights with their offset, keyed on the source tensors' identity
    and version counters; a fused optimizer step or a write through ``.data`` changes a tensor
    without bumping its counter, so those forms went stale and the logits silently wrong. The
    op now widens and packs what it reads itself (a decode step's tables and weights are a few
    hundred numbers), which costs less than the Python that formed them.

    Args:
        form: what the op reads of a ``(B, S, w)`` table: 0 all of it (one entry per pair), 1
            its first half (``cat([c, c])``), 2 every other entry (``repeat_interleave(c, 2)``).
        interleaved: the pairing of channels.
    """

    def __init__(self, form: int, interleaved: bool) -> None:
        if form not in TABLE_FORMS:
            raise ValueError(f"form must be one of {TABLE_FORMS}, got {form!r}")
        self._form = form
        self._interleaved = interleaved

    def __call__(
        self,
        q: object,
        k: object,
        cos: object,
        sin: object,
        norms: tuple[torch.Tensor, torch.Tensor, float, float] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(q, k)`` rotated through the op, or None where the full path must run.

        With ``norms`` = ``(q_weight, k_weight, eps, weight_offset)`` each head is first
        RMS-normalised, as :func:`posemb.kernels.norm_rotate` does, with the weights read at
        this call.
        """
        if not (
            type(q) is torch.Tensor
            and type(k) is torch.Tensor
            and type(cos) is torch.Tensor
            and type(sin) is torch.Tensor
            and q.is_cpu  # first: on a GPU this is the one test a decode step pays for
            and _rotate_into is not None
            and _cpu._loaded is not None
            and not (
                _grad_enabled()
                and (q.requires_grad or k.requires_grad or cos.requires_grad or sin.requires_grad)
            )
            and _forward_ad._current_level < 0
            # _checks.tracing() inline; export's fake inputs fail the type test above
            and not _is_compiling()
            and _functorch_level() is None
            and _dispatch_mode(_FAKE_MODE) is None
            and _dispatch_mode(_PROXY_MODE) is None
            and not _jit_tracing()
            and k.is_cpu
            and cos.is_cpu
            and sin.is_cpu
            and q.shape[0] == k.shape[0]
            and q.shape[-1] == k.shape[-1]
            and cos.dim() == 3
        ):
            return None
        weights = None
        if norms is not None:
            weights = self._weights_now(*norms)
            if weights is None:
                return None
        q_out, k_out = torch.empty_like(q), torch.empty_like(k)
        form, interleaved = self._form, self._interleaved
        try:
            if weights is None:
                _rotate_into(q, k, q_out, k_out, cos, sin, None, None, interleaved, False, form)
            else:
                assert _norm_into is not None  # bound with _rotate_into
                _norm_into(q, k, q_out, k_out, cos, sin, *weights, interleaved, form)
        except RuntimeError:  # the op refused them: the full path explains
            return None
        return q_out, k_out

    @staticmethod
    def _weights_now(
        qw: object, kw: object, eps: float, offset: float
    ) -> tuple[torch.Tensor, torch.Tensor, float, float] | None:
        """The weights the module holds now, for the op to offset and widen itself; None where
        the full path must run (a weight that needs a gradient, or not a CPU tensor)."""
        if not isinstance(qw, torch.Tensor) or not isinstance(kw, torch.Tensor):
            return None
        if _grad_enabled() and (qw.requires_grad or kw.requires_grad):
            return None
        if not (qw.is_cpu and kw.is_cpu):
            return None
        return qw, kw, eps, offset


_rotate_into: Callable[..., None] | None = None


_norm_into: Callable[..., None] | None = None


def _bind_op() -> None:
    global _rotate_into, _norm_into
    _rotate_into = torch.ops.posemb._rotate_cpu_into.default
    _norm_into = torch.ops.posemb._norm_rotate_cpu_into.default


_cpu.on_load(_bind_op)
