"""The attention mask a ``transformers`` model hands its attention function, read as posemb's
:class:`~posemb.extension.Visibility`: what :func:`posemb.hf.patch_extension` applies.

transformers passes the mask in the form its ``attn_implementation`` wants, and each form means
the same thing as transformers' own kernel for it reads it:

- ``None``: causal (``is_causal``, from the call's keyword or the module) or bidirectional, the
  sliding window in the ``sliding_window`` keyword (flash attention's form; sdpa's when the
  causal flag suffices);
- ``(batch, k_len)``: flash attention's padding mask, 1 where a key is a token, with the causal
  flag and the window as above;
- ``(batch, 1 or heads, q_len, k_len)`` bool (True: attend) or float, *added* to the logits
  (eager and sdpa add it: a ``-1e4`` or ``-1e9`` fill lowers a logit, it does not hide the
  key; ``finfo.min`` fills and ``-inf`` hide it). Causality and the window are in it already;
- flex attention's ``BlockMask``: its ``mask_mod`` evaluated on the call's pairs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .._errors import InputError
from ..extension import Visibility


def visibility(
    module: nn.Module,
    mask: object,
    kwargs: dict[str, Any],
    qp: torch.Tensor,
    kp: torch.Tensor,
    shape: tuple[int, int, int],
) -> Visibility:
    """What each query of one attention call may see.

    Args:
        module: the attention module (its ``is_causal``).
        mask: the ``attention_mask`` transformers passed.
        kwargs: the attention function's other keywords (``sliding_window``, ``is_causal``).
        qp: query positions ``(batch or 1, q_len)``; kp: key positions ``(batch or 1, k_len)``.
        shape: ``(batch, q_len, k_len)`` of the call.

    Raises:
        ValueError: a mask of another form or size (before any cache is touched when the patched
            forward checks it with :func:`check_form`).
    """
    b, q_len, k_len = shape
    causal = kwargs.get("is_causal")
    causal = bool(getattr(module, "is_causal", True) if causal is None else causal)
    window = kwargs.get("sliding_window")
    window = int(window) if isinstance(window, int) and not isinstance(window, bool) else None
    # Without a 4-D mask, causality and the window are flash attention's and sdpa's is_causal:
    # by key index, whatever position_ids say; only flash attention splits packed sequences.
    if mask is None:
        segment = _packed(module, kwargs, qp, shape) if _flash_form(module) else None
        return Visibility(causal=causal, window=window, by_index=True, segment=segment)
    if _is_block_mask(mask):
        allow = _block_mask_allow(mask, b)
        return Visibility(causal=causal and _hides_later(allow, qp, kp), allow=allow)
    check_form(mask)
    assert isinstance(mask, torch.Tensor)
    if mask.shape[-1] != k_len:
        raise InputError(
            f"the attention mask covers {mask.shape[-1]} keys, the cache returned {k_len}; "
            f"patch_extension needs a DynamicCache"
        )
    if mask.dim() == 2:
        return Visibility(causal=causal, window=window, pad=mask == 0, by_index=True)
    if mask.shape[-2] not in (1, q_len):
        raise InputError(
            f"the attention mask has {mask.shape[-2]} query rows, the call {q_len} queries"
        )
    return _from_dense(mask, qp, kp, causal)


def _flash_form(module: nn.Module) -> bool:
    """Whether the model's attention implementation takes flash attention's mask (None or
    2-D, packed sequences found at attention time), by the mask function transformers pairs
    with it (the implementation's name may be anything a hub kernel registers)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask

    name = getattr(getattr(module, "config", None), "_attn_implementation", None)
    try:
        return ALL_MASK_ATTENTION_FUNCTIONS[name] is flash_attention_mask
    except (KeyError, TypeError):
        return False


def _packed(
    module: nn.Module, kwargs: dict[str, Any], qp: torch.Tensor, shape: tuple[int, int, int]
) -> torch.Tensor | None:
    """The segment of each key ``(1, k_len)`` where flash attention runs the call as packed
    sequences (``cu_seq_lens_k`` given, or one row whose positions restart: each sequence
    starts where the position is the row's lowest), else None; what it cannot express is
    refused by name."""
    b, q_len, k_len = shape
    cu = kwargs.get("cu_seq_lens_k")
    if isinstance(cu, torch.Tensor):
        if b != 1 or q_len != k_len:
            raise InputError(
                f"patch_extension reads cu_seq_lens_k for one row of packed sequences with no "
                f"cache before it; got batch {b}, {q_len} queries over {k_len} keys"
            )
        starts = cu.to("cpu", torch.int64)[1:-1]
    elif b == 1 and q_len > 1 and bool((qp - qp.min() != torch.arange(q_len)).any()):
        if q_len != k_len:
            raise InputError(
                f"packed sequences (position_ids that restart) under flash attention with a "
                f"cache of {k_len - q_len} earlier keys: transformers itself cannot run them"
            )
        starts = (qp[0] == qp.min()).nonzero().view(-1).cpu()
        starts = starts[starts > 0]
    else:
        return None
    marks = torch.zeros(k_len, dtype=torch.int64)
    marks[starts] = 1
    return marks.cumsum(0)[None]


def check_form(mask: object) -> None:
    """Refuse a mask no form above describes, naming what it is."""
    if mask is None or _is_block_mask(mask):
        return
    if not isinstance(mask, torch.Tensor) or mask.dim() not in (2, 4):
        what = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise InputError(
            f"attention_mask must be None, a (batch, k_len) padding mask, a (batch, 1, q_len, "
            f"k_len) bool or additive mask or a flex BlockMask; got {what}"
        )
    if not (mask.dtype == torch.bool or mask.is_floating_point() or mask.dim() == 2):
        raise InputError(f"a 4-D attention_mask must be bool or float, got {mask.dtype}")


def _from_dense(mask: torch.Tensor, qp: torch.Tensor, kp: torch.Tensor, causal: bool) -> Visibility:
    """A 4-D mask as the bias (read per tile by the fused path); causal as well (so only past
    keys are visited) when the model is causal and the mask hides every later key, as
    transformers' own masks do."""
    if causal:

        def allow(r0: int, r1: int, c0: int, c1: int) -> torch.Tensor:
            part = mask[..., r0:r1, :] if mask.shape[-2] > 1 else mask
            part = part[..., c0:c1]
            return part if part.dtype == torch.bool else part > torch.finfo(part.dtype).min / 2

        causal = _hides_later(allow, qp, kp)
    return Visibility(causal=causal, bias=mask)


# The most (query, key) pairs a mask is read in at once to decide causality.
_CHUNK = 1 << 22


def _hides_later(
    allow: Callable[[int, int, int, int], torch.Tensor], qp: torch.Tensor, kp: torch.Tensor
) -> bool:
    """Whether ``allow`` hides every key at a later position than its query, read in blocks
    of rows so that nothing of size ``q_len x k_len`` is formed."""
    q_len, k_len = qp.shape[-1], kp.shape[-1]
    rows = max(1, _CHUNK // max(1, k_len * max(qp.shape[0], kp.shape[0])))
    for r0 in range(0, q_len, rows):
        r1 = min(q_len, r0 + rows)
        later = (kp.unsqueeze(-2) > qp[..., r0:r1].unsqueeze(-1)).unsqueeze(1)
        if bool((allow(r0, r1, 0, k_len).to(later.device) & later).any()):
            return False
    return True


def _is_block_mask(mask: object) -> bool:
    return type(mask).__name__ == "BlockMask" and hasattr(mask, "mask_mod")


def _block_mask_allow(mask: Any, b: int) -> Callable[[int, int, int, int], torch.Tensor]:
    """A flex attention BlockMask as a mask function of a tile: its ``mask_mod`` on the
    tile's pairs (query rows ``r0:r1``, key columns ``c0:c1``), bool ``(batch, 1, rows,
    cols)``, True: attend; nothing of the whole call's size is made."""
    from torch.nn.attention.flex_attention import create_mask

    rows = mask.shape[0] if mask.shape[0] in (1, b) else b
    mod, device = mask.mask_mod, mask.kv_num_blocks.device

    def allow(r0: int, r1: int, c0: int, c1: int) -> torch.Tensor:
        def shifted(bi: Any, h: Any, q: Any, kv: Any) -> Any:
            return mod(bi, h, q + r0, kv + c0)

        return create_mask(shifted, rows, 1, r1 - r0, c1 - c0, device=device)

    return allow
