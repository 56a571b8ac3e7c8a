"""The lab's inference-time variants of the trained ``rope`` model: scalings and extensions.

A scaling (``rope+pi`` ... :data:`~posemb.lab.model.SCALINGS`) swaps the RoPE schedule; an
extension (:data:`~posemb.lab.model.EXTENSIONS`) keeps it and changes which distance each pair
is rotated by (:mod:`posemb.extension`). Both are chosen per evaluation length from the training
length L = 64, as each paper sizes them for its own model:

- ``rope+selfextend``: window ``W = L / 4`` (LongLM extends Llama-2, trained at 4,096, with
  neighbour windows of 512-1,024) and the smallest group G that keeps every distance at an
  evaluation length n inside training, ``(n - 1) // G + W - W // G <= L - 1`` (the paper picks G
  from the target length the same way).
- ``rope+rerope``: window ``W = L / 2``; every distance is then at most W, so no length needs
  another setting (Su's runs keep W well inside the training length).
- ``rope+dca``: ChunkLlama's defaults (An et al. 2024): chunks of ``3L / 4``, a local window
  of ``L / 16``; the longest distance is then ``min(2(C - S) - 1, C) = C < L``.

None scales the queries (each method's optional log-length factor is left off), so that the
lab measures the re-mapping itself.
"""

from __future__ import annotations

from .._errors import InputError
from ..extension import DualChunk, Extension, ReRoPE, SelfExtend
from .model import EXTENSIONS, SCALINGS, TinyLM, scaling_for

INFERENCE = SCALINGS + EXTENSIONS


def selfextend_group(train_len: int, window: int, eval_len: int) -> int:
    """The smallest group G that keeps Self-Extend's longest distance at ``eval_len`` tokens,
    ``(eval_len - 1) // G + window - window // G``, below ``train_len``."""
    for g in range(1, eval_len + 1):
        if (eval_len - 1) // g + window - window // g <= train_len - 1:
            return g
    raise InputError(
        f"no Self-Extend group keeps {eval_len} tokens inside {train_len} with window {window}"
    )


def extension_for(variant: str, train_len: int, eval_len: int) -> Extension:
    """The method of an extension variant at one evaluation length (see the module)."""
    if variant == "rope+selfextend":
        window = max(1, train_len // 4)
        return SelfExtend(selfextend_group(train_len, window, eval_len), window)
    if variant == "rope+rerope":
        return ReRoPE(max(1, train_len // 2))
    if variant == "rope+dca":
        chunk = max(2, 3 * train_len // 4)
        return DualChunk(chunk, min(chunk - 1, max(1, train_len // 16)))
    raise InputError(f"unknown extension variant {variant!r}; known: {', '.join(EXTENSIONS)}")


def use(model: TinyLM, variant: str | None, train_len: int, eval_len: int) -> None:
    """Set ``model`` (a trained rope model) to run as ``variant`` at ``eval_len`` tokens; None
    gives it back its own RoPE."""
    if variant is None or variant not in INFERENCE:
        if variant is not None:
            raise InputError(f"unknown inference variant {variant!r}; known: {INFERENCE}")
        model.set_scaling(None)
        model.set_extension(None)
    elif variant in SCALINGS:
        model.set_extension(None)
        model.set_scaling(scaling_for(variant, train_len, eval_len))
    else:
        model.set_scaling(None)
        model.set_extension(extension_for(variant, train_len, eval_len))


__all__ = ["INFERENCE", "extension_for", "selfextend_group", "use"]
