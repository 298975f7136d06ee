// support/study/entropy_reg.cuh — the value-entropy regulariser
// (--entropy-reg lambda), the referee's causal test: a loss term any model can
// add, not part of LIMe. A reviewer asked whether LIMe's higher value entropy
// causes its gains; this raises LLaMa's (or any model's) value entropy
// directly, everything else fixed (docs/model.md).
//
// Per layer l and sequence b, over the n_b valid positions t of b (valid = 1:
// a token of the sequence, not padding), D = R*hd:
//   mu[l, b]  = mean_t V[l][b, t]                          (D)    V: the value projection, before any router
//   Z         = V[l][b, t] - mu[l, b] at the valid t        (n_b, D)
//   G         = Z^T Z                                       (D, D)
//   S2[l, b]  = -log(||G||_F^2 / tr(G)^2)   (0, without gradient, when n_b < 2 or tr(G) = 0)
//   loss_total = loss - entropy_reg * sum_{l, b} S2[l, b] / (L * B)
// S2 is the order-2 Renyi entropy of G's normalised spectrum: no
// eigendecomposition. Its gradient into the values (backward):
//   dS2/dZ = 4 Z / tr(G) - 4 Z G / ||G||_F^2, 0 at the padding; the centering's
//   backward subtracts its mean over the valid t, which is 0 (Z's rows sum to 0).
// The cost is n_b D^2 multiply-adds for G and again for Z G. The n_b x n_b
// Gram K = Z Z^T has the same trace and Frobenius norm (tr K = sum_t |Z[t]|^2
// = tr G; ||K||_F^2 = tr(Z Z^T Z Z^T) = tr(Z^T Z Z^T Z) = ||G||_F^2) and
// K Z = Z G, at n_b^2 D each: the fast CPU path (ereg_forward_fast, support/
// cpu_fast.cpp) takes K where n_b < D, G otherwise, as blocked products.
//
// The file, in lime.cu's shape: the activations (EregActs, ereg_acts_carve),
// the ops (plain loops, kernels, dispatchers op_ereg_*), and the hooks the
// passes call (ereg_layer_forward, ereg_layer_backward, op_ereg_loss). The
// fast CPU versions (ereg_*_fast) are support/model/cpu_fast.cpp's.
#pragma once
#include <cmath>
#include <cstring>

#include "support/model/cpu_fast.h"
#include "support/model/device.cuh"
#include "support/model/lime.h"
#include "support/model/study.h"

// --- the activations ---------------------------------------------------------
// The regulariser's share of the model's activation allocation (lime.cu's
// Acts holds it), sized 0 when entropy_reg is 0; D = R*hd.
struct EregActs {
    float* V;     // (L, B, T, D)   the values token-major, as the regulariser reads them
    float* mu;    // (L, B, D)      each sequence's mean value over its valid positions
    float* G;     // (L, B, D, D)   the Gram matrix of the centred values, G = Z^T Z (the fast CPU path:
                  //                K = Z Z^T (n_b, n_b) instead where n_b < D, support/model/cpu_fast.cpp)
    float* stat;  // (L, B, 4)      S2, 4 / tr(G), 4 / ||G||_F^2 (0, 0, 0 for a sequence without an S2), unused
};
// take(&p, floats) gives p its floats of the allocation (lime.cu's acts_carve).
template <class Take>
static void ereg_acts_carve(EregActs* e, const Config& c, int B, Take take) {
    size_t on = c.entropy_reg > 0 ? 1 : 0, L = c.L, BT = (size_t)B * c.T, D = (size_t)c.R * c.hd;
    take(&e->V, on * L * BT * D);
    take(&e->mu, on * L * B * D);
    take(&e->G, on * L * B * D * D);
    take(&e->stat, on * L * B * 4);
}
// The CPU's scratch for the fast loops (one op at a time; the plain ones need none).
static size_t ereg_cpu_scratch_floats(const Config& c, int B) {
    return c.entropy_reg > 0 && FAST_CPU ? ereg_fast_scratch_floats(B, c.T, c.R * c.hd) : 0;
}

