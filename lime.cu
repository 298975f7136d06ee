// lime.cu — LIMe (Layer-Integrated Memory, arXiv 2502.09245) beside its LLaMa
// baseline: the model, the forward and backward of every op, and AdamW.
// LLaMa is LIMe without routers. In LIMe, layer l >= 1 attends not with its
// own keys and values but with a learned mixture of every buffered layer's
// (Eq. 2), one router W[l] (R, (l+1)R) for both:
//   Kr[t, r] = sum_{l' <= l, r'} W[l][r, l'*R + r'] * K[l'][t, r']    (Vr alike)
// `routed = has_router(c, l)` in forward_pass and backward_pass is where the two differ.
// Names: X the plain CPU loop, X_fast its fast CPU version (support/model/
// cpu_fast.cpp), X_gpu the CUDA launcher, op_X the dispatcher that picks one
// (DISPATCH); arguments are outputs, inputs, weights, sizes.
// Sections: config and parameters; activations; where the ops run; the ops
// (matrix products, embedding, RMSNorm, RoPE, the KV router, attention,
// SwiGLU, cross-entropy, AdamW); the residual stream (the study's hooks);
// forward_pass, backward_pass, update_pass; the public calls (lime.h).
// Includes: below, each with what it defines. Shapes: B batch, T positions,
// V vocabulary, L layers, d width, H query heads, R kv heads, hd = d / H,
// F SwiGLU width, N = B*T (docs/model.md). The study's other models and
// instruments live in support/study/: LLaMa and LIMe need none of them.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "support/lib/rng.h"             // defines: Rng, seed_for (each tensor's own random stream)
#include "support/model/lime.h"          // defines: Config, Params, Model, the public calls
#include "support/model/cpu_fast.h"      // defines: the fast CPU versions X_fast, exp_fast
#include "support/model/device.cuh"      // defines: DISPATCH, cudaCheck, warp_sum, block_sum, GpuState, op_copy
#include "support/model/memory_check.h"  // defines: memory_fix, launch_check (what a shape needs, refused early)
#include "support/model/products.cuh"    // defines: bf16_if, gemm_gpu, DISPATCH_PRODUCT (--precision bf16's products)
#include "support/model/split_k.cuh"     // defines: split_weight_grad_gpu, op_split_sum (the GPU's weight gradients)
#include "support/model/attention_gpu.cuh"    // defines: attention_forward_gpu, ..._backward_gpu, qkv_projection_*_gpu
#include "support/model/flash_attention.cuh"  // defines: flash_attention_forward_gpu, ..._backward_gpu (O(T) memory)
#include "support/model/flash_attention_tc.cuh"  // defines: flash_attention_tc_forward_gpu, flash_on_tensor_cores
#include "support/model/models.h"  // defines: the registry of models, StudyHooks (the study models' interface)
#include "support/study/registry.cuh"  // defines: the study's models and loss terms, their hooks, model_registry

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
//            layers 0..l. Nothing is learned (docs/model.md: why this reading).
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
// same-head (the cross-head ablation): only the weights that mix kv head r
// into head r are learned; the others are 0 from model_init and stay 0.
RouterSpan router_learned(const Config& c, int l) {
    if (c.router == ROUTER_AVERAGE || c.router_frozen) return RouterSpan{0, l + 1};  // none
    RouterSpan s = router_sources(c, l);
    s.same_head = c.router_same_head;
    return s;
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
        if (study_hooks(c)) study_hooks(c)->specs(c, l, p, add);  // a study model's own, after LLaMa's
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
        if (study_hooks(c)) study_hooks(c)->carve(c, l, &p, next);  // as param_specs
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
    // forward, kept for backward (with a study model of n streams the residual stream is n streams:
    // x, xa and dx are n times wider, (.., n, B, T, d) stream-major)
    float* x;        // (L+1, B, T, d) residual stream entering layer l; x[L] enters the final norm
    float* xa;       // (L, B, T, d)   residual stream after attention
    float* attn_in;  // (L, B, T, d)   rmsnorm(x) entering attention
    float* rstd_a;   // (L, B, T)
    float* q;        // (L, B, T, H, hd) queries after RoPE
    float* Kbuf;     // (L, R, B, T, hd) the KV buffer, head-major (a row of B*T*hd per layer, kv head): keys
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
    BatchArrays batch; // (B, T) each: copies of the batch's tokens, targets, mask and valid (device.cuh)
    // backward scratch
    float* dx;       // (B, T, d) gradient of the residual stream
    float* dnorm;    // (B, T, d) gradient of a norm's output
    float* dq;       // (B, T, H, hd)
    float* dkr;      // (R, B, T, hd)
    float* dvr;      // (R, B, T, hd); also token-major (B, T, R*hd): the regulariser's dV
    float* dKbuf;    // (L, R, B, T, hd) gradient of the KV buffer, filled by layers >= l
    float* dVbuf;    // (L, R, B, T, hd)
    float* dout;     // (B, T, H*hd) gradient of the attention output
    float* dgate;    // (B, T, F); on the GPU the first half of each (B, T, 2F) row of [dgate | dup]
    float* dup;      // (B, T, F); on the GPU the second half
    float* dh;       // (B, T, F)
    float* datt;     // (B, H, T, T) GPU attention scratch (empty on the CPU)
    float* scratch;  // one op at a time: the CPU's partial sums and buffers (cpu_scratch_floats); the GPU's
                     // head-major q, out/dout and dq (3, B, T, H*hd), partial sums, flash attention's D (B, H, T)
    size_t scratch_floats;  // its size, in floats
    int threads;            // CPU: the threads the fast attention's scratch has buffers for
    float* rope_cos; // (T, hd/2) the RoPE tables, one array: cos, then
    float* rope_sin; // (T, hd/2)     sin
    float* study;    // the study model's activations, as its file carves them (StudyHooks::acts_floats)
    float* loss;     // the loss term's (the regulariser's)
    const float* final_in;  // what the final norm read in the last forward (x[L], or the study model's final_input)
};

// The scratch, in floats, of the op that needs the most (one op runs at a
// time), on the CPU for `threads` threads and on the GPU.
static size_t router_gpu_scratch_floats(const Config& c, size_t BT);
// The study model's and the loss term's scratch (StudyHooks::scratch_floats), the larger.
static size_t study_scratch_floats(const Config& c, int B, Device dev) {
    const StudyHooks *h = study_hooks(c), *t = loss_hooks(c);
    return std::max(h ? h->scratch_floats(c, B, dev) : 0, t ? t->scratch_floats(c, B, dev) : 0);
}
static size_t cpu_scratch_floats(const Config& c, int B, int threads) {
    size_t study = study_scratch_floats(c, B, DEVICE_CPU);
    size_t most = std::max(CHUNKS * (size_t)c.d, study);  // rmsnorm_backward's gain slices, the study's models' ops
    if (!FAST_CPU) return most;
    size_t d = c.d, qd = (size_t)c.H * c.hd, kvd = (size_t)c.R * c.hd, F = c.F, V = c.V;
    const std::pair<size_t, size_t> products[] = {{d, qd}, {d, kvd}, {qd, d}, {d, F}, {F, d}, {d, V}};
    for (auto [C, OC] : products) most = std::max(most, matmul_fast_scratch_floats(C, OC));  // W^T, packed
    size_t router = c.arch == ARCH_LIME ? router_fast_scratch_floats(c.L, c.R, (size_t)B * c.T * c.hd) : 0;
    return std::max({most, attention_fast_scratch_floats(c.T, c.hd, threads), router});
}
static size_t gpu_scratch_floats(const Config& c, int B) {
    size_t BT = (size_t)B * c.T, study = study_scratch_floats(c, B, DEVICE_GPU);
    // 3 BT H hd: the q/k/v product (BT, (H + 2R) hd), R <= H; attention's group-major out or dout (BT, H hd)
    return std::max({3 * BT * c.H * c.hd, router_gpu_scratch_floats(c, BT), study});
}

// Carves (or, with base == nullptr, only measures) the activations; only the scratch differs between devices.
static size_t acts_carve(Acts* A, const Config& c, int B, float* base, Device dev = DEVICE_CPU, bool flash = false) {
    size_t BT = (size_t)B * c.T, L = c.L, d = c.d, qd = (size_t)c.H * c.hd, kvd = (size_t)c.R * c.hd;
    size_t streams = stream_count(c), off = 0;
    auto take = [&](auto** p, size_t n) {
        if (base) *p = (std::remove_pointer_t<decltype(p)>)(base + off);
        off += (n + 15) & ~(size_t)15;
    };
    A->flash = flash = flash && dev == DEVICE_GPU;
    take(&A->x, (L + 1) * streams * BT * d);
    take(&A->xa, L * streams * BT * d);
    take(&A->attn_in, L * BT * d);
    take(&A->rstd_a, L * BT);
    take(&A->q, L * BT * qd);
    take(&A->Kbuf, L * BT * kvd), take(&A->Vbuf, L * BT * kvd);
    take(&A->kr, L * BT * kvd), take(&A->vr, L * BT * kvd);
    take(&A->att, L * BT * c.H * (flash ? 1 : c.T));
    take(&A->o, L * BT * qd);
    take(&A->mlp_in, L * BT * d);
    take(&A->rstd_m, L * BT);
    take(&A->gate, L * BT * c.F), take(&A->up, L * BT * c.F);  // a fixed distance apart (gate_up_forward_gpu)
    take(&A->h, L * BT * c.F);
    take(&A->hf, BT * d);
    take(&A->rstd_f, BT);
    take(&A->logits, BT * c.V), take(&A->probs, BT * c.V);
    take(&A->nll, BT);
    take(&A->batch.targets, BT), take(&A->batch.mask, BT), take(&A->batch.tokens, BT), take(&A->batch.valid, BT);
    take(&A->dx, streams * BT * d);
    take(&A->dnorm, BT * d);
    take(&A->dq, BT * qd);
    take(&A->dkr, BT * kvd), take(&A->dvr, BT * kvd);
    take(&A->dKbuf, L * BT * kvd), take(&A->dVbuf, L * BT * kvd);
    take(&A->dout, BT * qd);
    take(&A->dgate, 2 * BT * c.F);  // and dup: after it, or on the GPU beside it (op_gate_up_backward)
    if (base) A->dup = A->dgate + (dev == DEVICE_GPU ? c.F : BT * c.F);
    take(&A->dh, BT * c.F);
    take(&A->datt, dev == DEVICE_GPU && !flash ? BT * c.H * c.T : 0);  // the GPU's matrix-product attention
    A->threads = cpu_threads();
    A->scratch_floats = dev == DEVICE_GPU ? gpu_scratch_floats(c, B) : cpu_scratch_floats(c, B, A->threads);
    take(&A->scratch, A->scratch_floats);
    take(&A->study, study_hooks(c) ? study_hooks(c)->acts_floats(c, B) : 0);  // the study model's, its file carves them
    take(&A->loss, loss_hooks(c) ? loss_hooks(c)->acts_floats(c, B) : 0);
    take(&A->rope_cos, (size_t)c.T * c.hd);  // last (tests poison all before it); sin: its second half
    if (base) A->rope_sin = A->rope_cos + (size_t)c.T * c.hd / 2;
    return off;
}

