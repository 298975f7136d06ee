// labs/lab2/check.cpp — lab 2's checks: your router_backward against the
// backward summed in double (backward_with_slip without a slip) on chosen and
// random shapes, gradients that arrive already holding numbers (a backward
// adds to them), a variant's held-fixed columns, then the whole model's
// gradients against finite differences of its loss, the model running your
// backward, and the reference vectors.
#include "labs/check.h"

// The slips lab 2's hints name, each a way to compute the backward wrongly.
enum Slip { NONE, NOTHING, NO_EARLIER_LAYERS, NO_BUFFER_GRAD, DW_KEYS_ONLY, DW_VALUES_ONLY, TRANSPOSED, OVERWRITE, ALL_COLUMNS };
static const char* hint(Slip s) {
    switch (s) {
    case NOTHING: return "nothing was added to the gradients: the function returns without writing";
    case NO_EARLIER_LAYERS:
        return "it matches a backward that gives no gradient to earlier layers' keys and values: dKbuf and dVbuf "
               "of every source layer l' <= l get sum_r W[r, l'*R + r'] * dKr[n, r, :], not only layer l's";
    case NO_BUFFER_GRAD:
        return "it matches a backward that leaves dKbuf and dVbuf alone: the router's inputs, every source layer's "
               "keys and values, need their gradient too";
    case DW_KEYS_ONLY:
        return "it matches dW summed over the keys only: with one router (dWk == dWv) W mixes keys and values, so "
               "dW gets both sums";
    case DW_VALUES_ONLY:
        return "it matches dW summed over the values only: with one router (dWk == dWv) W mixes keys and values, "
               "so dW gets both sums";
    case TRANSPOSED: return "it matches the router read transposed, W[j][r] for W[r][j]: W is (R, (l+1)R)";
    case OVERWRITE:
        return "it matches gradients written with = : a backward adds (+=) to what the gradients already hold";
    case ALL_COLUMNS:
        return "it matches a gradient for every column: columns of source layers `learned.has` leaves out "
               "are held fixed by the router variant and get none";
    default: return "";
    }
}

struct Grads { std::vector<float> dWk, dWv, dKbuf, dVbuf; };

// The backward with slip s, in double, on top of the gradients g already hold.
static void backward_with_slip(Slip s, Grads* g, bool shared, const float* dKr, const float* dVr, const float* Wk,
                               const float* Wv, const float* Kbuf, const float* Vbuf, int l, RouterSpan learned,
                               int N, int R, int hd) {
    int J = (l + 1) * R;
    size_t layer = (size_t)N * R * hd;
    std::vector<float>& dWv = shared ? g->dWk : g->dWv;
    if (s == NOTHING) return;
    if (s == OVERWRITE) {
        std::fill(g->dWk.begin(), g->dWk.end(), 0.0f), std::fill(dWv.begin(), dWv.end(), 0.0f);
        std::fill(g->dKbuf.begin(), g->dKbuf.end(), 0.0f), std::fill(g->dVbuf.begin(), g->dVbuf.end(), 0.0f);
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < J; j++) {
            if (!learned.has(j / R) && s != ALL_COLUMNS) continue;
            double k = 0, v = 0;
            for (int n = 0; n < N; n++)
                for (int i = 0; i < hd; i++) {
                    size_t at = ((size_t)r * N + n) * hd + i, src = (j / R) * layer + ((size_t)(j % R) * N + n) * hd + i;
                    k += (double)dKr[at] * Kbuf[src], v += (double)dVr[at] * Vbuf[src];
                }
            int w = s == TRANSPOSED ? j * R + r : r * J + j;
            if (s != DW_VALUES_ONLY || !shared) g->dWk[w] += (float)k;
            if (s != DW_KEYS_ONLY || !shared) dWv[w] += (float)v;
        }
    if (s == NO_BUFFER_GRAD) return;
    for (int n = 0; n < N; n++)
        for (int j = 0; j < J; j++) {
            if (s == NO_EARLIER_LAYERS && j / R < l) continue;
            for (int i = 0; i < hd; i++) {
                double k = 0, v = 0;
                for (int r = 0; r < R; r++) {
                    int w = s == TRANSPOSED ? j * R + r : r * J + j;
                    k += (double)Wk[w] * dKr[((size_t)r * N + n) * hd + i];
                    v += (double)Wv[w] * dVr[((size_t)r * N + n) * hd + i];
                }
                size_t src = (j / R) * layer + ((size_t)(j % R) * N + n) * hd + i;
                g->dKbuf[src] += (float)k, g->dVbuf[src] += (float)v;
            }
        }
}

// One shape: "" or the diagnosis.
static std::string check_shape(Rng& rng, int l, int N, int R, int hd, bool shared, RouterSpan learned) {
    int J = (l + 1) * R;
    size_t layer = (size_t)N * R * hd, nw = (size_t)R * J;
    std::vector<float> Wk = randn(rng, nw), Wv = shared ? Wk : randn(rng, nw);
    std::vector<float> Kbuf = randn(rng, (l + 1) * layer), Vbuf = randn(rng, (l + 1) * layer);
    std::vector<float> dKr = randn(rng, layer), dVr = randn(rng, layer);
    Grads start{randn(rng, nw), randn(rng, nw), randn(rng, (l + 1) * layer), randn(rng, (l + 1) * layer)};
    if (shared) start.dWv = start.dWk;
    Grads got = start, want = start;
    router_backward(got.dWk.data(), shared ? got.dWk.data() : got.dWv.data(), got.dKbuf.data(), got.dVbuf.data(),
                    dKr.data(), dVr.data(), Wk.data(), shared ? Wk.data() : Wv.data(), Kbuf.data(), Vbuf.data(), l,
                    learned, N, R, hd);
    backward_with_slip(NONE, &want, shared, dKr.data(), dVr.data(), Wk.data(), Wv.data(), Kbuf.data(), Vbuf.data(), l,
                       learned, N, R, hd);
    std::vector<Mistake> mistakes;
    for (Slip s : {NOTHING, NO_EARLIER_LAYERS, NO_BUFFER_GRAD, DW_KEYS_ONLY, DW_VALUES_ONLY, TRANSPOSED, OVERWRITE,
                   ALL_COLUMNS}) {
        Grads g = start;
        backward_with_slip(s, &g, shared, dKr.data(), dVr.data(), Wk.data(), Wv.data(), Kbuf.data(), Vbuf.data(), l,
                           learned, N, R, hd);
        if (shared) g.dWv = g.dWk;
        mistakes.push_back({hint(s), {g.dWk, g.dWv, g.dKbuf, g.dVbuf}});
    }
    if (shared) got.dWv = got.dWk, want.dWv = want.dWk;
    auto at_w = [R, J](size_t x) {
        int j = (int)(x % J);
        return strf("[r=%d, j=%d] (source layer %d, kv head %d)", (int)(x / J), j, j / R, j % R);
    };
    auto at_buf = [N, R, hd](size_t x) {
        size_t layer = (size_t)N * R * hd, in = x % layer;
        return strf("[layer %d][r=%zu, n=%d, i=%d]", (int)(x / layer), in / ((size_t)N * hd), (int)(in / hd % N),
                   (int)(in % hd));
    };
    std::string shape = strf("l=%d, N=%d, R=%d, hd=%d, %s router%s", l, N, R, hd, shared ? "one" : "separate key and value",
                            learned.below <= l && learned.below < learned.from ? ", some columns held fixed" : "");
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
