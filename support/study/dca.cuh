// support/study/dca.cuh — DeepCrossAttention (--arch dca; Heddes et al., ICML
// 2025, arXiv 2502.06785, the full-stack GRN-v3 form; docs/model.md has its section), a
// peer the reviewers asked LIMe to be compared with: the query, key and value
// inputs of each block are three different mixtures of every earlier block's
// output, with a per-feature static weight and a per-token score.
//   g[0] = E[token]                                             g[j]: (N, d), the stack
//   for l in 0 .. L-1, c in (q, k, v), S = l+1 sources:
//       z_c[t, j] = w_c[l] . g[j][t]                            the score, one scalar a (token, source)
//       y_c[t]    = sum_{j<S} (B_c[l][j] + relu(z_c[t, j])) * g[j][t]     B_c[l] (S, d), w_c[l] (d)
//       q = rmsnorm(y_q, g_attn) Wq^T;  K = rmsnorm(y_k, g_k) Wk^T;  V = rmsnorm(y_v, g_v) Wv^T
//       a = o Wo^T                                              (RoPE, causal GQA attention: LLaMa's)
//       h = y_q + a;   g[l+1] = a + swiglu(rmsnorm(h, g_mlp)) Wd^T   the stack holds the blocks' outputs
//   y = sum_{j<=L} (B_f[j] + relu(w_f . g[j])) * g[j];  logits = rmsnorm(y, g_final) E^T
// relu acts on the score alone; B is added after it (no softmax).
// Initialisation: B = 1, w ~ N(0, 0.02^2), g_k = g_v = 1: LLaMa up to the
// small terms relu(w . g_j) g_j (B = 1 and w = 0 is LLaMa to rounding).
// AdamW: B with the routers, w with the matrices, g_k and g_v with the gains.
//
// In lime.cu's activations the stack is x: x[j] = g[j] (x[0] the embedding,
// x[l+1] block l's output, which the MLP's residual add writes), and xa[l] is
// h. This file keeps each block's three GRN outputs (y_q, which the q norm
// reads, y_k, y_v), the K and V inputs and their 1/rms, the scores, the final
// GRN's output and the gradients of the stack (DcaActs). One op does a
// block's three GRNs and the K and V norms (dca_grn_forward); its backward
// does the K and V norms' backward and the three GRNs' (dca_grn_backward),
// one launch each on the GPU. The hooks:
//   stream_begin   block 0's GRNs (the stack is the embedding alone)
//   norm_input     s = 2l: y_q[l] (and the K, V inputs are kv_inputs'); s = 2l+1: h
//   residual_add   s = 2l: g[l+1] = o Wo^T, h = y_q + g[l+1];  s = 2l+1: g[l+1] += m Wd^T
//   block_end      block l+1's GRNs;  final_input: the final GRN
// and backward: the final GRN's writes dG (the stack's gradient), each block's
// adds into it; the gradient of g[l+1] is complete after block l+1's, so it is
// the MLP's output's; the attention output's is d h + dG[l+1].
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "support/model/device.cuh"
#include "support/model/lime.h"
#include "support/model/study.h"

