"""In-place changes, and the backward's check that what an op saved is unchanged.

An op that saves a tensor for its backward (``linear`` saves its input and weight) computes
its gradient from that tensor's buffer when the backward runs. If the buffer was changed in
place since the op was recorded (``relu(inplace=True)``, an optimizer step, ``load_state_dict``,
``Tensor.copy_``), the gradient would be taken at the new values. Every such change is noted
with its buffer in the queue's pool (``MemoryPool.overwrites``), and ``Tape.backward`` raises,
before accumulating anything, for an op recorded before a change to a buffer it saved:
whichever tape recorded the op, or none, and whichever was current at the change (PyTorch's
version counters catch the same).

An in-place op also changes what every other Node over the same buffer holds: its input, and
the views (``reshape``) of it taken before. An op that reads one of those afterwards reads the
new values while the graph says the old ones, so its gradient would skip the in-place op
(PyTorch rebases such Nodes onto the in-place op's history). Changes made through the graph
are therefore noted per buffer too (``MemoryPool.graph_changes``, keyed by the Entry that
owns the buffer), and the same backward raises for an op that read such a Node after the
change.
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
    pool = pool_of(value.queue)
    entry = getattr(x, "entry", None)
    if entry is not None and entry.grad_fn is not None:   # a leaf's readers read a constant
        # (the Entry whose buffer it is, reshape and in-place outputs being views of their
        # input: ``Entry.alias``, is the note's key; the changed one is held weakly, as a
        # strong reference would keep the key alive)
        pool.note_graph_change(_owner(entry), entry, what)
    pool.note_overwrite(value.data, what, update=False)


def _owner(entry):
    """The Entry whose buffer ``entry``'s value is (itself unless it is a view)."""
    while entry.grad_fn is not None and entry.alias is not None:
        entry = entry.parents[entry.alias]
    return entry


def check_saved_unchanged(order: list, pool) -> None:
    """Raise if an op in ``order`` (graph Entries) saved, for its backward, a tensor that was
    changed in place after the op was recorded (``MemoryPool.overwrites``: an in-place op, an
    optimizer step), whichever tape recorded it: its gradient would be computed from the new
    values. Nothing has been accumulated yet. Saved tensors are matched by buffer, so views
    count too."""
    recorded = [e.recorded_at for e in order if e.recorded_at is not None]
    if not recorded or pool.last_overwrite <= min(recorded):
        return                          # nothing changed in place since the first op
    if pool.graph_changes:
        _check_no_stale_reads(order, pool.graph_changes_by_owner())
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
    else:
        # a helper an op keeps whole (linalg's LU factors, an SVD): det's backward reads the
        # det it returned from its LU, svd's the S it returned; its own tensors, one level
        for v in getattr(value, "__dict__", {}).values():
            if isinstance(v, Tensor):
                yield v


def _check_no_stale_reads(order: list, changes: dict[int, list]) -> None:
    """Raise if an op in ``order`` read a Node whose buffer an in-place op changed after the
    Node was recorded and before the op was (``z = x * 2; relu(z, inplace=True); sum(z)``):
    the Node's graph no longer describes what the op read."""
    for reader in order:
        if reader.grad_fn is None:
            continue
        for k, read in enumerate(reader.parents):
            if read.recorded_at is None:             # a leaf: a constant, or refused
                continue
            noted = changes.get(id(_owner(read)), ())
            for when, changed_ref, what in noted:
                if read.recorded_at < when < reader.recorded_at and not _made_by(
                        reader, k, when, noted):
                    changed_entry = changed_ref() or read
                    through = "" if changed_entry is read else (
                        f" through the output of '{changed_entry.op_name}' "
                        f"{changed_entry.shape}, which shares it")
                    raise ParclError(
                        f"backward: '{reader.op_name}' (output {reader.shape}) read the output "
                        f"of '{read.op_name}' (shape {read.shape}) after {what} overwrote its "
                        f"buffer{through}, so its gradient would skip {what}; use the in-place "
                        "op's result instead (y = tp.relu(x, inplace=True), then y), or do it "
                        "out of place")


def _made_by(reader, k: int, when: int, changes: list) -> bool:
    """Whether ``reader`` is the in-place op that made the change at ``when`` to its input
    ``k``: it overwrites that input (its output is that buffer) and ``when`` is the latest
    change before it was recorded."""
    if getattr(reader.grad_fn, "overwrites", None) is None or reader.alias != k:
        return False
    return when == max(w for w, _, _ in changes if w < reader.recorded_at)
