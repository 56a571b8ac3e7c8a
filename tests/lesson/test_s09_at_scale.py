"""Screen 9: learned against sinusoidal at scale; parameter counts, extrapolation."""

import pytest

from posemb.lesson import measure


def test_the_parameter_claim_fails_when_the_sinusoidal_table_is_learned(broken):
    counts = measure.param_counts()
    fault = {**counts, "sinusoidal": counts["nope"] + 768}
    assert not broken("absolute.parameter_counts", "param_counts", lambda: fault)


def test_the_extrapolation_claim_fails_when_sinusoidal_keeps_its_loss(broken, fake_lab):
    flat = fake_lab(sinusoidal_flat=True)
    assert not broken("sinusoidal.extrapolation_is_not_enabled", "lab_summary", lambda: flat)


def test_the_recent_figure_reads_every_variant_of_the_recent_suite(monkeypatch):
    from posemb.lab.schema import LabSummary
    from posemb.lesson.registry import BUILDERS
    from posemb.lesson.screens import s09_at_scale as s09

    lab = measure.recent_lab_summary()
    fig = BUILDERS["fig-lab-recent"]({})
    assert len(fig.states) == len(s09.RECENT_MEASURES) * len(s09.RECENT_WINDOWS)
    for which, task in s09.RECENT_MEASURES.items():
        for window in s09.RECENT_WINDOWS:
            readout = fig.readouts[f"{which}|{window}"]
            items = readout.split(": ", 1)[1].split("; ")
            for v in lab.variants:
                if task == "loss":
                    stat = lab.loss(v, int(window), "past")
                else:
                    stat = lab.accuracy(task, v, int(window))
                assert any(i.startswith(f"{v} {stat['mean']:.2f}") for i in items), (which, v)
    # A one-seed summary shows no spread (a "± 0.00" reads as certainty); two seeds do.
    one_seed = lab.data["config"]["seeds"] == [0]
    assert ("±" in fig.readouts["multi-key needles|1024"]) != one_seed
    # A summary that lacks a task says which, rather than drawing an empty row.
    monkeypatch.setattr(
        measure, "recent_lab_summary", lambda: LabSummary.of({**lab.data, "vartrack": None})
    )
    with pytest.raises(ValueError, match="no 'vartrack' results"):
        BUILDERS["fig-lab-recent"]({})


def _recent_with(edit):
    import copy

    from posemb.lab.schema import LabSummary

    data = copy.deepcopy(measure.recent_lab_summary().data)
    edit(data)
    return LabSummary.of(data)


def _set_retrieval(variant, mean):
    def edit(d):
        d["retrieval"]["variants"][variant]["1024"]["anywhere"]["mean"] = mean

    return edit


def _raise_loss(variant, by):
    def edit(d):
        d["results"][variant]["1024"]["past"]["mean"] += by

    return edit


@pytest.mark.parametrize(
    "edit",
    [
        _raise_loss("rnope-swa", 0.5),  # the flat model is not flat
        _raise_loss("kerple", 0.5),
        _raise_loss("rope", -1.0),  # RoPE's loss does not rise much
        _set_retrieval("rnope-swa", 0.45),  # RNoPE-SWA beats RoPE beyond noise
        _set_retrieval("rope", 0.45),  # RoPE finds facts: RNoPE-SWA's "no better" is no finding
        _set_retrieval("kerple", 0.3),  # KERPLE no better than RoPE
    ],
    ids=["swa-rises", "kerple-rises", "rope-flat", "swa-retrieves", "rope-retrieves", "kerple"],
)
def test_the_flat_loss_claim_fails_when_any_of_its_parts_fails(broken, edit):
    fake = _recent_with(edit)
    assert not broken("lab.recent.flat_loss_is_not_retrieval", "recent_lab_summary", lambda: fake)