// --- the tensors (the checkpoint names) -----------------------------------------------
// Per block l, after its LLaMa tensors: the three GRNs' static weights B [l+1, d]
// (routers' group), their dynamic weights w [d] (matrices'), the K and V norms'
// gains [d]; after the last block's, the final GRN's B [L+1, d] and w [d].
static void dca_specs(const Config& c, int l, const std::string& layer, const AddTensor& add) {
    if (c.arch != ARCH_DCA) return;
    for (const char* m : {"q", "k", "v"}) add(layer + "grn_" + m + ".static.weight", {l + 1, c.d}, GROUP_ROUTER);
    for (const char* m : {"q", "k", "v"}) add(layer + "grn_" + m + ".dynamic.weight", {c.d}, GROUP_MATRIX);
    add(layer + "input_layernorm_k.weight", {c.d}, GROUP_EMBED_GAIN);
    add(layer + "input_layernorm_v.weight", {c.d}, GROUP_EMBED_GAIN);
    if (l < c.L - 1) return;
    add("model.grn_final.static.weight", {c.L + 1, c.d}, GROUP_ROUTER);
    add("model.grn_final.dynamic.weight", {c.d}, GROUP_MATRIX);
}
// In LayerParams::study, in dca_specs' order: B_q, B_k, B_v, w_q, w_k, w_v, g_k, g_v (and B_f, w_f).
static void dca_carve(const Config& c, int l, Params* p, const NextTensor& next) {
    int n = c.arch != ARCH_DCA ? 0 : l == c.L - 1 ? 10 : 8;
    for (int i = 0; i < n; i++) p->layer[l].study.push_back(next());
}
// One GRN's tensors: block b's three (C = 3) with the K and V norms' gains, or
// the final GRN's one (b = L, C = 1). Params or their gradients alike.
struct GrnTensors {
    float* B[3];     // (S, d) each: row j the weights of source j
    float* w[3];     // (d) each
    float* gain[2];  // (d) the K and V norms' gains; nullptr in the final GRN
};
static GrnTensors grn_tensors(const Params& p, const Config& c, int b) {
    GrnTensors t = {};
    if (b == c.L) {
        const std::vector<float*>& s = p.layer[c.L - 1].study;
        t.B[0] = s[8], t.w[0] = s[9];
        return t;
    }
    const std::vector<float*>& s = p.layer[b].study;
    for (int m = 0; m < 3; m++) t.B[m] = s[m], t.w[m] = s[3 + m];
    t.gain[0] = s[6], t.gain[1] = s[7];
    return t;
}
// The initialisation: B = 1; w ~ N(0, 0.02^2): model_init has drawn each B
// as a matrix, N(0, 0.02^2) from its name's stream of the run's seed; w takes
// the first row of its GRN's draw (d numbers: its own N(0, 0.02^2)), then B = 1.
// The gains are 1 already (model_init's 1-D tensors).
static void dca_init(Model* model) {
    const Config& c = model->c;
    for (int b = 0; b <= c.L; b++) {
        GrnTensors t = grn_tensors(model->p, c, b);
        int S = b == c.L ? c.L + 1 : b + 1;
        for (int m = 0; m < (b == c.L ? 1 : 3); m++) {
            memcpy(t.w[m], t.B[m], (size_t)c.d * sizeof(float));
            for (size_t e = 0; e < (size_t)S * c.d; e++) t.B[m][e] = 1.0f;
        }
    }
}

// --- the activations ---------------------------------------------------------
// DCA's share of the model's activation allocation (sized 0 for other models);
// (N, d) arrays have the batch's strides (N = B*T tokens of the current batch).
struct DcaActs {
    float* y;     // (L, 3, N, d)    each block's GRN outputs y_q, y_k, y_v
    float* a;     // (L, 2, N, d)    the K and V inputs, rmsnorm(y_k, g_k), rmsnorm(y_v, g_v)
    float* rstd;  // (L, 2, N)       their 1/rms
    float* z;     // (L+1, 3, N, L+1) the scores z_c[t, j] of every GRN (block b's: (C, N, S) at b's start)
    float* yf;    // (N, d)          the final GRN's output, the final norm's input
    float* dG;    // (L+1, N, d)     the gradient of the stack g[0..L]
    float* da;    // (2, N, d)       the gradients of the K and V inputs (the projections' backward writes them)
    float* dout;  // (N, d)          the gradient of a = o Wo^T
};
template <class Take>
static void dca_acts_carve(DcaActs* a, const Config& c, size_t BT, Take take) {
    size_t on = c.arch == ARCH_DCA ? 1 : 0, L = c.L, d = c.d;
    take(&a->y, on * L * 3 * BT * d);
    take(&a->a, on * L * 2 * BT * d);
    take(&a->rstd, on * L * 2 * BT);
    take(&a->z, on * (L + 1) * 3 * BT * (L + 1));
    take(&a->yf, on * BT * d);
    take(&a->dG, on * (L + 1) * BT * d);
    take(&a->da, on * 2 * BT * d);
    take(&a->dout, on * BT * d);
}

// --- the ops -----------------------------------------------------------------
// One GRN's shape: C mixtures (3: q, k, v; 1: the final) of S sources, N tokens of d.
struct GrnShape {
    int C, S, N, d;
};
// One GRN's arrays. G (S, N, d) the stack; y (C, N, d) its mixtures; z (C, N, S)
// the scores; a (2, N, d) and rstd (2, N): the K and V norms' (C = 3; else nullptr).
struct GrnIo {
    const float* G;
    float *y, *z, *a, *rstd;
};
// The weights' gradients summed over the tokens: B (C, S, d), w (C, d), and the K and V gains (2, d) when C = 3.
HOST_DEVICE inline size_t grn_weight_floats(int C, int S, int d) {
    return (size_t)C * S * d + (size_t)C * d + (C == 3 ? 2 * (size_t)d : 0);
}
// Entry e of those sums: the gradient it adds to.
HOST_DEVICE inline float* grn_weight_grad(const GrnTensors& dw, int C, int S, int d, size_t e) {
    size_t nB = (size_t)S * d;
    if (e < C * nB) return dw.B[e / nB] + e % nB;
    e -= C * nB;
    if (e < (size_t)C * d) return dw.w[e / d] + e % d;
    e -= (size_t)C * d;
    return dw.gain[e / d] + e % d;
}
HOST_DEVICE inline float relu(float v) { return v > 0 ? v : 0.0f; }

