// tests/test_checkpoint.cpp — checkpoints that survive: model_save's
// checksum, its check on load (a flipped bit in the data or the metadata is
// refused; a file without a checksum still loads, for verify), NaN or Inf
// weights refused at load, train's metadata checked field by field
// (checkpoint_check_meta, the checksum required there), and the training
// guards' model_first_nonfinite. The public API only (lime.h, safetensors.h).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "support/model/lime.h"
#include "support/lib/safetensors.h"
#include "support/model/names.h"  // model_name
#include "test.h"
#include "test_helpers.h"  // tiny_config, FreeOnReturn

namespace {

// A scratch file name, removed with its .tmp by the destructor.
struct TmpFile {
    std::string path;
    TmpFile() {
        char tmpl[] = "/tmp/lime_ckpt_test_XXXXXX";
        int fd = mkstemp(tmpl);
        if (fd >= 0) close(fd);
        path = tmpl;
    }
    ~TmpFile() { remove(path.c_str()); remove((path + ".tmp").c_str()); }
};

std::vector<char> read_all(const std::string& path) {
    std::vector<char> bytes;
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) return bytes;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) bytes.insert(bytes.end(), buf, buf + n);
    fclose(f);
    return bytes;
}

void write_all(const std::string& path, const std::vector<char>& bytes) {
    FILE* f = fopen(path.c_str(), "wb");
    if (!f) return;
    fwrite(bytes.data(), 1, bytes.size(), f);
    fclose(f);
}

// A saved tiny model: model (initialised, with some optimiser state) and its file.
struct Saved {
    Model model;
    TmpFile file;
    std::string err;
    Saved() {
        err = model_create(&model, tiny_config(ARCH_LIME, 2, 1), 2, DEVICE_CPU);
        if (!err.empty()) return;
        model_init(&model, 7);
        for (size_t i = 0; i < model.n_params; i++) { model.adam_m[i] = 0.01f * (float)i; model.adam_v[i] = 0.001f; }
        model.step = 3;
        err = model_save(&model, file.path, {{"data_pos", "12"}}, true);
    }
    ~Saved() { model_free(&model); }
};

}  // namespace

TEST(checkpoint_has_checksum_and_loads) {
    Saved s;
    CHECK(s.err.empty(), "save: %s", s.err.c_str());
    SafeTensors st;
    std::string err = st_read(s.file.path, &st);
    CHECK(err.empty(), "st_read: %s", err.c_str());
    auto it = st.meta.find("checksum");
    CHECK(it != st.meta.end(), "no \"checksum\" in the metadata");
    CHECK(it->second.rfind("fnv1a64:", 0) == 0, "checksum \"%s\" does not begin fnv1a64:", it->second.c_str());
    CHECK(it->second.size() == 8 + 16, "checksum \"%s\" is not fnv1a64: and 16 hex digits", it->second.c_str());
    Model m2;
    FreeOnReturn guard{&m2};
    CHECK(model_create(&m2, tiny_config(ARCH_LIME, 2, 1), 2, DEVICE_CPU).empty(), "model_create");
    err = model_load(&m2, s.file.path, true);
    CHECK(err.empty(), "model_load: %s", err.c_str());
    CHECK(m2.step == 3, "step %d after loading, want the saved 3", m2.step);
    size_t n = m2.n_params;
    CHECK(std::equal(m2.params, m2.params + n, s.model.params), "the loaded weights differ from the saved ones");
    CHECK(std::equal(m2.adam_m, m2.adam_m + n, s.model.adam_m), "the loaded AdamW first moment differs from the saved one");
    CHECK(std::equal(m2.adam_v, m2.adam_v + n, s.model.adam_v), "the loaded AdamW second moment differs from the saved one");
}

