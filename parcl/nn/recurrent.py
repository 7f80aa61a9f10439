"""Recurrent layers: PyTorch's ``RNN``, ``LSTM`` and ``GRU`` (signatures, parameter names and
shapes, gate order, initialisation), so ``load_state_dict(torch_module.state_dict())`` works.

Each is a Python loop over the time steps of existing ops (``linear``, ``sigmoid``, ``tanh``,
``mul``, ``add``, ``chunk``): the input's projection for every step is one GEMM per layer and
direction, then each step adds the hidden state's projection and applies the gates. The graph is
built eagerly, step by step, so its gradient is the ops' own (backpropagation through time).

>>> import numpy as np, parcl as pc, parcl.tape as tp
>>> lstm = pc.nn.LSTM(4, 8, num_layers=2, batch_first=True)
>>> x = tp.tensor(np.ones((3, 5, 4), np.float32))
>>> out, (h_n, c_n) = lstm(x)
>>> out.shape, h_n.shape, c_n.shape
((3, 5, 8), (2, 3, 8), (2, 3, 8))
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from ..errors import ParclError, ShapeError
from ..runtime import default_queue
from ..tape import ops
from ..tape.node import Node
from ..tape.ops.picks import constant
from ..tensor import Tensor
from .layers import _check_sizes, _param, redraw_uniform
from .module import Module, uniform_
from .utils.rnn import PackedSequence, packed_rows, pad_packed_sequence

__all__ = ["GRU", "LSTM", "RNN"]


def _rnn_tanh_cell(gi, state, w_hh, b_hh):
    """One Elman step: ``tanh(x W_ih^T + b_ih + h W_hh^T + b_hh)``."""
    h, = state
    return (ops.tanh(ops.add(gi, ops.linear(h, w_hh, b_hh))),)


def _rnn_relu_cell(gi, state, w_hh, b_hh):
    """One Elman step with ReLU for tanh."""
    h, = state
    return (ops.relu(ops.add(gi, ops.linear(h, w_hh, b_hh))),)


RNN_CELLS = {"tanh": _rnn_tanh_cell, "relu": _rnn_relu_cell}


def _lstm_cell(gi, state, w_hh, b_hh):
    """One LSTM step: gates (i, f, g, o) as PyTorch orders them."""
    h, c = state
    gates = ops.add(gi, ops.linear(h, w_hh, b_hh))
    i, f, g, o = ops.chunk(gates, 4, 1)
    c = ops.add(ops.mul(ops.sigmoid(f), c), ops.mul(ops.sigmoid(i), ops.tanh(g)))
    return ops.mul(ops.sigmoid(o), ops.tanh(c)), c


def _gru_cell(gi, state, w_hh, b_hh):
    """One GRU step: gates (r, z, n) as PyTorch orders them; ``b_hn`` inside ``r * (...)``."""
    h, = state
    i_r, i_z, i_n = ops.chunk(gi, 3, 1)
    h_r, h_z, h_n = ops.chunk(ops.linear(h, w_hh, b_hh), 3, 1)
    r = ops.sigmoid(ops.add(i_r, h_r))
    z = ops.sigmoid(ops.add(i_z, h_z))
    n = ops.tanh(ops.add(i_n, ops.mul(r, h_n)))
    return (ops.add(n, ops.mul(z, ops.sub(h, n))),)        # (1 - z) * n + z * h


class _RNNBase(Module):
    """The layers, directions and parameters every recurrent layer shares."""

    mode = ""
    gates = 1
    cell = None
    states = 1                    # tensors in the state: (h,) or (h, c)

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, *, queue=None):
        super().__init__()
        name = self.mode
        _check_sizes(name, {"input_size": input_size, "hidden_size": hidden_size,
                            "num_layers": num_layers})
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) \
                or not 0.0 <= dropout <= 1.0:
            raise ParclError(f"{name}: dropout must be a number in [0, 1], got {dropout!r}")
        if dropout > 0 and num_layers == 1:
            warnings.warn(f"dropout option adds dropout after all but last recurrent layer, so "
                          f"non-zero dropout expects num_layers greater than 1, but got "
                          f"dropout={dropout} and num_layers={num_layers}", stacklevel=2)
        queue = queue if queue is not None else default_queue()
        self.input_size, self.hidden_size = int(input_size), int(hidden_size)
        self.num_layers, self.bias = int(num_layers), bool(bias)
        self.batch_first, self.dropout = bool(batch_first), float(dropout)
        self.bidirectional = bool(bidirectional)
        directions = 2 if self.bidirectional else 1
        rows, bound = self.gates * self.hidden_size, 1.0 / math.sqrt(self.hidden_size)
        names = []
        for layer in range(self.num_layers):
            width = self.input_size if layer == 0 else self.hidden_size * directions
            for suffix in ("", "_reverse")[:directions]:
                keys = [f"weight_ih_l{layer}{suffix}", f"weight_hh_l{layer}{suffix}",
                        f"bias_ih_l{layer}{suffix}", f"bias_hh_l{layer}{suffix}"]
                shapes = [(rows, width), (rows, self.hidden_size), (rows,), (rows,)]
                for key, shape in list(zip(keys, shapes))[:4 if self.bias else 2]:
                    setattr(self, key, _param(queue, uniform_(shape, bound)))
                names.append(tuple(keys))
        self._cells = tuple(names)             # per (layer, direction): its four names

    def reset_parameters(self) -> None:
        """Draw every weight and bias again as the constructor did, in place, as PyTorch's
        (see ``redraw_uniform``)."""
        redraw_uniform(self, 1.0 / math.sqrt(self.hidden_size))

    def flatten_parameters(self) -> None:
        """PyTorch's cuDNN packing call: nothing to do here (kept so torch code runs)."""

    def _weights(self, index: int):
        w_ih, w_hh, b_ih, b_hh = self._cells[index]
        if not self.bias:
            return getattr(self, w_ih), getattr(self, w_hh), None, None
        return tuple(getattr(self, k) for k in (w_ih, w_hh, b_ih, b_hh))

    def _check_input(self, x) -> bool:
        """Whether ``x`` is batched; refuses other ranks and widths."""
        shape = tuple(x.shape)
        if len(shape) not in (2, 3):
            raise ShapeError(f"{self.mode}: expected a 2-d (unbatched) or 3-d input, got shape "
                             f"{shape}")
        if shape[-1] != self.input_size:
            raise ShapeError(f"{self.mode}: input of shape {shape} has {shape[-1]} features, "
                             f"expected input_size={self.input_size}")
        if shape[0 if not self.batch_first or len(shape) == 2 else 1] == 0:
            raise ShapeError(f"{self.mode}: input of shape {shape} has no time steps")
        return len(shape) == 3

    def _initial(self, hx, what: str, batch: int, batched: bool, queue):
        """The per-(layer, direction) pieces of an initial state, or zeros."""
        count = len(self._cells)
        if hx is None:
            zeros = Tensor.zeros(queue, (batch, self.hidden_size))
            return [zeros] * count
        want = (count, batch, self.hidden_size) if batched else (count, self.hidden_size)
        if tuple(hx.shape) != want:
            raise ShapeError(f"{self.mode}: {what} has shape {tuple(hx.shape)}, expected {want} "
                             "(num_layers * num_directions, batch, hidden_size)"
                             if batched else
                             f"{self.mode}: {what} has shape {tuple(hx.shape)}, expected {want} "
                             "for an unbatched input (num_layers * num_directions, "
                             "hidden_size)")
        if not batched:
            hx = ops.unsqueeze(hx, 1)
        return list(ops.unbind(hx, 0))

    def _run(self, x, initial, masks=None):
        """Every layer and direction over ``x`` ``(T, B, I)``; returns the last layer's output
        ``(T, B, D*H)`` and the final states, one list per state tensor. ``masks[t]`` (a
        packed batch's): the rows still running at step ``t`` (None: all); the others keep
        their state, so a sequence's final state is the one after its last element and a
        reverse direction starts from the initial state at that element."""
        directions = 2 if self.bidirectional else 1
        finals = [[] for _ in range(self.states)]
        for layer in range(self.num_layers):
            outs = []
            for d in range(directions):
                index = layer * directions + d
                w_ih, w_hh, b_ih, b_hh = self._weights(index)
                steps = ops.unbind(ops.linear(x, w_ih, b_ih), 0)
                state = tuple(s[index] for s in initial)
                ys = [None] * len(steps)
                for t in (reversed(range(len(steps))) if d else range(len(steps))):
                    new = self.cell(steps[t], state, w_hh, b_hh)
                    if masks is not None and masks[t] is not None:
                        new = tuple(ops.where(masks[t], n, s) for n, s in zip(new, state))
                    state = new
                    ys[t] = state[0]
                outs.append(ops.stack(ys, 0))
                for kept, s in zip(finals, state):
                    kept.append(s)
            x = outs[0] if directions == 1 else ops.cat(outs, 2)
            if self.dropout and self.training and layer < self.num_layers - 1:
                x = ops.dropout(x, self.dropout, True)
        return x, [ops.stack(f, 0) for f in finals]

    def _forward(self, x, hx: tuple):
        if isinstance(x, PackedSequence):
            return self._forward_packed(x, hx)
        batched = self._check_input(x)
        if not batched:
            x = ops.unsqueeze(x, 1)
        elif self.batch_first:
            x = ops.transpose(x, (1, 0, 2))
        batch = x.shape[1]
        what = ("h_0", "c_0")
        initial = [self._initial(h, what[i], batch, batched, x.queue) for i, h in enumerate(hx)]
        out, finals = self._run(x, initial)
        if not batched:
            return ops.squeeze(out, 1), [ops.squeeze(f, 1) for f in finals]
        if self.batch_first:
            out = ops.transpose(out, (1, 0, 2))
        return out, finals

    def _forward_packed(self, packed: PackedSequence, hx: tuple):
        """A ``PackedSequence`` in, one out; the states in the batch's own order (its
        ``sorted_indices`` applied to ``hx`` and undone on the final states, as PyTorch's)."""
        padded, _ = pad_packed_sequence(PackedSequence(packed.data, packed.batch_sizes))
        self._check_input(padded)
        queue = padded.value.queue if isinstance(padded, Node) else padded.queue
        batch, sizes = padded.shape[1], packed.batch_sizes
        rows = np.arange(batch)[:, None]
        masks = [None if b == batch else constant(queue, rows < b) for b in sizes]
        what = ("h_0", "c_0")
        order = (None if packed.sorted_indices is None else
                 constant(queue, np.asarray(packed.sorted_indices, np.int64)))
        initial = []
        for i, h in enumerate(hx):
            if h is not None and order is not None:
                self._initial(h, what[i], batch, True, queue)        # its shape checked
                h = ops.index_select(h, 1, order)
            initial.append(self._initial(h, what[i], batch, True, queue))
        out, finals = self._run(padded, initial, masks)
        flat = ops.reshape(out, (out.shape[0] * batch, out.shape[2]))
        data = ops.index_select(flat, 0, constant(queue, packed_rows(sizes, batch)))
        if packed.unsorted_indices is not None:
            undo = constant(queue, np.asarray(packed.unsorted_indices, np.int64))
            finals = [ops.index_select(f, 1, undo) for f in finals]
        return PackedSequence(data, sizes, packed.sorted_indices, packed.unsorted_indices), \
            finals

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout:
            s += f", dropout={self.dropout}"
        return s + (", bidirectional=True" if self.bidirectional else "")


