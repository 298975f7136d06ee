// support/model/cpu_fast.cpp — the fast CPU path: lime.cu's matrix product
// (which also runs the KV router and the K and V projections), attention, RoPE,
// Hyper-Connections and the value-entropy regulariser, blocked so that the
// compiler keeps the sums in vector registers. Each function computes what the
// plain loop it names in lime.cu computes (tests/test_model.cpp compares them
// on random shapes); read the plain loops first. `./lime` uses these; `make
// lime-ref` builds the plain ones.
//
// Every sum runs in an order fixed by the shapes alone, never by the number of
// threads or the build's vector width: a resumed run is bit-exact, and an AVX2
// build gives the same bits as an AVX-512 one (tests/test_isa.sh). So a sum
// of many terms goes into a fixed number of partial sums (lanes), which a
// fixed tree adds; every fused multiply-add is written as one (mul_add,
// support/model/cpu_fast.h), since the compiler fuses none (-ffp-contract=off);
// the vector paths of one instruction set and the portable loops beside them
// compute the same operations in the same order.
#include "support/model/cpu_fast.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
static int thread_index() { return omp_get_thread_num(); }
static int thread_count() { return omp_get_num_threads(); }  // of this team
static bool in_parallel() { return omp_in_parallel(); }
#else
static int thread_index() { return 0; }
static int thread_count() { return 1; }
static bool in_parallel() { return false; }
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
// panels of NR columns, packed so that their rows lie NR floats apart (into
// scratch, or a block at a time onto the stack: gemm_blocked); A, a block of
// row tiles at a time, packed so that a tile's column k is MR floats in a row
// (when enough panels reuse it), else read where it lies, one pointer per row.
// Around the kernel, two levels of blocking keep
// what it reads in the caches: K in blocks of GEMM_KC (one block of a panel,
// KC x NR floats, stays in L1 while the kernel runs down a block of rows), and
// M in blocks of up to GEMM_MC_TILES tiles (one block of A, MC x KC floats,
// stays in L2 while the kernel moves across the panels).
//
// The order of every sum is fixed by the shapes alone: each element of C is
// one chain of fused multiply-adds over k = 0, 1, ..., K-1 started from 0,
// then (accumulate) added to C, as the plain loop's `*y + s`: so x + a @ W^T
// has the same bits whether the product accumulates or is added after it
// (HC's depth connection against LLaMa's residual add). That holds for one
// block of K; a longer product (K over GEMM_KC, or A's columns in kv heads)
// stores its sums to C at each block's end and the next block goes on from
// them, so C's old value joins after the first block: another order, fixed
// by the shapes all the same. The threads share out whole
// tiles, so the number of threads (and the block sizes) decide who computes an
// element, never how: a resumed run is bit-exact whatever --threads says.

// An operand of a product, read where it lies: element (i, k) is p[i*rs + k*cs].
// A row-major (rows, cols) array is {p, cols, 1}; its transpose is {p, 1, cols}.
// In the head-major KV buffer, (R, N, hd), the rows (rb) or the columns (kb)
// come in blocks of hd, one kv head each, the next head bs floats on:
// element (i, k) is p[(i/rb or k/kb) * bs + (i%rb)*rs + (k%kb)*cs] (0: no blocks).
struct MatView {
    const float* p;
    size_t rs, cs;
    int rb = 0, kb = 0;
    size_t bs = 0;
};
// Index x's block (blocks of `block`; 0: one block), x left as its place in it.
static size_t block_of(int& x, int block) {
    if (!block) return 0;
    size_t b = x / block;
    x %= block;
    return b;
}
static const float* view_at(const MatView& A, int i, int k) {
    size_t head = block_of(i, A.rb) + block_of(k, A.kb);  // (at most one of them has blocks)
    return A.p + head * A.bs + (size_t)i * A.rs + (size_t)k * A.cs;
}
// The product's C, row-major with row stride ldc; or, written into the buffer
// (R, N, hd), its columns in blocks of cb = hd, each block bs floats on.
struct OutView {
    float* p;
    size_t ldc;
    int cb = 0;
    size_t bs = 0;
};
static float* out_at(const OutView& C, int i, int j) {
    size_t head = block_of(j, C.cb);
    return C.p + head * C.bs + (size_t)i * C.ldc + j;
}
// The longest run of row i's columns j.. (at most n) that lies in one block of C.
static int out_run(const OutView& C, int j, int n) { return C.cb ? std::min(n, C.cb - j % C.cb) : n; }

// One tile's work, for a micro-kernel: C[MR, NR] (+)= A[MR, K] @ B[K, NR].
//   a[i]   row i of A's tile: its element k at a[i][k * a_cs]; the kernels'
//          run<PACKED_B, PACKED_A> with PACKED_A takes a packed tile, a[i] = a[0] + i
//          and a_cs = MR, constants
//   b      the panel: row k at b + k * ldb (NR floats); with PACKED_B the kernels
//          take ldb = NR, a constant (a packed panel), else t.ldb
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
// the compiler keeps in vector registers, vectorising the loops over j. Each
// sum is the same chain of fused multiply-adds as the vector kernels' (the same bits).
struct KernelPlain {
    static const int MR = 8, NR = 32;
    template <bool PACKED_B, bool PACKED_A>
    static void run(const TileArgs& t) {
        const size_t ldb = PACKED_B ? NR : t.ldb;
        float acc[MR][NR];
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NR; j++) acc[i][j] = t.load_c ? t.c[(size_t)i * t.ldc + j] : 0.0f;
        const float* b = t.b;
        for (int k = 0; k < t.K; k++, b += ldb)
            for (int i = 0; i < MR; i++) {
                float aik = t.a[i][k * t.a_cs];
                for (int j = 0; j < NR; j++) acc[i][j] = mul_add(aik, b[j], acc[i][j]);
            }
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NR; j++) {
                float* c = t.c + (size_t)i * t.ldc + j;
                *c = t.add_c ? *c + acc[i][j] : acc[i][j];
            }
    }
};

// The vector micro-kernel: MR x 2 vector registers of sums; per k two loads of
// B, MR broadcasts of A, 2 MR fused multiply-adds. Simd is one instruction set:
//   AVX-512  8 x 32 sums in 16 zmm registers (16 + 2 + 1 of the 32)
//   AVX2     6 x 16 sums in 12 ymm registers (12 + 2 + 1 of the 16)
template <class Simd>
struct KernelSimd {
    using Vec = typename Simd::Vec;
    static const int MR = Simd::MR, W = Simd::W, NR = 2 * Simd::W;
    template <bool PACKED_B, bool PACKED_A>
    static void run(const TileArgs& t) {
        const size_t ldb = PACKED_B ? NR : t.ldb, a_cs = PACKED_A ? MR : t.a_cs;
        Vec acc[MR][2];
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++)
            for (int h = 0; h < 2; h++)
                acc[i][h] = t.load_c ? Simd::load(t.c + (size_t)i * t.ldc + W * h) : Simd::zero();
        // The rows' pointers, held in registers for the loop: MR of them, or
        // (packed) one, the others at constant offsets. MR pointers and the
        // sums were more than x86's registers: g++ reloaded each pointer from
        // the stack before its broadcast (docs/speed.md, "A packed").
        const float* a[MR];
        for (int i = 0; i < MR; i++) a[i] = PACKED_A ? t.a[0] + i : t.a[i];
        // One k (step). With AVX-512 the loop runs four a round, so that the MR
        // pointers and the loop's count move once per four k (the same sums, in
        // the same order); with AVX2's 16 registers that round made g++ keep a
        // sum on the stack, and the plain loop (unrolled by two) ran `inp @ W^T`
        // up to 1.3x faster, a step 2-5% (docs/speed.md, "AVX2").
        auto step = [&](const float* bk, size_t ak) {
            Vec b0 = Simd::load(bk), b1 = Simd::load(bk + W);
#pragma GCC unroll 8
            for (int i = 0; i < MR; i++) {
                Vec x = Simd::broadcast(a[i] + ak);
                acc[i][0] = Simd::fma(x, b0, acc[i][0]);
                acc[i][1] = Simd::fma(x, b1, acc[i][1]);
            }
        };
        const float* b = t.b;
        size_t at = 0;
        int k = 0;
        if constexpr (Simd::ROUND4)
            for (; k + 4 <= t.K; k += 4, b += 4 * ldb, at += 4 * a_cs) {
                step(b, at);
                step(b + ldb, at + a_cs);
                step(b + 2 * ldb, at + 2 * a_cs);
                step(b + 3 * ldb, at + 3 * a_cs);
            }
#pragma GCC unroll 2
        for (; k < t.K; k++, b += ldb, at += a_cs) step(b, at);
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++)
            for (int h = 0; h < 2; h++) {
                float* c = t.c + (size_t)i * t.ldc + W * h;
                Simd::store(c, t.add_c ? Simd::add(Simd::load(c), acc[i][h]) : acc[i][h]);
            }
    }
};
#if defined(__AVX2__) && defined(__FMA__)
struct Avx2 {
    using Vec = __m256;
    static const int W = 8, MR = 6;
    static const bool ROUND4 = false;
    static Vec zero() { return _mm256_setzero_ps(); }
    static Vec load(const float* p) { return _mm256_loadu_ps(p); }
    static Vec broadcast(const float* p) { return _mm256_broadcast_ss(p); }
    static Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
    static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
    static void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
};
using KernelAvx2 = KernelSimd<Avx2>;
#endif
#if defined(__AVX512F__)
struct Avx512 {
    using Vec = __m512;
    static const int W = 16, MR = 8;
    static const bool ROUND4 = true;
    static Vec zero() { return _mm512_setzero_ps(); }
    static Vec load(const float* p) { return _mm512_loadu_ps(p); }
    static Vec broadcast(const float* p) { return _mm512_set1_ps(*p); }
    static Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
    static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
    static void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
};
using KernelAvx512 = KernelSimd<Avx512>;
#endif

// A product of at most 4 rows (the router's: Kr = W @ Kbuf has R rows, 4 at
// the bench's sizes) would leave most of an 8-row tile idle, and send every
// tile through the edge's copies: it runs the same kernel with 4 rows.
template <class Simd>
struct FourRows : Simd {
    static const int MR = 4;
};

static const int GEMM_KC = 256;       // k per block: a block of a panel is KC x NR floats (32 KB at NR = 32)
static const int GEMM_MC_TILES = 12;  // at most this many row tiles per block of A
static const int GEMM_PACK_PANELS = 4;  // A's blocks are packed in products of at least this many panels

