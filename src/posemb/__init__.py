"""posemb: positional encodings for transformers, as cited formulas, checked claims and modules.

The public API is re-exported here; heavy optional dependencies are imported lazily by the
modules that need them, so ``import posemb`` costs little beyond ``import torch``.
"""

from . import _renamed, hf, scaling, temperature
from ._errors import BackendUnavailable, InputError
from ._version import __version__
from .absolute import LearnedEmbedding, SinusoidalEmbedding, sinusoidal_table
from .attention import (
    PositionalAttention,
    attention_probs,
    dot_product_attention,
    make_encoding,
    permutation_matrix,
)
from .axial import AxialRotaryEmbedding
from .bias import (
    AlibiBias,
    FireBias,
    KerpleBias,
    RandomizedPositions,
    T5Bias,
    alibi_bias,
    alibi_slopes,
    kerple_bias,
    randomized_positions,
    relative_positions,
    t5_relative_bucket,
)
from .cache import RotatedKVCache
from .cope import CoPE, cope_positions
from .extension import DualChunk, ReRoPE, SelfExtend, extended_attention
from .fope import FoPE, FourierRotaryEmbedding
from .freqs import angles, cos_sin, inv_freq, wavelengths
from .mrope import MRotaryEmbedding
from .rope import (
    Layout,
    RotaryEmbedding,
    XPos,
    apply_rope,
    permute_layout,
    rope_complex,
    rotation_matrix,
    xpos_zeta,
)

__all__ = [
    "AlibiBias",
    "AxialRotaryEmbedding",
    "BackendUnavailable",
    "CoPE",
    "DualChunk",
    "FireBias",
    "FoPE",
    "FourierRotaryEmbedding",
    "InputError",
    "KerpleBias",
    "Layout",
    "LearnedEmbedding",
    "MRotaryEmbedding",
    "PositionalAttention",
    "RandomizedPositions",
    "ReRoPE",
    "RotaryEmbedding",
    "RotatedKVCache",
    "SelfExtend",
    "SinusoidalEmbedding",
    "T5Bias",
    "XPos",
    "__version__",
    "alibi_bias",
    "alibi_slopes",
    "angles",
    "apply_rope",
    "attention_probs",
    "cope_positions",
    "cos_sin",
    "dot_product_attention",
    "extended_attention",
    "hf",
    "inv_freq",
    "kerple_bias",
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
    "temperature",
    "wavelengths",
    "xpos_zeta",
]

# Names the README documented before 0.2, kept working with a DeprecationWarning.
__getattr__ = _renamed.module_getattr(
    "posemb", {"ALiBi": "AlibiBias", "T5RelativeBias": "T5Bias"}, globals()
)
