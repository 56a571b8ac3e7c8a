"""Argument checks shared by the public functions.

Every check raises ``ValueError`` whose message names the argument, the value it got and what
is allowed, so that a bad call fails at the door rather than deep inside a broadcast.
"""

from __future__ import annotations

import math

import torch

from ._errors import InputError

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# Bound once: a decode step asks tracing() once per layer, and inside a model each lookup is
# taken with cold caches (attribute chains there cost more than the checks themselves).
_is_compiling = torch.compiler.is_compiling
_is_exporting = torch.compiler.is_exporting
_functorch_level = torch._C._functorch.maybe_current_level
_dispatch_mode = torch._C._get_dispatch_mode
_FAKE_MODE = torch._C._TorchDispatchModeKey.FAKE
_PROXY_MODE = torch._C._TorchDispatchModeKey.PROXY
_jit_tracing = torch._C._is_tracing


def tracing() -> bool:
    """Whether torch is tracing this call (``torch.compile``, ``torch.export`` in either mode,
    ``torch.jit.trace``, any ``FakeTensorMode``, or a ``torch.func`` transform such as vmap or
    jacrev): what is computed now is not a real tensor, or not one to keep.
    """
    if _is_compiling() or _is_exporting() or _jit_tracing():
        return True  # torch.jit.trace too: it would bake a remembered table into its graph
    if _functorch_level() is not None:
        return True  # a batched or grad-tracking wrapper has no storage to read or keep
    # The active dispatch modes, read directly: ~0.4 us, where torch._guards.detect_fake_mode
    # takes ~15 us, too much for a decode step that asks once per layer.
    return _dispatch_mode(_FAKE_MODE) is not None or _dispatch_mode(_PROXY_MODE) is not None


def positive_int(name: str, value: object) -> int:
    """Return ``value`` as an int if it is a positive integer, else raise ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{name} must be a positive integer, got {value!r}")
    return value


def nonnegative_int(name: str, value: object) -> int:
    """Return ``value`` as an int if it is an integer >= 0, else raise ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"{name} must be an integer >= 0, got {value!r}")
    return value


def number(name: str, value: object, *, minimum: float, strict: bool = False) -> float:
    """Return ``value`` as a float if it is a finite real >= ``minimum`` (> if ``strict``)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        x = float(value)
        if x > minimum or (not strict and x == minimum):
            return x
    rel = ">" if strict else ">="
    raise InputError(f"{name} must be a finite number {rel} {minimum:g}, got {value!r}")


def even_int(name: str, value: object) -> int:
    """Return ``value`` if it is a positive even integer (a count of rotated channel pairs)."""
    n = positive_int(name, value)
    if n % 2:
        raise InputError(f"{name} must be even (channels rotate in pairs), got {value!r}")
    return n


def base(value: object) -> float:
    """Return the frequency base as a float if it is finite and greater than 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"base must be a real number greater than 1, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value <= 1.0:
        raise InputError(
            f"base must be finite and greater than 1 (frequencies base^(-2i/d) must decrease), "
            f"got {value!r}"
        )
    return value


def float_tensor(name: str, x: object) -> torch.Tensor:
    """Return ``x`` if it is a floating-point tensor of a dtype posemb computes with."""
    if not isinstance(x, torch.Tensor):
        raise InputError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOAT_DTYPES:
        raise InputError(
            f"{name} must have a floating dtype (float16, bfloat16, float32, float64), "
            f"got {x.dtype}"
        )
    return x


def heads_tensor(name: str, x: object, head_dim: int) -> torch.Tensor:
    """Return ``x`` if it is a float tensor ``(batch, heads, seq, head_dim)`` (what a rotary
    module rotates)."""
    x = float_tensor(name, x)
    if x.dim() != 4 or x.shape[-1] != head_dim:
        raise InputError(
            f"{name} must have shape (batch, heads, seq, head_dim={head_dim}), "
            f"got shape {tuple(x.shape)}"
        )
    not_meta(name, x)
    return x


def not_meta(name: str, x: torch.Tensor) -> None:
    """Refuse a tensor on the meta device: it has a shape but no values to rotate."""
    if x.is_meta:
        raise InputError(f"{name} is on the meta device, which holds no values; {_META}")


def float_dtype(name: str, dtype: object) -> torch.dtype:
    """Return ``dtype`` if it is one of the floating dtypes posemb produces."""
    if not isinstance(dtype, torch.dtype) or dtype not in _FLOAT_DTYPES:
        raise InputError(
            f"{name} must be one of float16, bfloat16, float32, float64, got {dtype!r}"
        )
    return dtype


