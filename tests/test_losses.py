"""Losses against float64 numpy references of PyTorch's formulas and ``tp.gradcheck``:
``cross_entropy`` with ``ignore_index``, ``label_smoothing``, class-probability targets and
(N, C, d...) inputs, ``nll_loss``, ``binary_cross_entropy_with_logits``, the loss modules, and
the label-range error raised without any backward (evaluation loops, captured replays)."""

from __future__ import annotations

import numpy as np
import pytest

import parcl as pc
import parcl.tape as tp
from conftest import close, leaf, up


def loss_and_grads(fn, *nodes):
    with tp.Tape() as tape:
        loss = fn()
    value = loss.item()
    tape.backward(loss)
    return value, [n.grad.to_host() for n in nodes]


# -- numpy float64 references of PyTorch's formulas --------------------------------------------
def _rows(x):
    """(rows, C) float64 view with the class dim (1) last, as PyTorch reads (N, C, d...)."""
    x = np.asarray(x, np.float64)
    return np.moveaxis(x, 1, -1).reshape(-1, x.shape[1])


def _unrows(g, shape):
    moved = (shape[0], *shape[2:], shape[1])
    return np.moveaxis(g.reshape(moved), -1, 1)


def log_softmax(x):
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


def ce_ref(x, y, ignore=-100, eps=0.0, nll=False):
    """PyTorch: (1 - eps) * nll_loss(lp, y) + eps / C * mean over kept rows of -sum(lp)."""
    xr, yr = _rows(x), np.asarray(y).reshape(-1)
    lp = xr if nll else log_softmax(xr)
    keep = yr != ignore
    count = keep.sum()
    c = xr.shape[1]
    with np.errstate(invalid="ignore", divide="ignore"):
        nl = -lp[keep, yr[keep]].sum() / count
        smooth = -lp[keep].sum() / count
    loss = (1 - eps) * nl + eps / c * smooth
    target = np.zeros_like(xr)
    target[np.flatnonzero(keep), yr[keep]] = 1 - eps
    target[keep] += eps / c
    p = np.zeros_like(xr) if nll else np.exp(lp)
    grad = np.where(keep[:, None], p - target, 0.0) / max(count, 1)
    return loss, _unrows(grad, np.shape(x))


def soft_ce_ref(x, t, eps=0.0):
    xr, tr = _rows(x), _rows(t)
    tr = (1 - eps) * tr + eps / xr.shape[1]
    lp = log_softmax(xr)
    rows = len(xr)
    grad = (np.exp(lp) * tr.sum(1, keepdims=True) - tr) / rows
    return -(tr * lp).sum() / rows, _unrows(grad, np.shape(x)), \
        _unrows(-(1 - eps) * lp / rows, np.shape(x))


def bce_ref(x, t, w=None, pw=None):
    x, t = np.asarray(x, np.float64), np.asarray(t, np.float64)
    w = 1.0 if w is None else np.asarray(w, np.float64)
    pw = 1.0 if pw is None else np.asarray(pw, np.float64)
    sp = np.log1p(np.exp(-np.abs(x))) + np.maximum(-x, 0)
    lw = 1 + (pw - 1) * t
    n = x.size
    loss = (w * ((1 - t) * x + lw * sp)).mean()
    sig = np.exp(-np.logaddexp(0.0, -x))
    gx = w * (lw * sig - pw * t) / n
    gt = w * ((pw - 1) * sp - x) / n
    return loss, np.broadcast_to(gx, x.shape), np.broadcast_to(gt, x.shape)


def labels_with_ignored(rng, n, c, ignored):
    y = rng.integers(0, c, n)
    y[list(ignored)] = -100
    return y


# -- cross_entropy with class indices ---------------------------------------------------------
@pytest.mark.parametrize("n, c, ignored, eps", [
    (1, 2, (), 0.0), (7, 5, (), 0.1), (9, 33, (0, 4, 8), 0.0), (6, 3, (2,), 0.25),
    (5, 1, (1,), 1.0)])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_cross_entropy_ignore_index_and_label_smoothing(queue, rng, n, c, ignored, eps, dtype):
    x = rng.standard_normal((n, c)) * 2
    y = labels_with_ignored(rng, n, c, ignored)
    nx, ny = leaf(queue, x), up(queue, y, dtype)
    want, want_grad = ce_ref(x, y, eps=eps)
    got, (g,) = loss_and_grads(lambda: tp.cross_entropy(nx, ny, label_smoothing=eps), nx)
    close(got, want)
    close(g, want_grad)
    assert tp.gradcheck(lambda a: tp.cross_entropy(a, ny, label_smoothing=eps), [nx])


