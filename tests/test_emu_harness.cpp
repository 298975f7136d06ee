// tests/test_emu_harness.cpp — tests of support/harness/cuda_on_cpu.h, the CPU stand-in for
// CUDA: small kernels written for the purpose, launched through LAUNCH as
// lime.cu launches its own. They check that correct kernels compute the right
// thing under every thread order, that broken ones are caught (a missing
// barrier, a barrier in divergent code), and that the runtime and cuBLAS calls
// behave, and refuse, as CUDA's do.
//
//   g++ -std=c++17 -O2 -g -Wall -Wextra -fopenmp -I. -Itests tests/test_emu_harness.cpp tests/test_main.cpp
#include <cstring>
#include <string>
#include <vector>
#include "support/harness/cuda_on_cpu.h"
#include "test.h"

// ---------------------------------------------------------------------------
// Helpers.
namespace {
const emu::Order kOrders[] = {emu::FORWARD, emu::REVERSE, emu::RANDOM};
const char* order_name(emu::Order o) { return o == emu::FORWARD ? "forward" : o == emu::REVERSE ? "reverse" : "random"; }
struct ForwardOnExit {  // tests leave the default behind
    ~ForwardOnExit() { emu::set_order(emu::FORWARD, 1); emu::set_block_order(emu::FORWARD); }
};

template <class T> T* to_device(const std::vector<T>& h) {
    T* d = nullptr;
    cudaMalloc(&d, h.size() * sizeof(T));
    cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
    return d;
}
template <class T> std::vector<T> to_host(const T* d, size_t n) {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
}
std::vector<float> ramp(size_t n, float scale) {  // deterministic, sign-varying values
    std::vector<float> v(n);
    uint64_t s = 12345;
    for (float& x : v) x = scale * ((float)(emu::detail::splitmix(s) >> 40) / (float)(1 << 24) - 0.5f);
    return v;
}
}  // namespace

// ---------------------------------------------------------------------------
// Kernels.

// Sum of each block's slice: a warp reduction with shuffles, the per-warp sums
// through shared memory, then one more warp reduction.
__global__ void block_sum_kernel(float* out, const float* in, int n) {
    __shared__ float warp_sums[32];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float v = i < n ? in[i] : 0.0f;
    for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffff, v, o);
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (int)blockDim.x / 32 ? warp_sums[lane] : 0.0f;
        for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffff, v, o);
        if (lane == 0) out[blockIdx.x] = v;
    }
}

// out (cols x rows) = in (rows x cols)^T through a shared tile, so that both
// the read and the write of global memory go along rows.
constexpr int TILE = 16;
__global__ void transpose_kernel(float* out, const float* in, int rows, int cols) {
    __shared__ float tile[TILE][TILE + 1];  // +1: on a GPU, no bank conflicts reading columns
    int r = blockIdx.y * TILE + threadIdx.y, c = blockIdx.x * TILE + threadIdx.x;
    if (r < rows && c < cols) tile[threadIdx.y][threadIdx.x] = in[r * cols + c];
    __syncthreads();
    int orow = blockIdx.x * TILE + threadIdx.y, ocol = blockIdx.y * TILE + threadIdx.x;
    if (orow < cols && ocol < rows) out[orow * rows + ocol] = tile[threadIdx.x][threadIdx.y];
}

// Histogram of data % 16: per block in shared memory, then added to global.
__global__ void histogram_kernel(int* bins, float* total, int* largest, const int* data, int n) {
    __shared__ int local[16];
    for (int b = threadIdx.x; b < 16; b += blockDim.x) local[b] = 0;
    __syncthreads();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        atomicAdd(&local[data[i] % 16], 1);
        atomicAdd(total, (float)data[i]);
        atomicMax(largest, data[i]);
    }
    __syncthreads();
    for (int b = threadIdx.x; b < 16; b += blockDim.x) atomicAdd(&bins[b], local[b]);
}

// Reverse a block's values through shared memory. The racy version lacks the
// barrier between the write and the read of the mirrored slot.
__global__ void mirror_racy_kernel(float* out, const float* in) {
    __shared__ float s[64];
    int t = threadIdx.x;
    s[t] = in[t];
    out[t] = s[blockDim.x - 1 - t];  // BUG: no __syncthreads() before this read
}
__global__ void mirror_kernel(float* out, const float* in) {
    __shared__ float s[64];
    int t = threadIdx.x;
    s[t] = in[t];
    __syncthreads();
    out[t] = s[blockDim.x - 1 - t];
}
// A write-after-read race that NaN poisoning cannot reveal (every slot is
// written before): only the order of the threads decides.
__global__ void shift_racy_kernel(float* out, const float* in) {
    __shared__ float s[64];
    int t = threadIdx.x, n = blockDim.x;
    s[t] = in[t];
    __syncthreads();
    float right = t + 1 < n ? s[t + 1] : 0.0f;
    s[t] = 2.0f * right;  // BUG: thread t-1 may not have read s[t] yet
    __syncthreads();
    out[t] = s[t];
}

// __syncthreads() in a branch only half the block takes.
__global__ void divergent_barrier_kernel(float* out) {
    if (threadIdx.x < 16) __syncthreads();
    out[threadIdx.x] = 1.0f;
}
// A full-warp shuffle that half the warp never reaches; then the legal version
// (mask and width cover only the lanes that take part).
__global__ void half_warp_shuffle_kernel(float* out) {
    float v = (float)threadIdx.x;
    if (threadIdx.x < 16) v += __shfl_down_sync(0xffffffff, v, 1);
    out[threadIdx.x] = v;
}
__global__ void half_warp_shuffle_ok_kernel(float* out) {
    float v = (float)threadIdx.x;
    if (threadIdx.x < 16) v += __shfl_down_sync(0x0000ffff, v, 1, 16);
    out[threadIdx.x] = v;
}
// A mask that leaves out the calling lane: undefined in CUDA, refused here.
__global__ void bad_mask_kernel(float* out) {
    out[threadIdx.x] = __shfl_sync(1u << ((threadIdx.x + 1) % 32), 1.0f, 0);
}

// Every warp operation once, with results a host loop can predict.
__global__ void warp_ops_kernel(int* out) {
    int t = threadIdx.x, lane = t % 32;
    int* o = out + t * 9;
    o[0] = __shfl_sync(0xffffffff, t * 10, 3);   // lane 3's value, in each warp
    o[1] = __shfl_xor_sync(0xffffffff, t, 1);    // neighbours swap
    o[2] = __shfl_up_sync(0xffffffff, t, 2, 8);  // within groups of 8 lanes
    o[3] = __shfl_down_sync(0xffffffff, t, 4, 16);
    o[4] = (int)__ballot_sync(0xffffffff, lane % 3 == 0);
    o[5] = __any_sync(0xffffffff, t == 40);
    o[6] = __all_sync(0xffffffff, lane < 31);
    o[7] = __syncthreads_count(t % 2);
    __syncwarp();
    o[8] = (int)__activemask();
}

__global__ void fill_kernel(float* out, float v) { out[blockIdx.x * blockDim.x + threadIdx.x] = v; }

// Reverse n floats through dynamic shared memory.
__global__ void dynamic_smem_kernel(float* out, int n) {
    DYNAMIC_SHARED(float, buf);
    for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = (float)i;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = buf[n - 1 - i];
}

// Reads shared memory nobody wrote: must see NaN in every block, although
// the previous block left 1s behind.
__global__ void read_before_write_kernel(float* out, int* dyn_out) {
    __shared__ float s[32];
    DYNAMIC_SHARED(int, d);
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = s[threadIdx.x];
    dyn_out[i] = d[threadIdx.x];
    __syncthreads();
    s[threadIdx.x] = 1.0f;
    d[threadIdx.x] = 7;
}
template <int N> __global__ void template_smem_kernel(float* out) {
    __shared__ float s[N];
    out[blockIdx.x * N + threadIdx.x] = s[threadIdx.x];
    __syncthreads();
    s[threadIdx.x] = 1.0f;
}

__global__ void add_kernel(float* x, float v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += v;
}

// Each thread takes a ticket twice, a barrier between: the tickets show the
// order the scheduler ran the threads in, phase by phase.
__global__ void ticket_kernel(int* tickets, int* counter) {
    tickets[threadIdx.x] = atomicAdd(counter, 1);
    __syncthreads();
    tickets[blockDim.x + threadIdx.x] = atomicAdd(counter, 1) - (int)blockDim.x;
}

// Needs more stack than the default 64 KiB.
__global__ void big_stack_kernel(float* out) {
    volatile float local[24 * 1024];  // 96 KiB
    for (int i = 0; i < 24 * 1024; i++) local[i] = (float)i;
    out[threadIdx.x] = local[24 * 1024 - 1 - threadIdx.x];
}

// Block b adds block b-1's total to its own: a chain between blocks that is
// right only when the blocks run in order (CUDA promises no order). The legal
// version reads only what it was given.
__global__ void chain_racy_kernel(float* x) {
    if (threadIdx.x == 0 && blockIdx.x > 0) x[blockIdx.x] += x[blockIdx.x - 1];
}
__global__ void block_ticket_kernel(int* tickets, int* counter) {
    if (threadIdx.x == 0) tickets[blockIdx.x + gridDim.x * blockIdx.y] = atomicAdd(counter, 1);
}
// Adds v to every element: launched on a stream, read on another.
__global__ void scale_kernel(float* y, const float* x, float v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * v;
}
// The lanes present in a partial warp, as the mask of a shuffle: legal.
__global__ void partial_warp_ok_kernel(int* out) {
    unsigned m = __activemask();
    out[threadIdx.x] = __shfl_sync(m, (int)threadIdx.x, 0) + (int)m;
}

// ---------------------------------------------------------------------------
// Tests: kernels.

TEST(emu_block_reduction_with_shuffles) {
    ForwardOnExit restore;
    const int n = 1000, block = 128, grid = (n + block - 1) / block;
    std::vector<float> h = ramp(n, 2.0f);
    float* in = to_device(h);
    float* out = nullptr;
    cudaMalloc(&out, grid * sizeof(float));
    for (emu::Order o : kOrders) {
        emu::set_order(o, 3);
        LAUNCH(block_sum_kernel, grid, block, 0, 0)(out, in, n);
        CHECK(cudaGetLastError() == cudaSuccess, "launch failed: %s", emu::last_error_message());
        std::vector<float> got = to_host(out, grid);
        for (int b = 0; b < grid; b++) {
            double want = 0;
            for (int i = b * block; i < std::min(n, (b + 1) * block); i++) want += h[i];
            CHECK(std::fabs(got[b] - want) < 1e-5, "%s order: block %d sum %g, want %g", order_name(o), b, got[b], want);
        }
    }
    cudaFree(in);
    cudaFree(out);
}

