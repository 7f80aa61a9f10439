"""Layers and models (``pc.nn``): Modules over the differentiable ops of ``parcl.tape``.

Initial parameters come from a thread-local numpy generator seeded with 0 (reseed with
``pc.nn.manual_seed(seed)``), drawn on the host in construction order and uploaded, so the
same program builds bit-identical models in every run and every replica thread.

>>> import parcl as pc
>>> pc.nn.manual_seed(0)
>>> model = pc.nn.Sequential(pc.nn.Linear(64, 32), pc.nn.ReLU(), pc.nn.Linear(32, 10))
>>> [name for name, _ in model.named_parameters()]
['0.weight', '0.bias', '2.weight', '2.bias']
"""

from .layers import (
                     AdaptiveAvgPool2d,
                     AvgPool2d,
                     BatchNorm2d,
                     Conv2d,
                     Dropout,
                     Flatten,
                     Linear,
                     MaxPool2d,
                     ReLU,
                     Sequential,
                     flatten,
)
from .module import Module, Parameter, StateDictError, default_generator, manual_seed
from .resnet import BasicBlock, ResNet, resnet18

from . import utils  # noqa: E402  (pc.nn.utils.clip_grad_norm_)

__all__ = ["AdaptiveAvgPool2d", "AvgPool2d", "BasicBlock", "BatchNorm2d", "Conv2d", "Dropout",
           "Flatten", "Linear", "MaxPool2d", "Module", "Parameter", "ReLU", "ResNet",
           "Sequential", "StateDictError", "default_generator", "flatten", "manual_seed",
           "resnet18", "utils"]
