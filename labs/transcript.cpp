// labs/transcript.cpp — how a lab's verdict comes from a process without the
// student's code (labs/check.h, "Who decides"). The lab's functions (lab.h)
// are defined here twice over, compiled once per lab (the Makefile's
// LAB_NUMBER) in one of two ways:
//   LAB_RECORD, in the worker, linked with the student's object (whose lab
//     functions labs/run.sh renamed lab_student_NAME): each call runs the
//     student's function and appends a record of it to the transcript,
//     the file descriptor lab_record_start was given.
//   LAB_REPLAY, in the judge, which holds no student code: each call takes
//     the next record instead, so the outputs are the student's and
//     everything around them (the inputs, the model, the comparisons) is
//     the project's and the checker's own.
// A record: the function, a hash of its inputs (the judge's call must pass
// the same ones, in the same order), whether the call changed its const
// inputs (then it fails: it wrote where it may not), then its outputs.
// To pass, the transcript must hold the right outputs: nothing the student's
// code prints or forges anywhere else counts.
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "labs/lab.h"
#include "support/lib/cli.h"

#if defined(LAB_RECORD) == defined(LAB_REPLAY)
#error "compile labs/transcript.cpp with -DLAB_RECORD or -DLAB_REPLAY (and LAB_NUMBER=N)"
#endif

// What labs/check.h calls (declared there as weak: the project's own build has none of this).
#ifdef LAB_RECORD
void lab_record_start(int fd);
void lab_record_finish();
#else
void lab_replay_start(const std::string& transcript);
std::string lab_replay_finish();
#endif

namespace {

const uint32_t END_OF_TRANSCRIPT = 0xffffffffu;

// FNV-1a 64 over every input's bytes, in order.
struct Hash {
    uint64_t h = 1469598103934665603ull;
    void add(const void* p, size_t n) {
        for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char*)p)[i]) * 1099511628211ull;
    }
};

// One call of a lab function: its inputs (hashed) and its outputs (recorded
// or replayed), each a pointer and a byte count.
struct Call {
    uint32_t fn;
    std::string what;  // "router_forward (l=2, N=3, R=2, hd=4)", for the judge's message
    std::vector<std::pair<const void*, size_t>> ins, prior;  // const inputs; what in-out outputs held before
    std::vector<std::pair<void*, size_t>> outs;
    Call& in(const void* p, size_t bytes) { ins.push_back({p, bytes}); return *this; }
    template <class T> Call& in(const T& scalar) { return in(&scalar, sizeof scalar); }
    Call& out(void* p, size_t bytes) { outs.push_back({p, bytes}); return *this; }
    // an output the function adds to (a gradient, an optimiser moment): what it held is an input too
    Call& inout(void* p, size_t bytes) { prior.push_back({p, bytes}); return out(p, bytes); }
    uint64_t hash(bool with_prior) const {
        Hash h;
        h.add(&fn, sizeof fn);
        for (auto [p, n] : ins) h.add(p, n);
        if (with_prior) for (auto [p, n] : prior) h.add(p, n);
        return h.h;
    }
};

#ifdef LAB_RECORD
int g_fd = -1;

void put(const void* p, size_t n) {
    for (size_t done = 0; done < n;) {
        ssize_t w = write(g_fd, (const char*)p + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) _exit(3);  // the judge is gone: nothing to record for
        done += (size_t)w;
    }
}

// Runs the student's function and appends the record.
void run(Call& c, const std::function<void()>& student) {
    if (g_fd < 0) { student(); return; }  // a call before the check began (none in the labs): not judged
    uint64_t before = c.hash(true), inputs = c.hash(false);
    student();
    uint32_t changed = c.hash(false) != inputs, n = (uint32_t)c.outs.size();
    put(&c.fn, sizeof c.fn), put(&before, sizeof before), put(&changed, sizeof changed), put(&n, sizeof n);
    for (auto [p, bytes] : c.outs) {
        uint64_t b = bytes;
        put(&b, sizeof b), put(p, bytes);
    }
}
#else
struct Replay {
    std::string data;
    size_t pos = 0;
    int calls = 0;
    std::string broken;  // the first call that could not be replayed, and why
} g_replay;

