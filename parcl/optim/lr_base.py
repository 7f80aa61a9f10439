"""The base of the learning-rate schedulers (``pc.optim.lr_scheduler``): ``LRScheduler``
(``step()``, ``get_last_lr()``, JSON-able state dicts) and ``SchedulerError``. The schedules
themselves are in ``lr_scheduler.py`` (one learning rate per step), ``lr_compose.py``
(schedulers of schedulers), ``lr_onecycle.py``, ``lr_cyclic.py`` (``CyclicLR``,
``CosineAnnealingWarmRestarts``) and ``lr_plateau.py`` (``ReduceLROnPlateau``)."""

from __future__ import annotations

import math
from typing import Any

from ..errors import ParclError

__all__ = ["LRScheduler", "SchedulerError"]


class SchedulerError(ParclError, ValueError):
    """Bad scheduler options, or a state dict that does not fit the scheduler."""


class LRScheduler:
    """Base class: ``step()``, ``get_last_lr()``, state dicts. Subclasses define ``get_lr()``
    (the next learning rates, read after ``last_epoch`` was advanced) and, where PyTorch has
    one, ``_closed_form()`` (used by ``SequentialLR`` at a milestone)."""

    #: the subclass's own options, part of its state dict
    _fields: tuple[str, ...] = ()

    def __init__(self, optimizer: Any, last_epoch: int = -1):
        groups = _param_groups(type(self).__name__, optimizer)
        last_epoch = _last_epoch(type(self).__name__, last_epoch)
        self.optimizer = optimizer
        if last_epoch == -1:
            initial = getattr(optimizer, "initial_lrs", None)
            if initial is None:
                optimizer.initial_lrs = [float(g["lr"]) for g in groups]
            elif len(initial) < len(groups):
                # Groups added since (add_param_group) start from their own learning rates,
                # as PyTorch's group.setdefault("initial_lr", group["lr"]) does.
                optimizer.initial_lrs = list(initial) + [float(g["lr"])
                                                         for g in groups[len(initial):]]
        elif getattr(optimizer, "initial_lrs", None) is None:
            raise SchedulerError(f"{type(self).__name__}: last_epoch={last_epoch} resumes a "
                                 f"schedule, but no scheduler set the optimizer's initial_lrs; "
                                 f"construct with last_epoch=-1 and load_state_dict instead")
        self.base_lrs: list[float] = list(optimizer.initial_lrs)
        self.last_epoch = last_epoch
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
        self._apply(values)

    def _apply(self, values: list[float]) -> None:
        """Write ``values`` (one learning rate per parameter group) into the optimizer."""
        groups = self.optimizer.param_groups
        if len(values) != len(groups):
            # PyTorch's zip(..., strict=True) raises here too; a plain zip would leave a group
            # added by add_param_group at a learning rate no schedule sets, silently.
            raise SchedulerError(
                f"{type(self).__name__}.step: the schedule gives {len(values)} learning rates, "
                f"the optimizer has {len(groups)} parameter groups (one was added with "
                f"add_param_group after this scheduler was made, and this schedule computes "
                f"from its base_lrs, one per group it was made with); make the scheduler "
                f"after add_param_group")
        for group, lr in zip(groups, values):
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
        for name in self._fields:            # copies: a saved state must not follow the schedule
            value = getattr(self, name)
            state[name] = list(value) if isinstance(value, list) else value
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
        base = state_dict["base_lrs"]
        if not isinstance(base, list) or len(base) != len(mine["base_lrs"]):
            raise SchedulerError(f"{name}: base_lrs {base!r} does not fit the optimizer's "
                                 f"{len(mine['base_lrs'])} parameter groups")
        _check_last_lr(name, self, state_dict["_last_lr"])
        if not isinstance(state_dict["last_epoch"], int):
            raise SchedulerError(f"{name}: last_epoch must be an int, got "
                                 f"{state_dict['last_epoch']!r}")

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={getattr(self, k)!r}" for k in self._fields if k[0] != "_")
        return f"{type(self).__name__}({opts}{', ' if opts else ''}last_epoch={self.last_epoch})"


