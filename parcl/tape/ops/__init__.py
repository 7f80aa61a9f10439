"""Differentiable ops, one module per family; each op's backward sits beside its forward.

Every op accepts ``Node`` or raw ``Tensor`` inputs (and Python scalars for the binary ops) and
an optional ``tape=``: with an explicit tape it records there even when no tape is current and
even inside ``no_grad`` (netcl's escape hatch).
"""

from .activation import *  # noqa: F401,F403
from .activation import __all__ as _activation
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
from .norm import *  # noqa: F401,F403  (layer_norm, rms_norm, group_norm)
from .norm import __all__ as _norm
from .select import *  # noqa: F401,F403  (where, masked_fill, embedding)
from .select import __all__ as _select
from .reductions import *  # noqa: F401,F403  (max, argmax, var, logsumexp, cumsum, ...)
from .reductions import __all__ as _reductions

__all__ = [*_activation, *_elementwise, *_linalg, *_loss, *_nn, *_reduce, *_shape]
__all__ += [*_norm, *_select, *_reductions]

# shape and selection ops, attention (one block at the end so parallel additions merge cleanly)
from .attention import *  # noqa: E402,F401,F403
from .attention import __all__ as _attention  # noqa: E402
from .indexing import *  # noqa: E402,F401,F403
from .indexing import __all__ as _indexing  # noqa: E402
from .join import *  # noqa: E402,F401,F403
from .join import __all__ as _join  # noqa: E402

__all__ += [*_attention, *_indexing, *_join]
