"""Hugging Face interop: configs to RoPE scalings, a drop-in rotary module, layout conversion.

One module per job, every public name re-exported here (``from posemb import hf``):

- :mod:`posemb.hf.config`: reading ``config.json``/``params.json`` (the only code in posemb
  that reads model configs): :func:`model_rope` (every layer kind), :func:`rope_spec`,
  :func:`frequencies_from_config`, :func:`rotary_from_config`, :func:`attention_shape`,
  :func:`load_config`.
- :mod:`posemb.hf.families`: what each model family keeps where (multi-head-latent rope head
  sizes, GPT-NeoX's ``rotary_pct``, Gemma 3's local base, layer kinds, table forms), and the
  model types posemb refuses by name.
- :mod:`posemb.hf.patch`: :class:`HFRotaryEmbedding`, :func:`patch_rotary` (the swap into a
  ``transformers`` model; ``fused=True`` also routes its attention's rotation through posemb's
  op, :mod:`posemb.hf.fused`) and :func:`unpatch_rotary`.
- :mod:`posemb.hf.convert`: q/k weight permutation between layouts, in a state dict, a
  safetensors file or a sharded checkpoint (:func:`convert_sharded`).
- :mod:`posemb.hf.inspect`: the per-frequency report that ``posemb inspect`` prints.
- :mod:`posemb.hf.extension`: :func:`patch_extension` and :func:`unpatch_extension`,
  Self-Extend, ReRoPE or Dual Chunk Attention inside a model's attention (and its KV cache).
- :mod:`posemb.hf.long_context`: :func:`extension_from_config`, the Dual Chunk Attention a
  Qwen2.5-1M config's ``dual_chunk_attention_config`` asks for (``posemb inspect`` notes it).
- :mod:`posemb.hf.doctor`: :func:`transformers_differs`, where the installed ``transformers``
  reads a config differently from the file (or cannot read it), through
  :mod:`posemb.hf.upstream` (what transformers makes of a config).

``transformers`` is imported only to fill a key that a published config leaves to its model
class's default (``model_rope`` says so in the spec's notes) and to compare its reading with
the file's (``transformers_differs``); tests compare against it.

Where posemb deliberately differs from ``transformers`` (5.24) or vLLM, and why:

1. Angles are formed in float64 (see :mod:`posemb.freqs`); ``transformers`` forms
   ``inv_freq @ positions`` in float32, whose rounding grows with the position: its tables are
   off by about N * 2^-24 at N positions (a float32 angle is off by ~3e-2 rad at 2^20), posemb's
   by one float32 rounding. Measured with ``transformers`` 5.24 (``LlamaRotaryEmbedding``,
   head_dim 128, float32 tables for positions 0..N-1, against ``HFRotaryEmbedding``; "exact" is
   float64 angles from mpmath frequencies), max abs difference of cos / sin::

       base    N       posemb - transformers   posemb - exact      transformers - exact
       1e4     2048    1.15e-4 / 1.15e-4       3.0e-8 / 3.0e-8     1.15e-4 / 1.15e-4
       1e4     8192    4.84e-4 / 4.77e-4       3.0e-8 / 3.0e-8     4.84e-4 / 4.77e-4
       1e4     32768   1.90e-3 / 1.92e-3       3.0e-8 / 3.0e-8     1.90e-3 / 1.92e-3
       5e5     2048    1.39e-4 / 1.34e-4       3.0e-8 / 3.0e-8     1.39e-4 / 1.34e-4
       5e5     8192    5.84e-4 / 5.60e-4       3.0e-8 / 3.0e-8     5.84e-4 / 5.60e-4
       5e5     32768   2.29e-3 / 2.33e-3       3.0e-8 / 3.0e-8     2.29e-3 / 2.33e-3

   ``tests/test_hf.py::test_float32_tables_drift_in_transformers_not_in_posemb`` holds the
   difference between 0.5 and 2 times N * 2^-24 and posemb within 2^-24 of exact at N = 2048
   and 8192 for both bases; the 32768 rows were measured once, when this was written.
2. Dynamic NTK is a pure function of the current call's length (max position + 1).
   ``transformers``' module keeps the frequencies of the longest length seen so far for later
   shorter calls above the original length, so its output depends on call history; vLLM's
   static variant uses the frequencies of length factor * max_position_embeddings for every
   length. Both agree with posemb on a fresh module's first call at a given length.
3. Bad values raise ``ValueError`` naming the key: ``factor < 1``, ``beta_fast <= beta_slow``,
   ``low_freq_factor > high_freq_factor``, ``short_factor``/``long_factor`` of the wrong
   length, an odd rotary dimension. ``transformers`` logs a warning and carries on.
4. ``original_max_position_embeddings`` is required for yarn, llama3 and longrope (in the rope
   dict or at the top level, the top level winning as in ``transformers``). ``transformers``
   silently falls back to ``max_position_embeddings``, which for an extended config is the
   *extended* length and shifts every band.
5. ``factor`` is required for linear, dynamic, yarn and llama3; ``transformers`` derives a
   missing YaRN factor from ``max_position_embeddings / original_max_position_embeddings``.
   For longrope (Phi-3 configs carry no factor) posemb derives it the same way.
6. A LongRoPE switch to the long factors mid-generation leaves cached keys rotated with the
   short ones, in posemb as in ``transformers``; it is documented, not fixed, at this level.
7. ``HFRotaryEmbedding`` holds no tensors, so ``.to(torch.bfloat16)`` leaves its frequencies
   exact. ``transformers``' rotary module keeps ``inv_freq`` in a buffer that ``.to`` rounds to
   bfloat16: measured on ``LlamaRotaryEmbedding`` (head_dim 128, base 1e4, bfloat16 ``x``,
   positions 0..2047), its cos then differs from the unmoved module's by up to 1.9; posemb's
   moved module differs from the unmoved ``transformers`` one by at most one bfloat16 ulp
   (3.9e-3, where ``transformers``' float32 drift tips a rounding).
8. A float64 ``x`` gets tables formed and kept in float64; ``transformers`` returns float32
   tables cast to float64. Other dtypes get float32 tables cast once, as in ``transformers``
   (and kept in float32 for the families whose module does, OLMo and ERNIE 4.5).
9. Keys are strict: a rope key the rope type does not read raises (``strict=False`` warns and
   lists them); ``transformers`` logs "Unrecognized keys" and carries on. A key the file
   leaves to the class default is read through ``transformers`` or raises; ``transformers``'
   generic default base 10000 is never assumed.
10. A flat ``rope_scaling`` next to ``layer_types`` in a family whose class splits it (Gemma 3,
    OLMo 3) scales only the full-attention layers, as those classes do; a Gemma 3 config without
    ``layer_types`` (its sliding pattern left to the class) is read through ``transformers`` or
    raises, never read as one RoPE for every layer.
11. Llama 3's ``low_freq_factor == high_freq_factor`` and YaRN's ``beta_fast == beta_slow``
    (Llama 4 Scout, Kimi K2) are hard steps; ``transformers`` computes the same while warning.
    Reversed bounds raise.
12. GLM-4.1V's published file keeps the text model's keys at the top level, which
    ``Glm4vConfig`` 5.24 drops (its module rotates 64 pairs where the file says 32); posemb
    reads the file's keys.
"""