// Runs the kernel on the tile at rows i0.., columns j0.. of C, A's tile at
// a[i][k * a_cs]; a tile that C's edge cuts (mr < MR rows or nr < NR columns),
// or that spans two kv heads of the buffer, goes through a whole tile on the
// stack. Inlined by hand: called per tile, its call cost more than packing
// saved at d = 32 (docs/speed.md, "A packed").
template <class Kern, bool PACKED_B, bool PACKED_A>
__attribute__((always_inline)) inline static void gemm_tile(OutView C, const float* const* a, size_t a_cs,
                                                            const float* b, size_t ldb, int M, int N, int i0, int j0,
                                                            int kc, bool load_c, bool add_c) {
    const int MR = Kern::MR, NR = Kern::NR;
    int mr = std::min(MR, M - i0), nr = std::min(NR, N - j0);
    if (mr == MR && nr == NR && out_run(C, j0, NR) == NR) {
        Kern::template run<PACKED_B, PACKED_A>({a, a_cs, b, ldb, out_at(C, i0, j0), C.ldc, kc, load_c, add_c});
        return;
    }
    alignas(64) float tile[MR * NR];
    // The tile's columns as runs that each lie in one block of C (one kv head):
    // run r is columns from[r] .. from[r] + len[r] - 1, at[r] in C's row i0.
    int from[NR], len[NR], runs = 0;
    float* at[NR];
    for (int j = 0; j < nr; j += len[runs], runs++) {
        from[runs] = j;
        len[runs] = out_run(C, j0 + j, nr - j);
        at[runs] = out_at(C, i0, j0 + j);
    }
    auto copy = [&](bool to_tile) {  // the tile's mr x nr floats, from C or back into it
        for (int i = 0; i < mr; i++)
            for (int r = 0; r < runs; r++) {
                float *c = at[r] + (size_t)i * C.ldc, *t = tile + i * NR + from[r];
                if (len[r] == 8)  // a kv head of 8 floats (d = 32): a copy of constant size, inlined
                    memcpy(to_tile ? t : c, to_tile ? c : t, 8 * sizeof(float));
                else
                    memcpy(to_tile ? t : c, to_tile ? c : t, len[r] * sizeof(float));
            }
    };
    if (load_c || add_c) copy(true);
    Kern::template run<PACKED_B, PACKED_A>({a, a_cs, b, ldb, tile, (size_t)NR, kc, load_c, add_c});
    copy(false);
}

