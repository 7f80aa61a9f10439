"""More update rules, as ``torch.optim``'s: ``NAdam``, ``RAdam``, ``Adamax``, ``Adadelta``,
``Rprop``, ``ASGD``, each one fused OpenCL kernel per parameter or flat bucket
(``parcl.kernels.optim_more``), with PyTorch's formulas, defaults, option names and state
names.

Their constructors take PyTorch's ``maximize`` (ascend: the gradient's negation is used) and,
so that PyTorch code runs unchanged, ``foreach`` (None or a bool) and ``capturable``, which
change nothing here (every update is already one kernel per bucket, and a step never waits for
the device); ``differentiable=True`` (a step autograd could differentiate through) is refused:
the tape does not record optimizer steps.

>>> opt = pc.optim.NAdam(model.parameters(), lr=2e-3, decoupled_weight_decay=True)
"""

from __future__ import annotations

from ..kernels import optim_more as K
from ..tensor import Tensor
from .checks import _nonneg_option
from .optimizer import Optimizer, OptimizerError, _nonneg, _replicable, _target
from .rules import _betas, _bool

__all__ = ["ASGD", "Adadelta", "Adamax", "NAdam", "RAdam", "Rprop"]


def _foreach(value):
    if value is not None:
        return _bool(value)
    return None


def _differentiable(value) -> bool:
    if _bool(value):
        raise OptimizerError("differentiable=True is not supported: parcl's optimizer steps "
                             "are OpenCL kernels that the tape does not record, so no gradient "
                             "flows through them; leave it False")
    return False


#: PyTorch's switches every rule here takes (``maximize`` changes the update, the others not)
_SWITCHES = {"maximize": _bool, "foreach": _foreach, "capturable": _bool,
             "differentiable": _differentiable}


def _switches(maximize, foreach, capturable, differentiable) -> dict:
    return {"maximize": maximize, "foreach": foreach, "capturable": capturable,
            "differentiable": differentiable}


class NAdam(Optimizer):
    """Adam with Nesterov momentum, PyTorch's NAdam (``t`` counts steps from 1)::

        p = p * (1 - lr * weight_decay)                 (decoupled_weight_decay)
        g = grad + weight_decay * p                     (otherwise)
        mu_t = beta1 * (1 - 0.5 * 0.96^(t * momentum_decay));  prod_t = mu_1 * ... * mu_t
        m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g^2
        d = sqrt(v / (1 - beta2^t)) + eps
        p = p - lr * (1 - mu_t) / (1 - prod_t) * g / d
              - lr * mu_{t+1} / (1 - prod_t * mu_{t+1}) * m / d

    Its state has PyTorch's names: ``step``, ``mu_product`` (``prod_t``, a number),
    ``exp_avg`` and ``exp_avg_sq``.

    >>> opt = pc.optim.NAdam(model.parameters(), lr=2e-3, momentum_decay=4e-3)
    """

    options = {"lr": _nonneg_option("lr"), "betas": _betas, "eps": _nonneg_option("eps"),
               "weight_decay": _nonneg_option("weight_decay"),
               "momentum_decay": _nonneg_option("momentum_decay"), "decoupled_weight_decay": _bool,
               **_SWITCHES}
    state_tensors = ("exp_avg", "exp_avg_sq")
    state_scalars = ("mu_product",)
    has_step = True

    def __init__(self, params, lr: float = 2e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum_decay: float = 4e-3,
                 decoupled_weight_decay: bool = False, *, foreach: bool | None = None,
                 maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps,
                                  "weight_decay": weight_decay, "momentum_decay": momentum_decay,
                                  "decoupled_weight_decay": decoupled_weight_decay,
                                  **_switches(maximize, foreach, capturable, differentiable)})

    def _allocate(self, p, state, opts):
        fresh = super()._allocate(p, state, opts)
        if "mu_product" not in state:
            fresh["mu_product"] = 1.0
        return fresh

    @_replicable
    def _update(self, p, grad, state, opts, fresh):
        step = state["step"] + 1
        beta1, beta2 = opts["betas"]
        psi = opts["momentum_decay"]
        mu = beta1 * (1.0 - 0.5 * 0.96 ** (step * psi))
        mu_next = beta1 * (1.0 - 0.5 * 0.96 ** ((step + 1) * psi))
        mu_product = state["mu_product"] * mu
        K.nadam_(p.value, grad, state["exp_avg"], state["exp_avg_sq"], lr=opts["lr"],
                 beta1=beta1, beta2=beta2, eps=opts["eps"], step=step, mu=mu,
                 mu_product=mu_product, mu_next=mu_next, weight_decay=opts["weight_decay"],
                 decoupled_weight_decay=opts["decoupled_weight_decay"],
                 maximize=opts["maximize"], target=_target(p))
        state["mu_product"] = mu_product
        state["step"] = step


