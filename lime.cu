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
// with support/cuda_on_cpu.h (the CUDA kernels run on the CPU, for tests).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "data/rng.h"
#include "support/lime.h"
#include "support/safetensors.h"

#if defined(LIME_EMU)  // g++ with the harness: the CUDA code runs on the CPU
#include "support/cuda_on_cpu.h"
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

bool attention_parse(const std::string& s, Attention* out) {
    if (s == "auto") { *out = ATTENTION_AUTO; return true; }
    if (s == "matmul") { *out = ATTENTION_MATMUL; return true; }
    if (s == "flash") { *out = ATTENTION_FLASH; return true; }
    return false;
}

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
    if (c.arch == ARCH_LLAMA && (c.router != ROUTER_STATIC || c.router_kv_separate))
        return fail("--router and --router-kv are for --arch lime: llama has no router");
    if (c.arch == ARCH_LIME && c.L > 64) return fail("--layers %d: lime has at most 64 layers here (router_sources keeps a bit per layer)", c.L);
    if ((c.router == ROUTER_LAST || c.router == ROUTER_FIRST) && (c.router_j < 1 || c.router_j > c.L))
        return fail("--router %s: J must be 1 .. %d (the number of layers)", router_name(c).c_str(), c.L);
    return "";
}

// --- router variants (paper Appendix D, Table 7) -----------------------------
// Each variant is the static router of Eq. 2 with some of its weights held
// fixed. router_sources(c, l) has bit l' set when layer l's router may give
// source layer l' (its columns l'*R .. l'*R + R-1) a non-zero weight:
//   static   every buffered layer 0..l; all weights learned (Eq. 2).
//   last-J   only the most recent J layers, l' in [l-J+1, l] (the layer itself
//            included); learned. The other columns are 0 and stay 0.
//   first-J  the first J layers, the preceding layer and the layer itself:
//            l' < J or l' >= l-1; learned. The other columns are 0 and stay 0.
//   average  every layer 0..l with FIXED weights W[r, l'*R + r'] = 1/(l+1) if
//            r' == r, else 0: each kv head is the mean of that same head over
//            layers 0..l. Nothing is learned. Why this reading of "uniform over
//            all buffered entries": the paper's router is a per-head weight over
//            layers (the authors' code: heads x (l+1) weights), and there the
//            uniform choice is 1/(l+1) per layer; spreading 1/((l+1)R) over every
//            column instead would give all R kv heads the same key and value,
//            collapsing GQA to one kv head, a different change than the ablation's.
// The weights a variant holds fixed get no gradient (router_backward skips the
// columns router_learned leaves out) and routers have no weight decay, so
// AdamW never moves them: they stay exactly as model_init set them.
uint64_t router_sources(const Config& c, int l) {
    uint64_t sources = 0;
    for (int src = 0; src <= l; src++) {
        bool on = c.router == ROUTER_LAST    ? src > l - c.router_j
                  : c.router == ROUTER_FIRST ? src < c.router_j || src >= l - 1
                                             : true;  // static, average
        if (on) sources |= 1ull << src;
    }
    return sources;
}
uint64_t router_learned(const Config& c, int l) { return c.router == ROUTER_AVERAGE ? 0 : router_sources(c, l); }

std::string router_name(const Config& c) {
    switch (c.router) {
    case ROUTER_AVERAGE: return "average";
    case ROUTER_LAST: return "last-" + std::to_string(c.router_j);
    case ROUTER_FIRST: return "first-" + std::to_string(c.router_j);
    default: return "static";
    }
}

bool router_parse(const std::string& s, Config* c) {
    if (s == "static" || s == "average") {
        c->router = s == "static" ? ROUTER_STATIC : ROUTER_AVERAGE;
        c->router_j = 0;
        return true;
    }
    for (auto [prefix, kind] : {std::make_pair(std::string("last-"), ROUTER_LAST), std::make_pair(std::string("first-"), ROUTER_FIRST)}) {
        std::string j = s.substr(0, prefix.size()) == prefix ? s.substr(prefix.size()) : "";
        if (j.empty() || j.size() > 6 || j.find_first_not_of("0123456789") != std::string::npos) continue;
        c->router = kind;
        c->router_j = atoi(j.c_str());  // 0 and J > L parse; config_check refuses them with the range
        return true;
    }
    return false;
}

std::string model_name(const Config& c) {
    std::string s = arch_name(c.arch);
    if (c.arch == ARCH_LIME && c.router != ROUTER_STATIC) s += ":" + router_name(c);
    if (c.arch == ARCH_LIME && c.router_kv_separate) s += ":separate";
    return s;
}

bool model_parse(const std::string& s, Config* c) {
    size_t colon = s.find(':');
    if (!arch_parse(s.substr(0, colon), &c->arch)) return false;
    c->router = ROUTER_STATIC;
    c->router_j = 0;
    c->router_kv_separate = false;
    if (colon == std::string::npos) return true;
    if (c->arch != ARCH_LIME) return false;  // llama has no router to name
    std::string rest = s.substr(colon + 1);
    for (size_t at = 0; at <= rest.size();) {
        size_t end = std::min(rest.find(':', at), rest.size());
        std::string part = rest.substr(at, end - at);
        if (part == "separate" || part == "shared") c->router_kv_separate = part == "separate";
        else if (!router_parse(part, c)) return false;
        at = end + 1;
    }
    return true;
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
        if (has_router(c, l) && c.router_kv_separate) add(p + "self_attn.router_v.weight", {c.R, (l + 1) * c.R}, GROUP_ROUTER);
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
        w.router_v = has_router(c, l) && c.router_kv_separate ? next() : nullptr;
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
    bool flash = false;  // GPU flash attention: att keeps one number per row, not the probabilities
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
    float* att;      // (L, B, H, T, T) attention probabilities; with flash, (L, B, H, T): each row's log-sum-exp
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
    float* datt;     // (B, H, T, T) GPU attention scratch (empty on the CPU)
    float* kt;       // (B, R, T, hd) GPU attention scratch: keys, values and their gradients, head-major (empty on the CPU)
    float* vt;
    float* dkt;
    float* dvt;
    float* scratch;  // CPU: gemm's packed panels, max(B*T, max rows of a weight) * max(V, F, d, H*hd) rounded up to 32;
                     // GPU: attention's head-major q, out/dout and dq (3, B, T, H*hd), rmsnorm's gain partials,
                     // flash attention's D (B, H, T)
    float* rope_cos; // (T, hd/2)
    float* rope_sin; // (T, hd/2)
};

// Carves (or, with base == nullptr, only measures) the activations; only the scratch differs between devices.
static size_t acts_carve(Acts* A, const Config& c, int B, float* base, Device dev = DEVICE_CPU, bool flash = false) {
    size_t BT = (size_t)B * c.T, L = c.L, d = c.d, qd = (size_t)c.H * c.hd, kvd = (size_t)c.R * c.hd;
    size_t wide = std::max({(size_t)c.V, (size_t)c.F, d, qd});
    size_t rows = std::max({BT, (size_t)c.V, (size_t)c.F, d, qd});
    size_t off = 0;
    auto take = [&](float** p, size_t n) { if (base) *p = base + off; off += (n + 15) & ~(size_t)15; };
    auto take_int = [&](int** p, size_t n) { if (base) *p = (int*)(base + off); off += (n + 15) & ~(size_t)15; };
    flash = flash && dev == DEVICE_GPU;
    A->flash = flash;
    take(&A->x, (L + 1) * BT * d);
    take(&A->xa, L * BT * d);
    take(&A->a, L * BT * d);
    take(&A->rstd_a, L * BT);
    take(&A->q, L * BT * qd);
    take(&A->Kbuf, L * BT * kvd);
    take(&A->Vbuf, L * BT * kvd);
    take(&A->kr, L * BT * kvd);
    take(&A->vr, L * BT * kvd);
    take(&A->att, L * BT * c.H * (flash ? 1 : c.T));
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
    size_t gpu = dev == DEVICE_GPU && !flash ? 1 : 0;  // only the GPU's matrix-product attention uses these
    take(&A->datt, gpu * BT * c.H * c.T);
    take(&A->kt, gpu * BT * kvd);
    take(&A->vt, gpu * BT * kvd);
    take(&A->dkt, gpu * BT * kvd);
    take(&A->dvt, gpu * BT * kvd);
    take(&A->scratch, dev == DEVICE_GPU ? 3 * BT * qd : rows * ((wide + 31) / 32 * 32));
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

// e^x for the CPU loops (softmax, SwiGLU, cross-entropy), within about 1 ulp
// of expf, in plain arithmetic the compiler vectorises (a call to expf stops
// it). e^x = 2^n * e^r with n = round(x / ln 2) and |r| <= ln(2) / 2; e^r is
// the Cephes polynomial, 2^n is built from its bits. Below -87 it gives 0,
// above 88 infinity (e^x < 1.7e-38 or > 1.6e38 there); NaN stays NaN.
static inline float exp_cpu(float x) {
    const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer, n, held in the low bits
    float xc = std::min(std::max(x, -87.0f), 88.0f);
    float t = xc * 1.44269504f + shifter;
    float n = t - shifter;
    float r = xc - n * 0.693359375f + n * 2.12194440e-4f;  // x - n ln 2, ln 2 in two parts
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    uint32_t bits;
    memcpy(&bits, &t, sizeof bits);
    bits = (bits << 23) + (127u << 23);  // the exponent field of 2^n: n + 127
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x < -87.0f ? 0.0f : x > 88.0f ? INFINITY : p * scale;
}

// Calls f(w) with w a compile-time constant dividing hd: 32, 8 or 2 (hd is
// even). CPU loops over a head's hd floats go W = w at a time, W known to the
// compiler, so that their sums stay in registers.
template <class F>
static void with_width(int hd, F f) {
    if (hd % 32 == 0) f(std::integral_constant<int, 32>());
    else if (hd % 8 == 0) f(std::integral_constant<int, 8>());
    else f(std::integral_constant<int, 2>());
}

// ===========================================================================
// GPU basics: checked calls and the reductions the kernels share.
// Every op below gets, beside its CPU function `op(...)`, kernels and a
// launcher `op_gpu(...)` with the same arguments plus a stream (or cuBLAS handle). No kernel adds floats with atomics: every
// sum runs in an order fixed by the shapes alone, so two runs agree bit for bit.
// ===========================================================================
#ifdef LIME_GPU
static void cuda_check(cudaError_t err, const char* file, int line) {
    if (err == cudaSuccess) return;
    fprintf(stderr, "lime: CUDA error at %s:%d: %s\n", file, line, cudaGetErrorString(err));
    exit(EXIT_FAILURE);
}
static void cublas_check(cublasStatus_t status, const char* file, int line) {
    if (status == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "lime: cuBLAS error at %s:%d: %s\n", file, line, cublasGetStatusString(status));
    exit(EXIT_FAILURE);
}
#define cudaCheck(call) cuda_check((call), __FILE__, __LINE__)
#define cublasCheck(call) cublas_check((call), __FILE__, __LINE__)
// After every launch: a refused launch (bad grid, too much shared memory) shows here.
#define launchCheck() cuda_check(cudaGetLastError(), __FILE__, __LINE__)

// Numbers the device computes and the host reads when it asks (model_metrics).
struct Metrics {
    float loss;       // crossentropy_forward_gpu
    float inv_count;  // 1 / sum(mask), for the backward (0 when the mask is all 0)
    float norm;       // global gradient norm, before clipping
    float clip_scale; // min(1, grad_clip / (norm + 1e-6)), or 1 without clipping
};
// One optimiser step's numbers, in device memory: written before each step
// (or graph replay), read by the update kernels.
struct AdamWStep {
    float lr, router_lr;  // times the schedule factor
    float weight_decay, beta1, beta2, eps, grad_clip;
    float bc1, bc2;       // bias corrections 1 - beta^step
};

// Blocks for a elements at b per block; at least 1 (the kernels check their bounds).
static unsigned ceil_div(size_t a, size_t b) { return a ? (unsigned)((a + b - 1) / b) : 1u; }

// Sum over the 32 lanes of a warp. The xor butterfly leaves the same bits in
// every lane: each step adds a pair of values that both lanes of the pair hold.
__device__ inline float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}
__device__ inline float warp_max(float v) {
    for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}
// Sum over the block (blockDim.x a power of two, shared holds blockDim.x
// values) as a fixed tree; every thread gets the total.
template <class Num>
__device__ Num block_sum(Num v, Num* shared) {
    shared[threadIdx.x] = v;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if ((int)threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
        __syncthreads();
    }
    Num total = shared[0];
    __syncthreads();  // the caller may reuse shared right away
    return total;
}
#endif

// ===========================================================================
// Matrix products. One CPU kernel, C (+)= A @ B, where A and B may be read
// transposed in place; the model's products are that kernel. On the GPU, cuBLAS.
// ===========================================================================

// An operand of a product, read where it lies: element (i, k) is p[i*rs + k*cs].
// A row-major (rows, cols) array is {p, cols, 1}; its transpose is {p, 1, cols}.
struct MatView {
    const float* p;
    size_t rs, cs;
};

// The tile kernel: C[8, 32] (+)= A[8, K] @ B[K, 32], B a panel whose rows are
// ldb apart, a[i] row i of A (its k-th element at a[i][k * a_cs]). The 8 x 32
// sums live in 16 vector registers of 16 floats while k runs: per k, two
// loads of B, eight broadcasts of A and 16 fused multiply-adds (the compiler
// vectorises the loops over j). Only the first mr rows and nr columns are stored.
static const int GEMM_MR = 8, GEMM_NR = 32;
static inline void gemm_tile(float* C, int ldc, const float* const* a, size_t a_cs, const float* b, size_t ldb, int K, int mr, int nr,
                             bool accumulate) {
    float acc[GEMM_MR][GEMM_NR] = {};
    for (int k = 0; k < K; k++, b += ldb)
        for (int i = 0; i < GEMM_MR; i++) {
            float aik = a[i][k * a_cs];
            for (int j = 0; j < GEMM_NR; j++) acc[i][j] += aik * b[j];
        }
    for (int i = 0; i < mr; i++) {
        float* c = C + (size_t)i * ldc;
        if (nr == GEMM_NR)  // (a whole row: the compiler's fixed-size vector stores)
            for (int j = 0; j < GEMM_NR; j++) c[j] = accumulate ? c[j] + acc[i][j] : acc[i][j];
        else
            for (int j = 0; j < nr; j++) c[j] = accumulate ? c[j] + acc[i][j] : acc[i][j];
    }
}

// C[M, N] (+)= A[M, K] @ B[K, N]; C row-major with row stride ldc.
// B is read in panels of 32 columns: in place when its rows are contiguous
// and the panel is whole, else first copied into scratch, zero-padded (at
// most K * round_up(N, 32) floats). The last row tile repeats A's last row
// where M runs out, and does not store it. Each element of C sums over k in
// order, so the result does not depend on the number of threads.
static void gemm_cpu(float* C, int ldc, MatView A, MatView B, int M, int N, int K, bool accumulate, float* scratch) {
    const int MR = GEMM_MR, NR = GEMM_NR;
    int row_tiles = (M + MR - 1) / MR, panels = (N + NR - 1) / NR;
    auto in_place = [&](int p) { return B.cs == 1 && (p + 1) * NR <= N; };
#pragma omp parallel if ((double)M * N * K > 32768)
    {
#pragma omp for schedule(static)
        for (int p = 0; p < panels; p++) {
            if (in_place(p)) continue;
            float* panel = scratch + (size_t)p * K * NR;
            for (int k = 0; k < K; k++)
                for (int j = 0; j < NR; j++) {
                    size_t col = (size_t)p * NR + j;
                    panel[(size_t)k * NR + j] = col < (size_t)N ? B.p[k * B.rs + col * B.cs] : 0.0f;
                }
        }
#pragma omp for collapse(2) schedule(static)
        for (int rt = 0; rt < row_tiles; rt++)
            for (int p = 0; p < panels; p++) {
                int i0 = rt * MR, j0 = p * NR;
                const float* a[GEMM_MR];
                for (int i = 0; i < MR; i++) a[i] = A.p + (size_t)std::min(i0 + i, M - 1) * A.rs;
                const float* b = in_place(p) ? B.p + j0 : scratch + (size_t)p * K * NR;
                gemm_tile(C + (size_t)i0 * ldc + j0, ldc, a, A.cs, b, in_place(p) ? B.rs : NR, K, std::min(MR, M - i0), std::min(NR, N - j0),
                          accumulate);
            }
    }
}

// out (N, OC) (+)= inp (N, C) @ W^T, W (OC, C): every projection of the model.
// scratch: C * round_up(OC, 32) floats (W^T, packed).
static void matmul_forward(float* out, const float* inp, const float* W, int N, int C, int OC, float* scratch, bool accumulate = false) {
    gemm_cpu(out, OC, {inp, (size_t)C, 1}, {W, 1, (size_t)C}, N, OC, C, accumulate, scratch);
}

