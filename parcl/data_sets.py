"""Map-style datasets, as ``torch.utils.data``: anything with ``__len__`` and ``__getitem__``
that returns a sample (an array, a number, a string, or a tuple, list or dict of them), the
``Dataset`` base class, ``TensorDataset`` over numpy arrays, ``Subset``, ``ConcatDataset``,
a seeded ``random_split`` and ``default_collate``, which stacks a list of samples into numpy
batches field by field. ``DataLoader`` (parcl.data) iterates any of them.

>>> import numpy as np
>>> data = TensorDataset(np.arange(6, dtype=np.float32), np.arange(6))
>>> train, val = random_split(data, [4, 2], seed=0)
>>> len(train), len(val), sorted(train.indices + val.indices)
(4, 2, [0, 1, 2, 3, 4, 5])
>>> default_collate([data[0], data[5]])
(array([0., 5.], dtype=float32), array([0, 5]))
"""

from __future__ import annotations

import bisect
import copy
import math
import warnings
from collections.abc import Iterable, Mapping, MutableMapping, MutableSequence, Sequence
from typing import Any

import numpy as np

from .errors import DTypeError, ShapeError

__all__ = ["ConcatDataset", "Dataset", "Subset", "TensorDataset", "default_collate",
           "random_split"]


class Dataset:
    """Base class of map-style datasets: subclasses define ``__getitem__(i)`` (the ``i``-th
    sample) and ``__len__``. ``a + b`` is ``ConcatDataset([a, b])``. Any object with the two
    methods works where a dataset is expected; this class only adds ``+``."""

    def __getitem__(self, index: int) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__ "
                                  "(and __len__) to be a map-style dataset")

    def __add__(self, other: Any) -> ConcatDataset:
        return ConcatDataset([self, other])


class TensorDataset(Dataset):
    """Samples ``(a[i] for a in arrays)`` of numpy arrays that share dim 0 (as
    ``torch.utils.data.TensorDataset`` over tensors). Holds the arrays given, not copies.

    >>> x, y = TensorDataset(np.zeros((3, 2)), np.arange(3))[-1]
    >>> x.tolist(), int(y)
    ([0.0, 0.0], 2)
    """

    def __init__(self, *arrays: np.ndarray):
        if not arrays:
            raise ShapeError("TensorDataset: no arrays given; pass one or more numpy arrays "
                             "that share their first dimension")
        self.arrays = tuple(np.asarray(a) for a in arrays)
        for i, a in enumerate(self.arrays):
            if a.ndim == 0:
                raise ShapeError(f"TensorDataset: array {i} is a scalar (shape ()); every "
                                 "array needs a first dimension with one entry per sample")
        if len({len(a) for a in self.arrays}) != 1:
            shapes = ", ".join(str(a.shape) for a in self.arrays)
            raise ShapeError(f"TensorDataset: arrays have different lengths along dim 0 "
                             f"(shapes {shapes}); every array needs one entry per sample")

    def __getitem__(self, index: Any) -> tuple[Any, ...]:
        return tuple(a[index] for a in self.arrays)

    def __len__(self) -> int:
        return len(self.arrays[0])


class Subset(Dataset):
    """The samples of ``dataset`` at ``indices``, in that order: ``subset[i]`` is
    ``dataset[indices[i]]`` (a list ``i`` picks several, as PyTorch's ``Subset``). Reads
    ``indices`` at each access, as PyTorch does."""

    def __init__(self, dataset: Any, indices: Sequence[int]):
        self.dataset = dataset
        self.indices = indices

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, list):
            return self.dataset[[self.indices[i] for i in index]]
        return self.dataset[self.indices[index]]

    def __getitems__(self, indices: list[int]) -> list[Any]:
        """The samples at ``indices``, fetched together when the dataset can
        (``__getitems__``), as ``DataLoader`` asks for a batch."""
        if callable(getattr(self.dataset, "__getitems__", None)):
            return self.dataset.__getitems__([self.indices[i] for i in indices])
        return [self.dataset[self.indices[i]] for i in indices]

    def __len__(self) -> int:
        return len(self.indices)


