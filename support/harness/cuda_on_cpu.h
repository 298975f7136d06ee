// support/harness/cuda_on_cpu.h — CUDA on the CPU, so that lime.cu's kernels compile with
// g++ -DLIME_EMU and run, and can be tested, on a machine without a GPU.
//
// The model in one paragraph. A launch runs the grid's blocks one after
// another on the calling thread, in the order LIME_EMU_BLOCK_ORDER=forward|
// reverse|random (or emu::set_block_order; random is seeded like the threads'),
// so a block that reads what another block writes shows as a wrong answer
// under some order. Inside a block every CUDA thread is a fiber
// (ucontext: its own stack, its own registers) and the fibers are cooperative:
// a thread runs, uninterrupted, until it reaches __syncthreads(), a warp
// operation (__shfl_*_sync, __ballot_sync, __syncwarp ...) or its end; then the
// scheduler runs the next one. So the code between two barriers executes
// exactly as CUDA promises nothing about: in some order. Which order is yours
// to pick, forward, reverse or a seeded random permutation per barrier phase
// (env LIME_EMU_ORDER=forward|reverse|random, LIME_EMU_SEED=n, or
// emu::set_order) and a kernel that is right only by luck gives different
// answers under different orders. Shared memory is filled with NaN when each
// block starts, so reading a slot before anyone wrote it shows too.
//
// What this buys over plain loops: a barrier that some thread never reaches is
// reported as a deadlock (naming the kernel and the threads) instead of hanging,
// a warp operation waits for every lane its mask names (a mask naming lanes a
// partial warp lacks is an error with the kernel and line), launches are refused
// for the reasons CUDA refuses them, and cudaMalloc'd memory starts as NaN (and,
// with emu::poison_before_replay, chosen ranges again before each graph replay).
// Streams the program creates defer their work until something waits for it
// (section 5), so a missing cudaStreamWaitEvent, or a host read of a pinned
// buffer before its copy ran, gives a wrong or NaN value.
// Build with -fsanitize=address to catch out-of-bounds kernel accesses.
//
// The tensor cores (section 4): the warp-collective mma.sync shapes the kernels
// use (m16n8k8 .tf32 and m16n8k16 .bf16, float accumulators) run when all 32
// lanes have arrived, with the fragment layouts of the PTX manual; TF32 rounding
// is cvt.rna's; cp.async copies (__pipeline_memcpy_async) land only when their
// thread waits for their group, so a tile read before its wait, or by another
// thread before a barrier, is NaN. __nv_bfloat16 converts as CUDA's does
// (round to nearest even), and cublasGemmEx takes bf16 or float operands (float
// ones rounded to bf16 by CUBLAS_COMPUTE_32F_FAST_16BF, or to TF32).
//
// Not modelled: blocks or streams running at the same time (one thing runs at
// a time, in an order CUDA allows), the memory model (there is no cache to be
// stale), half types and bf16 arithmetic (bf16 converts; arithmetic is the
// float's), cooperative groups, dynamic parallelism, textures, cuBLASLt, timing.
#pragma once
#include <math.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__SANITIZE_ADDRESS__) && !defined(LIME_EMU_COUNT_BANKS)  // (the bank counter's build, section 3b, is not ASan)
#  define LIME_EMU_ASAN 1
#elif defined(__has_feature)
#  if __has_feature(address_sanitizer)
#    define LIME_EMU_ASAN 1
#  endif
#endif
#ifdef LIME_EMU_ASAN
#  include <sanitizer/asan_interface.h>
#  include <sanitizer/common_interface_defs.h>
#endif

// ===========================================================================
// 1. The language: qualifiers, vector types, built-in variables.

#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// __restrict__ is a g++/clang keyword already.

// Static __shared__ variables become static variables in a section of their
// own; the linker brackets it with __start_/__stop_ symbols, and every block
// start fills that range with NaN. One copy of each variable exists, so blocks
// must run one at a time (they do). `used` keeps the compiler from folding a
// never-written array to its zero initialiser.
// Limitation: g++ (12) drops the section attribute on static locals of
// function *templates*; in templated kernels, static __shared__ arrays are
// neither poisoned nor reset between blocks under g++ (clang++ honours it).
// Use DYNAMIC_SHARED there if that matters.
#define __shared__ static __attribute__((section("lime_emu_shared"), aligned(16), used))
extern "C" char __start_lime_emu_shared[] __attribute__((weak));
extern "C" char __stop_lime_emu_shared[] __attribute__((weak));

// Dynamic shared memory: a per-launch buffer of the requested bytes.
#define DYNAMIC_SHARED(type, name) type* name = reinterpret_cast<type*>(::emu::detail::machine.dyn.data())

struct uint3 { unsigned x, y, z; };
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};
struct __align__(8) float2 { float x, y; };
struct float3 { float x, y, z; };
struct __align__(16) float4 { float x, y, z, w; };
struct __align__(8) int2 { int x, y; };
struct int3 { int x, y, z; };
struct __align__(16) int4 { int x, y, z, w; };
struct __align__(8) uint2 { unsigned x, y; };
struct __align__(16) uint4 { unsigned x, y, z, w; };
struct __align__(16) double2 { double x, y; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float3 make_float3(float x, float y, float z) { return {x, y, z}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int2 make_int2(int x, int y) { return {x, y}; }
inline int3 make_int3(int x, int y, int z) { return {x, y, z}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return {x, y, z}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline double2 make_double2(double x, double y) { return {x, y}; }

// bfloat16 (cuda_bf16.h): float's sign and 8 exponent bits, 7 mantissa bits.
// From float: round to nearest, ties to even, overflow to infinity, subnormals
// kept, every NaN to 0x7fff (what __float2bfloat16 gives, on sm_80's cvt.rn.bf16.f32
// and on the host); to float: exact (the 16 bits, then 16 zeros). Conversions
// only: a kernel computes in float and rounds back, as the kernels here do.
struct __nv_bfloat16_raw { unsigned short x; };
inline unsigned short lime_emu_float_to_bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);                       // half an ulp, and the tie to the even side
    return (unsigned short)(u >> 16);
}
struct __nv_bfloat16 {
    unsigned short __x;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f) : __x(lime_emu_float_to_bf16_bits(f)) {}
    __nv_bfloat16(__nv_bfloat16_raw r) : __x(r.x) {}
    operator float() const { uint32_t u = (uint32_t)__x << 16; float f; memcpy(&f, &u, 4); return f; }
    operator __nv_bfloat16_raw() const { return {__x}; }
};
struct __align__(4) __nv_bfloat162 { __nv_bfloat16 x, y; };
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return (float)h; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16(__nv_bfloat16_raw{u}); }
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) { return {__nv_bfloat16(lo), __nv_bfloat16(hi)}; }
inline __nv_bfloat162 __float22bfloat162_rn(float2 f) { return {__nv_bfloat16(f.x), __nv_bfloat16(f.y)}; }
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return {(float)h.x, (float)h.y}; }
inline float __low2float(__nv_bfloat162 h) { return (float)h.x; }
inline float __high2float(__nv_bfloat162 h) { return (float)h.y; }

// The built-ins are ordinary globals: the scheduler sets threadIdx before it
// resumes a thread, blockIdx before each block. A kernel cannot keep a stale
// copy in a register across a barrier: the barrier is an opaque call.
inline uint3 threadIdx = {0, 0, 0}, blockIdx = {0, 0, 0};
inline dim3 blockDim, gridDim;
constexpr int warpSize = 32;

// ===========================================================================
// 2. Runtime types (names and values as in CUDA 13's driver_types.h).

enum cudaError_t {
    cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3, cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17, cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInvalidDeviceFunction = 98, cudaErrorNoDevice = 100, cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400, cudaErrorIllegalState = 401, cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700, cudaErrorLaunchOutOfResources = 701, cudaErrorLaunchFailure = 719,
    cudaErrorStreamCaptureUnsupported = 900, cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorStreamCaptureUnmatched = 903, cudaErrorStreamCaptureUnjoined = 904,
    cudaErrorStreamCaptureImplicit = 906, cudaErrorCapturedEvent = 907, cudaErrorUnknown = 999,
};
enum cudaMemcpyKind { cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2,
                      cudaMemcpyDeviceToDevice = 3, cudaMemcpyDefault = 4 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
                         cudaFuncAttributePreferredSharedMemoryCarveout = 9 };
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal = 0, cudaStreamCaptureModeThreadLocal = 1,
                             cudaStreamCaptureModeRelaxed = 2 };
enum cudaStreamCaptureStatus { cudaStreamCaptureStatusNone = 0, cudaStreamCaptureStatusActive = 1,
                               cudaStreamCaptureStatusInvalidated = 2 };
enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1, cudaDevAttrMaxSharedMemoryPerBlock = 8, cudaDevAttrWarpSize = 10,
    cudaDevAttrMultiProcessorCount = 16, cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76, cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaHostAllocDefault 0x00

// The subset of cudaDeviceProp a program is likely to read.
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem, sharedMemPerBlock, sharedMemPerBlockOptin, sharedMemPerMultiprocessor, totalConstMem;
    int regsPerBlock, warpSize, maxThreadsPerBlock, maxThreadsDim[3], maxGridSize[3];
    int major, minor, multiProcessorCount, maxThreadsPerMultiProcessor, l2CacheSize, memoryBusWidth;
};

struct CUstream_st; struct CUevent_st; struct CUgraph_st; struct CUgraphExec_st; struct CUgraphNode_st;
typedef CUstream_st* cudaStream_t;
typedef CUevent_st* cudaEvent_t;
typedef CUgraph_st* cudaGraph_t;
typedef CUgraphExec_st* cudaGraphExec_t;
typedef CUgraphNode_st* cudaGraphNode_t;
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)

// ===========================================================================
// 3. The machine: settings, errors, fibers and the block scheduler.

