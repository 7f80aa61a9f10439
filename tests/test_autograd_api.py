"""PyTorch's autograd API on parcl's tape: ``tp.grad`` and ``tp.backward``
(``torch.autograd.grad``/``backward``), ``loss.backward(retain_graph=, inputs=)``, Node hooks
(``register_hook``, ``register_post_accumulate_grad_hook``), ``retain_grad``,
``requires_grad_``, ``is_leaf``, ``detach_``, ``tp.inference_mode``, and a module's forward
and full backward hooks, each against PyTorch: values, hook call order, handles removed; what
a captured step does when hooks change between its calls, and what a ReplicaGroup does with
hooks on replica 0's model alone."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from conftest import leaf

X = np.array([1.0, 2.0, 3.0], np.float32)
W = np.array([0.5, -1.0, 2.0], np.float32)


def _tp_loss(x, w):
    return tp.sum(tp.tanh(x * w) * x)


def _torch_loss(x, w):
    return torch.sum(torch.tanh(x * w) * x)


# -- tp.grad -----------------------------------------------------------------------------------
def test_grad_returns_what_backward_accumulates_and_leaves_grads_untouched_as_pytorch(queue):
    x, w = leaf(queue, X), leaf(queue, W)
    w.grad = pc.Tensor.from_host(queue, np.array([7.0, 7.0, 7.0], np.float32))
    with tp.Tape() as tape:
        h = x * w
        y = tp.sum(tp.tanh(h) * x)
    gx, gw = tp.grad(y, [x, w], retain_graph=True)
    assert x.grad is None and h.grad is None                 # nothing stored anywhere
    np.testing.assert_array_equal(w.grad.to_host(), [7.0, 7.0, 7.0])
    tx, tw = torch.tensor(X, requires_grad=True), torch.tensor(W, requires_grad=True)
    want_x, want_w = torch.autograd.grad(_torch_loss(tx, tw), [tx, tw])
    np.testing.assert_allclose(gx.to_host(), want_x.numpy(), rtol=1e-6)
    np.testing.assert_allclose(gw.to_host(), want_w.numpy(), rtol=1e-6)
    assert tp.gradcheck(_tp_loss, [x, w])   # the backward against finite differences
    x.grad = w.grad = None
    tape.backward(y)                      # the same pass, accumulated: the same bits
    np.testing.assert_array_equal(x.grad.to_host(), gx.to_host())
    np.testing.assert_array_equal(w.grad.to_host(), gw.to_host())


def test_grad_of_several_outputs_with_grad_outputs_and_an_inner_input_as_pytorch(queue):
    x = leaf(queue, X)
    with tp.Tape() as _kept:                # kept: dropping a tape frees its graph
        m = x * 2.0
        a, b = m * m, tp.sin(x)
    up_a = pc.Tensor.from_host(queue, np.array([1.0, -1.0, 0.5], np.float32))
    gm, gx = tp.grad([a, b], [m, x], grad_outputs=[up_a, pc.Tensor.full(queue, (3,), 2.0)])
    tx = torch.tensor(X, requires_grad=True)
    tm = tx * 2.0
    want = torch.autograd.grad([tm * tm, torch.sin(tx)], [tm, tx],
                               grad_outputs=[torch.tensor([1.0, -1.0, 0.5]), torch.full((3,), 2.0)])
    np.testing.assert_allclose(gm.to_host(), want[0].numpy(), rtol=1e-6)
    np.testing.assert_allclose(gx.to_host(), want[1].numpy(), rtol=1e-6)
    np.testing.assert_allclose(gm.to_host(), [4.0, -8.0, 6.0])       # 2m * up


def test_grad_unused_inputs_give_none_or_zeros_only_when_allowed_as_pytorch(queue):
    x, unused = leaf(queue, X), leaf(queue, W)
    with tp.Tape() as _kept:
        y = tp.sum(x * x)
    with pytest.raises(pc.ParclError, match="input 1 .* not used"):
        tp.grad(y, [x, unused], retain_graph=True)
    gx, gu = tp.grad(y, [x, unused], allow_unused=True, retain_graph=True)
    assert gu is None
    np.testing.assert_allclose(gx.to_host(), 2 * X)
    _, zeros = tp.grad(y, [x, unused], materialize_grads=True, retain_graph=True)
    np.testing.assert_array_equal(zeros.to_host(), [0.0, 0.0, 0.0])
    with pytest.raises(pc.ParclError, match="materialize_grads"):
        tp.grad(y, [x, unused], allow_unused=False, materialize_grads=True)
    tx, tu = torch.tensor(X, requires_grad=True), torch.tensor(W, requires_grad=True)
    assert torch.autograd.grad((tx * tx).sum(), [tx, tu], allow_unused=True)[1] is None


def test_grad_refuses_what_pytorch_refuses_with_the_reason(queue):
    x = leaf(queue, X)
    with tp.Tape() as _kept:
        y = x * x
        s = tp.sum(y)
    with pytest.raises(pc.ShapeError, match=r"shape \(3,\).*grad_outputs"):
        tp.grad(y, x)                                      # non-scalar, no grad_outputs
    with pytest.raises(pc.ShapeError, match=r"grad_outputs\[0\] has shape \(2,\)"):
        tp.grad(y, x, grad_outputs=pc.Tensor.zeros(queue, (2,)))
    with pytest.raises(pc.ParclError, match="create_graph"):
        tp.grad(s, x, create_graph=True)
    with pytest.raises(pc.ParclError, match="input 0 .* does not require grad"):
        tp.grad(s, leaf(queue, X, requires_grad=False))
    with pytest.raises(pc.ParclError, match="output 0 does not require grad"):
        tp.grad(x.value, x)
    ty = torch.tensor(X, requires_grad=True) * 2
    with pytest.raises(RuntimeError):
        torch.autograd.grad(ty, ty)                        # PyTorch's refusal of the first


def test_grad_without_retain_graph_ends_the_tapes_backward_as_pytorch_frees_it(queue):
    x = leaf(queue, X)
    with tp.Tape() as kept:
        y = tp.sum(x * x)
    tp.grad(y, x, retain_graph=True)
    kept.backward(y)                                       # still possible
    with tp.Tape() as ended:
        z = tp.sum(x * x)
    tp.grad(z, x)
    with pytest.raises(pc.ParclError, match="twice"):
        ended.backward(z)


def test_backward_of_several_outputs_and_into_chosen_inputs_as_pytorch(queue):
    x, w = leaf(queue, [2.0]), leaf(queue, [5.0])
    with tp.Tape() as _kept:
        a, b = x * x * w, x * 3.0
    tp.backward([a, b], [pc.Tensor.full(queue, (1,), 2.0), None])
    tx, tw = torch.tensor([2.0], requires_grad=True), torch.tensor([5.0], requires_grad=True)
    torch.autograd.backward([tx * tx * tw, tx * 3.0], [torch.tensor([2.0]), None])
    assert x.grad.to_host().tolist() == tx.grad.tolist() == [43.0]      # 2 * 2xw + 3
    assert w.grad.to_host().tolist() == tw.grad.tolist() == [8.0]
    with pytest.raises(pc.ParclError, match="already ran its backward"):
        tp.backward(a)
    x.grad = w.grad = None
    with tp.Tape() as _kept:
        loss = tp.sum(x * w * x)
    loss.backward(inputs=[w])                                # only w's .grad
    tx.grad = tw.grad = None
    (tx * tw * tx).sum().backward(inputs=[tw])
    assert x.grad is None and tx.grad is None
    assert w.grad.to_host().tolist() == tw.grad.tolist() == [4.0]


def test_loss_backward_takes_pytorchs_retain_graph_and_gradient(queue):
    x = leaf(queue, X)
    with tp.Tape() as _kept:
        y = x * 2.0
    y.backward(gradient=pc.Tensor.full(queue, (3,), 1.0), retain_graph=True)
    y.backward(grad=pc.Tensor.full(queue, (3,), 0.5))       # parcl's name, the second pass
    np.testing.assert_array_equal(x.grad.to_host(), [3.0, 3.0, 3.0])
    with pytest.raises(pc.ParclError, match="twice"):
        y.backward(pc.Tensor.full(queue, (3,), 1.0))
    with pytest.raises(pc.ParclError, match="create_graph"):
        y.backward(pc.Tensor.full(queue, (3,), 1.0), create_graph=True)
    with pytest.raises(TypeError, match="one argument"):
        y.backward(pc.Tensor.full(queue, (3,), 1.0), grad=pc.Tensor.full(queue, (3,), 1.0))


def test_inference_mode_records_nothing_and_says_so_as_pytorch(queue):
    x = leaf(queue, X)
    assert not tp.is_inference_mode_enabled()
    with tp.inference_mode():
        y = x * 2.0
        assert tp.is_inference_mode_enabled() and not tp.is_grad_enabled()
        with tp.inference_mode(False):                    # leaves it and records again
            assert not tp.is_inference_mode_enabled() and tp.is_grad_enabled()
    assert isinstance(y, pc.Tensor) and tp.is_grad_enabled()
    assert not tp.is_inference_mode_enabled()

    @tp.inference_mode()
    def predict(v):
        return v * 3.0, tp.is_inference_mode_enabled()

    out, inside = predict(x)
    assert isinstance(out, pc.Tensor) and inside and not tp.is_inference_mode_enabled()
    with torch.inference_mode():
        assert torch.is_inference_mode_enabled() and not torch.is_grad_enabled()
    with pytest.raises(pc.DTypeError, match="must be a bool"):
        tp.inference_mode("no")


# -- Node hooks ---------------------------------------------------------------------------------
def test_hooks_run_in_pytorchs_order_and_a_leafs_before_its_grad_accumulates(queue):
    calls = []
    a = leaf(queue, [1.0, 2.0])
    a.grad = pc.Tensor.from_host(queue, np.array([1000.0, 1000.0], np.float32))
    a.register_hook(lambda g: calls.append(("a1", g.to_host().tolist())))
    a.register_hook(lambda g: calls.append(("a2", g.to_host().tolist())) or g * 10)
    with tp.Tape() as tape:
        b = a * 3
        b.register_hook(lambda g: calls.append(("b", g.to_host().tolist())))
        c = tp.sum(b * b) + tp.sum(a)
    tape.backward(c)
    assert calls == [("b", [6.0, 12.0]), ("a1", [19.0, 37.0]), ("a2", [19.0, 37.0])]
    np.testing.assert_array_equal(a.grad.to_host(), [1190.0, 1370.0])   # 1000 + 10 * g
    torch_calls = []
    ta = torch.tensor([1.0, 2.0], requires_grad=True)
    ta.grad = torch.tensor([1000.0, 1000.0])
    ta.register_hook(lambda g: torch_calls.append(("a1", g.tolist())))
    ta.register_hook(lambda g: torch_calls.append(("a2", g.tolist())) or g * 10)
    tb = ta * 3
    tb.register_hook(lambda g: torch_calls.append(("b", g.tolist())))
    ((tb * tb).sum() + ta.sum()).backward()
    assert torch_calls == calls and ta.grad.tolist() == a.grad.to_host().tolist()


def test_an_inner_hooks_gradient_flows_on_and_removed_hooks_are_not_called(queue):
    calls = []
    x = leaf(queue, [1.0, 2.0])
    with tp.Tape() as tape:
        m = x * x
        doubled = m.register_hook(lambda g: g * 2)
        with m.register_hook(lambda g: calls.append("scoped")):
            pass                                             # removed on exit
        doubled.remove()
        doubled.remove()                                     # again: nothing
        m.register_hook(lambda g: g * 3)
        y = tp.sum(m)
    tape.backward(y)
    assert calls == []
    np.testing.assert_allclose(x.grad.to_host(), [6.0, 12.0])        # 3 * 2x
    np.testing.assert_allclose(m.grad.to_host(), [3.0, 3.0])         # the hooked gradient
    tx = torch.tensor([1.0, 2.0], requires_grad=True)
    tm = tx * tx
    tm.retain_grad()
    tm.register_hook(lambda g: g * 3)
    tm.sum().backward()
    assert tx.grad.tolist() == x.grad.to_host().tolist()
    assert tm.grad.tolist() == m.grad.to_host().tolist()


def test_tp_grad_runs_hooks_as_pytorch_a_leafs_after_an_inner_inputs_before(queue):
    a = leaf(queue, [1.0, 2.0])
    a.register_hook(lambda g: g * 10)
    (ga,) = tp.grad(tp.sum(a * a), a)
    np.testing.assert_array_equal(ga.to_host(), [20.0, 40.0])
    assert a.grad is None
    x = leaf(queue, [1.0, 2.0])
    with tp.Tape():
        m = x * 2.0
        m.register_hook(lambda g: g * 5)
        gm, gx = tp.grad(tp.sum(m * m), [m, x])
    tx = torch.tensor([1.0, 2.0], requires_grad=True)
    tm = tx * 2.0
    tm.register_hook(lambda g: g * 5)
    want_m, want_x = torch.autograd.grad((tm * tm).sum(), [tm, tx])
    assert gm.to_host().tolist() == want_m.tolist() == [4.0, 8.0]
    assert gx.to_host().tolist() == want_x.tolist() == [40.0, 80.0]


def test_post_accumulate_hooks_see_the_summed_grad_and_can_step_the_leaf_as_pytorch(queue):
    seen = []
    w = leaf(queue, [1.0, -2.0])
    w.grad = pc.Tensor.from_host(queue, np.array([0.5, 0.5], np.float32))
    w.register_hook(lambda g: g * 2)

    def sgd_in_backward(p):
        seen.append(p.grad.to_host().tolist())
        with tp.no_grad():
            p -= 0.1 * p.grad                 # PyTorch's optimizer-in-backward pattern
        p.grad = None

    w.register_post_accumulate_grad_hook(sgd_in_backward)
    with tp.Tape() as tape:
        loss = tp.sum(w * w) + tp.sum(w * 3.0)
    tape.backward(loss)
    tw = torch.tensor([1.0, -2.0], requires_grad=True)
    tw.grad = torch.tensor([0.5, 0.5])
    tw.register_hook(lambda g: g * 2)
    torch_seen = []

    def torch_sgd(p):
        torch_seen.append(p.grad.tolist())
        with torch.no_grad():
            p -= 0.1 * p.grad
        p.grad = None

    tw.register_post_accumulate_grad_hook(torch_sgd)
    ((tw * tw).sum() + (tw * 3.0).sum()).backward()
    assert seen == torch_seen == [[10.5, -1.5]]               # 0.5 + 2 * (2w + 3)
    assert w.grad is None
    np.testing.assert_allclose(w.value.to_host(), tw.detach().numpy(), rtol=1e-6)
    tp.grad(tp.sum(w * 1.0), w)                            # adds into nothing: not called
    assert len(seen) == 1
    with tp.Tape():
        inner = w * 2.0
        with pytest.raises(pc.ParclError, match="is not a leaf"):
            inner.register_post_accumulate_grad_hook(sgd_in_backward)


def test_hooks_are_refused_where_no_gradient_comes_and_checked_when_they_return(queue):
    frozen = leaf(queue, X, requires_grad=False)
    with pytest.raises(pc.ParclError, match="does not require grad"):
        frozen.register_hook(lambda g: g)
    with pytest.raises(pc.ParclError, match="does not require grad"):
        frozen.retain_grad()
    with pytest.raises(RuntimeError):
        torch.tensor(X).register_hook(lambda g: g)
    x = leaf(queue, X)
    x.register_hook(lambda g: pc.Tensor.zeros(queue, (2,)))
    with tp.Tape() as tape:
        y = tp.sum(x * x)
    with pytest.raises(pc.ShapeError, match=r"returned shape \(2,\), expected \(3,\)"):
        tape.backward(y)
    assert x.grad is None                    # nothing of the failed pass added


def test_a_hook_that_raises_leaves_the_leafs_grad_as_it_was(queue):
    x = leaf(queue, X)
    x.grad = pc.Tensor.from_host(queue, np.array([5.0, 5.0, 5.0], np.float32))

    def broken(g):
        raise ValueError("broken hook")

    x.register_hook(broken)
    with tp.Tape() as tape:
        y = tp.sum(x * x)
    with pytest.raises(ValueError, match="broken hook"):
        tape.backward(y)
    np.testing.assert_array_equal(x.grad.to_host(), [5.0, 5.0, 5.0])


def test_retain_grad_keeps_an_inner_gradient_that_retain_grads_false_frees(queue):
    x = leaf(queue, X)
    with tp.Tape() as tape:
        m = x * x
        n = m * 2.0
        m.retain_grad()
        y = tp.sum(n * x)
    assert m.retains_grad and not n.retains_grad and not x.retains_grad
    x.retain_grad()                                          # a leaf's: kept anyway, no-op
    tape.backward(y, retain_grads=False)
    assert n.grad is None
    np.testing.assert_allclose(m.grad.to_host(), 2 * X)      # d(2 m x)/dm
    tx = torch.tensor(X, requires_grad=True)
    tm = tx * tx
    tm.retain_grad()
    (tm * 2.0 * tx).sum().backward()
    np.testing.assert_allclose(m.grad.to_host(), tm.grad.numpy())
    np.testing.assert_allclose(x.grad.to_host(), tx.grad.numpy(), rtol=1e-6)


def test_is_leaf_requires_grad_and_detach_in_place_as_pytorch(queue):
    x = leaf(queue, X, requires_grad=False)
    assert x.is_leaf and x.requires_grad_() is x and x.requires_grad and x.is_leaf
    with tp.Tape() as tape:
        y = x * 2.0
    assert not y.is_leaf
    y.requires_grad_(True)                                   # already: allowed
    with pytest.raises(pc.ParclError, match="only a leaf"):
        y.requires_grad_(False)
    with pytest.raises(RuntimeError):
        (torch.ones(2, requires_grad=True) * 2).requires_grad_(False)
    with pytest.raises(pc.DTypeError, match="int64"):
        tp.tensor(np.array([1, 2])).requires_grad_()
    x.requires_grad_(False)
    assert not x.requires_grad
    with tape:
        z = y * 3.0
    assert y.detach_() is y and y.is_leaf and not y.requires_grad and y.grad_fn is None
    assert z.grad_fn is not None                             # what was recorded keeps it
    assert pc.nn.Linear(2, 2).weight.is_leaf


# -- module forward hooks -----------------------------------------------------------------------
def _hooked(nn, log):
    """A Linear(2, 2) whose hooks log their calls and change its input and output as
    PyTorch's may: (pre-hook 2 is prepended, so runs first)."""
    layer = nn.Linear(2, 2)
    handles = [
        layer.register_forward_pre_hook(lambda m, args: log.append("pre1") or (args[0] * 2,)),
        layer.register_forward_pre_hook(lambda m, args: log.append("pre2"), prepend=True),
        layer.register_forward_hook(lambda m, args, out: log.append("post1") or out + 1),
        layer.register_forward_hook(
            lambda m, args, kwargs, out: log.append(("post2", sorted(kwargs))),
            with_kwargs=True),
    ]
    return layer, handles


