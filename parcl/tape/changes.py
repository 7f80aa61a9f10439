"""In-place changes, and the backward's check that what an op saved is unchanged.

An op that saves a tensor for its backward (``linear`` saves its input and weight) computes
its gradient from that tensor's buffer when the backward runs. If the buffer was changed in
place since the op was recorded (``relu(inplace=True)``, an optimizer step, ``load_state_dict``,
``Tensor.copy_``), the gradient would be taken at the new values. Every such change is noted
with its buffer in the queue's pool (``MemoryPool.overwrites``), and ``Tape.backward`` raises,
before accumulating anything, for an op recorded before a change to a buffer it saved:
whichever tape recorded the op, or none, and whichever was current at the change (PyTorch's
version counters catch the same).
"""

from __future__ import annotations

from ..errors import ParclError
from ..pool import pool_of
from ..tensor import Tensor

def changed(nodes) -> None:
    """Note that these leaves' values (Nodes, or the Tensors themselves: a module's buffers)
    were just updated in place (an optimizer step, ``load_state_dict``): a backward through
    ops recorded before then that saved them raises instead of taking their gradients at the
    new values."""
    for n in nodes:
        v = n if isinstance(n, Tensor) else n.value
        pool_of(v.queue).note_overwrite(v.data, "an optimizer step or load_state_dict",
                                        update=True)


def note_change(x, what: str) -> None:
    """Note that ``what``, an in-place op, is about to overwrite ``x`` (a Node or Tensor): a
    backward through an op recorded before now that saved it raises, on whichever tape (or
    none) that op was recorded."""
    value = x if isinstance(x, Tensor) else x.value       # a Tensor or a Node
    pool_of(value.queue).note_overwrite(value.data, what, update=False)


def check_saved_unchanged(order: list, pool) -> None:
    """Raise if an op in ``order`` (graph Entries) saved, for its backward, a tensor that was
    changed in place after the op was recorded (``MemoryPool.overwrites``: an in-place op, an
    optimizer step), whichever tape recorded it: its gradient would be computed from the new
    values. Nothing has been accumulated yet. Saved tensors are matched by buffer, so views
    count too."""
    recorded = [e.recorded_at for e in order if e.recorded_at is not None]
    if not recorded or pool.last_overwrite <= min(recorded):
        return                          # nothing changed in place since the first op
    overwrites = pool.overwrites
    for entry in order:
        fn, at = entry.grad_fn, entry.recorded_at
        if fn is None:                  # a leaf (an op always has its recorded_at)
            continue
        for name, saved in vars(fn).items():
            for t in _tensors(saved):
                change = overwrites.get(t.data.int_ptr)
                if change is None or change.when <= at:
                    continue
                if change.update:
                    raise ParclError(
                        f"backward: '{entry.op_name}' (output {entry.shape}) saved a tensor "
                        f"{t.shape} ('{name}') that was updated in place ({change.what}) after "
                        "the op was recorded, so its gradient would be taken at the new value; "
                        "run backward before updating, or record the forward again")
                raise ParclError(
                    f"backward: '{entry.op_name}' (output {entry.shape}) saved a tensor "
                    f"{t.shape} ('{name}') for its backward that {change.what} overwrote "
                    "after it was recorded, so its gradient would be computed from the "
                    "new values; do that op out of place (inplace=False)")


def _tensors(value):
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
