//CL// parcl batch norm kernels (launched by parcl/kernels/batchnorm.py, which prepends
// VECTOR_TYPES and CHANNEL_HELPERS).

__kernel void channel_sum(__global const float* restrict x, __global float* restrict out,
                          const int N, const int C, const int HW, __local float* scratch)
{
    const int c = get_group_id(0), l = get_local_id(0), L = get_local_size(0);
    float acc = 0.0f;
    FOR_CHANNEL(acc += x[at];)
    acc = group_sum(acc, scratch);
    if (l == 0)
        out[c] = acc;
}

// CPU variant: one work-item per channel, each image's run summed in 8 lanes (no barriers, no
// work-item-dependent loops), the lanes then folded in a fixed order; the lanes are loaded as
// one unaligned float8u (VECTOR_TYPES).
#define LANES_FOLD(v) \
    ((((v).s0 + (v).s4) + ((v).s2 + (v).s6)) + (((v).s1 + (v).s5) + ((v).s3 + (v).s7)))
inline float channel_lanes_sum(const global float* restrict x, const int N, const int C,
                               const int HW, const int c)
{
    const int nv = HW / 8;
    float8 acc = (float8)(0.0f);
    float tail = 0.0f;
    for (int n = 0; n < N; ++n) {
        const global float* p = x + ((long)n * C + c) * HW;
        for (int i = 0; i < nv; ++i)
            acc += *(const global float8u*)(p + 8 * i);
        for (int i = nv * 8; i < HW; ++i)
            tail += p[i];
    }
    return LANES_FOLD(acc) + tail;
}

__kernel void channel_sum_lanes(__global const float* restrict x, __global float* restrict out,
                                const int N, const int C, const int HW)
{
    const int c = get_global_id(0);
    if (c < C)
        out[c] = channel_lanes_sum(x, N, C, HW, c);
}

// Batch statistics: mean[c], invstd[c] = 1/sqrt(biased var + eps); with UPDATE the running
// statistics move towards the batch's (running var with the unbiased variance, as PyTorch).
__kernel void bn_stats(__global const float* restrict x, __global float* restrict mean,
                       __global float* restrict invstd, __global float* running_mean,
                       __global float* running_var, const int N, const int C, const int HW,
                       const float eps, const float momentum, const int flags,
                       __local float* scratch)
{
    const int c = get_group_id(0), l = get_local_id(0), L = get_local_size(0);
    const long M = (long)N * HW;
    CHANNEL_MOMENTS(x, mu, m2)
    const float var = m2 / (float)M;
    if (l == 0) {
        mean[c] = mu;
        invstd[c] = 1.0f / sqrt(var + eps);
        if (flags & UPDATE) {
            const float unbiased = M > 1 ? var * ((float)M / (float)(M - 1)) : var;
            update_running(running_mean, running_var, c, momentum, mu, unbiased);
        }
    }
}

// CPU variants of bn_stats and bn_grad_sums: one work-item per channel walking each image's
// run in 8 lanes (as channel_sum_lanes), then the lanes folded in a fixed order. The work-group
// reductions above pay barriers and a strided walk that PoCL runs at ~2 GB/s on one core.
__kernel void bn_stats_lanes(__global const float* restrict x, __global float* restrict mean,
                             __global float* restrict invstd, __global float* running_mean,
                             __global float* running_var, const int N, const int C,
                             const int HW, const float eps, const float momentum,
                             const int flags)
{
    const int c = get_global_id(0);
    if (c >= C)
        return;
    const long M = (long)N * HW;
    const int nv = HW / 8;
    const float mu = channel_lanes_sum(x, N, C, HW, c) / (float)M;
    const float8 mu8 = (float8)(mu);
    float8 acc = (float8)(0.0f);
    float tail = 0.0f;
    for (int n = 0; n < N; ++n) {
        const global float* p = x + ((long)n * C + c) * HW;
        for (int i = 0; i < nv; ++i) {
            const float8 d = *(const global float8u*)(p + 8 * i) - mu8;
            acc += d * d;
        }
        for (int i = nv * 8; i < HW; ++i) {
            const float d = p[i] - mu;
            tail += d * d;
        }
    }
    const float var = (LANES_FOLD(acc) + tail) / (float)M;
    mean[c] = mu;
    invstd[c] = 1.0f / sqrt(var + eps);
    if (flags & UPDATE) {
        const float unbiased = M > 1 ? var * ((float)M / (float)(M - 1)) : var;
        update_running(running_mean, running_var, c, momentum, mu, unbiased);
    }
}