namespace emu {
enum Order { FORWARD, REVERSE, RANDOM };

namespace detail {

inline Order order_from_env(const char* var) {
    const char* o = getenv(var);
    if (!o || !strcmp(o, "forward")) return FORWARD;
    if (!strcmp(o, "reverse")) return REVERSE;
    if (!strcmp(o, "random")) return RANDOM;
    fprintf(stderr, "lime-emu: %s=%s unknown (forward, reverse or random), using forward\n", var, o);
    return FORWARD;
}

struct Settings {
    Order order = FORWARD;          // of the threads in a block, per barrier phase
    Order block_order = FORWARD;    // of the blocks in a grid
    uint64_t seed = 1;
    size_t stack_bytes = 64 << 10;  // per CUDA thread; kernels keep little on the stack
    bool quiet = false;             // stderr reports of failures
    Settings() {
        order = order_from_env("LIME_EMU_ORDER");
        block_order = order_from_env("LIME_EMU_BLOCK_ORDER");
        if (const char* s = getenv("LIME_EMU_SEED")) seed = strtoull(s, nullptr, 10);
        if (const char* k = getenv("LIME_EMU_STACK_KB")) stack_bytes = (size_t)atol(k) << 10;
        if (const char* q = getenv("LIME_EMU_QUIET")) quiet = atoi(q) != 0;
    }
};
inline Settings& settings() { static Settings s; return s; }

// Error state. CUDA's last error is what cudaGetLastError returns and clears;
// a kernel that fails (deadlock) also leaves a "pending" error that the next
// synchronisation returns, as a real asynchronous failure would. Unlike real
// hardware the failure is not sticky: the next launch works again.
inline cudaError_t last_error = cudaSuccess, pending_error = cudaSuccess;
inline std::string message;
inline long kernels_run = 0;

inline std::string vformat(const char* fmt, va_list ap) {
    char buf[1024];
    vsnprintf(buf, sizeof buf, fmt, ap);
    return buf;
}
// Say what went wrong: the text for emu::last_error_message, and on stderr.
inline void vreport(const char* fmt, va_list ap) {
    message = vformat(fmt, ap);
    if (!settings().quiet) fprintf(stderr, "lime-emu: %s\n", message.c_str());
}
// Record an error: the code for cudaGetLastError, the text as above.
inline cudaError_t fail(cudaError_t e, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
inline cudaError_t fail(cudaError_t e, const char* fmt, ...) {
    va_list ap; va_start(ap, fmt); vreport(fmt, ap); va_end(ap);
    return last_error = e;
}
inline void report(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline void report(const char* fmt, ...) { va_list ap; va_start(ap, fmt); vreport(fmt, ap); va_end(ap); }
inline bool no_device() { const char* v = getenv("LIME_EMU_NO_DEVICE"); return v && atoi(v) != 0; }
// The compute capability the device reports: 9.0, or LIME_EMU_SM=XY's X.Y (an older GPU, for its refusals).
inline int compute_capability() { const char* v = getenv("LIME_EMU_SM"); return v && atoi(v) >= 10 ? atoi(v) : 90; }

enum class State { READY, BARRIER, WARP, DONE };
enum WarpKind { W_SYNC, W_SHFL, W_UP, W_DOWN, W_XOR, W_BALLOT, W_ANY, W_ALL, W_MMA_TF32, W_MMA_BF16 };

// One cp.async copy still in flight: `bytes` land at dst when its thread waits
// for group `group`, the first src_bytes from src and zeros after them.
struct AsyncCopy { void* dst; const void* src; int bytes, src_bytes; long group; };

// One shared-memory access of a thread (section 3b): the instruction (its
// return address), the byte offset in its region (static section: bit 31 set),
// and its width in bytes.
struct SharedAccess { const void* site; uint32_t offset, bytes; };

struct Fiber {                  // one CUDA thread
    ucontext_t ctx;
    void* fake_stack = nullptr; // ASan's bookkeeping for this stack
    uint3 tid = {0, 0, 0};
    int lin = 0;                // x + y*bx + z*bx*by: lane = lin % 32, warp = lin / 32
    State state = State::READY;
    long done_phase = -1;       // the scheduling phase in which it exited
    const char* op = "";        // where it waits: operation, file, line
    const char* file = "";
    int line = 0;
    WarpKind kind = W_SYNC;     // what a warp operation needs: mask, value, argument
    unsigned mask = 0;
    uint64_t value = 0, result = 0;
    int arg = 0, width = 32;
    const uint32_t* mma_a = nullptr;  // an mma's fragments: this lane's registers of A, B, C and D
    const uint32_t* mma_b = nullptr;
    const float* mma_c = nullptr;
    float* mma_d = nullptr;
    std::vector<AsyncCopy> copies;    // its cp.async copies not yet waited for
    long groups = 0;                  // the cp.async groups it has committed
    std::vector<SharedAccess> shared; // its shared-memory accesses since the last barrier (LIME_EMU_BANKS=1)
};

struct Machine {
    std::vector<Fiber> fibers;
    std::vector<char*> stacks;          // lowest usable byte of each; one guard page below
    size_t stack_bytes = 0;
    std::vector<int> order;
    ucontext_t scheduler;
    Fiber* cur = nullptr;               // the running thread, nullptr on the host
    const std::function<void()>* body = nullptr;
    const void* host_stack = nullptr;   // the scheduler's stack, for ASan
    size_t host_stack_bytes = 0;
    const char* kernel = "";
    long phase = 0;                     // scheduling phases run in this block
    bool failed = false;
    uint64_t copy_rng = 0;              // random order: which cp.async copies land early (seeded per block)
    std::vector<unsigned char> dyn;     // dynamic shared memory
    ~Machine() { release_stacks(); }
    void release_stacks() {
        for (char* s : stacks) munmap(s - getpagesize(), stack_bytes + getpagesize());
        stacks.clear();
    }
};
inline Machine machine;

// --- switching between the scheduler and a fiber -------------------------
// ASan must be told about every stack switch, or it mistakes the fiber's stack
// for a corrupted one; these wrappers do that and nothing else.
inline void asan_start(void** save, const void* bottom, size_t size) {
#ifdef LIME_EMU_ASAN
    __sanitizer_start_switch_fiber(save, bottom, size);
#else
    (void)save; (void)bottom; (void)size;
#endif
}
inline void asan_finish(void* save, const void** bottom, size_t* size) {
#ifdef LIME_EMU_ASAN
    __sanitizer_finish_switch_fiber(save, bottom, size);
#else
    (void)save; (void)bottom; (void)size;
#endif
}

inline void fiber_main() {  // the first frame of every CUDA thread
    Machine& m = machine;
    asan_finish(nullptr, &m.host_stack, &m.host_stack_bytes);
    (*m.body)();
    m.cur->state = State::DONE;
    m.cur->done_phase = m.phase;
    asan_start(nullptr, m.host_stack, m.host_stack_bytes);  // nullptr: this stack is finished
    setcontext(&m.scheduler);
}
inline void resume(Fiber& f) {  // scheduler -> thread f, until it waits or ends
    Machine& m = machine;
    m.cur = &f;
    ::threadIdx = f.tid;
    void* save = nullptr;
    asan_start(&save, m.stacks[f.lin], m.stack_bytes);
    swapcontext(&m.scheduler, &f.ctx);
    asan_finish(save, nullptr, nullptr);
    m.cur = nullptr;
}
inline void yield(Fiber& f) {   // thread f -> scheduler; returns when resumed
    Machine& m = machine;
    asan_start(&f.fake_stack, m.host_stack, m.host_stack_bytes);
    swapcontext(&f.ctx, &m.scheduler);
    asan_finish(f.fake_stack, nullptr, nullptr);
}
inline Fiber& current(const char* op) {
    if (!machine.cur) { fprintf(stderr, "lime-emu: %s called outside a kernel\n", op); abort(); }
    return *machine.cur;
}
inline const char* base_name(const char* path) { const char* s = strrchr(path, '/'); return s ? s + 1 : path; }

// A thread misused a warp operation: fail the launch, and park the thread for
// good. (A parked thread's stack is reused without unwinding, so nothing on it
// may own heap memory: hence a char buffer, not a std::string.)
[[noreturn]] inline void misuse(Fiber& f, const char* fmt, ...) {
    char what[512];
    va_list ap; va_start(ap, fmt); vsnprintf(what, sizeof what, fmt, ap); va_end(ap);
    fail(cudaErrorLaunchFailure, "in kernel %s: block (%u,%u,%u) thread (%u,%u,%u) at %s:%d: %s", machine.kernel,
         blockIdx.x, blockIdx.y, blockIdx.z, f.tid.x, f.tid.y, f.tid.z, base_name(f.file), f.line, what);
    machine.failed = true;
    f.state = State::DONE;
    yield(f);
    abort();  // never resumed
}

// --- the block scheduler ---------------------------------------------------
inline uint64_t splitmix(uint64_t& s) {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

inline bool ensure_stacks(int n) {  // allocated once, reused by every later launch
    Machine& m = machine;
    size_t page = getpagesize();
    size_t bytes = (settings().stack_bytes + page - 1) / page * page;
    if (bytes != m.stack_bytes) { m.release_stacks(); m.stack_bytes = bytes; }
    while ((int)m.stacks.size() < n) {
        // A guard page below the stack turns an overflow into a segfault
        // instead of silently corrupting the neighbouring stack.
        void* p = mmap(nullptr, bytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return false;
        mprotect(p, page, PROT_NONE);
        m.stacks.push_back((char*)p + page);
    }
    return true;
}

// The description of thread f for a deadlock message: "(x,y,z) has exited" etc.
inline std::string describe(const Fiber& f) {
    char b[400];
    int n = snprintf(b, sizeof b, "thread (%u,%u,%u) ", f.tid.x, f.tid.y, f.tid.z);
    if (f.state == State::DONE) snprintf(b + n, sizeof b - n, "has exited");
    else if (f.state == State::BARRIER) snprintf(b + n, sizeof b - n, "waits at %s at %s:%d", f.op, base_name(f.file), f.line);
    else snprintf(b + n, sizeof b - n, "waits at %s(mask 0x%08x) at %s:%d", f.op, f.mask, base_name(f.file), f.line);
    return b;
}
inline bool same_barrier(const Fiber& a, const Fiber& b) {
    return b.state == State::BARRIER && a.line == b.line && !strcmp(a.op, b.op) && !strcmp(a.file, b.file);
}
inline unsigned lanes_present(int warp0, int n) { return n - warp0 >= 32 ? ~0u : (1u << (n - warp0)) - 1; }

// The tensor cores' mma.sync, once all 32 lanes of the warp have arrived:
//   D (16 x 8) = A (16 x K) B (K x 8) + C (16 x 8),  K = 8 (.tf32) or 16 (.bf16),
// each lane holding the elements the PTX manual's fragment tables give it
// (groupID g = lane / 4, threadID_in_group t = lane % 4):
//   .m16n8k8 .tf32:  A a0 (g, t)  a1 (g+8, t)  a2 (g, t+4)  a3 (g+8, t+4);   B b0 (t, g)  b1 (t+4, g)
//   .m16n8k16 .bf16: A, 2 per register (low half first): a0 a1 (g, 2t + 0|1)  a2 a3 (g+8, 2t + 0|1)
//                    a4 a5 (g, 2t+8 + 0|1)  a6 a7 (g+8, 2t+8 + 0|1);   B b0 b1 (2t + 0|1, g)  b2 b3 (2t+8 + 0|1, g)
//   C, D (both):     c0 (g, 2t)  c1 (g, 2t+1)  c2 (g+8, 2t)  c3 (g+8, 2t+1)
// A .tf32 operand is read as its top 19 bits (sign, exponent, 10 mantissa
// bits): a kernel rounds each one first with cvt.rna.tf32.f32 (what a tensor
// core does with bits left below those is not specified, and no kernel relies
// on it). The products are exact (11 x 11 or 8 x 8 significant bits fit a
// float's 24); their sum over k, in k order, and C are added in double and
// rounded once to float. A tensor core's adder rounds differently (not
// specified): results agree to a float's rounding, not bit for bit, so tests
// compare products at float tolerance; the order is fixed, so the same inputs
// always give the same bits here.
inline float tf32_operand(uint32_t bits) { bits &= 0xffffe000u; float x; memcpy(&x, &bits, 4); return x; }
inline float bf16_operand(uint32_t reg, int high) {
    uint32_t bits = (high ? reg >> 16 : reg & 0xffffu) << 16;
    float x;
    memcpy(&x, &bits, 4);
    return x;
}
inline void mma_complete(Fiber* lanes, WarpKind kind) {
    const int K = kind == W_MMA_TF32 ? 8 : 16;
    float A[16][16], B[16][8], C[16][8];
    for (int lane = 0; lane < 32; lane++) {
        const Fiber& f = lanes[lane];
        int g = lane / 4, t = lane % 4;
        if (kind == W_MMA_TF32) {
            A[g][t] = tf32_operand(f.mma_a[0]);
            A[g + 8][t] = tf32_operand(f.mma_a[1]);
            A[g][t + 4] = tf32_operand(f.mma_a[2]);
            A[g + 8][t + 4] = tf32_operand(f.mma_a[3]);
            B[t][g] = tf32_operand(f.mma_b[0]);
            B[t + 4][g] = tf32_operand(f.mma_b[1]);
        } else {
            for (int i = 0; i < 8; i++) {  // a_i is half i % 2 of register i / 2
                int row = g + ((i / 2) % 2) * 8, col = 2 * t + i % 2 + (i >= 4 ? 8 : 0);
                A[row][col] = bf16_operand(f.mma_a[i / 2], i % 2);
            }
            for (int i = 0; i < 4; i++) B[2 * t + i % 2 + (i >= 2 ? 8 : 0)][g] = bf16_operand(f.mma_b[i / 2], i % 2);
        }
        for (int i = 0; i < 4; i++) C[g + (i / 2) * 8][2 * t + i % 2] = f.mma_c[i];
    }
    for (int lane = 0; lane < 32; lane++) {  // every lane's C was read above: D may be C's registers
        int g = lane / 4, t = lane % 4;
        for (int i = 0; i < 4; i++) {
            int row = g + (i / 2) * 8, col = 2 * t + i % 2;
            double sum = 0;
            for (int k = 0; k < K; k++) sum += (double)A[row][k] * B[k][col];
            lanes[lane].mma_d[i] = (float)(sum + C[row][col]);
        }
    }
}

// Complete every warp operation whose mask's lanes have all arrived at it.
// Returns how many threads were released.
inline int complete_warp_ops(int n) {
    std::vector<Fiber>& F = machine.fibers;
    int released = 0;
    for (int w0 = 0; w0 < n; w0 += 32) {
        unsigned present = lanes_present(w0, n);  // a partial last warp has fewer lanes
        for (int l = 0; w0 + l < n; l++) {
            Fiber& f = F[w0 + l];
            if (f.state != State::WARP) continue;
            unsigned mask = f.mask & present;
            bool all = true;
            for (int j = 0; j < 32 && all; j++)
                if (mask >> j & 1) {
                    const Fiber& g = F[w0 + j];
                    all = g.state == State::WARP && g.kind == f.kind && (g.mask & present) == mask;
                }
            if (!all) continue;
            if (f.kind == W_MMA_TF32 || f.kind == W_MMA_BF16) mma_complete(&F[w0], f.kind);
            uint64_t vote = 0, count = 0;
            for (int j = 0; j < 32; j++)
                if (mask >> j & 1 && F[w0 + j].value) { vote |= 1ull << j; count++; }
            for (int j = 0; j < 32; j++) {
                if (!(mask >> j & 1)) continue;
                Fiber& g = F[w0 + j];
                int seg = j & ~(g.width - 1), src = j;   // shuffles work within segments of `width` lanes
                switch (g.kind) {
                case W_SHFL: src = seg + (g.arg & (g.width - 1)); break;
                case W_UP:   src = (j - seg) >= g.arg ? j - g.arg : j; break;
                case W_DOWN: src = (j - seg) + g.arg < g.width ? j + g.arg : j; break;
                case W_XOR:  src = (j ^ g.arg) < seg + g.width ? j ^ g.arg : j; break;
                default: break;
                }
                if (g.kind == W_BALLOT) g.result = vote;
                else if (g.kind == W_ANY) g.result = count > 0;
                else if (g.kind == W_ALL) g.result = count == (uint64_t)__builtin_popcount(mask);
                else if (src < 0 || src > 31 || !(mask >> src & 1)) g.result = ~0ull;  // undefined in CUDA: poison
                else g.result = F[w0 + src].value;
            }
            for (int j = 0; j < 32; j++)
                if (mask >> j & 1) { F[w0 + j].state = State::READY; released++; }
        }
    }
    return released;
}

inline void report_deadlock(int n) {
    std::vector<Fiber>& F = machine.fibers;
    int w = 0;
    while (F[w].state == State::DONE) w++;   // the first thread still waiting
    const Fiber* culprit = nullptr;          // one that keeps it waiting
    if (F[w].state == State::BARRIER) {
        for (int i = 0; i < n && !culprit; i++) if (!same_barrier(F[w], F[i])) culprit = &F[i];
    } else {
        int w0 = w & ~31;
        unsigned mask = F[w].mask & lanes_present(w0, n);
        for (int j = 0; j < 32 && !culprit; j++) {
            const Fiber& g = F[w0 + j];
            if (mask >> j & 1 && !(g.state == State::WARP && g.kind == F[w].kind &&
                                   (g.mask & lanes_present(w0, n)) == mask)) culprit = &g;
        }
    }
    if (!culprit) culprit = &F[w];
    fail(cudaErrorLaunchFailure, "deadlock in kernel %s: block (%u,%u,%u) %s while %s", machine.kernel,
         blockIdx.x, blockIdx.y, blockIdx.z, describe(F[w]).c_str(), describe(*culprit).c_str());
}

// Make thread i ready to run from the top of the kernel on its own stack.
// (Its own function: getcontext "returns twice", which would make the
// compiler distrust the caller's locals.)
__attribute__((noinline)) inline void start_fiber(int i) {
    Machine& m = machine;
    Fiber& f = m.fibers[i];
    f.lin = i;
    f.tid = {i % blockDim.x, (i / blockDim.x) % blockDim.y, i / (blockDim.x * blockDim.y)};
    f.state = State::READY;
    f.done_phase = -1;
    f.fake_stack = nullptr;
    f.copies.clear();  // a thread's copies die with its block's shared memory
    f.shared.clear();
    f.groups = 0;
#ifdef LIME_EMU_ASAN
    // An abandoned (deadlocked) thread leaves its frames' redzones behind.
    __asan_unpoison_memory_region(m.stacks[i], m.stack_bytes);
#endif
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = m.stacks[i];
    f.ctx.uc_stack.ss_size = m.stack_bytes;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_main, 0);
}

// --- 3b. Shared-memory bank conflicts (LIME_EMU_BANKS=1) ---------------------
// Shared memory is 32 banks of 4-byte words; a warp's request is served in as
// many wavefronts ("ways") as the most distinct words any one bank is asked
// for (lanes reading the same word share it: a broadcast). A 64-bit access is
// served a half-warp at a time, a 128-bit one a quarter-warp at a time, each
// part counted on its own (the CUDA C++ Programming Guide's "Shared Memory"
// sections for compute capability 5.x and later, and its 64-bit rule of 3.x).
// The build that counts (make's lime_emu.o, test_gpu_emu and test_emu)
// compiles with g++ -fsanitize=kernel-address and outlined checks, so every load
// and store calls __asan_{load,store}N_noabort (defined below under
// LIME_EMU_COUNT_BANKS); those inside the block's shared memory are noted on
// the running thread with the instruction's address. The fibers run from
// barrier to barrier, so at each __syncthreads and at the block's end every
// lane of a warp has noted its accesses since the last one: the k-th access of
// one instruction by each lane of a warp forms one request (a loop's i-th
// iteration with the others' i-th), its ways counted as above, and the
// kernel's worst, mean and count of requests kept. cp.async copies count as
// stores when issued. The accesses are g++'s, not nvcc's: a struct (float4)
// whose fields g++ uses one by one may be loaded as four 4-byte accesses where
// nvcc makes one 16-byte one; a second access to the same address in one basic
// block is not checked again (a load then a store of one word count once); and
// bytes moved by memcpy are not seen. Nor are static __shared__ arrays of
// function templates (g++ drops their section, see above).
struct KernelBanks { int worst = 0; double ways = 0; long requests = 0; };
inline int banks_setting() {  // LIME_EMU_BANKS: 0 (default) or 1; anything else is refused at start
    const char* v = getenv("LIME_EMU_BANKS");
    if (!v || !strcmp(v, "0") || !*v) return 0;
    if (!strcmp(v, "1")) return 1;
    fprintf(stderr, "lime-emu: LIME_EMU_BANKS=%s: use 0 or 1 (1 prints each kernel's shared-memory bank conflicts)\n", v);
    exit(2);
}
inline bool count_banks = banks_setting() != 0;
inline std::map<std::string, KernelBanks> bank_counts;  // per kernel name

// The ways of one request: lanes' (offset, bytes), lane index first.
inline int request_ways(const std::vector<std::pair<int, SharedAccess>>& lanes) {
    uint32_t widest = 0;
    for (const auto& l : lanes) widest = std::max(widest, l.second.bytes);
    int part = widest > 8 ? 8 : widest > 4 ? 16 : 32;  // lanes served together
    int ways = 0;
    for (int p0 = 0; p0 < 32; p0 += part) {
        std::vector<uint32_t> words[32];  // distinct words asked of each bank
        for (const auto& l : lanes) {
            if (l.first < p0 || l.first >= p0 + part) continue;
            uint32_t first = l.second.offset >> 2, last = (l.second.offset + l.second.bytes - 1) >> 2;
            for (uint32_t w = first; w <= last; w++) {
                std::vector<uint32_t>& b = words[w & 31];
                if (std::find(b.begin(), b.end(), w) == b.end()) b.push_back(w);
            }
        }
        for (const auto& b : words) ways = std::max(ways, (int)b.size());
    }
    return ways;
}
// Group the block's noted accesses into requests and count them (n threads).
inline void count_bank_requests(int n) {
    std::vector<Fiber>& F = machine.fibers;
    KernelBanks* k = nullptr;
    for (int w0 = 0; w0 < n; w0 += 32) {
        std::map<std::pair<const void*, int>, std::vector<std::pair<int, SharedAccess>>> requests;
        for (int l = 0; l < 32 && w0 + l < n; l++) {
            std::map<const void*, int> seen;  // how often this lane ran each instruction
            for (const SharedAccess& a : F[w0 + l].shared) requests[{a.site, seen[a.site]++}].push_back({l, a});
            F[w0 + l].shared.clear();
        }
        if (requests.empty()) continue;
        if (!k) k = &bank_counts[machine.kernel];
        for (const auto& r : requests) {
            int ways = request_ways(r.second);
            k->worst = std::max(k->worst, ways);
            k->ways += ways;
            k->requests++;
        }
    }
}
// After the program's output: one line per kernel that touched shared memory.
struct BankReport {
    ~BankReport() {
        for (const auto& [name, k] : bank_counts)
            printf("banks %s worst %d-way mean %.2f-way accesses %ld\n", name.c_str(), k.worst,
                   k.requests ? k.ways / k.requests : 0.0, k.requests);
        fflush(stdout);
    }
};
inline BankReport bank_report;
// A thread's access of [a, a + bytes): noted when it lies in shared memory.
__attribute__((no_sanitize_address)) inline void note_shared(uintptr_t a, uint32_t bytes, const void* site) {
    Machine& m = machine;
    if (!count_banks || !m.cur) return;
    for (uint32_t k = 1; bytes > 16; k++, a += 16, bytes -= 16)  // g++'s vector of a lane's loop: 16-byte loads
        note_shared(a, 16, (const void*)((uintptr_t)site ^ ((uintptr_t)k << 56)));  // (a site of their own each)
    uintptr_t dyn = (uintptr_t)m.dyn.data(), stat = (uintptr_t)__start_lime_emu_shared;
    if (dyn && a - dyn < m.dyn.size()) m.cur->shared.push_back({site, (uint32_t)(a - dyn), bytes});
    else if (stat && a - stat < (uintptr_t)(__stop_lime_emu_shared - __start_lime_emu_shared))
        m.cur->shared.push_back({site, (uint32_t)(a - stat) | 0x80000000u, bytes});
}

// Run one block to completion. false: it failed (the error is recorded).
inline bool run_block(int n, uint64_t block_id) {
    Machine& m = machine;
    // Poison all shared memory: static (the section) and dynamic.
    if (__start_lime_emu_shared) memset(__start_lime_emu_shared, 0xFF, __stop_lime_emu_shared - __start_lime_emu_shared);
    if (!m.dyn.empty()) memset(m.dyn.data(), 0xFF, m.dyn.size());
    for (int i = 0; i < n; i++) start_fiber(i);
    uint64_t rng = settings().seed * 0x2545F4914F6CDD1Dull + block_id;  // same seed, same schedule
    m.copy_rng = rng ^ 0x5851F42D4C957F2Dull;
    for (;;) {
        // One phase: run every ready thread, in the chosen order, until it waits or ends.
        m.phase++;
        m.order.clear();
        for (int i = 0; i < n; i++) if (m.fibers[i].state == State::READY) m.order.push_back(i);
        if (settings().order == REVERSE) std::reverse(m.order.begin(), m.order.end());
        if (settings().order == RANDOM)
            for (size_t i = m.order.size(); i > 1; i--) std::swap(m.order[i - 1], m.order[splitmix(rng) % i]);
        for (int i : m.order) {
            resume(m.fibers[i]);
            if (m.failed) return false;
        }
        // Now every thread waits or is done. Warp operations first: they need only their lanes.
        if (complete_warp_ops(n) > 0) continue;
        int done = 0, waiting = 0;
        for (int i = 0; i < n; i++) {
            done += m.fibers[i].state == State::DONE;
            waiting += same_barrier(m.fibers[0], m.fibers[i]);
        }
        if (count_banks && (done == n || waiting == n)) count_bank_requests(n);
        if (done == n) return true;
        if (waiting == n) {   // __syncthreads: everyone arrived at the same one
            uint64_t count = 0;
            for (int i = 0; i < n; i++) count += m.fibers[i].value != 0;
            for (int i = 0; i < n; i++) { m.fibers[i].state = State::READY; m.fibers[i].result = count; }
            continue;
        }
        report_deadlock(n);
        return false;
    }
}

// The order the grid's blocks run in (linear ids x + y*gx + z*gx*gy): forward,
// reverse, or a permutation seeded by the seed and the count of grids run, so
// one seed replays one schedule and each launch gets its own.
inline std::vector<uint64_t> only_blocks;  // emu::run_only_blocks: these blocks of each grid alone
inline std::vector<uint64_t> block_sequence(uint64_t blocks) {
    if (!only_blocks.empty()) {
        std::vector<uint64_t> ids;
        for (uint64_t id : only_blocks) if (id < blocks) ids.push_back(id);
        return ids;
    }
    std::vector<uint64_t> ids(blocks);
    for (uint64_t i = 0; i < blocks; i++) ids[i] = i;
    Order o = settings().block_order;
    if (o == REVERSE) std::reverse(ids.begin(), ids.end());
    if (o == RANDOM) {
        uint64_t rng = settings().seed * 0x9E3779B97F4A7C15ull + (uint64_t)kernels_run;
        for (uint64_t i = blocks; i > 1; i--) std::swap(ids[i - 1], ids[splitmix(rng) % i]);
    }
    return ids;
}

inline bool run_grid(const char* name, dim3 grid, dim3 block, size_t smem, const std::function<void()>& body) {
    Machine& m = machine;
    if (m.cur) return fail(cudaErrorLaunchFailure, "kernel %s launched from inside a kernel: not supported", name), false;
    int n = block.x * block.y * block.z;
    if (!ensure_stacks(n))
        return fail(cudaErrorLaunchOutOfResources, "kernel %s: no memory for %d thread stacks", name, n), false;
    if ((int)m.fibers.size() < n) m.fibers.resize(n);
    m.dyn.assign(smem, 0);
    m.body = &body;
    m.kernel = name;
    m.failed = false;
    gridDim = grid;
    blockDim = block;
    kernels_run++;
    for (uint64_t id : block_sequence((uint64_t)grid.x * grid.y * grid.z)) {
        blockIdx = {(unsigned)(id % grid.x), (unsigned)(id / grid.x % grid.y), (unsigned)(id / grid.x / grid.y)};
        if (!run_block(n, id)) {
            m.failed = true;
            pending_error = cudaErrorLaunchFailure;
            return false;
        }
    }
    return true;
}

// --- thread-side entry points for barriers and warp operations -------------
inline uint64_t barrier(const char* op, int pred, const char* file, int line) {
    Fiber& f = current(op);
    f.state = State::BARRIER; f.op = op; f.file = file; f.line = line; f.value = pred != 0;
    yield(f);
    return f.result;  // how many threads passed a nonzero predicate
}
inline uint64_t warp_op(WarpKind kind, const char* op, unsigned mask, uint64_t value, int arg, int width,
                        const char* file, int line) {
    Fiber& f = current(op);
    f.file = file; f.line = line;
    if (!(mask >> (f.lin & 31) & 1)) misuse(f, "%s: mask 0x%08x does not name the calling lane %d", op, mask, f.lin & 31);
    if (width < 1 || width > 32 || (width & (width - 1))) misuse(f, "%s: width %d is not a power of two <= 32", op, width);
    int w0 = f.lin & ~31, n = (int)(blockDim.x * blockDim.y * blockDim.z);
    if (mask & ~lanes_present(w0, n))  // on a GPU: undefined (lanes that do not exist never arrive)
        misuse(f, "%s: mask 0x%08x names lanes this partial warp lacks (it has %d threads: mask 0x%08x at most)", op,
               mask, n - w0, lanes_present(w0, n));
    f.state = State::WARP; f.kind = kind; f.op = op; f.mask = mask; f.value = value; f.arg = arg; f.width = width;
    yield(f);
    return f.result;
}
// mma.sync: the warp's 32 lanes together (.aligned: all of them, at the same
// instruction), each giving its fragments; the results land in d when the last arrives.
inline void mma_op(WarpKind kind, const char* op, float* d, const uint32_t* a, const uint32_t* b, const float* c,
                   const char* file, int line) {
    Fiber& f = current(op);
    f.file = file; f.line = line;
    int w0 = f.lin & ~31, n = (int)(blockDim.x * blockDim.y * blockDim.z);
    if (n - w0 < 32) misuse(f, "%s needs a whole warp of 32 threads; this warp has %d", op, n - w0);
    f.state = State::WARP; f.kind = kind; f.op = op; f.mask = ~0u; f.value = 0; f.arg = 0; f.width = 32;
    f.mma_a = a; f.mma_b = b; f.mma_c = c; f.mma_d = d;
    yield(f);
}
inline bool on_device(const void* p, size_t n);  // section 5: is [p, p + n) inside one device allocation?
// Is [p, p + n) inside the block's shared memory (the static section or the launch's dynamic buffer)?
inline bool in_shared(const void* p, size_t n) {
    auto inside_range = [&](const void* lo, size_t size) {
        return lo && (const char*)p >= (const char*)lo && (const char*)p + n <= (const char*)lo + size;
    };
    return inside_range(machine.dyn.data(), machine.dyn.size()) ||
           (__start_lime_emu_shared && inside_range(__start_lime_emu_shared, __stop_lime_emu_shared - __start_lime_emu_shared));
}
template <class T> uint64_t to_bits(const T& v) {
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8, "warp shuffles move values of up to 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof(T));
    return b;
}
template <class T> T from_bits(uint64_t b) { T v; memcpy(&v, &b, sizeof(T)); return v; }
template <class F> const void* key_of(F* f) { const void* p; static_assert(sizeof p == sizeof f, ""); memcpy(&p, &f, sizeof p); return p; }
}  // namespace detail

// --- the harness's own API for tests ---------------------------------------
inline void set_order(Order o, uint64_t seed = 1) { detail::settings().order = o; detail::settings().seed = seed; }
inline Order order() { return detail::settings().order; }
inline void set_block_order(Order o) { detail::settings().block_order = o; }  // the seed is set_order's
inline Order block_order() { return detail::settings().block_order; }
inline void set_stack_size(size_t bytes) { detail::settings().stack_bytes = bytes; }
inline void set_quiet(bool q) { detail::settings().quiet = q; }
inline const char* last_error_message() { return detail::message.c_str(); }
inline long kernels_run() { return detail::kernels_run; }  // grids executed so far
// Shared-memory bank conflicts (section 3b): count them from now on (LIME_EMU_BANKS=1 at start),
// a kernel's counts so far (zero if it touched no shared memory), and forget them.
inline void set_count_banks(bool on) { detail::count_banks = on; }
inline detail::KernelBanks bank_counts(const char* kernel) {
    auto it = detail::bank_counts.find(kernel);
    return it == detail::bank_counts.end() ? detail::KernelBanks{} : it->second;
}
inline void clear_bank_counts() { detail::bank_counts.clear(); }
// Run only these blocks (linear ids, in this order) of every grid from now on; {} runs all again.
// For a test of a grid too large to run whole here: its first and last blocks, say.
inline void run_only_blocks(std::vector<uint64_t> ids) { detail::only_blocks = std::move(ids); }
}  // namespace emu

// ===========================================================================
// 4. Device functions: barriers, warp operations, atomics, math.
// __FILE__/__LINE__ of the caller come in through defaulted arguments, so a
// deadlock report can say which barrier each thread waits at.
#define LIME_EMU_WHERE const char* file_ = __builtin_FILE(), int line_ = __builtin_LINE()

inline void __syncthreads(LIME_EMU_WHERE) { emu::detail::barrier("__syncthreads()", 0, file_, line_); }
inline int __syncthreads_count(int p, LIME_EMU_WHERE) { return (int)emu::detail::barrier("__syncthreads_count()", p, file_, line_); }
inline int __syncthreads_and(int p, LIME_EMU_WHERE) {
    return emu::detail::barrier("__syncthreads_and()", p, file_, line_) == (uint64_t)blockDim.x * blockDim.y * blockDim.z;
}
inline int __syncthreads_or(int p, LIME_EMU_WHERE) { return emu::detail::barrier("__syncthreads_or()", p, file_, line_) > 0; }
// Threads switch only at barriers, so memory is always coherent: fences are no-ops.
inline void __threadfence() {}
inline void __threadfence_block() {}

inline void __syncwarp(unsigned mask = 0xffffffffu, LIME_EMU_WHERE) {
    emu::detail::warp_op(emu::detail::W_SYNC, "__syncwarp", mask, 0, 0, 32, file_, line_);
}
template <class T> T __shfl_sync(unsigned mask, T var, int src, int width = warpSize, LIME_EMU_WHERE) {
    using namespace emu::detail;
    return from_bits<T>(warp_op(W_SHFL, "__shfl_sync", mask, to_bits(var), src, width, file_, line_));
}
template <class T> T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize, LIME_EMU_WHERE) {
    using namespace emu::detail;
    return from_bits<T>(warp_op(W_UP, "__shfl_up_sync", mask, to_bits(var), (int)delta, width, file_, line_));
}
template <class T> T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize, LIME_EMU_WHERE) {
    using namespace emu::detail;
    return from_bits<T>(warp_op(W_DOWN, "__shfl_down_sync", mask, to_bits(var), (int)delta, width, file_, line_));
}
template <class T> T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize, LIME_EMU_WHERE) {
    using namespace emu::detail;
    return from_bits<T>(warp_op(W_XOR, "__shfl_xor_sync", mask, to_bits(var), lane_mask, width, file_, line_));
}
inline unsigned __ballot_sync(unsigned mask, int pred, LIME_EMU_WHERE) {
    return (unsigned)emu::detail::warp_op(emu::detail::W_BALLOT, "__ballot_sync", mask, pred != 0, 0, 32, file_, line_);
}
inline int __any_sync(unsigned mask, int pred, LIME_EMU_WHERE) {
    return (int)emu::detail::warp_op(emu::detail::W_ANY, "__any_sync", mask, pred != 0, 0, 32, file_, line_);
}
inline int __all_sync(unsigned mask, int pred, LIME_EMU_WHERE) {
    return (int)emu::detail::warp_op(emu::detail::W_ALL, "__all_sync", mask, pred != 0, 0, 32, file_, line_);
}
// The lanes of the caller's warp still running when this phase began: a lane
// that ran ahead to its end in this phase counts, as it would be converged
// with the caller on a GPU. Not a synchronisation.
inline unsigned __activemask() {
    using namespace emu::detail;
    const Fiber& f = current("__activemask");
    int w0 = f.lin & ~31, n = (int)(blockDim.x * blockDim.y * blockDim.z);
    unsigned m = 0;
    for (int j = 0; j < 32 && w0 + j < n; j++) {
        const Fiber& g = machine.fibers[w0 + j];
        if (g.state != State::DONE || g.done_phase == machine.phase) m |= 1u << j;
    }
    return m;
}

