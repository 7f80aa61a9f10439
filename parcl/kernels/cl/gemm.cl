//CL// parcl GEMM kernels: C = epilogue(op(A) @ op(B)), launched by parcl/kernels/gemm.py.
//
// Epilogue (both variants): v = acc (+ beta * C_old if beta != 0) (+ bias[col]) (then ReLU),
// as cuBLASLt orders it. C_old is never read when beta == 0, so `out` may be uninitialised.
//
// Build with -cl-mad-enable: `acc += x * y` must contract to an FMA. Builtins such as mad(),
// vload8() and vstore8() are *calls* in PoCL 3.0's CPU device (not inlined), so the hot loop
// uses plain operators and vector pointer casts only.

#define FLAG_BIAS 1
#define FLAG_RELU 2
#define FLAG_VEC  4    // N % VW == 0, so C rows are vector-aligned: whole-vector stores

// Every kernel sums K in blocks of KBLOCK steps, each in fresh accumulators added to the total
// at its end: a product rounds against its block's sum, not against the whole sum, so a long K
// (a weight gradient sums over every token of a batch) stays near float32 accuracy (K = 262144:
// 1.1e-6 of the largest element, not 1.3e-5) for one add per KBLOCK steps. A sum from +0.0 is
// never -0.0, so adding a block's sum to the total's 0.0 is exact: K <= KBLOCK gives the bits
// of one running sum. A multiple of the tiled kernel's TK.
#define KBLOCK 256

// The k loop of a CPU kernel in blocks: ZERO_T declares a block's accumulators, STEP (using
// the int k) adds one k step into them, ADD_T adds them to the totals. Whole blocks run to a
// fixed end and the rest after them: blocks bounded by min(K, k0 + KBLOCK) made PoCL's code
// for gemm_cpu 5-8 % slower at K = 512..1024.
#define K_BLOCKS(ZERO_T, ADD_T, ...) {                                                     \
        int k = 0;                                                                       \
        for (int end_ = KBLOCK; end_ <= K; end_ += KBLOCK) {                             \
            ZERO_T                                                                       \
            for (; k < end_; ++k) { __VA_ARGS__ }                                        \
            ADD_T                                                                        \
        }                                                                                \
        ZERO_T                                                                           \
        for (; k < K; ++k) { __VA_ARGS__ }                                               \
        ADD_T                                                                            \
    }

inline float epilogue1(float v, global float* c, const global float* bias, int col,
                       float beta, int flags)
{
    if (beta != 0.0f)
        v += beta * *c;
    if (flags & FLAG_BIAS)
        v += bias[col];
    if ((flags & FLAG_RELU) && v < 0.0f)    // keeps NaN (as PyTorch's relu does)
        v = 0.0f;
    return v;
}

// ---- CPU variants: packed panels, one MR x NR register block of C per work-item -------------
//
// VW (build option -DVW=8 or -DVW=16) is the vector width: float8 is the safe default, float16
// (AVX-512) is about twice as fast but only used once a subprocess probe has built and checked
// it on the device (gemm.py), since PoCL 3.0/LLVM 14 has aborted the process on float16 code.
//
// An A panel is MR rows of op(A) stored k-major ([K][MR]), a B panel NR = 2*VW columns of
// op(B) stored k-major ([K][NR]); each k step is then MR broadcasts, two vector loads and
// 2*MR FMAs, all reading contiguously. `pack` builds the panels: transposes resolved, zero
// padding to whole panels, so the hot loop has no edge cases. A row-major op(A) with whole
// panels is read in place (MR row streams), which saves the packing pass over it.

#ifndef VW
#define VW 8
#endif
#if VW == 16
typedef float16 vec;
#else
typedef float8 vec;
#endif
#define MR 8
#define NR (2 * VW)

// Store the VW values of `v` at columns col..col+VW-1 of the row starting at `c`, which holds
// whole vectors there (FLAG_VEC and col + VW <= N).
inline void emit_vec(global float* restrict c, const global float* restrict bias, vec v,
                     int col, float beta, int flags)
{
    global vec* p = (global vec*)(c + col);
    if (beta != 0.0f)
        v += beta * *p;
    if (flags & FLAG_BIAS)
        v += *(const global vec*)(bias + col);
    if (flags & FLAG_RELU)
        v = v < 0.0f ? (vec)(0.0f) : v;
    *p = v;
}

