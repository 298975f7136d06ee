// A router_forward that never returns: the first check is stopped after
// LAB_TIMEOUT seconds with a line saying so, the rest are not run.
// timeout: 2
// expect: did not finish within 2 s
#include "labs/lab.h"

void router_forward(float* out, const float*, const float*, int, int, int, int) {
    for (volatile float x = 0;; x = x + out[0]) {}
}
