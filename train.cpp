// train.cpp — the command-line program `./lime`: train, eval, sample, data,
// verify and bench, each with --help. The model lives in lime.cu, the tasks
// in data/; this file reads flags, moves data in and out, and reports.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "support/cli.h"
#include "data/task.h"
#include "support/lime.h"
#include "support/plot.h"
#include "support/safetensors.h"
#include "support/study.h"

// ===========================================================================
// Tasks: built from flags, or rebuilt from a checkpoint's metadata
// ===========================================================================

static const std::vector<FlagSpec> TASK_FLAGS = {
    {"task", "arith", "arith (TASKS.md 1), prosqa (2) or text (3)"},
    {"ops", "3", "arith: operators per question, the tier k"},
    {"modulus", "11", "arith: the prime p"},
    {"format", "chain", "arith: chain (chain of thought) or direct"},
    {"train-size", "20000", "arith, prosqa: training examples"},
    {"test-size", "500", "arith, prosqa: test examples"},
    {"data-seed", "1", "arith, prosqa: seed of the generated data"},
    {"prosqa-test", "data/prosqa/prosqa_test.json", "prosqa: the real Coconut file scored on"},
    {"text-file", "", "text: a UTF-8 file to model byte by byte"},
    {"val-frac", "0.1", "text: held-out tail for validation"},
};

// A flag of another task would be silently ignored: refuse it instead.
static void refuse_flags_of_other_task(Args& a, const std::string& task) {
    static const std::map<std::string, std::vector<std::string>> owners = {
        {"ops", {"arith"}}, {"modulus", {"arith"}}, {"format", {"arith"}}, {"train-size", {"arith", "prosqa"}},
        {"test-size", {"arith", "prosqa"}}, {"data-seed", {"arith", "prosqa"}}, {"prosqa-test", {"prosqa"}},
        {"text-file", {"text"}}, {"val-frac", {"text"}}, {"seq-len", {"text"}}};
    for (auto& [flag, tasks] : owners) {
        if (!a.has(flag) || std::find(tasks.begin(), tasks.end(), task) != tasks.end()) continue;
        a.fail("--" + flag + " is for --task " + tasks[0] + "; drop it or add --task " + tasks[0]);
    }
}

// Reads and checks the task flags; the values form the task's settings.
static std::map<std::string, std::string> task_settings(Args& a) {
    std::string task = a.choice("task", {"arith", "prosqa", "text"});
    refuse_flags_of_other_task(a, task);
    std::map<std::string, std::string> s = {{"task", task}};
    if (task == "arith") {
        a.integer("ops", 1, 64);
        a.integer("modulus", 2, 997);
        a.choice("format", {"chain", "direct"});
        a.integer("train-size", 1, 10000000);
        a.integer("test-size", 1, 1000000);
        a.integer("data-seed", 0, (long long)1 << 62);
        for (const char* k : {"ops", "modulus", "format", "train-size", "test-size", "data-seed"}) s[k] = a.str(k);
    } else if (task == "prosqa") {
        a.integer("train-size", 1, 10000000);
        a.integer("test-size", 1, 1000000);
        a.integer("data-seed", 0, (long long)1 << 62);
        for (const char* k : {"train-size", "test-size", "data-seed", "prosqa-test"}) s[k] = a.str(k);
        // the default test file lives in the repository: find it from elsewhere too
        if (!a.has("prosqa-test") && access(s["prosqa-test"].c_str(), R_OK) != 0) s["prosqa-test"] = exe_dir() + "/" + s["prosqa-test"];
    } else {
        a.number("val-frac", 0.0, 0.9);
        s["text-file"] = a.str("text-file");
        s["val-frac"] = a.str("val-frac");
    }
    return s;
}

// ===========================================================================
// Generation and scoring
// ===========================================================================

static int argmax(const float* x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[best]) best = i;
    return best;
}

static int sample_token(const float* logits, int V, float temperature, Rng* rng) {
    if (temperature <= 0) return argmax(logits, V);
    float maxz = logits[argmax(logits, V)];
    std::vector<double> p(V);
    double sum = 0;
    for (int i = 0; i < V; i++) sum += p[i] = std::exp((logits[i] - maxz) / temperature);
    double u = rng->uniform() * sum;
    for (int i = 0; i < V; i++) if ((u -= p[i]) < 0) return i;
    return V - 1;
}

// Extends every sequence until <eos>, max_new new tokens, or the model's
// length limit (c.T + 1 tokens). Sequences run in batches of the model's B;
// each forward covers the longest sequence of the batch (causal attention
// makes the padding after a shorter sequence harmless).
static void generate(Model* m, const Vocab& v, std::vector<std::vector<int>>* seqs, int max_new, float temperature, Rng* rng) {
    const Config& c = m->c;
    std::vector<int> tokens;
    for (size_t start = 0; start < seqs->size(); start += m->B) {
        int B = (int)std::min((size_t)m->B, seqs->size() - start);
        std::vector<int> budget(B, max_new);
        for (;;) {
            int T = 0;
            std::vector<int> active;
            for (int b = 0; b < B; b++) {
                std::vector<int>& s = (*seqs)[start + b];
                bool done = budget[b] == 0 || (int)s.size() > c.T || s.empty() || (s.size() > 1 && s.back() == v.eos);
                if (!done) { active.push_back(b); T = std::max(T, (int)s.size()); }
            }
            if (active.empty()) break;
            tokens.assign((size_t)B * T, v.pad);
            for (int b = 0; b < B; b++) {
                const std::vector<int>& s = (*seqs)[start + b];
                for (int t = 0; t < T && t < (int)s.size(); t++) tokens[(size_t)b * T + t] = s[t];
            }
            model_forward(m, tokens.data(), nullptr, nullptr, B, T);
            const float* logits = model_logits(m);
            for (int b : active) {
                std::vector<int>& s = (*seqs)[start + b];
                s.push_back(sample_token(logits + ((size_t)b * T + s.size() - 1) * c.V, c.V, temperature, rng));
                budget[b]--;
            }
        }
    }
}

struct Score {
    int n = 0, correct = 0, valid_chains = 0;
    double accuracy() const { return n ? (double)correct / n : 0; }
};

// Greedy decoding from each test prompt, scored as its task says: arith
// (TASKS.md 1), the token before the first <eos> is the answer; prosqa (2),
// the text after the last '#' is the answer.
static Score score_answers(Model* m, const Task& t, int limit) {
    Score sc;
    int n = std::min((int)t.test->size(), limit > 0 ? limit : (int)t.test->size());
    std::vector<std::vector<int>> seqs(n);
    for (int i = 0; i < n; i++) {
        const Sequence& s = (*t.test)[i];
        seqs[i].assign(s.tokens.begin(), s.tokens.begin() + s.loss_start);
    }
    Rng rng(0);
    generate(m, t.vocab, &seqs, m->c.T + 1, 0.0f, &rng);
    for (int i = 0; i < n; i++) {
        int prompt = (*t.test)[i].loss_start;
        std::vector<int> gen(seqs[i].begin() + prompt, seqs[i].end());
        sc.n++;
        if (t.kind == "prosqa") {
            size_t end = std::find(gen.begin(), gen.end(), t.vocab.eos) - gen.begin();
            sc.correct += prosqa_correct(prosqa_detokenize(t.vocab, gen.data(), (int)end), t.prosqa.test_answers[i]);
            continue;
        }
        sc.correct += arith_correct(t.vocab, gen, t.arith.test_answers[i]);
        if (t.arith.s.chain) sc.valid_chains += arith_chain_quality(t.vocab, seqs[i], t.arith.s.p).all_valid;
    }
    return sc;
}

