"""Learning-rate schedulers (``pc.optim.lr_scheduler``): PyTorch's formulas and call order.

``LambdaLR``, ``StepLR``, ``MultiStepLR``, ``ExponentialLR``, ``ConstantLR``, ``LinearLR``,
``CosineAnnealingLR``, ``PolynomialLR``, ``CosineAnnealingWarmRestarts``, ``CyclicLR``,
``OneCycleLR``, ``SequentialLR`` and ``ChainedScheduler`` compute each
step's learning rate exactly as ``torch.optim.lr_scheduler`` does (its recursive forms where
it uses them, so the values agree to the last bit of a float64), and write it into every
parameter group's ``"lr"``. The constructor takes the initial step (``last_epoch`` becomes 0);
call ``scheduler.step()`` once after every ``optimizer.step()``. ``get_last_lr()`` is what the
last step set; ``state_dict()`` / ``load_state_dict()`` are JSON-able, so ``pc.save(...,
scheduler=s)`` keeps a schedule in a checkpoint and a resumed run continues it bit for bit.
``ReduceLROnPlateau`` steps on a metric instead: ``scheduler.step(val_loss)``.

Where PyTorch keeps ``param_group["initial_lr"]``, parcl keeps ``optimizer.initial_lrs`` (the
first scheduler attached records the groups' learning rates there; later ones, as those
chained by ``SequentialLR``, start from them). The optimizer's state dict saves them as each
group's ``"initial_lr"``, as PyTorch's, so a scheduler made after loading it starts from them.

>>> opt = pc.optim.SGD(model.parameters(), lr=0.1)
>>> warmup = pc.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=5)
>>> cosine = pc.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=95)
>>> sched = pc.optim.lr_scheduler.SequentialLR(opt, [warmup, cosine], milestones=[5])
>>> for xb, yb in loader:
...     loss = group.step(xb, yb, tp.cross_entropy, opt)
...     sched.step()
"""

from __future__ import annotations

import math
import numbers
import types
from typing import Any
from collections.abc import Callable

from bisect import bisect_right

from .lr_base import LRScheduler, SchedulerError, _number, _positive_int
from .lr_compose import ChainedScheduler, SequentialLR
from .lr_cyclic import CosineAnnealingWarmRestarts, CyclicLR
from .lr_onecycle import OneCycleLR
from .lr_plateau import ReduceLROnPlateau

__all__ = ["ChainedScheduler", "ConstantLR", "CosineAnnealingLR", "CosineAnnealingWarmRestarts",
           "CyclicLR", "ExponentialLR", "LRScheduler", "LambdaLR", "LinearLR", "MultiStepLR",
           "MultiplicativeLR",
           "OneCycleLR", "PolynomialLR", "ReduceLROnPlateau", "SchedulerError", "SequentialLR",
           "StepLR"]


class LambdaLR(LRScheduler):
    """``lr = base_lr * lr_lambda(last_epoch)``; ``lr_lambda`` a function of the step, or one
    per parameter group. Functions are not saved by ``state_dict()`` (as PyTorch: only a
    callable object's ``__dict__`` is).

    >>> sched = pc.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.95 ** step)
    """

    def __init__(self, optimizer: Any, lr_lambda: Callable[[int], float] | list,
                 last_epoch: int = -1):
        groups = len(optimizer.param_groups)
        if isinstance(lr_lambda, (list, tuple)):
            if len(lr_lambda) != groups:
                raise SchedulerError(f"{type(self).__name__}: expected {groups} lr_lambdas "
                                     f"(one per parameter group), got {len(lr_lambda)}")
            self.lr_lambdas = list(lr_lambda)
        else:
            self.lr_lambdas = [lr_lambda] * groups
        if not all(callable(f) for f in self.lr_lambdas):
            raise SchedulerError(f"{type(self).__name__}: lr_lambda must be callable (or a "
                                 "list of them)")
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [base * fn(self.last_epoch) for fn, base in zip(self.lr_lambdas, self.base_lrs)]

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["lr_lambdas"] = [None if isinstance(fn, types.FunctionType) else
                               dict(fn.__dict__) for fn in self.lr_lambdas]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._check_state(state_dict)
        for key, value in state_dict.items():
            if key != "lr_lambdas":
                setattr(self, key, list(value) if isinstance(value, list) else value)
        for fn, saved in zip(self.lr_lambdas, state_dict["lr_lambdas"] or []):
            if saved is not None:
                fn.__dict__.update(saved)


