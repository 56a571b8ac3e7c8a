"""Converting checkpoints between the two RoPE pairing layouts.

A model trained with one :class:`~posemb.Layout` computes the same attention under the other
once the rows of its q and k projections are permuted (:func:`posemb.permute_layout`). This
module finds those tensors in a state dict or a safetensors file and permutes them; head counts
come from the caller (or from :func:`posemb.hf.attention_shape`).
"""

from __future__ import annotations

import os
import pathlib
import re
from collections.abc import Mapping

import torch

from .. import _checks, _extras
from .._errors import InputError
from .._io import atomic_write
from .._owned import probe_writable
from ..rope import Layout, permute_layout

Q_PATTERN = r"(^|\.)(q_proj|wq)\.(weight|bias)$"
K_PATTERN = r"(^|\.)(k_proj|wk)\.(weight|bias)$"


def convert_qk_layout(
    tensors: Mapping[str, torch.Tensor],
    to: Layout | str,
    num_heads: int,
    num_kv_heads: int | None = None,
    rotary_dim: int | None = None,
    q_pattern: str = Q_PATTERN,
    k_pattern: str = K_PATTERN,
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Permute the q/k projection rows of a state dict for the other RoPE layout.

    Args:
        tensors: name -> tensor.
        to: target layout.
        num_heads: query heads; ``num_kv_heads`` key heads (default: the same).
        rotary_dim: rotated channels per head; default all.
        q_pattern: a regular expression (``re.search``) naming the q tensors.
        k_pattern: the same, for the k tensors.

    Returns:
        A new dict (unconverted tensors are the same objects) and the converted names.
    """
    _checks.positive_int("num_heads", num_heads)
    kv = num_heads if num_kv_heads is None else _checks.positive_int("num_kv_heads", num_kv_heads)
    try:
        q_re, k_re = re.compile(q_pattern), re.compile(k_pattern)
    except re.error as err:
        raise InputError(f"q/k pattern is not a valid regular expression: {err}") from None
    out, converted = dict(tensors), []
    for name, t in tensors.items():
        heads = num_heads if q_re.search(name) else kv if k_re.search(name) else None
        if heads is None:
            continue
        if t.shape[0] % heads:
            raise InputError(
                f"tensor {name!r} has {t.shape[0]} rows, not divisible by its head count {heads}; "
                f"check --num-heads/--num-kv-heads"
            )
        out[name] = permute_layout(t, heads, to, rotary_dim).contiguous()
        converted.append(name)
    if not converted:
        raise InputError(
            f"no q/k projection tensors found (patterns {q_pattern!r} and {k_pattern!r}); fused "
            f"qkv weights are not supported, pass --q-pattern/--k-pattern for other names"
        )
    if not any(k_re.search(n) for n in converted) or not any(q_re.search(n) for n in converted):
        missing = "k" if not any(k_re.search(n) for n in converted) else "q"
        raise InputError(f"found q/k tensors but no {missing} projection; both must be converted")
    return out, converted


def convert_checkpoint(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    to: Layout | str,
    num_heads: int,
    num_kv_heads: int | None = None,
    rotary_dim: int | None = None,
    q_pattern: str = Q_PATTERN,
    k_pattern: str = K_PATTERN,
    overwrite: bool = False,
) -> list[str]:
    """Convert a safetensors file's q/k weights to the other layout, written atomically.

    Reads and writes safetensors only (never pickle). Refuses to write over its input, and
    over an existing ``dst`` unless ``overwrite``. Tensors it does not convert, and the file's
    metadata, are written back unchanged.

    Returns:
        The names of the converted tensors.
    """
    try:
        from safetensors import safe_open
        from safetensors.torch import save_file
    except ImportError as err:
        raise _extras.missing(err, "posemb convert", "hf") from None
    src_p, dst_p = pathlib.Path(src), pathlib.Path(dst)
    if not src_p.is_file():
        raise InputError(f"input {str(src_p)!r} does not exist or is not a file")
    if dst_p.exists() and (dst_p.resolve() == src_p.resolve() or os.path.samefile(src_p, dst_p)):
        raise InputError(
            f"output {str(dst_p)!r} is the input file; posemb never overwrites its input"
        )
    if dst_p.is_dir():
        raise InputError(f"output {str(dst_p)!r} is a folder; give a .safetensors file name")
    if dst_p.exists() and not overwrite:
        raise InputError(f"output {str(dst_p)!r} exists; pass --force to replace it")
    # Before the input is read: a folder that cannot be written would fail only at the end.
    probe_writable(dst_p.parent, "the output's folder")
    # Checked before the (possibly many-GB) file is read, not only once it is in memory.
    _checks.positive_int("num_heads", num_heads)
    if num_kv_heads is not None:
        _checks.positive_int("num_kv_heads", num_kv_heads)
    try:
        with safe_open(str(src_p), framework="pt") as f:
            metadata = f.metadata()
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (not a dict)
    except Exception as err:  # safetensors raises its own error types for bad headers
        raise InputError(f"input {str(src_p)!r} is not a readable safetensors file: {err}") from err
    out, converted = convert_qk_layout(
        tensors, to, num_heads, num_kv_heads, rotary_dim, q_pattern, k_pattern
    )
    atomic_write(dst_p, lambda tmp: save_file(out, tmp, metadata=metadata))
    return converted


__all__ = ["K_PATTERN", "Q_PATTERN", "convert_checkpoint", "convert_qk_layout"]
