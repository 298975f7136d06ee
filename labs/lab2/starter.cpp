// Lab 2: the router's backward pass on the CPU (labs/lab2/README.md).
// Write router_backward below; `make lab2` links it into lime.cu in place of
// the project's and checks it. It differentiates lab 1's forward for one
// buffer (the keys or the values):
//   out[r][e] = sum_j W[r, j] * buf[j][e]      j = l'*R + r': layer l', kv head r'
// and it is the step that makes LIMe different: the gradient of layer l's
// loss reaches the keys and values of every earlier layer through it.
// lime.cu calls it for the keys, then the values; with one router (Eq. 2)
// both calls get the same dW, which so collects both sums.
#include "labs/lab.h"

// In:  dout (R, N, hd)       the gradient of the router's output, head-major: out[r][e]
//                            is out[r * N * hd + e], e = n*hd + i
//      W (R, (l+1)R)         the router, row-major
//      buf (L, R, N, hd)     every layer's keys (or values), head-major: row j = l'*R + r'
//                            (buf[j] above) at buf + j * N * hd
//      learned               learned.learns(r, j, R): the weight W[r, j] is trained; a router
//                            variant holds the others fixed (a few source layers, or every
//                            weight that mixes one kv head into another), and they get no gradient
// Out, added to (+=) what they hold:
//      dW (R, (l+1)R)        W's gradient
//      dbuf (L, R, N, hd)    the gradient of buf, layers 0..l
void router_backward(float* dW, float* dbuf, const float* dout, const float* W, const float* buf, int l,
                     RouterSpan learned, int N, int R, int hd) {
    // Your code here.
}
