"""PyTorch's logical ops ``logical_and logical_or logical_xor logical_not``, the closeness
tests ``isclose allclose equal``, and the NaN-aware reductions ``nansum nanmean``.

The logical ops and ``isclose`` give float32 0/1 masks (parcl's comparisons' type, what
``tp.where`` takes; PyTorch's are bool) and are never recorded; ``allclose`` and ``equal``
give Python bools (a host read). ``nansum``/``nanmean`` zero the NaNs and sum (one kernel each
before the reduction); their gradient is PyTorch's: the upstream one where ``x`` is not NaN,
0 where it is.

>>> x = tp.tensor(np.array([[1.0, np.nan], [0.0, 3.0]]), requires_grad=True)
>>> tp.nansum(x, 1).to_host(), tp.nanmean(x).to_host()
(array([1., 3.], dtype=float32), array(1.3333334, dtype=float32))
>>> tp.logical_and(x, 1.0).to_host()                       # NaN is true
array([[1., 1.],
       [0., 1.]], dtype=float32)
"""

from __future__ import annotations

from ...errors import DTypeError, ParclError
from ...kernels import elementwise as ew
from ...kernels import reduction as rd
from ...kernels.broadcast import broadcast_shapes
from ...tensor import Tensor, keep_checks
from ..node import Function, Node
from .elementwise import _is_scalar
from .reduce_dims import _axes

__all__ = ["allclose", "equal", "isclose", "logical_and", "logical_not",
           "logical_or", "logical_xor", "nanmean", "nansum"]


def _tensors(op: str, a, b) -> tuple[Tensor, Tensor]:
    """The raw tensors of ``a`` and ``b`` (a number becomes a 0-d tensor on the other's
    queue), checked float32."""
    a = a.value if isinstance(a, Node) else a
    b = b.value if isinstance(b, Node) else b
    for v in (a, b):
        if not isinstance(v, Tensor) and not _is_scalar(v):
            raise DTypeError(f"{op}: expected tp.Node, pc.Tensor or number operands, got "
                             f"{type(v).__name__}")
    if _is_scalar(a) and _is_scalar(b):
        raise DTypeError(f"{op}: both operands are numbers; pass a tp.Node or pc.Tensor")
    if _is_scalar(a):
        a = Tensor.full(b.queue, (), float(a))
    elif _is_scalar(b):
        b = Tensor.full(a.queue, (), float(b))
    ew.check_float(op, a, b)
    return a, b


def _tensor(op: str, x) -> Tensor:
    x = x.value if isinstance(x, Node) else x
    if not isinstance(x, Tensor):
        raise DTypeError(f"{op}: expected a tp.Node or pc.Tensor, got {type(x).__name__}")
    ew.check_float(op, x)
    return x


def _logical(op: str, a, b) -> Tensor:
    a, b = _tensors(op, a, b)
    return keep_checks(ew.binary(op, a, b), a, b)


def logical_and(input, other) -> Tensor:  # noqa: A002
    """1 where both are nonzero (NaN counts as nonzero), else 0; broadcasting; a float32
    mask, never recorded."""
    return _logical("logical_and", input, other)


def logical_or(input, other) -> Tensor:  # noqa: A002
    """1 where either is nonzero, else 0 (float32 mask)."""
    return _logical("logical_or", input, other)


def logical_xor(input, other) -> Tensor:  # noqa: A002
    """1 where exactly one is nonzero, else 0 (float32 mask)."""
    return _logical("logical_xor", input, other)


def logical_not(input) -> Tensor:  # noqa: A002
    """1 where ``input`` is 0, else 0 (float32 mask; NaN gives 0)."""
    x = _tensor("logical_not", input)
    return keep_checks(ew.unary("logical_not", x), x)


