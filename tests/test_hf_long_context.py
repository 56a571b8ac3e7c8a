"""Qwen2.5-1M's dual_chunk_attention_config, read as the Dual Chunk Attention it asks for."""

from __future__ import annotations

import json
import pathlib

import pytest

import posemb
from posemb import cli, hf

DATA = pathlib.Path(__file__).parent / "data" / "hf_configs"
# Qwen2.5-7B-Instruct-1M publishes Qwen2.5-7B's shapes with this key (issue 33 quotes it).
DCA = {"chunk_size": 262144, "local_size": 8192, "original_max_position_embeddings": 262144}


def _qwen_1m(**dca) -> dict:
    d = json.loads((DATA / "qwen2__qwen2.5-7b-instruct.json").read_text())
    d["dual_chunk_attention_config"] = {**DCA, **dca}
    return d


def test_the_published_key_is_dual_chunk_attention_and_inspect_says_so(tmp_path, capsys):
    method, notes = hf.extension_from_config(_qwen_1m())
    assert method == posemb.DualChunk(262144, 8192) and method.chunk_len == 253952
    assert "asks for Dual Chunk Attention" in notes[0] and "transformers does not" in notes[0]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_qwen_1m()))
    assert cli.main(["inspect", str(path), "--no-transformers"]) == 0
    assert "posemb.DualChunk(262144, 8192)" in capsys.readouterr().out


def test_a_config_without_it_asks_for_nothing_and_a_nested_one_is_found():
    plain = json.loads((DATA / "qwen2__qwen2.5-7b-instruct.json").read_text())
    assert hf.extension_from_config(plain) == (None, ())
    nested = {"model_type": "x", "text_config": {"dual_chunk_attention_config": DCA}}
    method, notes = hf.extension_from_config(nested)
    assert method == posemb.DualChunk(262144, 8192)
    assert notes[0].startswith("text_config.dual_chunk_attention_config asks for")


def test_the_serving_engines_keys_and_unknown_ones_are_named():
    _, notes = hf.extension_from_config(_qwen_1m(sparse_attention_enabled=True, chunk_sise=3))
    assert any("sparse_attention_enabled set the serving engine" in n for n in notes)
    assert any("chunk_sise not read" in n for n in notes)
    _, notes = hf.extension_from_config(_qwen_1m(original_max_position_embeddings=131072))
    assert any("is 131072, not chunk_size 262144" in n for n in notes)


@pytest.mark.parametrize(
    ("dca", "match"),
    [
        ([1, 2], r"dual_chunk_attention_config must be a JSON object"),
        ({"chunk_size": 8}, r"has no 'local_size'"),
        ({"chunk_size": 8, "local_size": 8}, r"local_size must be less than chunk_size \(8\)"),
        ({"chunk_size": "8", "local_size": 2}, r"chunk_size must be an integer >= 2, got '8'"),
    ],
)
def test_bad_values_are_refused_naming_the_key(dca, match):
    d = _qwen_1m()
    d["dual_chunk_attention_config"] = dca
    with pytest.raises(posemb.InputError, match=match):
        hf.extension_from_config(d)
