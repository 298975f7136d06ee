// tests/fuzz_safetensors.cpp — libFuzzer target for what reads checkpoints
// from outside: the safetensors parser, the JSON parser and the model config.
// Built and run by `make fuzz` (clang++ -fsanitize=fuzzer,address,undefined);
// seeds in tests/fuzz_corpus/safetensors/.
//
// Each input is tried five ways, and besides "no crash, no sanitizer
// report" each way checks a promise the code makes (a broken promise traps,
// which libFuzzer reports like a crash):
//   1. as a whole safetensors file (st_parse): when it is accepted, every
//      tensor it lists can be read back with its own dtype and shape, and
//      the "config" metadata goes through config_from_json;
//   2. as JSON text (json_parse): when it is accepted, json_dump gives text
//      that parses to the same dump (a round trip);
//   3. as a model config (config_from_json): when it is accepted, the
//      config passes config_check;
//   4. as a checkpoint on disk, the way ./lime eval loads one:
//      checkpoint_read_config (the checksum checked), checkpoint_check_meta
//      (train's metadata: when it accepts, every field it parsed is within
//      the bounds it promises), then, for a small config, model_create and
//      model_load; when model_load accepts the file, every weight it read
//      is the file's, and finite.
//   5. as train's metadata (a JSON object of strings, as in a file's
//      __metadata__): checkpoint_check_meta against a V = 4 model; when it
//      accepts, every field it parsed is within the bounds it promises
//      (the direct way to its checks: a mutated file rarely keeps its checksum).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "support/model/lime.h"
#include "support/lib/safetensors.h"

// A broken promise: say which, then trap so libFuzzer keeps the input.
static void require(bool ok, const char* what) {
    if (!ok) {
        fprintf(stderr, "fuzz_safetensors: broken promise: %s\n", what);
        __builtin_trap();
    }
}

static void as_safetensors(const uint8_t* data, size_t size) {
    SafeTensors st;
    if (!st_parse((const char*)data, size, &st, "fuzz input").empty()) {
        require(st.tensors.empty() && st.meta.empty() && st.data.empty(), "st_parse failed but left *out filled");
        return;
    }
    for (const StTensor& t : st.tensors) {
        size_t numel = 1;
        for (int64_t n : t.shape) numel *= (size_t)n;
        require(t.begin <= t.end && t.end <= st.data.size(), "a tensor's bytes lie outside the data");
        require(numel * st_dtype_size(t.dtype) == t.end - t.begin, "a tensor's byte count is not numel * dtype size");
        if (t.dtype == "F32") {
            std::vector<float> buf(numel);
            require(st_get_f32(st, t.name, t.shape, buf.data()).empty(), "st_get_f32 refused a tensor st_parse accepted");
        } else if (t.dtype == "I32") {
            std::vector<int32_t> buf(numel);
            require(st_get_i32(st, t.name, t.shape, buf.data()).empty(), "st_get_i32 refused a tensor st_parse accepted");
        }
        require(st.find(t.name) == &t, "find() does not return the tensor");
    }
    st_checksum(st.data.data(), st.data.size());
    auto it = st.meta.find("config");
    if (it != st.meta.end()) {
        Config c;
        config_from_json(it->second, &c);
    }
}

static void as_json(const std::string& text) {
    Json j;
    if (!json_parse(text, &j).empty()) return;
    std::string dump = json_dump(j);
    Json again;
    require(json_parse(dump, &again).empty(), "json_dump wrote text that json_parse refuses");
    require(json_dump(again) == dump, "json_dump -> json_parse -> json_dump changed the text");
}

static void as_config(const std::string& text) {
    Config c;
    if (config_from_json(text, &c).empty()) require(config_check(c).empty(), "config_from_json accepted a config that config_check refuses");
}

// The promises of checkpoint_check_meta's accepted output.
static void require_meta_bounds(const std::map<std::string, std::string>& meta, const Config& c, TrainMeta& tm) {
    require(meta.count("checksum") > 0, "checkpoint_check_meta accepted metadata without a checksum");
    require(tm.steps >= 1 && tm.steps <= MAX_STEPS && tm.train_step >= 0 && tm.train_step <= tm.steps,
            "checkpoint_check_meta accepted a train_step outside 0 .. steps");
    require(tm.data_epoch >= 0 && tm.data_pos >= 0, "checkpoint_check_meta accepted a negative data position");
    require((int)tm.vocab.size() == c.V, "checkpoint_check_meta accepted a vocabulary of another size than V");
    require(tm.task.count("task") && (tm.task["task"] == "arith" || tm.task["task"] == "prosqa" || tm.task["task"] == "text"),
            "checkpoint_check_meta accepted an unknown task");
}

static void as_train_meta(const std::string& text) {
    Json j;
    if (!json_parse(text, &j).empty() || j.kind != Json::OBJ) return;
    std::map<std::string, std::string> meta;
    for (const auto& kv : j.obj) {
        if (kv.second.kind != Json::STR) return;
        meta[kv.first] = kv.second.str;
    }
    Config c;
    c.V = 4;
    TrainMeta tm;
    if (checkpoint_check_meta("fuzz input", c, meta, &tm).empty()) require_meta_bounds(meta, c, tm);
}

static void as_checkpoint(const uint8_t* data, size_t size) {
    static const std::string path = std::string(getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp") + "/fuzz_safetensors." +
                                    std::to_string(getpid()) + ".safetensors";
    FILE* f = fopen(path.c_str(), "wb");
    require(f != nullptr, "cannot write the temporary file");
    fwrite(data, 1, size, f);
    fclose(f);
    Config c;
    std::map<std::string, std::string> meta;
    if (!checkpoint_read_config(path, &c, &meta).empty()) return;
    TrainMeta tm;
    if (checkpoint_check_meta(path, c, meta, &tm).empty()) require_meta_bounds(meta, c, tm);
    // small models only: a fuzzed config may ask for any size
    if (param_count(c) > 100000 || c.T > 64 || c.L > 8 || c.H > 16 || c.V > 4096) return;
    Model model;
    if (model_create(&model, c, 1, DEVICE_CPU).empty() && model_load(&model, path, true).empty()) {
        SafeTensors st;
        require(st_read(path, &st).empty(), "model_load accepted a file st_read refuses");
        std::vector<float> w;
        auto same_bits = [](float a, float b) { return memcmp(&a, &b, 4) == 0; };
        for (const TensorSpec& t : model.specs) {
            w.resize(t.numel);
            require(st_get_f32(st, t.name, std::vector<int64_t>(t.shape.begin(), t.shape.end()), w.data()).empty() &&
                        std::equal(w.begin(), w.end(), model.params + t.offset, same_bits),
                    "model_load's weights differ from the file's");
            require(std::all_of(w.begin(), w.end(), [](float x) { return std::isfinite(x); }),
                    "model_load accepted a NaN or an Inf");
        }
    }
    model_free(&model);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    as_safetensors(data, size);
    std::string text((const char*)data, size);
    as_json(text);
    as_config(text);
    as_train_meta(text);
    as_checkpoint(data, size);
    return 0;
}
