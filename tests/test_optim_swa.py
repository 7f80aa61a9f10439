"""pc.optim.swa_utils as torch.optim.swa_utils: AveragedModel's averages (SWA by default, EMA
through multi_avg_fn or avg_fn, with or without the buffers) equal PyTorch's over five
updates with PyTorch's state-dict keys, update_bn recomputes BatchNorm statistics as
PyTorch's and restores mode and momenta, SWALR's learning rates equal PyTorch's bit for bit
(cos, linear, no annealing, two groups), and refused arguments."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.optim.swa_utils as TS

import parcl as pc
from parcl.optim import OptimizerError
from parcl.optim import swa_utils as S
from parcl.optim.lr_scheduler import SchedulerError


def model_pair():
    model = pc.nn.Sequential(pc.nn.Linear(4, 3), pc.nn.BatchNorm1d(3), pc.nn.Linear(3, 2))
    torch_model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3),
                                      torch.nn.Linear(3, 2))
    torch_model.load_state_dict({k: torch.tensor(v) for k, v in model.state_dict().items()},
                                strict=False)
    return model, torch_model


def new_values(model, rng):
    state = {k: rng.standard_normal(v.shape).astype(np.float32)
             for k, v in model.state_dict().items()}
    return {k: np.abs(v) + 0.5 if "running_var" in k else v for k, v in state.items()}


@pytest.mark.parametrize("options, torch_options", [
    ({}, {}),
    ({"multi_avg_fn": S.get_ema_multi_avg_fn(0.9)}, {"multi_avg_fn": TS.get_ema_multi_avg_fn(0.9)}),
    ({"avg_fn": S.get_ema_avg_fn(0.8)}, {"avg_fn": TS.get_ema_avg_fn(0.8)}),
    ({"avg_fn": S.get_swa_avg_fn()}, {"avg_fn": TS.get_swa_avg_fn()}),
    ({"use_buffers": True}, {"use_buffers": True}),
])
def test_averaged_model_averages_as_pytorch(options, torch_options):
    rng = np.random.default_rng(0)
    model, torch_model = model_pair()
    averaged = S.AveragedModel(model, **options)
    torch_averaged = TS.AveragedModel(torch_model, **torch_options)
    for _ in range(5):
        state = new_values(model, rng)
        model.load_state_dict(state)
        torch_model.load_state_dict({k: torch.tensor(v) for k, v in state.items()},
                                    strict=False)
        averaged.update_parameters(model)
        torch_averaged.update_parameters(torch_model)
    got, want = averaged.state_dict(), torch_averaged.state_dict()
    assert list(got) == [k for k in want if not k.endswith("num_batches_tracked")]
    assert got["n_averaged"] == 5
    for k, v in got.items():
        np.testing.assert_allclose(v, want[k].numpy(), rtol=1e-6, atol=1e-7, err_msg=k)


def test_averaged_model_runs_the_averaged_copy_and_leaves_the_model_alone():
    pc.nn.manual_seed(0)
    model = pc.nn.Linear(2, 1)
    swa = S.AveragedModel(model)
    weights = [np.array([[1.0, 2.0]]), np.array([[3.0, 6.0]])]
    for w in weights:
        model.load_state_dict({"weight": w}, strict=False)
        swa.update_parameters(model)
    assert swa.module.weight is not model.weight
    np.testing.assert_array_equal(swa.module.weight.value.to_host(), [[2.0, 4.0]])
    np.testing.assert_array_equal(model.weight.value.to_host(), [[3.0, 6.0]])
    x = pc.Tensor.from_host(model.queue, np.ones((1, 2), np.float32))
    np.testing.assert_allclose(swa(x).to_host(), [6.0 + model.bias.value.to_host()], rtol=1e-6)


def test_averaged_model_updates_read_nothing_back_and_follow_a_loaded_count(monkeypatch):
    # n_averaged is kept on the host as well; parcl read the buffer back at every update.
    # A count loaded into the buffer (or written to it) is read once and followed, as
    # PyTorch's: 3 models averaged, then [[8, 8]] weighs a quarter
    pc.nn.manual_seed(0)
    model = pc.nn.Linear(2, 1, bias=False)
    swa = S.AveragedModel(model)
    reads = []
    real = pc.Tensor.to_host
    monkeypatch.setattr(pc.Tensor, "to_host", lambda self: reads.append(1) or real(self))
    for w in ([[1.0, 2.0]], [[3.0, 6.0]], [[5.0, 1.0]]):
        model.load_state_dict({"weight": np.array(w)})
        swa.update_parameters(model)
    assert reads == []
    swa.load_state_dict({"module.weight": np.array([[4.0, 4.0]]), "n_averaged": np.array(3)})
    model.load_state_dict({"weight": np.array([[8.0, 8.0]])})
    swa.update_parameters(model)
    assert len(reads) == 1                    # the loaded count, once
    swa.update_parameters(model)
    assert len(reads) == 1
    monkeypatch.undo()
    torch_model = torch.nn.Linear(2, 1, bias=False)
    torch_swa = TS.AveragedModel(torch_model)
    torch_swa.load_state_dict({"module.weight": torch.tensor([[4.0, 4.0]]),
                               "n_averaged": torch.tensor(3)})
    with torch.no_grad():
        torch_model.weight.copy_(torch.tensor([[8.0, 8.0]]))
    torch_swa.update_parameters(torch_model)
    torch_swa.update_parameters(torch_model)
    np.testing.assert_allclose(swa.module.weight.value.to_host(),
                               torch_swa.module.weight.detach().numpy(), rtol=1e-6)
    assert int(swa.state_dict()["n_averaged"]) == int(torch_swa.n_averaged) == 5


def test_averaged_model_follows_a_count_buffer_assigned_in_its_place_as_pytorch():
    # Assigning a fresh n_averaged restarts the average, as PyTorch's. Kept by address, the
    # host count outlived the second of two such tensors, which the pool gave the first
    # buffer's address back: [[8, 8]] was averaged in as a third model, [[4, 5.33]], where
    # PyTorch copies it as the first
    model = pc.nn.Linear(2, 1, bias=False)
    swa = S.AveragedModel(model)
    torch_model = torch.nn.Linear(2, 1, bias=False)
    torch_swa = TS.AveragedModel(torch_model)
    for w in ([[1.0, 2.0]], [[3.0, 6.0]]):
        model.load_state_dict({"weight": np.array(w)})
        swa.update_parameters(model)
        with torch.no_grad():
            torch_model.weight.copy_(torch.tensor(w))
        torch_swa.update_parameters(torch_model)
    for _ in range(2):
        swa.n_averaged = pc.Tensor.from_host(swa.n_averaged.queue, np.array(0, np.int64))
        torch_swa.n_averaged = torch.tensor(0)
    model.load_state_dict({"weight": np.array([[8.0, 8.0]])})
    swa.update_parameters(model)
    with torch.no_grad():
        torch_model.weight.copy_(torch.tensor([[8.0, 8.0]]))
    torch_swa.update_parameters(torch_model)
    np.testing.assert_array_equal(swa.module.weight.value.to_host(), [[8.0, 8.0]])
    np.testing.assert_array_equal(torch_swa.module.weight.detach().numpy(), [[8.0, 8.0]])
    assert int(swa.n_averaged.to_host()) == int(torch_swa.n_averaged) == 1


def test_update_bn_recomputes_the_statistics_as_pytorch():
    rng = np.random.default_rng(1)
    model, torch_model = model_pair()
    model.eval()
    batches = [rng.standard_normal((8, 4)).astype(np.float32) * 3 + 1 for _ in range(3)]
    S.update_bn([(b, 0) for b in batches], model)
    TS.update_bn([(torch.tensor(b), 0) for b in batches], torch_model)
    for k in ("1.running_mean", "1.running_var"):
        np.testing.assert_allclose(model.state_dict()[k],
                                   torch_model.state_dict()[k].numpy(), rtol=1e-5, err_msg=k)
    assert not model.training and model[1].momentum == 0.1
    assert list(model.state_dict()) == ["0.weight", "0.bias", "1.weight", "1.bias",
                                        "1.running_mean", "1.running_var", "2.weight", "2.bias"]


@pytest.mark.parametrize("options", [
    {"swa_lr": 0.05, "anneal_epochs": 5},
    {"swa_lr": 0.05, "anneal_epochs": 3, "anneal_strategy": "linear"},
    {"swa_lr": 0.5, "anneal_epochs": 0},
    {"swa_lr": [0.05, 0.01], "anneal_epochs": 4},
])
def test_swalr_sets_pytorchs_learning_rates_bit_for_bit(options):
    layer, torch_layer = pc.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    opt = pc.optim.SGD([{"params": [layer.weight]}, {"params": [layer.bias], "lr": 0.1}],
                       lr=0.3)
    torch_opt = torch.optim.SGD([{"params": [torch_layer.weight]},
                                 {"params": [torch_layer.bias], "lr": 0.1}], lr=0.3)
    sched, torch_sched = S.SWALR(opt, **options), TS.SWALR(torch_opt, **options)
    assert sched.get_last_lr() == torch_sched.get_last_lr()
    for _ in range(8):
        opt.step()
        torch_opt.step()
        sched.step()
        torch_sched.step()
        assert sched.get_last_lr() == torch_sched.get_last_lr()
    again = S.SWALR(pc.optim.SGD(layer.parameters(), lr=0.3), swa_lr=0.05)
    with pytest.raises(SchedulerError):
        again.load_state_dict({"last_epoch": 2})


def test_swa_utils_refuse_bad_arguments():
    model = pc.nn.Linear(2, 2)
    with pytest.raises(OptimizerError, match="not both"):
        S.AveragedModel(model, avg_fn=S.get_swa_avg_fn(), multi_avg_fn=S.get_swa_multi_avg_fn())
    with pytest.raises(OptimizerError, match="decay"):
        S.get_ema_multi_avg_fn(1.5)
    with pytest.raises(OptimizerError, match="do not match"):
        S.AveragedModel(model).update_parameters(pc.nn.Linear(3, 2))
    opt = pc.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(SchedulerError, match="anneal_strategy"):
        S.SWALR(opt, swa_lr=0.01, anneal_strategy="step")
    with pytest.raises(SchedulerError, match="anneal_epochs"):
        S.SWALR(opt, swa_lr=0.01, anneal_epochs=-1)
