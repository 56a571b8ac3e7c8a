import copy
import itertools
import json
import math

import pytest
import torch

import posemb
from posemb.lesson import claims, figures

F64 = torch.float64


@pytest.fixture(scope="module")
def built():
    return figures.build_figures()


def _walk(node):
    """Every dict inside a JSON-like value."""
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def test_every_figure_is_described_and_names_its_call(built):
    ids = [f.id for f in built]
    assert len(ids) == len(set(ids)) and set(ids) == set(figures.BUILDERS)
    for f in built:
        assert f.id.startswith("fig-") and f.title and f.alt and f.call
        assert f.caption.endswith(f.call), f.id
        assert "posemb" in f.call, f.id
        assert f.kind in ("vega", "svg")
    assert {f.screen for f in built} == set(range(1, 10))
    assert [f.screen for f in built] == sorted(f.screen for f in built)


def test_every_state_has_content_and_a_readout(built):
    control_ids = [c.id for f in built for c in f.controls]
    assert len(control_ids) == len(set(control_ids))
    for f in built:
        keys = {figures.state_key(v) for v in itertools.product(*(c.values for c in f.controls))}
        assert set(f.states) == keys == set(f.readouts), f.id
        assert f.default_key in f.states
        assert len(f.states) <= 60, f.id
        for c in f.controls:
            assert c.kind in ("slider", "toggle") and 0 <= c.default < len(c.values)
            assert len(set(c.values)) == len(c.values) and all("|" not in v for v in c.values)
        assert all(r.strip() for r in f.readouts.values()), f.id
        if f.kind == "svg":
            assert f.static_svg == {}
            for svg in f.states.values():
                assert isinstance(svg, str) and svg.startswith("<svg")
                assert 'role="img"' in svg and "<title>" in svg
        else:
            assert set(f.static_svg) == keys, f.id
            assert all(s.startswith("<svg") for s in f.static_svg.values())


def test_vega_specs_inline_their_data_with_sizes_and_hover_values(built):
    for f in (f for f in built if f.kind == "vega"):
        for spec in f.states.values():
            assert isinstance(spec, dict) and "vega-lite" in spec["$schema"]
            nodes = list(_walk(spec))
            assert not any(n.get("name") == figures.ROWS.name for n in nodes), f.id
            assert any("values" in n for n in nodes), f.id
            assert any("width" in n for n in nodes) and any("height" in n for n in nodes)
            marks = [n.get("mark") for n in nodes if "mark" in n]
            kinds = {m["type"] if isinstance(m, dict) else m for m in marks}
            if kinds & {"rect", "point"}:  # heatmaps and scatters: hover values
                assert any("tooltip" in n.get("encoding", {}) for n in nodes), f.id


def test_the_page_data_is_small(built):
    total = sum(
        len(json.dumps(f.states)) + sum(len(s) for s in f.static_svg.values()) for f in built
    )
    assert total < 3_000_000, total  # aim: < 2.5 MB


def test_readouts_are_what_posemb_computes(built):
    by_id = {f.id: f for f in built}
    # RoPE dials: the logit of the rotated 2D query and key.
    q = torch.randn(2, generator=torch.Generator().manual_seed(41), dtype=F64)
    k = q
    theta = torch.tensor([math.pi / 4], dtype=F64)
    for m, n in ((5, 2), (6, 3), (0, 6)):
        logit = float(
            (posemb.rotation_matrix(m, theta) @ q) @ (posemb.rotation_matrix(n, theta) @ k)
        )
        assert by_id["fig-dials-mn"].readouts[f"{m}|{n}"].endswith(f"= {logit:.6f}")
    # Shifting both keeps the logit: the readouts of (5, 2) and (6, 3) agree.
    a, b = (by_id["fig-dials-mn"].readouts[s].split("= ")[-1] for s in ("5|2", "6|3"))
    assert a == b
    lam = posemb.wavelengths(768)
    assert f"{float(lam[0]):.6f}" in by_id["fig-periods"].readouts[""]
    assert f"{float(lam[-1]):,.1f}" in by_id["fig-periods"].readouts[""]
    yarn = posemb.scaling.Yarn(8.0, figures.SCALING_LEN).effective_attention_factor()
    assert by_id["fig-scaling"].readouts["8"].endswith(f"{yarn:.4f}")
    std = float(claims.random_cosines(32, 500).std())
    assert f"{std:.4f}" in by_id["fig-random-cosines"].readouts["32"]
    outs = claims.dog_bites_man_outputs()
    for label, name in figures.ENCODING_NAMES.items():
        assert f"{claims.word_change(*outs[name]):.3g}" in by_id["fig-blender"].readouts[label]
    r = posemb.rotation_matrix(3, posemb.inv_freq(16, dtype=F64), posemb.Layout.HALF)
    det = float(torch.linalg.det(r))
    assert f"{det:.6f}" in by_id["fig-givens"].readouts[f"{figures.LAYOUTS[0]}|3"]
    assert f"(error {abs(det - 1):.1e})" in by_id["fig-givens"].readouts[f"{figures.LAYOUTS[0]}|3"]
    assert (
        by_id["fig-toy-trace"]
        .readouts[figures.TRACE_STEPS[1]]
        .startswith("R_3 q = [-0.7071, 0.7071]")
    )
    # The learned table refuses past its last row, in posemb's own words.
    assert "ValueError" not in by_id["fig-learned-no-row"].readouts["31"]
    assert "learned table" in by_id["fig-learned-no-row"].readouts["32"]


