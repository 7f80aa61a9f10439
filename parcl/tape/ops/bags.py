"""PyTorch's ``embedding_bag``: the rows of ``weight`` picked by each bag of indices, summed,
averaged or maximised, without the ``(bags, positions, D)`` tensor in between. The lookup is
``tp.embedding`` (its index check, ``max_norm``, and a backward that adds repeated rows in a
fixed order); per-sample weights multiply the looked-up rows (their gradient is the tape's);
the bag reduction is one kernel each way (``parcl/kernels/embedding_bag.py``).

Offsets given as a numpy array or a list are checked on the host at the call; a device tensor of
offsets is checked on the device, as an embedding's indices are: a ``ShapeError`` naming the
bad entry at once when the op is not recorded, else in the backward or at the first host read
of the result.

>>> w = tp.tensor(np.arange(12, dtype=np.float32).reshape(6, 2))
>>> idx = pc.Tensor.from_host(q, np.array([1, 2, 4, 5]))
>>> tp.embedding_bag(idx, w, np.array([0, 1]), mode="sum").to_host()
array([[ 2.,  3.],
       [22., 25.]], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from ...errors import DTypeError, ParclError, ShapeError
from ...kernels import embedding_bag as ebk
from ...tensor import LABEL_DTYPES, Tensor
from ..node import Function, Node
from ..tape import defer
from .checks import FlagCheck
from .elementwise import mul
from .picks import constant
from .select import embedding, padding_row
from .shape import reshape

__all__ = ["embedding_bag"]


class _OffsetsCheck(FlagCheck):
    """The first bag whose offset is bad (or ``NO_ERROR``), as a ShapeError naming it."""

    description = "embedding_bag's offsets check"

    def __init__(self, flag: Tensor, offsets: Tensor, n: int):
        self.offsets, self.n = offsets, n
        super().__init__(flag)

    def error(self, host: np.ndarray) -> ShapeError | None:
        if int(host[0]) == ebk.NO_ERROR:
            return None
        return offsets_error(self.offsets.to_host(), self.n)


def offsets_error(offsets: np.ndarray, n: int) -> ShapeError | None:
    """What PyTorch says of ``offsets`` into an input of ``n`` indices, or None if they are
    good: the first starts at 0, none decreases, none passes ``n``."""
    offsets = np.asarray(offsets).reshape(-1)
    if offsets[0] != 0:
        return ShapeError(f"embedding_bag: offsets[0] has to be 0, i.e., the first sequence in "
                          f"the mini-batch has to start from position 0, got {offsets[0]}")
    down = np.nonzero(np.diff(offsets) < 0)[0]
    if down.size:
        b = int(down[0]) + 1
        return ShapeError(f"embedding_bag: offsets must not decrease, got offsets[{b}] = "
                          f"{offsets[b]} after offsets[{b - 1}] = {offsets[b - 1]}")
    if offsets.max() > n:
        return ShapeError(f"embedding_bag: offsets[-1] can not be greater than input's length "
                          f"{n}, got {offsets.max()}")
    return None


class BagReduce(Function):
    """The rows (n, D) of positions grouped into bags by offsets, reduced by ``mode``."""

    name = "embedding_bag"

    def forward(self, rows: Tensor, indices: Tensor, offsets: Tensor, bags: int = 1,
                pad: int = -1, mode: str = "mean", host_checked: bool = False):
        out, pick, counts, flag = ebk.bag_forward(rows, indices, offsets, bags, pad, mode)
        check = None
        if not host_checked:
            check = _OffsetsCheck(flag, offsets, rows.shape[0])
            check.guard(out, not self.recording)
        if self.recording:
            self.saved = (indices, offsets, pick, counts, rows.shape[0], pad, mode, check)
        return out

    def backward(self, g: Tensor):
        indices, offsets, pick, counts, n, pad, mode, check = self.saved
        if check is not None:
            defer(check.check)
        grows = ebk.bag_backward(g, indices, offsets, pick, counts, n, pad, mode)
        return grows, None, None


def _raw(op: str, name: str, t, queue, required: bool = True):
    """``t`` as a raw int Tensor on ``queue`` (a numpy array or list uploaded), or None."""
    if t is None:
        return None
    if isinstance(t, Node):
        t = t.value
    if not isinstance(t, Tensor):
        t = np.asarray(t)
        if t.dtype.kind not in "iu":
            raise DTypeError(f"{op}: {name} of shape {t.shape} has dtype {t.dtype}, expected "
                             "int32 or int64")
        t = Tensor.from_host(queue, t.astype(np.int64))
    if t.dtype not in LABEL_DTYPES:
        raise DTypeError(f"{op}: {name} of shape {t.shape} has dtype {t.dtype}, expected "
                         "int32 or int64")
    return t


def embedding_bag(input, weight, offsets=None, max_norm: float | None = None,  # noqa: A002
                  norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                  mode: str = "mean", sparse: bool = False, per_sample_weights=None,
                  include_last_offset: bool = False, padding_idx: int | None = None, *,
                  tape=None):
    """``F.embedding_bag``: for each bag, the ``mode`` (``"sum"``, ``"mean"`` or ``"max"``)
    of the rows of ``weight`` (V, D) its indices pick: ``(bags, D)``. ``input`` is 2-D
    ``(B, N)`` (each row a bag of N; ``offsets`` None) or 1-D with ``offsets`` (1-D: bag ``b``
    starts at ``offsets[b]``, the first at 0; with ``include_last_offset`` the last entry
    ends the last bag, else the input's end does). ``per_sample_weights`` (``input``'s shape;
    ``"sum"`` only) weigh each row. Indices equal to ``padding_idx`` are left out of their bag
    (not counted by the mean); an empty bag gives zeros. ``max_norm`` as ``tp.embedding``'s;
    ``scale_grad_by_freq`` and ``sparse`` refused. The maximum's gradient goes to the first
    of tied rows, as PyTorch's.

    >>> tp.embedding_bag(idx, w, np.array([0, 1]), mode="max").to_host()     # as above
    array([[ 2.,  3.],
           [10., 11.]], dtype=float32)
    """
    op = "embedding_bag"
    if mode not in ebk.MODES:
        raise ParclError(f"{op}: mode has to be one of 'sum', 'mean' or 'max', got {mode!r}")
    if scale_grad_by_freq or sparse:
        raise ShapeError(f"{op}: scale_grad_by_freq and sparse are not supported, got "
                         f"scale_grad_by_freq={scale_grad_by_freq!r}, sparse={sparse!r}")
    if not isinstance(weight, (Node, Tensor)) or weight.ndim != 2:
        raise ShapeError(f"{op}: weight must be a 2-D (num_embeddings, embedding_dim) tensor, "
                         f"got {getattr(weight, 'shape', type(weight).__name__)}")
    queue = weight.queue
    indices = _raw(op, "input", input, queue)
    shape = tuple(indices.shape)
    if per_sample_weights is not None:
        if mode != "sum":
            raise ParclError(f"{op}: per_sample_weights was not None. per_sample_weights is "
                             f"only supported for mode='sum' (got mode={mode!r}), as PyTorch")
        if tuple(per_sample_weights.shape) != shape:
            raise ShapeError(f"{op}: per_sample_weights of shape "
                             f"{tuple(per_sample_weights.shape)} must have the input's shape "
                             f"{shape}")
    if len(shape) == 2:
        if offsets is not None:
            raise ShapeError(f"{op}: if input is 2D, then offsets has to be None, as offset is "
                             f"treated as a mini-batch of fixed length sequences; got input "
                             f"{shape} and offsets")
        bags, n = shape[0], shape[0] * shape[1]
        offsets = constant(queue, np.arange(0, n, shape[1], dtype=np.int64))
        host_checked = True
    elif len(shape) == 1:
        if offsets is None:
            raise ShapeError(f"{op}: offsets has to be a 1D Tensor but got None (input "
                             f"{shape} is 1-D)")
        host_checked = not isinstance(offsets, (Node, Tensor))
        n = shape[0]
        if host_checked:
            host = np.asarray(offsets).reshape(-1) if np.ndim(offsets) == 1 else None
            if host is None or host.size == 0:
                raise ShapeError(f"{op}: offsets has to be a non-empty 1D tensor, got "
                                 f"{np.shape(offsets)}")
            error = offsets_error(host, n)
            if error is not None:
                raise error
        offsets = _raw(op, "offsets", offsets, queue)
        if offsets.ndim != 1:
            raise ShapeError(f"{op}: offsets has to be a 1D Tensor, got shape {offsets.shape}")
        # include_last_offset with one offset: it ends no bag, so there are none, (0, D)
        bags = offsets.size - (1 if include_last_offset else 0)
    else:
        raise ShapeError(f"{op}: input has to be 1D or 2D Tensor, but got Tensor of dimension "
                         f"{len(shape)} (shape {shape})")
    pad = padding_row(op, padding_idx, weight.shape[0])
    flat = indices.reshape((n,))
    rows = embedding(flat, weight, padding_idx=None if pad < 0 else pad, max_norm=max_norm,
                     norm_type=norm_type, tape=tape)
    if per_sample_weights is not None:
        rows = mul(rows, reshape(per_sample_weights, (n, 1), tape=tape), tape=tape)
    return BagReduce.apply(rows, flat, offsets, tape=tape, bags=bags, pad=pad, mode=mode,
                           host_checked=host_checked)