// Atomics. A thread is never interrupted between two barriers, and blocks run
// one at a time, so a plain read-modify-write already is atomic here.
#define LIME_EMU_ATOMIC(name, T, expr) inline T name(T* a, T v) { T old = *a; *a = (expr); return old; }
LIME_EMU_ATOMIC(atomicAdd, int, old + v)
LIME_EMU_ATOMIC(atomicAdd, unsigned, old + v)
LIME_EMU_ATOMIC(atomicAdd, unsigned long long, old + v)
LIME_EMU_ATOMIC(atomicAdd, float, old + v)
LIME_EMU_ATOMIC(atomicAdd, double, old + v)
LIME_EMU_ATOMIC(atomicSub, int, old - v)
LIME_EMU_ATOMIC(atomicSub, unsigned, old - v)
LIME_EMU_ATOMIC(atomicMax, int, std::max(old, v))
LIME_EMU_ATOMIC(atomicMax, unsigned, std::max(old, v))
LIME_EMU_ATOMIC(atomicMax, unsigned long long, std::max(old, v))
LIME_EMU_ATOMIC(atomicMin, int, std::min(old, v))
LIME_EMU_ATOMIC(atomicMin, unsigned, std::min(old, v))
LIME_EMU_ATOMIC(atomicMin, unsigned long long, std::min(old, v))
LIME_EMU_ATOMIC(atomicExch, int, v)
LIME_EMU_ATOMIC(atomicExch, unsigned, v)
LIME_EMU_ATOMIC(atomicExch, unsigned long long, v)
LIME_EMU_ATOMIC(atomicExch, float, v)
LIME_EMU_ATOMIC(atomicAnd, int, old & v)
LIME_EMU_ATOMIC(atomicAnd, unsigned, old & v)
LIME_EMU_ATOMIC(atomicOr, int, old | v)
LIME_EMU_ATOMIC(atomicOr, unsigned, old | v)
LIME_EMU_ATOMIC(atomicXor, int, old ^ v)
LIME_EMU_ATOMIC(atomicXor, unsigned, old ^ v)
#undef LIME_EMU_ATOMIC
inline int atomicCAS(int* a, int cmp, int v) { int old = *a; if (old == cmp) *a = v; return old; }
inline unsigned atomicCAS(unsigned* a, unsigned cmp, unsigned v) { unsigned old = *a; if (old == cmp) *a = v; return old; }
inline unsigned long long atomicCAS(unsigned long long* a, unsigned long long cmp, unsigned long long v) {
    unsigned long long old = *a; if (old == cmp) *a = v; return old;
}

