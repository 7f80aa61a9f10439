"""Shape ops: ``reshape`` and ``transpose`` (numpy semantics), and PyTorch's ``permute``,
``movedim``, ``t``, ``squeeze``, ``unsqueeze``, ``flatten`` and ``unflatten``.

Every op that only changes the shape (``reshape``, ``squeeze``, ``unsqueeze``, ``flatten``,
``unflatten``, and a ``permute`` that moves size-1 dimensions only) returns a zero-copy view of
its input's buffer, as ``reshape`` does, forward and backward: ``Function.apply`` marks such an
output as an alias of its input, so in-place changes through it are tracked like reshape's. A
real permutation is a copy (``parcl.kernels.layout``; a strided copy for 8-byte dtypes); its
backward applies the inverse permutation.

Dimensions follow PyTorch: negative from the end, and a 0-d tensor accepts dim 0 and -1 where
PyTorch does (``squeeze``, ``flatten``).

>>> x = tp.tensor(pc.Tensor.from_host(q, np.ones((2, 3), np.float32)), requires_grad=True)
>>> tp.transpose(tp.reshape(x, (3, 2))).shape
(2, 3)
>>> tp.permute(tp.unsqueeze(x, 0), (2, 0, 1)).shape, tp.flatten(x).shape
((3, 1, 2), (6,))
"""

from __future__ import annotations

from math import prod

from ...errors import ShapeError
from ...kernels import layout, strided
from ...kernels.layout import permuted
from ...kernels.strided import axis_int
from ...tensor import Tensor, dims
from ..node import Function

__all__ = ["flatten", "movedim", "permute", "reshape", "squeeze", "t",
           "transpose", "unflatten", "unsqueeze"]


class Reshape(Function):
    name = "reshape"

    def forward(self, x, shape):
        self.in_shape = x.shape
        return x.reshape(shape)

    def backward(self, g):
        return g.reshape(self.in_shape)


class Transpose(Function):
    name = "transpose"

    def forward(self, x, axes=None):
        self.perm = layout.normalize_axes(axes, x.ndim, x.shape)
        return strided.view_copy(layout.transpose(x, self.perm), x, self.name)

    def backward(self, g):
        inverse = [0] * len(self.perm)
        for i, a in enumerate(self.perm):
            inverse[a] = i
        return layout.transpose(g, inverse)


def reshape(x, shape, *, tape=None):
    """``x`` viewed with a new shape (one dimension may be -1); no copy."""
    if isinstance(shape, int):
        shape = (shape,)
    return Reshape.apply(x, tape=tape, shape=tuple(shape))


def transpose(x, axes=None, dim1=None, *, dim0=None, tape=None):
    """``x`` with its axes permuted (``axes=None`` reverses them), as ``np.transpose``; two
    dims, ``transpose(x, dim0, dim1)`` (or by keyword), exchanged, as ``torch.transpose``
    (a ``permute``: a copy unless only size-1 dims move).

    >>> tp.transpose(x[None], 0, -1).shape
    (3, 2, 1)
    """
    if dim0 is not None:
        if axes is not None:
            raise TypeError("transpose: axes and dim0 given both; they are one argument")
        axes = dim0
    if dim1 is None:
        if dim0 is not None:
            raise TypeError("transpose: dim0 without dim1; torch.transpose exchanges two dims")
        return Transpose.apply(x, tape=tape, axes=axes)
    shape = tuple(x.shape)
    n = len(shape)
    a, b = wrap_dim("transpose", axes, n, shape), wrap_dim("transpose", dim1, n, shape)
    order = list(range(n))
    if n:
        order[a], order[b] = b, a
    return permute(x, tuple(order), tape=tape)


# -- PyTorch's dimension rules ------------------------------------------------------------------
def wrap_dim(op: str, dim, ndim: int, shape) -> int:
    """``dim`` in ``[0, ndim)`` by PyTorch's rule: negative counts from the end, and a 0-d
    tensor takes 0 and -1 (as if it had one dimension); else a ShapeError naming the range."""
    dim = axis_int(op, dim, shape)
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise ShapeError(f"{op}: dim {dim} is out of range for a tensor of shape "
                         f"{tuple(shape)} (expected a dim in [{-n}, {n - 1}])")
    return dim % n


