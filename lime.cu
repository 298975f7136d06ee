// lime.cu — LIMe (Layer-Integrated Memory, arXiv 2502.09245) beside its
// LLaMa baseline: the model, forward and backward of every op, and AdamW.
//
// Read it top to bottom. Each op has a CPU reference (plain loops, OpenMP)
// and, in the GPU build, its CUDA kernel right beside it with the same
// argument order: outputs, inputs, weights, sizes. The math is
// ../shared/SPEC.md; the names are its names:
//   B batch, T positions, V vocabulary, L layers, d width, H query heads,
//   R key/value heads, hd = d / H head size, F SwiGLU hidden size.
//
// LLaMa is LIMe without routers. In LIMe every layer keeps its keys and
// values in a buffer; layer l >= 1 attends not with its own K[l], V[l] but
// with a learned mixture of all buffered layers 0..l (Eq. 2):
//   Kr[t, r] = sum_{l' <= l, r'} W[l][r, l'*R + r'] * K[l'][t, r']
// That mixture, `router_forward`, is the one place the two models differ.
//
// Builds: g++ -x c++ lime.cu (CPU only); nvcc (CPU and GPU); g++ -DLIME_EMU
// with tests/cuda_emu.h (the CUDA kernels run on the CPU, for tests).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "data/rng.h"
#include "lime.h"
#include "safetensors.h"

#if defined(LIME_EMU)  // g++ with the harness: the CUDA code runs on the CPU
#include "tests/cuda_emu.h"
#define LIME_GPU 1
#elif defined(__CUDACC__)
#include <cublas_v2.h>
#include <cuda_runtime.h>
#define LIME_GPU 1
#define LAUNCH(kernel, grid, block, smem, stream) kernel<<<(grid), (block), (smem), (stream)>>>
#define DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

// ===========================================================================
// Config and parameters
// ===========================================================================

const char* arch_name(Arch a) { return a == ARCH_LIME ? "lime" : "llama"; }

bool arch_parse(const std::string& s, Arch* out) {
    if (s == "lime") { *out = ARCH_LIME; return true; }
    if (s == "llama") { *out = ARCH_LLAMA; return true; }
    return false;
}

std::string config_check(const Config& c) {
    char buf[256];
    auto fail = [&](const char* fmt, auto... args) { snprintf(buf, sizeof buf, fmt, args...); return std::string(buf); };
    if (c.V < 1) return fail("vocabulary size %d must be at least 1", c.V);
    if (c.L < 1) return fail("--layers %d must be at least 1", c.L);
    if (c.d < 2 || c.H < 1 || c.R < 1) return fail("--dim %d, --heads %d and --kv-heads %d must be positive", c.d, c.H, c.R);
    if (c.d % c.H) return fail("--dim %d is not divisible by --heads %d; pick a width that is a multiple of the heads", c.d, c.H);
    if (c.H % c.R) return fail("--heads %d is not divisible by --kv-heads %d; each kv head must serve a whole group of query heads", c.H, c.R);
    if (c.hd != c.d / c.H) return fail("head size %d differs from dim / heads = %d", c.hd, c.d / c.H);
    if (c.hd % 2) return fail("head size dim / heads = %d is odd; RoPE rotates pairs, choose an even head size", c.hd);
    if (c.F < 1) return fail("--ffn %d must be at least 1", c.F);
    if (c.T < 1) return fail("--seq-len %d must be at least 1", c.T);
    if (!(c.rope_theta > 0) || !(c.eps > 0)) return fail("rope_theta and rms_norm_eps must be positive");
    return "";
}

// Every tensor of the model, in memory order, with its checkpoint name and AdamW group.
std::vector<TensorSpec> param_specs(const Config& c) {
    std::vector<TensorSpec> specs;
    size_t offset = 0;
    auto add = [&](const std::string& name, std::vector<int> shape, Group group) {
        TensorSpec t;
        t.name = name;
        t.shape = shape;
        t.numel = 1;
        for (int s : shape) t.numel *= (size_t)s;
        t.offset = offset;
        t.group = group;
        offset += t.numel;
        specs.push_back(t);
    };
    add("model.embed_tokens.weight", {c.V, c.d}, GROUP_EMBED_GAIN);
    for (int l = 0; l < c.L; l++) {
        std::string p = "model.layers." + std::to_string(l) + ".";
        add(p + "input_layernorm.weight", {c.d}, GROUP_EMBED_GAIN);
        add(p + "self_attn.q_proj.weight", {c.H * c.hd, c.d}, GROUP_MATRIX);
        add(p + "self_attn.k_proj.weight", {c.R * c.hd, c.d}, GROUP_MATRIX);
        add(p + "self_attn.v_proj.weight", {c.R * c.hd, c.d}, GROUP_MATRIX);
        add(p + "self_attn.o_proj.weight", {c.d, c.H * c.hd}, GROUP_MATRIX);
        if (has_router(c, l)) add(p + "self_attn.router.weight", {c.R, (l + 1) * c.R}, GROUP_ROUTER);
        add(p + "post_attention_layernorm.weight", {c.d}, GROUP_EMBED_GAIN);
        add(p + "mlp.gate_proj.weight", {c.F, c.d}, GROUP_MATRIX);
        add(p + "mlp.up_proj.weight", {c.F, c.d}, GROUP_MATRIX);
        add(p + "mlp.down_proj.weight", {c.d, c.F}, GROUP_MATRIX);
    }
    add("model.norm.weight", {c.d}, GROUP_EMBED_GAIN);
    return specs;
}

size_t param_count(const Config& c) {
    std::vector<TensorSpec> s = param_specs(c);
    return s.back().offset + s.back().numel;
}

// Named pointers into one array laid out as param_specs says (the same walk).
Params params_carve(const Config& c, float* base) {
    Params p;
    std::vector<TensorSpec> specs = param_specs(c);
    size_t i = 0;
    auto next = [&]() { return base + specs[i++].offset; };
    p.E = next();
    p.layer.resize(c.L);
    for (int l = 0; l < c.L; l++) {
        LayerParams& w = p.layer[l];
        w.g_attn = next();
        w.Wq = next();
        w.Wk = next();
        w.Wv = next();
        w.Wo = next();
        w.router = has_router(c, l) ? next() : nullptr;
        w.g_mlp = next();
        w.Wg = next();
        w.Wu = next();
        w.Wd = next();
    }
    p.g_final = next();
    return p;
}

// ===========================================================================
// Activations: everything backward needs, one allocation for (B, T) tokens.
// Strides inside use the batch of the current call (B, T <= the allocation).
// ===========================================================================

