"""The code examples of the seed documents (netcl's Tape and no_grad pages), renamed to parcl
(`netcl` -> `parcl`, `netcl.autograd` -> `parcl.tape`), run for real."""

import numpy as np
import pytest

import parcl as nc  # the seeds' alias, kept so the examples read as written
import parcl.tape as ag


@pytest.fixture
def setup(queue):
    nc.nn.manual_seed(0)
    rng = np.random.default_rng(0)
    x_np = rng.random((16, 8), dtype=np.float32)
    y_np = rng.integers(0, 4, 16).astype(np.int64)

    def build_model(q):
        return nc.nn.Sequential(nc.nn.Linear(8, 16, queue=q), nc.nn.ReLU(),
                                nc.nn.Linear(16, 4, queue=q))

    return queue, build_model, x_np, y_np


def params_host(model):
    return [p.value.to_host() for p in model.parameters()]


def test_full_training_step(setup):
    queue, build_model, x_np, y_np = setup
    dataloader = [(x_np, y_np)] * 3
    model = build_model(queue)
    optimizer = nc.optim.AdamW(model.parameters(), lr=1e-3)
    before = params_host(model)

    for x_np, y_np in dataloader:
        x = ag.tensor(nc.Tensor.from_host(queue, x_np), requires_grad=False)
        y = ag.tensor(nc.Tensor.from_host(queue, y_np), requires_grad=False)

        with ag.Tape() as tape:
            pred = model(x)
            loss = ag.cross_entropy(pred, y, tape=tape)

        tape.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        # tape goes out of scope -> automatic buffer cleanup

    after = params_host(model)
    assert all(not np.array_equal(a, b) for a, b in zip(before, after))
    assert all(p.grad is None for p in model.parameters())


def test_usage_with_mse_loss(setup):
    queue, build_model, x_np, _ = setup
    model = build_model(queue)
    optimizer = nc.optim.SGD(model.parameters(), lr=0.1)
    x_node = ag.tensor(nc.Tensor.from_host(queue, x_np))
    y_node = ag.tensor(nc.Tensor.from_host(queue, np.zeros((16, 4), np.float32)))

    tape = ag.Tape()
    with tape:                          # sets tape as current; clears it on exit
        pred = model(x_node)
        loss = ag.mse_loss(pred, y_node)
    assert ag.get_current_tape() is None
    tape.backward(loss)                 # reverse pass
    optimizer.step()
    optimizer.zero_grad()

    with ag.no_grad():
        after = float(((model(x_node).to_host()) ** 2).mean())
    assert after < float(loss.to_host())


def test_explicit_tape_parameter(queue):
    x_node = ag.tensor(nc.Tensor.from_host(queue, np.array([-1.0, 2.0], np.float32)),
                       requires_grad=True)
    target = nc.Tensor.from_host(queue, np.array([0.0, 1.0], np.float32))

    tape = ag.Tape()
    out = ag.relu(x_node, tape=tape)
    loss = ag.mse_loss(out, target, tape=tape)
    tape.backward(loss)
    # d/dx mean((relu(x) - t)^2) = (relu(x) - t) * relu'(x)  (2/2)
    np.testing.assert_allclose(x_node.grad.to_host(), [0.0, 1.0])
    assert [n.op_name for n in tape.nodes] == ["relu", "mse_loss"]


def test_gradient_accumulation_across_forward_passes(setup):
    """The triplet loop: three tapes, gradients accumulate into the same parameters."""
    queue, build_model, x_np, _ = setup
    encoder = build_model(queue)
    optimizer = nc.optim.SGD(encoder.parameters(), lr=0.1)
    anchor, positive, negative = (ag.tensor(nc.Tensor.from_host(queue, x_np[i:i + 4]))
                                  for i in (0, 4, 8))

    def partial_triplet_loss(emb):
        return ag.mean(emb * emb)

    def grads_of(branches):
        optimizer.zero_grad()
        for branch in branches:
            tape = ag.Tape()
            with tape:
                emb = encoder(branch)
                loss = partial_triplet_loss(emb)
            tape.backward(loss)          # grads accumulate in param .grad fields
        return [p.grad.to_host() for p in encoder.parameters()]

    total = grads_of([anchor, positive, negative])
    separate = [grads_of([b]) for b in (anchor, positive, negative)]
    for i, g in enumerate(total):
        np.testing.assert_allclose(g, sum(s[i] for s in separate), rtol=1e-5, atol=1e-6)
    optimizer.step()


