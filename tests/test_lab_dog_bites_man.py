"""The 'who bites whom' experiment: NoPE at chance, positions solve it."""

import pytest
import torch

from posemb.lab import dog_bites_man as dbm


def test_data_split_keeps_both_orders_of_a_pair_together():
    data = dbm.make_data(0)
    assert data.train_x.shape[1] == 4 and bool((data.train_x[:, 0] == 0).all())
    train_pairs = {frozenset((int(a), int(b))) for a, b in data.train_x[:, [1, 3]]}
    test_pairs = {frozenset((int(a), int(b))) for a, b in data.test_x[:, [1, 3]]}
    assert not train_pairs & test_pairs
    assert len(data.test_x) == 2 * len(dbm.VERBS) * len(test_pairs)
    assert (len(train_pairs), len(test_pairs)) == (84, 36)


def test_fewer_entities_make_a_smaller_task_over_the_first_entities():
    data = dbm.make_data(0, entities=dbm.SMALL_ENTITIES)
    words = torch.cat([data.train_x[:, [1, 3]], data.test_x[:, [1, 3]]])
    assert int(words.max()) == dbm.SMALL_ENTITIES  # ids are 1 + entity
    assert len(data.train_x) // (2 * len(dbm.VERBS)) == 20
    assert len(data.test_x) // (2 * len(dbm.VERBS)) == 8
    for bad in (2, 17, 8.0, True):
        with pytest.raises(ValueError, match="entities must be"):
            dbm.make_data(0, entities=bad)


def test_nope_is_at_chance_and_rope_solves_it_deterministically():
    acc = dbm.run(("nope", "rope"), seed=3)
    assert acc["nope"] == dbm.CHANCE
    assert acc["rope"] > 0.95
    assert dbm.train_and_test("rope", seed=3) == acc["rope"]


def test_accuracy_over_seeds_lists_one_held_out_accuracy_per_seed():
    acc = dbm.accuracy_over_seeds(("nope",), seeds=(3, 4))
    assert acc == {"nope": [dbm.CHANCE, dbm.CHANCE]}
    assert dbm.accuracy_over_seeds(("nope",), seeds=(4,)) == {"nope": [acc["nope"][1]]}


def test_the_threads_of_the_caller_are_restored():
    threads = torch.get_num_threads()
    dbm.train_and_score("nope", 0, steps=1)
    assert torch.get_num_threads() == threads


def test_unknown_encoding_is_refused():
    with pytest.raises(ValueError, match=r"encoding must be one of nope, .* got 'wavelet'"):
        dbm.Encoder("wavelet")


def test_alibi_memorises_the_small_task():
    small = dbm.memorisation(seeds=(0,), encodings=("alibi",))
    assert set(small) == {"alibi"} and set(small["alibi"]) == {"train", "held_out"}
    # Every training sentence right, unseen pairs not: it learned pairs, not the rule.
    assert small["alibi"]["train"] == [1.0]
    assert small["alibi"]["held_out"][0] < 0.95
