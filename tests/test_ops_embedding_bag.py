"""``tp.embedding_bag`` and ``nn.EmbeddingBag``: PyTorch's bags (2-D input, 1-D input with
offsets, ``include_last_offset``), modes sum / mean / max, ``per_sample_weights``,
``padding_idx`` and empty bags; values and gradients against torch in float64 and finite
differences; bad offsets and arguments refused naming the op."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import parcl as pc
import parcl.tape as tp
from conftest import close, leaf, up

INDICES = np.array([1, 2, 2, 0, 5, 9, 1, 1])
BAGS = [([0, 3, 3, 6], False),          # an empty bag, the last ends at the input's end
        ([0, 2, 5, 8], True),           # the last offset ends the last bag
        ([0, 0, 1, 8], False)]          # an empty first bag


def run_both(queue, weight, mode, offsets, include_last_offset, padding_idx, g):
    w = leaf(queue, weight)
    with tp.Tape() as tape:
        y = tp.embedding_bag(up(queue, INDICES, np.int64), w, up(queue, offsets, np.int64),
                             mode=mode, include_last_offset=include_last_offset,
                             padding_idx=padding_idx)
    tape.backward(tp.sum(tp.mul(y, tp.tensor(g))))
    tw = torch.tensor(weight, dtype=torch.float64, requires_grad=True)
    want = F.embedding_bag(torch.tensor(INDICES), tw, torch.tensor(offsets), mode=mode,
                           include_last_offset=include_last_offset, padding_idx=padding_idx)
    (want * torch.tensor(g, dtype=torch.float64)).sum().backward()
    return y.to_host(), w.grad.to_host(), want.detach().numpy(), tw.grad.numpy()


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("offsets,include_last_offset", BAGS)
@pytest.mark.parametrize("padding_idx", [None, 1, -9])
def test_embedding_bag_values_and_weight_gradient_as_pytorch(queue, rng, mode, offsets,
                                                             include_last_offset, padding_idx):
    weight = rng.standard_normal((10, 3)).astype(np.float32)
    g = rng.standard_normal((len(offsets) - include_last_offset, 3)).astype(np.float32)
    got, grad, want, want_grad = run_both(queue, weight, mode, offsets, include_last_offset,
                                          padding_idx, g)
    close(got, want, 1e-5)
    close(grad, want_grad, 1e-5)


def test_embedding_bag_means_over_the_bag_even_where_the_last_offset_stops_short(queue, rng):
    # the last bag [6, 7): PyTorch's mean without padding_idx divides its sum by 8 - 6 (the
    # input's end), with one by 1, as parcl always does
    weight = np.arange(20, dtype=np.float32).reshape(10, 2)
    got = tp.embedding_bag(up(queue, INDICES, np.int64), tp.tensor(weight),
                           np.array([0, 4, 6, 7]), include_last_offset=True).to_host()
    np.testing.assert_array_equal(got, [[2.5, 3.5], [14.0, 15.0], [2.0, 3.0]])
    want = F.embedding_bag(torch.tensor(INDICES), torch.tensor(weight),
                           torch.tensor([0, 4, 6, 7]), include_last_offset=True, padding_idx=3)
    np.testing.assert_array_equal(got, want.numpy())          # 3 is in no bag


def test_embedding_bag_of_a_2d_input_takes_each_row_as_a_bag_as_pytorch(queue, rng):
    weight = rng.standard_normal((10, 4)).astype(np.float32)
    rows = np.array([[1, 2, 3], [4, 4, 9]])
    for mode in ("sum", "mean", "max"):
        got = tp.embedding_bag(up(queue, rows, np.int32), tp.tensor(weight), mode=mode)
        flat = tp.embedding_bag(up(queue, rows.ravel(), np.int32), tp.tensor(weight),
                                np.array([0, 3]), mode=mode)
        np.testing.assert_array_equal(got.to_host(), flat.to_host())
        close(got.to_host(), F.embedding_bag(torch.tensor(rows), torch.tensor(weight),
                                             mode=mode).numpy(), 1e-6)


def test_embedding_bag_per_sample_weights_weigh_the_sum_and_get_gradients_as_pytorch(queue,
                                                                                    rng):
    weight0 = rng.standard_normal((10, 3)).astype(np.float32)
    psw0 = rng.uniform(0.5, 2.0, INDICES.shape).astype(np.float32)
    weight, psw = leaf(queue, weight0), leaf(queue, psw0)
    idx = up(queue, INDICES, np.int64)
    with tp.Tape() as tape:
        y = tp.embedding_bag(idx, weight, np.array([0, 3, 3]), mode="sum",
                             per_sample_weights=psw, padding_idx=2)
    tape.backward(tp.sum(y))
    tw, tpsw = (torch.tensor(v, dtype=torch.float64, requires_grad=True)
                for v in (weight0, psw0))
    want = F.embedding_bag(torch.tensor(INDICES), tw, torch.tensor([0, 3, 3]), mode="sum",
                           per_sample_weights=tpsw, padding_idx=2)
    want.sum().backward()
    close(y.to_host(), want.detach().numpy())
    close(weight.grad.to_host(), tw.grad.numpy())
    close(psw.grad.to_host(), tpsw.grad.numpy())
    assert tp.gradcheck(lambda w, s: tp.embedding_bag(idx, w, np.array([0, 3, 3]), mode="sum",
                                                      per_sample_weights=s), [weight, psw])


@pytest.mark.parametrize("mode", ["mean", "max"])
def test_embedding_bag_gradient_matches_finite_differences(queue, rng, mode):
    weight = leaf(queue, rng.standard_normal((10, 3)))
    idx, offsets = up(queue, INDICES, np.int64), up(queue, [0, 3, 3, 6], np.int64)
    assert tp.gradcheck(lambda w: tp.embedding_bag(idx, w, offsets, mode=mode), [weight])


def test_embedding_bag_refuses_bad_offsets_naming_the_entry(queue):
    weight, idx = tp.tensor(np.ones((10, 2), np.float32)), up(queue, INDICES, np.int64)
    cases = [([1, 3], r"offsets\[0\] has to be 0, i.e., the first sequence in the mini-batch "
                      r"has to start from position 0, got 1"),
             ([0, 3, 2], r"offsets must not decrease, got offsets\[2\] = 2 after "
                         r"offsets\[1\] = 3"),
             ([0, 9], r"offsets\[-1\] can not be greater than input's length 8, got 9")]
    for offsets, message in cases:
        with pytest.raises(pc.ShapeError, match="embedding_bag: " + message):
            tp.embedding_bag(idx, weight, np.array(offsets))                 # on the host
        with pytest.raises(pc.ShapeError, match="embedding_bag: " + message):
            tp.embedding_bag(idx, weight, up(queue, offsets, np.int64))     # on the device
    w = leaf(queue, np.ones((10, 2)))
    with tp.Tape() as tape:                   # recorded: raised by the backward at the latest
        y = tp.embedding_bag(idx, w, up(queue, [0, 9], np.int32))
    with pytest.raises(pc.ShapeError, match="offsets.-1. can not be greater"):
        tape.backward(tp.sum(y))
        y.to_host()


def test_embedding_bag_refuses_bad_arguments_as_pytorch(queue):
    weight = tp.tensor(np.ones((10, 2), np.float32))
    idx, rows = up(queue, INDICES, np.int64), up(queue, [[1, 2]], np.int64)
    with pytest.raises(pc.ParclError, match="embedding_bag: mode has to be one of 'sum', "
                                            "'mean' or 'max', got 'min'"):
        tp.embedding_bag(rows, weight, mode="min")
    with pytest.raises(pc.ParclError, match="embedding_bag: per_sample_weights was not None. "
                                            "per_sample_weights is only supported for "
                                            "mode='sum' .got mode='mean'."):
        tp.embedding_bag(rows, weight, per_sample_weights=tp.tensor(np.ones((1, 2))))
    with pytest.raises(pc.ShapeError, match=r"embedding_bag: per_sample_weights of shape "
                                            r"\(2,\) must have the input's shape \(1, 2\)"):
        tp.embedding_bag(rows, weight, mode="sum", per_sample_weights=tp.tensor(np.ones(2)))
    with pytest.raises(pc.ShapeError, match="embedding_bag: if input is 2D, then offsets has "
                                            "to be None"):
        tp.embedding_bag(rows, weight, np.array([0]))
    with pytest.raises(pc.ShapeError, match="embedding_bag: offsets has to be a 1D Tensor but "
                                            "got None"):
        tp.embedding_bag(idx, weight)
    with pytest.raises(pc.ShapeError, match=r"embedding_bag: input has to be 1D or 2D Tensor, "
                                            r"but got Tensor of dimension 3"):
        tp.embedding_bag(up(queue, np.zeros((1, 1, 2)), np.int64), weight)
    with pytest.raises(pc.DTypeError, match=r"embedding_bag: input of shape \(2,\) has dtype "
                                            r"float32, expected int32 or int64"):
        tp.embedding_bag(up(queue, [0.0, 1.0]), weight, np.array([0]))
    with pytest.raises(pc.ShapeError, match=r"embedding: index 10 at position \(1,\)"):
        tp.embedding_bag(up(queue, [0, 10], np.int64), weight, np.array([0]))


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("on_device", [False, True])
def test_one_offset_with_include_last_offset_is_no_bags_as_pytorch(queue, rng, mode,
                                                                   on_device):
    # the one offset ends no bag: PyTorch gives (0, D) (its "max" crashes); parcl refused it
    weight = rng.standard_normal((10, 3)).astype(np.float32)
    offsets = up(queue, [0], np.int64) if on_device else np.array([0])
    w = leaf(queue, weight)
    with tp.Tape() as tape:
        y = tp.embedding_bag(up(queue, INDICES, np.int64), w, offsets, mode=mode,
                             include_last_offset=True)
    tape.backward(tp.sum(y))
    want = F.embedding_bag(torch.tensor(INDICES), torch.tensor(weight), torch.tensor([0]),
                           mode=mode, include_last_offset=True)
    assert y.shape == tuple(want.shape) == (0, 3)
    np.testing.assert_array_equal(w.grad.to_host(), np.zeros((10, 3), np.float32))


def test_embedding_bag_module_has_pytorchs_parameters_init_and_repr(queue, rng):
    pc.nn.manual_seed(3)
    bag = pc.nn.EmbeddingBag(10, 4, mode="max", padding_idx=0)
    pc.nn.manual_seed(3)
    plain = pc.nn.Embedding(10, 4, padding_idx=0)             # the same N(0, 1) draw
    np.testing.assert_array_equal(bag.weight.to_host(), plain.weight.to_host())
    assert list(bag.state_dict()) == ["weight"] and not bag.weight.to_host()[0].any()
    torch_bag = torch.nn.EmbeddingBag(10, 4, mode="max", padding_idx=0)
    assert repr(bag) == repr(torch_bag)
    assert repr(pc.nn.EmbeddingBag(5, 2, max_norm=1.0, norm_type=1.0)) == \
        repr(torch.nn.EmbeddingBag(5, 2, max_norm=1.0, norm_type=1.0))
    bag.load_state_dict({k: v.detach().numpy() for k, v in torch_bag.state_dict().items()})
    offsets = np.array([0, 2, 2, 5])
    close(bag(up(queue, INDICES, np.int64), offsets).to_host(),
          torch_bag(torch.tensor(INDICES), torch.tensor(offsets)).detach().numpy(), 1e-6)
    table = rng.standard_normal((6, 2)).astype(np.float32)
    frozen = pc.nn.EmbeddingBag.from_pretrained(up(queue, table), mode="sum")
    assert not frozen.weight.requires_grad
    close(frozen(up(queue, [[1, 5]], np.int64)).to_host(), table[[1]] + table[[5]], 1e-6)
    with pytest.raises(pc.ParclError, match="EmbeddingBag: mode has to be one of"):
        pc.nn.EmbeddingBag(3, 2, mode="median")


def test_an_embedding_bag_with_max_norm_on_several_replicas_is_refused_as_embeddings(devices2):
    """Its forward rescales the rows each replica picks in that replica's copy of the weight,
    as an Embedding's: refused before the update, as there; max_norm=None steps."""
    from parcl.replica import ReplicaGroup

    def build(max_norm):
        return lambda q: pc.nn.Sequential(pc.nn.EmbeddingBag(10, 2, max_norm=max_norm,
                                                             mode="sum", queue=q))
    x = np.arange(16).reshape(8, 2) % 10
    y = np.random.default_rng(0).standard_normal((8, 2)).astype(np.float32)
    with ReplicaGroup(build(1.0), devices2) as g:
        with pytest.raises(pc.ParclError, match="model.0 is an EmbeddingBag with max_norm=1.0"):
            g.step(x, y, tp.mse_loss, pc.optim.SGD(g.parameters(), lr=0.5))
    with ReplicaGroup(build(None), devices2) as g:
        assert g.step(x, y, tp.mse_loss, pc.optim.SGD(g.parameters(), lr=0.5)) > 0
