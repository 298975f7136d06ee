// support/model/models.h — the registry of models: every model the program
// trains, one row each, in one table. --arch, compare's --archs, bench's
// --models, a checkpoint's "architecture", every help text and every error
// that lists the models read their names here (model_names); lime.cu looks a
// model's hooks up here once, when it is made. A row's Arch is its index.
// LLaMa and LIMe are lime.cu itself (no hooks); a study model is one file in
// support/study/ and one row below (support/study/README.md, "Adding a model").
#pragma once
#include <cstring>
#include <string>
#include <vector>

#include "support/model/lime.h"
#include "support/model/study.h"

struct ModelEntry {
    const char* name;         // as --arch, compare and checkpoints name it
    const char* about;        // one line, for the help texts
    const char* variants;     // compare's names of its variants ("" if none), for the help texts
    const StudyHooks* hooks;  // nullptr: LLaMa and LIMe, lime.cu's own
};
// The loss terms any model may add, as compare names them (a suffix): the regulariser.
struct LossEntry {
    const char* name;         // "ereg"
    const char* suffix;       // ":ereg=LAMBDA"
    const char* about;
    const StudyHooks* hooks;
};
// The tables themselves: support/study/registry.cuh, beside the files whose hooks they name.
std::vector<ModelEntry>& model_registry();        // in Arch order (lime.h's enum numbers the built-in rows)
const std::vector<LossEntry>& loss_registry();

// The models' names and lines, one a line, for a help text ("  hc  Hyper-Connections ...").
inline std::string models_table(const char* indent = "  ") {
    std::string s;
    for (const ModelEntry& m : model_registry()) {
        s += std::string(indent) + m.name + std::string(m.name[0] && strlen(m.name) < 12 ? 12 - strlen(m.name) : 1, ' ') +
             m.about + "\n";
        if (*m.variants) s += std::string(indent) + std::string(12, ' ') + "variants: " + m.variants + "\n";
    }
    for (const LossEntry& t : loss_registry())
        s += std::string(indent) + "any" + t.suffix + "  " + t.about + "\n";
    return s;
}
inline int model_count() { return (int)model_registry().size(); }
inline const ModelEntry& model_entry(Arch a) { return model_registry()[a]; }
// The registered names joined: "llama, lime, hc, resformer or denseformer" (last_sep " or ").
inline std::string model_names(const std::string& last_sep = " or ") {
    std::string s;
    for (int a = 0; a < model_count(); a++)
        s += (a == 0 ? "" : a + 1 == model_count() ? last_sep : ", ") + std::string(model_registry()[a].name);
    return s;
}
// One line that an unknown model name gets: "'x' is not a model; the models: llama, lime, ... (FIX)".
inline std::string unknown_model(const std::string& what, const std::string& name) {
    return what + " '" + name + "' is not a registered model; the models: " + model_names(", ") + "";
}

// The hooks of c's model, and of its loss term (nullptr where none).
inline const StudyHooks* study_hooks(const Config& c) { return model_registry()[c.arch].hooks; }
inline const StudyHooks* loss_hooks(const Config& c) {
    return c.entropy_reg > 0 ? loss_registry()[0].hooks : nullptr;
}
// "" when every row is whole (a name, a line about it, its required hooks),
// else one line naming the row and what it lacks: checked when the program starts.
inline std::string registry_check() {
    for (const ModelEntry& m : model_registry()) {
        std::string name = m.name ? m.name : "(unnamed)";
        if (!m.name || !*m.name || !m.about || !m.variants) return "model " + name + ": a row needs a name and a line";
        std::string why = m.hooks ? study_hooks_check(*m.hooks) : "";
        if (!why.empty()) return "model " + name + " " + why;
    }
    for (const LossEntry& t : loss_registry()) {
        std::string why = t.hooks ? study_hooks_check(*t.hooks) : "has no hooks";
        if (!why.empty()) return "loss term " + std::string(t.name) + " " + why;
    }
    return "";
}
// Adds a model (a test's own peer, say): its Arch, or -1 with *why when the
// name is taken or the row is not whole.
inline int register_model(const ModelEntry& m, std::string* why) {
    for (const ModelEntry& r : model_registry())
        if (m.name && std::string(m.name) == r.name) return *why = std::string("model ") + m.name + " exists", -1;
    model_registry().push_back(m);
    *why = registry_check();
    if (!why->empty()) return model_registry().pop_back(), -1;
    return model_count() - 1;
}
