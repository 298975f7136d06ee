// tests/test_safetensors.cpp — the JSON parser, the safetensors reader and
// writer, and their refusals. Run from the repository root: the reference
// files are read from tests/golden/.
#include <sys/resource.h>
#include <csignal>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "support/lib/safetensors.h"
#include "test.h"

// ---------------------------------------------------------------------------
// Helpers

// One scratch directory per run, removed when the program exits.
struct ScratchDir {
    std::string path;
    ScratchDir() {
        char tmpl[] = "/tmp/lime_st_test_XXXXXX";
        if (mkdtemp(tmpl)) path = tmpl;
    }
    ~ScratchDir() {
        std::error_code ec;
        if (!path.empty()) std::filesystem::remove_all(path, ec);
    }
};
static std::string scratch(const std::string& name) {
    static ScratchDir dir;
    return dir.path + "/" + name;
}

static bool exists(const std::string& path) {
    struct stat sb;
    return stat(path.c_str(), &sb) == 0;
}

// Whether a temporary file of a save of path (path.tmp-XXXXXX) is left in its directory.
static bool temp_left(const std::string& path) {
    std::filesystem::path p(path);
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(p.parent_path(), ec))
        if (e.path().filename().string().rfind(p.filename().string() + ".tmp", 0) == 0) return true;
    return false;
}

static std::vector<char> read_bytes(const std::string& path) {
    std::vector<char> b;
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) return b;
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) b.insert(b.end(), buf, buf + n);
    fclose(f);
    return b;
}

static bool write_bytes(const std::string& path, const std::vector<char>& b) {
    FILE* f = fopen(path.c_str(), "wb");
    if (!f) return false;
    bool ok = b.empty() || fwrite(b.data(), 1, b.size(), f) == b.size();
    return fclose(f) == 0 && ok;
}

// A safetensors file by hand: length prefix, this header, data_size zero bytes.
static std::vector<char> make_file(const std::string& header, size_t data_size) {
    std::vector<char> b(8 + header.size() + data_size, 0);
    uint64_t n = header.size();
    for (int i = 0; i < 8; i++) b[i] = (char)(n >> (8 * i));
    if (!header.empty()) memcpy(&b[8], header.data(), header.size());
    return b;
}

static std::string parse_bytes(const std::vector<char>& b) {
    SafeTensors st;
    return st_parse(b.data(), b.size(), &st, "bad.safetensors");
}

// "" if st_parse refuses the file with an error naming it and containing
// `word`, else what went wrong.
static std::string expect_refusal(const std::string& header, size_t data_size, const std::string& word) {
    std::string err = parse_bytes(make_file(header, data_size));
    if (err.empty()) return "accepted a malformed header: " + header;
    if (!contains(err, "bad.safetensors")) return "error does not name the file: " + err;
    if (!contains(err, word)) return "error lacks \"" + word + "\": " + err;
    return "";
}

static std::string json_err(const std::string& text) {
    Json v;
    return json_parse(text, &v);
}

// ---------------------------------------------------------------------------
// JSON

TEST(json_round_trip_compact_text) {
    const std::string text =
        R"({"a":[1,-2.5,0.1,1e+300,true,false,null],"b":{"c":"d","e":[]},"f":"","g":{}})";
    Json v;
    std::string err = json_parse(text, &v);
    CHECK(err.empty(), "parse failed: %s", err.c_str());
    std::string out = json_dump(v);
    CHECK(out == text, "dump differs:\n  in:  %s\n  out: %s", text.c_str(), out.c_str());
}

TEST(json_parses_values_and_keeps_key_order) {
    Json v;
    std::string err = json_parse(" { \"z\" : 1 ,\n\t\"a\" : [ true , null , \"s\" ] , \"m\" : -0.5e1 } ", &v);
    CHECK(err.empty(), "parse failed: %s", err.c_str());
    CHECK(v.kind == Json::OBJ, "expected an object");
    CHECK(v.obj.size() == 3, "expected 3 keys, got %zu", v.obj.size());
    const char* order[] = {"z", "a", "m"};
    for (int i = 0; i < 3; i++)
        CHECK(v.obj[i].first == order[i], "key %d is \"%s\", want \"%s\" (the file's order)", i, v.obj[i].first.c_str(),
              order[i]);
    const Json* a = v.get("a");
    CHECK(a, "no key \"a\"");
    CHECK(a->kind == Json::ARR, "\"a\" should be an array");
    CHECK(a->arr.size() == 3, "\"a\" has %zu entries, want 3", a->arr.size());
    CHECK(a->arr[0].kind == Json::BOOL, "a[0] should be a boolean");
    CHECK(a->arr[0].b, "a[0] should be true");
    CHECK(a->arr[1].kind == Json::NUL, "a[1] should be null");
    CHECK(a->arr[2].kind == Json::STR, "a[2] should be a string");
    CHECK(a->arr[2].str == "s", "a[2] is \"%s\", want \"s\"", a->arr[2].str.c_str());
    CHECK(v.get("m")->num == -5.0, "m = %g, expected -5", v.get("m")->num);
    CHECK(v.get("missing") == nullptr, "get of a missing key should be nullptr");
    CHECK(a->get("z") == nullptr, "get on an array should be nullptr");
}