def test_cross_entropy_over_extra_dims(queue, rng):
    """(N, C, d1, d2) logits with (N, d1, d2) labels, classes along dim 1, as PyTorch."""
    x = rng.standard_normal((2, 5, 3, 2)) * 2
    y = rng.integers(0, 5, (2, 3, 2))
    y[0, 1, 0] = y[1, 2, 1] = -100
    nx, ny = leaf(queue, x), up(queue, y, np.int64)
    want, want_grad = ce_ref(x, y, eps=0.2)
    got, (g,) = loss_and_grads(lambda: tp.cross_entropy(nx, ny, label_smoothing=0.2), nx)
    close(got, want)
    close(g, want_grad)
    assert tp.gradcheck(lambda a: tp.cross_entropy(a, ny, label_smoothing=0.2), [nx])
    nx.grad = None
    (_, (g1,)) = loss_and_grads(lambda: tp.cross_entropy(nx, ny), nx)
    close(g1, ce_ref(x, y)[1])


def test_every_row_ignored_gives_nan_as_pytorch(queue):
    """PyTorch's mean over zero kept rows is 0/0 = NaN; no row gets a gradient."""
    nx = leaf(queue, np.ones((3, 4)))
    y = up(queue, [-100, -100, -100], np.int64)
    got, (g,) = loss_and_grads(lambda: tp.cross_entropy(nx, y, label_smoothing=0.1), nx)
    assert np.isnan(got)
    np.testing.assert_array_equal(g, np.zeros((3, 4), np.float32))


def test_ignore_index_inside_the_class_range(queue, rng):
    x, y = rng.standard_normal((6, 4)), np.array([0, 1, 0, 3, 2, 0])
    nx, ny = leaf(queue, x), up(queue, y, np.int64)
    got, (g,) = loss_and_grads(lambda: tp.cross_entropy(nx, ny, ignore_index=0), nx)
    want, want_grad = ce_ref(x, y, ignore=0)
    close(got, want)
    close(g, want_grad)


def test_very_large_logits_stay_finite(queue, rng):
    x = rng.standard_normal((5, 7)) * 1e4
    y = np.array([0, 3, 6, -100, 2])
    nx, ny = leaf(queue, x), up(queue, y, np.int64)
    got, (g,) = loss_and_grads(lambda: tp.cross_entropy(nx, ny, label_smoothing=0.1), nx)
    want, want_grad = ce_ref(x.astype(np.float32), y, eps=0.1)
    assert np.isfinite(got) and np.all(np.isfinite(g))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    close(g, want_grad)


def test_losses_are_bit_identical_run_to_run(queue, rng):
    x = rng.standard_normal((37, 11))
    y = labels_with_ignored(rng, 37, 11, (3, 30))
    t = rng.random((37, 11))
    nx, ny, nt = leaf(queue, x), up(queue, y, np.int64), up(queue, t)
    fns = [lambda: tp.cross_entropy(nx, ny, label_smoothing=0.1),
           lambda: tp.cross_entropy(nx, nt, label_smoothing=0.1),
           lambda: tp.nll_loss(tp.log_softmax(nx, axis=1), ny),
           lambda: tp.binary_cross_entropy_with_logits(nx, nt)]
    for fn in fns:
        runs = []
        for _ in range(2):
            nx.grad = None
            value, (g,) = loss_and_grads(fn, nx)
            runs.append((np.float32(value).tobytes(), g.tobytes()))
        assert runs[0] == runs[1]


def test_plain_cross_entropy_keeps_its_results(queue, rng):
    """ignore_index and label_smoothing at their defaults: the same value as before they
    existed (the mean of lse - x[label] over every row)."""
    x, y = rng.standard_normal((8, 6)), rng.integers(0, 6, 8)
    nx = leaf(queue, x)
    got, (g,) = loss_and_grads(lambda: tp.cross_entropy(nx, up(queue, y, np.int32)), nx)
    lp = log_softmax(x)
    close(got, -lp[np.arange(8), y].mean())
    p = np.exp(lp)
    p[np.arange(8), y] -= 1
    close(g, p / 8)


