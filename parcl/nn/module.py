"""``Parameter``, ``Module`` and the seeded initialisation generator.

A Module registers, in assignment order, its ``Parameter``s, its buffers (plain ``pc.Tensor``s
such as BatchNorm's running statistics, registered with ``register_buffer``) and its
sub-modules. ``state_dict()`` names them as PyTorch does (``0.weight`` inside a Sequential,
``layer1.0.conv1.weight`` in a ResNet), so weights move between the two by name.

Initial weights come from a **thread-local, seeded numpy generator** (``manual_seed``; seed 0
unless set), drawn on the host in construction order and uploaded: the same program builds
bit-identical models on every run and in every replica thread.

>>> import parcl as pc
>>> pc.nn.manual_seed(0)
>>> net = pc.nn.Sequential(pc.nn.Linear(4, 3), pc.nn.ReLU(), pc.nn.Linear(3, 2))
>>> list(net.state_dict())
['0.weight', '0.bias', '2.weight', '2.bias']
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import pyopencl as cl

from .. import recorder
from ..errors import ParclError, ShapeError
from ..gate import transfer
from ..pool import stamp
from ..runtime import default_queue
from ..tape.changes import changed
from ..tape.hooks import RemovableHandle
from ..tape.node import Node, host_copy
from ..tensor import Tensor
from .module_hooks import ModuleHooks

__all__ = ["IncompatibleKeys", "Module", "NameInUseError", "Parameter", "StateDictError",
           "default_generator", "manual_seed"]


class StateDictError(ParclError, ValueError):
    """A state dict with missing or unexpected keys, or values that are not arrays."""


class NameInUseError(ParclError, KeyError):
    """``register_parameter``, ``register_buffer`` or ``add_module`` given a name the module
    already uses for something of another kind, as PyTorch's ``KeyError``."""


class IncompatibleKeys(NamedTuple):
    """What ``load_state_dict`` returns, as PyTorch's: the model's keys the state dict lacked
    and the state dict's keys the model has no place for (both empty when ``strict``)."""

    missing_keys: list[str]
    unexpected_keys: list[str]


# -- the seeded generator -------------------------------------------------------------------
_rng = threading.local()


def manual_seed(seed: int) -> None:
    """Seed this thread's random numbers: the initialisation generator (numpy
    ``default_rng(seed)``) and the dropout generator (``tp.manual_seed``).

    Every layer built afterwards in this thread draws its initial weights from it, in
    construction order, and every dropout mask after it comes from the same sequence, so
    ``manual_seed(s)`` followed by the same program gives bit-identical results. Threads that
    never call it start from seed 0. Also ``pc.manual_seed``.
    """
    _rng.generator = np.random.default_rng(int(seed))
    seed_dropout(int(seed))


def seed_dropout(seed: int) -> None:
    from ..tape.ops.nn import manual_seed as seed_masks
    seed_masks(seed)


HOST_DRAW = ("values drawn on the host (pc.nn.init, a layer built): a replay would upload the "
             "recording's draw again")


def default_generator() -> np.random.Generator:
    """This thread's initialisation generator (``default_rng(0)`` until ``manual_seed``).
    A step being captured that draws from it runs eagerly (``HOST_DRAW``)."""
    recorder.unsafe(HOST_DRAW)
    gen = getattr(_rng, "generator", None)
    if gen is None:
        gen = _rng.generator = np.random.default_rng(0)
    return gen


def set_default_generator(generator: np.random.Generator) -> None:
    """Make ``generator`` this thread's initialisation generator (``ReplicaGroup`` gives each
    replica thread a copy of its caller's, so ``pc.manual_seed(s)`` before the group seeds
    the model it builds)."""
    _rng.generator = generator


def uniform_(shape, bound: float) -> np.ndarray:
    """Host array ~ U(-bound, bound) from the thread's generator (float32)."""
    return default_generator().uniform(-bound, bound, size=shape).astype(np.float32)


def normal_(shape, std: float) -> np.ndarray:
    """Host array ~ N(0, std^2) from the thread's generator (float32)."""
    return (default_generator().standard_normal(size=shape) * std).astype(np.float32)


# -- Parameter --------------------------------------------------------------------------------
def lazy_layers(model: Module) -> list[tuple[str, Module]]:
    """``(path, layer)`` of every lazy layer of ``model`` not yet built (``nn.lazy``: no
    parameters before its first call), in ``named_modules`` order."""
    return [(name, m) for name, m in model.named_modules()
            if getattr(m, "has_uninitialized_params", lambda: False)()]


