"""Converting checkpoints between the two RoPE pairing layouts.

A model trained with one :class:`~posemb.Layout` computes the same attention under the other
once the rows of its q and k projections are permuted (:func:`posemb.permute_layout`). This
module finds those tensors in a state dict, a safetensors file or a sharded checkpoint (its
``*.safetensors.index.json``) and permutes them; head counts come from the caller (or from
:func:`posemb.hf.attention_shape`).

Every tensor's permutation depends only on its own rows and head count, so a sharded checkpoint
is converted one shard at a time, with a shard that holds no q or k (the embeddings, the LM
head) copied unchanged. What needs every shard is checked first, from the files' headers alone:
that q and k tensors exist, that every head count divides its tensor, and that q's and k's head
dims agree (a GQA checkpoint converted without its key-head count is refused here, not written
with k permuted as heads of the wrong width).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .. import _checks, _extras
from .._errors import InputError
from .._io import atomic_write
from .._owned import OwnedFolder, probe_writable
from ..rope import Layout, permute_layout

Q_PATTERN = r"(^|\.)(q_proj|wq)\.(weight|bias)$"
K_PATTERN = r"(^|\.)(k_proj|wk)\.(weight|bias)$"
INDEX_SUFFIX = ".safetensors.index.json"
COMMAND = "posemb convert"


def _patterns(q_pattern: str, k_pattern: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    try:
        return re.compile(q_pattern), re.compile(k_pattern)
    except re.error as err:
        raise InputError(f"q/k pattern is not a valid regular expression: {err}") from None


def _head_counts(num_heads: int, num_kv_heads: int | None) -> tuple[int, int]:
    _checks.positive_int("num_heads", num_heads)
    if num_kv_heads is None:
        return num_heads, num_heads
    return num_heads, _checks.positive_int("num_kv_heads", num_kv_heads)


def check_qk_rows(
    rows: Mapping[str, int],
    num_heads: int,
    num_kv_heads: int | None = None,
    q_pattern: str = Q_PATTERN,
    k_pattern: str = K_PATTERN,
    *,
    both: bool = True,
    rotary_dim: int | None = None,
) -> list[str]:
    """Check that the q/k tensors of a checkpoint can be permuted with these head counts.

    Args:
        rows: tensor name -> its number of rows (dimension 0), for every tensor considered.
        num_heads: query heads; ``num_kv_heads`` key heads (default: the same).
        q_pattern: a regular expression (``re.search``) naming the q tensors.
        k_pattern: the same, for the k tensors.
        both: require q and k tensors among ``rows`` (False for one shard of many).
        rotary_dim: rotated channels per head (even, at most the head dim); default all.

    Returns:
        The names of the q and k tensors, in ``rows``' order.

    Raises:
        ValueError: no q/k tensors (or only one side, when ``both``); a head count that does
            not divide a tensor; or q and k head dims that disagree.
    """
    heads, kv = _head_counts(num_heads, num_kv_heads)
    q_re, k_re = _patterns(q_pattern, k_pattern)
    dims: dict[str, dict[int, str]] = {"q": {}, "k": {}}
    names = []
    for name, n in rows.items():
        side = "q" if q_re.search(name) else "k" if k_re.search(name) else None
        if side is None:
            continue
        count = heads if side == "q" else kv
        if n % count:
            flag = "--num-heads" if side == "q" else "--num-kv-heads"
            raise InputError(
                f"tensor {name!r} has {n} rows, not divisible by its head count {count}; check "
                f"{flag}"
            )
        dims[side].setdefault(n // count, name)
        names.append(name)
    if both and not names:
        raise InputError(
            f"no q/k projection tensors found (patterns {q_pattern!r} and {k_pattern!r}); pass "
            f"--q-pattern/--k-pattern for other names (fused qkv weights are not supported; one "
            f"shard of a checkpoint converts with its index beside it)"
        )
    if both and not (dims["q"] and dims["k"]):
        missing = "k" if not dims["k"] else "q"
        raise InputError(
            f"found q/k tensors but no {missing} projection; both must be converted (for one "
            f"shard of a checkpoint, convert its index or folder)"
        )
    widths = {d: n for side in ("q", "k") for d, n in dims[side].items()}
    if len(widths) > 1:
        (a, an), (b, bn) = list(widths.items())[:2]
        hint = ""
        if num_kv_heads is None and dims["q"] and dims["k"]:
            qd, kn = next(iter(dims["q"])), next(iter(dims["k"].values()))
            if rows[kn] % qd == 0:
                hint = f"; for a GQA checkpoint pass --num-kv-heads {rows[kn] // qd}"
        raise InputError(
            f"q and k head dims disagree: {an!r} has heads {a} wide and {bn!r} heads {b} wide "
            f"with {heads} query and {kv} key heads; RoPE rotates heads of one width{hint}"
        )
    if rotary_dim is not None:
        _checks.even_int("rotary_dim", rotary_dim)
        for width, name in widths.items():
            if rotary_dim > width:
                raise InputError(
                    f"rotary_dim must be at most the head dim {width} of {name!r}, got {rotary_dim}"
                )
    return names


def convert_qk_layout(
    tensors: Mapping[str, torch.Tensor],
    to: Layout | str,
    num_heads: int,
    num_kv_heads: int | None = None,
    rotary_dim: int | None = None,
    q_pattern: str = Q_PATTERN,
    k_pattern: str = K_PATTERN,
    *,
    both: bool = True,
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Permute the q/k projection rows of a state dict for the other RoPE layout.

    Args:
        tensors: name -> tensor; a q/k weight is ``(heads * head_dim, in_features)``.
        to: target layout.
        num_heads: query heads; ``num_kv_heads`` key heads (default: the same).
        rotary_dim: rotated channels per head; default all.
        q_pattern: a regular expression (``re.search``) naming the q tensors.
        k_pattern: the same, for the k tensors.
        both: require q and k tensors (False for one shard of a checkpoint, checked whole by
            :func:`check_qk_rows`).

    Returns:
        A new dict (unconverted tensors are the same objects) and the converted names.

    Raises:
        ValueError: as :func:`check_qk_rows`.
    """
    heads, kv = _head_counts(num_heads, num_kv_heads)
    q_re, _ = _patterns(q_pattern, k_pattern)
    rows = {name: int(t.shape[0]) if t.dim() else 1 for name, t in tensors.items()}
    names = check_qk_rows(
        rows, num_heads, num_kv_heads, q_pattern, k_pattern, both=both, rotary_dim=rotary_dim
    )
    out = dict(tensors)
    for name in names:
        count = heads if q_re.search(name) else kv
        out[name] = permute_layout(tensors[name], count, to, rotary_dim).contiguous()
    return out, names


