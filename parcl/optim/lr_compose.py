"""Schedulers of schedulers (``pc.optim.lr_scheduler``): ``SequentialLR`` runs them one after
another, switching at milestones, as ``torch.optim.lr_scheduler`` does."""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

from .lr_base import LRScheduler, SchedulerError

__all__ = ["SequentialLR"]


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