def test_forward_hooks_replace_inputs_and_outputs_in_pytorchs_order(queue):
    log, torch_log = [], []
    pc.manual_seed(0)
    layer, handles = _hooked(pc.nn, log)
    tlayer, thandles = _hooked(torch.nn, torch_log)
    tlayer.load_state_dict({k: torch.tensor(v) for k, v in layer.state_dict().items()})
    a = np.array([[1.0, -2.0]], np.float32)
    got = layer(tp.tensor(a)).to_host()
    want = tlayer(torch.tensor(a)).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert log == torch_log == ["pre2", "pre1", "post1", ("post2", [])]
    w, b = layer.state_dict()["weight"], layer.state_dict()["bias"]
    np.testing.assert_allclose(got, (a * 2) @ w.T + b + 1, rtol=1e-6)
    for h in handles:
        h.remove()
    log.clear()
    np.testing.assert_allclose(layer(tp.tensor(a)).to_host(), a @ w.T + b, rtol=1e-6)
    assert log == []


def test_a_with_kwargs_pre_hook_changes_kwargs_and_always_call_runs_after_an_error(queue):
    class Scale(pc.nn.Module):
        def forward(self, x, *, factor=1.0):
            if factor < 0:
                raise ValueError("negative factor")
            return x * factor

    seen = []
    m = Scale()
    m.register_forward_pre_hook(lambda mod, args, kwargs: (args, {"factor": kwargs["factor"]
                                                                   * 10}), with_kwargs=True)
    m.register_forward_hook(lambda mod, args, out: seen.append(out is None), always_call=True)
    got = m(pc.Tensor.from_host(queue, np.array([1.0], np.float32)), factor=0.5)
    assert got.item() == 5.0 and seen == [False]
    with pytest.raises(ValueError, match="negative factor"):
        m(pc.Tensor.from_host(queue, np.array([1.0], np.float32)), factor=-1.0)
    assert seen == [False, True]                             # called, with no output
    m.register_forward_pre_hook(lambda mod, args, kwargs: "bad", with_kwargs=True)
    with pytest.raises(pc.ParclError, match=r"must return None or \(args, kwargs\)"):
        m(pc.Tensor.from_host(queue, np.array([1.0], np.float32)), factor=1.0)


