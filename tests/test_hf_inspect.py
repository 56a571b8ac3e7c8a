"""`posemb inspect`."""

import json
import pathlib
import re

import pytest

from posemb import cli, hf

LLAMA_3_1 = {
    "head_dim": 128,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
}


def write(tmp_path, config, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(config) if not isinstance(config, str) else config)
    return str(path)


def test_inspect_json(tmp_path, capsys):
    assert cli.main(["inspect", write(tmp_path, LLAMA_3_1), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert (r["rope_type"], r["head_dim"], r["rotary_dim"], r["base"]) == (
        "llama3",
        128,
        128,
        500000.0,
    )
    assert r["attention_factor"] == 1.0
    assert len(r["inv_freq"]) == len(r["wavelengths"]) == 64
    assert r["bands"].count("smoothed") == 6
    assert r["less_than_one_turn"] == list(range(35, 64))
    assert r["scale"][0] == 1.0 and r["scale"][-1] == pytest.approx(8.0)


def test_inspect_table(tmp_path, capsys):
    assert cli.main(["inspect", write(tmp_path, LLAMA_3_1)]) == 0
    out = capsys.readouterr().out
    assert "rope_type llama3" in out and "smoothed" in out
    assert "29 of 64 frequencies complete less than one turn" in out and "pairs 35-63" in out


def test_inspect_dynamic_depends_on_seq_len(tmp_path, capsys):
    config = {**LLAMA_3_1, "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}
    path = write(tmp_path, config)
    cli.main(["inspect", path, "--json"])
    short = json.loads(capsys.readouterr().out)["inv_freq"]
    cli.main(["inspect", path, "--json", "--seq-len", str(4 * 131072)])
    long = json.loads(capsys.readouterr().out)["inv_freq"]
    assert long[0] == short[0] and long[-1] < short[-1]


@pytest.mark.parametrize(
    "config,match",
    [
        ('{"rope_scaling": {"type": "yarn", "fac', "is not valid JSON"),
        (
            {
                **LLAMA_3_1,
                "rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 8},
            },
            r"\['factor'\] is missing",
        ),
        ({**LLAMA_3_1, "rope_scaling": {"rope_type": "wobble"}}, "known rope types"),
    ],
)
def test_inspect_errors_are_one_line(tmp_path, capsys, config, match):
    assert cli.main(["inspect", write(tmp_path, config)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "posemb inspect: error:" in err
    assert re.search(match, err)


def test_inspect_missing_file(tmp_path, capsys):
    assert cli.main(["inspect", str(tmp_path / "none.json")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_the_command_prints_the_library_report(tmp_path, capsys):
    # The command only parses and prints: its JSON and text are hf.inspect_report's, then
    # (unless --no-transformers) the comparison with transformers, hf.transformers_differs'.
    path = write(tmp_path, LLAMA_3_1)
    report = hf.inspect_report(LLAMA_3_1, seq_len=9000)
    argv = ["inspect", path, "--seq-len", "9000", "--no-transformers"]
    assert cli.main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(report))
    assert cli.main(argv) == 0
    assert capsys.readouterr().out == hf.format_inspect(report) + "\n"
    pytest.importorskip("transformers")
    check = hf.transformers_differs(LLAMA_3_1)
    assert cli.main(argv[:-1]) == 0
    want = hf.format_inspect(report) + "\n" + hf.format_differs(check) + "\n"
    assert capsys.readouterr().out == want
    assert cli.main([*argv[:-1], "--json"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert both == {**json.loads(json.dumps(report)), "transformers_check": check["summary"],
                    "transformers_differs": check["differs"]}  # fmt: skip


def test_report_checks_seq_len():
    with pytest.raises(ValueError, match="seq_len must be a positive integer, got 0"):
        hf.inspect_report(LLAMA_3_1, seq_len=0)


def test_report_of_a_per_layer_type_config():
    config = {
        "head_dim": 16,
        "num_attention_heads": 2,
        "max_position_embeddings": 64,
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    }
    full = hf.inspect_report(config, layer_type="full_attention")
    local = hf.inspect_report(config, layer_type="sliding_attention")
    assert full["scale"] == pytest.approx([8.0] * 8) and local["scale"] == [1.0] * 8
    assert "pairs 2-7" in hf.format_inspect(full)  # base 1e6: 2*pi*1e6^(2i/16) > 64 from i = 2
    with pytest.raises(ValueError, match="pass layer_type"):
        hf.inspect_report(config)


# --- published configs with layer kinds, temperatures, multimodal RoPE, strictness -----------

DATA = pathlib.Path(__file__).parent / "data" / "hf_configs"


def test_inspect_prints_every_layer_type(capsys):
    assert cli.main(["inspect", str(DATA / "llama4__llama-4-scout-17b-16e-instruct.json")]) == 0
    out = capsys.readouterr().out
    assert "=== layer type rope (36 layers) ===" in out
    assert "=== layer type nope (12 layers) ===" in out
    assert "query temperature 1 + 0.1 * ln(1 + floor((p + 1) / 8192))" in out
    assert "layout INTERLEAVED" in out


def test_inspect_json_per_layer_type_and_mrope_axes(capsys):
    path = str(DATA / "qwen3_5__qwen3.5-9b.json")
    assert cli.main(["inspect", path, "--json"]) == 0
    model = json.loads(capsys.readouterr().out)
    assert model["layer_types"]["linear_attention"]["rope"] is None
    full = model["layer_types"]["full_attention"]
    assert full["rotary_dim"] == 64 and "cycle temporal, height, width" in full["mrope"]
    assert cli.main(["inspect", path, "--layer-type", "full_attention", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mrope"] == full["mrope"]
    chunked = str(DATA / "qwen2_5_vl__qwen2.5-vl-7b-instruct.json")
    assert cli.main(["inspect", chunked, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mrope"] == (
        "pairs 0-15 temporal, 16-39 height, 40-63 width"
    )


def test_inspect_notes_what_changes_nothing(tmp_path, capsys):
    config = json.loads((DATA / "deepseek_v3__deepseek-v3.json").read_text())
    config["rope_scaling"].pop("mscale_all_dim")
    assert cli.main(["inspect", write(tmp_path, config)]) == 0
    out = capsys.readouterr().out
    assert "note: mscale without mscale_all_dim changes nothing" in out


def test_misspelled_rope_key_is_refused_and_lenient_warns(tmp_path, capsys):
    config = json.loads((DATA / "deepseek_v3__deepseek-v3.json").read_text())
    config["rope_scaling"]["beta_fst"] = config["rope_scaling"].pop("beta_fast")
    path = write(tmp_path, config)
    assert cli.main(["inspect", path]) == 2
    err = capsys.readouterr().err
    assert "rope_scaling['beta_fst'] is not read by rope_type 'yarn'" in err
    assert "did you mean 'beta_fast'?" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    with pytest.warns(UserWarning, match="ignored keys not read by rope_type 'yarn': beta_fst"):
        assert cli.main(["inspect", path, "--lenient"]) == 0
    assert "ignored keys (lenient): beta_fst" in capsys.readouterr().out


def test_a_factor_on_a_default_rope_is_refused():
    with pytest.raises(ValueError, match=r"\['factor'\] is not read by rope_type 'default'"):
        hf.rope_spec({"head_dim": 64, "rope_theta": 1e4, "rope_scaling": {"factor": 2.0}})


def test_sparse_config_without_transformers_names_key_and_model_type(monkeypatch):
    import builtins

    config = json.loads((DATA / "gemma3__gemma-3-4b-it.json").read_text())
    real_import = builtins.__import__

    def no_transformers(name, *args, **kwargs):
        if name == "transformers" or name.startswith("transformers."):
            raise ModuleNotFoundError("No module named 'transformers'", name="transformers")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_transformers)
    # A missing optional dependency is an ImportError naming the extra, not bad input.
    with pytest.raises(ImportError, match="model_type 'gemma3_text' does not set 'layer_types'"):
        hf.model_rope(config)
    layers = config["text_config"]["num_hidden_layers"]
    config["text_config"] |= {"layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 6}
    config["text_config"]["layer_types"] = config["text_config"]["layer_types"][:layers]
    with pytest.raises(ImportError, match="does not set 'rope_local_base_freq'"):
        hf.model_rope(config)
    config["text_config"]["rope_local_base_freq"] = 1e4
    # Gemma 3's class has a head_dim of its own (256), not hidden_size / num_attention_heads.
    with pytest.raises(ImportError, match="does not set 'head_dim'"):
        hf.model_rope(config)
    config["text_config"]["head_dim"] = 256
    with pytest.raises(ImportError, match="model_type 'gemma3_text' does not set 'rope_theta'"):
        hf.model_rope(config)
    config["text_config"]["rope_theta"] = 1e6
    assert hf.model_rope(config).kind("sliding_attention").spec.base == 1e4
