"""The per-thread autograd tape (netcl's ``netcl.autograd``).

>>> import parcl.tape as tp
>>> with tp.Tape() as tape:
...     loss = tp.mse_loss(model(x), y)
>>> tape.backward(loss)
"""

from .autograd import backward, grad
from .capture import CapturedStep, Unkeyed, capture
from .gradcheck import gradcheck
from .mode import (
                   apply_modes,
                   capture_modes,
                   detect_anomaly,
                   enable_grad,
                   get_current_tape,
                   inference_mode,
                   is_anomaly_enabled,
                   is_grad_enabled,
                   is_inference_mode_enabled,
                   no_grad,
                   set_current_tape,
                   set_grad_enabled,
)
from .node import Function, Node, tensor
from .ops import *  # noqa: F401,F403  (add, sub, ..., cross_entropy)
from .ops import __all__ as _ops_all
from . import special  # tp.special: torch.special's names
from . import linalg  # tp.linalg: torch.linalg's names
from .hooks import RemovableHandle
from .recompute import checkpoint, checkpoint_sequential
from .tape import Tape, topological_order

__all__ = ["CapturedStep", "Function", "Node", "RemovableHandle", "Tape", "Unkeyed",
           "apply_modes", "backward", "capture", "capture_modes", "checkpoint",
           "checkpoint_sequential", "detect_anomaly", "enable_grad", "get_current_tape", "grad",
           "gradcheck", "inference_mode", "is_anomaly_enabled", "is_grad_enabled",
           "is_inference_mode_enabled", "no_grad", "set_current_tape",
           "set_grad_enabled", "tensor", "topological_order", "special", "linalg", *_ops_all]
