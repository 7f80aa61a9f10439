"""``detect_anomaly``'s checks: where an op was recorded, and NaN/inf in what it made."""

from __future__ import annotations

import os
import traceback

import numpy as np

from ..errors import AnomalyError
from ..tensor import Tensor

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def call_site() -> str:
    """The first stack frame outside parcl: where the user recorded the op."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if not os.path.abspath(frame.filename).startswith(_PACKAGE_DIR):
            return f"{frame.filename}:{frame.lineno} in {frame.name}"
    return "<parcl internal>"


def check_finite(t: Tensor, what: str, node) -> None:
    """Raise AnomalyError if ``t`` holds NaN or inf (anomaly mode only: reads back to host)."""
    host = t.to_host()
    if not np.all(np.isfinite(host)):
        bad = "NaN" if np.isnan(host).any() else "inf"
        raise AnomalyError(f"{what} of op '{node.op_name}' (output shape {node.shape}) produced "
                           f"{bad}; the op was recorded at {node.where}")
