"""posemb inspect as a doctor: where the installed transformers reads a published config
differently from the file, or cannot read it, found by comparing frequencies (no rule per
case), explained from transformers' standardized rope parameters."""

from __future__ import annotations

import copy
import json
import pathlib
import sys

import pytest
import torch

from posemb import hf
from posemb.hf import doctor

hr = pytest.importorskip("hf_reference")  # transformers, quieted
transformers = pytest.importorskip("transformers")

DATA = pathlib.Path(__file__).parent / "data" / "hf_configs"
OLMO = "olmo3__olmo-3.1-32b-instruct.json"
PHI3_SU = "phi3__phi-3-vision-128k-instruct.json"


def _config(name: str, **changes) -> dict:
    d = json.loads((DATA / name).read_text())
    d.update(changes)
    return d


def test_olmo3_sliding_layers_get_500000_whatever_the_file_says():
    check = hf.transformers_differs(_config(OLMO, rope_theta=10000))
    assert check["transformers"] == transformers.__version__
    (row,) = check["differs"]
    assert row["layer_type"] == "sliding_attention" and row["key"] == "rope_theta"
    assert (row["config"], row["transformers"]) == (10000, 500000)
    assert "Olmo3RotaryEmbedding" in row["why"]
    # posemb keeps the file's value for those layers.
    rope = hf.model_rope(_config(OLMO, rope_theta=10000))
    assert rope.kind("sliding_attention").spec.base == 10000


def test_the_published_olmo3_config_agrees():
    """At the published 500,000 both readings coincide: nothing to report."""
    check = hf.transformers_differs(_config(OLMO))
    assert check["differs"] == [] and "reads every layer kind as the file says" in check["summary"]


def test_phi3_su_cannot_be_read_by_transformers_and_posemb_reads_it():
    check = hf.transformers_differs(_config(PHI3_SU))
    (row,) = check["differs"]
    assert (row["key"], row["config"], row["transformers"]) == (
        "rope_scaling.type", "su", "cannot read this config"
    )  # fmt: skip
    assert "KeyError" in row["why"] and "original_max_position_embeddings" in row["why"]
    assert check["summary"].endswith("cannot read this config")
    assert hf.model_rope(_config(PHI3_SU)).kinds[0].spec.rope_type == "longrope"


def test_across_the_published_configs_it_finds_exactly_the_misreadings_the_tests_work_around():
    """hf_reference.py lists what transformers 5.24 misreads, to compare with it at all
    (custom code stood in for, GLM-4.1V nested, Phi-3's "su" renamed): the doctor finds those
    and nothing else, with no rule of its own for any of them."""
    found = {}
    for path in sorted(DATA.glob("*.json")):
        d = json.loads(path.read_text())
        check = hf.transformers_differs(d)
        assert check["differs"] is not None, (path.name, check["summary"])
        if check["differs"]:
            found[path.name] = {r["key"] for r in check["differs"]}
    expected = {}
    for path in sorted(DATA.glob("*.json")):
        d = json.loads(path.read_text())
        scaling = d.get("rope_scaling") or {}
        if d["model_type"] in hr.STAND_INS:
            expected[path.name] = {"model_type"}
        elif d["model_type"] in hr.NESTED_FOR_TRANSFORMERS:
            expected[path.name] = {"rotary_dim"}
        elif (d["model_type"], scaling.get("type")) in hr.RENAMED_FOR_TRANSFORMERS:
            expected[path.name] = {"rope_scaling.type"}
    assert found == expected


