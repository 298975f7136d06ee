// support/commands/compare.cpp — `./lime compare`: LLaMa and LIMe side by side, honestly.
//
// Each (tier, model, seed) is one `./lime train` run in its own directory,
// and on a CPU its own process; on a GPU --jobs runs share one process
// (./lime train-group, train.cpp), so that their kernels run side by side.
// compare runs them (several at a time), reads their
// JSONL logs, and writes DIR/report.md and figures: per model and tier the
// mean, std and every seed's value; LIMe minus LLaMa with a 95% confidence
// interval and Welch's t-test; parameters, FLOPs per token (router counted),
// step time and peak memory. Seed s gives both models the same data order
// and the same initial values for every tensor they share (model_init draws
// each tensor from a stream named by the seed and the tensor's name).
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>  // PR_SET_PDEATHSIG: a run ends with compare
#endif

#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "support/lib/cli.h"
#include "support/model/names.h"
#include "support/model/lime.h"
#include "support/lib/plot.h"
#include "support/lib/safetensors.h"
#include "support/lib/stats.h"
#include "support/commands/commands.h"

// ---------------------------------------------------------------------------
// Presets: the train flags of each run, the tiers and the number of seeds.

// A tier of a preset that has its own seeds, models and train flags (the
// reviewers' study: tier 4 runs longer, with fewer models and seeds).
struct TierPlan {
    const char* tier;
    int seeds;
    const char* archs;       // the tier's models
    const char* train_args;  // added after the preset's: a flag given twice takes the later value
};
struct Preset {
    const char* name;
    const char* train_args;  // passed to every ./lime train
    const char* tiers;       // operators per question, comma-separated
    int seeds;
    const char* about;
    const TierPlan* plans = nullptr;  // a tier's own seeds, models and flags, where it has them
    int n_plans = 0;
    const char* lr_grid = nullptr;    // --lr-grid's default, where the preset picks each model's rate
};

// The reviewers' study (ICLR 2026: LIMe against the peers they named, more
// seeds, corrected tests): cpu-study's setting at tier 3, 12 seeds of eleven
// models (MUDDFormer, MUDD-KV and DeepCrossAttention the last peers added); and tier 4, where a single LLaMa run of 6 epochs (seed 1) leaves
// chance, 6 seeds of six models.
static const TierPlan REVIEWERS_PLANS[] = {
    {"3", 12, "llama,lime,lime:frozen,lime:same-head,hc,resformer,denseformer,muddformer,muddformer:kv,dca,llama:ereg=0.1",
     ""},
    {"4", 6, "llama,lime,hc,resformer,denseformer,llama:ereg=0.1", "--epochs 6"},
};

static const Preset PRESETS[] = {
    {"classroom",
     "--layers 4 --dim 32 --heads 4 --ops 3 --train-size 20000 --test-size 500 --batch 64 --epochs 15 --lr 3e-3",
     "3", 10, "two-core CPU, about 10 minutes: tier 3, 10 seeds per model"},
    {"paper-aet",
     "--layers 4 --dim 32 --heads 4 --ffn 96 --train-size 50000 --test-size 1000 --batch 128 --epochs 200 --lr 1e-3 "
     "--schedule linear",
     "4,5,6", 5, "the paper's arithmetic setting (docs/tasks.md 1), for a GPU: tiers 4, 5, 6, 5 seeds per model"},
    {"cpu-study",
     "--layers 4 --dim 32 --heads 4 --train-size 20000 --test-size 500 --batch 64 --epochs 12 --lr 3e-3",
     "3", 6, "two-core CPU: tier 3, 12 epochs, 6 seeds each of LLaMa, LIMe and the frozen-router control"},
    // the referee's causal test: cpu-study's setting, llama with the value-entropy
    // regulariser at three lambdas chosen by single runs (seed 1; docs/results.md): its
    // last-layer raw value entropy from LLaMa's own level (2.28) through LIMe's (2.37) and beyond
    {"referee",
     "--layers 4 --dim 32 --heads 4 --train-size 20000 --test-size 500 --batch 64 --epochs 12 --lr 3e-3",
     "3", 6, "two-core CPU, about an hour: cpu-study's setting, llama and lime and llama at three entropy-regulariser lambdas"},
    {"reviewers",
     "--layers 4 --dim 32 --heads 4 --train-size 20000 --test-size 500 --batch 64 --epochs 12 --lr 3e-3",
     "3,4", 12, "two-core CPU, about 4 hours: the reviewers' study, LIMe against ResFormer, DenseFormer, HC, "
     "MUDDFormer (and MUDD-KV), DeepCrossAttention, the same-head router, frozen routers and the regulariser, tier 3 "
     "with 12 seeds and tier 4 with 6",
     REVIEWERS_PLANS, 2},
    // how fast each model learns (issue 60): cpu-study's setting run 3 times as long (LLaMa seed 2, stalled
    // at 12 epochs, learned by 36), each model at its own rate of three, picked on tuning seeds 101 and 102
    {"learning-speed",
     "--layers 4 --dim 32 --heads 4 --train-size 20000 --test-size 500 --batch 64 --epochs 36 --lr 3e-3",
     "3", 8, "two-core CPU, about 4 hours: how fast each model learns, tier 3 for 36 epochs, each model at its own "
     "rate of 2e-3, 3e-3 and 5e-3 (picked on tuning seeds 101, 102), 8 seeds of llama, lime, lime:frozen, hc, "
     "resformer, denseformer, muddformer, muddformer:kv, dca, llama:ereg=0.1", nullptr, 0, "2e-3,3e-3,5e-3"},
    {"tiny", "--layers 2 --dim 16 --heads 2 --ffn 32 --train-size 300 --test-size 20 --batch 16 --steps 30", "2", 2,
     "seconds: for tests"},
};

// A preset's own plan for a tier, or nullptr.
static const TierPlan* plan_of(const Preset* p, const std::string& tier) {
    for (int i = 0; p && i < p->n_plans; i++)
        if (tier == p->plans[i].tier) return &p->plans[i];
    return nullptr;
}

// The models a preset compares when --archs is not given.
static const char* preset_archs(const Preset& p) {
    if (p.n_plans) return p.plans[0].archs;  // the first tier's: every planned tier's models are among them
    if (std::string(p.name) == "referee") return "llama,lime,llama:ereg=0.002,llama:ereg=0.01,llama:ereg=0.1";
    if (std::string(p.name) == "learning-speed")
        return "llama,lime,lime:frozen,hc,resformer,denseformer,muddformer,muddformer:kv,dca,llama:ereg=0.1";
    return std::string(p.name) == "cpu-study" ? "llama,lime,lime:frozen" : "llama,lime";
}

// Train's flags that compare sets itself, for each run or from its own
// flags, and how to give them to compare instead: each is refused in
// --train-args before any run starts. (A new kind of model is a new spelling
// of --archs, in model_parse; a train flag it needs is one more line here.)
static const struct { const char* flag; const char* instead; } SET_BY_COMPARE[] = {
    {"task", "compare's --task"},
    {"ops", "compare's --tiers, e.g. --tiers 4,5,6"},
    {"seed", "compare's --seeds"},
    {"out", "compare's --out"},
    {"threads", "compare's --jobs (each run gets the cores / --jobs threads)"},
    {"device", "compare's --device"},
    {"quiet", "nothing: each run's output goes to its train.out"},
    {"force", "nothing: compare replaces only the runs of its own --out"},
    {"arch", "--archs, e.g. --archs llama,lime,hc"},
    {"router", "--archs lime:VARIANT, e.g. --archs llama,lime:last-2"},
    {"router-kv", "--archs lime:separate"},
    {"router-weights", "--archs lime:frozen"},
    {"router-heads", "--archs lime:same-head"},
    {"hc-rate", "--archs hc:nN, e.g. --archs llama,hc:n2"},
    {"hc-dynamic", "--archs hc:static"},
    {"mudd-ways", "--archs muddformer:kv"},
    {"entropy-reg", "--archs MODEL:ereg=LAMBDA, e.g. --archs llama:ereg=0.5"},
    {"stop-after", "Ctrl-C (each run saves a checkpoint, then compare --reuse keeps the finished runs); compare "
                   "starts each run afresh and runs it to its end"},
    {"resume", "compare --reuse (it keeps the finished runs); compare starts each run afresh and runs it to its end"},
};

static const Preset* find_preset(const std::string& name) {
    for (const Preset& p : PRESETS) if (name == p.name) return &p;
    return nullptr;
}

static std::vector<std::string> split(const std::string& s, char sep) {
    std::vector<std::string> out;
    std::string cur;
    std::istringstream in(s);
    while (std::getline(in, cur, sep)) if (!cur.empty()) out.push_back(cur);
    return out;
}

// The preset's train flags with a planned tier's replacing those of the same name
// (both "--flag value" pairs, space-separated).
static std::string tier_train_args(const Preset& p, const TierPlan& plan) {
    std::vector<std::string> base = split(p.train_args, ' '), over = split(plan.train_args, ' ');
    std::string out;
    for (size_t i = 0; i + 1 < base.size(); i += 2) {
        bool replaced = false;
        for (size_t j = 0; j + 1 < over.size(); j += 2) replaced |= over[j] == base[i];
        if (!replaced) out += (out.empty() ? "" : " ") + base[i] + " " + base[i + 1];
    }
    return out + (plan.train_args[0] ? " " : "") + plan.train_args;
}

// --train-args as the shell would split it: words between blanks, 'single'
// and "double" quotes (in which \" \\ \$ and \` are escapes), a backslash
// quoting the next character outside them; so a path with a space can be
// given ("--text-file 'my notes.txt'"). "" or the problem.
static std::string shell_words(const std::string& s, std::vector<std::string>* out) {
    out->clear();
    std::string word;
    bool in_word = false;
    for (size_t i = 0; i < s.size(); i++) {
        char c = s[i];
        if (c == ' ' || c == '\t' || c == '\n') {
            if (in_word) out->push_back(word), word.clear(), in_word = false;
            continue;
        }
        in_word = true;
        if (c == '\\') {
            if (++i == s.size()) return "it ends in a backslash, which quotes nothing";
            word += s[i];
        } else if (c == '\'') {
            size_t end = s.find('\'', i + 1);
            if (end == std::string::npos) return "a ' is never closed";
            word += s.substr(i + 1, end - i - 1);
            i = end;
        } else if (c == '"') {
            for (i++; i < s.size() && s[i] != '"'; i++) {
                if (s[i] == '\\' && i + 1 < s.size() && std::string("\"\\$`").find(s[i + 1]) != std::string::npos) i++;
                word += s[i];
            }
            if (i == s.size()) return "a \" is never closed";
        } else {
            word += c;
        }
    }
    if (in_word) out->push_back(word);
    return "";
}

// A word as the shell would read it back: quoted when it holds anything but
// letters, digits and -_./=:,+ (the report's `./lime train ...` line).
static std::string shell_quote(const std::string& w) {
    if (!w.empty() && w.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+") ==
                          std::string::npos)
        return w;
    std::string q = "'";
    for (char c : w) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

// ---------------------------------------------------------------------------
// One run: a child process, its log, its results.

struct Run {
    std::string arch, tier, dir;
    int seed = 0;
    pid_t pid = 0;
    int trained_with = 0;  // the other runs in its process (a GPU group), whose steps its times include
    int status = -1;
    double max_rss_mb = 0, seconds = 0;
    // read from DIR/log.jsonl (read_log), every number checked
    int layers = 0;
    std::map<std::string, std::string> args;  // the config line's "args": the train flags it ran with
    double accuracy = NAN, val_loss = NAN, ms_per_step = NAN, params = NAN, flops_per_token_ = NAN, tokens_per_step = 0;
    std::vector<double> steps, losses;            // training loss curve
    std::vector<double> eval_steps, eval_losses;  // validation loss curve
    std::vector<double> curve_steps, curve_acc;   // the learning curve: each evaluation's accuracy (train --curve)
    std::string lr;                               // --lr-grid: the run's own --lr ("": the runs' flags')
    std::map<std::string, std::vector<double>> entropy;  // from DIR/entropy.tsv: kind -> mean per layer
    enum Stage { WAITING, TRAINING, TRAINED, ANALYSING, DONE } stage = WAITING;
    std::string failure;  // a failed training or analysis: how it ended and where its last words are
};

// DIR/CMD.out opened for a child to write: truncated (never an earlier run's
// words), a symlink there refused. -1, and *why, when it cannot be written.
static int open_run_output(const std::string& path, std::string* why) {
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) *why = "cannot write " + path + ": " + strerror(errno);
    return fd;
}

// Forks and runs `all` (this program, then its words) as a child with stdout
// and stderr on out_fd, and the descriptors in keep left open across exec (a
// train-group's runs' outputs). The child dies with compare: PR_SET_PDEATHSIG
// sends it SIGTERM when compare ends, even by SIGKILL (train then saves a
// checkpoint and stops), so no run is left behind. The pid, or 0 (*why says why).
static pid_t spawn(const std::string& self, std::vector<std::string> all, int out_fd, const std::vector<int>& keep,
                   std::string* why) {
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        // a process group of its own: a Ctrl-C at the terminal reaches compare
        // alone, which forwards it once (twice would end the run unsaved)
        setpgid(0, 0);
#ifdef __linux__
        prctl(PR_SET_PDEATHSIG, SIGTERM);
#endif
        if (getppid() != parent) _exit(128 + SIGTERM);  // compare ended before the line above took effect
        signal(SIGPIPE, SIG_DFL);  // compare ignores it (its stdout may close); a run starts as any program does
        for (int fd : keep) fcntl(fd, F_SETFD, 0);
        dup2(out_fd, 1);
        dup2(out_fd, 2);
        std::vector<char*> argv;
        for (std::string& a : all) argv.push_back(&a[0]);
        argv.push_back(nullptr);
        execv(self.c_str(), argv.data());
        dprintf(2, "lime compare: cannot run %s: %s\n", one_line(self).c_str(), strerror(errno));
        _exit(127);
    }
    if (pid < 0) *why = std::string("cannot start a process: ") + strerror(errno);
    return pid < 0 ? 0 : pid;
}

// Starts ./lime CMD ARGS (train, then analyze) as a child whose output goes to
// DIR/CMD.out; when that cannot be written the run is not started (0, *why says so).
static pid_t start_run(const std::string& self, const Run& r, const char* cmd, const std::vector<std::string>& args,
                       std::string* why) {
    int fd = open_run_output(r.dir + "/" + cmd + ".out", why);
    if (fd < 0) return 0;
    std::vector<std::string> all = {self, cmd};
    all.insert(all.end(), args.begin(), args.end());
    pid_t pid = spawn(self, all, fd, {}, why);
    close(fd);
    return pid;
}

// How a child ended, from its wait status: "exit status 2", or the signal by
// name (SIGKILL, the out-of-memory killer's, with that hint).
static std::string how_it_ended(int status) {
    if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
    if (!WIFSIGNALED(status)) return "ended with wait status " + std::to_string(status);
    int sig = WTERMSIG(status);
    std::string name = sig == SIGKILL ? "SIGKILL" : sig == SIGTERM ? "SIGTERM" : sig == SIGSEGV ? "SIGSEGV"
                       : sig == SIGABRT ? "SIGABRT" : sig == SIGINT ? "SIGINT" : sig == SIGBUS ? "SIGBUS"
                                                                                  : strsignal(sig);
    return "killed by signal " + std::to_string(sig) + " (" + name + (sig == SIGKILL ? ": out of memory?" : "") + ")";
}

