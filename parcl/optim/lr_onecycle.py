"""``OneCycleLR`` (``pc.optim.lr_scheduler``): the 1cycle policy, step for step as
``torch.optim.lr_scheduler.OneCycleLR``: the learning rate climbs from ``max_lr / div_factor``
to ``max_lr`` over the first ``pct_start`` of ``total_steps``, then anneals to
``max_lr / div_factor / final_div_factor`` (``three_phase``: back down to the start first,
then to the minimum). With ``cycle_momentum`` the optimizer's momentum (SGD) or first beta
(Adam, AdamW) moves the opposite way, between ``max_momentum`` and ``base_momentum``.

Where PyTorch keeps ``max_lr``, ``min_lr``, ``max_momentum`` and ``base_momentum`` in every
parameter group, this scheduler keeps them itself (``max_lrs``, ``min_lrs``, ...; in its state
dict): the optimizer's groups hold only its own options, as ``load_state_dict`` expects.
"""

from __future__ import annotations

import math
from typing import Any

from .lr_base import (LRScheduler, SchedulerError, _CyclesMomentum, _number, _param_groups,
                      _per_group)

__all__ = ["OneCycleLR"]


def _positive_count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SchedulerError(f"OneCycleLR: expected a positive int {name}, got {value!r}")
    return value


def _phases(total: int, pct: float, three_phase: bool) -> list[dict[str, Any]]:
    """PyTorch's phases: where each ends (a float step) and what it anneals between."""
    up = {"end_step": float(pct * total) - 1, "start_lr": "initial_lr", "end_lr": "max_lr",
          "start_momentum": "max_momentum", "end_momentum": "base_momentum"}
    if not three_phase:
        return [up, {"end_step": total - 1, "start_lr": "max_lr", "end_lr": "min_lr",
                     "start_momentum": "base_momentum", "end_momentum": "max_momentum"}]
    return [up, {"end_step": float(2 * pct * total) - 2, "start_lr": "max_lr",
                 "end_lr": "initial_lr", "start_momentum": "base_momentum",
                 "end_momentum": "max_momentum"},
            {"end_step": total - 1, "start_lr": "initial_lr", "end_lr": "min_lr",
             "start_momentum": "max_momentum", "end_momentum": "max_momentum"}]


def _anneal(kind: str, start: float, end: float, pct: float) -> float:
    if kind == "cos":
        return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
    return (end - start) * pct + start


