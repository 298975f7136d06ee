// support/model/device.cuh — where the ops run: the build's choices (FAST_CPU,
// LAB_SWAPPABLE), sums in a fixed order (CHUNKS, sum_in_order), the CUDA
// checking macros and the kernels' helpers (ceil_div, warp_sum, block_sum),
// DISPATCH (the one `if` between the devices), and the state a model keeps on
// the GPU (GpuState, Metrics), with what the ops and the passes ask of it
// (stream_of, blas_of, pass_acts, pass_params, pass_grads), and the whole-array
// ops every file uses (op_copy, op_zero, op_add). lime.cu and the
// study's models (support/study/) include it before their first op; making
// and freeing that state is support/model/gpu_runtime.cuh, after the passes.
//
// Builds: g++ alone (the CPU), nvcc (CPU and GPU: LIME_GPU), or g++ with
// -DLIME_EMU, where support/harness/cuda_on_cpu.h runs the CUDA code on the CPU.
#pragma once
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <tuple>

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

// A helper that both the CPU loops and the kernels call (in nvcc's build, compiled for both).
#ifdef __CUDACC__
#define HOST_DEVICE __host__ __device__
#else
#define HOST_DEVICE
#endif

// The CPU runs the fast versions of support/model/cpu_fast.cpp (X_fast),
// except in the reference build (make lime-ref) and the labs' build, which
// run only the plain loops (X).
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

// Sums never depend on the number of threads or blocks (a resumed run is
// bit-exact): on the CPU a fixed number of chunks, each summed in order, then
// the chunks in order; on the GPU fixed trees and no atomics.
static const int CHUNKS = 64;
// An element-wise loop over more floats than this is shared by the threads; a
// shorter one (a gain, a router, a small model's activations) stays on one.
// (An enumerator: nvcc's device pass skips the pragmas that read it, and would
// call a constant unused.)
enum : size_t { SHARED_FLOATS = 65536 };
static inline double sum_in_order(const double* part, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += part[i];
    return s;
}

// e^x in the CPU loops: expf, or in the fast build exp_fast (support/model/cpu_fast.h),
// within 2 ulp of it, which the compiler can vectorise (a call to expf stops it).
static inline float cpu_exp(float x) { return FAST_CPU ? exp_fast(x) : expf(x); }

#ifdef LIME_GPU
static inline void cuda_check(cudaError_t err, const char* file, int line) {
    if (err == cudaSuccess) return;
    fprintf(stderr, "lime: CUDA error at %s:%d: %s\n", file, line, cudaGetErrorString(err));
    exit(EXIT_FAILURE);
}
static inline void cublas_check(cublasStatus_t status, const char* file, int line) {
    if (status == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "lime: cuBLAS error at %s:%d: %s\n", file, line, cublasGetStatusString(status));
    exit(EXIT_FAILURE);
}
#define cudaCheck(call) cuda_check((call), __FILE__, __LINE__)
#define cublasCheck(call) cublas_check((call), __FILE__, __LINE__)
// After every launch: a refused launch (bad grid, too much shared memory) shows here.
#define launchCheck() cuda_check(cudaGetLastError(), __FILE__, __LINE__)

// Blocks for a elements at b per block; at least 1 (the kernels check their bounds).
static inline unsigned ceil_div(size_t a, size_t b) { return a ? (unsigned)((a + b - 1) / b) : 1u; }

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
// One launch in place of a kernel and a one-block reduction after it: each
// block writes its partial sums, then counts itself done; the last block to
// finish (any block order) reads all the partials, which it alone returns true
// for, and sets the count back to 0 for the next launch on the stream. The
// fences are the CUDA C++ Programming Guide's pattern ("Memory Fence Functions",
// its sum example): each block's writes, then __threadfence, then the atomic
// count (a release); and in the last block, after the count and the barrier, a
// __threadfence of every thread before it reads the others' partials (an
// acquire: the guide reads them through a volatile pointer to the same end), so
// no load of a partial is served before, or from a cache older than, its write.
__device__ inline bool last_block_done(unsigned* done) {
    __threadfence();  // this block's partials are seen by the last block
    __syncthreads();
    bool last = false;
    if (threadIdx.x == 0 && (last = atomicAdd(done, 1u) == gridDim.x * gridDim.y * gridDim.z - 1)) *done = 0;
    if (!__syncthreads_or(last)) return false;  // thread 0's answer, to every thread
    __threadfence();  // the last block: the others' partials, fenced before they are read
    return true;
}