// Where a failed child's last words are: the last line of DIR/CMD.out, or that it is empty.
static std::string last_words(const std::string& path) {
    int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return one_line(path) + " cannot be read (" + strerror(errno) + ")";
    off_t size = lseek(fd, 0, SEEK_END);
    std::string tail(size > 0 ? (size_t)std::min<off_t>(size, 4096) : 0, '\0');
    ssize_t n = size > 0 ? pread(fd, &tail[0], tail.size(), size - (off_t)tail.size()) : 0;
    close(fd);
    tail.resize(n > 0 ? (size_t)n : 0);
    while (!tail.empty() && (tail.back() == '\n' || tail.back() == '\r')) tail.pop_back();
    if (tail.empty())
        return one_line(path) + " is empty (the run wrote nothing, or it could not be written: is the disk full?)";
    std::string last = one_line(tail.substr(tail.find_last_of('\n') + 1));
    if (last.size() > 300) last = last.substr(0, 300) + "...";
    return "its last line: \"" + last + "\" (" + one_line(path) + ")";
}

// ---------------------------------------------------------------------------
// A run's files read back. Every number is checked before it reaches the
// report: a file altered or damaged (an accuracy of 7.5, a negative or
// infinite loss, a layer past the model's) is named with the value, never
// averaged in.

// One file being read: where the reader is, and the first problem found.
struct FileCheck {
    std::string path;
    int line = 0;
    std::string err;
    void fail(const std::string& what) {
        if (err.empty()) err = one_line(path) + " line " + std::to_string(line) + ": " + what;
    }
    // j[key], a number in [lo, hi]; NaN when it is missing (a problem when required) or out of range
    double number(const Json& j, const char* key, double lo, double hi, bool required = true) {
        const Json* v = j.get(key);
        if (!v) {
            if (required) fail(std::string("no \"") + key + "\"");
            return NAN;
        }
        if (v->kind == Json::NUM && v->num >= lo && v->num <= hi) return v->num;
        std::string range = std::isinf(hi) ? (std::isinf(lo) ? "a finite number" : fmt("a finite number >= %g", lo))
                                           : fmt("a number in [%g, ", lo) + fmt("%g]", hi);
        fail(std::string("\"") + key + "\" " + json_dump(*v) + " is not " + range);
        return NAN;
    }
};
const double ENTROPY_MAX = 64;  // a Renyi entropy is at most log(positions): under 22 nats for 2^31
const double LOG_MAX_BYTES = 256.0 * (1 << 20);  // a run's log is kilobytes; a file past this is not one

// DIR/log.jsonl, written by ./lime train: the config line (parameters, FLOPs
// per token, tokens per step), the training and validation loss curves, and
// the done line's accuracy and validation loss. *done: the run finished: its
// last line is a done line right after the final evaluation's own line (a
// run stopped in its final evaluation ends with an "interrupted" line; an
// older ./lime logged "done" there with the cut-short evaluation's zeros and
// no eval line), whose numbers it repeats. "" or the first problem, naming
// the file, the line and the value.
static std::string read_log(Run* r, const std::string& task, bool* done) {
    FileCheck fc;
    fc.path = r->dir + "/log.jsonl";
    *done = false;
    struct stat sb;
    if (stat(fc.path.c_str(), &sb) == 0 && sb.st_size > LOG_MAX_BYTES)
        return one_line(fc.path) + " is over 256 MiB: not a log of ./lime train";
    std::ifstream in(fc.path);
    Config model;
    model_parse(r->arch, &model);
    double lowest_loss = model.entropy_reg > 0 ? -INFINITY : 0;  // the regularised loss may be negative
    double ms_sum = 0;
    int ms_n = 0;
    std::string line, before;          // before: the kind of the line before
    double eval_loss = 0, eval_acc = 0;  // the last eval line's
    while (fc.err.empty() && std::getline(in, line)) {
        fc.line++;
        Json j;
        if (!json_parse(line, &j).empty() || j.kind != Json::OBJ) { fc.fail("not a JSON object"); break; }
        const Json* type = j.get("type");
        std::string kind = type && type->kind == Json::STR ? type->str : "";
        *done = false;  // a line after a done line: the run went on (resumed), and has not finished again
        if (kind == "config") {
            r->params = fc.number(j, "params", 1, 1e15);
            const Json* cfg = j.get("config");
            Config c;
            std::string why = cfg ? config_from_json(json_dump(*cfg), &c) : "no \"config\"";
            if (!why.empty()) { fc.fail(why); break; }
            r->layers = c.L;
            r->flops_per_token_ = flops_per_token(c, c.T);
            const Json* args = j.get("args");
            for (const auto& [k, v] : args ? args->obj : std::vector<std::pair<std::string, Json>>())
                if (v.kind == Json::STR) r->args[k] = v.str;
            const Json* batch = args ? args->get("batch") : nullptr;
            double B = batch && batch->kind == Json::STR ? atof(batch->str.c_str()) : 0;
            if (!(B >= 1 && B <= (1 << 20))) fc.fail("\"args\" has no \"batch\" of 1 .. 1048576");
            r->tokens_per_step = B * c.T;
        } else if (kind == "train") {
            double step = fc.number(j, "step", 1, (double)MAX_STEPS);
            if (!r->steps.empty() && !(step > r->steps.back())) fc.fail("\"step\" does not come after the line before");
            r->steps.push_back(step);
            r->losses.push_back(fc.number(j, "loss", lowest_loss, INFINITY));
            double ms = fc.number(j, "ms_per_step", 0, INFINITY);
            if (r->steps.size() > 1) ms_sum += ms, ms_n++;  // the first line's speed includes the start-up
        } else if (kind == "eval") {
            r->eval_steps.push_back(fc.number(j, "step", 1, (double)MAX_STEPS));
            r->eval_losses.push_back(eval_loss = fc.number(j, "val_loss", 0, INFINITY));
            eval_acc = fc.number(j, "accuracy", 0, 1, false);
            if (std::isfinite(eval_acc)) r->curve_steps.push_back(r->eval_steps.back()), r->curve_acc.push_back(eval_acc);
        } else if (kind == "done") {
            r->val_loss = fc.number(j, "val_loss", 0, INFINITY);
            r->accuracy = fc.number(j, "accuracy", 0, 1, task != "text");
            *done = before == "eval";
            bool same_acc = r->accuracy == eval_acc || (std::isnan(r->accuracy) && std::isnan(eval_acc));
            if (*done && (r->val_loss != eval_loss || !same_acc))
                fc.fail("the done line's numbers are not the final evaluation's, on the line before");
        }
        before = kind;
    }
    if (fc.err.empty() && fc.line > 0 && r->layers == 0) fc.fail("no config line: not a log of ./lime train");
    r->ms_per_step = ms_n ? ms_sum / ms_n : NAN;
    return fc.err;
}

// DIR/entropy.tsv, written by ./lime analyze: kind, layer, mean, std and the
// Renyi order alpha of each row. "" when read, with every kind's every layer
// once (routed for lime and resformer only). *stale when it is missing or holds another
// analysis than this compare's (another --alpha, an older ./lime's four
// columns): compare then analyses the run again.
static std::string read_entropy(Run* r, double alpha, bool* stale) {
    FileCheck fc;
    fc.path = r->dir + "/entropy.tsv";
    std::ifstream in(fc.path);
    std::string line;
    *stale = !std::getline(in, line) || line != "kind\tlayer\tmean\tstd\talpha";
    if (*stale) return "";
    r->entropy.clear();
    Config model;
    model_parse(r->arch, &model);
    model.L = r->layers;  // a peer mixes values by its layers (resformer: from layer 1)
    std::set<std::string> kinds = {"raw", "hidden"};
    if (mixes_values(model)) kinds.insert("routed");
    for (fc.line = 2; fc.err.empty() && std::getline(in, line); fc.line++) {
        std::istringstream row(line);
        std::string kind, extra;
        double layer = NAN, mean = NAN, sd = NAN, a = NAN;
        if (!(row >> kind >> layer >> mean >> sd >> a) || (row >> extra)) { fc.fail("not 5 columns"); break; }
        std::vector<double>& v = r->entropy[kind];
        if (!kinds.count(kind))
            fc.fail("kind '" + one_line(kind) + "' is not one of raw, routed (lime, resformer), hidden");
        else if (!(layer >= 0 && layer < r->layers && layer == std::floor(layer)))
            fc.fail(fmt("layer %g is not one of the model's layers", layer) + " (0 .. " +
                    std::to_string(r->layers - 1) + ")");
        else if (!(mean >= 0 && mean <= ENTROPY_MAX) || !(sd >= 0 && sd <= ENTROPY_MAX))
            fc.fail(fmt("entropy %g", mean) + fmt(" ± %g is not a number in [0, 64]", sd) +
                    " (a Renyi entropy is at most the log of the positions)");
        else if (std::fabs(a - alpha) > 1e-9 * alpha) *stale = true;
        else if ((int)layer < (int)v.size() && !std::isnan(v[(int)layer]))
            fc.fail(fmt("layer %g is given twice", layer));
        else v.resize(std::max<size_t>(v.size(), (size_t)layer + 1), NAN), v[(int)layer] = mean;
    }
    if (!fc.err.empty() || *stale) return fc.err;
    for (const std::string& kind : kinds) {
        const std::vector<double>& v = r->entropy[kind];
        if (v.empty() && kind == "routed") *stale = true;  // an older ./lime's analysis of ResFormer: analyse again
        else if (v.size() != (size_t)r->layers ||
                 std::any_of(v.begin(), v.end(), [](double x) { return std::isnan(x); }))
            return one_line(fc.path) + ": the " + kind + " entropy of some of the " + std::to_string(r->layers) +
                   " layers is missing";
    }
    return "";
}

// ---------------------------------------------------------------------------
// The report

// The number compared across models: accuracy (arith, prosqa; higher is
// better) or, for text, validation loss (lower is better).
static double metric_of(const Run& r, const std::string& task) { return task == "text" ? r.val_loss : r.accuracy; }

struct RunGroup {  // the runs of one (tier, arch)
    std::string tier, arch;
    std::vector<const Run*> runs;
    std::vector<double> values(double Run::*field) const {
        std::vector<double> v;
        for (const Run* r : runs) if (std::isfinite(r->*field)) v.push_back(r->*field);
        return v;
    }
};

static std::string pct(double x) { return std::isfinite(x) ? fmt("%.1f%%", 100 * x) : "n/a"; }

static std::string mean_std(const std::vector<double>& v, bool percent) {
    if (v.empty()) return "n/a";
    double mean = stats_mean(v), sd = v.size() > 1 ? stats_std(v) : 0;
    return percent ? fmt("%.1f", 100 * mean) + " ± " + fmt("%.1f%%", 100 * sd)
                   : fmt("%.4f", mean) + " ± " + fmt("%.4f", sd);
}

static std::string every_value(const std::vector<double>& v, bool percent) {
    std::string out;
    for (double x : v) out += (out.empty() ? "" : ", ") + (percent ? fmt("%.1f", 100 * x) : fmt("%.4f", x));
    return out;
}

// Mean curve over seeds, with a min..max band, on the steps all runs logged.
static Series mean_curve(const std::string& label, const std::vector<const Run*>& runs, bool eval, double x_scale) {
    Series s;
    s.label = label;
    if (runs.empty()) return s;
    const std::vector<double>& xs = eval ? runs[0]->eval_steps : runs[0]->steps;
    for (size_t i = 0; i < xs.size(); i++) {
        std::vector<double> ys;
        for (const Run* r : runs) {
            const std::vector<double>& rx = eval ? r->eval_steps : r->steps;
            const std::vector<double>& ry = eval ? r->eval_losses : r->losses;
            if (i < rx.size() && rx[i] == xs[i] && std::isfinite(ry[i])) ys.push_back(ry[i]);
        }
        if (ys.empty()) continue;
        s.x.push_back(xs[i] * x_scale);
        s.y.push_back(stats_mean(ys));
        s.lo.push_back(*std::min_element(ys.begin(), ys.end()));
        s.hi.push_back(*std::max_element(ys.begin(), ys.end()));
    }
    return s;
}

// The runs grouped by (tier, model), in the order of the report's tables.
// For prosqa and text the one "tier" is the task's name.
struct Report {
    std::string task;
    std::vector<std::string> tiers, archs;
    std::vector<RunGroup> groups;
    double chance = 0;  // arith: 1 / modulus; prosqa: 1/2 (two candidate answers)
    double threshold = NAN;  // a run learns when its learning curve reaches it (compare's --threshold)
    const std::vector<Run>* tuning = nullptr;  // --lr-grid: the tuning runs, their --lr each
    std::map<std::string, std::string> lr_of;  // --lr-grid: "tier/model" -> the rate picked
    std::vector<std::string> lr_grid;          // --lr-grid's rates, and its tuning seeds
    std::vector<int> tuning_seeds;
    Report(const std::string& k, const std::vector<std::string>& t, const std::vector<std::string>& a,
           const std::vector<Run>& runs, double chance_)
        : task(k), tiers(t), archs(a), chance(chance_) {
        for (const std::string& tier : tiers)
            for (const std::string& arch : archs) {
                RunGroup g{tier, arch, {}};
                for (const Run& r : runs) if (r.tier == tier && r.arch == arch) g.runs.push_back(&r);
                groups.push_back(g);
            }
    }
    const RunGroup& group(const std::string& tier, const std::string& arch) const {
        for (const RunGroup& g : groups) if (g.tier == tier && g.arch == arch) return g;
        return groups[0];
    }
    std::string label(const std::string& tier) const { return task == "arith" ? "tier " + tier : task; }
    bool has(const std::string& arch) const { return std::find(archs.begin(), archs.end(), arch) != archs.end(); }
    // Whether a tier has runs of a model (a preset's tiers may run different models).
    bool ran(const std::string& tier, const std::string& arch) const {
        for (const RunGroup& g : groups)
            if (g.tier == tier && g.arch == arch) return !g.runs.empty();
        return false;
    }
    // (a, b) pairs the paired report compares, a - b: each model against llama,
    // each other model against lime (the reviewers' question: does LIMe beat its
    // peers and its own controls?), and each X:frozen against its X where X is a
    // lime variant (does learning its routers add anything?).
    std::vector<std::pair<std::string, std::string>> pairs() const {
        std::vector<std::pair<std::string, std::string>> out;
        for (const std::string& arch : archs)
            if (arch != "llama" && has("llama")) out.push_back({arch, "llama"});
        for (const std::string& arch : archs)
            if (arch != "llama" && arch != "lime" && has("lime")) out.push_back({arch, "lime"});
        for (const std::string& arch : archs) {
            size_t at = arch.rfind(":frozen");
            std::string learned = at == std::string::npos ? "" : arch.substr(0, at);
            if (at + 7 == arch.size() && learned != "lime" && has(learned)) out.push_back({arch, learned});
        }
        return out;
    }
    // A run stalls when its accuracy is less than halfway from chance to the
    // median accuracy of all runs of its tier (every model): a documented rule
    // that catches runs far behind the rest without a fixed cut-off per task.
    double stall_threshold(const std::string& tier) const {
        std::vector<double> all;
        for (const std::string& arch : archs) {
            std::vector<double> v = group(tier, arch).values(&Run::accuracy);
            all.insert(all.end(), v.begin(), v.end());
        }
        return all.empty() ? NAN : chance + 0.5 * (stats_median(all) - chance);
    }
};

// Seed-matched values of (tier, a) and (tier, b) with f: those seeds where both have one.
static void paired_values(const Report& rep, const std::string& tier, const std::string& a, const std::string& b,
                          const std::function<double(const Run&)>& f, std::vector<double>* va,
                          std::vector<double>* vb) {
    for (const Run* ra : rep.group(tier, a).runs)
        for (const Run* rb : rep.group(tier, b).runs)
            if (ra->seed == rb->seed && std::isfinite(f(*ra)) && std::isfinite(f(*rb))) {
                va->push_back(f(*ra));
                vb->push_back(f(*rb));
            }
}

