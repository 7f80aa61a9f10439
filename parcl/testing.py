"""Helpers for users' own tests of data-parallel training.

>>> from parcl.testing import assert_dp_equivalent
>>> assert_dp_equivalent(lambda q: pc.nn.Linear(64, 10, queue=q), tp.cross_entropy, (x, y))
"""

from __future__ import annotations

import numpy as np

from . import runtime
from .errors import ParclError
from .replica import ReplicaGroup
from .tape import Tape, tensor
from .tensor import Tensor


def _default_optimizer(params):
    from .optim import SGD
    return SGD(params, lr=0.05, momentum=0.9)


def train_single(build_model, loss_fn, batch, steps: int = 3, make_optimizer=None,
                 device=None) -> list[np.ndarray]:
    """The reference: ``steps`` full-batch steps in the calling thread on one queue, no
    replicas involved. Returns the final parameters as numpy arrays."""
    make_optimizer = make_optimizer or _default_optimizer
    queue = runtime.new_queue(device if device is not None else runtime.devices()[0])
    model = build_model(queue)
    opt = make_optimizer(model.parameters())
    x, y = batch
    for _ in range(steps):
        xt = tensor(Tensor.from_host(queue, np.asarray(x)))
        yt = Tensor.from_host(queue, np.asarray(y))
        with Tape() as tape:
            loss = loss_fn(model(xt), yt)
        tape.backward(loss)
        opt.step()
        opt.zero_grad()
        tape.release()
    return [p.value.to_host() for p in model.parameters()]


def train_replicated(build_model, loss_fn, batch, steps: int = 3, replicas: int = 2,
                     make_optimizer=None, devices=None, **group_options) -> list[np.ndarray]:
    """``steps`` data-parallel steps of the same global batch with ``replicas`` replicas."""
    make_optimizer = make_optimizer or _default_optimizer
    devs = devices if devices is not None else runtime.devices(split=replicas)
    with ReplicaGroup(build_model, devs, **group_options) as group:
        opt = make_optimizer(group.parameters())
        for _ in range(steps):
            group.step(batch[0], batch[1], loss_fn, opt)
        return [p.value.to_host() for p in group.parameters()]


def seeded(build_model, seed: int = 0):
    """``build_model`` with ``pc.nn.manual_seed(seed)`` first: the same initial parameters in
    whichever thread it runs."""
    def build(queue):
        from .nn import manual_seed
        manual_seed(seed)
        return build_model(queue)
    return build


def assert_dp_equivalent(build_model, loss_fn, batch, replicas: int = 2, steps: int = 3,
                         make_optimizer=None, rtol: float = 1e-4, atol: float = 1e-6,
                         seed: int = 0, **group_options) -> None:
    """Check that a data-parallel run over ``replicas`` replicas ends with the same parameters
    (within float32 tolerance) as the single-replica run on the same global batch.

    ``build_model(queue)`` is called after ``pc.nn.manual_seed(seed)``, so both runs start
    from the same parameters; ``make_optimizer(params)`` defaults to SGD with momentum.
    Raises ``ParclError`` naming the first parameter that differs.
    """
    build_model = seeded(build_model, seed)
    ref = train_single(build_model, loss_fn, batch, steps, make_optimizer)
    got = train_replicated(build_model, loss_fn, batch, steps, replicas, make_optimizer,
                           **group_options)
    for i, (a, b) in enumerate(zip(ref, got)):
        if a.shape != b.shape or not np.allclose(b, a, rtol=rtol, atol=atol):
            worst = float(np.max(np.abs(a - b))) if a.shape == b.shape else float("nan")
            raise ParclError(f"assert_dp_equivalent: parameter {i} {a.shape} differs after "
                             f"{steps} steps with {replicas} replicas (max abs diff {worst:.3g}"
                             f", rtol {rtol})")
