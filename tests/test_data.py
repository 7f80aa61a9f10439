"""parcl.data: the digits, and a DataLoader that shuffles reproducibly, splits an epoch between
ranks and resumes mid-epoch. No device needed."""

from __future__ import annotations

import json

import numpy as np
import pytest

import parcl as pc
from parcl.data import DataLoader, load_digits


def ids_of(loader, epochs=1):
    """The sample ids (second array) a loader yields, batch by batch, over ``epochs`` passes."""
    return [b[1].tolist() for _ in range(epochs) for b in loader]


def flat(batches):
    return [i for batch in batches for i in batch]


def dataset(n=10):
    return np.arange(n * 2, dtype=np.float32).reshape(n, 2), np.arange(n, dtype=np.int64)


# --- load_digits -------------------------------------------------------------------------

@pytest.mark.parametrize("images", [False, True])
def test_digits_shapes_dtypes_and_range(images):
    x_train, y_train, x_test, y_test = load_digits(images=images)
    feature_shape = (1, 8, 8) if images else (64,)
    assert x_train.shape[1:] == x_test.shape[1:] == feature_shape
    assert len(x_train) + len(x_test) == 1797
    assert len(x_train) == len(y_train) and len(x_test) == len(y_test)
    assert abs(len(x_test) / 1797 - 0.2) < 0.01
    assert x_train.dtype == x_test.dtype == np.float32
    assert y_train.dtype == y_test.dtype == np.int64
    assert x_train.min() == 0.0 and x_train.max() == 1.0
    assert x_train.flags.c_contiguous
    assert set(np.unique(y_train)) == set(np.unique(y_test)) == set(range(10))


def test_digits_split_is_seeded_stratified_and_disjoint():
    from sklearn.datasets import load_digits as sklearn_digits
    a, b = load_digits(seed=3), load_digits(seed=3)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    assert not np.array_equal(a[1], load_digits(seed=4)[1])
    x_train, y_train, x_test, y_test = a
    # Every class keeps about its share of the test set.
    for label in range(10):
        in_test = np.sum(y_test == label)
        in_all = np.sum(y_train == label) + in_test
        assert abs(in_test / in_all - 0.2) < 0.01
    # Train and test together are exactly the original images, each once.
    raw = sklearn_digits()
    original = {(tuple(r), t) for r, t in zip((raw.data / 16).astype(np.float32), raw.target)}
    together = [(tuple(r), t) for r, t in zip(np.concatenate([x_train, x_test]),
                                              np.concatenate([y_train, y_test]))]
    assert len(together) == 1797 and set(together) <= original


def test_digits_rejects_bad_fraction():
    with pytest.raises(ValueError, match="test_fraction"):
        load_digits(test_fraction=1.0)


# --- DataLoader: batching ----------------------------------------------------------------

