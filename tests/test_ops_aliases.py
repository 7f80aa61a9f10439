"""PyTorch's other names: ``tp.upsample``, ``tp.upsample_nearest`` and ``tp.upsample_bilinear``
(``interpolate`` with PyTorch's deprecation warnings) and the ``*_with_indices`` pools (always
``(out, indices)``), against torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import parcl.tape as tp
from conftest import close, leaf


@pytest.mark.parametrize("name,kwargs", [("upsample", {"mode": "bilinear",
                                                        "align_corners": False}),
                                          ("upsample", {}),
                                          ("upsample_nearest", {}),
                                          ("upsample_bilinear", {})])
def test_upsample_aliases_are_interpolate_with_pytorchs_warning(queue, rng, name, kwargs):
    x0 = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    g = rng.standard_normal((1, 2, 6, 8)).astype(np.float32)
    x = leaf(queue, x0)
    with pytest.warns(UserWarning, match=f"`nn.functional.{name}` is deprecated. Use "
                                         "`nn.functional.interpolate` instead."):
        with tp.Tape() as tape:
            y = getattr(tp, name)(x, scale_factor=2, **kwargs)
    tape.backward(tp.sum(tp.mul(y, tp.tensor(g))))
    tx = torch.tensor(x0, dtype=torch.float64, requires_grad=True)
    with pytest.warns(UserWarning):
        want = getattr(F, name)(tx, scale_factor=2, **kwargs)
    (want * torch.tensor(g, dtype=torch.float64)).sum().backward()
    close(y.to_host(), want.detach().numpy(), 1e-5)
    close(x.grad.to_host(), tx.grad.numpy(), 1e-5)


def test_with_indices_pools_return_outputs_and_positions_as_pytorch(queue, rng):
    x2 = rng.standard_normal((2, 3, 6, 5)).astype(np.float32)
    x1 = x2[:, :, 0]
    cases = [("max_pool2d_with_indices", x2, (3,), {"stride": 2, "padding": 1}),
             ("max_pool1d_with_indices", x1, (2,), {"ceil_mode": True}),
             ("adaptive_max_pool2d_with_indices", x2, ((4, 2),), {}),
             ("adaptive_max_pool1d_with_indices", x1, (3,), {})]
    for name, x, args, kwargs in cases:
        out, at = getattr(tp, name)(tp.tensor(x), *args, **kwargs)
        want, want_at = getattr(F, name)(torch.tensor(x), *args, **kwargs)
        np.testing.assert_array_equal(out.to_host(), want.numpy(), err_msg=name)
        np.testing.assert_array_equal(at.to_host(), want_at.numpy(), err_msg=name)
