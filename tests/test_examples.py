"""The digits examples reach their accuracy targets, in seconds: the MLP >= 95%, the CNN
>= 97% (examples/train_digits.py), the depthwise-separable CNN >= 95%
(examples/train_mobilenet_digits.py), the data-parallel CNN on 2 replicas >= 97%
(examples/train_digits_dp.py under parcl-launch), whose captured steps are bit-identical to its
eager ones."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = {k: v for k, v in os.environ.items()
       if k not in ("PARCL_DEVICES", "PYOPENCL_CTX") and not k.startswith(("PMI_", "OMPI_"))}

pytestmark = pytest.mark.slow


def example(name: str):
    """The module of examples/``name``.py, imported."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(ROOT / "examples"))


def final_accuracy(cmd: list[str]) -> float:
    r = subprocess.run([sys.executable, *cmd, "--no-progress"], capture_output=True, text=True,
                       timeout=120, cwd=ROOT, env=ENV)
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("test accuracy: "), r.stdout
    return float(last.split(": ")[1])


@pytest.mark.parametrize("model, target", [("mlp", 0.95), ("cnn", 0.97)])
def test_train_digits_reaches_its_target(model, target):
    assert final_accuracy(["examples/train_digits.py", "--model", model]) >= target


def test_train_digits_takes_a_learning_rate_of_zero_and_refuses_zero_epochs():
    """`args.lr or 3e-3` trained --lr 0 at 3e-3 (83.8 % after one epoch, the untrained model's
    7.0 %), and --epochs 0 ran the default 12 epochs."""
    train_digits = example("train_digits")
    import parcl as pc
    x_train, _, x_test, y_test = pc.data.load_digits()
    _, x_test = train_digits.standardize(x_train, x_test)
    pc.nn.manual_seed(0)
    untrained = train_digits.accuracy(train_digits.build_mlp(), pc.default_queue(), x_test,
                                      y_test)
    assert train_digits.main(["--lr", "0", "--epochs", "1", "--no-progress"]) == untrained
    with pytest.raises(SystemExit):
        train_digits.main(["--epochs", "0", "--no-progress"])


def test_train_mobilenet_digits_reaches_95_percent():
    """The depthwise-separable CNN (examples/train_mobilenet_digits.py), a short run."""
    acc = final_accuracy(["examples/train_mobilenet_digits.py", "--epochs", "6"])
    assert acc >= 0.95


def test_train_mobilenet_digits_refuses_zero_epochs():
    """--epochs 0 trained nothing and printed "test accuracy: 0.0000", a figure never measured
    (the untrained model scores about 10 %)."""
    for epochs in ("0", "-1"):
        with pytest.raises(SystemExit) as e:
            example("train_mobilenet_digits").main(["--epochs", epochs, "--no-progress"])
        assert e.value.code == 2


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--steps", "-2"], ["--batch-size", "0"]])
def test_train_transformer_histogram_refuses_runs_that_train_nothing(argv):
    """--steps 0 or -2 trained nothing and printed the untrained model's "test accuracy:
    0.097" as the result; --batch-size 0 failed in Tensor.from_host of the first batch."""
    with pytest.raises(SystemExit) as e:
        example("train_transformer_histogram").main([*argv, "--no-progress"])
    assert e.value.code == 2


def test_train_digits_dp_on_two_replicas_reaches_97_percent():
    acc = final_accuracy(["-m", "parcl.launch", "--replicas", "2",
                          "examples/train_digits_dp.py"])
    assert acc >= 0.97


