// support/study/denseformer.cuh — DenseFormer (depth-weighted averaging,
// Pagliardini et al., arXiv 2402.02622, the dense 1x1 variant; --arch
// denseformer), a peer the reviewers asked LIMe to be compared with: does
// mixing the hidden states between blocks do what mixing keys and values does?
// After every block, the next block (and the final norm) reads a learned
// average of the embedding and every block's output so far:
//   X[0] = E[token];  Y = X[0]
//   for l: X[l+1] = block_l(Y)            the LLaMa layer, both residual adds, on input Y
//          Y      = sum_{j=0..l+1} alpha[l][j] * X[j]
//   logits = rmsnorm(Y, g_final) @ E^T
// alpha[l] (l+2) is model.layers.{l}.dwa.weight, initialised one-hot on the
// block's own output (alpha[l][l+1] = 1): at initialisation DenseFormer is
// LLaMa exactly. AdamW: the routers' group. In lime.cu's activations x[l] is
// block l's input Y (x[0] the embedding), so x[l+1] holds the average; the
// blocks' outputs X[1..L] and every X's gradient are this file's (DenseActs).
// The average is support/study/mixing.cuh's op.
#pragma once
#include <string>

#include "support/model/device.cuh"
#include "support/model/lime.h"
#include "support/model/study.h"
#include "support/study/mixing.cuh"

// --- the tensors ---------------------------------------------------------------
template <class Add>
static void denseformer_specs(const Config& c, int l, const std::string& layer, Add add) {
    if (c.arch == ARCH_DENSEFORMER) add(layer + "dwa.weight", {l + 2}, GROUP_ROUTER);
}
template <class Next>
static void denseformer_carve(const Config& c, LayerParams* w, Next next) {
    w->dwa = c.arch == ARCH_DENSEFORMER ? next() : nullptr;
}
static void denseformer_init(const Params& p) {
    for (size_t l = 0; l < p.layer.size(); l++)
        for (size_t j = 0; p.layer[l].dwa && j < l + 2; j++) p.layer[l].dwa[j] = j == l + 1 ? 1.0f : 0.0f;
}

// --- the activations ---------------------------------------------------------
// DenseFormer's share of the model's activation allocation (lime.cu's Acts), sized 0 for other models.
struct DenseActs {
    float* X;   // (L, B, T, d)   the blocks' outputs X[1..L] (X[0] is lime.cu's x[0], the embedding)
    float* dX;  // (L+1, B, T, d) the gradients of X[0..L], summed over the averages that read them
};
template <class Take>
static void denseformer_acts_carve(DenseActs* a, const Config& c, int B, Take take) {
    size_t on = c.arch == ARCH_DENSEFORMER ? 1 : 0, L = c.L, d = c.d, BT = (size_t)B * c.T;
    take(&a->X, on * L * BT * d);
    take(&a->dX, on * (L + 1) * BT * d);
}
// The scratch of the average's backward (the weights' partial sums), at most L+1 terms.
static size_t denseformer_scratch_floats(const Config& c, size_t BT) {
    return c.arch == ARCH_DENSEFORMER ? mix_scratch_floats(c.L + 1, BT * c.d) : 0;
}

// --- the hooks: lime.cu's residual stream calls these after block l ----------
// Where block l writes its output X[l+1] (B, T, d), for a (B, T) batch.
static float* dense_block_output(const DenseActs& a, const Config& c, int l, int B, int T) {
    return a.X + (size_t)l * B * T * c.d;
}
// Y = x[l+1] = sum_{j <= l+1} alpha[j] X[j], X[0] = x0 (the embedding).
static void dense_average_forward(Model* model, float* Y, const DenseActs& a, int l, const float* x0,
                                  const float* alpha, int B, int T) {
    op_mix_forward(model, Y, alpha, x0, a.X, l + 2, (size_t)B * T * model->c.d);
}
// forward: Y = sum_j alpha[j] X[j]. From dY (in dx): dX[j] += alpha[j] dY and
// dalpha[j] += sum dY . X[j]; then dx = dX[l+1], complete now (only averages
// l' >= l read X[l+1]), the gradient of block l's output. The last layer's,
// the first to run, zeroes the dX first.
static void dense_average_backward(Model* model, float* dx, const DenseActs& a, int l, const float* x0,
                                   const float* alpha, float* dalpha, int B, int T, float* scratch) {
    size_t n = (size_t)B * T * model->c.d;
    if (l == model->c.L - 1) op_zero(model, a.dX, (l + 2) * n);
    op_mix_backward(model, a.dX, a.dX + n, dalpha, dx, alpha, x0, a.X, l + 2, n, scratch);
    op_copy(model, dx, a.dX + (l + 1) * n, n);
}

