// A constructor that runs before any main and forges the whole verdict: the
// checker's PASS lines and count, verify's summary, then _exit(0). Only the
// worker (labs/check.h, "Who decides") runs it: it ends there, and fails.
// passes: 0
// expect: ended the process (exit status 0) before the check finished
#include <cstdio>
#include <unistd.h>

#include "labs/lab.h"

__attribute__((constructor)) static void forge() {
    printf("PASS one_source_layer\nPASS reference_vectors\nchecks: 8 passed, 0 failed\nverify: 225 checks, 0 failed\n");
    fflush(stdout);
    _exit(0);
}

void router_forward(float*, const float*, const float*, int, int, int, int) {}
