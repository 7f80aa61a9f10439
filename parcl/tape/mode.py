"""Thread-local autograd state: grad mode, anomaly mode and the current tape.

**Differs from netcl:** netcl keeps grad mode in a module-global ``_GRAD_MODE``, so one replica's
evaluation silently stops another replica's recording. Here every thread has its own; replica
threads receive the dispatching thread's modes explicitly (``capture_modes``/``apply_modes``).
"""

from __future__ import annotations

import functools
import inspect
import threading

import numpy as np

from ..errors import DTypeError


class _State(threading.local):
    """One thread's modes. The defaults are class attributes, so every op reads a plain
    attribute (``Function.apply`` reads ``state.grad`` once per op) instead of a ``getattr``
    with a default."""

    grad = True            # ops record: grad mode is on and inference mode off
    grad_mode = True       # grad mode as set, what is_grad_enabled reports
    anomaly = False
    tape = None
    stats_sync = None
    recompute = False      # tp.checkpoint's backward is running its function again
    inference = False      # inside tp.inference_mode


state = _State()       # thread-local: each thread sees its own attributes


def is_grad_enabled() -> bool:
    """This thread's grad mode (True by default): ops record Nodes where it is on, outside
    ``inference_mode``."""
    return state.grad_mode


def set_modes(grad: bool, inference: bool) -> tuple[bool, bool]:
    """Set this thread's grad mode and inference mode; the previous pair. Inside inference
    mode nothing records whatever grad mode says, as in PyTorch, whose ``enable_grad`` there
    turns grad mode on and still makes inference tensors."""
    previous = state.grad_mode, state.inference
    state.grad_mode, state.inference = grad, inference
    state.grad = grad and not inference
    return previous


def is_anomaly_enabled() -> bool:
    return state.anomaly


def get_current_tape():
    """This thread's current tape, or None."""
    return state.tape


def set_current_tape(tape) -> None:
    """Make ``tape`` this thread's current tape (None clears it)."""
    state.tape = tape


class _ModeSwitch:
    """Sets a thread-local flag now; as a context manager restores it on exit; as a decorator
    applies it around each call."""

    attr = ""

    def __init__(self, value: bool):
        if not isinstance(value, (bool, np.bool_)):
            # as PyTorch's TypeError: bool("False") would switch the mode on
            raise DTypeError(f"{type(self).__name__}: the mode must be a bool, got {value!r} "
                             f"({type(value).__name__})")
        self.value = bool(value)
        self.prev = self.get()
        self.set(self.value)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.set(self.prev)
        return False

    def __call__(self, fn):
        # As PyTorch's: used as a decorator the switch made at decoration is undone there
        # (else the decorating thread kept it), and each call gets the mode anew.
        self.set(self.prev)
        return _decorated(fn, lambda: type(self)(self.value))

    def get(self) -> bool:
        return getattr(state, self.attr)

    def set(self, value: bool) -> None:
        setattr(state, self.attr, value)


class set_grad_enabled(_ModeSwitch):
    """Turn recording on or off for this thread: ``tp.set_grad_enabled(False)`` for a whole
    script, or ``with tp.set_grad_enabled(False):`` for a block. Thread-local."""

    def get(self) -> bool:
        return state.grad_mode

    def set(self, value: bool) -> None:
        set_modes(value, state.inference)


class detect_anomaly(_ModeSwitch):
    """Check every recorded op's output (forward) and gradient (backward) for NaN/inf and raise
    ``AnomalyError`` naming the op and where it was recorded. Expensive: it reads each value back
    to the host. ``tp.detect_anomaly(True)`` or ``with tp.detect_anomaly():``. Thread-local."""

    attr = "anomaly"

    def __init__(self, mode: bool = True):
        super().__init__(mode)


class _GradModeContext:
    """Base of no_grad/enable_grad: a context manager that is also a decorator."""

    value = False

    def __new__(cls, fn=None):
        # ``@tp.no_grad`` without parentheses decorates ``fn``, as PyTorch's (2.0 on)
        self = super().__new__(cls)
        return self if fn is None else self(fn)

    def __enter__(self):
        self.prev = set_modes(self.value, state.inference)[0]
        return self

    def __exit__(self, *exc):
        set_modes(self.prev, state.inference)
        return False

    def __call__(self, fn):
        return _decorated(fn, self.__class__)


