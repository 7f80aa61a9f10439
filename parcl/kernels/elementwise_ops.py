"""The elementwise family's op tables: each op one C expression, from which
``elementwise`` builds its kernels (a ``_contig``/``_strided``/``_grid``/``_scalar`` kernel per
binary op, a ``_unary`` kernel per unary op, a ``_grad`` kernel per backward helper).

Adding an op is adding a line here; the launchers in ``elementwise`` do not change.
"""

from __future__ import annotations

# Helpers the expressions call, prepended to the family's source.
HELPERS = r"""
// tanh with +-1 where the true value rounds to +-1 (|x| > 9.1): PoCL's tanh stops one float
// short (0.99999994, even at inf; as in clmath's GELU_T), which made tp.tanh(20) 0.99999994
// and its gradient 1.2e-7 (PyTorch: 1 and 0), and, times x in mish's gradient, 1.19e23 for 1
// at x = 1e30. mish_tanh is tanh(softplus(x)), softplus as max(x, 0) + log1p(exp(-|x|)).
inline float tanh_sat(const float x)
{
    return (x > 9.1f) ? 1.0f : ((x < -9.1f) ? -1.0f : tanh(x));
}
inline float mish_tanh(const float x)
{
    return tanh_sat(fmax(x, 0.0f) + log1p(exp(-fabs(x))));
}
// torch.remainder: fmod moved to the divisor's sign (exact, unlike a - floor(a / b) * b), and
// PyTorch's floor division, whose negation is remainder's gradient for the divisor
inline float remainder_f(const float a, const float b)
{
    const float m = fmod(a, b);
    return (m != 0.0f && ((b < 0.0f) != (m < 0.0f))) ? m + b : m;
}
inline float div_floor(const float a, const float b)
{
    if (b == 0.0f) return a / b;
    const float m = fmod(a, b);
    float d = (a - m) / b;
    if (m != 0.0f && ((b < 0.0f) != (m < 0.0f))) d -= 1.0f;
    if (d == 0.0f) return copysign(0.0f, a / b);
    float f = floor(d);
    return (d - f > 0.5f) ? f + 1.0f : f;
}
"""

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
    # maximum/minimum's partials, PyTorch's: the winning side, half to each at a tie; where
    # either input is NaN (the output is NaN) both sides pass the gradient
    "maximum_grad_a": "(x < y) ? 0.0f : (x == y) ? 0.5f : 1.0f",
    "maximum_grad_b": "(x > y) ? 0.0f : (x == y) ? 0.5f : 1.0f",
    "minimum_grad_a": "(x > y) ? 0.0f : (x == y) ? 0.5f : 1.0f",
    "minimum_grad_b": "(x < y) ? 0.0f : (x == y) ? 0.5f : 1.0f",
    # backward helpers: x is the saved forward input or output, y the upstream gradient
    # x is relu's output: a NaN passes the gradient on, as PyTorch's threshold_backward
    "relu_backward": "(x <= 0.0f) ? 0.0f : y",
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
    # 0/1 masks of the comparisons (tp.eq ... tp.ge); NaN compares unequal to everything
    "eq": "(x == y) ? 1.0f : 0.0f",
    "ne": "(x != y) ? 1.0f : 0.0f",
    "atan2": "atan2(x, y)",
    # atan2's partials: PyTorch's b / (a^2 + b^2), -a / (a^2 + b^2), and 0 at (0, 0) as it has
    "atan2_grad_a": "(x * x + y * y == 0.0f) ? 0.0f : y / (x * x + y * y)",
    "atan2_grad_b": "(x * x + y * y == 0.0f) ? 0.0f : -x / (x * x + y * y)",
    # kl_div's pointwise terms, x the input (log-probabilities), y the target: xlogy(t, t) - t x
    # (0 where t == 0), or exp(t) (t - x) for log targets; the target's gradient is NaN where
    # t == 0, as PyTorch's (its xlogy backward divides t by t there)
    "kl_div": "((y == 0.0f) ? 0.0f : y * log(y)) - y * x",
    "kl_div_grad_input": "-y",
    "kl_div_grad_target": "(y == 0.0f) ? NAN : log(y) + 1.0f - x",
    "kl_div_log": "exp(y) * (y - x)",
    "kl_div_log_grad_input": "-exp(y)",
    "kl_div_log_grad_target": "exp(y) * (y + 1.0f - x)",
    # binary_cross_entropy on probabilities x, PyTorch's: each log clamped at -100 (selects,
    # not fmax: NaN stays NaN); the input gradient's denominator is clamped at 1e-12 as its is
    "bce": "(y - 1.0f) * ((log1p(-x) < -100.0f) ? -100.0f : log1p(-x))"
           " - y * ((log(x) < -100.0f) ? -100.0f : log(x))",
    "bce_grad_input": "(x - y) / fmax((1.0f - x) * x, 1e-12f)",
    "bce_grad_target": "log1p(-x) - log(x)",
    # remainder takes the divisor's sign (Python's %), fmod the dividend's (C's); their
    # gradients for the divisor are -floor(a / b) and -trunc(a / b), as PyTorch's
    "remainder": "remainder_f(x, y)",
    "fmod": "fmod(x, y)",
    "remainder_grad_b": "-div_floor(x, y)",
    "fmod_grad_b": "-trunc(x / y)",
    # hypot's partials are a / hypot and b / hypot: NaN at (0, 0), as PyTorch's
    "hypot": "hypot(x, y)",
    "hypot_grad_a": "x / hypot(x, y)",
    "hypot_grad_b": "y / hypot(x, y)",
}

