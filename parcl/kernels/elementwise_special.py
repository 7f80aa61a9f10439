"""The special functions' rows of the elementwise tables, which ``elementwise`` builds as a
program of its own (their series would double the main program's build time):
lgamma, digamma, polygamma, mvlgamma, erfc, erfinv, i0 (and i1, its derivative), sinc, logit,
the inverse hyperbolic functions, and the binary ops xlogy, logaddexp, logaddexp2, fmax, fmin,
heaviside, ldexp, copysign, floor_divide, the logical ops and isclose.

lgamma, erfc and the inverse hyperbolics are OpenCL builtins; digamma, polygamma, erfinv, i0
and i1 are series written here in float32 (checked against ``torch.special`` in float64 by
tests/test_ops_special.py): no fp64, which not every device has.
"""

from __future__ import annotations

from .line_sums import LINE_SUM

# C helpers the expressions below call, appended to the family's HELPERS.
SPECIAL_HELPERS = LINE_SUM + r"""
// digamma: PyTorch's values at the poles (copysign(inf, -x) at 0, NaN at the negative
// integers and -inf); reflection psi(1 - x) - pi / tan(pi x) below 0, the recurrence
// psi(x) = psi(x + 1) - 1 / x up to 6, then the asymptotic series in 1 / x^2. Within 0.1 of
// its positive root x0 = 1.46163214... those terms (~2) cancel to a float's error of 2, which
// was 3e-3 relative off at x0 - 2e-5 (PyTorch's 7e-5): there the Taylor series in
// d = x - x0 (x0 in two floats), its coefficients psi^(k)(x0) / k!.
inline float digamma_f(float x)
{
    const float d = (x - 1.46163213253021240234375f) - 1.243815006546356e-08f;
    if (fabs(d) < 0.1f)
        return d * (0.96767224589f + d * (-0.44276316898f + d * (0.25849976096f
               + d * (-0.16394270544f + d * (0.10782405069f + d * (-0.07219956126f
               + d * (0.04880428816f + d * -0.03316112647f)))))));
    if (x == 0.0f) return copysign(INFINITY, -x);
    if (isinf(x)) return (x > 0.0f) ? x : NAN;
    float r = 0.0f;
    if (x < 0.0f) {
        if (x == floor(x)) return NAN;
        r = -M_PI_F / tanpi(x);
        x = 1.0f - x;
    }
    while (x < 6.0f) { r -= 1.0f / x; x += 1.0f; }
    const float z = 1.0f / (x * x);
    const float tail = z * (8.3333333333e-2f - z * (8.3333333333e-3f - z * (3.9682539683e-3f
                       - z * (4.1666666667e-3f - z * 7.5757575758e-3f))));
    return r + log(x) - 0.5f / x - tail;
}
// Hurwitz zeta(s, q) for an integer s >= 2: the terms (q + k)^-s summed until q + k passes
// 9 + s, then the Euler-Maclaurin tail (Bernoulli numbers B2..B10). A q below -4096 would take
// too many terms: NaN there (documented in tp.polygamma).
inline float zeta_int(const int s, float q)
{
    if (q <= 0.0f && q == floor(q)) return INFINITY;
    if (isnan(q) || q < -4096.0f) return NAN;
    if (isinf(q)) return 0.0f;
    // summed compensated (LINE_SUM): below 0 the terms alternate in sign and cancel (at
    // q = -2.5 to 1e-3 of the largest), which a plain float sum got only to 3 digits
    float2 acc = (float2)(0.0f, 0.0f);
    const float shift = 9.0f + (float)s;
    while (q < shift) {
        const float t = pown(q, -s);
        // a term past float32's range (q near 0 or a negative integer) is the whole sum:
        // +-inf as PyTorch's, where the compensation would make it inf - inf, NaN
        if (isinf(t)) return t;
        acc = sum_step(acc, t);
        q += 1.0f;
    }
    const float head = acc.x + acc.y;
    const float fs = (float)s, inv = 1.0f / q, inv2 = inv * inv;
    float t = fs * pown(q, -s - 1);             // s q^(-s-1) / 12 is the B2 term
    float tail = t / 12.0f;
    t *= (fs + 1.0f) * (fs + 2.0f) * inv2;  tail -= t / 720.0f;
    t *= (fs + 3.0f) * (fs + 4.0f) * inv2;  tail += t / 30240.0f;
    t *= (fs + 5.0f) * (fs + 6.0f) * inv2;  tail -= t / 1209600.0f;
    t *= (fs + 7.0f) * (fs + 8.0f) * inv2;  tail += t / 47900160.0f;
    return head + pown(q, 1 - s) / (fs - 1.0f) + 0.5f * pown(q, -s) + tail;
}
// polygamma(n, x) = (-1)^(n+1) n! zeta(n + 1, x) for n >= 1, digamma for n = 0
inline float polygamma_f(const float nf, const float x)
{
    const int n = (int)nf;
    if (n == 0) return digamma_f(x);
    float fact = 1.0f;
    for (int i = 2; i <= n; i++) fact *= (float)i;
    return ((n & 1) ? fact : -fact) * zeta_int(n + 1, x);
}
// multivariate lgamma of dimension p: sum over i < p of lgamma(x - i / 2) (the constant
// p (p - 1) / 4 log(pi) is added by the caller as q); its derivative sums digamma
inline float mvlgamma_f(const float x, const float p)
{
    float s = 0.0f;
    for (int i = 0; i < (int)p; i++) s += lgamma(x - 0.5f * (float)i);
    return s;
}
inline float mvdigamma_f(const float x, const float p)
{
    float s = 0.0f;
    for (int i = 0; i < (int)p; i++) s += digamma_f(x - 0.5f * (float)i);
    return s;
}
// erfinv: Giles' single-precision fit ("Approximating the erfinv function", 2010), then one
// Newton step on erf; +-inf at +-1 and NaN beyond, as PyTorch's
inline float erfinv_f(const float x)
{
    const float ax = fabs(x);
    if (ax >= 1.0f) return (ax == 1.0f) ? copysign(INFINITY, x) : NAN;
    float w = -log((1.0f - x) * (1.0f + x)), p;
    if (w < 5.0f) {
        w -= 2.5f;
        p = 2.81022636e-08f;
        p = 3.43273939e-07f + p * w;  p = -3.5233877e-06f + p * w;
        p = -4.39150654e-06f + p * w; p = 0.00021858087f + p * w;
        p = -0.00125372503f + p * w;  p = -0.00417768164f + p * w;
        p = 0.246640727f + p * w;     p = 1.50140941f + p * w;
    } else {
        w = sqrt(w) - 3.0f;
        p = -0.000200214257f;
        p = 0.000100950558f + p * w;  p = 0.00134934322f + p * w;
        p = -0.00367342844f + p * w;  p = 0.00573950773f + p * w;
        p = -0.0076224613f + p * w;   p = 0.00943887047f + p * w;
        p = 1.00167406f + p * w;      p = 2.83297682f + p * w;
    }
    const float r = p * x;
    return r - (erf(r) - x) / (1.1283791670955126f * exp(-r * r));
}
// sinc's derivative (cos(pi x) - sinc(x)) / x; below |x| = 1/4 its Taylor series, where the
// difference of two numbers near 1 would lose the digits (PyTorch's float32 loses them)
inline float sinc_grad_f(const float x)
{
    if (fabs(x) < 0.25f) {
        const float u = M_PI_F * M_PI_F * x * x;
        return M_PI_F * M_PI_F * x * (-1.0f / 3.0f + u * (1.0f / 30.0f + u * (-1.0f / 840.0f
               + u * (1.0f / 45360.0f - u / 3991680.0f))));
    }
    return (cospi(x) - sinpi(x) / (M_PI_F * x)) / x;
}
// modified Bessel functions I0 and I1 (and the scaled exp(-|x|) I0, I1): the power series up
// to |x| = 20 (positive terms, so no cancellation), beyond it Hankel's asymptotic series
// (mu = 4 nu^2) over sqrt(2 pi |x|), times exp(|x| / 2)^2 for the unscaled ones, split so that
// the result overflows only where it must
inline float bessel_hankel(const float ax, const float mu)
{
    float t = 1.0f, s = 1.0f;
    for (int k = 1; k <= 7; k++) {
        const float odd = (float)(2 * k - 1);
        t *= -(mu - odd * odd) / ((float)k * 8.0f * ax);
        s += t;
    }
    // 2 pi |x| passes float32's range above 5.4e37: there 1 / sqrt(2 pi) apart (else i0e
    // was 0 and i0 inf * 0, NaN)
    return s * ((ax > 1e37f) ? 0.3989422804f * rsqrt(ax) : rsqrt(2.0f * M_PI_F * ax));
}
inline float bessel_i0_series(const float ax)
{
    const float q = 0.25f * ax * ax;
    float t = 1.0f, s = 1.0f;
    for (int k = 1; k < 64 && t > 1e-9f * s; k++) { t *= q / (float)(k * k); s += t; }
    return s;
}
inline float bessel_i1_series(const float ax)
{
    const float q = 0.25f * ax * ax;
    float t = 0.5f * ax, s = t;
    for (int k = 1; k < 64 && t > 1e-9f * s; k++) { t *= q / (float)(k * (k + 1)); s += t; }
    return s;
}
inline float i0_f(const float x)
{
    const float ax = fabs(x);
    if (ax <= 20.0f) return bessel_i0_series(ax);
    const float e = exp(0.5f * ax);
    return e * (e * bessel_hankel(ax, 0.0f));
}
inline float i1_f(const float x)
{
    const float ax = fabs(x);
    if (ax <= 20.0f) return copysign(bessel_i1_series(ax), x);
    const float e = exp(0.5f * ax);
    return copysign(e * (e * bessel_hankel(ax, 4.0f)), x);
}
inline float i0e_f(const float x)
{
    const float ax = fabs(x);
    return (ax <= 20.0f) ? exp(-ax) * bessel_i0_series(ax) : bessel_hankel(ax, 0.0f);
}
inline float i1e_f(const float x)
{
    const float ax = fabs(x);
    return copysign((ax <= 20.0f) ? exp(-ax) * bessel_i1_series(ax) : bessel_hankel(ax, 4.0f),
                    x);
}
"""

