// data/task.cpp — a task built from its settings (see data/tasks.h, Task).
#include <algorithm>
#include <cstdlib>
#include <unistd.h>

#include "data/task.h"
#include "support/lib/cli.h"  // exe_dir
#include "support/lib/safetensors.h"

std::string task_data_path(const std::string& path) {
    if (path.empty() || path[0] == '/' || access(path.c_str(), F_OK) == 0) return path;
    for (const char* up : {"/", "/../"}) {  // beside the program, or above it (build/lime-asan)
        std::string there = exe_dir() + up + path;
        if (access(there.c_str(), F_OK) == 0) return there;
    }
    return path;
}

std::map<std::string, std::string> task_data_files(const std::map<std::string, std::string>& s) {
    std::map<std::string, std::string> files;
    auto task = s.find("task");
    const char* key = task == s.end() ? "" : task->second == "text" ? "text-file" : task->second == "prosqa" ? "prosqa-test" : "";
    auto it = *key ? s.find(key) : s.end();
    if (it != s.end() && !it->second.empty()) files[key] = task_data_path(it->second);
    return files;
}

// A task setting that must be a whole number (the flags check theirs; a
// checkpoint's settings are text anyone can edit): "" and *out, or the problem.
// "3abc" or "" is refused, never read as 3 or 0 by atoi.
static std::string setting_int(const std::map<std::string, std::string>& s, const char* key, long long hi,
                               long long* out) {
    auto it = s.find(key);
    const std::string v = it == s.end() ? "" : it->second;
    size_t from = !v.empty() && v[0] == '+' ? 1 : 0;  // as strtoll took it from the flag
    bool digits = v.size() > from && v.size() <= 19 && v.find_first_not_of("0123456789", from) == std::string::npos;
    *out = digits ? strtoll(v.c_str(), nullptr, 10) : -1;
    if (!digits || *out > hi)
        return std::string("the task setting \"") + key + "\" is '" + v + "', not a whole number in 0 .. " +
               std::to_string(hi);
    return "";
}

std::string task_build(const std::map<std::string, std::string>& s, int text_T, Task* t, uint64_t mem_bytes,
                       bool with_train) {
    auto get = [&](const char* k) { auto it = s.find(k); return it == s.end() ? std::string() : it->second; };
    t->kind = get("task");
    t->settings = s;
    long long ops = 0, modulus = 0, train = 0, test = 0, seed = 0;
    const long long big = 1LL << 31;  // the flags' own bounds are checked below, as for a flag
    std::string bad;
    for (auto [key, dst] : {std::pair<const char*, long long*>{"train-size", &train}, {"test-size", &test}})
        if (bad.empty() && t->kind != "text") bad = setting_int(s, key, big - 1, dst);
    if (bad.empty() && t->kind != "text") bad = setting_int(s, "data-seed", (1LL << 62), &seed);
    if (t->kind == "arith")
        for (auto [key, dst] : {std::pair<const char*, long long*>{"ops", &ops}, {"modulus", &modulus}})
            if (bad.empty()) bad = setting_int(s, key, big - 1, dst);
    if (bad.empty() && t->kind == "arith" && get("format") != "chain" && get("format") != "direct")
        bad = "the task setting \"format\" is '" + get("format") + "', not chain or direct";
    double val_frac = 0;
    if (bad.empty() && t->kind == "text") {
        std::string v = get("val-frac");
        char* end = nullptr;
        val_frac = strtod(v.c_str(), &end);
        if (v.empty() || *end || !(val_frac >= 0 && val_frac <= 0.9))
            bad = "the task setting \"val-frac\" is '" + v + "', not a number in 0 .. 0.9";
    }
    if (!bad.empty()) return bad;
    if (t->kind == "arith") {
        ArithSettings as;
        as.p = (int)modulus;
        as.ops = (int)ops;
        as.chain = get("format") != "direct";
        as.train_size = (int)train;
        as.test_size = (int)test;
        as.seed = (uint64_t)seed;
        std::string err = arith_check_settings(as);
        if (err.empty()) err = arith_check_size(as, mem_bytes);
        if (err.empty()) err = arith_generate(as, &t->arith);
        if (!err.empty()) return err;
        t->vocab = t->arith.vocab;
        t->train = &t->arith.train;
        t->test = &t->arith.test;
        t->T = t->arith.seq_len;
        return "";
    }
    if (t->kind == "prosqa") {
        std::string err = prosqa_build((int)train, (uint64_t)seed,
                                       task_data_path(get("prosqa-test")), &t->prosqa, mem_bytes, with_train);
        if (!err.empty()) return err;
        size_t keep = std::min(t->prosqa.test.size(), (size_t)test);
        t->prosqa.test.resize(keep);
        t->prosqa.test_answers.resize(keep);
        t->vocab = t->prosqa.vocab;
        t->train = &t->prosqa.train;
        t->test = &t->prosqa.test;
        t->T = t->prosqa.seq_len;
        return "";
    }
    if (t->kind == "text") {
        std::string path = get("text-file");
        if (path.empty()) return "--task text needs --text-file FILE (any UTF-8 text)";
        std::string err = text_load(task_data_path(path), text_T, val_frac, &t->text, mem_bytes);
        if (!err.empty()) return err;
        t->vocab = t->text.vocab;
        t->train = &t->text.train;
        t->test = &t->text.val;
        t->T = text_T;
        t->settings["seq-len"] = std::to_string(text_T);
        return "";
    }
    return "--task '" + t->kind + "' is not one of arith|prosqa|text";
}

std::string settings_to_json(const std::map<std::string, std::string>& s) {
    std::string out = "{";
    for (auto& kv : s) out += (out.size() > 1 ? ", " : "") + json_quote(kv.first) + ": " + json_quote(kv.second);
    return out + "}";
}

std::string settings_from_json(const std::string& text, std::map<std::string, std::string>* s) {
    Json j;
    std::string err = json_parse(text, &j);
    if (!err.empty() || j.kind != Json::OBJ) return "settings are not a JSON object";
    for (auto& kv : j.obj) {
        if (kv.second.kind != Json::STR) return "setting \"" + kv.first + "\" is not a string";
        (*s)[kv.first] = kv.second.str;
    }
    return "";
}

std::string vocab_to_json(const Vocab& v) {
    std::string out = "[";
    for (size_t i = 0; i < v.tokens.size(); i++) out += (i ? ", " : "") + json_quote(v.tokens[i]);
    return out + "]";
}

