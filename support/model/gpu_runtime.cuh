// support/model/gpu_runtime.cuh — making, feeding and reading the GPU state
// of support/model/device.cuh: its memory (gpu_create, gpu_free), the copies
// of the parameters (gpu_to_device, gpu_to_host), the staging of each step's
// batch and numbers through two pinned slots (gpu_stage), the read-back of the
// loss and the norm (gpu_read_metrics, gpu_read_forward) and of a probed
// activation (gpu_probe_copy), and the captured training step (gpu_graph,
// replayed by gpu_replay_step). None of it is an op: lime.cu includes it after
// the passes and hands it what it needs of the model (its acts_carve, the
// passes of one step, the memory a shape needs). In a build without the GPU
// the public calls' answers ("no GPU") and stand-ins for the rest are left.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "support/lib/cli.h"
#include "support/model/device.cuh"
#include "support/model/flash_attention_tc.cuh"
#include "support/model/lime.h"
#include "support/model/memory_check.h"
#include "support/model/split_k.cuh"

#ifdef LIME_GPU
bool gpu_available(std::string* why) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n < 1) {
        cudaGetLastError();  // clear it: asking is not a failure
        *why = std::string("no CUDA device found (cudaGetDeviceCount: ") +
               (err != cudaSuccess ? cudaGetErrorString(err) : "0 devices") + "); use --device cpu";
        return false;
    }
    return true;
}

const char* model_attention_name(const Model* model) {
    if (!model->gpu) return "cpu";
    if (!model->gpu->flash) return "matmul";
    return flash_on_tensor_cores(model) ? "flash (tensor cores)" : "flash";
}

