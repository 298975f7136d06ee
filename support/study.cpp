// study.cpp — `./lime compare`: LLaMa and LIMe side by side, honestly.
//
// Each (tier, model, seed) is one `./lime train` run in its own process and
// directory; compare runs them (several at a time on a CPU), reads their
// JSONL logs, and writes DIR/report.md and figures: per model and tier the
// mean, std and every seed's value; LIMe minus LLaMa with a 95% confidence
// interval and Welch's t-test; parameters, FLOPs per token (router counted),
// step time and peak memory. Seed s gives both models the same data order
// and the same initial values for every tensor they share (model_init draws
// each tensor from a stream named by the seed and the tensor's name).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "support/cli.h"
#include "support/lime.h"
#include "support/plot.h"
#include "support/safetensors.h"
#include "support/stats.h"
#include "support/study.h"

// ---------------------------------------------------------------------------
// Presets: the train flags of each run, the tiers and the number of seeds.

struct Preset {
    const char* name;
    const char* train_args;  // passed to every ./lime train
    const char* tiers;       // operators per question, comma-separated
    int seeds;
    const char* about;
};

static const Preset PRESETS[] = {
    {"classroom",
     "--layers 4 --dim 32 --heads 4 --ops 3 --train-size 20000 --test-size 500 --batch 64 --epochs 15 --lr 3e-3",
     "3", 10, "two-core CPU, about 10 minutes: tier 3, 10 seeds per model"},
    {"paper-aet",
     "--layers 4 --dim 32 --heads 4 --ffn 96 --train-size 50000 --test-size 1000 --batch 128 --epochs 200 --lr 1e-3 "
     "--schedule linear",
     "4,5,6", 5, "the paper's arithmetic setting (docs/tasks.md 1), for a GPU: tiers 4, 5, 6, 5 seeds per model"},
    {"tiny", "--layers 2 --dim 16 --heads 2 --ffn 32 --train-size 300 --test-size 20 --batch 16 --steps 30", "2", 2,
     "seconds: for tests"},
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

// ---------------------------------------------------------------------------
// One run: a child process, its log, its results.

struct Run {
    std::string arch, tier, dir;
    int seed = 0;
    pid_t pid = 0;
    int status = -1;
    double max_rss_mb = 0, seconds = 0;
    // read from DIR/log.jsonl
    double accuracy = NAN, val_loss = NAN, ms_per_step = NAN, params = NAN, flops_per_token_ = NAN, tokens_per_step = 0;
    std::vector<double> steps, losses;            // training loss curve
    std::vector<double> eval_steps, eval_losses;  // validation loss curve
    std::string error;
};

static pid_t start_run(const std::string& self, Run* r, const std::vector<std::string>& args) {
    std::vector<std::string> all = {self, "train"};
    all.insert(all.end(), args.begin(), args.end());
    pid_t pid = fork();
    if (pid == 0) {
        // a process group of its own: a Ctrl-C at the terminal reaches compare
        // alone, which forwards it once (twice would end the run unsaved)
        setpgid(0, 0);
        std::string out = r->dir + "/train.out";
        FILE* f = freopen(out.c_str(), "w", stdout);
        if (f) dup2(fileno(stdout), 2);
        std::vector<char*> argv;
        for (std::string& a : all) argv.push_back(&a[0]);
        argv.push_back(nullptr);
        execv(self.c_str(), argv.data());
        _exit(127);
    }
    return pid;
}

static double json_number(const Json& j, const char* key) {
    const Json* v = j.get(key);
    return v && v->kind == Json::NUM ? v->num : NAN;
}

static void read_log(Run* r) {
    std::ifstream in(r->dir + "/log.jsonl");
    std::string line;
    double ms_sum = 0;
    int ms_n = 0;
    while (std::getline(in, line)) {
        Json j;
        if (!json_parse(line, &j).empty()) continue;
        const Json* type = j.get("type");
        if (!type || type->kind != Json::STR) continue;
        if (type->str == "config") {
            r->params = json_number(j, "params");
            const Json* cfg = j.get("config");
            Config c;
            if (cfg && config_from_json(json_dump(*cfg), &c).empty()) r->flops_per_token_ = flops_per_token(c, c.T);
            const Json* args = j.get("args");
            const Json* batch = args ? args->get("batch") : nullptr;
            if (batch && batch->kind == Json::STR) r->tokens_per_step = atof(batch->str.c_str()) * c.T;
        } else if (type->str == "train") {
            r->steps.push_back(json_number(j, "step"));
            r->losses.push_back(json_number(j, "loss"));
            // the first line's speed includes the start-up
            if (r->steps.size() > 1) { ms_sum += json_number(j, "ms_per_step"); ms_n++; }
        } else if (type->str == "eval") {
            r->eval_steps.push_back(json_number(j, "step"));
            r->eval_losses.push_back(json_number(j, "val_loss"));
        } else if (type->str == "done") {
            r->accuracy = json_number(j, "accuracy");
            r->val_loss = json_number(j, "val_loss");
        }
    }
    r->ms_per_step = ms_n ? ms_sum / ms_n : NAN;
}

// ---------------------------------------------------------------------------
// The report

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

// "LIMe - LLaMa" for one tier, with the 95% interval and Welch's p; `who`
// names the LIMe model ("LIMe", or a variant such as "lime:last-2").
static std::string difference_line(const std::vector<double>& lime, const std::vector<double>& llama,
                                   const std::string& who, std::string* verdict) {
    if (lime.size() < 2 || llama.size() < 2) {
        *verdict = "too few seeds for a confidence interval (use --seeds 2 or more)";
        return "n/a";
    }
    WelchResult w = stats_welch(lime, llama);
    char buf[256];
    if (!std::isfinite(w.t)) {  // no spread in either group: a t-test is undefined
        snprintf(buf, sizeof buf, "%+.1f points, the same in every seed (no spread, so no interval or test)",
                 100 * w.diff);
        *verdict = w.diff > 0   ? who + " is ahead in every seed"
                   : w.diff < 0 ? "LLaMa is ahead in every seed"
                                : "no difference at all";
        return buf;
    }
    snprintf(buf, sizeof buf, "%+.1f points (95%% CI %+.1f to %+.1f), Welch t = %.2f, df = %.1f, p = %.3g",
             100 * w.diff, 100 * w.lo, 100 * w.hi, w.t, w.df, w.p);
    if (w.lo > 0)
        *verdict = who + " beats LLaMa here: the whole 95% interval of the difference is above zero";
    else if (w.hi < 0)
        *verdict = "LLaMa beats " + who + " here: the whole 95% interval of the difference is below zero";
    else *verdict = "no clear difference: the 95% interval of the difference contains zero";
    return buf;
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
struct Report {
    std::vector<std::string> tiers, archs;
    std::vector<RunGroup> groups;
    Report(const std::vector<std::string>& t, const std::vector<std::string>& a, const std::vector<Run>& runs)
        : tiers(t), archs(a) {
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
};

// The report's title and how its runs were made.
static void report_intro(std::ostringstream& md, const Preset* preset, const std::string& extra,
                         const std::vector<std::string>& archs) {
    md << "# LIMe vs LLaMa: " << (preset ? preset->name : "custom") << "\n\n";
    md << "Each model trained once per seed with `./lime train " << extra << " --ops TIER --seed S`; a seed gives both models the same data order and the same initial values for "
          "every tensor they share. Accuracy: greedy decoding on held-out questions (docs/tasks.md 1).\n\n";
    if (std::any_of(archs.begin(), archs.end(), [](const std::string& a) { return a.find(':') != std::string::npos; }))
        md << "Model `lime:X` is trained with `--arch lime --router X` (`:separate` adds `--router-kv separate`): "
              "the router variants of the paper's Table 7 (README, `--router`).\n\n";
}

// Accuracy per tier and model: mean ± std, every seed, test loss.
static void report_accuracy(std::ostringstream& md, const Report& rep) {
    md << "## Accuracy\n\n| tier | model | accuracy (mean ± std) | per seed | test loss |\n"
          "| --- | --- | --- | --- | --- |\n";
    for (const RunGroup& g : rep.groups)
        md << "| " << g.tier << " | " << g.arch << " | " << mean_std(g.values(&Run::accuracy), true) << " | "
           << every_value(g.values(&Run::accuracy), true) << " | " << mean_std(g.values(&Run::val_loss), false)
           << " |\n";
}

// Each LIMe model (a router variant too) minus LLaMa, per tier; the same
// lines, with their verdicts, go to *summary for the terminal.
static void report_differences(std::ostringstream& md, const Report& rep, std::string* summary) {
    md << "\n## LIMe minus LLaMa\n\n";
    bool has_llama = std::find(rep.archs.begin(), rep.archs.end(), "llama") != rep.archs.end();
    if (!has_llama) md << "No llama in --archs: nothing to subtract.\n";
    for (const std::string& tier : rep.tiers)
        for (const std::string& arch : rep.archs) {
            if (!has_llama || arch == "llama") continue;
            std::string who = arch == "lime" ? "LIMe" : arch, verdict;
            std::string line = difference_line(rep.group(tier, arch).values(&Run::accuracy),
                                               rep.group(tier, "llama").values(&Run::accuracy), who, &verdict);
            md << "- tier " << tier << (arch == "lime" ? "" : ", " + arch) << ": " << line << ". " << verdict << ".\n";
            *summary += "tier " + tier + ": " + who + " - LLaMa = " + line + "\n  " + verdict + "\n";
        }
}

// Parameters, FLOPs per token, step time and peak memory per tier and model.
static void report_cost(std::ostringstream& md, const Report& rep) {
    md << "\n## Cost\n\n| tier | model | parameters | FLOPs per token (train step, router counted) | ms per step "
          "| peak memory (process RSS) |\n"
          "| --- | --- | --- | --- | --- | --- |\n";
    for (const RunGroup& g : rep.groups) {
        std::vector<double> ms = g.values(&Run::ms_per_step), rss = g.values(&Run::max_rss_mb);
        const Run* r0 = g.runs.empty() ? nullptr : g.runs[0];
        md << "| " << g.tier << " | " << g.arch << " | " << (r0 ? fmt("%.0f", r0->params) : "n/a") << " | "
           << (r0 ? fmt("%.4g", r0->flops_per_token_) : "n/a") << " | "
           << (ms.empty() ? "n/a" : fmt("%.2f", stats_mean(ms))) << " | "
           << (rss.empty() ? "n/a" : fmt("%.0f MB", stats_mean(rss))) << " |\n";
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
    std::string f1 = "loss_tier" + tier + ".png", f2 = "val_loss_tier" + tier + ".png";
    std::string f3 = "val_loss_flops_tier" + tier + ".png";
    std::string err = plot_lines(dir + "/" + f1, "Training loss, tier " + tier + " (mean, band: min..max over seeds)",
                                 "step", "loss", by_step);
    if (err.empty()) err = plot_lines(dir + "/" + f2, "Validation loss, tier " + tier, "step", "loss", val);
    if (err.empty())
        err = plot_lines(dir + "/" + f3, "Validation loss against training FLOPs, tier " + tier,
                         "FLOPs (router counted)", "loss", by_flops);
    if (!err.empty()) return err;
    md << "![training loss](" << f1 << ")\n\n![validation loss](" << f2 << ")\n\n![validation loss against FLOPs]("
       << f3 << ")\n\n";
    return "";
}

// Accuracy per tier and model, mean with std error bars: dir/accuracy.png.
static std::string report_accuracy_bars(std::ostringstream& md, const std::string& dir, const Report& rep) {
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
    for (const std::string& t : rep.tiers) cats.push_back("tier " + t);
    std::string err =
        plot_bars(dir + "/accuracy.png", "Accuracy per tier (mean and std over seeds)", "accuracy (%)", cats, bars);
    if (!err.empty()) return err;
    md << "![accuracy](accuracy.png)\n";
    return "";
}

// DIR/report.md (written to a .tmp file, then renamed) and its figures; the
// LIMe-minus-LLaMa lines also go to *summary.
static std::string write_report(const std::string& dir, const Preset* preset, const std::string& extra,
                                const std::vector<std::string>& tiers, const std::vector<std::string>& archs,
                                const std::vector<Run>& runs, std::string* summary) {
    Report rep(tiers, archs, runs);
    std::ostringstream md;
    report_intro(md, preset, extra, archs);
    report_accuracy(md, rep);
    report_differences(md, rep, summary);
    report_cost(md, rep);
    md << "\n## Figures\n\n";
    for (const std::string& tier : tiers) {
        std::string err = report_curves(md, dir, rep, tier);
        if (!err.empty()) return err;
    }
    std::string err = report_accuracy_bars(md, dir, rep);
    if (!err.empty()) return err;
    std::string path = dir + "/report.md";
    std::ofstream out(path + ".tmp");
    out << md.str();
    out.close();
    if (!out || rename((path + ".tmp").c_str(), path.c_str()) != 0) return "cannot write " + path;
    return "";
}

// ---------------------------------------------------------------------------
// ./lime compare

// What compare runs, from its flags: the preset with its overrides, the
// models, how many runs at a time and with how many threads each.
struct CompareSettings {
    const Preset* preset = nullptr;
    int seeds = 1;
    std::vector<std::string> tiers, archs;
    std::string train_args;                 // --train-args
    std::vector<std::string> run_args;      // every run's train flags: the preset's, those --train-args gives replaced
    int jobs = 1, threads = 1;
    bool gpu = false;
    std::string dir;         // --out
    std::string self;        // this program, run as ./lime train
};

// The train flags of every run: the preset's ("--flag value" pairs), less
// those --train-args gives (--steps and --epochs count as one: each sets the
// length of the run), then --train-args. "" or the problem with --train-args.
static std::string merge_train_args(const Preset& preset, const std::string& extra, std::vector<std::string>* out) {
    std::vector<std::string> own = split(extra, ' '), pairs = split(preset.train_args, ' ');
    std::set<std::string> given;
    for (const std::string& t : own)
        if (t.rfind("--", 0) == 0) given.insert(t.substr(2, t.find('=') == std::string::npos ? t.npos : t.find('=') - 2));
    if (given.count("steps") && given.count("epochs"))
        return "--train-args gives both --steps and --epochs; give one of them (each sets the length of the runs)";
    if (given.count("steps") || given.count("epochs")) given.insert({"steps", "epochs"});
    out->clear();
    for (size_t i = 0; i + 1 < pairs.size(); i += 2)
        if (!given.count(pairs[i].substr(2))) out->insert(out->end(), {pairs[i], pairs[i + 1]});
    out->insert(out->end(), own.begin(), own.end());
    return "";
}

// The layers the runs will have: the last --layers of their flags, else train's default.
static int run_layers(const std::vector<std::string>& args) {
    int L = 4;
    for (size_t i = 0; i < args.size(); i++) {
        if (args[i] == "--layers" && i + 1 < args.size()) L = atoi(args[i + 1].c_str());
        if (args[i].rfind("--layers=", 0) == 0) L = atoi(args[i].c_str() + 9);
    }
    return L;
}

// Reads and checks the flags (one line and exit status 2 at the first
// problem), picks the device, and makes the output directory.
static CompareSettings compare_settings(Args& a) {
    CompareSettings cs;
    cs.preset = find_preset(a.str("preset"));
    const Preset* preset = cs.preset;
    if (!preset) a.fail("--preset '" + a.str("preset") + "' is not one of classroom|paper-aet|tiny");
    cs.seeds = a.has("seeds") ? (int)a.integer("seeds", 1, 1000) : preset ? preset->seeds : 1;
    cs.tiers = split(a.has("tiers") ? a.str("tiers") : preset ? preset->tiers : "3", ',');
    if (cs.tiers.empty()) a.fail("--tiers is empty; give one or more tiers (operators per question), e.g. 4,5,6");
    std::set<int> tiers_seen;
    for (const std::string& t : cs.tiers)
        if (t.find_first_not_of("0123456789") != std::string::npos || atoi(t.c_str()) < 1 || atoi(t.c_str()) > 64)
            a.fail("--tiers '" + a.str("tiers") + "': each tier is a number of operators in 1..64, e.g. 4,5,6");
        else if (!tiers_seen.insert(atoi(t.c_str())).second)
            a.fail("--tiers '" + a.str("tiers") + "' names tier " + std::to_string(atoi(t.c_str())) +
                   " twice; give each tier once");
    cs.train_args = a.str("train-args");
    std::string err = preset ? merge_train_args(*preset, cs.train_args, &cs.run_args) : "";
    if (!err.empty()) a.fail(err);
    // models: llama, lime, or lime with a router variant and/or separate K/V routers,
    // e.g. lime:last-2, lime:average, lime:separate (model_parse); each checked with
    // the runs' layers (a last-J or first-J needs J <= layers)
    cs.archs = split(a.str("archs"), ',');
    if (cs.archs.empty()) a.fail("--archs is empty; give one or more models, e.g. --archs llama,lime");
    std::set<std::string> archs_seen;
    for (const std::string& s : cs.archs) {
        Config c;
        if (!model_parse(s, &c)) {
            a.fail("--archs: '" + s + "' is not llama, lime or lime:VARIANT (static, average, last-J, first-J, "
                   "separate; e.g. lime:last-2)");
            continue;
        }
        if (!archs_seen.insert(model_name(c)).second)
            a.fail("--archs '" + a.str("archs") + "' names " + model_name(c) + " twice; give each model once");
        c.L = run_layers(cs.run_args);
        c.V = c.T = c.H = c.R = c.F = 1;
        c.d = c.hd = 2;
        std::string why = config_check(c);
        if (!why.empty()) a.fail("--archs: '" + s + "' with the runs' " + std::to_string(c.L) + " layers: " + why);
    }
    int jobs = (int)a.integer("jobs", 0, 256);
    std::string device = a.choice("device", {"auto", "cpu", "gpu"});
    cs.dir = a.str("out");
    if (!a.err.empty()) die("compare", a.err);
    std::string why;
    cs.gpu = device == "gpu" || (device == "auto" && gpu_available(&why));
    if (device == "gpu" && !gpu_available(&why)) die("compare", "--device gpu: " + why);
    int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    cs.jobs = jobs == 0 ? (cs.gpu ? 1 : std::max(1, cores)) : jobs;
    cs.threads = std::max(1, cores / cs.jobs);
    if (!make_dir(cs.dir, &err)) die("compare", err + " (choose another --out)");
    cs.self = exe_path();
    if (cs.self.empty()) die("compare", "cannot find this program's path (/proc/self/exe)");
    return cs;
}

// Every (tier, seed, model), each with its own directory, DIR/tierT/MODEL-seedS.
static std::vector<Run> plan_runs(const CompareSettings& cs) {
    std::vector<Run> runs;
    for (const std::string& tier : cs.tiers)
        for (int s = 1; s <= cs.seeds; s++)
            for (const std::string& arch : cs.archs) {
                Run r;
                r.arch = arch; r.tier = tier; r.seed = s;
                std::string name = arch;
                std::replace(name.begin(), name.end(), ':', '-');  // lime:last-2 runs in lime-last-2-seed1
                r.dir = cs.dir + "/tier" + tier + "/" + name + "-seed" + std::to_string(s);
                runs.push_back(r);
            }
    return runs;
}

// The flags of one run's ./lime train: the preset's with --train-args (run_args), then the run's own.
static std::vector<std::string> train_args_of(const CompareSettings& cs, const Run& r) {
    std::vector<std::string> args = cs.run_args;
    Config model;
    model_parse(r.arch, &model);
    // --force: the run directories are compare's own, made afresh by each compare into its --out
    std::vector<std::string> own = {"--arch", arch_name(model.arch), "--ops", r.tier, "--seed", std::to_string(r.seed),
                                    "--out", r.dir, "--threads", std::to_string(cs.threads),
                                    "--device", cs.gpu ? "gpu" : "cpu", "--quiet", "--force"};
    if (model.arch == ARCH_LIME && model.router != ROUTER_STATIC)
        own.insert(own.end(), {"--router", router_name(model)});
    if (model.router_kv_separate) own.insert(own.end(), {"--router-kv", "separate"});
    args.insert(args.end(), own.begin(), own.end());
    return args;
}

// A run has ended: its status, memory and time, its log read, one line printed.
static void finish_run(Run* r, int status, const struct rusage& ru, double started, size_t done, size_t total) {
    r->status = status;
    r->max_rss_mb = ru.ru_maxrss / 1024.0;
    r->seconds = (now_ms() - started) / 1000;
    read_log(r);
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    printf("[%zu/%zu] tier %s %-5s seed %d: %s in %s%s\n", done, total, r->tier.c_str(), r->arch.c_str(), r->seed,
           ok ? ("accuracy " + pct(r->accuracy)).c_str() : "FAILED", duration_str(r->seconds).c_str(),
           ok ? "" : (" (see " + r->dir + "/train.out)").c_str());
    fflush(stdout);
}

// SIGINT, SIGTERM and SIGHUP to compare only set this flag: run_all
// forwards the signal to every running run (each saves a checkpoint and
// stops, as train does), waits for them all, and exits 128 + the signal.
static volatile sig_atomic_t g_compare_signal = 0;
static void on_compare_signal(int sig) { g_compare_signal = sig; }

// The next run to end (its pid), 0 when a signal came first, -1 when none is left.
static pid_t wait_run(int* status, struct rusage* ru) {
    for (;;) {
        pid_t pid = wait4(-1, status, WNOHANG, ru);
        if (pid != 0 || g_compare_signal) return pid;
        usleep(20 * 1000);
    }
}

// A signal came: it goes to every running run, then compare waits for them
// (forwarding a second signal too: the runs then end at once) and exits.
static void stop_runs(std::vector<Run>* runs, int sig) {
    int stopped = 0;
    for (const Run& r : *runs) stopped += r.pid > 0 && r.status == -1;
    for (int forward = sig;; forward = g_compare_signal) {
        for (const Run& r : *runs) if (r.pid > 0 && r.status == -1) kill(r.pid, forward);
        g_compare_signal = 0;
        int status;
        struct rusage ru;
        pid_t pid;
        while ((pid = wait_run(&status, &ru)) > 0)
            for (Run& r : *runs) if (r.pid == pid) r.status = status;
        if (pid < 0) break;
    }
    const char* what = sig == SIGINT ? "interrupted (SIGINT)" : sig == SIGTERM ? "terminated (SIGTERM)" : "hung up (SIGHUP)";
    printf("compare %s: passed it to %d running run%s, each saving a checkpoint in its directory (./lime train "
           "--resume DIR/checkpoint.safetensors goes on); no report written\n", what, stopped, stopped == 1 ? "" : "s");
    fflush(stdout);
    exit(128 + sig);
}

// Runs every run, --jobs at a time, each as a child process; returns when all have ended.
static void run_all(const CompareSettings& cs, std::vector<Run>* runs) {
    size_t next = 0, done = 0;
    int running = 0;
    std::vector<double> started(runs->size());
    std::string err;
    struct sigaction sa = {};
    sa.sa_handler = on_compare_signal;
    sa.sa_flags = SA_RESTART;
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
    while (done < runs->size()) {
        while (!g_compare_signal && running < cs.jobs && next < runs->size()) {
            Run& r = (*runs)[next];
            if (!make_dir(r.dir, &err)) die("compare", err);
            r.pid = start_run(cs.self, &r, train_args_of(cs, r));
            started[next] = now_ms();
            running++;
            next++;
        }
        int status;
        struct rusage ru;
        pid_t pid = wait_run(&status, &ru);
        if (pid == 0) stop_runs(runs, g_compare_signal);
        if (pid < 0) break;
        for (size_t i = 0; i < runs->size(); i++) {
            if ((*runs)[i].pid != pid) continue;
            running--;
            done++;
            finish_run(&(*runs)[i], status, ru, started[i], done, runs->size());
        }
    }
}

int cmd_compare(int argc, char** argv) {
    std::vector<FlagSpec> flags = {
        {"preset", "classroom",
         "classroom (2 CPU cores, ~10 min), paper-aet (the paper's setting, GPU) or tiny (tests)"},
        {"seeds", "", "seeds per model (default: the preset's)"},
        {"tiers", "", "operators per question, e.g. 4,5,6 (default: the preset's)"},
        {"archs", "llama,lime", "models to compare: llama, lime, or lime:VARIANT (lime:average, lime:last-2, "
                                "lime:first-1, lime:separate)"},
        {"train-args", "", "extra flags for every ./lime train, replacing the preset's, e.g. \"--epochs 30\""},
        {"jobs", "0", "runs at a time (0: one per core on the CPU, 1 on the GPU)"},
        {"device", "auto", "auto, cpu or gpu"},
        {"out", "runs/compare", "output directory: one subdirectory per run, report.md, figures"},
    };
    std::string summary_help =
        "Trains LLaMa and LIMe for several seeds, evaluates them, and writes DIR/report.md with\n"
        "mean ± std, the difference with a 95% confidence interval and Welch's t-test, cost, and figures.\nPresets:";
    for (const Preset& p : PRESETS) summary_help += std::string("\n  ") + p.name + ": " + p.about;
    Args a = parse_args("compare", summary_help.c_str(), flags, argc, argv, false);
    CompareSettings cs = compare_settings(a);
    std::vector<Run> runs = plan_runs(cs);
    printf("compare %s: %zu runs (%zu tiers x %d seeds x %zu models), %d at a time, %d thread%s each, on the %s\n",
           cs.preset->name, runs.size(), cs.tiers.size(), cs.seeds, cs.archs.size(), cs.jobs, cs.threads,
           cs.threads > 1 ? "s" : "", cs.gpu ? "gpu" : "cpu");
    fflush(stdout);
    double t0 = now_ms();
    run_all(cs, &runs);
    for (const Run& r : runs)
        if (!(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0))
            die("compare", "a run failed: see " + r.dir + "/train.out");
    std::string summary;
    std::string run_args;
    for (const std::string& arg : cs.run_args) run_args += (run_args.empty() ? "" : " ") + arg;
    std::string err = write_report(cs.dir, cs.preset, run_args, cs.tiers, cs.archs, runs, &summary);
    if (!err.empty()) die("compare", err);
    printf("%s", summary.c_str());
    printf("done in %s; wrote %s/report.md and figures\n", duration_str((now_ms() - t0) / 1000).c_str(),
           cs.dir.c_str());
    return 0;
}

// ===========================================================================
// Analysis (docs/tasks.md, "./lime analyze")
// ===========================================================================

// Router weights (paper Section 5.4, Figure 5): for layer l and source layer
// l', the mean |W[l][r, l'*R + r']| over r and r', each row normalised to sum
// 1. Row l-1 holds layer l (layers 1..L-1); entries l' > l are NaN (no such source).
// With --router-kv separate the mean runs over the key and the value router.
std::vector<std::vector<double>> router_heatmap(const Model& model) {
    const Config& c = model.c;
    std::vector<std::vector<double>> rows;
    for (int l = 1; l < c.L; l++) {
        std::vector<double> row(c.L, NAN);
        std::vector<const float*> routers;
        for (const float* W : {model.p.layer[l].router, model.p.layer[l].router_v}) if (W) routers.push_back(W);
        if (routers.empty()) continue;
        int J = (l + 1) * c.R;
        double total = 0;
        for (int src = 0; src <= l; src++) {
            double s = 0;
            for (const float* W : routers)
                for (int r = 0; r < c.R; r++)
                    for (int rr = 0; rr < c.R; rr++) s += std::fabs(W[r * J + src * c.R + rr]);
            row[src] = s / (routers.size() * c.R * c.R);
            total += row[src];
        }
        for (int src = 0; src <= l; src++) row[src] /= total > 0 ? total : 1;
        rows.push_back(row);
    }
    return rows;
}

// Eigenvalues of a symmetric n x n matrix (row-major, destroyed) by cyclic
// Jacobi rotations: slow for big n, exact enough, and twenty lines.
static std::vector<double> symmetric_eigenvalues(std::vector<double> a, int n) {
    for (int sweep = 0; sweep < 100; sweep++) {
        double off = 0;
        for (int i = 0; i < n; i++)
            for (int j = i + 1; j < n; j++) off += a[i * n + j] * a[i * n + j];
        if (off < 1e-22) break;
        for (int p = 0; p < n; p++)
            for (int q = p + 1; q < n; q++) {
                if (std::fabs(a[p * n + q]) < 1e-300) continue;
                double theta = (a[q * n + q] - a[p * n + p]) / (2 * a[p * n + q]);
                double t = (theta >= 0 ? 1 : -1) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
                double c = 1 / std::sqrt(t * t + 1), s = t * c;
                for (int k = 0; k < n; k++) {  // rotate columns p and q, then rows p and q
                    double akp = a[k * n + p], akq = a[k * n + q];
                    a[k * n + p] = c * akp - s * akq;
                    a[k * n + q] = s * akp + c * akq;
                }
                for (int k = 0; k < n; k++) {
                    double apk = a[p * n + k], aqk = a[q * n + k];
                    a[p * n + k] = c * apk - s * aqk;
                    a[q * n + k] = s * apk + c * aqk;
                }
            }
    }
    std::vector<double> ev(n);
    for (int i = 0; i < n; i++) ev[i] = a[i * n + i];
    return ev;
}

// Value entropy (paper Section 5.2): the value vectors of one sequence, v
// (T, D), each feature z-scored over the tokens; the eigenvalues of the
// token Gram matrix Z Z^T divided by its trace; their Renyi entropy of order
// alpha, log(sum lambda^alpha) / (1 - alpha), Shannon's at alpha = 1. The
// non-zero eigenvalues of Z Z^T (T x T) are those of Z^T Z (D x D), the smaller one.
double value_entropy(const float* v, int T, int D, double alpha) {
    std::vector<double> z((size_t)T * D);
    for (int j = 0; j < D; j++) {
        double mean = 0, var = 0;
        for (int t = 0; t < T; t++) mean += v[(size_t)t * D + j];
        mean /= T;
        for (int t = 0; t < T; t++) var += (v[(size_t)t * D + j] - mean) * (v[(size_t)t * D + j] - mean);
        double sd = std::sqrt(var / T);
        for (int t = 0; t < T; t++) z[(size_t)t * D + j] = sd > 1e-12 ? (v[(size_t)t * D + j] - mean) / sd : 0;
    }
    std::vector<double> gram((size_t)D * D, 0);
    for (int i = 0; i < D; i++)
        for (int j = 0; j < D; j++)
            for (int t = 0; t < T; t++) gram[i * D + j] += z[(size_t)t * D + i] * z[(size_t)t * D + j];
    std::vector<double> ev = symmetric_eigenvalues(gram, D);
    double trace = 0;
    for (double& e : ev) { e = std::max(e, 0.0); trace += e; }
    if (trace <= 0) return 0;
    double h = 0;
    if (std::fabs(alpha - 1) < 1e-9) {
        for (double e : ev) if (e > 0) h -= (e / trace) * std::log(e / trace);
        return h;
    }
    for (double e : ev) h += std::pow(e / trace, alpha);
    return std::log(h) / (1 - alpha);
}
