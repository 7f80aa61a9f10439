"""Random tensors (rand, randn, randint, randperm, their _like forms, normal, bernoulli,
multinomial, and Node.normal_/uniform_/bernoulli_): their distributions tested statistically
with fixed seeds, shapes and dtypes as torch's, determinism for a seed, the zero gradients
torch gives, fresh draws in every replay of a captured step, and the errors naming the op."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from parcl.errors import DTypeError, ParclError, ShapeError

N = 200_000          # draws per statistic: the mean of U(0, 1) to about +-0.002 (3 sigma)


@pytest.fixture(autouse=True)
def seeded(queue):
    tp.manual_seed(1234)


def test_rand_is_uniform_on_zero_one_as_pytorch(queue):
    u = tp.rand(N)
    assert isinstance(u, tp.Node) and u.dtype == np.float32 and u.shape == (N,)
    a = u.to_host()
    assert a.min() >= 0.0 and a.max() < 1.0
    assert abs(a.mean() - 0.5) < 0.003 and abs(a.var() - 1 / 12) < 0.001
    counts = np.histogram(a, bins=10, range=(0, 1))[0] / N
    np.testing.assert_allclose(counts, 0.1, atol=0.003)


def test_randn_is_standard_normal_as_pytorch(queue):
    z = tp.randn(N).to_host()
    assert abs(z.mean()) < 0.01 and abs(z.var() - 1) < 0.015
    assert abs(np.mean(np.abs(z) < 1) - 0.6827) < 0.005
    assert abs(np.mean(np.abs(z) < 2) - 0.9545) < 0.003
    assert abs(np.mean(z ** 4) - 3) < 0.1                       # kurtosis of a normal


def test_random_factories_take_sizes_dtype_queue_and_requires_grad_as_pytorch(queue, queues2):
    for fn in (tp.rand, tp.randn):
        for x in (fn(2, 3), fn((2, 3)), fn(size=[2, 3])):
            assert x.shape == (2, 3) and x.dtype == np.float32
        assert fn(()).shape == () and fn(0, 2).shape == (0, 2)
        assert fn(3, queue=queues2[1]).queue is queues2[1]
        assert fn(3, requires_grad=True).requires_grad
        with pytest.raises(DTypeError, match=f"{fn.__name__}: draws float32 values"):
            fn(3, dtype=np.int64)
    like = tp.zeros(4, 5, queue=queues2[1])
    for fn in (tp.rand_like, tp.randn_like):
        x = fn(like)
        assert x.shape == (4, 5) and x.queue is queues2[1] and x.dtype == np.float32
    assert tp.randint_like(like, 7).dtype == np.float32          # input's dtype, as torch's
    assert tp.randint_like(tp.arange(6), 7).dtype == np.int64


def test_a_seed_gives_the_same_draws_and_each_call_new_ones(queue):
    tp.manual_seed(7)
    first = [tp.rand(5).to_host(), tp.randn(5).to_host(), tp.randint(100, (5,)).to_host()]
    assert not np.array_equal(tp.rand(5).to_host(), first[0])      # the next call: new values
    tp.manual_seed(7)
    again = [tp.rand(5).to_host(), tp.randn(5).to_host(), tp.randint(100, (5,)).to_host()]
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    pc.manual_seed(7)                                               # seeds the same generator
    np.testing.assert_array_equal(tp.rand(5).to_host(), first[0])
    state = tp.rng_state()
    ahead = tp.randn(3).to_host()
    tp.set_rng_state(state)
    np.testing.assert_array_equal(tp.randn(3).to_host(), ahead)


def test_randint_is_uniform_on_its_range_and_int64_as_pytorch(queue):
    r = tp.randint(3, 10, (N,))
    assert r.dtype == np.int64 and r.dtype == torch.randint(3, 10, (2,)).numpy().dtype
    a = r.to_host()
    assert a.min() == 3 and a.max() == 9
    np.testing.assert_allclose(np.bincount(a - 3) / N, 1 / 7, atol=0.004)
    assert tp.randint(5, (2, 2)).to_host().max() < 5                # randint(high, size)
    assert tp.randint(-2, 2, size=(8,), dtype=np.int32).dtype == np.int32
    big = tp.randint(0, 2**40, (1000,)).to_host()
    assert big.min() >= 0 and big.max() < 2**40 and big.max() > 2**39
    with pytest.raises(ShapeError, match="randint: random_ expects 'from' to be less than 'to', "
                                         "but got from=5 >= to=3"):
        tp.randint(5, 3, (2,))
    with pytest.raises(TypeError, match="randint: expected"):
        tp.randint(5)


@pytest.mark.parametrize("n", [0, 1, 7, 1000, 5000])
def test_randperm_is_a_permutation_as_pytorch(queue, n):
    p = tp.randperm(n)
    assert p.dtype == np.int64 and p.shape == (n,)
    np.testing.assert_array_equal(np.sort(p.to_host()), np.arange(n))


def test_randperm_draws_every_order_equally_often(queue):
    counts = dict.fromkeys(itertools.permutations(range(3)), 0)
    for _ in range(1200):
        counts[tuple(tp.randperm(3).to_host())] += 1
    assert all(140 < c < 260 for c in counts.values()), counts      # 200 each, +-4 sigma


def test_normal_takes_numbers_or_tensors_and_broadcasts_as_pytorch(queue):
    x = tp.normal(2.0, 3.0, (N,))
    assert x.shape == (N,) and x.dtype == np.float32
    a = x.to_host()
    assert abs(a.mean() - 2) < 0.03 and abs(a.std() - 3) < 0.03
    mean = tp.tensor(np.array([[-5.0], [5.0]], np.float32))
    std = tp.tensor(np.array([0.0, 1.0, 2.0], np.float32))
    got = tp.normal(mean, std)
    assert got.shape == tuple(torch.normal(torch.zeros(2, 1), torch.ones(3)).shape) == (2, 3)
    np.testing.assert_array_equal(got.to_host()[:, 0], [-5.0, 5.0])     # std 0: the mean
    wide = tp.normal(tp.full((N,), 1.0), 0.5).to_host()
    assert abs(wide.mean() - 1) < 0.005 and abs(wide.std() - 0.5) < 0.005
    narrow = tp.normal(-1.0, tp.full((N,), 2.0)).to_host()
    assert abs(narrow.mean() + 1) < 0.02 and abs(narrow.std() - 2) < 0.02


def test_normal_and_bernoulli_give_zero_gradients_as_pytorch(queue):
    mean = tp.tensor(np.zeros(3, np.float32), requires_grad=True)
    std = tp.tensor(np.ones(3, np.float32), requires_grad=True)
    p = tp.tensor(np.full(3, 0.5, np.float32), requires_grad=True)
    with tp.Tape() as tape:
        loss = tp.sum(tp.normal(mean, std) * 3 + tp.bernoulli(p))
    tape.backward(loss)
    tm, ts, tpp = (torch.tensor(v, requires_grad=True) for v in ([0.0] * 3, [1.0] * 3, [0.5] * 3))
    (torch.normal(tm, ts) * 3 + torch.bernoulli(tpp)).sum().backward()
    for ours, theirs in ((mean, tm), (std, ts), (p, tpp)):
        np.testing.assert_array_equal(ours.grad.to_host(), theirs.grad.numpy())   # zeros

    def draw(q):
        tp.manual_seed(0)                    # the same trials at every finite difference
        return tp.bernoulli(q)
    away = tp.tensor(np.array([0.2, 0.45, 0.9], np.float32), requires_grad=True)
    assert tp.gradcheck(draw, [away])


def test_normal_refuses_a_negative_std_naming_it_as_pytorch(queue):
    with pytest.raises(ShapeError, match="normal: expects std >= 0.0, got -1"):
        tp.normal(0.0, -1.0, (2,))
    out = tp.normal(tp.zeros(3), tp.tensor(np.array([1.0, -1.0, 1.0], np.float32)))
    with pytest.raises(ShapeError, match=r"normal: expects all elements of std >= 0.0.*element "
                                         r"\(1,\) of shape \(3,\)"):
        out.to_host()
    with pytest.raises(TypeError, match="normal: a mean and std that are both numbers need a "
                                        "size"):
        tp.normal(0.0, 1.0)


def test_bernoulli_draws_ones_with_each_elements_probability_as_pytorch(queue):
    probs = np.tile(np.array([0.0, 0.1, 0.5, 0.9, 1.0], np.float32), (N // 5, 1))
    b = tp.bernoulli(tp.tensor(probs))
    assert b.shape == probs.shape and b.dtype == np.float32
    a = b.to_host()
    assert set(np.unique(a)) <= {0.0, 1.0}
    np.testing.assert_allclose(a.mean(axis=0), [0.0, 0.1, 0.5, 0.9, 1.0], atol=0.008)
    assert a[:, 0].max() == 0.0 and a[:, 4].min() == 1.0
    constant = tp.bernoulli(tp.zeros(N), 0.3).to_host()          # torch.bernoulli(input, p)
    assert abs(constant.mean() - 0.3) < 0.004
    assert tp.bernoulli(tp.zeros(2, requires_grad=True), 0.5).requires_grad is False   # torch:
    # "derivative for aten::bernoulli is not implemented"
    with pytest.raises(ShapeError, match="bernoulli: expects 0 <= p <= 1, got 2"):
        tp.bernoulli(tp.zeros(2), 2)
    with pytest.raises(ShapeError, match=r"bernoulli: expects 0 <= p <= 1.*element \(1,\)"):
        tp.bernoulli(tp.tensor(np.array([0.5, 1.5], np.float32))).to_host()
    with pytest.raises(DTypeError, match="bernoulli: input"):
        tp.bernoulli(tp.arange(3))


def test_multinomial_without_replacement_draws_distinct_categories_in_draw_order(queue):
    weights = np.array([5.0, 3.0, 2.0, 0.0], np.float32)           # not normalised, as torch
    rows = 60_000
    s = tp.multinomial(tp.tensor(np.tile(weights, (rows, 1))), 3)
    assert s.dtype == np.int64 and s.shape == (rows, 3)
    a = s.to_host()
    assert all(len(set(r)) == 3 for r in a[:1000]) and (a != 3).all()     # distinct, p > 0
    np.testing.assert_allclose(np.bincount(a[:, 0], minlength=4) / rows, [0.5, 0.3, 0.2, 0],
                               atol=0.01)
    # the second draw, sequentially without replacement: sum over first i of p_i p_j / (1 - p_i)
    p = weights / weights.sum()
    second = [sum(p[i] * p[j] / (1 - p[i]) for i in range(3) if i != j) for j in range(4)]
    np.testing.assert_allclose(np.bincount(a[:, 1], minlength=4) / rows, second, atol=0.01)
    one = tp.multinomial(tp.tensor(weights), 2)
    assert one.shape == (2,) and len(set(one.to_host())) == 2


def test_multinomial_with_replacement_draws_each_category_by_its_weight(queue):
    weights = np.array([[1.0, 0.0, 3.0], [0.0, 2.0, 0.0]], np.float32)
    s = tp.multinomial(tp.tensor(weights), N // 2, replacement=True).to_host()
    assert s.shape == (2, N // 2)
    np.testing.assert_allclose(np.bincount(s[0], minlength=3) / (N // 2), [0.25, 0, 0.75],
                               atol=0.006)
    assert (s[1] == 1).all()


def test_multinomial_refuses_bad_weights_and_counts_as_pytorch(queue):
    with pytest.raises(ShapeError, match=r"multinomial: probability tensor contains either "
                                         r"inf, nan or element < 0: element \(1, 0\)"):
        tp.multinomial(tp.tensor(np.array([[1.0, 1.0], [-1.0, 2.0]], np.float32)), 1).to_host()
    with pytest.raises(ShapeError, match=r"sum of probabilities <= 0\) in row 0"):
        tp.multinomial(tp.zeros(1, 3), 1, replacement=True).to_host()
    with pytest.raises(ShapeError, match=r"cannot sample n_sample > prob_dist.size\(-1\) "
                                         r"samples without replacement \(4 > 3"):
        tp.multinomial(tp.ones(3), 4)
    with pytest.raises(ShapeError, match="prob_dist must be 1 or 2 dim"):
        tp.multinomial(tp.ones(2, 2, 2), 1)
    with pytest.raises(ShapeError, match="cannot sample n_sample <= 0"):
        tp.multinomial(tp.ones(3), 0)


def test_node_draws_in_place_under_no_grad_as_pytorch_init(queue):
    w = tp.zeros(N, requires_grad=True)
    with pytest.raises(ParclError, match="Node.normal_: a Node that requires grad"):
        w.normal_()
    with tp.no_grad():
        assert w.normal_(1.0, 2.0) is w
        a = w.to_host()
        assert abs(a.mean() - 1) < 0.02 and abs(a.std() - 2) < 0.02
        u = w.uniform_(-3, 1).to_host()
        assert u.min() >= -3 and u.max() < 1 and abs(u.mean() + 1) < 0.02
        b = w.bernoulli_(0.2).to_host()
        assert abs(b.mean() - 0.2) < 0.004
        w.bernoulli_(tp.full((1,), 0.7))                               # broadcast, as torch
        assert abs(w.to_host().mean() - 0.7) < 0.004
    with pytest.raises(ShapeError, match="uniform_: expects from <= to"):
        tp.zeros(2).uniform_(1, 0)


def test_a_captured_step_draws_fresh_values_in_every_replay_as_its_eager_calls(queue):
    def step(x):
        return (x + tp.rand(4).value + tp.randn(4).value
                + tp.bernoulli(tp.full((4,), 0.5)).value
                + tp.index_select(tp.arange(6.0).value, 0, tp.multinomial(tp.ones(6), 4).value))

    inputs = [np.full(4, i, np.float32) for i in range(4)]
    tp.manual_seed(3)
    eager = [step(pc.Tensor.from_host(queue, x)).to_host() for x in inputs]
    tp.manual_seed(3)
    captured = tp.capture(step, queue)
    replayed = [captured(x).to_host().copy() for x in inputs]
    assert captured.replays == 3
    for a, b in zip(eager, replayed):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(replayed[2] - 2, replayed[3] - 3)       # never the same draw


def test_checkpoint_recomputes_the_forwards_draws(queue):
    x = tp.tensor(np.ones(6, np.float32), requires_grad=True)
    with tp.Tape() as tape:
        y = tp.checkpoint(lambda v: v * tp.rand_like(v), x)
        loss = tp.sum(y)
    tape.backward(loss)
    np.testing.assert_array_equal(x.grad.to_host(), y.to_host())      # d(x * u)/dx = u


def test_randint_refuses_a_range_its_integer_dtype_cannot_hold_as_pytorch(queue):
    # int32 held the draws of [0, 2**40) wrapped: negative numbers such as -354950290
    with pytest.raises(RuntimeError, match="to - 1 is out of bounds for int"):
        torch.randint(0, 2**40, (4,), dtype=torch.int32)
    with pytest.raises(ShapeError, match=r"randint: the range \[0, 1099511627776\) does not "
                                         r"fit int32 \(shape \(4,\)\)"):
        tp.randint(0, 2**40, (4,), dtype=np.int32)
    with pytest.raises(ShapeError, match="randint: the range .* does not fit int32"):
        tp.randint(-2**31 - 1, 0, (4,), dtype=np.int32)
    with pytest.raises(ShapeError, match="randint_like: the range .* does not fit int32"):
        tp.randint_like(tp.zeros(5, dtype=np.int32), 2**33)
    edge = tp.randint(-2**31, 2**31, (1000,), dtype=np.int32).to_host()   # the whole range
    assert edge.min() < -2**30 and edge.max() > 2**30
    assert tp.randint_like(tp.zeros(5, dtype=np.int32), 2**31).dtype == np.int32


def test_uniform_refuses_bounds_whose_span_float32_cannot_hold_as_pytorch(queue):
    # the span to - from was inf: uniform_(-3e38, 3e38) gave [nan, inf, inf, ...]
    with pytest.raises(RuntimeError, match="uniform_ expects to-from <="):
        torch.zeros(3).uniform_(-3e38, 3e38)
    with pytest.raises(ShapeError, match=r"uniform_: expects to - from <= float32's max, got "
                                         r"from=-3e\+38 and to=3e\+38 \(tensor \(6,\)\)"):
        tp.zeros(6).uniform_(-3e38, 3e38)
    with pytest.raises(RuntimeError, match="to is out of bounds for float"):
        torch.zeros(3).uniform_(0, float("inf"))
    for bounds, name in (((0, float("inf")), "to"), ((float("-inf"), 0), "from"),
                         ((0, float("nan")), "to"), ((1e39, 1e39), "from")):
        with pytest.raises(ShapeError, match=f"uniform_: {name}=.* is out of bounds for float32"):
            tp.zeros(6).uniform_(*bounds)
    u = tp.zeros(1000).uniform_(-1e38, 2e38).to_host()              # the widest that fits
    assert np.isfinite(u).all() and u.min() >= -1e38 and u.max() < 2e38 and u.max() > 1e38


def test_bernoulli_in_place_refuses_integer_probabilities_as_pytorch(queue):
    # their bits were read as floats: bernoulli_ of int64 [0, 1, 1, 0, 1, 1] gave all zeros
    with pytest.raises(NotImplementedError, match="not implemented for 'Long'"):
        torch.zeros(6).bernoulli_(torch.tensor([0, 1, 1, 0, 1, 1]))
    for dtype in (np.int64, np.int32):
        p = tp.tensor(np.array([0, 1, 1, 0, 1, 1], dtype))
        with pytest.raises(DTypeError, match=f"bernoulli_: p \\(6,\\) has dtype {np.dtype(dtype)}"
                                              r", expected float32 \(the tensor \(6,\)\)"):
            tp.zeros(6).bernoulli_(p)
    got = tp.zeros(6).bernoulli_(tp.tensor(np.array([0, 1, 1, 0, 1, 1], np.float32)))
    np.testing.assert_array_equal(got.to_host(), [0, 1, 1, 0, 1, 1])


def test_uniform_draws_stay_below_to_as_pytorch(queue):
    # low + span * u was rounded up onto to: uniform_(1, 1 + 2**-20) gave to in 6.3% of draws,
    # uniform_(2.9999, 3) gave 3.0 in 0.2%; torch's never reach it
    hi = float(np.float32(1 + 2**-20))
    assert torch.empty(100_000).uniform_(1, hi).max().item() < hi
    u = tp.zeros(100_000).uniform_(1, hi).to_host()
    assert u.min() == 1.0 and u.max() == np.nextafter(np.float32(hi), np.float32(0))
    assert tp.zeros(100_000).uniform_(2.9999, 3.0).to_host().max() < 3.0
    assert torch.empty(3).uniform_(1.5, 1.5).eq(1.5).all()
    np.testing.assert_array_equal(tp.zeros(3).uniform_(1.5, 1.5).to_host(), 1.5)
