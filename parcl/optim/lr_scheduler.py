"""Learning-rate schedulers (``pc.optim.lr_scheduler``): PyTorch's formulas and call order.

``LambdaLR``, ``StepLR``, ``CosineAnnealingLR``, ``LinearLR`` and ``SequentialLR`` compute each
step's learning rate exactly as ``torch.optim.lr_scheduler`` does (its recursive forms where
it uses them, so the values agree to the last bit of a float64), and write it into every
parameter group's ``"lr"``. The constructor takes the initial step (``last_epoch`` becomes 0);
call ``scheduler.step()`` once after every ``optimizer.step()``. ``get_last_lr()`` is what the
last step set; ``state_dict()`` / ``load_state_dict()`` are JSON-able, so ``pc.save(...,
scheduler=s)`` keeps a schedule in a checkpoint and a resumed run continues it bit for bit.

Where PyTorch keeps ``param_group["initial_lr"]``, parcl keeps ``optimizer.initial_lrs`` (the
first scheduler attached records the groups' learning rates there; later ones, as those
chained by ``SequentialLR``, start from them): the optimizer's own state dict stays as it was.

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
import types
from bisect import bisect_right
from typing import Any
from collections.abc import Callable

from ..errors import ParclError

__all__ = ["CosineAnnealingLR", "LRScheduler", "LambdaLR", "LinearLR", "SchedulerError",
           "SequentialLR", "StepLR"]


class SchedulerError(ParclError, ValueError):
    """Bad scheduler options, or a state dict that does not fit the scheduler."""


class LRScheduler:
    """Base class: ``step()``, ``get_last_lr()``, state dicts. Subclasses define ``get_lr()``
    (the next learning rates, read after ``last_epoch`` was advanced) and, where PyTorch has
    one, ``_closed_form()`` (used by ``SequentialLR`` at a milestone)."""

    #: the subclass's own options, part of its state dict
    _fields: tuple[str, ...] = ()

    def __init__(self, optimizer: Any, last_epoch: int = -1):
        groups = getattr(optimizer, "param_groups", None)
        if not isinstance(groups, list) or not all(isinstance(g, dict) and "lr" in g
                                                   for g in groups):
            raise TypeError(f"{type(self).__name__}: {type(optimizer).__name__} is not an "
                            f"optimizer (no param_groups with an 'lr')")
        self.optimizer = optimizer
        if last_epoch == -1:
            if getattr(optimizer, "initial_lrs", None) is None:
                optimizer.initial_lrs = [float(g["lr"]) for g in groups]
        elif getattr(optimizer, "initial_lrs", None) is None:
            raise SchedulerError(f"{type(self).__name__}: last_epoch={last_epoch} resumes a "
                                 f"schedule, but no scheduler set the optimizer's initial_lrs; "
                                 f"construct with last_epoch=-1 and load_state_dict instead")
        self.base_lrs: list[float] = list(optimizer.initial_lrs)
        self.last_epoch = int(last_epoch)
        self._initial_step()

    # -- stepping --------------------------------------------------------------------------
    def _initial_step(self) -> None:
        self._step_count = 0
        self._is_initial = True
        try:
            self.step()
        finally:
            self._is_initial = False

    def step(self) -> None:
        """Advance the schedule by one step (call it after ``optimizer.step()``) and set every
        parameter group's learning rate."""
        self._step_count += 1
        self._update_lr(None)

    def _update_lr(self, epoch: int | None) -> None:
        if epoch is None:
            self.last_epoch += 1
            values = self.get_lr()
        else:
            self.last_epoch = epoch
            values = self._closed_form() if hasattr(self, "_closed_form") else self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, values):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def get_lr(self) -> list[float]:
        raise NotImplementedError

    def get_last_lr(self) -> list[float]:
        """The learning rates the last ``step()`` (or the constructor) set, one per group."""
        return list(self._last_lr)

    def _group_lrs(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    # -- state dicts -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The schedule's position and options (PyTorch's keys), JSON-able."""
        state = {"base_lrs": list(self.base_lrs), "last_epoch": self.last_epoch,
                 "_step_count": self._step_count, "_last_lr": list(self._last_lr),
                 "_is_initial": False}
        state.update({name: getattr(self, name) for name in self._fields})
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a ``state_dict()``; one of another scheduler (other keys, another number of
        parameter groups) raises ``SchedulerError`` and changes nothing."""
        self._check_state(state_dict)
        for key, value in state_dict.items():
            setattr(self, key, list(value) if isinstance(value, list) else value)

    def _check_state(self, state_dict: dict[str, Any]) -> None:
        name = f"{type(self).__name__}.load_state_dict"
        if not isinstance(state_dict, dict):
            raise SchedulerError(f"{name}: expected a dict, got {type(state_dict).__name__}")
        mine = self.state_dict()
        if set(state_dict) != set(mine):
            raise SchedulerError(f"{name}: the state has keys {sorted(state_dict)}, "
                                 f"{type(self).__name__} has {sorted(mine)} (a state of "
                                 f"another scheduler?)")
        for key in ("base_lrs", "_last_lr"):
            value = state_dict[key]
            if not isinstance(value, list) or len(value) != len(mine[key]):
                raise SchedulerError(f"{name}: {key} {value!r} does not fit the optimizer's "
                                     f"{len(mine[key])} parameter groups")
        if not isinstance(state_dict["last_epoch"], int):
            raise SchedulerError(f"{name}: last_epoch must be an int, got "
                                 f"{state_dict['last_epoch']!r}")

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={getattr(self, k)!r}" for k in self._fields if k[0] != "_")
        return f"{type(self).__name__}({opts}{', ' if opts else ''}last_epoch={self.last_epoch})"


def _positive_int(owner: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SchedulerError(f"{owner}: {name} must be a positive int, got {value!r}")
    return value


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
                raise SchedulerError(f"LambdaLR: expected {groups} lr_lambdas (one per "
                                     f"parameter group), got {len(lr_lambda)}")
            self.lr_lambdas = list(lr_lambda)
        else:
            self.lr_lambdas = [lr_lambda] * groups
        if not all(callable(f) for f in self.lr_lambdas):
            raise SchedulerError("LambdaLR: lr_lambda must be callable (or a list of them)")
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


class SequentialLR(LRScheduler):
    """Run ``schedulers`` one after another, switching at the steps in ``milestones`` (one
    fewer than schedulers); at a milestone the next scheduler starts from its step 0.

    >>> warmup = pc.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=5)
    >>> cosine = pc.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=95)
    >>> sched = pc.optim.lr_scheduler.SequentialLR(opt, [warmup, cosine], milestones=[5])
    """

    def __init__(self, optimizer: Any, schedulers: list[LRScheduler], milestones: list[int],
                 last_epoch: int = -1):
        schedulers, milestones = list(schedulers), [int(m) for m in milestones]
        if not schedulers:
            raise SchedulerError("SequentialLR expects at least one scheduler, got none")
        for i, s in enumerate(schedulers):
            if not isinstance(s, LRScheduler):
                raise TypeError(f"SequentialLR: schedulers[{i}] is a {type(s).__name__}, not "
                                f"a scheduler")
            if s.optimizer is not optimizer:
                raise SchedulerError(f"SequentialLR: schedulers[{i}] ({type(s).__name__}) "
                                     f"belongs to another optimizer")
        if len(milestones) != len(schedulers) - 1:
            raise SchedulerError(f"SequentialLR: {len(schedulers)} schedulers need "
                                 f"{len(schedulers) - 1} milestones, got {len(milestones)}")
        if milestones != sorted(milestones):
            raise SchedulerError(f"SequentialLR: milestones must increase, got {milestones}")
        self._schedulers, self._milestones = schedulers, milestones
        self.optimizer = optimizer
        self.base_lrs = list(getattr(optimizer, "initial_lrs", None) or self._group_lrs())
        self.last_epoch = int(last_epoch) + 1
        self._step_count = 0
        # The sub-schedulers' constructors each took a step: undo them, then take the first
        # one's initial step again from the initial learning rates, as PyTorch does.
        for group, lr in zip(optimizer.param_groups, self.base_lrs):
            group["lr"] = lr
        for s in schedulers:
            s.last_epoch -= 1
        idx = bisect_right(milestones, 0)
        schedulers[idx]._initial_step()
        self._last_lr = schedulers[idx].get_last_lr()

    def step(self) -> None:
        self._step_count += 1
        self.last_epoch += 1
        idx = bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[idx]
        if idx > 0 and self._milestones[idx - 1] == self.last_epoch:
            scheduler._update_lr(0)
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        return {"base_lrs": list(self.base_lrs), "last_epoch": self.last_epoch,
                "_step_count": self._step_count, "_last_lr": list(self._last_lr),
                "_is_initial": False, "_milestones": list(self._milestones),
                "_schedulers": [s.state_dict() for s in self._schedulers]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._check_state(state_dict)
        subs = state_dict["_schedulers"]
        if not isinstance(subs, list) or len(subs) != len(self._schedulers):
            raise SchedulerError(f"SequentialLR.load_state_dict: {len(subs)} schedulers' "
                                 f"states given, this one chains {len(self._schedulers)}")
        for s, sub in zip(self._schedulers, subs):       # every part checked before any change
            s._check_state(sub)
        for key in ("base_lrs", "last_epoch", "_step_count", "_last_lr", "_milestones"):
            value = state_dict[key]
            setattr(self, key, list(value) if isinstance(value, list) else value)
        for s, sub in zip(self._schedulers, subs):
            s.load_state_dict(sub)