class OneCycleLR(_CyclesMomentum, LRScheduler):
    """The 1cycle learning-rate policy over ``total_steps`` steps (or ``epochs *
    steps_per_epoch``); call ``step()`` after every batch. Stepping past ``total_steps`` is a
    ``SchedulerError``. It sets the learning rate outright (it does not chain).

    >>> sched = pc.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=1000)
    """

    _fields = ("total_steps", "_schedule_phases", "_anneal_func_type", "cycle_momentum",
               "use_beta1", "max_lrs", "min_lrs", "max_momentums", "base_momentums")

    def __init__(self, optimizer: Any, max_lr, total_steps: int | None = None,
                 epochs: int | None = None, steps_per_epoch: int | None = None,
                 pct_start: float = 0.3, anneal_strategy: str = "cos",
                 cycle_momentum: bool = True, base_momentum=0.85, max_momentum=0.95,
                 div_factor: float = 25.0, final_div_factor: float = 1e4,
                 three_phase: bool = False, last_epoch: int = -1):
        groups = _param_groups("OneCycleLR", optimizer)
        if total_steps is not None:
            self.total_steps = _positive_count("total_steps", total_steps)
        elif epochs is not None and steps_per_epoch is not None:
            self.total_steps = (_positive_count("epochs", epochs)
                                * _positive_count("steps_per_epoch", steps_per_epoch))
        else:
            raise SchedulerError(f"OneCycleLR: give total_steps, or epochs and "
                                 f"steps_per_epoch; got total_steps={total_steps!r}, "
                                 f"epochs={epochs!r}, steps_per_epoch={steps_per_epoch!r}")
        pct = _number("OneCycleLR", "pct_start", pct_start)
        if not 0.0 <= pct <= 1.0:
            raise SchedulerError(f"OneCycleLR: pct_start must be in [0, 1], got {pct_start!r}")
        if anneal_strategy not in ("cos", "linear"):
            raise SchedulerError(f"OneCycleLR: anneal_strategy must be 'cos' or 'linear', got "
                                 f"{anneal_strategy!r}")
        for name, flag in (("three_phase", three_phase), ("cycle_momentum", cycle_momentum)):
            if not isinstance(flag, bool):
                raise SchedulerError(f"OneCycleLR: {name} must be a bool, got {flag!r}")
        div = _number("OneCycleLR", "div_factor", div_factor)
        final_div = _number("OneCycleLR", "final_div_factor", final_div_factor)
        if not (div > 0 and final_div > 0):
            raise SchedulerError(f"OneCycleLR: div_factor and final_div_factor must be > 0, "
                                 f"got {div_factor!r} and {final_div_factor!r}")
        self._schedule_phases = _phases(self.total_steps, pct, three_phase)
        start = 0.0
        for i, phase in enumerate(self._schedule_phases):
            # PyTorch divides by each phase's length: one of length 0 is a ZeroDivisionError
            # at the step that reaches it (every such phase is reached).
            if phase["end_step"] == start:
                raise SchedulerError(
                    f"OneCycleLR: with total_steps={self.total_steps} and "
                    f"pct_start={pct_start!r}, phase {i + 1} of {len(self._schedule_phases)} "
                    f"spans no step (its length would divide by 0); choose another "
                    f"pct_start")
            start = phase["end_step"]
        self._anneal_func_type = anneal_strategy
        self.max_lrs = _per_group("OneCycleLR", "max_lr", max_lr, len(groups), 0.0)
        self.min_lrs = [m / div / final_div for m in self.max_lrs]
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            self._momentum_bounds(optimizer, groups, base_momentum, max_momentum, 0.0)
        if last_epoch == -1:
            # PyTorch sets every group's initial_lr outright (not setdefault): a scheduler
            # made before this one no longer decides where the cycle starts.
            optimizer.initial_lrs = [m / div for m in self.max_lrs]
            if cycle_momentum:
                for group, m in zip(groups, self.max_momentums):
                    self._set_momentum(group, m)
        super().__init__(optimizer, last_epoch)

    def step(self) -> None:
        """Advance one step; past ``total_steps`` a ``SchedulerError``, nothing changed."""
        if self.last_epoch + 1 > self.total_steps:
            raise SchedulerError(f"OneCycleLR: tried to step {self.last_epoch + 1} times, "
                                 f"total_steps is {self.total_steps}; make the scheduler with "
                                 f"the run's full number of steps")
        super().step()

    def get_lr(self) -> list[float]:
        t = self.last_epoch
        ends = {"initial_lr": self.base_lrs, "max_lr": self.max_lrs, "min_lr": self.min_lrs,
                "max_momentum": self.max_momentums, "base_momentum": self.base_momentums}
        phases = self._schedule_phases
        lrs, momenta = [], []
        for g in range(len(self.base_lrs)):
            start = 0.0
            for i, phase in enumerate(phases):
                end = phase["end_step"]
                if t <= end or i == len(phases) - 1:
                    pct = (t - start) / (end - start)
                    lrs.append(_anneal(self._anneal_func_type, ends[phase["start_lr"]][g],
                                       ends[phase["end_lr"]][g], pct))
                    if self.cycle_momentum:
                        momenta.append(_anneal(self._anneal_func_type,
                                               ends[phase["start_momentum"]][g],
                                               ends[phase["end_momentum"]][g], pct))
                    break
                start = end
        groups = self.optimizer.param_groups
        # A group added after this scheduler has no cycle: the base refuses the step (as
        # PyTorch's KeyError does), and no group's momentum has moved by then.
        if self.cycle_momentum and len(groups) == len(momenta):
            for group, m in zip(groups, momenta):
                self._set_momentum(group, m)
        return lrs
