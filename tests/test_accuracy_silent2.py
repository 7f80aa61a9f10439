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


def _ulps(got, want) -> float:
    """The largest error of ``got`` in float32 ulps of the float64 ``want``."""
    spacing = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    return float(np.max(np.abs(got.astype(np.float64) - want) / spacing))


def _log_softmax64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(1, keepdims=True))


def test_softmax_and_log_softmax_over_a_gpt2_vocabulary_stay_within_a_few_ulps_of_float64():
    # a running float32 sum of the 50257 exps dropped the many below half an ulp of the total:
    # softmax 990 ulps off, log_softmax 280; summed in blocks 19 (mostly the rounding of
    # x - max, which torch's float32 shares) and 1.2. The gradients' sums likewise: softmax's
    # 4.3 ulps of its largest -> 1.6, log_softmax's 28 -> 5
    x = _logits(8, GPT2_VOCAB)
    g = np.random.default_rng(1).standard_normal(x.shape).astype(np.float32)
    want = _log_softmax64(x)
    g64 = g.astype(np.float64)
    for op, tolerance, grad_tolerance in ((tp.softmax, 30, 3), (tp.log_softmax, 4, 10)):
        n = tp.tensor(x, requires_grad=True)
        y = op(n, 1)
        y.backward(tp.tensor(g))
        got = y.to_host()
        assert _ulps(got, np.exp(want) if op is tp.softmax else want) < tolerance
        y64 = got.astype(np.float64)          # the backward reads the forward's own output
        if op is tp.softmax:
            ref = y64 * (g64 - (g64 * y64).sum(1, keepdims=True))
        else:
            ref = g64 - np.exp(y64) * g64.sum(1, keepdims=True)
        error = np.max(np.abs(n.grad.to_host() - ref)) / np.max(np.abs(ref))
        assert error < grad_tolerance * 2**-24


def test_cross_entropy_over_a_gpt2_vocabulary_stays_within_a_few_ulps_of_float64():
    # each row's log-sum-exp summed its 50257 exps in a running float32: the row losses 60
    # ulps off (smoothed 70), summed in blocks 0.6 (1.2)
    x = _logits(8, GPT2_VOCAB)
    labels = np.random.default_rng(2).integers(0, GPT2_VOCAB, 8)
    lse = np.log(np.exp(x.astype(np.float64)).sum(1))
    for smoothing in (0.0, 0.1):
        nl = lse - x[np.arange(8), labels]
        want = (1 - smoothing) * nl + smoothing * (lse - x.astype(np.float64).mean(1))
        got = tp.cross_entropy(tp.tensor(x), tp.tensor(labels), label_smoothing=smoothing,
                               reduction="none").to_host()
        assert _ulps(got, want) < 2


def test_cumsum_of_a_million_terms_stays_within_30_ulps_of_float64_both_ways():
    # a running float32 sum drifted 390 ulps over 1e6 uniform draws (its reverse, the
    # gradient's scan, 280); in blocks 18 (20)
    x = np.random.default_rng(4).uniform(0, 1, 1_000_000).astype(np.float32)
    n = tp.tensor(x, requires_grad=True)
    y = tp.cumsum(n, 0)
    y.backward(tp.tensor(x))
    assert _ulps(y.to_host(), np.cumsum(x.astype(np.float64))) < 30
    assert _ulps(n.grad.to_host(), np.cumsum(x[::-1].astype(np.float64))[::-1]) < 30
