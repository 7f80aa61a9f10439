"""A module's hooks (``Module.register_forward_pre_hook``, ``register_forward_hook``,
``register_full_backward_pre_hook``, ``register_full_backward_hook``), called as PyTorch
calls them.

A module without hooks holds none of this (``Module._hooks`` is None) and its call is
``forward`` itself. Pre-hooks run in order before ``forward`` and may replace its
positional arguments (``hook(module, args)`` returning a value or a tuple) or, registered
``with_kwargs=True``, both (``hook(module, args, kwargs)`` returning ``(args, kwargs)``);
hooks run after it and may replace its output (``hook(module, args, output)``, or
``hook(module, args, kwargs, output)``). An ``always_call=True`` hook runs even when the
forward, or a hook before it, raised (its output then None); the error is raised after it.

Backward hooks ride on Node hooks (``tape.hooks``): while recording, the input that requires
grad and the output pass through a zero-copy reshape each, whose gradient hooks call
``hook(module, grad_output)`` once the output's gradient is complete and ``hook(module,
grad_input, grad_output)`` once the input's is. PyTorch joins any number of inputs and
outputs in one graph node; a tape node has one output, so a module with backward hooks must
return one Node and take at most one input that requires grad (others are refused).
"""

from __future__ import annotations

import warnings

from .. import recorder
from ..errors import ParclError
from ..tape import mode
from ..tape.hooks import RemovableHandle, hooks_changed
from ..tape.node import Node
from ..tape.ops.shape import reshape
from ..tensor import Tensor

KINDS = ("forward_pre", "forward", "backward_pre", "backward")


def holds_hooks(module) -> bool:
    """Whether ``module`` has a hook of any kind registered: PyTorch calls a module's hooks
    around its own output, so a fused path that skips that output (a Linear's ReLU run in
    its GEMM) must not run for a hooked module. A step being captured notes the module: a
    hook registered on it later makes that path wrong, and the next call a new recording."""
    rec = recorder.state.recording
    if rec is not None:
        rec.note_hooked(module)
    hooks = module._hooks
    return hooks is not None and any(hooks.counts())


class ModuleHooks:
    """A module's hooks: per kind (``KINDS``) a dict handle id -> ``(hook, with_kwargs,
    always_call)``, in calling order; ``ids``: the handle ids of every kind's hooks, in
    order, renewed by every registration and removal."""

    __slots__ = (*KINDS, "ids")

    def __init__(self):
        for kind in KINDS:
            setattr(self, kind, {})
        self.ids: tuple = ()

    def add(self, kind: str, hook, with_kwargs: bool = False, always_call: bool = False,
            prepend: bool = False) -> RemovableHandle:
        if not callable(hook):
            raise TypeError(f"register_{kind}_hook: expected a callable, got "
                            f"{type(hook).__name__}")
        registry = getattr(self, kind)
        handle = RemovableHandle(self, registry)
        before = list(registry.items()) if prepend else []
        if prepend:
            registry.clear()
        registry[handle.id] = (hook, bool(with_kwargs), bool(always_call))
        registry.update(before)
        self.renew()
        return handle

    def renew(self) -> None:
        self.ids = tuple(i for kind in KINDS for i in getattr(self, kind))
        hooks_changed()

    def counts(self) -> tuple[int, ...]:
        return tuple(len(getattr(self, kind)) for kind in KINDS)

    def call(self, module, args: tuple, kwargs: dict):
        """``module.forward(*args, **kwargs)`` with the hooks around it."""
        called = set()
        output = None
        try:
            for hook, with_kwargs, _ in tuple(self.forward_pre.values()):
                if with_kwargs:
                    result = hook(module, args, kwargs)
                    if result is not None:
                        if not (isinstance(result, tuple) and len(result) == 2):
                            raise ParclError(f"forward pre-hook {_name(hook)} of "
                                             f"{type(module).__name__} registered with_kwargs "
                                             "must return None or (args, kwargs)")
                        args, kwargs = result
                else:
                    result = hook(module, args)
                    if result is not None:
                        args = result if isinstance(result, tuple) else (result,)
            backward = None
            if (self.backward or self.backward_pre) and mode.is_grad_enabled():
                backward = _BackwardCall(module, self)
                args = backward.wrap_inputs(args)
            output = module.forward(*args, **kwargs)
            for key, (hook, with_kwargs, _) in tuple(self.forward.items()):
                called.add(key)
                result = (hook(module, args, kwargs, output) if with_kwargs
                          else hook(module, args, output))
                if result is not None:
                    output = result
            if backward is not None:
                output = backward.wrap_output(output)
            return output
        except Exception:
            for key, (hook, with_kwargs, always) in tuple(self.forward.items()):
                if always and key not in called:
                    try:
                        if with_kwargs:
                            hook(module, args, kwargs, output)
                        else:
                            hook(module, args, output)
                    except Exception as exc:    # the first error is the one raised
                        warnings.warn(f"forward hook {_name(hook)} (always_call=True) of "
                                      f"{type(module).__name__} raised {exc!r}, silenced: "
                                      "the forward had raised first", stacklevel=3)
            raise


