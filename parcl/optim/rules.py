"""The update rules: ``SGD``, ``Adam``, ``AdamW``, ``RMSprop``, ``Adagrad``, each one fused
OpenCL kernel per parameter or flat bucket (``parcl.kernels.optim``), with PyTorch's documented
formulas.

>>> opt = pc.optim.AdamW(model.parameters(), lr=1e-3)
"""

from __future__ import annotations

import numpy as np

from ..kernels import optim as K
from ..tensor import Tensor
from .checks import _nonneg_option
from .optimizer import Optimizer, OptimizerError, _replicable, _target

__all__ = ["SGD", "Adagrad", "Adam", "AdamW", "RMSprop"]


def _betas(value) -> tuple[float, float]:
    try:
        b1, b2 = (float(b) for b in value)
    except (TypeError, ValueError):
        raise OptimizerError(f"betas must be a pair of floats, got {value!r}") from None
    for i, b in enumerate((b1, b2)):
        if not 0.0 <= b < 1.0:
            raise OptimizerError(f"invalid beta parameter at index {i}: {b} (must be in "
                                 "[0, 1))")
    return (b1, b2)


def _bool(value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise OptimizerError(f"expected a bool, got {value!r}")
    return bool(value)


class SGD(Optimizer):
    """Stochastic gradient descent, PyTorch's formula (dampening 0)::

        g = grad + weight_decay * p
        b = g (first step), else momentum * b + g          (when momentum != 0)
        g = g + momentum * b if nesterov else b            (when momentum != 0)
        p = p - lr * g

    >>> opt = pc.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    """

    options = {"lr": _nonneg_option("lr"), "momentum": _nonneg_option("momentum"),
               "weight_decay": _nonneg_option("weight_decay"), "nesterov": _bool}

    # PyTorch's argument order: dampening fourth (only 0 here, so SGD(ps, 0.1, 0.9, 0.5) is
    # refused rather than trained without it), weight_decay fifth, nesterov sixth.
    torch_options = {**Optimizer.torch_options, "dampening": (0, 0.0)}

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0,
                 weight_decay: float = 0.0, nesterov: bool = False, *,
                 maximize: bool = False, foreach: bool | None = None,
                 differentiable: bool = False, fused: bool | None = None):
        self._accept_torch_options(dampening=dampening, maximize=maximize, foreach=foreach,
                                   differentiable=differentiable, fused=fused)
        super().__init__(params, {"lr": lr, "momentum": momentum,
                                  "weight_decay": weight_decay, "nesterov": nesterov})

    def _check_combination(self, opts):
        if opts["nesterov"] and opts["momentum"] <= 0:
            raise OptimizerError("SGD: nesterov momentum requires momentum > 0")

    # PyTorch creates the momentum buffer as a copy of the first gradient: absent until then.
    optional_tensors = ("momentum_buffer",)

    @_replicable
    def _update(self, p, grad, state, opts, fresh):
        if opts["momentum"] == 0:
            K.sgd_(p.value, grad, opts["lr"], opts["weight_decay"], target=_target(p))
            return
        buf = state.get("momentum_buffer")
        K.sgd_momentum_(p.value, grad, buf, opts["lr"], opts["weight_decay"],
                        opts["momentum"], opts["nesterov"], "momentum_buffer" in fresh,
                        target=_target(p))

    def _allocate(self, p, state, opts):
        if opts["momentum"] != 0 and state.get("momentum_buffer") is None:
            return {"momentum_buffer": Tensor.empty(p.value.queue, p.shape)}
        return {}


