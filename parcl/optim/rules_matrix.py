"""Update rules that look at a parameter as a matrix, as ``torch.optim``'s: ``Adafactor``
(factored second moments: a row and a column running mean per matrix) and ``Muon`` (momentum
orthogonalised by a Newton-Schulz iteration), with PyTorch's formulas, defaults, option names
and state names.

Each update is composed of parcl's ops on the parameter's queue (norms, a matmul, lerps): the
state lives on the device, as every optimizer's. Both rules need each parameter's own shape,
so a flat bucket of a ``ReplicaGroup`` is stepped parameter by parameter. Adafactor keeps the
parameter's and the update's RMS on the device (PyTorch's reads both back per parameter and
step), so its step reads nothing back.

>>> opt = pc.optim.Adafactor(model.parameters(), lr=1e-2)
>>> opt = pc.optim.Muon([model.fc.weight], lr=1e-3)          # 2-D parameters only
"""

from __future__ import annotations

import math

import numpy as np

from .. import tape as tp
from ..kernels import elementwise as ew
from ..tensor import Tensor
from .checks import _nonneg_option
from .optimizer import Optimizer, OptimizerError, _nonneg
from .rules import _bool
from .rules_more import _foreach

__all__ = ["Adafactor", "Muon"]

_EPS32 = float(np.finfo(np.float32).eps)     # Adafactor's eps1 = None: float32's epsilon


def _beta2_decay(value) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise OptimizerError(f"beta2_decay must be a number, got {value!r}") from None
    if not value <= 0.0:
        raise OptimizerError(f"invalid beta2_decay: {value} (must be <= 0)")
    return value


def _adafactor_eps(value) -> tuple:
    try:
        eps1, eps2 = value
    except (TypeError, ValueError):
        raise OptimizerError(f"eps must be a pair (eps1 or None, eps2), got {value!r}") from None
    return (None if eps1 is None else _nonneg("eps1", eps1), _nonneg("eps2", eps2))


def _clip_d(value) -> float:
    value = _nonneg("d", value)
    if value < 1.0:
        raise OptimizerError(f"invalid clipping threshold d: {value} (must be >= 1)")
    return value


def _rms(t: Tensor) -> Tensor:
    """The root mean square of ``t``, a 0-d tensor on its queue (PyTorch's
    ``norm(2).item() / sqrt(numel)``, left on the device: a read would stall every step)."""
    return tp.linalg_vector_norm(t) / math.sqrt(t.size)


class _PerParameter(Optimizer):
    """A rule that needs each parameter's shape: flat buckets are stepped per parameter."""

    def _fusable(self, work, buckets):
        return [], list(work)


