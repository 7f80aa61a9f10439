"""OpenCL math that several kernel families share, as source text to prepend: a
vectorisable ``exp`` and the normal CDF (GELU's exact form, in ``elementwise`` and ``gelu``),
and GELU's tanh approximation with its derivative.

PoCL 3.0's CPU device calls its library for ``exp`` and ``erf`` (not inlined, not
vectorised): these branch-free versions are what make GELU and friends run at the speed of
the other elementwise kernels.
"""

from __future__ import annotations

# GELU's tanh approximation: tanh(u), u = sqrt(2/pi) * (x + 0.044715 x^3), and its derivative
GELU_TANH = r"""
// tanh(sqrt(2/pi) (x + 0.044715 x^3)). PoCL's tanh stops one float short of +-1 (1 - 6e-8)
// where the true value rounds to +-1 (|u| > 9.1): times x^3 in the gradient that gave
// 1.0064 for 1 at x = 100, and gelu(-100) = -3e-6 for 0.
inline float GELU_T(const float x)
{
    const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return (u > 9.1f) ? 1.0f : ((u < -9.1f) ? -1.0f : tanh(u));
}
inline float gelu_tanh_grad(const float x)
{
    const float t = GELU_T(x);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * 0.7978845608028654f
           * (1.0f + 0.134145f * x * x);
}
"""
# GELU's exact form x * Phi(x), Phi the normal CDF = erfc(-x / sqrt(2)) / 2, through an erfc
# with a fractional error under 1.2e-7 everywhere (the Chebyshev fit of Numerical Recipes'
# erfcc): one exp and one division, which vectorise, where PoCL's erf is a call costing ~5x an
# exp here (GELU was about half of a GPT step). Each tail takes the erfc of |x|, so even
# gelu(-8) ~ -5e-15 keeps its relative accuracy, as PyTorch's does.
NORMAL_CDF = r"""
// exp by Cephes' expf: n = round(x / ln 2), r = x - n ln 2 in two parts, a degree-6 polynomial,
// then 2^n built from its exponent bits; relative error ~2e-7, branch-free so it vectorises
// (PoCL's exp is a call costing ~4 ns per element on this CPU).
// Below -87 (exp under 1.6e-38, float's normal range) it is 0: the clamp keeps 2^n's exponent
// bits valid, but alone it gave exp(-87) for any smaller x, and GELU's gradient x * phi(x)
// was 1.0066 at x = 1e36 and -1.97 at x = -3e38 (PyTorch: 1 and 0).
inline float exp_poly(const float x0)
{
    const float x = x0 < -87.0f ? -87.0f : (x0 > 88.0f ? 88.0f : x0);
    const float v = x * 1.44269504088896341f + 0.5f;
    const int t = (int)v;
    const int k = t - (v < (float)t);                 // floor(v), without a library call
    const float n = (float)k;
    const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
    const float p = ((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r
                     + 4.1665795894e-2f) * r + 1.6666665459e-1f) * r + 5.0000001201e-1f;
    const float e = (p * r * r + r + 1.0f) * as_float((k + 127) << 23);
    return x0 < -87.0f ? 0.0f : e;
}
inline float erfc_nonneg(const float z)
{
    const float t = 1.0f / (1.0f + 0.5f * z);
    return t * exp_poly(-z * z - 1.26551223f + t * (1.00002368f + t * (0.37409196f
        + t * (0.09678418f + t * (-0.18628806f + t * (0.27886807f + t * (-1.13520398f
        + t * (1.48851587f + t * (-0.82215223f + t * 0.17087277f)))))))));
}
inline float normal_cdf(const float x)
{
    const float half_tail = 0.5f * erfc_nonneg((x < 0.0f ? -x : x) * M_SQRT1_2_F);
    return x < 0.0f ? half_tail : 1.0f - half_tail;
}
"""
