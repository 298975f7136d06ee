// support/model/cpu_fast.cpp — the fast CPU path: lime.cu's matrix product,
// router and attention, blocked so that the compiler keeps the sums in vector
// registers. Each function computes what the plain loop it names in lime.cu
// computes (tests/test_model.cpp compares them on random shapes); read the
// plain loops first. `./lime` uses these; `make lime-ref` builds the plain ones.
//
// Every sum runs in an order fixed by the shapes alone, never by the number of
// threads, so that a resumed run is bit-exact.
#include "support/model/cpu_fast.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

// Calls f(w) with w a compile-time constant dividing hd: 32, 8 or 2 (hd is
// even). Loops over a head's hd floats go LANES = w at a time, LANES known to
// the compiler, so that their sums stay in registers.
template <class F>
static void with_lanes(int hd, F f) {
    if (hd % 32 == 0) f(std::integral_constant<int, 32>());
    else if (hd % 8 == 0) f(std::integral_constant<int, 8>());
    else f(std::integral_constant<int, 2>());
}

// ===========================================================================
// Matrix products: C (+)= A @ B with A and B read transposed in place.
// ===========================================================================
//
// In the manner of GotoBLAS and BLIS: the product is cut into tiles of MR rows
// by NR columns of C. A micro-kernel holds one tile's MR x NR sums in vector
// registers while k runs: per k it loads one row of B's tile (NR floats, a
// "panel" of B), broadcasts the MR elements of A's column k, and does MR x NR
// fused multiply-adds, with no load or store of C inside the loop. B is read in
// panels of NR columns whose rows lie NR floats apart (packed into scratch when
// B is not already stored that way); A is read where it lies, one pointer per
// row. Around the kernel, two levels of blocking keep what it reads in the
// caches: K in blocks of GEMM_KC (one block of a panel, KC x NR floats, stays
// in L1 while the kernel runs down a block of rows), and M in blocks of up to
// GEMM_MC_TILES tiles (one block of A, MC x KC floats, stays in L2 while the
// kernel moves across the panels).
//
// The order of every sum is fixed by the shapes alone: each element of C is
// one chain of fused multiply-adds over k = 0, 1, ..., K-1 started from 0,
// then (accumulate) added to C, as the plain loop's `*y + s`: so x + a @ W^T
// has the same bits whether the product accumulates or is added after it
// (HC's depth connection against LLaMa's residual add). A K block ends by
// storing the sums to C and the next starts by loading them, which changes nothing. The threads share out whole
// tiles, so the number of threads (and the block sizes) decide who computes an
// element, never how: a resumed run is bit-exact whatever --threads says.

// An operand of a product, read where it lies: element (i, k) is p[i*rs + k*cs].
// A row-major (rows, cols) array is {p, cols, 1}; its transpose is {p, 1, cols}.
struct MatView {
    const float* p;
    size_t rs, cs;
};

// One tile's work, for a micro-kernel: C[MR, NR] (+)= A[MR, K] @ B[K, NR].
//   a[i]   row i of A's tile: its element k at a[i][k * a_cs]
//   b      the panel: row k at b + k * ldb (NR floats)
//   c      the tile of C, rows ldc apart; load_c: the sums start from it (a later
//          K block), else from 0; add_c: the sums are added to it at the end, else stored
struct TileArgs {
    const float* const* a;
    size_t a_cs;
    const float* b;
    size_t ldb;
    float* c;
    size_t ldc;
    int K;
    bool load_c, add_c;
};

// The portable micro-kernel (any compiler, any CPU): 8 x 32 sums in an array
// the compiler keeps in vector registers, vectorising the loops over j.
struct KernelPlain {
    static const int MR = 8, NR = 32;
    static void run(const TileArgs& t) {
        float acc[MR][NR];
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NR; j++) acc[i][j] = t.load_c ? t.c[(size_t)i * t.ldc + j] : 0.0f;
        const float* b = t.b;
        for (int k = 0; k < t.K; k++, b += t.ldb)
            for (int i = 0; i < MR; i++) {
                float aik = t.a[i][k * t.a_cs];
                for (int j = 0; j < NR; j++) acc[i][j] += aik * b[j];
            }
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NR; j++) {
                float* c = t.c + (size_t)i * t.ldc + j;
                *c = t.add_c ? *c + acc[i][j] : acc[i][j];
            }
    }
};