// The report's title and how its runs were made.
static void report_intro(std::ostringstream& md, const Preset* preset, const std::string& extra,
                         const Report& rep) {
    md << "# LIMe vs LLaMa: " << (preset ? preset->name : "custom") << (rep.task == "arith" ? "" : ", " + rep.task)
       << "\n\n";
    md << "Each model trained once per seed with `./lime train " << extra
       << (rep.task == "arith" ? " --ops TIER" : " --task " + rep.task)
       << " --seed S`; a seed gives every model the same data order and the same initial values for every tensor "
          "they share, so the seeds are pairs. "
       << (rep.task == "text" ? "Text: validation loss and perplexity (docs/tasks.md 3)."
           : rep.task == "prosqa" ? "ProsQA: exact match of the answer on the real test file (docs/tasks.md 2)."
                                  : "Accuracy: greedy decoding on held-out questions (docs/tasks.md 1).")
       << "\n\n";
    if (std::any_of(rep.archs.begin(), rep.archs.end(), [](const std::string& a) { return a.rfind("lime:", 0) == 0; }))
        md << "Model `lime:X` is trained with `--arch lime --router X` (`:separate` adds `--router-kv separate`, "
              "`:frozen` adds `--router-weights frozen`: the routers keep their initial values, the control for "
              "\"LIMe helps only by adding gradient paths\"): README, `--router`.\n\n";
    if (std::any_of(rep.archs.begin(), rep.archs.end(), [](const std::string& a) { return a.find(":ereg=") != std::string::npos; }))
        md << "Model `X:ereg=L` is model X trained with `--entropy-reg L`, the value-entropy regulariser "
              "(docs/training.md).\n\n";
    auto has = [&](const char* s) {
        return std::any_of(rep.archs.begin(), rep.archs.end(), [&](const std::string& a) { return a.find(s) == 0; });
    };
    if (has("lime:same-head") || std::any_of(rep.archs.begin(), rep.archs.end(), [](const std::string& a) {
            return a.find(":same-head") != std::string::npos;
        }))
        md << "Model `lime:same-head` is LIMe with the cross-head ablation (`--router-heads same`): each kv head mixes "
              "only the same head of the earlier layers; the weights that mix across heads are 0 and stay 0.\n\n";
    for (const ModelEntry& m : model_registry())  // each study model compared: its registry row's line
        if (m.hooks && has(m.name))
            md << "Model `" << m.name << "` (`--arch " << m.name << "`): " << m.about
               << (*m.variants ? std::string("; its variants: ") + m.variants : std::string()) << ". README, `--arch`.\n\n";
}

// Accuracy (or, for text, validation loss and perplexity) per tier and model:
// mean ± std, every seed, and the stalled runs.
static void report_accuracy(std::ostringstream& md, const Report& rep) {
    if (rep.task == "text") {
        md << "## Validation loss\n\n| task | model | validation loss (mean ± std) | per seed | perplexity |\n"
              "| --- | --- | --- | --- | --- |\n";
        for (const RunGroup& g : rep.groups) {
            std::vector<double> v = g.values(&Run::val_loss);
            md << "| " << rep.label(g.tier) << " | " << g.arch << " | " << mean_std(v, false) << " | "
               << every_value(v, false) << " | " << (v.empty() ? "n/a" : fmt("%.3f", std::exp(stats_mean(v))))
               << " |\n";
        }
        return;
    }
    md << "## Accuracy\n\n| tier | model | accuracy (mean ± std) | per seed | stalled | test loss |\n"
          "| --- | --- | --- | --- | --- | --- |\n";
    std::string tier_done;  // the tier whose chance row is written
    for (const RunGroup& g : rep.groups) {
        if (g.runs.empty()) continue;  // a model this tier does not run
        if (g.tier != tier_done)  // the tier's first row: chance (arith: 1 / the modulus; prosqa: 1/2)
            md << "| " << rep.label(g.tier) << " | chance | " << pct(rep.chance) << " | | | |\n";
        tier_done = g.tier;
        std::vector<double> acc = g.values(&Run::accuracy);
        double cut = rep.stall_threshold(g.tier);
        int stalled = (int)std::count_if(acc.begin(), acc.end(), [&](double x) { return x < cut; });
        md << "| " << rep.label(g.tier) << " | " << g.arch << " | " << mean_std(acc, true) << " | "
           << every_value(acc, true) << " | " << stalled << " of " << acc.size() << " | "
           << mean_std(g.values(&Run::val_loss), false) << " |\n";
    }
    md << "\nStalled: accuracy less than halfway from chance (" << pct(rep.chance)
       << ") to the median of all runs of the tier";
    for (const std::string& tier : rep.tiers)
        md << "; " << rep.label(tier) << ": below " << pct(rep.stall_threshold(tier));
    md << ".\n";
}

// One paired line: a - b over matched seeds, the verdict from the exact
// Wilcoxon signed-rank test (robust to a stalled run) after Holm's correction
// over every pair the report tests, the paired-t interval beside it, and the
// same difference among the seeds where neither run stalled.
struct PairedRow {
    std::string tier, a, b;
    PairedResult p, kept;  // every paired seed; those where neither run stalled
};
static std::string paired_line(const PairedRow& r, double holm, double scale, const char* unit, bool higher_better,
                               std::string* verdict) {
    const PairedResult& p = r.p;
    if (p.n < 2) {
        *verdict = r.a + " vs " + r.b + ": too few paired seeds for a test (use --seeds 2 or more)";
        return "n/a";
    }
    std::string ci =
        std::isfinite(p.lo) ? fmt("(%+.2f", scale * p.lo) + fmt(" to %+.2f)", scale * p.hi) : "(no spread)";
    std::string kept = r.kept.n ? fmt("%+.2f", scale * r.kept.mean) + unit + " (" + std::to_string(r.kept.n) + ")"
                                : std::string("none");
    std::string row = strf("| %s − %s | %d | %+.2f%s %s | %+.2f%s | %d / %d / %d | %.3g | %.3g | %s | %s |",
                           r.a.c_str(), r.b.c_str(), p.n, scale * p.mean, unit, ci.c_str(), scale * p.median, unit,
                           p.wins, p.ties, p.losses, p.p_wilcoxon, holm,
                           std::isfinite(p.p_t) ? fmt("%.3g", p.p_t).c_str() : "n/a", kept.c_str());
    bool a_better = higher_better ? p.median > 0 : p.median < 0;
    if (holm < 0.05)
        *verdict = (a_better ? r.a + " beats " + r.b : r.b + " beats " + r.a) +
                   fmt(": signed-rank p = %.3g over paired seeds, ", p.p_wilcoxon) + fmt("%.3g after Holm", holm);
    else
        *verdict = r.a + " vs " + r.b + fmt(": no clear difference (signed-rank p = %.3g", p.p_wilcoxon) +
                   fmt(", %.3g after Holm", holm) + ", " + std::to_string(p.wins) + " wins of " +
                   std::to_string(p.n) + " for " + r.a + ")";
    int nonzero = p.wins + p.losses;  // the smallest two-sided signed-rank p with n non-zero pairs is 2 / 2^n
    if (holm >= 0.05 && nonzero == 0)
        *verdict += "; every pair is a tie, which the signed-rank test cannot rank: more seeds";
    else if (p.p_wilcoxon >= 0.05 && nonzero < 6)  // 2 / 2^n, a p of at most 1
        *verdict += fmt("; with %.0f non-zero pairs the signed-rank p cannot go below", nonzero) +
                    fmt(" %.3g: more seeds", std::min(1.0, std::ldexp(2.0, -nonzero)));
    return row;
}

// The paired table (the report's verdicts) and, secondary, Welch's unpaired
// test of the same difference; the verdicts also go to *summary.
static void report_paired(std::ostringstream& md, const Report& rep, std::string* summary) {
    bool text = rep.task == "text";
    double scale = text ? 1 : 100;
    const char* unit = text ? "" : " pts";
    md << "\n## Paired differences\n\n"
       << (text ? "Validation loss, a − b per seed (negative: a is better). "
                : "Accuracy, a − b per seed, in points. ")
       << "Mean with its paired-t 95% interval, median, wins / ties / losses of a, exact Wilcoxon signed-rank p "
          "(zeros dropped, tied differences share their average rank), that p after Holm's correction over every "
          "pair of this report (the verdicts use it), paired-t p, and the mean difference among the seeds where "
          "neither run stalled (their count).\n\n";
    auto pairs = rep.pairs();
    if (pairs.empty()) { md << "No pair to compare (add llama or lime to --archs).\n"; return; }
    auto metric = [&](const Run& r) { return metric_of(r, rep.task); };
    std::vector<PairedRow> rows;
    for (const std::string& tier : rep.tiers)
        for (const auto& [a, b] : pairs) {
            if (!rep.ran(tier, a) || !rep.ran(tier, b)) continue;
            std::vector<double> va, vb, ka, kb;
            paired_values(rep, tier, a, b, metric, &va, &vb);
            double cut = rep.stall_threshold(tier);
            for (size_t i = 0; i < va.size(); i++)
                if (text || (va[i] >= cut && vb[i] >= cut)) ka.push_back(va[i]), kb.push_back(vb[i]);
            rows.push_back({tier, a, b, stats_paired(va, vb), stats_paired(ka, kb)});
        }
    std::vector<double> ps;
    for (const PairedRow& r : rows) ps.push_back(r.p.n >= 2 ? r.p.p_wilcoxon : 1.0);
    std::vector<double> holm = stats_holm(ps);
    std::vector<std::string> verdicts, welch;
    for (const std::string& tier : rep.tiers) {
        bool header = false;
        for (size_t i = 0; i < rows.size(); i++) {
            if (rows[i].tier != tier) continue;
            if (!header)
                md << "| " << rep.label(tier) << ": a − b | seeds | mean (95% CI) | median | W / T / L | signed-rank p | "
                      "Holm p | paired-t p | not stalled |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
            header = true;
            std::string verdict, line = paired_line(rows[i], holm[i], scale, unit, !text, &verdict);
            if (line != "n/a") md << line << "\n";
            verdicts.push_back(rep.label(tier) + ": " + verdict);
            std::vector<double> va, vb;
            paired_values(rep, tier, rows[i].a, rows[i].b, metric, &va, &vb);
            WelchResult w = stats_welch(va, vb);
            welch.push_back(rep.label(tier) + ", " + rows[i].a + " − " + rows[i].b + ": " +
                            (std::isfinite(w.p) ? fmt("%+.2f", scale * w.diff) + fmt(" (95%% CI %+.2f", scale * w.lo) +
                                                      fmt(" to %+.2f)", scale * w.hi) + fmt(", p = %.3g", w.p)
                                                : std::string("n/a")));
        }
        if (header) md << "\n";
    }
    md << "Holm's correction is over the " << rows.size() << " pairs above together.\n\n";
    for (const std::string& v : verdicts) { md << "- " << v << ".\n"; *summary += v + "\n"; }
    md << "\nUnpaired view (Welch's t-test, secondary: it ignores the pairing):\n\n";
    for (const std::string& w : welch) md << "- " << w << "\n";
}

// Entropy per layer (./lime analyze of every run): per tier, kind and layer,
// each model's mean ± std over seeds; a figure with bands (± std); and the
// paired difference at the last layer. "attended" is what attention reads:
// LLaMa's raw values, LIMe's routed ones and ResFormer's mixed ones (raw at layer 0).
static double entropy_at(const Run& r, const std::string& kind, int layer) {
    std::string k = kind;
    if (kind == "attended") k = r.entropy.count("routed") ? "routed" : "raw";
    auto it = r.entropy.find(k);
    return it != r.entropy.end() && layer < (int)it->second.size() ? it->second[layer] : NAN;
}

static std::string report_entropy(std::ostringstream& md, const std::string& dir, const Report& rep, int layers) {
    md << "\n## Entropy per layer\n\n"
          "`./lime analyze` of each run's model (Rényi entropy, features z-scored over all test sequences and "
          "positions; mean over sequences), then mean ± std over seeds. raw: W_V's output; attended: the values "
          "attention reads (LIMe: routed); hidden: the residual stream after the layer.\n\n";
    const std::vector<std::string> kinds = {"attended", "raw", "hidden"};
    std::string err;
    for (const std::string& tier : rep.tiers) {
        std::vector<std::string> archs;  // the models this tier trained (a preset's tier may plan fewer)
        for (const std::string& arch : rep.archs)
            if (rep.ran(tier, arch)) archs.push_back(arch);
        md << "| " << rep.label(tier) << " | layer";
        for (const std::string& arch : archs) md << " | " << arch;
        md << " |\n| --- | ---";
        for (size_t i = 0; i < archs.size(); i++) md << " | ---";
        md << " |\n";
        for (const std::string& kind : kinds) {
            std::vector<Series> series;
            for (const std::string& arch : archs) series.push_back(Series{arch, {}, {}, {}, {}});
            for (int l = 0; l < layers; l++) {
                md << "| " << kind << " | " << l;
                for (size_t i = 0; i < archs.size(); i++) {
                    std::vector<double> v;
                    for (const Run* r : rep.group(tier, archs[i]).runs)
                        if (std::isfinite(entropy_at(*r, kind, l))) v.push_back(entropy_at(*r, kind, l));
                    md << " | " << (v.empty() ? "n/a" : mean_std(v, false));
                    if (v.empty()) continue;
                    double m = stats_mean(v), sd = v.size() > 1 ? stats_std(v) : 0;
                    series[i].x.push_back(l);
                    series[i].y.push_back(m);
                    series[i].lo.push_back(m - sd);
                    series[i].hi.push_back(m + sd);
                }
                md << " |\n";
            }
            std::string f = "entropy_" + kind + "_" + (rep.task == "arith" ? "tier" + tier : tier) + ".png";
            if (err.empty())
                err = plot_lines(dir + "/" + f,
                                 "Entropy (" + kind + "), " + rep.label(tier) + ": mean, band ± std over seeds",
                                 "layer", "Renyi entropy", series);
        }
        md << "\nLast layer (" << layers - 1 << "), paired over seeds:\n\n";
        for (const std::string& kind : kinds)
            for (const auto& [a, b] : rep.pairs()) {
                std::vector<double> va, vb;
                paired_values(rep, tier, a, b, [&](const Run& r) { return entropy_at(r, kind, layers - 1); }, &va, &vb);
                PairedResult p = stats_paired(va, vb);
                if (p.n < 2) continue;
                md << "- " << kind << ", " << a << " − " << b << ": " << fmt("%+.3f", p.mean)
                   << (std::isfinite(p.lo) ? fmt(" (95%% CI %+.3f", p.lo) + fmt(" to %+.3f)", p.hi) : "")
                   << ", " << p.wins << " of " << p.n
                   << " seeds higher, signed-rank p = " << fmt("%.3g", p.p_wilcoxon) << "\n";
            }
        md << "\n";
    }
    if (!err.empty()) return err;
    for (const std::string& tier : rep.tiers)
        for (const std::string& kind : kinds) {
            std::string f = "entropy_" + kind + "_" + (rep.task == "arith" ? "tier" + tier : tier) + ".png";
            md << "![entropy " << kind << "](" << f << ")\n\n";
        }
    return "";
}

