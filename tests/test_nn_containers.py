"""Identity, ModuleList and Softmax: PyTorch's registration names, list behaviour, state dict
round trips, outputs against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import parcl as pc
import parcl.tape as tp


class Stack(pc.nn.Module):
    def __init__(self):
        super().__init__()
        self.h = pc.nn.ModuleList([pc.nn.Linear(3, 3) for _ in range(2)])
        self.skip = pc.nn.Identity(3, anything=True)
        self.out = pc.nn.Softmax(dim=-1)

    def forward(self, x):
        for layer in self.h:
            x = layer(x)
        return self.out(self.skip(x))


def test_modulelist_names_and_state_dict(queue):
    pc.nn.manual_seed(0)
    net = Stack()
    names = ["h.0.weight", "h.0.bias", "h.1.weight", "h.1.bias"]
    assert [n for n, _ in net.named_parameters()] == names
    assert list(net.state_dict()) == names
    state = {k: v + 1 for k, v in net.state_dict().items()}
    pc.nn.manual_seed(1)
    other = Stack()
    other.load_state_dict(state)
    for k, v in other.state_dict().items():
        assert np.array_equal(v, state[k])
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    y = other(pc.Tensor.from_host(queue, x)).to_host()
    h = x.astype(np.float64)
    for i in range(2):
        h = h @ state[f"h.{i}.weight"].T + state[f"h.{i}.bias"]
    e = np.exp(h - h.max(-1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_modulelist_list_behaviour():
    a, b, c = pc.nn.ReLU(), pc.nn.Identity(), pc.nn.Softmax(0)
    ml = pc.nn.ModuleList()
    assert len(ml) == 0 and list(ml) == []
    ml.append(a).extend([b])
    assert len(ml) == 2 and list(ml) == [a, b] and ml[-1] is b and ml[0] is a
    ml.insert(1, c)
    assert list(ml) == [a, c, b] and list(ml._modules) == ["0", "1", "2"]
    ml[0] = b
    assert ml[0] is b
    sub = ml[1:]
    assert isinstance(sub, pc.nn.ModuleList) and list(sub) == [c, b]
    with pytest.raises(IndexError, match="out of range for 3 modules"):
        ml[3]
    with pytest.raises(pc.ParclError, match="no forward"):
        ml(None)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_layer(queue, dim):
    x = np.random.default_rng(1).standard_normal((3, 4, 5))
    node = tp.tensor(pc.Tensor.from_host(queue, x.astype(np.float32)), requires_grad=True)
    with tp.Tape():
        y = pc.nn.Softmax(dim)(node)
    e = np.exp(x - x.max(dim, keepdims=True))
    np.testing.assert_allclose(y.to_host(), e / e.sum(dim, keepdims=True), rtol=1e-5,
                               atol=1e-6)
    assert y.op_name == "softmax"
    ident = pc.nn.Identity()
    assert ident(node) is node and not list(ident.parameters())


def test_a_slice_of_a_sequential_keeps_its_childrens_names(queue):
    """As PyTorch's: ``net[1:]``'s state dict has the keys its layers had in ``net``."""
    net = pc.nn.Sequential(pc.nn.Linear(4, 4, queue=queue), pc.nn.ReLU(),
                           pc.nn.Linear(4, 2, queue=queue))
    assert list(net[1:].state_dict()) == ["2.weight", "2.bias"]
    from collections import OrderedDict
    named = pc.nn.Sequential(OrderedDict(body=pc.nn.Linear(4, 4, queue=queue),
                                         head=pc.nn.Linear(4, 2, queue=queue)))
    assert list(named[1:].state_dict()) == ["head.weight", "head.bias"]
    assert named[-1] is named.head


def test_assigning_a_non_parameter_to_a_parameter_is_a_type_error(queue):
    """PyTorch's TypeError: a Node put in a parameter's place would silently leave
    parameters(), the optimizer and the state dict."""
    fc = pc.nn.Linear(4, 2, queue=queue)
    with pytest.raises(TypeError, match="Linear.weight is a parameter"):
        fc.weight = tp.tensor(np.zeros((2, 4), np.float32), requires_grad=True)
    assert len(list(fc.parameters())) == 2 and "weight" in fc.state_dict()
    fc.bias = None                                   # allowed, as in PyTorch
    assert list(fc.state_dict()) == ["weight"]


def test_replacing_a_child_by_name_keeps_its_place(queue):
    """As PyTorch's: ``add_module``/``setattr`` on an existing name replaces the child where
    it is, so a Sequential still runs it there, and ``state_dict()`` and ``parameters()``
    (what checkpoints and optimizer state are matched by) keep their order."""
    pc.nn.manual_seed(0)
    seq = pc.nn.Sequential(pc.nn.Linear(4, 4, queue=queue), pc.nn.Tanh(),
                           pc.nn.Linear(4, 4, queue=queue))
    state = seq.state_dict()
    seq.add_module("1", pc.nn.Sigmoid())
    assert [type(m).__name__ for m in seq] == ["Linear", "Sigmoid", "Linear"]
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    with tp.no_grad():
        got = seq(pc.Tensor.from_host(queue, x)).to_host()
    h = 1 / (1 + np.exp(-(x @ state["0.weight"].T + state["0.bias"])))
    np.testing.assert_allclose(got, h @ state["2.weight"].T + state["2.bias"], rtol=1e-5,
                               atol=1e-6)
    first = seq[0]
    setattr(seq, "0", pc.nn.Linear(4, 4, queue=queue))
    assert seq[0] is not first and list(seq._modules) == ["0", "1", "2"]
    assert list(seq.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert seq.parameters()[0] is seq[0].weight


def test_replacing_a_parameter_or_buffer_by_name_keeps_its_place(queue):
    bn = pc.nn.BatchNorm1d(3, queue=queue)
    order = list(bn.state_dict())
    bn.register_buffer("running_mean", pc.Tensor.zeros(queue, (3,)))
    bn.register_parameter("weight", pc.nn.Parameter(pc.Tensor.zeros(queue, (3,))))
    bn.weight = pc.nn.Parameter(pc.Tensor.zeros(queue, (3,)))
    assert list(bn.state_dict()) == order
    assert bn.parameters() == [bn.weight, bn.bias]