#define DCA_TILE 64  // the CPU loops' tile of a row: its sums stay in registers
// x . y (d floats) in 8 interleaved partial sums, then those in a fixed tree:
// the loops vectorise (one chain of adds would wait on each add), and the
// order is the same at any thread count.
static inline float dca_dot(const float* x, const float* y, int d) {
    float acc[8] = {};
    int i = 0;
    for (; i + 8 <= d; i += 8)
#pragma omp simd
        for (int k = 0; k < 8; k++) acc[k] += x[i + k] * y[i + k];
    for (int k = 0; i + k < d; k++) acc[k] += x[i + k] * y[i + k];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// forward, per token t: z_c[t, j] = w_c . g[j][t];  y_c[t] = sum_j (B_c[j] + relu(z_c[t, j])) * g[j][t];
// C = 3: a_k = rmsnorm(y_k, g_k), a_v = rmsnorm(y_v, g_v), with their 1/rms.
// Each y_c[t, i] sums its sources in order, j = 0 first.
static void dca_grn_forward(const GrnIo& io, const GrnTensors& w, GrnShape s, float eps) {
    int d = s.d, S = s.S;
    size_t Nd = (size_t)s.N * d;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < s.N; t++)
        for (int c = 0; c < s.C; c++) {
            float* z = io.z + ((size_t)c * s.N + t) * S;
            float* y = io.y + c * Nd + (size_t)t * d;
            for (int j = 0; j < S; j++) z[j] = dca_dot(w.w[c], io.G + j * Nd + (size_t)t * d, d);
            for (int i0 = 0; i0 < d; i0 += DCA_TILE) {  // a tile of y summed in registers, the sources in order
                int n = std::min(DCA_TILE, d - i0);
                float acc[DCA_TILE] = {};
                for (int j = 0; j < S; j++) {
                    const float *g = io.G + j * Nd + (size_t)t * d + i0, *B = w.B[c] + (size_t)j * d + i0;
                    float zr = relu(z[j]);
#pragma omp simd
                    for (int i = 0; i < n; i++) acc[i] += (B[i] + zr) * g[i];
                }
                for (int i = 0; i < n; i++) y[i0 + i] = acc[i];
            }
            if (c == 0 || !io.a) continue;
            float r = 1.0f / sqrtf(dca_dot(y, y, d) / d + eps), *a = io.a + (c - 1) * Nd + (size_t)t * d;
            for (int i = 0; i < d; i++) a[i] = y[i] * r * w.gain[c - 1][i];
            io.rstd[(size_t)(c - 1) * s.N + t] = r;
        }
}