class Adafactor(_PerParameter):
    """Adafactor, PyTorch's (``t`` counts steps from 1; ``eps1`` None is float32's epsilon)::

        w = t^beta2_decay;  rho = min(lr, 1 / sqrt(t));  alpha = max(eps2, RMS(p)) * rho
        p = p * (1 - lr * weight_decay)
        for a parameter of >= 2 dims (over its last two, R rows by C columns):
            row_var = lerp(row_var, mean(g^2, dim=-1), w)             (shape (..., R, 1))
            col_var = lerp(col_var, mean(g^2, dim=-2), w)             (shape (..., 1, C))
            v = row_var @ col_var / max(mean(row_var, dim=-2), eps1)
        for a vector: variance = lerp(variance, g^2, w);  v = variance
        u = g / sqrt(max(v, eps1^2));  p = p - alpha / max(1, RMS(u) / d) * u

    Its state has PyTorch's names: ``step``, and ``row_var`` and ``col_var`` (a matrix) or
    ``variance`` (a vector). ``foreach`` is taken so that PyTorch code runs, and changes
    nothing.

    >>> opt = pc.optim.Adafactor(model.parameters(), lr=1e-2, weight_decay=0.0)
    """

    options = {"lr": _nonneg_option("lr"), "beta2_decay": _beta2_decay, "eps": _adafactor_eps,
               "d": _clip_d, "weight_decay": _nonneg_option("weight_decay"), "foreach": _foreach,
               "maximize": _bool}
    optional_tensors = ("row_var", "col_var", "variance")
    has_step = True

    def __init__(self, params, lr: float = 1e-2, beta2_decay: float = -0.8,
                 eps=(None, 1e-3), d: float = 1.0, weight_decay: float = 0.0, *,
                 foreach: bool | None = None, maximize: bool = False):
        super().__init__(params, {"lr": lr, "beta2_decay": beta2_decay, "eps": eps, "d": d,
                                  "weight_decay": weight_decay, "foreach": foreach,
                                  "maximize": maximize})

    @staticmethod
    def _shapes(shape) -> dict[str, tuple]:
        """Each state tensor's shape for a parameter of ``shape``."""
        shape = tuple(shape)
        if len(shape) < 2:
            return {"variance": shape}
        return {"row_var": shape[:-1] + (1,), "col_var": shape[:-2] + (1, shape[-1])}

    def _allocate(self, p, state, opts):
        fresh = {"step": 0} if "step" not in state else {}
        for name, shape in self._shapes(p.shape).items():
            if state.get(name) is None:
                fresh[name] = Tensor.zeros(p.value.queue, shape)
        return fresh

    def _update(self, p, grad, state, opts, fresh):
        step = state["step"] + 1
        lr, (eps1, eps2) = opts["lr"], opts["eps"]
        eps1 = _EPS32 if eps1 is None else eps1
        w = float(step) ** opts["beta2_decay"]
        with tp.no_grad():
            # the parameter's RMS before the weight decay; fmax, as PyTorch's Python max(eps2,
            # rms): a NaN RMS (one NaN element) gives eps2, the other elements still move
            alpha = tp.fmax(_rms(p.value), eps2) * min(lr, 1.0 / math.sqrt(step))
        if opts["weight_decay"] != 0:
            ew.scale_(p.value, 1.0 - lr * opts["weight_decay"])
        with tp.no_grad():
            g = -grad if opts["maximize"] else grad
            if g.ndim >= 2:
                rows, cols = state["row_var"], state["col_var"]
                # mean of g^2 as PyTorch forms it: the norm squared, over the count
                row_mean = tp.linalg_vector_norm(g, dim=-1, keepdim=True) ** 2 / g.shape[-1]
                rows.copy_(tp.lerp(rows, row_mean, w))
                col_mean = tp.linalg_vector_norm(g, dim=-2, keepdim=True) ** 2 / g.shape[-2]
                cols.copy_(tp.lerp(cols, col_mean, w))
                v = tp.matmul(rows, cols) / tp.clamp_min(rows.mean(dim=-2, keepdim=True),
                                                           eps1)
            else:
                var = state["variance"]
                var.copy_(tp.lerp(var, g * g, w))
                v = var
            u = tp.rsqrt(tp.clamp_min(v, eps1 * eps1)) * g
            # fmax as PyTorch's max(1.0, rms): one NaN in u leaves the others unclipped
            update = u * (alpha / tp.fmax(_rms(u) / opts["d"], 1.0))
        ew.axpy(p.value, update, -1.0)
        state["step"] = step

    def _check_entry(self, name, key, entry, p):
        if not isinstance(entry, dict):
            raise OptimizerError(f"{name}: state[{key!r}] is not a dict")
        shapes = self._shapes(p.shape)
        tensors = {k: v for k, v in entry.items() if k in self.optional_tensors}
        rest = {k: v for k, v in entry.items() if k not in self.optional_tensors}
        out = super()._check_entry(name, key, rest, p)
        for k, v in tensors.items():
            if v is None:
                continue
            if k not in shapes:
                dims = "< 2" if k == "variance" else ">= 2"
                raise OptimizerError(f"{name}: state[{key!r}] has {k!r}, which Adafactor keeps "
                                     f"only for a parameter of {dims} dims; this one has shape "
                                     f"{tuple(p.shape)}")
            try:
                v = np.asarray(v, np.float32)
            except (TypeError, ValueError):
                raise OptimizerError(f"{name}: state[{key!r}][{k!r}] is not a numeric "
                                     f"array") from None
            if v.shape != shapes[k]:
                raise OptimizerError(f"{name}: state[{key!r}][{k!r}] has shape {v.shape}, "
                                     f"expected {shapes[k]} for a parameter of shape "
                                     f"{tuple(p.shape)}")
            out[k] = v
        return out


def _coefficients(value) -> tuple[float, float, float]:
    try:
        a, b, c = (float(v) for v in value)
    except (TypeError, ValueError):
        raise OptimizerError(f"ns_coefficients must be 3 numbers (a, b, c), got "
                             f"{value!r}") from None
    return (a, b, c)


