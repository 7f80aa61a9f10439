"""``skip_init``, as ``torch.nn.utils.skip_init``: a module built without drawing its initial
weights from the seeded generator, for weights that are about to be overwritten (loaded, or
initialised by hand).

>>> fc = pc.nn.utils.skip_init(pc.nn.Linear, 4, 2)
>>> fc.load_state_dict(saved)                                    # doctest: +SKIP
"""

from __future__ import annotations

import inspect

import numpy as np

from ...errors import ParclError
from ..module import Module, default_generator, set_default_generator

__all__ = ["skip_init"]


def skip_init(module_cls, *args, **kwargs) -> Module:
    """``module_cls(*args, **kwargs)`` with its initialisation skipped, as PyTorch's: the
    thread's seeded generator is left exactly where it was (the modules built after draw what
    they would have drawn without this one), and the weights' values are unspecified until
    set. As PyTorch requires a ``device`` argument, the class must take parcl's ``queue``
    (every built-in layer does)."""
    if not (isinstance(module_cls, type) and issubclass(module_cls, Module)):
        raise ParclError(f"skip_init: expected a pc.nn.Module class, got {module_cls!r}")
    if "queue" not in inspect.signature(module_cls).parameters:
        raise ParclError(f"skip_init: {module_cls.__name__} must take a 'queue' argument (the "
                         "device, PyTorch's 'device') to skip its initialisation")
    kept = default_generator()        # where the next draw after this would start
    set_default_generator(np.random.default_rng(0))     # a scratch generator, thrown away
    try:
        return module_cls(*args, **kwargs)
    finally:
        set_default_generator(kept)