def _backward_hooked(nn, log, host):
    layer = nn.Linear(3, 2)
    layer.register_full_backward_pre_hook(
        lambda m, go: log.append(("pre", [host(g) for g in go])) or (go[0] * 2,))
    layer.register_full_backward_hook(lambda m, gi, go: log.append(
        ("bw", [None if g is None else host(g) for g in gi], [host(g) for g in go])))
    layer.register_full_backward_hook(
        lambda m, gi, go: None if gi[0] is None else (gi[0] * 10,))
    return layer


@pytest.mark.parametrize("input_requires_grad", [True, False])
def test_full_backward_hooks_see_and_replace_gradients_as_pytorch(queue, input_requires_grad):
    log, torch_log = [], []
    pc.manual_seed(0)
    layer = _backward_hooked(pc.nn, log, lambda g: g.to_host().round(4).tolist())
    tlayer = _backward_hooked(torch.nn, torch_log, lambda g: g.numpy().round(4).tolist())
    tlayer.load_state_dict({k: torch.tensor(v) for k, v in layer.state_dict().items()})
    a = np.array([[1.0, -2.0, 0.5]], np.float32)
    x = tp.tensor(a, requires_grad=input_requires_grad)
    with tp.Tape() as tape:
        loss = tp.sum(layer(x) * 3.0)
    tape.backward(loss)
    tx = torch.tensor(a, requires_grad=input_requires_grad)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # PyTorch's note when no input requires grad
        (tlayer(tx) * 3.0).sum().backward()
    assert log == torch_log
    assert log[0] == ("pre", [[[3.0, 3.0]]]) and log[1][2] == [[[6.0, 6.0]]]   # doubled
    np.testing.assert_allclose(layer.weight.grad.to_host(), tlayer.weight.grad.numpy())
    if input_requires_grad:                   # the input's gradient times 10
        np.testing.assert_allclose(x.grad.to_host(), tx.grad.numpy(), rtol=1e-6)
    else:
        assert log[1][1] == [None]


