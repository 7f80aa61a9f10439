"""More ops that gave wrong numbers without raising: each test the reproducer of one case,
with what parcl gave and what PyTorch gives."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from conftest import leaf


def test_addcmul_and_addcdiv_weigh_tensor1_first_so_no_overflow_as_pytorch(queue):
    """PyTorch computes ``input + (value * tensor1) * tensor2`` (addcdiv: ``(value *
    tensor1) / tensor2``), so ``addcmul(1, 1e20, 1e20, value=1e-30)`` is 1e10 and
    ``addcdiv(1, 1e30, 1e-30, value=1e-30)`` is 1e30. parcl formed the product (quotient)
    first, inf in float32, and weighed it after: both gave inf, silently. Gradients reach
    all three inputs as PyTorch's."""
    ones = np.ones(3, np.float32)
    cases = [("addcmul", [1e20, 3e19, 2.0], [1e20, 2e19, -0.5]),
             ("addcdiv", [1e30, 3.0, -1.0], [1e-30, 7.0, 4.0])]
    for name, a, b in cases:
        x, t1, t2 = leaf(queue, ones), leaf(queue, a), leaf(queue, b)
        with tp.Tape() as tape:
            out = getattr(tp, name)(x, t1, t2, value=1e-30)
        tape.backward(tp.sum(out))
        ts = [torch.tensor(np.asarray(v, np.float32), requires_grad=True)
              for v in (ones, a, b)]
        want = getattr(torch, name)(*ts, value=1e-30)
        want.sum().backward()
        got = out.to_host()
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-6)
        for n, t in zip((x, t1, t2), ts):
            np.testing.assert_allclose(n.grad.to_host(), t.grad.numpy(), rtol=1e-6)


def test_all_and_any_over_no_dims_are_elementwise_as_pytorch(queue):
    """``torch.all(x, dim=())`` reduces no dim: ``x != 0`` elementwise, as a per-sample check
    over the trailing dims ``dim=tuple(range(1, x.ndim))`` of a 1-D batch gives. parcl read
    ``dim=()`` as every dim (amax's and sum's rule there), so ``tp.all`` of ``[1, 0, 2]``
    over no dims was the 0-d ``0.0`` where PyTorch gives ``[True, False, True]``, silently."""
    x = np.array([[0.0, 1.0, np.nan], [2.0, -0.0, 4.0]], np.float32)
    for name in ("all", "any"):
        for dim in ((), []):
            for keepdim in (False, True):
                want = getattr(torch, name)(torch.from_numpy(x), dim=dim, keepdim=keepdim)
                got = getattr(tp, name)(leaf(queue, x), dim, keepdim)
                np.testing.assert_array_equal(got.to_host(), want.float().numpy())
        assert getattr(leaf(queue, x), name)(()).shape == (2, 3)        # the Node method
    batch = leaf(queue, [1.0, 0.0, 2.0])
    np.testing.assert_array_equal(tp.all(batch, tuple(range(1, 1))).to_host(), [1, 0, 1])


def test_diff_of_order_0_leaves_prepend_and_append_out_as_pytorch(queue):
    """``torch.diff(x, n=0, prepend=p, append=a)`` is ``x`` itself (numpy's too): no
    difference is taken, so nothing is joined. parcl joined them, so ``diff([1, 2, 4], 0,
    prepend=[0])`` was ``[0, 1, 2, 4]`` where PyTorch gives ``[1, 2, 4]``, silently."""
    x = np.array([[1.0, 2.0, 4.0], [3.0, 5.0, 9.0]], np.float32)
    pre, post = np.zeros((2, 1), np.float32), np.ones((2, 2), np.float32)
    want = torch.diff(torch.from_numpy(x), n=0, dim=1, prepend=torch.from_numpy(pre),
                      append=torch.from_numpy(post))
    node = leaf(queue, x)
    with tp.Tape() as tape:
        got = tp.diff(node, 0, 1, leaf(queue, pre), leaf(queue, post))
    tape.backward(tp.sum(got))
    np.testing.assert_array_equal(got.to_host(), want.numpy())
    np.testing.assert_array_equal(node.grad.to_host(), np.ones_like(x))
    np.testing.assert_array_equal(node.diff(0, append=leaf(queue, post)).to_host(), x)
    np.testing.assert_array_equal(tp.diff(node, 1, 1, leaf(queue, pre)).to_host(),
                                  np.diff(x, 1, 1, prepend=pre))       # n=1 joins as before


