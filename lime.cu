// lime.cu — LIMe (Layer-Integrated Memory, arXiv 2502.09245) beside its
// LLaMa baseline: the model, forward and backward of every op, and AdamW.
//
// LLaMa is LIMe without routers. In LIMe every layer keeps its keys and
// values in a buffer; layer l >= 1 attends not with its own K[l], V[l] but
// with a learned mixture of all buffered layers 0..l (Eq. 2 of the paper):
//   Kr[t, r] = sum_{l' <= l, r'} W[l][r, l'*R + r'] * K[l'][t, r']
// The buffer is head-major, a row of B*T*hd floats per (layer, kv head), so
// the mixture is one matrix product, Kr = W[l] @ Kbuf[0:(l+1)R], run by the
// matrix products' own code. That mixture, `router_forward`, is the one place
// the two models differ: `if (has_router(c, l))` in forward_pass and
// backward_pass. The paper's other baseline, Hyper-Connections (--arch hc),
// widens the residual stream into n streams; its ops replace the sublayer's
// input and its residual add, the `if (hc)` lines of the same passes.
//
// Read it top to bottom; its parts, in this order:
//   1. the config and the parameters: the router variants' fixed weights
//      (router_sources), param_specs (every tensor, its HF name and its AdamW
//      group), params_carve; then the activations (Acts, carved from one
//      allocation by acts_carve);
//   2. where the ops run: sums in a fixed order, the CUDA checking macros and
//      the kernels' helpers (ceil_div, warp_sum, block_sum), DISPATCH (the one
//      `if` between the devices);
//   3. the GPU runtime, one #include (support/model/gpu_runtime.cuh: GpuState,
//      Metrics, staging, graph capture, stream_of, pass_acts): no op in it;
//   4. the ops, one section each: its math with shapes, the plain CPU loops
//      (forward, then backward restating the forward line it differentiates),
//      the CUDA kernel and its launcher, and the op's dispatcher op_*();
//      in order: matrix products (with the K and V projections into the KV
//      buffer, the copies, zeros and the buffer's transpose), embedding,
//      RMSNorm, RoPE, the KV router, Hyper-Connections, attention, SwiGLU,
//      cross-entropy, the value-entropy regulariser (a loss term,
//      --entropy-reg), AdamW;
//   5. forward_pass, backward_pass and update_pass: the model, written once
//      for both devices and both architectures;
//   6. the public calls (support/model/lime.h): model_create (with the memory
//      estimate, support/model/memory_check.h), model_init, model_forward,
//      model_probe, model_train_step, ..., and the training guard
//      model_first_nonfinite.
// Elsewhere: the config's names and checks (config_check) are
// support/model/names.cpp, the cost model (flops_per_token, bytes_per_token)
// support/model/cost.cpp, the flash attention kernels
// support/model/flash_attention.cuh (included in the attention section).
// What runs, from train.cpp's train_loop to the router's products (README,
// "Reading the code"; tests/test_docs.sh checks each hop):
//   train_loop -> take_step -> model_train_step -> forward_pass
//     -> op_router_forward -> router_forward -> matmul_backward_cpu
//        -> matmul_backward_fast (./lime) | matmul_backward (./lime-ref)
//     -> (GPU) router_forward_gpu -> matmul_backward_gpu (cuBLAS)
//   model_train_step -> backward_pass -> op_router_backward -> router_backward
//     -> matmul_forward_cpu (dW) and matmul_backward_cpu (dKbuf); GPU: router_backward_gpu
// Every function takes outputs, inputs, weights, sizes, in that order. The
// math is docs/model.md and docs/training.md; the names are its names:
//   B batch, T positions, V vocabulary, L layers, d width, H query heads,
//   R key/value heads, hd = d / H head size, F SwiGLU hidden size, N = B*T.
//
// The CPU loops here are the reference: short and plain. ./lime runs faster
// versions of four groups of them (the matrix product, which also runs the
// router; attention; Hyper-Connections; the value-entropy regulariser) from
// support/model/cpu_fast.cpp, checked against these by the tests; `make lime-ref`
// builds the program on the plain loops alone (-DLIME_REFERENCE).
//
// Builds: g++ -x c++ lime.cu (CPU only); nvcc (CPU and GPU); g++ -DLIME_EMU
// with support/harness/cuda_on_cpu.h (the CUDA kernels run on the CPU, for tests).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "support/lib/rng.h"
#include "support/model/cpu_fast.h"
#include "support/model/lime.h"

#if defined(LIME_EMU)  // g++ with the harness: the CUDA code runs on the CPU
#include "support/harness/cuda_on_cpu.h"
#define LIME_GPU 1
#elif defined(__CUDACC__)
#include <cublas_v2.h>
#include <cuda_runtime.h>
#define LIME_GPU 1
#define LAUNCH(kernel, grid, block, smem, stream) kernel<<<(grid), (block), (smem), (stream)>>>
#define DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

// The CPU runs the fast kernels of support/model/cpu_fast.cpp, except in the
// reference build (make lime-ref) and the labs' build, which run only the plain loops below.
#if defined(LIME_REFERENCE) || defined(LIME_LAB)
static const bool FAST_CPU = false;
#else
static const bool FAST_CPU = true;
#endif

// The classroom labs (labs/README.md) build lime.cu once with -DLIME_LAB: the
// functions marked LAB_SWAPPABLE become weak symbols, and a student's file
// that defines one is linked in its place. Elsewhere they are plain statics.
#ifdef LIME_LAB
#define LAB_SWAPPABLE __attribute__((weak))
#else
#define LAB_SWAPPABLE static
#endif

// ===========================================================================
// Config and parameters
// ===========================================================================

// --- router variants (paper Appendix D, Table 7) -----------------------------
// Each variant is the static router of Eq. 2 with some of its weights held
// fixed. router_sources(c, l) holds source layer l' when layer l's router may
// give it (its columns l'*R .. l'*R + R-1) a non-zero weight:
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
// The weights a variant holds fixed get no gradient (router_backward adds only the
// columns router_learned keeps) and routers have no weight decay, so
// AdamW never moves them: they stay exactly as model_init set them.
RouterSpan router_sources(const Config& c, int l) {
    RouterSpan s;  // below 0, from 0: every layer 0..l (static, average)
    if (c.router == ROUTER_LAST) s.from = l - c.router_j + 1;
    if (c.router == ROUTER_FIRST) s.below = c.router_j, s.from = l - 1;
    return s;
}
// frozen (the control for "routing helps only by adding gradient paths"):
// no weight is learned, so every router stays as model_init set it.
RouterSpan router_learned(const Config& c, int l) {
    if (c.router == ROUTER_AVERAGE || c.router_frozen) return RouterSpan{0, l + 1};  // none
    return router_sources(c, l);
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
        if (has_router(c, l) && c.router_kv_separate)
            add(p + "self_attn.router_v.weight", {c.R, (l + 1) * c.R}, GROUP_ROUTER);
        add(p + "post_attention_layernorm.weight", {c.d}, GROUP_EMBED_GAIN);
        add(p + "mlp.gate_proj.weight", {c.F, c.d}, GROUP_MATRIX);
        add(p + "mlp.up_proj.weight", {c.F, c.d}, GROUP_MATRIX);
        add(p + "mlp.down_proj.weight", {c.d, c.F}, GROUP_MATRIX);
        for (const char* sub : {"hc_attn.", "hc_mlp."}) {  // Hyper-Connections: n streams
            if (c.arch != ARCH_HC) break;
            int n = c.hc_rate;
            add(p + sub + "static_beta", {n}, GROUP_EMBED_GAIN);
            add(p + sub + "static_alpha", {n, n + 1}, GROUP_EMBED_GAIN);
            if (!c.hc_dynamic) continue;
            add(p + sub + "dynamic_alpha_fn", {c.d, n + 1}, GROUP_MATRIX);
            add(p + sub + "dynamic_alpha_scale", {1}, GROUP_MATRIX);
            add(p + sub + "dynamic_beta_fn", {c.d}, GROUP_MATRIX);
            add(p + sub + "dynamic_beta_scale", {1}, GROUP_MATRIX);
        }
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
        for (int s = 0; s < (c.arch == ARCH_HC ? 2 : 0); s++) {  // hc_attn, hc_mlp
            HcParams h = {};
            h.static_beta = next();
            h.static_alpha = next();
            if (c.hc_dynamic) h.alpha_fn = next(), h.alpha_scale = next(), h.beta_fn = next(), h.beta_scale = next();
            p.hc.push_back(h);
        }
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
    // forward, kept for backward. With hc, the residual stream is n streams:
    // x, xa and dx are n times wider, (.., n, B, T, d) stream-major (Hyper-Connections).
    float* x;        // (L+1, B, T, d) residual stream entering layer l; x[L] enters the final norm
    float* xa;       // (L, B, T, d)   residual stream after attention
    float* attn_in;  // (L, B, T, d)   rmsnorm(x) entering attention
    float* rstd_a;   // (L, B, T)
    float* q;        // (L, B, T, H, hd) queries after RoPE
    float* Kbuf;     // (L, R, B, T, hd) the KV buffer, head-major (a row of B*T*hd per layer, kv head): keys before RoPE
    float* Vbuf;     // (L, R, B, T, hd) ... and values
    float* kr;       // (L, R, B, T, hd) keys attention reads (routed, after RoPE)
    float* vr;       // (L, R, B, T, hd) values attention reads (routed; unused without a router)
    float* att;      // (L, B, H, T, T) attention probabilities; with flash, (L, B, H, T): each row's log-sum-exp
    float* o;        // (L, B, T, H*hd) attention output, heads concatenated
    float* mlp_in;   // (L, B, T, d)   rmsnorm(xa) entering the MLP
    float* rstd_m;   // (L, B, T)
    float* gate;     // (L, B, T, F)   mlp_in @ Wg^T
    float* up;       // (L, B, T, F)   mlp_in @ Wu^T
    float* h;        // (L, B, T, F)   silu(gate) * up
    float* hf;       // (B, T, d)      final rmsnorm
    float* rstd_f;   // (B, T)
    float* logits;   // (B, T, V)
    float* probs;    // (B, T, V)      softmax(logits); backward turns it into dlogits
    float* nll;      // (B, T)         -log p(target)
    int* targets;    // (B, T)         copies of the batch, for backward
    float* mask;     // (B, T)
    int* tokens;     // (B, T)
    float* valid;    // (B, T)         1 where the position holds a token of its sequence (the regulariser's)
    // the value-entropy regulariser, sized 0 when entropy_reg is 0; D = R*hd
    float* ereg_V;   // (L, B, T, D)   the values token-major, as the regulariser reads them
    float* ereg_mu;  // (L, B, D)      each sequence's mean value over its valid positions
    float* ereg_G;   // (L, B, D, D)   the Gram matrix of the centred values, G = Z^T Z (the fast CPU path:
                     //                K = Z Z^T (n_b, n_b) instead where n_b < D, support/model/cpu_fast.cpp)
    float* ereg_stat;// (L, B, 4)      S2, 4 / tr(G), 4 / ||G||_F^2 (0, 0, 0 for a sequence without an S2), unused
    // backward scratch
    float* dx;       // (B, T, d) gradient of the residual stream
    float* dnorm;    // (B, T, d) gradient of a norm's output
    float* dq;       // (B, T, H, hd)
    float* dkr;      // (R, B, T, hd)
    float* dvr;      // (R, B, T, hd); also token-major (B, T, R*hd): the regulariser's dV
    float* dKbuf;    // (L, R, B, T, hd) gradient of the KV buffer, filled by layers >= l
    float* dVbuf;    // (L, R, B, T, hd)
    float* dout;     // (B, T, H*hd) gradient of the attention output
    float* dgate;    // (B, T, F)
    float* dup;      // (B, T, F)
    float* dh;       // (B, T, F)
    float* datt;     // (B, H, T, T) GPU attention scratch (empty on the CPU)
    float* scratch;  // CPU: partial sums and buffers of one op at a time (cpu_scratch_floats);
                     // GPU: attention's head-major q, out/dout and dq (3, B, T, H*hd), rmsnorm's gain partials,
                     // flash attention's D (B, H, T), a router variant's weight gradient, the embedding's partial sums
    size_t scratch_floats;  // its size, in floats
    int threads;            // CPU: the threads the fast attention's scratch has buffers for
    // Hyper-Connections (hc only; empty otherwise), per sublayer s = 2l (attention), 2l+1 (MLP):
    float* hc_M;     // (2L, n+1, B, T, d) the width connection's mixtures; the sublayer reads mixture 0
    float* hc_y;     // (2L, B, T, d)      the sublayer's output, before the depth connection
    float* hc_A;     // (2L, B, T, n, n+1) the mixing weights alpha of each position
    float* hc_b;     // (2L, B, T, n)      ... and beta
    float* hc_rstd;  // (2L, B, T, n)      dynamic: 1 / rms of each stream
    float* hc_ta;    // (2L, B, T, n, n+1) dynamic: tanh(Xn @ dynamic_alpha_fn)
    float* hc_tb;    // (2L, B, T, n)      dynamic: tanh(Xn @ dynamic_beta_fn)
    float* hc_x;     // (B, T, d) the embedding before it fills every stream; then the streams' sum (final norm's input)
    float* hc_dM;    // (n+1, B, T, d) backward scratch: gradient of the mixtures
    float* hc_dy;    // (B, T, d)      gradient of the sublayer's output (and of hc_x)
    float* hc_dA;    // (B, T, n, n+1) gradient of the mixing weights
    float* hc_db;    // (B, T, n)
    float* rope_cos; // (T, hd/2)
    float* rope_sin; // (T, hd/2)
};

// The fast CPU products' scratch, in floats: the most that one of the model's
// forward products (C inputs, OC outputs) needs, C * round_up(OC, 32), W^T
// packed (support/model/cpu_fast.h); the backward products need none.
static size_t fast_scratch_floats(const Config& c) {
    size_t d = c.d, qd = (size_t)c.H * c.hd, kvd = (size_t)c.R * c.hd, F = c.F, V = c.V, most = 0;
    const std::pair<size_t, size_t> products[] = {{d, qd}, {d, kvd}, {qd, d}, {d, F}, {F, d}, {d, V}};
    for (auto [C, OC] : products) most = std::max(most, matmul_fast_scratch_floats(C, OC));
    return most;
}

// One sublayer's HC weights: static_alpha (n, n+1), static_beta (n), alpha_fn
// (d, n+1), alpha_scale, beta_fn (d), beta_scale.
static size_t hc_weight_floats(size_t n, size_t d) { return n * (n + 1) + n + d * (n + 1) + d + 2; }

// The GPU's HC weight gradient (hc_weights_backward_gpu): dp (BT, n, n+2), then
// the partial sums of HC_ROWS positions each, (chunks, G) for G weights, in floats.
#define HC_ROWS 32
static size_t hc_scratch_floats(const Config& c, size_t BT) {
    size_t n = c.hc_rate, G = hc_weight_floats(n, c.d);
    return BT * n * (n + 2) + (BT + HC_ROWS - 1) / HC_ROWS * G;
}

