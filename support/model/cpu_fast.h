// support/model/cpu_fast.h — the fast CPU path (support/model/cpu_fast.cpp): blocked
// versions of lime.cu's plain matrix product, attention and Hyper-Connection
// loops, and a vectorisable e^x and tanh. Same arguments as the plain function
// each one names, plus, for some, a scratch buffer (sized by the *_floats
// function beside it; lime.cu carves it from the activations).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <cmath>

#include "support/model/lime.h"  // HcParams
#ifdef _OPENMP
#include <omp.h>
#endif

// The threads OpenMP gives a parallel region now (1 without OpenMP): what the
// activations' scratch is sized for, and at most what the fast attention uses.
inline int cpu_threads() {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

// The scratch the fast products need (packed panels of 32 columns), in floats,
// for products of at most `rows` rows by at most `cols` columns.
inline size_t matmul_fast_scratch_floats(size_t rows, size_t cols) { return rows * ((cols + 31) / 32 * 32); }

// = matmul_forward; scratch: matmul_fast_scratch_floats(C, OC).
void matmul_forward_fast(float* out, const float* inp, const float* W, int N, int C, int OC, bool accumulate,
                         float* scratch);
// matmul_forward_fast's scratch for one shape exactly (at most matmul_fast_scratch_floats(C, OC)).
size_t matmul_fast_forward_scratch_floats(int N, int C, int OC);
// = matmul_backward (no scratch: B, W or inp, has contiguous rows, copied a block at a time onto the stack).
void matmul_backward_fast(float* dinp, float* dW, const float* dout, const float* inp, const float* W, int N, int C,
                          int OC, bool add_dinp);
// = kv_projection_forward, kv_projection_backward: the K and V projections,
// written into (and read from) the head-major buffer (R, N, hd). Scratch: as
// matmul_forward_fast's with OC = R*hd (the backward, as matmul_backward_fast, none).
void kv_projection_forward_fast(float* out, const float* inp, const float* W, int N, int C, int R, int hd,
                                float* scratch);
void kv_projection_backward_fast(float* dinp, float* dW, const float* dout, const float* inp, const float* W, int N,
                                 int C, int R, int hd);
// = gemm_nn, gemm_nt, gemm_tn (lime.cu's named products): C (M, N) (+)= A @ B,
// A @ B^T, A^T @ B (the last always added to). gemm_nt's scratch: as matmul_forward_fast's.
void gemm_nn_fast(float* C, const float* A, const float* B, int M, int N, int K, bool accumulate);
void gemm_nt_fast(float* C, const float* A, const float* B, int M, int N, int K, bool accumulate, float* scratch);
void gemm_tn_fast(float* C, const float* A, const float* B, int M, int N, int K);
// = router_forward, router_backward (lime.cu's KV router, Eq. 2), keys and values
// together on the named products; row = N*hd. scratch: router_fast_scratch_floats
// (L, R, row), for the widest of L layers: a variant's weight gradient, then the panels.
void router_forward_fast(KvPair out, KvConst W, KvConst buf, int l, int N, int R, int hd);
void router_backward_fast(KvPair dW, KvPair dbuf, KvConst dout, KvConst W, KvConst buf, int l, RouterSpan learned,
                          int N, int R, int hd, float* scratch);
size_t router_fast_scratch_floats(int L, int R, size_t row);
// = qkv_projection_forward, qkv_projection_backward (lime.cu: q roped, K and V into the
// head-major buffer, and kr = rope(K) when not nullptr, from a = rmsnorm(x); W = [Wq; Wk; Wv]);
// scratch: the forward's panels.
void qkv_projection_forward_fast(Qkv out, QkvInputs in, const float* W, Rope rope, Heads s, float* scratch);
void qkv_projection_backward_fast(QkvInputGrads da, float* dW, Qkv d, QkvInputs in, const float* W, Rope rope, Heads s);
// The micro-kernel the products use: "avx512", "avx2" or "plain" (the best this build has).
const char* matmul_fast_kernel();
#ifdef LIME_TESTING
// Tests: how many micro-kernels this build has, and which the products use (0 = the best).
int matmul_fast_kernels();
void matmul_fast_use_kernel(int i);
#endif
// = ereg_forward, ereg_backward (the value-entropy regulariser), D = R*hd;
// scratch: ereg_fast_scratch_floats(B, T, D). Where a sequence has n < D valid
// positions, its slot of G holds the n x n Gram K = Z Z^T instead (support/model/cpu_fast.cpp).
size_t ereg_fast_scratch_floats(int B, int T, int D);
void ereg_forward_fast(float* stat, float* mu, float* G, const float* V, const float* valid, int B, int T, int D,
                       float* scratch);
void ereg_backward_fast(float* dV, const float* V, const float* valid, const float* mu, const float* G,
                        const float* stat, float scale, int B, int T, int D, float* scratch);
// = rope_rotate: out (B, T, nh, hd) = x rotated, or out += it (add), forward (sign 1) or backward (-1); out may be x.
void rope_rotate_fast(float* out, const float* x, const float* cos_t, const float* sin_t, int B, int T, int nh, int hd,
                      float sign, bool add = false);
// = rmsnorm_forward, rmsnorm_backward; part: CHUNKS * d floats, as rmsnorm_backward's.
void rmsnorm_forward_fast(float* out, float* rstd, float* copy, const float* inp, const float* g, int N, int d, float eps);
void rmsnorm_backward_fast(float* dinp, float* dg, const float* dout, const float* inp, const float* g,
                           const float* rstd, int N, int d, float* part);
// = attention_forward, attention_backward. scratch: attention_fast_scratch_floats(T,
// hd, threads), a set of row buffers for each of at most `threads` threads.
size_t attention_fast_scratch_floats(int T, int hd, int threads);
void attention_forward_fast(float* out, float* att, const float* q, const float* k, const float* v, int B, int T, int H,
                            int R, int hd, float* scratch, int threads);
void attention_backward_fast(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                             const float* v, const float* att, int B, int T, int H, int R, int hd, float* scratch,
                             int threads);

// a * b + c, rounded once where the build has fused multiply-add (x86-64-v3 and
// up, ARM), else twice. The Makefile turns the compiler's own contraction of
// a * b + c off (-ffp-contract=off): g++ fused such a sum in one loop and not
// in another, depending on how it vectorised each for the build's vector width
// (a dot product's tail: an AVX2 build multiplied four terms in a vector and
// added them one by one, unfused; an AVX-512 build fused them), so the bits
// depended on the instruction set. The fast loops fuse where they say so.
inline float mul_add(float a, float b, float c) {
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
    return std::fma(a, b, c);
#else
    return a * b + c;
#endif
}

// e^x, within 2 ulp of expf (lime.cu's cpu_exp uses it in the fast build), in
// plain arithmetic the compiler vectorises (a call to expf stops
// it). e^x = 2^n * e^r with n = round(x / ln 2) and |r| <= ln(2) / 2; e^r is
// the Cephes polynomial, 2^n is built from its bits. Below -87 it gives 0,
// above 88 infinity (e^x < 1.7e-38 or > 1.6e38 there); NaN stays NaN. Every
// operation is spelled out (mul_add where fused), so each lane of a vector
// loop and the scalar loop after it give the same bits.
inline float exp_fast(float x) {
    const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer, n, held in the low bits
    float xc = std::min(std::max(x, -87.0f), 88.0f);
    float t = mul_add(xc, 1.44269504f, shifter);
    float n = t - shifter;
    float r = mul_add(n, 2.12194440e-4f, mul_add(-n, 0.693359375f, xc));  // x - n ln 2, ln 2 in two parts
    float p = 1.9875691500e-4f;
    p = mul_add(p, r, 1.3981999507e-3f);
    p = mul_add(p, r, 8.3334519073e-3f);
    p = mul_add(p, r, 4.1665795894e-2f);
    p = mul_add(p, r, 1.6666665459e-1f);
    p = mul_add(p, r, 5.0000001201e-1f);
    p = mul_add(p * r, r, r) + 1.0f;
    uint32_t bits;
    memcpy(&bits, &t, sizeof bits);
    bits = (bits << 23) + (127u << 23);  // the exponent field of 2^n: n + 127
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x < -87.0f ? 0.0f : x > 88.0f ? INFINITY : p * scale;
}


// tanh x in plain arithmetic the compiler vectorises, from exp_fast: for
// |x| < 0.625 the Cephes polynomial x + x^3 P(x^2), above it
// 1 - 2 / (e^(2|x|) + 1) with x's sign (no cancellation there: the result is
// over 0.55). +-1 past |x| = 44, NaN stays NaN. The fast HC weights use it.
inline float tanh_fast(float x) {
    float a = std::fabs(x), z = x * x;
    float p = -5.70498872745e-3f;
    p = mul_add(p, z, 2.06390887954e-2f);
    p = mul_add(p, z, -5.37397155531e-2f);
    p = mul_add(p, z, 1.33314422036e-1f);
    p = mul_add(p, z, -3.33332819422e-1f);
    float small = mul_add(x * z, p, x);
    float big = std::copysign(1.0f - 2.0f / (exp_fast(2.0f * a) + 1.0f), x);
    return a < 0.625f ? small : big;
}

// = hc_weights_forward, hc_weights_backward, hc_width_forward,
// hc_width_backward and hc_depth_backward (support/study/hyper_connections.cuh).
// scratch (the weights' two): hc_fast_scratch_floats(n, d).
size_t hc_fast_scratch_floats(int n, int d);
void hc_weights_forward_fast(float* Aw, float* bw, float* rstd, float* ta, float* tb, const float* X, HcParams w, int N,
                             int n, int d, float eps, float* scratch);
void hc_weights_backward_fast(float* dX, HcParams dw, const float* dA, const float* db, const float* X,
                              const float* rstd, const float* ta, const float* tb, HcParams w, int N, int n, int d,
                              float* scratch);
void hc_width_forward_fast(float* M, const float* X, const float* Aw, int N, int n, int d);
void hc_width_backward_fast(float* dX, float* dA, const float* dM, const float* X, const float* Aw, int N, int n, int d);
void hc_depth_backward_fast(float* dy, float* db, float* dM, const float* dXout, const float* y, const float* bw, int N,
                            int n, int d);
// = mix_forward, mix_backward (support/study/mixing.cuh, the peers' mixture of
// whole arrays), with their bits; part: CHUNKS * K floats, as mix_backward's.
void mix_forward_fast(float* y, const float* a, const float* first, const float* rest, int K, size_t n);
void mix_backward_fast(float* dfirst, float* drest, float* da, const float* dy, const float* a, const float* first,
                       const float* rest, int K, size_t n, float* part);
