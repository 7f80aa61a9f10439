"""What the optimizers check of their inputs: ``OptimizerError``, numeric options, that
parameters come in an order that is the same in every run, and the indices of a saved state
dict."""

from __future__ import annotations

from ..errors import ParclError

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
