"""``pc.nn.RNNCell``, ``LSTMCell``, ``GRUCell``, the Elman ``RNN``, ``Bilinear`` and
``tp.bilinear`` against PyTorch's: given a torch module's state dict, the same outputs and the
same gradients for the inputs, the states and every parameter; PyTorch's names, shapes,
initialisation bounds, reprs and refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from xfmr_reference import compare

import parcl as pc
import parcl.tape as tp
from conftest import leaf
from parcl import nn


def load_into_torch(ours, theirs) -> None:
    assert list(ours.state_dict()) == list(theirs.state_dict())
    theirs.load_state_dict({k: torch.from_numpy(np.array(v))
                            for k, v in ours.state_dict().items()})


def outputs(y) -> list:
    return list(y) if isinstance(y, tuple) else [y]


def check_as_torch(ours, theirs, arrays, rng, tol=1e-5):
    """``ours(*arrays)`` against ``theirs``: outputs, then the gradients of a random weighted
    sum of every output for every input array and parameter. ``arrays`` may hold a tuple (the
    LSTM state)."""
    def nested(make, a):
        return tuple(make(v) for v in a) if isinstance(a, tuple) else make(a)

    q = pc.default_queue()
    ours_in = [nested(lambda v: leaf(q, v), a) for a in arrays]
    theirs_in = [nested(lambda v: torch.tensor(v, requires_grad=True), a) for a in arrays]
    with tp.Tape() as tape:
        ys = outputs(ours(*ours_in))
        gs = [rng.standard_normal(y.shape).astype(np.float32) for y in ys]
        loss = tp.sum(tp.stack([tp.sum(tp.mul(y, pc.Tensor.from_host(q, g)))
                                for y, g in zip(ys, gs)]))
    wants = outputs(theirs(*theirs_in))
    for y, want in zip(ys, wants):
        assert y.shape == tuple(want.shape)
        np.testing.assert_allclose(y.to_host(), want.detach().numpy(), rtol=tol, atol=tol)
    tape.backward(loss)
    sum((want * torch.from_numpy(g)).sum() for want, g in zip(wants, gs)).backward()
    flat_ours = [v for a in ours_in for v in (a if isinstance(a, tuple) else (a,))]
    flat_theirs = [v for a in theirs_in for v in (a if isinstance(a, tuple) else (a,))]
    for node, tensor in zip(flat_ours, flat_theirs):
        np.testing.assert_allclose(node.grad.to_host(), tensor.grad.numpy(), rtol=tol, atol=tol)
    params = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        np.testing.assert_allclose(p.grad.to_host(), params[name].grad.numpy(), rtol=tol,
                                   atol=tol, err_msg=name)


CELLS = [("RNNCell", {}, 1), ("RNNCell", {"nonlinearity": "relu"}, 1),
         ("RNNCell", {"bias": False}, 1), ("LSTMCell", {}, 4), ("LSTMCell", {"bias": False}, 4),
         ("GRUCell", {}, 3), ("GRUCell", {"bias": False}, 3)]


@pytest.mark.parametrize("name,kw,gates", CELLS)
def test_cells_step_and_backpropagate_as_pytorch(queue, rng, name, kw, gates):
    nn.manual_seed(0)
    ours, theirs = getattr(nn, name)(5, 4, **kw), getattr(torch.nn, name)(5, 4, **kw)
    load_into_torch(ours, theirs)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    h = rng.standard_normal((3, 4)).astype(np.float32)
    state = (h, rng.standard_normal((3, 4)).astype(np.float32)) if name == "LSTMCell" else h
    check_as_torch(ours, theirs, [x, state], rng)                 # given states
    check_as_torch(ours, theirs, [x], rng)                        # hx=None: zeros
    unbatched = tuple(s[0] for s in state) if name == "LSTMCell" else state[0]
    check_as_torch(ours, theirs, [x[0], unbatched], rng)          # (input,) and (hidden,)
    assert repr(ours) == repr(theirs)


@pytest.mark.parametrize("name,gates", [("RNNCell", 1), ("LSTMCell", 4), ("GRUCell", 3)])
def test_cells_name_shape_and_initialise_their_parameters_as_pytorch(queue, name, gates):
    nn.manual_seed(0)
    cell = getattr(nn, name)(6, 16)
    shapes = {k: v.shape for k, v in cell.state_dict().items()}
    assert shapes == {"weight_ih": (gates * 16, 6), "weight_hh": (gates * 16, 16),
                      "bias_ih": (gates * 16,), "bias_hh": (gates * 16,)}
    values = np.concatenate([v.ravel() for v in cell.state_dict().values()])
    assert 0.24 < np.abs(values).max() <= 0.25                    # U(-1/sqrt(16), 1/sqrt(16))
    assert list(getattr(nn, name)(6, 16, bias=False).state_dict()) == ["weight_ih", "weight_hh"]


def test_lstm_cell_stepped_over_a_sequence_gives_the_lstm_layers_output(queue, rng):
    nn.manual_seed(0)
    lstm, cell = nn.LSTM(3, 5), nn.LSTMCell(3, 5)
    cell.load_state_dict({k[:-3]: v for k, v in lstm.state_dict().items()})   # "..._l0"
    x = rng.standard_normal((6, 2, 3)).astype(np.float32)
    out, (h_n, c_n) = lstm(tp.tensor(x))
    h = c = None
    for t in range(6):
        h, c = cell(tp.tensor(x[t]), None if h is None else (h, c))
        np.testing.assert_allclose(h.to_host(), out.to_host()[t], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(c.to_host(), c_n.to_host()[0], rtol=1e-5, atol=1e-6)


def test_gru_cell_passes_gradcheck(queue, rng):
    nn.manual_seed(0)
    cell = nn.GRUCell(3, 2)
    x, h = leaf(queue, rng.standard_normal((2, 3))), leaf(queue, rng.standard_normal((2, 2)))
    assert tp.gradcheck(cell, [x, h])
    assert tp.gradcheck(nn.RNNCell(3, 2), [x, h])


def test_cells_refuse_bad_inputs_states_and_options(queue):
    cell = nn.LSTMCell(3, 4)
    x = tp.tensor(np.ones((2, 3), np.float32))
    with pytest.raises(pc.ShapeError, match=r"LSTMCell: expected a 1-d \(unbatched\) or 2-d "
                                            r"input, got shape \(1, 2, 3\)"):
        cell(tp.tensor(np.ones((1, 2, 3), np.float32)))
    with pytest.raises(pc.ShapeError, match="input of shape .* has 5 features, expected "
                                            "input_size=3"):
        cell(tp.tensor(np.ones((2, 5), np.float32)))
    h = tp.tensor(np.zeros((3, 4), np.float32))
    with pytest.raises(pc.ShapeError, match=r"LSTMCell: h has shape \(3, 4\), expected "
                                            r"\(2, 4\)"):
        cell(x, (h, h))
    with pytest.raises(pc.ParclError, match="hx must be a tuple"):
        cell(x, h)
    with pytest.raises(pc.ShapeError, match=r"GRUCell: hx has shape \(2, 4\), expected \(4,\)"):
        nn.GRUCell(3, 4)(tp.tensor(np.ones(3, np.float32)), tp.tensor(np.ones((2, 4),
                                                                              np.float32)))
    with pytest.raises(pc.ParclError, match="RNNCell: unknown nonlinearity 'sigmoid'"):
        nn.RNNCell(3, 4, nonlinearity="sigmoid")


@pytest.mark.parametrize("lead", [(5,), (2, 3), ()])
@pytest.mark.parametrize("bias", [True, False])
def test_bilinear_matches_pytorch(queue, rng, lead, bias):
    nn.manual_seed(0)
    ours, theirs = nn.Bilinear(3, 4, 2, bias=bias), torch.nn.Bilinear(3, 4, 2, bias=bias)
    load_into_torch(ours, theirs)
    x1 = rng.standard_normal(lead + (3,)).astype(np.float32)
    x2 = rng.standard_normal(lead + (4,)).astype(np.float32)
    check_as_torch(ours, theirs, [x1, x2], rng)
    assert repr(ours) == repr(theirs)


def test_bilinear_computes_x1_a_x2_plus_b(queue):
    w = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    x1, x2 = np.array([[1.0, 0.0, 2.0]], np.float32), np.array([[0.0, 1.0, 0.0, -1.0]],
                                                               np.float32)
    y = tp.bilinear(tp.tensor(x1), tp.tensor(x2), tp.tensor(w),
                    tp.tensor(np.array([0.5, -0.5], np.float32)))
    np.testing.assert_allclose(y.to_host(), np.einsum("bi,oij,bj->bo", x1, w, x2) + [0.5, -0.5])
    assert y.to_host().tolist() == [[-5.5, -6.5]]          # (1 + 2) * (-2) + b


def test_bilinear_initialises_within_one_over_sqrt_in1_and_passes_gradcheck(queue, rng):
    nn.manual_seed(0)
    layer = nn.Bilinear(16, 3, 40)
    assert layer.weight.shape == (40, 16, 3) and layer.bias.shape == (40,)
    assert 0.24 < np.abs(layer.weight.to_host()).max() <= 0.25
    assert np.abs(layer.bias.to_host()).max() <= 0.25
    x1, x2, w, b = (leaf(queue, rng.standard_normal(s)) for s in ((2, 3), (2, 4), (5, 3, 4),
                                                                  (5,)))
    assert tp.gradcheck(tp.bilinear, [x1, x2, w, b])


def test_bilinear_refuses_mismatched_shapes_naming_them(queue):
    layer = nn.Bilinear(3, 4, 2)
    with pytest.raises(pc.ShapeError, match=r"bilinear: expected input1 \(\*, in1\) .* got "
                                            r"input1 \(5, 3\), input2 \(1, 4\), weight "
                                            r"\(2, 3, 4\)"):
        layer(tp.tensor(np.ones((5, 3), np.float32)), tp.tensor(np.ones((1, 4), np.float32)))
    with pytest.raises(pc.ShapeError, match="input2 \\(5, 3\\)"):
        layer(tp.tensor(np.ones((5, 3), np.float32)), tp.tensor(np.ones((5, 3), np.float32)))


@pytest.mark.parametrize("kw", [{}, {"nonlinearity": "relu"}, {"num_layers": 2, "bias": False},
                                {"bidirectional": True, "batch_first": True},
                                {"num_layers": 2, "nonlinearity": "relu", "bidirectional": True}],
                         ids=lambda kw: "-".join(kw) or "default")
def test_rnn_matches_pytorchs_elman_network(queue, rng, kw):
    torch.manual_seed(0)
    theirs, ours = torch.nn.RNN(3, 4, **kw), nn.RNN(3, 4, **kw)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    x = rng.standard_normal((2, 5, 3) if kw.get("batch_first") else (5, 2, 3))
    d = 2 if kw.get("bidirectional") else 1
    h0 = rng.standard_normal((kw.get("num_layers", 1) * d, 2, 4))
    out, h_n = compare(queue, theirs, ours, [x.astype(np.float32), h0.astype(np.float32)],
                       lambda m, x, h: m(x, h), lambda m, x, h: m(x, h), tol=1e-5)
    assert h_n.shape == h0.shape
    assert repr(ours) == repr(theirs)


def test_rnn_takes_nonlinearity_fourth_as_pytorch_and_refuses_unknown_ones(queue, rng):
    rnn = nn.RNN(3, 4, 1, "relu")
    x = tp.tensor(rng.standard_normal((6, 3)).astype(np.float32))        # unbatched (T, in)
    out, h_n = rnn(x)
    assert out.shape == (6, 4) and h_n.shape == (1, 4)
    assert (out.to_host() >= 0).all()
    np.testing.assert_array_equal(out.to_host()[-1], h_n.to_host()[0])
    with pytest.raises(pc.ParclError, match="RNN: unknown nonlinearity 'gelu'"):
        nn.RNN(3, 4, nonlinearity="gelu")
