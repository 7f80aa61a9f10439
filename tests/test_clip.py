"""pc.nn.utils.clip_grad_norm_ against a numpy transcription of PyTorch's formula (norm types
2, inf, 1 and 3), in place, one host read, a fixed order (bit-identical repeats); the device
halves get_total_norm / clip_grads_with_norm_ read nothing back."""

from __future__ import annotations

import numpy as np
import pytest

import parcl as pc
from parcl.nn.utils import ClipError, clip_grad_norm_, clip_grads_with_norm_, get_total_norm

SHAPES = [(3, 4), (5,), (2, 2, 3), (), (5000,)]       # 5000: a two-stage reduction


def torch_clip_reference(grads, max_norm, norm_type):
    """torch.nn.utils.clip_grad_norm_ in float64: the norm of the per-tensor norms, then
    clip_coef = max_norm / (total + 1e-6), clamped to 1, multiplied into every gradient."""
    g64 = [g.astype(np.float64).ravel() for g in grads]
    if norm_type == np.inf:
        norms = np.array([np.abs(g).max() for g in g64])
        total = norms.max()
    else:
        norms = np.array([(np.abs(g) ** norm_type).sum() ** (1 / norm_type) for g in g64])
        total = (norms ** norm_type).sum() ** (1 / norm_type)
    coef = min(max_norm / (total + 1e-6), 1.0)
    return total, [g * coef for g in grads]


def make_params(queue, rng, with_grad=(True, True, True, True, True)):
    params, grads = [], []
    for shape, has in zip(SHAPES, with_grad):
        p = pc.nn.Parameter(pc.Tensor.from_host(queue, np.zeros(shape, np.float32)))
        if has:
            g = rng.standard_normal(shape).astype(np.float32)
            p.grad = pc.Tensor.from_host(queue, g)
            grads.append(g)
        params.append(p)
    return params, grads


@pytest.mark.parametrize("norm_type", [2.0, np.inf, 1.0, 3.0])
@pytest.mark.parametrize("max_norm", [0.5, 1e4])          # clips / leaves them (coef 1)
def test_matches_pytorchs_formula(queue, rng, norm_type, max_norm):
    params, grads = make_params(queue, rng, with_grad=(True, False, True, True, True))
    total = clip_grad_norm_(params, max_norm, norm_type=norm_type)
    want_total, want_grads = torch_clip_reference(grads, max_norm, norm_type)
    assert isinstance(total, float)
    assert total == pytest.approx(want_total, rel=2e-5)
    got = [p.grad.to_host() for p in params if p.grad is not None]
    assert params[1].grad is None                           # skipped, not created
    for g, w in zip(got, want_grads):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-7)
    if max_norm > want_total:
        for g, original in zip(got, grads):
            np.testing.assert_array_equal(g, original)      # multiplied by exactly 1
    else:
        after = np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in got))
        if norm_type == 2.0:
            assert after == pytest.approx(max_norm, rel=1e-4)


def test_one_host_read_and_bit_identical_repeats(queue, rng, monkeypatch):
    reads = []
    real = pc.Tensor.to_host
    monkeypatch.setattr(pc.Tensor, "to_host", lambda self: reads.append(1) or real(self))
    results = []
    for _ in range(2):
        params, _ = make_params(queue, np.random.default_rng(7))
        reads.clear()
        total = clip_grad_norm_(params, 0.3)
        assert len(reads) == 1
        monkeypatch.setattr(pc.Tensor, "to_host", real)
        results.append((total, [p.grad.to_host() for p in params]))
        monkeypatch.setattr(pc.Tensor, "to_host", lambda self: reads.append(1) or real(self))
    (t1, g1), (t2, g2) = results
    assert t1 == t2
    for a, b in zip(g1, g2):
        np.testing.assert_array_equal(a, b)


def test_device_halves_read_nothing(queue, rng, monkeypatch):
    params, grads = make_params(queue, rng)
    monkeypatch.setattr(pc.Tensor, "to_host", lambda self: pytest.fail("a host read"))
    total = get_total_norm([p.grad for p in params])
    clip_grads_with_norm_(params, 1.0, total)
    monkeypatch.undo()
    assert isinstance(total, pc.Tensor) and total.shape == () and total.queue is queue
    want_total, want_grads = torch_clip_reference(grads, 1.0, 2.0)
    assert float(total.item()) == pytest.approx(want_total, rel=2e-5)
    for p, w in zip(params, want_grads):
        np.testing.assert_allclose(p.grad.to_host(), w, rtol=2e-5, atol=1e-7)


