"""A captured step never replays what the model no longer is.

A replay re-enqueues the recorded kernels on the recorded buffers. Whatever changes what the
eager call would enqueue or read — a sub-module replaced by one of another type, a buffer or a
parameter's value replaced by a new tensor — must record the step anew, and a ReplicaGroup
must copy the tensors its models hold now (a reset of the running statistics, a buffers-only
``load_state_dict``). Each test compares with the eager run, or with a single replica.
"""

from __future__ import annotations

import functools
import types

import numpy as np
import pytest

import parcl as pc
import parcl.tape as tp
from parcl.replica import ReplicaGroup


def batch(n, d=8, seed=0, classes=4):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, d)).astype(np.float32) * 2 + 1,
            rng.integers(0, classes, n).astype(np.int64))


class Net(pc.nn.Module):
    def __init__(self, queue):
        super().__init__()
        self.fc1 = pc.nn.Linear(8, 16, queue=queue)
        self.fc2 = pc.nn.Linear(16, 4, queue=queue)
        self.act = pc.nn.Tanh()

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def net(queue):
    pc.nn.manual_seed(0)
    return Net(queue)


def bn_net(queue):
    pc.nn.manual_seed(0)
    return pc.nn.Sequential(pc.nn.Linear(8, 6, queue=queue), pc.nn.BatchNorm1d(6, queue=queue),
                            pc.nn.Linear(6, 4, queue=queue))


def train_group(build, devices, capture, change, steps=4, evaluate=False):
    """Per step: the loss, every parameter and replica 0's buffers after it, and whether
    every replica holds replica 0's buffers; ``change(group, step)`` runs before each."""
    out = []
    with ReplicaGroup(build, devices, capture=capture) as group:
        if evaluate:
            group.eval()
        opt = pc.optim.SGD(group.parameters(), lr=0.1)
        for i in range(steps):
            change(group, i)
            loss = group.step(*batch(8, seed=i), tp.cross_entropy, opt)
            buffers = [[b.to_host() for b in r.model.buffers()] for r in group.replicas]
            out.append((loss, [p.value.to_host() for p in group.parameters()], buffers[0],
                        all(np.array_equal(a, b) for bs in buffers[1:]
                            for a, b in zip(bs, buffers[0]))))
        replays = [step.replays for per in group.captured_steps for step in per]
    return out, replays


def assert_same_runs(a, b):
    for (la, pa, ba, _), (lb, pb, bb, _) in zip(a, b):
        assert la == lb
        for u, v in zip(pa + ba, pb + bb):
            np.testing.assert_array_equal(u, v)


# -- F1: a sub-module replaced by one of another type -----------------------------------------
def test_capture_key_sees_a_submodule_replaced_by_another_type(queue):
    model = net(queue)
    key = pc.nn.capture_key(model)
    model.act = pc.nn.Sigmoid()                  # no parameters, no attributes: same otherwise
    assert pc.nn.capture_key(model) != key
    acts = pc.nn.ModuleList([pc.nn.Identity()])
    key = pc.nn.capture_key(acts)
    acts[0] = pc.nn.SiLU()
    assert pc.nn.capture_key(acts) != key


def test_a_captured_group_after_an_activation_swap_equals_the_eager_one(devices2):
    def swap(group, step):
        if step == 2:
            for r in group.replicas:
                r.model.act = pc.nn.Sigmoid()

    eager, _ = train_group(net, devices2, False, swap)
    captured, replays = train_group(net, devices2, True, swap)
    assert_same_runs(eager, captured)
    assert replays == [2, 2]                     # steps 1 and 3: the swap recorded step 2


def test_tp_capture_after_a_modulelist_entry_swap_equals_eager(queue):
    pc.nn.manual_seed(0)
    fc, acts = pc.nn.Linear(4, 4), pc.nn.ModuleList([pc.nn.Identity()])
    model = pc.nn.Sequential(fc, acts)           # what capture_key looks at

    def forward(x):
        with tp.no_grad():
            return acts[0](fc(x))

    step = tp.capture(forward, queue)
    x = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)
    for _ in range(2):
        step(x, key=pc.nn.capture_key(model))
    acts[0] = pc.nn.SiLU()
    got = step(x, key=pc.nn.capture_key(model)).to_host()
    np.testing.assert_array_equal(got, forward(pc.Tensor.from_host(queue, x)).to_host())


# -- F3: a buffer replaced by a new tensor ------------------------------------------------------
def _bn_step(model):
    def fwd_bwd(x, y):
        with tp.Tape() as tape:
            loss = tp.cross_entropy(model(tp.tensor(x)), y)
        tape.backward(loss)
        return loss.value
    return fwd_bwd


def _reset_statistics(bn, queue):
    bn.running_mean = pc.Tensor.zeros(queue, (bn.num_features,))
    bn.running_var = pc.Tensor.full(queue, (bn.num_features,), 1.0)