def positions(
    value: object, *, max_dim: int | None = None, name: str = "positions"
) -> torch.Tensor:
    """Return ``value`` as an integer tensor of positions.

    Python ints and sequences of ints are accepted and converted; tensors must already have an
    integer dtype, because a float position (0.5) has no meaning for a lookup and silently
    rounding it would hide a bug upstream. Integer dtypes other than int32 and int64 (uint8,
    int8, int16, ...) are widened to int64.
    """
    if isinstance(value, torch.Tensor):
        t = value
    elif isinstance(value, (list, tuple, range)) or (
        isinstance(value, int) and not isinstance(value, bool)
    ):
        try:
            t = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as err:
            raise InputError(f"{name} must be integers, got {value!r}") from err
    else:
        raise InputError(
            f"{name} must be an integer tensor or a sequence of ints, got {type(value).__name__}"
        )
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise InputError(f"{name} must have an integer dtype, got {t.dtype}")
    if t.is_meta:
        raise InputError(f"{name} are on the meta device, which holds no values; {_META}")
    if max_dim is not None and not 1 <= t.dim() <= max_dim:
        shapes = "(seq,)" if max_dim == 1 else "(seq,) or (batch, seq)"
        raise InputError(f"{name} must have shape {shapes}, got shape {tuple(t.shape)}")
    if t.dtype not in (torch.int32, torch.int64):
        # Indexing with uint8 is a boolean mask, and with int8 or int16 an IndexError: a
        # position is an index, so it is widened once, here, for every entry point.
        wide = t.to(torch.int64)
        if t.dtype == torch.uint64 and t.numel() and not tracing() and bool((wide < 0).any()):
            raise InputError(
                f"{name} must lie within -2^53 .. 2^53, got uint64 values of 2^63 or more"
            )
        t = wide
    return t


POSITION_LIMIT = 1 << 53
"""Largest position magnitude posemb accepts: exact in float64, where angles and biases are
formed, and far from overflowing int64 when two are subtracted."""

_META = "posemb needs real values (for shapes alone, trace with FakeTensorMode or torch.export)"


