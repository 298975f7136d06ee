// support/model/checkpoint.cpp — checkpoints (docs/checkpoint.md): safetensors
// files with HF LLaMa tensor names, the model's config as JSON in the
// metadata, optionally the AdamW state, and a checksum over it all.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "support/lib/cli.h"
#include "support/model/names.h"
#include "support/model/lime.h"
#include "support/lib/safetensors.h"


// A lime config also names its router variant ("router": "last-2"), whether
// keys and values share it ("router_kv": "shared" or "separate") and, only for
// the control, "router_frozen": true, and for the cross-head ablation
// "router_heads": "same"; a config without them (llama, HF files, older
// checkpoints) reads as static, shared, learned and mixing all heads. "entropy_reg": lambda
// is there only when the value-entropy regulariser is on.
std::string config_to_json(const Config& c) {
    std::string router = c.arch != ARCH_LIME ? ""
                                             : ", \"router\": \"" + router_name(c) + "\", \"router_kv\": \"" +
                                                   (c.router_kv_separate ? "separate" : "shared") + "\"" +
                                                   (c.router_frozen ? ", \"router_frozen\": true" : "") +
                                                   (c.router_same_head ? ", \"router_heads\": \"same\"" : "");
    // an hc config also has "hc_dynamic" and "hc_rate" (Hyper-Connections: the streams n)
    std::string hc = c.arch != ARCH_HC ? ""
                                       : std::string(", \"hc_dynamic\": ") + (c.hc_dynamic ? "true" : "false") +
                                             ", \"hc_rate\": " + std::to_string(c.hc_rate);
    // a muddformer config also has "mudd_ways" ("qkvr" or "kv"; written after "max_position_embeddings" in key order)
    std::string mudd = c.arch != ARCH_MUDDFORMER ? "" : c.mudd_ways == MUDD_KV ? ", \"mudd_ways\": \"kv\"" : ", \"mudd_ways\": \"qkvr\"";
    // the value-entropy regulariser's lambda, only when it is on
    if (c.entropy_reg != 0) router += ", \"entropy_reg\": " + fmt("%.9g", (double)c.entropy_reg);
    char buf[640];
    snprintf(
        buf, sizeof buf,
        "{\"architecture\": \"%s\"%s, \"head_dim\": %d, \"hidden_size\": %d, \"intermediate_size\": %d, "
        "\"max_position_embeddings\": %d%s, \"num_attention_heads\": %d, \"num_hidden_layers\": %d, "
        "\"num_key_value_heads\": %d, \"rms_norm_eps\": %.9g, \"rope_theta\": %.9g%s, \"tie_word_embeddings\": true, "
        "\"vocab_size\": %d}",
        arch_name(c.arch), hc.c_str(), c.hd, c.d, c.F, c.T, mudd.c_str(), c.H, c.L, c.R, c.eps, c.rope_theta,
        router.c_str(), c.V);
    return buf;
}