// forward: out = inp @ W^T
// dinp (N, C) += dout (N, OC) @ W (OC, C);  dW (OC, C) += dout^T @ inp
// scratch: max(N, OC) * round_up(C, 32) floats (used only when C is not a multiple of 32).
static void matmul_backward(float* dinp, float* dW, const float* dout, const float* inp, const float* W, int N, int C, int OC, float* scratch) {
    if (dinp) gemm_cpu(dinp, C, {dout, (size_t)OC, 1}, {W, (size_t)C, 1}, N, C, OC, true, scratch);
    gemm_cpu(dW, C, {dout, 1, (size_t)OC}, {inp, (size_t)C, 1}, OC, C, N, true, scratch);
}

// dst += src, elementwise.
static void add_inplace(float* dst, const float* src, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

// dst = src, and p = 0: memcpy and memset in CHUNKS pieces shared by the threads.
static void copy_cpu(float* dst, const float* src, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int c = 0; c < CHUNKS; c++) {
        size_t from = n * c / CHUNKS, to = n * (c + 1) / CHUNKS;
        memcpy(dst + from, src + from, (to - from) * sizeof(float));
    }
}
static void zero_cpu(float* p, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int c = 0; c < CHUNKS; c++) {
        size_t from = n * c / CHUNKS, to = n * (c + 1) / CHUNKS;
        memset(p + from, 0, (to - from) * sizeof(float));
    }
}

#ifdef LIME_GPU
// cuBLAS is column-major: a row-major (rows, cols) matrix is a column-major
// (cols, rows) one. So out (N, OC) = inp (N, C) @ W^T is, column-major,
// out^T (OC, N) = W^T (OC, C) @ inp^T (C, N): op(W) = T, op(inp) = N.
static void matmul_forward_gpu(float* out, const float* inp, const float* W, int N, int C, int OC, bool accumulate, cublasHandle_t blas) {
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    cublasCheck(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &one, W, C, inp, C, &beta, out, OC));
}

// dinp^T (C, N) += W^T (C, OC) @ dout^T (OC, N);  dW^T (C, OC) += inp^T (C, N) @ dout (N, OC)
static void matmul_backward_gpu(float* dinp, float* dW, const float* dout, const float* inp, const float* W, int N, int C, int OC,
                                cublasHandle_t blas) {
    const float one = 1.0f;
    if (dinp) cublasCheck(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, W, C, dout, OC, &one, dinp, C));
    cublasCheck(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, inp, C, dout, OC, &one, dW, C));
}

__global__ void add_inplace_kernel(float* dst, const float* src, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] += src[i];
}
static void add_inplace_gpu(float* dst, const float* src, size_t n, cudaStream_t stream) {
    LAUNCH(add_inplace_kernel, ceil_div(n, 256), 256, 0, stream)(dst, src, n);
    launchCheck();
}
#endif

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

#ifdef LIME_GPU
__global__ void embedding_forward_kernel(float* out, const int* tokens, const float* E, int N, int d) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // one thread per output float
    if (idx >= (size_t)N * d) return;
    size_t n = idx / d;
    out[idx] = E[(size_t)tokens[n] * d + idx % d];
}
static void embedding_forward_gpu(float* out, const int* tokens, const float* E, int N, int d, cudaStream_t stream) {
    LAUNCH(embedding_forward_kernel, ceil_div((size_t)N * d, 256), 256, 0, stream)(out, tokens, E, N, d);
    launchCheck();
}

// Deterministic without atomics: block (v, column slice) owns dE[v, slice]
// and walks all positions in order, adding the rows whose token is v. The
// token ids pass through shared memory a tile at a time.
#define EMBED_TILE 1024
__global__ void embedding_backward_kernel(float* dE, const float* dout, const int* tokens, int N, int d) {
    __shared__ int tile[EMBED_TILE];
    int v = blockIdx.x, i = blockIdx.y * blockDim.x + threadIdx.x;
    float sum = 0;
    for (int n0 = 0; n0 < N; n0 += EMBED_TILE) {
        int count = min(EMBED_TILE, N - n0);
        for (int k = threadIdx.x; k < count; k += blockDim.x) tile[k] = tokens[n0 + k];
        __syncthreads();
        if (i < d)
            for (int k = 0; k < count; k++)
                if (tile[k] == v) sum += dout[(size_t)(n0 + k) * d + i];
        __syncthreads();
    }
    if (i < d) dE[(size_t)v * d + i] += sum;
}
// The CPU needs no V; the GPU's grid has one row of blocks per vocabulary entry.
static void embedding_backward_gpu(float* dE, const float* dout, const int* tokens, int N, int d, int V, cudaStream_t stream) {
    int threads = std::min(128, (d + 31) / 32 * 32);
    LAUNCH(embedding_backward_kernel, dim3(V, ceil_div(d, threads)), threads, 0, stream)(dE, dout, tokens, N, d);
    launchCheck();
}
#endif

// ===========================================================================
// RMSNorm: y_i = x_i * rstd * g_i,  rstd = 1 / sqrt(mean_j x_j^2 + eps)
// ===========================================================================

static void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* g, int N, int d, float eps) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * d;
        float* y = out + (size_t)n * d;
        float ss = 0;
#pragma omp simd reduction(+ : ss)
        for (int i = 0; i < d; i++) ss += x[i] * x[i];
        float r = 1.0f / sqrtf(ss / d + eps);
        for (int i = 0; i < d; i++) y[i] = x[i] * r * g[i];
        rstd[n] = r;
    }
}

// forward: y_i = x_i * r * g_i
// dx_i += r * g_i * dy_i - x_i * r^3 * mean_j(g_j * dy_j * x_j)
// dg_i += sum_n dy_i * x_i * r
// dg is summed over CHUNKS fixed slices of the rows, then the slices in
// order, so the sum is the same for any thread count.
static void rmsnorm_backward(float* dinp, float* dg, const float* dout, const float* inp, const float* g, const float* rstd, int N, int d) {
    std::vector<float> part((size_t)CHUNKS * d, 0.0f);
#pragma omp parallel for schedule(static)
    for (int c = 0; c < CHUNKS; c++) {
        float* dgc = &part[(size_t)c * d];
        for (size_t n = (size_t)N * c / CHUNKS; n < (size_t)N * (c + 1) / CHUNKS; n++) {
            const float* x = inp + n * d;
            const float* dy = dout + n * d;
            float* dx = dinp + n * d;
            float r = rstd[n], dot = 0;
#pragma omp simd reduction(+ : dot)
            for (int i = 0; i < d; i++) dot += g[i] * dy[i] * x[i];
            float k = r * r * r * dot / d;
            for (int i = 0; i < d; i++) {
                dx[i] += r * g[i] * dy[i] - x[i] * k;
                dgc[i] += dy[i] * x[i] * r;
            }
        }
    }
    for (int c = 0; c < CHUNKS; c++)
        for (int i = 0; i < d; i++) dg[i] += part[(size_t)c * d + i];
}

#ifdef LIME_GPU
// One warp per row (position): lanes stride over the d columns, then a warp sum.
__global__ void rmsnorm_forward_kernel(float* out, float* rstd, const float* inp, const float* g, int N, int d, float eps) {
    int lane = threadIdx.x % 32, n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (n >= N) return;  // the whole warp leaves together
    const float* x = inp + (size_t)n * d;
    float* y = out + (size_t)n * d;
    float ss = 0;
    for (int i = lane; i < d; i += 32) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(warp_sum(ss) / d + eps);
    for (int i = lane; i < d; i += 32) y[i] = x[i] * r * g[i];
    if (lane == 0) rstd[n] = r;
}
static void rmsnorm_forward_gpu(float* out, float* rstd, const float* inp, const float* g, int N, int d, float eps, cudaStream_t stream) {
    const int warps = 4;  // rows per block
    LAUNCH(rmsnorm_forward_kernel, ceil_div(N, warps), 32 * warps, 0, stream)(out, rstd, inp, g, N, d, eps);
    launchCheck();
}

// dx: one warp per row, as the forward.
__global__ void rmsnorm_backward_kernel(float* dinp, const float* dout, const float* inp, const float* g, const float* rstd, int N, int d) {
    int lane = threadIdx.x % 32, n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (n >= N) return;
    const float* x = inp + (size_t)n * d;
    const float* dy = dout + (size_t)n * d;
    float* dx = dinp + (size_t)n * d;
    float r = rstd[n], dot = 0;
    for (int i = lane; i < d; i += 32) dot += g[i] * dy[i] * x[i];
    float c = r * r * r * warp_sum(dot) / d;
    for (int i = lane; i < d; i += 32) dx[i] += r * g[i] * dy[i] - x[i] * c;
}
// dg in two fixed-order steps: block (column slice, chunk) sums its GAIN_ROWS
// rows into partial[chunk], then one thread per column adds the chunks in order.
#define GAIN_ROWS 32
__global__ void rmsnorm_gain_partial_kernel(float* partial, const float* dout, const float* inp, const float* rstd, int N, int d) {
    int i = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
    if (i >= d) return;
    float s = 0;
    for (int n = chunk * GAIN_ROWS; n < min(N, (chunk + 1) * GAIN_ROWS); n++)
        s += dout[(size_t)n * d + i] * inp[(size_t)n * d + i] * rstd[n];
    partial[(size_t)chunk * d + i] = s;
}
__global__ void rmsnorm_gain_reduce_kernel(float* dg, const float* partial, int chunks, int d) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= d) return;
    float s = 0;
    for (int c = 0; c < chunks; c++) s += partial[(size_t)c * d + i];
    dg[i] += s;
}
// scratch: ceil(N / GAIN_ROWS) * d floats for the partial sums.
static void rmsnorm_backward_gpu(float* dinp, float* dg, const float* dout, const float* inp, const float* g, const float* rstd, int N, int d,
                                 float* scratch, cudaStream_t stream) {
    const int warps = 4;
    LAUNCH(rmsnorm_backward_kernel, ceil_div(N, warps), 32 * warps, 0, stream)(dinp, dout, inp, g, rstd, N, d);
    launchCheck();
    int chunks = (int)ceil_div(N, GAIN_ROWS), threads = std::min(128, (d + 31) / 32 * 32);
    LAUNCH(rmsnorm_gain_partial_kernel, dim3(ceil_div(d, threads), chunks), threads, 0, stream)(scratch, dout, inp, rstd, N, d);
    launchCheck();
    LAUNCH(rmsnorm_gain_reduce_kernel, ceil_div(d, threads), threads, 0, stream)(dg, scratch, chunks, d);
    launchCheck();
}
#endif

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

#ifdef LIME_GPU
// One thread per rotated pair (b, t, h, i < hd/2); cos_t, sin_t live on the device.
__global__ void rope_rotate_kernel(float* x, const float* cos_t, const float* sin_t, int B, int T, int nh, int hd, float sign) {
    int half = hd / 2;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * nh * half) return;
    int i = idx % half;
    size_t row = idx / half;  // (b * T + t) * nh + h
    int t = (row / nh) % T;
    float* v = x + row * hd;
    float c = cos_t[t * half + i], s = sign * sin_t[t * half + i];
    float x0 = v[i], x1 = v[i + half];
    v[i] = x0 * c - x1 * s;
    v[i + half] = x1 * c + x0 * s;
}
static void rope_forward_gpu(float* x, const float* cos_t, const float* sin_t, int B, int T, int nh, int hd, cudaStream_t stream) {
    LAUNCH(rope_rotate_kernel, ceil_div((size_t)B * T * nh * (hd / 2), 256), 256, 0, stream)(x, cos_t, sin_t, B, T, nh, hd, 1.0f);
    launchCheck();
}
static void rope_backward_gpu(float* dx, const float* cos_t, const float* sin_t, int B, int T, int nh, int hd, cudaStream_t stream) {
    LAUNCH(rope_rotate_kernel, ceil_div((size_t)B * T * nh * (hd / 2), 256), 256, 0, stream)(dx, cos_t, sin_t, B, T, nh, hd, -1.0f);
    launchCheck();
}
#endif

// ===========================================================================
// The KV router (Eq. 2): layer l's keys and values are a learned mixture of
// the buffered keys and values of layers 0..l, mixed per position:
//   Kr[n, r, :] = sum_{j < (l+1)R} Wk[r, j] * Kbuf[j / R][n, j % R, :]
//   Vr[n, r, :] = sum_{j < (l+1)R} Wv[r, j] * Vbuf[j / R][n, j % R, :]
// Column j = l'*R + r' reads layer l', kv head r'. Kbuf is (L, N, R, hd), so
// layer l' sits at Kbuf + l' * N*R*hd. Eq. 2 has one W for both: Wk == Wv,
// the same pointer; with --router-kv separate they are two tensors.
// The variants (router_sources) need nothing here but the `learned` mask of
// the backward: a weight they hold fixed is only a fixed number in W.
// ===========================================================================

// On the CPU the loops go over a head's hd floats W at a time (with_width),
// and over 4 router rows (or columns) at once: 4 independent sums in
// registers, each value loaded once for all 4. Rows past the end get weight 0.
static const int ROUTER_BLOCK = 4;

// Where column j's entry for position 0 starts in the buffer: layer j / R,
// kv head j % R. Padded to whole blocks with the last column again.
static std::vector<size_t> router_columns(int l, int N, int R, int hd) {
    size_t J = (size_t)(l + 1) * R;
    std::vector<size_t> at((J + ROUTER_BLOCK - 1) / ROUTER_BLOCK * ROUTER_BLOCK);
    for (size_t j = 0; j < at.size(); j++) {
        size_t c = std::min(j, J - 1);
        at[j] = (c / R) * ((size_t)N * R * hd) + (c % R) * hd;
    }
    return at;
}

template <int W>
static void router_forward_w(float* Kr, float* Vr, const float* Wk, const float* Wv, const float* Kbuf, const float* Vbuf, int l, int N, int R,
                             int hd) {
    const int RB = ROUTER_BLOCK;
    int J = (l + 1) * R;  // router columns
    std::vector<size_t> col = router_columns(l, N, R, hd);
    // The weights of output heads r0 .. r0 + RB - 1 for column j side by side (0 past R).
    std::vector<float> wk((size_t)(R + RB - 1) / RB * J * RB, 0.0f), wv(wk.size(), 0.0f);
    for (int r = 0; r < R; r++)
        for (int j = 0; j < J; j++) {
            wk[((size_t)r / RB * J + j) * RB + r % RB] = Wk[r * J + j];
            wv[((size_t)r / RB * J + j) * RB + r % RB] = Wv[r * J + j];
        }
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int r0 = 0; r0 < R; r0 += RB)  // output heads r0 .. r0 + RB - 1
            for (int i0 = 0; i0 < hd; i0 += W) {
                float k[RB][W] = {}, v[RB][W] = {};
                for (int j = 0; j < J; j++) {
                    const float* ks = Kbuf + col[j] + (size_t)n * R * hd + i0;
                    const float* vs = Vbuf + col[j] + (size_t)n * R * hd + i0;
                    const float* wkj = &wk[((size_t)r0 / RB * J + j) * RB];
                    const float* wvj = &wv[((size_t)r0 / RB * J + j) * RB];
                    for (int b = 0; b < RB; b++)
#pragma omp simd
                        for (int i = 0; i < W; i++) {
                            k[b][i] += wkj[b] * ks[i];
                            v[b][i] += wvj[b] * vs[i];
                        }
                }
                for (int b = 0; b < RB && r0 + b < R; b++) {
                    memcpy(Kr + ((size_t)n * R + r0 + b) * hd + i0, k[b], sizeof k[b]);
                    memcpy(Vr + ((size_t)n * R + r0 + b) * hd + i0, v[b], sizeof v[b]);
                }
            }
}
static void router_forward(float* Kr, float* Vr, const float* Wk, const float* Wv, const float* Kbuf, const float* Vbuf, int l, int N, int R,
                           int hd) {
    with_width(hd, [&](auto w) { router_forward_w<decltype(w)::value>(Kr, Vr, Wk, Wv, Kbuf, Vbuf, l, N, R, hd); });
}

