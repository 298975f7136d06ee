// support/model/lime.h — the interface of lime.cu: LIMe (Layer-Integrated Memory)
// and its LLaMa baseline, one model, one code path. The math is
// docs/model.md; shape names follow it: B batch, T positions, V vocabulary, L layers,
// d width, H query heads, R key/value heads, hd head size, F SwiGLU size.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

// The study's other models (support/study/): ARCH_HC, Hyper-Connections (Zhu
// et al., arXiv 2409.19606), the paper's other baseline: n residual streams
// mixed by small learned weights; ARCH_RESFORMER, value residual learning (Zhou
// et al., arXiv 2410.17897): the first layer's values mixed into every later
// layer's; ARCH_DENSEFORMER, depth-weighted averaging (Pagliardini et al.,
// arXiv 2402.02622): each block reads a learned average of all earlier outputs;
// ARCH_MUDDFORMER, multiway dynamic dense connections (Xiao et al., arXiv
// 2502.12170): per token, each of a block's inputs a weighted sum of all earlier
// states; ARCH_DCA, DeepCrossAttention (Heddes et al., arXiv 2502.06785): each
// block's queries, keys and values read their own mixtures of every earlier block's output.
// Fixed as int: the registry may number more models than these (register_model: a test's peer).
enum Arch : int {
    ARCH_LLAMA = 0, ARCH_LIME = 1, ARCH_HC = 2, ARCH_RESFORMER = 3, ARCH_DENSEFORMER = 4, ARCH_MUDDFORMER = 5, ARCH_DCA = 6
};
// MUDDFormer's dense ways (support/study/muddformer.cuh): qkvr, the paper's four (Q, K, V and the
// residual each read their own mixture of the states), or kv (only the keys' and values' inputs).
enum MuddWays { MUDD_QKVR = 0, MUDD_KV = 1 };
// Router variants (paper Appendix D, Table 7; lime.cu's router_sources says
// exactly which weights each one learns): static is Eq. 2 itself.
enum RouterKind { ROUTER_STATIC = 0, ROUTER_AVERAGE = 1, ROUTER_LAST = 2, ROUTER_FIRST = 3 };

struct Config {
    int V = 0, L = 0, d = 0, H = 0, R = 0, hd = 0, F = 0;
    int T = 0;                        // max_position_embeddings: longest sequence
    Arch arch = ARCH_LIME;
    float rope_theta = 10000.0f;
    float eps = 1e-6f;                // RMSNorm
    RouterKind router = ROUTER_STATIC;
    int router_j = 0;                 // the J of last-J and first-J (layers), else 0
    bool router_kv_separate = false;  // one router for keys, another for values
    bool router_frozen = false;       // the control: routers keep their initial values (lime:frozen)
    bool router_same_head = false;    // the cross-head ablation: kv head r mixes only head r of each layer (same-head)
    int hc_rate = 4;                  // hc: the number n of residual streams (1 .. 16)
    bool hc_dynamic = true;           // hc: the per-token correction of the mixing weights
    MuddWays mudd_ways = MUDD_QKVR;   // muddformer: which ways read a dynamic mixture of the states
    float entropy_reg = 0.0f;         // lambda of the value-entropy regulariser (support/study/entropy_reg.cuh; 0: off)
};

// "" when the shapes are consistent, else one line naming the problem and the fix.
std::string config_check(const Config& c);
// Layer l mixes the KV buffer through a router: LIMe, every layer but the first.
inline bool has_router(const Config& c, int l) { return c.arch == ARCH_LIME && l >= 1; }
// The residual stream's width in copies of d: 1, or the study model's (hc: n streams).
int stream_count(const Config& c);
const char* arch_name(Arch a);
// "static", "average", "last-2", "first-1" (support/model/names.cpp parses them back).
std::string router_name(const Config& c);
// The source layers of layer l's router: l' (0 <= l' <= l) with l' < below
// or l' >= from. Every variant's set is such a pair (router_sources), so any
// depth fits in two numbers.
// same_head (router_learned, the cross-head ablation): of those, only the
// weights that mix a kv head into the same head, W[r, l'*R + r].
struct RouterSpan {
    int below = 0, from = 0;
    bool same_head = false;
    bool has(int src) const { return src < below || src >= from; }
    bool learns(int r, int j, int R) const { return has(j / R) && (!same_head || j % R == r); }  // W[r, j]
    bool any(int l) const { return below > 0 || from <= l; }  // some source 0..l
    bool all(int l) const { return !same_head && (below >= from || from <= 0 || below > l); }  // every weight
};
// The layers layer l's router may give a non-zero weight (router_sources),
// and those whose weights it learns (router_learned: none for average or frozen).
RouterSpan router_sources(const Config& c, int l);
RouterSpan router_learned(const Config& c, int l);