def test_patch_rotary_on_a_loaded_model_follows_the_models_config_not_the_file():
    """A tiny OLMo 3 built from the file with rope_theta 10000: transformers' model rotates its
    sliding layers at 500,000, and the patched model computes the same logits, so patching
    follows the model's own config object (transformers' reading), as the docs say."""
    from test_hf_patch_models import CASES, _tiny

    model = _tiny(OLMO, {**CASES[OLMO], "rope_theta": 10000})
    assert model.config.rope_parameters["sliding_attention"]["rope_theta"] == 500000
    ids = torch.randint(1, 128, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(ids).logits
        assert hf.patch_rotary(model)
        torch.testing.assert_close(model(ids).logits, want, rtol=1e-5, atol=1e-5)


def test_without_transformers_the_check_says_it_was_skipped(monkeypatch, tmp_path, capsys):
    from posemb import cli

    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    d = {"model_type": "llama", "head_dim": 64, "num_attention_heads": 4, "rope_theta": 1e4}
    check = hf.transformers_differs(d)
    assert check["differs"] is None and check["transformers"] is None
    assert check["summary"].startswith("check skipped: transformers is not installed")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(d))
    assert cli.main(["inspect", str(path)]) == 0
    assert "check skipped: transformers is not installed" in capsys.readouterr().out


def test_the_cli_section_and_json_name_the_layers_the_key_and_both_values(tmp_path, capsys):
    from posemb import cli

    path = tmp_path / "config.json"
    path.write_text(json.dumps(_config(OLMO, rope_theta=10000)))
    assert cli.main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    section = text.split("=== transformers reads this differently ===", 1)[1]
    assert "sliding_attention: rope_theta is 10000 in the file, 500000 in transformers" in section
    assert cli.main(["inspect", "--json", str(path)]) == 0
    report = json.loads(capsys.readouterr().out)
    (row,) = report["transformers_differs"]
    assert set(row) == {"layer_type", "key", "config", "transformers", "why"}
    assert report["transformers_check"].startswith(f"transformers {transformers.__version__}")
    # One layer type: only its rows; the full-attention layers agree.
    assert cli.main(["inspect", "--json", "--layer-type", "full_attention", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["transformers_differs"] == []
    assert cli.main(["inspect", "--json", "--no-transformers", str(path)]) == 0
    assert "transformers_differs" not in json.loads(capsys.readouterr().out)


def test_the_file_is_read_before_transformers_sees_it(tmp_path, capsys, monkeypatch):
    """A config posemb refuses (a head of 2^40 channels) never reaches transformers, whose
    rotary module would allocate it."""
    from posemb import cli

    called = []
    monkeypatch.setattr(doctor, "text_config", lambda d: called.append(d))
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_config(OLMO, hidden_size=1 << 40)))
    assert cli.main(["inspect", str(path)]) == 2
    assert called == [] and "hidden_size" in capsys.readouterr().err


def test_a_module_that_would_tabulate_gigabytes_is_not_built():
    """GPT-J's rotary module tabulates every position: at 2^24 it would hold 4 GiB. It is sized
    on the meta device first, and the check says why it stops; OLMo 3 at 2^30 positions keeps
    only its frequencies and is compared as usual."""
    gptj = _config("gptj__gpt-j-6b.json", n_positions=1 << 24)
    check = hf.transformers_differs(gptj)
    assert check["differs"] is None and "would hold 4.0 GiB" in check["summary"], check
    assert hf.transformers_differs(_config(OLMO, max_position_embeddings=1 << 30))["differs"] == []


def test_an_allocation_failure_is_a_failed_build_not_a_missing_module(monkeypatch):
    def fail(config):
        raise MemoryError("out of memory")

    monkeypatch.setattr(doctor, "frequencies", fail)
    check = hf.transformers_differs(_config(OLMO))
    assert "fails building its rotary module: MemoryError" in check["differs"][0]["why"]


def test_a_broken_transformers_install_is_a_skipped_check_not_a_traceback(monkeypatch, tmp_path):
    broken = tmp_path / "transformers"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise RuntimeError('built for another torch')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [n for n in sys.modules if n == "transformers" or n.startswith("transformers.")]:
        monkeypatch.delitem(sys.modules, name)
    check = hf.transformers_differs(_config(OLMO))
    assert check["differs"] is None
    assert (
        "transformers fails to import (RuntimeError: built for another torch)" in check["summary"]
    )


