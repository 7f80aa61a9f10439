"""Fused optimizer updates: one kernel launch per parameter (or flat bucket) per step.

Each kernel reads the gradient once and writes the parameter (and its state) once. Everything
that depends only on the step count (bias corrections, step sizes) is computed on the host and
passed as a scalar argument, so a step never waits for the device.

>>> # sgd_momentum_(param, grad, buf, lr=0.1, weight_decay=0.0, momentum=0.9,
>>> #               nesterov=False, first=True)
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError, ShapeError
from ..crossqueue import foreign_use, foreign_wait
from ..tensor import FLOAT, Tensor, check_same_context
from ._cache import get_kernel, round_up
from .reduce import ordered_sum

__all__ = ["Replicated", "adagrad_", "adam_", "rmsprop_", "sgd_", "sgd_momentum_"]

# Each update: (state pointers, scalar parameters, body). The body reads the summed gradient
# as G and the parameter as p[i], writes its state, and leaves the new parameter in ``out``.
_UPDATES = {
    # p -= lr * (g + wd * p)
    "sgd": ("", "const float lr, const float wd", """
    const float w = p[i];
    const float out = w - lr * (wd != 0.0f ? G + wd * w : G);"""),
    # g' = g + wd*p; b = first ? g' : mu*b + g'; p -= lr * (nesterov ? g' + mu*b : b)
    "sgd_momentum": ("__global float *buf,", """const float lr, const float wd, const float mu,
    const int first, const int nesterov""", """
    const float w = p[i];
    const float d = wd != 0.0f ? G + wd * w : G;      // 0 * inf: NaN, as torch skips it
    const float b = first ? d : mu * buf[i] + d;
    buf[i] = b;
    const float out = w - lr * (nesterov ? d + mu * b : b);"""),
    # p *= decay (AdamW's decoupled decay; 1 for Adam); g' = g + wd*p (Adam's L2; 0 for AdamW)
    # m = b1*m + c1*g'; v = b2*v + c2*g'^2, c1 = 1 - b1 and c2 = 1 - b2 from the host: formed
    # here from the float32 betas, 1 - 0.99999f is 1.00136e-5, not 1e-5 (PyTorch's weight).
    # p -= step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps), step_size = lr / (1 - b1^t),
    # inv_sqrt_bc2 = 1 / sqrt(1 - b2^t): that is lr * m_hat / (sqrt(v_hat) + eps).
    # g'^2 is weighed before it is squared, (c2 * g') * g', as PyTorch's addcmul: g' * g'
    # overflows float32 from |g'| ~ 1.8e19, and an inf in v freezes its element for good.
    "adam": ("__global float *m, __global float *v,", """const float decay, const float wd,
    const float b1, const float c1, const float b2, const float c2, const float step_size,
    const float inv_sqrt_bc2, const float eps""", """
    const float w = p[i] * decay;
    const float d = wd != 0.0f ? G + wd * w : G;      // 0 * inf: NaN, as torch skips it
    const float mi = b1 * m[i] + c1 * d;
    const float vi = b2 * v[i] + (c2 * d) * d;
    m[i] = mi;
    v[i] = vi;
    const float out = w - step_size * mi / (sqrt(vi) * inv_sqrt_bc2 + eps);"""),
    # Adam with amsgrad: the largest v so far (vmax, PyTorch's max_exp_avg_sq; NaN wins, as
    # torch.maximum) takes v's place in the denominator.
    "adam_amsgrad": ("__global float *m, __global float *v, __global float *vmax,", """const
    float decay, const float wd, const float b1, const float c1, const float b2,
    const float c2, const float step_size, const float inv_sqrt_bc2, const float eps""", """
    const float w = p[i] * decay;
    const float d = wd != 0.0f ? G + wd * w : G;      // 0 * inf: NaN, as torch skips it
    const float mi = b1 * m[i] + c1 * d;
    const float vi = b2 * v[i] + (c2 * d) * d;
    const float vo = vmax[i];
    const float vm = (vo != vo || vi != vi) ? vo + vi : fmax(vo, vi);
    m[i] = mi;
    v[i] = vi;
    vmax[i] = vm;
    const float out = w - step_size * mi / (sqrt(vm) * inv_sqrt_bc2 + eps);"""),
    # g' = g + wd*p; s = alpha*s + (c*g')*g' (c = 1 - alpha from the host, as Adam's weights,
    # and weighed before squared, as Adam's);
    # centered: a = alpha*a + c*(g' - a) (PyTorch's lerp), d = sqrt(s - a^2) + eps, else
    # d = sqrt(s) + eps; momentum: b = mu*b + g'/d, p -= lr*b; else p -= lr * g'/d. The flags
    # are uniform over the launch; a buffer an option does not use is passed as ``sq`` and
    # never touched, so the four variants share one kernel.
    "rmsprop": ("__global float *sq, __global float *ga, __global float *buf,", """const float lr,
    const float wd, const float alpha, const float c, const float eps, const float mu,
    const int centered, const int momentum""", """
    const float w = p[i];
    const float d = wd != 0.0f ? G + wd * w : G;      // 0 * inf: NaN, as torch skips it
    const float s = alpha * sq[i] + (c * d) * d;
    sq[i] = s;
    float den;
    if (centered) {
        const float a = ga[i] + c * (d - ga[i]);
        ga[i] = a;
        den = sqrt(s - a * a) + eps;
    } else {
        den = sqrt(s) + eps;
    }
    float out;
    if (momentum) {
        const float b = mu * buf[i] + d / den;
        buf[i] = b;
        out = w - lr * b;
    } else {
        out = w - lr * (d / den);
    }"""),
    # g' = g + wd*p; s += g'^2; p -= clr * g' / (sqrt(s) + eps), clr = lr / (1 + (t-1)*decay)
    # from the host.
    "adagrad": ("__global float *sum,", """const float clr, const float wd,
    const float eps""", """
    const float w = p[i];
    const float d = wd != 0.0f ? G + wd * w : G;      // 0 * inf: NaN, as torch skips it
    const float s = sum[i] + d * d;
    sum[i] = s;
    const float out = w - clr * (d / (sqrt(s) + eps));"""),
}
MAX_REPLICAS = 8     # the widest replicated variant (parcl.allreduce.fused)


def _source(updates: dict[str, tuple[str, str, str]] | None = None) -> str:
    """Per update (of ``updates``, these by default): ``name`` steps one parameter with its
    gradient; ``name_xK`` is the whole end of a data-parallel step for one element range: it
    sums the K replicas' gradients in replica order (exactly as ``parcl.kernels.reduce``
    does), zeroes them, updates replica 0's parameter and state, and writes the new value into
    the other K-1 replicas' parameters (``name_x1``, a single replica's end of step, is the
    update with the zeroing fused in)."""
    out = ["//CL//"]
    for name, (state, scalars, body) in (_UPDATES if updates is None else updates).items():
        out.append(f"""
