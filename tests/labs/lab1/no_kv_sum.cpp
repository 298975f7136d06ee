// A planted mistake (tests/test_labs.sh): only kv head r' = r of each source layer.
// expect: sum over kv heads dropped
#include "labs/lab.h"

void router_forward(float* out, const float* W, const float* buf, int l, int N, int R, int hd) {
    int cols = (l + 1) * R;
    size_t row = (size_t)N * hd;
    for (int r = 0; r < R; r++)
        for (size_t e = 0; e < row; e++) {
            float s = 0;
            for (int j = 0; j < cols; j++) {
                if (j % R != r) continue;  // the mistake
                s += W[r * cols + j] * buf[j * row + e];
            }
            out[r * row + e] = s;
        }
}