struct Acts {
    float* mem = nullptr;
    // forward, kept for backward
    float* x;        // (L+1, B, T, d) residual stream entering layer l; x[L] enters the final norm
    float* xa;       // (L, B, T, d)   residual stream after attention
    float* a;        // (L, B, T, d)   rmsnorm(x) entering attention
    float* rstd_a;   // (L, B, T)
    float* q;        // (L, B, T, H, hd) queries after RoPE
    float* Kbuf;     // (L, B, T, R, hd) the KV buffer: each layer's own keys, before RoPE
    float* Vbuf;     // (L, B, T, R, hd) ... and values
    float* kr;       // (L, B, T, R, hd) keys attention reads (routed, after RoPE)
    float* vr;       // (L, B, T, R, hd) values attention reads (routed; unused without a router)
    float* att;      // (L, B, H, T, T) attention probabilities
    float* o;        // (L, B, T, H*hd) attention output, heads concatenated
    float* m;        // (L, B, T, d)   rmsnorm(xa) entering the MLP
    float* rstd_m;   // (L, B, T)
    float* gate;     // (L, B, T, F)   m @ Wg^T
    float* up;       // (L, B, T, F)   m @ Wu^T
    float* h;        // (L, B, T, F)   silu(gate) * up
    float* hf;       // (B, T, d)      final rmsnorm
    float* rstd_f;   // (B, T)
    float* logits;   // (B, T, V)
    float* probs;    // (B, T, V)      softmax(logits); backward turns it into dlogits
    float* nll;      // (B, T)         -log p(target)
    int* targets;    // (B, T)         copies of the batch, for backward
    float* mask;     // (B, T)
    int* tokens;     // (B, T)
    // backward scratch
    float* dx;       // (B, T, d) gradient of the residual stream
    float* dnorm;    // (B, T, d) gradient of a norm's output
    float* dq;       // (B, T, H, hd)
    float* dkr;      // (B, T, R, hd)
    float* dvr;      // (B, T, R, hd)
    float* dKbuf;    // (L, B, T, R, hd) gradient of the KV buffer, filled by layers >= l
    float* dVbuf;    // (L, B, T, R, hd)
    float* dout;     // (B, T, H*hd) gradient of the attention output
    float* dgate;    // (B, T, F)
    float* dup;      // (B, T, F)
    float* dh;       // (B, T, F)
    float* datt;     // (B, H, T, T) attention scratch
    float* kt;       // (B, R, hd, T) attention scratch: keys, values and their gradients transposed
    float* vt;
    float* dkt;
    float* dvt;
    float* scratch;  // matmul transposes: max(B*T, max rows of a weight) * max(V, F, d, H*hd)
    float* rope_cos; // (T, hd/2)
    float* rope_sin; // (T, hd/2)
};

// Carves (or, with base == nullptr, only measures) the activations.
static size_t acts_carve(Acts* A, const Config& c, int B, float* base) {
    size_t BT = (size_t)B * c.T, L = c.L, d = c.d, qd = (size_t)c.H * c.hd, kvd = (size_t)c.R * c.hd;
    size_t wide = std::max({(size_t)c.V, (size_t)c.F, d, qd});
    size_t rows = std::max({BT, (size_t)c.V, (size_t)c.F, d, qd});
    size_t off = 0;
    auto take = [&](float** p, size_t n) { if (base) *p = base + off; off += (n + 15) & ~(size_t)15; };
    auto take_int = [&](int** p, size_t n) { if (base) *p = (int*)(base + off); off += (n + 15) & ~(size_t)15; };
    take(&A->x, (L + 1) * BT * d);
    take(&A->xa, L * BT * d);
    take(&A->a, L * BT * d);
    take(&A->rstd_a, L * BT);
    take(&A->q, L * BT * qd);
    take(&A->Kbuf, L * BT * kvd);
    take(&A->Vbuf, L * BT * kvd);
    take(&A->kr, L * BT * kvd);
    take(&A->vr, L * BT * kvd);
    take(&A->att, L * BT * c.H * c.T);
    take(&A->o, L * BT * qd);
    take(&A->m, L * BT * d);
    take(&A->rstd_m, L * BT);
    take(&A->gate, L * BT * c.F);
    take(&A->up, L * BT * c.F);
    take(&A->h, L * BT * c.F);
    take(&A->hf, BT * d);
    take(&A->rstd_f, BT);
    take(&A->logits, BT * c.V);
    take(&A->probs, BT * c.V);
    take(&A->nll, BT);
    take_int(&A->targets, BT);
    take(&A->mask, BT);
    take_int(&A->tokens, BT);
    take(&A->dx, BT * d);
    take(&A->dnorm, BT * d);
    take(&A->dq, BT * qd);
    take(&A->dkr, BT * kvd);
    take(&A->dvr, BT * kvd);
    take(&A->dKbuf, L * BT * kvd);
    take(&A->dVbuf, L * BT * kvd);
    take(&A->dout, BT * qd);
    take(&A->dgate, BT * c.F);
    take(&A->dup, BT * c.F);
    take(&A->dh, BT * c.F);
    take(&A->datt, BT * c.H * c.T);
    take(&A->kt, BT * kvd);
    take(&A->vt, BT * kvd);
    take(&A->dkt, BT * kvd);
    take(&A->dvt, BT * kvd);
    take(&A->scratch, rows * wide + wide * std::max(d, (size_t)c.F));
    take(&A->rope_cos, (size_t)c.T * c.hd / 2);
    take(&A->rope_sin, (size_t)c.T * c.hd / 2);
    return off;
}

// Sums that must not depend on the thread count (resuming is bit-exact):
// a fixed number of chunks, each summed in order, then the chunks in order.
static const int CHUNKS = 64;
static double sum_in_order(const double* part, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += part[i];
    return s;
}

// ===========================================================================
// Matrix products. One CPU kernel, C (+)= A @ B, row-major; the model's
// products are that kernel after a transpose. On the GPU, cuBLAS.
// ===========================================================================

// C[M, N] (+)= A[M, K] @ B[K, N]; lda, ldb, ldc are row strides.
// Tiles of 4 rows x 32 columns of C live in registers while k runs; the
// innermost loop over 32 contiguous columns is what the compiler vectorises.
static void gemm_cpu(float* C, const float* A, const float* Bm, int M, int N, int K, int lda, int ldb, int ldc, bool accumulate) {
    const int MR = 4, NR = 32;
    int row_tiles = (M + MR - 1) / MR, col_tiles = (N + NR - 1) / NR;
#pragma omp parallel for collapse(2) schedule(static) if ((double)M * N * K > 32768)
    for (int rt = 0; rt < row_tiles; rt++) {
        for (int ct = 0; ct < col_tiles; ct++) {
            int i0 = rt * MR, j0 = ct * NR;
            int mr = std::min(MR, M - i0), nr = std::min(NR, N - j0);
            float acc[MR][NR] = {};
            if (mr == MR && nr == NR) {  // the fast, fixed-size path
                for (int k = 0; k < K; k++) {
                    const float* b = Bm + (size_t)k * ldb + j0;
                    for (int i = 0; i < MR; i++) {
                        float aik = A[(size_t)(i0 + i) * lda + k];
                        for (int j = 0; j < NR; j++) acc[i][j] += aik * b[j];
                    }
                }
            } else {  // edge tiles
                for (int k = 0; k < K; k++) {
                    const float* b = Bm + (size_t)k * ldb + j0;
                    for (int i = 0; i < mr; i++) {
                        float aik = A[(size_t)(i0 + i) * lda + k];
                        for (int j = 0; j < nr; j++) acc[i][j] += aik * b[j];
                    }
                }
            }
            for (int i = 0; i < mr; i++) {
                float* c = C + (size_t)(i0 + i) * ldc + j0;
                for (int j = 0; j < nr; j++) c[j] = accumulate ? c[j] + acc[i][j] : acc[i][j];
            }
        }
    }
}

