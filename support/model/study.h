// support/model/study.h — the study-model interface: what a model that is
// not LLaMa or LIMe (a peer) or a loss term gives lime.cu's passes. LLaMa and
// LIMe have no hooks; a study model fills the hooks it needs, each with one
// fixed signature, and leaves the others nullptr (LLaMa's behaviour there).
// Its file (support/study/X.cuh) defines the hooks and one StudyHooks table;
// its row in support/model/models.h names it (docs: support/study/README.md,
// "Adding a model").
//
// Where the hooks run, in lime.cu's forward_pass (backward_pass restates each):
//   x[0] = embed(E[tokens])                                  stream_begin
//   for l:  a = rmsnorm(norm_input(x, s = 2l))               norm_input, residual_start
//           q, k, v = (a, ak, av) @ (Wq, Wk, Wv)^T            kv_inputs (ak = av = a without it)
//           attention(q, k, values(v))                       values, loss_layer(v)
//           xa = x + o @ Wo^T                                residual_add
//           x[l+1] = xa + swiglu(rmsnorm(...)) @ Wd^T     (s = 2l+1 alike), block_end
//   logits = rmsnorm(final_input(x[L])) @ E^T                final_input
//   loss = ce + the loss term's                              loss_layer, loss
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "support/model/lime.h"

// Where a hook runs: the model, its batch (B, T), and the sublayer s (2l: the
// attention of layer l, 2l+1: its MLP). acts is the part's own activations
// (its share of the one allocation, acts_floats of them, sized for the
// model's largest batch model->B), scratch the model's (one op at a time).
// What lime.cu lends a hook (a study file compiles before lime.cu's ops and
// sees no Acts): the pass's arrays it may read or add to, and two of its ops.
struct LimeArrays {
    float* x;             // (L+1, streams, B, T, d) the residual stream entering each layer
    float* Vbuf;          // (L, R, B, T, hd) the values of every layer (the KV buffer's)
    float* vr;            // (L, R, B, T, hd) the values attention reads, where a hook mixes them
    float* dVbuf;         // (L, R, B, T, hd) their gradients
    float* dvr;           // (R, B, T, hd) the gradient of layer l's vr; as (B, T, R*hd) a loss term's scratch
    float* dnorm;         // (B, T, d) the gradient of a norm's output
    const float* valid;   // (B, T) 1 where a position holds a token of its sequence
};
struct LimeOps {
    // out (N, OC) (+)= inp (N, C) @ W^T (op_matmul_forward)
    void (*matmul_forward)(Model* model, float* out, const float* inp, const float* W, int N, int C, int OC,
                           bool accumulate);
    // forward: out = inp @ W^T. dinp (N, C) (+)= dout @ W, dW (OC, C) += dout^T @ inp; either may be
    // nullptr (op_matmul_backward)
    void (*matmul_backward)(Model* model, float* dinp, float* dW, const float* dout, const float* inp,
                            const float* W, int N, int C, int OC, bool add_dinp);
    // out (N, d) = rmsnorm(inp, g), rstd (N) its 1/rms (op_rmsnorm_forward)
    void (*rmsnorm_forward)(Model* model, float* out, float* rstd, const float* inp, const float* g, int N,
                            float* copy);
    // dinp += d rmsnorm(inp, g) from dout, dg += its gain's (op_rmsnorm_backward)
    void (*rmsnorm_backward)(Model* model, float* dinp, float* dg, const float* dout, const float* inp,
                             const float* g, const float* rstd, int N);
};
struct StudyAt {
    Model* model;
    int s, B, T;
    float* acts;
    float* scratch;
    LimeArrays lime;
    const LimeOps* ops;
    int l() const { return s / 2; }
    int N() const { return B * T; }
};

// The tensors: add(name, shape, group) appends one after layer l's LLaMa
// tensors; next() gives the next one's start in the same order (carve).
using AddTensor = std::function<void(const std::string& name, std::vector<int> shape, Group group)>;
using NextTensor = std::function<float*()>;

// The K and V projections' own inputs (N, d) and their gradients' arrays (kv_inputs).
struct KvInputs {
    const float *k, *v;
    float *dk, *dv;
};

// The norm's backward a hook may take over: dx += d rmsnorm(x, g) from dnorm; dg += its gain's.
struct NormGrad {
    float* dx;
    float* dg;
    const float *x, *g, *rstd;
};

