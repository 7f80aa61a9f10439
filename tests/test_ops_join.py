"""cat, stack and split: forward against numpy, gradients to every input and every piece
(finite differences and the exact slices), negative axes, size-1 and odd dims, errors."""

from __future__ import annotations

import numpy as np
import pytest

import parcl as pc
import parcl.tape as tp
from conftest import leaf


@pytest.mark.parametrize("shapes,axis", [([(2, 3), (2, 1), (2, 5)], 1), ([(1, 3), (4, 3)], 0),
                                         ([(2, 3, 1), (2, 3, 2)], -1), ([(7,)], 0),
                                         ([(3, 2, 5), (3, 1, 5), (3, 4, 5)], -2)])
def test_cat(queue, rng, shapes, axis):
    xs = [rng.standard_normal(s) for s in shapes]
    nodes = [leaf(queue, x) for x in xs]
    with tp.Tape():
        y = tp.cat(nodes, axis=axis)
    assert y.op_name == "cat"
    assert np.array_equal(y.to_host(), np.concatenate([x.astype(np.float32) for x in xs], axis))
    assert tp.gradcheck(lambda *ts: tp.cat(list(ts), axis=axis), nodes)


def test_cat_mixed_raw_and_grads(queue, rng):
    a, b = rng.standard_normal((2, 3)), rng.standard_normal((4, 3))
    na = leaf(queue, a)
    raw = pc.Tensor.from_host(queue, b.astype(np.float32))
    g = rng.standard_normal((6, 3)).astype(np.float32)
    with tp.Tape() as tape:
        y = tp.cat([raw, na])                         # only the second input needs a gradient
    tape.backward(y, grad=pc.Tensor.from_host(queue, g))
    assert np.array_equal(na.grad.to_host(), g[4:])
    ints = [pc.Tensor.from_host(queue, np.arange(3)), pc.Tensor.from_host(queue, np.arange(2))]
    assert np.array_equal(tp.cat(ints).to_host(), np.r_[np.arange(3), np.arange(2)])


@pytest.mark.parametrize("axis", [0, 1, -1, 2])
def test_stack(queue, rng, axis):
    xs = [rng.standard_normal((3, 1, 2)[:2]) for _ in range(3)]
    nodes = [leaf(queue, x) for x in xs]
    with tp.Tape():
        y = tp.stack(nodes, axis=axis)
    assert y.op_name == "stack"
    assert np.array_equal(y.to_host(), np.stack([x.astype(np.float32) for x in xs], axis))
    assert tp.gradcheck(lambda *ts: tp.stack(ts, axis=axis), nodes)


@pytest.mark.parametrize("sections,axis", [(2, 1), (3, 0), ([1, 4, 0, 2], -1), (7, -1),
                                           ([3, 1], 0)])
def test_split(queue, rng, sections, axis):
    x = rng.standard_normal((4, 7))
    node = leaf(queue, x)
    with tp.Tape() as tape:
        pieces = tp.split(node, sections, axis=axis)
    if isinstance(sections, list):
        want = np.split(x.astype(np.float32), np.cumsum(sections)[:-1], axis)
    else:
        n = x.shape[axis]
        want = np.split(x.astype(np.float32), list(range(sections, n, sections)), axis)
    assert isinstance(pieces, tuple) and len(pieces) == len(want)
    for p, w in zip(pieces, want):
        assert p.op_name == "split" and np.array_equal(p.to_host(), w)
    # every piece carries its own gradient back into x
    gs = [rng.standard_normal(w.shape).astype(np.float32) for w in want]
    total = None
    for p, g in zip(pieces, gs):
        if p.size == 0:
            continue
        term = tp.sum(p * pc.Tensor.from_host(queue, g))
        total = term if total is None else total + term
    tape.backward(total)
    assert np.array_equal(node.grad.to_host(), np.concatenate(gs, axis))
    assert tp.gradcheck(lambda t: tp.cat([p * (i + 1.0) for i, p in
                                          enumerate(tp.split(t, sections, axis))
                                          if p.size], axis), [node])


def test_join_errors(queue):
    a, b = pc.Tensor.zeros(queue, (2, 3)), pc.Tensor.zeros(queue, (3, 3))
    with pytest.raises(pc.ShapeError, match=r"cat: input 1 has shape \(3, 3\), input 0 has "
                                            r"\(2, 3\); they must match except along axis 1"):
        tp.cat([a, b], axis=1)
    with pytest.raises(pc.ShapeError, match="stack: input 1 has shape"):
        tp.stack([a, b])
    with pytest.raises(pc.ShapeError, match="axis 2 is out of range"):
        tp.cat([a, a], axis=2)
    with pytest.raises(pc.ShapeError, match="add up to 3"):
        tp.split(a, [1, 1], axis=1)
    with pytest.raises(pc.ShapeError, match="non-empty"):
        tp.cat([])
    with pytest.raises(pc.DTypeError, match="dtype"):
        tp.cat([a, pc.Tensor.zeros(queue, (2, 3), np.int32)])


def test_cat_long_runs_bit_identical(queue, rng):
    """Big slabs (the run-splitting path) copy exactly and repeat bit for bit."""
    xs = [rng.standard_normal((2, 3000)).astype(np.float32) for _ in range(2)]
    ts = [pc.Tensor.from_host(queue, x) for x in xs]
    y1, y2 = tp.cat(ts, axis=0).to_host(), tp.cat(ts, axis=0).to_host()
    assert np.array_equal(y1, np.concatenate(xs)) and np.array_equal(y1, y2)
    prime = rng.standard_normal(1031).astype(np.float32)           # no divisor to cut by
    z = tp.cat([pc.Tensor.from_host(queue, prime)] * 2).to_host()
    assert np.array_equal(z, np.r_[prime, prime])
