"""parcl: multi-threaded data-parallel training on OpenCL.

>>> import numpy as np, parcl as pc
>>> q = pc.default_queue()
>>> pc.Tensor.from_host(q, np.ones(3, np.float32)).to_host()
array([1., 1., 1.], dtype=float32)
"""

from __future__ import annotations

from . import data, nn, optim
from .checkpoint import load, save
from .errors import (AnomalyError, CheckpointError, DeviceError, DTypeError, GradcheckError,
                     ParclError, ReplicaError, ShapeError)
from .runtime import (Queue, context_for, default_queue, describe, devices, memory_stats,
                      new_queue, reset_peak_memory_stats, set_default_queue, split_device)
from .tensor import Tensor

__version__ = "0.1.0"

__all__ = [
    "AnomalyError", "CheckpointError", "DTypeError", "DeviceError", "GradcheckError",
    "ParclError", "Queue", "ReplicaError", "ShapeError", "Tensor", "__version__",
    "context_for", "data", "default_queue", "describe", "devices", "load", "memory_stats",
    "new_queue", "nn", "optim", "reset_peak_memory_stats", "save", "set_default_queue",
    "split_device",
]
