"""PyTorch's reductions over ``dim``: ``amax`` and ``amin`` (ties share the gradient evenly)
and ``prod`` (a gradient that stays right where the input holds zeros).

``dim`` follows PyTorch: None (and, for ``amax``/``amin``, ``()``) reduces every dim; negative
dims count from the end; a 0-d tensor takes dim 0 and -1. Products and sums run in the fixed
order of ``parcl.kernels.reduction``, so results are bit-identical run to run.

>>> x = tp.tensor(pc.Tensor.from_host(q, np.array([[1.0, 5.0], [5.0, 0.0]], np.float32)), True)
>>> with tp.Tape() as tape:
...     m = tp.amax(x)
>>> tape.backward(m)
>>> x.grad.to_host()                     # two maximal elements: half each
array([[0. , 0.5],
       [0.5, 0. ]], dtype=float32)
"""

from __future__ import annotations

from ...kernels import elementwise as ew
from ...kernels import reduction as rd
from ...kernels import select as sk
from ...tensor import Tensor
from ..node import Function
from .shape import wrap_dim, wrap_dims

__all__ = ["amax", "amin", "prod"]


def _axes(op: str, dim, shape) -> tuple[int, ...]:
    """The dims to reduce, as ``parcl.kernels.reduction`` wants them (sorted; none for a 0-d
    tensor, whose dim 0 is the tensor itself)."""
    if dim is None or (isinstance(dim, (tuple, list)) and not dim):
        return tuple(range(len(shape)))
    axes = wrap_dims(op, dim, len(shape), shape)
    return tuple(sorted(axes)) if shape else ()


class _Extreme(Function):
    """amax / amin; the backward gives each reduced block's gradient to its extreme elements,
    split evenly among ties (PyTorch's rule; ``tp.max`` over every element too)."""

    lower = False
    nan_ties = False       # NaN extremes share the gradient (torch.max(x)'s rule, not amax's)

    def forward(self, x: Tensor, dim=None, keepdim: bool = False):
        ew.check_float(self.name, x)
        axes = _axes(self.name, dim, x.shape)
        kept = (rd.min if self.lower else rd.max)(x, axes, keepdims=True)
        if self.recording:
            self.saved = (x, kept, axes)
        return kept.reshape(rd.reduced_shape(x.shape, axes, keepdim))

    def backward(self, g: Tensor):
        x, kept, axes = self.saved
        ties = ew.binary("le" if self.lower else "ge", x, kept)       # 1 where x is extreme
        if self.nan_ties:
            # a NaN extreme compares false everywhere, and 0 ties made every gradient NaN;
            # x holds a NaN only where the extreme is NaN, so those are then the ties
            ew.binary("add", ties, ew.unary("isnan", x), out=ties)
        share = ew.binary("div", g.reshape(kept.shape), rd.sum(ties, axes, keepdims=True))
        return ew.binary("mul", ties, share, out=ties)


class Amax(_Extreme):
    name = "amax"


class Amin(_Extreme):
    name = "amin"
    lower = True


def amax(x, dim=None, keepdim: bool = False, *, tape=None):
    """``torch.amax``: the largest element over ``dim`` (None or ``()``: all; an int or a
    tuple); NaN propagates. Ties share the gradient evenly. op_name ``"amax"``.

    >>> tp.amax(x, dim=-1, keepdim=True).shape        # x (2, 2)
    (2, 1)
    """
    return Amax.apply(x, tape=tape, dim=dim, keepdim=bool(keepdim))


def amin(x, dim=None, keepdim: bool = False, *, tape=None):
    """``torch.amin``: the smallest element over ``dim``; ties share the gradient evenly.
    op_name ``"amin"``.

    >>> tp.amin(x, dim=(0, 1)).shape
    ()
    """
    return Amin.apply(x, tape=tape, dim=dim, keepdim=bool(keepdim))


class Prod(Function):
    """The backward is the product of the other elements of each block: ``prod / x`` where
    the block has no zero; where it has one zero, the product of the others at the zero and 0
    elsewhere; 0 where it has more (as PyTorch's ``prod_backward``, never ``0 / 0``)."""

    name = "prod"

    def forward(self, x: Tensor, dim=None, keepdim: bool = False):
        ew.check_float(self.name, x)
        if dim is None:
            axes = tuple(range(x.ndim))
        else:
            axes = (wrap_dim("prod", dim, x.ndim, x.shape),) if x.ndim else ()
        out = rd.product(x, axes, keepdims=True)
        if self.recording:
            self.saved = (x, axes)
        return out.reshape(rd.reduced_shape(x.shape, axes, keepdim))

    def backward(self, g: Tensor):
        x, axes = self.saved
        q = x.queue
        zero = ew.binary("mul", ew.scalar("ge", x, 0.0), ew.scalar("le", x, 0.0))
        nonzero = sk.where(zero, Tensor.full(q, (), 1.0), x)          # zeros read as 1
        others = ew.binary("div", rd.product(nonzero, axes, keepdims=True), nonzero)
        zeros = rd.sum(zero, axes, keepdims=True)                     # zeros per block
        none = ew.scalar("lt", zeros, 0.5)
        one = ew.binary("mul", ew.scalar("gt", zeros, 0.5), ew.scalar("lt", zeros, 1.5))
        keep = ew.binary("add", none, ew.binary("mul", zero, one))    # broadcast to x
        ew.binary("mul", others, g.reshape(none.shape), out=others)
        return sk.where(keep, others, Tensor.zeros(q, ()))


def prod(x, dim=None, keepdim: bool = False, *, tape=None):
    """``torch.prod``: the product over one ``dim`` (an int) or of everything (None). Its
    gradient is right with zeros in the input (no ``0 / 0``). op_name ``"prod"``.

    >>> tp.prod(x, 1).to_host()
    array([5., 0.], dtype=float32)
    """
    return Prod.apply(x, tape=tape, dim=dim, keepdim=bool(keepdim))
