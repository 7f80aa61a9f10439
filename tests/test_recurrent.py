"""pc.nn.LSTM and pc.nn.GRU against torch.nn's (torch's state dict loaded): outputs, final
states, the input's and initial states' gradients and every parameter's gradient, over
layers, directions, batch_first, bias=False, given initial states and unbatched inputs; the
state-dict keys, initialisation bounds and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from xfmr_reference import compare

import parcl as pc
from parcl.errors import ParclError, ShapeError

IN, H, T, B = 3, 4, 5, 2


def _pair(kind: str, **kw):
    torch.manual_seed(0)
    return getattr(torch.nn, kind)(IN, H, **kw), getattr(pc.nn, kind)(IN, H, **kw)


def _x(rng, batch_first=False, batched=True):
    shape = ((B, T, IN) if batch_first else (T, B, IN)) if batched else (T, IN)
    return rng.standard_normal(shape).astype(np.float32)


def _flat(out):
    """``output, (h_n, c_n)`` or ``output, h_n`` as a flat tuple."""
    o, state = out
    return (o, *state) if isinstance(state, tuple) else (o, state)


CONFIGS = [
    {},
    {"num_layers": 2},
    {"batch_first": True},
    {"bias": False},
    {"bidirectional": True},
    {"num_layers": 2, "bidirectional": True, "batch_first": True},
]


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("kw", CONFIGS, ids=lambda kw: "-".join(kw) or "default")
def test_matches_torch(queue, rng, kind, kw):
    tm, pm = _pair(kind, **kw)
    assert list(pm.state_dict()) == list(tm.state_dict())
    x = _x(rng, batch_first=kw.get("batch_first", False))

    def run(m, x):
        return _flat(m(x))
    out = compare(queue, tm, pm, [x], run, run, tol=1e-5)
    d = 2 if kw.get("bidirectional") else 1
    assert out[1].shape == (kw.get("num_layers", 1) * d, B, H)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("batched", [True, False])
def test_initial_states_and_their_gradients_match_torch(queue, rng, kind, batched):
    tm, pm = _pair(kind, num_layers=2, bidirectional=True)
    x = _x(rng, batched=batched)
    state = (4, B, H) if batched else (4, H)
    h0, c0 = (rng.standard_normal(state).astype(np.float32) for _ in range(2))
    if kind == "LSTM":
        def run(m, x, h, c):
            return _flat(m(x, (h, c)))
        inputs = [x, h0, c0]
    else:
        def run(m, x, h):
            return _flat(m(x, h))
        inputs = [x, h0]
    out = compare(queue, tm, pm, inputs, run, run, tol=1e-5)
    assert out[0].shape == ((T, B, 2 * H) if batched else (T, 2 * H))


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_dropout_between_layers(queue, rng, kind):
    # p=1 zeroes every layer's output but the last in both frameworks: deterministic
    tm, pm = _pair(kind, num_layers=2, dropout=1.0)

    def run(m, x):
        return _flat(m(x))
    compare(queue, tm, pm, [_x(rng)], run, run, tol=1e-5)
    pm.eval()
    tm.eval()
    compare(queue, tm, pm, [_x(rng)], run, run, tol=1e-5)


@pytest.mark.parametrize("kind,gates", [("LSTM", 4), ("GRU", 3)])
def test_parameters_and_initialisation(queue, kind, gates):
    m = getattr(pc.nn, kind)(6, 10, num_layers=2, bidirectional=True)
    shapes = {k: v.shape for k, v in m.state_dict().items()}
    assert shapes["weight_ih_l0"] == (gates * 10, 6)
    assert shapes["weight_ih_l1_reverse"] == (gates * 10, 20)
    assert shapes["weight_hh_l1"] == (gates * 10, 10) and shapes["bias_hh_l0"] == (gates * 10,)
    bound = 1 / np.sqrt(10)
    for v in m.state_dict().values():
        assert np.abs(v).max() <= bound and np.abs(v).max() > 0.8 * bound
    assert "bias_ih_l0" not in getattr(pc.nn, kind)(6, 10, bias=False).state_dict()


def test_refusals(queue, rng):
    lstm = pc.nn.LSTM(IN, H)
    x = pc.Tensor.from_host(queue, _x(rng))
    with pytest.raises(ShapeError, match="LSTM.*has 3 features, expected input_size=4"):
        pc.nn.LSTM(4, H)(x)
    with pytest.raises(ShapeError, match="LSTM.*2-d .*or 3-d"):
        lstm(pc.Tensor.from_host(queue, np.ones((1, T, B, IN), np.float32)))
    with pytest.raises(ShapeError, match=r"h_0 has shape \(2, 2, 4\), expected \(1, 2, 4\)"):
        bad = pc.Tensor.zeros(queue, (2, B, H))
        lstm(x, (bad, bad))
    with pytest.raises(ParclError, match="tuple"):
        lstm(x, pc.Tensor.zeros(queue, (1, B, H)))
    with pytest.raises(ParclError, match="proj_size"):
        pc.nn.LSTM(IN, H, proj_size=2)
    with pytest.raises(ShapeError, match="GRU: hidden_size"):
        pc.nn.GRU(IN, 0)
    with pytest.warns(UserWarning, match="dropout"):
        pc.nn.GRU(IN, H, dropout=0.5)


@pytest.mark.parametrize("which", ["c_0", "h_0", "h_0 and c_0"])
def test_lstm_refuses_a_state_tuple_with_a_none_rather_than_starting_it_at_zeros(queue, rng,
                                                                                 which):
    # PyTorch raises on (h_0, None); parcl ran with c_0 = 0, silently
    lstm = pc.nn.LSTM(IN, H)
    x = pc.Tensor.from_host(queue, _x(rng))
    s = pc.Tensor.from_host(queue, np.ones((1, B, H), np.float32))
    hx = (None if "h_0" in which else s, None if "c_0" in which else s)
    with pytest.raises(ParclError, match=f"LSTM: hx=\\(h_0, c_0\\) has {which} None"):
        lstm(x, hx)
    out, (h_n, c_n) = lstm(x, (s, s))                  # both given: still fine
    assert h_n.shape == c_n.shape == (1, B, H)


def test_no_grad_gives_raw_tensors_equal_to_the_recorded_run(queue, rng):
    import parcl.tape as tp
    gru = pc.nn.GRU(IN, H, num_layers=2)
    x = _x(rng)
    with tp.no_grad():
        out, h_n = gru(pc.Tensor.from_host(queue, x))
    assert isinstance(out, pc.Tensor) and isinstance(h_n, pc.Tensor)
    recorded, _ = gru(tp.tensor(x, requires_grad=True))
    np.testing.assert_array_equal(recorded.to_host(), out.to_host())
