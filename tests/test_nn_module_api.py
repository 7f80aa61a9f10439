"""The ``pc.nn.Module`` API where it must be PyTorch's: what ``register_buffer``,
``register_parameter`` and ``add_module`` accept, and the layers' own attributes and
methods, each checked against ``torch.nn``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp


def host(y) -> np.ndarray:
    return (y.value if isinstance(y, tp.Node) else y).to_host()


# -- a name in use for something else is refused, as PyTorch's KeyError ---------------------
def _register(module, how: str, name: str, queue, torch_side: bool = False):
    if how == "register_buffer":
        value = torch.zeros(2) if torch_side else pc.Tensor.zeros(queue, (2,))
        module.register_buffer(name, value)
    elif how == "register_parameter":
        value = (torch.nn.Parameter(torch.zeros(2)) if torch_side
                 else pc.nn.Parameter(pc.Tensor.zeros(queue, (2,))))
        module.register_parameter(name, value)
    else:
        module.add_module(name, torch.nn.ReLU() if torch_side else pc.nn.ReLU())


IN_USE = [(how, name) for how in ("register_buffer", "register_parameter", "add_module")
          for name in ("weight", "in_features", "training", "forward")
          if (how, name) != ("register_parameter", "weight")]     # that one replaces


@pytest.mark.parametrize("how, name", IN_USE)
def test_registering_a_name_in_use_for_something_else_is_a_key_error_as_pytorch(queue, how,
                                                                                name):
    """``register_buffer("weight", t)`` on a Linear took the weight out of ``parameters()``
    (an optimizer built afterwards no longer trained it) where PyTorch raises ``KeyError:
    "attribute 'weight' already exists"``; the same for any attribute, method or flag."""
    with pytest.raises(KeyError, match="already exists"):
        _register(torch.nn.Linear(3, 2), how, name, queue, torch_side=True)
    fc = pc.nn.Linear(3, 2, queue=queue)
    with pytest.raises(pc.nn.NameInUseError, match=rf"Linear.{how}\('{name}'\).*already"):
        _register(fc, how, name, queue)
    assert [n for n, _ in fc.named_parameters()] == ["weight", "bias"]
    assert list(fc.state_dict()) == ["weight", "bias"] and fc.buffers() == []
    assert isinstance(pc.nn.NameInUseError("x"), pc.ParclError)


def test_registering_again_under_a_name_of_the_same_kind_replaces_it_as_pytorch(queue):
    ours, theirs = pc.nn.BatchNorm1d(3, queue=queue), torch.nn.BatchNorm1d(3)
    ours.register_buffer("running_mean", pc.Tensor.full(queue, (3,), 2.0))
    theirs.register_buffer("running_mean", torch.full((3,), 2.0))
    ours.register_parameter("weight", pc.nn.Parameter(pc.Tensor.full(queue, (3,), 5.0)))
    theirs.register_parameter("weight", torch.nn.Parameter(torch.full((3,), 5.0)))
    ours.register_parameter("bias", None)
    theirs.register_parameter("bias", None)
    got = ours.state_dict()
    want = {k: v for k, v in theirs.state_dict().items() if k != "num_batches_tracked"}
    assert list(got) == list(want)
    for k in got:
        np.testing.assert_array_equal(got[k], want[k].numpy(), err_msg=k)
    seq = pc.nn.Sequential(pc.nn.ReLU())
    seq.add_module("0", pc.nn.Tanh())
    assert type(seq[0]).__name__ == "Tanh"
    m = pc.nn.Module()
    m.note = 1
    del m.note                      # a name freed by delattr takes anything
    m.register_buffer("note", pc.Tensor.zeros(queue, (1,)))
    assert [n for n, _ in m.named_buffers()] == ["note"]


# -- batch norm with one running statistic set to None ---------------------------------------
@pytest.mark.parametrize("cls", ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm"])
@pytest.mark.parametrize("which", ["running_mean", "running_var"])
def test_batch_norm_with_one_running_statistic_none_raises_in_training_as_pytorch(queue, cls,
                                                                                  which):
    """With only ``running_mean`` (or only ``running_var``) set to None a training forward
    normalised with the batch's statistics, silently (its first row [0.064, -0.074, 1.106]
    for a (4, 3) input), where PyTorch's ``F.batch_norm`` raises ``ValueError: running_mean
    and running_var must either both be None or neither be None``; evaluation raised already."""
    ndim = {"BatchNorm1d": 2, "BatchNorm2d": 4, "BatchNorm3d": 5, "SyncBatchNorm": 4}[cls]
    x = np.random.default_rng(0).standard_normal((4, 3) + (2,) * (ndim - 2)).astype(np.float32)
    theirs = getattr(torch.nn, "BatchNorm2d" if cls == "SyncBatchNorm" else cls)(3)
    setattr(theirs, which, None)
    with pytest.raises(ValueError, match="both be None"):
        theirs(torch.from_numpy(x))
    ours = getattr(pc.nn, cls)(3, queue=queue)
    setattr(ours, which, None)
    for training in (True, False):
        ours.train(training)
        with pytest.raises(pc.ParclError, match="batch_norm: running_mean and running_var"):
            ours(pc.Tensor.from_host(queue, x))


# -- pooling layers store stride = kernel_size at construction -------------------------------
@pytest.mark.parametrize("cls, ndim", [("MaxPool1d", 3), ("MaxPool2d", 4), ("MaxPool3d", 5),
                                       ("AvgPool1d", 3), ("AvgPool2d", 4), ("AvgPool3d", 5)])
def test_a_pools_stride_none_is_its_kernel_size_fixed_at_construction_as_pytorch(queue, cls,
                                                                                 ndim):
    """PyTorch stores ``stride = kernel_size`` when built with ``stride=None``: ``pool.stride``
    reads 2, and a ``kernel_size`` changed to 3 afterwards keeps stride 2 (a (1, 1, 8) input
    pools to length 3). parcl kept None, so ``stride`` read None and the changed pool took
    stride 3 (length 2), silently."""
    ours, theirs = getattr(pc.nn, cls)(2), getattr(torch.nn, cls)(2)
    assert ours.stride == 2 and theirs.stride in (2, (2,))        # AvgPool1d's is (2,)
    ours.kernel_size, theirs.kernel_size = 3, (3,) if cls == "AvgPool1d" else 3
    x = np.random.default_rng(0).standard_normal((1, 1) + (8,) * (ndim - 2)).astype(np.float32)
    want = theirs(torch.from_numpy(x)).numpy()
    got = host(ours(pc.Tensor.from_host(queue, x)))
    assert want.shape == (1, 1) + (3,) * (ndim - 2)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert "stride=2," in repr(ours)


# -- ReLU6 is PyTorch's Hardtanh(0, 6) --------------------------------------------------------
def test_relu6_is_a_hardtanh_whose_limits_are_honoured_as_pytorch(queue):
    """PyTorch's ReLU6 is a ``Hardtanh(0, 6)``: ``max_val = 3`` set afterwards makes it clip
    [-1, 2, 4, 7] to [0, 2, 3, 3]. parcl's had no ``min_val``/``max_val``, so the setting was
    a plain attribute its forward never read ([0, 2, 4, 6]), silently."""
    ours, theirs = pc.nn.ReLU6(), torch.nn.ReLU6()
    assert isinstance(ours, pc.nn.Hardtanh) and isinstance(theirs, torch.nn.Hardtanh)
    assert (ours.min_val, ours.max_val) == (theirs.min_val, theirs.max_val) == (0.0, 6.0)
    assert repr(ours) == repr(theirs) == "ReLU6()"
    x = np.array([-1, 2, 4, 7], np.float32)
    np.testing.assert_array_equal(host(ours(tp.tensor(x))), [0, 2, 4, 6])
    ours.max_val = theirs.max_val = 3.0
    want = theirs(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(host(ours(tp.tensor(x))), want)
    np.testing.assert_array_equal(want, [0, 2, 3, 3])


# -- Sequential and ModuleList: PyTorch's list operations -------------------------------------
def _kinds(container) -> list[str]:
    return [type(m).__name__ for m in container]


def _names(container) -> list[str]:
    return [name for name, _ in container.named_children()]


@pytest.mark.parametrize("lib", [pc.nn, torch.nn], ids=["parcl", "torch"])
def test_sequential_pops_deletes_inserts_adds_and_multiplies_as_pytorch(lib):
    """Each step is run on parcl's and on PyTorch's Sequential with the same expectations."""
    from collections import OrderedDict
    seq = lib.Sequential(lib.Identity(), lib.ReLU(), lib.Tanh(), lib.Sigmoid())
    assert type(seq.pop(1)).__name__ == "ReLU"
    assert _names(seq) == ["0", "1", "2"] and _kinds(seq) == ["Identity", "Tanh", "Sigmoid"]
    del seq[0:2]
    assert _names(seq) == ["0"] and _kinds(seq) == ["Sigmoid"]
    assert seq.insert(0, lib.ReLU()) is seq and seq.insert(-1, lib.Tanh()) is seq
    assert _kinds(seq) == ["ReLU", "Tanh", "Sigmoid"]
    with pytest.raises(IndexError):
        seq.insert(4, lib.ReLU())
    seq[1] = lib.Identity()
    assert _kinds(seq) == ["ReLU", "Identity", "Sigmoid"]
    assert _kinds(seq + lib.Sequential(lib.Tanh())) == ["ReLU", "Identity", "Sigmoid", "Tanh"]
    seq += lib.Sequential(lib.Tanh())
    assert _names(seq) == ["0", "1", "2", "3"]
    assert seq.extend([lib.ReLU()]) is seq and len(seq) == 5
    with pytest.raises(ValueError):
        seq + [lib.ReLU()]
    twice = lib.Sequential(lib.ReLU(), lib.Tanh()) * 2
    assert _kinds(twice) == ["ReLU", "Tanh", "ReLU", "Tanh"] and twice[0] is twice[2]
    assert _kinds(2 * lib.Sequential(lib.ReLU())) == ["ReLU", "ReLU"]
    thrice = lib.Sequential(lib.ReLU())
    thrice *= 3
    assert len(thrice) == 3
    with pytest.raises(ValueError):
        thrice * 0
    named = lib.Sequential(OrderedDict([("a", lib.ReLU()), ("b", lib.Tanh()), ("c",
                                                                             lib.Sigmoid())]))
    del named[1]                                         # renumbered, as PyTorch's
    assert _names(named) == ["0", "1"] and _kinds(named) == ["ReLU", "Sigmoid"]
    assert _kinds(named.pop(slice(0, 1))) == ["ReLU"] and _kinds(named) == ["Sigmoid"]


@pytest.mark.parametrize("lib", [pc.nn, torch.nn], ids=["parcl", "torch"])
def test_module_list_pops_deletes_and_adds_as_pytorch(lib):
    ml = lib.ModuleList([lib.ReLU(), lib.Tanh(), lib.Identity(), lib.Sigmoid()])
    assert type(ml.pop(1)).__name__ == "Tanh"
    assert _names(ml) == ["0", "1", "2"] and _kinds(ml) == ["ReLU", "Identity", "Sigmoid"]
    del ml[::2]
    assert _names(ml) == ["0"] and _kinds(ml) == ["Identity"]
    both = ml + [lib.ReLU()]
    assert type(both) is lib.ModuleList and _kinds(both) == ["Identity", "ReLU"]
    ml += [lib.Tanh()]
    ml.insert(1, lib.ReLU())
    assert _names(ml) == ["0", "1", "2"] and _kinds(ml) == ["Identity", "ReLU", "Tanh"]
    taken = ml.pop(slice(1, None))
    assert type(taken) is lib.ModuleList and _kinds(taken) == ["ReLU", "Tanh"]
    assert _kinds(ml) == ["Identity"]
    with pytest.raises(IndexError):
        del ml[3]


def test_a_sequential_runs_and_saves_its_layers_renumbered_after_a_pop(queue):
    pc.nn.manual_seed(0)
    seq = pc.nn.Sequential(pc.nn.Linear(3, 3, queue=queue), pc.nn.Tanh(),
                           pc.nn.Linear(3, 2, queue=queue))
    state = seq.state_dict()
    seq.pop(1)
    assert list(seq.state_dict()) == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert seq.parameters()[2] is seq[1].weight
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    want = (x @ state["0.weight"].T + state["0.bias"]) @ state["2.weight"].T + state["2.bias"]
    np.testing.assert_allclose(host(seq(pc.Tensor.from_host(queue, x))), want, rtol=1e-5,
                               atol=1e-6)


# -- ParameterList and ParameterDict: PyTorch's list and dict methods -------------------------
def _p(lib, queue, v: float):
    if lib is torch.nn:
        return torch.nn.Parameter(torch.tensor([float(v)]))
    return pc.nn.Parameter.from_host(queue, np.array([v], np.float32))


def _v(p) -> float:
    return float(p.detach()[0]) if isinstance(p, torch.Tensor) else float(p.value.to_host()[0])


@pytest.mark.parametrize("lib", [pc.nn, torch.nn], ids=["parcl", "torch"])
def test_parameter_list_slices_and_adds_as_pytorch(lib, queue):
    ps = lib.ParameterList([_p(lib, queue, i) for i in range(5)])
    part = ps[1:4:2]
    assert type(part) is lib.ParameterList and [_v(p) for p in part] == [1.0, 3.0]
    assert part[0] is ps[1]                              # the same Parameters
    ps += [_p(lib, queue, 9)]
    assert [n for n, _ in ps.named_parameters()] == ["0", "1", "2", "3", "4", "5"]


@pytest.mark.parametrize("lib", [pc.nn, torch.nn], ids=["parcl", "torch"])
def test_parameter_dict_has_the_dict_methods_of_pytorchs(lib, queue):
    from collections import OrderedDict
    pd = lib.ParameterDict(OrderedDict([("b", _p(lib, queue, 1)), ("a", _p(lib, queue, 2)),
                                        ("c", _p(lib, queue, 3))]))
    assert list(reversed(pd)) == ["c", "a", "b"]
    assert pd.get("a") is pd["a"] and pd.get("z", 5) == 5
    assert _v(pd.pop("a")) == 2.0 and list(pd) == ["b", "c"]
    key, value = pd.popitem()
    assert (key, _v(value), list(pd)) == ("c", 3.0, ["b"])
    assert _v(pd.setdefault("b", _p(lib, queue, 7))) == 1.0
    assert _v(pd.setdefault("d", _p(lib, queue, 8))) == 8.0 and list(pd) == ["b", "d"]
    copied = pd.copy()
    assert type(copied) is lib.ParameterDict and copied["b"] is pd["b"]
    shared = pd.fromkeys(["x", "y"], _p(lib, queue, 4))
    assert list(shared) == ["x", "y"] and len(list(shared.parameters())) == 1
    extra = lib.ParameterDict({"z": _p(lib, queue, 5)})
    assert list(pd | extra) == ["b", "d", "z"] and list(pd) == ["b", "d"]
    pd |= extra
    assert list(pd) == ["b", "d", "z"]
    pd.clear()
    assert len(pd) == 0 and len(pd.state_dict()) == 0
    with pytest.raises(KeyError):
        pd.popitem()


# -- copy.deepcopy ------------------------------------------------------------------------------
def test_deepcopy_of_a_module_is_an_independent_copy_on_the_same_queue_as_pytorch(queue):
    """``copy.deepcopy(model)`` raised ``TypeError: cannot pickle 'Queue' object``; PyTorch's
    gives a model with its own Parameters and buffers holding the same values, tied weights
    still tied, ``requires_grad`` kept and no ``.grad``."""
    import copy
    pc.nn.manual_seed(0)
    model = pc.nn.Sequential(pc.nn.Linear(3, 4, queue=queue), pc.nn.BatchNorm1d(4, queue=queue),
                             pc.nn.Linear(4, 3, queue=queue))
    model[2].bias.requires_grad = False
    model[0].weight.grad = pc.Tensor.zeros(queue, (4, 3))
    twin = copy.deepcopy(model)
    assert type(twin) is pc.nn.Sequential and twin[0] is not model[0]
    for (name, a), (_, b) in zip(model.state_dict().items(), twin.state_dict().items()):
        np.testing.assert_array_equal(a, b, err_msg=name)
    for a, b in zip(model.parameters(), twin.parameters()):
        assert a is not b and a.value.data is not b.value.data and b.value.queue is queue
        assert a.requires_grad == b.requires_grad and b.grad is None
    assert twin[1].running_mean is not model[1].running_mean
    before = model.state_dict()
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    twin(pc.Tensor.from_host(queue, x))                   # moves the copy's statistics only
    with tp.no_grad():
        twin[0].weight.value.fill_(5.0)
    for name, a in model.state_dict().items():
        np.testing.assert_array_equal(a, before[name], err_msg=name)
    assert not np.array_equal(twin[1].running_mean.to_host(), before["1.running_mean"])
    tied = pc.nn.Sequential(pc.nn.Linear(3, 3, queue=queue), pc.nn.Linear(3, 3, queue=queue))
    tied[1].weight = tied[0].weight
    twin = copy.deepcopy(tied)
    assert twin[1].weight is twin[0].weight and twin[0].weight is not tied[0].weight
    theirs = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    theirs[1].weight = theirs[0].weight
    their_twin = copy.deepcopy(theirs)
    assert their_twin[1].weight is their_twin[0].weight
    param = copy.deepcopy(model[0].weight)
    assert isinstance(param, pc.nn.Parameter) and param is not model[0].weight
    np.testing.assert_array_equal(param.value.to_host(), before["0.weight"])


def test_deepcopy_copies_the_tensors_a_module_holds_in_a_tuple_or_config_object_as_pytorch(
        queue):
    """PyTorch's ``copy.deepcopy(model)`` copies every tensor the model holds, in a tuple
    (``self.anchors = (lo, hi)``) or a config object too. A pc.Tensor could not be
    deep-copied (its queue refused), so the model's copy shared such a tuple or object with
    the original: a fill of the copy's tensor with 5 made the original's [5, 5] where
    PyTorch's stays [0, 0]. ``copy.deepcopy`` of a pc.Tensor is now a device copy on its
    queue."""
    import copy
    import types

    def held(lib, zeros):
        model = lib.Linear(2, 2)
        model.pair = (zeros(), 3)
        model.config = types.SimpleNamespace(mask=zeros())
        return model

    ours = held(pc.nn, lambda: pc.Tensor.zeros(queue, (2,)))
    theirs = held(torch.nn, lambda: torch.zeros(2))
    for model, fill in ((ours, lambda t: t.fill_(5.0)), (theirs, lambda t: t.fill_(5.0))):
        twin = copy.deepcopy(model)
        assert twin.pair[0] is not model.pair[0] and twin.config.mask is not model.config.mask
        fill(twin.pair[0])
        fill(twin.config.mask)
    for t in (ours.pair[0], ours.config.mask):
        np.testing.assert_array_equal(t.to_host(), [0.0, 0.0])
    for t in (theirs.pair[0], theirs.config.mask):
        np.testing.assert_array_equal(t.numpy(), [0.0, 0.0])
    t = pc.Tensor.from_host(queue, np.array([1.0, 2.0], np.float32))
    twin = copy.deepcopy(t)
    assert twin.data is not t.data and twin.queue is queue
    np.testing.assert_array_equal(twin.to_host(), [1.0, 2.0])


def test_deepcopy_of_a_leaf_node_copies_it_with_its_grad_and_an_ops_output_is_refused_as_pytorch(
        queue):
    """PyTorch's ``copy.deepcopy`` of a leaf copies its value and ``.grad`` ([2, 4] of
    sum(x * x) at [1, 2]; a backward of sum(3 c) then leaves [5, 7] on the copy, the
    original's [2, 4]) and refuses an op's output. Once a pc.Tensor could be deep-copied, the
    default protocol copied an output's graph too, so a backward through the copy gave its
    inputs' gradients to copies of them, silently; it is now refused."""
    import copy
    x = tp.tensor(pc.Tensor.from_host(queue, np.array([1.0, 2.0], np.float32)),
                  requires_grad=True)
    xt = torch.tensor([1.0, 2.0], requires_grad=True)
    tp.sum(x * x).backward()
    (xt * xt).sum().backward()
    twin, their_twin = copy.deepcopy(x), copy.deepcopy(xt)
    assert twin.requires_grad and twin.value.data is not x.value.data
    assert twin.grad is not x.grad
    tp.sum(twin * 3.0).backward()
    (their_twin * 3.0).sum().backward()
    np.testing.assert_array_equal(twin.grad.to_host(), their_twin.grad.numpy())     # [5, 7]
    np.testing.assert_array_equal(x.grad.to_host(), xt.grad.numpy())                # [2, 4]
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(xt * 2.0)
    with pytest.raises(pc.ParclError, match="only a leaf can be deep-copied"):
        copy.deepcopy(x * 2.0)


