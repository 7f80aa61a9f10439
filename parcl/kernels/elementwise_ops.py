"""The elementwise family's op tables: each op one C expression, from which
``elementwise`` builds its kernels (a ``_contig``/``_strided``/``_grid``/``_scalar`` kernel per
binary op, a ``_unary`` kernel per unary op, a ``_grad`` kernel per backward helper).

Adding an op is adding a line here; the launchers in ``elementwise`` do not change.
"""

from __future__ import annotations

# name -> C expression of (x, y); x is the left input, y the right one (or the scalar).
BINARY_OPS = {
    "add": "x + y",
    "sub": "x - y",
    "mul": "x * y",
    "div": "x / y",
    "rsub": "y - x",
    "rdiv": "y / x",
    # selects rather than fmax/fmin: they vectorize on CPUs, and NaN propagates as in numpy
    "maximum": "(x < y || isnan(y)) ? y : x",
    "minimum": "(x > y || isnan(y)) ? y : x",
    "pow": "pow(x, y)",
    "rpow": "pow(y, x)",
    "ge": "(x >= y) ? 1.0f : 0.0f",          # float masks for max/min backward
    "gt": "(x > y) ? 1.0f : 0.0f",
    "le": "(x <= y) ? 1.0f : 0.0f",
    "lt": "(x < y) ? 1.0f : 0.0f",
    # backward helpers: x is the saved forward input or output, y the upstream gradient
    "relu_backward": "(x > 0.0f) ? y : 0.0f",
    "sigmoid_backward": "y * x * (1.0f - x)",
    "tanh_backward": "y * (1.0f - x * x)",
    # GPT-2's tanh approximation (PyTorch's approximate="tanh"): u = k * (x + c * x^3)
    "gelu_tanh_backward": "y * gelu_tanh_grad(x)",
    "sqrt_backward": "y * 0.5f / x",
    # pow's partial derivatives (x the base, y the exponent), zero where PyTorch's are: d/dx is
    # 0 where y == 0 (not 0 * x**-1, NaN at x = 0), d/dy is 0 where x == 0 and y >= 0
    "pow_grad_base": "(y == 0.0f) ? 0.0f : y * pow(x, y - 1.0f)",
    "pow_grad_exponent": "(x == 0.0f && y >= 0.0f) ? 0.0f : pow(x, y) * log(x)",
    "rpow_grad_exponent": "(y == 0.0f && x >= 0.0f) ? 0.0f : pow(y, x) * log(y)",
}

# name -> C expression of x and the float parameters p, q (unused by most ops)
UNARY_OPS = {
    "neg": "-x",
    "exp": "exp(x)",
    "log": "log(x)",
    "relu": "(x < 0.0f) ? 0.0f : x",          # NaN stays NaN (anomaly mode sees it)
    "sigmoid": "1.0f / (1.0f + exp(-x))",
    "tanh": "tanh(x)",
    "gelu": "x * normal_cdf(x)",
    "normal_pdf": "exp_poly(-0.5f * x * x) * 0.3989422804014327f",
    "normal_cdf": "normal_cdf(x)",
    "gelu_tanh": "0.5f * x * (1.0f + GELU_T(x))",
    "sqrt": "sqrt(x)",
    "abs": "(x < 0.0f) ? -x : x",
    "square": "x * x",
    "reciprocal": "1.0f / x",
    "sign": "(x > 0.0f) ? 1.0f : ((x < 0.0f) ? -1.0f : 0.0f)",
    "silu": "x / (1.0f + exp(-x))",
    "erf": "erf(x)",
    "sin": "sin(x)",
    "cos": "cos(x)",
    "leaky_relu": "(x > 0.0f) ? x : x * p",                    # p: negative_slope
    "elu": "(x > 0.0f) ? x : p * expm1(x)",                     # p: alpha
    # PyTorch's threshold rule (p: beta, q: threshold): linear above it, so no overflow
    "softplus": "(x * p > q) ? x : log1p(exp(x * p)) / p",
    # p: min, q: max (+-INFINITY when not given); selects keep NaN, min > max gives max
    "clamp": "(((x < p) ? p : x) > q) ? q : ((x < p) ? p : x)",
}

_SIGMOID = "(1.0f / (1.0f + exp(-x)))"
# Backward helpers of same-shape (saved, upstream) pairs: name -> C expression of x (the saved
# forward input), y (the upstream gradient) and the forward's parameters p, q. PyTorch's
# formulas, with its choice at the kinks (leaky_relu: slope at 0; elu: alpha at 0; clamp:
# gradient 1 where min <= x <= max, ties included).
GRAD_OPS = {
    "silu_backward": f"y * {_SIGMOID} * (1.0f + x * (1.0f - {_SIGMOID}))",
    "erf_backward": "y * 1.1283791670955126f * exp(-x * x)",          # 2/sqrt(pi)
    "sin_backward": "y * cos(x)",
    "cos_backward": "-y * sin(x)",
    "leaky_relu_backward": "(x > 0.0f) ? y : y * p",
    "elu_backward": "(x > 0.0f) ? y : y * p * exp(x)",
    # the logistic form of PyTorch's z / (z + 1), z = exp(beta x): finite for any threshold
    "softplus_backward": "(x * p > q) ? y : y / (1.0f + exp(-x * p))",
    "clamp_backward": "(x >= p && x <= q) ? y : 0.0f",
}

# what binary(op, scalar, t) means as a tensor-scalar op with the tensor on the left
REVERSED = {"add": "add", "mul": "mul", "sub": "rsub", "div": "rdiv", "rsub": "sub",
            "rdiv": "div", "maximum": "maximum", "minimum": "minimum", "pow": "rpow",
            "rpow": "pow", "ge": "le", "le": "ge", "gt": "lt", "lt": "gt",
            "pow_grad_exponent": "rpow_grad_exponent", "rpow_grad_exponent": "pow_grad_exponent"}