// Mean masked loss over a set of sequences (validation loss).
static double mean_loss(Model* m, const std::vector<Sequence>& seqs, int T, int pad, int limit) {
    int n = std::min((int)seqs.size(), limit > 0 ? limit : (int)seqs.size());
    double total = 0, count = 0;
    Batch batch;
    std::vector<int> idx;
    for (int start = 0; start < n; start += m->B) {
        int B = std::min(m->B, n - start);
        idx.resize(B);
        for (int b = 0; b < B; b++) idx[b] = start + b;
        make_batch(seqs, idx.data(), B, T, pad, &batch);
        float loss = model_forward(m, batch.tokens.data(), batch.targets.data(), batch.mask.data(), B, T);
        double w = 0;
        for (float x : batch.mask) w += x;
        total += loss * w;
        count += w;
    }
    return count > 0 ? total / count : 0;
}

// ===========================================================================
// ./lime train
// ===========================================================================

static const std::vector<FlagSpec> SHAPE_FLAGS = {
    {"arch", "lime", "llama or lime"},
    {"layers", "4", "L, transformer layers"},
    {"dim", "32", "d, model width"},
    {"heads", "4", "H, query heads"},
    {"kv-heads", "", "R, key/value heads (default: --heads, full attention)"},
    {"ffn", "", "F, SwiGLU hidden size (default: 3 * dim)"},
    {"router", "static", "lime's router: static (Eq. 2), average, last-J or first-J (paper Table 7)"},
    {"router-kv", "shared", "lime: one router for keys and values (shared) or one each (separate)"},
};


static Config shape_from_args(Args& a) {
    Config c;
    std::string arch = a.choice("arch", {"llama", "lime"});
    arch_parse(arch, &c.arch);
    c.L = (int)a.integer("layers", 1, 256);
    c.d = (int)a.integer("dim", 2, 65536);
    c.H = (int)a.integer("heads", 1, 1024);
    c.R = a.has("kv-heads") ? (int)a.integer("kv-heads", 1, 1024) : c.H;
    c.F = a.has("ffn") ? (int)a.integer("ffn", 1, 1 << 20) : 3 * c.d;
    c.hd = c.d / c.H;
    if (!router_parse(a.str("router"), &c))
        a.fail("--router '" + a.str("router") + "' is not one of static|average|last-J|first-J (J: layers, e.g. last-2)");
    c.router_kv_separate = a.choice("router-kv", {"shared", "separate"}) == "separate";
    if (c.arch == ARCH_LLAMA && (a.has("router") || a.has("router-kv")))
        a.fail("--router and --router-kv are for --arch lime: llama has no router");
    return c;
}

static const char* TRAIN_HELP =
    "Trains one model (LLaMa or LIMe) on a task; writes DIR/model.safetensors at the end,\n"
    "DIR/checkpoint.safetensors on the way (for --resume) and DIR/log.jsonl (every number printed).";

static std::vector<FlagSpec> train_flags() {
    return concat({SHAPE_FLAGS, TASK_FLAGS, {
        {"seq-len", "128", "text: T, positions per window (arith: from the data)"},
        {"batch", "64", "B, sequences per step"},
        {"steps", "", "optimiser steps (default: from --epochs)"},
        {"epochs", "15", "passes over the training set (when --steps is not given)"},
        {"lr", "1e-3", "learning rate of matrices, embedding and gains"},
        {"router-lr", "1e-2", "learning rate of the LIMe routers"},
        {"weight-decay", "0.1", "AdamW weight decay of the matrices"},
        {"grad-clip", "1.0", "global gradient-norm clip (0: off)"},
        {"warmup", "", "linear warmup steps (default: 2% of steps)"},
        {"schedule", "linear", "decay after warmup: linear, cosine or constant"},
        {"min-lr-ratio", "1e-6", "floor of the schedule factor"},
        {"seed", "1", "initialisation and data order"},
        {"threads", "0", "OpenMP threads (0: all cores)"},
        {"device", "auto", "auto, cpu or gpu"},
        {"tf32", "1", "gpu: TF32 tensor cores for the matrix products (0: plain float32)"},
        ATTENTION_FLAG,
        {"graph", "1", "gpu: replay each training step as one CUDA graph (0: plain launches)"},
        {"out", "runs/model", "output directory (created if missing)"},
        {"resume", "", "continue from a checkpoint written by train"},
        {"log-every", "", "steps between progress lines (default: ~50 lines per run)"},
        {"eval-every", "", "steps between evaluations (default: ~5 per run)"},
        {"eval-size", "200", "test examples scored at each periodic evaluation"},
        {"save-every", "", "steps between checkpoints (default: at each evaluation)"},
        {"stop-after", "0", "stop after this many steps of this run, saving a checkpoint (0: run to the end)"},
        {"skip-bad-steps", nullptr, "skip a step whose loss or gradient is NaN or Inf (default: stop training there)"},
        {"quiet", nullptr, "print only the final result"},
    }});
}

struct TrainSettings {
    AdamWConfig opt;
    int B = 0, steps = 0, warmup = 0, log_every = 0, eval_every = 0, save_every = 0, eval_size = 0, stop_after = 0;
    Schedule sched = SCHED_LINEAR;
    float min_lr_ratio = 1e-6f;
    uint64_t seed = 1;
};


struct Logger {
    FILE* f = nullptr;
    bool quiet = false;
    void line(const std::string& json) { if (f) { fprintf(f, "%s\n", json.c_str()); fflush(f); } }
};

static void evaluate(Model* m, const Task& t, int step, int eval_size, Logger* log, double* val_loss, double* acc) {
    *val_loss = mean_loss(m, *t.test, t.T, t.vocab.pad, eval_size);
    std::string msg = "eval step " + std::to_string(step) + " | val loss " + fmt("%.4f", *val_loss);
    std::string json = "{\"type\": \"eval\", \"step\": " + std::to_string(step) + ", \"val_loss\": " + json_num(*val_loss);
    *acc = -1;
    if (t.kind != "text") {
        Score sc = score_answers(m, t, eval_size);
        *acc = sc.accuracy();
        msg += " | accuracy " + fmt("%.1f%%", 100 * *acc) + " of " + std::to_string(sc.n);
        json += ", \"accuracy\": " + json_num(*acc) + ", \"n\": " + std::to_string(sc.n);
    } else {
        msg += " | perplexity " + fmt("%.3f", std::exp(*val_loss));
        json += ", \"perplexity\": " + json_num(std::exp(*val_loss));
    }
    if (!log->quiet) printf("%s\n", msg.c_str());
    log->line(json + "}");
}

// Flags that are each in range but do not go together. `user` holds the
// flags given on this command line (a resumed run adds its saved ones).
static void check_train_combinations(Args& a, const std::set<std::string>& user, const TrainSettings& s, const std::string& task) {
    if (user.count("steps") && user.count("epochs")) a.fail("--steps and --epochs both set the run's length; give one of them");
    if (s.warmup > s.steps)
        a.fail("--warmup " + std::to_string(s.warmup) + " is longer than the run (" + std::to_string(s.steps) +
               " steps): the learning rate would never reach --lr; use at most " + std::to_string(s.steps));
    if (task == "text" && a.number("val-frac", 0.0, 0.9) == 0.0)
        a.fail("--val-frac 0 leaves no validation text to evaluate on; use e.g. 0.1");
}

// A resumed run keeps its task: another --ops or --train-size would quietly
// train the rest of the run on other data. (--lr, --steps and the reporting
// flags may change; the shape flags are checked against the checkpoint.)
static void refuse_task_change(const Args& a, const std::map<std::string, std::string>& saved) {
    for (const FlagSpec& f : TASK_FLAGS) {
        auto it = saved.find(f.name);
        if (a.has(f.name) && it != saved.end() && a.str(f.name) != it->second)
            die("train", std::string("--") + f.name + " " + a.str(f.name) + " differs from the run being resumed (" + it->second +
                             "): a resumed run keeps its task; start a new run to change it");
    }
}

