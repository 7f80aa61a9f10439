"""parcl-bench: every subcommand in a smoke mode, in-process through ``main([...])``: the table
prints, the JSON parses with the documented fields, the PNG is a PNG matplotlib reads back, the
trace is Chrome-trace JSON with events from every replica."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time

import numpy as np
import pytest

import parcl as pc
import parcl.replica
import parcl.runtime
from parcl.bench import common
from parcl.bench.__main__ import main
from parcl.bench.trace import ChromeTrace, validate

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _check_png(path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, "not a PNG file"
    import matplotlib.pyplot as plt
    img = plt.imread(str(path))
    assert img.ndim == 3 and img.shape[0] >= 100 and img.shape[1] >= 100


def _run(tmp_path, capsys, argv, plot=True):
    out_json, out_png = tmp_path / "result.json", tmp_path / "plot.png"
    extra = ["--json", str(out_json)] + (["--plot", str(out_png)] if plot else [])
    assert main(argv + extra) == 0
    text = capsys.readouterr().out
    result = json.loads(out_json.read_text())
    assert result["benchmark"] == argv[0]
    assert result["command"].startswith(f"parcl-bench {argv[0]}")
    for key in ("schema", "environment", "devices", "params", "notes", "tables"):
        assert key in result
    for dev in result["devices"]:
        assert dev["compute_units"] >= 1 and dev["name"]
        assert f"{dev['compute_units']} CU" in text       # the table states it
    if plot:
        _check_png(out_png)
    return text, result


def _rows(result, table):
    rows = result["tables"][table]["rows"]
    assert rows
    return rows


def _printed(text, result, table):
    """Every column header of ``table`` appears, aligned, in the printed output."""
    lines = text.splitlines()
    at = lines.index(result["tables"][table]["title"])
    header, rule = lines[at + 1], lines[at + 2]
    for _, h in result["tables"][table]["columns"]:
        assert h in header
    assert set(rule) <= {"-", " "}
    width = len(rule)
    for ln in lines[at + 3:at + 3 + len(result["tables"][table]["rows"])]:
        assert len(ln) <= width


# -- allreduce -------------------------------------------------------------------------------
def test_allreduce_smoke(tmp_path, capsys):
    text, result = _run(tmp_path, capsys, ["allreduce", "--sizes", "4K,64K", "--repeat", "2",
                                           "--warmup", "1"])
    rows = _rows(result, "allreduce")
    _printed(text, result, "allreduce")
    from parcl.allreduce import ALGORITHMS
    assert {r["algorithm"] for r in rows} == set(ALGORITHMS)
    assert {r["bytes"] for r in rows} == {4096, 65536}
    for r in rows:
        assert r["wrong"] == 0
        assert r["replicas"] == 2 and r["ranks"] == 1
        assert r["time_us_min"] <= r["time_us"] <= r["time_us_max"]
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / (r["time_us"] * 1e-6) / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 2 * (2 - 1) / 2)
        assert r["memcpy_gbps"] > 0 and r["devcopy_gbps"] > 0


# -- kernels ---------------------------------------------------------------------------------
def test_kernels_smoke(tmp_path, capsys):
    text, result = _run(tmp_path, capsys, [
        "kernels", "--sizes", "64", "--trans", "NN,TN", "--vector-sizes", "4K",
        "--conv", "tiny", "--conv-ext", "tiny_dw,tiny_tconv", "--vocab", "3x1000",
        "--launches", "20", "--repeat", "2", "--chain", "3"])
    for table in ("gemm", "memory", "conv", "conv_ext", "vocab", "launch", "overhead"):
        _printed(text, result, table)
    gemm = _rows(result, "gemm")
    assert {r["trans"] for r in gemm} == {"NN", "TN"}
    assert "whole" in {r["device"] for r in gemm}
    if len(result["devices"]) > 1:                     # the one-CU sub-device vs numpy 1 thread
        sub = [r for r in gemm if r["device"] == "1 CU"]
        assert sub and all(r["numpy_threads"] in (1, "default") for r in sub)
    for r in gemm:
        assert r["gflops"] > 0 and r["numpy_gflops"] > 0
        assert r["ratio_min"] <= r["ratio"] <= r["ratio_max"]     # per-run ratios
    ops = {r["op"] for r in _rows(result, "memory")}
    assert {"add", "relu", "sum (all)"} <= ops
    assert {r["pass"] for r in _rows(result, "conv")} == {"forward", "backward"}
    ext = _rows(result, "conv_ext")
    assert {(r["kind"], r["pass"]) for r in ext} == {
        (k, p) for k in ("depthwise", "transposed") for p in ("forward", "backward")}
    for r in ext:
        assert r["gflops"] > 0 and r["ref"] in ("pytorch", "numpy", "-")
        if r["ref"] != "-":
            assert r["ref_gflops"] > 0 and r["ratio_min"] <= r["ratio"] <= r["ratio_max"]
    vocab = _rows(result, "vocab")
    assert {(r["op"], r["pass"]) for r in vocab} == {
        (o, p) for o in ("cross_entropy", "softmax", "log_softmax")
        for p in ("forward", "backward")}
    for r in vocab:
        assert r["shape"] == "3x1000" and r["ms_min"] <= r["ms"] <= r["ms_max"]
        if "ref_ms" in r:
            assert r["ref_ms"] > 0 and r["ratio_min"] <= r["ratio"] <= r["ratio_max"]
    assert all(r["us"] > 0 for r in _rows(result, "launch"))
    ovh = _rows(result, "overhead")
    assert {r["mode"] for r in ovh} == {"eager", "capture (replay)", "floor: bare enqueues"}
    floors = {r["device"]: r["host_us"] for r in ovh if r["mode"].startswith("floor")}
    for r in ovh:
        assert r["ops"] == 2 * 3 + 1 and r["kernels"] >= r["ops"]    # 3 mul-adds + sum
        assert r["us_per_op"] == pytest.approx(r["host_us"] / r["ops"])
        assert r["above_floor_us_per_op"] == pytest.approx(
            (r["host_us"] - floors[r["device"]]) / r["ops"])
        assert r["ops_per_s"] > 0 and r["step_us"] > 0


# -- scaling ---------------------------------------------------------------------------------
def _trace_tracks(path):
    trace = json.loads(path.read_text())
    assert validate(trace) == []
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    return trace, {names[e["tid"]] for e in spans}


def test_scaling_smoke_with_trace(tmp_path, capsys):
    trace_path = tmp_path / "trace.json"
    text, result = _run(tmp_path, capsys, [
        "scaling", "--model", "mlp", "--replicas", "1,2", "--batch-per-replica", "8",
        "--steps", "2", "--repeat", "1", "--warmup", "1", "--trace", str(trace_path)])
    rows = _rows(result, "scaling")
    _printed(text, result, "scaling")
    numpy_rows = [r for r in rows if r["kind"] == "numpy"]
    rows = [r for r in rows if r["kind"] == "step"]
    assert [r["replicas"] for r in rows] == [1, 2]
    assert [r["batch"] for r in rows] == [8, 16]             # weak scaling
    assert rows[0]["speedup"] == pytest.approx(1.0)
    # the numpy data-parallel reference, timed in the same rounds against its own 1 thread
    assert [(r["label"], r["batch"]) for r in numpy_rows] == [
        ("1 (numpy threads)", 8), ("2 (numpy threads)", 16)]
    assert numpy_rows[0]["speedup"] == pytest.approx(1.0)
    assert all(r["blas_threads"] == 1 and r["samples_per_s"] > 0 for r in numpy_rows)
    assert "numpy threads" in text and "fwd_bwd_ms" not in numpy_rows[1]
    assert rows[1]["efficiency"] == pytest.approx(rows[1]["speedup"] / 2)
    assert rows[1]["speedup_ci_min"] <= rows[1]["speedup"] <= rows[1]["speedup_ci_max"]
    for r in rows:
        assert r["samples_per_s"] > 0
        for key in ("fwd_bwd_ms", "allreduce_ms", "optimizer_ms", "broadcast_ms",
                    "dispatch_ms", "phased_ms"):
            assert r[key] >= 0
    assert all(d["compute_units"] == result["devices"][0]["compute_units"]
               for d in result["devices"])                  # one sub-device per replica
    trace, tracks = _trace_tracks(trace_path)
    assert "host-timed" in trace["otherData"]["timing"]
    for label, k in (("1", 1), ("2", 2)):
        for i in range(k):
            assert f"[{label}] replica {i} thread" in tracks
            assert f"[{label}] replica {i} queue (host-timed)" in tracks
        assert f"[{label}] main thread" in tracks


def test_scaling_trace_uses_device_clock_on_profiling_queues(tmp_path, capsys, monkeypatch):
    make = parcl.runtime.new_queue
    monkeypatch.setattr(parcl.replica.runtime, "new_queue",
                        lambda device=None, profiling=False: make(device, profiling=True))
    trace_path = tmp_path / "trace.json"
    assert main(["scaling", "--model", "mlp", "--replicas", "2", "--batch-per-replica", "4",
                 "--steps", "1", "--repeat", "1", "--warmup", "0",
                 "--trace", str(trace_path)]) == 0
    capsys.readouterr()
    trace, tracks = _trace_tracks(trace_path)
    assert "device timestamps" in trace["otherData"]["timing"]
    assert {"[2] replica 0 queue (device clock)", "[2] replica 1 queue (device clock)"} <= tracks


def test_scaling_strong_cnn(tmp_path, capsys):
    _, result = _run(tmp_path, capsys, [
        "scaling", "--model", "cnn", "--replicas", "1,2", "--global-batch", "6",
        "--steps", "1", "--repeat", "1", "--warmup", "0"], plot=False)
    rows = _rows(result, "scaling")
    assert [(r["kind"], r["batch"]) for r in rows] == [
        ("step", 6), ("step", 6), ("numpy", 6), ("numpy", 6)]
    assert result["params"]["mode"] == "strong"


def test_scaling_digits_with_capture(tmp_path, capsys):
    _, result = _run(tmp_path, capsys, [
        "scaling", "--model", "digits", "--replicas", "1,2", "--batch-per-replica", "4",
        "--steps", "2", "--repeat", "1", "--warmup", "1", "--capture"], plot=False)
    rows = _rows(result, "scaling")
    assert [r["batch"] for r in rows] == [4, 8] and all(r["samples_per_s"] > 0 for r in rows)


def test_scaling_ceiling_times_bare_replays_in_the_same_rounds(tmp_path, capsys):
    text, result = _run(tmp_path, capsys, [
        "scaling", "--model", "mlp", "--replicas", "1,2", "--batch-per-replica", "8",
        "--steps", "2", "--repeat", "2", "--warmup", "1", "--capture", "--ceiling",
        "--no-numpy"])
    rows = _rows(result, "scaling")
    assert [(r["label"], r["kind"]) for r in rows] == [
        ("1", "step"), ("2", "step"), ("1 (bare replays)", "bare"), ("2 (bare replays)", "bare")]
    bare = [r for r in rows if r["kind"] == "bare"]
    assert bare[0]["speedup"] == pytest.approx(1.0)          # against one bare replica
    assert bare[1]["speedup_ci_min"] <= bare[1]["speedup"] <= bare[1]["speedup_ci_max"]
    assert all(len(r["times"]) == 2 and r["samples_per_s"] > 0 for r in rows)
    assert "fwd_bwd_ms" not in bare[1] and "fwd_bwd_ms" in rows[1]
    assert "bare replays" in text


def test_interleaved_timing_shuffles_each_round_reproducibly():
    order = []
    fns = [((lambda i=i: order.append(i)), None) for i in range(4)]
    common.time_interleaved(fns, repeat=6, warmup=0)
    rounds = [tuple(order[i:i + 4]) for i in range(0, 24, 4)]
    assert all(sorted(r) == [0, 1, 2, 3] for r in rounds)    # each configuration once a round
    assert len(set(rounds)) > 1                              # not one fixed order
    again = []
    common.time_interleaved([((lambda i=i: again.append(i)), None) for i in range(4)],
                            repeat=6, warmup=0)
    assert again == order                                     # seeded


def test_lead_in_runs_the_same_configuration_untimed_before_each_timed_run():
    calls, syncs = [], []

    def run(i):
        calls.append(i)
        time.sleep(0.002)
    fns = [((lambda i=i: run(i)), (lambda i=i: syncs.append(i))) for i in range(2)]
    stats = common.time_interleaved(fns, repeat=3, warmup=0, lead_in=0.01)
    assert len(calls) > 6                                    # 6 timed runs, and lead-ins
    runs = [list(g) for _, g in itertools.groupby(calls)]
    assert len(runs) <= 6 and all(len(r) >= 2 for r in runs)   # each timed run led in
    assert all(len(s["times"]) == 3 and min(s["times"]) >= 0.002 for s in stats)


# -- compare ---------------------------------------------------------------------------------
def test_compare_smoke(tmp_path, capsys):
    text, result = _run(tmp_path, capsys, ["compare", "--model", "mlp,cnn", "--batch", "8",
                                           "--steps", "1", "--repeat", "1", "--no-netcl"])
    rows = _rows(result, "compare")
    _printed(text, result, "compare")
    try:
        import torch  # noqa: F401
        impls = {"parcl", "numpy", "pytorch"}
    except ImportError:
        impls = {"parcl", "numpy"}
        assert "pip install torch" in text
    for model in ("mlp", "cnn"):
        mine = {r["impl"]: r for r in rows if r["model"] == model}
        assert set(mine) == impls
        assert mine["parcl"]["vs_parcl"] == pytest.approx(1.0)
        assert mine["numpy"]["vs_parcl_min"] <= mine["numpy"]["vs_parcl"]
        for r in mine.values():          # same weights and batch: the same first loss
            assert r["loss"] == pytest.approx(mine["parcl"]["loss"], rel=1e-4)
            assert r["samples_per_s"] > 0


def test_compare_mobilenet_against_pytorch_only(tmp_path, capsys):
    text, result = _run(tmp_path, capsys, ["compare", "--model", "mobilenet", "--batch", "4",
                                           "--steps", "1", "--repeat", "1"])
    rows = {r["impl"]: r for r in _rows(result, "compare")}
    assert "no numpy reference for mobilenet" in text and "numpy" not in rows
    assert rows["parcl"]["samples_per_s"] > 0
    if "pytorch" in rows:          # same weights and batch: the same first loss
        assert rows["pytorch"]["loss"] == pytest.approx(rows["parcl"]["loss"], rel=1e-4)


def test_compare_captured_step_replays_the_eager_step(tmp_path, capsys):
    from parcl.bench import compare, models
    q = pc.new_queue(pc.devices()[0])
    x, y = models.batch("mlp", 8, seed=1)
    eager_model, captured_model = models.builder("mlp")(q), models.builder("mlp")(q)
    captured_model.load_state_dict(eager_model.state_dict())
    eager, _ = compare.parcl_step(q, eager_model, x, y)
    captured, _ = compare.parcl_step(q, captured_model, x, y, capture=True)
    for _ in range(3):                    # recorded, then replayed twice: bit-identical
        assert float(eager()) == float(captured())
    for a, b in zip(eager_model.parameters(), captured_model.parameters()):
        np.testing.assert_array_equal(a.value.to_host(), b.value.to_host())
    _, result = _run(tmp_path, capsys, ["compare", "--model", "mlp", "--batch", "4", "--steps",
                                        "2", "--repeat", "1", "--no-numpy", "--no-torch",
                                        "--no-netcl", "--capture"], plot=False)
    assert [r["impl"] for r in _rows(result, "compare")] == ["parcl (capture)"]


def test_compare_can_leave_out_a_reference(tmp_path, capsys):
    _, result = _run(tmp_path, capsys, ["compare", "--model", "mlp", "--batch", "4", "--steps",
                                        "1", "--repeat", "1", "--no-numpy", "--no-torch",
                                        "--no-netcl"], plot=False)
    assert [r["impl"] for r in _rows(result, "compare")] == ["parcl"]
    assert result["params"]["numpy"] is False


def test_compare_netcl_row_same_first_loss_and_its_tape_overhead(tmp_path, capsys):
    """netcl (in the test extra) gets a row from parcl's weights with parcl's first loss, and
    a second step equal to numpy's (the same SGD update); without netcl the row is left out
    with a note saying how to install it."""
    from parcl.bench import models, netcl_ref, reference

    text, result = _run(tmp_path, capsys, ["compare", "--model", "mlp,cnn", "--batch", "2",
                                           "--steps", "1", "--repeat", "1", "--no-numpy",
                                           "--no-torch"], plot=False)
    rows = {(r["model"], r["impl"]): r for r in _rows(result, "compare")}
    if not netcl_ref.available():
        assert netcl_ref.NETCL_HINT in result["notes"] and "pip install netcl" in text
        assert set(rows) == {("mlp", "parcl"), ("cnn", "parcl")}
        return
    for name in ("mlp", "cnn"):
        assert rows[name, "netcl"]["loss"] == pytest.approx(rows[name, "parcl"]["loss"],
                                                            rel=1e-5)
        assert rows[name, "netcl"]["samples_per_s"] > 0
    state = models.builder("cnn")(pc.new_queue(pc.devices()[0])).state_dict()
    ref, mine = reference.NUMPY_MODELS["cnn"](state), netcl_ref.NetclModel("cnn", state)
    x, y = models.batch("cnn", 2, seed=3)
    for _ in range(2):
        assert mine.step(x, y, 0.1) == pytest.approx(ref.step(x, y, 0.1), rel=1e-4)
    with pytest.raises(common.BenchError, match="no netcl twin for model 'mobilenet'"):
        netcl_ref.NetclModel("mobilenet", state)
    chain = netcl_ref.netcl_chain_us_per_op(2)
    assert chain["ops"] == 31
    assert 0 < chain["forward_us_per_op"] < chain["total_us_per_op"]


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_numpy_reference_step_matches_parcl(queue, name):
    """The numpy baseline computes the same SGD step as parcl (so comparing speeds is fair)."""
    import parcl as pc
    import parcl.tape as tp
    from parcl.bench import models
    from parcl.bench.reference import NUMPY_MODELS

    model = models.builder(name)(queue)
    ref = NUMPY_MODELS[name](model.state_dict())
    x, y = models.batch(name, 4)
    opt = pc.optim.SGD(model.parameters(), lr=0.5)
    with tp.Tape() as tape:
        loss = tp.cross_entropy(model(tp.tensor(pc.Tensor.from_host(queue, x))),
                                pc.Tensor.from_host(queue, y))
    tape.backward(loss)
    opt.step()
    assert ref.step(x, y, 0.5) == pytest.approx(float(loss.value.to_host()), rel=1e-5)
    for key, value in model.state_dict().items():
        np.testing.assert_allclose(ref.p[key], value, rtol=1e-4, atol=1e-5, err_msg=key)


@pytest.mark.parametrize("name,k", [("mlp", 2), ("mlp", 3), ("cnn", 2)])
def test_numpy_data_parallel_matches_one_thread_on_the_global_batch(name, k):
    """The scaling reference computes the same steps as one numpy model on the whole batch,
    with uneven shards too (7 samples over 2 or 3 threads)."""
    from parcl.bench import models
    from parcl.bench.reference import NUMPY_MODELS, NumpyDataParallel

    rng = np.random.default_rng(3)
    state = {key: rng.standard_normal(v.shape).astype(np.float32) * 0.1
             for key, v in models.builder(name)(pc.default_queue()).state_dict().items()}
    x, y = models.batch(name, 7, seed=5)
    single = NUMPY_MODELS[name](state)
    losses = [single.step(x, y, 0.1) for _ in range(3)]
    parallel = NUMPY_MODELS[name](state)
    with NumpyDataParallel(parallel, k) as dp:
        assert dp.step(x, y, 0.1, steps=2) == pytest.approx(losses[1], rel=1e-5)
        assert dp.step(x, y, 0.1) == pytest.approx(losses[2], rel=1e-5)
    for key in state:
        np.testing.assert_allclose(parallel.p[key], single.p[key], rtol=1e-4, atol=1e-6,
                                   err_msg=key)


def test_numpy_data_parallel_reports_the_failing_thread():
    from parcl.bench.reference import NumpyMLP, NumpyDataParallel

    model = NumpyMLP({"0.weight": np.ones((3, 4), np.float32), "0.bias": np.zeros(3, np.float32)})
    x, y = np.ones((4, 4), np.float32), np.array([0, 1, 2, 7])    # label 7 >= 3 classes
    with pytest.raises(RuntimeError, match="numpy replica 1 failed"):
        with NumpyDataParallel(model, 2, timeout=10) as dp:
            dp.step(x, y, 0.1)
    with pytest.raises(ValueError, match="without samples"):
        with NumpyDataParallel(model, 3, timeout=10) as dp:
            dp.step(x[:2], y[:2], 0.1)


def test_numpy_data_parallel_raises_when_a_thread_is_stuck():
    import threading

    from parcl.bench.reference import NumpyMLP, NumpyDataParallel

    release = threading.Event()

    class Stuck(NumpyMLP):
        def grads(self, x, y):
            release.wait(10)                     # far beyond the group's timeout
            return super().grads(x, y)

    model = Stuck({"0.weight": np.ones((3, 4), np.float32), "0.bias": np.zeros(3, np.float32)})
    dp = NumpyDataParallel(model, 2, timeout=0.5).start()
    try:
        with pytest.raises(RuntimeError, match="did not finish within"):
            dp.step(np.ones((4, 4), np.float32), np.array([0, 1, 2, 0]), 0.1)
    finally:
        release.set()


def test_scaling_can_leave_out_the_numpy_reference(tmp_path, capsys):
    _, result = _run(tmp_path, capsys, [
        "scaling", "--model", "mlp", "--replicas", "1,2", "--batch-per-replica", "4",
        "--steps", "1", "--repeat", "1", "--warmup", "0", "--no-numpy"], plot=False)
    assert [r["kind"] for r in _rows(result, "scaling")] == ["step", "step"]


# -- memory ----------------------------------------------------------------------------------
def test_memory_smoke(tmp_path, capsys):
    text, result = _run(tmp_path, capsys, ["memory", "--model", "mlp,resnet18", "--batch", "2",
                                           "--image-size", "32"])
    rows = _rows(result, "memory")
    _printed(text, result, "memory")
    assert [r["model"] for r in rows] == ["mlp", "resnet18"]
    for r in rows:
        assert r["tape_peak_mb"] >= r["nograd_peak_mb"] > 0
        assert r["tape_extra_mb"] == pytest.approx(r["tape_peak_mb"] - r["nograd_peak_mb"])
        assert r["backward_peak_mb"] >= r["tape_peak_mb"]
        assert r["nograd_after_mb"] == 0.0
        assert r["released_mb"] >= 0.0
        assert r["zero_grad_mb"] == 0.0                 # everything back in the pool
    resnet = rows[1]
    assert resnet["tape_held_mb"] > 0                    # activations kept for backward


def test_memory_and_scaling_run_every_model_they_list_with_their_defaults(tmp_path, capsys):
    """memory --model digits,mobilenet and scaling --model mobilenet (both listed in their
    --help) failed with a KeyError: no default batch, no default step count."""
    from parcl.bench import memory, models, scaling
    assert set(memory.DEFAULT_BATCH) >= set(models.MODELS)
    assert set(scaling.DEFAULT_STEPS) >= set(models.MODELS)
    _, result = _run(tmp_path, capsys, ["memory", "--model", "digits,mobilenet"], plot=False)
    assert [(r["model"], r["batch"]) for r in _rows(result, "memory")] == [
        ("digits", 64), ("mobilenet", 32)]
    _, result = _run(tmp_path, capsys, ["scaling", "--model", "mobilenet", "--replicas", "1",
                                        "--batch-per-replica", "2", "--repeat", "1",
                                        "--warmup", "0"], plot=False)
    assert result["params"]["steps"] == scaling.DEFAULT_STEPS["mobilenet"]


def test_memory_checkpoint_compares_a_gpt_plain_and_with_checkpointed_blocks(
        tmp_path, capsys, monkeypatch):
    """memory --checkpoint: one GPT plain and with every block through tp.checkpoint, its
    memory, step times and gradient bits; gradients that differ fail the run, and so does
    a size it cannot read."""
    text, result = _run(tmp_path, capsys, ["memory", "--model", "mlp", "--batch", "2",
                                           "--checkpoint", "2x32x16", "--repeat", "2",
                                           "--warmup", "0"], plot=False)
    _printed(text, result, "checkpoint")
    (row,) = _rows(result, "checkpoint")
    assert row["model"] == "gpt 2x32, T=16" and row["batch"] == 2 and row["same_grads"]
    assert 0 < row["ckpt_held_mb"] < row["plain_held_mb"]         # block activations freed
    assert 0 < row["ckpt_peak_mb"] < row["plain_peak_mb"]
    assert row["held_ratio"] == pytest.approx(row["plain_held_mb"] / row["ckpt_held_mb"])
    assert row["plain_ms"] > 0 and row["ckpt_ms"] > 0
    assert row["time_ratio_min"] <= row["time_ratio"] <= row["time_ratio_max"]
    import parcl.tape as tp
    monkeypatch.setattr(tp, "checkpoint", lambda f, x: tp.mul(f(x), 1.5))
    assert main(["memory", "--model", "mlp", "--batch", "2", "--checkpoint", "1x32x8",
                 "--repeat", "1", "--warmup", "0"]) == 2
    err = capsys.readouterr().err
    assert "gradient of transformer.wte.weight differs" in err and "Traceback" not in err
    assert main(["memory", "--model", "mlp", "--checkpoint", "4x128"]) == 2
    assert "expected LAYERSxWIDTHxT" in capsys.readouterr().err


# -- command line and helpers ----------------------------------------------------------------
def test_bad_arguments_exit_2_with_one_line(capsys):
    assert main(["allreduce", "--sizes", "4X"]) == 2
    err = capsys.readouterr().err
    assert "cannot read size '4X'" in err and "Traceback" not in err
    assert main(["scaling", "--replicas", "1,64"]) == 2
    assert "compute units" in capsys.readouterr().err
    assert main(["scaling", "--allreduce", "nope"]) == 2
    assert "unknown --allreduce 'nope'" in capsys.readouterr().err


def test_a_step_count_or_batch_below_one_is_refused_not_replaced(capsys):
    """`args.steps or default` ran the default for 0, and compare --steps -2 timed no step at
    all and printed -1.9e6 samples/s and a step of -0.00 ms."""
    for command, flag, value in (("compare", "--steps", "-2"), ("compare", "--steps", "0"),
                                 ("compare", "--batch", "0"), ("scaling", "--steps", "0"),
                                 ("scaling", "--batch-per-replica", "0")):
        argv = [command, "--model", "mlp", flag, value, "--repeat", "1", "--warmup", "0"]
        argv += ["--no-numpy"] + (["--replicas", "1"] if command == "scaling" else [])
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"{flag} must be >= 1, got {value}" in err and "Traceback" not in err, err


def test_plot_without_matplotlib_says_how_to_install(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["allreduce", "--sizes", "4K", "--plot", str(tmp_path / "x.png")]) == 2
    assert "pip install 'parcl[bench]'" in capsys.readouterr().err


def test_python_dash_m_help():
    out = subprocess.run([sys.executable, "-m", "parcl.bench", "--help"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0
    for name in ("scaling", "allreduce", "kernels", "compare", "memory"):
        assert name in out.stdout


def test_sizes_tables_and_stats():
    assert common.parse_sizes("4K,1M,25M,1G,100") == [4096, 1 << 20, 25 << 20, 1 << 30, 100]
    assert common.human_bytes(25 << 20) == "25M" and common.human_bytes(4096) == "4K"
    s = common.summarize([3.0, 1.0, 2.0, 10.0])
    assert (s["median"], s["min"], s["max"], s["runs"]) == (2.5, 1.0, 10.0, 4)
    table = common.format_table([["name", "name"], ["v", "value"]],
                                [{"name": "a", "v": 1.5}, {"name": "long", "v": 22.25}],
                                {"v": ".2f"})
    lines = table.splitlines()
    assert len({len(ln) for ln in lines}) == 1            # aligned
    assert lines[2].endswith(" 1.50") and lines[3].endswith("22.25")


def test_chrome_trace_writer(tmp_path):
    tr = ChromeTrace({"what": "test"})
    a, b = tr.track("replica 0 thread"), tr.track("replica 1 thread")
    t0 = tr.now()
    tr.span(a, "work", t0, t0 + 0.001)
    tr.span(b, "work", t0, t0 + 0.002, args={"step": 1})
    tr.write(tmp_path / "t.json")
    data = json.loads((tmp_path / "t.json").read_text())
    assert validate(data) == [] and data["otherData"] == {"what": "test"}
    spans = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert {e["tid"] for e in spans} == {a, b}
    assert spans[1]["dur"] == pytest.approx(2000, abs=1)
    assert validate({"traceEvents": [{"ph": "X", "name": "x", "pid": 1, "tid": 1}]})


def test_median_ci_brackets_the_median_and_is_reproducible():
    from parcl.bench.common import median_ci
    values = [1.0, 1.9, 2.0, 2.1, 2.2, 1.8, 2.05, 3.0, 1.95]
    lo, hi = median_ci(values)
    assert lo <= float(np.median(values)) <= hi and lo < hi
    assert median_ci(values) == (lo, hi)                     # seeded
    assert median_ci([4.0]) == (4.0, 4.0)


def test_docs_reruns_the_benchmarks_behind_the_performance_page(tmp_path):
    out, img = tmp_path / "res", tmp_path / "img"
    assert main(["docs", "--quick", "--only", "allreduce,scaling_mlp", "--out", str(out),
                 "--img", str(img)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["allreduce.json", "scaling_mlp.json"]
    assert sorted(p.name for p in img.iterdir()) == ["allreduce.png", "scaling_mlp.png"]
    assert json.loads((out / "scaling_mlp.json").read_text())["params"]["capture"] is True
    assert main(["docs", "--only", "nope", "--out", str(out), "--img", str(img)]) == 2


# -- overhead --------------------------------------------------------------------------------
def test_overhead_smoke(tmp_path, capsys):
    text, result = _run(tmp_path, capsys, ["overhead", "--depth", "2", "--passes", "1",
                                           "--repeat", "2", "--warmup", "1", "--op-calls", "3",
                                           "--guard-models", "mlp"])
    rows = _rows(result, "overhead")
    _printed(text, result, "overhead")
    parcl_rows = [r for r in rows if r["impl"] == "parcl"]
    assert [(r["workload"], r["mode"]) for r in parcl_rows] == [
        ("chain", "fwd+bwd"), ("chain", "no_grad"), ("mix", "fwd+bwd"), ("mix", "no_grad")]
    assert parcl_rows[0]["ops"] == 3 * 2 + 1          # tanh(h @ w + x) twice, then sum
    assert parcl_rows[2]["ops"] == 7 * 2 + 1
    for r in rows:
        assert r["us_per_op_min"] <= r["us_per_op"] <= r["us_per_op_max"]
        assert r["ops_per_s"] > 0 and r["drain_us_per_op"] > -1e3
    ops = _rows(result, "ops")
    assert len(ops) == 24 and {r["mode"] for r in ops} == {"no_grad", "fwd+bwd"}
    assert {"linear", "layer_norm", "add (bias)", "softmax", "sum"} <= {r["op"] for r in ops}
    for r in ops:
        assert 0 < r["us_min"] <= r["us"] <= r["us_max"] and 0 < r["host_us"]
        assert ("vs_torch" in r) == ("torch_us" in r)
    guard = _rows(result, "guard")[0]
    assert guard["model"] == "mlp" and guard["batch"] == 256
    assert guard["capture_key_us"] > 0 and guard["snapshot_us"] > 0 and guard["step_ms"] > 0


def test_overhead_without_torch(tmp_path, capsys):
    _, result = _run(tmp_path, capsys, ["overhead", "--depth", "1", "--passes", "1",
                                        "--repeat", "1", "--warmup", "0", "--no-torch",
                                        "--guard-models", "", "--op-calls", "2"], plot=False)
    assert {r["impl"] for r in _rows(result, "overhead")} == {"parcl", "parcl-unheld"}
    assert all("torch_us" not in r for r in _rows(result, "ops"))
    assert "guard" not in result["tables"]
    assert any("PyTorch" in n for n in result["notes"])


# -- the transformer workload ------------------------------------------------------------------
def test_gpt_in_compare_scaling_and_memory(tmp_path, capsys):
    """``--model gpt``: parcl and PyTorch's nanoGPT twin agree on the first loss (AdamW, tied
    head), tokens/s is samples/s x T; scaling and memory run it too."""
    text, result = _run(tmp_path, capsys, ["compare", "--model", "gpt", "--batch", "2",
                                           "--steps", "1", "--repeat", "1"], plot=False)
    rows = {r["impl"]: r for r in _rows(result, "compare")}
    assert "numpy" not in rows and "tokens/s" in text
    try:
        import torch  # noqa: F401
        assert rows["pytorch"]["loss"] == pytest.approx(rows["parcl"]["loss"], rel=1e-4)
    except ImportError:
        assert set(rows) == {"parcl"}
    assert rows["parcl"]["tokens_per_s"] == pytest.approx(rows["parcl"]["samples_per_s"] * 64)
    assert rows["parcl"]["loss"] == pytest.approx(np.log(98), rel=0.05)   # ~uniform at init
    _, result = _run(tmp_path, capsys, [
        "scaling", "--model", "gpt", "--replicas", "1,2", "--batch-per-replica", "1",
        "--steps", "1", "--repeat", "1", "--warmup", "0", "--capture"], plot=False)
    assert [(r["kind"], r["batch"]) for r in _rows(result, "scaling")] == [("step", 1),
                                                                          ("step", 2)]
    _, result = _run(tmp_path, capsys, ["memory", "--model", "gpt", "--batch", "1"],
                     plot=False)
    (row,) = _rows(result, "memory")
    assert row["tape_held_mb"] > 0 and row["backward_peak_mb"] >= row["tape_peak_mb"]
    assert row["zero_grad_mb"] == 0.0
    try:                                   # PyTorch's autograd saves activations too
        import torch  # noqa: F401
        assert 0 < row["torch_saved_mb"] < 10 * row["tape_held_mb"]
    except ImportError:
        assert row["torch_saved_mb"] is None