bool take(void* p, size_t n) {
    if (g_replay.data.size() - g_replay.pos < n) return false;
    memcpy(p, g_replay.data.data() + g_replay.pos, n);
    g_replay.pos += n;
    return true;
}

// The outputs of the next record, where it is this call's; else NaN
// (every output byte 0xff) and the replay stops there, saying why.
void run(Call& c, const std::function<void()>&) {
    g_replay.calls++;
    auto nan_out = [&](const std::string& why) {
        if (g_replay.broken.empty())
            g_replay.broken = "call " + std::to_string(g_replay.calls) + " of your " + c.what + ": " + why;
        for (auto [p, bytes] : c.outs) memset(p, 0xff, bytes);
    };
    if (!g_replay.broken.empty()) return nan_out("");  // the first problem is the one to say
    uint32_t fn = 0, changed = 0, n = 0;
    uint64_t before = 0;
    if (!take(&fn, sizeof fn) || fn == END_OF_TRANSCRIPT || !take(&before, sizeof before) ||
        !take(&changed, sizeof changed) || !take(&n, sizeof n))
        return nan_out("your code made fewer calls than the check does (its transcript ends)");
    if (fn != c.fn || n != c.outs.size()) return nan_out("your code's calls came in another order than the check's");
    if (before != c.hash(true))
        return nan_out("its inputs differ from what your code was given: an earlier call wrote outside its outputs");
    if (changed) return nan_out("it wrote into its inputs (they are const): write only its outputs");
    for (auto [p, bytes] : c.outs) {
        uint64_t b = 0;
        if (!take(&b, sizeof b) || b != bytes || !take(p, bytes)) return nan_out("its record is cut short or resized");
    }
}
#endif

}  // namespace

// Each build defines its half only: labs/check.h tells the worker, the judge
// and the project's checker apart by which of them it finds.
#ifdef LAB_RECORD
void lab_record_start(int fd) { g_fd = fd; }
void lab_record_finish() {
    put(&END_OF_TRANSCRIPT, sizeof END_OF_TRANSCRIPT);
    g_fd = -1;
}
#else
void lab_replay_start(const std::string& transcript) { g_replay = Replay{transcript, 0, 0, ""}; }
// "" when every call was replayed and the transcript ends there; else why not.
std::string lab_replay_finish() {
    if (!g_replay.broken.empty()) return g_replay.broken;
    uint32_t fn = 0;
    if (!take(&fn, sizeof fn) || fn != END_OF_TRANSCRIPT || g_replay.pos != g_replay.data.size())
        return "your code's transcript holds more calls than the check made, or was cut short";
    return "";
}
#endif

// ---------------------------------------------------------------------------
// The lab functions: each names its inputs and outputs (lab.h gives their
// shapes) and runs through run(). lab_student_NAME is the student's function.

// Each lab_student_NAME is declared with lab.h's type for NAME, and each
// wrapper below must define that very function: a wrapper of another
// signature would be an overload beside it, the checks would call the
// project's own function unrecorded, and every file would pass.
// ONE_FUNCTION(NAME) stops the build there ("decltype cannot resolve
// address of overloaded function").
#define STUDENT extern "C" __attribute__((weak))
#define ONE_FUNCTION(name) static_assert(std::is_function_v<decltype(name)>, #name " is lab.h's function alone")

#if LAB_NUMBER == 1
STUDENT decltype(router_forward) lab_student_router_forward;
// One buffer (the keys or the values), called twice per shape: out starts
// with the last step's numbers, so what it held is hashed as an input too
// (a forward that adds to it, the mistake a hint names, computes from it).
void router_forward(float* out, const float* W, const float* buf, int l, int N, int R, int hd) {
    size_t layer = (size_t)N * R * hd, w = (size_t)R * (l + 1) * R, f = sizeof(float);
    Call c{1, strf("router_forward (l=%d, N=%d, R=%d, hd=%d)", l, N, R, hd), {}, {}, {}};
    c.in(W, w * f).in(buf, (l + 1) * layer * f).in(l).in(N).in(R).in(hd).inout(out, layer * f);
    run(c, [&] { lab_student_router_forward(out, W, buf, l, N, R, hd); });
}
ONE_FUNCTION(router_forward);
#endif

