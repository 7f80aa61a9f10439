"""tp.conv1d / max_pool1d / avg_pool1d and pc.nn.Conv1d / MaxPool1d / AvgPool1d against
torch (outputs, the input's and every parameter's gradient), gradcheck through the (N, C, 1, L)
view, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch_reference import against_torch
from xfmr_reference import compare

import parcl as pc
import parcl.tape as tp
from conftest import leaf
from parcl.errors import ShapeError

CONV = [
    dict(),
    dict(stride=2, padding=1),
    dict(padding=2, dilation=2),
    dict(padding="same"),
    dict(padding="same", dilation=3),
    dict(padding="valid", stride=3),
    dict(groups=2, padding=1),
    dict(groups=4, padding="same"),                 # depthwise
]


@pytest.mark.filterwarnings("ignore:Using padding='same'")   # torch's note on its own copy
@pytest.mark.parametrize("kw", CONV, ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items())
                         or "default")
@pytest.mark.parametrize("k", [3, 4])
def test_conv1d_matches_torch(queue, rng, kw, k):
    groups = kw.get("groups", 1)
    x = rng.standard_normal((2, 4, 11))
    w = rng.standard_normal((8, 4 // groups, k))
    b = rng.standard_normal(8)
    against_torch(queue, rng, lambda x, w, b: tp.conv1d(x, w, b, **kw),
                  lambda x, w, b: F.conv1d(x, w, b, **kw), [x, w, b], tol=1e-4)


def test_conv1d_unbatched_and_gradcheck(queue, rng):
    against_torch(queue, rng, lambda x, w: tp.conv1d(x, w, padding="same"),
                  lambda x, w: F.conv1d(x, w, padding="same"),
                  [rng.standard_normal((3, 7)), rng.standard_normal((2, 3, 2))])
    x, w = leaf(queue, rng.standard_normal((1, 2, 6))), leaf(queue, rng.standard_normal((3, 2, 3)))
    assert tp.gradcheck(lambda x, w: tp.conv1d(x, w, stride=2, padding=1), [x, w])


POOL = [
    ("max", dict(kernel_size=2)),
    ("max", dict(kernel_size=3, stride=2, padding=1)),
    ("max", dict(kernel_size=3, stride=2, ceil_mode=True)),
    ("max", dict(kernel_size=2, dilation=2)),
    ("avg", dict(kernel_size=2)),
    ("avg", dict(kernel_size=3, stride=2, padding=1)),
    ("avg", dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)),
    ("avg", dict(kernel_size=3, stride=2, ceil_mode=True)),
]


@pytest.mark.parametrize("kind,kw", POOL, ids=[f"{k}-{i}" for i, (k, _) in enumerate(POOL)])
@pytest.mark.parametrize("shape", [(2, 3, 10), (3, 9)], ids=["batched", "unbatched"])
def test_pools_match_torch(queue, rng, kind, kw, shape):
    x = rng.standard_normal(shape)
    against_torch(queue, rng, lambda x: getattr(tp, f"{kind}_pool1d")(x, **kw),
                  lambda x: getattr(F, f"{kind}_pool1d")(x, **kw), [x], tol=1e-5)


@pytest.mark.parametrize("kw", [dict(), dict(stride=2, padding=1, bias=False),
                                dict(padding="same", dilation=2, groups=2)],
                         ids=["default", "strided-nobias", "same-groups"])
def test_conv1d_module_matches_torch(queue, rng, kw):
    torch.manual_seed(0)
    tm, pm = torch.nn.Conv1d(4, 6, 3, **kw), pc.nn.Conv1d(4, 6, 3, **kw)
    assert list(pm.state_dict()) == list(tm.state_dict())
    assert pm.weight.shape == tuple(tm.weight.shape)

    def run(m, x):
        return m(x)
    compare(queue, tm, pm, [rng.standard_normal((2, 4, 9)).astype(np.float32)], run, run,
            tol=1e-5)


def test_pool_modules_and_sequential(queue, rng):
    torch.manual_seed(0)
    tm = torch.nn.Sequential(torch.nn.Conv1d(2, 4, 3, padding=1), torch.nn.MaxPool1d(2),
                             torch.nn.Conv1d(4, 4, 3), torch.nn.AvgPool1d(2, ceil_mode=True))
    pm = pc.nn.Sequential(pc.nn.Conv1d(2, 4, 3, padding=1), pc.nn.MaxPool1d(2),
                          pc.nn.Conv1d(4, 4, 3), pc.nn.AvgPool1d(2, ceil_mode=True))

    def run(m, x):
        return m(x)
    out, = compare(queue, tm, pm, [rng.standard_normal((3, 2, 12)).astype(np.float32)], run,
                   run, tol=1e-5)
    assert out.shape == (3, 4, 2)


def test_conv1d_initialisation_bounds():
    m = pc.nn.Conv1d(6, 4, 5, groups=2)
    bound = 1 / np.sqrt(3 * 5)
    for v in m.state_dict().values():
        assert np.abs(v).max() <= bound


def test_refusals(queue, rng):
    x = leaf(queue, rng.standard_normal((2, 4, 9)))
    with pytest.raises(ShapeError, match="conv1d: padding='same' needs stride 1"):
        tp.conv1d(x, leaf(queue, rng.standard_normal((4, 4, 3))), padding="same", stride=2)
    with pytest.raises(ShapeError, match="conv1d: weight must be 3-d"):
        tp.conv1d(x, leaf(queue, rng.standard_normal((4, 4, 3, 3))))
    with pytest.raises(ShapeError, match="conv1d: expected a 2-d"):
        tp.conv1d(leaf(queue, rng.standard_normal((2, 4, 9, 1))),
                  leaf(queue, rng.standard_normal((4, 4, 3))))
    with pytest.raises(ShapeError, match="padding_mode must be one of"):
        pc.nn.Conv1d(4, 4, 3, padding_mode="reflected")
    with pytest.raises(ShapeError, match="expected 4"):
        pc.nn.Conv1d(4, 4, 3)(leaf(queue, rng.standard_normal((2, 3, 9))))
    with pytest.raises(ShapeError, match="groups=3"):
        pc.nn.Conv1d(4, 4, 3, groups=3)
    with pytest.raises(ShapeError, match="max_pool1d: kernel_size"):
        tp.max_pool1d(x, 2.5)


@pytest.mark.parametrize("pool", ["max_pool1d", "avg_pool1d"])
def test_a_1d_pools_bad_window_is_named_in_1d_terms(pool):
    """Its errors named the 2-D pool underneath and (1, k) pairs (``max_pool2d: padding (0,
    2) ...``); they name the 1-D op and its own numbers."""
    x = tp.tensor(np.ones((1, 2, 5), np.float32))
    fn = getattr(tp, pool)
    with pytest.raises(pc.ShapeError, match=rf"^{pool}: padding 2 must be at most half the "
                                            r"kernel size 3"):
        fn(x, 3, padding=2)
    with pytest.raises(pc.ShapeError, match=rf"^{pool}: kernel 9 .* length 5"):
        fn(x, 9)