#if defined(__AVX2__) && defined(__FMA__)
// AVX2 + FMA: 6 x 16 sums in 12 ymm registers (8 floats each); per k two
// loads of B, six broadcasts of A, twelve FMAs. 12 + 2 + 1 of the 16 registers.
struct KernelAvx2 {
    static const int MR = 6, NR = 16;
    static void run(const TileArgs& t) {
        __m256 acc[MR][2];
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++)
            for (int h = 0; h < 2; h++)
                acc[i][h] = t.load_c ? _mm256_loadu_ps(t.c + (size_t)i * t.ldc + 8 * h) : _mm256_setzero_ps();
        const float *a0 = t.a[0], *a1 = t.a[1], *a2 = t.a[2], *a3 = t.a[3], *a4 = t.a[4], *a5 = t.a[5];
        const float* b = t.b;
        size_t at = 0;
        for (int k = 0; k < t.K; k++, b += t.ldb, at += t.a_cs) {
            __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8), x;
#define LIME_ROW(i)                                        \
    x = _mm256_broadcast_ss(a##i + at);                    \
    acc[i][0] = _mm256_fmadd_ps(x, b0, acc[i][0]);         \
    acc[i][1] = _mm256_fmadd_ps(x, b1, acc[i][1]);
            LIME_ROW(0) LIME_ROW(1) LIME_ROW(2) LIME_ROW(3) LIME_ROW(4) LIME_ROW(5)
#undef LIME_ROW
        }
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++)
            for (int h = 0; h < 2; h++) {
                float* c = t.c + (size_t)i * t.ldc + 8 * h;
                _mm256_storeu_ps(c, t.add_c ? _mm256_add_ps(_mm256_loadu_ps(c), acc[i][h]) : acc[i][h]);
            }
    }
};
#endif

#if defined(__AVX512F__)
// AVX-512: 8 x 32 sums in 16 zmm registers (16 floats each); per k two loads
// of B, eight broadcasts of A, sixteen FMAs. 16 + 2 + 1 of the 32 registers.
struct KernelAvx512 {
    static const int MR = 8, NR = 32;
    static void run(const TileArgs& t) {
        __m512 acc[MR][2];
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++)
            for (int h = 0; h < 2; h++)
                acc[i][h] = t.load_c ? _mm512_loadu_ps(t.c + (size_t)i * t.ldc + 16 * h) : _mm512_setzero_ps();
        const float *a0 = t.a[0], *a1 = t.a[1], *a2 = t.a[2], *a3 = t.a[3], *a4 = t.a[4], *a5 = t.a[5],
                    *a6 = t.a[6], *a7 = t.a[7];
        const float* b = t.b;
        size_t at = 0;
        for (int k = 0; k < t.K; k++, b += t.ldb, at += t.a_cs) {
            __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16), x;
#define LIME_ROW(i)                                        \
    x = _mm512_set1_ps(a##i[at]);                          \
    acc[i][0] = _mm512_fmadd_ps(x, b0, acc[i][0]);         \
    acc[i][1] = _mm512_fmadd_ps(x, b1, acc[i][1]);
            LIME_ROW(0) LIME_ROW(1) LIME_ROW(2) LIME_ROW(3) LIME_ROW(4) LIME_ROW(5) LIME_ROW(6) LIME_ROW(7)
#undef LIME_ROW
        }
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++)
            for (int h = 0; h < 2; h++) {
                float* c = t.c + (size_t)i * t.ldc + 16 * h;
                _mm512_storeu_ps(c, t.add_c ? _mm512_add_ps(_mm512_loadu_ps(c), acc[i][h]) : acc[i][h]);
            }
    }
};
#endif

static const int GEMM_KC = 256;       // k per block: a block of a panel is KC x NR floats (32 KB at NR = 32)
static const int GEMM_MC_TILES = 12;  // at most this many row tiles per block of A

// Runs the kernel on the tile at rows i0.., columns j0.. of C; a tile that
// C's edge cuts (mr < MR rows or nr < NR columns) goes through a whole tile
// on the stack, its missing rows of A repeating the last one.
template <class Kern>
static void gemm_tile(float* C, size_t ldc, MatView A, const float* b, size_t ldb, int M, int N, int i0, int j0, int k0,
                      int kc, bool load_c, bool add_c) {
    const int MR = Kern::MR, NR = Kern::NR;
    const float* a[MR];
    for (int i = 0; i < MR; i++) a[i] = A.p + (size_t)std::min(i0 + i, M - 1) * A.rs + (size_t)k0 * A.cs;
    int mr = std::min(MR, M - i0), nr = std::min(NR, N - j0);
    float* c = C + (size_t)i0 * ldc + j0;
    if (mr == MR && nr == NR) {
        Kern::run({a, A.cs, b, ldb, c, ldc, kc, load_c, add_c});
        return;
    }
    alignas(64) float tile[MR * NR];
    if (load_c || add_c)
        for (int i = 0; i < mr; i++) memcpy(tile + i * NR, c + (size_t)i * ldc, nr * sizeof(float));
    Kern::run({a, A.cs, b, ldb, tile, (size_t)NR, kc, load_c, add_c});
    for (int i = 0; i < mr; i++) memcpy(c + (size_t)i * ldc, tile + i * NR, nr * sizeof(float));
}

