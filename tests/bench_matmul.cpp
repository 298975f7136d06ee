// tests/bench_matmul.cpp — `make bench`'s last lines: the FMA peak of one core
// and what the fast CPU products (support/model/cpu_fast.cpp) reach on the shapes
// of the two benchmark configs, in GFLOP/s of CPU time (so that a busy
// machine slows it less than the clock on the wall). Measures, checks nothing.
//
// The peak: independent chains of fused multiply-adds on whole vector
// registers (x = x * m + c), 2 FLOPs per lane each: 16 with AVX-512's 32
// registers, 12 with AVX2's 16 (16 chains, m and c are 18 registers: g++ kept
// three chains on the stack, and an AMD EPYC's peak read 50 GFLOP/s where the
// products reached 69). 12 chains hide the FMA latency on any CPU with up to
// 6 cycles of it and two FMA units.
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "support/model/cpu_fast.h"

static double cpu_seconds() {
    timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

// GFLOP/s of `chains` FMA chains of a vector type V, `lanes` floats wide.
template <int chains, class V, class Fma>
static double fma_peak(V start, V m, V c, int lanes, Fma fma) {
    V x[chains];
    for (int i = 0; i < chains; i++) x[i] = start;
    long rounds = 20000000;
    double t0 = cpu_seconds();
    for (long r = 0; r < rounds; r++)
        for (int i = 0; i < chains; i++) x[i] = fma(x[i], m, c);
    double t = cpu_seconds() - t0;
    volatile float sink = 0;
    for (int i = 0; i < chains; i++) sink = sink + ((float*)&x[i])[0];
    return 2.0 * lanes * chains * rounds / t / 1e9;
}

int main() {
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
    printf("one core, CPU time; the products use the %s micro-kernel\n", matmul_fast_kernel());
#if defined(__AVX512F__)
    printf("  FMA peak, 512-bit: %6.1f GFLOP/s\n",
           fma_peak<16>(_mm512_set1_ps(1.0f), _mm512_set1_ps(0.999999f), _mm512_set1_ps(1e-7f), 16,
                    [](__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }));
#endif
#if defined(__AVX2__) && defined(__FMA__)
    printf("  FMA peak, 256-bit: %6.1f GFLOP/s\n",
           fma_peak<12>(_mm256_set1_ps(1.0f), _mm256_set1_ps(0.999999f), _mm256_set1_ps(1e-7f), 8,
                    [](__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }));
#endif
    struct Shape { int N, C, OC; } shapes[] = {{2048, 128, 128}, {2048, 128, 352}, {2048, 352, 128},
                                               {11264, 32, 32},  {11264, 32, 96},  {11264, 96, 32}};
    printf("  %-22s %9s %9s %9s  GFLOP/s\n", "N x C -> OC", "inp@W^T", "dout@W", "dout^T@inp");
    for (Shape s : shapes) {
        std::vector<float> inp((size_t)s.N * s.C, 0.5f), W((size_t)s.OC * s.C, 0.25f), out((size_t)s.N * s.OC),
            dout((size_t)s.N * s.OC, 0.1f), dinp((size_t)s.N * s.C), dW((size_t)s.OC * s.C);
        std::vector<float> scratch(matmul_fast_scratch_floats(std::max(s.N, s.OC), std::max(s.C, s.OC)));
        double flops = 2.0 * s.N * s.C * s.OC;
        int reps = std::max(3, (int)(2e9 / flops));
        double t0 = cpu_seconds();
        for (int r = 0; r < reps; r++)
            matmul_forward_fast(out.data(), inp.data(), W.data(), s.N, s.C, s.OC, false, scratch.data());
        double fwd = (cpu_seconds() - t0) / reps;
        t0 = cpu_seconds();
        for (int r = 0; r < reps; r++)  // dW alone
            matmul_backward_fast(nullptr, dW.data(), dout.data(), inp.data(), W.data(), s.N, s.C, s.OC, true);
        double dw = (cpu_seconds() - t0) / reps;
        t0 = cpu_seconds();
        for (int r = 0; r < reps; r++)  // dinp and dW
            matmul_backward_fast(dinp.data(), dW.data(), dout.data(), inp.data(), W.data(), s.N, s.C, s.OC, true);
        double both = (cpu_seconds() - t0) / reps;
        char name[64];
        snprintf(name, sizeof name, "%d x %d -> %d", s.N, s.C, s.OC);
        printf("  %-22s %9.1f %9.1f %9.1f\n", name, flops / fwd / 1e9, flops / std::max(both - dw, 1e-9) / 1e9,
               flops / dw / 1e9);
    }
    return 0;
}
