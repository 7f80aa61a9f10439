"""Checkpoint and resume with examples/train_digits_dp.py: 8 steps in one go, and 4 steps, a
checkpoint and 4 more in a fresh process, end bit-identical (parameters, Adam state, data
position), across an epoch boundary and with the RNG-driven augmentation on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
from safetensors import safe_open

import parcl as pc
import parcl.tape as tp

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_digits_dp.py"
ENV = {k: v for k, v in os.environ.items()
       if k not in ("PARCL_DEVICES", "PYOPENCL_CTX") and not k.startswith(("PMI_", "OMPI_"))}
# 1438 training digits, global batch 256, drop_last: 5 steps per epoch, so step 8 is in the
# second epoch and the resume at step 4 is in the middle of the first.
COMMON = ["--batch-size", "256", "--epochs", "3", "--no-progress", "--augment"]


def train(*args) -> str:
    cmd = [sys.executable, "-m", "parcl.launch", "--replicas", "2", str(EXAMPLE), *COMMON,
           *map(str, args)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, env=ENV)
    assert r.returncode == 0, r.stderr
    return r.stdout


def read(path: Path) -> tuple[dict, dict]:
    with safe_open(str(path), "np") as f:
        doc = json.loads(f.metadata()["parcl"])
    return doc, safetensors.numpy.load_file(str(path))


@pytest.mark.slow
def test_resumed_run_is_bit_identical(tmp_path):
    whole, part = tmp_path / "whole", tmp_path / "part"
    train("--max-steps", 8, "--checkpoint", whole)
    first = train("--max-steps", 4, "--checkpoint", part, "--save-every", 3)
    assert "stopped at step 4" in first
    doc4, _ = read(part / "last.safetensors")
    assert doc4["step"] == 4 and doc4["meta"]["loader"]["batch_index"] == 4
    second = train("--max-steps", 8, "--checkpoint", part, "--resume")
    assert "resumed from" in second and "at step 4" in second

    doc_a, tensors_a = read(whole / "last.safetensors")
    doc_b, tensors_b = read(part / "last.safetensors")
    assert sorted(tensors_a) == sorted(tensors_b)
    assert any(k.startswith("optim.state.") for k in tensors_a)     # Adam moments saved too
    for key in tensors_a:
        assert tensors_a[key].dtype == tensors_b[key].dtype
        np.testing.assert_array_equal(tensors_a[key], tensors_b[key], err_msg=key)
    assert doc_a["step"] == doc_b["step"] == 8
    for key in ("loader", "rng", "epoch"):
        assert doc_a["meta"][key] == doc_b["meta"][key], key
    assert doc_a["meta"]["loader"]["epoch"] == 1                     # crossed an epoch
    assert doc_a["optimizer"]["param_groups"] == doc_b["optimizer"]["param_groups"]   # lr
    state_a, state_b = doc_a["optimizer"]["state"], doc_b["optimizer"]["state"]
    assert [(e["key"], e["scalars"], sorted(e["tensors"])) for e in state_a] == \
        [(e["key"], e["scalars"], sorted(e["tensors"])) for e in state_b]   # Adam step counts


@pytest.mark.slow
def test_resume_without_a_checkpoint_is_a_clear_error(tmp_path):
    cmd = [sys.executable, "-m", "parcl.launch", "--replicas", "2", str(EXAMPLE), *COMMON,
           "--checkpoint", str(tmp_path), "--resume"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, env=ENV)
    assert r.returncode == 1
    assert "CheckpointError" in r.stderr and "no such checkpoint file" in r.stderr


def test_dropout_generator_state_round_trips_through_a_checkpoint(queue, tmp_path):
    """``tp.rng_state()`` saved in a checkpoint's meta and put back with
    ``tp.set_rng_state`` (as JSON gives it back: a list): the resumed run draws the masks
    the uninterrupted run would."""
    x = tp.tensor(pc.Tensor.from_host(queue, np.ones(64, np.float32)))
    tp.manual_seed(3)
    tp.dropout(x, 0.5)
    model = pc.nn.Linear(2, 2, queue=queue)
    pc.save(tmp_path / "ckpt.safetensors", model, dropout=tp.rng_state())
    want = tp.dropout(x, 0.5).to_host()
    tp.manual_seed(99)                               # a restarted process starts elsewhere
    meta = pc.load(tmp_path / "ckpt.safetensors", model)
    assert isinstance(meta["dropout"], list)
    tp.set_rng_state(meta["dropout"])
    np.testing.assert_array_equal(tp.dropout(x, 0.5).to_host(), want)


@pytest.mark.parametrize("state", [None, 3, (1,), (1.5, 0), ("1", 0), (True, 0), (0, -1)])
def test_a_dropout_state_that_is_not_two_ints_is_refused(state):
    before = tp.rng_state()
    with pytest.raises(pc.ParclError, match="set_rng_state: expected a"):
        tp.set_rng_state(state)
    assert tp.rng_state() == before