// --- training guards ---------------------------------------------------------
// SIGINT (Ctrl-C) and SIGTERM only set this flag; the loop finishes its step,
// saves a checkpoint and exits. SA_RESETHAND: a second signal kills at once.
static volatile sig_atomic_t g_stop_signal = 0;
static void on_stop_signal(int sig) { g_stop_signal = sig; }
static void catch_stop_signals(bool on) {
    struct sigaction sa = {};
    sa.sa_handler = on ? on_stop_signal : SIG_DFL;
    sa.sa_flags = SA_RESETHAND | SA_RESTART;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
}

// Fault injection for tests/test_faults.sh: LIME_TEST_NAN_STEP=N puts an Inf
// in the loss mask of step N's batch, as a corrupt batch would, which makes
// that step's loss and every gradient NaN. Unset: never.
static int test_nan_step() {
    const char* v = getenv("LIME_TEST_NAN_STEP");
    return v ? atoi(v) : 0;
}

// "NaN", "Inf", "-Inf" or the number: how the guards print a loss or a norm.
static std::string num_str(double x) { return std::isnan(x) ? "NaN" : std::isinf(x) ? (x > 0 ? "Inf" : "-Inf") : fmt("%g", x); }

// --skip-bad-steps: forward and backward, then the update only when the loss
// and every gradient are finite (model_train_step would apply the update
// before anyone could look). "" when the step was applied, else why not.
// On the GPU the check copies the model to the host: a cost of the switch.
static std::string guarded_step(Model* m, const Batch& b, const AdamWConfig& opt, float factor) {
    float loss = model_forward(m, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T);
    model_backward(m);
    std::string tensor = model_first_nonfinite(m, false);
    if (std::isfinite(loss) && tensor.empty()) {
        model_update(m, opt, factor);
        return "";
    }
    return "the loss is " + num_str(loss) + (tensor.empty() ? "" : " and the gradient of " + tensor + " is not finite");
}

// A NaN or an Inf: stop without saving, one line that names the step, the
// first bad tensor and the checkpoint that is still good. Exit status 1.
static void training_failed(Logger* log, const std::string& what, int step, int last_good, int last_saved, const std::string& out) {
    std::string when = last_good == step - 1 ? "step " + std::to_string(step)
                                              : "between steps " + std::to_string(last_good + 1) + " and " + std::to_string(step) +
                                                    " (checked at log steps; --log-every 1 finds the step)";
    std::string kept = last_saved > 0 ? out + "/checkpoint.safetensors (step " + std::to_string(last_saved) + ") is the last good checkpoint"
                                      : "no checkpoint was saved yet";
    std::string msg = when + ": " + what + "; stopped without saving: " + kept + "; lower --lr, or pass --skip-bad-steps to skip such steps";
    log->line("{\"type\": \"error\", \"step\": " + std::to_string(step) + ", \"message\": " + json_quote(msg) + "}");
    fflush(stdout);
    fprintf(stderr, "lime train: error: %s\n", msg.c_str());
    exit(1);
}

