"""Fused updates of the less common optimizers (NAdam, RAdam, Adamax, Adadelta, Rprop, ASGD):
one kernel launch per parameter (or flat bucket) per step, with the replicated variants of
``parcl.kernels.optim`` (the end of a data-parallel step) generated the same way.

They live in a program of their own, so a run that trains with SGD or Adam never builds them.
Everything that depends only on the step count is computed on the host, as there. ``sign`` is
-1 for ``maximize`` (the gradient's negation, exact in float32), else 1. The L2 weight decay
is added only where it is not 0, as PyTorch's (``0 * inf`` would turn an infinite parameter
into NaN).

>>> # nadam_(param, grad, exp_avg, exp_avg_sq, lr=2e-3, beta1=0.9, beta2=0.999, eps=1e-8,
>>> #        step=1, mu=..., mu_product=..., mu_next=...)
"""

from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from .optim import Replicated, _check, _launch, _source

__all__ = ["adadelta_", "adamax_", "asgd_", "nadam_", "radam_", "rprop_"]

# (state pointers, scalar parameters, body), as ``parcl.kernels.optim._UPDATES``. The running
# means are PyTorch's ``lerp`` (m + c1 * (g - m)), which it uses for every first moment; a
# square is weighed before it is squared, (c * g) * g, as PyTorch's addcmul: g * g overflows
# float32 from |g| ~ 1.8e19, and an inf in a second moment freezes its element for good.
_UPDATES = {
    # p *= decay (decoupled weight decay; 1 otherwise); g' = sign*g + wd*p (L2; 0 otherwise)
    # m = lerp(m, g', c1); v = b2*v + c2*g'^2; den = sqrt(v / bc2) + eps
    # p += cg * g'/den, then p += cm * m/den: cg = -lr (1 - mu_t) / (1 - prod mu_1..t) and
    # cm = -lr mu_{t+1} / (1 - prod mu_1..t+1) from the host (PyTorch's two addcdivs).
    "nadam": ("__global float *m, __global float *v,", """const float decay, const float wd,
    const float sign, const float c1, const float b2, const float c2, const float bc2,
    const float eps, const float cg, const float cm""", """
    const float w = p[i] * decay;
    const float d = wd != 0.0f ? sign * G + wd * w : sign * G;
    const float mi = m[i] + c1 * (d - m[i]);
    const float vi = b2 * v[i] + (c2 * d) * d;
    m[i] = mi;
    v[i] = vi;
    const float den = sqrt(vi / bc2) + eps;
    const float out = (w + cg * (d / den)) + cm * (mi / den);"""),
    # As NAdam's moments; then p -= (m / bc1) * lr * (sqrt_bc2 / (sqrt(v) + eps)) * rect where
    # the host found rho_t > 5 (``adaptive``), else p -= (m / bc1) * lr (PyTorch's RAdam).
    "radam": ("__global float *m, __global float *v,", """const float decay, const float wd,
    const float sign, const float c1, const float b2, const float c2, const float bc1,
    const float lr, const float sqrt_bc2, const float rect, const float eps,
    const int adaptive""", """
    const float w = p[i] * decay;
    const float d = wd != 0.0f ? sign * G + wd * w : sign * G;
    const float mi = m[i] + c1 * (d - m[i]);
    const float vi = b2 * v[i] + (c2 * d) * d;
    m[i] = mi;
    v[i] = vi;
    const float mh = mi / bc1;
    const float out = adaptive ? w - mh * lr * (sqrt_bc2 / (sqrt(vi) + eps)) * rect
                               : w - mh * lr;"""),
    # g' = sign*g + wd*p; m = lerp(m, g', c1); u = max(b2*u, |g'| + eps) (a NaN wins, as
    # torch.maximum's); p -= clr * m / u, clr = lr / (1 - b1^t) from the host.
    "adamax": ("__global float *m, __global float *u,", """const float wd, const float sign,
    const float c1, const float b2, const float eps, const float clr""", """
    const float w = p[i];
    const float d = wd != 0.0f ? sign * G + wd * w : sign * G;
    const float mi = m[i] + c1 * (d - m[i]);
    const float a = b2 * u[i];
    const float b = fabs(d) + eps;
    const float ui = (isnan(a) || a > b) ? a : b;
    m[i] = mi;
    u[i] = ui;
    const float out = w - clr * (mi / ui);"""),
    # g' = sign*g + wd*p; s = rho*s + c*g'^2 (c = 1 - rho from the host);
    # delta = sqrt(acc + eps) / sqrt(s + eps) * g'; acc = rho*acc + c*delta^2; p -= lr * delta
    "adadelta": ("__global float *sq, __global float *acc,", """const float wd, const float sign,
    const float rho, const float c, const float eps, const float lr""", """
    const float w = p[i];
    const float d = wd != 0.0f ? sign * G + wd * w : sign * G;
    const float s = rho * sq[i] + (c * d) * d;
    sq[i] = s;
    const float delta = sqrt(acc[i] + eps) / sqrt(s + eps) * d;
    acc[i] = rho * acc[i] + (c * delta) * delta;
    const float out = w - lr * delta;"""),
    # Rprop: f = etaplus, etaminus or 1 as sign(g * prev) is 1, -1 or 0 (a NaN counts as 0,
    # as PyTorch's sign); step_size = clamp(step_size * f, lo, hi) (a NaN stays); where the
    # sign flipped the gradient counts as 0; p -= sign(g) * step_size; prev = g.
    "rprop": ("__global float *prev, __global float *ss,", """const float sign,
    const float etaminus, const float etaplus, const float lo, const float hi""", """
    const float w = p[i];
    const float d = sign * G;
    const float s = d * prev[i];
    const float f = s > 0.0f ? etaplus : (s < 0.0f ? etaminus : 1.0f);
    const float z0 = ss[i] * f;
    const float z = z0 < lo ? lo : (z0 > hi ? hi : z0);
    ss[i] = z;
    const float gd = s < 0.0f ? 0.0f : d;
    prev[i] = gd;
    const float out = w - (float)((gd > 0.0f) - (gd < 0.0f)) * z;"""),
    # ASGD: g' = sign*g + wd*p; p = p * (1 - lambd*eta) - eta * g' (eta from the host);
    # ax = ax + (p - ax) * mu where mu != 1 (``average``), else ax = p.
    "asgd": ("__global float *ax,", """const float wd, const float sign, const float decay,
    const float eta, const float mu, const int average""", """
    const float w = p[i];
    const float d = wd != 0.0f ? sign * G + wd * w : sign * G;
    const float out = w * decay - eta * d;
    ax[i] = average ? ax[i] + (out - ax[i]) * mu : out;"""),
}

