"""parcl: multi-threaded data-parallel training on OpenCL.

>>> import numpy as np, parcl as pc
>>> q = pc.default_queue()
>>> pc.Tensor.from_host(q, np.ones(3, np.float32)).to_host()
array([1., 1., 1.], dtype=float32)
"""

from __future__ import annotations

from .hostcpu import ensure_known_cpu

ensure_known_cpu()      # before any OpenCL platform is loaded: see parcl/hostcpu.py

from . import data, nn, optim  # noqa: E402
from .checkpoint import load, save  # noqa: E402
from .errors import (AnomalyError, CheckpointError, DeviceError, DTypeError,  # noqa: E402
                     GradcheckError, LabelError, LinAlgError, ParclError, ReplicaError, ShapeError)
from .nn.module import manual_seed  # noqa: E402  (this thread's init and dropout seed)
from .runtime import (Queue, context_for, default_queue, describe, devices,  # noqa: E402
                      memory_stats, new_queue, reset_peak_memory_stats, set_default_queue,
                      split_device)
from .tensor import Tensor  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "AnomalyError", "CheckpointError", "DTypeError", "DeviceError", "GradcheckError",
    "LabelError", "LinAlgError", "ParclError", "Queue", "ReplicaError", "ShapeError", "Tensor",
    "__version__",
    "context_for", "data", "default_queue", "describe", "devices", "load", "manual_seed",
    "memory_stats", "new_queue", "nn", "optim", "reset_peak_memory_stats", "save",
    "set_default_queue", "split_device",
]
