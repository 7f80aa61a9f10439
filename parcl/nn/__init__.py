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

from .activation import (CELU, ELU, GLU, SELU, CosineSimilarity, Hardshrink, Hardsigmoid,
                         Hardswish, Hardtanh, LeakyReLU, LogSigmoid, LogSoftmax, Mish,
                         PairwiseDistance, PReLU, ReLU6, Sigmoid, SiLU, Softmax2d, Softmin,
                         Softplus, Softshrink, Softsign, Tanh, Tanhshrink, Threshold)
from .adaptive_softmax import AdaptiveLogSoftmaxWithLoss
from .bags import EmbeddingBag
from .bilinear import Bilinear
from .cells import GRUCell, LSTMCell, RNNCell
from .clone import clone_module
from .containers import (Identity, ModuleDict, ModuleList, ParameterDict, ParameterList,
                         Softmax)
from .conv import AvgPool1d, Conv1d, ConvTranspose1d, ConvTranspose2d, MaxPool1d
from .conv3d import Conv3d, ConvTranspose3d
from .deprecated import NLLLoss2d
from .dropout import AlphaDropout, Dropout1d, Dropout2d, Dropout3d, FeatureAlphaDropout
from .fold import Fold, Unfold
from .fractional import FractionalMaxPool2d
from .gelu import GELU
from .gpt import GPT, CausalSelfAttention
from .keys import capture_key
from .layers import (AdaptiveAvgPool2d, AvgPool2d, BatchNorm2d, Conv2d, Dropout, Flatten, Linear,
                     MaxPool2d, ReLU, Sequential, flatten)
from .lazy import (LazyBatchNorm1d, LazyBatchNorm2d, LazyBatchNorm3d, LazyConv1d, LazyConv2d,
                   LazyConvTranspose1d, LazyConvTranspose2d, LazyInstanceNorm1d,
                   LazyInstanceNorm2d, LazyInstanceNorm3d, LazyLinear, LazyModuleMixin)
from .loss import (BCELoss, BCEWithLogitsLoss, CosineEmbeddingLoss, CrossEntropyLoss, HuberLoss,
                   KLDivLoss, L1Loss, MSELoss, NLLLoss, SmoothL1Loss, SoftMarginLoss)
from .loss_distance import TripletMarginWithDistanceLoss
from .loss_more import (CTCLoss, GaussianNLLLoss, HingeEmbeddingLoss, MarginRankingLoss,
                        MultiLabelMarginLoss, MultiLabelSoftMarginLoss, MultiMarginLoss,
                        PoissonNLLLoss, TripletMarginLoss)
from .module import (Module, NameInUseError, Parameter, StateDictError, default_generator,
                     manual_seed)
from .multihead import MultiheadAttention
from .norm import (BatchNorm1d, GroupNorm, InstanceNorm1d, InstanceNorm2d, LayerNorm,
                   LocalResponseNorm, RMSNorm)
from .padding import (CircularPad1d, CircularPad2d, CircularPad3d, ConstantPad1d,
                      ConstantPad2d, ConstantPad3d, ReflectionPad1d, ReflectionPad2d,
                      ReflectionPad3d, ReplicationPad1d, ReplicationPad2d, ReplicationPad3d,
                      ZeroPad1d, ZeroPad2d, ZeroPad3d)
from .pooling import (AdaptiveAvgPool1d, AdaptiveMaxPool1d, AdaptiveMaxPool2d, LPPool1d,
                      LPPool2d, MaxUnpool1d, MaxUnpool2d)
from .norm3d import BatchNorm3d, InstanceNorm3d
from .pool3d import (AdaptiveAvgPool3d, AdaptiveMaxPool3d, AvgPool3d, LPPool3d, MaxPool3d,
                     MaxUnpool3d)
from .recurrent import GRU, LSTM, RNN
from .rrelu import RReLU
from .resample import (PixelShuffle, PixelUnshuffle, Upsample, UpsamplingBilinear2d,
                       UpsamplingNearest2d)
from .resnet import BasicBlock, ResNet, resnet18
from .shape import ChannelShuffle, Unflatten
from .sparse import Embedding
from .syncbn import SyncBatchNorm
from .transformer import (Transformer, TransformerDecoder, TransformerDecoderLayer,
                          TransformerEncoder, TransformerEncoderLayer)