# name -> C expression of x and the float parameters p, q (as elementwise_ops.UNARY_OPS)
SPECIAL_UNARY = {
    "acosh": "acosh(x)",
    "asinh": "asinh(x)",
    "atanh": "atanh(x)",
    # PyTorch multiplies by the constants rounded to float32
    "deg2rad": "x * 0.017453292519943295f",
    "rad2deg": "x * 57.29577951308232f",
    "erfc": "erfc(x)",
    "erfinv": "erfinv_f(x)",
    # lgamma's builtin, with PyTorch's +inf at 0, -0 and the negative integers
    "lgamma": "(x <= 0.0f && x == floor(x)) ? INFINITY : lgamma(x)",
    "digamma": "digamma_f(x)",
    "polygamma": "polygamma_f(p, x)",                      # p: n
    "mvlgamma": "mvlgamma_f(x, p) + q",                    # p: dimension, q: the constant
    "i0": "i0_f(x)",
    "i1": "i1_f(x)",
    "i0e": "i0e_f(x)",
    "i1e": "i1e_f(x)",
    # torch.special.entr: -x log x, 0 at 0, -inf below
    "entr": "isnan(x) ? x : ((x > 0.0f) ? -x * log(x) : ((x == 0.0f) ? 0.0f : -INFINITY))",
    # sin(pi x) / (pi x) with sinpi, exact at the integers (1 at 0)
    "sinc": "(x == 0.0f) ? 1.0f : sinpi(x) / (M_PI_F * x)",
    # p: eps, or -1 for none (then x outside [0, 1] gives NaN by itself)
    "logit": "log(((p < 0.0f) ? x : ((x < p) ? p : ((x > 1.0f - p) ? 1.0f - p : x)))"
             " / (1.0f - ((p < 0.0f) ? x : ((x < p) ? p : ((x > 1.0f - p) ? 1.0f - p : x)))))",
    # the sign bit, as torch.signbit (-0 has it, a NaN from 0/0 may): a float32 0/1 mask
    "signbit": "signbit(x) ? 1.0f : 0.0f",
    "logical_not": "(x == 0.0f) ? 1.0f : 0.0f",
    "nan_zero": "isnan(x) ? 0.0f : x",                     # nansum's summands
}

