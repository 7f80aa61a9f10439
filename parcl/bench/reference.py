"""numpy reference implementations of the benchmark models' training step, and of a
data-parallel step over threads.

Plain numpy, float32, the same layouts as parcl and PyTorch: ``Linear`` weight ``(out, in)``,
``Conv2d`` weight ``(cout, cin, kh, kw)``, convolutions as im2col + one matmul, max pooling
2x2 (floor), softmax cross entropy averaged over the batch, SGD. They are what a careful numpy
user would write, and the baseline ``parcl-bench compare`` reports parcl against;
``NumpyDataParallel`` is the one ``parcl-bench scaling`` reports parcl's replicas against.

>>> import numpy as np
>>> ref = NumpyMLP({"0.weight": np.ones((3, 4), np.float32), "0.bias": np.zeros(3, np.float32)})
>>> round(ref.step(np.ones((2, 4), np.float32), np.array([0, 1]), lr=0.0), 4)
1.0986
"""

from __future__ import annotations

import threading

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


# -- building blocks ---------------------------------------------------------------------------
def im2col(x: np.ndarray, kh: int, kw: int, pad: int) -> tuple[np.ndarray, int, int]:
    """``(N*OH*OW, C*KH*KW)`` patches of NCHW ``x`` (stride 1), and ``OH``, ``OW``."""
    if pad:
        x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, c = x.shape[:2]
    win = sliding_window_view(x, (kh, kw), axis=(2, 3))        # (N, C, OH, OW, KH, KW)
    oh, ow = win.shape[2], win.shape[3]
    cols = np.ascontiguousarray(win.transpose(0, 2, 3, 1, 4, 5)).reshape(n * oh * ow, -1)
    return cols, oh, ow


def conv2d_forward(x, w, b=None, pad: int = 0):
    """Stride-1 convolution (cross-correlation) as im2col + matmul; returns NCHW."""
    cout, _, kh, kw = w.shape
    cols, oh, ow = im2col(x, kh, kw, pad)
    y = cols @ w.reshape(cout, -1).T
    if b is not None:
        y += b
    return np.ascontiguousarray(y.reshape(x.shape[0], oh, ow, cout).transpose(0, 3, 1, 2))


def conv2d_backward(x, cols, w, dy, pad: int = 0, need_input: bool = True):
    """Gradients (dx or None, dw, db) of ``conv2d_forward`` given its im2col ``cols``."""
    n, c, h, wd = x.shape
    cout, _, kh, kw = w.shape
    oh, ow = dy.shape[2], dy.shape[3]
    dy2 = dy.transpose(0, 2, 3, 1).reshape(-1, cout)
    dw = (dy2.T @ cols).reshape(w.shape)
    db = dy2.sum(axis=0)
    dx = None
    if need_input:
        dcols = (dy2 @ w.reshape(cout, -1)).reshape(n, oh, ow, c, kh, kw)
        dxp = np.zeros((n, c, h + 2 * pad, wd + 2 * pad), np.float32)
        for ky in range(kh):
            for kx in range(kw):
                dxp[:, :, ky:ky + oh, kx:kx + ow] += dcols[..., ky, kx].transpose(0, 3, 1, 2)
        dx = dxp[:, :, pad:pad + h, pad:pad + wd] if pad else dxp
    return dx, dw, db


def maxpool2(x):
    """2x2 max pooling, stride 2 (floor); returns the output and what backward needs."""
    n, c, h, w = x.shape
    oh, ow = h // 2, w // 2
    win = x[:, :, :oh * 2, :ow * 2].reshape(n, c, oh, 2, ow, 2).transpose(0, 1, 2, 4, 3, 5)
    win = win.reshape(n, c, oh, ow, 4)
    idx = win.argmax(axis=-1)
    out = np.take_along_axis(win, idx[..., None], -1)[..., 0]
    return out, (x.shape, idx)


def maxpool2_backward(dout, saved):
    (n, c, h, w), idx = saved
    oh, ow = dout.shape[2], dout.shape[3]
    dwin = np.zeros((n, c, oh, ow, 4), np.float32)
    np.put_along_axis(dwin, idx[..., None], dout[..., None], -1)
    dx = np.zeros((n, c, h, w), np.float32)
    dx[:, :, :oh * 2, :ow * 2] = dwin.reshape(n, c, oh, ow, 2, 2).transpose(
        0, 1, 2, 4, 3, 5).reshape(n, c, oh * 2, ow * 2)
    return dx