# name -> C expression of x and the float parameters p, q (unused by most ops)
UNARY_OPS = {
    "neg": "-x",
    "exp": "exp(x)",
    "log": "log(x)",
    "relu": "(x < 0.0f) ? 0.0f : x",          # NaN stays NaN (anomaly mode sees it)
    "sigmoid": "1.0f / (1.0f + exp(-x))",
    "tanh": "tanh_sat(x)",
    "gelu": "x * normal_cdf(x)",
    "normal_pdf": "exp_poly(-0.5f * x * x) * 0.3989422804014327f",
    "normal_cdf": "normal_cdf(x)",
    "gelu_tanh": "0.5f * x * (1.0f + GELU_T(x))",
    "sqrt": "sqrt(x)",
    # fabs, not the select (x < 0 ? -x : x), which kept -0 as -0 where torch.abs gives +0
    "abs": "fabs(x)",
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
    # p: min, q: max (+-INFINITY when not given); selects keep NaN, min > max gives max; a
    # NaN bound makes every element NaN, as torch.clamp (the selects alone ignored it)
    "clamp": "(isnan(p) || isnan(q)) ? NAN"
             " : ((((x < p) ? p : x) > q) ? q : ((x < p) ? p : x))",
    "rsqrt": "rsqrt(x)",
    "log1p": "log1p(x)",
    "expm1": "expm1(x)",
    "log2": "log2(x)",
    "log10": "log10(x)",
    "tan": "tan(x)",
    "sinh": "sinh(x)",
    "cosh": "cosh(x)",
    "asin": "asin(x)",
    "acos": "acos(x)",
    "atan": "atan(x)",
    "floor": "floor(x)",
    "ceil": "ceil(x)",
    "trunc": "trunc(x)",
    "round": "rint(x)",                        # halves to even, as torch.round
    # torch.round(decimals=d): p = 10^|d|, q > 0 for d > 0 (its order of operations)
    "round_decimals": "(q > 0.0f) ? rint(x * p) / p : rint(x / p) * p",
    "isnan": "isnan(x) ? 1.0f : 0.0f",
    "isfinite": "isfinite(x) ? 1.0f : 0.0f",
    "isinf": "isinf(x) ? 1.0f : 0.0f",
    "exp2": "exp2(x)",
    "frac": "x - trunc(x)",                    # NaN at +-inf, as torch.frac
    # the hard activations with selects, so NaN stays NaN (PyTorch's min/max keep it too)
    "hardsigmoid": "(x + 3.0f < 0.0f) ? 0.0f : ((x + 3.0f > 6.0f) ? 1.0f : (x + 3.0f) / 6.0f)",
    "hardswish": "(x + 3.0f < 0.0f) ? 0.0f * x : ((x + 3.0f > 6.0f) ? x"
                 " : x * (x + 3.0f) / 6.0f)",
    # softplus as max(x, 0) + log1p(exp(-|x|)): no overflow for large x
    "mish": "x * mish_tanh(x)",
    "softsign": "x / (1.0f + fabs(x))",
    "logsigmoid": "fmin(x, 0.0f) - log1p(exp(-fabs(x)))",   # PyTorch's stable form
    "selu": "(x > 0.0f) ? 1.0507009873554805f * x : 1.7580993408473766f * expm1(x)",
    "celu": "(x > 0.0f) ? x : p * expm1(x * q)",            # p: alpha, q: 1 / alpha
    "tanhshrink": "x - tanh_sat(x)",
    "threshold": "(x <= p) ? q : x",                       # p: threshold, q: value; NaN stays
    # the pointwise losses of d = input - target, PyTorch's (p: beta, delta > 0)
    "smooth_l1": "(fabs(x) < p) ? 0.5f * x * x / p : fabs(x) - 0.5f * p",
    "huber": "(fabs(x) < p) ? 0.5f * x * x : p * (fabs(x) - 0.5f * p)",
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
    # x <= 0 tested first, as PyTorch's: a NaN input takes the slope 1 (it gave NaN)
    "elu_backward": "(x <= 0.0f) ? y * p * exp(x) : y",
    # the logistic form of PyTorch's z / (z + 1), z = exp(beta x): finite for any threshold
    "softplus_backward": "(x * p > q) ? y : y / (1.0f + exp(-x * p))",
    "clamp_backward": "(x >= p && x <= q) ? y : 0.0f",
    # the math ops: PyTorch's formulas (reciprocal and rsqrt through their results' powers)
    "reciprocal_backward": "-y * (1.0f / x) * (1.0f / x)",
    "rsqrt_backward": "-0.5f * y * rsqrt(x) * rsqrt(x) * rsqrt(x)",
    "square_backward": "y * 2.0f * x",
    "log1p_backward": "y / (x + 1.0f)",
    "expm1_backward": "y * (expm1(x) + 1.0f)",
    "log2_backward": "y / (x * 0.6931471805599453f)",
    "log10_backward": "y / (x * 2.302585092994046f)",
    "tan_backward": "y * (1.0f + tan(x) * tan(x))",
    "sinh_backward": "y * cosh(x)",
    "cosh_backward": "y * sinh(x)",
    "asin_backward": "y * rsqrt(1.0f - x * x)",
    "acos_backward": "-y * rsqrt(1.0f - x * x)",
    "atan_backward": "y / (x * x + 1.0f)",
    "exp2_backward": "y * exp2(x) * 0.6931471805599453f",
    # hardtanh (p: min_val, q: max_val) passes no gradient at its bounds, unlike clamp
    "hardtanh_backward": "(x <= p || x >= q) ? 0.0f : y",
    "hardsigmoid_backward": "(x > -3.0f && x < 3.0f) ? y / 6.0f : 0.0f",
    # PyTorch 2.13's: 0 at -3, 1 at 3 (the outer pieces at both ties)
    "hardswish_backward": "(x <= -3.0f) ? 0.0f : ((x < 3.0f) ? y * (x / 3.0f + 0.5f) : y)",
    "mish_backward": f"y * (mish_tanh(x) + x * {_SIGMOID}"
                     " * (1.0f - mish_tanh(x) * mish_tanh(x)))",
    "softsign_backward": "y / ((1.0f + fabs(x)) * (1.0f + fabs(x)))",
    # 1 - sigmoid(x) from exp(-|x|), which cannot overflow
    "logsigmoid_backward": "(x < 0.0f) ? y * (1.0f - exp(-fabs(x)) / (1.0f + exp(-fabs(x))))"
                           " : y * exp(-fabs(x)) / (1.0f + exp(-fabs(x)))",
    # x <= 0 tested first, as PyTorch's elu_backward: a NaN input takes the linear slope
    "selu_backward": "(x <= 0.0f) ? y * 1.7580993408473766f * exp(x) : y * 1.0507009873554805f",
    "celu_backward": "(x <= 0.0f) ? y * exp(x * q) : y",
    "tanhshrink_backward": "y * tanh_sat(x) * tanh_sat(x)",
    "threshold_backward": "(x <= p) ? 0.0f : y",
    "smooth_l1_backward": "(x <= -p) ? -y : ((x >= p) ? y : x / p * y)",
    "huber_backward": "(x <= -p) ? -p * y : ((x >= p) ? p * y : x * y)",
}

# what binary(op, scalar, t) means as a tensor-scalar op with the tensor on the left
REVERSED = {"add": "add", "mul": "mul", "sub": "rsub", "div": "rdiv", "rsub": "sub",
            "rdiv": "div", "maximum": "maximum", "minimum": "minimum", "pow": "rpow",
            "rpow": "pow", "ge": "le", "le": "ge", "gt": "lt", "lt": "gt",
            "pow_grad_exponent": "rpow_grad_exponent", "rpow_grad_exponent": "pow_grad_exponent",
            "eq": "eq", "ne": "ne"}
