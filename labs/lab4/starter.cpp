// Lab 4: AdamW with the router's own parameter group, and global-norm
// clipping (labs/lab4/README.md, docs/training.md). Write the three functions
// below; `make lab4` links them into lime.cu in place of the project's.
#include <cmath>
#include "labs/lab.h"

// The numbers of update number `step` (1, 2, ...) with the schedule factor
// `factor`, per Group (GROUP_MATRIX, GROUP_EMBED_GAIN, GROUP_ROUTER):
//   lr[g]            the group's learning rate times factor (the routers have their own, o.router_lr)
//   weight_decay[g]  o.weight_decay for the matrices, 0 for the others
//   beta1, beta2, eps, grad_clip   the config's
//   bc1, bc2         the bias corrections 1 - beta1^step, 1 - beta2^step
AdamWNumbers adamw_numbers(const AdamWConfig& o, float factor, int step) {
    AdamWNumbers nums = {};
    // Your code here.
    return nums;
}

// One tensor of n parameters p, its moments m and v, its gradient g:
//   g' = g * grad_scale                         (the clipping)
//   m = beta1 m + (1 - beta1) g';   v = beta2 v + (1 - beta2) g'^2
//   p -= lr * wd * p + lr * (m / bc1) / (sqrt(v / bc2) + eps)
void adamw(float* p, float* m, float* v, const float* g, size_t n, float lr, float wd, float grad_scale,
           const AdamWNumbers& nums) {
    // Your code here.
}

// The factor every gradient is multiplied by, given the global norm (over
// every parameter of the model) and the clip: as PyTorch's clip_grad_norm_,
// min(1, grad_clip / (norm + 1e-6)); grad_clip 0 turns clipping off.
float clip_scale(float norm, float grad_clip) {
    // Your code here.
    return 0;
}
