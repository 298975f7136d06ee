// support/model/flash_attention_tc.cuh — flash attention on the tensor cores:
// the same outputs as support/model/flash_attention.cuh (same arguments, same
// layouts, `att` holding each row's log-sum-exp), with the products done by
// warp-wide mma.sync (support/model/tensor_cores.cuh) instead of scalar
// FMAs: TF32 operands, or bf16 ones under --precision bf16 (twice the rate).
// Per batch entry b and query head h, kv head r = h / (H / R),
// scale = 1 / sqrt(hd), causal (key u <= query t):
//   forward    S = scale Q K^T,  P = softmax_u(S),  O = P V,  lse[t] = log sum_u e^S[t][u]
//   backward   P = e^(S - lse) again,  D[t] = dO[t] . O[t],  dP = dO V^T,  dS = P (dP - D),
//              dV = P^T dO,  dK = scale dS^T Q,  dQ = scale dS K
//
// Tiles. A block is 4 warps. In the backward kernels it owns 64 rows, 16 a
// warp: queries in the dQ kernel, keys in the dK/dV kernel; in the forward 32
// queries a warp (two blocks of 16 rows, 128 a block) at head dims up to 64, 16
// at 128 (where 32 would not fit the registers), so that each fragment of K or V
// read from shared memory feeds two mmas. The other side streams
// through shared memory in tiles of TILE rows (keys; queries for dK/dV),
// copied by cp.async: tile j + 1 lands while tile j is used (two stages). A
// 16-row block's slice of S is (16, TILE): TILE / 8 mma tiles of 16 x 8, HD / k steps
// of the mma's k (8 in TF32, 16 in bf16); a slice of the output (16, HD) is HD / 8 mma tiles.
//   HD (head dim padded)   8-64     128
//   rows a warp, forward   32       16
//   TILE, forward          64       32
//   TILE, dQ and dK/dV     32       16
// Everything a lane accumulates stays in its registers: its fragments of S
// (TILE / 2 floats a 16-row block), of O or dQ or dK and dV (HD / 2 each). Tiles in shared
// memory have rows of PAD = HD + 4 floats, which makes TF32's fragment loads
// free of bank conflicts (the 8 groups of a warp read 8 rows at once); bf16's
// reads of neighbouring columns meet 2-way conflicts (float32 tiles: not yet 16-bit ones).
//
// The online softmax (forward), per query row, in base-2 units (x = S log2 e):
// the running max mx and sum l of 2^(x - mx); each tile raises mx to the
// tile's max, rescales l and O by 2^(old mx - new mx), adds the tile's
// 2^(x - mx) to l and P V to O. At the end O / l, and lse = (mx + log2 l) ln 2.
// A row's 4 lanes each keep their part of l and of the max; shuffles join them.
//
// One product's result feeds the next without leaving the registers: the
// accumulator of P (16 rows, 8 keys a tile) is the A operand of P V (Tc::as_a).
// In TF32 it is read in the column order 0 2 4 6 1 3 5 7 (a lane holds columns
// 2t and 2t + 1, which A wants at t and t + 4), and V's rows in that same
// order (Tc::b_paired): the sum over the 8 keys is the same, in another order.
// In bf16 two accumulator tiles (16 keys) are exactly the A fragment a lane needs.
//
// The causal mask is applied only where a tile reaches past the diagonal of a
// warp's rows; tiles wholly after a warp's rows are skipped by that warp.
// Positions past T are zeros in the tiles (copied as zeros), which add
// nothing; the rows past T a block owns are computed and not stored.
//
// No atomics: every output float is one lane's sum in a fixed order, and the
// dK/dV kernel visits its group's query heads, then their query tiles, in
// order: the same bits for any schedule of blocks and threads.
// TF32: every operand is rounded with cvt.rna (to_tf32): a staged tile once, in place, by
// the threads that copied it (flash_tc_round_rows), the queries of the forward as they are
// loaded into their fragments, P as it becomes an A operand; the sums are float's. Errors are TF32's (about 1e-3 relative), as
// cuBLAS's products under --tf32. bf16 (Tc<true>): rounded to nearest even
// (pack_bf16) as loaded, as the matmul path's bf16 products round them; the
// forward's P is rounded before it is divided by the row's sum (the products'
// path rounds the divided one): a difference of bf16's size, about 2e-3 in O.
//
// Head dims: 1 to 128, padded with zeros to HD = 8 (TF32 only), 16, 32, 64 or 128; rows
// copy in 16-byte pieces when hd is a multiple of 4 (then q, k, v, out and dout
// must be 16-byte aligned; the model's buffers are 64-byte aligned), else a
// float at a time. flash_tc_refusal says why a shape or a GPU is not taken.
//
// lime.cu's attention dispatchers may call it on the GPU.
#pragma once
#include "support/model/device.cuh"
#include "support/model/products.cuh"
#include "support/model/tensor_cores.cuh"
#ifdef LIME_GPU