// ===========================================================================
// Where the ops run: support/model/device.cuh. Each op below has a plain CPU
// loop X, in ./lime often a fast version X_fast (support/model/cpu_fast.cpp),
// in a GPU build a kernel and its launcher X_gpu; its dispatcher op_X(model,
// ...) runs the one that fits the model's device (DISPATCH is that one `if`).
// Sums never depend on the threads, the vector width or the blocks (device.cuh says how).
// ===========================================================================
// Matrix products, named by their math. Row-major; C (M, N) (+)= ... :
//   gemm_nn   C = A @ B      A (M, K), B (K, N)
//   gemm_nt   C = A @ B^T    A (M, K), B (N, K)
//   gemm_tn   C += A^T @ B   A (K, M), B (K, N)   (always added to)
// accumulate: C gets the product added, else written. Every projection of
// the model is one: the linear layer out = inp @ W^T is gemm_nt, its backward
// gemm_nn (dinp = dout @ W) and gemm_tn (dW += dout^T @ inp); the router's
// mixture is gemm_nn. On the GPU cuBLAS (gemm_nn_gpu, ..., support/model/
// products.cuh); the fast CPU path blocks them. bf16: the operands rounded to
// bf16 as they are read (--precision bf16's dense products), float32 sums.
// ===========================================================================

static void gemm_nn(float* C, const float* A, const float* B, int M, int N, int K, bool accumulate, bool bf16 = false) {
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float s = 0;
            for (int k = 0; k < K; k++) s += bf16_if(A[(size_t)m * K + k], bf16) * bf16_if(B[(size_t)k * N + n], bf16);
            float* c = C + (size_t)m * N + n;
            *c = accumulate ? *c + s : s;
        }
}
static void gemm_nt(float* C, const float* A, const float* B, int M, int N, int K, bool accumulate, bool bf16 = false) {
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float s = 0;
            for (int k = 0; k < K; k++) s += bf16_if(A[(size_t)m * K + k], bf16) * bf16_if(B[(size_t)n * K + k], bf16);
            float* c = C + (size_t)m * N + n;
            *c = accumulate ? *c + s : s;
        }
}
static void gemm_tn(float* C, const float* A, const float* B, int M, int N, int K, bool bf16 = false) {
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++)  // row m of C: the rows of B, weighted by column m of A
        for (int k = 0; k < K; k++) {
            float a = bf16_if(A[(size_t)k * M + m], bf16);
            for (int n = 0; n < N; n++) C[(size_t)m * N + n] += a * bf16_if(B[(size_t)k * N + n], bf16);
        }
}

// --- the linear layer: out (N, OC) (+)= inp (N, C) @ W^T, W (OC, C) ----------
static void matmul_forward(float* out, const float* inp, const float* W, int N, int C, int OC, bool accumulate,
                           bool bf16 = false) {
    gemm_nt(out, inp, W, N, OC, C, accumulate, bf16);
}
// forward: out = inp @ W^T
// dinp (N, C) (+)= dout (N, OC) @ W;  dW (OC, C) += dout^T @ inp   (either may be nullptr: not wanted)
// add_dinp: dinp gets the product added, else written (the first of the
// products that make a gradient: no zero-fill before it).
static void matmul_backward(float* dinp, float* dW, const float* dout, const float* inp, const float* W, int N, int C,
                            int OC, bool add_dinp, bool bf16 = false) {
    if (dinp) gemm_nn(dinp, dout, W, N, C, OC, add_dinp, bf16);
    if (dW) gemm_tn(dW, dout, inp, OC, C, N, bf16);
}
#ifdef LIME_GPU
static void matmul_forward_gpu(float* out, const float* inp, const float* W, int N, int C, int OC, bool accumulate,
                               const GpuCtx& g) {
    gemm_nt_gpu(out, inp, W, N, OC, C, accumulate, g.blas, g.bf16);
}
static void matmul_backward_gpu(float* dinp, float* dW, const float* dout, const float* inp, const float* W, int N,
                                int C, int OC, bool add_dinp, const GpuCtx& g) {
    if (dinp) gemm_nn_gpu(dinp, dout, W, N, C, OC, add_dinp, g.blas, g.bf16);
    if (dW && !split_weight_grad_gpu(dW, dout, inp, OC, C, N, *g.split, g.blas, g.bf16))
        gemm_tn_gpu(dW, dout, inp, OC, C, N, g.blas, g.bf16);
}
#endif
// The fast versions (matmul_forward_fast, matmul_backward_fast) are the same
// products blocked; scratch: the forward's packed panels. bf: --precision bf16.
static void op_matmul_forward(Model* model, float* out, const float* inp, const float* W, int N, int C, int OC,
                              bool accumulate = false) {
    bool bf = bf16_products(model);
    DISPATCH_PRODUCT(model, matmul_forward_gpu(out, inp, W, N, C, OC, accumulate, gpu_of(model)),
                     matmul_forward_fast(out, inp, W, N, C, OC, accumulate, pass_acts(model)->scratch),
                     matmul_forward(out, inp, W, N, C, OC, accumulate, bf));
}
static void op_matmul_backward(Model* model, float* dinp, float* dW, const float* dout, const float* inp,
                               const float* W, int N, int C, int OC, bool add_dinp) {
    bool bf = bf16_products(model);
    DISPATCH_PRODUCT(
        model, matmul_backward_gpu(dinp, dW, dout, inp, W, N, C, OC, add_dinp, gpu_of(model)),
        matmul_backward_fast(dinp, dW, dout, inp, W, N, C, OC, add_dinp),
        matmul_backward(dinp, dW, dout, inp, W, N, C, OC, add_dinp, bf));
}

// The SwiGLU's two inputs from m (N, d): gate = m @ Wg^T, up = m @ Wu^T (N, F), Wg and
// Wu one after another in the parameters (param_specs): [Wg; Wu] (2F, d). On the
// GPU the forward is one strided-batched call (gate and up lie a fixed distance
// apart, as Wg and Wu do), and the backward the linear layer's over [Wg; Wu]:
// there dgate and dup are the halves of one (N, 2F) array's rows (acts_carve).
#ifdef LIME_GPU
static void gate_up_forward_gpu(float* gate, float* up, const float* m, const float* Wg, int N, int d, int F,
                                cublasHandle_t blas, bool bf16 = false) {
    // as gemm_nt_gpu, batched over (Wg, gate), (Wu, up)
    gemm_gpu(blas, bf16, CUBLAS_OP_T, CUBLAS_OP_N, F, N, d, 1.0f, Wg, d, (long long)F * d, m, d, 0, 0.0f, gate, F,
             up - gate, 2);
}
#endif
static void op_gate_up_forward(Model* model, float* gate, float* up, const float* m, const float* Wg, int N) {
    int d = model->c.d, F = model->c.F;
    float *Wu = (float*)Wg + (size_t)F * d, *scratch = pass_acts(model)->scratch;
    bool bf = bf16_products(model);
    DISPATCH_PRODUCT(model, gate_up_forward_gpu(gate, up, m, Wg, N, d, F, blas_of(model), bf),
                     (matmul_forward_fast(gate, m, Wg, N, d, F, false, scratch),
                      matmul_forward_fast(up, m, Wu, N, d, F, false, scratch)),
                     (matmul_forward(gate, m, Wg, N, d, F, false, bf), matmul_forward(up, m, Wu, N, d, F, false, bf)));
}
// forward: gate = m Wg^T, up = m Wu^T
// dm (N, d) = dgate @ Wg + dup @ Wu;  dWg, dWu += dgate^T @ m, dup^T @ m (the GPU: [dgate | dup] (N, 2F), [Wg; Wu])
static void op_gate_up_backward(Model* model, float* dm, float* dWg, const float* dgate, const float* dup,
                                const float* m, const float* Wg, int N) {
    int d = model->c.d, F = model->c.F;
    const float* Wu = Wg + (size_t)F * d;
    float* dWu = dWg + (size_t)F * d;
    bool bf = bf16_products(model);
    DISPATCH_PRODUCT(
        model, matmul_backward_gpu(dm, dWg, dgate, m, Wg, N, d, 2 * F, false, gpu_of(model)),
        (matmul_backward_fast(dm, dWg, dgate, m, Wg, N, d, F, false),
         matmul_backward_fast(dm, dWu, dup, m, Wu, N, d, F, true)),
        (matmul_backward(dm, dWg, dgate, m, Wg, N, d, F, false, bf),
         matmul_backward(dm, dWu, dup, m, Wu, N, d, F, true, bf)));
}

// ---------------------------------------------------------------------------
// The K and V projections: the same product, out = inp @ W^T, written straight
// into the head-major KV buffer, each kv head r's hd columns as its own rows:
// out (R, N, hd), out[r, n, i] = sum_c inp[n, c] W[r*hd + i, c], W (R*hd, C).
// ---------------------------------------------------------------------------

// Where column o of position n's product lies in (R, N, hd): head o / hd, its element o % hd.
static size_t kv_at(int n, int o, int N, int hd) { return ((size_t)(o / hd) * N + n) * hd + o % hd; }

static void kv_projection_forward(float* out, const float* inp, const float* W, int N, int C, int R, int hd,
                                  bool bf16 = false) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int o = 0; o < R * hd; o++) {
            float s = 0;
            for (int i = 0; i < C; i++)
                s += bf16_if(inp[(size_t)n * C + i], bf16) * bf16_if(W[(size_t)o * C + i], bf16);
            out[kv_at(n, o, N, hd)] = s;
        }
}

// forward: out[r, n, i] = inp[n] . W[r*hd + i]
// dinp (N, C) += sum over (r, i) of dout[r, n, i] W[r*hd + i];  dW (R*hd, C) += sum over n of dout[r, n, i] inp[n]
static void kv_projection_backward(float* dinp, float* dW, const float* dout, const float* inp, const float* W, int N,
                                   int C, int R, int hd, bool bf16 = false) {
    auto g = [&](int n, int o) { return bf16_if(dout[kv_at(n, o, N, hd)], bf16); };
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int i = 0; i < C; i++) {
            float s = 0;
            for (int o = 0; o < R * hd; o++) s += g(n, o) * bf16_if(W[(size_t)o * C + i], bf16);
            dinp[(size_t)n * C + i] += s;
        }
#pragma omp parallel for schedule(static)
    for (int o = 0; o < R * hd; o++)
        for (int n = 0; n < N; n++)
            for (int i = 0; i < C; i++) dW[(size_t)o * C + i] += g(n, o) * bf16_if(inp[(size_t)n * C + i], bf16);
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
    int idx = blockIdx.x * blockDim.x + threadIdx.x;  // one thread per output float (32-bit: see launch_check)
    if (idx >= N * d) return;
    out[idx] = E[tokens[idx / d] * d + idx % d];
}
static void embedding_forward_gpu(float* out, const int* tokens, const float* E, int N, int d, cudaStream_t stream) {
    LAUNCH(embedding_forward_kernel, ceil_div((size_t)N * d, 256), 256, 0, stream)(out, tokens, E, N, d);
    launchCheck();
}

// Deterministic without atomics: block (group of EMBED_TOKENS ids, column slice, chunk of
// positions) holds its ids' rows of the slice in shared memory, a thread a column, and walks
// its chunk's positions in order, adding the rows whose token is in the group. With one chunk
// it adds to dE in the CPU's order; with more, chunk c writes partial (chunks, V, d)[c] and
// one thread per float then adds the chunks in order.
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
             embedding_backward_gpu(dE, dout, tokens, N, d, model->c.V, A->scratch, A->scratch_floats,
                                    stream_of(model)),
             embedding_backward(dE, dout, tokens, N, d));
}

// ===========================================================================
// ===========================================================================
// RMSNorm: y_i = x_i * rstd * g_i,  rstd = 1 / sqrt(mean_j x_j^2 + eps)
// ===========================================================================

// copy (N, d), when not nullptr, gets inp as well: where the sublayer's output will be added (residual_start).
static void rmsnorm_forward(float* out, float* rstd, float* copy, const float* inp, const float* g, int N, int d,
                            float eps) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * d;
        float* y = out + (size_t)n * d;
        float ss = 0;