struct StudyHooks {
    // --- required: the model's tensors, activations and scratch ---------------
    void (*specs)(const Config& c, int l, const std::string& layer, const AddTensor& add);
    void (*carve)(const Config& c, int l, Params* p, const NextTensor& next);
    void (*init)(Model* model);                               // after LLaMa's initialisation, on the host
    size_t (*acts_floats)(const Config& c, int B);            // its activations for batches of up to B
    size_t (*scratch_floats)(const Config& c, int B, Device dev);
    // --- optional: the residual stream (nullptr: LLaMa's) ---------------------
    int (*streams)(const Config& c);                          // the stream's width in copies of d (1)
    void (*stream_begin)(const StudyAt& at, float* x);        // x[0] after the embedding
    void (*stream_begin_backward)(const StudyAt& at, float* dx);  // also alone: x[0] read elsewhere too
    const float* (*norm_input)(const StudyAt& at, const float* x);  // what sublayer s's norm reads (x)
    void (*norm_input_backward)(const StudyAt& at, const NormGrad& g);
    float* (*residual_start)(const StudyAt& at, float* xout);  // where the norm copies x for the add (xout)
    void (*residual_add)(const StudyAt& at, float* xout, const float* inp, const float* W, int C);  // xout = x + inp @ W^T
    const float* (*residual_backward)(const StudyAt& at, const float* dxout);  // dy of y = inp @ W^T (dxout)
    void (*block_end)(const StudyAt& at, float* xnext);       // after layer l's two sublayers (s = 2l+1)
    void (*block_end_backward)(const StudyAt& at, float* dx);  // first in layer l's backward
    const float* (*final_input)(const StudyAt& at, float* xL);  // what the final norm reads (xL)
    float* (*final_input_backward)(const StudyAt& at, float* dx);
    // --- optional: the attention's three inputs (nullptr: q, k and v read one array) --
    // What layer l's K and V projections read, (N, d) each, and where their
    // backward writes the gradients: the model fills k and v in its norm_input
    // (s = 2l, beside the q input it returns for lime.cu's norm) and takes dk
    // and dv in norm_input_backward (they are written by then). A layer whose k
    // (or v) is nullptr reads the q input a = rmsnorm(norm_input(x)).
    KvInputs (*kv_inputs)(const StudyAt& at);
    // --- optional: the values attention reads (nullptr: V[l]) -------------------
    bool (*mixes_values)(const Config& c, int l);             // attention reads values(), not V[l]
    const float* (*values)(const StudyAt& at, const float* V);
    void (*values_backward)(const StudyAt& at, float* dV, const float* dvr);
    // --- optional: what the model is and costs (analyze, bench, compare's report) ---
    const char* weights;   // its own tensors, as analyze's parameter line names them (nullptr: "routers")
    const char* attended;  // the values attention reads, for analyze's entropy table (nullptr: W_V of the layer's input)
    double (*flops)(const Config& c, int T);   // the FLOPs per token its ops add to a forward pass (support/model/cost.cpp)
    double (*floats)(const Config& c, int T);  // the floats per token its ops move, forward and backward (cost.cpp)
    // --- optional: a loss term (the regulariser) ---------------------------------
    void (*loss_layer)(const StudyAt& at, const float* V);    // layer l's raw values V (R, N, hd)
    void (*loss_layer_backward)(const StudyAt& at, float* dV);
    void (*loss)(const StudyAt& at);                          // after the cross-entropy
};

// The checks a table passes before any model uses it (models.h's registry_check):
// "" or what is missing.
inline std::string study_hooks_check(const StudyHooks& h) {
    if (!h.specs || !h.carve || !h.init || !h.acts_floats || !h.scratch_floats)
        return "lacks a required hook (specs, carve, init, acts_floats, scratch_floats)";
    if (!h.norm_input != !h.norm_input_backward || !h.residual_add != !h.residual_backward ||
        (h.stream_begin && !h.stream_begin_backward) || !h.final_input != !h.final_input_backward ||
        !h.block_end != !h.block_end_backward || !h.values != !h.values_backward || !h.values != !h.mixes_values ||
        !h.loss_layer != !h.loss_layer_backward || (h.kv_inputs && !h.norm_input))
        return "has a forward hook without its backward (or a backward without its forward)";
    return "";
}

// take(&p, floats) over a part's region (nullptr: measures), in lime.cu's
// 64-byte steps: a study file carves its activations with it, the same walk
// when it sizes them (acts_floats) and when a hook reads them (at.acts).
struct StudyTake {  // the carves take it by value: the count lives with the caller
    float* base;
    size_t* off;
    template <class P>
    void operator()(P** p, size_t n) {
        if (base) *p = (P*)(base + *off);
        *off += (n + 15) & ~(size_t)15;
    }
};

// A part's activations (a struct A that carve(&a, c, B, take) carves, in the
// same walk both times): where they lie in its region at.acts, for the model's
// largest batch, and how many floats they take for batches of up to B (acts_floats).
template <class A, class Carve>
A study_acts(const StudyAt& at, Carve carve) {
    A a = {};
    size_t off = 0;
    carve(&a, at.model->c, at.model->B, StudyTake{at.acts, &off});
    return a;
}
template <class A, class Carve>
size_t study_acts_floats(const Config& c, int B, Carve carve) {
    A a = {};
    size_t off = 0;
    carve(&a, c, B, StudyTake{nullptr, &off});
    return off;
}