TEST(checkpoint_flipped_data_bit_refused) {
    Saved s;
    CHECK(s.err.empty(), "save: %s", s.err.c_str());
    std::vector<char> bytes = read_all(s.file.path);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)(unsigned char)bytes[i] << (8 * i);
    // one bit in the first weight, in the middle of the data, in the last byte
    for (size_t off : {(size_t)(8 + hlen), (size_t)(8 + hlen + (bytes.size() - 8 - hlen) / 2), bytes.size() - 1}) {
        std::vector<char> bad = bytes;
        bad[off] ^= 0x10;
        write_all(s.file.path, bad);
        Config c;
        std::string err = checkpoint_read_config(s.file.path, &c, nullptr);
        for (const char* part : {"checksum does not match", "corrupt"})
            CHECK(contains(err, part), "byte %zu flipped: checkpoint_read_config's error lacks '%s': '%s'", off, part, err.c_str());
        Model m2;
        CHECK(model_create(&m2, tiny_config(ARCH_LIME, 2, 1), 2, DEVICE_CPU).empty(), "model_create");
        err = model_load(&m2, s.file.path, false);
        model_free(&m2);
        CHECK(contains(err, "checksum does not match"), "byte %zu flipped: model_load says '%s'", off, err.c_str());
    }
}

// The checksum covers the metadata too: the same file with "data_pos" changed
// (a valid header, the old checksum) is refused.
TEST(checkpoint_changed_metadata_refused) {
    Saved s;
    CHECK(s.err.empty(), "save: %s", s.err.c_str());
    std::vector<char> bytes = read_all(s.file.path);
    std::string text(bytes.begin(), bytes.end());
    size_t at = text.find("\"data_pos\":\"12\"");
    CHECK(at != std::string::npos, "no data_pos in the header");
    bytes[at + 13] = '3';  // "12" -> "13"
    write_all(s.file.path, bytes);
    Config c;
    std::string err = checkpoint_read_config(s.file.path, &c, nullptr);
    CHECK(contains(err, "checksum does not match"), "metadata changed: '%s'", err.c_str());
}

// Reference vectors and HF checkpoints carry no checksum: they load as before.
TEST(checkpoint_without_checksum_loads) {
    Saved s;
    CHECK(s.err.empty(), "save: %s", s.err.c_str());
    StWriter w;
    w.meta["config"] = config_to_json(s.model.c);
    for (const TensorSpec& t : s.model.specs)
        w.add(t.name, "F32", std::vector<int64_t>(t.shape.begin(), t.shape.end()), s.model.params + t.offset,
              t.numel * sizeof(float));
    TmpFile plain;
    std::string err = st_write(plain.path, w);
    CHECK(err.empty(), "st_write: %s", err.c_str());
    Model m2;
    CHECK(model_create(&m2, tiny_config(ARCH_LIME, 2, 1), 2, DEVICE_CPU).empty(), "model_create");
    err = model_load(&m2, plain.path, false);
    model_free(&m2);
    CHECK(err.empty(), "a file without a checksum is refused: %s", err.c_str());
}

TEST(first_nonfinite_names_the_tensor) {
    Model model;
    CHECK(model_create(&model, tiny_config(ARCH_LIME, 2, 1), 2, DEVICE_CPU).empty(), "model_create");
    model_init(&model, 1);
    std::string clean_grads = model_first_nonfinite(&model, false);
    std::string clean_params = model_first_nonfinite(&model, true);
    const TensorSpec& t = model.specs[3];
    model.grads[t.offset + t.numel - 1] = NAN;
    std::string grads = model_first_nonfinite(&model, false);
    model.params[t.offset] = -INFINITY;
    std::string params = model_first_nonfinite(&model, true);
    std::string name = t.name;
    model_free(&model);
    CHECK(clean_grads.empty(), "a fresh model reports a non-finite gradient in '%s'", clean_grads.c_str());
    CHECK(clean_params.empty(), "a fresh model reports a non-finite weight in '%s'", clean_params.c_str());
    CHECK(grads == name, "a NaN gradient in %s reported as '%s'", name.c_str(), grads.c_str());
    CHECK(params == name, "an -Inf weight in %s reported as '%s'", name.c_str(), params.c_str());
}

