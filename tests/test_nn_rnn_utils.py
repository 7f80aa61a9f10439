"""``pc.nn.utils.rnn`` against ``torch.nn.utils.rnn``: padding, packing and unpacking give
PyTorch's tensors, and the recurrent layers run a ``PackedSequence`` as PyTorch's do (each
sequence stopped at its own length), values and gradients alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from parcl.nn.utils.rnn import (PackedSequence, pack_padded_sequence, pack_sequence,
                                pad_packed_sequence, pad_sequence, unpack_sequence,
                                unpad_sequence)

TR = torch.nn.utils.rnn
LENGTHS = [3, 5, 1, 5, 2]              # unsorted, with a tie


def _padded(rng, lengths, features=3):
    x = rng.standard_normal((max(lengths), len(lengths), features)).astype(np.float32)
    for i, n in enumerate(lengths):
        x[n:, i] = 0.0
    return x


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_pad_sequence_stacks_and_pads_as_pytorch(queue, batch_first, padding_side):
    rng = np.random.default_rng(0)
    seqs = [rng.standard_normal((n, 2, 2)).astype(np.float32) for n in LENGTHS]
    got = pad_sequence([tp.tensor(s) for s in seqs], batch_first, -1.5, padding_side)
    want = TR.pad_sequence([torch.tensor(s) for s in seqs], batch_first, -1.5, padding_side)
    np.testing.assert_array_equal(got.to_host(), want.numpy())


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("enforce_sorted", [False, True])
def test_packing_and_unpacking_give_pytorchs_data_batch_sizes_and_order(queue, batch_first,
                                                                        enforce_sorted):
    rng = np.random.default_rng(1)
    lengths = sorted(LENGTHS, reverse=True) if enforce_sorted else LENGTHS
    x = _padded(rng, lengths)
    if batch_first:
        x = np.ascontiguousarray(x.transpose(1, 0, 2))
    got = pack_padded_sequence(tp.tensor(x), lengths, batch_first, enforce_sorted)
    want = TR.pack_padded_sequence(torch.tensor(x), torch.tensor(lengths), batch_first,
                                   enforce_sorted)
    np.testing.assert_array_equal(got.batch_sizes, want.batch_sizes.numpy())
    np.testing.assert_array_equal(got.data.to_host(), want.data.numpy())
    if enforce_sorted:
        assert got.sorted_indices is None and got.unsorted_indices is None
    else:
        np.testing.assert_array_equal(got.unsorted_indices, want.unsorted_indices.numpy())
    padded, back = pad_packed_sequence(got, batch_first, padding_value=7.0, total_length=6)
    tpadded, tback = TR.pad_packed_sequence(want, batch_first, padding_value=7.0,
                                            total_length=6)
    np.testing.assert_array_equal(padded.to_host(), tpadded.numpy())
    np.testing.assert_array_equal(back, tback.numpy())
    for a, b in zip(unpack_sequence(got), TR.unpack_sequence(want)):
        np.testing.assert_array_equal(a.to_host(), b.numpy())
    for a, b in zip(unpad_sequence(padded, back, batch_first),
                    TR.unpad_sequence(tpadded, tback, batch_first)):
        np.testing.assert_array_equal(a.to_host(), b.numpy())


def test_pack_sequence_is_packing_the_padded_sequences(queue):
    rng = np.random.default_rng(2)
    seqs = [rng.standard_normal((n, 4)).astype(np.float32) for n in (4, 2, 2)]
    got = pack_sequence([tp.tensor(s) for s in seqs])
    want = TR.pack_sequence([torch.tensor(s) for s in seqs])
    np.testing.assert_array_equal(got.data.to_host(), want.data.numpy())
    assert isinstance(got, PackedSequence) and got.batch_sizes.tolist() == [3, 3, 1, 1]


def test_bad_lengths_are_refused_as_pytorch_refuses_them(queue):
    x = tp.tensor(np.zeros((4, 3, 2), np.float32))
    with pytest.raises(pc.ParclError, match="not sorted longest first"):
        pack_padded_sequence(x, [2, 4, 1])
    with pytest.raises(pc.ShapeError, match="at least 1"):
        pack_padded_sequence(x, [4, 0, 1])
    with pytest.raises(pc.ShapeError, match="more than the input's 4 steps"):
        pack_padded_sequence(x, [5, 2, 1], enforce_sorted=False)
    with pytest.raises(pc.ShapeError, match="one per sequence"):
        pack_padded_sequence(x, [4, 2])
    packed = pack_padded_sequence(x, [4, 2, 1])
    with pytest.raises(pc.ShapeError, match="total_length=3"):
        pad_packed_sequence(packed, total_length=3)


@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_a_recurrent_layer_runs_a_packed_batch_as_pytorchs(queue, mode, batch_first):
    """Two layers, both directions, an unsorted batch with an initial state: the packed
    output, the final states (each sequence's after its own last element, in the batch's
    order) and the gradients of the input and of every weight equal PyTorch's."""
    rng = np.random.default_rng(3)
    pc.nn.manual_seed(0)
    ours = getattr(pc.nn, mode)(3, 4, num_layers=2, bidirectional=True, batch_first=batch_first)
    theirs = getattr(torch.nn, mode)(3, 4, num_layers=2, bidirectional=True,
                                     batch_first=batch_first)
    theirs.load_state_dict({k: torch.tensor(v) for k, v in ours.state_dict().items()})
    x = _padded(rng, LENGTHS)
    if batch_first:
        x = np.ascontiguousarray(x.transpose(1, 0, 2))
    h0 = rng.standard_normal((4, len(LENGTHS), 4)).astype(np.float32)
    hx = (h0, h0 * 0.5) if mode == "LSTM" else h0
    xs, tx = tp.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    with tp.Tape() as tape:
        packed = pack_padded_sequence(xs, LENGTHS, batch_first, enforce_sorted=False)
        out, state = ours(packed, tuple(tp.tensor(h) for h in hx) if mode == "LSTM"
                          else tp.tensor(hx))
        finals = state if mode == "LSTM" else (state,)
        loss = tp.sum(out.data * out.data) + sum(tp.sum(f * f) for f in finals)
    tape.backward(loss)
    tpacked = TR.pack_padded_sequence(tx, torch.tensor(LENGTHS), batch_first,
                                      enforce_sorted=False)
    tout, tstate = theirs(tpacked, tuple(torch.tensor(h) for h in hx) if mode == "LSTM"
                          else torch.tensor(hx))
    tfinals = tstate if mode == "LSTM" else (tstate,)
    ((tout.data ** 2).sum() + sum((f ** 2).sum() for f in tfinals)).backward()
    assert isinstance(out, PackedSequence)
    np.testing.assert_array_equal(out.batch_sizes, tout.batch_sizes.numpy())
    np.testing.assert_allclose(out.data.to_host(), tout.data.detach().numpy(), atol=2e-6)
    for f, tf in zip(finals, tfinals):
        np.testing.assert_allclose(f.to_host(), tf.detach().numpy(), atol=2e-6)
    np.testing.assert_allclose(xs.grad.to_host(), tx.grad.numpy(), atol=1e-5)
    for name, p in ours.named_parameters():
        np.testing.assert_allclose(p.grad.to_host(), dict(theirs.named_parameters())[name]
                                   .grad.numpy(), atol=1e-5, err_msg=name)