static int cmd_train(int argc, char** argv) {
    std::vector<FlagSpec> flags = train_flags();
    Args a = parse_args("train", TRAIN_HELP, flags, argc, argv, false);
    const std::set<std::string> user_flags = a.given;  // before a resumed run adds its own
    // Resuming: the checkpoint's own flags, with the ones given now on top.
    std::map<std::string, std::string> resumed_meta;
    Config resumed;
    if (a.has("resume")) {
        std::string err = checkpoint_read_config(a.str("resume"), &resumed, &resumed_meta);
        if (!err.empty()) die("train", err);
        std::map<std::string, std::string> saved;
        if (!resumed_meta.count("args") || !settings_from_json(resumed_meta["args"], &saved).empty())
            die("train", a.str("resume") + " was not written by ./lime train (no training arguments in it); it can be loaded by eval, not resumed");
        refuse_task_change(a, saved);
        for (auto& kv : saved)
            if (!a.has(kv.first) && kv.first != "resume") { a.values[kv.first] = {kv.second}; a.given.insert(kv.first); }
    }
    set_threads(a);
    Device dev = pick_device(a);
    gpu_set_tf32(a.integer("tf32", 0, 1) == 1);
    set_attention(a);
    bool use_graph = a.integer("graph", 0, 1) == 1;
    Config c = shape_from_args(a);
    std::map<std::string, std::string> ts = task_settings(a);
    int text_T = (int)a.integer("seq-len", 2, 1 << 16);
    TrainSettings s;
    s.B = (int)a.integer("batch", 1, 1 << 20);
    s.opt.lr = (float)a.number("lr", 0, 10);
    s.opt.router_lr = (float)a.number("router-lr", 0, 10);
    s.opt.weight_decay = (float)a.number("weight-decay", 0, 10);
    s.opt.grad_clip = (float)a.number("grad-clip", 0, 1e9);
    std::string sched = a.choice("schedule", {"linear", "cosine", "constant"});
    s.sched = sched == "linear" ? SCHED_LINEAR : sched == "cosine" ? SCHED_COSINE : SCHED_CONSTANT;
    s.min_lr_ratio = (float)a.number("min-lr-ratio", 0, 1);
    s.seed = (uint64_t)a.integer("seed", 0, (long long)1 << 62);
    s.eval_size = (int)a.integer("eval-size", 1, 1 << 30);
    s.stop_after = (int)a.integer("stop-after", 0, 1 << 30);
    std::string out = a.str("out");
    if (out.empty()) a.fail("--out needs a directory");
    if (!a.err.empty()) die("train", a.err);
    Config shape = c;  // the task sets V and T below; check the rest now
    shape.V = shape.T = 1;
    std::string err = config_check(shape);
    if (!err.empty()) die("train", err);

    Task task;
    err = task_build(ts, text_T, &task);
    if (!err.empty()) die("train", err);
    c.V = task.vocab.size();
    c.T = task.T;
    int per_epoch = std::max(1, (int)((task.train->size() + s.B - 1) / s.B));
    if (a.has("steps")) s.steps = (int)a.integer("steps", 1, 1 << 30);
    else s.steps = (int)a.integer("epochs", 1, 1 << 20) * per_epoch;
    s.warmup = a.has("warmup") ? (int)a.integer("warmup", 0, 1 << 30) : s.steps / 50;
    s.log_every = a.has("log-every") ? (int)a.integer("log-every", 1, 1 << 30) : std::max(1, s.steps / 50);
    s.eval_every = a.has("eval-every") ? (int)a.integer("eval-every", 1, 1 << 30) : std::max(1, s.steps / 5);
    s.save_every = a.has("save-every") ? (int)a.integer("save-every", 1, 1 << 30) : s.eval_every;
    check_train_combinations(a, user_flags, s, ts["task"]);
    if (!a.err.empty()) die("train", a.err);
    bool skip_bad = a.has("skip-bad-steps");

    Model m;
    err = model_create(&m, c, s.B, dev);
    if (!err.empty()) die("train", err);
    m.use_graph = use_graph;
    Loader loader;
    int start_step = 0;
    if (a.has("resume")) {
        if (config_to_json(resumed) != config_to_json(c))
            die("train", "--resume " + a.str("resume") + " holds a different model than these flags describe (" + config_diff(resumed, c) +
                             ", in the file vs the flags); drop the shape flags or start a new run");
        err = model_load(&m, a.str("resume"), true);
        if (!err.empty()) die("train", err);
        // the loop's step; m.step counts the updates applied, fewer when steps were skipped
        start_step = resumed_meta.count("train_step") ? atoi(resumed_meta["train_step"].c_str()) : m.step;
        loader.start(task.train, s.seed, atoi(resumed_meta["data_epoch"].c_str()), strtoull(resumed_meta["data_pos"].c_str(), nullptr, 10));
    } else {
        model_init(&m, s.seed);
        loader.start(task.train, s.seed, 0, 0);
    }

    // everything that rebuilds this run, stored in each checkpoint
    std::map<std::string, std::string> saved_args;
    for (const FlagSpec& f : flags)
        if (f.def && a.has(f.name) && std::string(f.name) != "resume" && std::string(f.name) != "stop-after") saved_args[f.name] = a.str(f.name);
    for (auto& kv : ts) saved_args[kv.first] = kv.second;
    saved_args["steps"] = std::to_string(s.steps);
    saved_args["batch"] = std::to_string(s.B);
    saved_args["seed"] = std::to_string(s.seed);
    int done_step = start_step;  // the last step taken, for the metadata
    auto meta = [&]() {
        std::map<std::string, std::string> mt;
        mt["train_step"] = std::to_string(done_step);
        mt["task"] = settings_to_json(task.settings);
        mt["vocab"] = vocab_to_json(task.vocab);
        mt["args"] = settings_to_json(saved_args);
        mt["data_epoch"] = std::to_string(loader.epoch);
        mt["data_pos"] = std::to_string(loader.pos);
        return mt;
    };

    // only now, when every check has passed, does the run write anything
    if (!make_dir(out, &err)) die("train", err + " (choose another --out)");
    Logger log;
    log.quiet = a.has("quiet");
    std::string log_path = out + "/log.jsonl";
    log.f = fopen(log_path.c_str(), start_step > 0 ? "a" : "w");
    if (!log.f) die("train", "cannot write " + log_path + ": " + strerror(errno));
    if (!log.quiet) {
        printf("train %s on %s: L=%d d=%d H=%d R=%d F=%d V=%d T=%d, %zu parameters, %s, batch %d, %d steps (%d per epoch)%s\n",
               model_name(c).c_str(), ts["task"].c_str(), c.L, c.d, c.H, c.R, c.F, c.V, c.T, m.n_params,
               dev == DEVICE_GPU ? "gpu" : "cpu", s.B, s.steps, per_epoch,
               start_step ? (", resuming at step " + std::to_string(start_step)).c_str() : "");
    }
    log.line("{\"type\": \"config\", \"arch\": \"" + std::string(arch_name(c.arch)) + "\", \"params\": " + std::to_string(m.n_params) +
             ", \"config\": " + config_to_json(c) + ", \"args\": " + settings_to_json(saved_args) + "}");

    Batch batch;
    double t_start = now_ms(), t_last = t_start;
    int steps_timed = 0, run_steps = 0;
    int last_good = start_step, last_saved = start_step, skipped_in_a_row = 0, nan_step = test_nan_step();
    double val_loss = 0, acc = -1;
    catch_stop_signals(true);
    for (int step = start_step + 1; step <= s.steps; step++) {
        loader.next(s.B, c.T, task.vocab.pad, &batch);
        if (step == nan_step) batch.mask[0] = INFINITY;
        float factor = lr_factor(step, s.warmup, s.steps, s.sched, s.min_lr_ratio);
        std::string skipped;  // why this step was skipped (--skip-bad-steps), else ""
        if (skip_bad) skipped = guarded_step(&m, batch, s.opt, factor);
        else model_train_step(&m, batch.tokens.data(), batch.targets.data(), batch.mask.data(), s.B, c.T, s.opt, factor);
        done_step = step;
        steps_timed++;
        run_steps++;
        int stop_signal = g_stop_signal;
        bool last = step == s.steps || (s.stop_after && run_steps == s.stop_after);
        bool logging = step % s.log_every == 0 || last || step == start_step + 1;
        bool saving = step % s.save_every == 0 || last || stop_signal;
        if (!skipped.empty()) {
            if (!log.quiet) printf("step %d/%d skipped: %s\n", step, s.steps, skipped.c_str());
            log.line("{\"type\": \"skipped\", \"step\": " + std::to_string(step) + ", \"why\": " + json_quote(skipped) + "}");
            if (++skipped_in_a_row == 20) training_failed(&log, "20 steps in a row were skipped, the last because " + skipped, step, step - 1, last_saved, out);
            logging = false;
            last_good = step;  // the weights did not change
        } else {
            skipped_in_a_row = 0;
        }
        // The guard: never log, evaluate or save a model past a NaN or an Inf.
        // Reading the metrics is free on the CPU, so every step is checked; on
        // the GPU it waits for the device, so only steps that log or save are.
        float loss = 0, norm = 0;
        if (skipped.empty() && (logging || saving || m.device == DEVICE_CPU)) {
            model_metrics(&m, &loss, &norm);
            if (!std::isfinite(loss) || !std::isfinite(norm)) {
                std::string tensor = model_first_nonfinite(&m, false);
                training_failed(&log, "the loss is " + num_str(loss) + " and the gradient norm " + num_str(norm) +
                                          (tensor.empty() ? "" : "; the first non-finite gradient is in " + tensor),
                                step, last_good, last_saved, out);
            }
            last_good = step;
        }
        if (logging) {
            double t = now_ms(), ms = (t - t_last) / steps_timed;
            double tok_s = (double)s.B * c.T / (ms / 1000);
            double eta = ms * (s.steps - step) / 1000;
            if (!log.quiet)
                printf("step %d/%d | loss %.4f | lr %.2e | norm %.3f | %.1f ms/step | %.0f tok/s | ETA %s\n", step, s.steps, loss,
                       s.opt.lr * factor, norm, ms, tok_s, duration_str(eta).c_str());
            log.line("{\"type\": \"train\", \"step\": " + std::to_string(step) + ", \"loss\": " + json_num(loss) + ", \"lr\": " +
                     json_num(s.opt.lr * factor) + ", \"norm\": " + json_num(norm) + ", \"ms_per_step\": " + json_num(ms) +
                     ", \"tokens_per_s\": " + json_num(tok_s) + "}");
            fflush(stdout);
            t_last = t;
            steps_timed = 0;
        }
        if (step % s.eval_every == 0 && !last && !stop_signal) { evaluate(&m, task, step, s.eval_size, &log, &val_loss, &acc); t_last = now_ms(); }
        if (saving) {
            std::string tensor = model_first_nonfinite(&m, true);  // the weights too: a NaN model is never saved
            if (!tensor.empty()) training_failed(&log, "the weights of " + tensor + " are not finite", step, last_good, last_saved, out);
            err = model_save(&m, out + "/checkpoint.safetensors", meta(), true);
            if (!err.empty()) die("train", err);
            last_saved = step;
            t_last = now_ms();
        }
        if (stop_signal) {
            printf("%s at step %d: saved %s/checkpoint.safetensors; continue with ./lime train --resume %s/checkpoint.safetensors\n",
                   stop_signal == SIGINT ? "interrupted (SIGINT)" : "terminated (SIGTERM)", step, out.c_str(), out.c_str());
            log.line("{\"type\": \"interrupted\", \"step\": " + std::to_string(step) + ", \"signal\": " + std::to_string(stop_signal) + "}");
            fclose(log.f);
            model_free(&m);
            return 128 + stop_signal;  // the shell's convention for "ended by this signal"
        }
        if (last && step != s.steps) {
            printf("stopped after %d steps of this run at step %d; continue with ./lime train --resume %s/checkpoint.safetensors\n",
                   run_steps, step, out.c_str());
            fclose(log.f);
            model_free(&m);
            return 0;
        }
    }
    catch_stop_signals(false);  // the final save and evaluation: a signal ends them at once (the save is atomic)
    double seconds = (now_ms() - t_start) / 1000;
    err = model_save(&m, out + "/model.safetensors", meta(), false);
    if (!err.empty()) die("train", err);
    evaluate(&m, task, s.steps, task.kind != "text" ? 0 : s.eval_size, &log, &val_loss, &acc);
    printf("done: %s, %d steps in %s, val loss %.4f", model_name(c).c_str(), s.steps - start_step, duration_str(seconds).c_str(), val_loss);
    if (acc >= 0) printf(", accuracy %.1f%%", 100 * acc);
    printf("; wrote %s/model.safetensors\n", out.c_str());
    log.line("{\"type\": \"done\", \"seconds\": " + json_num(seconds) + ", \"val_loss\": " + json_num(val_loss) +
             (acc >= 0 ? ", \"accuracy\": " + json_num(acc) : std::string()) + "}");
    fclose(log.f);
    model_free(&m);
    return 0;
}

