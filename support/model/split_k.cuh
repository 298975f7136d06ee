// support/model/split_k.cuh — the GPU's weight gradients as a deterministic split-k.
// defines: split_slices, SplitProduct (device.cuh), split_products, split_slot_floats,
//          split_weight_grad_gpu, op_split_sum
//
// A weight gradient dW (OC, C) += dout^T @ inp sums over all N = B*T tokens and
// has few outputs: at the paper's config (d = 32, N = 11,264) Wo's is a 32 x 32
// result of sums 11,264 long, one of cuBLAS's output tiles, so one SM of an
// H100's 132 works and the others wait. Split-k cuts the tokens into S equal
// slices and makes the S partial products in one strided-batched call, each
// written (beta 0) into a slot of its own; one kernel at the end of backward
// then adds every split product's slots, in slice order:
//     dW[i] += slot[0][i] + slot[1][i] + ... + slot[S-1][i]
// S depends on (OC, C, N) alone, so the slices, and the order of their sum, do
// not depend on the GPU, the blocks' order or what ran before; the bits of each
// slice's product are cuBLAS's, which it promises the same only on the same GPU
// architecture, SM count and toolkit (cuBLAS's "Results reproducibility"): there,
// run to run and --jobs N against --jobs 1, the same bits. The CPU does not split.
#pragma once
#include <string>
#include <vector>

#include "support/model/device.cuh"
#include "support/model/products.cuh"

#define SPLIT_TILES 256  // 64 x 64 output tiles a product should give the GPU: about two an SM
#define SPLIT_MOST 16    // slices at most
#define SPLIT_ROWS 256   // tokens a slice sums, at least

// The slices of the product dW (OC, C) += dout^T @ inp over N tokens: doubled
// while the product has fewer tiles than SPLIT_TILES and each slice keeps
// SPLIT_ROWS tokens; 1: not split. exact: the slices must divide N; else the
// most that any N' <= N can take (what its slots are sized for).
HOST_DEVICE inline int split_slices(int OC, int C, size_t N, bool exact = true) {
    size_t tiles = (size_t)((OC + 63) / 64) * (size_t)((C + 63) / 64);
    int S = 1;
    while (S < SPLIT_MOST && tiles * S < SPLIT_TILES && N / (2 * S) >= SPLIT_ROWS && (!exact || N % (2 * S) == 0))
        S *= 2;
    return S;
}

// The backward pass's weight gradients that are products over the tokens, in
// parameter order: the tied embedding's (V, d), then per layer [Wq; Wk; Wv]'s
// ((H + 2R) hd, d) as one product, Wo's (d, H hd), [Wg; Wu]'s (2F, d) as one,
// Wd's (d, F). Those that can split at BT tokens get slots, one after another.
inline std::vector<SplitProduct> split_products(const Config& c, size_t BT) {
    std::vector<SplitProduct> out;
    size_t slots = 0, first = 0;
    auto add = [&](size_t grad, int OC, int C) {
        int S = split_slices(OC, C, BT, false);
        if (S == 1) return;
        out.push_back(SplitProduct{grad, slots, first, OC, C});
        slots += (size_t)S * OC * C;
        first += (size_t)OC * C;
    };
    auto ends = [](const std::string& name, const char* tail) {
        size_t n = strlen(tail);
        return name.size() >= n && name.compare(name.size() - n, n, tail) == 0;
    };
    int qkv = (c.H + 2 * c.R) * c.hd, qd = c.H * c.hd;
    for (const TensorSpec& t : param_specs(c)) {
        if (ends(t.name, "embed_tokens.weight")) add(t.offset, c.V, c.d);
        if (ends(t.name, "q_proj.weight")) add(t.offset, qkv, c.d);  // k_proj, v_proj: the same product
        if (ends(t.name, "o_proj.weight")) add(t.offset, c.d, qd);
        if (ends(t.name, "gate_proj.weight")) add(t.offset, 2 * c.F, c.d);  // and up_proj: [Wg; Wu], one product
        if (ends(t.name, "down_proj.weight")) add(t.offset, c.d, c.F);
    }
    return out;
}
// The slots' floats (in the GPU's small allocation, gpu_carve_small): where the last product's slots end.
inline size_t split_slot_floats(const std::vector<SplitProduct>& products, size_t BT) {
    if (products.empty()) return 0;
    const SplitProduct& p = products.back();
    return p.slots + (size_t)split_slices(p.OC, p.C, BT, false) * p.OC * p.C;
}

