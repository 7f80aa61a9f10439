"""Silent wrong results of the autograd API (``tp.grad``, ``tp.backward``, Node hooks) found in
review, each against PyTorch: what the caller's tensors hold after a pass, and the gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.utils.checkpoint

import parcl as pc
import parcl.tape as tp
from conftest import leaf

X = np.array([1.0, 2.0], np.float32)


def test_several_outputs_leave_the_callers_upstream_gradients_as_they_were_as_pytorch(queue):
    # y is an output and an input of z: z's backward adds into y's gradient, which was the
    # caller's grad_tensors[0] itself (it became [3, 3] and the next call's seed with it)
    tx = torch.tensor(X, requires_grad=True)
    ty = tx * 3.0
    torch.autograd.backward([ty, ty * 2.0], [torch.ones(2), torch.ones(2)])
    for run in ("backward", "grad"):
        x = leaf(queue, X)
        with tp.Tape() as _kept:
            y = x * 3.0
            z = y * 2.0
        gy, gz = pc.Tensor.full(queue, (2,), 1.0), pc.Tensor.full(queue, (2,), 1.0)
        if run == "backward":
            tp.backward([y, z], [gy, gz])
            got = x.grad
        else:
            (got,) = tp.grad([y, z], [x], [gy, gz])
        np.testing.assert_array_equal(gy.to_host(), [1.0, 1.0])
        np.testing.assert_array_equal(gz.to_host(), [1.0, 1.0])
        np.testing.assert_array_equal(got.to_host(), tx.grad.numpy())     # [9, 9]


def test_a_tensor_a_hook_returns_never_becomes_a_leafs_grad_as_pytorch(queue):
    # y's hook returns the caller's c; add's backward hands it to the leaf x, which adopted
    # it as its .grad: the next backward's += then wrote into c ([5, 5] became [6, 6])
    tx, tc = torch.tensor(X, requires_grad=True), torch.full((2,), 5.0)
    ty = tx + 0.0
    ty.register_hook(lambda g: tc)
    ty.sum().backward()
    (tx * 1.0).sum().backward()
    for retain_grads in (True, False):
        x, c = leaf(queue, X), pc.Tensor.full(queue, (2,), 5.0)
        with tp.Tape() as tape:
            y = x + 0.0
            y.register_hook(lambda g, c=c: c)
            loss = tp.sum(y)
        tape.backward(loss, retain_grads=retain_grads)
        assert x.grad.data is not c.data
        with tp.Tape() as tape:
            loss = tp.sum(x * 1.0)
        tape.backward(loss)
        np.testing.assert_array_equal(c.to_host(), tc.numpy())            # [5, 5]
        np.testing.assert_array_equal(x.grad.to_host(), tx.grad.numpy())  # [6, 6]


def test_inference_mode_false_leaves_inference_mode_and_records_as_pytorch(queue):
    # inference_mode(False) changed nothing: inside inference_mode (or no_grad) x * 2.0 was a
    # raw Tensor and the gradient of x never came, where PyTorch records it (x.grad [2, 2])
    tx = torch.tensor(X, requires_grad=True)
    with torch.inference_mode(), torch.inference_mode(False):
        want = (torch.is_inference_mode_enabled(), torch.is_grad_enabled())
        (tx * 2.0).sum().backward()
    with torch.no_grad(), torch.inference_mode(False):
        assert torch.is_grad_enabled()
    for outer in (tp.inference_mode, tp.no_grad):
        x = leaf(queue, X)
        with outer(), tp.inference_mode(False):
            assert (tp.is_inference_mode_enabled(), tp.is_grad_enabled()) == want
            with tp.Tape() as tape:
                loss = tp.sum(x * 2.0)
            tape.backward(loss)
        np.testing.assert_array_equal(x.grad.to_host(), tx.grad.numpy())      # [2, 2]
    assert tp.is_grad_enabled() and not tp.is_inference_mode_enabled()


def test_enable_grad_inside_inference_mode_turns_grad_mode_on_and_records_nothing_as_pytorch(
        queue):
    # enable_grad (or set_grad_enabled(True)) inside inference_mode recorded a graph: x * 2.0
    # was a Node with a grad_fn, where PyTorch's is an inference tensor that records nothing
    tx = torch.tensor(X, requires_grad=True)
    x = leaf(queue, X)
    for torch_switch, switch in ((torch.enable_grad, tp.enable_grad),
                                 (lambda: torch.set_grad_enabled(True),
                                  lambda: tp.set_grad_enabled(True))):
        with torch.inference_mode(), torch_switch():
            ty = tx * 2.0
            want = (torch.is_inference_mode_enabled(), torch.is_grad_enabled(),
                    ty.requires_grad, ty.grad_fn)
        assert want == (True, True, False, None)
        with tp.inference_mode(), switch():
            y = x * 2.0
            got = (tp.is_inference_mode_enabled(), tp.is_grad_enabled(),
                   isinstance(y, tp.Node), y.to_host().tolist())
            with tp.no_grad():
                assert not tp.is_grad_enabled()
            assert tp.is_grad_enabled() and not isinstance(x * 2.0, tp.Node)
        assert got == (True, True, False, [2.0, 4.0])
        assert not tp.is_inference_mode_enabled() and tp.is_grad_enabled()
        assert isinstance(x * 2.0, tp.Node)                   # records again outside


def test_retained_and_input_inner_gradients_accumulate_across_backwards_as_pytorch(queue):
    # an inner Node's .grad was each pass's own, so a second backward through the graph left
    # a retain_grad() node's (or an inputs= node's) [3, 3] where PyTorch's adds up to [6, 6]
    tx = torch.tensor(X, requires_grad=True)
    ty = tx * 2.0
    ty.retain_grad()
    tl = torch.sum(ty * 3.0)
    tl.retain_grad()
    tl.backward(retain_graph=True)
    tl.backward()
    tu = tx * 2.0
    tv = torch.sum(tu * 3.0)
    tv.backward(inputs=[tu], retain_graph=True)
    tv.backward(inputs=[tu])
    x = leaf(queue, X)
    with tp.Tape() as _kept:
        y = x * 2.0
        y.retain_grad()
        loss = tp.sum(y * 3.0)
        loss.retain_grad()
    with tp.Tape() as _kept_too:
        u = x * 2.0
        v = tp.sum(u * 3.0)
    loss.backward(retain_graph=True)
    loss.backward()
    np.testing.assert_array_equal(y.grad.to_host(), ty.grad.numpy())          # [6, 6]
    np.testing.assert_array_equal(loss.grad.to_host(), tl.grad.numpy())       # 2
    np.testing.assert_array_equal(x.grad.to_host(), tx.grad.numpy())          # [12, 12]
    x.grad = None
    v.backward(inputs=[u], retain_graph=True)
    v.backward(inputs=[u])
    np.testing.assert_array_equal(u.grad.to_host(), tu.grad.numpy())          # [6, 6]
    assert x.grad is None                                 # only into the inputs, as PyTorch


def test_a_post_accumulate_hook_never_steps_on_the_gradient_of_a_bad_input(queue):
    # the embedding's index check waits for the device until the pass's end, after the
    # post-accumulate hooks: an optimizer step in backward moved row 0 of w from 1 to 0.9
    # and only then the ParclError came, so a loop that caught it trained on garbage
    w = leaf(queue, np.ones((4, 2), np.float32))
    steps = []

    def sgd_in_backward(p):
        steps.append(p.grad.to_host().copy())
        with tp.no_grad():
            p -= 0.1 * p.grad
        p.grad = None

    w.register_post_accumulate_grad_hook(sgd_in_backward)
    bad = pc.Tensor.from_host(queue, np.array([0, 7], np.int64))
    with tp.Tape() as tape:
        loss = tp.sum(tp.embedding(bad, w))
    with pytest.raises(pc.ParclError, match="index 7 .* out of range"):
        tape.backward(loss)
    assert steps == []
    np.testing.assert_array_equal(w.value.to_host(), np.ones((4, 2), np.float32))
    w.grad = None
    good = pc.Tensor.from_host(queue, np.array([0, 3, 0], np.int64))
    with tp.Tape() as tape:
        loss = tp.sum(tp.embedding(good, w))
    tape.backward(loss)                   # a good batch steps, as PyTorch's
    tw = torch.ones((4, 2), requires_grad=True)
    torch.nn.functional.embedding(torch.tensor([0, 3, 0]), tw).sum().backward()
    np.testing.assert_array_equal(steps[0], tw.grad.numpy())
    np.testing.assert_allclose(w.value.to_host(), (tw - 0.1 * tw.grad).detach().numpy())


def test_grad_and_backward_inputs_through_a_checkpoint_touch_no_other_leaf_as_pytorch(queue):
    # the checkpoint's backward ran a backward of its own, adding into the .grad of every
    # parameter its function read: tp.grad(loss, [x]) turned w.grad's ones into ones plus
    # w's gradient ([-0.41, -1.33, -0.97] in its first row), and backward(inputs=[x]) gave
    # w a .grad where PyTorch's stays None
    rng = np.random.default_rng(0)
    wn = rng.standard_normal((3, 3)).astype(np.float32)
    xn = rng.standard_normal((2, 3)).astype(np.float32)
    tw, tx = torch.tensor(wn, requires_grad=True), torch.tensor(xn, requires_grad=True)
    want_x, want_w = torch.autograd.grad(torch.tanh(tx @ tw).sum(), [tx, tw])
    w, x = leaf(queue, wn), leaf(queue, xn)
    ones = np.ones((3, 3), np.float32)
    w.grad = pc.Tensor.from_host(queue, ones)

    def loss():
        with tp.Tape() as tape:
            out = tp.sum(tp.checkpoint(lambda v: tp.tanh(v @ w), x))
        return out, tape

    out, _kept = loss()
    (gx,) = tp.grad(out, [x])
    np.testing.assert_array_equal(w.grad.to_host(), ones)
    np.testing.assert_allclose(gx.to_host(), want_x.numpy(), rtol=1e-5, atol=1e-6)
    out, _kept = loss()
    gx, gw = tp.grad(out, [x, w])
    np.testing.assert_allclose(gw.to_host(), want_w.numpy(), rtol=1e-5, atol=1e-6)
    w.grad = None
    out, _kept = loss()
    out.backward(inputs=[x])
    assert w.grad is None
    np.testing.assert_allclose(x.grad.to_host(), want_x.numpy(), rtol=1e-5, atol=1e-6)
    out, _kept = loss()
    out.backward(inputs=[w])
    np.testing.assert_allclose(w.grad.to_host(), want_w.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x.grad.to_host(), want_x.numpy(), rtol=1e-5, atol=1e-6)


def test_a_parameter_read_by_a_checkpoint_runs_its_hooks_once_as_pytorch(queue):
    # the checkpoint's own backward ran w's hooks on its part and the outer pass again on
    # the sum: a hook doubling the gradient gave w.grad 4 g where PyTorch's is 2 g (off by
    # up to 4.67 here), and an optimizer step in a post-accumulate hook stepped twice
    rng = np.random.default_rng(0)
    wn = rng.standard_normal((3, 3)).astype(np.float32)
    xn = rng.standard_normal((2, 3)).astype(np.float32)
    tw, tx = torch.tensor(wn, requires_grad=True), torch.tensor(xn, requires_grad=True)
    torch_calls = []
    tw.register_hook(lambda g: torch_calls.append("hook") or g * 2)
    tw.register_post_accumulate_grad_hook(lambda p: torch_calls.append("post"))
    torch.utils.checkpoint.checkpoint(lambda v: torch.tanh(v @ tw), tx,
                                      use_reentrant=False).sum().backward()
    w, x = leaf(queue, wn), leaf(queue, xn)
    calls = []
    w.register_hook(lambda g: calls.append("hook") or pc.Tensor.from_host(queue, g.to_host() * 2))
    w.register_post_accumulate_grad_hook(lambda p: calls.append("post"))
    with tp.Tape() as tape:
        loss = tp.sum(tp.checkpoint(lambda v: tp.tanh(v @ w), x))
    tape.backward(loss)
    assert calls == torch_calls == ["hook", "post"]
    np.testing.assert_allclose(w.grad.to_host(), tw.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x.grad.to_host(), tx.grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_])
def test_an_integer_or_bool_upstream_gradient_is_taken_as_float_as_pytorch(queue, dtype):
    # an add hands the upstream gradient on as it is, so an int32 one became x.grad itself, an
    # int32 tensor that the next backward's += and every optimizer step refused (and tp.grad
    # returned one); PyTorch casts it to the output's float32 first
    g = np.array([3, 0]).astype(dtype)
    tx = torch.tensor(X, requires_grad=True)
    (tx + 0.0).backward(torch.tensor(g))
    (tx * 2.0).sum().backward()
    tz = torch.tensor(X, requires_grad=True)
    (tgz,) = torch.autograd.grad(tz * 2.0, tz, torch.tensor(g))
    x = leaf(queue, X)
    with tp.Tape() as tape:
        y = x + 0.0
    tape.backward(y, pc.Tensor.from_host(queue, g))
    assert x.grad.dtype == np.float32
    with tp.Tape() as tape:
        loss = tp.sum(x * 2.0)
    tape.backward(loss)
    np.testing.assert_array_equal(x.grad.to_host(), tx.grad.numpy())     # [5, 2] (bool: [3, 2])
    for run in ("grad", "backward"):
        z = leaf(queue, X)
        with tp.Tape() as _kept:
            w = z * 2.0
        up = pc.Tensor.from_host(queue, g)
        if run == "grad":
            (got,) = tp.grad(w, z, up)
        else:
            tp.backward(w, up)
            got = z.grad
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got.to_host(), tgz.numpy())          # [6, 0]


def test_tp_grad_through_a_graph_whose_backward_ran_is_refused_as_pytorch(queue):
    # the tape's backward (or a tp.grad) without retain_graph ends its graph, and a later
    # tape.backward or tp.backward raised, but tp.grad went through it again without a word
    tx = torch.tensor(X, requires_grad=True)
    tl = torch.sum(tx * tx)
    tl.backward()
    with pytest.raises(RuntimeError, match="second time"):
        torch.autograd.grad(tl, tx)
    tl = torch.sum(tx * tx)
    torch.autograd.grad(tl, tx)
    with pytest.raises(RuntimeError, match="second time"):
        torch.autograd.grad(tl, tx)
    x = leaf(queue, X)
    with tp.Tape() as tape:
        loss = tp.sum(x * x)
    tape.backward(loss)
    with pytest.raises(pc.ParclError, match="tp.grad: the tape of output 0 .* already ran"):
        tp.grad(loss, x)
    with tp.Tape() as _kept:
        loss = tp.sum(x * x)
    tp.grad(loss, x)
    with pytest.raises(pc.ParclError, match="already ran its backward"):
        tp.grad(loss, x)
    with tp.Tape() as _kept_too:
        loss = tp.sum(x * x)
    (first,) = tp.grad(loss, x, retain_graph=True)             # kept: both go through
    (again,) = tp.grad(loss, x)
    np.testing.assert_array_equal(again.to_host(), first.to_host())     # 2x: [2, 4]


def test_an_in_place_change_to_a_det_or_svd_output_its_backward_reads_raises_as_pytorch(queue):
    # det's backward reads the det it returned, kept in its LU factors (svd's the S in its
    # decomposition): the check looked at tensors an op saves directly only, so d += 1 under
    # no_grad gave a.grad [[3.55, -0.59], [-1.18, 2.36]] where the gradient is
    # [[3, -0.5], [-1, 2]] and PyTorch raises
    a_host = np.array([[2.0, 1.0], [0.5, 3.0]], np.float32)
    ta = torch.tensor(a_host, requires_grad=True)
    td = torch.linalg.det(ta)
    with torch.no_grad():
        td += 1.0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        td.backward()
    a = leaf(queue, a_host)
    with tp.Tape() as tape:
        d = tp.det(a)
    with tp.no_grad():
        d += 1.0
    with pytest.raises(pc.ParclError, match="'det' .* updated in place"):
        tape.backward(d)
    with tp.Tape() as tape:
        u, s, _ = tp.linalg.svd(a)
        loss = tp.sum(u * 1.0)
    with tp.no_grad():
        s += 1.0
    with pytest.raises(pc.ParclError, match="'svd' .* updated in place"):
        tape.backward(loss)
    with tp.Tape() as tape:                     # untouched: torch's gradient
        d = tp.det(a)
    tape.backward(d)
    (want,) = torch.autograd.grad(torch.linalg.det(ta), ta)
    np.testing.assert_allclose(a.grad.to_host(), want.numpy(), rtol=1e-6)   # [[3, -0.5], [-1, 2]]


def test_a_gradient_a_hook_kept_stays_as_it_saw_it_with_retain_grads_false_as_pytorch(queue):
    # retain_grads=False let p adopt xn's gradient buffer, the one xn's hook kept, and p's
    # second gradient was then added into it: the hook's tensor read [4, 4] where it saw
    # [1, 1], and PyTorch's stays [1, 1]
    tx, seen_t = torch.tensor(X, requires_grad=True), []
    tp_ = tx * 2.0
    txn = tp_ + 0.0
    txn.register_hook(seen_t.append)
    (torch.sum(tp_ * 3.0) + torch.sum(txn * 1.0)).backward()
    x, seen = leaf(queue, X), []
    with tp.Tape() as tape:
        p = x * 2.0
        xn = p + 0.0
        xn.register_hook(seen.append)
        loss = tp.sum(p * 3.0) + tp.sum(xn * 1.0)
    tape.backward(loss, retain_grads=False)
    np.testing.assert_array_equal(seen[0].to_host(), seen_t[0].numpy())        # [1, 1]
    np.testing.assert_array_equal(x.grad.to_host(), tx.grad.numpy())            # [8, 8]


def test_setting_requires_grad_is_refused_where_requires_grad__is_as_pytorch(queue):
    # y.requires_grad = False on an op's output was taken: the backward then dropped every
    # gradient through y, so x.grad of sum(y * y) + sum(x), y = 2x, was [1, 1] where the
    # gradient is [9, 17] and PyTorch refuses the assignment; an int leaf took True
    ty = torch.tensor(X, requires_grad=True) * 2.0
    with pytest.raises(RuntimeError, match="only change requires_grad flags of leaf"):
        ty.requires_grad = False
    with pytest.raises(RuntimeError, match="floating point"):
        torch.tensor([1, 2]).requires_grad = True
    x = leaf(queue, X)
    with tp.Tape() as tape:
        y = x * 2.0
        with pytest.raises(pc.ParclError, match="only a leaf's flag can change"):
            y.requires_grad = False
        loss = tp.sum(y * y) + tp.sum(x)
    tape.backward(loss)
    np.testing.assert_array_equal(x.grad.to_host(), [9.0, 17.0])
    with pytest.raises(pc.DTypeError, match="cannot require grad"):
        tp.tensor(np.array([1, 2])).requires_grad = True
    w = leaf(queue, X)
    w.requires_grad = False                     # a leaf's flag: as requires_grad_(False)
    assert not w.requires_grad and w.is_leaf


@pytest.mark.parametrize("act", ["relu", "tanh", "sigmoid"])
def test_a_hook_on_a_sum_changes_what_a_leaf_with_a_grad_gets_through_it_as_pytorch(queue, act):
    # act's backward added its input gradient into b.grad itself (add hands it on to b
    # unchanged), before z's hook doubled it: b.grad [1, 0, 1] after relu where PyTorch's is
    # [2, 0, 2], h's right; only where b already held a .grad (a second step, accumulation)
    b_host, h_host = np.array([1.0, -2.0, 3.0], np.float32), np.full(3, 0.5, np.float32)
    tb, th = torch.tensor(b_host, requires_grad=True), torch.tensor(h_host, requires_grad=True)
    tz = tb + th
    tz.register_hook(lambda g: g * 2.0)
    getattr(torch, act)(tz).sum().backward()
    b, h = leaf(queue, b_host), leaf(queue, h_host)
    b.grad = pc.Tensor.zeros(queue, (3,))          # a gradient to accumulate into
    with tp.Tape() as tape:
        z = b + h
        z.register_hook(lambda g: g * 2.0)
        loss = tp.sum(getattr(tp, act)(z) * 1.0)
    tape.backward(loss)
    np.testing.assert_allclose(b.grad.to_host(), tb.grad.numpy(), rtol=1e-6)  # relu: [2, 0, 2]
    np.testing.assert_allclose(h.grad.to_host(), th.grad.numpy(), rtol=1e-6)


def test_an_upstream_gradient_on_another_queue_is_refused_as_pytorch_refuses_another_device(
        queues2):
    # an add hands the gradient on as it is: x.grad became the other queue's tensor, which
    # x's optimizer step then read without waiting for that queue; PyTorch refuses a gradient
    # on another device ('invalid gradient at index 0 - expected device')
    q0, q1 = queues2
    x = tp.tensor(pc.Tensor.from_host(q0, X), requires_grad=True)
    with tp.Tape() as _kept:
        y = x + 0.0
    g = pc.Tensor.from_host(q1, np.full(2, 2.0, np.float32))
    for run in (lambda: _kept.backward(y, g), lambda: tp.backward(y, g),
                lambda: tp.grad(y, x, g, retain_graph=True), lambda: y.backward(g)):
        with pytest.raises(pc.DeviceError, match="another command queue than its output"):
            run()
    assert x.grad is None
    _kept.backward(y, pc.Tensor.from_host(q0, np.full(2, 2.0, np.float32)))
    assert x.grad.queue is q0
    np.testing.assert_array_equal(x.grad.to_host(), [2.0, 2.0])


def test_tp_grad_of_an_inner_input_the_pass_ends_at_is_what_its_hooks_leave_as_pytorch(queue):
    # PyTorch captures an inner input's gradient after its hooks where the pass ends there
    # (nothing upstream of it is an input) and before them where it goes on: parcl took it
    # before them always, so tp.grad(loss, m) with m's hook g * 0.5 gave [8, 16] where
    # PyTorch gives [4, 8]
    tx = torch.tensor(X, requires_grad=True)
    tm = tx * 2.0
    tm.register_hook(lambda g: g * 0.5)
    tl = (tm * tm).sum()
    (want_alone,) = torch.autograd.grad(tl, tm, retain_graph=True)
    want_m, want_x = torch.autograd.grad(tl, [tm, tx])
    x = leaf(queue, X)
    with tp.Tape() as _kept:
        m = x * 2.0
        m.register_hook(lambda g: g * 0.5)
        loss = tp.sum(m * m)
    (alone,) = tp.grad(loss, m, retain_graph=True)
    gm, gx = tp.grad(loss, [m, x])
    np.testing.assert_array_equal(alone.to_host(), want_alone.numpy())     # [4, 8]
    np.testing.assert_array_equal(gm.to_host(), want_m.numpy())            # [8, 16]
    np.testing.assert_array_equal(gx.to_host(), want_x.numpy())            # [8, 16]


def test_hooks_run_with_grad_mode_off_as_pytorchs_backward(queue):
    # PyTorch's engine runs the backward, its hooks included, with grad mode off: a manual
    # SGD step in a post-accumulate hook (optimizer in backward) stepped [1, 2] to [0.8, 1.6]
    # there and raised 'a leaf that requires grad is used in an in-place op while grad mode
    # is on' here, and a hook's g * w recorded a Node on the tape
    def steps(lib, is_on):
        x = (torch.tensor(X, requires_grad=True) if lib is torch else leaf(queue, X))
        modes = []
        x.register_hook(lambda g: modes.append(is_on()))

        def sgd(p):
            modes.append(is_on())
            p -= 0.1 * p.grad

        x.register_post_accumulate_grad_hook(sgd)
        return x, modes

    tx, t_modes = steps(torch, torch.is_grad_enabled)
    torch.sum(tx * tx).backward()
    x, modes = steps(tp, tp.is_grad_enabled)
    w = leaf(queue, X)
    with tp.Tape() as tape:
        y = x * x
        y.register_hook(lambda g: modes.append(isinstance(g * w, tp.Node)))
        loss = tp.sum(y)
    n_recorded = len(tape.nodes)
    tape.backward(loss)
    assert modes == [False] + t_modes                     # [False, False, False]
    np.testing.assert_allclose(x.to_host(), tx.detach().numpy(), rtol=1e-6)   # [0.8, 1.6]
    assert len(tape.nodes) == n_recorded and tp.is_grad_enabled()


def test_a_hook_on_a_modules_output_runs_before_its_backward_hooks_as_pytorch(queue):
    # the module's backward hooks were the first hook of the Node it returned, so a hook the
    # caller registered on that output ran after them: its pre-hook and full backward hook
    # saw grad_output [[1, 1]] where PyTorch's see [[2, 2]], what the tensor hook leaves
    w, x_host = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), np.array([[1.0, -1.0]], np.float32)

    def run(nn, x, host, backward):
        m = nn.Linear(2, 2, bias=False)
        m.load_state_dict({"weight": torch.tensor(w) if nn is torch.nn else w})
        log = []
        m.register_full_backward_pre_hook(lambda mod, go: log.append(("pre", host(go[0]))))
        m.register_full_backward_hook(lambda mod, gi, go: log.append(("full", host(go[0]))))
        out = m(x)
        out.register_hook(lambda g: log.append("tensor") or g * 2.0)
        backward(out)
        return log

    tx = torch.tensor(x_host, requires_grad=True)
    want = run(torch.nn, tx, lambda t: t.tolist(), lambda out: out.sum().backward())
    x = leaf(queue, x_host)
    with tp.Tape() as tape:
        got = run(pc.nn, x, lambda t: t.to_host().tolist(),
                  lambda out: tape.backward(tp.sum(out)))
    assert got == want == ["tensor", ("pre", [[2.0, 2.0]]), ("full", [[2.0, 2.0]])]
    np.testing.assert_array_equal(x.grad.to_host(), tx.grad.numpy())       # [[8, 12]]
