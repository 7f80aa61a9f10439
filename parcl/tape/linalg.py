"""``tp.linalg``: PyTorch's ``torch.linalg`` names, for code written against them.

Factorisations and solves of small batched float32 matrices (up to 128 rows) run on the
device, one work-item per matrix: LU with partial pivoting (``ops/linalg_solve.py``), Cholesky
and triangular solves (``ops/linalg_cholesky.py``), ``eigh`` and ``svd`` by Jacobi rotations
and ``qr`` by Householder reflections (``ops/linalg_decomp.py``); ``pinv``, ``cond``, the
``_ex`` forms and the rest build on them (``ops/linalg_more.py``, ``ops/linalg_funcs.py``),
and the norms are composed from reductions (``ops/linalg_norms.py``). ``det``, ``slogdet``,
``inv`` (``tp.inverse``), ``matrix_power``, ``matrix_exp`` and ``cross`` are also ``tp`` ops,
as in PyTorch.

>>> from parcl.tape import linalg
>>> linalg.solve(tp.tensor(np.array([[2.0, 0.0], [0.0, 4.0]])),
...              tp.tensor(np.array([2.0, 2.0]))).to_host()
array([1. , 0.5], dtype=float32)
"""

from __future__ import annotations

from .ops.linalg_decomp import eigh, eigvalsh, qr, svd, svdvals
from .ops.linalg_funcs import lstsq, lu, matrix_exp, tensorinv, tensorsolve, vander
from .ops.linalg_more import (cond, diagonal, inv_ex, lu_solve, matmul, matrix_rank, multi_dot,
                              pinv, solve_ex, vecdot)
from .ops.linalg_norms import matrix_norm, norm, vector_norm
from .ops.linalg_cholesky import cholesky, cholesky_ex, solve_triangular
from .ops.linalg_solve import (det, inverse, lu_factor, lu_factor_ex, matrix_power, slogdet,
                               solve)
from .ops.products import cross

__all__ = ["cholesky", "cholesky_ex", "cond", "cross", "det", "diagonal", "eigh", "eigvalsh",
           "inv", "inv_ex", "lstsq", "lu", "lu_factor", "lu_factor_ex", "lu_solve", "matmul",
           "matrix_exp", "matrix_norm", "matrix_power", "matrix_rank", "multi_dot", "norm",
           "pinv", "qr", "slogdet", "solve", "solve_ex", "solve_triangular", "svd", "svdvals",
           "tensorinv", "tensorsolve", "vander", "vecdot", "vector_norm"]

inv = inverse