TEST(json_numbers_round_trip_exactly) {
    const double xs[] = {0.1, 1.0 / 3.0, -2.5e-300, 1e300, 5e-324, 123456789012345678.0,
                         9007199254740993.0, -0.0, 0.0, 42.0, 1e-6};
    for (double x : xs) {
        Json v;
        v.kind = Json::NUM;
        v.num = x;
        std::string text = json_dump(v);
        Json back;
        std::string err = json_parse(text, &back);
        CHECK(err.empty(), "%s does not parse: %s", text.c_str(), err.c_str());
        CHECK(back.num == x, "%.17g dumped as %s reads back as %.17g", x, text.c_str(), back.num);
        CHECK(std::signbit(back.num) == std::signbit(x), "%.17g dumped as %s reads back with the other sign", x, text.c_str());
    }
}

TEST(json_string_escapes_round_trip) {
    Json v;
    std::string err = json_parse(R"("q\"b\\s\/b\bf\fn\nr\rt\t")", &v);
    CHECK(err.empty(), "parse failed: %s", err.c_str());
    CHECK(v.str == "q\"b\\s/b\bf\fn\nr\rt\t", "escapes decoded wrongly: [%s]", v.str.c_str());
    std::string all;
    for (int c = 1; c < 128; c++) all += (char)c;
    all += std::string("\0mid", 4);
    std::string quoted = json_quote(all);
    for (const char* escape : {"\\u0001", "\\u0000"})
        CHECK(contains(quoted, escape), "control characters should be \\u-escaped, no %s in: %s", escape, quoted.c_str());
    Json back;
    err = json_parse(quoted, &back);
    CHECK(err.empty(), "quoted string does not parse: %s", err.c_str());
    CHECK(back.str == all, "quote then parse changed the string");
}

TEST(json_unicode_escapes_become_utf8) {
    Json v;
    std::string err = json_parse(R"("\u00e9\u20AC\ud83d\ude00 é")", &v);
    CHECK(err.empty(), "parse failed: %s", err.c_str());
    const std::string want = "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 \xc3\xa9";
    CHECK(v.str == want, "got %zu bytes, expected é € 😀 é in UTF-8 (%zu bytes)", v.str.size(), want.size());
    CHECK(json_dump(v) == "\"" + want + "\"", "dump should keep UTF-8 as it is: %s", json_dump(v).c_str());
}

TEST(json_refuses_truncated_text) {
    const char* cases[] = {"", "   ", "{", "[1,", "[1", "{\"a\"", "{\"a\":", "{\"a\":1",
                           "\"abc", "\"ab\\", "\"\\u12", "tru", "nul", "-", "1e", "1."};
    for (const char* text : cases) {
        std::string err = json_err(text);
        CHECK(!err.empty(), "accepted truncated text [%s]", text);
        CHECK(contains(err, "at byte"), "error for [%s] lacks a byte offset: %s", text, err.c_str());
    }
}

TEST(json_refuses_trailing_garbage) {
    const char* cases[] = {"{} x", "1 2", "[]]", "\"a\"\"b\"", "null,", "01", "truex", "{}\x01"};
    for (const char* text : cases) {
        std::string err = json_err(text);
        CHECK(!err.empty(), "accepted trailing garbage in [%s]", text);
    }
    std::string err = json_err("{} x");
    for (const char* part : {"trailing", "at byte 3"}) CHECK(contains(err, part), "the error lacks '%s': %s", part, err.c_str());
}

TEST(json_refuses_nesting_deeper_than_the_limit) {
    std::string ok = std::string(JSON_MAX_DEPTH, '[') + std::string(JSON_MAX_DEPTH, ']');
    std::string err = json_err(ok);
    CHECK(err.empty(), "refused %d levels: %s", JSON_MAX_DEPTH, err.c_str());
    std::string deep = std::string(JSON_MAX_DEPTH + 1, '[') + std::string(JSON_MAX_DEPTH + 1, ']');
    err = json_err(deep);
    CHECK(contains(err, "nesting"), "accepted %d levels, or unclear error: %s", JSON_MAX_DEPTH + 1, err.c_str());
    std::string objs;
    for (int i = 0; i < 100000; i++) objs += "{\"a\":";  // must not exhaust the stack
    err = json_err(objs);
    CHECK(contains(err, "nesting"), "deep objects: %s", err.c_str());
}