def test_tp_capture_after_a_reset_of_the_running_statistics_equals_eager(queue):
    runs = []
    for captured in (False, True):
        model = bn_net(queue)
        fwd_bwd = _bn_step(model)
        step = tp.capture(fwd_bwd, queue)
        for i in range(4):
            if i == 2:
                _reset_statistics(model[1], queue)
            model.zero_grad()
            x, y = batch(6, seed=i)
            if captured:
                step(x, y, key=pc.nn.capture_key(model))
            else:
                fwd_bwd(pc.Tensor.from_host(queue, x), pc.Tensor.from_host(queue, y))
        runs.append([t.to_host() for t in model.buffers()]
                    + [p.grad.to_host() for p in model.parameters()])
    assert step.replays == 2
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_a_replay_never_writes_into_a_buffer_the_model_dropped(queue):
    """The recording's key holds the statistics it was recorded with: the pool cannot hand
    their memory to another tensor while a replay could still write it."""
    model = bn_net(queue)
    step = tp.capture(_bn_step(model), queue)
    x, y = batch(6)
    for _ in range(2):
        model.zero_grad()
        step(x, y, key=pc.nn.capture_key(model))
    _reset_statistics(model[1], queue)             # the old tensors are dropped here
    unrelated = [pc.Tensor.full(queue, (6,), 7.0) for _ in range(4)]
    model.zero_grad()
    step(x, y, key=pc.nn.capture_key(model))
    for t in unrelated:
        np.testing.assert_array_equal(t.to_host(), np.full(6, 7.0, np.float32))
    assert np.abs(model[1].running_mean.to_host()).max() > 0      # the new ones were updated


@pytest.mark.parametrize("capture", [False, True], ids=["eager", "captured"])
def test_a_group_after_a_reset_of_replica_0s_statistics_copies_the_new_ones(devices2,
                                                                              capture):
    """``group.model`` is replica 0's: the statistics put there are the ones every replica
    computes with and is given after the step, as with one replica."""
    def reset(group, step):
        if step == 2:
            bn = group.model[1]
            bn.running_mean = pc.Tensor.full(bn.running_mean.queue, (6,), 3.0)
            bn.running_var = pc.Tensor.full(bn.running_var.queue, (6,), 0.5)

    one, _ = train_group(bn_net, devices2[:1], capture, reset, evaluate=True)
    two, _ = train_group(bn_net, devices2, capture, reset, evaluate=True)
    for (la, pa, ba, _), (lb, pb, bb, same) in zip(one, two):
        assert same
        np.testing.assert_allclose(la, lb, rtol=1e-6)
        for u, v in zip(pa + ba, pb + bb):
            np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6)


def test_a_captured_group_after_a_reset_in_training_equals_the_eager_one(devices2):
    def reset(group, step):
        if step == 2:
            for r in group.replicas:
                _reset_statistics(r.model[1], r.queue)

    eager, _ = train_group(bn_net, devices2, False, reset)
    captured, replays = train_group(bn_net, devices2, True, reset)
    assert_same_runs(eager, captured)
    assert all(same for *_, same in captured) and replays == [2, 2]


def test_buffers_replaced_differently_in_one_replica_only_raise(devices2):
    with ReplicaGroup(bn_net, devices2) as group:
        opt = pc.optim.SGD(group.parameters(), lr=0.1)
        group.step(*batch(8), tp.cross_entropy, opt)
        bn = group.model[1]
        kept = bn.running_mean, bn.running_var
        bn.running_mean = bn.running_var = None  # one alone batch_norm refuses, as PyTorch
        for _ in range(2):                       # every step, not only the first to see it
            with pytest.raises(pc.ParclError, match=r"replica 1's model holds buffers .* but "
                                                    r"replica 0's"):
                group.step(*batch(8), tp.cross_entropy, opt)
        bn.running_mean, bn.running_var = kept
        group.step(*batch(8), tp.cross_entropy, opt)


# -- F4: a parameter's value replaced by a new tensor ---------------------------------------------
@pytest.mark.parametrize("keyed", [False, True], ids=["no key", "capture_key"])
def test_tp_capture_after_a_parameter_value_is_replaced_equals_eager(queue, keyed):
    pc.nn.manual_seed(0)
    fc = pc.nn.Linear(4, 2)

    def fwd_bwd(x):
        with tp.Tape() as tape:
            loss = tp.mean(fc(tp.tensor(x)))
        tape.backward(loss)
        return loss.value

    step = tp.capture(fwd_bwd, queue)
    x = np.ones((3, 4), np.float32)
    for _ in range(2):
        fc.zero_grad()
        step(x, key=pc.nn.capture_key(fc) if keyed else ())
    fc.weight.value = pc.Tensor.from_host(queue, np.full((2, 4), 5.0, np.float32))
    reuse = [pc.Tensor.full(queue, (2, 4), -1.0) for _ in range(4)]   # the old weight's size
    fc.zero_grad()
    replayed = float(step(x, key=pc.nn.capture_key(fc) if keyed else ()).to_host())
    grad = fc.weight.grad.to_host()
    fc.zero_grad()
    assert replayed == float(fwd_bwd(pc.Tensor.from_host(queue, x)).to_host())
    np.testing.assert_array_equal(grad, fc.weight.grad.to_host())
    assert all(np.array_equal(t.to_host(), np.full((2, 4), -1.0, np.float32)) for t in reuse)


