"""parcl.data's map-style datasets, as torch.utils.data's: TensorDataset, Subset, ConcatDataset,
random_split, default_collate, and DataLoader over any of them (the arrays' fast path kept)."""

from __future__ import annotations

import collections
import warnings

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import parcl as pc
import parcl.tape as tp
from parcl.data import (ConcatDataset, DataLoader, Dataset, Subset, TensorDataset,
                        default_collate, random_split)
from parcl.replica import ReplicaGroup


def arrays(n=10):
    return np.arange(n * 2, dtype=np.float32).reshape(n, 2), np.arange(n, dtype=np.int64)


def torch_of(a):
    return torch.from_numpy(np.ascontiguousarray(a))


def as_numpy(batch):
    """torch's collated batch in numpy terms: tensors as arrays, lists and tuples as lists."""
    if isinstance(batch, torch.Tensor):
        return batch.numpy()
    if isinstance(batch, dict):
        return {k: as_numpy(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)) and not isinstance(batch[0], str):
        return [as_numpy(v) for v in batch]
    return list(batch)


def assert_same_batch(got, want):
    """Same structure (a tuple counts as a list), values and dtypes."""
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype, (got, want)
        np.testing.assert_array_equal(got, want)
    elif isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want)
        for key in want:
            assert_same_batch(got[key], want[key])
    elif isinstance(want[0], str):
        assert list(got) == want
    else:
        assert isinstance(got, (list, tuple)) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_same_batch(g, w)