def wrap_dims(op: str, dim, ndim: int, shape) -> tuple[int, ...]:
    """An int or a sequence of ints, each wrapped (``wrap_dim``); a dim named twice is a
    ShapeError, as PyTorch refuses it."""
    given = (dim,) if not isinstance(dim, (tuple, list)) else tuple(dim)
    out = tuple(wrap_dim(op, d, ndim, shape) for d in given)
    if len(set(out)) != len(out):
        raise ShapeError(f"{op}: dims {given} name a dimension twice (shape {tuple(shape)})")
    return out


def _inverse(perm) -> tuple[int, ...]:
    inverse = [0] * len(perm)
    for i, a in enumerate(perm):
        inverse[a] = i
    return tuple(inverse)


class Permute(Function):
    name = "permute"

    def forward(self, x: Tensor, dims=()):
        self.perm = self.order(x.shape, dims)
        return strided.view_copy(permuted(x, self.perm), x, self.name)

    def backward(self, g: Tensor):
        return permuted(g, _inverse(self.perm))

    def order(self, shape, dims) -> tuple[int, ...]:
        ndim = len(shape)
        given = tuple(dims)
        if len(given) != ndim:
            raise ShapeError(f"permute: dims {given} name {len(given)} dimensions, the tensor "
                             f"has {ndim} (shape {shape})")
        perm = tuple(wrap_dim("permute", d, ndim, shape) for d in given) if ndim else ()
        if len(set(perm)) != len(perm):
            raise ShapeError(f"permute: dims {given} repeat a dimension (shape {shape})")
        return perm


class MoveDim(Permute):
    name = "movedim"

    def order(self, shape, dims) -> tuple[int, ...]:
        source, destination = dims
        ndim = len(shape)
        src = wrap_dims("movedim", source, ndim, shape)
        dst = wrap_dims("movedim", destination, ndim, shape)
        if len(src) != len(dst):
            raise ShapeError(f"movedim: source {source} and destination {destination} must "
                             f"name as many dims (shape {shape})")
        if ndim == 0:
            return ()
        perm = [-1] * ndim
        for s, d in zip(src, dst):
            perm[d] = s
        rest = iter(k for k in range(ndim) if k not in src)     # the others keep their order
        return tuple(p if p >= 0 else next(rest) for p in perm)


class T(Permute):
    name = "t"

    def order(self, shape, dims) -> tuple[int, ...]:
        if len(shape) > 2:
            raise ShapeError(f"t: expects a tensor with at most 2 dimensions, got shape {shape}"
                             "; use tp.permute or tp.transpose")
        return tuple(range(len(shape)))[::-1]


def permute(x, dims, *, tape=None):
    """``torch.permute``: the dimensions of ``x`` in the order ``dims`` (a permutation of all
    of them, negative from the end). A copy unless only size-1 dimensions move (then a view).
    op_name ``"permute"``.

    >>> tp.permute(x, (1, 0)).shape            # x (2, 3)
    (3, 2)
    """
    return Permute.apply(x, tape=tape, dims=tuple(dims) if isinstance(dims, (tuple, list))
                         else (dims,))


def movedim(x, source, destination, *, tape=None):
    """``torch.movedim``: the dims ``source`` (an int or a sequence) moved to the positions
    ``destination``; the others keep their order. op_name ``"movedim"``.

    >>> tp.movedim(tp.unsqueeze(x, 0), 0, -1).shape
    (2, 3, 1)
    """
    return MoveDim.apply(x, tape=tape, dims=(source, destination))


def t(x, *, tape=None):
    """``torch.t``: a 2-D tensor transposed; 0-D and 1-D returned as they are (a view). More
    dimensions are a ShapeError. op_name ``"t"``.

    >>> tp.t(x).shape
    (3, 2)
    """
    return T.apply(x, tape=tape)


# -- views: the same buffer with another shape ---------------------------------------------------
class _View(Reshape):
    """A zero-copy reshape whose new shape ``new_shape(shape, **options)`` computes."""

    def forward(self, x, **options):
        self.in_shape = x.shape
        return x.reshape(self.new_shape(x.shape, **options))


class Squeeze(_View):
    name = "squeeze"

    @staticmethod
    def new_shape(shape, dim=None):
        if dim is None:
            return tuple(s for s in shape if s != 1)
        drop = wrap_dims("squeeze", dim, len(shape), shape)
        return tuple(s for k, s in enumerate(shape) if not (k in drop and s == 1))


