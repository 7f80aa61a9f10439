"""PyTorch's older weight and spectral normalisation, ``torch.nn.utils.weight_norm`` /
``remove_weight_norm`` and ``spectral_norm`` / ``remove_spectral_norm`` (superseded there by
``parametrizations``, still in many models and checkpoints), with PyTorch's state-dict keys:

* weight norm: the module holds ``weight_g`` and ``weight_v`` and its weight is
  ``g * v / ||v||``, recomputed at each read (PyTorch recomputes it before each forward);
* spectral norm: the module holds ``weight_orig`` and the buffers ``weight_u``, ``weight_v``;
  each call in training mode first takes ``n_power_iterations`` power-iteration steps (``v``
  then ``u``, as PyTorch's forward pre-hook), and the weight read is ``weight_orig / sigma``,
  ``sigma = u . (W v)``.

The module's class is swapped for a subclass of the same name whose attribute is a property
(parcl's modules have no hooks); one class per layer class and attribute set, so every replica
of a model has the same classes.

>>> conv = pc.nn.utils.weight_norm(pc.nn.Conv1d(2, 3, 2))
>>> sorted(conv.state_dict())
['bias', 'weight_g', 'weight_v']
"""

from __future__ import annotations

import warnings

from ... import tape as tp
from ...errors import ParclError, ShapeError
from ...tape import mode
from ..module import Module, Parameter
from .class_layers import set_layer
from .parametrizations import _norm_except
from .spectral import as_matrix, default_dim, divided_by_sigma, power_iteration, start_vectors

__all__ = ["remove_spectral_norm", "remove_weight_norm", "spectral_norm", "weight_norm"]


def _weight(module: Module, name: str):
    g, v = getattr(module, name + "_g"), getattr(module, name + "_v")
    return v * (g / _norm_except(v, module._weight_norm_dims[name]))


def _spectral_weight(module: Module, name: str):
    w = getattr(module, name + "_orig")
    return divided_by_sigma(w, as_matrix(w, module._spectral_norm_options[name]["dim"]),
                            getattr(module, name + "_u"), getattr(module, name + "_v"))


def _power_iteration(module: Module, name: str) -> None:
    """``n_power_iterations`` steps on the buffers, ``v`` before ``u`` (PyTorch's old hook's
    order)."""
    sn = module._spectral_norm_options[name]
    power_iteration(as_matrix(getattr(module, name + "_orig").value, sn["dim"]),
                    getattr(module, name + "_u"), getattr(module, name + "_v"),
                    sn["n_power_iterations"], sn["eps"], v_first=True)


def _names(module: Module, kind: str) -> frozenset:
    return getattr(type(module), kind, frozenset())


def _swap(module: Module, weight_norms: frozenset, spectral_norms: frozenset) -> None:
    """Give ``module`` a class layer with these attributes computed (none where none is)."""
    key = (weight_norms, spectral_norms) if weight_norms or spectral_norms else None
    set_layer(module, "legacy_norm", key, _make_class)


def _make_class(base: type, key: tuple) -> type:
    weight_norms, spectral_norms = key
    body = {"_weight_norm_names": weight_norms,
            "_spectral_norm_names": spectral_norms, "__module__": base.__module__,
            "__qualname__": base.__qualname__}
    for n in weight_norms:
        body[n] = property(lambda self, n=n: _weight(self, n))
    for n in spectral_norms:
        body[n] = property(lambda self, n=n: _spectral_weight(self, n))
    if spectral_norms:
        def __call__(self, *args, **kwargs):        # PyTorch's forward pre-hook
            if self.training and not mode.state.recompute:   # tp.checkpoint's second run:
                for n in type(self)._spectral_norm_names:     # the forward's u and v
                    _power_iteration(self, n)
            return base.__call__(self, *args, **kwargs)
        body["__call__"] = __call__
    return type(base.__name__, (base,), body)


def _options(module: Module, attr: str) -> dict:
    return dict(getattr(module, attr, {}))


def _set_options(module: Module, attr: str, options: dict) -> None:
    if options:
        object.__setattr__(module, attr, options)
    elif attr in module.__dict__:
        object.__delattr__(module, attr)


def _parameter(op: str, module: Module, name: str):
    if name in _names(module, "_weight_norm_names") | _names(module, "_spectral_norm_names"):
        raise ParclError(f"{op}: {type(module).__name__}.{name} is normalised already")
    weight = module._parameters.get(name)
    if weight is None:
        raise ParclError(f"{op}: {type(module).__name__} has no parameter {name!r}")
    return weight


