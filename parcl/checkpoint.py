"""Checkpoints: ``save`` and ``load`` a model, an optimizer and JSON metadata as one
safetensors file.

Tensors are stored under ``model.<name>`` (the model's ``state_dict()`` keys) and
``optim.state.<param>.<name>`` (the optimizer's per-parameter buffers). Everything else (step,
user metadata, the optimizer's scalars, param_groups and the model key of each of its
parameters, a learning-rate scheduler's state, the CRC-32 of every tensor's bytes and its
dtype and shape, the parcl and format versions) is one JSON document under the key
``"parcl"`` of the safetensors header's ``__metadata__``, with that document's own CRC-32
beside it under ``"parcl_crc32"``. Nothing is ever unpickled.

A save is atomic: the file is written beside ``path`` under a temporary name, fsynced, renamed
onto ``path`` and the directory fsynced, so a crash leaves the previous checkpoint intact (and
perhaps a stray ``.<name>.*.tmp`` file). The file gets the mode any new file gets under the
process's umask (0644 under the usual 022), so checkpoints can be shared on a cluster file
system. A load validates everything, checksums included, before it changes anything.

>>> import tempfile, os, numpy as np
>>> class Net:
...     def __init__(self): self.w = np.zeros(3, np.float32)
...     def state_dict(self): return {"weight": self.w.copy()}
...     def load_state_dict(self, d): self.w = d["weight"].copy()
>>> net, path = Net(), os.path.join(tempfile.mkdtemp(), "ckpt.safetensors")
>>> net.w[:] = 1.5
>>> save(path, net, step=7, epoch=2)
>>> fresh = Net()
>>> load(path, fresh), fresh.w
({'step': 7, 'epoch': 2}, array([1.5, 1.5, 1.5], dtype=float32))
"""

from __future__ import annotations

import json
import os
import zlib
from typing import Any

import numpy as np
import safetensors.numpy

from .atomicfile import atomic_write
from .checkpoint_verify import (crc32, layout, misplaced_state, optimizer_param_names,
                                verify_checksums, verify_layout)
from .errors import CheckpointError, DTypeError

__all__ = ["FORMAT_VERSION", "load", "save"]

# Format 2 added the per-tensor checksums (``"crc32"``) and the scheduler state; format 3 the
# checksum of the JSON document itself (under DOC_CRC_KEY, beside it: step, meta, the
# optimizer's scalars and the scheduler are in the document), then ``"layout"`` (see
# checkpoint_verify). Older files still load with what they have: refusing them would strand
# every existing run.
FORMAT_VERSION = 3
META_KEY = "parcl"
DOC_CRC_KEY = "parcl_crc32"
MODEL_PREFIX = "model."
OPTIM_PREFIX = "optim.state."
_DTYPES = {"bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
           "float16", "float32", "float64"}
# Group keys that are not the optimizer's options: a scheduler's initial_lr is in a group once
# one was attached, and Adam's and AdamW's rule flag only in groups saved since it was added
# (older files name the rule in the document's "rule", which is checked instead).
_NOT_OPTIONS = {"initial_lr", "decoupled_weight_decay"}


# --- save ----------------------------------------------------------------------------------