class Unsqueeze(_View):
    name = "unsqueeze"

    @staticmethod
    def new_shape(shape, dim=0):
        at = wrap_dim("unsqueeze", dim, len(shape) + 1, shape)
        return (*shape[:at], 1, *shape[at:])


class Flatten(_View):
    name = "flatten"

    @staticmethod
    def new_shape(shape, start_dim=0, end_dim=-1):
        start = wrap_dim("flatten", start_dim, len(shape), shape)
        end = wrap_dim("flatten", end_dim, len(shape), shape)
        if start > end:
            raise ShapeError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} "
                             f"(shape {shape})")
        if not shape:
            return (1,)
        return (*shape[:start], prod(shape[start:end + 1]), *shape[end + 1:])


class Unflatten(_View):
    name = "unflatten"

    @staticmethod
    def new_shape(shape, dim=0, sizes=()):
        if not shape:
            raise ShapeError("unflatten: a 0-d tensor has no dimension to unflatten")
        at = wrap_dim("unflatten", dim, len(shape), shape)
        sizes = dims("unflatten", sizes)
        n = shape[at]
        if not sizes:
            raise ShapeError(f"unflatten: sizes must be non-empty (shape {shape}, dim {dim})")
        if sizes.count(-1) > 1 or any(s < -1 for s in sizes):
            raise ShapeError(f"unflatten: sizes {sizes} may hold one -1 and no other negative "
                             f"size (shape {shape})")
        known = prod(s for s in sizes if s != -1)
        if -1 in sizes and known and n % known == 0:
            sizes = tuple(n // known if s == -1 else s for s in sizes)
        if prod(sizes) != n or -1 in sizes:
            raise ShapeError(f"unflatten: sizes {sizes} do not multiply up to {n}, the size "
                             f"of dim {at} (shape {shape})")
        return (*shape[:at], *sizes, *shape[at + 1:])


def squeeze(x, dim=None, *, tape=None):
    """``torch.squeeze``: ``x`` without its size-1 dimensions (``dim``: only those named, an
    int or a tuple; a named dimension of another size stays). A view. op_name ``"squeeze"``.

    >>> tp.squeeze(tp.reshape(x, (2, 1, 3))).shape, tp.squeeze(x, 0).shape
    ((2, 3), (2, 3))
    """
    return Squeeze.apply(x, tape=tape, dim=dim)


def unsqueeze(x, dim, *, tape=None):
    """``torch.unsqueeze``: a new size-1 dimension at ``dim`` (in ``[-ndim-1, ndim]``). A
    view. op_name ``"unsqueeze"``.

    >>> tp.unsqueeze(x, -1).shape
    (2, 3, 1)
    """
    return Unsqueeze.apply(x, tape=tape, dim=dim)


def as_batched(op: str, x, dims: str, *, tape=None):
    """``x`` with a batch dim, and whether it had one: PyTorch's unbatched input (its dims
    named by ``dims``, e.g. ``"C, H, W"``) gains N=1, a recorded view ``unbatch`` removes."""
    shape, n = tuple(x.shape), dims.count(",") + 1
    if len(shape) not in (n, n + 1):
        raise ShapeError(f"{op}: expected a {n}-d ({dims}) or {n + 1}-d (N, {dims}) input, got "
                         f"shape {shape}")
    return (x, True) if len(shape) == n + 1 else (unsqueeze(x, 0, tape=tape), False)


def unbatch(y, batched: bool, *, tape=None):
    """``y`` without the batch dim ``as_batched`` gave an unbatched input."""
    return y if batched else squeeze(y, 0, tape=tape)


def flatten(x, start_dim: int = 0, end_dim: int = -1, *, tape=None):
    """``torch.flatten``: dims ``start_dim .. end_dim`` merged into one (a 0-d tensor becomes
    1-D). A view. op_name ``"flatten"``.

    >>> tp.flatten(tp.reshape(x, (1, 2, 3)), 1).shape
    (1, 6)
    """
    return Flatten.apply(x, tape=tape, start_dim=start_dim, end_dim=end_dim)


def unflatten(x, dim: int, sizes, *, tape=None):
    """``torch.unflatten``: dim ``dim`` split into ``sizes`` (one of them may be -1). A view.
    op_name ``"unflatten"``.

    >>> tp.unflatten(x, 1, (3, 1)).shape
    (2, 3, 1)
    """
    return Unflatten.apply(x, tape=tape, dim=dim, sizes=tuple(sizes))