// C[M, N] (+)= A[M, K] @ B[K, N]; C row-major with row stride ldc.
// B's panels are read in place when B's rows are contiguous and the panel is
// whole, else first packed into scratch (panel p at scratch + p * K * NR),
// zero past column N: at most K * round_up(N, NR) floats.
template <class Kern>
static void gemm_blocked(float* C, size_t ldc, MatView A, MatView B, int M, int N, int K, bool accumulate,
                         float* scratch) {
    const int MR = Kern::MR, NR = Kern::NR;
    int row_tiles = (M + MR - 1) / MR, panels = (N + NR - 1) / NR;
    auto in_place = [&](int p) { return B.cs == 1 && (p + 1) * NR <= N; };
    if (K == 0) {  // an empty sum: C = 0, or C unchanged
        if (!accumulate)
            for (int i = 0; i < M; i++) memset(C + (size_t)i * ldc, 0, N * sizeof(float));
        return;
    }
#pragma omp parallel if ((double)M * N * K > 32768)
    {
        bool packs = false;
        for (int p = 0; p < panels; p++) packs |= !in_place(p);
        if (packs) {
#pragma omp for schedule(static)
            for (int p = 0; p < panels; p++) {
                if (in_place(p)) continue;
                float* panel = scratch + (size_t)p * K * NR;
                for (int j = 0; j < NR; j++) {
                    size_t col = (size_t)p * NR + j;
                    if (col >= (size_t)N)
                        for (int k = 0; k < K; k++) panel[(size_t)k * NR + j] = 0.0f;
                    else
                        for (int k = 0; k < K; k++) panel[(size_t)k * NR + j] = B.p[k * B.rs + col * B.cs];
                }
            }
        }
        // Work units: a block of row tiles by one panel; at least one unit per
        // thread, blocks of at most GEMM_MC_TILES tiles, all of about the same size.
#ifdef _OPENMP
        int threads = omp_get_num_threads();
#else
        int threads = 1;
#endif
        int row_blocks = std::max((threads + panels - 1) / panels, (row_tiles + GEMM_MC_TILES - 1) / GEMM_MC_TILES);
        row_blocks = std::min(row_blocks, row_tiles);
        int tiles_per_block = (row_tiles + row_blocks - 1) / row_blocks;
        row_blocks = (row_tiles + tiles_per_block - 1) / tiles_per_block;
#pragma omp for schedule(static)
        for (int u = 0; u < row_blocks * panels; u++) {
            int rb = u / panels, p = u % panels;
            int t_end = std::min(row_tiles, (rb + 1) * tiles_per_block);
            const float* b = in_place(p) ? B.p + (size_t)p * NR : scratch + (size_t)p * K * NR;
            size_t ldb = in_place(p) ? B.rs : NR;
            for (int k0 = 0; k0 < K; k0 += GEMM_KC) {
                int kc = std::min(GEMM_KC, K - k0);
                for (int t = rb * tiles_per_block; t < t_end; t++)
                    gemm_tile<Kern>(C, ldc, A, b + (size_t)k0 * ldb, ldb, M, N, t * MR, p * NR, k0, kc,
                                    k0 > 0, accumulate && k0 == 0);
            }
        }
    }
}

// The micro-kernels this build has, best first: AVX-512, AVX2 + FMA (when the
// compiler targets them: -march=native on a CPU that has them), portable.
static const char* const GEMM_KERNELS[] = {
#if defined(__AVX512F__)
    "avx512",
#endif
#if defined(__AVX2__) && defined(__FMA__)
    "avx2",
#endif
    "plain"};
static int gemm_kernel = 0;  // the one in use: the best, except in tests (matmul_fast_use_kernel)

static void gemm_cpu(float* C, size_t ldc, MatView A, MatView B, int M, int N, int K, bool accumulate, float* scratch) {
    const char* name = GEMM_KERNELS[gemm_kernel];
    (void)name;  // (a build with the portable kernel alone)
#if defined(__AVX512F__)
    if (!strcmp(name, "avx512")) return gemm_blocked<KernelAvx512>(C, ldc, A, B, M, N, K, accumulate, scratch);
#endif
#if defined(__AVX2__) && defined(__FMA__)
    if (!strcmp(name, "avx2")) return gemm_blocked<KernelAvx2>(C, ldc, A, B, M, N, K, accumulate, scratch);
#endif
    gemm_blocked<KernelPlain>(C, ldc, A, B, M, N, K, accumulate, scratch);
}

const char* matmul_fast_kernel() { return GEMM_KERNELS[gemm_kernel]; }
#ifdef LIME_TESTING
int matmul_fast_kernels() { return (int)(sizeof GEMM_KERNELS / sizeof GEMM_KERNELS[0]); }
void matmul_fast_use_kernel(int i) { gemm_kernel = i; }
#endif