from . import init, utils  # noqa: E402  (pc.nn.utils.clip_grad_norm_: after the layers it uses)

__all__ = [
    # containers and the base class
    "Identity", "Module", "ModuleDict", "ModuleList", "Parameter", "ParameterDict",
    "NameInUseError", "ParameterList", "Sequential", "StateDictError",
    # layers
    "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d",
    "AvgPool1d", "AvgPool2d", "BatchNorm1d", "BatchNorm2d", "ChannelShuffle", "Conv1d", "Conv2d",
    "ConvTranspose1d", "ConvTranspose2d", "LPPool1d", "LPPool2d", "MaxPool1d",
    "MaxUnpool1d", "MaxUnpool2d",
    "AlphaDropout", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "Embedding",
    "FeatureAlphaDropout", "Flatten", "Fold", "GroupNorm", "InstanceNorm1d", "InstanceNorm2d",
    "LayerNorm", "Linear", "LocalResponseNorm", "MaxPool2d", "RMSNorm", "Unflatten",
    "Unfold",
    "EmbeddingBag", "SyncBatchNorm",
    # lazy layers (PyTorch's): the input size from the first call
    "LazyBatchNorm1d", "LazyBatchNorm2d", "LazyBatchNorm3d", "LazyConv1d", "LazyConv2d",
    "LazyConvTranspose1d", "LazyConvTranspose2d", "LazyInstanceNorm1d", "LazyInstanceNorm2d",
    "LazyInstanceNorm3d", "LazyLinear", "LazyModuleMixin",
    "AdaptiveLogSoftmaxWithLoss", "FractionalMaxPool2d", "NLLLoss2d",
    "PixelShuffle", "PixelUnshuffle", "Upsample", "UpsamplingBilinear2d", "UpsamplingNearest2d",
    # padding (PyTorch's)
    "CircularPad1d", "CircularPad2d", "CircularPad3d", "ConstantPad1d", "ConstantPad2d",
    "ConstantPad3d", "ReflectionPad1d", "ReflectionPad2d", "ReflectionPad3d", "ReplicationPad1d",
    "ReplicationPad2d", "ReplicationPad3d", "ZeroPad1d", "ZeroPad2d", "ZeroPad3d",
    "Bilinear",
    # the 3-D family (volumes, videos)
    "Conv3d", "ConvTranspose3d",
    "AdaptiveAvgPool3d", "AdaptiveMaxPool3d", "AvgPool3d", "LPPool3d", "MaxPool3d", "MaxUnpool3d",
    "BatchNorm3d", "InstanceNorm3d",
    # recurrent layers and cells (PyTorch's)
    "GRU", "GRUCell", "LSTM", "LSTMCell", "RNN", "RNNCell",
    # activations
    "CELU", "CosineSimilarity", "ELU", "GELU", "GLU", "Hardshrink", "Hardsigmoid", "Hardswish",
    "Hardtanh", "LeakyReLU", "LogSigmoid", "LogSoftmax", "Mish", "PReLU", "PairwiseDistance",
    "ReLU", "ReLU6", "SELU", "SiLU", "Sigmoid", "Softmax", "Softmax2d", "Softmin", "Softplus",
    "Softshrink", "Softsign", "Tanh", "Tanhshrink", "Threshold",
    "RReLU",
    # losses
    "BCELoss", "BCEWithLogitsLoss", "CosineEmbeddingLoss", "CrossEntropyLoss", "HuberLoss",
    "KLDivLoss", "L1Loss", "MSELoss", "NLLLoss", "SmoothL1Loss", "SoftMarginLoss",
    "HingeEmbeddingLoss", "MarginRankingLoss", "MultiLabelSoftMarginLoss", "MultiMarginLoss",
    "TripletMarginLoss", "GaussianNLLLoss", "PoissonNLLLoss", "MultiLabelMarginLoss", "CTCLoss",
    "TripletMarginWithDistanceLoss",
    # models
    "BasicBlock", "CausalSelfAttention", "GPT", "ResNet", "resnet18",
    # transformer building blocks (PyTorch's)
    "MultiheadAttention", "Transformer", "TransformerDecoder", "TransformerDecoderLayer",
    "TransformerEncoder", "TransformerEncoderLayer",
    # helpers
    "capture_key", "clone_module", "default_generator", "flatten", "init", "manual_seed", "utils",
]