// --- the ops -----------------------------------------------------------------

// One layer, every sequence: stat (B, 4) = {S2, 4 / tr(G), 4 / ||G||_F^2, 0}
// (all 0 for a sequence without an S2), mu (B, D), G (B, D, D), from V (B, T, D) and valid (B, T).
static void ereg_forward(float* stat, float* mu, float* G, const float* V, const float* valid, int B, int T, int D) {
#pragma omp parallel for schedule(static)
    for (int b = 0; b < B; b++) {
        const float* Vb = V + (size_t)b * T * D;  // (T, D)
        const float* vb = valid + (size_t)b * T;  // (T)
        float* m = mu + (size_t)b * D;            // (D)
        float* g = G + (size_t)b * D * D;         // (D, D)
        int n = 0;
        for (int t = 0; t < T; t++) n += vb[t] != 0;
        // mu = mean over the valid t of V[t]
        for (int j = 0; j < D; j++) {
            double s = 0;
            for (int t = 0; t < T; t++) if (vb[t] != 0) s += Vb[(size_t)t * D + j];
            m[j] = n ? (float)(s / n) : 0.0f;
        }
        // G = Z^T Z = sum over the valid t of (V[t] - mu)(V[t] - mu)^T
        for (int i = 0; i < D * D; i++) g[i] = 0;
        for (int t = 0; t < T; t++) {
            if (vb[t] == 0) continue;
            const float* v = Vb + (size_t)t * D;
            for (int i = 0; i < D; i++) {
                float zi = v[i] - m[i];
                for (int j = 0; j < D; j++) g[(size_t)i * D + j] += zi * (v[j] - m[j]);
            }
        }
        // S2 = -log(||G||_F^2 / tr(G)^2)
        double tr = 0, f2 = 0;
        for (int i = 0; i < D; i++) tr += g[(size_t)i * D + i];
        for (size_t i = 0; i < (size_t)D * D; i++) f2 += (double)g[i] * g[i];
        float* st = stat + 4 * b;
        bool has_s2 = n >= 2 && tr > 0 && f2 > 0;
        st[0] = has_s2 ? (float)-std::log(f2 / (tr * tr)) : 0.0f;
        st[1] = has_s2 ? (float)(4.0 / tr) : 0.0f;
        st[2] = has_s2 ? (float)(4.0 / f2) : 0.0f;
        st[3] = 0.0f;
    }
}

// forward: S2 = -log(||G||_F^2 / tr(G)^2), G = Z^T Z, Z[t] = V[t] - mu at the valid t
// dV[t] += scale * dS2/dZ[t] = scale * (4 Z[t] / tr(G) - 4 (Z G)[t] / ||G||_F^2)   (valid t only)
// scale = -entropy_reg / (L * B); a sequence without an S2 has stat 0: no gradient.
static void ereg_backward(float* dV, const float* V, const float* valid, const float* mu, const float* G,
                          const float* stat, float scale, int B, int T, int D) {
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        int b = bt / T;
        const float* st = stat + 4 * b;
        if (valid[bt] == 0 || st[1] == 0) continue;
        const float* v = V + (size_t)bt * D;       // (D)
        const float* m = mu + (size_t)b * D;       // (D)
        const float* g = G + (size_t)b * D * D;    // (D, D)
        float* dv = dV + (size_t)bt * D;           // (D)
        for (int j = 0; j < D; j++) {
            float zg = 0;  // (Z G)[t, j] = sum_i Z[t, i] G[i, j]
            for (int i = 0; i < D; i++) zg += (v[i] - m[i]) * g[(size_t)i * D + j];
            dv[j] += scale * (st[1] * (v[j] - m[j]) - st[2] * zg);
        }
    }
}

