// support/model/memory_check.h — the fix for a model that does not fit in
// memory (memory_fix: the command's own size flags that would shrink it most),
// and the shapes the code cannot run (launch_check), both asked before
// anything is allocated. What a shape needs (lime.cu's memory_needed) is the
// caller's, handed in as a function.
#pragma once
#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "support/model/lime.h"

// The fix for a model that needs need(c, B) bytes, more than there is: the
// command's size flags (SizeFlags) whose halving saves the most: those that
// save at least half as much as the best of all sizes does; where none does, a
// machine with more memory.
template <class Need>
static std::string memory_fix(const Config& c, int B, const SizeFlags& f, Need need) {
    const std::string* flags[] = {&f.layers, &f.dim, &f.ffn, &f.vocab, &f.batch, &f.seq_len};
    double all = need(c, B), best = 0;
    std::vector<std::pair<double, std::string>> named;  // (bytes halving it saves, flag)
    for (int k = 0; k < 6; k++) {
        Config h = c;
        int hb = B, *size[] = {&h.L, &h.d, &h.F, &h.V, &hb, &h.T};
        if (*size[k] < 2) continue;
        *size[k] /= 2;
        h.hd = std::max(1, h.d / h.H);
        double saved = all - need(h, hb);
        best = std::max(best, saved);
        if (!flags[k]->empty()) named.push_back({saved, *flags[k]});
    }
    std::stable_sort(named.begin(), named.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
    std::vector<std::string> fix;
    for (auto& [saved, flag] : named)
        if (best > 0 && saved >= best / 2) fix.push_back(flag);
    if (fix.empty()) return "it needs a machine with more memory";
    std::string s = "lower " + fix[0];
    for (size_t i = 1; i < fix.size(); i++) s += (i + 1 == fix.size() ? " or " : ", ") + fix[i];
    return s;
}

// The line for a model whose host memory need(c, B), `state` bytes of it the
// parameters, gradients and AdamW state, is more than the settings.host_bytes
// there are, with the flags that shrink it; "" when it fits, or when the
// host's memory is unknown (0).
template <class Need>
static std::string host_memory_check(const Config& c, int B, Device dev, const ModelSettings& settings, double state,
                                     Need need) {
    double bytes = need(c, B);
    if (!settings.host_bytes || bytes <= settings.host_bytes) return "";
    char buf[300];
    snprintf(buf, sizeof buf,
             "out of memory: needs %.1f GB of host memory (%.1f GB for the parameters, gradients and AdamW state, "
             "%.1f GB for the %s), %.1f GB is available; ",
             bytes / 1e9, state / 1e9, (bytes - state) / 1e9,
             dev == DEVICE_GPU ? "host copy of the logits" : "activations and scratch", settings.host_bytes / 1e9);
    return buf + memory_fix(c, B, settings.flags, need);
}

// The line for models held at once (bench: one of each kind) whose host memory,
// need(c, B) each, is together more than the host has, with the flags that
// shrink them all (each model's shape flags halved alike); "" when they fit.
template <class Need>
static std::string models_fit_check(const std::vector<Config>& cs, int B, const ModelSettings& settings, Need need) {
    auto sum = [&](const Config& sizes, int hb) {
        double bytes = 0;
        for (Config c : cs) {
            c.L = sizes.L, c.d = sizes.d, c.hd = sizes.hd, c.F = sizes.F, c.V = sizes.V, c.T = sizes.T;
            bytes += need(c, hb);
        }
        return bytes;
    };
    if (cs.empty() || !settings.host_bytes || sum(cs[0], B) <= settings.host_bytes) return "";
    char buf[200];
    snprintf(buf, sizeof buf, "out of memory: the %zu models held at once need %.3g GB of host memory together, "
             "%.3g GB is available; ", cs.size(), sum(cs[0], B) / 1e9, settings.host_bytes / 1e9);
    return buf + memory_fix(cs[0], B, settings.flags, sum);
}

// Shapes the code cannot run, refused at create with the flag to lower, in
// the words of the device asked for. On every device: the loops and kernels
// index in 32-bit ints (a position n < B*T, an element of the GPU's
// elementwise kernels), so no array (the logits, the key and value buffers, a
// (B, T, d) activation, the embedding) may reach 2^31 floats. On the GPU only
// (the CPU loops have no such limit, so a CPU run is not refused for it; a
// checkpoint moved to the GPU is checked again there, at the batch of the
// command that loads it): flash attention's grid has one row of blocks per
// sequence, at most 65535.
static inline std::string launch_check(const Config& c, int B, Device dev, const SizeFlags& f) {
    const char* limit = dev == DEVICE_GPU ? "the 2^31 the GPU kernels' 32-bit indices reach"
                                          : "the 2^31 elements the CPU loops' 32-bit indices reach";
    // hc: the residual stream's arrays are n streams, the mixtures n+1 (B*T*(n+1)*d)
    double N = (double)B * c.T, width = std::max((double)c.d * (c.arch == ARCH_HC ? c.hc_rate + 1 : 1), (double)c.H * c.hd);
    std::string lower = "lower " + (!f.batch.empty() ? f.batch : !f.seq_len.empty() ? f.seq_len : "the batch");
    const std::pair<double, const char*> arrays[] = {{N * c.V, "logits (B*T*V)"},
                                                     {N * c.L * c.R * c.hd, "key buffer (L*B*T*R*hd)"},
                                                     {N * width, c.arch == ARCH_HC ? "residual streams' mixtures (B*T*(n+1)*d)" : "residual stream (B*T*d)"}};
    char buf[300];
    for (auto [floats, name] : arrays)
        if (floats >= 2147483648.0) {
            snprintf(buf, sizeof buf, "batch %d x %d positions: the %s would be %.3g floats, over %s; %s", B, c.T,
                     name, floats, limit, lower.c_str());
            return buf;
        }
    if ((double)c.V * c.d >= 2147483648.0)
        return std::string("the embedding (vocab x dim) would be 2^31 floats or more, over ") + limit + "; lower " +
               (f.vocab.empty() ? std::string("the vocabulary") : f.vocab);
    if (dev != DEVICE_GPU) return "";
    if (B > 65535) {
        snprintf(buf, sizeof buf, "batch %d: the GPU's flash attention launches one row of blocks per sequence, "
                 "at most 65535; %s", B, lower.c_str());
        return buf;
    }
    return "";
}