// A weight or an optimiser moment that is NaN or Inf is refused at load,
// the tensor named (eval would otherwise print "test loss nan").
TEST(nonfinite_weights_refused_at_load) {
    Saved s;
    CHECK(s.err.empty(), "save: %s", s.err.c_str());
    const TensorSpec& t = s.model.specs[2];
    s.model.params[t.offset + 1] = NAN;
    TmpFile bad;
    std::string err = model_save(&s.model, bad.path, {}, true);
    CHECK(err.empty(), "save: %s", err.c_str());
    Model m2;
    FreeOnReturn guard{&m2};
    CHECK(model_create(&m2, tiny_config(ARCH_LIME, 2, 1), 2, DEVICE_CPU).empty(), "model_create");
    err = model_load(&m2, bad.path, false);
    CHECK(contains(err, t.name), "a NaN in %s: model_load's error does not name it: '%s'", t.name.c_str(), err.c_str());
    CHECK(contains(err, "NaN or an Inf"), "a NaN in %s: model_load's error lacks 'NaN or an Inf': '%s'", t.name.c_str(),
          err.c_str());
    s.model.params[t.offset + 1] = 0.5f;
    s.model.adam_v[t.offset] = INFINITY;
    CHECK(model_save(&s.model, bad.path, {}, true).empty(), "save");
    err = model_load(&m2, bad.path, true);
    CHECK(contains(err, "optim.v." + t.name), "an Inf in the optimiser state: model_load says '%s'", err.c_str());
}

// checkpoint_check_meta: train's metadata, every field checked, the checksum
// required; a good set passes and is parsed.
TEST(checkpoint_meta_checked) {
    Config c = tiny_config(ARCH_LIME, 2, 1);
    std::string vocab = "[";
    for (int i = 0; i < c.V; i++) vocab += std::string(i ? ", " : "") + "\"t" + std::to_string(i) + "\"";
    vocab += "]";
    std::map<std::string, std::string> good = {
        {"checksum", "fnv1a64:0000000000000000"}, {"train_step", "30"}, {"data_epoch", "2"}, {"data_pos", "7"},
        {"task", "{\"task\": \"arith\", \"ops\": \"2\"}"}, {"vocab", vocab}, {"args", "{\"steps\": \"40\"}"}};
    TrainMeta m;
    std::string err = checkpoint_check_meta("f", c, good, &m);
    CHECK(err.empty(), "good metadata refused: %s", err.c_str());
    CHECK(m.train_step == 30, "train_step parsed as %d, want 30", m.train_step);
    CHECK(m.steps == 40, "args' steps parsed as %d, want 40", m.steps);
    CHECK(m.data_epoch == 2, "data_epoch parsed as %d, want 2", m.data_epoch);
    CHECK(m.data_pos == 7, "data_pos parsed as %lld, want 7", (long long)m.data_pos);
    CHECK(m.task["ops"] == "2", "task's ops parsed as '%s', want '2'", m.task["ops"].c_str());
    CHECK((int)m.vocab.size() == c.V, "vocab parsed as %zu tokens, want %d", m.vocab.size(), c.V);
    CHECK(m.vocab[3] == "t3", "vocab token 3 parsed as '%s', want 't3'", m.vocab[3].c_str());
    struct Case { const char* key; const char* value; const char* word; } cases[] = {
        {"checksum", nullptr, "no \"checksum\""},
        {"train_step", "2000000000", "train_step"},   // past the run's 40 steps
        {"train_step", "41", "train_step"},
        {"train_step", "-1", "train_step"},
        {"train_step", "3.5", "train_step"},
        {"train_step", " 3", "train_step"},
        {"data_epoch", "-2", "data_epoch"},
        {"data_pos", "99999999999999999999", "data_pos"},
        {"data_pos", nullptr, "no \"data_pos\""},
        {"args", "{\"steps\": \"0\"}", "steps"},
        {"args", "[]", "args"},
        {"task", "{\"task\": \"poetry\"}", "task"},
        {"task", "{\"task\": 3}", "task"},
        {"vocab", "[\"a\", \"b\"]", "vocab"},           // 2 tokens, V = 11
        {"vocab", "[1, 2]", "vocab"},
        {"vocab", "{}", "vocab"},
    };
    for (const Case& k : cases) {
        std::map<std::string, std::string> meta = good;
        if (k.value) meta[k.key] = k.value;
        else meta.erase(k.key);
        err = checkpoint_check_meta("f", c, meta, &m);
        const char* value = k.value ? k.value : "(none)";
        CHECK(contains(err, k.word), "%s = %s: the error lacks '%s': '%s'", k.key, value, k.word, err.c_str());
        CHECK(!contains(err, "\n"), "%s = %s: the error is more than one line: '%s'", k.key, value, err.c_str());
    }
}