def test_deepcopy_keeps_the_type_of_a_dict_or_list_subclass_a_module_holds_as_pytorch(queue):
    """``copy.deepcopy`` keeps a ``defaultdict`` (a ``Counter``, any subclass) a module holds
    as that type, as PyTorch's; parcl rebuilt it as a plain dict, so the copy's
    ``counts["b"] += 1`` raised KeyError where PyTorch's counts {'a': 1, 'b': 1}."""
    import collections
    import copy
    for lib in (pc.nn, torch.nn):
        model = lib.Linear(2, 2)
        model.counts = collections.defaultdict(int, a=1)
        model.seen = collections.Counter(["x", "x"])
        twin = copy.deepcopy(model)
        assert type(twin.counts) is collections.defaultdict and twin.counts is not model.counts
        assert type(twin.seen) is collections.Counter, lib
        twin.counts["b"] += 1
        assert dict(twin.counts) == {"a": 1, "b": 1} and dict(model.counts) == {"a": 1}


# -- BatchNorm's momentum set to None after construction -------------------------------------
def test_batch_norm_momentum_none_set_later_is_refused_or_counted_as_pytorch(queue):
    """PyTorch counts every training batch in ``num_batches_tracked``, so ``momentum = None``
    set later weighs the next batch by 1/(n + 1). parcl keeps the count only for a layer built
    with ``momentum=None``: set later, the forward failed with an AttributeError naming no
    cause; it is now a ParclError saying what to do, and a count registered as it says gives
    PyTorch's cumulative average."""
    x = np.random.default_rng(0).standard_normal((2, 4, 3)).astype(np.float32)
    ours = pc.nn.BatchNorm1d(3, queue=queue)
    ours.momentum = None
    with pytest.raises(pc.ParclError, match="momentum=None .* set after construction"):
        ours(pc.Tensor.from_host(queue, x[0]))
    theirs = torch.nn.BatchNorm1d(3)
    theirs.momentum = None
    ours.register_buffer("num_batches_tracked", pc.Tensor.zeros(queue, (), np.int64))
    for batch in x:
        theirs(torch.from_numpy(batch))
        ours(pc.Tensor.from_host(queue, batch))
    np.testing.assert_allclose(ours.running_mean.to_host(), theirs.running_mean.numpy(),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ours.running_var.to_host(), theirs.running_var.numpy(),
                               rtol=1e-5, atol=1e-6)
    assert int(ours.num_batches_tracked.to_host()) == 2


