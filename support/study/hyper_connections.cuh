// support/study/hyper_connections.cuh — Hyper-Connections (--arch hc; Zhu et
// al., arXiv 2409.19606), the LIMe paper's other baseline: a study model, not
// LIMe. The residual stream becomes n streams X (n, N, d), and each sublayer
// (attention, then the MLP) reads and writes them through small learned
// mixing weights, at each position t < N:
//   weights  A[t] = static_alpha + alpha_scale * tanh(Xn[t] @ alpha_fn)    (n, n+1)
//            b[t] = static_beta  + beta_scale  * tanh(Xn[t] @ beta_fn)     (n)
//            Xn[i][t] = X[i][t] * rstd,  rstd = 1 / sqrt(mean_j X[i][t,j]^2 + eps)  (RMSNorm, no gain)
//            (static HC, hc_dynamic false: A[t] = static_alpha, b[t] = static_beta)
//   width    M[k][t]  = sum_i A[t,i,k] * X[i][t]        k = 0..n      M (n+1, N, d)
//   sublayer y = sub(rmsnorm(M[0], g))                   y (N, d)
//   depth    X'[i][t] = b[t,i] * y[t] + M[1+i][t]        X' (n, N, d)
// The embedding fills every stream (hc_expand) and the final norm reads their
// sum (hc_sum). X is stream-major, so stream i and mixture k are (N, d) arrays
// like LLaMa's x; A (N, n, n+1) and b (N, n) hold one small matrix per position.
// With n = 1 and the initial weights (A = [1 | 1], b = 1) this is LLaMa exactly.
// HcParams w (support/model/lime.h): static_beta (n), static_alpha (n, n+1),
// alpha_fn (d, n+1), alpha_scale (1), beta_fn (d), beta_scale (1); the last
// four nullptr when static.
//
// The file, in lime.cu's shape: the tensors (hc_specs, hc_carve, hc_init),
// the activations (HcActs, hc_acts_carve), the ops (plain loops, kernels,
// dispatchers op_hc_*), and the hooks lime.cu's residual stream calls
// (hc_sublayer_input, hc_residual_forward and their backwards). The fast CPU
// versions (hc_*_fast) are support/model/cpu_fast.cpp's.
#pragma once
#include <cstring>
#include <string>
#include <vector>

#include "support/model/cpu_fast.h"
#include "support/model/device.cuh"
#include "support/model/lime.h"
#include "support/model/study.h"

// --- the tensors (the authors' names) ------------------------------------------
// Layer l's HC tensors, after its LLaMa tensors: per sublayer hc_attn, hc_mlp,
// static_beta and static_alpha (AdamW with the embedding and the gains), and
// with hc_dynamic the four dynamic tensors (AdamW with the matrices).
template <class Add>
static void hc_specs(const Config& c, const std::string& layer, Add add) {
    if (c.arch != ARCH_HC) return;
    int n = c.hc_rate;
    for (const char* sub : {"hc_attn.", "hc_mlp."}) {
        std::string p = layer + sub;
        add(p + "static_beta", {n}, GROUP_EMBED_GAIN);
        add(p + "static_alpha", {n, n + 1}, GROUP_EMBED_GAIN);
        if (!c.hc_dynamic) continue;
        add(p + "dynamic_alpha_fn", {c.d, n + 1}, GROUP_MATRIX);
        add(p + "dynamic_alpha_scale", {1}, GROUP_MATRIX);
        add(p + "dynamic_beta_fn", {c.d}, GROUP_MATRIX);
        add(p + "dynamic_beta_scale", {1}, GROUP_MATRIX);
    }
}
// Their named pointers, in hc_specs' order: next() gives the next tensor's start.
template <class Next>
static void hc_carve(const Config& c, Params* p, Next next) {
    for (int s = 0; s < (c.arch == ARCH_HC ? 2 : 0); s++) {  // hc_attn, hc_mlp
        HcParams h = {};
        h.static_beta = next();
        h.static_alpha = next();
        if (c.hc_dynamic) h.alpha_fn = next(), h.alpha_scale = next(), h.beta_fn = next(), h.beta_scale = next();
        p->hc.push_back(h);
    }
}
// The authors' initialisation: static_beta = 1; static_alpha's column 0 =
// e_{l mod n} (sublayers of layer l read stream l mod n), columns 1..n = I
// (every stream passes through); the dynamic correction starts at 0
// (alpha_fn, beta_fn = 0) with scales 0.01.
static void hc_init(const Params& p, const Config& c) {
    for (size_t s = 0; s < p.hc.size(); s++) {
        const HcParams& h = p.hc[s];
        int n = c.hc_rate, K = n + 1, l = (int)s / 2;
        for (int i = 0; i < n; i++) {
            h.static_beta[i] = 1.0f;
            for (int k = 0; k < K; k++) h.static_alpha[i * K + k] = (k == 0 ? i == l % n : k == 1 + i) ? 1.0f : 0.0f;
        }
        if (!h.alpha_fn) continue;
        memset(h.alpha_fn, 0, (size_t)c.d * K * sizeof(float));
        memset(h.beta_fn, 0, (size_t)c.d * sizeof(float));
        h.alpha_scale[0] = h.beta_scale[0] = 0.01f;
    }
}

