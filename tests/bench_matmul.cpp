// tests/bench_matmul.cpp — `make bench`'s last lines: the memory's speed, then
// the FMA peak of one core and what the fast CPU products
// (support/model/cpu_fast.cpp) reach on the shapes of the two benchmark
// configs, in GFLOP/s of CPU time (so that a busy machine slows it less than
// the clock on the wall). Measures, checks nothing.
//
// The peak: support/lib/cpu_peak.h, its chains of fused multiply-adds on one core.
// The memory: c = a + s * b over arrays of 64 MB, far larger than the caches, on
// one thread and on all, in wall-clock time: what a pass that streams its
// arrays, as the router's products do (docs/speed.md), can reach.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "support/lib/cpu_peak.h"
#include "support/model/cpu_fast.h"

static double cpu_seconds() {
    timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

// GB/s of c = a + s * b (the three arrays' bytes over the time), the median of 9 passes.
static double triad_gb_per_s(int threads) {
    size_t n = (size_t)16 << 20;  // floats an array: 64 MB
    std::vector<float> a(n, 1.0f), b(n, 2.0f), c(n, 0.0f);
    std::vector<double> rates;
    for (int pass = 0; pass < 9; pass++) {
        auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for schedule(static) num_threads(threads)
        for (size_t i = 0; i < n; i++) c[i] = a[i] + 0.5f * b[i];
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        rates.push_back(3.0 * n * sizeof(float) / s / 1e9);
    }
    volatile float read_back = c[n / 2];  // c is read, so its stores are not dropped
    (void)read_back;
    std::sort(rates.begin(), rates.end());
    return rates[rates.size() / 2];
}

int main() {
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    printf("memory, c = a + s * b over 64 MB arrays (wall clock): 1 thread %.1f GB/s, %d threads %.1f GB/s\n",
           triad_gb_per_s(1), threads, triad_gb_per_s(threads));
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
    printf("one core, CPU time; the products use the %s micro-kernel\n", matmul_fast_kernel());
    double t0 = cpu_seconds(), peak_flops = cpu_fma_flops(20000000);
    printf("  FMA peak, %s: %6.1f GFLOP/s\n", cpu_fma_kind(), peak_flops / (cpu_seconds() - t0) / 1e9);
    struct Shape { int N, C, OC; } shapes[] = {{2048, 128, 128}, {2048, 128, 352}, {2048, 352, 128},
                                               {11264, 32, 32},  {11264, 32, 96},  {11264, 96, 32}};
    printf("  %-22s %9s %9s %9s  GFLOP/s\n", "N x C -> OC", "inp@W^T", "dout@W", "dout^T@inp");
    for (Shape s : shapes) {
        std::vector<float> inp((size_t)s.N * s.C, 0.5f), W((size_t)s.OC * s.C, 0.25f), out((size_t)s.N * s.OC),
            dout((size_t)s.N * s.OC, 0.1f), dinp((size_t)s.N * s.C), dW((size_t)s.OC * s.C);
        std::vector<float> scratch(matmul_fast_scratch_floats(std::max(s.N, s.OC), std::max(s.C, s.OC)));
        double flops = 2.0 * s.N * s.C * s.OC;
        int reps = std::max(3, (int)(2e9 / flops));
        t0 = cpu_seconds();
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