TEST(emu_tiled_transpose_at_ragged_shape) {
    ForwardOnExit restore;
    const int rows = 37, cols = 53;
    std::vector<float> h = ramp(rows * cols, 10.0f);
    float* in = to_device(h);
    float* out = nullptr;
    cudaMalloc(&out, rows * cols * sizeof(float));
    dim3 grid((cols + TILE - 1) / TILE, (rows + TILE - 1) / TILE), block(TILE, TILE);
    for (emu::Order o : kOrders) {
        emu::set_order(o, 7);
        LAUNCH(transpose_kernel, grid, block, 0, 0)(out, in, rows, cols);
        std::vector<float> got = to_host(out, rows * cols);
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++)
                CHECK(got[c * rows + r] == h[r * cols + c], "%s order: out[%d][%d] = %g, want %g", order_name(o), c, r,
                      got[c * rows + r], h[r * cols + c]);
    }
    cudaFree(in);
    cudaFree(out);
}

TEST(emu_atomic_histogram) {
    ForwardOnExit restore;
    const int n = 5000;
    std::vector<int> h(n);
    for (int i = 0; i < n; i++) h[i] = (i * 7919) % 1000;
    int* data = to_device(h);
    int *bins, *largest;
    float* total;
    cudaMalloc(&bins, 16 * sizeof(int));
    cudaMalloc(&largest, sizeof(int));
    cudaMalloc(&total, sizeof(float));
    std::vector<int> want(16, 0);
    double want_total = 0;
    for (int x : h) { want[x % 16]++; want_total += x; }
    emu::set_order(emu::RANDOM, 11);
    cudaMemset(bins, 0, 16 * sizeof(int));
    cudaMemset(largest, 0, sizeof(int));
    cudaMemset(total, 0, sizeof(float));
    LAUNCH(histogram_kernel, 7, 96, 0, 0)(bins, total, largest, data, n);
    std::vector<int> got = to_host(bins, 16);
    for (int b = 0; b < 16; b++) CHECK(got[b] == want[b], "bin %d: %d, want %d", b, got[b], want[b]);
    CHECK(to_host(largest, 1)[0] == 999, "atomicMax: %d, want 999", to_host(largest, 1)[0]);
    float t = to_host(total, 1)[0];
    CHECK(std::fabs(t - want_total) / want_total < 1e-5, "atomicAdd(float): %g, want %g", t, want_total);
    cudaFree(data); cudaFree(bins); cudaFree(largest); cudaFree(total);
}

TEST(emu_catches_missing_syncthreads) {
    ForwardOnExit restore;
    const int n = 64;
    std::vector<float> h = ramp(n, 1.0f);
    float* in = to_device(h);
    float* out = nullptr;
    cudaMalloc(&out, n * sizeof(float));
    // Did the kernel compute out = reverse(in) (mirror) or out[t] = 2 in[t+1] (shift)?
    auto right = [&](bool mirror) {
        std::vector<float> got = to_host(out, n);
        for (int t = 0; t < n; t++)
            if (got[t] != (mirror ? h[n - 1 - t] : t + 1 < n ? 2.0f * h[t + 1] : 0.0f)) return false;
        return true;
    };
    auto run = [&](void (*k)(float*, const float*), emu::Order o, uint64_t seed) {
        emu::set_order(o, seed);
        LAUNCH(k, 1, n, 0, 0)(out, in);
    };
    int mirror_caught = 0, shift_caught = 0;
    for (uint64_t seed = 1; seed <= 20; seed++) {
        run(mirror_racy_kernel, emu::RANDOM, seed); mirror_caught += !right(true);
        run(shift_racy_kernel, emu::RANDOM, seed); shift_caught += !right(false);
        run(mirror_kernel, emu::RANDOM, seed);
        CHECK(right(true), "correct mirror kernel wrong under random order, seed %d", (int)seed);
    }
    CHECK(mirror_caught == 20, "missing barrier (mirror) caught under %d of 20 random seeds", mirror_caught);
    CHECK(shift_caught == 20, "missing barrier (shift) caught under %d of 20 random seeds", shift_caught);
    run(mirror_racy_kernel, emu::REVERSE, 1);
    CHECK(!right(true), "missing barrier (mirror) not caught under reverse order");
    run(shift_racy_kernel, emu::REVERSE, 1);
    CHECK(!right(false), "missing barrier (shift) not caught under reverse order");
    // Forward order happens to run every reader before the writer it races
    // with, so the shift race passes there: the reason the other orders exist.
    run(shift_racy_kernel, emu::FORWARD, 1);
    CHECK(right(false), "expected the shift race to go unnoticed under forward order");
    for (emu::Order o : {emu::FORWARD, emu::REVERSE}) {
        run(mirror_kernel, o, 1);
        CHECK(right(true), "correct mirror kernel wrong under %s order", order_name(o));
    }
    cudaFree(in);
    cudaFree(out);
}

TEST(emu_reports_divergent_barrier_as_deadlock) {
    float* out = nullptr;
    cudaMalloc(&out, 32 * sizeof(float));
    LAUNCH(divergent_barrier_kernel, 1, 32, 0, 0)(out);
    const char* msg = emu::last_error_message();
    CHECK(cudaGetLastError() == cudaErrorLaunchFailure, "deadlock not reported as a launch failure");
    for (const char* part : {"deadlock in kernel divergent_barrier_kernel: block (0,0,0) thread (0,0,0) waits at __syncthreads()",
                             "while thread (16,0,0) has exited"})
        CHECK(contains(msg, part), "the message lacks '%s': %s", part, msg);
    // A full-mask shuffle half the warp skips is a deadlock too.
    LAUNCH(half_warp_shuffle_kernel, 1, 32, 0, 0)(out);
    msg = emu::last_error_message();
    CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure, "synchronize did not report the failed kernel");
    for (const char* part : {"half_warp_shuffle_kernel", "__shfl_down_sync(mask 0xffffffff)", "has exited"})
        CHECK(contains(msg, part), "the message lacks '%s': %s", part, msg);
    CHECK(cudaGetLastError() == cudaErrorLaunchFailure, "cudaGetLastError after the failed shuffle");
    LAUNCH(bad_mask_kernel, 1, 32, 0, 0)(out);
    msg = emu::last_error_message();
    CHECK(cudaGetLastError() == cudaErrorLaunchFailure, "a mask without the calling lane not reported as a launch failure");
    for (const char* part : {"bad_mask_kernel", "does not name the calling lane"})
        CHECK(contains(msg, part), "the message lacks '%s': %s", part, msg);
    // The harness recovers: the legal half-warp shuffle runs.
    LAUNCH(half_warp_shuffle_ok_kernel, 1, 32, 0, 0)(out);
    CHECK(cudaGetLastError() == cudaSuccess, "launch after a deadlock failed: %s", emu::last_error_message());
    std::vector<float> got = to_host(out, 32);
    for (int t = 0; t < 32; t++) {
        float want = t < 15 ? 2.0f * t + 1 : t == 15 ? 30.0f : (float)t;  // lane 15 is its segment's last
        CHECK(got[t] == want, "lane %d: %g, want %g", t, got[t], want);
    }
    cudaFree(out);
}

TEST(emu_warp_operations) {
    ForwardOnExit restore;
    const int n = 64;
    int* out = nullptr;
    cudaMalloc(&out, n * 9 * sizeof(int));
    for (emu::Order o : kOrders) {
        emu::set_order(o, 5);
        LAUNCH(warp_ops_kernel, 1, n, 0, 0)(out);
        CHECK(cudaGetLastError() == cudaSuccess, "%s", emu::last_error_message());
        std::vector<int> got = to_host(out, n * 9);
        unsigned ballot = 0;
        for (int l = 0; l < 32; l += 3) ballot |= 1u << l;
        for (int t = 0; t < n; t++) {
            int lane = t % 32, w0 = t - lane;
            int want[9] = {(w0 + 3) * 10, t ^ 1, lane % 8 >= 2 ? t - 2 : t, lane % 16 + 4 < 16 ? t + 4 : t,
                           (int)ballot, w0 == 32, 0, n / 2, -1};
            for (int j = 0; j < 9; j++)
                CHECK(got[t * 9 + j] == want[j], "%s order: thread %d op %d: %d, want %d", order_name(o), t, j,
                      got[t * 9 + j], want[j]);
        }
    }
    // In a partial warp (48 threads: the second warp has 16 lanes) a full mask
    // names lanes that never arrive: undefined on a GPU, an error here.
    LAUNCH(warp_ops_kernel, 1, 48, 0, 0)(out);
    const char* msg = emu::last_error_message();
    CHECK(cudaGetLastError() == cudaErrorLaunchFailure, "full-mask shuffle in a partial warp accepted");
    for (const char* part : {"in kernel warp_ops_kernel", "test_emu_harness.cpp:",
                             "__shfl_sync: mask 0xffffffff names lanes this partial warp lacks (it has 16 threads"})
        CHECK(contains(msg, part), "the message lacks '%s': %s", part, msg);
    // __activemask there names only the lanes that exist, and is a legal mask.
    LAUNCH(partial_warp_ok_kernel, 1, 48, 0, 0)(out);
    CHECK(cudaGetLastError() == cudaSuccess, "%s", emu::last_error_message());
    std::vector<int> got = to_host(out, 48);
    CHECK(got[40] == 32 + 0xffff, "partial warp: lane 8 got %d, want %d", got[40], 32 + 0xffff);
    CHECK(got[5] == (int)0xffffffff, "whole warp: lane 5 got 0x%x, want 0xffffffff", (unsigned)got[5]);
    cudaFree(out);
}

TEST(emu_block_order_is_forward_reverse_or_seeded_random) {
    ForwardOnExit restore;
    const int nb = 12;
    int *tickets, *counter;
    cudaMalloc(&tickets, nb * sizeof(int));
    cudaMalloc(&counter, sizeof(int));
    auto run = [&](emu::Order o, uint64_t seed) {
        emu::set_order(emu::FORWARD, seed);
        emu::set_block_order(o);
        cudaMemset(counter, 0, sizeof(int));
        LAUNCH(block_ticket_kernel, dim3(4, 3), 32, 0, 0)(tickets, counter);
        return to_host(tickets, nb);
    };
    std::vector<int> f = run(emu::FORWARD, 1), r = run(emu::REVERSE, 1);
    for (int b = 0; b < nb; b++) {
        CHECK(f[b] == b, "forward: block %d ran %d-th", b, f[b]);
        CHECK(r[b] == nb - 1 - b, "reverse: block %d ran %d-th", b, r[b]);
    }
    std::vector<int> a = run(emu::RANDOM, 5), c = run(emu::RANDOM, 6);
    std::vector<int> seen(nb, 0);
    for (int b = 0; b < nb; b++) seen[a[b]]++;
    CHECK(std::count(seen.begin(), seen.end(), 1) == nb, "random block order is not a permutation");
    CHECK(a != c, "seeds 5 and 6 gave the same block order");
    CHECK(a != f, "seed 5 gave forward's block order");
    cudaFree(tickets);
    cudaFree(counter);
}

