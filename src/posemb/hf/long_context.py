"""The training-free context extension a config asks for: Qwen2.5-1M's
``dual_chunk_attention_config`` read as a :class:`posemb.DualChunk`.

transformers does not run Dual Chunk Attention (vLLM and SGLang do): a Qwen2.5-1M model loaded
in transformers attends with plain RoPE, and its rotary module never reads this key. posemb
reads it so that ``posemb inspect`` can say what the model was published to use, and so that
:func:`posemb.extended_attention` can run it.
"""

from __future__ import annotations

from collections.abc import Mapping

from .._errors import InputError
from ..extension import DualChunk

KEY = "dual_chunk_attention_config"
# What Qwen2.5-1M's configs and vLLM's reader name beside the chunk sizes: the sparse-attention
# settings of the serving engine, which change which keys are computed, not their positions.
SERVING_KEYS = frozenset(
    {"sparse_attention_config", "sparse_attention_enabled", "sparse_attention_threshold"}
)


def extension_from_config(config: object) -> tuple[DualChunk | None, tuple[str, ...]]:
    """The Dual Chunk Attention a config's ``dual_chunk_attention_config`` asks for, and notes.

    Args:
        config: a ``config.json`` dict or a transformers config object; the key is read at
            the top level or in the text config (``text_config``/``llm_config``).

    Returns:
        ``(DualChunk or None, notes)``: None when the config names no extension.
    """
    d = config if isinstance(config, Mapping) else getattr(config, "to_dict", dict)()
    where, dca = KEY, d.get(KEY)
    for nested in ("text_config", "llm_config", "language_config"):
        sub = d.get(nested)
        if dca is None and isinstance(sub, Mapping) and sub.get(KEY) is not None:
            where, dca = f"{nested}.{KEY}", sub[KEY]
    if dca is None:
        return None, ()
    if not isinstance(dca, Mapping):
        raise InputError(f"{where} must be a JSON object, got {dca!r}")
    for name in ("chunk_size", "local_size"):
        if name not in dca:
            raise InputError(f"{where} has no {name!r}: Dual Chunk Attention needs chunk_size "
                             f"and local_size")  # fmt: skip
    try:
        method = DualChunk(dca["chunk_size"], dca["local_size"])
    except InputError as err:
        raise InputError(f"{where}: {err}") from None
    notes = [
        f"{where} asks for Dual Chunk Attention (An et al. 2024): chunks of "
        f"{method.chunk_len:,} tokens, distances up to {method.chunk_size:,}; run it with "
        f"posemb.extended_attention(..., posemb.DualChunk({method.chunk_size}, "
        f"{method.local_size})). transformers does not: a model loaded there attends with plain "
        f"RoPE past {method.chunk_size:,} tokens"
    ]
    original = dca.get("original_max_position_embeddings")
    if original is not None and original != method.chunk_size:
        notes.append(
            f"{where}.original_max_position_embeddings is {original!r}, not chunk_size "
            f"{method.chunk_size}: the chunk size is the longest distance used"
        )
    unknown = sorted(set(dca) - {"chunk_size", "local_size", "original_max_position_embeddings"})
    if unknown:
        served = [k for k in unknown if k in SERVING_KEYS]
        other = [k for k in unknown if k not in SERVING_KEYS]
        if served:
            said = ", ".join(served)
            notes.append(f"{where}: {said} set the serving engine's sparse attention, which "
                         f"posemb does not run (positions are unchanged)")  # fmt: skip
        if other:
            notes.append(f"{where}: {', '.join(other)} not read")
    return method, tuple(notes)


__all__ = ["extension_from_config"]
