// labs/lab3/check.cpp — lab 3's checks: your kernel, through the launch in
// your file (router_forward_gpu), on the CUDA-on-CPU harness under the
// forward, reverse and two random thread orders, each with the blocks of a
// grid in forward, reverse and random order, against Eq. 2 summed in double
// (labs/check.h). A correct kernel gives the same numbers in
// every order; one that reads shared memory before every thread has written
// it, or writes it while others still read, does not.
#include "labs/check.h"

// The student's launch on device copies of the inputs, on a stream of its own
// as the model's; "" or the harness's error.
static std::string launch_error;
static void on_device(KvPair out, KvConst W, KvConst buf, int l, int N, int R, int hd) {
    size_t n_out = (size_t)N * R * hd, n_w = (size_t)R * (l + 1) * R, n_buf = (l + 1) * n_out;
    bool one = W.k == W.v;  // one router: the launch gets one pointer twice, as the model's does
    float *dKr, *dVr, *dWk, *dWv, *dKbuf, *dVbuf;
    for (auto [p, n] :
         {std::pair{&dKr, n_out}, {&dVr, n_out}, {&dWk, n_w}, {&dWv, n_w}, {&dKbuf, n_buf}, {&dVbuf, n_buf}})
        cudaMalloc((void**)p, n * sizeof(float));
    for (auto [to, from, n] : {std::tuple{dKr, (const float*)out.k, n_out}, {dVr, out.v, n_out}, {dWk, W.k, n_w},
                               {dWv, W.v, n_w}, {dKbuf, buf.k, n_buf}, {dVbuf, buf.v, n_buf}})
        cudaMemcpy(to, from, n * sizeof(float), cudaMemcpyHostToDevice);  // out too: the last step's numbers
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    router_forward_gpu({dKr, dVr}, {dWk, one ? dWk : dWv}, {dKbuf, dVbuf}, l, N, R, hd, stream);
    cudaError_t e = cudaStreamSynchronize(stream);
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e != cudaSuccess && launch_error.empty())  // the harness's words: the kernel, the block, who waits where
        launch_error = *emu::last_error_message() ? emu::last_error_message() : cudaGetErrorString(e);
    cudaStreamDestroy(stream);
    cudaMemcpy(out.k, dKr, n_out * sizeof(float), cudaMemcpyDeviceToHost);
    cudaMemcpy(out.v, dVr, n_out * sizeof(float), cudaMemcpyDeviceToHost);
    for (float* p : {dKr, dVr, dWk, dWv, dKbuf, dVbuf}) cudaFree(p);
}

// Chosen shapes, then random ones, under the harness's current order.
static std::string check_order(uint64_t seed) {
    Rng rng(seed);
    launch_error.clear();
    std::string err = check_router_forward(on_device, rng, 0, 3, 2, 4, false);
    if (err.empty()) err = check_router_forward(on_device, rng, 2, 3, 2, 4, true);
    for (int trial = 0; trial < 6 && err.empty(); trial++) {
        int l = (int)rng.below(4), N = 1 + (int)rng.below(4), R = 1 + (int)rng.below(3), hd = 2 + 2 * (int)rng.below(12);
        err = check_router_forward(on_device, rng, l, N, R, hd, rng.below(2));
    }
    if (launch_error.rfind("lab_router_kernel", 0) == 0) return launch_error;  // it did not run, or not for the outputs
    if (!launch_error.empty())
        return "the kernel failed on the harness: " + launch_error +
               "; hint: a __syncthreads() that some threads of the block never reach is a deadlock";
    if (err.find("NaN") != std::string::npos)
        err += " (the router read from shared memory before every thread's copy was in: a missing "
               "__syncthreads()?)";
    return err;
}

int main() {
    Lab lab;
    struct Order { const char* name; emu::Order order; uint64_t seed; };
    Order orders[] = {{"forward", emu::FORWARD, 1}, {"reverse", emu::REVERSE, 1}, {"random1", emu::RANDOM, 1},
                      {"random2", emu::RANDOM, 2}};
    Order blocks[] = {{"forward", emu::FORWARD, 1}, {"reverse", emu::REVERSE, 1}, {"random", emu::RANDOM, 1}};
    for (const Order& b : blocks)  // random blocks are seeded like the threads
        for (const Order& o : orders) {
            bool passed_before = lab.passed > 0;
            lab.check(std::string("blocks_") + b.name + "_threads_" + o.name, [&] {  // in a child (labs/check.h)
                emu::set_order(o.order, o.seed);
                emu::set_block_order(b.order);
                std::string err = check_order(2028);
                if (!err.empty() && passed_before)
                    err += "; it passes in other orders: the answer depends on the order threads or blocks run in, "
                           "a race (a missing __syncthreads(), or shared memory rewritten while others read it)";
                return err;
            });
        }
    // the whole model on the harness, your kernel in it, against the GQA reference vectors in float32
    lab.check("reference_vectors", [] {
        return reference_vectors("tests/golden", DEVICE_GPU, {"tests/golden/lime_gqa.safetensors"});
    });
    return lab.exit_status();
}
