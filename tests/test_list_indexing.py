"""x[key] with one 1-D int list / array / tensor in one position (PyTorch's advanced indexing
with one index array: index_select along that dim), and t[mask] = number (an in-place
masked_fill): values and gradients against PyTorch and finite differences, nanoGPT's two
lines verbatim, and the keys parcl refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from conftest import leaf
from torch_reference import against_torch

KEYS = [(slice(None), [-1], slice(None)), ([1, 0],), (Ellipsis, [3, 0, 0, 2]), (0, [2, -3]),
        (None, slice(None), [1]), (1, slice(None), [0, 3, 1, 2, 2]), (slice(None), [2, 1, 0])]


@pytest.mark.parametrize("key", KEYS)
def test_list_index_picks_as_pytorch(queue, rng, key):
    a = rng.standard_normal((2, 3, 4))
    want = torch.tensor(a)[key].numpy()
    x = pc.Tensor.from_host(queue, a.astype(np.float32))
    np.testing.assert_allclose(x[key].to_host(), want, rtol=1e-6)
    with tp.Tape():
        y = leaf(queue, a)[key]
    np.testing.assert_allclose(y.to_host(), want, rtol=1e-6)


@pytest.mark.parametrize("key", KEYS)
def test_list_index_gradient_as_pytorch(queue, rng, key):
    a = rng.standard_normal((2, 3, 4))
    assert tp.gradcheck(lambda v: v[key], [leaf(queue, a)])
    against_torch(queue, rng, lambda v: v[key], lambda v: v[key], [a])


def test_index_arrays_and_tensors_pick_as_a_list(queue):
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    x = pc.Tensor.from_host(queue, a)
    for index in (np.array([2, -1]), np.array([2, -1], np.int32),
                  pc.Tensor.from_host(queue, np.array([2, -1]))):
        np.testing.assert_array_equal(x[:, :, index].to_host(), a[:, :, [2, 3]])
        np.testing.assert_array_equal(tp.tensor(x)[..., index].to_host(), a[:, :, [2, 3]])
    assert x[:, []].shape == (2, 0, 4)


def test_repeated_list_entries_add_their_gradients(queue):
    x = leaf(queue, np.zeros((3, 2)))
    with tp.Tape() as tape:
        y = tp.sum(x[[2, 0, 2, 2]])
    tape.backward(y)
    np.testing.assert_array_equal(x.grad.to_host(), [[1, 1], [0, 0], [3, 3]])


def test_mask_setitem_fills_in_place_as_pytorch(queue, rng):
    a = rng.standard_normal((3, 5)).astype(np.float32)
    t, x = torch.tensor(a), pc.Tensor.from_host(queue, a)
    t[t > 0.5] = 7.0
    x[x > 0.5] = 7.0
    np.testing.assert_array_equal(x.to_host(), t.numpy())
    x[a < 0] = -1.0                                   # a bool numpy mask
    t[torch.tensor(a < 0)] = -1.0
    np.testing.assert_array_equal(x.to_host(), t.numpy())
    n = tp.tensor(pc.Tensor.from_host(queue, a), True)
    with tp.no_grad():                                # a Node's value, as t[key] = value
        n[n.value < 0] = 0.0
    np.testing.assert_array_equal(n.to_host(), np.where(a < 0, 0, a))


def test_nanogpt_generate_lines_run_as_pytorch(queue, rng):
    a = rng.standard_normal((2, 5, 8)).astype(np.float32)
    x, t = pc.Tensor.from_host(queue, a), torch.tensor(a)
    with tp.no_grad():
        logits = x[:, [-1], :]                        # GPT.forward's lm_head(x[:, [-1], :])
        logits = logits[:, -1, :] / 0.8               # generate's temperature
        v, _ = tp.topk(logits, min(3, logits.size(-1)))
        logits[logits < v[:, [-1]]] = -float('Inf')
    tlogits = t[:, [-1], :][:, -1, :] / 0.8
    tv, _ = torch.topk(tlogits, min(3, tlogits.size(-1)))
    tlogits[tlogits < tv[:, [-1]]] = -float('Inf')
    np.testing.assert_allclose(logits.to_host(), tlogits.numpy(), rtol=1e-6)
    assert np.isinf(logits.to_host()).sum() == 2 * 5


@pytest.mark.parametrize("key,error,words", [
    (([0], [1]), pc.DTypeError, "index arrays"),
    ((np.array([True, False]),), pc.DTypeError, "bool"),
    ((slice(None), [[0, 1]]), pc.DTypeError, "(1, 2)"),
    ((slice(None), [3]), IndexError, "index 3 is out of range for dimension 1 of size 3"),
    ((slice(None), [-4]), pc.ShapeError, "index -4 is out of range"),
])
def test_unsupported_index_arrays_are_refused(queue, key, error, words):
    x = pc.Tensor.from_host(queue, np.zeros((2, 3), np.float32))
    for t in (x, tp.tensor(x, True)):
        with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
            t[key]


def test_mask_setitem_refuses_another_shape_or_a_tensor_value(queue):
    x = pc.Tensor.from_host(queue, np.zeros((2, 3), np.float32))
    with pytest.raises(pc.ShapeError, match=r"a mask of shape \(3,\) into a tensor of shape"):
        x[x[0] > 0] = 1.0
    with pytest.raises(pc.ShapeError, match="takes a number or a 0-d tensor"):
        x[x > 0] = x[0]
    with pytest.raises(pc.DTypeError, match="setitem"):
        x[:, [0]] = 1.0


def test_a_shuffled_batch_of_rows_is_one_gather_not_a_copy_per_row(queue, rng, monkeypatch):
    """``x[perm[:64]]`` on a raw tensor (a shuffled batch picked from a dataset) took one
    strided copy per arithmetic run of the index: 64 launches for 64 random rows. An index of
    many runs is one gather kernel, with the same values as PyTorch; a short or evenly spaced
    index stays strided copies."""
    from parcl.kernels import gather

    calls = []
    real = gather.gather_forward
    monkeypatch.setattr(gather, "gather_forward", lambda *a: calls.append(1) or real(*a))
    a = rng.standard_normal((200, 3, 5)).astype(np.float32)
    x = pc.Tensor.from_host(queue, a)
    perm = rng.permutation(200)[:64]
    for key in ((perm,), (slice(None), 1, list(perm % 5)), ([3, 1], slice(None))):
        want = torch.from_numpy(a)[tuple(torch.as_tensor(k) if isinstance(k, (list, np.ndarray))
                                         else k for k in key)].numpy()
        np.testing.assert_array_equal(x[key].to_host(), want)
    assert len(calls) == 2


def test_a_shuffled_batch_gathers_from_the_tensor_itself_and_keeps_no_index(queue, rng,
                                                                           monkeypatch):
    """The gather read a contiguous copy of the whole tensor first (a (200000, 64) dataset
    copied for every batch of 64 rows), and a Node's index went into the queue's table of
    launch plans as a constant, one entry per shuffled batch, which fills it (no plan is kept
    after 4096). Neither now: the rows come straight from the tensor, the index is uploaded
    per call."""
    from parcl.kernels import strided

    shapes = []
    real = strided.read_view
    monkeypatch.setattr(strided, "read_view", lambda x, v: shapes.append(x.shape) or real(x, v))
    a = rng.standard_normal((500, 4)).astype(np.float32)
    x = pc.Tensor.from_host(queue, a)
    perm = rng.permutation(500)[:64]
    np.testing.assert_array_equal(x[perm].to_host(), a[perm])
    assert (500, 4) not in shapes
    node = tp.tensor(x, requires_grad=True)
    before = len(queue.choices)
    for _ in range(20):
        perm = rng.permutation(500)[:32]
        with tp.Tape():
            np.testing.assert_array_equal(node[perm].to_host(), a[perm])
    assert len(queue.choices) - before <= 2        # launch plans, not one index per call
