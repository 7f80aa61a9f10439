"""Weight averaging, as ``torch.optim.swa_utils``: ``AveragedModel`` (a copy of a model whose
parameters are the running average, SWA, or an exponential moving average, EMA, of the
model's), ``SWALR`` (anneals each group's learning rate to a constant ``swa_lr``),
``update_bn`` (recomputes BatchNorm statistics for the averaged weights) and the averaging
functions ``get_swa_avg_fn``, ``get_ema_avg_fn``, ``get_swa_multi_avg_fn`` and
``get_ema_multi_avg_fn``. The averages are device ops (``tp.lerp``), PyTorch's formulas.

>>> ema = pc.optim.swa_utils.AveragedModel(
...     model, multi_avg_fn=pc.optim.swa_utils.get_ema_multi_avg_fn(0.999))
>>> ema.update_parameters(model)        # after each optimizer step
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from .. import tape as tp
from ..pool import pool_of, stamp
from ..tape.changes import changed
from ..tensor import FLOAT, Tensor
from ..nn.layers import _NormBase
from ..nn.module import Module
from ..nn.norm import _InstanceNorm
from ..nn.clone import clone_module
from .checks import OptimizerError
from .lr_base import LRScheduler, SchedulerError, _per_group

__all__ = ["AveragedModel", "SWALR", "get_ema_avg_fn", "get_ema_multi_avg_fn",
           "get_swa_avg_fn", "get_swa_multi_avg_fn", "update_bn"]


def _decay(value) -> float:
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise OptimizerError(f"invalid decay {value} (must be in [0, 1])")
    return value


def get_ema_multi_avg_fn(decay: float = 0.999):
    """``fn(averaged, current, n)``: every averaged tensor ``= lerp(averaged, current,
    1 - decay)`` in place (the exponential moving average)."""
    decay = _decay(decay)

    def ema_update(averaged: list[Tensor], current: list[Tensor], _n) -> None:
        with tp.no_grad():
            for a, c in zip(averaged, current):
                a.copy_(tp.lerp(a, c, 1.0 - decay))
    return ema_update


def get_swa_multi_avg_fn():
    """``fn(averaged, current, n)``: every averaged tensor ``= lerp(averaged, current,
    1 / (n + 1))`` in place (the running mean of the ``n + 1`` models seen)."""
    def swa_update(averaged: list[Tensor], current: list[Tensor], n) -> None:
        with tp.no_grad():
            for a, c in zip(averaged, current):
                a.copy_(tp.lerp(a, c, 1.0 / (int(n) + 1)))
    return swa_update


def get_ema_avg_fn(decay: float = 0.999):
    """``fn(averaged, current, n)`` -> ``decay * averaged + (1 - decay) * current``."""
    decay = _decay(decay)

    def ema_update(averaged: Tensor, current: Tensor, _n) -> Tensor:
        with tp.no_grad():
            return decay * averaged + (1 - decay) * current
    return ema_update


def get_swa_avg_fn():
    """``fn(averaged, current, n)`` -> ``averaged + (current - averaged) / (n + 1)``."""
    def swa_update(averaged: Tensor, current: Tensor, n) -> Tensor:
        with tp.no_grad():
            return averaged + (current - averaged) / (int(n) + 1)
    return swa_update


class AveragedModel(Module):
    """A copy of ``model`` (``module``, see ``pc.nn.clone_module``) whose parameters average
    the model's over the ``update_parameters(model)`` calls, as PyTorch's: the first call
    copies them, later ones apply ``multi_avg_fn(averaged, current, n)`` (in place) or
    ``avg_fn(averaged, current, n)`` (returns each new average), the equal-weight running mean
    (SWA) by default; ``n`` is the number averaged so far (the ``n_averaged`` buffer, an
    int64 0-d tensor, kept on the host too: a Python int is passed). With ``use_buffers``
    the buffers are averaged too (integer ones copied), else copied from the model. PyTorch's
    ``device`` argument is taken, and must be None: the copy lives on the model's queues.

    >>> swa = pc.optim.swa_utils.AveragedModel(model)
    >>> swa.update_parameters(model)
    >>> out = swa(x)                     # forward of the averaged copy
    """

    def __init__(self, model: Module, device=None, avg_fn: Callable | None = None,
                 multi_avg_fn: Callable | None = None, use_buffers: bool = False):
        super().__init__()
        if avg_fn is not None and multi_avg_fn is not None:
            raise OptimizerError("AveragedModel: give avg_fn or multi_avg_fn, not both")
        if device is not None:
            raise OptimizerError("AveragedModel: device must be None (the copy lives on the "
                                 "model's queues; build the model on another device to "
                                 "average there)")
        if not isinstance(model, Module):
            raise TypeError(f"AveragedModel: expected a pc.nn.Module, got "
                            f"{type(model).__name__}")
        self.module = clone_module(model)
        queue = self.module.queue if self.module.queue is not None else model.queue
        self.register_buffer("n_averaged", Tensor.zeros(queue, (), np.int64))
        # (the buffer, the count last written to it, when): see _count
        self._written = (self.n_averaged, 0, stamp())
        self.avg_fn, self.multi_avg_fn = avg_fn, multi_avg_fn
        self.use_buffers = bool(use_buffers)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _tensors(self, model: Module) -> list[Tensor]:
        values = [p.value for p in model.parameters()]
        return values + list(model.buffers()) if self.use_buffers else values

    def _count(self) -> int:
        """``n_averaged`` as a Python int: the count this model last wrote, unless the buffer
        was replaced or written by something else since (``load_state_dict``, ``fill_``;
        noted in its pool), when it is read back. Updates in a loop read nothing."""
        buf = self.n_averaged
        written, count, when = self._written
        change = pool_of(buf.queue).overwrites.get(buf.data.int_ptr)
        # the tensor itself, not its address: a tensor assigned in its place (an upload
        # noted nowhere) could be given the pool's recycled buffer at that address
        if buf is written and (change is None or change.when < when):
            return count
        return int(buf.to_host())

    def update_parameters(self, model: Module) -> None:
        """Fold ``model``'s current parameters (and buffers) into the average."""
        mine, theirs = self._tensors(self.module), self._tensors(model)
        if len(mine) != len(theirs) or any(tuple(a.shape) != tuple(b.shape)
                                           for a, b in zip(mine, theirs)):
            raise OptimizerError(f"AveragedModel.update_parameters: {type(model).__name__}'s "
                                 f"{len(theirs)} tensors do not match the averaged copy's "
                                 f"{len(mine)} (shapes "
                                 f"{[tuple(t.shape) for t in theirs][:4]}...); pass the model "
                                 "it was made from")
        n = self._count()
        floats = [(a, b) for a, b in zip(mine, theirs) if a.dtype == FLOAT]
        if n == 0:
            for a, b in zip(mine, theirs):
                a.copy_(b)
        else:
            for a, b in zip(mine, theirs):
                if a.dtype != FLOAT:
                    a.copy_(b)
            if self.avg_fn is None:
                fn = self.multi_avg_fn or get_swa_multi_avg_fn()
                fn([a for a, _ in floats], [b for _, b in floats], n)
            else:
                for a, b in floats:
                    a.copy_(_tensor(self.avg_fn(a, b, n)))
        if not self.use_buffers:
            for a, b in zip(self.module.buffers(), model.buffers()):
                a.copy_(b)
        self.n_averaged.fill_owned(n + 1)
        self._written = (self.n_averaged, n + 1, stamp())
        changed(mine)