# -- reset_parameters and reset_running_stats ---------------------------------------------------
RESETTABLE = {
    "Linear": lambda q: pc.nn.Linear(5, 3, queue=q),
    "Conv1d": lambda q: pc.nn.Conv1d(4, 6, 3, groups=2, queue=q),
    "Conv2d": lambda q: pc.nn.Conv2d(2, 3, (2, 3), bias=False, queue=q),
    "ConvTranspose2d": lambda q: pc.nn.ConvTranspose2d(2, 3, 3, queue=q),
    "Conv3d": lambda q: pc.nn.Conv3d(2, 3, 2, queue=q),
    "Bilinear": lambda q: pc.nn.Bilinear(3, 4, 2, queue=q),
    "LSTMCell": lambda q: pc.nn.LSTMCell(3, 4, queue=q),
    "LSTM": lambda q: pc.nn.LSTM(3, 4, num_layers=2, bidirectional=True, queue=q),
    "Embedding": lambda q: pc.nn.Embedding(6, 3, padding_idx=2, queue=q),
    "EmbeddingBag": lambda q: pc.nn.EmbeddingBag(6, 3, padding_idx=1, queue=q),
    "LayerNorm": lambda q: pc.nn.LayerNorm(4, queue=q),
    "GroupNorm": lambda q: pc.nn.GroupNorm(2, 4, queue=q),
    "RMSNorm": lambda q: pc.nn.RMSNorm(4, queue=q),
    "BatchNorm1d": lambda q: pc.nn.BatchNorm1d(3, momentum=None, queue=q),
    "InstanceNorm2d": lambda q: pc.nn.InstanceNorm2d(3, affine=True, track_running_stats=True,
                                                     queue=q),
    "PReLU": lambda q: pc.nn.PReLU(3, 0.1, queue=q),
}


