// support/commands/bench.cpp — `./lime bench`: ms per step and tokens/s of
// llama and the models --models names (lime, hc, resformer, denseformer) of
// one shape on synthetic tokens, side by side (made together, their steps
// interleaved: bench_models), each beside its FLOP and byte ratios to llama's
// (support/model/cost.cpp), with --entropy-reg also
// llama and lime with the regulariser; MFU, on a GPU against the device's
// peak (support/lib/gpu_peaks.h), on the CPU against its threads' FMA peak
// measured between the steps (support/lib/cpu_peak.h); on a GPU also the
// memory each model took. train.cpp's main calls cmd_bench (support/commands/commands.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "support/commands/commands.h"
#include "support/lib/cli.h"
#include "support/lib/cpu_peak.h"
#include "support/lib/gpu_peaks.h"
#include "support/lib/rng.h"
#include "support/lib/safetensors.h"
#include "support/model/cpu_fast.h"  // cpu_threads
#include "support/model/lime.h"
#include "support/model/names.h"

// ===========================================================================
// ./lime bench: ms/step and tokens/s of llama and its peers on synthetic tokens
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
    bool cpu_peak = false;    // a CPU run: MFU against the FMA peak of its threads, measured each round
};

struct BenchResult {
    double ms = 0, tok_s = 0;
    double cpu_ms_per_step = 0;         // the process's CPU time per step (all threads), in ms
    double mfu = 0;                     // model FLOPs utilisation against the device's peak (GPU) or the CPU's
    double model_gb = 0, device_gb = 0; // GPU memory: the model's allocations; what it took as it was made and ran its two warm-up steps
    std::string attention;              // matmul or flash on the GPU, cpu on the CPU
    size_t graph_nodes = 0;             // GPU with --graph 1: the kernels and copies of one captured step
};

// One model bench times: its config, and what it measured.
struct BenchModel {
    std::string name;  // llama, lime, hc, resformer, denseformer; llama+reg and lime+reg with --entropy-reg;
                       // on a GPU lime+cublas, lime with its router on cuBLAS rather than its kernels
    Config c;
    bool router_cublas = false;
    Model model;
    BenchResult r;
    std::vector<double> step_ms;  // each timed step's wall clock
};

// The FMA peak of all the threads OpenMP runs, in GFLOP/s of the wall clock:
// each runs `rounds` rounds of support/lib/cpu_peak.h's chains.
static double cpu_peak_gflops(long rounds) {
    double flops = 0, t0 = now_ms();
#pragma omp parallel reduction(+ : flops)
    flops += cpu_fma_flops(rounds);
    return flops / std::max(now_ms() - t0, 1e-6) / 1e6;
}

