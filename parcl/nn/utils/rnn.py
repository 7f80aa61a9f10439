"""Sequences of different lengths for the recurrent layers (``pc.nn.utils.rnn``), as
``torch.nn.utils.rnn``: ``pad_sequence`` stacks them into one padded batch, and a
``PackedSequence`` holds a batch without its padding, so ``RNN``, ``LSTM`` and ``GRU`` stop each
sequence at its own length (its final state is the one after its last element, and a reverse
direction starts at that element).

A ``PackedSequence``'s ``data`` holds the sequences' elements step by step: step ``t``'s elements
of the ``batch_sizes[t]`` sequences that are that long, longest first. Packing and unpacking
are one ``index_select`` each (differentiable); ``batch_sizes``, ``sorted_indices`` and
``unsorted_indices`` are int64 numpy arrays on the host, where PyTorch keeps ``batch_sizes``
too (its lengths must be on the CPU as well: a ``pc.Tensor`` of lengths is read back).

>>> import numpy as np, parcl as pc, parcl.tape as tp
>>> from parcl.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
>>> x = tp.tensor(np.ones((3, 4, 2), np.float32))          # (batch, time, features)
>>> packed = pack_padded_sequence(x, [4, 1, 2], batch_first=True, enforce_sorted=False)
>>> packed.batch_sizes.tolist(), packed.data.shape
([3, 2, 1, 1], (7, 2))
>>> out, (h_n, c_n) = pc.nn.LSTM(2, 5, batch_first=True)(packed)
>>> padded, lengths = pad_packed_sequence(out, batch_first=True)
>>> padded.shape, lengths.tolist()
((3, 4, 5), [4, 1, 2])
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ...errors import ParclError, ShapeError
from ...runtime import default_queue
from ...tape import ops
from ...tape.node import Node
from ...tape.ops.picks import constant
from ...tensor import FLOAT, Tensor

__all__ = ["PackedSequence", "pack_padded_sequence", "pack_sequence", "pad_packed_sequence",
           "pad_sequence", "unpack_sequence", "unpad_sequence"]


class PackedSequence(NamedTuple):
    """A batch of sequences without padding (see the module docstring): ``data``
    ``(sum of lengths, *)``, ``batch_sizes`` (sequences still running at each step), and the
    permutation that sorted the batch by length (None when it came sorted)."""

    data: Any
    batch_sizes: np.ndarray
    sorted_indices: np.ndarray | None = None
    unsorted_indices: np.ndarray | None = None


def _queue(x):
    return (x.value if isinstance(x, Node) else x).queue


def _as_input(x):
    """A Node or Tensor as it is; a numpy array (float64 as float32) uploaded."""
    if isinstance(x, (Node, Tensor)):
        return x
    array = np.asarray(x)
    return Tensor.from_host(default_queue(), array.astype(FLOAT) if array.dtype == np.float64
                            else array)


def _lengths(op: str, lengths, batch: int, steps: int) -> np.ndarray:
    if isinstance(lengths, Node):
        lengths = lengths.value
    host = lengths.to_host() if isinstance(lengths, Tensor) else np.asarray(lengths)
    if host.ndim != 1 or host.size != batch or not np.issubdtype(host.dtype, np.integer):
        raise ShapeError(f"{op}: lengths must be {batch} integers (one per sequence), got "
                         f"{host.dtype} of shape {host.shape}")
    if host.min() < 1:
        raise ShapeError(f"{op}: every length must be at least 1 (PyTorch's 'Length of all "
                         f"samples has to be greater than 0'), got {host.tolist()}")
    if host.max() > steps:
        raise ShapeError(f"{op}: a length of {int(host.max())} is more than the input's "
                         f"{steps} steps")
    return host.astype(np.int64)


def _batch_sizes(lengths: np.ndarray) -> np.ndarray:
    """Sequences at least ``t + 1`` long, for each step ``t``."""
    return (lengths[None, :] > np.arange(int(lengths.max()))[:, None]).sum(1).astype(np.int64)


def packed_rows(batch_sizes: np.ndarray, batch: int) -> np.ndarray:
    """The row of a ``(T * batch, *)`` padded (time-major, sorted) batch behind each packed
    element, step by step."""
    return np.concatenate([t * batch + np.arange(b) for t, b in enumerate(batch_sizes)])


def pad_sequence(sequences, batch_first: bool = False, padding_value: float = 0.0,
                 padding_side: str = "right"):
    """``(T, B, *)`` (``(B, T, *)`` with ``batch_first``) from ``B`` sequences ``(L_i, *)``
    (Nodes, Tensors or arrays of one dtype and trailing shape), each padded with
    ``padding_value`` to the longest ``T`` on its ``padding_side`` ("right" or "left")."""
    if padding_side not in ("right", "left"):
        raise ParclError(f"pad_sequence: padding_side must be 'right' or 'left', got "
                         f"{padding_side!r}")
    sequences = [_as_input(s) for s in sequences]
    if not sequences:
        raise ShapeError("pad_sequence: no sequences given")
    rest = tuple(sequences[0].shape[1:])
    for s in sequences:
        if len(s.shape) < 1 or tuple(s.shape[1:]) != rest:
            raise ShapeError(f"pad_sequence: sequences must share their trailing shape; got "
                             f"{[tuple(x.shape) for x in sequences]}")
    steps = max(s.shape[0] for s in sequences)
    padded = []
    for s in sequences:
        missing = steps - s.shape[0]
        if missing:
            value = s.value if isinstance(s, Node) else s
            fill = Tensor.full(value.queue, (missing, *rest), padding_value, value.dtype)
            s = ops.cat([s, fill] if padding_side == "right" else [fill, s], 0)
        padded.append(s)
    return ops.stack(padded, 0 if batch_first else 1)


def pack_padded_sequence(input, lengths, batch_first: bool = False,  # noqa: A002
                         enforce_sorted: bool = True) -> PackedSequence:
    """A ``PackedSequence`` of the padded batch ``input`` ``(T, B, *)`` (``(B, T, *)`` with
    ``batch_first``), sequence ``i`` being ``lengths[i]`` long. With ``enforce_sorted`` the
    lengths must not increase (else a ``ParclError``, as PyTorch's); without, the batch is
    sorted longest first (stably) and the permutation kept to undo it."""
    input = _as_input(input)
    if len(input.shape) < 2:
        raise ShapeError(f"pack_padded_sequence: input of shape {tuple(input.shape)} has no "
                         "batch and time dims")
    if batch_first:
        input = ops.movedim(input, 0, 1)
    steps, batch = input.shape[0], input.shape[1]
    lengths = _lengths("pack_padded_sequence", lengths, batch, steps)
    sorted_indices = unsorted_indices = None
    if enforce_sorted:
        if np.any(np.diff(lengths) > 0):
            raise ParclError(f"pack_padded_sequence: lengths {lengths.tolist()} are not sorted "
                             "longest first; sort the batch or pass enforce_sorted=False")
    else:
        sorted_indices = np.argsort(-lengths, kind="stable").astype(np.int64)
        unsorted_indices = np.argsort(sorted_indices).astype(np.int64)
        lengths = lengths[sorted_indices]
        input = ops.index_select(input, 1, constant(_queue(input), sorted_indices))
    batch_sizes = _batch_sizes(lengths)
    flat = ops.reshape(input, (steps * batch, *input.shape[2:]))
    rows = constant(_queue(input), packed_rows(batch_sizes, batch))
    return PackedSequence(ops.index_select(flat, 0, rows), batch_sizes, sorted_indices,
                          unsorted_indices)


def pad_packed_sequence(sequence: PackedSequence, batch_first: bool = False,
                        padding_value: float = 0.0, total_length: int | None = None):
    """``(padded, lengths)``: the packed batch padded with ``padding_value`` to its longest
    sequence (or to ``total_length`` steps), in the order it had before packing, and each
    sequence's length (an int64 numpy array; PyTorch's is a CPU tensor)."""
    data, batch_sizes = sequence.data, np.asarray(sequence.batch_sizes, np.int64)
    batch, steps = int(batch_sizes[0]), len(batch_sizes)
    if total_length is not None:
        if total_length < steps:
            raise ShapeError(f"pad_packed_sequence: total_length={total_length} is less than "
                             f"the longest sequence's {steps} steps")
        steps = int(total_length)
    rest = tuple(data.shape[1:])
    value = data.value if isinstance(data, Node) else data
    fill = Tensor.full(value.queue, (1, *rest), padding_value, value.dtype)
    # each padded position's packed element, or the fill row after the last one
    where = np.full((steps, batch), data.shape[0], np.int64)
    where.reshape(-1)[packed_rows(batch_sizes, batch)] = np.arange(data.shape[0])
    padded = ops.index_select(ops.cat([data, fill], 0), 0,
                              constant(value.queue, where.reshape(-1)))
    padded = ops.reshape(padded, (steps, batch, *rest))
    lengths = (batch_sizes[None, :] > np.arange(batch)[:, None]).sum(1).astype(np.int64)
    if sequence.unsorted_indices is not None:
        padded = ops.index_select(padded, 1, constant(value.queue,
                                                      np.asarray(sequence.unsorted_indices)))
        lengths = lengths[sequence.unsorted_indices]
    return (ops.movedim(padded, 0, 1) if batch_first else padded), lengths


def pack_sequence(sequences, enforce_sorted: bool = True) -> PackedSequence:
    """``pack_padded_sequence`` of ``pad_sequence(sequences)`` with their lengths."""
    sequences = [_as_input(s) for s in sequences]
    return pack_padded_sequence(pad_sequence(sequences), [s.shape[0] for s in sequences],
                                enforce_sorted=enforce_sorted)


def unpad_sequence(padded_sequences, lengths, batch_first: bool = False) -> list:
    """The sequences of a padded batch, each cut to its length."""
    padded = _as_input(padded_sequences)
    if batch_first:
        padded = ops.movedim(padded, 0, 1)
    lengths = _lengths("unpad_sequence", lengths, padded.shape[1], padded.shape[0])
    return [padded[:int(n), i] for i, n in enumerate(lengths)]


def unpack_sequence(packed_sequences: PackedSequence) -> list:
    """The sequences of a ``PackedSequence``, in the order they were packed from."""
    padded, lengths = pad_packed_sequence(packed_sequences)
    return unpad_sequence(padded, lengths)
