"""The benchmark models, their default batches and random data.

* ``mlp``: 784-512-512-10 with ReLU, batch 256 (inputs 784 floats).
* ``cnn``: conv(1->32, 3) - relu - maxpool 2 - conv(32->64, 3) - relu - maxpool 2 - flatten -
  linear(64*5*5 -> 10), batch 64 of 1x28x28.
* ``digits``: the CNN of ``examples/train_digits.py``: conv(1->16, 3, pad 1) - relu -
  conv(16->32, 3, pad 1) - relu - maxpool 2 - flatten - linear(32*4*4 -> 10), batch 64 of
  1x8x8.
* ``mobilenet``: MobileNet-style depthwise-separable blocks: conv(3->32, 3, pad 1) - BN - relu
  - [depthwise 3x3 (32) - BN - relu - pointwise 1x1 (32->64) - BN - relu] - [depthwise 3x3
  stride 2 (64) - BN - relu - pointwise (64->128) - BN - relu] - global average pool - flatten
  - linear(128 -> 10), batch 32 of 3x32x32.
* ``resnet18``: torchvision's ResNet-18 (10 classes), batch 16 of 3x``image_size``^2 (224 by
  default in ``memory``, smaller where the benchmark says so).
* ``gpt``: nanoGPT's model (``pc.nn.GPT``) at the char-level config of
  ``examples/train_gpt.py``: 4 layers, width 128, 4 heads, T = 64, vocabulary 98, batch 16
  windows of token ids; the loss is ``GPT.loss`` (cross entropy over every position), the
  optimizer AdamW(lr=1e-3). ``CheckpointedGPT`` is the same model with each transformer block
  run through ``tp.checkpoint`` (``parcl-bench memory --checkpoint``).

Labels are int64 class indices; the loss is cross entropy; the optimizer SGD(lr=0.01) (AdamW
for ``gpt``: ``loss_of`` and ``optimizer`` give each model's).
"""

from __future__ import annotations

import numpy as np

import parcl as pc
import parcl.tape as tp

MODELS = ("mlp", "cnn", "digits", "mobilenet", "resnet18")
DEFAULT_BATCH = {"mlp": 256, "cnn": 64, "digits": 64, "mobilenet": 32, "resnet18": 16}
LR = 0.01

# the transformer workload (pc.nn.GPT)
GPT = {"vocab_size": 98, "block_size": 64, "n_layer": 4, "n_head": 4, "n_embd": 128}
GPT_LR = 1e-3
MODELS += ("gpt",)
DEFAULT_BATCH["gpt"] = 16


class CheckpointedGPT(pc.nn.GPT):
    """``pc.nn.GPT`` whose transformer blocks each run through ``tp.checkpoint`` while
    ``checkpoint`` is True (a block's activations freed after its forward, computed again in
    the backward); False runs ``GPT.forward`` itself. The same parameters, names and
    initialisation as ``pc.nn.GPT``, so one model times both."""

    checkpoint = True

    def forward(self, idx):
        if not self.checkpoint:
            return super().forward(idx)
        idx = self._indices(idx)                 # GPT.forward, the blocks checkpointed
        tok = self.transformer.wte(idx)
        pos = self.transformer.wpe.weight[:idx.shape[1]]
        x = self.transformer.drop(tp.add(tok, pos))
        for block in self.transformer.h:
            x = tp.checkpoint(block, x)
        return self.lm_head(self.transformer.ln_f(x))


def input_shape(model: str, image_size: int = 224) -> tuple[int, ...]:
    if model == "mlp":
        return (784,)
    if model == "cnn":
        return (1, 28, 28)
    if model == "digits":
        return (1, 8, 8)
    if model == "mobilenet":
        return (3, 32, 32)
    if model == "gpt":
        return (GPT["block_size"],)
    return (3, image_size, image_size)


