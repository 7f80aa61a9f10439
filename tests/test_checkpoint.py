"""pc.save / pc.load with small fake models and optimizers (the duck-typed interfaces the real
ones implement): round trips, the file's layout, atomic writes under SIGKILL, and every way a
checkpoint can be refused without touching the model. No device needed."""

from __future__ import annotations

import copy
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

import parcl as pc
import parcl.tape as tp

# --- fakes: exactly the interface parcl's nn.Module and optimizers offer ---------------------


class FakeModel:
    """state_dict(): ordered name -> numpy copies; load_state_dict(): strict, all or nothing."""

    def __init__(self, shapes=None, seed=0, dtype=np.float32):
        shapes = shapes or {"0.weight": (4, 3), "0.bias": (4,), "1.running_mean": (4,)}
        rng = np.random.default_rng(seed)
        self.tensors = {k: rng.standard_normal(s).astype(dtype) for k, s in shapes.items()}
        self.tensors["1.num_batches_tracked"] = np.array(seed, dtype=np.int64)

    def state_dict(self):
        return {k: v.copy() for k, v in self.tensors.items()}

    def load_state_dict(self, d):
        if set(d) != set(self.tensors):
            raise ValueError(f"keys differ: {sorted(set(d) ^ set(self.tensors))}")
        for k, v in d.items():
            if v.shape != self.tensors[k].shape:
                raise ValueError(f"{k}: shape {v.shape} != {self.tensors[k].shape}")
        self.tensors = {k: np.array(d[k], copy=True) for k in self.tensors}


class FakeAdam:
    """PyTorch-shaped state: {"state": {int: {...}}, "param_groups": [{..., "params": [...]}]}."""

    def __init__(self, model, lr=1e-3, seed=0, steps=3):
        rng = np.random.default_rng(seed)
        self.params = [k for k in model.tensors if "running" not in k and "num_" not in k]
        self.state = {i: {"step": steps,
                          "exp_avg": rng.standard_normal(model.tensors[k].shape).astype(np.float32),
                          "exp_avg_sq": rng.random(model.tensors[k].shape).astype(np.float32)}
                      for i, k in enumerate(self.params)} if steps else {}
        self.param_groups = [{"lr": lr, "betas": [0.9, 0.999], "eps": 1e-8,
                              "weight_decay": 0.0, "params": list(range(len(self.params)))}]

    def state_dict(self):
        return {"state": copy.deepcopy(self.state),
                "param_groups": copy.deepcopy(self.param_groups)}

    def load_state_dict(self, d):
        self.state = copy.deepcopy(d["state"])
        self.param_groups = copy.deepcopy(d["param_groups"])


class FakeSGD(FakeAdam):
    def __init__(self, model, lr=0.1, seed=0):
        super().__init__(model, lr, seed)
        self.state = {i: {"momentum_buffer": s["exp_avg"]} for i, s in self.state.items()}
        self.param_groups = [{"lr": lr, "momentum": 0.9, "dampening": 0.0, "nesterov": False,
                              "weight_decay": 0.0, "params": self.param_groups[0]["params"]}]