// --- the study-model interface (support/model/study.h) ------------------------
static DenseActs dense_acts(const StudyAt& at) { return study_acts<DenseActs>(at, denseformer_acts_carve<StudyTake>); }
// --- what DenseFormer costs (support/model/cost.cpp) ---------------------------
// FLOPs per token: the average of l+2 hidden states after block l.
static double denseformer_flops(const Config& c, int) {
    double f = 0;
    for (int l = 0; l < c.L; l++) f += 2 * (l + 2) * (double)c.d;
    return f;
}
// Floats per token, after block l (K = l+2 arrays): forward the block's output
// written to its own array (LLaMa's residual add, no more bytes) and the
// average, K d read + d written; backward K d (X) + d (dY) read, K d
// read-modify-write (dX) plus the copy 2 d, and the zero-fill once (L+1) d;
// the embedding's gradient add 3 d.
static double denseformer_floats(const Config& c, int) {
    double d = c.d, f = 0;
    for (int l = 0; l < c.L; l++) {
        double terms = l + 2;
        f += 2 * (terms + 1) * d + 2 * terms * d + 2 * d;
    }
    return f + (c.L + 1) * d + 3 * d;
}
static StudyHooks denseformer_hooks() {
    StudyHooks h = {};
    h.weights = "depth-weighted average weights";
    h.flops = denseformer_flops;
    h.floats = denseformer_floats;
    h.specs = [](const Config& c, int l, const std::string& layer, const AddTensor& add) {
        denseformer_specs(c, l, layer, add);
    };
    h.carve = [](const Config& c, int l, Params* p, const NextTensor& next) { denseformer_carve(c, &p->layer[l], next); };
    h.init = [](Model* model) { denseformer_init(model->p); };
    h.acts_floats = [](const Config& c, int B) {
        return study_acts_floats<DenseActs>(c, B, denseformer_acts_carve<StudyTake>);
    };
    h.scratch_floats = [](const Config& c, int B, Device) { return denseformer_scratch_floats(c, (size_t)B * c.T); };
    // the MLP's add goes to the block's output X[l+1]; then x[l+1] = the average
    h.residual_start = [](const StudyAt& at, float* xout) {
        return at.s % 2 ? dense_block_output(dense_acts(at), at.model->c, at.l(), at.B, at.T) : xout;
    };
    h.block_end = [](const StudyAt& at, float* Y) {
        dense_average_forward(at.model, Y, dense_acts(at), at.l(), at.lime.x,
                              pass_params(at.model).layer[at.l()].dwa, at.B, at.T);
    };
    h.block_end_backward = [](const StudyAt& at, float* dx) {  // dx becomes the block output's gradient
        dense_average_backward(at.model, dx, dense_acts(at), at.l(), at.lime.x,
                               pass_params(at.model).layer[at.l()].dwa, pass_grads(at.model).layer[at.l()].dwa, at.B,
                               at.T, at.scratch);
    };
    h.stream_begin_backward = [](const StudyAt& at, float* dx) {  // x[0] in every average
        op_add(at.model, dx, dense_acts(at).dX, (size_t)at.N() * at.model->c.d);
    };
    return h;
}
const StudyHooks DENSEFORMER_HOOKS = denseformer_hooks();
