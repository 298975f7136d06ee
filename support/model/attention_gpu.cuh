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
// On the GPU attention is batched matrix products around a softmax, as in
// llm.c. The products want each head's positions contiguous: the keys and
// values are (rows of the KV buffer), the queries are copied head-major,
// (B, T, H, hd) -> (B, H, T, hd). Then the n_rep query heads sharing kv head
// r are one (n_rep*T, hd) matrix, and for each kv head r one batched product
// over b computes, per batch entry b:
//   scores (n_rep*T, T) = q_g @ k_r^T * scale     -> att, then the causal softmax in place
//   out_g  (n_rep*T, hd) = att_g @ v_r
// The scores above the diagonal (u > t) are computed and then set to 0.
__global__ void split_heads_kernel(float* dst, const float* src, int B, int T, int nh, int hd) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;  // over dst (B, nh, T, hd); 32-bit: see launch_check
    if (idx >= B * nh * T * hd) return;
    int i = idx % hd, t = idx / hd % T, h = idx / hd / T % nh, b = idx / hd / T / nh;
    dst[idx] = src[((b * T + t) * nh + h) * hd + i];
}
__global__ void merge_heads_kernel(float* dst, const float* src, int B, int T, int nh, int hd) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;  // over dst (B, T, nh, hd)
    if (idx >= B * T * nh * hd) return;
    int i = idx % hd, h = idx / hd % nh, t = idx / hd / nh % T, b = idx / hd / nh / T;
    dst[idx] = src[((b * nh + h) * T + t) * hd + i];
}
static void split_heads_gpu(float* dst, const float* src, int B, int T, int nh, int hd, cudaStream_t stream) {
    LAUNCH(split_heads_kernel, ceil_div((size_t)B * T * nh * hd, 256), 256, 0, stream)(dst, src, B, T, nh, hd);
    launchCheck();
}
static void merge_heads_gpu(float* dst, const float* src, int B, int T, int nh, int hd, cudaStream_t stream) {
    LAUNCH(merge_heads_kernel, ceil_div((size_t)B * T * nh * hd, 256), 256, 0, stream)(dst, src, B, T, nh, hd);
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

// k, v (R, B, T, hd); scratch: 2 * B*T*H*hd floats for head-major q and out.
static void attention_forward_gpu(float* out, float* att, const float* q, const float* k, const float* v, int B, int T,
                                  int H, int R, int hd, float* scratch, cublasHandle_t blas, cudaStream_t stream) {
    int n_rep = H / R, M = n_rep * T;  // rows of one (b, kv head) group
    size_t qsize = (size_t)B * T * H * hd;
    float *qp = scratch, *op = scratch + qsize;
    const float scale = 1.0f / sqrtf((float)hd), one = 1.0f, zero = 0.0f;
    long long sq = (long long)H * T * hd, skv = (long long)T * hd, satt = (long long)H * T * T;  // strides over b
    split_heads_gpu(qp, q, B, T, H, hd, stream);
    // kv head r, entry b: q_g at qp + (b*H + r*n_rep)*T*hd, k_r at k + (r*B + b)*T*hd, att_g at att + (b*H + r*n_rep)*T*T
    for (int r = 0; r < R; r++) {  // att_g (M, T) = scale * q_g (M, hd) @ k_r^T: matmul_forward_gpu's product
        long long g = (long long)r * n_rep * T, kv = (long long)r * B * skv;  // group r's first row; kv head r's rows
        cublasCheck(cublasSgemmStridedBatched(blas, CUBLAS_OP_T, CUBLAS_OP_N, T, M, hd, &scale, k + kv, hd, skv,
                                              qp + g * hd, hd, sq, &zero, att + g * T, T, satt, B));
    }
    LAUNCH(causal_softmax_kernel, ceil_div((size_t)B * H * T, 4), 128, 0, stream)(att, B * H * T, T);
    launchCheck();
    // op_g (M, hd) = att_g (M, T) @ v_r (T, hd): column-major op_g^T (hd, M) = v_r^T (hd, T) @ att_g^T (T, M)
    for (int r = 0; r < R; r++) {
        long long g = (long long)r * n_rep * T, kv = (long long)r * B * skv;
        cublasCheck(cublasSgemmStridedBatched(blas, CUBLAS_OP_N, CUBLAS_OP_N, hd, M, T, &one, v + kv, hd, skv,
                                              att + g * T, T, satt, &zero, op + g * hd, hd, sq, B));
    }
    merge_heads_gpu(out, op, B, T, H, hd, stream);
}

// The same products backwards, batch entry b of kv head r:
//   datt_g = dout_g @ v_r^T;   dv_r += att_g^T @ dout_g   (sums over the group's heads and positions)
//   ds = softmax backward (in place over datt)
//   dq_g = scale * ds_g @ k_r;  dk_r += scale * ds_g^T @ q_g
// dq is written; dk and dv (R, B, T, hd) are added to, as on the CPU.
// scratch: 3 * B*T*H*hd floats (head-major q, dout, dq).
static void attention_backward_gpu(float* dq, float* dk, float* dv, float* datt, const float* dout, const float* q,
                                   const float* k, const float* v, const float* att, int B, int T, int H, int R, int hd,
                                   float* scratch, cublasHandle_t blas, cudaStream_t stream) {
    int n_rep = H / R, M = n_rep * T;
    size_t qsize = (size_t)B * T * H * hd;
    float *qp = scratch, *dop = scratch + qsize, *dqp = scratch + 2 * qsize;
    const float scale = 1.0f / sqrtf((float)hd), one = 1.0f, zero = 0.0f;
    long long sq = (long long)H * T * hd, skv = (long long)T * hd, satt = (long long)H * T * T;
    split_heads_gpu(qp, q, B, T, H, hd, stream);
    split_heads_gpu(dop, dout, B, T, H, hd, stream);
    for (int r = 0; r < R; r++) {
        long long g = (long long)r * n_rep * T, kv = (long long)r * B * skv;  // group r's first row; kv head r's rows
        cublasCheck(cublasSgemmStridedBatched(blas, CUBLAS_OP_T, CUBLAS_OP_N, T, M, hd, &one, v + kv, hd, skv,
                                              dop + g * hd, hd, sq, &zero, datt + g * T, T, satt, B));
        // dv_r^T (hd, T) += dop_g^T (hd, M) @ att_g (M, T)
        cublasCheck(cublasSgemmStridedBatched(blas, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, M, &one, dop + g * hd, hd, sq,
                                              att + g * T, T, satt, &one, dv + kv, hd, skv, B));
    }
    LAUNCH(causal_softmax_backward_kernel, ceil_div((size_t)B * H * T, 4), 128, 0, stream)(datt, att, B * H * T, T);
    launchCheck();
    for (int r = 0; r < R; r++) {
        long long g = (long long)r * n_rep * T, kv = (long long)r * B * skv;
        cublasCheck(cublasSgemmStridedBatched(blas, CUBLAS_OP_N, CUBLAS_OP_N, hd, M, T, &scale, k + kv, hd, skv,
                                              datt + g * T, T, satt, &zero, dqp + g * hd, hd, sq, B));
        cublasCheck(cublasSgemmStridedBatched(blas, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, M, &scale, qp + g * hd, hd, sq,
                                              datt + g * T, T, satt, &one, dk + kv, hd, skv, B));
    }
    merge_heads_gpu(dq, dqp, B, T, H, hd, stream);
}

#endif