def test_one_layer_type_is_compared_and_summed_up_alone():
    d = _config(OLMO, rope_theta=10000)
    full = hf.transformers_differs(d, layer_type="full_attention")
    assert (
        full["differs"] == []
        and "reads layer kind full_attention as the file says" in (full["summary"])
    )
    sliding = hf.transformers_differs(d, layer_type="sliding_attention")
    assert len(sliding["differs"]) == 1 and "1 of 1 layer kind" in sliding["summary"]


def test_a_refusal_not_about_positions_is_laid_on_the_config_not_the_rope_type():
    check = hf.transformers_differs(_config("llama__llama-3.1-8b-instruct.json", vocab_size="x"))
    (row,) = check["differs"]
    assert row["key"] == "config" and "vocab_size" in row["why"]
    # Keys no rope formula reads are not handed over at all: a torch_dtype of 1e308 is fine.
    odd = _config("llama__llama-3.1-8b-instruct.json", torch_dtype=1e308)
    assert hf.transformers_differs(odd)["differs"] == []


def test_the_shared_reading_of_transformers_matches_its_module_built_directly():
    """hf.upstream serves the doctor and the tests' reference alike: pinned here against
    LlamaRotaryEmbedding built by hand, so a bug there cannot move both unseen."""
    from posemb.hf import upstream

    d = _config("llama__llama-3.1-8b-instruct.json")
    cfg = transformers.LlamaConfig(**{k: v for k, v in d.items() if k != "model_type"})
    module = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(config=cfg)
    name, got = upstream.frequencies(upstream.text_config(d))
    assert name == "LlamaRotaryEmbedding" and set(got) == {None}
    assert torch.equal(got[None][0], module.inv_freq.double())
    assert got[None][1] == module.attention_scaling


def test_a_transformers_config_object_is_refused():
    with pytest.raises(TypeError, match=r"config\.json dict"):
        hf.transformers_differs(transformers.LlamaConfig())


class _Params:
    def __init__(self, params: dict) -> None:
        self.rope_parameters = params


@pytest.mark.parametrize(
    ("theirs", "params", "key"),
    [
        ((torch.ones(4, dtype=torch.float64), 1.0), {"rope_theta": 10000.0}, "rotary_dim"),
        (None, {"rope_theta": 10000.0}, "attention_factor"),
        ("perturbed", {"rope_theta": 10000.0}, "inv_freq[3]"),
        ("perturbed", {"rope_theta": 20000.0}, "rope_theta"),
        ("perturbed", {"rope_theta": 10000.0, "rope_type": "linear"}, "rope_type"),
    ],
)
def test_a_difference_is_explained_by_the_first_key_that_differs(theirs, params, key):
    spec = hf.rope_spec({"head_dim": 16, "num_attention_heads": 2, "rope_theta": 10000.0})
    inv, factor = spec.scaling.compute(spec.rotary_dim, spec.base)
    inv = inv.double()
    if theirs is None:
        theirs = (inv.clone(), 2.0)
    elif theirs == "perturbed":
        other = inv.clone()
        other[3:] *= 1.01
        theirs = (other, factor)
    rows = doctor._compare(spec, None, _Params(params), {None: theirs}, "X")
    assert [r["key"] for r in rows] == [key]
    rounded = {None: (inv * (1 + 2e-7), factor)}
    same = doctor._compare(spec, None, _Params({"rope_theta": 10000.0}), rounded, "X")
    assert same == []  # float32 rounding is not a difference; a field that differs is


def test_a_base_moved_by_one_in_olmo3_is_named_on_its_sliding_layers():
    """Issue 56, bug 2: OLMo 3 with rope_theta 500001 (a fine-tune that moved its base):
    transformers gives the sliding layers 500000, whose frequencies differ from the file's by
    1.9e-6 relative, under the frequency check's tolerance; the doctor said "reads every layer
    kind as the file says". Fields are compared as values now."""
    check = hf.transformers_differs(_config(OLMO, rope_theta=500001))
    (row,) = check["differs"]
    assert (row["layer_type"], row["key"]) == ("sliding_attention", "rope_theta")
    assert (row["config"], row["transformers"]) == (500001, 500000)
    assert "reads 1 of 2 layer kind(s) differently" in check["summary"]