def save(path: str | os.PathLike, model: Any, optimizer: Any = None, step: int = 0, *,
         scheduler: Any = None, **meta: Any) -> None:
    """Write ``model`` (and ``optimizer``, and a learning-rate ``scheduler``) with ``step`` and
    JSON-able ``meta`` to ``path``, atomically, with a CRC-32 of every tensor.

    ``meta`` may hold anything JSON can carry: epoch, ``loader.state_dict()``, an RNG's
    ``bit_generator.state``, ... (numpy scalars and arrays become numbers and lists; tuples
    come back as lists). A dict key that is not a string is a ``TypeError``: JSON would give
    it back as another key.

    Typical use, once per epoch or every N steps::

        pc.save("run/ckpt.safetensors", model, opt, step=step, epoch=epoch,
                loader=loader.state_dict(), scheduler=sched)
    """
    from . import __version__

    path = os.fspath(path)
    _check_scheduler(f"save({path!r})", optimizer, scheduler)
    tensors: dict[str, np.ndarray] = {}
    model_keys = []
    for name, value in model.state_dict().items():
        if not isinstance(name, str):
            raise TypeError(f"save({path!r}): model.state_dict() key {name!r} is not a string")
        tensors[MODEL_PREFIX + name] = _host_array(value, f"model.state_dict()[{name!r}]")
        model_keys.append(name)
    doc: dict[str, Any] = {"format": FORMAT_VERSION, "parcl_version": __version__,
                           "step": step, "meta": meta, "model_keys": model_keys,
                           "optimizer": None}
    if optimizer is not None:
        doc["optimizer"] = _flatten_optimizer(optimizer, tensors)
        names = optimizer_param_names(model, optimizer, doc["optimizer"]["param_groups"])
        if names is not None:      # whose state is whose: checked by load
            doc["optimizer"]["param_names"] = sorted([i, n] for i, n in names.items())
    if scheduler is not None:
        doc["scheduler"] = {"class": type(scheduler).__name__, "state": scheduler.state_dict()}
    doc["crc32"] = {key: crc32(array) for key, array in tensors.items()}
    doc["layout"] = {key: layout(array) for key, array in tensors.items()}
    try:
        _check_keys(doc["meta"], "meta")
        _check_keys({k: v for k, v in doc.items() if k != "meta"}, "the checkpoint's document")
        header = json.dumps(doc, default=_json_default)
    except (TypeError, ValueError) as e:
        raise TypeError(f"save({path!r}): the metadata is not JSON-serialisable ({e}); pass "
                        f"numbers, strings, lists and dicts") from e
    data = safetensors.numpy.save(tensors, metadata={
        META_KEY: header, DOC_CRC_KEY: str(zlib.crc32(header.encode()))})
    atomic_write(path, data, "checkpoint")


def _host_array(value: Any, what: str) -> np.ndarray:
    if hasattr(value, "to_host"):          # a pc.Tensor slipped into a state dict
        value = value.to_host()
    array = np.asarray(value, order="C")   # safetensors reads raw memory: strides must go
    if array.dtype.byteorder == ">":        # the file is little-endian, and so is its checksum
        array = array.astype(array.dtype.newbyteorder("<"))
    if array.dtype.name not in _DTYPES:
        raise DTypeError(f"save: {what} has dtype {array.dtype}, which safetensors cannot "
                         f"store; use one of {sorted(_DTYPES)}")
    return array


def _flatten_optimizer(optimizer: Any, tensors: dict[str, np.ndarray]) -> dict[str, Any]:
    """Move the optimizer's arrays into ``tensors``; return the JSON rest, which keeps the
    state's keys as a list of entries so int parameter indices stay ints."""
    sd = optimizer.state_dict()
    state = []
    for key, entry in sd.get("state", {}).items():
        scalars, arrays = {}, []
        for name, value in entry.items():
            if isinstance(value, np.ndarray) or hasattr(value, "to_host"):
                tensors[f"{OPTIM_PREFIX}{key}.{name}"] = _host_array(
                    value, f"optimizer.state_dict()['state'][{key!r}][{name!r}]")
                arrays.append(name)
            else:
                scalars[name] = value
        state.append({"key": key, "scalars": scalars, "tensors": arrays})
    rest = {k: v for k, v in sd.items() if k not in ("state", "param_groups")}
    return {"class": type(optimizer).__name__, "rule": _rule(optimizer), "state": state,
            "param_groups": sd.get("param_groups", []), "extra": rest}


def _rule(optimizer) -> str | None:
    """The parcl optimizer whose update ``optimizer`` runs (its class, or the one it derives
    from), or None for one of the user's own. Adam's and AdamW's states have the same names:
    only this tells them apart."""
    for cls in type(optimizer).__mro__:
        if cls.__module__.startswith("parcl.optim") and cls.__name__ != "Optimizer":
            return cls.__name__
    return None


