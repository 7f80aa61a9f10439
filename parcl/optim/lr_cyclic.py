"""Cyclic schedules (``pc.optim.lr_scheduler``), step for step as ``torch.optim.lr_scheduler``'s:
``CosineAnnealingWarmRestarts`` (SGDR: cosine annealing restarted every ``T_i`` epochs, ``T_i``
growing by ``T_mult``; ``step(epoch)`` takes fractional epochs) and ``CyclicLR`` (the learning
rate between ``base_lr`` and ``max_lr`` in triangles, with the momentum the other way).

Where PyTorch keeps ``max_momentum`` and ``base_momentum`` in every parameter group, ``CyclicLR``
keeps them itself (``max_momentums``, ``base_momentums``; in its state dict), as ``OneCycleLR``
does: the optimizer's groups hold only its own options.
"""

from __future__ import annotations

import math
import numbers
import types
from typing import Any
from collections.abc import Callable

from .lr_base import (LRScheduler, SchedulerError, _CyclesMomentum, _number, _param_groups,
                      _per_group, _positive_int)

__all__ = ["CosineAnnealingWarmRestarts", "CyclicLR"]


class CosineAnnealingWarmRestarts(LRScheduler):
    """Cosine annealing from the base learning rate to ``eta_min`` over ``T_i`` epochs, then a
    restart; the first period is ``T_0``, each next one ``T_mult`` times longer::

        lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * T_cur / T_i)) / 2

    ``step()`` advances one epoch; ``step(epoch)`` jumps to ``epoch``, which may be fractional
    (``step(epoch + i / iters)`` after each of an epoch's ``iters`` batches), as PyTorch's.

    >>> sched = pc.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=10, T_mult=2)
    """

    _fields = ("T_0", "T_i", "T_mult", "eta_min", "T_cur")

    def __init__(self, optimizer: Any, T_0: int, T_mult: int = 1,  # noqa: N803
                 eta_min: float = 0.0, last_epoch: int = -1):
        name = "CosineAnnealingWarmRestarts"
        self.T_0 = self.T_i = _positive_int(name, "T_0", T_0)
        self.T_mult = _positive_int(name, "T_mult", T_mult)
        if not isinstance(eta_min, numbers.Real):         # PyTorch refuses "0.1" too
            raise SchedulerError(f"{name}: eta_min must be a number, got {eta_min!r}")
        self.eta_min = _number(name, "eta_min", eta_min)
        self.T_cur = last_epoch
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [self.eta_min + (base - self.eta_min)
                * (1 + math.cos(math.pi * self.T_cur / self.T_i)) / 2 for base in self.base_lrs]

    def step(self, epoch: float | None = None) -> None:
        """Advance one epoch, or go to ``epoch`` (a number >= 0, fractional allowed)."""
        self._step_count += 1
        self._update_lr(epoch)

    def _update_lr(self, epoch: float | None) -> None:
        # Also SequentialLR's restart at a milestone (epoch 0), as PyTorch's step(0).
        if epoch is None and self.last_epoch < 0:
            epoch = 0
        if epoch is None:
            epoch = self.last_epoch + 1
            self.T_cur = self.T_cur + 1
            if self.T_cur >= self.T_i:
                self.T_cur = self.T_cur % self.T_i
                self.T_i = self.T_i * self.T_mult
        else:
            epoch = _epoch(epoch)
            if epoch >= self.T_0:
                if self.T_mult == 1:
                    self.T_cur = epoch % self.T_0
                else:
                    n = int(math.log((epoch / self.T_0 * (self.T_mult - 1) + 1), self.T_mult))
                    self.T_cur = epoch - self.T_0 * (self.T_mult ** n - 1) / (self.T_mult - 1)
                    self.T_i = self.T_0 * self.T_mult ** n
            else:
                self.T_i = self.T_0
                self.T_cur = epoch
        self.last_epoch = math.floor(epoch)
        self._apply(self.get_lr())


def _epoch(value) -> float:
    """An epoch given to ``step``: a number >= 0 (an int stays an int, as PyTorch keeps it)."""
    owner = "CosineAnnealingWarmRestarts.step"
    out = _number(owner, "epoch", value)
    if out < 0:
        raise SchedulerError(f"{owner}: expected a non-negative epoch, got {value!r}")
    return value if isinstance(value, int) else out


