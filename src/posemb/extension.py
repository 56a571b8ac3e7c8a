"""Longer context without training: change which distance each (query, key) pair is rotated by
(Self-Extend, ReRoPE, Dual Chunk Attention). The code lives with the rest of attention, in
:mod:`posemb.attention.extension`; this module is its public name."""

from .attention.extension import (
    DualChunk,
    Extension,
    PositionSet,
    ReRoPE,
    SelfExtend,
    Visibility,
    attend,
    extended_attention,
    nothing_seen,
)

__all__ = [
    "DualChunk",
    "Extension",
    "PositionSet",
    "ReRoPE",
    "SelfExtend",
    "Visibility",
    "attend",
    "extended_attention",
    "nothing_seen",
]
