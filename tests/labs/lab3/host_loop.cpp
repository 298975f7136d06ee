// An empty kernel, never launched: the launcher waits for the stream and
// computes the sum on the host, right. Lab 3 is the kernel, so it fails.
// expect: lab_router_kernel never ran on the harness
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
    cudaStreamSynchronize(stream);
    mix(out.k, W.k, buf.k, (l + 1) * R, R, (size_t)N * hd);
    mix(out.v, W.v, buf.v, (l + 1) * R, R, (size_t)N * hd);
}
