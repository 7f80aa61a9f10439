"""Optimizers against numpy implementations of PyTorch's documented formulas, state dicts,
zero_grad, skipping parameters without gradients, validation."""

from __future__ import annotations

import numpy as np
import pytest

import parcl as pc
from parcl.optim import SGD, Adam, AdamW, OptimizerError

SHAPES = [(7,), (33, 5), (1,), (257,)]
STEPS = 10


def make_params(queue, rng):
    hosts = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    return hosts, [pc.nn.Parameter.from_host(queue, h) for h in hosts]


def grads_for(rng, steps=STEPS):
    return [[rng.standard_normal(s).astype(np.float32) for s in SHAPES] for _ in range(steps)]


# -- numpy references (float64), straight from PyTorch's documentation ---------------------
def sgd_ref(p, grads, lr, momentum=0.0, weight_decay=0.0, nesterov=False):
    p, buf = p.astype(np.float64), None
    for g in grads:
        g = g + weight_decay * p
        if momentum:
            buf = g.copy() if buf is None else momentum * buf + g
            g = g + momentum * buf if nesterov else buf
        p = p - lr * g
    return p, buf


def adam_ref(p, grads, lr, betas, eps, weight_decay, decoupled):
    b1, b2 = betas
    p = p.astype(np.float64)
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        if decoupled:
            p = p * (1 - lr * weight_decay)
        else:
            g = g + weight_decay * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat = m / (1 - b1 ** t)
        v_hat = v / (1 - b2 ** t)
        p = p - lr * m_hat / (np.sqrt(v_hat) + eps)
    return p, m, v


def run(queue, opt_params, opt, grads):
    for step_grads in grads:
        for p, g in zip(opt_params, step_grads):
            p.grad = pc.Tensor.from_host(queue, g)
        opt.step()
        opt.zero_grad()


@pytest.mark.parametrize("momentum,weight_decay,nesterov", [
    (0.0, 0.0, False), (0.0, 0.01, False), (0.9, 0.0, False), (0.9, 0.05, False),
    (0.8, 0.01, True)])
def test_sgd_matches_pytorch_formula(queue, rng, momentum, weight_decay, nesterov):
    hosts, params = make_params(queue, rng)
    grads = grads_for(rng)
    opt = SGD(params, lr=0.05, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)
    run(queue, params, opt, grads)
    for i, (h, p) in enumerate(zip(hosts, params)):
        want, buf = sgd_ref(h, [g[i] for g in grads], 0.05, momentum, weight_decay, nesterov)
        np.testing.assert_allclose(p.to_host(), want, rtol=1e-5, atol=1e-6)
        if momentum:
            np.testing.assert_allclose(opt.state[p]["momentum_buffer"].to_host(), buf,
                                       rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cls,weight_decay", [(Adam, 0.0), (Adam, 0.1), (AdamW, 0.01),
                                              (AdamW, 0.3)])
