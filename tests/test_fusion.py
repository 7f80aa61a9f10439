"""Fused and in-place ops: the same values and gradients as the unfused ops, less memory
and fewer kernels (in-place ReLU, batch_norm(residual=, relu=), Linear + ReLU in Sequential)."""

import numpy as np
import pytest

import parcl as pc
import parcl.tape as tp


def _block_grads(queue, inplace, x_np):
    pc.nn.manual_seed(0)
    block = pc.nn.BasicBlock(3, 4, stride=2, queue=queue)
    for m in block.modules():
        if isinstance(m, pc.nn.ReLU):
            m.inplace = inplace
    x = tp.tensor(pc.Tensor.from_host(queue, x_np), requires_grad=True)
    with tp.Tape() as tape:
        loss = tp.mean(block(x) * block(x))
    tape.backward(loss)
    return [x.grad.to_host()] + [p.grad.to_host() for p in block.parameters()]


def test_inplace_relu_gives_the_same_gradients(queue):
    x_np = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    for a, b in zip(_block_grads(queue, False, x_np), _block_grads(queue, True, x_np)):
        np.testing.assert_array_equal(a, b)


def test_inplace_relu_passes_gradcheck(queue):
    x_np = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    x = tp.tensor(pc.Tensor.from_host(queue, x_np), requires_grad=True)
    assert tp.gradcheck(lambda v: tp.relu(v * 2.0, inplace=True), [x])


def test_relu_keeps_one_activation_per_layer_in_place_or_not(queue):
    """The graph keeps only what the backward reads: relu's output, not ``h * 1.5`` (nothing
    reads it), so in place or not, 4 layers hold 4 activations (in place saves the copy)."""
    x = tp.tensor(pc.Tensor.from_host(queue, np.ones((64, 1024), np.float32)),
                  requires_grad=True)

    def extra_bytes(inplace):
        queue.finish()
        base = pc.memory_stats(queue)["bytes_in_use"]
        with tp.Tape() as tape:
            h = x
            for _ in range(4):
                h = tp.relu(h * 1.5, inplace=inplace)
        used = pc.memory_stats(queue)["bytes_in_use"] - base
        tape.release()
        del h
        return used

    act = 64 * 1024 * 4
    assert extra_bytes(False) == extra_bytes(True) == 4 * act


def test_inplace_on_a_leaf_that_requires_grad_is_refused(queue):
    w = tp.tensor(pc.Tensor.from_host(queue, np.ones(3, np.float32)), requires_grad=True)
    with pytest.raises(pc.ParclError, match="leaf"):
        tp.relu(w, inplace=True)


def test_inplace_on_a_view_of_such_a_leaf_is_refused_too(queue):
    """A reshape (or flatten) shares the leaf's buffer: overwriting it would change the
    parameter itself, and every later read of it in the forward (PyTorch: "a view of a leaf
    Variable that requires grad is being used in an in-place operation")."""
    w = tp.tensor(np.array([[-1.0, 2.0], [3.0, -4.0]], np.float32), requires_grad=True)
    with tp.Tape():
        for view in (tp.reshape(w, (4,)), w.reshape(4), tp.reshape(tp.reshape(w, (4,)), (2, 2))):
            with pytest.raises(pc.ParclError, match="through a view of it"):
                tp.relu(view, inplace=True)
        tp.relu(w * 1.0, inplace=True)             # a new buffer: nothing of w's is changed
    np.testing.assert_array_equal(w.value.to_host(), [[-1, 2], [3, -4]])


