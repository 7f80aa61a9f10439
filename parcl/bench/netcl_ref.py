"""netcl, the peer PyOpenCL library, running parcl-bench's models and tiny-op chain.

netcl (PyPI ``netcl``) is an optional dependency: this module imports it only inside its
functions, and ``available()`` says whether it is there. It is only *called* from here, never
copied into parcl.

* ``NetclModel`` / ``netcl_step(name, state, x, y, device)``: the ``mlp`` and ``cnn`` models of
  ``models`` built from netcl's layers on a context and queue of netcl's own on the same
  OpenCL device that parcl runs on (a sub-device for ``--devices cpu:N``), starting from
  parcl's initial weights (its state_dict, copied into netcl's parameters: netcl's ``Linear``
  keeps its weight as ``(in, out)``, so it is transposed). ``step()`` is one training step the
  way netcl's own ``Trainer`` takes it: upload the batch (labels one-hot, as netcl's cross
  entropy wants them), forward, cross entropy, backward, SGD update, ``zero_grad`` and the
  queue's finish.
* ``netcl_chain_us_per_op(repeat)``: the per-op host overhead of netcl's tape on a chain of
  tiny ops, ``h = tanh(h @ w + x)`` on 4x4 (31 ops, forward and backward), as
  ``parcl-bench overhead`` measures parcl's.

>>> from parcl.bench import netcl_ref
>>> isinstance(netcl_ref.available(), bool)
True
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np

from . import models
from .common import BenchError, LazyLoss

NETCL_MODELS = ("mlp", "cnn")
NETCL_HINT = ("netcl is not installed, so its row is left out; to add it: pip install netcl "
              "(the peer PyOpenCL library; pure Python, needs only numpy and pyopencl)")
CHAIN_LINKS = 10        # tanh(h @ w + x) per link: 3 ops; plus the final sum: 31 ops
CHAIN_SIZE = 4


def available() -> bool:
    """Whether netcl can be imported here."""
    try:
        import netcl  # noqa: F401
    except ImportError:
        return False
    return True


def compare_notes(names, skipped: bool) -> list[str]:
    """The notes ``parcl-bench compare`` adds for its netcl row: how to install netcl when it
    is missing (unless ``--no-netcl``), which of the models ``names`` have no netcl twin."""
    if skipped:
        return []
    if not available():
        return [NETCL_HINT]
    missing = [m for m in names if m not in NETCL_MODELS]
    return [f"no netcl twin for {', '.join(missing)}"] if missing else []


def _queue(device):
    """A context and in-order queue of netcl's own on ``device`` (a pyopencl Device: the whole
    CPU device or a sub-device); default the first OpenCL device parcl would pick."""
    import pyopencl as cl

    if device is None:
        import parcl as pc

        device = pc.devices()[0]
    return cl.CommandQueue(cl.Context([device]), device)


class NetclModel:
    """One of parcl-bench's models (``mlp``, ``cnn``) in netcl on its own queue, with parcl's
    weights ``state`` (a parcl state_dict: PyTorch names and layouts).

    >>> import parcl as pc
    >>> from parcl.bench import models, netcl_ref
    >>> state = models.builder("mlp")(pc.new_queue()).state_dict()
    >>> x, y = models.batch("mlp", 4, seed=1)
    >>> ref = netcl_ref.NetclModel("mlp", state)
    >>> loss = ref.step(x, y, models.LR)
    """

    def __init__(self, name: str, state: dict, device=None):
        if name not in NETCL_MODELS:
            raise BenchError(f"netcl_ref: no netcl twin for model {name!r}; choose from "
                             f"{', '.join(NETCL_MODELS)}")
        from netcl.nn import layers as nl

        q = self.queue = _queue(device)
        if name == "mlp":
            mods = [nl.Linear(q, 784, 512), nl.ReLU(), nl.Linear(q, 512, 512), nl.ReLU(),
                    nl.Linear(q, 512, 10)]
        else:
            mods = [nl.Conv2d(q, 1, 32, 3), nl.ReLU(), nl.MaxPool2d(2, 2),
                    nl.Conv2d(q, 32, 64, 3), nl.ReLU(), nl.MaxPool2d(2, 2), nl.Flatten(),
                    nl.Linear(q, 64 * 5 * 5, 10)]
        # parcl's Sequential names its children by index, as PyTorch's does.
        for i, m in enumerate(mods):
            if isinstance(m, nl.Linear):
                _write(m.weight, np.asarray(state[f"{i}.weight"]).T)
                _write(m.bias, state[f"{i}.bias"])
            elif isinstance(m, nl.Conv2d):
                _write(m.weight, state[f"{i}.weight"])
                _write(m.bias, state[f"{i}.bias"])
        self.model = nl.Sequential(*mods)
        self.opt = None
        self.lr = None

    def step(self, x: np.ndarray, y: np.ndarray, lr: float) -> float:
        """One SGD training step on the host batch ``(x float32, y int64)``; returns the loss
        (read after the queue's finish, which the step ends with anyway)."""
        return float(self.step_lazy(x, y, lr).to_host().reshape(-1)[0])

    def step_lazy(self, x: np.ndarray, y: np.ndarray, lr: float):
        """``step`` without reading the loss: returns netcl's loss tensor."""
        from netcl import autograd as ag
        from netcl.core.tensor import Tensor
        from netcl.optim import SGD

        if self.opt is None or self.lr != lr:
            self.opt, self.lr = SGD(self.model.parameters(), lr=lr), lr
        q = self.queue
        onehot = np.eye(10, dtype=np.float32)[y]
        with ag.Tape() as tape:
            logits = self.model(ag.tensor(Tensor.from_host(q, np.ascontiguousarray(x))))
            loss = ag.cross_entropy(logits, ag.tensor(Tensor.from_host(q, onehot)))
        tape.backward(loss)
        self.opt.step()
        self.opt.zero_grad()
        q.finish()
        return loss.value


def _write(param, value) -> None:
    from netcl.core.transfer import write_tensor

    value = np.ascontiguousarray(value, dtype=np.float32)
    if tuple(value.shape) != tuple(param.shape):
        raise BenchError(f"netcl_ref: parameter shape {tuple(param.shape)}, parcl's weight has "
                         f"{tuple(value.shape)}")
    write_tensor(param, value)


def netcl_step(name: str, state: dict, x: np.ndarray, y: np.ndarray, device=None):
    """``(step, sync)`` for ``parcl-bench compare``: ``step()`` runs one netcl training step of
    model ``name`` from parcl's weights ``state`` on ``(x, y)`` (the queue finished at its
    end) and returns an object whose ``float()`` reads the loss; ``sync`` is None (nothing is
    left running)."""
    ref = NetclModel(name, state, device)

    def step():
        return LazyLoss(ref.step_lazy(x, y, models.LR))

    return step, None


@dataclass(frozen=True)
class ChainTimes:
    """Medians over the repeats of one tiny-op chain on netcl's tape, in microseconds."""

    ops: int
    forward_us_per_op: float
    backward_us_per_op: float
    total_us_per_op: float


def netcl_chain_us_per_op(repeat: int = 20, device=None) -> dict:
    """Host overhead per op of netcl's autograd tape: ``h = tanh(h @ w + x)`` ten times on 4x4
    float32 (plus the final sum: 31 ops), forward then backward, each timed to the queue's
    finish; after one warm-up run (kernel builds), the median over ``repeat`` runs.

    Returns ``{"ops": 31, "forward_us_per_op", "backward_us_per_op", "total_us_per_op"}``
    (microseconds per op; total = forward + backward of the same run).

    >>> from parcl.bench import netcl_ref
    >>> netcl_ref.netcl_chain_us_per_op(3)["ops"]
    31
    """
    from netcl import autograd as ag
    from netcl.core.tensor import Tensor

    if repeat < 1:
        raise BenchError(f"netcl_chain_us_per_op: repeat must be >= 1, got {repeat}")
    q = _queue(device)
    rng = np.random.default_rng(0)
    host = [rng.standard_normal((CHAIN_SIZE, CHAIN_SIZE), dtype=np.float32) * 0.5
            for _ in range(3)]
    h0, w, x = (Tensor.from_host(q, a) for a in host)
    ops = 3 * CHAIN_LINKS + 1
    fwd, bwd = [], []
    for _ in range(repeat + 1):
        hn, wn, xn = (ag.tensor(t, requires_grad=True) for t in (h0, w, x))
        q.finish()
        t0 = time.perf_counter()
        with ag.Tape() as tape:
            h = hn
            for _ in range(CHAIN_LINKS):
                h = ag.tanh(ag.add(ag.matmul_op(h, wn), xn))
            loss = ag.sum(h)
        q.finish()
        t1 = time.perf_counter()
        tape.backward(loss)
        q.finish()
        t2 = time.perf_counter()
        fwd.append(t1 - t0)
        bwd.append(t2 - t1)
        for t in (h0, w, x):
            t.grad = None
    fwd, bwd = fwd[1:], bwd[1:]
    total = [a + b for a, b in zip(fwd, bwd)]
    return asdict(ChainTimes(ops, statistics.median(fwd) / ops * 1e6,
                             statistics.median(bwd) / ops * 1e6,
                             statistics.median(total) / ops * 1e6))
