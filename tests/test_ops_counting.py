"""searchsorted, bucketize, isin, histc, bincount, unique, unique_consecutive, nonzero,
argwhere, count_nonzero and unravel_index: results, dtypes and shapes against PyTorch (ties,
NaNs, empty results and larger inputs than one compaction block), and the errors PyTorch
raises."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from conftest import leaf, up
from parcl.kernels import counting
from torch_reference import raises_like_torch

NAN = np.nan


def _ints(queue, a, dtype=np.int64):
    return pc.Tensor.from_host(queue, np.asarray(a, dtype))


def _same(got, want):
    got = got.to_host()
    assert got.shape == tuple(want.shape), (got.shape, tuple(want.shape))
    np.testing.assert_array_equal(got, want.numpy())


@pytest.mark.parametrize("right", [False, True])
def test_searchsorted_finds_insertion_points_as_pytorch(queue, rng, right):
    seq = np.sort(rng.integers(0, 6, (3, 9)).astype(np.float32), 1)
    seq[2, -2:] = NAN                                     # NaN sorts last
    values = rng.integers(-1, 8, (3, 5)).astype(np.float32)
    values[0, 0] = NAN
    _same(tp.searchsorted(up(queue, seq), up(queue, values), right=right),
          torch.searchsorted(torch.tensor(seq), torch.tensor(values), right=right))
    side = "right" if right else "left"
    got = tp.searchsorted(up(queue, seq[0]), up(queue, values), side=side, out_int32=True)
    assert got.dtype == np.int32
    _same(got, torch.searchsorted(torch.tensor(seq[0]), torch.tensor(values), side=side,
                                  out_int32=True))
    shuffled = rng.permutation(9)
    sorter = np.argsort(seq[0][shuffled], kind="stable")
    _same(tp.searchsorted(up(queue, seq[0][shuffled]), up(queue, values), right=right,
                          sorter=_ints(queue, sorter)),
          torch.searchsorted(torch.tensor(seq[0][shuffled]), torch.tensor(values), right=right,
                             sorter=torch.tensor(sorter)))
    assert int(tp.searchsorted(up(queue, seq[0]), 2.0, right=right).to_host()) == int(
        torch.searchsorted(torch.tensor(seq[0]), 2.0, right=right))


def test_bucketize_puts_values_in_buckets_as_pytorch(queue):
    x = np.array([[1.0, 5.0], [3.0, 9.0]], np.float32)
    bounds = np.array([1.0, 3.0, 5.0, 7.0], np.float32)
    for right in (False, True):
        got = tp.bucketize(up(queue, x), up(queue, bounds), right=right)
        _same(got, torch.bucketize(torch.tensor(x), torch.tensor(bounds), right=right))
    np.testing.assert_array_equal(tp.bucketize(up(queue, x), up(queue, bounds)).to_host(),
                                  [[0, 2], [1, 4]])


def test_isin_tests_membership_as_pytorch(queue, rng):
    a = rng.integers(0, 10, (4, 6)).astype(np.float32)
    a[0, 0] = NAN
    test = np.array([3.0, 7.0, NAN, 3.0, -0.0], np.float32)
    for invert in (False, True):
        want = torch.isin(torch.tensor(a), torch.tensor(test), invert=invert)
        got = tp.isin(up(queue, a), up(queue, test), invert=invert)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got.to_host(), want.numpy().astype(np.float32))
    np.testing.assert_array_equal(tp.isin(up(queue, [1.0, 2.0]), 2.0).to_host(), [0.0, 1.0])
    np.testing.assert_array_equal(tp.isin(0.0, up(queue, test)).to_host(), 1.0)   # -0.0 == 0


def test_histc_counts_as_pytorch(queue, rng):
    a = (rng.standard_normal(3000) * 2).astype(np.float32)
    a[:5] = [NAN, 0.0, 1.0, -1.0, 3.0]
    for bins, lo, hi in ((10, -1.0, 1.0), (7, 0.0, 3.0), (100, -3.3, 2.9)):
        _same(tp.histc(up(queue, a), bins, lo, hi),
              torch.histc(torch.tensor(a), bins, lo, hi))
    b = a[5:].reshape(5, -1)
    _same(tp.histc(up(queue, b), 13), torch.histc(torch.tensor(b), 13))     # data range
    _same(tp.histc(up(queue, [2.0, 2.0]), 4), torch.histc(torch.tensor([2.0, 2.0]), 4))


def test_bincount_counts_and_sums_weights_in_order_as_pytorch(queue, rng):
    n = 3 * counting.BLOCK + 17
    x = rng.integers(0, 40, n)
    w = rng.standard_normal(n).astype(np.float32)
    got = tp.bincount(_ints(queue, x))
    assert got.dtype == np.int64
    _same(got, torch.bincount(torch.tensor(x)))
    _same(tp.bincount(_ints(queue, x, np.int32), minlength=50),
          torch.bincount(torch.tensor(x, dtype=torch.int32), minlength=50))
    sums = tp.bincount(_ints(queue, x), up(queue, w)).to_host()
    in_order = np.zeros(40, np.float32)
    for i, v in enumerate(x):                       # float32, in index order: bit for bit
        in_order[v] = np.float32(in_order[v] + w[i])
    np.testing.assert_array_equal(sums, in_order)
    np.testing.assert_allclose(sums, torch.bincount(torch.tensor(x), torch.tensor(w)).numpy(),
                               rtol=1e-5, atol=1e-5)
    _same(tp.bincount(_ints(queue, [0, 1])[:0], minlength=3),
          torch.bincount(torch.tensor([], dtype=torch.long), minlength=3))


def test_unique_sorts_counts_and_inverts_as_pytorch(queue, rng):
    a = rng.integers(0, 9, (40, 70)).astype(np.float32)       # 2800: several blocks
    a[0, :3] = [NAN, 2.5, NAN]
    values, inverse, counts = tp.unique(up(queue, a), return_inverse=True, return_counts=True)
    want = torch.unique(torch.tensor(a), return_inverse=True, return_counts=True)
    for got, w in zip((values, inverse, counts), want):
        _same(got, w)
    _same(tp.unique(up(queue, a), sorted=False), torch.unique(torch.tensor(a), sorted=False))
    values, counts = leaf(queue, [[3.0, 1.0], [3.0, 3.0]]).unique(return_counts=True)
    np.testing.assert_array_equal(values.to_host(), [1.0, 3.0])
    np.testing.assert_array_equal(counts.to_host(), [1, 3])


def test_integer_inputs_are_searched_and_counted_as_pytorch(queue, rng):
    a = rng.integers(-50, 50, (30, 40))
    b = rng.integers(-60, 60, 25)
    for dtype in (np.int64, np.int32):
        x, t = _ints(queue, a, dtype), torch.tensor(a.astype(dtype))
        got = tp.unique(x, return_inverse=True, return_counts=True)
        assert [g.dtype for g in got] == [dtype, np.int64, np.int64]       # as PyTorch's
        for g, want in zip(got, torch.unique(t, return_inverse=True, return_counts=True)):
            _same(g, want)
        np.testing.assert_array_equal(
            tp.isin(x, _ints(queue, b, dtype)).to_host(),
            torch.isin(t, torch.tensor(b.astype(dtype))).numpy().astype(np.float32))
        seq = np.sort(b).astype(dtype)
        _same(tp.searchsorted(_ints(queue, seq, dtype), x, right=True),
              torch.searchsorted(torch.tensor(seq), t, right=True))
        _same(tp.bucketize(x, _ints(queue, seq, dtype)),
              torch.bucketize(t, torch.tensor(seq)))


def test_unique_consecutive_keeps_runs_as_pytorch(queue, rng):
    a = np.repeat(rng.integers(0, 3, 900), rng.integers(1, 4, 900)).astype(np.float32)
    a[:4] = [NAN, NAN, 1.0, 1.0]
    want = torch.unique_consecutive(torch.tensor(a), return_inverse=True, return_counts=True)
    got = tp.unique_consecutive(up(queue, a), return_inverse=True, return_counts=True)
    for g, w in zip(got, want):
        _same(g, w)
    ints = a[4:].astype(np.int64).reshape(-1)
    _same(tp.unique_consecutive(_ints(queue, ints)), torch.unique_consecutive(
        torch.tensor(ints)))


@pytest.mark.parametrize("shape", [(7,), (3, 5), (40, 30, 3), ()])
def test_nonzero_and_argwhere_list_coordinates_in_order_as_pytorch(queue, rng, shape):
    a = (rng.integers(0, 3, shape) * (rng.random(shape) < 0.6)).astype(np.float32)
    if a.size > 3:
        a.reshape(-1)[:3] = [NAN, -0.0, 0.0]
    t = torch.tensor(a)
    _same(tp.nonzero(up(queue, a)), torch.nonzero(t))
    _same(tp.argwhere(up(queue, a)), torch.argwhere(t))
    for got, want in zip(tp.nonzero(up(queue, a), as_tuple=True), torch.nonzero(t,
                                                                                as_tuple=True)):
        _same(got, want)
    ints = np.nan_to_num(a, nan=1.0).astype(np.int64)
    _same(tp.nonzero(_ints(queue, ints)), torch.nonzero(torch.tensor(ints)))
    _same(tp.nonzero(up(queue, np.zeros(shape))), torch.nonzero(torch.zeros(shape)))


def test_count_nonzero_counts_exactly_as_pytorch(queue, rng):
    a = (rng.integers(0, 3, (6, 5, 4)) * 1.0).astype(np.float32)
    a[0, 0, 0] = NAN
    t = torch.tensor(a)
    for dim in (None, 0, -1, (0, 2), (2, 0), (0, 1, 2)):
        got = tp.count_nonzero(up(queue, a), dim)
        assert got.dtype == np.int64
        _same(got, torch.count_nonzero(t, dim))
    _same(tp.count_nonzero(_ints(queue, a[1:].astype(np.int32)), 1),
          torch.count_nonzero(torch.tensor(a[1:].astype(np.int32)), 1))
    big = np.ones(3 * counting.BLOCK + 5, np.float32)
    assert int(tp.count_nonzero(up(queue, big)).to_host()) == big.size
    assert int(leaf(queue, a).count_nonzero().to_host()) == int(np.count_nonzero(a))


def test_unravel_index_as_pytorch_wrapping_each_dim(queue):
    flat = np.array([[5, -1], [6, -7]])
    for shape in ((2, 3), (3, 2, 1), (6,)):
        got = tp.unravel_index(_ints(queue, flat), shape)
        want = torch.unravel_index(torch.tensor(flat), shape)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)
    rows, cols = tp.unravel_index(_ints(queue, [4, 1], np.int32), (2, 3))
    np.testing.assert_array_equal(rows.to_host(), [1, 0])
    np.testing.assert_array_equal(cols.to_host(), [1, 1])


def test_node_methods_reach_the_counting_ops(queue):
    x = leaf(queue, [[0.0, 2.0], [2.0, 5.0]])
    np.testing.assert_array_equal(x.nonzero().to_host(), [[0, 1], [1, 0], [1, 1]])
    np.testing.assert_array_equal(x.argwhere().to_host(), [[0, 1], [1, 0], [1, 1]])
    np.testing.assert_array_equal(x.unique().to_host(), [0.0, 2.0, 5.0])
    np.testing.assert_array_equal(x.unique_consecutive().to_host(), [0.0, 2.0, 5.0])
    np.testing.assert_array_equal(x.histc(3, 0, 6).to_host(), [1.0, 2.0, 1.0])
    np.testing.assert_array_equal(x.count_nonzero(1).to_host(), [1, 2])
    labels = tp.tensor(_ints(queue, [1, 1, 3]))
    np.testing.assert_array_equal(labels.bincount().to_host(), [0, 2, 0, 1])


def test_counting_errors_name_the_op_and_the_shapes_as_pytorch(queue):
    raises_like_torch(lambda: tp.bincount(_ints(queue, [1, -1])),
                      lambda: torch.bincount(torch.tensor([1, -1])), "bincount")
    raises_like_torch(lambda: tp.bincount(_ints(queue, [[1]])),
                      lambda: torch.bincount(torch.tensor([[1]])), "bincount")
    raises_like_torch(lambda: tp.bincount(up(queue, [1.0])),
                      lambda: torch.bincount(torch.tensor([1.0])), "bincount")
    raises_like_torch(lambda: tp.bincount(_ints(queue, [1, 2]), up(queue, [1.0])),
                      lambda: torch.bincount(torch.tensor([1, 2]), torch.tensor([1.0])),
                      "bincount")
    raises_like_torch(lambda: tp.histc(up(queue, [1.0]), 0),
                      lambda: torch.histc(torch.tensor([1.0]), 0), "histc")
    raises_like_torch(lambda: tp.histc(up(queue, [1.0]), 4, 2, 1),
                      lambda: torch.histc(torch.tensor([1.0]), 4, 2, 1), "histc")
    raises_like_torch(lambda: tp.histc(up(queue, [NAN, 1.0]), 3),
                      lambda: torch.histc(torch.tensor([NAN, 1.0]), 3), "histc")
    seq, vals = up(queue, np.ones((2, 3))), up(queue, np.ones((3, 1)))
    msg = raises_like_torch(lambda: tp.searchsorted(seq, vals),
                            lambda: torch.searchsorted(torch.ones(2, 3), torch.ones(3, 1)),
                            "searchsorted")
    assert "(2, 3)" in msg and "(3, 1)" in msg
    raises_like_torch(lambda: tp.searchsorted(up(queue, [1.0, 2.0]), 1.0, right=True,
                                              side="left"),
                      lambda: torch.searchsorted(torch.tensor([1.0, 2.0]), 1.0, right=True,
                                                 side="left"), "searchsorted")
    raises_like_torch(lambda: tp.searchsorted(up(queue, [1.0, 2.0]), 1.0,
                                              sorter=_ints(queue, [0, 2])),
                      lambda: torch.searchsorted(torch.tensor([1.0, 2.0]), 1.0,
                                                 sorter=torch.tensor([0, 2])), "searchsorted")
    raises_like_torch(lambda: tp.bucketize(up(queue, [1.0]), up(queue, [[1.0]])),
                      lambda: torch.bucketize(torch.tensor([1.0]), torch.tensor([[1.0]])),
                      "bucketize")
    raises_like_torch(lambda: tp.count_nonzero(up(queue, [1.0]), 1),
                      lambda: torch.count_nonzero(torch.tensor([1.0]), 1), "count_nonzero")
    with pytest.raises(pc.ShapeError, match="unique: dim=0 is not supported"):
        tp.unique(up(queue, [1.0]), dim=0)
    with pytest.raises(pc.DTypeError, match=r"unique: input \(1,\) has dtype uint8"):
        tp.unique(pc.Tensor.from_host(queue, np.array([True])))
    with pytest.raises(pc.ShapeError, match=r"isin: integer test_elements \(2,\) holds "
                                            r"values in \[1, 16777216\]; only"):
        tp.isin(_ints(queue, [1]), _ints(queue, [1, 2 ** 24]))


COUNTS_OF_ROWS = {
    "nonzero": lambda rows, ids: tp.nonzero(rows),
    "nonzero_as_tuple": lambda rows, ids: tp.nonzero(rows, as_tuple=True),
    "unique": lambda rows, ids: tp.unique(rows, return_inverse=True, return_counts=True),
    "unique_of_ids": lambda rows, ids: tp.unique(ids),
    "unique_consecutive": lambda rows, ids: tp.unique_consecutive(rows),
    "bincount": lambda rows, ids: tp.bincount(ids),
    "histc": lambda rows, ids: tp.histc(rows, bins=4),
    "histc_in_a_range": lambda rows, ids: tp.histc(rows, bins=4, min=0, max=2),
    "count_nonzero": lambda rows, ids: tp.count_nonzero(rows, 1),
    "searchsorted": lambda rows, ids: tp.searchsorted(rows, rows),
    "searchsorted_of_ids": lambda rows, ids: tp.searchsorted(ids, 1),
    "isin": lambda rows, ids: tp.isin(rows, 1.0),
    "unravel_index": lambda rows, ids: tp.unravel_index(ids, (2, 2)),
}


@pytest.mark.parametrize("op", list(COUNTS_OF_ROWS))
def test_counts_of_rows_from_an_out_of_range_id_raise_as_every_other_ops_do(queue, op):
    """What the counting ops compute from rows picked by a token id outside ``[0, V)``
    raises the embedding's error (at the call where a count read back sizes the result, else
    at the host read), as tp.median's and tp.sum's do: they counted the garbage rows without a
    word (tp.nonzero of them gave 6 coordinates, tp.unique 4 values)."""
    weight = pc.nn.Parameter.from_host(queue, np.ones((4, 3), np.float32))
    with tp.Tape():
        rows = tp.embedding(pc.Tensor.from_host(queue, np.array([0, 4])), weight)
    ids = tp.argmax(rows, 1)
    with pytest.raises(pc.ShapeError, match="embedding: index 4"):
        out = COUNTS_OF_ROWS[op](rows, ids)
        for t in out if isinstance(out, tuple) else (out,):
            t.to_host()
    good = tp.embedding(pc.Tensor.from_host(queue, np.array([0, 3])), weight)
    out = COUNTS_OF_ROWS[op](good, tp.argmax(good, 1))
    for t in out if isinstance(out, tuple) else (out,):
        t.to_host()                                                  # a good id reads back