// ---------------------------------------------------------------------------
// Parameters: one float array, carved into named tensors in this order.
enum Group { GROUP_MATRIX = 0, GROUP_EMBED_GAIN = 1, GROUP_ROUTER = 2 };  // AdamW groups (docs/training.md)

struct TensorSpec {
    std::string name;                 // HF LLaMa checkpoint name
    std::vector<int> shape;
    size_t offset = 0, numel = 0;     // in floats, inside the parameter array
    Group group = GROUP_MATRIX;
};
std::vector<TensorSpec> param_specs(const Config& c);  // in memory order
size_t param_count(const Config& c);
// A router-group matrix t (R, (l+1)*R) as model_init sets it from the run's seed: uniform, the
// last R x R block I, and the variant's fixed entries (router_sources) (support/model/routers.cpp).
void router_init(const Config& c, const TensorSpec& t, uint64_t seed, float* p);
// "" when every router entry the variant holds fixed (router_learned does not learn it) is
// model_init's value, else one line naming the tensor and the first entry that is not. seed:
// the run's, or nullptr when unknown (a frozen router's random values are then not checked).
std::string router_fixed_check(const Config& c, const std::vector<TensorSpec>& specs, const float* params,
                               const uint64_t* seed);
// A run of tensors next to each other in the parameter array with one AdamW
// group: op_adamw updates each run as one array (one loop, one kernel launch).
struct AdamWRun {
    size_t offset, numel;
    Group group;
};
std::vector<AdamWRun> adamw_runs(const std::vector<TensorSpec>& specs);

struct LayerParams {
    float* g_attn;   // (d)
    float* Wq;       // (H*hd, d)
    float* Wk;       // (R*hd, d)
    float* Wv;       // (R*hd, d)
    float* Wo;       // (d, H*hd)
    float* router;   // (R, (l+1)*R), nullptr where the layer has none; the key router when separate
    float* router_v; // (R, (l+1)*R) the value router with --router-kv separate, else nullptr (router mixes both)
    float* g_mlp;    // (d)
    float* Wg;       // (F, d)
    float* Wu;       // (F, d)
    float* Wd;       // (d, F)
    float* value_residual; // (2)   resformer and l >= 1: the own and the first layer's values' weights; else nullptr
    float* dwa;      // (l+2)  denseformer: the weights of the average after block l; else nullptr
    std::vector<float*> study;  // a study model's tensors that its file names itself (its carve hook), in order
    // The router that mixes the values: the one router of Eq. 2, or with --router-kv separate a second one.
    float* values_router() const { return router_v ? router_v : router; }
};
// A key/value pair of arrays: what the KV buffer, the router, and their
// gradients hold twice (lime.cu's router: op_router_forward, router_forward_gpu).
struct KvPair {
    float* k;
    float* v;
};
struct KvConst {
    const float* k;
    const float* v;
};
// Attention's shape: B sequences of T positions, H query heads and R kv heads of
// hd floats each; C the width the projections read (d).
struct Heads {
    int B, T, H, R, hd, C;
    int N() const { return B * T; }
};
// RoPE's tables, (T, hd/2) each.
struct Rope {
    const float *cos, *sin;
};
// A layer's queries, keys and values, or their gradients: q (B, T, H, hd), K and V
// (R, B, T, hd) head-major, kr the keys as attention reads them (nullptr: none).
struct Qkv {
    float *q, *K, *V, *kr;
};
// What the query, key and value projections of a layer read, (N, d) each: one
// array, a = rmsnorm(x), in LLaMa and LIMe (q == k == v); three in a study model
// whose keys and values read their own mixtures (support/model/study.h, kv_inputs).
struct QkvInputs {
    const float *q, *k, *v;
    bool one() const { return q == k && k == v; }
};
// ... and their gradients, (N, d) each, written: one array (q == k == v) holds their sum.
struct QkvInputGrads {
    float *q, *k, *v;
};
// One sublayer's Hyper-Connection weights (hc only; else all nullptr). n streams.
struct HcParams {
    float* static_beta;     // (n)
    float* static_alpha;    // (n, n+1)
    float* alpha_fn;        // (d, n+1) dynamic_alpha_fn, nullptr when static
    float* alpha_scale;     // (1)      dynamic_alpha_scale
    float* beta_fn;         // (d)      dynamic_beta_fn
    float* beta_scale;      // (1)      dynamic_beta_scale
};
struct Params {                       // views into one array: weights, grads, adam_m or adam_v alike
    float* E = nullptr;               // (V, d), tied to the output layer
    std::vector<LayerParams> layer;   // L of them
    std::vector<HcParams> hc;         // hc: 2L of them, sublayer 2l (attention) and 2l+1 (MLP); else empty
    float* g_final = nullptr;         // (d)
};
Params params_carve(const Config& c, float* base);