// --- the activations ---------------------------------------------------------
// HC's share of the model's one activation allocation (lime.cu's Acts holds
// it), per sublayer s = 2l (attention), 2l+1 (MLP); sized 0 for other models.
// The residual stream itself is lime.cu's x, xa, dx, n times wider (hc_streams).
struct HcActs {
    float* M;       // (2L, n+1, B, T, d) the width connection's mixtures; the sublayer reads mixture 0
    float* y;       // (2L, B, T, d)      the sublayer's output, before the depth connection
    float* alpha;   // (2L, B, T, n, n+1) the mixing weights A of each position
    float* beta;    // (2L, B, T, n)      ... and b
    float* rstd;    // (2L, B, T, n)      dynamic: 1 / rms of each stream
    float* ta;      // (2L, B, T, n, n+1) dynamic: tanh(Xn @ dynamic_alpha_fn)
    float* tb;      // (2L, B, T, n)      dynamic: tanh(Xn @ dynamic_beta_fn)
    float* x;       // (B, T, d) the embedding before it fills every stream; then the streams' sum (final norm's input)
    float* dM;      // (n+1, B, T, d) backward scratch: gradient of the mixtures
    float* dy;      // (B, T, d)      gradient of the sublayer's output (and of x)
    float* dalpha;  // (B, T, n, n+1) gradient of the mixing weights
    float* dbeta;   // (B, T, n)
};
// take(&p, floats) gives p its floats of the allocation (lime.cu's acts_carve).
template <class Take>
static void hc_acts_carve(HcActs* h, const Config& c, int B, Take take) {
    size_t BT = (size_t)B * c.T, L = c.L, d = c.d, n = c.hc_rate, hc = c.arch == ARCH_HC ? 1 : 0, dyn = hc && c.hc_dynamic ? 1 : 0;
    take(&h->M, hc * 2 * L * (n + 1) * BT * d);
    take(&h->y, hc * 2 * L * BT * d);
    take(&h->alpha, hc * 2 * L * BT * n * (n + 1));
    take(&h->beta, hc * 2 * L * BT * n);
    take(&h->rstd, dyn * 2 * L * BT * n);
    take(&h->ta, dyn * 2 * L * BT * n * (n + 1));
    take(&h->tb, dyn * 2 * L * BT * n);
    take(&h->x, hc * BT * d);
    take(&h->dM, hc * (n + 1) * BT * d);
    take(&h->dy, hc * BT * d);
    take(&h->dalpha, hc * BT * n * (n + 1));
    take(&h->dbeta, hc * BT * n);
}
// Sublayer s's activations, for a (B, T) batch (strides are the batch's, not the allocation's).
struct HcSublayer {
    float *M, *y, *alpha, *beta, *rstd, *ta, *tb;
};
static HcSublayer hc_sublayer(const HcActs& h, const Config& c, int s, int B, int T) {
    size_t BT = (size_t)B * T, d = c.d, n = c.hc_rate, dyn = c.hc_dynamic ? 1 : 0;
    return HcSublayer{h.M + s * (n + 1) * BT * d,    h.y + s * BT * d,              h.alpha + s * BT * n * (n + 1),
                      h.beta + s * BT * n,           h.rstd + dyn * s * BT * n,     h.ta + dyn * s * BT * n * (n + 1),
                      h.tb + dyn * s * BT * n};
}

// One sublayer's HC weights: static_alpha (n, n+1), static_beta (n), alpha_fn
// (d, n+1), alpha_scale, beta_fn (d), beta_scale.
static size_t hc_weight_floats(size_t n, size_t d) { return n * (n + 1) + n + d * (n + 1) + d + 2; }
// The CPU's scratch for HC's ops (one op at a time): the plain weight
// gradient's slices and rows, or the fast one's (support/model/cpu_fast.h).
static size_t hc_cpu_scratch_floats(const Config& c) {
    if (c.arch != ARCH_HC) return 0;
    size_t plain = CHUNKS * (hc_weight_floats(c.hc_rate, c.d) + c.d);
    return FAST_CPU ? std::max(plain, hc_fast_scratch_floats(c.hc_rate, c.d)) : plain;
}
// The GPU's HC weight gradient (hc_weights_backward_gpu): dp (BT, n, n+2), then
// the partial sums of HC_ROWS positions each, (chunks, n_weights), in floats.
#define HC_ROWS 32
static size_t hc_gpu_scratch_floats(const Config& c, size_t BT) {
    if (c.arch != ARCH_HC) return 0;
    size_t n = c.hc_rate;
    return BT * n * (n + 2) + (BT + HC_ROWS - 1) / HC_ROWS * hc_weight_floats(n, c.d);
}

// --- the ops -----------------------------------------------------------------
// x[t] = sum_i X[i][t]: the final norm's input. Also the backward of hc_expand: dx = sum_i dX[i].
static void hc_sum(float* x, const float* X, int n, size_t Nd) {
#pragma omp parallel for schedule(static) if (Nd > SHARED_FLOATS)
    for (size_t e = 0; e < Nd; e++) {
        float s = 0;
        for (int i = 0; i < n; i++) s += X[i * Nd + e];
        x[e] = s;
    }
}
// X[i][t] = x[t] for every stream i: the embedding. Also the backward of hc_sum: dX[i] = dx.
static void hc_expand(float* X, const float* x, int n, size_t Nd) {
    for (int i = 0; i < n; i++) memcpy(X + i * Nd, x, Nd * sizeof(float));
}

#define HC_MAX_RATE 16  // config_check: n <= 16, so a position's n+1 mixing weights fit in registers
// A (N, n, n+1), b (N, n) from X (n, N, d); dynamic also keeps rstd (N, n) of
// each stream and the tanh values ta (N, n, n+1), tb (N, n), for backward.
static void hc_weights_forward(float* Aw, float* bw, float* rstd, float* ta, float* tb, const float* X, HcParams w,
                               int N, int n, int d, float eps) {
    int K = n + 1;
    size_t Nd = (size_t)N * d;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++)
        for (int i = 0; i < n; i++) {
            size_t ti = (size_t)t * n + i;
            if (!w.alpha_fn) {  // static
                for (int k = 0; k < K; k++) Aw[ti * K + k] = w.static_alpha[i * K + k];
                bw[ti] = w.static_beta[i];
                continue;
            }
            const float* x = X + i * Nd + (size_t)t * d;
            float ss = 0;
            for (int j = 0; j < d; j++) ss += x[j] * x[j];
            float r = 1.0f / sqrtf(ss / d + eps), pa[HC_MAX_RATE + 1] = {}, pb = 0;
            for (int j = 0; j < d; j++) {
                float xn = x[j] * r;
                for (int k = 0; k < K; k++) pa[k] += xn * w.alpha_fn[j * K + k];
                pb += xn * w.beta_fn[j];
            }
            for (int k = 0; k < K; k++) {
                ta[ti * K + k] = tanhf(pa[k]);
                Aw[ti * K + k] = w.static_alpha[i * K + k] + w.alpha_scale[0] * ta[ti * K + k];
            }
            tb[ti] = tanhf(pb);
            bw[ti] = w.static_beta[i] + w.beta_scale[0] * tb[ti];
            rstd[ti] = r;
        }
}