template <int HD>
struct FlashTC {
    static constexpr int WARPS = 4, THREADS = 32 * WARPS;
    static constexpr int ROWS = 16 * WARPS;                // a block's own rows, backward (queries, or keys for dK/dV)
    static constexpr int FWD_M = HD <= 64 ? 2 : 1;         // row blocks of 16 a warp owns, forward (registers: qa, o, s)
    static constexpr int FWD_ROWS = 16 * FWD_M * WARPS;    // a block's own queries, forward
    static constexpr int FWD_TILE = HD >= 128 ? 32 : 64;   // keys a streamed tile holds, forward
    static constexpr int BWD_TILE = HD >= 128 ? 16 : 32;   // keys (dQ) or queries (dK/dV) a streamed tile holds
    static constexpr int PAD = HD + 4;                     // floats a row of a tile takes in shared memory
    // Shared memory, in floats. Forward: K, V (2 stages of FWD_TILE rows). dQ: Q, dO (ROWS rows),
    // K, V (2 stages of BWD_TILE). dK/dV: K, V (ROWS), Q, dO (2 stages of BWD_TILE). (lse and D are
    // read from global memory into registers: at HD 128 that is what fits 99 KiB, an sm_86's or sm_89's block.)
    static constexpr int FWD_FLOATS = 2 * 2 * FWD_TILE * PAD;
    static constexpr int DQ_FLOATS = 2 * ROWS * PAD + 2 * 2 * BWD_TILE * PAD;
    static constexpr int DKV_FLOATS = 2 * ROWS * PAD + 2 * 2 * BWD_TILE * PAD;
};

// The forward's loops over a warp's row blocks (m) unrolled: left to itself nvcc kept the
// softmax's (a long body) a loop, and s, o, mx and l, indexed by m, in local memory.
#ifdef LIME_EMU
#define FLASH_TC_UNROLL
#else
#define FLASH_TC_UNROLL _Pragma("unroll")
#endif

static const float FLASH_TC_LOG2E = 1.4426950408889634f, FLASH_TC_LN2 = 0.6931471805599453f;

// ---------------------------------------------------------------------------
// Tiles and fragments. A warp's rows are 16 rows of a tile (x, row stride PAD);
// g = lane / 4 and t = lane % 4 as in support/model/tensor_cores.cuh.

// tile (rows, PAD) = rows r0 .. r0 + rows - 1 of x (row i at x + i * stride), cp.async copies
// shared by the block's threads; zeros past row T and past column hd. When hd is a multiple of
// 4, 16 bytes a turn (a quarter-warp's 8 pieces fill the 32 banks once: free of conflicts); else
// one float a turn, the warp's lanes on consecutive floats (also free: 4 bytes apart).
template <int HD>
__device__ void flash_tc_copy_rows(float* tile, const float* x, size_t stride, int r0, int rows, int T, int hd) {
    constexpr int PAD = FlashTC<HD>::PAD;
    if (hd % 4 == 0) {
        for (int c = threadIdx.x; c < rows * (HD / 4); c += blockDim.x) {
            int i = c / (HD / 4), col = c % (HD / 4) * 4;
            bool inside = r0 + i < T && col < hd;
            copy_async_16(tile + i * PAD + col, inside ? x + (size_t)(r0 + i) * stride + col : x, inside);
        }
    } else {
        for (int c = threadIdx.x; c < rows * HD; c += blockDim.x) {
            int i = c / HD, col = c % HD;
            bool inside = r0 + i < T && col < hd;
            copy_async_4(tile + i * PAD + col, inside ? x + (size_t)(r0 + i) * stride + col : x, inside);
        }
    }
}

// TF32: what this thread copied with flash_tc_copy_rows (the same pieces: same tile, rows, hd,
// threads) rounded in place to TF32 (to_tf32's bits), once, when it has landed (after the
// thread's __pipeline_wait_prior, before the barrier that hands the tile to the block): the
// warps' fragment loads need no conversion (Tc<false>::a staged, b, b_paired). Same accesses
// as the copies, so as free of bank conflicts. bf16 tiles stay float32.
template <int HD, bool BF16>
__device__ void flash_tc_round_rows(float* tile, int rows, int hd) {
    constexpr int PAD = FlashTC<HD>::PAD;
    if (BF16) return;
    if (hd % 4 == 0) {
        for (int c = threadIdx.x; c < rows * (HD / 4); c += blockDim.x)
            round_tf32_16(tile + c / (HD / 4) * PAD + c % (HD / 4) * 4);
    } else {
        for (int c = threadIdx.x; c < rows * HD; c += blockDim.x) {
            float* x = tile + c / HD * PAD + c % HD;
            *x = __uint_as_float(to_tf32(*x));
        }
    }
}