// forward: Kr[n,r,:] = sum_j Wk[r,j] * Kbuf_j[n,:],  Vr[n,r,:] = sum_j Wv[r,j] * Vbuf_j[n,:]
// dWk[r,j]     += sum_{n,i} dKr[n,r,i] * Kbuf_j[n,i]    dWv[r,j] += sum_{n,i} dVr[n,r,i] * Vbuf_j[n,i]
//                 (one W, Eq. 2: dWk == dWv, and it gets both sums)
// dKbuf_j[n,:] += sum_r Wk[r,j] * dKr[n,r,:]            dVbuf_j[n,:] += sum_r Wv[r,j] * dVr[n,r,:]
// This is where the gradient reaches the keys and values of earlier layers.
// Only columns whose source layer j / R has its bit in `learned` (router_learned)
// get a gradient; the others are left as they are (0: backward_pass zeroes
// the gradients), so AdamW keeps those weights where model_init put them.
// The sums for dW run over CHUNKS fixed slices of the positions, each into
// W lanes per weight, then the slices and the lanes in order: the same for any thread count.
template <int W>
static void router_backward_w(float* dWk, float* dWv, float* dKbuf, float* dVbuf, const float* dKr, const float* dVr, const float* Wk,
                              const float* Wv, const float* Kbuf, const float* Vbuf, int l, uint64_t learned, int N, int R, int hd) {
    const int RB = ROUTER_BLOCK;
    int J = (l + 1) * R;
    std::vector<size_t> col = router_columns(l, N, R, hd);
    size_t slice = (size_t)2 * R * J * W;  // one chunk's lanes: the keys' (R, J, W), then the values'
    std::vector<float> lanes(CHUNKS * slice);
#pragma omp parallel for schedule(static)
    for (int c = 0; c < CHUNKS; c++)
        for (int r = 0; r < R; r++)
            for (int j0 = 0; j0 < J; j0 += RB) {  // columns j0 .. j0 + RB - 1 (past J: column J - 1 again, not kept)
                float k[RB][W] = {}, v[RB][W] = {};
                for (size_t n = (size_t)N * c / CHUNKS; n < (size_t)N * (c + 1) / CHUNKS; n++)
                    for (int i0 = 0; i0 < hd; i0 += W) {
                        const float* dk = dKr + (n * R + r) * hd + i0;
                        const float* dv = dVr + (n * R + r) * hd + i0;
                        for (int b = 0; b < RB; b++) {
                            size_t at = col[j0 + b] + n * R * hd + i0;
#pragma omp simd
                            for (int i = 0; i < W; i++) {
                                k[b][i] += dk[i] * Kbuf[at + i];
                                v[b][i] += dv[i] * Vbuf[at + i];
                            }
                        }
                    }
                for (int b = 0; b < RB && j0 + b < J; b++) {
                    memcpy(&lanes[c * slice + ((size_t)r * J + j0 + b) * W], k[b], sizeof k[b]);
                    memcpy(&lanes[c * slice + slice / 2 + ((size_t)r * J + j0 + b) * W], v[b], sizeof v[b]);
                }
            }
    for (int rj = 0; rj < R * J; rj++) {
        if (!(learned >> (rj % J / R) & 1)) continue;  // a weight the variant holds fixed
        float lk[W] = {}, lv[W] = {}, k = 0, v = 0;
        for (int c = 0; c < CHUNKS; c++)
            for (int i = 0; i < W; i++) {
                lk[i] += lanes[c * slice + (size_t)rj * W + i];
                lv[i] += lanes[c * slice + slice / 2 + (size_t)rj * W + i];
            }
        for (int i = 0; i < W; i++) k += lk[i], v += lv[i];
        if (dWk == dWv) {
            dWk[rj] += k + v;
        } else {
            dWk[rj] += k;
            dWv[rj] += v;
        }
    }
    int Jp = (J + RB - 1) / RB * RB;  // each router row padded with zeros to whole blocks of columns
    std::vector<float> wk((size_t)R * Jp, 0.0f), wv(wk.size(), 0.0f);
    for (int r = 0; r < R; r++)
        for (int j = 0; j < J; j++) wk[(size_t)r * Jp + j] = Wk[r * J + j], wv[(size_t)r * Jp + j] = Wv[r * J + j];
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int j0 = 0; j0 < J; j0 += RB)  // buffer entries j0 .. j0 + RB - 1
            for (int i0 = 0; i0 < hd; i0 += W) {
                float k[RB][W], v[RB][W];
                for (int b = 0; b < RB; b++) {  // past J: column J - 1 again, weight 0, not stored
                    size_t at = col[j0 + b] + (size_t)n * R * hd + i0;
                    memcpy(k[b], dKbuf + at, sizeof k[b]);
                    memcpy(v[b], dVbuf + at, sizeof v[b]);
                }
                for (int r = 0; r < R; r++) {
                    const float* dk = dKr + ((size_t)n * R + r) * hd + i0;
                    const float* dv = dVr + ((size_t)n * R + r) * hd + i0;
                    const float* wkr = &wk[(size_t)r * Jp + j0];
                    const float* wvr = &wv[(size_t)r * Jp + j0];
                    for (int b = 0; b < RB; b++)
#pragma omp simd
                        for (int i = 0; i < W; i++) {
                            k[b][i] += wkr[b] * dk[i];
                            v[b][i] += wvr[b] * dv[i];
                        }
                }
                for (int b = 0; b < RB && j0 + b < J; b++) {
                    size_t at = col[j0 + b] + (size_t)n * R * hd + i0;
                    memcpy(dKbuf + at, k[b], sizeof k[b]);
                    memcpy(dVbuf + at, v[b], sizeof v[b]);
                }
            }
}
static void router_backward(float* dWk, float* dWv, float* dKbuf, float* dVbuf, const float* dKr, const float* dVr, const float* Wk,
                            const float* Wv, const float* Kbuf, const float* Vbuf, int l, uint64_t learned, int N, int R, int hd) {
    with_width(hd, [&](auto w) {
        router_backward_w<decltype(w)::value>(dWk, dWv, dKbuf, dVbuf, dKr, dVr, Wk, Wv, Kbuf, Vbuf, l, learned, N, R, hd);
    });
}

#ifdef LIME_GPU
// One launch per layer, one thread per output float (n, r, i): it reads the
// J = (l+1)R buffered entries of its position, column j after column j.
__global__ void router_forward_kernel(float* Kr, float* Vr, const float* Wk, const float* Wv, const float* Kbuf, const float* Vbuf, int l, int N,
                                      int R, int hd) {
    size_t layer = (size_t)N * R * hd, idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= layer) return;
    int i = idx % hd, r = (idx / hd) % R, J = (l + 1) * R;
    size_t n = idx / ((size_t)R * hd);
    float k = 0, v = 0;
    for (int j = 0; j < J; j++) {
        size_t src = (j / R) * layer + (n * R + j % R) * hd + i;
        k += Wk[r * J + j] * Kbuf[src];
        v += Wv[r * J + j] * Vbuf[src];
    }
    Kr[idx] = k;
    Vr[idx] = v;
}
static void router_forward_gpu(float* Kr, float* Vr, const float* Wk, const float* Wv, const float* Kbuf, const float* Vbuf, int l, int N, int R,
                               int hd, cudaStream_t stream) {
    LAUNCH(router_forward_kernel, ceil_div((size_t)N * R * hd, 256), 256, 0, stream)(Kr, Vr, Wk, Wv, Kbuf, Vbuf, l, N, R, hd);
    launchCheck();
}

// dW[r, j]: one block per router weight, a block-wide sum over (n, i) in a
// fixed tree (two sums when the key and value routers are separate).
#define ROUTER_THREADS 256
__global__ void router_backward_dw_kernel(float* dWk, float* dWv, const float* dKr, const float* dVr, const float* Kbuf, const float* Vbuf, int l,
                                          uint64_t learned, int N, int R, int hd) {
    __shared__ float part[ROUTER_THREADS];
    int J = (l + 1) * R, r = blockIdx.x / J, j = blockIdx.x % J;
    if (!(learned >> (j / R) & 1)) return;  // a weight the variant holds fixed: the whole block leaves
    bool shared = dWk == dWv;
    size_t src = (j / R) * ((size_t)N * R * hd) + (size_t)(j % R) * hd;  // column j: layer j / R, head j % R
    float sk = 0, sv = 0;
    for (size_t e = threadIdx.x; e < (size_t)N * hd; e += blockDim.x) {
        size_t n = e / hd;
        int i = e % hd;
        size_t at = (n * R + r) * hd + i, from = src + n * R * hd + i;
        if (shared) sk += dKr[at] * Kbuf[from] + dVr[at] * Vbuf[from];
        else { sk += dKr[at] * Kbuf[from]; sv += dVr[at] * Vbuf[from]; }
    }
    sk = block_sum(sk, part);
    if (!shared) sv = block_sum(sv, part);
    if (threadIdx.x == 0) {
        dWk[blockIdx.x] += sk;
        if (!shared) dWv[blockIdx.x] += sv;
    }
}
// dKbuf_j[n, i] += sum_r Wk[r, j] dKr[n, r, i] for every layer l' <= l (and
// dVbuf with Wv): one thread per float of those layers' buffer entries, one launch.
__global__ void router_backward_dbuf_kernel(float* dKbuf, float* dVbuf, const float* dKr, const float* dVr, const float* Wk, const float* Wv,
                                            int l, int N, int R, int hd) {
    size_t layer = (size_t)N * R * hd, idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (l + 1) * layer) return;
    size_t within = idx % layer, n = within / ((size_t)R * hd);
    int i = within % hd, J = (l + 1) * R, j = (int)(idx / layer) * R + (int)((within / hd) % R);
    float k = 0, v = 0;
    for (int r = 0; r < R; r++) {
        k += Wk[r * J + j] * dKr[(n * R + r) * hd + i];
        v += Wv[r * J + j] * dVr[(n * R + r) * hd + i];
    }
    dKbuf[idx] += k;
    dVbuf[idx] += v;
}
static void router_backward_gpu(float* dWk, float* dWv, float* dKbuf, float* dVbuf, const float* dKr, const float* dVr, const float* Wk,
                                const float* Wv, const float* Kbuf, const float* Vbuf, int l, uint64_t learned, int N, int R, int hd,
                                cudaStream_t stream) {
    int J = (l + 1) * R;
    LAUNCH(router_backward_dw_kernel, R * J, ROUTER_THREADS, 0, stream)(dWk, dWv, dKr, dVr, Kbuf, Vbuf, l, learned, N, R, hd);
    launchCheck();
    LAUNCH(router_backward_dbuf_kernel, ceil_div((size_t)(l + 1) * N * R * hd, 256), 256, 0, stream)(dKbuf, dVbuf, dKr, dVr, Wk, Wv, l, N, R,
                                                                                                      hd);
    launchCheck();
}
#endif

// ===========================================================================
// Causal GQA attention. Query head h reads kv head h / (H / R).
//   s[h,t,u] = q[t,h] . k[u,h/n_rep] / sqrt(hd)  (u <= t);  p = softmax_u(s)
//   o[t,h]   = sum_u p[h,t,u] * v[u,h/n_rep]
// ===========================================================================

// On the CPU one thread takes a (batch entry, kv head) pair at a time, and
// the query rows of its heads ATT_ROWS at a time; each value it loads serves
// all those rows. Two kinds of loop, so that both vectorise:
//  - over key positions u, 16 at a time: the scores q . k (and backward,
//    dout . v) read the keys transposed, (hd, Tp) with Tp = T rounded up to
//    16 and zeros past T, and fill rows of Tp floats: whole vectors only;
//  - over the head's hd floats, W at a time (p @ v; dq, dk, dv): W is a
//    compile-time constant dividing hd (32, 8 or 2; hd is even) so that the
//    ATT_ROWS x W sums live in registers.
// A block that runs past the last position gets rows that read zeros and
// write to a sink, so every loop works on all ATT_ROWS rows.
static const int ATT_ROWS = 4;

// xt (hd, Tp) = x[b, :, r, :]^T for x (B, T, R, hd); zero past T.
static void head_transposed(float* xt, const float* x, int b, int r, int T, int Tp, int R, int hd) {
    for (int i = 0; i < hd; i++)
        for (int u = 0; u < Tp; u++) xt[(size_t)i * Tp + u] = u < T ? x[(((size_t)b * T + u) * R + r) * hd + i] : 0.0f;
}

// s[j, u] = scale * a[j] . xt[:, u] for the ATT_ROWS rows a[j] (hd floats) and
// u < n, a multiple of 16; s has rows of Tp floats.
static void rows_dot_keys(float* s, int Tp, const float* const* a, const float* xt, int hd, int n, float scale) {
    for (int u0 = 0; u0 < n; u0 += 16) {
        float acc[ATT_ROWS][16] = {};
        for (int i = 0; i < hd; i++) {
            const float* x = xt + (size_t)i * Tp + u0;
            for (int j = 0; j < ATT_ROWS; j++)
#pragma omp simd
                for (int u = 0; u < 16; u++) acc[j][u] += a[j][i] * x[u];
        }
        for (int j = 0; j < ATT_ROWS; j++)
            for (int u = 0; u < 16; u++) s[(size_t)j * Tp + u0 + u] = scale * acc[j][u];
    }
}

// out[j][i] = scale * sum_{u < n} p[j][u] * m[u * ldm + i], i < hd: rows of
// weights times n rows of m (values, or keys).
template <int W>
static void rows_times_matrix(float* const* out, const float* const* p, int n, const float* m, size_t ldm, int hd, float scale) {
    for (int i0 = 0; i0 < hd; i0 += W) {
        float acc[ATT_ROWS][W] = {};
        for (int u = 0; u < n; u++) {
            const float* mu = m + (size_t)u * ldm + i0;
            for (int j = 0; j < ATT_ROWS; j++) {
                float pju = p[j][u];
#pragma omp simd  // (without it, the compiler vectorises over u instead, badly)
                for (int i = 0; i < W; i++) acc[j][i] += pju * mu[i];
            }
        }
        for (int j = 0; j < ATT_ROWS; j++)
            for (int i = 0; i < W; i++) out[j][i0 + i] = scale * acc[j][i];
    }
}

// dst[u * ld + i] += sum_j a[j][u] * scale * x[j][i] for u < n, i < hd: the
// gradient of n rows of m above (keys or values), from the ATT_ROWS rows.
template <int W>
static void add_rows_outer(float* dst, size_t ld, int n, const float* const* a, const float* const* x, int hd, float scale) {
    for (int i0 = 0; i0 < hd; i0 += W) {
        float xs[ATT_ROWS][W];
        for (int j = 0; j < ATT_ROWS; j++)
            for (int i = 0; i < W; i++) xs[j][i] = scale * x[j][i0 + i];
        for (int u = 0; u < n; u++) {
            float* d = dst + (size_t)u * ld + i0;
            float au[ATT_ROWS];
            for (int j = 0; j < ATT_ROWS; j++) au[j] = a[j][u];
#pragma omp simd
            for (int i = 0; i < W; i++) {
                float s = d[i];
                for (int j = 0; j < ATT_ROWS; j++) s += au[j] * xs[j][i];
                d[i] = s;
            }
        }
    }
}

// The sum and the maximum of 16 lanes, as a fixed tree.
static inline float lanes_sum(const float* a) {
    float b[8], c[4];
    for (int i = 0; i < 8; i++) b[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; i++) c[i] = b[i] + b[i + 4];
    return (c[0] + c[2]) + (c[1] + c[3]);
}
static inline float lanes_max(const float* a) {
    float b[8], c[4];
    for (int i = 0; i < 8; i++) b[i] = std::max(a[i], a[i + 8]);
    for (int i = 0; i < 4; i++) c[i] = std::max(b[i], b[i + 4]);
    return std::max(std::max(c[0], c[2]), std::max(c[1], c[3]));
}

// p[u] = softmax of the scores s[u] over u <= t, and 0 for t < u < T. s has
// n floats, n a multiple of 16; the loops run over 16 lanes, each lane
// keeping its own maximum and sum, which a fixed tree combines.
static void softmax_row(float* p, float* s, int t, int n, int T) {
    for (int u = t + 1; u < n; u++) s[u] = -INFINITY;  // masked: e^-inf = 0
    float mx[16], sum[16];
    for (int i = 0; i < 16; i++) mx[i] = -INFINITY, sum[i] = 0;
    for (int u = 0; u < n; u += 16)
        for (int i = 0; i < 16; i++) mx[i] = s[u + i] > mx[i] ? s[u + i] : mx[i];
    float m = lanes_max(mx);
    for (int u = 0; u < n; u += 16)
        for (int i = 0; i < 16; i++) {
            s[u + i] = exp_cpu(s[u + i] - m);
            sum[i] += s[u + i];
        }
    float inv = 1.0f / lanes_sum(sum);
    int w = std::min(n, T);
    for (int u = 0; u < w; u++) p[u] = s[u] * inv;
    if (w < T) memset(p + w, 0, (size_t)(T - w) * sizeof(float));
}

// In place over dp: ds[u] = p[u] (dp[u] - sum_u' p[u'] dp[u']) for u < n, n a
// multiple of 16 (p is 0 past the row's own position).
static void softmax_backward_row(float* ds, const float* p, int n) {
    float part[16] = {};
    for (int u = 0; u < n; u += 16)
        for (int i = 0; i < 16; i++) part[i] += p[u + i] * ds[u + i];
    float pdp = lanes_sum(part);
    for (int u = 0; u < n; u++) ds[u] = p[u] * (ds[u] - pdp);
}

// Per thread: the transposed keys (or values) of one kv head, ATT_ROWS rows
// of scores (and backward, of probabilities), a row of zeros and a sink for
// the rows past T.
struct AttentionBuffers {
    std::vector<float> xt, rows, probs, zero, sink;
    AttentionBuffers(int Tp, int hd)
        : xt((size_t)hd * Tp), rows((size_t)ATT_ROWS * Tp), probs((size_t)ATT_ROWS * Tp), zero(std::max(Tp, hd), 0.0f),
          sink(std::max(Tp, hd)) {}
};