// forward: A[t] = static_alpha + alpha_scale * ta[t],  ta = tanh(pa),  pa[t,i,k] = sum_j Xn[i][t,j] alpha_fn[j,k]
//          b[t] = static_beta  + beta_scale  * tb[t],  tb = tanh(pb),  pb[t,i]   = sum_j Xn[i][t,j] beta_fn[j]
//          Xn[i][t] = X[i][t] * rstd[t,i]
// d static_alpha += sum_t dA[t];   d static_beta += sum_t db[t]
// d alpha_scale += sum_{t,i,k} dA * ta;   dpa = dA * alpha_scale * (1 - ta^2)   (beta alike)
// d alpha_fn[j,k] += sum_{t,i} Xn[i][t,j] dpa[t,i,k];   d beta_fn[j] += sum_{t,i} Xn[i][t,j] dpb[t,i]
// dXn[i][t,j] = sum_k alpha_fn[j,k] dpa[t,i,k] + beta_fn[j] dpb[t,i]
// dX[i][t] += rstd * dXn - X * rstd^3 * mean_j(dXn_j X_j)       (RMSNorm's backward with gain 1)
// The weight gradients are summed over CHUNKS fixed slices of the positions,
// then the slices in order: the same for any thread count.
// scratch: CHUNKS * (hc_weight_floats(n, d) + d) floats, each slice's sums and its dXn row.
static void hc_weights_backward(float* dX, HcParams dw, const float* dA, const float* db, const float* X,
                                const float* rstd, const float* ta, const float* tb, HcParams w, int N, int n, int d,
                                float* scratch) {
    int K = n + 1;
    size_t Nd = (size_t)N * d;
    bool dyn = w.alpha_fn != nullptr;
    // one chunk's sums: static_alpha (n*K), static_beta (n), then alpha_fn (d*K), alpha_scale, beta_fn (d), beta_scale
    size_t n_weights = dyn ? hc_weight_floats(n, d) : (size_t)n * K + n;
    float* part = scratch;  // (CHUNKS, n_weights), then (CHUNKS, d): each slice's dXn
#pragma omp parallel for schedule(static)
    for (int c = 0; c < CHUNKS; c++) {
        float *sa = part + (size_t)c * n_weights, *sb = sa + n * K, *afn = sb + n, *as = afn + (size_t)d * K, *bfn = as + 1,
              *bs = bfn + d, *dxn = part + CHUNKS * n_weights + (size_t)c * d;
        memset(sa, 0, n_weights * sizeof(float));
        for (size_t t = (size_t)N * c / CHUNKS; t < (size_t)N * (c + 1) / CHUNKS; t++)
            for (int i = 0; i < n; i++) {
                size_t ti = t * n + i;
                for (int k = 0; k < K; k++) sa[i * K + k] += dA[ti * K + k];
                sb[i] += db[ti];
                if (!dyn) continue;
                float dpa[HC_MAX_RATE + 1], dpb = db[ti] * w.beta_scale[0] * (1 - tb[ti] * tb[ti]);
                for (int k = 0; k < K; k++) {
                    float a = ta[ti * K + k];
                    as[0] += dA[ti * K + k] * a;
                    dpa[k] = dA[ti * K + k] * w.alpha_scale[0] * (1 - a * a);
                }
                bs[0] += db[ti] * tb[ti];
                const float* x = X + i * Nd + t * d;
                float* dx = dX + i * Nd + t * d;
                float r = rstd[ti], dot = 0;
                for (int j = 0; j < d; j++) {
                    float xn = x[j] * r, g = w.beta_fn[j] * dpb;
                    for (int k = 0; k < K; k++) {
                        afn[j * K + k] += xn * dpa[k];
                        g += w.alpha_fn[j * K + k] * dpa[k];
                    }
                    bfn[j] += xn * dpb;
                    dxn[j] = g;
                    dot += g * x[j];
                }
                float k3 = r * r * r * dot / d;
                for (int j = 0; j < d; j++) dx[j] += r * dxn[j] - x[j] * k3;
            }
    }
    float* outs[] = {dw.static_alpha, dw.static_beta, dw.alpha_fn, dw.alpha_scale, dw.beta_fn, dw.beta_scale};
    size_t sizes[] = {(size_t)n * K, (size_t)n, (size_t)d * K, 1, (size_t)d, 1};
    for (int c = 0; c < CHUNKS; c++) {
        const float* src = part + (size_t)c * n_weights;
        for (int o = 0; o < (dyn ? 6 : 2); src += sizes[o], o++)
            for (size_t e = 0; e < sizes[o]; e++) outs[o][e] += src[e];
    }
}

// M[k][t] = sum_i A[t,i,k] * X[i][t]: the width connection.
static void hc_width_forward(float* M, const float* X, const float* Aw, int N, int n, int d) {
    int K = n + 1;
    size_t Nd = (size_t)N * d;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++)
        for (int k = 0; k < K; k++)
            for (int j = 0; j < d; j++) {
                float s = 0;
                for (int i = 0; i < n; i++) s += Aw[((size_t)t * n + i) * K + k] * X[i * Nd + (size_t)t * d + j];
                M[k * Nd + (size_t)t * d + j] = s;
            }
}