TEST(json_refuses_bad_strings) {
    const char* cases[] = {
        "\"\\ud800\"",        // lone high surrogate
        "\"\\udc00\"",        // lone low surrogate
        "\"\\ud800\\u0041\"", // high surrogate then no low one
        "\"a\nb\"",           // raw control character
        "\"\xff\"",           // not UTF-8
        "\"\xc0\xaf\"",       // overlong encoding
        "\"\xed\xa0\x80\"",   // surrogate encoded in UTF-8
        "\"\\x41\"",          // unknown escape
        "\"\\u12g4\"",        // bad hex
    };
    for (const char* text : cases) {
        std::string err = json_err(text);
        CHECK(!err.empty(), "accepted bad string [%s]", text);
    }
}

TEST(json_refuses_bad_numbers) {
    const char* cases[] = {"+1", ".5", "1.", "-", "1e", "1e+", "0x10", "Infinity", "NaN",
                           "1e999", "-1e999", "--1"};
    for (const char* text : cases) {
        std::string err = json_err(text);
        CHECK(!err.empty(), "accepted bad number [%s]", text);
    }
    CHECK(contains(json_err("1e999"), "out of range"), "1e999: %s", json_err("1e999").c_str());
}

TEST(json_refuses_duplicate_keys) {
    std::string err = json_err(R"({"a":1,"b":2,"a":3})");
    for (const char* part : {"duplicate key \"a\"", "at byte 13"})
        CHECK(contains(err, part), "the error lacks '%s': %s", part, err.c_str());
    err = json_err(R"({"a":{"x":1},"b":{"x":2}})");
    CHECK(err.empty(), "equal keys in different objects are fine: %s", err.c_str());
}

TEST(json_error_names_the_byte_offset) {
    std::string err = json_err("[1,2,x]");
    CHECK(contains(err, "at byte 5"), "expected the offset of 'x' (5): %s", err.c_str());
}

// ---------------------------------------------------------------------------
// Writing and reading back

TEST(st_write_read_round_trip) {
    const float f[6] = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f};
    const int32_t ints[4] = {0, -1, 2147483647, -2147483647 - 1};
    const float scalar = 42.0f;
    StWriter w;
    w.meta["config"] = R"({"architecture": "lime"})";
    w.meta["note"] = "caf\xc3\xa9 \"quoted\"\nline";
    w.add("model.w", "F32", {2, 3}, f, sizeof f);
    w.add("batch.tokens", "I32", {4}, ints, sizeof ints);
    w.add("scalar", "F32", {}, &scalar, sizeof scalar);
    w.add("empty", "F32", {0, 3}, nullptr, 0);
    const std::string path = scratch("round_trip.safetensors");
    std::string err = st_write(path, w);
    CHECK(err.empty(), "st_write: %s", err.c_str());
    CHECK(!temp_left(path), "the tmp file is left behind");

    std::vector<char> raw = read_bytes(path);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | (unsigned char)raw[i];
    CHECK(hlen % 8 == 0, "header length %llu is not a multiple of 8", (unsigned long long)hlen);
    CHECK(std::string(raw.begin() + 8, raw.begin() + 24) == "{\"__metadata__\":",
          "__metadata__ should come first in the header");

    SafeTensors st;
    err = st_read(path, &st);
    CHECK(err.empty(), "st_read: %s", err.c_str());
    CHECK(st.meta == w.meta, "metadata changed on the way");
    CHECK(st.tensors.size() == 4, "%zu tensors, expected 4", st.tensors.size());
    const char* order[] = {"model.w", "batch.tokens", "scalar", "empty"};
    uint64_t offset = 0;
    for (int i = 0; i < 4; i++) {
        CHECK(st.tensors[i].name == order[i], "tensor %d is %s, expected %s", i,
              st.tensors[i].name.c_str(), order[i]);
        CHECK(st.tensors[i].begin == offset, "%s begins at %llu, expected %llu (contiguous)", order[i],
              (unsigned long long)st.tensors[i].begin, (unsigned long long)offset);
        offset = st.tensors[i].end;
    }
    CHECK(offset == st.data.size(), "data holds %zu bytes, tensors %llu", st.data.size(),
          (unsigned long long)offset);

    float f2[6];
    int32_t i2[4];
    float s2;
    err = st_get_f32(st, "model.w", {2, 3}, f2);
    CHECK(err.empty(), "%s", err.c_str());
    CHECK(memcmp(f, f2, sizeof f) == 0, "F32 values changed");
    err = st_get_i32(st, "batch.tokens", {4}, i2);
    CHECK(err.empty(), "%s", err.c_str());
    CHECK(memcmp(ints, i2, sizeof ints) == 0, "I32 values changed");
    err = st_get_f32(st, "scalar", {}, &s2);
    CHECK(err.empty(), "scalar: %s", err.c_str());
    CHECK(s2 == 42.0f, "scalar: %g, want 42", s2);
    err = st_get_f32(st, "empty", {0, 3}, nullptr);
    CHECK(err.empty(), "empty tensor: %s", err.c_str());
}