// out (B, T, H, hd), att (B, H, T, T); q (B, T, H, hd); k, v (B, T, R, hd).
template <int W>
static void attention_forward_w(float* out, float* att, const float* q, const float* k, const float* v, int B, int T, int H, int R, int hd) {
    int n_rep = H / R, Tp = (T + 15) / 16 * 16;
    float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel
    {
        AttentionBuffers buf(Tp, hd);
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int r = 0; r < R; r++) {
                head_transposed(buf.xt.data(), k, b, r, T, Tp, R, hd);
                const float* vr = v + ((size_t)b * T * R + r) * hd;  // v[b, u, r, :] = vr[u * R*hd ...]
                for (int h = r * n_rep; h < (r + 1) * n_rep; h++)
                    for (int t0 = 0; t0 < T; t0 += ATT_ROWS) {
                        int last = std::min(t0 + ATT_ROWS, T) - 1;  // rows t0 .. last
                        const float *qt[ATT_ROWS], *pt[ATT_ROWS];
                        float *o[ATT_ROWS], *p[ATT_ROWS];
                        for (int j = 0; j < ATT_ROWS; j++) {
                            int t = t0 + j;
                            bool in = t <= last;
                            qt[j] = in ? q + (((size_t)b * T + t) * H + h) * hd : buf.zero.data();
                            p[j] = in ? att + (((size_t)b * H + h) * T + t) * T : buf.sink.data();
                            o[j] = in ? out + (((size_t)b * T + t) * H + h) * hd : buf.sink.data();
                            pt[j] = in ? p[j] : buf.zero.data();
                        }
                        int n16 = (last + 16) / 16 * 16;  // positions 0 .. last in whole vectors
                        rows_dot_keys(buf.rows.data(), Tp, qt, buf.xt.data(), hd, n16, scale);
                        for (int t = t0; t <= last; t++) softmax_row(p[t - t0], buf.rows.data() + (size_t)(t - t0) * Tp, t, n16, T);
                        rows_times_matrix<W>(o, pt, last + 1, vr, (size_t)R * hd, hd, 1.0f);
                    }
            }
    }
}
static void attention_forward(float* out, float* att, const float* q, const float* k, const float* v, int B, int T, int H, int R, int hd) {
    with_width(hd, [&](auto w) { attention_forward_w<decltype(w)::value>(out, att, q, k, v, B, T, H, R, hd); });
}

// forward: o[t] = sum_u p[t,u] v[u],  p = softmax(s),  s[t,u] = q[t].k[u] * scale
// dp[t,u] = dout[t] . v[u]                  dv[u] += sum_t p[t,u] dout[t]
// ds[t,u] = p[t,u] (dp[t,u] - sum_u' p[t,u'] dp[t,u'])
// dq[t]   = scale * sum_u ds[t,u] k[u]      dk[u] += scale * sum_t ds[t,u] q[t]
// dq is written; dk and dv are added to. One thread owns a (b, kv head) and
// adds its query heads' and rows' shares in order: the same sums for any thread count.
template <int W>
static void attention_backward_w(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v,
                                 const float* att, int B, int T, int H, int R, int hd) {
    int n_rep = H / R, Tp = (T + 15) / 16 * 16;
    float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel
    {
        AttentionBuffers buf(Tp, hd);
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int r = 0; r < R; r++) {
                head_transposed(buf.xt.data(), v, b, r, T, Tp, R, hd);
                size_t kv = ((size_t)b * T * R + r) * hd, ld = (size_t)R * hd;  // row u of this kv head: kv + u * ld
                for (int h = r * n_rep; h < (r + 1) * n_rep; h++)
                    for (int t0 = 0; t0 < T; t0 += ATT_ROWS) {
                        int last = std::min(t0 + ATT_ROWS, T) - 1;
                        const float *go[ATT_ROWS], *qt[ATT_ROWS], *p[ATT_ROWS], *ds[ATT_ROWS];
                        float* gq[ATT_ROWS];
                        for (int j = 0; j < ATT_ROWS; j++) {
                            int t = t0 + j;
                            bool in = t <= last;
                            size_t row = (((size_t)b * T + t) * H + h) * hd;
                            go[j] = in ? dout + row : buf.zero.data();
                            qt[j] = in ? q + row : buf.zero.data();
                            gq[j] = in ? dq + row : buf.sink.data();
                            p[j] = in ? buf.probs.data() + (size_t)j * Tp : buf.zero.data();
                            ds[j] = in ? buf.rows.data() + (size_t)j * Tp : buf.zero.data();
                        }
                        int n16 = (last + 16) / 16 * 16;
                        for (int t = t0; t <= last; t++) {  // this row of att, zero-padded to n16
                            const float* from = att + (((size_t)b * H + h) * T + t) * T;
                            float* pj = buf.probs.data() + (size_t)(t - t0) * Tp;
                            memcpy(pj, from, (size_t)(t + 1) * sizeof(float));
                            memset(pj + t + 1, 0, (size_t)(n16 - t - 1) * sizeof(float));
                        }
                        rows_dot_keys(buf.rows.data(), Tp, go, buf.xt.data(), hd, n16, 1.0f);  // dp
                        for (int j = 0; j <= last - t0; j++) softmax_backward_row(buf.rows.data() + (size_t)j * Tp, p[j], n16);
                        rows_times_matrix<W>(gq, ds, last + 1, k + kv, ld, hd, scale);
                        add_rows_outer<W>(dk + kv, ld, last + 1, ds, qt, hd, scale);
                        add_rows_outer<W>(dv + kv, ld, last + 1, p, go, hd, 1.0f);
                    }
            }
    }
}
static void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v,
                               const float* att, int B, int T, int H, int R, int hd) {
    with_width(hd, [&](auto w) { attention_backward_w<decltype(w)::value>(dq, dk, dv, dout, q, k, v, att, B, T, H, R, hd); });
}

#ifdef LIME_GPU
// On the GPU attention is three batched matrix products around a softmax, as
// in llm.c. The products want each head's positions contiguous, so q, k, v
// are first copied head-major: (B, T, nh, hd) -> (B, nh, T, hd). Then the n_rep
// query heads sharing kv head r are one (n_rep*T, hd) matrix, and batch entry
// (b, r) of every product is:
//   scores (n_rep*T, T) = q_g @ k_r^T * scale     -> att, then the causal softmax in place
//   out_g  (n_rep*T, hd) = att_g @ v_r
// The scores above the diagonal (u > t) are computed and then set to 0.
__global__ void split_heads_kernel(float* dst, const float* src, int B, int T, int nh, int hd) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // over dst (B, nh, T, hd)
    if (idx >= (size_t)B * nh * T * hd) return;
    int i = idx % hd, t = (idx / hd) % T, h = (idx / ((size_t)hd * T)) % nh;
    size_t b = idx / ((size_t)hd * T * nh);
    dst[idx] = src[((b * T + t) * nh + h) * hd + i];
}
__global__ void merge_heads_kernel(float* dst, const float* src, int B, int T, int nh, int hd, int accumulate) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // over dst (B, T, nh, hd)
    if (idx >= (size_t)B * T * nh * hd) return;
    int i = idx % hd, h = (idx / hd) % nh, t = (idx / ((size_t)hd * nh)) % T;
    size_t b = idx / ((size_t)hd * nh * T);
    float v = src[((b * nh + h) * T + t) * hd + i];
    dst[idx] = accumulate ? dst[idx] + v : v;
}
static void split_heads_gpu(float* dst, const float* src, int B, int T, int nh, int hd, cudaStream_t stream) {
    LAUNCH(split_heads_kernel, ceil_div((size_t)B * T * nh * hd, 256), 256, 0, stream)(dst, src, B, T, nh, hd);
    launchCheck();
}
static void merge_heads_gpu(float* dst, const float* src, int B, int T, int nh, int hd, bool accumulate, cudaStream_t stream) {
    LAUNCH(merge_heads_kernel, ceil_div((size_t)B * T * nh * hd, 256), 256, 0, stream)(dst, src, B, T, nh, hd, accumulate ? 1 : 0);
    launchCheck();
}

// Rows of att (b, h, t), each T long: p[u] = softmax over u <= t, and 0 for u > t. One warp per row.
__global__ void causal_softmax_kernel(float* att, int rows, int T) {
    int lane = threadIdx.x % 32, row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= rows) return;
    int t = row % T;
    float* p = att + (size_t)row * T;
    float mx = -INFINITY, sum = 0;
    for (int u = lane; u <= t; u += 32) mx = fmaxf(mx, p[u]);
    mx = warp_max(mx);
    for (int u = lane; u <= t; u += 32) { p[u] = expf(p[u] - mx); sum += p[u]; }
    sum = warp_sum(sum);
    for (int u = lane; u < T; u += 32) p[u] = u <= t ? p[u] / sum : 0.0f;
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

// kp, vp (B, R, T, hd): head-major keys and values (Acts kt, vt);
// scratch: 2 * B*T*H*hd floats for head-major q and out.
static void attention_forward_gpu(float* out, float* att, const float* q, const float* k, const float* v, float* kp, float* vp, int B, int T,
                                  int H, int R, int hd, float* scratch, cublasHandle_t blas, cudaStream_t stream) {
    int n_rep = H / R, M = n_rep * T;  // rows of one (b, kv head) group
    size_t qsize = (size_t)B * T * H * hd;
    float *qp = scratch, *op = scratch + qsize;
    const float scale = 1.0f / sqrtf((float)hd), one = 1.0f, zero = 0.0f;
    split_heads_gpu(qp, q, B, T, H, hd, stream);
    split_heads_gpu(kp, k, B, T, R, hd, stream);
    split_heads_gpu(vp, v, B, T, R, hd, stream);
    // att_g (M, T) = scale * qp_g (M, hd) @ kp_r^T: matmul_forward_gpu's product, inp = qp_g and W = kp_r
    cublasCheck(cublasSgemmStridedBatched(blas, CUBLAS_OP_T, CUBLAS_OP_N, T, M, hd, &scale, kp, hd, (long long)T * hd, qp, hd,
                                          (long long)M * hd, &zero, att, T, (long long)M * T, B * R));
    LAUNCH(causal_softmax_kernel, ceil_div((size_t)B * H * T, 4), 128, 0, stream)(att, B * H * T, T);
    launchCheck();
    // op_g (M, hd) = att_g (M, T) @ vp_r (T, hd): column-major op_g^T (hd, M) = vp_r^T (hd, T) @ att_g^T (T, M)
    cublasCheck(cublasSgemmStridedBatched(blas, CUBLAS_OP_N, CUBLAS_OP_N, hd, M, T, &one, vp, hd, (long long)T * hd, att, T, (long long)M * T,
                                          &zero, op, hd, (long long)M * hd, B * R));
    merge_heads_gpu(out, op, B, T, H, hd, false, stream);
}

// The same products backwards, batch entry (b, r):
//   datt_g = dout_g @ v_r^T;   dv_r = att_g^T @ dout_g   (sums over the group's heads and positions)
//   ds = softmax backward (in place over datt)
//   dq_g = scale * ds_g @ k_r;  dk_r = scale * ds_g^T @ q_g
// dq is written; dk and dv are added to, as on the CPU.
// scratch: 3 * B*T*H*hd floats (head-major q, dout, dq).
static void attention_backward_gpu(float* dq, float* dk, float* dv, float* datt, float* kp, float* vp, float* dkp, float* dvp, const float* dout,
                                   const float* q, const float* k, const float* v, const float* att, int B, int T, int H, int R, int hd,
                                   float* scratch, cublasHandle_t blas, cudaStream_t stream) {
    int n_rep = H / R, M = n_rep * T;
    size_t qsize = (size_t)B * T * H * hd;
    float *qp = scratch, *dop = scratch + qsize, *dqp = scratch + 2 * qsize;
    const float scale = 1.0f / sqrtf((float)hd), one = 1.0f, zero = 0.0f;
    long long sq = (long long)M * hd, skv = (long long)T * hd, satt = (long long)M * T;
    split_heads_gpu(qp, q, B, T, H, hd, stream);
    split_heads_gpu(dop, dout, B, T, H, hd, stream);
    split_heads_gpu(kp, k, B, T, R, hd, stream);
    split_heads_gpu(vp, v, B, T, R, hd, stream);
    cublasCheck(cublasSgemmStridedBatched(blas, CUBLAS_OP_T, CUBLAS_OP_N, T, M, hd, &one, vp, hd, skv, dop, hd, sq, &zero, datt, T, satt, B * R));
    // dvp_r^T (hd, T) = dop_g^T (hd, M) @ att_g (M, T)
    cublasCheck(cublasSgemmStridedBatched(blas, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, M, &one, dop, hd, sq, att, T, satt, &zero, dvp, hd, skv, B * R));
    LAUNCH(causal_softmax_backward_kernel, ceil_div((size_t)B * H * T, 4), 128, 0, stream)(datt, att, B * H * T, T);
    launchCheck();
    cublasCheck(cublasSgemmStridedBatched(blas, CUBLAS_OP_N, CUBLAS_OP_N, hd, M, T, &scale, kp, hd, skv, datt, T, satt, &zero, dqp, hd, sq, B * R));
    cublasCheck(cublasSgemmStridedBatched(blas, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, M, &scale, qp, hd, sq, datt, T, satt, &zero, dkp, hd, skv, B * R));
    merge_heads_gpu(dq, dqp, B, T, H, hd, false, stream);
    merge_heads_gpu(dk, dkp, B, T, R, hd, true, stream);
    merge_heads_gpu(dv, dvp, B, T, R, hd, true, stream);
}

// ---------------------------------------------------------------------------
// Flash-style attention (Dao et al. 2022): the same outputs without storing the
// (B, H, T, T) probabilities, for sequences long enough that those would not
// fit (`--attention flash`, or `auto` when the matrix products' version does
// not fit in GPU memory). Keys and values stream through shared memory a tile
// at a time; each thread owns one query row and keeps the running maximum mx,
// the running sum l and the unnormalised output (the online softmax). Forward
// keeps only lse = mx + log l per row, and backward recomputes the
// probabilities tile by tile:
//   p[t][u] = exp(s - lse[t]),  s = scale * q_t . k_u,  u <= t
//   D[t]    = dout_t . out_t              (= sum_u p dp: the softmax backward's dot)
//   dp = dout_t . v_u,   ds = p (dp - D[t])
//   dv_u += p dout_t,    dk_u += scale ds q_t    (one thread per key: queries t >= u, the group's heads)
//   dq_t  = scale sum_u ds k_u                   (one thread per query)
// No atomics: every output row is one thread's sum in a fixed order. A row's
// hd floats are held in registers, padded to HD (8, 16, 32, 64 or 128) with zeros.
// This is the simple form of the algorithm (one thread per row, scalar FMAs):
// it trades the batched products' speed for O(T) memory.
static const int FLASH_MAX_HD = 128;
template <int HD>
struct Flash {
    static constexpr int TILE = HD >= 128 ? 32 : 64;  // rows per tile, and threads per block
};

// tile (TILE, HD) = rows t0 .. t0+TILE-1 of head `head` of x (B, T, nh, hd); zeros past T and past hd.
template <int HD>
__device__ void flash_load_rows(float* tile, const float* x, int b, int t0, int T, int nh, int head, int hd) {
    for (int e = threadIdx.x; e < Flash<HD>::TILE * HD; e += blockDim.x) {
        int j = e / HD, i = e % HD, t = t0 + j;
        tile[e] = t < T && i < hd ? x[(((size_t)b * T + t) * nh + head) * hd + i] : 0.0f;
    }
}
// row (HD) = x's row t of head `head`, zero padded.
template <int HD>
__device__ void flash_load_row(float* row, const float* x, int b, int t, int T, int nh, int head, int hd) {
    for (int i = 0; i < HD; i++) row[i] = t < T && i < hd ? x[(((size_t)b * T + t) * nh + head) * hd + i] : 0.0f;
}
template <int HD>
__device__ float flash_dot(const float* a, const float* b) {
    float s = 0.0f;
    for (int i = 0; i < HD; i++) s += a[i] * b[i];
    return s;
}