def test_backward_hooks_refuse_modules_a_tape_node_cannot_join(queue):
    bilinear = pc.nn.Bilinear(2, 2, 1)
    bilinear.register_full_backward_hook(lambda m, gi, go: None)
    x1, x2 = (tp.tensor(np.ones((1, 2)), requires_grad=True) for _ in range(2))
    with tp.Tape(), pytest.raises(pc.ParclError, match="more than one input that requires"):
        bilinear(x1, x2)
    split = pc.nn.Identity()
    split.forward = lambda x: (x, x)
    split.register_full_backward_pre_hook(lambda m, go: None)
    with tp.Tape(), pytest.raises(pc.ParclError, match="return one tp.Node"):
        split(x1)


# -- capture --------------------------------------------------------------------------------------
def test_a_hook_registered_or_removed_between_captured_calls_records_the_step_anew(queue):
    w = leaf(queue, W)
    layer = pc.nn.Identity()

    def step(x):
        with tp.Tape() as tape:
            loss = tp.sum(layer(w * x))
        tape.backward(loss)
        return loss.value

    captured = tp.capture(step, queue)
    x = X
    for _ in range(2):
        w.grad = None
        captured(x)
    assert captured.replays == 1
    np.testing.assert_array_equal(w.grad.to_host(), X)
    handle = w.register_hook(lambda g: g * 2)               # a new recording, then replayed
    for _ in range(2):
        w.grad = None
        captured(x)
        np.testing.assert_array_equal(w.grad.to_host(), 2 * X)
    assert captured.replays == 2
    handle.remove()
    w.grad = None
    captured(x)
    np.testing.assert_array_equal(w.grad.to_host(), X)
    assert captured.replays == 3
    module_handle = layer.register_forward_hook(lambda m, args, out: out * 3)
    w.grad = None
    assert captured(x).item() == pytest.approx(3 * float(np.sum(W * X)))
    np.testing.assert_array_equal(w.grad.to_host(), 3 * X)
    module_handle.remove()
    w.grad = None
    assert captured(x).item() == pytest.approx(float(np.sum(W * X)))
    # each hook was a new recording; each removal found the first one again and replayed it
    assert captured.replays == 4