TEST(emu_catches_a_race_between_blocks) {
    ForwardOnExit restore;
    const int nb = 8;
    std::vector<float> ones(nb, 1.0f);
    float* x = to_device(ones);
    auto chained = [&](emu::Order o, uint64_t seed) {  // did every block see its predecessor's total?
        emu::set_order(emu::FORWARD, seed);
        emu::set_block_order(o);
        cudaMemcpy(x, ones.data(), nb * sizeof(float), cudaMemcpyHostToDevice);
        LAUNCH(chain_racy_kernel, nb, 32, 0, 0)(x);
        std::vector<float> got = to_host(x, nb);
        for (int b = 0; b < nb; b++) if (got[b] != b + 1.0f) return false;
        return true;
    };
    // Forward order runs the chain as written: the race passes unnoticed there.
    CHECK(chained(emu::FORWARD, 1), "the chain under forward block order");
    CHECK(!chained(emu::REVERSE, 1), "race between blocks not caught under reverse block order");
    int caught = 0;
    for (uint64_t seed = 1; seed <= 10; seed++) caught += !chained(emu::RANDOM, seed);
    CHECK(caught == 10, "race between blocks caught under %d of 10 random block orders", caught);
    cudaFree(x);
}

TEST(emu_thread_order_is_forward_reverse_or_seeded_random) {
    ForwardOnExit restore;
    const int n = 64;
    int *tickets, *counter;
    cudaMalloc(&tickets, 2 * n * sizeof(int));
    cudaMalloc(&counter, sizeof(int));
    auto run = [&](emu::Order o, uint64_t seed) {
        emu::set_order(o, seed);
        cudaMemset(counter, 0, sizeof(int));
        LAUNCH(ticket_kernel, 1, n, 0, 0)(tickets, counter);
        return to_host(tickets, 2 * n);
    };
    std::vector<int> f = run(emu::FORWARD, 1), r = run(emu::REVERSE, 1);
    for (int t = 0; t < n; t++) {
        CHECK(f[t] == t, "forward: thread %d ran %d-th before the barrier", t, f[t]);
        CHECK(f[n + t] == t, "forward: thread %d ran %d-th after the barrier", t, f[n + t]);
        CHECK(r[t] == n - 1 - t, "reverse: thread %d ran %d-th before the barrier", t, r[t]);
        CHECK(r[n + t] == n - 1 - t, "reverse: thread %d ran %d-th after the barrier", t, r[n + t]);
    }
    std::vector<int> a = run(emu::RANDOM, 5), b = run(emu::RANDOM, 5), c = run(emu::RANDOM, 6);
    CHECK(a == b, "one seed, two schedules");
    CHECK(a != c, "seeds 5 and 6 gave the same schedule");
    CHECK(!std::equal(a.begin(), a.begin() + n, a.begin() + n), "the two phases ran in the same order");
    std::vector<int> seen(n, 0);
    for (int t = 0; t < n; t++) seen[a[t]]++;
    CHECK(std::count(seen.begin(), seen.end(), 1) == n, "random order is not a permutation");
    cudaFree(tickets);
    cudaFree(counter);
}

TEST(emu_refuses_launches_cuda_refuses) {
    float* out = nullptr;
    cudaMalloc(&out, 2048 * sizeof(float));
    cudaMemset(out, 0, 2048 * sizeof(float));
    long before = emu::kernels_run();
    LAUNCH(fill_kernel, 1, 1025, 0, 0)(out, 1.0f);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "1025 threads accepted");
    LAUNCH(fill_kernel, 1, dim3(1, 1, 65), 0, 0)(out, 1.0f);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "block.z = 65 accepted");
    LAUNCH(fill_kernel, 0, 32, 0, 0)(out, 1.0f);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "empty grid accepted");
    LAUNCH(fill_kernel, dim3(1, 65536), 32, 0, 0)(out, 1.0f);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "grid.y = 65536 accepted");
    CHECK(emu::kernels_run() == before, "a refused launch ran: %ld kernels", emu::kernels_run() - before);
    CHECK(to_host(out, 2048)[0] == 0.0f, "a refused launch wrote its output");
    LAUNCH(fill_kernel, 2, 1024, 0, 0)(out, 1.0f);
    CHECK(cudaGetLastError() == cudaSuccess, "a legal launch failed: %s", emu::last_error_message());
    CHECK(to_host(out, 2048)[2047] == 1.0f, "a legal launch did not write its last value");

    // Dynamic shared memory above 48 KiB needs the opt-in, as on the GPU.
    const int nf = 16 * 1024;  // 64 KiB of floats
    float* big = nullptr;
    cudaMalloc(&big, nf * sizeof(float));
    LAUNCH(dynamic_smem_kernel, 1, 256, nf * sizeof(float), 0)(big, nf);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue, "64 KiB of dynamic smem accepted without the attribute");
    CHECK(cudaFuncSetAttribute(dynamic_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 228 * 1024) ==
              cudaErrorInvalidValue, "opt-in beyond 227 KiB accepted");
    cudaGetLastError();
    CHECK(cudaFuncSetAttribute(dynamic_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, nf * 4) == cudaSuccess, "opt-in");
    LAUNCH(dynamic_smem_kernel, 1, 256, nf * sizeof(float), 0)(big, nf);
    CHECK(cudaGetLastError() == cudaSuccess, "64 KiB after opt-in refused: %s", emu::last_error_message());
    std::vector<float> got = to_host(big, nf);
    for (int i = 0; i < nf; i++) CHECK(got[i] == (float)(nf - 1 - i), "dynamic smem out[%d] = %g", i, got[i]);
    LAUNCH(dynamic_smem_kernel, 1, 256, nf * 4 + 4, 0)(big, nf);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue, "more than the opted-in size accepted");
    cudaFree(big);
    cudaFree(out);
}

// A host pointer handed to a kernel: a GPU that reaches host memory (HMM,
// pinned memory) writes there without a fault, so the harness refuses it.
TEST(emu_refuses_a_host_pointer_argument) {
    float* dev = nullptr;
    cudaMalloc(&dev, 64 * sizeof(float));
    std::vector<float> host(64, 0.0f);
    long before = emu::kernels_run();
    LAUNCH(fill_kernel, 1, 64, 0, 0)(host.data(), 1.0f);
    CHECK(cudaGetLastError() == cudaErrorIllegalAddress, "a host pointer argument accepted");
    CHECK(emu::kernels_run() == before, "the kernel ran with a host pointer");
    CHECK(host[0] == 0.0f, "the kernel wrote host memory");
    LAUNCH(fill_kernel, 1, 32, 0, 0)(dev + 32, 1.0f);  // inside an allocation, not at its start
    CHECK(cudaGetLastError() == cudaSuccess, "a pointer into an allocation refused: %s", emu::last_error_message());
    CHECK(to_host(dev, 64)[63] == 1.0f, "a pointer into an allocation: the kernel did not write through it");
    cudaFree(dev);
}

TEST(emu_shared_memory_starts_as_nan) {
    float* out = nullptr;
    int* dyn = nullptr;
    cudaMalloc(&out, 64 * sizeof(float));
    cudaMalloc(&dyn, 64 * sizeof(int));
    LAUNCH(read_before_write_kernel, 2, 32, 32 * sizeof(int), 0)(out, dyn);
    std::vector<float> got = to_host(out, 64);
    std::vector<int> dgot = to_host(dyn, 64);
    for (int i = 0; i < 64; i++) {
        CHECK(std::isnan(got[i]), "static __shared__ read before write gave %g at %d (block %d)", got[i], i, i / 32);
        CHECK(dgot[i] == -1, "dynamic shared read before write gave %d at %d", dgot[i], i);
    }
    // cudaMalloc'd memory is NaN too, as uninitialised GPU memory may hold anything.
    float* fresh = nullptr;
    cudaMalloc(&fresh, 4 * sizeof(float));
    CHECK(std::isnan(to_host(fresh, 4)[3]), "fresh cudaMalloc memory is not NaN");
    cudaFree(fresh); cudaFree(out); cudaFree(dyn);
}

TEST(emu_shared_memory_in_templated_kernel) {
    float* out = nullptr;
    cudaMalloc(&out, 64 * sizeof(float));
    LAUNCH(template_smem_kernel<32>, 2, 32, 0, 0)(out);
    std::vector<float> got = to_host(out, 64);
    cudaFree(out);
    bool poisoned = std::isnan(got[0]) && std::isnan(got[63]);
#if defined(__clang__)
    CHECK(poisoned, "static __shared__ in a template kernel not poisoned: %g", got[63]);
#else
    if (!poisoned) SKIP("g++ ignores section attributes in templates: __shared__ there is not NaN-poisoned (see support/harness/cuda_on_cpu.h)");
#endif
}

