// A planted mistake (tests/test_labs.sh): dbuf written with =, losing what it held.
// expect: dbuf written with = instead of +=
#include "labs/lab.h"

void router_backward(float* dW, float* dbuf, const float* dout, const float* W, const float* buf, int l,
                     RouterSpan learned, int N, int R, int hd) {
    int cols = (l + 1) * R;
    size_t row = (size_t)N * hd;
    for (int r = 0; r < R; r++)
        for (int j = 0; j < cols; j++) {
            if (!learned.learns(r, j, R)) continue;
            float s = 0;
            for (size_t e = 0; e < row; e++) s += dout[r * row + e] * buf[j * row + e];
            dW[r * cols + j] += s;
        }
    for (int j = 0; j < cols; j++) {
        for (size_t e = 0; e < row; e++) {
            float s = 0;
            for (int r = 0; r < R; r++) s += W[r * cols + j] * dout[r * row + e];
            dbuf[j * row + e] = s;  // the mistake
        }
    }
}