TEST(st_write_replaces_an_existing_file) {
    const float a[2] = {1, 2}, b[3] = {3, 4, 5};
    const std::string path = scratch("replace.safetensors");
    StWriter wa, wb;
    wa.add("x", "F32", {2}, a, sizeof a);
    wb.add("y", "F32", {3}, b, sizeof b);
    std::string err = st_write(path, wa);
    CHECK(err.empty(), "%s", err.c_str());
    err = st_write(path, wb);
    CHECK(err.empty(), "%s", err.c_str());
    SafeTensors st;
    err = st_read(path, &st);
    CHECK(err.empty(), "%s", err.c_str());
    CHECK(st.tensors.size() == 1, "the file holds %zu tensors, want the second write's 1", st.tensors.size());
    CHECK(st.tensors[0].name == "y", "the file holds \"%s\", want the second write's \"y\"", st.tensors[0].name.c_str());
}

TEST(st_get_checks_name_dtype_and_shape) {
    const float f[6] = {0};
    const int32_t i[2] = {0};
    StWriter w;
    w.add("f", "F32", {2, 3}, f, sizeof f);
    w.add("i", "I32", {2}, i, sizeof i);
    const std::string path = scratch("get.safetensors");
    std::string err = st_write(path, w);
    CHECK(err.empty(), "%s", err.c_str());
    SafeTensors st;
    err = st_read(path, &st);
    CHECK(err.empty(), "%s", err.c_str());
    float fo[6];
    int32_t io[2];
    err = st_get_f32(st, "nope", {2, 3}, fo);
    CHECK(contains(err, "not found"), "missing tensor: the error lacks 'not found': %s", err.c_str());
    CHECK(contains(err, path), "missing tensor: the error does not name the file: %s", err.c_str());
    err = st_get_f32(st, "i", {2}, fo);
    CHECK(contains(err, "dtype I32, expected F32"), "wrong dtype: %s", err.c_str());
    err = st_get_i32(st, "f", {2, 3}, io);
    CHECK(contains(err, "dtype F32, expected I32"), "wrong dtype: %s", err.c_str());
    err = st_get_f32(st, "f", {3, 2}, fo);
    CHECK(contains(err, "shape [2, 3], expected [3, 2]"), "wrong shape: %s", err.c_str());
    err = st_get_f32(st, "f", {6}, fo);
    CHECK(contains(err, "shape"), "same numel, other shape must fail: %s", err.c_str());
}

TEST(st_write_refuses_bad_entries) {
    const float f[4] = {0};
    struct Case { const char* what; StWriter w; const char* word; };
    std::vector<Case> cases(4);
    cases[0] = {"bytes != numel * size", {}, "need 16"};
    cases[0].w.add("a", "F32", {2, 2}, f, 12);
    cases[1] = {"duplicate name", {}, "duplicate"};
    cases[1].w.add("a", "F32", {1}, f, 4);
    cases[1].w.add("a", "F32", {1}, f, 4);
    cases[2] = {"unknown dtype", {}, "unknown dtype"};
    cases[2].w.add("a", "F31", {1}, f, 4);
    cases[3] = {"reserved name", {}, "reserved"};
    cases[3].w.add("__metadata__", "F32", {1}, f, 4);
    const std::string path = scratch("refused.safetensors");
    for (const Case& c : cases) {
        std::string err = st_write(path, c.w);
        CHECK(contains(err, c.word), "%s: error lacks \"%s\": %s", c.what, c.word, err.c_str());
        CHECK(!exists(path), "%s: the file was written", c.what);
        CHECK(!temp_left(path), "%s: a temporary file was left", c.what);
    }
}

TEST(st_write_into_missing_directory_fails_and_leaves_no_file) {
    const float f[1] = {1};
    StWriter w;
    w.add("a", "F32", {1}, f, sizeof f);
    const std::string path = scratch("no/such/dir/model.safetensors");
    std::string err = st_write(path, w);
    for (const char* part : {"cannot write", "model.safetensors.tmp", "does the directory exist?"})
        CHECK(contains(err, part), "the error lacks '%s': %s", part, err.c_str());
    CHECK(!exists(path), "the file was written");
    CHECK(!temp_left(path), "a temporary file was left behind");
}

