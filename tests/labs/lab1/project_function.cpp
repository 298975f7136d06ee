// A file with no loop of its own: it declares lime.cu's router_forward_fast
// (linked into the worker) and calls it. It is refused before any check.
// expect: calls router_forward_fast(KvPair, KvConst, KvConst, int, int, int, int), which lime.cu
#include "labs/lab.h"

void router_forward_fast(KvPair out, KvConst W, KvConst buf, int l, int N, int R, int hd);
void router_forward(float* out, const float* W, const float* buf, int l, int N, int R, int hd) {
    router_forward_fast({out, out}, {W, W}, {buf, buf}, l, N, R, hd);
}
