"""Screen 5: the clock tower; pairs per head, the toy trace."""

from posemb.freqs import inv_freq
from posemb.lesson.screens import s05_clock_tower as s05


def test_the_pairs_claim_fails_on_frequencies_over_the_model_width(broken):
    # Frequencies over the model width instead of the head: 384 pairs again.
    def model_wide(dim, base=10000.0, **kw):
        return inv_freq(768, base, **kw)

    assert not broken("rope.pairs_per_head", "inv_freq", model_wide)


def test_the_toy_trace_shows_the_lessons_numbers(by_id):
    readout = by_id["fig-toy-trace"].readouts[s05.TRACE_STEPS[1]]
    assert readout.startswith("R_3 q = [-0.7071, 0.7071]")