class RAdam(Optimizer):
    """Rectified Adam, PyTorch's RAdam (``t`` counts steps from 1)::

        p = p * (1 - lr * weight_decay)                 (decoupled_weight_decay)
        g = grad + weight_decay * p                     (otherwise)
        m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g^2
        rho_inf = 2 / (1 - beta2) - 1;  rho_t = rho_inf - 2 t beta2^t / (1 - beta2^t)
        r = sqrt((rho_t - 4) (rho_t - 2) rho_inf / ((rho_inf - 4) (rho_inf - 2) rho_t))
        p = p - lr * m / (1 - beta1^t) * sqrt(1 - beta2^t) / (sqrt(v) + eps) * r   (rho_t > 5)
        p = p - lr * m / (1 - beta1^t)                                              (otherwise)

    Its state has PyTorch's names: ``step``, ``exp_avg`` and ``exp_avg_sq``.

    >>> opt = pc.optim.RAdam(model.parameters(), lr=1e-3)
    """

    options = {"lr": _nonneg_option("lr"), "betas": _betas, "eps": _nonneg_option("eps"),
               "weight_decay": _nonneg_option("weight_decay"), "decoupled_weight_decay": _bool,
               **_SWITCHES}
    state_tensors = ("exp_avg", "exp_avg_sq")
    has_step = True

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, decoupled_weight_decay: bool = False, *,
                 foreach: bool | None = None, maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps,
                                  "weight_decay": weight_decay,
                                  "decoupled_weight_decay": decoupled_weight_decay,
                                  **_switches(maximize, foreach, capturable, differentiable)})

    @_replicable
    def _update(self, p, grad, state, opts, fresh):
        step = state["step"] + 1
        K.radam_(p.value, grad, state["exp_avg"], state["exp_avg_sq"], lr=opts["lr"],
                 beta1=opts["betas"][0], beta2=opts["betas"][1], eps=opts["eps"], step=step,
                 weight_decay=opts["weight_decay"],
                 decoupled_weight_decay=opts["decoupled_weight_decay"],
                 maximize=opts["maximize"], target=_target(p))
        state["step"] = step


class Adamax(Optimizer):
    """Adam with the infinity norm, PyTorch's Adamax (``t`` counts steps from 1)::

        g = grad + weight_decay * p
        m = beta1 * m + (1 - beta1) * g;  u = max(beta2 * u, |g| + eps)
        p = p - lr / (1 - beta1^t) * m / u

    Its state has PyTorch's names: ``step``, ``exp_avg`` and ``exp_inf``.

    >>> opt = pc.optim.Adamax(model.parameters(), lr=2e-3)
    """

    options = {"lr": _nonneg_option("lr"), "betas": _betas, "eps": _nonneg_option("eps"),
               "weight_decay": _nonneg_option("weight_decay"), **_SWITCHES}
    state_tensors = ("exp_avg", "exp_inf")
    has_step = True

    # foreach is positional, as PyTorch's (its fifth argument)
    def __init__(self, params, lr: float = 2e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, foreach: bool | None = None, *,
                 maximize: bool = False, differentiable: bool = False,
                 capturable: bool = False):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps,
                                  "weight_decay": weight_decay,
                                  **_switches(maximize, foreach, capturable, differentiable)})

    @_replicable
    def _update(self, p, grad, state, opts, fresh):
        step = state["step"] + 1
        K.adamax_(p.value, grad, state["exp_avg"], state["exp_inf"], lr=opts["lr"],
                  beta1=opts["betas"][0], beta2=opts["betas"][1], eps=opts["eps"], step=step,
                  weight_decay=opts["weight_decay"], maximize=opts["maximize"],
                  target=_target(p))
        state["step"] = step