// grid (T / TILE, H, B), TILE threads; thread = query t. lse (B, H, T).
template <int HD>
__global__ void flash_attention_forward_kernel(float* out, float* lse, const float* q, const float* k, const float* v, int T, int H, int R, int hd,
                                               float scale) {
    constexpr int TILE = Flash<HD>::TILE;
    DYNAMIC_SHARED(float, smem);
    float *ks = smem, *vs = smem + TILE * HD;  // (TILE, HD) each
    int t = blockIdx.x * TILE + threadIdx.x, h = blockIdx.y, b = blockIdx.z, r = h / (H / R);
    float qt[HD], acc[HD];
    flash_load_row<HD>(qt, q, b, t, T, H, h, hd);
    for (int i = 0; i < HD; i++) acc[i] = 0.0f;
    float mx = -INFINITY, l = 0.0f;
    int end = min(T, (int)(blockIdx.x + 1) * TILE);  // the block's last query sees keys u < end
    for (int u0 = 0; u0 < end; u0 += TILE) {
        __syncthreads();  // everyone is done with the previous tile
        flash_load_rows<HD>(ks, k, b, u0, T, R, r, hd);
        flash_load_rows<HD>(vs, v, b, u0, T, R, r, hd);
        __syncthreads();
        int n = t < T ? min(TILE, t - u0 + 1) : 0;  // this tile's keys u <= t
        for (int j = 0; j < n; j++) {
            float s = scale * flash_dot<HD>(qt, ks + j * HD);
            if (s > mx) {  // a new maximum: rescale what is summed so far
                float c = expf(mx - s);
                l *= c;
                for (int i = 0; i < HD; i++) acc[i] *= c;
                mx = s;
            }
            float p = expf(s - mx);
            l += p;
            for (int i = 0; i < HD; i++) acc[i] += p * vs[j * HD + i];
        }
    }
    if (t >= T) return;
    float* o = out + (((size_t)b * T + t) * H + h) * hd;
    for (int i = 0; i < hd; i++) o[i] = acc[i] / l;
    lse[((size_t)b * H + h) * T + t] = mx + logf(l);
}

// D (B, H, T) = the dot of dout and out, per row.
__global__ void flash_rowdot_kernel(float* D, const float* dout, const float* out, int B, int T, int H, int hd) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // over (B, H, T)
    if (idx >= (size_t)B * H * T) return;
    int t = idx % T, h = (idx / T) % H;
    size_t b = idx / ((size_t)T * H), row = ((b * T + t) * H + h) * hd;
    float s = 0.0f;
    for (int i = 0; i < hd; i++) s += dout[row + i] * out[row + i];
    D[idx] = s;
}

// grid (T / TILE, R, B), TILE threads; thread = key u of kv head r. Adds into dk, dv.
template <int HD>
__global__ void flash_attention_backward_kv_kernel(float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v,
                                                   const float* lse, const float* D, int T, int H, int R, int hd, float scale) {
    constexpr int TILE = Flash<HD>::TILE;
    DYNAMIC_SHARED(float, smem);
    float *qs = smem, *dos = smem + TILE * HD, *lses = smem + 2 * TILE * HD, *Ds = lses + TILE;  // (TILE, HD) x2, (TILE) x2
    int u = blockIdx.x * TILE + threadIdx.x, r = blockIdx.y, b = blockIdx.z, n_rep = H / R;
    float ku[HD], vu[HD], dku[HD], dvu[HD];
    flash_load_row<HD>(ku, k, b, u, T, R, r, hd);
    flash_load_row<HD>(vu, v, b, u, T, R, r, hd);
    for (int i = 0; i < HD; i++) dku[i] = dvu[i] = 0.0f;
    for (int g = 0; g < n_rep; g++) {
        int h = r * n_rep + g;
        for (int t0 = blockIdx.x * TILE; t0 < T; t0 += TILE) {  // queries before the block's first key see none of its keys
            __syncthreads();
            flash_load_rows<HD>(qs, q, b, t0, T, H, h, hd);
            flash_load_rows<HD>(dos, dout, b, t0, T, H, h, hd);
            for (int j = threadIdx.x; j < TILE; j += blockDim.x) {
                size_t row = ((size_t)b * H + h) * T + t0 + j;
                lses[j] = t0 + j < T ? lse[row] : 0.0f;
                Ds[j] = t0 + j < T ? D[row] : 0.0f;
            }
            __syncthreads();
            if (u >= T) continue;
            int n = min(TILE, T - t0);
            for (int j = max(0, u - t0); j < n; j++) {  // queries t = t0 + j >= u
                const float *qj = qs + j * HD, *dj = dos + j * HD;
                float p = expf(scale * flash_dot<HD>(qj, ku) - lses[j]);
                float ds = p * (flash_dot<HD>(dj, vu) - Ds[j]);
                for (int i = 0; i < HD; i++) {
                    dvu[i] += p * dj[i];
                    dku[i] += scale * ds * qj[i];
                }
            }
        }
    }
    if (u >= T) return;
    size_t row = (((size_t)b * T + u) * R + r) * hd;
    for (int i = 0; i < hd; i++) {
        dk[row + i] += dku[i];
        dv[row + i] += dvu[i];
    }
}

// grid (T / TILE, H, B), TILE threads; thread = query t. Writes dq.
template <int HD>
__global__ void flash_attention_backward_q_kernel(float* dq, const float* dout, const float* q, const float* k, const float* v, const float* lse,
                                                  const float* D, int T, int H, int R, int hd, float scale) {
    constexpr int TILE = Flash<HD>::TILE;
    DYNAMIC_SHARED(float, smem);
    float *ks = smem, *vs = smem + TILE * HD;
    int t = blockIdx.x * TILE + threadIdx.x, h = blockIdx.y, b = blockIdx.z, r = h / (H / R);
    float qt[HD], dot[HD], dqt[HD];
    flash_load_row<HD>(qt, q, b, t, T, H, h, hd);
    flash_load_row<HD>(dot, dout, b, t, T, H, h, hd);
    for (int i = 0; i < HD; i++) dqt[i] = 0.0f;
    size_t row = ((size_t)b * H + h) * T + t;
    float lse_t = t < T ? lse[row] : 0.0f, D_t = t < T ? D[row] : 0.0f;
    int end = min(T, (int)(blockIdx.x + 1) * TILE);
    for (int u0 = 0; u0 < end; u0 += TILE) {
        __syncthreads();
        flash_load_rows<HD>(ks, k, b, u0, T, R, r, hd);
        flash_load_rows<HD>(vs, v, b, u0, T, R, r, hd);
        __syncthreads();
        int n = t < T ? min(TILE, t - u0 + 1) : 0;
        for (int j = 0; j < n; j++) {
            const float* kj = ks + j * HD;
            float p = expf(scale * flash_dot<HD>(qt, kj) - lse_t);
            float ds = p * (flash_dot<HD>(dot, vs + j * HD) - D_t);
            for (int i = 0; i < HD; i++) dqt[i] += ds * kj[i];
        }
    }
    if (t >= T) return;
    float* out = dq + (((size_t)b * T + t) * H + h) * hd;
    for (int i = 0; i < hd; i++) out[i] = scale * dqt[i];
}

// Calls f(w) with w the compile-time row width HD for hd <= FLASH_MAX_HD.
template <class F>
static void with_flash_width(int hd, F f) {
    if (hd <= 8) f(std::integral_constant<int, 8>());
    else if (hd <= 16) f(std::integral_constant<int, 16>());
    else if (hd <= 32) f(std::integral_constant<int, 32>());
    else if (hd <= 64) f(std::integral_constant<int, 64>());
    else f(std::integral_constant<int, 128>());
}

// lse (B, H, T): what backward needs of the probabilities.
static void flash_attention_forward_gpu(float* out, float* lse, const float* q, const float* k, const float* v, int B, int T, int H, int R, int hd,
                                        cudaStream_t stream) {
    float scale = 1.0f / sqrtf((float)hd);
    with_flash_width(hd, [&](auto w) {
        constexpr int HD = decltype(w)::value, TILE = Flash<HD>::TILE;
        LAUNCH(flash_attention_forward_kernel<HD>, dim3(ceil_div(T, TILE), H, B), TILE, 2 * TILE * HD * sizeof(float), stream)(
            out, lse, q, k, v, T, H, R, hd, scale);
    });
    launchCheck();
}

// dq is written; dk and dv are added to, as on the CPU. scratch: B*H*T floats (D).
static void flash_attention_backward_gpu(float* dq, float* dk, float* dv, const float* dout, const float* out, const float* q, const float* k,
                                         const float* v, const float* lse, int B, int T, int H, int R, int hd, float* scratch, cudaStream_t stream) {
    float scale = 1.0f / sqrtf((float)hd), *D = scratch;
    LAUNCH(flash_rowdot_kernel, ceil_div((size_t)B * H * T, 256), 256, 0, stream)(D, dout, out, B, T, H, hd);
    launchCheck();
    with_flash_width(hd, [&](auto w) {
        constexpr int HD = decltype(w)::value, TILE = Flash<HD>::TILE;
        LAUNCH(flash_attention_backward_kv_kernel<HD>, dim3(ceil_div(T, TILE), R, B), TILE, (2 * TILE * HD + 2 * TILE) * sizeof(float), stream)(
            dk, dv, dout, q, k, v, lse, D, T, H, R, hd, scale);
        LAUNCH(flash_attention_backward_q_kernel<HD>, dim3(ceil_div(T, TILE), H, B), TILE, 2 * TILE * HD * sizeof(float), stream)(
            dq, dout, q, k, v, lse, D, T, H, R, hd, scale);
    });
    launchCheck();
}
#endif

// ===========================================================================
// SwiGLU: h = silu(gate) * up,  silu(z) = z / (1 + exp(-z))
// ===========================================================================

static void swiglu_forward(float* out, const float* gate, const float* up, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = gate[i] / (1.0f + exp_cpu(-gate[i])) * up[i];
}

// forward: h = silu(g) * u
// dg = dh * u * silu'(g),  silu'(g) = s (1 + g (1 - s)),  s = sigmoid(g);   du = dh * silu(g)
static void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i], s = 1.0f / (1.0f + exp_cpu(-g));
        dgate[i] = dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
        dup[i] = dout[i] * g * s;
    }
}

#ifdef LIME_GPU
__global__ void swiglu_forward_kernel(float* out, const float* gate, const float* up, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}
__global__ void swiglu_backward_kernel(float* dgate, float* dup, const float* dout, const float* gate, const float* up, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = gate[i], s = 1.0f / (1.0f + expf(-g));
    dgate[i] = dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
    dup[i] = dout[i] * g * s;
}
static void swiglu_forward_gpu(float* out, const float* gate, const float* up, size_t n, cudaStream_t stream) {
    LAUNCH(swiglu_forward_kernel, ceil_div(n, 256), 256, 0, stream)(out, gate, up, n);
    launchCheck();
}
static void swiglu_backward_gpu(float* dgate, float* dup, const float* dout, const float* gate, const float* up, size_t n, cudaStream_t stream) {
    LAUNCH(swiglu_backward_kernel, ceil_div(n, 256), 256, 0, stream)(dgate, dup, dout, gate, up, n);
    launchCheck();
}
#endif

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
        for (int i = 0; i < V; i++) p[i] = exp_cpu(z[i] - maxz);
        for (int i = 0; i < V; i++) sum += p[i];
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

#ifdef LIME_GPU
// probs and nll of one row (position) per warp.
__global__ void crossentropy_forward_kernel(float* probs, float* nll, const float* logits, const int* targets, int N, int V) {
    int lane = threadIdx.x % 32, n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (n >= N) return;
    const float* z = logits + (size_t)n * V;
    float* p = probs + (size_t)n * V;
    float maxz = -INFINITY, sum = 0;
    for (int i = lane; i < V; i += 32) maxz = fmaxf(maxz, z[i]);
    maxz = warp_max(maxz);
    for (int i = lane; i < V; i += 32) { p[i] = expf(z[i] - maxz); sum += p[i]; }
    sum = warp_sum(sum);
    for (int i = lane; i < V; i += 32) p[i] = p[i] / sum;
    if (lane == 0) nll[n] = logf(sum) + maxz - z[targets[n]];
}
// The masked mean over the batch, in one block (double, a fixed order), and
// 1 / sum(mask) for the backward.
__global__ void crossentropy_loss_kernel(Metrics* metrics, const float* nll, const float* mask, int N) {
    __shared__ double part[256];
    double total = 0, count = 0;
    for (int n = threadIdx.x; n < N; n += blockDim.x) {
        total += (double)mask[n] * nll[n];
        count += mask[n];
    }
    total = block_sum(total, part);
    count = block_sum(count, part);
    if (threadIdx.x == 0) {
        metrics->loss = count > 0 ? (float)(total / count) : 0.0f;
        metrics->inv_count = count > 0 ? (float)(1.0 / count) : 0.0f;
    }
}
// The loss stays on the device, in metrics->loss.
static void crossentropy_forward_gpu(float* probs, float* nll, const float* logits, const int* targets, const float* mask, int N, int V,
                                     Metrics* metrics, cudaStream_t stream) {
    LAUNCH(crossentropy_forward_kernel, ceil_div(N, 4), 128, 0, stream)(probs, nll, logits, targets, N, V);
    launchCheck();
    LAUNCH(crossentropy_loss_kernel, 1, 256, 0, stream)(metrics, nll, mask, N);
    launchCheck();
}

// dlogits = mask[n] / sum(mask) * (probs - onehot(target)), in place, the
// mask and 1 / sum(mask) (from the forward) fused in. One thread per logit.
__global__ void crossentropy_backward_kernel(float* dlogits_probs, const int* targets, const float* mask, int N, int V, const Metrics* metrics) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * V) return;
    size_t n = idx / V;
    float s = mask[n] * metrics->inv_count;
    float g = dlogits_probs[idx] * s;
    if ((int)(idx % V) == targets[n]) g -= s;
    dlogits_probs[idx] = g;
}
static void crossentropy_backward_gpu(float* dlogits_probs, const int* targets, const float* mask, int N, int V, const Metrics* metrics,
                                      cudaStream_t stream) {
    LAUNCH(crossentropy_backward_kernel, ceil_div((size_t)N * V, 256), 256, 0, stream)(dlogits_probs, targets, mask, N, V, metrics);
    launchCheck();
}
#endif

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

#ifdef LIME_GPU
// Global norm in two fixed-order steps: `blocks` blocks (a number that depends
// on n alone) each sum a strided share of g^2 in double, then one block adds
// the partial sums and sets the clip scale.
#define NORM_THREADS 256
static int grad_norm_blocks(size_t n) { return (int)std::min<size_t>(1024, ceil_div(n, NORM_THREADS * 16)); }
__global__ void grad_sumsq_kernel(double* partial, const float* g, size_t n) {
    __shared__ double part[NORM_THREADS];
    double s = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) s += (double)g[i] * g[i];
    s = block_sum(s, part);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
__global__ void grad_norm_kernel(Metrics* metrics, const double* partial, int blocks, const AdamWStep* step) {
    __shared__ double part[NORM_THREADS];
    double s = 0;
    for (int b = threadIdx.x; b < blocks; b += blockDim.x) s += partial[b];
    s = block_sum(s, part);
    if (threadIdx.x == 0) {
        float norm = (float)sqrt(s), clip = step->grad_clip;
        metrics->norm = norm;
        metrics->clip_scale = clip > 0 ? fminf(1.0f, clip / (norm + 1e-6f)) : 1.0f;
    }
}
// partial: grad_norm_blocks(n) doubles.
static void grad_norm_gpu(Metrics* metrics, double* partial, const float* g, size_t n, const AdamWStep* step, cudaStream_t stream) {
    int blocks = grad_norm_blocks(n);
    LAUNCH(grad_sumsq_kernel, blocks, NORM_THREADS, 0, stream)(partial, g, n);
    launchCheck();
    LAUNCH(grad_norm_kernel, 1, NORM_THREADS, 0, stream)(metrics, partial, blocks, step);
    launchCheck();
}

// AdamW over every tensor in one launch. Element i finds its tensor by binary
// search in a small table (tensor_end: where each tensor ends, in order;
// tensor_group: its AdamW group), so the group picks lr and weight decay.
__global__ void adamw_kernel(float* p, float* m, float* v, const float* g, size_t n, const size_t* tensor_end, const int* tensor_group,
                             int n_tensors, const AdamWStep* step, const Metrics* metrics) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int lo = 0, hi = n_tensors - 1;  // the first tensor that ends past i
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (tensor_end[mid] > i) hi = mid;
        else lo = mid + 1;
    }
    int group = tensor_group[lo];
    float lr = group == GROUP_ROUTER ? step->router_lr : step->lr;
    float wd = group == GROUP_MATRIX ? step->weight_decay : 0.0f;
    float gi = g[i] * metrics->clip_scale;
    float mi = step->beta1 * m[i] + (1.0f - step->beta1) * gi;
    float vi = step->beta2 * v[i] + (1.0f - step->beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float mhat = mi / step->bc1, vhat = vi / step->bc2;
    p[i] -= lr * wd * p[i] + lr * mhat / (sqrtf(vhat) + step->eps);
}
static void adamw_gpu(float* p, float* m, float* v, const float* g, size_t n, const size_t* tensor_end, const int* tensor_group, int n_tensors,
                      const AdamWStep* step, const Metrics* metrics, cudaStream_t stream) {
    LAUNCH(adamw_kernel, ceil_div(n, 256), 256, 0, stream)(p, m, v, g, n, tensor_end, tensor_group, n_tensors, step, metrics);
    launchCheck();
}
#endif