// The CPU ops' scratch, in floats, for `threads` threads: the most one op
// takes (one runs at a time). Defined after the ops, whose sums it sizes.
static size_t cpu_scratch_floats(const Config& c, int B, int threads);

// Carves (or, with base == nullptr, only measures) the activations; only the scratch differs between devices.
static size_t acts_carve(Acts* A, const Config& c, int B, float* base, Device dev = DEVICE_CPU, bool flash = false) {
    size_t BT = (size_t)B * c.T, L = c.L, d = c.d, qd = (size_t)c.H * c.hd, kvd = (size_t)c.R * c.hd;
    size_t n = hc_streams(c), hc = c.arch == ARCH_HC ? 1 : 0, hcd = hc && c.hc_dynamic ? 1 : 0;
    size_t off = 0;
    auto take = [&](float** p, size_t n) { if (base) *p = base + off; off += (n + 15) & ~(size_t)15; };
    auto take_int = [&](int** p, size_t n) { if (base) *p = (int*)(base + off); off += (n + 15) & ~(size_t)15; };
    flash = flash && dev == DEVICE_GPU;
    A->flash = flash;
    take(&A->x, (L + 1) * n * BT * d);
    take(&A->xa, L * n * BT * d);
    take(&A->attn_in, L * BT * d);
    take(&A->rstd_a, L * BT);
    take(&A->q, L * BT * qd);
    take(&A->Kbuf, L * BT * kvd);
    take(&A->Vbuf, L * BT * kvd);
    take(&A->kr, L * BT * kvd);
    take(&A->vr, L * BT * kvd);
    take(&A->att, L * BT * c.H * (flash ? 1 : c.T));
    take(&A->o, L * BT * qd);
    take(&A->mlp_in, L * BT * d);
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
    take(&A->valid, BT);
    size_t ereg = c.entropy_reg > 0 ? 1 : 0;
    take(&A->ereg_V, ereg * L * BT * kvd);
    take(&A->ereg_mu, ereg * L * B * kvd);
    take(&A->ereg_G, ereg * L * B * kvd * kvd);
    take(&A->ereg_stat, ereg * L * B * 4);
    take(&A->dx, n * BT * d);
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
    size_t router = 2 * (size_t)c.R * c.L * c.R;  // a variant's weight gradient (router_backward_gpu)
    size_t gpu_scratch = std::max({3 * BT * qd, router, hc * hc_scratch_floats(c, BT)});
    A->threads = cpu_threads();
    A->scratch_floats = dev == DEVICE_GPU ? gpu_scratch : cpu_scratch_floats(c, B, A->threads);
    take(&A->scratch, A->scratch_floats);
    take(&A->hc_M, hc * 2 * L * (n + 1) * BT * d);
    take(&A->hc_y, hc * 2 * L * BT * d);
    take(&A->hc_A, hc * 2 * L * BT * n * (n + 1));
    take(&A->hc_b, hc * 2 * L * BT * n);
    take(&A->hc_rstd, hcd * 2 * L * BT * n);
    take(&A->hc_ta, hcd * 2 * L * BT * n * (n + 1));
    take(&A->hc_tb, hcd * 2 * L * BT * n);
    take(&A->hc_x, hc * BT * d);
    take(&A->hc_dM, hc * (n + 1) * BT * d);
    take(&A->hc_dy, hc * BT * d);
    take(&A->hc_dA, hc * BT * n * (n + 1));
    take(&A->hc_db, hc * BT * n);
    take(&A->rope_cos, (size_t)c.T * c.hd / 2);
    take(&A->rope_sin, (size_t)c.T * c.hd / 2);
    return off;
}

// ===========================================================================
// Where the ops run. Each op below has a plain CPU function `op(...)` and, in
// the GPU build, kernels and a launcher `op_gpu(...)` with the same arguments
// plus a stream (or cuBLAS handle); its dispatcher `op_op(model, ...)` runs the
// one that fits the model's device (DISPATCH is that one `if`).
// Sums never depend on the number of threads or blocks (a resumed run is
// bit-exact): on the CPU a fixed number of chunks, each summed in order, then
// the chunks in order; on the GPU fixed trees and no atomics.
// ===========================================================================
static const int CHUNKS = 64;
// An element-wise loop over more floats than this is shared by the threads; a
// shorter one (a gain, a router, a small model's activations) stays on one.
// (An enumerator: nvcc's device pass skips the pragmas that read it, and would
// call a constant unused.)
enum : size_t { SHARED_FLOATS = 65536 };
static double sum_in_order(const double* part, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += part[i];
    return s;
}

// e^x in the CPU loops: expf, or in the fast build exp_fast (support/model/cpu_fast.h),
// within 2 ulp of it, which the compiler can vectorise (a call to expf stops it).
static inline float cpu_exp(float x) { return FAST_CPU ? exp_fast(x) : expf(x); }

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

#define DISPATCH(model, gpu_call, cpu_call) \
    do {                                    \
        if ((model)->device == DEVICE_GPU) {  \
            gpu_call;                       \
        } else {                            \
            cpu_call;                       \
        }                                   \
    } while (0)
#else
#define DISPATCH(model, gpu_call, cpu_call) \
    do {                                    \
        (void)(model);                      \
        cpu_call;                           \
    } while (0)
#endif

// ===========================================================================
// The GPU runtime, support/model/gpu_runtime.cuh: the device's state
// (GpuState), the numbers kernels leave for the host (Metrics), making and
// freeing it (gpu_create, gpu_free), the staging of each batch through pinned
// slots (gpu_stage), the captured step (gpu_graph), and what the ops and the
// passes ask of it: stream_of, blas_of, pass_acts, pass_params, pass_grads.
// None of it is an op; the kernels stay with their ops below. (The checking
// macros, ceil_div, warp_sum and block_sum stay above: the kernels use them.)
// ===========================================================================
#include "support/model/gpu_runtime.cuh"

// ===========================================================================
// Matrix products: out (N, OC) (+)= inp (N, C) @ W^T, W (OC, C), every
// projection of the model. On the GPU, cuBLAS; the fast CPU path blocks them.
// ===========================================================================

static void matmul_forward(float* out, const float* inp, const float* W, int N, int C, int OC, bool accumulate) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            const float* x = inp + (size_t)n * C;
            const float* w = W + (size_t)o * C;
            float s = 0;
            for (int i = 0; i < C; i++) s += x[i] * w[i];
            float* y = out + (size_t)n * OC + o;
            *y = accumulate ? *y + s : s;
        }
}

// forward: out = inp @ W^T
// dinp (N, C) (+)= dout (N, OC) @ W (OC, C);  dW (OC, C) += dout^T @ inp   (either may be nullptr: not wanted)
// add_dinp: dinp gets the product added, else written (the first of the products that
// make a gradient: no zero-fill before it). dW is always added to.
static void matmul_backward(float* dinp, float* dW, const float* dout, const float* inp, const float* W, int N, int C,
                            int OC, bool add_dinp) {
    if (dinp) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++)
            for (int i = 0; i < C; i++) {
                float s = 0;
                for (int o = 0; o < OC; o++) s += dout[(size_t)n * OC + o] * W[(size_t)o * C + i];
                float* y = dinp + (size_t)n * C + i;
                *y = add_dinp ? *y + s : s;
            }
    }
    if (!dW) return;
#pragma omp parallel for schedule(static)
    for (int o = 0; o < OC; o++)  // row o of dW: the positions' rows of inp, weighted by dout[:, o]
        for (int n = 0; n < N; n++) {
            float g = dout[(size_t)n * OC + o];
            for (int i = 0; i < C; i++) dW[(size_t)o * C + i] += g * inp[(size_t)n * C + i];
        }
}

#ifdef LIME_GPU
// cuBLAS is column-major: a row-major (rows, cols) matrix is a column-major
// (cols, rows) one. So out (N, OC) = inp (N, C) @ W^T is, column-major,
// out^T (OC, N) = W^T (OC, C) @ inp^T (C, N): op(W) = T, op(inp) = N.
static void matmul_forward_gpu(float* out, const float* inp, const float* W, int N, int C, int OC, bool accumulate,
                               cublasHandle_t blas) {
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    cublasCheck(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &one, W, C, inp, C, &beta, out, OC));
}

// dinp^T (C, N) (+)= W^T (C, OC) @ dout^T (OC, N);  dW^T (C, OC) += inp^T (C, N) @ dout (N, OC)
static void matmul_backward_gpu(float* dinp, float* dW, const float* dout, const float* inp, const float* W, int N,
                                int C, int OC, bool add_dinp, cublasHandle_t blas) {
    const float one = 1.0f, beta = add_dinp ? 1.0f : 0.0f;
    if (dinp) cublasCheck(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, W, C, dout, OC, &beta, dinp, C));
    if (dW) cublasCheck(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, inp, C, dout, OC, &one, dW, C));
}
#endif

// The CPU's products: the blocked ones of support/model/cpu_fast.cpp in ./lime, the
// plain loops above in lime-ref and the labs. scratch: the fast ones' panels.
static void matmul_forward_cpu(float* out, const float* inp, const float* W, int N, int C, int OC, bool accumulate,
                               float* scratch) {
    if (FAST_CPU) matmul_forward_fast(out, inp, W, N, C, OC, accumulate, scratch);
    else matmul_forward(out, inp, W, N, C, OC, accumulate);
}
static void matmul_backward_cpu(float* dinp, float* dW, const float* dout, const float* inp, const float* W, int N,
                                int C, int OC, bool add_dinp) {
    if (FAST_CPU) matmul_backward_fast(dinp, dW, dout, inp, W, N, C, OC, add_dinp);
    else matmul_backward(dinp, dW, dout, inp, W, N, C, OC, add_dinp);
}

static void op_matmul_forward(Model* model, float* out, const float* inp, const float* W, int N, int C, int OC,
                              bool accumulate = false) {
    DISPATCH(model, matmul_forward_gpu(out, inp, W, N, C, OC, accumulate, blas_of(model)),
             matmul_forward_cpu(out, inp, W, N, C, OC, accumulate, model->acts->scratch));
}
static void op_matmul_backward(Model* model, float* dinp, float* dW, const float* dout, const float* inp,
                               const float* W, int N, int C, int OC, bool add_dinp) {
    DISPATCH(model, matmul_backward_gpu(dinp, dW, dout, inp, W, N, C, OC, add_dinp, blas_of(model)),
             matmul_backward_cpu(dinp, dW, dout, inp, W, N, C, OC, add_dinp));
}

// ---------------------------------------------------------------------------
// The K and V projections: the same product, out = inp @ W^T, written straight
// into the head-major KV buffer, each kv head r's hd columns as its own rows:
// out (R, N, hd), out[r, n, i] = sum_c inp[n, c] W[r*hd + i, c], W (R*hd, C).
// ---------------------------------------------------------------------------

// Where column o of position n's product lies in (R, N, hd): head o / hd, its element o % hd.
static size_t kv_at(int n, int o, int N, int hd) { return ((size_t)(o / hd) * N + n) * hd + o % hd; }

static void kv_projection_forward(float* out, const float* inp, const float* W, int N, int C, int R, int hd) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int o = 0; o < R * hd; o++) {
            float s = 0;
            for (int i = 0; i < C; i++) s += inp[(size_t)n * C + i] * W[(size_t)o * C + i];
            out[kv_at(n, o, N, hd)] = s;
        }
}

// forward: out[r, n, i] = inp[n] . W[r*hd + i]
// dinp (N, C) += sum over (r, i) of dout[r, n, i] W[r*hd + i];  dW (R*hd, C) += sum over n of dout[r, n, i] inp[n]
static void kv_projection_backward(float* dinp, float* dW, const float* dout, const float* inp, const float* W, int N,
                                   int C, int R, int hd) {
    auto g = [&](int n, int o) { return dout[kv_at(n, o, N, hd)]; };
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int i = 0; i < C; i++) {
            float s = 0;
            for (int o = 0; o < R * hd; o++) s += g(n, o) * W[(size_t)o * C + i];
            dinp[(size_t)n * C + i] += s;
        }
#pragma omp parallel for schedule(static)
    for (int o = 0; o < R * hd; o++)
        for (int n = 0; n < N; n++)
            for (int i = 0; i < C; i++) dW[(size_t)o * C + i] += g(n, o) * inp[(size_t)n * C + i];
}

#ifdef LIME_GPU
// One product per kv head, batched: head r's out_r (N, hd) = inp @ W_r^T,
// W_r = W's rows r*hd.. (hd, C); column-major out_r^T (hd, N) = W_r^T (hd, C) @ inp^T.
static void kv_projection_forward_gpu(float* out, const float* inp, const float* W, int N, int C, int R, int hd,
                                      cublasHandle_t blas) {
    const float one = 1.0f, zero = 0.0f;
    cublasCheck(cublasSgemmStridedBatched(blas, CUBLAS_OP_T, CUBLAS_OP_N, hd, N, C, &one, W, C, (long long)hd * C, inp,
                                          C, 0, &zero, out, hd, (long long)N * hd, R));
}

// dW_r^T (C, hd) += inp^T (C, N) @ dout_r (N, hd), batched over the heads;
// dinp^T (C, N) += W_r^T (C, hd) @ dout_r^T (hd, N), one head after another
// (a batch would write dinp from R products at once).
static void kv_projection_backward_gpu(float* dinp, float* dW, const float* dout, const float* inp, const float* W,
                                       int N, int C, int R, int hd, cublasHandle_t blas) {
    const float one = 1.0f;
    size_t head = (size_t)N * hd;  // floats from one kv head's rows to the next's
    for (int r = 0; r < R; r++)
        cublasCheck(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, C, N, hd, &one, W + (size_t)r * hd * C, C,
                                dout + r * head, hd, &one, dinp, C));
    cublasCheck(cublasSgemmStridedBatched(blas, CUBLAS_OP_N, CUBLAS_OP_T, C, hd, N, &one, inp, C, 0, dout, hd,
                                          (long long)head, &one, dW, C, (long long)hd * C, R));
}
#endif

static void kv_projection_forward_cpu(float* out, const float* inp, const float* W, int N, int C, int R, int hd,
                                      float* scratch) {
    if (FAST_CPU) kv_projection_forward_fast(out, inp, W, N, C, R, hd, scratch);
    else kv_projection_forward(out, inp, W, N, C, R, hd);
}
static void kv_projection_backward_cpu(float* dinp, float* dW, const float* dout, const float* inp, const float* W,
                                       int N, int C, int R, int hd) {
    if (FAST_CPU) kv_projection_backward_fast(dinp, dW, dout, inp, W, N, C, R, hd);
    else kv_projection_backward(dinp, dW, dout, inp, W, N, C, R, hd);
}