// The operands in either precision (--precision): Tc<false> TF32, one float a
// register, an mma's k = 8; Tc<true> bf16, two a register (pack_bf16), k = 16.
// The fragments are tensor_cores.cuh's table; x(i, j) reads A's row i, column j
// of the mma's k, y(j, n) reads B's row j (of k), column n.
template <bool BF16> struct Tc;
template <> struct Tc<false> {
    static constexpr int K = 8;
    // staged: the operand is a tile flash_tc_round_rows rounded already (its bits as they are); else rounded here
    template <class X> __device__ static __forceinline__ void a(unsigned a[4], X x, bool staged = false) {
        int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
        a[0] = tf32_bits(x(g, t), staged), a[1] = tf32_bits(x(g + 8, t), staged);
        a[2] = tf32_bits(x(g, t + 4), staged), a[3] = tf32_bits(x(g + 8, t + 4), staged);
    }
    template <class Y> __device__ static __forceinline__ void b(unsigned b[2], Y y) {  // from a staged tile
        int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
        b[0] = __float_as_uint(y(t, g)), b[1] = __float_as_uint(y(t + 4, g));
    }
    __device__ static __forceinline__ unsigned tf32_bits(float x, bool staged) {
        return staged ? __float_as_uint(x) : to_tf32(x);
    }
    // a = accumulator p[kk] (16 x 8) as an A fragment, its columns in the order 0 2 4 6 1 3 5 7 (a lane
    // holds columns 2t and 2t + 1, which A wants at t and t + 4); b_paired reads B's rows in that order.
    __device__ static __forceinline__ void as_a(unsigned a[4], const float (*p)[4], int kk) {
        a[0] = to_tf32(p[kk][0]), a[1] = to_tf32(p[kk][2]), a[2] = to_tf32(p[kk][1]), a[3] = to_tf32(p[kk][3]);
    }
    template <class Y> __device__ static __forceinline__ void b_paired(unsigned b[2], Y y) {  // a staged tile
        int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
        b[0] = __float_as_uint(y(2 * t, g)), b[1] = __float_as_uint(y(2 * t + 1, g));
    }
    __device__ static __forceinline__ void mma(float d[4], const unsigned a[4], const unsigned b[2]) {
        mma_m16n8k8_tf32(d, a, b, d);
    }
};
template <> struct Tc<true> {
    static constexpr int K = 16;
    template <class X> __device__ static __forceinline__ void a(unsigned a[4], X x, bool = false) {
        int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
        for (int i = 0; i < 4; i++) {  // rows g, g + 8, g, g + 8; columns 2t, 2t, 2t + 8, 2t + 8 (and each + 1)
            int row = g + 8 * (i % 2), col = 2 * t + 8 * (i / 2);
            a[i] = pack_bf16(x(row, col), x(row, col + 1));
        }
    }
    template <class Y> __device__ static __forceinline__ void b(unsigned b[2], Y y) {
        int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
        b[0] = pack_bf16(y(2 * t, g), y(2 * t + 1, g)), b[1] = pack_bf16(y(2 * t + 8, g), y(2 * t + 9, g));
    }
    // a = accumulators p[2kk], p[2kk + 1] (16 x 16) as an A fragment: a lane holds what A wants, in order.
    __device__ static __forceinline__ void as_a(unsigned a[4], const float (*p)[4], int kk) {
        const float *lo = p[2 * kk], *hi = p[2 * kk + 1];
        a[0] = pack_bf16(lo[0], lo[1]), a[1] = pack_bf16(lo[2], lo[3]);
        a[2] = pack_bf16(hi[0], hi[1]), a[3] = pack_bf16(hi[2], hi[3]);
    }
    template <class Y> __device__ static __forceinline__ void b_paired(unsigned b[2], Y y) { Tc<true>::b(b, y); }
    __device__ static __forceinline__ void mma(float d[4], const unsigned a[4], const unsigned b[2]) {
        mma_m16n8k16_bf16(d, a, b, d);
    }
};