// ---------------------------------------------------------------------------
// Hyper-Connections checkpoints: the config's hc_rate and hc_dynamic, the hc tensors

namespace {
Config hc_config(int n, bool dynamic) {
    Config c = tiny_config(ARCH_LIME, 2, 1);
    c.arch = ARCH_HC;
    c.hc_rate = n;
    c.hc_dynamic = dynamic;
    return c;
}
// A bad file: the tensors of `tensors` (less `drop`, `reshape` of a wrong shape) under config
// `as`; its refusal must name `word`. With a `lender`, `reshape` is instead the lender's
// tensor of that name, at its shape there (another model's, e.g. a deeper one's).
struct BadFile { const Model* tensors; Config as; std::string drop, reshape, word; const Model* lender = nullptr; };
// k's file (no checksum, like the reference vectors), "config" from k.as.
std::string write_model_file(const BadFile& k, const std::string& path) {
    StWriter w;
    w.meta["config"] = config_to_json(k.as);
    for (const TensorSpec& t : k.tensors->specs) {
        if (t.name == k.drop) continue;
        const Model* from = k.tensors;
        const TensorSpec* u = &t;  // the tensor written: this model's, or the lender's of that name
        if (t.name == k.reshape && k.lender)
            for (const TensorSpec& v : k.lender->specs)
                if (v.name == t.name) from = k.lender, u = &v;
        std::vector<int64_t> shape(u->shape.begin(), u->shape.end());
        if (t.name == k.reshape && !k.lender) shape = {(int64_t)u->numel, 1};
        w.add(t.name, "F32", shape, from->params + u->offset, u->numel * sizeof(float));
    }
    return st_write(path, w);
}
// What model_load of a model of config k.as says of k's file ("st_write: ..." or
// "model_create: ..." when the file or the model could not be made).
std::string load_bad_file(const BadFile& k) {
    TmpFile f;
    std::string err = write_model_file(k, f.path);
    if (!err.empty()) return "st_write: " + err;
    Model m;
    err = model_create(&m, k.as, 2, DEVICE_CPU);
    if (!err.empty()) return "model_create: " + err;
    err = model_load(&m, f.path, false);
    model_free(&m);
    return err;
}
// "muddformer:kv L2 as muddformer (drop 'X', reshape 'Y')": which case a message is about
std::string bad_file_case(const BadFile& k) {
    return model_name(k.tensors->c) + " L" + std::to_string(k.tensors->c.L) + " as " + model_name(k.as) +
           " (drop '" + k.drop + "', " + (k.lender ? "from L" + std::to_string(k.lender->c.L) : "reshape") + " '" +
           k.reshape + "')";
}
}  // namespace