__kernel void bn_grad_sums_lanes(__global const float* restrict x,
                                 __global const float* restrict g,
                                 __global const float* restrict mean,
                                 __global const float* restrict invstd,
                                 __global float* restrict sg, __global float* restrict sgx,
                                 const int N, const int C, const int HW)
{
    const int c = get_global_id(0);
    if (c >= C)
        return;
    const float mu = mean[c];
    const float8 mu8 = (float8)(mu);
    const int nv = HW / 8;
    float8 a = (float8)(0.0f), b = (float8)(0.0f);
    float ta = 0.0f, tb = 0.0f;
    for (int n = 0; n < N; ++n) {
        const long base = ((long)n * C + c) * HW;
        const global float* px = x + base;
        const global float* pg = g + base;
        for (int i = 0; i < nv; ++i) {
            const float8 gv = *(const global float8u*)(pg + 8 * i);
            a += gv;
            b += gv * (*(const global float8u*)(px + 8 * i) - mu8);
        }
        for (int i = nv * 8; i < HW; ++i) {
            ta += pg[i];
            tb += pg[i] * (px[i] - mu);
        }
    }
    sg[c] = LANES_FOLD(a) + ta;
    sgx[c] = (LANES_FOLD(b) + tb) * invstd[c];
}

// Evaluation: invstd from the running variance.
__kernel void bn_invstd(__global const float* restrict var, __global float* restrict invstd,
                        const float eps, const int C)
{
    const int c = get_global_id(0);
    if (c < C)
        invstd[c] = 1.0f / sqrt(var[c] + eps);
}

// y = (x - mean[c]) * invstd[c] * w[c] + b[c]
__kernel void bn_apply(__global const float* restrict x, __global float* restrict y,
                       __global const float* restrict mean, __global const float* restrict invstd,
                       __global const float* restrict w, __global const float* restrict b,
                       const int C, const int HW, const int rows, const int flags)
{
    const int hw = get_global_id(0), row = get_global_id(1);
    if (hw >= HW || row >= rows)
        return;
    const long i = (long)row * HW + hw;
    const int c = row % C;
    float s = invstd[c];
    if (flags & HAS_W)
        s *= w[c];
    float v = (x[i] - mean[c]) * s;
    if (flags & HAS_B)
        v += b[c];
    y[i] = v;
}

// The fused residual epilogue, y = max(bn(x) + r, lo) (lo = 0 for a ReLU, else -inf; NaN
// stays NaN): bn_apply_add reads r, bn_apply_acc adds y's own values (the residual overwritten
// in place). Two kernels rather than one with an optional r: a NULL buffer argument makes PoCL
// run the whole kernel ~40% slower.
#define BN_RESIDUAL(name, R) \
__kernel void name(__global const float* restrict x, __global float* restrict y, \
                   __global const float* restrict mean, __global const float* restrict invstd, \
                   __global const float* restrict w, __global const float* restrict b, \
                   __global const float* restrict r, const int C, const int HW, const int rows, \
                   const int flags, const float lo) \
{ \
    const int hw = get_global_id(0), row = get_global_id(1); \
    if (hw >= HW || row >= rows) \
        return; \
    const long i = (long)row * HW + hw; \
    const int c = row % C; \
    float s = invstd[c]; \
    if (flags & HAS_W) \
        s *= w[c]; \
    float v = (x[i] - mean[c]) * s; \
    if (flags & HAS_B) \
        v += b[c]; \
    v += R[i]; \
    y[i] = v < lo ? lo : v; \
}
BN_RESIDUAL(bn_apply_add, r)
BN_RESIDUAL(bn_apply_acc, y)

// Per channel: sg[c] = sum g, sgx[c] = sum g * xhat (xhat = (x - mean) * invstd).
__kernel void bn_grad_sums(__global const float* restrict x, __global const float* restrict g,
                           __global const float* restrict mean,
                           __global const float* restrict invstd,
                           __global float* restrict sg, __global float* restrict sgx,
                           const int N, const int C, const int HW, __local float* scratch)
{
    const int c = get_group_id(0), l = get_local_id(0), L = get_local_size(0);
    const float mu = mean[c];
    float a = 0.0f, b = 0.0f;
    FOR_CHANNEL(const float gv = g[at]; a += gv; b += gv * (x[at] - mu);)
    a = group_sum(a, scratch);
    b = group_sum(b, scratch);
    if (l == 0) {
        sg[c] = a;
        sgx[c] = b * invstd[c];
    }
}

// training: gx = w * invstd * (g - sg/M - xhat * sgx/M); eval (M = 0): gx = w * invstd * g
__kernel void bn_grad_input(__global const float* restrict x, __global const float* restrict g,
                            __global float* restrict gx, __global const float* restrict mean,
                            __global const float* restrict invstd,
                            __global const float* restrict w,
                            __global const float* restrict sg, __global const float* restrict sgx,
                            const int C, const int HW, const int rows, const float inv_m,
                            const int flags)
{
    const int hw = get_global_id(0), row = get_global_id(1);
    if (hw >= HW || row >= rows)
        return;
    const long i = (long)row * HW + hw;
    const int c = row % C;
    const float is = invstd[c];
    float s = is;
    if (flags & HAS_W)
        s *= w[c];
    float v = g[i];
    if (inv_m != 0.0f) {
        const float xhat = (x[i] - mean[c]) * is;
        v -= (sg[c] + xhat * sgx[c]) * inv_m;
    }
    gx[i] = v * s;
}
