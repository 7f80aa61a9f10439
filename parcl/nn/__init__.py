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

from .activation import ELU, LeakyReLU, Sigmoid, SiLU, Softplus, Tanh
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
from .module import (Module, Parameter, StateDictError, capture_key, default_generator,
                     manual_seed)
from .resnet import BasicBlock, ResNet, resnet18
from .gelu import GELU
from .norm import BatchNorm1d, GroupNorm, LayerNorm, RMSNorm
from .sparse import Embedding

from .loss import BCEWithLogitsLoss, CrossEntropyLoss, MSELoss, NLLLoss  # noqa: E402  (losses)

__all__ = ["ELU", "LeakyReLU", "SiLU", "Sigmoid", "Softplus", "Tanh",
           "AdaptiveAvgPool2d", "AvgPool2d", "BasicBlock", "BatchNorm2d", "Conv2d", "Dropout",
           "Flatten", "Linear", "MaxPool2d", "Module", "Parameter", "ReLU", "ResNet",
           "Sequential", "StateDictError", "capture_key", "default_generator", "flatten",
           "manual_seed",
           "resnet18"]
__all__ += ["BCEWithLogitsLoss", "CrossEntropyLoss", "MSELoss", "NLLLoss"]  # losses
__all__ += ["BatchNorm1d", "Embedding", "GELU", "GroupNorm", "LayerNorm", "RMSNorm"]

from .containers import Identity, ModuleList, Softmax  # noqa: E402

__all__ += ["Identity", "ModuleList", "Softmax"]

from .gpt import GPT, CausalSelfAttention  # noqa: E402  (transformers)

__all__ += ["CausalSelfAttention", "GPT"]
