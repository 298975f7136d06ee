// labs/lab.h — the functions of lime.cu a lab asks you to write. A lab build
// compiles lime.cu once with -DLIME_LAB, where these are weak symbols: the
// one your file defines is linked in place of the project's (labs/README.md).
// The signatures are lime.cu's; the comments above each in lime.cu say what
// every argument holds.
#pragma once
#include <cstddef>
#include <cstdint>
#include "support/model/lime.h"

// Lab 1. Kr, Vr (R, N, hd); Wk, Wv (R, (l+1)R); Kbuf, Vbuf (L, R, N, hd), head-major:
// row j = l'*R + r' (layer l', kv head r') holds that head's N positions, N*hd floats.
void router_forward(float* Kr, float* Vr, const float* Wk, const float* Wv, const float* Kbuf,
                    const float* Vbuf, int l, int N, int R, int hd);
// Lab 2. The gradients of router_forward's outputs in, += the gradients of its inputs out.
void router_backward(float* dWk, float* dWv, float* dKbuf, float* dVbuf, const float* dKr,
                     const float* dVr, const float* Wk, const float* Wv, const float* Kbuf,
                     const float* Vbuf, int l, RouterSpan learned, int N, int R, int hd);
// Lab 4. One update's numbers; one tensor's update; the clipping factor.
AdamWNumbers adamw_numbers(const AdamWConfig& o, float factor, int step);
void adamw_cpu(float* p, float* m, float* v, const float* g, size_t n, float lr, float wd,
               float grad_scale, const AdamWNumbers& nums);
float clip_scale(float norm, float grad_clip);

// Lab 3 (built with support/harness/cuda_on_cpu.h): the launcher lime.cu calls for the router.
#ifdef LIME_EMU
#include "support/harness/cuda_on_cpu.h"
void router_forward_gpu(float* Kr, float* Vr, const float* Wk, const float* Wv, const float* Kbuf,
                        const float* Vbuf, int l, int N, int R, int hd, cublasHandle_t blas);
#endif