std::string config_from_json(const std::string& text, Config* c) {
    Json j;
    std::string err = json_parse(text, &j);
    if (!err.empty()) return "config is not valid JSON: " + err;
    if (j.kind != Json::OBJ) return "config is not a JSON object";
    auto num = [&](const char* key, double* out) -> std::string {
        const Json* v = j.get(key);
        if (!v || v->kind != Json::NUM) return std::string("config lacks the number \"") + key + "\"";
        *out = v->num;
        return "";
    };
    struct { const char* key; int* dst;
    } ints[] = {{"vocab_size", &c->V},          {"num_hidden_layers", &c->L},      {"hidden_size", &c->d},
                {"num_attention_heads", &c->H}, {"num_key_value_heads", &c->R},    {"head_dim", &c->hd},
                {"intermediate_size", &c->F},   {"max_position_embeddings", &c->T}};
    for (auto& f : ints) {
        double v = 0;
        err = num(f.key, &v);
        if (!err.empty()) return err;
        if (v != std::floor(v) || v < 0 || v > 1e8)
            return std::string("config \"") + f.key + "\" is not a sensible integer";
        *f.dst = (int)v;
    }
    double theta = 10000, eps = 1e-6;
    if (j.get("rope_theta")) { err = num("rope_theta", &theta); if (!err.empty()) return err; }
    if (j.get("rms_norm_eps")) { err = num("rms_norm_eps", &eps); if (!err.empty()) return err; }
    // stored as floats: a value past float range (1e39 becomes Inf) or out of
    // any sensible range is refused here, not carried into every norm and rotation
    if (!(eps > 0 && eps <= 1 && (float)eps > 0)) return "config \"rms_norm_eps\" " + fmt("%g", eps) + " is not in (0, 1]";
    if (!(theta >= 1 && theta <= 1e12)) return "config \"rope_theta\" " + fmt("%g", theta) + " is not in 1 .. 1e12";
    c->rope_theta = (float)theta;
    c->eps = (float)eps;
    const Json* arch = j.get("architecture");
    c->arch = ARCH_LLAMA;  // an HF LLaMa config has no "architecture": it is llama
    if (arch && (arch->kind != Json::STR || !arch_parse(arch->str, &c->arch)))
        return "config \"architecture\" must name a registered model: " + model_names();
    const Json* router = j.get("router");
    c->router = ROUTER_STATIC;
    c->router_j = 0;
    if (router && (router->kind != Json::STR || !router_parse(router->str, c)))
        return "config \"router\" must be \"static\", \"average\", \"last-J\" or \"first-J\"";
    const Json* kv = j.get("router_kv");
    c->router_kv_separate = kv && kv->kind == Json::STR && kv->str == "separate";
    if (kv && (kv->kind != Json::STR || (kv->str != "shared" && kv->str != "separate")))
        return "config \"router_kv\" must be \"shared\" or \"separate\"";
    const Json* frozen = j.get("router_frozen");
    if (frozen && frozen->kind != Json::BOOL) return "config \"router_frozen\" must be true or false";
    c->router_frozen = frozen && frozen->b;
    const Json* heads = j.get("router_heads");
    if (heads && (heads->kind != Json::STR || (heads->str != "all" && heads->str != "same")))
        return "config \"router_heads\" must be \"all\" or \"same\"";
    c->router_same_head = heads && heads->str == "same";
    // Hyper-Connections: "hc_rate" (default 4) and "hc_dynamic" (default true), only in an hc config
    const Json *rate = j.get("hc_rate"), *dynamic = j.get("hc_dynamic");
    if ((rate || dynamic) && c->arch != ARCH_HC)
        return "config has \"hc_rate\" or \"hc_dynamic\" but its \"architecture\" is not \"hc\"";
    c->hc_rate = 4;
    if (rate && (rate->kind != Json::NUM || rate->num != std::floor(rate->num) || rate->num < 1 || rate->num > 16))
        return "config \"hc_rate\" must be an integer 1 .. 16 (the number of residual streams)";
    if (rate) c->hc_rate = (int)rate->num;
    if (dynamic && dynamic->kind != Json::BOOL) return "config \"hc_dynamic\" must be true or false";
    c->hc_dynamic = !dynamic || dynamic->b;
    // MUDDFormer: "mudd_ways" ("qkvr", the default, or "kv"), only in a muddformer config
    const Json* ways = j.get("mudd_ways");
    if (ways && c->arch != ARCH_MUDDFORMER)
        return "config has \"mudd_ways\" but its \"architecture\" is not \"muddformer\"";
    if (ways && (ways->kind != Json::STR || (ways->str != "qkvr" && ways->str != "kv")))
        return "config \"mudd_ways\" must be \"qkvr\" or \"kv\"";
    c->mudd_ways = ways && ways->str == "kv" ? MUDD_KV : MUDD_QKVR;
    double reg = 0;
    if (j.get("entropy_reg")) { err = num("entropy_reg", &reg); if (!err.empty()) return err; }
    if (!entropy_reg_check(reg).empty()) return "config \"entropy_reg\" " + entropy_reg_check(reg);
    c->entropy_reg = (float)reg;
    return config_check_file(*c);
}

