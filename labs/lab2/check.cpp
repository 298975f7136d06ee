// labs/lab2/check.cpp — lab 2's checks: your router_backward, called for the
// keys and then the values as lime.cu calls it, against the backward summed
// in double (backward_with_slip without a slip) on chosen and random shapes,
// gradients that arrive already holding numbers (a backward adds to them), a
// variant's held-fixed weights, then the whole model's gradients against
// finite differences of its loss, the model running your backward, and the
// reference vectors.
#include "labs/check.h"

// The slips lab 2's hints name, each a way to compute the backward wrongly.
enum Slip { NONE, NOTHING, NO_EARLIER_LAYERS, NO_BUFFER_GRAD, DW_SET, DBUF_SET, TRANSPOSED, OVERWRITE, ALL_WEIGHTS };
static const char* hint(Slip s) {
    switch (s) {
    case NOTHING: return "nothing was added to the gradients: the function returns without writing";
    case NO_EARLIER_LAYERS:
        return "it matches a backward that gives no gradient to earlier layers' keys and values: dbuf of every "
               "source layer l' <= l gets sum_r W[r, l'*R + r'] * dout[r][e], not only layer l's";
    case NO_BUFFER_GRAD:
        return "it matches a backward that leaves dbuf alone: the router's input, every source layer's keys and "
               "values, needs its gradient too";
    case DW_SET:
        return "it matches dW written with = instead of +=: with one router the values' call overwrites the sum "
               "the keys' call left in the same dW (and what dW held before); a backward adds";
    case DBUF_SET:
        return "it matches dbuf written with = instead of +=: dKbuf and dVbuf also collect the layer's own "
               "attention's gradient and every later layer's router's; a backward adds";
    case TRANSPOSED: return "it matches the router read transposed, W[j][r] for W[r][j]: W is (R, (l+1)R)";
    case OVERWRITE:
        return "it matches gradients written with = : a backward adds (+=) to what dW and dbuf already hold";
    case ALL_WEIGHTS:
        return "it matches a gradient for every weight: the weights W[r, j] `learned.learns` leaves out are "
               "held fixed by the router variant and get none";
    default: return "";
    }
}

// router_backward with slip s for one buffer, each sum in double: added to dW
// and dbuf, or with = for +=, written into them.
static void backward_with_slip(Slip s, float* dW, float* dbuf, const float* dout, const float* W, const float* buf,
                               int l, RouterSpan learned, int N, int R, int hd) {
    int cols = (l + 1) * R;
    size_t row = (size_t)N * hd;
    bool set_dW = s == DW_SET || s == OVERWRITE, set_dbuf = s == DBUF_SET || s == OVERWRITE;
    if (s == NOTHING) return;
    for (int r = 0; r < R; r++)
        for (int j = 0; j < cols; j++) {
            if (!learned.learns(r, j, R) && s != ALL_WEIGHTS) continue;
            double sum = 0;
            for (size_t e = 0; e < row; e++) sum += (double)dout[r * row + e] * buf[j * row + e];
            int w = s == TRANSPOSED ? j * R + r : r * cols + j;
            dW[w] = set_dW ? (float)sum : dW[w] + (float)sum;
        }
    if (s == NO_BUFFER_GRAD) return;
    for (int j = 0; j < cols; j++) {
        if (s == NO_EARLIER_LAYERS && j / R < l) continue;
        for (size_t e = 0; e < row; e++) {
            double sum = 0;
            for (int r = 0; r < R; r++) {
                int w = s == TRANSPOSED ? j * R + r : r * cols + j;
                sum += (double)W[w] * dout[r * row + e];
            }
            dbuf[j * row + e] = set_dbuf ? (float)sum : dbuf[j * row + e] + (float)sum;
        }
    }
}

// The router's gradients: with one router dWv is dWk (the check copies it across).
struct Grads { std::vector<float> dWk, dWv, dKbuf, dVbuf; };

