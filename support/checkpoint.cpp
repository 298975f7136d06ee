// support/checkpoint.cpp — checkpoints (docs/checkpoint.md): safetensors
// files with HF LLaMa tensor names, the model's config as JSON in the
// metadata, optionally the AdamW state, and a checksum over it all.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "support/cli.h"
#include "support/lime.h"
#include "support/safetensors.h"


// A lime config also names its router variant ("router": "last-2") and whether
// keys and values share it ("router_kv": "shared" or "separate"); a config
// without them (llama, HF files, older checkpoints) reads as static and shared.
std::string config_to_json(const Config& c) {
    std::string router = c.arch != ARCH_LIME ? ""
                                             : ", \"router\": \"" + router_name(c) + "\", \"router_kv\": \"" +
                                                   (c.router_kv_separate ? "separate" : "shared") + "\"";
    char buf[640];
    snprintf(
        buf, sizeof buf,
        "{\"architecture\": \"%s\", \"head_dim\": %d, \"hidden_size\": %d, \"intermediate_size\": %d, "
        "\"max_position_embeddings\": %d, \"num_attention_heads\": %d, \"num_hidden_layers\": %d, "
        "\"num_key_value_heads\": %d, \"rms_norm_eps\": %.9g, \"rope_theta\": %.9g%s, \"tie_word_embeddings\": true, "
        "\"vocab_size\": %d}",
        arch_name(c.arch), c.hd, c.d, c.F, c.T, c.H, c.L, c.R, c.eps, c.rope_theta, router.c_str(), c.V);
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
    c->rope_theta = (float)theta;
    c->eps = (float)eps;
    const Json* arch = j.get("architecture");
    c->arch = ARCH_LLAMA;  // an HF LLaMa config has no "architecture": it is llama
    if (arch && (arch->kind != Json::STR || !arch_parse(arch->str, &c->arch)))
        return "config \"architecture\" must be \"llama\" or \"lime\"";
    const Json* router = j.get("router");
    c->router = ROUTER_STATIC;
    c->router_j = 0;
    if (router && (router->kind != Json::STR || !router_parse(router->str, c)))
        return "config \"router\" must be \"static\", \"average\", \"last-J\" or \"first-J\"";
    const Json* kv = j.get("router_kv");
    c->router_kv_separate = kv && kv->kind == Json::STR && kv->str == "separate";
    if (kv && (kv->kind != Json::STR || (kv->str != "shared" && kv->str != "separate")))
        return "config \"router_kv\" must be \"shared\" or \"separate\"";
    return config_check(*c);
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

std::string model_save(Model* model, const std::string& path, const std::map<std::string, std::string>& meta,
                       bool with_optim) {
    model_to_host(model);
    StWriter w;
    w.meta = meta;
    w.meta["config"] = config_to_json(model->c);
    auto add = [&](const std::string& name, const TensorSpec& t, const float* base) {
        std::vector<int64_t> shape(t.shape.begin(), t.shape.end());
        w.add(name, "F32", shape, base + t.offset, t.numel * sizeof(float));
    };
    for (const TensorSpec& t : model->specs) add(t.name, t, model->params);
    int32_t step = model->step;
    if (with_optim) {
        for (const TensorSpec& t : model->specs) add("optim.m." + t.name, t, model->adam_m);
        for (const TensorSpec& t : model->specs) add("optim.v." + t.name, t, model->adam_v);
        w.add("optim.step", "I32", {1}, &step, sizeof step);
    }
    w.meta["checksum"] = writer_checksum(w);  // last: it covers the other metadata
    return st_write(path, w);
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
    for (const TensorSpec& t : model->specs) {
        std::vector<int64_t> shape(t.shape.begin(), t.shape.end());
        err = st_get_f32(st, t.name, shape, model->params + t.offset);
        if (!err.empty()) return err;
        if (with_optim) {
            err = st_get_f32(st, "optim.m." + t.name, shape, model->adam_m + t.offset);
            if (err.empty()) err = st_get_f32(st, "optim.v." + t.name, shape, model->adam_v + t.offset);
            if (!err.empty()) return err + " (resuming needs a checkpoint saved during training)";
        }
    }
    if (with_optim) {
        int32_t step = 0;
        err = st_get_i32(st, "optim.step", {1}, &step);
        if (!err.empty()) return err;
        model->step = step;
    }
    model_to_device(model);
    return "";
}

