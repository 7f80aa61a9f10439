"""Data loading: a seeded, resumable, rank-aware batch iterator over numpy arrays or a
map-style dataset (parcl.data_sets), and the 8x8 handwritten digits that ship inside
scikit-learn.

Numpy only: batches stay on the host until a replica copies its share to its own queue.

>>> import numpy as np
>>> from parcl.data import DataLoader
>>> x, y = np.arange(10, dtype=np.float32), np.arange(10)
>>> [b[1].tolist() for b in DataLoader((x, y), batch_size=4)]
[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from .data_sets import ConcatDataset, Dataset, Subset, TensorDataset, default_collate, random_split
from .errors import ShapeError

__all__ = ["ConcatDataset", "DataLoader", "Dataset", "Subset", "TensorDataset",
           "default_collate", "distributed_indices", "epoch_permutation", "load_digits",
           "random_split"]

STATE_VERSION = 1


def epoch_permutation(num_samples: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The sample order of one epoch: a pure function of ``(seed, epoch)``, so every rank and
    every resumed run computes the same one.

    >>> epoch_permutation(5, seed=0, epoch=0, shuffle=False).tolist()
    [0, 1, 2, 3, 4]
    """
    if not shuffle:
        return np.arange(num_samples, dtype=np.int64)
    return np.random.default_rng([seed, epoch]).permutation(num_samples).astype(np.int64)


