"""Differentiable ops, one module per family; each op's backward sits beside its forward.

Every op accepts ``Node`` or raw ``Tensor`` inputs (and Python scalars for the binary ops) and
an optional ``tape=``: with an explicit tape it records there even when no tape is current and
even inside ``no_grad`` (netcl's escape hatch).
"""

from .conv import *  # noqa: F401,F403
from .conv import __all__ as _conv
from .elementwise import *  # noqa: F401,F403
from .elementwise import __all__ as _elementwise
from .linalg import *  # noqa: F401,F403
from .linalg import __all__ as _linalg
from .loss import *  # noqa: F401,F403
from .loss import __all__ as _loss
from .nn import *  # noqa: F401,F403
from .nn import __all__ as _nn
from .reduce import *  # noqa: F401,F403
from .reduce import __all__ as _reduce
from .shape import *  # noqa: F401,F403
from .shape import __all__ as _shape

__all__ = [*_conv, *_elementwise, *_linalg, *_loss, *_nn, *_reduce, *_shape]