// forward: M[k][t] = sum_i A[t,i,k] * X[i][t]
// dA[t,i,k] = dM[k][t] . X[i][t];   dX[i][t] = sum_k A[t,i,k] * dM[k][t]   (both written, not added)
static void hc_width_backward(float* dX, float* dA, const float* dM, const float* X, const float* Aw, int N, int n,
                              int d) {
    int K = n + 1;
    size_t Nd = (size_t)N * d;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++)
        for (int i = 0; i < n; i++) {
            const float* x = X + i * Nd + (size_t)t * d;
            const float* a = Aw + ((size_t)t * n + i) * K;
            for (int k = 0; k < K; k++) {
                const float* dm = dM + k * Nd + (size_t)t * d;
                float s = 0;
                for (int j = 0; j < d; j++) s += dm[j] * x[j];
                dA[((size_t)t * n + i) * K + k] = s;
            }
            for (int j = 0; j < d; j++) {
                float s = 0;
                for (int k = 0; k < K; k++) s += a[k] * dM[k * Nd + (size_t)t * d + j];
                dX[i * Nd + (size_t)t * d + j] = s;
            }
        }
}

// X'[i][t] = b[t,i] * y[t] + M[1+i][t]: the depth connection (X' and M must not overlap).
static void hc_depth_forward(float* Xout, const float* y, const float* M, const float* bw, int N, int n, int d) {
    size_t Nd = (size_t)N * d;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++)
        for (int i = 0; i < n; i++)
            for (int j = 0; j < d; j++) {
                size_t e = (size_t)t * d + j;
                Xout[i * Nd + e] = bw[(size_t)t * n + i] * y[e] + M[(1 + i) * Nd + e];
            }
}

// forward: X'[i][t] = b[t,i] * y[t] + M[1+i][t]
// dy[t] = sum_i b[t,i] * dX'[i][t];   db[t,i] = dX'[i][t] . y[t];   dM[1+i] = dX'[i]
// All written, not added; dM[0] = 0, for the sublayer's norm to add its gradient into.
static void hc_depth_backward(float* dy, float* db, float* dM, const float* dXout, const float* y, const float* bw,
                              int N, int n, int d) {
    size_t Nd = (size_t)N * d;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++) {
        for (int j = 0; j < d; j++) {
            size_t e = (size_t)t * d + j;
            float s = 0;
            for (int i = 0; i < n; i++) s += bw[(size_t)t * n + i] * dXout[i * Nd + e];
            dy[e] = s;
            dM[e] = 0.0f;
            for (int i = 0; i < n; i++) dM[(1 + i) * Nd + e] = dXout[i * Nd + e];
        }
        for (int i = 0; i < n; i++) {
            float s = 0;
            for (int j = 0; j < d; j++) s += dXout[i * Nd + (size_t)t * d + j] * y[(size_t)t * d + j];
            db[(size_t)t * n + i] = s;
        }
    }
}

#ifdef LIME_GPU
// x[e] = sum_i X[i][e] (and dx = sum_i dX[i]): one thread per float of (N, d), the streams in order.
__global__ void hc_sum_kernel(float* x, const float* X, int n, size_t Nd) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= Nd) return;
    float s = 0;
    for (int i = 0; i < n; i++) s += X[i * Nd + e];
    x[e] = s;
}
static void hc_sum_gpu(float* x, const float* X, int n, size_t Nd, cudaStream_t stream) {
    LAUNCH(hc_sum_kernel, ceil_div(Nd, 256), 256, 0, stream)(x, X, n, Nd);
    launchCheck();
}
// X[i][e] = x[e]: one thread per float of (n, N, d).
__global__ void hc_expand_kernel(float* X, const float* x, int n, size_t Nd) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e < n * Nd) X[e] = x[e % Nd];
}
static void hc_expand_gpu(float* X, const float* x, int n, size_t Nd, cudaStream_t stream) {
    LAUNCH(hc_expand_kernel, ceil_div(n * Nd, 256), 256, 0, stream)(X, x, n, Nd);
    launchCheck();
}

// The mixing weights: one warp per (position t, stream i). Static: lanes copy
// the weights. Dynamic: lanes stride over the d columns for the sum of squares
// and the n+2 products with alpha_fn and beta_fn, then warp sums (fixed trees).
__global__ void hc_weights_forward_kernel(float* Aw, float* bw, float* rstd, float* ta, float* tb, const float* X,
                                          HcParams w, int N, int n, int d, float eps) {
    int lane = threadIdx.x % 32, ti = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, K = n + 1;
    if (ti >= N * n) return;  // the whole warp leaves together
    int t = ti / n, i = ti % n;
    if (!w.alpha_fn) {
        for (int k = lane; k < K; k += 32) Aw[ti * K + k] = w.static_alpha[i * K + k];
        if (lane == 0) bw[ti] = w.static_beta[i];
        return;
    }
    const float* x = X + ((size_t)i * N + t) * d;
    float ss = 0;
    for (int j = lane; j < d; j += 32) ss += x[j] * x[j];
    float r = 1.0f / sqrtf(warp_sum(ss) / d + eps), pa[HC_MAX_RATE + 1], pb = 0;
    for (int k = 0; k < HC_MAX_RATE + 1; k++) pa[k] = 0;
    for (int j = lane; j < d; j += 32) {
        float xn = x[j] * r;
        for (int k = 0; k < HC_MAX_RATE + 1; k++)
            if (k < K) pa[k] += xn * w.alpha_fn[j * K + k];
        pb += xn * w.beta_fn[j];
    }
    for (int k = 0; k < HC_MAX_RATE + 1; k++)
        if (k < K) {
            float a = tanhf(warp_sum(pa[k]));
            if (lane == 0) ta[ti * K + k] = a, Aw[ti * K + k] = w.static_alpha[i * K + k] + w.alpha_scale[0] * a;
        }
    float b = tanhf(warp_sum(pb));
    if (lane == 0) tb[ti] = b, bw[ti] = w.static_beta[i] + w.beta_scale[0] * b, rstd[ti] = r;
}
static void hc_weights_forward_gpu(float* Aw, float* bw, float* rstd, float* ta, float* tb, const float* X, HcParams w,
                                   int N, int n, int d, float eps, cudaStream_t stream) {
    const int warps = 4;
    LAUNCH(hc_weights_forward_kernel, ceil_div((size_t)N * n, warps), 32 * warps, 0, stream)
        (Aw, bw, rstd, ta, tb, X, w, N, n, d, eps);
    launchCheck();
}

