"""Every rope-bearing model type of transformers 5.24: posemb reads it right or refuses it.

The sweep builds each model type's default config, takes its text config's ``to_dict()`` (what
``save_pretrained`` writes) and compares posemb's reading with the frequencies of transformers'
own rotary module. A model type posemb cannot read must raise ``ValueError``; a wrong schedule
is the one outcome that fails. The published configs are in test_hf_real_configs.py.
"""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
import transformers as transformers_pkg

from posemb import hf
from posemb.hf import families

hr = pytest.importorskip("hf_reference")
from transformers import CONFIG_MAPPING  # noqa: E402


def _text_configs():
    for mt in sorted(CONFIG_MAPPING.keys()):
        try:
            text = CONFIG_MAPPING[mt]().get_text_config(decoder=True)
        except Exception:  # a composite without usable defaults: nothing to compare
            continue
        cls, ref = hr.hf_frequencies(text)
        if ref and "Vision" not in (cls or ""):
            yield mt, text, ref


@pytest.fixture(scope="module")
def cases():
    """(model type, text config, transformers' frequencies) for every text rotary module: made
    when this module's tests run, not when it is collected (10 s, which every pytest-xdist
    worker paid for the module it would not run)."""
    return list(_text_configs())


def test_every_rope_family_is_read_right_or_refused(cases):
    read, refused, wrong = [], [], []
    for mt, text, ref in cases:
        try:
            model = hf.model_rope(text.to_dict())
        except ValueError:
            refused.append(mt)
            continue
        for kind in model.kinds:
            if kind.spec is None:
                continue
            want, want_factor = ref.get(kind.layer_type, ref.get(None))
            spec = kind.spec
            inv, factor = spec.scaling.compute(spec.rotary_dim, spec.base)
            tol = hr.inv_freq_tolerance(spec.base)
            if (
                inv.shape != want.shape
                or not torch.allclose(inv, want, rtol=tol, atol=0)
                or abs(factor - want_factor) > 1e-12
            ):
                wrong.append((mt, kind.layer_type))
        read.append(mt)
    assert not wrong
    # 261 of 312 model types with a text rotary module were read when this was written.
    assert len(read) >= 250, len(read)
    assert len(refused) < len(read) / 4


def test_partial_rotary_defaults_match_the_config_classes(cases):
    """A config that omits the rotary fraction gets its class's default, never a silent 1."""
    for mt, text, _ in cases:
        params = getattr(text, "rope_parameters", None) or {}
        if "rope_type" not in params:  # per layer type: the nested dicts always carry it
            continue
        if text.model_type in families.REFUSED:
            continue
        class_default = params.get("partial_rotary_factor") or 1.0
        fam = families.family_for(text.model_type, set())
        ours = families.partial_default(text.model_type, fam) or 1.0
        assert ours == class_default, mt


def test_refused_model_types_exist_in_transformers():
    assert set(families.REFUSED) <= set(CONFIG_MAPPING.keys())
    with pytest.raises(ValueError, match="model_type 'jetmoe' is not read by posemb"):
        hf.rope_spec({"model_type": "jetmoe", "rope_theta": 1e4, "head_dim": 64})


def test_a_family_key_under_another_model_type_is_refused():
    with pytest.raises(ValueError, match="'qk_rope_head_dim' changes the RoPE"):
        hf.rope_spec({"model_type": "llama", "rope_theta": 1e4, "qk_rope_head_dim": 64})