// = matmul_forward: out (N, OC) (+)= inp (N, C) @ W^T, W (OC, C).
// scratch: C * round_up(OC, 32) floats (W^T, packed).
void matmul_forward_fast(float* out, const float* inp, const float* W, int N, int C, int OC, bool accumulate,
                         float* scratch) {
    gemm_cpu(out, OC, {inp, (size_t)C, 1}, {W, 1, (size_t)C}, N, OC, C, accumulate, scratch);
}

// = matmul_backward: dinp (N, C) += dout (N, OC) @ W (OC, C);  dW (OC, C) += dout^T @ inp
// scratch: max(N, OC) * round_up(C, 32) floats (used only when C is not a multiple of the panel width).
void matmul_backward_fast(float* dinp, float* dW, const float* dout, const float* inp, const float* W, int N, int C,
                          int OC, float* scratch) {
    if (dinp) gemm_cpu(dinp, C, {dout, (size_t)OC, 1}, {W, (size_t)C, 1}, N, C, OC, true, scratch);
    gemm_cpu(dW, C, {dout, 1, (size_t)OC}, {inp, (size_t)C, 1}, OC, C, N, true, scratch);
}

// ===========================================================================
// The KV router (lime.cu: router_forward, router_backward)
// ===========================================================================

static const int ROUTER_CHUNKS = 64;  // slices of the positions for dW: lime.cu's CHUNKS

// The loops go over a head's hd floats LANES at a time (with_lanes),
// and over 4 router rows (or columns) at once: 4 independent sums in
// registers, each value loaded once for all 4. Rows past the end get weight 0.
static const int ROUTER_BLOCK = 4;

// Where column j's entry for position 0 starts in the buffer: layer j / R,
// kv head j % R. Padded to whole blocks with the last column again.
static std::vector<size_t> router_columns(int l, int N, int R, int hd) {
    size_t J = (size_t)(l + 1) * R;
    std::vector<size_t> at((J + ROUTER_BLOCK - 1) / ROUTER_BLOCK * ROUTER_BLOCK);
    for (size_t j = 0; j < at.size(); j++) {
        size_t c = std::min(j, J - 1);
        at[j] = (c / R) * ((size_t)N * R * hd) + (c % R) * hd;
    }
    return at;
}

template <int LANES>
static void router_forward_blocked(float* Kr, float* Vr, const float* Wk, const float* Wv, const float* Kbuf,
                                   const float* Vbuf, int l, int N, int R, int hd) {
    const int RB = ROUTER_BLOCK;
    int J = (l + 1) * R;  // router columns
    std::vector<size_t> col = router_columns(l, N, R, hd);
    // The weights of output heads r0 .. r0 + RB - 1 for column j side by side (0 past R).
    std::vector<float> wk((size_t)(R + RB - 1) / RB * J * RB, 0.0f), wv(wk.size(), 0.0f);
    for (int r = 0; r < R; r++)
        for (int j = 0; j < J; j++) {
            wk[((size_t)r / RB * J + j) * RB + r % RB] = Wk[r * J + j];
            wv[((size_t)r / RB * J + j) * RB + r % RB] = Wv[r * J + j];
        }
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int r0 = 0; r0 < R; r0 += RB)  // output heads r0 .. r0 + RB - 1
            for (int i0 = 0; i0 < hd; i0 += LANES) {
                float k[RB][LANES] = {}, v[RB][LANES] = {};
                for (int j = 0; j < J; j++) {
                    const float* ks = Kbuf + col[j] + (size_t)n * R * hd + i0;
                    const float* vs = Vbuf + col[j] + (size_t)n * R * hd + i0;
                    const float* wkj = &wk[((size_t)r0 / RB * J + j) * RB];
                    const float* wvj = &wv[((size_t)r0 / RB * J + j) * RB];
                    for (int b = 0; b < RB; b++)
#pragma omp simd
                        for (int i = 0; i < LANES; i++) {
                            k[b][i] += wkj[b] * ks[i];
                            v[b][i] += wvj[b] * vs[i];
                        }
                }
                for (int b = 0; b < RB && r0 + b < R; b++) {
                    memcpy(Kr + ((size_t)n * R + r0 + b) * hd + i0, k[b], sizeof k[b]);
                    memcpy(Vr + ((size_t)n * R + r0 + b) * hd + i0, v[b], sizeof v[b]);
                }
            }
}
void router_forward_fast(float* Kr, float* Vr, const float* Wk, const float* Wv, const float* Kbuf, const float* Vbuf,
                         int l, int N, int R, int hd) {
    with_lanes(hd,
               [&](auto w) { router_forward_blocked<decltype(w)::value>(Kr, Vr, Wk, Wv, Kbuf, Vbuf, l, N, R, hd); });
}

