"""hf.vision: every published config with a vision tower maps to its preset, head_dim and base,
or to the reason it has no RoPE; anything else is refused by name."""

from __future__ import annotations

import json
import pathlib

import pytest

from posemb import cli, hf
from posemb.cli import main

pytest.importorskip("transformers")

DATA = pathlib.Path(__file__).parent / "data" / "hf_configs"

# fixture -> (preset, head_dim, base), read off each file and its transformers class defaults.
ROPE = {
    "exaone4_5__exaone-4.5-33b.json": ("exaone4_5", 64, 10000.0),
    "gemma4__gemma-4-31b-it.json": ("gemma4", 72, 100.0),
    "gemma4__gemma-4-e2b-it.json": ("gemma4", 64, 100.0),
    "glm4v__glm-4.1v-9b-thinking.json": ("glm4v", 128, 10000.0),
    "llama4__llama-4-scout-17b-16e-instruct.json": ("llama4", 88, 10000.0),
    "mistral3__devstral-small-2-24b-instruct.json": ("pixtral", 64, 10000.0),
    "qwen2_5_vl__olmocr-2-7b-1025.json": ("qwen2_5_vl", 80, 10000.0),
    "qwen2_5_vl__qwen2.5-vl-7b-instruct.json": ("qwen2_5_vl", 80, 10000.0),
    "qwen2_vl__qwen2-vl-2b-instruct-awq.json": ("qwen2_vl", 80, 10000.0),
    "qwen3_5__qwen3.5-9b.json": ("qwen3_5", 72, 10000.0),
}
ABSOLUTE = {
    "gemma3__gemma-3-27b-it.json": "siglip_vision_model",
    "gemma3__gemma-3-4b-it.json": "siglip_vision_model",
    "lfm2_vl__lfm2.5-vl-1.6b.json": "siglip2_vision_model",
    "minicpmo__minicpm-o-2_6.json": "siglip_vision_model",
    "minicpmv__minicpm-v-4.json": "siglip_vision_model",
    "mllama__llama-3.2-90b-vision-instruct.json": "mllama_vision_model",
}


def test_every_fixture_with_a_vision_tower_is_listed_here():
    towers = {p.name for p in DATA.glob("*.json") if "vision_config" in json.loads(p.read_text())}
    assert towers == set(ROPE) | set(ABSOLUTE)


@pytest.mark.parametrize("name", sorted(ROPE))
def test_a_rope_tower_gives_its_preset_head_dim_and_base(name):
    data = json.loads((DATA / name).read_text())
    r = hf.vision_report(data)
    assert (r["preset"], r["head_dim"], r["base"]) == ROPE[name]
    rope = hf.vision_rotary_from_config(data)
    assert (rope.head_dim, rope.base, rope.order) == (r["head_dim"], r["base"], r["order"])
    assert sum(r["split"]) == r["head_dim"] // 2


@pytest.mark.parametrize("name", sorted(ABSOLUTE))
def test_a_tower_without_rope_says_so_and_builds_nothing(name):
    data = json.loads((DATA / name).read_text())
    r = hf.vision_report(data)
    assert r["preset"] is None and r["tower"] == ABSOLUTE[name] and "no RoPE" in r["reason"]
    with pytest.raises(ValueError, match=ABSOLUTE[name]):
        hf.vision_rotary_from_config(data)


def test_unknown_towers_and_text_models_are_refused_by_name():
    with pytest.raises(ValueError, match="no axial preset for the vision tower 'sam3_vision'"):
        hf.vision_report({"model_type": "sam3", "vision_config": {"model_type": "sam3_vision"}})
    with pytest.raises(ValueError, match="'llama' has no vision_config"):
        hf.vision_report({"model_type": "llama"})
    with pytest.raises(ValueError, match="no model_type"):
        hf.vision_report({"vision_config": {}})


def test_inspect_vision_prints_the_preset_and_its_json(capsys):
    path = str(DATA / "gemma4__gemma-4-31b-it.json")
    assert main(["inspect", path, "--vision"]) == 0
    out = capsys.readouterr().out
    assert "preset 'gemma4'" in out and "posemb.AxialRotaryEmbedding.preset('gemma4', 72" in out
    assert main(["inspect", path, "--vision", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["order"] == "chunks" and report["coordinates"] == ["x", "y"]


@pytest.mark.parametrize(
    ("cls_name", "preset"),
    [
        ("Qwen2VLConfig", "qwen2_vl"),
        ("Qwen2_5_VLConfig", "qwen2_5_vl"),
        ("Qwen3VLConfig", "qwen3_vl"),
        ("Qwen3VLMoeConfig", "qwen3_vl"),
        ("Qwen3_5Config", "qwen3_5"),
        ("Qwen3_5MoeConfig", "qwen3_5"),
        ("Glm4vConfig", "glm4v"),
        ("Glm4vMoeConfig", "glm4v"),
        ("Llama4Config", "llama4"),
    ],
)
def test_transformers_own_config_objects_name_their_towers(cls_name, preset):
    """transformers' classes call their towers "<model>_vision", as the files they save do."""
    transformers = pytest.importorskip("transformers")
    config = getattr(transformers, cls_name)()
    r = hf.vision_report(config)
    assert r["preset"] == preset
    rebuilt = hf.vision_report(config.to_dict())
    assert rebuilt == r


def test_a_scaled_vision_rope_is_refused_not_guessed():
    data = json.loads((DATA / "gemma4__gemma-4-e2b-it.json").read_text())
    data["vision_config"]["rope_parameters"] = {"rope_type": "linear", "factor": 2.0,
                                                "rope_theta": 100.0}  # fmt: skip
    with pytest.raises(ValueError, match="rope_type 'linear'"):
        hf.vision_report(data)


def _mutated(tmp_path, name, change):
    d = json.loads((DATA / name).read_text())
    change(d)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(d))
    return p


@pytest.mark.parametrize(
    ("name", "change", "match"),
    [
        ("mistral3__devstral-small-2-24b-instruct.json",
         lambda d: d["vision_config"].update(num_attention_heads=0), "must be a positive integer"),
        ("mistral3__devstral-small-2-24b-instruct.json",
         lambda d: d["vision_config"].update(rope_theta="abc"), "rope_theta must be a number"),
        ("llama__llama-3.1-8b-instruct.json",
         lambda d: d.update(vision_config={"model_type": "pixtral"}), "has no vision tower"),
    ],
    ids=["zero-heads", "theta-string", "text-only-class"],
)  # fmt: skip
def test_malformed_vision_blocks_are_one_line_refusals(tmp_path, capsys, name, change, match):
    # ZeroDivisionError, AttributeError and a plain ValueError with a traceback (exit 1).
    path = _mutated(tmp_path, name, change)
    assert cli.main(["inspect", "--vision", str(path)]) == 2
    err = capsys.readouterr().err
    assert match in err and len(err.strip().splitlines()) == 1, err


def test_options_that_do_not_apply_are_refused_not_ignored(capsys):
    path = DATA / "mistral3__devstral-small-2-24b-instruct.json"
    for extra in (["--seq-len", "100"], ["--layer-type", "full_attention"], ["--lenient"]):
        assert cli.main(["inspect", "--vision", str(path), *extra]) == 2
        assert "does not apply here" in capsys.readouterr().err
    assert cli.main(["bench", "--quick", "--dtype", "bf16"]) == 2  # the kernel bench: both
    assert "--dtype does not apply here" in capsys.readouterr().err
