"""``torch_names``: PyTorch's keyword names (``dim=``, ``keepdim=``, ``dims=``) for an op whose
own are numpy's (``axis=``, ``keepdims=``), so ``tp.softmax(x, dim=-1)`` and
``tp.sum(x, dim=1, keepdim=True)`` run as ``torch.softmax`` and ``torch.sum`` do. Not an op
family: a helper the op modules import (it is not in ``ops._MODULES``).
"""

from __future__ import annotations

import functools

from ...tensor import every_dim_if_empty

#: PyTorch's name -> numpy's, for ops whose reduced or joined dimension is ``axis``
DIM = {"dim": "axis", "keepdim": "keepdims"}



def torch_names(renames: dict = DIM, *, empty_dim_is_all: bool = False):
    """Decorate an op so that each keyword of ``renames`` (PyTorch's name) is passed on as
    its value (the op's own name); the two names at once are a TypeError, as one argument
    given twice. ``empty_dim_is_all``: a reduction's ``dim=()`` means every dim, as
    PyTorch's, where the op's ``axis=()`` reduces none.

    >>> tp.sum(x, dim=1, keepdim=True).shape
    (2, 1)
    """
    def wrap(fn):
        name = fn.__name__

        @functools.wraps(fn)
        def op(*args, **kwargs):
            if kwargs:                          # the hot path: positional calls skip this
                for torch_name, own in renames.items():
                    if torch_name in kwargs:
                        if own in kwargs:
                            raise TypeError(f"{name}: {own} and {torch_name} given both; "
                                            "they are one argument")
                        value = kwargs.pop(torch_name)
                        if empty_dim_is_all and torch_name == "dim":
                            value = every_dim_if_empty(value)
                        kwargs[own] = value
            return fn(*args, **kwargs)

        return op

    return wrap
