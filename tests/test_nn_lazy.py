"""PyTorch's lazy layers: the input size from the first call, the layer they become (class,
parameters drawn from the seeded generator as building it then would, buffers, training flag),
outputs as torch's layer of the same weights, and a ReplicaGroup refusing an uninitialised one.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from conftest import close


def test_lazy_linear_becomes_the_linear_its_first_input_asks_for(queue, rng):
    x = rng.standard_normal((4, 5)).astype(np.float32)
    pc.nn.manual_seed(2)
    lazy = pc.nn.LazyLinear(3, bias=False)
    assert lazy.has_uninitialized_params() and lazy.parameters() == []
    assert repr(lazy) == "LazyLinear(3, bias=False)"
    y = lazy(tp.tensor(x))
    pc.nn.manual_seed(2)
    eager = pc.nn.Linear(5, 3, bias=False)                # the same draw from the same seed
    assert type(lazy) is pc.nn.Linear and repr(lazy) == repr(eager)
    np.testing.assert_array_equal(lazy.weight.to_host(), eager.weight.to_host())
    close(y.to_host(), x @ eager.weight.to_host().T, 1e-5)
    assert list(lazy.state_dict()) == ["weight"] and not hasattr(lazy, "_lazy")


@pytest.mark.parametrize("name,args,shape", [
    ("Conv1d", (4, 3), (2, 3, 9)), ("Conv1d", (4, 3), (3, 9)),
    ("Conv2d", (4, 3), (2, 3, 6, 6)), ("ConvTranspose1d", (4, 3), (2, 3, 5)),
    ("ConvTranspose2d", (4, 3), (2, 3, 4, 4))])
def test_lazy_convolutions_read_their_channels_and_match_pytorch(queue, rng, name, args,
                                                                 shape):
    x = rng.standard_normal(shape).astype(np.float32)
    lazy = getattr(pc.nn, "Lazy" + name)(*args, stride=1, padding=1)
    y = lazy(tp.tensor(x))
    ref = getattr(torch.nn, "Lazy" + name)(*args, stride=1, padding=1)
    ref(torch.tensor(x))                                 # the dry run builds it
    assert type(lazy).__name__ == name and lazy.weight.shape == tuple(ref.weight.shape)
    lazy.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})
    close(lazy(tp.tensor(x)).to_host(), ref(torch.tensor(x)).detach().numpy(), 1e-5)
    assert y.shape == tuple(ref(torch.tensor(x)).shape)


@pytest.mark.parametrize("name,shape", [("BatchNorm1d", (4, 3)), ("BatchNorm2d", (2, 3, 2, 2)),
                                        ("BatchNorm3d", (2, 3, 2, 2, 2)),
                                        ("InstanceNorm1d", (2, 3, 5)),
                                        ("InstanceNorm2d", (2, 3, 2, 2)),
                                        ("InstanceNorm3d", (2, 3, 2, 2, 2))])
def test_lazy_norms_read_num_features_and_keep_the_training_flag(queue, rng, name, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    lazy = getattr(pc.nn, "Lazy" + name)(eps=1e-3, momentum=0.2)
    y = lazy(tp.tensor(x))
    ref = getattr(torch.nn, "Lazy" + name)(eps=1e-3, momentum=0.2)
    want = ref(torch.tensor(x))
    assert type(lazy).__name__ == name and lazy.num_features == 3 and lazy.training
    assert repr(lazy) == repr(ref)
    close(y.to_host(), want.detach().numpy())
    if name.startswith("Instance"):          # unbatched: the channels are dim 0 (PyTorch's
        single = getattr(pc.nn, "Lazy" + name)()     # lazy instance norm reads dim 1 there)
        assert single(tp.tensor(x[0])).shape == shape[1:] and single.num_features == 3
    frozen = getattr(pc.nn, "Lazy" + name)().eval()
    if name.startswith("BatchNorm"):
        frozen(tp.tensor(x))
        assert not frozen.training                      # evaluation: the running statistics
        close(frozen.running_mean.to_host(), np.zeros(3))


def test_lazy_layers_refuse_inputs_without_the_size_and_replica_groups_refuse_them(devices2):
    with pytest.raises(pc.ShapeError, match=r"LazyConv2d: expected an input with at least 3 "
                                            r"dims to infer its size from, got shape \(4, 4\)"):
        pc.nn.LazyConv2d(2, 3)(tp.tensor(np.ones((4, 4), np.float32)))
    with pytest.raises(pc.ShapeError, match=r"LazyBatchNorm1d: expected an \(N, C, ...\) input"):
        pc.nn.LazyBatchNorm1d()(tp.tensor(np.ones(4, np.float32)))
    from parcl.replica import ReplicaGroup
    with pytest.raises(pc.ParclError, match="ReplicaGroup: model.0 is a LazyLinear, whose "
                                            "parameters do not exist before its first call"):
        ReplicaGroup(lambda q: pc.nn.Sequential(pc.nn.LazyLinear(3, queue=q)), devices2)

    def dry_run(q):
        model = pc.nn.Sequential(pc.nn.LazyLinear(3, queue=q))
        model(pc.Tensor.from_host(q, np.ones((1, 5), np.float32)))
        return model
    with ReplicaGroup(dry_run, devices2) as group:
        assert group.model[0].weight.shape == (3, 5)


def test_freezing_a_lazy_layer_before_its_first_call_is_refused_as_pytorch(queue):
    # it has no parameters yet: requires_grad_(False) changed nothing and the layer built at
    # the first call trained anyway (its weight requires_grad True); PyTorch raises
    model = pc.nn.Sequential(pc.nn.Linear(4, 4, queue=queue), pc.nn.LazyLinear(3))
    with pytest.raises(pc.ParclError, match=r"Sequential.requires_grad_: its layer '1' is a "
                                            r"lazy layer"):
        model.requires_grad_(False)
    with pytest.raises(pc.ParclError, match=r"LazyLinear.requires_grad_: it is a lazy layer"):
        model[1].requires_grad_(False)
    with pytest.raises(ValueError, match="uninitialized parameter"):
        torch.nn.LazyLinear(3).requires_grad_(False)
    model(tp.tensor(np.ones((2, 4), np.float32)))
    model.requires_grad_(False)                             # after it, as PyTorch
    assert not any(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize("name,args,shape", [("Linear", (2,), (3, 4)),
                                             ("Conv2d", (2, 1), (1, 3, 2, 2)),
                                             ("BatchNorm1d", (), (3, 4))])
def test_hooks_registered_before_the_first_call_keep_running_as_pytorch(queue, name, args,
                                                                        shape):
    """A lazy layer became its layer by replacing all its attributes, its hooks among them:
    hooks registered before the first call ran on that call only, so a forward hook zeroing
    a LazyLinear's output gave 0.0 on the first call and |y| summing to 7.47 on the next ones
    where PyTorch's gives 0.0 each time. They now stay, each called once per call."""
    x = np.ones(shape, np.float32)
    for lib, up in [(pc.nn, lambda a: pc.Tensor.from_host(queue, a)), (torch.nn, torch.tensor)]:
        layer = getattr(lib, "Lazy" + name)(*args)
        layer.seen = []
        layer.register_forward_pre_hook(lambda m, a: m.seen.append("pre"))
        layer.register_forward_hook(lambda m, a, out: (m.seen.append("post"), out * 0)[1])
        outs = [layer(up(x)) for _ in range(3)]
        assert layer.seen == ["pre", "post"] * 3, lib
        for y in outs:
            host = y.to_host() if lib is pc.nn else y.detach().numpy()
            np.testing.assert_array_equal(host, np.zeros_like(host))