// ===========================================================================
// Loading a trained model with its task (eval, sample)
// ===========================================================================

struct Loaded {
    Model m;
    Task task;
    std::map<std::string, std::string> meta;
};

static std::string load_checkpoint(const std::string& path, Device dev, int B, Loaded* out, bool need_task) {
    Config c;
    std::string err = checkpoint_read_config(path, &c, &out->meta);
    if (!err.empty()) return err;
    err = model_create(&out->m, c, B, dev);
    if (!err.empty()) return err;
    err = model_load(&out->m, path, false);
    if (!err.empty()) return err;
    std::map<std::string, std::string> ts;
    if (!out->meta.count("task") || !settings_from_json(out->meta["task"], &ts).empty())
        return path + ": no task settings in the metadata; was it written by ./lime train?";
    if (need_task) {
        err = task_build(ts, c.T, &out->task);
        if (!err.empty()) return path + ": rebuilding its task: " + err;
        if (out->task.vocab.size() != c.V)
            return path + ": its task has " + std::to_string(out->task.vocab.size()) + " tokens but the model " + std::to_string(c.V);
    } else {
        out->task.kind = ts["task"];
        out->task.settings = ts;
        out->task.vocab = ts["task"] == "text" ? text_vocab() : ts["task"] == "prosqa" ? prosqa_vocab() : arith_vocab(atoi(ts["modulus"].c_str()));
    }
    return "";
}

static int cmd_eval(int argc, char** argv) {
    std::vector<FlagSpec> flags = {
        {"load", "", "a checkpoint (repeat --load to compare models side by side)"},
        {"n", "0", "score only the first N test examples (0: all)"},
        {"batch", "128", "sequences per forward"},
        {"json", nullptr, "print one JSON object"},
        {"threads", "0", "OpenMP threads (0: all cores)"},
        {"device", "auto", "auto, cpu or gpu"},
        {"tf32", "1", "gpu: TF32 tensor cores for the matrix products (0: plain float32)"},
        ATTENTION_FLAG,
    };
    Args a = parse_args("eval", "Scores checkpoints on their task: arith accuracy by greedy decoding, text loss and perplexity.", flags, argc,
                        argv, false);
    set_threads(a);
    Device dev = pick_device(a);
    gpu_set_tf32(a.integer("tf32", 0, 1) == 1);
    set_attention(a);
    int n = (int)a.integer("n", 0, 1 << 30);
    int B = (int)a.integer("batch", 1, 1 << 16);
    if (!a.err.empty()) die("eval", a.err);
    if (!a.has("load")) die("eval", "needs --load FILE (a model.safetensors written by ./lime train)");
    std::string json = "{";
    std::vector<std::string> rows;
    for (const std::string& path : a.values["load"]) {
        Loaded ld;
        std::string err = load_checkpoint(path, dev, B, &ld, true);
        if (err.size()) die("eval", err);
        const Config& c = ld.m.c;
        std::string name = model_name(c);  // "lime", or with its router variant: "lime:last-2"
        std::string entry = "\"file\": " + json_quote(path) + ", \"arch\": \"" + arch_name(c.arch) + "\", \"model\": " + json_quote(name) +
                            ", \"task\": " + json_quote(ld.task.kind);
        double loss = mean_loss(&ld.m, *ld.task.test, ld.task.T, ld.task.vocab.pad, n);
        entry += ", \"loss\": " + json_num(loss);
        char row[512];
        if (ld.task.kind == "prosqa") {
            Score sc = score_answers(&ld.m, ld.task, n);
            entry += ", \"accuracy\": " + json_num(sc.accuracy()) + ", \"n\": " + std::to_string(sc.n);
            snprintf(row, sizeof row, "%-6s %-40s prosqa accuracy %6.2f%% (%d/%d)  test loss %.4f", name.c_str(), path.c_str(),
                     100 * sc.accuracy(), sc.correct, sc.n, loss);
        } else if (ld.task.kind == "arith") {
            Score sc = score_answers(&ld.m, ld.task, n);
            entry += ", \"ops\": " + ld.task.settings["ops"] + ", \"accuracy\": " + json_num(sc.accuracy()) + ", \"n\": " +
                     std::to_string(sc.n);
            if (ld.task.arith.s.chain) entry += ", \"valid_chains\": " + json_num((double)sc.valid_chains / std::max(1, sc.n));
            snprintf(row, sizeof row, "%-6s %-40s tier %-3s accuracy %6.2f%% (%d/%d)  valid chains %6.2f%%  test loss %.4f", name.c_str(),
                     path.c_str(), ld.task.settings["ops"].c_str(), 100 * sc.accuracy(), sc.correct, sc.n,
                     100.0 * sc.valid_chains / std::max(1, sc.n), loss);
        } else {
            entry += ", \"perplexity\": " + json_num(std::exp(loss));
            snprintf(row, sizeof row, "%-6s %-40s val loss %.4f  perplexity %.3f", name.c_str(), path.c_str(), loss, std::exp(loss));
        }
        rows.push_back(row);
        json += (json.size() > 1 ? ", " : "") + json_quote(path) + ": {" + entry + "}";
        model_free(&ld.m);
    }
    if (a.has("json")) {
        if (rows.size() == 1) {  // one model: its object alone
            size_t colon = json.find(": {");
            printf("%s\n", json.substr(colon + 2).c_str());
        } else {
            printf("%s}\n", json.c_str());
        }
    } else {
        for (const std::string& r : rows) printf("%s\n", r.c_str());
    }
    return 0;
}

static int cmd_sample(int argc, char** argv) {
    std::vector<FlagSpec> flags = {
        {"load", "", "a checkpoint written by ./lime train"},
        {"prompt", "", "the text to continue, in the task's tokens, e.g. \"3 + 4 * 2 =\""},
        {"max-new", "100", "at most this many new tokens"},
        {"temperature", "0", "0: greedy; > 0: sample from softmax(logits / temperature)"},
        {"seed", "1", "for sampling"},
        {"threads", "0", "OpenMP threads (0: all cores)"},
        {"device", "auto", "auto, cpu or gpu"},
    };
    Args a = parse_args("sample", "Continues a prompt with a trained model until <eos>; the continuation is the last line.", flags, argc, argv,
                        false);
    set_threads(a);
    Device dev = pick_device(a);
    int max_new = (int)a.integer("max-new", 1, 1 << 20);
    float temperature = (float)a.number("temperature", 0, 100);
    Rng rng((uint64_t)a.integer("seed", 0, (long long)1 << 62));
    if (!a.err.empty()) die("sample", a.err);
    if (!a.has("load")) die("sample", "needs --load FILE (a model.safetensors written by ./lime train)");
    if (!a.has("prompt")) die("sample", "needs --prompt TEXT, e.g. --prompt \"3 + 4 * 2 =\"");
    Loaded ld;
    std::string err = load_checkpoint(a.str("load"), dev, 1, &ld, false);
    if (!err.empty()) die("sample", err);
    std::vector<std::vector<int>> seqs(1);
    err = ld.task.kind == "prosqa" ? prosqa_tokenize(ld.task.vocab, a.str("prompt"), &seqs[0]) : ld.task.vocab.encode(a.str("prompt"), &seqs[0]);
    if (!err.empty()) die("sample", "--prompt: " + err);
    if (seqs[0].empty()) die("sample", "--prompt is empty");
    if ((int)seqs[0].size() > ld.m.c.T)
        die("sample", "--prompt has " + std::to_string(seqs[0].size()) + " tokens; the model reads at most " + std::to_string(ld.m.c.T));
    size_t prompt = seqs[0].size();
    generate(&ld.m, ld.task.vocab, &seqs, max_new, temperature, &rng);
    std::vector<int> gen(seqs[0].begin() + prompt, seqs[0].end());
    if (!gen.empty() && gen.back() == ld.task.vocab.eos) gen.pop_back();
    std::string text = ld.task.kind == "prosqa" ? prosqa_detokenize(ld.task.vocab, gen.data(), (int)gen.size())
                                                : ld.task.vocab.decode(gen.data(), (int)gen.size());
    printf("%s\n", text.c_str());
    model_free(&ld.m);
    return 0;
}