def test_train_digits_dp_captured_steps_are_bit_identical_to_eager_ones(tmp_path):
    """The example replays captured steps by default; --no-capture runs them eagerly."""
    from safetensors.numpy import load_file

    saved = {}
    for mode in ("--capture", "--no-capture"):
        out = tmp_path / mode.strip("-")
        r = subprocess.run([sys.executable, "-m", "parcl.launch", "--replicas", "2",
                            "examples/train_digits_dp.py", mode, "--max-steps", "12",
                            "--checkpoint", str(out), "--no-progress"],
                           capture_output=True, text=True, timeout=120, cwd=ROOT, env=ENV)
        assert r.returncode == 0, r.stderr
        saved[mode] = load_file(out / "last.safetensors")
    captured, eager = saved["--capture"], saved["--no-capture"]
    assert captured.keys() == eager.keys() and len(captured) > 0
    for key in captured:
        np.testing.assert_array_equal(captured[key], eager[key], err_msg=key)


# -- the transformer examples (need pc.optim.lr_scheduler) -------------------------------------
GPT_SHORT = ["examples/train_gpt.py", "--n-layer", "2", "--n-embd", "64", "--block-size", "32",
             "--max-chars", "300000", "--eval-every", "1000", "--eval-batches", "2",
             "--sample-chars", "20", "--no-progress"]


def test_train_gpt_beats_the_unigram_baseline_in_a_short_run():
    """200 steps of a small GPT already predict the stdlib's characters far better than
    their frequencies do; the run prints both figures, and a greedy and a sampled text."""
    r = subprocess.run([sys.executable, *GPT_SHORT, "--max-steps", "200"], capture_output=True,
                       text=True, timeout=180, cwd=ROOT, env=ENV)
    assert r.returncode == 0, r.stderr
    assert "--- greedy ---\ndef " in r.stdout and "--- temperature 0.8" in r.stdout
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("validation: "), r.stdout
    val_bits = float(last.split(", ")[1].split()[0])
    unigram_bits = float(last.split(", ")[2].split()[0])
    assert 4.0 < unigram_bits < 5.5 and val_bits < unigram_bits - 0.5, last


