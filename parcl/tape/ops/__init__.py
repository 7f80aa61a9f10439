"""Differentiable ops, one module per family; each op's backward sits beside its forward.

Every op accepts ``Node`` or raw ``Tensor`` inputs (and Python scalars for the binary ops) and
an optional ``tape=``: with an explicit tape it records there even when no tape is current and
even inside ``no_grad`` (netcl's escape hatch).

| module | ops |
|---|---|
| elementwise | add sub mul div pow maximum minimum |
| unary, activation | neg exp log sqrt abs relu sigmoid tanh gelu, silu leaky_relu elu ... |
| mathops | reciprocal rsqrt log1p ... atan2 floor round lerp, eq ... ge, isnan isfinite clip |
| mathops_more | remainder fmod hypot exp2 frac addcmul addcdiv clamp_min clamp_max isinf all any |
| mathops_binary | xlogy logaddexp logaddexp2 fmax fmin ldexp copysign floor_divide heaviside ... |
| mathops_special | acosh asinh atanh erfc erfinv lgamma digamma polygamma mvlgamma i0 logit ... |
| activation_more | hardtanh relu6 ... mish selu celu glu softmin threshold normalize ... |
| linalg | matmul (batched, broadcasting) |
| linalg | matmul (batched, broadcasting) mm bmm |
| linalg_solve | det slogdet logdet inverse matrix_power; tp.linalg's solve lu_factor |
| linalg_cholesky | cholesky_solve; tp.linalg's cholesky cholesky_ex solve_triangular |
| linalg_norms | (tp.linalg only) vector_norm matrix_norm norm |
| linalg_decomp | (tp.linalg only) eigh eigvalsh svd svdvals (Jacobi) |
| linalg_more | cholesky_inverse; tp.linalg's pinv matrix_rank cond inv_ex solve_ex lu_solve ... |
| linalg_funcs | matrix_exp pinverse; tp.linalg's tensorinv tensorsolve |
| integer | gcd lcm bitwise_and bitwise_or bitwise_xor bitwise_not (int32, int64, bool masks) |
| logical | logical_and ... logical_not, isclose allclose equal, nansum nanmean |
| composed | nan_to_num outer addmm baddbmm linalg_vector_norm norm |
| products | dot vdot inner mv addmv addr addbmm kron cross cdist dist |
| numerics | cov corrcoef trapezoid cumulative_trapezoid vander renorm |
| stacking | atleast_1d hstack vstack dstack column_stack tensor_split hsplit block_diag ... |
| shape_more | broadcast_to broadcast_tensors swapaxes moveaxis ravel rot90 fliplr clone numel |
| placing | select *_scatter diag_embed diagflat take masked_select masked_scatter index_copy ... |
| contraction | einsum (built on sum permute reshape mm bmm) |
| diagonals | diagonal diag trace tensordot |
| reduce, reductions | sum mean max min argmax argmin var std logsumexp cumsum |
| reduce_dims | amax amin prod |
| moments | var_mean std_mean |
| scans | cumprod diff repeat_interleave |
| sorting | sort argsort topk |
| order | median nanmedian quantile nanquantile kthvalue mode msort aminmax |
| cumulative | cummax cummin logcumsumexp |
| counting | searchsorted bucketize isin histc bincount unique nonzero count_nonzero ... |
| shape | reshape transpose permute movedim t squeeze unsqueeze flatten unflatten |
| indexing, join | getitem flip pad expand gather cat stack split |
| slices | narrow chunk unbind roll repeat tile tril triu |
| select, picks | where masked_fill embedding, index_select one_hot |
| scatters | scatter scatter_add index_add take_along_dim |
| norm, lrn | layer_norm rms_norm group_norm, local_response_norm |
| nn, conv | conv2d conv_transpose2d pools batch_norm dropout |
| conv3d | conv3d conv_transpose3d (vol2col + GEMM, gather col2vol) |
| pool3d | max_pool3d avg_pool3d adaptive_avg_pool3d adaptive_max_pool3d lp_pool3d max_unpool3d |
| dropouts | dropout1d dropout2d dropout3d alpha_dropout feature_alpha_dropout |
| instance | instance_norm |
| distances | pdist triplet_margin_with_distance_loss |
| bags | embedding_bag (sum, mean, max over bags of indices) |
| randomized | rrelu gumbel_softmax fractional_max_pool2d (draws from the dropout generator) |
| grids | affine_grid grid_sample (2-D spatial transformers) |
| aliases | upsample upsample_nearest upsample_bilinear, max_pool*_with_indices |
| fold | unfold fold (im2col, col2im) |
| unpool | max_unpool1d max_unpool2d |
| adaptive | adaptive_avg_pool1d adaptive_max_pool1d adaptive_max_pool2d |
| lp_pool | lp_pool1d lp_pool2d (power-average pools) |
| resample | interpolate pixel_shuffle pixel_unshuffle channel_shuffle |
| sequence | conv1d max_pool1d avg_pool1d (the 2-D ops on (N, C, 1, L) views) |
| attention, attention_batch | scaled_dot_product_attention (broadcast batches, enable_gqa) |
| loss | softmax log_softmax cross_entropy nll_loss mse_loss |
| soft_loss | binary_cross_entropy_with_logits, cross_entropy with probabilities |
| loss_more | l1_loss smooth_l1_loss huber_loss kl_div binary_cross_entropy ... (reduction=) |
| loss_margin | margin_ranking_loss hinge_embedding_loss triplet_margin_loss multi_margin_loss ... |
| loss_nll | poisson_nll_loss gaussian_nll_loss ctc_loss |
| creation | zeros ones full empty (_like) arange linspace logspace eye tril_indices meshgrid ... |
| sampling | rand randn randint randperm (and _like) normal bernoulli multinomial |
"""

