// support/commands/load.cpp — a model trained by ./lime train, loaded with
// its task (eval, sample and analyze), and the two checks a resumed run shares
// with them: the vocabulary it stored, and the data files it was trained on.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "data/task.h"
#include "support/commands/commands.h"
#include "support/lib/cli.h"
#include "support/lib/safetensors.h"
#include "support/model/lime.h"

// One line when a data file differs from the one the checkpoint was trained
// and scored on (its fingerprint in the metadata), else "". Not fatal: the
// file may have been moved or re-saved on purpose.
std::string data_files_changed(const std::map<std::string, std::string>& meta,
                               const std::map<std::string, std::string>& ts) {
    std::map<std::string, std::string> then;
    auto it = meta.find("data_files");
    if (it == meta.end() || !settings_from_json(it->second, &then).empty()) return "";
    std::map<std::string, std::string> files = task_data_files(ts);
    for (auto& [key, fp] : then) {
        if (!files.count(key) || fp.empty()) continue;
        std::string now = file_fingerprint(files[key], FILE_MAX_TEXT);
        if (now.empty() || now == fp) continue;
        return "--" + key + " " + files[key] + " differs from the file this model was trained and scored on (bytes:fnv1a64 " +
               fp + " then, " + now + " now): results are on other data now; restore the file to compare like with like";
    }
    return "";
}

// A checkpoint's "vocab" must be its task's vocabulary, token for token: a
// task entry changed to another task would index embedding rows past V.
std::string vocab_matches(const std::string& path, const std::vector<std::string>& stored, const Vocab& v) {
    if (stored == v.tokens) return "";
    return path + ": its metadata \"vocab\" (" + std::to_string(stored.size()) + " tokens) is not the vocabulary " +
           "of its task as rebuilt now (" + std::to_string(v.tokens.size()) + " tokens): the file was altered, or " +
           "the task's data file changed since; use the data it was trained on, an earlier checkpoint, or train again";
}

// ===========================================================================
// Loading a trained model with its task (eval, sample, analyze)
// ===========================================================================

void warn_data_changed(const char* cmd, const Loaded& ld) {
    if (!ld.data_changed.empty()) fprintf(stderr, "lime %s: warning: %s\n", cmd, one_line(ld.data_changed).c_str());
}

// A checkpoint written by train, in a model made for batches of B; with
// need_task its task is rebuilt (test set included), else only its vocabulary.
std::string load_checkpoint(const std::string& path, Device dev, const ModelSettings& settings, int B, Loaded* out,
                            bool need_task) {
    Config c;
    std::string err = checkpoint_read_config(path, &c, &out->meta);
    if (!err.empty()) return err;
    TrainMeta tm;  // the checksum required, every field checked before use
    err = checkpoint_check_meta(path, c, out->meta, &tm);
    if (!err.empty()) return err;
    err = model_create(&out->model, c, B, dev, settings);
    if (!err.empty()) return err;
    err = model_load(&out->model, path, false);
    if (!err.empty()) return err;
    std::map<std::string, std::string> ts;
    if (!out->meta.count("task") || !settings_from_json(out->meta["task"], &ts).empty())
        return path + ": no task settings in the metadata; was it written by ./lime train?";
    if (need_task) {
        // the test set alone (ProsQA's training set, up to 1,000,000 generated items, only sized T)
        err = task_build(ts, c.T, &out->task, memory_available("/proc/meminfo"), false);
        if (!err.empty()) return path + ": rebuilding its task: " + err;
        if (out->task.vocab.size() != c.V)
            return path + ": its task has " + std::to_string(out->task.vocab.size()) + " tokens but the model " +
                   std::to_string(c.V);
        // the model reads T positions (T + 1 tokens with the last target): a longer sequence would run past its tables
        if (out->task.T > c.T) {
            std::map<std::string, std::string> files = task_data_files(ts);
            std::string src = files.empty() ? "its " + ts["task"] + " task" : files.begin()->second;
            return path + ": " + src + " has a sequence of " + std::to_string(out->task.T + 1) +
                   " tokens, longer than the " + std::to_string(c.T + 1) + " this model holds (T = " +
                   std::to_string(c.T) + "); restore the data it was trained on, or train a new model on this";
        }
        if (out->task.kind == "prosqa") out->task.T = c.T;  // the training set's longest too, as it was trained

    } else {
        out->task.kind = ts["task"];
        out->task.settings = ts;
        const std::string& p = ts["modulus"];
        if (ts["task"] == "arith" && (p.empty() || p.size() > 3 || p.find_first_not_of("0123456789") != std::string::npos ||
                                      atoi(p.c_str()) < 2))
            return path + ": its metadata \"task\" has no \"modulus\" in 2 .. 997: the file was altered or damaged; "
                          "use an earlier checkpoint or train again";
        out->task.vocab = ts["task"] == "text"     ? text_vocab()
                          : ts["task"] == "prosqa" ? prosqa_vocab()
                                                   : arith_vocab(atoi(p.c_str()));
        // ProsQA's vocabulary is its fixed words, then those of the test file it was built with: those from the file
        Vocab& v = out->task.vocab;
        size_t fixed = v.tokens.size();
        if (ts["task"] == "prosqa" && tm.vocab.size() > fixed && std::equal(v.tokens.begin(), v.tokens.end(), tm.vocab.begin()))
            for (size_t i = fixed; i < tm.vocab.size(); i++) {
                v.ids.emplace(tm.vocab[i], (int)i);
                v.tokens.push_back(tm.vocab[i]);
            }
    }
    out->data_changed = data_files_changed(out->meta, ts);
    return vocab_matches(path, tm.vocab, out->task.vocab);
}
