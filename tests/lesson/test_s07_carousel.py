"""Screen 7: the carousel; the logit's offset, its sign, decay as a bound, scaling."""

import torch

import posemb
from posemb.lesson.registry import state_key
from posemb.lesson.screens import s07_carousel as s07
from posemb.rope import RotaryEmbedding


class _PositionBlindRope(RotaryEmbedding):
    def rotate(self, x, positions=None, inplace=False):
        return super().rotate(x, torch.zeros_like(positions))


class _DecayingRope(RotaryEmbedding):
    """A "RoPE" whose output shrinks with position: logits now do decay."""

    def rotate(self, x, positions=None, inplace=False):
        return super().rotate(x, positions) * torch.exp(-positions.to(x.dtype) / 500)[:, None]


def test_the_decay_claim_fails_when_rotation_shrinks_vectors(broken):
    assert not broken("rope.no_decay_for_random_vectors", "RotaryEmbedding", _DecayingRope)


def test_the_sign_claim_fails_without_positions(broken):
    assert not broken("rope.logit_tells_before_from_after", "RotaryEmbedding", _PositionBlindRope)


def test_the_scaling_claim_fails_when_yarn_restores_everything(broken, fake_lab):
    flat = fake_lab(yarn_flat=True)
    assert not broken("rope.scaling_alone_is_partial", "lab_summary", lambda: flat)


def test_the_scaling_figure_shows_what_posemb_computes(by_id):
    yarn = posemb.scaling.Yarn(8.0, s07.SCALING_LEN).effective_attention_factor()
    assert by_id["fig-scaling"].readouts["8"].endswith(f"{yarn:.4f}")


def test_the_decay_figure_draws_the_claims_measurement(by_id, claim_of):
    measured = claim_of("rope.no_decay_for_random_vectors").run()["value"]
    curves = s07.decay_curves((0, 1, 10, 100, 1000, 10_000))
    assert list(curves[s07.DECAY_CURVES[0]].values()) == measured["rms"]
    assert list(curves[s07.DECAY_CURVES[2]].values()) == measured["bound"]
    rows = by_id["fig-rope-decay"].states[""]["data"]["values"]
    assert {r["curve"] for r in rows} == set(s07.DECAY_CURVES)


def test_where_rope_acts_measures_the_shift(by_id):
    fig = by_id["fig-where-rope-acts"]
    rope_mode, absolute_mode = s07.WHERE_MODES
    assert "float64 rounding" in fig.readouts[rope_mode]
    assert "float64 rounding" not in fig.readouts[absolute_mode]
    assert "R_m q" in fig.states[rope_mode] and "R_m q" not in fig.states[absolute_mode]


def test_the_drift_figure_shows_rerotation_below_composed_tables(by_id):
    rows = by_id["fig-rerotate-drift"].states[""]["data"]["values"]
    ours, composed = s07.DRIFT_METHODS
    last = {r["method"]: r["error"] for r in rows if r["shifts"] == s07.DRIFT_SHIFTS}
    assert last[ours] < last[composed] / 2, last
    first = {r["method"]: r["error"] for r in rows if r["shifts"] == s07.DRIFT_EVERY}
    assert last[composed] > 5 * first[composed]  # the composed tables keep drifting


def _defined(method: str, i: int, j: int, W: int, G: int) -> float:
    from extension_definitions import dca_distance, rerope_distance, selfextend_distance

    if method == "Self-Extend":
        return selfextend_distance(i, j, G, W)
    if method == "ReRoPE":
        return rerope_distance(i, j, W, float(G))
    if method == "Dual Chunk":
        return dca_distance(i, j, G * W, W)
    return i - j


def test_the_extension_figure_draws_the_definitions(by_id):
    """Each state's distances are the issue's formulas, not posemb's code; plain RoPE is i - j."""
    fig = by_id["fig-extension-distances"]
    for method in s07.EXTENSION_METHODS:
        for w in s07.EXTENSION_WINDOWS:
            for g in s07.EXTENSION_GROUPS:
                rows = fig.states[state_key((method, w, g))]["data"]["values"]
                assert len(rows) == s07.EXTENSION_LEN * (s07.EXTENSION_LEN + 1) // 2
                for r in rows:
                    want = _defined(method, r["i"], r["j"], int(w), int(g))
                    assert abs(r["distance"] - want) < 1e-9, (method, w, g, r)
    readout = fig.readouts[state_key(("Self-Extend", "8", "4"))]
    assert "the longest distance any pair meets is 11 " in readout  # 23 // 4 + 8 - 8 // 4