TEST(emu_graph_capture_records_and_replays) {
    const int n = 100;
    float *x, *y;
    cudaMalloc(&x, n * sizeof(float));
    cudaMalloc(&y, n * sizeof(float));
    cudaMemset(x, 0, n * sizeof(float));
    cudaMemset(y, 0, n * sizeof(float));
    cudaStream_t s = nullptr;
    cudaStreamCreate(&s);
    long before = emu::kernels_run();
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin capture");
    float inc = 1.0f;
    for (int i = 0; i < 3; i++) LAUNCH(add_kernel, (n + 31) / 32, 32, 0, s)(x, inc, n);
    inc = 100.0f;  // arguments were captured by value: the graph still adds 1
    cudaMemcpyAsync(y, x, n * sizeof(float), cudaMemcpyDeviceToDevice, s);
    cudaStreamCaptureStatus st;
    cudaStreamIsCapturing(s, &st);
    CHECK(st == cudaStreamCaptureStatusActive, "stream not capturing");
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess, "end capture: %s", emu::last_error_message());
    CHECK(emu::kernels_run() == before, "a captured launch ran during capture");
    CHECK(to_host(x, n)[0] == 0.0f, "a captured copy or launch wrote during capture");
    size_t nodes = 0;
    cudaGraphGetNodes(graph, nullptr, &nodes);
    CHECK(nodes == 4, "graph has %zu nodes, want 4", nodes);
    cudaGraphExec_t exec = nullptr;
    CHECK(cudaGraphInstantiate(&exec, graph, 0ULL) == cudaSuccess, "instantiate");
    cudaGraphLaunch(exec, s);
    cudaGraphLaunch(exec, s);
    cudaStreamSynchronize(s);
    std::vector<float> hx = to_host(x, n), hy = to_host(y, n);
    for (int i = 0; i < n; i++) {
        CHECK(hx[i] == 6.0f, "after two replays x[%d] = %g, want 6", i, hx[i]);
        CHECK(hy[i] == 6.0f, "after two replays y[%d] = %g, want 6", i, hy[i]);
    }
    CHECK(emu::kernels_run() == before + 6, "%ld kernels ran, want 6", emu::kernels_run() - before);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);

    // Fork and join through events: work on a second stream joins the capture.
    cudaStream_t s2 = nullptr;
    cudaStreamCreate(&s2);
    cudaEvent_t fork = nullptr, join = nullptr;
    cudaEventCreate(&fork);
    cudaEventCreate(&join);
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    cudaEventRecord(fork, s);
    cudaStreamWaitEvent(s2, fork, 0);
    LAUNCH(add_kernel, (n + 31) / 32, 32, 0, s2)(y, 10.0f, n);
    cudaEventRecord(join, s2);
    cudaStreamWaitEvent(s, join, 0);
    CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess, "fork/join capture: %s", emu::last_error_message());
    CHECK(to_host(y, n)[0] == 6.0f, "the forked launch ran during capture");
    cudaGraphInstantiate(&exec, graph, 0ULL);
    cudaGraphLaunch(exec, s);
    CHECK(to_host(y, n)[0] == 16.0f, "fork/join replay: y = %g, want 16", to_host(y, n)[0]);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);

    // What CUDA forbids during a global-mode capture invalidates it.
    void* p = nullptr;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    CHECK(cudaMalloc(&p, 16) == cudaErrorStreamCaptureUnsupported, "cudaMalloc during global capture allowed");
    CHECK(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated, "capture not invalidated");
    CHECK(graph == nullptr, "an invalidated capture gave a graph");
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    std::vector<float> h(n);
    CHECK(cudaMemcpy(h.data(), x, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaErrorStreamCaptureImplicit,
          "synchronous cudaMemcpy during capture allowed");
    CHECK(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated, "capture not invalidated");
    cudaGetLastError();
    cudaEventDestroy(fork); cudaEventDestroy(join);
    cudaStreamDestroy(s); cudaStreamDestroy(s2);
    cudaFree(x); cudaFree(y);
}

TEST(emu_streams_and_events) {
    const int n = 64;
    float* x = nullptr;
    cudaMalloc(&x, n * sizeof(float));
    cudaStream_t a = nullptr, b = nullptr;
    cudaStreamCreate(&a);
    cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
    cudaEvent_t start = nullptr, stop = nullptr, untimed = nullptr, never = nullptr;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming);
    cudaEventCreate(&never);
    std::vector<float> h(n, 1.0f), back(n);
    cudaEventRecord(start, a);
    cudaMemcpyAsync(x, h.data(), n * sizeof(float), cudaMemcpyHostToDevice, a);
    LAUNCH(add_kernel, 2, 32, 0, a)(x, 2.0f, n);
    cudaEventRecord(stop, a);
    cudaEventRecord(untimed, a);
    cudaStreamWaitEvent(b, stop, 0);  // b's work comes after a's
    LAUNCH(add_kernel, 2, 32, 0, b)(x, 4.0f, n);
    cudaMemcpyAsync(back.data(), x, n * sizeof(float), cudaMemcpyDeviceToHost, b);
    CHECK(cudaStreamSynchronize(b) == cudaSuccess, "cudaStreamSynchronize: %s", emu::last_error_message());
    CHECK(cudaEventSynchronize(stop) == cudaSuccess, "cudaEventSynchronize: %s", emu::last_error_message());
    for (int i = 0; i < n; i++) CHECK(back[i] == 7.0f, "x[%d] = %g, want 7", i, back[i]);
    float ms = -1;
    CHECK(cudaEventElapsedTime(&ms, start, stop) == cudaSuccess, "cudaEventElapsedTime: %s", emu::last_error_message());
    CHECK(ms >= 0, "elapsed time %g ms, want 0 or more", ms);
    CHECK(cudaEventElapsedTime(&ms, start, untimed) == cudaErrorInvalidResourceHandle, "timing a DisableTiming event");
    CHECK(cudaEventElapsedTime(&ms, start, never) == cudaErrorInvalidResourceHandle, "timing an unrecorded event");
    cudaGetLastError();
    cudaEventDestroy(start); cudaEventDestroy(stop); cudaEventDestroy(untimed); cudaEventDestroy(never);
    cudaStreamDestroy(a); cudaStreamDestroy(b);
    cudaFree(x);
}

// A stream defers its work until something waits for it; a stream that uses
// another's results without cudaStreamWaitEvent runs before them.
TEST(emu_streams_defer_work_until_waited_for) {
    const int n = 64;
    std::vector<float> h(n, 3.0f);
    float *x, *y;
    cudaMalloc(&x, n * sizeof(float));
    cudaMalloc(&y, n * sizeof(float));
    cudaStream_t a, b;
    cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
    cudaEvent_t done;
    cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    auto consume = [&](bool wait) {  // a fills x; b computes y = 2 x; y read after b is synchronised
        cudaMemset(x, 0xFF, n * sizeof(float));
        cudaMemcpyAsync(x, h.data(), n * sizeof(float), cudaMemcpyHostToDevice, a);
        cudaEventRecord(done, a);
        if (wait) cudaStreamWaitEvent(b, done, 0);
        LAUNCH(scale_kernel, 2, 32, 0, b)(y, x, 2.0f, n);
        cudaStreamSynchronize(b);
        std::vector<float> got = to_host(y, n);
        cudaStreamSynchronize(a);
        return got[n - 1];
    };
    float missing = consume(false), joined = consume(true);
    CHECK(std::isnan(missing), "a missing cudaStreamWaitEvent went unnoticed: y = %g", missing);
    CHECK(joined == 6.0f, "with the wait: y = %g, want 6", joined);

    // A device-to-host copy into pinned memory: NaN until something waits for it.
    float* pinned = nullptr;
    cudaMallocHost(&pinned, n * sizeof(float));
    LAUNCH(scale_kernel, 2, 32, 0, a)(y, x, 5.0f, n);
    cudaMemcpyAsync(pinned, y, n * sizeof(float), cudaMemcpyDeviceToHost, a);
    float early = pinned[7];
    cudaEventRecord(done, a);
    cudaEventSynchronize(done);
    CHECK(std::isnan(early), "pinned copy: %g before the wait, want NaN (the copy not yet made)", early);
    CHECK(pinned[7] == 15.0f, "pinned copy: %g after the wait, want 15", pinned[7]);
    // A pageable source may be reused as soon as cudaMemcpyAsync returns.
    std::vector<float> src(n, 1.0f);
    cudaMemcpyAsync(x, src.data(), n * sizeof(float), cudaMemcpyHostToDevice, a);
    src.assign(n, -1.0f);
    cudaStreamSynchronize(a);
    CHECK(to_host(x, n)[0] == 1.0f, "pageable source read after cudaMemcpyAsync returned");

    // The legacy stream waits for blocking streams, not for non-blocking ones.
    cudaStream_t blocking;
    cudaStreamCreate(&blocking);
    for (cudaStream_t s : {a, blocking}) {
        cudaMemset(y, 0xFF, n * sizeof(float));
        LAUNCH(scale_kernel, 2, 32, 0, s)(y, x, 4.0f, n);
        float got = to_host(y, n)[0];  // cudaMemcpy on the legacy stream
        bool nonblocking = s == a;
        CHECK(nonblocking ? std::isnan(got) : got == 4.0f, "legacy cudaMemcpy after a %s stream's kernel: %g",
              nonblocking ? "non-blocking" : "blocking", got);
        cudaStreamSynchronize(s);
    }
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize: %s", emu::last_error_message());
    CHECK(cudaGetLastError() == cudaSuccess, "cudaGetLastError: %s", emu::last_error_message());
    cudaFreeHost(pinned);
    cudaEventDestroy(done);
    cudaStreamDestroy(a); cudaStreamDestroy(b); cudaStreamDestroy(blocking);
    cudaFree(x); cudaFree(y);
}

// Memory is NaN when allocated, and (optionally) scratch again before each
// graph replay: a sum into memory nobody zeroed, and a graph that reads what
// only the eager run before capture wrote, give NaN.
TEST(emu_nan_allocations_and_replays_catch_unwritten_reads) {
    const int n = 32;
    float *acc, *scratch, *out;
    cudaMalloc(&acc, n * sizeof(float));
    LAUNCH(add_kernel, 1, 32, 0, 0)(acc, 1.0f, n);  // the bug: no cudaMemset(acc, 0) first
    CHECK(std::isnan(to_host(acc, n)[0]), "a sum into unzeroed memory gave %g", to_host(acc, n)[0]);
    cudaMalloc(&scratch, n * sizeof(float));
    cudaMalloc(&out, n * sizeof(float));
    cudaStream_t s;
    cudaStreamCreate(&s);
    auto replayed = [&](bool writes_scratch, bool poison) {  // eager step, capture, one replay
        if (poison) emu::poison_before_replay(scratch, n * sizeof(float));
        cudaMemsetAsync(scratch, 0, n * sizeof(float), s);
        LAUNCH(add_kernel, 1, 32, 0, s)(scratch, 3.0f, n);
        cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
        if (writes_scratch) {
            cudaMemsetAsync(scratch, 0, n * sizeof(float), s);
            LAUNCH(add_kernel, 1, 32, 0, s)(scratch, 3.0f, n);
        }
        LAUNCH(scale_kernel, 1, 32, 0, s)(out, scratch, 2.0f, n);
        cudaGraph_t g = nullptr;
        cudaGraphExec_t exec = nullptr;
        cudaStreamEndCapture(s, &g);
        cudaGraphInstantiate(&exec, g, 0ULL);
        cudaGraphLaunch(exec, s);
        cudaStreamSynchronize(s);
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(g);
        emu::clear_replay_poison();
        return to_host(out, n)[n - 1];
    };
    float unnoticed = replayed(false, false), caught = replayed(false, true), right = replayed(true, true);
    CHECK(unnoticed == 6.0f, "without poisoning the replay reads the eager step's 3s: %g", unnoticed);
    CHECK(std::isnan(caught), "a replay that reads scratch it never wrote gave %g, want NaN", caught);
    CHECK(right == 6.0f, "a replay that writes its scratch first gave %g, want 6", right);
    cudaStreamDestroy(s);
    cudaFree(acc); cudaFree(scratch); cudaFree(out);
}

TEST(emu_thread_stack_size_is_configurable) {
    float* out = nullptr;
    cudaMalloc(&out, 4 * sizeof(float));
    emu::set_stack_size(128 << 10);
    LAUNCH(big_stack_kernel, 1, 4, 0, 0)(out);
    emu::set_stack_size(64 << 10);
    CHECK(cudaGetLastError() == cudaSuccess, "96 KiB of locals on a 128 KiB stack: %s", emu::last_error_message());
    CHECK(to_host(out, 4)[3] == (float)(24 * 1024 - 4), "96 KiB of locals on a 128 KiB stack: thread 3 wrote %g, want %d",
          to_host(out, 4)[3], 24 * 1024 - 4);
    cudaFree(out);
}