// = router_backward (its comment has the math). The sums for dW run over
// ROUTER_CHUNKS fixed slices of the positions, each into
// LANES lanes per weight, then the slices and the lanes in order: the same for any thread count.
template <int LANES>
static void router_backward_blocked(float* dWk, float* dWv, float* dKbuf, float* dVbuf, const float* dKr,
                                    const float* dVr, const float* Wk, const float* Wv, const float* Kbuf,
                                    const float* Vbuf, int l, RouterSpan learned, int N, int R, int hd) {
    const int RB = ROUTER_BLOCK;
    int J = (l + 1) * R;
    std::vector<size_t> col = router_columns(l, N, R, hd);
    size_t slice = (size_t)2 * R * J * LANES;  // one chunk's lanes: the keys' (R, J, LANES), then the values'
    // Every lane is written below before it is read: kept from call to call,
    // not allocated (1 MB at d = 128: fresh pages and a zero-fill each step).
    static std::vector<float> lanes;
    if (lanes.size() < ROUTER_CHUNKS * slice) lanes.resize(ROUTER_CHUNKS * slice);
#pragma omp parallel for schedule(static)
    for (int c = 0; c < ROUTER_CHUNKS; c++)
        for (int r = 0; r < R; r++)
            for (int j0 = 0; j0 < J; j0 += RB) {  // columns j0 .. j0 + RB - 1 (past J: column J - 1 again, not kept)
                float k[RB][LANES] = {}, v[RB][LANES] = {};
                for (size_t n = (size_t)N * c / ROUTER_CHUNKS; n < (size_t)N * (c + 1) / ROUTER_CHUNKS; n++)
                    for (int i0 = 0; i0 < hd; i0 += LANES) {
                        const float* dk = dKr + (n * R + r) * hd + i0;
                        const float* dv = dVr + (n * R + r) * hd + i0;
                        for (int b = 0; b < RB; b++) {
                            size_t at = col[j0 + b] + n * R * hd + i0;
#pragma omp simd
                            for (int i = 0; i < LANES; i++) {
                                k[b][i] += dk[i] * Kbuf[at + i];
                                v[b][i] += dv[i] * Vbuf[at + i];
                            }
                        }
                    }
                for (int b = 0; b < RB && j0 + b < J; b++) {
                    memcpy(&lanes[c * slice + ((size_t)r * J + j0 + b) * LANES], k[b], sizeof k[b]);
                    memcpy(&lanes[c * slice + slice / 2 + ((size_t)r * J + j0 + b) * LANES], v[b], sizeof v[b]);
                }
            }
    for (int rj = 0; rj < R * J; rj++) {
        if (!learned.has(rj % J / R)) continue;  // a weight the variant holds fixed
        float lk[LANES] = {}, lv[LANES] = {}, k = 0, v = 0;
        for (int c = 0; c < ROUTER_CHUNKS; c++)
            for (int i = 0; i < LANES; i++) {
                lk[i] += lanes[c * slice + (size_t)rj * LANES + i];
                lv[i] += lanes[c * slice + slice / 2 + (size_t)rj * LANES + i];
            }
        for (int i = 0; i < LANES; i++) k += lk[i], v += lv[i];
        if (dWk == dWv) {
            dWk[rj] += k + v;
        } else {
            dWk[rj] += k;
            dWv[rj] += v;
        }
    }
    int Jp = (J + RB - 1) / RB * RB;  // each router row padded with zeros to whole blocks of columns
    std::vector<float> wk((size_t)R * Jp, 0.0f), wv(wk.size(), 0.0f);
    for (int r = 0; r < R; r++)
        for (int j = 0; j < J; j++) wk[(size_t)r * Jp + j] = Wk[r * J + j], wv[(size_t)r * Jp + j] = Wv[r * J + j];
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int j0 = 0; j0 < J; j0 += RB)  // buffer entries j0 .. j0 + RB - 1
            for (int i0 = 0; i0 < hd; i0 += LANES) {
                float k[RB][LANES], v[RB][LANES];
                for (int b = 0; b < RB; b++) {  // past J: column J - 1 again, weight 0, not stored
                    size_t at = col[j0 + b] + (size_t)n * R * hd + i0;
                    memcpy(k[b], dKbuf + at, sizeof k[b]);
                    memcpy(v[b], dVbuf + at, sizeof v[b]);
                }
                for (int r = 0; r < R; r++) {
                    const float* dk = dKr + ((size_t)n * R + r) * hd + i0;
                    const float* dv = dVr + ((size_t)n * R + r) * hd + i0;
                    const float* wkr = &wk[(size_t)r * Jp + j0];
                    const float* wvr = &wv[(size_t)r * Jp + j0];
                    for (int b = 0; b < RB; b++)
#pragma omp simd
                        for (int i = 0; i < LANES; i++) {
                            k[b][i] += wkr[b] * dk[i];
                            v[b][i] += wvr[b] * dv[i];
                        }
                }
                for (int b = 0; b < RB && j0 + b < J; b++) {
                    size_t at = col[j0 + b] + (size_t)n * R * hd + i0;
                    memcpy(dKbuf + at, k[b], sizeof k[b]);
                    memcpy(dVbuf + at, v[b], sizeof v[b]);
                }
            }
}
void router_backward_fast(float* dWk, float* dWv, float* dKbuf, float* dVbuf, const float* dKr, const float* dVr,
                          const float* Wk, const float* Wv, const float* Kbuf, const float* Vbuf, int l,
                          RouterSpan learned, int N, int R, int hd) {
    with_lanes(hd, [&](auto w) {
        router_backward_blocked<decltype(w)::value>(dWk, dWv, dKbuf, dVbuf, dKr, dVr, Wk, Wv, Kbuf, Vbuf, l, learned, N,
                                                    R, hd);
    });
}

