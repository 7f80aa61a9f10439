"""``tp.special``: PyTorch's ``torch.special`` names, for code written against them.

Most are parcl's ops under torch.special's names (``psi`` is ``digamma``, ``gammaln``
``lgamma``, ``multigammaln`` ``mvlgamma``, ``expit`` ``sigmoid``, ``softmax``/``log_softmax``
take ``dim``); ``i1``, ``i0e``, ``i1e``, ``xlog1py``, ``entr`` and ``ndtr`` are here only, as
in PyTorch (one kernel forward and one backward each, with PyTorch's gradients).

>>> from parcl.tape import special
>>> special.i0e(tp.tensor(np.array([0.0, 100.0]))).to_host()
array([1.        , 0.03994438], dtype=float32)
"""

from __future__ import annotations

from .ops import (digamma, erf, erfc, erfinv, exp2, expm1, i0, log1p, log_softmax, lgamma,
                  logit, logsumexp, mvlgamma, polygamma, round, sigmoid, sinc, softmax, xlogy)
from .ops.mathops_binary import xlog1py
from .ops.mathops_special import entr, i0e, i1, i1e, ndtr

__all__ = ["digamma", "entr", "erf", "erfc", "erfinv", "exp2", "expit", "expm1", "gammaln",
           "i0", "i0e", "i1", "i1e", "log1p", "log_softmax", "logit", "logsumexp",
           "multigammaln", "ndtr", "polygamma", "psi", "round", "sinc", "softmax", "xlog1py",
           "xlogy"]

psi = digamma
gammaln = lgamma
multigammaln = mvlgamma
expit = sigmoid
