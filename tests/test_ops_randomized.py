"""``tp.rrelu`` / ``nn.RReLU`` and ``tp.gumbel_softmax``: PyTorch's values and defaults (the
functional rrelu's ``training=False``, the mean slope in evaluation, the straight-through hard
sample), draws from the seeded dropout generator that a captured step's replays and
``tp.checkpoint``'s recomputation draw as the eager calls do, gradients against torch and
finite differences, and refusals naming the op."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import parcl as pc
import parcl.tape as tp
from conftest import close, leaf
from parcl.kernels import draws
from parcl.kernels.random import mask_key


def test_rrelu_while_training_draws_a_slope_in_bounds_for_each_negative_element(queue, rng):
    x0 = rng.standard_normal((100, 100)).astype(np.float32)
    x = leaf(queue, x0)
    tp.manual_seed(0)
    with tp.Tape() as tape:
        y = tp.rrelu(x, 0.1, 0.4, training=True)
    tape.backward(tp.sum(y))
    got, grad = y.to_host(), x.grad.to_host()
    neg = x0 <= 0
    np.testing.assert_array_equal(got[~neg], x0[~neg])
    np.testing.assert_array_equal(grad[~neg], 1.0)
    slopes = got[neg] / x0[neg]
    assert slopes.min() >= 0.1 and slopes.max() <= 0.4
    assert abs(slopes.mean() - 0.25) < 0.01 and abs(slopes.std() - 0.3 / 12 ** 0.5) < 0.01
    close(grad[neg], slopes, 1e-5)                     # the gradient is the element's slope


def test_rrelu_slopes_follow_the_seeded_generator_and_evaluation_uses_the_mean(queue, rng):
    x0 = -np.abs(rng.standard_normal(64)).astype(np.float32)
    x = tp.tensor(x0)
    tp.manual_seed(5)
    first, second = (tp.rrelu(x, training=True).to_host() for _ in range(2))
    tp.manual_seed(5)
    np.testing.assert_array_equal(pc.nn.RReLU()(x).to_host(), first)     # same seed, same
    assert not np.array_equal(first, second)                            # each call new ones
    want = F.rrelu(torch.tensor(x0))                       # PyTorch's default training=False
    np.testing.assert_array_equal(tp.rrelu(x).to_host(), want.numpy())
    np.testing.assert_array_equal(pc.nn.RReLU().eval()(x).to_host(),
                                  torch.nn.RReLU().eval()(torch.tensor(x0)).numpy())
    assert repr(pc.nn.RReLU(0.1, 0.2)) == repr(torch.nn.RReLU(0.1, 0.2))


def test_rrelu_gradient_matches_finite_differences(queue, rng):
    x = leaf(queue, rng.standard_normal((4, 5)))

    def seeded(v):
        tp.manual_seed(1)
        return tp.rrelu(v, training=True)
    assert tp.gradcheck(seeded, [x])
    assert tp.gradcheck(lambda v: tp.rrelu(v, 0.2, 0.6), [x])          # evaluation


def test_rrelu_in_a_captured_step_draws_new_slopes_on_each_replay_as_eager_calls(queue, rng):
    x0 = -np.abs(rng.standard_normal((8, 8))).astype(np.float32)

    def run(captured):
        w = leaf(queue, np.ones((8, 8)))
        w.grad = pc.Tensor.zeros(queue, w.shape)      # a persistent buffer: calls accumulate

        def body(x):
            with tp.Tape() as tape:
                y = tp.rrelu(tp.mul(x, w), training=True)
            tape.backward(tp.sum(y))
            return y.value
        tp.manual_seed(9)
        step = tp.capture(body, queue) if captured else None
        outs = [(step(x0) if captured else body(pc.Tensor.from_host(queue, x0))).to_host()
                for _ in range(3)]
        return outs, w.grad.to_host(), step
    eager, eager_grad, _ = run(False)
    replayed, grad, step = run(True)
    assert step.replays == 2
    for y, want in zip(replayed, eager):
        np.testing.assert_array_equal(y, want)
    assert not np.array_equal(eager[0], eager[1])
    np.testing.assert_array_equal(grad, eager_grad)
    # each call's gradient is its own slopes times x: the replays' backwards read theirs
    close(grad, sum(y / x0 for y in eager) * x0, 1e-5)


def test_rrelu_under_checkpoint_recomputes_the_forwards_slopes(queue, rng):
    x0 = rng.standard_normal((6, 6)).astype(np.float32)
    grads = []
    for wrap in (lambda f, v: f(v), lambda f, v: tp.checkpoint(f, v)):
        x = leaf(queue, x0)
        tp.manual_seed(2)
        with tp.Tape() as tape:
            y = wrap(lambda v: tp.rrelu(v * 1.0, training=True), x)
        tape.backward(tp.sum(y))
        grads.append(x.grad.to_host())
    np.testing.assert_array_equal(grads[0], grads[1])


def gumbel_noise(queue, shape):
    """The noise the next draw of this thread's generator gives (the kernel, by hand)."""
    seed, counter = tp.rng_state()
    return draws.gumbel(queue, shape, lambda: np.uint64(mask_key(seed, counter))).to_host()