def _bn_inputs(queue, seed=0):
    rng = np.random.default_rng(seed)
    x, r = (rng.standard_normal((3, 2, 4, 4)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal(2).astype(np.float32)
    b = rng.standard_normal(2).astype(np.float32)
    return [tp.tensor(pc.Tensor.from_host(queue, a), requires_grad=True) for a in (x, r, w, b)]


def test_fused_batch_norm_add_relu_equals_the_three_ops(queue):
    def run(fused):
        x, r, w, b = _bn_inputs(queue)
        rm, rv = pc.Tensor.zeros(queue, (2,)), pc.Tensor.full(queue, (2,), 1.0)
        with tp.Tape() as tape:
            if fused:
                y = tp.batch_norm(x, w, b, rm, rv, True, residual=r, relu=True)
            else:
                y = tp.relu(tp.add(tp.batch_norm(x, w, b, rm, rv, True), r))
            loss = tp.sum(y * y)
        tape.backward(loss)
        return [y.to_host(), rm.to_host(), rv.to_host()] + [t.grad.to_host() for t in (x, r, w, b)]

    for a, b in zip(run(False), run(True)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_fused_batch_norm_add_relu_passes_gradcheck(queue):
    x, r, w, b = _bn_inputs(queue, seed=3)

    def fn(x, r, w, b):
        return tp.batch_norm(x, w, b, None, None, True, residual=r, relu=True)

    assert tp.gradcheck(fn, [x, r, w, b])


def _downsample_block(queue, overwrite, seed=0):
    """relu(bn(x) + bn_ds(r)), the residual a BatchNorm output (as a downsample's)."""
    x, r, w, b = _bn_inputs(queue, seed)
    with tp.Tape() as tape:
        ds = tp.batch_norm(r, w, None, None, None, True)
        y = tp.batch_norm(x, w, b, None, None, True, residual=ds, relu=True,
                          overwrite_residual=overwrite)
        loss = tp.sum(y * y)
    return tape, loss, y, ds, (x, r, w, b)


def test_overwritten_residual_gives_the_same_values_and_gradients(queue):
    results = []
    for overwrite in (False, True):
        tape, loss, y, ds, leaves = _downsample_block(queue, overwrite)
        assert (ds.value.data == y.value.data) == overwrite      # y lives in ds's buffer
        tape.backward(loss)
        results.append([y.to_host()] + [t.grad.to_host() for t in leaves])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def test_overwritten_residual_passes_gradcheck(queue):
    x, r, w, b = _bn_inputs(queue, seed=4)

    def fn(x, r, w, b):
        ds = tp.batch_norm(r, None, b, None, None, True)
        return tp.batch_norm(x, w, b, None, None, True, residual=ds, relu=True,
                             overwrite_residual=True)

    assert tp.gradcheck(fn, [x, r, w, b])


def test_overwritten_residual_keeps_one_activation_less(queue):
    def held(overwrite):
        queue.finish()
        base = pc.memory_stats(queue)["bytes_in_use"]
        tape, loss, y, ds, leaves = _downsample_block(queue, overwrite, seed=5)
        used = pc.memory_stats(queue)["bytes_in_use"] - base
        tape.release()
        del tape, loss, y, ds, leaves
        return used

    held(True)
    assert held(False) - held(True) == pc.pool.bin_size(3 * 2 * 4 * 4 * 4)


def test_overwriting_a_leaf_residual_is_refused(queue):
    x, r, w, b = _bn_inputs(queue)
    with pytest.raises(pc.ParclError, match="leaf"):
        tp.batch_norm(x, w, b, None, None, True, residual=r, overwrite_residual=True)


def test_fused_residual_shape_mismatch_is_a_shape_error(queue):
    x, r, w, b = _bn_inputs(queue)
    with pytest.raises(pc.ShapeError, match="residual"):
        tp.batch_norm(x, w, b, None, None, True, residual=tp.reshape(r, (3, 2, 16)))


def test_sequential_fuses_linear_and_relu(queue):
    pc.nn.manual_seed(0)
    model = pc.nn.Sequential(pc.nn.Linear(6, 5, queue=queue), pc.nn.ReLU(),
                             pc.nn.Linear(5, 3, queue=queue))
    x_np = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    x = tp.tensor(pc.Tensor.from_host(queue, x_np))
    with tp.Tape() as tape:
        loss = tp.sum(model(x))
    assert [n.op_name for n in tape.nodes] == ["linear", "linear", "sum"]
    tape.backward(loss)
    fused = [p.grad.to_host() for p in model.parameters()]

    model.zero_grad()
    with tp.Tape() as tape:                       # the same layers called one by one
        h = x
        for layer in model:
            h = layer(h)
        loss2 = tp.sum(h)
    tape.backward(loss2)
    assert [n.op_name for n in tape.nodes] == ["linear", "relu", "linear", "sum"]
    np.testing.assert_allclose(loss.to_host(), loss2.to_host(), rtol=1e-6)
    for a, p in zip(fused, model.parameters()):
        np.testing.assert_allclose(a, p.grad.to_host(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n,bias", [(1, False), (1, True), (3, True)])
def test_conv_relu_fused_equals_unfused(queue, n, bias):
    rng = np.random.default_rng(n)
    xs = rng.standard_normal((n, 2, 6, 6)).astype(np.float32)
    ws = rng.standard_normal((4, 2, 3, 3)).astype(np.float32)
    bs = rng.standard_normal(4).astype(np.float32) if bias else None

    def run(fused):
        x, w = (tp.tensor(pc.Tensor.from_host(queue, a), requires_grad=True) for a in (xs, ws))
        b = tp.tensor(pc.Tensor.from_host(queue, bs), requires_grad=True) if bias else None
        with tp.Tape() as tape:
            if fused:
                y = tp.conv2d(x, w, b, padding=1, relu=True)
            else:
                y = tp.relu(tp.conv2d(x, w, b, padding=1))
            loss = tp.sum(y * y)
        tape.backward(loss)
        return [y.to_host()] + [t.grad.to_host() for t in (x, w, b) if t is not None]

    for a, b_ in zip(run(False), run(True)):
        np.testing.assert_allclose(a, b_, rtol=1e-5, atol=1e-5)


def test_conv_relu_fused_passes_gradcheck(queue):
    rng = np.random.default_rng(7)
    x, w, b = (tp.tensor(pc.Tensor.from_host(queue, a), requires_grad=True) for a in (
        rng.standard_normal((2, 2, 5, 5)).astype(np.float32),
        rng.standard_normal((3, 2, 3, 3)).astype(np.float32),
        rng.standard_normal(3).astype(np.float32)))
    assert tp.gradcheck(lambda x, w, b: tp.conv2d(x, w, b, relu=True), [x, w, b])


@pytest.mark.parametrize("layer", ["Linear", "Conv2d"])
def test_a_hooked_layer_and_relu_in_a_sequential_run_their_hooks_as_pytorch(queue, layer):
    """Sequential fused a Linear or Conv2d and the ReLU after it even where they held hooks:
    the layer's forward hook saw the ReLU's output (its minimum 0 where PyTorch's is the
    layer's negative minimum), a hook's replacement of the layer's output skipped the ReLU
    (-relu(z), negative, where PyTorch gives relu(-z)), and the ReLU's hooks never ran. A
    hooked pair now runs one by one, as PyTorch calls each module."""
    import torch
    make = {"Linear": lambda lib: lib.Linear(3, 4), "Conv2d": lambda lib: lib.Conv2d(2, 3, 2)}
    shape = (5, 3) if layer == "Linear" else (2, 2, 4, 4)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    pc.nn.manual_seed(0)
    model = pc.nn.Sequential(make[layer](pc.nn), pc.nn.ReLU())
    tmodel = torch.nn.Sequential(make[layer](torch.nn), torch.nn.ReLU())
    tmodel.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict().items()})
    for seq, host in [(model, lambda t: t.to_host()), (tmodel, lambda t: t.detach().numpy())]:
        seq.seen = []
        seq[0].register_forward_hook(lambda m, args, out, seq=seq, host=host: (
            seq.seen.append(("layer", float(host(out).min()))), -out)[1])
        seq[1].register_forward_pre_hook(lambda m, args, seq=seq: seq.seen.append(("relu",)))
    xn = tp.tensor(pc.Tensor.from_host(queue, x), True)
    xt = torch.from_numpy(x).requires_grad_()
    got, want = model(xn), tmodel(xt)
    assert model.seen[0][0] == "layer" and model.seen[0][1] < 0
    np.testing.assert_allclose(model.seen[0][1], tmodel.seen[0][1], rtol=1e-5)
    assert [s[0] for s in model.seen] == [s[0] for s in tmodel.seen] == ["layer", "relu"]
    np.testing.assert_allclose(got.to_host(), want.detach().numpy(), rtol=1e-5, atol=1e-6)
    tp.sum(got).backward()
    want.sum().backward()
    np.testing.assert_allclose(xn.grad.to_host(), xt.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_hooks_in_a_resnet_block_see_what_torchvisions_show_them(queue):
    """BasicBlock ran relu(bn2(conv2(out)) + identity) as one op even where hooks were
    registered: a forward hook keeping the downsample's output kept a tensor the fused op
    then overwrote with the block's output (2.31 off the downsample's own), bn2's hook saw
    the ReLU's output (minimum 0) and relu's ran once where torchvision calls it twice. A
    hooked tail now runs as torchvision's: bn2, the sum, relu."""
    import torch
    from torch import nn as tnn

    class TorchBlock(tnn.Module):                         # torchvision's BasicBlock
        def __init__(self):
            super().__init__()
            self.conv1 = tnn.Conv2d(2, 4, 3, 2, 1, bias=False)
            self.bn1, self.relu = tnn.BatchNorm2d(4), tnn.ReLU(inplace=True)
            self.conv2 = tnn.Conv2d(4, 4, 3, 1, 1, bias=False)
            self.bn2 = tnn.BatchNorm2d(4)
            self.downsample = tnn.Sequential(tnn.Conv2d(2, 4, 1, 2, bias=False),
                                             tnn.BatchNorm2d(4))

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + self.downsample(x))

    pc.nn.manual_seed(0)
    block, tblock = pc.nn.BasicBlock(2, 4, stride=2, queue=queue), TorchBlock()
    tblock.load_state_dict({k: torch.from_numpy(v) for k, v in block.state_dict().items()},
                           strict=False)
    x = np.random.default_rng(0).standard_normal((2, 2, 6, 6)).astype(np.float32)
    for b in (block, tblock):
        b.kept, b.relu_calls = {}, []
        b.downsample.register_forward_hook(lambda m, a, out, b=b: b.kept.update(ds=out))
        b.bn2.register_forward_hook(lambda m, a, out, b=b: b.kept.update(bn2=out))
        b.relu.register_forward_hook(lambda m, a, out, b=b: b.relu_calls.append(1))
    xn = tp.tensor(pc.Tensor.from_host(queue, x), True)
    xt = torch.from_numpy(x).requires_grad_()
    got, want = block(xn), tblock(xt)
    assert len(block.relu_calls) == len(tblock.relu_calls) == 2
    for name in ("ds", "bn2"):
        np.testing.assert_allclose(block.kept[name].to_host(),
                                   tblock.kept[name].detach().numpy(), rtol=1e-4, atol=1e-5)
    assert block.kept["bn2"].to_host().min() < 0
    np.testing.assert_allclose(got.to_host(), want.detach().numpy(), rtol=1e-4, atol=1e-5)
    tp.sum(got).backward()
    want.sum().backward()
    np.testing.assert_allclose(xn.grad.to_host(), xt.grad.numpy(), rtol=1e-4, atol=1e-5)