// The same for any columns: past N nothing is stored.
inline void emit(global float* restrict c, const global float* restrict bias, vec v,
                 int col, int N, float beta, int flags)
{
    if ((flags & FLAG_VEC) && col + VW <= N) {
        emit_vec(c, bias, v, col, beta, flags);
    } else {
        float t[VW];
        *(vec*)t = v;
        for (int i = 0; i < VW && col + i < N; ++i)
            c[col + i] = epilogue1(t[i], c + col + i, bias, col + i, beta, flags);
    }
}

#define ROW(r, si) { const vec x = (vec)(a[r * (si)]); t##r##0 += x * b0; t##r##1 += x * b1; }
#define ZERO(p, r) vec p##r##0 = (vec)(0.0f), p##r##1 = (vec)(0.0f);
#define ADD(r) c##r##0 += t##r##0; c##r##1 += t##r##1;
#define KLOOP(si) K_BLOCKS( \
        ZERO(t, 0) ZERO(t, 1) ZERO(t, 2) ZERO(t, 3) ZERO(t, 4) ZERO(t, 5) ZERO(t, 6) ZERO(t, 7), \
        ADD(0) ADD(1) ADD(2) ADD(3) ADD(4) ADD(5) ADD(6) ADD(7), \
        const vec b0 = ((const global vec*)b)[0]; \
        const vec b1 = ((const global vec*)b)[1]; \
        ROW(0, si) ROW(1, si) ROW(2, si) ROW(3, si) ROW(4, si) ROW(5, si) ROW(6, si) ROW(7, si) \
        a += a_sk; \
        b += NR;)