@pytest.mark.parametrize("tau,dim", [(1.0, -1), (0.5, 0), (2.0, 1)])
def test_gumbel_softmax_is_a_softmax_of_logits_plus_gumbel_noise_as_pytorch(queue, rng, tau,
                                                                            dim):
    logits0 = rng.standard_normal((3, 5)).astype(np.float32)
    g = rng.standard_normal((3, 5)).astype(np.float32)
    tp.manual_seed(4)
    noise = gumbel_noise(queue, logits0.shape)
    logits = leaf(queue, logits0)
    with tp.Tape() as tape:
        y = tp.gumbel_softmax(logits, tau=tau, dim=dim)
    tape.backward(tp.sum(tp.mul(y, tp.tensor(g))))
    t = torch.tensor(logits0, dtype=torch.float64, requires_grad=True)
    want = torch.softmax((t + torch.tensor(noise, dtype=torch.float64)) / tau, dim)
    (want * torch.tensor(g, dtype=torch.float64)).sum().backward()
    close(y.to_host(), want.detach().numpy())
    close(logits.grad.to_host(), t.grad.numpy())

    def seeded(v):
        tp.manual_seed(4)
        return tp.gumbel_softmax(v, tau=tau, dim=dim)
    assert tp.gradcheck(seeded, [logits])


def test_gumbel_softmax_hard_is_one_hot_with_the_soft_gradient_as_pytorch(queue, rng):
    logits0 = rng.standard_normal((4, 6)).astype(np.float32)
    g = rng.standard_normal((4, 6)).astype(np.float32)
    grads, outs = [], []
    for hard in (False, True):
        logits = leaf(queue, logits0)
        tp.manual_seed(8)
        with tp.Tape() as tape:
            y = tp.gumbel_softmax(logits, tau=0.7, hard=hard)
        tape.backward(tp.sum(tp.mul(y, tp.tensor(g))))
        grads.append(logits.grad.to_host())
        outs.append(y.to_host())
    soft, hard = outs
    np.testing.assert_array_equal(hard, np.eye(6, dtype=np.float32)[soft.argmax(1)])
    close(grads[1], grads[0], 1e-6)                     # straight-through: the soft gradient


def test_gumbel_softmax_samples_its_categories_with_the_softmax_probabilities(queue):
    probs = np.array([0.1, 0.2, 0.7], np.float32)
    tp.manual_seed(0)
    y = tp.gumbel_softmax(tp.tensor(np.log(np.tile(probs, (20000, 1)))), hard=True)
    np.testing.assert_allclose(y.to_host().mean(0), probs, atol=0.01)
    tp.manual_seed(0)
    again = tp.gumbel_softmax(tp.tensor(np.log(np.tile(probs, (20000, 1)))), hard=True)
    np.testing.assert_array_equal(again.to_host(), y.to_host())       # the seed's samples