@pytest.mark.parametrize("name", list(RESETTABLE))
def test_reset_parameters_draws_as_the_constructor_into_the_same_parameters_as_pytorch(
        queue, name):
    """PyTorch's layers have ``reset_parameters()``, which initialises the Parameters again in
    place (``model.apply(...)`` re-initialisation, an optimizer still holding them); parcl's
    had none (AttributeError). It draws from the seeded generator as the constructor does:
    after the same ``manual_seed`` the state is a new layer's, the Parameter objects kept."""
    make = RESETTABLE[name]
    assert hasattr(getattr(torch.nn, name), "reset_parameters")
    pc.nn.manual_seed(7)
    fresh = make(queue).state_dict()
    pc.nn.manual_seed(1)
    layer = make(queue)
    params = layer.parameters()
    for tensor in [p.value for p in params] + layer.buffers():
        tensor.fill_(3)
    pc.nn.manual_seed(7)
    layer.reset_parameters()
    assert all(a is b for a, b in zip(params, layer.parameters()))
    got = layer.state_dict()
    assert list(got) == list(fresh)
    for key in got:
        np.testing.assert_array_equal(got[key], fresh[key], err_msg=key)


@pytest.mark.parametrize("cls", ["BatchNorm1d", "InstanceNorm1d"])
def test_reset_running_stats_restarts_the_statistics_and_count_as_pytorch(queue, cls):
    x = np.random.default_rng(0).standard_normal((4, 3, 5)).astype(np.float32)
    ours = getattr(pc.nn, cls)(3, momentum=None, track_running_stats=True, queue=queue)
    theirs = getattr(torch.nn, cls)(3, momentum=None, track_running_stats=True)
    for _ in range(2):
        ours(pc.Tensor.from_host(queue, x))
        theirs(torch.from_numpy(x))
    ours.reset_running_stats()
    theirs.reset_running_stats()
    np.testing.assert_array_equal(ours.running_mean.to_host(), theirs.running_mean.numpy())
    np.testing.assert_array_equal(ours.running_var.to_host(), theirs.running_var.numpy())
    if cls == "BatchNorm1d":                          # parcl counts only for the average
        assert int(ours.num_batches_tracked.to_host()) == int(theirs.num_batches_tracked) == 0
        ours(pc.Tensor.from_host(queue, x))
        theirs(torch.from_numpy(x))
        np.testing.assert_allclose(ours.running_var.to_host(), theirs.running_var.numpy(),
                                   rtol=1e-5)