// ---------------------------------------------------------------------------
// Optimiser and schedule (docs/training.md).
struct AdamWConfig {
    float lr = 1e-3f, router_lr = 1e-2f, weight_decay = 0.1f;
    float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, grad_clip = 1.0f;
};
// One update's numbers, from AdamWConfig, the schedule factor and the step
// (adamw_numbers in lime.cu). The GPU keeps a copy in device memory that a
// captured training step reads, so the graph stays valid from step to step.
struct AdamWNumbers {
    float lr[3];          // per Group: the group's learning rate times the schedule factor
    float weight_decay[3];// per Group: weight_decay for matrices, 0 for the others
    float beta1, beta2, eps, grad_clip;
    float bc1, bc2;       // bias corrections 1 - beta^step
};
enum Schedule { SCHED_CONSTANT = 0, SCHED_COSINE = 1, SCHED_LINEAR = 2 };
// Learning-rate factor of step s = 1, 2, ...: linear warmup, then cosine or linear decay.
float lr_factor(int s, int warmup, int steps, Schedule sched, float min_lr_ratio);

// ---------------------------------------------------------------------------
// The model: parameters, gradients, AdamW state and activations, each one allocation.
enum Device { DEVICE_CPU = 0, DEVICE_GPU = 1 };

struct Acts;       // activations for backward, defined in lime.cu
struct StudyHooks; // a study model's or loss term's hooks (support/model/study.h)
struct GpuState;   // device mirrors, defined in lime.cu's GPU part

// GPU attention kernels. matmul: batched matrix products around a stored
// (B, H, T, T) softmax (fast); flash: tiled kernels that keep one number per
// row instead (memory O(T), slower; head dims up to 128); auto: matmul when it
// fits in GPU memory, else flash.
enum Attention { ATTENTION_AUTO = 0, ATTENTION_MATMUL = 1, ATTENTION_FLASH = 2 };
// --precision: the operands of the dense products and attention's (support/model/products.cuh).
enum Precision { PRECISION_FLOAT32 = 0, PRECISION_BF16 = 1 };
static const int FLASH_MAX_HD = 128;  // the widest head the flash kernels take, scalar and tensor-core (support/model)

// The flags that set a model's sizes in the command that makes it ("" where it
// has none: eval cannot change a checkpoint's shape). A model that does not fit
// in memory is refused with a line that names those that would shrink it most.
struct SizeFlags {
    std::string layers = "--layers", dim = "--dim", ffn = "--ffn", vocab = "--vocab", batch = "--batch",
                seq_len = "--seq-len";
};

// How a model runs, chosen when it is made. The GPU reads tf32 again before
// each step, so a test may change it between steps.
struct ModelSettings {
    Attention attention = ATTENTION_AUTO;  // GPU attention kernels
    bool tf32 = true;                      // GPU: TF32 tensor cores for the matrix products
    Precision precision = PRECISION_FLOAT32;  // bf16: the products' operands rounded to bf16 (GPU; CPU: reference)
    bool graph = true;                     // GPU: model_train_step replays one captured CUDA graph per batch shape
    bool router_cublas = false;            // GPU: LIMe's router on cuBLAS even where its kernels fit (bench times both)
    size_t host_bytes = 0;                 // memory the host can give (MemAvailable); 0 = unknown, unchecked
    SizeFlags flags;                       // the command's size flags, for the out-of-memory line
};