#if defined(__AVX2__) && defined(__FMA__)
// Columns k .. k + 7 of six rows (each row's floats contiguous) as eight runs
// of six floats at pa, pa + 6, ..., pa + 42: an 8 x 8 transpose in registers
// (rows 6 and 7 zero). Each run is stored 8 floats wide and the next run's
// store overwrites the 2 extra, so pa needs 2 floats of room past pa + 48.
static void six_rows_to_columns(float* pa, const float* const* a, int k) {
    __m256 z = _mm256_setzero_ps(), r[8] = {_mm256_loadu_ps(a[0] + k), _mm256_loadu_ps(a[1] + k),
                                            _mm256_loadu_ps(a[2] + k), _mm256_loadu_ps(a[3] + k),
                                            _mm256_loadu_ps(a[4] + k), _mm256_loadu_ps(a[5] + k), z, z};
    __m256 u[8], v[8];
    for (int i = 0; i < 8; i += 2) {  // u: rows i, i+1 interleaved, low and high pairs of each 128-bit half
        u[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        u[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4)  // v: four rows' columns, k and k + 4 in the two halves
        for (int h = 0; h < 2; h++) {
            v[i + 2 * h] = _mm256_shuffle_ps(u[i + h], u[i + 2 + h], _MM_SHUFFLE(1, 0, 1, 0));
            v[i + 2 * h + 1] = _mm256_shuffle_ps(u[i + h], u[i + 2 + h], _MM_SHUFFLE(3, 2, 3, 2));
        }
    // column j, then j + 4: rows 0-3 from v[j], rows 4-7 from v[4 + j], in the order of pa
    for (int j = 0; j < 4; j++) _mm256_storeu_ps(pa + 6 * j, _mm256_permute2f128_ps(v[j], v[4 + j], 0x20));
    for (int j = 0; j < 4; j++) _mm256_storeu_ps(pa + 6 * (j + 4), _mm256_permute2f128_ps(v[j], v[4 + j], 0x31));
}
#endif

// A's rows i0 .. i0 + tiles * MR - 1, columns k0 .. k0 + kc - 1, packed tile by
// tile: tile t's column k at pa + (t * kc + k) * MR; rows past M repeat row M - 1.
// (pa needs 2 floats of room past the last tile: six_rows_to_columns.)
template <int MR>
static void pack_a(float* pa, MatView A, int M, int i0, int tiles, int k0, int kc) {
    for (int t = 0; t < tiles; t++, pa += (size_t)kc * MR) {
        const float* a[MR];
        bool column_runs = A.cs != 1;  // a column of the tile lies in one run of MR floats
        for (int i = 0; i < MR; i++) {
            a[i] = view_at(A, std::min(i0 + t * MR + i, M - 1), k0);
            column_runs = column_runs && a[i] == a[0] + i;
        }
        int k = 0;
        if (column_runs)  // (dout^T: the weight gradient's A)
            for (; k < kc; k++) memcpy(pa + k * MR, a[0] + k * A.cs, MR * sizeof(float));
#if defined(__AVX2__) && defined(__FMA__)
        if constexpr (MR == 6)  // (the AVX2 kernel's tiles of a row-major A: inp, dout)
            if (A.cs == 1)
                for (; k + 8 <= kc; k += 8) six_rows_to_columns(pa + k * MR, a, k);
#endif
        for (; k < kc; k++)
            for (int i = 0; i < MR; i++) pa[k * MR + i] = a[i][k * A.cs];
    }
}

// The row tiles t_begin .. t_end - 1 of one panel (columns j0..) and one block
// of K (k0..): A's tiles packed in a_block (PACKED_A, from tile t_begin) or
// read where they lie, their rows past M repeating row M - 1.
template <class Kern, bool PACKED_B, bool PACKED_A>
__attribute__((always_inline)) inline static void gemm_tiles(OutView C, MatView A, const float* a_block,
                                                             const float* b, size_t ldb, int M, int N, int t_begin,
                                                             int t_end, int j0, int k0, int kc, bool load_c,
                                                             bool add_c) {
    const int MR = Kern::MR;
    for (int t = t_begin; t < t_end; t++) {
        const float* a[MR];
        for (int i = 0; i < MR; i++)
            a[i] = PACKED_A ? a_block + (size_t)(t - t_begin) * kc * MR + i : view_at(A, std::min(t * MR + i, M - 1), k0);
        gemm_tile<Kern, PACKED_B, PACKED_A>(C, a, PACKED_A ? MR : A.cs, b, ldb, M, N, t * MR, j0, kc, load_c, add_c);
    }
}

// One panel p's block of K (k0 .. k0 + kc - 1) for the row tiles t_begin ..
// t_end - 1: B's block packed (block) or read where it lies, then the tiles.
// Inlined, with the tiles, into gemm_blocked's loop over panels: called per
// panel, its arguments went through the stack at every call, which cost as
// much as the work of the router's panels (a row tile, k <= 16).
template <class Kern>
__attribute__((always_inline)) inline static void gemm_panel_block(OutView C, MatView A, MatView B,
                                                                   const float* a_block, float* block,
                                                                   const float* scratch, int M, int N, int K,
                                                                   int t_begin, int t_end, int p, int k0, int kc,
                                                                   bool accumulate, bool pack) {
    const int NR = Kern::NR;
    int cols = std::min(NR, N - p * NR);  // the panel's columns in B
    bool in_place = B.cs == 1 && cols == NR && t_end - t_begin == 1;
    const float* b = block;
    if (B.cs != 1) {
        b = scratch + ((size_t)p * K + k0) * NR;  // packed before the tiles
    } else if (in_place) {
        b = B.p + (size_t)k0 * B.rs + (size_t)p * NR;
    } else {
        for (int k = 0; k < kc; k++) {
            float* row = block + (size_t)k * NR;
            const float* from = B.p + (size_t)(k0 + k) * B.rs + (size_t)p * NR;
            if (cols == NR)  // (a copy of constant size: g++ made the loop 2 NR scalar moves)
                memcpy(row, from, NR * sizeof(float));
            else
                for (int j = 0; j < NR; j++) row[j] = j < cols ? from[j] : 0.0f;
        }
    }
    bool load_c = k0 > 0, add_c = accumulate && k0 == 0;
    int j0 = p * NR;
    if (in_place && pack)
        gemm_tiles<Kern, false, true>(C, A, a_block, b, B.rs, M, N, t_begin, t_end, j0, k0, kc, load_c, add_c);
    else if (in_place)
        gemm_tiles<Kern, false, false>(C, A, a_block, b, B.rs, M, N, t_begin, t_end, j0, k0, kc, load_c, add_c);
    else if (pack)
        gemm_tiles<Kern, true, true>(C, A, a_block, b, NR, M, N, t_begin, t_end, j0, k0, kc, load_c, add_c);
    else
        gemm_tiles<Kern, true, false>(C, A, a_block, b, NR, M, N, t_begin, t_end, j0, k0, kc, load_c, add_c);
}

// C[M, N] (+)= A[M, K] @ B[K, N]. A block of K ends where a kv head of A's
// columns does (A.kb).
// B's panels reach the kernel packed, rows NR floats apart, zero past column N:
// a constant stride, which the kernel's loads take as an offset, and a block of
// a panel, KC x NR floats, in one piece (read in place at C = 128, its rows lie
// 512 bytes apart, in a quarter of the L1 cache's sets). W^T, packed before as
// well, gained as much as the others, so the stride is at least part of the
// gain (measured in docs/speed.md, "B's panels packed").
// - B read transposed (B.cs != 1): all panels once, before the tiles, panel p at
//   scratch + p * K * NR (K * round_up(N, NR) floats of scratch);
// - B's rows contiguous: each work unit copies its block of the panel, KC x NR
//   floats, onto its own stack, and its row tiles all read it. A unit of one
//   row tile (the router's products) reads a whole panel in place instead.
// A's blocks, a row block by a block of K, are packed (onto the stack) once
// for all the panels a thread runs them with, when there are at least
// GEMM_PACK_PANELS panels: with two (d = 32) the copy cost more than it saved.
// This thread's share of the product: every thread of the team calls it
// with the same arguments (gemm_cpu, matmul_backward_fast and
// kv_projection_backward_fast start the team; a team of one computes it all).
template <class Kern>
static void gemm_blocked(OutView C, MatView A, MatView B, int M, int N, int K, bool accumulate, float* scratch) {
    const int MR = Kern::MR, NR = Kern::NR;
    int row_tiles = (M + MR - 1) / MR, panels = (N + NR - 1) / NR;
    if (K == 0) {  // an empty sum: C = 0, or C unchanged
        if (!accumulate && thread_index() == 0)
            for (int i = 0; i < M; i++)
                for (int j = 0, run; j < N; j += run) {
                    run = out_run(C, j, N - j);
                    memset(out_at(C, i, j), 0, run * sizeof(float));
                }
        return;
    }
    if (B.cs != 1) {  // (the team's loop: its threads wait here until B is packed)
#pragma omp for schedule(static)
        for (int p = 0; p < panels; p++) {
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
    // thread, blocks of at most GEMM_MC_TILES tiles. Block rb is the tiles
    // rb * row_tiles / row_blocks onwards: sizes that differ by at most one
    // tile. (Blocks of 12 with the remainder last gave the second thread 124
    // of M = 2048's 256 tiles and the first 132: docs/speed.md, "Even blocks".)
    int threads = thread_count();
    int row_blocks = std::max((threads + panels - 1) / panels, (row_tiles + GEMM_MC_TILES - 1) / GEMM_MC_TILES);
    row_blocks = std::min(row_blocks, row_tiles);
    auto block_start = [&](int rb) { return (int)((long)row_tiles * rb / row_blocks); };
    alignas(64) float block[GEMM_KC * NR];  // this unit's block of its panel (B's rows contiguous)
    // its row block's block of A, packed (+ 8: the room six_rows_to_columns' last store needs)
    alignas(64) float a_block[GEMM_MC_TILES * MR * GEMM_KC + 8];
    bool pack = panels >= GEMM_PACK_PANELS;
    // The units, in the order (row block, panel), shared out as runs of
    // consecutive ones: this thread's are u_begin .. u_end - 1.
    int units = row_blocks * panels, u_begin = (int)((long)units * thread_index() / threads),
        u_end = (int)((long)units * (thread_index() + 1) / threads);
    for (int rb = u_begin / panels; rb * panels < u_end; rb++) {
        int t_begin = block_start(rb), t_end = block_start(rb + 1);
        int p_begin = std::max(u_begin - rb * panels, 0), p_end = std::min(u_end - rb * panels, panels);
        for (int k0 = 0, kc; k0 < K; k0 += kc) {
            kc = std::min(GEMM_KC, K - k0);
            if (A.kb) kc = std::min(kc, A.kb - k0 % A.kb);
            if (pack) pack_a<MR>(a_block, A, M, t_begin * MR, t_end - t_begin, k0, kc);
            for (int p = p_begin; p < p_end; p++)
                gemm_panel_block<Kern>(C, A, B, a_block, block, scratch, M, N, K, t_begin, t_end, p, k0, kc,
                                       accumulate, pack);
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

// This thread's share of C (+)= A @ B with the kernel in use.
static void gemm_share(OutView C, MatView A, MatView B, int M, int N, int K, bool accumulate, float* scratch) {
    const char* name = GEMM_KERNELS[gemm_kernel];
    (void)name;  // (a build with the portable kernel alone)
#if defined(__AVX512F__)
    if (!strcmp(name, "avx512"))
        return M <= 4 ? gemm_blocked<KernelSimd<FourRows<Avx512>>>(C, A, B, M, N, K, accumulate, scratch)
                      : gemm_blocked<KernelAvx512>(C, A, B, M, N, K, accumulate, scratch);
#endif
#if defined(__AVX2__) && defined(__FMA__)
    if (!strcmp(name, "avx2"))
        return M <= 4 ? gemm_blocked<KernelSimd<FourRows<Avx2>>>(C, A, B, M, N, K, accumulate, scratch)
                      : gemm_blocked<KernelAvx2>(C, A, B, M, N, K, accumulate, scratch);
#endif
    gemm_blocked<KernelPlain>(C, A, B, M, N, K, accumulate, scratch);
}

// A product large enough to share, and not inside a parallel loop already (as
// the regulariser's per sequence, where this thread computes it alone).
static bool gemm_threaded(int M, int N, int K) { return (double)M * N * K > 32768 && !in_parallel(); }

// C[M, N] (+)= A[M, K] @ B[K, N] on all the threads.
static void gemm_cpu(OutView C, MatView A, MatView B, int M, int N, int K, bool accumulate, float* scratch) {
#pragma omp parallel if (gemm_threaded(M, N, K))
    gemm_share(C, A, B, M, N, K, accumulate, scratch);
}

const char* matmul_fast_kernel() { return GEMM_KERNELS[gemm_kernel]; }
#ifdef LIME_TESTING
int matmul_fast_kernels() { return (int)(sizeof GEMM_KERNELS / sizeof GEMM_KERNELS[0]); }
void matmul_fast_use_kernel(int i) { gemm_kernel = i; }
#endif

// A product with few outputs and long rows (the router's weight gradient:
// R x (l+1)R outputs, each a dot product N*hd long) would be one tile for one
// thread. Instead each row is cut into DOT_SLICES fixed slices; the threads
// share the slices, each computing all N x OC dot products over its slice into
// partial (DOT_SLICES, N, OC), and then the slices are added in order.
static const int DOT_SLICES = 64;
static bool few_long_dots(int N, int C, int OC) {  // at least 64 floats a slice; partial within C * OC floats
    return (size_t)N * OC <= 65536 && C >= 64 * DOT_SLICES && (size_t)N * DOT_SLICES <= (size_t)C;
}
// part (N, OC) = the dot products of inp's rows (N, C) and W's (OC, C) over columns from .. to - 1.
// NB rows of inp by OB of W at a time: NB x OB sums of 8 lanes, independent
// chains of fused multiply-adds. 4 x 2 (R >= 3 kv heads) is eight chains and
// six vector loads for every eight of them; with R = 2 it is 2 x 4, with R = 1
// 1 x 4, so that no row is computed twice. One dot product at a time waited on
// its one chain's latency: the router's dW ran at 14 GFLOP/s on one core
// (docs/speed.md, "Sliced dots"). Each sum adds the same products in the
// same order whatever the tile, so the tile does not change the bits.
// With AVX2 the sums are NB x OB ymm registers, written out: g++ vectorised
// the plain form across the sums instead, each x and w gathered a float at
// a time and the sums stored every 8 columns (1.5-3x slower, docs/speed.md,
// "The router's dots in registers"); the same fused multiply-adds, in the same
// order, as g++ made of the plain form (the same bits).
template <int NB, int OB>
static void dots_of_slice(float* part, const float* inp, const float* W, int N, int C, int OC, size_t from, size_t to) {
    const int LANES = 8;
    for (int n0 = 0; n0 < N; n0 += NB)
        for (int o0 = 0; o0 < OC; o0 += OB) {
            const float *x[NB], *w[OB];  // past the edge: the last row again, its sums unused
            for (int a = 0; a < NB; a++) x[a] = inp + (size_t)std::min(n0 + a, N - 1) * C;
            for (int b = 0; b < OB; b++) w[b] = W + (size_t)std::min(o0 + b, OC - 1) * C;
            float acc[NB][OB][LANES] = {};
            size_t i = from;
#if defined(__AVX2__) && defined(__FMA__)
            __m256 sums[NB][OB];
            for (int a = 0; a < NB; a++)
                for (int b = 0; b < OB; b++) sums[a][b] = _mm256_setzero_ps();
            for (; i + LANES <= to; i += LANES) {
                __m256 wv[OB];
                for (int b = 0; b < OB; b++) wv[b] = _mm256_loadu_ps(w[b] + i);
                for (int a = 0; a < NB; a++) {
                    __m256 xv = _mm256_loadu_ps(x[a] + i);
                    for (int b = 0; b < OB; b++) sums[a][b] = _mm256_fmadd_ps(xv, wv[b], sums[a][b]);
                }
            }
            for (int a = 0; a < NB; a++)
                for (int b = 0; b < OB; b++) _mm256_storeu_ps(acc[a][b], sums[a][b]);
#else
            for (; i + LANES <= to; i += LANES)
                for (int a = 0; a < NB; a++)
                    for (int b = 0; b < OB; b++)
                        for (int k = 0; k < LANES; k++)
                            acc[a][b][k] = mul_add(x[a][i + k], w[b][i + k], acc[a][b][k]);
#endif
            for (; i < to; i++)  // the slice's last columns, in lane 0
                for (int a = 0; a < NB; a++)
                    for (int b = 0; b < OB; b++) acc[a][b][0] = mul_add(x[a][i], w[b][i], acc[a][b][0]);
            for (int a = 0; a < std::min(NB, N - n0); a++)
                for (int b = 0; b < std::min(OB, OC - o0); b++) {
                    float d = 0;
                    for (int k = 0; k < LANES; k++) d += acc[a][b][k];
                    part[(size_t)(n0 + a) * OC + o0 + b] = d;
                }
        }
}
static void dots_sliced(float* out, const float* inp, const float* W, int N, int C, int OC, bool accumulate,
                        float* partial) {
#pragma omp parallel for schedule(static)
    for (int s = 0; s < DOT_SLICES; s++) {
        float* part = partial + (size_t)s * N * OC;
        size_t from = (size_t)C * s / DOT_SLICES, to = (size_t)C * (s + 1) / DOT_SLICES;
        if (N >= 3) dots_of_slice<4, 2>(part, inp, W, N, C, OC, from, to);
        else if (N == 2) dots_of_slice<2, 4>(part, inp, W, N, C, OC, from, to);
        else dots_of_slice<1, 4>(part, inp, W, N, C, OC, from, to);
    }
    for (size_t e = 0; e < (size_t)N * OC; e++) {
        float d = 0;
        for (int s = 0; s < DOT_SLICES; s++) d += partial[(size_t)s * N * OC + e];
        out[e] = accumulate ? out[e] + d : d;
    }
}

// = matmul_forward: out (N, OC) (+)= inp (N, C) @ W^T, W (OC, C).
// scratch: C * round_up(OC, 32) floats (W^T, packed; or the slices' sums).
void matmul_forward_fast(float* out, const float* inp, const float* W, int N, int C, int OC, bool accumulate,
                         float* scratch) {
    if (few_long_dots(N, C, OC)) return dots_sliced(out, inp, W, N, C, OC, accumulate, scratch);
    gemm_cpu({out, (size_t)OC}, {inp, (size_t)C, 1}, {W, 1, (size_t)C}, N, OC, C, accumulate, scratch);
}

// = matmul_backward: dinp (N, C) (+)= dout (N, OC) @ W (OC, C);  dW (OC, C) += dout^T @ inp (either may be nullptr)
// B's rows are contiguous in both (W, inp): no scratch (gemm_blocked packs them on the stack).
// The two products run on one team: they write different arrays and read
// only inputs, so each thread goes on from its share of the first to its
// share of the second, and the threads wait once, at the end, not twice.
void matmul_backward_fast(float* dinp, float* dW, const float* dout, const float* inp, const float* W, int N, int C,
                          int OC, bool add_dinp) {
#pragma omp parallel if (gemm_threaded(N, C, OC))
    {
        if (dinp) gemm_share({dinp, (size_t)C}, {dout, (size_t)OC, 1}, {W, (size_t)C, 1}, N, C, OC, add_dinp, nullptr);
        if (dW) gemm_share({dW, (size_t)C}, {dout, 1, (size_t)OC}, {inp, (size_t)C, 1}, OC, C, N, true, nullptr);
    }
}

// = kv_projection_forward: out (R, N, hd) = inp (N, C) @ W^T, W (R*hd, C),
// each kv head's hd columns written as its own (N, hd) rows of the buffer.
// scratch: C * round_up(R*hd, 32) floats (W^T, packed).
void kv_projection_forward_fast(float* out, const float* inp, const float* W, int N, int C, int R, int hd,
                                float* scratch) {
    OutView heads{out, (size_t)hd, hd, (size_t)N * hd};
    gemm_cpu(heads, {inp, (size_t)C, 1}, {W, 1, (size_t)C}, N, R * hd, C, false, scratch);
}

// = kv_projection_backward: dinp (N, C) += dout @ W;  dW (R*hd, C) += dout^T @ inp,
// with dout (R, N, hd) read as the (N, R*hd) matrix it holds. No scratch, and
// one team for the two products, as matmul_backward_fast.
void kv_projection_backward_fast(float* dinp, float* dW, const float* dout, const float* inp, const float* W, int N,
                                 int C, int R, int hd) {
    size_t head = (size_t)N * hd;  // floats from one kv head's rows to the next's
    MatView by_token{dout, (size_t)hd, 1, 0, hd, head}, by_column{dout, 1, (size_t)hd, hd, 0, head};
#pragma omp parallel if (gemm_threaded(N, C, R * hd))
    {
        gemm_share({dinp, (size_t)C}, by_token, {W, (size_t)C, 1}, N, C, R * hd, true, nullptr);
        gemm_share({dW, (size_t)C}, by_column, {inp, (size_t)C, 1}, R * hd, C, N, true, nullptr);
    }
}

size_t matmul_fast_forward_scratch_floats(int N, int C, int OC) {
    return few_long_dots(N, C, OC) ? (size_t)DOT_SLICES * N * OC : matmul_fast_scratch_floats(C, OC);
}

// The named products (lime.cu's gemm_nn, gemm_nt, gemm_tn), on all the threads.
// = gemm_nn: C (M, N) (+)= A (M, K) @ B (K, N).
void gemm_nn_fast(float* C, const float* A, const float* B, int M, int N, int K, bool accumulate) {
    gemm_cpu({C, (size_t)N}, {A, (size_t)K, 1}, {B, (size_t)N, 1}, M, N, K, accumulate, nullptr);
}
// = gemm_nt: C (M, N) (+)= A (M, K) @ B^T, B (N, K); scratch: as matmul_forward_fast's.
void gemm_nt_fast(float* C, const float* A, const float* B, int M, int N, int K, bool accumulate, float* scratch) {
    matmul_forward_fast(C, A, B, M, K, N, accumulate, scratch);
}
// = gemm_tn: C (M, N) += A^T @ B, A (K, M), B (K, N).
void gemm_tn_fast(float* C, const float* A, const float* B, int M, int N, int K) {
    gemm_cpu({C, (size_t)N}, {A, 1, (size_t)M}, {B, (size_t)N, 1}, M, N, K, true, nullptr);
}

// ===========================================================================
// The value-entropy regulariser (support/study/entropy_reg.cuh: ereg_forward, ereg_backward)
// ===========================================================================
//
// Per sequence, Z (n, D) holds its n valid positions' centred values, packed
// together (the padding dropped). The plain loops build G = Z^T Z (D, D) and,
// backward, Z G (n, D): n D^2 multiply-adds each. Only tr(G), ||G||_F^2 and Z G
// are used, and the n x n Gram K = Z Z^T gives all three:
//   tr(K) = sum_t |Z[t]|^2 = tr(G)
//   ||K||_F^2 = tr(Z Z^T Z Z^T) = tr(Z^T Z Z^T Z) = ||G||_F^2
//   K Z = Z (Z^T Z) = Z G
// at n^2 D multiply-adds each. So a sequence with n < D uses K, stored in the
// first n^2 floats of its G slot (n^2 < D^2), and one with n >= D uses G; the
// backward recounts n and reads the slot the same way. Both products are the
// blocked ones above, each run by the one thread that takes its sequence; mu is
// summed as the plain loop sums it (the same bits), the products in their own
// fixed order (equal to rounding), whatever the number of threads.
//
// Each thread (at most EREG_SLOTS) takes every threads-th sequence in its own
// slot of the scratch (ereg_fast_scratch_floats), which stays in its caches:
// Z (T, D), the product Z G or K Z (T, D), and the products' packed panels.
static const int EREG_SLOTS = 32;
static size_t ereg_slot_floats(int T, int D) {
    return 2 * (size_t)T * D + matmul_fast_scratch_floats(std::max(T, D), D);
}
size_t ereg_fast_scratch_floats(int B, int T, int D) {
    return (size_t)std::min(B, EREG_SLOTS) * ereg_slot_floats(T, D);
}
// Calls f(b, slot) for every sequence b, slot the scratch of the thread that runs it.
template <class F>
static void ereg_for_sequences(int B, F f) {
#ifdef _OPENMP
#pragma omp parallel num_threads(std::min({B, EREG_SLOTS, omp_get_max_threads()}))
    {
        int slot = omp_get_thread_num(), threads = omp_get_num_threads();
        for (int b = slot; b < B; b += threads) f(b, slot);
    }
#else
    for (int b = 0; b < B; b++) f(b, 0);
#endif
}

// Z (n, D) = V[t] - mu at b's valid t, in order; returns n.
static int ereg_pack(float* Z, const float* Vb, const float* vb, const float* m, int T, int D) {
    int n = 0;
    for (int t = 0; t < T; t++) {
        if (vb[t] == 0) continue;
        const float* v = Vb + (size_t)t * D;
        float* z = Z + (size_t)n++ * D;
        for (int j = 0; j < D; j++) z[j] = v[j] - m[j];
    }
    return n;
}

void ereg_forward_fast(float* stat, float* mu, float* G, const float* V, const float* valid, int B, int T, int D,
                       float* scratch) {
    ereg_for_sequences(B, [&](int b, int slot) {
        const float* Vb = V + (size_t)b * T * D;  // (T, D)
        const float* vb = valid + (size_t)b * T;  // (T)
        float* m = mu + (size_t)b * D;            // (D)
        float* g = G + (size_t)b * D * D;         // (D, D): G, or K (n, n) when n < D
        float* Z = scratch + (size_t)slot * ereg_slot_floats(T, D);  // (n, D)
        float* pack = Z + 2 * (size_t)T * D;
        int valid_n = 0;
        for (int t = 0; t < T; t++) valid_n += vb[t] != 0;
        for (int j0 = 0; j0 < D; j0 += 64) {  // mu, each sum over t in order as ereg_forward's, 64 j at a time
            int w = std::min(64, D - j0);
            double s[64] = {0};
            for (int t = 0; t < T; t++)
                if (vb[t] != 0)
                    for (int j = 0; j < w; j++) s[j] += Vb[(size_t)t * D + j0 + j];
            for (int j = 0; j < w; j++) m[j0 + j] = valid_n ? (float)(s[j] / valid_n) : 0.0f;
        }
        int n = ereg_pack(Z, Vb, vb, m, T, D);
        int E = n < D ? n : D;  // the Gram's size: K (n, n) = Z Z^T or G (D, D) = Z^T Z
        if (n >= D) gemm_cpu({g, (size_t)D}, {Z, 1, (size_t)D}, {Z, (size_t)D, 1}, D, D, n, false, pack);  // G = Z^T Z
        else if (n > 0) gemm_cpu({g, (size_t)n}, {Z, (size_t)D, 1}, {Z, 1, (size_t)D}, n, n, D, false, pack);  // K = Z Z^T
        // S2 = -log(||G||_F^2 / tr(G)^2), the same from K; ||.||_F^2 in 8 lanes, then the lanes in order
        double tr = 0, f2 = 0, lane[8] = {0};
        for (int i = 0; i < E; i++) tr += g[(size_t)i * E + i];
        size_t EE = (size_t)E * E, i = 0;
        for (; i + 8 <= EE; i += 8)
            for (int k = 0; k < 8; k++) lane[k] += (double)g[i + k] * g[i + k];
        for (; i < EE; i++) lane[i % 8] += (double)g[i] * g[i];
        for (int k = 0; k < 8; k++) f2 += lane[k];
        float* st = stat + 4 * b;
        bool has_s2 = n >= 2 && tr > 0 && f2 > 0;
        st[0] = has_s2 ? (float)-std::log(f2 / (tr * tr)) : 0.0f;
        st[1] = has_s2 ? (float)(4.0 / tr) : 0.0f;
        st[2] = has_s2 ? (float)(4.0 / f2) : 0.0f;
        st[3] = 0.0f;
    });
}

void ereg_backward_fast(float* dV, const float* V, const float* valid, const float* mu, const float* G,
                        const float* stat, float scale, int B, int T, int D, float* scratch) {
    ereg_for_sequences(B, [&](int b, int slot) {
        const float* st = stat + 4 * b;
        if (st[1] == 0) return;  // no S2: no gradient
        const float* Vb = V + (size_t)b * T * D;  // (T, D)
        const float* vb = valid + (size_t)b * T;  // (T)
        const float* g = G + (size_t)b * D * D;   // G (D, D), or K (n, n) when n < D
        float* Z = scratch + (size_t)slot * ereg_slot_floats(T, D);  // (n, D)
        float* ZG = Z + (size_t)T * D;                               // (n, D)
        float* pack = ZG + (size_t)T * D;
        int n = ereg_pack(Z, Vb, vb, mu + (size_t)b * D, T, D);
        if (n < D) gemm_cpu({ZG, (size_t)D}, {g, (size_t)n, 1}, {Z, (size_t)D, 1}, n, D, n, false, pack);  // K Z
        else gemm_cpu({ZG, (size_t)D}, {Z, (size_t)D, 1}, {g, (size_t)D, 1}, n, D, D, false, pack);        // Z G
        // dV[t] += scale * (4 Z[t] / tr(G) - 4 (Z G)[t] / ||G||_F^2) at the valid t
        for (int t = 0, r = 0; t < T; t++) {
            if (vb[t] == 0) continue;
            float* dv = dV + ((size_t)b * T + t) * D;
            const float *z = Z + (size_t)r * D, *zg = ZG + (size_t)r * D;
            for (int j = 0; j < D; j++) dv[j] += scale * (st[1] * z[j] - st[2] * zg[j]);
            r++;
        }
    });
}

// ===========================================================================
// RoPE: the plain loop of lime.cu's rope_rotate, its pairs (i, i + hd/2) taken
// LANES at a time (16, 4 or 1, a compile-time constant dividing hd/2): with a
// run-time count of 4 (hd = 8) the compiler's vector loop never ran, and the
// pass moved 3 GB/s. The same arithmetic, so the same bits.
// ===========================================================================

template <int LANES>
static void rope_rotate_blocked(float* out, const float* x, const float* cos_t, const float* sin_t, int B, int T,
                                int nh, int hd, float sign, bool add) {
    int half = hd / 2;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float* cs = cos_t + t * half;
            const float* sn = sin_t + t * half;
            for (int h = 0; h < nh; h++) {
                size_t row = (((size_t)b * T + t) * nh + h) * hd;
                const float* v = x + row;
                float* y = out + row;
                for (int i0 = 0; i0 < half; i0 += LANES)
#pragma omp simd
                    for (int i = i0; i < i0 + LANES; i++) {
                        float x0 = v[i], x1 = v[i + half], s = sign * sn[i];
                        float y0 = x0 * cs[i] - x1 * s, y1 = x1 * cs[i] + x0 * s;
                        y[i] = add ? y[i] + y0 : y0;
                        y[i + half] = add ? y[i + half] + y1 : y1;
                    }
            }
        }
}
void rope_rotate_fast(float* out, const float* x, const float* cos_t, const float* sin_t, int B, int T, int nh, int hd,
                      float sign, bool add) {
    // with_lanes' w divides hd, so w / 2 (16, 4 or 1) divides hd / 2
    with_lanes(hd, [&](auto w) {
        rope_rotate_blocked<decltype(w)::value / 2>(out, x, cos_t, sin_t, B, T, nh, hd, sign, add);
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

// xt (hd, Tp) = x^T for one kv head's rows x (T, hd); zero past T.
static void head_transposed(float* xt, const float* x, int T, int Tp, int hd) {
    int T16 = T / 16 * 16;
    for (int i = 0; i < hd; i++) {
        for (int u0 = 0; u0 < T16; u0 += 16)
#pragma omp simd
            for (int u = u0; u < u0 + 16; u++) xt[(size_t)i * Tp + u] = x[(size_t)u * hd + i];
        for (int u = T16; u < Tp; u++) xt[(size_t)i * Tp + u] = u < T ? x[(size_t)u * hd + i] : 0.0f;
    }
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
                for (int u = 0; u < 16; u++) acc[j][u] = mul_add(a[j][i], x[u], acc[j][u]);
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
                for (int i = 0; i < LANES; i++) acc[j][i] = mul_add(pju, mu[i], acc[j][i]);
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
                for (int j = 0; j < ATT_ROWS; j++) s = mul_add(au[j], xs[j][i], s);
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
#pragma omp simd  // (without it the compiler kept the 16 maxima as scalars, a branch each)
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
#pragma omp simd  // (without it g++ unrolled the 16 lanes into 16 scalar fused multiply-adds)
        for (int i = 0; i < 16; i++) part[i] = mul_add(p[u + i], ds[u + i], part[i]);
    float pdp = lanes_sum(part);
    for (int u = 0; u < n; u++) ds[u] = p[u] * (ds[u] - pdp);
}

// Per thread, carved from the caller's scratch: the transposed keys (or
// values) of one kv head (hd, Tp), ATT_ROWS rows of scores (and backward, of
// probabilities), a row of zeros and a sink for the rows past T.
struct AttentionBuffers {
    float *xt, *rows, *probs, *zero, *sink;
    static size_t floats(int Tp, int hd) { return (size_t)hd * Tp + 2 * (size_t)ATT_ROWS * Tp + 2 * (size_t)std::max(Tp, hd); }
    AttentionBuffers(float* scratch, int Tp, int hd) {
        xt = scratch + (size_t)thread_index() * floats(Tp, hd);
        rows = xt + (size_t)hd * Tp;
        probs = rows + (size_t)ATT_ROWS * Tp;
        zero = probs + (size_t)ATT_ROWS * Tp;
        sink = zero + std::max(Tp, hd);
        memset(zero, 0, (size_t)std::max(Tp, hd) * sizeof(float));  // each call: other ops share the scratch
    }
};
size_t attention_fast_scratch_floats(int T, int hd, int threads) {
    return (size_t)threads * AttentionBuffers::floats((T + 15) / 16 * 16, hd);
}
// The threads a parallel region over attention may use: as many as OpenMP
// would, at most as many as the scratch has buffers for.
static int attention_threads(int threads) { return std::max(1, std::min(threads, cpu_threads())); }

// out (B, T, H, hd), att (B, H, T, T); q (B, T, H, hd); k, v (R, B, T, hd), head-major.
template <int LANES>
static void attention_forward_blocked(float* out, float* att, const float* q, const float* k, const float* v, int B,
                                      int T, int H, int R, int hd, float* scratch, int threads) {
    int n_rep = H / R, Tp = (T + 15) / 16 * 16;
    float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel num_threads(attention_threads(threads))
    {
        AttentionBuffers buf(scratch, Tp, hd);
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int r = 0; r < R; r++) {
                size_t kv = ((size_t)r * B + b) * T * hd;  // row u of this kv head: kv + u * hd
                head_transposed(buf.xt, k + kv, T, Tp, hd);
                const float* vr = v + kv;
                for (int h = r * n_rep; h < (r + 1) * n_rep; h++)
                    for (int t0 = 0; t0 < T; t0 += ATT_ROWS) {
                        int last = std::min(t0 + ATT_ROWS, T) - 1;  // rows t0 .. last
                        const float *qt[ATT_ROWS], *pt[ATT_ROWS];
                        float *o[ATT_ROWS], *p[ATT_ROWS];
                        for (int j = 0; j < ATT_ROWS; j++) {
                            int t = t0 + j;
                            bool in = t <= last;
                            qt[j] = in ? q + (((size_t)b * T + t) * H + h) * hd : buf.zero;
                            p[j] = in ? att + (((size_t)b * H + h) * T + t) * T : buf.sink;
                            o[j] = in ? out + (((size_t)b * T + t) * H + h) * hd : buf.sink;
                            pt[j] = in ? p[j] : buf.zero;
                        }
                        int n16 = (last + 16) / 16 * 16;  // positions 0 .. last in whole vectors
                        rows_dot_keys(buf.rows, Tp, qt, buf.xt, hd, n16, scale);
                        for (int t = t0; t <= last; t++)
                            softmax_row(p[t - t0], buf.rows + (size_t)(t - t0) * Tp, t, n16, T);
                        rows_times_matrix<LANES>(o, pt, last + 1, vr, (size_t)hd, hd, 1.0f);
                    }
            }
    }
}
void attention_forward_fast(float* out, float* att, const float* q, const float* k, const float* v, int B, int T, int H,
                            int R, int hd, float* scratch, int threads) {
    with_lanes(hd, [&](auto w) {
        attention_forward_blocked<decltype(w)::value>(out, att, q, k, v, B, T, H, R, hd, scratch, threads);
    });
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
                                       int hd, float* scratch, int threads) {
    int n_rep = H / R, Tp = (T + 15) / 16 * 16;
    float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel num_threads(attention_threads(threads))
    {
        AttentionBuffers buf(scratch, Tp, hd);
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int r = 0; r < R; r++) {
                size_t kv = ((size_t)r * B + b) * T * hd, ld = (size_t)hd;  // row u of this kv head: kv + u * ld
                head_transposed(buf.xt, v + kv, T, Tp, hd);
                for (int h = r * n_rep; h < (r + 1) * n_rep; h++)
                    for (int t0 = 0; t0 < T; t0 += ATT_ROWS) {
                        int last = std::min(t0 + ATT_ROWS, T) - 1;
                        const float *go[ATT_ROWS], *qt[ATT_ROWS], *p[ATT_ROWS], *ds[ATT_ROWS];
                        float* gq[ATT_ROWS];
                        for (int j = 0; j < ATT_ROWS; j++) {
                            int t = t0 + j;
                            bool in = t <= last;
                            size_t row = (((size_t)b * T + t) * H + h) * hd;
                            go[j] = in ? dout + row : buf.zero;
                            qt[j] = in ? q + row : buf.zero;
                            gq[j] = in ? dq + row : buf.sink;
                            p[j] = in ? buf.probs + (size_t)j * Tp : buf.zero;
                            ds[j] = in ? buf.rows + (size_t)j * Tp : buf.zero;
                        }
                        int n16 = (last + 16) / 16 * 16;
                        for (int t = t0; t <= last; t++) {  // this row of att, zero to n16
                            const float* from = att + (((size_t)b * H + h) * T + t) * T;
                            if (n16 <= T) {  // read in place: att is 0 above the diagonal
                                p[t - t0] = from;
                                continue;
                            }
                            float* pj = buf.probs + (size_t)(t - t0) * Tp;
                            memcpy(pj, from, (size_t)(t + 1) * sizeof(float));
                            memset(pj + t + 1, 0, (size_t)(n16 - t - 1) * sizeof(float));
                        }
                        rows_dot_keys(buf.rows, Tp, go, buf.xt, hd, n16, 1.0f);  // dp
                        for (int j = 0; j <= last - t0; j++)
                            softmax_backward_row(buf.rows + (size_t)j * Tp, p[j], n16);
                        rows_times_matrix<LANES>(gq, ds, last + 1, k + kv, ld, hd, scale);
                        add_rows_outer<LANES>(dk + kv, ld, last + 1, ds, qt, hd, scale);
                        add_rows_outer<LANES>(dv + kv, ld, last + 1, p, go, hd, 1.0f);
                    }
            }
    }
}
void attention_backward_fast(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                             const float* v, const float* att, int B, int T, int H, int R, int hd, float* scratch,
                             int threads) {
    with_lanes(hd, [&](auto w) {
        attention_backward_blocked<decltype(w)::value>(dq, dk, dv, dout, q, k, v, att, B, T, H, R, hd, scratch, threads);
    });
}

// ===========================================================================
// RMSNorm (lime.cu: rmsnorm_forward, rmsnorm_backward)
// ===========================================================================
//
// The plain loops' sums over d are `omp simd` reductions: the compiler keeps
// as many partial sums as its vector has lanes (8 with AVX2, 16 with
// AVX-512), so their bits depended on the build. Here each sum is sum16's,
// 16 lanes whatever the vector width; the rest is the plain loops' arithmetic.
static const int RMS_CHUNKS = 64;  // slices of the rows for dg: lime.cu's CHUNKS

// sum_{i < d} of the terms that add(i, s) adds to s: lane l (of 16) adds the
// terms i = l, l + 16, ... in order, and lanes_sum's tree adds the lanes.
template <class Add>
static inline float sum16(int d, Add add) {
    float acc[16] = {};
    int i0 = 0;
    for (; i0 + 16 <= d; i0 += 16)
#pragma omp simd
        for (int l = 0; l < 16; l++) acc[l] = add(i0 + l, acc[l]);
    for (int l = 0; i0 + l < d; l++) acc[l] = add(i0 + l, acc[l]);
    return lanes_sum(acc);
}

void rmsnorm_forward_fast(float* out, float* rstd, float* copy, const float* inp, const float* g, int N, int d,
                          float eps) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * d;
        float* y = out + (size_t)n * d;
        float ss = sum16(d, [&](int i, float s) { return mul_add(x[i], x[i], s); });
        float r = 1.0f / sqrtf(ss / d + eps);
        for (int i = 0; i < d; i++) y[i] = x[i] * r * g[i];
        if (copy) memcpy(copy + (size_t)n * d, x, d * sizeof(float));
        rstd[n] = r;
    }
}

void rmsnorm_backward_fast(float* dinp, float* dg, const float* dout, const float* inp, const float* g,
                           const float* rstd, int N, int d, float* part) {
#pragma omp parallel for schedule(static)
    for (int c = 0; c < RMS_CHUNKS; c++) {
        float* dgc = part + (size_t)c * d;
        memset(dgc, 0, (size_t)d * sizeof(float));
        for (size_t n = (size_t)N * c / RMS_CHUNKS; n < (size_t)N * (c + 1) / RMS_CHUNKS; n++) {
            const float* x = inp + n * d;
            const float* dy = dout + n * d;
            float* dx = dinp + n * d;
            float r = rstd[n];
            float dot = sum16(d, [&](int i, float s) { return mul_add(g[i] * dy[i], x[i], s); });
            float k = r * r * r * dot / d;
            for (int i = 0; i < d; i++) {
                dx[i] += r * g[i] * dy[i] - x[i] * k;
                dgc[i] += dy[i] * x[i] * r;
            }
        }
    }
    for (int c = 0; c < RMS_CHUNKS; c++)
        for (int i = 0; i < d; i++) dg[i] += part[(size_t)c * d + i];
}

// ===========================================================================
// Hyper-Connections (support/study/hyper_connections.cuh: hc_weights_*, hc_width_*, hc_depth_backward)
// ===========================================================================
//
// A position's n streams X[i][t] and n+1 mixtures M[k][t] (d floats each) fit
// in L1 together, so every loop here goes over the positions (shared by the
// threads) and inside over d, LANES floats at a time (LANES a compile-time
// constant dividing d, so that the sums stay in registers); the products over
// d are simd reductions. (The plain loops run their innermost index over the
// streams or the n+1 weights, which the compiler does not vectorise.)

static const int HC_CHUNKS = 64;      // slices of the positions for the weight gradients: lime.cu's CHUNKS
static const int HC_MOST_PROJ = 18;   // n + 2 projections at n = 16, the most streams (hyper_connections.cuh's rate limit)

// Calls f(w) with w a compile-time constant dividing d: 32, 8, 2 or 1.
template <class F>
static void with_width_lanes(int d, F f) {
    if (d % 32 == 0) f(std::integral_constant<int, 32>());
    else if (d % 8 == 0) f(std::integral_constant<int, 8>());
    else if (d % 2 == 0) f(std::integral_constant<int, 2>());
    else f(std::integral_constant<int, 1>());
}

// sum_j a[j] b[j] (dot_d) and sum_j a[j] (sum_d) over j < d: from d = 8 on,
// two sums of 8 lanes (lane l of the first sums the terms j = 16 i + l, of the
// second j = 16 i + 8 + l, and a last run of 8 goes to the first), one fixed
// tree over their 8 pairs, then the terms past the last run of 8, one by one.
// With AVX2 the lanes are two ymm registers, written out: the compiler's own
// reduction of a loop spilled the lanes to the stack and added them one by
// one, which cost more than the products here. The portable loop computes
// the same operations in the same order (the same bits).
template <bool PRODUCT>
static inline float reduce_d(const float* a, const float* b, int d) {
    auto term = [&](int j, float s) { return PRODUCT ? mul_add(a[j], b[j], s) : s + a[j]; };
    int j = 0;
    float s = 0;
    if (d >= 8) {
#if defined(__AVX2__) && defined(__FMA__)
        __m256 v = _mm256_setzero_ps(), u = _mm256_setzero_ps();
        for (; j + 16 <= d; j += 16) {
            __m256 a0 = _mm256_loadu_ps(a + j), a1 = _mm256_loadu_ps(a + j + 8);
            v = PRODUCT ? _mm256_fmadd_ps(a0, _mm256_loadu_ps(b + j), v) : _mm256_add_ps(v, a0);
            u = PRODUCT ? _mm256_fmadd_ps(a1, _mm256_loadu_ps(b + j + 8), u) : _mm256_add_ps(u, a1);
        }
        for (; j + 8 <= d; j += 8)
            v = PRODUCT ? _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), v)
                        : _mm256_add_ps(v, _mm256_loadu_ps(a + j));
        v = _mm256_add_ps(v, u);  // pair l: v[l] + v[l + 4], then (0 + 2) + (1 + 3)
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        s = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
#else
        float v[8] = {}, u[8] = {};
        for (; j + 16 <= d; j += 16)
            for (int l = 0; l < 8; l++) v[l] = term(j + l, v[l]), u[l] = term(j + 8 + l, u[l]);
        for (; j + 8 <= d; j += 8)
            for (int l = 0; l < 8; l++) v[l] = term(j + l, v[l]);
        float h[4];
        for (int l = 0; l < 4; l++) h[l] = (v[l] + u[l]) + (v[l + 4] + u[l + 4]);
        s = (h[0] + h[2]) + (h[1] + h[3]);
#endif
    }
    for (; j < d; j++) s = term(j, s);
    return s;
}
static inline float dot_d(const float* a, const float* b, int d) { return reduce_d<true>(a, b, d); }
static inline float sum_d(const float* a, int d) { return reduce_d<false>(a, nullptr, d); }

// The dynamic weights' projections transposed, wt (n+2, d): row k < n+1 is
// column k of alpha_fn (d, n+1), row n+1 is beta_fn; each projection of a
// stream is then a dot product over d.
static void hc_projections(float* wt, HcParams w, int n, int d) {
    int K = n + 1;
    for (int j = 0; j < d; j++) {
        for (int k = 0; k < K; k++) wt[(size_t)k * d + j] = w.alpha_fn[(size_t)j * K + k];
        wt[(size_t)K * d + j] = w.beta_fn[j];
    }
}

// = hc_weights_forward. Each stream's n+2 projections at once, as a row of
// PP >= n+2 sums in registers (a compile-time 8, 16 or 24, zero past n+2):
// p += X[j] * [alpha_fn[j, :] | beta_fn[j] | 0 ...] over j, in four chains
// (j mod 4) summed at the end; then pa = rstd * p, the same value as
// Xn . alpha_fn[:, k]. The tanh go over a block of HC_BLOCK positions' values at once.
static const int HC_BLOCK = 16;
template <int PP>
static void hc_weights_forward_blocked(float* Aw, float* bw, float* rstd, float* ta, float* tb, const float* X,
                                       HcParams w, int N, int n, int d, float eps, float* scratch) {
    int K = n + 1;
    size_t Nd = (size_t)N * d;
    float* wrow = scratch;  // (d, PP)
    memset(wrow, 0, (size_t)d * PP * sizeof(float));
    for (int j = 0; j < d; j++) {
        for (int k = 0; k < K; k++) wrow[(size_t)j * PP + k] = w.alpha_fn[(size_t)j * K + k];
        wrow[(size_t)j * PP + K] = w.beta_fn[j];
    }
    const float* W = wrow;
    float as = w.alpha_scale[0], bs = w.beta_scale[0];
#pragma omp parallel for schedule(static)
    for (int t0 = 0; t0 < N; t0 += HC_BLOCK) {
        int t1 = std::min(N, t0 + HC_BLOCK);
        for (int t = t0; t < t1; t++)
            for (int i = 0; i < n; i++) {
                const float* x = X + i * Nd + (size_t)t * d;
                float acc[4][PP] = {};
                int j = 0;
                for (; j + 4 <= d; j += 4)
                    for (int c = 0; c < 4; c++) {
                        float xj = x[j + c];
                        const float* wj = W + (size_t)(j + c) * PP;
#pragma omp simd
                        for (int k = 0; k < PP; k++) acc[c][k] = mul_add(xj, wj[k], acc[c][k]);
                    }
                for (; j < d; j++)
                    for (int k = 0; k < PP; k++) acc[0][k] = mul_add(x[j], W[(size_t)j * PP + k], acc[0][k]);
                size_t ti = (size_t)t * n + i;
                float r = 1.0f / sqrtf(dot_d(x, x, d) / d + eps);
                for (int k = 0; k < K; k++) ta[ti * K + k] = r * ((acc[0][k] + acc[1][k]) + (acc[2][k] + acc[3][k]));
                tb[ti] = r * ((acc[0][K] + acc[1][K]) + (acc[2][K] + acc[3][K]));
                rstd[ti] = r;
            }
        float *pa = ta + (size_t)t0 * n * K, *pb = tb + (size_t)t0 * n;  // the block's projections, then their tanh
        for (size_t e = 0; e < (size_t)(t1 - t0) * n * K; e++) pa[e] = tanh_fast(pa[e]);
        for (size_t e = 0; e < (size_t)(t1 - t0) * n; e++) pb[e] = tanh_fast(pb[e]);
        for (int t = t0; t < t1; t++) {
            float* A = Aw + (size_t)t * n * K;
            const float* a = ta + (size_t)t * n * K;
            for (int e = 0; e < n * K; e++) A[e] = w.static_alpha[e] + as * a[e];
            for (int i = 0; i < n; i++) bw[(size_t)t * n + i] = w.static_beta[i] + bs * tb[(size_t)t * n + i];
        }
    }
}
// The most of its scratch either HC op below takes: hc_weights_forward's row
// of projections (d, PP), or hc_weights_backward's slices' sums and wt (n+2, d).
static int hc_row_floats(int n) { return n + 2 <= 8 ? 8 : n + 2 <= 16 ? 16 : 24; }
static size_t hc_slice_floats(int n, int d) { return (size_t)n * (n + 1) + n + (size_t)(n + 2) * d + 2; }
size_t hc_fast_scratch_floats(int n, int d) {
    return std::max((size_t)d * hc_row_floats(n), HC_CHUNKS * hc_slice_floats(n, d) + (size_t)(n + 2) * d);
}
void hc_weights_forward_fast(float* Aw, float* bw, float* rstd, float* ta, float* tb, const float* X, HcParams w, int N,
                             int n, int d, float eps, float* scratch) {
    int K = n + 1;
    if (!w.alpha_fn) {  // static: every position's weights are the static ones
#pragma omp parallel for schedule(static) if ((size_t)N * n * K > 65536)
        for (int t = 0; t < N; t++) {
            memcpy(Aw + (size_t)t * n * K, w.static_alpha, (size_t)n * K * sizeof(float));
            memcpy(bw + (size_t)t * n, w.static_beta, (size_t)n * sizeof(float));
        }
        return;
    }
    if (n + 2 <= 8) hc_weights_forward_blocked<8>(Aw, bw, rstd, ta, tb, X, w, N, n, d, eps, scratch);
    else if (n + 2 <= 16) hc_weights_forward_blocked<16>(Aw, bw, rstd, ta, tb, X, w, N, n, d, eps, scratch);
    else hc_weights_forward_blocked<24>(Aw, bw, rstd, ta, tb, X, w, N, n, d, eps, scratch);
}

// = hc_weights_backward (its comment has the math). Per stream of a position:
// dp (n+2) the projections' gradients; then in one pass over d, LANES at a
// time, the chunk's projection gradients (kept transposed, (n+2, d)) gain
// rstd * dp[k] * X, dXn = sum_k wt[k] dp[k] is formed in registers, and
// dX gains rstd * dXn; a second pass subtracts X * rstd^3 * mean(dXn . X).
// The weight gradients are summed per HC_CHUNKS fixed slices of the
// positions, then the slices in order: the same for any thread count.
template <int LANES>
static void hc_weights_backward_blocked(float* dX, HcParams dw, const float* dA, const float* db, const float* X,
                                        const float* rstd, const float* ta, const float* tb, HcParams w, int N, int n,
                                        int d, float* scratch) {
    int K = n + 1, P = K + 1;
    size_t Nd = (size_t)N * d;
    bool dyn = w.alpha_fn != nullptr;
    // one slice's sums: static_alpha (n, n+1), static_beta (n); dynamic: the projections' (n+2, d), the two scales
    size_t G = (size_t)n * K + n + (dyn ? (size_t)P * d + 2 : 0);
    float *part = scratch, *wt = part + HC_CHUNKS * G;  // (HC_CHUNKS, G): each slice zeroes its own sums; (n+2, d)
    if (dyn) hc_projections(wt, w, n, d);
    const float* wp = wt;
    float as = dyn ? w.alpha_scale[0] : 0.0f, bs = dyn ? w.beta_scale[0] : 0.0f;
#pragma omp parallel for schedule(static)
    for (int c = 0; c < HC_CHUNKS; c++) {
        float *sa = &part[(size_t)c * G], *sb = sa + n * K, *sw = sb + n, *sas = sw + (size_t)P * d, *sbs = sas + 1;
        memset(sa, 0, G * sizeof(float));
        for (size_t t = (size_t)N * c / HC_CHUNKS; t < (size_t)N * (c + 1) / HC_CHUNKS; t++)
            for (int i = 0; i < n; i++) {
                size_t ti = t * n + i;
                const float* dAi = dA + ti * K;
                for (int k = 0; k < K; k++) sa[i * K + k] += dAi[k];
                sb[i] += db[ti];
                if (!dyn) continue;
                float dp[HC_MOST_PROJ], rdp[HC_MOST_PROJ], r = rstd[ti];
                for (int k = 0; k < K; k++) {
                    float a = ta[ti * K + k];
                    sas[0] += dAi[k] * a;
                    dp[k] = dAi[k] * as * (1 - a * a);
                }
                sbs[0] += db[ti] * tb[ti];
                dp[K] = db[ti] * bs * (1 - tb[ti] * tb[ti]);
                for (int k = 0; k < P; k++) rdp[k] = r * dp[k];
                const float* x = X + i * Nd + t * d;
                float* dx = dX + i * Nd + t * d;
                float dot[LANES] = {};
                for (int j0 = 0; j0 < d; j0 += LANES) {
                    float g[LANES] = {};  // dXn[j0 ..]
                    for (int k = 0; k < P; k++) {
                        const float* wk = wp + (size_t)k * d + j0;
                        float* swk = sw + (size_t)k * d + j0;
                        float dpk = dp[k], rdpk = rdp[k];
#pragma omp simd
                        for (int l = 0; l < LANES; l++) {
                            g[l] = mul_add(wk[l], dpk, g[l]);
                            swk[l] = mul_add(rdpk, x[j0 + l], swk[l]);
                        }
                    }
#pragma omp simd
                    for (int l = 0; l < LANES; l++) {
                        dot[l] = mul_add(g[l], x[j0 + l], dot[l]);
                        dx[j0 + l] = mul_add(r, g[l], dx[j0 + l]);
                    }
                }
                float k3 = r * r * r * sum_d(dot, LANES) / d;
#pragma omp simd  // (unfused: with mul_add here g++ spilled the sums of the loop above, 15% slower)
                for (int j = 0; j < d; j++) dx[j] -= x[j] * k3;
            }
    }
    for (int c = 0; c < HC_CHUNKS; c++) {  // the slices in order
        const float *sa = &part[(size_t)c * G], *sb = sa + n * K, *sw = sb + n, *sas = sw + (size_t)P * d, *sbs = sas + 1;
        for (int e = 0; e < n * K; e++) dw.static_alpha[e] += sa[e];
        for (int i = 0; i < n; i++) dw.static_beta[i] += sb[i];
        if (!dyn) continue;
        for (int j = 0; j < d; j++) {
            for (int k = 0; k < K; k++) dw.alpha_fn[(size_t)j * K + k] += sw[(size_t)k * d + j];
            dw.beta_fn[j] += sw[(size_t)K * d + j];
        }
        dw.alpha_scale[0] += sas[0];
        dw.beta_scale[0] += sbs[0];
    }
}
void hc_weights_backward_fast(float* dX, HcParams dw, const float* dA, const float* db, const float* X,
                              const float* rstd, const float* ta, const float* tb, HcParams w, int N, int n, int d,
                              float* scratch) {
    with_width_lanes(d, [&](auto l) {
        hc_weights_backward_blocked<decltype(l)::value>(dX, dw, dA, db, X, rstd, ta, tb, w, N, n, d, scratch);
    });
}

// = hc_width_forward: M[k][t] = sum_i A[t,i,k] X[i][t], the sum over i in
// the plain loop's order, LANES of d at a time in registers.
template <int LANES>
static void hc_width_forward_blocked(float* M, const float* X, const float* Aw, int N, int n, int d) {
    int K = n + 1;
    size_t Nd = (size_t)N * d;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++) {
        const float* a = Aw + (size_t)t * n * K;
        for (int k = 0; k < K; k++)
            for (int j0 = 0; j0 < d; j0 += LANES) {
                float s[LANES] = {};
                for (int i = 0; i < n; i++) {
                    const float* x = X + i * Nd + (size_t)t * d + j0;
                    float aik = a[i * K + k];
#pragma omp simd
                    for (int l = 0; l < LANES; l++) s[l] = mul_add(aik, x[l], s[l]);
                }
                memcpy(M + k * Nd + (size_t)t * d + j0, s, sizeof s);
            }
    }
}
void hc_width_forward_fast(float* M, const float* X, const float* Aw, int N, int n, int d) {
    with_width_lanes(d, [&](auto l) { hc_width_forward_blocked<decltype(l)::value>(M, X, Aw, N, n, d); });
}

// = hc_width_backward: dA[t,i,k] = dM[k][t] . X[i][t] (dot products over d),
// dX[i][t] = sum_k A[t,i,k] dM[k][t] (LANES of d at a time in registers).
template <int LANES>
static void hc_width_backward_blocked(float* dX, float* dA, const float* dM, const float* X, const float* Aw, int N,
                                      int n, int d) {
    int K = n + 1;
    size_t Nd = (size_t)N * d;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++)
        for (int i = 0; i < n; i++) {
            const float* x = X + i * Nd + (size_t)t * d;
            const float* a = Aw + ((size_t)t * n + i) * K;
            for (int k = 0; k < K; k++) dA[((size_t)t * n + i) * K + k] = dot_d(dM + k * Nd + (size_t)t * d, x, d);
            for (int j0 = 0; j0 < d; j0 += LANES) {
                float s[LANES] = {};
                for (int k = 0; k < K; k++) {
                    const float* dm = dM + k * Nd + (size_t)t * d + j0;
                    float ak = a[k];
#pragma omp simd
                    for (int l = 0; l < LANES; l++) s[l] = mul_add(ak, dm[l], s[l]);
                }
                memcpy(dX + i * Nd + (size_t)t * d + j0, s, sizeof s);
            }
        }
}
void hc_width_backward_fast(float* dX, float* dA, const float* dM, const float* X, const float* Aw, int N, int n, int d) {
    with_width_lanes(d, [&](auto l) { hc_width_backward_blocked<decltype(l)::value>(dX, dA, dM, X, Aw, N, n, d); });
}

// = hc_depth_backward: dy[t] = sum_i b[t,i] dX'[i][t] (LANES of d at a time,
// in the plain loop's order), db[t,i] = dX'[i][t] . y[t], dM[1+i][t] = dX'[i][t]
// and dM[0][t] = 0 as whole rows.
template <int LANES>
static void hc_depth_backward_blocked(float* dy, float* db, float* dM, const float* dXout, const float* y,
                                      const float* bw, int N, int n, int d) {
    size_t Nd = (size_t)N * d;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++) {
        const float* b = bw + (size_t)t * n;
        for (int j0 = 0; j0 < d; j0 += LANES) {
            float s[LANES] = {};
            for (int i = 0; i < n; i++) {
                const float* g = dXout + i * Nd + (size_t)t * d + j0;
                float bi = b[i];
#pragma omp simd
                for (int l = 0; l < LANES; l++) s[l] = mul_add(bi, g[l], s[l]);
            }
            memcpy(dy + (size_t)t * d + j0, s, sizeof s);
        }
        memset(dM + (size_t)t * d, 0, d * sizeof(float));
        for (int i = 0; i < n; i++) {
            const float* g = dXout + i * Nd + (size_t)t * d;
            memcpy(dM + (1 + i) * Nd + (size_t)t * d, g, d * sizeof(float));
            db[(size_t)t * n + i] = dot_d(g, y + (size_t)t * d, d);
        }
    }
}
void hc_depth_backward_fast(float* dy, float* db, float* dM, const float* dXout, const float* y, const float* bw, int N,
                            int n, int d) {
    with_width_lanes(d, [&](auto l) { hc_depth_backward_blocked<decltype(l)::value>(dy, db, dM, dXout, y, bw, N, n, d); });
}