static void op_kv_projection_forward(Model* model, float* out, const float* inp, const float* W, int N) {
    int C = model->c.d, R = model->c.R, hd = model->c.hd;
    DISPATCH(model, kv_projection_forward_gpu(out, inp, W, N, C, R, hd, blas_of(model)),
             kv_projection_forward_cpu(out, inp, W, N, C, R, hd, model->acts->scratch));
}
static void op_kv_projection_backward(Model* model, float* dinp, float* dW, const float* dout, const float* inp,
                                      const float* W, int N) {
    int C = model->c.d, R = model->c.R, hd = model->c.hd;
    DISPATCH(model, kv_projection_backward_gpu(dinp, dW, dout, inp, W, N, C, R, hd, blas_of(model)),
             kv_projection_backward_cpu(dinp, dW, dout, inp, W, N, C, R, hd));
}

// ---------------------------------------------------------------------------
// Copies, zeros and sums of whole arrays (the residual stream, gradients).
// dst = src and p = 0: memcpy and memset in CHUNKS pieces shared by the threads.
static void copy_cpu(float* dst, const float* src, size_t n) {
#pragma omp parallel for schedule(static) if (n > SHARED_FLOATS)
    for (int c = 0; c < CHUNKS; c++) {
        size_t from = n * c / CHUNKS, to = n * (c + 1) / CHUNKS;
        memcpy(dst + from, src + from, (to - from) * sizeof(float));
    }
}
static void zero_cpu(float* p, size_t n) {
#pragma omp parallel for schedule(static) if (n > SHARED_FLOATS)
    for (int c = 0; c < CHUNKS; c++) {
        size_t from = n * c / CHUNKS, to = n * (c + 1) / CHUNKS;
        memset(p + from, 0, (to - from) * sizeof(float));
    }
}
// dst += src, elementwise.
static void add_inplace(float* dst, const float* src, size_t n) {
#pragma omp parallel for schedule(static) if (n > SHARED_FLOATS)
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

#ifdef LIME_GPU
__global__ void add_inplace_kernel(float* dst, const float* src, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] += src[i];
}
static void copy_gpu(float* dst, const float* src, size_t n, cudaStream_t stream) {
    cudaCheck(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
}
static void zero_gpu(float* p, size_t n, cudaStream_t stream) { cudaCheck(cudaMemsetAsync(p, 0, n * sizeof(float), stream)); }
static void add_inplace_gpu(float* dst, const float* src, size_t n, cudaStream_t stream) {
    LAUNCH(add_inplace_kernel, ceil_div(n, 256), 256, 0, stream)(dst, src, n);
    launchCheck();
}
#endif

static void op_copy(Model* model, float* dst, const float* src, size_t n) {
    DISPATCH(model, copy_gpu(dst, src, n, stream_of(model)), copy_cpu(dst, src, n));
}
static void op_zero(Model* model, float* p, size_t n) {
    DISPATCH(model, zero_gpu(p, n, stream_of(model)), zero_cpu(p, n));
}
static void op_add(Model* model, float* dst, const float* src, size_t n) {
    DISPATCH(model, add_inplace_gpu(dst, src, n, stream_of(model)), add_inplace(dst, src, n));
}

// A layer of the head-major KV buffer, (R, N, hd), and the same numbers
// token-major, (N, R, hd), as the value-entropy regulariser and model_probe
// read them: to_tokens, dst (N, R, hd) (+)= src (R, N, hd) transposed; else
// dst (R, N, hd) (+)= src (N, R, hd).
static void kv_transpose(float* dst, const float* src, int N, int R, int hd, bool to_tokens, bool accumulate) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int r = 0; r < R; r++)
            for (int i = 0; i < hd; i++) {
                size_t h = ((size_t)r * N + n) * hd + i, t = ((size_t)n * R + r) * hd + i;
                float* y = dst + (to_tokens ? t : h);
                float x = src[to_tokens ? h : t];
                *y = accumulate ? *y + x : x;
            }
}
#ifdef LIME_GPU
__global__ void kv_transpose_kernel(float* dst, const float* src, int N, int R, int hd, int to_tokens, int accumulate) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;  // over (N, R, hd); 32-bit: see model_create
    if (idx >= N * R * hd) return;
    int i = idx % hd, r = idx / hd % R, n = idx / hd / R, h = (r * N + n) * hd + i;
    float* y = dst + (to_tokens ? idx : h);
    float x = src[to_tokens ? h : idx];
    *y = accumulate ? *y + x : x;
}
static void kv_transpose_gpu(float* dst, const float* src, int N, int R, int hd, bool to_tokens, bool accumulate,
                             cudaStream_t stream) {
    LAUNCH(kv_transpose_kernel, ceil_div((size_t)N * R * hd, 256), 256, 0, stream)
        (dst, src, N, R, hd, to_tokens, accumulate);
    launchCheck();
}
#endif
static void op_kv_transpose(Model* model, float* dst, const float* src, int N, bool to_tokens, bool accumulate) {
    int R = model->c.R, hd = model->c.hd;
    DISPATCH(model, kv_transpose_gpu(dst, src, N, R, hd, to_tokens, accumulate, stream_of(model)),
             kv_transpose(dst, src, N, R, hd, to_tokens, accumulate));
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

#ifdef LIME_GPU
__global__ void embedding_forward_kernel(float* out, const int* tokens, const float* E, int N, int d) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;  // one thread per output float (32-bit: see model_create)
    if (idx >= N * d) return;
    out[idx] = E[tokens[idx / d] * d + idx % d];
}
static void embedding_forward_gpu(float* out, const int* tokens, const float* E, int N, int d, cudaStream_t stream) {
    LAUNCH(embedding_forward_kernel, ceil_div((size_t)N * d, 256), 256, 0, stream)(out, tokens, E, N, d);
    launchCheck();
}

// Deterministic without atomics: block (group of EMBED_TOKENS ids, column
// slice, chunk of positions) holds its ids' rows of the slice in shared memory,
// each thread one column, and walks its chunk's positions in order, adding the
// rows whose token is in the group (the token ids pass through shared memory a
// tile at a time). With one chunk it adds to dE in the CPU's order; with more,
// chunk c writes partial (chunks, V, d)[c] and one thread per float then adds
// the chunks in order.
#define EMBED_TILE 1024
#define EMBED_TOKENS 128
#define EMBED_CHUNK 256
__global__ void embedding_backward_kernel(float* out, const float* dout, const int* tokens, int N, int d, int V,
                                          int per_chunk) {
    __shared__ int tile[EMBED_TILE];
    DYNAMIC_SHARED(float, acc);  // (EMBED_TOKENS, blockDim.x)
    int v0 = blockIdx.x * EMBED_TOKENS, i = blockIdx.y * blockDim.x + threadIdx.x, nv = min(EMBED_TOKENS, V - v0);
    int from = blockIdx.z * per_chunk, to = min(N, from + per_chunk);
    out += (size_t)blockIdx.z * V * d;  // dE itself when there is one chunk
    float* mine = acc + threadIdx.x;  // this thread's column of the group's rows, stride blockDim.x
    for (int v = 0; v < nv; v++) mine[v * blockDim.x] = i < d && gridDim.z == 1 ? out[(v0 + v) * d + i] : 0.0f;
    for (int n0 = from; n0 < to; n0 += EMBED_TILE) {
        int count = min(EMBED_TILE, to - n0);
        __syncthreads();
        for (int k = threadIdx.x; k < count; k += blockDim.x) tile[k] = tokens[n0 + k];
        __syncthreads();
        for (int k = 0; k < count; k++)
            if (unsigned v = tile[k] - v0; v < (unsigned)nv && i < d) mine[v * blockDim.x] += dout[(n0 + k) * d + i];
    }
    for (int v = 0; v < nv && i < d; v++) out[(v0 + v) * d + i] = mine[v * blockDim.x];
}
__global__ void embedding_backward_reduce_kernel(float* dE, const float* partial, int chunks, int Vd) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= Vd) return;
    float s = 0;
    for (int c = 0; c < chunks; c++) s += partial[(size_t)c * Vd + idx];
    dE[idx] += s;
}
// The CPU needs no V; the GPU's grid has a row of blocks per EMBED_TOKENS
// vocabulary entries. Chunks of at least EMBED_CHUNK positions, as many as
// scratch_floats holds (V, d) partial sums for.
static void embedding_backward_gpu(float* dE, const float* dout, const int* tokens, int N, int d, int V,
                                   float* scratch, size_t scratch_floats, cudaStream_t stream) {
    int threads = std::min(64, (d + 31) / 32 * 32);
    int chunks = (int)std::max<size_t>(1, std::min<size_t>(ceil_div(N, EMBED_CHUNK), scratch_floats / ((size_t)V * d)));
    int per_chunk = (int)ceil_div(N, chunks);
    chunks = (int)ceil_div(N, per_chunk);
    LAUNCH(embedding_backward_kernel, dim3(ceil_div(V, EMBED_TOKENS), ceil_div(d, threads), chunks), threads,
           EMBED_TOKENS * threads * sizeof(float), stream)(chunks > 1 ? scratch : dE, dout, tokens, N, d, V, per_chunk);
    launchCheck();
    if (chunks == 1) return;
    LAUNCH(embedding_backward_reduce_kernel, ceil_div((size_t)V * d, 256), 256, 0, stream)(dE, scratch, chunks, V * d);
    launchCheck();
}
#endif

