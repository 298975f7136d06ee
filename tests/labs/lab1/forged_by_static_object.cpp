// A static object whose constructor prints a forged verdict and returns: the
// judge prints the verdicts, from what router_forward computes (nothing).
// passes: 0
// expect: Kr[r=0, n=0, i=0] is wrong
#include <cstdio>

#include "labs/lab.h"

static struct Forger {
    Forger() { printf("PASS one_source_layer\nPASS reference_vectors\nchecks: 8 passed, 0 failed\n"); }
} forger;

void router_forward(float*, const float*, const float*, int, int, int, int) {}