// --- the tensor cores and asynchronous copies -----------------------------
// PTX instructions a kernel reaches through inline assembly under nvcc have
// their emulation here, named after the instruction (the kernel's wrapper
// calls it under LIME_EMU); cp.async is CUDA's own API (cuda_pipeline_primitives.h).
namespace emu {
// cvt.rna.tf32.f32: x rounded to TF32 (10 mantissa bits; round to nearest,
// ties away from zero: half of the dropped 13 bits' range is added to the
// magnitude, then they are cleared), as the .b32 bits an mma .tf32 operand
// takes. Infinity and NaN pass unchanged; a value past TF32's largest rounds to infinity.
inline uint32_t cvt_rna_tf32_f32(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
    return u;
}
// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {d}, {a}, {b}, {c}: see detail::mma_complete.
inline void mma_sync_m16n8k8_tf32(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4],
                                  LIME_EMU_WHERE) {
    detail::mma_op(detail::W_MMA_TF32, "mma.sync.m16n8k8.tf32", d, a, b, c, file_, line_);
}
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: a, b hold two bf16 per register.
inline void mma_sync_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4],
                                   LIME_EMU_WHERE) {
    detail::mma_op(detail::W_MMA_BF16, "mma.sync.m16n8k16.bf16", d, a, b, c, file_, line_);
}
}  // namespace emu

