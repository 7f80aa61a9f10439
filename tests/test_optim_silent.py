"""Optimizer inputs that used to give silently wrong results, each test its reproducer, with
what parcl did and what PyTorch does."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import parcl as pc
from parcl.optim import SGD, Adam, OptimizerError


def params(queue, *shapes):
    return [pc.nn.Parameter.from_host(queue, np.full(s, i + 1.0, np.float32))
            for i, s in enumerate(shapes)]


@pytest.mark.parametrize("wrap", [
    lambda ps: set(ps), lambda ps: frozenset(ps), lambda ps: [{"params": set(ps)}],
    lambda ps: [{"params": [ps[0]]}, {"params": {ps[1], ps[2]}, "lr": 0.5}]],
    ids=["set", "frozenset", "set-in-group", "set-in-second-group"])
def test_parameters_in_a_set_are_refused(queue, wrap):
    """``SGD({a, b, c})`` used to be accepted: the parameters were numbered in the set's
    iteration order, which follows the objects' hashes (their addresses) and so changes from
    run to run. ``state_dict()`` numbers state by that order and ``load_state_dict`` maps it
    back by position, so a resumed run could give one parameter another's momentum buffer
    (same shapes: no error). PyTorch refuses sets: "optimizer parameters need to be organized
    in ordered collections"."""
    ps = params(queue, (3,), (3,), (3,))
    with pytest.raises(OptimizerError, match="set.*ordered"):
        SGD(wrap(ps), lr=0.1, momentum=0.9)
    SGD(list(ps), lr=0.1)                          # a list (or a dict's keys) is fine
    SGD({p: None for p in ps}.keys(), lr=0.1)


def test_a_state_dict_listing_a_parameter_index_twice_is_refused(queue):
    """A state dict whose ``param_groups`` list the same index twice (``[[0, 1], [1]]`` for
    an optimizer of groups ``[a, b], [c]``, all of one shape) used to load: index 1 was mapped
    to ``b`` and then to ``c``, so ``c`` got ``b``'s Adam state, ``b`` lost its own, and ``a``
    kept ``a``'s, with no error. Every index names one parameter; such a dict fits no
    optimizer, and loading it must change nothing."""
    a, b, c = params(queue, (4,), (4,), (4,))
    opt = Adam([{"params": [a, b]}, {"params": [c]}], lr=0.1)
    for i, p in enumerate((a, b, c)):
        p.grad = pc.Tensor.from_host(queue, np.full(4, i + 1.0, np.float32))
    opt.step()
    saved = opt.state_dict()
    bad = copy.deepcopy(saved)
    bad["param_groups"][1]["params"] = [1]
    fresh = Adam([{"params": [a, b]}, {"params": [c]}], lr=0.1)
    with pytest.raises(OptimizerError, match="index 1 twice"):
        fresh.load_state_dict(bad)
    assert fresh.state == {}
    bad = copy.deepcopy(saved)
    bad["state"] = {0: saved["state"][0], "0": saved["state"][1], 2: saved["state"][2]}
    with pytest.raises(OptimizerError, match="index '0' twice"):
        fresh.load_state_dict(bad)
    assert fresh.state == {}
    fresh.load_state_dict(saved)                   # the real one still loads
    np.testing.assert_array_equal(fresh.state[c]["exp_avg"].to_host(),
                                  opt.state[c]["exp_avg"].to_host())
