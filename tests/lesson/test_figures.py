import itertools
import json

import pytest
import torch
from json_nodes import walk

from posemb.lesson import figures

F64 = torch.float64


@pytest.fixture(scope="module")
def built(built_figures):
    return built_figures


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
            assert set(f.static_svg) == {f.default_key}, f.id
            assert all(s.startswith("<svg") for s in f.static_svg.values())


def test_every_vega_state_renders(built):
    """The page renders one state of a chart at build time and the rest in the browser; every
    state must be a spec Vega renders."""
    import concurrent.futures

    import vl_convert

    specs = [s for f in built if f.kind == "vega" for s in f.states.values()]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        svgs = list(pool.map(vl_convert.vegalite_to_svg, specs))
    assert len(svgs) > 60 and all(s.startswith("<svg") for s in svgs)


def test_vega_specs_inline_their_data_with_sizes_and_hover_values(built):
    for f in (f for f in built if f.kind == "vega"):
        for spec in f.states.values():
            assert isinstance(spec, dict) and "vega-lite" in spec["$schema"]
            nodes = list(walk(spec))
            assert not any(n.get("name") == figures.ROWS.name for n in nodes), f.id
            assert any("values" in n for n in nodes), f.id
            assert any("width" in n for n in nodes) and any("height" in n for n in nodes)
            marks = [n.get("mark") for n in nodes if "mark" in n]
            kinds = {m["type"] if isinstance(m, dict) else m for m in marks}
            if kinds & {"rect", "point"}:  # heatmaps and scatters: hover values
                assert any("tooltip" in n.get("encoding", {}) for n in nodes), f.id


def test_the_page_data_is_small(built):
    """What the page carries for its figures: every state, and each chart's first state
    rendered."""
    total = sum(
        len(json.dumps(f.states)) + sum(len(s) for s in f.static_svg.values()) for f in built
    )
    assert total < 2_500_000, total


def test_unknown_figure_and_bad_controls_are_refused():
    with pytest.raises(ValueError, match="unknown figure"):
        figures.build_figure("fig-nope")
    with pytest.raises(ValueError, match="kind"):
        figures.Control("c", "c", "knob", ("a",), 0)
    with pytest.raises(ValueError, match="default"):
        figures.Control("c", "c", "slider", ("a",), 1)


def test_the_learner_pictures_are_drawn(built):
    """The bridge from sinusoids to RoPE, the jersey and the watch, where RoPE acts, and the
    decay figure are on the page, each on its screen."""
    screen_of = {f.id: f.screen for f in built}
    assert screen_of["fig-shift-is-rotation"] == 6
    assert screen_of["fig-jersey-vs-watch"] == 3
    assert screen_of["fig-where-rope-acts"] == 7 and screen_of["fig-rope-decay"] == 7
    # The scalings come after pairs and frequencies are explained (screens 5 and 6).
    assert screen_of["fig-scaling"] == 7


def test_a_control_cannot_take_the_id_of_its_figures_view():
    from posemb.lesson.registry import Control, make_figure

    with pytest.raises(ValueError, match="not fig-x-view"):
        make_figure(
            "fig-x", 1, "t", "text", "call", "alt", kind="vega",
            draw=lambda v: ({}, v),
            controls=[Control("fig-x-view", "which", "toggle", ("a", "b"), 0)],
        )  # fmt: skip


def test_the_old_palette_name_still_works_with_a_warning():
    from posemb.lesson import charts

    with pytest.warns(DeprecationWarning, match="OKABE_ITO is renamed"):
        assert charts.OKABE_ITO == charts.INK


def _line_views(node):
    """Every view of a spec drawn as lines: (its mark as a dict, its encoding)."""
    if isinstance(node, dict):
        mark = node.get("mark")
        mark = {"type": mark} if isinstance(mark, str) else (mark or {})
        if mark.get("type") == "line":
            yield mark, node.get("encoding", {})
        for key, value in node.items():
            if key not in ("data", "datasets"):
                yield from _line_views(value)
    elif isinstance(node, list):
        for value in node:
            yield from _line_views(value)


def test_lines_of_several_series_differ_in_dash_too_and_their_legend_shows_it(built):
    """WCAG 1.4.1: where colour tells a chart's lines apart, a dash pattern on the same field
    does too, and the legend of lines with points draws line symbols (Vega-Lite would draw
    filled circles, which show the colour alone)."""
    checked = set()
    for fig in built:
        if fig.kind != "vega":
            continue
        for spec in fig.states.values():
            for mark, enc in _line_views(spec):
                color = enc.get("color", {})
                if not color.get("field") or color.get("type") != "nominal":
                    continue
                dash = enc.get("strokeDash", {})
                assert dash.get("field") == color["field"], fig.id
                legend = color.get("legend", {})
                if mark.get("point") and legend is not None:
                    assert legend.get("symbolType") == "stroke", (fig.id, legend)
                checked.add(fig.id)
    assert {"fig-norms", "fig-waves", "fig-rope-decay", "fig-lab-loss"} <= checked, checked
