// Lab 2: the router's backward pass on the CPU (labs/lab2/README.md).
// Write router_backward below; `make lab2` links it into lime.cu in place of
// the project's and checks it. It differentiates Eq. 2 (lab 1):
//   Kr[r, n, :] = sum_j Wk[r, j] * Kbuf_j[n, :]     j = l'*R + r': layer l', kv head r'
//   Vr[r, n, :] = sum_j Wv[r, j] * Vbuf_j[n, :]
// and it is the step that makes LIMe different: the gradient of layer l's
// loss reaches the keys and values of every earlier layer through it.
#include "labs/lab.h"

// In:  dKr, dVr (R, N, hd)   the gradients of the router's outputs, head-major
//      Wk, Wv (R, (l+1)R)     the routers (Wk == Wv, one pointer, with one router)
//      Kbuf, Vbuf (L, R, N, hd) every layer's keys and values, head-major: row j = l'*R + r'
//                             (Kbuf_j above) at Kbuf + j * N * hd
//      learned                learned.has(l'): the columns of source layer l' are trained; a
//                             router variant holds the others fixed, and they get no gradient
// Out, added to (+=) what they hold:
//      dWk, dWv (R, (l+1)R)   (dWk == dWv, one pointer, with one router)
//      dKbuf, dVbuf (L, R, N, hd)  layers 0..l
void router_backward(float* dWk, float* dWv, float* dKbuf, float* dVbuf, const float* dKr,
                     const float* dVr, const float* Wk, const float* Wv, const float* Kbuf,
                     const float* Vbuf, int l, RouterSpan learned, int N, int R, int hd) {
    // Your code here.
}