def _check_keys(value: Any, where: str) -> None:
    """Refuse a dict key that is not a string: JSON keys are strings, and ``json.dumps``
    turns 10 into "10" without a word, which then sorts before "9" and meets the "10" of
    another key."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where}: key {key!r} ({type(key).__name__}) is not a string "
                                f"(JSON keys are strings: it would come back as another key); "
                                f"use string keys or a list of pairs")
            _check_keys(item, f"{where}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_keys(item, f"{where}[{i}]")


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} {value!r} is not JSON-serialisable")


# --- load ----------------------------------------------------------------------------------

def load(path: str | os.PathLike, model: Any, optimizer: Any = None, *,
         scheduler: Any = None) -> dict[str, Any]:
    """Restore ``model`` (and ``optimizer``, and ``scheduler``) from ``path``; return
    ``{"step": ..., **meta}``.

    Everything is checked first: a missing, truncated or damaged file (a tensor whose bytes
    do not match the CRC-32 saved with it), missing or extra keys, wrong shapes or dtypes, a
    scheduler of another class raise ``CheckpointError`` naming the file and the keys, and
    leave model, optimizer and scheduler unchanged. A checkpoint's optimizer (scheduler) state
    is ignored when ``optimizer`` (``scheduler``) is None, e.g. loading weights for
    evaluation; a ``scheduler`` without its ``optimizer`` is refused. Files written before
    checksums existed (format 1) load without the checksum check.

    >>> meta = pc.load("run/ckpt.safetensors", model, opt, scheduler=sched)   # doctest: +SKIP
    >>> step = meta["step"]                                                   # doctest: +SKIP
    """
    path = os.fspath(path)
    if scheduler is not None and optimizer is None:
        # The learning rates live in the optimizer: a schedule that computes the next one from
        # the current one (ExponentialLR, ReduceLROnPlateau) would go on from the fresh value.
        raise CheckpointError(f"load({path!r}): a scheduler is given without its optimizer, "
                              "whose learning rates it steps; pass both (pc.load(path, model, "
                              "optimizer, scheduler=s))")
    _check_scheduler(f"load({path!r})", optimizer, scheduler)
    doc, tensors = _read(path)
    model_state, current = _model_state(path, doc, tensors, model)
    optim_state = _optimizer_state(path, doc, tensors, optimizer, model)
    sched_state = _scheduler_state(path, doc, scheduler)

    # The scheduler first: its state is a few numbers, so it is the cheap one to put back
    # should the model or the optimizer refuse theirs (all or nothing).
    sched_backup = scheduler.state_dict() if scheduler is not None else None
    if scheduler is not None:
        try:
            scheduler.load_state_dict(sched_state)
        except Exception as e:
            raise CheckpointError(f"load({path!r}): scheduler.load_state_dict refused the "
                                  f"checkpoint: {e}; nothing was changed") from e
    backup = {k: np.array(v, copy=True) for k, v in current.items()}
    try:
        try:
            model.load_state_dict(model_state)
        except Exception as e:
            raise CheckpointError(f"load({path!r}): model.load_state_dict refused the "
                                  f"checkpoint: {e}") from e
        if optimizer is not None:
            try:
                optimizer.load_state_dict(optim_state)
            except Exception as e:
                model.load_state_dict(backup)
                raise CheckpointError(f"load({path!r}): optimizer.load_state_dict refused the "
                                      f"checkpoint: {e}; the model was left unchanged") from e
    except CheckpointError:
        if scheduler is not None:
            scheduler.load_state_dict(sched_backup)
        raise
    return {"step": doc.get("step", 0), **doc.get("meta", {})}


def _check_scheduler(what: str, optimizer: Any, scheduler: Any) -> None:
    """A scheduler steps the learning rates of the optimizer it was built over: one of
    another optimizer would leave ``optimizer`` at the checkpoint's rate from then on."""
    owner = getattr(scheduler, "optimizer", None)
    if optimizer is not None and owner is not None and owner is not optimizer:
        raise CheckpointError(f"{what}: the scheduler was built over another optimizer than "
                              f"the one given, so its steps would not change that one's "
                              f"learning rates; pass the optimizer the scheduler steps, or a "
                              f"scheduler built over this optimizer")