class MultiplicativeLR(LambdaLR):
    """Multiply each group's learning rate by ``lr_lambda(last_epoch)`` at every step (none
    at construction), as PyTorch's: the factors compound, and a change another scheduler
    made to the rate is kept.

    >>> sched = pc.optim.lr_scheduler.MultiplicativeLR(opt, lambda step: 0.95)
    """

    def get_lr(self) -> list[float]:
        # Only the constructor's step keeps the rate, as PyTorch's: a resumed constructor
        # (last_epoch=k) must not multiply once more, and a restart at a SequentialLR
        # milestone (step 0) multiplies by lr_lambda(0).
        if self._is_initial:
            return self._group_lrs()
        return [lr * fn(self.last_epoch) for fn, lr in zip(self.lr_lambdas, self._group_lrs())]


class StepLR(LRScheduler):
    """Multiply the learning rate by ``gamma`` every ``step_size`` steps.

    >>> sched = pc.optim.lr_scheduler.StepLR(opt, step_size=30, gamma=0.1)
    """

    _fields = ("step_size", "gamma")

    def __init__(self, optimizer: Any, step_size: int, gamma: float = 0.1,
                 last_epoch: int = -1):
        self.step_size = _positive_int("StepLR", "step_size", step_size)
        self.gamma = float(gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return self._group_lrs()
        return [lr * self.gamma for lr in self._group_lrs()]

    def _closed_form(self) -> list[float]:
        return [base * self.gamma ** (self.last_epoch // self.step_size)
                for base in self.base_lrs]


class MultiStepLR(LRScheduler):
    """Multiply the learning rate by ``gamma`` at each step listed in ``milestones`` (by
    ``gamma ** n`` at a step listed ``n`` times, as PyTorch's Counter does).

    >>> sched = pc.optim.lr_scheduler.MultiStepLR(opt, milestones=[30, 80], gamma=0.1)
    """

    _fields = ("milestones", "gamma")

    def __init__(self, optimizer: Any, milestones, gamma: float = 0.1, last_epoch: int = -1):
        try:
            milestones = list(milestones)
        except TypeError:
            raise SchedulerError(f"MultiStepLR: milestones must be a list of ints, got "
                                 f"{milestones!r}") from None
        for m in milestones:
            if isinstance(m, bool) or not isinstance(m, numbers.Integral) or m < 0:
                raise SchedulerError(f"MultiStepLR: milestones must be ints >= 0, got "
                                     f"{milestones!r}")
        # Sorted, repeats kept: the same multiset as PyTorch's Counter, and JSON-able (numpy
        # integers become ints).
        self.milestones = sorted(int(m) for m in milestones)
        self.gamma = _number("MultiStepLR", "gamma", gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        n = self.milestones.count(self.last_epoch)
        if n == 0:
            return self._group_lrs()
        return [lr * self.gamma ** n for lr in self._group_lrs()]

    def _closed_form(self) -> list[float]:
        return [base * self.gamma ** bisect_right(self.milestones, self.last_epoch)
                for base in self.base_lrs]


class ExponentialLR(LRScheduler):
    """Multiply the learning rate by ``gamma`` every step.

    >>> sched = pc.optim.lr_scheduler.ExponentialLR(opt, gamma=0.95)
    """

    _fields = ("gamma",)

    def __init__(self, optimizer: Any, gamma: float, last_epoch: int = -1):
        self.gamma = _number("ExponentialLR", "gamma", gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self._is_initial:        # a resumed constructor must not step one ahead
            return self._group_lrs()
        return [lr * self.gamma for lr in self._group_lrs()]

    def _closed_form(self) -> list[float]:
        return [base * self.gamma ** self.last_epoch for base in self.base_lrs]


class ConstantLR(LRScheduler):
    """Multiply the learning rate by ``factor`` for the first ``total_iters`` steps, then
    divide it back (a constant warm-up).

    >>> sched = pc.optim.lr_scheduler.ConstantLR(opt, factor=0.5, total_iters=4)
    """

    _fields = ("factor", "total_iters")

    def __init__(self, optimizer: Any, factor: float = 1.0 / 3, total_iters: int = 5,
                 last_epoch: int = -1):
        factor = _number("ConstantLR", "factor", factor)
        # PyTorch accepts 0 and then divides by it at total_iters.
        if not 0.0 < factor <= 1.0:
            raise SchedulerError(f"ConstantLR: factor must be in (0, 1], got {factor!r}")
        self.factor = factor
        self.total_iters = _positive_int("ConstantLR", "total_iters", total_iters)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0:
            return [lr * self.factor for lr in self._group_lrs()]
        if self.last_epoch != self.total_iters:
            return self._group_lrs()
        return [lr * (1.0 / self.factor) for lr in self._group_lrs()]

    def _closed_form(self) -> list[float]:
        return [base * (self.factor + (self.last_epoch >= self.total_iters) * (1 - self.factor))
                for base in self.base_lrs]


class LinearLR(LRScheduler):
    """Scale the learning rate by a factor going linearly from ``start_factor`` to
    ``end_factor`` over ``total_iters`` steps, then keep it (the usual warm-up).

    >>> sched = pc.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=10)
    """

    _fields = ("start_factor", "end_factor", "total_iters")

    def __init__(self, optimizer: Any, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5, last_epoch: int = -1):
        if not 0.0 < start_factor <= 1.0:
            raise SchedulerError(f"LinearLR: start_factor must be in (0, 1], got "
                                 f"{start_factor!r}")
        if not 0.0 <= end_factor <= 1.0:
            raise SchedulerError(f"LinearLR: end_factor must be in [0, 1], got {end_factor!r}")
        self.start_factor, self.end_factor = float(start_factor), float(end_factor)
        self.total_iters = _positive_int("LinearLR", "total_iters", total_iters)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0:
            return [lr * self.start_factor for lr in self._group_lrs()]
        if self._is_initial or self.last_epoch > self.total_iters:
            return self._group_lrs()
        span = self.end_factor - self.start_factor
        ratio = 1.0 + span / (self.total_iters * self.start_factor
                              + (self.last_epoch - 1) * span)
        return [lr * ratio for lr in self._group_lrs()]

    def _closed_form(self) -> list[float]:
        return [base * (self.start_factor + (self.end_factor - self.start_factor)
                        * min(self.total_iters, self.last_epoch) / self.total_iters)
                for base in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """Cosine annealing from the base learning rate to ``eta_min`` over ``T_max`` steps, then
    back up (period ``2 * T_max``), in PyTorch's recursive form::

        lr_t = eta_min + (lr_{t-1} - eta_min) * (1 + cos(pi t / T)) / (1 + cos(pi (t-1) / T))
        lr_t = lr_{t-1} + (base - eta_min) * (1 - cos(pi / T)) / 2   when (t - 1 - T) % 2T == 0

    >>> sched = pc.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100, eta_min=1e-5)
    """

    _fields = ("T_max", "eta_min")

    def __init__(self, optimizer: Any, T_max: int, eta_min: float = 0.0,  # noqa: N803
                 last_epoch: int = -1):
        self.T_max = _positive_int("CosineAnnealingLR", "T_max", T_max)
        self.eta_min = float(eta_min)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        t, T, low = self.last_epoch, self.T_max, self.eta_min  # noqa: N806
        if self._is_initial:
            return self._group_lrs()
        if self._step_count == 1 and t > 0:
            return [low + (base - low) * (1 + math.cos(t * math.pi / T)) / 2
                    for base in self.base_lrs]
        if (t - 1 - T) % (2 * T) == 0:
            return [lr + (base - low) * (1 - math.cos(math.pi / T)) / 2
                    for base, lr in zip(self.base_lrs, self._group_lrs())]
        return [(1 + math.cos(math.pi * t / T)) / (1 + math.cos(math.pi * (t - 1) / T))
                * (lr - low) + low for lr in self._group_lrs()]

    def _closed_form(self) -> list[float]:
        return [self.eta_min + (base - self.eta_min)
                * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
                for base in self.base_lrs]


class PolynomialLR(LRScheduler):
    """Decay the learning rate by a polynomial of power ``power`` to 0 over ``total_iters``
    steps, then keep it, in PyTorch's recursive form::

        lr_t = lr_{t-1} * ((1 - t / total_iters) / (1 - (t - 1) / total_iters)) ** power

    >>> sched = pc.optim.lr_scheduler.PolynomialLR(opt, total_iters=100, power=2.0)
    """

    _fields = ("total_iters", "power")

    def __init__(self, optimizer: Any, total_iters: int = 5, power: float = 1.0,
                 last_epoch: int = -1):
        self.total_iters = _positive_int("PolynomialLR", "total_iters", total_iters)
        power = _number("PolynomialLR", "power", power)
        # PyTorch takes a negative power and divides by zero (0.0 ** -p) at total_iters.
        if power < 0:
            raise SchedulerError(f"PolynomialLR: power must be >= 0, got {power!r} (the "
                                 f"learning rate at total_iters would be 0 ** {power})")
        self.power = power
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self._is_initial or self.last_epoch > self.total_iters:
            return self._group_lrs()
        t, n = self.last_epoch, self.total_iters
        decay = ((1.0 - t / n) / (1.0 - (t - 1) / n)) ** self.power
        return [lr * decay for lr in self._group_lrs()]

    def _closed_form(self) -> list[float]:
        return [base * (1.0 - min(self.total_iters, self.last_epoch) / self.total_iters)
                ** self.power for base in self.base_lrs]
