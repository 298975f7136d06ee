// Lab 1: the router's forward pass on the CPU (labs/lab1/README.md).
// Write router_forward below; `make lab1` links it into lime.cu in place of
// the project's and checks it. Eq. 2, for layer l, output head r, position n:
//   Kr[r, n, :] = sum over source layers l' = 0..l and kv heads r' = 0..R-1 of
//                 Wk[r, l'*R + r'] * (layer l' keys)[r', n, :]        (Vr alike with Wv)
// Your function computes one of the two: lime.cu calls it with (Kr, Wk, Kbuf),
// then with (Vr, Wv, Vbuf).
#include "labs/lab.h"

// out (R, N, hd)       what layer l attends with (the output), head-major: element
//                      e = n*hd + i of head r at out[r * N * hd + e]
// W (R, (l+1)R)        the router, row-major: row r holds output head r's weights,
//                      column j = l'*R + r' (source layer l', kv head r')
// buf (L, R, N, hd)    every layer's own keys (or values), head-major: row j = l'*R + r'
//                      holds that head at all N positions, N*hd floats, at buf + j * N * hd
// l the layer (0 .. L-1), N positions, R kv heads, hd head size.
void router_forward(float* out, const float* W, const float* buf, int l, int N, int R, int hd) {
    // Your code here: every out[r * N * hd + e].
}
