"""The published config.json files kept as test data are intact and each has its source."""

import json
import pathlib

import pytest

DATA = pathlib.Path(__file__).parent / "data" / "hf_configs"
FILES = sorted(DATA.glob("*.json"))


def test_every_config_has_a_recorded_source():
    sources = (DATA / "SOURCES.md").read_text(encoding="utf-8")
    assert len(FILES) >= 19
    missing = [f.name for f in FILES if f.name not in sources]
    assert not missing


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_config_is_a_published_model_config(path):
    config = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(config, dict) and config.get("model_type")
    assert path.name.startswith(config["model_type"].replace("-", "_") + "__")