// The backward's gradients in and out. dy (N, d): the gradient of y_q (C = 3)
// or of the final y (C = 1); da (2, N, d) of the K and V inputs (C = 3). dG
// (S, N, d): the stack's, written (first: the final GRN, the first to run) or
// added to. On return dy holds dG[S-1], complete then (newest: block 0's, the
// embedding's gradient), else 0 (for the MLP norm's backward to add into).
struct GrnGrads {
    float* dy;
    const float* da;
    float* dG;
    bool first, newest;
};
// forward (per token):  y_c = sum_j (B_c[j] + relu(z_cj)) g_j,  z_cj = w_c . g_j;  a_c = rmsnorm(y_c, gain_c)
// the norms (c = k, v):  dy_c = r gain_c da_c - y_c r^3 (sum_i gain_c da_c y_c) / d;  dgain_c += da_c y_c r
// the mixtures:          p_cj = [z_cj > 0] (dy_c . g_j)
//                        dG[j] (+)= sum_c ((B_c[j] + relu(z_cj)) dy_c + p_cj w_c)   (c in order)
//                        dB_c[j] += dy_c * g_j;   dw_c += sum_j p_cj g_j
// The weights' gradients are summed over CHUNKS fixed slices of the tokens,
// then the slices in order: the same for any thread count. part:
// grn_cpu_scratch_floats, each slice's sums and its token's rows dy_q, dy_k, dy_v and a product's.
static size_t grn_cpu_scratch_floats(int C, int S, int d) { return CHUNKS * (grn_weight_floats(C, S, d) + 4 * (size_t)d); }
static void dca_grn_backward(const GrnIo& io, const GrnGrads& g, const GrnTensors& w, const GrnTensors& dw, GrnShape s,
                             float* part) {
    int C = s.C, S = s.S, d = s.d;
    size_t Nd = (size_t)s.N * d, nw = grn_weight_floats(C, S, d);
#pragma omp parallel for schedule(static)
    for (int ch = 0; ch < CHUNKS; ch++) {
        float *sums = part + ch * nw, *sB = sums, *sw = sums + (size_t)C * S * d, *sgain = sw + (size_t)C * d;
        float* dyc = part + CHUNKS * nw + (size_t)ch * 4 * d;  // (3, d) this token's dy_q, dy_k, dy_v
        float* term = dyc + 3 * d;                             // (d) gain * da of a norm
        memset(sums, 0, nw * sizeof(float));
        for (size_t t = (size_t)s.N * ch / CHUNKS; t < (size_t)s.N * (ch + 1) / CHUNKS; t++) {
            memcpy(dyc, g.dy + t * d, d * sizeof(float));
            for (int c = 1; c < C; c++) {  // the K and V norms
                const float *da = g.da + (c - 1) * Nd + t * d, *y = io.y + c * Nd + t * d, *gain = w.gain[c - 1];
                float r = io.rstd[(size_t)(c - 1) * s.N + t];
                for (int i = 0; i < d; i++) term[i] = gain[i] * da[i];
                float k = r * r * r * dca_dot(term, y, d) / d;
#pragma omp simd
                for (int i = 0; i < d; i++) {
                    dyc[c * d + i] = r * gain[i] * da[i] - y[i] * k;
                    sgain[(c - 1) * d + i] += da[i] * y[i] * r;
                }
            }
            for (int j = 0; j < S; j++) {
                const float* gj = io.G + j * Nd + t * d;
                float* dg = g.dG + j * Nd + t * d;
                float p[3], zr[3];
                for (int c = 0; c < C; c++) {
                    float z = io.z[((size_t)c * s.N + t) * S + j];
                    p[c] = z > 0 ? dca_dot(dyc + c * d, gj, d) : 0.0f;
                    zr[c] = relu(z);
                }
                for (int i0 = 0; i0 < d; i0 += DCA_TILE) {  // a tile of dG's term summed in registers, c in order
                    int n = std::min(DCA_TILE, d - i0);
                    float acc[DCA_TILE] = {};
                    for (int c = 0; c < C; c++) {
                        const float *dy = dyc + c * d + i0, *B = w.B[c] + (size_t)j * d + i0, *wc = w.w[c] + i0,
                                    *gt = gj + i0;
                        float *sb = sB + ((size_t)c * S + j) * d + i0, *sc = sw + (size_t)c * d + i0;
#pragma omp simd
                        for (int i = 0; i < n; i++) {
                            acc[i] += (B[i] + zr[c]) * dy[i] + p[c] * wc[i];
                            sb[i] += dy[i] * gt[i];
                            sc[i] += p[c] * gt[i];
                        }
                    }
                    for (int i = 0; i < n; i++) dg[i0 + i] = g.first ? acc[i] : dg[i0 + i] + acc[i];
                }
            }
            for (int i = 0; i < d; i++) g.dy[t * d + i] = g.newest ? g.dG[(S - 1) * Nd + t * d + i] : 0.0f;
        }
    }
    for (int ch = 0; ch < CHUNKS; ch++)
        for (size_t e = 0; e < nw; e++) *grn_weight_grad(dw, C, S, d, e) += part[ch * nw + e];
}

// out = x + y (n floats): the attention's residual add h = y_q + a, and its backward's d a = d h + dG[l+1].
static void dca_sum(float* out, const float* x, const float* y, size_t n) {
#pragma omp parallel for schedule(static) if (n > SHARED_FLOATS)
    for (size_t e = 0; e < n; e++) out[e] = x[e] + y[e];
}