# -- F5: a buffers-only load_state_dict ----------------------------------------------------------
@pytest.mark.parametrize("capture", [False, True], ids=["eager", "captured"])
def test_a_buffers_only_load_state_dict_reaches_every_replica(devices2, capture):
    stats = {"1.running_mean": np.full(6, 2.0, np.float32),
             "1.running_var": np.full(6, 0.25, np.float32)}

    def load(group, step):
        if step == 1:
            group.model.load_state_dict(stats, strict=False)

    one, _ = train_group(bn_net, devices2[:1], capture, load, steps=3, evaluate=True)
    two, _ = train_group(bn_net, devices2, capture, load, steps=3, evaluate=True)
    for (la, pa, ba, _), (lb, pb, bb, same) in zip(one, two):
        assert same
        np.testing.assert_allclose(la, lb, rtol=1e-6)
        for u, v in zip(pa + ba, pb + bb):
            np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6)


def test_capture_key_sees_a_function_attribute_replaced(queue):
    """``self.act = tp.relu`` replaced by ``tp.sigmoid``: the key ignored functions, so the
    captured call replayed the ReLU's kernels, silently."""
    class Net(pc.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = pc.nn.Linear(4, 4, queue=queue)
            self.act = tp.relu

        def forward(self, x):
            return self.act(self.fc(x))

    net = Net()
    x = -np.abs(np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32))
    step = tp.capture(lambda xt: net(xt), queue)
    with tp.no_grad():
        step(x, key=pc.nn.capture_key(net))
        net.act = tp.sigmoid
        replayed = step(x, key=pc.nn.capture_key(net)).to_host()
        eager = net(pc.Tensor.from_host(queue, x)).to_host()
    np.testing.assert_array_equal(replayed, eager)
    assert step.replays == 0



