// support/study/muddformer.cuh — MUDDFormer (multiway dynamic dense
// connections, Xiao et al., ICML 2025, arXiv 2502.12170; --arch muddformer),
// a peer the reviewers asked LIMe to be compared with: should a layer's
// queries, keys and values read different mixtures of the layers below? LIMe
// mixes keys and values after the projection, statically, per kv head; MUDD
// mixes whole hidden states before the projections, per token. The history
// holds the embedding and every block's output (full states), and after each
// block a small MLP of its output gives, per token, one weight per way and source:
//   Hs[0] = E[token];  XQ = XK = XV = XR = Hs[0]                     Hs[j], X*: (N, d)
//   for l:  aq = rmsnorm(XQ, g_attn);  ak = rmsnorm(XK, g_k);  av = rmsnorm(XV, g_v)   (l = 0: one norm, aq)
//           xa = XR + attention(aq Wq^T, ak Wk^T, av Wv^T) @ Wo^T
//           Hs[l+1] = xa + swiglu(rmsnorm(xa, g_mlp)) @ Wd^T               the LLaMa layer
//           z  = Hs[l+1] / rms(Hs[l+1])                                   (N, d)  RMSNorm without gain
//           dw = gelu(z @ W1^T) @ W2^T + a                                (N, C*s), s = l+2 sources
//           X^c[t] = sum_{j <= l+1} dw[t, c*s + j] * Hs[j][t]             way c = Q, K, V, R
//   logits = rmsnorm(XR, g_final) @ E^T
// W1 (K, d), W2 (C*s, K), a (C, s): model.layers.{l}.mudd.{w1,w2,static}.weight,
// K = 4 s hidden units; C = 4 ways (Q, K, V, R) after blocks 0 .. L-2 and the R
// way alone (C = 1) after the last. g_k, g_v (d): input_layernorm_{k,v}.weight, l >= 1.
// MUDD-KV (--mudd-ways kv, muddformer:kv): the K and V ways alone (C = 2, K = 2 s)
// after blocks 0 .. L-2; Q and R read the newest state Hs[l] (the plain residual).
// gelu is the tanh form (the official training code's). Initialisation: W1 ~
// N(0, 1/d), W2 = 0, a one-hot on the newest source, g_k = g_v = 1: then every
// way is Hs[l+1] and the model is LLaMa exactly (docs/model.md, "MUDDFormer").
//
// In lime.cu's activations x[l] (the stream entering layer l) is XR; with kv
// ways it is Hs[l] itself. qkvr keeps Hs[1..L] here (the MLP's add lands in
// Hs[l+1]: residual_start); the Q, K and V ways, the k and v norms' outputs,
// the dynamic weights' activations and every gradient of the history are this
// file's (MuddActs). AdamW: W1, W2 with the matrices, a with the routers, g_k,
// g_v with the gains. The small products go through lime.cu's (StudyAt::ops);
// the norm without gain, the gelu and the weighted sums are here (plain loops,
// kernels, dispatchers op_mudd_*), their reductions in a fixed order.
#pragma once
#include <cmath>
#include <cstring>
#include <string>

#include "support/model/cpu_fast.h"
#include "support/model/device.cuh"
#include "support/model/lime.h"
#include "support/model/study.h"

// --- the shapes ---------------------------------------------------------------
// The aggregation after block l: C ways over s = l+2 sources, K hidden units (C = 0: none).
struct MuddShape {
    int C, s, K;
};
static MuddShape mudd_shape(const Config& c, int l) {
    bool last = l == c.L - 1, kv = c.mudd_ways == MUDD_KV;
    int s = l + 2, C = kv ? (last ? 0 : 2) : (last ? 1 : 4);
    return MuddShape{C, s, C ? (kv ? 2 : 4) * s : 0};
}
// The ways other than R a layer l >= 1 reads from this file's arrays: qkvr Q, K, V; kv K, V.
static int mudd_own_ways(const Config& c) { return c.mudd_ways == MUDD_KV ? 2 : 3; }
static int mudd_max_weights(const Config& c) { return 4 * (c.L + 1); }  // C*s and K at most

