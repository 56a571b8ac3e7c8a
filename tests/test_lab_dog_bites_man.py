"""The 'who bites whom' experiment: NoPE at chance, positions solve it."""

from posemb.lab import dog_bites_man as dbm


def test_data_split_keeps_both_orders_of_a_pair_together():
    data = dbm.make_data(0)
    assert data.train_x.shape[1] == 4 and bool((data.train_x[:, 0] == 0).all())
    train_pairs = {frozenset((int(a), int(b))) for a, b in data.train_x[:, [1, 3]]}
    test_pairs = {frozenset((int(a), int(b))) for a, b in data.test_x[:, [1, 3]]}
    assert not train_pairs & test_pairs
    assert len(data.test_x) == 2 * len(dbm.VERBS) * len(test_pairs)


def test_nope_is_at_chance_and_rope_solves_it_deterministically():
    acc = dbm.run(("nope", "rope"), seed=3)
    assert acc["nope"] == dbm.CHANCE
    assert acc["rope"] > 0.95
    assert dbm.train_and_test("rope", seed=3) == acc["rope"]
