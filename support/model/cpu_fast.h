// support/model/cpu_fast.h — the fast CPU path (support/model/cpu_fast.cpp): blocked
// versions of lime.cu's plain matrix product, router and attention loops, and
// a vectorisable e^x. Same arguments as the plain function each one names,
// plus, for the products, a scratch buffer.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <cmath>

#include "support/model/lime.h"  // RouterSpan

// The scratch the fast products need (packed panels of 32 columns), in floats,
// for products of at most `rows` rows by at most `cols` columns.
inline size_t matmul_fast_scratch_floats(size_t rows, size_t cols) { return rows * ((cols + 31) / 32 * 32); }

// = matmul_forward; scratch: matmul_fast_scratch_floats(C, OC).
void matmul_forward_fast(float* out, const float* inp, const float* W, int N, int C, int OC, bool accumulate,
                         float* scratch);
// = matmul_backward; scratch: matmul_fast_scratch_floats(max(N, OC), C).
void matmul_backward_fast(float* dinp, float* dW, const float* dout, const float* inp, const float* W, int N, int C,
                          int OC, float* scratch);
// The micro-kernel the products use: "avx512", "avx2" or "plain" (the best this build has).
const char* matmul_fast_kernel();
#ifdef LIME_TESTING
// Tests: how many micro-kernels this build has, and which the products use (0 = the best).
int matmul_fast_kernels();
void matmul_fast_use_kernel(int i);
#endif
// = router_forward, router_backward.
void router_forward_fast(float* Kr, float* Vr, const float* Wk, const float* Wv, const float* Kbuf, const float* Vbuf,
                         int l, int N, int R, int hd);
void router_backward_fast(float* dWk, float* dWv, float* dKbuf, float* dVbuf, const float* dKr, const float* dVr,
                          const float* Wk, const float* Wv, const float* Kbuf, const float* Vbuf, int l,
                          RouterSpan learned, int N, int R, int hd);
// = attention_forward, attention_backward.
void attention_forward_fast(float* out, float* att, const float* q, const float* k, const float* v, int B, int T, int H,
                            int R, int hd);
void attention_backward_fast(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                             const float* v, const float* att, int B, int T, int H, int R, int hd);

// e^x, within 2 ulp of expf (lime.cu's cpu_exp uses it in the fast build), in
// plain arithmetic the compiler vectorises (a call to expf stops
// it). e^x = 2^n * e^r with n = round(x / ln 2) and |r| <= ln(2) / 2; e^r is
// the Cephes polynomial, 2^n is built from its bits. Below -87 it gives 0,
// above 88 infinity (e^x < 1.7e-38 or > 1.6e38 there); NaN stays NaN.
inline float exp_fast(float x) {
    const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer, n, held in the low bits
    float xc = std::min(std::max(x, -87.0f), 88.0f);
    float t = xc * 1.44269504f + shifter;
    float n = t - shifter;
    float r = xc - n * 0.693359375f + n * 2.12194440e-4f;  // x - n ln 2, ln 2 in two parts
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    uint32_t bits;
    memcpy(&bits, &t, sizeof bits);
    bits = (bits << 23) + (127u << 23);  // the exponent field of 2^n: n + 127
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x < -87.0f ? 0.0f : x > 88.0f ? INFINITY : p * scale;
}