// Backward of the dynamic weights, in three fixed-order steps, no atomics:
// 1. one warp per (t, i): dpa (K), dpb into dp (N, n, K+1), and dX += the
//    gain-less RMSNorm's backward of dXn (warp sums).
// 2. block (chunk of HC_ROWS positions, weight slice): thread w sums weight w's
//    terms over its chunk's positions and streams in order into partial[chunk].
//    The n_weights weights of a sublayer, in this order: static_alpha (n*K),
//    static_beta (n), alpha_fn (d*K), alpha_scale, beta_fn (d), beta_scale.
// 3. one thread per weight adds the chunks in order.
// scratch: N*n*(K+1) floats for dp, then ceil(N / HC_ROWS) * n_weights for the partial sums (hc_scratch_floats).
__global__ void hc_weights_dx_kernel(float* dX, float* dp, const float* dA, const float* db, const float* X,
                                     const float* rstd, const float* ta, const float* tb, HcParams w, int N, int n,
                                     int d) {
    int lane = threadIdx.x % 32, ti = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, K = n + 1;
    if (ti >= N * n) return;
    int t = ti / n, i = ti % n;
    float dpa[HC_MAX_RATE + 1], dpb = db[ti] * w.beta_scale[0] * (1 - tb[ti] * tb[ti]);
    for (int k = 0; k < HC_MAX_RATE + 1; k++) {
        float a = k < K ? ta[ti * K + k] : 0.0f;
        dpa[k] = k < K ? dA[ti * K + k] * w.alpha_scale[0] * (1 - a * a) : 0.0f;
        if (k < K && lane == 0) dp[ti * (K + 1) + k] = dpa[k];
    }
    if (lane == 0) dp[ti * (K + 1) + K] = dpb;
    const float* x = X + ((size_t)i * N + t) * d;
    float* dx = dX + ((size_t)i * N + t) * d;
    auto dxn = [&](int j) {  // dXn[j] = sum_k alpha_fn[j,k] dpa[k] + beta_fn[j] dpb
        float g = w.beta_fn[j] * dpb;
        for (int k = 0; k < HC_MAX_RATE + 1; k++)
            if (k < K) g += w.alpha_fn[j * K + k] * dpa[k];
        return g;
    };
    float r = rstd[ti], dot = 0;
    for (int j = lane; j < d; j += 32) dot += dxn(j) * x[j];
    float k3 = r * r * r * warp_sum(dot) / d;
    for (int j = lane; j < d; j += 32) dx[j] += r * dxn(j) - x[j] * k3;
}
__global__ void hc_weights_partial_kernel(float* partial, const float* dA, const float* db, const float* dp,
                                          const float* X, const float* rstd, const float* ta, const float* tb, int N,
                                          int n, int d, int n_weights) {
    int wi = blockIdx.y * blockDim.x + threadIdx.x, chunk = blockIdx.x, K = n + 1;
    if (wi >= n_weights) return;
    int t0 = chunk * HC_ROWS, t1 = min(N, t0 + HC_ROWS), nK = n * K, dK = d * K;
    float s = 0;
    for (int t = t0; t < t1; t++) {
        if (wi < nK) { s += dA[(size_t)t * nK + wi]; continue; }       // static_alpha[i, k]: dA[t, i, k]
        if (wi < nK + n) { s += db[(size_t)t * n + wi - nK]; continue; } // static_beta[i]: db[t, i]
        int v = wi - nK - n;
        for (int i = 0; i < n; i++) {
            size_t ti = (size_t)t * n + i;
            const float* x = X + ((size_t)i * N + t) * d;
            if (v < dK) s += x[v / K] * rstd[ti] * dp[ti * (K + 1) + v % K];  // alpha_fn[j, k]: Xn[j] dpa[k]
            else if (v == dK)
                for (int k = 0; k < K; k++) s += dA[ti * K + k] * ta[ti * K + k];  // alpha_scale
            else if (v <= dK + d) s += x[v - dK - 1] * rstd[ti] * dp[ti * (K + 1) + K];  // beta_fn[j]: Xn[j] dpb
            else s += db[ti] * tb[ti];                                                  // beta_scale
        }
    }
    partial[(size_t)chunk * n_weights + wi] = s;
}
__global__ void hc_weights_reduce_kernel(HcParams dw, const float* partial, int chunks, int n, int d, int n_weights) {
    int wi = blockIdx.x * blockDim.x + threadIdx.x, K = n + 1;
    if (wi >= n_weights) return;
    float s = 0;
    for (int c = 0; c < chunks; c++) s += partial[(size_t)c * n_weights + wi];
    int v = wi;
    float* outs[] = {dw.static_alpha, dw.static_beta, dw.alpha_fn, dw.alpha_scale, dw.beta_fn, dw.beta_scale};
    int sizes[] = {n * K, n, d * K, 1, d, 1};
    for (int o = 0; o < 6; v -= sizes[o], o++)
        if (v < sizes[o]) { outs[o][v] += s; return; }
}
static void hc_weights_backward_gpu(float* dX, HcParams dw, const float* dA, const float* db, const float* X,
                                    const float* rstd, const float* ta, const float* tb, HcParams w, int N, int n,
                                    int d, float* scratch, cudaStream_t stream) {
    bool dynamic = w.alpha_fn != nullptr;
    int n_weights = n * (n + 1) + n + (dynamic ? d * (n + 1) + d + 2 : 0), chunks = (int)ceil_div(N, HC_ROWS), warps = 4;
    float *dp = scratch, *partial = scratch + (size_t)N * n * (n + 2);
    if (dynamic) {
        LAUNCH(hc_weights_dx_kernel, ceil_div((size_t)N * n, warps), 32 * warps, 0, stream)
            (dX, dp, dA, db, X, rstd, ta, tb, w, N, n, d);
        launchCheck();
    }
    LAUNCH(hc_weights_partial_kernel, dim3(chunks, ceil_div(n_weights, 128)), 128, 0, stream)
        (partial, dA, db, dp, X, rstd, ta, tb, N, n, d, n_weights);
    launchCheck();
    LAUNCH(hc_weights_reduce_kernel, ceil_div(n_weights, 128), 128, 0, stream)(dw, partial, chunks, n, d, n_weights);
    launchCheck();
}