class LSTM(_RNNBase):
    """PyTorch's ``nn.LSTM(input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
    dropout=0.0, bidirectional=False, proj_size=0)`` (``proj_size`` must be 0). Parameters
    ``weight_ih_l{k}`` ``(4*hidden, in)``, ``weight_hh_l{k}`` ``(4*hidden, hidden)``,
    ``bias_ih_l{k}``, ``bias_hh_l{k}`` (and ``..._reverse`` when bidirectional), gates stacked
    (i, f, g, o), all ~ U(-1/sqrt(hidden), 1/sqrt(hidden)). ``lstm(input, (h_0, c_0)=None)``
    takes ``(T, B, in)`` (``(B, T, in)`` with ``batch_first``) or unbatched ``(T, in)`` and
    returns ``output, (h_n, c_n)``: ``output`` ``(T, B, D*hidden)``, the states
    ``(D*num_layers, B, hidden)``; ``dropout`` is applied to every layer's output but the last
    while training."""

    mode, gates, states = "LSTM", 4, 2
    cell = staticmethod(_lstm_cell)

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, proj_size: int = 0, *, queue=None):
        if proj_size:
            raise ParclError(f"LSTM: proj_size={proj_size} is not supported (only 0)")
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, queue=queue)

    def forward(self, input, hx=None):  # noqa: A002 - PyTorch's argument name
        """``output, (h_n, c_n)``; ``hx`` is ``(h_0, c_0)`` or None (zeros)."""
        if hx is None:
            hx = (None, None)
        elif not isinstance(hx, (tuple, list)) or len(hx) != 2:
            raise ParclError(f"LSTM: hx must be a tuple (h_0, c_0), got {type(hx).__name__}")
        elif any(s is None for s in hx):
            # a None inside hx would start that state at zeros while the other is carried
            # over (a c_n lost between truncated-BPTT chunks resets the cell, silently);
            # PyTorch refuses it too: zeros for both is hx=None
            missing = [name for name, s in zip(("h_0", "c_0"), hx) if s is None]
            raise ParclError(f"LSTM: hx=(h_0, c_0) has {' and '.join(missing)} None; pass both "
                             "states, or hx=None for zeros")
        out, (h_n, c_n) = self._forward(input, tuple(hx))
        return out, (h_n, c_n)


