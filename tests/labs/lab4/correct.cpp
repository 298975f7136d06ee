// A correct lab 4, written as a student would: it passes (tests/test_labs.sh).
// expect: PASS
#include <algorithm>
#include <cmath>
#include "labs/lab.h"

AdamWNumbers adamw_numbers(const AdamWConfig& o, float factor, int step) {
    AdamWNumbers h = {};
    h.lr[GROUP_MATRIX] = o.lr * factor;
    h.lr[GROUP_EMBED_GAIN] = o.lr * factor;
    h.lr[GROUP_ROUTER] = o.router_lr * factor;
    h.weight_decay[GROUP_MATRIX] = o.weight_decay;
    h.beta1 = o.beta1, h.beta2 = o.beta2, h.eps = o.eps, h.grad_clip = o.grad_clip;
    h.bc1 = 1.0f - std::pow(o.beta1, (float)step);
    h.bc2 = 1.0f - std::pow(o.beta2, (float)step);
    return h;
}

void adamw_cpu(float* p, float* m, float* v, const float* g, size_t n, float lr, float wd,
               float grad_scale, const AdamWNumbers& h) {
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * grad_scale;
        m[i] = h.beta1 * m[i] + (1 - h.beta1) * gi;
        v[i] = h.beta2 * v[i] + (1 - h.beta2) * gi * gi;
        p[i] -= lr * wd * p[i] + lr * (m[i] / h.bc1) / (std::sqrt(v[i] / h.bc2) + h.eps);
    }
}

float clip_scale(float norm, float grad_clip) {
    if (grad_clip <= 0) return 1;
    return std::min(1.0f, grad_clip / (norm + 1e-6f));
}
