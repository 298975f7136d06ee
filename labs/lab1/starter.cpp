// Lab 1: the router's forward pass on the CPU (labs/lab1/README.md).
// Write router_forward below; `make lab1` links it into lime.cu in place of
// the project's and checks it. Eq. 2, for layer l, output head r, position n:
//   Kr[r, n, :] = sum over source layers l' = 0..l and kv heads r' = 0..R-1 of
//                 Wk[r, l'*R + r'] * (layer l' keys)[r', n, :]        (Vr alike with Wv)
#include "labs/lab.h"

// Kr, Vr (R, N, hd)         what layer l attends with (outputs), head-major
// Wk, Wv (R, (l+1)R)        the key and the value router, row-major; with one
//                           router (Eq. 2 itself) Wk == Wv, the same pointer
// Kbuf, Vbuf (L, R, N, hd)  every layer's own keys and values, head-major:
//                           layer l' starts at Kbuf + l' * R * N * hd, its kv
//                           head r' at Kbuf + (l' * R + r') * N * hd
// l the layer (0 .. L-1), N positions, R kv heads, hd head size.
void router_forward(float* Kr, float* Vr, const float* Wk, const float* Wv, const float* Kbuf,
                    const float* Vbuf, int l, int N, int R, int hd) {
    // Your code here: every Kr[(r * N + n) * hd + i] and Vr[(r * N + n) * hd + i].
}