def within_limit(name: str, t: torch.Tensor, limit: int = POSITION_LIMIT) -> None:
    """Refuse integers of magnitude above ``limit``. Skipped while tracing, where there are no
    values to read.

    On the CPU: one read of their range, and ``ValueError`` naming it. On a device: no host
    read, which would stall every call until the device caught up and cannot be captured in a
    CUDA graph; the device checks the range itself (``torch._assert_async``) and a position
    out of range stops it with a device-side assert naming ``name``.
    """
    if not t.numel() or tracing():
        return
    if t.device.type != "cpu":
        ok = ((t >= -limit) & (t <= limit)).all()
        torch._assert_async(ok, f"posemb: {name} must lie within -2^53 .. 2^53")
        return
    lo, hi = (int(v) for v in torch.aminmax(t))
    if lo < -limit or hi > limit:
        raise InputError(
            f"{name} must lie within -2^{limit.bit_length() - 1} .. 2^{limit.bit_length() - 1} "
            f"(exact in float64, where posemb forms angles and biases), got {lo} .. {hi}"
        )


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype posemb does arithmetic in for ``x``: float64 for float64, else float32.

    Half-precision inputs are widened so that a product and a sum are rounded once, at the
    end, rather than after each operation.
    """
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def positions_for(
    name: str,
    value: object,
    *,
    batch: int,
    length: int,
    device: torch.device,
    start: int = 0,
) -> torch.Tensor:
    """Positions for ``batch`` sequences of ``length`` tokens, on ``device``.

    Args:
        name: the argument's name, for errors.
        value: None for ``start .. start + length - 1``, else integers of shape ``(length,)``
            or ``(1 or batch, length)``.
        batch, length: what the positions must cover.
        device: where the result lives.
        start: first default position (a decode step's queries start past the cache).

    Returns:
        int tensor ``(length,)`` or ``(1 or batch, length)``.
    """
    if value is None:
        return torch.arange(start, start + length, device=device)
    pos = positions(value, max_dim=2, name=name)
    if pos.shape[-1] != length or (pos.dim() == 2 and pos.shape[0] not in (1, batch)):
        raise InputError(
            f"{name} must have shape ({length},) or ({batch}, {length}), "
            f"got shape {tuple(pos.shape)}"
        )
    return pos.to(device)


def within_table(rows: torch.Tensor, size: int, what: str, remedy: str) -> None:
    """Raise ``ValueError`` if any of ``rows`` falls outside ``[0, size)`` of a table.

    Args:
        rows: integer row indices, any shape.
        size: rows the table has.
        what: the table, for the message (e.g. "this learned table (max_len=2048)").
        remedy: what the caller can do instead.
    """
    if not rows.numel():
        return
    lo, hi = int(rows.min()), int(rows.max())
    if lo < 0 or hi >= size:
        bad = hi if hi >= size else lo
        raise InputError(f"position {bad} is outside [0, {size}) of {what}; {remedy}")


def cos_sin_tables(
    cos: object, sin: object, x: torch.Tensor, dims: tuple[int, ...] = (2, 3)
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Check cos/sin tables against a tensor ``x`` whose last dimension is head_dim.

    The contract every rotation shares: float tensors of one shape with ``dims`` dimensions,
    on ``x``'s device, whose last size n (frequencies) satisfies 1 <= n and 2n <= head_dim.

    Returns:
        ``(cos, sin, n)``, n the number of rotated pairs.
    """
    cos = float_tensor("cos", cos)
    sin = float_tensor("sin", sin)
    if cos.shape != sin.shape or cos.dim() not in dims:
        allowed = " or ".join(map(str, dims))
        raise InputError(
            f"cos and sin must have the same shape with {allowed} dimensions, got "
            f"{tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    for tname, t in (("cos", cos), ("sin", sin)):
        if t.device != x.device:
            raise InputError(f"{tname} is on {t.device} but the input is on {x.device}; move it")
    n = cos.shape[-1]
    if n < 1 or 2 * n > x.shape[-1]:
        raise InputError(
            f"cos has {n} frequencies, so {2 * n} channels would rotate; allowed is 1 to "
            f"head_dim/2 = {x.shape[-1] // 2}"
        )
    return cos, sin, n


def per_token_tables(cos: torch.Tensor, x: torch.Tensor, name: str = "x") -> None:
    """Check that a per-token table ``(seq, n)`` or ``(1 or batch, seq, n)`` fits ``x``
    ``(batch, heads, seq, head_dim)`` (``name`` is ``x``'s name, for the message)."""
    batch, seq = x.shape[0], x.shape[2]
    if cos.shape[-2] != seq or (cos.dim() == 3 and cos.shape[0] not in (1, batch)):
        raise InputError(
            f"cos of shape {tuple(cos.shape)} does not match {name} of shape "
            f"{tuple(x.shape)}: "
            f"allowed are ({seq}, r/2) or ({batch}, {seq}, r/2)"
        )


MAX_HEAD_DIM = 1 << 16
"""Most channels per head posemb forms tables for: 128x the widest head published (512), and
small enough that no absurd config allocates before it is refused (a hidden_size of 2^40
asked torch for 137 GB in ``arange``)."""


def head_width(name: str, value: int, what: str = "") -> int:
    """Refuse a head wider than :data:`MAX_HEAD_DIM` channels, naming where it came from."""
    if value > MAX_HEAD_DIM:
        raise InputError(
            f"{name} gives heads {value} channels wide{what}; posemb forms tables for at most "
            f"{MAX_HEAD_DIM} (2^16) channels per head"
        )
    return value


MAX_LAYERS = 1 << 16
MAX_HEADS = 1 << 20
# The counts and lengths a config sizes things by, in every family's spelling (GPT-2/GPT-J's
# n_layer, n_head, n_positions, n_ctx; ChatGLM's seq_length and multi_query_group_num; Falcon's
# n_head_kv), and the most posemb accepts of each. Layers and heads are bounded far past any
# published model (126 layers, 128 heads) and low enough that a list per layer, or
# transformers' config class looping over the layers, ends at once (2^40 layers never did).
# Lengths are bounded where positions stay exact in float64 (2^53); a length does not bound
# memory by itself: nothing posemb builds tabulates max_position_embeddings, and the
# comparison with transformers sizes its modules before building them (hf.upstream).
_LAYER_KEYS = (
    "num_hidden_layers", "n_layers", "n_layer", "num_layers", "depth", "max_window_layers",
)  # fmt: skip
_HEAD_KEYS = (
    "num_attention_heads", "num_key_value_heads", "n_heads", "n_head", "n_kv_heads", "num_heads",
    "num_kv_heads", "n_head_kv", "multi_query_group_num",
)  # fmt: skip
_LENGTH_KEYS = (
    "max_position_embeddings", "original_max_position_embeddings", "sliding_window",
    "attention_chunk_size", "n_positions", "n_ctx", "seq_length", "max_seq_len",
)  # fmt: skip
CONFIG_SIZES = {
    **dict.fromkeys(_LAYER_KEYS, MAX_LAYERS),
    **dict.fromkeys(_HEAD_KEYS, MAX_HEADS),
    **dict.fromkeys(_LENGTH_KEYS, POSITION_LIMIT),
}


def config_sizes(d: object, where: str = "") -> None:
    """Refuse, in a config dict and every dict nested in it, a count or length of
    :data:`CONFIG_SIZES` above its bound, naming the key, the value and the bound. Other
    types are left to the readers, which say what they expect."""
    if not isinstance(d, dict):
        return
    for key, value in d.items():
        name = f"{where}.{key}" if where else str(key)
        if isinstance(value, dict):
            config_sizes(value, name)
            continue
        bound = CONFIG_SIZES.get(key)
        if bound is None or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if value > bound:  # a NaN compares false: the readers refuse it by name
            shown = value if isinstance(value, int) else f"{value:g}"
            raise InputError(
                f"{name} is {shown}, past the most posemb accepts ({bound:,} = 2^"
                f"{bound.bit_length() - 1}); no published model comes near it"
            )


def rotary_dims(head_dim: object, rotary_dim: object) -> tuple[int, int]:
    """``(head_dim, rotary_dim)`` checked: a positive head, an even rotary part within it
    (``rotary_dim`` None means the whole head), at most :data:`MAX_HEAD_DIM` wide."""
    head = head_width("head_dim", positive_int("head_dim", head_dim))
    rotary = even_int("rotary_dim", head if rotary_dim is None else rotary_dim)
    if rotary > head:
        raise InputError(f"rotary_dim must be <= head_dim = {head}, got {rotary_dim!r}")
    return head, rotary
