"""PyTorch's deprecated layer names: ``nn.NLLLoss2d`` is ``NLLLoss`` with PyTorch's warning."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from conftest import close


def test_nll_loss_2d_is_nll_loss_with_pytorchs_deprecation_warning(queue, rng):
    logp = np.log(rng.dirichlet(np.ones(4), (2, 3, 3)).transpose(0, 3, 1, 2)).astype(np.float32)
    target = rng.integers(0, 4, (2, 3, 3))
    with pytest.warns(FutureWarning, match="`NLLLoss2d` has been deprecated"):
        loss = pc.nn.NLLLoss2d(ignore_index=2)
    with pytest.warns(FutureWarning):
        want = torch.nn.NLLLoss2d(ignore_index=2)(torch.tensor(logp), torch.tensor(target))
    close(loss(tp.tensor(logp), pc.Tensor.from_host(queue, target)).item(), want.item(), 1e-5)