#ifdef LIME_GPU
#define GRN_WARPS 4   // warps a block: each takes its own tokens
#define GRN_ROWS 32   // tokens a warp in the backward: one row of partial sums each
// One warp per token: the lanes stride over d. Score j is a warp sum (every
// lane gets it); the mixture adds source j's term into the lane's own entries
// of y, in the order of the sources, as the plain loop.
__global__ void dca_grn_forward_kernel(GrnIo io, GrnTensors w, GrnShape s, float eps) {
    int lane = threadIdx.x % 32, t = blockIdx.x * GRN_WARPS + threadIdx.x / 32, d = s.d, S = s.S;
    if (t >= s.N) return;  // the whole warp leaves together
    size_t Nd = (size_t)s.N * d;
    for (int c = 0; c < s.C; c++) {
        float* y = io.y + c * Nd + (size_t)t * d;
        for (int j = 0; j < S; j++) {
            const float* g = io.G + j * Nd + (size_t)t * d;
            float dot = 0;
            for (int i = lane; i < d; i += 32) dot += w.w[c][i] * g[i];
            float z = warp_sum(dot), zr = relu(z);
            if (lane == 0) io.z[((size_t)c * s.N + t) * S + j] = z;
            for (int i = lane; i < d; i += 32) {
                float term = (w.B[c][(size_t)j * d + i] + zr) * g[i];
                y[i] = j == 0 ? 0.0f + term : y[i] + term;
            }
        }
        if (c == 0 || !io.a) continue;
        float ss = 0;
        for (int i = lane; i < d; i += 32) ss += y[i] * y[i];
        float r = 1.0f / sqrtf(warp_sum(ss) / d + eps), *a = io.a + (c - 1) * Nd + (size_t)t * d;
        for (int i = lane; i < d; i += 32) a[i] = y[i] * r * w.gain[c - 1][i];
        if (lane == 0) io.rstd[(size_t)(c - 1) * s.N + t] = r;
    }
}
static void dca_grn_forward_gpu(const GrnIo& io, const GrnTensors& w, GrnShape s, float eps, cudaStream_t stream) {
    LAUNCH(dca_grn_forward_kernel, ceil_div(s.N, GRN_WARPS), 32 * GRN_WARPS, 0, stream)(io, w, s, eps);
    launchCheck();
}
// The backward in one launch: warp k of the grid takes tokens k*GRN_ROWS ..
// +GRN_ROWS in order, one at a time, the lanes striding over d (each lane
// alone reads and writes its entries: dy, dG, its row of partial sums); the
// dots are warp sums. dy_k and dy_v are recomputed where used from their
// token's two numbers. Each warp's sums over its tokens go to its row of
// partial (rows, nw); the block that finishes last (a count in done, 0 again
// after) adds the rows into the gradients in a fixed order, 32 entries at a
// time: warp y sums rows y, y + GRN_WARPS, ... in order, then a fixed tree over the warps.
struct GrnNorms {  // one token's K and V norms' backward: dy_c = r gain da - y k
    float r[2], k[2];
};
__device__ inline float grn_dy(const GrnGrads& g, const GrnIo& io, const GrnTensors& w, const GrnNorms& nm, int c,
                               size_t Nd, size_t row, int i) {
    if (c == 0) return g.dy[row + i];
    return nm.r[c - 1] * w.gain[c - 1][i] * g.da[(c - 1) * Nd + row + i] - io.y[c * Nd + row + i] * nm.k[c - 1];
}
__global__ void dca_grn_backward_kernel(GrnIo io, GrnGrads g, GrnTensors w, GrnTensors dw, GrnShape s, float* partial,
                                        unsigned* done) {
    int lane = threadIdx.x % 32, y = threadIdx.x / 32, row_of_warp = blockIdx.x * GRN_WARPS + y;
    int C = s.C, S = s.S, d = s.d, rows = (s.N + GRN_ROWS - 1) / GRN_ROWS;
    size_t Nd = (size_t)s.N * d, nw = grn_weight_floats(C, S, d);
    if (row_of_warp < rows) {
        float *sums = partial + row_of_warp * nw, *sB = sums, *sw = sums + (size_t)C * S * d, *sgain = sw + (size_t)C * d;
        for (int i = lane; i < d; i += 32) {  // the lane's own entries of the row
            for (int e = 0; e < C * S; e++) sB[(size_t)e * d + i] = 0.0f;
            for (int e = 0; e < C + (C == 3 ? 2 : 0); e++) sw[(size_t)e * d + i] = 0.0f;
        }
        int from = row_of_warp * GRN_ROWS, to = min(s.N, from + GRN_ROWS);
        for (int t = from; t < to; t++) {
            size_t row = (size_t)t * d;
            GrnNorms nm = {};
            for (int c = 1; c < C; c++) {  // the K and V norms
                const float *da = g.da + (c - 1) * Nd + row, *yc = io.y + c * Nd + row, *gain = w.gain[c - 1];
                float r = io.rstd[(size_t)(c - 1) * s.N + t], dot = 0;
                for (int i = lane; i < d; i += 32) dot += gain[i] * da[i] * yc[i];
                nm.r[c - 1] = r;
                nm.k[c - 1] = r * r * r * warp_sum(dot) / d;
                for (int i = lane; i < d; i += 32) sgain[(c - 1) * d + i] += da[i] * yc[i] * r;
            }
            for (int j = 0; j < S; j++) {
                const float* gj = io.G + j * Nd + row;
                float p[3] = {}, zr[3] = {};
                for (int c = 0; c < C; c++) {
                    float z = io.z[((size_t)c * s.N + t) * S + j], dot = 0;
                    for (int i = lane; i < d; i += 32) dot += grn_dy(g, io, w, nm, c, Nd, row, i) * gj[i];
                    dot = warp_sum(dot);
                    p[c] = z > 0 ? dot : 0.0f;
                    zr[c] = relu(z);
                }
                float* dg = g.dG + j * Nd + row;
                for (int i = lane; i < d; i += 32) {
                    float v = 0;
                    for (int c = 0; c < C; c++) {
                        float dy = grn_dy(g, io, w, nm, c, Nd, row, i);
                        v += (w.B[c][(size_t)j * d + i] + zr[c]) * dy + p[c] * w.w[c][i];
                        sB[((size_t)c * S + j) * d + i] += dy * gj[i];
                        sw[(size_t)c * d + i] += p[c] * gj[i];
                    }
                    dg[i] = g.first ? v : dg[i] + v;
                }
            }
            for (int i = lane; i < d; i += 32) g.dy[row + i] = g.newest ? g.dG[(S - 1) * Nd + row + i] : 0.0f;
        }
    }
    if (!last_block_done(done)) return;
    column_sums_tree<GRN_WARPS>(partial, rows, nw, [&](size_t e, float sum) { *grn_weight_grad(dw, C, S, d, e) += sum; });
}
static size_t grn_gpu_scratch_floats(int C, int S, int d, size_t N) {
    return (size_t)ceil_div(N, GRN_ROWS) * grn_weight_floats(C, S, d);
}
static void dca_grn_backward_gpu(const GrnIo& io, const GrnGrads& g, const GrnTensors& w, const GrnTensors& dw,
                                 GrnShape s, float* partial, unsigned* done, cudaStream_t stream) {
    unsigned rows = ceil_div(s.N, GRN_ROWS);
    LAUNCH(dca_grn_backward_kernel, ceil_div(rows, GRN_WARPS), 32 * GRN_WARPS, 0, stream)
        (io, g, w, dw, s, partial, done);
    launchCheck();
}
__global__ void dca_sum_kernel(float* out, const float* x, const float* y, size_t n) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e < n) out[e] = x[e] + y[e];
}
static void dca_sum_gpu(float* out, const float* x, const float* y, size_t n, cudaStream_t stream) {
    LAUNCH(dca_sum_kernel, ceil_div(n, 256), 256, 0, stream)(out, x, y, n);
    launchCheck();
}
#endif

