"""Decompositions of small batched matrices, on the device: ``eigh``, ``eigvalsh``, ``svd``,
``svdvals`` and ``qr`` (``tp.linalg``'s; ``parcl.kernels.linalg_jacobi``: Jacobi rotations and
Householder reflections, one work-item per matrix, float32, up to 128 rows and columns).

Each output is its own recorded op reading one decomposition, so an output that is not used
adds nothing to the backward, and the gradients of the outputs that are used add up to
PyTorch's formula: ``eigh``: ``V (diag(gL) + skew(V^T gV) / 2E) V^T`` with ``E_ij = L_j -
L_i``; ``svd``: ``U [skew(U^T gU) S / E + S skew(Vh gVh^T) / E + diag(gS)] Vh`` with ``E_ij =
S_j^2 - S_i^2`` (``skew(X) = X - X^T``), plus the parts of ``gU`` outside ``U``'s columns and
of ``gVh`` outside ``Vh``'s rows (a non-square matrix). As PyTorch's, the eigenvector and
singular vector gradients are infinite where two eigenvalues (singular values) coincide, and
well-defined only for losses that do not depend on the vectors' signs; eigenvalues and
singular values alone have a gradient everywhere.

>>> w, v = tp.linalg.eigh(tp.tensor(np.array([[2.0, 0.0], [0.0, 1.0]], np.float32)))
>>> w.to_host()
array([1., 2.], dtype=float32)
"""

from __future__ import annotations

from math import prod

from ...errors import DTypeError, ParclError, ShapeError
from ...kernels import creation as ck
from ...kernels import linalg as lk
from ...kernels import linalg_jacobi as lj
from ...kernels.linalg import MAX_N
from ...tensor import FLOAT, Tensor
from ..node import Function
from .elementwise import add, div, mul, sub
from .linalg import matmul
from .linalg_solve import _mT, _raw
from .join import cat
from .shape import unsqueeze
from .slices import narrow, tril

__all__: list[str] = []


def _skew(x: Tensor) -> Tensor:
    return sub(x, _mT(x))


def _gaps(values: Tensor, square: bool) -> Tensor:
    """``E_ij = v_j - v_i`` (of the squares where ``square``), 1 on the diagonal."""
    v = mul(values, values) if square else values
    n = values.shape[-1]
    return add(sub(unsqueeze(v, -2), unsqueeze(v, -1)), ck.eye(values.queue, n, n, FLOAT))


# -- eigh ----------------------------------------------------------------------------------
class _EighPart(Function):
    """One output of a symmetric eigendecomposition ``(w, v)`` computed before."""

    name = "eigh"

    def forward(self, a: Tensor, wv=None, part: int = 0):
        if self.recording:
            self.wv = wv
        return wv[part]


class _Eigenvalues(_EighPart):
    def backward(self, g: Tensor):
        w, v = self.wv
        return matmul(mul(v, unsqueeze(g, -2)), _mT(v))          # V diag(g) V^T


class _Eigenvectors(_EighPart):
    def backward(self, g: Tensor):
        w, v = self.wv
        inner = div(mul(_skew(matmul(_mT(v), g)), 0.5), _gaps(w, False))
        return matmul(matmul(v, inner), _mT(v))


def _eigh(A, UPLO: str, op: str, tape):  # noqa: N803
    if UPLO not in ("L", "U"):
        raise ParclError(f"{op}: UPLO must be 'L' or 'U', got {UPLO!r}")
    if UPLO == "U":                     # the upper triangle is the transpose's lower one
        A = _mT(A, tape)
    wv = lj.eigh(_raw(A, op), op)
    return A, wv


def eigh(A, UPLO: str = "L", *, tape=None):  # noqa: N803
    """``torch.linalg.eigh``: ``(eigenvalues, eigenvectors)`` of the symmetric matrices ``A``
    ``(*, n, n)``, from their lower (``UPLO="L"``) or upper triangle: eigenvalues ascending
    ``(*, n)``, orthonormal eigenvectors as the columns of ``(*, n, n)`` (each one's sign is
    arbitrary, as LAPACK's).

    >>> tp.linalg.eigh(tp.tensor(np.array([[2.0, 0.0], [0.0, 1.0]]))).eigenvalues.to_host()
    array([1., 2.], dtype=float32)
    """
    A, wv = _eigh(A, UPLO, "linalg.eigh", tape)
    return EighResult(_Eigenvalues.apply(A, tape=tape, wv=wv, part=0),
                      _Eigenvectors.apply(A, tape=tape, wv=wv, part=1))