// The regulariser's dose-response (the referee's causal test), when --archs
// holds a model X:ereg=L: per run, the last layer's raw value entropy against
// accuracy (a scatter, one colour per model, LIMe's range over seeds shaded),
// and per model its lambda, mean entropy, mean accuracy and the paired
// accuracy difference against llama and against lime.
static double lambda_of(const std::string& arch) {
    Config c;
    return model_parse(arch, &c) ? c.entropy_reg : NAN;
}
static std::string paired_short(const Report& rep, const std::string& tier, const std::string& a,
                                const std::string& b) {
    if (a == b || !rep.ran(tier, b)) return "n/a";
    std::vector<double> va, vb;
    paired_values(rep, tier, a, b, [](const Run& r) { return r.accuracy; }, &va, &vb);
    PairedResult p = stats_paired(va, vb);
    if (p.n < 2) return "n/a";
    return fmt("%+.1f pts", 100 * p.mean) + " (" + std::to_string(p.wins) + " of " + std::to_string(p.n) +
           fmt(" higher, p = %.3g)", p.p_wilcoxon);
}
// Every model's last-layer value entropy beside its accuracy, a table and a
// scatter (one point per run) per tier; with regularised models (X:ereg=L),
// the referee's causal test: does raising LLaMa's entropy raise its accuracy?
static std::string report_entropy_accuracy(std::ostringstream& md, const std::string& dir, const Report& rep,
                                           int layers) {
    bool any = std::any_of(rep.archs.begin(), rep.archs.end(),
                           [](const std::string& a) { return a.find(":ereg=") != std::string::npos; });
    if (rep.task == "text") return "";
    int last = layers - 1;
    md << "\n## Value entropy against accuracy\n\nEntropy: the last layer's (" << last
       << ") raw values (W_V's output), as `./lime analyze` measures it (the authors' order, --alpha).";
    if (any)
        md << " `X:ereg=L` is X trained with `--entropy-reg L`: the loss minus L times the mean order-2 Rényi "
              "entropy of each layer's values (docs/training.md). If entropy were what makes LIMe better, raising "
              "LLaMa's to LIMe's level should raise its accuracy toward LIMe's.";
    md << "\n\n";
    std::string err;
    for (const std::string& tier : rep.tiers) {
        md << "| " << rep.label(tier) << ": model | lambda | seeds | raw entropy, layer " << last
           << " (mean ± std) | accuracy (mean ± std) | vs llama | vs lime |\n"
              "| --- | --- | --- | --- | --- | --- | --- |\n";
        std::vector<Series> series;
        double acc_lo = INFINITY, acc_hi = -INFINITY;
        for (const std::string& arch : rep.archs) {
            if (!rep.ran(tier, arch)) continue;  // a model this tier does not run
            const RunGroup& g = rep.group(tier, arch);
            Series s{arch, {}, {}, {}, {}};
            std::vector<double> ent, acc = g.values(&Run::accuracy);
            for (const Run* r : g.runs) {
                double e = entropy_at(*r, "raw", last);
                if (std::isfinite(e)) ent.push_back(e);
                if (!std::isfinite(e) || !std::isfinite(r->accuracy)) continue;
                s.x.push_back(100 * r->accuracy), s.y.push_back(e);  // one point per run, not joined
                s.x.push_back(NAN), s.y.push_back(NAN);
                acc_lo = std::min(acc_lo, 100 * r->accuracy), acc_hi = std::max(acc_hi, 100 * r->accuracy);
            }
            md << "| " << arch << " | " << fmt("%g", lambda_of(arch)) << " | " << g.runs.size() << " | "
               << mean_std(ent, false) << " | " << mean_std(acc, true) << " | "
               << paired_short(rep, tier, arch, "llama") << " | " << paired_short(rep, tier, arch, "lime") << " |\n";
            series.push_back(s);
        }
        // LIMe's range of entropy over its seeds, shaded across the plot
        std::vector<double> lime_ent;
        if (rep.has("lime"))
            for (const Run* r : rep.group(tier, "lime").runs)
                if (std::isfinite(entropy_at(*r, "raw", last))) lime_ent.push_back(entropy_at(*r, "raw", last));
        if (!lime_ent.empty() && std::isfinite(acc_lo)) {
            double lo = *std::min_element(lime_ent.begin(), lime_ent.end()),
                   hi = *std::max_element(lime_ent.begin(), lime_ent.end()), m = stats_mean(lime_ent);
            series.push_back(Series{"lime's entropy (mean, range)", {acc_lo - 1, acc_hi + 1}, {m, m}, {lo, lo}, {hi, hi}});
        }
        std::string f = "entropy_vs_accuracy_" + (rep.task == "arith" ? "tier" + tier : tier) + ".png";
        md << "\nvs: the paired accuracy difference over seeds (model − llama, model − lime), how many seeds it "
              "was higher in, and the signed-rank p.\n\n![entropy against accuracy](" << f << ")\n\n";
        if (err.empty())
            err = plot_lines(dir + "/" + f, "Last-layer raw value entropy against accuracy, " + rep.label(tier) +
                             " (one point per run)", "accuracy (%)", "Renyi entropy, layer " + std::to_string(last),
                             series);
    }
    return err;
}

// Parameters, FLOPs per token, step time and peak memory per tier and model.
static void report_cost(std::ostringstream& md, const Report& rep) {
    md << "\n## Cost\n\n| tier | model | parameters | FLOPs per token (train step, router counted) | ms per step "
          "| peak memory (process RSS) |\n"
          "| --- | --- | --- | --- | --- | --- |\n";
    for (const RunGroup& g : rep.groups) {
        if (g.runs.empty()) continue;  // a model this tier did not train
        std::vector<double> ms = g.values(&Run::ms_per_step), rss;
        for (double mb : g.values(&Run::max_rss_mb))  // a run read with --reuse, or trained in a group: 0
            if (mb > 0) rss.push_back(mb);
        const Run* r0 = g.runs.empty() ? nullptr : g.runs[0];
        md << "| " << rep.label(g.tier) << " | " << g.arch << " | " << (r0 ? fmt("%.0f", r0->params) : "n/a") << " | "
           << (r0 ? fmt("%.4g", r0->flops_per_token_) : "n/a") << " | "
           << (ms.empty() ? "n/a" : fmt("%.2f", stats_mean(ms))) << " | "
           << (rss.empty() ? "n/a (reused runs, or a GPU group's)" : fmt("%.0f MB", stats_mean(rss))) << " |\n";
    }
    for (const RunGroup& g : rep.groups)
        for (const Run* r : g.runs)
            if (r->trained_with > 0) {
                md << "\nThe runs trained on the GPU several at a time in one process (--jobs): a run's ms per "
                      "step is the pace of its group, every run's steps included, not its model's own; compare "
                      "models' speed with `./lime bench` or `--jobs 1`.\n";
                return;
            }
}

// One tier's loss curves (training loss, validation loss against steps and
// against training FLOPs), drawn into dir and linked from md.
static std::string report_curves(std::ostringstream& md, const std::string& dir, const Report& rep,
                                 const std::string& tier) {
    std::vector<Series> by_step, by_flops, val;
    for (const std::string& arch : rep.archs) {
        const RunGroup& g = rep.group(tier, arch);
        double fpt = g.runs.empty() ? 1 : g.runs[0]->flops_per_token_;
        by_step.push_back(mean_curve(arch, g.runs, false, 1));
        val.push_back(mean_curve(arch, g.runs, true, 1));
        by_flops.push_back(mean_curve(arch, g.runs, true, fpt * (g.runs.empty() ? 0 : g.runs[0]->tokens_per_step)));
    }
    std::string name = rep.task == "arith" ? "tier" + tier : tier, what = rep.label(tier);
    std::string f1 = "loss_" + name + ".png", f2 = "val_loss_" + name + ".png";
    std::string f3 = "val_loss_flops_" + name + ".png";
    std::string err = plot_lines(dir + "/" + f1, "Training loss, " + what + " (mean, band: min..max over seeds)",
                                 "step", "loss", by_step);
    if (err.empty()) err = plot_lines(dir + "/" + f2, "Validation loss, " + what, "step", "loss", val);
    if (err.empty())
        err = plot_lines(dir + "/" + f3, "Validation loss against training FLOPs, " + what,
                         "FLOPs (router counted)", "loss", by_flops);
    if (!err.empty()) return err;
    md << "![training loss](" << f1 << ")\n\n![validation loss](" << f2 << ")\n\n![validation loss against FLOPs]("
       << f3 << ")\n\n";
    return "";
}

// Accuracy per tier and model, mean with std error bars: dir/accuracy.png.
static std::string report_accuracy_bars(std::ostringstream& md, const std::string& dir, const Report& rep) {
    if (rep.task == "text") return "";
    std::vector<BarGroup> bars;
    for (const std::string& arch : rep.archs) {
        BarGroup b;
        b.label = arch;
        for (const std::string& tier : rep.tiers) {
            std::vector<double> v = rep.group(tier, arch).values(&Run::accuracy);
            b.values.push_back(v.empty() ? 0 : 100 * stats_mean(v));
            b.errors.push_back(v.size() > 1 ? 100 * stats_std(v) : 0);
        }
        bars.push_back(b);
    }
    std::vector<std::string> cats;
    for (const std::string& t : rep.tiers) cats.push_back(rep.label(t));
    std::string err =
        plot_bars(dir + "/accuracy.png", "Accuracy (mean and std over seeds)", "accuracy (%)", cats, bars);
    if (!err.empty()) return err;
    md << "![accuracy](accuracy.png)\n";
    return "";
}

// ---------------------------------------------------------------------------
// Learning speed: how fast each model learns, and how far it goes. Every run
// logs a learning curve (train --curve CURVE_POINTS: that many evaluations,
// each greedy decoding of the first --eval-size test questions, CURVE_SIZE
// unless --train-args gives it; the last, at the final step, of every one). A run
// learns at the first evaluation whose score reaches the threshold, fixed
// before the runs; a run that never does is censored at its last step: its
// time is unknown beyond it, never read as "never learned". Per model the
// Kaplan-Meier curve and median with its Brookmeyer-Crowley interval
// (stats_kaplan_meier); per pair, who learned first in each seed, an exact
// sign test and Holm's correction over this section's pairs.

const int CURVE_POINTS = 25;      // evaluations a run logs: the moment of learning placed within 4% of the run
const int CURVE_MIN_POINTS = 20;  // a reused run with fewer is refused: its curve cannot place that moment
const int CURVE_SIZE = 100;       // questions each evaluation decodes (docs/results.md: the curve's cost)

// The default threshold: halfway from chance to 90% (why: docs/tasks.md, "Learning speed").
static double default_threshold(double chance) { return chance + 0.5 * (0.9 - chance); }

struct LearnTime {
    double step = NAN;     // the step it learned at; else its last evaluation's (censored)
    bool learned = false;
};
static LearnTime learn_time(const Run& r, double threshold) {
    LearnTime t;
    for (size_t i = 0; i < r.curve_acc.size(); i++)
        if (r.curve_acc[i] >= threshold) {
            t.step = r.curve_steps[i], t.learned = true;
            return t;
        }
    if (!r.curve_steps.empty()) t.step = r.curve_steps.back();
    return t;
}

static SurvivalResult survival_of(const std::vector<const Run*>& runs, double threshold) {
    std::vector<double> t;
    std::vector<bool> learned;
    for (const Run* r : runs) {
        LearnTime lt = learn_time(*r, threshold);
        if (std::isfinite(lt.step)) t.push_back(lt.step), learned.push_back(lt.learned);
    }
    return stats_kaplan_meier(t, learned);
}

static std::string steps_str(double x) { return std::isinf(x) ? "not reached" : fmt("%.0f", x); }

// "4506 (3004 to not reached)": a Kaplan-Meier median with its interval.
static std::string median_ci(const SurvivalResult& s) {
    return steps_str(s.median) + " (" + steps_str(s.lo) + " to " + steps_str(s.hi) + ")";
}

// The curves of a tier's runs (each seed faint, the model's median over seeds
// bold, the threshold a line) and its Kaplan-Meier curves, drawn into dir.
static std::string plot_learning(const std::string& dir, const Report& rep, const std::string& tier,
                                 const std::vector<std::string>& archs, const std::string& curves,
                                 const std::string& km) {
    std::vector<Series> lines, faint, steps;
    double last = 0;
    for (size_t k = 0; k < archs.size(); k++) {
        const RunGroup& g = rep.group(tier, archs[k]);
        std::map<double, std::vector<double>> at;  // step -> every seed's score there
        for (const Run* r : g.runs) {
            Series s{"", {}, {}, {}, {}, (int)k, true};
            for (size_t i = 0; i < r->curve_steps.size(); i++) {
                s.x.push_back(r->curve_steps[i]), s.y.push_back(100 * r->curve_acc[i]);
                at[r->curve_steps[i]].push_back(100 * r->curve_acc[i]);
                last = std::max(last, r->curve_steps[i]);
            }
            faint.push_back(s);
        }
        Series m{archs[k] + " (median)", {}, {}, {}, {}, (int)k, false};
        for (const auto& [x, ys] : at) m.x.push_back(x), m.y.push_back(stats_median(ys));
        lines.push_back(m);
        SurvivalResult sv = survival_of(g.runs, rep.threshold);
        Series st{archs[k], {0}, {1}, {}, {}, (int)k, false};
        for (const KaplanMeierStep& s : sv.steps)
            st.x.insert(st.x.end(), {s.t, s.t}), st.y.insert(st.y.end(), {st.y.back(), s.survival});
        steps.push_back(st);
    }
    for (Series& st : steps) st.x.push_back(last), st.y.push_back(st.y.back());
    faint.insert(faint.end(), lines.begin(), lines.end());
    faint.push_back(Series{fmt("threshold %.1f%%", 100 * rep.threshold), {0, last},
                           {100 * rep.threshold, 100 * rep.threshold}, {}, {}, 6, false});
    std::string err = plot_lines(dir + "/" + curves, "Learning curves, " + rep.label(tier) +
                                 ": accuracy, each seed faint, the median bold", "step", "accuracy (%)", faint);
    if (err.empty())
        err = plot_lines(dir + "/" + km, "Not yet learned (Kaplan-Meier), " + rep.label(tier), "step",
                         "share of runs not yet learned", steps);
    return err;
}

// Who learned first in each seed both models ran: a censored run is later than
// any that learned, two censored runs (or one step) a tie.
struct LearnPair {
    std::string tier, a, b;
    int a_first = 0, ties = 0, b_first = 0;
    double p = 1;
    PairedResult both;  // final accuracy, a - b, over the seeds where both learned
};
static LearnPair learn_pair(const Report& rep, const std::string& tier, const std::string& a, const std::string& b) {
    LearnPair lp;
    lp.tier = tier, lp.a = a, lp.b = b;
    std::vector<double> va, vb;
    for (const Run* ra : rep.group(tier, a).runs)
        for (const Run* rb : rep.group(tier, b).runs) {
            if (ra->seed != rb->seed) continue;
            LearnTime ta = learn_time(*ra, rep.threshold), tb = learn_time(*rb, rep.threshold);
            if (!std::isfinite(ta.step) || !std::isfinite(tb.step)) continue;
            double xa = ta.learned ? ta.step : INFINITY, xb = tb.learned ? tb.step : INFINITY;
            (xa < xb ? lp.a_first : xb < xa ? lp.b_first : lp.ties)++;
            if (ta.learned && tb.learned && std::isfinite(ra->accuracy) && std::isfinite(rb->accuracy))
                va.push_back(ra->accuracy), vb.push_back(rb->accuracy);
        }
    lp.p = stats_sign_test_p(lp.a_first, lp.b_first);
    lp.both = stats_paired(va, vb);
    return lp;
}