from __future__ import annotations

from .. import _renamed
from .cache import rerotate_cache, schedule_changes
from .config import (
    DEFAULT_THETA,
    ROPE_KEYS,
    ROPE_TYPES,
    AttentionShape,
    LayerKind,
    ModelRope,
    RopeSpec,
    attention_shape,
    frequencies_from_config,
    load_config,
    model_rope,
    rope_layer_types,
    rope_spec,
    rotary_from_config,
)
from .convert import K_PATTERN, Q_PATTERN, convert_checkpoint, convert_qk_layout, convert_sharded
from .doctor import Difference, TransformersCheck, format_differs, transformers_differs
from .extension import extension_of, patch_extension, unpatch_extension
from .families import FAMILIES, Family
from .inspect import format_inspect, format_model, inspect_model, inspect_report
from .long_context import extension_from_config
from .patch import HFRotaryEmbedding, patch_rotary, unpatch_rotary
from .vision import VisionReport, format_vision, vision_report, vision_rotary_from_config

__all__ = [
    "DEFAULT_THETA",
    "FAMILIES",
    "K_PATTERN",
    "Q_PATTERN",
    "ROPE_KEYS",
    "ROPE_TYPES",
    "AttentionShape",
    "Difference",
    "Family",
    "HFRotaryEmbedding",
    "LayerKind",
    "ModelRope",
    "RopeSpec",
    "TransformersCheck",
    "VisionReport",
    "attention_shape",
    "convert_checkpoint",
    "convert_qk_layout",
    "convert_sharded",
    "extension_from_config",
    "extension_of",
    "format_differs",
    "format_inspect",
    "format_model",
    "format_vision",
    "frequencies_from_config",
    "inspect_model",
    "inspect_report",
    "load_config",
    "model_rope",
    "patch_extension",
    "patch_rotary",
    "rerotate_cache",
    "rope_layer_types",
    "rope_spec",
    "rotary_from_config",
    "schedule_changes",
    "transformers_differs",
    "unpatch_extension",
    "unpatch_rotary",
    "vision_report",
    "vision_rotary_from_config",
]

# The README's name before 0.2, when posemb called scalings "schedules".
__getattr__ = _renamed.module_getattr(
    __name__, {"schedule_from_config": "frequencies_from_config"}, globals()
)