def builder(model: str):
    """``build(queue) -> pc.nn.Module`` for ``model``, seeded so every call builds the same
    weights."""
    nn = pc.nn

    def build(queue):
        nn.manual_seed(0)
        if model == "mlp":
            return nn.Sequential(nn.Linear(784, 512, queue=queue), nn.ReLU(),
                                 nn.Linear(512, 512, queue=queue), nn.ReLU(),
                                 nn.Linear(512, 10, queue=queue))
        if model == "cnn":
            return nn.Sequential(nn.Conv2d(1, 32, 3, queue=queue), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(32, 64, 3, queue=queue), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Flatten(), nn.Linear(64 * 5 * 5, 10, queue=queue))
        if model == "digits":
            return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1, queue=queue), nn.ReLU(),
                                 nn.Conv2d(16, 32, 3, padding=1, queue=queue), nn.ReLU(),
                                 nn.MaxPool2d(2), nn.Flatten(),
                                 nn.Linear(32 * 4 * 4, 10, queue=queue))
        if model == "mobilenet":
            return nn.Sequential(*_mobilenet_layers(nn, queue))
        if model == "resnet18":
            return nn.resnet18(num_classes=10, in_channels=3, queue=queue)
        if model == "gpt":
            return nn.GPT(**GPT, queue=queue)
        raise ValueError(f"unknown model {model!r}; choose from {MODELS}")
    return build


def _mobilenet_layers(nn, queue=None) -> list:
    """The ``mobilenet`` model's layers, from ``nn`` = ``parcl.nn`` or ``torch.nn`` (the same
    order, so the same state_dict keys)."""
    kw = {} if queue is None else {"queue": queue}

    def separable(cin, cout, stride):
        return [nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False, **kw),
                nn.BatchNorm2d(cin, **kw), nn.ReLU(),
                nn.Conv2d(cin, cout, 1, bias=False, **kw), nn.BatchNorm2d(cout, **kw), nn.ReLU()]

    return [nn.Conv2d(3, 32, 3, padding=1, bias=False, **kw), nn.BatchNorm2d(32, **kw),
            nn.ReLU(), *separable(32, 64, 1), *separable(64, 128, 2),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10, **kw)]


def batch(model: str, n: int, image_size: int = 224, seed: int = 0):
    """Random ``(x float32, y int64)`` of ``n`` samples for ``model``."""
    rng = np.random.default_rng(seed)
    if model == "gpt":                   # token ids and their next-token targets
        ids = rng.integers(0, GPT["vocab_size"], (n, GPT["block_size"] + 1))
        return ids[:, :-1].copy(), ids[:, 1:].copy()
    x = rng.standard_normal((n, *input_shape(model, image_size)), dtype=np.float32)
    y = rng.integers(0, 10, n).astype(np.int64)
    return x, y


def loss_of(model):
    """The benchmark loss of a built model: ``GPT.loss`` for a GPT, else cross entropy."""
    return pc.nn.GPT.loss if isinstance(model, pc.nn.GPT) else tp.cross_entropy


def optimizer(model: str, params):
    """The benchmark optimizer of ``model``: AdamW(lr=1e-3) for ``gpt``, else SGD(lr=0.01)."""
    if model == "gpt":
        return pc.optim.AdamW(params, lr=GPT_LR)
    return pc.optim.SGD(params, lr=LR)


def torch_loss(model: str):
    """PyTorch's loss for ``model``: nanoGPT's (every position) for ``gpt``, else cross entropy."""
    if model == "gpt":
        from .torch_gpt import loss
        return loss
    import torch
    return torch.nn.functional.cross_entropy


def torch_optimizer(torch, model: str, params):
    """PyTorch's twin of ``optimizer``."""
    if model == "gpt":
        return torch.optim.AdamW(params, lr=GPT_LR)
    return torch.optim.SGD(params, lr=LR)


def torch_model(model: str, state: dict):
    """The same model in PyTorch with parcl's initial weights ``state`` (a state_dict)."""
    import torch
    from torch import nn

    if model == "mlp":
        m = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10))
    elif model == "gpt":
        from .torch_gpt import TorchGPT
        m = TorchGPT(**GPT)
    elif model == "cnn":
        m = nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3),
                          nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 5 * 5, 10))
    elif model == "mobilenet":
        m = nn.Sequential(*_mobilenet_layers(nn))
    else:
        raise ValueError(f"no PyTorch twin for {model!r}")
    m.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
    return m
