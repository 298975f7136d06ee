// support/model/names.cpp — the model's names on the command line and in
// checkpoints' configs: architectures, routers, attention kernels, and a whole
// model as compare names it ("lime:last-2", "hc:n2:static", "llama:ereg=0.1");
// the check of a model's shape every config passes before anything is sized by
// it (config_check); and the flags that shape a model, which train and bench
// share (SHAPE_FLAGS, shape_from_args).
#include <algorithm>
#include <cctype>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "support/model/names.h"

const char* arch_name(Arch a) { return a >= 0 && a < model_count() ? model_registry()[a].name : "(unregistered)"; }

std::string router_name(const Config& c) {
    switch (c.router) {
    case ROUTER_AVERAGE: return "average";
    case ROUTER_LAST: return "last-" + std::to_string(c.router_j);
    case ROUTER_FIRST: return "first-" + std::to_string(c.router_j);
    default: return "static";
    }
}

// How config_check names a field: by the flag that sets it (a command line)
// or by its key (a checkpoint's config, whose errors the file's path prefixes).
struct FieldNames {
    const char *vocab, *layers, *dim, *heads, *kv_heads, *ffn, *positions, *router, *router_heads, *hc_rate,
        *entropy_reg;
    const char* routers;  // the router fields together, and where they belong
};
static const FieldNames FLAG_NAMES = {"vocabulary size", "--layers", "--dim", "--heads", "--kv-heads", "--ffn",
                                      "--seq-len", "--router", "--router-heads", "--hc-rate", "--entropy-reg",
                                      "--router, --router-kv, --router-weights and --router-heads are for --arch lime"};
static const FieldNames KEY_NAMES = {
    "config \"vocab_size\"", "config \"num_hidden_layers\"", "config \"hidden_size\"",
    "config \"num_attention_heads\"", "config \"num_key_value_heads\"", "config \"intermediate_size\"",
    "config \"max_position_embeddings\"", "config \"router\"", "config \"router_heads\"", "config \"hc_rate\"",
    "config \"entropy_reg\"",
    "config \"router\", \"router_kv\", \"router_frozen\" and \"router_heads\" are for \"architecture\": \"lime\""};

static std::string check_config_named(const Config& c, const FieldNames& n) {
    if (c.V < 1) return strf("%s %d must be at least 1", n.vocab, c.V);
    if (c.L < 1) return strf("%s %d must be at least 1", n.layers, c.L);
    // the flags' limits, asked of every config (a checkpoint's too) before anything is sized by it
    if (c.L > 256 || c.d > 65536 || c.H > 1024 || c.R > 1024 || c.F > (1 << 20) || c.V > (1 << 24) || c.T > (1 << 20))
        return strf("layers %d, dim %d, heads %d, kv-heads %d, ffn %d, vocab %d or positions %d is past this "
                    "program's limits (256, 65536, 1024, 1024, 1048576, 16777216, 1048576)",
                    c.L, c.d, c.H, c.R, c.F, c.V, c.T);
    if (c.d < 2 || c.H < 1 || c.R < 1)
        return strf("%s %d, %s %d and %s %d must be positive", n.dim, c.d, n.heads, c.H, n.kv_heads, c.R);
    if (c.d % c.H)
        return strf("%s %d is not divisible by %s %d; pick a width that is a multiple of the heads", n.dim, c.d,
                    n.heads, c.H);
    if (c.H % c.R)
        return strf("%s %d is not divisible by %s %d; each kv head must serve a whole group of query heads",
                    n.heads, c.H, n.kv_heads, c.R);
    if (c.hd != c.d / c.H) return strf("head size %d differs from dim / heads = %d", c.hd, c.d / c.H);
    if (c.hd % 2) return strf("head size dim / heads = %d is odd; RoPE rotates pairs, choose an even head size", c.hd);
    if (c.F < 1) return strf("%s %d must be at least 1", n.ffn, c.F);
    if (c.T < 1) return strf("%s %d must be at least 1", n.positions, c.T);
    if (!(c.rope_theta > 0) || !(c.eps > 0)) return "rope_theta and rms_norm_eps must be positive";
    if (c.arch != ARCH_LIME && (c.router != ROUTER_STATIC || c.router_kv_separate || c.router_frozen || c.router_same_head))
        return strf("%s: %s has no router", n.routers, arch_name(c.arch));
    if (c.router_same_head && c.router == ROUTER_AVERAGE)
        return strf("%s same is for a router that learns: %s average's weights are fixed", n.router_heads, n.router);
    if (c.arch == ARCH_HC && (c.hc_rate < 1 || c.hc_rate > 16))
        return strf("%s %d must be 1 .. 16 (the number of residual streams; the paper's is 4)", n.hc_rate, c.hc_rate);
    std::string why = entropy_reg_check(c.entropy_reg);
    if (!why.empty()) return n.entropy_reg + (" " + why);
    if ((c.router == ROUTER_LAST || c.router == ROUTER_FIRST) && (c.router_j < 1 || c.router_j > c.L))
        return strf("%s %s: J must be 1 .. %d (the number of layers)", n.router, router_name(c).c_str(), c.L);
    return "";
}