// ---------------------------------------------------------------------------
// Tests: runtime API.

TEST(emu_memory_api) {
    size_t free0 = 0, total = 0, free1 = 0;
    cudaMemGetInfo(&free0, &total);
    CHECK(total == (24ull << 30), "cudaMemGetInfo: total %zu bytes, want 24 GiB", total);
    CHECK(free0 <= total, "cudaMemGetInfo: %zu free of %zu", free0, total);
    void* huge = nullptr;
    CHECK(cudaMalloc(&huge, 1ull << 40) == cudaErrorMemoryAllocation, "1 TiB cudaMalloc did not fail");
    CHECK(huge == nullptr, "a failed cudaMalloc set its pointer");
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation, "cudaGetLastError after the failed cudaMalloc");
    float* d = nullptr;
    CHECK(cudaMalloc(&d, 1 << 20) == cudaSuccess, "cudaMalloc 1 MiB");
    CHECK(((uintptr_t)d & 255) == 0, "cudaMalloc is 256-byte aligned");
    cudaMemGetInfo(&free1, &total);
    CHECK(free0 - free1 == (1 << 20), "cudaMemGetInfo did not see the allocation");
    std::vector<float> h(16, 3.0f), back(16, 0.0f);
    float* pinned = nullptr;
    CHECK(cudaMallocHost(&pinned, 16 * sizeof(float)) == cudaSuccess, "cudaMallocHost");
    CHECK(cudaMemcpy(d, h.data(), 64, cudaMemcpyHostToDevice) == cudaSuccess, "H2D");
    CHECK(cudaMemcpy(d + 16, d, 64, cudaMemcpyDeviceToDevice) == cudaSuccess, "D2D");
    CHECK(cudaMemcpy(pinned, d + 16, 64, cudaMemcpyDefault) == cudaSuccess, "Default");
    CHECK(cudaMemcpy(back.data(), pinned, 64, cudaMemcpyHostToHost) == cudaSuccess, "H2H");
    CHECK(back == h, "H2D, D2D, D2H, H2H: the values did not come back");
    CHECK(cudaMemset(d, 0, 64) == cudaSuccess, "cudaMemset failed");
    CHECK(to_host(d, 1)[0] == 0.0f, "cudaMemset did not write 0");
    CHECK(cudaMemcpy(h.data(), back.data(), 64, cudaMemcpyHostToDevice) == cudaErrorInvalidValue, "H2D into host memory");
    CHECK(cudaMemcpy(back.data(), d + (1 << 18) - 8, 64, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue, "D2H past the end");
    CHECK(cudaMemcpy(back.data(), d, 64, (cudaMemcpyKind)7) == cudaErrorInvalidMemcpyDirection, "bad kind");
    CHECK(cudaFree(h.data()) == cudaErrorInvalidValue, "cudaFree of host memory");
    CHECK(cudaFree(d) == cudaSuccess, "cudaFree");
    CHECK(cudaFreeHost(pinned) == cudaSuccess, "cudaFreeHost");
    CHECK(cudaFree(nullptr) == cudaSuccess, "cudaFree(nullptr)");
    cudaMemGetInfo(&free1, &total);
    CHECK(free1 == free0, "memory not returned");
    cudaGetLastError();
}

TEST(emu_device_queries_and_no_device) {
    int count = -1;
    CHECK(cudaGetDeviceCount(&count) == cudaSuccess, "cudaGetDeviceCount failed");
    CHECK(count == 1, "device count %d, want 1", count);
    cudaDeviceProp p;
    CHECK(cudaGetDeviceProperties(&p, 0) == cudaSuccess, "properties");
    CHECK(!strcmp(p.name, "lime-emu (CUDA on the CPU)"), "name '%s'", p.name);
    struct { const char* name; size_t got, want; } props[] = {
        {"major", (size_t)p.major, 9},
        {"minor", (size_t)p.minor, 0},
        {"maxThreadsPerBlock", (size_t)p.maxThreadsPerBlock, 1024},
        {"sharedMemPerBlock", p.sharedMemPerBlock, 48 * 1024},
        {"sharedMemPerBlockOptin", p.sharedMemPerBlockOptin, 227 * 1024},
        {"warpSize", (size_t)p.warpSize, 32},
        {"multiProcessorCount", (size_t)p.multiProcessorCount, 8},
        {"totalGlobalMem", p.totalGlobalMem, 24ull << 30},
    };
    for (auto& k : props) CHECK(k.got == k.want, "%s %zu, want %zu", k.name, k.got, k.want);
    CHECK(cudaSetDevice(1) == cudaErrorInvalidDevice, "device 1 exists");
    CHECK(cudaSetDevice(0) == cudaSuccess, "device 0");
    setenv("LIME_EMU_NO_DEVICE", "1", 1);
    cudaError_t e = cudaGetDeviceCount(&count);
    void* ptr = nullptr;
    cudaError_t em = cudaMalloc(&ptr, 16);
    unsetenv("LIME_EMU_NO_DEVICE");
    CHECK(e == cudaErrorNoDevice, "LIME_EMU_NO_DEVICE=1: cudaGetDeviceCount says %s", cudaGetErrorName(e));
    CHECK(count == 0, "LIME_EMU_NO_DEVICE=1: device count %d, want 0", count);
    CHECK(em == cudaErrorNoDevice, "cudaMalloc without a device: %s", cudaGetErrorName(em));
    CHECK(!strcmp(cudaGetErrorString(e), "no CUDA-capable device is detected"), "%s", cudaGetErrorString(e));
    cudaGetLastError();
    CHECK(cudaGetDeviceCount(&count) == cudaSuccess, "device gone after unsetenv");
    CHECK(count == 1, "device count %d after unsetenv, want 1", count);
}

// ---------------------------------------------------------------------------
// Tests: cuBLAS.

// The definition, in double: C = alpha op(A) op(B) + beta C, column-major.
static void gemm_reference(bool ta, bool tb, int m, int n, int k, float alpha, const float* A, int lda, const float* B,
                           int ldb, float beta, float* C, int ldc) {
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int l = 0; l < k; l++) s += (double)(ta ? A[l + i * lda] : A[i + l * lda]) * (tb ? B[j + l * ldb] : B[l + j * ldb]);
            C[i + j * ldc] = (float)(alpha * s + (beta == 0.0f ? 0.0 : (double)beta * C[i + j * ldc]));
        }
}

TEST(emu_cublas_sgemm_matches_definition) {
    cublasHandle_t h = nullptr;
    CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS, "cublasCreate");
    const int m = 5, n = 7, k = 3, batch = 3;
    const float alpha = 0.7f, beta = -1.3f, zero = 0.0f;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int lda = (ta ? k : m) + 2, ldb = (tb ? n : k) + 1, ldc = m + 3;
            long long sA = (long long)lda * (ta ? m : k) + 5, sB = (long long)ldb * (tb ? k : n) + 3, sC = (long long)ldc * n + 4;
            std::vector<float> A = ramp(sA * batch, 2.0f), B = ramp(sB * batch, 3.0f), C0 = ramp(sC * batch, 1.0f);
            for (float& x : B) x = -x + 0.25f;  // not the same values as A
            float *dA = to_device(A), *dB = to_device(B), *dC = to_device(C0);
            cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;

            // Sgemm, batch entry 0 only; the padding rows of C must survive.
            std::vector<float> want = C0;
            gemm_reference(ta, tb, m, n, k, alpha, A.data(), lda, B.data(), ldb, beta, want.data(), ldc);
            CHECK(cublasSgemm(h, opa, opb, m, n, k, &alpha, dA, lda, dB, ldb, &beta, dC, ldc) == CUBLAS_STATUS_SUCCESS, "sgemm");
            std::vector<float> got = to_host(dC, sC * batch);
            CHECK(rel_err(got.data(), want.data(), got.size()) < 1e-6, "sgemm op(%c,%c): rel err %.2e",
                  "NT"[ta], "NT"[tb], rel_err(got.data(), want.data(), got.size()));

            // Strided batched over 3 entries.
            cudaMemcpy(dC, C0.data(), C0.size() * sizeof(float), cudaMemcpyHostToDevice);
            want = C0;
            for (int b = 0; b < batch; b++)
                gemm_reference(ta, tb, m, n, k, alpha, A.data() + b * sA, lda, B.data() + b * sB, ldb, beta, want.data() + b * sC, ldc);
            CHECK(cublasSgemmStridedBatched(h, opa, opb, m, n, k, &alpha, dA, lda, sA, dB, ldb, sB, &beta, dC, ldc, sC, batch) ==
                      CUBLAS_STATUS_SUCCESS, "strided batched");
            got = to_host(dC, sC * batch);
            CHECK(rel_err(got.data(), want.data(), got.size()) < 1e-6, "strided batched op(%c,%c): rel err %.2e",
                  "NT"[ta], "NT"[tb], rel_err(got.data(), want.data(), got.size()));

            // beta == 0: C is not read, so NaN there does not survive.
            cudaMemset(dC, 0xFF, C0.size() * sizeof(float));
            CHECK(cublasSgemm(h, opa, opb, m, n, k, &alpha, dA, lda, dB, ldb, &zero, dC, ldc) == CUBLAS_STATUS_SUCCESS, "beta 0");
            got = to_host(dC, ldc * n);
            want.assign(ldc * n, 0.0f);
            gemm_reference(ta, tb, m, n, k, alpha, A.data(), lda, B.data(), ldb, 0.0f, want.data(), ldc);
            for (int j = 0; j < n; j++)
                for (int i = 0; i < m; i++)
                    CHECK(std::fabs(got[i + j * ldc] - want[i + j * ldc]) < 1e-5, "beta 0 op(%c,%c): C(%d,%d) = %g, want %g",
                          "NT"[ta], "NT"[tb], i, j, got[i + j * ldc], want[i + j * ldc]);
            cudaFree(dA); cudaFree(dB); cudaFree(dC);
        }
    cublasDestroy(h);
}

