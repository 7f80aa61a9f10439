"""ResNet-18 with torchvision's architecture and parameter names.

``resnet18().state_dict()`` has torchvision's keys (``conv1.weight``, ``bn1.running_mean``,
``layer1.0.conv1.weight``, ``layer2.0.downsample.0.weight``, ``fc.bias``, ...) minus
``num_batches_tracked``, so torchvision weights load by name (their ``num_batches_tracked``
entries are accepted and ignored). Initialisation follows torchvision: convolutions
kaiming-normal (``fan_out``, ReLU gain), BatchNorm weight 1 and bias 0, ``fc`` PyTorch's
Linear default; all drawn from the thread's seeded generator.

>>> import parcl as pc
>>> model = pc.nn.resnet18(num_classes=10)
>>> "layer2.0.downsample.0.weight" in model.state_dict()
True
"""

from __future__ import annotations

import math

from ..runtime import default_queue
from ..tensor import Tensor
from .layers import (
    AdaptiveAvgPool2d,
    BatchNorm2d,
    Conv2d,
    Linear,
    MaxPool2d,
    ReLU,
    Sequential,
    flatten,
)
from .module import Module, normal_
from .module_hooks import holds_hooks

__all__ = ["BasicBlock", "ResNet", "resnet18"]


class BasicBlock(Module):
    """conv3x3-bn-relu-conv3x3-bn plus the shortcut (a 1x1 conv + bn ``downsample`` when the
    stride or the channel count changes), then relu."""

    expansion = 1

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1, *, queue=None):
        super().__init__()
        q = queue if queue is not None else default_queue()
        self.conv1 = Conv2d(in_channels, out_channels, 3, stride, 1, bias=False, queue=q)
        self.bn1 = BatchNorm2d(out_channels, queue=q)
        self.relu = ReLU(inplace=True)
        self.conv2 = Conv2d(out_channels, out_channels, 3, 1, 1, bias=False, queue=q)
        self.bn2 = BatchNorm2d(out_channels, queue=q)
        if stride != 1 or in_channels != out_channels:
            self.downsample = Sequential(
                Conv2d(in_channels, out_channels, 1, stride, 0, bias=False, queue=q),
                BatchNorm2d(out_channels, queue=q))
        else:
            self.downsample = None
        self.stride = stride

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        identity = x if self.downsample is None else self.downsample(x)
        if self._hooks_see_the_tail():
            return self.relu(self.bn2(self.conv2(out)) + identity)
        # relu(bn2(conv2(out)) + identity) as one fused op: bn2's output is never kept, and a
        # downsample's output (read by nothing else) is overwritten by the result
        return self.bn2(self.conv2(out), residual=identity, relu=True,
                        overwrite_residual=self.downsample is not None)

    def _hooks_see_the_tail(self) -> bool:
        """Whether a hook would see what the fused tail skips: bn2's own output, the second
        call of relu, or a downsample output it could keep (the fused op overwrites it)."""
        tail = [self.bn2, self.relu]
        if self.downsample is not None:
            tail += self.downsample.modules()
        return any(holds_hooks(m) for m in tail)


class ResNet(Module):
    """torchvision's ResNet for ``BasicBlock``: conv7x7/2, bn, relu, maxpool 3/2, four stages
    of blocks (64, 128, 256, 512 channels), global average pool, flatten, fc."""

    def __init__(self, layers=(2, 2, 2, 2), num_classes: int = 1000, in_channels: int = 3, *,
                 queue=None):
        super().__init__()
        q = queue if queue is not None else default_queue()
        self.conv1 = Conv2d(in_channels, 64, 7, 2, 3, bias=False, queue=q)
        self.bn1 = BatchNorm2d(64, queue=q)
        self.relu = ReLU(inplace=True)
        self.maxpool = MaxPool2d(3, 2, 1)
        channels, width = 64, 64
        for i, blocks in enumerate(layers):
            stride = 1 if i == 0 else 2
            stage = []
            for b in range(blocks):
                stage.append(BasicBlock(channels, width, stride if b == 0 else 1, queue=q))
                channels = width
            self.add_module(f"layer{i + 1}", Sequential(*stage))
            width *= 2
        self.avgpool = AdaptiveAvgPool2d(1)
        self.fc = Linear(channels, num_classes, queue=q)
        # torchvision re-initialises every conv after construction: kaiming_normal_ with
        # mode="fan_out" and the ReLU gain (BatchNorm is already 1/0).
        for m in self.modules():
            if isinstance(m, Conv2d):
                shape = m.weight.shape
                fan_out = shape[0] * shape[2] * shape[3]
                m.weight.value = Tensor.from_host(q, normal_(shape, math.sqrt(2.0 / fan_out)))

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(flatten(self.avgpool(x), 1))


def resnet18(num_classes: int = 10, in_channels: int = 3, *, queue=None) -> ResNet:
    """ResNet-18 (torchvision's architecture and names), ``num_classes`` outputs.

    >>> model = pc.nn.resnet18(num_classes=10, in_channels=3)
    >>> len(model.parameters())
    62
    """
    return ResNet((2, 2, 2, 2), num_classes=num_classes, in_channels=in_channels, queue=queue)
