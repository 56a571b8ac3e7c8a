"""Every rope-bearing model type of transformers 5.24: posemb reads it right or refuses it.

The sweep builds each model type's default config, takes its text config's ``to_dict()`` (what
``save_pretrained`` writes) and compares posemb's reading with the frequencies of transformers'
own rotary module. A model type posemb cannot read must raise ``ValueError``; a wrong schedule
is the one outcome that fails. The published configs are in test_hf_real_configs.py.
"""

from __future__ import annotations

import pytest
import torch

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


CASES = list(_text_configs())


def test_every_rope_family_is_read_right_or_refused():
    read, refused, wrong = [], [], []
    for mt, text, ref in CASES:
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
    # 258 of 302 model types with a text rotary module were read when this was written.
    assert len(read) >= 250, len(read)
    assert len(refused) < len(read) / 4


def test_partial_rotary_defaults_match_the_config_classes():
    """A config that omits the rotary fraction gets its class's default, never a silent 1."""
    for mt, text, _ in CASES:
        params = getattr(text, "rope_parameters", None) or {}
        if "rope_type" not in params:  # per layer type: the nested dicts always carry it
            continue
        values = {params.get("partial_rotary_factor")} - {None, 1}
        if not values or text.model_type in families.REFUSED:
            continue
        fam = families.family_for(text.model_type, set())
        assert {families.partial_default(text.model_type, fam)} == values, mt


def test_refused_model_types_exist_in_transformers():
    assert set(families.REFUSED) <= set(CONFIG_MAPPING.keys())
    with pytest.raises(ValueError, match="model_type 'jetmoe' is not read by posemb"):
        hf.rope_spec({"model_type": "jetmoe", "rope_theta": 1e4, "head_dim": 64})


def test_a_family_key_under_another_model_type_is_refused():
    with pytest.raises(ValueError, match="'qk_rope_head_dim' changes the RoPE"):
        hf.rope_spec({"model_type": "llama", "rope_theta": 1e4, "qk_rope_head_dim": 64})