// --- the tensors, as checkpoints name them ----------------------------------------
template <class Add>
static void mudd_specs(const Config& c, int l, const std::string& layer, Add add) {
    if (c.arch != ARCH_MUDDFORMER) return;
    if (l >= 1) {
        add(layer + "input_layernorm_k.weight", {c.d}, GROUP_EMBED_GAIN);
        add(layer + "input_layernorm_v.weight", {c.d}, GROUP_EMBED_GAIN);
    }
    MuddShape m = mudd_shape(c, l);
    if (!m.C) return;
    add(layer + "mudd.w1.weight", {m.K, c.d}, GROUP_MATRIX);
    add(layer + "mudd.w2.weight", {m.C * m.s, m.K}, GROUP_MATRIX);
    add(layer + "mudd.static.weight", {m.C, m.s}, GROUP_ROUTER);
}
// Layer l's tensors by name (nullptr where the layer has none), from LayerParams::study in mudd_specs' order.
struct MuddParams {
    float *g_k, *g_v;      // (d) the k and v norms' gains, l >= 1
    float *W1, *W2, *a;    // (K, d), (C*s, K), (C, s) the aggregation after block l
};
static MuddParams mudd_params(const Config& c, const LayerParams& w, int l) {
    MuddParams p = {};
    size_t i = 0;
    if (l >= 1) p.g_k = w.study[i++], p.g_v = w.study[i++];
    if (mudd_shape(c, l).C) p.W1 = w.study[i++], p.W2 = w.study[i++], p.a = w.study[i++];
    return p;
}
template <class Next>
static void mudd_carve(const Config& c, int l, LayerParams* w, Next next) {
    if (c.arch != ARCH_MUDDFORMER) return;
    int n = (l >= 1 ? 2 : 0) + (mudd_shape(c, l).C ? 3 : 0);
    for (int i = 0; i < n; i++) w->study.push_back(next());
}
// After LLaMa's initialisation (g_k = g_v = 1, W1 and W2 ~ N(0, 0.02^2), a
// untouched): W1 rescaled to N(0, 1/d) (the same draws), W2 = 0, a one-hot on
// the newest source (a[c, s-1] = 1).
static void mudd_init(const Params& p, const Config& c) {
    for (int l = 0; l < c.L; l++) {
        MuddShape m = mudd_shape(c, l);
        MuddParams w = mudd_params(c, p.layer[l], l);
        if (!m.C) continue;
        float scale = (float)(1.0 / std::sqrt((double)c.d) / 0.02);
        for (size_t i = 0; i < (size_t)m.K * c.d; i++) w.W1[i] *= scale;
        memset(w.W2, 0, (size_t)m.C * m.s * m.K * sizeof(float));
        for (int k = 0; k < m.C * m.s; k++) w.a[k] = k % m.s == m.s - 1 ? 1.0f : 0.0f;
    }
}

// --- the activations ---------------------------------------------------------
// MUDD's share of the model's activation allocation, sized 0 for other models.
// Per-layer arrays are strided by the batch's N = B*T (as lime.cu's x).
struct MuddActs {
    float* Hs;     // (L, N, d)     qkvr: the blocks' outputs Hs[1..L] (Hs[0] is lime.cu's x[0]); kv: lime.cu's x
    float* X;      // (L, W, N, d)  the ways layer l >= 1 reads from here (W: qkvr Q, K, V; kv K, V)
    float* akv;    // (L, 2, N, d)  ak, av: the k and v norms' outputs, layer l >= 1
    float* rkv;    // (L, 2, N)     their 1/rms
    float* z;      // (L, N, d)     the aggregation's input, Hs[l+1] normed without gain
    float* rz;     // (L, N)        its 1/rms
    float* u;      // (L, N, Kmax)  z @ W1^T
    float* hid;    // (L, N, Kmax)  gelu(u)
    float* dw;     // (L, N, Kmax)  hid @ W2^T (the dynamic part of the weights: + a)
    float* dHs;    // (L+1, N, d)   the gradients of Hs[0..L], summed over the aggregations that read them
    float* dX;     // (W, N, d)     the gradients of layer l's ways from here
    float* dakv;   // (2, N, d)     the gradients of ak, av (the projections' backward writes them)
    float* ddw;    // (N, Kmax)     the gradient of the weights dw
    float* dhid;   // (N, Kmax)     of hid, then of u (in place)
    float* dz;     // (N, d)        of z
};
template <class Take>
static void mudd_acts_carve(MuddActs* a, const Config& c, int B, Take take) {
    size_t BT = (size_t)B * c.T, on = c.arch == ARCH_MUDDFORMER ? 1 : 0, L = c.L, d = c.d, W = mudd_own_ways(c), Km = mudd_max_weights(c);
    size_t qkvr = c.mudd_ways == MUDD_QKVR ? 1 : 0;
    take(&a->Hs, on * qkvr * L * BT * d);
    take(&a->X, on * L * W * BT * d);
    take(&a->akv, on * L * 2 * BT * d);
    take(&a->rkv, on * L * 2 * BT);
    take(&a->z, on * L * BT * d);
    take(&a->rz, on * L * BT);
    take(&a->u, on * L * BT * Km);
    take(&a->hid, on * L * BT * Km);
    take(&a->dw, on * L * BT * Km);
    take(&a->dHs, on * (L + 1) * BT * d);
    take(&a->dX, on * W * BT * d);
    take(&a->dakv, on * 2 * BT * d);
    take(&a->ddw, on * BT * Km);
    take(&a->dhid, on * BT * Km);
    take(&a->dz, on * BT * d);
}
// The scratch of a's gradient (each slice's or block's sums of ddw): the CPU's
// CHUNKS slices, the GPU's blocks of MUDD_ROWS positions.
#define MUDD_ROWS 32
static size_t mudd_scratch_floats(const Config& c, size_t BT, Device dev) {
    if (c.arch != ARCH_MUDDFORMER) return 0;
    size_t blocks = dev == DEVICE_GPU ? (BT + MUDD_ROWS - 1) / MUDD_ROWS : CHUNKS;
    return blocks * mudd_max_weights(c);
}