# -- the label-range error, without any backward -------------------------------------------------
def test_bad_label_is_raised_at_the_first_read_of_a_recorded_loss(queue):
    """An evaluation that records (grad mode on) but never runs backward: the loss is NaN
    garbage, so reading it raises instead of returning it."""
    x = leaf(queue, np.zeros((4, 3)))
    with tp.Tape():
        loss = tp.cross_entropy(x, up(queue, [0, 2, 3, -100], np.int64))   # no sync here
    with pytest.raises(pc.LabelError, match=r"cross_entropy: label 3 at row 2 is out of range "
                       r"for 3 classes \(logits \(4, 3\)\)") as info:
        loss.item()
    err = info.value
    assert isinstance(err, pc.ShapeError) and isinstance(err, pc.ParclError)
    assert (err.op, err.row, err.label, err.num_classes) == ("cross_entropy", 2, 3, 3)
    with pytest.raises(pc.LabelError, match="label 3 at row 2"):
        loss.to_host()                          # still garbage: raises on every read
    with pytest.raises(pc.LabelError, match="label 3 at row 2"):
        loss.value.reshape(1).to_host()         # a view of it too


def test_bad_label_in_an_eval_loop_under_no_grad(queue, rng):
    model = pc.nn.Linear(4, 3, queue=queue)
    batches = [(rng.standard_normal((5, 4)), rng.integers(0, 3, 5)) for _ in range(3)]
    batches[2][1][4] = 7
    seen = []
    with tp.no_grad(), pytest.raises(pc.LabelError) as info:
        for x, y in batches:
            seen.append(tp.cross_entropy(model(up(queue, x)), up(queue, y, np.int64)).item())
    assert len(seen) == 2 and all(np.isfinite(seen))
    assert (info.value.row, info.value.label, info.value.num_classes) == (4, 7, 3)


def test_bad_label_positions_in_labels_with_extra_dims(queue):
    x = leaf(queue, np.zeros((2, 3, 4)))
    y = np.zeros((2, 4), np.int64)
    y[1, 2] = -5
    with tp.Tape():
        loss = tp.nll_loss(x, up(queue, y, np.int64))
    with pytest.raises(pc.LabelError, match=r"nll_loss: label -5 at row 6 \(position \(1, 2\) "
                       r"of labels \(2, 4\)\) is out of range for 3 classes") as info:
        float(loss.item())
    assert info.value.row == 6


def _eval_step(queue, model):
    def body(x, y):
        with tp.no_grad():
            return tp.cross_entropy(model(x), y, ignore_index=-1)
    return tp.capture(body, queue)


def test_bad_label_in_a_replayed_eval_step(queue, rng):
    """A captured evaluation step (no backward) checks the labels of every replay, before
    anything is enqueued; ignore_index is not an error there either."""
    model = pc.nn.Linear(4, 3, queue=queue)
    step = _eval_step(queue, model)
    x, y = rng.standard_normal((6, 4)).astype(np.float32), np.array([0, 1, 2, -1, 1, 0])
    first = step(x, y).item()
    assert step(x, y).item() == first and step.replays == 1
    bad = y.copy()
    bad[5] = 3
    with pytest.raises(pc.LabelError, match="label 3 at row 5") as info:
        step(x, bad)
    assert info.value.row == 5 and step.replays == 1


def test_bad_label_in_a_replayed_training_step_with_device_labels(queue, rng):
    model = pc.nn.Linear(4, 3, queue=queue)

    def body(x, y):
        with tp.Tape() as tape:
            loss = tp.nll_loss(tp.log_softmax(model(tp.tensor(x)), axis=1), y.copy())
        tape.backward(loss)
        return loss.value
    step = tp.capture(body, queue)
    x, y = rng.standard_normal((5, 4)).astype(np.float32), np.array([0, -100, 2, 1, 1])
    for p in model.parameters():             # persistent buffers: every call accumulates
        p.grad = pc.Tensor.zeros(queue, p.shape)
    step(x, y)
    step(x, y)
    assert step.replays == 1
    bad = y.copy()
    bad[3] = 9
    with pytest.raises(pc.LabelError, match="nll_loss: label 9 at row 3"):
        step(x, bad)


# -- nll_loss, probability targets, binary cross-entropy ---------------------------------------
@pytest.mark.parametrize("shape, ignored", [((1, 3), ()), ((7, 4), (2, 5)), ((2, 5, 3), ())])
def test_nll_loss(queue, rng, shape, ignored):
    x = log_softmax(_rows(rng.standard_normal(shape)))
    x = _unrows(x, shape)
    y = rng.integers(0, shape[1], (shape[0], *shape[2:]))
    y.reshape(-1)[list(ignored)] = -100
    nx, ny = leaf(queue, x), up(queue, y, np.int64)
    want, want_grad = ce_ref(x, y, nll=True)
    got, (g,) = loss_and_grads(lambda: tp.nll_loss(nx, ny), nx)
    close(got, want)
    close(g, want_grad)
    assert tp.gradcheck(lambda a: tp.nll_loss(a, ny), [nx])


