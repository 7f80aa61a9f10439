"""LSTM, GRU, Conv1d (with its pools) and einsum inside ``ReplicaGroup.step`` with 2 replicas,
eager and captured: sequences of other lengths from step to step, an Adam with two parameter
groups whose betas and weight decay change mid-run, end where the single-replica full-batch
run does; with dropout between recurrent layers, train()/eval() switches and a module's
attribute changed between steps, the captured steps (replayed, not re-run eagerly) give the
eager group's losses and weights bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

import parcl as pc
import parcl.tape as tp
from parcl.replica import ReplicaGroup


class Tagger(pc.nn.Module):
    """Conv1d -> pool -> LSTM/GRU (two layers, batch_first) -> mean over time -> einsum head."""

    def __init__(self, queue, kind="LSTM", dropout=0.0):
        super().__init__()
        pc.manual_seed(0)
        self.conv = pc.nn.Conv1d(3, 4, 3, padding="same", queue=queue)
        self.pool = pc.nn.MaxPool1d(2, ceil_mode=True)
        self.rnn = getattr(pc.nn, kind)(4, 5, num_layers=2, batch_first=True,
                                        dropout=dropout, queue=queue)
        self.w = pc.nn.Parameter.from_host(
            queue, np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32))
        self.eq = "bh,hc->bc"

    def forward(self, x):                                   # x (B, T, 3)
        h = self.pool(tp.relu(self.conv(tp.transpose(x, (0, 2, 1)))))
        out, _ = self.rnn(tp.transpose(h, (0, 2, 1)))
        return tp.einsum(self.eq, tp.mean(out, 1), self.w)


def batches(lengths, n=6):
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((n, t, 3)).astype(np.float32), rng.integers(0, 4, n))
            for t in lengths]


def adam(model):
    rest = [p for name, p in model.named_parameters() if not name.startswith("rnn.")]
    return pc.optim.Adam([{"params": list(model.rnn.parameters())},
                          {"params": rest, "lr": 0.05, "weight_decay": 0.1}], lr=0.02)


def retune(step, opt):
    if step == 2:
        opt.param_groups[0]["betas"] = (0.5, 0.9)
    if step == 3:
        opt.param_groups[1]["weight_decay"] = 0.0


LENGTHS = [8, 8, 6, 9, 8]


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("capture", [False, True])
def test_two_replicas_end_where_one_does(devices2, kind, capture):
    q = pc.new_queue(devices2[0])
    model = Tagger(q, kind)
    opt = adam(model)
    for s, (x, y) in enumerate(batches(LENGTHS)):
        retune(s, opt)
        with tp.Tape() as tape:
            loss = tp.cross_entropy(model(tp.tensor(pc.Tensor.from_host(q, x))),
                                    pc.Tensor.from_host(q, y))
        tape.backward(loss)
        opt.step()
        opt.zero_grad()
        tape.release()
    with ReplicaGroup(lambda qq: Tagger(qq, kind), devices2, capture=capture) as g:
        opt = adam(g.model)
        for s, (x, y) in enumerate(batches(LENGTHS)):
            retune(s, opt)
            g.step(x, y, tp.cross_entropy, opt)
        got = g.model.state_dict()
    for name, want in model.state_dict().items():
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-6, err_msg=name)


def test_captured_steps_with_dropout_eval_and_changed_attributes_equal_eager(devices2):
    def run(capture):
        with ReplicaGroup(lambda q: Tagger(q, "LSTM", dropout=0.4), devices2,
                          capture=capture) as g:
            opt = pc.optim.SGD(g.parameters(), lr=0.1, momentum=0.9)
            losses = []
            for s, (x, y) in enumerate(batches([8, 8, 8, 6, 8, 8, 8])):
                g.train(s not in (2, 5))
                if s == 4:
                    g.model.pool.kernel_size = 3
                    g.model.rnn.dropout = 0.1
                losses.append(g.step(x, y, tp.cross_entropy, opt))
            replays = [s.replays for per in g.captured_steps for s in per]
            return losses, g.model.state_dict(), replays
    eager, eager_state, _ = run(False)
    captured, captured_state, replays = run(True)
    assert captured == eager
    for name, want in eager_state.items():
        np.testing.assert_array_equal(captured_state[name], want, err_msg=name)
    assert all(r > 0 for r in replays)
