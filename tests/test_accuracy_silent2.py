"""Float32 accuracy against a float64 reference (torch in float64): parcl's results are as close
to it as PyTorch's float32 ones, on the inputs where a careless float32 formula loses digits."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

import parcl.tape as tp

GPT2_VOCAB = 50257


def _logits(rows: int, classes: int) -> np.ndarray:
    return (np.random.default_rng(5).standard_normal((rows, classes)) * 3 + 2).astype(np.float32)


def _relative(got, want) -> float:
    return float(np.max(np.abs(got - want) / np.abs(want)))


def test_cross_entropy_with_class_probabilities_over_a_gpt2_vocabulary_is_float32_accurate():
    # the logits' gradient was 5.3e-5 of the largest off (smoothed 5.7e-5), torch's float32
    # 1.2e-6; the loss 1.6e-6 (torch 7.2e-8)
    x = _logits(4, GPT2_VOCAB)
    target = np.random.default_rng(2).uniform(0, 1, x.shape).astype(np.float32)
    target /= target.sum(1, keepdims=True)
    for smoothing in (0.0, 0.1):
        n = tp.tensor(x, requires_grad=True)
        loss = tp.cross_entropy(n, tp.tensor(target), label_smoothing=smoothing)
        loss.backward()
        t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
        want = F.cross_entropy(t, torch.tensor(target, dtype=torch.float64),
                               label_smoothing=smoothing)
        want.backward()
        assert abs(loss.to_host() - want.item()) < 5e-7 * want.item()
        g = t.grad.numpy()
        assert np.max(np.abs(n.grad.to_host() - g)) < 1e-6 * np.max(np.abs(g))


def test_digamma_near_its_positive_root_keeps_its_relative_accuracy():
    # its terms (~2) cancelled to a float's error there: 3e-3 relative off at x0 - 2e-5
    # (PyTorch's float32 7e-5, and 0.79 at the float nearest x0); now under 4e-6 around x0
    x = np.linspace(1.2616, 1.6616, 20001).astype(np.float32)
    want = torch.digamma(torch.tensor(x, dtype=torch.float64)).numpy()
    assert _relative(tp.digamma(tp.tensor(x)).to_host(), want) < 4e-6
    x0 = np.float32(1.4616321)
    assert abs(tp.digamma(tp.tensor(np.array([x0]))).to_host()[0]
               - torch.digamma(torch.tensor(float(x0), dtype=torch.float64)).item()) < 1e-14


def test_mse_loss_over_millions_of_elements_is_float32_accurate_as_pytorch():
    # each of the 64 work-items summed its 125000 squares in a plain float: 2.3e-5 relative
    # off the float64 answer (torch's float32 1.9e-8)
    rng = np.random.default_rng(5)
    a = rng.standard_normal(8_000_000).astype(np.float32) + 1
    b = rng.standard_normal(8_000_000).astype(np.float32)
    got = tp.mse_loss(tp.tensor(a), tp.tensor(b)).to_host()
    want = F.mse_loss(torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64))
    assert abs(got - want.item()) < 2e-7 * want.item()


def test_logcumsumexp_of_a_long_line_keeps_the_small_terms_as_pytorch():
    # a running log-add-exp dropped each term below half an ulp of the sum: 1e6 normal draws
    # came out 0.012 high (8.4e-4 relative; torch's float32 5e-7) and the gradient was 1.1e-4
    # of its largest off (torch's 5.9e-6)
    x = np.random.default_rng(5).standard_normal((1, 1_000_000)).astype(np.float32)
    g = np.random.default_rng(1).standard_normal(x.shape).astype(np.float32)
    n = tp.tensor(x, requires_grad=True)
    y = tp.logcumsumexp(n, 1)
    tp.sum(y * tp.tensor(g)).backward()
    t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    want = torch.logcumsumexp(t, 1)
    (want * torch.tensor(g, dtype=torch.float64)).sum().backward()
    assert _relative(y.to_host(), want.detach().numpy()) < 2e-7
    assert np.max(np.abs(n.grad.to_host() - t.grad.numpy())) < 3e-5 * np.max(np.abs(t.grad.numpy()))