@pytest.mark.parametrize("shape, eps", [((1, 2), 0.0), ((5, 7), 0.1), ((2, 3, 4), 0.3)])
def test_cross_entropy_with_class_probabilities(queue, rng, shape, eps):
    x = rng.standard_normal(shape) * 2
    t = rng.random(shape)
    t /= t.sum(axis=1, keepdims=True)
    nx, nt = leaf(queue, x), leaf(queue, t)
    want, want_gx, want_gt = soft_ce_ref(x, t, eps)
    got, (gx, gt) = loss_and_grads(lambda: tp.cross_entropy(nx, nt, label_smoothing=eps),
                                   nx, nt)
    close(got, want)
    close(gx, want_gx)
    close(gt, want_gt)
    assert tp.gradcheck(lambda a, b: tp.cross_entropy(a, b, label_smoothing=eps), [nx, nt])


def test_ignore_index_with_class_probabilities_is_refused_as_pytorch(queue, rng):
    """PyTorch raises "ignore_index is not supported for floating point target"; it was
    dropped silently, the loss taken over every row."""
    x, t = up(queue, rng.standard_normal((4, 3))), up(queue, np.full((4, 3), 1 / 3))
    with pytest.raises(pc.ParclError, match=r"cross_entropy: ignore_index=1 .*class "
                       r"probabilities"):
        tp.cross_entropy(x, t, ignore_index=1)
    with pytest.raises(pc.ParclError, match="ignore_index=0"):
        pc.nn.CrossEntropyLoss(ignore_index=0)(x, t)
    assert tp.cross_entropy(x, t, ignore_index=-100).item() > 0      # the default: fine


def test_probability_targets_with_large_logits(queue, rng):
    x = rng.standard_normal((4, 6)) * 1e4
    t = np.full((4, 6), 1 / 6)
    with tp.no_grad():
        got = tp.cross_entropy(up(queue, x), up(queue, t)).item()
    np.testing.assert_allclose(got, soft_ce_ref(x.astype(np.float32), t)[0], rtol=1e-5)


@pytest.mark.parametrize("shape, w_shape, pw_shape", [
    ((1,), None, None), ((5, 3), None, (3,)), ((4, 7), (4, 7), None), ((2, 3, 5), (5,), (5,)),
    ((5, 3), (5, 1), None), ((5, 3), (1, 3), (5, 1)), ((2, 3, 5), (2, 1, 1), (3, 1))],
    ids=["scalar", "pos-per-class", "full", "3d-trailing", "per-sample", "pos-per-sample",
         "3d-leading"])
def test_binary_cross_entropy_with_logits(queue, rng, shape, w_shape, pw_shape):
    """Weights broadcast as PyTorch's from any dims: a per-sample ``(N, 1)`` weight was a
    ShapeError (only trailing dims were taken)."""
    x = rng.standard_normal(shape) * 3
    t = rng.random(shape)
    w = None if w_shape is None else rng.random(w_shape) + 0.5
    pw = None if pw_shape is None else rng.random(pw_shape) * 3
    nx, nt = leaf(queue, x), leaf(queue, t)
    tw = None if w is None else up(queue, w)
    tpw = None if pw is None else up(queue, pw)
    want, want_gx, want_gt = bce_ref(x, t, w, pw)

    def fn(a, b):
        return tp.binary_cross_entropy_with_logits(a, b, weight=tw, pos_weight=tpw)
    got, (gx, gt) = loss_and_grads(lambda: fn(nx, nt), nx, nt)
    close(got, want)
    close(gx, want_gx)
    close(gt, want_gt)
    assert tp.gradcheck(fn, [nx, nt])


def test_binary_cross_entropy_with_extreme_logits(queue):
    x = np.array([-1e4, -50.0, 0.0, 50.0, 1e4, 88.0, -104.0])
    t = np.array([0.0, 1.0, 0.5, 0.0, 1.0, 0.3, 0.7])
    nx = leaf(queue, x)
    got, (g,) = loss_and_grads(
        lambda: tp.binary_cross_entropy_with_logits(nx, up(queue, t),
                                                    pos_weight=up(queue, [2.0])), nx)
    want, want_gx, _ = bce_ref(x.astype(np.float32), t, pw=np.array([2.0]))
    assert np.isfinite(got) and np.all(np.isfinite(g))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    close(g, want_gx)


