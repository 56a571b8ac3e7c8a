"""What each model family keeps where: the per-family rules behind :mod:`posemb.hf.config`.

A published ``config.json`` carries the RoPE description in the generic keys (``rope_parameters``
or ``rope_scaling``, ``rope_theta``, ``head_dim``, ``partial_rotary_factor``) *plus* keys only one
family reads: the rotary part of a multi-head-latent-attention head (``qk_rope_head_dim``),
GPT-NeoX's ``rotary_pct``/``rotary_emb_base``, Gemma 3's ``rope_local_base_freq`` for its sliding
layers, and so on. Reading only the generic keys gets those families silently wrong, so every
such key is declared here with the family that reads it, and :func:`family_for` refuses a config
that carries one of them under a model type that does not declare it.

Each rule states what ``transformers`` 5.24 does for that model type (the file it was read from is
named in the rule) and is tested against it on published configs in
``tests/test_hf_real_configs.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._errors import InputError
from ..kernels.layout import Layout

# Keys outside the rope parameters that change which channels rotate, at what base, or in which
# layout. A config that carries one under a model type whose rule does not read it is refused:
# reading around it would give a different schedule without a word.
FAMILY_KEYS = frozenset(
    {
        "qk_rope_head_dim",
        "rotary_dim",
        "rotary_pct",
        "rotary_emb_base",
        "rope_local_base_freq",
        "global_head_dim",
        "global_rope_theta",
        "local_rope_theta",
        "force_rope",
        "rope_interleave",
        "no_rope_layers",
        "attn_temperature_tuning",
    }
)


@dataclass(frozen=True)
class Family:
    """How one model family's config describes its RoPE.

    Attributes:
        name: the family as the families table of the docs (docs/hf.md) names it.
        model_types: the ``model_type`` values (of the text config) the rule applies to.
        tested_with: the ``transformers`` rotary module the tests compare against.
        rope_head_dim_key: key holding the rotary part of the head, for multi-head latent
            attention (the frequencies are formed over this many channels, all rotating).
        rotary_dim_key: key giving the number of rotating channels directly (GPT-J, CodeGen);
            null there means the whole head rotates.
        partial_key: another spelling of ``partial_rotary_factor`` (GPT-NeoX ``rotary_pct``).
        theta_key: another spelling of ``rope_theta`` (GPT-NeoX ``rotary_emb_base``).
        fixed_theta: a base the modeling code fixes and no config key changes (GPT-J).
        local_theta_key: base of the sliding-window layers (Gemma 3 ``rope_local_base_freq``).
        scaling_on: the one layer type a flat ``rope_scaling`` applies to; the other layer
            types get plain RoPE (Gemma 3, OLMo 3).
        nope_layer_types: layer types that rotate nothing (linear attention, EXAONE 4's global
            layers when a sliding window is set).
        rope_layers: which attention layers rotate: ``"all"``; ``"sliding_if_window"`` (EXAONE 4:
            only the sliding-window layers when ``sliding_window`` is set, every layer
            otherwise); ``"sliding_only"`` (Cohere 2, Flint: full-attention layers never rotate,
            unless ``force_rope_key`` is true).
        force_rope_key: a boolean key that makes every layer rotate (Cohere 2 MoE).
        local_scaling: whether a flat ``rope_scaling`` also applies to the local layers
            (ModernBERT: yes; Gemma 3, OLMo 3: no, see ``scaling_on``).
        global_head_dim_key: head size of the full-attention layers when it differs (Gemma 4).
        layout_key: key choosing the pairing; ``default_layout`` when absent.
        default_layout: the pairing the family's checkpoints rotate in.
        rope_keys: keys the family keeps inside the rope parameters for other uses
            (``transformers``' ``ignore_keys_at_rope_validation``).
        rope_type_aliases: legacy ``type`` spellings the family's config class renames.
        temperature: the position-dependent query scaling the family applies beside RoPE:
            ``"llama4"`` (``attn_temperature_tuning``) or ``"llama4_beta"``
            (``llama_4_scaling_beta`` in the rope parameters).
        partial_default: the family's class default for the rotary fraction when it is not
            1 (a config that omits it relies on that default).
        layer_kinds_from_no_rope: Llama 4: ``no_rope_layers`` (1 = RoPE, 0 = none) splits the
            layers into the kinds ``"rope"`` and ``"nope"``.
        mrope: the family uses multimodal RoPE (``mrope_section`` in the rope parameters).
        mrope_assignment: how the family's module assigns pairs to axes, whatever the config
            says: ``"chunked"`` (Qwen2-VL: sections in turn) or ``"interleaved"`` (Qwen3-VL:
            pair j follows axis j mod 3). No transformers module reads ``mrope_interleaved``.
        tables: what the family's rotary module returns, which :class:`~posemb.hf.HFRotaryEmbedding`
            reproduces: ``"half"`` (``cat([cos, cos])`` and sin, for ``rotate_half``),
            ``"interleaved"`` (each of cos and sin repeated twice in place, GLM-4V),
            ``"complex"`` (``cos + i sin`` of width rotary_dim / 2: Llama 4, DeepSeek-V2),
            ``"half_width"`` (cos and sin of width rotary_dim / 2, gpt-oss) or
            ``"table"`` (GPT-J's stacked sin/cos buffer, which posemb does not replace).

        no_rope_unless: a boolean key that must be false for the model to use RoPE at all
            (Falcon's ``alibi``).
        ignored_keys: keys of other families' rules that the family's files carry and its
            class ignores (phi-1's GPT-J ``rotary_dim``): not refused, not read.
    """

    name: str
    model_types: tuple[str, ...]
    tested_with: str
    rope_head_dim_key: str | None = None
    rotary_dim_key: str | None = None
    partial_key: str | None = None
    theta_key: str | None = None
    fixed_theta: float | None = None
    local_theta_key: str | None = None
    scaling_on: str | None = None
    nope_layer_types: frozenset[str] = frozenset()
    rope_layers: str = "all"
    force_rope_key: str | None = None
    mrope_assignment: str | None = None
    global_head_dim_key: str | None = None
    layout_key: str | None = None
    default_layout: Layout = Layout.HALF
    rope_keys: frozenset[str] = frozenset()
    rope_type_aliases: dict[str, str] = field(default_factory=dict)
    temperature: str | None = None
    partial_default: float | None = None
    layer_kinds_from_no_rope: bool = False
    mrope: bool = False
    no_rope_unless: str | None = None
    ignored_keys: frozenset[str] = frozenset()
    tables: str = "half"

    def reads(self) -> frozenset[str]:
        """The keys of :data:`FAMILY_KEYS` this rule reads."""
        keys = {
            self.rope_head_dim_key,
            self.rotary_dim_key,
            self.partial_key,
            self.theta_key,
            self.local_theta_key,
            self.global_head_dim_key,
            self.layout_key,
        }
        if self.layer_kinds_from_no_rope:
            keys.add("no_rope_layers")
        if self.force_rope_key:
            keys.add(self.force_rope_key)
        if self.temperature == "llama4":
            keys.add("attn_temperature_tuning")
        return frozenset(k for k in keys if k is not None) & FAMILY_KEYS


_MROPE = frozenset({"mrope_section", "mrope_interleaved"})

FAMILIES: tuple[Family, ...] = (
    Family(
        "DeepSeek-V3 / V3.2, Kimi K2 (multi-head latent attention)",
        ("deepseek_v3", "deepseek_v32", "kimi_k2"),
        "DeepseekV3RotaryEmbedding",
        rope_head_dim_key="qk_rope_head_dim",
        # modeling_deepseek_v3.py rotates interleaved pairs unless rope_interleave is false.
        layout_key="rope_interleave",
        default_layout=Layout.INTERLEAVED,
    ),
    Family(
        "DeepSeek-V2 (multi-head latent attention)",
        ("deepseek_v2",),
        "DeepseekV2RotaryEmbedding",
        rope_head_dim_key="qk_rope_head_dim",
        # modeling_deepseek_v2.py multiplies complex pairs: always interleaved.
        default_layout=Layout.INTERLEAVED,
        tables="complex",
    ),
    Family(
        "MiniCPM3 (multi-head latent attention)",
        ("minicpm3",),
        "MiniCPM3RotaryEmbedding",
        rope_head_dim_key="qk_rope_head_dim",
    ),
    Family(
        "GLM-4.7-Flash / GLM-4 MoE Lite (multi-head latent attention)",
        ("glm4_moe_lite",),
        "Glm4MoeLiteRotaryEmbedding",
        rope_head_dim_key="qk_rope_head_dim",
        layout_key="rope_interleave",
        default_layout=Layout.INTERLEAVED,
    ),
    Family(
        "GPT-J",
        ("gptj",),
        "GPTJRotaryEmbedding (embed_positions table)",
        rotary_dim_key="rotary_dim",
        # modeling_gptj.py builds its table with base 10000 and no config key for it.
        fixed_theta=10000.0,
        default_layout=Layout.INTERLEAVED,
        tables="table",
    ),
    Family(
        "GPT-NeoX / Pythia",
        ("gpt_neox",),
        "GPTNeoXRotaryEmbedding",
        # configuration_gpt_neox.py reads only these spellings (a top-level rope_theta or
        # partial_rotary_factor is ignored there, so posemb refuses one that disagrees).
        partial_key="rotary_pct",
        theta_key="rotary_emb_base",
        partial_default=0.25,
    ),
    Family(
        "GPT-NeoX Japanese",
        ("gpt_neox_japanese",),
        "GPTNeoXJapaneseRotaryEmbedding",
        partial_key="rotary_pct",
        theta_key="rotary_emb_base",
        partial_default=1.0,
    ),
    Family(
        "Phi-1 / Phi-2",
        ("phi",),
        "PhiRotaryEmbedding",
        partial_default=0.5,
        # phi-1's config also keeps GPT-J's rotary_dim beside partial_rotary_factor; PhiConfig
        # ignores it (the modeling code reads only the fraction).
        ignored_keys=frozenset({"rotary_dim"}),
    ),
    Family(
        "Persimmon / Fuyu", ("persimmon", "fuyu"), "PersimmonRotaryEmbedding", partial_default=0.5
    ),
    Family("StableLM", ("stablelm",), "StableLmRotaryEmbedding", partial_default=0.25),
    Family("GLM / GLM-4", ("glm", "glm4"), "GlmRotaryEmbedding", partial_default=0.5),
    Family(
        "Phi-3 / Phi-3.5 / Phi-4 (LongRoPE)",
        ("phi3",),
        "Phi3RotaryEmbedding",
        # configuration_phi3.py renames the early spellings of LongRoPE.
        rope_type_aliases={"su": "longrope", "yarn": "longrope"},
    ),
    Family(
        "Gemma 3 / Gemma 3n",
        ("gemma3", "gemma3_text", "gemma3n", "gemma3n_text"),
        "Gemma3RotaryEmbedding",
        local_theta_key="rope_local_base_freq",
        scaling_on="full_attention",
    ),
    Family(
        "Gemma 4",
        (
            *("gemma4", "gemma4_text", "gemma4_unified", "gemma4_unified_text"),
            *("gemma4_unified_assistant", "diffusion_gemma", "diffusion_gemma_text"),
            *("embedding_gemma2", "embedding_gemma2_text"),
        ),
        "Gemma4TextRotaryEmbedding",
        # configuration_gemma4.py turns global_head_dim into per-layer overrides and keeps no
        # attribute for it, so a config must state it: the published ones do.
        global_head_dim_key="global_head_dim",
    ),
    Family("OLMo 3", ("olmo3",), "Olmo3RotaryEmbedding", scaling_on="full_attention"),
    Family(
        "EXAONE 4 / 4.5 / MoE, Kolibri",
        ("exaone4", "exaone4_5", "exaone4_5_text", "exaone_moe", "kolibri1"),
        "Exaone4RotaryEmbedding",
        # modeling_exaone4.py: `if self.sliding_window is None or self.is_sliding` rotates.
        rope_layers="sliding_if_window",
    ),
    Family(
        "Llama 4",
        ("llama4", "llama4_text"),
        "Llama4TextRotaryEmbedding",
        default_layout=Layout.INTERLEAVED,
        layer_kinds_from_no_rope=True,
        temperature="llama4",
        tables="complex",
    ),
    Family(
        "Ministral 3 / Mistral 3 (Devstral 2)",
        ("ministral3",),
        "Ministral3RotaryEmbedding",
        rope_keys=frozenset({"llama_4_scaling_beta", "max_position_embeddings"}),
        temperature="llama4_beta",
    ),
    Family(
        "Qwen2-VL / Qwen2.5-VL / Qwen2.5-Omni (M-RoPE)",
        (
            *("qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text"),
            *("qwen2_5_omni_text", "qwen2_5_omni_talker"),
        ),
        "Qwen2VLRotaryEmbedding",
        rope_keys=_MROPE,
        rope_type_aliases={"mrope": "default"},
        mrope=True,
        mrope_assignment="chunked",
    ),
    Family(
        "Qwen3-VL / Qwen3.5 (interleaved M-RoPE)",
        (
            *("qwen3_vl", "qwen3_vl_text", "qwen3_vl_moe", "qwen3_vl_moe_text"),
            *("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"),
            *("qwen3_omni_moe_text", "qwen4_exp_text", "hy_v4_vl_text", "cohere_compass_text"),
        ),
        "Qwen3VLTextRotaryEmbedding",
        rope_keys=_MROPE,
        rope_type_aliases={"mrope": "default"},
        nope_layer_types=frozenset({"linear_attention"}),
        mrope=True,
        # modeling_qwen3_vl.py and its copies always take the interleaved assignment.
        mrope_assignment="interleaved",
    ),
    Family(
        "GLM-4.1V / GLM-4.5V (M-RoPE, interleaved pairs)",
        (*("glm4v", "glm4v_text", "glm4v_moe", "glm4v_moe_text", "glm_ocr", "glm_ocr_text"),),
        "Glm4vTextRotaryEmbedding",
        rope_keys=frozenset({"mrope_section"}),
        # modeling_glm4v.py pairs channels (2i, 2i+1) (rotate_half_llm) and repeats each
        # frequency twice in place.
        default_layout=Layout.INTERLEAVED,
        mrope=True,
        mrope_assignment="chunked",
        tables="interleaved",
    ),
    Family(
        "GLM-Image (M-RoPE)",
        ("glm_image", "glm_image_text"),
        "GlmImageTextRotaryEmbedding",
        # modeling_glm_image.py: GLM-4V's chunked assignment with rotate_half tables.
        rope_keys=frozenset({"mrope_section"}),
        mrope=True,
        mrope_assignment="chunked",
    ),
    Family("Falcon", ("falcon",), "FalconRotaryEmbedding", no_rope_unless="alibi"),
    Family(
        "gpt-oss",
        ("gpt_oss", "openai_privacy_filter"),
        "GptOssRotaryEmbedding",
        # modeling_gpt_oss.py rotates the two halves with half-width tables.
        tables="half_width",
    ),
    Family(
        "Cohere Command R7B / A (Cohere 2)",
        ("cohere2", "cohere2_vision", "aya_vision"),
        "Cohere2RotaryEmbedding",
        # modeling_cohere2.py rotates only layers with a sliding window; tables as Cohere's.
        default_layout=Layout.INTERLEAVED,
        tables="interleaved",
        rope_layers="sliding_only",
    ),
    Family(
        "Cohere 2 MoE",
        ("cohere2_moe",),
        "Cohere2MoeRotaryEmbedding",
        default_layout=Layout.INTERLEAVED,
        tables="interleaved",
        rope_layers="sliding_only",
        force_rope_key="force_rope",
    ),
    Family("Flint", ("flint",), "FlintRotaryEmbedding", rope_layers="sliding_only"),
    Family(
        "ModernBERT",
        ("modernbert", "modernbert-decoder"),
        "ModernBertRotaryEmbedding",
        # configuration_modernbert.py: one scaling for both layer types, a base for each.
        theta_key="global_rope_theta",
        local_theta_key="local_rope_theta",
    ),
    Family(
        "Cohere Command R, BLT",
        (
            "cohere",
            *("blt_global_transformer", "blt_local_decoder", "blt_local_encoder", "blt_patcher"),
        ),
        "CohereRotaryEmbedding",
        # modeling_cohere.py repeats each frequency twice in place (repeat_interleave) and
        # pairs channels (2i, 2i+1): the checkpoints rotate interleaved pairs.
        default_layout=Layout.INTERLEAVED,
        tables="interleaved",
    ),
)

_BY_TYPE = {mt: fam for fam in FAMILIES for mt in fam.model_types}

# Text model types whose config classes keep the M-RoPE keys in the rope parameters
# (transformers' ignore_keys_at_rope_validation; tests/test_hf_families.py holds this equal to
# the classes). posemb reads the keys for all of them; the families above that need more (Qwen3's
# forced interleaving, GLM-4V's pairwise tables) say so in their own rules.
MROPE_MODEL_TYPES = frozenset(
    {
        *("qwen2_vl_text", "qwen2_5_vl_text", "qwen2_5_omni_text", "qwen2_5_omni_talker"),
        *("qwen3_vl_text", "qwen3_vl_moe_text", "qwen3_5_text", "qwen3_5_moe_text"),
        *("qwen3_omni_moe_text", "qwen4_exp_text", "cohere_compass_text", "cosmos3_edge_text"),
        *("glm4v_text", "glm4v_moe_text", "glm_image_text", "glm_ocr_text", "hy_v4_vl_text"),
    }
)

# Model types whose rotary module returns float32 tables whatever x's dtype (the attention casts
# later): modeling_olmo3.py ("returns cos/sin in fp32 without casting"), modeling_olmo2.py and
# modeling_ernie4_5.py ("keeping it in full precision") and their copies. Held equal to what
# each module returns by tests/test_hf_families.py.
FLOAT32_TABLES = frozenset(
    {"olmo", "olmo2", "olmo3", "olmo_hybrid", "flex_olmo", "ernie4_5", "ernie4_5_moe"}
    | {"beam", "lfm3"}
)

# Class defaults of the rotary fraction that are not 1, for model types read by the generic
# rule: a config that omits partial_rotary_factor relies on them. tests/test_hf_families.py
# holds this table equal to every transformers 5.24 config class's default. (Per-layer-type
# defaults, Gemma 4's proportional full-attention layers, live in the nested rope parameters that
# those configs always write.)
PARTIAL_DEFAULTS: dict[str, float] = {
    "bamba": 0.5,
    "deepseek_v4": 0.125,
    "dots3_note_text": 0.25,
    "glm4_moe": 0.5,
    "glm4v_moe": 0.5,
    "glm4v_moe_text": 0.5,
    "laguna": 0.5,
    "mimo_v2_flash": 0.334,
    "moonshine": 0.9,
    "moonshine_streaming": 0.8,
    "nemotron": 0.5,
    "neomme": 0.25,
    "qwen3_next": 0.25,
    "recurrent_gemma": 0.5,
    "dots3_note_audio_encoder": 0.5,
    "glmasr_encoder": 0.5,
    "nemotron3_5_transcribe_asr_audio": 0.5,
    "nemotron3_5_transcribe_word_timestamp": 0.5,
    "qwen3_5": 0.25,
    "qwen3_5_text": 0.25,
    "qwen3_5_moe": 0.25,
    "qwen3_5_moe_text": 0.25,
}


# Model types whose transformers 5.24 config class sets a head_dim of its own (Gemma's 256,
# Qwen3's 128, ...) when a file has none, where most classes take hidden_size /
# num_attention_heads. For these a file without head_dim is read through the class (as a
# missing rope_theta is): deriving it read Gemma 2 2B as 288 channels where its class has 256.
# tests/test_hf_families.py holds this set equal to every config class's behaviour.
CLASS_HEAD_DIM: frozenset[str] = frozenset(
    {
        "afmoe",
        "axk1",
        "axk2",
        "bailing_hybrid",
        "beam",
        "canary_decoder",
        "cohere2_moe",
        "cosmos3_edge_text",
        "cwm",
        "deepseek_v2",
        "deepseek_v3",
        "deepseek_v32",
        "deepseek_v4",
        "dia_decoder",
        "dia_encoder",
        "diffusion_gemma",
        "diffusion_gemma_text",
        "dory",
        "embedding_gemma2",
        "embedding_gemma2_text",
        "ernie4_5",
        "flint",
        "fun_asr_nano",
        "gemma",
        "gemma2",
        "gemma3",
        "gemma3_text",
        "gemma3n_text",
        "gemma4",
        "gemma4_text",
        "gemma4_unified",
        "gemma4_unified_assistant",
        "gemma4_unified_text",
        "gemma4_vision",
        "glm",
        "glm4",
        "glm_moe_dsa",
        "gpt_oss",
        "helium",
        "higgs_audio_v2",
        "hrm_text",
        "hy_v3",
        "hy_v4",
        "hy_v4_vl",
        "hy_v4_vl_text",
        "inkling2",
        "inkling2_loop",
        "inkling2_loop_text",
        "inkling2_text",
        "inkling_mm_model",
        "inkling_text",
        "internlm3",
        "iquestcoder",
        "kimi_k25",
        "kimi_linear",
        "kolibri1",
        "kosmos_2_5_vision_model",
        "laguna",
        "lara_mini",
        "lfm3",
        "lighton_ocr",
        "llama4_text",
        "longcat_flash",
        "mellum",
        "mimo_v2_flash",
        "minicpm3",
        "minimax_m2",
        "minimax_m3_vl",
        "minimax_m3_vl_text",
        "ministral3",
        "mistral3",
        "mistral4",
        "mistral_large4",
        "mistral_large4_text",
        "molmo2_adapter",
        "molmo2_text",
        "molmo2_vision",
        "moss_transcribe_diarize",
        "muse_glimmer",
        "muse_glimmer_assistant",
        "muse_glimmer_text",
        "muse_spark_text",
        "nemo_speechlm",
        "nemotron_h",
        "neomme",
        "neucodec",
        "openai_privacy_filter",
        "paddleocr_vl",
        "paddleocr_vl_text",
        "pe_audio_encoder",
        "pe_audio_video_encoder",
        "pe_video_encoder",
        "qwen2_5_omni_dit",
        "qwen2_5_omni_talker",
        "qwen3",
        "qwen3_5_moe",
        "qwen3_5_moe_text",
        "qwen3_5_text",
        "qwen3_next",
        "qwen3_omni_moe_talker_code_predictor",
        "qwen3_vl_text",
        "qwen4_exp",
        "qwen4_exp_text",
        "sarvam_mla",
        "sarvam_moe",
        "seed_oss",
        "shieldgemma2",
        "solar_open",
        "step3p5",
        "step3p7",
        "t5_gemma_module",
        "t5gemma",
        "t5gemma2",
        "t5gemma2_decoder",
        "t5gemma2_encoder",
        "t5gemma2_text",
        "timesfm",
        "timesfm2_5",
        "vaultgemma",
        "voxtral",
        "voxtral_realtime",
        "voxtral_realtime_encoder",
        "xcodec2",
        "youtu",
        "zaya",
    }
)


def partial_default(model_type: str | None, fam: Family) -> float | None:
    """The class default of the rotary fraction when it is not 1 (None: it is 1)."""
    if fam.partial_default is not None:
        return fam.partial_default
    return PARTIAL_DEFAULTS.get(model_type or "")


# Model types whose RoPE transformers 5.24 forms in a way the generic keys do not describe and
# posemb does not read yet: refused by name rather than read wrongly. Found by
# tests/test_hf_families.py, which compares every rope-bearing model type's default config.
REFUSED: dict[str, str] = {
    "mistral4": "frequencies formed over the whole q/k head (nope + rope part)",
    "mistral_large4": "per-layer NoPE pattern and frequencies over the whole q/k head",
    "mistral_large4_text": "per-layer NoPE pattern and frequencies over the whole q/k head",
    "jetmoe": "the rotary head size comes from kv_channels",
    "zamba2": "the rotary head size comes from attention_head_dim of the shared block",
    "ernie4_5_vl_moe": "3D RoPE with its own assignment of pairs to axes",
    "ernie4_5_vl_moe_text": "3D RoPE with its own assignment of pairs to axes",
    "eomt_dinov3": "a vision backbone's patch RoPE",
    "efficientloftr": "a vision matcher's 2D RoPE",
    "smollm3": "no_rope_layers with its own NoPE pattern",
    "zaya": "a hybrid rope dict per block kind",
    "phimoe": "LongRoPE with separate short and long attention factors (short_mscale, long_mscale)",
    "cosmos3_edge": "M-RoPE with its own assignment of pairs to axes",
    "cosmos3_edge_text": "M-RoPE with its own assignment of pairs to axes",
}

# The rule for model types without one: the generic keys only.
GENERIC = Family("generic (Llama, Mistral, Qwen2/3, ...)", (), "<Model>RotaryEmbedding")


def family_for(model_type: str | None, keys: set[str] | frozenset[str]) -> Family:
    """The rule for a model type, refusing family keys it would not read.

    Args:
        model_type: the text config's ``model_type`` (None when the config names none).
        keys: the top-level keys of the text config.

    Returns:
        The model type's :class:`Family`, or :data:`GENERIC`.

    Raises:
        ValueError: the config carries a key of :data:`FAMILY_KEYS` that the model type's
            rule does not read (reading around it would be silently wrong).
    """
    if model_type in REFUSED:
        raise InputError(
            f"model_type {model_type!r} is not read by posemb: {REFUSED[model_type]} (see "
            f"posemb.hf.families.REFUSED)"
        )
    fam = _BY_TYPE.get(model_type or "", GENERIC)
    if fam is GENERIC and model_type in MROPE_MODEL_TYPES:
        # Every M-RoPE class is in a family above; a new one must say how it assigns axes.
        raise InputError(
            f"model_type {model_type!r} uses multimodal RoPE with an assignment of pairs to "
            f"axes posemb has no rule for"
        )
    stray = sorted((set(keys) & FAMILY_KEYS) - fam.reads() - fam.ignored_keys)
    if stray:
        readers = sorted({mt for f in FAMILIES if stray[0] in f.reads() for mt in f.model_types})
        raise InputError(
            f"config key {stray[0]!r} changes the RoPE of the model types that use it "
            f"({', '.join(readers)}), but model_type is {model_type!r}, whose rule does not read "
            f"it; posemb refuses rather than ignore it (set model_type, or remove the key)"
        )
    return fam


__all__ = [
    "CLASS_HEAD_DIM",
    "FAMILIES",
    "FAMILY_KEYS",
    "FLOAT32_TABLES",
    "GENERIC",
    "MROPE_MODEL_TYPES",
    "PARTIAL_DEFAULTS",
    "REFUSED",
    "Family",
    "family_for",
    "partial_default",
]
