"""``tp.gradcheck``: analytic gradients against central finite differences (Entrenar's
finite-difference validation), evaluated in float64 on the host from float32 forwards."""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from ..errors import GradcheckError
from ..gate import release
from . import mode
from .node import Node
from .tape import Tape


def _objective(out, weights: np.ndarray) -> float:
    value = out.value if isinstance(out, Node) else out
    return float(np.sum(value.to_host().astype(np.float64) * weights))


def gradcheck(fn, inputs, eps: float = 1e-3, atol: float = 1e-3, rtol: float = 1e-3,
              max_elements: int | None = None, seed: int = 0) -> bool:
    """Check ``fn(*inputs)`` (returning a Node) against finite differences.

    Every element of every input Node with ``requires_grad`` is perturbed by ``±eps``, as
    PyTorch's gradcheck does (``max_elements=N`` checks only N of each input's elements,
    chosen with a fixed seed: a quicker, weaker check for big inputs); a non-scalar output is
    reduced with fixed random weights. Returns True, or raises ``GradcheckError`` naming the
    input and the worst element.

    An element fails when ``|analytic - fd| > atol + rtol * |fd|`` (PyTorch's rule). The
    defaults (1e-3, 1e-3) sit just above the float32 finite-difference noise of the project's
    ops (up to ~2e-3 absolute for conv weights, ~1e-4 typically): at 1e-2 a backward 1% off
    (x1.01) passed everywhere and one 2x off passed wherever gradients were below 0.01. An
    error of 1e-3 relative is below what a float32 forward can resolve and is not caught.

    >>> x = tp.tensor(pc.Tensor.from_host(q, np.random.rand(3).astype(np.float32)), True)
    >>> tp.gradcheck(tp.tanh, [x])
    True
    """
    inputs = list(inputs)
    rng = np.random.default_rng(seed)
    saved_grads = [x.grad if isinstance(x, Node) else None for x in inputs]
    try:
        for x in inputs:
            if isinstance(x, Node):
                x.grad = None
        with mode.set_grad_enabled(True), Tape() as tape:
            out = fn(*inputs)
        if not isinstance(out, Node):
            raise GradcheckError("gradcheck: fn returned no graph (raw Tensor): did any input "
                                 "require grad?")
        weights = rng.standard_normal(out.shape).astype(np.float32)
        from ..tensor import Tensor
        tape.backward(out, grad=Tensor.from_host(out.queue, weights.reshape(out.shape)))
        analytic = [x.grad.to_host() if isinstance(x, Node) and x.grad is not None else None
                    for x in inputs]
        tape.release()
        w64 = weights.astype(np.float64)

        for i, x in enumerate(inputs):
            if not (isinstance(x, Node) and x.requires_grad):
                continue
            base = x.value.to_host()
            flat = base.reshape(-1).astype(np.float32)
            picks = np.arange(flat.size)
            if max_elements is not None and flat.size > max_elements:
                picks = np.sort(rng.choice(flat.size, max_elements, replace=False))
            numeric = np.empty(len(picks))
            for j, k in enumerate(picks):
                vals = []
                for sign in (1.0, -1.0):
                    probe = flat.copy()
                    probe[k] = flat[k] + sign * eps
                    release(x.value.queue)
                    cl.enqueue_copy(x.value.queue, x.value.data, probe, is_blocking=True)
                    # evaluate as recorded (a throwaway tape), so fn may use Node operators
                    with mode.set_grad_enabled(True), Tape() as scratch:
                        vals.append(_objective(fn(*inputs), w64))
                    scratch.release()
                numeric[j] = (vals[0] - vals[1]) / (2 * eps)
            release(x.value.queue)
            cl.enqueue_copy(x.value.queue, x.value.data, flat, is_blocking=True)
            got = (analytic[i].reshape(-1)[picks] if analytic[i] is not None
                   else np.zeros(len(picks)))
            err = np.abs(got - numeric) - (atol + rtol * np.abs(numeric))
            # A NaN on either side is a mismatch (as PyTorch's allclose), not "err > 0 is
            # False"; equal infinities match (their difference is NaN too).
            err = np.where(got == numeric, 0.0, np.where(np.isnan(err), np.inf, err))
            worst = int(np.argmax(err))
            if err[worst] > 0:
                idx = np.unravel_index(int(picks[worst]), base.shape)
                raise GradcheckError(
                    f"gradcheck: input {i} (shape {base.shape}) element {tuple(map(int, idx))}: "
                    f"analytic {got[worst]:.6g} vs finite difference {numeric[worst]:.6g} "
                    f"(atol {atol}, rtol {rtol}, eps {eps})")
        return True
    finally:
        for x, g in zip(inputs, saved_grads):
            if isinstance(x, Node):
                x.grad = g