def test_capture_key_sees_a_module_swapped_inside_a_plain_list_or_dict(queue):
    """Modules held in a plain list or dict attribute (``self.acts = [pc.nn.ReLU()]``, not
    registered): a list or dict holding a module was left out of the key whole, so
    ``net.acts[0] = pc.nn.Sigmoid()`` (or a setting changed on a module held so) replayed
    the ReLU's kernels, silently. Such modules are now keyed by identity and their own
    attributes with them."""
    class Net(pc.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = pc.nn.Linear(4, 4, queue=queue)
            self.acts = [pc.nn.ReLU()]
            self.heads = {"out": pc.nn.Identity(), "slope": pc.nn.LeakyReLU(0.5)}

        def forward(self, x):
            return self.heads["slope"](self.heads["out"](self.acts[0](self.fc(x))))

    net = Net()
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    step = tp.capture(lambda xt: net(xt), queue)
    changes = [lambda: None, lambda: net.acts.__setitem__(0, pc.nn.Sigmoid()),
               lambda: net.heads.__setitem__("out", pc.nn.Tanh()),
               lambda: setattr(net.heads["slope"], "negative_slope", 0.1)]
    with tp.no_grad():
        step(x, key=pc.nn.capture_key(net))
        for change in changes:
            change()
            replayed = step(x, key=pc.nn.capture_key(net)).to_host()
            np.testing.assert_array_equal(replayed, net(pc.Tensor.from_host(queue, x)).to_host())
    assert step.replays == 1                     # only the call after no change

def changed_at_step_2(devices2, build, loss_fn, change, capture: bool):
    """Four SGD steps of a group over ``build``'s model, ``change(group)`` made before the
    third: the losses, and how many steps were replays."""
    out = []
    with ReplicaGroup(lambda q: (pc.manual_seed(0), build(q))[1], devices2,
                      capture=capture) as g:
        opt = pc.optim.SGD(g.parameters(), lr=0.1)
        for i in range(4):
            if i == 2:
                change(g)
            out.append(g.step(*batch(8, seed=i), loss_fn, opt))
        replays = sum(s.replays for per in g.captured_steps for s in per)
    return out, replays


def test_a_captured_group_sees_a_set_attribute_changed(devices2):
    """A forward that branches on a set it holds (``if "a" in self.skip``): ``capture_key``
    skipped sets, so after ``r.model.skip.add("a")`` on every replica the captured steps
    replayed the branch through ``a`` (loss 1.095 where the eager step gives 1.000), with
    no error. Sets (and frozensets, complex numbers, bytes, ranges) are keyed by value."""
    class Skipping(pc.nn.Module):
        def __init__(self, queue):
            super().__init__()
            self.a = pc.nn.Linear(8, 8, queue=queue)
            self.b = pc.nn.Linear(8, 4, queue=queue)
            self.skip = set()

        def forward(self, x):
            return self.b(x if "a" in self.skip else tp.tanh(self.a(x)))

    def skip_a(group):
        for r in group.replicas:
            r.model.skip.add("a")

    def losses(capture):
        return changed_at_step_2(devices2, Skipping, tp.cross_entropy, skip_a, capture)[0]

    np.testing.assert_array_equal(losses(True), losses(False))


LOSS_SCALE = 1.0          # a module-level setting a loss function reads (the test sets it)


@pytest.mark.parametrize("how", ["closure", "global", "partial"])
def test_a_captured_group_sees_a_setting_its_loss_function_reads(devices2, how):
    """A loss function reading a plain value it does not hold as a module attribute: a
    closure's variable (``lambda o, y: tp.cross_entropy(o, y, label_smoothing=s)``), a
    module-level setting, a partial's keywords. ``loss_key`` looked only for loss modules,
    so after the value changed the captured steps replayed the old one (label smoothing 0
    for 0.5: loss 1.130 where the eager step gives 1.153), silently. The values a loss
    function reads that way are keyed now, as a loss module's attributes are."""
    global LOSS_SCALE
    setting = {"s": 0.0}

    def make():
        if how == "closure":
            s = setting["s"]
            return lambda o, y: tp.cross_entropy(o, y, label_smoothing=s)
        if how == "global":
            return lambda o, y: tp.cross_entropy(o, y) * LOSS_SCALE
        return functools.partial(tp.cross_entropy, label_smoothing=0.0)

    def losses(capture):
        global LOSS_SCALE
        LOSS_SCALE, setting["s"], out = 1.0, 0.0, []
        loss_fn = make()
        with ReplicaGroup(lambda q: (pc.manual_seed(0), Net(q))[1], devices2,
                          capture=capture) as g:
            opt = pc.optim.SGD(g.parameters(), lr=0.1)
            for i in range(4):
                if i == 2:
                    if how == "closure":      # the cell rebound, the same function object
                        loss_fn.__closure__[0].cell_contents = 0.5
                    elif how == "global":
                        LOSS_SCALE = 3.0
                    else:
                        loss_fn.keywords["label_smoothing"] = 0.5
                out.append(g.step(*batch(8, seed=i), loss_fn, opt))
        return out

    np.testing.assert_array_equal(losses(True), losses(False))


class Cfg:                 # a plain class: neither a dataclass nor a namespace
    pass


class Configured(pc.nn.Module):
    """Branches on ``self.cfg.flag`` and scales by ``self.cfg.scale``."""

    def __init__(self, queue, cfg):
        super().__init__()
        self.a = pc.nn.Linear(8, 8, queue=queue)
        self.b = pc.nn.Linear(8, 4, queue=queue)
        self.cfg = cfg

    def forward(self, x):
        h = tp.tanh(self.a(x)) if self.cfg.flag else x
        return self.b(h) * self.cfg.scale


def plain_cfg(**values):
    cfg = Cfg()
    cfg.__dict__.update(values)
    return cfg


def test_a_captured_group_sees_a_plain_config_object_changed(devices2):
    """``model.cfg`` an instance of a plain class: ``capture_key`` keyed only dataclasses and
    namespaces, so after ``r.model.cfg.flag = False`` (and ``.scale = 2.0``) on every replica
    the captured steps replayed the recorded branch and scale, silently. Such objects are
    keyed by their attributes' values, as a dataclass is."""
    def losses(capture):
        out = []
        with ReplicaGroup(lambda q: (pc.manual_seed(0),
                                     Configured(q, plain_cfg(flag=True, scale=1.0)))[1],
                          devices2, capture=capture) as g:
            opt = pc.optim.SGD(g.parameters(), lr=0.1)
            for i in range(5):
                for r in g.replicas:
                    if i == 2:
                        r.model.cfg.flag = False
                    if i == 3:
                        r.model.cfg.scale = 2.0
                out.append(g.step(*batch(8, seed=i), tp.cross_entropy, opt))
        return out

    np.testing.assert_array_equal(losses(True), losses(False))
    cfg = plain_cfg(flag=True, inner=plain_cfg(p=0.1))
    key = pc.nn.capture_key(Configured(None, cfg))
    cfg.inner.p = 0.2                                      # nested: seen too
    assert pc.nn.capture_key(Configured(None, cfg)) != key


def test_a_config_object_that_cannot_be_keyed_runs_eagerly(queue):
    """A config object holding what has no value to compare (a lock) or a cycle: the step
    cannot tell whether it changed, so it stays eager and says why, rather than replaying."""
    import threading

    cfg = plain_cfg(flag=True, scale=1.0, lock=threading.Lock())
    cfg.self = cfg                                         # a cycle: bounded, no recursion
    pc.manual_seed(0)
    model = Configured(queue, cfg)
    step = tp.capture(lambda xt: model(xt), queue)
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    with tp.no_grad():
        for flag in (True, True, False):
            cfg.flag = flag
            got = step(x, key=pc.nn.capture_key(model)).to_host()
            np.testing.assert_array_equal(got, model(pc.Tensor.from_host(queue, x)).to_host())
        why = step.reason(x, key=pc.nn.capture_key(model))     # under the call's grad mode
    assert step.replays == 0 and step.eager_calls == 3
    assert "Configured.cfg" in why and "lock" in why


SCALE = 0.5               # module-level settings a forward reads (the test below sets them)
SQUASH = True


def squash(h):            # a function a forward calls, reading a global of its own
    return tp.tanh(h) if SQUASH else h


class Scaled(pc.nn.Module):
    def __init__(self, queue):
        super().__init__()
        self.a = pc.nn.Linear(8, 8, queue=queue)
        self.b = pc.nn.Linear(8, 4, queue=queue)

    def forward(self, x):
        return self.b(squash(self.a(x))) * SCALE


def test_a_captured_group_sees_a_global_its_forward_reads(devices2):
    """``return self.lin(x) * SCALE`` with ``SCALE`` a module-level setting: ``capture_key``
    keyed only the model's attributes, so after ``SCALE = 2.0`` (and ``SQUASH = False``,
    read by a function the forward calls) the captured steps replayed the recorded values,
    silently. The plain globals a forward names, and those of the functions it calls by
    name, are keyed, as ``loss_key`` keys a loss function's."""
    global SCALE, SQUASH

    def losses(capture):
        global SCALE, SQUASH
        SCALE, SQUASH, out = 0.5, True, []
        with ReplicaGroup(lambda q: (pc.manual_seed(0), Scaled(q))[1], devices2,
                          capture=capture) as g:
            opt = pc.optim.SGD(g.parameters(), lr=0.1)
            for i in range(5):
                if i == 2:
                    SCALE = 2.0
                if i == 3:
                    SQUASH = False
                out.append(g.step(*batch(8, seed=i), tp.cross_entropy, opt))
        return out

    try:
        np.testing.assert_array_equal(losses(True), losses(False))
    finally:
        SCALE, SQUASH = 0.5, True


class WeightedLoss:        # a loss that is a plain object called as a function
    def __init__(self, weight):
        self.weight = weight

    def __call__(self, out, y):
        return tp.cross_entropy(out, y) * self.weight

    def loss(self, out, y):
        return tp.cross_entropy(out, y) * self.weight


@pytest.mark.parametrize("how", ["__call__", "bound method"])
def test_a_captured_group_sees_a_setting_held_by_a_loss_object(devices2, how):
    """A loss that is an object of a plain class (``__call__`` reading ``self.weight``), or a
    method bound to one: ``loss_key`` looked into neither, so after ``loss.weight = 3.0``
    the captured steps replayed weight 1 (loss 1.569 where the eager step gives 4.707),
    silently. The object's attributes, and what its ``__call__`` reads, are keyed now."""
    def losses(capture):
        crit = WeightedLoss(1.0)
        return changed_at_step_2(devices2, Net, crit if how == "__call__" else crit.loss,
                                 lambda g: setattr(crit, "weight", 3.0), capture)

    (eager, _), (captured, replays) = losses(False), losses(True)
    np.testing.assert_array_equal(captured, eager)
    assert replays == 4                          # steps 1 and 3 on both replicas


class HelpedLoss:          # a loss object whose code reads LOSS_SCALE through its class
    def __call__(self, out, y):
        return self._scaled(tp.cross_entropy(out, y))

    def _scaled(self, loss):
        return loss * LOSS_SCALE

    def loss(self, out, y):
        return tp.cross_entropy(out, y) * self.scale

    @property
    def scale(self):
        return LOSS_SCALE


@pytest.mark.parametrize("how", ["__call__ calling a method", "bound method reading a property"])
def test_a_captured_group_sees_a_global_a_loss_objects_methods_read(devices2, how):
    """A loss object whose ``__call__`` returns ``self._scaled(loss)``, or a bound method
    multiplying by a property, each reading ``LOSS_SCALE``: ``loss_key`` walked the call's
    own code only, so after ``LOSS_SCALE = 3.0`` the captured steps replayed scale 1 (loss
    1.569 at step 2 where the eager step gives 4.707), silently; the methods (and property
    getters) the call names on its class are walked now, as a module's forward's are."""
    global LOSS_SCALE

    def make_change(group):
        global LOSS_SCALE
        LOSS_SCALE = 3.0

    def losses(capture):
        global LOSS_SCALE
        LOSS_SCALE, crit = 1.0, HelpedLoss()
        return changed_at_step_2(devices2, Net, crit if how.startswith("__call__") else
                                 crit.loss, make_change, capture)

    try:
        (eager, _), (captured, replays) = losses(False), losses(True)
    finally:
        LOSS_SCALE = 1.0
    np.testing.assert_array_equal(captured, eager)
    assert replays == 4                          # steps 1 and 3 on both replicas


class Tempered(pc.nn.Module):
    """Reads a class attribute and calls a helper method that reads a global."""

    temperature = 1.0

    def __init__(self, queue):
        super().__init__()
        self.a = pc.nn.Linear(8, 4, queue=queue)

    def forward(self, x):
        return self._head(self.a(x)) / self.temperature

    def _head(self, h):
        return h * SCALE


@pytest.mark.parametrize("change", ["class attribute", "global read by a method"])
def test_a_captured_group_sees_what_its_forward_reads_through_its_class(devices2, change):
    """``/ self.temperature`` with ``temperature`` a class attribute, and ``self._head(h)``
    reading the global ``SCALE``: ``capture_key`` keyed only the instance's attributes and
    the globals ``forward`` itself names, so after ``Tempered.temperature = 1/3`` (or
    ``SCALE = 1.5`` from 0.5) the captured steps replayed the recorded value (loss 1.830
    where the eager step gives 3.293), silently. The class attributes a forward reads and
    the methods it calls (their reads, as a called function's) are keyed now."""
    global SCALE

    def make_change(group):
        global SCALE
        if change == "class attribute":
            Tempered.temperature = 1 / 3
        else:
            SCALE = 1.5

    def losses(capture):
        global SCALE
        SCALE, Tempered.temperature = 0.5, 1.0
        return changed_at_step_2(devices2, Tempered, tp.cross_entropy, make_change, capture)

    try:
        (eager, _), (captured, replays) = losses(False), losses(True)
    finally:
        SCALE, Tempered.temperature = 0.5, 1.0
    np.testing.assert_array_equal(captured, eager)
    assert replays == 4                          # steps 1 and 3 on both replicas


class StaticHelped(pc.nn.Module):
    """Reads the global ``SCALE`` through a static method."""

    def __init__(self, queue):
        super().__init__()
        self.a = pc.nn.Linear(8, 4, queue=queue)

    def forward(self, x):
        return self._scaled(self.a(x))

    @staticmethod
    def _scaled(h):
        return h * SCALE


class ClassHelped(StaticHelped):
    """... through a class method."""

    def forward(self, x):
        return self._scaled_too(self.a(x))

    @classmethod
    def _scaled_too(cls, h):
        return h * SCALE


class PropertyHelped(StaticHelped):
    """... through a property."""

    def forward(self, x):
        return self.a(x) * self.factor

    @property
    def factor(self):
        return SCALE


@pytest.mark.parametrize("build", [StaticHelped, ClassHelped, PropertyHelped],
                         ids=["staticmethod", "classmethod", "property"])
def test_a_captured_group_sees_a_global_read_by_a_static_or_class_method_or_property(
        devices2, build):
    """``self._scaled(h)``, ``self._scaled_too(h)`` or ``self.factor`` (a staticmethod, a
    classmethod or a property of the model's class) reading ``SCALE``: only plain methods'
    reads were keyed, so after ``SCALE = 1.5`` from 0.5 the captured steps replayed scale
    0.5 (loss 1.830 at step 2 where the eager step gives 3.293), silently."""
    global SCALE

    def make_change(group):
        global SCALE
        SCALE = 1.5

    def losses(capture):
        global SCALE
        SCALE = 0.5
        return changed_at_step_2(devices2, build, tp.cross_entropy, make_change, capture)

    try:
        (eager, _), (captured, replays) = losses(False), losses(True)
    finally:
        SCALE = 0.5
    np.testing.assert_array_equal(captured, eager)
    assert replays == 4                          # steps 1 and 3 on both replicas


settings = types.ModuleType("settings")      # a config module (``import settings``)
settings.SCALE = 1.0


class ModuleScaled(pc.nn.Module):
    def __init__(self, queue):
        super().__init__()
        self.a = pc.nn.Linear(8, 4, queue=queue)

    def forward(self, x):
        return self.a(x) * settings.SCALE


@pytest.mark.parametrize("reader", ["forward", "loss_fn"])
def test_a_captured_group_sees_a_setting_of_a_config_module(devices2, reader):
    """``* settings.SCALE`` with ``settings`` an imported Python module, read in the forward
    or in the loss function: a module is no plain value, so neither ``capture_key`` nor
    ``loss_key`` keyed it, and after ``settings.SCALE = 3.0`` the captured steps replayed
    scale 1 (loss 2.514 where the eager step gives 6.052), silently. The plain settings
    such code names in a module are keyed now."""
    if reader == "forward":
        build, loss_fn = ModuleScaled, tp.cross_entropy
    else:
        build = _plain_linear
        loss_fn = lambda o, y: tp.cross_entropy(o, y) * settings.SCALE      # noqa: E731
    _assert_setting_seen(devices2, settings, "SCALE", build, loss_fn)


def _plain_linear(queue):
    return pc.nn.Linear(8, 4, queue=queue)


def _assert_setting_seen(devices2, holder, name, build, loss_fn):
    """``holder.name`` set from 1 to 3 at step 2 of a group's loop: the captured steps give
    the eager losses, replaying steps 1 and 3 on both replicas."""
    def losses(capture):
        setattr(holder, name, 1.0)
        return changed_at_step_2(devices2, build, loss_fn,
                                 lambda g: setattr(holder, name, 3.0), capture)

    try:
        (eager, _), (captured, replays) = losses(False), losses(True)
    finally:
        setattr(holder, name, 1.0)
    np.testing.assert_array_equal(captured, eager)
    assert replays == 4


class Settings:              # a class used as a namespace of settings (``Settings.scale``)
    scale = 1.0


class ClassScaled(pc.nn.Module):
    def __init__(self, queue):
        super().__init__()
        self.a = pc.nn.Linear(8, 4, queue=queue)

    def forward(self, x):
        return self.a(x) * Settings.scale


@pytest.mark.parametrize("reader", ["forward", "loss_fn"])
def test_a_captured_group_sees_a_setting_of_a_settings_class(devices2, reader):
    """``* Settings.scale`` with ``Settings`` a class of the script's holding settings, read
    in the forward or in the loss function: a class is no plain value and only a Python
    module's settings were keyed, so after ``Settings.scale = 3.0`` the captured steps
    replayed scale 1 (loss 2.514 at step 2 where the eager step gives 6.052, 7.543 with
    the loss scaled), silently."""
    if reader == "forward":
        build, loss_fn = ClassScaled, tp.cross_entropy
    else:
        build = _plain_linear
        loss_fn = lambda o, y: tp.cross_entropy(o, y) * Settings.scale      # noqa: E731
    _assert_setting_seen(devices2, Settings, "scale", build, loss_fn)


class Annealed(pc.nn.Module):
    """Anneals a temperature by the training forwards it has run (Python state it sets)."""

    def __init__(self, queue):
        super().__init__()
        self.a = pc.nn.Linear(8, 4, queue=queue)
        self.calls = 0

    def forward(self, x):
        tau = max(0.25, 1.0 - 0.25 * self.calls)
        if self.training:
            self.calls += 1
        return self.a(x) / tau


def test_a_captured_group_accumulating_sees_what_a_forward_changes_between_micro_batches(
        devices2):
    """With ``accumulation_steps=2`` the second micro-batch's forward reads the counter the
    first one advanced: the model's key was taken once per step, so the second micro-batch
    replayed the first one's recording (its temperature) and the losses were [1.829, 2.025,
    4.147] where the eager steps give [1.923, 2.929, 8.615], silently. The key is taken
    before every micro-batch now."""
    def run(capture):
        with ReplicaGroup(lambda q: (pc.manual_seed(0), Annealed(q))[1], devices2,
                          capture=capture) as g:
            opt = pc.optim.SGD(g.parameters(), lr=0.1)
            losses = [g.step(*batch(8, seed=i), tp.cross_entropy, opt, accumulation_steps=2)
                      for i in range(3)]
            return losses, [p.value.to_host() for p in g.parameters()]

    (eager, eager_params), (captured, captured_params) = run(False), run(True)
    assert captured == eager
    np.testing.assert_allclose(eager, [1.92302, 2.92895, 8.61510], rtol=1e-5)
    for a, b in zip(eager_params, captured_params):
        np.testing.assert_array_equal(b, a)


ACT = pc.nn.LeakyReLU(0.5)     # a layer made at module level, which a forward calls


class GlobalActivated(pc.nn.Module):
    def __init__(self, queue):
        super().__init__()
        self.a = pc.nn.Linear(8, 4, queue=queue)

    def forward(self, x):
        return ACT(self.a(x))


def test_a_captured_group_sees_a_setting_of_a_module_level_layer_its_forward_calls(devices2):
    """``ACT(self.a(x))`` with ``ACT`` a LeakyReLU made at module level (no sub-module of
    the model): a module is no plain value, so ``capture_key`` skipped it, and after
    ``ACT.negative_slope = 3.0`` the captured steps replayed slope 0.5 (loss 2.264 at step 2
    where the eager step gives 3.787), silently. Such a layer is keyed as a sub-module is."""
    def losses(capture):
        ACT.negative_slope = 0.5
        return changed_at_step_2(devices2, GlobalActivated, tp.cross_entropy,
                                 lambda g: setattr(ACT, "negative_slope", 3.0), capture)

    try:
        (eager, _), (captured, replays) = losses(False), losses(True)
    finally:
        ACT.negative_slope = 0.5
    np.testing.assert_array_equal(captured, eager)
    assert replays == 4                          # steps 1 and 3 on both replicas


def counted(fn):
    """A decorator as scripts write them (counting calls, timing), with functools.wraps."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        wrapper.calls += 1
        return fn(*args, **kwargs)
    wrapper.calls = 0
    return wrapper


class DecoratedForward(pc.nn.Module):
    def __init__(self, queue):
        super().__init__()
        self.a = pc.nn.Linear(8, 4, queue=queue)

    @counted
    def forward(self, x):
        return self.a(x) * SCALE


def test_a_captured_group_sees_a_global_a_decorated_forward_reads(devices2):
    """``forward`` under a decorator (``functools.wraps``) reading ``SCALE``: only the
    wrapper's code was walked, so after ``SCALE = 1.5`` from 0.5 the captured steps replayed
    scale 0.5 (loss 1.830 at step 2 where the eager step gives 3.293), silently. The
    function a decorator wraps is walked now."""
    global SCALE

    def make_change(group):
        global SCALE
        SCALE = 1.5

    def losses(capture):
        global SCALE
        SCALE = 0.5
        return changed_at_step_2(devices2, DecoratedForward, tp.cross_entropy, make_change,
                                 capture)

    try:
        (eager, _), (captured, replays) = losses(False), losses(True)
    finally:
        SCALE = 0.5
    np.testing.assert_array_equal(captured, eager)
    assert replays == 4                          # steps 1 and 3 on both replicas


# -- a tensor read from a global or a closure, rebound between calls ----------------------------
def host(t):
    return (t.value if isinstance(t, tp.Node) else t).to_host()


@pytest.mark.parametrize("make", [
    lambda q, v: pc.Tensor.full(q, (4,), v),
    lambda q, v: tp.tensor(pc.Tensor.full(q, (4,), v)),
    lambda q, v: pc.nn.Parameter(pc.Tensor.full(q, (4,), v)),
], ids=["tensor", "node", "parameter"])
def test_a_captured_step_reading_a_rebound_global_tensor_gives_the_eager_result(queue, make):
    """``x * held[0]``, a tensor the step is not passed, replayed, then ``held[0]`` rebound
    to a new tensor (3.0) and a 9.0 tensor made, which the pool gave the old one's memory:
    the replay read it, [9, 9, 9, 9], another tensor's data (a Node's or a Parameter's old
    value, which the recording held, gave the stale [2, 2, 2, 2]), where the eager call
    gives [3, 3, 3, 3]. The recording now keeps the memory of what it reads and did not
    allocate, sees it dropped and records the call anew; the replays go on after."""
    held = [make(queue, 2.0)]

    def scaled(x):
        with tp.no_grad():
            return x * held[0]

    step = tp.capture(scaled, queue)
    x = np.ones(4, np.float32)
    for _ in range(2):
        step(x)
    held[0] = make(queue, 3.0)                     # the old tensor is dropped here
    other = make(queue, 9.0)
    np.testing.assert_array_equal(host(step(x)), np.full(4, 3.0, np.float32))
    np.testing.assert_array_equal(host(other), np.full(4, 9.0, np.float32))
    assert (step.replays, step.reason(x)) == (1, None)
    np.testing.assert_array_equal(host(step(x)), np.full(4, 3.0, np.float32))
    assert step.replays == 2


def test_a_captured_group_reading_a_rebound_global_tensor_equals_the_eager_one(devices2):
    """A forward hook adding ``shifts[queue]``, a tensor rebound before steps 1 and 3: the
    replays read the dropped tensors' memory (losses 1.433 at steps 1 and 2 where the eager
    steps give 2.053, 4 replays per replica). Each rebinding records the step anew."""
    shifts = {}

    def build(queue):
        pc.nn.manual_seed(0)
        net = pc.nn.Linear(4, 3, queue=queue)
        net.register_forward_hook(lambda m, i, out: out + shifts[queue.int_ptr])
        return net

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 4)).astype(np.float32), rng.integers(0, 3, 8)

    def losses(capture):
        out = []
        with ReplicaGroup(build, devices2, capture=capture) as group:
            opt = pc.optim.SGD(group.parameters(), lr=0.0)
            for i in range(5):
                for r in group.replicas if i in (0, 1, 3) else ():
                    shift = np.float32(i) * np.array([1, -1, 0], np.float32)
                    shifts[r.queue.int_ptr] = pc.Tensor.from_host(r.queue, shift)
                others = [pc.Tensor.full(r.queue, (3,), 100.0) for r in group.replicas]
                out.append(group.step(x, y, tp.cross_entropy, opt))
                del others
            replays = [step.replays for per in group.captured_steps for step in per]
        return out, replays

    (eager, _), (captured, replays) = losses(False), losses(True)
    assert captured == eager
    np.testing.assert_allclose(eager, [1.4333, 2.0528, 2.0528, 4.0000, 4.0000], atol=1e-4)
    assert replays == [2, 2]                     # steps 2 and 4 on both replicas


@pytest.mark.parametrize("scale", [1.0, 2.0], ids=["freed", "taken by the step"])
def test_a_captured_step_rebinding_a_global_it_reads_runs_eagerly_with_a_reason(queue, scale):
    """``ema = ema * 0.5 + x`` inside the step, ``ema`` a global: the tensor read was dropped
    during the call, its memory free in the pool (returning ``ema``) or taken by the step's
    own ``ema * 2``, and the replays read it after the pool gave it to a 77.0 tensor:
    1, 39.5, 39.5, 39.5 where the eager calls give 1, 1.5, 1.75, 1.875 (2, 79, 79, 79 for
    2, 3, 3.5, 3.75). Such a step stays eager and says why; changing the tensor in place
    (``ema.copy_(...)``) is replayed."""
    ema = [pc.Tensor.zeros(queue, (4,))]

    def out(e):
        return e if scale == 1.0 else e * scale

    def smoothed(x):
        with tp.no_grad():
            ema[0] = ema[0] * 0.5 + x
            return out(ema[0])

    def in_place(x):
        with tp.no_grad():
            ema[0].copy_(ema[0] * 0.5 + x)
            return out(ema[0])

    x = np.ones(4, np.float32)
    for fn, replays in ((smoothed, 0), (in_place, 3)):
        ema[0] = pc.Tensor.zeros(queue, (4,))
        step = tp.capture(fn, queue)
        got = []
        for _ in range(4):
            got.append(step(x).to_host()[0])
            other = pc.Tensor.full(queue, (4,), 77.0)
        np.testing.assert_array_equal(got, np.array([1, 1.5, 1.75, 1.875], np.float32) * scale)
        np.testing.assert_array_equal(other.to_host(), np.full(4, 77.0, np.float32))
        assert step.replays == replays
        assert (step.reason(x) or "").startswith("it drops a tensor it read") == (replays == 0)


def test_a_container_holding_a_lock_beside_settings_keys_the_settings(queue):
    """A module's dict holding a lock beside a setting (``{"lock": l, "s": s}``) dropped out
    of ``capture_key`` whole, setting included: with ``s`` set to 1, 1, 2, 3 the captured
    forward replayed 0.311 three times where eager gives 0.311, 0.311, 0.622, 0.933. The lock
    is keyed by identity now, the setting by value."""
    import threading

    class Scaled(pc.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = pc.nn.Linear(2, 2)
            self.d = {"lock": threading.Lock(), "s": 1.0}

        def forward(self, x):
            return self.lin(x) * self.d["s"]

    pc.manual_seed(0)
    m = Scaled()
    step = tp.capture(lambda x: m(x), queue)
    a = np.ones((1, 2), np.float32)
    got, want = [], []
    for s in (1.0, 1.0, 2.0, 3.0):
        m.d["s"] = s
        with tp.no_grad():
            got.append(step(a, key=pc.nn.capture_key(m)).to_host())
            want.append(m(pc.Tensor.from_host(queue, a)).to_host())
    np.testing.assert_array_equal(np.array(got), np.array(want))
    assert step.replays == 1
