"""Checkpoints and resumes that must not silently train on the wrong data or with the wrong
state: each test is a reproducer of a run that once went on without an error and gave other
numbers than an uninterrupted run."""

from __future__ import annotations

import numpy as np
import pytest

import parcl as pc
import parcl.tape as tp


def _batches(loader, n):
    return [b.tolist() for (b,), _ in zip(loader, range(n))]


def test_a_loader_rolled_back_inside_its_loop_goes_on_from_the_loaded_position():
    """A training loop that reloads its last checkpoint when something goes wrong (a NaN
    loss) calls ``loader.load_state_dict`` inside ``for xb in loader``. The pass used to go
    on in the order of the epoch it had started, labelled with the loaded epoch: samples of
    epoch 1 trained as epoch 0's, and epoch 1 seen twice."""
    x = np.arange(12)
    loader = pc.data.DataLoader(x, batch_size=2, shuffle=True, seed=5)
    rolled_back = {**loader.state_dict(), "epoch": 0, "batch_index": 1}
    for _ in loader:                       # epoch 0 done: the pass below is epoch 1's
        pass
    seen = []
    for i, (b,) in enumerate(loader):
        seen.append(b.tolist())
        if i == 2:
            loader.load_state_dict(rolled_back)
    fresh = pc.data.DataLoader(x, batch_size=2, shuffle=True, seed=5)
    fresh.load_state_dict(rolled_back)
    assert seen[3:] == _batches(fresh, 5)
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["batch_index"] == 0


def test_set_epoch_during_a_pass_switches_to_that_epochs_order():
    """``set_epoch(3)`` between two batches of epoch 0 used to replay epoch 0's order from
    its first batch while the loader said epoch 3."""
    loader = pc.data.DataLoader(np.arange(12), batch_size=2, shuffle=True, seed=5)
    seen = []
    for i, (b,) in enumerate(loader):
        seen.append(b.tolist())
        if i == 1:
            loader.set_epoch(3)
    assert seen[2:] == loader.indices(3).reshape(-1, 2).tolist()


def _adam_checkpoint(path):
    pc.nn.manual_seed(0)
    model = pc.nn.Linear(3, 2)
    opt = pc.optim.Adam(model.parameters(), lr=1e-2)
    with tp.Tape() as tape:
        loss = tp.mse_loss(model(tp.tensor(np.ones((4, 3)))),
                           pc.Tensor.zeros(model.weight.queue, (4, 2)))
    tape.backward(loss)
    opt.step()
    pc.save(path, model, opt, step=1)
    return opt


def test_a_tensor_table_that_says_another_dtype_is_refused(tmp_path):
    """The safetensors header's table of dtypes and shapes is under no checksum: the tensor
    checksums cover the bytes, the document's its own JSON. Three bits turning an Adam
    moment's ``F32`` into ``I32`` left every checksum valid, and a fresh optimizer (which has
    no state to compare with) loaded moments of about -1e9 without a word."""
    path = tmp_path / "ckpt.safetensors"
    _adam_checkpoint(path)
    data = bytearray(path.read_bytes())
    entry = b'"optim.state.0.exp_avg":{"dtype":"F32"'
    at = data.index(entry) + len(entry) - 4
    data[at:at + 1] = b"I"
    path.write_bytes(bytes(data))
    pc.nn.manual_seed(0)
    model = pc.nn.Linear(3, 2)
    opt = pc.optim.Adam(model.parameters(), lr=1e-2)
    before = model.weight.to_host()
    with pytest.raises(pc.CheckpointError, match=r"exp_avg' is int32 \[2, 3\] in the file, "
                                                 r"saved as \['float32', \[2, 3\]\]"):
        pc.load(path, model, opt)
    assert opt.state_dict()["state"] == {}
    np.testing.assert_array_equal(model.weight.to_host(), before)


def test_a_scheduler_without_its_optimizer_is_refused(tmp_path, queue):
    """``pc.load(path, model, scheduler=s)`` restored the schedule's counters but not the
    optimizer's learning rates, so a recursive schedule went on from the fresh rate (StepLR
    halving every step: 0.1 then 0.05 instead of the saved 0.025 then 0.0125), silently."""
    model = pc.nn.Linear(2, 2, queue=queue)
    opt = pc.optim.SGD(model.parameters(), lr=0.1)
    sched = pc.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    sched.step()
    sched.step()
    path = tmp_path / "ckpt.safetensors"
    pc.save(path, model, opt, step=2, scheduler=sched)
    fresh = pc.nn.Linear(2, 2, queue=queue)
    fresh_sched = pc.optim.lr_scheduler.StepLR(pc.optim.SGD(fresh.parameters(), lr=0.1),
                                               step_size=1, gamma=0.5)
    with pytest.raises(pc.CheckpointError, match="without its optimizer"):
        pc.load(path, fresh, scheduler=fresh_sched)
    opt2 = pc.optim.SGD(fresh.parameters(), lr=0.1)
    sched2 = pc.optim.lr_scheduler.StepLR(opt2, step_size=1, gamma=0.5)
    pc.load(path, fresh, opt2, scheduler=sched2)
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.025)
