"""Helpers for the transformer tests: run a torch module and the parcl module loaded with its
state dict on the same inputs, and compare outputs, input gradients and every parameter's
gradient after the same loss (sum of each output times a fixed random array)."""

from __future__ import annotations

import numpy as np
import torch

import parcl as pc
import parcl.tape as tp


def load_torch(pmod, tmod) -> None:
    pmod.load_state_dict({k: v.detach().numpy() for k, v in tmod.state_dict().items()})


def _tuple(out):
    return tuple(out) if isinstance(out, tuple) else (out,)


def compare(queue, tmod, pmod, inputs, t_call, p_call, tol=2e-5):
    """``t_call(tmod, *torch_inputs)`` against ``p_call(pmod, *parcl_inputs)``: the same
    outputs (None where torch gives None), input gradients and parameter gradients.
    Returns the parcl outputs (host arrays, None kept)."""
    load_torch(pmod, tmod)
    xt = [torch.tensor(a, requires_grad=True) for a in inputs]
    xp = [tp.tensor(pc.Tensor.from_host(queue, a), True) for a in inputs]
    out_t = _tuple(t_call(tmod, *xt))
    rng = np.random.default_rng(1)
    weights = [None if o is None else rng.standard_normal(tuple(o.shape)).astype(np.float32)
               for o in out_t]
    with tp.Tape() as tape:
        out_p = _tuple(p_call(pmod, *xp))
        assert len(out_p) == len(out_t)
        terms = [tp.sum(tp.mul(o, pc.Tensor.from_host(queue, w)))
                 for o, w in zip(out_p, weights) if w is not None and o is not None]
        loss = terms[0]
        for t in terms[1:]:
            loss = tp.add(loss, t)
    tape.backward(loss)
    sum((o * torch.tensor(w)).sum() for o, w in zip(out_t, weights) if o is not None).backward()
    hosts = []
    for o_p, o_t in zip(out_p, out_t):
        assert (o_p is None) == (o_t is None), (o_p, o_t)
        if o_p is None:
            hosts.append(None)
            continue
        got = o_p.to_host()
        np.testing.assert_allclose(got, o_t.detach().numpy(), rtol=tol, atol=tol)
        hosts.append(got)
    for a, b in zip(xp, xt):
        np.testing.assert_allclose(a.grad.to_host(), b.grad.numpy(), rtol=tol, atol=tol)
    tgrads = {n: p.grad for n, p in tmod.named_parameters()}
    pnames = [n for n, _ in pmod.named_parameters()]
    assert pnames == list(tgrads), (pnames, list(tgrads))
    for name, p in pmod.named_parameters():
        want = tgrads[name]
        if want is None:          # torch never used it (a bias after a fully masked row...)
            assert p.grad is None or not np.any(p.grad.to_host()), name
            continue
        np.testing.assert_allclose(p.grad.to_host(), want.numpy(), rtol=tol, atol=tol,
                                   err_msg=name)
    return hosts