// ===========================================================================
// The KV router (lime.cu: router_forward, router_backward), keys and values
// together, as the named products: out = W @ buf is gemm_nn, dW += dout @ buf^T
// gemm_nt, dbuf += W^T @ dout gemm_tn; buf (L*R, row), row = N*hd. A variant's
// weight gradient (not every column learned) goes through scratch first, G
// (2, R, cols), and only its learned columns are added; then the panels of
// gemm_nt_fast.
// ===========================================================================

void router_forward_fast(KvPair out, KvConst W, KvConst buf, int l, int N, int R, int hd) {
    int cols = (l + 1) * R, row = N * hd;
    gemm_nn_fast(out.k, W.k, buf.k, R, row, cols, false);
    gemm_nn_fast(out.v, W.v, buf.v, R, row, cols, false);
}
void router_backward_fast(KvPair dW, KvPair dbuf, KvConst dout, KvConst W, KvConst buf, int l, RouterSpan learned,
                          int N, int R, int hd, float* scratch) {
    int cols = (l + 1) * R, row = N * hd;
    bool one = dW.k == dW.v, all = learned.all(l), any = learned.any(l);  // one W for keys and values
    float *G = scratch, *panels = scratch + 2 * (size_t)R * cols;
    float *gk = all ? dW.k : G, *gv = all ? dW.v : one ? G : G + (size_t)R * cols;
    if (any && !all) memset(G, 0, 2 * (size_t)R * cols * sizeof(float));
    if (any) gemm_nt_fast(gk, dout.k, buf.k, R, cols, row, true, panels);
    if (any) gemm_nt_fast(gv, dout.v, buf.v, R, cols, row, true, panels);  // one W: gv == gk, both sums
    for (int e = 0; any && !all && e < R * cols; e++) {
        if (!learned.learns(e / cols, e % cols, R)) continue;
        dW.k[e] += gk[e];
        if (!one) dW.v[e] += gv[e];
    }
    gemm_tn_fast(dbuf.k, W.k, dout.k, cols, row, R);
    gemm_tn_fast(dbuf.v, W.v, dout.v, cols, row, R);
}
size_t router_fast_scratch_floats(int L, int R, size_t row) {
    size_t most = 0;
    for (int l = 1; l < L; l++)
        most = std::max(most, 2 * (size_t)R * (l + 1) * R + matmul_fast_forward_scratch_floats(R, (int)row, (l + 1) * R));
    return most;
}

