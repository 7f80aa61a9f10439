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
from ..conv import ConvTranspose1d, ConvTranspose2d
from ..conv3d import ConvTranspose3d
from ..module import Module, normal_
from .parametrize import is_parametrized, register_parametrization

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
            mat = self._matrix(weight)
            h, w = mat.shape
            q = weight.queue
            with tp.no_grad():
                u = tp.normalize(Tensor.from_host(q, normal_((h,), 1.0)), dim=0, eps=self.eps)
                v = tp.normalize(Tensor.from_host(q, normal_((w,), 1.0)), dim=0, eps=self.eps)
            self.register_buffer("_u", u)
            self.register_buffer("_v", v)
            self._power_method(mat, 15)

    def _matrix(self, weight):
        if self.dim != 0:
            order = (self.dim,) + tuple(d for d in range(len(weight.shape)) if d != self.dim)
            weight = tp.permute(weight, order)
        return tp.reshape(weight, (weight.shape[0], -1))

    def _power_method(self, mat, iterations: int) -> None:
        """``u = normalize(W v)``, ``v = normalize(W^T u)``, ``iterations`` times, in place."""
        with tp.no_grad():
            m = mat.value if not isinstance(mat, Tensor) else mat
            for _ in range(iterations):
                self._u.copy_(tp.normalize(tp.matmul(m, self._v), dim=0, eps=self.eps))
                self._v.copy_(tp.normalize(tp.matmul(tp.t(m), self._u), dim=0, eps=self.eps))

    def forward(self, weight):
        if len(weight.shape) == 1:
            return tp.normalize(weight, dim=0, eps=self.eps)
        mat = self._matrix(weight)
        if self.training and not mode.state.recompute:    # tp.checkpoint's second run: the
            self._power_method(mat, self.n_power_iterations)   # forward's u and v, once
        u, v = self._u.copy(), self._v.copy()
        sigma = tp.sum(u * tp.matmul(mat, v))
        return weight / sigma

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
        dim = 1 if isinstance(module, (ConvTranspose1d, ConvTranspose2d, ConvTranspose3d)) else 0
    value = weight if isinstance(weight, Tensor) else weight.value
    return register_parametrization(
        module, name, _SpectralNorm(value, n_power_iterations, dim, eps))
