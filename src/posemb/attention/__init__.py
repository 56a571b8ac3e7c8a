"""Attention, in one package a reader can see at a glance:

- :mod:`.reference`: softmax attention written out step by step (:func:`attention_probs`,
  :func:`dot_product_attention`): the oracle of every faster path;
- :mod:`.module`: :class:`PositionalAttention` and :func:`make_encoding`, any encoding behind
  one entry point;
- :mod:`.scores`: what each encoding adds to the logits, said for a call's positions (a
  per-distance table, or a tile);
- :mod:`.core`: the blocked core: fused calls merged exactly by log-sum-exp, their masks, the
  backward; :mod:`.kernels`: the fused calls it runs (CPU flash, CUDA memory-efficient,
  explicit tiles);
- :mod:`.tiled`: an encoding's attention through the core, with no ``(q_len, k_len)`` tensor;
- :mod:`.flex`: the same scores as FlexAttention ``score_mod`` functions, for CUDA;
- :mod:`.extension`: training-free context extension (Self-Extend, ReRoPE, Dual Chunk
  Attention), re-exported by :mod:`posemb.extension`.
"""

from .module import ATTENTION_ENCODINGS, INPUT_ENCODINGS, PositionalAttention, make_encoding
from .reference import attention_probs, dot_product_attention, permutation_matrix

__all__ = [
    "ATTENTION_ENCODINGS",
    "INPUT_ENCODINGS",
    "PositionalAttention",
    "attention_probs",
    "dot_product_attention",
    "make_encoding",
    "permutation_matrix",
]