def _relu_mlp_step(queue):
    """Linear -> ReLU -> Linear (the ReLU run in the first GEMM while neither holds a hook),
    its training step captured, and the step: each called with the gradients cleared."""
    pc.nn.manual_seed(0)
    model = pc.nn.Sequential(pc.nn.Linear(4, 3, queue=queue), pc.nn.ReLU(),
                             pc.nn.Linear(3, 2, queue=queue))

    def step(x):
        with tp.Tape() as tape:
            y = model(x)
            loss = tp.sum(y * y)
        tape.backward(loss)
        return loss.value

    def cleared(fn):
        def call(x):
            model.zero_grad(set_to_none=True)
            return fn(x)
        return call

    captured = tp.capture(step, queue)
    return model, captured, cleared(captured), cleared(step)


def test_hooks_registered_and_removed_on_other_tensors_and_modules_leave_a_step_replaying(
        queue):
    # a global count of every hook registration in the process was part of each recording's
    # key: a hook registered and removed on any tensor or module between calls (an eval
    # loop's, another model's) made every call a new recording: 0 replays of 5, here 4
    _, captured, call, _ = _relu_mlp_step(queue)
    other, unrelated = pc.nn.Linear(4, 4, queue=queue), leaf(queue, X)
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    losses = []
    for _ in range(5):
        with other.register_forward_hook(lambda m, args, out: out * 2), \
                unrelated.register_hook(lambda g: g * 2), \
                unrelated.register_post_accumulate_grad_hook(lambda p: None):
            pass
        losses.append(call(x).item())
    assert captured.replays == 4 and losses == [losses[0]] * 5
    kept = pc.nn.Linear(3, 3, queue=queue).register_forward_hook(lambda m, args, out: out)
    call(x)
    kept.remove()
    assert call(x).item() == losses[0] and captured.replays == 6


