// tests/test.h — a test runner small enough to read in a minute.
//
//   TEST(rmsnorm_matches_hand_values) {
//       ...
//       CHECK(err < 1e-6, "rmsnorm out: rel err %.2e > 1e-6", err);
//   }
//
// CHECK records a failure with its message and returns from the test; SKIP
// marks the test skipped with a reason. main() (tests/test_main.cpp) runs
// every registered test, or those whose name contains argv[1], prints one
// line each and ends with "N passed, N failed, N skipped". One CHECK per
// condition, so that a failure names the one that did not hold. Below them,
// contains and rel_err, which every file uses; what the model's tests share
// (random vectors, a tiny config, a guard that frees models) is in test_helpers.h.
#pragma once
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

struct TestCase { const char* name; void (*fn)(); };
inline std::vector<TestCase>& test_registry() { static std::vector<TestCase> r; return r; }
struct TestRegistrar { TestRegistrar(const char* n, void (*f)()) { test_registry().push_back({n, f}); } };

enum TestOutcome { TEST_PASS, TEST_FAIL, TEST_SKIP };
struct TestState { TestOutcome outcome = TEST_PASS; std::string message; };
inline TestState& test_state() { static TestState s; return s; }

#define TEST(name)                                                   \
    static void test_##name();                                       \
    static TestRegistrar registrar_##name(#name, test_##name);       \
    static void test_##name()

#define CHECK(cond, ...)                                                          \
    do {                                                                          \
        if (!(cond)) {                                                            \
            char msg_[512];                                                       \
            snprintf(msg_, sizeof msg_, __VA_ARGS__);                             \
            test_state().outcome = TEST_FAIL;                                     \
            test_state().message = std::string(msg_) + " (" + __FILE__ + ":" +    \
                                   std::to_string(__LINE__) + ")";                \
            return;                                                               \
        }                                                                         \
    } while (0)

#define SKIP(...)                                                                 \
    do {                                                                          \
        char msg_[512];                                                           \
        snprintf(msg_, sizeof msg_, __VA_ARGS__);                                 \
        test_state().outcome = TEST_SKIP;                                         \
        test_state().message = msg_;                                              \
        return;                                                                   \
    } while (0)

// Whether text holds part: how the tests look for a word in an error message.
inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// |a - b|_2 / |b|_2, the relative error the reference vectors' tolerances are stated in (docs/checkpoint.md).
inline double rel_err(const float* a, const float* b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double diff = (double)a[i] - (double)b[i];
        num += diff * diff;
        den += (double)b[i] * b[i];
    }
    if (den == 0) return std::sqrt(num);
    return std::sqrt(num / den);
}