// = qkv_projection_forward, qkv_projection_backward (lime.cu: the attention's
// inputs, q roped, K and V into the head-major buffer), the same steps on the
// fast products and rotation. W = [Wq; Wk; Wv]; scratch: the forward's panels.
void qkv_projection_forward_fast(Qkv out, QkvInputs in, const float* W, Rope rope, Heads s, float* scratch) {
    int N = s.N(), C = s.C, qd = s.H * s.hd, kvd = s.R * s.hd;
    matmul_forward_fast(out.q, in.q, W, N, C, qd, false, scratch);
    kv_projection_forward_fast(out.K, in.k, W + (size_t)qd * C, N, C, s.R, s.hd, scratch);
    kv_projection_forward_fast(out.V, in.v, W + (size_t)(qd + kvd) * C, N, C, s.R, s.hd, scratch);
    rope_rotate_fast(out.q, out.q, rope.cos, rope.sin, s.B, s.T, s.H, s.hd, 1.0f);
    if (out.kr)  // (R, B, T, hd): R*B sequences of one head
        rope_rotate_fast(out.kr, out.K, rope.cos, rope.sin, s.R * s.B, s.T, 1, s.hd, 1.0f);
}
// K's and V's backward add into their input's gradient: zeroed first when it is an array of its own.
void qkv_projection_backward_fast(QkvInputGrads da, float* dW, Qkv d, QkvInputs in, const float* W, Rope rope,
                                  Heads s) {
    int N = s.N(), C = s.C, qd = s.H * s.hd, kvd = s.R * s.hd;
    size_t n = (size_t)N * C;
    rope_rotate_fast(d.q, d.q, rope.cos, rope.sin, s.B, s.T, s.H, s.hd, -1.0f);
    matmul_backward_fast(da.q, dW, d.q, in.q, W, N, C, qd, false);  // then K's and V's add
    if (da.k != da.q) memset(da.k, 0, n * sizeof(float));
    kv_projection_backward_fast(da.k, dW + (size_t)qd * C, d.K, in.k, W + (size_t)qd * C, N, C, s.R, s.hd);
    if (da.v != da.q && da.v != da.k) memset(da.v, 0, n * sizeof(float));
    kv_projection_backward_fast(da.v, dW + (size_t)(qd + kvd) * C, d.V, in.v, W + (size_t)(qd + kvd) * C, N, C, s.R,
                                s.hd);
}