TEST(emu_cublas_tf32_and_larger_products) {
    cublasHandle_t h = nullptr;
    cublasCreate(&h);
    const int m = 96, n = 80, k = 200;
    const float one = 1.0f, zero = 0.0f;
    std::vector<float> A = ramp(m * k, 2.0f), B = ramp(k * n, 2.0f), want(m * n);
    for (float& x : B) x = 1.0f - x;
    gemm_reference(true, false, m, n, k, 1.0f, A.data(), k, B.data(), k, 0.0f, want.data(), m);
    float *dA = to_device(A), *dB = to_device(B), *dC = nullptr;
    cudaMalloc(&dC, m * n * sizeof(float));
    cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, dA, k, dB, k, &zero, dC, m);
    double e32 = rel_err(to_host(dC, m * n).data(), want.data(), m * n);
    CHECK(cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH) == CUBLAS_STATUS_SUCCESS, "math mode");
    cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, dA, k, dB, k, &zero, dC, m);
    double etf = rel_err(to_host(dC, m * n).data(), want.data(), m * n);
    CHECK(e32 < 1e-6, "fp32 rel err %.2e", e32);
    CHECK(etf > 1e-5 && etf < 2e-3, "tf32 rel err %.2e: inputs should be rounded to 10 mantissa bits", etf);
    cudaFree(dA); cudaFree(dB); cudaFree(dC);
    cublasDestroy(h);
}

TEST(emu_cublas_refuses_what_cublas_refuses) {
    cublasHandle_t h = nullptr;
    cublasCreate(&h);
    const float one = 1.0f;
    float* C = nullptr;
    cudaMalloc(&C, 64 * sizeof(float));
    cudaMemset(C, 0, 64 * sizeof(float));
    const float* A = C;
    const float* B = C;
    struct Case { cublasOperation_t ta, tb; int m, n, k, lda, ldb, ldc, batch; const char* what; };
    const Case cases[] = {
        {CUBLAS_OP_N, CUBLAS_OP_N, -1, 2, 2, 2, 2, 2, 1, "m < 0"},
        {CUBLAS_OP_N, CUBLAS_OP_N, 2, -1, 2, 2, 2, 2, 1, "n < 0"},
        {CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, -1, 2, 2, 2, 1, "k < 0"},
        {CUBLAS_OP_N, CUBLAS_OP_N, 4, 2, 3, 3, 3, 4, 1, "lda < m with A not transposed"},
        {CUBLAS_OP_T, CUBLAS_OP_N, 4, 2, 3, 2, 3, 4, 1, "lda < k with A transposed"},
        {CUBLAS_OP_N, CUBLAS_OP_N, 4, 2, 3, 4, 2, 4, 1, "ldb < k with B not transposed"},
        {CUBLAS_OP_N, CUBLAS_OP_T, 4, 2, 3, 4, 1, 4, 1, "ldb < n with B transposed"},
        {CUBLAS_OP_N, CUBLAS_OP_N, 4, 2, 3, 4, 3, 3, 1, "ldc < m"},
        {CUBLAS_OP_N, CUBLAS_OP_N, 0, 2, 3, 0, 3, 1, 1, "lda < 1"},
        {CUBLAS_OP_N, CUBLAS_OP_N, 4, 2, 3, 4, 3, 4, -1, "batchCount < 0"},
    };
    for (const Case& c : cases) {
        cublasStatus_t s = c.batch == 1
            ? cublasSgemm(h, c.ta, c.tb, c.m, c.n, c.k, &one, A, c.lda, B, c.ldb, &one, C, c.ldc)
            : cublasSgemmStridedBatched(h, c.ta, c.tb, c.m, c.n, c.k, &one, A, c.lda, 0, B, c.ldb, 0, &one, C, c.ldc, 0, c.batch);
        CHECK(s == CUBLAS_STATUS_INVALID_VALUE, "%s: %s", c.what, cublasGetStatusName(s));
    }
    CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, nullptr, A, 2, B, 2, &one, C, 2) == CUBLAS_STATUS_INVALID_VALUE, "null alpha");
    CHECK(cublasSgemm(nullptr, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, A, 2, B, 2, &one, C, 2) == CUBLAS_STATUS_NOT_INITIALIZED, "null handle");
    CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 0, 2, 2, &one, A, 1, B, 2, &one, C, 1) == CUBLAS_STATUS_SUCCESS, "m = 0 is legal");
    std::vector<float> host(4, 1.0f);
    CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, host.data(), 2, B, 2, &one, C, 2) ==
              CUBLAS_STATUS_EXECUTION_FAILED, "a host matrix accepted");
    // C holds 64 floats; a 2 x 2 batch with ldc 2 spans 4: batch 1 at 60 fits, at 61 or at -2^31 (an
    // offset that overflowed 32 bits) it does not
    for (long long stride : {61LL, -2147483648LL})
        CHECK(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, A, 2, 0, B, 2, 0, &one, C, 2,
                                        stride, 2) == CUBLAS_STATUS_EXECUTION_FAILED,
              "a batch of C at %lld floats from the first, past its allocation, accepted", stride);
    CHECK(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, A, 2, 0, B, 2, 0, &one, C, 2, 60, 2) ==
              CUBLAS_STATUS_SUCCESS, "the last batch ending at C's last float refused");
    std::vector<float> got = to_host(C, 64);
    for (float x : got) CHECK(x == 0.0f, "a refused call wrote C");
    CHECK(cudaGetLastError() == cudaSuccess, "a cuBLAS refusal set a CUDA error");
    cudaFree(C);
    cublasDestroy(h);
}

TEST(emu_cublas_respects_graph_capture) {
    cublasHandle_t h = nullptr;
    cublasCreate(&h);
    cudaStream_t s = nullptr;
    cudaStreamCreate(&s);
    cublasSetStream(h, s);
    const float two = 2.0f, zero = 0.0f;
    std::vector<float> I = {1, 0, 0, 1}, X = {1, 2, 3, 4};
    float *dI = to_device(I), *dX = to_device(X), *dC = nullptr;
    cudaMalloc(&dC, 4 * sizeof(float));
    cudaMemset(dC, 0, 4 * sizeof(float));
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &two, dI, 2, dX, 2, &zero, dC, 2) == CUBLAS_STATUS_SUCCESS, "captured sgemm");
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(s, &g);
    CHECK(to_host(dC, 4)[3] == 0.0f, "sgemm ran during capture");
    cudaGraphExec_t e = nullptr;
    cudaGraphInstantiate(&e, g, 0ULL);
    cudaGraphLaunch(e, s);
    cudaStreamSynchronize(s);
    std::vector<float> got = to_host(dC, 4);
    for (int i = 0; i < 4; i++) CHECK(got[i] == 2.0f * X[i], "replayed sgemm C[%d] = %g", i, got[i]);
    cudaGraphExecDestroy(e); cudaGraphDestroy(g);
    cudaFree(dI); cudaFree(dX); cudaFree(dC);
    cudaStreamDestroy(s);
    cublasDestroy(h);
}

// ---------------------------------------------------------------------------
// Number formats, tensor cores and asynchronous copies.

namespace {
// A double that is exactly 2^e (e within double's normal range).
double pow2(int e) {
    uint64_t bits = (uint64_t)(1023 + e) << 52;
    double x;
    memcpy(&x, &bits, 8);
    return x;
}
// References for the two roundings, by the FPU's own rounding (not by bit
// arithmetic, as the harness does): scale x so that the format's spacing there
// is 1 (below, scale = 2^-q, q = x's exponent less the format's mantissa bits;
// subnormals are spaced as the smallest exponent), round to an integer, scale
// back (exact; past the format's largest value the float is infinite).
// bfloat16 (7 mantissa bits): nearbyint, to nearest with ties to even.
inline uint16_t bf16_rounded(float x, double scale, double spacing) {
    float y = (float)(std::nearbyint((double)x * scale) * spacing);
    uint32_t v;
    memcpy(&v, &y, 4);
    return (uint16_t)(v >> 16);
}
// TF32 as cvt.rna (10 mantissa bits): floor(|x| / spacing + 1/2), ties away from zero.
inline uint32_t tf32_rounded(float x, double scale, double spacing) {
    float y = (float)std::copysign(std::floor(std::fabs((double)x) * scale + 0.5) * spacing, (double)x);
    uint32_t v;
    memcpy(&v, &y, 4);
    return v;
}
int spacing_exponent(uint32_t u, int mantissa_bits) { return std::max((int)(u >> 23 & 0xff), 1) - 127 - mantissa_bits; }
// The references for any float bits u: infinity and NaN as CUDA gives them
// (__float2bfloat16: 0x7fff for every NaN; cvt.rna.tf32: unchanged).
uint16_t bf16_reference(uint32_t u) {
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
    if ((u & 0x7fffffffu) == 0x7f800000u) return (uint16_t)(u >> 16);
    int q = spacing_exponent(u, 7);
    return bf16_rounded(__uint_as_float(u), pow2(-q), pow2(q));
}
uint32_t tf32_reference(uint32_t u) {
    if ((u & 0x7f800000u) == 0x7f800000u) return u;
    int q = spacing_exponent(u, 10);
    return tf32_rounded(__uint_as_float(u), pow2(-q), pow2(q));
}
}  // namespace

