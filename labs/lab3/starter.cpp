// Lab 3: the router's forward pass as a CUDA kernel, run on the CPU by
// support/harness/cuda_on_cpu.h (labs/lab3/README.md). Write lab_router_kernel below;
// `make lab3` runs it under every thread and block order the harness has.
#include "labs/lab.h"

// The same sum as lab 1 (Eq. 2), for the keys and the values in one launch:
//   out.k[r][e] = sum_{j < cols} W.k[r, j] * buf.k[j][e]     (out.v alike with W.v, buf.v)
// cols = (l+1)R; out (R, N, hd), W (R, cols), buf (L, R, N, hd), all head-major,
// so a row (out's head r, buf's j = l'*R + r') is row = N*hd floats:
// out.k[r][e] is out.k[r * row + e], buf.k[j][e] is buf.k[j * row + e].
// With one router W.k == W.v.
//
// The plan (given), lime.cu's router_forward_kernel with the router in shared
// memory: a grid of (row / LAB3_THREADS rounded up) x 2 blocks of LAB3_THREADS
// threads. blockIdx.y picks the keys (0) or the values (1): the block's W,
// buf and out. The block first copies its W (R * cols floats) into shared
// memory, w, each thread a strided share; once every thread's copy is in,
// thread t computes element e = blockIdx.x * blockDim.x + t of every output
// row r (the last block's threads past the row's end have no element),
// reading the weights from w.
#define LAB3_THREADS 32
__global__ void lab_router_kernel(KvPair out, KvConst W, KvConst buf, int cols, int R, size_t row) {
    DYNAMIC_SHARED(float, w);  // R * cols floats: the block's router
    // Your code here.
}

// Given: the launcher lime.cu's router calls (router_forward_gpu) and the lab's checks use.
void router_forward_gpu(KvPair out, KvConst W, KvConst buf, int l, int N, int R, int hd, cudaStream_t stream) {
    int cols = (l + 1) * R;
    size_t row = (size_t)N * hd, shared = (size_t)R * cols * sizeof(float);
    dim3 grid((unsigned)((row + LAB3_THREADS - 1) / LAB3_THREADS), 2);
    LAUNCH(lab_router_kernel, grid, LAB3_THREADS, shared, stream)(out, W, buf, cols, R, row);
}