// ===========================================================================
// The peers' learned mixture of whole arrays (support/study/mixing.cuh:
// mix_forward, mix_backward), with the plain loops' bits
// ===========================================================================
//
// The plain loops take the K terms innermost, an element at a time, and sum
// each weight's gradient over a slice as one chain of adds: neither
// vectorises, and the chain waits on each add. Here a block of MIX_BLOCK
// elements takes the terms in turn (each element's sum in the same order),
// and MIX_SIDE slices' chains run side by side, each still in element order,
// so every result has the plain loops' bits.
static const int MIX_CHUNKS = 64;     // the slices of the weights' gradient: lime.cu's CHUNKS
static const int MIX_SIDE = 8;        // slices summed side by side (independent chains)
static const size_t MIX_BLOCK = 2048;  // elements a term at a time: y's block and a term's stay in L1

// X_j: first for j = 0, else rest's (j-1)-th array of n floats (mixing.cuh's mix_term)
template <class F>
static inline F* mix_term_fast(F* first, F* rest, int j, size_t n) {
    return j == 0 ? first : rest + (size_t)(j - 1) * n;
}

void mix_forward_fast(float* y, const float* a, const float* first, const float* rest, int K, size_t n) {
    size_t blocks = (n + MIX_BLOCK - 1) / MIX_BLOCK;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t b = 0; b < blocks; b++) {
        size_t from = b * MIX_BLOCK, m = std::min(n - from, MIX_BLOCK);
        float* yb = y + from;
        for (size_t e = 0; e < m; e++) yb[e] = 0.0f;  // s = 0, then s += a[j] * X_j[e] for j = 0 .. K-1
        for (int j = 0; j < K; j++) {
            const float* x = mix_term_fast(first, rest, j, n) + from;
            float aj = a[j];
#pragma omp simd
            for (size_t e = 0; e < m; e++) yb[e] += aj * x[e];
        }
    }
}