// s (16, TILE) = x y^T: the warp's 16 rows x (HD columns) against TILE rows y, both in shared memory.
template <int HD, int TILE, bool BF16>
__device__ __forceinline__ void mma_rows_rows(float s[TILE / 8][4], const float* x, const float* y) {
    using Op = Tc<BF16>;
    constexpr int PAD = FlashTC<HD>::PAD, K = Op::K;
    for (int n = 0; n < TILE / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    for (int kk = 0; kk < HD / K; kk++) {
        unsigned a[4], b[2];
        Op::a(a, [&](int i, int j) { return x[i * PAD + K * kk + j]; }, true);
        for (int n = 0; n < TILE / 8; n++) {
            Op::b(b, [&](int j, int c) { return y[(8 * n + c) * PAD + K * kk + j]; });  // B = y^T
            Op::mma(s[n], a, b);
        }
    }
}
// acc (16, HD) += p y: p the warp's (16, TILE) accumulator, y TILE rows (HD columns) in shared memory.
template <int HD, int TILE, bool BF16>
__device__ __forceinline__ void mma_acc_rows(float acc[HD / 8][4], const float p[TILE / 8][4], const float* y) {
    using Op = Tc<BF16>;
    constexpr int PAD = FlashTC<HD>::PAD, K = Op::K;
    for (int kk = 0; kk < TILE / K; kk++) {
        unsigned a[4], b[2];
        Op::as_a(a, p, kk);
        for (int n = 0; n < HD / 8; n++) {
            Op::b_paired(b, [&](int j, int c) { return y[(K * kk + j) * PAD + 8 * n + c]; });
            Op::mma(acc[n], a, b);
        }
    }
}

// ---------------------------------------------------------------------------
// Forward. grid (ceil(T / FWD_ROWS), H, B), 128 threads: the block's queries
// q0 .. q0 + FWD_ROWS - 1 of head h, warp w's FWD_M blocks of 16 from q0 + 16 FWD_M w
// (32 rows a warp at head dims up to 64, 16 at 128); key tiles of TILE = FWD_TILE.
// q, out (B, T, H, hd); k, v (R, B, T, hd), head-major; lse (B, H, T). The
// warp's queries are A fragments in registers for the whole kernel; each B fragment
// read from a tile (a key's or a value's) feeds the warp's FWD_M mmas.
template <int HD, bool BF16>
__global__ void __launch_bounds__(FlashTC<HD>::THREADS)
flash_tc_forward_kernel(float* out, float* lse, const float* q, const float* k, const float* v, int T, int H, int R,
                        int hd, float scale) {
    using F = FlashTC<HD>;
    using Op = Tc<BF16>;
    constexpr int TILE = F::FWD_TILE, PAD = F::PAD, K = Op::K, M = F::FWD_M;
    // Keys a pass of the online softmax takes: the tile, or half of it in TF32 at head dim 64, where s
    // (M x KEYS / 2 floats a lane) does not fit beside qa and o at 64 (sm_80's ptxas spilled)
    constexpr int KEYS = !BF16 && M == 2 && HD == 64 ? TILE / 2 : TILE;
    DYNAMIC_SHARED(float, smem);
    float *ks = smem, *vs = smem + 2 * TILE * PAD;  // (2, TILE, PAD) each: keys, values; stage j % 2 holds tile j
    int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    int q0 = (gridDim.x - 1 - blockIdx.x) * F::FWD_ROWS;  // the last queries, which see the most keys, start first
    int h = blockIdx.y, b = blockIdx.z, r = h / (H / R), qw = q0 + 16 * M * warp;  // row block m: qw + 16 m ..
    const float* kb = k + ((size_t)r * gridDim.z + b) * T * hd;  // kv head r's rows of batch entry b
    const float* vb = v + ((size_t)r * gridDim.z + b) * T * hd;
    const float* qb = q + ((size_t)b * T * H + h) * hd;          // query t at qb + t * H * hd
    int tiles = (min(T, q0 + F::FWD_ROWS) + TILE - 1) / TILE;    // the block's last query sees keys < q0 + FWD_ROWS

    flash_tc_copy_rows<HD>(ks, kb, hd, 0, TILE, T, hd);
    flash_tc_copy_rows<HD>(vs, vb, hd, 0, TILE, T, hd);
    __pipeline_commit();
    unsigned qa[M][HD / K][4];  // the warp's queries as A fragments: row block m, head dims K kk .. K kk + K - 1
    FLASH_TC_UNROLL
    for (int m = 0; m < M; m++)
        for (int kk = 0; kk < HD / K; kk++)
            Op::a(qa[m][kk], [&](int i, int j) {
                int row = qw + 16 * m + i, col = K * kk + j;
                return row < T && col < hd ? qb[(size_t)row * H * hd + col] : 0.0f;
            });
    float o[M][HD / 8][4] = {};  // the warp's rows of O, unnormalised
    float mx[M][2], l[M][2];     // rows g and g + 8 of block m: max, and this lane's part of l
    FLASH_TC_UNROLL
    for (int m = 0; m < M; m++) mx[m][0] = mx[m][1] = -INFINITY, l[m][0] = l[m][1] = 0.0f;
    float scale2 = scale * FLASH_TC_LOG2E;

    for (int j = 0; j < tiles; j++) {
        float *kt = ks + j % 2 * TILE * PAD, *vt = vs + j % 2 * TILE * PAD;
        if (j + 1 < tiles) {  // the next tile, into the other stage (free since the barrier ending tile j - 1)
            flash_tc_copy_rows<HD>(ks + (j + 1) % 2 * TILE * PAD, kb, hd, (j + 1) * TILE, TILE, T, hd);
            flash_tc_copy_rows<HD>(vs + (j + 1) % 2 * TILE * PAD, vb, hd, (j + 1) * TILE, TILE, T, hd);
        }
        __pipeline_commit();
        __pipeline_wait_prior(1);  // this thread's copies of tile j have landed (tile j + 1's may not have)
        flash_tc_round_rows<HD, BF16>(kt, TILE, hd);
        flash_tc_round_rows<HD, BF16>(vt, TILE, hd);
        __syncthreads();           // ... and every thread's
        for (int u1 = 0; u1 < TILE; u1 += KEYS) {  // the tile's keys u1 .. u1 + KEYS - 1: one pass of the softmax
            int u0 = j * TILE + u1;
            const float *kp = kt + u1 * PAD, *vp = vt + u1 * PAD;
            if (u0 <= qw + 16 * M - 1) {  // else all of these keys come after the warp's queries
                // s (16, KEYS) a row block = Q K^T, in base-2 units, masked where a key is after its query
                float s[M][KEYS / 8][4];
                FLASH_TC_UNROLL
                for (int m = 0; m < M; m++)
                    for (int n = 0; n < KEYS / 8; n++) s[m][n][0] = s[m][n][1] = s[m][n][2] = s[m][n][3] = 0.0f;
                for (int kk = 0; kk < HD / K; kk++)
                    for (int n = 0; n < KEYS / 8; n++) {
                        unsigned bk[2];
                        Op::b(bk, [&](int j, int c) { return kp[(8 * n + c) * PAD + K * kk + j]; });  // B = K^T
                        FLASH_TC_UNROLL
                        for (int m = 0; m < M; m++) Op::mma(s[m][n], qa[m][kk], bk);
                    }
                bool diagonal = u0 + KEYS - 1 > qw;  // some key of the pass after some query of the warp
                FLASH_TC_UNROLL
                for (int m = 0; m < M; m++) {
                    // (a row block whose queries all come before the pass's keys: every s -inf, its max stays,
                    // rescale 1 and P 0: its rows' O and l unchanged, bit for bit, as if the pass were skipped)
                    float tile_mx[2] = {-INFINITY, -INFINITY};
                    for (int n = 0; n < KEYS / 8; n++)
                        for (int i = 0; i < 4; i++) {  // element i: row g + 8 (i / 2), key 8n + 2t + i % 2
                            int row = qw + 16 * m + g + 8 * (i / 2), key = u0 + 8 * n + 2 * t + i % 2;
                            s[m][n][i] = diagonal && key > row ? -INFINITY : s[m][n][i] * scale2;
                            tile_mx[i / 2] = fmaxf(tile_mx[i / 2], s[m][n][i]);
                        }
                    float rescale[2];
                    for (int i = 0; i < 2; i++) {  // the row's 4 lanes share their maxima; key 0 makes the first finite
                        tile_mx[i] = fmaxf(tile_mx[i], __shfl_xor_sync(0xffffffffu, tile_mx[i], 1));
                        tile_mx[i] = fmaxf(tile_mx[i], __shfl_xor_sync(0xffffffffu, tile_mx[i], 2));
                        float new_mx = fmaxf(mx[m][i], tile_mx[i]);
                        rescale[i] = exp2f(mx[m][i] - new_mx);
                        mx[m][i] = new_mx;
                        l[m][i] *= rescale[i];
                    }
                    for (int n = 0; n < KEYS / 8; n++)
                        for (int i = 0; i < 4; i++) {
                            s[m][n][i] = exp2f(s[m][n][i] - mx[m][i / 2]);  // P, unnormalised
                            l[m][i / 2] += s[m][n][i];
                        }
                    for (int n = 0; n < HD / 8; n++)
                        for (int i = 0; i < 4; i++) o[m][n][i] *= rescale[i / 2];
                }
                for (int kk = 0; kk < KEYS / K; kk++) {  // O += P V
                    unsigned pa[M][4], bv[2];
                    FLASH_TC_UNROLL
                    for (int m = 0; m < M; m++) Op::as_a(pa[m], s[m], kk);
                    for (int n = 0; n < HD / 8; n++) {
                        Op::b_paired(bv, [&](int j, int c) { return vp[(K * kk + j) * PAD + 8 * n + c]; });
                        FLASH_TC_UNROLL
                        for (int m = 0; m < M; m++) Op::mma(o[m][n], pa[m], bv);
                    }
                }
            }
        }
        __syncthreads();  // everyone is done with this stage before tile j + 2 is copied into it
    }

    float* ob = out + ((size_t)b * T * H + h) * hd;
    FLASH_TC_UNROLL
    for (int m = 0; m < M; m++) {
        for (int i = 0; i < 2; i++) {  // the row's sum over its 4 lanes (the butterfly leaves it in each)
            l[m][i] += __shfl_xor_sync(0xffffffffu, l[m][i], 1);
            l[m][i] += __shfl_xor_sync(0xffffffffu, l[m][i], 2);
        }
        for (int n = 0; n < HD / 8; n++)
            for (int i = 0; i < 4; i++) {
                int row = qw + 16 * m + g + 8 * (i / 2), col = 8 * n + 2 * t + i % 2;
                if (row < T && col < hd) ob[(size_t)row * H * hd + col] = o[m][n][i] / l[m][i / 2];
            }
        for (int i = 0; i < 2; i++) {
            int row = qw + 16 * m + g + 8 * i;
            if (t == 0 && row < T) lse[((size_t)b * H + h) * T + row] = (mx[m][i] + log2f(l[m][i])) * FLASH_TC_LN2;
        }
    }
}

// ---------------------------------------------------------------------------
// Backward, dQ (and D). grid (ceil(T / 64), H, B), 128 threads: the block's
// queries q0 .. q0 + 63 of head h; key tiles of TILE = BWD_TILE. Per tile, for
// the warp's 16 queries: S = Q K^T, dP = dO V^T, P = 2^(S log2 e - lse log2 e),
// dS = P (dP - D), dQ += dS K. Writes dq (B, T, H, hd) and D (B, H, T), which
// the dK/dV kernel reads: D[t] = dO[t] . O[t], one thread a row, in order.
// (The launch bound's 1, a block an SM at least: ptxas's own choice held bf16's HD 128 to 128 registers, spilling.)
template <int HD, bool BF16>
__global__ void __launch_bounds__(FlashTC<HD>::THREADS, 1)
flash_tc_backward_q_kernel(float* dq, float* D, const float* dout, const float* out, const float* q, const float* k,
                           const float* v, const float* lse, int T, int H, int R, int hd, float scale) {
    using F = FlashTC<HD>;
    constexpr int TILE = F::BWD_TILE, PAD = F::PAD, ROWS = F::ROWS;
    DYNAMIC_SHARED(float, smem);
    float *qs = smem, *dos = qs + ROWS * PAD;         // (ROWS, PAD) each: the block's queries and their dO
    float *ks = dos + ROWS * PAD, *vs = ks + 2 * TILE * PAD;  // (2, TILE, PAD) each: key and value tiles
    int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    int q0 = (gridDim.x - 1 - blockIdx.x) * ROWS;
    int h = blockIdx.y, b = blockIdx.z, r = h / (H / R), qw = q0 + 16 * warp;
    const float* kb = k + ((size_t)r * gridDim.z + b) * T * hd;
    const float* vb = v + ((size_t)r * gridDim.z + b) * T * hd;
    size_t first = ((size_t)b * T * H + h) * hd, stride = (size_t)H * hd;  // query t of q, dout, out, dq
    int tiles = (min(T, q0 + ROWS) + TILE - 1) / TILE;

    flash_tc_copy_rows<HD>(qs, q + first, stride, q0, ROWS, T, hd);
    flash_tc_copy_rows<HD>(dos, dout + first, stride, q0, ROWS, T, hd);
    flash_tc_copy_rows<HD>(ks, kb, hd, 0, TILE, T, hd);
    flash_tc_copy_rows<HD>(vs, vb, hd, 0, TILE, T, hd);
    __pipeline_commit();
    size_t row0 = ((size_t)b * H + h) * T;  // lse and D of (b, h)
    int d_row = q0 + (int)threadIdx.x;  // the row of D this thread sums
    if (threadIdx.x < ROWS && d_row < T) {
        const float *dor = dout + first + (size_t)d_row * stride, *orow = out + first + (size_t)d_row * stride;
        float d = 0.0f;
        for (int i = 0; i < hd; i++) d += dor[i] * orow[i];
        D[row0 + d_row] = d;
    }
    __syncthreads();  // the block's D is written
    float lse2[2], d2[2];  // rows g and g + 8: lse in base-2 units, and D
    for (int i = 0; i < 2; i++) {
        int row = qw + g + 8 * i;
        lse2[i] = row < T ? lse[row0 + row] * FLASH_TC_LOG2E : 0.0f;
        d2[i] = row < T ? D[row0 + row] : 0.0f;
    }
    float dqa[HD / 8][4] = {};  // the warp's rows of dQ / scale
    float scale2 = scale * FLASH_TC_LOG2E;

    for (int j = 0; j < tiles; j++) {
        float *kt = ks + j % 2 * TILE * PAD, *vt = vs + j % 2 * TILE * PAD;
        if (j + 1 < tiles) {
            flash_tc_copy_rows<HD>(ks + (j + 1) % 2 * TILE * PAD, kb, hd, (j + 1) * TILE, TILE, T, hd);
            flash_tc_copy_rows<HD>(vs + (j + 1) % 2 * TILE * PAD, vb, hd, (j + 1) * TILE, TILE, T, hd);
        }
        __pipeline_commit();
        __pipeline_wait_prior(1);
        if (j == 0) flash_tc_round_rows<HD, BF16>(qs, 2 * ROWS, hd);  // the queries and their dO, landed with tile 0
        flash_tc_round_rows<HD, BF16>(kt, TILE, hd);
        flash_tc_round_rows<HD, BF16>(vt, TILE, hd);
        __syncthreads();
        int u0 = j * TILE;
        if (u0 <= qw + 15) {
            float s[TILE / 8][4], dp[TILE / 8][4];
            mma_rows_rows<HD, TILE, BF16>(s, qs + 16 * warp * PAD, kt);    // S = Q K^T
            mma_rows_rows<HD, TILE, BF16>(dp, dos + 16 * warp * PAD, vt);  // dP = dO V^T
            bool diagonal = u0 + TILE - 1 > qw;
            for (int n = 0; n < TILE / 8; n++)
                for (int i = 0; i < 4; i++) {
                    int row = qw + g + 8 * (i / 2), key = u0 + 8 * n + 2 * t + i % 2;
                    float p = diagonal && key > row ? 0.0f : exp2f(s[n][i] * scale2 - lse2[i / 2]);
                    s[n][i] = p * (dp[n][i] - d2[i / 2]);  // dS
                }
            mma_acc_rows<HD, TILE, BF16>(dqa, s, kt);  // dQ += dS K
        }
        __syncthreads();
    }

    for (int n = 0; n < HD / 8; n++)
        for (int i = 0; i < 4; i++) {
            int row = qw + g + 8 * (i / 2), col = 8 * n + 2 * t + i % 2;
            if (row < T && col < hd) dq[first + (size_t)row * stride + col] = scale * dqa[n][i];
        }
}

// ---------------------------------------------------------------------------
// Backward, dK and dV. grid (ceil(T / 64), R, B), 128 threads: the block's keys
// u0 .. u0 + 63 of kv head r, warp w's u0 + 16w .. + 15, with their K and V in
// shared memory for the whole kernel; query tiles of TILE = BWD_TILE stream
// through, head by head of the group (h = r * H/R, ...), each from the first
// tile holding a query >= u0 to the last. Per tile, for the warp's 16 keys:
// S^T = K Q^T, dP^T = V dO^T, P^T = 2^(S^T log2 e - lse log2 e), dV += P^T dO,
// dS^T = P^T (dP^T - D), dK += dS^T Q. Writes scale dK to dk, dV to dv or adds it (add_dv) (R, B, T, hd).
template <int HD, bool BF16>
__global__ void __launch_bounds__(FlashTC<HD>::THREADS)
flash_tc_backward_kv_kernel(float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v,
                            const float* lse, const float* D, int T, int H, int R, int hd, float scale, int add_dv) {
    using F = FlashTC<HD>;
    constexpr int TILE = F::BWD_TILE, PAD = F::PAD, ROWS = F::ROWS;
    DYNAMIC_SHARED(float, smem);
    float *ks = smem, *vs = ks + ROWS * PAD;             // (ROWS, PAD) each: the block's keys and values
    float *qs = vs + ROWS * PAD, *dos = qs + 2 * TILE * PAD;  // (2, TILE, PAD) each: query and dO tiles
    int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    int u0 = blockIdx.x * ROWS, r = blockIdx.y, b = blockIdx.z;  // the first keys see the most queries: first
    int uw = u0 + 16 * warp, n_rep = H / R;
    int skipped = u0 / TILE;  // query tiles before the block's first key see none of its keys
    int per_head = (T + TILE - 1) / TILE - skipped, items = n_rep * per_head;
    size_t kv0 = ((size_t)r * gridDim.z + b) * T * hd, stride = (size_t)H * hd;
    // item j: head h = r * n_rep + j / per_head, queries t0 = (skipped + j % per_head) * TILE ..
    auto copy_item = [&](int j, int stage) {
        int h = r * n_rep + j / per_head, t0 = (skipped + j % per_head) * TILE;
        size_t first = ((size_t)b * T * H + h) * hd;
        flash_tc_copy_rows<HD>(qs + stage * TILE * PAD, q + first, stride, t0, TILE, T, hd);
        flash_tc_copy_rows<HD>(dos + stage * TILE * PAD, dout + first, stride, t0, TILE, T, hd);
    };

    flash_tc_copy_rows<HD>(ks, k + kv0, hd, u0, ROWS, T, hd);
    flash_tc_copy_rows<HD>(vs, v + kv0, hd, u0, ROWS, T, hd);
    copy_item(0, 0);
    __pipeline_commit();
    float dka[HD / 8][4] = {}, dva[HD / 8][4] = {};  // the warp's rows of dK / scale and dV
    float scale2 = scale * FLASH_TC_LOG2E;

    for (int j = 0; j < items; j++) {
        int stage = j % 2, h = r * n_rep + j / per_head, t0 = (skipped + j % per_head) * TILE;
        float *qt = qs + stage * TILE * PAD, *dot = dos + stage * TILE * PAD;
        size_t row0 = ((size_t)b * H + h) * T + t0;  // lse and D of (b, h)'s query t0
        if (j + 1 < items) copy_item(j + 1, 1 - stage);
        __pipeline_commit();
        __pipeline_wait_prior(1);
        if (j == 0) flash_tc_round_rows<HD, BF16>(ks, 2 * ROWS, hd);  // the keys and values, landed with item 0
        flash_tc_round_rows<HD, BF16>(qt, TILE, hd);
        flash_tc_round_rows<HD, BF16>(dot, TILE, hd);
        __syncthreads();
        if (t0 + TILE - 1 >= uw) {  // else all of the tile's queries come before the warp's keys
            float st[TILE / 8][4], dpt[TILE / 8][4];
            mma_rows_rows<HD, TILE, BF16>(st, ks + 16 * warp * PAD, qt);    // S^T = K Q^T
            mma_rows_rows<HD, TILE, BF16>(dpt, vs + 16 * warp * PAD, dot);  // dP^T = V dO^T
            bool diagonal = t0 < uw + 15;  // some query of the tile before some key of the warp
            float lseq[TILE / 8][2], Dq[TILE / 8][2];  // lse and D of the lane's queries 8n + 2t + e; 0 past T
            for (int n = 0; n < TILE / 8; n++)
                for (int e = 0; e < 2; e++) {
                    int query = 8 * n + 2 * t + e;
                    lseq[n][e] = t0 + query < T ? lse[row0 + query] : 0.0f;
                    Dq[n][e] = t0 + query < T ? D[row0 + query] : 0.0f;
                }
            for (int n = 0; n < TILE / 8; n++)
                for (int i = 0; i < 4; i++) {  // element i: key g + 8 (i / 2), query 8n + 2t + i % 2
                    int key = uw + g + 8 * (i / 2), query = 8 * n + 2 * t + i % 2;
                    float x = st[n][i] * scale2 - lseq[n][i % 2] * FLASH_TC_LOG2E;
                    float p = diagonal && t0 + query < key ? 0.0f : exp2f(x);
                    st[n][i] = p;                                 // P^T
                    dpt[n][i] = p * (dpt[n][i] - Dq[n][i % 2]);  // dS^T
                }
            mma_acc_rows<HD, TILE, BF16>(dva, st, dot);  // dV += P^T dO
            mma_acc_rows<HD, TILE, BF16>(dka, dpt, qt);  // dK += dS^T Q
        }
        __syncthreads();
    }

    for (int n = 0; n < HD / 8; n++)
        for (int i = 0; i < 4; i++) {
            int row = uw + g + 8 * (i / 2), col = 8 * n + 2 * t + i % 2;
            if (row < T && col < hd) {
                size_t e = kv0 + (size_t)row * hd + col;
                dk[e] = scale * dka[n][i];
                dv[e] = add_dv ? dv[e] + dva[n][i] : dva[n][i];
            }
        }
}

// ---------------------------------------------------------------------------
// Launchers, with the arguments and layouts of flash_attention_forward_gpu and
// flash_attention_backward_gpu (support/model/flash_attention.cuh).

// Calls f(w) with w the compile-time padded head dim HD for hd <= 128: at least bf16's mma k, 16.
template <bool BF16, class Fn>
static void with_flash_tc_width(int hd, Fn f) {
    if constexpr (!BF16)
        if (hd <= 8) return f(std::integral_constant<int, 8>());
    if (hd <= 16) f(std::integral_constant<int, 16>());
    else if (hd <= 32) f(std::integral_constant<int, 32>());
    else if (hd <= 64) f(std::integral_constant<int, 64>());
    else f(std::integral_constant<int, 128>());
}
// Calls f(w, bf) with w as above and bf the operands' precision: std::true_type for bf16.
template <class Fn>
static void with_flash_tc_kernels(int hd, bool bf16, Fn f) {
    if (bf16) with_flash_tc_width<true>(hd, [&](auto w) { f(w, std::true_type()); });
    else with_flash_tc_width<false>(hd, [&](auto w) { f(w, std::false_type()); });
}
// The shared memory the widest of the three kernels needs a block at head dim hd, in either precision.
static size_t flash_tc_shared_bytes(int hd) {
    size_t floats = 0;
    with_flash_tc_width<true>(hd, [&](auto w) {  // (bf16's width: the same as TF32's, or 16 for TF32's 8)
        using F = FlashTC<decltype(w)::value>;
        floats = std::max({F::FWD_FLOATS, F::DQ_FLOATS, F::DKV_FLOATS});
    });
    return floats * sizeof(float);
}
// Why the tensor-core kernels do not take head dim hd on a GPU whose blocks may
// have smem_optin bytes of shared memory (cudaDevAttrMaxSharedMemoryPerBlockOptin);
// empty when they do. For --attention auto's fallback, and --attention flash's refusal.
inline std::string flash_tc_refusal(int hd, size_t smem_optin) {
    if (hd < 1 || hd > FLASH_MAX_HD)
        return "the tensor-core flash attention takes head dims up to " + std::to_string(FLASH_MAX_HD) +
               ", this model has " + std::to_string(hd);
    size_t need = flash_tc_shared_bytes(hd);
    if (need > smem_optin)
        return "the tensor-core flash attention needs " + std::to_string(need) +
               " bytes of shared memory a block at head dim " + std::to_string(hd) + ", this GPU allows " +
               std::to_string(smem_optin);
    return "";
}
// The launches' own checks: a head dim flash_tc_refusal refuses, or a buffer cp.async cannot copy from.
static void flash_tc_check(int hd, std::initializer_list<const float*> buffers) {
    bool aligned = true;
    for (const float* p : buffers) aligned = aligned && (hd % 4 != 0 || (uintptr_t)p % 16 == 0);
    if (hd >= 1 && hd <= FLASH_MAX_HD && aligned) return;
    fprintf(stderr, "lime: flash_attention_tc: head dim %d (takes 1 to %d), or a buffer not 16-byte aligned\n", hd,
            FLASH_MAX_HD);
    exit(EXIT_FAILURE);
}
// The kernel may have `bytes` of dynamic shared memory (over 48 KiB must be asked for).
template <class Kernel>
static void flash_tc_allow_shared(Kernel* kernel, int floats) {
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, floats * (int)sizeof(float)));
}

