"""Parametrized attributes, as ``torch.nn.utils.parametrize``: after
``register_parametrization(module, "weight", p)`` reading ``module.weight`` computes
``p(original)`` from the Parameter(s) kept under ``module.parametrizations.weight``
(``original``, or ``original0``, ``original1``, ... where ``p.right_inverse`` gives several),
so gradients reach the originals and state-dict keys are PyTorch's
(``parametrizations.weight.original0``).

As PyTorch does, the module's class is swapped for a subclass (``ParametrizedLinear``) whose
``weight`` is a property: the layer's own ``forward`` reads it unchanged. Assigning
``module.weight = t`` sets the originals from ``t`` through ``right_inverse``.

>>> lin = pc.nn.Linear(3, 4)
>>> pc.nn.utils.parametrizations.weight_norm(lin)            # doctest: +SKIP
>>> sorted(lin.state_dict())                                  # doctest: +SKIP
['bias', 'parametrizations.weight.original0', 'parametrizations.weight.original1']
"""

from __future__ import annotations

from ... import tape as tp
from ...errors import ParclError
from ...tensor import Tensor
from ..containers import ModuleDict, ModuleList
from ..module import Module, Parameter
from .class_layers import set_layer

__all__ = ["ParametrizationList", "is_parametrized", "register_parametrization",
           "remove_parametrizations"]


def _tensor(value) -> Tensor:
    return value if isinstance(value, Tensor) else value.value


class ParametrizationList(ModuleList):
    """The parametrizations of one attribute (children ``0``, ``1``, ... applied in order) and
    its original Parameter(s), as PyTorch's."""

    def __init__(self, modules, original: Parameter):
        super().__init__(modules)
        first = modules[0]
        with tp.no_grad():
            new = first.right_inverse(original) if hasattr(first, "right_inverse") \
                else original
        self.is_tensor = not isinstance(new, (tuple, list))
        if self.is_tensor:
            # the Parameter itself is kept (an optimizer built before still updates it)
            if _tensor(new) is not original.value:
                original.value.copy_(_tensor(new))
            self.original = original
        else:
            self.ntensors = len(new)
            for i, t in enumerate(new):
                value = _tensor(t)
                value = value.copy() if value is original.value else value
                setattr(self, f"original{i}", Parameter(value, original.requires_grad))

    def originals(self) -> tuple:
        if self.is_tensor:
            return (self.original,)
        return tuple(getattr(self, f"original{i}") for i in range(self.ntensors))

    def right_inverse(self, value) -> None:
        """Set the originals, in place, so that the parametrized value becomes ``value``."""
        new = value
        with tp.no_grad():
            for module in reversed(list(self)):
                if hasattr(module, "right_inverse"):
                    new = module.right_inverse(new)
        new = (new,) if self.is_tensor else tuple(new)
        for p, t in zip(self.originals(), new):
            t = _tensor(t)
            if tuple(t.shape) != tuple(p.shape):
                raise ParclError(f"assigning a parametrized tensor: right_inverse gave shape "
                                 f"{tuple(t.shape)} for an original of shape {tuple(p.shape)}")
            p.value.copy_(t)          # copy_ notes the overwrite (a backward then raises)

    def forward(self):
        modules = list(self)
        x = modules[0](*self.originals())
        for module in modules[1:]:
            x = module(x)
        return x


def _make_class(base: type, names: frozenset) -> type:
    def setattr_(self, attr, value):
        if attr in type(self)._parametrized_names:
            self.parametrizations[attr].right_inverse(value)
        else:
            base.__setattr__(self, attr, value)

    body = {"_parametrized_names": names, "__setattr__": setattr_,
            "__module__": base.__module__}
    for n in names:
        body[n] = property(lambda self, n=n: self.parametrizations[n]())
    return type(f"Parametrized{base.__name__}", (base,), body)


def _names(module: Module) -> frozenset:
    return getattr(type(module), "_parametrized_names", frozenset())


def is_parametrized(module: Module, tensor_name: str | None = None) -> bool:
    """Whether ``module`` has a parametrization (on ``tensor_name``, if given)."""
    names = getattr(type(module), "_parametrized_names", None)
    if not names:
        return False
    return tensor_name is None or tensor_name in names


def register_parametrization(module: Module, tensor_name: str, parametrization: Module,
                             *, unsafe: bool = False) -> Module:
    """Make ``module.<tensor_name>`` computed by ``parametrization`` (a Module whose forward
    takes the original(s); with a ``right_inverse`` the originals are what it gives for the
    current value), as PyTorch's; a second one on the same name is applied after the first.
    Returns ``module``."""
    if not isinstance(parametrization, Module):
        raise ParclError(f"register_parametrization: the parametrization must be a "
                         f"pc.nn.Module, got {type(parametrization).__name__}")
    if is_parametrized(module, tensor_name):
        plist = module.parametrizations[tensor_name]
        if not unsafe:
            with tp.no_grad():
                current = plist()
                out = parametrization(current)
            if tuple(out.shape) != tuple(current.shape):
                raise ParclError(f"register_parametrization: {type(parametrization).__name__} "
                                 f"changes the shape of {tensor_name!r} from "
                                 f"{tuple(current.shape)} to {tuple(out.shape)}")
        plist.append(parametrization)
        return module
    original = module._parameters.get(tensor_name)
    if original is None:
        raise ParclError(f"register_parametrization: {type(module).__name__} has no parameter "
                         f"{tensor_name!r} to parametrize (its parameters: "
                         f"{[k for k, v in module._parameters.items() if v is not None]})")
    plist = ParametrizationList([parametrization], original)
    if not unsafe:
        with tp.no_grad():
            out = plist()
        if tuple(out.shape) != tuple(original.shape):
            raise ParclError(f"register_parametrization: {type(parametrization).__name__} "
                             f"gives {tensor_name!r} the shape {tuple(out.shape)}, not "
                             f"{tuple(original.shape)}; pass unsafe=True to allow it")
    delattr(module, tensor_name)
    if "parametrizations" not in module._modules:
        module.parametrizations = ModuleDict()
    module.parametrizations[tensor_name] = plist
    set_layer(module, "parametrize", frozenset({tensor_name}) | _names(module), _make_class)
    return module


def remove_parametrizations(module: Module, tensor_name: str,
                            leave_parametrized: bool = True) -> Module:
    """Undo ``register_parametrization`` on ``tensor_name``, as PyTorch's: the attribute is a
    plain Parameter again, holding the parametrized value (``leave_parametrized``) or the
    original (only where there is one original)."""
    if not is_parametrized(module, tensor_name):
        raise ParclError(f"remove_parametrizations: {type(module).__name__} has no "
                         f"parametrization on {tensor_name!r}")
    plist = module.parametrizations[tensor_name]
    if leave_parametrized:
        with tp.no_grad():
            value = _tensor(plist())
        if plist.is_tensor:
            param = plist.original
            param.value.copy_(value)
        else:
            param = Parameter(value.copy(), plist.original0.requires_grad)
    elif plist.is_tensor:
        param = plist.original
    else:
        raise ParclError(f"remove_parametrizations: {tensor_name!r} has "
                         f"{plist.ntensors} originals; only leave_parametrized=True can "
                         "make one parameter of them")
    del module.parametrizations[tensor_name]
    names = _names(module) - {tensor_name}
    set_layer(module, "parametrize", names or None, _make_class)
    if not names:
        delattr(module, "parametrizations")
    setattr(module, tensor_name, param)
    return module
