"""``tp.linalg``: PyTorch's ``torch.linalg`` names, for code written against them.

Factorisations and solves of small batched float32 matrices (n up to 128) run on the
device (``parcl/tape/ops/linalg_solve.py``: LU with partial pivoting and Cholesky, one
work-item per matrix; ``parcl/tape/ops/linalg_decomp.py``: ``eigh`` and ``svd`` by Jacobi
rotations); the norms are composed from reductions
(``parcl/tape/ops/linalg_norms.py``). ``det``, ``slogdet``, ``inv``, ``matrix_power`` and
``cross`` are also ``tp`` ops (``tp.det``, ``tp.inverse``, ...), as in PyTorch.

>>> from parcl.tape import linalg
>>> linalg.solve(tp.tensor(np.array([[2.0, 0.0], [0.0, 4.0]])),
...              tp.tensor(np.array([2.0, 2.0]))).to_host()
array([1. , 0.5], dtype=float32)
"""

from __future__ import annotations

from .ops.linalg_decomp import eigh, eigvalsh, qr, svd, svdvals
from .ops.linalg_funcs import matrix_exp, tensorinv, tensorsolve
from .ops.linalg_more import (cond, diagonal, inv_ex, lu_solve, matmul, matrix_rank, multi_dot,
                              pinv, solve_ex, vecdot)
from .ops.linalg_norms import matrix_norm, norm, vector_norm
from .ops.linalg_solve import (cholesky, cholesky_ex, det, inverse, lu_factor, matrix_power,
                               slogdet, solve, solve_triangular)
from .ops.products import cross

__all__ = ["cholesky", "cholesky_ex", "cond", "cross", "det", "diagonal", "eigh", "eigvalsh",
           "inv", "inv_ex", "lu_factor", "lu_solve", "matmul", "matrix_norm", "matrix_power",
           "matrix_exp", "matrix_rank", "multi_dot", "norm", "pinv", "qr", "slogdet", "solve",
           "solve_ex", "solve_triangular", "svd", "svdvals", "tensorinv", "tensorsolve",
           "vecdot", "vector_norm"]

inv = inverse
