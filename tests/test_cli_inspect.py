"""`posemb inspect`."""

import json
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
    # The command only parses and prints: its JSON and text are hf.inspect_report's.
    path = write(tmp_path, LLAMA_3_1)
    report = hf.inspect_report(LLAMA_3_1, seq_len=9000)
    assert cli.main(["inspect", path, "--json", "--seq-len", "9000"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(report))
    assert cli.main(["inspect", path, "--seq-len", "9000"]) == 0
    assert capsys.readouterr().out == hf.format_inspect(report) + "\n"


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