// ===========================================================================
// Causal GQA attention (lime.cu: attention_forward, attention_backward)
// ===========================================================================

// One thread takes a (batch entry, kv head) pair at a time, and
// the query rows of its heads ATT_ROWS at a time; each value it loads serves
// all those rows. Two kinds of loop, so that both vectorise:
//  - over key positions u, 16 at a time: the scores q . k (and backward,
//    dout . v) read the keys transposed, (hd, Tp) with Tp = T rounded up to
//    16 and zeros past T, and fill rows of Tp floats: whole vectors only;
//  - over the head's hd floats, LANES at a time (p @ v; dq, dk, dv): LANES is a
//    compile-time constant dividing hd (32, 8 or 2; hd is even) so that the
//    ATT_ROWS x LANES sums live in registers.
// A block that runs past the last position gets rows that read zeros and
// write to a sink, so every loop works on all ATT_ROWS rows.
static const int ATT_ROWS = 4;

// xt (hd, Tp) = x[b, :, r, :]^T for x (B, T, R, hd); zero past T.
static void head_transposed(float* xt, const float* x, int b, int r, int T, int Tp, int R, int hd) {
    for (int i = 0; i < hd; i++)
        for (int u = 0; u < Tp; u++) xt[(size_t)i * Tp + u] = u < T ? x[(((size_t)b * T + u) * R + r) * hd + i] : 0.0f;
}

// s[j, u] = scale * a[j] . xt[:, u] for the ATT_ROWS rows a[j] (hd floats) and
// u < n, a multiple of 16; s has rows of Tp floats.
static void rows_dot_keys(float* s, int Tp, const float* const* a, const float* xt, int hd, int n, float scale) {
    for (int u0 = 0; u0 < n; u0 += 16) {
        float acc[ATT_ROWS][16] = {};
        for (int i = 0; i < hd; i++) {
            const float* x = xt + (size_t)i * Tp + u0;
            for (int j = 0; j < ATT_ROWS; j++)
#pragma omp simd
                for (int u = 0; u < 16; u++) acc[j][u] += a[j][i] * x[u];
        }
        for (int j = 0; j < ATT_ROWS; j++)
            for (int u = 0; u < 16; u++) s[(size_t)j * Tp + u0 + u] = scale * acc[j][u];
    }
}

// out[j][i] = scale * sum_{u < n} p[j][u] * m[u * ldm + i], i < hd: rows of
// weights times n rows of m (values, or keys).
template <int LANES>
static void rows_times_matrix(float* const* out, const float* const* p, int n, const float* m, size_t ldm, int hd,
                              float scale) {
    for (int i0 = 0; i0 < hd; i0 += LANES) {
        float acc[ATT_ROWS][LANES] = {};
        for (int u = 0; u < n; u++) {
            const float* mu = m + (size_t)u * ldm + i0;
            for (int j = 0; j < ATT_ROWS; j++) {
                float pju = p[j][u];
#pragma omp simd  // (without it, the compiler vectorises over u instead, badly)
                for (int i = 0; i < LANES; i++) acc[j][i] += pju * mu[i];
            }
        }
        for (int j = 0; j < ATT_ROWS; j++)
            for (int i = 0; i < LANES; i++) out[j][i0 + i] = scale * acc[j][i];
    }
}

// dst[u * ld + i] += sum_j a[j][u] * scale * x[j][i] for u < n, i < hd: the
// gradient of n rows of m above (keys or values), from the ATT_ROWS rows.
template <int LANES>
static void add_rows_outer(float* dst, size_t ld, int n, const float* const* a, const float* const* x, int hd,
                           float scale) {
    for (int i0 = 0; i0 < hd; i0 += LANES) {
        float xs[ATT_ROWS][LANES];
        for (int j = 0; j < ATT_ROWS; j++)
            for (int i = 0; i < LANES; i++) xs[j][i] = scale * x[j][i0 + i];
        for (int u = 0; u < n; u++) {
            float* d = dst + (size_t)u * ld + i0;
            float au[ATT_ROWS];
            for (int j = 0; j < ATT_ROWS; j++) au[j] = a[j][u];
#pragma omp simd
            for (int i = 0; i < LANES; i++) {
                float s = d[i];
                for (int j = 0; j < ATT_ROWS; j++) s += au[j] * xs[j][i];
                d[i] = s;
            }
        }
    }
}