def test_gumbel_softmax_in_a_captured_step_draws_new_noise_on_each_replay(queue, rng):
    logits = rng.standard_normal((4, 5)).astype(np.float32)
    runs = []
    for captured in (False, True):
        tp.manual_seed(3)
        step = tp.capture(lambda v: tp.gumbel_softmax(v, hard=True), queue)
        runs.append([(step(logits) if captured else
                      tp.gumbel_softmax(tp.tensor(logits), hard=True)).to_host()
                     for _ in range(4)])
    assert step.replays == 3
    np.testing.assert_array_equal(np.array(runs[1]), np.array(runs[0]))
    assert len({a.tobytes() for a in runs[0]}) > 1


def test_rrelu_and_gumbel_softmax_refuse_bad_arguments_naming_the_op(queue):
    x = tp.tensor(np.ones((2, 3), np.float32))
    with pytest.raises(pc.ParclError, match="rrelu: lower bound must be less than or equal "
                                            "to upper bound, got lower=0.5, upper=0.1"):
        tp.rrelu(x, 0.5, 0.1, training=True)
    with pytest.raises(pc.ParclError, match="rrelu: inplace=True is not supported"):
        tp.rrelu(x, inplace=True)
    with pytest.raises(pc.ParclError, match="RReLU: inplace=True is not supported"):
        pc.nn.RReLU(inplace=True)
    with pytest.raises(pc.ParclError, match="gumbel_softmax: tau must be positive, got 0"):
        tp.gumbel_softmax(x, tau=0)
    with pytest.raises(pc.ShapeError, match="gumbel_softmax"):
        tp.gumbel_softmax(x, dim=2)
    with pytest.warns(DeprecationWarning, match="gumbel_softmax: `eps` parameter is "
                                                "deprecated"):
        tp.gumbel_softmax(x, eps=1e-5)


@pytest.mark.parametrize("kernel_size,size", [((2, 2), {"output_size": (4, 5)}),
                                              ((3, 2), {"output_ratio": (0.5, 0.6)}),
                                              (2, {"output_size": 1})])
def test_fractional_max_pool2d_with_given_samples_is_pytorchs(queue, rng, kernel_size, size):
    x0 = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    x0[0, 0, :2, :2] = 5.0                                   # a tie: the first wins
    samples = rng.random((2, 3, 2)).astype(np.float32)
    g = rng.standard_normal((2, 3) + F.fractional_max_pool2d(
        torch.tensor(x0), kernel_size, _random_samples=torch.tensor(samples),
        **size).shape[2:]).astype(np.float32)
    x = leaf(queue, x0)
    with tp.Tape() as tape:
        y, at = tp.fractional_max_pool2d(x, kernel_size, return_indices=True,
                                         _random_samples=samples, **size)
    tape.backward(tp.sum(tp.mul(y, tp.tensor(g))))
    tx = torch.tensor(x0, requires_grad=True)
    want, want_at = F.fractional_max_pool2d(tx, kernel_size, return_indices=True,
                                            _random_samples=torch.tensor(samples), **size)
    (want * torch.tensor(g)).sum().backward()
    np.testing.assert_array_equal(y.to_host(), want.detach().numpy())
    np.testing.assert_array_equal(at.to_host(), want_at.numpy())
    close(x.grad.to_host(), tx.grad.numpy(), 1e-6)


def test_fractional_max_pool2d_draws_its_windows_from_the_seeded_generator(queue, rng):
    x0 = rng.standard_normal((2, 4, 13, 13)).astype(np.float32)     # windows 2.2 apart
    x = tp.tensor(x0)
    pool = pc.nn.FractionalMaxPool2d(2, output_ratio=0.5, return_indices=True)
    tp.manual_seed(6)
    seed, counter = tp.rng_state()
    first, at = pool(x)
    key = np.uint64(mask_key(seed, counter))
    samples = draws.open_uniform(queue, (2, 4, 2), lambda: key).to_host()
    want = F.fractional_max_pool2d(torch.tensor(x0), 2, output_ratio=(0.5, 0.5),
                                   _random_samples=torch.tensor(samples))
    np.testing.assert_array_equal(first.to_host(), want.numpy())
    second, at2 = pool(x)
    assert not np.array_equal(at.to_host(), at2.to_host())        # new windows each call
    tp.manual_seed(6)
    np.testing.assert_array_equal(pool(x)[0].to_host(), first.to_host())
    single = tp.fractional_max_pool2d(tp.tensor(x0[0]), 3, output_size=5)    # unbatched
    assert single.shape == (4, 5, 5)
    assert tp.gradcheck(lambda v: tp.fractional_max_pool2d(v, 2, output_size=3,
                                                           _random_samples=samples[:1, :1]),
                        [leaf(queue, x0[:1, :1, :6, :6])])