// The history's sources, as the kernels read them: Hs[0] = first, Hs[j] = rest + (j-1) n for j >= 1.
struct MuddSources {
    const float* first;
    const float* rest;
    size_t n;  // N * d
    HOST_DEVICE const float* at(int j) const { return j == 0 ? first : rest + (j - 1) * n; }
};
// Where the C ways of an aggregation go (out[c], (N, d) each), and their gradients.
struct MuddWays4 {
    float* w[4];
};

// --- the ops -----------------------------------------------------------------
// z[t] = x[t] * r[t], r[t] = 1 / sqrt(mean_i x[t,i]^2 + eps): RMSNorm without a gain.
static void mudd_norm_forward(float* z, float* r, const float* x, int N, int d, float eps) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++) {
        const float* xt = x + (size_t)t * d;
        float ss = 0;
        for (int i = 0; i < d; i++) ss += xt[i] * xt[i];
        float rt = 1.0f / sqrtf(ss / d + eps);
        for (int i = 0; i < d; i++) z[(size_t)t * d + i] = xt[i] * rt;
        r[t] = rt;
    }
}
// forward: z = x * r. out[t] = (base ? base[t] : 0) + dHs[t] + r dz[t] - x[t] r^3 mean_i(dz[t,i] x[t,i]):
// the gradient of Hs[l+1] completed (the history's sums, then the norm's backward), into lime.cu's dx.
static void mudd_norm_backward(float* out, const float* base, const float* dHs, const float* dz, const float* x,
                               const float* r, int N, int d) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++) {
        size_t o = (size_t)t * d;
        float dot = 0, rt = r[t];
        for (int i = 0; i < d; i++) dot += dz[o + i] * x[o + i];
        float k = rt * rt * rt * dot / d;
        for (int i = 0; i < d; i++) out[o + i] = (base ? base[o + i] : 0.0f) + dHs[o + i] + (rt * dz[o + i] - x[o + i] * k);
    }
}

// gelu(u) = 0.5 u (1 + th),  th = tanh(sqrt(2/pi) (u + 0.044715 u^3)), the tanh form; its derivative
// gelu'(u) = 0.5 (1 + th) + 0.5 u (1 - th^2) sqrt(2/pi) (1 + 3 * 0.044715 u^2). th: tanhf on the GPU
// and in ./lime-ref, tanh_fast (support/model/cpu_fast.h, vectorised) in ./lime, as cpu_exp.
#define MUDD_GELU_K 0.7978845608028654f  // sqrt(2/pi)
HOST_DEVICE inline float mudd_gelu_arg(float u) { return MUDD_GELU_K * (u + 0.044715f * u * u * u); }
HOST_DEVICE inline float mudd_gelu_of(float u, float th) { return 0.5f * u * (1.0f + th); }
HOST_DEVICE inline float mudd_gelu_grad_of(float u, float th) {
    return 0.5f * (1.0f + th) + 0.5f * u * (1.0f - th * th) * MUDD_GELU_K * (1.0f + 3.0f * 0.044715f * u * u);
}
static inline float mudd_cpu_tanh(float x) { return FAST_CPU ? tanh_fast(x) : tanhf(x); }
static void mudd_gelu_forward(float* h, const float* u, size_t n) {
#pragma omp parallel for schedule(static) if (n > SHARED_FLOATS)
    for (size_t e = 0; e < n; e++) h[e] = mudd_gelu_of(u[e], mudd_cpu_tanh(mudd_gelu_arg(u[e])));
}
// forward: h = gelu(u). dh (in place) becomes du = dh * gelu'(u).
static void mudd_gelu_backward(float* dh, const float* u, size_t n) {
#pragma omp parallel for schedule(static) if (n > SHARED_FLOATS)
    for (size_t e = 0; e < n; e++) dh[e] *= mudd_gelu_grad_of(u[e], mudd_cpu_tanh(mudd_gelu_arg(u[e])));
}

