"""``NodeMethods``: the operators and tensor-like methods of ``Node`` (``+ - * / @ **``,
``x[key]``, ``x.sum()``, ``x.reshape(...)``, ``float(x)``, ``np.asarray(x)``), each a thin
wrapper over the op of the same name in ``parcl.tape.ops``. Kept apart from ``node.py`` so
that the graph's data structure stays short; ``Node`` inherits them unchanged.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from .. import recorder
from ..errors import ParclError, ShapeError
from ..kernels.broadcast import broadcast_shapes
from ..tensor import every_dim_if_empty, identity
from ..tensor_methods import cast_dtype, to_arguments
from . import mode



def _torch_names(op: str, dim, keepdim, axis, keepdims) -> tuple:
    """PyTorch's ``dim``/``keepdim`` (positional, as torch.Tensor's, with its meaning of
    ``dim=()``) or numpy's ``axis``/``keepdims`` by keyword (parcl's, ``axis=()`` reducing
    none); both at once is a TypeError."""
    if axis is not None:
        if dim is not None:
            raise TypeError(f"{op}: axis and dim given both; they are one argument")
    else:
        axis = every_dim_if_empty(dim)
    return axis, keepdim if keepdims is None else keepdims


_OPERATORS = {"__iadd__": "+", "__isub__": "-", "__imul__": "*", "__itruediv__": "/",
              "__ipow__": "**", "__imod__": "%", "__ifloordiv__": "//"}


def _note_read(*xs) -> None:
    """Inside ``tp.capture``: the leaves an in-place write on Nodes writes and reads (which
    go to their values, not through an op) noted as an op notes its inputs, so a leaf given
    a new ``.value`` between calls records the call anew instead of a replay writing into
    the buffer it dropped (another tensor's by then)."""
    rec = recorder.state.recording
    if rec is not None:
        rec.note_inputs([x.entry for x in xs if isinstance(x, NodeMethods)])


@cache
def _ops():
    # imported on first use (ops import node.py, which imports this); cached, as every
    # operator calls it
    from . import ops
    return ops


class NodeMethods:
    """Mixed into ``Node`` (which holds ``value``); no state of its own."""

    __slots__ = ()

    # -- operators: thin wrappers over the ops in parcl.tape.ops ------------------------
    def __eq__(self, other):            # identity; an array or number is a TypeError
        return identity("==", self, other)

    def __ne__(self, other):
        result = identity("!=", self, other)
        return result if result is NotImplemented else not result

    __hash__ = object.__hash__

    def __add__(self, other):
        return _ops().add(self, other)

    def __radd__(self, other):
        return _ops().add(other, self)

    def __sub__(self, other):
        return _ops().sub(self, other)

    def __rsub__(self, other):
        return _ops().sub(other, self)

    def __mul__(self, other):
        return _ops().mul(self, other)

    def __rmul__(self, other):
        return _ops().mul(other, self)

    def __truediv__(self, other):
        return _ops().div(self, other)

    def __rtruediv__(self, other):
        return _ops().div(other, self)

    # ``x op= y``: under tp.no_grad in place on the value, as PyTorch's (the manual SGD step
    # ``p -= lr * p.grad`` updates the parameter; Python's fallback ``p = p - ...`` rebound
    # the loop variable to a new tensor and left the model unchanged, silently). While
    # recording, NotImplemented: the fallback records ``x = x op y``, a new Node, which must
    # keep x's shape as PyTorch's in-place op does (``x += y`` of x (3,) and y (2, 3) is its
    # error, not a (2, 3) x).
    def _inplace(self, symbol: str, other):
        if mode.state.grad:
            self._keeps_shape(symbol, other)
            return NotImplemented
        _note_read(self, other)
        res = getattr(self.value, symbol)(other.value if isinstance(other, NodeMethods)
                                          else other)
        if res is NotImplemented:
            raise TypeError(f"Node {symbol}: unsupported operand {type(other).__name__}")
        return self

    def _keeps_shape(self, symbol: str, other) -> None:
        from .node import leaf_viewed          # node.py imports this module
        op = _OPERATORS[symbol]
        if self.requires_grad and leaf_viewed(self) is not None:
            # PyTorch's error (for a leaf or a view of one); the recorded x = x op y would
            # leave the leaf (a parameter) as it was: a manual step p -= lr * p.grad outside
            # no_grad changed no weight
            through = "" if self.grad_fn is None else f" (through a view of it: {self.op_name})"
            raise ParclError(f"Node {op}=: a leaf that requires grad{through} is used in an "
                             f"in-place op while grad mode is on (shape {tuple(self.shape)}); "
                             "update parameters under tp.no_grad(), as PyTorch requires")
        # x[key] (narrow, a transpose, ...) is a copy where PyTorch's is a view: the recorded
        # x = x op y would leave the tensor it came from as it was, where PyTorch's changes
        self.value.not_a_copy(f"Node {op}=")
        shape = getattr(other, "shape", None)
        if shape is None:
            return
        mine = tuple(self.shape)
        out = broadcast_shapes(f"Node {op}=", mine, tuple(shape))
        if out != mine:
            raise ShapeError(f"Node {op}=: an operand of shape {tuple(shape)} would grow "
                             f"{mine} to {out}; an in-place op keeps its tensor's shape, as "
                             f"PyTorch's (write x = x {op} y for the broadcast result)")

    def __iadd__(self, other):
        return self._inplace("__iadd__", other)

    def __isub__(self, other):
        return self._inplace("__isub__", other)

    def __imul__(self, other):
        return self._inplace("__imul__", other)

    def __itruediv__(self, other):
        return self._inplace("__itruediv__", other)

    def __ipow__(self, other):
        return self._inplace("__ipow__", other)

    def __matmul__(self, other):
        return _ops().matmul(self, other)

    def __rmatmul__(self, other):
        return _ops().matmul(other, self)

    def __neg__(self):
        return _ops().neg(self)

    def sum(self, dim=None, keepdim=False, *, axis=None, keepdims=None):
        """``x.sum(dim, keepdim)``, as torch.Tensor's; numpy's ``axis=``/``keepdims=`` are
        taken too."""
        axis, keepdims = _torch_names("sum", dim, keepdim, axis, keepdims)
        return _ops().sum(self, axis=axis, keepdims=keepdims)

    def mean(self, dim=None, keepdim=False, *, axis=None, keepdims=None):
        axis, keepdims = _torch_names("mean", dim, keepdim, axis, keepdims)
        return _ops().mean(self, axis=axis, keepdims=keepdims)

    # -- torch.Tensor's methods of the ops: thin wrappers, PyTorch's argument order -------
    def exp(self):
        return _ops().exp(self)

    def log(self):
        return _ops().log(self)

    def sqrt(self):
        return _ops().sqrt(self)

    def rsqrt(self):
        return _ops().rsqrt(self)

    def abs(self):
        return _ops().abs(self)

    def square(self):
        return _ops().square(self)

    def sin(self):
        return _ops().sin(self)

    def cos(self):
        return _ops().cos(self)

    def tanh(self):
        return _ops().tanh(self)

    def sigmoid(self):
        return _ops().sigmoid(self)

    def relu(self):
        return _ops().relu(self)

    def neg(self):
        return _ops().neg(self)

    def pow(self, exponent):
        return _ops().pow(self, exponent)

    def add(self, other, *, alpha=1):
        """``x + alpha * other``, as torch.Tensor's ``add`` (``sub``: minus)."""
        return _ops().add(self, other, alpha=alpha)

    def sub(self, other, *, alpha=1):
        return _ops().sub(self, other, alpha=alpha)

    def mul(self, other):
        return _ops().mul(self, other)

    def div(self, other, *, rounding_mode=None):
        return _ops().div(self, other, rounding_mode=rounding_mode)

    # torch.Tensor's numpy-style aliases
    subtract, multiply, divide = sub, mul, div

    def maximum(self, other):
        return _ops().maximum(self, other)

    def minimum(self, other):
        return _ops().minimum(self, other)

    def clamp(self, min=None, max=None):  # noqa: A002
        return _ops().clamp(self, min, max)

    def clamp_min(self, min):  # noqa: A002
        return _ops().clamp_min(self, min)

    def clamp_max(self, max):  # noqa: A002
        return _ops().clamp_max(self, max)

    def remainder(self, other):
        return _ops().remainder(self, other)

    def __mod__(self, other):
        return _ops().remainder(self, other)

    def __imod__(self, other):
        # in place under no_grad, as PyTorch's %= (a parameter wrapped by p %= 1.0 changes);
        # Python's fallback p = p % 1.0 left it as it was. pc.Tensor has no %: the remainder
        # is computed, then copied into the value
        if mode.state.grad:
            self._keeps_shape("__imod__", other)
            return NotImplemented
        _note_read(self, other)
        other = other.value if isinstance(other, NodeMethods) else other
        self.value.copy_(_ops().remainder(self.value, other))
        return self

    def __rmod__(self, other):
        return _ops().remainder(other, self)

    def fmod(self, other):
        return _ops().fmod(self, other)

    def hypot(self, other):
        return _ops().hypot(self, other)

    def exp2(self):
        return _ops().exp2(self)

    def frac(self):
        return _ops().frac(self)

    def sign(self):
        return _ops().sign(self)

    def floor(self):
        return _ops().floor(self)

    def ceil(self):
        return _ops().ceil(self)

    def trunc(self):
        return _ops().trunc(self)

    def reciprocal(self):
        return _ops().reciprocal(self)

    def log1p(self):
        return _ops().log1p(self)

    def expm1(self):
        return _ops().expm1(self)

    def log2(self):
        return _ops().log2(self)

    def log10(self):
        return _ops().log10(self)

    def erf(self):
        return _ops().erf(self)

    def tan(self):
        return _ops().tan(self)

    def sinh(self):
        return _ops().sinh(self)

    def cosh(self):
        return _ops().cosh(self)

    def asin(self):
        return _ops().asin(self)

    def acos(self):
        return _ops().acos(self)

    def atan(self):
        return _ops().atan(self)

    def round(self, decimals=0):
        return _ops().round(self, decimals)

    def atan2(self, other):
        return _ops().atan2(self, other)

    def lerp(self, end, weight):
        return _ops().lerp(self, end, weight)

    def nan_to_num(self, nan=0.0, posinf=None, neginf=None):
        return _ops().nan_to_num(self, nan, posinf, neginf)

    def positive(self):
        return self

    # torch.Tensor's other names of these
    fix, arctan2, negative, absolute, clip = trunc, atan2, neg, abs, clamp

    # -- special functions and the rest of the pointwise math (mathops_special, _binary) --
    def acosh(self):
        return _ops().acosh(self)

    def asinh(self):
        return _ops().asinh(self)

    def atanh(self):
        return _ops().atanh(self)

    arccosh, arcsinh, arctanh = acosh, asinh, atanh

    def arccos(self):
        return _ops().acos(self)

    def arcsin(self):
        return _ops().asin(self)

    def arctan(self):
        return _ops().atan(self)

    def deg2rad(self):
        return _ops().deg2rad(self)

    def rad2deg(self):
        return _ops().rad2deg(self)

    def erfc(self):
        return _ops().erfc(self)

    def erfinv(self):
        return _ops().erfinv(self)

    def lgamma(self):
        return _ops().lgamma(self)

    def digamma(self):
        return _ops().digamma(self)

    def polygamma(self, n):
        return _ops().polygamma(n, self)

    def mvlgamma(self, p):
        return _ops().mvlgamma(self, p)

    def i0(self):
        return _ops().i0(self)

    def sinc(self):
        return _ops().sinc(self)

    def logit(self, eps=None):
        return _ops().logit(self, eps)

    def sgn(self):
        return _ops().sgn(self)

    def signbit(self):
        return _ops().signbit(self)

    def xlogy(self, other):
        return _ops().xlogy(self, other)

    def logaddexp(self, other):
        return _ops().logaddexp(self, other)

    def logaddexp2(self, other):
        return _ops().logaddexp2(self, other)

    def fmax(self, other):
        return _ops().fmax(self, other)

    def fmin(self, other):
        return _ops().fmin(self, other)

    def ldexp(self, other):
        return _ops().ldexp(self, other)

    def copysign(self, other):
        return _ops().copysign(self, other)

    def heaviside(self, values):
        return _ops().heaviside(self, values)

    def floor_divide(self, other):
        return _ops().floor_divide(self, other)

    def __floordiv__(self, other):
        return _ops().floor_divide(self, other)

    def __ifloordiv__(self, other):
        # in place under no_grad, as PyTorch's //= (as %=: Python's fallback p = p // c left
        # a parameter as it was); pc.Tensor has no //, so the quotient is copied into the value
        if mode.state.grad:
            self._keeps_shape("__ifloordiv__", other)
            return NotImplemented
        _note_read(self, other)
        other = other.value if isinstance(other, NodeMethods) else other
        self.value.copy_(_ops().floor_divide(self.value, other))
        return self

    def __rfloordiv__(self, other):
        return _ops().floor_divide(other, self)

    def true_divide(self, other):
        return _ops().true_divide(self, other)

    def float_power(self, exponent):
        return _ops().float_power(self, exponent)

    # -- logical ops, closeness and the NaN-aware reductions (logical) ------------------
    def logical_and(self, other):
        return _ops().logical_and(self, other)

    def logical_or(self, other):
        return _ops().logical_or(self, other)

    def logical_xor(self, other):
        return _ops().logical_xor(self, other)

    def logical_not(self):
        return _ops().logical_not(self)

    def isclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
        return _ops().isclose(self, other, rtol, atol, equal_nan)

    def allclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
        return _ops().allclose(self, other, rtol, atol, equal_nan)

    def eq(self, other):
        return _ops().eq(self, other)

    def ne(self, other):
        return _ops().ne(self, other)

    def lt(self, other):
        return _ops().lt(self, other)

    def le(self, other):
        return _ops().le(self, other)

    def gt(self, other):
        return _ops().gt(self, other)

    def ge(self, other):
        return _ops().ge(self, other)

    greater, greater_equal, less, less_equal, not_equal = gt, ge, lt, le, ne

    def equal(self, other):
        return _ops().equal(self, other)

    def nansum(self, dim=None, keepdim=False):
        return _ops().nansum(self, dim, keepdim)

    def nanmean(self, dim=None, keepdim=False):
        return _ops().nanmean(self, dim, keepdim)

    # -- integer ops (integer) ------------------------------------------------------------
    def gcd(self, other):
        return _ops().gcd(self, other)

    def lcm(self, other):
        return _ops().lcm(self, other)

    def bitwise_and(self, other):
        return _ops().bitwise_and(self, other)

    def bitwise_or(self, other):
        return _ops().bitwise_or(self, other)

    def bitwise_xor(self, other):
        return _ops().bitwise_xor(self, other)

    def bitwise_not(self):
        return _ops().bitwise_not(self)

    def addcmul(self, tensor1, tensor2, *, value=1):
        return _ops().addcmul(self, tensor1, tensor2, value=value)

    def addcdiv(self, tensor1, tensor2, *, value=1):
        return _ops().addcdiv(self, tensor1, tensor2, value=value)

    def isnan(self):
        return _ops().isnan(self)

    def isinf(self):
        return _ops().isinf(self)

    def isfinite(self):
        return _ops().isfinite(self)

    def all(self, dim=None, keepdim=False):  # noqa: A003
        return _ops().all(self, dim, keepdim)

    def any(self, dim=None, keepdim=False):  # noqa: A003
        return _ops().any(self, dim, keepdim)

    def prelu(self, weight):
        return _ops().prelu(self, weight)

    def softmax(self, dim):
        return _ops().softmax(self, dim)

    def log_softmax(self, dim):
        return _ops().log_softmax(self, dim)

    def max(self, dim=None, keepdim=False):  # noqa: A003
        """``x.max()``: the largest element; ``x.max(dim)``: ``(values, indices)`` along
        ``dim``; ``x.max(other)`` of a tensor ``other``: ``tp.maximum``, as
        ``torch.Tensor.max`` (and ``tp.max``)."""
        return _ops().max(self, dim, keepdim)

    def min(self, dim=None, keepdim=False):  # noqa: A003
        return _ops().min(self, dim, keepdim)

    def argmax(self, dim=None, keepdim=False):
        return _ops().argmax(self, dim, keepdim)

    def argmin(self, dim=None, keepdim=False):
        return _ops().argmin(self, dim, keepdim)

    def amax(self, dim=None, keepdim=False):
        return _ops().amax(self, dim, keepdim)

    def amin(self, dim=None, keepdim=False):
        return _ops().amin(self, dim, keepdim)

    def prod(self, dim=None, keepdim=False):
        return _ops().prod(self, dim, keepdim)

    def var(self, dim=None, unbiased=None, keepdim=False, *, correction=None):
        """``x.var(dim, unbiased, keepdim)`` or ``x.var(dim, keepdim=..., correction=...)``,
        as torch.Tensor's (``x.var(False)`` its ``unbiased`` alone)."""
        return _ops().var(self, every_dim_if_empty(dim), keepdims=keepdim,
                          correction=correction, unbiased=unbiased)

    def std(self, dim=None, unbiased=None, keepdim=False, *, correction=None):
        return _ops().std(self, every_dim_if_empty(dim), keepdims=keepdim,
                          correction=correction, unbiased=unbiased)

    def logsumexp(self, dim, keepdim=False):
        return _ops().logsumexp(self, every_dim_if_empty(dim), keepdim)

    def cumsum(self, dim):
        return _ops().cumsum(self, dim)

    def cumprod(self, dim):
        return _ops().cumprod(self, dim)

    def diff(self, n=1, dim=-1, prepend=None, append=None):
        return _ops().diff(self, n, dim, prepend, append)

    def repeat_interleave(self, repeats, dim=None, *, output_size=None):
        return _ops().repeat_interleave(self, repeats, dim, output_size=output_size)

    def norm(self, p=2, dim=None, keepdim=False):
        return _ops().norm(self, p, dim, keepdim)

    def topk(self, k, dim=-1, largest=True, sorted=True):  # noqa: A002
        return _ops().topk(self, k, dim, largest, sorted)

    def sort(self, dim=-1, descending=False, stable=False):
        return _ops().sort(self, dim, descending, stable)

    def argsort(self, dim=-1, descending=False, stable=False):
        return _ops().argsort(self, dim, descending, stable)

    # -- order statistics and running extremes (parcl.tape.ops.order, .cumulative) ----------
    def median(self, dim=None, keepdim=False):
        return _ops().median(self, dim, keepdim)

    def nanmedian(self, dim=None, keepdim=False):
        return _ops().nanmedian(self, dim, keepdim)

    def quantile(self, q, dim=None, keepdim=False, *, interpolation="linear"):
        return _ops().quantile(self, q, dim, keepdim, interpolation=interpolation)

    def nanquantile(self, q, dim=None, keepdim=False, *, interpolation="linear"):
        return _ops().nanquantile(self, q, dim, keepdim, interpolation=interpolation)

    def kthvalue(self, k, dim=-1, keepdim=False):
        return _ops().kthvalue(self, k, dim, keepdim)

    def mode(self, dim=-1, keepdim=False):
        return _ops().order.mode(self, dim, keepdim)

    def msort(self):
        return _ops().msort(self)

    def aminmax(self, *, dim=None, keepdim=False):
        return _ops().aminmax(self, dim=dim, keepdim=keepdim)

    def cummax(self, dim):
        return _ops().cummax(self, dim)

    def cummin(self, dim):
        return _ops().cummin(self, dim)

    def logcumsumexp(self, dim):
        return _ops().logcumsumexp(self, dim)

    # -- counting (parcl.tape.ops.counting): raw Tensors, never recorded ------------------
    def unique(self, sorted=True, return_inverse=False, return_counts=False,  # noqa: A002
               dim=None):
        return _ops().unique(self, sorted, return_inverse, return_counts, dim)

    def unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
        return _ops().unique_consecutive(self, return_inverse, return_counts, dim)

    def nonzero(self, *, as_tuple=False):
        return _ops().nonzero(self, as_tuple=as_tuple)

    def argwhere(self):
        return _ops().argwhere(self)

    def count_nonzero(self, dim=None):
        return _ops().count_nonzero(self, dim)

    def bincount(self, weights=None, minlength=0):
        return _ops().bincount(self, weights, minlength)

    def histc(self, bins=100, min=0, max=0):  # noqa: A002
        return _ops().histc(self, bins, min, max)

    def masked_fill(self, mask, value):
        return _ops().masked_fill(self, mask, value)

    def gather(self, dim, index):
        return _ops().gather(self, dim, index)

    def index_select(self, dim, index):
        return _ops().index_select(self, dim, index)

    def matmul(self, other):
        return _ops().matmul(self, other)

    def expand(self, *sizes):
        if len(sizes) == 1 and not isinstance(sizes[0], (int, np.integer)):
            sizes = tuple(sizes[0])
        return _ops().expand(self, sizes)

    def flip(self, dims, *more_dims):
        """``x.flip(dims)``, or PyTorch's ``x.flip(0, 2)`` (the dims as arguments)."""
        if more_dims:
            dims = (dims, *more_dims)
        return _ops().flip(self, dims)

    def diagonal(self, offset=0, dim1=0, dim2=1):
        return _ops().diagonal(self, offset, dim1, dim2)

    def diag(self, diagonal=0):
        return _ops().diag(self, diagonal)

    def trace(self):
        return _ops().trace(self)

    def tril(self, diagonal=0):
        return _ops().tril(self, diagonal)

    def triu(self, diagonal=0):
        return _ops().triu(self, diagonal)

    def reshape(self, *shape):
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = tuple(shape[0])
        return _ops().reshape(self, shape)

    # -- PyTorch conveniences: x ** y, float(x), int(x), np.asarray(x) ------------------
    def __pow__(self, other):
        return _ops().pow(self, other)

    def __rpow__(self, other):
        return _ops().pow(other, self)

    def __float__(self) -> float:
        return float(self.value)

    def __int__(self) -> int:
        return int(self.value)

    def __bool__(self) -> bool:
        # the value's truth (pc.Tensor.__bool__), not every object's True
        return bool(self.value)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """``np.asarray(node)``: a host copy of the value (see ``pc.Tensor.__array__``)."""
        return self.value.__array__(dtype, copy)

    def __getitem__(self, key):
        """``x[key]``: basic indexing (ints, slices with steps, None, ...) and one 1-D int
        list/array/tensor in one position, ``tp.getitem``."""
        return _ops().getitem(self, key)

    def __contains__(self, item) -> bool:
        # elementwise, as pc.Tensor.__contains__ (not each row compared by identity)
        return item in self.value

    def __len__(self) -> int:
        # the first dim, as pc.Tensor's and torch.Tensor's (0-d: a TypeError)
        return len(self.value)

    def __iter__(self):
        # rows, as pc.Tensor.__iter__: a 0-d Node is a TypeError, not an empty iteration
        if not self.shape:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    # -- PyTorch's shape methods (``x.permute(1, 0)``, ``x.view(-1)``, ...) ---------------
    def view(self, *shape):
        """``x.view(*shape)``: ``x.reshape`` (parcl's tensors are contiguous: always a view)."""
        return self.reshape(*shape)

    def permute(self, *dims):
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = tuple(dims[0])
        return _ops().permute(self, dims)

    def movedim(self, source, destination):
        return _ops().movedim(self, source, destination)

    def t(self):
        return _ops().t(self)

    @property
    def T(self):  # noqa: N802
        """The dims reversed, as ``ndarray.T`` and ``pc.Tensor.T`` (``tp.transpose``)."""
        return _ops().transpose(self)

    def squeeze(self, dim=None):
        return _ops().squeeze(self, dim)

    def unsqueeze(self, dim):
        return _ops().unsqueeze(self, dim)

    def flatten(self, start_dim=0, end_dim=-1):
        return _ops().flatten(self, start_dim, end_dim)

    def unflatten(self, dim, sizes):
        return _ops().unflatten(self, dim, sizes)

    def chunk(self, chunks, dim=0):
        return _ops().chunk(self, chunks, dim)

    def unbind(self, dim=0):
        return _ops().unbind(self, dim)

    def narrow(self, dim, start, length):
        return _ops().narrow(self, dim, start, length)

    def repeat(self, *sizes):
        return _ops().repeat(self, *sizes)

    # -- PyTorch's factory methods: new tensors of this one's dtype, on its queue -------------
    def new_zeros(self, *size, dtype=None, requires_grad=False):
        return _ops().zeros(*size, dtype=dtype or self.dtype, requires_grad=requires_grad,
                            queue=self.queue)

    def new_ones(self, *size, dtype=None, requires_grad=False):
        return _ops().ones(*size, dtype=dtype or self.dtype, requires_grad=requires_grad,
                           queue=self.queue)

    def new_full(self, size, fill_value, *, dtype=None, requires_grad=False):
        return _ops().full(size, fill_value, dtype=dtype or self.dtype,
                           requires_grad=requires_grad, queue=self.queue)

    def new_empty(self, *size, dtype=None, requires_grad=False):
        return _ops().empty(*size, dtype=dtype or self.dtype, requires_grad=requires_grad,
                            queue=self.queue)

    def new_tensor(self, data, *, dtype=None, requires_grad=False):
        return _ops().creation.new_tensor(self.queue, data, dtype or self.dtype, requires_grad)

    # -- in place: refused while recording on a Node that requires grad (PyTorch's error for a
    # leaf; parcl records no in-place op, so for any such Node), else into its value -----------
    def _writable(self, op: str):
        if self.requires_grad and mode.state.grad:
            raise ParclError(f"Node.{op}: a Node that requires grad (shape {tuple(self.shape)}) "
                             "is written in place while grad mode is on; do it under "
                             "tp.no_grad(), as PyTorch requires for a leaf, or make a new "
                             "tensor (tp.zeros_like, tp.full_like, tp.randn_like)")
        _note_read(self)
        return self.value

    def __setitem__(self, key, value):
        """``x[key] = value`` into the value, in place (``pc.Tensor.__setitem__``)."""
        _note_read(value)
        self._writable("__setitem__")[key] = value

    def check_written_into(self, what: str, shape, key) -> None:
        """Refuse ``t[key] = self`` (``what``, into a tensor of ``shape``) where this Node
        requires grad and grad mode is on: PyTorch records the write (``t`` then requires
        grad); parcl's is not recorded, so the gradient through ``t`` would be dropped
        without a word. ``pc.Tensor.__setitem__`` asks each Node value."""
        if mode.state.grad and self.requires_grad:
            raise ParclError(f"{what}: a value that requires grad (shape {tuple(self.shape)}) "
                             f"written into t[{key!r}] (t of shape {tuple(shape)}) while grad "
                             "mode is on: the write is not recorded, so no gradient would "
                             "reach the value; build t with tp.slice_scatter / "
                             "tp.select_scatter, tp.cat or tp.stack, or write under "
                             "tp.no_grad() to copy the value")

    def zero_(self):
        self._writable("zero_").fill_(0)
        return self

    def fill_(self, value):
        self._writable("fill_").fill_(value)
        return self

    def normal_(self, mean=0.0, std=1.0):
        _ops().sampling.draw_into(self._writable("normal_"), "normal", mean, std)
        return self

    def uniform_(self, *bounds, **names):
        """PyTorch's ``uniform_(from=0, to=1)``: the bounds positionally, or by keyword."""
        bound = dict(zip(("from", "to"), bounds), **names)
        if len(bounds) > 2 or set(bound) - {"from", "to"}:
            raise TypeError(f"uniform_: takes from and to, got {bounds} and {sorted(names)}")
        _ops().sampling.draw_into(self._writable("uniform_"), "uniform", bound.get("from", 0.0),
                                  bound.get("to", 1.0))
        return self

    def bernoulli_(self, p=0.5):
        _ops().sampling.draw_into(self._writable("bernoulli_"), "bernoulli", p)
        return self
    # -- torch.Tensor's products (parcl/tape/ops/products.py) ------------------------------
    def dot(self, other):
        return _ops().dot(self, other)

    def vdot(self, other):
        return _ops().vdot(self, other)

    def inner(self, other):
        return _ops().inner(self, other)

    def mv(self, vec):
        return _ops().mv(self, vec)

    def addmv(self, mat, vec, *, beta=1, alpha=1):
        return _ops().addmv(self, mat, vec, beta=beta, alpha=alpha)

    def addr(self, vec1, vec2, *, beta=1, alpha=1):
        return _ops().addr(self, vec1, vec2, beta=beta, alpha=alpha)

    def addbmm(self, batch1, batch2, *, beta=1, alpha=1):
        return _ops().addbmm(self, batch1, batch2, beta=beta, alpha=alpha)

    def kron(self, other):
        return _ops().kron(self, other)

    def cross(self, other, dim=-1):
        return _ops().cross(self, other, dim)

    def dist(self, other, p=2):
        return _ops().dist(self, other, p)

    # -- torch.Tensor's cov, corrcoef and renorm (parcl/tape/ops/numerics.py) ---------------
    def cov(self, *, correction=1, fweights=None, aweights=None):
        return _ops().cov(self, correction=correction, fweights=fweights, aweights=aweights)

    def corrcoef(self):
        return _ops().corrcoef(self)

    def renorm(self, p, dim, maxnorm):
        return _ops().renorm(self, p, dim, maxnorm)

    # -- torch.Tensor's det, logdet, slogdet, inverse, matrix_power (ops/linalg_solve.py) ---
    def det(self):
        return _ops().det(self)

    def logdet(self):
        return _ops().logdet(self)

    def slogdet(self):
        return _ops().slogdet(self)

    def inverse(self):
        return _ops().inverse(self)

    def matrix_power(self, n):
        return _ops().matrix_power(self, n)

    def cholesky_solve(self, input2, upper=False):
        return _ops().cholesky_solve(self, input2, upper)

    def cholesky_inverse(self, upper=False):
        return _ops().cholesky_inverse(self, upper)

    def matrix_exp(self):
        return _ops().matrix_exp(self)

    def pinverse(self, rcond=1e-15):
        return _ops().pinverse(self, rcond)

    # -- torch.Tensor's shape helpers (parcl/tape/ops/shape_more.py, stacking.py) ----------
    def swapaxes(self, axis0, axis1):
        return _ops().swapaxes(self, axis0, axis1)

    def swapdims(self, dim0, dim1):
        return _ops().swapdims(self, dim0, dim1)

    def moveaxis(self, source, destination):
        return _ops().moveaxis(self, source, destination)

    def ravel(self):
        return _ops().ravel(self)

    def rot90(self, k=1, dims=(0, 1)):
        return _ops().rot90(self, k, dims)

    def fliplr(self):
        return _ops().fliplr(self)

    def flipud(self):
        return _ops().flipud(self)

    def clone(self, *, memory_format=None):
        return _ops().clone(self, memory_format=memory_format)

    def numel(self) -> int:
        return _ops().numel(self)

    def broadcast_to(self, size):
        return _ops().broadcast_to(self, size)

    def tensor_split(self, indices_or_sections, dim=0):
        return _ops().tensor_split(self, indices_or_sections, dim)

    def hsplit(self, indices_or_sections):
        return _ops().hsplit(self, indices_or_sections)

    def vsplit(self, indices_or_sections):
        return _ops().vsplit(self, indices_or_sections)

    def dsplit(self, indices_or_sections):
        return _ops().dsplit(self, indices_or_sections)

    # -- torch.Tensor's selecting and placing methods (parcl/tape/ops/placing.py) -----------
    def select(self, dim, index):
        return _ops().select(self, dim, index)

    def select_scatter(self, src, dim, index):
        return _ops().select_scatter(self, src, dim, index)

    def slice_scatter(self, src, dim=0, start=None, end=None, step=1):
        return _ops().slice_scatter(self, src, dim, start, end, step)

    def diagonal_scatter(self, src, offset=0, dim1=0, dim2=1):
        return _ops().diagonal_scatter(self, src, offset, dim1, dim2)

    def diag_embed(self, offset=0, dim1=-2, dim2=-1):
        return _ops().diag_embed(self, offset, dim1, dim2)

    def take(self, index):
        return _ops().take(self, index)

    def masked_select(self, mask):
        return _ops().masked_select(self, mask)

    def masked_scatter(self, mask, source):
        return _ops().masked_scatter(self, mask, source)

    def index_copy(self, dim, index, source):
        return _ops().index_copy(self, dim, index, source)

    def index_fill(self, dim, index, value):
        return _ops().index_fill(self, dim, index, value)

    # -- torch.Tensor's conveniences that training scripts call (nanoGPT's model.py) -------
    def transpose(self, dim0, dim1):
        """``x.transpose(dim0, dim1)``: two dims exchanged, as torch.Tensor's (``.T`` is
        numpy's reversal of every dim)."""
        return _ops().transpose(self, dim0, dim1)

    def split(self, split_size, dim=0):
        """``x.split(size_or_sections, dim)``, as torch.Tensor's (``tp.split``)."""
        return _ops().split(self, split_size, dim)

    @property
    def mT(self):  # noqa: N802
        """The last two dims exchanged (a batch of matrices transposed), as torch's."""
        return self._matrices("mT")

    @property
    def mH(self):  # noqa: N802
        """``mT``: parcl's tensors are real, so the conjugate transpose is the transpose."""
        return self._matrices("mH")

    def _matrices(self, what: str):
        if self.ndim < 2:
            raise ShapeError(f"Node.{what}: a tensor of at least 2 dims, got shape "
                             f"{tuple(self.shape)}")
        return _ops().transpose(self, -2, -1)

    def contiguous(self, memory_format=None):
        """The Node itself: parcl's tensors are always contiguous."""
        return self

    def dim(self) -> int:
        """The number of dims (``ndim``), as torch.Tensor's."""
        return self.ndim

    def tolist(self):
        """The value as nested Python lists (a number for a 0-d tensor), as torch's."""
        return self.value.to_host().tolist()

    def to(self, *args, dtype=None, device=None, non_blocking=False, copy=False,
           memory_format=None):
        """torch.Tensor's ``to(dtype)``, ``to(device, dtype)``, ``to(other)``: a dtype
        converts (``float``, ``int``, ``long``); a device (``"cpu"``, ``"cuda:0"``, a
        ``torch.device``-like name) changes nothing, as parcl places tensors by queue; this
        Node's own queue is taken, another queue is a DeviceError. ``copy=True`` gives a new
        tensor even when nothing changes."""
        dtype = to_arguments("Node.to", self, args, dtype, device)
        out = self if dtype is None else self._cast("to", dtype)
        return out.clone() if copy and out is self else out

    def type_as(self, other):
        """This tensor in ``other``'s dtype, as torch.Tensor's."""
        return self._cast("type_as", other.dtype)

    def float(self):  # noqa: A003
        """As float32 (parcl's float type; torch's float), itself if it is one."""
        return self._cast("float", np.float32)

    def long(self):
        """As int64."""
        return self._cast("long", np.int64)

    def int(self):  # noqa: A003
        """As int32."""
        return self._cast("int", np.int32)

    def _cast(self, op: str, dtype):
        dtype = cast_dtype(f"Node.{op}", self, dtype)
        if dtype == self.dtype:
            return self
        from .node import Node           # node.py imports this module
        # an integer result has no gradient, as PyTorch's; a float one from an integer
        # tensor is a new leaf (nothing to differentiate through); the value's pending checks
        # (an embedding's index range) go with it, as the raw Tensor's cast keeps them
        return Node(self.value._cast(op, dtype))