// Every one of the 2^32 float bit patterns: __float2bfloat16 and cvt.rna.tf32
// against the references above; every bf16 back to float exactly. The floats
// go in blocks of 2^16 that share their top 16 bits, so one exponent, so one
// spacing: the inner loop is straight arithmetic (vectorised: ~3 s of CPU).
TEST(emu_bf16_and_tf32_conversions_match_references_for_every_float) {
    long long bad_bf16 = 0, bad_tf32 = 0;
#pragma omp parallel for schedule(dynamic, 64) reduction(+ : bad_bf16, bad_tf32)
    for (uint32_t hi = 0; hi < 65536; hi++) {
        uint32_t u0 = hi << 16;
        long long bb = 0, bt = 0;
        if ((u0 & 0x7f800000u) == 0x7f800000u) {  // infinities and NaNs
            for (uint32_t lo = 0; lo < 65536; lo++) {
                bb += __bfloat16_as_ushort(__float2bfloat16(__uint_as_float(u0 | lo))) != bf16_reference(u0 | lo);
                bt += emu::cvt_rna_tf32_f32(__uint_as_float(u0 | lo)) != tf32_reference(u0 | lo);
            }
        } else {
            int qb = spacing_exponent(u0, 7), qt = spacing_exponent(u0, 10);
            double sb = pow2(-qb), ib = pow2(qb), st = pow2(-qt), it = pow2(qt);
#pragma omp simd reduction(+ : bb, bt)
            for (uint32_t lo = 0; lo < 65536; lo++) {
                float x = __uint_as_float(u0 | lo);
                bb += __bfloat16_as_ushort(__float2bfloat16(x)) != bf16_rounded(x, sb, ib);
                bt += emu::cvt_rna_tf32_f32(x) != tf32_rounded(x, st, it);
            }
        }
        bad_bf16 += bb;
        bad_tf32 += bt;
    }
    uint32_t first = 0;  // on a failure, the first float that differs
    if (bad_bf16)
        while (__bfloat16_as_ushort(__float2bfloat16(__uint_as_float(first))) == bf16_reference(first)) first++;
    CHECK(bad_bf16 == 0, "__float2bfloat16 differs from the reference for %lld floats, first 0x%08x: 0x%04x, want 0x%04x",
          bad_bf16, first, __bfloat16_as_ushort(__float2bfloat16(__uint_as_float(first))), bf16_reference(first));
    if (bad_tf32)
        while (emu::cvt_rna_tf32_f32(__uint_as_float(first)) == tf32_reference(first)) first++;
    CHECK(bad_tf32 == 0, "cvt.rna.tf32.f32 differs from the reference for %lld floats, first 0x%08x: 0x%08x, want 0x%08x",
          bad_tf32, first, emu::cvt_rna_tf32_f32(__uint_as_float(first)), tf32_reference(first));
    for (uint32_t h = 0; h < 65536; h++) {
        float f = __bfloat162float(__ushort_as_bfloat16((unsigned short)h));
        CHECK(__float_as_uint(f) == h << 16, "bf16 0x%04x to float: 0x%08x, want 0x%08x", h, __float_as_uint(f), h << 16);
    }
    // Named cases: ties go to the even bf16 and away from zero in TF32; NaN, infinity, overflow, zeros.
    struct Case { uint32_t in; unsigned short bf16; uint32_t tf32; const char* what; };
    const Case cases[] = {
        {0x3f808000u, 0x3f80, 0x3f808000u, "1 + 2^-8: bf16 tie to even (down)"},
        {0x3f818000u, 0x3f82, 0x3f818000u, "1 + 3 * 2^-8: bf16 tie to even (up)"},
        {0x3f801000u, 0x3f80, 0x3f802000u, "1 + 2^-11: TF32 tie away from zero"},
        {0xbf801000u, 0xbf80, 0xbf802000u, "-(1 + 2^-11): TF32 tie away from zero"},
        {0x7f7fffffu, 0x7f80, 0x7f800000u, "the largest float rounds to infinity"},
        {0x7fc00001u, 0x7fff, 0x7fc00001u, "a NaN: bf16 0x7fff, TF32 unchanged"},
        {0x00000001u, 0x0000, 0x00000000u, "the smallest subnormal"},
        {0x80000000u, 0x8000, 0x80000000u, "-0"},
    };
    for (const Case& c : cases) {
        float x = __uint_as_float(c.in);
        CHECK(__bfloat16_as_ushort(__float2bfloat16(x)) == c.bf16, "%s (0x%08x): bf16 0x%04x, want 0x%04x", c.what, c.in,
              __bfloat16_as_ushort(__float2bfloat16(x)), c.bf16);
        CHECK(emu::cvt_rna_tf32_f32(x) == c.tf32, "%s (0x%08x): tf32 0x%08x, want 0x%08x", c.what, c.in,
              emu::cvt_rna_tf32_f32(x), c.tf32);
    }
}

// One tensor-core product per warp, the operands loaded by the PTX manual's
// fragment tables (written out again here, lane by lane: g = lane / 4, t = lane % 4),
// D stored back the same way. Matrices are row-major: A (16 x K), B (K x 8), C, D (16 x 8).
__global__ void mma_tf32_kernel(float* D, const float* A, const float* B, const float* C) {
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    A += warp * 16 * 8, B += warp * 8 * 8, C += warp * 16 * 8, D += warp * 16 * 8;
    auto tf = emu::cvt_rna_tf32_f32;
    uint32_t a[4] = {tf(A[g * 8 + t]), tf(A[(g + 8) * 8 + t]), tf(A[g * 8 + t + 4]), tf(A[(g + 8) * 8 + t + 4])};
    uint32_t b[2] = {tf(B[t * 8 + g]), tf(B[(t + 4) * 8 + g])};
    float c[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t], C[(g + 8) * 8 + 2 * t + 1]};
    emu::mma_sync_m16n8k8_tf32(c, a, b, c);  // D into C's registers, as a kernel accumulates
    D[g * 8 + 2 * t] = c[0], D[g * 8 + 2 * t + 1] = c[1], D[(g + 8) * 8 + 2 * t] = c[2], D[(g + 8) * 8 + 2 * t + 1] = c[3];
}
// bf16 pairs in a register: the element of the lower column (or row) in the low half.
static uint32_t bf16_pair(float lo, float hi) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16(lo)) | (uint32_t)__bfloat16_as_ushort(__float2bfloat16(hi)) << 16;
}
__global__ void mma_bf16_kernel(float* D, const float* A, const float* B, const float* C) {
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    A += warp * 16 * 16, B += warp * 16 * 8, C += warp * 16 * 8, D += warp * 16 * 8;
    const float *r0 = A + g * 16, *r8 = A + (g + 8) * 16;  // rows g and g + 8
    uint32_t a[4] = {bf16_pair(r0[2 * t], r0[2 * t + 1]), bf16_pair(r8[2 * t], r8[2 * t + 1]),
                     bf16_pair(r0[2 * t + 8], r0[2 * t + 9]), bf16_pair(r8[2 * t + 8], r8[2 * t + 9])};
    uint32_t b[2] = {bf16_pair(B[2 * t * 8 + g], B[(2 * t + 1) * 8 + g]), bf16_pair(B[(2 * t + 8) * 8 + g], B[(2 * t + 9) * 8 + g])};
    float c[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t], C[(g + 8) * 8 + 2 * t + 1]};
    float d[4];
    emu::mma_sync_m16n8k16_bf16(d, a, b, c);
    D[g * 8 + 2 * t] = d[0], D[g * 8 + 2 * t + 1] = d[1], D[(g + 8) * 8 + 2 * t] = d[2], D[(g + 8) * 8 + 2 * t + 1] = d[3];
}

// D = C + round(A) round(B) in double, warp by warp: the plain product the tensor cores must give.
static std::vector<float> mma_reference(const std::vector<float>& A, const std::vector<float>& B, const std::vector<float>& C,
                                        int warps, int K, float (*round)(float)) {
    std::vector<float> D(C.size());
    for (int w = 0; w < warps; w++)
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 8; j++) {
                double s = C[w * 128 + i * 8 + j];
                for (int k = 0; k < K; k++) s += (double)round(A[w * 16 * K + i * K + k]) * round(B[w * K * 8 + k * 8 + j]);
                D[w * 128 + i * 8 + j] = (float)s;
            }
    return D;
}
static float round_tf32(float x) { return __uint_as_float(emu::cvt_rna_tf32_f32(x)); }
static float round_bf16(float x) { return __bfloat162float(__float2bfloat16(x)); }
static float no_rounding(float x) { return x; }

TEST(emu_mma_tf32_and_bf16_match_plain_products) {
    ForwardOnExit restore;
    const int warps = 2;
    for (int K : {8, 16}) {
        std::vector<float> A = ramp(warps * 16 * K, 4.0f), B = ramp(warps * K * 8, 3.0f), C = ramp(warps * 16 * 8, 1.0f);
        for (float& x : B) x = 0.3f - x;  // not A's values
        float *dA = to_device(A), *dB = to_device(B), *dC = to_device(C), *dD = nullptr;
        cudaMalloc(&dD, C.size() * sizeof(float));
        std::vector<float> want = mma_reference(A, B, C, warps, K, K == 8 ? round_tf32 : round_bf16);
        std::vector<float> unrounded = mma_reference(A, B, C, warps, K, no_rounding);
        for (emu::Order o : kOrders) {
            emu::set_order(o, 9);
            if (K == 8) LAUNCH(mma_tf32_kernel, 1, 32 * warps, 0, 0)(dD, dA, dB, dC);
            else LAUNCH(mma_bf16_kernel, 1, 32 * warps, 0, 0)(dD, dA, dB, dC);
            CHECK(cudaGetLastError() == cudaSuccess, "%s", emu::last_error_message());
            std::vector<float> got = to_host(dD, C.size());
            double e = rel_err(got.data(), want.data(), got.size()), e0 = rel_err(got.data(), unrounded.data(), got.size());
            CHECK(e < 1e-7, "mma m16n8k%d (%s order): D rel err %.2e against the product of rounded operands", K,
                  order_name(o), e);
            CHECK(e0 > 1e-5, "mma m16n8k%d: D rel err %.2e against unrounded operands: were they rounded?", K, e0);
        }
        // .aligned: the whole warp, all 32 lanes. A block of 48 threads has a warp of 16.
        emu::set_quiet(true);
        LAUNCH(mma_tf32_kernel, 1, 48, 0, 0)(dD, dA, dB, dC);
        emu::set_quiet(false);
        const char* msg = emu::last_error_message();
        CHECK(cudaGetLastError() == cudaErrorLaunchFailure, "mma in a partial warp not reported as a launch failure");
        CHECK(contains(msg, "mma.sync.m16n8k8.tf32 needs a whole warp of 32 threads; this warp has 16"), "mma in a partial warp: %s",
              msg);
        cudaFree(dA); cudaFree(dB); cudaFree(dC); cudaFree(dD);
    }
}

// cp.async: each thread copies two 16-byte chunks into shared memory, in two
// groups (the last thread's second chunk zero-filled), and records one float
// of each before any wait, after waiting for the first group, after waiting
// for both, and a neighbour's chunk after the barrier. Copies land at the
// wait (forward order), at the issue (reverse), or either (random).
__global__ void copy_async_kernel(float* out, const float* src) {
    DYNAMIC_SHARED(float, tile);  // (2 * blockDim.x, 4)
    int i = threadIdx.x, n = blockDim.x;
    float *first = tile + 4 * i, *second = tile + 4 * (n + i);
    __pipeline_memcpy_async(first, src + 4 * i, 16);
    __pipeline_commit();
    __pipeline_memcpy_async(second, src + 4 * (n + i), 16, i == n - 1 ? 16 : 0);
    __pipeline_commit();
    out[6 * i + 0] = first[0];   // NaN: nothing landed yet
    __pipeline_wait_prior(1);
    out[6 * i + 1] = first[0];   // the first group landed
    out[6 * i + 2] = second[0];  // the second not yet
    __pipeline_wait_prior(0);
    out[6 * i + 3] = second[3];
    __syncthreads();
    out[6 * i + 4] = tile[4 * ((i + 1) % n) + 2];        // a neighbour's chunk
    out[6 * i + 5] = tile[4 * (n + (i + 1) % n) + 1];
}
// host: a host address, as an integer (LAUNCH refuses host pointers among the arguments).
__global__ void copy_async_misuse_kernel(float* dst_global, const float* src, uintptr_t host, int which) {
    DYNAMIC_SHARED(float, tile);
    if (which == 0) __pipeline_memcpy_async(dst_global, src, 16);           // the destination is not shared memory
    if (which == 1) __pipeline_memcpy_async(tile, (const float*)host, 16);  // the source is not device memory
    if (which == 2) __pipeline_memcpy_async(tile + 1, src, 16);             // misaligned
}