def test_a_hook_added_to_a_module_a_step_fused_or_a_parameter_it_used_records_it_anew(queue):
    # the ReLU is never called where its GEMM runs it: the recording notes it when the
    # Sequential looks at its hooks, so a hook on it later is another recording, which
    # calls it, as the eager step does
    model, captured, call, step = _relu_mlp_step(queue)
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    for _ in range(2):
        call(x)
    assert captured.replays == 1
    plain = call(x).item()
    seen = []

    def halve(m, args, out):
        seen.append(type(m).__name__)
        return out * 0.5

    handles = [model[1].register_forward_hook(halve)]
    got = [call(x).item() for _ in range(2)]
    assert captured.replays == 3 and seen == ["ReLU"]     # one new recording, then replayed
    want = step(pc.Tensor.from_host(queue, x)).item()
    assert got == [want] * 2 and want != plain and seen == ["ReLU"] * 2
    handles.append(model[0].weight.register_hook(lambda g: g * 3))
    grads = [(call(x), model[0].weight.grad.to_host())[1] for _ in range(2)]
    assert captured.replays == 4 and len(seen) == 3
    step(pc.Tensor.from_host(queue, x))
    for got_grad in grads:
        np.testing.assert_array_equal(got_grad, model[0].weight.grad.to_host())
    for handle in handles:
        handle.remove()
    assert call(x).item() == plain
    assert captured.replays == 5 and len(seen) == 4        # the first recording again
    assert [len(v) for v in captured._entries.values()] == [3]