// The last block's fixed-order sum of a table of partial sums (rows, cols), 32
// columns at a time: warp y of WARPS (blockDim.x = 32 WARPS) sums rows y, y +
// WARPS, ... in order, then a fixed tree over the warps; add(e, sum) takes column
// e's (RMSNorm's gain gradient, DCA's GRN weights).
template <int WARPS, class Add>
__device__ inline void column_sums_tree(const float* partial, int rows, size_t cols, Add add) {
    __shared__ float tree[WARPS][32];
    int lane = threadIdx.x % 32, y = threadIdx.x / 32;
    for (size_t e = lane; e - lane < cols; e += 32) {
        float sum = 0;
        for (int r = y; r < rows && e < cols; r += WARPS) sum += partial[(size_t)r * cols + e];
        __syncthreads();  // the previous columns' tree is read
        tree[y][lane] = sum;
        for (int stride = WARPS / 2; stride > 0; stride /= 2) {
            __syncthreads();
            if (y < stride) tree[y][lane] += tree[y + stride][lane];
        }
        if (y == 0 && e < cols) add(e, tree[0][lane]);
    }
}

// Which of n entries, sorted by their `start`, holds item i: the last one starting
// at or before it, by binary search (adamw_kernel's runs, split_sum_kernel's products).
template <class Entry>
__device__ inline const Entry& entry_holding(const Entry* e, int n, size_t i, size_t Entry::*start) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (e[mid].*start <= i) lo = mid;
        else hi = mid - 1;
    }
    return e[lo];
}
#endif

// DISPATCH(model, gpu, fast, plain): an op's dispatcher runs its GPU launcher
// (X_gpu) for a model on the GPU, else its fast CPU version (X_fast) in ./lime
// or its plain loop (X) in ./lime-ref and the labs. An op with one CPU version
// names it once: DISPATCH(model, gpu, plain). A build without the GPU never
// compiles the GPU call.
#ifdef LIME_GPU
#define DISPATCH_ON(model, gpu_call, fast_call, plain_call, ...) \
    do {                                                          \
        if ((model)->device == DEVICE_GPU) gpu_call;              \
        else if (FAST_CPU) fast_call;                             \
        else plain_call;                                          \
    } while (0)
#else
#define DISPATCH_ON(model, gpu_call, fast_call, plain_call, ...) \
    do {                                                          \
        (void)(model);                                            \
        if (FAST_CPU) fast_call;                                  \
        else plain_call;                                          \
    } while (0)
#endif
#define DISPATCH(model, gpu_call, ...) DISPATCH_ON(model, gpu_call, __VA_ARGS__, __VA_ARGS__)

// The batch as the passes read it, in the model's memory (host or device):
// copies of the caller's arrays, staged before each step (lime.cu's stage).
struct BatchArrays {
    int* tokens;   // (B, T)
    int* targets;  // (B, T)
    float* mask;   // (B, T) 1 where the loss counts
    float* valid;  // (B, T) 1 where the position holds a token of its sequence (the regulariser's)
};

// A weight gradient the GPU makes as a split-k (support/model/split_k.cuh).
struct SplitProduct {
    size_t grad;   // dW's offset in the gradients
    size_t slots;  // its slots' offset in the slot array: split_slices(OC, C, B*T, false) slots of OC*C floats
    size_t first;  // its first output among all split products' (split_sum_kernel's numbering)
    int OC, C;     // dW (OC, C)
};

#ifdef LIME_GPU
// The split products of one model: found by their gradient's place, summed by op_split_sum.
struct SplitK {
    std::vector<SplitProduct> products;  // split_products(c, B*T)
    SplitProduct* table = nullptr;       // the same on the device (the small allocation)
    float* grads = nullptr;              // the gradients they add to
    float* slots = nullptr;              // their slots (the small allocation too)
    size_t elements() const {            // their outputs, all together (`first` counts them)
        return products.empty() ? 0 : products.back().first + (size_t)products.back().OC * products.back().C;
    }
    const SplitProduct* find(const float* dW) const {
        for (const SplitProduct& p : products)
            if (grads + p.grad == dW) return &p;
        return nullptr;
    }
};

// Numbers the device computes and the host reads when it asks (model_metrics).
struct Metrics {
    float loss;       // crossentropy_forward_gpu; with the regulariser ereg_loss_gpu's total
    float ce, s2;     // the cross-entropy and, with the regulariser, the mean S2 (ereg_loss_gpu)
    float inv_count;  // 1 / sum(mask), for the backward (0 when the mask is all 0)
    float norm;       // global gradient norm, before clipping
    float clip_scale; // min(1, grad_clip / (norm + 1e-6)), or 1 without clipping
};