def _ns_steps(value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not (
            0 <= value < 100):
        raise OptimizerError(f"invalid ns_steps: {value!r} (an int in [0, 100))")
    return int(value)


def _adjust_lr_fn(value):
    if value not in (None, "original", "match_rms_adamw"):
        raise OptimizerError(f"adjust_lr_fn {value!r} is not supported (None, 'original' or "
                             "'match_rms_adamw')")
    return value


def orthogonalize(g: Tensor, coefficients=(3.4445, -4.7750, 2.0315), steps: int = 5,
                  eps: float = 1e-7) -> Tensor:
    """Muon's Newton-Schulz iteration on a 2-D ``g``, in float32: ``X = g / max(|g|, eps)``
    (the wide way round), then ``steps`` times ``A = X X^T; X = a X + (b A + c A A) X``; its
    singular values end near 1 (between about 0.5 and 1.5). PyTorch runs it in bfloat16."""
    a, b, c = coefficients
    with tp.no_grad():
        tall = g.shape[0] > g.shape[1]
        x = g.T if tall else g
        x = x / tp.clamp_min(tp.linalg_vector_norm(x), eps)
        for _ in range(steps):
            gram = tp.matmul(x, x.T)
            poly = tp.addmm(gram, gram, gram, beta=b, alpha=c)
            x = tp.addmm(x, poly, x, beta=a)
        return x.T if tall else x


class Muon(_PerParameter):
    """Muon, PyTorch's (2-D parameters only; give the others to another optimizer)::

        buf = lerp(buf, g, 1 - momentum)
        u = lerp(g, buf, momentum)  (nesterov; else u = buf)
        u = orthogonalize(u)        (ns_steps Newton-Schulz steps with ns_coefficients)
        p = p * (1 - lr * weight_decay) - lr' * u

    where ``lr' = lr * sqrt(max(1, rows / cols))`` (``adjust_lr_fn`` None or "original") or
    ``0.2 * lr * sqrt(max(rows, cols))`` ("match_rms_adamw"). Its state has PyTorch's name,
    ``momentum_buffer``. The iteration runs in float32 where PyTorch's runs in bfloat16, so
    updates agree with PyTorch's to bfloat16's precision (about 1e-2), and closely with the
    same iteration in float32.

    >>> opt = pc.optim.Muon([layer.weight], lr=2e-2, momentum=0.95)
    """

    options = {"lr": _nonneg_option("lr"), "weight_decay": _nonneg_option("weight_decay"),
               "momentum": _nonneg_option("momentum"), "nesterov": _bool,
               "ns_coefficients": _coefficients, "eps": _nonneg_option("eps"),
               "ns_steps": _ns_steps, "adjust_lr_fn": _adjust_lr_fn}
    state_tensors = ("momentum_buffer",)

    def __init__(self, params, lr: float = 1e-3, weight_decay: float = 0.1,
                 momentum: float = 0.95, nesterov: bool = True,
                 ns_coefficients=(3.4445, -4.7750, 2.0315), eps: float = 1e-7,
                 ns_steps: int = 5, adjust_lr_fn: str | None = None):
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "momentum": momentum,
                                  "nesterov": nesterov, "ns_coefficients": ns_coefficients,
                                  "eps": eps, "ns_steps": ns_steps,
                                  "adjust_lr_fn": adjust_lr_fn})

    def _make_group(self, group, seen):
        made = super()._make_group(group, seen)
        for p in made["params"]:
            if len(p.shape) != 2:
                raise OptimizerError(f"Muon only updates 2-D parameters; got one of shape "
                                     f"{tuple(p.shape)} (give biases and norms to AdamW)")
        return made

    def _update(self, p, grad, state, opts, fresh):
        buf, mu, lr = state["momentum_buffer"], opts["momentum"], opts["lr"]
        with tp.no_grad():
            buf.copy_(tp.lerp(buf, grad, 1.0 - mu))
            u = tp.lerp(grad, buf, mu) if opts["nesterov"] else buf
            u = orthogonalize(u, opts["ns_coefficients"], opts["ns_steps"], opts["eps"])
        rows, cols = p.shape
        if opts["adjust_lr_fn"] == "match_rms_adamw":
            adjusted = lr * (0.2 * math.sqrt(max(rows, cols)))
        else:
            adjusted = lr * math.sqrt(max(1.0, rows / cols))
        ew.scale_(p.value, 1.0 - lr * opts["weight_decay"])
        ew.axpy(p.value, u, -adjusted)