def test_a_step_replays_while_another_thread_registers_and_removes_hooks_on_its_model(queue):
    import threading

    _, captured, call, _ = _relu_mlp_step(queue)
    theirs = pc.nn.Linear(4, 3, queue=queue)
    x = np.ones((2, 4), np.float32)

    def hook_theirs():
        handle = theirs.register_forward_hook(lambda m, args, out: out)
        theirs.weight.register_hook(lambda g: g).remove()
        handle.remove()

    for _ in range(4):
        worker = threading.Thread(target=hook_theirs)
        worker.start()
        worker.join()
        call(x)
    assert captured.replays == 3


# -- replica groups ---------------------------------------------------------------------------
def _small(queue):
    return pc.nn.Sequential(pc.nn.Linear(4, 3, queue=queue), pc.nn.ReLU(),
                            pc.nn.Linear(3, 2, queue=queue))


def test_a_group_refuses_hooks_on_replica_0_alone_and_runs_those_on_every_replica(devices2):
    from parcl.replica import ReplicaGroup

    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 4)).astype(np.float32)
    y = rng.integers(0, 2, 8)
    with ReplicaGroup(_small, devices2) as group:
        opt = pc.optim.SGD(group.parameters(), lr=0.1)
        handle = group.model[0].register_forward_hook(lambda m, args, out: out * 2)
        with pytest.raises(pc.ParclError, match=r"replica 0's '0' has \(0, 1, 0, 0\) \(forward.*"
                                                r"replica 1's \(0, 0, 0, 0\)"):
            group.step(x, y, tp.cross_entropy, opt)
        handle.remove()
        group.model[2].weight.register_hook(lambda g: g * 0)
        with pytest.raises(pc.ParclError, match="'2.weight' has 1 gradient hooks"):
            group.step(x, y, tp.cross_entropy, opt)
        for replica in group.replicas[1:]:
            replica.model[2].weight.register_hook(lambda g: g * 0)
        head, first = (group.model[i].weight.value.to_host() for i in (2, 0))
        group.step(x, y, tp.cross_entropy, opt)          # every replica zeroes it: unchanged
        np.testing.assert_array_equal(group.model[2].weight.value.to_host(), head)
        assert not np.array_equal(group.model[0].weight.value.to_host(), first)


def test_a_captured_step_replays_its_hooks_device_work_not_their_python(queue):
    w = leaf(queue, [1.0, 2.0, 3.0])
    calls = []

    def step(x):
        with tp.Tape():
            m = w * x
            m.register_hook(lambda g: calls.append("hook") or g * 2)   # the step's own
            (gw,) = tp.grad(tp.sum(m * m), w)
        return gw

    captured = tp.capture(step, queue)
    for i in range(1, 4):
        got = captured(np.full(3, i, np.float32)).to_host()
        np.testing.assert_array_equal(got, 2 * 2 * np.array([1.0, 2.0, 3.0]) * i * i)
    assert captured.replays == 2 and calls == ["hook"]      # its Python ran when recording
    assert w.grad is None
