// A planted mistake (tests/test_labs.sh): out added to (+=), not set: it keeps the last step's numbers.
// expect: added to (+=) what it held before the call
#include "labs/lab.h"

void router_forward(float* out, const float* W, const float* buf, int l, int N, int R, int hd) {
    int cols = (l + 1) * R;
    size_t row = (size_t)N * hd;
    for (int r = 0; r < R; r++)
        for (size_t e = 0; e < row; e++) {
            for (int j = 0; j < cols; j++) {
                out[r * row + e] += W[r * cols + j] * buf[j * row + e];  // the mistake: out is never set
            }
        }
}
