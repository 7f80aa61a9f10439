"""``weight_norm`` and ``spectral_norm`` as ``torch.nn.utils.parametrizations``' (the
parametrization API; see ``parcl.nn.utils.parametrize``): the module's weight is recomputed
from its originals at every read, so gradients reach them, with PyTorch's state-dict keys.

>>> lin = pc.nn.utils.parametrizations.weight_norm(pc.nn.Linear(3, 4))
>>> sorted(lin.state_dict())
['bias', 'parametrizations.weight.original0', 'parametrizations.weight.original1']
"""

from __future__ import annotations

from ... import tape as tp
from ...errors import ParclError, ShapeError
from ...tape import mode
from ...tensor import Tensor
from ..module import Module
from .parametrize import is_parametrized, register_parametrization
from .spectral import as_matrix, default_dim, divided_by_sigma, power_iteration, start_vectors

__all__ = ["spectral_norm", "weight_norm"]


def _norm_except(v, dim: int):
    """The 2-norm of ``v`` over every dim but ``dim`` (kept as 1s), or over all of it for
    ``dim == -1`` (a 0-d result), as PyTorch's ``norm_except_dim``."""
    if dim == -1:
        return tp.linalg_vector_norm(v)
    others = tuple(d for d in range(len(v.shape)) if d != dim)
    return tp.linalg_vector_norm(v, dim=others, keepdim=True) if others else tp.abs(v)


class _WeightNorm(Module):
    """``weight = g * v / ||v||`` (the norm over every dim but ``dim``)."""

    def __init__(self, dim: int | None = 0):
        super().__init__()
        self.dim = -1 if dim is None else dim

    def forward(self, weight_g, weight_v):
        return weight_v * (weight_g / _norm_except(weight_v, self.dim))

    def right_inverse(self, weight):
        w = weight.value if not isinstance(weight, Tensor) else weight
        return _norm_except(w, self.dim), w


def weight_norm(module: Module, name: str = "weight", dim: int | None = 0) -> Module:
    """Weight normalisation of ``module.<name>``, as PyTorch's: the originals are
    ``original0``, the magnitude ``g = ||w||`` over every dim but ``dim`` (shape ``(out, 1, ..)``
    for ``dim=0``), and ``original1``, the direction ``v = w``; the weight read is
    ``g * v / ||v||``. ``dim=None`` (and, as in PyTorch, ``dim=-1``) normalises the whole
    tensor with one ``g``. Returns ``module``.

    >>> conv = pc.nn.utils.parametrizations.weight_norm(pc.nn.Conv2d(3, 8, 3))
    >>> conv.parametrizations.weight.original0.shape
    (8, 1, 1, 1)
    """
    weight = module._parameters.get(name)
    if weight is None:
        raise ParclError(f"weight_norm: {type(module).__name__} has no parameter {name!r}")
    ndim = len(weight.shape)
    if dim is not None and dim != -1:
        if not -ndim <= dim < ndim:
            raise ShapeError(f"weight_norm: dim {dim} is out of range for {name!r} of shape "
                             f"{tuple(weight.shape)}")
        dim = dim % ndim
    return register_parametrization(module, name, _WeightNorm(dim), unsafe=True)


class _SpectralNorm(Module):
    """``weight / sigma``, ``sigma`` the largest singular value of the weight as a matrix
    (``dim`` first, the rest flattened), estimated by power iteration on the buffers ``_u``
    and ``_v``: ``n_power_iterations`` more steps at each read in training, none in
    evaluation. A 1-D weight is normalised instead."""

    def __init__(self, weight: Tensor, n_power_iterations: int = 1, dim: int = 0,
                 eps: float = 1e-12):
        super().__init__()
        ndim = len(weight.shape)
        if not -ndim <= dim < ndim:
            raise ShapeError(f"spectral_norm: dim {dim} is out of range for a weight of shape "
                             f"{tuple(weight.shape)}")
        if not isinstance(n_power_iterations, int) or n_power_iterations <= 0:
            raise ParclError(f"spectral_norm: n_power_iterations must be a positive int, got "
                             f"{n_power_iterations!r}")
        self.dim = dim % ndim
        self.eps = float(eps)
        if ndim > 1:
            self.n_power_iterations = n_power_iterations
            mat = as_matrix(weight, self.dim)
            u, v = start_vectors(weight.queue, mat.shape, self.eps)
            self.register_buffer("_u", u)
            self.register_buffer("_v", v)
            power_iteration(mat, self._u, self._v, 15, self.eps)

    def forward(self, weight):
        if len(weight.shape) == 1:
            return tp.normalize(weight, dim=0, eps=self.eps)
        mat = as_matrix(weight, self.dim)
        # once per forward: tp.checkpoint's second run reads the forward's u and v
        if self.training and not mode.state.recompute:
            power_iteration(mat, self._u, self._v, self.n_power_iterations, self.eps)
        return divided_by_sigma(weight, mat, self._u, self._v)

    def right_inverse(self, value):
        return value


def spectral_norm(module: Module, name: str = "weight", n_power_iterations: int = 1,
                  eps: float = 1e-12, dim: int | None = None) -> Module:
    """Spectral normalisation of ``module.<name>``, as PyTorch's: the weight read is the
    original divided by its largest singular value, estimated by ``n_power_iterations`` steps
    of power iteration per read in training mode (``u`` and ``v`` start from the seeded
    generator and take 15 steps at registration). ``dim`` defaults to 1 for transposed
    convolutions, else 0. State-dict keys ``parametrizations.weight.original``,
    ``parametrizations.weight.0._u`` and ``._v``. Returns ``module``.

    >>> lin = pc.nn.utils.parametrizations.spectral_norm(pc.nn.Linear(3, 4))
    """
    if is_parametrized(module, name):
        # normalised as it reads now, after its parametrizations (PyTorch's reads the attribute)
        with tp.no_grad():
            weight = getattr(module, name)
    else:
        weight = module._parameters.get(name)
    if weight is None:
        raise ParclError(f"spectral_norm: {type(module).__name__} has no parameter {name!r}")
    if dim is None:
        dim = default_dim(module)
    value = weight if isinstance(weight, Tensor) else weight.value
    return register_parametrization(
        module, name, _SpectralNorm(value, n_power_iterations, dim, eps))
