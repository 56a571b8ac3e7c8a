"""posemb: positional encodings for transformers, as cited formulas, checked claims and modules.

The public API is re-exported here; heavy optional dependencies are imported lazily by the
modules that need them, so ``import posemb`` costs little beyond ``import torch``.
"""

from . import hf, scaling
from .absolute import LearnedEmbedding, SinusoidalEmbedding, sinusoidal_table
from .attention import (
    PositionalAttention,
    attention,
    attention_probs,
    make_encoding,
    permutation_matrix,
)
from .bias import (
    ALiBi,
    FireBias,
    RandomizedPositions,
    T5RelativeBias,
    alibi_bias,
    alibi_slopes,
    randomized_positions,
    relative_positions,
    t5_relative_bucket,
)
from .freqs import angles, cos_sin, inv_freq, wavelengths
from .rope import (
    Layout,
    RotaryEmbedding,
    XPos,
    apply_rope,
    permute_layout,
    rope_complex,
    rotation_matrix,
)

__version__ = "0.1.0"

__all__ = [
    "ALiBi",
    "FireBias",
    "Layout",
    "LearnedEmbedding",
    "PositionalAttention",
    "RandomizedPositions",
    "RotaryEmbedding",
    "SinusoidalEmbedding",
    "T5RelativeBias",
    "XPos",
    "__version__",
    "alibi_bias",
    "alibi_slopes",
    "angles",
    "apply_rope",
    "attention",
    "attention_probs",
    "cos_sin",
    "hf",
    "inv_freq",
    "make_encoding",
    "permutation_matrix",
    "permute_layout",
    "randomized_positions",
    "relative_positions",
    "rope_complex",
    "rotation_matrix",
    "scaling",
    "sinusoidal_table",
    "t5_relative_bucket",
    "wavelengths",
]
