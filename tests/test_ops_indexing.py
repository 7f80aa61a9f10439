"""Basic indexing, flip, pad, expand and gather: forward against numpy (float64 where it
computes), backward against finite differences and against the numpy scatter of the gradient,
awkward keys (negative steps, None, ...), errors and bit-identical repeats."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from conftest import leaf


KEYS = [
    0, -1, (1, 2), slice(None, None, -1), (slice(1, None, 2), None),
    (Ellipsis, slice(None, None, -2)), (None, Ellipsis, 0), (slice(None), -1, slice(3, 0, -2)),
    (slice(5, 1),),                    # empty
    (1, Ellipsis, None, slice(0, 1)),
]


@pytest.mark.parametrize("key", KEYS, ids=[repr(k) for k in KEYS])
def test_getitem_forward_backward(queue, rng, key):
    x = rng.standard_normal((3, 5, 4))
    node = leaf(queue, x)
    with tp.Tape() as tape:
        y = node[key]
    want = x.astype(np.float32)[key]
    assert isinstance(y, tp.Node) and y.op_name == "getitem" and y.shape == want.shape
    assert np.array_equal(y.to_host(), want)
    g = rng.standard_normal(want.shape).astype(np.float32)
    if want.size:
        tape.backward(y, grad=pc.Tensor.from_host(queue, g))
        ref = np.zeros(x.shape, np.float32)
        ref[key] = g
        assert np.array_equal(node.grad.to_host(), ref)


def test_getitem_gradcheck_and_tensor(queue, rng):
    x = rng.standard_normal((4, 3))
    node = leaf(queue, x)
    assert tp.gradcheck(lambda t: t[::-1, 1:] * t[:, :2], [node])
    t = pc.Tensor.from_host(queue, x.astype(np.float32))
    with tp.Tape() as tape:
        r = t[1:, ::-2]
    assert isinstance(r, pc.Tensor) and not tape.nodes          # raw in, raw out, unrecorded
    assert np.array_equal(r.to_host(), x.astype(np.float32)[1:, ::-2])
    ints = pc.Tensor.from_host(queue, np.arange(12).reshape(3, 4))
    assert np.array_equal(ints[:, -1].to_host(), np.arange(12).reshape(3, 4)[:, -1])
    assert np.array_equal(tp.getitem(t, (0, 1)).to_host(), x.astype(np.float32)[0, 1])


@pytest.mark.parametrize("per_element", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32])
def test_copy_view_layouts(queue, rng, per_element, dtype):
    """The GPU layout (an element per work-item) and the CPU one (a run per work-item) on this
    device, over 4- and 8-byte words, a flipped strided source and a slab destination."""
    from parcl.kernels import strided
    x = rng.integers(-50, 50, (3, 4, 2000)).astype(dtype)
    src = strided.View.contiguous(x.shape).flip((0, 2))
    out = pc.Tensor.zeros(queue, (3, 6, 2000), dtype)
    dst = strided.View.contiguous(out.shape).narrow(1, 1, 4)
    strided.copy_view(out, dst, pc.Tensor.from_host(queue, x), src, _per_element=per_element)
    want = np.zeros((3, 6, 2000), dtype)
    want[:, 1:5] = x[::-1, :, ::-1]
    assert np.array_equal(out.to_host(), want)


def test_getitem_errors_and_iteration(queue):
    t = pc.Tensor.zeros(queue, (2, 3))
    with pytest.raises(pc.ShapeError, match=r"getitem: index 3 is out of range for dimension "
                                            r"1 of size 3 \(shape \(2, 3\)\)"):
        t[0, 3]
    with pytest.raises(IndexError):
        t[2]
    with pytest.raises(pc.ShapeError, match="too many indices"):
        t[0, 0, 0]
    with pytest.raises(pc.DTypeError, match="basic indexing only"):
        t[0.5]
    with pytest.raises(pc.DTypeError, match="index arrays"):     # one list is taken, not two
        t[[0, 1], [0, 1]]
    with pytest.raises(pc.ShapeError, match="slice step cannot be zero"):
        t[::0]
    assert [r.shape for r in leaf(queue, np.zeros((3, 2)))] == [(2,)] * 3   # stops at IndexError


@pytest.mark.parametrize("axis", [0, -1, (0, 2), (1,)])
def test_flip(queue, rng, axis):
    x = rng.standard_normal((3, 1, 5) if axis != (1,) else (2, 4, 3))
    node = leaf(queue, x)
    with tp.Tape():
        y = tp.flip(node, axis)
    assert y.op_name == "flip"
    assert np.array_equal(y.to_host(), np.flip(x.astype(np.float32), axis))
    assert tp.gradcheck(lambda t: tp.flip(t, axis), [node])



def test_flip_of_a_0d_input_over_dim_0_or_minus_1_is_the_input_as_pytorch(queue):
    """``torch.flip(s, (0,))`` of a 0-d ``s`` is ``s`` (dim 0 and -1 are its one element),
    its gradient passed through; parcl raised 'flip: axis 0 is out of range for a tensor of
    shape ()'. Dim 1, and a dim named twice, are ShapeErrors, as PyTorch's."""
    for dims in (0, -1, (0,), [-1]):
        s = leaf(queue, 2.5)
        with tp.Tape() as tape:
            out = tp.flip(s, dims)
        tape.backward(out * 3.0)
        want = torch.flip(torch.tensor(2.5), dims if isinstance(dims, (tuple, list)) else (dims,))
        assert out.shape == tuple(want.shape) == () and float(out) == float(want)
        assert float(s.grad) == 3.0 and s.flip(dims).shape == ()
    with pytest.raises(pc.ShapeError, match=r"flip: dim 1 is out of range .*shape \(\)"):
        tp.flip(leaf(queue, 2.5), 1)
    with pytest.raises(pc.ShapeError, match=r"flip: dims \(0, -2\) name a dimension twice"):
        tp.flip(leaf(queue, np.zeros((2, 3))), (0, -2))


PADS = [((3, 4), (1, 2)), ((3, 4), (0, 0, 2, 1)), ((2, 3, 4), (-1, 2, 1, -1)),
        ((1, 5), (-2, -2)), ((2, 3), (1, 1, 1, 1, 1, 1)[:4]), ((4,), (3, 0))]


@pytest.mark.parametrize("shape,pad", PADS)
def test_pad(queue, rng, shape, pad):
    x = rng.standard_normal(shape)
    node = leaf(queue, x)
    with tp.Tape():
        y = tp.pad(node, pad, value=0.5)
    widths = [(0, 0)] * (len(shape) - len(pad) // 2) + [
        (pad[2 * i], pad[2 * i + 1]) for i in reversed(range(len(pad) // 2))]
    ref = x.astype(np.float32)
    for ax, (lo, hi) in enumerate(widths):      # numpy's pad does not crop: crop by hand
        sl = [slice(None)] * ref.ndim
        sl[ax] = slice(max(0, -lo), ref.shape[ax] - max(0, -hi))
        ref = ref[tuple(sl)]
    ref = np.pad(ref, [(max(0, lo), max(0, hi)) for lo, hi in widths], constant_values=0.5)
    assert y.op_name == "pad" and np.array_equal(y.to_host(), ref)
    assert tp.gradcheck(lambda t: tp.pad(t, pad), [node])


def test_pad_errors(queue):
    t = pc.Tensor.zeros(queue, (2, 3))
    with pytest.raises(pc.ShapeError, match="even length"):
        tp.pad(t, (1,))
    with pytest.raises(pc.ShapeError, match="negative size"):
        tp.pad(t, (-2, -2))


def test_pad_with_value_none_fills_zeros_as_pytorch(queue):
    # F.pad's value defaults to None, meaning 0; float(None) was a TypeError
    a = np.array([[1.0, -2.0]], np.float32)
    want = torch.nn.functional.pad(torch.tensor(a), (1, 2), value=None).numpy()
    np.testing.assert_array_equal(tp.pad(pc.Tensor.from_host(queue, a), (1, 2), value=None)
                                  .to_host(), want)


@pytest.mark.parametrize("pad", [(2, -6), (-6, 2), (-7, 3), (0, 0, 3, -4)])
def test_pad_refuses_to_crop_more_than_a_dimension_holds_as_pytorch(queue, pad):
    """A negative pad crops the input (PyTorch narrows it, and refuses a crop past its size);
    tp.pad took (2, -6) of a size-5 dim as a size-1 output of the fill value, silently."""
    t = pc.Tensor.zeros(queue, (3, 5))
    with pytest.raises(RuntimeError):
        torch.nn.functional.pad(torch.zeros(3, 5), pad)
    with pytest.raises(pc.ShapeError, match=r"pad: padding \(.*\) of dimension \d crops"):
        tp.pad(t, pad)


@pytest.mark.parametrize("shape,target", [((1, 3), (4, -1)), ((3,), (2, 5, 3)),
                                          ((2, 1, 1), (2, 3, 4)), ((1,), (7,))])
def test_expand(queue, rng, shape, target):
    x = rng.standard_normal(shape)
    node = leaf(queue, x)
    with tp.Tape():
        y = tp.expand(node, target)
    full = tuple(s if s != -1 else shape[k - (len(target) - len(shape))]
                 for k, s in enumerate(target))
    assert y.op_name == "expand" and y.shape == full
    assert np.array_equal(y.to_host(), np.broadcast_to(x.astype(np.float32), full))
    assert tp.gradcheck(lambda t: tp.expand(t, target), [node])


def test_expand_errors(queue):
    t = pc.Tensor.zeros(queue, (2, 3))
    with pytest.raises(pc.ShapeError, match=r"dimension 0 of size 2 cannot expand to 4"):
        tp.expand(t, (4, 3))
    with pytest.raises(pc.ShapeError, match="fewer dimensions"):
        tp.expand(t, (3,))


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather(queue, rng, axis, dtype):
    x = rng.standard_normal((4, 5, 3))
    ishape = [3, 2, 3]
    ishape[axis] = 7                                # longer than x along the axis: repeats
    idx = rng.integers(0, x.shape[axis], ishape).astype(dtype)
    node = leaf(queue, x)
    it = pc.Tensor.from_host(queue, idx)
    with tp.Tape() as tape:
        y = tp.gather(node, axis, it)
    ref = np.take_along_axis(_crop(x.astype(np.float32), ishape, axis), idx, axis)
    assert y.op_name == "gather" and np.array_equal(y.to_host(), ref)
    g = rng.standard_normal(ishape).astype(np.float32)
    tape.backward(y, grad=pc.Tensor.from_host(queue, g))
    want = np.zeros(x.shape)
    for pos in np.ndindex(*ishape):                 # scatter-add in float64
        at = list(pos)
        at[axis] = idx[pos]
        want[tuple(at)] += g[pos]
    np.testing.assert_allclose(node.grad.to_host(), want, rtol=1e-6, atol=1e-6)
    first = node.grad.to_host()
    node.grad = None
    with tp.Tape() as tape:
        y = tp.gather(node, axis, it)
    tape.backward(y, grad=pc.Tensor.from_host(queue, g))
    assert np.array_equal(node.grad.to_host(), first)           # fixed summation order
    assert tp.gradcheck(lambda t: tp.gather(t, axis, it), [node])


def _crop(x, ishape, axis):
    sl = [slice(0, s) for s in ishape]
    sl[axis] = slice(None)
    return x[tuple(sl)]


def test_gather_out_of_range(queue):
    x = pc.Tensor.from_host(queue, np.ones((2, 3), np.float32))
    bad = pc.Tensor.from_host(queue, np.array([[0, 3], [1, 2]]))
    with pytest.raises(pc.ShapeError, match=r"gather: index 3 at position \(0, 1\).*size 3"):
        tp.gather(x, 1, bad)                        # unrecorded: checked at once
    node = tp.tensor(x, requires_grad=True)
    with tp.Tape() as tape:
        y = tp.sum(tp.gather(node, 1, bad))
    with pytest.raises(pc.ShapeError, match="gather: index 3"):
        tape.backward(y)
    with pytest.raises(pc.ShapeError, match="same number of dimensions"):
        tp.gather(x, 0, pc.Tensor.from_host(queue, np.array([0])))
