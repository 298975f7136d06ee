// support/model/attention_gpu.cuh — lime.cu's causal GQA attention on the
// GPU as batched matrix products around a softmax, as in llm.c: the keys'
// scores and the values' mixture are cuBLAS products, the causal softmax and
// its backward one warp per row. The (B, H, T, T) probabilities are kept for
// the backward (the flash-style kernels of support/model/flash_attention.cuh
// keep one number per row instead). Read lime.cu's attention section first:
// the math, the plain loops and the dispatchers are there.
#pragma once
#include "support/model/device.cuh"

#ifdef LIME_GPU
// The products want each (kv head, sequence) group's positions contiguous.
// The keys and values are (rows of the KV buffer, (R, B, T, hd)); the queries
// are copied group-major, (B, T, H, hd) -> (R, B, n_rep, T, hd): the n_rep
// query heads of kv head r, sequence b, are one (M, hd) matrix, M = n_rep*T,
// group g = r*B + b, at g*M*hd, as that group's keys are at g*T*hd. So each
// product is ONE strided-batched call over all R*B groups:
//   scores_g (M, T) = q_g @ k_g^T * scale    -> att_g, then the causal softmax in place
//   out_g    (M, hd) = att_g @ v_g
// att (R, B, n_rep, T, T) keeps the probabilities group-major too (the GPU's
// own layout: the CPU's is (B, H, T, T)); a row is (g, j, t), t = row % T.
// The scores above the diagonal (u > t) are computed and then set to 0.
__global__ void group_heads_kernel(float* dst, const float* src, int B, int T, int H, int R, int hd) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;  // over dst (R, B, n_rep, T, hd); 32-bit: see launch_check
    if (idx >= B * T * H * hd) return;
    int n_rep = H / R, i = idx % hd, t = idx / hd % T, j = idx / hd / T % n_rep, b = idx / hd / T / n_rep % B;
    int h = idx / hd / T / n_rep / B * n_rep + j;
    dst[idx] = src[((b * T + t) * H + h) * hd + i];
}
__global__ void ungroup_heads_kernel(float* dst, const float* src, int B, int T, int H, int R, int hd) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;  // over dst (B, T, H, hd)
    if (idx >= B * T * H * hd) return;
    int n_rep = H / R, i = idx % hd, h = idx / hd % H, t = idx / hd / H % T, b = idx / hd / H / T;
    dst[idx] = src[((((size_t)(h / n_rep) * B + b) * n_rep + h % n_rep) * T + t) * hd + i];
}
static void group_heads_gpu(float* dst, const float* src, int B, int T, int H, int R, int hd, cudaStream_t stream) {
    LAUNCH(group_heads_kernel, ceil_div((size_t)B * T * H * hd, 256), 256, 0, stream)(dst, src, B, T, H, R, hd);
    launchCheck();
}
static void ungroup_heads_gpu(float* dst, const float* src, int B, int T, int H, int R, int hd, cudaStream_t stream) {
    LAUNCH(ungroup_heads_kernel, ceil_div((size_t)B * T * H * hd, 256), 256, 0, stream)(dst, src, B, T, H, R, hd);
    launchCheck();
}

// Rows of att (b, h, t), each T long: p[u] = softmax over u <= t, and 0 for u > t. One warp per row.
// One read of the causal half gives the row's max and sum together (online: a lane's running sum is
// rescaled when its max grows, then the warp joins its lanes' pairs), and one write gives the row:
// the probabilities for u <= t, zeros above (the scores' product wrote the whole row).
__global__ void causal_softmax_kernel(float* att, int rows, int T) {
    int lane = threadIdx.x % 32, row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= rows) return;
    int t = row % T;
    float* p = att + (size_t)row * T;
    float mx = -INFINITY, sum = 0;  // this lane's max, and its sum of e^(p[u] - mx)
    for (int u = lane; u <= t; u += 32) {
        float x = p[u];
        if (x > mx) sum = sum * expf(mx - x) + 1.0f, mx = x;
        else sum += expf(x - mx);
    }
    float row_mx = warp_max(mx);
    sum = warp_sum(mx == -INFINITY ? 0.0f : sum * expf(mx - row_mx));  // a lane past t holds nothing
    for (int u = lane; u < T; u += 32) p[u] = u <= t ? expf(p[u] - row_mx) / sum : 0.0f;
}
// In place over dp: ds[u] = p[u] (dp[u] - sum_u' p[u'] dp[u']) for u <= t, 0 beyond.
__global__ void causal_softmax_backward_kernel(float* datt, const float* att, int rows, int T) {
    int lane = threadIdx.x % 32, row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= rows) return;
    int t = row % T;
    const float* p = att + (size_t)row * T;
    float* ds = datt + (size_t)row * T;
    float pdp = 0;
    for (int u = lane; u <= t; u += 32) pdp += p[u] * ds[u];
    pdp = warp_sum(pdp);
    for (int u = lane; u < T; u += 32) ds[u] = u <= t ? p[u] * (ds[u] - pdp) : 0.0f;
}

