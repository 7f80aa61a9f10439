"""Schedulers of schedulers (``pc.optim.lr_scheduler``), as ``torch.optim.lr_scheduler``'s:
``SequentialLR`` runs them one after another, switching at milestones; ``ChainedScheduler``
steps them all at every step, each multiplying into the learning rate the one before set."""

from __future__ import annotations

import numbers
from bisect import bisect_right
from typing import Any

from .lr_base import (LRScheduler, SchedulerError, _check_last_lr, _last_epoch,
                      _param_groups)
from .lr_plateau import ReduceLROnPlateau

__all__ = ["ChainedScheduler", "SequentialLR"]


def _check_members(owner: str, schedulers: list, optimizer: Any) -> None:
    if not schedulers:
        raise SchedulerError(f"{owner} expects at least one scheduler, got none")
    for i, s in enumerate(schedulers):
        if not isinstance(s, LRScheduler):
            raise TypeError(f"{owner}: schedulers[{i}] is a {type(s).__name__}, not a "
                            f"scheduler")
        if isinstance(s, ReduceLROnPlateau):
            raise SchedulerError(f"{owner}: schedulers[{i}] is a ReduceLROnPlateau, whose "
                                 f"step takes the metric it watches; step it on its own "
                                 f"(scheduler.step(val_loss)), beside this {owner} (PyTorch "
                                 f"refuses it here too)")
        if s.optimizer is not optimizer:
            raise SchedulerError(f"{owner}: schedulers[{i}] ({type(s).__name__}) belongs to "
                                 f"another optimizer")


def _undo_initial_steps(s: LRScheduler) -> None:
    """PyTorch's ``recursive_undo``: every scheduler inside ``s`` (inside its parts, for a
    scheduler of schedulers) goes one step back, undoing its constructor's initial step."""
    if isinstance(s, (SequentialLR, ChainedScheduler)):
        for sub in s._schedulers:
            _undo_initial_steps(sub)
    else:
        s.last_epoch -= 1


class SequentialLR(LRScheduler):
    """Run ``schedulers`` one after another, switching at the steps in ``milestones`` (one
    fewer than schedulers); at a milestone the next scheduler starts from its step 0.

    >>> warmup = pc.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=5)
    >>> cosine = pc.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=95)
    >>> sched = pc.optim.lr_scheduler.SequentialLR(opt, [warmup, cosine], milestones=[5])
    """

    def __init__(self, optimizer: Any, schedulers: list[LRScheduler], milestones: list[int],
                 last_epoch: int = -1):
        schedulers, milestones = list(schedulers), list(milestones)
        last_epoch = _last_epoch("SequentialLR", last_epoch)
        # int() would make 2.5 a 2 silently: PyTorch switches after step 2 there but never
        # restarts the next scheduler (no step equals 2.5), so neither reading is right.
        if not all(isinstance(m, numbers.Integral) and not isinstance(m, bool)
                   for m in milestones):
            raise SchedulerError(f"SequentialLR: milestones must be ints (the steps at which "
                                 f"to switch), got {milestones!r}")
        milestones = [int(m) for m in milestones]
        _check_members("SequentialLR", schedulers, optimizer)
        if len(milestones) != len(schedulers) - 1:
            raise SchedulerError(f"SequentialLR: {len(schedulers)} schedulers need "
                                 f"{len(schedulers) - 1} milestones, got {len(milestones)}")
        if milestones != sorted(milestones):
            raise SchedulerError(f"SequentialLR: milestones must increase, got {milestones}")
        for i, s in enumerate(schedulers[1:], start=1):
            # At its milestone a scheduler restarts from step 0 by its closed form or get_lr;
            # a scheduler of schedulers has neither (PyTorch raises NotImplementedError there).
            if isinstance(s, (SequentialLR, ChainedScheduler)):
                raise SchedulerError(f"SequentialLR: schedulers[{i}] is a {type(s).__name__}, "
                                     f"which cannot restart at a milestone; only "
                                     f"schedulers[0] may be one (or flatten it into this "
                                     f"SequentialLR's list)")
        self._schedulers, self._milestones = schedulers, milestones
        self.optimizer = optimizer
        self.base_lrs = list(getattr(optimizer, "initial_lrs", None) or self._group_lrs())
        self.last_epoch = last_epoch + 1
        self._step_count = 0
        # The sub-schedulers' constructors each took a step: undo them, then take the first
        # one's initial step again from the initial learning rates, as PyTorch does.
        for group, lr in zip(optimizer.param_groups, self.base_lrs):
            group["lr"] = lr
        for s in schedulers:
            _undo_initial_steps(s)
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

    def _check_state(self, state_dict: dict[str, Any]) -> None:
        super()._check_state(state_dict)
        _check_parts(self, state_dict["_schedulers"])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._check_state(state_dict)        # every part checked before any change
        for key in ("base_lrs", "last_epoch", "_step_count", "_last_lr", "_milestones"):
            value = state_dict[key]
            setattr(self, key, list(value) if isinstance(value, list) else value)
        for s, sub in zip(self._schedulers, state_dict["_schedulers"]):
            s.load_state_dict(sub)