def test_batches_in_order_with_a_short_last_batch():
    x, y = dataset(10)
    loader = DataLoader((x, y), batch_size=4)
    batches = list(loader)
    assert len(loader) == 3 and len(batches) == 3
    assert [b[1].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    np.testing.assert_array_equal(batches[0][0], x[:4])
    assert batches[0][0].dtype == np.float32 and batches[0][1].dtype == np.int64


def test_single_array_yields_one_tuples():
    loader = DataLoader(np.arange(5), batch_size=2)
    assert [b for (b,) in loader][-1].tolist() == [4]


def test_drop_last():
    loader = DataLoader(dataset(10), batch_size=4, drop_last=True)
    assert len(loader) == 2
    assert ids_of(loader) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_shuffle_is_seeded_and_differs_between_epochs():
    a = DataLoader(dataset(50), batch_size=8, shuffle=True, seed=1)
    b = DataLoader(dataset(50), batch_size=8, shuffle=True, seed=1)
    first, second = ids_of(a), ids_of(a)          # a full pass advances the epoch
    assert first == ids_of(b) and second == ids_of(b)
    assert first != second
    assert sorted(flat(first)) == sorted(flat(second)) == list(range(50))
    assert first != ids_of(DataLoader(dataset(50), batch_size=8, shuffle=True, seed=2))
    assert a.epoch == 2


def test_set_epoch_picks_that_epochs_order():
    a = DataLoader(dataset(20), batch_size=5, shuffle=True)
    ids_of(a, epochs=3)
    third = ids_of(a)
    b = DataLoader(dataset(20), batch_size=5, shuffle=True)
    b.set_epoch(3)
    assert ids_of(b) == third


# --- DataLoader: ranks -------------------------------------------------------------------

@pytest.mark.parametrize("n, world_size, batch_size", [(10, 2, 3), (11, 3, 2), (7, 4, 1),
                                                      (3, 5, 2), (64, 4, 16)])
@pytest.mark.parametrize("shuffle", [False, True])
def test_ranks_share_an_epoch(n, world_size, batch_size, shuffle):
    loaders = [DataLoader(dataset(n), batch_size, shuffle=shuffle, seed=7, rank=r,
                          world_size=world_size) for r in range(world_size)]
    for _epoch in range(2):
        shares = [flat(ids_of(ld)) for ld in loaders]
        counts = {len(ld) for ld in loaders}
        assert len(counts) == 1, "every rank must yield the same number of batches"
        assert {len(s) for s in shares} == {-(-n // world_size)}
        seen = flat(shares)
        assert set(seen) == set(range(n)), "every sample at least once per epoch"
        # Only the padding (fewer than world_size samples) is seen twice.
        assert len(seen) - n < world_size
        if len(seen) == n:
            assert sorted(seen) == list(range(n))


def test_ranks_are_disjoint_when_the_epoch_divides_evenly():
    shares = [set(flat(ids_of(DataLoader(dataset(12), 2, shuffle=True, rank=r, world_size=3))))
              for r in range(3)]
    assert not (shares[0] & shares[1] or shares[0] & shares[2] or shares[1] & shares[2])
    assert shares[0] | shares[1] | shares[2] == set(range(12))


def test_ranks_with_drop_last_have_equal_full_batches():
    loaders = [DataLoader(dataset(11), 2, drop_last=True, rank=r, world_size=3) for r in range(3)]
    batches = [ids_of(ld) for ld in loaders]
    assert [len(b) for b in batches] == [len(ld) for ld in loaders] == [2, 2, 2]
    assert all(len(b) == 2 for per_rank in batches for b in per_rank)


# --- DataLoader: resume ------------------------------------------------------------------

@pytest.mark.parametrize("stop_after", [0, 1, 2, 3])
def test_resume_mid_epoch_matches_an_uninterrupted_run(stop_after):
    def make():
        return DataLoader(dataset(37), 9, shuffle=True, seed=5, rank=1, world_size=2)

    assert len(make()) == 3
    reference = make()
    ids_of(reference)                                  # epoch 0 done
    expected = ids_of(reference, epochs=3)             # epochs 1, 2, 3

    interrupted = make()
    ids_of(interrupted)
    it = iter(interrupted)
    head = [next(it)[1].tolist() for _ in range(stop_after)]
    state = json.loads(json.dumps(interrupted.state_dict()))   # as it travels in a checkpoint
    assert state["epoch"] == (1 if stop_after < len(interrupted) else 2)
    del it

    resumed = make()
    resumed.load_state_dict(state)
    rest = ids_of(resumed, epochs=3 if stop_after < len(interrupted) else 2)
    assert head + rest == expected


def test_state_dict_is_json_and_names_the_position():
    loader = DataLoader(dataset(10), 3, shuffle=True, seed=9)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert json.loads(json.dumps(state)) == state
    assert (state["epoch"], state["batch_index"], state["seed"]) == (0, 1, 9)


def test_resume_takes_the_seed_and_may_change_rank():
    saved = DataLoader(dataset(10), 2, shuffle=True, seed=4, rank=0, world_size=2)
    it = iter(saved)
    next(it)
    other_rank = DataLoader(dataset(10), 2, shuffle=True, seed=0, rank=1, world_size=2)
    other_rank.load_state_dict(saved.state_dict())
    reference = DataLoader(dataset(10), 2, shuffle=True, seed=4, rank=1, world_size=2)
    assert ids_of(other_rank) == ids_of(reference)[1:]


def test_load_state_dict_rejects_a_different_setup():
    state = DataLoader(dataset(10), 2).state_dict()
    with pytest.raises(pc.ShapeError, match="batch_size=2"):
        DataLoader(dataset(10), 3).load_state_dict(state)
    with pytest.raises(pc.ShapeError, match="num_samples=10"):
        DataLoader(dataset(11), 2).load_state_dict(state)
    with pytest.raises(ValueError, match="lacks"):
        DataLoader(dataset(10), 2).load_state_dict({"epoch": 1})


# --- DataLoader: errors ------------------------------------------------------------------

def test_errors():
    x, y = dataset(10)
    with pytest.raises(pc.ShapeError, match=r"different lengths.*\(10, 2\), \(9,\)"):
        DataLoader((x, y[:9]), 2)
    with pytest.raises(pc.ShapeError, match="batch_size=0"):
        DataLoader((x, y), 0)
    with pytest.raises(pc.ShapeError, match="rank=2"):
        DataLoader((x, y), 2, rank=2, world_size=2)
    with pytest.raises(pc.ShapeError, match="rank=-1"):
        DataLoader((x, y), 2, rank=-1, world_size=2)
    with pytest.raises(pc.ShapeError, match="world_size=0"):
        DataLoader((x, y), 2, world_size=0)
    with pytest.raises(pc.ShapeError, match="empty"):
        DataLoader(np.zeros((0, 3)), 2)
    with pytest.raises(pc.ShapeError, match="no arrays"):
        DataLoader((), 2)
    with pytest.raises(TypeError, match="batch_size must be an int"):
        DataLoader((x, y), 2.5)


@pytest.mark.parametrize("make", [
    lambda: pc.data.DataLoader(np.arange(6), batch_size=4, drop_last=True, world_size=2),
    lambda: pc.data.TextLoader(np.arange(40), block_size=4, batch_size=4, world_size=4)],
    ids=["DataLoader", "TextLoader"])
def test_a_loader_with_no_full_batch_per_rank_is_refused(make):
    """drop_last with fewer samples per rank than a batch would give an epoch of no batches:
    a `while step < steps: for batch in loader` loop would spin without ever stepping."""
    with pytest.raises(pc.ShapeError, match="make no full batch"):
        make()