def eigvalsh(A, UPLO: str = "L", *, tape=None):  # noqa: N803
    """``torch.linalg.eigvalsh``: the eigenvalues of ``eigh``, ascending; gradient
    ``V diag(g) V^T``.

    >>> tp.linalg.eigvalsh(tp.tensor(np.array([[2.0, 0.0], [0.0, 1.0]]))).to_host()
    array([1., 2.], dtype=float32)
    """
    A, wv = _eigh(A, UPLO, "linalg.eigvalsh", tape)
    return _Eigenvalues.apply(A, tape=tape, wv=wv, part=0)


class EighResult(tuple):
    """``(eigenvalues, eigenvectors)``, as PyTorch's named tuple."""

    __slots__ = ()

    def __new__(cls, eigenvalues, eigenvectors):
        return super().__new__(cls, (eigenvalues, eigenvectors))

    eigenvalues = property(lambda self: self[0])
    eigenvectors = property(lambda self: self[1])


# -- svd -----------------------------------------------------------------------------------
class _Svd:
    """One decomposition ``A = U S Vh`` of ``(*, m, n)``, ``k = min(m, n)``: ``u`` ``(*, m, m
    or k)``, ``s`` ``(*, k)``, ``vh`` ``(*, k or n, n)``, and the reduced ``U`` and ``Vh``
    its backward reads."""

    def __init__(self, a: Tensor, full: bool, op: str):
        if a.dtype != FLOAT:
            raise DTypeError(f"{op}: input {a.shape} has dtype {a.dtype}, expected float32")
        if a.ndim < 2:
            raise ShapeError(f"{op}: expected matrices (*, m, n), got shape {a.shape}")
        *batch, m, n = a.shape
        if not (0 < m <= MAX_N and 0 < n <= MAX_N):
            raise ShapeError(f"{op}: matrices of {m} x {n} (input {a.shape}) are not "
                             f"supported: parcl decomposes matrices of 1 to {MAX_N} rows "
                             "and columns, one per work-item")
        count, k = prod(batch), min(m, n)
        self.m, self.n, self.k = m, n, k
        tall = a.reshape(count, m, n) if m >= n else _mT(a.reshape(count, m, n))
        u, s, v = lj.svd(tall, full)
        if m < n:                      # A^T = U' S V'^T: A = V' S U'^T
            u, v = v, u
        self.s = s.reshape(*batch, k)
        self.u = u.reshape(*batch, m, u.shape[-1])
        self.vh = _mT(v).reshape(*batch, v.shape[-1], n)
        self.full = full

    def reduced(self) -> tuple[Tensor, Tensor]:
        """``U`` ``(*, m, k)`` and ``Vh`` ``(*, k, n)``: the full ones' first columns/rows."""
        u, vh = self.u, self.vh
        if self.full and self.m != self.k:
            u = matmul(u, ck.eye(u.queue, self.m, self.k, FLOAT))
        if self.full and self.n != self.k:
            vh = matmul(ck.eye(vh.queue, self.k, self.n, FLOAT), vh)
        return u, vh


class _SvdPart(Function):
    name = "svd"

    def forward(self, a: Tensor, svd: _Svd | None = None, part: str = "s"):
        if self.recording:
            self.svd = svd
        return getattr(svd, part)


class _SingularValues(_SvdPart):
    def backward(self, g: Tensor):
        u, vh = self.svd.reduced()
        return matmul(mul(u, unsqueeze(g, -2)), vh)                # U diag(g) Vh


