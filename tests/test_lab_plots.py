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


def test_probe_plot_draws_each_task_beside_retrieval_with_the_right_bars(tmp_path, monkeypatch):
    plt = pytest.importorskip("matplotlib.pyplot")
    import json

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "docs", "lab", "recent", "results.json"), encoding="utf-8") as f:
        summary = json.load(f)
    drawn = []
    real = plt.Axes.errorbar

    def errorbar(self, x, y, yerr=None, **kw):
        drawn.append((self, kw["label"], list(y), list(yerr)))
        return real(self, x, y, yerr=yerr, **kw)

    monkeypatch.setattr(plt.Axes, "errorbar", errorbar)
    (path,) = plots.plot_probes(summary, str(tmp_path), plt)
    assert os.path.basename(path) == "probes.png" and os.path.getsize(path) > 10_000
    tasks = [t for t in plots.PROBE_PANELS if summary.get(t)]
    panels = {ax.get_title(): ax for ax, *_ in drawn}
    assert list(panels) == [plots.PROBE_PANELS[t] for t in tasks]
    spread = "std" if len(summary["config"]["seeds"]) > 1 else "se"
    lens = summary["config"]["eval_lens"]
    for task in tasks:
        lines = [d for d in drawn if d[0] is panels[plots.PROBE_PANELS[task]]]
        labels = [label for _, label, _, _ in lines]
        assert sum(len(label.split(" = ")) for label in labels) == len(summary[task]["variants"])
        for _, label, ys, err in lines:
            at = summary[task]["variants"][label.split(" = ")[0]]
            assert ys == [at[str(n)]["anywhere"]["mean"] for n in lens]
            assert err == [at[str(n)]["anywhere"][spread] or 0.0 for n in lens]
    # A sweep without the tasks draws nothing, rather than empty panels.
    assert plots.plot_probes({"config": summary["config"]}, str(tmp_path / "none"), plt) == []