// The regularised loss from the cross-entropy and stat (n = L*B entries of 4),
// summed in order: returns the mean S2; *loss = ce - entropy_reg * mean S2.
static float ereg_loss(float* loss, float ce, const float* stat, int n, float entropy_reg) {
    double s = 0;
    for (int k = 0; k < n; k++) s += stat[4 * k];
    float s2 = (float)(s / n);
    *loss = ce - entropy_reg * s2;
    return s2;
}

#ifdef LIME_GPU
// One thread per (b, j): mu (B, D), the mean over b's valid positions (in
// order, in double), then Z (B, T, D) = V - mu there, 0 at the padding.
__global__ void ereg_center_kernel(float* Z, float* mu, const float* V, const float* valid, int B, int T, int D) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= B * D) return;
    int b = idx / D, j = idx % D;
    const float* vb = valid + (size_t)b * T;
    int n = 0;
    double s = 0;
    for (int t = 0; t < T; t++)
        if (vb[t] != 0) { n++; s += V[((size_t)b * T + t) * D + j]; }
    float m = n ? (float)(s / n) : 0.0f;
    mu[idx] = m;
    for (int t = 0; t < T; t++) {
        size_t at = ((size_t)b * T + t) * D + j;
        Z[at] = vb[t] != 0 ? V[at] - m : 0.0f;
    }
}
// One block per sequence: tr(G) and ||G||_F^2 as fixed trees in double, the
// count of valid positions, then stat (B, 4) as the CPU's.
__global__ void ereg_stat_kernel(float* stat, const float* G, const float* valid, int T, int D) {
    __shared__ double part[256];
    int b = blockIdx.x;
    const float* g = G + (size_t)b * D * D;
    double tr = 0, f2 = 0, n = 0;
    for (int i = threadIdx.x; i < D; i += blockDim.x) tr += g[(size_t)i * D + i];
    for (size_t i = threadIdx.x; i < (size_t)D * D; i += blockDim.x) f2 += (double)g[i] * g[i];
    for (int t = threadIdx.x; t < T; t += blockDim.x) n += valid[(size_t)b * T + t] != 0;
    tr = block_sum(tr, part);
    f2 = block_sum(f2, part);
    n = block_sum(n, part);
    if (threadIdx.x == 0) {
        bool has_s2 = n >= 2 && tr > 0 && f2 > 0;
        float* st = stat + 4 * b;
        st[0] = has_s2 ? (float)-log(f2 / (tr * tr)) : 0.0f;
        st[1] = has_s2 ? (float)(4.0 / tr) : 0.0f;
        st[2] = has_s2 ? (float)(4.0 / f2) : 0.0f;
        st[3] = 0.0f;
    }
}
// Z (B, T, D) and ZG (B, T, D): scratch; G = Z^T Z per sequence, one batched product.
static void ereg_forward_gpu(float* stat, float* mu, float* G, const float* V, const float* valid, float* Z, int B,
                             int T, int D, cublasHandle_t blas, cudaStream_t stream) {
    LAUNCH(ereg_center_kernel, ceil_div((size_t)B * D, 128), 128, 0, stream)(Z, mu, V, valid, B, T, D);
    launchCheck();
    const float one = 1.0f, zero = 0.0f;  // column-major: Z^T is (D, T), G = Z^T (Z^T)^T
    cublasCheck(cublasSgemmStridedBatched(blas, CUBLAS_OP_N, CUBLAS_OP_T, D, D, T, &one, Z, D, (long long)T * D, Z, D,
                                          (long long)T * D, &zero, G, D, (long long)D * D, B));
    LAUNCH(ereg_stat_kernel, B, 256, 0, stream)(stat, G, valid, T, D);
    launchCheck();
}
// One thread per value: dV += scale * (4 Z / tr(G) - 4 (Z G) / ||G||_F^2) at the valid positions.
__global__ void ereg_backward_kernel(float* dV, const float* Z, const float* ZG, const float* valid, const float* stat,
                                     float scale, int B, int T, int D) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * D) return;
    size_t bt = idx / D;
    const float* st = stat + 4 * (bt / T);
    if (valid[bt] == 0 || st[1] == 0) return;
    dV[idx] += scale * (st[1] * Z[idx] - st[2] * ZG[idx]);
}
static void ereg_backward_gpu(float* dV, const float* V, const float* valid, float* mu, const float* G,
                              const float* stat, float scale, float* Z, float* ZG, int B, int T, int D,
                              cublasHandle_t blas, cudaStream_t stream) {
    LAUNCH(ereg_center_kernel, ceil_div((size_t)B * D, 128), 128, 0, stream)(Z, mu, V, valid, B, T, D);  // Z again
    launchCheck();
    const float one = 1.0f, zero = 0.0f;  // column-major: (Z G)^T = G (Z^T), G symmetric
    cublasCheck(cublasSgemmStridedBatched(blas, CUBLAS_OP_N, CUBLAS_OP_N, D, T, D, &one, G, D, (long long)D * D, Z, D,
                                          (long long)T * D, &zero, ZG, D, (long long)T * D, B));
    LAUNCH(ereg_backward_kernel, ceil_div((size_t)B * T * D, 256), 256, 0, stream)
        (dV, Z, ZG, valid, stat, scale, B, T, D);
    launchCheck();
}
// The mean S2 over stat's n entries (a fixed tree, double) into metrics->s2,
// and metrics->loss = metrics->ce - entropy_reg * s2, in one block.
__global__ void ereg_loss_kernel(Metrics* metrics, const float* stat, int n, float entropy_reg) {
    __shared__ double part[256];
    double s = 0;
    for (int k = threadIdx.x; k < n; k += blockDim.x) s += stat[4 * k];
    s = block_sum(s, part);
    if (threadIdx.x == 0) {
        float s2 = (float)(s / n);
        metrics->s2 = s2;
        metrics->loss = metrics->ce - entropy_reg * s2;
    }
}
static void ereg_loss_gpu(Metrics* metrics, const float* stat, int n, float entropy_reg, cudaStream_t stream) {
    LAUNCH(ereg_loss_kernel, 1, 256, 0, stream)(metrics, stat, n, entropy_reg);
    launchCheck();
}
#endif