def test_masked_fill_with_a_0d_node_value_gives_it_its_gradient_as_pytorch(queue):
    """``x.masked_fill(mask, v)`` with ``v`` a 0-d tensor that requires grad (a learned fill,
    PyTorch's ``masked_fill(mask, self.pad_value)``) gives ``v`` the sum of the upstream
    gradient where the mask is True. parcl read ``v`` as a float, a constant, so with
    ``x = [[0, 1, 2], [3, 4, 5]]``, ``v = 2.5`` and the loss ``sum(out ** 2)`` ``v.grad`` was
    None where PyTorch gives 15, silently. A value of more than 0 dims is refused, as
    PyTorch's."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    mask = np.array([[1, 0, 1], [0, 0, 1]], np.float32)
    nx, nv = leaf(queue, x), leaf(queue, np.float32(2.5))
    with tp.Tape() as tape:
        out = nx.masked_fill(tp.tensor(mask), nv)
        loss = tp.sum(out * out)
    tape.backward(loss)
    tx = torch.tensor(x, requires_grad=True)
    tv = torch.tensor(2.5, requires_grad=True)
    want = tx.masked_fill(torch.tensor(mask > 0), tv)
    (want * want).sum().backward()
    np.testing.assert_array_equal(out.to_host(), want.detach().numpy())
    np.testing.assert_array_equal(nx.grad.to_host(), tx.grad.numpy())
    assert float(tv.grad) == 15.0
    np.testing.assert_array_equal(nv.grad.to_host(), tv.grad.numpy())
    with pytest.raises(pc.ShapeError, match=r"masked_fill: value must be a number or a 0-d "
                                            r"tensor.*got shape \(1,\) \(input \(2, 3\)\)"):
        tp.masked_fill(nx, mask, tp.tensor(np.array([2.5], np.float32)))


def test_maximum_and_minimum_split_a_tie_gradient_half_and_half_as_pytorch(queue):
    """``torch.maximum(a, b)`` gives each side half the gradient where ``a == b``: a learnt
    floor ``b = 2`` (0-d) under ``a = [1, 2, 2, 3]`` gets ``1 + 0.5 + 0.5 = 2`` and ``a``
    ``[0, 0.5, 0.5, 1]``. parcl gave a tie's whole gradient to ``a``: ``b.grad`` was 1 and
    ``a.grad`` ``[0, 1, 1, 1]``, silently (minimum alike; equal infinities are ties too, NaN
    still passes to both). A number is a bound, as ``torch.clamp_min``: the whole gradient."""
    import torch
    inf, nan = float("inf"), float("nan")
    cases = [([1.0, 2.0, 2.0, 3.0], 2.0),
             ([inf, -inf, 0.0, -0.0, nan, 5.0], [inf, -inf, -0.0, 0.0, 1.0, 5.0])]
    for name in ("maximum", "minimum"):
        for a, b in cases:
            x, y = leaf(queue, a), leaf(queue, b)
            with tp.Tape() as tape:
                out = getattr(tp, name)(x, y)
            tape.backward(tp.sum(out * 3.0))
            tx, ty = (torch.tensor(v, requires_grad=True) for v in (a, b))
            (getattr(torch, name)(tx, ty) * 3.0).sum().backward()
            np.testing.assert_array_equal(out.to_host(), getattr(torch, name)(tx, ty).detach())
            np.testing.assert_array_equal(x.grad.to_host(), tx.grad.numpy())
            np.testing.assert_array_equal(y.grad.to_host(), ty.grad.numpy())
    x = leaf(queue, [1.0, 2.0, 2.0, 3.0])
    with tp.Tape() as tape:
        out = tp.maximum(x, 2.0) + tp.minimum(2.0, x)
    tape.backward(tp.sum(out))
    np.testing.assert_array_equal(x.grad.to_host(), [1.0, 2.0, 2.0, 1.0])   # clamp's