#pragma omp simd reduction(+ : ss)
        for (int i = 0; i < d; i++) ss += x[i] * x[i];
        float r = 1.0f / sqrtf(ss / d + eps);
        for (int i = 0; i < d; i++) y[i] = x[i] * r * g[i];
        if (copy) memcpy(copy + (size_t)n * d, x, d * sizeof(float));
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
__global__ void rmsnorm_forward_kernel(float* out, float* rstd, float* copy, const float* inp, const float* g, int N,
                                       int d, float eps) {
    int lane = threadIdx.x % 32, n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (n >= N) return;  // the whole warp leaves together
    const float* x = inp + (size_t)n * d;
    float* y = out + (size_t)n * d;
    float ss = 0;
    for (int i = lane; i < d; i += 32) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(warp_sum(ss) / d + eps);
    for (int i = lane; i < d; i += 32) y[i] = x[i] * r * g[i];
    if (copy) for (int i = lane; i < d; i += 32) copy[(size_t)n * d + i] = x[i];
    if (lane == 0) rstd[n] = r;
}
static void rmsnorm_forward_gpu(float* out, float* rstd, float* copy, const float* inp, const float* g, int N, int d,
                                float eps, cudaStream_t stream) {
    const int warps = 4;  // rows per block
    LAUNCH(rmsnorm_forward_kernel, ceil_div(N, warps), 32 * warps, 0, stream)(out, rstd, copy, inp, g, N, d, eps);
    launchCheck();
}

// One kernel, block = GAIN_ROWS rows (a chunk): its warps take the rows' dx,
// one warp per row as the forward; then its threads take d's columns, each
// summing dy * x * rstd over the chunk's rows in order into partial[chunk].
// The block that finishes last (a count in done, reset to 0 after) adds the
// chunks into dg in a fixed order, 32 columns at a time: warp y of GAIN_WARPS
// sums chunks y, y + GAIN_WARPS, ... in order, then a fixed tree over the warps.
#define GAIN_ROWS 32
#define GAIN_WARPS 8
__global__ void rmsnorm_backward_kernel(float* dinp, float* dg, float* partial, unsigned* done, const float* dout,
                                        const float* inp, const float* g, const float* rstd, int N, int d) {
    int lane = threadIdx.x % 32, warps = blockDim.x / 32, from = blockIdx.x * GAIN_ROWS, to = min(N, from + GAIN_ROWS);
    for (int n = from + threadIdx.x / 32; n < to; n += warps) {
        const float* x = inp + (size_t)n * d;
        const float* dy = dout + (size_t)n * d;
        float* dx = dinp + (size_t)n * d;
        float r = rstd[n], dot = 0;
        for (int i = lane; i < d; i += 32) dot += g[i] * dy[i] * x[i];
        float c = r * r * r * warp_sum(dot) / d;
        for (int i = lane; i < d; i += 32) dx[i] += r * g[i] * dy[i] - x[i] * c;
    }
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float s = 0;
        for (int n = from; n < to; n++) s += dout[(size_t)n * d + i] * inp[(size_t)n * d + i] * rstd[n];
        partial[(size_t)blockIdx.x * d + i] = s;
    }
    if (!last_block_done(done)) return;  // blockDim.x = 32 * GAIN_WARPS
    column_sums_tree<GAIN_WARPS>(partial, gridDim.x, d, [&](size_t i, float sum) { dg[i] += sum; });
}
// The gain's partial sums, ceil(N / GAIN_ROWS) * d floats, and the count of finished blocks (0, and 0 again after).
struct GainSums {
    float* partial;
    unsigned* done;
};
static void rmsnorm_backward_gpu(float* dinp, float* dg, const float* dout, const float* inp, const float* g,
                                 const float* rstd, int N, int d, GainSums sums, cudaStream_t stream) {
    LAUNCH(rmsnorm_backward_kernel, ceil_div(N, GAIN_ROWS), 32 * GAIN_WARPS, 0, stream)
        (dinp, dg, sums.partial, sums.done, dout, inp, g, rstd, N, d);
    launchCheck();
}
#endif

static void op_rmsnorm_forward(Model* model, float* out, float* rstd, const float* inp, const float* g, int N,
                               float* copy = nullptr) {
    int d = model->c.d;
    float eps = model->c.eps;
    DISPATCH(model, rmsnorm_forward_gpu(out, rstd, copy, inp, g, N, d, eps, stream_of(model)),
             rmsnorm_forward_fast(out, rstd, copy, inp, g, N, d, eps),
             rmsnorm_forward(out, rstd, copy, inp, g, N, d, eps));
}
static void op_rmsnorm_backward(Model* model, float* dinp, float* dg, const float* dout, const float* inp,
                                const float* g, const float* rstd, int N) {
    int d = model->c.d;
    float* scratch = pass_acts(model)->scratch;  // the gain's partial sums
    DISPATCH(model,
             rmsnorm_backward_gpu(dinp, dg, dout, inp, g, rstd, N, d, {scratch, model->gpu->done}, stream_of(model)),
             rmsnorm_backward_fast(dinp, dg, dout, inp, g, rstd, N, d, scratch),
             rmsnorm_backward(dinp, dg, dout, inp, g, rstd, N, d, scratch));
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

// out (B, T, nh, hd) = x rotated (out may be x), or out += it (add); sign = +1 forward, -1 backward.
// The rotation is orthogonal, so its backward is the rotation by -angle.
static void rope_rotate(float* out, const float* x, const float* cos_t, const float* sin_t, int B, int T, int nh,
                        int hd, float sign, bool add = false) {
    int half = hd / 2;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float* cs = cos_t + t * half;
            const float* sn = sin_t + t * half;
            for (int h = 0; h < nh; h++) {
                size_t row = (((size_t)b * T + t) * nh + h) * hd;
                for (int i = 0; i < half; i++) {
                    float x0 = x[row + i], x1 = x[row + i + half], s = sign * sn[i];
                    float y0 = x0 * cs[i] - x1 * s, y1 = x1 * cs[i] + x0 * s;
                    out[row + i] = add ? out[row + i] + y0 : y0;
                    out[row + i + half] = add ? out[row + i + half] + y1 : y1;
                }
            }
        }
}

static void rope_forward(float* out, const float* x, const float* cos_t, const float* sin_t, int B, int T, int nh,
                         int hd) {
    rope_rotate(out, x, cos_t, sin_t, B, T, nh, hd, 1.0f);
}
// forward: y = Rot(t) x;  dx (+)= Rot(t)^T dy = Rot(-t) dy (dx may be dy)
static void rope_backward(float* dx, const float* dy, const float* cos_t, const float* sin_t, int B, int T, int nh,
                          int hd, bool add) {
    rope_rotate(dx, dy, cos_t, sin_t, B, T, nh, hd, -1.0f, add);
}

#ifdef LIME_GPU
// One thread per rotated pair (b, t, h, i < hd/2); cos_t, sin_t live on the device.
__global__ void rope_rotate_kernel(float* out, const float* x, const float* cos_t, const float* sin_t, int B, int T,
                                   int nh, int hd, float sign, int add) {
    int half = hd / 2, idx = blockIdx.x * blockDim.x + threadIdx.x;  // 32-bit: see launch_check
    if (idx >= B * T * nh * half) return;
    int i = idx % half, row = idx / half;  // row = (b * T + t) * nh + h
    int t = row / nh % T;
    float c = cos_t[t * half + i], s = sign * sin_t[t * half + i];
    float x0 = x[row * hd + i], x1 = x[row * hd + i + half], y0 = x0 * c - x1 * s, y1 = x1 * c + x0 * s;
    out[row * hd + i] = add ? out[row * hd + i] + y0 : y0;
    out[row * hd + i + half] = add ? out[row * hd + i + half] + y1 : y1;
}
static void rope_forward_gpu(float* out, const float* x, const float* cos_t, const float* sin_t, int B, int T, int nh,
                             int hd, cudaStream_t stream) {
    LAUNCH(rope_rotate_kernel, ceil_div((size_t)B * T * nh * (hd / 2), 256), 256, 0, stream)
        (out, x, cos_t, sin_t, B, T, nh, hd, 1.0f, 0);
    launchCheck();
}
static void rope_backward_gpu(float* dx, const float* dy, const float* cos_t, const float* sin_t, int B, int T, int nh,
                              int hd, bool add, cudaStream_t stream) {
    LAUNCH(rope_rotate_kernel, ceil_div((size_t)B * T * nh * (hd / 2), 256), 256, 0, stream)
        (dx, dy, cos_t, sin_t, B, T, nh, hd, -1.0f, add);
    launchCheck();
}
#endif

// out = rope(x) (out may be x), dx (+)= rope's backward of dy, (B, T, nh, hd), with the tables in the model's
// activations. The fast version is rope_rotate_fast (support/model/cpu_fast.cpp): the same loop, vectorised.
static void op_rope_forward(Model* model, float* out, const float* x, int B, int T, int nh) {
    const Acts* A = pass_acts(model);
    int hd = model->c.hd;
    DISPATCH(model, rope_forward_gpu(out, x, A->rope_cos, A->rope_sin, B, T, nh, hd, stream_of(model)),
             rope_rotate_fast(out, x, A->rope_cos, A->rope_sin, B, T, nh, hd, 1.0f),
             rope_forward(out, x, A->rope_cos, A->rope_sin, B, T, nh, hd));
}
static void op_rope_backward(Model* model, float* dx, const float* dy, int B, int T, int nh, bool add) {
    const Acts* A = pass_acts(model);
    int hd = model->c.hd;
    DISPATCH(model, rope_backward_gpu(dx, dy, A->rope_cos, A->rope_sin, B, T, nh, hd, add, stream_of(model)),
             rope_rotate_fast(dx, dy, A->rope_cos, A->rope_sin, B, T, nh, hd, -1.0f, add),
             rope_backward(dx, dy, A->rope_cos, A->rope_sin, B, T, nh, hd, add));
}