// The dispatchers: the kernels on the GPU, the fast loops (support/model/cpu_fast.cpp)
// in ./lime, the plain ones above in ./lime-ref. scratch: the model's (Acts):
// on the GPU Z and Z G, (B, T, D) each.
static void op_ereg_forward(Model* model, float* stat, float* mu, float* G, const float* V, const float* valid, int B,
                            int T, float* scratch) {
    int D = model->c.R * model->c.hd;
    DISPATCH(model, ereg_forward_gpu(stat, mu, G, V, valid, scratch, B, T, D, blas_of(model), stream_of(model)),
             ereg_forward_fast(stat, mu, G, V, valid, B, T, D, scratch), ereg_forward(stat, mu, G, V, valid, B, T, D));
}
static void op_ereg_backward(Model* model, float* dV, const float* V, const float* valid, float* mu, const float* G,
                             const float* stat, int B, int T, float* scratch) {
    int D = model->c.R * model->c.hd;
    float scale = -model->c.entropy_reg / ((float)model->c.L * B);
    [[maybe_unused]] float* ZG = scratch + (size_t)B * T * D;  // GPU: after Z
    DISPATCH(model,
             ereg_backward_gpu(dV, V, valid, mu, G, stat, scale, scratch, ZG, B, T, D, blas_of(model),
                               stream_of(model)),
             ereg_backward_fast(dV, V, valid, mu, G, stat, scale, B, T, D, scratch),
             ereg_backward(dV, V, valid, mu, G, stat, scale, B, T, D));
}
// On the CPU, *loss (the cross-entropy) becomes the regularised loss: *ce keeps the cross-entropy, *s2 the mean S2.
static void ereg_loss_cpu(float* loss, float* ce, float* s2, const float* stat, int n, float entropy_reg) {
    *ce = *loss;
    *s2 = ereg_loss(loss, *ce, stat, n, entropy_reg);
}
// After the cross-entropy: the regularised loss and the mean S2 over stat's n = L*B sequences
// (model->last_loss, last_s2 on the CPU; Metrics on the GPU).
static void op_ereg_loss(Model* model, const float* stat, int n) {
    float lambda = model->c.entropy_reg;
    DISPATCH(model, ereg_loss_gpu(model->gpu->metrics, stat, n, lambda, stream_of(model)),
             ereg_loss_cpu(&model->last_loss, &model->last_ce, &model->last_s2, stat, n, lambda));
}