class ConcatDataset(Dataset):
    """The datasets one after another: index ``i`` falls in the first dataset whose
    ``cumulative_sizes`` entry exceeds it. Negative indices count from the end.

    >>> both = ConcatDataset([TensorDataset(np.arange(3)), TensorDataset(np.arange(10, 12))])
    >>> len(both), both.cumulative_sizes, int(both[3][0]), int(both[-1][0])
    (5, [3, 5], 10, 11)
    """

    def __init__(self, datasets: Iterable[Any]):
        self.datasets = list(datasets)
        if not self.datasets:
            raise ShapeError("ConcatDataset: datasets is empty; pass one or more datasets")
        for i, d in enumerate(self.datasets):
            if not (hasattr(d, "__len__") and hasattr(d, "__getitem__")):
                raise TypeError(f"ConcatDataset: datasets[{i}] ({type(d).__name__}) is not a "
                                "map-style dataset (it needs __len__ and __getitem__)")
        self.cumulative_sizes = list(np.cumsum([len(d) for d in self.datasets]).tolist())

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, index: int) -> Any:
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"ConcatDataset: index must be an int, got {type(index).__name__}")
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"ConcatDataset: index {index} is out of range for {n} samples")
        index = int(index) + n if index < 0 else int(index)
        which = bisect.bisect_right(self.cumulative_sizes, index)
        start = self.cumulative_sizes[which - 1] if which else 0
        return self.datasets[which][index - start]


