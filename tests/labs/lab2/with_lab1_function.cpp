// Lab 2's file that also defines lab 1's router_forward (copied over): it
// would replace the project's forward in the worker alone, so it is refused
// before any check runs, naming the function to remove.
// expect: also defines router_forward(), another lab's function
#include "labs/lab.h"

void router_forward(float* out, const float* W, const float* buf, int l, int N, int R, int hd) {
    int cols = (l + 1) * R;
    size_t row = (size_t)N * hd;
    for (int r = 0; r < R; r++)
        for (size_t e = 0; e < row; e++) {
            float s = 0;
            for (int j = 0; j < cols; j++) s += W[r * cols + j] * buf[j * row + e];
            out[r * row + e] = s;
        }
}

void router_backward(float*, float*, const float*, const float*, const float*, int, RouterSpan, int, int, int) {}