struct Model {
    Config c;
    int B = 0;                        // batch size the activations are sized for
    Device device = DEVICE_CPU;
    std::vector<TensorSpec> specs;
    std::vector<AdamWRun> adamw_runs; // specs as runs of one AdamW group (op_adamw)
    size_t n_params = 0;
    float* params = nullptr;          // host copies (the CPU path works on these)
    float* grads = nullptr;
    float* adam_m = nullptr;          // AdamW first moment
    float* adam_v = nullptr;          // AdamW second moment
    Params p, g;                      // named views into params, grads
    int step = 0;                     // optimiser steps taken
    int cur_B = 0, cur_T = 0;         // batch shape of the last forward
    Acts* acts = nullptr;
    GpuState* gpu = nullptr;
    const StudyHooks* study = nullptr;      // the study model's hooks (support/model/models.h), nullptr: LLaMa, LIMe
    const StudyHooks* loss_term = nullptr;  // the loss term's (the regulariser), nullptr: none
    float last_loss = 0, last_norm = 0;
    float last_ce = 0, last_s2 = 0;   // with the regulariser: the loss's cross-entropy and mean S2 (else ce = loss, s2 = 0)
    bool loss_term_on = false;        // the last forward computed the loss term (the regulariser: entropy_reg > 0, a valid mask)
    std::vector<float> host_copy;     // analysis reads of device activations land here
    ModelSettings settings;
    AdamWNumbers numbers = {};        // the current update's numbers (model_update, model_train_step)
};

// Allocate for batches of up to B sequences of up to c.T positions. "" or an error line.
std::string model_create(Model* model, const Config& c, int B, Device dev,
                         const ModelSettings& settings = ModelSettings());
void model_free(Model* model);
// "" when models of configs cs, each for batches of B, fit in the host's memory
// together (a command holding several at once: bench), else the out-of-memory
// line for their sum, naming the flags that would shrink them.
std::string models_fit_together(const std::vector<Config>& cs, int B, Device dev, const ModelSettings& settings);
// The initialisation of docs/model.md. Each tensor draws from its own stream, seeded by
// (seed, name): llama and lime built with one seed share every common tensor.
void model_init(Model* model, uint64_t seed);
// Forward over tokens (B, T) with T <= c.T. With targets (B, T) and mask (B, T)
// it also computes the masked mean cross-entropy and returns it, else 0.
// valid (B, T): 1 where a position holds a token of its sequence, 0 on padding.
// With c.entropy_reg > 0 and a valid mask (and targets) the loss is the
// regularised one, cross-entropy - entropy_reg * mean S2 (last_ce, last_s2
// hold the parts); without a valid mask it is the plain cross-entropy (eval).
// Every token id and target must lie in 0 .. c.V-1: one outside is one line on
// stderr and exit (checked once, when the batch is staged; the ops index unchecked).
float model_forward(Model* model, const int* tokens, const int* targets, const float* mask, int B, int T,
                    const float* valid = nullptr);
const float* model_logits(Model* model);  // (B, T, V) of the last forward (host memory)
// What analyze reads of the last forward, layer l (host memory):
//   PROBE_VALUES      (B, T, R, hd) the values layer l attended with (LIMe: routed)
//   PROBE_RAW_VALUES  (B, T, R, hd) layer l's own W_V output (the same in LLaMa)
//   PROBE_HIDDEN      (B, T, d)     the residual stream after layer l (the last: before the final norm;
//                                   hc: the sum of its n streams)
enum Probe { PROBE_VALUES = 0, PROBE_RAW_VALUES = 1, PROBE_HIDDEN = 2 };
const float* model_probe(Model* model, Probe what, int l);
// Backward of the last forward with targets: fills m->grads.
void model_backward(Model* model);
// Global gradient norm, clipping, AdamW with the three groups; returns the norm before clipping.
float model_update(Model* model, const AdamWConfig& opt, float factor);
// One training step: forward, backward, AdamW. On the GPU it is one CUDA graph
// replay (the first step of each batch shape runs the kernels one by one, and
// the second captures them) and does not wait for the device; model_metrics
// reads loss and norm (and waits), so a training loop calls it only when it logs.
// With c.entropy_reg > 0 the step's loss is the regularised one; valid as in
// model_forward, nullptr: every position is valid.
void model_train_step(Model* model, const int* tokens, const int* targets, const float* mask, int B, int T,
                      const AdamWConfig& opt, float factor, const float* valid = nullptr);
// Also fills model->last_ce and model->last_s2.
void model_metrics(Model* model, float* loss, float* norm);
// Waits until the device has finished the queued steps (a no-op on the CPU): what a timer stops at.
void model_sync(Model* model);
// Copy host params/grads/optimiser state to/from the device (no-ops on the CPU).
void model_to_device(Model* model);
void model_to_host(Model* model);