// The section: the threshold and why, per model the share learned and the
// median time to learn, the Kaplan-Meier table, the paired table, figures.
static std::string report_learning(std::ostringstream& md, const std::string& dir, const Report& rep,
                                   std::string* summary) {
    if (rep.task == "text") return "";
    md << "\n## Learning speed\n\nEach run's learning curve: " << CURVE_POINTS
       << " evaluations evenly spaced (`./lime train --curve " << CURVE_POINTS
       << "`), each the accuracy of greedy decoding on the first `--eval-size` test questions (compare gives "
       << CURVE_SIZE << " unless `--train-args` gives it); the last, at the final step, on every test question, "
          "the accuracy of the tables above. A run **learns** at the first evaluation whose accuracy reaches **"
       << fmt("%.2f%%", 100 * rep.threshold) << "**, the threshold fixed before the runs ("
       << (std::fabs(rep.threshold - default_threshold(rep.chance)) < 1e-12
               ? "the default: halfway from chance, " + pct(rep.chance) +
                     ", to 90%, the middle of a learning run's rise, where the curves are steepest and the time "
                     "least depends on the exact level"
               : std::string("`--threshold`"))
       << "); a run that never reaches it is **censored** at its last step: its time to learn is only known to "
          "be later. Median steps to learn: the Kaplan-Meier median (the first step at which at most half the "
          "runs have not learned) with its 95% interval after Brookmeyer and Crowley (the steps whose "
          "not-yet-learned share the Greenwood interval does not tell from one half); \"not reached\" where the "
          "share never falls that far.\n\n";
    size_t fewest = SIZE_MAX;
    for (const RunGroup& g : rep.groups)
        for (const Run* r : g.runs) fewest = std::min(fewest, r->curve_acc.size());
    if (fewest < (size_t)CURVE_MIN_POINTS)
        md << "Some runs have only " << fewest << " evaluations (`--eval-every` in `--train-args` spaces them, "
           << "in place of `--curve " << CURVE_POINTS << "`): their time to learn is placed only to within the "
           << "steps between two of them.\n\n";
    std::string err;
    std::vector<LearnPair> pairs;
    for (const std::string& tier : rep.tiers) {
        std::vector<std::string> archs;
        for (const std::string& arch : rep.archs)
            if (rep.ran(tier, arch)) archs.push_back(arch);
        md << "| " << rep.label(tier) << ": model | seeds | learned by the end | median steps to learn (95% CI) | "
              "last step | final accuracy of those that learned (mean ± std) |\n| --- | --- | --- | --- | --- | --- |\n";
        std::ostringstream km;
        for (const std::string& arch : archs) {
            const RunGroup& g = rep.group(tier, arch);
            SurvivalResult sv = survival_of(g.runs, rep.threshold);
            std::vector<double> acc;
            double last = 0;
            for (const Run* r : g.runs) {
                LearnTime lt = learn_time(*r, rep.threshold);
                if (lt.learned && std::isfinite(r->accuracy)) acc.push_back(r->accuracy);
                if (!r->curve_steps.empty()) last = std::max(last, r->curve_steps.back());
            }
            md << "| " << arch << " | " << sv.n << " | " << sv.events << " of " << sv.n << " | " << median_ci(sv)
               << " | " << fmt("%.0f", last) << " | " << mean_std(acc, true) << " |\n";
            for (const KaplanMeierStep& k : sv.steps)
                km << "| " << arch << " | " << fmt("%.0f", k.t) << " | " << k.at_risk << " | " << k.events << " | "
                   << fmt("%.4f", k.survival) << " | " << fmt("%.4f", k.se) << " |\n";
        }
        md << "\nKaplan-Meier, " << rep.label(tier)
           << ": at each step at which some run learned, the runs still at risk (not learned, not censored "
              "before it), those that learned there, the share not yet learned after it and its Greenwood "
              "standard error.\n\n| model | step | at risk | learned | not yet learned | se |\n"
              "| --- | --- | --- | --- | --- | --- |\n"
           << (km.str().empty() ? "| (no run learned) | | | | | |\n" : km.str()) << "\n";
        std::string name = rep.task == "arith" ? "tier" + tier : tier;
        std::string f1 = "learning_curves_" + name + ".png", f2 = "not_yet_learned_" + name + ".png";
        if (err.empty()) err = plot_learning(dir, rep, tier, archs, f1, f2);
        md << "![learning curves](" << f1 << ")\n\n![not yet learned](" << f2 << ")\n\n";
        for (const auto& [a, b] : rep.pairs())
            if (rep.ran(tier, a) && rep.ran(tier, b)) pairs.push_back(learn_pair(rep, tier, a, b));
    }
    if (pairs.empty()) return err;
    std::vector<double> ps;
    for (const LearnPair& lp : pairs) ps.push_back(lp.p);
    std::vector<double> holm = stats_holm(ps);
    md << "Paired by seed: in each seed both models ran, which learned first (a censored run is later than any "
          "that learned; both censored, or both at one step, is a tie), the exact two-sided sign test over the "
          "seeds that are not ties, that p after Holm's correction over the "
       << pairs.size()
       << " pairs of this section, and the paired difference of final (greedy) accuracy over the seeds where both "
          "learned: mean with its paired-t 95% interval (their count).\n\n"
          "| a vs b | seeds | a first / tie / b first | sign-test p | Holm p | final accuracy a − b where both "
          "learned |\n| --- | --- | --- | --- | --- | --- |\n";
    std::vector<std::string> verdicts;
    for (size_t i = 0; i < pairs.size(); i++) {
        const LearnPair& lp = pairs[i];
        const PairedResult& b = lp.both;
        std::string diff = b.n == 0 ? "none"
                           : fmt("%+.2f pts", 100 * b.mean) +
                                 (std::isfinite(b.lo) ? fmt(" (%+.2f", 100 * b.lo) + fmt(" to %+.2f)", 100 * b.hi) : "") +
                                 " (" + std::to_string(b.n) + ")";
        md << "| " << rep.label(lp.tier) << ": " << lp.a << " vs " << lp.b << " | "
           << lp.a_first + lp.ties + lp.b_first << " | " << lp.a_first << " / " << lp.ties << " / " << lp.b_first
           << " | " << fmt("%.3g", lp.p) << " | " << fmt("%.3g", holm[i]) << " | " << diff << " |\n";
        std::string v = rep.label(lp.tier) + ": " +
                        (holm[i] < 0.05 ? (lp.a_first > lp.b_first ? lp.a + " learns before " + lp.b
                                                                   : lp.b + " learns before " + lp.a)
                                        : lp.a + " vs " + lp.b + ": no clear difference in time to learn") +
                        " (" + std::to_string(lp.a_first) + " / " + std::to_string(lp.ties) + " / " +
                        std::to_string(lp.b_first) + fmt(", sign-test p = %.3g", lp.p) +
                        fmt(", %.3g after Holm)", holm[i]);
        verdicts.push_back(v);
    }
    md << "\n";
    for (const std::string& v : verdicts) { md << "- " << v << ".\n"; *summary += v + "\n"; }
    return err;
}

// --lr-grid: each model's rate picked on the tuning seeds (the lowest median
// time to learn; ties: the higher mean final accuracy; then the first of the
// grid), and the grid's table.
struct RateScore {
    SurvivalResult sv;
    double accuracy = NAN;  // mean final accuracy over the tuning seeds
};
static RateScore rate_score(const std::vector<Run>& tuning, const std::string& tier, const std::string& arch,
                            const std::string& lr, double threshold) {
    std::vector<const Run*> runs;
    std::vector<double> acc;
    for (const Run& r : tuning)
        if (r.tier == tier && r.arch == arch && r.lr == lr) {
            runs.push_back(&r);
            if (std::isfinite(r.accuracy)) acc.push_back(r.accuracy);
        }
    return {survival_of(runs, threshold), acc.empty() ? NAN : stats_mean(acc)};
}
static std::string pick_rate(const std::vector<Run>& tuning, const std::vector<std::string>& grid,
                             const std::string& tier, const std::string& arch, double threshold) {
    std::string best;
    RateScore top;
    for (const std::string& lr : grid) {
        RateScore s = rate_score(tuning, tier, arch, lr, threshold);
        double a = std::isfinite(s.accuracy) ? s.accuracy : -1, b = std::isfinite(top.accuracy) ? top.accuracy : -1;
        if (best.empty() || s.sv.median < top.sv.median || (s.sv.median == top.sv.median && a > b)) best = lr, top = s;
    }
    return best;
}
static void report_lr_grid(std::ostringstream& md, const Report& rep) {
    if (!rep.tuning) return;
    std::string seeds;
    for (int s : rep.tuning_seeds) seeds += (seeds.empty() ? "" : ", ") + std::to_string(s);
    md << "\n## Learning rate: each model at its own\n\n`--lr-grid`: each model trained at every rate of the grid "
          "on the tuning seeds (" << seeds << ", none of them an evaluation seed); its rate is the one with the "
          "lowest median time to learn over them (ties: the higher mean final accuracy), and every run above "
          "ran at it. LIMe's routers keep their own rate (`--router-lr`), not scaled with the grid.\n\n"
          "| tier | model | lr | learned | median steps to learn (95% CI) | final accuracy (mean) | picked |\n"
          "| --- | --- | --- | --- | --- | --- | --- |\n";
    for (const std::string& tier : rep.tiers)
        for (const std::string& arch : rep.archs) {
            if (!rep.ran(tier, arch)) continue;
            auto it = rep.lr_of.find(tier + "/" + arch);
            for (const std::string& lr : rep.lr_grid) {
                RateScore s = rate_score(*rep.tuning, tier, arch, lr, rep.threshold);
                md << "| " << rep.label(tier) << " | " << arch << " | " << lr << " | " << s.sv.events << " of "
                   << s.sv.n << " | " << median_ci(s.sv) << " | " << pct(s.accuracy) << " | "
                   << (it != rep.lr_of.end() && it->second == lr ? "**yes**" : "") << " |\n";
            }
        }
}

// DIR/report.md (written to a .tmp file, then renamed) and its figures; the
// paired verdicts also go to *summary.
static std::string write_report(const std::string& dir, const Preset* preset, const std::string& extra,
                                const Report& rep, int layers, std::string* summary) {
    std::ostringstream md;
    report_intro(md, preset, extra, rep);
    report_accuracy(md, rep);
    report_paired(md, rep, summary);
    std::string err = report_learning(md, dir, rep, summary);
    if (!err.empty()) return err;
    report_lr_grid(md, rep);
    err = report_entropy(md, dir, rep, layers);
    if (!err.empty()) return err;
    if (!(err = report_entropy_accuracy(md, dir, rep, layers)).empty()) return err;
    report_cost(md, rep);
    md << "\n## Figures\n\n";
    for (const std::string& tier : rep.tiers) {
        err = report_curves(md, dir, rep, tier);
        if (!err.empty()) return err;
    }
    err = report_accuracy_bars(md, dir, rep);
    if (!err.empty()) return err;
    return write_file_atomic(dir + "/report.md", md.str());
}

// ---------------------------------------------------------------------------
// ./lime compare

// What compare runs, from its flags: the preset with its overrides, the
// models, how many runs at a time and with how many threads each.
struct CompareSettings {
    const Preset* preset = nullptr;
    std::string task = "arith";             // --task
    double alpha = 0.5;                     // --alpha, for every run's ./lime analyze
    int seeds = 1;
    std::vector<std::string> tiers, archs;  // archs: every tier's models together (the report's columns)
    std::map<std::string, int> tier_seeds;  // a tier's own seeds, models and train flags, where its preset plans them
    std::map<std::string, std::vector<std::string>> tier_archs, tier_run_args;
    std::vector<std::string> run_args;      // every run's train flags: the preset's, those --train-args gives replaced
    int jobs = 1, threads = 1;
    bool gpu = false;
    bool fit = false;        // on the GPU, --jobs 0: as many runs at once as fit in its memory (at most 16)
    bool reuse = false;      // --reuse
    double threshold = NAN;  // --threshold, a share (NaN: text, which has no accuracy)
    std::vector<std::string> lr_grid;  // --lr-grid's rates (empty: none), and its tuning seeds
    std::vector<int> tuning_seeds;
    std::string dir;         // --out
    std::string self;        // this program, run as ./lime train
};

// Each word of --train-args: a flag of ./lime train (--NAME VALUE, --NAME=VALUE
// or a switch), not one compare sets (SET_BY_COMPARE), not another task's,
// given once; *given collects their names. "" or the problem.
static std::string check_train_words(const std::vector<std::string>& words, const std::string& task,
                                     std::set<std::string>* given) {
    static const std::vector<FlagSpec> flags = train_flags();
    for (size_t i = 0; i < words.size(); i++) {
        const std::string& w = words[i];
        if (w.rfind("--", 0) != 0)
            return "--train-args: '" + w + "' is not a flag of ./lime train (a value with spaces is quoted as in " +
                   "the shell: \"--text-file 'my notes.txt'\")";
        size_t eq = w.find('=');
        std::string name = w.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
        for (const auto& set : SET_BY_COMPARE)
            if (name == set.flag)
                return "--train-args gives --" + name + "; compare sets it for each run: use " + set.instead;
        auto spec = std::find_if(flags.begin(), flags.end(), [&](const FlagSpec& f) { return name == f.name; });
        if (spec == flags.end())
            return "--train-args: --" + name + " is not a flag of ./lime train; see ./lime train --help";
        if (!given->insert(name).second) return "--train-args gives --" + name + " twice; give it once";
        if (const char* owner = task_owning_flag(name, task))
            return "--train-args gives --" + name + ", a flag of another task (--task " + owner + ") than --task " +
                   task + "; drop it or change --task";
        if (!spec->def && eq != std::string::npos) return "--train-args: --" + name + " takes no value";
        if (spec->def && eq == std::string::npos && ++i == words.size())
            return "--train-args: --" + name + " needs a value";
    }
    return "";
}

// The train flags of every run: the preset's ("--flag value" pairs), less
// those --train-args gives (--steps and --epochs count as one: each sets the
// length of the run), then --train-args, split as the shell would
// (shell_words). "" or the problem with --train-args, found before any run starts.
static std::string merge_train_args(const std::string& preset_args, const std::string& extra, const std::string& task,
                                    std::vector<std::string>* out) {
    std::vector<std::string> own, pairs = split(preset_args, ' ');
    std::string err = shell_words(extra, &own);
    if (!err.empty()) return "--train-args: " + err + "; quote as the shell does, e.g. \"--text-file 'my notes.txt'\"";
    std::set<std::string> given;
    err = check_train_words(own, task, &given);
    if (!err.empty()) return err;
    if (task == "text" && !given.count("text-file"))
        return "--task text needs a file: add --train-args \"--text-file FILE\"";
    if (given.count("steps") && given.count("epochs"))
        return "--train-args gives both --steps and --epochs; give one of them (each sets the length of the runs)";
    if (given.count("steps") || given.count("epochs")) given.insert({"steps", "epochs"});
    out->clear();
    for (size_t i = 0; i + 1 < pairs.size(); i += 2)  // the preset's, less those of other tasks and --ops (compare's)
        if (!given.count(pairs[i].substr(2)) && !task_owning_flag(pairs[i].substr(2), task) && pairs[i] != "--ops")
            out->insert(out->end(), {pairs[i], pairs[i + 1]});
    out->insert(out->end(), own.begin(), own.end());
    return "";
}

// The text of --NAME in the runs' flags (the last one), else def.
static std::string run_flag_text(const std::vector<std::string>& args, const std::string& name, const std::string& def) {
    std::string v = def;
    for (size_t i = 0; i < args.size(); i++) {
        if (args[i] == "--" + name && i + 1 < args.size()) v = args[i + 1];
        if (args[i].rfind("--" + name + "=", 0) == 0) v = args[i].substr(name.size() + 3);
    }
    return v;
}
// The value of --NAME in the runs' flags (the last one), else def; -1 when
// it is not a whole number in 1 .. 10^6 (train will refuse it: *err says so,
// blaming --train-args, where it came from).
static int run_flag(const std::vector<std::string>& args, const std::string& name, int def, std::string* err = nullptr) {
    std::string v = run_flag_text(args, name, std::to_string(def));
    if (v.empty() || v.size() > 7 || v.find_first_not_of("0123456789") != std::string::npos || atoi(v.c_str()) < 1) {
        if (err && err->empty()) *err = "--train-args: --" + name + " '" + v + "' is not a positive whole number";
        return -1;
    }
    return atoi(v.c_str());
}
// The layers the runs will have: the last --layers of their flags, else train's default.
static int run_layers(const std::vector<std::string>& args) { return run_flag(args, "layers", 4); }