def _decorated(fn, mode_context):
    """``fn`` run inside a fresh ``mode_context()`` at each call."""
    if inspect.isgeneratorfunction(fn):
        # The mode holds while the generator's body runs, between its yields, and the
        # caller's mode is back while the caller runs (as torch.no_grad does).
        @functools.wraps(fn)
        def generator(*args, **kwargs):
            gen = fn(*args, **kwargs)
            step = functools.partial(gen.send, None)
            while True:
                with mode_context():
                    try:
                        item = step()
                    except StopIteration as stop:
                        return stop.value
                try:
                    step = functools.partial(gen.send, (yield item))
                except GeneratorExit:
                    with mode_context():
                        gen.close()              # its finally blocks run in the mode
                    raise
                except BaseException as exc:     # thrown in: the body sees it, in the mode
                    step = functools.partial(gen.throw, exc)
        return generator

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with mode_context():
            return fn(*args, **kwargs)
    return wrapper


class no_grad(_GradModeContext):
    """Disable recording in this thread: ops return raw ``pc.Tensor``, no Node, no grad_fn.

    >>> with tp.no_grad():
    ...     out = model(x)          # a raw Tensor

    Also a decorator (``@tp.no_grad()``). Thread-local: other threads keep recording.
    """

    value = False


class enable_grad(_GradModeContext):
    """Re-enable recording inside a ``no_grad`` block (context manager or decorator); inside
    ``inference_mode`` it turns grad mode on and ops still record nothing, as PyTorch's."""

    value = True


class inference_mode:
    """PyTorch's ``inference_mode``: ``no_grad`` (ops return raw Tensors, which no later
    backward can reach anyway) that ``is_inference_mode_enabled`` reports; ``mode=False``
    leaves it, and turns grad mode on, as PyTorch's (inside ``inference_mode()`` or
    ``no_grad`` ops record again). A context manager and a decorator; thread-local.

    >>> with tp.inference_mode():
    ...     out = model(x)          # a raw Tensor
    """

    def __new__(cls, mode: bool = True):
        # ``@tp.inference_mode`` without parentheses decorates the function, as PyTorch's
        if callable(mode):
            return cls()(mode)
        return super().__new__(cls)

    def __init__(self, mode: bool = True):
        if not isinstance(mode, (bool, np.bool_)):
            raise DTypeError(f"inference_mode: the mode must be a bool, got {mode!r} "
                             f"({type(mode).__name__})")
        self.mode = bool(mode)

    def __enter__(self):
        # PyTorch's InferenceMode(enabled) sets grad mode to ``not enabled`` either way
        self.prev = set_modes(not self.mode, self.mode)
        return self

    def __exit__(self, *exc):
        set_modes(*self.prev)
        return False

    def __call__(self, fn):
        return _decorated(fn, lambda: inference_mode(self.mode))


def is_inference_mode_enabled() -> bool:
    """Whether this thread is inside ``tp.inference_mode()``."""
    return state.inference


def batch_stats_sync():
    """This thread's batch-statistics exchange (``sync_batchnorm``), or None: an object with
    ``gather(part, count) -> (parts, counts)`` stacking every participant's per-channel
    ``part`` in a fixed order, and optionally ``every_layer`` (False: only the batch norms
    that ask, ``SyncBatchNorm``'s, exchange; missing: True). Training-mode batch norm then
    normalises over all of them."""
    return state.stats_sync


def set_batch_stats_sync(sync) -> None:
    """Set (None: clear) this thread's batch-statistics exchange; see ``batch_stats_sync``."""
    state.stats_sync = sync


class own_batch_stats:
    """Inside, this thread's batch norms normalise with their own batch: no
    ``sync_batchnorm`` exchange (a batch norm module in evaluation without running
    statistics, which PyTorch's ``SyncBatchNorm`` does not synchronise either)."""

    def __enter__(self):
        self._outer = state.stats_sync
        state.stats_sync = None

    def __exit__(self, *exc):
        state.stats_sync = self._outer


def capture_modes() -> tuple[bool, bool, bool]:
    """The calling thread's (grad mode, anomaly mode, inference mode), to hand to a worker
    thread."""
    return state.grad_mode, state.anomaly, state.inference


def apply_modes(modes: tuple[bool, bool, bool]) -> None:
    """Adopt modes captured in another thread (replica threads do this per dispatched call)."""
    grad, state.anomaly, inference = modes
    set_modes(grad, inference)