// M[k][t, j] = sum_i A[t,i,k] X[i][t, j]: one thread per float of M, the streams in order.
__global__ void hc_width_forward_kernel(float* M, const float* X, const float* Aw, int N, int n, int d) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x, Nd = (size_t)N * d;
    if (e >= (n + 1) * Nd) return;
    int k = (int)(e / Nd), t = (int)(e % Nd / d), K = n + 1;
    float s = 0;
    for (int i = 0; i < n; i++) s += Aw[((size_t)t * n + i) * K + k] * X[i * Nd + e % Nd];
    M[e] = s;
}
static void hc_width_forward_gpu(float* M, const float* X, const float* Aw, int N, int n, int d, cudaStream_t stream) {
    LAUNCH(hc_width_forward_kernel, ceil_div((size_t)(n + 1) * N * d, 256), 256, 0, stream)(M, X, Aw, N, n, d);
    launchCheck();
}
// dX[i][t, j] = sum_k A[t,i,k] dM[k][t, j]: one thread per float of dX, the mixtures in order.
__global__ void hc_width_backward_dx_kernel(float* dX, const float* dM, const float* Aw, int N, int n, int d) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x, Nd = (size_t)N * d;
    if (e >= n * Nd) return;
    int i = (int)(e / Nd), t = (int)(e % Nd / d), K = n + 1;
    float s = 0;
    for (int k = 0; k < K; k++) s += Aw[((size_t)t * n + i) * K + k] * dM[k * Nd + e % Nd];
    dX[e] = s;
}
// dA[t,i,k] = dM[k][t] . X[i][t]: one warp per weight, lanes stride over d, then a warp sum.
__global__ void hc_width_backward_da_kernel(float* dA, const float* dM, const float* X, int N, int n, int d) {
    int lane = threadIdx.x % 32, w = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, K = n + 1;
    if (w >= N * n * K) return;
    int t = w / (n * K), i = w / K % n, k = w % K;
    const float* dm = dM + ((size_t)k * N + t) * d;
    const float* x = X + ((size_t)i * N + t) * d;
    float s = 0;
    for (int j = lane; j < d; j += 32) s += dm[j] * x[j];
    s = warp_sum(s);
    if (lane == 0) dA[w] = s;
}
static void hc_width_backward_gpu(float* dX, float* dA, const float* dM, const float* X, const float* Aw, int N, int n,
                                  int d, cudaStream_t stream) {
    LAUNCH(hc_width_backward_dx_kernel, ceil_div((size_t)n * N * d, 256), 256, 0, stream)(dX, dM, Aw, N, n, d);
    launchCheck();
    const int warps = 4;
    LAUNCH(hc_width_backward_da_kernel, ceil_div((size_t)N * n * (n + 1), warps), 32 * warps, 0, stream)
        (dA, dM, X, N, n, d);
    launchCheck();
}

// X'[i][t, j] = b[t,i] y[t, j] + M[1+i][t, j]: one thread per float of X'.
__global__ void hc_depth_forward_kernel(float* Xout, const float* y, const float* M, const float* bw, int N, int n,
                                        int d) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x, Nd = (size_t)N * d;
    if (e >= n * Nd) return;
    int i = (int)(e / Nd), t = (int)(e % Nd / d);
    Xout[e] = bw[(size_t)t * n + i] * y[e % Nd] + M[Nd + e];
}
static void hc_depth_forward_gpu(float* Xout, const float* y, const float* M, const float* bw, int N, int n, int d,
                                 cudaStream_t stream) {
    LAUNCH(hc_depth_forward_kernel, ceil_div((size_t)n * N * d, 256), 256, 0, stream)(Xout, y, M, bw, N, n, d);
    launchCheck();
}
// dy[t, j] = sum_i b[t,i] dX'[i][t, j], dM[0] = 0, dM[1+i] = dX'[i]: one thread per float of (N, d).
__global__ void hc_depth_backward_dy_kernel(float* dy, float* dM, const float* dXout, const float* bw, int N, int n,
                                            int d) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x, Nd = (size_t)N * d;
    if (e >= Nd) return;
    int t = (int)(e / d);
    float s = 0;
    for (int i = 0; i < n; i++) {
        float g = dXout[i * Nd + e];
        s += bw[(size_t)t * n + i] * g;
        dM[(1 + i) * Nd + e] = g;
    }
    dy[e] = s;
    dM[e] = 0.0f;
}
// db[t,i] = dX'[i][t] . y[t]: one warp per (t, i), then a warp sum.
__global__ void hc_depth_backward_db_kernel(float* db, const float* dXout, const float* y, int N, int n, int d) {
    int lane = threadIdx.x % 32, ti = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (ti >= N * n) return;
    int t = ti / n, i = ti % n;
    const float* g = dXout + ((size_t)i * N + t) * d;
    const float* yt = y + (size_t)t * d;
    float s = 0;
    for (int j = lane; j < d; j += 32) s += g[j] * yt[j];
    s = warp_sum(s);
    if (lane == 0) db[ti] = s;
}
static void hc_depth_backward_gpu(float* dy, float* db, float* dM, const float* dXout, const float* y, const float* bw,
                                  int N, int n, int d, cudaStream_t stream) {
    LAUNCH(hc_depth_backward_dy_kernel, ceil_div((size_t)N * d, 256), 256, 0, stream)(dy, dM, dXout, bw, N, n, d);
    launchCheck();
    const int warps = 4;
    LAUNCH(hc_depth_backward_db_kernel, ceil_div((size_t)N * n, warps), 32 * warps, 0, stream)(db, dXout, y, N, n, d);
    launchCheck();
}
#endif