// k, v (R, B, T, hd); scratch: 2 * B*T*H*hd floats for group-major q and out.
static void attention_forward_gpu(float* out, float* att, const float* q, const float* k, const float* v, int B, int T,
                                  int H, int R, int hd, float* scratch, cublasHandle_t blas, cudaStream_t stream) {
    int M = H / R * T, groups = R * B;  // rows of one (kv head, sequence) group
    float *qg = scratch, *og = scratch + (size_t)B * T * H * hd;
    const float scale = 1.0f / sqrtf((float)hd), one = 1.0f, zero = 0.0f;
    long long sq = (long long)M * hd, skv = (long long)T * hd, satt = (long long)M * T;  // strides over the groups
    group_heads_gpu(qg, q, B, T, H, R, hd, stream);
    // att_g (M, T) = scale * q_g (M, hd) @ k_g^T: column-major att_g^T (T, M) = k_g (T, hd)^T.. as matmul_forward_gpu's
    cublasCheck(cublasSgemmStridedBatched(blas, CUBLAS_OP_T, CUBLAS_OP_N, T, M, hd, &scale, k, hd, skv, qg, hd, sq,
                                          &zero, att, T, satt, groups));
    LAUNCH(causal_softmax_kernel, ceil_div((size_t)B * H * T, 4), 128, 0, stream)(att, B * H * T, T);
    launchCheck();
    // og_g (M, hd) = att_g (M, T) @ v_g (T, hd): column-major og_g^T (hd, M) = v_g^T (hd, T) @ att_g^T (T, M)
    cublasCheck(cublasSgemmStridedBatched(blas, CUBLAS_OP_N, CUBLAS_OP_N, hd, M, T, &one, v, hd, skv, att, T, satt,
                                          &zero, og, hd, sq, groups));
    ungroup_heads_gpu(out, og, B, T, H, R, hd, stream);
}

// The same products backwards, group g = (kv head r, sequence b):
//   datt_g = dout_g @ v_g^T;   dv_g += att_g^T @ dout_g   (sums over the group's heads and positions)
//   ds = softmax backward (in place over datt)
//   dq_g = scale * ds_g @ k_g;  dk_g += scale * ds_g^T @ q_g
// dq is written; dk and dv (R, B, T, hd) are added to, as on the CPU.
// scratch: 3 * B*T*H*hd floats (group-major q, dout, dq).
static void attention_backward_gpu(float* dq, float* dk, float* dv, float* datt, const float* dout, const float* q,
                                   const float* k, const float* v, const float* att, int B, int T, int H, int R, int hd,
                                   float* scratch, cublasHandle_t blas, cudaStream_t stream) {
    int M = H / R * T, groups = R * B;
    size_t qsize = (size_t)B * T * H * hd;
    float *qg = scratch, *dog = scratch + qsize, *dqg = scratch + 2 * qsize;
    const float scale = 1.0f / sqrtf((float)hd), one = 1.0f, zero = 0.0f;
    long long sq = (long long)M * hd, skv = (long long)T * hd, satt = (long long)M * T;
    group_heads_gpu(qg, q, B, T, H, R, hd, stream);
    group_heads_gpu(dog, dout, B, T, H, R, hd, stream);
    cublasCheck(cublasSgemmStridedBatched(blas, CUBLAS_OP_T, CUBLAS_OP_N, T, M, hd, &one, v, hd, skv, dog, hd, sq,
                                          &zero, datt, T, satt, groups));
    // dv_g^T (hd, T) += dog_g^T (hd, M) @ att_g (M, T)
    cublasCheck(cublasSgemmStridedBatched(blas, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, M, &one, dog, hd, sq, att, T, satt,
                                          &one, dv, hd, skv, groups));
    LAUNCH(causal_softmax_backward_kernel, ceil_div((size_t)B * H * T, 4), 128, 0, stream)(datt, att, B * H * T, T);
    launchCheck();
    cublasCheck(cublasSgemmStridedBatched(blas, CUBLAS_OP_N, CUBLAS_OP_N, hd, M, T, &scale, k, hd, skv, datt, T, satt,
                                          &zero, dqg, hd, sq, groups));
    cublasCheck(cublasSgemmStridedBatched(blas, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, M, &scale, qg, hd, sq, datt, T, satt,
                                          &one, dk, hd, skv, groups));
    ungroup_heads_gpu(dq, dqg, B, T, H, R, hd, stream);
}

#endif