// dst[cols, rows] = src[rows, cols]^T
static void transpose(float* dst, const float* src, int rows, int cols) {
#pragma omp parallel for schedule(static) if ((size_t)rows * cols > 65536)
    for (int j = 0; j < cols; j++)
        for (int i = 0; i < rows; i++) dst[(size_t)j * rows + i] = src[(size_t)i * cols + j];
}

// out (N, OC) (+)= inp (N, C) @ W^T, W (OC, C): every projection of the model.
static void matmul_forward(float* out, const float* inp, const float* W, int N, int C, int OC, float* scratch, bool accumulate = false) {
    transpose(scratch, W, OC, C);  // (C, OC)
    gemm_cpu(out, inp, scratch, N, OC, C, C, OC, OC, accumulate);
}

// forward: out = inp @ W^T
// dinp (N, C) += dout (N, OC) @ W (OC, C);  dW (OC, C) += dout^T @ inp
static void matmul_backward(float* dinp, float* dW, const float* dout, const float* inp, const float* W, int N, int C, int OC, float* scratch) {
    if (dinp) gemm_cpu(dinp, dout, W, N, C, OC, OC, C, C, true);
    transpose(scratch, dout, N, OC);  // (OC, N)
    gemm_cpu(dW, scratch, inp, OC, C, N, N, C, C, true);
}

// ===========================================================================
// Token embedding: x[t] = E[token[t]]
// ===========================================================================

static void embedding_forward(float* out, const int* tokens, const float* E, int N, int d) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) memcpy(out + (size_t)n * d, E + (size_t)tokens[n] * d, d * sizeof(float));
}

// forward: out[n] = E[tokens[n]];  dE[tokens[n]] += dout[n]
// One row after another: positions sharing a token add in a fixed order (deterministic).
static void embedding_backward(float* dE, const float* dout, const int* tokens, int N, int d) {
    for (int n = 0; n < N; n++) {
        float* row = dE + (size_t)tokens[n] * d;
        const float* g = dout + (size_t)n * d;
        for (int i = 0; i < d; i++) row[i] += g[i];
    }
}

// ===========================================================================
// RMSNorm: y_i = x_i * rstd * g_i,  rstd = 1 / sqrt(mean_j x_j^2 + eps)
// ===========================================================================

static void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* g, int N, int d, float eps) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * d;
        float* y = out + (size_t)n * d;
        float ss = 0;
        for (int i = 0; i < d; i++) ss += x[i] * x[i];
        float r = 1.0f / sqrtf(ss / d + eps);
        for (int i = 0; i < d; i++) y[i] = x[i] * r * g[i];
        rstd[n] = r;
    }
}

// forward: y_i = x_i * r * g_i
// dx_i += r * g_i * dy_i - x_i * r^3 * mean_j(g_j * dy_j * x_j)
// dg_i += sum_n dy_i * x_i * r
static void rmsnorm_backward(float* dinp, float* dg, const float* dout, const float* inp, const float* g, const float* rstd, int N, int d) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * d;
        const float* dy = dout + (size_t)n * d;
        float* dx = dinp + (size_t)n * d;
        float r = rstd[n], dot = 0;
        for (int i = 0; i < d; i++) dot += g[i] * dy[i] * x[i];
        float c = r * r * r * dot / d;
        for (int i = 0; i < d; i++) dx[i] += r * g[i] * dy[i] - x[i] * c;
    }
    // dg: one column per iteration, rows in order, so the sum is the same for any thread count
#pragma omp parallel for schedule(static)
    for (int i = 0; i < d; i++) {
        float s = 0;
        for (int n = 0; n < N; n++) s += dout[(size_t)n * d + i] * inp[(size_t)n * d + i] * rstd[n];
        dg[i] += s;
    }
}

// ===========================================================================
// RoPE, HF half-split: for i < hd/2, with angle t * theta^(-2i/hd),
//   y_i = x_i cos - x_{i+hd/2} sin,   y_{i+hd/2} = x_{i+hd/2} cos + x_i sin
// ===========================================================================

// cos, sin (T, hd/2), computed in double and rounded once.
static void rope_tables(float* cos_t, float* sin_t, int T, int hd, float theta) {
    for (int t = 0; t < T; t++)
        for (int i = 0; i < hd / 2; i++) {
            double angle = t * std::pow((double)theta, -2.0 * i / hd);
            cos_t[t * hd / 2 + i] = (float)std::cos(angle);
            sin_t[t * hd / 2 + i] = (float)std::sin(angle);
        }
}

// x (B, T, nh, hd) rotated in place; sign = +1 forward, -1 backward.
// The rotation is orthogonal, so its backward is the rotation by -angle.
static void rope_rotate(float* x, const float* cos_t, const float* sin_t, int B, int T, int nh, int hd, float sign) {
    int half = hd / 2;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float* cs = cos_t + t * half;
            const float* sn = sin_t + t * half;
            for (int h = 0; h < nh; h++) {
                float* v = x + (((size_t)b * T + t) * nh + h) * hd;
                for (int i = 0; i < half; i++) {
                    float x0 = v[i], x1 = v[i + half], s = sign * sn[i];
                    v[i] = x0 * cs[i] - x1 * s;
                    v[i + half] = x1 * cs[i] + x0 * s;
                }
            }
        }
}

static void rope_forward(float* x, const float* cos_t, const float* sin_t, int B, int T, int nh, int hd) {
    rope_rotate(x, cos_t, sin_t, B, T, nh, hd, 1.0f);
}
// forward: y = Rot(t) x;  dx = Rot(t)^T dy = Rot(-t) dy, in place
static void rope_backward(float* dx, const float* cos_t, const float* sin_t, int B, int T, int nh, int hd) {
    rope_rotate(dx, cos_t, sin_t, B, T, nh, hd, -1.0f);
}

// ===========================================================================
// The KV router (Eq. 2): layer l's keys and values are a learned mixture of
// the buffered keys and values of layers 0..l, mixed per position:
//   Kr[n, r, :] = sum_{j < (l+1)R} W[r, j] * Kbuf[j / R][n, j % R, :]
// Column j = l'*R + r' reads layer l', kv head r'. Kbuf is (L, N, R, hd), so
// layer l' sits at Kbuf + l' * N*R*hd. Keys and values share W.
// ===========================================================================

static void router_forward(float* Kr, float* Vr, const float* W, const float* Kbuf, const float* Vbuf, int l, int N, int R, int hd) {
    size_t layer = (size_t)N * R * hd;  // stride between buffered layers
    int J = (l + 1) * R;                 // router columns
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int r = 0; r < R; r++) {
            float* kr = Kr + ((size_t)n * R + r) * hd;
            float* vr = Vr + ((size_t)n * R + r) * hd;
            for (int i = 0; i < hd; i++) kr[i] = vr[i] = 0;
            for (int j = 0; j < J; j++) {
                float w = W[r * J + j];
                size_t src = (j / R) * layer + ((size_t)n * R + j % R) * hd;
                for (int i = 0; i < hd; i++) {
                    kr[i] += w * Kbuf[src + i];
                    vr[i] += w * Vbuf[src + i];
                }
            }
        }
}

