"""``pc.nn.utils``, as ``torch.nn.utils``: gradient clipping (``parcl.nn.clip``), parameters to
and from one vector (``parcl.nn.param_vector``), and ``rnn``: padding and packing sequences of
different lengths for the recurrent layers."""

from ..clip import (ClipError, clip_grad_norm_, clip_grad_value_, clip_grads_with_norm_,
                    get_total_norm)
from ..param_vector import parameters_to_vector, vector_to_parameters
from . import rnn

__all__ = ["ClipError", "clip_grad_norm_", "clip_grad_value_", "clip_grads_with_norm_",
           "get_total_norm", "parameters_to_vector", "rnn", "vector_to_parameters"]