def _check_last_lr(name: str, scheduler: LRScheduler, value) -> None:
    """A saved ``_last_lr`` has one rate per group the optimizer had at the save: as many as
    the scheduler's own, or, where a group was added since it was made (add_param_group,
    which a recursive schedule steps along, as PyTorch's), as many as the optimizer has."""
    fits = {len(scheduler._last_lr), len(scheduler.optimizer.param_groups)}
    if not isinstance(value, list) or len(value) not in fits:
        raise SchedulerError(f"{name}: _last_lr {value!r} does not fit the optimizer's "
                             f"{len(scheduler.optimizer.param_groups)} parameter groups")


def _param_groups(owner: str, optimizer: Any) -> list[dict[str, Any]]:
    """What a scheduler uses of an optimizer: its ``param_groups``, each with an ``"lr"``."""
    groups = getattr(optimizer, "param_groups", None)
    if not isinstance(groups, list) or not all(isinstance(g, dict) and "lr" in g
                                               for g in groups):
        raise TypeError(f"{owner}: {type(optimizer).__name__} is not an optimizer (no "
                        f"param_groups with an 'lr')")
    return groups


def _last_epoch(owner: str, value) -> int:
    """``last_epoch`` as an int; 3.0 is 3, but 2.5 is refused: int() would resume at step 2
    silently, where PyTorch keeps 2.5 and, its steps never again landing on an integer, never
    decays at all (StepLR), so neither reading resumes the run that was saved."""
    try:
        if isinstance(value, bool):
            raise TypeError
        out = int(value)
        if out != value:
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise SchedulerError(f"{owner}: last_epoch must be an int (the index of the last step "
                             f"taken, -1 for a new schedule), got {value!r}") from None
    return out


def _positive_int(owner: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SchedulerError(f"{owner}: {name} must be a positive int, got {value!r}")
    return value


def _number(owner: str, name: str, value) -> float:
    """``value`` as a float; a bool, a non-number, NaN or an infinity is refused."""
    try:
        if isinstance(value, bool):
            raise TypeError
        out = float(value)
    except (TypeError, ValueError):
        raise SchedulerError(f"{owner}: {name} must be a number, got {value!r}") from None
    if not math.isfinite(out):
        raise SchedulerError(f"{owner}: {name} must be finite, got {value!r}")
    return out


def _per_group(owner: str, name: str, value, groups: int, minimum: float | None = None
               ) -> list[float]:
    """One number per parameter group: ``value`` itself, or a list of one per group (each at
    least ``minimum`` when given)."""
    values = list(value) if isinstance(value, (list, tuple)) else [value] * groups
    if len(values) != groups:
        raise SchedulerError(f"{owner}: {name} has {len(values)} values, the optimizer has "
                             f"{groups} parameter groups (give one number, or one per group)")
    out = [_number(owner, name, v) for v in values]
    if minimum is not None and any(v < minimum for v in out):
        raise SchedulerError(f"{owner}: {name} must be >= {minimum:g}, got {value!r}")
    return out


class _CyclesMomentum:
    """For the schedulers that move the momentum against the learning rate (``OneCycleLR``,
    ``CyclicLR``): the momentum's bounds per group, and its setting in a group."""

    use_beta1 = False
    base_momentums = max_momentums = None

    def _momentum_bounds(self, optimizer, groups: list[dict[str, Any]], base_momentum,
                         max_momentum, minimum: float | None = None) -> None:
        """Check the optimizer has a momentum (SGD, RMSprop) or first beta (Adam) to cycle,
        and take the bounds; an optimizer with neither (Adagrad) is refused."""
        owner = type(self).__name__
        keys = getattr(optimizer, "defaults", None) or groups[0]
        if "momentum" not in keys and "betas" not in keys:
            raise SchedulerError(f"{owner}: cycle_momentum=True needs an optimizer with a "
                                 f"'momentum' (SGD, RMSprop) or 'betas' (Adam) option, "
                                 f"{type(optimizer).__name__} has neither; pass "
                                 f"cycle_momentum=False")
        self.use_beta1 = "betas" in keys
        self.max_momentums = _per_group(owner, "max_momentum", max_momentum, len(groups),
                                        minimum)
        self.base_momentums = _per_group(owner, "base_momentum", base_momentum, len(groups),
                                         minimum)

    def _set_momentum(self, group: dict[str, Any], value: float) -> None:
        if self.use_beta1:
            group["betas"] = (value, *group["betas"][1:])
        else:
            group["momentum"] = value
