// train.cpp — the command-line program `./lime`: train, eval, sample, data
// and export, each with --help, and main, which also runs the commands of
// support/commands/ (verify, bench, compare, analyze). The model lives in
// lime.cu, the tasks in data/; this file reads flags, moves data in and out,
// and reports.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
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
#include <memory>
#include <set>
#include <string>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "support/lib/cli.h"
#include "support/model/names.h"
#include "data/task.h"
#include "support/commands/export.h"
#include "support/model/lime.h"
#include "support/model/memory_check.h"
#include "support/lib/plot.h"
#include "support/lib/safetensors.h"
#include "support/commands/commands.h"

// ===========================================================================
// Tasks: built from flags, or rebuilt from a checkpoint's metadata
// ===========================================================================

// A flag of another task would be silently ignored: refuse it instead.
static void refuse_flags_of_other_task(Args& a, const std::string& task) {
    for (const std::string& flag : a.given) {
        const char* owner = task_owning_flag(flag, task);
        if (owner) a.fail("--" + flag + " is for --task " + owner + "; drop it or add --task " + owner);
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
        a.integer("train-size", 1, PROSQA_MAX_TRAIN);
        a.integer("test-size", 1, 1000000);
        a.integer("data-seed", 0, (long long)1 << 62);
        // stored as given: task_build finds a relative path beside ./lime too (task_data_path)
        for (const char* k : {"train-size", "test-size", "data-seed", "prosqa-test"}) s[k] = a.str(k);
    } else {
        a.number("val-frac", 0.0, 0.9);
        s["text-file"] = a.str("text-file");
        s["val-frac"] = a.str("val-frac");
    }
    return s;
}

// What a checkpoint records of the data files its task read: {"text-file":
// "SIZE:FNV1A64"} (support/lib/safetensors.h, file_fingerprint), a JSON object.
static std::string data_fingerprints(const std::map<std::string, std::string>& ts) {
    std::map<std::string, std::string> fps;
    for (auto& [key, file] : task_data_files(ts)) fps[key] = file_fingerprint(file, FILE_MAX_TEXT);
    return settings_to_json(fps);
}


// ===========================================================================
// Generation and scoring
// ===========================================================================