# backward helpers of same-shape (saved input x, upstream gradient y) pairs, with the forward's
# p, q: PyTorch's formulas
SPECIAL_GRAD = {
    "acosh_backward": "y * rsqrt(x * x - 1.0f)",
    "asinh_backward": "y * rsqrt(x * x + 1.0f)",
    "atanh_backward": "y / (1.0f - x * x)",
    "deg2rad_backward": "y * 0.017453292519943295f",
    "rad2deg_backward": "y * 57.29577951308232f",
    "erfc_backward": "-y * 1.1283791670955126f * exp(-x * x)",
    # x is erfinv's output: sqrt(pi) / 2 exp(erfinv(x)^2)
    "erfinv_backward": "y * 0.886226925452758f * exp(x * x)",
    "lgamma_backward": "y * digamma_f(x)",
    "digamma_backward": "y * polygamma_f(1.0f, x)",
    "polygamma_backward": "y * polygamma_f(p + 1.0f, x)",
    "mvlgamma_backward": "y * mvdigamma_f(x, p)",
    "i0_backward": "y * i1_f(x)",
    # PyTorch's: i1' = i0 - i1 / x (1/2 at 0), i0e' = i1e - sgn(x) i0e,
    # i1e' = i0e - i1e (sgn(x) + 1 / x) (1/2 at 0); 1/2 also below the smallest normal
    # float, where i1(x) = x / 2 rounds to 0 or 1 / x overflows (1 and -inf there, not 1/2)
    "i1_backward": "(fabs(x) < FLT_MIN) ? 0.5f * y : y * (i0_f(x) - i1_f(x) / x)",
    "i0e_backward": "y * (i1e_f(x) - ((x > 0.0f) ? 1.0f : ((x < 0.0f) ? -1.0f : 0.0f)) * i0e_f(x))",
    "i1e_backward": "(fabs(x) < FLT_MIN) ? 0.5f * y : y * (i0e_f(x) - i1e_f(x)"
                    " * (((x > 0.0f) ? 1.0f : -1.0f) + 1.0f / x))",
    "entr_backward": "-y * (1.0f + log(x))",
    # torch.special.ndtr's (its forward is the family's normal_cdf): the normal density
    "ndtr_backward": "y * 0.3989422804014327f * exp(-0.5f * x * x)",
    # (cos(pi x) - sinc(x)) / x, 0 at 0, as PyTorch's
    "sinc_backward": "y * sinc_grad_f(x)",
    # PyTorch's: 0 outside [eps, 1 - eps] with an eps, NaN outside [0, 1] without; fabs
    # makes -0's x (1 - x) +0, so its gradient is +inf as PyTorch's (y * inf at 0), not -inf
    "logit_backward": "(p < 0.0f) ? ((x < 0.0f || x > 1.0f) ? NAN : y / fabs(x * (1.0f - x)))"
                      " : ((x < p || x > 1.0f - p) ? 0.0f : y / fabs(x * (1.0f - x)))",
    # nansum's: 0 where x is NaN (times y: NaN where y is inf, as PyTorch's mask product)
    "nansum_backward": "isnan(x) ? 0.0f * y : y",
    # torch.isclose, p: rtol, q: atol; equal values (infinities too) are close, NaN is not
    "isclose": "(x == y || (isfinite(x - y) && fabs(x - y) <= q + fabs(p * y))) ? 1.0f : 0.0f",
    "isclose_equal_nan": "(x == y || (isnan(x) && isnan(y)) || (isfinite(x - y)"
                         " && fabs(x - y) <= q + fabs(p * y))) ? 1.0f : 0.0f",
}