std::string config_diff(const Config& a, const Config& b) {
    // the fields of config_to_json, compared as they are written there
    auto fields = [](const Config& c) {
        Json j;
        json_parse(config_to_json(c), &j);
        return j.obj;
    };
    std::vector<std::pair<std::string, Json>> fa = fields(a), fb = fields(b);
    std::string out;
    for (const auto& [key, value] : fa) {  // by key: only lime configs have "router"
        std::string va = json_dump(value), vb = "none";
        for (const auto& kv : fb) if (kv.first == key) vb = json_dump(kv.second);
        if (va != vb) out += (out.empty() ? "" : ", ") + key + " " + va + " vs " + vb;
    }
    for (const auto& [key, value] : fb) {  // keys only b has ("router_frozen")
        bool in_a = false;
        for (const auto& kv : fa) in_a |= kv.first == key;
        if (!in_a) out += (out.empty() ? "" : ", ") + key + " none vs " + json_dump(value);
    }
    return out;
}

// --- the checksum ------------------------------------------------------------
// model_save stores "checksum": "fnv1a64:" + 16 hex digits in the metadata:
// FNV-1a 64 (st_checksum) of a listing that names, in name order, every
// tensor with its dtype, its shape and the st_checksum of its bytes, then
// every other metadata entry. A flipped bit in the data or the metadata
// changes it; damage to the header's layout is st_parse's to find. Loading
// checks it when it is there (reference vectors and HF files have none).
struct ChecksumItem {
    std::string name, dtype;
    std::vector<int64_t> shape;
    const void* data;
    size_t bytes;
};

static std::string checksum_of(std::vector<ChecksumItem> items, const std::map<std::string, std::string>& meta) {
    std::sort(items.begin(), items.end(), [](const ChecksumItem& a, const ChecksumItem& b) { return a.name < b.name; });
    std::string listing;
    char hex[17];
    for (const ChecksumItem& t : items) {
        listing += t.name + '\0' + t.dtype + '\0';
        for (int64_t n : t.shape) listing += std::to_string(n) + ',';
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)st_checksum(t.data, t.bytes));
        listing += std::string(hex) + '\n';
    }
    for (const auto& kv : meta)
        if (kv.first != "checksum") listing += kv.first + '\0' + kv.second + '\n';
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)st_checksum(listing.data(), listing.size()));
    return std::string("fnv1a64:") + hex;
}

static std::string writer_checksum(const StWriter& w) {
    std::vector<ChecksumItem> items;
    for (const StWriter::Entry& e : w.entries) items.push_back({e.name, e.dtype, e.shape, e.data, e.bytes});
    return checksum_of(items, w.meta);
}

// "" when the file has no checksum or it matches, else the error.
static std::string checksum_verify(const SafeTensors& st, const std::string& path) {
    auto it = st.meta.find("checksum");
    if (it == st.meta.end()) return "";
    std::vector<ChecksumItem> items;
    for (const StTensor& t : st.tensors)
        items.push_back({t.name, t.dtype, t.shape, st.data.data() + t.begin, (size_t)(t.end - t.begin)});
    std::string got = checksum_of(items, st.meta);
    if (got == it->second) return "";
    return path + ": the checksum does not match (stored " + it->second + ", the contents give " + got +
           "): the file is corrupt; use an earlier checkpoint or train again";
}