def test_the_summary_counts_layer_kinds_not_fields():
    """Two fields of one layer kind read differently are one kind in the summary (an attack:
    "reads 2 of 2" where only the sliding layers differ, "2 of 1" for one kind)."""
    config = _config(OLMO, rope_theta=10000, partial_rotary_factor=0.5)
    check = hf.transformers_differs(config)
    assert len(check["differs"]) >= 2
    assert {row["layer_type"] for row in check["differs"]} == {"sliding_attention"}
    assert "reads 1 of 2 layer kind(s) differently" in check["summary"]
    one = hf.transformers_differs(config, layer_type="sliding_attention")
    assert "reads 1 of 1 layer kind(s) differently" in one["summary"]


_MUTATIONS = {
    "rope_theta": lambda v: v * 1.25,
    "factor": lambda v: v * 1.5,
    "original_max_position_embeddings": lambda v: v * 2,
    "partial_rotary_factor": lambda v: v / 2,
}


def _mutated(d: dict, key: str) -> dict | None:
    """The config with ``key`` changed wherever the file holds it, or None."""
    d = copy.deepcopy(d)
    done = False
    for holder in (d, d.get("text_config") or {}, d.get("rope_scaling") or {},
                   d.get("rope_parameters") or {}):  # fmt: skip
        if (
            isinstance(holder, dict)
            and isinstance(holder.get(key), int | float)
            and not (isinstance(holder.get(key), bool))
        ):
            holder[key] = _MUTATIONS[key](holder[key])
            done = True
    return d if done else None


@pytest.mark.parametrize("key", sorted(_MUTATIONS))
def test_every_mutated_field_is_reported_exactly_where_the_frequencies_disagree(key):
    """For each published config and each RoPE field it holds, changed visibly (far past
    float32's rounding): the doctor reports a layer kind exactly where transformers' own
    rotary module computes other frequencies (or attention factor) than the file means, and
    names a field whenever one explains it."""
    compared = 0
    for path in sorted(DATA.glob("*.json")):
        d = json.loads(path.read_text())
        if d["model_type"] in hr.STAND_INS or d["model_type"] in hr.NESTED_FOR_TRANSFORMERS:
            continue  # transformers cannot compare these at all (test above)
        scaling = d.get("rope_scaling") or {}
        if (d["model_type"], scaling.get("type")) in hr.RENAMED_FOR_TRANSFORMERS:
            continue
        mutated = _mutated(d, key)
        if mutated is None:
            continue
        try:
            m = hf.model_rope(mutated)
        except ValueError:
            continue  # posemb refuses the mutated file (a factor below 1, say): no reading
        check = hf.transformers_differs(mutated)
        if check["differs"] is None:
            continue
        reported = {r["layer_type"] for r in check["differs"]}
        tf = doctor.text_config({k: v for k, v in mutated.items() if not k.startswith("__")})
        _, theirs = doctor.frequencies(tf)
        disagree = set()
        for kind in m.kinds:
            if kind.spec is None:
                continue
            name = kind.layer_type if m.per_layer_type else None
            got = theirs.get(name, theirs.get(None))
            if got is None:
                continue
            inv, factor = kind.spec.scaling.compute(kind.spec.rotary_dim, kind.spec.base)
            t_inv, t_factor = got
            if t_inv.shape != inv.shape or not torch.allclose(
                t_inv, inv.double(), rtol=1e-4, atol=0.0
            ) or abs(t_factor - factor) > 1e-4 * abs(factor):  # fmt: skip
                disagree.add(name)
        assert reported == disagree, (path.name, key, check["differs"])
        compared += 1
    assert compared >= 2, f"only {compared} published configs hold {key}"


def test_the_checked_dict_is_not_changed():
    d = _config(OLMO, rope_theta=10000)
    before = copy.deepcopy(d)
    hf.transformers_differs(d)
    assert d == before