// ===========================================================================
// The model: one code path for both devices.
//
// forward_pass, backward_pass and update_pass are written once. Each of their
// steps is an op_*() call that runs the CPU function or launches its GPU twin
// (DISPATCH is the one `if`). The activations are the same struct, Acts,
// carved by acts_carve over host memory for the CPU and over device memory
// for the GPU; the parameters are the same Params views, over host or device
// memory. On the GPU every op is queued on one stream and nothing inside a
// pass waits for the device, so a whole training step can be captured as a
// CUDA graph and replayed.
// ===========================================================================

#ifdef LIME_GPU
// Everything the GPU holds for one model; made by gpu_create, nothing allocated per step.
struct GpuState {
    float* mem = nullptr;            // params, grads, m, v: one cudaMalloc, laid out as on the host
    Params p, g;                     // views into mem, like the host's m->p, m->g
    Acts acts;                       // device activations, one cudaMalloc (acts.mem)
    void* small = nullptr;           // one cudaMalloc for the optimiser's table and numbers:
    size_t* tensor_end = nullptr;    //   (n_tensors) where each tensor ends in the parameter array
    int* tensor_group = nullptr;     //   (n_tensors) its AdamW group
    int n_tensors = 0;
    double* norm_partial = nullptr;  //   grad_norm_blocks(n_params) partial sums
    AdamWStep* step = nullptr;       //   this step's numbers, staged from the host
    Metrics* metrics = nullptr;      //   loss and norm, written by kernels
    cudaStream_t stream = nullptr;
    cublasHandle_t blas = nullptr;
    bool tf32 = true;                // the math mode the handle is set to
    // Pinned host staging: the batch and the step's numbers reach the device
    // through here. Two slots, so the host fills one while the device may
    // still copy out of the other; `copied` marks the end of a slot's copies.
    struct Slot {
        int* tokens;
        int* targets;
        float* mask;
        AdamWStep* step;
        cudaEvent_t copied;
    } slot[2] = {};
    int next_slot = 0;
    void* pinned = nullptr;          // one cudaMallocHost: both slots and metrics_host
    Metrics* metrics_host = nullptr;
    // One captured training step per (B, T, tf32), replayed by model_train_step.
    std::map<std::tuple<int, int, bool>, cudaGraphExec_t> graphs;
    size_t device_bytes = 0;         // what the three cudaMallocs hold
};
static bool g_tf32 = true;  // gpu_set_tf32: applied to a model's cuBLAS handle at its next call
static Attention g_attention = ATTENTION_AUTO;  // gpu_set_attention: read by gpu_create
static void gpu_stage(Model* m, const int* tokens, const int* targets, const float* mask, int N, const AdamWStep* step);
static std::string gpu_create(Model* m);
static void gpu_free(Model* m);
static void gpu_read_metrics(Model* m);
static cudaStream_t stream_of(const Model* m) { return m->gpu->stream; }
static cublasHandle_t blas_of(const Model* m) { return m->gpu->blas; }
#define DISPATCH(m, gpu_call, cpu_call) \
    do {                                \
        if ((m)->device == DEVICE_GPU) {  \
            gpu_call;                   \
        } else {                        \
            cpu_call;                   \
        }                               \
    } while (0)
#else
#define DISPATCH(m, gpu_call, cpu_call) \
    do {                                \
        (void)(m);                      \
        cpu_call;                       \
    } while (0)
#endif

#ifndef LIME_GPU
static const char NO_GPU_BUILD[] = "this build has no GPU support (built without nvcc); use --device cpu, or install the CUDA Toolkit and run make";
#endif

// What this machine can still give without swapping: MemAvailable of a
// /proc/meminfo-style file, in bytes; 0 where unknown (not Linux). Checked
// before the activations are allocated, because calloc would succeed anyway
// (pages are promised, not given) and the run would then be killed, or crawl
// in swap, part way through its first step.
static size_t memory_available(const char* meminfo) {
    FILE* f = fopen(meminfo, "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (size_t)kb * 1024;
}

std::string model_create(Model* m, const Config& c, int B, Device dev) {
    std::string err = config_check(c);
    if (!err.empty()) return err;
    if (B < 1) return "--batch must be at least 1";
    m->c = c;
    m->B = B;
    m->device = dev;
    m->specs = param_specs(c);
    m->n_params = param_count(c);
    // parameters, gradients, m, v: one allocation each group (on the GPU, the host copies)
    size_t n = m->n_params;
    m->params = (float*)calloc(n * 4, sizeof(float));
    if (!m->params) return "out of memory allocating " + std::to_string(n * 16 / 1000000) + " MB for parameters and optimiser state";
    m->grads = m->params + n;
    m->m = m->params + 2 * n;
    m->v = m->params + 3 * n;
    m->p = params_carve(c, m->params);
    m->g = params_carve(c, m->grads);
    m->acts = new Acts();
    m->step = 0;
    if (dev == DEVICE_GPU) {
        // The device holds the activations; the host keeps only the logits, for model_logits.
        float* logits = (float*)calloc((size_t)B * c.T * c.V, sizeof(float));
        if (!logits) return "out of memory allocating the host copy of the logits";
        m->acts->mem = m->acts->logits = logits;
#ifdef LIME_GPU
        return gpu_create(m);
#else
        return NO_GPU_BUILD;
#endif
    }
    size_t na = acts_carve(m->acts, c, B, nullptr), available = memory_available("/proc/meminfo");
    float* mem = available && na * sizeof(float) > available ? nullptr : (float*)calloc(na, sizeof(float));
    if (!mem) {
        char buf[200], free_part[64] = "";
        if (available) snprintf(free_part, sizeof free_part, ", %.1f GB is available", available / 1e9);
        snprintf(buf, sizeof buf, "out of memory: activations need %.1f GB at batch %d x %d positions%s; lower --batch or --seq-len",
                 na * 4.0 / 1e9, B, c.T, free_part);
        return buf;
    }
    acts_carve(m->acts, c, B, mem);
    m->acts->mem = mem;
    rope_tables(m->acts->rope_cos, m->acts->rope_sin, c.T, c.hd, c.rope_theta);
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
            int J = t.shape[1], R = c.R, l = J / R - 1;
            double b = std::sqrt(3.0 / J);
            for (size_t i = 0; i < t.numel; i++) p[i] = (float)((2.0 * rng.uniform() - 1.0) * b);
            for (int r = 0; r < R; r++)
                for (int k = 0; k < R; k++) p[r * J + (J - R) + k] = r == k ? 1.0f : 0.0f;
            // the variants (router_sources): 0 for the layers a router does not read;
            // average's fixed weights, 1/(l+1) for the same kv head of every layer
            uint64_t sources = router_sources(c, l);
            for (int r = 0; r < R; r++)
                for (int j = 0; j < J; j++) {
                    if (!(sources >> (j / R) & 1)) p[r * J + j] = 0.0f;
                    if (c.router == ROUTER_AVERAGE) p[r * J + j] = j % R == r ? 1.0f / (l + 1) : 0.0f;
                }
        } else if (t.shape.size() == 1) {
            for (size_t i = 0; i < t.numel; i++) p[i] = 1.0f;  // RMSNorm gains
        } else {
            for (size_t i = 0; i < t.numel; i++) p[i] = (float)(0.02 * rng.normal());
        }
    }
    // --router-kv separate: the value router starts as a copy of the key router,
    // so at step 0 the model computes what the shared one does; training alone
    // tells keys and values apart.
    for (int l = 0; l < c.L; l++)
        if (m->p.layer[l].router_v) memcpy(m->p.layer[l].router_v, m->p.layer[l].router, (size_t)c.R * (l + 1) * c.R * sizeof(float));
    memset(m->m, 0, 2 * m->n_params * sizeof(float));
    m->step = 0;
    model_to_device(m);  // initialised on the host, copied to the device
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
    la.att = A->att + l * BT * c.H * (A->flash ? 1 : T);
    la.o = A->o + l * BT * qd;
    la.m = A->m + l * BT * d;
    la.rstd_m = A->rstd_m + l * BT;
    la.gate = A->gate + l * BT * c.F;
    la.up = A->up + l * BT * c.F;
    la.h = A->h + l * BT * c.F;
    return la;
}

// What the passes work on: host memory for the CPU, device memory for the GPU.
static Acts* pass_acts(Model* m) {
#ifdef LIME_GPU
    if (m->device == DEVICE_GPU) return &m->gpu->acts;
#endif
    return m->acts;
}
static const Params& pass_params(Model* m) {
#ifdef LIME_GPU
    if (m->device == DEVICE_GPU) return m->gpu->p;
#endif
    return m->p;
}
static const Params& pass_grads(Model* m) {
#ifdef LIME_GPU
    if (m->device == DEVICE_GPU) return m->gpu->g;
#endif
    return m->g;
}
static float* pass_grads_base(Model* m) {  // all gradients, one array of n_params
#ifdef LIME_GPU
    if (m->device == DEVICE_GPU) return m->gpu->mem + m->n_params;
#endif
    return m->grads;
}

// --- the ops, each on either device ------------------------------------------
static void op_copy(Model* m, float* dst, const float* src, size_t n) {
    DISPATCH(m, cudaCheck(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_of(m))), copy_cpu(dst, src, n));
}
static void op_zero(Model* m, float* p, size_t n) {
    DISPATCH(m, cudaCheck(cudaMemsetAsync(p, 0, n * sizeof(float), stream_of(m))), zero_cpu(p, n));
}
static void op_add(Model* m, float* dst, const float* src, size_t n) {
    DISPATCH(m, add_inplace_gpu(dst, src, n, stream_of(m)), add_inplace(dst, src, n));
}
static void op_matmul_forward(Model* m, float* out, const float* inp, const float* W, int N, int C, int OC, bool accumulate = false) {
    DISPATCH(m, matmul_forward_gpu(out, inp, W, N, C, OC, accumulate, blas_of(m)),
             matmul_forward(out, inp, W, N, C, OC, m->acts->scratch, accumulate));
}
static void op_matmul_backward(Model* m, float* dinp, float* dW, const float* dout, const float* inp, const float* W, int N, int C, int OC) {
    DISPATCH(m, matmul_backward_gpu(dinp, dW, dout, inp, W, N, C, OC, blas_of(m)),
             matmul_backward(dinp, dW, dout, inp, W, N, C, OC, m->acts->scratch));
}
static void op_embedding_forward(Model* m, float* out, const int* tokens, const float* E, int N) {
    DISPATCH(m, embedding_forward_gpu(out, tokens, E, N, m->c.d, stream_of(m)), embedding_forward(out, tokens, E, N, m->c.d));
}
static void op_embedding_backward(Model* m, float* dE, const float* dout, const int* tokens, int N) {
    DISPATCH(m, embedding_backward_gpu(dE, dout, tokens, N, m->c.d, m->c.V, stream_of(m)), embedding_backward(dE, dout, tokens, N, m->c.d));
}
static void op_rmsnorm_forward(Model* m, float* out, float* rstd, const float* inp, const float* g, int N) {
    DISPATCH(m, rmsnorm_forward_gpu(out, rstd, inp, g, N, m->c.d, m->c.eps, stream_of(m)), rmsnorm_forward(out, rstd, inp, g, N, m->c.d, m->c.eps));
}
static void op_rmsnorm_backward(Model* m, float* dinp, float* dg, const float* dout, const float* inp, const float* g, const float* rstd, int N) {
    DISPATCH(m, rmsnorm_backward_gpu(dinp, dg, dout, inp, g, rstd, N, m->c.d, pass_acts(m)->scratch, stream_of(m)),
             rmsnorm_backward(dinp, dg, dout, inp, g, rstd, N, m->c.d));
}
static void op_rope_forward(Model* m, float* x, int B, int T, int nh) {
    const Acts* A = pass_acts(m);
    DISPATCH(m, rope_forward_gpu(x, A->rope_cos, A->rope_sin, B, T, nh, m->c.hd, stream_of(m)), rope_forward(x, A->rope_cos, A->rope_sin, B, T, nh, m->c.hd));
}
static void op_rope_backward(Model* m, float* dx, int B, int T, int nh) {
    const Acts* A = pass_acts(m);
    DISPATCH(m, rope_backward_gpu(dx, A->rope_cos, A->rope_sin, B, T, nh, m->c.hd, stream_of(m)),
             rope_backward(dx, A->rope_cos, A->rope_sin, B, T, nh, m->c.hd));
}
static void op_router_forward(Model* m, float* Kr, float* Vr, const float* Wk, const float* Wv, const float* Kbuf, const float* Vbuf, int l, int N) {
    const Config& c = m->c;
    DISPATCH(m, router_forward_gpu(Kr, Vr, Wk, Wv, Kbuf, Vbuf, l, N, c.R, c.hd, stream_of(m)),
             router_forward(Kr, Vr, Wk, Wv, Kbuf, Vbuf, l, N, c.R, c.hd));
}
static void op_router_backward(Model* m, float* dWk, float* dWv, float* dKbuf, float* dVbuf, const float* dKr, const float* dVr, const float* Wk,
                               const float* Wv, const float* Kbuf, const float* Vbuf, int l, int N) {
    const Config& c = m->c;
    uint64_t learned = router_learned(c, l);  // the variant's trainable columns
    DISPATCH(m, router_backward_gpu(dWk, dWv, dKbuf, dVbuf, dKr, dVr, Wk, Wv, Kbuf, Vbuf, l, learned, N, c.R, c.hd, stream_of(m)),
             router_backward(dWk, dWv, dKbuf, dVbuf, dKr, dVr, Wk, Wv, Kbuf, Vbuf, l, learned, N, c.R, c.hd));
}
// On the GPU, A->flash picks the flash-style kernels (att then holds each row's log-sum-exp).
static void op_attention_forward(Model* m, float* out, float* att, const float* q, const float* k, const float* v, int B, int T) {
    const Config& c = m->c;
    [[maybe_unused]] Acts* A = pass_acts(m);  // the GPU's scratch
    DISPATCH(m,
             if (A->flash) flash_attention_forward_gpu(out, att, q, k, v, B, T, c.H, c.R, c.hd, stream_of(m));
             else attention_forward_gpu(out, att, q, k, v, A->kt, A->vt, B, T, c.H, c.R, c.hd, A->scratch, blas_of(m), stream_of(m)),
             attention_forward(out, att, q, k, v, B, T, c.H, c.R, c.hd));
}
// out: the forward's output (flash backward needs dout . out per row).
static void op_attention_backward(Model* m, float* dq, float* dk, float* dv, const float* dout, const float* out, const float* q, const float* k,
                                  const float* v, const float* att, int B, int T) {
    const Config& c = m->c;
    [[maybe_unused]] Acts* A = pass_acts(m);  // the GPU's scratch
    (void)out;
    DISPATCH(m,
             if (A->flash) flash_attention_backward_gpu(dq, dk, dv, dout, out, q, k, v, att, B, T, c.H, c.R, c.hd, A->scratch, stream_of(m));
             else attention_backward_gpu(dq, dk, dv, A->datt, A->kt, A->vt, A->dkt, A->dvt, dout, q, k, v, att, B, T, c.H, c.R, c.hd,
                                         A->scratch, blas_of(m), stream_of(m)),
             attention_backward(dq, dk, dv, dout, q, k, v, att, B, T, c.H, c.R, c.hd));
}
static void op_swiglu_forward(Model* m, float* out, const float* gate, const float* up, size_t n) {
    DISPATCH(m, swiglu_forward_gpu(out, gate, up, n, stream_of(m)), swiglu_forward(out, gate, up, n));
}
static void op_swiglu_backward(Model* m, float* dgate, float* dup, const float* dout, const float* gate, const float* up, size_t n) {
    DISPATCH(m, swiglu_backward_gpu(dgate, dup, dout, gate, up, n, stream_of(m)), swiglu_backward(dgate, dup, dout, gate, up, n));
}
// The loss lands in m->last_loss on the CPU, in device memory (Metrics) on the GPU.
static void op_crossentropy_forward(Model* m, float* probs, float* nll, const float* logits, const int* targets, const float* mask, int N) {
    DISPATCH(m, crossentropy_forward_gpu(probs, nll, logits, targets, mask, N, m->c.V, m->gpu->metrics, stream_of(m)),
             m->last_loss = crossentropy_forward(probs, nll, logits, targets, mask, N, m->c.V));
}
static void op_crossentropy_backward(Model* m, float* dlogits_probs, const int* targets, const float* mask, int N) {
    DISPATCH(m, crossentropy_backward_gpu(dlogits_probs, targets, mask, N, m->c.V, m->gpu->metrics, stream_of(m)),
             crossentropy_backward(dlogits_probs, targets, mask, N, m->c.V));
}
// Global gradient norm: m->last_norm on the CPU, Metrics (with the clip scale) on the GPU.
static void op_grad_norm(Model* m) {
    DISPATCH(m, grad_norm_gpu(m->gpu->metrics, m->gpu->norm_partial, pass_grads_base(m), m->n_params, m->gpu->step, stream_of(m)),
             m->last_norm = (float)std::sqrt(grad_sumsq(m->grads, m->n_params)));
}
// AdamW on every tensor for step m->step. The GPU reads the step's numbers
// from device memory (staged by the caller), so a captured graph stays valid.
static void op_adamw(Model* m, const AdamWConfig& o, float factor) {
#ifdef LIME_GPU
    if (m->device == DEVICE_GPU) {
        GpuState* G = m->gpu;
        size_t n = m->n_params;
        adamw_gpu(G->mem, G->mem + 2 * n, G->mem + 3 * n, G->mem + n, n, G->tensor_end, G->tensor_group, G->n_tensors, G->step, G->metrics,
                  G->stream);
        return;
    }
#endif
    // as PyTorch's clip_grad_norm_: scale by min(1, clip / (norm + 1e-6))
    float scale = o.grad_clip > 0 ? std::min(1.0f, o.grad_clip / (m->last_norm + 1e-6f)) : 1.0f;
    float bc1 = 1.0f - powf(o.beta1, (float)m->step), bc2 = 1.0f - powf(o.beta2, (float)m->step);
    for (const TensorSpec& t : m->specs) {
        float lr, wd;
        group_lr(t, o, factor, &lr, &wd);
        adamw_cpu(m->params + t.offset, m->m + t.offset, m->v + t.offset, m->grads + t.offset, t.numel, lr, wd, scale, o, bc1, bc2);
    }
}