class _LeftVectors(_SvdPart):
    def backward(self, g: Tensor):
        d = self.svd
        u, vh = d.reduced()
        if d.full and d.m != d.k:      # PyTorch's: the completed columns carry no gradient
            g = matmul(g, ck.eye(g.queue, d.m, d.k, FLOAT))
        s = d.s
        inner = div(mul(_skew(matmul(_mT(u), g)), unsqueeze(s, -2)), _gaps(s, True))
        out = matmul(u, inner)
        if d.m > d.k:                  # the part of gU outside U's columns
            gs = div(g, unsqueeze(s, -2))
            out = add(out, sub(gs, matmul(u, matmul(_mT(u), gs))))
        return matmul(out, vh)


class _RightVectors(_SvdPart):
    def backward(self, g: Tensor):
        d = self.svd
        u, vh = d.reduced()
        if d.full and d.n != d.k:
            g = matmul(ck.eye(g.queue, d.k, d.n, FLOAT), g)
        s = d.s
        inner = div(mul(unsqueeze(s, -1), _skew(matmul(vh, _mT(g)))), _gaps(s, True))
        out = matmul(inner, vh)
        if d.n > d.k:                  # the part of gVh outside Vh's rows
            gs = div(g, unsqueeze(s, -1))
            out = add(out, sub(gs, matmul(matmul(gs, _mT(vh)), vh)))
        return matmul(u, out)


class SvdResult(tuple):
    """``(U, S, Vh)``, as PyTorch's named tuple."""

    __slots__ = ()

    def __new__(cls, U, S, Vh):  # noqa: N803
        return super().__new__(cls, (U, S, Vh))

    U = property(lambda self: self[0])
    S = property(lambda self: self[1])
    Vh = property(lambda self: self[2])


def svd(A, full_matrices: bool = True, *, tape=None) -> SvdResult:
    """``torch.linalg.svd``: ``(U, S, Vh)`` with ``A = U diag(S) Vh`` for ``A`` ``(*, m, n)``,
    ``S`` ``(*, k)`` descending (``k = min(m, n)``), ``U`` ``(*, m, m)`` and ``Vh`` ``(*, n,
    n)`` (``(*, m, k)`` and ``(*, k, n)`` where ``full_matrices=False``), the columns no
    singular value fixes completed to an orthonormal basis; each pair of singular vectors'
    sign is arbitrary, as LAPACK's.

    >>> tp.linalg.svd(tp.tensor(np.array([[0.0, 2.0], [1.0, 0.0]]))).S.to_host()
    array([2., 1.], dtype=float32)
    """
    d = _Svd(_raw(A, "linalg.svd"), bool(full_matrices), "linalg.svd")
    return SvdResult(_LeftVectors.apply(A, tape=tape, svd=d, part="u"),
                     _SingularValues.apply(A, tape=tape, svd=d, part="s"),
                     _RightVectors.apply(A, tape=tape, svd=d, part="vh"))


def svdvals(A, *, tape=None):
    """``torch.linalg.svdvals``: the singular values of ``A`` ``(*, m, n)``, descending
    ``(*, min(m, n))``; gradient ``U diag(g) Vh``.

    >>> tp.linalg.svdvals(tp.tensor(np.array([[0.0, 2.0], [1.0, 0.0]]))).to_host()
    array([2., 1.], dtype=float32)
    """
    d = _Svd(_raw(A, "linalg.svdvals"), False, "linalg.svdvals")
    return _SingularValues.apply(A, tape=tape, svd=d, part="s")


# -- qr ------------------------------------------------------------------------------------
def _copyltu(m: Tensor) -> Tensor:
    """The symmetric matrix with ``m``'s lower triangle."""
    return add(tril(m), _mT(tril(m, -1)))


def _square_qr_grad(q: Tensor, r: Tensor, gq: Tensor | None, gr: Tensor | None) -> Tensor:
    """``(gQ + Q copyltu(R gR^T - gQ^T Q)) R^-T`` for ``A = Q R``, ``R`` square (m >= n)."""
    m_ = None
    if gr is not None:
        m_ = matmul(r, _mT(gr))
    if gq is not None:
        t = matmul(_mT(gq), q)
        m_ = mul(t, -1.0) if m_ is None else sub(m_, t)
    b = matmul(q, _copyltu(m_))
    if gq is not None:
        b = add(b, gq)
    n = r.shape[-1]
    count = r.size // (n * n)
    rows = q.shape[-2]
    x = lk.solve_triangular(r.reshape(count, n, n), _mT(b).reshape(count, n, rows), upper=True)
    return _mT(x).reshape(b.shape)