// The dispatchers: the kernels on the GPU, the fast loops (support/model/cpu_fast.cpp)
// in ./lime, the plain ones above in ./lime-ref. scratch: the model's (Acts).
static void op_hc_sum(Model* model, float* x, const float* X, int N) {
    int n = model->c.hc_rate;
    size_t Nd = (size_t)N * model->c.d;
    DISPATCH(model, hc_sum_gpu(x, X, n, Nd, stream_of(model)), hc_sum(x, X, n, Nd));
}
static void op_hc_expand(Model* model, float* X, const float* x, int N) {
    int n = model->c.hc_rate;
    size_t Nd = (size_t)N * model->c.d;
    DISPATCH(model, hc_expand_gpu(X, x, n, Nd, stream_of(model)), hc_expand(X, x, n, Nd));
}
static void op_hc_weights_forward(Model* model, const HcSublayer& h, const float* X, const HcParams& w, int N,
                                  float* scratch) {
    int n = model->c.hc_rate, d = model->c.d;
    float eps = model->c.eps;
    DISPATCH(model, hc_weights_forward_gpu(h.alpha, h.beta, h.rstd, h.ta, h.tb, X, w, N, n, d, eps, stream_of(model)),
             hc_weights_forward_fast(h.alpha, h.beta, h.rstd, h.ta, h.tb, X, w, N, n, d, eps, scratch),
             hc_weights_forward(h.alpha, h.beta, h.rstd, h.ta, h.tb, X, w, N, n, d, eps));
}
static void op_hc_weights_backward(Model* model, float* dX, const HcParams& dw, const HcActs& a, const HcSublayer& h,
                                   const float* X, const HcParams& w, int N, float* scratch) {
    int n = model->c.hc_rate, d = model->c.d;
    DISPATCH(model,
             hc_weights_backward_gpu(dX, dw, a.dalpha, a.dbeta, X, h.rstd, h.ta, h.tb, w, N, n, d, scratch,
                                     stream_of(model)),
             hc_weights_backward_fast(dX, dw, a.dalpha, a.dbeta, X, h.rstd, h.ta, h.tb, w, N, n, d, scratch),
             hc_weights_backward(dX, dw, a.dalpha, a.dbeta, X, h.rstd, h.ta, h.tb, w, N, n, d, scratch));
}
static void op_hc_width_forward(Model* model, float* M, const float* X, const float* Aw, int N) {
    int n = model->c.hc_rate, d = model->c.d;
    DISPATCH(model, hc_width_forward_gpu(M, X, Aw, N, n, d, stream_of(model)), hc_width_forward_fast(M, X, Aw, N, n, d),
             hc_width_forward(M, X, Aw, N, n, d));
}
static void op_hc_width_backward(Model* model, float* dX, float* dA, const float* dM, const float* X, const float* Aw,
                                 int N) {
    int n = model->c.hc_rate, d = model->c.d;
    DISPATCH(model, hc_width_backward_gpu(dX, dA, dM, X, Aw, N, n, d, stream_of(model)),
             hc_width_backward_fast(dX, dA, dM, X, Aw, N, n, d), hc_width_backward(dX, dA, dM, X, Aw, N, n, d));
}
static void op_hc_depth_forward(Model* model, float* Xout, const float* y, const float* M, const float* bw, int N) {
    int n = model->c.hc_rate, d = model->c.d;
    DISPATCH(model, hc_depth_forward_gpu(Xout, y, M, bw, N, n, d, stream_of(model)),
             hc_depth_forward(Xout, y, M, bw, N, n, d));
}
static void op_hc_depth_backward(Model* model, float* dy, float* db, float* dM, const float* dXout, const float* y,
                                 const float* bw, int N) {
    int n = model->c.hc_rate, d = model->c.d;
    DISPATCH(model, hc_depth_backward_gpu(dy, db, dM, dXout, y, bw, N, n, d, stream_of(model)),
             hc_depth_backward_fast(dy, db, dM, dXout, y, bw, N, n, d),
             hc_depth_backward(dy, db, dM, dXout, y, bw, N, n, d));
}

// --- the hooks: lime.cu's residual stream calls these for sublayer s ---------
// What the sublayer's norm reads: the mixing weights of the streams X (n, N, d),
// then the width connection; returns mixture 0 (N, d).
static const float* hc_sublayer_input(Model* model, const HcSublayer& h, const float* X, const HcParams& w, int N,
                                      float* scratch) {
    op_hc_weights_forward(model, h, X, w, N, scratch);
    op_hc_width_forward(model, h.M, X, h.alpha, N);
    return h.M;
}
// The depth connection, once the sublayer's output y (h.y) is computed: Xout (n, N, d) = b * y + M[1..n].
static void hc_residual_forward(Model* model, float* Xout, const HcSublayer& h, int N) {
    op_hc_depth_forward(model, Xout, h.y, h.M, h.beta, N);
}
// Its backward, from dXout (n, N, d): returns dy (N, d), the gradient of the
// sublayer's output; fills dM[1..n] and zeroes dM[0] (for the norm's backward to add into).
static const float* hc_residual_backward(Model* model, const HcActs& a, const HcSublayer& h, const float* dXout,
                                         int N) {
    op_hc_depth_backward(model, a.dy, a.dbeta, a.dM, dXout, h.y, h.beta, N);
    return a.dy;
}
// The backward of hc_sublayer_input once dM (n+1, N, d) is complete: writes
// dX (n, N, d) and adds the HC tensors' gradients into dw.
static void hc_sublayer_input_backward(Model* model, float* dX, const HcActs& a, const HcSublayer& h, const float* X,
                                       const HcParams& w, const HcParams& dw, int N, float* scratch) {
    op_hc_width_backward(model, dX, a.dalpha, a.dM, X, h.alpha, N);
    op_hc_weights_backward(model, dX, dw, a, h, X, w, N, scratch);
}

