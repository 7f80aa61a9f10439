"""The same op in parcl and in PyTorch on the same inputs: outputs, gradients for the same
upstream gradient, and errors where PyTorch raises (tests of the PyTorch-named ops)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from conftest import leaf, up


def _scalar_loss_tp(queue, out, weights):
    """A weighted sum of ``out`` (a Node or a tuple of them) as one scalar Node."""
    pieces = out if isinstance(out, tuple) else (out,)
    total = None
    for p, w in zip(pieces, weights):
        term = tp.sum(p * pc.Tensor.from_host(queue, w))
        total = term if total is None else total + term
    return total


def against_torch(queue, rng, tp_fn, torch_fn, arrays, tol=1e-5, grads=True):
    """``tp_fn(*nodes)`` equals ``torch_fn(*tensors)`` (values and shapes, tuples piece by
    piece) and, with ``grads``, so do the inputs' gradients of one random weighted sum."""
    arrays = [np.asarray(a, np.float32) for a in arrays]
    nodes = [leaf(queue, a) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    with tp.Tape() as tape:
        out = tp_fn(*nodes)
        want = torch_fn(*ts)
        outs = out if isinstance(out, tuple) else (out,)
        wants = tuple(want) if isinstance(want, (tuple, list)) else (want,)
        assert len(outs) == len(wants)
        for o, w in zip(outs, wants):
            assert o.shape == tuple(w.shape), (o.shape, tuple(w.shape))
            np.testing.assert_allclose(o.to_host(), w.detach().numpy(), rtol=tol, atol=tol)
        if not grads:
            return out
        weights = [rng.standard_normal(tuple(w.shape)).astype(np.float32) for w in wants]
        loss = _scalar_loss_tp(queue, out, weights)
    tape.backward(loss)
    sum(torch.sum(w * torch.from_numpy(g)) for w, g in zip(wants, weights)).backward()
    for n, t in zip(nodes, ts):
        got = np.zeros(n.shape, np.float32) if n.grad is None else n.grad.to_host()
        np.testing.assert_allclose(got, t.grad.numpy(), rtol=tol, atol=tol)
    return out


def check_as_torch(ours, theirs, arrays, rng, tol=1e-5, grad_tol=None):
    """``ours(*nodes)`` and ``theirs(*tensors)`` agree (shapes, values to ``tol``), and so do
    every input's gradients (to ``grad_tol``, else ``tol``) for one random upstream
    gradient."""
    grad_tol = tol if grad_tol is None else grad_tol
    nodes = [leaf(pc.default_queue(), a) for a in arrays]
    tensors = [torch.tensor(a, requires_grad=True) for a in arrays]
    with tp.Tape() as tape:
        y = ours(*nodes)
    want = theirs(*tensors)
    assert y.shape == tuple(want.shape)
    np.testing.assert_allclose(y.to_host(), want.detach().numpy(), rtol=tol, atol=tol)
    g = rng.standard_normal(y.shape).astype(np.float32)
    tape.backward(y, grad=pc.Tensor.from_host(pc.default_queue(), g))
    want.backward(torch.from_numpy(g))
    for node, tensor in zip(nodes, tensors):
        np.testing.assert_allclose(node.grad.to_host(), tensor.grad.numpy(), rtol=grad_tol,
                                   atol=grad_tol)


def raises_like_torch(tp_call, torch_call, op: str):
    """PyTorch refuses ``torch_call`` and parcl refuses ``tp_call`` with a ParclError (or a
    TypeError for a wrong argument type) whose message names ``op``."""
    with pytest.raises((RuntimeError, IndexError, ValueError, TypeError)):
        torch_call()
    with pytest.raises((pc.ParclError, TypeError)) as err:
        tp_call()
    assert op in str(err.value), str(err.value)
    return str(err.value)


def float64_reference(queue, rng, fn, tfn, arrays):
    """``fn`` at ``arrays`` and torch's ``tfn`` in float64, each backwarded from the same
    random upstream gradient: (our output Node, our gradients, torch's value, its gradients)."""
    ts = [torch.tensor(a.astype(np.float64), requires_grad=True) for a in arrays]
    want = tfn(*ts)
    g = rng.standard_normal(tuple(want.shape)).astype(np.float32)
    want.backward(torch.tensor(g.astype(np.float64)))
    nodes = [leaf(queue, a) for a in arrays]
    with tp.Tape() as tape:
        out = fn(*nodes)
    tape.backward(out, grad=up(queue, g))
    return (out, [n.grad.to_host() for n in nodes], want.detach().numpy(),
            [t.grad.numpy() for t in ts])


def check_float64(queue, rng, fn, tfn, arrays, tol):
    """``fn``'s value (and shape) and gradients at ``arrays`` equal torch's in float64 within
    ``tol``, for one random upstream gradient."""
    out, grads, want, want_grads = float64_reference(queue, rng, fn, tfn, arrays)
    assert out.shape == want.shape
    np.testing.assert_allclose(out.to_host(), want, rtol=tol, atol=tol)
    for got, w in zip(grads, want_grads):
        np.testing.assert_allclose(got, w, rtol=tol, atol=tol)