// Rounds of the chains that take about 3 ms on this machine (a slow build's too).
static long cpu_peak_rounds() {
    long probe = 1 << 16;
    double t0 = now_ms();
    cpu_peak_gflops(probe);
    return std::clamp((long)(probe * 3.0 / std::max(now_ms() - t0, 1e-3)), 1L << 12, 1L << 24);
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Makes every model of ms (all of b's shape) and times b.steps training steps of
// each, interleaved: round i runs two steps of every model, in an order drawn
// afresh each round, and times the second alone, so that it starts from the
// caches its model's own step left, as in a training run (a step right after
// another model's ran up to 20% slower, and a fixed order put a model after the
// same other one every time); each timed step runs from an idle device
// to an idle device (model_sync). So a change in the machine's load falls on
// all the models alike, and a ratio of two models (median_ratio) compares steps
// taken side by side. Warm-up first: two steps of each model as it is made (on
// the GPU the first runs eagerly, the second captures the graph), then rounds
// for 500 ms: the first model a process timed ran 10-25% slower after two steps
// alone (a CPU that has just woken up; measured on the development machine).
// On the CPU each round ends with the FMA peak of the threads (cpu_peaks, GFLOP/s),
// and a model's MFU is the median over the rounds of its step's FLOP/s over the
// round's peak: a machine whose speed moves moves both.
static void bench_models(const BenchSetup& b, std::vector<BenchModel>* ms, std::vector<double>* cpu_peaks) {
    int n = (int)ms->size(), T = b.c.T;
    Rng rng(7);
    std::vector<int> tokens((size_t)b.B * T), targets((size_t)b.B * T);
    std::vector<float> mask((size_t)b.B * T, 1.0f);
    for (size_t i = 0; i < tokens.size(); i++) { tokens[i] = (int)rng.below(b.c.V); targets[i] = (int)rng.below(b.c.V); }
    AdamWConfig opt;
    auto step = [&](BenchModel& m) {  // one step, from an idle device to an idle device
        model_train_step(&m.model, tokens.data(), targets.data(), mask.data(), b.B, T, opt, 1.0f);
        model_sync(&m.model);
    };
    GpuInfo info;
    for (BenchModel& m : *ms) {  // made one after another, each with two warm-up steps
        double free_before = b.on_gpu && gpu_info(&info) ? (double)info.free_bytes : 0;
        ModelSettings settings = b.settings;
        settings.router_cublas = m.router_cublas;
        std::string err = model_create(&m.model, m.c, b.B, b.dev, settings);
        if (!err.empty()) die("bench", err);
        model_init(&m.model, 1);
        for (int i = 0; i < 2; i++) step(m);
        // the device memory it took, cuBLAS and its graph included
        if (b.on_gpu && gpu_info(&info)) m.r.device_gb = (free_before - (double)info.free_bytes) / 1e9;
    }
    double w0 = now_ms();
    while (now_ms() - w0 < 500)
        for (BenchModel& m : *ms) step(m);
    long peak_rounds = b.cpu_peak ? cpu_peak_rounds() : 0;
    std::vector<int> order(n);
    for (int k = 0; k < n; k++) order[k] = k;
    Rng shuffle(11);
    for (int i = 0; i < b.steps; i++) {
        for (int k = n - 1; k > 0; k--) std::swap(order[k], order[shuffle.below(k + 1)]);  // a new order each round
        for (int k = 0; k < n; k++) {
            BenchModel& m = (*ms)[order[k]];
            step(m);  // untimed: it leaves the caches as a training run's previous step would
            double t0 = now_ms(), c0 = cpu_ms();
            step(m);
            m.step_ms.push_back(now_ms() - t0);
            m.r.cpu_ms_per_step += (cpu_ms() - c0) / b.steps;
        }
        if (b.cpu_peak) cpu_peaks->push_back(cpu_peak_gflops(peak_rounds));
    }
    for (BenchModel& m : *ms) {
        for (double t : m.step_ms) m.r.ms += t / b.steps;
        m.r.tok_s = (double)b.B * T / (m.r.ms / 1000);
        double step_flops = flops_per_token(m.c, T) * b.B * T;
        if (b.peak_tflops > 0) m.r.mfu = step_flops / (m.r.ms / 1000) / (b.peak_tflops * 1e12);
        if (b.cpu_peak) {  // each round's step against that round's peak
            std::vector<double> mfus;
            for (size_t i = 0; i < m.step_ms.size(); i++)
                mfus.push_back(step_flops / (m.step_ms[i] / 1000) / ((*cpu_peaks)[i] * 1e9));
            m.r.mfu = median(mfus);
        }
        if (b.on_gpu) m.r.model_gb = model_device_bytes(&m.model) / 1e9;
        m.r.graph_nodes = model_graph_nodes(&m.model);
        m.r.attention = model_attention_name(&m.model);
    }
    for (BenchModel& m : *ms) model_free(&m.model);
}

// The median over the rounds of (a's step / b's step): a's time relative to b's.
static double median_ratio(const BenchModel& a, const BenchModel& b) {
    std::vector<double> r;
    for (size_t i = 0; i < a.step_ms.size(); i++) r.push_back(a.step_ms[i] / b.step_ms[i]);
    return median(r);
}

// A model's FLOPs and bytes per token over llama's (support/model/cost.cpp): on a
// CPU its step lands between the two.
struct CostRatio {
    double flops, bytes;
};
static CostRatio cost_over(const Config& m, const Config& llama, int T) {
    return {flops_per_token(m, T) / flops_per_token(llama, T), bytes_per_token(m, T) / bytes_per_token(llama, T)};
}

// The models bench may time beside llama, the order they print in: every registered model but llama.
static std::vector<std::string> bench_peers() {
    std::vector<std::string> peers;
    for (const ModelEntry& m : model_registry())
        if (std::string(m.name) != "llama") peers.push_back(m.name);
    return peers;
}
static const char* bench_peers_list() {  // "lime,hc,resformer,denseformer": --models' default, built once
    static const std::string list = [] {
        std::string s;
        for (const std::string& p : bench_peers()) s += (s.empty() ? "" : ",") + p;
        return s;
    }();
    return list.c_str();
}

// The models bench times, of b's shape: llama first (no router), then those --models
// lists, in BENCH_PEERS' order: lime (the flags' router), hc (the flags' --hc-rate and
// --hc-dynamic, default 4 streams, dynamic), resformer, denseformer, muddformer (the flags'
// --mudd-ways). --arch is refused.
static std::vector<BenchModel> bench_configs(const BenchSetup& b, const std::vector<std::string>& peers) {
    std::vector<BenchModel> ms(1);
    ms[0].name = "llama", ms[0].c = b.c;
    model_parse("llama", &ms[0].c);
    for (const std::string& name : bench_peers()) {
        if (std::find(peers.begin(), peers.end(), name) == peers.end()) continue;
        BenchModel m;
        m.name = name, m.c = b.c;
        if (m.name == "lime") m.c.arch = ARCH_LIME;  // the router flags stay
        else model_parse(name, &m.c), m.c.hc_rate = b.c.hc_rate, m.c.hc_dynamic = b.c.hc_dynamic, m.c.mudd_ways = b.c.mudd_ways;
        ms.push_back(m);
    }
    return ms;
}

// --models: a comma list of BENCH_PEERS, each once ("" for llama alone).
static std::string parse_bench_models(const std::string& arg, std::vector<std::string>* peers) {
    size_t at = 0;
    while (!arg.empty() && at <= arg.size()) {
        size_t comma = std::min(arg.find(',', at), arg.size());
        std::string name = arg.substr(at, comma - at);
        bool known = false;
        for (const std::string& p : bench_peers()) known = known || name == p;
        if (!known)
            return "--models: '" + name + "' is not a model bench times beside llama; list some of " +
                   bench_peers_list() + " (llama is always timed)";
        if (std::find(peers->begin(), peers->end(), name) != peers->end())
            return "--models: " + name + " is listed twice; name each model once";
        peers->push_back(name);
        at = comma + 1;
    }
    return "";
}

static const BenchModel* find_model(const std::vector<BenchModel>& ms, const std::string& name) {
    for (const BenchModel& m : ms)
        if (m.name == name) return &m;
    return nullptr;
}

// --json: one object with the shape, each model's numbers and its ratios to llama.
// Off a GPU the GPU's numbers (memory) are null and "gpu_absent" says why; a CPU
// run's MFU is against cpu_peak (GFLOP/s, the median of the rounds' peaks).
static void print_bench_json(const BenchSetup& b, const std::vector<BenchModel>& ms, float reg, double cpu_peak) {
    const BenchModel& ml = ms[0];  // llama
    const Config& c = b.c;
    Json null_;  // the GPU's numbers off a GPU
    auto one = [&](const BenchResult& r, const Config& rc) {
        Json o;
        o.add_num("ms_per_step", r.ms).add_num("tokens_per_s", r.tok_s).add_num("flops_per_token", flops_per_token(rc, b.c.T))
            .add_num("cpu_ms_per_step", r.cpu_ms_per_step);
        if (b.on_gpu || b.cpu_peak) o.add_num("mfu", r.mfu);
        else o.add("mfu", null_);
        if (b.on_gpu) o.add_num("model_gb", r.model_gb).add_num("peak_device_gb", r.device_gb);
        else o.add("model_gb", null_).add("peak_device_gb", null_);
        if (r.graph_nodes > 0) o.add_num("graph_nodes", (double)r.graph_nodes);
        else o.add("graph_nodes", null_);
        return o.add_str("attention", r.attention);
    };
    Json shape;
    shape.add_num("L", c.L).add_num("d", c.d).add_num("H", c.H).add_num("R", c.R).add_num("F", c.F).add_num("V", c.V)
        .add_num("B", b.B).add_num("T", c.T);
    Json s;
    s.add_str("device", b.dev == DEVICE_GPU ? "gpu" : "cpu").add("shape", shape).add_num("steps", b.steps);
    for (const BenchModel& m : ms)
        if (m.name != "llama" && m.name.find('+') == std::string::npos) s.add_str(m.name + "_model", model_name(m.c));
    if (b.on_gpu)
        s.add_str("gpu", b.gpu.name).add_num("tf32", b.settings.tf32).add_num("graph", b.settings.graph)
            .add_str("precision", b.settings.precision == PRECISION_BF16 ? "bf16" : "float32")
            .add_num("peak_tflops", b.peak_tflops).add_str("peak_source", b.peak.source);
    else if (b.dev == DEVICE_GPU)
        s.add_str("gpu_absent", "no GPU information: MFU and memory are not measured");
    else
        s.add_str("gpu_absent", "a CPU run: device memory is measured on a GPU only")
            .add_num("threads", cpu_threads()).add_str("cpu_peak_vectors", cpu_fma_kind())
            .add_num("cpu_peak_gflops", cpu_peak);
    for (const BenchModel& m : ms) {
        if (m.name.find('+') != std::string::npos) continue;  // the regulariser's, below
        s.add(m.name, one(m.r, m.c));
        if (m.name == "llama") continue;
        CostRatio cost = cost_over(m.c, ml.c, c.T);
        s.add_num(m.name + "_over_llama", median_ratio(m, ml)).add_num("flops_" + m.name + "_over_llama", cost.flops)
            .add_num("bytes_" + m.name + "_over_llama", cost.bytes);
        if (b.on_gpu) s.add_num("memory_" + m.name + "_over_llama", ml.r.model_gb > 0 ? m.r.model_gb / ml.r.model_gb : 0);
    }
    if (reg > 0) {  // --entropy-reg: llama and lime with the regulariser too, against themselves without
        s.add_num("entropy_reg", reg);
        for (const char* name : {"llama", "lime"}) {
            const BenchModel *plain = find_model(ms, name), *with = find_model(ms, std::string(name) + "+reg");
            if (!plain || !with) continue;
            s.add_num(std::string(name) + "_reg_ms_per_step", with->r.ms)
                .add_num(std::string(name) + "_reg_over_plain", median_ratio(*with, *plain));
        }
    }
    const BenchModel *lime = find_model(ms, "lime"), *blas = find_model(ms, "lime+cublas");
    if (lime && blas)  // a GPU's lime with its router on cuBLAS: its step against the kernels'
        s.add_num("lime_router_cublas_ms_per_step", blas->r.ms)
            .add_num("lime_router_kernels_over_cublas", median_ratio(*lime, *blas));
    printf("%s\n", json_write(s).c_str());
}

// The table: the setting, one line per model, each model's step time over llama's
// (the median over the rounds, median_ratio) beside its FLOP and byte ratios (cost_over),
// and with --entropy-reg the regulariser's.
static void print_bench_text(const BenchSetup& b, const std::vector<BenchModel>& ms, float reg, double cpu_peak) {
    const BenchModel& ml = ms[0];  // llama
    const Config& c = b.c;
    bool tf32 = b.settings.tf32, bf16 = b.settings.precision == PRECISION_BF16;
    const char* math = bf16 ? "bf16 products (dense and attention's)" : tf32 ? "TF32" : "float32";
    std::string named;  // what lime and hc are, when they run
    for (const char* name : {"lime", "hc"})
        if (const BenchModel* m = find_model(ms, name)) named += std::string(", ") + name + " is " + model_name(m->c);
    printf("bench %s: L=%d d=%d H=%d R=%d F=%d V=%d B=%d T=%d, %d steps%s\n", b.dev == DEVICE_GPU ? "gpu" : "cpu", c.L,
           c.d, c.H, c.R, c.F, c.V, b.B, c.T, b.steps, named.c_str());
    if (b.on_gpu)
        printf("  %s (sm_%d%d), %s, %s; MFU against %.1f TFLOP/s (%s %s)\n", b.gpu.name.c_str(), b.gpu.major,
               b.gpu.minor, math, b.settings.graph ? "CUDA graph" : "plain launches", b.peak_tflops,
               b.peak.source.c_str(), bf16 ? "BF16: 2 x TF32" : tf32 ? "TF32" : "FP32");
    if (b.cpu_peak)
        printf("  %d threads; MFU against their %s FMA peak, %.1f GFLOP/s (measured after each round: the medians)\n",
               cpu_threads(), cpu_fma_kind(), cpu_peak);
    for (const BenchModel& m : ms) {
        if (m.name.find('+') != std::string::npos) continue;  // the regulariser's, below
        const BenchResult& r = m.r;
        printf("  %-11s  %9.2f ms/step  %10.0f tokens/s", m.name.c_str(), r.ms, r.tok_s);
        if (b.on_gpu || b.cpu_peak) printf("  MFU %5.1f%%", 100 * r.mfu);
        if (b.on_gpu)
            printf("  memory %.3f GB (model) %.3f GB (device, peak)  %s attention", r.model_gb, r.device_gb,
                   r.attention.c_str());
        if (r.graph_nodes > 0) printf("  %zu nodes a step", r.graph_nodes);
        printf("\n");
    }
    bool first = true;
    for (const BenchModel& m : ms) {
        if (m.name == "llama" || m.name.find('+') != std::string::npos) continue;
        CostRatio cost = cost_over(m.c, ml.c, c.T);
        printf("  %s / llama step time: %.3f (", m.name.c_str(), median_ratio(m, ml));
        if (first) printf("the median of the %d steps' ratios; ", b.steps);
        printf("FLOPs: %.3f, bytes: %.3f)", cost.flops, cost.bytes);
        if (b.on_gpu) printf(", memory: %.3f", ml.r.model_gb > 0 ? m.r.model_gb / ml.r.model_gb : 0);
        printf("\n");
        first = false;
    }
    if (reg > 0) {
        printf("  with --entropy-reg %g:", reg);
        for (const char* name : {"llama", "lime"}) {
            const BenchModel *plain = find_model(ms, name), *with = find_model(ms, std::string(name) + "+reg");
            if (plain && with)
                printf("%s %s %.2f ms/step (%+.1f%%)", std::string(name) == "llama" ? "" : ",", name, with->r.ms,
                       100 * (median_ratio(*with, *plain) - 1));
        }
        printf("\n");
    }
    const BenchModel *lime = find_model(ms, "lime"), *blas = find_model(ms, "lime+cublas");
    if (lime && blas)
        printf("  lime's router: its kernels %.2f ms/step (training's choice), cuBLAS %.2f ms/step; kernels / cuBLAS "
               "%.3f\n", lime->r.ms, blas->r.ms, median_ratio(*lime, *blas));
}

// The flags of bench, read and checked; on a GPU also its description and peaks.
static BenchSetup bench_setup(Args& a) {
    BenchSetup b;
    if (a.has("arch"))  // taken from SHAPE_FLAGS, but bench always times both: refused, not ignored
        die("bench", "--arch: bench times llama and the models of --models side by side, all of this shape; leave "
                     "--arch out and name them in --models (the router flags shape lime, --hc-rate and --hc-dynamic hc)");
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
    // device's dense peak for the math in use: bf16 tensor cores (twice TF32's), TF32, or plain float32;
    // on the CPU over its threads' FMA peak, measured each round (bench_models).
    b.on_gpu = b.dev == DEVICE_GPU && gpu_info(&b.gpu);
    b.peak = gpu_peak(b.gpu.name, b.gpu.major, b.gpu.minor);
    bool bf16 = b.settings.precision == PRECISION_BF16;
    b.peak_tflops = !b.on_gpu ? 0 : bf16 ? 2 * b.peak.tf32 : b.settings.tf32 ? b.peak.tf32 : b.peak.fp32;
    b.cpu_peak = b.dev == DEVICE_CPU;
    return b;
}

int cmd_bench(int argc, char** argv) {
    std::vector<FlagSpec> flags = concat({SHAPE_FLAGS, {
        {"vocab", "21", "V, vocabulary size"},
        {"seq-len", "88", "T, positions"},
        {"batch", "128", "B, sequences per step"},
        {"steps", "20", "timed steps per model, the models' steps interleaved (after warm-up: 2 and 500 ms)"},
        {"threads", "0", "OpenMP threads (0: all cores; at most 4 x the cores)"},
        {"device", "auto", "auto, cpu or gpu"},
        {"tf32", "1", "gpu: TF32 tensor cores for the matrix products (0: plain float32)"},
        PRECISION_FLAG,
        ATTENTION_FLAG,
        {"graph", "1", "gpu: replay each training step as one CUDA graph (0: plain launches)"},
        {"models", bench_peers_list(), "the models timed beside llama, comma-separated: some of the default's"},
        {"json", nullptr, "print one JSON object"},
    }});
    for (FlagSpec& f : flags)  // SHAPE_FLAGS' --arch: bench times every model --models names, so it takes none
        if (std::string(f.name) == "arch") f.def = "", f.help = "not bench's: name the models in --models";
    std::string about = "Times training steps of llama and its peers (" + std::string(bench_peers_list()) +
                        ") on synthetic tokens, each beside its FLOP and byte ratios to llama, with MFU (against the GPU's "
                        "datasheet peak, or the CPU's FMA peak measured as it runs); on the GPU also memory.";
    Args a = parse_args("bench", about.c_str(), flags, argc, argv, false);
    std::vector<std::string> peers;
    std::string err = parse_bench_models(a.str("models"), &peers);
    if (!err.empty()) die("bench", err);
    BenchSetup b = bench_setup(a), plain = b;
    plain.c.entropy_reg = 0;
    std::vector<BenchModel> ms = bench_configs(plain, peers);
    float reg = b.c.entropy_reg;
    if (reg > 0)  // --entropy-reg L: llama and lime also with the regulariser
        for (const char* name : {"llama", "lime"})
            if (const BenchModel* m = find_model(ms, name)) {
                BenchModel with = *m;
                with.name = std::string(name) + "+reg", with.c.entropy_reg = reg;
                ms.push_back(with);
            }
    // on a GPU lime's router both ways: its kernels (what training uses where they fit) and cuBLAS
    const BenchModel* lime = find_model(ms, "lime");
    if (b.dev == DEVICE_GPU && lime && has_router(lime->c, 1)) {
        BenchModel blas = *lime;
        blas.name = "lime+cublas", blas.router_cublas = true;
        ms.push_back(blas);
    }
    // each model_create asks for its own model; bench holds them all at once, so their sum is asked first
    std::vector<Config> all;
    for (const BenchModel& m : ms) all.push_back(m.c);
    err = models_fit_together(all, b.B, b.dev, b.settings);
    if (!err.empty()) die("bench", err);
    std::vector<double> cpu_peaks;  // a CPU run's FMA peak after each round, GFLOP/s
    bench_models(plain, &ms, &cpu_peaks);
    double cpu_peak = median(cpu_peaks);
    if (a.has("json")) print_bench_json(plain, ms, reg, cpu_peak);
    else print_bench_text(plain, ms, reg, cpu_peak);
    return 0;
}