# -- modules and input errors ------------------------------------------------------------------
def test_loss_modules(queue, rng):
    x, y = rng.standard_normal((6, 4)), np.array([0, 3, -100, 1, 2, 2])
    t = rng.random((6, 4))
    nx, ny, nt = leaf(queue, x), up(queue, y, np.int64), up(queue, t)
    ce = pc.nn.CrossEntropyLoss(label_smoothing=0.1)
    close(ce(nx, ny).item(), ce_ref(x, y, eps=0.1)[0])
    close(pc.nn.CrossEntropyLoss(ignore_index=3)(nx, up(queue, [0, 3, 1, 1, 2, 2],
                                                           np.int64)).item(),
          ce_ref(x, [0, 3, 1, 1, 2, 2], ignore=3)[0])
    close(ce(nx, nt).item(), soft_ce_ref(x, t, 0.1)[0])
    close(pc.nn.NLLLoss()(tp.log_softmax(nx, axis=1), ny).item(), ce_ref(x, y)[0])
    pw = up(queue, [1.0, 2.0, 0.5, 3.0])
    bce = pc.nn.BCEWithLogitsLoss(pos_weight=pw)
    assert list(bce.state_dict()) == ["pos_weight"]
    close(bce(nx, nt).item(), bce_ref(x, t, pw=[1.0, 2.0, 0.5, 3.0])[0])
    close(pc.nn.MSELoss()(nx, nt).item(), ((x - t) ** 2).mean())
    with pytest.raises(pc.ParclError, match=r"MSELoss: reduction must be 'mean', 'sum' or "
                                            r"'none', got 'avg'"):
        pc.nn.MSELoss(reduction="avg")


def test_loss_input_errors(queue):
    x = up(queue, np.zeros((4, 3)))
    with pytest.raises(pc.ParclError, match=r"cross_entropy: label_smoothing must be in "
                       r"\[0, 1\], got 1.5"):
        tp.cross_entropy(x, up(queue, [0, 1, 2, 0], np.int64), label_smoothing=1.5)
    with pytest.raises(pc.ShapeError, match=r"cross_entropy: labels have shape \(2, 4\), "
                       r"expected \(2, 2\) for logits \(2, 3, 2\)"):
        tp.cross_entropy(up(queue, np.zeros((2, 3, 2))), up(queue, np.zeros((2, 4)), np.int64))
    with pytest.raises(pc.DTypeError, match=r"cross_entropy: labels have dtype float32 "
                       r"\(shape \(4, 2\)\), expected int32 or int64 class indices \(or "
                       r"class probabilities of the logits' shape\)"):
        tp.cross_entropy(x, up(queue, np.zeros((4, 2))))
    with pytest.raises(pc.DTypeError, match=r"cross_entropy: target has dtype int64"):
        tp.cross_entropy(x, up(queue, np.zeros((4, 3)), np.int64))
    with pytest.raises(pc.ShapeError, match=r"binary_cross_entropy_with_logits: pos_weight of "
                       r"shape \(4,\) does not broadcast"):
        tp.binary_cross_entropy_with_logits(x, x, pos_weight=up(queue, np.ones(4)))
    with pytest.raises(pc.ParclError, match="weight and pos_weight are constants"):
        tp.binary_cross_entropy_with_logits(leaf(queue, np.zeros((4, 3))), x,
                                            weight=leaf(queue, np.ones(3)))
    with pytest.raises(pc.DTypeError, match=r"nll_loss: labels have dtype float32"):
        tp.nll_loss(x, up(queue, np.zeros(4)))


def test_an_ignore_index_that_is_not_an_integer_is_refused(queue):
    """PyTorch's third argument of cross_entropy and nll_loss is ``weight``: class weights
    given there were truncated into ignore_index, so cross_entropy(x, y, 0.5) silently left
    every label 0 out of the loss. The modules take PyTorch's ``weight`` first, and refuse
    anything there but a tensor (an int, parcl's ignore_index of old, included)."""
    x = up(queue, np.zeros((4, 3)))
    y = up(queue, [0, 1, 2, 0], np.int64)
    weights = up(queue, np.array([2.0], np.float32))
    for bad in (0.5, 2.0, weights, True, "1"):
        for op in (tp.cross_entropy, tp.nll_loss):
            with pytest.raises(TypeError, match=r"ignore_index must be an int.*weight="):
                op(x, y, bad)
    for make in (pc.nn.CrossEntropyLoss, pc.nn.NLLLoss):
        for bad in (0.5, 2, np.int64(2), True, "1"):
            with pytest.raises(TypeError, match=r"weight, the first argument"):
                make(bad)
        for bad in (0.5, 2.0, True, "1"):
            with pytest.raises(TypeError, match=r"ignore_index must be an int"):
                make(ignore_index=bad)
    assert pc.nn.CrossEntropyLoss(ignore_index=np.int64(2)).ignore_index == 2   # ints still do
    assert tp.cross_entropy(x, y, np.int32(0)).item() == pytest.approx(np.log(3.0))