#if LAB_NUMBER == 2
STUDENT decltype(router_backward) lab_student_router_backward;
// Called for the keys, then the values; with one router both calls add into
// the same dW, so the values' call's prior dW is the keys' call's output.
void router_backward(float* dW, float* dbuf, const float* dout, const float* W, const float* buf, int l,
                     RouterSpan learned, int N, int R, int hd) {
    size_t layer = (size_t)N * R * hd, w = (size_t)R * (l + 1) * R, f = sizeof(float), bytes = (l + 1) * layer * f;
    Call c{2, strf("router_backward (l=%d, N=%d, R=%d, hd=%d)", l, N, R, hd), {}, {}, {}};
    c.in(dout, layer * f).in(W, w * f).in(buf, bytes).in(l).in(N).in(R).in(hd);
    c.in(learned.below).in(learned.from).in(learned.same_head);  // field by field: the struct's padding is no input
    c.inout(dW, w * f).inout(dbuf, bytes);  // the gradients are added to
    run(c, [&] { lab_student_router_backward(dW, dbuf, dout, W, buf, l, learned, N, R, hd); });
}
ONE_FUNCTION(router_backward);
#endif

#if LAB_NUMBER == 3
// The kernel runs on the harness's streams, which defer work: everything
// issued before is run first (its inputs ready), and the student's kernel
// after it, before the outputs are read; a failed kernel's error is part of
// the record, set again in the judge for the check to find.
static void run_issued_work() {
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) emu::detail::pending_error = e;  // kept for the check's own synchronisation
}
STUDENT decltype(router_forward_gpu) lab_student_router_forward_gpu;
#ifdef LAB_RECORD
// The student's kernel (its file defines it; labs/run.sh checks it does).
__global__ void lab_router_kernel(KvPair out, KvConst W, KvConst buf, int cols, int R, size_t row);
// Whether the kernel computed what the launcher returned (got): the kernel,
// launched as the starter's launcher launches it, on copies of what out held
// before the call (before), must give the same bytes (a kernel gives the same
// in every order of its threads and blocks). A launcher that computes on the
// host, beside an empty kernel, does not. "" or why not.
static std::string kernel_computed(const std::vector<float>& got, const std::vector<float>& before, KvConst W,
                                   KvConst buf, int l, int N, int R, int hd, int launches) {
    const char* fix = "; hint: Kr and Vr are lab_router_kernel's to write, launched as the starter's "
                      "router_forward_gpu launches it (keep the given launcher)";
    if (launches == 0) return std::string("lab_router_kernel never ran on the harness") + fix;
    size_t layer = (size_t)N * R * hd, row = (size_t)N * hd;
    int cols = (l + 1) * R;
    float* out = nullptr;
    std::vector<float> mine(2 * layer);
    cudaError_t keep[2] = {emu::detail::last_error, emu::detail::pending_error};
    std::string message = emu::detail::message;
    cudaMalloc((void**)&out, 2 * layer * sizeof(float));
    cudaMemcpy(out, before.data(), 2 * layer * sizeof(float), cudaMemcpyHostToDevice);
    const unsigned threads = 32;  // the starter's LAB3_THREADS
    dim3 grid((unsigned)((row + threads - 1) / threads), 2);
    LAUNCH(lab_router_kernel, grid, threads, (size_t)R * cols * sizeof(float), 0)(KvPair{out, out + layer}, W, buf, cols, R,
                                                                                  row);
    cudaError_t e = cudaDeviceSynchronize();
    cudaMemcpy(mine.data(), out, 2 * layer * sizeof(float), cudaMemcpyDeviceToHost);
    cudaFree(out);
    emu::detail::last_error = keep[0], emu::detail::pending_error = keep[1], emu::detail::message = message;
    if (e == cudaSuccess && memcmp(mine.data(), got.data(), 2 * layer * sizeof(float)) == 0) return "";
    return "lab_router_kernel did not compute Kr and Vr: it gives other numbers on the same inputs (computed on the "
           "host, or by another kernel?)" + std::string(fix);
}
#endif
// Keys and values in one launch. With one router W.k == W.v, one pointer
// twice (the kernel may tell): that is an input as well. out starts with the
// last step's numbers, as lab 1's.
void router_forward_gpu(KvPair out, KvConst W, KvConst buf, int l, int N, int R, int hd, cudaStream_t stream) {
    size_t layer = (size_t)N * R * hd, w = (size_t)R * (l + 1) * R, f = sizeof(float);
    run_issued_work();
    int errors[2] = {0, 0};  // the harness's last and pending errors after the kernel
    char message[512] = {0};
    bool one = W.k == W.v;
    Call c{3, strf("router_forward_gpu (l=%d, N=%d, R=%d, hd=%d)", l, N, R, hd), {}, {}, {}};
    c.in(W.k, w * f).in(W.v, w * f).in(one).in(buf.k, (l + 1) * layer * f).in(buf.v, (l + 1) * layer * f);
    c.in(l).in(N).in(R).in(hd).inout(out.k, layer * f).inout(out.v, layer * f);
    c.out(errors, sizeof errors).out(message, sizeof message);
    run(c, [&] {
#ifdef LAB_RECORD
        std::vector<float> before(2 * layer), got(2 * layer);
        memcpy(before.data(), out.k, layer * f), memcpy(before.data() + layer, out.v, layer * f);
        long grids = emu::detail::kernels_run;
#endif
        lab_student_router_forward_gpu(out, W, buf, l, N, R, hd, stream);
        run_issued_work();
        errors[0] = emu::detail::last_error, errors[1] = emu::detail::pending_error;
        snprintf(message, sizeof message, "%s", emu::detail::message.c_str());
#ifdef LAB_RECORD
        if (errors[0] || errors[1]) return;  // the harness's error is the check's to name
        memcpy(got.data(), out.k, layer * f), memcpy(got.data() + layer, out.v, layer * f);
        std::string why = kernel_computed(got, before, W, buf, l, N, R, hd, (int)(emu::detail::kernels_run - grids));
        if (!why.empty()) errors[1] = cudaErrorLaunchFailure, snprintf(message, sizeof message, "%s", why.c_str());
#endif
    });
    emu::detail::last_error = (cudaError_t)errors[0], emu::detail::pending_error = (cudaError_t)errors[1];
    if (errors[0] || errors[1]) emu::detail::message = std::string(message, strnlen(message, sizeof message));
}
ONE_FUNCTION(router_forward_gpu);
#endif