// forward: Kr[n,r,:] = sum_j W[r,j] * Kbuf_j[n,:]  (and Vr likewise)
// dW[r,j]      += sum_{n,i} dKr[n,r,i] * Kbuf_j[n,i] + dVr[n,r,i] * Vbuf_j[n,i]
// dKbuf_j[n,:] += sum_r W[r,j] * dKr[n,r,:]        (and dVbuf likewise)
// This is where the gradient reaches the keys and values of earlier layers.
static void router_backward(float* dW, float* dKbuf, float* dVbuf, const float* dKr, const float* dVr, const float* W,
                            const float* Kbuf, const float* Vbuf, int l, int N, int R, int hd) {
    size_t layer = (size_t)N * R * hd;
    int J = (l + 1) * R;
#pragma omp parallel for schedule(static)
    for (int rj = 0; rj < R * J; rj++) {
        int r = rj / J, j = rj % J;
        size_t src = (j / R) * layer + (size_t)(j % R) * hd;
        float s = 0;
        for (int n = 0; n < N; n++) {
            const float* dk = dKr + ((size_t)n * R + r) * hd;
            const float* dv = dVr + ((size_t)n * R + r) * hd;
            const float* k = Kbuf + src + (size_t)n * R * hd;
            const float* v = Vbuf + src + (size_t)n * R * hd;
            for (int i = 0; i < hd; i++) s += dk[i] * k[i] + dv[i] * v[i];
        }
        dW[rj] += s;
    }
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int j = 0; j < J; j++) {
            size_t dst = (j / R) * layer + ((size_t)n * R + j % R) * hd;
            for (int r = 0; r < R; r++) {
                float w = W[r * J + j];
                const float* dk = dKr + ((size_t)n * R + r) * hd;
                const float* dv = dVr + ((size_t)n * R + r) * hd;
                for (int i = 0; i < hd; i++) {
                    dKbuf[dst + i] += w * dk[i];
                    dVbuf[dst + i] += w * dv[i];
                }
            }
        }
}

// ===========================================================================
// Causal GQA attention. Query head h reads kv head h / (H / R).
//   s[h,t,u] = q[t,h] . k[u,h/n_rep] / sqrt(hd)  (u <= t);  p = softmax_u(s)
//   o[t,h]   = sum_u p[h,t,u] * v[u,h/n_rep]
// ===========================================================================

// (B, T, R, hd) -> (B, R, hd, T): each kv head's keys as rows over positions,
// so that the loops over positions u below run over contiguous memory and
// vectorise (hd is often 8: too short a loop to vectorise on its own).
static void kv_transpose(float* dst, const float* src, int B, int T, int R, int hd) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int r = 0; r < R; r++)
            for (int t = 0; t < T; t++)
                for (int i = 0; i < hd; i++)
                    dst[(((size_t)b * R + r) * hd + i) * T + t] = src[(((size_t)b * T + t) * R + r) * hd + i];
}

// out (B, T, H, hd), att (B, H, T, T); q (B, T, H, hd); k, v (B, T, R, hd);
// kt, vt (B, R, hd, T) scratch for the transposed keys and values.
static void attention_forward(float* out, float* att, const float* q, const float* k, const float* v, float* kt, float* vt,
                              int B, int T, int H, int R, int hd) {
    int n_rep = H / R;
    float scale = 1.0f / sqrtf((float)hd);
    kv_transpose(kt, k, B, T, R, hd);
    kv_transpose(vt, v, B, T, R, hd);
#pragma omp parallel for collapse(3) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                const float* qt = q + (((size_t)b * T + t) * H + h) * hd;
                const float* Kt = kt + ((size_t)b * R + h / n_rep) * hd * T;  // (hd, T)
                const float* Vt = vt + ((size_t)b * R + h / n_rep) * hd * T;
                float* p = att + (((size_t)b * H + h) * T + t) * T;
                for (int u = 0; u <= t; u++) p[u] = 0;
                for (int i = 0; i < hd; i++) {
                    float qi = qt[i] * scale;
                    const float* Ki = Kt + (size_t)i * T;
#pragma omp simd
                    for (int u = 0; u <= t; u++) p[u] += qi * Ki[u];
                }
                float maxs = -INFINITY, sum = 0;
                for (int u = 0; u <= t; u++) maxs = std::max(maxs, p[u]);
                for (int u = 0; u <= t; u++) { p[u] = expf(p[u] - maxs); sum += p[u]; }
                for (int u = 0; u <= t; u++) p[u] /= sum;
                for (int u = t + 1; u < T; u++) p[u] = 0;
                float* o = out + (((size_t)b * T + t) * H + h) * hd;
                for (int i = 0; i < hd; i++) {
                    const float* Vi = Vt + (size_t)i * T;
                    float s = 0;
#pragma omp simd reduction(+ : s)
                    for (int u = 0; u <= t; u++) s += p[u] * Vi[u];
                    o[i] = s;
                }
            }
}

// forward: o[t] = sum_u p[t,u] v[u],  p = softmax(s),  s[t,u] = q[t].k[u] * scale
// dp[t,u] = dout[t] . v[u]                  dv[u] += sum_t p[t,u] dout[t]
// ds[t,u] = p[t,u] (dp[t,u] - sum_u' p[t,u'] dp[t,u'])
// dq[t]   = scale * sum_u ds[t,u] k[u]      dk[u] += scale * sum_t ds[t,u] q[t]
// dq is written; dk and dv are added to. One (b, kv head) per iteration: the
// query heads sharing a kv head add into its gradient one after another.
static void attention_backward(float* dq, float* dk, float* dv, float* datt, float* kt, float* vt, float* dkt, float* dvt,
                               const float* dout, const float* q, const float* k, const float* v, const float* att,
                               int B, int T, int H, int R, int hd) {
    int n_rep = H / R;
    float scale = 1.0f / sqrtf((float)hd);
    kv_transpose(kt, k, B, T, R, hd);
    kv_transpose(vt, v, B, T, R, hd);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int r = 0; r < R; r++) {
            size_t kv = ((size_t)b * R + r) * hd * T;
            const float *Kt = kt + kv, *Vt = vt + kv;  // (hd, T)
            float *dKt = dkt + kv, *dVt = dvt + kv;
            memset(dKt, 0, (size_t)hd * T * sizeof(float));
            memset(dVt, 0, (size_t)hd * T * sizeof(float));
            for (int h = r * n_rep; h < (r + 1) * n_rep; h++)
                for (int t = 0; t < T; t++) {
                    const float* p = att + (((size_t)b * H + h) * T + t) * T;
                    float* ds = datt + (((size_t)b * H + h) * T + t) * T;
                    const float* go = dout + (((size_t)b * T + t) * H + h) * hd;
                    const float* qt = q + (((size_t)b * T + t) * H + h) * hd;
                    float* gq = dq + (((size_t)b * T + t) * H + h) * hd;
                    for (int u = 0; u <= t; u++) ds[u] = 0;
                    for (int i = 0; i < hd; i++) {
                        const float* Vi = Vt + (size_t)i * T;
                        float g = go[i];
#pragma omp simd
                        for (int u = 0; u <= t; u++) ds[u] += g * Vi[u];  // dp
                    }
                    float pdp = 0;
#pragma omp simd reduction(+ : pdp)
                    for (int u = 0; u <= t; u++) pdp += p[u] * ds[u];
#pragma omp simd
                    for (int u = 0; u <= t; u++) ds[u] = p[u] * (ds[u] - pdp);
                    for (int i = 0; i < hd; i++) {
                        const float* Ki = Kt + (size_t)i * T;
                        float* dKi = dKt + (size_t)i * T;
                        float* dVi = dVt + (size_t)i * T;
                        float s = 0, qs = scale * qt[i], g = go[i];
#pragma omp simd reduction(+ : s)
                        for (int u = 0; u <= t; u++) {
                            s += ds[u] * Ki[u];
                            dKi[u] += qs * ds[u];
                            dVi[u] += g * p[u];
                        }
                        gq[i] = scale * s;
                    }
                }
            for (int u = 0; u < T; u++)
                for (int i = 0; i < hd; i++) {
                    dk[(((size_t)b * T + u) * R + r) * hd + i] += dKt[i * T + u];
                    dv[(((size_t)b * T + u) * R + r) * hd + i] += dVt[i * T + u];
                }
        }
}

