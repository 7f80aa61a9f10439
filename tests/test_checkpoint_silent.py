"""Checkpoint round trips that used to give silently wrong results, each test its reproducer,
with what parcl did and what a correct resume does."""

from __future__ import annotations

import numpy as np
import pytest

import parcl as pc
from parcl.optim.lr_scheduler import StepLR


def make(queue):
    pc.nn.manual_seed(0)
    model = pc.nn.Linear(3, 2, queue=queue)
    return model, pc.optim.SGD(model.parameters(), lr=1.0, momentum=0.9)


@pytest.mark.parametrize("call", ["save", "load"])
def test_a_scheduler_of_another_optimizer_is_refused(tmp_path, queue, call):
    """``pc.load(path, model, opt, scheduler=s)`` with ``s`` built over another optimizer (the
    one of a run rebuilt after a failure, or a second optimizer of the same model) used to
    load: ``s`` got the saved schedule, but every ``s.step()`` after set the learning rates
    of the other optimizer, so ``opt`` trained on at the checkpoint's learning rate for the
    rest of the run, with no error. ``pc.save`` with such a pair saved a schedule that was
    not ``opt``'s. Both refuse it now, and ``load`` changes nothing; the scheduler of
    ``opt`` itself round-trips."""
    path = str(tmp_path / "ckpt.safetensors")
    model, opt = make(queue)
    sched = StepLR(opt, step_size=1, gamma=0.5)
    sched.step()
    pc.save(path, model, opt, scheduler=sched)
    fresh, fresh_opt = make(queue)
    _, other = make(queue)
    wrong = StepLR(other, step_size=1, gamma=0.5)
    with pytest.raises(pc.CheckpointError, match="scheduler.*another optimizer"):
        if call == "save":
            pc.save(str(tmp_path / "other.safetensors"), fresh, fresh_opt, scheduler=wrong)
        else:
            pc.load(path, fresh, fresh_opt, scheduler=wrong)
    assert wrong.last_epoch == 0 and fresh_opt.param_groups[0]["lr"] == 1.0
    np.testing.assert_array_equal(fresh.weight.to_host(), model.weight.to_host())
    right = StepLR(fresh_opt, step_size=1, gamma=0.5)
    pc.load(path, fresh, fresh_opt, scheduler=right)
    right.step()
    assert fresh_opt.param_groups[0]["lr"] == 0.25