class Parameter(Node):
    """A leaf ``tp.Node`` with ``requires_grad=True``: a weight a Module owns.

    >>> w = pc.nn.Parameter.from_host(q, np.zeros((3, 4), np.float32))
    >>> w.requires_grad, w.shape
    (True, (3, 4))
    """

    # No __slots__: users may hang their own attributes on a Parameter, as on PyTorch's.

    def __init__(self, value: Tensor, requires_grad: bool = True):
        if isinstance(value, Node):
            value = value.value
        super().__init__(value, requires_grad=requires_grad, op_name="parameter")

    @classmethod
    def from_host(cls, queue: cl.CommandQueue | None, array) -> Parameter:
        """A Parameter holding a device copy of ``array`` (``queue=None``: default queue)."""
        return cls(Tensor.from_host(queue if queue is not None else default_queue(),
                                    np.asarray(array, dtype=np.float32)))

    def __deepcopy__(self, memo: dict) -> Parameter:
        """A new Parameter holding a device copy, on the same queue (``.grad`` not copied),
        as PyTorch's: a pyopencl queue cannot be copied (``parcl.nn.clone``)."""
        from .clone import clone_value
        return clone_value(self, memo)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop ``.grad`` (``set_to_none``) or fill it with zeros; noted (``zeroed_at``) even
        where there is none: a ReplicaGroup drops the other replicas' then too, where this
        replica's backward did not reach the parameter and theirs did."""
        super().zero_grad(set_to_none)
        self.zeroed_at = stamp()

    def __repr__(self) -> str:
        return f"Parameter(shape={self.shape})"