#define EMIT_VEC(r) { \
        global float* crow = c + (long)(row0 + r) * N; \
        emit_vec(crow, bias, c##r##0, col0, beta, flags); \
        emit_vec(crow, bias, c##r##1, col0 + VW, beta, flags); \
    }
#define STASH(r) acc[2 * r] = c##r##0; acc[2 * r + 1] = c##r##1;

// One MR x NR block of C: row panel ip, column panel jp, batch entry bt.
// op(A)[i][k] is read at A + panel*a_ps + i*a_si + k*a_sk: a packed panel (a_si = 1,
// a_sk = MR, a_ps = K*MR), or A itself (gemm.py does that for a row-major A whose M is whole
// panels: each k step reads MR scalars to broadcast either way, so packing such an A only
// costs a pass over it).
inline void gemm_block(const global float* restrict A, long a_bs, long a_ps, long a_si,
                       long a_sk, const global float* restrict B, long b_bs,
                       global float* restrict C, long c_bs, const global float* restrict bias,
                       int M, int N, int K, float beta, int flags, int jp, int ip, int bt)
{
    const global float* a = A + bt * a_bs + ip * a_ps;
    const global float* b = B + bt * b_bs + (long)jp * K * NR;
    ZERO(c, 0) ZERO(c, 1) ZERO(c, 2) ZERO(c, 3) ZERO(c, 4) ZERO(c, 5) ZERO(c, 6) ZERO(c, 7)
    if (a_si == 1) {                     // a packed panel: its MR values share a cache line
        KLOOP(1)
    } else {
        KLOOP(a_si)
    }
    global float* c = C + bt * c_bs;
    const int row0 = ip * MR, col0 = jp * NR;
    if ((flags & FLAG_VEC) && row0 + MR <= M && col0 + NR <= N) {
        EMIT_VEC(0) EMIT_VEC(1) EMIT_VEC(2) EMIT_VEC(3)
        EMIT_VEC(4) EMIT_VEC(5) EMIT_VEC(6) EMIT_VEC(7)
    } else {
        // An edge block: one rolled copy of the general store. Sixteen unrolled copies of it
        // made PoCL's first-launch compile of this kernel ~8 s instead of ~1.
        vec acc[2 * MR];
        STASH(0) STASH(1) STASH(2) STASH(3) STASH(4) STASH(5) STASH(6) STASH(7)
        #pragma unroll 1
        for (int r = 0; r < MR && row0 + r < M; ++r) {
            global float* crow = c + (long)(row0 + r) * N;
            emit(crow, bias, acc[2 * r], col0, N, beta, flags);
            emit(crow, bias, acc[2 * r + 1], col0 + VW, N, beta, flags);
        }
    }
}

#define GEMM_ARGS A, a_bs, a_ps, a_si, a_sk, B, b_bs, C, c_bs, bias, M, N, K, beta, flags
#define GEMM_PARAMS const global float* restrict A, long a_bs, long a_ps, long a_si, \
    long a_sk, const global float* restrict B, long b_bs, global float* restrict C, \
    long c_bs, const global float* restrict bias, int M, int N, int K, float beta, int flags

kernel void gemm_cpu(GEMM_PARAMS)
{
    const int jp = get_global_id(0), ip = get_global_id(1), bt = get_global_id(2);
    if (jp * NR >= N || ip * MR >= M)    // the grid is padded to whole work-groups
        return;
    gemm_block(GEMM_ARGS, jp, ip, bt);
}

// Packing: P[bt][panel][k][i] = X[panel*W + i][k] for a matrix X (op(A), or op(B) transposed)
// whose element (i, k) sits at i*si + k*sk; zero past row `rows`. One launch packs both
// operands (each launch costs ~0.1 ms in PoCL): global (K / KB rounded up to the work-group,
// A panels + B panels, batch); a work-item packs a KB x W block of one panel, which is KB*W
// contiguous floats of P. Either k or i is contiguous in memory for every operand layout, so
// the block is read as W vectors along k (sk == 1: a register transpose on the way out) or as
// KB rows of W contiguous floats (si == 1); anything else, and the edges, element by element.
#define KB 8
// float8u (VECTOR_TYPES in _cache.py, prepended by gemm.py): inline unaligned vector moves
#define LOAD8(j) *(const global float8u*)(r + j * si)
#define PACK_ROW(c) *(global float8u*)(p + c * W + g) = \
    (float8u)(r0.s##c, r1.s##c, r2.s##c, r3.s##c, r4.s##c, r5.s##c, r6.s##c, r7.s##c);
inline void pack_block(const global float* restrict s, long si, long sk,
                       global float* restrict p, int rows, int i0, int kn, const int W)
{
    if (kn == KB && i0 + W <= rows && sk == 1) {
        for (int g = 0; g < W; g += 8) {          // 8 rows at a time: an 8 x 8 transpose
            const global float* r = s + g * si;
            const float8u r0 = LOAD8(0), r1 = LOAD8(1), r2 = LOAD8(2), r3 = LOAD8(3),
                          r4 = LOAD8(4), r5 = LOAD8(5), r6 = LOAD8(6), r7 = LOAD8(7);
            PACK_ROW(0) PACK_ROW(1) PACK_ROW(2) PACK_ROW(3)
            PACK_ROW(4) PACK_ROW(5) PACK_ROW(6) PACK_ROW(7)
        }
    } else if (i0 + W <= rows && si == 1) {
        for (int kk = 0; kk < kn; ++kk)
            for (int g = 0; g < W; g += 8)
                *(global float8u*)(p + kk * W + g) = *(const global float8u*)(s + kk * sk + g);
    } else {
        for (int kk = 0; kk < kn; ++kk)
            for (int i = 0; i < W; ++i)
                p[kk * W + i] = i0 + i < rows ? s[i * si + kk * sk] : 0.0f;
    }
}

kernel void pack(const global float* restrict A, long a_bs, long a_si, long a_sk,
                 global float* restrict PA, int M, int a_panels,
                 const global float* restrict B, long b_bs, long b_sj, long b_sk,
                 global float* restrict PB, int N, int b_panels, int b_batch, int K)
{
    const int k = get_global_id(0) * KB, panel = get_global_id(1), bt = get_global_id(2);
    if (k >= K)
        return;
    const int kn = min(KB, K - k);
    if (panel < a_panels) {
        const int i0 = panel * MR;
        pack_block(A + bt * a_bs + i0 * a_si + k * a_sk, a_si, a_sk,
                   PA + (((long)bt * a_panels + panel) * K + k) * MR, M, i0, kn, MR);
    } else if (bt < b_batch) {
        const int j0 = (panel - a_panels) * NR;
        pack_block(B + bt * b_bs + j0 * b_sj + k * b_sk, b_sj, b_sk,
                   PB + (((long)bt * b_panels + panel - a_panels) * K + k) * NR, N, j0, kn, NR);
    }
}


// ---- Small products: one launch, no packing --------------------------------------------------
//
// PoCL spends ~0.1 ms enqueueing each kernel, more than a small product takes, so those skip
// the two packing launches: a 4 x VW block of C per work-item, read straight from the operands
// through strides (op(A)[i][k] at i*a_si + k*a_sk, op(B)[k][j] at k*b_sk + j*b_sj). Each k step
// is four broadcasts of op(A), one vector of op(B) and four vector FMAs: every element of C is
// summed in the KBLOCK blocks the packed kernels sum it in (the same bits), VW columns at a
// time.
// The vectors are spelled out because PoCL's work-item vectoriser leaves a scalar block (and
// private arrays of vectors) scalar here: ~3 GFLOP/s against ~30. Rows and columns past the
// edge are clamped to the last one, computed and never stored.

typedef vec __attribute__((aligned(4))) vec_u;     // a vector load from any float address
// VW floats s apart from p, as one vector (a private array in between leaves PoCL's code scalar)
#define GATHER8(p, s) p[0], p[s], p[2 * s], p[3 * s], p[4 * s], p[5 * s], p[6 * s], p[7 * s]
#if VW == 16
#define GATHER(p, s) (vec)(GATHER8(p, s), GATHER8((p + 8 * s), s))
#else
#define GATHER(p, s) (vec)(GATHER8(p, s))
#endif

inline void direct_block(const global float* restrict A, long a_si, long a_sk,
                         const global float* restrict B, long b_sk, long b_sj,
                         global float* restrict C, const global float* restrict bias,
                         int M, int N, int K, float beta, int flags, int i0, int j0)
{
    const global float* a0 = A + (long)min(i0, M - 1) * a_si;
    const global float* a1 = A + (long)min(i0 + 1, M - 1) * a_si;
    const global float* a2 = A + (long)min(i0 + 2, M - 1) * a_si;
    const global float* a3 = A + (long)min(i0 + 3, M - 1) * a_si;
    vec c0 = (vec)(0.0f), c1 = (vec)(0.0f), c2 = (vec)(0.0f), c3 = (vec)(0.0f);
#define DIRECT_STEP(bv) { const vec bk = (bv); const long ka = k * a_sk; \
        t0 += (vec)(a0[ka]) * bk; t1 += (vec)(a1[ka]) * bk; \
        t2 += (vec)(a2[ka]) * bk; t3 += (vec)(a3[ka]) * bk; }
#define DIRECT_KLOOP(...) K_BLOCKS( \
        vec t0 = (vec)(0.0f); vec t1 = t0; vec t2 = t0; vec t3 = t0;, \
        c0 += t0; c1 += t1; c2 += t2; c3 += t3;, __VA_ARGS__)
    if (b_sj == 1 && j0 + VW <= N) {          // VW whole columns of a row-major op(B)
        const global float* row = B + j0;
        DIRECT_KLOOP(DIRECT_STEP(*(const global vec_u*)(row + k * b_sk)))
    } else if (j0 + VW <= N) {                // VW whole columns, strided (op(B) = B^T)
        const global float* col = B + (long)j0 * b_sj;
        DIRECT_KLOOP(const global float* p = col + k * b_sk;
                     DIRECT_STEP(GATHER(p, b_sj)))
    } else {                                  // past the edge: one clamped load a column
        long bc[VW];
        for (int c = 0; c < VW; ++c)
            bc[c] = (long)min(j0 + c, N - 1) * b_sj;
        DIRECT_KLOOP(float t[VW];
                     for (int c = 0; c < VW; ++c)
                         t[c] = B[bc[c] + k * b_sk];
                     DIRECT_STEP(*(vec*)t))
    }
#undef DIRECT_KLOOP
#undef DIRECT_STEP
    global float* c = C + (long)i0 * N;
    emit(c, bias, c0, j0, N, beta, flags);
    if (i0 + 1 < M)
        emit(c + N, bias, c1, j0, N, beta, flags);
    if (i0 + 2 < M)
        emit(c + 2 * N, bias, c2, j0, N, beta, flags);
    if (i0 + 3 < M)
        emit(c + 3 * N, bias, c3, j0, N, beta, flags);
}