// The variants of every registered model that has some: "lime:average, ..., hc:static".
static std::string archs_variants() {
    std::string s;
    for (const ModelEntry& m : model_registry())
        if (*m.variants) s += (s.empty() ? "" : ", ") + std::string(m.variants);
    return s;
}
// --archs' help: every registered model and its variants (built once, from the registry).
static const char* archs_help() {
    static const std::string help = "models to compare: " + model_names() + "; variants " + archs_variants() +
                                    "; any of them with :ereg=LAMBDA (the value-entropy regulariser, e.g. "
                                    "llama:ereg=0.1)";
    return help.c_str();
}

// --archs: each model named once, each one compare can train with the runs'
// layers (a last-J or first-J needs J <= layers). One line per problem, the first kept.
static void check_archs(Args& a, const std::vector<std::string>& archs, int layers, int kv_heads) {
    std::set<std::string> seen;
    for (const std::string& s : archs) {
        Config c;
        // a lambda of 0, or one float32 loses, names no regularised model: said apart
        size_t ereg = s.rfind(":ereg=");
        char* end = nullptr;
        double lambda = ereg == std::string::npos ? 1 : strtod(s.c_str() + ereg + 6, &end);
        bool whole = ereg != std::string::npos && end != s.c_str() + ereg + 6 && !*end;
        if (whole && (lambda == 0 || (lambda > 0 && lambda < FLT_MIN)) && model_parse(s.substr(0, ereg), &c)) {
            a.fail("--archs: '" + s + "': " + (lambda == 0 ? "a lambda of 0 is the plain model: write " +
                                                                 s.substr(0, ereg)
                                                           : "the lambda " + entropy_reg_check(lambda)));
            continue;
        }
        if (!model_parse(s, &c)) {
            size_t colon = s.find(':');
            std::string base = s.substr(0, colon);
            Arch arch;
            bool known = arch_parse(base, &arch);
            if (known && colon != std::string::npos && !*model_entry(arch).variants)  // e.g. resformer:same-head
                a.fail("--archs: '" + s + "': " + base + " takes no variant (" + s.substr(colon) +
                       " is another model's), only :ereg=LAMBDA; write " + base);
            else
                a.fail("--archs: '" + s + "' is not a model: the models are " + model_names() + "; variants " +
                       archs_variants() + "; each with an optional :ereg=LAMBDA (the regulariser's lambda: a "
                       "number > 0 that float32 keeps, at least 1.2e-38, e.g. llama:ereg=0.1; the plain model has "
                       "no :ereg)");
            continue;
        }
        if (!seen.insert(model_name(c)).second)
            a.fail("--archs '" + a.str("archs") + "' names " + model_name(c) + " twice; give each model once");
        c.L = layers;
        if (c.L < 1) continue;  // --train-args' --layers is not a number: said already
        c.V = c.T = c.H = c.R = c.F = 1;
        c.d = c.hd = 2;
        std::string why = config_check(c);
        if (!why.empty() && c.arch == ARCH_HC) a.fail("--archs: '" + s + "': " + why + "; e.g. hc:n2");
        else if (!why.empty()) a.fail("--archs: '" + s + "' with the runs' " + std::to_string(c.L) + " layers: " + why);
        c.R = kv_heads;  // an ablation that is lime itself at the runs' shape (lime:same-head with one kv head)
        why = why.empty() && kv_heads >= 1 ? ablation_vacuous(c) : "";
        if (!why.empty())
            a.fail("--archs: '" + s + "' at the runs' " + std::to_string(c.L) + " layers and " + std::to_string(c.R) +
                   (c.R == 1 ? " kv head: " : " kv heads: ") + why + " in --train-args, or drop it");
    }
}

// Reads and checks the flags (one line and exit status 2 at the first
// problem) and picks the device. Nothing is written yet.
static CompareSettings compare_settings(Args& a) {
    CompareSettings cs;
    cs.preset = find_preset(a.str("preset"));
    const Preset* preset = cs.preset;
    if (!preset) a.fail("--preset '" + a.str("preset") + "' is not one of classroom|cpu-study|paper-aet|referee|reviewers|learning-speed|tiny");
    cs.task = a.choice("task", {"arith", "prosqa", "text"});
    cs.alpha = a.number("alpha", 0, 100);
    if (a.err.empty() && !(cs.alpha > 0))
        a.fail("--alpha " + a.str("alpha") + ": the Renyi order must be positive (1: Shannon, 0.5: the authors')");
    cs.seeds = a.has("seeds") ? (int)a.integer("seeds", 1, 1000) : preset ? preset->seeds : 1;
    if (cs.task != "arith" && a.has("tiers"))
        a.fail("--tiers is for --task arith (operators per question); drop it for --task " + cs.task);
    std::string tiers = cs.task != "arith" ? cs.task : a.has("tiers") ? a.str("tiers") : preset ? preset->tiers : "3";
    cs.tiers = split(tiers, ',');
    if (cs.tiers.empty()) a.fail("--tiers is empty; give one or more tiers (operators per question), e.g. 4,5,6");
    std::set<int> tiers_seen;
    for (const std::string& t : cs.task == "arith" ? cs.tiers : std::vector<std::string>())
        if (t.find_first_not_of("0123456789") != std::string::npos || atoi(t.c_str()) < 1 || atoi(t.c_str()) > 64)
            a.fail("--tiers '" + a.str("tiers") + "': each tier is a number of operators in 1..64, e.g. 4,5,6");
        else if (!tiers_seen.insert(atoi(t.c_str())).second)
            a.fail("--tiers '" + a.str("tiers") + "' names tier " + std::to_string(atoi(t.c_str())) +
                   " twice; give each tier once");
    std::string err = preset ? merge_train_args(preset->train_args, a.str("train-args"), cs.task, &cs.run_args) : "";
    for (int i = 0; preset && err.empty() && i < preset->n_plans; i++)  // a planned tier's flags replace the preset's
        err = merge_train_args(tier_train_args(*preset, preset->plans[i]), a.str("train-args"), cs.task,
                               &cs.tier_run_args[preset->plans[i].tier]);
    if (err.empty()) run_flag(cs.run_args, "layers", 4, &err);  // --archs is checked with these layers below
    if (err.empty()) run_flag(cs.run_args, "modulus", 11, &err);
    if (!err.empty()) a.fail(err);
    cs.archs = split(a.has("archs") || !preset ? a.str("archs") : preset_archs(*preset), ',');
    if (cs.archs.empty()) a.fail("--archs is empty; give one or more models, e.g. --archs llama,lime");
    int heads = run_flag(cs.run_args, "heads", 4);  // and kv heads (train's default: --heads)
    check_archs(a, cs.archs, run_layers(cs.run_args), heads < 1 ? 0 : run_flag(cs.run_args, "kv-heads", heads));
    // a tier the preset plans keeps its own seeds and models, unless --seeds or --archs says otherwise
    for (const std::string& tier : cs.task == "arith" ? cs.tiers : std::vector<std::string>()) {
        const TierPlan* plan = plan_of(preset, tier);
        if (plan && !a.has("seeds")) cs.tier_seeds[tier] = plan->seeds;
        if (plan && !a.has("archs")) cs.tier_archs[tier] = split(plan->archs, ',');
    }
    cs.reuse = a.has("reuse");
    int jobs = (int)a.integer("jobs", 0, 256);
    std::string device = a.choice("device", {"auto", "cpu", "gpu"});
    cs.dir = a.str("out");
    if (cs.dir.empty()) a.fail("--out needs a directory");
    if (!a.err.empty()) die("compare", a.err);
    std::string why;
    cs.gpu = device == "gpu" || (device == "auto" && gpu_available(&why));
    if (device == "gpu" && !gpu_available(&why)) die("compare", "--device gpu: " + why);
    if (!cs.gpu && run_flag_text(cs.run_args, "precision", "float32") == "bf16")
        die("compare", "--train-args gives --precision bf16, which is for the GPU, and the runs are on the CPU (the "
                       "CPU trains in float32): drop it, or use --device gpu on a machine with one");
    int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    cs.fit = cs.gpu && jobs == 0;
    cs.jobs = jobs == 0 ? (cs.gpu ? 16 : std::max(1, cores)) : jobs;
    cs.threads = cs.gpu ? cores : std::max(1, cores / cs.jobs);  // (a GPU group is one process)
    cs.self = exe_path();
    if (cs.self.empty()) die("compare", "cannot find this program's path (/proc/self/exe)");
    return cs;
}

// Accuracy by guessing: arith 1 / modulus (train's default 11), prosqa 1/2
// (two candidate answers); text has none (NaN).
static double chance_of(const CompareSettings& cs) {
    if (cs.task == "text") return NAN;
    return cs.task == "prosqa" ? 0.5 : 1.0 / std::max(2, run_flag(cs.run_args, "modulus", 11));
}

// --threshold, --lr-grid and --tuning-seeds, checked before any run starts
// (one line and exit status 2 at the first problem).
static void learning_settings(Args& a, CompareSettings* cs) {
    bool text = cs->task == "text";
    double chance = chance_of(*cs), def = text ? NAN : default_threshold(chance);
    if (text && a.has("threshold"))
        die("compare", "--threshold is a level of accuracy, which --task text has not (it reports validation loss); "
                       "drop --threshold");
    cs->threshold = def;
    if (a.has("threshold")) {
        std::string v = a.str("threshold");
        char* end = nullptr;
        double x = strtod(v.c_str(), &end);
        if (v.empty() || *end || !std::isfinite(x) || !(x > 100 * chance) || x > 100)
            die("compare", "--threshold '" + v + "': a run learns when its learning curve reaches it, so it is a " +
                               "percent above chance (" + fmt("%.2f%%", 100 * chance) + ") and at most 100%; e.g. " +
                               "--threshold 50 (the default: halfway from chance to 90%, " +
                               fmt("%.2f%%)", 100 * def));
        cs->threshold = x / 100;
    }
    std::string grid = a.has("lr-grid") ? a.str("lr-grid") : cs->preset && cs->preset->lr_grid ? cs->preset->lr_grid : "";
    if (a.has("lr-grid") && grid.empty())
        die("compare", "--lr-grid is empty; give two or more rates, e.g. --lr-grid 2e-3,3e-3,5e-3 (or --lr-grid off)");
    if (grid == "off") grid.clear();
    if (a.has("tuning-seeds") && grid.empty())
        die("compare", "--tuning-seeds is for --lr-grid (the seeds that pick each model's rate); give --lr-grid too, "
                       "or drop --tuning-seeds");
    if (grid.empty()) return;
    if (text)
        die("compare", "--lr-grid picks each model's rate by its time to learn, which --task text (no accuracy) has "
                       "not; drop --lr-grid, or give --lr-grid off (learning-speed's grid)");
    std::vector<std::string> words;
    shell_words(a.str("train-args"), &words);
    for (const std::string& w : words)
        if (w == "--lr" || w.rfind("--lr=", 0) == 0)
            die("compare", "--train-args gives --lr and --lr-grid picks each model's rate; drop one of them");
    std::vector<double> rates;
    if (grid.front() == ',' || grid.back() == ',' || grid.find(",,") != std::string::npos)
        die("compare", "--lr-grid '" + grid + "' has an empty rate; give rates separated by commas, e.g. 2e-3,3e-3,5e-3");
    for (const std::string& v : split(grid, ',')) {
        char* end = nullptr;
        double x = strtod(v.c_str(), &end);
        if (*end || !std::isfinite(x) || !(x > 0) || x > 10)
            die("compare", "--lr-grid '" + grid + "': '" + v + "' is not a learning rate (a finite number > 0, at " +
                               "most 10 as train's --lr); e.g. --lr-grid 2e-3,3e-3,5e-3");
        for (size_t i = 0; i < rates.size(); i++)
            if (rates[i] == x)
                die("compare", "--lr-grid '" + grid + "' gives the rate " + cs->lr_grid[i] + " twice" +
                                   (cs->lr_grid[i] == v ? "" : " (as " + v + ")") + "; give each rate once");
        rates.push_back(x);
        cs->lr_grid.push_back(v);
    }
    std::string seeds = a.has("tuning-seeds") ? a.str("tuning-seeds") : "101,102";
    int evaluation = cs->seeds;  // the evaluation seeds are 1 .. this (a planned tier's own count included)
    for (const auto& [tier, n] : cs->tier_seeds) evaluation = std::max(evaluation, n);
    if (seeds.empty() || seeds.front() == ',' || seeds.back() == ',' || seeds.find(",,") != std::string::npos)
        die("compare", "--tuning-seeds '" + seeds + "' has an empty seed; give seeds separated by commas, e.g. 101,102");
    for (const std::string& v : split(seeds, ',')) {
        if (v.size() > 9 || v.find_first_not_of("0123456789") != std::string::npos)
            die("compare", "--tuning-seeds '" + seeds + "': '" + v + "' is not a whole number 0 .. 999999999; e.g. "
                           "--tuning-seeds 101,102");
        int s = atoi(v.c_str());
        if (s >= 1 && s <= evaluation)
            die("compare", "--tuning-seeds '" + seeds + "': seed " + v + " is an evaluation seed (1 .. " +
                               std::to_string(evaluation) + "): a rate picked on the seeds it is judged on favours " +
                               "them; use seeds above " + std::to_string(evaluation) + ", e.g. " +
                               std::to_string(std::max(100, evaluation) + 1) + "," +
                               std::to_string(std::max(100, evaluation) + 2));
        if (std::find(cs->tuning_seeds.begin(), cs->tuning_seeds.end(), s) != cs->tuning_seeds.end())
            die("compare", "--tuning-seeds '" + seeds + "' gives seed " + v + " twice; give each seed once");
        cs->tuning_seeds.push_back(s);
    }
}

// Every (tier, seed, model), each with its own directory, DIR/tierT/MODEL-seedS.
static std::vector<Run> plan_runs(const CompareSettings& cs) {
    std::vector<Run> runs;
    for (const std::string& tier : cs.tiers)
        for (int s = 1; s <= (cs.tier_seeds.count(tier) ? cs.tier_seeds.at(tier) : cs.seeds); s++)
            for (const std::string& arch : cs.tier_archs.count(tier) ? cs.tier_archs.at(tier) : cs.archs) {
                Run r;
                r.arch = arch; r.tier = tier; r.seed = s;
                std::string name = arch;
                std::replace(name.begin(), name.end(), ':', '-');  // lime:last-2 runs in lime-last-2-seed1
                r.dir = cs.dir + "/" + (cs.task == "arith" ? "tier" + tier : tier) + "/" + name + "-seed" +
                        std::to_string(s);
                runs.push_back(r);
            }
    return runs;
}

// --lr-grid: every (tier, tuning seed, model, rate), each in its own
// directory, DIR/tuning/tierT/MODEL-lrRATE-seedS.
static std::vector<Run> plan_tuning_runs(const CompareSettings& cs) {
    std::vector<Run> runs;
    for (const std::string& tier : cs.tiers)
        for (int s : cs.tuning_seeds)
            for (const std::string& arch : cs.tier_archs.count(tier) ? cs.tier_archs.at(tier) : cs.archs)
                for (const std::string& lr : cs.lr_grid) {
                    Run r;
                    r.arch = arch; r.tier = tier; r.seed = s; r.lr = lr;
                    std::string name = arch;
                    std::replace(name.begin(), name.end(), ':', '-');
                    r.dir = cs.dir + "/tuning/" + (cs.task == "arith" ? "tier" + tier : tier) + "/" + name + "-lr" +
                            lr + "-seed" + std::to_string(s);
                    runs.push_back(r);
                }
    return runs;
}