static void op_embedding_forward(Model* model, float* out, const int* tokens, const float* E, int N) {
    int d = model->c.d;
    DISPATCH(model, embedding_forward_gpu(out, tokens, E, N, d, stream_of(model)),
             embedding_forward(out, tokens, E, N, d));
}
static void op_embedding_backward(Model* model, float* dE, const float* dout, const int* tokens, int N) {
    int d = model->c.d;
    [[maybe_unused]] const Acts* A = pass_acts(model);  // the GPU's scratch: the chunks' partial sums
    DISPATCH(model,
             embedding_backward_gpu(dE, dout, tokens, N, d, model->c.V, A->scratch, A->scratch_floats, stream_of(model)),
             embedding_backward(dE, dout, tokens, N, d));
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
// order, so the sum is the same for any thread count. part: CHUNKS * d floats of scratch.
static void rmsnorm_backward(float* dinp, float* dg, const float* dout, const float* inp, const float* g,
                             const float* rstd, int N, int d, float* part) {
#pragma omp parallel for schedule(static)
    for (int c = 0; c < CHUNKS; c++) {
        float* dgc = part + (size_t)c * d;
        memset(dgc, 0, (size_t)d * sizeof(float));
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
__global__ void rmsnorm_forward_kernel(float* out, float* rstd, const float* inp, const float* g, int N, int d,
                                       float eps) {
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
static void rmsnorm_forward_gpu(float* out, float* rstd, const float* inp, const float* g, int N, int d, float eps,
                                cudaStream_t stream) {
    const int warps = 4;  // rows per block
    LAUNCH(rmsnorm_forward_kernel, ceil_div(N, warps), 32 * warps, 0, stream)(out, rstd, inp, g, N, d, eps);
    launchCheck();
}

// dx: one warp per row, as the forward.
__global__ void rmsnorm_backward_kernel(float* dinp, const float* dout, const float* inp, const float* g,
                                        const float* rstd, int N, int d) {
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
// dg in two fixed-order steps: block (chunk, column slice) sums its GAIN_ROWS
// rows into partial[chunk]; then block (32 columns) adds the chunks: warp y of
// GAIN_WARPS sums chunks y, y + GAIN_WARPS, ... in order, and a fixed tree over
// the warps adds their sums.
#define GAIN_ROWS 32
#define GAIN_WARPS 8
__global__ void rmsnorm_gain_partial_kernel(float* partial, const float* dout, const float* inp, const float* rstd,
                                            int N, int d) {
    int i = blockIdx.y * blockDim.x + threadIdx.x, chunk = blockIdx.x;
    if (i >= d) return;
    float s = 0;
    for (int n = chunk * GAIN_ROWS; n < min(N, (chunk + 1) * GAIN_ROWS); n++)
        s += dout[n * d + i] * inp[n * d + i] * rstd[n];
    partial[chunk * d + i] = s;
}
__global__ void rmsnorm_gain_reduce_kernel(float* dg, const float* partial, int chunks, int d) {
    __shared__ float sums[GAIN_WARPS][32];
    int lane = threadIdx.x % 32, y = threadIdx.x / 32, i = blockIdx.x * 32 + lane;
    float s = 0;
    for (int c = y; c < chunks && i < d; c += GAIN_WARPS) s += partial[c * d + i];
    sums[y][lane] = s;
    for (int stride = GAIN_WARPS / 2; stride > 0; stride /= 2) {
        __syncthreads();
        if (y < stride) sums[y][lane] += sums[y + stride][lane];
    }
    if (y == 0 && i < d) dg[i] += sums[0][lane];
}
// scratch: ceil(N / GAIN_ROWS) * d floats for the partial sums.
static void rmsnorm_backward_gpu(float* dinp, float* dg, const float* dout, const float* inp, const float* g,
                                 const float* rstd, int N, int d, float* scratch, cudaStream_t stream) {
    const int warps = 4;
    LAUNCH(rmsnorm_backward_kernel, ceil_div(N, warps), 32 * warps, 0, stream)(dinp, dout, inp, g, rstd, N, d);
    launchCheck();
    int chunks = (int)ceil_div(N, GAIN_ROWS), threads = std::min(128, (d + 31) / 32 * 32);
    LAUNCH(rmsnorm_gain_partial_kernel, dim3(chunks, ceil_div(d, threads)), threads, 0, stream)
        (scratch, dout, inp, rstd, N, d);
    launchCheck();
    LAUNCH(rmsnorm_gain_reduce_kernel, ceil_div(d, 32), 32 * GAIN_WARPS, 0, stream)(dg, scratch, chunks, d);
    launchCheck();
}
#endif

// The CPU's: rmsnorm_*_fast (support/model/cpu_fast.cpp: the sums over d in 16
// lanes whatever the vector width) in ./lime, the plain loops above in lime-ref.
static void rmsnorm_forward_cpu(float* out, float* rstd, const float* inp, const float* g, int N, int d,
                                float eps) {
    if (FAST_CPU) rmsnorm_forward_fast(out, rstd, inp, g, N, d, eps);
    else rmsnorm_forward(out, rstd, inp, g, N, d, eps);
}
static void rmsnorm_backward_cpu(float* dinp, float* dg, const float* dout, const float* inp, const float* g,
                                 const float* rstd, int N, int d, float* part) {
    if (FAST_CPU) rmsnorm_backward_fast(dinp, dg, dout, inp, g, rstd, N, d, part);
    else rmsnorm_backward(dinp, dg, dout, inp, g, rstd, N, d, part);
}

static void op_rmsnorm_forward(Model* model, float* out, float* rstd, const float* inp, const float* g, int N) {
    int d = model->c.d;
    float eps = model->c.eps;
    DISPATCH(model, rmsnorm_forward_gpu(out, rstd, inp, g, N, d, eps, stream_of(model)),
             rmsnorm_forward_cpu(out, rstd, inp, g, N, d, eps));
}
static void op_rmsnorm_backward(Model* model, float* dinp, float* dg, const float* dout, const float* inp,
                                const float* g, const float* rstd, int N) {
    int d = model->c.d;
    DISPATCH(model,
             rmsnorm_backward_gpu(dinp, dg, dout, inp, g, rstd, N, d, pass_acts(model)->scratch, stream_of(model)),
             rmsnorm_backward_cpu(dinp, dg, dout, inp, g, rstd, N, d, model->acts->scratch));
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

#ifdef LIME_GPU
// One thread per rotated pair (b, t, h, i < hd/2); cos_t, sin_t live on the device.
__global__ void rope_rotate_kernel(float* x, const float* cos_t, const float* sin_t, int B, int T, int nh, int hd,
                                   float sign) {
    int half = hd / 2, idx = blockIdx.x * blockDim.x + threadIdx.x;  // 32-bit: see model_create
    if (idx >= B * T * nh * half) return;
    int i = idx % half, row = idx / half;  // row = (b * T + t) * nh + h
    int t = row / nh % T;
    float* v = x + row * hd;
    float c = cos_t[t * half + i], s = sign * sin_t[t * half + i];
    float x0 = v[i], x1 = v[i + half];
    v[i] = x0 * c - x1 * s;
    v[i + half] = x1 * c + x0 * s;
}
static void rope_forward_gpu(float* x, const float* cos_t, const float* sin_t, int B, int T, int nh, int hd,
                             cudaStream_t stream) {
    LAUNCH(rope_rotate_kernel, ceil_div((size_t)B * T * nh * (hd / 2), 256), 256, 0, stream)
        (x, cos_t, sin_t, B, T, nh, hd, 1.0f);
    launchCheck();
}
static void rope_backward_gpu(float* dx, const float* cos_t, const float* sin_t, int B, int T, int nh, int hd,
                              cudaStream_t stream) {
    LAUNCH(rope_rotate_kernel, ceil_div((size_t)B * T * nh * (hd / 2), 256), 256, 0, stream)
        (dx, cos_t, sin_t, B, T, nh, hd, -1.0f);
    launchCheck();
}
#endif

// The CPU's: rope_rotate_fast (support/model/cpu_fast.cpp, the same loop,
// vectorised) in ./lime, the plain loops above in lime-ref and the labs.
static void rope_forward_cpu(float* x, const float* cos_t, const float* sin_t, int B, int T, int nh, int hd) {
    if (FAST_CPU) rope_rotate_fast(x, cos_t, sin_t, B, T, nh, hd, 1.0f);
    else rope_forward(x, cos_t, sin_t, B, T, nh, hd);
}
static void rope_backward_cpu(float* dx, const float* cos_t, const float* sin_t, int B, int T, int nh, int hd) {
    if (FAST_CPU) rope_rotate_fast(dx, cos_t, sin_t, B, T, nh, hd, -1.0f);
    else rope_backward(dx, cos_t, sin_t, B, T, nh, hd);
}

// x (B, T, nh, hd) in place, with the tables in the model's activations.
static void op_rope_forward(Model* model, float* x, int B, int T, int nh) {
    const Acts* A = pass_acts(model);
    int hd = model->c.hd;
    DISPATCH(model, rope_forward_gpu(x, A->rope_cos, A->rope_sin, B, T, nh, hd, stream_of(model)),
             rope_forward_cpu(x, A->rope_cos, A->rope_sin, B, T, nh, hd));
}
static void op_rope_backward(Model* model, float* dx, int B, int T, int nh) {
    const Acts* A = pass_acts(model);
    int hd = model->c.hd;
    DISPATCH(model, rope_backward_gpu(dx, A->rope_cos, A->rope_sin, B, T, nh, hd, stream_of(model)),
             rope_backward_cpu(dx, A->rope_cos, A->rope_sin, B, T, nh, hd));
}

// ===========================================================================
// The KV router (Eq. 2): layer l's keys and values are a learned mixture of
// the buffered keys and values of layers 0..l. The buffer is head-major: row
// j = l'*R + r' holds layer l', kv head r' at every position, M = N*hd floats,
// so Kbuf, Vbuf (L, R, N, hd) are (L*R, M) matrices and the mixture is one
// matrix product over their first cols = (l+1)R rows (the authors' torch.mm):
//   Kr (R, M) = Wk (R, cols) @ Kbuf[0:cols] (cols, M)    Kr[r][n, :] = sum_j Wk[r, j] * Kbuf[j][n, :]
//   Vr (R, M) = Wv (R, cols) @ Vbuf[0:cols] (cols, M)
// Eq. 2 has one W for both keys and values: Wk == Wv, the same pointer; with
// --router-kv separate they are two. The products are the matrix products'
// own (above): Wk @ Kbuf is matmul_backward's dinp = dout @ W with dout = Wk,
// W = Kbuf; the plain loops in lime-ref, the blocked ones in ./lime, cuBLAS
// on the GPU. A variant (router_sources) only holds some weights fixed:
// `learned` says which source layers' columns get a gradient.
// ===========================================================================

// The variants' weight gradient (2, R, cols), then the scratch of the weight
// gradient's product (matmul_forward_cpu's), kept from call to call (sized for
// the largest layer the first time it is used).
static float* router_scratch_cpu(int l, int N, int R, int hd) {
    static std::vector<float> scratch;
    int cols = (l + 1) * R, M = N * hd;
    size_t floats = 2 * (size_t)R * cols + matmul_fast_forward_scratch_floats(R, M, cols);
    if (scratch.size() < floats) scratch.resize(floats);
    return scratch.data();
}

// Calls add(offset, count) for the runs of row r's columns whose source
// layer `learned` has: dW[offset .. offset + count) gets the gradient.
template <class Add>
static void for_learned_columns(int l, int R, RouterSpan learned, Add add) {
    int cols = (l + 1) * R, below = std::min(learned.below, l + 1), from = std::max(learned.from, below);
    for (int r = 0; r < R; r++) {
        if (below > 0) add((size_t)r * cols, (size_t)below * R);
        if (from <= l) add((size_t)r * cols + from * R, (size_t)(l + 1 - from) * R);
    }
}
static bool learns_all(int l, RouterSpan learned) { return learned.below >= learned.from || learned.from <= 0 || learned.below > l; }
static bool learns_any(int l, RouterSpan learned) { return learned.below > 0 || learned.from <= l; }

// Kr, Vr (R, N, hd); Wk, Wv (R, (l+1)R); Kbuf, Vbuf (L, R, N, hd).
LAB_SWAPPABLE void router_forward(float* Kr, float* Vr, const float* Wk, const float* Wv, const float* Kbuf,
                                  const float* Vbuf, int l, int N, int R, int hd) {
    int cols = (l + 1) * R, M = N * hd;
    matmul_backward_cpu(Kr, nullptr, Wk, nullptr, Kbuf, R, M, cols, false);  // Kr = Wk (R, cols) @ Kbuf (cols, M)
    matmul_backward_cpu(Vr, nullptr, Wv, nullptr, Vbuf, R, M, cols, false);
}

// forward: Kr = Wk @ Kbuf[0:cols]   (and Vr = Wv @ Vbuf[0:cols])
// dWk (R, cols)        += dKr (R, M) @ Kbuf[0:cols]^T   (one W: it gets the keys' and the values' sums)
// dKbuf[0:cols] (cols, M) += Wk^T (cols, R) @ dKr (R, M)   (and dWv, dVbuf alike)
// This is where the gradient reaches the keys and values of earlier layers.
// dW's product is matmul_forward's inp @ W^T (inp = dKr, W = Kbuf), dKbuf's
// matmul_backward's dW += dout^T @ inp (dout = Wk, inp = dKr). A variant's
// weight gradient goes through G (2, R, cols) first, and only its learned columns are added.
LAB_SWAPPABLE void router_backward(float* dWk, float* dWv, float* dKbuf, float* dVbuf, const float* dKr,
                                   const float* dVr, const float* Wk, const float* Wv, const float* Kbuf,
                                   const float* Vbuf, int l, RouterSpan learned, int N, int R, int hd) {
    int cols = (l + 1) * R, M = N * hd;
    float *G = router_scratch_cpu(l, N, R, hd), *panels = G + 2 * (size_t)R * cols;
    if (learns_any(l, learned)) {
        bool all = learns_all(l, learned), one = dWk == dWv;
        float *gk = all ? dWk : G, *gv = all ? dWv : one ? G : G + (size_t)R * cols;
        if (!all) zero_cpu(G, 2 * (size_t)R * cols);
        matmul_forward_cpu(gk, dKr, Kbuf, R, M, cols, true, panels);  // gk += dKr @ Kbuf^T
        matmul_forward_cpu(gv, dVr, Vbuf, R, M, cols, true, panels);  // one W: gv == gk, both sums
        if (!all) for_learned_columns(l, R, learned, [&](size_t at, size_t n) { add_inplace(dWk + at, gk + at, n); });
        if (!all && !one) for_learned_columns(l, R, learned, [&](size_t at, size_t n) { add_inplace(dWv + at, gv + at, n); });
    }
    matmul_backward_cpu(nullptr, dKbuf, Wk, dKr, nullptr, R, M, cols, false);  // dKbuf += Wk^T @ dKr
    matmul_backward_cpu(nullptr, dVbuf, Wv, dVr, nullptr, R, M, cols, false);
}

#ifdef LIME_GPU
// The same products on cuBLAS (matmul_forward_gpu, matmul_backward_gpu), on blas's stream.
LAB_SWAPPABLE void router_forward_gpu(float* Kr, float* Vr, const float* Wk, const float* Wv, const float* Kbuf,
                                      const float* Vbuf, int l, int N, int R, int hd, cublasHandle_t blas) {
    int cols = (l + 1) * R, M = N * hd;
    matmul_backward_gpu(Kr, nullptr, Wk, nullptr, Kbuf, R, M, cols, false, blas);
    matmul_backward_gpu(Vr, nullptr, Wv, nullptr, Vbuf, R, M, cols, false, blas);
}
// G: scratch for a variant's weight gradient, 2 * R * (l+1)R floats.
static void router_backward_gpu(float* dWk, float* dWv, float* dKbuf, float* dVbuf, const float* dKr, const float* dVr,
                                const float* Wk, const float* Wv, const float* Kbuf, const float* Vbuf, int l,
                                RouterSpan learned, int N, int R, int hd, float* G, cublasHandle_t blas) {
    int cols = (l + 1) * R, M = N * hd;
    cudaStream_t stream;
    cublasCheck(cublasGetStream(blas, &stream));
    if (learns_any(l, learned)) {
        bool all = learns_all(l, learned), one = dWk == dWv;
        float *gk = all ? dWk : G, *gv = all ? dWv : one ? G : G + (size_t)R * cols;
        if (!all) cudaCheck(cudaMemsetAsync(G, 0, 2 * (size_t)R * cols * sizeof(float), stream));
        matmul_forward_gpu(gk, dKr, Kbuf, R, M, cols, true, blas);
        matmul_forward_gpu(gv, dVr, Vbuf, R, M, cols, true, blas);
        if (!all) for_learned_columns(l, R, learned, [&](size_t at, size_t n) { add_inplace_gpu(dWk + at, gk + at, n, stream); });
        if (!all && !one)
            for_learned_columns(l, R, learned, [&](size_t at, size_t n) { add_inplace_gpu(dWv + at, gv + at, n, stream); });
    }
    matmul_backward_gpu(nullptr, dKbuf, Wk, dKr, nullptr, R, M, cols, false, blas);
    matmul_backward_gpu(nullptr, dVbuf, Wv, dVr, nullptr, R, M, cols, false, blas);
}
#endif

static void op_router_forward(Model* model, float* Kr, float* Vr, const float* Wk, const float* Wv, const float* Kbuf,
                              const float* Vbuf, int l, int N) {
    int R = model->c.R, hd = model->c.hd;
    DISPATCH(model, router_forward_gpu(Kr, Vr, Wk, Wv, Kbuf, Vbuf, l, N, R, hd, blas_of(model)),
             router_forward(Kr, Vr, Wk, Wv, Kbuf, Vbuf, l, N, R, hd));
}
static void op_router_backward(Model* model, float* dWk, float* dWv, float* dKbuf, float* dVbuf, const float* dKr,
                               const float* dVr, const float* Wk, const float* Wv, const float* Kbuf, const float* Vbuf,
                               int l, int N) {
    int R = model->c.R, hd = model->c.hd;
    RouterSpan learned = router_learned(model->c, l);  // the variant's trainable columns
    DISPATCH(model,
             router_backward_gpu(dWk, dWv, dKbuf, dVbuf, dKr, dVr, Wk, Wv, Kbuf, Vbuf, l, learned, N, R, hd,
                                 pass_acts(model)->scratch, blas_of(model)),
             router_backward(dWk, dWv, dKbuf, dVbuf, dKr, dVr, Wk, Wv, Kbuf, Vbuf, l, learned, N, R, hd));
}

// ===========================================================================
// Hyper-Connections (--arch hc; Zhu et al., arXiv 2409.19606), the paper's
// other baseline: the residual stream becomes n streams X (n, N, d), and each
// sublayer (attention, then the MLP) reads and writes them through small
// learned mixing weights, at each position t < N:
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
// HcParams w: static_beta (n), static_alpha (n, n+1), alpha_fn (d, n+1),
// alpha_scale (1), beta_fn (d), beta_scale (1); the last four nullptr when static.
// ===========================================================================

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
    for (int i = 0; i < n; i++) copy_cpu(X + i * Nd, x, Nd);
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
    size_t G = dyn ? hc_weight_floats(n, d) : (size_t)n * K + n;
    float* part = scratch;  // (CHUNKS, G), then (CHUNKS, d): each slice's dXn
#pragma omp parallel for schedule(static)
    for (int c = 0; c < CHUNKS; c++) {
        float *sa = part + (size_t)c * G, *sb = sa + n * K, *afn = sb + n, *as = afn + (size_t)d * K, *bfn = as + 1,
              *bs = bfn + d, *dxn = part + CHUNKS * G + (size_t)c * d;
        memset(sa, 0, G * sizeof(float));
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
        const float* src = part + (size_t)c * G;
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
//    The G weights of a sublayer, in this order: static_alpha (n*K),
//    static_beta (n), alpha_fn (d*K), alpha_scale, beta_fn (d), beta_scale.
// 3. one thread per weight adds the chunks in order.
// scratch: N*n*(K+1) floats for dp, then ceil(N / HC_ROWS) * G for the partial sums (hc_scratch_floats).
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
                                          int n, int d, int G) {
    int wi = blockIdx.y * blockDim.x + threadIdx.x, chunk = blockIdx.x, K = n + 1;
    if (wi >= G) return;
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
    partial[(size_t)chunk * G + wi] = s;
}
__global__ void hc_weights_reduce_kernel(HcParams dw, const float* partial, int chunks, int n, int d, int G) {
    int wi = blockIdx.x * blockDim.x + threadIdx.x, K = n + 1;
    if (wi >= G) return;
    float s = 0;
    for (int c = 0; c < chunks; c++) s += partial[(size_t)c * G + wi];
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
    int G = n * (n + 1) + n + (dynamic ? d * (n + 1) + d + 2 : 0), chunks = (int)ceil_div(N, HC_ROWS), warps = 4;
    float *dp = scratch, *partial = scratch + (size_t)N * n * (n + 2);
    if (dynamic) {
        LAUNCH(hc_weights_dx_kernel, ceil_div((size_t)N * n, warps), 32 * warps, 0, stream)
            (dX, dp, dA, db, X, rstd, ta, tb, w, N, n, d);
        launchCheck();
    }
    LAUNCH(hc_weights_partial_kernel, dim3(chunks, ceil_div(G, 128)), 128, 0, stream)
        (partial, dA, db, dp, X, rstd, ta, tb, N, n, d, G);
    launchCheck();
    LAUNCH(hc_weights_reduce_kernel, ceil_div(G, 128), 128, 0, stream)(dw, partial, chunks, n, d, G);
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
// The CPU runs the fast loops (support/model/cpu_fast.cpp) in ./lime, the plain ones above in ./lime-ref.
// scratch: cpu_scratch_floats's.
static void hc_weights_forward_cpu(float* Aw, float* bw, float* rstd, float* ta, float* tb, const float* X, HcParams w,
                                   int N, int n, int d, float eps, float* scratch) {
    if (FAST_CPU) hc_weights_forward_fast(Aw, bw, rstd, ta, tb, X, w, N, n, d, eps, scratch);
    else hc_weights_forward(Aw, bw, rstd, ta, tb, X, w, N, n, d, eps);
}
static void hc_weights_backward_cpu(float* dX, HcParams dw, const float* dA, const float* db, const float* X,
                                    const float* rstd, const float* ta, const float* tb, HcParams w, int N, int n, int d,
                                    float* scratch) {
    if (FAST_CPU) hc_weights_backward_fast(dX, dw, dA, db, X, rstd, ta, tb, w, N, n, d, scratch);
    else hc_weights_backward(dX, dw, dA, db, X, rstd, ta, tb, w, N, n, d, scratch);
}
static void hc_width_forward_cpu(float* M, const float* X, const float* Aw, int N, int n, int d) {
    if (FAST_CPU) hc_width_forward_fast(M, X, Aw, N, n, d);
    else hc_width_forward(M, X, Aw, N, n, d);
}
static void hc_width_backward_cpu(float* dX, float* dA, const float* dM, const float* X, const float* Aw, int N, int n,
                                  int d) {
    if (FAST_CPU) hc_width_backward_fast(dX, dA, dM, X, Aw, N, n, d);
    else hc_width_backward(dX, dA, dM, X, Aw, N, n, d);
}
static void hc_depth_backward_cpu(float* dy, float* db, float* dM, const float* dXout, const float* y, const float* bw,
                                  int N, int n, int d) {
    if (FAST_CPU) hc_depth_backward_fast(dy, db, dM, dXout, y, bw, N, n, d);
    else hc_depth_backward(dy, db, dM, dXout, y, bw, N, n, d);
}

static void op_hc_weights_forward(Model* model, float* Aw, float* bw, float* rstd, float* ta, float* tb,
                                  const float* X, const HcParams& w, int N) {
    const Config& c = model->c;
    DISPATCH(model, hc_weights_forward_gpu(Aw, bw, rstd, ta, tb, X, w, N, c.hc_rate, c.d, c.eps, stream_of(model)),
             hc_weights_forward_cpu(Aw, bw, rstd, ta, tb, X, w, N, c.hc_rate, c.d, c.eps, model->acts->scratch));
}
static void op_hc_weights_backward(Model* model, float* dX, const HcParams& dw, const float* dA, const float* db,
                                   const float* X, const float* rstd, const float* ta, const float* tb,
                                   const HcParams& w, int N) {
    const Config& c = model->c;
    DISPATCH(model,
             hc_weights_backward_gpu(dX, dw, dA, db, X, rstd, ta, tb, w, N, c.hc_rate, c.d, pass_acts(model)->scratch,
                                     stream_of(model)),
             hc_weights_backward_cpu(dX, dw, dA, db, X, rstd, ta, tb, w, N, c.hc_rate, c.d, model->acts->scratch));
}
static void op_hc_width_forward(Model* model, float* M, const float* X, const float* Aw, int N) {
    const Config& c = model->c;
    DISPATCH(model, hc_width_forward_gpu(M, X, Aw, N, c.hc_rate, c.d, stream_of(model)),
             hc_width_forward_cpu(M, X, Aw, N, c.hc_rate, c.d));
}
static void op_hc_width_backward(Model* model, float* dX, float* dA, const float* dM, const float* X, const float* Aw,
                                 int N) {
    const Config& c = model->c;
    DISPATCH(model, hc_width_backward_gpu(dX, dA, dM, X, Aw, N, c.hc_rate, c.d, stream_of(model)),
             hc_width_backward_cpu(dX, dA, dM, X, Aw, N, c.hc_rate, c.d));
}
static void op_hc_depth_forward(Model* model, float* Xout, const float* y, const float* M, const float* bw, int N) {
    const Config& c = model->c;
    DISPATCH(model, hc_depth_forward_gpu(Xout, y, M, bw, N, c.hc_rate, c.d, stream_of(model)),
             hc_depth_forward(Xout, y, M, bw, N, c.hc_rate, c.d));
}
static void op_hc_depth_backward(Model* model, float* dy, float* db, float* dM, const float* dXout, const float* y,
                                 const float* bw, int N) {
    const Config& c = model->c;
    DISPATCH(model, hc_depth_backward_gpu(dy, db, dM, dXout, y, bw, N, c.hc_rate, c.d, stream_of(model)),
             hc_depth_backward_cpu(dy, db, dM, dXout, y, bw, N, c.hc_rate, c.d));
}

// ===========================================================================
// Causal GQA attention. Query head h reads kv head r = h / (H / R):
//   s[h,t,u] = q[t,h] . k[u,r] / sqrt(hd)  (u <= t);  p = softmax_u(s)
//   o[t,h]   = sum_u p[h,t,u] * v[u,r]
// q, o (B, T, H, hd); k, v (R, B, T, hd), head-major (rows of the KV buffer);
// att (B, H, T, T) keeps p for backward.
// ===========================================================================

static void attention_forward(float* out, float* att, const float* q, const float* k, const float* v, int B, int T,
                              int H, int R, int hd) {
    int n_rep = H / R;
    float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel for collapse(3) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                int r = h / n_rep;
                const float* qt = q + (((size_t)b * T + t) * H + h) * hd;
                float* p = att + (((size_t)b * H + h) * T + t) * T;
                float mx = -INFINITY, sum = 0;
                for (int u = 0; u <= t; u++) {
                    const float* ku = k + (((size_t)r * B + b) * T + u) * hd;
                    float s = 0;
                    for (int i = 0; i < hd; i++) s += qt[i] * ku[i];
                    p[u] = s * scale;
                    mx = std::max(mx, p[u]);
                }
                for (int u = 0; u <= t; u++) sum += p[u] = cpu_exp(p[u] - mx);
                for (int u = 0; u < T; u++) p[u] = u <= t ? p[u] / sum : 0.0f;
                float* o = out + (((size_t)b * T + t) * H + h) * hd;
                for (int i = 0; i < hd; i++) {
                    float s = 0;
                    for (int u = 0; u <= t; u++) s += p[u] * v[(((size_t)r * B + b) * T + u) * hd + i];
                    o[i] = s;
                }
            }
}

// forward: o[t] = sum_u p[t,u] v[u],  p = softmax(s),  s[t,u] = q[t].k[u] * scale
// dp[t,u] = dout[t] . v[u]                  dv[u] += sum_t p[t,u] dout[t]
// ds[t,u] = p[t,u] (dp[t,u] - sum_u' p[t,u'] dp[t,u'])
// dq[t]   = scale * sum_u ds[t,u] k[u]      dk[u] += scale * sum_t ds[t,u] q[t]
// dq is written; dk and dv are added to. One thread owns a (b, kv head) and
// adds its query heads' and rows' shares in order: the same for any thread count.
static void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                               const float* v, const float* att, int B, int T, int H, int R, int hd) {
    int n_rep = H / R;
    float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int r = 0; r < R; r++)
            for (int h = r * n_rep; h < (r + 1) * n_rep; h++)
                for (int t = 0; t < T; t++) {
                    size_t row = (((size_t)b * T + t) * H + h) * hd;  // q, dq, dout at (b, t, h)
                    const float* p = att + (((size_t)b * H + h) * T + t) * T;
                    auto dp = [&](int u) {
                        const float* vu = v + (((size_t)r * B + b) * T + u) * hd;
                        float s = 0;
                        for (int i = 0; i < hd; i++) s += dout[row + i] * vu[i];
                        return s;
                    };
                    float pdp = 0;
                    for (int u = 0; u <= t; u++) pdp += p[u] * dp(u);
                    for (int i = 0; i < hd; i++) dq[row + i] = 0;
                    for (int u = 0; u <= t; u++) {
                        size_t kv = (((size_t)r * B + b) * T + u) * hd;  // k, dk, v, dv at (r, b, u)
                        float ds = p[u] * (dp(u) - pdp);
                        for (int i = 0; i < hd; i++) {
                            dq[row + i] += scale * ds * k[kv + i];
                            dk[kv + i] += scale * ds * q[row + i];
                            dv[kv + i] += p[u] * dout[row + i];
                        }
                    }
                }
}

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
    int idx = blockIdx.x * blockDim.x + threadIdx.x;  // over dst (B, nh, T, hd); 32-bit: see model_create
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
    for (int r = 0; r < R; r++)  // att_g (M, T) = scale * q_g (M, hd) @ k_r^T: matmul_forward_gpu's product
        cublasCheck(cublasSgemmStridedBatched(blas, CUBLAS_OP_T, CUBLAS_OP_N, T, M, hd, &scale, k + r * B * skv, hd,
                                              skv, qp + r * n_rep * T * hd, hd, sq, &zero, att + r * n_rep * T * T, T,
                                              satt, B));
    LAUNCH(causal_softmax_kernel, ceil_div((size_t)B * H * T, 4), 128, 0, stream)(att, B * H * T, T);
    launchCheck();
    // op_g (M, hd) = att_g (M, T) @ v_r (T, hd): column-major op_g^T (hd, M) = v_r^T (hd, T) @ att_g^T (T, M)
    for (int r = 0; r < R; r++)
        cublasCheck(cublasSgemmStridedBatched(blas, CUBLAS_OP_N, CUBLAS_OP_N, hd, M, T, &one, v + r * B * skv, hd, skv,
                                              att + r * n_rep * T * T, T, satt, &zero, op + r * n_rep * T * hd, hd, sq,
                                              B));
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

// The flash-style kernels: the same outputs in O(T) memory (--attention flash).
#include "support/model/flash_attention.cuh"
#endif

// On the GPU, A->flash picks the flash-style kernels (att then holds each
// row's log-sum-exp), else the products around the stored softmax; on the CPU
// the fast loops (support/model/cpu_fast.cpp) run in ./lime, the plain ones above in ./lime-ref.
#ifdef LIME_GPU
static void attention_forward_gpu_any(float* out, float* att, const float* q, const float* k, const float* v, int B,
                                      int T, int H, int R, int hd, const Acts* A, cublasHandle_t blas,
                                      cudaStream_t stream) {
    if (A->flash) flash_attention_forward_gpu(out, att, q, k, v, B, T, H, R, hd, stream);
    else attention_forward_gpu(out, att, q, k, v, B, T, H, R, hd, A->scratch, blas, stream);
}
// out: the forward's output (flash backward needs dout . out per row).
static void attention_backward_gpu_any(float* dq, float* dk, float* dv, const float* dout, const float* out,
                                       const float* q, const float* k, const float* v, const float* att, int B, int T,
                                       int H, int R, int hd, const Acts* A, cublasHandle_t blas, cudaStream_t stream) {
    if (A->flash) flash_attention_backward_gpu(dq, dk, dv, dout, out, q, k, v, att, B, T, H, R, hd, A->scratch, stream);
    else attention_backward_gpu(dq, dk, dv, A->datt, dout, q, k, v, att, B, T, H, R, hd, A->scratch, blas, stream);
}
#endif
// scratch: cpu_scratch_floats's, with row buffers for `threads` threads.
static void attention_forward_cpu(float* out, float* att, const float* q, const float* k, const float* v, int B, int T,
                                  int H, int R, int hd, float* scratch, int threads) {
    if (FAST_CPU) attention_forward_fast(out, att, q, k, v, B, T, H, R, hd, scratch, threads);
    else attention_forward(out, att, q, k, v, B, T, H, R, hd);
}
static void attention_backward_cpu(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                                   const float* v, const float* att, int B, int T, int H, int R, int hd, float* scratch,
                                   int threads) {
    if (FAST_CPU) attention_backward_fast(dq, dk, dv, dout, q, k, v, att, B, T, H, R, hd, scratch, threads);
    else attention_backward(dq, dk, dv, dout, q, k, v, att, B, T, H, R, hd);
}

static void op_attention_forward(Model* model, float* out, float* att, const float* q, const float* k, const float* v,
                                 int B, int T) {
    const Config& c = model->c;
    DISPATCH(model,
             attention_forward_gpu_any(out, att, q, k, v, B, T, c.H, c.R, c.hd, pass_acts(model), blas_of(model),
                                       stream_of(model)),
             attention_forward_cpu(out, att, q, k, v, B, T, c.H, c.R, c.hd, model->acts->scratch, model->acts->threads));
}
static void op_attention_backward(Model* model, float* dq, float* dk, float* dv, const float* dout, const float* out,
                                  const float* q, const float* k, const float* v, const float* att, int B, int T) {
    const Config& c = model->c;
    (void)out;  // the GPU's flash kernels' alone
    DISPATCH(model,
             attention_backward_gpu_any(dq, dk, dv, dout, out, q, k, v, att, B, T, c.H, c.R, c.hd, pass_acts(model),
                                        blas_of(model), stream_of(model)),
             attention_backward_cpu(dq, dk, dv, dout, q, k, v, att, B, T, c.H, c.R, c.hd, model->acts->scratch,
                                    model->acts->threads));
}

// ===========================================================================
// SwiGLU: h = silu(gate) * up,  silu(z) = z / (1 + exp(-z))
// ===========================================================================

static void swiglu_forward(float* out, const float* gate, const float* up, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = gate[i] / (1.0f + cpu_exp(-gate[i])) * up[i];
}

// forward: h = silu(g) * u
// dg = dh * u * silu'(g),  silu'(g) = s (1 + g (1 - s)),  s = sigmoid(g);   du = dh * silu(g)
static void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i], s = 1.0f / (1.0f + cpu_exp(-g));
        dgate[i] = dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
        dup[i] = dout[i] * g * s;
    }
}

#ifdef LIME_GPU
__global__ void swiglu_forward_kernel(float* out, const float* gate, const float* up, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}
__global__ void swiglu_backward_kernel(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                                       size_t n) {
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
static void swiglu_backward_gpu(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                                size_t n, cudaStream_t stream) {
    LAUNCH(swiglu_backward_kernel, ceil_div(n, 256), 256, 0, stream)(dgate, dup, dout, gate, up, n);
    launchCheck();
}
#endif

static void op_swiglu_forward(Model* model, float* out, const float* gate, const float* up, size_t n) {
    DISPATCH(model, swiglu_forward_gpu(out, gate, up, n, stream_of(model)), swiglu_forward(out, gate, up, n));
}
static void op_swiglu_backward(Model* model, float* dgate, float* dup, const float* dout, const float* gate,
                               const float* up, size_t n) {
    DISPATCH(model, swiglu_backward_gpu(dgate, dup, dout, gate, up, n, stream_of(model)),
             swiglu_backward(dgate, dup, dout, gate, up, n));
}

// ===========================================================================
// Softmax cross-entropy over the masked positions of the whole batch:
//   loss = sum_n mask[n] * -log softmax(logits[n])[target[n]] / sum_n mask[n]
// ===========================================================================

// probs (N, V), nll (N); returns the loss (0 when the mask is all 0).
static float crossentropy_forward(float* probs, float* nll, const float* logits, const int* targets, const float* mask,
                                  int N, int V) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* z = logits + (size_t)n * V;
        float* p = probs + (size_t)n * V;
        float maxz = z[0];
        for (int i = 1; i < V; i++) maxz = std::max(maxz, z[i]);
        double sum = 0;
        for (int i = 0; i < V; i++) p[i] = cpu_exp(z[i] - maxz);
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
__global__ void crossentropy_forward_kernel(float* probs, float* nll, const float* logits, const int* targets, int N,
                                            int V) {
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
        metrics->loss = metrics->ce = count > 0 ? (float)(total / count) : 0.0f;
        metrics->inv_count = count > 0 ? (float)(1.0 / count) : 0.0f;
    }
}
// The loss stays on the device, in metrics->loss.
static void crossentropy_forward_gpu(float* probs, float* nll, const float* logits, const int* targets,
                                     const float* mask, int N, int V, Metrics* metrics, cudaStream_t stream) {
    LAUNCH(crossentropy_forward_kernel, ceil_div(N, 4), 128, 0, stream)(probs, nll, logits, targets, N, V);
    launchCheck();
    LAUNCH(crossentropy_loss_kernel, 1, 256, 0, stream)(metrics, nll, mask, N);
    launchCheck();
}

// dlogits = mask[n] / sum(mask) * (probs - onehot(target)), in place, the
// mask and 1 / sum(mask) (from the forward) fused in. One thread per logit.
__global__ void crossentropy_backward_kernel(float* dlogits_probs, const int* targets, const float* mask, int N, int V,
                                             const Metrics* metrics) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;  // 32-bit: see model_create
    if (idx >= N * V) return;
    int n = idx / V;
    float s = mask[n] * metrics->inv_count;
    float g = dlogits_probs[idx] * s;
    if (idx - n * V == targets[n]) g -= s;
    dlogits_probs[idx] = g;
}
static void crossentropy_backward_gpu(float* dlogits_probs, const int* targets, const float* mask, int N, int V,
                                      const Metrics* metrics, cudaStream_t stream) {
    LAUNCH(crossentropy_backward_kernel, ceil_div((size_t)N * V, 256), 256, 0, stream)
        (dlogits_probs, targets, mask, N, V, metrics);
    launchCheck();
}
#endif