TEST(st_write_failure_keeps_the_existing_file) {
    const float good[2] = {1, 2}, other[2] = {3, 4};
    const std::string path = scratch("keep.safetensors");
    StWriter wg, wo;
    wg.add("x", "F32", {2}, good, sizeof good);
    wo.add("x", "F32", {2}, other, sizeof other);
    std::string err = st_write(path, wg);
    CHECK(err.empty(), "%s", err.c_str());
    std::vector<char> before = read_bytes(path);

    // A file size limit of 16 bytes (ulimit -f, as a full disk) makes the write itself fail.
    struct rlimit old_limit, tiny = {16, 16};
    getrlimit(RLIMIT_FSIZE, &old_limit);
    tiny.rlim_max = old_limit.rlim_max;
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    CHECK(setrlimit(RLIMIT_FSIZE, &tiny) == 0, "cannot set up the file size limit");
    err = st_write(path, wo);
    setrlimit(RLIMIT_FSIZE, &old_limit);
    signal(SIGXFSZ, old_handler);
    CHECK(contains(err, "cannot write"), "write past the file size limit should fail: %s", err.c_str());
    CHECK(read_bytes(path) == before, "the failed write changed the existing file");

    // A refused entry fails before anything is opened.
    StWriter bad;
    bad.add("x", "F32", {3}, other, sizeof other);
    err = st_write(path, bad);
    CHECK(!err.empty(), "a size mismatch should be refused");
    CHECK(read_bytes(path) == before, "the refused write changed the existing file");
}

// ---------------------------------------------------------------------------
// The reference files

struct Golden { const char* name; const char* arch; int V, L, d, H, R, hd, F, B, T; };
static const Golden GOLDEN[] = {
    {"llama_tiny", "llama", 11, 2, 16, 4, 4, 4, 24, 2, 5},
    {"lime_tiny", "lime", 11, 2, 16, 4, 4, 4, 24, 2, 5},
    {"lime_gqa", "lime", 19, 3, 24, 4, 2, 6, 40, 2, 7},
};

static std::string golden_path(const Golden& g) {
    return std::string("tests/golden/") + g.name + ".safetensors";
}

static bool config_int(const Json& c, const char* key, int want) {
    const Json* v = c.get(key);
    return v && v->kind == Json::NUM && v->num == want;
}

// "" if the file reads, every tensor copies out, and shapes and config match
// the table of tests/golden/README.md; else the first problem.
static std::string check_golden(const Golden& g) {
    const std::string path = golden_path(g);
    SafeTensors st;
    std::string err = st_read(path, &st);
    if (!err.empty()) return err + " [run the tests from the repository root]";

    for (const StTensor& t : st.tensors) {
        size_t numel = 1;
        for (int64_t d : t.shape) numel *= (size_t)d;
        if (t.dtype == "F32") {
            std::vector<float> v(numel);
            err = st_get_f32(st, t.name, t.shape, v.data());
            for (float x : v)
                if (err.empty() && !std::isfinite(x)) err = t.name + " holds a non-finite value";
        } else if (t.dtype == "I32") {
            std::vector<int32_t> v(numel);
            err = st_get_i32(st, t.name, t.shape, v.data());
        } else {
            err = t.name + " has dtype " + t.dtype + ", expected F32 or I32";
        }
        if (!err.empty()) return err;
    }

    auto it = st.meta.find("config");
    if (it == st.meta.end()) return path + ": no \"config\" in the metadata";
    Json c;
    err = json_parse(it->second, &c);
    if (!err.empty()) return path + ": config is not JSON: " + err;
    const Json* arch = c.get("architecture");
    if (!arch || arch->kind != Json::STR || arch->str != g.arch)
        return path + ": config architecture is not \"" + g.arch + "\"";
    if (!config_int(c, "vocab_size", g.V) || !config_int(c, "num_hidden_layers", g.L) ||
        !config_int(c, "hidden_size", g.d) || !config_int(c, "num_attention_heads", g.H) ||
        !config_int(c, "num_key_value_heads", g.R) || !config_int(c, "head_dim", g.hd) ||
        !config_int(c, "intermediate_size", g.F))
        return path + ": config shapes differ from tests/golden/README.md: " + it->second;
    const Json* tie = c.get("tie_word_embeddings");
    if (!tie || tie->kind != Json::BOOL || !tie->b) return path + ": tie_word_embeddings is not true";
    for (const char* key : {"lr", "router_lr", "weight_decay", "beta1", "beta2", "eps", "grad_clip"})
        if (!st.meta.count(key)) return path + ": metadata lacks " + key;

    struct Want { const char* name; const char* dtype; std::vector<int64_t> shape; };
    const Want wants[] = {
        {"expect.loss", "F32", {1}},
        {"expect.losses", "F32", {3}},
        {"expect.logits", "F32", {g.B, g.T, g.V}},
        {"batch.tokens", "I32", {g.B, g.T}},
        {"batch.targets", "I32", {g.B, g.T}},
        {"batch.mask", "F32", {g.B, g.T}},
        {"model.embed_tokens.weight", "F32", {g.V, g.d}},
        {"model.norm.weight", "F32", {g.d}},
        {"model.layers.0.self_attn.k_proj.weight", "F32", {g.R * g.hd, g.d}},
        {"expect.grad.model.layers.0.mlp.down_proj.weight", "F32", {g.d, g.F}},
    };
    for (const Want& w : wants) {
        const StTensor* t = st.find(w.name);
        if (!t) return path + ": no tensor " + w.name;
        if (t->dtype != w.dtype || t->shape != w.shape) return path + ": " + w.name + " has the wrong dtype or shape";
    }
    // Every model tensor has its gradient and its two updated versions.
    int model = 0;
    for (const StTensor& t : st.tensors) {
        if (t.name.compare(0, 6, "model.") != 0) continue;
        model++;
        for (const char* prefix : {"expect.grad.", "expect.step1.", "expect.step3."}) {
            const StTensor* e = st.find(prefix + t.name);
            if (!e || e->shape != t.shape) return path + ": missing or misshapen " + prefix + t.name;
        }
    }
    int routers = std::string(g.arch) == "lime" ? g.L - 1 : 0;
    int want_model = 2 + 9 * g.L + routers;
    if (model != want_model) return path + ": " + std::to_string(model) + " model tensors, expected " +
                                    std::to_string(want_model);
    if ((int)st.tensors.size() != 6 + 4 * want_model)
        return path + ": " + std::to_string(st.tensors.size()) + " tensors in all, expected " +
               std::to_string(6 + 4 * want_model);
    return "";
}

