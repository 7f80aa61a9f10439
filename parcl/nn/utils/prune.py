"""Pruning, as ``torch.nn.utils.prune``: ``l1_unstructured``, ``random_unstructured``,
``ln_structured``, ``random_structured``, ``global_unstructured``, ``custom_from_mask``,
``identity``, ``remove`` and ``is_pruned``, with the method classes (``L1Unstructured``, ...,
``PruningContainer``) and PyTorch's names: the pruned Parameter becomes ``<name>_orig``, the
buffer ``<name>_mask`` (float32 0/1) is kept beside it, and ``module.<name>`` reads
``<name>_orig * <name>_mask`` (PyTorch computes it in a forward pre-hook; parcl's module gets
a same-named subclass whose attribute is a property, one class per layer class and names).

Pruning a pruned tensor again prunes among the entries still kept (PyTorch's
``PruningContainer``): an amount is a count, or a fraction of what is left. Masks are computed
on the host from the values read back once per call (a mask changes only when pruned);
``random_*`` draw from the seeded initialisation generator, not PyTorch's.

>>> fc = pc.nn.utils.prune.l1_unstructured(pc.nn.Linear(4, 2), "weight", amount=0.5)
>>> sorted(fc.state_dict())
['bias', 'weight_mask', 'weight_orig']
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable

import numpy as np

from ... import tape as tp
from ...errors import ParclError, ShapeError
from ...tensor import Tensor
from ..module import Module, default_generator
from .class_layers import set_layer

__all__ = ["BasePruningMethod", "CustomFromMask", "Identity", "L1Unstructured",
           "LnStructured", "PruningContainer", "PruningError", "RandomStructured",
           "RandomUnstructured",
           "custom_from_mask", "global_unstructured", "identity", "is_pruned",
           "l1_unstructured", "ln_structured", "random_structured", "random_unstructured",
           "remove"]


class PruningError(ParclError, ValueError):
    """A pruning amount or dim that does not fit the tensor, or a tensor not pruned."""


def _check_amount(amount) -> None:
    if isinstance(amount, bool) or not isinstance(amount, numbers.Real):
        raise PruningError(f"prune: amount must be an int or a float, got {amount!r}")
    if isinstance(amount, numbers.Integral) and amount < 0 or (
            not isinstance(amount, numbers.Integral) and not 0.0 <= float(amount) <= 1.0):
        raise PruningError(f"prune: amount={amount} should be a float in [0, 1] or an int "
                           ">= 0")


def _count(amount, size: int) -> int:
    """How many of ``size`` to prune: ``amount`` itself, or ``round(amount * size)``."""
    n = amount if isinstance(amount, numbers.Integral) else round(amount * size)
    if n > size:
        raise PruningError(f"prune: amount={amount} is more than the {size} entries to prune")
    return int(n)


def _dim(t: np.ndarray, dim: int) -> int:
    if t.ndim <= 1:
        raise ShapeError(f"prune: structured pruning needs a tensor of 2 or more dims, got "
                         f"shape {t.shape}")
    if not -t.ndim <= dim < t.ndim:
        raise ShapeError(f"prune: dim {dim} is out of range for shape {t.shape}")
    return dim % t.ndim


def _smallest(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` smallest values (ties: the first ones)."""
    return np.argsort(values, kind="stable")[:k]