// --out, made, and DIR/compare.lock taken for the life of compare (lock_file):
// a second compare into the same --out is refused at once, naming the
// holder, before it writes anything (its runs would reopen the first's
// train.out files and replace its models). Returns the lock's descriptor.
static int lock_out(const std::string& dir) {
    std::string err, why;
    if (!make_dir(dir, &err)) die("compare", err + " (choose another --out)");
    long pid = 0;
    int fd = lock_file(dir + "/compare.lock", &pid, &why);
    if (fd == -2) die("compare", "cannot use " + dir + "/compare.lock (" + why + "), the lock compare holds on its " +
                                 "--out; remove it if it is not a file, or choose another --out");
    if (fd == -1)
        die("compare", "--out " + dir + " is in use by another ./lime compare (" +
                           (pid > 0 ? "pid " + std::to_string(pid) : std::string("its pid not written yet")) +
                           "); wait for it to end or stop it, or choose another --out");
    return fd;
}

// A run's directories below --out (DIR/tierT, then DIR/tierT/MODEL-seedS) are
// compare's own: each a real directory, or not there yet. compare passes
// --force to its runs, which would replace whatever a symbolic link there
// points to: a link, a file, or a directory whose real path lies outside
// --out's is refused, before any run starts. "" or the problem.
static std::string check_run_dir(const std::string& out, const std::string& dir) {
    std::string path = out;
    for (const std::string& part : split(dir.substr(out.size()), '/')) {
        path += "/" + part;
        struct stat sb;
        if (lstat(path.c_str(), &sb) != 0) {
            if (errno == ENOENT) return "";  // compare makes it
            return "cannot use " + path + ": " + strerror(errno);
        }
        if (S_ISLNK(sb.st_mode) || !S_ISDIR(sb.st_mode))
            return path + " is " + (S_ISLNK(sb.st_mode) ? "a symbolic link" : "not a directory") +
                   ", where compare makes a run's directory (it replaces what a run directory holds); remove it, or "
                   "choose another --out";
    }
    char real_out[PATH_MAX], real_dir[PATH_MAX];
    if (!realpath(out.c_str(), real_out) || !realpath(dir.c_str(), real_dir))
        return "cannot resolve " + dir + ": " + strerror(errno);
    if (std::string(real_dir).rfind(std::string(real_out) + "/", 0) != 0)
        return dir + " resolves to " + real_dir + ", outside --out (" + real_out + "); remove it, or choose "
               "another --out";
    return "";
}

// Whether compare gives a run its learning curve (train --curve): on a task with an accuracy,
// unless --train-args spaces the evaluations itself (--eval-every: the curve is those).
static bool logs_curve(const CompareSettings& cs, const std::vector<std::string>& args) {
    return cs.task != "text" && run_flag_text(args, "eval-every", "").empty();
}

// The flags of one run's ./lime train: the preset's with --train-args (run_args), then the run's own.
static std::vector<std::string> train_args_of(const CompareSettings& cs, const Run& r) {
    std::vector<std::string> args = cs.tier_run_args.count(r.tier) && cs.task == "arith" ? cs.tier_run_args.at(r.tier)
                                                                                          : cs.run_args;
    Config model;
    model_parse(r.arch, &model);
    // --force: the run directories are compare's own (check_run_dir), made afresh by each compare into its --out
    std::vector<std::string> own = {"--arch", arch_name(model.arch), "--seed", std::to_string(r.seed),
                                    "--out", r.dir, "--threads", std::to_string(cs.threads),
                                    "--device", cs.gpu ? "gpu" : "cpu", "--quiet", "--force"};
    if (cs.task == "arith") own.insert(own.end(), {"--ops", r.tier});
    else own.insert(own.end(), {"--task", cs.task});
    if (model.arch == ARCH_LIME && model.router != ROUTER_STATIC)
        own.insert(own.end(), {"--router", router_name(model)});
    if (model.router_kv_separate) own.insert(own.end(), {"--router-kv", "separate"});
    if (model.router_frozen) own.insert(own.end(), {"--router-weights", "frozen"});
    if (model.router_same_head) own.insert(own.end(), {"--router-heads", "same"});
    if (model.arch == ARCH_HC)
        own.insert(own.end(), {"--hc-rate", std::to_string(model.hc_rate), "--hc-dynamic", model.hc_dynamic ? "1" : "0"});
    if (model.arch == ARCH_MUDDFORMER) own.insert(own.end(), {"--mudd-ways", model.mudd_ways == MUDD_KV ? "kv" : "qkvr"});
    if (model.entropy_reg > 0) own.insert(own.end(), {"--entropy-reg", fmt("%.9g", model.entropy_reg)});
    if (logs_curve(cs, args)) {  // its learning curve
        own.insert(own.end(), {"--curve", std::to_string(CURVE_POINTS)});
        if (run_flag_text(args, "eval-size", "").empty()) own.insert(own.end(), {"--eval-size", std::to_string(CURVE_SIZE)});
    }
    if (!r.lr.empty()) {  // --lr-grid: the run's own rate in place of the preset's
        for (size_t i = 0; i < args.size();)
            if (args[i] == "--lr" && i + 1 < args.size()) args.erase(args.begin() + i, args.begin() + i + 2);
            else if (args[i].rfind("--lr=", 0) == 0) args.erase(args.begin() + i);
            else i++;
        own.insert(own.end(), {"--lr", r.lr});
    }
    args.insert(args.end(), own.begin(), own.end());
    return args;
}

// The flags of one run's ./lime analyze: its model, into its directory.
static std::vector<std::string> analyze_args_of(const CompareSettings& cs, const Run& r) {
    return {"--load", r.dir + "/model.safetensors", "--out", r.dir, "--alpha", fmt("%.17g", cs.alpha),
            "--threads", std::to_string(cs.threads), "--device", cs.gpu ? "gpu" : "cpu"};
}

// --reuse: the valued flags of a train command line (--NAME VALUE or
// --NAME=VALUE; switches carry none), as train records them in its log's "args".
static std::map<std::string, std::string> flag_values(const std::vector<std::string>& args) {
    static const std::vector<FlagSpec> flags = train_flags();
    std::map<std::string, std::string> out;
    for (size_t i = 0; i < args.size(); i++) {
        size_t eq = args[i].find('=');
        std::string name = args[i].substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
        auto spec = std::find_if(flags.begin(), flags.end(), [&](const FlagSpec& f) { return name == f.name; });
        if (spec == flags.end() || !spec->def) continue;
        out[name] = eq != std::string::npos ? args[i].substr(eq + 1) : i + 1 < args.size() ? args[++i] : "";
    }
    return out;
}

// "" when a run whose log recorded the train flags `old` is the run `now`
// would make, else the first flag whose value differs, named. Both ways: a
// flag given on one side only counts at train's default on the other. Not
// compared: where a run writes and how fast (--out, --threads, --device).
// The length is the one of --steps and --epochs given (compare always gives
// one; train records "steps" always, "epochs" only when given).
static std::string flags_differ(const std::map<std::string, std::string>& old,
                                const std::map<std::string, std::string>& now) {
    static const std::vector<FlagSpec> flags = train_flags();
    auto value = [&](const std::map<std::string, std::string>& m, const std::string& k, bool* def) {
        auto it = m.find(k);
        *def = it == m.end();
        if (!*def) return it->second;
        for (const FlagSpec& f : flags) if (k == f.name && f.def) return std::string(f.def);
        return std::string("(none)");
    };
    auto same = [](const std::string& a, const std::string& b) {  // 1e-3 and 0.001 are one value
        char *ea, *eb;
        double x = strtod(a.c_str(), &ea), y = strtod(b.c_str(), &eb);
        return a == b || (!a.empty() && !b.empty() && !*ea && !*eb && x == y);
    };
    // the length first: compare always gives one of --steps and --epochs, and
    // train records "steps" always, "epochs" only when given
    std::string old_length = old.count("epochs") ? "epochs" : "steps", length = now.count("steps") ? "steps" : "epochs";
    bool old_def, now_def;
    if (old_length != length)
        return "--" + old_length + " " + value(old, old_length, &old_def) + ", this call gives --" + length + " " +
               value(now, length, &now_def);
    std::set<std::string> keys;
    for (const auto& kv : old) keys.insert(kv.first);
    for (const auto& kv : now) keys.insert(kv.first);
    for (const std::string& k : keys) {
        if (k == "out" || k == "threads" || k == "device" || ((k == "steps" || k == "epochs") && k != length)) continue;
        std::string a = value(old, k, &old_def), b = value(now, k, &now_def);
        if (!same(a, b))
            return "--" + k + " " + a + (old_def ? " (train's default)" : "") + ", this call gives --" + k + " " + b +
                   (now_def ? " (train's default)" : "");
    }
    return "";
}

// --reuse: each run whose directory holds a finished training (a done line
// in log.jsonl) is read, not run again, when its recorded train flags are
// this call's (flags_differ), and so is its analysis when made with this
// --alpha (else it is analysed again). A finished run of other flags, or
// whose files fail their checks (read_log, read_entropy), is refused, naming
// the flag or the value: it is not this call's run, and running it again
// would replace it. So a compare stopped part way (Ctrl-C, a lost session,
// too little time) can finish, or report on fewer seeds, with the runs it has.
// Returns the runs reused; *analysed_again those whose analysis is redone.
static int reuse_runs(const CompareSettings& cs, std::vector<Run>* runs, int* analysed_again) {
    int reused = 0;
    *analysed_again = 0;
    for (Run& planned : *runs) {
        Run r = planned;
        bool done = false, stale = false;
        std::string err = read_log(&r, cs.task, &done);
        if (!done) continue;  // not finished: it runs again
        std::string fix = "; remove " + r.dir + " to run it again, drop --reuse to run every run again, or choose "
                          "another --out";
        if (!err.empty()) die("compare", "--reuse: " + err + ": the file was altered or damaged" + fix);
        if (logs_curve(cs, train_args_of(cs, r)) && r.curve_acc.size() < (size_t)CURVE_MIN_POINTS)  // before its flags
            die("compare", "--reuse: " + r.dir + "/log.jsonl has no learning curve (" +
                               std::to_string(r.curve_acc.size()) + " evaluations with an accuracy; compare's " +
                               "runs log " + std::to_string(CURVE_POINTS) + ", train --curve " +
                               std::to_string(CURVE_POINTS) + "): its time to learn is unknown, not \"never\"" + fix);
        std::string differ = flags_differ(r.args, flag_values(train_args_of(cs, r)));
        if (!differ.empty())
            die("compare", "--reuse: " + r.dir + " was trained with " + differ + "; give the same flags to reuse "
                           "it" + fix);
        err = read_entropy(&r, cs.alpha, &stale);
        if (!err.empty()) die("compare", "--reuse: " + err + ": the file was altered or damaged" + fix);
        r.status = 0;  // as a child that exited 0
        r.stage = stale ? Run::TRAINED : Run::DONE;
        *analysed_again += stale;
        reused++;
        planned = r;
    }
    return reused;
}

// SIGINT, SIGTERM and SIGHUP to compare only set this flag: run_all
// forwards the signal to every running run (each saves a checkpoint and
// stops, as train does), waits for them all, and exits 128 + the signal.
// SIGPIPE is ignored: a closed stdout (./lime compare | head -1) shows as
// EPIPE in say, which sets the flag to SIGPIPE, and the runs stop the same way.
static volatile sig_atomic_t g_compare_signal = 0;
// A stdout that is a pipe nobody reads would keep compare blocked in a
// write: the handler makes it non-blocking (as train's on_stop_signal does).
static int g_compare_stdout_flags = -1;
static void on_compare_signal(int sig) {
    g_compare_signal = sig;
    if (g_compare_stdout_flags >= 0) fcntl(1, F_SETFL, g_compare_stdout_flags | O_NONBLOCK);
}

// One line of progress on stdout; when stdout is closed (EPIPE) compare stops its runs.
static void say(const std::string& line) {
    if (fputs(line.c_str(), stdout) < 0 || fflush(stdout) != 0)
        if (errno == EPIPE && !g_compare_signal) g_compare_signal = SIGPIPE;
}

// "tier 2 lime  seed 1": a run as the progress lines name it.
static std::string run_name(const Run& r) {
    bool tier = r.tier.find_first_not_of("0123456789") == std::string::npos;  // arith's tiers are numbers
    return (tier ? "tier " : "") + r.tier + " " + strf("%-5s", r.arch.c_str()) + " seed " + std::to_string(r.seed) +
           (r.lr.empty() ? "" : " lr " + r.lr);
}

// A run's training has ended (or could not start: status -1, r->failure says
// why): its status, memory and time, its log read, one line printed; a
// failed run's line says how it ended and where its last words are.
static void finish_run(const CompareSettings& cs, Run* r, int status, const struct rusage& ru, double started,
                       size_t done, size_t total) {
    r->status = status;
    r->max_rss_mb = ru.ru_maxrss / 1024.0;
    r->seconds = (now_ms() - started) / 1000;
    bool ok = status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0, finished = false;
    if (ok) {
        std::string err = read_log(r, cs.task, &finished);
        if (err.empty() && !finished) err = one_line(r->dir) + "/log.jsonl has no done line, though train exited 0";
        if (!err.empty()) r->failure = err, ok = false;
    } else if (status >= 0) {
        r->failure = how_it_ended(status) + "; " + last_words(r->dir + "/train.out");
    }
    r->stage = ok ? Run::TRAINED : Run::DONE;
    std::string result = !ok ? "FAILED" : std::isfinite(r->accuracy) ? "accuracy " + pct(r->accuracy)
                                                                      : "val loss " + fmt("%.4f", r->val_loss);
    say("[" + std::to_string(done) + "/" + std::to_string(total) + "] " + run_name(*r) + ": " + result + " in " +
        duration_str(r->seconds) + (ok ? "" : ": " + one_line(r->failure)) + "\n");
}