// The dispatchers: the kernels on the GPU, the plain loops on the CPU (./lime and ./lime-ref alike).
static void op_dca_grn_forward(Model* model, const GrnIo& io, const GrnTensors& w, GrnShape s) {
    float eps = model->c.eps;
    DISPATCH(model, dca_grn_forward_gpu(io, w, s, eps, stream_of(model)), dca_grn_forward(io, w, s, eps));
}
static void op_dca_grn_backward(Model* model, const GrnIo& io, const GrnGrads& g, const GrnTensors& w,
                                const GrnTensors& dw, GrnShape s, float* scratch) {
    DISPATCH(model, dca_grn_backward_gpu(io, g, w, dw, s, scratch, model->gpu->done, stream_of(model)),
             dca_grn_backward(io, g, w, dw, s, scratch));
}
static void op_dca_sum(Model* model, float* out, const float* x, const float* y, size_t n) {
    DISPATCH(model, dca_sum_gpu(out, x, y, n, stream_of(model)), dca_sum(out, x, y, n));
}

// The scratch of the largest GRN's backward: block L-1's (3 mixtures, L sources) or the final's (1, L+1).
static size_t dca_scratch_floats(const Config& c, size_t BT, Device dev) {
    if (c.arch != ARCH_DCA) return 0;
#ifdef LIME_GPU
    if (dev == DEVICE_GPU)
        return std::max(grn_gpu_scratch_floats(3, c.L, c.d, BT), grn_gpu_scratch_floats(1, c.L + 1, c.d, BT));
#endif
    (void)dev, (void)BT;
    return std::max(grn_cpu_scratch_floats(3, c.L, c.d), grn_cpu_scratch_floats(1, c.L + 1, c.d));
}

