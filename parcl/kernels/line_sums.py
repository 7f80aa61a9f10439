"""OpenCL helpers that sum the terms of a line in one work-item, in a fixed order (the same
bits on every run) and more accurately than a running float sum.

A running float sum of n terms drifts by up to ~n/2 ulps and drops every term below half an ulp
of the total: a softmax over GPT-2's 50257 classes came out 180 ulps off the float64 answer
(most of its exps are that small), a cumsum of 1e6 uniform draws 450.

- ``LINE_SUM`` compensates (Neumaier): ``sum_step`` adds a term and keeps what its rounding
  lost, ``sum_total`` gives the sum; about 1 ulp whatever n, for a few flops more per term.
- ``BLOCK_SUM`` sums a line in blocks of ``SUM_BLOCK`` terms, each block in a float of its own
  as a running sum would (at its cost), and adds the blocks' sums up with ``sum_step``: a term
  rounds against its block's sum, not the line's; 1-2 ulps up to n = 1e6. A line of one block
  is summed as by the running sum, bit for bit.
- ``BLOCK_SUM8`` is ``BLOCK_SUM`` for a contiguous line on a CPU: a block's terms 8 at a time
  in a ``float8`` (PoCL's CPU device then emits vector ``exp``; its scalar one is a call), its 8
  lanes added up at the block's end; each lane a running sum of 32 terms, so no less accurate.
"""


LINE_SUM = r"""
// Compensated (Neumaier): acc.x is the sum, acc.y what its roundings lost; an infinite or NaN
// sum is itself (x - x is 0 only for a finite x; inf - inf in the compensation would make it
// NaN). The magnitudes by masking the sign bit: PoCL's CPU device calls fabs and isfinite out
// of line (logcumsumexp 13% slower with them).
inline float2 sum_step(float2 acc, const float v)
{
    const float t = acc.x + v;
    const bool bigger = (as_uint(acc.x) & 0x7fffffffu) >= (as_uint(v) & 0x7fffffffu);
    acc.y += bigger ? (acc.x - t) + v : (v - t) + acc.x;
    acc.x = t;
    return acc;
}
inline float sum_total(const float2 acc)
{
    return acc.x - acc.x == 0.0f ? acc.x + acc.y : acc.x;
}
"""

# terms of a blocked sum added on their own before joining its total (line_sums' macros,
# reduction's sequential sums)
SUM_BLOCK = 256

BLOCK_SUM = LINE_SUM + f"\n#define SUM_BLOCK {SUM_BLOCK}\n" + r"""

// s = the sum of term over k = 0 .. n-1, term an expression of the int k. A macro, as the term
// is an expression: `block_ += (a * b)` stays one expression the compiler may fuse (an FMA), as
// in the running sum it replaces. (Blocks bounded by min(n, start + SUM_BLOCK), or closed by a
// test at every term, compiled to 5-20% slower loops on PoCL's CPU device; this form does not.)
#define BLOCK_SUM(s, k, n, term)                                                         \
    do {                                                                                \
        float2 blocks_ = (float2)(0.0f, 0.0f);                                          \
        float block_ = 0.0f;                                                            \
        int k = 0;                                                                      \
        for (int end_ = SUM_BLOCK; end_ <= (n); end_ += SUM_BLOCK) {                    \
            for (; k < end_; ++k)                                                       \
                block_ += (term);                                                       \
            blocks_ = sum_step(blocks_, block_);                                        \
            block_ = 0.0f;                                                              \
        }                                                                               \
        for (; k < (n); ++k)                                                            \
            block_ += (term);                                                           \
        s = sum_total(sum_step(blocks_, block_));                                       \
    } while (0)
"""

BLOCK_SUM8 = BLOCK_SUM + r"""
inline float hsum8(const float8 v)
{
    const float4 a = v.lo + v.hi;
    const float2 b = a.lo + a.hi;
    return b.lo + b.hi;
}

// BLOCK_SUM with term8 the float8 of terms k .. k+7 (k a multiple of 8) and term the one of k,
// for the tail past the last multiple of 8
#define BLOCK_SUM8(s, k, n, term8, term)                                                 \
    do {                                                                                \
        float2 blocks_ = (float2)(0.0f, 0.0f);                                          \
        float8 block_ = (float8)(0.0f);                                                 \
        const int n8_ = (n) & ~7;                                                       \
        int k = 0;                                                                      \
        for (int end_ = SUM_BLOCK; end_ <= n8_; end_ += SUM_BLOCK) {                    \
            for (; k < end_; k += 8)                                                    \
                block_ += (term8);                                                      \
            blocks_ = sum_step(blocks_, hsum8(block_));                                 \
            block_ = (float8)(0.0f);                                                    \
        }                                                                               \
        for (; k < n8_; k += 8)                                                         \
            block_ += (term8);                                                          \
        float tail_ = hsum8(block_);                                                    \
        for (; k < (n); ++k)                                                            \
            tail_ += (term);                                                            \
        s = sum_total(sum_step(blocks_, tail_));                                        \
    } while (0)
"""