def test_adam_family_matches_pytorch_formula(queue, rng, cls, weight_decay):
    hosts, params = make_params(queue, rng)
    grads = grads_for(rng)
    betas = (0.8, 0.95)
    opt = cls(params, lr=0.01, betas=betas, eps=1e-6, weight_decay=weight_decay)
    run(queue, params, opt, grads)
    for i, (h, p) in enumerate(zip(hosts, params)):
        want, m, v = adam_ref(h, [g[i] for g in grads], 0.01, betas, 1e-6, weight_decay,
                              decoupled=cls is AdamW)
        np.testing.assert_allclose(p.to_host(), want, rtol=1e-5, atol=1e-6)
        state = opt.state[p]
        assert state["step"] == STEPS
        np.testing.assert_allclose(state["exp_avg"].to_host(), m, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(state["exp_avg_sq"].to_host(), v, rtol=1e-5, atol=1e-7)


def test_adamw_defaults():
    assert AdamW.__init__.__defaults__ == (1e-3, (0.9, 0.999), 1e-8, 0.01, False)
    assert Adam.__init__.__defaults__ == (1e-3, (0.9, 0.999), 1e-8, 0.0, False)


def test_lr_is_settable_between_steps(queue, rng):
    hosts, params = make_params(queue, rng)
    grads = grads_for(rng, 2)
    opt = SGD(params, lr=0.1)
    run(queue, params, opt, grads[:1])
    opt.lr = 0.01
    assert opt.param_groups[0]["lr"] == 0.01
    run(queue, params, opt, grads[1:])
    opt.param_groups[0]["lr"] = 0.5
    assert opt.lr == 0.5
    want = hosts[0].astype(np.float64) - 0.1 * grads[0][0] - 0.01 * grads[1][0]
    np.testing.assert_allclose(params[0].to_host(), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(OptimizerError):
        opt.lr = -1.0


def test_parameters_without_grad_are_skipped(queue, rng):
    hosts, params = make_params(queue, rng)
    opt = Adam(params, lr=0.1)
    params[1].grad = pc.Tensor.from_host(queue, np.ones(SHAPES[1], np.float32))
    opt.step()
    for i, (h, p) in enumerate(zip(hosts, params)):
        if i == 1:
            assert not np.allclose(p.to_host(), h)
            assert opt.state[p]["step"] == 1
        else:
            np.testing.assert_array_equal(p.to_host(), h)
            assert p not in opt.state
    assert list(opt.state_dict()["state"]) == [1]


def test_zero_grad_both_modes_and_views(queue, rng):
    _, params = make_params(queue, rng)
    opt = SGD(params, lr=0.1)
    for p in params:
        p.grad = pc.Tensor.from_host(queue, np.ones(p.shape, np.float32))
    opt.zero_grad(set_to_none=False)
    for p in params:
        np.testing.assert_array_equal(p.grad.to_host(), 0)
    opt.zero_grad()
    assert all(p.grad is None for p in params)


@pytest.mark.parametrize("make", [
    lambda ps: SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
    lambda ps: Adam(ps, lr=0.01, weight_decay=0.01),
    lambda ps: AdamW(ps, lr=0.01, betas=(0.5, 0.6))])
def test_state_dict_round_trip_continues_identically(queue, rng, make):
    hosts, params_a = make_params(queue, rng)
    params_b = [pc.nn.Parameter.from_host(queue, h) for h in hosts]
    grads = grads_for(rng, 6)
    opt_a = make(params_a)
    run(queue, params_a, opt_a, grads[:3])
    sd = opt_a.state_dict()
    assert sorted(sd["state"]) == [0, 1, 2, 3]
    assert sd["param_groups"][0]["params"] == [0, 1, 2, 3]
    for entry in sd["state"].values():
        assert all(isinstance(v, (int, np.ndarray)) for v in entry.values())
    # b: same parameters, a fresh optimizer restored from a's state dict
    for pa, pb in zip(params_a, params_b):
        pc.Tensor.copy_(pb.value, pa.value)
    opt_b = make(params_b)
    opt_b.param_groups[0]["lr"] = 123.0          # overwritten by the load
    opt_b.load_state_dict(sd)
    assert opt_b.lr == opt_a.lr
    run(queue, params_a, opt_a, grads[3:])
    run(queue, params_b, opt_b, grads[3:])
    for pa, pb in zip(params_a, params_b):
        np.testing.assert_array_equal(pa.to_host(), pb.to_host())
    sd_b = opt_b.state_dict()
    for i, entry in sd_b["state"].items():
        for k, v in entry.items():
            np.testing.assert_array_equal(v, opt_a.state_dict()["state"][i][k])


def test_load_state_dict_mismatch_changes_nothing(queue, rng):
    hosts, params = make_params(queue, rng)
    opt = Adam(params, lr=0.01)
    run(queue, params, opt, grads_for(rng, 2))
    before = opt.state_dict()
    bad_shape = opt.state_dict()
    bad_shape["state"][3]["exp_avg"] = np.zeros(5, np.float32)
    bad_shape["param_groups"][0]["lr"] = 0.5
    bad_entry = opt.state_dict()
    del bad_entry["state"][0]["exp_avg_sq"]
    bad_groups = opt.state_dict()
    bad_groups["param_groups"][0]["params"] = [0, 1]
    bad_option = opt.state_dict()
    bad_option["param_groups"][0]["betas"] = [0.9, 1.5]
    sgd_dict = SGD(params, lr=0.1, momentum=0.9).state_dict()
    for bad in (bad_shape, bad_entry, bad_groups, bad_option, sgd_dict, {"state": {}}):
        with pytest.raises(OptimizerError):
            opt.load_state_dict(bad)
        after = opt.state_dict()
        assert after["param_groups"] == before["param_groups"]
        for i, entry in before["state"].items():
            for k, v in entry.items():
                np.testing.assert_array_equal(after["state"][i][k], v)


def test_failed_step_changes_nothing(queue, rng):
    hosts, params = make_params(queue, rng)
    opt = Adam(params, lr=0.1)
    params[0].grad = pc.Tensor.from_host(queue, np.ones(SHAPES[0], np.float32))
    params[2].grad = pc.Tensor.from_host(queue, np.ones((3, 3), np.float32))   # wrong shape
    with pytest.raises(pc.ShapeError, match=r"\(3, 3\)"):
        opt.step()
    assert opt.state == {}
    for h, p in zip(hosts, params):
        np.testing.assert_array_equal(p.to_host(), h)


def test_option_validation(queue, rng):
    _, params = make_params(queue, rng)
    with pytest.raises(ValueError, match="lr"):
        SGD(params, lr=-0.1)
    with pytest.raises(OptimizerError, match="beta"):
        Adam(params, betas=(0.9, 1.0))
    with pytest.raises(OptimizerError, match="beta"):
        AdamW(params, betas=(-0.1, 0.9))
    with pytest.raises(OptimizerError, match="nesterov"):
        SGD(params, lr=0.1, nesterov=True)
    with pytest.raises(OptimizerError, match="empty"):
        Adam([])
    with pytest.raises(OptimizerError, match="more than once"):
        Adam([params[0], params[0]])
    with pytest.raises(TypeError):
        Adam([pc.Tensor.zeros(queue, (3,))])
    assert issubclass(OptimizerError, pc.ParclError)


def test_param_groups_with_own_options(queue, rng):
    hosts, params = make_params(queue, rng)
    opt = SGD([{"params": params[:2]}, {"params": params[2:], "lr": 0.0}], lr=0.1)
    for p in params:
        p.grad = pc.Tensor.from_host(queue, np.ones(p.shape, np.float32))
    opt.step()
    np.testing.assert_allclose(params[0].to_host(), hosts[0] - 0.1, rtol=1e-6)
    np.testing.assert_array_equal(params[3].to_host(), hosts[3])
    assert [g["params"] for g in opt.state_dict()["param_groups"]] == [[0, 1], [2, 3]]


def test_step_on_two_queues(queues2, rng):
    """Parameters on different queues are each updated on their own queue."""
    q0, q1 = queues2
    h = [rng.standard_normal(9).astype(np.float32) for _ in range(2)]
    params = [pc.nn.Parameter.from_host(q0, h[0]), pc.nn.Parameter.from_host(q1, h[1])]
    opt = AdamW(params, lr=0.1)
    g = rng.standard_normal(9).astype(np.float32)
    params[0].grad = pc.Tensor.from_host(q0, g)
    params[1].grad = pc.Tensor.from_host(q1, g)
    opt.step()
    for hi, p in zip(h, params):
        want, _, _ = adam_ref(hi, [g], 0.1, (0.9, 0.999), 1e-8, 0.01, decoupled=True)
        np.testing.assert_allclose(p.to_host(), want, rtol=1e-5, atol=1e-6)


# -- the replicated update (the sharded end of a ReplicaGroup step) ---------------------------
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("update", ["sgd", "sgd_momentum", "adam"])
def test_replicated_update_sums_steps_broadcasts_and_zeroes(queues2, rng, update, k):
    """``name_xK`` over uneven chunks on two queues: replica 0's parameter becomes the update
    of the summed gradients (numpy reference), every replica gets the same values, every
    gradient is zeroed, and the state is updated once (``name_x1``: one replica's update
    with its gradient zeroed)."""
    from parcl.kernels import optim as K

    n = 1031
    q0, q1 = queues2
    queues = [q0, q1, q0][:k]
    host_p = rng.standard_normal(n, dtype=np.float32)
    host_g = [rng.standard_normal(n, dtype=np.float32) for _ in range(k)]
    ps = [pc.Tensor.from_host(q, host_p if r == 0 else np.zeros(n, np.float32))
          for r, q in enumerate(queues)]
    gs = [pc.Tensor.from_host(q, g) for q, g in zip(queues, host_g)]
    total = host_g[0]
    for g in host_g[1:]:
        total = total + g                      # replica order, float32
    split = K.Replicated(ps, gs, [(q0, 0, 400), (q1, 400, n - 400)])
    lr, wd = np.float32(0.1), np.float32(0.01)
    q0.finish()                # the caller orders the queues (ReplicaGroup: with barriers)
    q1.finish()
    if update == "sgd":
        K.sgd_(ps[0], gs[0], lr, wd, target=split)
        want, state = host_p - lr * (total + wd * host_p), []
    elif update == "sgd_momentum":
        buf = pc.Tensor.from_host(q0, np.ones(n, np.float32))
        q0.finish()
        K.sgd_momentum_(ps[0], gs[0], buf, lr, wd, 0.9, False, False, target=split)
        b = 0.9 * np.ones(n, np.float32) + (total + wd * host_p)
        want, state = host_p - lr * b, [(buf, b)]
    else:
        m = pc.Tensor.zeros(q0, (n,))
        v = pc.Tensor.zeros(q0, (n,))
        q0.finish()
        K.adam_(ps[0], gs[0], m, v, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, step=1,
                weight_decay=0.0, target=split)
        d = total
        mh, vh = 0.1 * d, 0.001 * d * d
        want = host_p - 1e-3 * (mh / 0.1) / (np.sqrt(vh / 0.001) + 1e-8)
        state = [(m, mh), (v, vh)]
    q0.finish()
    q1.finish()
    got = [p.to_host() for p in ps]
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)
    assert all(np.array_equal(g, got[0]) for g in got[1:])
    assert all(not g.to_host().any() for g in gs)
    for t, ref in state:
        np.testing.assert_allclose(t.to_host(), ref, rtol=1e-5, atol=1e-7)


def test_replicated_update_checks_its_buffers(queue):
    from parcl.kernels import optim as K

    a, b = pc.Tensor.zeros(queue, (8,)), pc.Tensor.zeros(queue, (9,))
    with pytest.raises(pc.ShapeError, match="8 float32 elements"):
        K.Replicated([a, b], [a, b], [(queue, 0, 8)])
    with pytest.raises(pc.ShapeError, match="2 parameter buffers but 1"):
        K.Replicated([a, a], [a], [(queue, 0, 8)])
    with pytest.raises(pc.ShapeError, match="1..8 replicas, got 9"):
        K.sgd_(a, a, 0.1, target=K.Replicated([a] * 9, [a] * 9, [(queue, 0, 8)]))
