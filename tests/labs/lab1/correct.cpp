// A correct router_forward, written as a student would: it passes lab 1 (tests/test_labs.sh).
// expect: PASS
#include "labs/lab.h"

void router_forward(float* Kr, float* Vr, const float* Wk, const float* Wv, const float* Kbuf,
                    const float* Vbuf, int l, int N, int R, int hd) {
    int J = (l + 1) * R;
    size_t layer = (size_t)N * R * hd;
    for (int n = 0; n < N; n++)
        for (int r = 0; r < R; r++)
            for (int i = 0; i < hd; i++) {
                float k = 0, v = 0;
                for (int j = 0; j < J; j++) {
                    size_t src = (j / R) * layer + ((size_t)(j % R) * N + n) * hd + i;
                    k += Wk[r * J + j] * Kbuf[src];
                    v += Wv[r * J + j] * Vbuf[src];
                }
                Kr[((size_t)r * N + n) * hd + i] = k;
                Vr[((size_t)r * N + n) * hd + i] = v;
            }
}