// ---------------------------------------------------------------------------
// The attention's inputs, from a = rmsnorm(x) (N, C), C = d:
//   q    (B, T, H, hd) = rope(a @ Wq^T)
//   K, V (R, B, T, hd) = the heads of a @ Wk^T and a @ Wv^T, into the KV buffer
//   kr   (R, B, T, hd) = rope(K), when asked for (a layer that reads its own keys)
// In LLaMa and LIMe the three products read one array a (in.q == in.k == in.v);
// a study model may give the keys and values their own (ak, av: study.h's
// kv_inputs), and then their gradients go to three arrays.
// Wq, Wk, Wv lie one after another in the parameters (param_specs): W = [Wq; Wk; Wv]
// ((H + 2R) hd, C). On the CPU they are the ops above, one by one; on the GPU one
// product into token-major scratch qkv (N, (H + 2R) hd) (three, into its column
// blocks, when the inputs differ) and one kernel that rotates q and scatters K
// and V (backward: one kernel that gathers, then the products for da and dW),
// so that a layer's projections are a few launches, not one per kv head. That
// kernel, qkv_scatter_gpu, and the GPU's versions qkv_projection_forward_gpu and
// ..._backward_gpu live with the attention's layouts (support/model/attention_gpu.cuh):
// for the matrix-product attention they write q (and read dq) group-major.
// ---------------------------------------------------------------------------
static void qkv_projection_forward(Qkv out, QkvInputs in, const float* W, Rope rope, Heads s, bool bf16 = false) {
    int N = s.N(), C = s.C, qd = s.H * s.hd, kvd = s.R * s.hd;
    matmul_forward(out.q, in.q, W, N, C, qd, false, bf16);
    kv_projection_forward(out.K, in.k, W + (size_t)qd * C, N, C, s.R, s.hd, bf16);
    kv_projection_forward(out.V, in.v, W + (size_t)(qd + kvd) * C, N, C, s.R, s.hd, bf16);
    rope_forward(out.q, out.q, rope.cos, rope.sin, s.B, s.T, s.H, s.hd);
    if (out.kr) rope_forward(out.kr, out.K, rope.cos, rope.sin, s.R * s.B, s.T, 1, s.hd);  // R*B sequences of one head
}
// Before K's and V's backward add into their input's gradient: zero it when
// it is an array of its own (not one the products before wrote).
static void zero_own_grad(float* da, const float* before1, const float* before2, size_t n) {
    if (da != before1 && da != before2) memset(da, 0, n * sizeof(float));
}
// forward: q = rope(a_q Wq^T), K and V the heads of a_k Wk^T and a_v Wv^T
// dq = rope's backward of dq (in place); da_q = dq @ Wq, da_k = dK @ Wk, da_v = dV @ Wv
// (written; one array: their sum); dW ([Wq; Wk; Wv]'s gradient) += [dq | dK | dV]^T @ [a_q | a_k | a_v].
// d: dq, dK, dV (d.kr unused)
static void qkv_projection_backward(QkvInputGrads da, float* dW, Qkv d, QkvInputs in, const float* W, Rope rope,
                                    Heads s, bool bf16 = false) {
    int N = s.N(), C = s.C, qd = s.H * s.hd, kvd = s.R * s.hd;
    rope_backward(d.q, d.q, rope.cos, rope.sin, s.B, s.T, s.H, s.hd, false);
    matmul_backward(da.q, dW, d.q, in.q, W, N, C, qd, false, bf16);  // then K's and V's add
    zero_own_grad(da.k, da.q, da.q, (size_t)N * C);
    kv_projection_backward(da.k, dW + (size_t)qd * C, d.K, in.k, W + (size_t)qd * C, N, C, s.R, s.hd, bf16);
    zero_own_grad(da.v, da.q, da.k, (size_t)N * C);
    kv_projection_backward(da.v, dW + (size_t)(qd + kvd) * C, d.V, in.v, W + (size_t)(qd + kvd) * C, N, C, s.R, s.hd,
                           bf16);
}
// The fast versions (qkv_projection_forward_fast, ..._backward_fast) are the same steps blocked.
// On the GPU, q and dq are group-major for the matrix-product attention (!A->flash).
static void op_qkv_projection_forward(Model* model, Qkv out, QkvInputs in, const float* W, int B, int T) {
    const Acts* A = pass_acts(model);
    Rope rope{A->rope_cos, A->rope_sin};
    Heads s = heads_of(model, B, T);
    DISPATCH_PRODUCT(model, qkv_projection_forward_gpu(out, in, W, rope, s, !A->flash, A->scratch, gpu_of(model)),
                     qkv_projection_forward_fast(out, in, W, rope, s, A->scratch),
                     qkv_projection_forward(out, in, W, rope, s, bf16_products(model)));
}
static void op_qkv_projection_backward(Model* model, QkvInputGrads da, float* dW, Qkv d, QkvInputs in, const float* W,
                                       int B, int T) {
    const Acts* A = pass_acts(model);
    Rope rope{A->rope_cos, A->rope_sin};
    Heads s = heads_of(model, B, T);
    DISPATCH_PRODUCT(model,
                     qkv_projection_backward_gpu(da, dW, d, in, W, rope, s, !A->flash, A->scratch, gpu_of(model)),
                     qkv_projection_backward_fast(da, dW, d, in, W, rope, s),
                     qkv_projection_backward(da, dW, d, in, W, rope, s, bf16_products(model)));
}

// ===========================================================================
// The KV router (Eq. 2): layer l's keys and values are learned mixtures of the
// buffered keys and values of layers 0..l. The buffer is head-major: row
// j = l'*R + r' holds layer l', kv head r' at every position, row = N*hd
// floats, so Kbuf (L, R, N, hd) is an (L*R, row) matrix, and mixing one
// buffer is a matrix product over its first cols = (l+1)R rows:
//   out[r][e] = sum_{j < cols} W[r, j] * buf[j][e]      out (R, N, hd), W (R, cols), e = n*hd + i
// Eq. 2 applies it to the keys (Kr from Kbuf) and the values (Vr from Vbuf)
// with one W; with --router-kv separate the values have a W of their own.
// A variant (router_sources) only holds some weights fixed: `learned` says
// which source layers' columns get a gradient.
// ===========================================================================

// out (R, N, hd) = W (R, (l+1)R) @ buf[0 : (l+1)R];  buf (L, R, N, hd).
LAB_SWAPPABLE void router_forward(float* out, const float* W, const float* buf, int l, int N, int R, int hd) {
    int cols = (l + 1) * R;
    size_t row = (size_t)N * hd;  // floats of one buffer row: one layer's kv head at every position
#pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++)
        for (size_t e = 0; e < row; e++) {
            float s = 0;
            for (int j = 0; j < cols; j++) s += W[(size_t)r * cols + j] * buf[j * row + e];
            out[r * row + e] = s;
        }
}

// forward: out[r][e] = sum_j W[r, j] * buf[j][e]
// dW[r, j]  += sum_e dout[r][e] * buf[j][e]     (the learned weights only)
// dbuf[j][e] += sum_r W[r, j] * dout[r][e]      (every layer 0..l: how the gradient reaches earlier layers)
// Called for the keys, then the values: with one W for both (Eq. 2), dW gets both sums.
LAB_SWAPPABLE void router_backward(float* dW, float* dbuf, const float* dout, const float* W, const float* buf, int l,
                                   RouterSpan learned, int N, int R, int hd) {
    int cols = (l + 1) * R;
    size_t row = (size_t)N * hd;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++)
        for (int j = 0; j < cols; j++) {
            if (!learned.learns(r, j, R)) continue;
            float s = 0;
            for (size_t e = 0; e < row; e++) s += dout[r * row + e] * buf[j * row + e];
            dW[(size_t)r * cols + j] += s;
        }
#pragma omp parallel for schedule(static)
    for (int j = 0; j < cols; j++)
        for (int r = 0; r < R; r++)
            for (size_t e = 0; e < row; e++) dbuf[j * row + e] += W[(size_t)r * cols + j] * dout[r * row + e];
}

// The fast CPU versions, router_forward_fast and router_backward_fast
// (support/model/cpu_fast.cpp), run the same sums as the named products, keys
// and values together: out = W @ buf is gemm_nn, dW += dout @ buf^T gemm_nt,
// dbuf += W^T @ dout gemm_tn.

#define ROUTER_HEADS 16     // GPU: a thread's outputs, in registers
#define ROUTER_SLICE 1024   // GPU: elements e of a row per block of the weight gradient
#define ROUTER_SHARED 12288 // GPU: floats of shared memory the weight gradient may hold (48 KB)
#ifdef LIME_GPU
// On the GPU, two forms of the same sums: hand-written kernels that read each
// buffer row once (for the keys, blockIdx.y = 0, and the values, 1), or
// cuBLAS's products. model_create picks one by the byte model (support/model/cost.cpp):
// the kernels where they fit (dW's sums in shared memory), with fewer launches; cuBLAS otherwise.

// One thread per element e and group of ROUTER_HEADS heads (blockIdx.z): reads buf[j][e] of every row j
// once, adds W[r, j] times it into each of the group's sums.
__global__ void router_forward_kernel(KvPair out, KvConst W, KvConst buf, int cols, int R, size_t row) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    int r0 = blockIdx.z * ROUTER_HEADS, heads = min(ROUTER_HEADS, R - r0);
    if (e >= row) return;
    const float *w = blockIdx.y ? W.v : W.k, *b = blockIdx.y ? buf.v : buf.k;
    float* o = blockIdx.y ? out.v : out.k;
    float sum[ROUTER_HEADS] = {};
    for (int j = 0; j < cols; j++) {
        float x = b[j * row + e];
        for (int r = 0; r < ROUTER_HEADS; r++)
            if (r < heads) sum[r] += w[(r0 + r) * cols + j] * x;
    }
    for (int r = 0; r < heads; r++) o[(r0 + r) * row + e] = sum[r];
}
LAB_SWAPPABLE void router_forward_gpu(KvPair out, KvConst W, KvConst buf, int l, int N, int R, int hd,
                                      cudaStream_t stream) {
    size_t row = (size_t)N * hd;
    LAUNCH(router_forward_kernel, dim3(ceil_div(row, 256), 2, ceil_div(R, ROUTER_HEADS)), 256, 0, stream)
        (out, W, buf, (l + 1) * R, R, row);
    launchCheck();
}

// dbuf[j][e] += W[r, j] * dout[r][e], r in order (the plain loop's order): one thread per element e,
// ROUTER_HEADS of its R values of dout in registers at a time.
__global__ void router_backward_buf_kernel(KvPair dbuf, KvConst dout, KvConst W, int cols, int R, size_t row) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= row) return;
    const float *w = blockIdx.y ? W.v : W.k, *d = blockIdx.y ? dout.v : dout.k;
    float* db = blockIdx.y ? dbuf.v : dbuf.k;
    for (int r0 = 0; r0 < R; r0 += ROUTER_HEADS) {
        float dr[ROUTER_HEADS];
        for (int r = 0; r < ROUTER_HEADS; r++) dr[r] = r0 + r < R ? d[(r0 + r) * row + e] : 0.0f;
        for (int j = 0; j < cols; j++) {
            float s = db[j * row + e];
            for (int r = 0; r < ROUTER_HEADS; r++)
                if (r0 + r < R) s += w[(r0 + r) * cols + j] * dr[r];
            db[j * row + e] = s;
        }
    }
}
// dW's sums in two fixed-order steps, no atomics. Block (slice s, keys or values) holds all R x cols
// sums of its ROUTER_SLICE elements in shared memory; tile by tile of `width` elements it stages dout
// (R, width) and buf (cols, width), each row read once and padded to width + 1 floats (a warp's 32
// pairs' rows start in 32 banks: no conflict), and thread t adds the tile's dots of pairs t, t +
// blockDim.x, ... Then partial (slices, 2, R, cols)[s] = the sums, and one thread per weight adds the
// slices in order into the learned columns.
__global__ void router_weight_partial_kernel(float* partial, KvConst dout, KvConst buf, int cols, int R, size_t row,
                                             int width) {
    DYNAMIC_SHARED(float, smem);
    int pairs = R * cols, pitch = width + 1;  // pitch: a tile row's floats
    float *sums = smem, *dt = smem + pairs, *bt = dt + R * pitch;  // (R, cols), (R, pitch), (cols, pitch)
    const float *d = blockIdx.y ? dout.v : dout.k, *b = blockIdx.y ? buf.v : buf.k;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) sums[p] = 0.0f;
    size_t from = (size_t)blockIdx.x * ROUTER_SLICE, to = min(row, from + ROUTER_SLICE);
    for (size_t e0 = from; e0 < to; e0 += width) {
        int n = (int)min((size_t)width, to - e0);
        __syncthreads();  // the last tile's dots are done
        for (int x = threadIdx.x; x < (R + cols) * width; x += blockDim.x) {
            int k = x / width, i = x % width;
            float v = i < n ? (k < R ? d[k * row + e0 + i] : b[(k - R) * row + e0 + i]) : 0.0f;
            (k < R ? dt[k * pitch + i] : bt[(k - R) * pitch + i]) = v;
        }
        __syncthreads();
        for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
            int r = p / cols, j = p % cols;
            float s = 0;
            for (int i = 0; i < width; i++) s += dt[r * pitch + i] * bt[j * pitch + i];
            sums[p] += s;
        }
    }
    __syncthreads();
    for (int p = threadIdx.x; p < pairs; p += blockDim.x)
        partial[((size_t)blockIdx.x * 2 + blockIdx.y) * pairs + p] = sums[p];
}
__global__ void router_weight_reduce_kernel(KvPair dW, const float* partial, int slices, int cols, int R,
                                            RouterSpan learned) {
    int p = blockIdx.x * blockDim.x + threadIdx.x, pairs = R * cols, r = p / cols, j = p % cols, source = j / R;
    if (p >= pairs || (source >= learned.below && source < learned.from) || (learned.same_head && j % R != r))
        return;  // not learned.learns(r, j, R)
    float sk = 0, sv = 0;
    for (int s = 0; s < slices; s++) {
        sk += partial[((size_t)s * 2) * pairs + p];
        sv += partial[((size_t)s * 2 + 1) * pairs + p];
    }
    dW.k[p] += sk;  // one W: the same float, keys' sum first
    dW.v[p] += sv;
}
// The elements of a tile the weight gradient's shared memory allows (each row padded by one); 0: it does not fit.
static int router_tile_width(int cols, int R) {
    long room = ROUTER_SHARED - (long)R * cols;
    return room < 2 * (R + cols) ? 0 : (int)std::min<long>(32, room / (R + cols) - 1);
}
// Which router a launcher runs: layer l's, over N positions of R kv heads of hd, learning the columns `learned` says.
struct RouterAt {
    int l, N, R, hd;
    RouterSpan learned;
};
// partial: the scratch, router_gpu_scratch_floats.
static void router_backward_gpu(KvPair dW, KvPair dbuf, KvConst dout, KvConst W, KvConst buf, RouterAt at,
                                float* partial, cudaStream_t stream) {
    int l = at.l, N = at.N, R = at.R, hd = at.hd;
    RouterSpan learned = at.learned;
    int cols = (l + 1) * R, width = router_tile_width(cols, R), slices = (int)ceil_div((size_t)N * hd, ROUTER_SLICE);
    size_t row = (size_t)N * hd, shared = ((size_t)R * cols + (size_t)(R + cols) * (width + 1)) * sizeof(float);
    LAUNCH(router_backward_buf_kernel, dim3(ceil_div(row, 256), 2), 256, 0, stream)(dbuf, dout, W, cols, R, row);
    launchCheck();
    if (!learned.any(l)) return;  // frozen, average: no weight learns
    LAUNCH(router_weight_partial_kernel, dim3(slices, 2), 256, shared, stream)(partial, dout, buf, cols, R, row, width);
    launchCheck();
    LAUNCH(router_weight_reduce_kernel, ceil_div((size_t)R * cols, 256), 256, 0, stream)
        (dW, partial, slices, cols, R, learned);
    launchCheck();
}