// Everything the GPU holds for one model: made by gpu_create (support/model/
// gpu_runtime.cuh), nothing allocated per step.
struct GpuState {
    float* mem = nullptr;            // params, grads, adam_m, adam_v: one cudaMalloc, laid out as on the host
    Params p, g;                     // views into mem, like the host's model->p, model->g
    Acts* acts = nullptr;            // the device activations' views (lime.cu's Acts), over acts_mem
    float* acts_mem = nullptr;       // one cudaMalloc
    void* small = nullptr;           // one cudaMalloc for the optimiser's numbers, the split-k, cuBLAS's workspace:
    double* norm_partial = nullptr;  //   the gradient norm's partial sums
    AdamWNumbers* numbers = nullptr; //   this update's numbers, staged from the host
    Metrics* metrics = nullptr;      //   loss and norm, written by kernels
    unsigned* done = nullptr;        //   a counter of finished blocks: the last one reduces (rmsnorm_backward_gpu)
    AdamWRun* runs = nullptr;        //   model->adamw_runs, for the one AdamW launch
    SplitK split;                    // the weight gradients made as a split-k; its table in small
    cudaStream_t stream = nullptr;
    cublasHandle_t blas = nullptr;
    bool tf32 = true;                // the math mode the handle is set to
    bool flash = false;              // flash attention (the activations hold one number per row, not (T, T))
    bool flash_tc = false;           // ... on the tensor cores, TF32 or bf16 (flash_attention_tc.cuh); else scalar
    bool router_blas = false;        // the router on cuBLAS, not its kernels (the byte model's choice, model_create)
    // Pinned host staging: the batch and the update's numbers reach the device
    // through here. Two slots, so the host fills one while the device may
    // still copy out of the other; `copied` marks the end of a slot's copies.
    struct Slot {
        int* tokens;
        int* targets;
        float* mask;
        AdamWNumbers* numbers;
        float* valid;
        cudaEvent_t copied;
    } slot[2] = {};
    int next_slot = 0;
    void* pinned = nullptr;          // one cudaMallocHost: both slots and metrics_host
    Metrics* metrics_host = nullptr;
    // One captured training step per (B, T, tf32), replayed by model_train_step;
    // nullptr after that shape's first step, which runs eagerly (gpu_graph).
    std::map<std::tuple<int, int, bool>, cudaGraphExec_t> graphs;
    size_t device_bytes = 0;         // what the three cudaMallocs hold
    size_t graph_nodes = 0;          // the nodes of the last captured step (bench, tests)
};
static inline cudaStream_t stream_of(const Model* model) { return model->gpu->stream; }
static inline cublasHandle_t blas_of(const Model* model) { return model->gpu->blas; }
static inline const SplitK& split_of(const Model* model) { return model->gpu->split; }
// What a launcher needs of the GPU: the stream, cuBLAS's handle on it, the split-k
// plan of the weight gradients, and bf16 (--precision bf16: the products' operands
// rounded, support/model/products.cuh). gpu_of(model): the model's.
struct GpuCtx {
    cudaStream_t stream;
    cublasHandle_t blas;
    const SplitK* split;
    bool bf16;
};
static inline GpuCtx gpu_of(const Model* model) {
    return GpuCtx{model->gpu->stream, model->gpu->blas, &model->gpu->split,
                  model->settings.precision == PRECISION_BF16};
}
#endif

// Attention's shape (Heads), RoPE's tables (Rope) and a layer's q, K, V (Qkv): support/model/lime.h.
static inline Heads heads_of(const Model* model, int B, int T) {
    return Heads{B, T, model->c.H, model->c.R, model->c.hd, model->c.d};
}
struct QkvIn {  // ... read only: q (B, T, H, hd), k and v (R, B, T, hd)
    const float *q, *k, *v;
};

// What the passes work on: host memory for the CPU, device memory for the GPU.
static inline Acts* pass_acts(Model* model) {
#ifdef LIME_GPU
    if (model->device == DEVICE_GPU) return model->gpu->acts;
#endif
    return model->acts;
}
static inline const Params& pass_params(Model* model) {
#ifdef LIME_GPU
    if (model->device == DEVICE_GPU) return model->gpu->p;
#endif
    return model->p;
}
static inline const Params& pass_grads(Model* model) {
#ifdef LIME_GPU
    if (model->device == DEVICE_GPU) return model->gpu->g;
#endif
    return model->g;
}
static inline float* pass_grads_base(Model* model) {  // all gradients, one array of n_params
#ifdef LIME_GPU
    if (model->device == DEVICE_GPU) return model->gpu->mem + model->n_params;
#endif
    return model->grads;
}

