"""`posemb verify`: every claim holds, names its screen, and can fail for its stated reason."""

import json
import math
import subprocess
import sys

import pytest
import torch

from posemb import cli
from posemb.lesson import claims


@pytest.fixture(scope="module")
def rows(claim_rows):
    return claim_rows


def test_every_claim_holds_as_measured(rows):
    failed = [(r["id"], r["measured"]) for r in rows if not r["passed"]]
    assert not failed


def test_every_screen_has_a_claim_and_every_claim_a_screen(rows):
    assert set(claims.SCREENS) == set(range(1, 10))
    assert {r["screen"] for r in rows} == set(claims.SCREENS)
    assert [r["screen"] for r in rows] == sorted(r["screen"] for r in rows)
    ids = [c.id for c in claims.CLAIMS]
    assert len(ids) == len(set(ids))


def test_a_correction_quotes_the_lesson():
    with pytest.raises(ValueError, match="quotes it"):
        claims.Claim("x.y", 1, "text", lambda: claims.Result(True, "", 0.0), verdict="wrong")
    with pytest.raises(ValueError, match=r"screen must be 1\.\.9"):
        claims.Claim("x.y", 10, "text", lambda: claims.Result(True, "", 0.0))
    with pytest.raises(ValueError, match="registered twice"):
        claims.claim("rope.toy_trace", 5, "again")(lambda: claims.Result(True, "", 0.0))


def _by_id(claim_id):
    return next(c for c in claims.CLAIMS if c.id == claim_id)


def _wrong_rope(x, cos, sin, layout="half"):
    """A rotation that turns every pair twice as fast: the periods must notice."""
    from posemb.rope import apply_rope

    return apply_rope(x, cos * cos - sin * sin, 2 * sin * cos, layout)


def _fake_lab(rope_flat=False, sinusoidal_flat=False, yarn_flat=False):
    """A lab summary in the shipped form, with chosen curves."""
    real = _real_lab()

    def cells(within, past):
        out = {str(real["config"]["train_len"]): {"all": {"mean": within, "std": 0.0, "n": 2}}}
        for n in real["config"]["eval_lens"][1:]:
            out[str(n)] = {"all": {"mean": past, "std": 0.0}, "past": {"mean": past, "std": 0.0}}
        return out

    fake = dict(real)
    fake["results"] = dict(real["results"])
    if rope_flat:
        fake["results"]["rope"] = cells(1.6, 1.6)
    if sinusoidal_flat:
        fake["results"]["sinusoidal"] = cells(1.7, 1.7)
    if yarn_flat:  # scaling that restores the within-length loss everywhere
        within = real["results"]["rope"][str(real["config"]["train_len"])]["all"]["mean"]
        fake["results"]["rope+yarn"] = cells(within, within)
    return fake


# The real functions, captured before any test patches them.
_real_lab = claims._lab
_table, _wavelengths, _counts, _probs, _inv_freq = (
    claims.sinusoidal_table,
    claims.wavelengths,
    claims.param_counts,
    claims.attention_probs,
    claims.inv_freq,
)
_dpa, _rotation_matrix = claims.dot_product_attention, claims.rotation_matrix


def _recency_probs(q, k, causal):
    """Attention that prefers recent keys: the same key no longer gets the same weight."""
    recency = torch.arange(k.shape[2], dtype=q.dtype) * 0.01
    return _probs(q, k, causal=causal, bias=recency)


# Each fault breaks exactly what its claim is about; the claim must then fail.
FAULTS = [
    ("rope.fastest_pair_period", "apply_rope", _wrong_rope),
    ("rope.slowest_pair_period", "apply_rope", _wrong_rope),
    (
        "sinusoidal.constant_norm",
        "sinusoidal_table",
        lambda p, d, **kw: _table(p, d, **kw) * (1 + p[:, None] % 2),
    ),
    ("sinusoidal.wavelengths_768", "wavelengths", lambda d: _wavelengths(d, 10001.0)),
    ("rope.no_learnable_parameters", "param_counts", lambda: {**_counts(), "rope": 1}),
    (
        "absolute.parameter_counts",
        "param_counts",
        lambda: {**_counts(), "sinusoidal": _counts()["nope"] + 768},
    ),
    ("rope.extrapolation_is_not_native", "_lab", lambda: _fake_lab(rope_flat=True)),
    ("rope.norm_kept_but_not_seamless", "_lab", lambda: _fake_lab(rope_flat=True)),
    ("rope.scaling_alone_is_partial", "_lab", lambda: _fake_lab(yarn_flat=True)),
    # Frequencies over the model width instead of the head: 384 pairs again.
    (
        "rope.pairs_per_head",
        "inv_freq",
        lambda dim, base=10000.0, **kw: _inv_freq(768, base, **kw),
    ),
    ("sinusoidal.extrapolation_is_not_enabled", "_lab", lambda: _fake_lab(sinusoidal_flat=True)),
    # A "RoPE" whose output shrinks with position: logits now do decay.
    ("rope.no_decay_for_random_vectors", "RotaryEmbedding", lambda d: _DecayingRope(d)),
    ("attention.causal_same_key_same_weight", "attention_probs", _recency_probs),
    # An attention that ignores the mask's count: every position sees the same average.
    (
        "attention.causal_mask_leaks_position",
        "dot_product_attention",
        lambda q, k, v, causal: _dpa(q, k, v, causal=False),
    ),
    ("rope.logit_tells_before_from_after", "RotaryEmbedding", lambda d: _PositionBlindRope(d)),
    # rotation_matrix defaulting to the other pairing than apply_rope and rope_complex.
    (
        "rope.three_forms_agree",
        "rotation_matrix",
        lambda m, theta, layout="interleaved": _rotation_matrix(m, theta, layout),
    ),
]