// cp.async (cuda_pipeline_primitives.h): copy size_and_align (4, 8 or 16)
// bytes from global to shared memory, the last zfill of them zeros (read
// nothing for those); __pipeline_commit closes the thread's current group,
// __pipeline_wait_prior(n) waits until at most n of its committed groups are
// still in flight. On a GPU a copy lands at some moment between its issue and
// that wait (a barrier does not wait for copies). Here the moment follows the
// thread order: forward, at the wait, the latest (a tile read before its
// wait, or before the barrier after every thread's wait, is NaN); reverse, at
// the issue, the earliest (a copy into a buffer other threads still read, with
// no barrier between, overwrites what they read); random, either, per copy,
// by the seeded generator. So a kernel right only for one timing fails under some order.
__attribute__((no_sanitize_address))  // noted below as one store, not as the memcpy's
inline void __pipeline_memcpy_async(void* dst_shared, const void* src_global, size_t size_and_align, size_t zfill = 0,
                                    LIME_EMU_WHERE) {
    using namespace emu::detail;
    Fiber& f = current("__pipeline_memcpy_async");
    f.file = file_; f.line = line_;
    size_t n = size_and_align, from = n - zfill;
    if ((n != 4 && n != 8 && n != 16) || zfill > n)
        misuse(f, "__pipeline_memcpy_async: size %zu (4, 8 or 16) with zfill %zu", n, zfill);
    if (((uintptr_t)dst_shared | (from ? (uintptr_t)src_global : 0)) & (n - 1))
        misuse(f, "__pipeline_memcpy_async: %p or %p is not aligned to its %zu bytes", dst_shared, src_global, n);
    if (!in_shared(dst_shared, n)) misuse(f, "__pipeline_memcpy_async: destination %p is not shared memory", dst_shared);
    if (from && !on_device(src_global, from))
        misuse(f, "__pipeline_memcpy_async: source %p is not device memory", src_global);
    note_shared((uintptr_t)dst_shared, (uint32_t)n, file_ + ((uintptr_t)line_ << 20));  // the call's file and line: its site
    emu::Order o = settings().order;
    if (o == emu::REVERSE || (o == emu::RANDOM && splitmix(machine.copy_rng) % 2)) {  // lands now
        if (from) memcpy(dst_shared, src_global, from);
        memset((char*)dst_shared + from, 0, n - from);
        return;
    }
    f.copies.push_back({dst_shared, src_global, (int)n, (int)from, f.groups});
}
inline void __pipeline_commit() { emu::detail::current("__pipeline_commit").groups++; }
__attribute__((no_sanitize_address)) inline void __pipeline_wait_prior(size_t prior) {
    emu::detail::Fiber& f = emu::detail::current("__pipeline_wait_prior");
    std::vector<emu::detail::AsyncCopy> later;
    for (const emu::detail::AsyncCopy& c : f.copies) {
        if (c.group >= f.groups - (long)prior) { later.push_back(c); continue; }  // in flight, or not committed
        if (c.src_bytes) memcpy(c.dst, c.src, c.src_bytes);
        memset((char*)c.dst + c.src_bytes, 0, c.bytes - c.src_bytes);
    }
    f.copies.swap(later);
}

// Math. glibc declares (without defining) __expf, __sinf ... so those are mapped
// by macro; the fast intrinsics are computed exactly, which is what a CPU
// reference wants (the GPU's are within a few ulp).
#define __expf expf
#define __exp10f exp10f
#define __logf logf
#define __log2f log2f
#define __log10f log10f
#define __sinf sinf
#define __cosf cosf
#define __tanf tanf
#define __powf powf
#define __sincosf sincosf
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __frsqrt_rn(float x) { return 1.0f / sqrtf(x); }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __saturatef(float x) { return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f; }  // NaN -> 0
inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
inline int __float2int_rz(float x) { return (int)x; }
inline float __int2float_rn(int x) { return (float)x; }
inline int __float_as_int(float x) { int i; memcpy(&i, &x, 4); return i; }
inline unsigned __float_as_uint(float x) { unsigned i; memcpy(&i, &x, 4); return i; }
inline float __int_as_float(int i) { float x; memcpy(&x, &i, 4); return x; }
inline float __uint_as_float(unsigned i) { float x; memcpy(&x, &i, 4); return x; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
inline int __ffs(int x) { return __builtin_ffs(x); }
// CUDA's min/max overloads (device code calls them unqualified).
#define LIME_EMU_MINMAX(T) inline T min(T a, T b) { return a < b ? a : b; } inline T max(T a, T b) { return a > b ? a : b; }
LIME_EMU_MINMAX(int) LIME_EMU_MINMAX(unsigned) LIME_EMU_MINMAX(long) LIME_EMU_MINMAX(unsigned long)
LIME_EMU_MINMAX(long long) LIME_EMU_MINMAX(unsigned long long)
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
#undef LIME_EMU_MINMAX
// Cache-hinted loads and stores: the hint means nothing here.
template <class T> T __ldg(const T* p) { return *p; }
template <class T> T __ldcs(const T* p) { return *p; }
template <class T> T __ldcg(const T* p) { return *p; }
template <class T> void __stcs(T* p, T v) { *p = v; }
template <class T> void __stcg(T* p, T v) { *p = v; }

// ===========================================================================
// 5. The runtime API: errors, memory, device, streams, events, graphs, launch.

inline const char* cudaGetErrorName(cudaError_t e) {
    switch (e) {
#define C(x) case x: return #x;
    C(cudaSuccess) C(cudaErrorInvalidValue) C(cudaErrorMemoryAllocation) C(cudaErrorInitializationError)
    C(cudaErrorInvalidConfiguration) C(cudaErrorInvalidDevicePointer) C(cudaErrorInvalidMemcpyDirection)
    C(cudaErrorInvalidDeviceFunction) C(cudaErrorNoDevice) C(cudaErrorInvalidDevice) C(cudaErrorInvalidResourceHandle)
    C(cudaErrorIllegalState) C(cudaErrorNotReady) C(cudaErrorIllegalAddress) C(cudaErrorLaunchOutOfResources)
    C(cudaErrorLaunchFailure) C(cudaErrorStreamCaptureUnsupported) C(cudaErrorStreamCaptureInvalidated)
    C(cudaErrorStreamCaptureUnmatched) C(cudaErrorStreamCaptureUnjoined) C(cudaErrorStreamCaptureImplicit)
    C(cudaErrorCapturedEvent) C(cudaErrorUnknown)
#undef C
    }
    return "cudaErrorUnknown";
}
inline const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnmatched: return "capture was not initiated in this stream";
    case cudaErrorStreamCaptureUnjoined: return "capturing stream has unjoined work";
    case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
    default: return "unknown error";
    }
}
inline cudaError_t cudaGetLastError() {
    cudaError_t e = emu::detail::last_error;
    emu::detail::last_error = emu::detail::pending_error = cudaSuccess;
    return e;
}
inline cudaError_t cudaPeekAtLastError() { return emu::detail::last_error; }

// --- streams, capture, and the one place work is issued --------------------
// A stream the program created defers its work: issued operations wait in
// the stream's queue until something waits for them (cudaStreamSynchronize,
// cudaDeviceSynchronize, cudaEventSynchronize or a query, a blocking copy, or
// a stream that reaches a cudaStreamWaitEvent on them), and then run in issue
// order. So work one stream hands to another without an event still sits in
// its queue when the other runs, and a pinned buffer a device-to-host copy
// fills reads as NaN until the copy ran. The legacy stream (0) runs its work
// when issued, after the pending work of every blocking stream (as CUDA's
// legacy stream waits for those), but not of cudaStreamNonBlocking ones.
namespace emu { namespace detail {
struct Capture {
    cudaStreamCaptureMode mode;
    bool invalid = false;
    std::vector<std::function<void()>> ops;
    std::vector<CUstream_st*> streams;  // the origin stream and those that joined through events
};
inline std::vector<std::shared_ptr<Capture>> active_captures;
inline std::vector<std::pair<void*, size_t>> replay_poison;  // filled with NaN as each graph replay starts
}}  // namespace emu::detail

struct CUstream_st {
    unsigned flags = 0;
    std::shared_ptr<emu::detail::Capture> capture;  // set while the stream captures
    std::deque<std::pair<uint64_t, std::function<void()>>> queue;  // deferred work, by issue number
    uint64_t issued = 0;                                            // the last issue number given
};
struct CUevent_st {
    unsigned flags = 0;
    bool recorded = false;
    std::chrono::steady_clock::time_point when;
    std::shared_ptr<emu::detail::Capture> capture;  // last recorded while capturing: for joins
    CUstream_st* stream = nullptr;                  // a record still queued there, as issue number `seq`
    uint64_t seq = 0;
};
struct CUgraph_st { std::vector<std::function<void()>> ops; };
struct CUgraphExec_st { std::vector<std::function<void()>> ops; };

namespace emu { namespace detail {
inline CUstream_st legacy_stream;
inline std::vector<CUstream_st*> live_streams;  // created and not destroyed, oldest first
inline CUstream_st* resolve(cudaStream_t s) {
    return (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) ? &legacy_stream : s;
}
inline void invalidate(CUstream_st* s) { if (s->capture) s->capture->invalid = true; }
inline bool alive(CUstream_st* s) { return std::find(live_streams.begin(), live_streams.end(), s) != live_streams.end(); }
// Run stream s's queued work up to issue number `upto`, in order.
inline void run_until(CUstream_st* s, uint64_t upto) {
    while (alive(s) && !s->queue.empty() && s->queue.front().first <= upto) {
        std::function<void()> op = std::move(s->queue.front().second);
        s->queue.pop_front();
        op();
    }
}
inline void run_all(CUstream_st* s) { run_until(s, UINT64_MAX); }
// Every stream's queued work, the newest stream's first: a stream that
// needed another's results without waiting for them runs before it.
inline void run_every_stream() {
    for (size_t i = live_streams.size(); i > 0; i--)
        if (i <= live_streams.size()) run_all(live_streams[i - 1]);
}
// What the legacy stream waits for before its own work: the blocking streams.
inline void run_blocking_streams() {
    for (size_t i = 0; i < live_streams.size(); i++)
        if (!(live_streams[i]->flags & cudaStreamNonBlocking)) run_all(live_streams[i]);
}
// Issue op on stream s: queue it, run it now (legacy stream), or record it if s is capturing.
inline cudaError_t issue(cudaStream_t stream, std::function<void()> op, const char* what) {
    CUstream_st* s = resolve(stream);
    if (s->capture) {
        if (s->capture->invalid) return fail(cudaErrorStreamCaptureInvalidated, "%s: the capture was invalidated earlier", what);
        s->capture->ops.push_back(std::move(op));
        return cudaSuccess;
    }
    if (s == &legacy_stream)  // the legacy stream waits for every blocking stream, capturing ones too
        for (auto& c : active_captures)
            for (CUstream_st* cs : c->streams)
                if (!(cs->flags & cudaStreamNonBlocking)) {
                    c->invalid = true;
                    return fail(cudaErrorStreamCaptureImplicit, "%s on the legacy stream while a stream is capturing", what);
                }
    if (s != &legacy_stream) {
        s->queue.emplace_back(++s->issued, std::move(op));
        return cudaSuccess;
    }
    run_blocking_streams();
    op();
    return cudaSuccess;
}
// Calls CUDA forbids during a global or thread-local capture (malloc, free, device sync).
inline cudaError_t capture_forbids(const char* what) {
    for (auto& c : active_captures)
        if (c->mode != cudaStreamCaptureModeRelaxed) {
            c->invalid = true;
            return fail(cudaErrorStreamCaptureUnsupported, "%s is not permitted while a stream is capturing", what);
        }
    return cudaSuccess;
}
inline cudaError_t sync_result() {  // what a synchronisation reports: a failed kernel
    cudaError_t e = pending_error;
    pending_error = cudaSuccess;
    return e;
}
}}  // namespace emu::detail