std::string config_check(const Config& c) { return check_config_named(c, FLAG_NAMES); }

std::string ablation_vacuous(const Config& c) {
    if (c.arch != ARCH_LIME) return "";
    std::string J = router_name(c), flag = " (--router " + J + ")";
    if (c.L == 1 && (c.router_same_head || ((c.router == ROUTER_LAST || c.router == ROUTER_FIRST) && c.router_j == 1)))
        return (c.router_same_head ? std::string("same-head (--router-heads same)") : J + flag) +
               " with 1 layer is lime itself, which has no router at 1 layer: it is an ablation with --layers 2 or more";
    if (c.router_same_head && c.R == 1)
        return "same-head (--router-heads same) with 1 kv head is lime itself (a kv head has no other head to mix): "
               "it is an ablation with --kv-heads 2 or more";
    if ((c.router != ROUTER_LAST && c.router != ROUTER_FIRST) || c.router_j < 1 || c.router_j > c.L)
        return "";  // (a J outside 1 .. L is config_check's to refuse)
    bool window = false;  // some router leaves a layer out (router_sources)
    for (int l = 1; l < c.L; l++) {
        RouterSpan s = router_sources(c, l);
        for (int src = 0; src <= l; src++) window |= !s.has(src);
    }
    if (window) return "";
    auto upto = [](const char* kind, int hi) {  // "last-1", "last-1 .. last-3"
        return hi == 1 ? strf("%s-1", kind) : strf("%s-1 .. %s-%d", kind, kind, hi);
    };
    if (c.router == ROUTER_LAST)
        return strf("%s%s with %d layers reads every layer, as lime does: it is an ablation with J below the layers "
                    "(%s) or --layers %d or more",
                    J.c_str(), flag.c_str(), c.L, upto("last", c.L - 1).c_str(), c.router_j + 1);
    std::string below = c.L > 3 ? strf(", or J below %d (%s)", c.L - 2, upto("first", c.L - 3).c_str()) : "";
    return strf("%s%s with %d layers reads every layer (the first %d, and each layer's own and preceding one), as "
                "lime does: it is an ablation with --layers %d or more%s",
                J.c_str(), flag.c_str(), c.L, c.router_j, c.router_j + 3, below.c_str());
}
std::string config_check_file(const Config& c) { return check_config_named(c, KEY_NAMES); }