// The loss lands in model->last_loss on the CPU, in device memory (Metrics) on the GPU.
// The CPU's loss goes to *loss (model->last_loss); the GPU's stays in Metrics until the host asks.
static void crossentropy_forward_cpu(float* loss, float* probs, float* nll, const float* logits, const int* targets,
                                     const float* mask, int N, int V) {
    *loss = crossentropy_forward(probs, nll, logits, targets, mask, N, V);
}
static void op_crossentropy_forward(Model* model, float* probs, float* nll, const float* logits, const int* targets,
                                    const float* mask, int N) {
    int V = model->c.V;
    DISPATCH(model,
             crossentropy_forward_gpu(probs, nll, logits, targets, mask, N, V, model->gpu->metrics, stream_of(model)),
             crossentropy_forward_cpu(&model->last_loss, probs, nll, logits, targets, mask, N, V));
}
static void op_crossentropy_backward(Model* model, float* dlogits_probs, const int* targets, const float* mask, int N) {
    int V = model->c.V;
    DISPATCH(model,
             crossentropy_backward_gpu(dlogits_probs, targets, mask, N, V, model->gpu->metrics, stream_of(model)),
             crossentropy_backward(dlogits_probs, targets, mask, N, V));
}

// ===========================================================================
// The value-entropy regulariser (the referee's causal test; docs/model.md).
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
// ===========================================================================

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

