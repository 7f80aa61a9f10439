"""``pc.nn.utils``, as ``torch.nn.utils``: gradient clipping (``parcl.nn.clip``), parameters to
and from one vector (``parcl.nn.param_vector``), ``rnn``: padding and packing sequences of
different lengths for the recurrent layers, folding BatchNorms into layers (``fusion``),
``skip_init``, and parametrized weights (``parametrize``, ``parametrizations``: weight_norm,
spectral_norm; the older ``weight_norm``, ``spectral_norm`` and their ``remove_*``) and
``prune``."""

from ..clip import (ClipError, clip_grad_norm_, clip_grad_value_, clip_grads_with_norm_,
                    get_total_norm)
from ..param_vector import parameters_to_vector, vector_to_parameters
from . import parametrizations, parametrize, prune, rnn
from .fusion import (FusionError, fuse_conv_bn_eval, fuse_conv_bn_weights, fuse_linear_bn_eval,
                     fuse_linear_bn_weights)
from .init import skip_init
from .legacy_norm import remove_spectral_norm, remove_weight_norm, spectral_norm, weight_norm

__all__ = ["ClipError", "clip_grad_norm_", "clip_grad_value_", "clip_grads_with_norm_",
           "get_total_norm", "parameters_to_vector", "rnn", "vector_to_parameters",
           "FusionError", "fuse_conv_bn_eval", "fuse_conv_bn_weights", "fuse_linear_bn_eval",
           "fuse_linear_bn_weights", "parametrizations", "parametrize", "prune",
           "remove_spectral_norm", "remove_weight_norm", "skip_init", "spectral_norm",
           "weight_norm"]