def weight_norm(module: Module, name: str = "weight", dim: int | None = 0) -> Module:
    """Weight normalisation of ``module.<name>``, PyTorch's older API: the Parameter is
    replaced by ``<name>_g`` (its norm over every dim but ``dim``; ``dim=None`` one norm for
    the whole tensor) and ``<name>_v`` (the weight itself); reading ``module.<name>`` gives
    ``g * v / ||v||``. Both are new Parameters, trained even where the weight was frozen (as
    PyTorch's). PyTorch warns that it is deprecated; so does this (FutureWarning).
    Returns ``module``."""
    warnings.warn("pc.nn.utils.weight_norm is deprecated in favor of "
                  "pc.nn.utils.parametrizations.weight_norm (as PyTorch's)", FutureWarning,
                  stacklevel=2)
    weight = _parameter("weight_norm", module, name)
    ndim = len(weight.shape)
    if dim is None:
        dim = -1
    elif dim != -1:
        if not -ndim <= dim < ndim:
            raise ShapeError(f"weight_norm: dim {dim} is out of range for {name!r} of shape "
                             f"{tuple(weight.shape)}")
        dim = dim % ndim
    with tp.no_grad():
        g = _norm_except(weight.value, dim)
    delattr(module, name)
    # new Parameters, trained even where the weight was frozen, as PyTorch's
    module.register_parameter(name + "_g", Parameter(g))
    module.register_parameter(name + "_v", Parameter(weight.value.copy()))
    dims = _options(module, "_weight_norm_dims")
    dims[name] = dim
    _set_options(module, "_weight_norm_dims", dims)
    _swap(module, _names(module, "_weight_norm_names") | {name},
          _names(module, "_spectral_norm_names"))
    return module


def remove_weight_norm(module: Module, name: str = "weight") -> Module:
    """Undo ``weight_norm``: ``module.<name>`` is a plain Parameter again, holding the current
    ``g * v / ||v||``; ``<name>_g`` and ``<name>_v`` are gone. Returns ``module``."""
    names = _names(module, "_weight_norm_names")
    if name not in names:
        raise ParclError(f"remove_weight_norm: weight_norm of {name!r} not found in "
                         f"{type(module).__name__}")
    with tp.no_grad():
        value = _weight(module, name)
    delattr(module, name + "_g")
    delattr(module, name + "_v")
    dims = _options(module, "_weight_norm_dims")
    del dims[name]
    _set_options(module, "_weight_norm_dims", dims)
    _swap(module, names - {name}, _names(module, "_spectral_norm_names"))
    module.register_parameter(name, Parameter(value.copy()))    # trained, as PyTorch's
    return module


def spectral_norm(module: Module, name: str = "weight", n_power_iterations: int = 1,
                  eps: float = 1e-12, dim: int | None = None) -> Module:
    """Spectral normalisation of ``module.<name>``, PyTorch's older API: the Parameter becomes
    ``<name>_orig``, with buffers ``<name>_u`` and ``<name>_v`` (normalised draws from the
    seeded generator); each call in training mode first takes ``n_power_iterations``
    power-iteration steps, and ``module.<name>`` reads ``<name>_orig / sigma``. ``dim``
    defaults to 1 for transposed convolutions, else 0. Returns ``module``."""
    weight = _parameter("spectral_norm", module, name)
    if isinstance(n_power_iterations, bool) or not isinstance(n_power_iterations, int) \
            or n_power_iterations <= 0:
        raise ParclError(f"spectral_norm: n_power_iterations must be a positive int, got "
                         f"{n_power_iterations!r}")
    ndim = len(weight.shape)
    if dim is None:
        dim = default_dim(module)
    if not -ndim <= dim < ndim:
        raise ShapeError(f"spectral_norm: dim {dim} is out of range for {name!r} of shape "
                         f"{tuple(weight.shape)}")
    dim %= ndim
    u, v = start_vectors(weight.value.queue, as_matrix(weight.value, dim).shape, eps)
    delattr(module, name)
    module.register_parameter(name + "_orig", weight)
    module.register_buffer(name + "_u", u)
    module.register_buffer(name + "_v", v)
    options = _options(module, "_spectral_norm_options")
    options[name] = {"n_power_iterations": n_power_iterations, "dim": dim, "eps": float(eps)}
    _set_options(module, "_spectral_norm_options", options)
    _swap(module, _names(module, "_weight_norm_names"),
          _names(module, "_spectral_norm_names") | {name})
    return module


def remove_spectral_norm(module: Module, name: str = "weight") -> Module:
    """Undo ``spectral_norm``: ``module.<name>`` is a plain Parameter holding
    ``<name>_orig / sigma`` (no further power iteration); the original and the buffers are
    gone. Returns ``module``."""
    names = _names(module, "_spectral_norm_names")
    if name not in names:
        raise ParclError(f"remove_spectral_norm: spectral_norm of {name!r} not found in "
                         f"{type(module).__name__}")
    with tp.no_grad():
        value = _spectral_weight(module, name)
    for suffix in ("_orig", "_u", "_v"):
        delattr(module, name + suffix)
    options = _options(module, "_spectral_norm_options")
    del options[name]
    _set_options(module, "_spectral_norm_options", options)
    _swap(module, _names(module, "_weight_norm_names"), names - {name})
    module.register_parameter(name, Parameter(value.copy()))    # trained, as PyTorch's
    return module