// A lambda is 0 (off) or a float32 normal number: one that float32 rounds to 0
// (1e-46), or to a subnormal a GPU may flush to 0, would train the plain model
// under the regulariser's name.
std::string entropy_reg_check(double lambda) {
    if (!(lambda >= 0) || !std::isfinite(lambda) || lambda > 1e6)
        return strf("%g must be a number in 0 .. 1e6 (0: no regulariser)", lambda);
    if (lambda > 0 && lambda < FLT_MIN)
        return strf("%g is 0 in float32, or a subnormal a GPU may flush to 0: give 0 for no regulariser, or a "
                    "lambda of at least 1.2e-38 (float32's smallest normal number)", lambda);
    return "";
}

bool attention_parse(const std::string& s, Attention* out) {
    if (s == "auto") { *out = ATTENTION_AUTO; return true; }
    if (s == "matmul") { *out = ATTENTION_MATMUL; return true; }
    if (s == "flash") { *out = ATTENTION_FLASH; return true; }
    return false;
}

bool arch_parse(const std::string& s, Arch* out) {
    if (s == "lime") { *out = ARCH_LIME; return true; }
    if (s == "llama") { *out = ARCH_LLAMA; return true; }
    for (int a = 0; a < model_count(); a++)  // the registry's rows (support/model/models.h)
        if (s == model_registry()[a].name) { *out = (Arch)a; return true; }
    return false;
}

bool router_parse(const std::string& s, Config* c) {
    if (s == "static" || s == "average") {
        c->router = s == "static" ? ROUTER_STATIC : ROUTER_AVERAGE;
        c->router_j = 0;
        return true;
    }
    for (auto [prefix, kind] :
         {std::make_pair(std::string("last-"), ROUTER_LAST), std::make_pair(std::string("first-"), ROUTER_FIRST)}) {
        std::string j = s.substr(0, prefix.size()) == prefix ? s.substr(prefix.size()) : "";
        if (j.empty() || j.size() > 6 || j.find_first_not_of("0123456789") != std::string::npos) continue;
        c->router = kind;
        c->router_j = atoi(j.c_str());  // 0 and J > L parse; config_check refuses them with the range
        return true;
    }
    return false;
}

std::string model_name(const Config& c) {
    std::string s = arch_name(c.arch);
    if (c.arch == ARCH_LIME && c.router != ROUTER_STATIC) s += ":" + router_name(c);
    if (c.arch == ARCH_LIME && c.router_kv_separate) s += ":separate";
    if (c.arch == ARCH_LIME && c.router_frozen) s += ":frozen";
    if (c.arch == ARCH_LIME && c.router_same_head) s += ":same-head";
    if (c.arch == ARCH_HC && c.hc_rate != 4) s += ":n" + std::to_string(c.hc_rate);
    if (c.arch == ARCH_HC && !c.hc_dynamic) s += ":static";
    if (c.arch == ARCH_MUDDFORMER && c.mudd_ways == MUDD_KV) s += ":kv";
    if (c.entropy_reg != 0) s += ":ereg=" + fmt("%g", c.entropy_reg);  // the value-entropy regulariser
    return s;
}