class _QrPart(Function):
    """``Q`` or ``R`` of one decomposition computed before."""

    name = "qr"

    def forward(self, a: Tensor, qr=None, part: int = 0, complete: bool = False):
        if self.recording:
            self.qr, self.complete = qr, complete
        return qr[part]

    def backward(self, g: Tensor):
        q, r = self.qr
        m, n = q.shape[-2], r.shape[-1]
        if self.complete and m > n:
            raise ParclError(f"linalg.qr: mode='complete' with more rows than columns "
                             f"({m} x {n}) has no gradient (Q's last {m - n} columns are not "
                             "unique), as in PyTorch; use mode='reduced'")
        gq, gr = (g, None) if isinstance(self, _QrQ) else (None, g)
        if m >= n:
            return _square_qr_grad(q, r, gq, gr)
        # A = [X | Y]: X = Q U, R = [U | Q^T Y]
        u = narrow(r, -1, 0, m)
        if gr is None:
            return cat([_square_qr_grad(q, u, gq, None),
                        Tensor.zeros(q.queue, (*r.shape[:-1], n - m))], -1)
        y_grad = narrow(gr, -1, m, n - m)
        y = narrow(self.a_value, -1, m, n - m)
        gx = _square_qr_grad(q, u, matmul(y, _mT(y_grad)), narrow(gr, -1, 0, m))
        return cat([gx, matmul(q, y_grad)], -1)


class _QrQ(_QrPart):
    pass


class _QrR(_QrPart):
    def forward(self, a: Tensor, qr=None, part: int = 1, complete: bool = False):
        if self.recording:
            self.a_value = a
        return super().forward(a, qr, part, complete)


class QrResult(tuple):
    """``(Q, R)``, as PyTorch's named tuple."""

    __slots__ = ()

    def __new__(cls, Q, R):  # noqa: N803
        return super().__new__(cls, (Q, R))

    Q = property(lambda self: self[0])
    R = property(lambda self: self[1])


def qr(A, mode: str = "reduced", *, tape=None) -> QrResult:
    """``torch.linalg.qr``: ``(Q, R)`` with ``A = Q R`` for ``A`` ``(*, m, n)`` by Householder
    reflections (LAPACK's, so PyTorch's ``Q`` and ``R`` to rounding): ``mode="reduced"``
    ``Q`` ``(*, m, k)`` and ``R`` ``(*, k, n)``, ``"complete"`` ``(*, m, m)`` and ``(*, m,
    n)``, ``"r"`` ``R`` only (``Q`` is None, PyTorch's empty tensor; ``R`` keeps its
    gradient). Gradients PyTorch's; ``"complete"`` with ``m > n`` has none, as PyTorch's.

    >>> tp.linalg.qr(tp.tensor(np.float32([[3, 0], [4, 5]]))).R.to_host()
    array([[-5., -4.],
           [ 0.,  3.]], dtype=float32)
    """
    op = "linalg.qr"
    if mode not in ("reduced", "complete", "r"):
        raise ParclError(f"{op}: mode must be 'reduced', 'complete' or 'r', got {mode!r}")
    a = _raw(A, op)
    if a.dtype != FLOAT:
        raise DTypeError(f"{op}: input {a.shape} has dtype {a.dtype}, expected float32")
    if a.ndim < 2 or not (0 < a.shape[-2] <= MAX_N and 0 < a.shape[-1] <= MAX_N):
        raise ShapeError(f"{op}: expected matrices (*, m, n) with 1 to {MAX_N} rows and "
                         f"columns, got shape {a.shape}")
    *batch, m, n = a.shape
    complete = mode == "complete"
    q, r = lj.qr(a.reshape(prod(batch), m, n), complete)
    qr_ = (q.reshape(*batch, *q.shape[1:]), r.reshape(*batch, *r.shape[1:]))
    R = _QrR.apply(A, tape=tape, qr=qr_, part=1, complete=complete)
    if mode == "r":
        return QrResult(None, R)
    return QrResult(_QrQ.apply(A, tape=tape, qr=qr_, part=0, complete=complete), R)
