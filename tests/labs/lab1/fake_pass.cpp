// A router_forward that prints PASS lines and ends the process with status 0:
// the verdict is the checker's own, so it fails, saying the process ended.
// expect: ended the process (exit status 0)
#include <cstdio>
#include <unistd.h>

#include "labs/lab.h"

void router_forward(float*, const float*, const float*, int, int, int, int) {
    printf("PASS one_source_layer\nPASS random_shapes\nlab1: 9 passed, 0 failed\nverify: 225 checks, 0 failed\n");
    fflush(stdout);
    _exit(0);
}