// --- the hooks: lime.cu's passes call these --------------------------------------
static DcaActs dca_acts(const StudyAt& at) {
    DcaActs a = {};
    size_t off = 0;
    StudyTake take{at.acts, &off};
    dca_acts_carve(&a, at.model->c, (size_t)at.model->B * at.model->c.T, take);
    return a;
}
// GRN b's arrays for the batch at: block b (b < L: three mixtures of b+1 sources) or the final (b = L).
static GrnIo grn_io(const StudyAt& at, const DcaActs& a, int b, GrnShape* s) {
    const Config& c = at.model->c;
    size_t N = at.N(), d = c.d;
    *s = GrnShape{b == c.L ? 1 : 3, b + 1, (int)N, c.d};  // b+1 sources: the embedding and blocks 0 .. b-1
    if (b == c.L) return GrnIo{at.lime.x, a.yf, a.z + (size_t)b * 3 * N * (c.L + 1), nullptr, nullptr};
    return GrnIo{at.lime.x, a.y + (size_t)b * 3 * N * d, a.z + (size_t)b * 3 * N * (c.L + 1), a.a + (size_t)b * 2 * N * d,
                 a.rstd + (size_t)b * 2 * N};
}
static void dca_grn_forward_at(const StudyAt& at, int b) {
    GrnShape s;
    GrnIo io = grn_io(at, dca_acts(at), b, &s);
    op_dca_grn_forward(at.model, io, grn_tensors(pass_params(at.model), at.model->c, b), s);
}
static void dca_grn_backward_at(const StudyAt& at, int b, float* dy, bool first, bool newest) {
    DcaActs a = dca_acts(at);
    GrnShape s;
    GrnIo io = grn_io(at, a, b, &s);
    const Config& c = at.model->c;
    GrnGrads g = {dy, a.da, a.dG, first, newest};
    op_dca_grn_backward(at.model, io, g, grn_tensors(pass_params(at.model), c, b), grn_tensors(pass_grads(at.model), c, b),
                        s, at.scratch);
}
// Where the stack's entry j lies: lime.cu's x[j] (a batch's (N, d) strides).
static float* dca_stack(const StudyAt& at, int j) { return at.lime.x + (size_t)j * at.N() * at.model->c.d; }
// Block l's y_q (N, d): the q norm's input.
static float* dca_yq(const StudyAt& at, const DcaActs& a, int l) { return a.y + (size_t)l * 3 * at.N() * at.model->c.d; }

