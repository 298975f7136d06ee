// support/model/attention_gpu.cuh — lime.cu's causal GQA attention on the
// GPU as batched matrix products around a softmax, as in llm.c: the keys'
// scores and the values' mixture are cuBLAS products, the causal softmax and
// its backward one warp per row. The (B, H, T, T) probabilities are kept for
// the backward (the flash-style kernels of support/model/flash_attention.cuh
// keep one number per row instead). Here too: the kernel that scatters the
// q/k/v product into the layouts the attention reads (qkv_scatter_gpu), and the
// projections around it (qkv_projection_forward_gpu, ..._backward_gpu). Read
// lime.cu's attention section first: the math, the plain loops and the dispatchers are there.
#pragma once
#include "support/model/device.cuh"
#include "support/model/products.cuh"
#include "support/model/split_k.cuh"

#ifdef LIME_GPU
// The products want each (kv head, sequence) group's positions contiguous.
// The keys and values are (rows of the KV buffer, (R, B, T, hd)); the queries
// are group-major, (R, B, n_rep, T, hd), as the K/V scatter writes them for
// this path (qkv_scatter_gpu): the n_rep query heads of kv head r, sequence b,
// are one (M, hd) matrix, M = n_rep*T, group g = r*B + b, at g*M*hd, as that
// group's keys are at g*T*hd. So each product is ONE strided-batched call
// over all R*B groups:
//   scores_g (M, T) = q_g @ k_g^T * scale    -> att_g, then the causal softmax in place
//   out_g    (M, hd) = att_g @ v_g
// and out is copied back token-major, (B, T, H, hd), for the out-projection
// (backward: its gradient dout to group-major). att (R, B, n_rep, T, T) keeps
// the probabilities group-major too (the GPU's own layout: the CPU's is
// (B, H, T, T)); a row is (g, j, t), t = row % T. The scores above the
// diagonal (u > t) are computed and then set to 0.
// Where query head h of position (b, t) starts in the group-major (R, B, n_rep, T, hd).
__device__ inline size_t group_major_at(int b, int t, int h, int B, int T, int H, int R, int hd) {
    int n_rep = H / R;
    return ((((size_t)(h / n_rep) * B + b) * n_rep + h % n_rep) * T + t) * hd;
}
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
    int i = idx % hd, h = idx / hd % H, t = idx / hd / H % T, b = idx / hd / H / T;
    dst[idx] = src[group_major_at(b, t, h, B, T, H, R, hd) + i];
}
static void group_heads_gpu(float* dst, const float* src, int B, int T, int H, int R, int hd, cudaStream_t stream) {
    LAUNCH(group_heads_kernel, ceil_div((size_t)B * T * H * hd, 256), 256, 0, stream)(dst, src, B, T, H, R, hd);
    launchCheck();
}
static void ungroup_heads_gpu(float* dst, const float* src, int B, int T, int H, int R, int hd, cudaStream_t stream) {
    LAUNCH(ungroup_heads_kernel, ceil_div((size_t)B * T * H * hd, 256), 256, 0, stream)(dst, src, B, T, H, R, hd);
    launchCheck();
}

