"""Screen 8: block-diagonal Givens rotations; periods, the three forms, the figures."""

import math

import pytest
import torch

import posemb
from posemb.lesson import figures
from posemb.lesson.screens import s08_block_diagonal as s08
from posemb.rope import apply_rope, rotation_matrix

F64 = torch.float64


def _twice_as_fast(x, cos, sin, layout="half"):
    """A rotation that turns every pair twice as fast: the periods must notice."""
    return apply_rope(x, cos * cos - sin * sin, 2 * sin * cos, layout)


@pytest.mark.parametrize("claim_id", ["rope.fastest_pair_period", "rope.slowest_pair_period"])
def test_the_period_claims_fail_on_a_rotation_twice_as_fast(broken, claim_id):
    assert not broken(claim_id, "apply_rope", _twice_as_fast)


def test_the_three_forms_claim_fails_when_the_matrix_defaults_to_the_other_pairing(broken):
    def other_default(m, theta, layout="interleaved"):
        return rotation_matrix(m, theta, layout)

    assert not broken("rope.three_forms_agree", "rotation_matrix", other_default)


def test_the_givens_and_period_figures_show_what_posemb_computes(by_id):
    r = posemb.rotation_matrix(3, posemb.inv_freq(16, dtype=F64), posemb.Layout.HALF)
    det = float(torch.linalg.det(r))
    readout = by_id["fig-givens"].readouts[f"{s08.LAYOUTS[0]}|3"]
    assert f"{det:.6f}" in readout and f"(error {abs(det - 1):.1e})" in readout
    for of, d in s08.PERIOD_TABLES.items():
        lam = posemb.wavelengths(d)
        readout = by_id["fig-periods"].readouts[of]
        assert readout.startswith(f"{d // 2} pairs")
        assert f"{float(lam[0]):.6f}" in readout and f"{float(lam[-1]):,.1f}" in readout


def test_figures_follow_the_library_not_typed_numbers(monkeypatch):
    before = figures.build_figure("fig-periods")
    real = posemb.freqs.wavelengths
    monkeypatch.setattr(posemb.freqs, "wavelengths", lambda d, base=10000.0: real(d, base) * 2)
    after = figures.build_figure("fig-periods")
    key = list(s08.PERIOD_TABLES)[-1]
    assert before.states[key] != after.states[key]
    assert before.readouts[key] != after.readouts[key]
    assert f"{2 * 2 * math.pi:.6f}" in after.readouts[key]


def _logit(a, b, rope):
    x = torch.ones(1, 1, 1, 32, dtype=F64) / math.sqrt(32)
    qa, _ = rope(x, x, torch.tensor([a], dtype=F64))
    kb, _ = rope(x, x, torch.tensor([b], dtype=F64))
    return float((qa * kb).sum())


def test_the_axial_grid_draws_posembs_axial_rope_and_the_flattened_contrast(by_id):
    fig = by_id["fig-axial-grid"]
    assert len(fig.states) == len(s08.GRID_QUERIES) * len(s08.GRID_VIEWS) == 6
    rope = posemb.AxialRotaryEmbedding(32, base=s08.GRID_BASE)
    last, first_next = (2, s08.GRID - 1), (3, 0)
    axial = fig.readouts[f"{s08.GRID_QUERIES[0]}|{s08.GRID_VIEWS[0]}"]
    assert "by 0.0e+00" in axial
    assert f"{_logit(last, first_next, rope):.3f}" in axial
    assert f"{_logit(last, (2, s08.GRID - 2), rope):.3f}" in axial
    assert _logit(last, first_next, rope) < _logit(last, (2, s08.GRID - 2), rope)  # "below"
    flat = fig.readouts[f"{s08.GRID_QUERIES[0]}|{s08.GRID_VIEWS[1]}"]
    assert "flattening made them neighbours" in flat
    for key, readout in fig.readouts.items():  # every query: the same map, offset for offset
        spread = float(readout.split(" by ")[1].split(";")[0].split(",")[0])
        assert spread < 1e-12, (key, readout)


def test_the_axial_grid_follows_the_library(monkeypatch):
    before = figures.build_figure("fig-axial-grid")

    def rows_only(self):  # every pair turned by the row: columns no longer count
        axis, freq = real(self)
        return torch.zeros_like(axis), freq

    real = posemb.AxialRotaryEmbedding.pair_axes
    monkeypatch.setattr(posemb.AxialRotaryEmbedding, "pair_axes", rows_only)
    after = figures.build_figure("fig-axial-grid")
    key = f"{s08.GRID_QUERIES[0]}|{s08.GRID_VIEWS[0]}"
    assert before.readouts[key] != after.readouts[key]
    assert before.states[key] != after.states[key]