def test_single_parameter_and_no_gradients(queue):
    p = pc.nn.Parameter(pc.Tensor.from_host(queue, np.zeros(2, np.float32)))
    assert clip_grad_norm_([p], 1.0) == 0.0 and p.grad is None
    p.grad = pc.Tensor.from_host(queue, np.array([3.0, 4.0], np.float32))
    assert clip_grad_norm_(p, 1.0) == pytest.approx(5.0)
    np.testing.assert_allclose(p.grad.to_host(), [0.6, 0.8], rtol=1e-5)


def test_non_finite_norms(queue):
    p = pc.nn.Parameter(pc.Tensor.from_host(queue, np.zeros(3, np.float32)))
    p.grad = pc.Tensor.from_host(queue, np.array([1.0, np.inf, 2.0], np.float32))
    with pytest.raises(ClipError, match="non-finite"):
        clip_grad_norm_([p], 1.0, error_if_nonfinite=True)
    np.testing.assert_array_equal(p.grad.to_host(), [1.0, np.inf, 2.0])    # unchanged
    assert clip_grad_norm_([p], 1.0) == np.inf                  # as PyTorch: coef 0
    np.testing.assert_array_equal(p.grad.to_host()[[0, 2]], [0.0, 0.0])


@pytest.mark.parametrize("norm_type", [0, -1.0, "two"])
def test_bad_norm_type(queue, norm_type):
    p = pc.nn.Parameter(pc.Tensor.from_host(queue, np.zeros(3, np.float32)))
    p.grad = pc.Tensor.from_host(queue, np.ones(3, np.float32))
    with pytest.raises(ClipError, match="norm_type"):
        clip_grad_norm_([p], 1.0, norm_type=norm_type)


@pytest.mark.parametrize("max_norm", [-1.0, float("nan"), "one", True])
def test_a_negative_or_nan_max_norm_is_refused(queue, max_norm):
    """PyTorch takes ``max_norm=-1`` and flips every gradient's sign ([3, 4] -> [-0.6,
    -0.8]); a NaN makes every gradient NaN. Both are refused before anything changes."""
    p = pc.nn.Parameter(pc.Tensor.from_host(queue, np.zeros(2, np.float32)))
    p.grad = pc.Tensor.from_host(queue, np.array([3.0, 4.0], np.float32))
    with pytest.raises(ClipError, match="max_norm must be"):
        clip_grad_norm_([p], max_norm)
    with pytest.raises(ClipError, match="max_norm must be"):
        clip_grads_with_norm_([p], max_norm, get_total_norm([p.grad]))
    np.testing.assert_array_equal(p.grad.to_host(), [3.0, 4.0])
    assert clip_grad_norm_([p], float("inf")) == pytest.approx(5.0)      # inf: no clipping
    np.testing.assert_array_equal(p.grad.to_host(), [3.0, 4.0])


def test_a_total_norm_of_more_than_one_number_is_refused(queue):
    """``clip_grads_with_norm_`` took any float32 tensor as ``total_norm`` and its kernel read
    the first element: given the per-gradient norms [10, 1] (a list of ``get_total_norm``
    results put together), it scaled every gradient by 1 / 10, the first one's, with no
    error; PyTorch's in-place multiply refuses a norm of that shape. Now a ``ClipError``
    naming the shape, the gradients unchanged; a plain number is a ``TypeError``."""
    p = pc.nn.Parameter(pc.Tensor.from_host(queue, np.zeros(3, np.float32)))
    p.grad = pc.Tensor.from_host(queue, np.array([3.0, 4.0, 0.0], np.float32))
    norms = pc.Tensor.from_host(queue, np.array([10.0, 1.0], np.float32))
    with pytest.raises(ClipError, match=r"total_norm must hold one number.*shape \(2,\)"):
        clip_grads_with_norm_([p], 1.0, norms)
    with pytest.raises(TypeError, match="clip_grads_with_norm_: total_norm must be a pc.Tensor"):
        clip_grads_with_norm_([p], 1.0, 5.0)
    np.testing.assert_array_equal(p.grad.to_host(), [3.0, 4.0, 0.0])
    clip_grads_with_norm_([p], 1.0, get_total_norm([p.grad]))
    np.testing.assert_allclose(p.grad.to_host(), [0.6, 0.8, 0.0], rtol=1e-5)


def test_gradients_on_two_queues_are_refused(queues2):
    a, b = (pc.Tensor.from_host(q, np.ones(3, np.float32)) for q in queues2)
    with pytest.raises(pc.DeviceError, match="different command queues"):
        get_total_norm([a, b])


