"""``pc.nn.init``: PyTorch's initialisers, in place, from parcl's seeded generator.

The random streams are numpy's, not PyTorch's, so draws are compared by what PyTorch's
documentation promises: the same bounds, the same standard deviation (from a large sample,
against PyTorch's own sample of the same shape), the same exact values where nothing is
random (eye_, dirac_, constants), the same structure (orthogonality, zeros per column)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from parcl.replica import ReplicaGroup

init = pc.nn.init
SHAPE = (96, 64, 3, 3)       # fan_in 576, fan_out 864: ~55,000 draws


def weight(queue, shape=SHAPE):
    return pc.nn.Parameter.from_host(queue, np.full(shape, 7.0, np.float32))


def torch_sample(fn, shape=SHAPE, **kw):
    torch.manual_seed(0)
    return fn(torch.empty(shape), **kw).numpy()


@pytest.mark.parametrize("name,param", [
    ("linear", None), ("conv2d", None), ("conv_transpose3d", None), ("sigmoid", None),
    ("tanh", None), ("relu", None), ("leaky_relu", None), ("leaky_relu", 0.2),
    ("leaky_relu", 1), ("selu", None)])
def test_calculate_gain_is_pytorchs(name, param):
    assert init.calculate_gain(name, param) == pytest.approx(
        torch.nn.init.calculate_gain(name, param), rel=1e-12)


def test_unknown_nonlinearities_and_slopes_are_refused_as_pytorch():
    with pytest.raises(init.InitError, match="unsupported nonlinearity 'swish'"):
        init.calculate_gain("swish")
    with pytest.raises(ValueError, match="negative_slope True"):
        init.calculate_gain("leaky_relu", True)


@pytest.mark.parametrize("name,kw", [
    ("xavier_uniform_", {}), ("xavier_uniform_", {"gain": 2.0}), ("xavier_normal_", {}),
    ("kaiming_uniform_", {}), ("kaiming_uniform_", {"a": math.sqrt(5)}),
    ("kaiming_uniform_", {"mode": "fan_out", "nonlinearity": "relu"}),
    ("kaiming_normal_", {}), ("kaiming_normal_", {"mode": "fan_out", "nonlinearity": "relu"}),
    ("kaiming_normal_", {"nonlinearity": "tanh"}), ("uniform_", {"a": -3.0, "b": 1.0}),
    ("normal_", {"mean": 2.0, "std": 0.5}), ("trunc_normal_", {"std": 0.02, "a": -0.03, "b": 0.05}),
])
def test_each_draw_has_pytorchs_bounds_and_spread(queue, name, kw):
    w = weight(queue)
    assert getattr(init, name)(w, **kw) is w
    got = w.value.to_host().astype(np.float64)
    want = torch_sample(getattr(torch.nn.init, name), **kw).astype(np.float64)
    assert got.std() == pytest.approx(want.std(), rel=0.02)
    assert got.mean() == pytest.approx(want.mean(), abs=0.02 * want.std())
    if "uniform" in name or "trunc" in name:
        # the same bounded support: ~55,000 draws come within 1 % of each bound
        assert got.min() == pytest.approx(want.min(), abs=0.01 * want.std())
        assert got.max() == pytest.approx(want.max(), abs=0.01 * want.std())


def test_fans_count_the_receptive_field_as_pytorch(queue):
    """A conv weight (out, in, kh, kw): fan_in = in·kh·kw, fan_out = out·kh·kw."""
    w = weight(queue, (8, 4, 5, 5))
    init.kaiming_uniform_(w, mode="fan_out", nonlinearity="relu")
    bound = math.sqrt(2.0) * math.sqrt(3.0 / (8 * 25))
    got = np.abs(w.value.to_host())
    assert got.max() <= np.float32(bound) and got.max() > 0.95 * bound


def test_trunc_normal_stays_within_its_bounds_even_far_in_a_tail(queue):
    w = weight(queue, (4000,))
    init.trunc_normal_(w, mean=0.0, std=1.0, a=3.0, b=3.5)
    got = w.value.to_host()
    assert got.min() >= 3.0 and got.max() <= 3.5
    # the truncated normal's mean, (pdf(a) - pdf(b)) / (cdf(b) - cdf(a)) (PyTorch's own draw
    # warns that it may be off this far out)
    pdf = lambda v: math.exp(-v * v / 2) / math.sqrt(2 * math.pi)      # noqa: E731
    cdf = lambda v: (1 + math.erf(v / math.sqrt(2))) / 2                # noqa: E731
    assert got.mean() == pytest.approx((pdf(3.0) - pdf(3.5)) / (cdf(3.5) - cdf(3.0)), abs=0.01)


@pytest.mark.parametrize("a,b", [(7.0, 9.0), (-9.0, -7.0), (5.3, 12.0)])
def test_trunc_normal_far_in_a_tail_has_the_truncated_normals_moments_as_pytorch(queue, a, b):
    """Bounds past 5.4 standard deviations on one side: the inverse CDF through erf values
    within float64 steps of 1 put 24 % of the draws of [7, 9] on 7 and their mean at 7.086,
    where the truncated normal's (and PyTorch's sample's) is 7.138."""
    w = weight(queue, (40000,))
    init.trunc_normal_(w, mean=0.0, std=1.0, a=a, b=b, generator=np.random.default_rng(0))
    got = w.value.to_host().astype(np.float64)
    pdf = lambda v: math.exp(-v * v / 2) / math.sqrt(2 * math.pi)     # noqa: E731
    upper = lambda v: math.erfc(v / math.sqrt(2)) / 2                   # noqa: E731
    mass = upper(a) - upper(b) if a >= 0 else upper(-b) - upper(-a)
    mean = (pdf(a) - pdf(b)) / mass
    std = math.sqrt(1 + (a * pdf(a) - b * pdf(b)) / mass - mean ** 2)
    want = torch_sample(torch.nn.init.trunc_normal_, (40000,), a=a, b=b).astype(np.float64)
    assert got.min() >= a and got.max() <= b
    assert (got == np.float32(a)).mean() < 1e-3 and (got == np.float32(b)).mean() < 1e-3
    assert got.mean() == pytest.approx(mean, abs=3 * std / 200)
    assert got.std() == pytest.approx(std, rel=0.03)
    assert want.mean() == pytest.approx(mean, abs=3 * std / 200)


