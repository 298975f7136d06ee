// support/study/mixing.cuh — a learned mixture of whole arrays, the op the
// study's two peers share: ResFormer's value residual (a layer's values and
// the first layer's) and DenseFormer's depth-weighted average (the embedding
// and every block's output). LIMe's router is a mixture too, but of kv heads
// at each position; this one mixes whole arrays with one weight each:
//   y (n) = sum_{j < K} a[j] * X_j,   X_0 = first, X_j = rest + (j-1) * n for j >= 1
// and, backward (the gradients laid out as the X_j):
//   dX_j += a[j] * dy                 dfirst for j = 0, drest + (j-1) * n for j >= 1
//   da[j] += sum_e dy[e] * X_j[e]     over CHUNKS fixed slices (GPU: MIX_ROWS), then in order
// In the file: the plain loops, the kernels and their launchers, the dispatchers op_mix_*
// (./lime's fast versions, with the same bits: support/model/cpu_fast.cpp).
#pragma once
#include <algorithm>
#include <cstring>

#include "support/model/cpu_fast.h"
#include "support/model/device.cuh"
#include "support/model/lime.h"

// X_j of a mixture: first, then rest's arrays of n floats one after another.
#define MIX_ROWS 4096  // GPU: elements per block of the weights' gradient

HOST_DEVICE inline const float* mix_term(const float* first, const float* rest, int j, size_t n) {
    return j == 0 ? first : rest + (j - 1) * n;
}
HOST_DEVICE inline float* mix_term(float* first, float* rest, int j, size_t n) {
    return j == 0 ? first : rest + (j - 1) * n;
}

static void mix_forward(float* y, const float* a, const float* first, const float* rest, int K, size_t n) {
#pragma omp parallel for schedule(static) if (n > SHARED_FLOATS)
    for (size_t e = 0; e < n; e++) {
        float s = 0;
        for (int j = 0; j < K; j++) s += a[j] * mix_term(first, rest, j, n)[e];
        y[e] = s;
    }
}

// forward: y = sum_j a[j] X_j
// dX_j += a[j] * dy;  da[j] += sum_e dy[e] X_j[e]. part: CHUNKS * K floats, each slice's sums.
static void mix_backward(float* dfirst, float* drest, float* da, const float* dy, const float* a, const float* first,
                         const float* rest, int K, size_t n, float* part) {
#pragma omp parallel for schedule(static)
    for (int c = 0; c < CHUNKS; c++) {
        float* sums = part + (size_t)c * K;
        std::fill(sums, sums + K, 0.0f);
        for (size_t e = n * c / CHUNKS; e < n * (c + 1) / CHUNKS; e++)
            for (int j = 0; j < K; j++) {
                sums[j] += dy[e] * mix_term(first, rest, j, n)[e];
                mix_term(dfirst, drest, j, n)[e] += a[j] * dy[e];
            }
    }
    for (int c = 0; c < CHUNKS; c++)
        for (int j = 0; j < K; j++) da[j] += part[(size_t)c * K + j];
}

#ifdef LIME_GPU
// One thread per element e, the terms in order.
__global__ void mix_forward_kernel(float* y, const float* a, const float* first, const float* rest, int K, size_t n) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    float s = 0;
    for (int j = 0; j < K; j++) s += a[j] * mix_term(first, rest, j, n)[e];
    y[e] = s;
}
static void mix_forward_gpu(float* y, const float* a, const float* first, const float* rest, int K, size_t n,
                            cudaStream_t stream) {
    LAUNCH(mix_forward_kernel, ceil_div(n, 256), 256, 0, stream)(y, a, first, rest, K, n);
    launchCheck();
}
// The weights' gradient in two fixed-order steps, no atomics: block b sums its
// MIX_ROWS elements of each dy . X_j as a fixed tree into partial (blocks, K);
// then one thread per weight adds the blocks in order. The arrays' gradients:
// one thread per element.
__global__ void mix_backward_kernel(float* dfirst, float* drest, float* partial, const float* dy, const float* a,
                                    const float* first, const float* rest, int K, size_t n) {
    __shared__ float tree[256];
    size_t from = (size_t)blockIdx.x * MIX_ROWS, to = min(n, from + MIX_ROWS);
    for (int j = 0; j < K; j++) {
        const float* X = mix_term(first, rest, j, n);
        float* dX = mix_term(dfirst, drest, j, n);
        float s = 0;
        for (size_t e = from + threadIdx.x; e < to; e += blockDim.x) {
            s += dy[e] * X[e];
            dX[e] += a[j] * dy[e];
        }
        s = block_sum(s, tree);
        if (threadIdx.x == 0) partial[(size_t)blockIdx.x * K + j] = s;
    }
}
__global__ void mix_weights_reduce_kernel(float* da, const float* partial, int blocks, int K) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= K) return;
    float s = 0;
    for (int b = 0; b < blocks; b++) s += partial[(size_t)b * K + j];
    da[j] += s;
}
// partial: mix_gpu_scratch_floats(K, n) floats.
static void mix_backward_gpu(float* dfirst, float* drest, float* da, const float* dy, const float* a,
                             const float* first, const float* rest, int K, size_t n, float* partial,
                             cudaStream_t stream) {
    int blocks = (int)ceil_div(n, MIX_ROWS);
    LAUNCH(mix_backward_kernel, blocks, 256, 0, stream)(dfirst, drest, partial, dy, a, first, rest, K, n);
    launchCheck();
    LAUNCH(mix_weights_reduce_kernel, ceil_div(K, 256), 256, 0, stream)(da, partial, blocks, K);
    launchCheck();
}
#endif
// The scratch a mixture of K arrays of n floats takes: the CPU's slices, the GPU's blocks.
static inline size_t mix_scratch_floats(int K, size_t n) {
    return (size_t)K * std::max<size_t>(CHUNKS, (n + MIX_ROWS - 1) / MIX_ROWS);
}

static void op_mix_forward(Model* model, float* y, const float* a, const float* first, const float* rest, int K,
                           size_t n) {
    DISPATCH(model, mix_forward_gpu(y, a, first, rest, K, n, stream_of(model)), mix_forward_fast(y, a, first, rest, K, n),
             mix_forward(y, a, first, rest, K, n));
}
static void op_mix_backward(Model* model, float* dfirst, float* drest, float* da, const float* dy, const float* a,
                            const float* first, const float* rest, int K, size_t n, float* scratch) {
    DISPATCH(model, mix_backward_gpu(dfirst, drest, da, dy, a, first, rest, K, n, scratch, stream_of(model)),
             mix_backward_fast(dfirst, drest, da, dy, a, first, rest, K, n, scratch),
             mix_backward(dfirst, drest, da, dy, a, first, rest, K, n, scratch));
}