@pytest.mark.parametrize("norm_type", [2.0, 3.0])
def test_gradients_too_large_to_square_are_scaled_to_max_norm_not_zeroed(queue, norm_type):
    """Gradients of ~2e19 and more: their squares (cubes) summed in float32 overflowed the
    total norm to inf, so the clip coefficient max_norm / inf = 0 zeroed every gradient,
    silently (PyTorch on the CPU scales them to max_norm). The norm is formed from the
    gradients scaled down by their largest magnitude when that is large."""
    grads = [np.array([3e19, -4e19], np.float32), np.full(1000, 1e18, np.float32),
             np.array([0.5, 1e-3], np.float32)]
    params = []
    for g in grads:
        p = pc.nn.Parameter(pc.Tensor.from_host(queue, np.zeros_like(g)))
        p.grad = pc.Tensor.from_host(queue, g)
        params.append(p)
    want_total, want_grads = torch_clip_reference(grads, 1.0, norm_type)
    total = clip_grad_norm_(params, 1.0, norm_type=norm_type)
    assert total == pytest.approx(want_total, rel=1e-5)
    for p, w in zip(params, want_grads):
        np.testing.assert_allclose(p.grad.to_host(), w, rtol=1e-5, atol=1e-30)


def test_the_norm_of_ordinary_gradients_is_the_plain_sum_of_squares_bit_for_bit(queue, rng):
    """Below the largest magnitude that could overflow, the norm is exactly what it was: the
    squares summed per tensor, the partials folded left to right, the root."""
    from parcl.kernels import elementwise as ew
    from parcl.kernels import reduction

    for scale in (1e-30, 1.0, 1e6, 1e11):        # 1e11 * 3.5 sigma < 2**40
        grads = [pc.Tensor.from_host(queue, (rng.standard_normal(s) * scale).astype(np.float32))
                 for s in ((3, 4), (5000,), ())]
        acc = reduction.sum(ew.unary("square", grads[0]))
        for g in grads[1:]:
            acc = ew.binary("add", acc, reduction.sum(ew.unary("square", g)), out=acc)
        plain = ew.unary("sqrt", acc).to_host()
        assert get_total_norm(grads).to_host().tobytes() == plain.tobytes()


def test_clip_functions_take_pytorchs_foreach_and_error_if_nonfinite_as_pytorch(queue):
    """PyTorch's clip_grad_norm_(..., foreach=None), get_total_norm(tensors, norm_type,
    error_if_nonfinite, foreach) and clip_grads_with_norm_(..., foreach) were TypeErrors
    ('unexpected keyword argument', 'takes from 1 to 2 positional arguments'): now the same
    calls give PyTorch's results, and get_total_norm's error_if_nonfinite refuses an inf."""
    import torch

    def both(values):
        p = pc.nn.Parameter(pc.Tensor.from_host(queue, np.zeros(2, np.float32)))
        p.grad = pc.Tensor.from_host(queue, np.array(values, np.float32))
        t = torch.nn.Parameter(torch.zeros(2))
        t.grad = torch.tensor(values)
        return p, t

    p, t = both([3.0, 4.0])
    got = clip_grad_norm_([p], 1.0, 2.0, False, True)
    want = torch.nn.utils.clip_grad_norm_([t], 1.0, 2.0, False, True)
    assert got == pytest.approx(float(want)) == 5.0
    np.testing.assert_allclose(p.grad.to_host(), t.grad.numpy(), rtol=1e-6)    # [0.6, 0.8]

    p, t = both([3.0, 4.0])
    total = get_total_norm([p.grad], 2.0, True, foreach=False)
    want = torch.nn.utils.get_total_norm([t.grad], 2.0, True, foreach=False)
    assert float(total.item()) == pytest.approx(float(want)) == 5.0
    clip_grads_with_norm_([p], 2.5, total, foreach=True)
    torch.nn.utils.clip_grads_with_norm_([t], 2.5, want, foreach=True)
    np.testing.assert_allclose(p.grad.to_host(), t.grad.numpy(), rtol=1e-6)    # [1.5, 2.0]

    p, t = both([1.0, np.inf])
    with pytest.raises(RuntimeError, match="non-finite"):
        torch.nn.utils.get_total_norm([t.grad], error_if_nonfinite=True)
    with pytest.raises(ClipError, match="get_total_norm: .* non-finite"):
        get_total_norm([p.grad], error_if_nonfinite=True)
    with pytest.raises(TypeError, match="foreach must be None or a bool"):
        clip_grad_norm_([p], 1.0, foreach="yes")