static int cmd_data(int argc, char** argv) {
    std::vector<FlagSpec> flags = concat({TASK_FLAGS, {
        {"split", "train", "train or test"},
        {"n", "10", "how many examples to print"},
        {"seq-len", "128", "text: T, positions per window"},
    }});
    Args a = parse_args("data", "Prints generated examples, one per line, exactly as the model sees them.", flags, argc, argv, false);
    std::map<std::string, std::string> ts = task_settings(a);
    std::string split = a.choice("split", {"train", "test"});
    int n = (int)a.integer("n", 0, 1 << 30);
    int T = (int)a.integer("seq-len", 2, 1 << 16);
    if (!a.err.empty()) die("data", a.err);
    Task t;
    std::string err = task_build(ts, T, &t);
    if (!err.empty()) die("data", err);
    const std::vector<Sequence>& seqs = split == "train" ? *t.train : *t.test;
    for (int i = 0; i < n && i < (int)seqs.size(); i++)
        printf("%s\n", t.kind == "prosqa" ? prosqa_detokenize(t.vocab, seqs[i].tokens.data(), (int)seqs[i].tokens.size()).c_str()
                                        : t.vocab.decode(seqs[i].tokens.data(), (int)seqs[i].tokens.size()).c_str());
    return 0;
}

// ===========================================================================
// ./lime verify: the implementation against reference vectors (SPEC.md)
// ===========================================================================

struct Verifier {
    int failed = 0, checked = 0;
    bool quiet = false;
    void check(const std::string& what, const float* got, const float* want, size_t n, double tol) {
        double num = 0, den = 0;
        for (size_t i = 0; i < n; i++) {
            double diff = (double)got[i] - want[i];
            num += diff * diff;
            den += (double)want[i] * want[i];
        }
        double err = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
        bool ok = err < tol;  // a NaN fails too
        checked++;
        if (!ok) failed++;
        if (!quiet || !ok) printf("  %-4s %-62s rel err %.2e  tol %.0e\n", ok ? "ok" : "FAIL", what.c_str(), err, tol);
    }
};

static std::string meta_float(const std::map<std::string, std::string>& meta, const char* key, float* out) {
    auto it = meta.find(key);
    if (it == meta.end()) return std::string("no \"") + key + "\" in the metadata";
    char* end = nullptr;
    *out = strtof(it->second.c_str(), &end);
    if (*end) return std::string("metadata \"") + key + "\" is not a number";
    return "";
}

static std::string verify_file(const std::string& path, Device dev, bool tf32, Verifier* v) {
    SafeTensors st;
    std::string err = st_read(path, &st);
    if (!err.empty()) return err;
    Config c;
    std::map<std::string, std::string> meta;
    err = checkpoint_read_config(path, &c, &meta);
    if (!err.empty()) return err;
    const StTensor* tk = st.find("batch.tokens");
    if (!tk || tk->shape.size() != 2) return path + ": no batch.tokens [B, T]; is it a reference-vector file?";
    int B = (int)tk->shape[0], T = (int)tk->shape[1];
    std::vector<int> tokens(B * T), targets(B * T);
    std::vector<float> mask(B * T), want_loss(1), losses(3);
    err = st_get_i32(st, "batch.tokens", {B, T}, tokens.data());
    if (err.empty()) err = st_get_i32(st, "batch.targets", {B, T}, targets.data());
    if (err.empty()) err = st_get_f32(st, "batch.mask", {B, T}, mask.data());
    if (err.empty()) err = st_get_f32(st, "expect.loss", {1}, want_loss.data());
    if (err.empty()) err = st_get_f32(st, "expect.losses", {3}, losses.data());
    for (int i = 0; i < B * T && err.empty(); i++)
        if (tokens[i] < 0 || tokens[i] >= c.V || targets[i] < 0 || targets[i] >= c.V) err = path + ": a token id is outside the vocabulary";
    if (!err.empty()) return err;
    AdamWConfig opt;
    for (auto [key, dst] : std::vector<std::pair<const char*, float*>>{{"lr", &opt.lr}, {"router_lr", &opt.router_lr},
                                                                     {"weight_decay", &opt.weight_decay}, {"beta1", &opt.beta1},
                                                                     {"beta2", &opt.beta2}, {"eps", &opt.eps}, {"grad_clip", &opt.grad_clip}}) {
        err = meta_float(meta, key, dst);
        if (!err.empty()) return path + ": " + err;
    }
    gpu_set_tf32(tf32);
    // TF32 (SPEC.md): logits, losses and gradients at 1e-2; updated weights not checked
    double tol_fwd = tf32 ? 1e-2 : 1e-5, tol_grad = tf32 ? 1e-2 : 1e-4;
    Model m;
    err = model_create(&m, c, B, dev);
    if (!err.empty()) return err;
    err = model_load(&m, path, false);
    if (!err.empty()) { model_free(&m); return err; }
    printf("%s: %s, B=%d T=%d, %s%s\n", path.c_str(), arch_name(c.arch), B, T,
           dev == DEVICE_GPU ? (std::string("gpu, ") + model_attention_name(&m) + " attention").c_str() : "cpu", tf32 ? " (tf32)" : "");
    std::vector<float> want(0);
    auto expect = [&](const std::string& name, const std::vector<int64_t>& shape) {
        size_t n = 1;
        for (int64_t s : shape) n *= (size_t)s;
        want.assign(n, 0);
        return st_get_f32(st, name, shape, want.data());
    };
    float loss = model_forward(&m, tokens.data(), targets.data(), mask.data(), B, T);
    if (!(err = expect("expect.logits", {B, T, c.V})).empty()) { model_free(&m); return err; }
    v->check("logits", model_logits(&m), want.data(), want.size(), tol_fwd);
    v->check("loss", &loss, want_loss.data(), 1, tol_fwd);
    model_backward(&m);
    model_to_host(&m);
    auto check_all = [&](const std::string& prefix, const float* base, double tol) {
        for (const TensorSpec& t : m.specs) {
            std::vector<int64_t> shape(t.shape.begin(), t.shape.end());
            err = expect(prefix + t.name, shape);
            if (!err.empty()) return err;
            v->check(prefix + t.name, base + t.offset, want.data(), t.numel, tol);
        }
        return std::string();
    };
    if (!(err = check_all("expect.grad.", m.grads, tol_grad)).empty()) { model_free(&m); return err; }
    float got_losses[3];
    for (int step = 1; step <= 3; step++) {
        if (step > 1) { got_losses[step - 1] = model_forward(&m, tokens.data(), targets.data(), mask.data(), B, T); model_backward(&m); }
        else got_losses[0] = loss;
        model_update(&m, opt, 1.0f);
        model_to_host(&m);
        if (!tf32 && (step == 1 || step == 3))
            if (!(err = check_all("expect.step" + std::to_string(step) + ".", m.params, tol_grad)).empty()) { model_free(&m); return err; }
    }
    v->check("losses (before each of 3 steps)", got_losses, losses.data(), 3, tol_fwd);
    model_free(&m);
    return "";
}