class Rows(Dataset):
    """A dataset of its own (no fast path): sample i is (x[i], y[i]) as Python-visible rows."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


# --- TensorDataset, Subset, ConcatDataset ------------------------------------------------

def test_tensor_dataset_samples_are_rows_as_pytorch():
    x, y = arrays(5)
    ours, theirs = TensorDataset(x, y), tud.TensorDataset(torch_of(x), torch_of(y))
    assert len(ours) == len(theirs) == 5
    for i in (0, 3, -1):
        (xi, yi), (txi, tyi) = ours[i], theirs[i]
        np.testing.assert_array_equal(xi, txi.numpy())
        assert int(yi) == int(tyi)
    assert ours[-1][0].tolist() == [8.0, 9.0] and ours.arrays[0] is x     # held, not copied


def test_tensor_dataset_refuses_arrays_of_other_lengths():
    x, y = arrays(5)
    with pytest.raises(pc.ShapeError, match=r"TensorDataset.*\(5, 2\), \(4,\)"):
        TensorDataset(x, y[:4])
    with pytest.raises(pc.ShapeError, match="no arrays"):
        TensorDataset()
    with pytest.raises(pc.ShapeError, match="array 1 is a scalar"):
        TensorDataset(x, np.float32(1))


def test_subset_picks_its_indices_in_order_as_pytorch():
    x, y = arrays(6)
    ours = Subset(TensorDataset(x, y), [4, 0, 2])
    theirs = tud.Subset(tud.TensorDataset(torch_of(x), torch_of(y)), [4, 0, 2])
    assert len(ours) == len(theirs) == 3
    assert [int(ours[i][1]) for i in range(3)] == [int(theirs[i][1]) for i in range(3)] == [4, 0, 2]
    assert ours[[2, 0]][1].tolist() == theirs[[2, 0]][1].tolist() == [2, 4]   # a list picks several
    assert [int(s[1]) for s in ours.__getitems__([1, 2])] == [0, 2]


def test_concat_dataset_indexes_across_its_parts_as_pytorch():
    parts = [np.arange(3), np.arange(10, 11), np.arange(20, 24)]
    ours = ConcatDataset([TensorDataset(p) for p in parts])
    theirs = tud.ConcatDataset([tud.TensorDataset(torch_of(p)) for p in parts])
    assert len(ours) == len(theirs) == 8
    assert ours.cumulative_sizes == list(theirs.cumulative_sizes) == [3, 4, 8]
    for i in range(-8, 8):
        assert int(ours[i][0]) == int(theirs[i][0])
    assert [int(ours[i][0]) for i in range(8)] == [0, 1, 2, 10, 20, 21, 22, 23]
    both = TensorDataset(parts[0]) + TensorDataset(parts[1])     # Dataset.__add__, as torch
    assert isinstance(both, ConcatDataset) and int(both[3][0]) == 10


def test_concat_dataset_refuses_what_it_cannot_index():
    both = ConcatDataset([TensorDataset(np.arange(3)), TensorDataset(np.arange(2))])
    with pytest.raises(IndexError, match="index 5 is out of range for 5 samples"):
        both[5]
    with pytest.raises(IndexError, match="index -6"):
        both[-6]
    with pytest.raises(pc.ShapeError, match="empty"):
        ConcatDataset([])
    with pytest.raises(TypeError, match=r"datasets\[1\] \(int\)"):
        ConcatDataset([TensorDataset(np.arange(3)), 5])


# --- random_split ------------------------------------------------------------------------

@pytest.mark.parametrize("n,lengths,sizes", [
    (10, [7, 3], [7, 3]),
    (10, [0.5, 0.3, 0.2], [5, 3, 2]),
    (7, [1 / 3, 1 / 3, 1 / 3], [3, 2, 2]),         # floors 2, 2, 2; the 1 left goes first
    (11, [0.25, 0.25, 0.25, 0.25], [3, 3, 3, 2]),
    (3, [0.1, 0.9], [1, 2]),                       # floors 0, 2; the 1 left to the first
])
def test_random_split_sizes_are_pytorchs(n, lengths, sizes):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # a split floored to 0 warns, in both
        theirs = tud.random_split(range(n), lengths, generator=torch.Generator().manual_seed(0))
    ours = random_split(range(n), lengths, seed=0)
    assert [len(s) for s in ours] == [len(s) for s in theirs] == sizes
    picked = [i for s in ours for i in s.indices]
    assert sorted(picked) == list(range(n))            # disjoint, and every sample once


def test_random_split_is_a_pure_function_of_the_seed():
    first = random_split(TensorDataset(np.arange(20)), [0.8, 0.2], seed=3)
    again = random_split(TensorDataset(np.arange(20)), [16, 4], seed=3)
    assert [s.indices for s in first] == [s.indices for s in again]
    expected = np.random.default_rng(3).permutation(20).tolist()
    assert first[0].indices + first[1].indices == expected
    assert random_split(range(20), [16, 4], seed=4)[0].indices != first[0].indices


def test_random_split_refuses_lengths_that_do_not_fit():
    with pytest.raises(pc.ShapeError, match=r"sum to 9, but the dataset has 10 samples"):
        random_split(range(10), [5, 4])
    with pytest.raises(pc.ShapeError, match=r"lengths\[1\]=-1"):
        random_split(range(10), [11, -1])
    with pytest.raises(pc.ShapeError, match=r"lengths\[0\]=2.5"):
        random_split(range(5), [2.5, 2.5])
    with pytest.raises(pc.ShapeError, match="fraction 1.2 at index 0"):
        random_split(range(5), [1.2, -0.2])
    with pytest.raises(pc.ShapeError, match="seed=-1"):
        random_split(range(5), [5], seed=-1)
    with pytest.warns(UserWarning, match="index 1 is 0"):      # floors 0, 0; the 1 left
        random_split(range(1), [0.1, 0.9])                     # goes to the first


# --- default_collate ---------------------------------------------------------------------

Point = collections.namedtuple("Point", "x y")

BATCHES = {
    "float32 arrays": [np.ones((2, 3), np.float32), np.zeros((2, 3), np.float32)],
    "float64 arrays": [np.ones(2), np.zeros(2)],
    "0-d arrays": [np.array(1.5, np.float32), np.array(2.0, np.float32)],
    "numpy float32 scalars": [np.float32(1.5), np.float32(2)],
    "numpy int32 scalars": [np.int32(1), np.int32(7)],
    "python ints": [3, 1, 4],
    "python floats": [1.5, 2.25],
    "python bools": [True, False],
    "an int then a float": [1, 2.5],
    "a float then an int": [2.5, 1],
    "ints and bools": [1, True],
    "strings": ["a", "bc"],
    "tuples": [(np.ones(2, np.float32), 1), (np.zeros(2, np.float32), 2)],
    "lists": [[1, 2.5], [3, 4.5]],
    "dicts": [{"x": np.ones(2, np.float32), "y": 1, "name": "a"},
              {"x": np.zeros(2, np.float32), "y": 2, "name": "b"}],
    "nested": [{"pair": (np.int64(1), {"w": 0.5})}, {"pair": (np.int64(2), {"w": 1.5})}],
    "named tuples": [Point(np.float32(1), 0), Point(np.float32(2), 1)],
}


@pytest.mark.parametrize("batch", BATCHES.values(), ids=BATCHES.keys())
def test_default_collate_gives_pytorchs_structure_values_and_dtypes(batch):
    assert_same_batch(default_collate(batch), as_numpy(tud.default_collate(batch)))


def test_default_collate_keeps_tuples_dicts_and_named_tuples():
    x, y = default_collate([(np.float32(1), 3), (np.float32(2), 4)])
    assert x.tolist() == [1.0, 2.0] and x.dtype == np.float32
    assert y.tolist() == [3, 4] and y.dtype == np.int64
    point = default_collate([Point(1.0, 2), Point(3.0, 4)])
    assert type(point) is Point and point.x.dtype == np.float64 and point.y.tolist() == [2, 4]
    batch = default_collate([{"x": np.ones(2, np.float32), "y": 0}] * 3)
    assert type(batch) is dict and batch["x"].shape == (3, 2) and batch["y"].tolist() == [0] * 3
    assert default_collate([[1, 2], [3, 4]])[1].tolist() == [2, 4]


def test_default_collate_refuses_samples_that_disagree():
    with pytest.raises(pc.ShapeError, match=r"different shapes \[\(2,\), \(3,\)\]"):
        default_collate([np.ones(2), np.ones(3)])
    with pytest.raises(pc.ShapeError, match=r"sample 1 has keys \['x', 'z'\]"):
        default_collate([{"x": 1, "y": 2}, {"x": 1, "z": 2}])
    with pytest.raises(pc.ShapeError, match=r"samples have \[2, 3\] fields"):
        default_collate([(1, 2), (1, 2, 3)])
    with pytest.raises(pc.DTypeError, match="<U1"):
        default_collate([np.array(["a"]), np.array(["b"])])
    with pytest.raises(TypeError, match="samples of type object"):
        default_collate([object(), object()])
    with pytest.raises(pc.ShapeError, match="empty"):
        default_collate([])
    # numpy would read "2" as 2, or the numbers as strings, without a word
    with pytest.raises(pc.DTypeError, match="sample 1 is a str where sample 0 is a number"):
        default_collate([1.5, "2"])
    with pytest.raises(pc.DTypeError, match="sample 1 is a str"):
        default_collate([np.float32(1), "x"])
    with pytest.raises(pc.DTypeError, match="stack to dtype <U32"):
        default_collate([np.ones(2), np.array(["a", "b"])])


# --- DataLoader over datasets ------------------------------------------------------------

@pytest.mark.parametrize("shuffle,drop_last,rank,world_size",
                         [(False, False, 0, 1), (True, False, 1, 2), (True, True, 2, 3)])
def test_a_tensor_dataset_loads_bit_identically_to_its_arrays(shuffle, drop_last, rank,
                                                               world_size):
    x, y = arrays(23)
    settings = dict(shuffle=shuffle, seed=5, drop_last=drop_last, rank=rank,
                    world_size=world_size)
    for data in (TensorDataset(x, y), Rows(x, y)):           # sliced, and collated
        plain, loader = DataLoader((x, y), 4, **settings), DataLoader(data, 4, **settings)
        assert len(loader) == len(plain)
        for _ in range(2):                                   # two epochs
            for got, want in zip(loader, plain, strict=True):
                assert type(got) is tuple and len(got) == 2
                for g, w in zip(got, want):
                    assert g.dtype == w.dtype and g.tobytes() == w.tobytes()
    assert DataLoader(TensorDataset(x, y), 4).arrays[0] is x        # the fast path: sliced
    assert DataLoader(Rows(x, y), 4).arrays is None                 # collated sample by sample


def test_a_subset_loads_the_rows_at_its_indices():
    x, y = arrays(10)
    train, val = random_split(TensorDataset(x, y), [0.7, 0.3], seed=1)
    inner = Subset(train, [6, 0, -1])                             # a subset of a subset
    for subset in (train, val, inner):
        loader = DataLoader(subset, 2)
        assert loader.arrays is not None                          # still sliced
        ids = [int(i) for _, yb in loader for i in yb]
        assert ids == [int(subset[i][1]) for i in range(len(subset))]
    assert [int(inner[i][1]) for i in range(3)] == [train.indices[6], train.indices[0],
                                                    train.indices[-1]]


def test_a_concat_dataset_loads_as_pytorchs_loader():
    x, y = arrays(10)
    ours = ConcatDataset([TensorDataset(x[:4], y[:4]), Rows(x[4:], y[4:])])
    theirs = tud.ConcatDataset([tud.TensorDataset(torch_of(x[:4]), torch_of(y[:4])),
                                tud.TensorDataset(torch_of(x[4:]), torch_of(y[4:]))])
    torch_batches = list(tud.DataLoader(theirs, batch_size=3))
    batches = list(DataLoader(ours, 3))
    assert len(batches) == len(torch_batches) == 4
    for got, want in zip(batches, torch_batches):
        assert_same_batch(got, as_numpy(want))
    assert batches[1][1].tolist() == [3, 4, 5]


def test_collate_fn_sees_the_batch_samples_as_pytorchs():
    x, y = arrays(6)
    seen = []

    def collate(samples):
        seen.append(samples)
        return len(samples)

    assert list(DataLoader((x, y), 4, collate_fn=collate)) == [4, 2]   # over arrays too
    assert [int(s[1]) for s in seen[1]] == [4, 5] and isinstance(seen[1][0], tuple)
    torch_seen = []
    list(tud.DataLoader(tud.TensorDataset(torch_of(x), torch_of(y)), batch_size=4,
                        collate_fn=lambda s: torch_seen.append(s)))
    assert [[int(s[1]) for s in b] for b in seen] == [[int(s[1]) for s in b] for b in torch_seen]


def test_a_dataset_with_getitems_is_asked_once_per_batch():
    class Batched(Rows):
        calls = []

        def __getitems__(self, indices):
            self.calls.append(indices)
            return [self[i] for i in indices]

    x, y = arrays(5)
    data = Batched(x, y)
    assert [b[1].tolist() for b in DataLoader(data, 2)] == [[0, 1], [2, 3], [4]]
    assert data.calls == [[0, 1], [2, 3], [4]]


def test_a_dataset_loader_resumes_as_an_array_loader():
    x, y = arrays(13)
    loader = DataLoader(Rows(x, y), 3, shuffle=True, seed=2)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    rest = [b[1].tolist() for b in it]
    again = DataLoader(Rows(x, y), 3, shuffle=True, seed=2)
    again.load_state_dict(state)
    assert [b[1].tolist() for b in again] == rest
    assert state == {**DataLoader((x, y), 3, shuffle=True, seed=2).state_dict(),
                     "batch_index": 2}


def test_a_loader_refuses_what_is_no_dataset():
    with pytest.raises(TypeError, match="map-style dataset.*got int"):
        DataLoader(5, 2)
    with pytest.raises(pc.ShapeError, match=r"dataset \(Subset\) is empty"):
        DataLoader(Subset(TensorDataset(np.arange(3)), []), 2)
    with pytest.raises(IndexError, match="Subset index 10 is out of range for the 10 samples"):
        DataLoader(Subset(Subset(TensorDataset(np.arange(10)), [0, 10]), [1]), 2)
    with pytest.raises(IndexError, match="Subset index -3 is out of range for the 2 samples"):
        DataLoader(Subset(Subset(TensorDataset(np.arange(10)), [0, 9]), [-3]), 2)
    with pytest.raises(TypeError, match="collate_fn must be callable"):
        DataLoader(np.arange(3), 2, collate_fn="stack")


# --- training ----------------------------------------------------------------------------

def test_a_group_trained_from_a_tensor_dataset_equals_one_trained_from_arrays(devices2):
    rng = np.random.default_rng(0)
    x = rng.random((40, 16), dtype=np.float32)
    y = rng.integers(0, 4, 40).astype(np.int64)

    def build(queue):
        pc.nn.manual_seed(0)
        return pc.nn.Sequential(pc.nn.Linear(16, 8, queue=queue), pc.nn.ReLU(),
                                pc.nn.Linear(8, 4, queue=queue))

    def train(data):
        with ReplicaGroup(build, devices2) as group:
            opt = pc.optim.SGD(group.parameters(), lr=0.1, momentum=0.9)
            loader = DataLoader(data, 8, shuffle=True, seed=1)
            losses = [group.step(xb, yb, tp.cross_entropy, opt)
                      for _ in range(2) for xb, yb in loader]
            return losses, group.model.state_dict()

    want_losses, want = train((x, y))
    for data in (TensorDataset(x, y), Rows(x, y)):
        losses, got = train(data)
        assert losses == want_losses and len(losses) == 10
        for key in want:
            assert got[key].tobytes() == want[key].tobytes(), key