SOURCE = _source(_UPDATES)


def _sign(maximize: bool) -> np.float32:
    return np.float32(-1.0 if maximize else 1.0)


def _first(op: str, step: int) -> None:
    if step < 1:
        raise ValueError(f"{op}: step counts from 1, got {step}")


def nadam_(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, *, lr: float,
           beta1: float, beta2: float, eps: float, step: int, mu: float, mu_product: float,
           mu_next: float, weight_decay: float = 0.0, decoupled_weight_decay: bool = False,
           maximize: bool = False, target: Replicated | None = None) -> Tensor:
    """One NAdam step (``step`` counts from 1) in place; ``mu`` and ``mu_next`` are the
    momentum schedule at ``step`` and ``step + 1``, ``mu_product`` the product of ``mu`` over
    steps 1..``step`` (this one's included)."""
    _check("nadam", param, grad, exp_avg, exp_avg_sq)
    _first("nadam", step)
    decay, wd = (1.0 - lr * weight_decay, 0.0) if decoupled_weight_decay else (1.0, weight_decay)
    scalars = (np.float32(decay), np.float32(wd), _sign(maximize), np.float32(1.0 - beta1),
               np.float32(beta2), np.float32(1.0 - beta2), np.float32(1.0 - beta2 ** step),
               np.float32(eps), np.float32(-lr * (1.0 - mu) / (1.0 - mu_product)),
               np.float32(-lr * mu_next / (1.0 - mu_product * mu_next)))
    return _launch("nadam", param, grad, (exp_avg, exp_avg_sq), scalars, target, SOURCE)