// ===========================================================================
// SwiGLU: h = silu(gate) * up,  silu(z) = z / (1 + exp(-z))
// ===========================================================================

static void swiglu_forward(float* out, const float* gate, const float* up, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

// forward: h = silu(g) * u
// dg = dh * u * silu'(g),  silu'(g) = s (1 + g (1 - s)),  s = sigmoid(g);   du = dh * silu(g)
static void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i], s = 1.0f / (1.0f + expf(-g));
        dgate[i] = dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
        dup[i] = dout[i] * g * s;
    }
}

// ===========================================================================
// Softmax cross-entropy over the masked positions of the whole batch:
//   loss = sum_n mask[n] * -log softmax(logits[n])[target[n]] / sum_n mask[n]
// ===========================================================================

// probs (N, V), nll (N); returns the loss (0 when the mask is all 0).
static float crossentropy_forward(float* probs, float* nll, const float* logits, const int* targets, const float* mask, int N, int V) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* z = logits + (size_t)n * V;
        float* p = probs + (size_t)n * V;
        float maxz = z[0];
        for (int i = 1; i < V; i++) maxz = std::max(maxz, z[i]);
        double sum = 0;
        for (int i = 0; i < V; i++) { p[i] = expf(z[i] - maxz); sum += p[i]; }
        for (int i = 0; i < V; i++) p[i] = (float)(p[i] / sum);
        nll[n] = (float)(std::log(sum) + maxz - z[targets[n]]);
    }
    double total = 0, count = 0;
    for (int n = 0; n < N; n++) { total += (double)mask[n] * nll[n]; count += mask[n]; }
    return count > 0 ? (float)(total / count) : 0.0f;
}

// forward: loss = sum_n mask[n] nll[n] / sum mask
// dlogits[n] = mask[n] / sum(mask) * (softmax(logits[n]) - onehot(target[n])), in place over probs
static void crossentropy_backward(float* dlogits_probs, const int* targets, const float* mask, int N, int V) {
    double count = 0;
    for (int n = 0; n < N; n++) count += mask[n];
    float w = count > 0 ? (float)(1.0 / count) : 0.0f;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float* g = dlogits_probs + (size_t)n * V;
        float s = mask[n] * w;
        for (int i = 0; i < V; i++) g[i] *= s;
        g[targets[n]] -= s;
    }
}

// ===========================================================================
// AdamW (SPEC.md): global-norm clipping, then per tensor with its group's
// lr and weight decay:
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr*wd*p + lr * (m / (1-b1^s)) / (sqrt(v / (1-b2^s)) + eps)
// ===========================================================================

float lr_factor(int s, int warmup, int steps, Schedule sched, float min_lr_ratio) {
    if (warmup > 0 && s <= warmup) return (float)s / warmup;
    if (sched == SCHED_CONSTANT) return 1.0f;
    double f = (double)(s - warmup) / std::max(1, steps - warmup);
    double x = sched == SCHED_COSINE ? 0.5 * (1.0 + std::cos(M_PI * f)) : 1.0 - f;
    return (float)std::max((double)min_lr_ratio, x);
}

static double grad_sumsq(const float* g, size_t n) {
    double part[CHUNKS] = {};
#pragma omp parallel for schedule(static)
    for (int c = 0; c < CHUNKS; c++)
        for (size_t i = n * c / CHUNKS; i < n * (c + 1) / CHUNKS; i++) part[c] += (double)g[i] * g[i];
    return sum_in_order(part, CHUNKS);
}

static void adamw_cpu(float* p, float* m, float* v, const float* g, size_t n, float lr, float wd, float grad_scale,
                      const AdamWConfig& o, float bc1, float bc2) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * grad_scale;
        m[i] = o.beta1 * m[i] + (1.0f - o.beta1) * gi;
        v[i] = o.beta2 * v[i] + (1.0f - o.beta2) * gi * gi;
        float mhat = m[i] / bc1, vhat = v[i] / bc2;
        p[i] -= lr * wd * p[i] + lr * mhat / (sqrtf(vhat) + o.eps);
    }
}

// lr and weight decay of a tensor's group, times the schedule factor.
static void group_lr(const TensorSpec& t, const AdamWConfig& o, float factor, float* lr, float* wd) {
    *lr = (t.group == GROUP_ROUTER ? o.router_lr : o.lr) * factor;
    *wd = t.group == GROUP_MATRIX ? o.weight_decay : 0.0f;
}

// ===========================================================================
// The model on the CPU
// ===========================================================================

#ifdef LIME_GPU
static std::string gpu_create(Model* m);
static void gpu_free(Model* m);
static float gpu_forward(Model* m, const int* tokens, const int* targets, const float* mask, int B, int T);
static void gpu_backward(Model* m);
static float gpu_update(Model* m, const AdamWConfig& opt, float factor);
static void gpu_to_device(Model* m);
static void gpu_to_host(Model* m);
static void gpu_train_step(Model* m, const int* tokens, const int* targets, const float* mask, int B, int T,
                           const AdamWConfig& opt, float factor);
static void gpu_metrics(Model* m);
#endif

std::string model_create(Model* m, const Config& c, int B, Device dev) {
    std::string err = config_check(c);
    if (!err.empty()) return err;
    if (B < 1) return "--batch must be at least 1";
    m->c = c;
    m->B = B;
    m->device = dev;
    m->specs = param_specs(c);
    m->n_params = param_count(c);
    // parameters, gradients, m, v: one allocation each group
    size_t n = m->n_params;
    m->params = (float*)calloc(n * 4, sizeof(float));
    if (!m->params) return "out of memory allocating " + std::to_string(n * 16 / 1000000) + " MB for parameters and optimiser state";
    m->grads = m->params + n;
    m->m = m->params + 2 * n;
    m->v = m->params + 3 * n;
    m->p = params_carve(c, m->params);
    m->g = params_carve(c, m->grads);
    m->acts = new Acts();
    size_t na = acts_carve(m->acts, c, B, nullptr);
    float* mem = (float*)calloc(na, sizeof(float));
    if (!mem) {
        char buf[200];
        snprintf(buf, sizeof buf, "out of memory: activations need %.1f GB at batch %d x %d positions; lower --batch or --seq-len",
                 na * 4.0 / 1e9, B, c.T);
        return buf;
    }
    acts_carve(m->acts, c, B, mem);
    m->acts->mem = mem;
    rope_tables(m->acts->rope_cos, m->acts->rope_sin, c.T, c.hd, c.rope_theta);
    m->step = 0;
#ifdef LIME_GPU
    if (dev == DEVICE_GPU) return gpu_create(m);
#else
    if (dev == DEVICE_GPU) return "this build has no GPU support (built without nvcc); use --device cpu, or install the CUDA Toolkit and run make";
#endif
    return "";
}

