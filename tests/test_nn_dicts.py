"""ModuleDict, ParameterList, ParameterDict, get_submodule / get_parameter / get_buffer and
requires_grad_, as PyTorch's: the same state-dict keys, orders and errors."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp


def param(queue, *values):
    return pc.nn.Parameter.from_host(queue, np.array(values, np.float32))


def test_module_dict_keys_and_order_are_torchs(queue):
    ours = pc.nn.ModuleDict({"enc": pc.nn.Linear(3, 4, queue=queue),
                             "head": pc.nn.Linear(4, 2, queue=queue)})
    ours["act"] = pc.nn.ReLU()
    theirs = torch.nn.ModuleDict({"enc": torch.nn.Linear(3, 4), "head": torch.nn.Linear(4, 2)})
    theirs["act"] = torch.nn.ReLU()
    assert list(ours) == list(theirs) == ["enc", "head", "act"]
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours["enc"] = pc.nn.Linear(3, 4, queue=queue)             # a replacement keeps its place
    assert ours.keys() == ["enc", "head", "act"] and len(ours) == 3
    assert "head" in ours and "tail" not in ours
    popped = ours.pop("act")
    assert isinstance(popped, pc.nn.ReLU) and ours.keys() == ["enc", "head"]
    del ours["head"]
    assert [k for k, _ in ours.named_parameters()] == ["enc.weight", "enc.bias"]
    ours.clear()
    assert len(ours) == 0 and ours.parameters() == []


def test_module_dict_inside_a_model_trains_and_checkpoints(queue, tmp_path):
    class Heads(pc.nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = pc.nn.ModuleDict([("a", pc.nn.Linear(2, 1, queue=queue)),
                                           ("b", pc.nn.Linear(2, 1, queue=queue))])

        def forward(self, x):
            return self.heads["a"](x) + self.heads["b"](x)

    model = Heads()
    assert list(model.state_dict()) == ["heads.a.weight", "heads.a.bias", "heads.b.weight",
                                        "heads.b.bias"]
    x = tp.tensor(pc.Tensor.from_host(queue, np.ones((3, 2), np.float32)))
    with tp.Tape() as tape:
        loss = tp.sum(model(x))
    tape.backward(loss)
    assert all(p.grad is not None for p in model.parameters())
    pc.save(tmp_path / "m.safetensors", model)
    other = Heads()
    pc.load(tmp_path / "m.safetensors", other)
    for (k, a), (_, b) in zip(model.state_dict().items(), other.state_dict().items()):
        np.testing.assert_array_equal(a, b, err_msg=k)


@pytest.mark.parametrize("bad", ["", "a.b", 3])
def test_module_dict_refuses_the_names_add_module_refuses(queue, bad):
    d = pc.nn.ModuleDict()
    with pytest.raises((pc.nn.StateDictError, TypeError, AttributeError)):
        d[bad] = pc.nn.ReLU()
    assert len(d) == 0
    with pytest.raises(TypeError, match="expected an nn.Module"):
        d["x"] = np.zeros(2)
    with pytest.raises(pc.ParclError, match="no forward"):
        d()


def test_parameter_list_and_dict(queue):
    ps = pc.nn.ParameterList([param(queue, 1.0), param(queue, 2.0, 3.0)])
    ps.append(param(queue, 4.0))
    assert [k for k, _ in ps.named_parameters()] == ["0", "1", "2"]
    assert float(ps[-1].to_host()[0]) == 4.0 and len(ps) == 3
    ps[1] = param(queue, 5.0)
    assert ps[1].to_host().tolist() == [5.0]
    with pytest.raises(IndexError):
        ps[3]
    with pytest.raises(TypeError, match="expected a pc.nn.Parameter"):
        ps.append(pc.Tensor.from_host(queue, np.zeros(1, np.float32)))
    pd = pc.nn.ParameterDict({"scale": param(queue, 1.0), "shift": param(queue, 0.0)})
    assert pd.keys() == ["scale", "shift"] and "scale" in pd
    del pd["scale"]
    assert list(pd.state_dict()) == ["shift"]
    torch_keys = list(torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(1))] * 1)
                      .state_dict())
    assert torch_keys == ["0"]


def test_get_submodule_parameter_and_buffer_as_torch(queue):
    ours = pc.nn.Sequential(pc.nn.Linear(2, 2, queue=queue), pc.nn.BatchNorm1d(2, queue=queue))
    theirs = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    assert type(ours.get_submodule("1")).__name__ == type(theirs.get_submodule("1")).__name__
    assert ours.get_submodule("") is ours
    assert ours.get_parameter("0.weight") is ours[0].weight
    assert ours.get_buffer("1.running_mean") is ours[1].running_mean
    for target in ("2", "0.nothing"):
        with pytest.raises(AttributeError):
            theirs.get_submodule(target)
        with pytest.raises(AttributeError, match="has no submodule"):
            ours.get_submodule(target)
    with pytest.raises(AttributeError, match="has no parameter 'bias2'"):
        ours.get_parameter("0.bias2")
    with pytest.raises(AttributeError, match="has no buffer 'weight'"):
        ours.get_buffer("0.weight")


def test_requires_grad_false_freezes_a_submodule(queue):
    model = pc.nn.Sequential(pc.nn.Linear(2, 2, queue=queue), pc.nn.Linear(2, 1, queue=queue))
    assert model[0].requires_grad_(False) is model[0]
    x = tp.tensor(pc.Tensor.from_host(queue, np.ones((3, 2), np.float32)))
    with tp.Tape() as tape:
        loss = tp.sum(model(x))
    tape.backward(loss)
    assert model[0].weight.grad is None and model[0].bias.grad is None
    assert model[1].weight.grad is not None
    model.requires_grad_()
    assert all(p.requires_grad for p in model.parameters())
    with pytest.raises(pc.ParclError, match="expected a bool"):
        model.requires_grad_("no")


def test_parameter_dict_from_a_plain_dict_has_torchs_sorted_order(queue):
    """PyTorch's ParameterDict takes a plain ``dict`` in sorted key order (an OrderedDict, a
    ParameterDict or pairs in their own order); parcl kept the dict's order, so
    ``parameters()`` and ``state_dict()`` listed ``shift`` before ``scale`` where PyTorch
    lists ``scale`` first, and an optimizer state matched by position put the moments of one
    parameter on the other, silently."""
    values = {"shift": (0.0, 1.0), "scale": (2.0,), "bias": (3.0, 4.0)}
    ours = pc.nn.ParameterDict({k: param(queue, *v) for k, v in values.items()})
    theirs = torch.nn.ParameterDict({k: torch.nn.Parameter(torch.tensor(v))
                                     for k, v in values.items()})
    assert ours.keys() == list(theirs.keys()) == ["bias", "scale", "shift"]
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [p.shape for p in ours.parameters()] == [tuple(p.shape) for p in theirs.parameters()]
    ours.update({"z": param(queue, 0.0), "a": param(queue, 0.0)})
    theirs.update({"z": torch.nn.Parameter(torch.zeros(1)),
                   "a": torch.nn.Parameter(torch.zeros(1))})
    assert ours.keys() == list(theirs.keys()) == ["bias", "scale", "shift", "a", "z"]
    ordered = [("y", param(queue, 0.0)), ("x", param(queue, 0.0))]     # pairs keep their order
    assert pc.nn.ParameterDict(ordered).keys() == ["y", "x"]
    assert pc.nn.ParameterDict(OrderedDict(ordered)).keys() == ["y", "x"]