// The sum and the maximum of 16 lanes, as a fixed tree. (Named values, not
// arrays: an array on the stack, written a float at a time and read back as a
// vector, stalled the softmax at every row.)
#define LIME_TREE(op, a)                                                                                       \
    op(op(op(op(a[0], a[8]), op(a[4], a[12])), op(op(a[2], a[10]), op(a[6], a[14]))),                         \
       op(op(op(a[1], a[9]), op(a[5], a[13])), op(op(a[3], a[11]), op(a[7], a[15]))))
static inline float add2(float x, float y) { return x + y; }
static inline float max2(float x, float y) { return std::max(x, y); }
static inline float lanes_sum(const float* a) { return LIME_TREE(add2, a); }
static inline float lanes_max(const float* a) { return LIME_TREE(max2, a); }
#undef LIME_TREE

// p[u] = softmax of the scores s[u] over u <= t, and 0 for t < u < T. s has
// n floats, n a multiple of 16; the loops run over 16 lanes, each lane
// keeping its own maximum and sum, which a fixed tree combines.
// (The positions past t are masked as the loops read them, not first
// overwritten: a few scalar stores read back by a vector load stall it.)
static void softmax_row(float* p, float* s, int t, int n, int T) {
    float mx[16], sum[16];
    for (int i = 0; i < 16; i++) mx[i] = -INFINITY, sum[i] = 0;
    for (int u = 0; u < n; u += 16)
        for (int i = 0; i < 16; i++) {
            float x = u + i <= t ? s[u + i] : -INFINITY;  // masked: e^-inf = 0
            mx[i] = x > mx[i] ? x : mx[i];
        }
    float m = lanes_max(mx);
    for (int u = 0; u < n; u += 16)
        for (int i = 0; i < 16; i++) {
            float e = u + i <= t ? exp_fast(s[u + i] - m) : 0.0f;
            s[u + i] = e;
            sum[i] += e;
        }
    float inv = 1.0f / lanes_sum(sum);
    int w = std::min(n, T);
    for (int u = 0; u < w; u++) p[u] = s[u] * inv;
    if (w < T) memset(p + w, 0, (size_t)(T - w) * sizeof(float));
}

// In place over dp: ds[u] = p[u] (dp[u] - sum_u' p[u'] dp[u']) for u < n, n a
// multiple of 16 (p is 0 past the row's own position).
static void softmax_backward_row(float* ds, const float* p, int n) {
    float part[16] = {};
    for (int u = 0; u < n; u += 16)
        for (int i = 0; i < 16; i++) part[i] += p[u + i] * ds[u + i];
    float pdp = lanes_sum(part);
    for (int u = 0; u < n; u++) ds[u] = p[u] * (ds[u] - pdp);
}

// Per thread: the transposed keys (or values) of one kv head, ATT_ROWS rows
// of scores (and backward, of probabilities), a row of zeros and a sink for
// the rows past T.
struct AttentionBuffers {
    std::vector<float> xt, rows, probs, zero, sink;
    AttentionBuffers(int Tp, int hd)
        : xt((size_t)hd * Tp), rows((size_t)ATT_ROWS * Tp), probs((size_t)ATT_ROWS * Tp), zero(std::max(Tp, hd), 0.0f),
          sink(std::max(Tp, hd)) {}
};

// out (B, T, H, hd), att (B, H, T, T); q (B, T, H, hd); k, v (B, T, R, hd).
template <int LANES>
static void attention_forward_blocked(float* out, float* att, const float* q, const float* k, const float* v, int B,
                                      int T, int H, int R, int hd) {
    int n_rep = H / R, Tp = (T + 15) / 16 * 16;
    float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel
    {
        AttentionBuffers buf(Tp, hd);
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int r = 0; r < R; r++) {
                head_transposed(buf.xt.data(), k, b, r, T, Tp, R, hd);
                const float* vr = v + ((size_t)b * T * R + r) * hd;  // v[b, u, r, :] = vr[u * R*hd ...]
                for (int h = r * n_rep; h < (r + 1) * n_rep; h++)
                    for (int t0 = 0; t0 < T; t0 += ATT_ROWS) {
                        int last = std::min(t0 + ATT_ROWS, T) - 1;  // rows t0 .. last
                        const float *qt[ATT_ROWS], *pt[ATT_ROWS];
                        float *o[ATT_ROWS], *p[ATT_ROWS];
                        for (int j = 0; j < ATT_ROWS; j++) {
                            int t = t0 + j;
                            bool in = t <= last;
                            qt[j] = in ? q + (((size_t)b * T + t) * H + h) * hd : buf.zero.data();
                            p[j] = in ? att + (((size_t)b * H + h) * T + t) * T : buf.sink.data();
                            o[j] = in ? out + (((size_t)b * T + t) * H + h) * hd : buf.sink.data();
                            pt[j] = in ? p[j] : buf.zero.data();
                        }
                        int n16 = (last + 16) / 16 * 16;  // positions 0 .. last in whole vectors
                        rows_dot_keys(buf.rows.data(), Tp, qt, buf.xt.data(), hd, n16, scale);
                        for (int t = t0; t <= last; t++)
                            softmax_row(p[t - t0], buf.rows.data() + (size_t)(t - t0) * Tp, t, n16, T);
                        rows_times_matrix<LANES>(o, pt, last + 1, vr, (size_t)R * hd, hd, 1.0f);
                    }
            }
    }
}
void attention_forward_fast(float* out, float* att, const float* q, const float* k, const float* v, int B, int T, int H,
                            int R, int hd) {
    with_lanes(hd, [&](auto w) { attention_forward_blocked<decltype(w)::value>(out, att, q, k, v, B, T, H, R, hd); });
}

