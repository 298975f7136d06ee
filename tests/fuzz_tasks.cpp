// tests/fuzz_tasks.cpp — libFuzzer target for the task code that reads text
// from outside: a text file for --task text (text_load), token strings a
// model generated (arith_eval, arith_check_step, arith_chain_quality),
// prompts (Vocab::encode), settings stored in a checkpoint
// (settings_from_json) and a ProsQA JSON file (prosqa_load_json). Built and
// run by `make fuzz`; seeds in tests/fuzz_corpus/tasks/.
//
// The first byte picks the reader, the second and third its parameters
// (T, the prime p, ...); the rest is the text. Besides "no crash, no
// sanitizer report", each reader checks a promise the code makes; a broken
// one traps, which libFuzzer reports like a crash.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "data/prosqa.h"
#include "data/task.h"

static void require(bool ok, const char* what) {
    if (!ok) {
        fprintf(stderr, "fuzz_tasks: broken promise: %s\n", what);
        __builtin_trap();
    }
}

// The readers that take a path get the text through this file (one per process).
static std::string as_file(const std::string& text) {
    static const std::string path = std::string(getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp") + "/fuzz_tasks." +
                                    std::to_string(getpid()) + ".txt";
    FILE* f = fopen(path.c_str(), "wb");
    require(f != nullptr, "cannot write the temporary file");
    fwrite(text.data(), 1, text.size(), f);
    fclose(f);
    return path;
}

static std::vector<std::string> split(const std::string& s) {  // on spaces and newlines, as Vocab::encode does
    std::vector<std::string> out;
    size_t i = 0;
    while (i < s.size()) {
        if (s[i] == ' ' || s[i] == '\n') { i++; continue; }
        size_t j = s.find_first_of(" \n", i);
        if (j == std::string::npos) j = s.size();
        out.push_back(s.substr(i, j - i));
        i = j;
    }
    return out;
}

static const int PRIMES[] = {2, 3, 5, 7, 11, 13, 97, 997};

// text_load: every window is T+1 bytes of the file, and the windows cover it.
static void fuzz_text_load(uint8_t a, uint8_t b, const std::string& text) {
    int T = 1 + a % 32;
    double val_frac = (b % 10) / 10.0;
    TextData td;
    if (!text_load(as_file(text), T, val_frac, &td).empty()) return;
    for (const std::vector<Sequence>* part : {&td.train, &td.val})
        for (const Sequence& s : *part) {
            require(s.tokens.size() >= 2 && s.tokens.size() <= (size_t)T + 1, "a text window has the wrong length");
            for (int t : s.tokens) require(t >= 0 && t < 256, "a byte token is outside 0..255");
        }
    require(!td.train.empty(), "text_load accepted a file but made no training window");
}

// arith_eval and arith_check_step on "cur | next": a value lies in 0..p-1;
// a valid step keeps the value and makes the line shorter.
static void fuzz_arith(uint8_t a, const std::string& text) {
    int p = PRIMES[a % 8];
    size_t bar = text.find('|');
    std::vector<std::string> cur = split(text.substr(0, bar)), next;
    if (bar != std::string::npos) next = split(text.substr(bar + 1));
    int v = -1, w = -1;
    if (arith_eval(cur, p, &v).empty()) {
        require(v >= 0 && v < p, "arith_eval gave a value outside 0..p-1");
        arith_unneeded_brackets(cur);
    }
    if (arith_check_step(cur, next, p).empty()) {
        require(arith_eval(cur, p, &v).empty() && arith_eval(next, p, &w).empty() && v == w, "a valid step changed the value");
        require(next.size() < cur.size(), "a valid step did not shorten the line");
    }
    if (cur.size() <= 64 && next.size() <= 64) arith_same_function(cur, next);
}

// Vocab::encode then decode gives the tokens back, spaces normalised; and
// arith_chain_quality reads any encoded prompt and continuation.
static void fuzz_encode(uint8_t a, const std::string& text) {
    int p = PRIMES[a % 8];
    Vocab v = arith_vocab(p);
    std::vector<int> ids;
    if (v.encode(text, &ids).empty()) {
        std::string joined;
        for (const std::string& t : split(text)) joined += (joined.empty() ? "" : " ") + t;
        require(v.decode(ids.data(), (int)ids.size()) == joined, "arith vocabulary: decode(encode(text)) != text");
        arith_chain_quality(v, ids, p);
        arith_correct(v, ids, 0);
    }
    Vocab bytes = text_vocab();
    ids.clear();
    require(bytes.encode(text, &ids).empty(), "the byte vocabulary refused some text");
    require(bytes.decode(ids.data(), (int)ids.size()) == text, "byte vocabulary: decode(encode(text)) != text");
}

// settings_from_json (a checkpoint's "task" and "args"): every value is a string.
static void fuzz_settings(const std::string& text) {
    std::map<std::string, std::string> s;
    settings_from_json(text, &s);
    std::map<std::string, std::string> again;
    require(settings_from_json(settings_to_json(s), &again).empty() && again == s, "settings_to_json does not round-trip");
}

// prosqa_load_json: an accepted file is a non-empty list of items that pass
// prosqa_check (the load checks their meaning), tokenise and become sequences.
static void fuzz_prosqa(const std::string& text) {
    std::vector<ProsqaItem> items;
    if (!prosqa_load_json(as_file(text), &items).empty()) return;
    require(!items.empty(), "prosqa_load_json accepted an empty list");
    Vocab v = prosqa_vocab(items);
    for (const ProsqaItem& it : items) {
        require(prosqa_check(it).empty(), "prosqa_load_json accepted an item prosqa_check refuses");
        std::vector<int> ids;
        if (prosqa_tokenize(v, prosqa_prompt(it) + prosqa_target(it), &ids).empty()) prosqa_detokenize(v, ids.data(), (int)ids.size());
        Sequence seq;
        prosqa_sequence(v, it, &seq);
        prosqa_correct(prosqa_target(it), it.answer);
    }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 3) return 0;
    std::string text((const char*)data + 3, size - 3);
    switch (data[0] % 5) {
        case 0: fuzz_text_load(data[1], data[2], text); break;
        case 1: fuzz_arith(data[1], text); break;
        case 2: fuzz_encode(data[1], text); break;
        case 3: fuzz_settings(text); break;
        case 4: fuzz_prosqa(text); break;
    }
    return 0;
}