static int cmd_verify(int argc, char** argv) {
    std::vector<FlagSpec> flags = {
        {"device", "cpu", "cpu or gpu"},
        {"tf32", "0", "gpu: 1 checks with TF32 matrix products at SPEC.md's looser tolerances"},
        ATTENTION_FLAG,
        {"threads", "0", "OpenMP threads (0: all cores)"},
        {"quiet", nullptr, "print only failures and the summary"},
    };
    Args a = parse_args("verify", "Checks the implementation against reference-vector files (SPEC.md): logits, loss, every gradient,\n"
                        "three AdamW steps. usage: ./lime verify [flags] FILE...", flags, argc, argv, true);
    set_threads(a);
    std::string d = a.choice("device", {"cpu", "gpu"});
    bool tf32 = a.integer("tf32", 0, 1) == 1;
    set_attention(a);
    if (!a.err.empty()) die("verify", a.err);
    Device dev = DEVICE_CPU;
    if (d == "gpu") {
        std::string why;
        if (!gpu_available(&why)) die("verify", "--device gpu: " + why);
        dev = DEVICE_GPU;
    }
    if (a.positional.empty()) die("verify", "needs reference files, e.g. ./lime verify tests/golden/*.safetensors");
    Verifier v;
    v.quiet = a.has("quiet");
    for (const std::string& path : a.positional) {
        std::string err = verify_file(path, dev, tf32, &v);
        if (!err.empty()) { printf("  FAIL %s\n", err.c_str()); v.failed++; }
    }
    printf("verify: %d checks, %d failed\n", v.checked, v.failed);
    return v.failed ? 1 : 0;
}

// ===========================================================================
// ./lime bench: ms/step and tokens/s of llama and lime on synthetic tokens
// ===========================================================================

// printf into a std::string (several values; cli.h's fmt takes one).
static std::string bfmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
static std::string bfmt(const char* f, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, sizeof buf, f, ap);
    va_end(ap);
    return buf;
}

struct BenchResult {
    double ms = 0, tok_s = 0;
    double mfu = 0;                     // model FLOPs utilisation against the device's peak (GPU)
    double model_gb = 0, device_gb = 0; // GPU memory: the model's allocations; the device's used memory it added
    std::string attention;              // matmul or flash on the GPU, cpu on the CPU
};

static BenchResult bench_one(Config c, Arch arch, int B, int steps, Device dev, bool graph, double peak_tflops) {
    c.arch = arch;
    if (arch == ARCH_LLAMA) model_parse("llama", &c);  // no router: --router and --router-kv are lime's
    GpuInfo before, after;
    bool on_gpu = dev == DEVICE_GPU && gpu_info(&before);
    Model m;
    std::string err = model_create(&m, c, B, dev);
    if (!err.empty()) die("bench", err);
    m.use_graph = graph;
    model_init(&m, 1);
    Rng rng(7);
    std::vector<int> tokens((size_t)B * c.T), targets((size_t)B * c.T);
    std::vector<float> mask((size_t)B * c.T, 1.0f);
    for (size_t i = 0; i < tokens.size(); i++) { tokens[i] = (int)rng.below(c.V); targets[i] = (int)rng.below(c.V); }
    AdamWConfig opt;
    auto step = [&]() { model_train_step(&m, tokens.data(), targets.data(), mask.data(), B, c.T, opt, 1.0f); };
    for (int i = 0; i < 2; i++) step();  // warm up caches and threads (and capture the GPU's graph)
    model_to_host(&m);
    double t0 = now_ms();
    for (int i = 0; i < steps; i++) step();
    model_to_host(&m);  // waits for the device
    BenchResult r;
    r.ms = (now_ms() - t0) / steps;
    r.tok_s = (double)B * c.T / (r.ms / 1000);
    if (peak_tflops > 0) r.mfu = flops_per_token(c, c.T) * r.tok_s / (peak_tflops * 1e12);
    if (on_gpu && gpu_info(&after)) {  // the model's allocations, and all the device lost to it (cuBLAS, graphs included)
        r.model_gb = model_device_bytes(&m) / 1e9;
        r.device_gb = ((double)before.free_bytes - (double)after.free_bytes) / 1e9;
    }
    r.attention = model_attention_name(&m);
    model_free(&m);
    return r;
}

static int cmd_bench(int argc, char** argv) {
    std::vector<FlagSpec> flags = concat({SHAPE_FLAGS, {
        {"vocab", "21", "V, vocabulary size"},
        {"seq-len", "88", "T, positions"},
        {"batch", "128", "B, sequences per step"},
        {"steps", "20", "timed steps per model (after 2 warm-up steps)"},
        {"threads", "0", "OpenMP threads (0: all cores)"},
        {"device", "auto", "auto, cpu or gpu"},
        {"tf32", "1", "gpu: TF32 tensor cores for the matrix products (0: plain float32)"},
        ATTENTION_FLAG,
        {"graph", "1", "gpu: replay each training step as one CUDA graph (0: plain launches)"},
        {"json", nullptr, "print one JSON object"},
    }});
    Args a = parse_args("bench", "Times training steps of llama and lime on synthetic tokens; on the GPU also MFU and memory.", flags, argc,
                        argv, false);
    set_threads(a);
    Device dev = pick_device(a);
    Config c = shape_from_args(a);
    c.V = (int)a.integer("vocab", 1, 1 << 24);
    c.T = (int)a.integer("seq-len", 1, 1 << 20);
    int B = (int)a.integer("batch", 1, 1 << 20);
    int steps = (int)a.integer("steps", 1, 1 << 20);
    bool tf32 = a.integer("tf32", 0, 1) == 1, graph = a.integer("graph", 0, 1) == 1;
    set_attention(a);
    if (!a.err.empty()) die("bench", a.err);
    std::string err = config_check(c);
    if (!err.empty()) die("bench", err);
    gpu_set_tf32(tf32);
    // MFU: flops_per_token (forward + backward, router included) * tokens/s over the
    // device's dense peak for the math in use: TF32 tensor cores, or plain float32.
    GpuInfo gi;
    bool on_gpu = dev == DEVICE_GPU && gpu_info(&gi);
    double peak = on_gpu ? (tf32 ? gi.peak_tf32 : gi.peak_fp32) : 0;
    BenchResult llama = bench_one(c, ARCH_LLAMA, B, steps, dev, graph, peak);
    BenchResult lime = bench_one(c, ARCH_LIME, B, steps, dev, graph, peak);
    double ratio = lime.ms / llama.ms, mem_ratio = llama.model_gb > 0 ? lime.model_gb / llama.model_gb : 0;
    Config cl = c, cm = c;
    model_parse("llama", &cl);
    cm.arch = ARCH_LIME;
    if (a.has("json")) {
        auto one = [&](const BenchResult& r, const Config& rc) {
            std::string s = bfmt("{\"ms_per_step\": %.4f, \"tokens_per_s\": %.1f, \"flops_per_token\": %.6g", r.ms, r.tok_s, flops_per_token(rc, c.T));
            if (on_gpu)
                s += bfmt(", \"mfu\": %.5f, \"model_gb\": %.4f, \"device_gb\": %.4f, \"attention\": ", r.mfu, r.model_gb, r.device_gb) +
                     json_quote(r.attention);
            return s + "}";
        };
        std::string s = "{\"device\": \"" + std::string(dev == DEVICE_GPU ? "gpu" : "cpu") + "\"";
        if (on_gpu)
            s += ", \"gpu\": " + json_quote(gi.name) + bfmt(", \"tf32\": %d, \"graph\": %d, \"peak_tflops\": %.1f, \"peak_source\": ", tf32, graph, peak) +
                 json_quote(gi.peak_source);
        s += ", \"llama\": " + one(llama, cl) + ", \"lime\": " + one(lime, cm) + bfmt(", \"lime_over_llama\": %.4f", ratio);
        if (on_gpu) s += bfmt(", \"memory_lime_over_llama\": %.4f", mem_ratio);
        printf("%s}\n", s.c_str());
    } else {
        printf("bench %s: L=%d d=%d H=%d R=%d F=%d V=%d B=%d T=%d, %d steps, lime is %s\n", dev == DEVICE_GPU ? "gpu" : "cpu", c.L, c.d, c.H,
               c.R, c.F, c.V, B, c.T, steps, model_name(cm).c_str());
        if (on_gpu)
            printf("  %s (sm_%d%d), %s, %s; MFU against %.1f TFLOP/s (%s %s)\n", gi.name.c_str(), gi.major, gi.minor, tf32 ? "TF32" : "float32",
                   graph ? "CUDA graph" : "plain launches", peak, gi.peak_source.c_str(), tf32 ? "TF32" : "FP32");
        for (auto [name, r] : {std::make_pair("llama", llama), std::make_pair("lime", lime)}) {
            printf("  %-5s  %9.2f ms/step  %10.0f tokens/s", name, r.ms, r.tok_s);
            if (on_gpu)
                printf("  MFU %5.1f%%  memory %.3f GB (model) %.3f GB (device)  %s attention", 100 * r.mfu, r.model_gb, r.device_gb,
                       r.attention.c_str());
            printf("\n");
        }
        printf("  lime / llama step time: %.3f", ratio);
        if (on_gpu) printf(", memory: %.3f", mem_ratio);
        printf("\n");
    }
    return 0;
}

