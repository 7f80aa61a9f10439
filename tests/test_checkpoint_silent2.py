"""Restarts that went wrong or failed where PyTorch's resume: each test trains, saves, resumes
in fresh objects and checks the rest of the run against the uninterrupted one and PyTorch's."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp

RECURSIVE = {
    "ExponentialLR": lambda S, o: S.ExponentialLR(o, 0.9),
    "StepLR": lambda S, o: S.StepLR(o, 2, 0.5),
    "ChainedScheduler": lambda S, o: S.ChainedScheduler([S.ExponentialLR(o, 0.9),
                                                         S.StepLR(o, 2, 0.5)]),
    "ReduceLROnPlateau": lambda S, o: S.ReduceLROnPlateau(o, patience=0, factor=0.5),
}


class _NoModel:
    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def _steps(sched, lrs_of, count):
    out = []
    for _ in range(count):
        if isinstance(sched, (pc.optim.lr_scheduler.ReduceLROnPlateau,
                              torch.optim.lr_scheduler.ReduceLROnPlateau)):
            sched.step(1.0)                  # no improvement: a reduction every step
        else:
            sched.step()
        out.append(lrs_of())
    return out


@pytest.mark.parametrize("name", RECURSIVE)
def test_a_schedule_stepping_a_group_added_after_it_resumes_as_pytorch(queue, tmp_path, name):
    """A recursive schedule made before ``add_param_group`` steps the new group along, as
    PyTorch's (tests/test_optim_groups.py); its state saved after such a step holds one
    ``_last_lr`` per group, two, where the rebuilt scheduler, made over one group before the
    same ``add_param_group``, holds one. ``pc.load`` refused it ('_last_lr [0.0729, 0.03645]
    does not fit the optimizer's 1 parameter groups'), so such a run could not resume at all;
    PyTorch's resumes, and so does parcl's now, on the uninterrupted run's learning rates."""
    make = RECURSIVE[name]
    S = pc.optim.lr_scheduler

    def build():
        ps = [tp.tensor(pc.Tensor.from_host(queue, np.ones(2, np.float32)), requires_grad=True)
              for _ in range(2)]
        opt = pc.optim.SGD([ps[0]], lr=0.1)
        sched = make(S, opt)
        opt.add_param_group({"params": [ps[1]], "lr": 0.05})
        return opt, sched

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # PyTorch's warning: no optimizer.step() before
        ts = [torch.nn.Parameter(torch.ones(2)) for _ in range(2)]
        topt = torch.optim.SGD([ts[0]], lr=0.1)
        tsched = make(torch.optim.lr_scheduler, topt)
        topt.add_param_group({"params": [ts[1]], "lr": 0.05})
        want = _steps(tsched, lambda: [g["lr"] for g in topt.param_groups], 6)

    opt, sched = build()
    whole = _steps(sched, lambda: [g["lr"] for g in opt.param_groups], 6)
    opt, sched = build()
    first = _steps(sched, lambda: [g["lr"] for g in opt.param_groups], 3)
    path = str(tmp_path / "ckpt.safetensors")
    pc.save(path, _NoModel(), opt, scheduler=sched)
    opt, sched = build()
    pc.load(path, _NoModel(), opt, scheduler=sched)
    resumed = first + _steps(sched, lambda: [g["lr"] for g in opt.param_groups], 3)
    assert resumed == whole
    np.testing.assert_allclose(whole, want, rtol=1e-15)
    assert len(whole[-1]) == 2 and whole[-1][1] < 0.05 * 0.6      # the added group was stepped


def test_a_schedule_state_of_another_number_of_groups_is_still_refused(queue):
    p = tp.tensor(pc.Tensor.from_host(queue, np.ones(2, np.float32)), requires_grad=True)
    sched = pc.optim.lr_scheduler.ExponentialLR(pc.optim.SGD([p], lr=0.1), 0.9)
    state = sched.state_dict()
    with pytest.raises(pc.optim.lr_scheduler.SchedulerError, match="_last_lr .* does not fit"):
        sched.load_state_dict({**state, "_last_lr": [0.1, 0.1, 0.1]})
    assert sched.get_last_lr() == [0.1]


@pytest.mark.parametrize("strict", [True, False])
def test_a_state_dict_for_a_lazy_layer_before_its_first_call_is_refused_not_dropped(queue, strict):
    """PyTorch's lazy layer takes its parameters' shapes from a state dict's entries; parcl's
    has none before its first call (docs/api.md: run a batch first). Under ``strict=False``
    ``load_state_dict`` dropped the entries as unexpected and the first call then drew the
    layer at random: a model 'loaded' from a checkpoint gave -0.590 where the saved one (and
    PyTorch's loaded lazy model) gives 0.237, with no error. The load is refused now, naming
    the layer, and changes nothing; keys of other layers still load under strict=False."""
    pc.nn.manual_seed(0)
    saved = pc.nn.Sequential(pc.nn.Linear(4, 3), pc.nn.Tanh(), pc.nn.Linear(3, 1))
    state = saved.state_dict()
    pc.nn.manual_seed(1)
    model = pc.nn.Sequential(pc.nn.Linear(4, 3), pc.nn.Tanh(), pc.nn.LazyLinear(1))
    before = model[0].weight.to_host()
    with pytest.raises(pc.nn.StateDictError, match=r"\['2.weight', '2.bias'\] are entries of "
                                                   r"its lazy layer '2' \(LazyLinear\)"):
        model.load_state_dict(state, strict=strict)
    np.testing.assert_array_equal(model[0].weight.to_host(), before)      # nothing loaded

    tmodel = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.LazyLinear(1))
    result = tmodel.load_state_dict({k: torch.tensor(v) for k, v in state.items()},
                                    strict=strict)
    assert (result.missing_keys, result.unexpected_keys) == ([], [])     # PyTorch took them
    x = np.ones((1, 4), np.float32)
    want = saved(tp.tensor(pc.Tensor.from_host(queue, x))).to_host()
    np.testing.assert_allclose(tmodel(torch.tensor(x)).detach().numpy(), want, rtol=1e-5)

    others = {k: v for k, v in state.items() if k.startswith("0.")}
    assert model.load_state_dict(others, strict=False).unexpected_keys == []
    np.testing.assert_array_equal(model[0].weight.to_host(), state["0.weight"])