// X^c[t, i] = sum_{j < s} (dw[t, c*s + j] + a[c*s + j]) * Hs[j][t, i], for the C ways (out.w[c]):
// each source's row read once, the sources in order (the innermost loop over i vectorises).
static void mudd_ways_forward(MuddWays4 out, const float* dw, const float* a, MuddSources H, MuddShape m, int N,
                              int d) {
    int C = m.C, s = m.s, Cs = m.C * m.s;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++)
        for (int j = 0; j < s; j++) {
            const float* h = H.at(j) + (size_t)t * d;
            for (int c = 0; c < C; c++) {
                float w = dw[(size_t)t * Cs + c * s + j] + a[c * s + j], *o = out.w[c] + (size_t)t * d;
                if (j == 0)
                    for (int i = 0; i < d; i++) o[i] = w * h[i];
                else
                    for (int i = 0; i < d; i++) o[i] += w * h[i];
            }
        }
}
// forward: X^c[t] = sum_j w[t,c,j] Hs[j][t],  w = dw + a
// ddw[t, c*s + j] = dX^c[t] . Hs[j][t]  (written);   dHs[j][t] += sum_c w[t,c,j] dX^c[t]
// (dX.w[c]: the ways' gradients; dHs laid out as the sources, dHs[j] = dH + j n)
static void mudd_ways_backward(float* dH, float* ddw, MuddWays4 dX, const float* dw, const float* a, MuddSources H,
                               MuddShape m, int N, int d) {
    int C = m.C, s = m.s, Cs = m.C * m.s;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++)
        for (int j = 0; j < s; j++) {
            const float* h = H.at(j) + (size_t)t * d;
            float* dh = dH + j * H.n + (size_t)t * d;
            for (int c = 0; c < C; c++) {
                const float* dx = dX.w[c] + (size_t)t * d;
                float w = dw[(size_t)t * Cs + c * s + j] + a[c * s + j], dot = 0;
#pragma omp simd reduction(+ : dot)
                for (int i = 0; i < d; i++) dot += dx[i] * h[i];
                for (int i = 0; i < d; i++) dh[i] += w * dx[i];
                ddw[(size_t)t * Cs + c * s + j] = dot;
            }
        }
}
// da[k] += sum_t ddw[t, k]: over CHUNKS fixed slices of the positions, then the slices in order.
// part: CHUNKS * Cs floats.
static void mudd_static_backward(float* da, const float* ddw, int N, int Cs, float* part) {
#pragma omp parallel for schedule(static)
    for (int c = 0; c < CHUNKS; c++) {
        float* sums = part + (size_t)c * Cs;
        for (int k = 0; k < Cs; k++) sums[k] = 0;
        for (size_t t = (size_t)N * c / CHUNKS; t < (size_t)N * (c + 1) / CHUNKS; t++)
            for (int k = 0; k < Cs; k++) sums[k] += ddw[t * Cs + k];
    }
    for (int c = 0; c < CHUNKS; c++)
        for (int k = 0; k < Cs; k++) da[k] += part[(size_t)c * Cs + k];
}