TEST(emu_cp_async_lands_between_its_issue_and_its_wait) {
    ForwardOnExit restore;
    const int n = 40;
    std::vector<float> src = ramp(8 * n, 2.0f);
    float *dsrc = to_device(src), *dout = nullptr;
    cudaMalloc(&dout, 6 * n * sizeof(float));
    for (emu::Order o : kOrders) {
        emu::set_order(o, 3);
        LAUNCH(copy_async_kernel, 1, n, 8 * n * sizeof(float), 0)(dout, dsrc);
        CHECK(cudaGetLastError() == cudaSuccess, "%s", emu::last_error_message());
        std::vector<float> got = to_host(dout, 6 * n);
        int early = 0;  // reads before a wait that saw the copy already
        for (int i = 0; i < n; i++) {
            int j = (i + 1) % n;
            float landed[6] = {src[4 * i], src[4 * i], i == n - 1 ? 0.0f : src[4 * (n + i)],
                               i == n - 1 ? 0.0f : src[4 * (n + i) + 3], src[4 * j + 2],
                               j == n - 1 ? 0.0f : src[4 * (n + j) + 1]};
            for (int c = 0; c < 6; c++) {
                bool before_wait = c == 0 || c == 2, is_nan = std::isnan(got[6 * i + c]);
                early += before_wait && !is_nan;
                CHECK(got[6 * i + c] == landed[c] || (before_wait && is_nan && o != emu::REVERSE),
                      "%s order: thread %d read %d: %g, want %g%s", order_name(o), i, c, got[6 * i + c], landed[c],
                      before_wait ? " or NaN (not landed)" : "");
            }
        }
        CHECK(o == emu::FORWARD ? early == 0 : o == emu::REVERSE ? early == 2 * n : early > 0 && early < 2 * n,
              "%s order: %d of %d reads before a wait saw their copy", order_name(o), early, 2 * n);
    }
    std::vector<float> host(8);
    const char* want[] = {"is not shared memory", "is not device memory", "is not aligned to its 16 bytes"};
    emu::set_quiet(true);
    for (int which = 0; which < 3; which++) {
        LAUNCH(copy_async_misuse_kernel, 1, 1, 64, 0)(dout, dsrc, (uintptr_t)host.data(), which);
        const char* msg = emu::last_error_message();
        CHECK(cudaGetLastError() == cudaErrorLaunchFailure, "cp.async misuse %d not reported as a launch failure", which);
        CHECK(contains(msg, want[which]), "cp.async misuse %d: the message lacks '%s': %s", which, want[which], msg);
    }
    emu::set_quiet(false);
    cudaFree(dsrc); cudaFree(dout);
}

TEST(emu_cublas_gemm_ex_bf16_operands_float_sums) {
    cublasHandle_t h = nullptr;
    cublasCreate(&h);
    const int m = 24, n = 10, k = 70;
    const float alpha = 1.5f, beta = 0.5f;
    std::vector<float> A = ramp(k * m, 2.0f), B = ramp(k * n, 3.0f), C0 = ramp(m * n, 1.0f);
    for (float& x : B) x = 0.2f - x;
    std::vector<__nv_bfloat16> Ab(A.begin(), A.end()), Bb(B.begin(), B.end()), Cb(C0.begin(), C0.end());
    std::vector<float> Ar(A.size()), Br(B.size()), Cr(C0.size());  // the bf16 values, as floats
    for (size_t i = 0; i < A.size(); i++) Ar[i] = Ab[i];
    for (size_t i = 0; i < B.size(); i++) Br[i] = Bb[i];
    for (size_t i = 0; i < C0.size(); i++) Cr[i] = Cb[i];
    __nv_bfloat16 *dA = to_device(Ab), *dB = to_device(Bb), *dCb = to_device(Cb);
    float* dC = to_device(C0);
    // C (m x n) = alpha A^T B + beta C: A stored (k x m), B (k x n), column-major.
    std::vector<float> want = C0;
    gemm_reference(true, false, m, n, k, alpha, Ar.data(), k, Br.data(), k, beta, want.data(), m);
    CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, dA, CUDA_R_16BF, k, dB, CUDA_R_16BF, k, &beta, dC,
                       CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS, "bf16 -> float");
    double e = rel_err(to_host(dC, m * n).data(), want.data(), m * n);
    CHECK(e < 1e-6, "cublasGemmEx bf16 operands, float C: rel err %.2e", e);
    // bf16 C: read as bf16, written rounded to nearest even.
    want = Cr;
    gemm_reference(true, false, m, n, k, alpha, Ar.data(), k, Br.data(), k, beta, want.data(), m);
    CHECK(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, dA, CUDA_R_16BF, k, 0, dB, CUDA_R_16BF,
                                     k, 0, &beta, dCb, CUDA_R_16BF, m, 0, 1, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT_TENSOR_OP) == CUBLAS_STATUS_SUCCESS, "bf16 -> bf16");
    std::vector<__nv_bfloat16> gb = to_host(dCb, m * n);
    for (int i = 0; i < m * n; i++)
        CHECK(std::fabs((float)gb[i] - want[i]) <= std::fabs(want[i]) * (1.0f / 256), "bf16 C[%d] = %g, want %g (to 2^-8)",
              i, (float)gb[i], want[i]);
    // float operands: _FAST_TF32 rounds them, _PEDANTIC never does (whatever the math mode).
    float *dAf = to_device(A), *dBf = to_device(B);
    want = C0;
    gemm_reference(true, false, m, n, k, alpha, A.data(), k, B.data(), k, beta, want.data(), m);
    cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH);
    for (cublasComputeType_t ct : {CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_COMPUTE_32F_PEDANTIC}) {
        cudaMemcpy(dC, C0.data(), C0.size() * sizeof(float), cudaMemcpyHostToDevice);
        CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, dAf, CUDA_R_32F, k, dBf, CUDA_R_32F, k, &beta, dC,
                           CUDA_R_32F, m, ct, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS, "float compute %d", (int)ct);
        e = rel_err(to_host(dC, m * n).data(), want.data(), m * n);
        CHECK(ct == CUBLAS_COMPUTE_32F_FAST_TF32 ? e > 1e-5 && e < 2e-3 : e < 1e-6, "compute type %d: rel err %.2e", (int)ct, e);
    }
    // _FAST_16BF on float operands (--precision bf16): each rounded to bf16 as it is read, so the
    // result is the float sums over the bf16 operands above, Ar and Br, to float rounding.
    cudaMemcpy(dC, C0.data(), C0.size() * sizeof(float), cudaMemcpyHostToDevice);
    want = C0;
    gemm_reference(true, false, m, n, k, alpha, Ar.data(), k, Br.data(), k, beta, want.data(), m);
    CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, dAf, CUDA_R_32F, k, dBf, CUDA_R_32F, k, &beta, dC,
                       CUDA_R_32F, m, CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS,
          "float operands, _FAST_16BF");
    e = rel_err(to_host(dC, m * n).data(), want.data(), m * n);
    CHECK(e < 1e-6, "cublasGemmEx float operands, _FAST_16BF: rel err %.2e against the bf16-rounded operands' product", e);
    // What the harness does not emulate is refused, with a line saying so; C untouched.
    emu::set_quiet(true);
    CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, dAf, CUDA_R_32F, k, dB, CUDA_R_16BF, k, &beta, dC,
                       CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED, "mixed A, B types");
    CHECK(contains(emu::last_error_message(), "CUBLAS_STATUS_NOT_SUPPORTED"), "%s", emu::last_error_message());
    CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, dA, CUDA_R_16BF, k, dB, CUDA_R_16BF, k, &beta, dC,
                       CUDA_R_32F, m, CUBLAS_COMPUTE_16F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED, "16F compute");
    emu::set_quiet(false);
    cudaFree(dA); cudaFree(dB); cudaFree(dCb); cudaFree(dC); cudaFree(dAf); cudaFree(dBf);
    cublasDestroy(h);
}

// Each lane reads `words` 32-bit words (1, 2 or 4: one 4-, 8- or 16-byte load) of shared memory,
// `stride` words from the last lane's, into out (32, 4).
__global__ void strided_shared_read_kernel(float* out, int stride, int words) {
    __shared__ float tile[32 * 64];
    for (int i = threadIdx.x; i < 32 * 64; i += blockDim.x) tile[i] = (float)i;
    __syncthreads();
    const float* at = tile + threadIdx.x * stride;
    float* o = out + threadIdx.x * 4;
    if (words == 4) *reinterpret_cast<float4*>(o) = *reinterpret_cast<const float4*>(at);
    else if (words == 2) *reinterpret_cast<float2*>(o) = *reinterpret_cast<const float2*>(at);
    else o[0] = at[0];
}

TEST(emu_counts_shared_memory_bank_conflicts) {
#ifndef LIME_EMU_COUNT_BANKS
    SKIP("built without BANKFLAGS (Makefile): no bank counts");
#else
    emu::set_count_banks(true);
    float* out = nullptr;
    cudaMalloc(&out, 32 * 4 * sizeof(float));
    // stride 32: every lane's word in bank 0, 32 words: 32-way; stride 1: one bank each. 8 bytes
    // at stride 2: a half-warp's 16 pairs fill the 32 banks once (1-way); at stride 4 twice
    // (2-way). 16 bytes at stride 4: a quarter-warp's 8 fill them once; at stride 8 twice.
    struct Case { int stride, words, ways; } cases[] = {{32, 1, 32}, {1, 1, 1}, {2, 2, 1}, {4, 2, 2}, {4, 4, 1}, {8, 4, 2}};
    for (const Case& c : cases) {
        emu::clear_bank_counts();
        LAUNCH(strided_shared_read_kernel, 1, 32, 0, nullptr)(out, c.stride, c.words);
        CHECK(cudaDeviceSynchronize() == cudaSuccess, "strided read: %s", emu::last_error_message());
        std::vector<float> h = to_host(out, 32 * 4);
        CHECK(h[5 * 4 + c.words - 1] == (float)(5 * c.stride + c.words - 1), "strided read: lane 5 read %g",
              h[5 * 4 + c.words - 1]);
        emu::detail::KernelBanks k = emu::bank_counts("strided_shared_read_kernel");
        // the staging stores: 64 requests of 32 consecutive words (1-way), then the one read
        CHECK(k.requests == 65, "stride %d, %d words: %ld requests, want 65", c.stride, c.words, k.requests);
        CHECK(k.worst == c.ways, "stride %d, %d words: worst %d-way, want %d", c.stride, c.words, k.worst, c.ways);
        double mean = (64.0 + c.ways) / 65;
        CHECK(fabs(k.ways / k.requests - mean) < 1e-12, "stride %d: mean %.4f-way, want %.4f", c.stride,
              k.ways / k.requests, mean);
    }
    emu::set_count_banks(false);
    emu::clear_bank_counts();
    cudaFree(out);
#endif
}
