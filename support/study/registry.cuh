// support/study/registry.cuh — the registry's table (support/model/models.h):
// one row per model, beside the include of the file that defines its hooks.
// lime.cu includes this once, at its top: the hooks need none of its ops (what they
// use of lime.cu, StudyAt lends them: support/model/study.h).
// A new model: its file's include and its row (support/study/README.md, "Adding a model").
#pragma once
#include "support/model/models.h"
#include "support/study/dca.cuh"                // defines: DCA_HOOKS (--arch dca)
#include "support/study/denseformer.cuh"        // defines: DENSEFORMER_HOOKS (--arch denseformer)
#include "support/study/entropy_reg.cuh"        // defines: EREG_HOOKS (--entropy-reg, a loss term)
#include "support/study/hyper_connections.cuh"  // defines: HC_HOOKS (--arch hc)
#include "support/study/muddformer.cuh"         // defines: MUDDFORMER_HOOKS (--arch muddformer)
#include "support/study/resformer.cuh"          // defines: RESFORMER_HOOKS (--arch resformer)

// The models, in Arch order (lime.h's enum numbers these rows).
std::vector<ModelEntry>& model_registry() {
    static std::vector<ModelEntry> rows = {
        {"llama", "LLaMa, the baseline: LIMe without routers", "", nullptr},
        {"lime", "LIMe: each layer attends with a learned mixture of every earlier layer's keys and values",
         "lime:average, lime:last-J, lime:first-J, lime:frozen, lime:same-head, lime:separate", nullptr},
        {"hc", "Hyper-Connections, the paper's other baseline: n residual streams mixed by small learned weights",
         "hc:nN (N streams, 1 .. 16; 4 by default), hc:static", &HC_HOOKS},
        {"resformer", "ResFormer (value residual): each layer's values mixed with the first layer's", "",
         &RESFORMER_HOOKS},
        {"denseformer", "DenseFormer: each block reads a learned average of every earlier block's output", "",
         &DENSEFORMER_HOOKS},
        {"muddformer",
         "MUDDFormer: each block's queries, keys, values and residual read their own per-token mixture of every "
         "earlier state",
         "muddformer:kv (only the keys' and values' inputs mixed; --mudd-ways kv)", &MUDDFORMER_HOOKS},
        {"dca", "DeepCrossAttention: each block's queries, keys and values read their own mixtures of every earlier "
         "block's output", "", &DCA_HOOKS},
    };
    return rows;
}
// The loss terms any model may add.
const std::vector<LossEntry>& loss_registry() {
    static const std::vector<LossEntry> rows = {
        {"ereg", ":ereg=LAMBDA", "the value-entropy regulariser (--entropy-reg LAMBDA)", &EREG_HOOKS},
    };
    return rows;
}