def _scheduler_state(path: str, doc: dict[str, Any], scheduler: Any) -> dict[str, Any] | None:
    if scheduler is None:
        return None
    saved = doc.get("scheduler")
    if not saved:
        raise CheckpointError(f"load({path!r}): the checkpoint holds no scheduler state; load "
                              f"it with scheduler=None, or save one with pc.save(..., "
                              f"scheduler=s)")
    if not (isinstance(saved, dict) and isinstance(saved.get("state"), dict)):
        raise CheckpointError(f"load({path!r}): the scheduler metadata is malformed")
    if saved.get("class") != type(scheduler).__name__:
        raise CheckpointError(f"load({path!r}): the checkpoint holds a {saved.get('class')} "
                              f"scheduler's state, got a {type(scheduler).__name__}")
    return saved["state"]


def _read(path: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The checkpoint's JSON document and tensors, or CheckpointError."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise CheckpointError(f"load({path!r}): no such checkpoint file") from None
    except OSError as e:
        raise CheckpointError(f"load({path!r}): cannot read the checkpoint: {e}") from e
    try:
        tensors = safetensors.numpy.load(data)
        # The header was just validated by safetensors; read its metadata from the same bytes.
        header_len = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + header_len])
        text = header["__metadata__"][META_KEY]
        doc_crc = header["__metadata__"].get(DOC_CRC_KEY)
        doc = json.loads(text)
        spans = {k: v["data_offsets"] for k, v in header.items() if k != "__metadata__"}
    except Exception as e:
        raise CheckpointError(f"load({path!r}): the file is damaged or not a parcl checkpoint "
                              f"({type(e).__name__}: {e})") from e
    # The document's own checksum first: where it is (format 3) a damaged step, meta,
    # optimizer scalar or format number is refused, not loaded.
    if doc_crc is not None and doc_crc != str(zlib.crc32(text.encode())):
        raise CheckpointError(f"load({path!r}): the checksum of the checkpoint's metadata "
                              f"(step, meta, optimizer and scheduler state) does not match it; "
                              f"the file is damaged (nothing was loaded)")
    if not (isinstance(doc, dict) and isinstance(doc.get("model_keys"), list)
            and isinstance(doc.get("format"), int) and isinstance(doc.get("meta", {}), dict)):
        raise CheckpointError(f"load({path!r}): the metadata is not a parcl checkpoint's")
    if doc["format"] > FORMAT_VERSION:
        raise CheckpointError(f"load({path!r}): checkpoint format {doc.get('format')} was "
                              f"written by parcl {doc.get('parcl_version')}, newer than this "
                              f"one (format {FORMAT_VERSION}); upgrade parcl")
    if doc["format"] < 1 or (doc["format"] >= 3 and doc_crc is None):
        why = "does not exist" if doc["format"] < 1 else "lacks its metadata checksum"
        raise CheckpointError(f"load({path!r}): checkpoint format {doc['format']} {why}; "
                              f"the file is damaged")
    expected = {MODEL_PREFIX + k for k in doc["model_keys"]}
    if doc.get("optimizer"):
        expected |= {f"{OPTIM_PREFIX}{entry['key']}.{name}"
                     for entry in _optim_doc(path, doc)["state"] for name in entry["tensors"]}
    if set(tensors) != expected:
        raise CheckpointError(f"load({path!r}): the file's tensors do not match its own "
                              f"metadata: unlisted {sorted(set(tensors) - expected)}, "
                              f"absent {sorted(expected - set(tensors))}; the file is damaged")
    if doc["format"] >= 2:
        verify_checksums(path, doc, memoryview(data)[8 + header_len:], spans)
    verify_layout(path, doc.get("layout"), tensors)
    return doc, tensors


def _optim_doc(path: str, doc: dict[str, Any]) -> dict[str, Any]:
    opt = doc["optimizer"]
    well_formed = (isinstance(opt, dict) and isinstance(opt.get("state"), list)
                   and isinstance(opt.get("param_groups"), list)
                   and all(isinstance(e, dict) and isinstance(e.get("scalars"), dict)
                           and isinstance(e.get("tensors"), list) and "key" in e
                           for e in opt["state"]))
    if not well_formed:
        raise CheckpointError(f"load({path!r}): the optimizer metadata is malformed")
    return opt