def isclose(input, other, rtol: float = 1e-05, atol: float = 1e-08,  # noqa: A002
            equal_nan: bool = False) -> Tensor:
    """``torch.isclose``: 1 where ``|input - other| <= atol + rtol * |other|`` or the two are
    equal (infinities of one sign too), else 0; NaNs are close to each other only with
    ``equal_nan``. Broadcasting; a float32 mask, never recorded. One kernel (after expanding
    broadcast operands).

    >>> tp.isclose(tp.tensor(np.array([1.0, np.nan])), 1.0 + 1e-6).to_host()
    array([1., 0.], dtype=float32)
    """
    for name, v in (("rtol", rtol), ("atol", atol)):
        if not _is_scalar(v):
            raise DTypeError(f"isclose: {name} must be a number, got {type(v).__name__}")
        if v < 0:
            raise ParclError(f"isclose: {name} must be greater than or equal to zero, got {v}")
    a, b = _tensors("isclose", input, other)
    shape = broadcast_shapes("isclose", a.shape, b.shape)
    wide_a = a if a.shape == shape else ew.broadcast_to(a, shape)
    wide_b = b if b.shape == shape else ew.broadcast_to(b, shape)
    out = ew.grad("isclose_equal_nan" if equal_nan else "isclose", wide_a, wide_b,
                  p=float(rtol), q=float(atol))
    return keep_checks(out, a, b)


def allclose(input, other, rtol: float = 1e-05, atol: float = 1e-08,  # noqa: A002
             equal_nan: bool = False) -> bool:
    """``torch.allclose``: whether ``isclose`` holds everywhere (a Python bool: a host
    read)."""
    close = isclose(input, other, rtol, atol, equal_nan)
    return close.size == 0 or bool(float(rd.sum(ew.scalar("eq", close, 0.0))) == 0)


def equal(input, other) -> bool:  # noqa: A002
    """``torch.equal``: True when both have the same shape and the same elements (NaN equals
    nothing), else False (a Python bool: a host read)."""
    a, b = _tensor("equal", input), _tensor("equal", other)
    if tuple(a.shape) != tuple(b.shape):
        return False
    return a.size == 0 or bool(float(rd.sum(ew.binary("ne", a, b))) == 0)


class NanSum(Function):
    """The sum with NaNs taken as 0; backward the upstream gradient, broadcast back, times
    0 where ``x`` is NaN (``0 * inf`` is NaN, as PyTorch's mask product gives)."""

    name = "nansum"

    def forward(self, x, axes=(), keepdim=False):
        if self.recording:
            self.x, self.axes = x, axes
        return rd.sum(ew.unary("nan_zero", x), axes, keepdim)

    def _spread(self, g):
        kept = rd.reduced_shape(self.x.shape, self.axes, True)
        return ew.broadcast_to(g.reshape(kept), self.x.shape)

    def backward(self, g):
        return ew.grad("nansum_backward", self.x, self._spread(g))


class NanMean(NanSum):
    """``nansum / count`` of the non-NaN elements: over none, ``0 / 0``, NaN (its gradient
    too), as PyTorch's."""

    name = "nanmean"

    def forward(self, x, axes=(), keepdim=False):
        count = rd.sum(ew.unary("logical_not", ew.unary("isnan", x)), axes, True)
        if self.recording:
            self.x, self.axes, self.count = x, axes, count
        total = rd.sum(ew.unary("nan_zero", x), axes, True)
        out = ew.binary("div", total, count, out=total)
        return out.reshape(rd.reduced_shape(x.shape, axes, keepdim))

    def backward(self, g):
        kept = rd.reduced_shape(self.x.shape, self.axes, True)
        per = ew.binary("div", g.reshape(kept), self.count)
        return ew.grad("nansum_backward", self.x, ew.broadcast_to(per, self.x.shape))


def nansum(input, dim=None, keepdim: bool = False, *, tape=None):  # noqa: A002
    """``torch.nansum``: the sum over ``dim`` (None or ``()``: every dim; an int or a tuple)
    with NaNs taken as 0; gradient the upstream one where ``input`` is not NaN, else 0."""
    x = _tensor("nansum", input)
    return NanSum.apply(input, tape=tape, axes=_axes("nansum", dim, x.shape),
                        keepdim=bool(keepdim))


def nanmean(input, dim=None, keepdim: bool = False, *, tape=None):  # noqa: A002
    """``torch.nanmean``: ``nansum`` over the count of non-NaN elements (NaN where there are
    none, as PyTorch's); gradient ``1 / count`` where ``input`` is not NaN, else 0."""
    x = _tensor("nanmean", input)
    return NanMean.apply(input, tape=tape, axes=_axes("nanmean", dim, x.shape),
                         keepdim=bool(keepdim))