class Adam(Optimizer):
    """Adam, PyTorch's formula (``t`` counts this parameter's steps from 1)::

        g = grad + weight_decay * p
        m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g^2
        p = p - lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)

    ``amsgrad=True`` keeps the largest ``v`` so far (``max_exp_avg_sq``) and divides by it
    instead. PyTorch's ``foreach``, ``capturable`` and ``fused`` are taken and change
    nothing; ``maximize`` and ``differentiable`` only False.

    >>> opt = pc.optim.Adam(model.parameters(), lr=1e-3)
    """

    options = {"lr": _nonneg_option("lr"), "betas": _betas, "eps": _nonneg_option("eps"),
               "weight_decay": _nonneg_option("weight_decay"), "amsgrad": _bool}
    state_tensors = ("exp_avg", "exp_avg_sq")
    # amsgrad's largest exp_avg_sq so far (PyTorch's name; zeros from the first step)
    optional_tensors = ("max_exp_avg_sq",)
    has_step = True
    decoupled = False

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False, *,
                 foreach: bool | None = None, maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False, fused: bool | None = None,
                 decoupled_weight_decay: bool = False):
        self._accept_torch_options(foreach=foreach, maximize=maximize,
                                   capturable=capturable, differentiable=differentiable,
                                   fused=fused)
        if _bool(decoupled_weight_decay):
            self.decoupled = True        # PyTorch's Adam(decoupled_weight_decay=True): AdamW
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps,
                                  "weight_decay": weight_decay, "amsgrad": amsgrad})

    def _allocate(self, p, state, opts):
        fresh = super()._allocate(p, state, opts)
        # zeros where amsgrad is first on (as PyTorch's, made with the other state)
        if opts["amsgrad"] and state.get("max_exp_avg_sq") is None:
            fresh["max_exp_avg_sq"] = Tensor.zeros(p.value.queue, p.shape)
        return fresh

    @_replicable
    def _update(self, p, grad, state, opts, fresh):
        step = state["step"] + 1
        wd = opts["weight_decay"]
        K.adam_(p.value, grad, state["exp_avg"], state["exp_avg_sq"], lr=opts["lr"],
                beta1=opts["betas"][0], beta2=opts["betas"][1], eps=opts["eps"], step=step,
                weight_decay=0.0 if self.decoupled else wd,
                decoupled_weight_decay=wd if self.decoupled else 0.0,
                max_exp_avg_sq=state["max_exp_avg_sq"] if opts["amsgrad"] else None,
                target=_target(p))
        state["step"] = step

    # Adam's and AdamW's states have the same entries; each group carries the rule it was
    # saved by (PyTorch's key), so one is not loaded into the other and trained on silently
    # with the other weight decay.
    _RULE = "decoupled_weight_decay"

    def _without_torch_options(self, name, i, saved):
        # PyTorch's Adam reads decoupled_weight_decay from each group at each step: a group
        # set to the other rule by hand would be trained with this optimizer's weight decay.
        rule = saved.get(self._RULE, self.decoupled)
        if bool(rule) != self.decoupled:
            raise OptimizerError(f"{name}: param_groups[{i}] has PyTorch's {self._RULE}="
                                 f"{rule!r}, which {type(self).__name__} does not do (it "
                                 f"takes {self.decoupled!r}); use "
                                 f"{'AdamW' if rule else 'Adam'} for that weight decay")
        return super()._without_torch_options(
            name, i, {k: v for k, v in saved.items() if k != self._RULE})

    def state_dict(self):
        sd = super().state_dict()
        for group in sd["param_groups"]:
            group[self._RULE] = self.decoupled
        return sd

    def load_state_dict(self, state_dict) -> None:
        """As ``Optimizer.load_state_dict``; a state saved by the other of Adam and AdamW
        (its groups' ``decoupled_weight_decay``) is refused. One saved without the flag
        loads as before."""
        groups = state_dict.get("param_groups") if isinstance(state_dict, dict) else None
        if not isinstance(groups, (list, tuple)):
            return super().load_state_dict(state_dict)
        plain = []
        for i, group in enumerate(groups):
            if isinstance(group, dict) and "amsgrad" not in group:
                group = {**group, "amsgrad": False}   # saved before amsgrad was an option
            if isinstance(group, dict) and self._RULE in group:
                if bool(group[self._RULE]) != self.decoupled:
                    name = type(self).__name__
                    raise OptimizerError(
                        f"{name}.load_state_dict: param_groups[{i}] was saved by "
                        f"{'AdamW' if group[self._RULE] else 'Adam'} ({self._RULE}="
                        f"{group[self._RULE]!r}), {name}'s weight decay is "
                        f"{'decoupled' if self.decoupled else 'an L2 term'}; load it "
                        f"into the optimizer that saved it")
                group = {k: v for k, v in group.items() if k != self._RULE}
            plain.append(group)
        super().load_state_dict({**state_dict, "param_groups": plain})


class AdamW(Adam):
    """Adam with decoupled weight decay (PyTorch's AdamW)::

        p = p * (1 - lr * weight_decay)
        then Adam's update of p without weight decay in the gradient

    >>> opt = pc.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    """

    decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01, amsgrad: bool = False, *,
                 foreach: bool | None = None, maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False, fused: bool | None = None):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad, foreach=foreach, maximize=maximize,
                         capturable=capturable, differentiable=differentiable, fused=fused)