# -- Embedding.from_pretrained -------------------------------------------------------------------
def test_embedding_from_pretrained_looks_up_the_given_table_as_pytorch(queue):
    """PyTorch's ``Embedding.from_pretrained(table, freeze=True, padding_idx=...,
    max_norm=...)`` was missing (AttributeError); its weight is the table as given (the
    padding row not zeroed), frozen unless ``freeze=False``."""
    table = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    idx = np.array([[0, 1, 4], [1, 1, 2]])
    theirs = torch.nn.Embedding.from_pretrained(torch.from_numpy(table), padding_idx=1)
    ours = pc.nn.Embedding.from_pretrained(table, padding_idx=1)
    assert not ours.weight.requires_grad and not theirs.weight.requires_grad
    assert ours.padding_idx == theirs.padding_idx == 1
    got = host(ours(pc.Tensor.from_host(queue, idx)))
    np.testing.assert_array_equal(got, theirs(torch.from_numpy(idx)).detach().numpy())
    np.testing.assert_array_equal(got[0, 1], table[1])                 # the row as given
    shared = pc.Tensor.from_host(queue, table)
    trained = pc.nn.Embedding.from_pretrained(shared, freeze=False, padding_idx=1)
    assert trained.weight.value is shared and trained.weight.requires_grad
    theirs = torch.nn.Embedding.from_pretrained(torch.from_numpy(table.copy()), freeze=False,
                                                padding_idx=1)
    out = trained(tp.tensor(idx.astype(np.int64)))
    tp.backward(tp.sum(out * out))
    theirs(torch.from_numpy(idx)).pow(2).sum().backward()
    np.testing.assert_allclose(trained.weight.grad.to_host(), theirs.weight.grad.numpy(),
                               rtol=1e-6)
    capped = pc.nn.Embedding.from_pretrained(table.copy(), max_norm=1.0)
    theirs = torch.nn.Embedding.from_pretrained(torch.from_numpy(table.copy()), max_norm=1.0)
    np.testing.assert_allclose(host(capped(pc.Tensor.from_host(queue, idx))),
                               theirs(torch.from_numpy(idx)).detach().numpy(), rtol=1e-5)
    with pytest.raises(pc.ParclError, match="2-dimensional"):
        pc.nn.Embedding.from_pretrained(table[0])


