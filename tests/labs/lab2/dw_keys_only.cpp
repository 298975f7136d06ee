// A planted mistake (tests/test_labs.sh): dW gets the keys' sum only, with one router.
// expect: dW summed over the keys only
#include "labs/lab.h"

void router_backward(float* dWk, float* dWv, float* dKbuf, float* dVbuf, const float* dKr,
                     const float* dVr, const float* Wk, const float* Wv, const float* Kbuf,
                     const float* Vbuf, int l, RouterSpan learned, int N, int R, int hd) {
    int J = (l + 1) * R;
    size_t layer = (size_t)N * R * hd;
    for (int r = 0; r < R; r++)
        for (int j = 0; j < J; j++) {
            if (!learned.has(j / R)) continue;
            float k = 0, v = 0;
            for (int n = 0; n < N; n++)
                for (int i = 0; i < hd; i++) {
                    size_t at = ((size_t)r * N + n) * hd + i;
                    size_t src = (j / R) * layer + ((size_t)(j % R) * N + n) * hd + i;
                    k += dKr[at] * Kbuf[src];
                    v += dVr[at] * Vbuf[src];
                }
            dWk[r * J + j] += k;  // the mistake: and dWv, the same array with one router, gets nothing
            if (dWk != dWv) dWv[r * J + j] += v;
        }
    for (int n = 0; n < N; n++)
        for (int j = 0; j < J; j++) {

            for (int i = 0; i < hd; i++) {
                float k = 0, v = 0;
                for (int r = 0; r < R; r++) {
                    k += Wk[r * J + j] * dKr[((size_t)r * N + n) * hd + i];
                    v += Wv[r * J + j] * dVr[((size_t)r * N + n) * hd + i];
                }
                size_t src = (j / R) * layer + ((size_t)(j % R) * N + n) * hd + i;
                dKbuf[src] += k;
                dVbuf[src] += v;
            }
        }
}