def _rho(value) -> float:
    value = _nonneg("rho", value)
    if value > 1.0:
        raise OptimizerError(f"invalid rho: {value} (must be in [0, 1])")
    return value


class Adadelta(Optimizer):
    """Adadelta, PyTorch's formula (``lr`` scales the step, 1.0 by default)::

        g = grad + weight_decay * p
        s = rho * s + (1 - rho) * g^2                                  (square_avg)
        delta = sqrt(a + eps) / sqrt(s + eps) * g
        a = rho * a + (1 - rho) * delta^2                              (acc_delta)
        p = p - lr * delta

    Its state has PyTorch's names: ``step``, ``square_avg`` and ``acc_delta``.

    >>> opt = pc.optim.Adadelta(model.parameters(), rho=0.9)
    """

    options = {"lr": _nonneg_option("lr"), "rho": _rho, "eps": _nonneg_option("eps"),
               "weight_decay": _nonneg_option("weight_decay"), **_SWITCHES}
    state_tensors = ("square_avg", "acc_delta")
    has_step = True

    # foreach is positional, as PyTorch's (its fifth argument)
    def __init__(self, params, lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6,
                 weight_decay: float = 0.0, foreach: bool | None = None, *,
                 capturable: bool = False, maximize: bool = False,
                 differentiable: bool = False):
        super().__init__(params, {"lr": lr, "rho": rho, "eps": eps,
                                  "weight_decay": weight_decay,
                                  **_switches(maximize, foreach, capturable, differentiable)})

    @_replicable
    def _update(self, p, grad, state, opts, fresh):
        K.adadelta_(p.value, grad, state["square_avg"], state["acc_delta"], lr=opts["lr"],
                    rho=opts["rho"], eps=opts["eps"], weight_decay=opts["weight_decay"],
                    maximize=opts["maximize"], target=_target(p))
        state["step"] = state["step"] + 1


def _pair(name: str, value) -> tuple[float, float]:
    try:
        a, b = (float(v) for v in value)
    except (TypeError, ValueError):
        raise OptimizerError(f"{name} must be a pair of floats, got {value!r}") from None
    return (a, b)


def _etas(value) -> tuple[float, float]:
    minus, plus = _pair("etas", value)
    if not 0.0 < minus < 1.0 < plus:
        raise OptimizerError(f"invalid eta values: {minus}, {plus} (must be 0 < etaminus < 1 < "
                             "etaplus)")
    return (minus, plus)


def _step_sizes(value) -> tuple[float, float]:
    lo, hi = _pair("step_sizes", value)
    if not 0.0 <= lo <= hi:
        raise OptimizerError(f"invalid step_sizes: ({lo}, {hi}) (must be 0 <= min <= max; "
                             "each step size is clamped into [min, max])")
    return (lo, hi)


