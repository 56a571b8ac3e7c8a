"""What ``transformers`` itself computes for a config: the reference the hf tests compare with.

Kept apart from the tests so the real-config test and the family sweep read a config the same
way: build the model's config class from the dict, take its text config, instantiate the rotary
module the text model uses, and read its per-layer-type ``inv_freq`` and attention scaling.
"""

from __future__ import annotations

import importlib
import logging
import math
import warnings

import torch

transformers = __import__("pytest").importorskip("transformers")
from transformers import AutoConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

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
    """transformers' text config for a config.json dict (the model's own config class)."""
    mt = model_type or STAND_INS.get(d["model_type"], d["model_type"])
    scaling = d.get("rope_scaling") or {}
    renamed = RENAMED_FOR_TRANSFORMERS.get((d["model_type"], scaling.get("type")))
    if renamed:
        d = {**d, "rope_scaling": {**scaling, "type": renamed}}
    if d["model_type"] in NESTED_FOR_TRANSFORMERS and "text_config" not in d:
        d = {"model_type": d["model_type"], "text_config": {**d, "model_type": mt + "_text"}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = AutoConfig.for_model(mt, **{k: v for k, v in d.items() if k != "model_type"})
    return cfg.get_text_config(decoder=True)


def rotary_classes(text_config) -> list[type]:
    """The rotary-embedding classes of the text config's modeling file, the text one first."""
    modname = type(text_config).__module__.replace(".configuration_", ".modeling_")
    try:
        mod = importlib.import_module(modname)
    except ImportError:
        return []
    want = type(text_config).__name__.replace("Config", "RotaryEmbedding")
    found = [
        c
        for n, c in vars(mod).items()
        if isinstance(c, type)
        and n.endswith("RotaryEmbedding")
        and issubclass(c, torch.nn.Module)
        and c.__module__ == mod.__name__
    ]
    # The text model's module: the config's own name first, then names of no other part.
    others = ("Vision", "Audio", "DiT", "Talker", "Token2Wav", "Encoder")
    found.sort(key=lambda c: (c.__name__ != want, any(o in c.__name__ for o in others), c.__name__))
    return found


def hf_frequencies(text_config, seq_len: int | None = None):
    """``(class name, {layer_type or None: (inv_freq float64, attention_factor)})``.

    With ``seq_len`` the length-dependent types are recomputed through transformers' own init
    function at that length (what its dynamic update does for a call of that length).
    """
    for cls in rotary_classes(text_config):
        try:
            module = cls(config=text_config)
        except Exception:  # a rotary class for another part of the model
            continue
        out = {}
        if hasattr(module, "embed_positions"):
            # GPT-J keeps cat(sin, cos) of float32 angles per position and no inv_freq: the
            # angle at position 1 is the frequency (float32 sin/cos, then atan2 in float64).
            half = module.embed_positions.shape[-1] // 2
            row = module.embed_positions[1].double()
            out[None] = (torch.atan2(row[:half], row[half:]), 1.0)
        if hasattr(module, "inv_freq"):
            out[None] = (module.inv_freq.double(), float(getattr(module, "attention_scaling", 1)))
        for name, buf in module.named_buffers():
            if name.endswith("_inv_freq") and not name.endswith("original_inv_freq"):
                lt = name[: -len("_inv_freq")]
                out[lt] = (buf.double(), float(getattr(module, f"{lt}_attention_scaling", 1)))
        if not out:
            continue
        if seq_len is not None:
            for lt in list(out):
                params = text_config.rope_parameters
                params = params[lt] if lt is not None else params
                rope_type = params["rope_type"]
                if rope_type in ("dynamic", "longrope"):
                    kwargs = {"layer_type": lt} if lt is not None else {}
                    inv, af = ROPE_INIT_FUNCTIONS[rope_type](
                        text_config, None, seq_len=seq_len, **kwargs
                    )
                    out[lt] = (inv.double(), float(af))
        return cls.__name__, out
    return None, {}


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
