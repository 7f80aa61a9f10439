"""Layers and transformer pieces that once gave a wrong result without raising: each test is
the reproducer of one such case, with what PyTorch gives or the clear error parcl gives
instead."""

import numpy as np
import pytest

import parcl as pc
import parcl.tape as tp


# -- an out-of-range token id reaches the predictions of argmax/argmin -------------------------
@pytest.mark.parametrize("op", [tp.argmax, tp.argmin])
def test_argmax_of_logits_from_an_out_of_range_id_raises(queue, op):
    """``tp.argmax(model(idx), axis=-1)`` with a token id outside ``[0, V)``, read while grad
    mode was on, returned predictions (``[[0, 0, 0]]``) without the embedding's error: argmax
    and argmin dropped their input's pending index check. PyTorch raises ``IndexError`` in
    the embedding itself; parcl promises the error at the next host read of any value computed
    from the rows through ``tp`` ops."""
    pc.nn.manual_seed(0)
    model = pc.nn.GPT(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8, queue=queue)
    with tp.Tape():
        logits = model(np.array([[1, 2, 11]]))
        predicted = op(logits, axis=-1)
    with pytest.raises(pc.ShapeError, match="embedding: index 11"):
        predicted.to_host()


def test_argmax_keeps_a_check_through_a_view(queue):
    """The flattened form (``axis=None``, keepdims) is a view of the index tensor: it carries
    the check too."""
    weight = pc.nn.Parameter.from_host(queue, np.ones((4, 3), np.float32))
    with tp.Tape():
        rows = tp.embedding(pc.Tensor.from_host(queue, np.array([0, 4])), weight)
        flat = tp.argmax(rows, keepdims=True)
    with pytest.raises(pc.ShapeError, match="embedding: index 4"):
        flat.to_host()
