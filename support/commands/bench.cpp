// support/commands/bench.cpp — `./lime bench`: ms per step and tokens/s of
// llama, lime and hc of one shape on synthetic tokens, side by side; on a GPU
// also MFU against the device's peak (support/lib/gpu_peaks.h) and the memory
// each model took. train.cpp's main calls cmd_bench (support/commands/commands.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "support/commands/commands.h"
#include "support/lib/cli.h"
#include "support/lib/gpu_peaks.h"
#include "support/lib/rng.h"
#include "support/lib/safetensors.h"
#include "support/model/lime.h"
#include "support/model/names.h"

// ===========================================================================
// ./lime bench: ms/step and tokens/s of llama and lime on synthetic tokens
// ===========================================================================


// What bench times: the shape (lime's router included), the batch, the
// device and how the models run; on a GPU, the device and its peaks.
struct BenchSetup {
    Config c;
    int B = 0, steps = 0;
    Device dev = DEVICE_CPU;
    ModelSettings settings;   // --attention, --tf32, --graph
    bool on_gpu = false;      // a GPU gpu_info describes: MFU and memory are measured
    GpuInfo gpu;
    GpuPeak peak;
    double peak_tflops = 0;   // the peak of the math in use (TF32 or float32); 0: no MFU
};

struct BenchResult {
    double ms = 0, tok_s = 0;
    double cpu_ms = 0;                  // the process's CPU time per step (all threads), in ms
    double mfu = 0;                     // model FLOPs utilisation against the device's peak (GPU)
    double model_gb = 0, device_gb = 0; // GPU memory: the model's allocations; the most device memory it added
    std::string attention;              // matmul or flash on the GPU, cpu on the CPU
};

// Times b.steps training steps (after two warm-up steps) of the model of b's shape with architecture arch.
// The timed region starts and ends with the device idle (model_sync): it holds
// the steps and nothing else (no copy of the parameters to the host).
static BenchResult bench_one(const BenchSetup& b, const Config& c) {
    GpuInfo before, after;
    bool on_gpu = b.dev == DEVICE_GPU && gpu_info(&before);
    Model model;
    std::string err = model_create(&model, c, b.B, b.dev, b.settings);
    if (!err.empty()) die("bench", err);
    model_init(&model, 1);
    Rng rng(7);
    std::vector<int> tokens((size_t)b.B * c.T), targets((size_t)b.B * c.T);
    std::vector<float> mask((size_t)b.B * c.T, 1.0f);
    for (size_t i = 0; i < tokens.size(); i++) { tokens[i] = (int)rng.below(c.V); targets[i] = (int)rng.below(c.V); }
    AdamWConfig opt;
    auto step = [&]() { model_train_step(&model, tokens.data(), targets.data(), mask.data(), b.B, c.T, opt, 1.0f); };
    // warm up caches and threads; on the GPU the first step runs eagerly, the second captures the graph.
    // At least 500 ms of them: the first model a process times ran 10-25% slower
    // after only two (a CPU that has just woken up; measured on the development machine)
    double w0 = now_ms();
    for (int i = 0; i < 2 || now_ms() - w0 < 500; i++) {
        step();
        model_sync(&model);
    }
    // the device memory all this took (cuBLAS, graphs included): after the warm-up and again after the timed steps
    double added_gb = on_gpu && gpu_info(&after) ? ((double)before.free_bytes - (double)after.free_bytes) / 1e9 : 0;
    double t0 = now_ms(), c0 = cpu_ms();
    for (int i = 0; i < b.steps; i++) step();
    model_sync(&model);
    BenchResult r;
    r.ms = (now_ms() - t0) / b.steps;
    r.cpu_ms = (cpu_ms() - c0) / b.steps;
    r.tok_s = (double)b.B * c.T / (r.ms / 1000);
    if (b.peak_tflops > 0) r.mfu = flops_per_token(c, c.T) * r.tok_s / (b.peak_tflops * 1e12);
    if (on_gpu && gpu_info(&after)) {
        r.model_gb = model_device_bytes(&model) / 1e9;
        r.device_gb = std::max(added_gb, ((double)before.free_bytes - (double)after.free_bytes) / 1e9);
    }
    r.attention = model_attention_name(&model);
    model_free(&model);
    return r;
}

// The shapes bench names: llama (no router), lime (the flags' router) and hc
// (the flags' --hc-rate and --hc-dynamic, default 4 streams, dynamic); --arch is refused.
static void bench_configs(const BenchSetup& b, Config* llama, Config* lime, Config* hc) {
    *llama = *lime = *hc = b.c;
    model_parse("llama", llama);
    lime->arch = ARCH_LIME;
    model_parse("hc", hc);
    hc->hc_rate = b.c.hc_rate, hc->hc_dynamic = b.c.hc_dynamic;
}

