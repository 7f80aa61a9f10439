"""permute, movedim, t, squeeze, unsqueeze, flatten, unflatten and the PyTorch-style Node
methods: forward against numpy float64, gradients against finite differences and against
PyTorch, zero-copy views where only the shape changes, and the errors PyTorch raises."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from conftest import leaf
from torch_reference import against_torch, raises_like_torch

PERMUTES = [((2, 3, 4), (2, 0, 1)), ((2, 3, 4), (-1, 0, -2)), ((3, 1, 2), (1, 2, 0)),
            ((5,), (0,)), ((), ()), ((1, 1), (1, 0)), ((2, 1, 3, 1), (3, 2, 1, 0)),
            ((2, 3, 1, 2, 1, 2, 1), (6, 5, 4, 3, 2, 1, 0))]


@pytest.mark.parametrize("shape,dims", PERMUTES, ids=[f"{s}-{d}" for s, d in PERMUTES])
def test_permute(queue, rng, shape, dims):
    a = rng.standard_normal(shape)
    x = leaf(queue, a)
    with tp.Tape():
        y = tp.permute(x, dims)
    assert y.op_name == "permute"
    np.testing.assert_array_equal(y.to_host(), np.transpose(a, dims).astype(np.float32))
    assert tp.gradcheck(lambda v: tp.permute(v, dims), [x])
    against_torch(queue, rng, lambda v: tp.permute(v, dims), lambda v: v.permute(dims), [a])


def test_permute_int64_and_views(queue):
    """8-byte dtypes permute through the strided copy; moving only size-1 dims is a view of
    the same buffer (marked as an alias of its input, as reshape's output is)."""
    ints = np.arange(24).reshape(2, 3, 4)
    t = pc.Tensor.from_host(queue, ints)
    np.testing.assert_array_equal(tp.permute(t, (2, 0, 1)).to_host(), ints.transpose(2, 0, 1))
    x = leaf(queue, np.ones((2, 1, 3)))
    with tp.Tape():
        v = tp.permute(x, (1, 0, 2))
        c = tp.permute(x, (2, 1, 0))
    assert v.value.data is x.value.data and v.entry.alias == 0
    assert c.value.data is not x.value.data and c.entry.alias is None


MOVES = [((2, 3, 4), 0, -1), ((2, 3, 4), (0, 1), (2, 0)), ((2, 3, 4), -1, 0),
         ((1, 5), (1, 0), (0, 1)), ((3,), 0, 0), ((2, 3, 4, 5), (3, 1), (0, 2))]


@pytest.mark.parametrize("shape,src,dst", MOVES, ids=[str(m) for m in MOVES])
def test_movedim(queue, rng, shape, src, dst):
    a = rng.standard_normal(shape)
    x = leaf(queue, a)
    y = tp.movedim(x, src, dst)
    assert y.op_name == "movedim"
    np.testing.assert_array_equal(y.to_host(), np.moveaxis(a, src, dst).astype(np.float32))
    assert tp.gradcheck(lambda v: tp.movedim(v, src, dst), [x])
    against_torch(queue, rng, lambda v: tp.movedim(v, src, dst),
                  lambda v: torch.movedim(v, src, dst), [a])


@pytest.mark.parametrize("shape", [(2, 3), (1, 4), (5,), ()])
def test_t(queue, rng, shape):
    a = rng.standard_normal(shape)
    x = leaf(queue, a)
    y = tp.t(x)
    assert y.op_name == "t"
    np.testing.assert_array_equal(y.to_host(), a.T.astype(np.float32))
    assert tp.gradcheck(tp.t, [x])
    against_torch(queue, rng, tp.t, torch.t, [a])
    if len(shape) < 2:                              # 0-D and 1-D: the same buffer
        assert y.value.data is x.value.data


VIEWS = [
    ("squeeze", (2, 1, 3, 1), {}, lambda a: np.squeeze(a)),
    ("squeeze", (2, 1, 3, 1), {"dim": -1}, lambda a: np.squeeze(a, -1)),
    ("squeeze", (2, 1, 3, 1), {"dim": (1, 3)}, lambda a: np.squeeze(a, (1, 3))),
    ("squeeze", (2, 1, 3), {"dim": 0}, lambda a: a),           # not size 1: unchanged
    ("squeeze", (1, 1), {}, lambda a: np.squeeze(a)),          # to 0-d
    ("squeeze", (), {"dim": -1}, lambda a: a),
    ("unsqueeze", (2, 3), {"dim": 0}, lambda a: a[None]),
    ("unsqueeze", (2, 3), {"dim": -1}, lambda a: a[..., None]),
    ("unsqueeze", (2, 3), {"dim": -2}, lambda a: a[:, None]),
    ("unsqueeze", (), {"dim": 0}, lambda a: a[None]),
    ("flatten", (2, 3, 4), {}, lambda a: a.reshape(-1)),
    ("flatten", (2, 3, 4, 1), {"start_dim": 1, "end_dim": -2}, lambda a: a.reshape(2, 12, 1)),
    ("flatten", (2, 3), {"start_dim": -1}, lambda a: a),
    ("flatten", (), {}, lambda a: a.reshape(1)),
    ("unflatten", (2, 6), {"dim": 1, "sizes": (3, 2)}, lambda a: a.reshape(2, 3, 2)),
    ("unflatten", (6, 2), {"dim": -2, "sizes": (-1, 1, 3)}, lambda a: a.reshape(2, 1, 3, 2)),
    ("unflatten", (4,), {"dim": 0, "sizes": (4,)}, lambda a: a),
]


@pytest.mark.parametrize("op,shape,kw,ref", VIEWS, ids=[f"{v[0]}-{v[1]}-{v[2]}" for v in VIEWS])
def test_views(queue, rng, op, shape, kw, ref):
    a = rng.standard_normal(shape)
    x = leaf(queue, a)
    fn = getattr(tp, op)
    with tp.Tape():
        y = fn(x, **kw)
    assert y.op_name == op
    want = ref(a)
    assert y.shape == want.shape
    np.testing.assert_array_equal(y.to_host(), want.astype(np.float32))
    assert y.value.data is x.value.data and y.entry.alias == 0       # a view, no copy
    assert tp.gradcheck(lambda v: fn(v, **kw), [x])
    against_torch(queue, rng, lambda v: fn(v, **kw), lambda v: getattr(torch, op)(v, **kw), [a])


def test_inplace_through_a_view_is_tracked(queue):
    """An in-place op on a view of a leaf that requires grad is refused, as for reshape."""
    x = leaf(queue, np.array([[-1.0, 2.0]]))
    with pytest.raises(pc.ParclError, match="through a view of it: squeeze"):
        tp.relu(tp.squeeze(x, 0), inplace=True)


def test_a_node_views_and_reshapes_to_one_numpy_integer_size_as_pytorch(queue):
    # x.view(np.prod(x.shape)) (a numpy int64) flattens in PyTorch; it was taken for a shape
    # sequence: TypeError 'numpy.int64' object is not iterable
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = leaf(queue, a)
    assert x.view(np.prod(x.shape)).shape == (6,) == x.reshape(np.int64(6)).shape
    assert x.view(np.int32(-1)).shape == tuple(torch.tensor(a).view(np.int32(-1)).shape)
    np.testing.assert_array_equal(x.reshape(np.int64(6)).to_host(), a.reshape(6))


def test_node_methods(queue, rng):
    a = rng.standard_normal((2, 1, 3))
    x = leaf(queue, a)
    assert x.permute(2, 0, 1).shape == x.permute((2, 0, 1)).shape == (3, 2, 1)
    assert x.permute(np.int64(0), 1, 2).shape == (2, 1, 3)
    np.testing.assert_array_equal(x.squeeze().t().to_host(), a.squeeze().T.astype(np.float32))
    np.testing.assert_array_equal(x.T.to_host(), a.T.astype(np.float32))
    assert x.unsqueeze(-1).shape == (2, 1, 3, 1) and x.flatten().shape == (6,)
    assert x.flatten(1).shape == (2, 3) and x.unflatten(2, (3, 1)).shape == (2, 1, 3, 1)
    assert x.view(-1).shape == (6,) and x.view(3, 2).shape == (3, 2)
    assert x.movedim(0, -1).shape == (1, 3, 2)
    assert [c.shape for c in x.chunk(2, -1)] == [(2, 1, 2), (2, 1, 1)]
    assert [u.shape for u in x.unbind(2)] == [(2, 1)] * 3
    assert x.narrow(2, 1, 2).shape == (2, 1, 2) and x.repeat(1, 2, 1).shape == (2, 2, 3)
    t = torch.tensor(a, requires_grad=True)
    with tp.Tape() as tape:
        y = (x.permute(2, 0, 1).flatten(1) * 2.0).t().unsqueeze(0).squeeze(0)
        loss = tp.sum(y * y)
    tape.backward(loss)
    ty = (t.permute(2, 0, 1).flatten(1) * 2.0).t().unsqueeze(0).squeeze(0)
    (ty * ty).sum().backward()
    np.testing.assert_allclose(x.grad.to_host(), t.grad.numpy(), rtol=1e-5)


def test_raw_tensors_stay_unrecorded(queue, rng):
    t = pc.Tensor.from_host(queue, rng.standard_normal((2, 3)).astype(np.float32))
    with tp.Tape() as tape:
        outs = [tp.permute(t, (1, 0)), tp.squeeze(t), tp.unsqueeze(t, 1), tp.flatten(t),
                tp.unflatten(t, 1, (3, 1)), tp.movedim(t, 0, 1), tp.t(t)]
    assert all(isinstance(o, pc.Tensor) for o in outs) and not tape.nodes


X = np.zeros((2, 3), np.float32)
ERRORS = [
    ("permute", lambda x: tp.permute(x, (0, 1, 2)), lambda t: t.permute(0, 1, 2)),
    ("permute", lambda x: tp.permute(x, (0, 0)), lambda t: t.permute(0, 0)),
    ("permute", lambda x: tp.permute(x, (0, 2)), lambda t: t.permute(0, 2)),
    ("movedim", lambda x: tp.movedim(x, (0, 1), (0,)), lambda t: t.movedim((0, 1), (0,))),
    ("movedim", lambda x: tp.movedim(x, (0, 0), (0, 1)), lambda t: t.movedim((0, 0), (0, 1))),
    ("movedim", lambda x: tp.movedim(x, 0, 2), lambda t: t.movedim(0, 2)),
    ("t", lambda x: tp.t(tp.unsqueeze(x, 0)), lambda t: t.unsqueeze(0).t()),
    ("squeeze", lambda x: tp.squeeze(x, 2), lambda t: t.squeeze(2)),
    ("squeeze", lambda x: tp.squeeze(x, (0, 0)), lambda t: t.squeeze((0, 0))),
    ("squeeze", lambda x: tp.squeeze(x, 1.0), lambda t: t.squeeze(1.0)),
    ("unsqueeze", lambda x: tp.unsqueeze(x, 3), lambda t: t.unsqueeze(3)),
    ("unsqueeze", lambda x: tp.unsqueeze(x, -4), lambda t: t.unsqueeze(-4)),
    ("flatten", lambda x: tp.flatten(x, 1, 0), lambda t: t.flatten(1, 0)),
    ("flatten", lambda x: tp.flatten(x, 2), lambda t: t.flatten(2)),
    ("unflatten", lambda x: tp.unflatten(x, 1, (2, 2)), lambda t: t.unflatten(1, (2, 2))),
    ("unflatten", lambda x: tp.unflatten(x, 1, ()), lambda t: t.unflatten(1, ())),
    ("unflatten", lambda x: tp.unflatten(x, 1, (-1, -1)), lambda t: t.unflatten(1, (-1, -1))),
    ("unflatten", lambda x: tp.unflatten(x, 1, (0, -1)), lambda t: t.unflatten(1, (0, -1))),
    ("unflatten", lambda x: tp.unflatten(x, 2, (3,)), lambda t: t.unflatten(2, (3,))),
    ("unflatten", lambda x: tp.unflatten(x[0, 0], 0, (1,)), lambda t: t[0, 0].unflatten(0, (1,))),
]


@pytest.mark.parametrize("op,tp_call,torch_call", ERRORS,
                         ids=[f"{e[0]}-{i}" for i, e in enumerate(ERRORS)])
def test_errors_like_torch(queue, op, tp_call, torch_call):
    x = leaf(queue, X)
    message = raises_like_torch(lambda: tp_call(x), lambda: torch_call(torch.tensor(X)), op)
    assert "(2, 3)" in message or "()" in message or "dim" in message