#ifdef LIME_GPU
// One warp per position: lanes stride over d, then a warp sum.
__global__ void mudd_norm_forward_kernel(float* z, float* r, const float* x, int N, int d, float eps) {
    int lane = threadIdx.x % 32, t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (t >= N) return;
    const float* xt = x + (size_t)t * d;
    float ss = 0;
    for (int i = lane; i < d; i += 32) ss += xt[i] * xt[i];
    float rt = 1.0f / sqrtf(warp_sum(ss) / d + eps);
    for (int i = lane; i < d; i += 32) z[(size_t)t * d + i] = xt[i] * rt;
    if (lane == 0) r[t] = rt;
}
static void mudd_norm_forward_gpu(float* z, float* r, const float* x, int N, int d, float eps, cudaStream_t stream) {
    LAUNCH(mudd_norm_forward_kernel, ceil_div(N, 4), 128, 0, stream)(z, r, x, N, d, eps);
    launchCheck();
}
__global__ void mudd_norm_backward_kernel(float* out, const float* base, const float* dHs, const float* dz,
                                          const float* x, const float* r, int N, int d) {
    int lane = threadIdx.x % 32, t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (t >= N) return;
    size_t o = (size_t)t * d;
    float dot = 0, rt = r[t];
    for (int i = lane; i < d; i += 32) dot += dz[o + i] * x[o + i];
    float k = rt * rt * rt * warp_sum(dot) / d;
    for (int i = lane; i < d; i += 32) out[o + i] = (base ? base[o + i] : 0.0f) + dHs[o + i] + (rt * dz[o + i] - x[o + i] * k);
}
static void mudd_norm_backward_gpu(float* out, const float* base, const float* dHs, const float* dz, const float* x,
                                   const float* r, int N, int d, cudaStream_t stream) {
    LAUNCH(mudd_norm_backward_kernel, ceil_div(N, 4), 128, 0, stream)(out, base, dHs, dz, x, r, N, d);
    launchCheck();
}
__global__ void mudd_gelu_forward_kernel(float* h, const float* u, size_t n) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e < n) h[e] = mudd_gelu_of(u[e], tanhf(mudd_gelu_arg(u[e])));
}
__global__ void mudd_gelu_backward_kernel(float* dh, const float* u, size_t n) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e < n) dh[e] *= mudd_gelu_grad_of(u[e], tanhf(mudd_gelu_arg(u[e])));
}
static void mudd_gelu_forward_gpu(float* h, const float* u, size_t n, cudaStream_t stream) {
    LAUNCH(mudd_gelu_forward_kernel, ceil_div(n, 256), 256, 0, stream)(h, u, n);
    launchCheck();
}
static void mudd_gelu_backward_gpu(float* dh, const float* u, size_t n, cudaStream_t stream) {
    LAUNCH(mudd_gelu_backward_kernel, ceil_div(n, 256), 256, 0, stream)(dh, u, n);
    launchCheck();
}
// One thread per float of (N, d): the sources in order, the C ways' sums in registers.
__global__ void mudd_ways_forward_kernel(MuddWays4 out, const float* dw, const float* a, MuddSources H, MuddShape m,
                                         int N, int d) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)N * d) return;
    int t = (int)(e / d), C = m.C, s = m.s, Cs = m.C * m.s;
    float acc[4] = {0, 0, 0, 0};
    for (int j = 0; j < s; j++) {
        float h = H.at(j)[e];
        for (int c = 0; c < C; c++) acc[c] += (dw[(size_t)t * Cs + c * s + j] + a[c * s + j]) * h;
    }
    for (int c = 0; c < C; c++) out.w[c][e] = acc[c];
}
static void mudd_ways_forward_gpu(MuddWays4 out, const float* dw, const float* a, MuddSources H, MuddShape m, int N,
                                  int d, cudaStream_t stream) {
    LAUNCH(mudd_ways_forward_kernel, ceil_div((size_t)N * d, 256), 256, 0, stream)(out, dw, a, H, m, N, d);
    launchCheck();
}
// Block b takes positions [b MUDD_ROWS, (b+1) MUDD_ROWS), one warp per
// position at a time: ddw by warp sums, dHs by lanes over d. Then the block
// sums its positions' ddw in order into partial (blocks, Cs), and
// mudd_static_reduce_kernel adds the blocks in order into da: no atomics.
__global__ void mudd_ways_backward_kernel(float* dH, float* ddw, float* partial, MuddWays4 dX, const float* dw,
                                          const float* a, MuddSources H, MuddShape m, int N, int d) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32, C = m.C, s = m.s, Cs = m.C * m.s;
    int from = blockIdx.x * MUDD_ROWS, to = min(N, from + MUDD_ROWS);
    for (int t = from + warp; t < to; t += warps)
        for (int j = 0; j < s; j++) {
            const float* h = H.at(j) + (size_t)t * d;
            float* dh = dH + j * H.n + (size_t)t * d;
            float dot[4] = {0, 0, 0, 0}, w[4];
            for (int c = 0; c < C; c++) w[c] = dw[(size_t)t * Cs + c * s + j] + a[c * s + j];
            for (int i = lane; i < d; i += 32) {
                float g = 0, hi = h[i];
                for (int c = 0; c < C; c++) {
                    float dx = dX.w[c][(size_t)t * d + i];
                    dot[c] += dx * hi;
                    g += w[c] * dx;
                }
                dh[i] += g;
            }
            for (int c = 0; c < C; c++) {
                float v = warp_sum(dot[c]);
                if (lane == 0) ddw[(size_t)t * Cs + c * s + j] = v;
            }
        }
    __syncthreads();
    for (int k = threadIdx.x; k < Cs; k += blockDim.x) {
        float sum = 0;
        for (int t = from; t < to; t++) sum += ddw[(size_t)t * Cs + k];
        partial[(size_t)blockIdx.x * Cs + k] = sum;
    }
}
__global__ void mudd_static_reduce_kernel(float* da, const float* partial, int blocks, int Cs) {
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= Cs) return;
    float sum = 0;
    for (int b = 0; b < blocks; b++) sum += partial[(size_t)b * Cs + k];
    da[k] += sum;
}
static void mudd_ways_backward_gpu(float* dH, float* ddw, float* da, MuddWays4 dX, const float* dw, const float* a,
                                   MuddSources H, MuddShape m, int N, int d, float* partial, cudaStream_t stream) {
    int blocks = (int)ceil_div(N, MUDD_ROWS), Cs = m.C * m.s;
    LAUNCH(mudd_ways_backward_kernel, blocks, 128, 0, stream)(dH, ddw, partial, dX, dw, a, H, m, N, d);
    launchCheck();
    LAUNCH(mudd_static_reduce_kernel, ceil_div(Cs, 128), 128, 0, stream)(da, partial, blocks, Cs);
    launchCheck();
}
#endif