// --- the hooks: the passes call these for layer l ------------------------------
// Forward: S2 per sequence from layer l's raw values V (R, N, hd), read token-major.
static void ereg_layer_forward(Model* model, const EregActs& e, int l, const float* V, const float* valid, int B, int T,
                               float* scratch) {
    size_t N = (size_t)B * T, D = (size_t)model->c.R * model->c.hd;
    float* Vt = e.V + l * N * D;  // (B, T, D), kept for the backward
    op_kv_transpose(model, Vt, V, (int)N, true, false);
    op_ereg_forward(model, e.stat + l * B * 4, e.mu + l * B * D, e.G + l * B * D * D, Vt, valid, B, T, scratch);
}
// Backward: dV (R, N, hd) += the gradient of -entropy_reg * mean S2 (through
// dVt (N, D), zeroed here: the token-major gradient before it joins dV).
static void ereg_layer_backward(Model* model, const EregActs& e, int l, float* dV, float* dVt, const float* valid,
                                int B, int T, float* scratch) {
    size_t N = (size_t)B * T, D = (size_t)model->c.R * model->c.hd;
    op_zero(model, dVt, N * D);
    op_ereg_backward(model, dVt, e.V + l * N * D, valid, e.mu + l * B * D, e.G + l * B * D * D, e.stat + l * B * 4, B,
                     T, scratch);
    op_kv_transpose(model, dV, dVt, (int)N, false, true);
}

// --- the study-model interface (support/model/study.h): a loss term ----------
static EregActs ereg_acts(const StudyAt& at) { return study_acts<EregActs>(at, ereg_acts_carve<StudyTake>); }
static StudyHooks ereg_hooks() {
    StudyHooks h = {};
    h.specs = [](const Config&, int, const std::string&, const AddTensor&) {};  // no tensors
    h.carve = [](const Config&, int, Params*, const NextTensor&) {};
    h.init = [](Model*) {};
    h.acts_floats = [](const Config& c, int B) {
        return study_acts_floats<EregActs>(c, B, ereg_acts_carve<StudyTake>);
    };
    h.scratch_floats = [](const Config& c, int B, Device dev) {
        return dev == DEVICE_GPU ? 0 : ereg_cpu_scratch_floats(c, B);
    };
    h.loss_layer = [](const StudyAt& at, const float* V) {  // S2 of layer l's raw values
        ereg_layer_forward(at.model, ereg_acts(at), at.l(), V, at.lime.valid, at.B, at.T,
                           at.scratch);
    };
    h.loss_layer_backward = [](const StudyAt& at, float* dV) {  // through the token-major dvr
        ereg_layer_backward(at.model, ereg_acts(at), at.l(), dV, at.lime.dvr, at.lime.valid, at.B, at.T, at.scratch);
    };
    h.loss = [](const StudyAt& at) {  // loss = ce - lambda mean S2
        op_ereg_loss(at.model, ereg_acts(at).stat, at.model->c.L * at.B);
    };
    return h;
}
const StudyHooks EREG_HOOKS = ereg_hooks();