@pytest.mark.parametrize("name,args,shape", [("Linear", (2,), (3, 4)),
                                             ("Conv2d", (2, 1), (1, 3, 2, 2)),
                                             ("BatchNorm1d", (), (3, 4))])
def test_reset_parameters_before_the_first_call_does_nothing_as_pytorch(queue, name, args,
                                                                       shape):
    """PyTorch's lazy layers take ``reset_parameters()`` before their first call and do
    nothing (there is nothing to draw yet); parcl's raised AttributeError: 'LazyLinear' object
    has no attribute 'reset_parameters', so an initialisation pass calling it on every layer
    failed on a model with a lazy one. The first call then builds the layer as without it."""
    x = np.ones(shape, np.float32)
    torch_layer = getattr(torch.nn, "Lazy" + name)(*args)
    torch_layer.reset_parameters()
    assert torch_layer.has_uninitialized_params()
    pc.nn.manual_seed(0)
    untouched = getattr(pc.nn, "Lazy" + name)(*args)
    untouched(pc.Tensor.from_host(queue, x))
    pc.nn.manual_seed(0)
    reset = getattr(pc.nn, "Lazy" + name)(*args)
    reset.reset_parameters()
    assert reset.has_uninitialized_params() and not reset.parameters()
    reset(pc.Tensor.from_host(queue, x))
    assert type(reset).__name__ == name
    for (key, a), (_, b) in zip(untouched.state_dict().items(), reset.state_dict().items()):
        np.testing.assert_array_equal(a, b, err_msg=key)