bool model_parse(const std::string& name, Config* c) {
    // any model may end in :ereg=LAMBDA, the value-entropy regulariser's lambda (>= 0)
    std::string s = name;
    c->entropy_reg = 0;
    size_t ereg = s.rfind(":ereg=");
    if (ereg != std::string::npos) {
        std::string num = s.substr(ereg + 6);
        char* end = nullptr;
        double v = strtod(num.c_str(), &end);
        // ":ereg=0" is the plain model under another name; a lambda float32 loses is no regulariser
        if (num.empty() || *end || !(v > 0) || !entropy_reg_check(v).empty()) return false;
        c->entropy_reg = (float)v;
        s = s.substr(0, ereg);
    }
    size_t colon = s.find(':');
    if (!arch_parse(s.substr(0, colon), &c->arch)) return false;
    c->router = ROUTER_STATIC;
    c->router_j = 0;
    c->router_kv_separate = false;
    c->router_frozen = false;
    c->router_same_head = false;
    c->hc_rate = 4;  // hc's defaults: 4 streams, dynamic
    c->hc_dynamic = true;
    c->mudd_ways = MUDD_QKVR;
    if (colon == std::string::npos) return true;
    std::string rest = s.substr(colon + 1);
    if (c->arch == ARCH_MUDDFORMER && (rest == "kv" || rest == "qkvr")) {  // muddformer:kv (MUDD-KV)
        c->mudd_ways = rest == "kv" ? MUDD_KV : MUDD_QKVR;
        return true;
    }
    if (c->arch != ARCH_LIME && c->arch != ARCH_HC) return false;  // llama and the peers have no variant to name
    if (c->arch == ARCH_HC) {  // hc:static, hc:n2, hc:n2:static (config_check checks the rate)
        bool rate = false, kind = false;  // each part at most once: "hc:n2:n3" names no one model
        for (size_t at = 0; at <= rest.size();) {
            size_t end = std::min(rest.find(':', at), rest.size());
            std::string part = rest.substr(at, end - at);
            char* tail = nullptr;
            long n = part.size() > 1 && part[0] == 'n' && isdigit((unsigned char)part[1]) ? strtol(&part[1], &tail, 10) : -1;
            if ((part == "static" || part == "dynamic") && !kind) c->hc_dynamic = part == "dynamic", kind = true;
            else if (n >= 0 && *tail == 0 && n <= 1000 && !rate) c->hc_rate = (int)n, rate = true;
            else return false;
            at = end + 1;
        }
        return true;
    }
    bool kv = false, variant = false;  // each part at most once: "lime:last-2:first-1" names no one model
    for (size_t at = 0; at <= rest.size();) {
        size_t end = std::min(rest.find(':', at), rest.size());
        std::string part = rest.substr(at, end - at);
        bool* seen = part == "separate" || part == "shared" ? &kv
                     : part == "frozen"                     ? &c->router_frozen
                     : part == "same-head"                  ? &c->router_same_head
                                                            : &variant;
        if (*seen) return false;
        if (part == "separate" || part == "shared") c->router_kv_separate = part == "separate";
        else if (part != "frozen" && part != "same-head" && !router_parse(part, c)) return false;
        *seen = true;
        at = end + 1;
    }
    return true;
}

// --arch's help: every registered model (built once, from the registry).
static const char* arch_help() {
    static const std::string help = "the model: " + model_names() + " (./lime --help says what each is)";
    return help.c_str();
}

const std::vector<FlagSpec> SHAPE_FLAGS = {
    {"arch", "lime", arch_help()},
    {"layers", "4", "L, transformer layers"},
    {"dim", "32", "d, model width"},
    {"heads", "4", "H, query heads"},
    {"kv-heads", "", "R, key/value heads (default: --heads, full attention)"},
    {"ffn", "", "F, SwiGLU hidden size (default: 3 * dim)"},
    {"router", "static", "lime's router: static (Eq. 2), average, last-J or first-J (paper Table 7)"},
    {"router-kv", "shared", "lime: one router for keys and values (shared) or one each (separate)"},
    {"router-weights", "learned", "lime: learned, or frozen (the control: routers keep their initial values)"},
    {"router-heads", "all", "lime: all (Eq. 2: a kv head mixes every head of each layer) or same (the cross-head "
                            "ablation: only its own head)"},
    {"hc-rate", "4", "hc: n, the number of residual streams (1 .. 16)"},
    {"hc-dynamic", "1", "hc: 1 adds the per-token correction of the mixing weights, 0 keeps them static"},
    {"mudd-ways", "qkvr", "muddformer: qkvr (queries, keys, values and the residual read dynamic mixtures of the states) "
                          "or kv (keys and values only)"},
    {"entropy-reg", "0", "lambda of the value-entropy regulariser: loss - lambda * mean S2 of each layer's values (0: off)"},
};