// Checkpoints (support/model/checkpoint.cpp, docs/checkpoint.md): safetensors with
// HF names; metadata holds "config" and whatever the caller adds.
std::string config_to_json(const Config& c);
std::string config_from_json(const std::string& json, Config* c);  // "" or error
// Writes to a new PATH.tmp-XXXXXX, then renames (st_write). with_optim adds optim.m.*, optim.v.*, optim.step.
std::string model_save(Model* model, const std::string& path, const std::map<std::string, std::string>& meta,
                       bool with_optim);
// What model_save would refuse with this metadata (not UTF-8, too large), found before any training.
std::string model_save_check(const Model* model, const std::string& path,
                             const std::map<std::string, std::string>& meta, bool with_optim);
// "" when a and b describe the same model, else the fields that differ,
// e.g. "architecture lime vs llama, hidden_size 16 vs 32".
std::string config_diff(const Config& a, const Config& b);
// Reads the config from a checkpoint without loading it.
std::string checkpoint_read_config(const std::string& path, Config* c, std::map<std::string, std::string>* meta);
// Loads weights (and optimiser state when with_optim) into a model created with the file's config.
std::string model_load(Model* model, const std::string& path, bool with_optim);
// Checkpoints carry "checksum" (fnv1a64 of the tensors and metadata) in their
// metadata; loading refuses a file whose contents do not match it, and
// weights or optimiser state holding a NaN or an Inf (naming the tensor).

// The most steps one run may take (--steps, or --epochs x steps per epoch):
// 2^30, so that step counts, and the optimiser's I32 step, never overflow.
const long long MAX_STEPS = 1LL << 30;
// The metadata ./lime train writes besides "config" (docs/checkpoint.md),
// parsed and checked before anything uses it.
struct TrainMeta {
    int train_step = 0, steps = 0, data_epoch = 0;  // steps: the run's length, from "args"
    long long data_pos = 0;
    std::map<std::string, std::string> task, args;  // the settings objects "task" and "args"
    std::vector<std::string> vocab;                 // the token strings in id order
};
// For files this program reads as its own (train --resume, eval, sample,
// analyze; not verify's reference vectors): "checksum" is required, and
// every field is present and well formed: train_step an integer in
// 0 .. the run's steps, data_epoch and data_pos non-negative integers,
// "task" an object naming arith, prosqa or text, "vocab" a list of V strings.
// "" or one line naming PATH, the field and the fix.
std::string checkpoint_check_meta(const std::string& path, const Config& c,
                                  const std::map<std::string, std::string>& meta, TrainMeta* out);

// Training guards: the name of the first tensor whose gradient (or, with
// params, whose weights) hold a NaN or an Inf, "" if none. Reads host memory:
// on the GPU it copies the model to the host first, so call it when a check
// has already found a non-finite loss or norm, not every step.
std::string model_first_nonfinite(Model* model, bool params);

// Floating-point operations per token for one training step (forward + backward), router counted (support/model/cost.cpp).
double flops_per_token(const Config& c, int T);
// Bytes per token one training step moves if every op streams its arrays from memory (cost.cpp has the model).
double bytes_per_token(const Config& c, int T);

// Whether --device gpu can work in this build on this machine; if not, *why says so in one line.
bool gpu_available(std::string* why);
const char* model_attention_name(const Model* model);  // "matmul" or "flash" on the GPU, "cpu" on the CPU

// The GPU for bench: name, compute capability and memory (support/lib/gpu_peaks.h
// has the dense peaks its MFU is measured against).
struct GpuInfo {
    std::string name;
    int major = 0, minor = 0;               // compute capability
    size_t total_bytes = 0, free_bytes = 0; // cudaMemGetInfo now
};
bool gpu_info(GpuInfo* info);               // false without a device
// GPU memory, in bytes, a model of shape c at batch B would allocate with settings s (model_create's check).
double model_device_need(const Config& c, int B, const ModelSettings& s);
// GPU memory the model allocated (parameters, gradients, AdamW state, activations); 0 on the CPU.
size_t model_device_bytes(const Model* model);
// The nodes of the training step the GPU captured last (0 before the second step, and on the CPU):
// how many kernels and copies one step issues.
size_t model_graph_nodes(const Model* model);