def test_train_gpt_warmup_zero_starts_at_the_peak_learning_rate_as_pytorchs_cosine():
    """--warmup 0 still warmed up for one step (max(1, warmup)): the first step at 2e-4, a
    tenth of the peak 2e-3."""
    import torch

    import parcl as pc
    opt = pc.optim.AdamW([pc.nn.Parameter.from_host(pc.default_queue(), np.zeros(2, np.float32))],
                         lr=2e-3)
    sched = example("train_gpt").warmup_cosine(opt, 10, 0, 2e-4)
    ref_opt = torch.optim.AdamW([torch.zeros(2, requires_grad=True)], lr=2e-3)
    ref = torch.optim.lr_scheduler.CosineAnnealingLR(ref_opt, T_max=10, eta_min=2e-4)
    got, want = [], []
    for _ in range(12):
        got.append(opt.param_groups[0]["lr"])
        want.append(ref_opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
        ref_opt.step()
        ref.step()
    assert got[0] == 2e-3
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_train_gpt_captured_steps_are_bit_identical_to_eager_ones(tmp_path):
    from safetensors.numpy import load_file

    saved = {}
    for mode in ("--capture", "--no-capture"):
        out = tmp_path / mode.strip("-")
        r = subprocess.run([sys.executable, *GPT_SHORT, mode, "--max-steps", "4",
                            "--checkpoint", str(out)], capture_output=True, text=True,
                           timeout=120, cwd=ROOT, env=ENV)
        assert r.returncode == 0, r.stderr
        saved[mode] = load_file(out / "last.safetensors")
    captured, eager = saved["--capture"], saved["--no-capture"]
    assert "model.lm_head.weight" in captured and captured.keys() == eager.keys()
    for key in captured:
        np.testing.assert_array_equal(captured[key], eager[key], err_msg=key)


def test_train_gpt_resumed_run_is_bit_identical_to_an_uninterrupted_one(tmp_path):
    """Model, AdamW state, loader position, schedule and the dropout masks' generators all
    come back from the checkpoint."""
    from safetensors.numpy import load_file

    def run(out, *extra):
        r = subprocess.run([sys.executable, *GPT_SHORT, "--max-steps", "6", "--dropout", "0.1",
                            "--checkpoint", str(out), *extra], capture_output=True, text=True,
                           timeout=120, cwd=ROOT, env=ENV)
        assert r.returncode == 0, r.stderr
        return r.stdout

    run(tmp_path / "whole")
    run(tmp_path / "parts", "--stop-at", "3")
    assert "resumed from" in run(tmp_path / "parts")    # as a parcl-launch restart runs it
    whole = load_file(tmp_path / "whole" / "last.safetensors")
    parts = load_file(tmp_path / "parts" / "last.safetensors")
    assert whole.keys() == parts.keys()
    for key in whole:
        np.testing.assert_array_equal(parts[key], whole[key], err_msg=key)


def test_train_gpt_resuming_a_finished_run_reports_its_validation_loss(tmp_path):
    """Run again on its checkpoint, a finished run resumed at its last step, made no step and
    so no evaluation, and reported "validation: nan nats/char" (and main returned nan);
    --eval-every 0 ended in a ZeroDivisionError after the first step."""
    def last_line(*extra):
        r = subprocess.run([sys.executable, *GPT_SHORT, "--n-layer", "1", "--n-embd", "32",
                            "--block-size", "16", "--max-steps", "2", *extra],
                           capture_output=True, text=True, timeout=120, cwd=ROOT, env=ENV)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip().splitlines()[-1]

    first = last_line("--checkpoint", str(tmp_path))
    again = last_line("--checkpoint", str(tmp_path))
    assert first.startswith("validation: ") and "nan" not in first, first
    assert again == first
    with pytest.raises(SystemExit) as e:
        example("train_gpt").parse_args(["--eval-every", "0"])
    assert e.value.code == 2


def test_train_gpt_logs_the_learning_rate_its_step_used():
    """The log line of step N showed the scheduler's rate after step N, the next step's: with
    --warmup 0 step 1 trains at the peak 2e-3 but was logged at 1.10e-03, and the last step
    at --min-lr, a rate no step used."""
    r = subprocess.run([sys.executable, *GPT_SHORT, "--n-layer", "1", "--n-embd", "32",
                        "--block-size", "16", "--max-steps", "2", "--warmup", "0",
                        "--eval-every", "1"], capture_output=True, text=True, timeout=120,
                       cwd=ROOT, env=ENV)
    assert r.returncode == 0, r.stderr
    lrs = [line.split(", lr ")[1].split()[0] for line in r.stdout.splitlines()
           if line.startswith("step ")]
    assert lrs == ["2.00e-03", "1.10e-03"], r.stdout


def test_examples_refuse_to_resume_with_another_schedule(tmp_path):
    """pc.load restores the scheduler and the optimizer's lr and weight decay, so a resumed
    run's --max-steps / --epochs / --lr / --warmup / --min-lr / --weight-decay were ignored:
    train_gpt.py run to --max-steps 4 then resumed with --max-steps 8 kept the 4-step cosine
    and climbed back to the peak lr (2e-4, 1.1e-3, 2e-3, 1.1e-3 over steps 5-8), silently."""
    def run(script, out, *extra):
        base = GPT_SHORT[1:] + ["--n-layer", "1", "--n-embd", "32", "--block-size", "16"] \
            if script == "train_gpt" else ["--batch-size", "256", "--no-progress"]
        return subprocess.run([sys.executable, f"examples/{script}.py", *base, *extra,
                               "--checkpoint", str(out)], capture_output=True, text=True,
                              timeout=120, cwd=ROOT, env=ENV)

    assert run("train_gpt", tmp_path / "gpt", "--max-steps", "2").returncode == 0
    r = run("train_gpt", tmp_path / "gpt", "--max-steps", "4")
    assert r.returncode == 1 and "continues a run of --max-steps 2" in r.stderr, r.stderr
    r = run("train_gpt", tmp_path / "gpt", "--max-steps", "2", "--lr", "1e-3")
    assert r.returncode == 1 and "--lr 0.001" in r.stderr, r.stderr
    assert "resumed from" in run("train_gpt", tmp_path / "gpt", "--max-steps", "2").stdout
    assert run("train_digits_dp", tmp_path / "dp", "--max-steps", "2").returncode == 0
    r = run("train_digits_dp", tmp_path / "dp", "--epochs", "3")
    assert r.returncode == 1 and "continues a run of --epochs 10" in r.stderr, r.stderr
    assert "resumed from" in run("train_digits_dp", tmp_path / "dp", "--max-steps", "3").stdout


@pytest.mark.parametrize("name, argv", [
    ("train_digits_dp", ["--epochs", "0"]), ("train_digits_dp", ["--max-steps", "-1"]),
    ("train_digits_dp", ["--save-every", "-5"]), ("train_gpt", ["--max-steps", "-1"]),
    ("train_gpt", ["--stop-at", "-1"]), ("train_gpt", ["--eval-batches", "0"]),
    ("train_gpt", ["--sample-chars", "-3"]), ("train_vit_digits", ["--epochs", "0"]),
    ("train_vit_digits", ["--max-steps", "-3"]), ("train_vit_digits", ["--heads", "5"]),
    ("train_vit_digits", ["--patch", "3"]), ("train_gpt", ["--save-every", "100"]),
    ("train_digits_dp", ["--save-every", "20"])])
def test_examples_refuse_flags_that_train_nothing_or_cannot_run(name, argv):
    """train_digits_dp.py --epochs 0 or --max-steps -1 trained nothing and printed the
    untrained model's accuracy (0.0418) as the result, train_gpt.py --stop-at -1 stopped
    before the first step; train_vit_digits.py --epochs 0 failed in the scheduler and
    --heads 5 (of --dim 64) in a reshape of the first step; --save-every without
    --checkpoint saved nothing. Each is now argparse's error."""
    with pytest.raises(SystemExit) as e:
        example(name).parse_args(argv)
    assert e.value.code == 2


def test_train_vit_digits_on_two_replicas_reaches_97_percent():
    acc = final_accuracy(["-m", "parcl.launch", "--replicas", "2",
                          "examples/train_vit_digits.py"])
    assert acc >= 0.97


def test_train_transformer_histogram_learns_the_counts():
    """examples/train_transformer_histogram.py: pc.nn.TransformerEncoder with a key padding
    mask, well above the 0.38 of always answering the most common count."""
    assert final_accuracy(["examples/train_transformer_histogram.py"]) >= 0.75


def test_train_gpt_replicas_draw_their_own_dropout_masks_and_resume_them(tmp_path):
    """build_model's manual_seed(seed) seeded every replica's dropout generator alike, so
    both replicas dropped the same units of their shards; each now has its own generator,
    saved per rank, and a resumed 2-replica run stays bit-identical to an uninterrupted one."""
    import json

    from safetensors import safe_open
    from safetensors.numpy import load_file

    def run(out, *extra):
        r = subprocess.run([sys.executable, "-m", "parcl.launch", "--replicas", "2",
                            *GPT_SHORT, "--max-steps", "4", "--dropout", "0.1",
                            "--checkpoint", str(out), *extra], capture_output=True, text=True,
                           timeout=120, cwd=ROOT, env=ENV)
        assert r.returncode == 0, r.stderr
        return r.stdout

    run(tmp_path / "whole")
    with safe_open(tmp_path / "whole" / "last.safetensors", "np") as f:
        dropout = json.loads(f.metadata()["parcl"])["meta"]["dropout"]
    (replicas,) = dropout                               # one rank, two replicas
    assert len(replicas) == 2 and replicas[0][0] != replicas[1][0], dropout
    run(tmp_path / "parts", "--stop-at", "2")
    assert "resumed from" in run(tmp_path / "parts")
    whole = load_file(tmp_path / "whole" / "last.safetensors")
    parts = load_file(tmp_path / "parts" / "last.safetensors")
    for key in whole:
        np.testing.assert_array_equal(parts[key], whole[key], err_msg=key)