void model_free(Model* m) {
#ifdef LIME_GPU
    if (m->gpu) gpu_free(m);
#endif
    if (m->acts) { free(m->acts->mem); delete m->acts; }
    free(m->params);
    m->acts = nullptr;
    m->params = nullptr;
}

void model_init(Model* m, uint64_t seed) {
    const Config& c = m->c;
    for (const TensorSpec& t : m->specs) {
        float* p = m->params + t.offset;
        Rng rng(seed_for(seed, t.name));
        if (t.group == GROUP_ROUTER) {
            // uniform in [-b, b], b = sqrt(3 / ((l+1) R)), then the last R x R block = I
            int J = t.shape[1], R = c.R;
            double b = std::sqrt(3.0 / J);
            for (size_t i = 0; i < t.numel; i++) p[i] = (float)((2.0 * rng.uniform() - 1.0) * b);
            for (int r = 0; r < R; r++)
                for (int k = 0; k < R; k++) p[r * J + (J - R) + k] = r == k ? 1.0f : 0.0f;
        } else if (t.shape.size() == 1) {
            for (size_t i = 0; i < t.numel; i++) p[i] = 1.0f;  // RMSNorm gains
        } else {
            for (size_t i = 0; i < t.numel; i++) p[i] = (float)(0.02 * rng.normal());
        }
    }
    memset(m->m, 0, 2 * m->n_params * sizeof(float));
    m->step = 0;
#ifdef LIME_GPU
    if (m->device == DEVICE_GPU) gpu_to_device(m);
#endif
}

// Pointers of layer l's activations for a (B, T) batch: per-layer strides are B*T*width.
struct LayerActs {
    float *x, *xa, *xnext, *a, *rstd_a, *q, *K, *V, *kr, *vr, *att, *o, *m, *rstd_m, *gate, *up, *h;
};
static LayerActs layer_acts(const Acts* A, const Config& c, int l, int B, int T) {
    size_t BT = (size_t)B * T, d = c.d, qd = (size_t)c.H * c.hd, kvd = (size_t)c.R * c.hd;
    LayerActs la;
    la.x = A->x + l * BT * d;
    la.xnext = A->x + (l + 1) * BT * d;
    la.xa = A->xa + l * BT * d;
    la.a = A->a + l * BT * d;
    la.rstd_a = A->rstd_a + l * BT;
    la.q = A->q + l * BT * qd;
    la.K = A->Kbuf + l * BT * kvd;
    la.V = A->Vbuf + l * BT * kvd;
    la.kr = A->kr + l * BT * kvd;
    la.vr = A->vr + l * BT * kvd;
    la.att = A->att + l * BT * c.H * T;
    la.o = A->o + l * BT * qd;
    la.m = A->m + l * BT * d;
    la.rstd_m = A->rstd_m + l * BT;
    la.gate = A->gate + l * BT * c.F;
    la.up = A->up + l * BT * c.F;
    la.h = A->h + l * BT * c.F;
    return la;
}

static float cpu_forward(Model* m, const int* tokens, const int* targets, const float* mask, int B, int T) {
    const Config& c = m->c;
    Acts* A = m->acts;
    int N = B * T, d = c.d, qd = c.H * c.hd, kvd = c.R * c.hd;
    memcpy(A->tokens, tokens, N * sizeof(int));
    embedding_forward(A->x, tokens, m->p.E, N, d);  // x[0] (B, T, d)
    for (int l = 0; l < c.L; l++) {
        const LayerParams& w = m->p.layer[l];
        LayerActs la = layer_acts(A, c, l, B, T);
        // attention block
        rmsnorm_forward(la.a, la.rstd_a, la.x, w.g_attn, N, d, c.eps);
        matmul_forward(la.q, la.a, w.Wq, N, d, qd, A->scratch);  // (B, T, H, hd)
        matmul_forward(la.K, la.a, w.Wk, N, d, kvd, A->scratch); // (B, T, R, hd) into the buffer
        matmul_forward(la.V, la.a, w.Wv, N, d, kvd, A->scratch);
        const float* vr = la.V;
        if (has_router(c, l)) {  // LIMe: mix the buffer of layers 0..l
            router_forward(la.kr, la.vr, w.router, A->Kbuf, A->Vbuf, l, N, c.R, c.hd);
            vr = la.vr;
        } else {                 // LLaMa, and LIMe's layer 0: own keys and values
            memcpy(la.kr, la.K, (size_t)N * kvd * sizeof(float));
        }
        rope_forward(la.q, A->rope_cos, A->rope_sin, B, T, c.H, c.hd);
        rope_forward(la.kr, A->rope_cos, A->rope_sin, B, T, c.R, c.hd);
        attention_forward(la.o, la.att, la.q, la.kr, vr, A->kt, A->vt, B, T, c.H, c.R, c.hd);
        memcpy(la.xa, la.x, (size_t)N * d * sizeof(float));
        matmul_forward(la.xa, la.o, w.Wo, N, qd, d, A->scratch, true);  // xa = x + o @ Wo^T
        // MLP block
        rmsnorm_forward(la.m, la.rstd_m, la.xa, w.g_mlp, N, d, c.eps);
        matmul_forward(la.gate, la.m, w.Wg, N, d, c.F, A->scratch);
        matmul_forward(la.up, la.m, w.Wu, N, d, c.F, A->scratch);
        swiglu_forward(la.h, la.gate, la.up, (size_t)N * c.F);
        memcpy(la.xnext, la.xa, (size_t)N * d * sizeof(float));
        matmul_forward(la.xnext, la.h, w.Wd, N, c.F, d, A->scratch, true);  // x = xa + h @ Wd^T
    }
    float* xL = A->x + (size_t)c.L * N * d;
    rmsnorm_forward(A->hf, A->rstd_f, xL, m->p.g_final, N, d, c.eps);
    matmul_forward(A->logits, A->hf, m->p.E, N, d, c.V, A->scratch);  // tied: logits = hf @ E^T
    if (!targets) return 0;
    memcpy(A->targets, targets, N * sizeof(int));
    memcpy(A->mask, mask, N * sizeof(float));
    return crossentropy_forward(A->probs, A->nll, A->logits, targets, mask, N, c.V);
}