class CyclicLR(_CyclesMomentum, LRScheduler):
    """The learning rate cycles between ``base_lr`` and ``max_lr``: up over ``step_size_up``
    steps, down over ``step_size_down`` (default: the same), the amplitude scaled per cycle
    (``triangular``: 1; ``triangular2``: halved each cycle; ``exp_range``: ``gamma ** step``)
    or by ``scale_fn(x)`` of the cycle or the step (``scale_mode``). Call ``step()`` after
    every batch. With ``cycle_momentum`` the optimizer's momentum (SGD, RMSprop) or first beta
    (Adam, AdamW) moves the other way, between ``max_momentum`` and ``base_momentum``; an
    optimizer with neither (Adagrad) needs ``cycle_momentum=False``. The constructor sets every
    group's learning rate to ``base_lr``, as PyTorch's.

    >>> sched = pc.optim.lr_scheduler.CyclicLR(opt, base_lr=0.01, max_lr=0.1,
    ...                                        step_size_up=200)
    """

    _fields = ("max_lrs", "total_size", "step_ratio", "mode", "gamma", "scale_mode",
               "cycle_momentum", "use_beta1", "base_momentums", "max_momentums")

    def __init__(self, optimizer: Any, base_lr, max_lr, step_size_up: int = 2000,
                 step_size_down: int | None = None, mode: str = "triangular",
                 gamma: float = 1.0, scale_fn: Callable[[float], float] | None = None,
                 scale_mode: str = "cycle", cycle_momentum: bool = True,
                 base_momentum=0.8, max_momentum=0.9, last_epoch: int = -1):
        groups = _param_groups("CyclicLR", optimizer)
        base_lrs = _per_group("CyclicLR", "base_lr", base_lr, len(groups))
        self.max_lrs = _per_group("CyclicLR", "max_lr", max_lr, len(groups))
        up = _number("CyclicLR", "step_size_up", step_size_up)
        down = up if step_size_down is None else _number("CyclicLR", "step_size_down",
                                                         step_size_down)
        # PyTorch divides by the cycle's length and by the rising part's share of it.
        if not (up > 0 and down >= 0):
            raise SchedulerError(f"CyclicLR: step_size_up must be > 0 and step_size_down >= 0, "
                                 f"got {step_size_up!r} and {step_size_down!r}")
        self.total_size = up + down
        self.step_ratio = up / self.total_size
        if scale_fn is not None and not callable(scale_fn):
            raise SchedulerError(f"CyclicLR: scale_fn must be callable, got {scale_fn!r}")
        if scale_fn is None and mode not in ("triangular", "triangular2", "exp_range"):
            raise SchedulerError(f"CyclicLR: mode must be 'triangular', 'triangular2' or "
                                 f"'exp_range' (or give a scale_fn), got {mode!r}")
        if scale_mode not in ("cycle", "iterations"):
            raise SchedulerError(f"CyclicLR: scale_mode must be 'cycle' or 'iterations', got "
                                 f"{scale_mode!r}")
        if not isinstance(cycle_momentum, bool):
            raise SchedulerError(f"CyclicLR: cycle_momentum must be a bool, got "
                                 f"{cycle_momentum!r}")
        self.mode, self.gamma = mode, _number("CyclicLR", "gamma", gamma)
        self._scale_fn_custom = scale_fn
        # A built-in mode decides what its scale reads, whatever scale_mode says (PyTorch).
        self.scale_mode = ({"triangular": "cycle", "triangular2": "cycle",
                            "exp_range": "iterations"}[mode] if scale_fn is None else scale_mode)
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            self._momentum_bounds(optimizer, groups, base_momentum, max_momentum)
        if last_epoch == -1:
            for group, lr in zip(groups, base_lrs):
                group["lr"] = lr
            if cycle_momentum:
                for group, m in zip(groups, self.max_momentums):
                    self._set_momentum(group, m)
        # As PyTorch's: the initial step reads the groups' initial learning rates (base_lr,
        # unless a scheduler made before set others), the later ones base_lr.
        super().__init__(optimizer, last_epoch)
        self.base_lrs = base_lrs

    def scale_fn(self, x: float) -> float:
        """The amplitude's scale at cycle (or step) ``x``."""
        if self._scale_fn_custom is not None:
            return self._scale_fn_custom(x)
        if self.mode == "triangular":
            return 1.0
        if self.mode == "triangular2":
            return 1 / (2.0 ** (x - 1))
        return self.gamma ** x

    def get_lr(self) -> list[float]:
        cycle = math.floor(1 + self.last_epoch / self.total_size)
        x = 1.0 + self.last_epoch / self.total_size - cycle
        if x <= self.step_ratio:
            factor = x / self.step_ratio
        else:
            factor = (x - 1) / (self.step_ratio - 1)
        scale = self.scale_fn(cycle if self.scale_mode == "cycle" else self.last_epoch)
        lrs = [base + (top - base) * factor * scale
               for base, top in zip(self.base_lrs, self.max_lrs)]
        groups = self.optimizer.param_groups
        # A group added after this scheduler has no cycle: the base refuses the step (as
        # PyTorch's strict zip does), and no group's momentum has moved by then.
        if self.cycle_momentum and len(groups) == len(self.max_momentums):
            for group, low, top in zip(groups, self.base_momentums, self.max_momentums):
                self._set_momentum(group, top - (top - low) * factor * scale)
        return lrs

    def state_dict(self) -> dict[str, Any]:
        """As the base's, with ``_scale_fn_custom``: a callable object's ``__dict__``, None for
        a function (not saved, as PyTorch's)."""
        state = super().state_dict()
        fn = self._scale_fn_custom
        state["_scale_fn_custom"] = (None if fn is None or isinstance(fn, types.FunctionType)
                                     else dict(fn.__dict__))
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._check_state(state_dict)
        saved = state_dict["_scale_fn_custom"]
        if saved is not None and self._scale_fn_custom is None:
            raise SchedulerError("CyclicLR.load_state_dict: the state holds a scale_fn's "
                                 "attributes, this scheduler has no scale_fn")
        for key, value in state_dict.items():
            if key != "_scale_fn_custom":
                setattr(self, key, list(value) if isinstance(value, list) else value)
        if saved is not None:
            self._scale_fn_custom.__dict__.update(saved)
