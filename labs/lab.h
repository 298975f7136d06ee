// labs/lab.h — the functions of lime.cu a lab asks you to write. A lab build
// compiles lime.cu once with -DLIME_LAB, where these are weak symbols: the
// one your file defines is linked in place of the project's (labs/README.md).
// The signatures are lime.cu's; the comments above each in lime.cu say what
// every argument holds.
#pragma once
#include <cstddef>
#include <cstdint>
#include "support/model/lime.h"

// Lab 1. One buffer (the keys or the values) mixed by one router, Eq. 2:
// out (R, N, hd) = W (R, (l+1)R) @ buf[0 : (l+1)R]. buf (L, R, N, hd), head-major:
// row j = l'*R + r' (layer l', kv head r') holds that head's N positions, N*hd floats.
// lime.cu calls it twice: the keys, then the values.
void router_forward(float* out, const float* W, const float* buf, int l, int N, int R, int hd);
// Lab 2. The gradient of router_forward's output in; += the gradients of W and buf out.
// Called for the keys, then the values, with the same dW when one router mixes both.
void router_backward(float* dW, float* dbuf, const float* dout, const float* W, const float* buf, int l,
                     RouterSpan learned, int N, int R, int hd);
// Lab 4. One update's numbers; one tensor's update; the clipping factor.
AdamWNumbers adamw_numbers(const AdamWConfig& o, float factor, int step);
void adamw(float* p, float* m, float* v, const float* g, size_t n, float lr, float wd, float grad_scale,
           const AdamWNumbers& nums);
float clip_scale(float norm, float grad_clip);

// Lab 3 (built with support/harness/cuda_on_cpu.h): the launcher lime.cu calls for the
// router on the GPU, keys and values in one launch (KvPair, KvConst: support/model/lime.h).
#ifdef LIME_EMU
#include "support/harness/cuda_on_cpu.h"
void router_forward_gpu(KvPair out, KvConst W, KvConst buf, int l, int N, int R, int hd, cudaStream_t stream);
#endif