class Rprop(Optimizer):
    """Resilient backpropagation, PyTorch's Rprop (each element has its own step size)::

        f = etaplus, etaminus or 1 as sign(grad * prev) is 1, -1 or 0
        step_size = clamp(step_size * f, *step_sizes)      (lr at the first step)
        g = 0 where sign(grad * prev) = -1, else grad
        p = p - sign(g) * step_size;  prev = g

    Its state has PyTorch's names: ``step``, ``prev`` and ``step_size``, filled with the
    group's ``lr`` at a parameter's first step (later changes of ``lr`` do not reach it, as
    in PyTorch).

    >>> opt = pc.optim.Rprop(model.parameters(), lr=1e-2, etas=(0.5, 1.2))
    """

    options = {"lr": _nonneg_option("lr"), "etas": _etas, "step_sizes": _step_sizes, **_SWITCHES}
    state_tensors = ("prev", "step_size")
    has_step = True

    def __init__(self, params, lr: float = 1e-2, etas=(0.5, 1.2), step_sizes=(1e-6, 50), *,
                 capturable: bool = False, foreach: bool | None = None,
                 maximize: bool = False, differentiable: bool = False):
        super().__init__(params, {"lr": lr, "etas": etas, "step_sizes": step_sizes,
                                  **_switches(maximize, foreach, capturable, differentiable)})

    def _allocate(self, p, state, opts):
        fresh = {"step": 0} if "step" not in state else {}
        if state.get("prev") is None:
            fresh["prev"] = Tensor.zeros(p.value.queue, p.shape)
        if state.get("step_size") is None:
            fresh["step_size"] = Tensor.full(p.value.queue, p.shape, opts["lr"])
        return fresh

    @_replicable
    def _update(self, p, grad, state, opts, fresh):
        (etaminus, etaplus), (lo, hi) = opts["etas"], opts["step_sizes"]
        K.rprop_(p.value, grad, state["prev"], state["step_size"], etaminus=etaminus,
                 etaplus=etaplus, step_size_min=lo, step_size_max=hi,
                 maximize=opts["maximize"], target=_target(p))
        state["step"] = state["step"] + 1


class ASGD(Optimizer):
    """Averaged SGD, PyTorch's ASGD (``t`` counts steps from 1; ``eta`` and ``mu`` are the
    state's, set after each step)::

        g = grad + weight_decay * p
        p = p * (1 - lambd * eta) - eta * g
        ax = ax + (p - ax) * mu          (mu != 1; else ax = p)
        eta = lr / (1 + lambd * lr * t)^alpha;  mu = 1 / max(1, t - t0)

    Its state has PyTorch's names: ``step``, ``eta`` (the group's ``lr`` at first), ``mu``
    (1 at first), both numbers, and ``ax``, the average of the parameter over the steps from
    ``t0`` on (``ax`` is what to evaluate with).

    >>> opt = pc.optim.ASGD(model.parameters(), lr=1e-2, t0=100)
    """

    options = {"lr": _nonneg_option("lr"), "lambd": _nonneg_option("lambd"),
               "alpha": _nonneg_option("alpha"), "t0": _nonneg_option("t0"),
               "weight_decay": _nonneg_option("weight_decay"), **_SWITCHES}
    state_tensors = ("ax",)
    state_scalars = ("eta", "mu")
    has_step = True

    # every argument positional, as PyTorch's
    def __init__(self, params, lr: float = 1e-2, lambd: float = 1e-4, alpha: float = 0.75,
                 t0: float = 1e6, weight_decay: float = 0.0, foreach: bool | None = None,
                 maximize: bool = False, differentiable: bool = False,
                 capturable: bool = False):
        super().__init__(params, {"lr": lr, "lambd": lambd, "alpha": alpha, "t0": t0,
                                  "weight_decay": weight_decay,
                                  **_switches(maximize, foreach, capturable, differentiable)})

    def _allocate(self, p, state, opts):
        fresh = super()._allocate(p, state, opts)
        if "eta" not in state:
            fresh["eta"] = opts["lr"]
        if "mu" not in state:
            fresh["mu"] = 1.0
        return fresh

    @_replicable
    def _update(self, p, grad, state, opts, fresh):
        step, lr, lambd = state["step"] + 1, opts["lr"], opts["lambd"]
        K.asgd_(p.value, grad, state["ax"], eta=state["eta"], mu=state["mu"], lambd=lambd,
                weight_decay=opts["weight_decay"], maximize=opts["maximize"],
                target=_target(p))
        state["eta"] = lr / ((1.0 + lambd * lr * step) ** opts["alpha"])
        state["mu"] = 1.0 / max(1.0, step - opts["t0"])
        state["step"] = step