// The model's shape from the shape flags (V and T come from the task or --vocab, --seq-len).
// one_model: the flags shape one model (train); bench shapes three from them, so
// its --hc-rate and --hc-dynamic go to its hc beside a lime.
Config shape_from_args(Args& a, bool one_model) {
    Config c;
    std::string arch = one_model ? a.str("arch") : "lime";  // bench takes no --arch: its models are --models'
    if (!arch_parse(arch, &c.arch)) a.fail(unknown_model("--arch", arch));
    c.L = (int)a.integer("layers", 1, 256);
    c.d = (int)a.integer("dim", 2, 65536);
    c.H = (int)a.integer("heads", 1, 1024);
    c.R = a.has("kv-heads") ? (int)a.integer("kv-heads", 1, 1024) : c.H;
    c.F = a.has("ffn") ? (int)a.integer("ffn", 1, 1 << 20) : 3 * c.d;
    c.hd = c.d / c.H;
    if (!router_parse(a.str("router"), &c))
        a.fail("--router '" + a.str("router") +
               "' is not one of static|average|last-J|first-J (J: layers, e.g. last-2)");
    c.router_kv_separate = a.choice("router-kv", {"shared", "separate"}) == "separate";
    c.router_frozen = a.choice("router-weights", {"learned", "frozen"}) == "frozen";
    c.router_same_head = a.choice("router-heads", {"all", "same"}) == "same";
    double lambda = a.number("entropy-reg", 0, 1e6);
    if (!entropy_reg_check(lambda).empty()) a.fail("--entropy-reg " + entropy_reg_check(lambda));
    c.entropy_reg = (float)lambda;
    for (const char* flag : {"router", "router-kv", "router-weights", "router-heads"})
        if (c.arch != ARCH_LIME && a.has(flag))
            a.fail("--" + std::string(flag) + " is for --arch lime: " + arch + " has no router");
    if (c.router_same_head && c.router == ROUTER_AVERAGE)
        a.fail("--router-heads same is for a router that learns: --router average's weights are fixed");
    std::string vacuous = one_model ? ablation_vacuous(c) : "";  // a lime "ablation" that is lime at this shape
    if (!vacuous.empty()) a.fail(vacuous);
    if (one_model && c.arch != ARCH_HC && (a.has("hc-rate") || a.has("hc-dynamic")))
        a.fail("--hc-rate and --hc-dynamic are for --arch hc: " + arch + " has one residual stream");
    c.hc_rate = (int)a.integer("hc-rate", 1, 16);
    c.hc_dynamic = a.choice("hc-dynamic", {"0", "1"}) == "1";
    if (one_model && c.arch != ARCH_MUDDFORMER && a.has("mudd-ways"))
        a.fail("--mudd-ways is for --arch muddformer: " + arch + " has no dense ways");
    c.mudd_ways = a.choice("mudd-ways", {"qkvr", "kv"}) == "kv" ? MUDD_KV : MUDD_QKVR;
    return c;
}

// ---------------------------------------------------------------------------
// Train's flags. compare reads them too: a flag in its --train-args that train
// does not know is refused before any run starts, and --reuse compares runs by
// every flag's value, the defaults made explicit.

const std::vector<FlagSpec> TASK_FLAGS = {
    {"task", "arith", "arith (docs/tasks.md 1), prosqa (2) or text (3)"},
    {"ops", "3", "arith: operators per question, the tier k"},
    {"modulus", "11", "arith: the prime p"},
    {"format", "chain", "arith: chain (chain of thought) or direct"},
    {"train-size", "20000", "arith, prosqa: training examples (arith: at most the distinct questions of --ops and --modulus; prosqa: at most 1000000)"},
    {"test-size", "500", "arith, prosqa: test examples"},
    {"data-seed", "1", "arith, prosqa: seed of the generated data"},
    {"prosqa-test", "data/prosqa/prosqa_test.json", "prosqa: the real Coconut file scored on (a relative path missing here is looked up beside ./lime)"},
    {"text-file", "", "text: a UTF-8 file to model byte by byte"},
    {"val-frac", "0.1", "text: held-out tail for validation"},
};

