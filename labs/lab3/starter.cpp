// Lab 3: the router's forward pass as a CUDA kernel, run on the CPU by
// support/harness/cuda_on_cpu.h (labs/lab3/README.md). Write lab_router_kernel below;
// `make lab3` runs it under every thread and block order the harness has.
#include "labs/lab.h"

// The same sum as lab 1 (Eq. 2), for layer l:
//   Kr[r, n, i] = sum_{j < J} Wk[r, j] * Kbuf[j][n, i],  J = (l+1)R   (Vr alike with Wv)
// Kr, Vr (R, N, hd); Wk, Wv (R, J) (Wk == Wv with one router); Kbuf, Vbuf
// (L, R, N, hd), head-major: row j = l'*R + r' (layer l', kv head r') of N*hd
// floats, so Kbuf[j][n, i] is Kbuf[((size_t)j * N + n) * hd + i].
//
// The plan (given): one block per position n, LAB3_THREADS threads. The block
// first copies both routers into shared memory, w = [Wk (R*J floats), Wv (R*J)],
// each thread a strided share; once every thread's copy is in, thread t
// computes the outputs (r, i) with r * hd + i = t, t + blockDim.x, ...,
// reading the routers from w.
#define LAB3_THREADS 32
__global__ void lab_router_kernel(float* Kr, float* Vr, const float* Wk, const float* Wv,
                                  const float* Kbuf, const float* Vbuf, int l, int N, int R, int hd) {
    DYNAMIC_SHARED(float, w);  // 2 * R * J floats: Wk, then Wv
    // Your code here (position n = blockIdx.x).
}

// Given: the launch lime.cu's router calls (router_forward_gpu) and the lab's checks use.
void router_forward_gpu(float* Kr, float* Vr, const float* Wk, const float* Wv, const float* Kbuf,
                        const float* Vbuf, int l, int N, int R, int hd, cublasHandle_t blas) {
    cudaStream_t stream;  // the model's stream: its cuBLAS handle's
    cublasGetStream(blas, &stream);
    size_t shared = 2 * (size_t)R * (l + 1) * R * sizeof(float);
    LAUNCH(lab_router_kernel, N, LAB3_THREADS, shared, stream)(Kr, Vr, Wk, Wv, Kbuf, Vbuf, l, N, R, hd);
}