def radam_(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, *, lr: float,
           beta1: float, beta2: float, eps: float, step: int, weight_decay: float = 0.0,
           decoupled_weight_decay: bool = False, maximize: bool = False,
           target: Replicated | None = None) -> Tensor:
    """One RAdam step (``step`` counts from 1) in place: the rectified adaptive step where the
    approximated SMA length ``rho_t`` exceeds 5, else a bias-corrected momentum step."""
    _check("radam", param, grad, exp_avg, exp_avg_sq)
    _first("radam", step)
    decay, wd = (1.0 - lr * weight_decay, 0.0) if decoupled_weight_decay else (1.0, weight_decay)
    bc1, bc2 = 1.0 - beta1 ** step, 1.0 - beta2 ** step
    rho_inf = 2.0 / (1.0 - beta2) - 1.0
    rho_t = rho_inf - 2.0 * step * (beta2 ** step) / bc2
    adaptive = rho_t > 5.0
    rect = (((rho_t - 4.0) * (rho_t - 2.0) * rho_inf
             / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho_t)) ** 0.5 if adaptive else 0.0)
    scalars = (np.float32(decay), np.float32(wd), _sign(maximize), np.float32(1.0 - beta1),
               np.float32(beta2), np.float32(1.0 - beta2), np.float32(bc1), np.float32(lr),
               np.float32(bc2 ** 0.5), np.float32(rect), np.float32(eps), np.int32(adaptive))
    return _launch("radam", param, grad, (exp_avg, exp_avg_sq), scalars, target, SOURCE)


def adamax_(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_inf: Tensor, *, lr: float,
            beta1: float, beta2: float, eps: float, step: int, weight_decay: float = 0.0,
            maximize: bool = False, target: Replicated | None = None) -> Tensor:
    """One Adamax step (``step`` counts from 1) in place, PyTorch's formula."""
    _check("adamax", param, grad, exp_avg, exp_inf)
    _first("adamax", step)
    scalars = (np.float32(weight_decay), _sign(maximize), np.float32(1.0 - beta1),
               np.float32(beta2), np.float32(eps), np.float32(lr / (1.0 - beta1 ** step)))
    return _launch("adamax", param, grad, (exp_avg, exp_inf), scalars, target, SOURCE)


def adadelta_(param: Tensor, grad: Tensor, square_avg: Tensor, acc_delta: Tensor, *,
              lr: float, rho: float, eps: float, weight_decay: float = 0.0,
              maximize: bool = False, target: Replicated | None = None) -> Tensor:
    """One Adadelta step in place, PyTorch's formula."""
    _check("adadelta", param, grad, square_avg, acc_delta)
    scalars = (np.float32(weight_decay), _sign(maximize), np.float32(rho),
               np.float32(1.0 - rho), np.float32(eps), np.float32(lr))
    return _launch("adadelta", param, grad, (square_avg, acc_delta), scalars, target, SOURCE)


def rprop_(param: Tensor, grad: Tensor, prev: Tensor, step_size: Tensor, *, etaminus: float,
           etaplus: float, step_size_min: float, step_size_max: float, maximize: bool = False,
           target: Replicated | None = None) -> Tensor:
    """One Rprop step in place, PyTorch's formula (``step_size`` per element)."""
    _check("rprop", param, grad, prev, step_size)
    scalars = (_sign(maximize), np.float32(etaminus), np.float32(etaplus),
               np.float32(step_size_min), np.float32(step_size_max))
    return _launch("rprop", param, grad, (prev, step_size), scalars, target, SOURCE)


def asgd_(param: Tensor, grad: Tensor, ax: Tensor, *, eta: float, mu: float, lambd: float,
          weight_decay: float = 0.0, maximize: bool = False,
          target: Replicated | None = None) -> Tensor:
    """One ASGD step in place with this step's ``eta`` and ``mu`` (PyTorch's state before
    the step); ``ax`` becomes the running average of the parameter."""
    _check("asgd", param, grad, ax)
    scalars = (np.float32(weight_decay), _sign(maximize), np.float32(1.0 - lambd * eta),
               np.float32(eta), np.float32(mu), np.int32(mu != 1.0))
    return _launch("asgd", param, grad, (ax,), scalars, target, SOURCE)