// One shape: "" or the diagnosis.
static std::string check_shape(Rng& rng, int l, int N, int R, int hd, bool shared, RouterSpan learned) {
    int cols = (l + 1) * R;
    size_t layer = (size_t)N * R * hd, nw = (size_t)R * cols;
    std::vector<float> Wk = randn(rng, nw), Wv = shared ? Wk : randn(rng, nw);
    std::vector<float> Kbuf = randn(rng, (l + 1) * layer), Vbuf = randn(rng, (l + 1) * layer);
    std::vector<float> dKr = randn(rng, layer), dVr = randn(rng, layer);
    Grads start{randn(rng, nw), randn(rng, nw), randn(rng, (l + 1) * layer), randn(rng, (l + 1) * layer)};
    if (shared) start.dWv = start.dWk;
    // The keys, then the values, as op_router_backward calls it: one router, one dW for both.
    auto both = [&](Grads g, const std::function<void(float*, float*, const float*, const float*, const float*)>& f) {
        f(g.dWk.data(), g.dKbuf.data(), dKr.data(), Wk.data(), Kbuf.data());
        f(shared ? g.dWk.data() : g.dWv.data(), g.dVbuf.data(), dVr.data(), shared ? Wk.data() : Wv.data(),
          Vbuf.data());
        if (shared) g.dWv = g.dWk;
        return g;
    };
    auto slip = [&](Slip s) {
        return both(start, [&](float* dW, float* dbuf, const float* dout, const float* W, const float* buf) {
            backward_with_slip(s, dW, dbuf, dout, W, buf, l, learned, N, R, hd);
        });
    };
    Grads got = both(start, [&](float* dW, float* dbuf, const float* dout, const float* W, const float* buf) {
        router_backward(dW, dbuf, dout, W, buf, l, learned, N, R, hd);
    });
    Grads want = slip(NONE);
    std::vector<Mistake> mistakes;
    for (Slip s : {NOTHING, NO_EARLIER_LAYERS, NO_BUFFER_GRAD, DW_SET, DBUF_SET, TRANSPOSED, OVERWRITE, ALL_WEIGHTS}) {
        Grads g = slip(s);
        mistakes.push_back({hint(s), {g.dWk, g.dWv, g.dKbuf, g.dVbuf}});
    }
    auto at_w = [R, cols](size_t x) {
        int j = (int)(x % cols);
        return strf("[r=%d, j=%d] (source layer %d, kv head %d)", (int)(x / cols), j, j / R, j % R);
    };
    auto at_buf = [N, R, hd](size_t x) {
        size_t layer = (size_t)N * R * hd, in = x % layer;
        return strf("[layer %d][r=%zu, n=%d, i=%d]", (int)(x / layer), in / ((size_t)N * hd), (int)(in / hd % N),
                   (int)(in % hd));
    };
    bool some_layers = learned.below <= l && learned.below < learned.from;
    std::string shape = strf("l=%d, N=%d, R=%d, hd=%d, %s router%s%s", l, N, R, hd,
                             shared ? "one" : "separate key and value",
                             some_layers ? ", some source layers held fixed" : "",
                             learned.same_head ? ", cross-head weights held fixed" : "");
    return diagnose({{shared ? "dW" : "dWk", got.dWk, at_w}, {"dWv", got.dWv, at_w}, {"dKbuf", got.dKbuf, at_buf},
                     {"dVbuf", got.dVbuf, at_buf}},
                    {want.dWk, want.dWv, want.dKbuf, want.dVbuf}, mistakes, shape, 2e-4);
}

int main() {
    Lab lab;
    Rng rng(2026);
    RouterSpan all{0, 0};  // every source layer learned
    // each check runs in a child (labs/check.h): it draws from its own copy of rng
    lab.check("one_source_layer", [&] { return check_shape(rng, 0, 3, 2, 4, true, all); });
    lab.check("one_router_three_layers", [&] { return check_shape(rng, 2, 4, 2, 6, true, all); });
    lab.check("separate_key_and_value_routers", [&] { return check_shape(rng, 2, 3, 2, 4, false, all); });
    lab.check("held_fixed_columns", [&] { return check_shape(rng, 3, 3, 2, 2, true, RouterSpan{1, 3}); });
    lab.check("held_fixed_cross_head_weights", [&] {
        return check_shape(rng, 2, 3, 2, 4, true, RouterSpan{0, 0, true});  // --router-heads same
    });
    lab.check("random_shapes", [&] {
        std::string err;
        for (int trial = 0; trial < 20 && err.empty(); trial++) {
            int l = (int)rng.below(5), N = 1 + (int)rng.below(5), R = 1 + (int)rng.below(4), hd = 2 + 2 * (int)rng.below(3);
            err = check_shape(rng, l, N, R, hd, rng.below(2), all);
        }
        return err;
    });
    lab.check("model_finite_differences", [] { return model_finite_differences(false); });
    lab.check("model_finite_differences_separate", [] { return model_finite_differences(true); });
    // the whole model, your function in it, against the reference vectors (docs/checkpoint.md)
    lab.check("reference_vectors", [] { return reference_vectors("tests/golden", DEVICE_CPU); });
    return lab.exit_status();
}