TEST(hc_checkpoint_round_trip) {
    for (bool dynamic : {true, false}) {
        Config c = hc_config(3, dynamic);
        Model m;
        FreeOnReturn guard{&m};
        CHECK(model_create(&m, c, 2, DEVICE_CPU).empty(), "model_create");
        model_init(&m, 4);
        for (size_t i = 0; i < m.n_params; i++) m.params[i] += 0.01f * (float)i, m.adam_m[i] = 0.5f, m.adam_v[i] = 0.25f;
        m.step = 5;
        TmpFile f;
        std::string err = model_save(&m, f.path, {}, true);
        CHECK(err.empty(), "save: %s", err.c_str());
        Config back;
        err = checkpoint_read_config(f.path, &back, nullptr);
        CHECK(err.empty(), "read config: '%s'", err.c_str());
        CHECK(back.arch == ARCH_HC, "read config: arch %s, want hc", arch_name(back.arch));
        CHECK(back.hc_rate == 3, "read config: hc_rate %d, want 3", back.hc_rate);
        CHECK(back.hc_dynamic == dynamic, "read config: hc_dynamic %d, want %d", back.hc_dynamic, dynamic);
        Model m2;
        FreeOnReturn guard2{&m2};
        CHECK(model_create(&m2, back, 2, DEVICE_CPU).empty(), "model_create");
        err = model_load(&m2, f.path, true);
        CHECK(err.empty(), "load: %s", err.c_str());
        CHECK(m2.step == 5, "hc (dynamic %d): step %d after loading, want the saved 5", dynamic, m2.step);
        CHECK(m2.n_params == m.n_params, "hc (dynamic %d): %zu parameters loaded, %zu saved", dynamic, m2.n_params, m.n_params);
        size_t n = m.n_params;
        CHECK(std::equal(m2.params, m2.params + n, m.params), "hc (dynamic %d): the loaded weights differ from the saved ones",
              dynamic);
        CHECK(std::equal(m2.adam_m, m2.adam_m + n, m.adam_m), "hc (dynamic %d): the loaded AdamW first moment differs", dynamic);
        CHECK(std::equal(m2.adam_v, m2.adam_v + n, m.adam_v), "hc (dynamic %d): the loaded AdamW second moment differs", dynamic);
    }
}

TEST(hc_config_json_checked) {
    Config c;
    std::string base = config_to_json(hc_config(2, false));
    std::string err = config_from_json(base, &c);
    CHECK(err.empty(), "hc config does not read back: '%s' (%s)", err.c_str(), base.c_str());
    CHECK(c.hc_rate == 2, "hc config reads back with hc_rate %d, want 2: %s", c.hc_rate, base.c_str());
    CHECK(!c.hc_dynamic, "hc config reads back dynamic, want static: %s", base.c_str());
    std::string lime = config_to_json(tiny_config(ARCH_LIME, 2, 1));
    CHECK(!contains(lime, "hc_rate"), "a lime config names hc_rate: %s", lime.c_str());
    struct { std::string from, to, word; } bad[] = {
        {"\"hc_rate\": 2", "\"hc_rate\": 0", "1 .. 16"},
        {"\"hc_rate\": 2", "\"hc_rate\": 2.5", "integer"},
        {"\"hc_dynamic\": false", "\"hc_dynamic\": 1", "true or false"},
        {"\"architecture\": \"hc\"", "\"architecture\": \"llama\"", "is not \"hc\""},
    };
    for (auto& b : bad) {
        std::string text = base;
        text.replace(text.find(b.from), b.from.size(), b.to);
        err = config_from_json(text, &c);
        CHECK(contains(err, b.word), "%s: the error lacks '%s': '%s'", b.to.c_str(), b.word.c_str(), err.c_str());
        CHECK(!contains(err, "\n"), "%s: the error is more than one line: '%s'", b.to.c_str(), err.c_str());
    }
}

// A file whose hc tensors are missing, of the wrong shape, or of another
// rate than its config says: refused with one line naming the tensor.
TEST(hc_checkpoint_with_bad_tensors_refused) {
    Config c = hc_config(2, true);
    Model m, other;
    FreeOnReturn guard{&m, &other};
    CHECK(model_create(&m, c, 2, DEVICE_CPU).empty(), "model_create hc:n2");
    CHECK(model_create(&other, hc_config(3, true), 2, DEVICE_CPU).empty(), "model_create hc:n3");
    model_init(&m, 4);
    model_init(&other, 4);
    BadFile cases[] = {
        {&m, c, "model.layers.1.hc_mlp.static_alpha", "", "model.layers.1.hc_mlp.static_alpha"},
        {&m, c, "model.layers.0.hc_attn.dynamic_beta_scale", "", "model.layers.0.hc_attn.dynamic_beta_scale"},
        {&m, c, "", "model.layers.0.hc_attn.dynamic_alpha_fn", "model.layers.0.hc_attn.dynamic_alpha_fn"},
        {&other, c, "", "", "model.layers.0.hc_attn.static_beta"},  // rate-3 tensors under a rate-2 config
    };
    for (const BadFile& k : cases) {
        std::string err = load_bad_file(k);
        CHECK(contains(err, k.word) && contains(err, "hc_rate") && !contains(err, "\n"),
              "%s: the error does not name %s and hc_rate in one line: '%s'", bad_file_case(k).c_str(), k.word.c_str(),
              err.c_str());
    }
}

