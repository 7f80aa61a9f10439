"""Optimizers: ``SGD``, ``Adam``, ``AdamW``, ``RMSprop``, ``Adagrad``, ``NAdam``, ``RAdam``,
``Adamax``, ``Adadelta``, ``Rprop``, ``ASGD``, ``Adafactor``, ``Muon`` and ``LBFGS`` with the
update formulas of PyTorch's documentation.

Each step is one fused OpenCL kernel per parameter (``parcl.kernels.optim``, and
``parcl.kernels.optim_more`` for NAdam, RAdam, Adamax, Adadelta, Rprop and ASGD), enqueued on
the parameter's queue (Adafactor and Muon compose parcl's ops per parameter, and LBFGS steps
through a closure: ``rules_matrix.py``, ``lbfgs.py``); scalars such as bias corrections are
computed on the host, so ``step()`` never waits for the device. Parameters whose ``.grad`` is
None are skipped. A step validates every parameter before it launches anything: one that fails
leaves parameters and state as they were.

Parameters that live in flat buffers (a ``FlatBucket``: one flat value and gradient tensor that
the parameters' ``.value`` and ``.grad`` view) can be stepped one kernel per bucket:
``launch(prepare(buckets))``. ``ReplicaGroup`` keeps every replica's parameters that way, and
``parcl.allreduce.fused`` runs each bucket's update as the whole end of a data-parallel step
through ``launch``'s ``targets``; the optimizer itself knows nothing of replicas.

>>> opt = pc.optim.AdamW(model.parameters(), lr=1e-3)
>>> with tp.Tape() as tape:
...     loss = tp.cross_entropy(model(x), y)
>>> tape.backward(loss)
>>> opt.step()
>>> opt.zero_grad()
"""

from __future__ import annotations

from . import lr_scheduler, swa_utils
from .optimizer import FlatBucket, Optimizer, OptimizerError, StepPlan
from .rules import SGD, Adagrad, Adam, AdamW, RMSprop
from .lbfgs import LBFGS
from .rules_matrix import Adafactor, Muon
from .rules_more import ASGD, Adadelta, Adamax, NAdam, RAdam, Rprop

__all__ = ["SGD", "Adagrad", "Adam", "AdamW", "RMSprop", "Adadelta", "Adamax", "NAdam",
           "RAdam", "Rprop", "ASGD", "Adafactor", "LBFGS", "Muon", "FlatBucket", "Optimizer",
           "OptimizerError", "StepPlan", "lr_scheduler", "swa_utils"]
