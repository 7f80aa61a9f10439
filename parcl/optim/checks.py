"""What the optimizers check of their inputs: ``OptimizerError``, numeric options, parameter
groups and that their parameters come in an order that is the same in every run, and the
indices of a saved state dict."""

from __future__ import annotations

from ..errors import ParclError
from ..tape.node import Node
from ..tensor import FLOAT

__all__ = ["OptimizerError"]


class OptimizerError(ParclError, ValueError):
    """Bad optimizer options, or a state dict that does not fit the optimizer."""


def _nonneg(name: str, value) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise OptimizerError(f"{name} must be a number, got {value!r}") from None
    if not value >= 0.0:       # also rejects NaN
        raise OptimizerError(f"invalid {name}: {value} (must be >= 0)")
    return value


def _nonneg_option(name: str):
    """The check of option ``name``, a number >= 0 (an ``Optimizer.options`` entry)."""
    return lambda v: _nonneg(name, v)


def _real(name: str, value) -> float:
    """``value`` as a float of any sign (a learning rate a step takes); NaN is refused."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise OptimizerError(f"{name} must be a number, got {value!r}") from None
    if value != value:
        raise OptimizerError(f"invalid {name}: {value}")
    return value


def _ordered(cls: str, params) -> None:
    """Refuse a set: its order changes from run to run, and state dicts number by order."""
    if isinstance(params, (set, frozenset)):
        raise OptimizerError(f"{cls}: parameters given as a {type(params).__name__}, whose "
                             "order changes from run to run; state_dict() numbers them in "
                             "order, so give them in an ordered collection (a list)")


def _once(name: str, where: str, key, seen) -> int:
    """``key`` as an index, which ``where`` of a saved state dict must not list twice."""
    if (index := _as_index(name, key)) in seen:
        raise OptimizerError(f"{name}: {where} lists parameter index {key!r} twice; each "
                             "index names one parameter (a damaged state dict?)")
    return index


def _as_index(name: str, key) -> int:
    try:
        if isinstance(key, bool):
            raise ValueError
        return int(key)
    except (TypeError, ValueError):
        raise OptimizerError(f"{name}: parameter index {key!r} is not an integer") from None


def _checked_group(cls: str, group, defaults: dict, seen: set[int]):
    """A parameter group's parameters (a list), its options and its parameters' ids; refuses
    a group that is no dict, a parameter that is no float32 leaf, one in ``seen`` (an earlier
    group) or listed twice, and options ``defaults`` does not have. A frozen parameter
    (``requires_grad=False``) is taken, as PyTorch's: it has no gradient, so each step skips
    it, until it is unfrozen (gradual unfreezing builds the optimizer over all of them)."""
    if not isinstance(group, dict) or "params" not in group:
        raise OptimizerError("parameter groups must be dicts with a 'params' entry")
    plist = group["params"]
    _ordered(cls, plist)
    plist = [plist] if isinstance(plist, Node) else list(plist)
    ids: set[int] = set()
    for p in plist:
        if not isinstance(p, Node):
            raise TypeError(f"{cls}: parameters must be nn.Parameter or tp.Node leaves, got "
                            f"{type(p).__name__}")
        if p.grad_fn is not None:
            # A step writes the op's output in place: the leaf it came from never changes,
            # and its gradient piles up, as no zero_grad of this optimizer reaches it.
            raise OptimizerError(f"{cls}: a parameter of shape {p.shape} is the output of "
                                 f"'{p.op_name}', not a leaf; an optimizer updates leaves "
                                 f"(nn.Parameter, tp.tensor(..., requires_grad=True)): give "
                                 f"it the Parameter this came from (PyTorch refuses it too: "
                                 f"'can't optimize a non-leaf Tensor')")
        if p.value.dtype != FLOAT:
            raise OptimizerError(f"{cls}: parameter of shape {p.shape} has dtype "
                                 f"{p.value.dtype}; only float32 is trained")
        if id(p) in seen or id(p) in ids:
            raise OptimizerError(f"{cls}: a parameter of shape {p.shape} appears more than "
                                 f"once (in two parameter groups, or twice in one)")
        ids.add(id(p))
    opts = {k: v for k, v in group.items() if k != "params"}
    unknown = set(opts) - set(defaults)
    if unknown:
        raise OptimizerError(f"{cls}: unknown options {sorted(unknown)}; {cls} has "
                             f"{sorted(defaults)}")
    return plist, opts, ids
