// support/model/names.cpp — the model's names on the command line and in
// checkpoints' configs: architectures, routers, attention kernels, and a whole
// model as compare names it ("lime:last-2", "hc:n2:static", "llama:ereg=0.1");
// the check of a model's shape every config passes before anything is sized by
// it (config_check); and the flags that shape a model, which train and bench
// share (SHAPE_FLAGS, shape_from_args).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "support/model/names.h"

static const char* const ARCH_NAMES[] = {"llama", "lime", "hc", "resformer", "denseformer"};  // by Arch
const char* arch_name(Arch a) { return ARCH_NAMES[a]; }

std::string router_name(const Config& c) {
    switch (c.router) {
    case ROUTER_AVERAGE: return "average";
    case ROUTER_LAST: return "last-" + std::to_string(c.router_j);
    case ROUTER_FIRST: return "first-" + std::to_string(c.router_j);
    default: return "static";
    }
}

std::string config_check(const Config& c) {
    char buf[256];
    auto fail = [&](const char* fmt, auto... args) {
        snprintf(buf, sizeof buf, fmt, args...);
        return std::string(buf);
    };
    if (c.V < 1) return fail("vocabulary size %d must be at least 1", c.V);
    if (c.L < 1) return fail("--layers %d must be at least 1", c.L);
    // the flags' limits, asked of every config (a checkpoint's too) before anything is sized by it
    if (c.L > 256 || c.d > 65536 || c.H > 1024 || c.R > 1024 || c.F > (1 << 20) || c.V > (1 << 24) || c.T > (1 << 20))
        return fail("layers %d, dim %d, heads %d, kv-heads %d, ffn %d, vocab %d or positions %d is past this program's "
                    "limits (256, 65536, 1024, 1024, 1048576, 16777216, 1048576)", c.L, c.d, c.H, c.R, c.F, c.V, c.T);
    if (c.d < 2 || c.H < 1 || c.R < 1)
        return fail("--dim %d, --heads %d and --kv-heads %d must be positive", c.d, c.H, c.R);
    if (c.d % c.H)
        return fail("--dim %d is not divisible by --heads %d; pick a width that is a multiple of the heads", c.d, c.H);
    if (c.H % c.R)
        return fail(
            "--heads %d is not divisible by --kv-heads %d; each kv head must serve a whole group of query heads", c.H,
            c.R);
    if (c.hd != c.d / c.H) return fail("head size %d differs from dim / heads = %d", c.hd, c.d / c.H);
    if (c.hd % 2) return fail("head size dim / heads = %d is odd; RoPE rotates pairs, choose an even head size", c.hd);
    if (c.F < 1) return fail("--ffn %d must be at least 1", c.F);
    if (c.T < 1) return fail("--seq-len %d must be at least 1", c.T);
    if (!(c.rope_theta > 0) || !(c.eps > 0)) return fail("rope_theta and rms_norm_eps must be positive");
    if (c.arch != ARCH_LIME && (c.router != ROUTER_STATIC || c.router_kv_separate || c.router_frozen || c.router_same_head))
        return fail("--router, --router-kv, --router-weights and --router-heads are for --arch lime: %s has no router",
                    arch_name(c.arch));
    if (c.router_same_head && c.router == ROUTER_AVERAGE)
        return fail("--router-heads same is for a router that learns: --router average's weights are fixed");
    if (c.arch == ARCH_HC && (c.hc_rate < 1 || c.hc_rate > 16))
        return fail("--hc-rate %d must be 1 .. 16 (the number of residual streams; the paper's is 4)", c.hc_rate);
    if (!(c.entropy_reg >= 0) || !std::isfinite(c.entropy_reg))
        return fail("--entropy-reg %g must be a finite number >= 0 (0: no regulariser)", (double)c.entropy_reg);
    if ((c.router == ROUTER_LAST || c.router == ROUTER_FIRST) && (c.router_j < 1 || c.router_j > c.L))
        return fail("--router %s: J must be 1 .. %d (the number of layers)", router_name(c).c_str(), c.L);
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
    for (int a = ARCH_HC; a <= ARCH_DENSEFORMER; a++)
        if (s == ARCH_NAMES[a]) { *out = (Arch)a; return true; }
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
        if (num.empty() || *end || !std::isfinite(v) || v < 0 || v > 1e6) return false;
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
    if (colon == std::string::npos) return true;
    if (c->arch != ARCH_LIME && c->arch != ARCH_HC) return false;  // llama and the peers have no variant to name
    std::string rest = s.substr(colon + 1);
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

const std::vector<FlagSpec> SHAPE_FLAGS = {
    {"arch", "lime", "llama, lime, or a study model: hc (Hyper-Connections, the paper's other baseline), resformer "
                     "(value residual), denseformer (depth-weighted average)"},
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
    {"entropy-reg", "0", "lambda of the value-entropy regulariser: loss - lambda * mean S2 of each layer's values (0: off)"},
};

// The model's shape from the shape flags (V and T come from the task or --vocab, --seq-len).
// one_model: the flags shape one model (train); bench shapes three from them, so
// its --hc-rate and --hc-dynamic go to its hc beside a lime.
Config shape_from_args(Args& a, bool one_model) {
    Config c;
    std::string arch = a.choice("arch", {"llama", "lime", "hc", "resformer", "denseformer"});
    arch_parse(arch, &c.arch);
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
    c.entropy_reg = (float)a.number("entropy-reg", 0, 1e6);
    for (const char* flag : {"router", "router-kv", "router-weights", "router-heads"})
        if (c.arch != ARCH_LIME && a.has(flag))
            a.fail("--" + std::string(flag) + " is for --arch lime: " + arch + " has no router");
    if (c.router_same_head && c.router == ROUTER_AVERAGE)
        a.fail("--router-heads same is for a router that learns: --router average's weights are fixed");
    if (one_model && c.arch != ARCH_HC && (a.has("hc-rate") || a.has("hc-dynamic")))
        a.fail("--hc-rate and --hc-dynamic are for --arch hc: " + arch + " has one residual stream");
    c.hc_rate = (int)a.integer("hc-rate", 1, 16);
    c.hc_dynamic = a.choice("hc-dynamic", {"0", "1"}) == "1";
    return c;
}