// Fault injection for tests/test_faults.sh, compiled only into testing builds
// (LIME_TESTING: ./lime-emu, build/lime-asan; never ./lime): a hostile file
// with a valid checksum, as anyone can make one (the checksum guards against
// damage, not against intent). LIME_TEST_SAVE_META="key=value;key=value"
// replaces those metadata entries; LIME_TEST_SAVE_NAN=NAME writes a NaN as the
// first value of tensor NAME. Unset, or in ./lime: nothing.
static void test_spoil_save(StWriter* w, std::vector<float>* copy) {
#ifdef LIME_TESTING
    if (const char* spec = getenv("LIME_TEST_SAVE_META")) {
        std::string all = spec;
        for (size_t start = 0; start < all.size();) {
            size_t end = all.find(';', start);
            if (end == std::string::npos) end = all.size();
            std::string kv = all.substr(start, end - start);
            size_t eq = kv.find('=');
            if (eq != std::string::npos) w->meta[kv.substr(0, eq)] = kv.substr(eq + 1);
            start = end + 1;
        }
    }
    if (const char* name = getenv("LIME_TEST_SAVE_NAN"))
        for (StWriter::Entry& e : w->entries)
            if (e.name == name && e.dtype == "F32" && e.bytes >= sizeof(float)) {
                copy->assign((const float*)e.data, (const float*)e.data + e.bytes / sizeof(float));
                (*copy)[0] = NAN;
                e.data = copy->data();
            }
#else
    (void)w;
    (void)copy;
#endif
}

// The writer model_save fills: the tensors (with_optim: and the AdamW state)
// and the metadata with the config; the checksum is added by model_save.
static void model_writer(const Model* model, const std::map<std::string, std::string>& meta, bool with_optim,
                         const int32_t* step, StWriter* w) {
    w->meta = meta;
    w->meta["config"] = config_to_json(model->c);
    auto add = [&](const std::string& name, const TensorSpec& t, const float* base) {
        std::vector<int64_t> shape(t.shape.begin(), t.shape.end());
        w->add(name, "F32", shape, base + t.offset, t.numel * sizeof(float));
    };
    for (const TensorSpec& t : model->specs) add(t.name, t, model->params);
    if (with_optim) {
        for (const TensorSpec& t : model->specs) add("optim.m." + t.name, t, model->adam_m);
        for (const TensorSpec& t : model->specs) add("optim.v." + t.name, t, model->adam_v);
        w->add("optim.step", "I32", {1}, step, sizeof *step);
    }
}

std::string model_save(Model* model, const std::string& path, const std::map<std::string, std::string>& meta,
                       bool with_optim) {
    model_to_host(model);
    StWriter w;
    int32_t step = model->step;
    model_writer(model, meta, with_optim, &step, &w);
    std::vector<float> nan_copy;  // LIME_TEST_SAVE_NAN's copy of the tensor it spoils
    test_spoil_save(&w, &nan_copy);
    w.meta["checksum"] = writer_checksum(w);  // last: it covers the other metadata
    return st_write(path, w);
}

std::string model_save_check(const Model* model, const std::string& path,
                             const std::map<std::string, std::string>& meta, bool with_optim) {
    StWriter w;
    int32_t step = 0;
    model_writer(model, meta, with_optim, &step, &w);
    w.meta["checksum"] = "fnv1a64:0000000000000000";  // its length: the header's size is checked too
    return st_write_check(path, w);
}

std::string checkpoint_read_config(const std::string& path, Config* c, std::map<std::string, std::string>* meta) {
    SafeTensors st;
    std::string err = st_read(path, &st);
    if (err.empty()) err = checksum_verify(st, path);
    if (!err.empty()) return err;
    auto it = st.meta.find("config");
    if (it == st.meta.end()) return path + ": no \"config\" in the metadata; is this a lime.cu or HF LLaMa checkpoint?";
    err = config_from_json(it->second, c);
    if (!err.empty()) return path + ": " + err;
    if (meta) *meta = st.meta;
    return "";
}

static bool meta_count(const std::string& s, long long hi, long long* out);