// forward: o[t] = sum_u p[t,u] v[u],  p = softmax(s),  s[t,u] = q[t].k[u] * scale
// dp[t,u] = dout[t] . v[u]                  dv[u] += sum_t p[t,u] dout[t]
// ds[t,u] = p[t,u] (dp[t,u] - sum_u' p[t,u'] dp[t,u'])
// dq[t]   = scale * sum_u ds[t,u] k[u]      dk[u] += scale * sum_t ds[t,u] q[t]
// att is the forward's, 0 above the diagonal (both forwards write it so).
// dq is written; dk and dv are added to. One thread owns a (b, kv head) and
// adds its query heads' and rows' shares in order: the same sums for any thread count.
template <int LANES>
static void attention_backward_blocked(float* dq, float* dk, float* dv, const float* dout, const float* q,
                                       const float* k, const float* v, const float* att, int B, int T, int H, int R,
                                       int hd) {
    int n_rep = H / R, Tp = (T + 15) / 16 * 16;
    float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel
    {
        AttentionBuffers buf(Tp, hd);
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int r = 0; r < R; r++) {
                head_transposed(buf.xt.data(), v, b, r, T, Tp, R, hd);
                size_t kv = ((size_t)b * T * R + r) * hd, ld = (size_t)R * hd;  // row u of this kv head: kv + u * ld
                for (int h = r * n_rep; h < (r + 1) * n_rep; h++)
                    for (int t0 = 0; t0 < T; t0 += ATT_ROWS) {
                        int last = std::min(t0 + ATT_ROWS, T) - 1;
                        const float *go[ATT_ROWS], *qt[ATT_ROWS], *p[ATT_ROWS], *ds[ATT_ROWS];
                        float* gq[ATT_ROWS];
                        for (int j = 0; j < ATT_ROWS; j++) {
                            int t = t0 + j;
                            bool in = t <= last;
                            size_t row = (((size_t)b * T + t) * H + h) * hd;
                            go[j] = in ? dout + row : buf.zero.data();
                            qt[j] = in ? q + row : buf.zero.data();
                            gq[j] = in ? dq + row : buf.sink.data();
                            p[j] = in ? buf.probs.data() + (size_t)j * Tp : buf.zero.data();
                            ds[j] = in ? buf.rows.data() + (size_t)j * Tp : buf.zero.data();
                        }
                        int n16 = (last + 16) / 16 * 16;
                        for (int t = t0; t <= last; t++) {  // this row of att, zero to n16
                            const float* from = att + (((size_t)b * H + h) * T + t) * T;
                            if (n16 <= T) {  // read in place: att is 0 above the diagonal
                                p[t - t0] = from;
                                continue;
                            }
                            float* pj = buf.probs.data() + (size_t)(t - t0) * Tp;
                            memcpy(pj, from, (size_t)(t + 1) * sizeof(float));
                            memset(pj + t + 1, 0, (size_t)(n16 - t - 1) * sizeof(float));
                        }
                        rows_dot_keys(buf.rows.data(), Tp, go, buf.xt.data(), hd, n16, 1.0f);  // dp
                        for (int j = 0; j <= last - t0; j++)
                            softmax_backward_row(buf.rows.data() + (size_t)j * Tp, p[j], n16);
                        rows_times_matrix<LANES>(gq, ds, last + 1, k + kv, ld, hd, scale);
                        add_rows_outer<LANES>(dk + kv, ld, last + 1, ds, qt, hd, scale);
                        add_rows_outer<LANES>(dv + kv, ld, last + 1, p, go, hd, 1.0f);
                    }
            }
    }
}
void attention_backward_fast(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                             const float* v, const float* att, int B, int T, int H, int R, int hd) {
    with_lanes(hd, [&](auto w) {
        attention_backward_blocked<decltype(w)::value>(dq, dk, dv, dout, q, k, v, att, B, T, H, R, hd);
    });
}