// --- device ------------------------------------------------------------------
namespace emu { namespace detail {
constexpr size_t kGlobalMem = 24ull << 30, kSmem = 48 << 10;
// The shared memory a block may opt in to, as the CUDA Programming Guide's table gives it for the
// compute capability the device reports: sm_90 227 KiB, sm_80 and sm_87 163, sm_86 and sm_89 99, sm_75 64.
inline size_t smem_optin() {
    int cc = compute_capability();
    size_t kib = cc >= 90 ? 227 : cc == 80 || cc == 87 ? 163 : cc >= 86 ? 99 : cc >= 75 ? 64 : 48;
    return kib << 10;
}
}}
inline cudaError_t cudaGetDeviceCount(int* n) {
    if (emu::detail::no_device()) { *n = 0; emu::detail::last_error = cudaErrorNoDevice; return cudaErrorNoDevice; }
    *n = 1;
    return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int d) {
    if (emu::detail::no_device()) return emu::detail::last_error = cudaErrorNoDevice;
    return d == 0 ? cudaSuccess : (emu::detail::last_error = cudaErrorInvalidDevice);
}
inline cudaError_t cudaGetDevice(int* d) { *d = 0; return emu::detail::no_device() ? cudaErrorNoDevice : cudaSuccess; }
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
    if (emu::detail::no_device()) return emu::detail::last_error = cudaErrorNoDevice;
    if (d != 0) return emu::detail::last_error = cudaErrorInvalidDevice;
    *p = cudaDeviceProp{};
    snprintf(p->name, sizeof p->name, "lime-emu (CUDA on the CPU)");
    p->totalGlobalMem = emu::detail::kGlobalMem;
    p->sharedMemPerBlock = emu::detail::kSmem;
    p->sharedMemPerBlockOptin = emu::detail::smem_optin();
    p->sharedMemPerMultiprocessor = 228 << 10;
    p->totalConstMem = 64 << 10;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024; p->maxThreadsDim[1] = 1024; p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647; p->maxGridSize[1] = 65535; p->maxGridSize[2] = 65535;
    int cc = emu::detail::compute_capability();
    p->major = cc / 10; p->minor = cc % 10;
    p->multiProcessorCount = 8;
    p->maxThreadsPerMultiProcessor = 2048;
    p->l2CacheSize = 50 << 20;
    p->memoryBusWidth = 5120;
    return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int d) {
    cudaDeviceProp p;
    if (cudaError_t e = cudaGetDeviceProperties(&p, d)) return e;
    switch (a) {
    case cudaDevAttrMaxThreadsPerBlock: *v = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = (int)p.sharedMemPerBlock; break;
    case cudaDevAttrWarpSize: *v = p.warpSize; break;
    case cudaDevAttrMultiProcessorCount: *v = p.multiProcessorCount; break;
    case cudaDevAttrComputeCapabilityMajor: *v = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *v = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = (int)p.sharedMemPerBlockOptin; break;
    default: return emu::detail::last_error = cudaErrorInvalidValue;
    }
    return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize() {
    using namespace emu::detail;
    if (cudaError_t e = capture_forbids("cudaDeviceSynchronize")) return e;
    run_every_stream();
    return sync_result();
}

// --- memory ----------------------------------------------------------------
// Device memory is host memory, tracked so copies can check their pointers and
// filled with NaN (0xFF bytes), as uninitialised GPU memory may hold anything.
namespace emu { namespace detail {
struct Allocation { size_t bytes; bool pinned; bool reserved = false; };
inline std::map<uintptr_t, Allocation> allocations;
inline size_t device_bytes = 0;
// Is [p, p+n) inside one device allocation (pinned == false) or one pinned host block (true)?
inline bool inside(const void* p, size_t n, bool pinned) {
    auto it = allocations.upper_bound((uintptr_t)p);
    if (it == allocations.begin()) return false;
    --it;
    return it->second.pinned == pinned && (uintptr_t)p + n <= it->first + it->second.bytes;
}
inline bool on_device(const void* p, size_t n) { return inside(p, n, false); }
// Does p point into (or just past) a device allocation? What a kernel's or a
// product's pointer argument must do: on a GPU that reaches host memory
// (HMM, or pinned memory) a host pointer there is no fault, only a silent
// write into the host's heap.
inline bool points_to_device(const void* p) { return on_device(p, 0); }
}}  // namespace emu::detail

inline cudaError_t cudaMalloc(void** p, size_t bytes) {
    using namespace emu::detail;
    if (no_device()) return last_error = cudaErrorNoDevice;
    if (!p) return fail(cudaErrorInvalidValue, "cudaMalloc: null result pointer");
    if (cudaError_t e = capture_forbids("cudaMalloc")) return e;
    *p = nullptr;
    if (bytes == 0) return cudaSuccess;
    if (bytes > kGlobalMem - device_bytes)
        return fail(cudaErrorMemoryAllocation, "cudaMalloc of %zu bytes: only %zu of %zu are free", bytes,
                    kGlobalMem - device_bytes, kGlobalMem);
    if (posix_memalign(p, 256, bytes)) { *p = nullptr; return fail(cudaErrorMemoryAllocation, "cudaMalloc of %zu bytes: host out of memory", bytes); }
    memset(*p, 0xFF, bytes);
    allocations[(uintptr_t)*p] = {bytes, false};
    device_bytes += bytes;
    return cudaSuccess;
}
template <class T> cudaError_t cudaMalloc(T** p, size_t bytes) { return cudaMalloc((void**)p, bytes); }
namespace emu {
// Device memory that is only reserved, not filled (no NaN): its pages are
// given when first touched. For a test that issues work over an array too big
// to fill, and captures it into a graph it never runs (the products' bounds are
// checked when they are issued). Freed by cudaFree.
inline cudaError_t reserve_device(void** p, size_t bytes) {
    using namespace detail;
    if (bytes == 0 || bytes > kGlobalMem - device_bytes) return fail(cudaErrorMemoryAllocation, "reserve_device: %zu bytes", bytes);
    void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return fail(cudaErrorMemoryAllocation, "reserve_device: mmap of %zu bytes failed", bytes);
    *p = m;
    allocations[(uintptr_t)m] = {bytes, false, true};
    device_bytes += bytes;
    return cudaSuccess;
}
}  // namespace emu
inline cudaError_t cudaFree(void* p) {
    using namespace emu::detail;
    if (!p) return cudaSuccess;
    if (cudaError_t e = capture_forbids("cudaFree")) return e;
    run_every_stream();  // cudaFree waits for the device, as in CUDA
    auto it = allocations.find((uintptr_t)p);
    if (it == allocations.end() || it->second.pinned) return fail(cudaErrorInvalidValue, "cudaFree(%p): not a cudaMalloc'd pointer", p);
    device_bytes -= it->second.bytes;
    if (it->second.reserved) munmap(p, it->second.bytes);
    else free(p);
    allocations.erase(it);
    return cudaSuccess;
}
inline cudaError_t cudaMallocHost(void** p, size_t bytes, unsigned flags = 0) {
    (void)flags;
    if (posix_memalign(p, 256, bytes ? bytes : 1)) return emu::detail::fail(cudaErrorMemoryAllocation, "cudaMallocHost: out of memory");
    emu::detail::allocations[(uintptr_t)*p] = {bytes, true};
    return cudaSuccess;
}
template <class T> cudaError_t cudaMallocHost(T** p, size_t bytes, unsigned flags = 0) { return cudaMallocHost((void**)p, bytes, flags); }
inline cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned flags) { return cudaMallocHost(p, bytes, flags); }
inline cudaError_t cudaFreeHost(void* p) {
    if (!p) return cudaSuccess;
    emu::detail::run_every_stream();
    auto it = emu::detail::allocations.find((uintptr_t)p);
    if (it == emu::detail::allocations.end() || !it->second.pinned)
        return emu::detail::fail(cudaErrorInvalidValue, "cudaFreeHost(%p): not a cudaMallocHost'd pointer", p);
    emu::detail::allocations.erase(it);
    free(p);
    return cudaSuccess;
}
inline cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
    if (emu::detail::no_device()) return emu::detail::last_error = cudaErrorNoDevice;
    *total = emu::detail::kGlobalMem;
    *free_bytes = *total - emu::detail::device_bytes;
    return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t s = nullptr) {
    using namespace emu::detail;
    if ((unsigned)kind > cudaMemcpyDefault) return fail(cudaErrorInvalidMemcpyDirection, "cudaMemcpy: kind %d", (int)kind);
    if (n == 0) return cudaSuccess;
    bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if ((dst_dev && !on_device(dst, n)) || (src_dev && !on_device(src, n)))
        return fail(cudaErrorInvalidValue, "cudaMemcpy(%p, %p, %zu, %s): the %s range is not inside one cudaMalloc'd block",
                    dst, src, n, kind == 1 ? "HostToDevice" : kind == 2 ? "DeviceToHost" : "DeviceToDevice",
                    dst_dev && !on_device(dst, n) ? "destination" : "source");
    CUstream_st* st = resolve(s);
    if (kind == cudaMemcpyHostToDevice && !inside(src, n, true) && !st->capture) {
        // from pageable memory CUDA stages the source before returning: the caller may reuse it at once
        auto staged = std::make_shared<std::vector<char>>((const char*)src, (const char*)src + n);
        return issue(s, [=] { memcpy(dst, staged->data(), n); }, "cudaMemcpyAsync");
    }
    if (kind == cudaMemcpyDeviceToHost && inside(dst, n, true) && !st->capture)
        memset(dst, 0xFF, n);  // pinned: what the host reads before the copy ran is NaN
    cudaError_t e = issue(s, [=] { memmove(dst, src, n); }, "cudaMemcpy");
    if (e == cudaSuccess && kind == cudaMemcpyDeviceToHost && !inside(dst, n, true) && !st->capture)
        run_all(st);  // into pageable memory a copy returns when it is done
    return e;
}
inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
    return cudaMemcpyAsync(dst, src, n, kind, nullptr);  // the legacy stream: issue() runs it at once
}
inline cudaError_t cudaMemsetAsync(void* p, int value, size_t n, cudaStream_t s = nullptr) {
    if (n == 0) return cudaSuccess;
    if (!emu::detail::on_device(p, n)) return emu::detail::fail(cudaErrorInvalidValue, "cudaMemset(%p, %d, %zu): not inside one cudaMalloc'd block", p, value, n);
    return emu::detail::issue(s, [=] { memset(p, value, n); }, "cudaMemset");
}
inline cudaError_t cudaMemset(void* p, int value, size_t n) { return cudaMemsetAsync(p, value, n, nullptr); }
// __constant__ variables are plain globals, so a symbol copy is a memcpy.
template <class T> cudaError_t cudaMemcpyToSymbol(T& sym, const void* src, size_t n, size_t off = 0,
                                                  cudaMemcpyKind = cudaMemcpyHostToDevice) {
    memcpy((char*)&sym + off, src, n); return cudaSuccess;
}
template <class T> cudaError_t cudaMemcpyFromSymbol(void* dst, const T& sym, size_t n, size_t off = 0,
                                                    cudaMemcpyKind = cudaMemcpyDeviceToHost) {
    memcpy(dst, (const char*)&sym + off, n); return cudaSuccess;
}

// --- streams and events --------------------------------------------------------
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
    if (emu::detail::no_device()) return emu::detail::last_error = cudaErrorNoDevice;
    *s = new CUstream_st;
    (*s)->flags = flags;
    emu::detail::live_streams.push_back(*s);
    return cudaSuccess;
}
inline cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s || s == cudaStreamLegacy || s == cudaStreamPerThread) return emu::detail::last_error = cudaErrorInvalidResourceHandle;
    auto& live = emu::detail::live_streams;
    emu::detail::run_all(s);  // CUDA finishes a destroyed stream's work
    live.erase(std::remove(live.begin(), live.end(), s), live.end());
    delete s;
    return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    using namespace emu::detail;
    CUstream_st* st = resolve(s);
    if (st->capture) {
        invalidate(st);
        return fail(cudaErrorStreamCaptureUnsupported, "cudaStreamSynchronize on a capturing stream");
    }
    if (st == &legacy_stream) run_blocking_streams();
    else run_all(st);
    return sync_result();
}
// A query is answered by running the work it asks about (a polling loop ends).
inline cudaError_t cudaStreamQuery(cudaStream_t s) { return cudaStreamSynchronize(s); }
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) { *e = new CUevent_st; (*e)->flags = flags; return cudaSuccess; }
inline cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
inline void run_to_event(cudaEvent_t e);
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
    if (e) run_to_event(e);  // its queued record still refers to it
    delete e;
    return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr) {
    using namespace emu::detail;
    if (!e) return last_error = cudaErrorInvalidResourceHandle;
    CUstream_st* st = resolve(s);
    e->capture = st->capture;  // a captured record lets other streams join the capture
    bool queued = !st->capture && st != &legacy_stream;
    e->stream = queued ? st : nullptr;  // where waiting for it must run up to
    e->seq = st->issued + 1;
    return issue(s, [e] { e->recorded = true; e->when = std::chrono::steady_clock::now(); }, "cudaEventRecord");
}
// Runs the work of the event's stream up to its record.
inline void run_to_event(cudaEvent_t e) { if (e->stream) emu::detail::run_until(e->stream, e->seq); }
inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (e) run_to_event(e);
    return emu::detail::sync_result();
}
inline cudaError_t cudaEventQuery(cudaEvent_t e) { return cudaEventSynchronize(e); }  // as cudaStreamQuery
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
    bool timed = a && b && !((a->flags | b->flags) & cudaEventDisableTiming);
    if (timed && ((!a->recorded && a->stream) || (!b->recorded && b->stream)))
        return emu::detail::fail(cudaErrorNotReady, "cudaEventElapsedTime: an event's record has not run yet");
    if (!timed || !a->recorded || !b->recorded)
        return emu::detail::fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event was not recorded, or has timing disabled");
    *ms = std::chrono::duration<float, std::milli>(b->when - a->when).count();
    return cudaSuccess;
}
// The stream's later work runs after the event's stream reached the record:
// a queued step that runs that stream up to there. Waiting on an event
// recorded in a capture pulls this stream into the capture (fork/join).
inline cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned flags = 0) {
    (void)flags;
    if (!e) return emu::detail::fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: null event");
    CUstream_st* s = emu::detail::resolve(stream);
    auto& act = emu::detail::active_captures;
    if (e->capture && s->capture != e->capture && std::find(act.begin(), act.end(), e->capture) != act.end()) {
        if (s->capture || s == &emu::detail::legacy_stream)
            return emu::detail::fail(cudaErrorStreamCaptureImplicit, "cudaStreamWaitEvent: stream cannot join this capture");
        s->capture = e->capture;
        e->capture->streams.push_back(s);
    }
    if (!e->stream || e->stream == s) return cudaSuccess;  // recorded already, or earlier in this very stream
    if (s == &emu::detail::legacy_stream || s->capture) { run_to_event(e); return cudaSuccess; }
    return emu::detail::issue(stream, [t = e->stream, seq = e->seq] { emu::detail::run_until(t, seq); },
                              "cudaStreamWaitEvent");
}