def _safetensors() -> tuple[Callable[..., Any], Callable[..., Any]]:
    try:
        from safetensors import safe_open
        from safetensors.torch import save_file
    except ImportError as err:
        raise _extras.missing(err, "posemb convert", "hf") from None
    return safe_open, save_file


def _header_rows(path: pathlib.Path) -> dict[str, int]:
    """Tensor name -> rows, from a safetensors file's header (no tensor is read)."""
    safe_open, _ = _safetensors()
    try:
        with safe_open(str(path), framework="pt") as f:
            return {n: (f.get_slice(n).get_shape() or [1])[0] for n in f.keys()}  # noqa: SIM118
    except Exception as err:  # safetensors raises its own error types for bad headers
        raise InputError(f"input {str(path)!r} is not a readable safetensors file: {err}") from err


def _read_file(path: pathlib.Path) -> tuple[dict[str, torch.Tensor], dict[str, str] | None]:
    safe_open, _ = _safetensors()
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata()
            return {k: f.get_tensor(k) for k in f.keys()}, metadata  # noqa: SIM118
    except Exception as err:
        raise InputError(f"input {str(path)!r} is not a readable safetensors file: {err}") from err


def read_index(index: str | os.PathLike[str]) -> dict[str, str]:
    """A sharded safetensors checkpoint's ``weight_map`` (tensor name -> shard file name).

    Raises:
        ValueError: not a readable index, a shard named by a path rather than a file name in
            the index's folder, or a shard that is not there.
    """
    p = pathlib.Path(index)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"index {str(p)!r} is not a readable JSON file: {err}") from None
    wmap = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(wmap, dict) or not wmap:
        raise InputError(f"index {str(p)!r} has no weight_map (tensor name -> shard file)")
    for name, shard in wmap.items():
        if (
            not isinstance(shard, str)
            or pathlib.PurePath(shard).name != shard
            or shard in ("", ".", "..")
        ):
            raise InputError(
                f"index {str(p)!r} names shard {shard!r} for {name!r}; shards must be file "
                f"names in the index's folder"
            )
        if not (p.parent / shard).is_file():
            raise InputError(f"index {str(p)!r} names shard {shard!r}, which is not there")
    return dict(wmap)