// The handle's math mode: TF32 tensor cores, or plain float32 (ModelSettings::tf32, read before each step).
static void gpu_apply_math(GpuState* gpu, bool tf32) {
    if (gpu->tf32 == tf32) return;
    cublasCheck(cublasSetMathMode(gpu->blas, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    gpu->tf32 = tf32;
}

bool gpu_info(GpuInfo* info) {
    std::string why;
    if (!gpu_available(&why)) return false;
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    info->name = prop.name;
    info->major = prop.major;
    info->minor = prop.minor;
    cudaCheck(cudaMemGetInfo(&info->free_bytes, &info->total_bytes));
    return true;
}

size_t model_device_bytes(const Model* model) { return model->gpu ? model->gpu->device_bytes : 0; }
size_t model_graph_nodes(const Model* model) { return model->gpu ? model->gpu->graph_nodes : 0; }

// cuBLAS's workspace, ours so that graph capture allocates nothing (32 MiB: NVIDIA's advice for Hopper).
static const size_t CUBLAS_WORKSPACE_BYTES = 32u << 20;

// What a model of shape h at batch hb needs on the device (lime.cu's memory_needed), with or without flash attention.
typedef double (*DeviceNeed)(const Config& h, int hb, bool flash);
// The line for a model the device cannot hold, with the flags that would shrink it (memory_fix);
// flash_can: --attention matmul where flash attention runs this model, named first when it fits.
static std::string gpu_out_of_memory(const Model* model, bool flash, double need, size_t free_bytes,
                                     DeviceNeed device_need, bool flash_can) {
    std::string s = strf("needs %.2f GB of GPU memory, the device has %.2f GB free; ", need / 1e9, free_bytes / 1e9);
    double flash_need = flash_can ? device_need(model->c, model->B, true) : 0;
    if (!flash && flash_can && flash_need <= free_bytes)
        s += strf("use --attention flash (no (T, T) probabilities: %.2f GB), or ", flash_need / 1e9);
    return s + memory_fix(model->c, model->B, model->settings.flags,
                          [&](const Config& h, int hb) { return device_need(h, hb, flash); });
}

// Where each piece of an allocation starts: pieces one after another, 256-byte aligned.
static size_t place(size_t* off, size_t bytes) {
    size_t at = *off;
    *off += (bytes + 255) & ~(size_t)255;
    return at;
}

// The small allocation: the gradient norm's norm_blocks partial sums, the
// update's numbers, the metrics, the table of the AdamW runs, the split
// products' table and slots (gpu->split.products, slot_floats of them) and
// cuBLAS's workspace. With base == nullptr it only measures.
static size_t gpu_carve_small(GpuState* gpu, char* base, int norm_blocks, size_t n_runs, size_t slot_floats) {
    size_t bytes = 0;
    size_t at_partial = place(&bytes, norm_blocks * sizeof(double)),
           at_numbers = place(&bytes, sizeof(AdamWNumbers)), at_runs = place(&bytes, n_runs * sizeof(AdamWRun));
    size_t at_split = place(&bytes, gpu->split.products.size() * sizeof(SplitProduct)),
           at_slots = place(&bytes, slot_floats * sizeof(float));
    size_t at_metrics = place(&bytes, sizeof(Metrics)), at_done = place(&bytes, sizeof(unsigned));
    size_t at_workspace = place(&bytes, CUBLAS_WORKSPACE_BYTES);
    if (!base) return bytes;
    gpu->norm_partial = (double*)(base + at_partial);
    gpu->numbers = (AdamWNumbers*)(base + at_numbers);
    gpu->runs = (AdamWRun*)(base + at_runs);
    gpu->split.table = (SplitProduct*)(base + at_split);
    gpu->split.slots = (float*)(base + at_slots);
    gpu->metrics = (Metrics*)(base + at_metrics);
    gpu->done = (unsigned*)(base + at_done);
    cudaCheck(cudaStreamCreateWithFlags(&gpu->stream, cudaStreamNonBlocking));
    cublasCheck(cublasCreate(&gpu->blas));
    cublasCheck(cublasSetStream(gpu->blas, gpu->stream));
    // after cublasSetStream (which resets it): cuBLAS then allocates nothing while a graph is captured
    cublasCheck(cublasSetWorkspace(gpu->blas, base + at_workspace, CUBLAS_WORKSPACE_BYTES));
    return bytes;
}

// What the device's free memory must hold for a model beyond what gpu_create allocates: its
// cuBLAS handle and stream and its captured step's graph (each run of a group has its own).
static const size_t GPU_RUN_MARGIN_BYTES = 64u << 20;

// gpu_create's small allocation (gpu_carve_small, measured) for shape c at batch B, plus the
// margin: what model_device_need adds to the parameters, their state and the activations.
static double gpu_run_bytes(const Config& c, int B, int norm_blocks) {
    GpuState probe;
    size_t BT = (size_t)B * c.T;
    probe.split.products = split_products(c, BT);
    size_t n_runs = adamw_runs(param_specs(c)).size();
    return (double)gpu_carve_small(&probe, nullptr, norm_blocks, n_runs, split_slot_floats(probe.split.products, BT)) +
           (double)GPU_RUN_MARGIN_BYTES;
}

// Pinned staging: per slot tokens, targets, mask, valid (B*T each) and the update's numbers; then the metrics.
static void gpu_make_staging(GpuState* gpu, size_t BT) {
    size_t bytes = 0, at_slot[2][5];
    for (auto& s : at_slot) {
        s[0] = place(&bytes, BT * sizeof(int));
        s[1] = place(&bytes, BT * sizeof(int));
        s[2] = place(&bytes, BT * sizeof(float));
        s[3] = place(&bytes, sizeof(AdamWNumbers));
        s[4] = place(&bytes, BT * sizeof(float));
    }
    size_t at_metrics_host = place(&bytes, sizeof(Metrics));
    cudaCheck(cudaMallocHost(&gpu->pinned, bytes));
    char* pinned = (char*)gpu->pinned;
    for (int k = 0; k < 2; k++) {
        GpuState::Slot& s = gpu->slot[k];
        s.tokens = (int*)(pinned + at_slot[k][0]);
        s.targets = (int*)(pinned + at_slot[k][1]);
        s.mask = (float*)(pinned + at_slot[k][2]);
        s.numbers = (AdamWNumbers*)(pinned + at_slot[k][3]);
        s.valid = (float*)(pinned + at_slot[k][4]);
        cudaCheck(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
    }
    gpu->metrics_host = (Metrics*)(pinned + at_metrics_host);
}

// cudaMalloc that answers its error (and clears it) when the memory is not there.
static cudaError_t device_alloc(void** p, size_t bytes) {
    cudaError_t err = cudaMalloc(p, bytes);
    if (err == cudaSuccess) return err;
    cudaGetLastError();
    *p = nullptr;
    return err;
}

// The host arrays (params, grads, adam_m, adam_v: 4 * n_params floats) to and from the device's, in one copy.
static void gpu_to_device(Model* model) {
    cudaCheck(cudaMemcpyAsync(model->gpu->mem, model->params, 4 * model->n_params * sizeof(float),
                              cudaMemcpyHostToDevice, model->gpu->stream));
    cudaCheck(cudaStreamSynchronize(model->gpu->stream));
}
static void gpu_to_host(Model* model) {
    cudaCheck(cudaMemcpyAsync(model->params, model->gpu->mem, 4 * model->n_params * sizeof(float),
                              cudaMemcpyDeviceToHost, model->gpu->stream));
    cudaCheck(cudaStreamSynchronize(model->gpu->stream));
}

// lime.cu's acts_carve: measures (base == nullptr) or carves the activations.
typedef size_t (*ActsCarve)(Acts* A, const Config& c, int B, float* base, Device dev, bool flash);
// Device memory (three cudaMallocs), pinned staging (one cudaMallocHost), the
// stream, the cuBLAS handle; the activations' views carved into acts (a new
// Acts, the model's from now on); then the host's parameters copied over.
// Sizes first, so that too big a model is refused with a message, not an
// abort; with --attention auto, flash attention where the matrix products'
// (B, H, T, T) probabilities would not fit. norm_blocks: the gradient norm's partial sums.
static std::string gpu_create(Model* model, Acts* acts, ActsCarve carve, DeviceNeed device_need, int norm_blocks) {
    std::string why;
    GpuState* gpu = model->gpu = new GpuState();
    gpu->acts = acts;
    if (!gpu_available(&why)) return why;
    const Config& c = model->c;
    Attention attention = model->settings.attention;
    size_t n = model->n_params;
    if (attention == ATTENTION_FLASH && c.hd > FLASH_MAX_HD)
        return "--attention flash handles head dims up to " + std::to_string(FLASH_MAX_HD) + ", this model has " +
               std::to_string(c.hd) + "; use --attention matmul";
    // Flash attention runs on the tensor cores under TF32 or bf16 where they
    // take the shape (flash_tc_refusal), and auto takes it at T >= 1024, where the
    // cost model (docs/model.md) has it ahead of the matrix products; else the
    // scalar kernels (float32 products, or a head dim or GPU they do not take).
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    bool bf16 = bf16_products(model), tc_wanted = model->settings.tf32 || bf16;
    if (bf16 && prop.major < 8)
        return "--precision bf16 needs bf16 tensor cores (sm_80 or later); GPU 0, " + std::string(prop.name) +
               ", is sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ": use --precision float32";
    std::string tc_refusal = flash_tc_refusal(c.hd, prop.sharedMemPerBlockOptin);
    if (attention == ATTENTION_FLASH && tc_wanted && !tc_refusal.empty())
        return "--attention flash on the tensor cores: " + tc_refusal + "; use " +
               (bf16 ? "--precision float32 " : "") + "--tf32 0 for the scalar kernels";
    bool tc = tc_wanted && tc_refusal.empty();
    bool flash = attention == ATTENTION_FLASH || (attention == ATTENTION_AUTO && c.T >= 1024 && tc);
    gpu->flash_tc = tc_refusal.empty();
    SplitK& split = gpu->split;
    split.products = split_products(c, (size_t)model->B * c.T);
    size_t slot_floats = split_slot_floats(split.products, (size_t)model->B * c.T);
    size_t acts_floats = carve(acts, c, model->B, nullptr, DEVICE_GPU, flash),
           small_bytes = gpu_carve_small(gpu, nullptr, norm_blocks, model->adamw_runs.size(), slot_floats);
    size_t fixed_bytes = 4 * n * sizeof(float) + small_bytes, bytes = fixed_bytes + acts_floats * sizeof(float);
    // asked of the free memory: what model_device_need counts (these bytes and the run's margin,
    // GPU_RUN_MARGIN_BYTES), the same figure alone and in a group
    double need = device_need(c, model->B, flash);
    size_t free_bytes = 0, total_bytes = 0;
    cudaCheck(cudaSetDevice(0));
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    if (need > free_bytes && attention == ATTENTION_AUTO && c.hd <= FLASH_MAX_HD) {  // flash fits where this does not
        flash = true;
        acts_floats = carve(acts, c, model->B, nullptr, DEVICE_GPU, flash);
        bytes = fixed_bytes + acts_floats * sizeof(float), need = device_need(c, model->B, flash);
    }
    if (need > free_bytes)  // (flash_can: matmul asked, where flash would run this model)
        return gpu_out_of_memory(model, flash, need, free_bytes, device_need,
                                 c.hd <= FLASH_MAX_HD && (!tc_wanted || tc_refusal.empty()));
    // it fits what the device said was free; an allocation that fails even so is said as it is
    const std::pair<void**, size_t> pieces[] = {{(void**)&gpu->mem, 4 * n * sizeof(float)},
                                                {(void**)&gpu->acts_mem, acts_floats * sizeof(float)},
                                                {&gpu->small, small_bytes}};
    for (auto [p, piece] : pieces) {
        cudaError_t err = device_alloc(p, piece);
        if (err != cudaSuccess)
            return strf("cudaMalloc of %.2f GB failed (%s) although the device reported %.2f GB free, and this model "
                        "needs %.2f GB: another process may be using the GPU; free it, or try again when it is idle",
                        piece / 1e9, cudaGetErrorString(err), free_bytes / 1e9, need / 1e9);
    }
    gpu->device_bytes = bytes;
    gpu->flash = flash;
    gpu->p = params_carve(c, gpu->mem);
    gpu->g = params_carve(c, gpu->mem + n);
    carve(acts, c, model->B, gpu->acts_mem, DEVICE_GPU, flash);
    gpu_carve_small(gpu, (char*)gpu->small, norm_blocks, model->adamw_runs.size(), slot_floats);
    split.grads = gpu->mem + n;
    gpu->tf32 = model->settings.tf32;
    cublasCheck(cublasSetMathMode(gpu->blas, gpu->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    gpu_make_staging(gpu, (size_t)model->B * c.T);
    // (every copy on the model's stream: it does not wait for the legacy stream; gpu_to_device below waits)
    cudaCheck(cudaMemsetAsync(gpu->metrics, 0, sizeof(Metrics), gpu->stream));
    cudaCheck(cudaMemsetAsync(gpu->done, 0, sizeof(unsigned), gpu->stream));  // and 0 after each use
    cudaCheck(cudaMemcpyAsync(gpu->runs, model->adamw_runs.data(), model->adamw_runs.size() * sizeof(AdamWRun),
                              cudaMemcpyHostToDevice, gpu->stream));  // (gpu_to_device waits for it)
    if (!split.products.empty())
        cudaCheck(cudaMemcpyAsync(split.table, split.products.data(), split.products.size() * sizeof(SplitProduct),
                                  cudaMemcpyHostToDevice, gpu->stream));
    gpu_to_device(model);
    return "";
}

// n floats of host memory to the device, on the model's stream (the RoPE tables).
static void gpu_upload(Model* model, float* dst, const float* src, size_t n) {
    cudaCheck(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyHostToDevice, model->gpu->stream));
    cudaCheck(cudaStreamSynchronize(model->gpu->stream));
}

static void gpu_free(Model* model) {
    GpuState* gpu = model->gpu;
    if (gpu->stream) cudaCheck(cudaStreamSynchronize(gpu->stream));
    for (auto& kv : gpu->graphs)
        if (kv.second) cudaCheck(cudaGraphExecDestroy(kv.second));  // nullptr: that shape ran eagerly only
    for (auto& s : gpu->slot)
        if (s.copied) cudaCheck(cudaEventDestroy(s.copied));
    if (gpu->blas) cublasCheck(cublasDestroy(gpu->blas));
    if (gpu->stream) cudaCheck(cudaStreamDestroy(gpu->stream));
    cudaCheck(cudaFreeHost(gpu->pinned));
    cudaCheck(cudaFree(gpu->small));
    cudaCheck(cudaFree(gpu->acts_mem));
    cudaCheck(cudaFree(gpu->mem));
    delete gpu;
    model->gpu = nullptr;
}

// Host arrays -> pinned slot -> device (dst: the device's batch arrays), queued
// on the stream. The slot used two calls ago is reused: waiting for its copies
// to finish is the only waiting here, and it lets the host run up to two steps
// ahead of the device. With the regulariser on, the valid mask too (all 1 when null).
static void gpu_stage(Model* model, const BatchArrays& dst, const int* tokens, const int* targets, const float* mask,
                      const float* valid, int N, const AdamWNumbers* numbers) {
    GpuState* gpu = model->gpu;
    gpu_apply_math(gpu, model->settings.tf32);
    GpuState::Slot& s = gpu->slot[gpu->next_slot];
    gpu->next_slot ^= 1;
    cudaCheck(cudaEventSynchronize(s.copied));
    auto up = [&](void* to, void* pinned, const void* src, size_t bytes) {
        if (pinned != src) memcpy(pinned, src, bytes);
        cudaCheck(cudaMemcpyAsync(to, pinned, bytes, cudaMemcpyHostToDevice, gpu->stream));
    };
    if (tokens) up(dst.tokens, s.tokens, tokens, N * sizeof(int));
    if (targets) up(dst.targets, s.targets, targets, N * sizeof(int));
    if (mask) up(dst.mask, s.mask, mask, N * sizeof(float));
    if (tokens && model->loss_term_on && !valid) std::fill(s.valid, s.valid + N, 1.0f);  // the regulariser's: all valid
    if (tokens && model->loss_term_on) up(dst.valid, s.valid, valid ? valid : s.valid, N * sizeof(float));
    if (numbers) up(gpu->numbers, s.numbers, numbers, sizeof(AdamWNumbers));
    cudaCheck(cudaEventRecord(s.copied, gpu->stream));
}

// Waits for the device, then reads the loss and the gradient norm.
static void gpu_read_metrics(Model* model) {
    GpuState* gpu = model->gpu;
    cudaCheck(cudaMemcpyAsync(gpu->metrics_host, gpu->metrics, sizeof(Metrics), cudaMemcpyDeviceToHost, gpu->stream));
    cudaCheck(cudaStreamSynchronize(gpu->stream));
    model->last_loss = gpu->metrics_host->loss;
    model->last_ce = model->loss_term_on ? gpu->metrics_host->ce : model->last_loss;
    model->last_s2 = model->loss_term_on ? gpu->metrics_host->s2 : 0.0f;
    model->last_norm = gpu->metrics_host->norm;
}

// The training step captured once per (B, T, math mode) as a CUDA graph. The
// graph holds pointers and shapes only: the batch and the step's numbers are
// read from device memory that stage() fills before every replay. The first
// step of a key gets nullptr and runs eagerly, so that every kernel's first
// launch (module loading, cuBLAS's first calls) happens outside a capture.
// step: the passes of one training step (lime.cu's train_step_passes).
typedef void (*StepPasses)(Model* model, int B, int T);
static cudaGraphExec_t gpu_graph(Model* model, int B, int T, StepPasses step) {
    GpuState* gpu = model->gpu;
    auto key = std::make_tuple(B, T, gpu->tf32);
    auto it = gpu->graphs.find(key);
    if (it == gpu->graphs.end()) {
        gpu->graphs[key] = nullptr;
        return nullptr;
    }
    if (it->second) return it->second;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    cudaCheck(cudaStreamBeginCapture(gpu->stream, cudaStreamCaptureModeThreadLocal));
    step(model, B, T);
    cudaCheck(cudaStreamEndCapture(gpu->stream, &graph));
    cudaCheck(cudaGraphGetNodes(graph, nullptr, &gpu->graph_nodes));
    cudaCheck(cudaGraphInstantiate(&exec, graph, 0));
    cudaCheck(cudaGraphDestroy(graph));
    gpu->graphs[key] = exec;
    return exec;
}
// The step's graph launched, once gpu_graph has captured it; false: run the step eagerly.
static bool gpu_replay_step(Model* model, int B, int T, StepPasses step) {
    cudaGraphExec_t exec = gpu_graph(model, B, T, step);
    if (exec) cudaCheck(cudaGraphLaunch(exec, model->gpu->stream));
    return exec != nullptr;
}

// After a forward: its n logits (device) to the host's copy (model_logits), then the loss; waits for the device.
static void gpu_read_forward(Model* model, float* host_logits, const float* logits, size_t n) {
    cudaCheck(cudaMemcpyAsync(host_logits, logits, n * sizeof(float), cudaMemcpyDeviceToHost, model->gpu->stream));
    gpu_read_metrics(model);
}

// count floats of device memory at src into model->host_copy (room floats), for model_probe.
// On the model's stream, behind the queued step (a plain cudaMemcpy, on the legacy
// stream, would not wait for it: that stream is non-blocking), then waited for.
static const float* gpu_probe_copy(Model* model, const float* src, size_t count, size_t room) {
    model->host_copy.resize(room);
    cudaCheck(cudaMemcpyAsync(model->host_copy.data(), src, count * sizeof(float), cudaMemcpyDeviceToHost,
                              model->gpu->stream));
    cudaCheck(cudaStreamSynchronize(model->gpu->stream));
    return model->host_copy.data();
}

static void gpu_sync(Model* model) { cudaCheck(cudaStreamSynchronize(model->gpu->stream)); }

#else  // no GPU in this build: the public calls' answers, and stand-ins for the
       // gpu_* calls they make, which run only where a model is on the GPU: never
       // here (gpu_create refuses every model)

typedef size_t (*ActsCarve)(Acts* A, const Config& c, int B, float* base, Device dev, bool flash);
typedef double (*DeviceNeed)(const Config& h, int hb, bool flash);
typedef void (*StepPasses)(Model* model, int B, int T);
static const char NO_GPU_BUILD[] =
    "this build has no GPU support (built without nvcc); use --device cpu, or install the CUDA Toolkit and run make";
bool gpu_available(std::string* why) {
    *why = NO_GPU_BUILD;
    return false;
}
const char* model_attention_name(const Model*) { return "cpu"; }
bool gpu_info(GpuInfo*) { return false; }
size_t model_device_bytes(const Model*) { return 0; }
size_t model_graph_nodes(const Model*) { return 0; }
static std::string gpu_create(Model*, Acts*, ActsCarve, DeviceNeed, int) { return NO_GPU_BUILD; }
static double gpu_run_bytes(const Config&, int, int) { return 0; }
static void gpu_upload(Model*, float*, const float*, size_t) {}
static void gpu_free(Model*) {}
static void gpu_to_device(Model*) {}
static void gpu_to_host(Model*) {}
static void gpu_stage(Model*, const BatchArrays&, const int*, const int*, const float*, const float*, int,
                      const AdamWNumbers*) {}
static void gpu_read_metrics(Model*) {}
static bool gpu_replay_step(Model*, int, int, StepPasses) { return false; }
static void gpu_read_forward(Model*, float*, const float*, size_t) {}
static const float* gpu_probe_copy(Model*, const float* src, size_t, size_t) { return src; }
static void gpu_sync(Model*) {}
#endif
