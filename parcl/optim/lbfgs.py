"""``LBFGS``, PyTorch's limited-memory BFGS: ``step(closure)`` runs up to ``max_iter``
iterations, each a two-loop recursion over the last ``history_size`` steps, then a fixed step
(``lr``) or a strong-Wolfe line search, re-evaluating the loss and gradients through the
closure.

The flat gradient, direction and history are device tensors on the parameters' queue; the
dot products the recursion needs are read back as float32 numbers and the scalar arithmetic
follows PyTorch's float32 0-d tensors (numpy's float32 scalars promote as they do), so the
iterates follow PyTorch's to float32 rounding. As PyTorch's, it takes one parameter group and
keeps its state under the first parameter.

>>> opt = pc.optim.LBFGS(model.parameters(), lr=1, line_search_fn="strong_wolfe")
>>> def closure():
...     opt.zero_grad()
...     with tp.Tape() as tape:
...         loss = tp.mse_loss(model(x), y)
...     tape.backward(loss)
...     return loss
>>> opt.step(closure)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import tape as tp
from ..kernels import elementwise as ew
from ..tape.changes import changed
from ..tensor import Tensor
from .checks import _nonneg_option
from .optimizer import Optimizer, OptimizerError

__all__ = ["LBFGS"]

_f32 = np.float32


def _count(name: str):
    def check(value) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise OptimizerError(f"invalid {name}: {value!r} (an int >= 1)")
        return int(value)
    return check


def _line_search(value):
    if value not in (None, "strong_wolfe"):
        raise OptimizerError(f"line_search_fn must be None or 'strong_wolfe', got {value!r}")
    return value


def _number(loss) -> float:
    return float(loss.item()) if hasattr(loss, "item") else float(loss)


def _dot(a: Tensor, b: Tensor) -> np.float32:
    with tp.no_grad():
        return _f32((a * b).sum().item())


def _abs_max(a: Tensor) -> np.float32:
    with tp.no_grad():
        return _f32(tp.abs(a).max().item())


def _cubic_min(x1, f1, g1, x2, f2, g2, bounds=None):
    """The minimiser of the cubic through (x1, f1, g1) and (x2, f2, g2), clamped to
    ``bounds`` (default: the interval between them); their midpoint where it has none."""
    lo, hi = bounds if bounds is not None else ((x1, x2) if x1 <= x2 else (x2, x1))
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
    disc = d1 ** 2 - g1 * g2
    if not disc >= 0:
        # no real minimiser, or a NaN (a trial step whose loss overflowed gave a NaN
        # gradient): bisect, as PyTorch's (its ``d2_square >= 0`` is False for a NaN)
        return (lo + hi) / 2.0
    d2 = np.sqrt(disc)
    if x1 <= x2:
        at = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
    else:
        at = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
    return min(max(at, lo), hi)


def _strong_wolfe(evaluate, t, d, f, g, gtd, *, c1=1e-4, c2=0.9, tolerance_change=1e-9,
                  max_ls=25):
    """A step length along ``d`` meeting the strong Wolfe conditions (sufficient decrease
    ``c1``, curvature ``c2``): bracket, then zoom by cubic interpolation, as PyTorch's (from
    minFunc). ``evaluate(t)`` gives (loss, flat gradient) at ``x + t d``. Returns (loss,
    gradient, t, evaluations)."""
    d_norm = _abs_max(d)
    f_new, g_new = evaluate(t)
    evals, it = 1, 0
    gtd_new = _dot(g_new, d)
    t_prev, f_prev, g_prev, gtd_prev = 0, f, g, gtd
    done = False
    bracket = None
    while it < max_ls:
        if f_new > (f + c1 * t * gtd) or (it > 1 and f_new >= f_prev):
            bracket = [[t_prev, f_prev, g_prev, gtd_prev], [t, f_new, g_new, gtd_new]]
            break
        if abs(gtd_new) <= -c2 * gtd:
            bracket, done = [[t, f_new, g_new, gtd_new]], True
            break
        if gtd_new >= 0:
            bracket = [[t_prev, f_prev, g_prev, gtd_prev], [t, f_new, g_new, gtd_new]]
            break
        # extrapolate: the cubic's minimiser, at least 1% further, at most ten times as far
        t_next = _cubic_min(t_prev, f_prev, gtd_prev, t, f_new, gtd_new,
                            bounds=(t + 0.01 * (t - t_prev), t * 10))
        t_prev, f_prev, g_prev, gtd_prev = t, f_new, g_new, gtd_new
        t = t_next
        f_new, g_new = evaluate(t)
        evals += 1
        gtd_new = _dot(g_new, d)
        it += 1
    if it == max_ls:
        bracket = [[0, f, g, None], [t, f_new, g_new, None]]

    # zoom: shrink the bracket around a point meeting both conditions
    insufficient = False
    low, high = (0, 1) if bracket[0][1] <= bracket[-1][1] else (1, 0)
    while not done and it < max_ls:
        if abs(bracket[1][0] - bracket[0][0]) * d_norm < tolerance_change:
            break
        t = _cubic_min(bracket[0][0], bracket[0][1], bracket[0][3],
                       bracket[1][0], bracket[1][1], bracket[1][3])
        top, bottom = max(bracket[0][0], bracket[1][0]), min(bracket[0][0], bracket[1][0])
        eps = 0.1 * (top - bottom)
        if min(top - t, t - bottom) < eps:
            # near an end: a second time in a row (or beyond it), step 10% inside instead
            if insufficient or t >= top or t <= bottom:
                t = top - eps if abs(t - top) < abs(t - bottom) else bottom + eps
                insufficient = False
            else:
                insufficient = True
        else:
            insufficient = False
        f_new, g_new = evaluate(t)
        evals += 1
        gtd_new = _dot(g_new, d)
        it += 1
        if f_new > (f + c1 * t * gtd) or f_new >= bracket[low][1]:
            bracket[high] = [t, f_new, g_new, gtd_new]
            low, high = (0, 1) if bracket[0][1] <= bracket[1][1] else (1, 0)
        else:
            if abs(gtd_new) <= -c2 * gtd:
                done = True
            elif gtd_new * (bracket[high][0] - bracket[low][0]) >= 0:
                bracket[high] = list(bracket[low])
            bracket[low] = [t, f_new, g_new, gtd_new]
    t, f_new, g_new, _ = bracket[low]
    return f_new, g_new, t, evals


class LBFGS(Optimizer):
    """L-BFGS, PyTorch's: ``step(closure)`` (the closure zeroes the gradients, evaluates the
    loss, runs the backward and returns the loss) iterates up to ``max_iter`` times and at
    most ``max_eval`` evaluations (``max_iter * 5 // 4`` by default), stopping early where the
    largest gradient element is <= ``tolerance_grad`` or the loss, the step or the
    directional derivative changes by less than ``tolerance_change``. It returns the loss of
    the closure's first evaluation.

    Its state (under the first parameter, as PyTorch's) has PyTorch's names: ``func_evals``,
    ``n_iter``, ``d``, ``t``, ``old_dirs``, ``old_stps``, ``ro``, ``H_diag``,
    ``prev_flat_grad``, ``prev_loss`` and ``al``.

    >>> opt = pc.optim.LBFGS(model.parameters(), history_size=10, max_iter=4)
    """

    options = {"lr": _nonneg_option("lr"), "max_iter": _count("max_iter"),
               "max_eval": _count("max_eval"),
               "tolerance_grad": _nonneg_option("tolerance_grad"),
               "tolerance_change": _nonneg_option("tolerance_change"),
               "history_size": _count("history_size"), "line_search_fn": _line_search}
    _numbers = ("func_evals", "n_iter", "t", "H_diag", "prev_loss")
    _lists = ("old_dirs", "old_stps", "ro", "al")
    _vectors = ("d", "prev_flat_grad")

    def __init__(self, params, lr: float = 1, max_iter: int = 20, max_eval: int | None = None,
                 tolerance_grad: float = 1e-7, tolerance_change: float = 1e-9,
                 history_size: int = 100, line_search_fn: str | None = None):
        if max_eval is None and isinstance(max_iter, int):
            max_eval = max_iter * 5 // 4
        super().__init__(params, {"lr": lr, "max_iter": max_iter, "max_eval": max_eval,
                                  "tolerance_grad": tolerance_grad,
                                  "tolerance_change": tolerance_change,
                                  "history_size": history_size,
                                  "line_search_fn": line_search_fn})
        if len(self.param_groups) != 1:
            raise OptimizerError("LBFGS takes one parameter group (no per-parameter options), "
                                 f"got {len(self.param_groups)}")

    def add_param_group(self, param_group):
        raise OptimizerError("LBFGS takes one parameter group; it cannot add another")

    # -- the parameters as one flat vector ---------------------------------------------------
    def _flat_grad(self) -> Tensor:
        parts = []
        for p in self._params():
            g = p.grad if p.grad is not None else Tensor.zeros(p.value.queue, p.shape)
            parts.append(g.reshape(-1))
        with tp.no_grad():
            return tp.cat(parts) if len(parts) > 1 else parts[0].copy()

    def _add(self, t, d: Tensor) -> None:
        """Every parameter += t * its slice of ``d``."""
        off = 0
        with tp.no_grad():
            for p in self._params():
                n = p.value.size
                ew.axpy(p.value, tp.narrow(d, 0, off, n), t)
                off += n
        changed(self._params())

    def _evaluate(self, closure, x: list[Tensor], t, d: Tensor):
        """(loss, flat gradient) at ``x + t d``; the parameters are ``x`` again after."""
        self._add(t, d)
        loss = _number(closure())
        g = self._flat_grad()
        for p, v in zip(self._params(), x):
            p.value.copy_(v)
        changed(self._params())
        return loss, g

    # -- stepping ----------------------------------------------------------------------------
    @property
    def plannable(self) -> bool:
        return False

    def step(self, closure=None):
        """Up to ``max_iter`` L-BFGS iterations; ``closure`` re-evaluates the loss and the
        gradients (it must run the backward); returns its first loss."""
        if closure is None:
            raise OptimizerError("LBFGS.step needs a closure that zeroes the gradients, "
                                 "evaluates the loss, runs the backward and returns the loss "
                                 "(a ReplicaGroup's step gives it none: LBFGS re-evaluates "
                                 "the loss several times per step, so run it on one replica)")
        # Every evaluation records, as PyTorch's (torch.enable_grad()(closure)): a step under
        # no_grad would otherwise find no graph to backward.
        closure = tp.enable_grad()(closure)
        group = self.param_groups[0]
        opts = self._validate_options(group, made=False)
        lr, max_iter, max_eval = opts["lr"], opts["max_iter"], opts["max_eval"]
        tol_grad, tol_change = opts["tolerance_grad"], opts["tolerance_change"]
        history = opts["history_size"]
        state = self.state.setdefault(self._params()[0], {})
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)

        first = closure()
        loss = _number(first)
        evals = 1
        state["func_evals"] += 1
        g = self._flat_grad()
        if _abs_max(g) <= tol_grad:
            return first
        d, t = state.get("d"), state.get("t")
        dirs, stps, ro = state.get("old_dirs"), state.get("old_stps"), state.get("ro")
        h_diag, prev_g = state.get("H_diag"), state.get("prev_flat_grad")
        prev_loss = state.get("prev_loss")
        done = False
        n = 0
        while n < max_iter:
            n += 1
            state["n_iter"] += 1
            if state["n_iter"] == 1:
                with tp.no_grad():
                    d = -g
                dirs, stps, ro, h_diag = [], [], [], 1
            else:
                d = self._direction(g, prev_g, d, t, dirs, stps, ro, h_diag, history, state)
                h_diag = state["H_diag"]
            if prev_g is None:
                prev_g = g.copy()
            else:
                prev_g.copy_(g)
            prev_loss = loss
            if state["n_iter"] == 1:
                t = min(1.0, _f32(1.0) / _f32(_abs_sum(g))) * lr
            else:
                t = lr
            gtd = _dot(g, d)
            if gtd > -tol_change:
                break
            used = 0
            if opts["line_search_fn"] == "strong_wolfe":
                x = [p.value.copy() for p in self._params()]
                loss, g, t, used = _strong_wolfe(
                    lambda s, x=x, d=d: self._evaluate(closure, x, s, d), t, d, loss, g, gtd,
                    tolerance_change=1e-9, max_ls=max_eval - evals)
                self._add(t, d)
                done = _abs_max(g) <= tol_grad
            else:
                self._add(t, d)
                if n != max_iter:
                    # the last iteration does not re-evaluate: its loss would be unused
                    loss = _number(closure())
                    g = self._flat_grad()
                    done = _abs_max(g) <= tol_grad
                    used = 1
            evals += used
            state["func_evals"] += used
            if n == max_iter or evals >= max_eval or done:
                break
            with tp.no_grad():
                if _abs_max(d * float(t)) <= tol_change:
                    break
            if abs(loss - prev_loss) < tol_change:
                break
        state.update({"d": d, "t": t, "old_dirs": dirs, "old_stps": stps, "ro": ro,
                      "H_diag": h_diag, "prev_flat_grad": prev_g, "prev_loss": prev_loss})
        return first

    @staticmethod
    def _direction(g, prev_g, d, t, dirs, stps, ro, h_diag, history, state) -> Tensor:
        """The two-loop recursion: ``-H g`` for the inverse Hessian estimate of the history,
        after adding the last step to it where its curvature ``y.s`` is > 1e-10."""
        with tp.no_grad():
            y = g - prev_g
            s = d * float(t)
        ys = _dot(y, s)
        if ys > 1e-10:
            if len(dirs) == history:
                dirs.pop(0)
                stps.pop(0)
                ro.pop(0)
            dirs.append(y)
            stps.append(s)
            ro.append(_f32(1.0) / ys)
            h_diag = ys / _dot(y, y)
        state["H_diag"] = h_diag
        al = state.setdefault("al", [None] * history)
        with tp.no_grad():
            q = -g
            for i in range(len(dirs) - 1, -1, -1):
                al[i] = _dot(stps[i], q) * ro[i]
                ew.axpy(q, dirs[i], float(-al[i]))
            r = q * float(h_diag)
            for i in range(len(dirs)):
                be = _dot(dirs[i], r) * ro[i]
                ew.axpy(r, stps[i], float(al[i] - be))
        return r

    # -- state dicts: numbers, device vectors and lists of both ------------------------------
    def state_dict(self) -> dict[str, Any]:
        out = super().state_dict()
        for entry in out["state"].values():
            for k, v in entry.items():
                if isinstance(v, list):
                    entry[k] = [x.to_host() if isinstance(x, Tensor) else x for x in v]
        return out

    def _check_entry(self, name, key, entry, p) -> dict[str, Any]:
        """A saved entry as host values: vectors (``d``, ``prev_flat_grad``) and lists of them
        (``old_dirs``, ``old_stps``) as float32 arrays of the parameters' total size, the
        counts as they are, the other numbers as float32 (PyTorch's 0-d tensors)."""
        if not isinstance(entry, dict):
            raise OptimizerError(f"{name}: state[{key!r}] is not a dict")
        known = set(self._numbers) | set(self._lists) | set(self._vectors)
        unknown = set(entry) - known
        if unknown:
            raise OptimizerError(f"{name}: state[{key!r}] has entries {sorted(unknown)}, which "
                                 f"LBFGS does not keep ({sorted(known)})")
        size = sum(q.value.size for q in self._params())

        def vector(k, x):
            a = np.asarray(x, np.float32)
            if a.shape != (size,):
                raise OptimizerError(f"{name}: state[{key!r}][{k!r}] holds a vector of shape "
                                     f"{a.shape}; the parameters have {size} elements")
            return a

        out: dict[str, Any] = {}
        for k, v in entry.items():
            if v is None:
                continue
            if k in self._vectors:
                out[k] = vector(k, v)
            elif k in ("old_dirs", "old_stps"):
                out[k] = [vector(k, x) for x in v]
            elif k in ("ro", "al"):
                out[k] = [None if x is None else _f32(x) for x in v]
            elif k in ("func_evals", "n_iter"):
                out[k] = int(v)
            else:
                out[k] = _f32(v)
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        queue = self._params()[0].value.queue
        for entry in self.state.values():
            for k in ("old_dirs", "old_stps"):
                if k in entry:
                    entry[k] = [Tensor.from_host(queue, a) for a in entry[k]]


def _abs_sum(a: Tensor) -> float:
    with tp.no_grad():
        return float(tp.abs(a).sum().item())