// DeepCrossAttention's tensors checked as every other: a file missing one,
// holding one of a wrong shape, another architecture's tensors, or a GRN of
// another number of sources (a deeper model's final GRN) is refused
// with one line naming the tensor.
TEST(dca_checkpoint_with_bad_tensors_refused) {
    Config dca = tiny_config(ARCH_DCA, 2, 1), deeper = dca, dense = tiny_config(ARCH_DENSEFORMER, 2, 1);
    deeper.L = dca.L + 1;
    Model md, mdeep, mdense;
    FreeOnReturn guard{&md, &mdeep, &mdense};
    CHECK(model_create(&md, dca, 2, DEVICE_CPU).empty(), "model_create dca");
    CHECK(model_create(&mdeep, deeper, 2, DEVICE_CPU).empty(), "model_create dca, one layer more");
    CHECK(model_create(&mdense, dense, 2, DEVICE_CPU).empty(), "model_create denseformer");
    model_init(&md, 4), model_init(&mdeep, 4), model_init(&mdense, 4);
    const std::string FINAL = "model.grn_final.static.weight", K1 = "model.layers.1.grn_k.static.weight";
    BadFile cases[] = {
        {&md, dca, FINAL, "", FINAL},                                          // missing
        {&md, dca, "model.layers.2.input_layernorm_v.weight", "", "input_layernorm_v"},
        {&md, dca, "", K1, K1},                                                // of a wrong shape
        {&md, dense, "", "", "grn_"},                                          // dca's, a denseformer config
        {&mdense, dca, "", "", "dwa.weight"},                                  // denseformer's, a dca config
        {&md, dca, "", FINAL, FINAL, &mdeep},  // the final GRN of a model one layer deeper: 5 sources where 4 are
    };
    for (const BadFile& k : cases) {
        std::string err = load_bad_file(k);
        CHECK(contains(err, k.word) && !contains(err, "\n"), "%s: the error does not name %s in one line: '%s'",
              bad_file_case(k).c_str(), k.word.c_str(), err.c_str());
    }
}

// The peers' tensors (ResFormer's value_residual, DenseFormer's dwa) checked as
// every other: a file missing one, holding one of a wrong shape, or holding
// another architecture's tensors is refused with one line naming the tensor.
TEST(peer_checkpoint_with_bad_tensors_refused) {
    Config res = tiny_config(ARCH_RESFORMER, 2, 1), dense = tiny_config(ARCH_DENSEFORMER, 2, 1);
    Config llama = tiny_config(ARCH_LLAMA, 2, 1);
    Model mr, md, ml;
    FreeOnReturn guard{&mr, &md, &ml};
    CHECK(model_create(&mr, res, 2, DEVICE_CPU).empty(), "model_create resformer");
    CHECK(model_create(&md, dense, 2, DEVICE_CPU).empty(), "model_create denseformer");
    CHECK(model_create(&ml, llama, 2, DEVICE_CPU).empty(), "model_create llama");
    model_init(&mr, 4), model_init(&md, 4), model_init(&ml, 4);
    const std::string VR = "model.layers.1.self_attn.value_residual.weight";
    BadFile cases[] = {
        {&mr, res, VR, "", VR},  // missing
        {&mr, res, "", VR, VR},  // of a wrong shape
        {&md, dense, "model.layers.0.dwa.weight", "", "model.layers.0.dwa.weight"},
        {&md, dense, "", "model.layers.1.dwa.weight", "model.layers.1.dwa.weight"},
        {&ml, res, "", "", VR},     // llama's tensors, a resformer config
        {&mr, llama, "", "", VR},   // resformer's, a llama config
        {&md, res, "", "", "dwa.weight"},  // denseformer's, a resformer config
    };
    for (const BadFile& k : cases) {
        std::string err = load_bad_file(k);
        CHECK(contains(err, k.word) && !contains(err, "\n"), "%s: the error does not name %s in one line: '%s'",
              bad_file_case(k).c_str(), k.word.c_str(), err.c_str());
    }
}