std::string model_load(Model* model, const std::string& path, bool with_optim) {
    SafeTensors st;
    std::string err = st_read(path, &st);
    if (err.empty()) err = checksum_verify(st, path);
    if (!err.empty()) return err;
    Config fc;
    auto it = st.meta.find("config");
    if (it == st.meta.end()) return path + ": no \"config\" in the metadata";
    err = config_from_json(it->second, &fc);
    if (!err.empty()) return path + ": " + err;
    if (config_to_json(fc) != config_to_json(model->c))
        return path + ": holds a different model than expected (" + config_diff(fc, model->c) +
               ", in the file vs expected)";
    // a NaN or an Inf would only turn every loss and logit into NaN: refused, named
    auto finite = [&](const std::string& name, const float* x, size_t n) -> std::string {
        for (size_t i = 0; i < n; i++)
            if (!std::isfinite(x[i]))
                return path + ": " + name + " holds a NaN or an Inf: the model is unusable; use an earlier "
                       "checkpoint or train again";
        return "";
    };
    // a model tensor the config's architecture has not (a resformer's value_residual under a llama
    // config, say): the file's tensors and its config disagree
    std::set<std::string> names;
    for (const TensorSpec& t : model->specs) names.insert(t.name);
    for (const StTensor& t : st.tensors)
        if (t.name.rfind("model.", 0) == 0 && !names.count(t.name))
            return path + ": holds " + t.name + ", which a " + model_name(fc) +
                   " has not: its tensors belong to another model than its config says; use a checkpoint that "
                   "./lime train wrote";
    for (const TensorSpec& t : model->specs) {
        std::vector<int64_t> shape(t.shape.begin(), t.shape.end());
        err = st_get_f32(st, t.name, shape, model->params + t.offset);
        if (!err.empty() && t.name.find(".hc_") != std::string::npos)  // Hyper-Connections: the config sets the shapes
            err += strf("; its config says hc_rate %d, hc_dynamic %s, and its hc tensors must have those shapes: use "
                        "a checkpoint that ./lime train wrote",
                        fc.hc_rate, fc.hc_dynamic ? "true" : "false");
        if (!err.empty() && t.name.find(".mudd.") != std::string::npos)  // MUDDFormer: the ways and the layer set them
            err += strf("; its config says mudd_ways %s (after block l: %s ways of l+2 sources, %s x (l+2) hidden "
                        "units), and its mudd tensors must have those shapes: use a checkpoint that ./lime train wrote",
                        fc.mudd_ways == MUDD_KV ? "kv" : "qkvr", fc.mudd_ways == MUDD_KV ? "2" : "4 (the last: 1)",
                        fc.mudd_ways == MUDD_KV ? "2" : "4");
        if (err.empty()) err = finite(t.name, model->params + t.offset, t.numel);
        if (!err.empty()) return err;
        if (with_optim) {
            err = st_get_f32(st, "optim.m." + t.name, shape, model->adam_m + t.offset);
            if (err.empty()) err = st_get_f32(st, "optim.v." + t.name, shape, model->adam_v + t.offset);
            if (!err.empty()) return err + " (resuming needs a checkpoint saved during training)";
            err = finite("optim.m." + t.name, model->adam_m + t.offset, t.numel);
            if (err.empty()) err = finite("optim.v." + t.name, model->adam_v + t.offset, t.numel);
            if (!err.empty()) return err;
        }
    }
    // the router variants' fixed entries (same-head, last-J, first-J, average, frozen): as model_init set them
    // (a frozen router's: the random draws of the run's seed, which train stores in "args")
    uint64_t seed = 0;
    Json args;
    auto a = st.meta.find("args");
    const Json* s = a != st.meta.end() && json_parse(a->second, &args).empty() ? args.get("seed") : nullptr;
    long long v = 0;
    bool seed_known = s && s->kind == Json::STR && meta_count(s->str, (long long)1 << 62, &v);
    seed = (uint64_t)v;
    err = router_fixed_check(fc, model->specs, model->params, seed_known ? &seed : nullptr);
    if (!err.empty()) return path + ": " + err;
    if (with_optim) {
        int32_t step = 0;
        err = st_get_i32(st, "optim.step", {1}, &step);
        if (!err.empty()) return err;
        if (step < 0 || step > MAX_STEPS)
            return path + ": optim.step " + std::to_string(step) + " is not a step count in 0 .. " +
                   std::to_string(MAX_STEPS) + ": the file was altered; use an earlier checkpoint or train again";
        model->step = step;
    }
    model_to_device(model);
    return "";
}


