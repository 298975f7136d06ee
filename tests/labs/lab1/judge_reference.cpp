// A file with no loop of its own: it includes the judge's header and calls
// the judge's reference, router_with_slip. It is refused before any check.
// expect: includes labs/check.h: a lab file may include labs/lab.h and the standard headers only
#include "labs/check.h"

void router_forward(float* out, const float* W, const float* buf, int l, int N, int R, int hd) {
    router_with_slip(SLIP_NONE, out, out, W, buf, l, N, R, hd);
}
