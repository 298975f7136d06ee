// tests/test_main.cpp — runs the tests linked into this binary (see test.h).
#include <cstring>
#include "support/lib/cli.h"  // set_wait_policy
#include "test.h"

int main(int argc, char** argv) {
    set_wait_policy(argv);  // as ./lime: waiting threads sleep, so suites run side by side (tests/run.sh)
    const char* filter = argc > 1 ? argv[1] : nullptr;
    int passed = 0, failed = 0, skipped = 0;
    for (const TestCase& t : test_registry()) {
        if (filter && !strstr(t.name, filter)) continue;
        test_state() = TestState();
        t.fn();
        const TestState& s = test_state();
        if (s.outcome == TEST_PASS) { passed++; printf("PASS %s\n", t.name); }
        if (s.outcome == TEST_FAIL) { failed++; printf("FAIL %s: %s\n", t.name, s.message.c_str()); }
        if (s.outcome == TEST_SKIP) { skipped++; printf("SKIP %s: %s\n", t.name, s.message.c_str()); }
        fflush(stdout);
    }
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