// One layer's S2 per sequence (stat, mu, G of that layer) from its values V (B, T, R*hd).
// The CPU runs the fast loops (support/model/cpu_fast.cpp) in ./lime, the plain ones above in ./lime-ref.
static void ereg_forward_cpu(float* stat, float* mu, float* G, const float* V, const float* valid, int B, int T, int D,
                             float* scratch) {
    if (FAST_CPU) ereg_forward_fast(stat, mu, G, V, valid, B, T, D, scratch);
    else ereg_forward(stat, mu, G, V, valid, B, T, D);
}
static void ereg_backward_cpu(float* dV, const float* V, const float* valid, const float* mu, const float* G,
                              const float* stat, float scale, int B, int T, int D, float* scratch) {
    if (FAST_CPU) ereg_backward_fast(dV, V, valid, mu, G, stat, scale, B, T, D, scratch);
    else ereg_backward(dV, V, valid, mu, G, stat, scale, B, T, D);
}
// On the CPU, *loss (the cross-entropy) becomes the regularised loss: *ce keeps the cross-entropy, *s2 the mean S2.
static void ereg_loss_cpu(float* loss, float* ce, float* s2, const float* stat, int n, float entropy_reg) {
    *ce = *loss;
    *s2 = ereg_loss(loss, *ce, stat, n, entropy_reg);
}
static void op_ereg_forward(Model* model, float* stat, float* mu, float* G, const float* V, const float* valid, int B,
                            int T) {
    int D = model->c.R * model->c.hd;
    DISPATCH(model,
             ereg_forward_gpu(stat, mu, G, V, valid, pass_acts(model)->scratch, B, T, D, blas_of(model),
                              stream_of(model)),
             ereg_forward_cpu(stat, mu, G, V, valid, B, T, D, model->acts->scratch));
}
static void op_ereg_backward(Model* model, float* dV, const float* V, const float* valid, float* mu, const float* G,
                             const float* stat, int B, int T) {
    int D = model->c.R * model->c.hd;
    float scale = -model->c.entropy_reg / ((float)model->c.L * B);
    [[maybe_unused]] float* Z = pass_acts(model)->scratch;  // GPU: (B, T, D) twice
    DISPATCH(model,
             ereg_backward_gpu(dV, V, valid, mu, G, stat, scale, Z, Z + (size_t)B * T * D, B, T, D, blas_of(model),
                               stream_of(model)),
             ereg_backward_cpu(dV, V, valid, mu, G, stat, scale, B, T, D, model->acts->scratch));
}
// After the cross-entropy: the regularised loss and the mean S2 over stat's n = L*B sequences
// (model->last_loss, last_s2 on the CPU; Metrics on the GPU).
static void op_ereg_loss(Model* model, const float* stat, int n) {
    float lambda = model->c.entropy_reg;
    DISPATCH(model, ereg_loss_gpu(model->gpu->metrics, stat, n, lambda, stream_of(model)),
             ereg_loss_cpu(&model->last_loss, &model->last_ce, &model->last_s2, stat, n, lambda));
}

// ===========================================================================
// AdamW (docs/training.md): global-norm clipping, then per run of tensors with
// their group's lr and weight decay (AdamWNumbers: per Group):
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

// One update's numbers: the groups' lr times the schedule factor, their
// weight decay (matrices only), and the bias corrections of update `step`.
LAB_SWAPPABLE AdamWNumbers adamw_numbers(const AdamWConfig& o, float factor, int step) {
    AdamWNumbers nums = {};
    nums.lr[GROUP_MATRIX] = nums.lr[GROUP_EMBED_GAIN] = o.lr * factor;
    nums.lr[GROUP_ROUTER] = o.router_lr * factor;
    nums.weight_decay[GROUP_MATRIX] = o.weight_decay;
    nums.beta1 = o.beta1;
    nums.beta2 = o.beta2;
    nums.eps = o.eps;
    nums.grad_clip = o.grad_clip;
    nums.bc1 = 1.0f - powf(o.beta1, (float)step);
    nums.bc2 = 1.0f - powf(o.beta2, (float)step);
    return nums;
}

// The parameter array as runs of tensors next to each other that share an
// AdamW group (one run: the embedding and the first gain; the next: q, k, v, o).
std::vector<AdamWRun> adamw_runs(const std::vector<TensorSpec>& specs) {
    std::vector<AdamWRun> runs;
    for (const TensorSpec& t : specs) {
        if (!runs.empty() && runs.back().group == t.group) runs.back().numel += t.numel;
        else runs.push_back({t.offset, t.numel, t.group});
    }
    return runs;
}

// One run of tensors: p (n), its moments m, v and its gradient g, times
// grad_scale (the clipping). A short run (a gain, a router) stays on one
// thread (SHARED_FLOATS).
LAB_SWAPPABLE void adamw_cpu(float* p, float* m, float* v, const float* g, size_t n, float lr, float wd,
                             float grad_scale, const AdamWNumbers& nums) {
    // the numbers as locals: m, v and p could be nums as far as the compiler
    // knows, and it would reload them after every store instead of vectorising
    const float beta1 = nums.beta1, beta2 = nums.beta2, bc1 = nums.bc1, bc2 = nums.bc2, eps = nums.eps;
#pragma omp parallel for schedule(static) if (n > SHARED_FLOATS)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * grad_scale;
        m[i] = beta1 * m[i] + (1.0f - beta1) * gi;
        v[i] = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        float mhat = m[i] / bc1, vhat = v[i] / bc2;
        p[i] -= lr * wd * p[i] + lr * mhat / (sqrtf(vhat) + eps);
    }
}