class _PositionBlindRope(claims.RotaryEmbedding):
    def rotate(self, x, positions=None, inplace=False):
        return super().rotate(x, torch.zeros_like(positions))


def _all_rows_learned(self, x, positions=None):
    """A learned table that mixes every row into every position: all rows get gradient."""
    return _learned_forward(self, x, positions) + self.weight.mean(0)


_learned_forward = None


class _DecayingRope(claims.RotaryEmbedding):
    def rotate(self, x, positions=None, inplace=False):
        return super().rotate(x, positions) * torch.exp(-positions.to(x.dtype) / 500)[:, None]


@pytest.mark.parametrize("claim_id,name,fault", FAULTS, ids=[f[0] for f in FAULTS])
def test_each_claim_fails_when_what_it_claims_is_broken(monkeypatch, claim_id, name, fault):
    assert _by_id(claim_id).run()["passed"]
    monkeypatch.setattr(claims, name, fault)
    assert not _by_id(claim_id).run()["passed"]


def test_learned_rows_claim_fails_when_every_row_is_trained(monkeypatch):
    from posemb.absolute import LearnedEmbedding

    global _learned_forward
    _learned_forward = LearnedEmbedding.forward
    claim = _by_id("absolute.learned_rows_past_training_are_untrained")
    assert claim.run()["passed"]
    monkeypatch.setattr(LearnedEmbedding, "forward", _all_rows_learned)
    assert not claim.run()["passed"]


def test_memorisation_claim_fails_without_a_drop(monkeypatch):
    from posemb.lab import dog_bites_man as dbm

    claim = _by_id("attention.dog_bites_man.small_task_memorises")
    real = dbm.memorisation(seeds=claims.SMALL_TASK_SEEDS)
    assert claim.run()["passed"]
    big = dbm.accuracy_over_seeds()
    no_drop = {**real, "alibi": {"train": real["alibi"]["train"], "held_out": big["alibi"] * 4}}
    monkeypatch.setattr(dbm, "memorisation", lambda *a, **k: no_drop)
    assert not claim.run()["passed"]
    t5_drops = {**real, "t5": {"train": real["t5"]["train"], "held_out": [0.8] * 10}}
    monkeypatch.setattr(dbm, "memorisation", lambda *a, **k: t5_drops)
    assert not claim.run()["passed"]


def test_dog_bites_man_claims_fail_on_a_weak_encoding(monkeypatch):
    from posemb.lab import dog_bites_man as dbm

    real = dbm.accuracy_over_seeds()
    weak = {**real, "alibi": [0.55, 0.6, 0.58]}
    monkeypatch.setattr(dbm, "accuracy_over_seeds", lambda *a, **k: weak)
    assert not _by_id("attention.dog_bites_man.trained").run()["passed"]
    leaky = {**real, "nope": [0.5, 0.52, 0.5]}
    monkeypatch.setattr(dbm, "accuracy_over_seeds", lambda *a, **k: leaky)
    assert not _by_id("attention.dog_bites_man.trained").run()["passed"]


def test_bar_for_above_chance_is_five_standard_errors_of_independent_answers():
    assert claims._above_chance(100) == pytest.approx(0.75)
    # 288 held-out sentences are 72 ordered pairs asked with 4 verbs each.
    assert claims._independent_answers(288) == 72
    assert claims._above_chance(72) == pytest.approx(0.5 + 2.5 / math.sqrt(72))


def test_verify_json(capsys):
    assert cli.main(["verify", "--json", "--only", "rope.fastest_pair_period"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["verdict"] == "wrong" and row["screen"] == 8
    assert "6.2832" in row["measured"] and "114.6 degrees" in row["measured"]


def test_verify_table(capsys):
    ids = ["attention.permutation_equivariance", "rope.slowest_pair_period"]
    assert cli.main(["verify", "--only", *ids]) == 0
    out = capsys.readouterr().out
    assert out.count("PASS   ") == 2 and "FAIL" not in out
    assert "Screen 1:" in out and "Screen 8:" in out and "lesson wrong" in out


def test_verify_list_and_unknown_id(capsys):
    assert cli.main(["verify", "--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == len(claims.CLAIMS) and listed[0].startswith("1  ")
    assert cli.main(["verify", "--only", "no.such.claim"]) == 2
    assert "unknown claim id(s) no.such.claim" in capsys.readouterr().err


def test_verify_exits_1_when_a_claim_fails(monkeypatch, capsys):
    bad = claims.Claim(
        "x.fails", 2, "a claim that does not hold", lambda: claims.Result(False, "1 != 2", 1.0)
    )
    monkeypatch.setattr(claims, "CLAIMS", [*claims.CLAIMS[:2], bad])
    assert cli.main(["verify"]) == 1
    out = capsys.readouterr().out
    assert "FAIL   x.fails" in out and "2/3 claims hold" in out


def test_python_dash_m_posemb():
    proc = subprocess.run(
        [sys.executable, "-m", "posemb", "verify", "--json", "--only", "rope.toy_trace"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert [r["id"] for r in json.loads(proc.stdout)] == ["rope.toy_trace"]


def test_unknown_subcommand_is_a_usage_error():
    with pytest.raises(SystemExit) as exc:
        cli.main(["frobnicate"])
    assert exc.value.code == 2
