// A planted mistake (tests/test_labs.sh): the layer's own block left out.
// expect: own block
#include "labs/lab.h"

void router_forward(float* out, const float* W, const float* buf, int l, int N, int R, int hd) {
    int cols = (l + 1) * R;
    size_t row = (size_t)N * hd;
    for (int r = 0; r < R; r++)
        for (size_t e = 0; e < row; e++) {
            float s = 0;
            for (int j = 0; j < cols; j++) {
                if (j / R == l) continue;  // the mistake
                s += W[r * cols + j] * buf[j * row + e];
            }
            out[r * row + e] = s;
        }
}