def assert_state_equal(a, b):
    """Deep equality of state dicts holding numpy arrays, with types (ints stay ints)."""
    assert type(a) is type(b) or (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)))
    if isinstance(a, dict):
        assert list(a) == list(b)
        assert [type(k) for k in a] == [type(k) for k in b]
        for k in a:
            assert_state_equal(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for u, v in zip(a, b):
            assert_state_equal(u, v)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    else:
        assert a == b


@pytest.fixture
def ckpt(tmp_path):
    return tmp_path / "run.safetensors"


# --- round trips -------------------------------------------------------------------------

def test_round_trip_model_optimizer_and_meta(ckpt):
    model, opt = FakeModel(seed=1), FakeAdam(FakeModel(seed=1), lr=3e-4, seed=1)
    rng = np.random.default_rng(42)
    rng.random(5)
    loader = pc.data.DataLoader(np.arange(10), 3, shuffle=True)
    next(iter(loader))
    pc.save(ckpt, model, opt, step=123, epoch=4, loader=loader.state_dict(),
            rng=rng.bit_generator.state, note="hello", loss=np.float32(0.25))

    model2, opt2 = FakeModel(seed=2), FakeAdam(FakeModel(seed=2), lr=1.0, seed=2, steps=0)
    meta = pc.load(ckpt, model2, opt2)

    assert_state_equal(model2.state_dict(), model.state_dict())
    assert_state_equal(opt2.state_dict(), opt.state_dict())
    assert meta["step"] == 123 and meta["epoch"] == 4 and meta["note"] == "hello"
    assert meta["loss"] == 0.25
    assert meta["loader"] == loader.state_dict()
    restored = np.random.default_rng()
    restored.bit_generator.state = meta["rng"]
    np.testing.assert_array_equal(restored.random(3), rng.random(3))


def test_round_trip_sgd_and_model_only(ckpt):
    model, opt = FakeModel(), FakeSGD(FakeModel())
    pc.save(ckpt, model, opt)
    opt2 = FakeSGD(FakeModel(), lr=5.0, seed=9)
    assert pc.load(ckpt, FakeModel(seed=3), opt2) == {"step": 0}
    assert_state_equal(opt2.state_dict(), opt.state_dict())
    # A checkpoint with optimizer state still loads weights alone, for evaluation.
    model3 = FakeModel(seed=4)
    pc.load(ckpt, model3)
    assert_state_equal(model3.state_dict(), model.state_dict())


def test_file_layout_is_plain_safetensors_with_json_metadata(ckpt):
    pc.save(ckpt, FakeModel(), FakeAdam(FakeModel()), step=7, epoch=1)
    with safe_open(str(ckpt), framework="numpy") as f:
        keys = set(f.keys())
        doc = json.loads(f.metadata()["parcl"])
    assert {"model.0.weight", "model.0.bias", "model.1.running_mean",
            "model.1.num_batches_tracked"} <= keys
    assert {"optim.state.0.exp_avg", "optim.state.1.exp_avg_sq"} <= keys
    assert len(keys) == 4 + 2 * 2
    assert doc["step"] == 7 and doc["meta"] == {"epoch": 1}
    assert doc["parcl_version"] == pc.__version__ and doc["format"] == 3
    assert doc["optimizer"]["param_groups"][0]["betas"] == [0.9, 0.999]
    with safe_open(str(ckpt), framework="numpy") as f:         # the document's own CRC-32
        assert f.metadata()["parcl_crc32"] == str(zlib.crc32(f.metadata()["parcl"].encode()))


@pytest.mark.parametrize("change", [
    # the header holds the document as a JSON string: its quotes are escaped there
    lambda text: text.replace('lr\\": 0.001', 'lr\\": 0.009'),       # one bit of the lr
    lambda text: text.replace('step\\": 7', 'step\\": 3'),           # the step
    lambda text: text.replace('format\\": 3', 'format\\": 1'),       # no checks at all
    lambda text: text.replace('format\\": 3', 'format\\": 0'),
], ids=["lr", "step", "format-1", "format-0"])
def test_damage_to_the_metadata_is_refused(ckpt, change):
    """The step, meta, optimizer scalars and scheduler live in the JSON document, not in
    tensors: its own checksum catches a flipped digit there, or a format number changed so
    as to skip the tensors' checksums."""
    pc.save(ckpt, FakeModel(), FakeAdam(FakeModel()), step=7)
    data = bytearray(ckpt.read_bytes())
    n = int.from_bytes(data[:8], "little")
    header = data[8:8 + n].decode()
    damaged = change(header)
    assert damaged != header and len(damaged) == len(header)
    ckpt.write_bytes(bytes(data[:8]) + damaged.encode() + bytes(data[8 + n:]))
    refuse_load(ckpt, FakeModel(seed=3), match=["damaged"])


def test_overwrite_leaves_no_temporary_files(ckpt):
    pc.save(ckpt, FakeModel(seed=1), step=1)
    pc.save(ckpt, FakeModel(seed=2), step=2)
    assert os.listdir(ckpt.parent) == [ckpt.name]
    model = FakeModel(seed=0)
    assert pc.load(str(ckpt), model)["step"] == 2
    assert_state_equal(model.state_dict(), FakeModel(seed=2).state_dict())


def test_non_contiguous_and_scalar_arrays_survive(ckpt):
    model = FakeModel({"w": (3, 4)})
    model.tensors["w"] = np.arange(24, dtype=np.float32).reshape(4, 6).T[:3]
    assert not model.tensors["w"].flags.c_contiguous
    pc.save(ckpt, model)
    fresh = FakeModel({"w": (3, 4)}, seed=5)
    pc.load(ckpt, fresh)
    np.testing.assert_array_equal(fresh.tensors["w"], model.tensors["w"])
    assert fresh.tensors["1.num_batches_tracked"].shape == ()


def test_nothing_is_ever_unpickled(ckpt, monkeypatch):
    pc.save(ckpt, FakeModel(), FakeAdam(FakeModel()), step=1, epoch=0)

    def refuse(*args, **kwargs):
        raise AssertionError("pickle used")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    pc.load(ckpt, FakeModel(), FakeAdam(FakeModel(), steps=0))
    # What JSON cannot carry is refused at save time, not pickled.
    with pytest.raises(TypeError, match="JSON"):
        pc.save(ckpt, FakeModel(), extra=object())


# --- refusals: CheckpointError, and the model and optimizer untouched ---------------------

def refuse_load(path, model, optimizer=None, match=None):
    """Load must raise CheckpointError naming the file (and ``match``) and change nothing."""
    before_model = model.state_dict()
    before_opt = optimizer.state_dict() if optimizer is not None else None
    with pytest.raises(pc.CheckpointError) as info:
        pc.load(path, model, optimizer)
    message = str(info.value)
    assert str(path) in message
    if match:
        for part in [match] if isinstance(match, str) else match:
            assert part in message, message
    assert_state_equal(model.state_dict(), before_model)
    if optimizer is not None:
        assert_state_equal(optimizer.state_dict(), before_opt)
    return message


def test_missing_file(ckpt):
    refuse_load(ckpt, FakeModel(), match="no such checkpoint")


@pytest.mark.parametrize("cut", [1, 100, 0.5, -8])
def test_truncated_file(ckpt, cut):
    pc.save(ckpt, FakeModel(), FakeAdam(FakeModel()))
    data = ckpt.read_bytes()
    keep = int(len(data) * cut) if isinstance(cut, float) else cut % len(data)
    ckpt.write_bytes(data[:keep])
    refuse_load(ckpt, FakeModel(seed=5), FakeAdam(FakeModel(), seed=5), match="damaged")


def test_garbage_and_foreign_files(ckpt, tmp_path):
    ckpt.write_bytes(b"\x00" * 64)
    refuse_load(ckpt, FakeModel(), match="damaged")
    foreign = tmp_path / "foreign.safetensors"
    save_file({"weight": np.zeros(3, np.float32)}, str(foreign))
    refuse_load(foreign, FakeModel(), match="not a parcl checkpoint")


def test_wrong_shape(ckpt):
    pc.save(ckpt, FakeModel())
    other = FakeModel({"0.weight": (4, 5), "0.bias": (4,), "1.running_mean": (4,)}, seed=3)
    refuse_load(ckpt, other, match=["'0.weight'", "(4, 3)", "(4, 5)"])


def test_wrong_dtype(ckpt):
    pc.save(ckpt, FakeModel())
    refuse_load(ckpt, FakeModel(dtype=np.float64, seed=3), match=["'0.bias'", "float32", "float64"])


def test_missing_keys(ckpt):
    pc.save(ckpt, FakeModel())
    bigger = FakeModel({"0.weight": (4, 3), "0.bias": (4,), "1.running_mean": (4,),
                        "1.running_var": (4,)}, seed=3)
    refuse_load(ckpt, bigger, match=["missing keys", "1.running_var"])


def test_extra_keys(ckpt):
    pc.save(ckpt, FakeModel())
    smaller = FakeModel({"0.weight": (4, 3), "0.bias": (4,)}, seed=3)
    refuse_load(ckpt, smaller, match=["unexpected keys", "1.running_mean"])


def test_optimizer_of_another_kind(ckpt):
    pc.save(ckpt, FakeModel(), FakeSGD(FakeModel()))
    model, adam = FakeModel(seed=3), FakeAdam(FakeModel(seed=3), seed=3)
    refuse_load(ckpt, model, adam, match=["optimizer", "momentum", "betas", "FakeSGD"])


def test_optimizer_state_of_the_wrong_shape(ckpt):
    pc.save(ckpt, FakeModel(), FakeAdam(FakeModel()))
    other = FakeModel({"0.weight": (4, 5), "0.bias": (4,), "1.running_mean": (4,)}, seed=3)
    # Only the optimizer is checked against here: load weights-only would fail on the model too,
    # so give a model that fits and an optimizer that does not.
    refuse_load(ckpt, FakeModel(seed=3), FakeAdam(other, seed=3),
                match=["state[0]", "'exp_avg'", "(4, 3)", "(4, 5)"])


def test_optimizer_requested_but_not_saved(ckpt):
    pc.save(ckpt, FakeModel())
    refuse_load(ckpt, FakeModel(seed=3), FakeAdam(FakeModel(seed=3)), match="no optimizer state")


def test_optimizer_refusal_rolls_the_model_back(ckpt):
    class Picky(FakeAdam):
        def load_state_dict(self, d):
            raise ValueError("picky optimizer says no")

    pc.save(ckpt, FakeModel(), FakeAdam(FakeModel()))
    message = refuse_load(ckpt, FakeModel(seed=3), Picky(FakeModel(seed=3), seed=3))
    assert "picky optimizer says no" in message


def test_tensors_that_disagree_with_the_metadata(ckpt):
    pc.save(ckpt, FakeModel())
    tensors = load_file(str(ckpt))
    with safe_open(str(ckpt), framework="numpy") as f:
        metadata = f.metadata()
    tensors["model.sneaky"] = np.zeros(2, np.float32)
    save_file(tensors, str(ckpt), metadata=metadata)
    refuse_load(ckpt, FakeModel(seed=3), match=["model.sneaky", "damaged"])


def test_a_newer_format_asks_for_an_upgrade(ckpt):
    pc.save(ckpt, FakeModel())
    tensors = load_file(str(ckpt))
    with safe_open(str(ckpt), framework="numpy") as f:
        doc = json.loads(f.metadata()["parcl"])
    doc["format"] = 99
    save_file(tensors, str(ckpt), metadata={"parcl": json.dumps(doc)})
    refuse_load(ckpt, FakeModel(seed=3), match=["format 99", "upgrade parcl"])


def test_checkpoint_error_is_an_oserror():
    assert issubclass(pc.CheckpointError, OSError)
    assert issubclass(pc.CheckpointError, pc.ParclError)


# --- atomicity: SIGKILL mid-save leaves the previous checkpoint loadable --------------------

SAVER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import parcl as pc

    stage, path = sys.argv[1], sys.argv[2]

    class Big:
        def state_dict(self):
            return {"w": np.full((4 << 20,), 2.0, np.float32)}       # 16 MiB

    real_write = os.write
    def slow_write(fd, data):
        n = real_write(fd, data[:1 << 16])
        print("writing", flush=True)
        time.sleep(0.05)
        return n

    def stalled_replace(*args):
        print("renaming", flush=True)
        time.sleep(600)

    if stage == "write":
        os.write = slow_write
    else:
        os.replace = stalled_replace
    pc.save(path, Big(), step=2)
    print("finished", flush=True)
""")


class Big:
    def __init__(self, value=1.0):
        self.w = np.full((4 << 20,), value, np.float32)

    def state_dict(self):
        return {"w": self.w.copy()}

    def load_state_dict(self, d):
        self.w = d["w"].copy()


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("stage", ["write", "rename"])
def test_sigkill_mid_save_keeps_the_previous_checkpoint(tmp_path, stage):
    path = tmp_path / "big.safetensors"
    pc.save(path, Big(1.0), step=1)
    size = path.stat().st_size
    script = tmp_path / "saver.py"
    script.write_text(SAVER)

    proc = subprocess.Popen([sys.executable, str(script), stage, str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        marker = "writing" if stage == "write" else "renaming"
        line = proc.stdout.readline()
        assert line.strip() == marker, f"saver said {line!r}; stderr: {proc.stderr.read()}"
        temps = [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
        assert len(temps) == 1, os.listdir(tmp_path)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL

    partial = (tmp_path / temps[0]).stat().st_size
    if stage == "write":
        assert 0 < partial < size, "the kill should land in the middle of the write"
    else:
        assert partial == size, "the temporary file was complete, only the rename was missing"
    model = Big(0.0)
    assert pc.load(path, model) == {"step": 1}
    assert np.all(model.w == 1.0)
    # The next save simply replaces the checkpoint; a stray temporary file is harmless.
    pc.save(path, Big(3.0), step=3)
    assert pc.load(path, model)["step"] == 3 and np.all(model.w == 3.0)


# --- checksums: damaged tensor bytes under an intact header --------------------------------

def tensor_span(path, key):
    """Absolute byte range of tensor ``key`` in a safetensors file."""
    data = path.read_bytes()
    header_len = int.from_bytes(data[:8], "little")
    start, end = json.loads(data[8:8 + header_len])[key]["data_offsets"]
    return 8 + header_len + start, 8 + header_len + end


def test_every_tensor_has_a_checksum_in_the_metadata(ckpt):
    import zlib
    pc.save(ckpt, FakeModel(), FakeAdam(FakeModel()))
    with safe_open(str(ckpt), framework="numpy") as f:
        doc = json.loads(f.metadata()["parcl"])
        keys = set(f.keys())
    assert set(doc["crc32"]) == keys
    data = ckpt.read_bytes()
    for key in keys:
        start, end = tensor_span(ckpt, key)
        assert doc["crc32"][key] == zlib.crc32(data[start:end]), key


@pytest.mark.parametrize("key, bit", [("model.0.weight", 0), ("model.0.weight", 31),
                                      ("model.1.num_batches_tracked", 7),
                                      ("optim.state.1.exp_avg_sq", 5)])
def test_a_flipped_bit_in_tensor_bytes_is_refused(ckpt, key, bit):
    pc.save(ckpt, FakeModel(), FakeAdam(FakeModel()))
    start, end = tensor_span(ckpt, key)
    data = bytearray(ckpt.read_bytes())
    data[start + (end - start) // 2 + bit // 8] ^= 1 << (bit % 8)
    ckpt.write_bytes(bytes(data))
    load_file(str(ckpt))        # still a well-formed safetensors file: only the bytes changed
    refuse_load(ckpt, FakeModel(seed=5), FakeAdam(FakeModel(), seed=5),
                match=["checksum", key, "damaged"])


def test_a_tensor_swapped_for_another_of_its_shape_is_refused(ckpt):
    pc.save(ckpt, FakeModel(seed=1))
    tensors = load_file(str(ckpt))
    with safe_open(str(ckpt), framework="numpy") as f:
        metadata = f.metadata()
    tensors["model.0.bias"] = tensors["model.0.bias"] + 1     # header keeps the old checksum
    save_file(tensors, str(ckpt), metadata=metadata)
    refuse_load(ckpt, FakeModel(seed=3), match=["checksum", "model.0.bias"])


def test_checksums_that_do_not_list_the_tensors_are_refused(ckpt):
    pc.save(ckpt, FakeModel())
    tensors = load_file(str(ckpt))
    with safe_open(str(ckpt), framework="numpy") as f:
        doc = json.loads(f.metadata()["parcl"])
    del doc["crc32"]["model.0.bias"]
    save_file(tensors, str(ckpt), metadata={"parcl": json.dumps(doc)})
    refuse_load(ckpt, FakeModel(seed=3), match=["checksums", "damaged"])


def test_a_format_1_checkpoint_without_checksums_still_loads(ckpt):
    pc.save(ckpt, FakeModel(seed=1), step=5)
    tensors = load_file(str(ckpt))
    with safe_open(str(ckpt), framework="numpy") as f:
        doc = json.loads(f.metadata()["parcl"])
    doc["format"] = 1
    del doc["crc32"]
    save_file(tensors, str(ckpt), metadata={"parcl": json.dumps(doc)})
    model = FakeModel(seed=3)
    assert pc.load(ckpt, model) == {"step": 5}
    assert_state_equal(model.state_dict(), FakeModel(seed=1).state_dict())


# --- the file's mode follows the umask, like any other new file ----------------------------

@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_checkpoint_mode_follows_the_umask(tmp_path, umask, mode):
    # In a child process: the umask is process-wide, and other tests' threads may create files.
    code = textwrap.dedent(f"""
        import os, sys, numpy as np, parcl as pc
        class M:
            def state_dict(self): return {{"w": np.ones(3, np.float32)}}
        os.umask({umask:#o})
        pc.save(sys.argv[1], M())
        pc.save(sys.argv[1], M())                 # overwriting keeps it too
        with open(sys.argv[2], "w"):
            pass
    """)
    ckpt, plain = tmp_path / "c.safetensors", tmp_path / "plain.txt"
    r = subprocess.run([sys.executable, "-c", code, str(ckpt), str(plain)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert ckpt.stat().st_mode & 0o777 == mode
    assert ckpt.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777


def test_an_adam_checkpoint_is_refused_by_adamw_and_leaves_it_unchanged(ckpt, queue):
    """Same state names, different update rule: loading one into the other would quietly
    change how the run trains (Adam's weight decay becoming AdamW's decoupled one)."""
    pc.nn.manual_seed(0)
    model = pc.nn.Linear(3, 2, queue=queue)
    pc.save(ckpt, model, pc.optim.Adam(model.parameters(), weight_decay=0.1))
    adamw = pc.optim.AdamW(model.parameters(), weight_decay=0.01)
    before = model.state_dict()
    with pytest.raises(pc.CheckpointError, match="an Adam optimizer's state, and AdamW's"):
        pc.load(ckpt, model, adamw)
    assert adamw.param_groups[0]["weight_decay"] == 0.01
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v, before[k])


def _train(model, opt, queue, steps):
    """``steps`` steps of ``opt`` on ``sum(model(x) ** 2)`` over a fixed batch."""
    x = tp.tensor(pc.Tensor.from_host(queue, np.linspace(-1, 1, 12, dtype=np.float32
                                                         ).reshape(4, 3)))
    for _ in range(steps):
        with tp.Tape() as tape:
            y = model(x)
            loss = tp.sum(y * y)
        tape.backward(loss)
        opt.step()
        opt.zero_grad()


@pytest.mark.parametrize("cls", ["Adam", "AdamW"])
def test_an_adam_checkpoint_saved_before_the_rule_flag_still_resumes(ckpt, queue, cls):
    """Adam's and AdamW's groups carry PyTorch's ``decoupled_weight_decay`` since 9366a47;
    checkpoints saved before (their document names the rule instead) were refused by pc.load
    as "a different optimizer class? checkpoint has Adam, got Adam", stranding every run
    saved then, where ``opt.load_state_dict`` and PyTorch take such a state. It resumes
    again, bit for bit, and the other rule is still refused."""
    opt_cls = getattr(pc.optim, cls)
    models = []
    for steps in (4, 2):                            # the whole run, and the one saved at 2
        pc.nn.manual_seed(0)
        models.append(pc.nn.Linear(3, 2, queue=queue))
        opt = opt_cls(models[-1].parameters(), lr=0.1, weight_decay=0.1)
        _train(models[-1], opt, queue, steps)
    with pytest.MonkeyPatch.context() as mp:        # the groups as parcl wrote them then
        mp.setattr(opt_cls, "state_dict", pc.optim.Optimizer.state_dict)
        pc.save(ckpt, models[-1], opt, step=2)
    with safe_open(str(ckpt), "np") as f:
        assert "decoupled_weight_decay" not in f.metadata()["parcl"]
    fresh = pc.nn.Linear(3, 2, queue=queue)
    fresh_opt = opt_cls(fresh.parameters(), lr=0.1, weight_decay=0.1)
    assert pc.load(ckpt, fresh, fresh_opt)["step"] == 2
    _train(fresh, fresh_opt, queue, 2)
    for k, v in models[0].state_dict().items():
        np.testing.assert_array_equal(fresh.state_dict()[k], v, err_msg=k)
    other = pc.optim.AdamW if cls == "Adam" else pc.optim.Adam
    with pytest.raises(pc.CheckpointError, match=f"an {cls} optimizer's state"):
        pc.load(ckpt, fresh, other(fresh.parameters()))
