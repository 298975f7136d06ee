// An empty kernel, launched as the starter does; then the launcher waits for
// it and computes the sum on the host, right. The kernel ran, but it did not
// compute the outputs: it fails.
// expect: lab_router_kernel did not compute Kr and Vr
#include "labs/lab.h"

#define LAB3_THREADS 32
__global__ void lab_router_kernel(KvPair out, KvConst W, KvConst buf, int cols, int R, size_t row) {}

static void mix(float* out, const float* W, const float* buf, int cols, int R, size_t row) {
    for (int r = 0; r < R; r++)
        for (size_t e = 0; e < row; e++) {
            float s = 0;
            for (int j = 0; j < cols; j++) s += W[r * cols + j] * buf[j * row + e];
            out[r * row + e] = s;
        }
}
void router_forward_gpu(KvPair out, KvConst W, KvConst buf, int l, int N, int R, int hd, cudaStream_t stream) {
    int cols = (l + 1) * R;
    size_t row = (size_t)N * hd, shared = (size_t)R * cols * sizeof(float);
    dim3 grid((unsigned)((row + LAB3_THREADS - 1) / LAB3_THREADS), 2);
    LAUNCH(lab_router_kernel, grid, LAB3_THREADS, shared, stream)(out, W, buf, cols, R, row);
    cudaStreamSynchronize(stream);
    mix(out.k, W.k, buf.k, cols, R, row);
    mix(out.v, W.v, buf.v, cols, R, row);
}