// A run's analysis has ended: its entropy read (a failed analysis fails compare).
static void finish_analysis(const CompareSettings& cs, Run* r, int status) {
    r->stage = Run::DONE;
    bool stale = false;
    if (status >= 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
        r->failure = "its analysis: " + how_it_ended(status) + "; " + last_words(r->dir + "/analyze.out");
    else if (status >= 0 && (r->failure = read_entropy(r, cs.alpha, &stale)).empty() && stale)
        r->failure = one_line(r->dir) + "/entropy.tsv is not the analysis compare asked for (--alpha " +
                     fmt("%g", cs.alpha) + ")";
}

// The next run to end (its pid), 0 when a signal came first, -1 when none is left.
static pid_t wait_run(int* status, struct rusage* ru) {
    for (;;) {
        pid_t pid = wait4(-1, status, WNOHANG, ru);
        if (pid != 0 || g_compare_signal) return pid;
        usleep(20 * 1000);
    }
}

// The line compare ends with when stopped (stderr when stdout is closed or
// stuck), and its exit status: 128 + the signal; 1 when stdout was closed.
[[noreturn]] static void compare_stopped(int sig, int stopped) {
    const char* what = sig == SIGINT ? "interrupted (SIGINT)" : sig == SIGTERM ? "terminated (SIGTERM)"
                       : sig == SIGHUP ? "hung up (SIGHUP)" : "stopped: its output was closed (EPIPE)";
    std::string runs = stopped == 0 ? "no run was running"
                       : (sig == SIGPIPE ? "sent SIGTERM" : "passed it") + std::string(" to ") + std::to_string(stopped) +
                             " running run" + (stopped == 1 ? "" : "s") + ", each saving a checkpoint in its directory "
                             "(./lime train --resume DIR/checkpoint.safetensors goes on)";
    std::string line = std::string("compare ") + what + ": " + runs +
                       "; no report written; finished runs are kept (rerun with --reuse)\n";
    if (sig == SIGPIPE) fputs(("lime " + line).c_str(), stderr);
    else if (fputs(line.c_str(), stdout) < 0 || fflush(stdout) != 0) fputs(line.c_str(), stderr);
    exit(sig == SIGPIPE ? 1 : 128 + sig);
}

// A signal came: it goes to every running run, then compare waits for them
// (forwarding a second signal too: the runs then end at once) and exits.
static void stop_runs(std::vector<Run>* runs, int sig) {
    int stopped = 0;
    auto running = [](const Run& r) { return r.stage == Run::TRAINING || r.stage == Run::ANALYSING; };
    for (const Run& r : *runs) stopped += running(r);
    for (int forward = sig == SIGPIPE ? SIGTERM : sig;; forward = g_compare_signal == SIGPIPE ? SIGTERM : g_compare_signal) {
        std::set<pid_t> sent;  // once each: a GPU group's runs share one process (a second SIGINT ends it unsaved)
        for (const Run& r : *runs) if (running(r) && sent.insert(r.pid).second) kill(r.pid, forward);
        g_compare_signal = 0;
        int status;
        struct rusage ru;
        pid_t pid;
        while ((pid = wait_run(&status, &ru)) > 0)
            for (Run& r : *runs) if (r.pid == pid && running(r)) r.stage = Run::DONE;
        if (pid < 0) break;
    }
    compare_stopped(sig, stopped);
}

// The next child to start: a trained run's analysis first, else the next run's training.
static Run* next_to_start(std::vector<Run>* runs) {
    for (Run& r : *runs) if (r.stage == Run::TRAINED) return &r;
    for (Run& r : *runs) if (r.stage == Run::WAITING) return &r;
    return nullptr;
}

// Starts r's training (in its directory, made and checked again here) or,
// once trained, its analysis. false, with r->failure, when it could not start.
static bool start_next(const CompareSettings& cs, Run* r) {
    bool analyse = r->stage == Run::TRAINED;
    std::string why;
    if (!analyse && make_dir(r->dir, &why)) why = check_run_dir(cs.dir, r->dir);
    if (why.empty())
        r->pid = analyse ? start_run(cs.self, *r, "analyze", analyze_args_of(cs, *r), &why)
                         : start_run(cs.self, *r, "train", train_args_of(cs, *r), &why);
    r->failure = why;
    r->stage = analyse ? Run::ANALYSING : Run::TRAINING;
    return why.empty();
}

// On the GPU (--jobs above 1) the runs train --jobs at a time in ONE child
// process, ./lime train-group (train.cpp: separate processes would take turns
// on the GPU), one group after another. Each run's directory and DIR/train.out
// are made and checked here, as start_run's; the child writes to each run's own.
// A run ends as from ./lime train: its log's done line, else the group's exit status.
static void train_in_groups(const CompareSettings& cs, std::vector<Run>* runs, size_t* trained, size_t to_train) {
    struct rusage none = {};
    while (!g_compare_signal) {
        std::vector<Run*> group;
        std::vector<int> fds;
        std::vector<std::string> words = {cs.self, "train-group"};
        if (cs.fit) words.push_back("--fit");
        double started = now_ms();
        for (Run& r : *runs) {
            if (r.stage != Run::WAITING || (int)group.size() == cs.jobs) continue;
            std::string why;
            if (make_dir(r.dir, &why)) why = check_run_dir(cs.dir, r.dir);
            int fd = why.empty() ? open_run_output(r.dir + "/train.out", &why) : -1;
            r.stage = Run::TRAINING;
            if (!why.empty()) {
                r.failure = why;
                finish_run(cs, &r, -1, none, started, ++*trained, to_train);
                continue;
            }
            group.push_back(&r), fds.push_back(fd);
            words.push_back("--run"), words.push_back(std::to_string(fd));
            for (const std::string& w : train_args_of(cs, r)) words.push_back(w);
        }
        if (group.empty()) return;
        std::string why;  // the group's own words go to its first run's output (none, unless its arguments are wrong)
        pid_t pid = spawn(cs.self, words, fds[0], fds, &why);
        for (int fd : fds) close(fd);
        int status = -1;
        struct rusage ru = {};
        for (Run* r : group) r->pid = pid, r->failure = why;
        if (pid > 0) {
            while (wait_run(&status, &ru) == 0) stop_runs(runs, g_compare_signal);
            // --jobs beyond what the GPU holds, or one run more than it holds: no run of the group
            // started; one line, with how many fit (--jobs named only where it was given)
            const std::string mark = "not started: GPU memory: ";
            std::string last = last_words(group[0]->dir + "/train.out");
            size_t at = last.find(mark);
            if (WIFEXITED(status) && WEXITSTATUS(status) == 2 && at != std::string::npos)
                die("compare", (cs.fit ? std::string() : "--jobs " + std::to_string(cs.jobs) + ": ") +
                                   last.substr(at + mark.size(), last.find('"', at) - at - mark.size()));
        }
        for (Run* r : group) {
            Run probe = *r;
            bool finished = false;
            int st = status >= 0 && read_log(&probe, cs.task, &finished).empty() && finished ? 0 : status;
            finish_run(cs, r, st, ru, started, ++*trained, to_train);
            r->trained_with = (int)group.size() - 1;
            if (r->trained_with > 0) r->max_rss_mb = 0;  // the group's process, not the run's
        }
    }
}

// Runs every run, --jobs at a time, each as a child process (./lime train,
// then ./lime analyze of its model); returns when all have ended.
static void run_all(const CompareSettings& cs, std::vector<Run>* runs) {
    size_t trained = 0, to_train = 0;
    for (const Run& r : *runs) to_train += r.stage == Run::WAITING;
    int running = 0;
    std::vector<double> started(runs->size());
    struct stat sb;
    g_compare_stdout_flags = fstat(1, &sb) == 0 && (S_ISFIFO(sb.st_mode) || S_ISSOCK(sb.st_mode)) ? fcntl(1, F_GETFL) : -1;
    struct sigaction sa = {};
    sa.sa_handler = on_compare_signal;
    sa.sa_flags = SA_RESTART;
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
    struct rusage none = {};
    int at_once = cs.jobs;
    if (cs.gpu && cs.jobs > 1) {  // trained in groups; then the analyses, one per core
        train_in_groups(cs, runs, &trained, to_train);
        at_once = std::max(1, (int)sysconf(_SC_NPROCESSORS_ONLN));
    }
    for (;;) {
        Run* r;
        while (!g_compare_signal && running < at_once && (r = next_to_start(runs))) {
            size_t i = r - runs->data();
            started[i] = now_ms();
            bool training = r->stage == Run::WAITING;
            if (start_next(cs, r)) { running++; continue; }
            if (training) finish_run(cs, r, -1, none, started[i], ++trained, to_train);
            else finish_analysis(cs, r, -1);
        }
        if (running == 0) break;
        int status;
        struct rusage ru;
        pid_t pid = wait_run(&status, &ru);
        if (pid == 0) stop_runs(runs, g_compare_signal);
        if (pid < 0) break;
        for (Run& x : *runs) {
            if (x.pid != pid || (x.stage != Run::TRAINING && x.stage != Run::ANALYSING)) continue;
            running--;
            size_t i = &x - runs->data();
            if (x.stage == Run::TRAINING) finish_run(cs, &x, status, ru, started[i], ++trained, to_train);
            else finish_analysis(cs, &x, status);
        }
    }
}

// --lr-grid: the tuning runs (those --reuse finds done are read), then each
// model's rate (pick_rate), given to its evaluation runs; *lr_of records them.
static void tune_rates(const CompareSettings& cs, std::vector<Run>* tuning, std::vector<Run>* runs,
                       std::map<std::string, std::string>* lr_of) {
    int analysed_again = 0, reused = cs.reuse ? reuse_runs(cs, tuning, &analysed_again) : 0;
    std::string grid;
    for (const std::string& lr : cs.lr_grid) grid += (grid.empty() ? "" : ",") + lr;
    say("compare: --lr-grid " + grid + ": " + std::to_string(tuning->size()) + " tuning runs" +
        (cs.reuse ? " (" + std::to_string(reused) + " already done)" : std::string()) + "\n");
    run_all(cs, tuning);
    if (g_compare_signal) compare_stopped(g_compare_signal, 0);
    int failed = 0;
    for (const Run& r : *tuning) failed += !r.failure.empty();
    for (const Run& r : *tuning)
        if (!r.failure.empty())
            die("compare", std::to_string(failed) + " of " + std::to_string(tuning->size()) + " tuning runs failed; " +
                               "the first, " + run_name(r) + ": " + r.failure);
    std::string picked;
    for (Run& r : *runs) {
        std::string key = r.tier + "/" + r.arch;
        if (!lr_of->count(key)) {
            (*lr_of)[key] = pick_rate(*tuning, cs.lr_grid, r.tier, r.arch, cs.threshold);
            picked += (picked.empty() ? "" : ", ") + r.arch + " " + (*lr_of)[key];
        }
        r.lr = (*lr_of)[key];
    }
    say("compare: each model's rate: " + picked + "\n");
}

int cmd_compare(int argc, char** argv) {
    std::vector<FlagSpec> flags = {
        {"preset", "classroom",
         "classroom (2 CPU cores, ~10 min), cpu-study (2 CPU cores, ~30 min, with the frozen-router control), "
         "paper-aet (the paper's setting, GPU), referee (2 CPU cores, ~1 hour: llama with the value-entropy "
         "regulariser at 3 lambdas beside llama and lime), reviewers (2 CPU cores, about 4 hours: LIMe against "
         "ResFormer, DenseFormer, HC, MUDDFormer, DCA, the same-head router, frozen routers and the regulariser, 12 "
         "seeds at tier 3 and 6 at tier 4), learning-speed (2 CPU cores, about 4 hours: how fast each model learns, 36 epochs, "
         "each model at its own rate) or tiny (tests)"},
        {"task", "arith", "arith, prosqa (exact match on the real test file) or text (validation loss)"},
        {"seeds", "", "seeds per model (default: the preset's)"},
        {"tiers", "", "arith: operators per question, e.g. 4,5,6 (default: the preset's)"},
        {"archs", "llama,lime", archs_help()},
        {"alpha", "0.5", "order of the Renyi entropy each run's analysis reports (1: Shannon)"},
        {"train-args", "", "extra flags for every ./lime train, replacing the preset's, quoted as in the shell, "
                           "e.g. \"--epochs 30\" or \"--text-file 'my notes.txt'\""},
        {"jobs", "0", "runs at a time (0: one per core on the CPU; on the GPU as many as fit in its memory, at "
                      "most 16, trained together in one process)"},
        {"device", "auto", "auto, cpu or gpu"},
        {"out", "runs/compare", "output directory: one subdirectory per run, report.md, figures"},
        {"reuse", nullptr, "read the runs --out already holds, finished with the same train flags, not rerun "
                           "(a finished run of other flags is refused, naming the flag)"},
        {"threshold", "", "arith, prosqa: the percent of the learning curve at which a run has learned (default: "
                          "halfway from chance to 90%, 49.55% at modulus 11)"},
        {"lr-grid", "", "learning rates, e.g. 2e-3,3e-3,5e-3: each model trained at each on --tuning-seeds, then its "
                        "evaluation seeds at the one it learned fastest with (learning-speed: 2e-3,3e-3,5e-3; off: none)"},
        {"tuning-seeds", "", "--lr-grid's seeds, none of them an evaluation seed (default: 101,102)"},
    };
    std::string summary_help =
        "Trains LLaMa and LIMe for several seeds, evaluates and analyses them, and writes DIR/report.md:\n"
        "mean ± std, paired differences over seeds (paired-t interval, exact signed-rank test), entropy\n"
        "per layer, cost, and figures.\nPresets:";
    for (const Preset& p : PRESETS) summary_help += std::string("\n  ") + p.name + ": " + p.about;
    Args a = parse_args("compare", summary_help.c_str(), flags, argc, argv, false);
    signal(SIGPIPE, SIG_IGN);  // a closed stdout is EPIPE in say: the runs are stopped, one line on stderr
    CompareSettings cs = compare_settings(a);
    learning_settings(a, &cs);
    std::vector<Run> runs = plan_runs(cs), tuning = plan_tuning_runs(cs);
    int lock = lock_out(cs.dir);  // held until compare exits
    for (const std::vector<Run>* planned : {&runs, &tuning})
        for (const Run& r : *planned) {
            std::string err = check_run_dir(cs.dir, r.dir);
            if (!err.empty()) die("compare", err);
        }
    std::map<std::string, std::string> lr_of;  // --lr-grid: each model's rate, from its tuning runs
    if (!tuning.empty()) tune_rates(cs, &tuning, &runs, &lr_of);
    int analysed_again = 0, reused = cs.reuse ? reuse_runs(cs, &runs, &analysed_again) : 0;
    if (cs.reuse)
        say("compare: --reuse: " + std::to_string(reused) + " of " + std::to_string(runs.size()) +
            " runs already done in " + one_line(cs.dir) +
            (analysed_again ? "; " + std::to_string(analysed_again) + " analysed again (for --alpha " +
                                  fmt("%g", cs.alpha) + ", or an older analysis)" : std::string()) + "\n");
    std::string plan;  // per tier: seeds x models
    for (const std::string& tier : cs.tiers)
        plan += (plan.empty() ? "" : ", ") + std::to_string(cs.tier_seeds.count(tier) ? cs.tier_seeds.at(tier) : cs.seeds) +
                " seeds x " + std::to_string((cs.tier_archs.count(tier) ? cs.tier_archs.at(tier) : cs.archs).size()) +
                " models" + (cs.task == "arith" ? " at tier " + tier : "");
    say(strf("compare %s: %zu runs (%s), %d at a time, %d thread%s each, on the %s\n", cs.preset->name, runs.size(),
             plan.c_str(), cs.jobs, cs.threads, cs.threads > 1 ? "s" : "", cs.gpu ? "gpu" : "cpu"));
    double t0 = now_ms();
    run_all(cs, &runs);
    if (g_compare_signal) compare_stopped(g_compare_signal, 0);  // after the last run ended, before the report
    int failed = 0;
    for (const Run& r : runs) failed += !r.failure.empty();
    for (const Run& r : runs)
        if (!r.failure.empty())
            die("compare", std::to_string(failed) + " of " + std::to_string(runs.size()) + " runs failed; the first, " +
                               run_name(r) + ": " + r.failure);
    std::string summary, run_args;
    for (const std::string& arg : cs.run_args) run_args += (run_args.empty() ? "" : " ") + shell_quote(arg);
    for (const auto& [tier, args] : cs.tier_run_args) {  // a planned tier's own flags
        if (std::find(cs.tiers.begin(), cs.tiers.end(), tier) == cs.tiers.end()) continue;
        std::string t;
        for (const std::string& arg : args) t += (t.empty() ? "" : " ") + shell_quote(arg);
        if (t != run_args) run_args += "` (tier " + tier + ": `" + t + "`) `";
    }
    Report rep(cs.task, cs.tiers, cs.archs, runs, chance_of(cs));
    rep.threshold = cs.threshold;
    if (!tuning.empty()) rep.tuning = &tuning, rep.lr_of = lr_of, rep.lr_grid = cs.lr_grid, rep.tuning_seeds = cs.tuning_seeds;
    std::string err = write_report(cs.dir, cs.preset, run_args, rep, run_layers(cs.run_args), &summary);
    if (!err.empty()) die("compare", err);
    say(summary);
    say("done in " + duration_str((now_ms() - t0) / 1000) + "; wrote " + one_line(cs.dir) + "/report.md and figures\n");
    if (g_compare_signal == SIGPIPE)
        fprintf(stderr, "lime compare: its output was closed (EPIPE) before the summary; the report is written: "
                "%s/report.md\n", one_line(cs.dir).c_str());
    close(lock);
    return 0;
}