class GRU(_RNNBase):
    """PyTorch's ``nn.GRU(input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
    dropout=0.0, bidirectional=False)``. Parameters as ``LSTM``'s with ``3*hidden`` rows, gates
    stacked (r, z, n); ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``, ``h' = (1 - z) * n +
    z * h``. ``gru(input, h_0=None)`` returns ``output, h_n``."""

    mode, gates, states = "GRU", 3, 1
    cell = staticmethod(_gru_cell)

    def forward(self, input, hx=None):  # noqa: A002 - PyTorch's argument name
        """``output, h_n``; ``hx`` is ``h_0`` or None (zeros)."""
        out, (h_n,) = self._forward(input, (hx,))
        return out, h_n


class RNN(_RNNBase):
    """PyTorch's ``nn.RNN(input_size, hidden_size, num_layers=1, nonlinearity="tanh",
    bias=True, batch_first=False, dropout=0.0, bidirectional=False)``: the Elman network
    ``h_t = nonlinearity(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)``, ``nonlinearity``
    ``"tanh"`` or ``"relu"``. Parameters as ``LSTM``'s with ``hidden`` rows; ``rnn(input,
    h_0=None)`` returns ``output, h_n``."""

    mode, gates, states = "RNN", 1, 1

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 nonlinearity: str = "tanh", bias: bool = True, batch_first: bool = False,
                 dropout: float = 0.0, bidirectional: bool = False, *, queue=None):
        if nonlinearity not in RNN_CELLS:
            raise ParclError(f"RNN: unknown nonlinearity {nonlinearity!r}; use 'tanh' or "
                             "'relu'")
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, queue=queue)
        self.nonlinearity = nonlinearity

    def cell(self, gi, state, w_hh, b_hh):
        """One step with ``nonlinearity`` as it is now (read at each call, as PyTorch's)."""
        return RNN_CELLS[self.nonlinearity](gi, state, w_hh, b_hh)

    def forward(self, input, hx=None):  # noqa: A002 - PyTorch's argument name
        """``output, h_n``; ``hx`` is ``h_0`` or None (zeros)."""
        out, (h_n,) = self._forward(input, (hx,))
        return out, h_n