// Does this model's flash attention run here: the shape taken (GpuState::flash_tc), under TF32 (the step's
// math mode) or bf16? Else the scalar kernels (support/model/flash_attention.cuh).
static inline bool flash_on_tensor_cores(const Model* m) {
    return m->gpu->flash_tc && (m->gpu->tf32 || bf16_products(m));
}

// out (B, T, H, hd) and lse (B, H, T): what backward needs of the probabilities.
// bf16: the products' operands rounded to bf16 (--precision bf16), else TF32.
inline void flash_attention_tc_forward_gpu(float* out, float* lse, const float* q, const float* k, const float* v,
                                           int B, int T, int H, int R, int hd, cudaStream_t stream, bool bf16 = false) {
    flash_tc_check(hd, {out, q, k, v});
    float scale = 1.0f / sqrtf((float)hd);
    with_flash_tc_kernels(hd, bf16, [&](auto w, auto bf) {
        constexpr int HD = decltype(w)::value;
        constexpr bool BF16 = decltype(bf)::value;
        using F = FlashTC<HD>;
        auto* flash_tc_forward = flash_tc_forward_kernel<HD, BF16>;
        flash_tc_allow_shared(flash_tc_forward, F::FWD_FLOATS);
        LAUNCH(flash_tc_forward, dim3(ceil_div(T, F::FWD_ROWS), H, B), F::THREADS,
               F::FWD_FLOATS * sizeof(float), stream)
        (out, lse, q, k, v, T, H, R, hd, scale);
    });
    launchCheck();
}