def cross_entropy(logits, y):
    """Mean softmax cross entropy and its gradient with respect to ``logits``."""
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    s = e.sum(axis=1, keepdims=True)
    n = logits.shape[0]
    loss = float(np.mean(np.log(s[:, 0]) - z[np.arange(n), y]))
    g = e / s
    g[np.arange(n), y] -= 1.0
    return loss, (g / n).astype(np.float32)


def sgd(params: dict, grads: dict, lr: float) -> None:
    for k, gk in grads.items():
        params[k] -= lr * gk


# -- models ------------------------------------------------------------------------------------
class NumpyMLP:
    """Linear layers (``{i}.weight``/``{i}.bias`` as in a parcl ``Sequential``) with ReLU
    between them."""

    def __init__(self, state: dict):
        self.p = {k: np.array(v, np.float32) for k, v in state.items()}
        self.layers = sorted({int(k.split(".")[0]) for k in self.p})

    def step(self, x, y, lr: float) -> float:
        loss, grads = self.grads(x, y)
        sgd(self.p, grads, lr)
        return loss

    def grads(self, x, y) -> tuple[float, dict]:
        """The batch-mean loss and every parameter's gradient; parameters unchanged."""
        acts = [np.asarray(x, np.float32)]
        for j, i in enumerate(self.layers):
            h = acts[-1] @ self.p[f"{i}.weight"].T + self.p[f"{i}.bias"]
            acts.append(np.maximum(h, 0) if j < len(self.layers) - 1 else h)
        loss, g = cross_entropy(acts[-1], y)
        grads = {}
        for j in reversed(range(len(self.layers))):
            i = self.layers[j]
            if j < len(self.layers) - 1:
                g = g * (acts[j + 1] > 0)
            grads[f"{i}.weight"] = g.T @ acts[j]
            grads[f"{i}.bias"] = g.sum(axis=0)
            if j > 0:
                g = g @ self.p[f"{i}.weight"]
        return loss, grads


class NumpyCNN:
    """The benchmark CNN (parcl ``Sequential`` names ``0.`` conv, ``3.`` conv, ``7.`` linear)."""

    def __init__(self, state: dict):
        self.p = {k: np.array(v, np.float32) for k, v in state.items()}

    def step(self, x, y, lr: float) -> float:
        loss, grads = self.grads(x, y)
        sgd(self.p, grads, lr)
        return loss

    def grads(self, x, y) -> tuple[float, dict]:
        """The batch-mean loss and every parameter's gradient; parameters unchanged."""
        p = self.p
        x = np.asarray(x, np.float32)
        c1, oh, ow = im2col(x, 3, 3, 0)
        h1 = (c1 @ p["0.weight"].reshape(32, -1).T + p["0.bias"])
        a1 = np.maximum(h1, 0).reshape(x.shape[0], oh, ow, 32).transpose(0, 3, 1, 2)
        m1, s1 = maxpool2(a1)
        c2, oh2, ow2 = im2col(m1, 3, 3, 0)
        h2 = c2 @ p["3.weight"].reshape(64, -1).T + p["3.bias"]
        a2 = np.maximum(h2, 0).reshape(x.shape[0], oh2, ow2, 64).transpose(0, 3, 1, 2)
        m2, s2 = maxpool2(a2)
        flat = m2.reshape(x.shape[0], -1)
        logits = flat @ p["7.weight"].T + p["7.bias"]
        loss, g = cross_entropy(logits, y)
        grads = {"7.weight": g.T @ flat, "7.bias": g.sum(axis=0)}
        g = (g @ p["7.weight"]).reshape(m2.shape)
        g = maxpool2_backward(g, s2) * (a2 > 0)
        dm1, grads["3.weight"], grads["3.bias"] = conv2d_backward(m1, c2, p["3.weight"], g)
        g = maxpool2_backward(dm1, s1) * (a1 > 0)
        _, grads["0.weight"], grads["0.bias"] = conv2d_backward(x, c1, p["0.weight"], g,
                                                                need_input=False)
        return loss, grads


NUMPY_MODELS = {"mlp": NumpyMLP, "cnn": NumpyCNN}