def _model_state(path: str, doc: dict[str, Any], tensors: dict[str, np.ndarray],
                 model: Any) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The checkpoint's model state, checked against the model's; and the model's."""
    saved = {k: tensors[MODEL_PREFIX + k] for k in doc["model_keys"]}
    current = {k: _host_array(v, f"model.state_dict()[{k!r}]")
               for k, v in model.state_dict().items()}
    problems = _compare(saved, current, "the model")
    if problems:
        raise CheckpointError(f"load({path!r}): the checkpoint does not fit the model: "
                              + "; ".join(problems))
    return saved, current


def _optimizer_state(path: str, doc: dict[str, Any], tensors: dict[str, np.ndarray],
                     optimizer: Any, model: Any) -> dict[str, Any] | None:
    if optimizer is None:
        return None
    if not doc.get("optimizer"):
        raise CheckpointError(f"load({path!r}): the checkpoint holds no optimizer state; "
                              f"load it with optimizer=None, or save one with pc.save(..., "
                              f"optimizer)")
    opt = _optim_doc(path, doc)
    state: dict[Any, dict[str, Any]] = {}
    for entry in opt["state"]:
        key = entry["key"]
        values = dict(entry["scalars"])
        for name in entry["tensors"]:
            values[name] = tensors[f"{OPTIM_PREFIX}{key}.{name}"]
        state[key] = values
    saved = {"state": state, "param_groups": opt["param_groups"], **opt.get("extra", {})}

    current = optimizer.state_dict()
    cur_groups = current.get("param_groups", [])
    problems = []
    rule = _rule(optimizer)
    if opt.get("rule") and rule and opt["rule"] != rule:
        problems.append(f"it holds an {opt['rule']} optimizer's state, and "
                        f"{type(optimizer).__name__}'s update differs")
    if len(saved["param_groups"]) != len(cur_groups):
        problems.append(f"{len(saved['param_groups'])} param_groups saved, optimizer has "
                        f"{len(cur_groups)}")
    for i, (mine, theirs) in enumerate(zip(saved["param_groups"], cur_groups)):
        if set(mine) - _NOT_OPTIONS != set(theirs) - _NOT_OPTIONS:
            problems.append(f"param_groups[{i}] saved with options {sorted(mine)}, optimizer "
                            f"has {sorted(theirs)} (a different optimizer class? checkpoint "
                            f"has {opt.get('class')}, got {type(optimizer).__name__})")
        elif list(mine.get("params", [])) != list(theirs.get("params", [])):
            problems.append(f"param_groups[{i}] saved for params {mine.get('params')}, "
                            f"optimizer has {theirs.get('params')}")
    if not problems:      # the state of each parameter onto the parameter of its name
        problems += misplaced_state(opt.get("param_names"), optimizer_param_names(
            model, optimizer, saved["param_groups"]))
    known = {p for g in cur_groups for p in g.get("params", [])}
    unknown = [k for k in state if known and k not in known]
    if unknown:
        problems.append(f"state for parameters {unknown} the optimizer does not have")
    for key, values in state.items():
        if key in current.get("state", {}):
            mine = {n: v for n, v in values.items() if isinstance(v, np.ndarray)}
            theirs = {n: _host_array(v, f"optimizer state[{key!r}][{n!r}]")
                      for n, v in current["state"][key].items()
                      if isinstance(v, np.ndarray) or hasattr(v, "to_host")}
            problems += [f"state[{key}]: {p}" for p in _compare(mine, theirs, "the optimizer")]
    if problems:
        raise CheckpointError(f"load({path!r}): the checkpoint does not fit the optimizer: "
                              + "; ".join(problems))
    return saved


def _compare(saved: dict[str, np.ndarray], current: dict[str, np.ndarray], where: str
             ) -> list[str]:
    """Human-readable differences between two name -> array dicts (empty when they fit)."""
    problems = []
    missing = [k for k in current if k not in saved]
    extra = [k for k in saved if k not in current]
    if missing:
        problems.append(f"missing keys {missing}")
    if extra:
        problems.append(f"unexpected keys {extra}")
    for name, array in saved.items():
        if name not in current:
            continue
        want = current[name]
        if array.shape != want.shape:
            problems.append(f"{name!r} has shape {array.shape} in the checkpoint, "
                            f"{want.shape} in {where}")
        elif array.dtype != want.dtype:
            problems.append(f"{name!r} has dtype {array.dtype} in the checkpoint, "
                            f"{want.dtype} in {where}")
    return problems