// The dispatchers: the kernels on the GPU, the plain loops (threads over positions) on the CPU.
static void op_mudd_norm_forward(Model* model, float* z, float* r, const float* x, int N) {
    int d = model->c.d;
    float eps = model->c.eps;
    DISPATCH(model, mudd_norm_forward_gpu(z, r, x, N, d, eps, stream_of(model)), mudd_norm_forward(z, r, x, N, d, eps));
}
static void op_mudd_norm_backward(Model* model, float* out, const float* base, const float* dHs, const float* dz,
                                  const float* x, const float* r, int N) {
    int d = model->c.d;
    DISPATCH(model, mudd_norm_backward_gpu(out, base, dHs, dz, x, r, N, d, stream_of(model)),
             mudd_norm_backward(out, base, dHs, dz, x, r, N, d));
}
static void op_mudd_gelu_forward(Model* model, float* h, const float* u, size_t n) {
    DISPATCH(model, mudd_gelu_forward_gpu(h, u, n, stream_of(model)), mudd_gelu_forward(h, u, n));
}
static void op_mudd_gelu_backward(Model* model, float* dh, const float* u, size_t n) {
    DISPATCH(model, mudd_gelu_backward_gpu(dh, u, n, stream_of(model)), mudd_gelu_backward(dh, u, n));
}
static void op_mudd_ways_forward(Model* model, MuddWays4 out, const float* dw, const float* a, MuddSources H,
                                 MuddShape m, int N) {
    int d = model->c.d;
    DISPATCH(model, mudd_ways_forward_gpu(out, dw, a, H, m, N, d, stream_of(model)),
             mudd_ways_forward(out, dw, a, H, m, N, d));
}
// The ways' backward and a's gradient (da += sum_t ddw). scratch: mudd_scratch_floats.
static void op_mudd_ways_backward(Model* model, float* dH, float* ddw, float* da, MuddWays4 dX, const float* dw,
                                  const float* a, MuddSources H, MuddShape m, int N, float* scratch) {
    int d = model->c.d;
    DISPATCH(model, mudd_ways_backward_gpu(dH, ddw, da, dX, dw, a, H, m, N, d, scratch, stream_of(model)),
             (mudd_ways_backward(dH, ddw, dX, dw, a, H, m, N, d), mudd_static_backward(da, ddw, N, m.C * m.s, scratch)));
}

// --- the hooks: lime.cu's passes call these -----------------------------------
static MuddActs mudd_acts(const StudyAt& at) { return study_acts<MuddActs>(at, mudd_acts_carve<StudyTake>); }
// Layer l's arrays for a (B, T) batch (strides N = B*T, as lime.cu's).
struct MuddLayer {
    MuddShape m;
    MuddSources H;          // Hs[0 .. l+1]
    float* Hnext;           // Hs[l+1]: the aggregation's input
    float *X, *ak, *av, *rk, *rv;  // layer l's own ways (W, N, d) and its k and v norms (l >= 1)
    float *z, *rz, *u, *hid, *dw;  // the aggregation after block l
};
static MuddLayer mudd_layer(const StudyAt& at, int l) {
    const Config& c = at.model->c;
    MuddActs a = mudd_acts(at);
    size_t n = (size_t)at.N() * c.d, N = at.N(), W = mudd_own_ways(c), Km = mudd_max_weights(c);
    MuddLayer y;
    y.m = mudd_shape(c, l);
    y.H = MuddSources{at.lime.x, c.mudd_ways == MUDD_KV ? at.lime.x + n : a.Hs, n};
    y.Hnext = (float*)y.H.at(l + 1);
    y.X = a.X + l * W * n;
    y.ak = a.akv + l * 2 * n, y.av = y.ak + n;
    y.rk = a.rkv + l * 2 * N, y.rv = y.rk + N;
    y.z = a.z + l * n, y.rz = a.rz + l * N;
    y.u = a.u + l * N * Km, y.hid = a.hid + l * N * Km, y.dw = a.dw + l * N * Km;
    return y;
}
// Layer l >= 1's ways from this file: qkvr Q, K, V = X[0], X[1], X[2]; kv K, V = X[0], X[1].
static float* mudd_way(const Config& c, float* X, char way, size_t n) {
    int i = c.mudd_ways == MUDD_KV ? (way == 'K' ? 0 : 1) : (way == 'Q' ? 0 : way == 'K' ? 1 : 2);
    return X + i * n;
}
// Where the ways of the aggregation after block l go: layer l+1's own arrays, and lime.cu's x[l+1] for R.
static MuddWays4 mudd_way_targets(const Config& c, float* Xnext, float* R, MuddShape m, size_t n) {
    if (c.mudd_ways == MUDD_KV) return MuddWays4{{mudd_way(c, Xnext, 'K', n), mudd_way(c, Xnext, 'V', n)}};
    if (m.C == 1) return MuddWays4{{R}};
    return MuddWays4{{mudd_way(c, Xnext, 'Q', n), mudd_way(c, Xnext, 'K', n), mudd_way(c, Xnext, 'V', n), R}};
}