void mix_backward_fast(float* dfirst, float* drest, float* da, const float* dy, const float* a, const float* first,
                       const float* rest, int K, size_t n, float* part) {
    // part[c][j] = sum over slice c of dy[e] * X_j[e], the elements in order
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < MIX_CHUNKS; c0 += MIX_SIDE)
        for (int j = 0; j < K; j++) {
            const float* x = mix_term_fast(first, rest, j, n);
            size_t at[MIX_SIDE], len[MIX_SIDE], common = n;
            float s[MIX_SIDE];
            for (int g = 0; g < MIX_SIDE; g++) {
                at[g] = n * (c0 + g) / MIX_CHUNKS;
                len[g] = n * (c0 + g + 1) / MIX_CHUNKS - at[g];
                common = std::min(common, len[g]);
                s[g] = 0.0f;
            }
            for (size_t i = 0; i < common; i++)
                for (int g = 0; g < MIX_SIDE; g++) s[g] += dy[at[g] + i] * x[at[g] + i];
            for (int g = 0; g < MIX_SIDE; g++) {
                for (size_t i = common; i < len[g]; i++) s[g] += dy[at[g] + i] * x[at[g] + i];
                part[(size_t)(c0 + g) * K + j] = s[g];
            }
        }
    // dX_j += a[j] * dy, element by element
    size_t blocks = (n + MIX_BLOCK - 1) / MIX_BLOCK;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t b = 0; b < blocks; b++) {
        size_t from = b * MIX_BLOCK, m = std::min(n - from, MIX_BLOCK);
        for (int j = 0; j < K; j++) {
            float* dx = mix_term_fast(dfirst, drest, j, n) + from;
            const float* g = dy + from;
            float aj = a[j];
#pragma omp simd
            for (size_t e = 0; e < m; e++) dx[e] += aj * g[e];
        }
    }
    for (int c = 0; c < MIX_CHUNKS; c++)
        for (int j = 0; j < K; j++) da[j] += part[(size_t)c * K + j];
}