TEST(golden_llama_tiny_reads) {
    std::string err = check_golden(GOLDEN[0]);
    CHECK(err.empty(), "%s", err.c_str());
}

TEST(golden_lime_tiny_reads) {
    std::string err = check_golden(GOLDEN[1]);
    CHECK(err.empty(), "%s", err.c_str());
}

TEST(golden_lime_gqa_reads) {
    std::string err = check_golden(GOLDEN[2]);
    CHECK(err.empty(), "%s", err.c_str());
}

TEST(golden_rewrite_keeps_every_tensor_and_metadata) {
    SafeTensors in;
    std::string err = st_read(golden_path(GOLDEN[2]), &in);
    CHECK(err.empty(), "%s", err.c_str());
    StWriter w;
    w.meta = in.meta;
    for (const StTensor& t : in.tensors)
        w.add(t.name, t.dtype, t.shape, in.data.data() + t.begin, t.end - t.begin);
    const std::string path = scratch("rewrite.safetensors");
    err = st_write(path, w);
    CHECK(err.empty(), "%s", err.c_str());
    SafeTensors out;
    err = st_read(path, &out);
    CHECK(err.empty(), "%s", err.c_str());
    CHECK(out.meta == in.meta, "metadata changed");
    CHECK(out.tensors.size() == in.tensors.size(), "tensor count changed");
    for (size_t i = 0; i < in.tensors.size(); i++) {
        const StTensor &a = in.tensors[i], &b = out.tensors[i];
        CHECK(a.name == b.name, "tensor %zu: name %s, written back as %s", i, a.name.c_str(), b.name.c_str());
        CHECK(a.dtype == b.dtype, "%s: dtype %s, written back as %s", a.name.c_str(), a.dtype.c_str(), b.dtype.c_str());
        CHECK(a.shape == b.shape, "%s: the shape changed", a.name.c_str());
        uint64_t ca = st_checksum(in.data.data() + a.begin, a.end - a.begin);
        uint64_t cb = st_checksum(out.data.data() + b.begin, b.end - b.begin);
        CHECK(ca == cb, "%s: data changed", a.name.c_str());
    }
}

// ---------------------------------------------------------------------------
// Refusals of malformed files

static const std::string F32_2 = R"("dtype":"F32","shape":[2],"data_offsets":[0,8])";

TEST(st_read_refuses_a_missing_file) {
    SafeTensors st;
    std::string err = st_read(scratch("absent.safetensors"), &st);
    for (const char* part : {"cannot open", "does the file exist"})
        CHECK(contains(err, part), "the error lacks '%s': %s", part, err.c_str());
}

TEST(st_read_refuses_an_empty_file) {
    const std::string path = scratch("empty.safetensors");
    CHECK(write_bytes(path, {}), "cannot create %s", path.c_str());
    SafeTensors st;
    std::string err = st_read(path, &st);
    CHECK(contains(err, "empty"), "the error lacks 'empty': %s", err.c_str());
    CHECK(contains(err, path), "the error does not name the file: %s", err.c_str());
}

