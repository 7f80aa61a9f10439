"""Real data: the digits that ship with scikit-learn, trained for real."""

import gc

import numpy as np
import pytest

import parcl as pc
import parcl.tape as tp
from parcl.replica import ReplicaGroup


@pytest.fixture(scope="module")
def digits():
    return pc.data.load_digits(images=True)


def mlp(queue):
    return pc.nn.Sequential(pc.nn.Flatten(), pc.nn.Linear(64, 128, queue=queue), pc.nn.ReLU(),
                            pc.nn.Linear(128, 10, queue=queue))


def cnn(queue):
    return pc.nn.Sequential(
        pc.nn.Conv2d(1, 16, 3, padding=1, queue=queue), pc.nn.ReLU(),
        pc.nn.Conv2d(16, 32, 3, padding=1, queue=queue), pc.nn.ReLU(), pc.nn.MaxPool2d(2),
        pc.nn.Flatten(), pc.nn.Linear(32 * 4 * 4, 10, queue=queue))


def accuracy(model, queue, x, y):
    model.eval()
    with tp.no_grad():
        logits = model(pc.Tensor.from_host(queue, x)).to_host()
    model.train()
    return float((logits.argmax(-1) == y).mean())


def train_step(model, opt, queue, x, y):
    """One step of the seeds' training loop."""
    xt = tp.tensor(pc.Tensor.from_host(queue, x))
    with tp.Tape() as tape:
        loss = tp.cross_entropy(model(xt), pc.Tensor.from_host(queue, y))
    tape.backward(loss)
    opt.step()
    opt.zero_grad()


def cosine(lr, epoch, epochs):
    return lr * 0.5 * (1 + np.cos(np.pi * epoch / epochs))


def train(build, digits, epochs, lr, queue):
    x_train, y_train, x_test, y_test = digits
    pc.nn.manual_seed(0)
    model = build(queue)
    opt = pc.optim.Adam(model.parameters(), lr=lr)
    loader = pc.data.DataLoader((x_train, y_train), batch_size=64, shuffle=True, seed=0)
    for epoch in range(epochs):
        opt.lr = cosine(lr, epoch, epochs)
        for x, y in loader:
            train_step(model, opt, queue, x, y)
    return accuracy(model, queue, x_test, y_test)


def test_mlp_reaches_95_percent(digits, queue):
    assert train(mlp, digits, epochs=30, lr=1e-2, queue=queue) >= 0.95


def test_cnn_reaches_97_percent(digits, queue):
    assert train(cnn, digits, epochs=15, lr=3e-3, queue=queue) >= 0.97


def test_two_replicas_reach_the_same_accuracy(digits, devices2):
    x_train, y_train, x_test, y_test = digits

    def build(queue):
        pc.nn.manual_seed(0)
        return cnn(queue)

    with ReplicaGroup(build, devices2) as group:
        opt = pc.optim.Adam(group.parameters(), lr=3e-3)
        loader = pc.data.DataLoader((x_train, y_train), batch_size=64, shuffle=True, seed=0)
        for epoch in range(15):
            opt.lr = cosine(3e-3, epoch, 15)
            for x, y in loader:
                group.step(x, y, tp.cross_entropy, opt)
        acc = accuracy(group.model, group.replicas[0].queue, x_test, y_test)
    assert acc >= 0.97


def test_no_pool_growth_over_200_steps(queue):
    pc.nn.manual_seed(0)
    model = mlp(queue)
    opt = pc.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rng = np.random.default_rng(0)
    x = rng.random((32, 1, 8, 8), dtype=np.float32)
    y = rng.integers(0, 10, 32)
    in_use, held = {}, {}
    for step in range(200):
        train_step(model, opt, queue, x, y)       # the tape is dropped when it returns
        if step in (10, 199):
            gc.collect()      # earlier tests' cyclic garbage must not move the counter
            stats = pc.memory_stats(queue)
            in_use[step], held[step] = stats["bytes_in_use"], stats["pool_bytes"]
    assert in_use[199] == in_use[10]             # steady state: nothing accumulates
    assert held[199] == held[10]                 # and the pool reuses, it does not grow