def _tensor(value) -> Tensor:
    return value if isinstance(value, Tensor) else value.value


def _is_batch_norm(module: Module) -> bool:
    return isinstance(module, _NormBase) and not isinstance(module, _InstanceNorm)


def update_bn(loader: Iterable[Any], model: Module, device=None) -> None:
    """Recompute every BatchNorm's running statistics over one pass of ``loader``, as
    PyTorch's: reset, then averaged over the batches with equal weight (momentum None for the
    pass), in training mode; the model's mode and momenta are restored after. A batch that is
    a tuple or list gives its first element; numpy batches are uploaded to the model's queue.
    ``device`` must be None (PyTorch's; parcl's model is on its queues already)."""
    if device is not None:
        raise OptimizerError("update_bn: device must be None (the batches go to the model's "
                             "queue)")
    norms = [m for m in model.modules() if _is_batch_norm(m) and m.running_mean is not None]
    if not norms:
        return
    momenta, added = {}, []
    for m in norms:
        m.running_mean.fill_(0.0)
        m.running_var.fill_(1.0)
        if "num_batches_tracked" in m._buffers:
            m.num_batches_tracked.fill_(0)
        else:
            m.register_buffer("num_batches_tracked",
                              Tensor.zeros(m.running_mean.queue, (), np.int64))
            added.append(m)
        momenta[m] = m.momentum
        m.momentum = None
    was_training = model.training
    queue = model.queue
    model.train()
    try:
        with tp.no_grad():
            for batch in loader:
                if isinstance(batch, (list, tuple)):
                    batch = batch[0]
                if isinstance(batch, np.ndarray):
                    batch = Tensor.from_host(queue, batch.astype(np.float32, copy=False))
                model(batch)
    finally:
        for m, momentum in momenta.items():
            m.momentum = momentum
        for m in added:
            delattr(m, "num_batches_tracked")
        model.train(was_training)


