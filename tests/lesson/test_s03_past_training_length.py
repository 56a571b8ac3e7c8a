"""Screen 3: past the trained length; the lab claims fail on other curves, the figures read
the summary they are given."""

import copy

import pytest

import posemb
from posemb.absolute import LearnedEmbedding
from posemb.lesson import figures, measure
from posemb.lesson.screens import s03_past_training_length as s03


def test_the_extrapolation_claim_fails_when_rope_keeps_its_loss(broken, fake_lab):
    flat = fake_lab(rope_flat=True)
    assert not broken("rope.extrapolation_is_not_native", "lab_summary", lambda: flat)


def test_the_parameter_claim_fails_when_rope_has_a_parameter(broken):
    counts = measure.param_counts()
    assert not broken(
        "rope.no_learnable_parameters",
        "param_counts",
        lambda: {**counts, "rope": counts["rope"] + 1},
    )


def test_learned_rows_claim_fails_when_every_row_is_trained(monkeypatch, claim_of):
    real = LearnedEmbedding.forward

    def all_rows(self, x, positions=None):
        """A learned table that mixes every row into every position: all rows get gradient."""
        return real(self, x, positions) + self.weight.mean(0)

    claim = claim_of("absolute.learned_rows_past_training_are_untrained")
    assert claim.run()["passed"]
    monkeypatch.setattr(LearnedEmbedding, "forward", all_rows)
    assert not claim.run()["passed"]


def test_the_table_figures_show_what_posemb_computes(by_id):
    # The learned table refuses past its last row, in posemb's own words.
    assert "ValueError" not in by_id["fig-learned-no-row"].readouts["31"]
    assert "learned table" in by_id["fig-learned-no-row"].readouts["32"]


def test_jerseys_run_out_past_the_table_and_watches_keep_their_angle(by_id):
    fig = by_id["fig-jersey-vs-watch"]
    assert set(fig.readouts) == set(s03.RACES)
    for race, last in s03.RACES.items():
        readout = fig.readouts[race]
        assert readout.endswith("watches: 3 hours apart"), readout
        assert ("no shirt" in readout) == (last > s03.RACE_MILES), readout


def test_lab_figure_reads_the_summary_it_is_given():
    real = posemb.lab.report.default_summary()
    fake = copy.deepcopy(real)
    longest = str(fake["config"]["eval_lens"][-1])
    fake["results"]["rope"][longest]["past"]["mean"] = 9.875
    before = figures.build_figure("fig-lab-loss", real)
    after = figures.build_figure("fig-lab-loss", fake)
    assert "rope 9.875" in after.readouts[s03.LOSS_PARTS[0]]
    assert "rope 9.875" not in before.readouts[s03.LOSS_PARTS[0]]
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
    by_length, by_distance = s03.RETRIEVAL_VIEWS
    assert "rope 0.62" in after.readouts[by_length]  # 0.625 rounds to even
    assert "alibi 0.88" in after.readouts[by_distance]
    assert after.readouts != before.readouts and after.states != before.states
    # Chance is the task's, read from the summary, in the readout and as a rule.
    assert f"chance {real['retrieval']['chance']:.3f}" in before.readouts[by_length]
    del fake["retrieval"]
    with pytest.raises(ValueError, match="no retrieval results"):
        figures.build_figure("fig-lab-retrieval", fake)