def test_fractional_max_pool2d_in_a_captured_step_draws_new_windows_on_each_replay(queue, rng):
    x0 = rng.standard_normal((1, 2, 10, 10)).astype(np.float32)
    runs = []
    for captured in (False, True):
        tp.manual_seed(1)
        step = tp.capture(lambda v: tp.fractional_max_pool2d(v, 2, output_size=4), queue)
        runs.append([(step(x0) if captured else
                      tp.fractional_max_pool2d(tp.tensor(x0), 2, output_size=4)).to_host()
                     for _ in range(3)])
    assert step.replays == 2
    np.testing.assert_array_equal(np.array(runs[1]), np.array(runs[0]))
    assert not np.array_equal(runs[0][0], runs[0][1])


def test_fractional_max_pool2d_refuses_what_pytorch_refuses(queue):
    x = tp.tensor(np.ones((1, 1, 4, 4), np.float32))
    with pytest.raises(pc.ParclError, match="FractionalMaxPool2d requires specifying either"):
        pc.nn.FractionalMaxPool2d(2)
    with pytest.raises(pc.ParclError, match="only one of output_size and output_ratio"):
        pc.nn.FractionalMaxPool2d(2, output_size=2, output_ratio=0.5)
    with pytest.raises(pc.ParclError, match="output_ratio must be between 0 and 1"):
        pc.nn.FractionalMaxPool2d(2, output_ratio=1.5)
    with pytest.raises(pc.ShapeError, match=r"fractional_max_pool2d: pool height 2 too large "
                                            r"relative to input height 4"):
        tp.fractional_max_pool2d(x, 2, output_size=4)
    with pytest.raises(pc.ShapeError, match=r"_random_samples must have shape \(1, 1, 2\)"):
        tp.fractional_max_pool2d(x, 2, output_size=2, _random_samples=np.zeros((1, 2, 2)))


def test_fractional_max_pool2d_keeps_given_samples_in_its_state_dict_as_pytorch(queue, rng):
    """``FractionalMaxPool2d(..., _random_samples=t)`` kept the samples as a plain attribute,
    so its state dict was ``[]`` where PyTorch's is ``['_random_samples']`` (a buffer): a
    PyTorch checkpoint's samples were an unexpected key, and a parcl one lost the windows.
    They are a buffer now; loading other samples moves the windows, as PyTorch's."""
    x0 = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    first, second = (rng.random((2, 3, 2)).astype(np.float32) for _ in range(2))
    pool = pc.nn.FractionalMaxPool2d(2, output_size=3,
                                     _random_samples=pc.Tensor.from_host(queue, first))
    tpool = torch.nn.FractionalMaxPool2d(2, output_size=3,
                                         _random_samples=torch.tensor(first))
    assert list(pool.state_dict()) == list(tpool.state_dict()) == ["_random_samples"]
    np.testing.assert_array_equal(pool.state_dict()["_random_samples"], first)
    tpool.load_state_dict({"_random_samples": torch.tensor(second)})
    pool.load_state_dict({k: v.numpy() for k, v in tpool.state_dict().items()})
    got = pool(pc.Tensor.from_host(queue, x0)).to_host()
    np.testing.assert_array_equal(got, tpool(torch.tensor(x0)).numpy())
    assert list(pc.nn.FractionalMaxPool2d(2, output_size=3).state_dict()) == []
