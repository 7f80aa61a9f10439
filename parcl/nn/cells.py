"""PyTorch's single-step recurrent cells: ``RNNCell``, ``LSTMCell`` and ``GRUCell`` (names,
shapes, gate order and initialisation as PyTorch's, so ``load_state_dict(torch_cell
.state_dict())`` works). The gate arithmetic is ``LSTM``'s and ``GRU``'s (``recurrent``), so a
cell stepped over a sequence gives those layers' output.

>>> import numpy as np, parcl as pc, parcl.tape as tp
>>> cell = pc.nn.LSTMCell(4, 8)
>>> h, c = cell(tp.tensor(np.ones((3, 4), np.float32)))        # zero initial states
>>> h.shape, c.shape
((3, 8), (3, 8))
"""

from __future__ import annotations

import math

from ..errors import ParclError, ShapeError
from ..runtime import default_queue
from ..tape import ops
from ..tensor import Tensor
from .layers import _check_sizes, _param, redraw_uniform
from .module import Module, uniform_
from .recurrent import RNN_CELLS, _gru_cell, _lstm_cell

__all__ = ["GRUCell", "LSTMCell", "RNNCell"]


class _CellBase(Module):
    """``weight_ih`` ``(gates*hidden, input)``, ``weight_hh`` ``(gates*hidden, hidden)``,
    ``bias_ih``, ``bias_hh``, all ~ U(-1/sqrt(hidden), 1/sqrt(hidden)) in that order."""

    gates = 1

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, *, queue=None):
        super().__init__()
        name = type(self).__name__
        _check_sizes(name, {"input_size": input_size, "hidden_size": hidden_size})
        queue = queue if queue is not None else default_queue()
        self.input_size, self.hidden_size = int(input_size), int(hidden_size)
        rows, bound = self.gates * self.hidden_size, 1.0 / math.sqrt(self.hidden_size)
        self.weight_ih = _param(queue, uniform_((rows, self.input_size), bound))
        self.weight_hh = _param(queue, uniform_((rows, self.hidden_size), bound))
        if bias:
            self.bias_ih = _param(queue, uniform_((rows,), bound))
            self.bias_hh = _param(queue, uniform_((rows,), bound))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.bias = bool(bias)

    def reset_parameters(self) -> None:
        """Draw every weight and bias again as the constructor did, in place, as PyTorch's
        (see ``redraw_uniform``)."""
        redraw_uniform(self, 1.0 / math.sqrt(self.hidden_size))

    def _input(self, x):
        """``x`` as ``(N, input)`` and whether it was batched."""
        shape = tuple(x.shape)
        name = type(self).__name__
        if len(shape) not in (1, 2):
            raise ShapeError(f"{name}: expected a 1-d (unbatched) or 2-d input, got shape "
                             f"{shape}")
        if shape[-1] != self.input_size:
            raise ShapeError(f"{name}: input of shape {shape} has {shape[-1]} features, "
                             f"expected input_size={self.input_size}")
        batched = len(shape) == 2
        return (x if batched else ops.unsqueeze(x, 0)), batched

    def _state(self, h, what: str, x, batched: bool):
        """A state as ``(N, hidden)``: zeros for None, else checked against the input."""
        n = x.shape[0]
        if h is None:
            return Tensor.zeros(x.queue, (n, self.hidden_size))
        want = (n, self.hidden_size) if batched else (self.hidden_size,)
        if tuple(h.shape) != want:
            raise ShapeError(f"{type(self).__name__}: {what} has shape {tuple(h.shape)}, "
                             f"expected {want} for an input of "
                             f"{'batch ' + str(n) if batched else 'one sample (unbatched)'}")
        return h if batched else ops.unsqueeze(h, 0)

    def _project(self, x):
        return ops.linear(x, self.weight_ih, self.bias_ih)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        return s if self.bias else s + ", bias=False"


class RNNCell(_CellBase):
    """``h' = nonlinearity(x @ weight_ih.T + bias_ih + h @ weight_hh.T + bias_hh)``;
    ``nonlinearity`` ``"tanh"`` or ``"relu"``. ``cell(input, hx=None)`` takes ``(N, input)``
    or ``(input,)`` and returns ``h'`` of the same batchedness."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 nonlinearity: str = "tanh", *, queue=None):
        if nonlinearity not in RNN_CELLS:
            raise ParclError(f"RNNCell: unknown nonlinearity {nonlinearity!r}; use 'tanh' or "
                             "'relu'")
        super().__init__(input_size, hidden_size, bias, queue=queue)
        self.nonlinearity = nonlinearity

    def forward(self, input, hx=None):  # noqa: A002 - PyTorch's argument name
        x, batched = self._input(input)
        h = self._state(hx, "hx", x, batched)
        (h,) = RNN_CELLS[self.nonlinearity](self._project(x), (h,), self.weight_hh,
                                            self.bias_hh)
        return h if batched else ops.squeeze(h, 0)

    def extra_repr(self) -> str:
        s = super().extra_repr()
        return s if self.nonlinearity == "tanh" else s + f", nonlinearity={self.nonlinearity}"


class LSTMCell(_CellBase):
    """One ``LSTM`` step, gates (i, f, g, o): ``cell(input, hx=None)`` with ``hx = (h, c)``
    (None: zeros) returns ``(h', c')``."""

    gates = 4

    def forward(self, input, hx=None):  # noqa: A002 - PyTorch's argument name
        x, batched = self._input(input)
        if hx is None:
            hx = (None, None)
        elif not isinstance(hx, (tuple, list)) or len(hx) != 2 or any(s is None for s in hx):
            raise ParclError("LSTMCell: hx must be a tuple (h, c) of two tensors, or None for "
                             "zeros")
        state = (self._state(hx[0], "h", x, batched), self._state(hx[1], "c", x, batched))
        h, c = _lstm_cell(self._project(x), state, self.weight_hh, self.bias_hh)
        return (h, c) if batched else (ops.squeeze(h, 0), ops.squeeze(c, 0))


class GRUCell(_CellBase):
    """One ``GRU`` step, gates (r, z, n): ``cell(input, hx=None)`` returns ``h'``."""

    gates = 3

    def forward(self, input, hx=None):  # noqa: A002 - PyTorch's argument name
        x, batched = self._input(input)
        h = self._state(hx, "hx", x, batched)
        (h,) = _gru_cell(self._project(x), (h,), self.weight_hh, self.bias_hh)
        return h if batched else ops.squeeze(h, 0)