kernel void gemm_direct(const global float* restrict A, long a_bs, long a_si, long a_sk,
                        const global float* restrict B, long b_bs, long b_sk, long b_sj,
                        global float* restrict C, long c_bs, const global float* restrict bias,
                        int M, int N, int K, float beta, int flags)
{
    const int j0 = get_global_id(0) * VW, i0 = get_global_id(1) * 4, bt = get_global_id(2);
    if (i0 >= M || j0 >= N)              // the grid is padded to whole work-groups
        return;
    direct_block(A + bt * a_bs, a_si, a_sk, B + bt * b_bs, b_sk, b_sj, C + bt * c_bs, bias,
                 M, N, K, beta, flags, i0, j0);
}

// Two unrelated small products in one launch (a matmul's two gradients: one enqueue, not
// two); the grid's third dimension picks the product, each block computed as gemm_direct does.
kernel void gemm_direct2(const global float* restrict A0, long a0_si, long a0_sk,
                         const global float* restrict B0, long b0_sk, long b0_sj,
                         global float* restrict C0, int M0, int N0, int K0, float beta0,
                         const global float* restrict A1, long a1_si, long a1_sk,
                         const global float* restrict B1, long b1_sk, long b1_sj,
                         global float* restrict C1, int M1, int N1, int K1, float beta1)
{
    const int j0 = get_global_id(0) * VW, i0 = get_global_id(1) * 4;
    if (get_global_id(2) == 0) {
        if (i0 < M0 && j0 < N0)
            direct_block(A0, a0_si, a0_sk, B0, b0_sk, b0_sj, C0, 0, M0, N0, K0, beta0, 0,
                         i0, j0);
    } else if (i0 < M1 && j0 < N1) {
        direct_block(A1, a1_si, a1_sk, B1, b1_sk, b1_sj, C1, 0, M1, N1, K1, beta1, 0, i0, j0);
    }
}


