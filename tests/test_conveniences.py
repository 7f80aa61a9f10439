"""PyTorch habits on Nodes and Tensors: ``float(x)``, ``int(x)``, ``x.item()``,
``np.asarray(x)``, ``pc.Tensor`` operators and methods (computed on its queue, never
recorded) and ``tp.tensor(ndarray)``."""

from __future__ import annotations

import operator
import re

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from parcl.errors import DTypeError, ParclError, ShapeError


def dev(queue, a):
    return pc.Tensor.from_host(queue, np.asarray(a, np.float32))


def test_float_int_item_on_one_element_tensors_and_nodes(queue):
    t = dev(queue, [[2.75]])
    node = tp.tensor(t, requires_grad=True)
    for x in (t, node):
        assert float(x) == 2.75 and int(x) == 2 and x.item() == 2.75
    labels = pc.Tensor.from_host(queue, np.array([7]))
    assert int(labels) == 7 and float(labels) == 7.0
    with tp.Tape() as tape:
        loss = tp.sum(node * node)
    assert float(loss) == pytest.approx(2.75 ** 2)
    tape.release()
    for x in (dev(queue, [1.0, 2.0]), tp.tensor(dev(queue, [1.0, 2.0]))):
        with pytest.raises(ShapeError, match=r"shape \(2,\) has 2 elements"):
            float(x)


def test_bool_of_a_tensor_is_its_one_value_and_ambiguous_for_more(queue):
    # bool() took len(): [0.0] and any (2, 3) tensor were True
    for x in (dev(queue, [0.0]), dev(queue, 0.0), tp.tensor(dev(queue, [[0.0]]))):
        assert not x and bool(x) is False
    assert dev(queue, [-0.5]) and tp.tensor(dev(queue, 2.0))
    assert bool(pc.Tensor.from_host(queue, np.array([0]))) is False
    assert bool(pc.Tensor.from_host(queue, np.array([True]))) is True
    assert max(dev(queue, [1.0, 3.0, 2.0])).item() == 3.0     # compares 0-d masks
    for x in (dev(queue, np.zeros((2, 3))), tp.tensor(dev(queue, [1.0, 1.0]))):
        with pytest.raises(ValueError, match="ambiguous"):
            bool(x)


def test_iterating_a_0d_tensor_is_an_error_not_an_empty_loop(queue):
    # Python's __getitem__ fallback stopped at t[0]'s IndexError: list(t) was []
    for x in (dev(queue, 3.0), tp.tensor(dev(queue, 3.0))):
        with pytest.raises(TypeError, match="0-d"):
            list(x)
    m = [[1.0, 2.0], [3.0, 4.0]]
    for x in (dev(queue, m), tp.tensor(dev(queue, m))):
        rows = list(x)
        assert len(rows) == 2 and [float(r.sum()) for r in rows] == [3.0, 7.0]


def test_len_of_a_node_is_its_first_dim_as_pytorch(queue):
    # len(x) of a Node was a TypeError (no __len__), where torch gives x.shape[0]
    x = tp.tensor(dev(queue, np.zeros((3, 2))), requires_grad=True)
    assert len(x) == 3 and len(x[0]) == 2
    with pytest.raises(TypeError, match="0-d"):
        len(tp.tensor(dev(queue, 3.0)))


def test_in_finds_an_element_as_numpys_in_does(queue):
    # Python's fallback compared each row to the value by identity: always False
    t = dev(queue, [[1.0, 2.0], [3.0, 4.0]])
    for x in (t, tp.tensor(t)):
        assert 3.0 in x and 4 in x and 5.0 not in x
        assert dev(queue, [3.0, 4.0]) in x and tp.tensor(dev(queue, 2.0)) in x
    assert 7 in pc.Tensor.from_host(queue, np.array([5, 7]))


def test_asarray_copies_to_the_host(queue):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = dev(queue, a)
    for x in (t, tp.tensor(t)):
        got = np.asarray(x)
        assert got.dtype == np.float32 and got.shape == (2, 3)
        np.testing.assert_array_equal(got, a)
        assert np.asarray(x, dtype=np.float64).dtype == np.float64
    got[0, 0] = 99                       # a copy: the device tensor is unchanged
    assert t.to_host()[0, 0] == 0
    np.testing.assert_array_equal(np.asarray(pc.Tensor.from_host(queue, np.array([3, 4]))),
                                  [3, 4])
    with pytest.raises(ValueError, match="without a copy"):
        np.asarray(t, copy=False)
    assert np.allclose(np.array(t) * 2, a * 2)


ARITH = [
    ("add", lambda a, b: a + b), ("sub", lambda a, b: a - b), ("mul", lambda a, b: a * b),
    ("div", lambda a, b: a / b), ("pow", lambda a, b: a ** b),
    ("lt", lambda a, b: a < b), ("le", lambda a, b: a <= b), ("gt", lambda a, b: a > b),
    ("ge", lambda a, b: a >= b),
]


@pytest.mark.parametrize("name,op", ARITH)
@pytest.mark.parametrize("sa,sb", [((2, 3), (2, 3)), ((3, 1), (1, 4)), ((5,), ()),
                                   ((2, 3), None), (None, (7,))])
def test_tensor_operators_match_numpy(queue, rng, name, op, sa, sb):
    """Tensors and Python scalars on either side, numpy broadcasting; comparisons are float32
    0/1 masks."""
    a = rng.uniform(0.5, 2.0, sa).astype(np.float32) if sa else 1.25
    b = rng.uniform(0.5, 2.0, sb).astype(np.float32) if sb else 1.25
    ta = dev(queue, a) if sa else a
    tb = dev(queue, b) if sb else b
    got = op(ta, tb)
    assert type(got) is pc.Tensor
    want = op(np.float64(a) if not sa else a.astype(np.float64),
              np.float64(b) if not sb else b.astype(np.float64))
    np.testing.assert_allclose(got.to_host(), np.asarray(want, np.float64), rtol=2e-6)