def test_constants_eye_and_dirac_are_pytorchs_values(queue):
    w = weight(queue, (3, 5))
    np.testing.assert_array_equal(init.eye_(w).value.to_host(), np.eye(3, 5))
    np.testing.assert_array_equal(init.constant_(w, 0.25).value.to_host(), np.full((3, 5), 0.25))
    np.testing.assert_array_equal(init.ones_(w).value.to_host(), np.ones((3, 5)))
    np.testing.assert_array_equal(init.zeros_(w).value.to_host(), np.zeros((3, 5)))
    for shape, groups in [((6, 4, 3, 3), 2), ((4, 6, 3), 1), ((4, 2, 3, 2, 5), 1)]:
        w = weight(queue, shape)
        init.dirac_(w, groups)
        want = torch.nn.init.dirac_(torch.full(shape, 7.0), groups).numpy()
        np.testing.assert_array_equal(w.value.to_host(), want)


def test_initialising_a_copy_of_a_parameter_is_refused_and_a_view_writes_it(queue):
    """PyTorch's ``zeros_(emb.weight[0])`` (a padding row) writes through the view into the
    weight; parcl's indexing, transpose and permute copy, so the write changed a temporary
    and the weight stayed as it was, silently. Now a ParclError naming the op; a reshape,
    which views the parameter's buffer, is written through as PyTorch's."""
    emb = pc.nn.Embedding(5, 3, queue=queue)
    before = emb.weight.value.to_host().copy()
    for name, part in [("zeros_", lambda w: w[0]), ("normal_", lambda w: w[1:3]),
                       ("xavier_uniform_", lambda w: w.T)]:
        with pytest.raises(pc.ParclError, match=rf"nn.init.{name}: the tensor is the output "
                                                r"of '(getitem|transpose)'"):
            getattr(init, name)(part(emb.weight))
    np.testing.assert_array_equal(emb.weight.value.to_host(), before)
    init.ones_(emb.weight.reshape(15))
    want = torch.nn.init.ones_(torch.from_numpy(before).reshape(15)).numpy()
    np.testing.assert_array_equal(emb.weight.value.to_host().reshape(15), want)


def test_a_dirac_convolution_passes_its_input_through(queue):
    x = np.random.default_rng(0).standard_normal((2, 3, 6, 6)).astype(np.float32)
    conv = pc.nn.Conv2d(3, 3, 3, padding=1, bias=False, queue=queue)
    init.dirac_(conv.weight)
    out = conv(pc.Tensor.from_host(queue, x))
    np.testing.assert_allclose(out.to_host(), x, atol=1e-6)


@pytest.mark.parametrize("shape", [(6, 10), (10, 6), (4, 3, 2, 2)])
def test_orthogonal_rows_or_columns_are_orthonormal_as_pytorch(queue, shape):
    w = weight(queue, shape)
    init.orthogonal_(w, gain=2.0)
    flat = w.value.to_host().reshape(shape[0], -1).astype(np.float64)
    want = torch_sample(torch.nn.init.orthogonal_, shape, gain=2.0).reshape(shape[0], -1)
    gram = flat @ flat.T if flat.shape[0] <= flat.shape[1] else flat.T @ flat
    np.testing.assert_allclose(gram, 4.0 * np.eye(min(flat.shape)), atol=1e-5)
    twin = want @ want.T if flat.shape[0] <= flat.shape[1] else want.T @ want
    np.testing.assert_allclose(twin, 4.0 * np.eye(min(flat.shape)), atol=1e-5)


