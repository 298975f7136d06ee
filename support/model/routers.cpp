// support/model/routers.cpp — LIMe's routers as model_init sets them, and the
// check that a loaded model's fixed entries are still those values.
// The variants (lime.cu's router_sources, router_learned) learn only some of
// W[r, j]; the others keep model_init's values for good (no gradient, no decay).
#include <cmath>
#include <string>

#include "support/lib/cli.h"
#include "support/lib/rng.h"
#include "support/model/lime.h"

// A LIMe router t (R, (l+1)*R) as model_init sets it (the peers' router-group weights get
// model_init's normal draw, then their own initialisation: support/study/).
void router_init(const Config& c, const TensorSpec& t, uint64_t seed, float* p) {
    Rng rng(seed_for(seed, t.name));
    // uniform in [-b, b], b = sqrt(3 / ((l+1) R)), then the last R x R block = I
    int cols = t.shape[1], R = c.R, l = cols / R - 1;
    double b = std::sqrt(3.0 / cols);
    for (size_t i = 0; i < t.numel; i++) p[i] = (float)((2.0 * rng.uniform() - 1.0) * b);
    for (int r = 0; r < R; r++)
        for (int k = 0; k < R; k++) p[r * cols + (cols - R) + k] = r == k ? 1.0f : 0.0f;
    // the variants (router_sources): 0 for the layers a router does not read;
    // average's fixed weights, 1/(l+1) for the same kv head of every layer
    RouterSpan sources = router_sources(c, l);
    for (int r = 0; r < R; r++)
        for (int j = 0; j < cols; j++) {
            if (!sources.has(j / R) || (c.router_same_head && j % R != r)) p[r * cols + j] = 0.0f;
            if (c.router == ROUTER_AVERAGE) p[r * cols + j] = j % R == r ? 1.0f / (l + 1) : 0.0f;
        }
}

// What the config says that holds router weights fixed, as the config names it.
static std::string router_variant_words(const Config& c) {
    std::string s = c.router != ROUTER_STATIC ? "router " + router_name(c) : "";
    if (c.router_same_head) s += (s.empty() ? "" : ", ") + std::string("router_heads same");
    if (c.router_frozen) s += (s.empty() ? "" : ", ") + std::string("router_frozen true");
    return s;
}

std::string router_fixed_check(const Config& c, const std::vector<TensorSpec>& specs, const float* params,
                               const uint64_t* seed) {
    if (c.arch != ARCH_LIME) return "";
    // a frozen router's fixed values are model_init's random draws: known only with the run's
    // seed; without it, the entries the variant would hold fixed unfrozen (0, 1/(l+1)) are checked
    Config fixed = c;
    if (!seed) fixed.router_frozen = false;
    std::vector<float> want;
    for (const TensorSpec& t : specs) {
        if (t.group != GROUP_ROUTER || t.shape.size() != 2) continue;
        int cols = t.shape[1], R = c.R, l = cols / R - 1;
        RouterSpan learned = router_learned(fixed, l);
        // --router-kv separate: the value router starts as a copy of the key router (model_init)
        TensorSpec init = t;
        size_t at = init.name.find("router_v.");
        if (at != std::string::npos) init.name.replace(at, 9, "router.");
        want.resize(t.numel);
        router_init(c, init, seed ? *seed : 0, want.data());
        const float* p = params + t.offset;
        for (int r = 0; r < R; r++)
            for (int j = 0; j < cols; j++)
                if (!learned.learns(r, j, R) && p[r * cols + j] != want[r * cols + j])
                    return strf("its config says %s, but %s[%d][%d] is %.9g, not %.9g as that variant holds it "
                                "(model_init's value, never trained): its tensors belong to another model than its "
                                "config says; use a checkpoint that ./lime train wrote",
                                router_variant_words(c).c_str(), t.name.c_str(), r, j, p[r * cols + j],
                                want[r * cols + j]);
    }
    return "";
}
