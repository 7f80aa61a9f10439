"""What the scheduler tests stand in for an optimizer and a model (the schedulers only read
and write ``optimizer.param_groups``), and a torch optimizer of the same groups."""

from __future__ import annotations

import numpy as np


class FakeOptimizer:
    """What a scheduler uses of an optimizer: param_groups with an 'lr'."""

    def __init__(self, *lrs):
        self.param_groups = [{"lr": lr, "params": [i]} for i, lr in enumerate(lrs)]


class CheckpointedOptimizer(FakeOptimizer):
    """A FakeOptimizer with a state dict, for checkpoints."""

    def state_dict(self):
        return {"state": {}, "param_groups": [dict(g) for g in self.param_groups]}

    def load_state_dict(self, d):
        self.param_groups = [dict(g) for g in d["param_groups"]]


class FakeModel:
    """A model of one array, for checkpoints."""

    def __init__(self, value=0.0):
        self.w = np.full(3, value, np.float32)

    def state_dict(self):
        return {"w": self.w.copy()}

    def load_state_dict(self, d):
        self.w = d["w"].copy()


def torch_optimizer(*lrs, cls=None, **kw):
    """A torch optimizer (SGD unless ``cls``) with one group per learning rate."""
    import torch
    cls = cls or torch.optim.SGD
    return cls([{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": lr} for lr in lrs],
               lr=lrs[0], **kw)