// norm_input (s = 2l, l >= 1): ak = rmsnorm(XK, g_k), av = rmsnorm(XV, g_v);
// the q norm (lime.cu's) reads XQ (qkvr) or x = Hs[l] (kv). Other sublayers: x.
static const float* mudd_norm_input(const StudyAt& at, const float* x) {
    const Config& c = at.model->c;
    int l = at.l();
    if (at.s % 2 || l == 0) return x;
    MuddLayer y = mudd_layer(at, l);
    MuddParams w = mudd_params(c, pass_params(at.model).layer[l], l);
    size_t n = (size_t)at.N() * c.d;
    at.ops->rmsnorm_forward(at.model, y.ak, y.rk, mudd_way(c, y.X, 'K', n), w.g_k, at.N(), nullptr);
    at.ops->rmsnorm_forward(at.model, y.av, y.rv, mudd_way(c, y.X, 'V', n), w.g_v, at.N(), nullptr);
    return c.mudd_ways == MUDD_KV ? x : mudd_way(c, y.X, 'Q', n);
}
static KvInputs mudd_kv_inputs(const StudyAt& at) {
    if (at.l() == 0) return KvInputs{};
    MuddLayer y = mudd_layer(at, at.l());
    MuddActs a = mudd_acts(at);
    size_t n = (size_t)at.N() * at.model->c.d;
    return KvInputs{y.ak, y.av, a.dakv, a.dakv + n};
}
// forward: aq = rmsnorm(XQ or x, g_attn), ak = rmsnorm(XK, g_k), av = rmsnorm(XV, g_v).
// qkvr: dXQ, dXK, dXV (this file's) get the three norms' backward; kv: dx gets
// the q norm's (Q reads x), dXK and dXV the others'. Layer 0 and the MLP: lime.cu's.
static void mudd_norm_input_backward(const StudyAt& at, const NormGrad& g) {
    Model* model = at.model;
    const Config& c = model->c;
    int l = at.l(), N = at.N();
    if (at.s % 2 || l == 0) return at.ops->rmsnorm_backward(model, g.dx, g.dg, at.lime.dnorm, g.x, g.g, g.rstd, N);
    MuddLayer y = mudd_layer(at, l);
    MuddActs a = mudd_acts(at);
    MuddParams w = mudd_params(c, pass_params(model).layer[l], l), gw = mudd_params(c, pass_grads(model).layer[l], l);
    size_t n = (size_t)N * c.d;
    op_zero(model, a.dX, mudd_own_ways(c) * n);
    bool kv = c.mudd_ways == MUDD_KV;
    at.ops->rmsnorm_backward(model, kv ? g.dx : mudd_way(c, a.dX, 'Q', n), g.dg, at.lime.dnorm,
                             kv ? g.x : mudd_way(c, y.X, 'Q', n), g.g, g.rstd, N);
    at.ops->rmsnorm_backward(model, mudd_way(c, a.dX, 'K', n), gw.g_k, a.dakv, mudd_way(c, y.X, 'K', n), w.g_k, y.rk, N);
    at.ops->rmsnorm_backward(model, mudd_way(c, a.dX, 'V', n), gw.g_v, a.dakv + n, mudd_way(c, y.X, 'V', n), w.g_v,
                             y.rv, N);
}
// After block l: z = Hs[l+1] normed, dw = gelu(z W1^T) W2^T, the ways = sum_j (dw + a) Hs[j].
static void mudd_block_end(const StudyAt& at, float* xnext) {
    Model* model = at.model;
    const Config& c = model->c;
    int l = at.l(), N = at.N();
    MuddLayer y = mudd_layer(at, l);
    if (!y.m.C) return;  // kv: nothing after the last block (the final norm reads Hs[L] = x[L])
    MuddParams w = mudd_params(c, pass_params(model).layer[l], l);
    size_t n = (size_t)N * c.d;
    op_mudd_norm_forward(model, y.z, y.rz, y.Hnext, N);
    at.ops->matmul_forward(model, y.u, y.z, w.W1, N, c.d, y.m.K, false);  // u = z @ W1^T      (N, K)
    op_mudd_gelu_forward(model, y.hid, y.u, (size_t)N * y.m.K);
    at.ops->matmul_forward(model, y.dw, y.hid, w.W2, N, y.m.K, y.m.C * y.m.s, false);  // (N, C*s)
    float* Xnext = l + 1 < c.L ? mudd_layer(at, l + 1).X : nullptr;
    op_mudd_ways_forward(model, mudd_way_targets(c, Xnext, xnext, y.m, n), y.dw, w.a, y.H, y.m, N);
}
// dx: the gradient of x[l+1] (qkvr XR; kv Hs[l+1] as Q and R of layer l+1 read it, or the final norm).
// Adds the aggregation's share into dHs[0 .. l+1] and its weights' gradients, then
// leaves in dx the gradient of Hs[l+1], complete (only aggregations l' >= l read it).
// The last layer's, the first to run, zeroes dHs first.
static void mudd_block_end_backward(const StudyAt& at, float* dx) {
    Model* model = at.model;
    const Config& c = model->c;
    int l = at.l(), N = at.N();
    MuddActs a = mudd_acts(at);
    MuddLayer y = mudd_layer(at, l);
    size_t n = (size_t)N * c.d;
    if (l == c.L - 1) op_zero(model, a.dHs, (c.L + 1) * n);
    if (!y.m.C) return;
    MuddParams w = mudd_params(c, pass_params(model).layer[l], l), gw = mudd_params(c, pass_grads(model).layer[l], l);
    int K = y.m.K, Cs = y.m.C * y.m.s;
    // forward: X^c = sum_j (dw + a)[c, j] Hs[j]: ddw, a's gradient and dHs[0 .. l+1] from the ways' gradients
    op_mudd_ways_backward(model, a.dHs, a.ddw, gw.a, mudd_way_targets(c, a.dX, dx, y.m, n), y.dw, w.a, y.H, y.m, N,
                          at.scratch);
    at.ops->matmul_backward(model, a.dhid, gw.W2, a.ddw, y.hid, w.W2, N, K, Cs, false);  // forward: dw = hid @ W2^T
    op_mudd_gelu_backward(model, a.dhid, y.u, (size_t)N * K);                          // forward: hid = gelu(u)
    at.ops->matmul_backward(model, a.dz, gw.W1, a.dhid, y.z, w.W1, N, c.d, K, false);  // forward: u = z @ W1^T
    // dx = dHs[l+1] + the norm's backward of dz (kv: + dx, the direct reads)
    op_mudd_norm_backward(model, dx, c.mudd_ways == MUDD_KV ? dx : nullptr, a.dHs + (l + 1) * n, a.dz, y.Hnext, y.rz, N);
}