// The attention's inputs from the token-major product qkv (N, W), W = (H + 2R) hd
// (lime.cu's qkv_projection_forward_gpu): q rotated by RoPE (group-major when
// q_grouped, for the products below), K and V into the KV buffer (head-major),
// and kr = rope(K) when kr is not nullptr. One thread per q pair (n, h, i < hd/2)
// or K/V element. backward (gather): the inverse, dq rotated back. The threads' index is 64-bit:
// there are N H hd/2 + 2 N R hd of them, up to 2.5 N H hd where R = H, and launch_check bounds
// only N H hd and N L R hd below 2^31 (L1 H=R=16 hd64 B=T=1000 has 2.56e9).
__global__ void qkv_scatter_kernel(float* q, float* K, float* V, float* kr, float* qkv, const float* cos_t,
                                   const float* sin_t, int N, int T, int H, int R, int hd, int q_grouped, int gather) {
    int half = hd / 2, W = (H + 2 * R) * hd;
    size_t qpairs = (size_t)N * H * half, idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= qpairs + 2 * (size_t)N * R * hd) return;
    if (idx < qpairs) {  // q: rotated by position t = n % T (gather: by -t); n H half < 2^31 (launch_check)
        int i = (int)(idx % half), h = (int)(idx / half % H), n = (int)(idx / half / H), t = n % T;
        float c = cos_t[t * half + i], s = (gather ? -1.0f : 1.0f) * sin_t[t * half + i];
        size_t at = q_grouped ? group_major_at(n / T, t, h, N / T, T, H, R, hd) : ((size_t)n * H + h) * hd;
        float* x = gather ? q + at : qkv + (size_t)n * W + h * hd;
        float* y = gather ? qkv + (size_t)n * W + h * hd : q + at;
        float x0 = x[i], x1 = x[i + half];
        y[i] = x0 * c - x1 * s;
        y[i + half] = x1 * c + x0 * s;
        return;
    }
    size_t e = idx - qpairs;  // over (2, N, R, hd): each half < 2^31 (launch_check's key buffer)
    int kv = (int)(e / ((size_t)N * R * hd)), r = (int)(e / hd % R), n = (int)(e / hd / R % N), i = (int)(e % hd);
    float* buf = (kv ? V : K) + ((size_t)r * N + n) * hd + i;
    float* tok = qkv + (size_t)n * W + (H + kv * R + r) * hd + i;
    if (gather) return (void)(*tok = *buf);
    *buf = *tok;
    if (kr && !kv) {  // rope_rotate_kernel's pair (i, i + half), from this element's side
        int p = i % half, t = n % T;
        float c = cos_t[t * half + p], s = sin_t[t * half + p];
        kr[((size_t)r * N + n) * hd + i] = i < half ? tok[0] * c - tok[half] * s : tok[0] * c + tok[-half] * s;
    }
}
static void qkv_scatter_gpu(float* q, float* K, float* V, float* kr, float* qkv, const float* cos_t,
                            const float* sin_t, int N, int T, int H, int R, int hd, bool q_grouped, bool gather,
                            cudaStream_t stream) {
    size_t threads = (size_t)N * H * (hd / 2) + 2 * (size_t)N * R * hd;
    LAUNCH(qkv_scatter_kernel, ceil_div(threads, 256), 256, 0, stream)(q, K, V, kr, qkv, cos_t, sin_t, N, T, H, R, hd,
                                                                       q_grouped, gather);
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

// qg group-major (above), k, v (R, B, T, hd); out (B, T, H, hd). scratch: B*T*H*hd floats (group-major out).
// bf16: the products' operands rounded to bf16 (products.cuh, --precision bf16).
static void attention_forward_gpu(float* out, float* att, const float* qg, const float* k, const float* v, int B,
                                  int T, int H, int R, int hd, float* scratch, cublasHandle_t blas,
                                  cudaStream_t stream, bool bf16 = false) {
    int M = H / R * T, groups = R * B;  // rows of one (kv head, sequence) group
    float* og = scratch;
    const float scale = 1.0f / sqrtf((float)hd), one = 1.0f, zero = 0.0f;
    long long sq = (long long)M * hd, skv = (long long)T * hd, satt = (long long)M * T;  // strides over the groups
    // att_g (M, T) = scale * q_g (M, hd) @ k_g^T: column-major att_g^T (T, M) = k_g (T, hd)^T.. as matmul_forward_gpu's
    gemm_gpu(blas, bf16, CUBLAS_OP_T, CUBLAS_OP_N, T, M, hd, scale, k, hd, skv, qg, hd, sq, zero, att, T, satt, groups);
    LAUNCH(causal_softmax_kernel, ceil_div((size_t)B * H * T, 4), 128, 0, stream)(att, B * H * T, T);
    launchCheck();
    // og_g (M, hd) = att_g (M, T) @ v_g (T, hd): column-major og_g^T (hd, M) = v_g^T (hd, T) @ att_g^T (T, M)
    gemm_gpu(blas, bf16, CUBLAS_OP_N, CUBLAS_OP_N, hd, M, T, one, v, hd, skv, att, T, satt, zero, og, hd, sq, groups);
    ungroup_heads_gpu(out, og, B, T, H, R, hd, stream);
}

// The same products backwards, group g = (kv head r, sequence b):
//   datt_g = dout_g @ v_g^T;   dv_g (+)= att_g^T @ dout_g   (sums over the group's heads and positions)
//   ds = softmax backward (in place over datt)
//   dq_g = scale * ds_g @ k_g;  dk_g = scale * ds_g^T @ q_g
// dqg (group-major) and dk are written; dv too, or added to (add_dv), as op_attention_backward's.
// scratch: B*T*H*hd floats (group-major dout).
static void attention_backward_gpu(float* dqg, float* dk, float* dv, float* datt, const float* dout, const float* qg,
                                   const float* k, const float* v, const float* att, int B, int T, int H, int R, int hd,
                                   bool add_dv, float* scratch, cublasHandle_t blas, cudaStream_t stream,
                                   bool bf16 = false) {
    int M = H / R * T, groups = R * B;
    float* dog = scratch;
    const float scale = 1.0f / sqrtf((float)hd), one = 1.0f, zero = 0.0f, dv_beta = add_dv ? 1.0f : 0.0f;
    long long sq = (long long)M * hd, skv = (long long)T * hd, satt = (long long)M * T;
    group_heads_gpu(dog, dout, B, T, H, R, hd, stream);
    gemm_gpu(blas, bf16, CUBLAS_OP_T, CUBLAS_OP_N, T, M, hd, one, v, hd, skv, dog, hd, sq, zero, datt, T, satt, groups);
    // dv_g^T (hd, T) (+)= dog_g^T (hd, M) @ att_g (M, T)
    gemm_gpu(blas, bf16, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, M, one, dog, hd, sq, att, T, satt, dv_beta, dv, hd, skv, groups);
    LAUNCH(causal_softmax_backward_kernel, ceil_div((size_t)B * H * T, 4), 128, 0, stream)(datt, att, B * H * T, T);
    launchCheck();
    gemm_gpu(blas, bf16, CUBLAS_OP_N, CUBLAS_OP_N, hd, M, T, scale, k, hd, skv, datt, T, satt, zero, dqg, hd, sq, groups);
    gemm_gpu(blas, bf16, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, M, scale, qg, hd, sq, datt, T, satt, zero, dk, hd, skv, groups);
}


// lime.cu's qkv_projection_forward and ..._backward on the GPU (their math is
// there): one product into the token-major scratch qkv, then the scatter (backward:
// the gather, then the products for da and dW).
// qkv: scratch, token-major (N, (H + 2R) hd); q_grouped: q (and dq) group-major, for the matrix-product attention.
// Three inputs: each product writes its block of qkv's columns (leading dimension (H + 2R) hd).
static void qkv_projection_forward_gpu(Qkv out, QkvInputs in, const float* W, Rope rope, Heads s, bool q_grouped,
                                       float* qkv, const GpuCtx& g) {
    int N = s.N(), C = s.C, OC = (s.H + 2 * s.R) * s.hd, qd = s.H * s.hd, kvd = s.R * s.hd;
    if (in.one()) {
        gemm_nt_gpu(qkv, in.q, W, N, OC, C, false, g.blas, g.bf16);
    } else {  // as gemm_nt_gpu, on a block of columns: column-major qkv^T rows [o, o + n) = W_b @ a_b^T
        const float* a[3] = {in.q, in.k, in.v};
        int o[3] = {0, qd, qd + kvd}, n[3] = {qd, kvd, kvd};
        for (int b = 0; b < 3; b++)
            gemm_gpu(g.blas, g.bf16, CUBLAS_OP_T, CUBLAS_OP_N, n[b], N, C, 1.0f, W + (size_t)o[b] * C, C, 0, a[b], C,
                     0, 0.0f, qkv + o[b], OC, 0, 1);
    }
    qkv_scatter_gpu(out.q, out.K, out.V, out.kr, qkv, rope.cos, rope.sin, s.N(), s.T, s.H, s.R, s.hd, q_grouped, false,
                    g.stream);
}
static void qkv_projection_backward_gpu(QkvInputGrads da, float* dW, Qkv d, QkvInputs in, const float* W, Rope rope,
                                        Heads s, bool q_grouped, float* qkv, const GpuCtx& g) {
    int N = s.N(), C = s.C, OC = (s.H + 2 * s.R) * s.hd, qd = s.H * s.hd, kvd = s.R * s.hd;
    qkv_scatter_gpu(d.q, d.K, d.V, nullptr, qkv, rope.cos, rope.sin, N, s.T, s.H, s.R, s.hd, q_grouped, true, g.stream);
    if (in.one()) {
        gemm_nn_gpu(da.q, qkv, W, N, C, OC, false, g.blas, g.bf16);
        if (!split_weight_grad_gpu(dW, qkv, in.q, OC, C, N, *g.split, g.blas, g.bf16))
            gemm_tn_gpu(dW, qkv, in.q, OC, C, N, g.blas, g.bf16);
        return;
    }
    const float* a[3] = {in.q, in.k, in.v};
    float* dab[3] = {da.q, da.k, da.v};
    int o[3] = {0, qd, qd + kvd}, n[3] = {qd, kvd, kvd};
    for (int b = 0; b < 3; b++) {  // as gemm_nn_gpu and gemm_tn_gpu on block b's columns of dqkv (leading dimension OC)
        bool add = (b >= 1 && dab[b] == dab[0]) || (b == 2 && dab[2] == dab[1]);
        gemm_gpu(g.blas, g.bf16, CUBLAS_OP_N, CUBLAS_OP_N, C, N, n[b], 1.0f, W + (size_t)o[b] * C, C, 0, qkv + o[b], OC,
                 0, add ? 1.0f : 0.0f, dab[b], C, 0, 1);
        if (!split_weight_grad_rows_gpu(dW, qkv, a[b], {OC, o[b], n[b]}, C, N, *g.split, g.blas, g.bf16))
            gemm_gpu(g.blas, g.bf16, CUBLAS_OP_N, CUBLAS_OP_T, C, n[b], N, 1.0f, a[b], C, 0, qkv + o[b], OC, 0, 1.0f,
                     dW + (size_t)o[b] * C, C, 0, 1);
    }
}
#endif
