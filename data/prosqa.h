// data/prosqa.h — ProsQA (docs/tasks.md §2; Hao et al. 2024, "Coconut"): questions
// about reachability in a small random DAG of "is a" facts, e.g.
//
//   Every shumpus is a rempus. Tom is a terpus. ... Is Tom a lempus or scrompus?
//   Tom is a terpus.
//   Every terpus is a brimpus.
//   Every brimpus is a lempus.
//   ### Tom is a lempus.
//
// Test items come from the real files (data/prosqa/prosqa_{valid,test}.json);
// training items from our implementation of the generator (Coconut,
// Appendix A.2, Algorithm 1). Text is cut into whole words and punctuation.
//
// Every function that can fail returns a std::string: "" on success, else one
// line naming the problem.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "support/lib/rng.h"
#include "data/tasks.h"

// One item, with the fields (and names) of the real JSON files.
struct ProsqaItem {
    std::string question;                     // one sentence per edge, then "Is Name a A or B?"
    std::string answer;                       // "Name is a A."
    std::vector<std::string> steps;           // the path from the person to A, one sentence per edge
    std::vector<std::string> idx_to_symbol;   // node -> name ("Tom") or concept ("lempus")
    std::vector<std::pair<int, int>> edges;   // [parent, child]: "every child-of... parent is a child"
    int root = 0, target = 0, neg_target = 0; // the person, A (reachable), B (not reachable)
};

// Reads a real ProsQA file: a non-empty JSON list of items (opened with
// file_open_regular, at most FILE_MAX_JSON). Checks every field's type, that
// node indices are in range, and each item's meaning (prosqa_check); the
// error names the file and the first bad item's index.
std::string prosqa_load_json(const std::string& path, std::vector<ProsqaItem>* out);

// Is the item consistent? Symbols distinct; the edges form no cycle; root
// reaches target and not neg_target, both leaves; the question states exactly
// the edges (in any order) and asks about target and neg_target; the steps
// walk edges from the root to the target, and the answer names them. "" or
// the first problem.
std::string prosqa_check(const ProsqaItem& item);

// ---------------------------------------------------------------------------
// The generator.

struct ProsqaGenSettings {
    int nodes = 23;               // nodes drawn; isolated ones are then dropped
    double mean_parents = 1.5;    // n ~ Poisson(mean_parents) parents per new node
    double p_side = 0.35;         // chance of parents only from "neither or only node 0" (same for node 1)
    double depth_weight = 1.5;    // a candidate parent has weight depth_weight * depth + 1
    // A draw of n = 0 (a new parentless node, i.e. one more person) is kept
    // with this probability, else n is drawn again. 1 is Algorithm 1 to the
    // letter: it gives about 4.2 persons and 30 edges per graph; the real
    // files have 2.56 persons and 36 edges, which 0.2 reproduces (see
    // tests/test_prosqa.cpp, generator_averages).
    double keep_parentless = 0.2;
    int min_steps = 3, max_steps = 6;   // the real files' range of path lengths
    // An item whose path has just min_steps edges is kept with this
    // probability. The graphs give 57% / 31% / 10% / 2% paths of 3 / 4 / 5 / 6
    // steps; the real files have 41 / 44 / 13 / 2.4%, which halving the
    // 3-step items reproduces. 1: no thinning.
    double keep_shortest = 0.5;
};

// The 17 person names of the real files.
std::vector<std::string> prosqa_names();
// Invented concept words, onset + vowel + (m|r|l) + "pus" ("shumpus",
// "boompus", "felpus", ...): 375 words, every concept word of the real files among them.
std::vector<std::string> prosqa_concepts();

// One item: draws graphs until one has a target at min_steps..max_steps from
// the person and a negative target (gives up with an error after 10,000).
std::string prosqa_generate(Rng& rng, ProsqaItem* out, const ProsqaGenSettings& s = ProsqaGenSettings());

// ---------------------------------------------------------------------------
// Text, tokens and sequences.

// question "\n" (prompt), then each step "\n", then "### " answer (target).
std::string prosqa_prompt(const ProsqaItem& item);
std::string prosqa_target(const ProsqaItem& item);

// "<pad>" "<eos>", punctuation and the fixed words, the names, the concepts,
// then any other word of `items` (none for the real files: the concept list
// covers them), in order of first appearance.
Vocab prosqa_vocab(const std::vector<ProsqaItem>& items = {});

// Tokens: runs of letters, digits or non-ASCII (UTF-8) bytes, runs of '#', "\n", and every other
// non-space character alone; spaces separate. Appends the ids to *out;
// "" or the first unknown word.
std::string prosqa_tokenize(const Vocab& v, const std::string& text, std::vector<int>* out);
// The inverse on text prosqa_prompt/target make: words joined by spaces, none
// before "." "?" "\n" or after "\n". Special tokens show as "<eos>" etc.; cut
// generated ids at the first <eos> first.
std::string prosqa_detokenize(const Vocab& v, const int* ids, int n);

// prompt + target + <eos>, loss_start = the first token after the prompt.
std::string prosqa_sequence(const Vocab& v, const ProsqaItem& item, Sequence* out);

struct ProsqaData {
    Vocab vocab;
    std::vector<Sequence> train, test;       // test: prompt, then the real steps and answer
    std::vector<std::string> test_answers;   // "Name is a A." per test item
    int seq_len = 0;                         // longest sequence minus 1: the T a model needs
};

// Training items from the generator (default settings, seeded from `seed`),
// test items from the real file at test_json_path. At most PROSQA_MAX_TRAIN
// training items (about 200 us and 1.5 KB each); mem_bytes > 0: refused
// before generating when they would need more memory than that. with_train
// false: no training item is generated (the vocabulary and the test items,
// which come from the test file alone, are the same); seq_len is then the
// test items' longest minus 1.
constexpr int PROSQA_MAX_TRAIN = 1000000;
std::string prosqa_build(int train_size, uint64_t seed, const std::string& test_json_path, ProsqaData* out,
                         uint64_t mem_bytes = 0, bool with_train = true);

// Scoring: the generated text after its last '#', trimmed, equals the answer.
bool prosqa_correct(const std::string& generated_text, const std::string& answer);