// The cuBLAS form: the products above (gemm_nn_gpu, gemm_nt_gpu, gemm_tn_gpu) on blas's stream.
// G: scratch for a variant's weight gradient, 2 * R * (l+1)R floats.
static void router_forward_blas(KvPair out, KvConst W, KvConst buf, int l, int N, int R, int hd, cublasHandle_t blas) {
    int cols = (l + 1) * R, row = N * hd;
    gemm_nn_gpu(out.k, W.k, buf.k, R, row, cols, false, blas);
    gemm_nn_gpu(out.v, W.v, buf.v, R, row, cols, false, blas);
}
static void router_backward_blas(KvPair dW, KvPair dbuf, KvConst dout, KvConst W, KvConst buf, RouterAt at, float* G,
                                 cublasHandle_t blas) {
    int l = at.l, R = at.R, cols = (l + 1) * R, row = at.N * at.hd;
    RouterSpan learned = at.learned;
    cudaStream_t stream;
    cublasCheck(cublasGetStream(blas, &stream));
    if (learned.any(l)) {  // G (2, R, cols): the keys' sums, the values'; then the learned columns added
        gemm_nt_gpu(G, dout.k, buf.k, R, cols, row, false, blas);
        gemm_nt_gpu(G + (size_t)R * cols, dout.v, buf.v, R, cols, row, false, blas);
        LAUNCH(router_weight_reduce_kernel, ceil_div((size_t)R * cols, 256), 256, 0, stream)
            (dW, G, 1, cols, R, learned);
        launchCheck();
    }
    gemm_tn_gpu(dbuf.k, W.k, dout.k, cols, row, R, blas);
    gemm_tn_gpu(dbuf.v, W.v, dout.v, cols, row, R, blas);
}
#endif
// The GPU's scratch for the router: the kernels' partial sums, or cuBLAS's G.
static size_t router_gpu_scratch_floats(const Config& c, size_t BT) {
    size_t pairs = (size_t)c.R * c.L * c.R, slices = (BT * c.hd + ROUTER_SLICE - 1) / ROUTER_SLICE;
    return c.arch == ARCH_LIME ? slices * 2 * pairs : 0;
}
#ifdef LIME_GPU
// Whether the hand-written kernels take this model's router: the widest layer's weight gradient fits shared memory.
static bool router_kernels_fit(const Config& c) { return router_tile_width(c.L * c.R, c.R) > 0; }
#endif

// Keys and values: the model's layer l. The plain loops mix one buffer each.
static void op_router_forward(Model* model, KvPair out, KvConst W, KvConst buf, int l, int N) {
    int R = model->c.R, hd = model->c.hd;
    DISPATCH(model,
             model->gpu->router_blas ? router_forward_blas(out, W, buf, l, N, R, hd, blas_of(model))
                                     : router_forward_gpu(out, W, buf, l, N, R, hd, stream_of(model)),
             router_forward_fast(out, W, buf, l, N, R, hd),
             (router_forward(out.k, W.k, buf.k, l, N, R, hd), router_forward(out.v, W.v, buf.v, l, N, R, hd)));
}
static void op_router_backward(Model* model, KvPair dW, KvPair dbuf, KvConst dout, KvConst W, KvConst buf, int l,
                               int N) {
    int R = model->c.R, hd = model->c.hd;
    RouterSpan learned = router_learned(model->c, l);  // the variant's trainable columns
    float* scratch = pass_acts(model)->scratch;
    DISPATCH(model,
             model->gpu->router_blas
                 ? router_backward_blas(dW, dbuf, dout, W, buf, {l, N, R, hd, learned}, scratch, blas_of(model))
                 : router_backward_gpu(dW, dbuf, dout, W, buf, {l, N, R, hd, learned}, scratch, stream_of(model)),
             router_backward_fast(dW, dbuf, dout, W, buf, l, learned, N, R, hd, scratch),
             (router_backward(dW.k, dbuf.k, dout.k, W.k, buf.k, l, learned, N, R, hd),
              router_backward(dW.v, dbuf.v, dout.v, W.v, buf.v, l, learned, N, R, hd)));
}

// ===========================================================================
// Causal GQA attention. Query head h reads kv head r = h / (H / R):
//   s[h,t,u] = q[t,h] . k[u,r] / sqrt(hd)  (u <= t);  p = softmax_u(s)
//   o[t,h]   = sum_u p[h,t,u] * v[u,r]
// q, o (B, T, H, hd); k, v (R, B, T, hd), head-major (rows of the KV buffer);
// att (B, H, T, T) keeps p for backward. bf16: the products' operands rounded (bf16_if).
// ===========================================================================

static void attention_forward(float* out, float* att, const float* q, const float* k, const float* v, Heads s,
                              bool bf16 = false) {
    int B = s.B, T = s.T, H = s.H, hd = s.hd, n_rep = H / s.R;
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
                    for (int i = 0; i < hd; i++) s += bf16_if(qt[i], bf16) * bf16_if(ku[i], bf16);
                    p[u] = s * scale;
                    mx = std::max(mx, p[u]);
                }
                for (int u = 0; u <= t; u++) sum += p[u] = cpu_exp(p[u] - mx);
                for (int u = 0; u < T; u++) p[u] = u <= t ? p[u] / sum : 0.0f;
                float* o = out + (((size_t)b * T + t) * H + h) * hd;
                for (int i = 0; i < hd; i++) {
                    float s = 0;
                    for (int u = 0; u <= t; u++)
                        s += bf16_if(p[u], bf16) * bf16_if(v[(((size_t)r * B + b) * T + u) * hd + i], bf16);
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
                               const float* v, const float* att, Heads s, bool bf16 = false) {
    int B = s.B, T = s.T, H = s.H, R = s.R, hd = s.hd, n_rep = H / R;
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
                        for (int i = 0; i < hd; i++) s += bf16_if(dout[row + i], bf16) * bf16_if(vu[i], bf16);
                        return s;
                    };
                    float pdp = 0;
                    for (int u = 0; u <= t; u++) pdp += p[u] * dp(u);
                    for (int i = 0; i < hd; i++) dq[row + i] = 0;
                    for (int u = 0; u <= t; u++) {
                        size_t kv = (((size_t)r * B + b) * T + u) * hd;  // k, dk, v, dv at (r, b, u)
                        float ds = bf16_if(p[u] * (dp(u) - pdp), bf16), pu = bf16_if(p[u], bf16);
                        for (int i = 0; i < hd; i++) {
                            dq[row + i] += scale * ds * bf16_if(k[kv + i], bf16);
                            dk[kv + i] += scale * ds * bf16_if(q[row + i], bf16);
                            dv[kv + i] += pu * bf16_if(dout[row + i], bf16);
                        }
                    }
                }
}

// On the GPU: batched matrix products around a causal softmax kernel, as in
// llm.c (support/model/attention_gpu.cuh: attention_forward_gpu,
// attention_backward_gpu), or the flash-style kernels in O(T) memory
// (support/model/flash_attention.cuh), on the tensor cores where flash_on_tensor_cores says.

// The dispatchers. On the GPU, A->flash picks the flash-style kernels (att then holds each row's log-sum-exp), else
// the products around the stored softmax; on the CPU the fast loops (support/model/cpu_fast.cpp) in ./lime, the
// plain ones above in ./lime-ref, and in bf16 (bf: the products' operands rounded). out: the forward's output (the
// flash backward's dout . out). q and dq on the GPU: group-major for the products (op_qkv_projection_forward). The
// backward writes dq and dk, and dv too or adds to it (add_dv: the CPU's loops add, so the dispatcher clears for
// them what is to be written).
static void op_attention_forward(Model* model, float* out, float* att, const float* q, const float* k, const float* v,
                                 int B, int T) {
    const Config& c = model->c;
    const Acts* A = pass_acts(model);
    bool bf = bf16_products(model);
    DISPATCH_PRODUCT(model,
             !A->flash ? attention_forward_gpu(out, att, q, k, v, B, T, c.H, c.R, c.hd, A->scratch, blas_of(model),
                                               stream_of(model), bf)
             : flash_on_tensor_cores(model)
                 ? flash_attention_tc_forward_gpu(out, att, q, k, v, B, T, c.H, c.R, c.hd, stream_of(model), bf)
                 : flash_attention_forward_gpu(out, att, q, k, v, B, T, c.H, c.R, c.hd, stream_of(model)),
             attention_forward_fast(out, att, q, k, v, B, T, c.H, c.R, c.hd, A->scratch, A->threads),
             attention_forward(out, att, q, k, v, heads_of(model, B, T), bf));
}
static void op_attention_backward(Model* model, Qkv d, bool add_dv, const float* dout, const float* out, QkvIn in,
                                  const float* att, int B, int T) {
    const Config& c = model->c;
    float *dq = d.q, *dk = d.K, *dv = d.V;
    const float *q = in.q, *k = in.k, *v = in.v;
    const Acts* A = pass_acts(model);
    (void)out;  // the GPU's flash kernels' alone
    size_t kv_bytes = (size_t)B * T * c.R * c.hd * sizeof(float);
    if (model->device != DEVICE_GPU) memset(dk, 0, kv_bytes), add_dv ? (void)0 : (void)memset(dv, 0, kv_bytes);
    bool bf = bf16_products(model);
    DISPATCH_PRODUCT(model,
             !A->flash ? attention_backward_gpu(dq, dk, dv, A->datt, dout, q, k, v, att, B, T, c.H, c.R, c.hd, add_dv,
                                                A->scratch, blas_of(model), stream_of(model), bf)
             : flash_on_tensor_cores(model)
                 ? flash_attention_tc_backward_gpu(dq, dk, dv, dout, out, q, k, v, att, B, T, c.H, c.R, c.hd, add_dv,
                                                   A->scratch, stream_of(model), bf)
                 : flash_attention_backward_gpu(dq, dk, dv, dout, out, q, k, v, att, B, T, c.H, c.R, c.hd, add_dv,
                                                A->scratch, stream_of(model)),
             attention_backward_fast(dq, dk, dv, dout, q, k, v, att, B, T, c.H, c.R, c.hd, A->scratch, A->threads),
             attention_backward(dq, dk, dv, dout, q, k, v, att, heads_of(model, B, T), bf));
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
// A thread per column j < F, rows n < N in the grid's steps; dgate, dup rows ld apart ([dgate | dup]: 2F)
__global__ void swiglu_backward_kernel(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                                       int N, int F, int ld) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    for (int n = blockIdx.y * blockDim.y + threadIdx.y; n < N && j < F; n += gridDim.y * blockDim.y) {
        size_t i = (size_t)n * F + j, o = (size_t)n * ld + j;
        float g = gate[i], s = 1.0f / (1.0f + expf(-g));
        dgate[o] = dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
        dup[o] = dout[i] * g * s;
    }
}
static void swiglu_forward_gpu(float* out, const float* gate, const float* up, size_t n, cudaStream_t stream) {
    LAUNCH(swiglu_forward_kernel, ceil_div(n, 256), 256, 0, stream)(out, gate, up, n);
    launchCheck();
}
static void swiglu_backward_gpu(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                                size_t n, int F, cudaStream_t stream) {
    int N = (int)(n / F);
    LAUNCH(swiglu_backward_kernel, dim3(ceil_div(F, 32), std::min(ceil_div(N, 8), 65535u)), dim3(32, 8), 0, stream)
        (dgate, dup, dout, gate, up, N, F, 2 * F);
    launchCheck();
}
#endif