// MUDDFormer's tensors (input_layernorm_k/_v, mudd.w1/w2/static): a file missing one,
// holding one of a wrong shape, or holding the other ways' or another
// architecture's tensors is refused with one line naming the tensor.
TEST(muddformer_checkpoint_with_bad_tensors_refused) {
    Config qkvr = tiny_config(ARCH_MUDDFORMER, 2, 1), kv = qkvr, llama = tiny_config(ARCH_LLAMA, 2, 1);
    kv.mudd_ways = MUDD_KV;
    Model mq, mk, ml;
    FreeOnReturn guard{&mq, &mk, &ml};
    CHECK(model_create(&mq, qkvr, 2, DEVICE_CPU).empty(), "model_create muddformer");
    CHECK(model_create(&mk, kv, 2, DEVICE_CPU).empty(), "model_create muddformer:kv");
    CHECK(model_create(&ml, llama, 2, DEVICE_CPU).empty(), "model_create llama");
    model_init(&mq, 4), model_init(&mk, 4), model_init(&ml, 4);
    const std::string W1 = "model.layers.0.mudd.w1.weight", A = "model.layers.1.mudd.static.weight";
    BadFile cases[] = {
        {&mq, qkvr, "model.layers.1.input_layernorm_k.weight", "", "model.layers.1.input_layernorm_k.weight"},
        {&mq, qkvr, A, "", A},                       // missing
        {&mq, qkvr, "", A, A},                       // of a wrong shape
        {&mk, qkvr, "", "", W1},                     // kv's (2 ways, 2 s hidden units) under a qkvr config
        {&mq, kv, "", "", "model.layers.2.mudd."},   // qkvr's (an aggregation after the last block) under kv
        {&ml, qkvr, "", "", W1},                     // llama's tensors, a muddformer config
        {&mq, llama, "", "", W1},                    // muddformer's, a llama config
    };
    for (const BadFile& k : cases) {
        std::string err = load_bad_file(k);
        CHECK(contains(err, k.word) && !contains(err, "\n"), "%s: the error does not name %s in one line: '%s'",
              bad_file_case(k).c_str(), k.word.c_str(), err.c_str());
    }
}

TEST(muddformer_config_json_checked) {
    Config c, kv = tiny_config(ARCH_MUDDFORMER, 2, 1);
    kv.mudd_ways = MUDD_KV;
    std::string base = config_to_json(kv);
    std::string err = config_from_json(base, &c);
    CHECK(err.empty() && c.mudd_ways == MUDD_KV, "a muddformer:kv config does not read back as kv: '%s' (%s)", err.c_str(), base.c_str());
    CHECK(contains(config_to_json(tiny_config(ARCH_MUDDFORMER, 2, 1)), "\"mudd_ways\": \"qkvr\""), "a muddformer config lacks mudd_ways qkvr");
    CHECK(!contains(config_to_json(tiny_config(ARCH_LIME, 2, 1)), "mudd_ways"), "a lime config names mudd_ways");
    struct { std::string from, to, word; } bad[] = {
        {"\"mudd_ways\": \"kv\"", "\"mudd_ways\": \"qkv\"", "\"qkvr\" or \"kv\""},
        {"\"mudd_ways\": \"kv\"", "\"mudd_ways\": 2", "\"qkvr\" or \"kv\""},
        {"\"architecture\": \"muddformer\"", "\"architecture\": \"denseformer\"", "is not \"muddformer\""},
    };
    for (auto& b : bad) {
        std::string text = base;
        text.replace(text.find(b.from), b.from.size(), b.to);
        err = config_from_json(text, &c);
        CHECK(contains(err, b.word), "%s: the error lacks '%s': '%s'", b.to.c_str(), b.word.c_str(), err.c_str());
        CHECK(!contains(err, "\n"), "%s: the error is more than one line: '%s'", b.to.c_str(), err.c_str());
    }
}