// The tasks each task flag belongs to: a flag of another task is refused, never ignored.
static const struct { const char* flag; const char* tasks[2]; } TASK_OWNERS[] = {
    {"ops", {"arith"}},          {"modulus", {"arith"}},      {"format", {"arith"}},
    {"train-size", {"arith", "prosqa"}}, {"test-size", {"arith", "prosqa"}}, {"data-seed", {"arith", "prosqa"}},
    {"prosqa-test", {"prosqa"}}, {"text-file", {"text"}},     {"val-frac", {"text"}}, {"seq-len", {"text"}},
};

const char* task_owning_flag(const std::string& flag, const std::string& task) {
    for (const auto& o : TASK_OWNERS) {
        if (flag != o.flag) continue;
        for (const char* t : o.tasks) if (t && task == t) return nullptr;
        return o.tasks[0];
    }
    return nullptr;  // not a task's flag: any task
}

std::vector<FlagSpec> train_flags() {
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
        {"threads", "0", "OpenMP threads (0: all cores; at most 4 x the cores)"},
        {"device", "auto", "auto, cpu or gpu"},
        {"tf32", "1", "gpu: TF32 tensor cores for the matrix products (0: plain float32)"},
        PRECISION_FLAG,
        ATTENTION_FLAG,
        {"graph", "1", "gpu: replay each training step as one CUDA graph (0: plain launches)"},
        {"out", "runs/model", "output directory (created if missing)"},
        {"resume", "", "continue from a checkpoint written by train"},
        {"force", nullptr, "start afresh even where --out holds another run's checkpoint or model (replaced)"},
        {"log-every", "", "steps between progress lines (default: ~50 lines per run)"},
        {"eval-every", "", "steps between evaluations (default: ~5 per run)"},
        {"eval-size", "200", "test examples scored at each periodic evaluation"},
        {"curve", "0", "a learning curve: this many evaluations a run, evenly spaced, in place of --eval-every's; "
                       "checkpoints stay ~5 a run (0: --eval-every's)"},
        {"save-every", "", "steps between checkpoints (default: at each evaluation)"},
        {"stop-after", "0", "stop after this many steps of this run, saving a checkpoint (0: run to the end)"},
        {"skip-bad-steps", nullptr, "skip a step whose loss or gradient is NaN or Inf (default: stop training there)"},
        {"quiet", nullptr, "print only the final result"},
    }});
}

std::string shape_flag_value(const Config& c, const std::string& flag) {
    bool lime = c.arch == ARCH_LIME, hc = c.arch == ARCH_HC;
    if (flag == "arch") return arch_name(c.arch);
    if (flag == "layers") return std::to_string(c.L);
    if (flag == "dim") return std::to_string(c.d);
    if (flag == "heads") return std::to_string(c.H);
    if (flag == "kv-heads") return std::to_string(c.R);
    if (flag == "ffn") return std::to_string(c.F);
    if (flag == "router") return lime ? router_name(c) : "none";
    if (flag == "router-kv") return lime ? (c.router_kv_separate ? "separate" : "shared") : "none";
    if (flag == "router-weights") return lime ? (c.router_frozen ? "frozen" : "learned") : "none";
    if (flag == "router-heads") return lime ? (c.router_same_head ? "same" : "all") : "none";
    if (flag == "hc-rate") return hc ? std::to_string(c.hc_rate) : "none";
    if (flag == "hc-dynamic") return hc ? (c.hc_dynamic ? "1" : "0") : "none";
    if (flag == "mudd-ways") return c.arch == ARCH_MUDDFORMER ? (c.mudd_ways == MUDD_KV ? "kv" : "qkvr") : "none";
    if (flag == "entropy-reg") return fmt("%.9g", c.entropy_reg);
    return "";
}
