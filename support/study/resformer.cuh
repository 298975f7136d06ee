// support/study/resformer.cuh — ResFormer (value residual learning, Zhou et
// al., arXiv 2410.17897, the learnable variant; --arch resformer), a peer the
// reviewers asked LIMe to be compared with: is LIMe's gain only the first
// layer's values reaching the deep layers? Layer l >= 1 attends with its own
// keys and a mixture of its own values and the first layer's:
//   Kr = K[l],   Vr = lam[l][0] * V[l] + lam[l][1] * V[0]        (layer 0: Vr = V[0])
// lam[l] (2) is model.layers.{l}.self_attn.value_residual.weight, for l >= 1,
// initialised to [0.5, 0.5], with the routers' AdamW group (router_lr, no
// weight decay). V[l], V[0] are the raw value projections (R, N, hd) of the KV
// buffer; the regulariser reads the raw V[l] as for every model. With
// lam = [1, 0] it is LLaMa exactly. The mixture is support/study/mixing.cuh's op.
#pragma once
#include <string>

#include "support/model/device.cuh"
#include "support/model/lime.h"
#include "support/model/study.h"
#include "support/study/mixing.cuh"

// Layer l mixes in the first layer's values.
inline bool has_value_residual(const Config& c, int l) { return c.arch == ARCH_RESFORMER && l >= 1; }

// --- the tensors ---------------------------------------------------------------
template <class Add>
static void resformer_specs(const Config& c, int l, const std::string& layer, Add add) {
    if (has_value_residual(c, l)) add(layer + "self_attn.value_residual.weight", {2}, GROUP_ROUTER);
}
template <class Next>
static void resformer_carve(const Config& c, int l, LayerParams* w, Next next) {
    w->value_residual = has_value_residual(c, l) ? next() : nullptr;
}
static void resformer_init(const Params& p) {
    for (const LayerParams& w : p.layer)
        if (w.value_residual) w.value_residual[0] = w.value_residual[1] = 0.5f;
}

// --- the hooks: the passes call these for layer l >= 1 -----------------------
// Vr (R, N, hd) = lam[0] * V + lam[1] * V0: the values layer l attends with.
static void value_residual_forward(Model* model, float* Vr, const float* V, const float* V0, const float* lam, int N) {
    op_mix_forward(model, Vr, lam, V, V0, 2, (size_t)N * model->c.R * model->c.hd);
}
// forward: Vr = lam[0] V + lam[1] V0
// dV += lam[0] dVr;  dV0 += lam[1] dVr;  dlam[k] += sum dVr . (V, V0)[k]
static void value_residual_backward(Model* model, float* dV, float* dV0, float* dlam, const float* dVr, const float* V,
                                    const float* V0, const float* lam, int N, float* scratch) {
    op_mix_backward(model, dV, dV0, dlam, dVr, lam, V, V0, 2, (size_t)N * model->c.R * model->c.hd, scratch);
}

// --- the study-model interface (support/model/study.h) ------------------------
// --- what ResFormer costs (support/model/cost.cpp), a layer l >= 1 ----------
// FLOPs per token: the values' mixture lam[0] V[l] + lam[1] V[0].
static double resformer_flops(const Config& c, int) { return (c.L - 1) * 2 * 2 * (double)c.R * c.hd; }
// Floats per token: forward the mixture reads 2 kv, writes kv (vr: 2 kv more
// than the keys' copy's 0 for values); backward zero dvr kv, read dvr, V[l],
// V[0] 3 kv, add into dV[l], dV[0] 4 kv: 3 kv + 8 kv.
static double resformer_floats(const Config& c, int) { return (c.L - 1) * 11 * (double)c.R * c.hd; }
static StudyHooks resformer_hooks() {
    StudyHooks h = {};
    h.weights = "value-residual weights";
    h.flops = resformer_flops;
    h.floats = resformer_floats;
    h.specs = [](const Config& c, int l, const std::string& layer, const AddTensor& add) {
        resformer_specs(c, l, layer, add);
    };
    h.carve = [](const Config& c, int l, Params* p, const NextTensor& next) { resformer_carve(c, l, &p->layer[l], next); };
    h.init = [](Model* model) { resformer_init(model->p); };
    h.acts_floats = [](const Config&, int) -> size_t { return 0; };
    h.scratch_floats = [](const Config& c, int B, Device dev) {
        return mix_scratch_floats(2, dev == DEVICE_GPU ? (size_t)B * c.T * c.R * c.hd : 1);
    };
    h.mixes_values = has_value_residual;
    h.values = [](const StudyAt& at, const float* V) -> const float* {  // into layer l's vr (R, N, hd)
        float* vr = at.lime.vr + (size_t)at.l() * at.N() * at.model->c.R * at.model->c.hd;
        value_residual_forward(at.model, vr, V, at.lime.Vbuf, pass_params(at.model).layer[at.l()].value_residual, at.N());
        return vr;
    };
    h.values_backward = [](const StudyAt& at, float* dV, const float* dvr) {
        const float* V = at.lime.Vbuf + (size_t)at.l() * at.N() * at.model->c.R * at.model->c.hd;
        value_residual_backward(at.model, dV, at.lime.dVbuf, pass_grads(at.model).layer[at.l()].value_residual, dvr,
                                V, at.lime.Vbuf, pass_params(at.model).layer[at.l()].value_residual, at.N(),
                                at.scratch);
    };
    return h;
}
const StudyHooks RESFORMER_HOOKS = resformer_hooks();