// dq and dk are written, dv too or added to (add_dv). scratch: B*H*T floats (D).
// The dQ kernel runs first: it writes D, which the dK/dV kernel reads.
inline void flash_attention_tc_backward_gpu(float* dq, float* dk, float* dv, const float* dout, const float* out,
                                            const float* q, const float* k, const float* v, const float* lse, int B,
                                            int T, int H, int R, int hd, bool add_dv, float* scratch,
                                            cudaStream_t stream, bool bf16 = false) {
    flash_tc_check(hd, {dq, dk, dv, dout, out, q, k, v});
    float scale = 1.0f / sqrtf((float)hd), *D = scratch;
    with_flash_tc_kernels(hd, bf16, [&](auto w, auto bf) {
        constexpr int HD = decltype(w)::value;
        constexpr bool BF16 = decltype(bf)::value;
        using F = FlashTC<HD>;
        auto* flash_tc_backward_q = flash_tc_backward_q_kernel<HD, BF16>;
        auto* flash_tc_backward_kv = flash_tc_backward_kv_kernel<HD, BF16>;
        flash_tc_allow_shared(flash_tc_backward_q, F::DQ_FLOATS);
        flash_tc_allow_shared(flash_tc_backward_kv, F::DKV_FLOATS);
        LAUNCH(flash_tc_backward_q, dim3(ceil_div(T, F::ROWS), H, B), F::THREADS,
               F::DQ_FLOATS * sizeof(float), stream)
        (dq, D, dout, out, q, k, v, lse, T, H, R, hd, scale);
        launchCheck();
        LAUNCH(flash_tc_backward_kv, dim3(ceil_div(T, F::ROWS), R, B), F::THREADS,
               F::DKV_FLOATS * sizeof(float), stream)
        (dk, dv, dout, q, k, v, lse, D, T, H, R, hd, scale, add_dv);
    });
    launchCheck();
}
#endif  // LIME_GPU