// --json: one object with the shape, the three models' numbers and their ratios to llama.
// Off a GPU the GPU's numbers (MFU, memory) are null and "gpu_absent" says why.
static void print_bench_json(const BenchSetup& b, const BenchResult& llama, const BenchResult& lime,
                             const BenchResult& hc, float reg, const BenchResult& llama_reg,
                             const BenchResult& lime_reg) {
    Config cl, cm, ch;
    bench_configs(b, &cl, &cm, &ch);
    const Config& c = b.c;
    Json null_;  // the GPU's numbers off a GPU
    auto one = [&](const BenchResult& r, const Config& rc) {
        Json o;
        o.add_num("ms_per_step", r.ms).add_num("tokens_per_s", r.tok_s).add_num("flops_per_token", flops_per_token(rc, b.c.T))
            .add_num("cpu_ms_per_step", r.cpu_ms);
        if (b.on_gpu) o.add_num("mfu", r.mfu).add_num("model_gb", r.model_gb).add_num("peak_device_gb", r.device_gb);
        else o.add("mfu", null_).add("model_gb", null_).add("peak_device_gb", null_);
        return o.add_str("attention", r.attention);
    };
    Json shape;
    shape.add_num("L", c.L).add_num("d", c.d).add_num("H", c.H).add_num("R", c.R).add_num("F", c.F).add_num("V", c.V)
        .add_num("B", b.B).add_num("T", c.T);
    Json s;
    s.add_str("device", b.dev == DEVICE_GPU ? "gpu" : "cpu").add("shape", shape).add_num("steps", b.steps)
        .add_str("lime_model", model_name(cm)).add_str("hc_model", model_name(ch));
    if (b.on_gpu)
        s.add_str("gpu", b.gpu.name).add_num("tf32", b.settings.tf32).add_num("graph", b.settings.graph)
            .add_num("peak_tflops", b.peak_tflops).add_str("peak_source", b.peak.source);
    else if (b.dev == DEVICE_GPU)
        s.add_str("gpu_absent", "no GPU information: MFU and memory are not measured");
    else
        s.add_str("gpu_absent", "a CPU run: MFU and device memory are measured on a GPU only");
    s.add("llama", one(llama, cl)).add("lime", one(lime, cm)).add("hc", one(hc, ch))
        .add_num("lime_over_llama", lime.ms / llama.ms).add_num("hc_over_llama", hc.ms / llama.ms)
        .add_num("flops_hc_over_llama", flops_per_token(ch, c.T) / flops_per_token(cl, c.T))
        .add_num("bytes_hc_over_llama", bytes_per_token(ch, c.T) / bytes_per_token(cl, c.T));
    if (b.on_gpu)
        s.add_num("memory_lime_over_llama", llama.model_gb > 0 ? lime.model_gb / llama.model_gb : 0)
            .add_num("memory_hc_over_llama", llama.model_gb > 0 ? hc.model_gb / llama.model_gb : 0);
    if (reg > 0)  // --entropy-reg: llama and lime timed with the regulariser too
        s.add_num("entropy_reg", reg).add_num("llama_reg_ms_per_step", llama_reg.ms)
            .add_num("lime_reg_ms_per_step", lime_reg.ms).add_num("llama_reg_cpu_ms_per_step", llama_reg.cpu_ms)
            .add_num("lime_reg_cpu_ms_per_step", lime_reg.cpu_ms);
    printf("%s\n", json_write(s).c_str());
}

// The table: the setting, one line per model, the ratios lime / llama.
static void print_bench_text(const BenchSetup& b, const BenchResult& llama, const BenchResult& lime,
                             const BenchResult& hc) {
    Config cl, cm, ch;
    bench_configs(b, &cl, &cm, &ch);
    const Config& c = b.c;
    bool tf32 = b.settings.tf32;
    printf("bench %s: L=%d d=%d H=%d R=%d F=%d V=%d B=%d T=%d, %d steps, lime is %s, hc is %s\n",
           b.dev == DEVICE_GPU ? "gpu" : "cpu", c.L, c.d, c.H, c.R, c.F, c.V, b.B, c.T, b.steps,
           model_name(cm).c_str(), model_name(ch).c_str());
    if (b.on_gpu)
        printf("  %s (sm_%d%d), %s, %s; MFU against %.1f TFLOP/s (%s %s)\n", b.gpu.name.c_str(), b.gpu.major,
               b.gpu.minor, tf32 ? "TF32" : "float32", b.settings.graph ? "CUDA graph" : "plain launches",
               b.peak_tflops, b.peak.source.c_str(), tf32 ? "TF32" : "FP32");
    for (auto [name, r] : {std::make_pair("llama", llama), std::make_pair("lime", lime), std::make_pair("hc", hc)}) {
        printf("  %-5s  %9.2f ms/step  %10.0f tokens/s", name, r.ms, r.tok_s);
        if (b.on_gpu)
            printf("  MFU %5.1f%%  memory %.3f GB (model) %.3f GB (device, peak)  %s attention", 100 * r.mfu, r.model_gb,
                   r.device_gb, r.attention.c_str());
        printf("\n");
    }
    printf("  lime / llama step time: %.3f", lime.ms / llama.ms);
    if (b.on_gpu) printf(", memory: %.3f", llama.model_gb > 0 ? lime.model_gb / llama.model_gb : 0);
    printf("\n  hc / llama step time: %.3f (FLOPs: %.3f, bytes: %.3f)", hc.ms / llama.ms,
           flops_per_token(ch, c.T) / flops_per_token(cl, c.T), bytes_per_token(ch, c.T) / bytes_per_token(cl, c.T));
    if (b.on_gpu) printf(", memory: %.3f", llama.model_gb > 0 ? hc.model_gb / llama.model_gb : 0);
    printf("\n");
}