# name -> C expression of (x, y), as elementwise_ops.BINARY_OPS (x left, y right)
SPECIAL_BINARY = {
    # torch.xlogy: NaN where y is, else 0 where x == 0; its partials log(y) (0 where x == 0
    # and y <= 0, as PyTorch's) and x / y
    "xlogy": "isnan(y) ? NAN : ((x == 0.0f) ? 0.0f : x * log(y))",
    "xlogy_grad_a": "(x == 0.0f && y <= 0.0f) ? 0.0f : log(y)",
    "xlogy_grad_b": "x / y",
    # torch.special.xlog1py: x log1p(y) with xlogy's rules, -1 in place of 0 for y
    "xlog1py": "isnan(y) ? NAN : ((x == 0.0f) ? 0.0f : x * log1p(y))",
    "xlog1py_grad_a": "(x == 0.0f && y <= -1.0f) ? 0.0f : log1p(y)",
    "xlog1py_grad_b": "x / (1.0f + y)",
    # max + log1p(exp(-|x - y|)): no overflow; two equal infinities give themselves
    "logaddexp": "(isinf(x) && x == y) ? x : fmax(x, y) + log1p(exp(-fabs(x - y)))",
    "logaddexp_grad_a": "1.0f / (1.0f + exp(y - x))",
    "logaddexp_grad_b": "1.0f / (1.0f + exp(x - y))",
    "logaddexp2": "(isinf(x) && x == y) ? x"
                  " : fmax(x, y) + log1p(exp2(-fabs(x - y))) * 1.4426950408889634f",
    "logaddexp2_grad_a": "1.0f / (1.0f + exp2(y - x))",
    "logaddexp2_grad_b": "1.0f / (1.0f + exp2(x - y))",
    # fmax/fmin ignore a NaN (the other side wins); the gradient goes to x where x >= y
    # (fmin: x <= y) or y is NaN, else to y, as PyTorch's
    "fmax": "fmax(x, y)",
    "fmin": "fmin(x, y)",
    "fmax_grad_a": "(x >= y || isnan(y)) ? 1.0f : 0.0f",
    "fmax_grad_b": "(x >= y || isnan(y)) ? 0.0f : 1.0f",
    "fmin_grad_a": "(x <= y || isnan(y)) ? 1.0f : 0.0f",
    "fmin_grad_b": "(x <= y || isnan(y)) ? 0.0f : 1.0f",
    # PyTorch's: values where x == 0, else (x > 0), so NaN gives 0
    "heaviside": "(x == 0.0f) ? y : ((x > 0.0f) ? 1.0f : 0.0f)",
    # x * 2^y (torch.ldexp: input * pow(2, other)), and its partials
    "ldexp": "x * exp2(y)",
    "ldexp_grad_a": "exp2(y)",
    "ldexp_grad_b": "x * exp2(y) * 0.6931471805599453f",
    # copysign's gradient for x: copysign(x, y) / x, 0 where x == 0 (PyTorch's)
    "copysign": "copysign(x, y)",
    "copysign_grad_a": "(x == 0.0f) ? 0.0f : copysign(x, y) / x",
    "copysign_grad_b": "0.0f",
    "floor_divide": "div_floor(x, y)",
    # truth of nonzero (NaN is true), as PyTorch's logical ops, as float32 0/1 masks
    "logical_and": "(x != 0.0f && y != 0.0f) ? 1.0f : 0.0f",
    "logical_or": "(x != 0.0f || y != 0.0f) ? 1.0f : 0.0f",
    "logical_xor": "((x != 0.0f) != (y != 0.0f)) ? 1.0f : 0.0f",
}
