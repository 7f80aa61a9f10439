"""``var_mean`` and ``std_mean``: PyTorch's pairs of a spread and the mean over the same
dims, each its own Node (``var``/``std`` and ``mean``), so gradients reach ``x`` through
both.

>>> x = tp.tensor(np.array([[1.0, 2.0], [3.0, 6.0]]), requires_grad=True)
>>> v, m = tp.var_mean(x, 1)
>>> v.to_host(), m.to_host()
(array([0.5, 4.5], dtype=float32), array([1.5, 4.5], dtype=float32))
"""

from __future__ import annotations

from .reduce import mean
from ...kernels.moments import unbiased_alone
from .reductions import std, var
from .torch_names import torch_names

__all__ = ["std_mean", "var_mean"]


@torch_names(empty_dim_is_all=True)
def var_mean(x, axis=None, unbiased: bool | None = None, keepdims: bool = False, *,
             correction: float | None = None, tape=None):
    """``torch.var_mean``: ``(var(x, axis, ...), mean(x, axis, ...))`` as a tuple, with
    ``tp.var``'s arguments (torch.var_mean's order: ``unbiased`` third, ``keepdims`` fourth).

    >>> [t.shape for t in tp.var_mean(x, keepdims=True)]        # x (2, 2)
    [(1, 1), (1, 1)]
    """
    axis, unbiased = unbiased_alone(axis, unbiased)     # tp.var_mean(x, False): every dim
    return (var(x, axis, keepdims=keepdims, correction=correction, unbiased=unbiased,
                tape=tape),
            mean(x, axis, keepdims, tape=tape))


@torch_names(empty_dim_is_all=True)
def std_mean(x, axis=None, unbiased: bool | None = None, keepdims: bool = False, *,
             correction: float | None = None, tape=None):
    """``torch.std_mean``: ``(std(x, axis, ...), mean(x, axis, ...))`` as a tuple."""
    axis, unbiased = unbiased_alone(axis, unbiased)
    return (std(x, axis, keepdims=keepdims, correction=correction, unbiased=unbiased,
                tape=tape),
            mean(x, axis, keepdims, tape=tape))