// --- graph capture ---------------------------------------------------------------
// While a stream captures, issue() appends each operation (a closure holding
// the kernel's arguments by value) to the capture instead of running it. A
// graph is that list; launching one runs the list in order.
inline cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
    CUstream_st* s = emu::detail::resolve(stream);
    if (s == &emu::detail::legacy_stream) return emu::detail::fail(cudaErrorStreamCaptureUnsupported, "cannot capture the legacy stream");
    if (s->capture) return emu::detail::fail(cudaErrorIllegalState, "cudaStreamBeginCapture: the stream already captures");
    s->capture = std::make_shared<emu::detail::Capture>();
    s->capture->mode = mode;
    s->capture->streams.push_back(s);
    emu::detail::active_captures.push_back(s->capture);
    return cudaSuccess;
}
inline cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
    CUstream_st* s = emu::detail::resolve(stream);
    auto c = s->capture;
    if (!c || c->streams[0] != s) return emu::detail::fail(cudaErrorStreamCaptureUnmatched, "cudaStreamEndCapture: the capture did not begin in this stream");
    auto& act = emu::detail::active_captures;
    act.erase(std::find(act.begin(), act.end(), c));
    for (CUstream_st* m : c->streams) m->capture.reset();
    *graph = nullptr;
    if (c->invalid) return emu::detail::fail(cudaErrorStreamCaptureInvalidated, "cudaStreamEndCapture: the capture was invalidated by an earlier error");
    *graph = new CUgraph_st{std::move(c->ops)};
    return cudaSuccess;
}
inline cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* st) {
    const auto& c = emu::detail::resolve(stream)->capture;
    *st = !c ? cudaStreamCaptureStatusNone : c->invalid ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}
// The count of nodes; node handles themselves are not modelled.
inline cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t* nodes, size_t* n) {
    if (nodes) return emu::detail::fail(cudaErrorInvalidValue, "cudaGraphGetNodes: only the count (nodes == nullptr) is supported");
    *n = g->ops.size();
    return cudaSuccess;
}
inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t g, unsigned long long flags = 0) {
    (void)flags;
    if (!g) return emu::detail::fail(cudaErrorInvalidValue, "cudaGraphInstantiate: null graph");
    *exec = new CUgraphExec_st{g->ops};
    return cudaSuccess;
}
inline cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* exec, cudaGraph_t g, unsigned long long flags = 0) {
    return cudaGraphInstantiate(exec, g, flags);
}
inline cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
    if (!exec) return emu::detail::fail(cudaErrorInvalidValue, "cudaGraphLaunch: null graph");
    auto ops = exec->ops;
    return emu::detail::issue(s, [ops] {
        for (auto [p, bytes] : emu::detail::replay_poison) memset(p, 0xFF, bytes);
        emu::detail::machine.failed = false;
        for (const auto& op : ops) {
            op();
            if (emu::detail::machine.failed) break;  // a failed kernel ends the replay
        }
    }, "cudaGraphLaunch");
}
inline cudaError_t cudaGraphDestroy(cudaGraph_t g) { delete g; return cudaSuccess; }
inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) { delete e; return cudaSuccess; }
namespace emu {
// Device memory a graph must write before it reads (scratch): with this, each
// replay first fills [p, p + bytes) with NaN, so a replay that reads what an
// earlier step (or an eager run before capture) left there gives NaN.
inline void poison_before_replay(void* p, size_t bytes) { detail::replay_poison.emplace_back(p, bytes); }
inline void clear_replay_poison() { detail::replay_poison.clear(); }
}  // namespace emu

// --- kernel launch ---------------------------------------------------------------
namespace emu { namespace detail {
inline std::map<const void*, int> max_dynamic_smem;  // per kernel, from cudaFuncSetAttribute

inline void launch(const char* name, const void* key, dim3 g, dim3 b, size_t smem, cudaStream_t s,
                   std::function<void()> body) {
    if (no_device()) { last_error = cudaErrorNoDevice; return; }
    uint64_t threads = (uint64_t)b.x * b.y * b.z;
    cudaError_t e = cudaSuccess;
    auto it = max_dynamic_smem.find(key);
    size_t limit = it == max_dynamic_smem.end() ? kSmem : std::max<size_t>(kSmem, it->second);
    if (!g.x || !g.y || !g.z || !b.x || !b.y || !b.z)
        e = fail(cudaErrorInvalidConfiguration, "launch of %s refused: grid (%u,%u,%u) or block (%u,%u,%u) has a zero dimension",
                 name, g.x, g.y, g.z, b.x, b.y, b.z);
    else if (b.x > 1024 || b.y > 1024 || b.z > 64 || threads > 1024)
        e = fail(cudaErrorInvalidConfiguration, "launch of %s refused: block (%u,%u,%u) exceeds (1024,1024,64) or 1024 threads",
                 name, b.x, b.y, b.z);
    else if (g.x > 2147483647u || g.y > 65535 || g.z > 65535)
        e = fail(cudaErrorInvalidConfiguration, "launch of %s refused: grid (%u,%u,%u) exceeds (2^31-1,65535,65535)", name, g.x, g.y, g.z);
    else if (smem > limit)
        e = fail(cudaErrorInvalidValue, "launch of %s refused: %zu bytes of dynamic shared memory > %zu%s", name, smem, limit,
                 limit == kSmem ? " (above 48 KiB needs cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes))" : "");
    if (e) { invalidate(resolve(s)); return; }
    issue(s, [=] { run_grid(name, g, b, smem, body); }, name);
}

// Notes in *bad the index of x when x is a pointer (not null) outside device memory.
template <class T> void host_argument(const T& x, int at, int* bad, const void** bad_p) {
    if constexpr (std::is_pointer_v<T>)
        if (x && *bad < 0 && !points_to_device((const void*)x)) *bad = at, *bad_p = (const void*)x;
}

// LAUNCH(k, grid, block, smem, stream) is a Launch; its call operator takes
// the kernel's arguments, converts them to the parameter types (as <<<>>>
// does), keeps them by value and issues the grid.
template <class... P> struct Launch {
    void (*kernel)(P...);
    const char* name;
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    template <class... A> void operator()(A&&... a) const {
        static_assert(sizeof...(A) == sizeof...(P), "LAUNCH: wrong number of kernel arguments");
        std::tuple<std::decay_t<P>...> args(std::forward<A>(a)...);
        int at = 0, bad = -1;  // the first pointer argument that is not device memory
        const void* bad_p = nullptr;
        std::apply([&](const auto&... x) { (host_argument(x, at++, &bad, &bad_p), ...); }, args);
        if (bad >= 0) {
            fail(cudaErrorIllegalAddress, "launch of %s refused: argument %d (%p) is not device memory (a host pointer?)",
                 name, bad + 1, bad_p);
            invalidate(resolve(stream));
            return;
        }
        auto k = kernel;
        launch(name, key_of(kernel), grid, block, smem, stream, [k, args] { std::apply(k, args); });
    }
};
template <class... P> Launch<P...> make_launch(void (*k)(P...), const char* name, dim3 g, dim3 b, size_t smem, cudaStream_t s) {
    return {k, name, g, b, smem, s};
}
}}  // namespace emu::detail
#define LAUNCH(kernel, grid, block, smem, stream) ::emu::detail::make_launch(kernel, #kernel, grid, block, smem, stream)

inline cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
    if (attr == cudaFuncAttributePreferredSharedMemoryCarveout) return cudaSuccess;  // no carveout to prefer
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || (size_t)value > emu::detail::smem_optin())
        return emu::detail::fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: attribute %d value %d (max dynamic shared memory is %zu)",
                                 (int)attr, value, emu::detail::smem_optin());
    emu::detail::max_dynamic_smem[func] = value;
    return cudaSuccess;
}
template <class T> cudaError_t cudaFuncSetAttribute(T* func, cudaFuncAttribute attr, int value) {
    return cudaFuncSetAttribute(emu::detail::key_of(func), attr, value);
}

// ===========================================================================
// 6. cuBLAS: SGEMM, column-major, as cuBLAS defines it:
//    C = alpha * op(A) * op(B) + beta * C,  op(A) m x k, op(B) k x n, C m x n,
//    element (i, j) of a matrix X with leading dimension ldX at X[i + j*ldX].

enum cublasStatus_t {
    CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_NOT_INITIALIZED = 1, CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7, CUBLAS_STATUS_ARCH_MISMATCH = 8, CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13, CUBLAS_STATUS_INTERNAL_ERROR = 14, CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 };
enum cublasMath_t { CUBLAS_DEFAULT_MATH = 0, CUBLAS_TENSOR_OP_MATH = 1, CUBLAS_PEDANTIC_MATH = 2,
                    CUBLAS_TF32_TENSOR_OP_MATH = 3, CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16 };
struct cublasContext { cudaStream_t stream = nullptr; cublasMath_t math = CUBLAS_DEFAULT_MATH; };
typedef cublasContext* cublasHandle_t;