#if LAB_NUMBER == 4
STUDENT decltype(adamw_numbers) lab_student_adamw_numbers;
STUDENT decltype(adamw) lab_student_adamw;
STUDENT decltype(clip_scale) lab_student_clip_scale;
AdamWNumbers adamw_numbers(const AdamWConfig& o, float factor, int step) {
    AdamWNumbers nums = {};
    Call c{41, strf("adamw_numbers (factor=%g, step=%d)", factor, step), {}, {}, {}};
    c.in(o).in(factor).in(step).out(&nums, sizeof nums);
    run(c, [&] { nums = lab_student_adamw_numbers(o, factor, step); });
    return nums;
}
ONE_FUNCTION(adamw_numbers);
void adamw(float* p, float* m, float* v, const float* g, size_t n, float lr, float wd, float grad_scale,
           const AdamWNumbers& nums) {
    size_t f = sizeof(float);
    Call c{42, strf("adamw (n=%zu)", n), {}, {}, {}};
    c.in(g, n * f).in(n).in(lr).in(wd).in(grad_scale).in(nums).inout(p, n * f).inout(m, n * f).inout(v, n * f);
    run(c, [&] { lab_student_adamw(p, m, v, g, n, lr, wd, grad_scale, nums); });
}
ONE_FUNCTION(adamw);
float clip_scale(float norm, float grad_clip) {
    float scale = 0;
    Call c{43, strf("clip_scale (norm=%g, grad_clip=%g)", norm, grad_clip), {}, {}, {}};
    c.in(norm).in(grad_clip).out(&scale, sizeof scale);
    run(c, [&] { scale = lab_student_clip_scale(norm, grad_clip); });
    return scale;
}
ONE_FUNCTION(clip_scale);
#endif