#ifdef LIME_GPU
// forward: out = inp @ W^T, inp (N, C), out (N, OC)
// dW (OC, C) += dout^T @ inp in S slices: slice s, tokens s k .. (s+1) k - 1
// (k = N / S), into slot s (OC, C), written. Returns false where the product
// does not split (S = 1, or dW not among split.products): the caller adds it
// to dW in one product (gemm_tn_gpu).
static bool split_weight_grad_gpu(float* dW, const float* dout, const float* inp, int OC, int C, int N,
                                  const SplitK& split, cublasHandle_t blas, bool bf16 = false) {
    const SplitProduct* p = split.find(dW);
    int S = p ? split_slices(OC, C, N) : 1;
    if (S == 1) return false;
    long long k = N / S;  // as gemm_tn_gpu, batched over the slices: column-major dW^T (C, OC) = inp^T @ dout
    gemm_gpu(blas, bf16, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, (int)k, 1.0f, inp, C, k * C, dout, OC, k * OC, 0.0f,
             split.slots + p->slots, C, (long long)OC * C, S);
    return true;
}

// As split_weight_grad_gpu, for rows [r0, r0 + n) of a split product dW (OC, C)
// whose inputs differ by rows (the q, k and v projections of a study model with
// kv_inputs): dout's columns r0.. (leading dimension OC) against inp. The slices
// are the whole product's, so op_split_sum adds them as it adds any product's.
struct RowBlock {
    int OC, r0, n;
};
static bool split_weight_grad_rows_gpu(float* dW, const float* dout, const float* inp, RowBlock rows, int C, int N,
                                       const SplitK& split, cublasHandle_t blas, bool bf16 = false) {
    const SplitProduct* p = split.find(dW);
    int S = p ? split_slices(rows.OC, C, N) : 1;
    if (S == 1) return false;
    long long k = N / S;
    gemm_gpu(blas, bf16, CUBLAS_OP_N, CUBLAS_OP_T, C, rows.n, (int)k, 1.0f, inp, C, k * C, dout + rows.r0, rows.OC,
             k * rows.OC, 0.0f, split.slots + p->slots + (size_t)rows.r0 * C, C, (long long)rows.OC * C, S);
    return true;
}

// One thread per output of every split product: its product found by
// entry_holding (a binary search over `first`), then its S slots added in
// order. A product that did not split at N (S = 1) went into dW already.
__global__ void split_sum_kernel(float* grads, const float* slots, const SplitProduct* table, int n_table,
                                 size_t elements, size_t N) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= elements) return;
    const SplitProduct p = entry_holding(table, n_table, i, &SplitProduct::first);
    size_t e = i - p.first, numel = (size_t)p.OC * p.C;
    int S = split_slices(p.OC, p.C, N);
    if (S == 1) return;
    const float* slot = slots + p.slots + e;
    float s = slot[0];
    for (int k = 1; k < S; k++) s += slot[k * numel];
    grads[p.grad + e] += s;
}
// (No launch where no product splits at N: a step of fewer tokens than the model was made for.)
static void split_sum_gpu(const SplitK& split, size_t N, cudaStream_t stream) {
    bool any = false;
    for (const SplitProduct& p : split.products) any = any || split_slices(p.OC, p.C, N) > 1;
    if (!any) return;
    LAUNCH(split_sum_kernel, ceil_div(split.elements(), 256), 256, 0, stream)
        (split.grads, split.slots, split.table, (int)split.products.size(), split.elements(), N);
    launchCheck();
}
#endif

// The end of backward: the split weight gradients summed into the gradients (the GPU's; the CPU did not split).
static void op_split_sum(Model* model, [[maybe_unused]] int N) {
    DISPATCH(model, split_sum_gpu(model->gpu->split, N, stream_of(model)), (void)0, (void)0);
}
