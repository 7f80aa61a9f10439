"""The autograd core: recording, backward, accumulation, explicit tapes, grad modes (thread-local),
errors, cleanup and memory, anomaly detection, summaries. Examples from the netcl Tape / no_grad
pages and Entrenar's tape chapter, run for real."""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from conftest import leaf, up


def run_threads(target, n=2, timeout=120):
    errors = []

    def wrapped(i):
        try:
            target(i)
        except BaseException as exc:     # noqa: BLE001 - re-raised in the caller
            errors.append(exc)

    threads = [threading.Thread(target=wrapped, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]


# -- backward ---------------------------------------------------------------------------------
def test_entrenar_example(queue):
    """x=2, y=3, a=x+y, b=a*x: db/dx = 2x+y = 7, db/dy = x = 2, db/da = x = 2."""
    x, y = leaf(queue, [2.0]), leaf(queue, [3.0])
    with tp.Tape() as tape:
        a = x + y
        b = a * x
    assert [n.op_name for n in tape.nodes] == ["add", "mul"]
    assert b.parents == [a, x] and a.parents == [x, y]
    tape.backward(b)
    assert x.grad.to_host().tolist() == [7.0]
    assert y.grad.to_host().tolist() == [2.0]
    assert a.grad.to_host().tolist() == [2.0]


def test_node_used_twice_accumulates(queue, rng):
    xs = rng.standard_normal(7).astype(np.float32)
    x = leaf(queue, xs)
    with tp.Tape() as tape:
        loss = tp.sum(x * x)
    tape.backward(loss)
    np.testing.assert_allclose(x.grad.to_host(), 2 * xs, rtol=1e-6)


def test_gradient_accumulation_across_two_tapes(queue):
    x = leaf(queue, [1.0, 2.0])
    for _ in range(2):
        with tp.Tape() as tape:
            loss = tp.sum(x * 3.0)
        tape.backward(loss)
    np.testing.assert_array_equal(x.grad.to_host(), [6.0, 6.0])


def test_a_linear_weight_s_gradient_is_accumulated_by_its_gemm(queue, rng):
    """A leaf's existing .grad is handed to the op's backward (grad_targets): Linear adds
    g^T x into it with the GEMM (beta=1), no temporary and no separate +=. The result is the
    float32 sum of the two contributions, exactly as the tape's own += gives it."""
    from parcl.kernels._cache import trace_launches

    xs = [rng.standard_normal((7, 33), dtype=np.float32) for _ in range(2)]
    w = leaf(queue, rng.standard_normal((5, 33)))
    b = leaf(queue, rng.standard_normal(5))

    def backward(x):
        with tp.Tape() as tape:
            loss = tp.sum(tp.linear(tp.tensor(pc.Tensor.from_host(queue, x)), w, b, relu=True))
        with trace_launches() as launches:
            tape.backward(loss)
        return [name for name, _, _ in launches]

    firsts = []
    for x in xs:                                  # each contribution alone
        w.grad = b.grad = None
        backward(x)
        firsts.append(w.grad.to_host())
    w.grad = None
    backward(xs[0])                               # adopted: no existing grad yet
    kernels = backward(xs[1])                     # accumulated into the existing grad
    np.testing.assert_array_equal(w.grad.to_host(), firsts[0] + firsts[1])
    assert kernels.count("axpy") == 1             # the bias's += only
    with tp.detect_anomaly():                     # anomaly mode: every gradient checked, +=
        w.grad = None
        backward(xs[0])
        assert backward(xs[1]).count("axpy") == 2
    np.testing.assert_array_equal(w.grad.to_host(), firsts[0] + firsts[1])


def test_upstream_grad_for_a_non_scalar_loss(queue):
    x = leaf(queue, [1.0, 2.0, 3.0])
    with tp.Tape() as tape:
        y = x * x
    tape.backward(y, grad=pc.Tensor.from_host(queue, np.array([1, 0, 2], np.float32)))
    np.testing.assert_array_equal(x.grad.to_host(), [2.0, 0.0, 12.0])


def test_inputs_without_requires_grad_get_no_grad(queue):
    x, c = leaf(queue, [1.0]), leaf(queue, [5.0], requires_grad=False)
    with tp.Tape() as tape:
        loss = x * c
    tape.backward(loss)
    assert c.grad is None and x.grad.to_host().tolist() == [5.0]


# -- explicit tapes and current tape ------------------------------------------------------------
def test_explicit_tape_records_without_a_current_tape(queue):
    x = leaf(queue, [-1.0, 2.0])
    assert tp.get_current_tape() is None
    tape = tp.Tape()
    out = tp.relu(x, tape=tape)
    loss = tp.sum(out, tape=tape)
    assert [n.op_name for n in tape.nodes] == ["relu", "sum"]
    tape.backward(loss)
    np.testing.assert_array_equal(x.grad.to_host(), [0.0, 1.0])


def test_explicit_tape_records_inside_no_grad(queue):
    x = leaf(queue, [3.0])
    tape = tp.Tape()
    with tp.no_grad():
        out = tp.mul(x, x, tape=tape)
        untaped = tp.mul(x, x)
    assert isinstance(out, tp.Node) and len(tape.nodes) == 1
    assert isinstance(untaped, pc.Tensor)
    tape.backward(out)
    assert x.grad.to_host().tolist() == [6.0]


def test_with_tape_restores_the_previous_tape(queue):
    x = leaf(queue, [1.0])
    outer, inner = tp.Tape(), tp.Tape()
    with outer:
        assert tp.get_current_tape() is outer
        with inner:
            assert tp.get_current_tape() is inner
            tp.exp(x)
        assert tp.get_current_tape() is outer
        tp.neg(x)
    assert tp.get_current_tape() is None
    assert [n.op_name for n in inner.nodes] == ["exp"]
    assert [n.op_name for n in outer.nodes] == ["neg"]


def test_with_tape_restores_after_an_exception(queue):
    with pytest.raises(RuntimeError):
        with tp.Tape():
            raise RuntimeError("boom")
    assert tp.get_current_tape() is None


# -- grad modes -------------------------------------------------------------------------------
def test_no_grad_returns_raw_tensors_and_builds_no_node(queue):
    x = leaf(queue, [1.0, 2.0])
    with tp.Tape() as tape:
        with tp.no_grad():
            assert not tp.is_grad_enabled()
            out = tp.tanh(x * 2.0)
        assert tp.is_grad_enabled()
    assert isinstance(out, pc.Tensor) and not isinstance(out, tp.Node)
    assert tape.nodes == []

    @tp.no_grad()
    def evaluate(v):
        return tp.exp(v)

    assert isinstance(evaluate(x), pc.Tensor)
    assert tp.is_grad_enabled()

    @tp.no_grad()
    def batches(v, n):                       # a generator: its body runs without recording
        for _ in range(n):
            seen.append(tp.is_grad_enabled())
            yield tp.exp(v)

    seen = []
    outs = [(out, tp.is_grad_enabled()) for out in batches(x, 2)]
    assert seen == [False, False]
    assert all(isinstance(o, pc.Tensor) and caller for o, caller in outs)


def test_a_tensor_and_a_node_in_one_operator_give_the_op_either_way_round(queue):
    """Under no_grad an op's output is a raw Tensor and a parameter is still a Node: an
    operator between them is the Node's reflected one, whichever side the Tensor is on."""
    w = leaf(queue, [2.0, 4.0])
    with tp.no_grad():
        h = tp.exp(leaf(queue, [0.0, 0.0]))                   # a raw Tensor of ones
        assert isinstance(h, pc.Tensor) and isinstance(w, tp.Node)
        for got, want in ((h + w, [3.0, 5.0]), (w + h, [3.0, 5.0]), (h - w, [-1.0, -3.0]),
                          (h * w, [2.0, 4.0]), (h / w, [0.5, 0.25]), (w / h, [2.0, 4.0])):
            assert isinstance(got, pc.Tensor)
            np.testing.assert_array_equal(got.to_host(), want)
        with pytest.raises(TypeError, match="numpy array operand"):
            h + np.ones(2, np.float32)


def test_set_grad_enabled_for_a_whole_script(queue):
    x = leaf(queue, [1.0])
    tp.set_grad_enabled(False)
    try:
        assert not tp.is_grad_enabled()
        with tp.Tape() as tape:
            out = tp.exp(x)
            with tp.enable_grad():
                recorded = tp.exp(x)
        assert isinstance(out, pc.Tensor) and isinstance(recorded, tp.Node)
        assert len(tape.nodes) == 1
    finally:
        tp.set_grad_enabled(True)
    assert tp.is_grad_enabled()
    assert isinstance(tp.exp(x), tp.Node)


def test_set_grad_enabled_and_detect_anomaly_refuse_a_mode_that_is_no_bool_as_pytorch():
    """``tp.set_grad_enabled("False")`` (a mode read from a config file) switched recording
    on: ``bool("False")`` is True. PyTorch's is a TypeError; so is any mode but a bool."""
    for mode in ("False", None, 0, 1.0):
        with pytest.raises(pc.ParclError, match="must be a bool"):
            tp.set_grad_enabled(mode)
        with pytest.raises(pc.ParclError, match="must be a bool"):
            tp.detect_anomaly(mode)
    assert tp.is_grad_enabled() and not tp.is_anomaly_enabled()
    with tp.set_grad_enabled(np.bool_(False)):
        assert tp.is_grad_enabled() is False


def test_set_grad_enabled_decorates_a_function_as_pytorch(queue):
    """``@tp.set_grad_enabled(False)`` runs the function without recording and leaves the
    decorating thread recording, as ``@torch.set_grad_enabled(False)``; so does
    ``@tp.detect_anomaly()`` with its mode."""
    x = leaf(queue, [1.0])

    @tp.set_grad_enabled(False)
    def evaluate(v):
        return tp.is_grad_enabled(), tp.exp(v)

    assert tp.is_grad_enabled()
    enabled, out = evaluate(x)
    assert enabled is False and isinstance(out, pc.Tensor) and not isinstance(out, tp.Node)
    assert tp.is_grad_enabled() and isinstance(tp.exp(x), tp.Node)

    @tp.set_grad_enabled(False)
    def batches(n):                                  # a generator: its body, not the caller
        for _ in range(n):
            yield tp.is_grad_enabled()

    assert [(inside, tp.is_grad_enabled()) for inside in batches(2)] == [(False, True)] * 2

    @tp.detect_anomaly()
    def checked():
        return tp.is_anomaly_enabled()

    assert not tp.is_anomaly_enabled() and checked() and not tp.is_anomaly_enabled()


def test_no_grad_enable_grad_and_inference_mode_decorate_without_parentheses_as_pytorch(queue):
    """``@tp.no_grad``, ``@tp.enable_grad`` and ``@tp.inference_mode`` without a call decorate
    the function, as PyTorch's (2.0 on): they were a TypeError ('no_grad() takes no
    arguments') and a DTypeError ('the mode must be a bool, got <function ...>')."""
    tx = torch.tensor([1.0], requires_grad=True)
    want = (torch.no_grad(lambda: (tx * 2).requires_grad)(),
            torch.enable_grad(lambda: (tx * 2).requires_grad)(),
            torch.inference_mode(lambda: (tx * 2).requires_grad)())      # (False, True, False)
    x = leaf(queue, [1.0])

    def recorded():
        return isinstance(x * 2.0, tp.Node)

    got = []
    for switch in (tp.no_grad, tp.enable_grad, tp.inference_mode):
        with tp.no_grad():             # so that enable_grad has something to turn on
            got.append(switch(recorded)())
        assert tp.is_grad_enabled() and not tp.is_inference_mode_enabled()
    assert tuple(got) == want

    class Model:
        @tp.no_grad
        def evaluate(self, v):
            return tp.exp(v)

    assert not isinstance(Model().evaluate(x), tp.Node)
    with tp.no_grad():                 # the classes and calls with parentheses as before
        assert tp.enable_grad()(recorded)()


def test_grad_mode_is_thread_local(queues2):
    """One thread's no_grad does not stop the other thread's recording."""
    barrier = threading.Barrier(2, timeout=30)
    seen = {}

    def work(i):
        q = queues2[i]
        x = leaf(q, [1.0, 2.0])
        if i == 0:
            with tp.no_grad():
                barrier.wait()                    # both threads are inside their block now
                seen[i] = (tp.is_grad_enabled(), tp.mul(x, x))
                barrier.wait()
        else:
            with tp.Tape() as tape:
                barrier.wait()
                seen[i] = (tp.is_grad_enabled(), tp.mul(x, x))
                barrier.wait()
            seen["tape"] = len(tape.nodes)

    run_threads(work)
    assert seen[0][0] is False and isinstance(seen[0][1], pc.Tensor)
    assert seen[1][0] is True and isinstance(seen[1][1], tp.Node)
    assert seen["tape"] == 1


def test_threads_sharing_a_parameter_both_add_their_gradient_as_pytorch(queue):
    """Two threads on one queue run backward at once through one shared leaf (Hogwild-style,
    as PyTorch's AccumulateGrad allows): the leaf's ``.grad`` is the sum of both, never one
    pass's gradient adopted over the other's. Thread switches every microsecond make the
    race likely: before the fix about 2 trials in 100 lost one thread's gradient (w.grad 2
    or 4 where 6 is right)."""
    import sys
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for trial in range(300):
            w = leaf(queue, np.ones(5))
            scales = [up(queue, np.full(5, i + 1.0)) for i in range(2)]
            barrier = threading.Barrier(2, timeout=30)

            def work(i, w=w, scales=scales, barrier=barrier):
                with tp.Tape() as tape:
                    loss = tp.sum(tp.mul(tp.add(w, w), scales[i]))   # add: one buffer, twice
                barrier.wait()
                tape.backward(loss)

            run_threads(work)
            np.testing.assert_array_equal(w.grad.to_host(), np.full(5, 2.0 * (1 + 2)),
                                          err_msg=f"trial {trial}")
    finally:
        sys.setswitchinterval(interval)


def test_a_leaf_never_adopts_a_gradient_that_an_inner_node_still_reads(queue):
    """``b + h`` hands one gradient buffer to the leaf ``b`` and to the inner node ``h``.
    Another thread's pass sharing ``b`` adds into ``b.grad`` in place (Hogwild threads on one
    queue), here while ``h``'s backward runs. The leaf must hold a copy, as PyTorch's
    AccumulateGrad clones a gradient something else still holds: when it adopted the buffer
    itself, ``h``'s backward read 1 + 10 where 1 is right, and x.grad was 33 instead of 3."""
    from parcl.kernels import elementwise as ew
    b = leaf(queue, np.zeros(4))

    class Tap(tp.Function):                       # identity; its backward lets "the other
        name = "tap"                              # thread" add into b.grad first

        def forward(self, x):
            return x.copy()

        def backward(self, g):
            ew.axpy(b.grad, up(queue, np.ones(4)), 10.0)
            return ew.scalar("mul", g, 3.0)

    x = leaf(queue, np.ones(4))
    with tp.Tape() as tape:
        loss = tp.sum(b + Tap.apply(x))
    tape.backward(loss, retain_grads=False)      # as the replica group's backward
    np.testing.assert_array_equal(x.grad.to_host(), np.full(4, 3.0))
    np.testing.assert_array_equal(b.grad.to_host(), np.full(4, 11.0))


def test_a_leaf_twice_in_one_add_never_adds_its_gradient_into_itself(queue, monkeypatch):
    """``x + x`` hands one gradient buffer to both of its slots, the leaf ``x`` twice. When
    ``x`` adopted it at the first, the second added ``x.grad`` into itself, so whatever
    another thread's pass (Hogwild threads on one queue) added into ``x.grad`` in between was
    counted twice: with 10 added there, x.grad was 22 where 1 + 10 + 1 = 12 is right (real
    threads, sum((x + x) * s) with s = 1 and 2, retain_grads=False: 8 or 10 where 6 is right
    in about 1 trial of 70)."""
    from parcl.kernels import elementwise as ew
    from parcl.tape import tape as tape_module
    x = leaf(queue, np.ones(4))
    accumulate = tape_module._accumulate

    def another_thread_adds_after_the_first(node, g, owned):
        first = node is x.entry and node.grad is None
        accumulate(node, g, owned)
        if first:
            ew.axpy(node.grad, up(queue, np.full(4, 10.0)), 1.0)

    monkeypatch.setattr(tape_module, "_accumulate", another_thread_adds_after_the_first)
    with tp.Tape() as tape:
        loss = tp.sum(x + x)
    tape.backward(loss, retain_grads=False)      # as the replica group's backward
    np.testing.assert_array_equal(x.grad.to_host(), np.full(4, 12.0))


def test_threads_reading_one_badly_indexed_output_both_raise(queue):
    """An embedding's index check is shared by its output and what is computed from it: two
    threads reading such tensors at once both get the IndexError's ShapeError. The first
    cleared the pending read before it had made the error (which reads the indices back), and
    the second, finding neither, read the garbage silently: 416 of 500 trials."""
    w = leaf(queue, np.ones((4, 3)))
    for trial in range(30):
        with tp.Tape():
            out = tp.embedding(pc.Tensor.from_host(queue, np.array([1, 7])), w)   # 7 of 4
        outputs = [out, out * 2.0]
        raised = [False, False]
        barrier = threading.Barrier(2, timeout=30)

        def work(i, outputs=outputs, raised=raised, barrier=barrier):
            barrier.wait()
            with pytest.raises(pc.ShapeError, match="embedding: index 7"):
                outputs[i].to_host()
            raised[i] = True

        run_threads(work)
        assert raised == [True, True], f"trial {trial}"


def _graph_grads(queue, seed):
    rng = np.random.default_rng(seed)
    w = leaf(queue, rng.standard_normal((4, 33)))
    b = leaf(queue, rng.standard_normal((33,)))
    x = leaf(queue, rng.standard_normal((4, 33)), requires_grad=False)
    with tp.Tape() as tape:
        h = tp.gelu(x * w + b)
        loss = tp.mean(tp.sigmoid(h) * tp.tanh(h)) + tp.sum(tp.exp(tp.neg(h))) / 10.0
    tape.backward(loss)
    return w.grad.to_host(), b.grad.to_host(), loss.to_host()


def test_two_threads_record_at_once_like_one_after_another(queues2):
    rounds = 10
    sequential = [_graph_grads(queues2[i], seed=i) for i in range(2)]
    barrier = threading.Barrier(2, timeout=30)
    concurrent = {}

    def work(i):
        barrier.wait()
        concurrent[i] = [_graph_grads(queues2[i], seed=i) for _ in range(rounds)]

    run_threads(work)
    for i in range(2):
        for got in concurrent[i]:
            for g, want in zip(got, sequential[i]):
                np.testing.assert_array_equal(g, want)    # bit-identical


# -- errors -----------------------------------------------------------------------------------
def test_backward_twice_is_an_error(queue):
    x = leaf(queue, [1.0])
    with tp.Tape() as tape:
        loss = tp.exp(x)
    tape.backward(loss)
    with pytest.raises(pc.ParclError, match="twice"):
        tape.backward(loss)


def test_backward_after_release_is_an_error(queue):
    x = leaf(queue, [1.0])
    with tp.Tape() as tape:
        loss = tp.exp(x)
    tape.release()
    with pytest.raises(pc.ParclError, match="released"):
        tape.backward(loss)


def test_non_scalar_loss_needs_a_grad(queue):
    x = leaf(queue, [1.0, 2.0])
    with tp.Tape() as tape:
        y = tp.exp(x)
    with pytest.raises(pc.ShapeError, match=r"shape \(2,\)"):
        tape.backward(y)


def test_backward_of_a_raw_tensor_is_an_error(queue):
    x = leaf(queue, [1.0])
    with tp.Tape() as tape, tp.no_grad():
        y = tp.exp(x)
    with pytest.raises(pc.ParclError, match="raw pc.Tensor"):
        tape.backward(y)


# -- cleanup and memory ---------------------------------------------------------------------------
def _forward(queue, x, w):
    h = tp.tanh(x * w)
    return tp.sum(tp.sigmoid(h) * h)


def test_release_clears_nodes(queue, rng):
    x = leaf(queue, rng.standard_normal((33, 7)))
    w = leaf(queue, rng.standard_normal((7,)))
    with tp.Tape() as tape:
        loss = _forward(queue, x, w)
    nodes = list(tape.nodes)
    assert len(nodes) == 5 and all(n.grad_fn is not None for n in nodes)
    tape.backward(loss)
    tape.release()
    assert tape.nodes == []
    assert all(n.grad_fn is None and n.parents == [] for n in nodes)


@pytest.mark.parametrize("how", ["release", "drop", "reassign"])
def test_cleanup_returns_pool_memory(devices2, rng, how):
    """After release (or dropping the tape) activations go back to the pool: bytes in use fall
    to the pre-forward level plus what the caller still holds (the loss and leaf grads)."""
    q = pc.new_queue(devices2[0])             # a private pool: nothing else allocates on it
    x = leaf(q, rng.standard_normal((64, 257)))
    w = leaf(q, rng.standard_normal((257,)))
    gc.collect()
    before = pc.memory_stats(q)["bytes_in_use"]
    tape = tp.Tape()
    with tape:
        loss = _forward(q, x, w)
    refs = [weakref.ref(n) for n in tape.nodes if n is not loss.entry]
    during = pc.memory_stats(q)["bytes_in_use"]
    assert during >= before + 2 * 64 * 257 * 4      # what backward reads: tanh's, sigmoid's out
    tape.backward(loss)
    if how == "release":
        tape.release()
    elif how == "drop":
        del tape
    else:
        tape = tp.Tape()                          # netcl: old tape reassigned -> __del__
    assert all(r() is None for r in refs)         # intermediate nodes are gone
    x.grad = w.grad = None
    held = loss.value.nbytes + loss.grad.nbytes   # the caller still holds the loss
    assert pc.memory_stats(q)["bytes_in_use"] - before <= 2 * 256 and held <= 8
    del loss
    assert pc.memory_stats(q)["bytes_in_use"] == before
    q.finish()


def test_retain_grads_false_frees_intermediate_grads(queue, rng):
    x = leaf(queue, rng.standard_normal((7,)))
    with tp.Tape() as tape:
        h = tp.exp(x)
        loss = tp.sum(h * h)
    tape.backward(loss, retain_grads=False)
    assert h.grad is None and x.grad is not None


# -- anomaly detection ------------------------------------------------------------------------
def test_anomaly_in_forward_names_the_op(queue):
    x = leaf(queue, [-1.0, 1.0])
    with tp.detect_anomaly(), tp.Tape():
        with pytest.raises(pc.AnomalyError, match="'log'") as info:
            tp.log(x)
        assert "forward" in str(info.value) and "test_tape.py" in str(info.value)
        zero = leaf(queue, [0.0, 1.0])
        with pytest.raises(pc.AnomalyError, match="'div'"):
            tp.div(x, zero)
    assert not tp.is_anomaly_enabled()


def test_anomaly_in_backward_names_the_op(queue):
    x = leaf(queue, [0.0, 4.0])
    with tp.detect_anomaly():
        with tp.Tape() as tape:
            loss = tp.sum(tp.sqrt(x))             # finite forward, 1/(2*sqrt(0)) = inf backward
        with pytest.raises(pc.AnomalyError, match="backward of op 'sqrt'"):
            tape.backward(loss)
        a, b = leaf(queue, [1e-10]), leaf(queue, [1e-30])
        with tp.Tape() as tape:
            loss = tp.sum(a / b)                  # 1e20 is finite; d/db = -1e50 is not
        with pytest.raises(pc.AnomalyError, match="backward of op 'div'"):
            tape.backward(loss)


def test_without_anomaly_mode_nan_passes_silently(queue):
    x = leaf(queue, [-1.0])
    with tp.Tape():
        out = tp.log(x)
    assert np.isnan(out.to_host()[0])


# -- printing ---------------------------------------------------------------------------------
def test_print_tape_summary(queue, capsys):
    x = leaf(queue, np.ones((2, 3)))
    w = leaf(queue, np.ones((3,)))
    with tp.Tape() as tape:
        h = tp.relu(x * w)
        tp.mean(h)
    print(tape)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "Tape(3 nodes)"
    assert lines[1].strip() == "[0] mul(leaf(2, 3), leaf(3,)) -> (2, 3)"
    assert lines[2].strip() == "[1] relu(#0) -> (2, 3)"
    assert lines[3].strip() == "[2] mean(#1) -> ()"
    assert tape.summary() == str(tape)


def test_gradcheck_accepts_functions_that_use_node_operators(queue):
    x = tp.tensor(pc.Tensor.from_host(queue, np.array([0.5, -1.5, 2.0], np.float32)),
                  requires_grad=True)
    assert tp.gradcheck(lambda v: tp.reshape(v, (3, 1)) * 2.0 + v.reshape(3, 1) * v.reshape(3, 1),
                        [x])


def test_gradcheck_catches_a_wrong_backward(queue):
    class BadSquare(tp.Function):
        name = "bad_square"

        def forward(self, x):
            from parcl.kernels import elementwise as ew
            self.x = x
            return ew.unary("square", x)

        def backward(self, g):
            from parcl.kernels import elementwise as ew
            return ew.binary("mul", g, self.x)          # forgot the factor 2

    x = tp.tensor(pc.Tensor.from_host(queue, np.array([1.0, 2.0], np.float32)),
                  requires_grad=True)
    with pytest.raises(pc.GradcheckError, match="input 0"):
        tp.gradcheck(lambda v: BadSquare.apply(v), [x])


def test_gradcheck_checks_every_element_by_default(queue):
    """One wrong element of 200 (an indexing slip in a backward) is caught: by default every
    element is perturbed, as PyTorch's gradcheck does; a sample of 64 would miss it."""
    class OneWrong(tp.Function):
        name = "one_wrong"

        def forward(self, x):
            from parcl.kernels import elementwise as ew
            self.x = x
            return ew.unary("square", x)

        def backward(self, g):
            from parcl.kernels import elementwise as ew
            grad = ew.binary("mul", ew.scalar("mul", self.x, 2.0), g).to_host()
            grad[137] += 5.0
            return pc.Tensor.from_host(g.queue, grad)

    x = tp.tensor(pc.Tensor.from_host(queue, np.linspace(-1, 1, 200).astype(np.float32)),
                  requires_grad=True)
    with pytest.raises(pc.GradcheckError, match="input 0"):
        tp.gradcheck(lambda v: OneWrong.apply(v), [x])


@pytest.mark.parametrize("wrong", ["one_percent_off", "twice_for_small_gradients"])
def test_gradcheck_catches_a_gradient_one_percent_off_or_wrong_where_it_is_small(queue, wrong):
    """With the defaults a backward 1% off (x1.01 for x*x on N(0, 1) inputs) is caught, and
    so is one 2x off where every gradient is below 0.01; at atol = rtol = 1e-2 both passed."""
    from parcl.kernels import elementwise as ew
    factor, scale = (2.02, 1.0) if wrong == "one_percent_off" else (4.0, 5e-4)

    class Off(tp.Function):
        name = "off"

        def forward(self, x):
            self.x = x
            return ew.unary("square", x)

        def backward(self, g):
            return ew.binary("mul", ew.scalar("mul", self.x, factor), g)

    x = leaf(queue, np.random.default_rng(0).standard_normal(16) * scale)
    with pytest.raises(pc.GradcheckError, match="input 0"):
        tp.gradcheck(Off.apply, [x])


@pytest.mark.parametrize("bad", ["analytic", "numeric"])
def test_gradcheck_fails_a_nan_gradient(queue, bad):
    """A NaN on either side is no match, as in PyTorch's gradcheck: a backward returning NaN
    passed (``|NaN - fd| > tol`` is False, so no element was reported), and so did a
    function that is NaN where it is checked."""
    from parcl.kernels import elementwise as ew

    class NanSide(tp.Function):
        name = "nan_side"

        def forward(self, x):
            return ew.scalar("mul", x, float("nan") if bad == "numeric" else 2.0)

        def backward(self, g):
            return ew.scalar("mul", g, float("nan") if bad == "analytic" else 2.0)

    x = tp.tensor(pc.Tensor.from_host(queue, np.array([0.5, -1.0], np.float32)),
                  requires_grad=True)
    with pytest.raises(pc.GradcheckError, match="nan"):
        tp.gradcheck(NanSide.apply, [x])


def test_retain_grads_false_never_shares_a_gradient_buffer(queue):
    def leaf(v):
        return tp.tensor(pc.Tensor.from_host(queue, np.array([v], np.float32)),
                         requires_grad=True)

    x, y = leaf(2.0), leaf(3.0)
    with tp.Tape() as tape:
        a = x + y              # add hands one upstream tensor to both of its parents
        b = a + a
        c = b + x
        loss = tp.sum(c * 1.0)
    tape.backward(loss, retain_grads=False)
    assert x.grad.to_host()[0] == 3.0 and y.grad.to_host()[0] == 2.0
    assert x.grad.data is not y.grad.data


def test_an_intermediate_nothing_reads_goes_back_to_the_pool_during_the_forward(devices2, rng):
    """As in PyTorch: the tape keeps only what the backward reads (and what the caller
    holds). ``exp`` saves its output, ``x * w`` saves its inputs, ``sum`` saves nothing, so
    of the three (64, 257) intermediates only exp's output stays."""
    q = pc.new_queue(devices2[0])             # a private pool: nothing else allocates on it
    x = leaf(q, rng.standard_normal((64, 257)))
    w = leaf(q, rng.standard_normal((257,)))
    gc.collect()
    probe = pc.Tensor.zeros(q, (64, 257))      # what one intermediate takes from the pool
    before = pc.memory_stats(q)["bytes_in_use"]
    del probe
    one = before - pc.memory_stats(q)["bytes_in_use"]
    before -= one
    with tp.Tape() as tape:
        loss = tp.sum(tp.exp(tp.tanh(x * w) + 1.0))   # mul -> tanh (saves out) -> add -> exp
    held = pc.memory_stats(q)["bytes_in_use"] - before
    assert 2 * one <= held < 3 * one                  # tanh's and exp's outputs (+ the loss)
    tanh_out = tape.nodes[1]
    assert tanh_out.op_name == "tanh" and tanh_out.node() is None
    assert loss.parents[0].op_name == "exp"           # the graph is all still there
    with pytest.raises(pc.ParclError, match="output of 'exp' .* was let go"):
        _ = loss.parents[0].value
    tape.backward(loss)
    want = np.exp(np.tanh(x.to_host() * w.to_host()) + 1)
    np.testing.assert_allclose(
        w.grad.to_host(), (want * (1 - np.tanh(x.to_host() * w.to_host()) ** 2)
                           * x.to_host()).sum(0), rtol=1e-4)
    q.finish()


def test_a_held_intermediate_keeps_its_value_and_identity(queue, rng):
    x = leaf(queue, rng.standard_normal((5,)))
    with tp.Tape() as tape:
        h = x * 2.0
        loss = tp.sum(h + 1.0)
    add = loss.parents[0]                       # nothing holds the add's Node: its Entry
    assert add.op_name == "add" and add.parents[0] is h.entry and add.parents[0].node() is h
    assert tp.tanh(h).parents[0] is h
    np.testing.assert_allclose(h.to_host(), x.to_host() * 2)
    tape.backward(loss)
    np.testing.assert_allclose(h.grad.to_host(), np.ones(5))


def test_an_in_place_relu_over_a_saved_tensor_raises_in_backward(queue):
    """``h * h`` saves h; ``relu(h, inplace=True)`` then overwrites it, so the product's
    gradient would be computed from relu(h): the backward says so instead (PyTorch's
    "modified by an inplace operation"), before anything is accumulated."""
    x = leaf(queue, [-1.0, 0.5, 2.0])
    with tp.Tape() as tape:
        h = x * 2.0
        p = h * h
        r = tp.relu(h, inplace=True)
        loss = tp.sum(p) + tp.sum(r)
    with pytest.raises(pc.ParclError, match=r"'mul' .* relu\(inplace=True\) overwrote"):
        tape.backward(loss)
    assert x.grad is None


def test_an_in_place_relu_nothing_saved_before_trains_as_out_of_place(queue):
    """Over a tensor no earlier op saved (a scalar product's output), in place is fine and
    gives the out-of-place gradient."""
    grads = []
    for inplace in (False, True):
        x = leaf(queue, [-1.0, 0.5, 2.0])
        with tp.Tape() as tape:
            r = tp.relu(x * 2.0, inplace=inplace)
            loss = tp.sum(r * r)
        tape.backward(loss)
        grads.append(x.grad.to_host())
    np.testing.assert_array_equal(grads[0], grads[1])
    np.testing.assert_allclose(grads[0], [0.0, 4.0, 16.0])


def test_an_optimizer_step_between_forward_and_backward_raises(queue, rng):
    """The linear op saved the weight; stepping the optimizer before the backward changed it
    in place, so the input's gradient would be taken at the new weight (PyTorch raises for
    this too). Stepping after the backward, as a training loop does, is fine."""
    pc.nn.manual_seed(0)
    layer = pc.nn.Linear(4, 3, queue=queue)
    opt = pc.optim.SGD(layer.parameters(), lr=0.1)
    x = leaf(queue, rng.standard_normal((2, 4)))
    for _ in range(2):                           # the loop as it should be
        with tp.Tape() as tape:
            loss = tp.sum(layer(x))
        tape.backward(loss)
        opt.step()
        opt.zero_grad()
    with tp.Tape() as tape:
        loss = tp.sum(layer(x))
    tape.backward(loss)
    opt.step()                                   # a new forward is needed after this
    with tp.Tape() as tape:
        stale = tp.sum(layer(x))
        tp.sum(layer(x))
    opt.step()
    with pytest.raises(pc.ParclError, match=r"'linear' .* updated in place .* optimizer"):
        tape.backward(stale)


def test_loading_a_state_dict_between_forward_and_backward_raises(queue, rng):
    pc.nn.manual_seed(0)
    layer = pc.nn.Linear(4, 3, queue=queue)
    x = leaf(queue, rng.standard_normal((2, 4)))
    with tp.Tape() as tape:
        loss = tp.sum(layer(x))
    layer.load_state_dict({k: v * 2 for k, v in layer.state_dict().items()})
    with pytest.raises(pc.ParclError, match=r"'linear' .* updated in place"):
        tape.backward(loss)


def test_an_in_place_change_after_the_tape_block_raises_in_backward(queue):
    """The change is seen whichever tape is current when it happens (here none, under
    no_grad, as in an evaluation probe between forward and backward): ``linear`` saved x."""
    a = np.array([[1.0, -2.0, 3.0]], np.float32)
    x = pc.Tensor.from_host(queue, a)
    w = leaf(queue, np.ones((2, 3)))
    with tp.Tape() as tape:
        loss = tp.sum(tp.linear(x, w))
    with tp.no_grad():
        tp.relu(x, inplace=True)
    with pytest.raises(pc.ParclError, match=r"'linear' .* relu\(inplace=True\) overwrote"):
        tape.backward(loss)
    assert w.grad is None


def test_ops_recorded_on_no_tape_are_checked_for_changes_too(queue):
    """``loss.backward()`` with no tape current backwards on a new tape: an optimizer step
    or an in-place op after the forward still raises."""
    w = pc.nn.Parameter.from_host(queue, np.array([1.0, 2.0, 3.0], np.float32))
    opt = pc.optim.SGD([w], lr=1.0)
    loss = tp.sum(w * w)
    w.grad = pc.Tensor.full(queue, (3,), 1.0)
    opt.step()
    w.grad = None
    with pytest.raises(pc.ParclError, match=r"'mul' .* updated in place .* optimizer"):
        loss.backward()
    v = leaf(queue, [1.0, 1.0, 1.0])
    h = tp.tensor(np.array([1.0, -2.0, 3.0], np.float32))
    loss = tp.sum(v * h)
    tp.relu(h, inplace=True)
    with pytest.raises(pc.ParclError, match=r"'mul' .* relu\(inplace=True\) overwrote"):
        loss.backward()


def test_a_graph_over_two_tapes_sees_an_update_between_them(queue):
    """Features recorded on tape A (kept), a head on tape B: an optimizer step in between
    changed what A's op saved, so B's backward raises rather than taking the gradient at the
    new value."""
    w = pc.nn.Parameter.from_host(queue, np.array([1.0, 2.0, 3.0], np.float32))
    opt = pc.optim.SGD([w], lr=1.0)
    with tp.Tape() as a:                          # kept: its graph is still there
        h = w * w
    w.grad = pc.Tensor.full(queue, (3,), 1.0)
    opt.step()
    w.grad = None
    with tp.Tape() as b:
        loss = tp.sum(h * 1.0)
    with pytest.raises(pc.ParclError, match=r"'mul' .* updated in place"):
        b.backward(loss)
    assert a.nodes and w.grad is None


def test_a_value_copied_or_filled_in_place_before_the_backward_raises(queue, rng):
    pc.nn.manual_seed(0)
    layer = pc.nn.Linear(4, 3, queue=queue)
    x = leaf(queue, rng.standard_normal((2, 4)))
    for change in (lambda w: w.copy_(pc.Tensor.from_host(queue, np.ones((3, 4), np.float32))),
                   lambda w: w.fill_(0.5)):
        with tp.Tape() as tape:
            loss = tp.sum(layer(x))
        change(layer.weight.value)
        with pytest.raises(pc.ParclError, match=r"'linear' .* updated in place \(Tensor\."):
            tape.backward(loss)


def test_only_float_tensors_require_grad(queue):
    with pytest.raises(pc.DTypeError, match="int64 tensor .* cannot require grad"):
        tp.tensor(np.array([1, 2]), requires_grad=True)
    assert tp.tensor(np.array([1, 2])).value.dtype == np.int64


def test_a_leaf_backwarded_with_a_given_grad_does_not_keep_the_callers_tensor(queue):
    x = leaf(queue, [1.0, 2.0])
    g = pc.Tensor.from_host(queue, np.array([1.0, 1.0], np.float32))
    for _ in range(3):
        with tp.Tape() as tape:
            pass
        tape.backward(x, grad=g)
    np.testing.assert_array_equal(x.grad.to_host(), [3.0, 3.0])
    np.testing.assert_array_equal(g.to_host(), [1.0, 1.0])


@pytest.mark.parametrize("retain", [True, False], ids=["retain_grads", "released_grads"])
@pytest.mark.parametrize("op", ["linear", "matmul"])
def test_a_leaf_both_added_and_multiplied_gets_one_gradient_either_way(queue, rng, op, retain):
    """``W + f(x, W)``: the add hands one gradient buffer to W and to f's output. W's
    ``.grad`` must not be the buffer f's backward then reads while it accumulates W's weight
    gradient into W's ``.grad`` (it was, with ``retain_grads=False``: a refused GEMM, or
    a GEMM reading and writing one buffer)."""
    w64 = rng.standard_normal((4, 4))
    x64 = rng.standard_normal((4, 4))
    w, x = leaf(queue, w64), up(queue, x64)
    fn = (lambda a, b: tp.linear(a, b)) if op == "linear" else tp.matmul
    with tp.Tape() as tape:
        loss = tp.sum(tp.add(w, fn(tp.tensor(x), w)))
    tape.backward(loss, retain_grads=retain)
    ones = np.ones((4, 4))
    want = ones + (ones.T @ x64 if op == "linear" else x64.T @ ones)
    np.testing.assert_allclose(w.grad.to_host(), want, rtol=1e-5, atol=1e-5)


def test_batch_norm_overwriting_a_saved_residual_raises_in_backward(queue, rng):
    """``exp`` saves its output; a batch norm that writes its result over it
    (``overwrite_residual=True``) would have exp's gradient taken from the overwritten
    values. The same mechanism as ``relu(inplace=True)`` (``Function.overwrites``) catches it;
    over an output nothing saved it trains as out of place."""
    x = leaf(queue, rng.standard_normal((4, 3)))
    z = leaf(queue, rng.standard_normal((4, 3)))
    with tp.Tape() as tape:
        r = tp.exp(z)
        loss = tp.sum(tp.batch_norm(x, None, None, None, None, True, residual=r,
                                    overwrite_residual=True) * r)
    with pytest.raises(pc.ParclError, match=r"'exp' .* batch_norm\(overwrite_residual=True\)"):
        tape.backward(loss)
    grads = []
    for overwrite in (False, True):
        z.grad = None
        with tp.Tape() as tape:
            r = z * 2.0                              # nothing saves it
            loss = tp.sum(tp.batch_norm(x, None, None, None, None, True, residual=r,
                                        overwrite_residual=overwrite))
        tape.backward(loss)
        grads.append(z.grad.to_host())
    np.testing.assert_array_equal(grads[0], grads[1])


def test_an_optimizer_step_is_caught_through_views_of_the_parameter(queue, rng):
    """A batched matmul saves a reshaped view of its weight, and a reshape can stand between
    the parameter and the op that saves it: both still share the parameter's buffer."""
    w = pc.nn.Parameter.from_host(queue, rng.standard_normal((4, 3)).astype(np.float32))
    opt = pc.optim.SGD([w], lr=0.1)
    x = leaf(queue, rng.standard_normal((2, 5, 4)))
    for forward in (lambda: tp.matmul(x, w), lambda: tp.matmul(x, tp.reshape(w, (4, 3)))):
        w.grad = pc.Tensor.zeros(queue, (4, 3))
        with tp.Tape() as tape:
            loss = tp.sum(forward())
        opt.step()
        with pytest.raises(pc.ParclError, match="updated in place"):
            tape.backward(loss)
