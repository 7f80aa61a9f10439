"""``ReduceLROnPlateau`` (``pc.optim.lr_scheduler``), as ``torch.optim.lr_scheduler``'s: the
learning rate drops by ``factor`` once a metric has stopped improving for ``patience`` steps.
Unlike the other schedulers it steps on a value, ``step(metrics)``, and takes no initial step,
so it cannot run inside ``SequentialLR`` or ``ChainedScheduler`` (PyTorch refuses it too).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from .lr_base import (LRScheduler, SchedulerError, _check_last_lr, _last_epoch, _number,
                      _param_groups)

__all__ = ["ReduceLROnPlateau"]

_NAME = "ReduceLROnPlateau"


def _count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise SchedulerError(f"{_NAME}: {name} must be an int >= 0, got {value!r}")
    return int(value)


class ReduceLROnPlateau(LRScheduler):
    """Multiply every group's learning rate by ``factor`` (not below its ``min_lr``) when the
    metric passed to ``step`` has not improved on the best one for more than ``patience``
    steps, then wait ``cooldown`` steps before counting again. ``mode="min"`` watches for a
    fall (a loss), ``"max"`` for a rise (an accuracy); an improvement must beat the best by
    ``threshold``, relatively (``threshold_mode="rel"``: below ``best * (1 - threshold)``) or
    absolutely (``"abs"``: below ``best - threshold``). A reduction smaller than ``eps`` is
    skipped. ``min_lr`` is one number or one per group.

    >>> sched = pc.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", patience=3)
    >>> for epoch in range(epochs):                             # doctest: +SKIP
    ...     train(...)
    ...     sched.step(validation_loss)
    """

    _STATE = ("factor", "default_min_lr", "min_lrs", "patience", "cooldown", "eps",
              "last_epoch", "_last_lr", "mode", "threshold", "threshold_mode", "mode_worse",
              "best", "cooldown_counter", "num_bad_epochs")

    def __init__(self, optimizer: Any, mode: str = "min", factor: float = 0.1,
                 patience: int = 10, threshold: float = 1e-4, threshold_mode: str = "rel",
                 cooldown: int = 0, min_lr=0.0, eps: float = 1e-8):
        groups = _param_groups(_NAME, optimizer)
        factor = _number(_NAME, "factor", factor)
        if not 0.0 <= factor < 1.0:
            raise SchedulerError(f"{_NAME}: factor must be in [0, 1) (the learning rate is "
                                 f"multiplied by it), got {factor!r}")
        if mode not in ("min", "max"):
            raise SchedulerError(f"{_NAME}: mode must be 'min' or 'max', got {mode!r}")
        if threshold_mode not in ("rel", "abs"):
            raise SchedulerError(f"{_NAME}: threshold_mode must be 'rel' or 'abs', got "
                                 f"{threshold_mode!r}")
        if isinstance(min_lr, (list, tuple)):
            if len(min_lr) != len(groups):
                raise SchedulerError(f"{_NAME}: expected {len(groups)} min_lrs (one per "
                                     f"parameter group), got {len(min_lr)}")
            self.default_min_lr = None
            self.min_lrs = [_number(_NAME, "min_lr", m) for m in min_lr]
        else:
            self.default_min_lr = _number(_NAME, "min_lr", min_lr)
            self.min_lrs = [self.default_min_lr] * len(groups)
        if any(m < 0 for m in self.min_lrs):
            raise SchedulerError(f"{_NAME}: min_lr must be >= 0, got {min_lr!r}")
        self.optimizer = optimizer
        self.factor = factor
        self.patience = _count("patience", patience)
        self.cooldown = _count("cooldown", cooldown)
        self.eps = _number(_NAME, "eps", eps)
        self.threshold = _number(_NAME, "threshold", threshold)
        self.mode, self.threshold_mode = mode, threshold_mode
        self.mode_worse = math.inf if mode == "min" else -math.inf
        self.last_epoch = 0
        self._last_lr = [group["lr"] for group in groups]
        self.best = self.mode_worse
        self.cooldown_counter = 0
        self.num_bad_epochs = 0

    @property
    def in_cooldown(self) -> bool:
        return self.cooldown_counter > 0

    def is_better(self, a: float, best: float) -> bool:
        """Whether metric ``a`` improves on ``best`` by the threshold."""
        if self.mode == "min":
            return a < (best * (1.0 - self.threshold) if self.threshold_mode == "rel"
                        else best - self.threshold)
        return a > (best * (self.threshold + 1.0) if self.threshold_mode == "rel"
                    else best + self.threshold)

    def step(self, metrics, epoch: int | None = None) -> None:
        """Count ``metrics`` (a number, or a one-element tensor) and reduce the learning rates
        once it has not improved for more than ``patience`` steps."""
        try:
            current = float(metrics)
        except (TypeError, ValueError):
            raise SchedulerError(f"{_NAME}.step: metrics must be a number (the value watched, "
                                 f"a validation loss), got {type(metrics).__name__}") from None
        epoch = self.last_epoch + 1 if epoch is None else _last_epoch(f"{_NAME}.step", epoch)
        if len(self.optimizer.param_groups) != len(self.min_lrs) and self.default_min_lr is None:
            # Checked before anything changes (PyTorch raises the same at the reduction).
            raise SchedulerError(
                f"{_NAME}.step: the optimizer has {len(self.optimizer.param_groups)} parameter "
                f"groups, min_lr gave {len(self.min_lrs)} (a group was added with "
                f"add_param_group); set scheduler.min_lrs to one value per group")
        self.last_epoch = epoch
        if self.is_better(current, self.best):
            self.best = current
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs += 1
        if self.in_cooldown:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0          # bad epochs in the cooldown do not count
        if self.num_bad_epochs > self.patience:
            self._reduce_lr()
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        self._last_lr = self._group_lrs()

    def _reduce_lr(self) -> None:
        groups = self.optimizer.param_groups
        if len(groups) != len(self.min_lrs):
            self.min_lrs = [self.default_min_lr] * len(groups)
        for group, low in zip(groups, self.min_lrs):
            old = float(group["lr"])
            new = max(old * self.factor, low)
            if old - new > self.eps:
                group["lr"] = new

    # -- state dicts -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The counters, the best metric and the options (PyTorch's keys), JSON-able (an
        infinite ``best`` is JSON's ``Infinity``)."""
        state = {key: getattr(self, key) for key in self._STATE}
        state["min_lrs"] = list(self.min_lrs)
        state["_last_lr"] = list(self._last_lr)
        return state

    def _check_state(self, state_dict: dict[str, Any]) -> None:
        name = f"{_NAME}.load_state_dict"
        if not isinstance(state_dict, dict):
            raise SchedulerError(f"{name}: expected a dict, got {type(state_dict).__name__}")
        if set(state_dict) != set(self._STATE):
            raise SchedulerError(f"{name}: the state has keys {sorted(state_dict)}, {_NAME} "
                                 f"has {sorted(self._STATE)} (a state of another scheduler?)")
        _check_last_lr(name, self, state_dict["_last_lr"])
        if not isinstance(state_dict["min_lrs"], list):
            raise SchedulerError(f"{name}: min_lrs must be a list, got "
                                 f"{state_dict['min_lrs']!r}")
        if state_dict["mode"] not in ("min", "max") or state_dict["threshold_mode"] not in (
                "rel", "abs"):
            raise SchedulerError(f"{name}: mode {state_dict['mode']!r} / threshold_mode "
                                 f"{state_dict['threshold_mode']!r} unknown")
        for key in ("last_epoch", "patience", "cooldown", "cooldown_counter", "num_bad_epochs"):
            if isinstance(state_dict[key], bool) or not isinstance(state_dict[key], int):
                raise SchedulerError(f"{name}: {key} must be an int, got {state_dict[key]!r}")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a ``state_dict()``; one of another scheduler raises ``SchedulerError`` and
        changes nothing."""
        self._check_state(state_dict)
        for key in self._STATE:
            value = state_dict[key]
            setattr(self, key, list(value) if isinstance(value, list) else value)

    def __repr__(self) -> str:
        return (f"{_NAME}(mode={self.mode!r}, factor={self.factor!r}, patience={self.patience!r}"
                f", threshold={self.threshold!r}, threshold_mode={self.threshold_mode!r}, "
                f"cooldown={self.cooldown!r}, min_lrs={self.min_lrs!r}, eps={self.eps!r}, "
                f"best={self.best!r}, num_bad_epochs={self.num_bad_epochs!r})")