@pytest.mark.parametrize("setting", ["scale_grad_by_freq", "sparse"])
def test_embedding_settings_pytorch_reads_at_each_call_are_refused_when_set_later(queue, setting):
    """PyTorch's Embedding and EmbeddingBag read ``scale_grad_by_freq`` and ``sparse`` at each
    call; parcl refuses them at construction, but set afterwards they were ignored: with
    ``scale_grad_by_freq = True`` a row picked 3 times of [1, 1, 1, 2] got the gradient
    [3, 3] where PyTorch's is [1, 1] (scaled by 1 / 3), with no error. Now the call raises."""
    pc.nn.manual_seed(0)
    ours = pc.nn.Embedding(4, 2, queue=queue)
    theirs = torch.nn.Embedding(4, 2)
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in ours.state_dict().items()})
    idx = np.array([1, 1, 1, 2])
    theirs.scale_grad_by_freq = True
    theirs(torch.from_numpy(idx)).sum().backward()
    np.testing.assert_array_equal(theirs.weight.grad[1].numpy(), [1.0, 1.0])
    for layer in (ours, pc.nn.EmbeddingBag(4, 2, queue=queue)):
        setattr(layer, setting, True)
        with pytest.raises(pc.ParclError, match=f"{setting}=True.*set after construction"):
            layer(pc.Tensor.from_host(queue, idx.reshape(1, 4)))
        setattr(layer, setting, False)
        layer(pc.Tensor.from_host(queue, idx.reshape(1, 4)))         # as before


