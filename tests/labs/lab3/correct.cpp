// A correct lab_router_kernel, written as a student would: it passes lab 3 (tests/test_labs.sh).
// expect: PASS
#include "labs/lab.h"

#define LAB3_THREADS 32
__global__ void lab_router_kernel(float* Kr, float* Vr, const float* Wk, const float* Wv,
                                  const float* Kbuf, const float* Vbuf, int l, int N, int R, int hd) {
    DYNAMIC_SHARED(float, w);  // 2 * R * J floats: Wk, then Wv
    int n = blockIdx.x, J = (l + 1) * R;
    for (int e = threadIdx.x; e < R * J; e += blockDim.x) {
        w[e] = Wk[e];
        w[R * J + e] = Wv[e];
    }
    __syncthreads();  // every thread's share of w is in
    size_t layer = (size_t)N * R * hd;
    for (int t = threadIdx.x; t < R * hd; t += blockDim.x) {
        int r = t / hd, i = t % hd;
        float k = 0, v = 0;
        for (int j = 0; j < J; j++) {
            size_t src = (j / R) * layer + ((size_t)(j % R) * N + n) * hd + i;
            k += w[r * J + j] * Kbuf[src];
            v += w[R * J + r * J + j] * Vbuf[src];
        }
        Kr[((size_t)r * N + n) * hd + i] = k;
        Vr[((size_t)r * N + n) * hd + i] = v;
    }
}

void router_forward_gpu(float* Kr, float* Vr, const float* Wk, const float* Wv, const float* Kbuf,
                        const float* Vbuf, int l, int N, int R, int hd, cublasHandle_t blas) {
    cudaStream_t stream;  // the model's stream: its cuBLAS handle's
    cublasGetStream(blas, &stream);
    size_t shared = 2 * (size_t)R * (l + 1) * R * sizeof(float);
    LAUNCH(lab_router_kernel, N, LAB3_THREADS, shared, stream)(Kr, Vr, Wk, Wv, Kbuf, Vbuf, l, N, R, hd);
}
