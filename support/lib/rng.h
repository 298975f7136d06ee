// support/lib/rng.h — the one random generator of the project: splitmix64. Small,
// fast, the same numbers on every machine and compiler, so that a seed names
// one dataset, one initialisation and one data order everywhere.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>

struct Rng {
    uint64_t state;
    explicit Rng(uint64_t seed = 0) : state(seed) {}
    uint64_t next() {
        uint64_t z = (state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    // uniform integer in 0 .. n-1 (n >= 1); rejection keeps it exactly uniform
    uint64_t below(uint64_t n) {
        uint64_t limit = UINT64_MAX - UINT64_MAX % n;
        uint64_t x;
        do { x = next(); } while (x >= limit);
        return x % n;
    }
    double uniform() { return (next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
    double normal() {                                                        // Box-Muller
        double u1 = uniform(), u2 = uniform();
        if (u1 < 1e-300) u1 = 1e-300;
        return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    }
};

// A seed for a named sub-stream: the same (seed, name) gives the same numbers
// wherever it is used, whatever else was drawn before it.
inline uint64_t seed_for(uint64_t seed, const std::string& name) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a of the name
    for (unsigned char ch : name) { h ^= ch; h *= 1099511628211ull; }
    Rng r(seed ^ h);
    return r.next();
}