# -- data parallel -----------------------------------------------------------------------------
class NumpyDataParallel:
    """Synchronous data parallelism for a numpy model over ``k`` threads sharing its
    parameters: per step each thread computes the gradients of its shard (numpy's matmuls
    release the interpreter lock, so the threads run side by side), all meet at a barrier,
    then each averages (in replica order, so the result is deterministic) and applies the
    update for its own share of the parameters, and all meet again. With numpy's BLAS on one
    thread each, it is the plain way to train data-parallel on a multi-core CPU in numpy, and
    it pays the same per-step wait for the slowest replica as parcl's replicas do.

    Call ``start()`` (or use it as a context manager) before ``step`` and ``close()`` after;
    ``timeout`` (s) bounds every wait, so a stuck thread raises rather than hangs.
    """

    def __init__(self, model, k: int, timeout: float = 120.0):
        if k < 1:
            raise ValueError(f"NumpyDataParallel: k must be >= 1, got {k}")
        self.model, self.k, self.timeout = model, k, timeout
        keys = list(model.p)
        self._shares = [keys[i::k] for i in range(k)]
        self._start = threading.Barrier(k + 1, timeout=timeout)
        self._done = threading.Barrier(k + 1, timeout=timeout)
        self._reduce = threading.Barrier(k, timeout=timeout)
        self._task = None
        self._grads: list = [None] * k
        self._losses: list = [0.0] * k
        self._errors: list = []
        self._threads: list[threading.Thread] = []

    def start(self) -> NumpyDataParallel:
        self._threads = [threading.Thread(target=self._work, args=(i,), daemon=True,
                                          name=f"numpy replica {i}") for i in range(self.k)]
        for t in self._threads:
            t.start()
        return self

    def __enter__(self) -> NumpyDataParallel:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if not self._threads:
            return
        self._task = None
        try:
            self._start.wait()
        except threading.BrokenBarrierError:
            pass
        for t in self._threads:
            t.join(self.timeout)
        self._threads = []

    def step(self, x, y, lr: float, steps: int = 1) -> float:
        """``steps`` synchronous steps on the global batch ``x``, ``y`` (split evenly in
        order); returns the last step's loss averaged over the replicas."""
        if not self._threads:
            raise RuntimeError("NumpyDataParallel.step: call start() first")
        bounds = [i * len(x) // self.k for i in range(self.k + 1)]
        if any(b == a for a, b in zip(bounds, bounds[1:])):
            raise ValueError(f"NumpyDataParallel.step: a batch of {len(x)} leaves a replica "
                             f"of {self.k} without samples")
        shards = [(x[a:b], y[a:b]) for a, b in zip(bounds, bounds[1:])]
        # Each shard's gradients are its mean; weighting by shard size gives the batch mean.
        weights = [np.float32((b - a) / len(x)) for a, b in zip(bounds, bounds[1:])]
        self._task = (shards, weights, lr, steps)
        broken = False
        try:
            self._start.wait()
            self._done.wait()
        except threading.BrokenBarrierError:
            broken = True
        # A thread that failed; the others only saw the barriers it broke (or timed out).
        failed = [e for e in self._errors if not isinstance(e[1], threading.BrokenBarrierError)]
        if failed:
            i, err = failed[0]
            self.close()
            raise RuntimeError(f"numpy replica {i} failed: {err!r}") from err
        if broken or self._errors:               # nobody failed: a thread is stuck
            self._threads = []                   # daemons; nothing more to join
            raise RuntimeError(f"NumpyDataParallel.step: the threads did not finish within "
                               f"{self.timeout:g} s")
        return float(np.dot(weights, self._losses))

    def _work(self, i: int) -> None:
        while True:
            try:
                self._start.wait()
            except threading.BrokenBarrierError:
                return
            if self._task is None:
                return
            shards, weights, lr, steps = self._task
            try:
                for _ in range(steps):
                    self._losses[i], self._grads[i] = self.model.grads(*shards[i])
                    self._reduce.wait()
                    for key in self._shares[i]:
                        g = weights[0] * self._grads[0][key]
                        for w, other in zip(weights[1:], self._grads[1:]):
                            g += w * other[key]
                        self.model.p[key] -= np.float32(lr) * g
                    self._reduce.wait()
                self._done.wait()
            except BaseException as err:   # noqa: B036 - reported by step(), never swallowed
                self._errors.append((i, err))
                for b in (self._reduce, self._start, self._done):
                    b.abort()
                return