def _call_both(theirs, mine, x, pos, layer_type):
    takes = "layer_type" in inspect.signature(theirs.forward).parameters
    want = theirs(x, pos, layer_type) if takes and layer_type is not None else theirs(x, pos)
    return want, mine(x, pos, layer_type)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_patched_module_returns_what_each_family_module_returns(dtype, cases):
    """HFRotaryEmbedding gives every read family's attention the tables it expects.

    Same structure (a cos/sin pair or one complex tensor), shapes and dtypes as the module it
    replaces, and values within transformers' float32 drift (positions < 8; the tables are
    cast to x's dtype by both, so bfloat16 allows one bfloat16 rounding).
    """
    tol = 1e-5 if dtype == torch.float32 else 2.0**-7
    checked, failed = 0, []
    for mt, text, _ in cases:
        try:
            mine = hf.HFRotaryEmbedding(text)
        except ValueError:
            continue  # refused: the sweep above holds refusals to a minority
        cls = next(c for c in hr.rotary_classes(text) if c.__name__ == hr.hf_frequencies(text)[0])
        theirs = cls(config=text)
        pos = torch.arange(7)[None].expand(2, 7)
        if any(k.spec is not None and k.spec.mrope_section for k in mine.model.kinds):
            pos = torch.stack([pos, pos // 2, pos % 3])
        kinds = mine.layer_types or (None,)
        x = torch.zeros(2, 3, 5, dtype=dtype)
        for lt in kinds:
            try:
                want, got = _call_both(theirs, mine, x, pos, lt)
            except (RuntimeError, TypeError):
                # transformers' own default config cannot run its module (GLM-4V's default
                # mrope_section does not fit its default rotary size; HunYuan-VL's default has
                # no xdrope_section): nothing to compare.
                break
            want = want if isinstance(want, tuple) else (want,)
            got = got if isinstance(got, tuple) else (got,)
            same_form = len(want) == len(got) and all(
                a.shape == b.shape and a.dtype == b.dtype for a, b in zip(want, got, strict=True)
            )
            if not same_form or any(
                (a - b).abs().max() > tol for a, b in zip(want, got, strict=True)
            ):
                failed.append(
                    (mt, lt, [(a.dtype, b.dtype) for a, b in zip(want, got, strict=False)])
                )
        else:
            checked += 1
    assert not failed, repr(failed)
    assert checked >= 240, checked


def test_mrope_model_types_are_the_classes_that_keep_mrope_keys():
    """posemb accepts M-RoPE keys in the rope parameters where transformers' classes do."""
    keeping = set()
    for mt in list(CONFIG_MAPPING):
        try:
            text = CONFIG_MAPPING[mt]().get_text_config(decoder=True)
        except Exception:  # no usable defaults
            continue
        if "mrope_section" in (getattr(text, "ignore_keys_at_rope_validation", None) or ()):
            keeping.add(text.model_type)
    refused_or_own = set(families.REFUSED) | {"hunyuan_vl_text", "ernie4_5_vl_moe_text"}
    assert keeping - refused_or_own == set(families.MROPE_MODEL_TYPES) - refused_or_own


@pytest.mark.parametrize("flag", [None, False, True])
def test_mrope_tables_match_each_family_module_with_3d_positions(flag, cases):
    """Which pairs follow which axis: every M-RoPE family, a section that tells the assignments
    apart, positions whose three axes differ, and mrope_interleaved absent, false or true (no
    transformers module reads it; posemb follows each family's fixed assignment)."""
    compared = set()
    for mt, text, _ in cases:
        if text.model_type not in families.MROPE_MODEL_TYPES or mt in families.REFUSED:
            continue
        text = copy.deepcopy(text)
        params = text.rope_parameters
        if "rope_type" not in params:
            continue
        try:
            n = hf.rope_spec(
                {**text.to_dict(), "rope_parameters": {**params, "mrope_section": [1, 1, 1]}}
            )
        except ValueError as err:
            n = int(str(err).split("has ")[-1].split(" pairs")[0]) if "pairs" in str(err) else None
        if n is None:
            continue
        section = [n - 2 * (n // 3), n // 3, n // 3]
        params["mrope_section"] = section
        params.pop("mrope_interleaved", None)
        if flag is not None:
            params["mrope_interleaved"] = flag
        fam = families.family_for(text.model_type, set())
        if flag is not None and "mrope_interleaved" not in fam.rope_keys:
            # The family's class does not keep the key: strict reading refuses it.
            with pytest.raises(ValueError, match="'mrope_interleaved'] is not read"):
                hf.HFRotaryEmbedding(text)
            continue
        name = hr.hf_frequencies(text)[0]
        cls = next(c for c in hr.rotary_classes(text) if c.__name__ == name)
        try:
            theirs = cls(config=text)
        except Exception:  # a class whose defaults do not build
            continue
        mine = hf.HFRotaryEmbedding(text)
        pos = torch.arange(11)[None].expand(2, 11)
        pos3 = torch.stack([pos, 3 * pos + 1, 7 * pos + 2])
        x = torch.zeros(2, 3, 5)
        want, got = theirs(x, pos3), mine(x, pos3)
        for a, b in zip(want, got, strict=True):
            assert a.shape == b.shape, mt
            assert float((a - b).abs().max()) < 1e-5, (mt, flag)
        compared.add(text.model_type)
    assert {"qwen2_vl_text", "qwen2_5_vl_text", "qwen3_vl_text", "qwen3_5_text"} <= compared


def _rope_gates() -> dict[str, str]:
    """Model folders whose attention rotates only some layers, read off transformers' code.

    Two gates exist in transformers 5.24's modeling files: ``if self.sliding_window is None or
    self.is_sliding`` (EXAONE 4 style) and ``if self.sliding_window is not None`` right before
    ``apply_rotary_pos_emb`` with a per-layer window (Cohere 2 style).
    """
    import pathlib
    import re

    root = pathlib.Path(transformers_pkg.__file__).parent / "models"
    gates = {}
    for path in root.glob("*/modeling_*.py"):
        src = path.read_text(encoding="utf-8")
        if re.search(r"if self\.sliding_window is None or self\.is_sliding:", src):
            gates[path.parent.name] = "sliding_if_window"
        elif re.search(
            r"if self\.sliding_window is not None(?: or self\.force_rope)?:\n(?:.*\n)?\s*"
            r"query_states, key_states = apply_rotary_pos_emb",
            src,
        ):
            gates[path.parent.name] = "sliding_only"
    return gates


def test_every_layer_gate_in_transformers_has_a_rule():
    """A model whose attention skips RoPE on some layers is read with that rule (or refused)."""
    gates = _rope_gates()
    assert {"exaone4", "cohere2"} <= set(gates)  # the scan finds what it looks for
    for folder, gate in gates.items():
        types = [mt for mt, cls in CONFIG_MAPPING.items() if f"models.{folder}." in cls.__module__]
        for mt in types:
            if mt in families.REFUSED or "vision" in mt:
                continue
            fam = families.family_for(mt, set())
            assert fam.rope_layers == gate, (mt, gate, fam.name)


def _has_own_head_dim(model_type: str, hidden: int, heads: int) -> bool:
    cfg = transformers_pkg.AutoConfig.for_model(
        model_type, hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=4
    )
    text = cfg.get_text_config(decoder=True).to_dict()
    got = text.get("head_dim")
    return isinstance(got, int) and got != text["hidden_size"] // text["num_attention_heads"]


def test_class_head_dim_lists_every_class_with_a_head_dim_of_its_own():
    """A file without head_dim: a class that derives it (hidden_size / num_attention_heads)
    agrees with posemb's derivation; every other one is in CLASS_HEAD_DIM, read through the
    class. Two sizes, so a default that happens to equal the quotient is not mistaken."""
    own = set()
    for mt in sorted(CONFIG_MAPPING.keys()):
        try:
            if any(_has_own_head_dim(mt, h, n) for h, n in ((2304, 8), (1536, 12))):
                own.add(mt)
        except Exception:  # a class that cannot be built from these sizes: nothing to compare
            continue
    assert own == set(families.CLASS_HEAD_DIM)


def test_no_model_type_is_both_refused_and_given_a_rule():
    assert not set(families.PARTIAL_DEFAULTS) & set(families.REFUSED)
    ruled = {mt for f in families.FAMILIES for mt in f.model_types}
    assert not ruled & set(families.REFUSED)


def test_phi1_keeps_gptj_rotary_dim_unread():
    spec = hf.rope_spec(
        {"model_type": "phi", "rope_theta": 1e4, "hidden_size": 2048, "num_attention_heads": 32}
        | {"partial_rotary_factor": 0.5, "rotary_dim": 16}
    )
    assert spec.rotary_dim == 32  # from the fraction, 64 * 0.5; rotary_dim is not what says so
    with pytest.raises(ValueError, match="'rotary_dim' changes the RoPE"):
        hf.rope_spec({"model_type": "llama", "rope_theta": 1e4, "head_dim": 64, "rotary_dim": 32})