class RMSprop(Optimizer):
    """RMSprop, PyTorch's formula (``alpha`` the smoothing constant)::

        g = grad + weight_decay * p
        v = alpha * v + (1 - alpha) * g^2                              (square_avg)
        a = alpha * a + (1 - alpha) * g;  d = sqrt(v - a^2) + eps      (centered: grad_avg)
        d = sqrt(v) + eps                                              (otherwise)
        b = momentum * b + g / d;  p = p - lr * b                      (momentum > 0)
        p = p - lr * g / d                                             (otherwise)

    Its state has PyTorch's names: ``step``, ``square_avg``, and ``momentum_buffer`` and
    ``grad_avg`` where the options use them (zeros at the first step, as PyTorch's).

    >>> opt = pc.optim.RMSprop(model.parameters(), lr=1e-2, momentum=0.9, centered=True)
    """

    options = {"lr": _nonneg_option("lr"), "alpha": _nonneg_option("alpha"),
               "eps": _nonneg_option("eps"), "weight_decay": _nonneg_option("weight_decay"),
               "momentum": _nonneg_option("momentum"), "centered": _bool}
    state_tensors = ("square_avg",)
    optional_tensors = ("momentum_buffer", "grad_avg")
    has_step = True

    def __init__(self, params, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False,
                 capturable: bool = False, foreach: bool | None = None,
                 maximize: bool = False, differentiable: bool = False):
        self._accept_torch_options(capturable=capturable, foreach=foreach, maximize=maximize,
                                   differentiable=differentiable)
        super().__init__(params, {"lr": lr, "alpha": alpha, "eps": eps,
                                  "weight_decay": weight_decay, "momentum": momentum,
                                  "centered": centered})

    def _allocate(self, p, state, opts):
        fresh = super()._allocate(p, state, opts)
        # Created when an option first needs them (momentum or centered set later, by hand
        # or by a scheduler cycling momentum), zero as PyTorch's would have been from the start.
        if opts["momentum"] > 0 and state.get("momentum_buffer") is None:
            fresh["momentum_buffer"] = Tensor.zeros(p.value.queue, p.shape)
        if opts["centered"] and state.get("grad_avg") is None:
            fresh["grad_avg"] = Tensor.zeros(p.value.queue, p.shape)
        return fresh

    @_replicable
    def _update(self, p, grad, state, opts, fresh):
        step = state["step"] + 1
        momentum = opts["momentum"]
        K.rmsprop_(p.value, grad, state["square_avg"], lr=opts["lr"], alpha=opts["alpha"],
                   eps=opts["eps"], weight_decay=opts["weight_decay"], momentum=momentum,
                   momentum_buffer=state["momentum_buffer"] if momentum > 0 else None,
                   grad_avg=state["grad_avg"] if opts["centered"] else None,
                   target=_target(p))
        state["step"] = step


class Adagrad(Optimizer):
    """Adagrad, PyTorch's formula (``t`` counts this parameter's steps from 1)::

        g = grad + weight_decay * p
        s = s + g^2                               (sum, from initial_accumulator_value)
        p = p - lr / (1 + (t - 1) * lr_decay) * g / (sqrt(s) + eps)

    Its state has PyTorch's names: ``step`` and ``sum``. PyTorch fills ``sum`` when the
    optimizer is made; here at a parameter's first step, from its group's
    ``initial_accumulator_value`` (the same, unless that was changed in between).

    >>> opt = pc.optim.Adagrad(model.parameters(), lr=1e-2)
    """

    options = {"lr": _nonneg_option("lr"), "lr_decay": _nonneg_option("lr_decay"),
               "weight_decay": _nonneg_option("weight_decay"),
               "initial_accumulator_value": _nonneg_option("initial_accumulator_value"),
               "eps": _nonneg_option("eps")}
    state_tensors = ("sum",)
    has_step = True

    def __init__(self, params, lr: float = 1e-2, lr_decay: float = 0.0,
                 weight_decay: float = 0.0, initial_accumulator_value: float = 0.0,
                 eps: float = 1e-10, foreach: bool | None = None, *, maximize: bool = False,
                 differentiable: bool = False, fused: bool | None = None):
        self._accept_torch_options(foreach=foreach, maximize=maximize,
                                   differentiable=differentiable, fused=fused)
        super().__init__(params, {"lr": lr, "lr_decay": lr_decay, "weight_decay": weight_decay,
                                  "initial_accumulator_value": initial_accumulator_value,
                                  "eps": eps})

    def _allocate(self, p, state, opts):
        fresh = {"step": 0} if "step" not in state else {}
        if state.get("sum") is None:
            fresh["sum"] = Tensor.full(p.value.queue, p.shape,
                                       opts["initial_accumulator_value"])
        return fresh

    @_replicable
    def _update(self, p, grad, state, opts, fresh):
        step = state["step"] + 1
        K.adagrad_(p.value, grad, state["sum"], lr=opts["lr"], lr_decay=opts["lr_decay"],
                   eps=opts["eps"], step=step, weight_decay=opts["weight_decay"],
                   target=_target(p))
        state["step"] = step