class SWALR(LRScheduler):
    """Anneals each group's learning rate from its value to ``swa_lr`` over
    ``anneal_epochs`` steps (``"cos"`` or ``"linear"``), then holds it, as PyTorch's SWALR
    (its recursive form: each step starts from the group's current learning rate).
    ``swa_lr`` is one number or one per group, kept in the scheduler (``swa_lrs``; PyTorch
    adds ``swa_lr`` to each group, which parcl's optimizer state dicts would refuse).

    >>> swa_sched = pc.optim.swa_utils.SWALR(opt, swa_lr=0.05, anneal_epochs=5)
    """

    _fields = ("swa_lrs", "anneal_epochs", "_anneal_strategy")

    def __init__(self, optimizer, swa_lr, anneal_epochs: int = 10,
                 anneal_strategy: str = "cos", last_epoch: int = -1):
        groups = getattr(optimizer, "param_groups", [])
        self.swa_lrs = _per_group("SWALR", "swa_lr", swa_lr, len(groups))
        if anneal_strategy not in ("cos", "linear"):
            raise SchedulerError(f"SWALR: anneal_strategy must be 'cos' or 'linear', got "
                                 f"{anneal_strategy!r}")
        if isinstance(anneal_epochs, bool) or not isinstance(anneal_epochs, int) \
                or anneal_epochs < 0:
            raise SchedulerError(f"SWALR: anneal_epochs must be an int >= 0, got "
                                 f"{anneal_epochs!r}")
        self.anneal_epochs = anneal_epochs
        self._anneal_strategy = anneal_strategy
        super().__init__(optimizer, last_epoch)

    def _anneal(self, t: float) -> float:
        return (1 - math.cos(math.pi * t)) / 2 if self._anneal_strategy == "cos" else t

    def get_lr(self) -> list[float]:
        step = self._step_count - 1
        if self.anneal_epochs == 0:
            step = max(1, step)
        span = max(1, self.anneal_epochs)
        prev_alpha = self._anneal(max(0, min(1, (step - 1) / span)))
        alpha = self._anneal(max(0, min(1, step / span)))
        out = []
        for lr, swa_lr in zip(self._group_lrs(), self.swa_lrs):
            # the learning rate the annealing started from, recovered from the current one
            start = swa_lr if prev_alpha == 1 else (lr - prev_alpha * swa_lr) / (1 - prev_alpha)
            out.append(swa_lr * alpha + start * (1 - alpha))
        return out