def test_unary_matmul_and_methods_match_numpy(queue, rng):
    a = rng.standard_normal((3, 5)).astype(np.float32)
    b = rng.standard_normal((5, 4)).astype(np.float32)
    t, a64 = dev(queue, a), a.astype(np.float64)
    np.testing.assert_array_equal((-t).to_host(), -a)
    np.testing.assert_allclose((t @ dev(queue, b)).to_host(), a64 @ b, rtol=1e-5, atol=1e-5)
    c = rng.standard_normal((2, 5, 3)).astype(np.float32)
    for left, right in ((a, b[:, 0]), (a[0], b), (a[0], b[:, 0]), (c, b[:, :3].T.copy()),
                        (c, c.transpose(0, 2, 1).copy()), (c, b[:3, 0].copy()),
                        (b[:, 0].copy(), c)):
        got = dev(queue, left) @ dev(queue, right)
        want = left.astype(np.float64) @ right
        assert got.shape == want.shape, (left.shape, right.shape)
        np.testing.assert_allclose(got.to_host(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ShapeError, match=r"\(5,\) @ \(2, 3, 5\)"):
        dev(queue, b[:, 0].copy()) @ dev(queue, c.transpose(0, 2, 1).copy())
    np.testing.assert_allclose(t.sum().to_host(), a64.sum(), rtol=1e-5)
    np.testing.assert_allclose(t.sum(axis=0).to_host(), a64.sum(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(t.mean(1, keepdims=True).to_host(), a64.mean(1, keepdims=True),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(t.max().to_host(), a.max())
    np.testing.assert_array_equal(t.max(axis=1).values.to_host(), a.max(1))
    for axis, keep in ((None, False), (None, True), (1, False), (0, True), (-1, True)):
        got = t.argmax(axis, keepdims=keep)
        want = np.argmax(a, axis=axis, keepdims=keep)
        assert got.dtype == np.int64 and got.shape == want.shape, (axis, keep)
        np.testing.assert_array_equal(got.to_host(), want)
    np.testing.assert_array_equal(t.T.to_host(), a.T)
    np.testing.assert_array_equal(t.reshape(5, 3).to_host(), a.reshape(5, 3))
    np.testing.assert_allclose(t.exp().to_host(), np.exp(a64), rtol=2e-6)
    pos = np.abs(a) + 0.5
    np.testing.assert_allclose(dev(queue, pos).log().to_host(), np.log(np.float64(pos)),
                               rtol=2e-6)


def test_numpy_scalars_are_scalars(queue):
    t = dev(queue, [0.0, 1.0, 2.0])
    for got in (np.float32(2) * t, t * np.float64(2), np.int64(2) + t - t):
        assert type(got) is pc.Tensor
    np.testing.assert_array_equal((np.float32(2) ** t).to_host(), [1.0, 2.0, 4.0])


def test_tensor_arithmetic_is_never_recorded(queue):
    x = tp.tensor(dev(queue, [1.0, 2.0]), requires_grad=True)
    t = dev(queue, [3.0, 4.0])
    with tp.Tape() as tape:
        raw = (t * 2.0 + t) @ t
        mixed = t * x                     # a Node operand: the Node's operator records it
    assert type(raw) is pc.Tensor and float(raw) == 75.0
    assert isinstance(mixed, tp.Node) and len(tape.nodes) == 1
    tape.backward(mixed, grad=dev(queue, [1.0, 1.0]))
    np.testing.assert_array_equal(x.grad.to_host(), [3.0, 4.0])


def test_tensor_operator_errors_are_clear(queue):
    t = dev(queue, [1.0, 2.0])
    with pytest.raises(TypeError, match="numpy array operand"):
        t + np.ones(2, np.float32)
    with pytest.raises(TypeError, match="numpy array operand"):
        np.ones(2, np.float32) * t
    with pytest.raises(TypeError):
        t + "1"
    with pytest.raises(ShapeError, match=r"\(2,\) and \(3,\)"):
        t + dev(queue, [1.0, 2.0, 3.0])
    with pytest.raises(DTypeError, match="add: dtype int64"):
        pc.Tensor.from_host(queue, np.array([1, 2])) + 1


def test_tp_tensor_uploads_arrays_to_the_default_queue(queue):
    w = tp.tensor(np.zeros((3, 2)), requires_grad=True)
    assert isinstance(w, tp.Node) and w.requires_grad and w.grad_fn is None
    assert w.dtype == np.float32 and w.shape == (3, 2) and w.queue is pc.default_queue()
    labels = tp.tensor(np.array([1, 0, 2]))
    assert labels.dtype == np.int64 and not labels.requires_grad
    np.testing.assert_array_equal(tp.tensor([[1.5, 2.5]]).to_host(), [[1.5, 2.5]])
    assert tp.tensor(3.0).shape == ()
    with tp.Tape() as tape:
        loss = tp.sum(w * 2.0)
    tape.backward(loss)
    np.testing.assert_array_equal(w.grad.to_host(), np.full((3, 2), 2.0))
    with pytest.raises(DTypeError):
        tp.tensor(np.array(["a"]))


def test_augmented_assignment_writes_into_the_tensor_as_pytorch(queue):
    """``t += x`` fell back to ``t = t + x`` (no ``__iadd__``): a new tensor, so a view of
    ``t`` or a Node holding it kept [1, 2, 4] where PyTorch's in-place op changes them,
    silently. Now each ``op=`` writes into the buffer; a broadcast that would grow the
    tensor and an int tensor are errors, not a rebinding."""
    t = pc.Tensor.from_host(queue, np.array([[1.0, 2.0, 4.0]], np.float32))
    alias, view = t, t.reshape(-1)
    t += 1.5
    t *= pc.Tensor.from_host(queue, np.array([2.0], np.float32))
    t -= 1
    t /= 2
    t **= 2
    assert t is alias
    np.testing.assert_allclose(view.to_host(), ((np.array([1, 2, 4]) + 1.5) * 2 - 1) ** 2 / 4)
    with pytest.raises(ShapeError, match="add"):
        t += pc.Tensor.from_host(queue, np.ones((2, 3), np.float32))
    labels = pc.Tensor.from_host(queue, np.array([1, 2], np.int32))
    with pytest.raises(DTypeError, match="int32"):
        labels += 1.5


def test_augmented_assignment_of_a_node_writes_into_the_tensor_as_pytorch(queue):
    """``t += node`` (an EMA of parameters: ``e.value *= d; e.value += (1 - d) * p``) writes
    into ``t``'s buffer, as PyTorch's ``a += b``: the Node's reflected operator made a new
    Node (or, under no_grad, a new Tensor) and rebound ``t``, so a view of it kept [1, 1, 1]
    where PyTorch gives [3, 3, 3], silently."""
    p = tp.tensor(np.full(3, 2.0, np.float32), requires_grad=True)
    for grad_mode in (True, False):
        t = pc.Tensor.from_host(queue, np.ones(3, np.float32))
        view = t.reshape(1, 3)
        with tp.set_grad_enabled(grad_mode):
            t += p
            t *= p
        assert isinstance(t, pc.Tensor)
        np.testing.assert_array_equal(view.to_host(), [[6.0, 6.0, 6.0]])


def test_a_manual_sgd_step_under_no_grad_updates_the_parameter_in_place(queue):
    """PyTorch's ``with no_grad(): p -= lr * p.grad`` updates the model; parcl rebound the
    loop variable to a new tensor and left every weight as it was, silently. Under
    ``tp.no_grad`` a Node's ``op=`` is now in place on its value; while recording it stays
    ``x = x op y`` (a new Node, the gradient taken through it)."""
    w = tp.tensor(np.array([1.0, 2.0], np.float32), requires_grad=True)
    x = tp.tensor(np.array([3.0, 4.0], np.float32))
    with tp.Tape() as tape:
        y = w * x
        y += 1.0                       # recorded: a new Node
        loss = tp.sum(y)
    tape.backward(loss)
    np.testing.assert_array_equal(y.to_host(), [4.0, 9.0])
    params = [w]
    with tp.no_grad():
        for p in params:
            p -= 0.5 * p.grad
    assert params[0] is w
    np.testing.assert_array_equal(w.to_host(), [-0.5, 0.0])
    with tp.Tape() as tape2:
        z = tp.sum(w * w)
    with tp.no_grad():
        w += 1.0
    with pytest.raises(ParclError, match="updated in place"):     # w * w saved the old w
        tape2.backward(z)




@pytest.mark.parametrize("op, assign", [("+=", operator.iadd), ("-=", operator.isub),
                                        ("*=", operator.imul), ("/=", operator.itruediv),
                                        ("**=", operator.ipow)])
def test_an_op_assign_that_would_grow_a_recorded_node_is_refused_as_pytorch(op, assign):
    """PyTorch's ``x += y`` keeps x's shape: x (3,) and y (2, 3) is its error ('output with
    shape [3] doesn't match the broadcast shape [2, 3]'). While recording parcl's fallback
    ``x = x + y`` made x a (2, 3) Node, so a loss summed over it was 30.0 for x = [2, 4, 6]
    and y ones, silently. A y that broadcasts to x's shape still gives PyTorch's values."""
    w = tp.tensor(np.array([1.0, 2.0, 3.0], np.float32), requires_grad=True)
    t = torch.tensor([1.0, 2.0, 3.0]) * 2
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        assign(t, torch.ones(2, 3))
    rows = np.array([[0.5], [2.0]], np.float32)
    with tp.Tape():
        x = w * 2.0
        with pytest.raises(ShapeError, match=rf"Node {re.escape(op)}: an operand of shape "
                           r"\(2, 3\) would grow \(3,\) to \(2, 3\)"):
            assign(x, tp.tensor(np.ones((2, 3), np.float32)))
        z = assign(x * tp.tensor(rows), x)           # (2, 3) op= (3,): keeps its shape
    want = assign(t * torch.tensor(rows), t)
    assert z.shape == (2, 3)
    np.testing.assert_allclose(z.to_host(), want.numpy(), rtol=1e-6)


def test_a_remainder_assign_under_no_grad_changes_the_parameter_in_place_as_pytorch():
    """PyTorch's ``p %= 2.0`` under no_grad wraps the parameter in place; parcl's Node had
    no ``%=``, so Python's fallback ``p = p % 2.0`` rebound the loop variable and the model's
    weight stayed [2.5, -0.7, 7.0] where PyTorch's is [0.5, 1.3, 1.0], silently."""
    w = tp.tensor(np.array([2.5, -0.7, 7.0], np.float32), requires_grad=True)
    t = torch.tensor([2.5, -0.7, 7.0], requires_grad=True)
    with tp.no_grad():
        for p in [w]:
            p %= 2.0
    with torch.no_grad():
        for p in [t]:
            p %= 2.0
    np.testing.assert_allclose(w.to_host(), t.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(w.to_host(), [0.5, 1.3, 1.0], rtol=1e-6)
    with tp.Tape():                                  # recorded: x = x % y, a new Node
        x = w * 3.0
        y = x
        y %= 1.0
        assert y is not x
        with pytest.raises(ShapeError, match=r"Node %=: an operand of shape \(2, 3\)"):
            x %= tp.tensor(np.ones((2, 3), np.float32))


def test_a_floor_divide_assign_under_no_grad_changes_the_parameter_in_place_as_pytorch():
    """PyTorch's ``p //= 2.0`` under no_grad floors the parameter in place; parcl's Node had
    ``//`` but no ``//=``, so Python's fallback ``p = p // 2.0`` rebound the loop variable and
    the weight stayed [2.5, -0.7, 7.0] where PyTorch's is [1, -1, 3], silently (and on a leaf
    while recording it gave a new Node where PyTorch refuses)."""
    w = tp.tensor(np.array([2.5, -0.7, 7.0], np.float32), requires_grad=True)
    t = torch.tensor([2.5, -0.7, 7.0], requires_grad=True)
    with tp.no_grad():
        for p in [w]:
            p //= 2.0
    with torch.no_grad():
        for p in [t]:
            p //= 2.0
    np.testing.assert_array_equal(w.to_host(), t.detach().numpy())
    np.testing.assert_array_equal(w.to_host(), [1.0, -1.0, 3.0])
    with tp.Tape():
        with pytest.raises(ParclError, match="Node //=: a leaf that requires grad"):
            w //= 2.0
        x = w * 3.0                                  # recorded: x = x // y, a new Node
        y = x
        y //= 2.0
        assert y is not x
        with pytest.raises(ShapeError, match=r"Node //=: an operand of shape \(2, 3\)"):
            x //= tp.tensor(np.ones((2, 3), np.float32))


def test_a_manual_step_outside_no_grad_is_refused_as_pytorch():
    """PyTorch refuses ``p -= lr * p.grad`` on a parameter while grad mode is on ('a leaf
    Variable that requires grad is being used in an in-place operation'). parcl recorded
    ``p = p - lr * p.grad``, a new Node, so the step changed no weight: w stayed [1, 2] where
    the step under no_grad gives [0, 0], silently."""
    w = tp.tensor(np.array([1.0, 2.0], np.float32), requires_grad=True)
    t = torch.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        t -= 0.5
    with tp.Tape() as tape:
        loss = tp.sum(w * w)
    tape.backward(loss)
    for op, assign in (("-", operator.isub), ("+", operator.iadd), ("%", operator.imod)):
        with pytest.raises(ParclError, match=rf"Node {re.escape(op)}=: a leaf that requires grad"):
            assign(w, 0.5 * w.grad)
    with tp.Tape():                                  # a view of it, as PyTorch's
        view = w.reshape(2, 1)
        with pytest.raises(ParclError, match=r"through a view of it: reshape"):
            view -= 1.0
    np.testing.assert_array_equal(w.to_host(), [1.0, 2.0])
    with tp.no_grad():
        w -= 0.5 * w.grad
    np.testing.assert_array_equal(w.to_host(), [0.0, 0.0])

# -- torch.Tensor's methods on a Node --------------------------------------------------------
METHODS = {
    "exp": lambda v: v.exp(), "log": lambda v: v.abs().log(), "sqrt": lambda v: v.abs().sqrt(),
    "tanh": lambda v: v.tanh(), "sigmoid": lambda v: v.sigmoid(), "relu": lambda v: v.relu(),
    "clamp": lambda v: v.clamp(-0.5, 0.5), "pow": lambda v: v.pow(3),
    "square": lambda v: v.square(),
    "softmax": lambda v: v.softmax(1), "log_softmax": lambda v: v.log_softmax(0),
    "sum dim": lambda v: v.sum(dim=1, keepdim=True), "mean dim": lambda v: v.mean(dim=0),
    "max": lambda v: v.max(), "max dim": lambda v: v.max(1).values,
    "min dim": lambda v: v.min(0, True)[0],
    "amax": lambda v: v.amax(1), "prod": lambda v: v.prod(1), "var": lambda v: v.var(1),
    "std": lambda v: v.std(0, correction=0), "logsumexp": lambda v: v.logsumexp(1),
    "cumsum": lambda v: v.cumsum(1), "norm": lambda v: v.norm(1, 1),
    "topk": lambda v: v.topk(2).values,
    "sort": lambda v: v.sort(0, descending=True).values, "expand": lambda v: v[:1].expand(3, 4),
    "flip": lambda v: v.flip(1), "flip dims as arguments": lambda v: v.flip(0, 1),
    "flip dims=": lambda v: v.flip(dims=[-1]), "tril": lambda v: v.tril(),
    "matmul": lambda v: v.matmul(v.T),
    "add alpha": lambda v: v.add(v[:1] * v[:1], alpha=2),
    "sub alpha": lambda v: v.sub(1.5, alpha=3),
    "mul": lambda v: v.mul(v[:, :1]), "div": lambda v: v.div(v.abs() + 1.0),
    "div floor": lambda v: v.div(0.25, rounding_mode="floor") + v,
    "subtract multiply divide": lambda v: v.subtract(v.multiply(v)).divide(2.0),
    "maximum": lambda v: v.maximum(v[:1]), "minimum": lambda v: v.minimum(v[:, 1:2]),
    "sign floor ceil round trunc fix": lambda v: (v * v.sign() + v.floor() + v.ceil()
                                                  + v.round() + v.trunc() + v.fix()),
    "round decimals": lambda v: v.round(decimals=1) + v,
    "reciprocal log1p expm1": lambda v: v.abs().add(1).reciprocal() + v.abs().log1p() + v.expm1(),
    "log2 log10 erf": lambda v: v.abs().log2() + v.abs().log10() + v.erf(),
    "tan sinh cosh": lambda v: v.tan() + v.sinh() + v.cosh(),
    "asin acos atan": lambda v: (v / 3).asin() + (v / 3).acos() + v.atan(),
    "atan2 arctan2": lambda v: v.atan2(v[:1]) + v.arctan2(v.abs() + 1),
    "lerp": lambda v: v.lerp(v[:1], 0.3) + v.lerp(v.flip(0), v.sigmoid()),
    "nan_to_num": lambda v: v.log().nan_to_num(-1.0) + v,
    "negative absolute positive clip": lambda v: v.negative() + v.absolute() * v.positive()
                                                 + v.clip(-0.5, 0.5),
    "greater less": lambda v: (v * v.greater(0.1) + v * v.less(-0.1) + v * v.greater_equal(0)
                               + v * v.less_equal(0.0) + v * v.not_equal(0.0)),
}


@pytest.mark.parametrize("name", list(METHODS))
def test_a_node_has_torch_tensors_methods_with_their_arguments(queue, name):
    """``x.softmax(1)``, ``x.max(1).values``, ``x.sum(dim=1, keepdim=True)``, ...: the
    methods PyTorch code calls on a tensor, with PyTorch's argument order, equal to torch's
    values and gradients."""
    import torch
    a = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    x = tp.tensor(a, requires_grad=True)
    t = torch.tensor(a, dtype=torch.float64, requires_grad=True)
    with tp.Tape() as tape:
        out = METHODS[name](x)
        loss = tp.sum(out * out)
    tape.backward(loss)
    want = METHODS[name](t)
    (want * want).sum().backward()
    np.testing.assert_allclose(out.to_host(), want.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x.grad.to_host(), t.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_a_nodes_max_and_min_along_a_dim_give_values_and_indices_as_torch(queue):
    x = tp.tensor(np.array([[1.0, 3.0, 3.0], [2.0, 0.0, 2.0]], np.float32))
    values, indices = x.max(1)
    assert values.to_host().tolist() == [3, 2] and indices.to_host().tolist() == [1, 0]
    assert x.min(dim=0).indices.to_host().tolist() == [0, 1, 1]
    assert float(x.max()) == 3.0
    with pytest.raises(TypeError, match="axis and dim given both"):
        x.sum(0, axis=1)


def test_comparing_a_tensor_or_node_with_values_by_eq_is_refused_not_silently_false(queue):
    """``==`` compares identity (tensors stay hashable), so a ported evaluation's
    ``np.mean(predicted == labels)`` was an accuracy of 0.0 where PyTorch counts the matches;
    against an array, a number or a list it is a TypeError that names tp.eq."""
    labels = np.array([1, 0, 2])
    predicted = pc.Tensor.from_host(queue, labels)
    logits = tp.tensor(np.eye(3, dtype=np.float32))
    for compare in (lambda: predicted == labels, lambda: predicted != 1, lambda: 0 == predicted,
                    lambda: logits == 1.0, lambda: logits == [1, 0, 0]):
        with pytest.raises(TypeError, match="compares identity, not values.*tp.eq"):
            compare()
    assert predicted == predicted and predicted != logits and {predicted: 1}[predicted] == 1
    assert predicted in [logits, predicted] and predicted != None  # noqa: E711
    np.testing.assert_array_equal(tp.eq(logits, tp.tensor(np.eye(3, dtype=np.float32)))
                                  .to_host(), np.ones((3, 3)))


def test_a_raw_tensors_max_along_a_dim_gives_values_and_indices_as_a_nodes(queue):
    """Under ``no_grad`` a model returns a raw ``pc.Tensor``: an evaluation loop's
    ``_, predicted = logits.max(1)`` took the values' rows (numpy's ``max``), so with a batch
    of 2 ``predicted`` was the second row's maximum, 3.0, where PyTorch gives the indices
    [1, 0]; ``logits.max(1)[1]`` silently the same. The reductions take ``dim``/``keepdim``
    and numpy's ``axis``/``keepdims`` alike, as PyTorch's."""
    a = np.array([[1.0, 3.0, 3.0], [2.0, 0.0, 2.0]], np.float32)
    with tp.no_grad():
        logits = tp.tensor(a) * 1.0
    assert isinstance(logits, pc.Tensor)
    _, predicted = logits.max(1)
    assert predicted.to_host().tolist() == [1, 0] and predicted.dtype == np.int64
    values, indices = logits.max(dim=0, keepdim=True)
    assert values.to_host().tolist() == [[2, 3, 3]] and indices.to_host().tolist() == [[1, 0, 0]]
    assert logits.max(axis=1).values.to_host().tolist() == [3, 2]
    assert float(logits.max()) == 3.0
    assert logits.argmax(dim=1).to_host().tolist() == [1, 0]
    np.testing.assert_array_equal(logits.sum(dim=1, keepdim=True).to_host(), [[7], [4]])
    np.testing.assert_array_equal(logits.mean(axis=0, keepdims=True).to_host(),
                                  [[1.5, 1.5, 2.5]])
    with pytest.raises(TypeError, match="axis and dim given both"):
        logits.sum(0, axis=1)


def test_a_raw_0d_tensors_max_and_argmax_over_dim_0_or_minus_1_as_pytorch(queue):
    """``torch.tensor(2.5).max(0)`` is ``(2.5, 0)`` and ``argmax(-1, keepdim=True)`` the 0-d
    0, as a 0-d tensor's dim 0 and -1 are its one element; a raw ``pc.Tensor`` (a model's
    output under ``no_grad``) raised 'argmax: a 0-d tensor has no axis'. Dim 1 is a
    ShapeError, as PyTorch's IndexError."""
    import torch
    with tp.no_grad():
        s = tp.tensor(np.float32(2.5)) * 1.0
    assert isinstance(s, pc.Tensor)
    for dim in (0, -1):
        for keepdim in (False, True):
            values, indices = s.max(dim, keepdim)
            want = torch.tensor(2.5).max(dim, keepdim)
            assert values.shape == indices.shape == tuple(want.values.shape) == ()
            assert float(values) == float(want.values) and int(indices) == int(want.indices)
            got = s.argmax(dim, keepdim=keepdim)
            assert got.shape == () and got.dtype == np.int64 and int(got) == 0
    with pytest.raises(ShapeError, match="argmax: axis 1 is out of range for a 0-D tensor"):
        s.argmax(1)


def test_a_raw_tensors_min_argmin_amax_and_amin_are_pytorchs(queue):
    """Under ``no_grad`` a model's output is a raw ``pc.Tensor``, which had ``max(dim)`` but no
    ``min``, ``argmin``, ``amax`` or ``amin``: ``logits.min(1)`` in an evaluation loop was an
    AttributeError where a recorded Node and PyTorch give ``(values, indices)``. Each is
    torch.Tensor's, NaN included (the extreme, at its index), and ``min``/``amin`` give
    tp.min's and tp.amin's bits; ``t.max(other)``/``t.min(other)`` the elementwise extreme."""
    rng = np.random.default_rng(0)
    a = rng.integers(-3, 4, (3, 4, 5)).astype(np.float32)
    a[0, 1, 2] = np.nan
    with tp.no_grad():
        x = tp.tensor(a) * 1.0
    assert isinstance(x, pc.Tensor)
    t = torch.from_numpy(a)

    def same(got, want):
        assert np.asarray(got).dtype == want.numpy().dtype
        np.testing.assert_array_equal(np.asarray(got), want.numpy())   # NaN equals NaN here

    same(x.min(), t.min())
    same(x.argmin(), t.argmin())
    same(x.amin(), t.amin())
    same(x.amax(()), t.amax(()))
    for dim in (0, 1, 2, -1):
        for keepdim in (False, True):
            got, want = x.min(dim, keepdim), t.min(dim, keepdim)
            same(got.values, want.values)
            same(got.indices, want.indices)
            same(x.min(dim=dim, keepdim=keepdim).indices, want.indices)
            same(x.argmin(dim, keepdim), t.argmin(dim, keepdim))
    for dim in (1, -1, (0, 2), (2, 0), (0, 1, 2)):
        for keepdim in (False, True):
            same(x.amax(dim, keepdim), t.amax(dim, keepdim))
            same(x.amin(dim, keepdim), t.amin(dim, keepdim))
    _, predicted = x[2].min(1)
    assert predicted.to_host().tolist() == t[2].min(1).indices.tolist() == [1, 3, 1, 1]
    b = rng.standard_normal((4, 6)).astype(np.float32)
    with tp.no_grad():
        y = tp.tensor(b) * 1.0
        assert y.min(1).values.to_host().tobytes() == tp.min(y, 1).values.to_host().tobytes()
        assert y.amin(0).to_host().tobytes() == tp.amin(y, 0).to_host().tobytes()
    u = dev(queue, b[::-1].copy())
    np.testing.assert_array_equal(y.min(u).to_host(), np.minimum(b, b[::-1]))
    np.testing.assert_array_equal(y.max(u).to_host(), np.maximum(b, b[::-1]))
    with pytest.raises(ShapeError, match=r"min: axis must be an int, got \(0, 1\)"):
        x.min((0, 1))                       # torch.Tensor.min refuses a tuple of dims too
    with pytest.raises(ShapeError, match="amin: axis 5 is out of range"):
        x.amin(5)
    with pytest.raises(ShapeError, match="argmin: axis 3 is out of range"):
        x.argmin(3)


def test_a_raw_tensors_argmax_refuses_a_tuple_or_a_float_dim_as_tp_argmax_does(queue):
    """``pc.Tensor.argmax((0, 1))`` was a bare ValueError (``too many values to unpack``) and
    ``argmax(1.5)`` a TypeError, where ``tp.argmax`` (now the same code) names the op and the
    shape; a true int dim still gives the first extreme's index."""
    x = dev(queue, np.array([[1, 5, 5], [7, 2, 7]], np.float32))
    with pytest.raises(ShapeError, match=r"argmax: axis must be an int, got \(0, 1\) "
                                         r"\(shape \(2, 3\)\)"):
        x.argmax((0, 1))
    with pytest.raises(ShapeError, match="argmin: axis must be an int, got 1.5"):
        x.argmin(1.5)
    with pytest.raises(ShapeError, match=r"argmax: axis must be an int, got \(0, 1\)"):
        tp.argmax(x, (0, 1))
    np.testing.assert_array_equal(x.argmax(1).to_host(), [1, 0])
    np.testing.assert_array_equal(tp.argmin(x, 1, keepdims=True).to_host(), [[0], [1]])


def test_a_raw_tensors_softmax_all_and_any_are_pytorchs(queue):
    """A raw ``pc.Tensor`` (a model's output under ``no_grad``) had no ``softmax``,
    ``log_softmax``, ``all`` or ``any``, which a recorded Node and torch.Tensor have: an
    evaluation loop's ``logits.softmax(1)`` was an AttributeError. softmax gives tp.softmax's
    bits; all/any torch's truth (as float32 masks, tp.all's) over None, ``()`` (no dim), an
    int or a tuple, NaN counting as nonzero, over no elements all 1 and any 0."""
    a = np.array([[[0, 1, np.nan], [2, 3, 4]], [[0, 0, 0], [1, -1, 0]]], np.float32)
    with tp.no_grad():
        x = tp.tensor(a) * 1.0
    assert isinstance(x, pc.Tensor)
    t = torch.from_numpy(a)
    for name in ("all", "any"):
        assert float(getattr(x, name)()) == float(getattr(t, name)())
        for dim in ((), 0, -1, (0, 2), (2, 0, 1)):
            for keepdim in (False, True):
                got = getattr(x, name)(dim, keepdim)
                assert got.dtype == np.float32
                np.testing.assert_array_equal(got.to_host(),
                                              getattr(t, name)(dim, keepdim).float().numpy())
        np.testing.assert_array_equal(getattr(x[:, :0], name)(1).to_host(),
                                      getattr(t[:, :0], name)(1).float().numpy())
    assert x.all(1).to_host().tolist() == [[0, 1, 1], [0, 0, 0]]     # NaN is nonzero
    b = np.array([[1.0, 2.0, 30.0], [-1.0, 0.0, 1.0]], np.float32)
    with tp.no_grad():
        y = tp.tensor(b) * 1.0
        for name in ("softmax", "log_softmax"):
            for dim in (0, 1, -1):
                got = getattr(y, name)(dim).to_host()
                assert got.tobytes() == getattr(tp, name)(y, dim).to_host().tobytes()
                np.testing.assert_allclose(got, getattr(torch.from_numpy(b), name)(dim).numpy(),
                                           rtol=1e-6, atol=1e-7)


def test_a_raw_tensors_var_and_std_are_pytorchs(queue):
    """A raw ``pc.Tensor`` (a model's output under ``no_grad``) had no ``var`` or ``std``,
    which a recorded Node and torch.Tensor have: ``feats.std(0)`` in an evaluation loop was
    an AttributeError. Both take torch.Tensor's ``(dim, unbiased, keepdim)`` by position
    (``t.var(False)`` the biased variance of everything, ``()`` every dim) and
    ``correction`` by keyword, match float64 torch and give a Node's bits (tp.var's)."""
    rng = np.random.default_rng(1)
    a = (rng.standard_normal((3, 4, 5)) * 3 + 1e3).astype(np.float32)
    with tp.no_grad():
        x = tp.tensor(a) * 1.0
        node = tp.tensor(a)
    assert isinstance(x, pc.Tensor)
    t = torch.from_numpy(a).double()
    for name in ("var", "std"):
        for args, kwargs in (((), {}), ((False,), {}), ((1, False), {}), ((1, True, True), {}),
                             (((0, 2),), {"correction": 0}), (((),), {}),
                             ((-1,), {"keepdim": True, "correction": 2})):
            got = getattr(x, name)(*args, **kwargs).to_host()
            want = getattr(t, name)(*args, **kwargs).numpy()
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-4)
            with tp.no_grad():
                same = getattr(node, name)(*args, **kwargs).to_host()
            assert got.tobytes() == same.tobytes()
    with pytest.raises(TypeError, match="unbiased=False and correction=0 given both"):
        x.var(1, False, correction=0)


@pytest.mark.parametrize("method", ["sum", "mean", "var", "std"])
@pytest.mark.parametrize("keepdim", [False, True])
def test_a_nodes_reductions_over_dim_empty_are_over_every_dim_as_pytorch(queue, method,
                                                                        keepdim):
    """PyTorch's ``x.sum(dim=())`` reduces every dim, as ``dim=None``: ``x.sum(dim=())`` and
    ``x.mean(dim=())`` gave ``x`` itself (numpy's ``axis=()``), so the sum of
    [[1, 5, 5, 2], [3, 4, 0, -3], [-1, -1, -2, 7]] came out the 3x4 input where PyTorch gives
    20, and ``x.var(())`` / ``x.std(())`` the variance of each element alone, all NaN, where
    PyTorch gives 10.06 and 3.17, silently."""
    import torch
    a = np.array([[1, 5, 5, 2], [3, 4, 0, -3], [-1, -1, -2, 7]], np.float32)
    t = torch.tensor(a, dtype=torch.float64, requires_grad=True)
    want = getattr(t, method)(dim=(), keepdim=keepdim)
    # the gradient of dim=None: torch's var and std over dim=() divide theirs by n - 1 = 0
    every = getattr(t, method)(dim=None, keepdim=keepdim)
    (every * every).sum().backward()
    for dim in ((), []):
        x = tp.tensor(a, requires_grad=True)
        with tp.Tape() as tape:
            out = getattr(x, method)(dim=dim, keepdim=keepdim)
            loss = tp.sum(out * out)
        tape.backward(loss)
        assert out.shape == tuple(want.shape)
        np.testing.assert_allclose(out.to_host(), want.detach().numpy(), rtol=1e-5)
        np.testing.assert_allclose(x.grad.to_host(), t.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_a_nodes_logsumexp_over_dim_empty_is_over_every_dim_as_pytorch(queue):
    """``x.logsumexp(dim=(), keepdim=True)`` reduces every dim, as torch.Tensor's (its
    ``amax`` over ``()``): parcl passed ``()`` on as numpy's ``axis=()``, which reduces none,
    so of [[1, 5, 5, 2], [3, 4, 0, -3], [-1, -1, -2, 7]] it gave the 3x4 input itself where
    PyTorch gives [[7.2999]], silently. (torch raises for ``keepdim=False``; parcl gives the
    0-d 7.2999, the same reduction.)"""
    import torch
    a = np.array([[1, 5, 5, 2], [3, 4, 0, -3], [-1, -1, -2, 7]], np.float32)
    t = torch.tensor(a, dtype=torch.float64, requires_grad=True)
    want = t.logsumexp(dim=(), keepdim=True)
    (want * want).sum().backward()
    for dim in ((), []):
        for keepdim in (False, True):
            x = tp.tensor(a, requires_grad=True)
            with tp.Tape() as tape:
                out = x.logsumexp(dim, keepdim)
                loss = tp.sum(out * out)
            tape.backward(loss)
            assert out.shape == ((1, 1) if keepdim else ())
            np.testing.assert_allclose(out.to_host().reshape(1, 1), want.detach().numpy(),
                                       rtol=1e-6)
            np.testing.assert_allclose(x.grad.to_host(), t.grad.numpy(), rtol=1e-5, atol=1e-7)
    assert tp.logsumexp(tp.tensor(a), ()).shape == (3, 4)     # numpy's axis=(): none


@pytest.mark.parametrize("method", ["sum", "mean"])
def test_a_nodes_sum_and_mean_take_their_first_argument_as_pytorchs_dim(queue, method):
    """``x.sum(dims)`` positionally is torch.Tensor's ``dim``: ``dims=()`` (a per-sample sum
    over ``tuple(range(1, x.ndim))`` of a 1-D batch) reduces every dim, as ``x.var(())``
    does. parcl read the first argument as numpy's ``axis``, so ``x.sum(())`` of
    [[1, 5, 5, 2], [3, 4, 0, -3], [-1, -1, -2, 7]] was the 3x4 input where PyTorch gives 20
    (``x.mean(())``: the input, not 1.667), silently. Numpy's ``axis=()`` by keyword still
    reduces none."""
    import torch
    a = np.array([[1, 5, 5, 2], [3, 4, 0, -3], [-1, -1, -2, 7]], np.float32)
    t = torch.tensor(a, requires_grad=True)
    for dims, keepdim in (((), False), ([], True), ((0, 1), False), (1, True), (-2, False)):
        x = tp.tensor(a, requires_grad=True)
        with tp.Tape() as tape:
            out = getattr(x, method)(dims, keepdim)
            loss = tp.sum(out * out)
        tape.backward(loss)
        t.grad = None
        want = getattr(t, method)(dims, keepdim)
        (want * want).sum().backward()
        assert out.shape == tuple(want.shape)
        np.testing.assert_allclose(out.to_host(), want.detach().numpy(), rtol=1e-6)
        np.testing.assert_allclose(x.grad.to_host(), t.grad.numpy(), rtol=1e-6)
    x = tp.tensor(a)
    assert float(x.sum(())) == 20.0 and abs(float(x.mean(())) - 20 / 12) < 1e-6
    np.testing.assert_array_equal(getattr(x, method)(axis=()).to_host(), a)
    assert getattr(x, method)(axis=1, keepdims=True).shape == (3, 1)


@pytest.mark.parametrize("method", ["sum", "mean"])
def test_a_raw_tensors_sum_and_mean_over_no_dims_reduce_every_dim_as_pytorch(queue, method):
    """A raw pc.Tensor (what a model gives under ``no_grad``) reads ``dim=()`` as PyTorch and
    a recorded Node do: every dim. Its ``sum(())``, ``sum(dim=())`` and ``mean(())`` of
    [[1, 5, 5, 2], [3, 4, 0, -3], [-1, -1, -2, 7]] were the 3x4 input (numpy's ``axis=()``)
    where PyTorch gives 20 and 1.667, so an evaluation of a per-sample sum over
    ``tuple(range(1, x.ndim))`` of a 1-D batch differed from training's, silently. Numpy's
    ``axis=()`` by keyword still reduces none."""
    import torch
    a = np.array([[1, 5, 5, 2], [3, 4, 0, -3], [-1, -1, -2, 7]], np.float32)
    t = pc.Tensor.from_host(queue, a)
    for dims, keepdim in (((), False), ([], True), ((0, 1), False), (1, True), (-2, False)):
        want = getattr(torch.from_numpy(a), method)(dims, keepdim)
        for got in (getattr(t, method)(dims, keepdim),
                    getattr(t, method)(dim=dims, keepdim=keepdim)):
            assert got.shape == tuple(want.shape)
            np.testing.assert_allclose(got.to_host(), want.numpy(), rtol=1e-6)
    assert float(t.sum(())) == 20.0 and abs(float(t.mean(())) - 20 / 12) < 1e-6
    np.testing.assert_array_equal(getattr(t, method)(axis=()).to_host(), a)
    assert getattr(t, method)(axis=1, keepdims=True).shape == (3, 1)


def test_a_numpy_bool_operand_is_refused_as_a_python_bool_not_taken_to_the_host(queue):
    """``t += np.True_`` (a flag from ``(a > b).any()``) gave numpy's reflected operator the
    tensor, which read it to the host: ``t`` was rebound to a host ndarray [2, 3, 4] and
    the tensor and its views kept [1, 2, 3], silently; ``t + np.True_`` was an ndarray too.
    Now a TypeError, as a Python bool operand is."""
    t = pc.Tensor.from_host(queue, np.array([1.0, 2.0, 3.0], np.float32))
    alias = t
    with pytest.raises(TypeError, match=r"pc.Tensor add: a bool operand"):
        t += np.True_
    assert t is alias
    for op in (lambda: t + np.True_, lambda: t * np.bool_(False), lambda: t < np.True_,
               lambda: t + True):
        with pytest.raises(TypeError):
            op()
    np.testing.assert_array_equal(alias.to_host(), [1.0, 2.0, 3.0])


def test_a_slice_with_no_elements_copies_as_pytorchs_clone(queue):
    """``t[:, 4:].copy()`` and ``copy_`` of a (3, 4) tensor's empty slice crashed with
    ``LogicError: clEnqueueCopyBuffer failed: INVALID_VALUE`` (OpenCL refuses a copy of no
    bytes) where PyTorch's ``clone`` and ``copy_`` give an empty (3, 0) tensor."""
    t = pc.Tensor.from_host(queue, np.ones((3, 4), np.float32))
    empty = t[:, 4:]
    assert empty.copy().to_host().shape == (3, 0)
    target = pc.Tensor.empty(queue, (3, 0))
    assert target.copy_(empty) is target and target.to_host().shape == (3, 0)


def test_writing_into_an_indexing_result_is_refused_and_setitem_writes_through(queue):
    """parcl's ``t[key]`` is a copy where PyTorch's is a view, so PyTorch's padding idiom
    ``emb.weight[0].fill_(0)`` under no_grad zeroed the copy and left the weight as it was,
    silently; now an in-place write into an indexing result raises, and ``t[key] = value``
    writes into ``t`` (numbers, tensors and arrays broadcast as numpy's)."""
    emb = pc.nn.Embedding(4, 3)
    before = emb.weight.value.to_host()
    with tp.no_grad():
        with pytest.raises(pc.ParclError, match=r"fill_: .*indexing result \(index 0\).*"
                                                r"t\[key\] = value"):
            emb.weight[0].fill_(0.0)
        np.testing.assert_array_equal(emb.weight.value.to_host(), before)
        emb.weight[0] = 0.0
    want = before.copy()
    want[0] = 0.0
    np.testing.assert_array_equal(emb.weight.value.to_host(), want)
    with pytest.raises(pc.ParclError, match="requires grad"):       # while recording
        emb.weight[1] = 1.0
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = pc.Tensor.from_host(queue, a)
    x[1:, ::2] = pc.Tensor.from_host(queue, np.array([100.0, 200.0], np.float32))
    a[1:, ::2] = [100.0, 200.0]
    x[:, 3] = 7
    a[:, 3] = 7
    x[0] = np.array([9, 8, 7, 6])
    a[0] = [9, 8, 7, 6]
    x[1:] = x[:-1]                                   # overlapping: read before written
    a[1:] = a[:-1].copy()
    np.testing.assert_array_equal(x.to_host(), a)
    for write in (lambda: x[0].__iadd__(1.0), lambda: x[:, 1].copy_(x[:, 2]),
                  lambda: x[2].reshape(2, 2).fill_(1.0)):
        with pytest.raises(pc.ParclError, match="indexing result"):
            write()
    row = x[1].copy()                                # a tensor of its own: writable
    row += 1.0
    np.testing.assert_array_equal(row.to_host(), a[1] + 1)
    with pytest.raises(pc.ShapeError, match=r"\(3,\) cannot be broadcast to the selection"):
        x[0] = np.ones(3)
    w = tp.tensor(np.ones((2, 2), np.float32), requires_grad=True)
    h = tp.tensor(np.full((2, 2), 3.0, np.float32))
    with tp.Tape() as tape:
        loss = tp.sum(w * h)                         # saves h for w's gradient
    h.value[0] = 5.0                                 # then h changes in place
    with pytest.raises(pc.ParclError, match="setitem|in place|inplace"):
        tape.backward(loss)


@pytest.mark.parametrize("make", [
    lambda x: x.narrow(0, 1, 1), lambda x: x.select(0, 1), lambda x: x.unbind(0)[1],
    lambda x: x.chunk(3)[1], lambda x: tp.split(x, 1)[1], lambda x: x.tensor_split(3)[1],
    lambda x: x.vsplit(3)[1], lambda x: x.hsplit(2)[0], lambda x: x.diagonal(),
    lambda x: x.t(), lambda x: x.T, lambda x: x.permute(1, 0), lambda x: x.movedim(0, 1),
    lambda x: x.swapaxes(0, 1), lambda x: x.value.T,
    lambda x: tp.expand(tp.reshape(x, (1, 3, 4)), (2, 3, 4))])
def test_writing_into_a_narrow_select_chunk_or_transpose_result_is_refused_as_a_copy(queue,
                                                                                    make):
    """Like ``x[key]``, parcl's narrow, select, unbind, chunk, split, diagonal and transposes
    are copies where PyTorch's are views: ``b.chunk(4)[1].fill_(1.0)`` (an LSTM forget-gate
    bias idiom) or ``w.t().fill_(0)`` under no_grad changed PyTorch's tensor (the (3, 4)
    arange's sum 66 became 44 for narrow, 0 for t) and left parcl's at 66, silently; now the
    write raises and ``x`` is as it was. Reshapes stay views: writing into them changes x."""
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = tp.tensor(pc.Tensor.from_host(queue, a), requires_grad=True)
    with tp.no_grad():
        piece = make(x)
        with pytest.raises(pc.ParclError, match=r"fill_: .* result, a copy in parcl where "
                                                r"PyTorch's is a view"):
            piece.fill_(0.0)
    loose = tp.tensor(pc.Tensor.from_host(queue, a))        # grad mode, nothing to record
    with pytest.raises(pc.ParclError, match="a copy in parcl"):
        make(loose).fill_(1.0)
    np.testing.assert_array_equal(x.value.to_host(), a)
    with tp.no_grad():
        x.reshape(4, 3).fill_(2.0)                   # a view in parcl too
        assert x.permute(0, 1).fill_(3.0) is not None    # nothing moves: x's own buffer
    np.testing.assert_array_equal(x.value.to_host(), np.full((3, 4), 3.0, np.float32))


def test_an_in_place_operator_on_a_recorded_indexing_result_is_refused_as_under_no_grad(queue):
    """While recording, ``r = h[:, 0]; r *= 2`` recorded ``r = r * 2``, a new Node, where
    PyTorch's ``r`` is a view that doubles column 0 of ``h``: ``h.sum()`` of ``w * 1`` over
    a (2, 3) arange was 15 in parcl and 18 in PyTorch, silently; now the operator raises,
    as it does on the copy under no_grad. On a Node of its own it records as before."""
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    w = tp.tensor(pc.Tensor.from_host(queue, a), requires_grad=True)
    with tp.Tape() as tape:
        h = w * 1.0
        for piece in (h[:, 0], h.narrow(1, 0, 1), h.t(), h.chunk(3, 1)[0]):
            with pytest.raises(pc.ParclError, match=r"Node \*=: .* a copy in parcl"):
                piece *= 2.0
        own = h * 1.0
        own *= 2.0
        loss = tp.sum(own)
    tape.backward(loss)
    assert float(loss) == 30.0
    np.testing.assert_array_equal(w.grad.to_host(), np.full((2, 3), 2.0, np.float32))


def test_relu_in_place_on_an_indexing_result_is_refused_as_its_in_place_operators(queue):
    """``tp.relu(x[0], inplace=True)`` overwrote the copy parcl's ``x[0]`` is and left ``x``
    as it was, where PyTorch's ``x[0]`` is a view whose ``relu_`` reaches ``x``: the sum of
    ``arange(6) - 3`` as (2, 3) stayed -3 where PyTorch's became 3, silently; now refused
    (eager and recorded), and a tensor of its own is still overwritten in place."""
    a = np.arange(6, dtype=np.float32).reshape(2, 3) - 3.0
    x = pc.Tensor.from_host(queue, a)
    with tp.no_grad(), pytest.raises(pc.ParclError, match=r"relu\(inplace=True\): .* a copy"):
        tp.relu(x[0], inplace=True)
    np.testing.assert_array_equal(x.to_host(), a)
    w = tp.tensor(pc.Tensor.from_host(queue, a), requires_grad=True)
    with tp.Tape():
        h = w * 1.0
        with pytest.raises(pc.ParclError, match="narrow's result"):
            tp.relu(h.narrow(0, 0, 1), inplace=True)
    tp.relu(x, inplace=True)
    np.testing.assert_array_equal(x.to_host(), np.maximum(a, 0.0))


def test_setitem_drops_a_values_leading_ones_as_pytorch(queue):
    """``t[0, 0] = a (1,) tensor`` and ``t[0] = row[None]`` were ShapeErrors ('a value of
    shape (1,) cannot be broadcast to the selection ()') where PyTorch drops the value's
    leading size-1 dims and writes it; more dims than the selection's that are not 1 are
    still refused, as PyTorch's."""
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    x, want = pc.Tensor.from_host(queue, a), torch.tensor(a)
    x[0, 0] = pc.Tensor.from_host(queue, np.array([50.0], np.float32))
    want[0, 0] = torch.tensor([50.0])
    x[1] = pc.Tensor.from_host(queue, np.full((1, 1, 4), -2.0, np.float32))
    want[1] = torch.full((1, 1, 4), -2.0)
    x[:, 1:3] = np.ones((1, 1, 2), np.float32) * 7
    want[:, 1:3] = torch.ones(1, 1, 2) * 7
    np.testing.assert_array_equal(x.to_host(), want.numpy())
    with pytest.raises(pc.ShapeError, match=r"\(2, 4\) cannot be broadcast to the selection"):
        x[0] = np.ones((2, 4), np.float32)


def test_setitem_of_a_value_that_requires_grad_while_recording_is_refused(queue):
    """``out = tp.zeros(3, 4); out[0] = w * 3`` while recording copied the value and
    recorded nothing, where PyTorch records the write: the loss ``sum(out ** 2) + sum(w)``
    of a (1, 4) w of ones gave w the gradient 1 where PyTorch's is 19, silently; now a
    ParclError that says how to build ``out`` (under no_grad the value is copied, as
    PyTorch's)."""
    w = tp.tensor(np.ones((1, 4), np.float32), requires_grad=True)
    for make in (lambda: tp.zeros(3, 4), lambda: tp.tensor(np.zeros((3, 4), np.float32)),
                 lambda: pc.Tensor.zeros(queue, (3, 4))):
        out = make()
        with tp.Tape(), pytest.raises(pc.ParclError, match=r"requires grad .* no gradient "
                                                            r"would reach the value"):
            out[0] = w * 3.0
        with tp.no_grad():
            out[1] = w * 3.0
        got = out.value if isinstance(out, tp.Node) else out
        np.testing.assert_array_equal(got.to_host()[:2], [[0.0] * 4, [3.0] * 4])
