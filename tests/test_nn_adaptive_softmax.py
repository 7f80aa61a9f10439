"""``nn.AdaptiveLogSoftmaxWithLoss``: PyTorch's parameters (names, shapes, initialisation
order), ``forward``'s output and loss, ``log_prob`` and ``predict`` and the gradients to every
parameter and the input, against torch's module holding the same weights in float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from conftest import close, leaf


def pair(queue, **kwargs):
    kwargs.setdefault("div_value", 2.0)           # 16 // 2**3 = 2 features in the last cluster
    ours = pc.nn.AdaptiveLogSoftmaxWithLoss(16, 20, [4, 9, 15], **kwargs)
    ref = torch.nn.AdaptiveLogSoftmaxWithLoss(16, 20, [4, 9, 15], **kwargs).double()
    ours.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})
    return ours, ref


@pytest.mark.parametrize("head_bias", [False, True])
def test_adaptive_log_softmax_output_loss_and_gradients_as_pytorch(queue, rng, head_bias):
    ours, ref = pair(queue, head_bias=head_bias)
    assert list(ours.state_dict()) == list(ref.state_dict())
    x0 = rng.standard_normal((12, 16)).astype(np.float32)
    target = np.array([0, 3, 4, 8, 9, 14, 15, 19, 1, 19, 10, 2])     # every cluster
    x = leaf(queue, x0)
    with tp.Tape() as tape:
        out = ours(x, pc.Tensor.from_host(queue, target))
    tape.backward(out.loss)
    tx = torch.tensor(x0, dtype=torch.float64, requires_grad=True)
    want = ref(tx, torch.tensor(target))
    want.loss.backward()
    close(out.output.to_host(), want.output.detach().numpy(), 1e-5)
    close(out.loss.item(), want.loss.item(), 1e-5)
    close(x.grad.to_host(), tx.grad.numpy(), 1e-5)
    grads = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        close(p.grad.to_host(), grads[name].grad.numpy(), 1e-5)


def test_adaptive_log_softmax_log_prob_and_predict_as_pytorch(queue, rng):
    ours, ref = pair(queue)
    x0 = rng.standard_normal((5, 16)).astype(np.float32)
    logp = ours.log_prob(tp.tensor(x0)).to_host()
    close(logp, ref.log_prob(torch.tensor(x0, dtype=torch.float64)).detach().numpy(), 1e-5)
    close(np.exp(logp).sum(1), np.ones(5), 1e-5)
    np.testing.assert_array_equal(ours.predict(tp.tensor(x0)).to_host(),
                                  ref.predict(torch.tensor(x0, dtype=torch.float64)).numpy())
    single = ours(tp.tensor(x0[0]), np.array(17))              # unbatched: a 0-d target
    close(single.output.item(), logp[0, 17], 1e-5)


def test_adaptive_log_softmax_initialises_in_pytorchs_order_and_refuses_bad_input(queue):
    pc.nn.manual_seed(0)
    asm = pc.nn.AdaptiveLogSoftmaxWithLoss(16, 20, [4, 9])
    pc.nn.manual_seed(0)
    head = pc.nn.Linear(16, 6, bias=False)                     # the head is drawn first
    np.testing.assert_array_equal(asm.head.weight.to_host(), head.weight.to_host())
    assert asm.tail[1][0].weight.shape == (1, 16) and asm.tail[1][1].weight.shape == (11, 1)
    x = tp.tensor(np.ones((2, 16), np.float32))
    with pytest.raises(pc.ShapeError, match=r"Target values should be in \[0, 19\], but "
                                            r"values in range \[0, 20\] were found"):
        asm(x, np.array([0, 20]))
    with pytest.raises(pc.ShapeError, match="Input and target should have the same size in "
                                            "the batch dimension, got 2 and 3"):
        asm(x, np.array([0, 1, 2]))
    with pytest.raises(pc.ParclError, match="cutoffs should be a sequence of unique, positive "
                                            "integers sorted in an increasing order"):
        pc.nn.AdaptiveLogSoftmaxWithLoss(16, 20, [9, 4])
    with pytest.raises(pc.ShapeError, match="cluster 1's projection has in_features // "
                                            "div_value \\*\\* 2 = 0 features"):
        pc.nn.AdaptiveLogSoftmaxWithLoss(8, 10, [4, 8])



def test_adaptive_log_softmax_keeps_no_per_batch_upload_beside_the_launch_plans(queue, rng):
    """Each forward's row and label picks depend on its batch's targets: kept as shape-derived
    constants in queue.choices (capped beside every kernel's launch plans), 50 forwards of
    batch 32 left 250 such uploads there, and after ~800 steps no new plan was cached."""
    asm = pc.nn.AdaptiveLogSoftmaxWithLoss(16, 60, [10, 50], queue=queue)
    x = leaf(queue, rng.standard_normal((32, 16)).astype(np.float32))
    asm(x, pc.Tensor.from_host(queue, rng.integers(0, 60, 32)))       # plans made once
    def uploads():
        return sum(1 for k in queue.choices if isinstance(k, tuple) and k[0] == "constant")

    before = uploads()
    for _ in range(10):
        asm(x, pc.Tensor.from_host(queue, rng.integers(0, 60, 32)))
    assert uploads() == before