def test_sparse_zeroes_as_many_elements_of_each_column_as_pytorch(queue):
    w = weight(queue, (10, 40))
    init.sparse_(w, sparsity=0.25, std=0.5)
    got = w.value.to_host()
    want = torch_sample(torch.nn.init.sparse_, (10, 40), sparsity=0.25, std=0.5)
    np.testing.assert_array_equal((got == 0).sum(axis=0), (want == 0).sum(axis=0))
    assert (got == 0).sum(axis=0).tolist() == [3] * 40


@pytest.mark.parametrize("fn,shape,match", [
    (init.xavier_uniform_, (5,), "fewer than 2 dimensions"),
    (init.kaiming_normal_, (5,), "fewer than 2 dimensions"),
    (init.eye_, (2, 2, 2), "only 2-D"),
    (init.dirac_, (3, 3), "3-, 4- or 5-D"),
    (init.orthogonal_, (4,), "2 or more dimensions"),
    (init.sparse_, (2, 2, 2), "only 2-D")])
def test_shapes_pytorch_refuses_are_a_shape_error_naming_the_initialiser(queue, fn, shape, match):
    w = weight(queue, shape)
    args = (0.5,) if fn is init.sparse_ else ()
    with pytest.raises(pc.ShapeError, match=match):
        fn(w, *args)
    np.testing.assert_array_equal(w.value.to_host(), np.full(shape, 7.0))   # untouched


def test_a_bad_mode_and_a_non_float_tensor_are_refused(queue):
    with pytest.raises(init.InitError, match="mode 'fan_avg'"):
        init.kaiming_uniform_(weight(queue, (3, 4)), mode="fan_avg")
    labels = pc.Tensor.from_host(queue, np.arange(4, dtype=np.int64))
    with pytest.raises(pc.DTypeError, match="only float32"):
        init.normal_(labels)


def test_draws_follow_the_seeded_generator_and_a_given_one(queue):
    """The thread's generator after ``pc.nn.manual_seed`` gives the same values every run; a
    ``generator=`` is used instead of it and leaves the thread's sequence where it was."""
    def draw(**kw):
        w = weight(queue, (16, 8))
        init.kaiming_normal_(w, **kw)
        return w.value.to_host()

    pc.nn.manual_seed(3)
    first, second = draw(), draw()
    pc.nn.manual_seed(3)
    np.testing.assert_array_equal(draw(), first)
    assert not np.array_equal(first, second)
    pc.nn.manual_seed(3)
    own = draw(generator=np.random.default_rng(9))
    np.testing.assert_array_equal(draw(), first)        # the thread's sequence untouched
    np.testing.assert_array_equal(draw(generator=np.random.default_rng(9)), own)


def test_a_recorded_backward_through_a_reinitialised_weight_raises(queue):
    """The write is an in-place change (as ``copy_``): a graph that saved the old weight is
    not backwarded with the new one."""
    lin = pc.nn.Linear(4, 3, queue=queue)
    x = tp.tensor(pc.Tensor.from_host(queue, np.ones((2, 4), np.float32)), requires_grad=True)
    with tp.Tape() as tape:
        loss = tp.sum(lin(x))
    init.zeros_(lin.weight)
    with pytest.raises(pc.ParclError, match="updated in place"):
        tape.backward(loss)


def build(queue):
    model = pc.nn.Sequential(pc.nn.Linear(6, 8, queue=queue), pc.nn.ReLU(),
                             pc.nn.Linear(8, 3, queue=queue))
    for layer in (model[0], model[2]):
        init.kaiming_normal_(layer.weight, nonlinearity="relu")
        init.zeros_(layer.bias)
    return model


def test_replicas_initialised_in_build_model_start_equal_and_step_as_one(devices2, queue):
    """Each replica thread draws from a copy of its caller's generator, so a model initialised
    in ``build_model`` is the same on every replica; re-initialising replica 0's weight in
    place between steps reaches the others before the next step, as any in-place change."""
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 6)).astype(np.float32), rng.integers(0, 3, 8)
    pc.nn.manual_seed(5)
    with ReplicaGroup(build, devices2) as group:
        weights = group.run(lambda r: r.model[0].weight.value.to_host())
        np.testing.assert_array_equal(weights[0], weights[1])
        opt = pc.optim.SGD(group.parameters(), lr=0.1)
        group.step(x, y, tp.cross_entropy, opt)
        init.orthogonal_(group.replicas[0].model[2].weight)
        fresh = group.replicas[0].model[2].weight.value.to_host()
        group.step(x, y, tp.cross_entropy, opt)
        after = group.run(lambda r: r.model[2].weight.value.to_host())
    np.testing.assert_array_equal(after[0], after[1])
    pc.nn.manual_seed(5)
    single = build(queue)
    sopt = pc.optim.SGD(single.parameters(), lr=0.1)
    for step in range(2):
        if step == 1:
            single[2].weight.value.copy_(pc.Tensor.from_host(queue, fresh))
        sopt.zero_grad()
        with tp.Tape() as tape:
            loss = tp.cross_entropy(single(pc.Tensor.from_host(queue, x)),
                                    pc.Tensor.from_host(queue, y))
        tape.backward(loss)
        sopt.step()
    np.testing.assert_allclose(after[0], single[2].weight.value.to_host(), atol=1e-6)