class BasePruningMethod:
    """A pruning method: ``compute_mask(t, default_mask)`` (numpy arrays) gives the new mask;
    ``apply(module, name, ...)`` prunes ``module.<name>`` with it."""

    PRUNING_TYPE = "unstructured"
    _tensor_name: str | None = None

    def compute_mask(self, t: np.ndarray, default_mask: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def apply_mask(self, module: Module):
        """``<name>_orig * <name>_mask`` (differentiable in the original)."""
        return getattr(module, self._tensor_name + "_orig") * getattr(
            module, self._tensor_name + "_mask")

    @classmethod
    def apply(cls, module: Module, name: str, *args, importance_scores=None, **kwargs):
        """Prune ``module.<name>`` with ``cls(*args, **kwargs)`` (after any earlier pruning of
        it, through a ``PruningContainer``); ``importance_scores`` (a tensor of its shape)
        ranks the entries instead of their values."""
        method = cls(*args, **kwargs)
        method._tensor_name = name
        old = _methods(module).get(name)
        if old is not None:
            container = old if isinstance(old, PruningContainer) else PruningContainer(old)
            container.add_pruning_method(method)
            method = container
            default_mask = _host(getattr(module, name + "_mask"))
            orig = getattr(module, name + "_orig")
        else:
            orig = module._parameters.get(name)
            if orig is None:
                raise PruningError(f"prune: {type(module).__name__} has no parameter {name!r}")
            default_mask = np.ones(orig.shape, np.float32)
        # ranked by the tensor as it reads now (pruned entries 0), as PyTorch's
        with tp.no_grad():
            current = orig if old is None else old.apply_mask(module)
        scores = _host(current if importance_scores is None else importance_scores)
        if scores.shape != tuple(orig.shape):
            raise ShapeError(f"prune: importance_scores of shape {scores.shape} for "
                             f"{name!r} of shape {tuple(orig.shape)}")
        mask = np.asarray(method.compute_mask(scores, default_mask), np.float32)
        queue = orig.value.queue
        if old is None:
            delattr(module, name)
            module.register_parameter(name + "_orig", orig)
            module.register_buffer(name + "_mask", Tensor.from_host(queue, mask))
        else:
            getattr(module, name + "_mask").copy_(Tensor.from_host(queue, mask))
        methods = dict(_methods(module))
        methods[name] = method
        object.__setattr__(module, "_pruning_methods", methods)
        _swap(module)
        return method

    def remove(self, module: Module) -> None:
        """Make the pruning permanent: ``module.<name>`` a plain Parameter holding the pruned
        values (the original Parameter object, as PyTorch's)."""
        name = self._tensor_name
        with tp.no_grad():
            value = _value(self.apply_mask(module))
        orig = module._parameters[name + "_orig"]
        orig.value.copy_(value)
        delattr(module, name + "_orig")
        delattr(module, name + "_mask")
        methods = dict(_methods(module))
        del methods[name]
        object.__setattr__(module, "_pruning_methods", methods)
        _swap(module)
        module.register_parameter(name, orig)


class PruningContainer(BasePruningMethod):
    """The pruning methods applied to one tensor in turn; each new one prunes among the
    entries still kept (structured ones among the channels still kept)."""

    def __init__(self, *methods):
        self._pruning_methods: tuple = ()
        if len(methods) == 1:
            self._tensor_name = methods[0]._tensor_name
        for m in methods:
            self.add_pruning_method(m)

    def add_pruning_method(self, method) -> None:
        if not isinstance(method, BasePruningMethod):
            raise TypeError(f"{type(method).__name__} is not a BasePruningMethod")
        if self._tensor_name is not None and method._tensor_name != self._tensor_name:
            raise PruningError(f"PruningContainer: can only add methods acting on "
                               f"{self._tensor_name!r}, got one on {method._tensor_name!r}")
        self._pruning_methods += (method,)

    def __len__(self) -> int:
        return len(self._pruning_methods)

    def __iter__(self):
        return iter(self._pruning_methods)

    def __getitem__(self, i):
        return self._pruning_methods[i]

    def compute_mask(self, t, default_mask):
        method = self._pruning_methods[-1]
        mask = default_mask.astype(np.float32).copy()
        if method.PRUNING_TYPE == "unstructured":
            keep = mask == 1
            mask[keep] = method.compute_mask(t[keep], mask[keep])
        elif method.PRUNING_TYPE == "structured":
            dim = _dim(t, method.dim)
            others = tuple(d for d in range(t.ndim) if d != dim)
            kept = np.flatnonzero(mask.sum(axis=others) != 0)
            sub = np.take(t, kept, axis=dim)
            new = method.compute_mask(sub, np.take(mask, kept, axis=dim))
            index = [slice(None)] * t.ndim
            index[dim] = kept
            mask[tuple(index)] = new
        else:
            mask = method.compute_mask(t, mask)
        return mask


class Identity(BasePruningMethod):
    """Prunes nothing (the mask all ones): the reparametrisation alone."""

    def compute_mask(self, t, default_mask):
        return default_mask


class _Unstructured(BasePruningMethod):
    """Prunes the ``amount`` entries of smallest ``_scores(t)`` (flat; asked for only where
    any is pruned, so a random draw is taken only then)."""

    def __init__(self, amount):
        _check_amount(amount)
        self.amount = amount

    def compute_mask(self, t, default_mask):
        k = _count(self.amount, t.size)
        mask = default_mask.copy()
        if k:
            mask.reshape(-1)[_smallest(self._scores(t), k)] = 0
        return mask


class RandomUnstructured(_Unstructured):
    """Prunes ``amount`` entries chosen at random (the seeded initialisation generator)."""

    def _scores(self, t):
        return -default_generator().random(t.size)


class L1Unstructured(_Unstructured):
    """Prunes the ``amount`` entries of smallest magnitude."""

    def _scores(self, t):
        return np.abs(t).reshape(-1)


class _Structured(BasePruningMethod):
    """Prunes the ``amount`` channels along ``dim`` of smallest ``_channel_scores(t, dim)``
    (asked for only where any is pruned)."""

    PRUNING_TYPE = "structured"

    def compute_mask(self, t, default_mask):
        dim = _dim(t, self.dim)
        k = _count(self.amount, t.shape[dim])
        if not k:
            return default_mask
        keep = _smallest(-self._channel_scores(t, dim), t.shape[dim] - k)
        return _channels(t, dim, np.sort(keep), default_mask)


class RandomStructured(_Structured):
    """Prunes ``amount`` whole channels along ``dim`` chosen at random (seeded)."""

    def __init__(self, amount, dim: int = -1):
        _check_amount(amount)
        self.amount, self.dim = amount, dim

    def _channel_scores(self, t, dim: int):
        return default_generator().random(t.shape[dim])


class LnStructured(_Structured):
    """Prunes the ``amount`` channels along ``dim`` of smallest ``n``-norm."""

    def __init__(self, amount, n, dim: int = -1):
        _check_amount(amount)
        self.amount, self.n, self.dim = amount, n, dim

    def _channel_scores(self, t, dim: int):
        flat = np.moveaxis(t, dim, 0).reshape(t.shape[dim], -1).astype(np.float64)
        return np.linalg.norm(flat, ord=self.n, axis=1) if self.n not in ("fro", "nuc") \
            else np.linalg.norm(flat, axis=1)


def _channels(t, dim: int, keep: np.ndarray, default_mask) -> np.ndarray:
    mask = np.zeros(t.shape, np.float32)
    index = [slice(None)] * t.ndim
    index[dim] = keep
    mask[tuple(index)] = 1
    return mask * default_mask


class CustomFromMask(BasePruningMethod):
    """Prunes where ``mask`` is 0 (on top of any earlier mask)."""

    PRUNING_TYPE = "global"

    def __init__(self, mask):
        self.mask = _host(mask)

    def compute_mask(self, t, default_mask):
        if default_mask.shape != self.mask.shape:
            raise ShapeError(f"custom_from_mask: a mask of shape {self.mask.shape} for a "
                             f"tensor of shape {default_mask.shape}")
        return default_mask * self.mask


# -- the functions -----------------------------------------------------------------------------
def identity(module: Module, name: str) -> Module:
    """Reparametrise ``module.<name>`` as ``<name>_orig * <name>_mask`` with a mask of ones."""
    Identity.apply(module, name)
    return module


def random_unstructured(module: Module, name: str, amount) -> Module:
    """Prune ``amount`` (a count, or a fraction) of ``module.<name>``'s entries at random."""
    RandomUnstructured.apply(module, name, amount)
    return module


def l1_unstructured(module: Module, name: str, amount, importance_scores=None) -> Module:
    """Prune the ``amount`` (count or fraction) entries of ``module.<name>`` of smallest
    magnitude (or of smallest ``importance_scores``)."""
    L1Unstructured.apply(module, name, amount=amount, importance_scores=importance_scores)
    return module


def random_structured(module: Module, name: str, amount, dim: int) -> Module:
    """Prune ``amount`` channels along ``dim`` at random."""
    RandomStructured.apply(module, name, amount, dim)
    return module


def ln_structured(module: Module, name: str, amount, n, dim: int,
                  importance_scores=None) -> Module:
    """Prune the ``amount`` channels along ``dim`` of smallest ``n``-norm."""
    LnStructured.apply(module, name, amount, n, dim, importance_scores=importance_scores)
    return module


def custom_from_mask(module: Module, name: str, mask) -> Module:
    """Prune ``module.<name>`` where ``mask`` is 0."""
    CustomFromMask.apply(module, name, mask)
    return module


def global_unstructured(parameters: Iterable, pruning_method, importance_scores=None,
                        **kwargs) -> None:
    """Prune the ``(module, name)`` pairs together, as one vector: ``pruning_method``
    (an unstructured method class, e.g. ``L1Unstructured``, with ``amount=`` in ``kwargs``)
    chooses among all their entries still kept, then each gets its slice as a mask."""
    parameters = list(parameters)
    scores = importance_scores or {}
    values = [_host(scores.get((m, n), getattr(m, n))).reshape(-1) for m, n in parameters]
    masks = [(_host(getattr(m, n + "_mask")) if n in _methods(m)
              else np.ones(getattr(m, n).shape, np.float32)).reshape(-1)
             for m, n in parameters]
    method = pruning_method(**kwargs)
    if method.PRUNING_TYPE != "unstructured":
        raise PruningError(f"global_unstructured: {pruning_method.__name__} is "
                           f"{method.PRUNING_TYPE}; only unstructured methods prune globally")
    container = PruningContainer()
    container.add_pruning_method(method)
    final = container.compute_mask(np.concatenate(values), np.concatenate(masks))
    start = 0
    for (m, n), v in zip(parameters, values):
        custom_from_mask(m, n, final[start:start + v.size].reshape(getattr(m, n).shape))
        start += v.size


def remove(module: Module, name: str) -> Module:
    """Make the pruning of ``module.<name>`` permanent (a plain Parameter again)."""
    method = _methods(module).get(name)
    if method is None:
        raise PruningError(f"prune.remove: parameter {name!r} of {type(module).__name__} has "
                           "to be pruned before pruning can be removed")
    method.remove(module)
    return module


def is_pruned(module: Module) -> bool:
    """Whether ``module`` or a module inside it has a pruned tensor."""
    return any(_methods(m) for m in module.modules())


# -- the module's class ------------------------------------------------------------------------
def _methods(module: Module) -> dict:
    return module.__dict__.get("_pruning_methods", {})


def _swap(module: Module) -> None:
    """Give ``module`` a class layer with a property per pruned name (none where none is)."""
    names = frozenset(_methods(module))
    if not names:
        module.__dict__.pop("_pruning_methods", None)
    set_layer(module, "prune", names or None, _make_class)


def _make_class(base: type, names: frozenset) -> type:
    body = {"__module__": base.__module__, "__qualname__": base.__qualname__}
    for n in names:
        body[n] = property(lambda self, n=n: _methods(self)[n].apply_mask(self))
    return type(base.__name__, (base,), body)


def _host(t) -> np.ndarray:
    if isinstance(t, np.ndarray):
        return t.astype(np.float32, copy=False)
    value = t if isinstance(t, Tensor) else getattr(t, "value", None)
    if isinstance(value, Tensor):
        return value.to_host()
    return np.asarray(t, np.float32)


def _value(t) -> Tensor:
    return t if isinstance(t, Tensor) else t.value