static void cpu_backward(Model* m, int B, int T) {
    const Config& c = m->c;
    Acts* A = m->acts;
    int N = B * T, d = c.d, qd = c.H * c.hd, kvd = c.R * c.hd;
    size_t kv_layer = (size_t)N * kvd;
    memset(m->grads, 0, m->n_params * sizeof(float));
    memset(A->dKbuf, 0, c.L * kv_layer * sizeof(float));
    memset(A->dVbuf, 0, c.L * kv_layer * sizeof(float));
    // loss -> logits -> final norm
    float* dlogits = A->probs;
    crossentropy_backward(dlogits, A->targets, A->mask, N, c.V);
    memset(A->dnorm, 0, (size_t)N * d * sizeof(float));
    matmul_backward(A->dnorm, m->g.E, dlogits, A->hf, m->p.E, N, d, c.V, A->scratch);
    memset(A->dx, 0, (size_t)N * d * sizeof(float));
    float* xL = A->x + (size_t)c.L * N * d;
    rmsnorm_backward(A->dx, m->g.g_final, A->dnorm, xL, m->p.g_final, A->rstd_f, N, d);
    for (int l = c.L - 1; l >= 0; l--) {
        const LayerParams& w = m->p.layer[l];
        const LayerParams& gw = m->g.layer[l];
        LayerActs la = layer_acts(A, c, l, B, T);
        float* dK = A->dKbuf + l * kv_layer;  // (B, T, R, hd): complete once layers > l are done
        float* dV = A->dVbuf + l * kv_layer;
        // MLP block. forward: xnext = xa + h @ Wd^T, h = swiglu(m Wg^T, m Wu^T), m = rmsnorm(xa)
        memset(A->dh, 0, (size_t)N * c.F * sizeof(float));
        matmul_backward(A->dh, gw.Wd, A->dx, la.h, w.Wd, N, c.F, d, A->scratch);
        swiglu_backward(A->dgate, A->dup, A->dh, la.gate, la.up, (size_t)N * c.F);
        memset(A->dnorm, 0, (size_t)N * d * sizeof(float));
        matmul_backward(A->dnorm, gw.Wg, A->dgate, la.m, w.Wg, N, d, c.F, A->scratch);
        matmul_backward(A->dnorm, gw.Wu, A->dup, la.m, w.Wu, N, d, c.F, A->scratch);
        rmsnorm_backward(A->dx, gw.g_mlp, A->dnorm, la.xa, w.g_mlp, la.rstd_m, N, d);  // dx is now d xa
        // attention block. forward: xa = x + o @ Wo^T
        memset(A->dout, 0, (size_t)N * qd * sizeof(float));
        matmul_backward(A->dout, gw.Wo, A->dx, la.o, w.Wo, N, qd, d, A->scratch);
        bool routed = has_router(c, l);
        float* dvr = routed ? A->dvr : dV;  // without a router, attention's values are the buffer itself
        memset(A->dkr, 0, kv_layer * sizeof(float));
        if (routed) memset(A->dvr, 0, kv_layer * sizeof(float));
        attention_backward(A->dq, A->dkr, dvr, A->datt, A->kt, A->vt, A->dkt, A->dvt, A->dout, la.q, la.kr, routed ? la.vr : la.V, la.att, B, T, c.H, c.R, c.hd);
        rope_backward(A->dq, A->rope_cos, A->rope_sin, B, T, c.H, c.hd);
        rope_backward(A->dkr, A->rope_cos, A->rope_sin, B, T, c.R, c.hd);
        if (routed) {
            router_backward(gw.router, A->dKbuf, A->dVbuf, A->dkr, A->dvr, w.router, A->Kbuf, A->Vbuf, l, N, c.R, c.hd);
        } else {
            for (size_t i = 0; i < kv_layer; i++) dK[i] += A->dkr[i];
        }
        // forward: q = a Wq^T, K = a Wk^T, V = a Wv^T, a = rmsnorm(x)
        memset(A->dnorm, 0, (size_t)N * d * sizeof(float));
        matmul_backward(A->dnorm, gw.Wq, A->dq, la.a, w.Wq, N, d, qd, A->scratch);
        matmul_backward(A->dnorm, gw.Wk, dK, la.a, w.Wk, N, d, kvd, A->scratch);
        matmul_backward(A->dnorm, gw.Wv, dV, la.a, w.Wv, N, d, kvd, A->scratch);
        rmsnorm_backward(A->dx, gw.g_attn, A->dnorm, la.x, w.g_attn, la.rstd_a, N, d);  // dx is now d x[l]
    }
    embedding_backward(m->g.E, A->dx, A->tokens, N, d);
}

static float cpu_update(Model* m, const AdamWConfig& o, float factor) {
    float norm = (float)std::sqrt(grad_sumsq(m->grads, m->n_params));
    // as PyTorch's clip_grad_norm_: scale by min(1, clip / (norm + 1e-6))
    float scale = o.grad_clip > 0 ? std::min(1.0f, o.grad_clip / (norm + 1e-6f)) : 1.0f;
    m->step++;
    float bc1 = 1.0f - powf(o.beta1, (float)m->step), bc2 = 1.0f - powf(o.beta2, (float)m->step);
    for (const TensorSpec& t : m->specs) {
        float lr, wd;
        group_lr(t, o, factor, &lr, &wd);
        adamw_cpu(m->params + t.offset, m->m + t.offset, m->v + t.offset, m->grads + t.offset, t.numel, lr, wd, scale, o, bc1, bc2);
    }
    return norm;
}

// ===========================================================================
// The model's public calls: one path, the device picks the kernels.
// ===========================================================================

float model_forward(Model* m, const int* tokens, const int* targets, const float* mask, int B, int T) {
    m->cur_B = B;
    m->cur_T = T;
#ifdef LIME_GPU
    if (m->device == DEVICE_GPU) return m->last_loss = gpu_forward(m, tokens, targets, mask, B, T);
#endif
    return m->last_loss = cpu_forward(m, tokens, targets, mask, B, T);
}

const float* model_logits(Model* m) { return m->acts->logits; }

void model_backward(Model* m) {
#ifdef LIME_GPU
    if (m->device == DEVICE_GPU) { gpu_backward(m); return; }
#endif
    cpu_backward(m, m->cur_B, m->cur_T);
}

float model_update(Model* m, const AdamWConfig& opt, float factor) {
#ifdef LIME_GPU
    if (m->device == DEVICE_GPU) return m->last_norm = gpu_update(m, opt, factor);
#endif
    return m->last_norm = cpu_update(m, opt, factor);
}

void model_train_step(Model* m, const int* tokens, const int* targets, const float* mask, int B, int T,
                      const AdamWConfig& opt, float factor) {
#ifdef LIME_GPU
    if (m->device == DEVICE_GPU) { gpu_train_step(m, tokens, targets, mask, B, T, opt, factor); return; }
#endif
    model_forward(m, tokens, targets, mask, B, T);
    model_backward(m);
    model_update(m, opt, factor);
}

void model_metrics(Model* m, float* loss, float* norm) {
#ifdef LIME_GPU
    if (m->device == DEVICE_GPU) gpu_metrics(m);
#endif
    *loss = m->last_loss;
    *norm = m->last_norm;
}

void model_to_device(Model* m) {
#ifdef LIME_GPU
    if (m->device == DEVICE_GPU) gpu_to_device(m);
#else
    (void)m;
#endif
}

void model_to_host(Model* m) {
#ifdef LIME_GPU
    if (m->device == DEVICE_GPU) gpu_to_host(m);
#else
    (void)m;
#endif
}

// ===========================================================================
// Cost: FLOPs per token of one training step (forward + backward = 3x forward)
// ===========================================================================

