"""The errors parcl raises on purpose.

Every message names the op, the shapes involved and (inside a replica) the replica, and says
what to do about it. Each class also derives from the matching builtin so ``except ValueError``
style code keeps working.
"""

from __future__ import annotations


class ParclError(Exception):
    """Base class of every error parcl raises on purpose."""


class ShapeError(ParclError, ValueError):
    """Shapes that do not fit: mismatched, non-broadcastable, empty, or a batch too small."""


class LabelError(ShapeError):
    """A class label outside ``[0, num_classes)`` (and not ``ignore_index``): carries ``op``,
    ``row`` (flat index into the labels), ``label`` and ``num_classes``."""

    def __init__(self, message: str, op: str | None = None, row: int | None = None,
                 label: int | None = None, num_classes: int | None = None):
        super().__init__(message)
        self.op, self.row, self.label, self.num_classes = op, row, label, num_classes


class DTypeError(ParclError, TypeError):
    """A dtype parcl does not support for this op (float32 data, int32/int64 labels)."""


class DeviceError(ParclError, RuntimeError):
    """No usable OpenCL device, an unknown device spec, or tensors on different contexts."""


class LinAlgError(ParclError, RuntimeError):
    """A matrix a linear algebra op cannot take: singular (``inv``, ``solve``) or not
    positive-definite (``cholesky``), as PyTorch's ``torch.linalg.LinAlgError``."""


class ReplicaError(ParclError, RuntimeError):
    """A replica thread failed; carries ``index``, ``device`` and the original traceback."""

    def __init__(self, message: str, index: int | None = None, device: str | None = None,
                 traceback_text: str | None = None):
        super().__init__(message)
        self.index = index
        self.device = device
        self.traceback_text = traceback_text


class AnomalyError(ParclError, FloatingPointError):
    """NaN or inf produced by a recorded op while ``detect_anomaly`` is on."""


class CheckpointError(ParclError, OSError):
    """A checkpoint that is damaged or does not fit the model or optimizer."""


class GradcheckError(ParclError, AssertionError):
    """An analytic gradient that disagrees with central finite differences."""