// Set by train's stop signals (catch_stop_signals, below); generate and
// mean_loss look at it before each forward, so that a periodic evaluation
// (minutes on a long tier) ends within a forward of a Ctrl-C. Outside train
// no handler sets it: eval, sample and analyze run to their end.
static volatile sig_atomic_t g_stop_signal = 0;

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
static void generate(Model* model, const Vocab& v, std::vector<std::vector<int>>* seqs, int max_new,
                     float temperature, Rng* rng) {
    const Config& c = model->c;
    std::vector<int> tokens;
    for (size_t start = 0; start < seqs->size(); start += model->B) {
        int B = (int)std::min((size_t)model->B, seqs->size() - start);
        std::vector<int> budget(B, max_new);
        for (;;) {
            int T = 0;
            std::vector<int> active;
            for (int b = 0; b < B; b++) {
                std::vector<int>& s = (*seqs)[start + b];
                bool done = budget[b] == 0 || (int)s.size() > c.T || s.empty() || (s.size() > 1 && s.back() == v.eos);
                if (!done) { active.push_back(b); T = std::max(T, (int)s.size()); }
            }
            if (active.empty() || g_stop_signal) break;
            tokens.assign((size_t)B * T, v.pad);
            for (int b = 0; b < B; b++) {
                const std::vector<int>& s = (*seqs)[start + b];
                for (int t = 0; t < T && t < (int)s.size(); t++) tokens[(size_t)b * T + t] = s[t];
            }
            model_forward(model, tokens.data(), nullptr, nullptr, B, T);
            const float* logits = model_logits(model);
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

// Greedy decoding from each test prompt, scored as its task says
// (docs/tasks.md): arith, the token before the first <eos> is the answer;
// prosqa, the text after the last '#' is the answer.
static Score score_answers(Model* model, const Task& t, int limit) {
    Score sc;
    int n = std::min((int)t.test->size(), limit > 0 ? limit : (int)t.test->size());
    std::vector<std::vector<int>> seqs(n);
    for (int i = 0; i < n; i++) {
        const Sequence& s = (*t.test)[i];
        seqs[i].assign(s.tokens.begin(), s.tokens.begin() + s.loss_start);
    }
    Rng rng(0);
    generate(model, t.vocab, &seqs, model->c.T + 1, 0.0f, &rng);
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
static double mean_loss(Model* model, const std::vector<Sequence>& seqs, int T, int pad, int limit) {
    int n = std::min((int)seqs.size(), limit > 0 ? limit : (int)seqs.size());
    double total = 0, count = 0;
    Batch batch;
    std::vector<int> idx;
    for (int start = 0; start < n && !g_stop_signal; start += model->B) {
        int B = std::min(model->B, n - start);
        idx.resize(B);
        for (int b = 0; b < B; b++) idx[b] = start + b;
        make_batch(seqs, idx.data(), B, T, pad, &batch);
        float loss = model_forward(model, batch.tokens.data(), batch.targets.data(), batch.mask.data(), B, T);
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

static const char* TRAIN_HELP =
    "Trains one model (--arch: llama, lime or a study model; ./lime --help lists them) on a task; writes\n"
    "DIR/model.safetensors at the end, DIR/checkpoint.safetensors on the way (for --resume) and\n"
    "DIR/log.jsonl (every number printed).";

struct TrainSettings {
    AdamWConfig opt;
    int B = 0, steps = 0, warmup = 0, log_every = 0, eval_every = 0, save_every = 0, eval_size = 0, stop_after = 0;
    int curve = 0;          // --curve: evaluations per run, evenly spaced, a learning curve (0: --eval-every's)
    Schedule sched = SCHED_LINEAR;
    float min_lr_ratio = 1e-6f;
    uint64_t seed = 1;
    std::string out;        // the output directory
    bool skip_bad = false;  // --skip-bad-steps
};

// DIR/log.jsonl: each line written whole with write(2) and checked; a line
// that does not fit (a full disk) is cut off again, and the run stops.
struct Logger {
    int fd = -1;
    bool quiet = false;
    std::string path;                                 // DIR/log.jsonl
    std::string kept = "no checkpoint was saved yet"; // what a failed write leaves, for its message
    // Appends one entry as a line (json_write: every string escaped, every
    // number valid JSON); false (errno set) when it could not be written whole.
    bool write(const Json& entry) {
        if (fd < 0) return true;
        std::string text = json_write(entry) + "\n";
        off_t before = lseek(fd, 0, SEEK_END);
        for (size_t done = 0; done < text.size();) {
            ssize_t n = ::write(fd, text.data() + done, text.size() - done);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                int e = n < 0 ? errno : ENOSPC;
                if (before >= 0 && ftruncate(fd, before) != 0) {}  // no half line left behind, where it can be cut
                errno = e;
                return false;
            }
            done += (size_t)n;
        }
        return true;
    }
    // A line the run cannot go on without: on failure, one line and exit status 2.
    void line(const Json& entry) {
        if (write(entry)) return;
        int e = errno;
        fd = -1;
        die("train", "cannot write " + path + ": " + strerror(e) + "; stopped: " + kept);
    }
};

// One training run: what the parts of cmd_train share.
struct TrainRun {
    TrainSettings s;
    Config c;                                       // the model; V and T come from the task
    Device dev = DEVICE_CPU;
    ModelSettings settings;                         // --attention, --tf32, --graph
    std::map<std::string, std::string> ts;          // the task's settings, from the flags
    Task task;
    int per_epoch = 1;                              // steps per pass over the training set
    Model model;
    Loader loader;
    Logger log;
    int lock_fd = -1;                               // DIR/train.lock, flock'ed for the life of the run
    std::map<std::string, std::string> saved_args;  // everything that rebuilds this run, in each checkpoint
    std::string data_files;                         // fingerprints of the data files read (data_fingerprints)
    int start_step = 0;                             // the step a resumed run continues after, else 0
    int done_step = 0;                              // the last step taken, for the metadata
    int run_steps = 0;                              // steps taken by this process
    int last_good = 0, last_saved = 0;              // the last step checked finite; the last checkpoint's step
    int skipped_in_a_row = 0;                       // --skip-bad-steps
    int steps_timed = 0;                            // steps since the last progress line
    double t_start = 0, t_last = 0;                 // ms: the loop's start, the last progress line
    double val_loss = 0, acc = -1;                  // of the last evaluation (acc -1: text)
    double eval_ms = 0;                             // the periodic evaluations so far: their time, their count
    int evals_timed = 0;
    Batch batch;                                    // the step's batch
};

// Time left: the steps at the pace of the last ones, plus the periodic
// evaluations still to come and the final one (every test question: as many
// times longer as it has more questions) at the pace of those measured so far.
// Before the first evaluation is timed its cost is unknown: " + evaluation".
static std::string eta_str(const TrainRun& r, int step, double ms_per_step) {
    const TrainSettings& s = r.s;
    double eta = ms_per_step * (s.steps - step) / 1000;
    int evals_left = (s.steps - 1) / s.eval_every - step / s.eval_every;  // the periodic ones after this step
    size_t tests = r.task.test ? r.task.test->size() : 0;
    size_t periodic = s.eval_size > 0 ? std::min((size_t)s.eval_size, tests) : tests;
    double final_share = r.task.kind == "text" || periodic == 0 ? 1.0 : (double)tests / periodic;
    if (r.evals_timed == 0) return duration_str(eta) + " + evaluation";
    eta += r.eval_ms / r.evals_timed * (std::max(evals_left, 0) + final_share) / 1000;
    return duration_str(eta);
}

// Validation loss and (arith, prosqa) accuracy on the first eval_size test
// examples (0: all); printed unless quiet, and logged. A stop signal cuts it
// short: nothing is printed or logged, and the caller saves and stops.
static void evaluate(Model* model, const Task& t, int step, int eval_size, Logger* log, double* val_loss,
                     double* acc) {
    *val_loss = mean_loss(model, *t.test, t.T, t.vocab.pad, eval_size);
    std::string msg = "eval step " + std::to_string(step) + " | val loss " + fmt("%.4f", *val_loss);
    Json json;
    json.add_str("type", "eval").add_num("step", step).add_num("val_loss", *val_loss);
    *acc = -1;
    if (t.kind != "text") {
        Score sc = score_answers(model, t, eval_size);
        *acc = sc.accuracy();
        msg += " | accuracy " + fmt("%.1f%%", 100 * *acc) + " of " + std::to_string(sc.n);
        json.add_num("accuracy", *acc).add_num("n", sc.n);
    } else {
        msg += " | perplexity " + fmt("%.3f", std::exp(*val_loss));
        json.add_num("perplexity", std::exp(*val_loss));
    }
    if (g_stop_signal) return;  // cut short: its numbers cover part of the test set
    if (!log->quiet) printf("%s\n", msg.c_str());
    log->line(json);
}

// --- reading the flags -------------------------------------------------------

// Flags that are each in range but do not go together. `user` holds the
// flags given on this command line (a resumed run adds its saved ones).
static void check_train_combinations(Args& a, const std::set<std::string>& user, const TrainSettings& s,
                                     const std::string& task) {
    if (user.count("steps") && user.count("epochs"))
        a.fail("--steps and --epochs both set the run's length; give one of them");
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
            die("train", std::string("--") + f.name + " " + a.str(f.name) + " differs from the run being resumed (" +
                             it->second + "): a resumed run keeps its task; start a new run to change it");
    }
}

// The run --resume continues: its checkpoint, model and metadata.
struct Resumed {
    std::string path;  // "" when not resuming
    Config c;
    std::map<std::string, std::string> meta;
    TrainMeta tm;      // the metadata, checked
    // meta[key], or "" when the key is missing
    std::string get(const std::string& key) const {
        auto it = meta.find(key);
        return it == meta.end() ? "" : it->second;
    }
};

// A resumed run keeps its model: a shape flag typed now (--arch, --layers,
// --router, --hc-rate, ...) must give the checkpoint's own value, checked
// before the checkpoint's saved flags are merged in, so that the line names
// the flag the user typed, never one the file brought.
static void refuse_model_change(const Args& a, const Resumed& r) {
    for (const FlagSpec& f : SHAPE_FLAGS) {
        if (!a.has(f.name)) continue;
        std::string typed = a.str(f.name), saved = shape_flag_value(r.c, f.name);
        char* end = nullptr;
        double t = strtod(typed.c_str(), &end);
        bool same = typed == saved || (!typed.empty() && !*end && t == strtod(saved.c_str(), nullptr));
        if (!same)
            die("train", "--resume " + r.path + " holds a different model (" + model_name(r.c) + ", its --" + f.name +
                             " " + saved + ") than --" + f.name + " " + typed + " describes; drop --" + f.name +
                             " (a resumed run keeps its model), or start a new run");
    }
}

// The directory a file is in: "." for a bare name.
static std::string dir_of(const std::string& path) {
    size_t slash = path.find_last_of('/');
    return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

// --resume: reads the checkpoint, refuses a change of task or seed, and takes
// its saved flags for those not given now (the ones given now win). Only
// train's own valued flags are taken, and never --out, --stop-after or a
// switch (--force): what a file says never decides where the run writes or
// what it replaces. The run writes where the checkpoint is, or to --out.
static Resumed resume_flags(Args& a, const std::vector<FlagSpec>& flags) {
    Resumed r;
    if (!a.has("resume")) return r;
    r.path = a.str("resume");
    std::string err = checkpoint_read_config(r.path, &r.c, &r.meta);
    if (err.empty()) err = checkpoint_check_meta(r.path, r.c, r.meta, &r.tm);
    if (!err.empty()) die("train", err);
    std::map<std::string, std::string> saved;
    if (!r.meta.count("args") || !settings_from_json(r.meta["args"], &saved).empty())
        die("train", r.path + " was not written by ./lime train (no training arguments in it); "
                     "it can be loaded by eval, not resumed");
    refuse_task_change(a, saved);
    refuse_model_change(a, r);
    if (a.has("seed") && saved.count("seed") && a.str("seed") != saved["seed"])
        die("train", "--seed " + a.str("seed") + " differs from the run being resumed (seed " + saved["seed"] +
                         "): a resumed run keeps the seed of its initialisation and data order; drop --seed, or "
                         "start a new run");
    for (const FlagSpec& f : flags) {
        std::string name = f.name;
        if (!f.def || name == "out" || name == "resume" || name == "stop-after" || a.has(name) || !saved.count(name))
            continue;
        a.values[name] = {saved[name]};
        a.given.insert(name);
    }
    if (!a.has("out")) { a.values["out"] = {dir_of(r.path)}; a.given.insert("out"); }
    return r;
}

// The flags that do not depend on the task: batch, optimiser, schedule,
// seed, evaluation size, --stop-after and the output directory.
static TrainSettings train_settings(Args& a) {
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
    s.out = a.str("out");
    if (s.out.empty()) a.fail("--out needs a directory");
    s.skip_bad = a.has("skip-bad-steps");
    return s;
}

// The run's length and its intervals, from the flags or, by default, from
// the length: --epochs passes of per_epoch steps, warmup 2%, ~50 progress
// lines, ~5 evaluations (--curve N: N), a checkpoint at each evaluation
// (with --curve, ~5 a run).
static void train_lengths(Args& a, int per_epoch, TrainSettings* s) {
    if (a.has("steps")) {
        s->steps = (int)a.integer("steps", 1, MAX_STEPS);
    } else {  // counted in 64 bits: --epochs x steps per epoch may pass any int
        long long epochs = a.integer("epochs", 1, 1 << 20), steps = epochs * per_epoch;
        if (steps > MAX_STEPS)
            a.fail("--epochs " + std::to_string(epochs) + " x " + std::to_string(per_epoch) + " steps per epoch is " +
                   std::to_string(steps) + " steps, more than a run may take (" + std::to_string(MAX_STEPS) +
                   "); use fewer --epochs, a larger --batch, or --steps");
        s->steps = (int)std::min(steps, MAX_STEPS);
    }
    s->warmup = a.has("warmup") ? (int)a.integer("warmup", 0, 1 << 30) : s->steps / 50;
    s->log_every = a.has("log-every") ? (int)a.integer("log-every", 1, 1 << 30) : std::max(1, s->steps / 50);
    s->curve = (int)a.integer("curve", 0, 1 << 20);
    if (s->curve && a.has("eval-every"))
        a.fail("--curve " + a.str("curve") + " sets the steps between evaluations (the run's steps / " + a.str("curve") +
               "); drop --eval-every, or --curve");
    s->eval_every = a.has("eval-every") ? (int)a.integer("eval-every", 1, 1 << 30)
                                        : std::max(1, s->steps / (s->curve ? s->curve : 5));
    s->save_every = a.has("save-every") ? (int)a.integer("save-every", 1, 1 << 30)
                                        : s->curve ? std::max(1, s->steps / 5) : s->eval_every;
}

// Reads and checks every flag of train (a resumed run's saved ones included)
// and builds the task; dies with one line at the first problem.
static void train_from_flags(Args& a, const std::set<std::string>& user_flags, TrainRun* r) {
    set_threads(a);
    r->dev = pick_device(a);
    r->settings = model_settings(a);
    r->c = shape_from_args(a);
    r->ts = task_settings(a);
    int text_T = (int)a.integer("seq-len", 2, 1 << 16);
    r->s = train_settings(a);
    if (!a.err.empty()) die("train", a.err);
    Config shape = r->c;  // the task sets V and T below; check the rest now
    shape.V = shape.T = 1;
    std::string err = config_check(shape);
    if (!err.empty()) die("train", err);
    err = task_build(r->ts, text_T, &r->task, memory_available("/proc/meminfo"));
    if (!err.empty()) die("train", err);
    r->data_files = data_fingerprints(r->ts);
    r->c.V = r->task.vocab.size();
    r->c.T = r->task.T;
    r->per_epoch = std::max(1, (int)((r->task.train->size() + r->s.B - 1) / r->s.B));
    train_lengths(a, r->per_epoch, &r->s);
    check_train_combinations(a, user_flags, r->s, r->ts["task"]);
    if (!a.err.empty()) die("train", a.err);
}

// --- setting the run up --------------------------------------------------------


// A run directory is never silently reused: a fresh run into an --out that
// holds a checkpoint or a model (another run's) is refused unless --force; a
// resumed run may write only where its own checkpoint is, or where none is.
static void refuse_reused_out(const Args& a, const Resumed& resumed, const TrainRun& r) {
    const std::string& out = r.s.out;
    // the names a run writes: a regular file of a run, or nothing; a symlink, a
    // directory or a device there is refused, --force or not (never followed or replaced)
    for (const char* name : {"checkpoint.safetensors", "model.safetensors", "log.jsonl", "train.lock"}) {
        struct stat sb;
        std::string path = out + "/" + name;
        if (lstat(path.c_str(), &sb) != 0 || S_ISREG(sb.st_mode)) continue;
        die("train", path + " is " + (S_ISLNK(sb.st_mode) ? "a symbolic link" : S_ISDIR(sb.st_mode) ? "a directory"
                                                                                                : "not a regular file") +
                         ", where a run writes its own file; remove it, or choose another --out");
    }
    if (a.has("force")) return;
    std::string ck = out + "/checkpoint.safetensors", model = out + "/model.safetensors";
    struct stat sc, sm, sr;
    bool has_ck = stat(ck.c_str(), &sc) == 0, has_model = stat(model.c_str(), &sm) == 0;
    if (!resumed.path.empty()) {
        bool own = has_ck && stat(resumed.path.c_str(), &sr) == 0 && sc.st_dev == sr.st_dev && sc.st_ino == sr.st_ino;
        if (has_ck && !own)
            die("train", "--out " + out + " holds another checkpoint than " + resumed.path + ", the one being " +
                             "resumed; resume that one with --resume " + ck + ", pass --force to replace it, or " +
                             "choose another --out");
        if (!has_ck && has_model)
            die("train", "--out " + out + " holds another run's model.safetensors; pass --force to replace it, or " +
                             "choose another --out");
        return;
    }
    if (has_ck)
        die("train", "--out " + out + " already holds a run (" + ck + "); resume it with ./lime train --resume " + ck +
                         ", pass --force to start afresh and replace it, or choose another --out");
    if (has_model)
        die("train", "--out " + out + " already holds a finished run (" + model + "); pass --force to start " +
                         "afresh and replace it, or choose another --out");
}

// Creates the model and starts the data: loaded from the checkpoint being
// resumed (weights, optimiser state, step and data position), else fresh.
static void train_start_model(const Resumed& resumed, TrainRun* r) {
    std::string err = model_create(&r->model, r->c, r->s.B, r->dev, r->settings);
    if (!err.empty()) die("train", err);
    if (resumed.path.empty()) {
        model_init(&r->model, r->s.seed);
        r->loader.start(r->task.train, r->s.seed, 0, 0);
        return;
    }
    if (config_to_json(resumed.c) != config_to_json(r->c))
        die("train", "--resume " + resumed.path + " holds a different model than these flags describe (" +
                         config_diff(resumed.c, r->c) +
                         ", in the file vs the flags); drop the shape flags or start a new run");
    err = model_load(&r->model, resumed.path, true);
    if (!err.empty()) die("train", err);
    // the loop's step; model.step counts the updates applied, fewer when steps were skipped
    const TrainMeta& tm = resumed.tm;
    r->start_step = tm.train_step;
    r->done_step = r->start_step;
    if (r->s.steps < r->start_step)
        die("train", "--steps " + std::to_string(r->s.steps) + " is below step " + std::to_string(r->start_step) +
                         ", where " + resumed.path + " was saved: a resumed run goes on from there; give --steps " +
                         std::to_string(r->start_step) + " or more");
    if (tm.data_pos >= (long long)r->task.train->size())
        die("train", resumed.path + ": metadata \"data_pos\" " + std::to_string(tm.data_pos) + " lies past the " +
                         std::to_string(r->task.train->size()) + " training examples: the file was altered or "
                         "damaged; use an earlier checkpoint or train again");
    err = vocab_matches(resumed.path, tm.vocab, r->task.vocab);
    if (!err.empty()) die("train", err);
    // the rest of a run trains on the data it began with: a changed file would
    // go on silently, and the model would then record the new file as its own
    std::string changed = data_files_changed(resumed.meta, r->ts);
    if (!changed.empty())
        die("train", changed.substr(0, changed.find(": results are on other data")) + ": the run being resumed began " +
                         "on the other file; restore it to go on, or start a new run on this one");
    r->log.kept = resumed.path + " (step " + std::to_string(r->start_step) + ") is kept; free some space, then " +
                  "continue with ./lime train --resume " + resumed.path;
    r->loader.start(r->task.train, r->s.seed, tm.data_epoch, (size_t)tm.data_pos);
}

// The flags that rebuild this run, stored in each checkpoint: those given
// (or resumed) but --resume and --stop-after, the task's settings, and the
// length, batch and seed as decided.
static void train_saved_args(const Args& a, const std::vector<FlagSpec>& flags, TrainRun* r) {
    for (const FlagSpec& f : flags)
        if (f.def && a.has(f.name) && std::string(f.name) != "resume" && std::string(f.name) != "stop-after")
            r->saved_args[f.name] = a.str(f.name);
    for (auto& kv : r->ts) r->saved_args[kv.first] = kv.second;
    r->saved_args["steps"] = std::to_string(r->s.steps);
    r->saved_args["batch"] = std::to_string(r->s.B);
    r->saved_args["seed"] = std::to_string(r->s.seed);
}

// The metadata of each checkpoint: the step, the task, its vocabulary, the
// flags and the data position.
static std::map<std::string, std::string> train_meta(const TrainRun& r) {
    std::map<std::string, std::string> meta;
    meta["train_step"] = std::to_string(r.done_step);
    meta["task"] = settings_to_json(r.task.settings);
    meta["vocab"] = vocab_to_json(r.task.vocab);
    meta["args"] = settings_to_json(r.saved_args);
    meta["data_files"] = r.data_files;
    meta["data_epoch"] = std::to_string(r.loader.epoch);
    meta["data_pos"] = std::to_string(r.loader.pos);
    return meta;
}

// Everything the first save could refuse, asked before the run writes
// anything: each saved flag is UTF-8 (a checkpoint's metadata is JSON), and
// the checkpoint and the model would be written as they stand now.
static void train_check_saves(const TrainRun& r) {
    for (auto& [flag, value] : r.saved_args)
        if (!utf8_valid(value))
            die("train", "--" + flag + " " + value + " is not UTF-8 text, and every checkpoint records it in its "
                         "metadata (JSON, UTF-8 only); rename the file or directory, or give another --" + flag);
    std::map<std::string, std::string> meta = train_meta(r);
    std::string err = model_save_check(&r.model, r.s.out + "/checkpoint.safetensors", meta, true);
    if (err.empty()) err = model_save_check(&r.model, r.s.out + "/model.safetensors", meta, false);
    if (!err.empty()) die("train", err);
}

// DIR/train.lock, flock'ed for the life of the process (the kernel lets go
// when it ends, however it ends), with its pid inside: a second ./lime train
// into the same directory, fresh or --resume, is refused naming the holder.
static int lock_run_dir(const std::string& out) {
    std::string path = out + "/train.lock", why;
    long pid = 0;
    int fd = lock_file(path, &pid, &why);
    if (fd == -2)
        die("train", "cannot use " + path + " (" + why + "), the lock a run holds on its directory; remove it if it "
                     "is not a file, or choose another --out");
    if (fd == -1)
        die("train", "--out " + out + " is in use by another ./lime train (" +
                         (pid > 0 ? "pid " + std::to_string(pid) : std::string("its pid not written yet")) +
                         ", holding " + path + "); wait for it to end or stop it, or choose another --out");
    return fd;
}

// Temporary files of saves that a killed process left in DIR (the lock is
// held: no other run is writing them). unlink removes a link, never its target.
static void remove_stale_temps(const std::string& out) {
    DIR* d = opendir(out.c_str());
    if (!d) return;
    while (struct dirent* e = readdir(d)) {
        std::string name = e->d_name;
        for (const char* f : {"checkpoint.safetensors.tmp-", "model.safetensors.tmp-"})
            if (name.rfind(f, 0) == 0 && name.size() == strlen(f) + 6) unlinkat(dirfd(d), name.c_str(), 0);
    }
    closedir(d);
}

// What a save needs, tried once at the start: a temporary file created
// beside DIR/checkpoint.safetensors (the directory writable, the longest
// name the run writes fitting NAME_MAX and PATH_MAX), while the directory is
// open too, as sync_directory opens it, with the lock and the log held: the
// descriptors a save takes are there (ulimit -n). "" or why not.
static std::string try_a_save(const std::string& out) {
    std::string tmp;
    int fd = open_temp_beside(out + "/checkpoint.safetensors", &tmp);
    if (fd < 0) {
        int e = errno;
        std::string why = e == ENAMETOOLONG ? "; the name is too long for the file system: choose a shorter --out"
                          : e == EMFILE || e == ENFILE ? "; too few file descriptors: raise the limit (ulimit -n 64)"
                          : e == EACCES || e == EPERM || e == EROFS ? "; the directory is not writable: choose another --out"
                                                                    : "";
        return "cannot create " + out + "/checkpoint.safetensors.tmp-XXXXXX, as every save does: " + strerror(e) + why;
    }
    int dir = open(out.c_str(), O_RDONLY | O_CLOEXEC);
    int e = errno;
    close(fd);
    unlink(tmp.c_str());
    if (dir < 0)
        return "cannot open " + out + " as every save does (to make its rename durable): " + strerror(e) +
               (e == EMFILE || e == ENFILE ? "; too few file descriptors: raise the limit (ulimit -n 64)" : "");
    close(dir);
    return "";
}

// Only now, when every check has passed, does the run write anything: the
// output directory, its lock, the log (appended to when resuming), the first
// line. A planted symlink at log.jsonl is refused (O_NOFOLLOW), not followed.
static void train_open_output(bool quiet, TrainRun* r) {
    train_check_saves(*r);
    std::string err;
    struct stat sb;
    std::vector<std::string> created;  // the directories make_dir makes, outermost first
    for (size_t i = 1; i <= r->s.out.size(); i++)
        if (i == r->s.out.size() || r->s.out[i] == '/')
            if (stat(r->s.out.substr(0, i).c_str(), &sb) != 0) created.push_back(r->s.out.substr(0, i));
    if (!make_dir(r->s.out, &err)) die("train", err + " (choose another --out)");
    if (r->lock_fd < 0) r->lock_fd = lock_run_dir(r->s.out);  // (a group's runs hold theirs from the start)
    remove_stale_temps(r->s.out);
    r->log.quiet = quiet;
    std::string log_path = r->s.out + "/log.jsonl";
    r->log.path = log_path;
    bool log_existed = lstat(log_path.c_str(), &sb) == 0;
    r->log.fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | (r->start_step > 0 ? O_APPEND : 0),
                     0644);
    if (r->log.fd < 0) err = "cannot write " + log_path + ": " + strerror(errno);
    if (r->log.fd < 0 && errno == ELOOP) err += " (it is a symbolic link: a run writes its own log; remove the link)";
    if (r->log.fd < 0 && (errno == EMFILE || errno == ENFILE)) err += " (too few file descriptors: raise ulimit -n)";
    if (err.empty()) err = try_a_save(r->s.out);
    if (!err.empty()) {  // nothing of the run's is left: the lock, and the directory if it made it
        if (r->log.fd >= 0 && !log_existed) unlink(log_path.c_str());
        unlink((r->s.out + "/train.lock").c_str());
        for (size_t i = created.size(); i-- > 0;) rmdir(created[i].c_str());
        die("train", err);
    }
    if (r->start_step == 0 && ftruncate(r->log.fd, 0) != 0) die("train", "cannot write " + log_path + ": " + strerror(errno));
    const Config& c = r->c;
    if (!r->log.quiet) {
        printf("train %s on %s: L=%d d=%d H=%d R=%d F=%d V=%d T=%d, %zu parameters, %s, batch %d, %d steps "
               "(%d per epoch)%s\n",
               model_name(c).c_str(), r->ts["task"].c_str(), c.L, c.d, c.H, c.R, c.F, c.V, c.T, r->model.n_params,
               r->dev == DEVICE_GPU ? "gpu" : "cpu", r->s.B, r->s.steps, r->per_epoch,
               r->start_step ? (", resuming at step " + std::to_string(r->start_step)).c_str() : "");
    }
    Json config, args;  // both written by this program: valid JSON
    args.kind = Json::OBJ;
    json_parse(config_to_json(c), &config);
    for (const auto& kv : r->saved_args) args.add_str(kv.first, kv.second);
    r->log.line(Json().add_str("type", "config").add_str("arch", arch_name(c.arch)).add_num("params", r->model.n_params)
                    .add("config", config).add("args", args));
}

// --- training guards ---------------------------------------------------------
// SIGINT (Ctrl-C), SIGTERM, SIGHUP (the terminal or ssh session went away)
// and SIGPIPE (stdout's reader is gone: ./lime train | head) only set this
// flag, from the first step to the "done" line; the loop finishes its step,
// saves a checkpoint and exits (in the final save and evaluation:
// finish_interrupted). SA_RESETHAND: a second SIGINT, SIGTERM or SIGHUP
// kills at once. SIGPIPE stays caught (every later write to stdout raises
// it again, and such writes just fail with EPIPE).
// A stdout that is a pipe nobody reads (./lime train | sleep 60) would keep
// the loop blocked in a write, deaf to the flag: the handler makes such a
// pipe non-blocking (fcntl is async-signal-safe), so the blocked write ends
// and later ones fail at once; the resume line then goes to stderr.
static int g_stdout_pipe_flags = -1;  // stdout's file status flags when it is a pipe or socket, else -1
static void on_stop_signal(int sig) {
    if (!g_stop_signal) g_stop_signal = sig;
    if (g_stdout_pipe_flags >= 0) fcntl(1, F_SETFL, g_stdout_pipe_flags | O_NONBLOCK);
}
static void catch_stop_signals() {
    struct stat sb;
    g_stdout_pipe_flags = fstat(1, &sb) == 0 && (S_ISFIFO(sb.st_mode) || S_ISSOCK(sb.st_mode)) ? fcntl(1, F_GETFL) : -1;
    struct sigaction sa = {};
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESETHAND | SA_RESTART;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGHUP, &sa, nullptr);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGPIPE, &sa, nullptr);
}

#ifdef LIME_TESTING
// Fault injection for tests/test_faults.sh, compiled only into testing builds
// (LIME_TESTING: ./lime-emu, build/lime-asan; never ./lime):
// LIME_TEST_NAN_STEP=N puts an Inf in the loss mask of step N's batch, as a
// corrupt batch would, which makes that step's loss and every gradient NaN.
// Unset: never.
static int test_nan_step() {
    static const int step = [] {
        const char* v = getenv("LIME_TEST_NAN_STEP");
        return v ? atoi(v) : 0;
    }();
    return step;
}
// LIME_TEST_SIGNAL_AT=PHASE:N:SIG (tests/test_signals.sh) raises SIG (INT,
// TERM, HUP or PIPE) once, at PHASE of step N, where a real signal can land:
// step (after the loop read the stop flag: the step's device time on the
// GPU, its progress line), save (the checkpoint being written), eval (the
// evaluation at step N begins; N = --steps: the final one), model
// (model.safetensors being written). Unset: never.
static void test_signal_at(const char* phase, int step) {
    static std::string at_phase;
    static int at_step = -1, sig = [] {
        char p[16] = "", name[8] = "";
        const char* v = getenv("LIME_TEST_SIGNAL_AT");
        if (!v || sscanf(v, "%15[a-z]:%d:%7s", p, &at_step, name) != 3) return 0;
        at_phase = p;
        std::string n = name;
        return n == "INT" ? SIGINT : n == "TERM" ? SIGTERM : n == "HUP" ? SIGHUP : n == "PIPE" ? SIGPIPE : 0;
    }();
    if (sig && step == at_step && at_phase == phase) raise(sig), sig = 0;
}
#else
static void test_signal_at(const char*, int) {}
#endif

// "NaN", "Inf", "-Inf" or the number: how the guards print a loss or a norm.
static std::string num_str(double x) {
    return std::isnan(x) ? "NaN" : std::isinf(x) ? (x > 0 ? "Inf" : "-Inf") : fmt("%g", x);
}

// --skip-bad-steps: forward and backward, then the update only when the loss
// and every gradient are finite (model_train_step would apply the update
// before anyone could look). "" when the step was applied, else why not.
// On the GPU the check copies the model to the host: a cost of the switch.
static std::string guarded_step(Model* model, const Batch& b, const AdamWConfig& opt, float factor) {
    float loss = model_forward(model, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T, b.valid.data());
    model_backward(model);
    std::string tensor = model_first_nonfinite(model, false);
    if (std::isfinite(loss) && tensor.empty()) {
        model_update(model, opt, factor);
        return "";
    }
    return "the loss is " + num_str(loss) + (tensor.empty() ? "" : " and the gradient of " + tensor + " is not finite");
}

// A NaN or an Inf: stop without saving, one line that names the step, the
// first bad tensor and the checkpoint that is still good. Exit status 1.
static void training_failed(TrainRun* r, const std::string& what, int step, int last_good) {
    std::string when = last_good == step - 1 ? "step " + std::to_string(step)
                                             : "between steps " + std::to_string(last_good + 1) + " and " +
                                                   std::to_string(step) +
                                                   " (checked at log steps; --log-every 1 finds the step)";
    std::string kept = r->last_saved > 0 ? r->s.out + "/checkpoint.safetensors (step " +
                                               std::to_string(r->last_saved) + ") is the last good checkpoint"
                                         : "no checkpoint was saved yet";
    std::string msg = when + ": " + what + "; stopped without saving: " + kept +
                      "; lower --lr, or pass --skip-bad-steps to skip such steps";
    r->log.write(Json().add_str("type", "error").add_num("step", step).add_str("message", msg));
    fflush(stdout);
    fprintf(stderr, "lime train: error: %s\n", one_line(msg).c_str());
    if (g_end_hook) g_end_hook(1);  // ./lime train-group: this run alone ends
    exit(1);
}

// A step --skip-bad-steps skipped: say why; 20 in a row end the run.
static void note_skipped(TrainRun* r, int step, const std::string& why) {
    if (!r->log.quiet) printf("step %d/%d skipped: %s\n", step, r->s.steps, why.c_str());
    r->log.line(Json().add_str("type", "skipped").add_num("step", step).add_str("why", why));
    if (++r->skipped_in_a_row == 20)
        training_failed(r, "20 steps in a row were skipped, the last because " + why, step, step - 1);
    r->last_good = step;  // the weights did not change
}

// The guard: never log, evaluate or save a model past a NaN or an Inf.
// Reads the loss and gradient norm of the step just taken into *loss, *norm
// (on the GPU this waits for the device), and stops the run if either is not finite.
static void check_finite(TrainRun* r, int step, float* loss, float* norm) {
    model_metrics(&r->model, loss, norm);
    if (!std::isfinite(*loss) || !std::isfinite(*norm)) {
        std::string tensor = model_first_nonfinite(&r->model, false);
        training_failed(r, "the loss is " + num_str(*loss) + " and the gradient norm " + num_str(*norm) +
                               (tensor.empty() ? "" : "; the first non-finite gradient is in " + tensor),
                        step, r->last_good);
    }
    r->last_good = step;
}

// --- the training loop ---------------------------------------------------------

// Takes one step: the next batch, then forward, backward and AdamW (with
// --skip-bad-steps, the update only when all is finite). Returns why the
// step was skipped, else "".
static std::string take_step(TrainRun* r, int step, float factor, Batch* batch) {
    const TrainSettings& s = r->s;
    r->loader.next(s.B, r->c.T, r->task.vocab.pad, batch);
#ifdef LIME_TESTING
    if (step == test_nan_step()) batch->mask[0] = INFINITY;
#endif
    std::string skipped;
    if (s.skip_bad) skipped = guarded_step(&r->model, *batch, s.opt, factor);
    else model_train_step(&r->model, batch->tokens.data(), batch->targets.data(), batch->mask.data(), s.B, r->c.T,
                          s.opt, factor, batch->valid.data());
    r->done_step = step;
    r->steps_timed++;
    r->run_steps++;
    return skipped;
}

// The progress line and its log entry: loss, learning rate, gradient norm,
// speed since the last line, time left.
static void log_progress(TrainRun* r, int step, float loss, float norm, float factor) {
    const TrainSettings& s = r->s;
    double t = now_ms(), ms = (t - r->t_last) / r->steps_timed;
    double tok_s = (double)s.B * r->c.T / (ms / 1000);
    // with the value-entropy regulariser: the loss's cross-entropy and mean S2 beside it
    bool ereg = r->c.entropy_reg > 0;
    std::string parts = ereg ? fmt(" (ce %.4f", r->model.last_ce) + fmt(", s2 %.4f)", r->model.last_s2) : "";
    if (!r->log.quiet)
        printf("step %d/%d | loss %.4f%s | lr %.2e | norm %.3f | %.1f ms/step | %.0f tok/s | ETA %s\n", step, s.steps,
               loss, parts.c_str(), s.opt.lr * factor, norm, ms, tok_s, eta_str(*r, step, ms).c_str());
    Json line;
    line.add_str("type", "train").add_num("step", step).add_num("loss", loss);
    if (ereg) line.add_num("ce", r->model.last_ce).add_num("s2", r->model.last_s2);
    r->log.line(line.add_num("lr", s.opt.lr * factor).add_num("norm", norm).add_num("ms_per_step", ms)
                    .add_num("tokens_per_s", tok_s));
    fflush(stdout);
    r->t_last = t;
    r->steps_timed = 0;
}

// DIR/checkpoint.safetensors with the optimiser state, for --resume; a
// model whose weights hold a NaN or an Inf is never saved.
static void save_checkpoint(TrainRun* r, int step) {
    std::string tensor = model_first_nonfinite(&r->model, true);
    if (!tensor.empty()) training_failed(r, "the weights of " + tensor + " are not finite", step, r->last_good);
    test_signal_at("save", step);
    std::string err = model_save(&r->model, r->s.out + "/checkpoint.safetensors", train_meta(*r), true);
    if (!err.empty()) die("train", err + "; stopped: " + r->log.kept);
    r->last_saved = step;
    r->log.kept = r->s.out + "/checkpoint.safetensors (step " + std::to_string(step) + ") is kept; free some " +
                  "space, then continue with ./lime train --resume " + r->s.out + "/checkpoint.safetensors";
    r->t_last = now_ms();
}

// Ended by a signal, its checkpoint saved: how to go on (on stderr after
// SIGPIPE: stdout is gone), and the shell's exit status for "ended by this
// signal", 128 + the signal (130 SIGINT, 143 SIGTERM, 129 SIGHUP, 141 SIGPIPE).
static int train_interrupted(TrainRun* r, int step, int sig) {
    const char* what = sig == SIGINT ? "interrupted (SIGINT)" : sig == SIGTERM ? "terminated (SIGTERM)"
                       : sig == SIGHUP ? "hung up (SIGHUP)" : "output closed (SIGPIPE)";
    std::string out = one_line(r->s.out);
    std::string line = std::string(what) + " at step " + std::to_string(step) + ": saved " + out +
                       "/checkpoint.safetensors; continue with ./lime train --resume " + out +
                       "/checkpoint.safetensors\n";
    // stderr after SIGPIPE, or when stdout cannot take the line (a pipe nobody reads: on_stop_signal)
    if (sig == SIGPIPE || fputs(line.c_str(), stdout) < 0 || fflush(stdout) != 0) fputs(line.c_str(), stderr);
    r->log.line(Json().add_str("type", "interrupted").add_num("step", step).add_num("signal", sig));
    return 128 + sig;
}

// --stop-after ended this process's part of the run, its checkpoint saved: how to go on.
static int train_stopped(TrainRun* r, int step) {
    printf("stopped after %d steps of this run at step %d; continue with ./lime train --resume "
           "%s/checkpoint.safetensors\n",
           r->run_steps, step, one_line(r->s.out).c_str());
    return 0;
}

// The loop's start: its clocks, the guards' marks, the stop signals caught.
static void train_loop_start(TrainRun* r) {
    r->t_start = r->t_last = now_ms();
    r->last_good = r->last_saved = r->start_step;
    catch_stop_signals();
}

// One step of the loop, checked, logged, evaluated and saved as the flags say.
// Returns the exit status when the run ends early (a signal, --stop-after), else -1.
static int train_loop_step(TrainRun* r, int step) {
    const TrainSettings& s = r->s;
    float factor = lr_factor(step, s.warmup, s.steps, s.sched, s.min_lr_ratio);
    std::string skipped = take_step(r, step, factor, &r->batch);  // why --skip-bad-steps skipped it, else ""
    int stop_signal = g_stop_signal;  // a signal after this read is seen at the next step, or below in the last
    test_signal_at("step", step);
    bool last = step == s.steps || (s.stop_after && r->run_steps == s.stop_after);
    bool logging = skipped.empty() && (step % s.log_every == 0 || last || step == r->start_step + 1);
    bool saving = step % s.save_every == 0 || last || stop_signal;
    if (!skipped.empty()) note_skipped(r, step, skipped);
    else r->skipped_in_a_row = 0;
    // Reading the metrics is free on the CPU, so every step is checked; on
    // the GPU it waits for the device, so only steps that log or save are.
    float loss = 0, norm = 0;
    bool checking = skipped.empty() && (logging || saving || r->model.device == DEVICE_CPU);
    if (checking) check_finite(r, step, &loss, &norm);
    if (logging) log_progress(r, step, loss, norm, factor);
    if (step % s.eval_every == 0 && !last && !stop_signal) {
        double t0 = now_ms();
        test_signal_at("eval", step);
        evaluate(&r->model, r->task, step, s.eval_size, &r->log, &r->val_loss, &r->acc);
        r->t_last = now_ms();
        r->eval_ms += r->t_last - t0;
        r->evals_timed++;
        if ((stop_signal = g_stop_signal)) saving = true;  // a signal during the evaluation: save and stop now
    }
    if (saving) save_checkpoint(r, step);
    if (last && !stop_signal) stop_signal = g_stop_signal;  // in the last step's line or save: its end is a stop
    if (stop_signal) return train_interrupted(r, step, stop_signal);
    if (last && step != s.steps) return train_stopped(r, step);
    return -1;
}

// The steps after start_step up to --steps. Returns the exit status when the
// run ends early (a signal, --stop-after), -1 when it reached its last step.
static int train_loop(TrainRun* r) {
    train_loop_start(r);
    for (int step = r->start_step + 1; step <= r->s.steps; step++)
        if (int status = train_loop_step(r, step); status >= 0) return status;
    return -1;
}

// A signal before or during the final save or evaluation (one in the last
// step, its device time on the GPU, its line or its save, ends the run in
// train_loop_step): the run ends interrupted at its last step, as at any
// other, never with a "done" line from a cut-short evaluation. Its checkpoint
// is the last step's (a resumed run that took no step writes it into its
// --out again); --resume then saves the model and evaluates.
static int finish_interrupted(TrainRun* r) {
    if (r->run_steps == 0) save_checkpoint(r, r->s.steps);
    return train_interrupted(r, r->s.steps, g_stop_signal);
}

// The end of the run: DIR/model.safetensors (no optimiser state), the final
// evaluation (every test question; text: --eval-size windows) and the line
// "done: ...". The stop signals stay caught: one before or during the final
// save and evaluation ends the run as interrupted (finish_interrupted).
static int train_finish(TrainRun* r) {
    double seconds = (now_ms() - r->t_start) / 1000;
    if (g_stop_signal) return finish_interrupted(r);
    test_signal_at("model", r->s.steps);
    std::string err = model_save(&r->model, r->s.out + "/model.safetensors", train_meta(*r), false);
    if (!err.empty()) die("train", err + "; stopped: " + r->log.kept);
    if (g_stop_signal) return finish_interrupted(r);
    const Task& task = r->task;
    test_signal_at("eval", r->s.steps);
    evaluate(&r->model, task, r->s.steps, task.kind != "text" ? 0 : r->s.eval_size, &r->log, &r->val_loss, &r->acc);
    if (g_stop_signal) return finish_interrupted(r);
    printf("done: %s, %d steps in %s, val loss %.4f", model_name(r->c).c_str(), r->s.steps - r->start_step,
           duration_str(seconds).c_str(), r->val_loss);
    if (r->acc >= 0) printf(", accuracy %.1f%%", 100 * r->acc);
    printf("; wrote %s/model.safetensors\n", one_line(r->s.out).c_str());
    Json done;
    done.add_str("type", "done").add_num("seconds", seconds).add_num("val_loss", r->val_loss);
    if (r->acc >= 0) done.add_num("accuracy", r->acc);
    r->log.line(done);
    return 0;
}

// What a run is started from: its flags, and the checkpoint it resumes (if any).
struct TrainStart {
    std::vector<FlagSpec> flags = train_flags();
    Args a;
    Resumed resumed;
};
// The run up to its model: flags, task and data, the checks of its --out. Dies (one line) on a problem.
static void train_prepare(int argc, char** argv, TrainStart* st, TrainRun* run) {
    st->a = parse_args("train", TRAIN_HELP, st->flags, argc, argv, false);
    const std::set<std::string> user_flags = st->a.given;  // before a resumed run adds its own
    st->resumed = resume_flags(st->a, st->flags);          // the checkpoint's own flags, with the ones given now on top
    train_from_flags(st->a, user_flags, run);
    refuse_reused_out(st->a, st->resumed, *run);
}
// Then the model (fresh or resumed) and the output: from here on the run writes.
static void train_begin(TrainStart* st, TrainRun* run) {
    train_start_model(st->resumed, run);
    train_saved_args(st->a, st->flags, run);
    train_open_output(st->a.has("quiet"), run);
}
static int cmd_train(int argc, char** argv) {
    signal(SIGXFSZ, SIG_IGN);  // a file past ulimit -f: the write fails (EFBIG) and is reported, not a core dump
    TrainStart st;
    TrainRun run;
    train_prepare(argc, argv, &st, &run);
    train_begin(&st, &run);
    int status = train_loop(&run);
    if (status < 0) status = train_finish(&run);
    close(run.log.fd);
    model_free(&run.model);
    return status;
}

// ===========================================================================
// ./lime train-group: several runs in one process (compare --device gpu --jobs N)
// ===========================================================================
//
// Separate processes take turns on a GPU, so small runs side by side gain
// nothing; in one process each run keeps its own model, with its own stream,
// cuBLAS handle, activations and captured step, and the GPU runs their kernels
// at once. One host thread steps the runs in turn: run 1's step is queued, then
// run 2's, ..., and none waits for its device work except where it reads its
// loss (a log or a save). Each run is a ./lime train run: the same files, the
// same bits. While the thread works on a run, stdout and stderr are that run's
// DIR/train.out, and a run's end (a NaN, a full disk: exit in ./lime train)
// ends that run alone (RunEnded, through g_end_hook).
//   ./lime train-group [--fit] --run FD TRAIN-FLAGS... --run FD TRAIN-FLAGS...
// FD: the run's DIR/train.out, opened by compare. Every run's flags, data and
// directory are checked before any starts, and a problem in one starts none.
// Their GPU memory is counted before any model is made: all must fit, or with
// --fit (compare's default) as many run at once as fit, the next starting as one ends.

struct RunEnded { int status; };
static void throw_run_ended(int status) { throw RunEnded{status}; }

struct GroupRun {
    int fd = -1;                     // DIR/train.out
    std::vector<std::string> words;  // its train flags
    TrainStart st;
    TrainRun run;
    double need = 0;                 // bytes of GPU memory
    enum { WAITING, RUNNING, ENDED } state = WAITING;
    int status = 0;
};

// A run of the group has ended: its files closed, its lock let go, its model freed.
static void end_group_run(GroupRun* g, int status) {
    g->status = status;
    g->state = GroupRun::ENDED;
    if (g->run.log.fd >= 0) close(g->run.log.fd), g->run.log.fd = -1;
    if (g->run.lock_fd >= 0) close(g->run.lock_fd), g->run.lock_fd = -1;
    model_free(&g->run.model);
}

// stdout and stderr to fd (a run's output), what was written before flushed to where it was going.
static void output_to(int fd) {
    fflush(stdout);
    fflush(stderr);
    dup2(fd, 1);
    dup2(fd, 2);
}

// Runs f for run g with g's output, RunEnded caught: false (g ended, with its status) when f ended the run.
template <class F>
static bool as_run(GroupRun* g, F f) {
    output_to(g->fd);
    try {
        f();
        return true;
    } catch (const RunEnded& e) {
        g->status = e.status;
    } catch (const std::bad_alloc&) {
        fprintf(stderr, "lime train: error: out of memory (an allocation failed); free memory, or run fewer at once\n");
        g->status = 2;
    } catch (const std::exception& e) {
        fprintf(stderr, "lime train: error: %s\n", one_line(e.what()).c_str());
        g->status = 1;
    }
    end_group_run(g, g->status);
    return false;
}

// Run i's --out is an earlier run's directory (by any path: the same device
// and inode): refused as such (its lock would name the group's own pid as
// "another ./lime train").
static void refuse_shared_out(const std::vector<std::unique_ptr<GroupRun>>& runs, size_t i) {
    struct stat mine, theirs;
    if (stat(runs[i]->run.s.out.c_str(), &mine) != 0) return;  // lock_run_dir says why
    for (size_t j = 0; j < i; j++)
        if (runs[j]->run.lock_fd >= 0 && stat(runs[j]->run.s.out.c_str(), &theirs) == 0 &&
            mine.st_dev == theirs.st_dev && mine.st_ino == theirs.st_ino)
            die("train", "--out " + runs[i]->run.s.out + " is given to two runs of this group (runs " +
                             std::to_string(j + 1) + " and " + std::to_string(i + 1) + "); give each its own --out");
}

static int cmd_train_group(int argc, char** argv) {
    signal(SIGXFSZ, SIG_IGN);
    const char* usage = "usage: ./lime train-group [--fit] --run FD TRAIN-FLAGS... [--run FD TRAIN-FLAGS...]";
    bool fit = argc > 0 && !strcmp(argv[0], "--fit");
    std::vector<std::unique_ptr<GroupRun>> runs;
    for (int i = fit; i < argc; i++) {
        if (!strcmp(argv[i], "--run") && i + 1 < argc) {
            runs.push_back(std::make_unique<GroupRun>());
            char* end = nullptr;
            long fd = strtol(argv[++i], &end, 10);
            struct stat sb;
            if (*end || fd < 3 || fd > 1 << 20 || fstat((int)fd, &sb) != 0) die("train-group", std::string(usage) +
                                                                                 ": '" + argv[i] + "' is not an open file");
            runs.back()->fd = (int)fd;
        } else if (runs.empty()) {
            die("train-group", usage);
        } else {
            runs.back()->words.push_back(argv[i]);
        }
    }
    if (runs.empty()) die("train-group", usage);
    int out = dup(1), err = dup(2);  // the group's own, given back at the end
    g_end_hook = throw_run_ended;
    // every run prepared and its directory locked, before any starts
    std::string failed;
    for (auto& g : runs) {
        std::vector<char*> words;
        for (std::string& w : g->words) words.push_back(&w[0]);
        bool ok = as_run(g.get(), [&] {
            train_prepare((int)words.size(), words.data(), &g->st, &g->run);
            if (mkdir(g->run.s.out.c_str(), 0755) == 0 || errno == EEXIST) {
                refuse_shared_out(runs, &g - runs.data());
                g->run.lock_fd = lock_run_dir(g->run.s.out);
            }
            g->need = g->run.dev == DEVICE_GPU ? model_device_need(g->run.c, g->run.s.B, g->run.settings) : 0;
        });
        if (!ok && failed.empty()) {  // named by its --out, as given (its flags may not have been read)
            auto out = std::find(g->words.begin(), g->words.end(), "--out");
            failed = out != g->words.end() && out + 1 != g->words.end() ? *(out + 1)
                                                                         : "run " + std::to_string(&g - runs.data() + 1);
        }
    }
    GpuInfo gpu;
    double free_bytes = gpu_info(&gpu) ? (double)gpu.free_bytes : 0, all = 0, most = 0;
    for (auto& g : runs) all += g->need, most = std::max(most, g->need);
    int fits = 0;  // how many of the runs fit at once, the biggest first
    for (double used = 0; fits < (int)runs.size() && used + most <= free_bytes; fits++) used += most;
    for (auto& g : runs) {  // a run that does not fit alone: its own fix, as train would say it
        if (!failed.empty()) break;
        if (g->need <= free_bytes) continue;
        ModelSettings s = g->run.settings;  // (as gpu_create: auto takes flash attention where matmul's does not fit)
        if (s.attention == ATTENTION_AUTO && g->run.c.hd <= FLASH_MAX_HD) s.attention = ATTENTION_FLASH;
        double need = model_device_need(g->run.c, g->run.s.B, s);
        if (need > free_bytes)
            failed = "GPU memory: a run (--out " + g->run.s.out + ") needs " + fmt("%.2f GB", need / 1e9) + ", " +
                     fmt("%.2f GB", free_bytes / 1e9) + " is free; " +
                     memory_fix(g->run.c, g->run.s.B, s.flags,
                                [&](const Config& h, int hb) { return model_device_need(h, hb, s); });
    }
    if (failed.empty() && all > free_bytes && !fit && fits > 0)
        failed = "GPU memory: the " + std::to_string(runs.size()) + " runs need " + fmt("%.2f GB", all / 1e9) +
                 " together, " + fmt("%.2f GB", free_bytes / 1e9) + " is free: " + std::to_string(fits) +
                 " fit at once; use --jobs " + std::to_string(fits);
    if (!failed.empty()) {  // none starts: each says why
        for (auto& g : runs)
            if (g->state != GroupRun::ENDED) {
                output_to(g->fd);
                fprintf(stderr, "lime train: error: not started: %s\n", one_line(failed.find("GPU memory") == 0 ? failed
                                : "another run of this group could not start (" + failed + ": its train.out says why)").c_str());
                g->status = 2;
            }
        output_to(out), dup2(err, 2);
        return 2;
    }
    // stepped in turn; a waiting run starts when its memory is free
    int status = 0;
    for (;;) {
        double used = 0;
        bool any = false;
        for (auto& g : runs) used += g->state == GroupRun::RUNNING ? g->need : 0;
        for (auto& g : runs) {
            if (g->state == GroupRun::WAITING && !g_stop_signal && (used == 0 || used + g->need <= free_bytes) &&
                as_run(g.get(), [&] { train_begin(&g->st, &g->run), train_loop_start(&g->run); }))
                g->state = GroupRun::RUNNING, used += g->need;
            if (g->state != GroupRun::RUNNING) continue;
            any = true;
            int ended = -1;
            as_run(g.get(), [&] {  // its next step (done_step: the last taken, or the step it resumes at)
                int step = g->run.done_step + 1;
                if (step <= g->run.s.steps) ended = train_loop_step(&g->run, step);
                if (step >= g->run.s.steps && ended < 0) ended = train_finish(&g->run);
            });
            if (g->state == GroupRun::RUNNING && ended >= 0) end_group_run(g.get(), ended);  // as ./lime train ends
        }
        if (!any && std::none_of(runs.begin(), runs.end(), [](auto& g) { return g->state == GroupRun::WAITING; }))
            break;
        if (!any && g_stop_signal) break;  // the waiting ones are not started
    }
    for (auto& g : runs)
        if (g->state == GroupRun::WAITING) {  // a signal came before its turn
            output_to(g->fd);
            fprintf(stderr, "lime train: not started: the group was stopped (signal %d) before this run's turn\n",
                    (int)g_stop_signal);
            g->status = 128 + g_stop_signal;
        }
    for (auto& g : runs) status = std::max(status, g->status);
    output_to(out), dup2(err, 2);
    return status;
}

// ===========================================================================
// ./lime eval, sample, data
// ===========================================================================

// Scores one loaded checkpoint on the first n test examples (0: all): its
// fields go to *entry (json_write prints them), its table row is returned.
static std::string eval_one(const std::string& path, int n, Loaded* ld, Json* entry) {
    const Config& c = ld->model.c;
    Task& task = ld->task;
    std::string name = model_name(c);  // "lime", or with its router variant: "lime:last-2"
    entry->add_str("file", path).add_str("arch", arch_name(c.arch)).add_str("model", name).add_str("task", task.kind);
    double loss = mean_loss(&ld->model, *task.test, task.T, task.vocab.pad, n);
    entry->add_num("loss", loss);
    std::string file = one_line(path);  // the row is for a terminal
    if (task.kind == "prosqa") {
        Score sc = score_answers(&ld->model, task, n);
        entry->add_num("accuracy", sc.accuracy()).add_num("n", sc.n);
        return strf("%-6s %-40s prosqa accuracy %6.2f%% (%d/%d)  test loss %.4f", name.c_str(), file.c_str(),
                    100 * sc.accuracy(), sc.correct, sc.n, loss);
    }
    if (task.kind == "arith") {
        Score sc = score_answers(&ld->model, task, n);
        entry->add_num("ops", task.arith.s.ops).add_num("accuracy", sc.accuracy()).add_num("n", sc.n);
        // --format direct has no chain to check: no valid-chains figure, rather than a 0.00% that reads as a failure
        std::string chains = "n/a (--format direct)";
        if (task.arith.s.chain) {
            entry->add_num("valid_chains", (double)sc.valid_chains / std::max(1, sc.n));
            chains = strf("%6.2f%%", 100.0 * sc.valid_chains / std::max(1, sc.n));
        }
        return strf("%-6s %-40s tier %-3d accuracy %6.2f%% (%d/%d)  valid chains %s  test loss %.4f", name.c_str(),
                    file.c_str(), task.arith.s.ops, 100 * sc.accuracy(), sc.correct, sc.n, chains.c_str(), loss);
    }
    entry->add_num("perplexity", std::exp(loss));
    return strf("%-6s %-40s val loss %.4f  perplexity %.3f", name.c_str(), file.c_str(), loss, std::exp(loss));
}

// The scores: one row per checkpoint, or with --json one object (keyed by
// file; a single checkpoint's object alone), written by json_write.
static void print_eval(const Json& json, const std::vector<std::string>& rows, bool as_json) {
    if (!as_json) {
        for (const std::string& r : rows) printf("%s\n", r.c_str());
    } else if (json.obj.size() == 1) {
        printf("%s\n", json_write(json.obj[0].second).c_str());
    } else {
        printf("%s\n", json_write(json).c_str());
    }
}

// One file given twice, by any path (./m and m, a symlink, a hard link: the
// same device and inode), is refused: each checkpoint is scored once.
static void refuse_same_file_twice(const std::vector<std::string>& paths) {
    std::map<std::pair<dev_t, ino_t>, std::string> seen;  // each file, by the first path that names it
    for (const std::string& path : paths) {
        struct stat sb;
        if (stat(path.c_str(), &sb) != 0) continue;  // load_checkpoint says why it cannot be read
        auto [at, fresh] = seen.insert({{sb.st_dev, sb.st_ino}, path});
        if (!fresh)
            die("eval", "--load " + path + " is given twice (--load " + at->second + " is the same file); give "
                        "each checkpoint once");
    }
}

static int cmd_eval(int argc, char** argv) {
    std::vector<FlagSpec> flags = {
        {"load", "", "a checkpoint (repeat --load to compare models side by side)", true},
        {"n", "0", "score only the first N test examples (0: all)"},
        {"batch", "128", "sequences per forward"},
        {"json", nullptr, "print one JSON object"},
        {"threads", "0", "OpenMP threads (0: all cores; at most 4 x the cores)"},
        {"device", "auto", "auto, cpu or gpu"},
        {"tf32", "1", "gpu: TF32 tensor cores for the matrix products (0: plain float32)"},
        PRECISION_FLAG,
        ATTENTION_FLAG,
    };
    std::string about = "Scores checkpoints of any model (" + model_names() + ") on their task: arith accuracy by "
                        "greedy decoding, text loss and perplexity.";
    Args a = parse_args("eval", about.c_str(), flags, argc, argv, false);
    set_threads(a);
    Device dev = pick_device(a);
    ModelSettings settings = model_settings(a);
    int n = (int)a.integer("n", 0, 1 << 30);
    int B = (int)a.integer("batch", 1, 1 << 16);
    if (!a.err.empty()) die("eval", a.err);
    if (!a.has("load")) die("eval", "needs --load FILE (a model.safetensors written by ./lime train)");
    const std::vector<std::string>& paths = a.values["load"];
    refuse_same_file_twice(paths);
    Json json;
    std::vector<std::string> rows;
    for (const std::string& path : paths) {
        Loaded ld;
        std::string err = load_checkpoint(path, dev, settings, B, &ld, true);
        if (err.size()) die("eval", err);
        warn_data_changed("eval", ld);
        Json entry;
        rows.push_back(eval_one(path, n, &ld, &entry));
        json.add(path, entry);
        model_free(&ld.model);
    }
    print_eval(json, rows, a.has("json"));
    return 0;
}

static int cmd_sample(int argc, char** argv) {
    std::vector<FlagSpec> flags = {
        {"load", "", "a checkpoint written by ./lime train"},
        {"prompt", "", "the text to continue, in the task's tokens, e.g. \"3 + 4 * 2 =\""},
        {"max-new", "100", "at most this many new tokens"},
        {"temperature", "0", "0: greedy; > 0: sample from softmax(logits / temperature)"},
        {"seed", "1", "for sampling"},
        {"threads", "0", "OpenMP threads (0: all cores; at most 4 x the cores)"},
        {"device", "auto", "auto, cpu or gpu"},
    };
    Args a = parse_args("sample", "Continues a prompt with a trained model until <eos>; the continuation is the last "
                        "line.", flags, argc, argv, false);
    set_threads(a);
    Device dev = pick_device(a);
    int max_new = (int)a.integer("max-new", 1, 1 << 20);
    float temperature = (float)a.number("temperature", 0, 100);
    Rng rng((uint64_t)a.integer("seed", 0, (long long)1 << 62));
    if (!a.err.empty()) die("sample", a.err);
    if (!a.has("load")) die("sample", "needs --load FILE (a model.safetensors written by ./lime train)");
    if (!a.has("prompt")) die("sample", "needs --prompt TEXT, e.g. --prompt \"3 + 4 * 2 =\"");
    Loaded ld;
    std::string err = load_checkpoint(a.str("load"), dev, model_settings(a), 1, &ld, false);
    if (!err.empty()) die("sample", err);
    warn_data_changed("sample", ld);
    const Vocab& vocab = ld.task.vocab;
    bool prosqa = ld.task.kind == "prosqa";
    std::vector<std::vector<int>> seqs(1);
    err = prosqa ? prosqa_tokenize(vocab, a.str("prompt"), &seqs[0]) : vocab.encode(a.str("prompt"), &seqs[0]);
    if (!err.empty()) die("sample", "--prompt: " + err);
    if (seqs[0].empty()) die("sample", "--prompt is empty");
    for (int id : seqs[0])  // <eos> would end the continuation before it starts, <pad> is no text
        if (!vocab.bytes && (id == vocab.eos || id == vocab.pad))
            die("sample", "--prompt holds " + vocab.tokens[id] + ", a special token (the end of a sequence or "
                          "padding), not text; give the prompt without it");
    if ((int)seqs[0].size() > ld.model.c.T)
        die("sample", "--prompt has " + std::to_string(seqs[0].size()) + " tokens; the model reads at most " +
                          std::to_string(ld.model.c.T));
    size_t prompt = seqs[0].size();
    generate(&ld.model, vocab, &seqs, max_new, temperature, &rng);
    std::vector<int> gen(seqs[0].begin() + prompt, seqs[0].end());
    if (!gen.empty() && gen.back() == vocab.eos) gen.pop_back();
    std::string text = prosqa ? prosqa_detokenize(vocab, gen.data(), (int)gen.size())
                              : vocab.decode(gen.data(), (int)gen.size());
    printf("%s\n", one_line(text).c_str());  // the last line, control bytes escaped as in data
    model_free(&ld.model);
    return 0;
}

static int cmd_data(int argc, char** argv) {
    std::vector<FlagSpec> flags = concat({TASK_FLAGS, {
        {"split", "train", "train or test"},
        {"n", "10", "how many examples to print"},
        {"seq-len", "128", "text: T, positions per window"},
    }});
    Args a = parse_args("data", "Prints generated examples, one per line, exactly as the model sees them.", flags,
                        argc, argv, false);
    std::map<std::string, std::string> ts = task_settings(a);
    std::string split = a.choice("split", {"train", "test"});
    int n = (int)a.integer("n", 0, 1 << 30);
    int T = (int)a.integer("seq-len", 2, 1 << 16);
    if (!a.err.empty()) die("data", a.err);
    Task t;
    std::string err = task_build(ts, T, &t, memory_available("/proc/meminfo"), split == "train");
    if (!err.empty()) die("data", err);
    const std::vector<Sequence>& seqs = split == "train" ? *t.train : *t.test;
    for (int i = 0; i < n && i < (int)seqs.size(); i++) {
        const std::vector<int>& tok = seqs[i].tokens;
        // a text example holds any bytes: a NUL, a newline or an escape sequence is written escaped (one_line)
        printf("%s\n", one_line(t.kind == "prosqa" ? prosqa_detokenize(t.vocab, tok.data(), (int)tok.size())
                                                  : t.vocab.decode(tok.data(), (int)tok.size())).c_str());
    }
    return 0;
}

// ===========================================================================
// ./lime export: a llama checkpoint as a transformers model directory (support/commands/export.cpp)
// ===========================================================================

static int cmd_export(int argc, char** argv) {
    std::vector<FlagSpec> flags = {
        {"load", "", "a llama checkpoint written by ./lime train (a model.safetensors)"},
        {"out", "", "the directory to write (created; refused if it holds files, unless --force)"},
        {"force", nullptr, "write into a directory that holds files, replacing the export's own files there"},
    };
    std::string others;  // transformers' LlamaForCausalLM holds llama alone
    for (const ModelEntry& m : model_registry()) others += std::string(m.name) == "llama" ? "" : std::string(" ") + m.name;
    std::string about = "Writes a llama checkpoint as a Hugging Face transformers model directory:\n"
                        "config.json, model.safetensors, generation_config.json and a tokenizer that gives the "
                        "trainer's ids. The other models have no transformers model:" + others + ".";
    Args a = parse_args("export", about.c_str(), flags, argc, argv, false);
    if (!a.err.empty()) die("export", a.err);
    if (!a.has("load")) die("export", "needs --load FILE (a model.safetensors written by ./lime train --arch llama)");
    if (!a.has("out") || a.str("out").empty()) die("export", "needs --out DIR (the directory to write)");
    std::string err = hf_export(a.str("load"), a.str("out"), a.has("force"));
    if (!err.empty()) die("export", err);
    printf("wrote %s: config.json, model.safetensors, generation_config.json, tokenizer.json, "
           "tokenizer_config.json, special_tokens_map.json\n", one_line(a.str("out")).c_str());
    return 0;
}

// ===========================================================================

// On stdout when asked for (--help), on stderr with exit status 2 when no command is given.
static void usage(FILE* f) {
    fprintf(f, "usage: ./lime COMMAND [flags]   (./lime COMMAND --help for its flags)\n\n"
           "  train    train one model (below) on a task\n"
           "  eval     score checkpoints on their task (side by side with several --load)\n"
           "  sample   continue a prompt with a trained model\n"
           "  data     print generated examples as the model sees them\n"
           "  verify   check the implementation against reference vectors\n"
           "  bench    time training steps of llama beside the others\n"
           "  compare  train both models for several seeds; report with statistics and figures\n"
           "  analyze  router heatmap, value entropy per layer and cost of a checkpoint\n"
           "  export   write a llama checkpoint as a Hugging Face transformers model directory\n"
           "\nthe models (--arch; compare names variants as lime:frozen, hc:n2, llama:ereg=0.1):\n%s",
           models_table().c_str());
}

static int run_command(int argc, char** argv);

// Every allocation a file or a flag sizes is checked first where it can be
// (model_create, the readers' limits); any other that fails ends the command
// with one line, not an abort (std::bad_alloc: exit status 134).
int main(int argc, char** argv) {
    set_wait_policy(argv);  // first: it may run ./lime again (support/lib/cli.h)
    try {
        return run_command(argc, argv);
    } catch (const std::bad_alloc&) {
        fflush(stdout);
        fprintf(stderr, "lime %s: error: out of memory (an allocation failed); free memory, raise ulimit -v, or give "
                "smaller sizes or files\n", argc > 1 ? one_line(argv[1]).c_str() : "");
        return 2;
    } catch (const std::exception& e) {
        fflush(stdout);
        fprintf(stderr, "lime %s: error: %s\n", argc > 1 ? one_line(argv[1]).c_str() : "", one_line(e.what()).c_str());
        return 1;
    }
}

static int run_command(int argc, char** argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    std::string bad = registry_check();  // a row without a required hook: refused before any command runs
    if (!bad.empty()) return fprintf(stderr, "lime: the registry of models (support/model/models.h): %s\n", bad.c_str()), 2;
    std::string cmd = argv[1];
    int n = argc - 2;
    char** rest = argv + 2;
    if (cmd == "train") return cmd_train(n, rest);
    if (cmd == "train-group") return cmd_train_group(n, rest);  // compare's (not listed: compare --help says how)
    if (cmd == "eval") return cmd_eval(n, rest);
    if (cmd == "sample") return cmd_sample(n, rest);
    if (cmd == "data") return cmd_data(n, rest);
    if (cmd == "verify") return cmd_verify(n, rest);
    if (cmd == "bench") return cmd_bench(n, rest);
    if (cmd == "compare") return cmd_compare(n, rest);
    if (cmd == "analyze") return cmd_analyze(n, rest);
    if (cmd == "export") return cmd_export(n, rest);
    fprintf(stderr, "lime: unknown command '%s'; commands: train eval sample data verify bench compare analyze "
            "export (./lime --help)\n", one_line(cmd).c_str());
    return 2;
}