def _index_of(src: pathlib.Path) -> pathlib.Path | None:
    """The index beside ``src`` that names it as a shard, if any."""
    for candidate in sorted(src.parent.glob("*" + INDEX_SUFFIX)):
        try:
            wmap = json.loads(candidate.read_text(encoding="utf-8")).get("weight_map", {})
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            continue
        if isinstance(wmap, dict) and src.name in wmap.values():
            return candidate
    return None


def _checkpoint_rows(index: pathlib.Path, wmap: Mapping[str, str]) -> dict[str, int]:
    """Every tensor's rows over a sharded checkpoint, from the headers; refuses an index that
    names a tensor its shard does not hold (a checkpoint that would not load)."""
    rows: dict[str, int] = {}
    for shard in sorted(set(wmap.values())):
        held = _header_rows(index.parent / shard)
        missing = [n for n, f in wmap.items() if f == shard and n not in held]
        if missing:
            raise InputError(
                f"index {str(index)!r} places {missing[0]!r} in {shard!r}, which does not hold "
                f"it ({len(missing)} such tensor(s)); the checkpoint is incomplete"
            )
        rows |= held
    return rows


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
    metadata, are written back unchanged. A shard of a sharded checkpoint (an index beside it
    names it) is checked against the whole checkpoint's headers and may hold no q or k (it is
    then copied unchanged); :func:`convert_sharded` converts every shard and the index.

    Returns:
        The names of the converted tensors (empty for a shard without q/k tensors).

    Raises:
        ValueError: bad paths, an unreadable file, or tensors :func:`check_qk_rows` refuses.
    """
    _safetensors()
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
    _head_counts(num_heads, num_kv_heads)  # before the (possibly many-GB) files are read
    index = _index_of(src_p)
    if index is not None:
        wmap = read_index(index)
        ours = {(index.parent / f).resolve() for f in wmap.values()} | {index.resolve()}
        if dst_p.resolve() in ours:
            raise InputError(
                f"output {str(dst_p)!r} is a file of the checkpoint {str(src_p)!r} belongs to; "
                f"posemb never overwrites its input"
            )
        whole = _checkpoint_rows(index, wmap)
        check_qk_rows(whole, num_heads, num_kv_heads, q_pattern, k_pattern, rotary_dim=rotary_dim)
    else:
        rows = _header_rows(src_p)
        check_qk_rows(rows, num_heads, num_kv_heads, q_pattern, k_pattern, rotary_dim=rotary_dim)
    tensors, metadata = _read_file(src_p)
    out, converted = convert_qk_layout(
        tensors, to, num_heads, num_kv_heads, rotary_dim, q_pattern, k_pattern, both=False
    )
    _, save_file = _safetensors()
    atomic_write(dst_p, _writer(save_file, out, metadata))
    return converted


def _writer(
    save_file: Callable[..., Any], tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None
) -> Callable[[str], None]:
    return lambda tmp: save_file(tensors, tmp, metadata=metadata)


def find_index(src: str | os.PathLike[str]) -> pathlib.Path:
    """The index of a sharded checkpoint given as its index file or as its folder.

    Raises:
        ValueError: a folder with no index or with several.
    """
    p = pathlib.Path(src)
    if p.is_file():
        if not p.name.endswith(INDEX_SUFFIX):
            raise InputError(f"input {str(p)!r} is not a {INDEX_SUFFIX} file")
        return p
    if not p.is_dir():
        raise InputError(f"input {str(p)!r} does not exist")
    found = sorted(p.glob("*" + INDEX_SUFFIX))
    if len(found) != 1:
        what = "no" if not found else f"{len(found)}"
        raise InputError(
            f"input folder {str(p)!r} has {what} *{INDEX_SUFFIX} files; give the index of the "
            f"checkpoint to convert (a single .safetensors file converts on its own)"
        )
    return found[0]


def convert_sharded(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    to: Layout | str,
    num_heads: int,
    num_kv_heads: int | None = None,
    rotary_dim: int | None = None,
    q_pattern: str = Q_PATTERN,
    k_pattern: str = K_PATTERN,
    overwrite: bool = False,
) -> dict[str, list[str]]:
    """Convert a sharded safetensors checkpoint (its index, or the folder holding it) into the
    folder ``dst``: every shard under its own name, q/k tensors permuted, the rest (and every
    shard's metadata) unchanged, and the index copied (no tensor changes name or shard).

    Everything is checked from the shards' headers before any shard is read. One shard is in
    memory at a time, and each is written atomically. ``dst`` follows posemb's rule for
    folders (:class:`posemb._owned.OwnedFolder`): it may be new, or one an earlier ``posemb
    convert`` wrote; ``overwrite`` writes beside files the command did not write. Other files
    of the checkpoint's folder (config, tokenizer) are not copied.

    Returns:
        Shard file name -> the names of its converted tensors (empty: copied unchanged).

    Raises:
        ValueError: a bad index, an output that is the input's folder or cannot be written,
            or tensors :func:`check_qk_rows` refuses.
    """
    _safetensors()
    index = find_index(src)
    out_p = pathlib.Path(dst)
    if out_p.exists() and out_p.resolve() == index.parent.resolve():
        raise InputError(
            f"output {str(out_p)!r} is the input's folder; posemb never overwrites its input"
        )
    _head_counts(num_heads, num_kv_heads)  # before the (possibly many-GB) files are read
    wmap = read_index(index)
    shards = sorted(set(wmap.values()))
    files = {*shards, index.name}
    folder = OwnedFolder.claim(
        out_p, COMMAND, what="output", force=overwrite, writes=files.__contains__
    )
    rows = _checkpoint_rows(index, wmap)
    check_qk_rows(rows, num_heads, num_kv_heads, q_pattern, k_pattern, rotary_dim=rotary_dim)
    _, save_file = _safetensors()
    done: dict[str, list[str]] = {}
    with folder.running():
        for shard in shards:
            tensors, metadata = _read_file(index.parent / shard)
            out, done[shard] = convert_qk_layout(
                tensors, to, num_heads, num_kv_heads, rotary_dim, q_pattern, k_pattern, both=False
            )
            folder.write(shard, _writer(save_file, out, metadata))
            del tensors, out  # one shard in memory at a time
        folder.write_bytes(index.name, index.read_bytes())  # last: the checkpoint is whole
        folder.prune(keep=files.__contains__)
    return done


__all__ = [
    "COMMAND",
    "INDEX_SUFFIX",
    "K_PATTERN",
    "Q_PATTERN",
    "check_qk_rows",
    "convert_checkpoint",
    "convert_qk_layout",
    "convert_sharded",
    "find_index",
    "read_index",
]