from importlib import import_module

from .activation import *  # noqa: F401,F403
from .activation_more import *  # noqa: F401,F403
from .adaptive import *  # noqa: F401,F403
from .aliases import *  # noqa: F401,F403
from .attention import *  # noqa: F401,F403
from .bags import *  # noqa: F401,F403
from .contraction import *  # noqa: F401,F403
from .conv import *  # noqa: F401,F403
from .conv3d import *  # noqa: F401,F403
from .counting import *  # noqa: F401,F403
from .creation import *  # noqa: F401,F403
from .cumulative import *  # noqa: F401,F403
from .diagonals import *  # noqa: F401,F403
from .distances import *  # noqa: F401,F403
from .dropouts import *  # noqa: F401,F403
from .elementwise import *  # noqa: F401,F403
from .fold import *  # noqa: F401,F403
from .grids import *  # noqa: F401,F403
from .indexing import *  # noqa: F401,F403
from .instance import *  # noqa: F401,F403
from .integer import *  # noqa: F401,F403
from .join import *  # noqa: F401,F403
from .linalg import *  # noqa: F401,F403
from .linalg_cholesky import *  # noqa: F401,F403
from .linalg_decomp import *  # noqa: F401,F403
from .linalg_funcs import *  # noqa: F401,F403
from .linalg_more import *  # noqa: F401,F403
from .linalg_norms import *  # noqa: F401,F403
from .linalg_solve import *  # noqa: F401,F403
from .logical import *  # noqa: F401,F403
from .loss import *  # noqa: F401,F403
from .loss_margin import *  # noqa: F401,F403
from .loss_more import *  # noqa: F401,F403
from .loss_nll import *  # noqa: F401,F403
from .lp_pool import *  # noqa: F401,F403
from .lrn import *  # noqa: F401,F403
from .mathops import *  # noqa: F401,F403
from .mathops_binary import *  # noqa: F401,F403
from .mathops_more import *  # noqa: F401,F403
from .mathops_special import *  # noqa: F401,F403
from .moments import *  # noqa: F401,F403
from .nn import *  # noqa: F401,F403
from .norm import *  # noqa: F401,F403
from .numerics import *  # noqa: F401,F403
from .order import *  # noqa: F401,F403
from .picks import *  # noqa: F401,F403
from .placing import *  # noqa: F401,F403
from .pool3d import *  # noqa: F401,F403
from .products import *  # noqa: F401,F403
from .randomized import *  # noqa: F401,F403
from .reduce import *  # noqa: F401,F403
from .reduce_dims import *  # noqa: F401,F403
from .reductions import *  # noqa: F401,F403
from .resample import *  # noqa: F401,F403
from .sampling import *  # noqa: F401,F403
from .scans import *  # noqa: F401,F403
from .scatters import *  # noqa: F401,F403
from .select import *  # noqa: F401,F403
from .sequence import *  # noqa: F401,F403
from .shape import *  # noqa: F401,F403
from .shape_more import *  # noqa: F401,F403
from .slices import *  # noqa: F401,F403
from .sorting import *  # noqa: F401,F403
from .stacking import *  # noqa: F401,F403
from .unary import *  # noqa: F401,F403
from .unpool import *  # noqa: F401,F403
from .composed import *  # noqa: F401,F403  (last: its norm replaces the module's name)

# by name: composed's ``norm`` (the op) takes the name of the ``norm`` module (layer_norm ...)
# in this namespace, so composed is imported after it
_MODULES = ("activation", "activation_more", "adaptive", "aliases", "attention", "bags",
            "composed", "contraction", "conv", "conv3d", "counting", "creation", "cumulative",
            "diagonals", "distances", "dropouts", "elementwise", "fold", "grids", "indexing",
            "instance", "integer", "join", "linalg", "linalg_cholesky", "linalg_decomp",
            "linalg_funcs", "linalg_more", "linalg_norms", "linalg_solve", "logical", "loss",
            "loss_margin", "loss_more", "loss_nll", "lp_pool", "lrn", "mathops", "mathops_binary",
            "mathops_more", "mathops_special", "moments", "nn", "norm", "numerics", "order",
            "picks", "placing", "pool3d", "products", "randomized", "reduce", "reduce_dims",
            "reductions", "resample", "sampling", "scans", "scatters", "select", "sequence",
            "shape", "shape_more", "slices", "sorting", "stacking", "unary", "unpool")
__all__ = [name for module in _MODULES
           for name in import_module(f".{module}", __name__).__all__]
