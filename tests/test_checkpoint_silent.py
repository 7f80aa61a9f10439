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


def two_layers(queue):
    pc.nn.manual_seed(0)
    return pc.nn.Sequential(pc.nn.Linear(4, 4, queue=queue), pc.nn.ReLU(),
                            pc.nn.Linear(4, 4, queue=queue))


def adam_step(model, opt, queue):
    import parcl.tape as tp
    x = pc.Tensor.from_host(queue, np.arange(8, dtype=np.float32).reshape(2, 4) / 8)
    with tp.Tape() as tape:
        loss = tp.mse_loss(model(tp.tensor(x)), pc.Tensor.zeros(queue, (2, 4)))
    tape.backward(loss)
    opt.step()
    opt.zero_grad()


def test_optimizer_state_is_refused_when_it_would_land_on_other_parameters(tmp_path, queue):
    """The optimizer's state is numbered by its parameters' order and mapped back by position
    (as PyTorch does), so an optimizer built over the same parameters in another order
    (``[layer 2, layer 0]``, param groups split differently, same shapes) used to load: layer
    2 got layer 0's Adam moments and the other way round, and the resumed run trained on with
    no error. The checkpoint now names the model key of each parameter's state, and a state
    that would land on a parameter of another name is refused, changing nothing. The same
    order, or an optimizer the same way round, resumes as before."""
    path = str(tmp_path / "ckpt.safetensors")
    model = two_layers(queue)
    opt = pc.optim.Adam(model.parameters(), lr=0.1)
    adam_step(model, opt, queue)
    pc.save(path, model, opt)

    fresh = two_layers(queue)
    swapped = pc.optim.Adam([*fresh[2].parameters(), *fresh[0].parameters()], lr=0.1)
    with pytest.raises(pc.CheckpointError, match=r"0\.weight.*2\.weight|2\.weight.*0\.weight"):
        pc.load(path, fresh, swapped)
    assert swapped.state == {}
    np.testing.assert_array_equal(fresh[0].weight.to_host(), two_layers(queue)[0].weight.to_host())

    same = pc.optim.Adam(fresh.parameters(), lr=0.1)
    pc.load(path, fresh, same)
    adam_step(model, opt, queue)
    adam_step(fresh, same, queue)
    np.testing.assert_array_equal(fresh[2].weight.to_host(), model[2].weight.to_host())


def test_a_checkpoint_without_parameter_names_still_loads(tmp_path, queue, monkeypatch):
    """Checkpoints written before the names were saved load as they did (positionally)."""
    from parcl import checkpoint
    path = str(tmp_path / "ckpt.safetensors")
    model = two_layers(queue)
    opt = pc.optim.Adam(model.parameters(), lr=0.1)
    adam_step(model, opt, queue)
    monkeypatch.setattr(checkpoint, "optimizer_param_names", lambda *a: None)
    pc.save(path, model, opt)
    monkeypatch.undo()
    fresh = two_layers(queue)
    pc.load(path, fresh, pc.optim.Adam([*fresh[2].parameters(), *fresh[0].parameters()],
                                       lr=0.1))


@pytest.mark.parametrize("meta", [{"accuracy": {9: 0.91, 10: 0.93}},
                                  {"history": [{"step": 3, "lr": {0: 0.1}}]},
                                  {"flags": {True: "on"}}])
def test_meta_with_keys_json_would_turn_into_strings_is_refused(tmp_path, queue, meta):
    """JSON keys are strings, and ``json.dumps`` turned an int key into one without a word:
    ``pc.save(..., accuracy={9: 0.91, 10: 0.93})`` loaded back as ``{"9": ..., "10": ...}``,
    so ``max(meta["accuracy"])``, the last epoch a resume goes on from, was ``"9"`` (strings
    sort "10" < "9"), and ``{1: a, "1": b}`` kept only one. Such a key is refused now, as a
    value JSON cannot carry is, naming where it is; nothing is written."""
    path = tmp_path / "ckpt.safetensors"
    model, _ = make(queue)
    with pytest.raises(TypeError, match="key .* is not a string"):
        pc.save(path, model, **meta)
    assert not path.exists()
    pc.save(path, model, accuracy={"9": 0.91, "10": 0.93}, pairs=[[9, 0.91], [10, 0.93]])
    assert pc.load(path, model)["pairs"] == [[9, 0.91], [10, 0.93]]