TEST(st_refuses_7_bytes) {
    std::vector<char> b(7, 0);
    std::string err = parse_bytes(b);
    CHECK(contains(err, "only 7 bytes"), "unclear error: %s", err.c_str());
    const std::string path = scratch("seven.safetensors");
    CHECK(write_bytes(path, b), "cannot create %s", path.c_str());
    SafeTensors st;
    err = st_read(path, &st);
    CHECK(contains(err, "only 7 bytes"), "st_read: unclear error: %s", err.c_str());
}

TEST(st_refuses_header_length_zero) {
    std::string err = parse_bytes(std::vector<char>(16, 0));
    CHECK(contains(err, "header length is 0"), "unclear error: %s", err.c_str());
}

TEST(st_refuses_header_length_beyond_the_file) {
    std::vector<char> b = make_file("{}", 0);
    b[0] = 100;  // claims a 100-byte header in a 10-byte file
    std::string err = parse_bytes(b);
    CHECK(contains(err, "header length 100 exceeds the file size 10"), "unclear error: %s", err.c_str());
}

TEST(st_refuses_header_length_over_the_limit) {
    std::vector<char> b = make_file("{}", 0);
    b[4] = 1;  // 2^32 + 2 bytes
    std::string err = parse_bytes(b);
    CHECK(contains(err, "limit"), "unclear error: %s", err.c_str());
}

TEST(st_refuses_header_not_json) {
    std::string err = expect_refusal("{not json}", 0, "not valid JSON");
    CHECK(err.empty(), "%s", err.c_str());
}

TEST(st_refuses_header_not_an_object) {
    std::string err = expect_refusal("[1, 2]", 0, "not a JSON object");
    CHECK(err.empty(), "%s", err.c_str());
}

TEST(st_refuses_data_offsets_out_of_range) {
    std::string err = expect_refusal("{\"a\":{" + F32_2 + "}}", 4, "beyond the 4 data bytes");
    CHECK(err.empty(), "%s", err.c_str());
}

TEST(st_refuses_data_offsets_backwards) {
    std::string err = expect_refusal(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8, "end before");
    CHECK(err.empty(), "%s", err.c_str());
}

TEST(st_refuses_data_offsets_of_wrong_form) {
    const char* cases[] = {"[0]", "[0,8,9]", "[0,\"8\"]", "[-8,0]", "[0,8.5]", "{}", "null"};
    for (const char* off : cases) {
        std::string h = std::string(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":)") + off + "}}";
        std::string err = expect_refusal(h, 16, "data_offsets");
        CHECK(err.empty(), "%s", err.c_str());
    }
}

TEST(st_refuses_size_shape_mismatch) {
    std::string err = expect_refusal(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, "mismatch");
    CHECK(err.empty(), "%s", err.c_str());
}

TEST(st_refuses_overlapping_tensors) {
    std::string h = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
    std::string err = expect_refusal(h, 12, "overlap");
    CHECK(err.empty(), "%s", err.c_str());
}

TEST(st_accepts_empty_tensors_anywhere) {
    std::string h = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                    R"("e":{"dtype":"F32","shape":[0,5],"data_offsets":[4,4]}})";
    std::string err = parse_bytes(make_file(h, 8));
    CHECK(err.empty(), "an empty tensor owns no bytes and overlaps nothing: %s", err.c_str());
}

TEST(st_refuses_unknown_dtype) {
    std::string err = expect_refusal(R"({"a":{"dtype":"F7","shape":[2],"data_offsets":[0,8]}})", 8, "unknown dtype \"F7\"");
    CHECK(err.empty(), "%s", err.c_str());
}

TEST(st_refuses_duplicate_tensor_name) {
    std::string err = expect_refusal("{\"a\":{" + F32_2 + "},\"a\":{" + F32_2 + "}}", 8, "duplicate");
    CHECK(err.empty(), "%s", err.c_str());
}

TEST(st_refuses_metadata_not_a_string) {
    std::string err = expect_refusal(R"({"__metadata__":{"lr":0.01}})", 0, "not a string");
    CHECK(err.empty(), "%s", err.c_str());
    err = expect_refusal(R"({"__metadata__":"lr"})", 0, "__metadata__ is not a JSON object");
    CHECK(err.empty(), "%s", err.c_str());
}

TEST(st_refuses_missing_or_mistyped_fields) {
    struct Case { const char* entry; const char* word; };
    const Case cases[] = {
        {R"({"shape":[2],"data_offsets":[0,8]})", "\"dtype\" missing"},
        {R"({"dtype":4,"shape":[2],"data_offsets":[0,8]})", "\"dtype\" missing or not a string"},
        {R"({"dtype":"F32","data_offsets":[0,8]})", "\"shape\" missing"},
        {R"({"dtype":"F32","shape":2,"data_offsets":[0,8]})", "\"shape\" missing or not an array"},
        {R"({"dtype":"F32","shape":[2]})", "\"data_offsets\" missing"},
        {R"([1])", "not a JSON object"},
    };
    for (const Case& c : cases) {
        std::string err = expect_refusal(std::string("{\"a\":") + c.entry + "}", 8, c.word);
        CHECK(err.empty(), "%s", err.c_str());
    }
}

