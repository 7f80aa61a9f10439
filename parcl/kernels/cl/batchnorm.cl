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
// one unaligned float8u (VECTOR_TYPES). LANES_SUMS makes two such sums at once, in blocks at
// three levels: within an image's run, blocks of LANE_BLOCK vectors, each summed on its own,
// then added into the image's sum, with the vectors left over as one last, shorter block;
// images' sums added into their group's (IMAGE_BLOCK images), the groups' into the channel's;
// the run's tail (HW % 8) in a scalar beside it. (Full blocks run a constant trip count: with
// a min() bound PoCL compiled the loop 20-25% slower than one running sum.) The
// same additions as one running sum per lane, but each running sum is short (for a ResNet
// (16, 64, 32, 32) batch: 16 + 8 + 8 + 2 terms instead of 2048), which keeps the rounding
// error of a large channel, or of one with a large mean, near a few roundings.
// VEC adds the vector at `at` into the block's float8 sums ba, bb; ONE the element at `at`
// into the scalars ta, tb.
#define LANE_BLOCK 16
#define IMAGE_BLOCK 8
#define LANES_FOLD(v) \
    ((((v).s0 + (v).s4) + ((v).s2 + (v).s6)) + (((v).s1 + (v).s5) + ((v).s3 + (v).s7)))
#define LOAD8(p) (*(const global float8u*)(p))
#define LANES_SUMS(A, B, VEC, ONE) {                                                   \
    const int nv = HW / 8, nb = nv / LANE_BLOCK;                                       \
    float8 ca = (float8)(0.0f), cb = (float8)(0.0f);                                   \
    float ta = 0.0f, tb = 0.0f;                                                        \
    for (int n0 = 0; n0 < N; n0 += IMAGE_BLOCK) {                                      \
        float8 ga = (float8)(0.0f), gb = (float8)(0.0f);                               \
        for (int n = n0; n < min(n0 + IMAGE_BLOCK, N); ++n) {                          \
            const long base = ((long)n * C + c) * HW;                                  \
            float8 ia = (float8)(0.0f), ib = (float8)(0.0f);                           \
            for (int i0 = 0; i0 < nb * LANE_BLOCK; i0 += LANE_BLOCK) {                 \
                float8 ba = (float8)(0.0f), bb = (float8)(0.0f);                       \
                for (int k = 0; k < LANE_BLOCK; ++k) {                                 \
                    const long at = base + 8 * (i0 + k);                               \
                    VEC                                                                \
                }                                                                      \
                ia += ba;                                                              \
                ib += bb;                                                              \
            }                                                                          \
            float8 ba = (float8)(0.0f), bb = (float8)(0.0f);                           \
            for (int i = nb * LANE_BLOCK; i < nv; ++i) {                               \
                const long at = base + 8 * i;                                          \
                VEC                                                                    \
            }                                                                          \
            ga += ia + ba;                                                             \
            gb += ib + bb;                                                             \
            for (int i = nv * 8; i < HW; ++i) { const long at = base + i; ONE }        \
        }                                                                              \
        ca += ga;                                                                      \
        cb += gb;                                                                      \
    }                                                                                  \
    A = LANES_FOLD(ca) + ta;                                                           \
    B = LANES_FOLD(cb) + tb;                                                           \
}

inline float channel_lanes_sum(const global float* restrict x, const int N, const int C,
                               const int HW, const int c)
{
    float sum, unused;
    LANES_SUMS(sum, unused, ba += LOAD8(x + at);, ta += x[at];)
    return sum;
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
    CHANNEL_MOMENTS(x, mu, m2, lo)
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
    const float m1 = SHIFT(channel_lanes_sum(x, N, C, HW, c) / (float)M);
    const float8 m8 = (float8)(m1);
    float s, q;
    LANES_SUMS(s, q,
               const float8 d = LOAD8(x + at) - m8; const float8 dd = d * d; ba += d; bb += dd;,
               const float d = x[at] - m1; const float dd = d * d; ta += d; tb += dd;)
    CORRECTED_MOMENTS(m1, s, q, M, mu, m2, lo)
    const float var = m2 / (float)M;
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
    float a, b;
    LANES_SUMS(a, b,
               const float8 gv = LOAD8(g + at); const float8 p = gv * (LOAD8(x + at) - mu8);
               ba += gv; bb += p;,
               const float gv = g[at]; const float p = gv * (x[at] - mu); ta += gv; tb += p;)
    sg[c] = a;
    sgx[c] = b * invstd[c];
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
    const float2 ab = group_sum2((float2)(a, b), scratch);
    if (l == 0) {
        sg[c] = ab.x;
        sgx[c] = ab.y * invstd[c];
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