def distributed_indices(order: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """This rank's share of one epoch's ``order``, as PyTorch's ``DistributedSampler`` with
    ``drop_last=False`` cuts it: ``order`` is padded by repeating its head until its length
    divides ``world_size``, then rank ``r`` takes every ``world_size``-th sample from ``r``.
    Every sample is seen at least once per epoch (the few padded ones twice), and every rank
    gets the same number of samples, so no rank ever waits for a batch another lacks.

    >>> distributed_indices(np.arange(5), rank=1, world_size=2).tolist()
    [1, 3, 0]
    """
    # order[rank::world_size] takes any rank: -1 would give one sample, world_size another
    # rank's share, silently; DistributedSampler refuses them too
    _check_rank("distributed_indices", rank, world_size)
    per_rank = math.ceil(len(order) / world_size)
    padding = per_rank * world_size - len(order)
    if padding:
        repeats = math.ceil(padding / len(order))
        order = np.concatenate([order, np.tile(order, repeats)[:padding]])
    return order[rank::world_size]


class _SlicedBatches:
    """The fast path: a batch is the arrays' rows at its indices (through a Subset's index
    map), one fancy-indexing copy per array, never sample by sample."""

    def __init__(self, arrays: tuple[np.ndarray, ...], index_map: np.ndarray | None):
        self.arrays, self.index_map = arrays, index_map

    def __call__(self, idx: np.ndarray) -> tuple[np.ndarray, ...]:
        if self.index_map is not None:
            idx = self.index_map[idx]
        return tuple(a[idx] for a in self.arrays)


class _CollatedBatches:
    """Any map-style dataset: the batch's samples (all at once where the dataset has
    ``__getitems__``, as PyTorch's fetcher asks) passed to ``collate_fn``."""

    def __init__(self, dataset: Any, collate_fn: Callable[[list], Any]):
        self.dataset, self.collate_fn = dataset, collate_fn
        getitems = getattr(dataset, "__getitems__", None)
        self.getitems = getitems if callable(getitems) else None

    def __call__(self, idx: np.ndarray) -> Any:
        indices = idx.tolist()
        if self.getitems is not None:
            return self.collate_fn(self.getitems(indices))
        return self.collate_fn([self.dataset[i] for i in indices])


def _sliceable(dataset: Any) -> tuple[tuple[np.ndarray, ...], np.ndarray | None] | None:
    """``(arrays, index_map)`` when every sample of ``dataset`` is rows of numpy arrays: a
    ``TensorDataset``, or ``Subset``s of one (their own classes, not subclasses, which may
    change ``__getitem__``); else None."""
    chain = []
    while type(dataset) is Subset:
        chain.append(dataset)
        dataset = dataset.dataset
    if type(dataset) is not TensorDataset:
        return None
    index_map, size = None, len(dataset)
    for subset in reversed(chain):                 # innermost first: it indexes the arrays
        indices = np.asarray(subset.indices)
        if indices.size == 0:
            indices = indices.astype(np.int64)
        if indices.ndim != 1 or not np.issubdtype(indices.dtype, np.integer):
            return None          # the sample path raises what indexing by them raises
        if indices.size and (indices.min() < -size or indices.max() >= size):
            bad = indices[(indices < -size) | (indices >= size)][0]
            raise IndexError(f"DataLoader: Subset index {bad} is out of range for the {size} "
                             f"samples of its dataset")
        index_map = indices if index_map is None else index_map[indices]
        size = len(indices)
    return dataset.arrays, index_map


def _checked_arrays(arrays: np.ndarray | Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    if isinstance(arrays, np.ndarray):
        arrays = (arrays,)
    arrays = tuple(np.asarray(a) for a in arrays)
    if not arrays:
        raise ShapeError("DataLoader: no arrays given; pass a numpy array or a tuple of them")
    for i, a in enumerate(arrays):
        if a.ndim == 0:
            raise ShapeError(f"DataLoader: array {i} is a scalar (shape ()); every array "
                             f"needs a first dimension to batch along")
    lengths = [len(a) for a in arrays]
    if len(set(lengths)) != 1:
        shapes = ", ".join(str(a.shape) for a in arrays)
        raise ShapeError(f"DataLoader: arrays have different lengths along dim 0 "
                         f"(shapes {shapes}); every array needs one entry per sample")
    if lengths[0] == 0:
        raise ShapeError("DataLoader: the arrays are empty (0 samples)")
    return arrays


class DataLoader:
    """Batches of numpy arrays that share their first dimension, or of a map-style dataset.

    Over arrays (one, or a tuple or list of them: a list is always taken as arrays, so put a
    list of samples in a ``Dataset``), iterating yields tuples of batches, one per
    array (a 1-tuple when a single array is given), each batch the arrays' rows at its indices;
    a ``TensorDataset``, or ``Subset``s of one, batches the same way, as fast (their indices
    read when the loader is built; the loader holds the arrays, not copies). Any other
    dataset (``__len__`` and ``__getitem__``) yields ``collate_fn`` of the batch's samples,
    ``default_collate`` unless given, which stacks them field by field; a ``collate_fn``
    given over arrays sees their samples, tuples of rows, as a ``TensorDataset``'s.
    With ``shuffle=True`` the order of epoch ``e`` is ``default_rng([seed, e]).permutation``,
    the same on every rank. With ``rank``/``world_size`` each rank gets a disjoint share of each
    epoch, padded as ``DistributedSampler`` pads (see :func:`distributed_indices`), so every
    sample is seen at least once and every rank yields ``len(loader)`` batches. ``drop_last``
    drops the last incomplete batch of this rank's share.

    The loader remembers where it is: a full pass advances to the next epoch, an interrupted
    pass resumes where it stopped on the next ``iter()``, and ``state_dict()`` /
    ``load_state_dict()`` carry that position through a checkpoint. ``set_epoch(e)`` starts
    epoch ``e`` from its first batch; either, called during a pass, takes effect at that
    pass's next batch (a loop that rolls back to a checkpoint goes on from there). Use one
    iterator at a time.

    >>> import numpy as np
    >>> x = np.arange(10, dtype=np.float32)
    >>> loader = DataLoader(x, batch_size=3, rank=1, world_size=2, drop_last=True)
    >>> len(loader), [b.tolist() for (b,) in loader]
    (1, [[1.0, 3.0, 5.0]])
    >>> class Squares(Dataset):
    ...     def __len__(self): return 5
    ...     def __getitem__(self, i): return {"x": np.full(2, i * i, np.float32), "y": i}
    >>> batch = next(iter(DataLoader(Squares(), batch_size=2)))
    >>> batch["x"].tolist(), batch["y"].tolist(), batch["y"].dtype
    ([[0.0, 0.0], [1.0, 1.0]], [0, 1], dtype('int64'))
    """

    def __init__(self, dataset: Any, batch_size: int, shuffle: bool = False, seed: int = 0,
                 drop_last: bool = False, rank: int = 0, world_size: int = 1, *,
                 collate_fn: Callable[[list], Any] | None = None):
        if isinstance(dataset, (np.ndarray, tuple, list)):
            dataset = TensorDataset(*_checked_arrays(dataset))
        elif not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise TypeError(f"DataLoader: expected numpy arrays or a map-style dataset "
                            f"(__len__ and __getitem__), got {type(dataset).__name__}")
        elif len(dataset) == 0:
            raise ShapeError(f"DataLoader: the dataset ({type(dataset).__name__}) is empty "
                             "(0 samples)")
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(f"DataLoader: collate_fn must be callable, got "
                            f"{type(collate_fn).__name__}")
        _check_int("batch_size", batch_size, minimum=1)
        _check_int("seed", seed, minimum=0)
        _check_rank("DataLoader", rank, world_size)
        # default_collate unless given, as PyTorch's loader.collate_fn (where a TensorDataset is
        # sliced instead, the batch is the one default_collate makes of its rows)
        self.dataset = dataset
        self.collate_fn = default_collate if collate_fn is None else collate_fn
        # the strategy is chosen once: slicing arrays, or collating samples
        sliced = _sliceable(dataset) if collate_fn is None else None
        if sliced is not None:
            self.arrays = sliced[0]
            self._batch = _SlicedBatches(*sliced)
        else:
            self.arrays = None
            self._batch = _CollatedBatches(dataset, self.collate_fn)
        self.num_samples = len(dataset)
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.epoch = 0
        self.batch_index = 0   # batches of `epoch` already handed out
        self._resumed = None   # the epoch load_state_dict put the loader inside, until it moves
        self._finished = False  # set_epoch chose an epoch the loaded state had finished
        if len(self) == 0:     # an epoch of no batches: a training loop would never step
            raise ShapeError(f"{type(self).__name__}: {self.samples_per_rank} samples per rank "
                             f"({self.num_samples} over world_size={self.world_size}) make no "
                             f"full batch of batch_size={self.batch_size} with drop_last=True; "
                             "use a smaller batch or drop_last=False")

    @property
    def samples_per_rank(self) -> int:
        """Samples this rank sees per epoch (padding included)."""
        return math.ceil(self.num_samples / self.world_size)

    def __len__(self) -> int:
        if self.drop_last:
            return self.samples_per_rank // self.batch_size
        return math.ceil(self.samples_per_rank / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (its own shuffle) from its first batch; but right after
        ``load_state_dict`` put the loader inside that very epoch, go on from where it stands:
        a resumed ``for epoch in range(saved, E): loader.set_epoch(epoch)`` loop would
        otherwise train the interrupted epoch's first batches twice. Likewise, right after
        it loaded a state taken at ``epoch``'s last batch (which points at the start of
        ``epoch + 1``), the pass of ``epoch`` yields nothing: that epoch was done. Called
        again with the same epoch before the loader moves, it changes nothing more, as
        ``DistributedSampler.set_epoch`` sets an attribute."""
        _check_int("epoch", epoch, minimum=0)
        if self._resumed == epoch or (self._finished and self.epoch == epoch):
            # still right after the load: a second set_epoch(epoch) (the resume code's and the
            # loop's own) would otherwise train the loaded epoch's first batches again
            return
        resumed, self._resumed = self._resumed, None
        self._finished = False
        # A loop that saves its own epoch beside state_dict() at that epoch's last batch
        # resumes with set_epoch of the finished epoch: its pass must not train it again.
        finished = resumed == epoch + 1 and self.batch_index == 0
        self.epoch = int(epoch)
        self.batch_index = len(self) if finished else 0
        self._finished = finished

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """The sample indices this rank visits in ``epoch`` (default: the current one)."""
        epoch = self.epoch if epoch is None else epoch
        order = epoch_permutation(self.num_samples, self.seed, epoch, self.shuffle)
        share = distributed_indices(order, self.rank, self.world_size)
        if self.drop_last:
            share = share[:len(self) * self.batch_size]
        return share

    def __iter__(self) -> Iterator[Any]:
        self._resumed = None                     # moving on: set_epoch starts afresh again
        finished, self._finished = self._finished, False
        if 0 < len(self) <= self.batch_index and not finished:
            # the last pass stopped after its last batch: this one is the next epoch's
            self.epoch, self.batch_index = self.epoch + 1, 0
        share, order_of = self.indices(), (self.epoch, self.seed)
        while self.batch_index < len(self):
            if (self.epoch, self.seed) != order_of:
                # load_state_dict or set_epoch moved the loader while this pass ran (a run
                # rolled back to a checkpoint inside its loop): go on from where it points
                # now, in that epoch's order, not with the stale order of the pass.
                share, order_of = self.indices(), (self.epoch, self.seed)
            start = self.batch_index * self.batch_size
            batch = self._batch(share[start:start + self.batch_size])
            # Counted once made (a batch whose dataset raised, a Ctrl-C in its collate, was not
            # handed out: the next pass fetches it again) and before the yield (state_dict()
            # taken while the caller holds this batch must say it was handed out).
            self.batch_index += 1
            yield batch
        self.epoch, self.batch_index = self.epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands, as a JSON-able dict: resume with ``load_state_dict``.

        A state taken after the last batch of epoch ``e`` points at the start of ``e + 1``.
        """
        epoch, batch_index = self.epoch, self.batch_index
        if 0 < len(self) <= batch_index:
            epoch, batch_index = epoch + 1, 0
        return {"version": STATE_VERSION, "epoch": epoch, "batch_index": batch_index,
                "seed": self.seed, "shuffle": self.shuffle, "batch_size": self.batch_size,
                "drop_last": self.drop_last, "num_samples": self.num_samples,
                "world_size": self.world_size, "rank": self.rank}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state_dict()``: the next ``iter()`` yields the rest of the interrupted
        epoch, later epochs follow as in an uninterrupted run.

        The seed is taken from ``state``. Batch size, sample count, world size, shuffle and
        drop_last must match this loader. ``rank`` may differ, so rank 0's saved state can be
        loaded by every rank (all ranks stand at the same epoch and batch).
        """
        missing = [k for k in ("epoch", "batch_index", "seed") if k not in state]
        if missing:
            raise ValueError(f"DataLoader.load_state_dict: state lacks {missing}; "
                             f"pass what DataLoader.state_dict() returned")
        mine = self.state_dict()
        for key in ("num_samples", "batch_size", "world_size", "shuffle", "drop_last"):
            if key in state and state[key] != mine[key]:
                raise ShapeError(f"DataLoader.load_state_dict: the state was saved with "
                                 f"{key}={state[key]!r} but this loader has {key}={mine[key]!r}; "
                                 f"resume with the same data and settings")
        _check_int("seed", state["seed"], minimum=0)
        _check_int("epoch", state["epoch"], minimum=0)
        _check_int("batch_index", state["batch_index"], minimum=0)
        if state["batch_index"] > len(self):
            raise ShapeError(f"DataLoader.load_state_dict: batch_index={state['batch_index']} "
                             f"is past the {len(self)} batches of an epoch")
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self.batch_index = int(state["batch_index"])
        self._resumed, self._finished = self.epoch, False

    def __repr__(self) -> str:
        return (f"DataLoader(num_samples={self.num_samples}, batch_size={self.batch_size}, "
                f"shuffle={self.shuffle}, seed={self.seed}, drop_last={self.drop_last}, "
                f"rank={self.rank}, world_size={self.world_size}, epoch={self.epoch}, "
                f"batch_index={self.batch_index})")


def _check_int(name: str, value: Any, minimum: int, op: str = "DataLoader") -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{op}: {name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ShapeError(f"{op}: {name}={value} must be >= {minimum}")


def _check_rank(op: str, rank: Any, world_size: Any) -> None:
    _check_int("world_size", world_size, minimum=1, op=op)
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) \
            or not 0 <= rank < world_size:
        raise ShapeError(f"{op}: rank={rank!r} is outside [0, world_size={world_size})")


def load_digits(images: bool = False, test_fraction: float = 0.2, seed: int = 0
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The 1797 8x8 handwritten digits bundled with scikit-learn (no download), split into a
    seeded, stratified train and test set: every class keeps its share in both.

    Returns ``(x_train, y_train, x_test, y_test)``: float32 pixels scaled to [0, 1], shaped
    ``(N, 64)``, or ``(N, 1, 8, 8)`` with ``images=True``; int64 labels 0..9.

    >>> x_train, y_train, x_test, y_test = load_digits()
    >>> x_train.shape, x_test.shape, x_train.dtype, y_train.dtype
    ((1438, 64), (359, 64), dtype('float32'), dtype('int64'))
    """
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError as e:
        raise ImportError("parcl.data.load_digits needs scikit-learn, which ships the digits: "
                          "pip install 'parcl[data]'") from e
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"load_digits: test_fraction={test_fraction} must be in [0, 1)")
    digits = sklearn_digits()
    x = (np.asarray(digits.data, dtype=np.float32) / np.float32(16.0))
    y = np.asarray(digits.target, dtype=np.int64)
    if images:
        x = x.reshape(-1, 1, 8, 8)
    rng = np.random.default_rng(seed)
    train, test = [], []
    for label in np.unique(y):
        members = rng.permutation(np.flatnonzero(y == label))
        n_test = round(len(members) * test_fraction)
        test.append(members[:n_test])
        train.append(members[n_test:])
    # Shuffle across classes too, so a plain un-shuffled loader still sees mixed batches.
    train = rng.permutation(np.concatenate(train))
    test = rng.permutation(np.concatenate(test))
    return (np.ascontiguousarray(x[train]), y[train],
            np.ascontiguousarray(x[test]), y[test])


# character-level text from the standard library's sources (transformers); the result types
# (TextCorpus, UnigramBaseline) stay in parcl.data_text
from .data_text import CharVocab, TextLoader, text_corpus  # noqa: E402

__all__ += ["CharVocab", "TextLoader", "text_corpus"]