TEST(st_refuses_bad_dimensions) {
    const char* cases[] = {"[-2]", "[2.5]", "[\"2\"]", "[1e300]", "[null]", "[[2]]"};
    for (const char* shape : cases) {
        std::string h = std::string(R"({"a":{"dtype":"F32","shape":)") + shape + R"(,"data_offsets":[0,8]}})";
        std::string err = expect_refusal(h, 8, "not a non-negative integer");
        CHECK(err.empty(), "%s", err.c_str());
    }
}

TEST(st_refuses_numel_overflow) {
    std::string h = R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,8]}})";
    std::string err = expect_refusal(h, 8, "too many elements");
    CHECK(err.empty(), "%s", err.c_str());
}

// ---------------------------------------------------------------------------
// Robustness: damaged copies of a real file must be refused or read, never crash.

static std::string check_parsed(const std::vector<char>& b, bool* accepted) {
    SafeTensors st;
    std::string err = st_parse(b.data(), b.size(), &st, "damaged");
    *accepted = err.empty();
    if (!err.empty()) return (err.compare(0, 9, "damaged: ") == 0) ? "" : "error does not name the file: " + err;
    for (const StTensor& t : st.tensors) {
        uint64_t bytes = st_dtype_size(t.dtype);
        for (int64_t d : t.shape) bytes *= (uint64_t)d;
        if (t.begin > t.end || t.end > st.data.size() || t.end - t.begin != bytes)
            return "accepted " + t.name + " with a byte range that does not fit";
    }
    return "";
}

TEST(st_parse_survives_truncation) {
    std::vector<char> good = read_bytes(golden_path(GOLDEN[0]));
    CHECK(!good.empty(), "cannot read %s (run from the repository root)", golden_path(GOLDEN[0]).c_str());
    std::mt19937 rng(1234);
    for (int i = 0; i < 200; i++) {
        size_t cut = i < 20 ? (size_t)i : rng() % good.size();
        std::vector<char> b(good.begin(), good.begin() + cut);
        bool accepted;
        std::string err = check_parsed(b, &accepted);
        CHECK(err.empty(), "cut at %zu: %s", cut, err.c_str());
        CHECK(!accepted, "accepted the file cut at byte %zu of %zu", cut, good.size());
    }
}

TEST(st_parse_survives_byte_flips) {
    std::vector<char> good = read_bytes(golden_path(GOLDEN[0]));
    CHECK(good.size() > 8, "cannot read %s (run from the repository root)", golden_path(GOLDEN[0]).c_str());
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | (unsigned char)good[i];
    std::mt19937 rng(5678);
    int refused = 0;
    for (int i = 0; i < 200; i++) {
        std::vector<char> b = good;
        int flips = 1 + rng() % 4;
        for (int k = 0; k < flips; k++) {
            // Mostly inside the prefix and header, where a flip matters.
            size_t at = (rng() % 4) ? rng() % (8 + hlen) : rng() % b.size();
            b[at] = (char)(rng() & 0xFF);
        }
        bool accepted;
        std::string err = check_parsed(b, &accepted);
        CHECK(err.empty(), "iteration %d: %s", i, err.c_str());
        refused += !accepted;
    }
    CHECK(refused > 0, "no damaged copy was refused: are the flips landing?");
}

TEST(json_parse_survives_random_text) {
    const char alphabet[] = "{}[]:,\"\\ u0123456789abcdefEe.+-tfnrl\xc3\xa9\xff";
    std::mt19937 rng(42);
    for (int i = 0; i < 2000; i++) {
        std::string s(rng() % 40, ' ');
        for (char& c : s) c = alphabet[rng() % (sizeof alphabet - 1)];
        Json v;
        std::string err = json_parse(s, &v);
        if (err.empty()) {  // whatever it accepted must dump to text it accepts again
            Json back;
            std::string err2 = json_parse(json_dump(v), &back);
            CHECK(err2.empty(), "[%s] accepted, but its dump %s is refused: %s", s.c_str(), json_dump(v).c_str(), err2.c_str());
            CHECK(json_dump(back) == json_dump(v), "[%s] does not round-trip", s.c_str());
        }
    }
}

// ---------------------------------------------------------------------------

TEST(st_checksum_is_fnv1a_64) {
    CHECK(st_checksum("", 0) == 0xcbf29ce484222325ULL, "empty input");
    CHECK(st_checksum("a", 1) == 0xaf63dc4c8601ec8cULL, "\"a\"");
    CHECK(st_checksum("foobar", 6) == 0x85944171f73967e8ULL, "\"foobar\"");
}