// As PyTorch's clip_grad_norm_: the gradients are scaled by min(1, clip / (norm + 1e-6)),
// norm the global norm over every parameter; clip 0 turns clipping off.
LAB_SWAPPABLE float clip_scale(float norm, float grad_clip) {
    return grad_clip > 0 ? std::min(1.0f, grad_clip / (norm + 1e-6f)) : 1.0f;
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
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        s += (double)g[i] * g[i];
    s = block_sum(s, part);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
__global__ void grad_norm_kernel(Metrics* metrics, const double* partial, int blocks, const AdamWNumbers* nums) {
    __shared__ double part[NORM_THREADS];
    double s = 0;
    for (int b = threadIdx.x; b < blocks; b += blockDim.x) s += partial[b];
    s = block_sum(s, part);
    if (threadIdx.x == 0) {
        float norm = (float)sqrt(s), clip = nums->grad_clip;
        metrics->norm = norm;
        metrics->clip_scale = clip > 0 ? fminf(1.0f, clip / (norm + 1e-6f)) : 1.0f;
    }
}
// partial: grad_norm_blocks(n) doubles.
static void grad_norm_gpu(Metrics* metrics, double* partial, const float* g, size_t n, const AdamWNumbers* nums,
                          cudaStream_t stream) {
    int blocks = grad_norm_blocks(n);
    LAUNCH(grad_sumsq_kernel, blocks, NORM_THREADS, 0, stream)(partial, g, n);
    launchCheck();
    LAUNCH(grad_norm_kernel, 1, NORM_THREADS, 0, stream)(metrics, partial, blocks, nums);
    launchCheck();
}

// One run of tensors of one group (n floats): one thread per parameter.
// The numbers come from device memory, written before each step.
__global__ void adamw_kernel(float* p, float* m, float* v, const float* g, size_t n, int group, const AdamWNumbers* nums,
                             const Metrics* metrics) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float lr = nums->lr[group], wd = nums->weight_decay[group];
    float gi = g[i] * metrics->clip_scale;
    float mi = nums->beta1 * m[i] + (1.0f - nums->beta1) * gi;
    float vi = nums->beta2 * v[i] + (1.0f - nums->beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float mhat = mi / nums->bc1, vhat = vi / nums->bc2;
    p[i] -= lr * wd * p[i] + lr * mhat / (sqrtf(vhat) + nums->eps);
}
static void adamw_gpu(float* p, float* m, float* v, const float* g, size_t n, Group group, const AdamWNumbers* nums,
                      const Metrics* metrics, cudaStream_t stream) {
    LAUNCH(adamw_kernel, ceil_div(n, 256), 256, 0, stream)(p, m, v, g, n, (int)group, nums, metrics);
    launchCheck();
}
// Every run of one group (GpuState::runs) with one launch; mem holds params,
// grads, adam_m, adam_v of n floats each. The numbers and the clip scale are
// read on the device.
static void adamw_gpu_runs(float* mem, const std::vector<AdamWRun>& runs, size_t n, const AdamWNumbers* nums,
                           const Metrics* metrics, cudaStream_t stream) {
    for (const AdamWRun& run : runs)
        adamw_gpu(mem + run.offset, mem + 2 * n + run.offset, mem + 3 * n + run.offset, mem + n + run.offset, run.numel,
                  run.group, nums, metrics, stream);
}
#endif

// The CPU's global norm, into *norm (model->last_norm).
static void grad_norm_cpu(float* norm, const float* g, size_t n) { *norm = (float)std::sqrt(grad_sumsq(g, n)); }
// Every run of tensors (model->adamw_runs) with its group's lr and weight
// decay; params holds params, grads, adam_m, adam_v of n floats each; the
// gradients scaled by the clip scale of the global norm.
static void adamw_cpu_runs(float* params, const std::vector<AdamWRun>& runs, size_t n, float norm,
                           const AdamWNumbers& nums) {
    float clip = clip_scale(norm, nums.grad_clip);
    for (const AdamWRun& run : runs)
        adamw_cpu(params + run.offset, params + 2 * n + run.offset, params + 3 * n + run.offset, params + n + run.offset,
                  run.numel, nums.lr[run.group], nums.weight_decay[run.group], clip, nums);
}

// Global gradient norm: model->last_norm on the CPU, Metrics (with the clip scale) on the GPU.
static void op_grad_norm(Model* model) {
    size_t n = model->n_params;
    DISPATCH(model,
             grad_norm_gpu(model->gpu->metrics, model->gpu->norm_partial, model->gpu->mem + n, n, model->gpu->numbers,
                           stream_of(model)),
             grad_norm_cpu(&model->last_norm, model->grads, n));
}
// AdamW on every tensor with model->numbers; the GPU reads their device copy
// (staged before the step), so that a captured graph stays valid.
static void op_adamw(Model* model) {
    size_t n = model->n_params;
    DISPATCH(model,
             adamw_gpu_runs(model->gpu->mem, model->adamw_runs, n, model->gpu->numbers, model->gpu->metrics,
                            stream_of(model)),
             adamw_cpu_runs(model->params, model->adamw_runs, n, model->last_norm, model->numbers));
}

// ===========================================================================
// The model: one code path for both devices.
//
// forward_pass, backward_pass and update_pass are written once. Each of their
// steps is an op_*() call that runs the CPU loops (plain, or fast) or launches
// the GPU kernels (DISPATCH is the one `if`). The activations are the same struct, Acts,
// carved by acts_carve over host memory for the CPU and over device memory
// for the GPU; the parameters are the same Params views, over host or device
// memory. On the GPU every op is queued on one stream and nothing inside a
// pass waits for the device, so a whole training step can be captured as a
// CUDA graph and replayed.
// ===========================================================================

// The CPU ops' scratch (declared with Acts): rmsnorm_backward's gain slices,
// the plain hc_weights_backward's slices and rows; in ./lime also the fast
// products' panels, the attention's row buffers (one set per thread), the
// fast HC weights' and the regulariser's (support/model/cpu_fast.h).
static size_t cpu_scratch_floats(const Config& c, int B, int threads) {
    size_t d = c.d, n = c.hc_rate, hc = c.arch == ARCH_HC ? 1 : 0, ereg = c.entropy_reg > 0 ? 1 : 0;
    size_t most = std::max(CHUNKS * d, hc * CHUNKS * (hc_weight_floats(n, d) + d));
    if (!FAST_CPU) return most;
    return std::max({most, fast_scratch_floats(c), attention_fast_scratch_floats(c.T, c.hd, threads),
                     hc * hc_fast_scratch_floats((int)n, (int)d), ereg * ereg_fast_scratch_floats(B, c.T, c.R * c.hd)});
}

// Pointers of layer l's activations for a (B, T) batch: per-layer strides are B*T*width.
struct LayerActs {
    float *x, *xa, *xnext, *attn_in, *rstd_a, *q, *K, *V, *kr, *vr, *att, *o, *mlp_in, *rstd_m, *gate, *up, *h;
};
static LayerActs layer_acts(const Acts* A, const Config& c, int l, int B, int T) {
    size_t BT = (size_t)B * T, d = c.d, qd = (size_t)c.H * c.hd, kvd = (size_t)c.R * c.hd;
    size_t stream = hc_streams(c) * BT * d;  // the residual stream: n streams with hc
    LayerActs la;
    la.x = A->x + l * stream;
    la.xnext = A->x + (l + 1) * stream;
    la.xa = A->xa + l * stream;
    la.attn_in = A->attn_in + l * BT * d;
    la.rstd_a = A->rstd_a + l * BT;
    la.q = A->q + l * BT * qd;
    la.K = A->Kbuf + l * BT * kvd;
    la.V = A->Vbuf + l * BT * kvd;
    la.kr = A->kr + l * BT * kvd;
    la.vr = A->vr + l * BT * kvd;
    la.att = A->att + l * BT * c.H * (A->flash ? 1 : T);
    la.o = A->o + l * BT * qd;
    la.mlp_in = A->mlp_in + l * BT * d;
    la.rstd_m = A->rstd_m + l * BT;
    la.gate = A->gate + l * BT * c.F;
    la.up = A->up + l * BT * c.F;
    la.h = A->h + l * BT * c.F;
    return la;
}

// Pointers of sublayer s's Hyper-Connection activations (s = 2l attention, 2l+1 MLP), for a (B, T) batch.
struct HcActs {
    float *M, *y, *A, *b, *rstd, *ta, *tb;
};
static HcActs hc_acts(const Acts* A, const Config& c, int s, int B, int T) {
    size_t BT = (size_t)B * T, d = c.d, n = c.hc_rate, dyn = c.hc_dynamic ? 1 : 0;
    return HcActs{A->hc_M + s * (n + 1) * BT * d, A->hc_y + s * BT * d,           A->hc_A + s * BT * n * (n + 1),
                  A->hc_b + s * BT * n,           A->hc_rstd + dyn * s * BT * n,  A->hc_ta + dyn * s * BT * n * (n + 1),
                  A->hc_tb + dyn * s * BT * n};
}

// HC's sublayer input: the mixing weights of the streams X (n, N, d), then the
// width connection; returns mixture 0 (N, d), what the sublayer's norm reads.
static const float* hc_sublayer_input(Model* model, const HcActs& h, const float* X, const HcParams& w, int N) {
    op_hc_weights_forward(model, h.A, h.b, h.rstd, h.ta, h.tb, X, w, N);
    op_hc_width_forward(model, h.M, X, h.A, N);
    return h.M;
}
// HC's residual: y = inp (N, C) @ W^T, then the depth connection into Xout (n, N, d).
static void hc_sublayer_output(Model* model, float* Xout, const HcActs& h, const float* inp, const float* W, int N,
                               int C) {
    op_matmul_forward(model, h.y, inp, W, N, C, model->c.d);
    op_hc_depth_forward(model, Xout, h.y, h.M, h.b, N);
}
// Backward of hc_sublayer_output, from dXout (n, N, d): returns dy (N, d), the
// gradient of the sublayer's output; fills dM[1..n] and zeroes dM[0].
static const float* hc_output_backward(Model* model, const HcActs& h, const float* dXout, int N) {
    Acts* A = pass_acts(model);
    op_hc_depth_backward(model, A->hc_dy, A->hc_db, A->hc_dM, dXout, h.y, h.b, N);
    return A->hc_dy;
}
// Backward of hc_sublayer_input once dM (n+1, N, d) is complete: writes dX (n, N, d), adds the HC tensors' gradients.
static void hc_input_backward(Model* model, float* dX, const HcActs& h, const float* X, const HcParams& w,
                              const HcParams& dw, int N) {
    Acts* A = pass_acts(model);
    op_hc_width_backward(model, dX, A->hc_dA, A->hc_dM, X, h.A, N);
    op_hc_weights_backward(model, dX, dw, A->hc_dA, A->hc_db, X, h.rstd, h.ta, h.tb, w, N);
}

// The router that mixes the values: the one router of Eq. 2, or with
// --router-kv separate a second one (the same for gradients: Params alike).
static float* value_router(const LayerParams& w) { return w.router_v ? w.router_v : w.router; }

// Forward over the batch already in A->tokens (and A->targets, A->mask with a loss).
static void forward_pass(Model* model, int B, int T, bool with_loss) {
    const Config& c = model->c;
    Acts* A = pass_acts(model);
    const Params& P = pass_params(model);
    int N = B * T, d = c.d, qd = c.H * c.hd, kvd = c.R * c.hd;
    bool hc = c.arch == ARCH_HC;  // Hyper-Connections: n residual streams
    op_embedding_forward(model, hc ? A->hc_x : A->x, A->tokens, P.E, N);  // x[0] (B, T, d)
    if (hc) op_hc_expand(model, A->x, A->hc_x, N);                          // into every stream (n, B, T, d)
    for (int l = 0; l < c.L; l++) {
        const LayerParams& w = P.layer[l];
        LayerActs la = layer_acts(A, c, l, B, T);
        HcActs ha = hc ? hc_acts(A, c, 2 * l, B, T) : HcActs{}, hm = hc ? hc_acts(A, c, 2 * l + 1, B, T) : HcActs{};
        // attention block
        const float* a_in = hc ? hc_sublayer_input(model, ha, la.x, P.hc[2 * l], N) : la.x;
        op_rmsnorm_forward(model, la.attn_in, la.rstd_a, a_in, w.g_attn, N);
        op_matmul_forward(model, la.q, la.attn_in, w.Wq, N, d, qd);  // (B, T, H, hd)
        op_kv_projection_forward(model, la.K, la.attn_in, w.Wk, N);  // (R, B, T, hd) into the buffer
        op_kv_projection_forward(model, la.V, la.attn_in, w.Wv, N);
        if (model->ereg_on) {  // the value-entropy regulariser: this layer's S2 per sequence, from V as (B, T, R*hd)
            float* Vt = A->ereg_V + (size_t)l * N * kvd;  // token-major, kept for the backward
            op_kv_transpose(model, Vt, la.V, N, true, false);
            op_ereg_forward(model, A->ereg_stat + (size_t)l * B * 4, A->ereg_mu + (size_t)l * B * kvd,
                            A->ereg_G + (size_t)l * B * kvd * kvd, Vt, A->valid, B, T);
        }
        const float* vr = la.V;
        if (has_router(c, l)) {  // LIMe: mix the buffer of layers 0..l
            op_router_forward(model, la.kr, la.vr, w.router, value_router(w), A->Kbuf, A->Vbuf, l, N);
            vr = la.vr;
        } else {                 // LLaMa, and LIMe's layer 0: own keys and values
            op_copy(model, la.kr, la.K, (size_t)N * kvd);
        }
        op_rope_forward(model, la.q, B, T, c.H);
        op_rope_forward(model, la.kr, c.R * B, T, 1);  // (R, B, T, hd): R*B sequences of one head
        op_attention_forward(model, la.o, la.att, la.q, la.kr, vr, B, T);
        if (hc) {
            hc_sublayer_output(model, la.xa, ha, la.o, w.Wo, N, qd);  // xa = b * (o @ Wo^T) + M[1..n]
        } else {
            op_copy(model, la.xa, la.x, (size_t)N * d);
            op_matmul_forward(model, la.xa, la.o, w.Wo, N, qd, d, true);  // xa = x + o @ Wo^T
        }
        // MLP block
        const float* m_in = hc ? hc_sublayer_input(model, hm, la.xa, P.hc[2 * l + 1], N) : la.xa;
        op_rmsnorm_forward(model, la.mlp_in, la.rstd_m, m_in, w.g_mlp, N);
        op_matmul_forward(model, la.gate, la.mlp_in, w.Wg, N, d, c.F);
        op_matmul_forward(model, la.up, la.mlp_in, w.Wu, N, d, c.F);
        op_swiglu_forward(model, la.h, la.gate, la.up, (size_t)N * c.F);
        if (hc) {
            hc_sublayer_output(model, la.xnext, hm, la.h, w.Wd, N, c.F);  // x = b * (h @ Wd^T) + M[1..n]
        } else {
            op_copy(model, la.xnext, la.xa, (size_t)N * d);
            op_matmul_forward(model, la.xnext, la.h, w.Wd, N, c.F, d, true);  // x = xa + h @ Wd^T
        }
    }
    float* xL = layer_acts(A, c, c.L, B, T).x;
    if (hc) op_hc_sum(model, A->hc_x, xL, N), xL = A->hc_x;  // the streams' sum
    op_rmsnorm_forward(model, A->hf, A->rstd_f, xL, P.g_final, N);
    op_matmul_forward(model, A->logits, A->hf, P.E, N, d, c.V);  // tied: logits = hf @ E^T
    if (with_loss) op_crossentropy_forward(model, A->probs, A->nll, A->logits, A->targets, A->mask, N);
    if (with_loss && model->ereg_on) op_ereg_loss(model, A->ereg_stat, c.L * B);  // loss = ce - lambda mean S2
}

static void backward_pass(Model* model, int B, int T) {
    const Config& c = model->c;
    Acts* A = pass_acts(model);
    const Params& P = pass_params(model);
    const Params& G = pass_grads(model);
    int N = B * T, d = c.d, qd = c.H * c.hd, kvd = c.R * c.hd;
    size_t kv_layer = (size_t)N * kvd;
    op_zero(model, pass_grads_base(model), model->n_params);
    op_zero(model, A->dKbuf, c.L * kv_layer);
    op_zero(model, A->dVbuf, c.L * kv_layer);
    // loss -> logits -> final norm
    float* dlogits = A->probs;
    op_crossentropy_backward(model, dlogits, A->targets, A->mask, N);
    op_matmul_backward(model, A->dnorm, G.E, dlogits, A->hf, P.E, N, d, c.V, false);
    bool hc = c.arch == ARCH_HC;  // Hyper-Connections: n residual streams
    float* dxL = hc ? A->hc_dy : A->dx;  // hc: the gradient of the streams' sum, then of every stream
    op_zero(model, dxL, (size_t)N * d);
    float* xL = hc ? A->hc_x : layer_acts(A, c, c.L, B, T).x;
    op_rmsnorm_backward(model, dxL, G.g_final, A->dnorm, xL, P.g_final, A->rstd_f, N);
    if (hc) op_hc_expand(model, A->dx, dxL, N);  // forward: x = sum_i X[i]
    for (int l = c.L - 1; l >= 0; l--) {
        const LayerParams& w = P.layer[l];
        const LayerParams& gw = G.layer[l];
        LayerActs la = layer_acts(A, c, l, B, T);
        HcActs ha = hc ? hc_acts(A, c, 2 * l, B, T) : HcActs{}, hm = hc ? hc_acts(A, c, 2 * l + 1, B, T) : HcActs{};
        float* dK = A->dKbuf + l * kv_layer;  // (R, B, T, hd): complete once layers > l are done
        float* dV = A->dVbuf + l * kv_layer;
        // MLP block. forward: xnext = xa + h @ Wd^T, h = swiglu(mlp_in Wg^T, mlp_in Wu^T), mlp_in = rmsnorm(xa)
        // (hc: forward xnext = b * (h @ Wd^T) + M[1..n], M = mixtures of xa, mlp_in = rmsnorm(M[0]))
        const float* dy = hc ? hc_output_backward(model, hm, A->dx, N) : A->dx;  // gradient of h @ Wd^T
        op_matmul_backward(model, A->dh, gw.Wd, dy, la.h, w.Wd, N, c.F, d, false);
        op_swiglu_backward(model, A->dgate, A->dup, A->dh, la.gate, la.up, (size_t)N * c.F);
        op_matmul_backward(model, A->dnorm, gw.Wg, A->dgate, la.mlp_in, w.Wg, N, d, c.F, false);
        op_matmul_backward(model, A->dnorm, gw.Wu, A->dup, la.mlp_in, w.Wu, N, d, c.F, true);
        op_rmsnorm_backward(model, hc ? A->hc_dM : A->dx, gw.g_mlp, A->dnorm, hc ? hm.M : la.xa, w.g_mlp, la.rstd_m, N);
        if (hc) hc_input_backward(model, A->dx, hm, la.xa, P.hc[2 * l + 1], G.hc[2 * l + 1], N);  // dx is now d xa
        // attention block. forward: xa = x + o @ Wo^T  (hc: xa = b * (o @ Wo^T) + M[1..n], M = mixtures of x)
        dy = hc ? hc_output_backward(model, ha, A->dx, N) : A->dx;  // gradient of o @ Wo^T
        op_matmul_backward(model, A->dout, gw.Wo, dy, la.o, w.Wo, N, qd, d, false);
        bool routed = has_router(c, l);
        float* dvr = routed ? A->dvr : dV;  // without a router, attention's values are the buffer itself
        op_zero(model, A->dkr, kv_layer);
        if (routed) op_zero(model, A->dvr, kv_layer);
        op_attention_backward(model, A->dq, A->dkr, dvr, A->dout, la.o, la.q, la.kr, routed ? la.vr : la.V, la.att, B,
                              T);
        op_rope_backward(model, A->dq, B, T, c.H);
        op_rope_backward(model, A->dkr, c.R * B, T, 1);
        if (routed) {
            op_router_backward(model, gw.router, value_router(gw), A->dKbuf, A->dVbuf, A->dkr, A->dvr, w.router,
                               value_router(w), A->Kbuf, A->Vbuf, l, N);
        } else {
            op_add(model, dK, A->dkr, kv_layer);
        }
        // forward: loss -= entropy_reg * mean S2, S2 from V (the regulariser): its gradient, token-major
        // in dvr (free now), joins dV
        if (model->ereg_on) {
            op_zero(model, A->dvr, kv_layer);
            op_ereg_backward(model, A->dvr, A->ereg_V + l * kv_layer, A->valid, A->ereg_mu + (size_t)l * B * kvd,
                             A->ereg_G + (size_t)l * B * kvd * kvd, A->ereg_stat + (size_t)l * B * 4, B, T);
            op_kv_transpose(model, dV, A->dvr, N, false, true);
        }
        // forward: q = a Wq^T, K and V = the heads of a Wk^T and a Wv^T (kv_projection_forward), a = rmsnorm(x)
        op_matmul_backward(model, A->dnorm, gw.Wq, A->dq, la.attn_in, w.Wq, N, d, qd, false);  // then K's and V's add
        op_kv_projection_backward(model, A->dnorm, gw.Wk, dK, la.attn_in, w.Wk, N);
        op_kv_projection_backward(model, A->dnorm, gw.Wv, dV, la.attn_in, w.Wv, N);
        op_rmsnorm_backward(model, hc ? A->hc_dM : A->dx, gw.g_attn, A->dnorm, hc ? ha.M : la.x, w.g_attn, la.rstd_a,
                            N);
        if (hc) hc_input_backward(model, A->dx, ha, la.x, P.hc[2 * l], G.hc[2 * l], N);  // dx is now d x[l]
    }
    if (hc) op_hc_sum(model, A->hc_dy, A->dx, N);  // forward: X[i] = x[0] for every stream
    op_embedding_backward(model, G.E, hc ? A->hc_dy : A->dx, A->tokens, N);
}

// Global norm, clipping and AdamW with model->numbers (docs/training.md).
static void update_pass(Model* model) {
    op_grad_norm(model);
    op_adamw(model);
}

// ===========================================================================
// Making a model, and its public calls (support/model/lime.h)
// ===========================================================================

// memory_needed and memory_fix: what a model of a shape needs, and which of the
// command's size flags would shrink it most.
#include "support/model/memory_check.h"

std::string model_create(Model* model, const Config& c, int B, Device dev, const ModelSettings& settings) {
    std::string err = config_check(c);
    if (!err.empty()) return err;
    if (B < 1) return "--batch must be at least 1";
    // Everything the host will hold, asked before any of it is allocated: calloc would
    // promise more than there is (pages are given when touched), and the run would
    // then be killed part way through its first step.
    auto host_need = [&](const Config& h, int hb) { return memory_needed(h, hb, dev, false); };
    double need = host_need(c, B), state = 16.0 * param_count(c);
    if (settings.host_bytes && need > settings.host_bytes) {
        char buf[300];
        snprintf(buf, sizeof buf,
                 "out of memory: needs %.1f GB of host memory (%.1f GB for the parameters, gradients and AdamW "
                 "state, %.1f GB for the %s), %.1f GB is available; ",
                 need / 1e9, state / 1e9, (need - state) / 1e9,
                 dev == DEVICE_GPU ? "host copy of the logits" : "activations and scratch", settings.host_bytes / 1e9);
        return buf + memory_fix(c, B, settings.flags, host_need);
    }
    err = launch_check(c, B, dev, settings.flags);  // shapes the code cannot run on this device
    if (!err.empty()) return err;
    model->c = c;
    model->B = B;
    model->device = dev;
    model->settings = settings;
    model->specs = param_specs(c);
    model->adamw_runs = adamw_runs(model->specs);
    model->n_params = param_count(c);
    // parameters, gradients, adam_m, adam_v: one allocation (on the GPU, the host copies)
    size_t n = model->n_params;
    model->params = (float*)calloc(n * 4, sizeof(float));
    if (!model->params)
        return "out of memory allocating " + std::to_string(n * 16 / 1000000) +
               " MB for parameters and optimiser state";
    model->grads = model->params + n;
    model->adam_m = model->params + 2 * n;
    model->adam_v = model->params + 3 * n;
    model->p = params_carve(c, model->params);
    model->g = params_carve(c, model->grads);
    model->acts = new Acts();
    model->step = 0;
    if (dev == DEVICE_GPU) {
        // The device holds the activations; the host keeps only the logits, for model_logits.
        float* logits = (float*)calloc((size_t)B * c.T * c.V, sizeof(float));
        if (!logits) return "out of memory allocating the host copy of the logits";
        model->acts->mem = model->acts->logits = logits;
        return gpu_create(model);  // (a build without the GPU: NO_GPU_BUILD)
    }
    size_t na = acts_carve(model->acts, c, B, nullptr);
    float* mem = (float*)calloc(na, sizeof(float));
    if (!mem)
        return "out of memory allocating " + std::to_string(na * 4 / 1000000) + " MB for the activations; " +
               memory_fix(c, B, settings.flags, host_need);
    acts_carve(model->acts, c, B, mem);
    model->acts->mem = mem;
    rope_tables(model->acts->rope_cos, model->acts->rope_sin, c.T, c.hd, c.rope_theta);
    return "";
}

void model_free(Model* model) {
    if (model->gpu) gpu_free(model);
    if (model->acts) { free(model->acts->mem); delete model->acts; }
    free(model->params);
    model->acts = nullptr;
    model->params = nullptr;
}

void model_init(Model* model, uint64_t seed) {
    const Config& c = model->c;
    for (const TensorSpec& t : model->specs) {
        float* p = model->params + t.offset;
        Rng rng(seed_for(seed, t.name));
        if (t.group == GROUP_ROUTER) {
            // uniform in [-b, b], b = sqrt(3 / ((l+1) R)), then the last R x R block = I
            int cols = t.shape[1], R = c.R, l = cols / R - 1;
            double b = std::sqrt(3.0 / cols);
            for (size_t i = 0; i < t.numel; i++) p[i] = (float)((2.0 * rng.uniform() - 1.0) * b);
            for (int r = 0; r < R; r++)
                for (int k = 0; k < R; k++) p[r * cols + (cols - R) + k] = r == k ? 1.0f : 0.0f;
            // the variants (router_sources): 0 for the layers a router does not read;
            // average's fixed weights, 1/(l+1) for the same kv head of every layer
            RouterSpan sources = router_sources(c, l);
            for (int r = 0; r < R; r++)
                for (int j = 0; j < cols; j++) {
                    if (!sources.has(j / R)) p[r * cols + j] = 0.0f;
                    if (c.router == ROUTER_AVERAGE) p[r * cols + j] = j % R == r ? 1.0f / (l + 1) : 0.0f;
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
        if (model->p.layer[l].router_v)
            memcpy(model->p.layer[l].router_v, model->p.layer[l].router, (size_t)c.R * (l + 1) * c.R * sizeof(float));
    // Hyper-Connections (the authors' init): static_beta = 1; static_alpha's
    // column 0 = e_{l mod n} (sublayers of layer l read stream l mod n), columns
    // 1..n = I (every stream passes through); the dynamic correction starts at
    // 0 (alpha_fn, beta_fn = 0) with scales 0.01.
    for (size_t s = 0; s < model->p.hc.size(); s++) {
        const HcParams& h = model->p.hc[s];
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
    memset(model->adam_m, 0, 2 * model->n_params * sizeof(float));
    model->step = 0;
    model_to_device(model);  // initialised on the host, copied to the device
}



// Every token id and target of a batch inside the vocabulary, checked once,
// here: the embedding and the cross-entropy after it (both devices' loops and
// kernels) index E and the logits with them unchecked. An id outside
// 0 .. V-1 is the caller's mistake, not the user's (the commands check their
// files first): one line and a non-zero exit, as a failed CUDA call.
static void ids_check(const int* ids, int N, int V, const char* what) {
    for (int n = 0; n < N; n++)
        if (ids[n] < 0 || ids[n] >= V) {
            fprintf(stderr, "lime: %s %d at position %d of the batch is outside the vocabulary 0 .. %d; make the "
                    "batch with this model's vocabulary\n", what, ids[n], n, V - 1);
            exit(EXIT_FAILURE);
        }
}

// The batch into the activations, and on the GPU model->numbers into device
// memory: plain copies on the CPU; on the GPU through pinned memory, queued on
// the stream. targets and mask may be null; `numbers`: stage them too. With
// the regulariser on (model->ereg_on) the valid mask too, all 1 when null.
static void stage(Model* model, const int* tokens, const int* targets, const float* mask, const float* valid, int N,
                  bool numbers) {
    if (tokens) ids_check(tokens, N, model->c.V, "token id");
    if (targets) ids_check(targets, N, model->c.V, "target");
    if (model->device == DEVICE_GPU) {
        gpu_stage(model, tokens, targets, mask, valid, N, numbers ? &model->numbers : nullptr);
        return;
    }
    Acts* A = model->acts;
    if (tokens) memcpy(A->tokens, tokens, N * sizeof(int));
    if (targets) memcpy(A->targets, targets, N * sizeof(int));
    if (mask) memcpy(A->mask, mask, N * sizeof(float));
    if (tokens && model->ereg_on && valid) memcpy(A->valid, valid, N * sizeof(float));  // with a batch only
    if (tokens && model->ereg_on && !valid) std::fill(A->valid, A->valid + N, 1.0f);
}

float model_forward(Model* model, const int* tokens, const int* targets, const float* mask, int B, int T,
                    const float* valid) {
    model->cur_B = B;
    model->cur_T = T;
    model->ereg_on = model->c.entropy_reg > 0 && valid && targets;  // eval (no valid mask): the plain cross-entropy
    stage(model, tokens, targets, mask, valid, B * T, false);
    forward_pass(model, B, T, targets != nullptr);
    if (model->device == DEVICE_GPU) gpu_read_forward(model, (size_t)B * T * model->c.V);  // waits for the device
    if (!targets) model->last_loss = 0;
    if (!model->ereg_on) model->last_ce = model->last_loss, model->last_s2 = 0;
    return model->last_loss;
}

const float* model_logits(Model* model) { return model->acts->logits; }

// The values layer l attended with in the last forward, (B, T, R, hd) in host
// memory: routed for LIMe's layers >= 1, the layer's own otherwise (analysis).
// One layer's slice of an activation of the last forward, packed for its
// batch (cur_B, cur_T): on the GPU copied to model->host_copy first.
const float* model_probe(Model* model, Probe what, int l) {
    const Config& c = model->c;
    size_t BT = (size_t)model->cur_B * model->cur_T;
    size_t n = BT * (what == PROBE_HIDDEN ? c.d : c.R * c.hd), streams = what == PROBE_HIDDEN ? hc_streams(c) : 1;
    bool routed = what == PROBE_VALUES && has_router(c, l);
    size_t at = what == PROBE_HIDDEN ? (l + 1) * streams * n : l * n;  // x[l + 1]: the stream leaving layer l
    const Acts* A = pass_acts(model);
    const float* src = (what == PROBE_HIDDEN ? A->x : routed ? A->vr : A->Vbuf) + at;
    // on the GPU into model->host_copy, with room for the values' transpose or the streams' sum
    if (model->device == DEVICE_GPU) src = gpu_probe_copy(model, src, streams * n, (streams + 1) * n);
    if (what != PROBE_HIDDEN) {  // the buffer's (R, B, T, hd), as (B, T, R, hd)
        model->host_copy.resize(2 * n);
        kv_transpose(model->host_copy.data() + n, src, (int)BT, c.R, c.hd, true, false);
        return model->host_copy.data() + n;
    }
    if (streams == 1) return src;
    // hc: the sum of the n streams leaving layer l, what the final norm reads after the last layer
    model->host_copy.resize(streams * n + n);
    float* sum = model->host_copy.data() + streams * n;
    hc_sum(sum, src, (int)streams, n);
    return sum;
}

void model_backward(Model* model) { backward_pass(model, model->cur_B, model->cur_T); }

float model_update(Model* model, const AdamWConfig& opt, float factor) {
    model->step++;
    model->numbers = adamw_numbers(opt, factor, model->step);
    stage(model, nullptr, nullptr, nullptr, nullptr, 0, true);
    update_pass(model);
    if (model->device == DEVICE_GPU) gpu_read_metrics(model);  // waits for the device
    return model->last_norm;
}

void model_train_step(Model* model, const int* tokens, const int* targets, const float* mask, int B, int T,
                      const AdamWConfig& opt, float factor, const float* valid) {
    model->cur_B = B;
    model->cur_T = T;
    model->step++;
    model->numbers = adamw_numbers(opt, factor, model->step);
    model->ereg_on = model->c.entropy_reg > 0;  // every step of a regularised model (the graph holds its ops)
    stage(model, tokens, targets, mask, valid, B * T, true);
    // the GPU replays the step's graph once it is captured (gpu_graph); no waiting: model_metrics waits when asked
    if (model->device == DEVICE_GPU && model->settings.graph && gpu_replay_step(model, B, T)) return;
    forward_pass(model, B, T, true);
    backward_pass(model, B, T);
    update_pass(model);
}

void model_metrics(Model* model, float* loss, float* norm) {
    if (model->device == DEVICE_GPU) gpu_read_metrics(model);
    if (!model->ereg_on) model->last_ce = model->last_loss, model->last_s2 = 0;
    *loss = model->last_loss;
    *norm = model->last_norm;
}


void model_sync(Model* model) {
    if (model->device == DEVICE_GPU) gpu_sync(model);
}
void model_to_device(Model* model) {
    if (model->device == DEVICE_GPU) gpu_to_device(model);
}
void model_to_host(Model* model) {
    if (model->device == DEVICE_GPU) gpu_to_host(model);
}

// ===========================================================================
// Training guards: where did a NaN or an Inf appear?
// ===========================================================================
std::string model_first_nonfinite(Model* model, bool params) {
    model_to_host(model);
    const float* base = params ? model->params : model->grads;
    for (const TensorSpec& t : model->specs)
        for (size_t i = 0; i < t.numel; i++)
            if (!std::isfinite(base[t.offset + i])) return t.name;
    return "";
}