def random_split(dataset: Any, lengths: Sequence[int | float], seed: int = 0) -> list[Subset]:
    """``dataset`` cut into disjoint random ``Subset``s of the given ``lengths``: counts that
    sum to ``len(dataset)``, or fractions that sum to 1 (each floored, the remainder then
    handed out one by one from the first subset, as PyTorch's ``random_split``). The order is
    ``default_rng(seed).permutation``, so a seed gives the same split on every rank and run.

    >>> [len(s) for s in random_split(range(10), [0.5, 0.3, 0.2])]
    [5, 3, 2]
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"random_split: seed must be an int, got {type(seed).__name__}")
    if seed < 0:
        raise ShapeError(f"random_split: seed={seed} must be >= 0")
    n = len(dataset)
    lengths = list(lengths)
    if not lengths:
        raise ShapeError("random_split: lengths is empty; give one count or fraction per "
                         "subset")
    total = sum(lengths)
    if math.isclose(total, 1) and total <= 1:
        for i, frac in enumerate(lengths):
            if not 0 <= frac <= 1:
                raise ShapeError(f"random_split: fraction {frac} at index {i} is not "
                                 "between 0 and 1")
        counts = [math.floor(n * frac) for frac in lengths]
        for i in range(n - sum(counts)):       # the remainder, round-robin from the first
            counts[i % len(counts)] += 1
        for i, count in enumerate(counts):
            if count == 0:
                warnings.warn(f"random_split: length of split at index {i} is 0; this "
                              "subset will be empty", stacklevel=2)
    else:
        for i, count in enumerate(lengths):
            if isinstance(count, bool) or not isinstance(count, (int, np.integer)) \
                    or count < 0:
                raise ShapeError(f"random_split: lengths[{i}]={count!r} is neither a count "
                                 "(an int >= 0) nor are lengths fractions summing to 1")
        counts = [int(c) for c in lengths]
    if sum(counts) != n:
        raise ShapeError(f"random_split: lengths {lengths} sum to {sum(counts)}, but the "
                         f"dataset has {n} samples; give counts summing to {n} or fractions "
                         "summing to 1")
    order = np.random.default_rng(seed).permutation(n).tolist()
    ends = np.cumsum(counts).tolist()
    return [Subset(dataset, order[end - count:end]) for end, count in zip(ends, counts)]


def default_collate(batch: Sequence[Any]) -> Any:
    """A list of samples as one batch, as ``torch.utils.data.default_collate`` but in numpy:
    arrays and numpy scalars are stacked along a new dim 0 (keeping their dtype, so float32
    stays float32), Python ints become int64, floats float64 and bools bool arrays; strings
    stay a sequence of strings; dicts stay dicts and named tuples named tuples, collated key
    by key or field by field. A tuple stays a tuple (PyTorch returns a list) and a list a list.
    Samples of several dtypes are promoted as PyTorch promotes them (float32 with int32 or a
    Python float stays float32, where numpy makes it float64). Samples that disagree (other
    shapes, keys or field counts) are a ``ShapeError``.

    >>> default_collate([{"x": np.ones(2, np.float32), "y": 1}, {"x": np.zeros(2), "y": 2}])
    {'x': array([[1., 1.],
           [0., 0.]]), 'y': array([1, 2])}
    """
    if len(batch) == 0:
        raise ShapeError("default_collate: the batch is empty (no samples)")
    elem = batch[0]
    if isinstance(elem, np.ndarray):
        if elem.dtype.kind in "SUaO":
            raise DTypeError(f"default_collate: arrays of dtype {elem.dtype} cannot be "
                             "batched; collate them with your own collate_fn")
        shapes = {np.shape(b) for b in batch}
        if len(shapes) != 1:
            raise ShapeError(f"default_collate: the samples' arrays have different shapes "
                             f"{sorted(shapes)}; every sample needs the same shape to stack")
        dtypes = {b.dtype if isinstance(b, np.ndarray) else np.asarray(b).dtype for b in batch}
        stacked = np.stack(batch, dtype=_promoted(dtypes))
        if stacked.dtype.kind in "SUaO":     # a string or object sample among numbers
            raise DTypeError(f"default_collate: the samples' arrays stack to dtype "
                             f"{stacked.dtype} (a string or object among them); every "
                             "sample needs a numeric array here")
        return stacked
    if isinstance(elem, (np.bool_, np.number, int, float)):
        _check_numbers(batch)
        if isinstance(elem, float) and not isinstance(elem, np.floating):
            return np.array(batch, dtype=np.float64)
        # as torch.tensor(batch) (or as_tensor for numpy scalars) infers it
        return np.array(batch, dtype=_promoted(map(_number_dtype, set(map(type, batch)))))
    if isinstance(elem, (str, bytes)):
        return batch
    if isinstance(elem, Mapping):
        keys = list(elem)
        for i, sample in enumerate(batch):
            if not isinstance(sample, Mapping) or set(sample) != set(keys):
                got = sorted(map(str, sample)) if isinstance(sample, Mapping) else type(sample)
                raise ShapeError(f"default_collate: sample {i} has keys {got}, sample 0 has "
                                 f"{sorted(map(str, keys))}; every sample needs the same keys")
        fields = {key: default_collate([d[key] for d in batch]) for key in keys}
        if isinstance(elem, MutableMapping):
            clone = copy.copy(elem)
            clone.update(fields)
            return clone
        try:
            return type(elem)(fields)
        except TypeError:
            return fields
    if isinstance(elem, Sequence):
        sizes = [len(sample) for sample in batch]
        if len(set(sizes)) != 1:
            raise ShapeError(f"default_collate: samples have {sorted(set(sizes))} fields; "
                             "every sample needs as many")
        columns = [default_collate(list(samples)) for samples in zip(*batch)]
        if isinstance(elem, tuple):
            # a named tuple keeps its type and names, a plain tuple stays a tuple
            return type(elem)(*columns) if hasattr(elem, "_fields") else tuple(columns)
        if isinstance(elem, MutableSequence):
            clone = copy.copy(elem)
            clone[:] = columns
            return clone
        try:
            return type(elem)(columns)
        except TypeError:
            return columns
    raise TypeError(f"default_collate: samples of type {type(elem).__name__} cannot be "
                    "batched; samples must be arrays, numbers, strings, or tuples, lists or "
                    "dicts of them (or pass a collate_fn)")


def _check_numbers(batch: Sequence[Any]) -> None:
    # numpy would turn "2" among numbers into 2 (or the numbers into strings), silently
    for i, v in enumerate(batch):
        if not isinstance(v, (bool, int, float, np.bool_, np.number)):
            raise DTypeError(f"default_collate: sample {i} is a {type(v).__name__} where "
                             f"sample 0 is a number ({type(batch[0]).__name__}); every "
                             "sample needs a number here")


# PyTorch's categories, bool < integer < float < complex: a dtype of a higher one wins whatever
# its size (int32 with float32 is float32, int64 with float16 float16) where numpy widens to
# float64; within a category, and float with complex, numpy's promotion is PyTorch's.
_CATEGORIES = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}


def _promoted(dtypes: Iterable[np.dtype]) -> np.dtype | None:
    """The dtype PyTorch gives samples of ``dtypes`` together, in any order; None where one
    is not a number (numpy's then, and the string or object check refuses it)."""
    result = None
    for dtype in dtypes:
        if dtype.kind not in _CATEGORIES:
            return None
        if result is None:
            result = dtype
        elif _CATEGORIES[dtype.kind] == _CATEGORIES[result.kind] \
                or {dtype.kind, result.kind} == {"f", "c"}:
            result = np.promote_types(result, dtype)
        elif _CATEGORIES[dtype.kind] > _CATEGORIES[result.kind]:
            result = dtype
    return result


def _number_dtype(kind: type) -> np.dtype:
    # torch.tensor's reading of a number of this type: a Python float is the default dtype,
    # float32, a Python int int64
    if issubclass(kind, (np.bool_, np.number)):
        return np.dtype(kind)
    if issubclass(kind, bool):
        return np.dtype(np.bool_)
    return np.dtype(np.float32 if issubclass(kind, float) else np.int64)