inline const char* cublasGetStatusName(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}
inline const char* cublasGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    default: return cublasGetStatusName(s);
    }
}
inline cublasStatus_t cublasCreate(cublasHandle_t* h) {
    if (emu::detail::no_device()) return CUBLAS_STATUS_NOT_INITIALIZED;
    *h = new cublasContext;
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasDestroy(cublasHandle_t h) { if (!h) return CUBLAS_STATUS_NOT_INITIALIZED; delete h; return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) { if (!h) return CUBLAS_STATUS_NOT_INITIALIZED; h->stream = s; return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasGetStream(cublasHandle_t h, cudaStream_t* s) { if (!h) return CUBLAS_STATUS_NOT_INITIALIZED; *s = h->stream; return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m) { if (!h) return CUBLAS_STATUS_NOT_INITIALIZED; h->math = m; return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasGetMathMode(cublasHandle_t h, cublasMath_t* m) { if (!h) return CUBLAS_STATUS_NOT_INITIALIZED; *m = h->math; return CUBLAS_STATUS_SUCCESS; }
// A user-owned workspace (what a program sets before capturing cuBLAS calls into a graph): accepted, unused here.
inline cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void* workspace, size_t bytes) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (bytes && !emu::detail::on_device(workspace, bytes)) return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

namespace emu { namespace detail {
// TF32 keeps 10 of float's 23 mantissa bits; tensor cores round each input so
// (to nearest, ties away: cvt.rna). Emulating it makes TF32 error budgets testable here.
inline float tf32(float x) {
    uint32_t u = cvt_rna_tf32_f32(x);
    memcpy(&x, &u, 4);
    return x;
}
// An element of a product's operand as the float it holds (bf16: exactly), and a result stored as T.
inline float as_float(float x) { return x; }
inline float as_float(__nv_bfloat16 x) { return (float)x; }
inline void store(float* p, float v) { *p = v; }
inline void store(__nv_bfloat16* p, float v) { *p = __nv_bfloat16(v); }
// One GEMM per batch entry, parallel over the (batch, column) pairs. Per column j
// of C: gather column j of op(B) into b (contiguous, whatever its stride), then
// op(A) = A walks A's columns (axpy, unit stride) and op(A) = A^T takes dot
// products with A's columns (also unit stride). beta == 0: C is only written.
// TA: the operands' type (float or bf16), TC: C's; the sums are float's whichever.
// ROUND: what each operand is rounded to first (ROUND_NONE, ROUND_TF32, ROUND_BF16).
enum { ROUND_NONE = 0, ROUND_TF32 = 1, ROUND_BF16 = 2 };
template <int ROUND, class TA = float, class TC = float>
void sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const TA* A, int lda, long long sA,
           const TA* B, int ldb, long long sB, float beta, TC* C, int ldc, long long sC, int batch) {
    long long cols = (long long)batch * n;
    auto rnd = [](TA x) {
        return ROUND == ROUND_TF32 ? tf32(as_float(x)) : ROUND == ROUND_BF16 ? (float)__nv_bfloat16(as_float(x)) : as_float(x);
    };
#if defined(_OPENMP)
#pragma omp parallel if ((double)cols * m * k > 1e6)
#endif
    {
        std::vector<float> b(k), acc(m);
#if defined(_OPENMP)
#pragma omp for schedule(static)
#endif
        for (long long c = 0; c < cols; c++) {
            long long bi = c / n;
            int j = (int)(c % n);
            const TA* Ab = A + bi * sA;
            const TA* Bb = B + bi * sB;
            TC* Cj = C + bi * sC + (size_t)j * ldc;
            for (int l = 0; l < k; l++) b[l] = rnd(tb ? Bb[j + (size_t)l * ldb] : Bb[l + (size_t)j * ldb]);
            if (!ta) {
                std::fill(acc.begin(), acc.end(), 0.0f);
                for (int l = 0; l < k; l++) {
                    const TA* Al = Ab + (size_t)l * lda;
                    float bl = b[l];
                    for (int i = 0; i < m; i++) acc[i] += rnd(Al[i]) * bl;
                }
            } else {
                for (int i = 0; i < m; i++) {
                    const TA* Ai = Ab + (size_t)i * lda;
                    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // 8 partial sums, so the loop vectorises
                    int l = 0;
                    for (; l + 8 <= k; l += 8)
                        for (int u = 0; u < 8; u++) s[u] += rnd(Ai[l + u]) * b[l + u];
                    for (; l < k; l++) s[0] += rnd(Ai[l]) * b[l];
                    acc[i] = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
                }
            }
            if (beta == 0.0f) for (int i = 0; i < m; i++) store(&Cj[i], alpha * acc[i]);
            else for (int i = 0; i < m; i++) store(&Cj[i], alpha * acc[i] + beta * as_float(Cj[i]));
        }
    }
}
// Check the arguments as cuBLAS does, then issue the product on the handle's stream.
// TA, TC: the operands' and C's element types; round: what the operands are rounded to
// (ROUND_*; -1: TF32 or nothing, as the handle's math mode says, for cublasSgemm).
template <class TA = float, class TC = float>
inline cublasStatus_t gemm(const char* fn, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                           int k, const float* alpha, const TA* A, int lda, long long sA, const TA* B, int ldb,
                           long long sB, const float* beta, TC* C, int ldc, long long sC, int batch, int round = -1) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    bool okop = (unsigned)ta <= CUBLAS_OP_C && (unsigned)tb <= CUBLAS_OP_C;
    int rowsA = ta == CUBLAS_OP_N ? m : k, rowsB = tb == CUBLAS_OP_N ? k : n;
    if (!okop || m < 0 || n < 0 || k < 0 || batch < 0 || lda < std::max(1, rowsA) || ldb < std::max(1, rowsB) ||
        ldc < std::max(1, m) || !alpha || !beta) {
        // A cuBLAS refusal is not a CUDA error: report it, leave cudaGetLastError alone.
        report("%s: CUBLAS_STATUS_INVALID_VALUE (m=%d n=%d k=%d lda=%d [needs >= %d] ldb=%d [>= %d] ldc=%d [>= %d] batch=%d)",
               fn, m, n, k, lda, std::max(1, rowsA), ldb, std::max(1, rowsB), ldc, std::max(1, m), batch);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
    for (const void* p : {k ? (const void*)A : C, k ? (const void*)B : C, (const void*)C})  // (k = 0: A, B unread)
        if (!points_to_device(p)) {  // a host pointer: cuBLAS would fail the product (or, with HMM, write the host)
            report("%s: CUBLAS_STATUS_EXECUTION_FAILED (matrix %p is not device memory: a host pointer?)", fn, p);
            return CUBLAS_STATUS_EXECUTION_FAILED;
        }
    // Each matrix of the first and the last batch inside one device allocation: an offset
    // that overflowed or a stride too long writes past an array on a GPU, silently.
    auto extent = [](int rows, int cols, int ld) { return rows && cols ? (size_t)(cols - 1) * ld + rows : 0; };
    size_t ext[3] = {ta == CUBLAS_OP_N ? extent(m, k, lda) : extent(k, m, lda),
                     tb == CUBLAS_OP_N ? extent(k, n, ldb) : extent(n, k, ldb), extent(m, n, ldc)};
    uintptr_t base[3] = {(uintptr_t)A, (uintptr_t)B, (uintptr_t)C};  // (integers: no pointer arithmetic outside an array)
    long long stride[3] = {sA, sB, sC};
    size_t size[3] = {sizeof(TA), sizeof(TA), sizeof(TC)};
    for (int x = k && *alpha != 0.0f ? 0 : 2; x < 3; x++)  // (A and B unread: only C)
        for (int bi : {0, batch - 1})
            if (!on_device((const void*)(base[x] + (uintptr_t)((long long)bi * stride[x] * (long long)size[x])), ext[x] * size[x])) {
                report("%s: CUBLAS_STATUS_EXECUTION_FAILED (matrix %c of batch %d: %zu elements at %lld from its "
                       "first batch's, outside its allocation)", fn, "ABC"[x], bi, ext[x], (long long)bi * stride[x]);
                return CUBLAS_STATUS_EXECUTION_FAILED;
            }
    float a = *alpha, b = *beta;  // host pointer mode: the scalars are read at the call
    bool tA = ta != CUBLAS_OP_N, tB = tb != CUBLAS_OP_N;
    if (round < 0) round = (h->math & 0xf) == CUBLAS_TF32_TENSOR_OP_MATH ? ROUND_TF32 : ROUND_NONE;
    if (a == 0.0f) k = 0;  // C = beta * C: as in BLAS, A and B are not read
    auto op = [=] {
        if (round == ROUND_TF32) sgemm<ROUND_TF32, TA, TC>(tA, tB, m, n, k, a, A, lda, sA, B, ldb, sB, b, C, ldc, sC, batch);
        else if (round == ROUND_BF16) sgemm<ROUND_BF16, TA, TC>(tA, tB, m, n, k, a, A, lda, sA, B, ldb, sB, b, C, ldc, sC, batch);
        else sgemm<ROUND_NONE, TA, TC>(tA, tB, m, n, k, a, A, lda, sA, B, ldb, sB, b, C, ldc, sC, batch);
    };
    return issue(h->stream, op, fn) == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}
}}  // namespace emu::detail

inline cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                  const float* alpha, const float* A, int lda, const float* B, int ldb,
                                  const float* beta, float* C, int ldc) {
    return emu::detail::gemm("cublasSgemm", h, ta, tb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}
inline cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                                                int n, int k, const float* alpha, const float* A, int lda,
                                                long long strideA, const float* B, int ldb, long long strideB,
                                                const float* beta, float* C, int ldc, long long strideC, int batch) {
    return emu::detail::gemm("cublasSgemmStridedBatched", h, ta, tb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB,
                             beta, C, ldc, strideC, batch);
}

// cublasGemmEx: the product with typed operands. Emulated: compute type
// CUBLAS_COMPUTE_32F (float sums; TF32 operands when the handle's math mode is
// CUBLAS_TF32_TENSOR_OP_MATH and they are float), _32F_PEDANTIC (never TF32),
// _32F_FAST_TF32 (TF32 operands) or _32F_FAST_16BF (float operands rounded to
// bf16, to nearest even, as they are read), with A and B both CUDA_R_32F or both
// CUDA_R_16BF, and C CUDA_R_32F, or CUDA_R_16BF after bf16 operands (the
// result rounded to nearest even as it is stored). alpha, beta: floats on the
// host. Anything else is CUBLAS_STATUS_NOT_SUPPORTED here, with a line saying so.
typedef enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType;
typedef enum {
    CUBLAS_COMPUTE_16F = 64, CUBLAS_COMPUTE_16F_PEDANTIC = 65, CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_PEDANTIC = 69,
    CUBLAS_COMPUTE_32F_FAST_16F = 74, CUBLAS_COMPUTE_32F_FAST_16BF = 75, CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
    CUBLAS_COMPUTE_64F = 70, CUBLAS_COMPUTE_32I = 72,
} cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1, CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99 } cublasGemmAlgo_t;
namespace emu { namespace detail {
inline cublasStatus_t gemm_ex(const char* fn, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                              int n, int k, const void* alpha, const void* A, cudaDataType at, int lda, long long sA,
                              const void* B, cudaDataType bt, int ldb, long long sB, const void* beta, void* C,
                              cudaDataType ct, int ldc, long long sC, int batch, cublasComputeType_t compute,
                              cublasGemmAlgo_t algo) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    bool types = at == bt && (at == CUDA_R_32F || at == CUDA_R_16BF) &&
                 (ct == CUDA_R_32F || (ct == CUDA_R_16BF && at == CUDA_R_16BF));
    bool computes = compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_PEDANTIC ||
                    compute == CUBLAS_COMPUTE_32F_FAST_TF32 || compute == CUBLAS_COMPUTE_32F_FAST_16BF;
    if (!types || !computes) {
        report("%s: CUBLAS_STATUS_NOT_SUPPORTED (A type %d, B type %d, C type %d, compute type %d: the harness emulates "
               "bf16 or float operands with CUBLAS_COMPUTE_32F[_PEDANTIC|_FAST_TF32|_FAST_16BF])",
               fn, (int)at, (int)bt, (int)ct, (int)compute);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (!((algo >= -1 && algo <= 23) || (algo >= 99 && algo <= 115))) {
        report("%s: CUBLAS_STATUS_INVALID_VALUE (algo %d)", fn, (int)algo);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    const float *al = (const float*)alpha, *be = (const float*)beta;
    int round = compute == CUBLAS_COMPUTE_32F_FAST_TF32    ? ROUND_TF32
                : compute == CUBLAS_COMPUTE_32F_FAST_16BF  ? ROUND_BF16
                : compute == CUBLAS_COMPUTE_32F_PEDANTIC   ? ROUND_NONE
                                                           : -1;
    using bf = __nv_bfloat16;
    const bf *Ab = (const bf*)A, *Bb = (const bf*)B;
    if (at == CUDA_R_32F)
        return gemm(fn, h, ta, tb, m, n, k, al, (const float*)A, lda, sA, (const float*)B, ldb, sB, be, (float*)C, ldc,
                    sC, batch, round);
    if (ct == CUDA_R_32F)
        return gemm(fn, h, ta, tb, m, n, k, al, Ab, lda, sA, Bb, ldb, sB, be, (float*)C, ldc, sC, batch, round);
    return gemm(fn, h, ta, tb, m, n, k, al, Ab, lda, sA, Bb, ldb, sB, be, (bf*)C, ldc, sC, batch, round);
}
}}  // namespace emu::detail
inline cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                   const void* alpha, const void* A, cudaDataType at, int lda, const void* B,
                                   cudaDataType bt, int ldb, const void* beta, void* C, cudaDataType ct, int ldc,
                                   cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    return emu::detail::gemm_ex("cublasGemmEx", h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C, ct,
                                ldc, 0, 1, compute, algo);
}
inline cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                                                 int n, int k, const void* alpha, const void* A, cudaDataType at,
                                                 int lda, long long strideA, const void* B, cudaDataType bt, int ldb,
                                                 long long strideB, const void* beta, void* C, cudaDataType ct,
                                                 int ldc, long long strideC, int batch, cublasComputeType_t compute,
                                                 cublasGemmAlgo_t algo) {
    return emu::detail::gemm_ex("cublasGemmStridedBatchedEx", h, ta, tb, m, n, k, alpha, A, at, lda, strideA, B, bt,
                                ldb, strideB, beta, C, ct, ldc, strideC, batch, compute, algo);
}

// ===========================================================================
// The bank counter's hooks (section 3b): what g++ -fsanitize=kernel-address
// with outlined checks calls before every load and store of the code it compiled.
#ifdef LIME_EMU_COUNT_BANKS
#define LIME_EMU_BANK_HOOK(n)                                                                                   \
    extern "C" __attribute__((no_sanitize_address, weak)) void __asan_load##n##_noabort(uintptr_t a) {         \
        ::emu::detail::note_shared(a, n, __builtin_return_address(0));                                          \
    }                                                                                                           \
    extern "C" __attribute__((no_sanitize_address, weak)) void __asan_store##n##_noabort(uintptr_t a) {        \
        ::emu::detail::note_shared(a, n, __builtin_return_address(0));                                          \
    }
LIME_EMU_BANK_HOOK(1)
LIME_EMU_BANK_HOOK(2)
LIME_EMU_BANK_HOOK(4)
LIME_EMU_BANK_HOOK(8)
LIME_EMU_BANK_HOOK(16)
#undef LIME_EMU_BANK_HOOK
extern "C" __attribute__((no_sanitize_address, weak)) void __asan_loadN_noabort(uintptr_t a, size_t n) {
    ::emu::detail::note_shared(a, (uint32_t)n, __builtin_return_address(0));
}
extern "C" __attribute__((no_sanitize_address, weak)) void __asan_storeN_noabort(uintptr_t a, size_t n) {
    ::emu::detail::note_shared(a, (uint32_t)n, __builtin_return_address(0));
}
extern "C" __attribute__((no_sanitize_address, weak)) void __asan_handle_no_return() {}
extern "C" __attribute__((no_sanitize_address, weak)) void __asan_before_dynamic_init(const char*) {}
extern "C" __attribute__((no_sanitize_address, weak)) void __asan_after_dynamic_init() {}
#endif
