// Lab 2's file that also defines lab 1's router_forward (copied over): it
// would replace the project's forward in the worker alone, so it is refused
// before any check runs, naming the function to remove.
// expect: also defines router_forward(), another lab's function
#include "labs/lab.h"

void router_forward(float* Kr, float* Vr, const float* Wk, const float* Wv, const float* Kbuf, const float* Vbuf,
                    int l, int N, int R, int hd) {
    int J = (l + 1) * R;
    for (int r = 0; r < R; r++)
        for (int n = 0; n < N; n++)
            for (int i = 0; i < hd; i++) {
                float k = 0, v = 0;
                for (int j = 0; j < J; j++) {
                    k += Wk[r * J + j] * Kbuf[((size_t)j * N + n) * hd + i];
                    v += Wv[r * J + j] * Vbuf[((size_t)j * N + n) * hd + i];
                }
                Kr[((size_t)r * N + n) * hd + i] = k, Vr[((size_t)r * N + n) * hd + i] = v;
            }
}

void router_backward(float*, float*, float*, float*, const float*, const float*, const float*, const float*,
                     const float*, const float*, int, RouterSpan, int, int, int) {}