def test_standard_evaluation_loop(setup):
    queue, build_model, x_np, y_np = setup
    model = build_model(queue)
    test_loader = [(nc.Tensor.from_host(queue, x_np[i:i + 8]), y_np[i:i + 8]) for i in (0, 8)]

    model.eval()
    correct, total = 0, 0

    with ag.no_grad():
        for x, y_np_batch in test_loader:
            logits = model(x)                        # raw Tensor, no graph built
            assert isinstance(logits, nc.Tensor)
            pred = (logits.value.to_host().argmax(-1) if hasattr(logits, 'value')
                    else logits.to_host().argmax(-1))
            correct += (pred == y_np_batch).sum()
            total += y_np_batch.shape[0]

    accuracy = correct / total
    print(f"accuracy: {accuracy:.2%}")
    assert total == 16 and 0.0 <= accuracy <= 1.0


def test_set_grad_enabled_for_a_whole_inference_script(setup, tmp_path):
    queue, build_model, x_np, _ = setup
    model = build_model(queue)
    nc.save(tmp_path / "ckpt.safetensors", model)

    ag.set_grad_enabled(False)      # disable globally for the whole script
    try:
        model = build_model(queue)
        nc.load(tmp_path / "ckpt.safetensors", model)
        model.eval()
        outs = [model(ag.tensor(nc.Tensor.from_host(queue, batch), requires_grad=True))
                for batch in (x_np[:8], x_np[8:])]
        assert all(isinstance(out, nc.Tensor) for out in outs)
    finally:
        ag.set_grad_enabled(True)
    assert ag.is_grad_enabled()


def test_mixed_training_and_eval_in_one_loop(setup):
    queue, build_model, x_np, y_np = setup
    model = build_model(queue)
    optimizer = nc.optim.AdamW(model.parameters(), lr=1e-2)
    criterion = ag.cross_entropy
    x = ag.tensor(nc.Tensor.from_host(queue, x_np))
    y = nc.Tensor.from_host(queue, y_np)

    def accuracy(logits, labels):
        return float((logits.to_host().argmax(-1) == labels.to_host()).mean())

    accs = []
    for _ in range(20):
        with ag.Tape() as tape:
            loss = criterion(model(x), y)
        tape.backward(loss)
        optimizer.step()
        optimizer.zero_grad()

        with ag.no_grad():
            accs.append(accuracy(model(x), y))
    assert accs[-1] > accs[0]


def test_no_grad_memory_is_lower_than_with_tape(setup):
    """The no_grad page's table: no Node, no grad_fn, activations not kept alive."""
    queue, _, _, _ = setup
    nc.nn.manual_seed(0)
    model = nc.nn.Sequential(*[layer for _ in range(6)
                               for layer in (nc.nn.Linear(256, 256, queue=queue),
                                             nc.nn.ReLU())])
    x = ag.tensor(nc.Tensor.from_host(queue, np.ones((64, 256), np.float32)))

    def peak(fn):
        queue.finish()
        base = nc.memory_stats(queue)["bytes_in_use"]
        nc.reset_peak_memory_stats(queue)
        out = fn()
        return nc.memory_stats(queue)["peak_bytes_in_use"] - base, out

    with ag.Tape() as tape:
        with_tape, _ = peak(lambda: model(x))
    tape.release()
    with ag.no_grad():
        without, out = peak(lambda: model(x))
    act = 64 * 256 * 4
    weight = 256 * 256 * 4
    assert isinstance(out, nc.Tensor)
    # one layer's input and output at a time, plus that layer's GEMM packing temporaries
    assert without <= 2 * act + 2 * weight
    assert with_tape >= 10 * act            # every activation kept for backward
    assert with_tape > without