// --- what MUDDFormer costs (support/model/cost.cpp) ----------------------------
// The aggregation after block l: C ways over s = l+2 states, K hidden units;
// false where there is none (kv's last block).
static bool mudd_aggregation(const Config& c, int l, double* C, double* s, double* K) {
    bool kv = c.mudd_ways == MUDD_KV, last = l == c.L - 1;
    *s = l + 2;
    *C = kv ? (last ? 0 : 2) : (last ? 1 : 4);
    *K = (kv ? 2 : 4) * *s;
    return *C > 0;
}
// FLOPs per token after block l: z W1^T, hid W2^T, the C ways' sums over s states.
static double mudd_flops(const Config& c, int) {
    double d = c.d, f = 0, C, s, K;
    for (int l = 0; l < c.L; l++)
        if (mudd_aggregation(c, l, &C, &s, &K)) f += 2 * d * K + 2 * K * C * s + 2 * C * s * d;
    return f;
}
// Floats per token, a layer l >= 1: forward the k and v norms 4 d, the norm's
// separate copy 2 d, the k and v products' own inputs 2 d; backward the ways'
// zero-fill W d (W = 3 qkvr, 2 kv), the k and v norms 8 d, the products' own
// inputs and gradients 4 d. The aggregation after block l (C ways, s states,
// K hidden units): forward the norm 2 d, z W1^T d + K, the gelu 2 K, hid W2^T
// K + C s, the ways C s + s d + C d; backward the ways C d + 3 s d + 2 C s (and
// a's sum C s), W2's product C s + 2 K, the gelu 3 K, W1's product K + 2 d,
// the norm's backward into dx 4 d (kv 5 d); once the history's zero-fill
// (L+1) d and the embedding's gradient add 3 d.
static double mudd_floats(const Config& c, int) {
    double d = c.d, f = 0, mC, ms, mK, mW = c.mudd_ways == MUDD_KV ? 2 : 3;
    for (int l = 0; l < c.L; l++) {
        if (l >= 1) f += 8 * d + (mW + 12) * d;
        if (mudd_aggregation(c, l, &mC, &ms, &mK))
            f += 2 * d + d + mK + 2 * mK + mK + mC * ms + mC * ms + ms * d + mC * d +             // forward
                 mC * d + 3 * ms * d + 3 * mC * ms + 2 * mK + mC * ms + 3 * mK + mK + 2 * d +  // backward
                 (mW == 2 ? 5 : 4) * d;
    }
    return f + (c.L + 1) * d + 3 * d;
}
static StudyHooks muddformer_hooks() {
    StudyHooks h = {};
    h.weights = "dense-connection weights and k, v norms";
    h.attended = "raw (W_V of the V way's mixture of the states)";
    h.flops = mudd_flops;
    h.floats = mudd_floats;
    h.specs = [](const Config& c, int l, const std::string& layer, const AddTensor& add) { mudd_specs(c, l, layer, add); };
    h.carve = [](const Config& c, int l, Params* p, const NextTensor& next) { mudd_carve(c, l, &p->layer[l], next); };
    h.init = [](Model* model) { mudd_init(model->p, model->c); };
    h.acts_floats = [](const Config& c, int B) { return study_acts_floats<MuddActs>(c, B, mudd_acts_carve<StudyTake>); };
    h.scratch_floats = [](const Config& c, int B, Device dev) { return mudd_scratch_floats(c, (size_t)B * c.T, dev); };
    h.norm_input = mudd_norm_input;
    h.norm_input_backward = mudd_norm_input_backward;
    h.kv_inputs = mudd_kv_inputs;
    // qkvr: the MLP's add goes to Hs[l+1], this file's; x[l+1] gets the R way (block_end)
    h.residual_start = [](const StudyAt& at, float* xout) {
        return at.s % 2 && at.model->c.mudd_ways == MUDD_QKVR ? (float*)mudd_layer(at, at.l()).Hnext : xout;
    };
    h.block_end = mudd_block_end;
    h.block_end_backward = mudd_block_end_backward;
    h.stream_begin_backward = [](const StudyAt& at, float* dx) {  // x[0] = Hs[0] in every aggregation
        op_add(at.model, dx, mudd_acts(at).dHs, (size_t)at.N() * at.model->c.d);
    };
    return h;
}
const StudyHooks MUDDFORMER_HOOKS = muddformer_hooks();
