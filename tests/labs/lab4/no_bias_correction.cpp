// A planted mistake (tests/test_labs.sh): the bias corrections left out of the update.
// expect: without the bias corrections
#include <algorithm>
#include <cmath>
#include "labs/lab.h"

AdamWNumbers adamw_numbers(const AdamWConfig& o, float factor, int step) {
    AdamWNumbers nums = {};
    nums.lr[GROUP_MATRIX] = o.lr * factor;
    nums.lr[GROUP_EMBED_GAIN] = o.lr * factor;
    nums.lr[GROUP_ROUTER] = o.router_lr * factor;
    nums.weight_decay[GROUP_MATRIX] = o.weight_decay;
    nums.beta1 = o.beta1, nums.beta2 = o.beta2, nums.eps = o.eps, nums.grad_clip = o.grad_clip;
    nums.bc1 = 1.0f - std::pow(o.beta1, (float)step);
    nums.bc2 = 1.0f - std::pow(o.beta2, (float)step);
    return nums;
}

void adamw(float* p, float* m, float* v, const float* g, size_t n, float lr, float wd, float grad_scale,
           const AdamWNumbers& nums) {
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * grad_scale;
        m[i] = nums.beta1 * m[i] + (1 - nums.beta1) * gi;
        v[i] = nums.beta2 * v[i] + (1 - nums.beta2) * gi * gi;
        p[i] -= lr * wd * p[i] + lr * m[i] / (std::sqrt(v[i]) + nums.eps)  /* the mistake */;
    }
}

float clip_scale(float norm, float grad_clip) {
    if (grad_clip <= 0) return 1;
    return std::min(1.0f, grad_clip / (norm + 1e-6f));
}