// --- the study-model interface (support/model/study.h) ------------------------
// HC's activations, carved from its region (at.acts) for the model's largest batch.
static HcActs hc_acts(const StudyAt& at) { return study_acts<HcActs>(at, hc_acts_carve<StudyTake>); }
// --- what HC costs (support/model/cost.cpp) -----------------------------------
// FLOPs per token, per sublayer: the mixtures (width and depth), the dynamic weights.
static double hc_flops(const Config& c, int) {
    double d = c.d, n = c.hc_rate;
    return c.L * 2 * (2 * (n + 1) * n * d + (c.hc_dynamic ? 2 * (n + 2) * n * d : 0));
}
// Floats per token (n streams, K = n+1, a = n K mixing weights a token), per
// sublayer, in place of LLaMa's residual add (4 d forward):
//   forward   width K d + n d + a;  weights n d + 2 a + 3 n (static a + n);
//             depth 2 n d + 2 d + n (with the product's output y)
//   backward  depth (n + K + 2) d + 3 n;  width (K + 2 n) d + 2 a;
//             weights 3 n d + 2 a + 4 n (static a + n)
//   and the embedding's copy into the streams and their sum: 4 (n + 1) d.
// docs/model.md ("What HC costs") has the numbers at the bench configs.
static double hc_floats(const Config& c, int) {
    double d = c.d, n = c.hc_rate, K = n + 1, a = n * K, dyn = c.hc_dynamic;
    double weights_f = dyn ? n * d + 2 * a + 3 * n : a + n, weights_b = dyn ? 3 * n * d + 2 * a + 4 * n : a + n;
    double fwd = K * d + n * d + a + weights_f + 2 * n * d + 2 * d + n - 4 * d;
    double bwd = (n + K + 2) * d + 3 * n + (K + 2 * n) * d + 2 * a + weights_b;
    return c.L * 2 * (fwd + bwd) + 4 * (n + 1) * d;  // attention and MLP, then the streams' copy and sum
}
static StudyHooks hc_hooks() {
    StudyHooks h = {};
    h.weights = "hc mixing weights";
    h.flops = hc_flops;
    h.floats = hc_floats;
    h.specs = [](const Config& c, int, const std::string& layer, const AddTensor& add) { hc_specs(c, layer, add); };
    h.carve = [](const Config& c, int, Params* p, const NextTensor& next) { hc_carve(c, p, next); };
    h.init = [](Model* model) { hc_init(model->p, model->c); };
    h.acts_floats = [](const Config& c, int B) { return study_acts_floats<HcActs>(c, B, hc_acts_carve<StudyTake>); };
    h.scratch_floats = [](const Config& c, int B, Device dev) {
        return dev == DEVICE_GPU ? hc_gpu_scratch_floats(c, (size_t)B * c.T) : hc_cpu_scratch_floats(c);
    };
    h.streams = [](const Config& c) { return c.hc_rate; };
    // the embedding fills every stream; backward: dx = sum_i dX[i]
    h.stream_begin = [](const StudyAt& at, float* x) { op_hc_expand(at.model, x, x, at.N()); };
    h.stream_begin_backward = [](const StudyAt& at, float* dx) { op_hc_sum(at.model, dx, dx, at.N()); };
    h.norm_input = [](const StudyAt& at, const float* X) {  // mixture 0 of the n streams
        HcActs a = hc_acts(at);
        return hc_sublayer_input(at.model, hc_sublayer(a, at.model->c, at.s, at.B, at.T), X,
                                 pass_params(at.model).hc[at.s], at.N(), at.scratch);
    };
    h.norm_input_backward = [](const StudyAt& at, const NormGrad& g) {  // into dM[0], then the mixing's backward
        HcActs a = hc_acts(at);
        HcSublayer sub = hc_sublayer(a, at.model->c, at.s, at.B, at.T);
        at.ops->rmsnorm_backward(at.model, a.dM, g.dg, at.lime.dnorm, sub.M, g.g, g.rstd, at.N());
        hc_sublayer_input_backward(at.model, g.dx, a, sub, g.x, pass_params(at.model).hc[at.s],
                                   pass_grads(at.model).hc[at.s], at.N(), at.scratch);
    };
    h.residual_start = [](const StudyAt&, float*) -> float* { return nullptr; };  // HC writes its n streams itself
    h.residual_add = [](const StudyAt& at, float* Xout, const float* inp, const float* W, int C) {
        HcSublayer sub = hc_sublayer(hc_acts(at), at.model->c, at.s, at.B, at.T);
        at.ops->matmul_forward(at.model, sub.y, inp, W, at.N(), C, at.model->c.d, false);  // y = inp @ W^T, then the depth
        hc_residual_forward(at.model, Xout, sub, at.N());                      // connection writes the n streams
    };
    h.residual_backward = [](const StudyAt& at, const float* dXout) {
        HcActs a = hc_acts(at);
        return hc_residual_backward(at.model, a, hc_sublayer(a, at.model->c, at.s, at.B, at.T), dXout, at.N());
    };
    h.final_input = [](const StudyAt& at, float* XL) -> const float* {  // the streams' sum
        HcActs a = hc_acts(at);
        op_hc_sum(at.model, a.x, XL, at.N());
        return a.x;
    };
    h.final_input_backward = [](const StudyAt& at, float* dx) {  // forward: x = sum_i X[i]
        op_hc_expand(at.model, dx, dx, at.N());
        return dx;
    };
    return h;
}
const StudyHooks HC_HOOKS = hc_hooks();