// ---- GPU variant: 64x64 tiles through local memory, 4x4 register block per work-item ---------
//
// Work-group 16x16; work-item (tx, ty) owns rows ty + 16*i and columns tx + 16*j of the tile,
// so local-memory reads are broadcast/conflict-free and global stores coalesce along rows.
// Tile loads are arranged to coalesce along whichever dimension is contiguous in memory.

#define TM 64
#define TN 64
#define TK 16
#define WG 16
#define WM (TM / WG)
#define WN (TN / WG)

kernel __attribute__((reqd_work_group_size(WG, WG, 1)))
void gemm_tiled(const global float* restrict A, long a_bs, int trans_a,
                const global float* restrict B, long b_bs, int trans_b,
                global float* restrict C, long c_bs, const global float* restrict bias,
                int M, int N, int K, float beta, int flags)
{
    local float As[TK][TM];
    local float Bs[TK][TN];
    const int tx = get_local_id(0), ty = get_local_id(1), tid = ty * WG + tx;
    // the group's rows from its global id, which counts a split launch's offset (_grid.py)
    const int row0 = (get_global_id(1) - ty) / WG * TM, col0 = get_group_id(0) * TN;
    const int bt = get_global_id(2);
    A += bt * a_bs;
    B += bt * b_bs;
    float acc[WM][WN], total[WM][WN];     // acc: the current KBLOCK's sum
    for (int i = 0; i < WM; ++i)
        for (int j = 0; j < WN; ++j)
            acc[i][j] = 0.0f, total[i][j] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += TK) {
        if (k0 % KBLOCK == 0 && k0 > 0) {
            for (int i = 0; i < WM; ++i)
                for (int j = 0; j < WN; ++j)
                    total[i][j] += acc[i][j], acc[i][j] = 0.0f;
        }
        for (int l = 0; l < TK * TM / (WG * WG); ++l) {
            const int e = tid + l * WG * WG;
            const int m = trans_a ? e % TM : e / TK, kk = trans_a ? e / TM : e % TK;
            const int gi = row0 + m, gk = k0 + kk;
            float v = 0.0f;
            if (gi < M && gk < K)
                v = trans_a ? A[(long)gk * M + gi] : A[(long)gi * K + gk];
            As[kk][m] = v;
        }
        for (int l = 0; l < TK * TN / (WG * WG); ++l) {
            const int e = tid + l * WG * WG;
            const int n = trans_b ? e / TK : e % TN, kk = trans_b ? e % TK : e / TN;
            const int gj = col0 + n, gk = k0 + kk;
            float v = 0.0f;
            if (gj < N && gk < K)
                v = trans_b ? B[(long)gj * K + gk] : B[(long)gk * N + gj];
            Bs[kk][n] = v;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int kk = 0; kk < TK; ++kk) {
            float ar[WM], br[WN];
            for (int i = 0; i < WM; ++i)
                ar[i] = As[kk][ty + WG * i];
            for (int j = 0; j < WN; ++j)
                br[j] = Bs[kk][tx + WG * j];
            for (int i = 0; i < WM; ++i)
                for (int j = 0; j < WN; ++j)
                    acc[i][j] += ar[i] * br[j];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    C += bt * c_bs;
    for (int i = 0; i < WM; ++i) {
        const int r = row0 + ty + WG * i;
        if (r >= M)
            continue;
        for (int j = 0; j < WN; ++j) {
            const int col = col0 + tx + WG * j;
            if (col < N) {
                global float* c = C + (long)r * N + col;
                *c = epilogue1(total[i][j] + acc[i][j], c, bias, col, beta, flags);
            }
        }
    }
}
