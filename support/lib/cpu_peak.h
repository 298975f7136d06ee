// support/lib/cpu_peak.h — the fused multiply-add peak of one CPU core, measured:
// independent chains of x = x * m + c on whole vector registers, 2 FLOPs per
// lane each, the widest vectors this build was compiled for. `./lime bench`
// runs it on every thread between its steps (the CPU's MFU), and
// tests/bench_matmul.cpp on one core (the products' GFLOP/s against it).
//
// 16 chains with AVX-512's 32 registers, 12 with AVX2's 16 (16 chains, m and c
// are 18 registers: g++ kept three chains on the stack, and an AMD EPYC's peak
// read 50 GFLOP/s where the products reached 69). 12 chains hide the FMA
// latency on any CPU with up to 6 cycles of it and two FMA units. A build for
// neither (another CPU, or no -march) runs 12 chains of the compiler's own
// 4-float vectors, fused where the build lets it.
#pragma once
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

// The chains' loop: `rounds` rounds of `chains` FMAs on vectors V; returns the FLOPs it did.
template <int chains, class V, class Fma>
static inline double fma_chains(long rounds, V start, V m, V c, int lanes, Fma fma) {
    V x[chains];
    for (int i = 0; i < chains; i++) x[i] = start;
    for (long r = 0; r < rounds; r++)
        for (int i = 0; i < chains; i++) x[i] = fma(x[i], m, c);
    volatile float sink = 0;  // the sums are used: the loop cannot be dropped
    for (int i = 0; i < chains; i++) sink = sink + ((float*)&x[i])[0];
    return 2.0 * lanes * chains * rounds;
}

// The FLOPs of `rounds` rounds of the widest FMA chains this build has, run on the calling thread.
static inline double cpu_fma_flops(long rounds) {
#if defined(__AVX512F__)
    return fma_chains<16>(rounds, _mm512_set1_ps(1.0f), _mm512_set1_ps(0.999999f), _mm512_set1_ps(1e-7f), 16,
                          [](__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); });
#elif defined(__AVX2__) && defined(__FMA__)
    return fma_chains<12>(rounds, _mm256_set1_ps(1.0f), _mm256_set1_ps(0.999999f), _mm256_set1_ps(1e-7f), 8,
                          [](__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); });
#else
    typedef float V4 __attribute__((vector_size(16)));  // 16 bytes: what every x86-64 and ARM64 CPU has
    V4 one = {1, 1, 1, 1}, m = one * 0.999999f, c = one * 1e-7f;
    return fma_chains<12>(rounds, one, m, c, 4, [](V4 x, V4 mul, V4 add) { return x * mul + add; });
#endif
}

// The vectors cpu_fma_flops runs: "512-bit", "256-bit" or "portable 128-bit".
static inline const char* cpu_fma_kind() {
#if defined(__AVX512F__)
    return "512-bit";
#elif defined(__AVX2__) && defined(__FMA__)
    return "256-bit";
#else
    return "portable 128-bit";
#endif
}
