"""The lab report's plots: written under the lab's plot names, one look per variant, and no
error bar drawn where the noise is unknown."""

import os

import pytest

from posemb.lab import plots
from test_lab_report import BASE_CORRECT, BASE_LOSS, RACE_ENTRANTS, _race


def test_race_plot_draws_no_zero_bars_for_one_model_seed(tmp_path, monkeypatch):
    plt = pytest.importorskip("matplotlib.pyplot")
    race = _race((0,), (0,), lambda e, *_: BASE_LOSS[e], lambda e, *_: BASE_CORRECT[e])
    drawn = []
    real = plt.Axes.errorbar

    def errorbar(self, x, y, yerr=None, **kw):
        drawn.append(yerr)
        return real(self, x, y, yerr=yerr, **kw)

    monkeypatch.setattr(plt.Axes, "errorbar", errorbar)
    summary = {"race": race, "config": {"train_len": 64}}
    (path,) = plots.plot_race(summary, str(tmp_path), plt)
    assert os.path.exists(path) and len(drawn) == 2 * len(RACE_ENTRANTS)
    assert all(e is None for e in drawn)


def test_a_plot_under_a_name_the_lab_does_not_know_is_a_bug(tmp_path):
    plt = pytest.importorskip("matplotlib.pyplot")
    fig, _ = plt.subplots()
    with pytest.raises(RuntimeError, match=r"not in posemb\.lab\.checkpoints\.PLOT_FILES"):
        plots._save_figure(fig, str(tmp_path / "my_plot.png"))
    assert not os.listdir(tmp_path)