// --- the metadata train writes -------------------------------------------------

// A non-negative integer written as plain digits, at most hi; else false.
static bool meta_count(const std::string& s, long long hi, long long* out) {
    if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos) return false;
    long long v = std::stoll(s);
    if (v > hi) return false;
    *out = v;
    return true;
}

// A JSON object of strings ("task", "args"), as settings_to_json writes it.
static bool meta_settings(const std::string& text, std::map<std::string, std::string>* out) {
    Json j;
    if (!json_parse(text, &j).empty() || j.kind != Json::OBJ) return false;
    for (const auto& kv : j.obj) {
        if (kv.second.kind != Json::STR) return false;
        (*out)[kv.first] = kv.second.str;
    }
    return true;
}

std::string checkpoint_check_meta(const std::string& path, const Config& c,
                                  const std::map<std::string, std::string>& meta, TrainMeta* out) {
    const std::string altered = ": the file was altered or damaged; use an earlier checkpoint or train again";
    if (!meta.count("checksum"))
        return path + ": no \"checksum\" in the metadata, which ./lime train writes into every checkpoint: the file "
                      "was not written by it or was altered; use a model.safetensors or checkpoint.safetensors that "
                      "./lime train wrote (reference vectors are for ./lime verify)";
    for (const char* key : {"train_step", "data_epoch", "data_pos", "task", "vocab", "args"})
        if (!meta.count(key))
            return path + ": no \"" + key + "\" in the metadata, which ./lime train writes into every checkpoint" +
                   altered;
    TrainMeta m;
    if (!meta_settings(meta.at("args"), &m.args)) return path + ": metadata \"args\" is not a JSON object of strings" + altered;
    long long v = 0;
    if (!m.args.count("steps") || !meta_count(m.args["steps"], MAX_STEPS, &v) || v < 1)
        return path + ": metadata \"args\" has no \"steps\" in 1 .. " + std::to_string(MAX_STEPS) + altered;
    m.steps = (int)v;
    if (!meta_count(meta.at("train_step"), m.steps, &v))
        return path + ": metadata \"train_step\" is not an integer in 0 .. " + std::to_string(m.steps) +
               " (the run's steps)" + altered;
    m.train_step = (int)v;
    if (!meta_count(meta.at("data_epoch"), MAX_STEPS, &v))
        return path + ": metadata \"data_epoch\" is not an integer in 0 .. " + std::to_string(MAX_STEPS) + altered;
    m.data_epoch = (int)v;
    if (!meta_count(meta.at("data_pos"), (long long)1 << 40, &m.data_pos))
        return path + ": metadata \"data_pos\" is not a non-negative integer" + altered;
    if (!meta_settings(meta.at("task"), &m.task)) return path + ": metadata \"task\" is not a JSON object of strings" + altered;
    const std::string kind = m.task.count("task") ? m.task["task"] : "";
    if (kind != "arith" && kind != "prosqa" && kind != "text")
        return path + ": metadata \"task\" names no task arith, prosqa or text" + altered;
    Json vocab;
    if (!json_parse(meta.at("vocab"), &vocab).empty() || vocab.kind != Json::ARR)
        return path + ": metadata \"vocab\" is not a JSON list" + altered;
    for (const Json& t : vocab.arr) {
        if (t.kind != Json::STR) return path + ": metadata \"vocab\" holds a token that is not a string" + altered;
        m.vocab.push_back(t.str);
    }
    if ((int)m.vocab.size() != c.V)
        return path + ": metadata \"vocab\" has " + std::to_string(m.vocab.size()) + " tokens but the model's " +
               "vocab_size is " + std::to_string(c.V) + altered;
    if (out) *out = m;
    return "";
}
