// support/model/products.cuh — the two precisions of the products (--precision).
// defines: bf16_round, bf16_if, bf16_products, DISPATCH_PRODUCT, gemm_gpu, and lime.cu's
//          named products on the GPU: gemm_nn_gpu, gemm_nt_gpu, gemm_tn_gpu
//
// float32 (the default): a product's operands are floats; on the GPU cuBLAS's
// math mode rounds them to TF32 (--tf32 1) or not.
// bf16: the linear layers' products (the tied embedding and LM head,
// [Wq; Wk; Wv], Wo, [Wg; Wu], Wd; the forward's and both of the backward's)
// and attention's (Q K^T, P V and their backward's, on cuBLAS or in the
// tensor-core flash kernels) take their two operands rounded to bf16 (float's
// 8 exponent bits, 7 of its 23 mantissa bits, to nearest even) and sum in
// float32: cuBLAS's CUBLAS_COMPUTE_32F_FAST_16BF, or mma.sync's .bf16, on bf16
// tensor cores (twice TF32's rate). The arrays stay float32 and are rounded as
// they are read, so nothing else changes: the router, RMSNorm, the softmax,
// the residual stream, the gradients, AdamW and the checkpoints are float32's.
// The CPU does not train in bf16; its plain loops round the same way
// (bf16_if), the reference the GPU's bf16 steps are checked against
// (tests/test_gpu.cpp). (The scalar flash kernels, where the tensor-core ones
// refuse a shape, keep float32.)
#pragma once
#include <cstdint>
#include <cstring>

#include "support/model/device.cuh"

// x rounded to the nearest bf16, ties to even, as a float (a NaN stays a NaN):
// what CUDA's __float2bfloat16 gives (tests/test_gpu.cpp checks all 2^32 floats).
static inline float bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return x;
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}
static inline float bf16_if(float x, bool bf16) { return bf16 ? bf16_round(x) : x; }

// Do this model's products (dense and attention's) take bf16 operands (ModelSettings::precision)?
static inline bool bf16_products(const Model* model) { return model->settings.precision == PRECISION_BF16; }

// DISPATCH for an op of products: on the CPU in bf16, the plain loop (the
// reference; the fast versions have no bf16).
#define DISPATCH_PRODUCT(model, gpu_call, fast_call, plain_call) \
    DISPATCH_ON(model, gpu_call, (bf16_products(model) ? (plain_call) : (fast_call)), plain_call)

#ifdef LIME_GPU
// C = alpha op(A) op(B) + beta C, batch times (strides sA, sB, sC), cuBLAS's
// column-major argument order, float arrays. bf16: the operands rounded to bf16
// (CUBLAS_COMPUTE_32F_FAST_16BF); else cublasSgemm's float32, or TF32 where
// the handle's math mode says so.
static void gemm_gpu(cublasHandle_t blas, bool bf16, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                     float alpha, const float* A, int lda, long long sA, const float* B, int ldb, long long sB,
                     float beta, float* C, int ldc, long long sC, int batch) {
    if (bf16)
        cublasCheck(cublasGemmStridedBatchedEx(blas, ta, tb, m, n, k, &alpha, A, CUDA_R_32F, lda, sA, B, CUDA_R_32F,
                                               ldb, sB, &beta, C, CUDA_R_32F, ldc, sC, batch,
                                               CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT));
    else if (batch == 1)
        cublasCheck(cublasSgemm(blas, ta, tb, m, n, k, &alpha, A, lda, B, ldb, &beta, C, ldc));
    else
        cublasCheck(cublasSgemmStridedBatched(blas, ta, tb, m, n, k, &alpha, A, lda, sA, B, ldb, sB, &beta, C, ldc,
                                              sC, batch));
}

// lime.cu's gemm_nn, gemm_nt and gemm_tn (row-major, its shapes) on cuBLAS,
// which is column-major: a row-major (M, N) matrix is a column-major (N, M)
// one, so C = A @ B is, column-major, C^T = B^T @ A^T: the operands swap places.
static void gemm_nn_gpu(float* C, const float* A, const float* B, int M, int N, int K, bool accumulate,
                        cublasHandle_t blas, bool bf16 = false) {
    gemm_gpu(blas, bf16, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, 1.0f, B, N, 0, A, K, 0, accumulate, C, N, 0, 1);
}
static void gemm_nt_gpu(float* C, const float* A, const float* B, int M, int N, int K, bool accumulate,
                        cublasHandle_t blas, bool bf16 = false) {
    gemm_gpu(blas, bf16, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, 1.0f, B, K, 0, A, K, 0, accumulate, C, N, 0, 1);
}
static void gemm_tn_gpu(float* C, const float* A, const float* B, int M, int N, int K, cublasHandle_t blas,
                        bool bf16 = false) {
    gemm_gpu(blas, bf16, CUBLAS_OP_N, CUBLAS_OP_T, N, M, K, 1.0f, B, N, 0, A, M, 0, 1.0f, C, N, 0, 1);
}
#endif