// --- what DCA costs (support/model/cost.cpp) -----------------------------------
// FLOPs per token: block l's three GRNs over l+1 sources (scores 2 d, sums 3 d
// each), and the final GRN's over L+1.
static double dca_flops(const Config& c, int) {
    double d = c.d, f = 0;
    for (int l = 0; l < c.L; l++) f += 3 * 5 * d * (l + 1);
    return f + 5 * d * (c.L + 1);
}
// Floats per token, block l (S = l+1 sources): forward the GRNs read S d and
// write y_q, y_k, y_v and the K and V inputs 5 d (and 3 S scores, 2 rstd); the
// projections read two more inputs 2 d; the attention's add writes a, then
// reads y_q and a and writes h 4 d (LLaMa's 2 d); the norms copy nothing (-2 d):
// (S + 7) d + 3 S + 2. Backward the GRNs read dy_q, the K and V inputs'
// gradients and y_k, y_v 5 d, the sources S d, add into dG 2 S d, zero dy_q d,
// read the scores 3 S and rstd 2; the projections write dk, dv 2 d; d a = d h +
// dG[l+1] 3 d: (3 S + 11) d + 3 S + 2. The final GRN (L+1 sources): forward
// (L+2) d + L+1, backward (2 L + 4) d + L+1.
static double dca_floats(const Config& c, int) {
    double d = c.d, f = 0;
    for (int l = 0; l < c.L; l++) {
        double S = l + 1;
        f += (S + 7) * d + 3 * S + 2 + (3 * S + 11) * d + 3 * S + 2;
    }
    return f + (c.L + 2) * d + (c.L + 1) + (2 * c.L + 4) * d + (c.L + 1);
}
static StudyHooks dca_hooks() {
    StudyHooks h = {};
    h.weights = "GRN weights and K, V norms";
    h.attended = "raw (W_V of rmsnorm(y_v), the V input's own mixture of the blocks' outputs)";
    h.flops = dca_flops;
    h.floats = dca_floats;
    h.specs = dca_specs;
    h.carve = dca_carve;
    h.init = dca_init;
    h.acts_floats = [](const Config& c, int B) {
        DcaActs a = {};
        size_t off = 0;
        StudyTake take{nullptr, &off};
        dca_acts_carve(&a, c, (size_t)B * c.T, take);
        return off;
    };
    h.scratch_floats = [](const Config& c, int B, Device dev) { return dca_scratch_floats(c, (size_t)B * c.T, dev); };
    // forward
    h.stream_begin = [](const StudyAt& at, float*) { dca_grn_forward_at(at, 0); };  // x[0] = g[0], the embedding
    h.norm_input = [](const StudyAt& at, const float* x) -> const float* {
        return at.s % 2 ? x : dca_yq(at, dca_acts(at), at.l());  // the MLP's: h (xa)
    };
    h.kv_inputs = [](const StudyAt& at) {
        DcaActs a = dca_acts(at);
        size_t Nd = (size_t)at.N() * at.model->c.d;
        float* ak = a.a + (size_t)at.l() * 2 * Nd;
        return KvInputs{ak, ak + Nd, a.da, a.da + Nd};
    };
    h.residual_start = [](const StudyAt&, float*) -> float* { return nullptr; };  // no copy: the adds write their own
    h.residual_add = [](const StudyAt& at, float* xout, const float* inp, const float* W, int C) {
        int d = at.model->c.d;
        float* g = dca_stack(at, at.l() + 1);
        if (at.s % 2) return at.ops->matmul_forward(at.model, g, inp, W, at.N(), C, d, true);  // g[l+1] += m Wd^T
        at.ops->matmul_forward(at.model, g, inp, W, at.N(), C, d, false);                      // g[l+1] = a = o Wo^T
        op_dca_sum(at.model, xout, dca_yq(at, dca_acts(at), at.l()), g, (size_t)at.N() * d);   // h = y_q + a
    };
    h.block_end = [](const StudyAt& at, float*) {
        if (at.l() + 1 < at.model->c.L) dca_grn_forward_at(at, at.l() + 1);
    };
    h.final_input = [](const StudyAt& at, float*) -> const float* {
        dca_grn_forward_at(at, at.model->c.L);
        return dca_acts(at).yf;
    };
    // backward
    h.final_input_backward = [](const StudyAt& at, float* dx) {  // dx: d y; dG written; then dx = 0
        dca_grn_backward_at(at, at.model->c.L, dx, true, false);
        return dx;
    };
    h.block_end_backward = [](const StudyAt& at, float* dx) {  // dx: d y_q of block l+1; then 0 (d h's start)
        if (at.l() + 1 < at.model->c.L) dca_grn_backward_at(at, at.l() + 1, dx, false, false);
    };
    h.residual_backward = [](const StudyAt& at, const float* dx) -> const float* {
        DcaActs a = dca_acts(at);
        size_t Nd = (size_t)at.N() * at.model->c.d;
        const float* dg = a.dG + (size_t)(at.l() + 1) * Nd;  // complete: blocks > l and the final GRN are done
        if (at.s % 2) return dg;                             // forward: g[l+1] += m Wd^T
        op_dca_sum(at.model, a.dout, dx, dg, Nd);            // forward: h = y_q + a, g[l+1] = a + ...
        return a.dout;
    };
    h.norm_input_backward = [](const StudyAt& at, const NormGrad& g) {  // dx += the norm's backward
        const float* in = at.s % 2 ? g.x : dca_yq(at, dca_acts(at), at.l());
        at.ops->rmsnorm_backward(at.model, g.dx, g.dg, at.lime.dnorm, in, g.g, g.rstd, at.N());
    };
    h.stream_begin_backward = [](const StudyAt& at, float* dx) {  // block 0's GRNs; dx = dG[0], the embedding's
        dca_grn_backward_at(at, 0, dx, false, true);
    };
    return h;
}
const StudyHooks DCA_HOOKS = dca_hooks();
