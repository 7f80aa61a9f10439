"""narrow, chunk, unbind, roll, repeat, tile, tril and triu: forward against numpy float64,
gradients against finite differences and against PyTorch, and the errors PyTorch raises."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from conftest import leaf
from torch_reference import against_torch, raises_like_torch

NARROWS = [((4, 5), 0, 1, 2), ((4, 5), -1, -2, 2), ((4, 5), 1, 0, 5), ((3, 1, 2), 1, 0, 1),
           ((7,), 0, 6, 1), ((2, 3, 4), 2, -4, 3)]


@pytest.mark.parametrize("shape,dim,start,length", NARROWS, ids=[str(n) for n in NARROWS])
def test_narrow(queue, rng, shape, dim, start, length):
    a = rng.standard_normal(shape)
    x = leaf(queue, a)
    y = tp.narrow(x, dim, start, length)
    assert y.op_name == "narrow"
    axis = dim % len(shape)
    begin = start % shape[axis]
    np.testing.assert_array_equal(y.to_host(), np.take(a, range(begin, begin + length),
                                                       axis).astype(np.float32))
    assert tp.gradcheck(lambda v: tp.narrow(v, dim, start, length), [x])
    against_torch(queue, rng, lambda v: tp.narrow(v, dim, start, length),
                  lambda v: torch.narrow(v, dim, start, length), [a])


@pytest.mark.parametrize("shape,chunks,dim", [((5, 2), 2, 0), ((5, 2), 4, 0), ((6,), 4, 0),
                                              ((2, 3), 5, -1), ((2, 7, 1), 3, 1),
                                              ((3, 4), 1, 1)])
def test_chunk(queue, rng, shape, chunks, dim):
    a = rng.standard_normal(shape)
    x = leaf(queue, a)
    pieces = tp.chunk(x, chunks, dim)
    want = torch.chunk(torch.tensor(a), chunks, dim)       # may be fewer than `chunks`
    assert isinstance(pieces, tuple) and len(pieces) == len(want)
    assert all(p.op_name == "chunk" for p in pieces)
    np.testing.assert_array_equal(np.concatenate([p.to_host() for p in pieces], dim),
                                  a.astype(np.float32))
    assert tp.gradcheck(lambda v: tp.cat([p * (i + 1.0) for i, p in
                                          enumerate(tp.chunk(v, chunks, dim))], dim), [x])
    against_torch(queue, rng, lambda v: tp.chunk(v, chunks, dim),
                  lambda v: torch.chunk(v, chunks, dim), [a])


@pytest.mark.parametrize("shape,dim", [((3, 2), 0), ((3, 2), -1), ((2, 1, 4), 1), ((4,), 0)])
def test_unbind(queue, rng, shape, dim):
    a = rng.standard_normal(shape)
    x = leaf(queue, a)
    rows = tp.unbind(x, dim)
    assert len(rows) == shape[dim] and all(r.op_name == "unbind" for r in rows)
    for i, r in enumerate(rows):
        np.testing.assert_array_equal(r.to_host(), np.take(a, i, dim).astype(np.float32))
    assert tp.gradcheck(lambda v: tp.stack([r * (i - 1.0) for i, r in
                                            enumerate(tp.unbind(v, dim))]), [x])
    against_torch(queue, rng, lambda v: tp.unbind(v, dim), lambda v: torch.unbind(v, dim), [a])


ROLLS = [((3, 4), 1, 0), ((3, 4), -5, 1), ((3, 4), (1, 2), (0, 1)), ((3, 4), (1, 1), (0, 0)),
         ((3, 4), 7, None), ((2, 1, 5), (3, -1), (-1, 1)), ((6,), 0, 0), ((), 3, None),
         ((3, 4), 4, 1)]


@pytest.mark.parametrize("shape,shifts,dims", ROLLS, ids=[str(r) for r in ROLLS])
def test_roll(queue, rng, shape, shifts, dims):
    a = rng.standard_normal(shape)
    x = leaf(queue, a)
    with tp.Tape():
        y = tp.roll(x, shifts, dims)
    assert y.op_name == "roll" and y.value.data is not x.value.data
    want = np.roll(a, shifts, dims) if dims is not None else np.roll(a, shifts)
    np.testing.assert_array_equal(y.to_host(), want.astype(np.float32))
    assert tp.gradcheck(lambda v: tp.roll(v, shifts, dims), [x])
    against_torch(queue, rng, lambda v: tp.roll(v, shifts, dims),
                  lambda v: torch.roll(v, shifts, dims), [a])


REPEATS = [((2, 3), (2, 1)), ((2, 3), (1, 2, 3)), ((3,), (2, 1, 2)), ((1, 1), (3, 4)),
           ((), (2,)), ((2, 1, 3), (1, 4, 1)), ((2, 3), (1, 1))]


@pytest.mark.parametrize("shape,sizes", REPEATS, ids=[str(r) for r in REPEATS])
def test_repeat(queue, rng, shape, sizes):
    a = rng.standard_normal(shape)
    x = leaf(queue, a)
    y = tp.repeat(x, *sizes)
    assert y.op_name == "repeat"
    np.testing.assert_array_equal(y.to_host(), np.tile(a, sizes).astype(np.float32))
    np.testing.assert_array_equal(tp.repeat(x, sizes).to_host(), y.to_host())
    assert tp.gradcheck(lambda v: tp.repeat(v, *sizes), [x])
    against_torch(queue, rng, lambda v: tp.repeat(v, *sizes), lambda v: v.repeat(*sizes), [a])


@pytest.mark.parametrize("shape,dims", [((2, 3), (2,)), ((2, 3), 3), ((2, 3), (2, 1, 1)),
                                        ((3,), (2, 2)), ((2, 1), (1, 3))])
def test_tile(queue, rng, shape, dims):
    a = rng.standard_normal(shape)
    x = leaf(queue, a)
    y = tp.tile(x, dims)
    assert y.op_name == "tile"
    np.testing.assert_array_equal(y.to_host(), np.tile(a, dims).astype(np.float32))
    assert tp.gradcheck(lambda v: tp.tile(v, dims), [x])
    against_torch(queue, rng, lambda v: tp.tile(v, dims),
                  lambda v: torch.tile(v, dims if isinstance(dims, tuple) else (dims,)), [a])


def test_repeat_and_tile_of_a_4d_tensor_along_every_dim_backward_as_pytorch(queue, rng):
    # the backward sums the gradient viewed as (r0, s0, ..., r3, s3) over the r's: a
    # permutation of 8 strided dims, which the transpose kernel refused (a ShapeError where
    # PyTorch gives the gradient)
    a = rng.standard_normal((2, 3, 2, 3))
    against_torch(queue, rng, lambda v: tp.repeat(v, 2, 2, 3, 2), lambda v: v.repeat(2, 2, 3, 2),
                  [a])
    against_torch(queue, rng, lambda v: tp.tile(v, (2, 3, 2, 2)),
                  lambda v: torch.tile(v, (2, 3, 2, 2)), [a])


def test_repeat_int64(queue):
    ints = np.arange(6).reshape(2, 3)
    got = tp.repeat(pc.Tensor.from_host(queue, ints), 2, 1, 2).to_host()
    np.testing.assert_array_equal(got, np.tile(ints, (2, 1, 2)))


@pytest.mark.parametrize("op", ["tril", "triu"])
@pytest.mark.parametrize("shape,diagonal", [((4, 4), 0), ((3, 5), 1), ((5, 3), -2),
                                            ((2, 3, 4), 10), ((2, 1, 3), -1), ((1, 1), 0)])
def test_triangles(queue, rng, op, shape, diagonal):
    a = rng.standard_normal(shape)
    x = leaf(queue, a)
    y = getattr(tp, op)(x, diagonal)
    assert y.op_name == op
    np.testing.assert_array_equal(y.to_host(), getattr(np, op)(a, diagonal).astype(np.float32))
    assert tp.gradcheck(lambda v: getattr(tp, op)(v, diagonal), [x])
    against_torch(queue, rng, lambda v: getattr(tp, op)(v, diagonal),
                  lambda v: getattr(torch, op)(v, diagonal), [a])


X = np.zeros((2, 3), np.float32)
ERRORS = [
    ("narrow", lambda x: tp.narrow(x, 0, 3, 0), lambda t: t.narrow(0, 3, 0)),
    ("narrow", lambda x: tp.narrow(x, 0, -3, 1), lambda t: t.narrow(0, -3, 1)),
    ("narrow", lambda x: tp.narrow(x, 0, 1, 2), lambda t: t.narrow(0, 1, 2)),
    ("narrow", lambda x: tp.narrow(x, 0, 0, -1), lambda t: t.narrow(0, 0, -1)),
    ("narrow", lambda x: tp.narrow(x, 2, 0, 1), lambda t: t.narrow(2, 0, 1)),
    ("narrow", lambda x: tp.narrow(x[0, 0], 0, 0, 1), lambda t: t[0, 0].narrow(0, 0, 1)),
    ("chunk", lambda x: tp.chunk(x, 0), lambda t: t.chunk(0)),
    ("chunk", lambda x: tp.chunk(x, -1), lambda t: t.chunk(-1)),
    ("chunk", lambda x: tp.chunk(x[0, 0], 1), lambda t: t[0, 0].chunk(1)),
    ("chunk", lambda x: tp.chunk(x, 2, 2), lambda t: t.chunk(2, 2)),
    ("unbind", lambda x: tp.unbind(x, 2), lambda t: t.unbind(2)),
    ("unbind", lambda x: tp.unbind(x[0, 0]), lambda t: t[0, 0].unbind()),
    ("roll", lambda x: tp.roll(x, (1, 2), (0,)), lambda t: t.roll((1, 2), (0,))),
    ("roll", lambda x: tp.roll(x, 1, 2), lambda t: t.roll(1, 2)),
    ("roll", lambda x: tp.roll(x, (), ()), lambda t: t.roll((), ())),
    ("roll", lambda x: tp.roll(x[0, 0], 1, 0), lambda t: t[0, 0].roll(1, 0)),
    ("repeat", lambda x: tp.repeat(x, 2), lambda t: t.repeat(2)),
    ("repeat", lambda x: tp.repeat(x, -1, 1), lambda t: t.repeat(-1, 1)),
    ("tile", lambda x: tp.tile(x, (-1,)), lambda t: t.tile((-1,))),
    ("tril", lambda x: tp.tril(x[0]), lambda t: torch.tril(t[0])),
    ("triu", lambda x: tp.triu(x[0, 0]), lambda t: torch.triu(t[0, 0])),
]


@pytest.mark.parametrize("op,tp_call,torch_call", ERRORS,
                         ids=[f"{e[0]}-{i}" for i, e in enumerate(ERRORS)])
def test_errors_like_torch(queue, op, tp_call, torch_call):
    x = leaf(queue, X)
    raises_like_torch(lambda: tp_call(x), lambda: torch_call(torch.tensor(X)), op)


def test_no_grad_raw_and_explicit_tape(queue, rng):
    """Inside no_grad every op returns raw Tensors; with tape= it records there anyway."""
    x = leaf(queue, rng.standard_normal((3, 4)))
    with tp.no_grad():
        outs = [tp.narrow(x, 0, 1, 1), *tp.chunk(x, 2), *tp.unbind(x), tp.roll(x, 1),
                tp.repeat(x, 2, 1), tp.tile(x, (2,)), tp.tril(x), tp.triu(x)]
        assert all(isinstance(o, pc.Tensor) for o in outs)
        tape = tp.Tape()
        y = tp.roll(tp.narrow(x, 1, 0, 3, tape=tape), 1, 0, tape=tape)
    assert isinstance(y, tp.Node) and [e.op_name for e in tape.nodes] == ["narrow", "roll"]


def test_zero_size_inputs(queue):
    """Empty results of narrow/repeat go through chunk, roll, tril and triu as in PyTorch."""
    x = leaf(queue, np.ones((2, 3)))
    empty = tp.repeat(x, 0, 1)
    assert empty.shape == (0, 3) and tp.narrow(x, 0, 2, 0).shape == (0, 3)
    assert [p.shape for p in tp.chunk(empty, 2)] == [tuple(p.shape) for p in
                                                     torch.chunk(torch.zeros(0, 3), 2)]
    assert tp.roll(empty, 1, 0).shape == (0, 3) and tp.tril(empty).shape == (0, 3)
    assert tp.triu(empty, 1).to_host().shape == (0, 3)
