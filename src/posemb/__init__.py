"""posemb: positional encodings for transformers, as cited formulas, checked claims and modules.

The public API is re-exported here; heavy optional dependencies are imported lazily by the
modules that need them, so ``import posemb`` costs little beyond ``import torch``.
"""

from . import hf, scaling
from .absolute import LearnedEmbedding, SinusoidalEmbedding, sinusoidal_table
from .attention import attention, attention_probs, permutation_matrix
from .freqs import angles, cos_sin, inv_freq, wavelengths
from .rope import (
    Layout,
    RotaryEmbedding,
    apply_rope,
    permute_layout,
    rope_complex,
    rotation_matrix,
)

__version__ = "0.1.0"

__all__ = [
    "Layout",
    "LearnedEmbedding",
    "RotaryEmbedding",
    "SinusoidalEmbedding",
    "__version__",
    "angles",
    "apply_rope",
    "attention",
    "attention_probs",
    "cos_sin",
    "hf",
    "inv_freq",
    "permutation_matrix",
    "permute_layout",
    "rope_complex",
    "rotation_matrix",
    "scaling",
    "sinusoidal_table",
    "wavelengths",
]