# -- Module -----------------------------------------------------------------------------------
class Module:
    """Base class of layers and models: registration, modes, state dicts.

    Subclasses call ``super().__init__()`` first, then assign Parameters, sub-modules and
    buffers as attributes, and define ``forward``; ``module(x)`` calls ``forward(x)``.
    ``forward`` accepts a ``tp.Node`` or a raw ``pc.Tensor`` (under ``tp.no_grad()`` every op
    returns a raw Tensor, so the whole model does).

    >>> class Net(pc.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.fc = pc.nn.Linear(4, 2)
    ...     def forward(self, x):
    ...         return self.fc(x)
    >>> [name for name, _ in Net().named_parameters()]
    ['fc.weight', 'fc.bias']
    """

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    # -- registration --------------------------------------------------------------------
    def _registries(self):
        try:
            return self._parameters, self._buffers, self._modules
        except AttributeError:
            raise ParclError(f"{type(self).__name__}: call super().__init__() before assigning "
                             "attributes in __init__") from None

    def __setattr__(self, name: str, value) -> None:
        params, buffers, modules = self._registries()
        if isinstance(value, Parameter):
            # may be registered in several modules (weight tying: another module's Parameter)
            self._place(params, name, value)
        elif isinstance(value, Module):
            self._place(modules, name, value)
        elif name in params:
            # PyTorch's TypeError: a Node or Tensor put here would silently leave
            # parameters(), the optimizer and every checkpoint (also where the slot holds
            # None: Linear(bias=False).bias = t would be a bias no optimizer trains)
            if value is not None:
                raise TypeError(f"{type(self).__name__}.{name} is a parameter: assign a "
                                f"pc.nn.Parameter or None, not {type(value).__name__} (to "
                                f"change its value in place: {name}.value.copy_(t) or "
                                f"load_state_dict)")
            params[name] = None           # the slot keeps its place, as PyTorch's
        elif name in modules and value is not None:
            # PyTorch's TypeError: ``model.fc = 5`` would silently take fc's parameters out
            # of parameters(), the optimizer and every checkpoint
            raise TypeError(f"{type(self).__name__}.{name} is a submodule: assign a "
                            f"pc.nn.Module or None, not {type(value).__name__} (delattr it "
                            "first to hold something else under that name)")
        elif name in modules:
            # the slot keeps its place, as PyTorch's: a child assigned there again runs
            # where it was in a Sequential, and state_dict() and parameters() keep their order
            modules[name] = None
        elif name in buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"{type(self).__name__}.{name} is a buffer: assign a pc.Tensor "
                                f"or None, not {type(value).__name__}")
            buffers[name] = value
        else:
            self._forget(name)
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        self._forget(name)
        object.__delattr__(self, name)

    def _forget(self, name: str) -> None:
        for registry in self._registries():
            registry.pop(name, None)
        self._non_persistent_buffers().discard(name)

    def _registrar(self, registry: OrderedDict) -> str:
        return {id(self._parameters): "register_parameter", id(self._buffers):
                "register_buffer"}.get(id(registry), "add_module")

    def _check_name(self, registry: OrderedDict, name: str) -> None:
        if not isinstance(name, str) or not name or "." in name:
            # PyTorch's KeyError: "a.b" would read as child "a"'s "b" in state-dict keys
            # (two tensors under one key), "" gives keys ".weight"
            raise StateDictError(f"{type(self).__name__}.{self._registrar(registry)}"
                                 f"({name!r}): a name must be a non-empty string without '.' "
                                 "(state-dict keys join names with '.')")

    def _claim(self, registry: OrderedDict, name: str) -> None:
        """What ``register_parameter``, ``register_buffer`` and ``add_module`` check before
        ``_place``: as PyTorch's, they replace only a value of their own kind; a name the
        module has as anything else is a ``NameInUseError`` (``register_buffer("weight", t)``
        on a Linear would take its weight out of ``parameters()``, the optimizer and
        training)."""
        self._check_name(registry, name)
        if name not in registry and hasattr(self, name):
            params, buffers, modules = self._registries()
            kind = ("a parameter" if name in params else "a buffer" if name in buffers
                    else "a submodule" if name in modules else "an attribute")
            raise NameInUseError(f"{type(self).__name__}.{self._registrar(registry)}"
                                 f"({name!r}): attribute {name!r} already exists ({kind}); "
                                 f"delattr it first to register something else under it")

    def _place(self, registry: OrderedDict, name: str, value) -> None:
        """Register ``value`` as ``name`` in ``registry``. One replacing a value of the same
        kind keeps its place in the order, as PyTorch's: ``seq.add_module("1", Sigmoid())``
        still runs second in a Sequential, and ``state_dict()`` and ``parameters()`` keep
        their order (what an optimizer's state and a checkpoint are matched by)."""
        self._check_name(registry, name)
        for other in self._registries():
            if other is not registry:
                other.pop(name, None)
        registry[name] = value              # an existing key keeps its position

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        """Register ``param`` under ``name`` (None: an absent optional parameter)."""
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"register_parameter({name!r}): expected an nn.Parameter, got "
                            f"{type(param).__name__}")
        # None keeps an empty slot (PyTorch's): a Parameter assigned later takes its place,
        # and anything else assigned there is a TypeError
        self._claim(self._parameters, name)
        self._place(self._parameters, name, param)
        object.__setattr__(self, name, param)

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True
                        ) -> None:
        """Register a non-trainable tensor (running statistics): in ``buffers()``, not in
        ``parameters()``; in ``state_dict`` unless ``persistent=False`` (PyTorch's: a mask or
        a table the module rebuilds itself, kept out of checkpoints)."""
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"register_buffer({name!r}): expected a pc.Tensor, got "
                            f"{type(tensor).__name__}")
        self._claim(self._buffers, name)
        self._place(self._buffers, name, tensor)
        object.__setattr__(self, name, tensor)
        self._non_persistent_buffers().discard(name)
        if not persistent:
            if "_non_persistent" not in self.__dict__:
                object.__setattr__(self, "_non_persistent", set())
            self._non_persistent_buffers().add(name)

    def _non_persistent_buffers(self) -> set[str]:
        """Names of the buffers ``state_dict`` leaves out (an attribute only of the modules
        that register one, so other modules' attributes stay as they were)."""
        return self.__dict__.get("_non_persistent", set())

    def add_module(self, name: str, module: Module | None) -> None:
        """Register ``module`` as the child ``name`` (one replacing a child keeps its place)."""
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"add_module({name!r}): expected an nn.Module, got "
                            f"{type(module).__name__}")
        self._claim(self._modules, name)
        self._place(self._modules, name, module)    # None keeps an empty slot, as PyTorch's
        object.__setattr__(self, name, module)

    def get_submodule(self, target: str) -> Module:
        """The descendant at the dotted path ``target`` (``""``: this module), as PyTorch's;
        an ``AttributeError`` naming the missing step otherwise."""
        module = self
        for i, name in enumerate(target.split(".") if target else []):
            child = module._modules.get(name)
            if child is None:
                where = ".".join(target.split(".")[:i]) or type(self).__name__
                raise AttributeError(f"get_submodule({target!r}): {where} has no submodule "
                                     f"{name!r}")
            module = child
        return module

    def get_parameter(self, target: str) -> Parameter:
        """The Parameter at the dotted path ``target`` (``"0.weight"``), as PyTorch's."""
        return self._get_registered(target, "_parameters", "parameter")

    def get_buffer(self, target: str) -> Tensor:
        """The buffer at the dotted path ``target`` (``"bn.running_mean"``), as PyTorch's."""
        return self._get_registered(target, "_buffers", "buffer")

    def _get_registered(self, target: str, registry: str, what: str):
        path, _, name = target.rpartition(".")
        owner = self.get_submodule(path)
        value = getattr(owner, registry).get(name)
        if value is None:
            raise AttributeError(f"get_{what}({target!r}): {type(owner).__name__} has no "
                                 f"{what} {name!r}")
        return value

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        """Set ``requires_grad`` on every parameter (``False`` freezes them: no gradient, the
        optimizer skips them), as PyTorch's; returns the module."""
        if not isinstance(requires_grad, (bool, np.bool_)):
            raise ParclError(f"{type(self).__name__}.requires_grad_: expected a bool, got "
                             f"{requires_grad!r}")
        # a lazy layer has no parameters until its first call, so the flag would be lost
        # and the layer trained anyway: PyTorch refuses its uninitialized parameters too
        lazy = lazy_layers(self)
        if lazy:
            where = f"its layer {lazy[0][0]!r} is" if lazy[0][0] else "it is"
            raise ParclError(f"{type(self).__name__}.requires_grad_: {where} a lazy layer, "
                             "whose parameters do not exist before its first call (PyTorch "
                             "refuses its uninitialized parameters); run a batch through it "
                             "first")
        for p in self.parameters():
            p.requires_grad = bool(requires_grad)
        return self

    # -- traversal -----------------------------------------------------------------------
    def named_modules(self, memo: set | None = None, prefix: str = "",
                      remove_duplicate: bool = True) -> Iterator[tuple[str, Module]]:
        """``(name, module)`` for this module and every descendant, depth first, each once
        (``remove_duplicate=False``: under every name it is reached by), as PyTorch's;
        ``memo`` holds the ids of modules already given."""
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        if remove_duplicate:
            memo.add(id(self))
        yield prefix, self
        for name, child in self._children():
            yield from child.named_modules(memo, f"{prefix}.{name}" if prefix else name,
                                           remove_duplicate)

    def _children(self) -> Iterator[tuple[str, Module]]:
        """``(name, child)`` of every child slot that holds a module (``add_module(name,
        None)`` and ``child = None`` keep an empty slot, as PyTorch's)."""
        return ((name, child) for name, child in self._modules.items() if child is not None)

    def modules(self) -> list[Module]:
        return [m for _, m in self.named_modules()]

    def named_children(self) -> Iterator[tuple[str, Module]]:
        """``(name, child)`` for each direct sub-module, in registration order; one registered
        under two names (``Sequential(layer, layer)``) comes once, under its first, as in
        PyTorch."""
        seen: set[int] = set()
        for name, child in self._children():
            if id(child) not in seen:
                seen.add(id(child))
                yield name, child

    def children(self) -> list[Module]:
        """The direct sub-modules, each once (see ``named_children``)."""
        return [child for _, child in self.named_children()]

    def _named_members(self, store: str, prefix: str, recurse: bool,
                       remove_duplicate: bool = True) -> Iterator[tuple]:
        """``(name, value)`` of every module's ``store`` dict (``_parameters``, ``_buffers``)
        in registration order, None skipped; each value once (a tied weight under its first
        name) unless ``remove_duplicate`` is False."""
        seen: set[int] = set()
        mods = (self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate)
                if recurse else [(prefix, self)])
        for mod_name, mod in mods:
            for name, v in getattr(mod, store).items():
                if v is None or (remove_duplicate and id(v) in seen):
                    continue
                seen.add(id(v))
                yield (f"{mod_name}.{name}" if mod_name else name), v

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, Parameter]]:
        """``(name, parameter)`` in registration order, each parameter once (a tied weight
        under its first name; ``remove_duplicate=False``: under every name), as PyTorch's."""
        return self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse: bool = True) -> list[Parameter]:
        """Every Parameter, in registration order, without duplicates."""
        return [p for _, p in self.named_parameters(recurse=recurse)]

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[tuple[str, Tensor]]:
        """``(name, buffer)`` in registration order, each buffer once (``remove_duplicate``
        as ``named_parameters``)."""
        return self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True) -> list[Tensor]:
        return [b for _, b in self.named_buffers(recurse=recurse)]

    def apply(self, fn) -> Module:
        """Call ``fn(module)`` on every sub-module (children first) and on self; a child
        registered under two names is visited once through this module, as in PyTorch (an
        ``fn`` that scales weights must not scale a repeated layer twice)."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    @property
    def queue(self) -> cl.CommandQueue | None:
        """The queue assigned to ``self.queue``, else that of the module's first parameter or
        buffer (None if it has none)."""
        assigned = self.__dict__.get("_queue")
        if assigned is not None:
            return assigned
        for _, p in self.named_parameters():
            return p.value.queue
        for _, b in self.named_buffers():
            return b.queue
        return None

    @queue.setter
    def queue(self, queue: cl.CommandQueue | None) -> None:
        object.__setattr__(self, "_queue", queue)

    def __deepcopy__(self, memo: dict) -> Module:
        """``copy.deepcopy(module)`` as PyTorch's: an independent copy, its Parameters and
        buffers device copies on the same queues (``clone_module``; a pyopencl queue cannot
        itself be copied)."""
        from .clone import clone_module
        return clone_module(self, memo)

    # -- modes ---------------------------------------------------------------------------
    def train(self, mode: bool = True) -> Module:
        """Training mode (batch statistics, dropout on) for this module and its children:
        ``child.train(mode)`` on each child, as PyTorch's, so a child's own override of
        ``train`` (one that keeps its batch norm in evaluation) takes effect. ``mode`` must
        be a bool: ``train("eval")`` would otherwise mean training (PyTorch's ValueError)."""
        if not isinstance(mode, (bool, np.bool_)):
            raise ParclError(f"{type(self).__name__}.train: mode must be a bool, got {mode!r} "
                             f"({type(mode).__name__}); use eval() for evaluation")
        object.__setattr__(self, "training", bool(mode))
        for child in self.children():
            child.train(mode)
        return self

    def eval(self) -> Module:
        """Evaluation mode (running statistics, dropout off); same as ``train(False)``."""
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear every parameter's ``.grad`` (zero-filled instead when ``set_to_none`` is
        False)."""
        for p in self.parameters():
            p.zero_grad(set_to_none)

    # -- state dicts ---------------------------------------------------------------------
    def _state_tensors(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        """``(key, tensor)`` for every state-dict entry: parameters then buffers of each
        module, depth first (PyTorch's order; shared tensors appear under every name)."""
        for name, p in self._parameters.items():
            if p is not None:
                yield prefix + name, p.value
        skipped = self._non_persistent_buffers()
        for name, b in self._buffers.items():
            if b is not None and name not in skipped:
                yield prefix + name, b
        for name, child in self._children():
            yield from child._state_tensors(f"{prefix}{name}.")

    def _ignored_state_keys(self, prefix: str = "") -> set[str]:
        """Keys ``load_state_dict`` accepts and drops (PyTorch's ``num_batches_tracked``)."""
        keys = {prefix + k for k in getattr(self, "_ignored_keys", ())}
        for name, child in self._children():
            keys |= child._ignored_state_keys(f"{prefix}{name}.")
        return keys

    def _refuse_extra_state(self, op: str) -> None:
        """PyTorch puts what a module's ``get_extra_state`` returns in its state dict under
        ``_extra_state`` and gives it back to ``set_extra_state``; parcl's state dicts hold
        arrays only, so a module defining them would lose that state without a word."""
        for name, module in self.named_modules():
            cls = type(module)
            if hasattr(cls, "get_extra_state") or hasattr(cls, "set_extra_state"):
                where = f"its module {name!r}" if name else "it"
                raise StateDictError(
                    f"{type(self).__name__}.{op}: {where} ({cls.__name__}) defines "
                    "get_extra_state/set_extra_state, PyTorch's '_extra_state' entry, which "
                    "parcl's state dicts do not hold; keep that state beside them (a "
                    "checkpoint's meta) instead")

    def _refuse_lazy_entries(self, unexpected: list[str]) -> None:
        """PyTorch's lazy layer takes its parameters' shapes from a state dict's entries for
        it; parcl's has no parameters before its first call, so those entries would be
        dropped as unexpected and, under ``strict=False``, the layer later drawn at random
        instead of holding the saved weights, with no error."""
        if not unexpected:
            return
        for name, module in lazy_layers(self):
            prefix = f"{name}." if name else ""
            mine = [k for k in unexpected if k.startswith(prefix) and "." not in k[len(prefix):]]
            if mine:
                where = f"its lazy layer {name!r}" if name else "it"
                raise StateDictError(
                    f"{type(self).__name__}.load_state_dict: {mine} are entries of {where} "
                    f"({type(module).__name__}), whose parameters do not exist before its "
                    "first call (PyTorch's take their shapes from the state dict); run a batch "
                    "through the model first, then load; nothing was loaded")

    def state_dict(self, *, destination=None, prefix: str = "", keep_vars: bool = False
                   ) -> OrderedDict[str, np.ndarray]:
        """Ordered ``name -> numpy array`` (host copies) of every parameter and buffer, each
        key after ``prefix``, put into ``destination`` (returned) when given, as PyTorch's;
        ``keep_vars=True``: the Parameters and buffer tensors themselves, not copies. A
        module defining PyTorch's ``get_extra_state`` is a ``StateDictError``.

        >>> list(pc.nn.BatchNorm2d(3).state_dict())
        ['weight', 'bias', 'running_mean', 'running_var']
        """
        self._refuse_extra_state("state_dict")
        out = OrderedDict() if destination is None else destination
        params = {id(p.value): p for p in self.parameters()} if keep_vars else {}
        for k, t in self._state_tensors(prefix):
            out[k] = params.get(id(t), t) if keep_vars else t.to_host()
        return out

    def load_state_dict(self, state_dict, strict: bool = True) -> IncompatibleKeys:
        """Copy ``state_dict``'s arrays into the parameters and buffers, in place.

        Everything is checked first: missing or unexpected keys (when ``strict``), wrong
        shapes, non-numeric values, different values under the keys of one tied tensor (GPT's
        ``transformer.wte.weight`` and ``lm_head.weight``); any problem raises (``ShapeError``
        if a shape is wrong, else ``StateDictError``) listing every problem, and nothing is
        changed. Values may be
        numpy arrays, pc.Tensors or anything ``np.asarray`` accepts; they are cast to float32.
        PyTorch's ``*.num_batches_tracked`` entries are accepted and ignored. Returns
        ``(missing_keys, unexpected_keys)`` as PyTorch's: what ``strict=False`` skipped. A
        module defining PyTorch's ``set_extra_state`` is a ``StateDictError``.

        >>> pc.nn.Linear(2, 2).load_state_dict({"weight": np.zeros((2, 2))}, strict=False)
        IncompatibleKeys(missing_keys=['bias'], unexpected_keys=[])
        """
        if not hasattr(state_dict, "items"):
            raise StateDictError(f"{type(self).__name__}.load_state_dict: expected a mapping "
                                 f"name -> array, got {type(state_dict).__name__}")
        self._refuse_extra_state("load_state_dict")
        targets = list(self._state_tensors())
        names = {k for k, _ in targets}
        ignored = self._ignored_state_keys()
        missing = [k for k, _ in targets if k not in state_dict]
        unexpected = [k for k in state_dict if k not in names and k not in ignored]
        self._refuse_lazy_entries(unexpected)
        key_problems, shape_problems = [], []
        if strict and missing:
            key_problems.append(f"missing keys {missing}")
        if strict and unexpected:
            key_problems.append(f"unexpected keys {unexpected}")
        uploads: list[tuple[Tensor, np.ndarray]] = []
        first: dict[int, tuple[str, np.ndarray]] = {}   # a tied tensor's first key and value
        for key, tensor in targets:
            if key not in state_dict:
                continue
            try:
                array = host_copy(state_dict[key], tensor.dtype)
            except (TypeError, ValueError) as e:
                key_problems.append(f"{key!r} is not a numeric array ({e})")
                continue
            if array.shape != tuple(tensor.shape):
                shape_problems.append(f"{key!r} has shape {array.shape}, the model's is "
                                      f"{tuple(tensor.shape)}")
                continue
            # A tensor under several keys (tied weights) takes one value: different ones
            # (an untied model's) would leave whichever key comes last, silently.
            seen = first.setdefault(id(tensor), (key, array))
            if seen[0] != key and not np.array_equal(seen[1], array, equal_nan=True):
                key_problems.append(f"{seen[0]!r} and {key!r} are one tied tensor in "
                                    f"{type(self).__name__} but differ in the state dict "
                                    f"(weights of an untied model?)")
                continue
            uploads.append((tensor, array))
        problems = shape_problems + key_problems
        if problems:
            cls = ShapeError if shape_problems else StateDictError
            raise cls(f"{type(self).__name__}.load_state_dict: " + "; ".join(problems)
                      + "; nothing was loaded")
        for tensor, array in uploads:
            # Non-blocking: pyopencl's event keeps `array` alive until the copy is done, and
            # in-order queues run it before any later kernel reads the tensor.
            transfer(tensor.queue, tensor.data, array)
        # Each noted as updated, parameters and buffers alike: a backward through ops recorded
        # before that saved one now raises, and a ReplicaGroup copies them to its other
        # replicas before its next step (``StepBuffers.changed_since``).
        changed(tensor for tensor, _ in uploads)
        return IncompatibleKeys(missing, unexpected)

    # -- calling -------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    _hooks: ModuleHooks | None = None        # set on the first hook registered

    def __call__(self, *args, **kwargs):
        rec = recorder.state.recording
        if rec is not None:     # a captured step's: replayed while this module's hooks stay
            rec.note_hooked(self)
        hooks = self._hooks
        if hooks is None:
            return self.forward(*args, **kwargs)
        return hooks.call(self, args, kwargs)

    def register_forward_pre_hook(self, hook, *, with_kwargs: bool = False,
                                  prepend: bool = False) -> RemovableHandle:
        """Call ``hook(module, args)`` before each ``forward``; a returned value (a tuple, or
        one value) replaces the positional arguments. ``with_kwargs=True``: ``hook(module,
        args, kwargs)`` returning None or ``(args, kwargs)``. ``prepend``: before the hooks
        already registered. As PyTorch's; ``handle.remove()`` takes it out."""
        return self._module_hooks().add("forward_pre", hook, with_kwargs, False, prepend)

    def register_forward_hook(self, hook, *, with_kwargs: bool = False, always_call: bool = False,
                              prepend: bool = False) -> RemovableHandle:
        """Call ``hook(module, args, output)`` after each ``forward`` (``with_kwargs=True``:
        ``hook(module, args, kwargs, output)``); a returned value replaces the output.
        ``always_call=True``: also when the forward raised. As PyTorch's."""
        return self._module_hooks().add("forward", hook, with_kwargs, always_call, prepend)

    def register_full_backward_pre_hook(self, hook, prepend: bool = False) -> RemovableHandle:
        """Call ``hook(module, grad_output)`` in each backward once the output's gradient is
        complete; a returned tuple replaces ``grad_output``. As PyTorch's, for a module that
        returns one Node (``parcl.nn.module_hooks``)."""
        return self._module_hooks().add("backward_pre", hook, prepend=prepend)

    def register_full_backward_hook(self, hook, prepend: bool = False) -> RemovableHandle:
        """Call ``hook(module, grad_input, grad_output)`` in each backward once the gradient
        of the input is complete (at once when no input requires grad); a returned tuple
        replaces ``grad_input``. As PyTorch's, for a module that returns one Node and takes
        at most one input that requires grad (``parcl.nn.module_hooks``)."""
        return self._module_hooks().add("backward", hook, prepend=prepend)

    @property
    def hook_ids(self) -> tuple:
        """The handle ids of the hooks this module holds, in order (``()``: none): a captured
        step that called it replays only while they are the ones its call left."""
        hooks = self._hooks
        return () if hooks is None else hooks.ids

    def _module_hooks(self) -> ModuleHooks:
        if self._hooks is None:
            object.__setattr__(self, "_hooks", ModuleHooks())
        return self._hooks

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        if not self._modules:
            return lines[0] + ")"
        for name, child in self._modules.items():
            body = repr(child).replace("\n", "\n  ")
            lines.append(f"  ({name}): {body}")
        return "\n".join(lines) + "\n)"