# -- a child set to None keeps its slot ---------------------------------------------------------
@pytest.mark.parametrize("how", ["setattr", "add_module"])
def test_a_child_set_to_none_keeps_its_place_for_the_next_one_as_pytorch(queue, how):
    """PyTorch keeps ``_modules[name] = None`` for ``seq.<name> = None`` (or
    ``add_module(name, None)``), so a layer assigned there again runs where the old one did.
    parcl dropped the slot and appended the new layer at the end: Sequential(Linear(2, 3),
    ReLU(), Linear(3, 2)) with its ReLU set to None and then to a Tanh ran Linear, Linear,
    Tanh (its first output row [-0.165, 0.328] where PyTorch's is [-0.173, 0.346] here)
    with no error; with add_module the second call was refused."""
    pc.nn.manual_seed(0)
    ours = pc.nn.Sequential(pc.nn.Linear(2, 3, queue=queue), pc.nn.ReLU(),
                            pc.nn.Linear(3, 2, queue=queue))
    theirs = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in ours.state_dict().items()})
    for seq, lib in ((ours, pc.nn), (theirs, torch.nn)):
        if how == "setattr":
            setattr(seq, "1", None)
        else:
            seq.add_module("1", None)
        assert len(seq) == 3 and list(seq._modules) == ["0", "1", "2"]
        assert [n for n, _ in seq.named_children()] == ["0", "2"]
        if how == "setattr":
            setattr(seq, "1", lib.Tanh())
        else:
            seq.add_module("1", lib.Tanh())
        assert _kinds(seq) == ["Linear", "Tanh", "Linear"]
    assert list(ours.state_dict()) == list(theirs.state_dict())
    x = np.random.default_rng(0).standard_normal((4, 2)).astype(np.float32)
    np.testing.assert_allclose(host(ours(pc.Tensor.from_host(queue, x))),
                               theirs(torch.from_numpy(x)).detach().numpy(), rtol=1e-5,
                               atol=1e-6)
    with pytest.raises(TypeError, match="is a submodule"):
        ours.a = pc.nn.ReLU()
        ours.a = None
        ours.a = 5                                      # PyTorch's TypeError, as for a child