// --- the passes, written once ----------------------------------------------------

// The router that mixes the values: the one router of Eq. 2, or with
// --router-kv separate a second one (the same for gradients: Params alike).
static float* value_router(const LayerParams& w) { return w.router_v ? w.router_v : w.router; }

// Forward over the batch already in A->tokens (and A->targets, A->mask with a loss).
static void forward_pass(Model* m, int B, int T, bool with_loss) {
    const Config& c = m->c;
    Acts* A = pass_acts(m);
    const Params& P = pass_params(m);
    int N = B * T, d = c.d, qd = c.H * c.hd, kvd = c.R * c.hd;
    op_embedding_forward(m, A->x, A->tokens, P.E, N);  // x[0] (B, T, d)
    for (int l = 0; l < c.L; l++) {
        const LayerParams& w = P.layer[l];
        LayerActs la = layer_acts(A, c, l, B, T);
        // attention block
        op_rmsnorm_forward(m, la.a, la.rstd_a, la.x, w.g_attn, N);
        op_matmul_forward(m, la.q, la.a, w.Wq, N, d, qd);   // (B, T, H, hd)
        op_matmul_forward(m, la.K, la.a, w.Wk, N, d, kvd);  // (B, T, R, hd) into the buffer
        op_matmul_forward(m, la.V, la.a, w.Wv, N, d, kvd);
        const float* vr = la.V;
        if (has_router(c, l)) {  // LIMe: mix the buffer of layers 0..l
            op_router_forward(m, la.kr, la.vr, w.router, value_router(w), A->Kbuf, A->Vbuf, l, N);
            vr = la.vr;
        } else {                 // LLaMa, and LIMe's layer 0: own keys and values
            op_copy(m, la.kr, la.K, (size_t)N * kvd);
        }
        op_rope_forward(m, la.q, B, T, c.H);
        op_rope_forward(m, la.kr, B, T, c.R);
        op_attention_forward(m, la.o, la.att, la.q, la.kr, vr, B, T);
        op_copy(m, la.xa, la.x, (size_t)N * d);
        op_matmul_forward(m, la.xa, la.o, w.Wo, N, qd, d, true);  // xa = x + o @ Wo^T
        // MLP block
        op_rmsnorm_forward(m, la.m, la.rstd_m, la.xa, w.g_mlp, N);
        op_matmul_forward(m, la.gate, la.m, w.Wg, N, d, c.F);
        op_matmul_forward(m, la.up, la.m, w.Wu, N, d, c.F);
        op_swiglu_forward(m, la.h, la.gate, la.up, (size_t)N * c.F);
        op_copy(m, la.xnext, la.xa, (size_t)N * d);
        op_matmul_forward(m, la.xnext, la.h, w.Wd, N, c.F, d, true);  // x = xa + h @ Wd^T
    }
    float* xL = A->x + (size_t)c.L * N * d;
    op_rmsnorm_forward(m, A->hf, A->rstd_f, xL, P.g_final, N);
    op_matmul_forward(m, A->logits, A->hf, P.E, N, d, c.V);  // tied: logits = hf @ E^T
    if (with_loss) op_crossentropy_forward(m, A->probs, A->nll, A->logits, A->targets, A->mask, N);
}

static void backward_pass(Model* m, int B, int T) {
    const Config& c = m->c;
    Acts* A = pass_acts(m);
    const Params& P = pass_params(m);
    const Params& G = pass_grads(m);
    int N = B * T, d = c.d, qd = c.H * c.hd, kvd = c.R * c.hd;
    size_t kv_layer = (size_t)N * kvd;
    op_zero(m, pass_grads_base(m), m->n_params);
    op_zero(m, A->dKbuf, c.L * kv_layer);
    op_zero(m, A->dVbuf, c.L * kv_layer);
    // loss -> logits -> final norm
    float* dlogits = A->probs;
    op_crossentropy_backward(m, dlogits, A->targets, A->mask, N);
    op_zero(m, A->dnorm, (size_t)N * d);
    op_matmul_backward(m, A->dnorm, G.E, dlogits, A->hf, P.E, N, d, c.V);
    op_zero(m, A->dx, (size_t)N * d);
    float* xL = A->x + (size_t)c.L * N * d;
    op_rmsnorm_backward(m, A->dx, G.g_final, A->dnorm, xL, P.g_final, A->rstd_f, N);
    for (int l = c.L - 1; l >= 0; l--) {
        const LayerParams& w = P.layer[l];
        const LayerParams& gw = G.layer[l];
        LayerActs la = layer_acts(A, c, l, B, T);
        float* dK = A->dKbuf + l * kv_layer;  // (B, T, R, hd): complete once layers > l are done
        float* dV = A->dVbuf + l * kv_layer;
        // MLP block. forward: xnext = xa + h @ Wd^T, h = swiglu(m Wg^T, m Wu^T), m = rmsnorm(xa)
        op_zero(m, A->dh, (size_t)N * c.F);
        op_matmul_backward(m, A->dh, gw.Wd, A->dx, la.h, w.Wd, N, c.F, d);
        op_swiglu_backward(m, A->dgate, A->dup, A->dh, la.gate, la.up, (size_t)N * c.F);
        op_zero(m, A->dnorm, (size_t)N * d);
        op_matmul_backward(m, A->dnorm, gw.Wg, A->dgate, la.m, w.Wg, N, d, c.F);
        op_matmul_backward(m, A->dnorm, gw.Wu, A->dup, la.m, w.Wu, N, d, c.F);
        op_rmsnorm_backward(m, A->dx, gw.g_mlp, A->dnorm, la.xa, w.g_mlp, la.rstd_m, N);  // dx is now d xa
        // attention block. forward: xa = x + o @ Wo^T
        op_zero(m, A->dout, (size_t)N * qd);
        op_matmul_backward(m, A->dout, gw.Wo, A->dx, la.o, w.Wo, N, qd, d);
        bool routed = has_router(c, l);
        float* dvr = routed ? A->dvr : dV;  // without a router, attention's values are the buffer itself
        op_zero(m, A->dkr, kv_layer);
        if (routed) op_zero(m, A->dvr, kv_layer);
        op_attention_backward(m, A->dq, A->dkr, dvr, A->dout, la.o, la.q, la.kr, routed ? la.vr : la.V, la.att, B, T);
        op_rope_backward(m, A->dq, B, T, c.H);
        op_rope_backward(m, A->dkr, B, T, c.R);
        if (routed) {
            op_router_backward(m, gw.router, value_router(gw), A->dKbuf, A->dVbuf, A->dkr, A->dvr, w.router, value_router(w), A->Kbuf, A->Vbuf,
                               l, N);
        } else {
            op_add(m, dK, A->dkr, kv_layer);
        }
        // forward: q = a Wq^T, K = a Wk^T, V = a Wv^T, a = rmsnorm(x)
        op_zero(m, A->dnorm, (size_t)N * d);
        op_matmul_backward(m, A->dnorm, gw.Wq, A->dq, la.a, w.Wq, N, d, qd);
        op_matmul_backward(m, A->dnorm, gw.Wk, dK, la.a, w.Wk, N, d, kvd);
        op_matmul_backward(m, A->dnorm, gw.Wv, dV, la.a, w.Wv, N, d, kvd);
        op_rmsnorm_backward(m, A->dx, gw.g_attn, A->dnorm, la.x, w.g_attn, la.rstd_a, N);  // dx is now d x[l]
    }
    op_embedding_backward(m, G.E, A->dx, A->tokens, N);
}

// Global norm, clipping and AdamW (SPEC.md) for step m->step, counted by the caller.
static void update_pass(Model* m, const AdamWConfig& o, float factor) {
    op_grad_norm(m);
    op_adamw(m, o, factor);
}

// ===========================================================================
// The model's public calls
// ===========================================================================

// The batch into the activations (and, on the GPU, the step's numbers into
// device memory): plain copies on the CPU; on the GPU through pinned memory,
// queued on the stream. targets, mask and opt may be null.
static void stage(Model* m, const int* tokens, const int* targets, const float* mask, int N, const AdamWConfig* opt, float factor) {
#ifdef LIME_GPU
    if (m->device == DEVICE_GPU) {
        AdamWStep s = {};
        if (opt) {
            s.lr = opt->lr * factor;
            s.router_lr = opt->router_lr * factor;
            s.weight_decay = opt->weight_decay;
            s.beta1 = opt->beta1;
            s.beta2 = opt->beta2;
            s.eps = opt->eps;
            s.grad_clip = opt->grad_clip;
            s.bc1 = 1.0f - powf(opt->beta1, (float)m->step);
            s.bc2 = 1.0f - powf(opt->beta2, (float)m->step);
        }
        gpu_stage(m, tokens, targets, mask, N, opt ? &s : nullptr);
        return;
    }
#endif
    (void)opt;
    (void)factor;
    Acts* A = m->acts;
    if (tokens) memcpy(A->tokens, tokens, N * sizeof(int));
    if (targets) memcpy(A->targets, targets, N * sizeof(int));
    if (mask) memcpy(A->mask, mask, N * sizeof(float));
}

float model_forward(Model* m, const int* tokens, const int* targets, const float* mask, int B, int T) {
    m->cur_B = B;
    m->cur_T = T;
    stage(m, tokens, targets, mask, B * T, nullptr, 0);
    forward_pass(m, B, T, targets != nullptr);
#ifdef LIME_GPU
    if (m->device == DEVICE_GPU) {  // the logits to the host, for model_logits; waits for the device
        size_t n = (size_t)B * T * m->c.V;
        cudaCheck(cudaMemcpyAsync(m->acts->logits, m->gpu->acts.logits, n * sizeof(float), cudaMemcpyDeviceToHost, m->gpu->stream));
        gpu_read_metrics(m);
    }
#endif
    if (!targets) m->last_loss = 0;
    return m->last_loss;
}

const float* model_logits(Model* m) { return m->acts->logits; }

// The values layer l attended with in the last forward, (B, T, R, hd) in host
// memory: routed for LIMe's layers >= 1, the layer's own otherwise (analysis).
const float* model_values(Model* m, int l) {
    const Config& c = m->c;
    size_t n = (size_t)m->cur_B * m->cur_T * c.R * c.hd;  // one layer's slice, packed for this batch
#ifdef LIME_GPU
    if (m->device == DEVICE_GPU) {
        const Acts& D = m->gpu->acts;
        m->host_copy.resize(n);
        cudaCheck(cudaMemcpy(m->host_copy.data(), (has_router(c, l) ? D.vr : D.Vbuf) + l * n, n * sizeof(float), cudaMemcpyDeviceToHost));
        return m->host_copy.data();
    }
#endif
    return (has_router(c, l) ? m->acts->vr : m->acts->Vbuf) + l * n;
}

void model_backward(Model* m) { backward_pass(m, m->cur_B, m->cur_T); }

float model_update(Model* m, const AdamWConfig& opt, float factor) {
    m->step++;
    stage(m, nullptr, nullptr, nullptr, 0, &opt, factor);
    update_pass(m, opt, factor);
#ifdef LIME_GPU
    if (m->device == DEVICE_GPU) gpu_read_metrics(m);  // waits for the device
#endif
    return m->last_norm;
}

#ifdef LIME_GPU
// The training step captured once per (B, T, math mode) as a CUDA graph. The
// graph holds pointers and shapes only: the batch and the step's numbers are
// read from device memory that stage() fills before every replay.
static cudaGraphExec_t gpu_graph(Model* m, int B, int T, const AdamWConfig& opt, float factor) {
    GpuState* G = m->gpu;
    auto key = std::make_tuple(B, T, G->tf32);
    auto it = G->graphs.find(key);
    if (it != G->graphs.end()) return it->second;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    cudaCheck(cudaStreamBeginCapture(G->stream, cudaStreamCaptureModeThreadLocal));
    forward_pass(m, B, T, true);
    backward_pass(m, B, T);
    update_pass(m, opt, factor);
    cudaCheck(cudaStreamEndCapture(G->stream, &graph));
    cudaCheck(cudaGraphInstantiate(&exec, graph, 0));
    cudaCheck(cudaGraphDestroy(graph));
    G->graphs[key] = exec;
    return exec;
}
#endif

void model_train_step(Model* m, const int* tokens, const int* targets, const float* mask, int B, int T,
                      const AdamWConfig& opt, float factor) {
    m->cur_B = B;
    m->cur_T = T;
    m->step++;
    stage(m, tokens, targets, mask, B * T, &opt, factor);
#ifdef LIME_GPU
    if (m->device == DEVICE_GPU && m->use_graph) {  // no waiting: model_metrics waits when asked
        cudaCheck(cudaGraphLaunch(gpu_graph(m, B, T, opt, factor), m->gpu->stream));
        return;
    }
#endif
    forward_pass(m, B, T, true);
    backward_pass(m, B, T);
    update_pass(m, opt, factor);
}

void model_metrics(Model* m, float* loss, float* norm) {
#ifdef LIME_GPU
    if (m->device == DEVICE_GPU) gpu_read_metrics(m);
#endif
    *loss = m->last_loss;
    *norm = m->last_norm;
}

#ifdef LIME_GPU
// The host arrays (params, grads, m, v: 4 * n_params floats) to and from the device's, in one copy.
static void gpu_to_device(Model* m) {
    cudaCheck(cudaMemcpyAsync(m->gpu->mem, m->params, 4 * m->n_params * sizeof(float), cudaMemcpyHostToDevice, m->gpu->stream));
    cudaCheck(cudaStreamSynchronize(m->gpu->stream));
}
static void gpu_to_host(Model* m) {
    cudaCheck(cudaMemcpyAsync(m->params, m->gpu->mem, 4 * m->n_params * sizeof(float), cudaMemcpyDeviceToHost, m->gpu->stream));
    cudaCheck(cudaStreamSynchronize(m->gpu->stream));
}
#endif

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

// A lime config also names its router variant ("router": "last-2") and whether
// keys and values share it ("router_kv": "shared" or "separate"); a config
// without them (llama, HF files, older checkpoints) reads as static and shared.
std::string config_to_json(const Config& c) {
    std::string router = c.arch != ARCH_LIME ? ""
                         : ", \"router\": \"" + router_name(c) + "\", \"router_kv\": \"" + (c.router_kv_separate ? "separate" : "shared") + "\"";
    char buf[640];
    snprintf(buf, sizeof buf,
             "{\"architecture\": \"%s\", \"head_dim\": %d, \"hidden_size\": %d, \"intermediate_size\": %d, "
             "\"max_position_embeddings\": %d, \"num_attention_heads\": %d, \"num_hidden_layers\": %d, "
             "\"num_key_value_heads\": %d, \"rms_norm_eps\": %.9g, \"rope_theta\": %.9g%s, \"tie_word_embeddings\": true, "
             "\"vocab_size\": %d}",
             arch_name(c.arch), c.hd, c.d, c.F, c.T, c.H, c.L, c.R, c.eps, c.rope_theta, router.c_str(), c.V);
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
        double v = 0;
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
    const Json* router = j.get("router");
    c->router = ROUTER_STATIC;
    c->router_j = 0;
    if (router && (router->kind != Json::STR || !router_parse(router->str, c)))
        return "config \"router\" must be \"static\", \"average\", \"last-J\" or \"first-J\"";
    const Json* kv = j.get("router_kv");
    c->router_kv_separate = kv && kv->kind == Json::STR && kv->str == "separate";
    if (kv && (kv->kind != Json::STR || (kv->str != "shared" && kv->str != "separate")))
        return "config \"router_kv\" must be \"shared\" or \"separate\"";
    return config_check(*c);
}