// ===========================================================================
// ./lime analyze: the router heatmap, value entropy per layer, cost
// ===========================================================================

static int cmd_analyze(int argc, char** argv) {
    std::vector<FlagSpec> flags = {
        {"load", "", "a checkpoint written by ./lime train"},
        {"alpha", "1", "order of the Renyi entropy (1: Shannon)"},
        {"n", "64", "test sequences the value entropy is averaged over"},
        {"out", "", "directory for the figures (default: the checkpoint's)"},
        {"threads", "0", "OpenMP threads (0: all cores)"},
        {"device", "auto", "auto, cpu or gpu"},
    };
    Args a = parse_args("analyze", "The router heatmap (paper Fig. 5), value entropy per layer (Sec. 5.2), parameters and FLOPs\n"
                        "of a checkpoint, with figures and a short summary.", flags, argc, argv, false);
    set_threads(a);
    Device dev = pick_device(a);
    double alpha = a.number("alpha", 0, 100);
    int n = (int)a.integer("n", 1, 100000);
    if (!a.err.empty()) die("analyze", a.err);
    if (!a.has("load")) die("analyze", "needs --load FILE (a model.safetensors written by ./lime train)");
    std::string path = a.str("load");
    std::string out = a.has("out") ? a.str("out") : path.substr(0, path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/'));
    if (out.empty()) out = ".";
    std::string err;
    if (!make_dir(out, &err)) die("analyze", err);
    Loaded ld;
    err = load_checkpoint(path, dev, n, &ld, true);
    if (!err.empty()) die("analyze", err);
    Model& m = ld.m;
    const Config& c = m.c;
    printf("%s: %s, L=%d d=%d H=%d R=%d F=%d V=%d T=%d\n", path.c_str(), model_name(c).c_str(), c.L, c.d, c.H, c.R, c.F, c.V, c.T);
    size_t router_params = 0;
    for (const TensorSpec& t : m.specs) if (t.group == GROUP_ROUTER) router_params += t.numel;
    Config llama = c;
    model_parse("llama", &llama);
    printf("parameters: %zu (routers %zu, %.3f%%)\n", m.n_params, router_params, 100.0 * router_params / m.n_params);
    printf("FLOPs per token, training step at T=%d: %.4g (llama of this shape: %.4g, %+.3f%%)\n", c.T, flops_per_token(c, c.T),
           flops_per_token(llama, c.T), 100 * (flops_per_token(c, c.T) / flops_per_token(llama, c.T) - 1));
    model_to_host(&m);
    if (c.arch == ARCH_LIME && c.L > 1) {
        std::vector<std::vector<double>> heat = router_heatmap(m);
        std::vector<std::string> rows, cols;
        for (int l = 1; l < c.L; l++) rows.push_back("layer " + std::to_string(l));
        for (int l = 0; l < c.L; l++) cols.push_back(std::to_string(l));
        printf("router weight by source layer (rows: layer; columns: source layer 0..%d; each row sums to 1):\n", c.L - 1);
        for (size_t i = 0; i < heat.size(); i++) {
            printf("  %-9s", rows[i].c_str());
            for (double v : heat[i]) printf(std::isfinite(v) ? " %5.2f" : "     -", v);
            int l = (int)i + 1;
            double own = heat[i][l], best = 0;
            int best_src = 0;
            for (int s = 0; s < l; s++) if (heat[i][s] > best) { best = heat[i][s]; best_src = s; }
            printf("   own %2.0f%%, most from layer %d (%2.0f%%)\n", 100 * own, best_src, 100 * best);
        }
        err = plot_heatmap(out + "/router_heatmap.png", "Router weight by source layer (rows sum to 1)", "source layer", "layer", heat, rows, cols);
        if (!err.empty()) die("analyze", err);
        printf("wrote %s/router_heatmap.png\n", out.c_str());
    }
    // value entropy: the values each layer attends with, per test sequence
    const std::vector<Sequence>& seqs = *ld.task.test;
    int B = std::min(n, (int)seqs.size());
    std::vector<int> idx(B);
    for (int b = 0; b < B; b++) idx[b] = b;
    Batch batch;
    make_batch(seqs, idx.data(), B, c.T, ld.task.vocab.pad, &batch);
    model_forward(&m, batch.tokens.data(), nullptr, nullptr, B, c.T);
    int D = c.R * c.hd;
    Series s;
    s.label = model_name(c);
    printf("value entropy (Renyi, alpha = %g), mean over %d sequences:\n", alpha, B);
    for (int l = 0; l < c.L; l++) {
        const float* v = model_values(&m, l);  // (B, T, R, hd)
        double h = 0;
        for (int b = 0; b < B; b++) {
            int len = std::min(c.T, (int)seqs[b].tokens.size() - 1);
            h += value_entropy(v + (size_t)b * c.T * D, len, D, alpha);
        }
        h /= B;
        s.x.push_back(l);
        s.y.push_back(h);
        printf("  layer %d  %.4f\n", l, h);
    }
    err = plot_lines(out + "/value_entropy.png", "Value entropy per layer", "layer", "Renyi entropy (alpha " + fmt("%g", alpha) + ")", {s});
    if (!err.empty()) die("analyze", err);
    printf("wrote %s/value_entropy.png\n", out.c_str());
    printf("summary: value entropy goes from %.3f at layer 0 to %.3f at layer %d%s\n", s.y.front(), s.y.back(), c.L - 1,
           s.y.back() < s.y.front() ? " (representations of later layers are less diverse)" : "");
    model_free(&m);
    return 0;
}

// ===========================================================================

static void usage() {
    printf("usage: ./lime COMMAND [flags]   (./lime COMMAND --help for its flags)\n\n"
           "  train    train one model (llama or lime) on a task\n"
           "  eval     score checkpoints on their task (side by side with several --load)\n"
           "  sample   continue a prompt with a trained model\n"
           "  data     print generated examples as the model sees them\n"
           "  verify   check the implementation against reference vectors\n"
           "  bench    time training steps of llama and lime\n"
           "  compare  train both models for several seeds; report with statistics and figures\n"
           "  analyze  router heatmap, value entropy per layer and cost of a checkpoint\n");
}

int main(int argc, char** argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) { usage(); return argc < 2 ? 2 : 0; }
    std::string cmd = argv[1];
    int n = argc - 2;
    char** rest = argv + 2;
    if (cmd == "train") return cmd_train(n, rest);
    if (cmd == "eval") return cmd_eval(n, rest);
    if (cmd == "sample") return cmd_sample(n, rest);
    if (cmd == "data") return cmd_data(n, rest);
    if (cmd == "verify") return cmd_verify(n, rest);
    if (cmd == "bench") return cmd_bench(n, rest);
    if (cmd == "compare") return cmd_compare(n, rest);
    if (cmd == "analyze") return cmd_analyze(n, rest);
    fprintf(stderr, "lime: unknown command '%s'; commands: train eval sample data verify bench compare analyze (./lime --help)\n", cmd.c_str());
    return 2;
}
