"""Screen 2: adding a position tensor; each claim fails when what it claims is broken."""

from posemb.absolute import sinusoidal_table
from posemb.lesson.screens import s02_absolute as s02


def test_the_shift_claim_fails_when_positions_are_not_a_uniform_grid(broken):
    # A table whose position skips one step every 1000: PE(p + k) is no longer M_k PE(p).
    def skipping(p, d, **kw):
        return sinusoidal_table(p + p // 1000, d, **kw)

    assert not broken("absolute.sinusoidal_shift_is_linear", "sinusoidal_table", skipping)


def test_the_orthogonality_claim_fails_on_correlated_vectors(broken):
    real = s02.random_cosines
    assert not broken(
        "absolute.random_vectors_near_orthogonal",
        "random_cosines",
        lambda dim, n, seed=4: real(dim, n, seed) * 2,
    )


def test_the_four_term_claim_fails_when_a_term_is_dropped(broken):
    real = s02.four_terms

    def three_terms():
        lhs, terms = real()
        return lhs, {**terms, "pos-pos": terms["pos-pos"] * 0}

    assert not broken("absolute.four_term_decomposition", "four_terms", three_terms)


def test_the_cosine_figure_shows_the_measured_spread(by_id):
    std = float(s02.random_cosines(32, 500).std())
    assert f"{std:.4f}" in by_id["fig-random-cosines"].readouts["32"]