// Whole arrays (the residual stream, gradients): dst = src, p = 0 and dst += src.
// The CPU's memcpy and memset go in CHUNKS pieces shared by the threads.
static inline void copy_floats(float* dst, const float* src, size_t n) {
#pragma omp parallel for schedule(static) if (n > SHARED_FLOATS)
    for (int c = 0; c < CHUNKS; c++) {
        size_t from = n * c / CHUNKS, to = n * (c + 1) / CHUNKS;
        memcpy(dst + from, src + from, (to - from) * sizeof(float));
    }
}
static inline void zero_floats(float* p, size_t n) {
#pragma omp parallel for schedule(static) if (n > SHARED_FLOATS)
    for (int c = 0; c < CHUNKS; c++) {
        size_t from = n * c / CHUNKS, to = n * (c + 1) / CHUNKS;
        memset(p + from, 0, (to - from) * sizeof(float));
    }
}
static inline void add_floats(float* dst, const float* src, size_t n) {
#pragma omp parallel for schedule(static) if (n > SHARED_FLOATS)
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}
#ifdef LIME_GPU
__global__ void add_floats_kernel(float* dst, const float* src, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] += src[i];
}
static inline void copy_floats_gpu(float* dst, const float* src, size_t n, cudaStream_t stream) {
    cudaCheck(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
}
static inline void zero_floats_gpu(float* p, size_t n, cudaStream_t stream) {
    cudaCheck(cudaMemsetAsync(p, 0, n * sizeof(float), stream));
}
static inline void add_floats_gpu(float* dst, const float* src, size_t n, cudaStream_t stream) {
    LAUNCH(add_floats_kernel, ceil_div(n, 256), 256, 0, stream)(dst, src, n);
    launchCheck();
}
#endif
static inline void op_copy(Model* model, float* dst, const float* src, size_t n) {
    DISPATCH(model, copy_floats_gpu(dst, src, n, stream_of(model)), copy_floats(dst, src, n));
}
static inline void op_zero(Model* model, float* p, size_t n) {
    DISPATCH(model, zero_floats_gpu(p, n, stream_of(model)), zero_floats(p, n));
}
static inline void op_add(Model* model, float* dst, const float* src, size_t n) {
    DISPATCH(model, add_floats_gpu(dst, src, n, stream_of(model)), add_floats(dst, src, n));
}

// One layer of the KV buffer, head-major (R, N, hd), and the same numbers
// token-major, (N, R, hd): the regulariser reads the values so, and the K/V
// projections' GPU backward gathers its gradient so, for one product each.
// to_tokens, dst (N, R, hd) (+)= src (R, N, hd) transposed; else dst (R, N, hd) (+)= src (N, R, hd).
static inline void kv_transpose(float* dst, const float* src, int N, int R, int hd, bool to_tokens, bool accumulate) {
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
    int idx = blockIdx.x * blockDim.x + threadIdx.x;  // over (N, R, hd); 32-bit: see launch_check
    if (idx >= N * R * hd) return;
    int i = idx % hd, r = idx / hd % R, n = idx / hd / R, h = (r * N + n) * hd + i;
    float* y = dst + (to_tokens ? idx : h);
    float x = src[to_tokens ? h : idx];
    *y = accumulate ? *y + x : x;
}
static inline void kv_transpose_gpu(float* dst, const float* src, int N, int R, int hd, bool to_tokens, bool accumulate,
                             cudaStream_t stream) {
    LAUNCH(kv_transpose_kernel, ceil_div((size_t)N * R * hd, 256), 256, 0, stream)
        (dst, src, N, R, hd, to_tokens, accumulate);
    launchCheck();
}
#endif
static inline void op_kv_transpose(Model* model, float* dst, const float* src, int N, bool to_tokens, bool accumulate) {
    int R = model->c.R, hd = model->c.hd;
    DISPATCH(model, kv_transpose_gpu(dst, src, N, R, hd, to_tokens, accumulate, stream_of(model)),
             kv_transpose(dst, src, N, R, hd, to_tokens, accumulate));
}
