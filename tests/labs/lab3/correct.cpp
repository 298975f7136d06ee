// A correct lab_router_kernel, written as a student would: it passes lab 3 (tests/test_labs.sh).
// expect: PASS
#include "labs/lab.h"

#define LAB3_THREADS 32
__global__ void lab_router_kernel(KvPair out, KvConst W, KvConst buf, int cols, int R, size_t row) {
    DYNAMIC_SHARED(float, w);  // R * cols floats: the block's router
    const float* Wt = blockIdx.y ? W.v : W.k;  // the keys (blockIdx.y = 0) or the values (1)
    const float* b = blockIdx.y ? buf.v : buf.k;
    float* o = blockIdx.y ? out.v : out.k;
    for (int x = threadIdx.x; x < R * cols; x += blockDim.x) w[x] = Wt[x];
    __syncthreads();  // every thread's share of w is in
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= row) return;  // past the row's end: no element (after the barrier, which every thread must reach)
    for (int r = 0; r < R; r++) {
        float s = 0;
        for (int j = 0; j < cols; j++) s += w[r * cols + j] * b[j * row + e];
        o[r * row + e] = s;
    }
}

void router_forward_gpu(KvPair out, KvConst W, KvConst buf, int l, int N, int R, int hd, cudaStream_t stream) {
    int cols = (l + 1) * R;
    size_t row = (size_t)N * hd, shared = (size_t)R * cols * sizeof(float);
    dim3 grid((unsigned)((row + LAB3_THREADS - 1) / LAB3_THREADS), 2);
    LAUNCH(lab_router_kernel, grid, LAB3_THREADS, shared, stream)(out, W, buf, cols, R, row);
}
