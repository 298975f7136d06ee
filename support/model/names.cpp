// support/model/names.cpp — the model's names on the command line and in
// checkpoints' configs: architectures, routers, attention kernels, and a whole
// model as compare names it ("lime:last-2", "hc:n2:static", "llama:ereg=0.1").
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "support/model/names.h"

bool attention_parse(const std::string& s, Attention* out) {
    if (s == "auto") { *out = ATTENTION_AUTO; return true; }
    if (s == "matmul") { *out = ATTENTION_MATMUL; return true; }
    if (s == "flash") { *out = ATTENTION_FLASH; return true; }
    return false;
}

bool arch_parse(const std::string& s, Arch* out) {
    if (s == "lime") { *out = ARCH_LIME; return true; }
    if (s == "llama") { *out = ARCH_LLAMA; return true; }
    if (s == "hc") { *out = ARCH_HC; return true; }
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
    c->hc_rate = 4;  // hc's defaults: 4 streams, dynamic
    c->hc_dynamic = true;
    if (colon == std::string::npos) return true;
    if (c->arch == ARCH_LLAMA) return false;  // llama has no variant to name
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
        bool* seen = part == "separate" || part == "shared" ? &kv : part == "frozen" ? &c->router_frozen : &variant;
        if (*seen) return false;
        if (part == "separate" || part == "shared") c->router_kv_separate = part == "separate";
        else if (part != "frozen" && !router_parse(part, c)) return false;
        *seen = true;
        at = end + 1;
    }
    return true;
}