static void op_swiglu_forward(Model* model, float* out, const float* gate, const float* up, size_t n) {
    DISPATCH(model, swiglu_forward_gpu(out, gate, up, n, stream_of(model)), swiglu_forward(out, gate, up, n));
}
static void op_swiglu_backward(Model* model, float* dgate, float* dup, const float* dout, const float* gate,
                               const float* up, size_t n) {
    DISPATCH(model, swiglu_backward_gpu(dgate, dup, dout, gate, up, n, model->c.F, stream_of(model)),
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
// probs and nll of one row (position) per warp; then the block that finishes
// last (last_block_done) takes the masked mean over the batch (double, a fixed
// order) and 1 / sum(mask) for the backward. blockDim.x = 256.
__global__ void crossentropy_forward_kernel(float* probs, float* nll, Metrics* metrics, unsigned* done,
                                            const float* logits, const int* targets, const float* mask, int N, int V) {
    int lane = threadIdx.x % 32, n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (n < N) {  // (the whole warp)
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
    if (!last_block_done(done)) return;
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
// The loss stays on the device, in metrics->loss. done: 0, and 0 again after.
static void crossentropy_forward_gpu(float* probs, float* nll, const float* logits, const int* targets,
                                     const float* mask, int N, int V, Metrics* metrics, unsigned* done,
                                     cudaStream_t stream) {
    LAUNCH(crossentropy_forward_kernel, ceil_div(N, 8), 256, 0, stream)
        (probs, nll, metrics, done, logits, targets, mask, N, V);
    launchCheck();
}

// dlogits = mask[n] / sum(mask) * (probs - onehot(target)), in place, the
// mask and 1 / sum(mask) (from the forward) fused in. One thread per logit.
__global__ void crossentropy_backward_kernel(float* dlogits_probs, const int* targets, const float* mask, int N, int V,
                                             const Metrics* metrics) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;  // 32-bit: see launch_check
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

// The loss: model->last_loss on the CPU; on the GPU it stays in device memory (Metrics) until the host asks.
static void op_crossentropy_forward(Model* model, float* probs, float* nll, const float* logits, const int* targets,
                                    const float* mask, int N) {
    int V = model->c.V;
    DISPATCH(model,
             crossentropy_forward_gpu(probs, nll, logits, targets, mask, N, V, model->gpu->metrics, model->gpu->done,
                                      stream_of(model)),
             model->last_loss = crossentropy_forward(probs, nll, logits, targets, mask, N, V));
}
static void op_crossentropy_backward(Model* model, float* dlogits_probs, const int* targets, const float* mask, int N) {
    int V = model->c.V;
    DISPATCH(model,
             crossentropy_backward_gpu(dlogits_probs, targets, mask, N, V, model->gpu->metrics, stream_of(model)),
             crossentropy_backward(dlogits_probs, targets, mask, N, V));
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
LAB_SWAPPABLE void adamw(float* p, float* m, float* v, const float* g, size_t n, float lr, float wd,
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

// Global norm on the GPU in two fixed-order steps: `blocks` blocks (a number
// that depends on n alone) each sum a strided share of g^2 in double, then the
// block that finishes last (last_block_done) adds the partial sums and sets the clip scale.
#define NORM_THREADS 256
static int grad_norm_blocks(size_t n) {
    return (int)std::min<size_t>(1024, (n + NORM_THREADS * 16 - 1) / (NORM_THREADS * 16));
}
#ifdef LIME_GPU
__global__ void grad_norm_kernel(Metrics* metrics, double* partial, unsigned* done, const float* g, size_t n,
                                 const AdamWNumbers* nums) {
    __shared__ double part[NORM_THREADS];
    double s = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        s += (double)g[i] * g[i];
    s = block_sum(s, part);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
    if (!last_block_done(done)) return;
    s = 0;
    for (int b = threadIdx.x; b < (int)gridDim.x; b += blockDim.x) s += partial[b];
    s = block_sum(s, part);
    if (threadIdx.x == 0) {
        float norm = (float)sqrt(s), clip = nums->grad_clip;
        metrics->norm = norm;
        metrics->clip_scale = clip > 0 ? fminf(1.0f, clip / (norm + 1e-6f)) : 1.0f;
    }
}
// partial: grad_norm_blocks(n) doubles; done: 0, and 0 again after.
static void grad_norm_gpu(Metrics* metrics, double* partial, unsigned* done, const float* g, size_t n,
                          const AdamWNumbers* nums, cudaStream_t stream) {
    LAUNCH(grad_norm_kernel, grad_norm_blocks(n), NORM_THREADS, 0, stream)(metrics, partial, done, g, n, nums);
    launchCheck();
}

// Every parameter with one launch, one thread each: its run of tensors (the
// table `runs`, a binary search over their offsets) gives its group's lr and
// weight decay. mem holds params, grads, adam_m, adam_v of n floats each; the
// numbers and the clip scale are read on the device, written before each step.
__global__ void adamw_kernel(float* mem, size_t n, const AdamWRun* runs, int n_runs, const AdamWNumbers* nums,
                             const Metrics* metrics) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int group = entry_holding(runs, n_runs, i, &AdamWRun::offset).group;
    float *p = mem + i, *m = mem + 2 * n + i, *v = mem + 3 * n + i, g = mem[n + i] * metrics->clip_scale;
    float lr = nums->lr[group], wd = nums->weight_decay[group];
    float mi = nums->beta1 * *m + (1.0f - nums->beta1) * g;
    float vi = nums->beta2 * *v + (1.0f - nums->beta2) * g * g;
    *m = mi;
    *v = vi;
    float mhat = mi / nums->bc1, vhat = vi / nums->bc2;
    *p -= lr * wd * *p + lr * mhat / (sqrtf(vhat) + nums->eps);
}
static void adamw_update_gpu(float* mem, size_t n, const AdamWRun* runs, int n_runs, const AdamWNumbers* nums,
                             const Metrics* metrics, cudaStream_t stream) {
    LAUNCH(adamw_kernel, ceil_div(n, 256), 256, 0, stream)(mem, n, runs, n_runs, nums, metrics);
    launchCheck();
}
#endif

// Every run of tensors (model->adamw_runs) with its group's lr and weight
// decay; params holds params, grads, adam_m, adam_v of n floats each; the
// gradients scaled by the clip scale of the global norm.
static void adamw_update(float* params, const std::vector<AdamWRun>& runs, size_t n, float norm,
                         const AdamWNumbers& nums) {
    float clip = clip_scale(norm, nums.grad_clip);
    for (const AdamWRun& run : runs)
        adamw(params + run.offset, params + 2 * n + run.offset, params + 3 * n + run.offset, params + n + run.offset,
              run.numel, nums.lr[run.group], nums.weight_decay[run.group], clip, nums);
}

// Global gradient norm: model->last_norm on the CPU, Metrics (with the clip scale) on the GPU.
static void op_grad_norm(Model* model) {
    size_t n = model->n_params;
    DISPATCH(model,
             grad_norm_gpu(model->gpu->metrics, model->gpu->norm_partial, model->gpu->done, model->gpu->mem + n, n,
                           model->gpu->numbers, stream_of(model)),
             model->last_norm = (float)std::sqrt(grad_sumsq(model->grads, n)));
}
// AdamW on every tensor with model->numbers; the GPU reads their device copy
// (staged before the step), so that a captured graph stays valid.
static void op_adamw(Model* model) {
    size_t n = model->n_params;
    DISPATCH(model,
             adamw_update_gpu(model->gpu->mem, n, model->gpu->runs, (int)model->adamw_runs.size(), model->gpu->numbers,
                              model->gpu->metrics, stream_of(model)),
             adamw_update(model->params, model->adamw_runs, n, model->last_norm, model->numbers));
}

// ===========================================================================
// The residual stream around sublayer s (2l: attention, 2l+1: the MLP). In
// LLaMa and LIMe the sublayer reads rmsnorm(x) and adds its output back to x.
// A study model changes the stream through its hooks (support/model/study.h),
// looked up once, when the model is made (model->study; the regulariser's:
// model->loss_term); each site below is one line.
// ===========================================================================

// Where a hook runs (support/model/study.h): its part's activations, and what lime.cu lends it.
static const LimeOps LIME_OPS = {op_matmul_forward, op_matmul_backward, op_rmsnorm_forward, op_rmsnorm_backward};
static StudyAt study_at(Model* model, int s, int B, int T, bool loss = false) {
    Acts* A = pass_acts(model);
    LimeArrays lime = {A->x, A->Vbuf, A->vr, A->dVbuf, A->dvr, A->dnorm, A->batch.valid};
    return StudyAt{model, s, B, T, loss ? A->loss : A->study, A->scratch, lime, &LIME_OPS};
}
static StudyAt loss_at(Model* model, int l, int B, int T) { return study_at(model, 2 * l, B, T, true); }
int stream_count(const Config& c) { return study_hooks(c) && study_hooks(c)->streams ? study_hooks(c)->streams(c) : 1; }
#define HOOK(model, name) ((model)->study && (model)->study->name)  // the study model has this hook

// Sublayer s's norm: out = rmsnorm(what the stream gives the sublayer, g) (N, d),
// and x copied into xout as it is read: the residual add's first term (a
// separate copy where the norm reads another array).
static void sublayer_norm(const StudyAt& at, float* out, float* rstd, const float* x, const float* g, float* xout) {
    Model* model = at.model;
    const float* in = HOOK(model, norm_input) ? model->study->norm_input(at, x) : x;
    float* keep = HOOK(model, residual_start) ? model->study->residual_start(at, xout) : xout;
    op_rmsnorm_forward(model, out, rstd, in, g, at.N(), in == x ? keep : nullptr);
    if (keep && in != x) op_copy(model, keep, x, (size_t)at.N() * model->c.d);
}
// What layer l's q, k and v projections read: a = rmsnorm(x) (attn_in), or
// the study model's own arrays for k and v (kv_inputs); their gradients' arrays alike.
static QkvInputs attention_inputs(const StudyAt& at, const float* a) {
    KvInputs kv = HOOK(at.model, kv_inputs) ? at.model->study->kv_inputs(at) : KvInputs{};
    return QkvInputs{a, kv.k ? kv.k : a, kv.v ? kv.v : a};
}
static QkvInputGrads attention_input_grads(const StudyAt& at, float* da) {
    KvInputs kv = HOOK(at.model, kv_inputs) ? at.model->study->kv_inputs(at) : KvInputs{};
    return QkvInputGrads{da, kv.dk ? kv.dk : da, kv.dv ? kv.dv : da};
}
// forward: out = rmsnorm(x, g): dx += the norm's backward of dout (A->dnorm); dg += its gain's.
static void sublayer_norm_backward(const StudyAt& at, float* dx, float* dg, const float* x, const float* g,
                                   const float* rstd) {
    if (HOOK(at.model, norm_input_backward)) return at.model->study->norm_input_backward(at, {dx, dg, x, g, rstd});
    op_rmsnorm_backward(at.model, dx, dg, pass_acts(at.model)->dnorm, x, g, rstd, at.N());
}
// The residual add: xout = x + inp (N, C) @ W^T (N, d). x is in xout already
// (sublayer_norm copied it there), so the add is the product's accumulation.
static void residual_add(const StudyAt& at, float* xout, const float* inp, const float* W, int C) {
    if (HOOK(at.model, residual_add)) return at.model->study->residual_add(at, xout, inp, W, C);
    float* out = HOOK(at.model, residual_start) ? at.model->study->residual_start(at, xout) : xout;
    op_matmul_forward(at.model, out, inp, W, at.N(), C, at.model->c.d, true);
}
// forward: xout = x + y, y = inp @ W^T: returns dy from dxout (the same array:
// the stream's gradient passes through the add unchanged, as dx).
static const float* residual_add_backward(const StudyAt& at, const float* dxout) {
    return HOOK(at.model, residual_backward) ? at.model->study->residual_backward(at, dxout) : dxout;
}

// ===========================================================================
// The model: one code path for both devices. forward_pass, backward_pass and
// update_pass are written once; each step is an op_X() call that runs the CPU
// loops or launches the GPU kernels, over the same Acts and Params views (host
// memory for the CPU, device memory for the GPU). On the GPU every op is
// queued on one stream and nothing inside a pass waits for the device, so a
// whole training step is captured as a CUDA graph and replayed.
// ===========================================================================

// Pointers of layer l's activations for a (B, T) batch: per-layer strides are B*T*width.
struct LayerActs {
    float *x, *xa, *xnext, *attn_in, *rstd_a, *q, *K, *V, *kr, *vr, *att, *o, *mlp_in, *rstd_m, *gate, *up, *h;
};
static LayerActs layer_acts(const Acts* A, const Config& c, int l, int B, int T) {
    size_t BT = (size_t)B * T, d = c.d, qd = (size_t)c.H * c.hd, kvd = (size_t)c.R * c.hd;
    size_t stream = stream_count(c) * BT * d;  // the residual stream: n streams (stream_count)
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


// Forward over the batch already in A->batch.tokens (and A->batch.targets, A->batch.mask with a loss).
static void forward_pass(Model* model, int B, int T, bool with_loss) {
    const Config& c = model->c;
    Acts* A = pass_acts(model);
    const Params& P = pass_params(model);
    int N = B * T, d = c.d, qd = c.H * c.hd;
    op_embedding_forward(model, A->x, A->batch.tokens, P.E, N);  // x[0] (B, T, d)
    if (HOOK(model, stream_begin)) model->study->stream_begin(study_at(model, 0, B, T), A->x);
    for (int l = 0; l < c.L; l++) {
        const LayerParams& w = P.layer[l];
        LayerActs la = layer_acts(A, c, l, B, T);
        StudyAt at = study_at(model, 2 * l, B, T), mlp = study_at(model, 2 * l + 1, B, T);
        // attention block: xa = x + attention(rmsnorm(x)) @ Wo^T
        sublayer_norm(at, la.attn_in, la.rstd_a, la.x, w.g_attn, la.xa);  // attn_in = rmsnorm(x), x into xa
        bool routed = has_router(c, l);  // else (LLaMa, LIMe's layer 0) its own keys, roped into kr as they are made
        op_qkv_projection_forward(model, {la.q, la.K, la.V, routed ? nullptr : la.kr}, attention_inputs(at, la.attn_in),
                                  w.Wq, B, T);
        if (model->loss_term_on) model->loss_term->loss_layer(loss_at(model, l, B, T), la.V);  // the loss term reads V
        const float* vr = la.V;
        if (routed) {  // LIMe: mix the buffer of layers 0..l, then rope the mixed keys
            op_router_forward(model, {la.kr, la.vr}, {w.router, w.values_router()}, {A->Kbuf, A->Vbuf}, l, N);
            op_rope_forward(model, la.kr, la.kr, c.R * B, T, 1);  // (R, B, T, hd): R*B sequences of one head
            vr = la.vr;
        }
        if (HOOK(model, values) && model->study->mixes_values(c, l)) vr = model->study->values(at, la.V);
        op_attention_forward(model, la.o, la.att, la.q, la.kr, vr, B, T);
        residual_add(at, la.xa, la.o, w.Wo, qd);  // xa = x + o @ Wo^T
        // MLP block: x[l+1] = xa + swiglu(rmsnorm(xa)) @ Wd^T
        sublayer_norm(mlp, la.mlp_in, la.rstd_m, la.xa, w.g_mlp, la.xnext);  // mlp_in = rmsnorm(xa), xa into x[l+1]
        op_gate_up_forward(model, la.gate, la.up, la.mlp_in, w.Wg, N);  // mlp_in @ Wg^T, mlp_in @ Wu^T
        op_swiglu_forward(model, la.h, la.gate, la.up, (size_t)N * c.F);
        residual_add(mlp, la.xnext, la.h, w.Wd, c.F);  // x[l+1] = xa + h @ Wd^T
        if (HOOK(model, block_end)) model->study->block_end(mlp, la.xnext);
    }
    float* xL = layer_acts(A, c, c.L, B, T).x;
    A->final_in = HOOK(model, final_input) ? model->study->final_input(study_at(model, 2 * c.L, B, T), xL) : xL;
    op_rmsnorm_forward(model, A->hf, A->rstd_f, A->final_in, P.g_final, N);
    op_matmul_forward(model, A->logits, A->hf, P.E, N, d, c.V);  // tied: logits = hf @ E^T
    if (with_loss) op_crossentropy_forward(model, A->probs, A->nll, A->logits, A->batch.targets, A->batch.mask, N);
    if (with_loss && model->loss_term_on) model->loss_term->loss(loss_at(model, 0, B, T));  // loss = ce + the loss term
}

static void backward_pass(Model* model, int B, int T) {
    const Config& c = model->c;
    Acts* A = pass_acts(model);
    const Params& P = pass_params(model);
    const Params& grads = pass_grads(model);
    int N = B * T, d = c.d, qd = c.H * c.hd, kvd = c.R * c.hd;
    size_t kv_layer = (size_t)N * kvd;
    op_zero(model, pass_grads_base(model), model->n_params);
    op_zero(model, A->dKbuf, A->dVbuf - A->dKbuf + c.L * kv_layer);  // and dVbuf, right after it (acts_carve)
    // loss -> logits -> final norm
    float* dlogits = A->probs;
    op_crossentropy_backward(model, dlogits, A->batch.targets, A->batch.mask, N);
    op_matmul_backward(model, A->dnorm, grads.E, dlogits, A->hf, P.E, N, d, c.V, false);
    op_zero(model, A->dx, (size_t)N * d);
    op_rmsnorm_backward(model, A->dx, grads.g_final, A->dnorm, A->final_in, P.g_final, A->rstd_f, N);
    if (HOOK(model, final_input)) model->study->final_input_backward(study_at(model, 2 * c.L, B, T), A->dx);
    for (int l = c.L - 1; l >= 0; l--) {
        const LayerParams& w = P.layer[l];
        const LayerParams& gw = grads.layer[l];
        LayerActs la = layer_acts(A, c, l, B, T);
        StudyAt at = study_at(model, 2 * l, B, T), mlp = study_at(model, 2 * l + 1, B, T);
        float* dK = A->dKbuf + l * kv_layer;  // (R, B, T, hd): complete once layers > l are done
        float* dV = A->dVbuf + l * kv_layer;
        if (HOOK(model, block_end)) model->study->block_end_backward(mlp, A->dx);
        // MLP block. forward: x[l+1] = xa + h @ Wd^T, h = swiglu(mlp_in Wg^T, mlp_in Wu^T), mlp_in = rmsnorm(xa)
        const float* dy = residual_add_backward(mlp, A->dx);  // the gradient of h @ Wd^T
        op_matmul_backward(model, A->dh, gw.Wd, dy, la.h, w.Wd, N, c.F, d, false);
        op_swiglu_backward(model, A->dgate, A->dup, A->dh, la.gate, la.up, (size_t)N * c.F);
        op_gate_up_backward(model, A->dnorm, gw.Wg, A->dgate, A->dup, la.mlp_in, w.Wg, N);
        sublayer_norm_backward(mlp, A->dx, gw.g_mlp, la.xa, w.g_mlp, la.rstd_m);  // dx: d xa
        // attention block. forward: xa = x + o @ Wo^T, o = attention(q, rope(Kr), Vr)
        dy = residual_add_backward(at, A->dx);  // the gradient of o @ Wo^T
        op_matmul_backward(model, A->dout, gw.Wo, dy, la.o, w.Wo, N, qd, d, false);
        bool routed = has_router(c, l), valued = HOOK(model, values) && model->study->mixes_values(c, l);
        bool mixed = routed || valued;  // the values: a mixture (vr)
        float* dvr = mixed ? A->dvr : dV;  // else attention's values are the buffer itself: added into
        op_attention_backward(model, {A->dq, A->dkr, dvr, nullptr}, !mixed, A->dout, la.o,
                              {la.q, la.kr, mixed ? la.vr : la.V}, la.att, B, T);
        if (routed) {  // forward: Kr, Vr = W @ Kbuf, W @ Vbuf (Eq. 2): into layers 0..l's keys and values
            op_rope_backward(model, A->dkr, A->dkr, c.R * B, T, 1, false);
            op_router_backward(model, {gw.router, gw.values_router()}, {A->dKbuf, A->dVbuf}, {A->dkr, A->dvr},
                               {w.router, w.values_router()}, {A->Kbuf, A->Vbuf}, l, N);
        } else {  // forward: kr = rope(K[l])
            op_rope_backward(model, dK, A->dkr, c.R * B, T, 1, true);
        }
        if (valued) model->study->values_backward(at, dV, A->dvr);  // forward: vr = values(V)
        if (model->loss_term_on) model->loss_term->loss_layer_backward(loss_at(model, l, B, T), dV);
        // forward: q = rope(a Wq^T), K and V = the heads of a Wk^T and a Wv^T, a = rmsnorm(x) (or kv_inputs')
        op_qkv_projection_backward(model, attention_input_grads(at, A->dnorm), gw.Wq, {A->dq, dK, dV, nullptr},
                                   attention_inputs(at, la.attn_in), w.Wq, B, T);
        sublayer_norm_backward(at, A->dx, gw.g_attn, la.x, w.g_attn, la.rstd_a);  // dx: d x[l]
    }
    if (HOOK(model, stream_begin_backward)) model->study->stream_begin_backward(study_at(model, 0, B, T), A->dx);
    op_embedding_backward(model, grads.E, A->dx, A->batch.tokens, N);
    op_split_sum(model, N);  // the GPU's split weight gradients into theirs (support/model/split_k.cuh)
}

// Global norm, clipping and AdamW with model->numbers (docs/training.md).
static void update_pass(Model* model) {
    op_grad_norm(model);
    op_adamw(model);
}

// ===========================================================================
// Making a model, and its public calls (support/model/lime.h)
// ===========================================================================

// The GPU's making, staging and captured step: support/model/gpu_runtime.cuh.
#include "support/model/gpu_runtime.cuh"  // defines: gpu_create, gpu_stage, gpu_replay_step, gpu_read_metrics

// The memory a model of shape c at batch B needs, in bytes: its parameters,
// gradients and AdamW moments (4 floats each), then on the host the CPU's
// activations and scratch or the GPU's host copy of the logits, on the device
// its activations (acts_carve). In double: a batch can be too big for size_t
// (acts_carve(B) <= B * acts_carve(1), so that is asked first).
static double memory_needed(const Config& c, int B, Device dev, bool on_device, bool flash = false) {
    Acts probe;
    double state = 16.0 * param_count(c), acts;
    if (dev == DEVICE_GPU && !on_device) acts = (double)B * c.T * c.V;
    else if ((acts = (double)B * acts_carve(&probe, c, 1, nullptr, dev, flash)) < 1e18)
        acts = (double)acts_carve(&probe, c, B, nullptr, dev, flash);
    return state + 4 * acts;
}
static double device_need(const Config& c, int B, bool flash) {  // and gpu_create's small allocation, a run's margin
    return memory_needed(c, B, DEVICE_GPU, true, flash) + gpu_run_bytes(c, B, grad_norm_blocks(param_count(c)));
}
// auto takes flash from T = 1024 where the tensor-core kernels run, as gpu_create (every head dim they take, on sm_80+)
double model_device_need(const Config& c, int B, const ModelSettings& s) {
    bool tensor_cores = (s.tf32 || s.precision == PRECISION_BF16) && c.hd <= FLASH_MAX_HD;
    bool flash = s.attention == ATTENTION_FLASH || (s.attention == ATTENTION_AUTO && c.T >= 1024 && tensor_cores);
    return device_need(c, B, flash);
}

// The passes of one training step (what the GPU captures as its graph).
static void train_step_passes(Model* model, int B, int T) {
    forward_pass(model, B, T, true);
    backward_pass(model, B, T);
    update_pass(model);
}

std::string model_create(Model* model, const Config& c, int B, Device dev, const ModelSettings& settings) {
    std::string err = config_check(c);
    if (!err.empty()) return err;
    if (B < 1) return "--batch must be at least 1";
    // Everything the host will hold, asked before any of it is allocated: calloc would
    // promise more than there is (pages are given when touched), and the run would
    // then be killed part way through its first step.
    auto host_need = [&](const Config& h, int hb) { return memory_needed(h, hb, dev, false); };
    err = host_memory_check(c, B, dev, settings, 16.0 * param_count(c), host_need);
    if (!err.empty()) return err;
    err = launch_check(c, B, dev, settings.flags);  // shapes the code cannot run on this device
    if (!err.empty()) return err;
    model->c = c;
    model->B = B;
    model->device = dev;
    model->settings = settings;
    model->study = study_hooks(c), model->loss_term = loss_hooks(c);  // the registry's row (models.h), looked up once
    model->specs = param_specs(c);
    model->adamw_runs = adamw_runs(model->specs);
    model->n_params = param_count(c);
    // parameters, gradients, adam_m, adam_v: one allocation (on the GPU, the host copies)
    size_t n = model->n_params;
    model->params = (float*)calloc(n * 4, sizeof(float));
    if (!model->params)
        return "out of memory allocating " + std::to_string(n * 16 / 1000000) + " MB for parameters, AdamW state";
    model->grads = model->params + n;
    model->adam_m = model->params + 2 * n;
    model->adam_v = model->params + 3 * n;
    model->p = params_carve(c, model->params);
    model->g = params_carve(c, model->grads);
    model->acts = new Acts();
    model->step = 0;
    std::vector<float> rope((size_t)c.T * c.hd);  // cos, then sin (T, hd/2)
    rope_tables(rope.data(), rope.data() + rope.size() / 2, c.T, c.hd, c.rope_theta);
    if (dev == DEVICE_GPU) {
        // The device holds the activations; the host keeps only the logits, for model_logits.
        float* logits = (float*)calloc((size_t)B * c.T * c.V, sizeof(float));
        if (!logits) return "out of memory allocating the host copy of the logits";
        model->acts->mem = model->acts->logits = logits;
        Acts* A = new Acts();
        err = gpu_create(model, A, acts_carve, device_need, grad_norm_blocks(n));
        if (!err.empty()) return err;
        gpu_upload(model, A->rope_cos, rope.data(), rope.size());
#ifdef LIME_GPU
        // the byte model's choice: the kernels where they fit (bench may ask for cuBLAS, to time both)
        model->gpu->router_blas = settings.router_cublas || !router_kernels_fit(c);
#endif
        return "";
    }
    size_t na = acts_carve(model->acts, c, B, nullptr);
    float* mem = (float*)calloc(na, sizeof(float));
    if (!mem)
        return "out of memory allocating " + std::to_string(na * 4 / 1000000) + " MB for the activations; " +
               memory_fix(c, B, settings.flags, host_need);
    acts_carve(model->acts, c, B, mem);
    model->acts->mem = mem;
    memcpy(model->acts->rope_cos, rope.data(), rope.size() * sizeof(float));
    return "";
}

// Several models held at once (bench): their host memory summed (memory_check.h's models_fit_check).
std::string models_fit_together(const std::vector<Config>& cs, int B, Device dev, const ModelSettings& settings) {
    auto need = [&](const Config& c, int hb) { return memory_needed(c, hb, dev, false); };
    return models_fit_check(cs, B, settings, need);
}

void model_free(Model* model) {
    if (model->gpu) delete pass_acts(model), gpu_free(model);  // the device activations' views, then the device
    if (model->acts) free(model->acts->mem), delete model->acts;
    free(model->params);
    model->acts = nullptr;
    model->params = nullptr;
}

void model_init(Model* model, uint64_t seed) {
    const Config& c = model->c;
    for (const TensorSpec& t : model->specs) {
        float* p = model->params + t.offset;
        Rng rng(seed_for(seed, t.name));
        if (t.group == GROUP_ROUTER && t.shape.size() == 2 && c.arch == ARCH_LIME) {  // LIMe's (the peers': their init)
            router_init(c, t, seed, p);  // support/model/routers.cpp: uniform, the last block I, the variants' fixed entries
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
    if (model->study) model->study->init(model);  // the study model's own initialisation
    memset(model->adam_m, 0, 2 * model->n_params * sizeof(float));
    model->step = 0;
    model_to_device(model);  // initialised on the host, copied to the device
}

// Every token id and target of a batch inside the vocabulary, checked once, here: the ops
// index E and the logits with them unchecked. One outside 0 .. V-1 is the caller's mistake
// (the commands check their files first): one line and a non-zero exit, as a failed CUDA call.
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
// the regulariser on (model->loss_term_on) the valid mask too, all 1 when null.
static void stage(Model* model, const int* tokens, const int* targets, const float* mask, const float* valid, int N,
                  bool numbers) {
    if (tokens) ids_check(tokens, N, model->c.V, "token id");
    if (targets) ids_check(targets, N, model->c.V, "target");
    const BatchArrays& to = pass_acts(model)->batch;
    const AdamWNumbers* nums = numbers ? &model->numbers : nullptr;
    if (model->device == DEVICE_GPU) return gpu_stage(model, to, tokens, targets, mask, valid, N, nums);
    if (tokens) memcpy(to.tokens, tokens, N * sizeof(int));
    if (targets) memcpy(to.targets, targets, N * sizeof(int));
    if (mask) memcpy(to.mask, mask, N * sizeof(float));
    if (tokens && model->loss_term_on && valid) memcpy(to.valid, valid, N * sizeof(float));  // with a batch only
    if (tokens && model->loss_term_on && !valid) std::fill(to.valid, to.valid + N, 1.0f);
}

float model_forward(Model* model, const int* tokens, const int* targets, const float* mask, int B, int T,
                    const float* valid) {
    model->cur_B = B;
    model->cur_T = T;
    model->loss_term_on = model->c.entropy_reg > 0 && valid && targets;  // eval (no valid mask): the plain cross-entropy
    stage(model, tokens, targets, mask, valid, B * T, false);
    forward_pass(model, B, T, targets != nullptr);
    size_t n = (size_t)B * T * model->c.V;
    if (model->device == DEVICE_GPU) gpu_read_forward(model, model->acts->logits, pass_acts(model)->logits, n);
    if (!targets) model->last_loss = 0;
    if (!model->loss_term_on) model->last_ce = model->last_loss, model->last_s2 = 0;
    return model->last_loss;
}

const float* model_logits(Model* model) { return model->acts->logits; }

// One layer's slice of an activation of the last forward, packed for its
// batch (cur_B, cur_T), in host memory: on the GPU copied to model->host_copy first.
const float* model_probe(Model* model, Probe what, int l) {
    const Config& c = model->c;
    size_t BT = (size_t)model->cur_B * model->cur_T;
    size_t n = BT * (what == PROBE_HIDDEN ? c.d : c.R * c.hd), streams = what == PROBE_HIDDEN ? stream_count(c) : 1;
    bool valued = HOOK(model, values) && model->study->mixes_values(c, l);
    bool routed = what == PROBE_VALUES && (has_router(c, l) || valued);
    size_t at = what == PROBE_HIDDEN ? (l + 1) * streams * n : l * n;  // x[l + 1]: the stream leaving layer l
    const Acts* A = pass_acts(model);
    const float* src = (what == PROBE_HIDDEN ? A->x : routed ? A->vr : A->Vbuf) + at;
    // on the GPU into model->host_copy, with room for the values' transpose or the streams' sum
    if (model->device == DEVICE_GPU) src = gpu_probe_copy(model, src, streams * n, (streams + 1) * n);
    model->host_copy.resize((streams + 1) * n);
    float* out = model->host_copy.data() + streams * n;
    if (what == PROBE_HIDDEN && streams == 1) return src;
    if (what != PROBE_HIDDEN) kv_transpose(out, src, (int)BT, c.R, c.hd, true, false);  // (R, B, T, hd) as (B, T, R, hd)
    for (size_t e = 0; what == PROBE_HIDDEN && e < n; e++) {  // the sum of the streams leaving layer l
        float sum = 0;
        for (size_t i = 0; i < streams; i++) sum += src[i * n + e];
        out[e] = sum;
    }
    return out;
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
    model->loss_term_on = model->c.entropy_reg > 0;  // every step of a regularised model (the graph holds its ops)
    stage(model, tokens, targets, mask, valid, B * T, true);
    // the GPU replays the step's graph once it is captured (gpu_graph); no waiting: model_metrics waits when asked
    if (model->device == DEVICE_GPU && model->settings.graph && gpu_replay_step(model, B, T, train_step_passes)) return;
    train_step_passes(model, B, T);
}

void model_metrics(Model* model, float* loss, float* norm) {
    if (model->device == DEVICE_GPU) gpu_read_metrics(model);
    if (!model->loss_term_on) model->last_ce = model->last_loss, model->last_s2 = 0;
    *loss = model->last_loss;
    *norm = model->last_norm;
}

void model_sync(Model* model) { if (model->device == DEVICE_GPU) gpu_sync(model); }
void model_to_device(Model* model) { if (model->device == DEVICE_GPU) gpu_to_device(model); }
void model_to_host(Model* model) { if (model->device == DEVICE_GPU) gpu_to_host(model); }

// Training guards: where did a NaN or an Inf appear? (the first tensor that holds one)
std::string model_first_nonfinite(Model* model, bool params) {
    model_to_host(model);
    const float* base = params ? model->params : model->grads;
    for (const TensorSpec& t : model->specs)
        for (size_t i = 0; i < t.numel; i++)
            if (!std::isfinite(base[t.offset + i])) return t.name;
    return "";
}
