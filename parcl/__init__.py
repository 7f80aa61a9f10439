"""parcl: multi-threaded data-parallel training on OpenCL.

>>> import numpy as np, parcl as pc
>>> q = pc.default_queue()
>>> pc.Tensor.from_host(q, np.ones(3, np.float32)).to_host()
array([1., 1., 1.], dtype=float32)
"""

from __future__ import annotations

from .errors import (AnomalyError, CheckpointError, DeviceError, DTypeError, GradcheckError,
                     ParclError, ReplicaError, ShapeError)
from .runtime import (Queue, context_for, default_queue, describe, devices, memory_stats,
                      new_queue, reset_peak_memory_stats, set_default_queue, split_device)
from .tensor import Tensor
from . import data as data
from .checkpoint import load as load, save as save
from . import nn as nn, optim as optim

__version__ = "0.1.0"

__all__ = [
    "AnomalyError", "CheckpointError", "DTypeError", "DeviceError", "GradcheckError",
    "ParclError", "Queue", "ReplicaError", "ShapeError", "Tensor", "context_for",
    "default_queue", "describe", "devices", "memory_stats", "new_queue",
    "reset_peak_memory_stats", "set_default_queue", "split_device", "__version__",
]