__kernel void {name}(__global float *p, __global const float *g, {state}
                     {scalars}, const int n)
{{
    const int i = get_global_id(0);
    if (i >= n) return;
    const float G = g[i];{body}
    p[i] = out;
}}""")
        for k in range(1, MAX_REPLICAS + 1):
            copies = "".join(f"__global float *p{r}, " for r in range(1, k))
            grads = ", ".join(f"__global float *g{r}" for r in range(k))
            total = ordered_sum([f"g{r}[i]" for r in range(k)])
            zero = " ".join(f"g{r}[i] = 0.0f;" for r in range(k))
            store = " ".join(f"p{r}[i] = out;" for r in range(1, k))
            out.append(f"""
__kernel void {name}_x{k}(__global float *p, {copies}{grads}, {state}
                          {scalars}, const int n)
{{
    const int i = get_global_id(0);
    if (i >= n) return;
    const float G = {total};
    {zero}{body}
    p[i] = out;
    {store}
}}""")
    return "\n".join(out) + "\n"


SOURCE = _source()

_LOCAL = 64


def _check(op: str, param: Tensor, *others: Tensor) -> None:
    for t in (param, *others):
        if t.dtype != FLOAT:
            raise DTypeError(f"{op}: expected float32 tensors, got {t.dtype} (shape {t.shape})")
        if tuple(t.shape) != tuple(param.shape):
            raise ShapeError(f"{op}: shape {t.shape} does not match the parameter's "
                             f"{param.shape}")
    check_same_context(op, param, *others)


def _launch(name: str, param: Tensor, grad: Tensor, state: tuple[Tensor, ...], scalars,
            target=None, source: str = SOURCE) -> Tensor:
    """Enqueue ``name`` (of ``source``, this module's by default) on the parameter's queue;
    the gradient may live on another queue of the same context (ordered with a marker), the
    state lives on the parameter's.

    ``target`` (a ``Replicated``) runs the replicated variant instead: the end of a
    data-parallel step, each of its queues taking its own element range (the same kernel over
    a global offset, so each element gets exactly the arithmetic of one plain launch).
    Ordering the queues around it is the caller's job (``parcl.allreduce.fused``)."""
    if target is not None:
        k = len(target.values)
        if not 1 <= k <= MAX_REPLICAS:
            raise ShapeError(f"{name}: a replicated step takes 1..{MAX_REPLICAS} replicas, "
                             f"got {k}")
        args = [*(v.data for v in target.values), *(g.data for g in target.grads),
                *(s.data for s in state), *scalars]
        for q, off, cnt in target.shards:
            if cnt > 0:
                get_kernel(q, source, f"{name}_x{k}")(
                    q, (round_up(cnt, _LOCAL),), None, *args, np.int32(off + cnt),
                    global_offset=(off,))
        return param
    q = param.queue
    kernel = get_kernel(q, source, name)
    n = param.size
    wait = foreign_wait(grad, q)
    args = [param.data, grad.data, *(s.data for s in state), *scalars, np.int32(n)]
    event = kernel(q, (round_up(n, _LOCAL),), None, *args, wait_for=wait)
    foreign_use(grad, event)
    return param


class Replicated:
    """The end of a data-parallel step for one flat bucket: every replica's parameter values
    and gradients (replica 0's first: its values and the state are the ones stepped) and
    ``shards``, ``(queue, offset, count)`` per queue."""

    __slots__ = ("values", "grads", "shards")

    def __init__(self, values: list[Tensor], grads: list[Tensor], shards: list[tuple]):
        if len(values) != len(grads):
            raise ShapeError(f"Replicated: {len(values)} parameter buffers but {len(grads)} "
                             "gradient buffers")
        for t in (*values, *grads):
            if t.size != values[0].size or t.dtype != FLOAT:
                raise ShapeError(f"Replicated: every buffer must hold {values[0].size} float32 "
                                 f"elements, got {t.size} ({t.dtype})")
        self.values, self.grads, self.shards = values, grads, shards


def sgd_(param: Tensor, grad: Tensor, lr: float, weight_decay: float = 0.0, *,
         target: Replicated | None = None) -> Tensor:
    """``param -= lr * (grad + weight_decay * param)`` in place (SGD without momentum)."""
    _check("sgd", param, grad)
    return _launch("sgd", param, grad, (), (np.float32(lr), np.float32(weight_decay)), target)


def sgd_momentum_(param: Tensor, grad: Tensor, buf: Tensor, lr: float, weight_decay: float,
                  momentum: float, nesterov: bool, first: bool, *,
                  target: Replicated | None = None) -> Tensor:
    """SGD with momentum (dampening 0), PyTorch's formula; ``first`` sets ``buf = grad``."""
    _check("sgd_momentum", param, grad, buf)
    return _launch("sgd_momentum", param, grad, (buf,),
                   (np.float32(lr), np.float32(weight_decay), np.float32(momentum),
                    np.int32(bool(first)), np.int32(bool(nesterov))), target)


def adam_(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, *, lr: float,
          beta1: float, beta2: float, eps: float, step: int, weight_decay: float = 0.0,
          decoupled_weight_decay: float = 0.0, max_exp_avg_sq: Tensor | None = None,
          target: Replicated | None = None) -> Tensor:
    """One Adam step (``step`` counts from 1) in place; ``weight_decay`` is Adam's L2 term,
    ``decoupled_weight_decay`` AdamW's ``p *= 1 - lr * wd`` applied first; with
    ``max_exp_avg_sq`` the amsgrad variant (the largest ``exp_avg_sq`` so far divides)."""
    state = (exp_avg, exp_avg_sq) + ((max_exp_avg_sq,) if max_exp_avg_sq is not None else ())
    _check("adam", param, grad, *state)
    if step < 1:
        raise ValueError(f"adam: step counts from 1, got {step}")
    bc1 = 1.0 - beta1 ** step
    bc2 = 1.0 - beta2 ** step
    scalars = (np.float32(1.0 - lr * decoupled_weight_decay), np.float32(weight_decay),
               np.float32(beta1), np.float32(1.0 - beta1), np.float32(beta2),
               np.float32(1.0 - beta2), np.float32(lr / bc1),
               np.float32(1.0 / np.sqrt(bc2)), np.float32(eps))
    name = "adam" if max_exp_avg_sq is None else "adam_amsgrad"
    return _launch(name, param, grad, state, scalars, target)


def rmsprop_(param: Tensor, grad: Tensor, square_avg: Tensor, *, lr: float, alpha: float,
             eps: float, weight_decay: float = 0.0, momentum: float = 0.0,
             momentum_buffer: Tensor | None = None, grad_avg: Tensor | None = None,
             target: Replicated | None = None) -> Tensor:
    """One RMSprop step in place, PyTorch's formula: ``grad_avg`` given is the centered
    variant, ``momentum_buffer`` given (with ``momentum``) the one with momentum."""
    state = [t for t in (square_avg, grad_avg, momentum_buffer) if t is not None]
    _check("rmsprop", param, grad, *state)
    scalars = (np.float32(lr), np.float32(weight_decay), np.float32(alpha),
               np.float32(1.0 - alpha), np.float32(eps), np.float32(momentum),
               np.int32(grad_avg is not None), np.int32(momentum_buffer is not None))
    buffers = (square_avg, grad_avg if grad_avg is not None else square_avg,
               momentum_buffer if momentum_buffer is not None else square_avg)
    return _launch("rmsprop", param, grad, buffers, scalars, target)


def adagrad_(param: Tensor, grad: Tensor, state_sum: Tensor, *, lr: float, lr_decay: float,
             eps: float, step: int, weight_decay: float = 0.0,
             target: Replicated | None = None) -> Tensor:
    """One Adagrad step (``step`` counts from 1) in place, PyTorch's formula."""
    _check("adagrad", param, grad, state_sum)
    if step < 1:
        raise ValueError(f"adagrad: step counts from 1, got {step}")
    clr = lr / (1.0 + (step - 1) * lr_decay)
    return _launch("adagrad", param, grad, (state_sum,),
                   (np.float32(clr), np.float32(weight_decay), np.float32(eps)), target)
