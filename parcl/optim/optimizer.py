"""The base of every optimizer: parameter groups, per-parameter state, validation before any
launch, state dicts, and the flat-bucket interface (``FlatBucket``, ``prepare``/``launch``,
``StepPlan``) that steps a whole bucket of parameters with one kernel. The update rules
themselves are in ``rules.py``; see the package docstring.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import recorder
from ..errors import ShapeError
from ..tape.changes import changed
from ..tape.mode import enable_grad
from ..tape.node import Node, host_copy
from ..tensor import FLOAT, Tensor
from .checks import (OptimizerError, _as_index, _checked_group, _nonneg, _once, _ordered,
                     _real)

__all__ = ["FlatBucket", "Optimizer", "OptimizerError", "StepPlan"]


def _replicable(update):
    """Marks an ``_update`` that passes a bucket's ``Replicated`` target to its kernel; a
    subclass that overrides ``_update`` without it is stepped bucket by bucket as usual."""
    update.replicable = True
    return update


class FlatBucket:
    """Parameters packed into one flat buffer: ``value`` and ``grad`` are flat float32 tensors
    that each parameter's ``.value`` and ``.grad`` view at its element offset. While every
    parameter's ``.grad`` is still its view (``grad_views``), an optimizer may update the whole
    bucket with one kernel (``Optimizer.prepare``)."""

    __slots__ = ("value", "grad", "params", "offsets", "grad_views")

    def __init__(self, value: Tensor, grad: Tensor, params: list, offsets: list[int]):
        self.value, self.grad, self.params, self.offsets = value, grad, params, offsets
        self.grad_views = [p.grad for p in params]


class Optimizer:
    """Base class: parameter groups, per-parameter state, ``zero_grad``, state dicts.

    ``params`` is an iterable of Parameters (leaf ``tp.Node``s), or of dicts ``{"params":
    [...], "lr": ...}`` (parameter groups with their own options). A parameter with no
    gradient (frozen, or not reached by the backward) is skipped by ``step``, as PyTorch's.
    """

    #: option name -> validator; subclasses fill it (the order is the state dict's)
    options: dict[str, Any] = {}
    #: per-parameter state: tensors always present, tensors that may be absent (created by
    #: the first update), and whether it counts steps
    state_tensors: tuple[str, ...] = ()
    optional_tensors: tuple[str, ...] = ()
    has_step = False
    #: per-parameter host numbers besides ``step`` that each update changes (NAdam's
    #: ``mu_product``), saved as plain numbers; a whole bucket's are its parameters'
    state_scalars: tuple[str, ...] = ()
    #: PyTorch's group options this rule does not keep: name -> the values that mean what
    #: parcl does (``load_state_dict`` drops them, and refuses any other value)
    torch_options: dict[str, tuple] = {
        "foreach": (None, True, False), "fused": (None, True, False),
        "capturable": (True, False), "differentiable": (False,), "maximize": (False,)}

    def __init__(self, params, defaults: dict[str, Any]):
        defaults = self._validate_options(defaults)
        self._check_combination(defaults)
        _ordered(type(self).__name__, params)
        params = list(params) if not isinstance(params, Node) else [params]
        if not params:
            raise OptimizerError(f"{type(self).__name__} got an empty parameter list")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        self.param_groups: list[dict[str, Any]] = []
        #: the groups' learning rates when the first scheduler was attached (PyTorch keeps
        #: them as ``param_group["initial_lr"]``; see ``parcl.lr_scheduler``)
        self.initial_lrs: list[float] | None = None
        self.state: dict[Node, dict[str, Any]] = {}
        self._flat: dict[int, tuple] = {}        # id(bucket) -> (flat state, per-param views)
        self._buckets: dict[int, FlatBucket] = {}   # keeps each id above meaning its bucket
        #: the options a group added without them gets (PyTorch's ``optimizer.defaults``)
        self.defaults: dict[str, Any] = defaults
        seen: set[int] = set()
        for group in groups:
            self.param_groups.append(self._make_group(group, seen))

    def _make_group(self, group, seen: set[int]) -> dict[str, Any]:
        """``group`` checked and completed from ``defaults``; its parameters' ids join
        ``seen`` (one already there is refused)."""
        plist, opts, ids = _checked_group(type(self).__name__, group, self.defaults, seen)
        opts = self._validate_options({**self.defaults, **opts})
        self._check_combination(opts)
        seen |= ids
        return {"params": plist, **opts}

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a parameter group, as PyTorch's: options it does not give are taken from the
        constructor's (``defaults``); a parameter already in a group is an
        ``OptimizerError``; everything is checked before the group is added. Its parameters
        come after every existing one in ``state_dict()``'s numbering, so a state dict saved
        before no longer fits (``load_state_dict`` refuses it). A scheduler made before steps
        the new group as PyTorch's does (recursively, or not at all: a ``SchedulerError``);
        make schedulers after adding groups. A bucket of a ``ReplicaGroup`` whose parameters
        end up in groups with different options, or whose states differ (Adam's step counts:
        the new group's start later), is stepped parameter by parameter.

        >>> opt = pc.optim.SGD(head.parameters(), lr=0.1)       # doctest: +SKIP
        >>> opt.add_param_group({"params": body.parameters(), "lr": 0.01})  # doctest: +SKIP
        """
        if not isinstance(param_group, dict):
            raise TypeError(f"{type(self).__name__}.add_param_group: param_group must be a "
                            f"dict, got {type(param_group).__name__}")
        seen = {id(p) for p in self._params()}
        self.param_groups.append(self._make_group(param_group, seen))

    # -- options -------------------------------------------------------------------------
    def _validate_options(self, opts: dict[str, Any], *, made: bool = True) -> dict[str, Any]:
        """``opts`` checked and converted. A learning rate must be >= 0 where a group is
        ``made`` (constructor, add_param_group), as PyTorch checks it; a step and a loaded state
        take one of any sign, as PyTorch's: a schedule's rounding ends LinearLR's decay to
        end_factor=0 at -1.5e-18, in PyTorch too."""
        out = {}
        for name, check in self.options.items():
            out[name] = _real(name, opts[name]) if name == "lr" and not made else check(opts[name])
        return out

    def _check_combination(self, opts: dict[str, Any]) -> None:
        """Refuse options that do not go together, where PyTorch does: when a group is made.
        A step or a loaded state takes them as they come, as PyTorch's: a scheduler may move
        a group through such a combination (CyclicLR's momentum through 0 under nesterov)."""

    @property
    def lr(self) -> float:
        """The learning rate of the first group; setting it sets every group's."""
        return self.param_groups[0]["lr"]

    @lr.setter
    def lr(self, value: float) -> None:
        value = _nonneg("lr", value)
        for group in self.param_groups:
            group["lr"] = value

    def _params(self) -> list[Node]:
        return [p for g in self.param_groups for p in g["params"]]

    # -- stepping ------------------------------------------------------------------------
    def step(self, closure=None):
        """One update of every parameter that has a ``.grad``; returns ``closure()`` if
        given (called first, with grad mode on, as PyTorch does: a step under ``no_grad``
        still records the closure's forward for its backward)."""
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        self.launch(self.prepare())
        return loss

    def prepare(self, buckets: list[FlatBucket] = ()) -> StepPlan:
        """Validate every parameter that has a gradient and allocate missing state; launches
        nothing, so a failure here leaves parameters and state as they were. A bucket of
        ``buckets`` whose parameters are all stepped with the same options, still with their
        ``.grad`` views, is planned as one update of the whole bucket (``plan.whole``); its
        state is kept flat too, each parameter's state entries viewing it."""
        work = []
        for i, group in enumerate(self.param_groups):
            # PyTorch's options this rule does not keep, set on a group by hand
            # (group["maximize"] = True): PyTorch's step reads them, this one would not
            self._without_torch_options(f"{type(self).__name__}.step", i, group)
            opts = self._validate_options(group, made=False)   # set by hand, or a schedule
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                for check in g.checks:      # a failed backward's contributions (tape.hold_back)
                    check()
                if tuple(g.shape) != tuple(p.shape) or g.dtype != FLOAT:
                    raise ShapeError(f"{type(self).__name__}.step: parameter of shape "
                                     f"{p.shape} has a gradient of shape {g.shape} "
                                     f"({g.dtype}); nothing was updated")
                work.append((p, opts))
        fused, work = self._fusable(work, buckets)
        # Allocate every missing state tensor before any parameter is touched.
        staged = [(p, opts, self._allocate(p, self.state.get(p, {}), opts)) for p, opts in work]
        flat_staged = [(b, opts, self._flat_state(b, opts, viewing))
                       for b, opts, viewing in fused]
        return StepPlan(staged, flat_staged)

    @property
    def plannable(self) -> bool:
        """Whether ``step()`` is ``launch(prepare())`` (a subclass did not override it), so
        that a caller may prepare and launch a step itself."""
        return type(self).step is Optimizer.step

    @property
    def replicable(self) -> bool:
        """Whether ``launch`` can run whole buckets' updates on ``Replicated`` targets."""
        return self.plannable and getattr(type(self)._update, "replicable", False)

    def launch(self, plan: StepPlan, targets=None) -> None:
        """Enqueue the updates of a prepared step. ``targets(bucket)`` (only where
        ``replicable``) gives a whole bucket's ``parcl.kernels.optim.Replicated``: its update
        then sums several gradient copies and writes several value copies, run in chunks on
        several queues (the fused end of a data-parallel step)."""
        # Its scalars (lr, Adam's bias corrections, momentum's first step) come from the host
        # and change from call to call: a replay would repeat this call's.
        recorder.unsafe(f"an optimizer step ({type(self).__name__}): its learning rate and "
                        "state change from call to call; step the optimizer outside the "
                        "captured function")
        for p, opts, fresh in plan.single:
            state = self.state.setdefault(p, {})
            state.update(fresh)
            self._update(p, p.grad, state, opts, fresh)
        changed(p for p, _, _ in plan.single)
        for b, opts, (state, fresh) in plan.whole:
            self._keep_flat(b, state, fresh)
            flat = _FlatParam(b.value, targets(b) if targets is not None else None)
            self._update(flat, b.grad, state, opts, fresh)
            changed(b.params)
            scalars = ("step",) * self.has_step + self.state_scalars
            if scalars:
                for p in b.params:
                    self.state[p].update({k: state[k] for k in scalars})

    # -- whole buckets: one kernel per flat parameter bucket -------------------------------
    # When every parameter of a bucket is stepped with the same options (one group's, or
    # several groups' alike) and their states agree, the whole bucket is updated by one
    # kernel over the optimizer's own flat state; the per-parameter state entries are views
    # into it, so state_dict() and the per-parameter path see the same values. States made
    # elsewhere (a loaded state dict, the per-parameter path) are copied into a new flat
    # state, so a resumed run steps as fast as one that never stopped.
    def _fusable(self, work, buckets):
        home = {id(p): b for b in buckets for p in b.params}
        grouped: dict[int, list] = {}
        single = []
        for p, opts in work:
            b = home.get(id(p))
            if b is None:
                single.append((p, opts))
            else:
                grouped.setdefault(id(b), [b, opts, []])[2].append((p, opts))
        fused = []
        for b, opts, members in grouped.values():
            if (len(members) == len(b.params) and all(o == opts for _, o in members)
                    and all(p.grad is v for p, v in zip(b.params, b.grad_views))):
                # in the steady state the kept flat state's views: they agree, so tested first
                flat = self._flat.get(id(b))
                viewing = flat is not None and self._viewing(b, flat)
                if viewing or self._states_agree(b):
                    fused.append((b, opts, viewing))
                    continue
            single.extend(members)
        return fused, single

    def _states_agree(self, b) -> bool:
        """Every parameter of ``b`` has the same state entries and the same numbers (step
        counts, NAdam's ``mu_product``): one update of the whole bucket is each one's. A
        parameter stepped fewer times (frozen for a while) keeps ``b`` per parameter."""
        states = [self.state.get(p, {}) for p in b.params]
        first = states[0]
        numbers = {k: v for k, v in first.items() if not isinstance(v, Tensor)}
        return all(s.keys() == first.keys()
                   and all(s[k] == v for k, v in numbers.items()) for s in states[1:])

    def _flat_state(self, b, opts, viewing: bool):
        """(flat state, fresh entries) of bucket ``b``, the fresh ones (first use) allocated but
        not kept yet: ``launch`` keeps them (``_keep_flat``), so a plan prepared and dropped
        (a failed step, or a step that ends another way) changes no state. Where the
        parameters' state is not the kept flat state's views (not ``viewing``), the flat
        state is a new copy of it (kept by ``launch`` too)."""
        state = self._flat[id(b)][0] if viewing else self._gathered(b)
        return state, self._allocate(_FlatParam(b.value), state, opts)

    def _viewing(self, b, flat) -> bool:
        """Whether every parameter's state is ``flat``'s (``b``'s kept flat state): its
        entries are the flat state's views and numbers, no others."""
        state, views = flat
        numbers = [(k, v) for k, v in state.items() if not isinstance(v, Tensor)]
        # plain loops, no sets or generators: run at every step for every parameter
        for p in b.params:
            mine = self.state.get(p, {})
            if len(mine) != len(views[p]) + len(numbers):   # with each one below: same keys
                return False
            for k, v in views[p].items():
                if mine.get(k) is not v:
                    return False
            for k, v in numbers:
                if k not in mine or mine[k] != v:
                    return False
        return True

    def _gathered(self, b) -> dict[str, Any]:
        """A new flat state of bucket ``b`` holding its parameters' state (agreeing:
        ``_states_agree``), each tensor entry copied to the parameter's offset; zeros between
        parameters, as a flat state kept from the first step holds there."""
        first = self.state.get(b.params[0], {})
        state = {k: v for k, v in first.items() if not isinstance(v, Tensor)}
        for name in (k for k, v in first.items() if isinstance(v, Tensor)):
            flat = state[name] = Tensor.zeros(b.value.queue, b.value.shape)
            for p, off in zip(b.params, b.offsets):
                sub = flat.data.get_sub_region(off * 4, p.value.size * 4)
                flat.view_of(sub, p.shape).copy_owned(self.state[p][name])
        return state

    def _keep_flat(self, b, state, fresh) -> None:
        """Keep bucket ``b``'s flat state with its fresh entries, each parameter's state
        entries viewing it."""
        flat = self._flat.get(id(b))
        kept = flat is not None and flat[0] is state
        if kept and not fresh:
            return
        views = flat[1] if kept else {p: {} for p in b.params}
        state.update(fresh)
        new = fresh if kept else state
        for name, t in new.items():
            if not isinstance(t, Tensor):
                continue
            for p, off in zip(b.params, b.offsets):
                sub = t.data.get_sub_region(off * 4, p.value.size * 4)
                views[p][name] = t.view_of(sub, p.shape)
        for p in b.params:
            entry = self.state.setdefault(p, {})
            entry.update({k: v for k, v in new.items() if not isinstance(v, Tensor)})
            entry.update(views[p])
        self._flat[id(b)] = (state, views)
        self._buckets[id(b)] = b

    def _allocate(self, p: Node, state: dict[str, Any], opts: dict[str, Any]
                  ) -> dict[str, Any]:
        """The state entries ``p`` still lacks before this step (zero-initialised)."""
        fresh: dict[str, Any] = {}
        if self.has_step and "step" not in state:
            fresh["step"] = 0
        for name in self.state_tensors:
            if state.get(name) is None:
                fresh[name] = Tensor.zeros(p.value.queue, p.shape)
        return fresh

    def _update(self, p: Node, grad: Tensor, state: dict[str, Any], opts: dict[str, Any],
                fresh: dict[str, Any]) -> None:
        raise NotImplementedError

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop every parameter's ``.grad`` (``set_to_none``), or fill it with zeros."""
        for p in self._params():
            p.zero_grad(set_to_none)

    # -- state dicts ---------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """PyTorch's layout: ``{"state": {index: {...}}, "param_groups": [{options...,
        "params": [indices]}]}``; arrays are numpy host copies. Once a scheduler was
        attached each group also holds its ``initial_lr`` (``initial_lrs``), as PyTorch's."""
        index = {id(p): i for i, p in enumerate(self._params())}
        state = {}
        for i, p in enumerate(self._params()):
            entry = {k: (v.to_host() if isinstance(v, Tensor) else v)
                     for k, v in self.state.get(p, {}).items() if v is not None}
            if entry:
                state[i] = entry
        groups = []
        initial = self.initial_lrs or []
        for i, g in enumerate(self.param_groups):
            opts = {k: (list(v) if isinstance(v, tuple) else v)
                    for k, v in g.items() if k != "params"}
            if i < len(initial):     # a group added after the scheduler has none (PyTorch)
                opts["initial_lr"] = float(initial[i])
            groups.append({**opts, "params": [index[id(p)] for p in g["params"]]})
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore options, per-parameter state and the groups' ``initial_lr`` (a scheduler
        made after this starts from them, as PyTorch's); everything is validated first and a
        mismatch raises ``OptimizerError`` leaving the optimizer unchanged."""
        name = f"{type(self).__name__}.load_state_dict"
        if not isinstance(state_dict, dict) or "param_groups" not in state_dict:
            raise OptimizerError(f"{name}: expected a dict with 'state' and 'param_groups'")
        groups = state_dict["param_groups"]
        if not isinstance(groups, (list, tuple)) or len(groups) != len(self.param_groups):
            raise OptimizerError(f"{name}: {len(groups) if isinstance(groups, list) else '?'} "
                                 f"param_groups given, the optimizer has "
                                 f"{len(self.param_groups)}")
        new_opts, new_initial = [], []
        for i, (saved, mine) in enumerate(zip(groups, self.param_groups)):
            if not isinstance(saved, dict):
                raise OptimizerError(f"{name}: param_groups[{i}] is not a dict")
            if len(saved.get("params", ())) != len(mine["params"]):
                raise OptimizerError(f"{name}: param_groups[{i}] has "
                                     f"{len(saved.get('params', ()))} parameters, the "
                                     f"optimizer's has {len(mine['params'])}")
            saved = self._without_torch_options(name, i, saved)
            keys = set(saved) - {"params", "initial_lr"}
            if keys != set(self.options):
                raise OptimizerError(f"{name}: param_groups[{i}] has options {sorted(keys)}, "
                                     f"{type(self).__name__} has {sorted(self.options)}")
            try:
                new_opts.append(self._validate_options(saved, made=False))
                if "initial_lr" in saved:
                    if len(new_initial) < i:    # only groups added after a scheduler lack it
                        raise OptimizerError(f"initial_lr given, but param_groups[{i - 1}] "
                                             f"has none")
                    new_initial.append(_nonneg("initial_lr", saved["initial_lr"]))
            except OptimizerError as e:
                raise OptimizerError(f"{name}: param_groups[{i}]: {e}") from None
        # Saved indices may be named differently from ours (another optimizer's numbering);
        # map them positionally, group by group, as PyTorch does.
        id_map = {}
        for saved, mine in zip(groups, self.param_groups):
            for idx, p in zip(saved["params"], mine["params"]):
                id_map[_once(name, "param_groups", idx, id_map)] = p
        state_in = state_dict.get("state", {})
        if not isinstance(state_in, dict):
            raise OptimizerError(f"{name}: 'state' must be a dict index -> entry")
        staged: dict[Node, dict[str, Any]] = {}
        keys: set[int] = set()
        for key, entry in state_in.items():
            keys.add(_once(name, "state", key, keys))
            p = id_map.get(_as_index(name, key))
            if p is None:
                raise OptimizerError(f"{name}: state for parameter {key!r}, which no "
                                     f"param_group lists")
            staged[p] = self._check_entry(name, key, entry, p)
        # All checked: upload into fresh tensors, then swap in.
        new_state = {}
        for p, entry in staged.items():
            s = {}
            for k, v in entry.items():
                s[k] = Tensor.from_host(p.value.queue, v) if isinstance(v, np.ndarray) else v
            new_state[p] = s
        for group, opts in zip(self.param_groups, new_opts):
            group.update(opts)
        self.initial_lrs = new_initial or None     # the saved groups', as PyTorch replaces them
        self.state = new_state
        self._flat, self._buckets = {}, {}         # fresh per-parameter state: no flat views

    @classmethod
    def _accept_torch_options(cls, **given) -> None:
        """A constructor's PyTorch-only arguments (``amsgrad``, ``foreach``, ...): each must
        have a value that means what parcl does (``torch_options``), else an
        ``OptimizerError``; nothing is kept."""
        cls._refuse_other_torch_options(f"{cls.__name__}", given)

    @classmethod
    def _refuse_other_torch_options(cls, where: str, given: dict) -> None:
        for k, v in given.items():
            allowed = cls.torch_options[k]
            if not any(v is a or (type(v) is type(a) and v == a)
                       or (isinstance(v, np.bool_) and isinstance(a, bool) and bool(v) is a)
                       for a in allowed):
                raise OptimizerError(f"{where} has PyTorch's {k}={v!r}, which {cls.__name__} "
                                     f"does not do (it takes "
                                     f"{' or '.join(repr(a) for a in allowed)})")

    def _without_torch_options(self, name: str, i: int, saved: dict) -> dict:
        """``saved`` (a group of a state dict) without PyTorch's options this rule does not
        keep (``torch_options``): accepted where their value is what parcl does (``foreach``,
        ``fused``, ``capturable`` change only how PyTorch runs a step), else an
        ``OptimizerError`` naming the option."""
        extra = {k: v for k, v in saved.items()
                 if k in self.torch_options and k not in self.options}
        self._refuse_other_torch_options(f"{name}: param_groups[{i}]", extra)
        return {k: v for k, v in saved.items() if k not in extra}

    def _check_entry(self, name: str, key, entry, p: Node) -> dict[str, Any]:
        cls = type(self).__name__
        if not isinstance(entry, dict):
            raise OptimizerError(f"{name}: state[{key!r}] is not a dict")
        entry = {k: v for k, v in entry.items() if v is not None}
        required = (set(self.state_tensors) | set(self.state_scalars)
                    | ({"step"} if self.has_step else set()))
        allowed = required | set(self.optional_tensors)
        if not required <= set(entry) <= allowed:
            raise OptimizerError(f"{name}: state[{key!r}] has entries {sorted(entry)}, {cls} "
                                 f"keeps {sorted(required)}"
                                 + (f" and optionally {sorted(self.optional_tensors)}"
                                    if self.optional_tensors else ""))
        out: dict[str, Any] = {}
        if self.has_step:
            step = entry["step"]
            if not isinstance(step, (int, float, np.ndarray)) and hasattr(step, "numel"):
                step = np.asarray(step)          # PyTorch's 0-d step tensor (a torch state)
            if isinstance(step, np.ndarray) and step.size == 1:
                step = step.item()
            if isinstance(step, float) and step.is_integer():
                step = int(step)
            if not isinstance(step, (int, np.integer)) or isinstance(step, bool) or step < 0:
                raise OptimizerError(f"{name}: state[{key!r}]['step'] must be an int >= 0, "
                                     f"got {step!r}")
            out["step"] = int(step)
        for k in self.state_scalars:
            out[k] = _scalar(name, key, k, entry[k])
        order = list(self.state_tensors) + list(self.optional_tensors)   # not a set's order
        for t in sorted(set(entry) - {"step", *self.state_scalars}, key=order.index):
            try:
                v = host_copy(entry[t], np.float32)
            except (TypeError, ValueError):
                raise OptimizerError(f"{name}: state[{key!r}][{t!r}] is not a numeric "
                                     f"array") from None
            if v.shape != tuple(p.shape):
                raise OptimizerError(f"{name}: state[{key!r}][{t!r}] has shape {v.shape}, "
                                     f"the parameter's is {tuple(p.shape)}")
            out[t] = v
        return out

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, g in enumerate(self.param_groups):
            opts = ", ".join(f"{k}={v}" for k, v in g.items() if k != "params")
            lines.append(f"  group {i}: {len(g['params'])} params, {opts}")
        return "\n".join(lines) + "\n)"


def _scalar(name: str, key, k: str, value) -> float:
    """A saved per-parameter number (a float, or PyTorch's 0-d tensor) as a finite float."""
    try:
        v = float(np.asarray(value, np.float64).reshape(()))
    except (TypeError, ValueError):
        v = None
    if v is None or not np.isfinite(v) or isinstance(value, bool):
        raise OptimizerError(f"{name}: state[{key!r}][{k!r}] must be a finite number, got "
                             f"{value!r}")
    return v


class StepPlan:
    """A validated step (``Optimizer.prepare``): ``single``, per-parameter updates; ``whole``,
    whole flat buckets, each with its options and flat state; ``launch`` enqueues both."""

    __slots__ = ("single", "whole")

    def __init__(self, single: list, whole: list):
        self.single, self.whole = single, whole


class _FlatParam:
    """A whole flat parameter bucket, shaped like one parameter for ``_update``/``_allocate``;
    ``target`` is its ``Replicated`` end of a data-parallel step, if any."""

    __slots__ = ("value", "shape", "target")

    def __init__(self, value: Tensor, target=None):
        self.value = value
        self.shape = value.shape
        self.target = target


def _target(p):
    return p.target if isinstance(p, _FlatParam) else None
