"""PyTorch's ``instance_norm``: each sample's channel normalised over its own positions
(``group_norm`` with one group per channel), or with running statistics (``batch_norm`` in
evaluation) when ``use_input_stats=False``. ``pc.nn.InstanceNorm1d``/``2d`` call it.

>>> x = tp.tensor(np.array([[[1.0, 3.0], [2.0, 6.0]]], np.float32))     # (1, 2, 2)
>>> tp.instance_norm(x, eps=0.0).to_host()
array([[[-1.,  1.],
        [-1.,  1.]]], dtype=float32)
"""

from __future__ import annotations

from math import prod

from ...errors import ParclError, ShapeError
from .. import mode
from ..node import Node
from .checks import read_checks
from .elementwise import add, mul
from .nn import batch_norm
from .norm import group_norm
from .reduce import mean
from .reductions import var

__all__ = ["instance_norm"]


def instance_norm(x, running_mean=None, running_var=None, weight=None, bias=None,
                  use_input_stats: bool = True, momentum: float = 0.1, eps: float = 1e-5, *,
                  tape=None):
    """``F.instance_norm`` over an ``(N, C, *)`` input: with ``use_input_stats`` (the default)
    each ``(n, c)`` map normalised by its own mean and biased variance, and ``running_mean`` /
    ``running_var`` (raw ``(C,)`` Tensors, or None) moved in place towards the maps' means and
    unbiased variances averaged over the batch, weighed by ``momentum``; without it normalised
    with the running statistics. Then ``* weight + bias`` (``(C,)`` each, or None). A map of one
    element is refused with input statistics, as PyTorch (its variance would be 0/0).

    >>> tp.instance_norm(x, use_input_stats=True).shape             # x (1, 2, 2)
    (1, 2, 2)
    """
    return normalize_instances("instance_norm", x, running_mean, running_var, weight, bias,
                               use_input_stats, momentum, eps, tape)


def normalize_instances(op: str, x, running_mean, running_var, weight, bias,
                        use_input_stats: bool, momentum, eps: float, tape=None):
    """``instance_norm`` with errors naming ``op`` (a module's repr)."""
    shape = tuple(x.shape)
    if len(shape) < 3:
        raise ShapeError(f"{op}: expected an (N, C, *) input of 3 or more dims, got shape "
                         f"{shape}")
    c = shape[1]
    if (running_mean is None) != (running_var is None):
        raise ParclError(f"{op}: running_mean and running_var must either both be None or "
                         "neither be None (as PyTorch)")
    stats = [r.value if isinstance(r, Node) else r for r in (running_mean, running_var)]
    for name, r in zip(("running_mean", "running_var"), stats):
        if r is not None and tuple(r.shape) != (c,):
            raise ShapeError(f"{op}: {name} has shape {tuple(r.shape)}, expected ({c},) for "
                             f"the {c} channels of input {shape}")
    if not use_input_stats:
        if stats[0] is None:
            raise ParclError(f"{op}: use_input_stats=False normalises with running_mean and "
                             "running_var, which are None (as PyTorch: Expected running_mean "
                             "and running_var to be defined when use_input_stats is false)")
        return batch_norm(x, weight, bias, stats[0], stats[1], training=False, eps=eps,
                          tape=tape)
    if prod(shape[2:]) == 1:
        # a map of one element normalises to 0 and its unbiased variance is 0/0: PyTorch
        # refuses it (after global pooling, (N, C, 1, 1)) rather than give that
        raise ShapeError(f"{op}: expected more than 1 spatial element when training, got "
                         f"input of shape {shape}")
    if stats[0] is not None and not mode.state.recompute:     # tp.checkpoint's second run
        if shape[0] == 0:
            # the mean of no samples' statistics is 0/0: it wrote NaN into the running
            # statistics (PyTorch refuses such a batch too)
            raise ShapeError(f"{op}: a batch of no samples, shape {shape}, has no statistics "
                             "to update the running ones with")
        _update_running_stats(x, stats, 0.0 if momentum is None else float(momentum))
    return group_norm(x, c, weight, bias, eps, tape=tape)


def _update_running_stats(x, stats: list, momentum: float) -> None:
    x = x.value if isinstance(x, Node) else x
    read_checks(x)              # a bad batch raises before the statistics move, as PyTorch
    positions = tuple(range(2, x.ndim))
    with mode.no_grad():
        for buffer, stat in zip(stats, (mean(x, positions), var(x, positions))):
            new = add(mul(buffer, 1.0 - momentum), mul(mean(stat, 0), momentum))
            buffer.copy_(new.value if isinstance(new, Node) else new)