std::string config_diff(const Config& a, const Config& b) {
    // the fields of config_to_json, compared as they are written there
    auto fields = [](const Config& c) {
        Json j;
        json_parse(config_to_json(c), &j);
        return j.obj;
    };
    std::vector<std::pair<std::string, Json>> fa = fields(a), fb = fields(b);
    std::string out;
    for (const auto& [key, value] : fa) {  // by key: only lime configs have "router"
        std::string va = json_dump(value), vb = "none";
        for (const auto& kv : fb) if (kv.first == key) vb = json_dump(kv.second);
        if (va != vb) out += (out.empty() ? "" : ", ") + key + " " + va + " vs " + vb;
    }
    return out;
}

// --- the checksum ------------------------------------------------------------
// model_save stores "checksum": "fnv1a64:" + 16 hex digits in the metadata:
// FNV-1a 64 (st_checksum) of a listing that names, in name order, every
// tensor with its dtype, its shape and the st_checksum of its bytes, then
// every other metadata entry. A flipped bit in the data or the metadata
// changes it; damage to the header's layout is st_parse's to find. Loading
// checks it when it is there (reference vectors and HF files have none).
struct ChecksumItem {
    std::string name, dtype;
    std::vector<int64_t> shape;
    const void* data;
    size_t bytes;
};

static std::string checksum_of(std::vector<ChecksumItem> items, const std::map<std::string, std::string>& meta) {
    std::sort(items.begin(), items.end(), [](const ChecksumItem& a, const ChecksumItem& b) { return a.name < b.name; });
    std::string listing;
    char hex[17];
    for (const ChecksumItem& t : items) {
        listing += t.name + '\0' + t.dtype + '\0';
        for (int64_t n : t.shape) listing += std::to_string(n) + ',';
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)st_checksum(t.data, t.bytes));
        listing += std::string(hex) + '\n';
    }
    for (const auto& kv : meta)
        if (kv.first != "checksum") listing += kv.first + '\0' + kv.second + '\n';
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)st_checksum(listing.data(), listing.size()));
    return std::string("fnv1a64:") + hex;
}

static std::string writer_checksum(const StWriter& w) {
    std::vector<ChecksumItem> items;
    for (const StWriter::Entry& e : w.entries) items.push_back({e.name, e.dtype, e.shape, e.data, e.bytes});
    return checksum_of(items, w.meta);
}

// "" when the file has no checksum or it matches, else the error.
static std::string checksum_verify(const SafeTensors& st, const std::string& path) {
    auto it = st.meta.find("checksum");
    if (it == st.meta.end()) return "";
    std::vector<ChecksumItem> items;
    for (const StTensor& t : st.tensors) items.push_back({t.name, t.dtype, t.shape, st.data.data() + t.begin, (size_t)(t.end - t.begin)});
    std::string got = checksum_of(items, st.meta);
    if (got == it->second) return "";
    return path + ": the checksum does not match (stored " + it->second + ", the contents give " + got +
           "): the file is corrupt; use an earlier checkpoint or train again";
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
    w.meta["checksum"] = writer_checksum(w);  // last: it covers the other metadata
    return st_write(path, w);
}

std::string checkpoint_read_config(const std::string& path, Config* c, std::map<std::string, std::string>* meta) {
    SafeTensors st;
    std::string err = st_read(path, &st);
    if (err.empty()) err = checksum_verify(st, path);
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
    if (err.empty()) err = checksum_verify(st, path);
    if (!err.empty()) return err;
    Config fc;
    auto it = st.meta.find("config");
    if (it == st.meta.end()) return path + ": no \"config\" in the metadata";
    err = config_from_json(it->second, &fc);
    if (!err.empty()) return path + ": " + err;
    if (config_to_json(fc) != config_to_json(m->c))
        return path + ": holds a different model than expected (" + config_diff(fc, m->c) + ", in the file vs expected)";
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

// --- training guards: where did a NaN or an Inf appear? ------------------------
std::string model_first_nonfinite(Model* m, bool params) {
    model_to_host(m);
    const float* base = params ? m->params : m->grads;
    for (const TensorSpec& t : m->specs)
        for (size_t i = 0; i < t.numel; i++)
            if (!std::isfinite(base[t.offset + i])) return t.name;
    return "";
}

// ===========================================================================
// GPU path: the device, its memory and the staging of each step. The kernels
// sit beside their CPU ops above; the passes are the model section's.
// ===========================================================================
#ifndef LIME_GPU
bool gpu_available(std::string* why) {
    *why = NO_GPU_BUILD;
    return false;
}
void gpu_set_tf32(bool) {}
void gpu_set_attention(Attention) {}
const char* model_attention_name(const Model*) { return "cpu"; }
bool gpu_info(GpuInfo*) { return false; }
size_t model_device_bytes(const Model*) { return 0; }
#endif
#ifdef LIME_GPU
bool gpu_available(std::string* why) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n < 1) {
        cudaGetLastError();  // clear it: asking is not a failure
        *why = std::string("no CUDA device found (cudaGetDeviceCount: ") + (err != cudaSuccess ? cudaGetErrorString(err) : "0 devices") +
               "); use --device cpu";
        return false;
    }
    return true;
}

void gpu_set_tf32(bool on) { g_tf32 = on; }
void gpu_set_attention(Attention a) { g_attention = a; }
const char* model_attention_name(const Model* m) { return !m->gpu ? "cpu" : m->gpu->acts.flash ? "flash" : "matmul"; }

// Sets the handle's math mode to gpu_set_tf32's choice: TF32 tensor cores, or plain float32.
static void gpu_apply_math(GpuState* G) {
    if (G->tf32 == g_tf32) return;
    cublasCheck(cublasSetMathMode(G->blas, g_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    G->tf32 = g_tf32;
}

// Dense peaks (TFLOP/s, no sparsity) of a few data-centre GPUs, for MFU; the first row whose name the device's contains.
struct GpuPeak { const char* name; double tf32, fp32; };
static const GpuPeak GPU_PEAKS[] = {
    {"H200", 494.7, 66.9},        // SXM; GH200 matches too
    {"H100 PCIe", 378.0, 51.2},
    {"H100", 494.7, 66.9},        // SXM
    {"A100", 156.0, 19.5},
    {"L40S", 183.0, 91.6},
    {"A10", 62.5, 31.2},
};

bool gpu_info(GpuInfo* info) {
    std::string why;
    if (!gpu_available(&why)) return false;
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    info->name = prop.name;
    info->major = prop.major;
    info->minor = prop.minor;
    cudaCheck(cudaMemGetInfo(&info->free_bytes, &info->total_bytes));
    info->peak_tf32 = info->peak_fp32 = 0;
    info->peak_source = "unknown device: no MFU";
    for (const GpuPeak& p : GPU_PEAKS)
        if (info->name.find(p.name) != std::string::npos) {
            info->peak_tf32 = p.tf32;
            info->peak_fp32 = p.fp32;
            info->peak_source = std::string(p.name) + " datasheet, dense";
            return true;
        }
    if (prop.major == 9 && prop.minor == 0) { info->peak_tf32 = 494.7; info->peak_fp32 = 66.9; info->peak_source = "sm_90: H100 SXM datasheet, dense"; }
    if (prop.major == 8 && prop.minor == 0) { info->peak_tf32 = 156.0; info->peak_fp32 = 19.5; info->peak_source = "sm_80: A100 datasheet, dense"; }
    return true;
}

size_t model_device_bytes(const Model* m) { return m->gpu ? m->gpu->device_bytes : 0; }

// cuBLAS's workspace, ours so that graph capture allocates nothing (32 MiB: NVIDIA's advice for Hopper).
static const size_t CUBLAS_WORKSPACE_BYTES = 32u << 20;

static std::string gpu_out_of_memory(size_t need, size_t free_bytes) {
    char buf[200];
    snprintf(buf, sizeof buf, "needs %.2f GB of GPU memory, the device has %.2f GB free; lower --batch or --seq-len", need / 1e9, free_bytes / 1e9);
    return buf;
}

// Device memory (three cudaMallocs), pinned staging (one cudaMallocHost), the
// stream, the cuBLAS handle; then the host's parameters copied over.
static std::string gpu_create(Model* m) {
    std::string why;
    if (!gpu_available(&why)) return why;
    const Config& c = m->c;
    GpuState* G = m->gpu = new GpuState();
    size_t n = m->n_params, BT = (size_t)m->B * c.T;
    if (g_attention == ATTENTION_FLASH && c.hd > FLASH_MAX_HD)
        return "--attention flash handles head dims up to " + std::to_string(FLASH_MAX_HD) + ", this model has " + std::to_string(c.hd) +
               "; use --attention matmul";
    // sizes first, so that too big a model is refused with a message, not an abort
    bool flash = g_attention == ATTENTION_FLASH;
    size_t acts_floats = acts_carve(&G->acts, c, m->B, nullptr, DEVICE_GPU, flash);
    G->n_tensors = (int)m->specs.size();
    int norm_blocks = grad_norm_blocks(n);
    size_t small_bytes = 0;
    auto place = [](size_t* off, size_t bytes) { size_t at = *off; *off += (bytes + 255) & ~(size_t)255; return at; };
    size_t at_end = place(&small_bytes, G->n_tensors * sizeof(size_t)), at_group = place(&small_bytes, G->n_tensors * sizeof(int));
    size_t at_partial = place(&small_bytes, norm_blocks * sizeof(double)), at_step = place(&small_bytes, sizeof(AdamWStep));
    size_t at_metrics = place(&small_bytes, sizeof(Metrics));
    size_t at_workspace = place(&small_bytes, CUBLAS_WORKSPACE_BYTES);
    size_t fixed_bytes = 4 * n * sizeof(float) + small_bytes, need = fixed_bytes + acts_floats * sizeof(float);
    size_t free_bytes = 0, total_bytes = 0;
    cudaCheck(cudaSetDevice(0));
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    if (need > free_bytes && g_attention == ATTENTION_AUTO && c.hd <= FLASH_MAX_HD) {  // the (T, T) probabilities do not fit: flash
        flash = true;
        acts_floats = acts_carve(&G->acts, c, m->B, nullptr, DEVICE_GPU, flash);
        need = fixed_bytes + acts_floats * sizeof(float);
    }
    if (need > free_bytes) return gpu_out_of_memory(need, free_bytes);
    auto device_alloc = [&](void** p, size_t bytes) {
        if (cudaMalloc(p, bytes) == cudaSuccess) return true;
        cudaGetLastError();
        *p = nullptr;
        return false;
    };
    if (!device_alloc((void**)&G->mem, 4 * n * sizeof(float)) || !device_alloc((void**)&G->acts.mem, acts_floats * sizeof(float)) ||
        !device_alloc(&G->small, small_bytes))
        return gpu_out_of_memory(need, free_bytes);
    G->device_bytes = need;
    G->p = params_carve(c, G->mem);
    G->g = params_carve(c, G->mem + n);
    acts_carve(&G->acts, c, m->B, G->acts.mem, DEVICE_GPU, flash);
    char* small = (char*)G->small;
    G->tensor_end = (size_t*)(small + at_end);
    G->tensor_group = (int*)(small + at_group);
    G->norm_partial = (double*)(small + at_partial);
    G->step = (AdamWStep*)(small + at_step);
    G->metrics = (Metrics*)(small + at_metrics);
    cudaCheck(cudaStreamCreateWithFlags(&G->stream, cudaStreamNonBlocking));
    cublasCheck(cublasCreate(&G->blas));
    cublasCheck(cublasSetStream(G->blas, G->stream));
    // after cublasSetStream (which resets it): cuBLAS then allocates nothing while a graph is captured
    cublasCheck(cublasSetWorkspace(G->blas, small + at_workspace, CUBLAS_WORKSPACE_BYTES));
    G->tf32 = g_tf32;
    cublasCheck(cublasSetMathMode(G->blas, g_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    // pinned staging: per slot tokens, targets, mask (B*T each) and the step's numbers; then the metrics
    size_t pinned_bytes = 0, at_slot[2][4];
    for (auto& s : at_slot) {
        s[0] = place(&pinned_bytes, BT * sizeof(int));
        s[1] = place(&pinned_bytes, BT * sizeof(int));
        s[2] = place(&pinned_bytes, BT * sizeof(float));
        s[3] = place(&pinned_bytes, sizeof(AdamWStep));
    }
    size_t at_metrics_host = place(&pinned_bytes, sizeof(Metrics));
    cudaCheck(cudaMallocHost(&G->pinned, pinned_bytes));
    char* pinned = (char*)G->pinned;
    for (int k = 0; k < 2; k++) {
        GpuState::Slot& s = G->slot[k];
        s.tokens = (int*)(pinned + at_slot[k][0]);
        s.targets = (int*)(pinned + at_slot[k][1]);
        s.mask = (float*)(pinned + at_slot[k][2]);
        s.step = (AdamWStep*)(pinned + at_slot[k][3]);
        cudaCheck(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
    }
    G->metrics_host = (Metrics*)(pinned + at_metrics_host);
    // the optimiser's table: where each tensor ends, its group
    std::vector<size_t> ends;
    std::vector<int> groups;
    for (const TensorSpec& t : m->specs) {
        ends.push_back(t.offset + t.numel);
        groups.push_back((int)t.group);
    }
    // (every copy on the model's stream: it does not wait for the legacy stream; gpu_to_device below waits)
    cudaCheck(cudaMemcpyAsync(G->tensor_end, ends.data(), ends.size() * sizeof(size_t), cudaMemcpyHostToDevice, G->stream));
    cudaCheck(cudaMemcpyAsync(G->tensor_group, groups.data(), groups.size() * sizeof(int), cudaMemcpyHostToDevice, G->stream));
    cudaCheck(cudaMemsetAsync(G->metrics, 0, sizeof(Metrics), G->stream));
    // the RoPE tables, computed on the host as the CPU path's
    std::vector<float> cos_t((size_t)c.T * c.hd / 2), sin_t((size_t)c.T * c.hd / 2);
    rope_tables(cos_t.data(), sin_t.data(), c.T, c.hd, c.rope_theta);
    cudaCheck(cudaMemcpyAsync(G->acts.rope_cos, cos_t.data(), cos_t.size() * sizeof(float), cudaMemcpyHostToDevice, G->stream));
    cudaCheck(cudaMemcpyAsync(G->acts.rope_sin, sin_t.data(), sin_t.size() * sizeof(float), cudaMemcpyHostToDevice, G->stream));
    gpu_to_device(m);
    return "";
}

static void gpu_free(Model* m) {
    GpuState* G = m->gpu;
    if (G->stream) cudaCheck(cudaStreamSynchronize(G->stream));
    for (auto& kv : G->graphs) cudaCheck(cudaGraphExecDestroy(kv.second));
    for (auto& s : G->slot)
        if (s.copied) cudaCheck(cudaEventDestroy(s.copied));
    if (G->blas) cublasCheck(cublasDestroy(G->blas));
    if (G->stream) cudaCheck(cudaStreamDestroy(G->stream));
    cudaCheck(cudaFreeHost(G->pinned));
    cudaCheck(cudaFree(G->small));
    cudaCheck(cudaFree(G->acts.mem));
    cudaCheck(cudaFree(G->mem));
    delete G;
    m->gpu = nullptr;
}

// Host arrays -> pinned slot -> device, queued on the stream. The slot used
// two calls ago is reused: waiting for its copies to finish is the only
// waiting here, and it lets the host run up to two steps ahead of the device.
static void gpu_stage(Model* m, const int* tokens, const int* targets, const float* mask, int N, const AdamWStep* step) {
    GpuState* G = m->gpu;
    gpu_apply_math(G);
    GpuState::Slot& s = G->slot[G->next_slot];
    G->next_slot ^= 1;
    cudaCheck(cudaEventSynchronize(s.copied));
    Acts& A = G->acts;
    auto up = [&](void* dst, void* pinned, const void* src, size_t bytes) {
        memcpy(pinned, src, bytes);
        cudaCheck(cudaMemcpyAsync(dst, pinned, bytes, cudaMemcpyHostToDevice, G->stream));
    };
    if (tokens) up(A.tokens, s.tokens, tokens, N * sizeof(int));
    if (targets) up(A.targets, s.targets, targets, N * sizeof(int));
    if (mask) up(A.mask, s.mask, mask, N * sizeof(float));
    if (step) up(G->step, s.step, step, sizeof(AdamWStep));
    cudaCheck(cudaEventRecord(s.copied, G->stream));
}

// Waits for the device, then reads the loss and the gradient norm.
static void gpu_read_metrics(Model* m) {
    GpuState* G = m->gpu;
    cudaCheck(cudaMemcpyAsync(G->metrics_host, G->metrics, sizeof(Metrics), cudaMemcpyDeviceToHost, G->stream));
    cudaCheck(cudaStreamSynchronize(G->stream));
    m->last_loss = G->metrics_host->loss;
    m->last_norm = G->metrics_host->norm;
}
#endif