def test_gpu_work_group_sizes_give_the_same_losses(queue, rng, monkeypatch):
    """GPUs reduce in 256-wide work-groups (chosen by device type); force that layout here so
    it is exercised without a GPU: same values within float32 rounding of the sum order."""
    from parcl.kernels import softmax as smk

    x, t = rng.standard_normal((300, 7)), rng.random((300, 7))
    y = labels_with_ignored(rng, 300, 7, (5, 299))
    nx, ny, nt = up(queue, x), up(queue, y, np.int64), up(queue, t)

    def run():
        with tp.no_grad():
            return [tp.cross_entropy(nx, ny, label_smoothing=0.1).item(),
                    tp.cross_entropy(nx, nt).item(), tp.nll_loss(nx, ny).item(),
                    tp.binary_cross_entropy_with_logits(nx, nt).item()]

    cpu = run()
    monkeypatch.setattr(smk, "on_gpu", lambda queue: True)   # loss.py uses its geometry
    close(run(), cpu, tol=1e-6)
    close(cpu, [ce_ref(x, y, eps=0.1)[0], soft_ce_ref(x, t)[0], ce_ref(x, y, nll=True)[0],
                bce_ref(x, t)[0]])


def test_loss_module_in_a_captured_data_parallel_step(devices2, queue, rng):
    """A loss module as group.step's loss_fn: 2 captured replicas equal 1 replica."""
    from parcl.replica import ReplicaGroup

    def build(q):
        pc.nn.manual_seed(0)
        return pc.nn.Linear(6, 4, queue=q)
    batches = [(rng.standard_normal((8, 6)).astype(np.float32), rng.integers(0, 4, 8))
               for _ in range(3)]
    results = []
    for devices, capture in ((devices2[:1], False), (devices2, True)):
        loss_fn = pc.nn.CrossEntropyLoss(label_smoothing=0.1)
        with ReplicaGroup(build, devices, capture=capture) as group:
            opt = pc.optim.SGD(group.parameters(), lr=0.5)
            losses = [group.step(x, y, loss_fn, opt) for x, y in batches]
            results.append((losses, [p.value.to_host() for p in group.parameters()]))
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-5)
    for a, b in zip(results[1][1], results[0][1]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


# -- class weights and reduction, as PyTorch's --------------------------------------------------
def _torch_ce(x, y, up_grad, nll=False, **kw):
    import torch
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    if kw.get("weight") is not None:
        kw["weight"] = torch.tensor(kw["weight"], dtype=torch.float64)
    fn = torch.nn.functional.nll_loss if nll else torch.nn.functional.cross_entropy
    loss = fn(xt, torch.tensor(y), **kw)
    loss.backward(torch.tensor(up_grad, dtype=torch.float64))
    return loss.detach().numpy(), xt.grad.numpy()


@pytest.mark.parametrize("shape", [(7, 5), (4, 3, 6)], ids=["NC", "NCd"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("op, eps", [("cross_entropy", 0.0), ("cross_entropy", 0.2),
                                     ("nll_loss", 0.0)], ids=["ce", "ce-smoothed", "nll"])
def test_class_weights_and_reduction_match_pytorch(queue, rng, shape, reduction, weighted, op,
                                                   eps):
    """``weight`` scales each row's loss by its label's weight and a mean divides by the
    weights of the rows that count (ignored rows take no part); ``'sum'`` adds the rows'
    losses and ``'none'`` gives each row's (0 for an ignored row), as ``torch.nn.functional``
    does, loss and gradient, for an upstream gradient per row with ``'none'``."""
    x = rng.standard_normal(shape).astype(np.float32)
    y = rng.integers(0, shape[1], (shape[0],) + shape[2:])
    y.flat[::3] = -100
    w = (rng.random(shape[1]) + 0.2).astype(np.float32) if weighted else None
    g = (rng.standard_normal(y.shape) if reduction == "none" else np.array(1.7)).astype(
        np.float32)
    kw = dict(weight=w, reduction=reduction)
    if op == "cross_entropy":
        kw["label_smoothing"] = eps
    want, want_grad = _torch_ce(x, y, g, nll=op == "nll_loss", **kw)
    nx = leaf(queue, x)
    with tp.Tape() as tape:
        loss = getattr(tp, op)(nx, up(queue, y, np.int64), **{**kw, "weight": None if w is None
                                                     else up(queue, w)})
    tape.backward(loss, grad=up(queue, g))
    assert loss.shape == want.shape
    np.testing.assert_allclose(loss.to_host(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(nx.grad.to_host(), want_grad, rtol=1e-5, atol=1e-6)


def test_weighted_cross_entropy_passes_gradcheck(queue, rng):
    x = leaf(queue, rng.standard_normal((5, 4, 3)))
    y = up(queue, rng.integers(0, 4, (5, 3)), np.int64)
    w = up(queue, rng.random(4) + 0.5)
    assert tp.gradcheck(lambda a: tp.cross_entropy(a, y, label_smoothing=0.1, weight=w), [x])
    assert tp.gradcheck(lambda a: tp.sum(tp.cross_entropy(a, y, weight=w, reduction="none")
                                         * tp.cross_entropy(a, y, reduction="none")), [x])


def test_loss_modules_take_pytorchs_weight_first_as_a_buffer(queue, rng):
    """``CrossEntropyLoss(w)`` and ``NLLLoss(w)``: the class weights, in ``state_dict`` under
    ``weight`` as PyTorch's; every row ignored gives NaN for the mean and 0 for the sum."""
    import torch
    x = rng.standard_normal((6, 3)).astype(np.float32)
    y = np.array([0, 2, 1, 1, 2, 0])
    w = np.array([1.0, 3.0, 0.5], np.float32)
    crit = pc.nn.CrossEntropyLoss(up(queue, w), ignore_index=2, label_smoothing=0.1)
    want = torch.nn.CrossEntropyLoss(torch.tensor(w), ignore_index=2, label_smoothing=0.1)
    assert list(crit.state_dict()) == list(want.state_dict()) == ["weight"]
    assert crit(up(queue, x), up(queue, y, np.int64)).item() == pytest.approx(
        want(torch.tensor(x), torch.tensor(y)).item(), rel=1e-5)
    nll = pc.nn.NLLLoss(up(queue, w), reduction="sum")
    assert nll(up(queue, x), up(queue, y, np.int64)).item() == pytest.approx(
        torch.nn.NLLLoss(torch.tensor(w), reduction="sum")(torch.tensor(x),
                                                            torch.tensor(y)).item(), rel=1e-5)
    ignored = up(queue, np.full(6, -100), np.int64)
    assert np.isnan(pc.nn.CrossEntropyLoss(up(queue, w))(up(queue, x), ignored).item())
    assert pc.nn.CrossEntropyLoss(up(queue, w), reduction="sum")(up(queue, x),
                                                                 ignored).item() == 0.0


def test_class_weights_of_the_wrong_shape_or_a_bad_reduction_are_refused(queue):
    x, y = up(queue, np.zeros((4, 3))), up(queue, [0, 1, 2, 0], np.int64)
    with pytest.raises(pc.ShapeError, match=r"weight has shape \(2,\), expected one weight per "
                                            r"class: \(3,\)"):
        tp.cross_entropy(x, y, weight=up(queue, np.ones(2)))
    with pytest.raises(pc.ParclError, match="reduction must be 'mean', 'sum' or 'none'"):
        tp.nll_loss(x, y, reduction="avg")
    with pytest.raises(pc.ParclError, match="class probabilities .* reduction='mean'"):
        tp.cross_entropy(x, up(queue, np.ones((4, 3))), reduction="sum")


@pytest.mark.parametrize("op,kw", [(tp.cross_entropy, dict(label_smoothing=0.1)),
                                   (tp.nll_loss, {})], ids=["cross_entropy", "nll_loss"])
def test_class_weights_that_require_grad_are_refused_as_pytorch(queue, op, kw):
    """PyTorch's cross_entropy and nll_loss are not differentiable with respect to weight and
    say so; parcl took a learnable weight's value and its .grad stayed None after backward,
    silently (the loss 0.479 trained nothing into [1, 2, 3])."""
    import torch
    x = leaf(queue, [[1, 2, 0], [0, 1, 3]])
    y = up(queue, [0, 2], np.int64)
    w = leaf(queue, [1, 2, 3])
    with pytest.raises(RuntimeError, match="not differentiable with respect to argument "
                                           "'weight'"):
        torch.nn.functional.cross_entropy(torch.zeros(2, 3), torch.tensor([0, 2]),
                                          weight=torch.ones(3, requires_grad=True))
    with pytest.raises(pc.ParclError, match=rf"{op.__name__}: weight \(3,\) requires grad"
                                            r".*not differentiable"):
        with tp.Tape():
            op(x, y, weight=w, **kw)
    # detached, or without recording, the weights are constants as before
    value, _ = loss_and_grads(lambda: op(x, y, weight=w.detach(), **kw), x)
    with tp.no_grad():
        assert op(x, y, weight=w, **kw).item() == value
    assert w.grad is None


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_bce_with_logits_and_mse_take_pytorchs_reduction(queue, rng, reduction):
    """``binary_cross_entropy_with_logits`` (weights and pos_weight too) and ``mse_loss``
    reduce as ``torch.nn.functional``'s ``reduction`` says, loss and both gradients, their
    modules likewise (``'sum'`` and ``'none'`` were refused)."""
    import torch
    x = rng.standard_normal((5, 2, 3)).astype(np.float32) * 3
    t = rng.random((5, 2, 3)).astype(np.float32)
    w, pw = (rng.random(3) + 0.3).astype(np.float32), (rng.random(3) * 3).astype(np.float32)
    g = (rng.standard_normal(x.shape) if reduction == "none" else np.array(1.3)).astype(
        np.float32)
    for ours, theirs in [
            (lambda a, b: tp.binary_cross_entropy_with_logits(
                a, b, up(queue, w), up(queue, pw), reduction=reduction),
             lambda a, b: torch.nn.functional.binary_cross_entropy_with_logits(
                 a, b, torch.tensor(w, dtype=a.dtype), pos_weight=torch.tensor(pw, dtype=a.dtype),
                 reduction=reduction)),
            (pc.nn.MSELoss(reduction=reduction), torch.nn.MSELoss(reduction=reduction))]:
        xt, tt = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (x, t))
        want = theirs(xt, tt)
        want.backward(torch.tensor(g, dtype=torch.float64))
        nx, nt = leaf(queue, x), leaf(queue, t)
        with tp.Tape() as tape:
            loss = ours(nx, nt)
        tape.backward(loss, grad=up(queue, g))
        assert loss.shape == tuple(want.shape)
        np.testing.assert_allclose(loss.to_host(), want.detach().numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(nx.grad.to_host(), xt.grad.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(nt.grad.to_host(), tt.grad.numpy(), rtol=1e-5, atol=1e-6)
    crit = pc.nn.BCEWithLogitsLoss(up(queue, w), reduction=reduction)
    assert crit(up(queue, x), up(queue, t)).shape == (() if reduction != "none" else x.shape)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
def test_a_weighted_mean_over_labels_that_weigh_nothing_is_nan_as_pytorch(queue,
                                                                           label_smoothing):
    """Labels all of a class weighing 0 (``weight=[0, 1, 2]``, labels ``[0, 0, -100, 0]``):
    PyTorch's weighted mean is 0/0, NaN, and so is its gradient; with label_smoothing parcl
    divided the smoothing terms by that 0 and gave the loss inf and the logits gradients
    +inf and -inf. The ignored row's gradient stays 0, and a sum is unchanged."""
    import torch
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    y, w = np.array([0, 0, -100, 0]), np.array([0, 1, 2], np.float32)
    xt = torch.tensor(x, requires_grad=True)
    want = torch.nn.functional.cross_entropy(xt, torch.tensor(y), weight=torch.tensor(w),
                                             label_smoothing=label_smoothing)
    want.backward()
    node = leaf(queue, x)
    value, (grad,) = loss_and_grads(lambda: tp.cross_entropy(
        node, up(queue, y, np.int64), weight=w, label_smoothing=label_smoothing), node)
    assert np.isnan(want.item()) and np.isnan(value)
    np.testing.assert_array_equal(grad, xt.grad.numpy())        # NaN rows, the ignored 0
    summed = torch.nn.functional.cross_entropy(torch.tensor(x), torch.tensor(y),
                                               weight=torch.tensor(w), reduction="sum",
                                               label_smoothing=label_smoothing)
    with tp.no_grad():
        got = tp.cross_entropy(up(queue, x), up(queue, y, np.int64), weight=w,
                               reduction="sum", label_smoothing=label_smoothing).item()
    assert got == pytest.approx(summed.item(), rel=1e-6)
