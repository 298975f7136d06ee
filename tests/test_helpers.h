// tests/test_helpers.h — what the model's test files share: random vectors, a
// tiny model's config, and a guard that frees the models a test made.
//
//   Config c = tiny_config(ARCH_LIME, 4, 2);  // 3 layers, d = 16, 4 heads, 2 kv heads
//   Model m;
//   FreeOnReturn free_m{&m};                   // model_free(&m) however the test ends
//   CHECK(model_create(&m, c, 2, DEVICE_CPU).empty(), "model_create failed");
//
// tests/test_model.cpp and tests/test_gpu.cpp include lime.cu before this file;
// the others, support/model/lime.h alone.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "support/lib/rng.h"
#include "support/model/lime.h"

// n random values in [-scale, scale], the same for the same seed.
inline std::vector<float> randv(size_t n, uint64_t seed, float scale = 1.0f) {
    Rng r(seed);
    std::vector<float> v(n);
    for (float& x : v) x = (float)((2 * r.uniform() - 1) * scale);
    return v;
}

// n random integers in 0 .. below-1, the same for the same seed.
inline std::vector<int> randi(size_t n, uint64_t seed, int below) {
    Rng r(seed);
    std::vector<int> v(n);
    for (int& x : v) x = (int)r.below(below);
    return v;
}

// A tiny model of `arch`: L layers of H heads of 4 dimensions (d = 4H), R kv
// heads, F hidden units, sequences of up to T positions over V tokens. The
// defaults are the CPU tests' shape; tests/test_gpu.cpp names its own.
inline Config tiny_config(Arch arch, int H, int R, int T = 6, int L = 3, int F = 12, int V = 11) {
    Config c;
    c.arch = arch;
    c.V = V; c.L = L; c.d = 4 * H; c.H = H; c.R = R; c.hd = 4; c.F = F; c.T = T;
    return c;
}

// Frees the models a test made when it returns, passed or failed: CHECK returns
// early. model_free is safe on a model never created, or already freed.
struct FreeOnReturn {
    std::vector<Model*> models;
    FreeOnReturn(std::initializer_list<Model*> ms) : models(ms) {}
    ~FreeOnReturn() {
        for (Model* m : models) model_free(m);
    }
    FreeOnReturn(const FreeOnReturn&) = delete;
    FreeOnReturn& operator=(const FreeOnReturn&) = delete;
};