def _check_parts(owner, subs) -> None:
    name = f"{type(owner).__name__}.load_state_dict"
    if not isinstance(subs, list) or len(subs) != len(owner._schedulers):
        got = len(subs) if isinstance(subs, list) else type(subs).__name__
        raise SchedulerError(f"{name}: {got} schedulers' states given, this one holds "
                             f"{len(owner._schedulers)}")
    for s, sub in zip(owner._schedulers, subs):
        s._check_state(sub)


class ChainedScheduler(LRScheduler):
    """Step every scheduler of ``schedulers`` at each ``step()``, in order: each one's change
    applies to the learning rate the one before it set, so recursive schedules multiply
    (a constant warm-up under an exponential decay, say). The constructor takes no step of
    its own (the parts took theirs). ``optimizer`` defaults to the first scheduler's.

    >>> warm = pc.optim.lr_scheduler.ConstantLR(opt, factor=0.1, total_iters=20)
    >>> decay = pc.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
    >>> sched = pc.optim.lr_scheduler.ChainedScheduler([warm, decay])
    """

    def __init__(self, schedulers: list[LRScheduler], optimizer: Any = None):
        schedulers = list(schedulers)
        if optimizer is None and schedulers:
            optimizer = getattr(schedulers[0], "optimizer", None)
        _check_members("ChainedScheduler", schedulers, optimizer)
        self._schedulers = schedulers
        self.optimizer = optimizer
        self._last_lr = [g["lr"] for g in _param_groups("ChainedScheduler", optimizer)]

    def _initial_step(self) -> None:
        # As PyTorch's (inside SequentialLR): its parts take ordinary steps, not initial ones.
        self.step()

    def step(self) -> None:
        """Step every chained scheduler once, in order."""
        for s in self._schedulers:
            s.step()
        self._last_lr = self._group_lrs()

    def state_dict(self) -> dict[str, Any]:
        """``_last_lr`` and every part's state, JSON-able (PyTorch's keys)."""
        return {"_last_lr": list(self._last_lr),
                "_schedulers": [s.state_dict() for s in self._schedulers]}

    def _check_state(self, state_dict: dict[str, Any]) -> None:
        name = "ChainedScheduler.load_state_dict"
        if not isinstance(state_dict, dict):
            raise SchedulerError(f"{name}: expected a dict, got {type(state_dict).__name__}")
        if set(state_dict) != {"_last_lr", "_schedulers"}:
            raise SchedulerError(f"{name}: the state has keys {sorted(state_dict)}, "
                                 f"ChainedScheduler has ['_last_lr', '_schedulers'] (a state "
                                 f"of another scheduler?)")
        _check_last_lr(name, self, state_dict["_last_lr"])
        _check_parts(self, state_dict["_schedulers"])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a ``state_dict()``: every part's state is checked before any changes."""
        self._check_state(state_dict)
        self._last_lr = list(state_dict["_last_lr"])
        for s, sub in zip(self._schedulers, state_dict["_schedulers"]):
            s.load_state_dict(sub)

    def __repr__(self) -> str:
        return f"ChainedScheduler([{', '.join(repr(s) for s in self._schedulers)}])"