// The flags of bench, read and checked; on a GPU also its description and peaks.
static BenchSetup bench_setup(Args& a) {
    BenchSetup b;
    if (a.has("arch"))  // taken from SHAPE_FLAGS, but bench always times both: refused, not ignored
        die("bench", "--arch: bench times llama, lime and hc side by side, all of this shape; leave --arch out "
                     "(the router flags shape lime, --hc-rate and --hc-dynamic shape hc)");
    set_threads(a);
    b.dev = pick_device(a);
    b.c = shape_from_args(a, false);
    b.c.V = (int)a.integer("vocab", 1, 1 << 24);
    b.c.T = (int)a.integer("seq-len", 1, 1 << 20);
    b.B = (int)a.integer("batch", 1, 1 << 20);
    b.steps = (int)a.integer("steps", 1, 1 << 20);
    b.settings = model_settings(a);
    if (!a.err.empty()) die("bench", a.err);
    std::string err = config_check(b.c);
    if (!err.empty()) die("bench", err);
    // MFU: flops_per_token (forward + backward, router included) * tokens/s over the
    // device's dense peak for the math in use: TF32 tensor cores, or plain float32.
    b.on_gpu = b.dev == DEVICE_GPU && gpu_info(&b.gpu);
    b.peak = gpu_peak(b.gpu.name, b.gpu.major, b.gpu.minor);
    b.peak_tflops = b.on_gpu ? (b.settings.tf32 ? b.peak.tf32 : b.peak.fp32) : 0;
    return b;
}

int cmd_bench(int argc, char** argv) {
    std::vector<FlagSpec> flags = concat({SHAPE_FLAGS, {
        {"vocab", "21", "V, vocabulary size"},
        {"seq-len", "88", "T, positions"},
        {"batch", "128", "B, sequences per step"},
        {"steps", "20", "timed steps per model (after 2 warm-up steps)"},
        {"threads", "0", "OpenMP threads (0: all cores; at most 4 x the cores)"},
        {"device", "auto", "auto, cpu or gpu"},
        {"tf32", "1", "gpu: TF32 tensor cores for the matrix products (0: plain float32)"},
        ATTENTION_FLAG,
        {"graph", "1", "gpu: replay each training step as one CUDA graph (0: plain launches)"},
        {"json", nullptr, "print one JSON object"},
    }});
    Args a = parse_args("bench", "Times training steps of llama, lime and hc on synthetic tokens; on the GPU also MFU and "
                        "memory.", flags, argc, argv, false);
    BenchSetup b = bench_setup(a), plain = b;
    plain.c.entropy_reg = 0;
    Config cl, cm, ch;
    bench_configs(plain, &cl, &cm, &ch);
    // --entropy-reg L: llama and lime also with the regulariser, each timed right after it without
    float reg = b.c.entropy_reg;
    Config cl_reg = cl, cm_reg = cm;
    cl_reg.entropy_reg = cm_reg.entropy_reg = reg;
    BenchResult llama = bench_one(plain, cl), llama_reg = reg > 0 ? bench_one(plain, cl_reg) : BenchResult();
    BenchResult lime = bench_one(plain, cm), lime_reg = reg > 0 ? bench_one(plain, cm_reg) : BenchResult();
    BenchResult hc = bench_one(plain, ch);
    if (a.has("json")) print_bench_json(plain, llama, lime, hc, reg, llama_reg, lime_reg);
    else print_bench_text(plain, llama, lime, hc);
    if (reg > 0 && !a.has("json"))
        printf("  with --entropy-reg %g: llama %.2f ms/step (%+.1f%%), lime %.2f ms/step (%+.1f%%)\n", reg,
               llama_reg.ms, 100 * (llama_reg.ms / llama.ms - 1), lime_reg.ms, 100 * (lime_reg.ms / lime.ms - 1));
    return 0;
}
