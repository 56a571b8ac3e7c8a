"""What ``transformers`` itself computes for a config: the reference the hf tests compare with.

Kept apart from the tests so the real-config test and the family sweep read a config the same
way: build the model's config class from the dict, take its text config, instantiate the rotary
module the text model uses, and read its per-layer-type ``inv_freq`` and attention scaling
(:mod:`posemb.hf.upstream`, which ``posemb inspect`` uses to report transformers' misreadings;
here, unlike there, the keys are first put in a form transformers reads, below).
"""

from __future__ import annotations

import logging
import math

transformers = __import__("pytest").importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

from posemb.hf import upstream  # noqa: E402  (transformers' config class and rotary module)

# transformers warns about keys it ignores and missing tokenizers; not what these tests check.
logging.getLogger("transformers").setLevel(logging.ERROR)

# Custom-code model types that transformers 5.24 has no class for, and the class whose keys and
# rope formulas their language model shares (Kimi K2 is DeepseekV3ForCausalLM; MiniCPM-o 2.6's
# language model is Qwen2.5-7B; MiniCPM-V 4's is a Llama-style MiniCPM 4 with LongRoPE). The
# comparison is then with transformers' formulas for those keys, not with the custom code.
STAND_INS = {"kimi_k2": "deepseek_v3", "minicpmo": "qwen2", "minicpmv": "llama"}

# Published files that transformers 5.24 itself misreads, and what the comparison does instead.
# GLM-4.1V's file keeps the text model's keys at the top level; Glm4vConfig then builds a
# default text config and drops them (partial_rotary_factor 0.5 and the mrope_section, whose
# 8 + 12 + 12 = 32 pairs only fit a rotary dimension of 64 = 128 * 0.5), so transformers'
# module rotates 64 pairs where the checkpoint has 32. The reference is transformers given the
# same keys under text_config, the form its own configs are saved in.
NESTED_FOR_TRANSFORMERS = {"glm4v"}
# Phi-3's first LongRoPE files name the type "su". Phi3Config standardizes its rope dict (which
# moves the top-level original_max_position_embeddings in, for "longrope" only) before it
# renames "su" to "longrope", then fails its own check for the missing key: transformers 5.24
# cannot read Phi-3-vision-128k-instruct's config. The reference is transformers given the new
# name; posemb reads "su" as the alias it is.
RENAMED_FOR_TRANSFORMERS = {("phi3", "su"): "longrope"}


def hf_config(d: dict, model_type: str | None = None):
    """transformers' text config for a config.json dict (the model's own config class), given
    the keys in the form transformers can read (the adjustments above)."""
    mt = model_type or STAND_INS.get(d["model_type"], d["model_type"])
    scaling = d.get("rope_scaling") or {}
    renamed = RENAMED_FOR_TRANSFORMERS.get((d["model_type"], scaling.get("type")))
    if renamed:
        d = {**d, "rope_scaling": {**scaling, "type": renamed}}
    if d["model_type"] in NESTED_FOR_TRANSFORMERS and "text_config" not in d:
        d = {"model_type": d["model_type"], "text_config": {**d, "model_type": mt + "_text"}}
    return upstream.text_config({**d, "model_type": mt})


rotary_classes = upstream.rotary_classes


def hf_frequencies(text_config, seq_len: int | None = None):
    """``(class name, {layer_type or None: (inv_freq float64, attention_factor)})``.

    With ``seq_len`` the length-dependent types are recomputed through transformers' own init
    function at that length (what its dynamic update does for a call of that length).
    """
    name, out = upstream.frequencies(text_config)
    if name is None or seq_len is None:
        return name, out
    for lt in list(out):
        params = text_config.rope_parameters
        params = params[lt] if lt is not None else params
        rope_type = params["rope_type"]
        if rope_type in ("dynamic", "longrope"):
            kwargs = {"layer_type": lt} if lt is not None else {}
            inv, af = ROPE_INIT_FUNCTIONS[rope_type](text_config, None, seq_len=seq_len, **kwargs)
            out[lt] = (inv.double(), float(af))
    return name, out


def inv_freq_tolerance(base: float) -> float:
    """Relative bound on transformers' float32 ``1 / base ** (2i / d)`` against the exact value.

    The float32 exponent 2i/d carries a relative error of up to 2^-24, which the power turns
    into ln(base) * (2i/d) * 2^-24 <= ln(base) * 2^-24 in the result; pow, the division and the
    cast add a few more roundings (4 allowed). The scalings then multiply by float64 factors.
    """
    return (math.log(base) + 4) * 2.0**-24


# A config with two layer types and a rope per type (Gemma 3 style), small enough for tests.
PER_LAYER = {
    "head_dim": 16,
    "num_attention_heads": 2,
    "max_position_embeddings": 64,
    "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
    },
}