class _BackwardCall:
    """One recorded call of a module with backward hooks: its tensor arguments' count, the
    position of the one that requires grad (None: none does), and the output's gradient
    once the backward has it."""

    def __init__(self, module, hooks: ModuleHooks):
        self.module = module
        self.hooks = hooks
        self.n_inputs = 0
        self.index = None
        self.grad_output = None

    def wrap_inputs(self, args: tuple) -> tuple:
        out = list(args)
        tensors = 0
        for i, a in enumerate(args):
            if not isinstance(a, (Node, Tensor)):
                continue                  # not a tensor: no slot in grad_input, as PyTorch
            if isinstance(a, Node) and a.requires_grad:
                if self.index is not None:
                    raise ParclError(f"{type(self.module).__name__}: backward hooks on a module "
                                     "called with more than one input that requires grad are "
                                     "not supported (a tape node has one output); use "
                                     "register_hook on the inputs instead")
                self.index = tensors
                out[i] = reshape(a, a.shape)       # a Node of its own to hook, no copy
                out[i].register_hook(self.on_input)
            tensors += 1
        self.n_inputs = tensors
        return tuple(out)

    def wrap_output(self, output):
        if not isinstance(output, Node):
            raise ParclError(f"{type(self.module).__name__}: backward hooks need the forward to "
                             f"return one tp.Node, it returned a {type(output).__name__}; use "
                             "register_hook on the outputs instead")
        if not output.requires_grad:
            return output                 # no backward reaches it: no hook called, as PyTorch
        output = reshape(output, output.shape)
        output.register_hook(self.on_output)
        # the caller gets a view of it: hooks registered on what the module returned run
        # first, and the module's backward hooks see the gradient they leave, as PyTorch
        # runs a tensor's hooks before its BackwardHook's
        return reshape(output, output.shape)

    def on_output(self, grad):
        grad_output = (grad,)
        for hook, _, _ in tuple(self.hooks.backward_pre.values()):
            result = hook(self.module, grad_output)
            if result is not None:
                grad_output = _one_per(result, 1, hook, self.module, "grad_output")
        self.grad_output = grad_output
        if self.index is None:            # no input requires grad: called now, as PyTorch
            for hook, _, _ in tuple(self.hooks.backward.values()):
                hook(self.module, (None,) * self.n_inputs, grad_output)
        return grad_output[0]

    def on_input(self, grad):
        grad_input = tuple(grad if i == self.index else None for i in range(self.n_inputs))
        for hook, _, _ in tuple(self.hooks.backward.values()):
            result = hook(self.module, grad_input, self.grad_output)
            if result is not None:
                grad_input = _one_per(result, self.n_inputs, hook, self.module, "grad_input")
        return grad_input[self.index]


def _one_per(result, n: int, hook, module, what: str) -> tuple:
    result = result if isinstance(result, (tuple, list)) else (result,)
    if len(result) != n:
        raise ParclError(f"backward hook {_name(hook)} of {type(module).__name__} returned "
                         f"{len(result)} values for a {what} of {n}")
    return tuple(result)


def _name(hook) -> str:
    return getattr(hook, "__qualname__", None) or type(hook).__name__