def test_figures_follow_the_library_not_typed_numbers(monkeypatch):
    before = figures.build_figure("fig-periods")
    real = posemb.freqs.wavelengths
    monkeypatch.setattr(posemb.freqs, "wavelengths", lambda d, base=10000.0: real(d, base) * 2)
    after = figures.build_figure("fig-periods")
    assert before.states[""] != after.states[""]
    assert before.readouts[""] != after.readouts[""]
    assert f"{2 * 2 * math.pi:.6f}" in after.readouts[""]


def test_lab_figure_reads_the_summary_it_is_given():
    real = posemb.lab.report.default_summary()
    fake = copy.deepcopy(real)
    longest = str(fake["config"]["eval_lens"][-1])
    fake["results"]["rope"][longest]["past"]["mean"] = 9.875
    before = figures.build_figure("fig-lab-loss", real)
    after = figures.build_figure("fig-lab-loss", fake)
    assert "rope 9.875" in after.readouts[figures.LOSS_PARTS[0]]
    assert "rope 9.875" not in before.readouts[figures.LOSS_PARTS[0]]
    assert before.states != after.states


def test_retrieval_figure_reads_the_summary_it_is_given():
    real = posemb.lab.report.default_summary()
    fake = copy.deepcopy(real)
    longest = str(fake["config"]["eval_lens"][-1])
    far = list(fake["retrieval"]["by_distance"]["alibi"])[-1]
    fake["retrieval"]["variants"]["rope"][longest]["anywhere"]["mean"] = 0.625
    fake["retrieval"]["by_distance"]["alibi"][far]["mean"] = 0.875
    before = figures.build_figure("fig-lab-retrieval", real)
    after = figures.build_figure("fig-lab-retrieval", fake)
    by_length, by_distance = figures.RETRIEVAL_VIEWS
    assert "rope 0.62" in after.readouts[by_length]  # 0.625 rounds to even
    assert "alibi 0.88" in after.readouts[by_distance]
    assert after.readouts != before.readouts and after.states != before.states
    # Chance is the task's, read from the summary, in the readout and as a rule.
    assert f"chance {real['retrieval']['chance']:.3f}" in before.readouts[by_length]
    del fake["retrieval"]
    with pytest.raises(ValueError, match="no retrieval results"):
        figures.build_figure("fig-lab-retrieval", fake)


def test_trained_attention_is_the_models_own(built):
    fig = next(f for f in built if f.id == "fig-trained-attention")
    model = figures._trained_rope_encoder()
    tokens = torch.tensor(
        [[posemb.lab.dog_bites_man.VOCAB.index(w) for w in ("[CLS]", "dog", "bites", "man")]]
    )
    with torch.no_grad():
        w = model.attention_weights(tokens)[0, 0]
    rows = fig.states["dog bites man"]["data"]["values"]
    got = {(r["head"], r["i"], r["j"]): r["weight"] for r in rows}
    for (h, i, j), v in got.items():
        assert v == pytest.approx(float(w[int(h.split()[-1]), i, j]), rel=1e-3, abs=1e-6)
    assert len(got) == w.numel()


def test_unknown_figure_and_bad_controls_are_refused():
    with pytest.raises(ValueError, match="unknown figure"):
        figures.build_figure("fig-nope")
    with pytest.raises(ValueError, match="kind"):
        figures.Control("c", "c", "knob", ("a",), 0)
    with pytest.raises(ValueError, match="default"):
        figures.Control("c", "c", "slider", ("a",), 1)


def test_causal_figure_is_linear_and_says_whether_the_copies_agree(built):
    fig = next(f for f in built if f.id == "fig-causal-same-token")
    assert fig.readouts["no positions"].startswith("same weight at 1, 99, 599 back: yes")
    assert fig.readouts["RoPE"].startswith("same weight at 1, 99, 599 back: no")
    for spec in fig.states.values():
        assert not any(n.get("type") == "log" for n in _walk(spec))
        w = [r["w"] for r in spec["data"]["values"]]
        # Not saturated: every weight within a factor 10 of uniform attention over 600 keys.
        assert min(w) > 1 / 6000 and max(w) < 10 / 600


def _trained_row(value):
    return {"id": figures.TRAINED_CLAIM, "value": value}


def test_trained_accuracy_draws_the_verify_rows_it_is_given(built):
    default = next(f for f in built if f.id == "fig-trained-accuracy")
    assert default.readouts[""].startswith("not measured in this build")
    value = {"nope": [0.5, 0.5], "rope": [0.9375, 0.875], "bar": 0.7946}
    rows = [{"id": "something.else", "value": 1.0}, _trained_row(value)]
    fig = figures.build_figure("fig-trained-accuracy", claim_rows=rows)
    assert "nope 0.500, rope 0.906" in fig.readouts[""]
    assert "pass bar 0.795" in fig.readouts[""]
    drawn = fig.states[""]["data"]["values"]
    means = {r["encoding"]: r["acc"] for r in drawn if r["kind"] == "mean"}
    assert means == {"nope": 0.5, "rope": pytest.approx(0.90625, rel=1e-3)}
    assert sorted(r["acc"] for r in drawn if r["kind"] == "seed") == [0.5, 0.5, 0.875, 0.9375]
    # Rows from a run without this claim (posemb verify --only ...): not measured.
    other = figures.build_figure("fig-trained-accuracy", claim_rows=rows[:1])
    assert other.readouts[""].startswith("not measured in this build")


@pytest.mark.parametrize("value", [0.5, {"nope": [0.5]}, {"bar": 0.8}, {"nope": "x", "bar": 0.8}])
def test_trained_accuracy_refuses_a_row_that_is_not_the_claims(value):
    with pytest.raises(ValueError, match=figures.TRAINED_CLAIM):
        figures.build_figure("fig-trained-accuracy", claim_rows=[_trained_row(value)])
