// labs/lab1/check.cpp — lab 1's checks: your router_forward against Eq. 2
// summed in double (labs/check.h) on chosen and random shapes, then the
// whole model's gradients against finite differences of its loss, the model
// running your forward, and the reference vectors.
#include "labs/check.h"

// The keys, then the values, as lime.cu's op_router_forward calls your function.
static void mine(KvPair out, KvConst W, KvConst buf, int l, int N, int R, int hd) {
    router_forward(out.k, W.k, buf.k, l, N, R, hd);
    router_forward(out.v, W.v, buf.v, l, N, R, hd);
}

int main() {
    Lab lab;
    Rng rng(2025);
    // each check runs in a child (labs/check.h): it draws from its own copy of rng
    lab.check("one_source_layer", [&] { return check_router_forward(mine, rng, 0, 3, 2, 4, false); });
    lab.check("one_kv_head", [&] { return check_router_forward(mine, rng, 2, 3, 1, 4, false); });
    lab.check("one_router_three_layers", [&] { return check_router_forward(mine, rng, 2, 4, 3, 6, false); });
    lab.check("separate_key_and_value_routers", [&] { return check_router_forward(mine, rng, 2, 3, 2, 4, true); });
    lab.check("random_shapes", [&] {
        std::string err;
        for (int trial = 0; trial < 20 && err.empty(); trial++) {
            int l = (int)rng.below(5), N = 1 + (int)rng.below(5), R = 1 + (int)rng.below(4), hd = 2 + 2 * (int)rng.below(4);
            err = check_router_forward(mine, rng, l, N, R, hd, rng.below(2));
        }
        return err;
    });
    lab.check("model_finite_differences", [] { return model_finite_differences(false); });
    lab.check("model_finite_differences_separate", [] { return model_finite_differences(true); });
    // the whole model, your function in it, against the reference vectors (docs/checkpoint.md)
    lab.check("reference_vectors", [] { return reference_vectors("tests/golden", DEVICE_CPU); });
    return lab.exit_status();
}
