// A planted mistake (tests/test_labs.sh): the learned weights picked by source layer alone
// (learned.has), so the cross-head ablation's held-fixed weights get a gradient too.
// expect: a gradient for every weight
#include "labs/lab.h"

void router_backward(float* dW, float* dbuf, const float* dout, const float* W, const float* buf, int l,
                     RouterSpan learned, int N, int R, int hd) {
    int cols = (l + 1) * R;
    size_t row = (size_t)N * hd;
    for (int r = 0; r < R; r++)
        for (int j = 0; j < cols; j++) {
            if (!learned.has(j / R)) continue;  // the mistake: by source layer only
            float s = 0;
            for (size_t e = 0; e < row; e++) s += dout[r * row + e] * buf[j * row + e];
            dW[r * cols + j] += s;  // with one router the keys' call and the values' call both add here
        }
    for (int j = 0; j < cols; j++) {
        for (size_t e = 0; e < row; e++) {
            float s = 0;
            for (int r = 0; r < R; r++) s += W[r * cols + j] * dout[r * row + e];
            dbuf[j * row + e] += s;
        }
    }
}