double flops_per_token(const Config& c, int T) {
    double d = c.d, qd = (double)c.H * c.hd, kvd = (double)c.R * c.hd, fwd = 0;
    for (int l = 0; l < c.L; l++) {
        fwd += 2 * d * (qd + 2 * kvd) + 2 * qd * d + 3 * 2 * d * c.F;  // projections and MLP
        fwd += 2 * 2 * qd * (T + 1) / 2.0;                              // causal scores and mixing
        if (has_router(c, l)) fwd += 2 * 2 * (double)c.R * (l + 1) * c.R * c.hd;  // keys and values
    }
    fwd += 2 * d * c.V;  // output layer
    return 3 * fwd;
}

// ===========================================================================
// Checkpoints (SPEC.md): safetensors, HF LLaMa names, config in __metadata__
// ===========================================================================

std::string config_to_json(const Config& c) {
    char buf[512];
    snprintf(buf, sizeof buf,
             "{\"architecture\": \"%s\", \"head_dim\": %d, \"hidden_size\": %d, \"intermediate_size\": %d, "
             "\"max_position_embeddings\": %d, \"num_attention_heads\": %d, \"num_hidden_layers\": %d, "
             "\"num_key_value_heads\": %d, \"rms_norm_eps\": %.9g, \"rope_theta\": %.9g, \"tie_word_embeddings\": true, "
             "\"vocab_size\": %d}",
             arch_name(c.arch), c.hd, c.d, c.F, c.T, c.H, c.L, c.R, c.eps, c.rope_theta, c.V);
    return buf;
}

std::string config_from_json(const std::string& text, Config* c) {
    Json j;
    std::string err = json_parse(text, &j);
    if (!err.empty()) return "config is not valid JSON: " + err;
    if (j.kind != Json::OBJ) return "config is not a JSON object";
    auto num = [&](const char* key, double* out) -> std::string {
        const Json* v = j.get(key);
        if (!v || v->kind != Json::NUM) return std::string("config lacks the number \"") + key + "\"";
        *out = v->num;
        return "";
    };
    struct { const char* key; int* dst; } ints[] = {
        {"vocab_size", &c->V}, {"num_hidden_layers", &c->L}, {"hidden_size", &c->d}, {"num_attention_heads", &c->H},
        {"num_key_value_heads", &c->R}, {"head_dim", &c->hd}, {"intermediate_size", &c->F}, {"max_position_embeddings", &c->T}};
    for (auto& f : ints) {
        double v;
        err = num(f.key, &v);
        if (!err.empty()) return err;
        if (v != std::floor(v) || v < 0 || v > 1e8) return std::string("config \"") + f.key + "\" is not a sensible integer";
        *f.dst = (int)v;
    }
    double theta = 10000, eps = 1e-6;
    if (j.get("rope_theta")) { err = num("rope_theta", &theta); if (!err.empty()) return err; }
    if (j.get("rms_norm_eps")) { err = num("rms_norm_eps", &eps); if (!err.empty()) return err; }
    c->rope_theta = (float)theta;
    c->eps = (float)eps;
    const Json* arch = j.get("architecture");
    c->arch = ARCH_LLAMA;  // an HF LLaMa config has no "architecture": it is llama
    if (arch && (arch->kind != Json::STR || !arch_parse(arch->str, &c->arch)))
        return "config \"architecture\" must be \"llama\" or \"lime\"";
    return config_check(*c);
}

std::string model_save(Model* m, const std::string& path, const std::map<std::string, std::string>& meta, bool with_optim) {
    model_to_host(m);
    StWriter w;
    w.meta = meta;
    w.meta["config"] = config_to_json(m->c);
    auto add = [&](const std::string& name, const TensorSpec& t, const float* base) {
        std::vector<int64_t> shape(t.shape.begin(), t.shape.end());
        w.add(name, "F32", shape, base + t.offset, t.numel * sizeof(float));
    };
    for (const TensorSpec& t : m->specs) add(t.name, t, m->params);
    int32_t step = m->step;
    if (with_optim) {
        for (const TensorSpec& t : m->specs) add("optim.m." + t.name, t, m->m);
        for (const TensorSpec& t : m->specs) add("optim.v." + t.name, t, m->v);
        w.add("optim.step", "I32", {1}, &step, sizeof step);
    }
    return st_write(path, w);
}

std::string checkpoint_read_config(const std::string& path, Config* c, std::map<std::string, std::string>* meta) {
    SafeTensors st;
    std::string err = st_read(path, &st);
    if (!err.empty()) return err;
    auto it = st.meta.find("config");
    if (it == st.meta.end()) return path + ": no \"config\" in the metadata; is this a lime.cu or HF LLaMa checkpoint?";
    err = config_from_json(it->second, c);
    if (!err.empty()) return path + ": " + err;
    if (meta) *meta = st.meta;
    return "";
}

std::string model_load(Model* m, const std::string& path, bool with_optim) {
    SafeTensors st;
    std::string err = st_read(path, &st);
    if (!err.empty()) return err;
    Config fc;
    auto it = st.meta.find("config");
    if (it == st.meta.end()) return path + ": no \"config\" in the metadata";
    err = config_from_json(it->second, &fc);
    if (!err.empty()) return path + ": " + err;
    if (config_to_json(fc) != config_to_json(m->c))
        return path + ": holds a different model (" + config_to_json(fc) + ") than expected (" + config_to_json(m->c) + ")";
    for (const TensorSpec& t : m->specs) {
        std::vector<int64_t> shape(t.shape.begin(), t.shape.end());
        err = st_get_f32(st, t.name, shape, m->params + t.offset);
        if (!err.empty()) return err;
        if (with_optim) {
            err = st_get_f32(st, "optim.m." + t.name, shape, m->m + t.offset);
            if (err.empty()) err = st_get_f32(st, "optim.v." + t.name, shape, m->v + t.offset);
            if (!err.empty()) return err + " (resuming needs a checkpoint saved during training)";
        }
    }
    if (with_optim) {
        int32_t step = 0;
        err = st_get_i32(st, "optim.step", {1}, &step);
        if (!err.empty()) return err;
        m->step = step;
    }
    model_to_device(m);
    return "";
}

// ===========================================================================
// GPU path: kernels beside their CPU ops arrive with the GPU issue. Until
// then a GPU build answers clearly instead of pretending.
// ===========================================================================
#ifndef LIME_GPU
bool gpu_available(std::string* why) {
    *why = "this build has no GPU support (built without nvcc); use --device cpu, or install the CUDA Toolkit and run make";
    return false;
}
void gpu_set_tf32(bool) {}
#endif
#ifdef LIME_GPU
bool gpu_available(std::string* why) {
    *why = "the GPU path is not implemented yet in this build; use --device cpu";
    return false;
}
void gpu_set_tf32(bool) {}
static std::string gpu_create(Model* m) {
    (void)m;
    return "the GPU path is not implemented yet in this build; use --device cpu";
}
static void gpu_free(Model*) {}
static float gpu_forward(Model*, const int*, const int*, const float*, int, int) { return 0; }
static void gpu_backward(Model*) {}
static float gpu_update(Model*, const AdamWConfig&, float) { return 0; }
static void gpu_to_device(Model*) {}
static void gpu_to_host(Model*) {}
static void gpu_train_step(Model*, const int*, const int*, const float*, int, int, const AdamWConfig&, float) {}
static void gpu_metrics(Model*) {}
#endif
