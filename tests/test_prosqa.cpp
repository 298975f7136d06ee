// tests/test_prosqa.cpp — ProsQA: the real files, the generator's invariants
// and averages, tokens, scoring, bad input. Run from the repository root
// (the real files are read from data/prosqa/).
#include <algorithm>
#include <cstdio>
#include <set>

#include "data/prosqa.h"
#include "test.h"

static const char* VALID = "data/prosqa/prosqa_valid.json";
static const char* TEST_FILE = "data/prosqa/prosqa_test.json";

static std::string load_both(std::vector<ProsqaItem>* valid, std::vector<ProsqaItem>* test) {
    std::string err = prosqa_load_json(VALID, valid);
    return err.empty() ? prosqa_load_json(TEST_FILE, test) : err;
}

struct GraphAverages { double nodes = 0, edges = 0, steps = 0, persons = 0; };

static GraphAverages averages(const std::vector<ProsqaItem>& items) {
    GraphAverages a;
    for (auto& it : items) {
        std::vector<bool> has_parent(it.idx_to_symbol.size(), false);
        for (auto& e : it.edges) has_parent[e.second] = true;
        a.nodes += (double)it.idx_to_symbol.size();
        a.edges += (double)it.edges.size();
        a.steps += (double)it.steps.size();
        for (bool p : has_parent) a.persons += !p;
    }
    double n = (double)items.size();
    a.nodes /= n, a.edges /= n, a.steps /= n, a.persons /= n;
    return a;
}

TEST(prosqa_real_files_load_and_are_consistent) {
    std::vector<ProsqaItem> valid, test;
    std::string err = load_both(&valid, &test);
    CHECK(err.empty(), "%s", err.c_str());
    CHECK(valid.size() == 300 && test.size() == 500, "sizes %zu and %zu, expected 300 and 500", valid.size(), test.size());
    for (auto* items : {&valid, &test})
        for (size_t i = 0; i < items->size(); i++) {
            err = prosqa_check((*items)[i]);
            CHECK(err.empty(), "real item %zu: %s", i, err.c_str());
        }
    const ProsqaItem& first = valid[0];   // spot check against the file
    CHECK(first.root == 1 && first.target == 16 && first.neg_target == 13 && first.answer == "Tom is a lempus.",
          "valid[0] read wrongly: root %d target %d neg %d answer '%s'", first.root, first.target,
          first.neg_target, first.answer.c_str());
}

TEST(prosqa_generated_graphs_keep_invariants) {
    for (uint64_t seed = 0; seed < 500; seed++) {
        Rng rng(seed_for(seed, "prosqa-test"));
        ProsqaItem it;
        std::string err = prosqa_generate(rng, &it);
        CHECK(err.empty(), "seed %llu: %s", (unsigned long long)seed, err.c_str());
        err = prosqa_check(it);   // person reaches A, not B; steps follow edges; text matches the graph
        CHECK(err.empty(), "seed %llu: %s\n%s", (unsigned long long)seed, err.c_str(), it.question.c_str());
        CHECK(it.steps.size() >= 3 && it.steps.size() <= 6, "seed %llu: %zu steps", (unsigned long long)seed, it.steps.size());
    }
    Rng a(7), b(7);   // deterministic
    ProsqaItem x, y;
    prosqa_generate(a, &x);
    prosqa_generate(b, &y);
    CHECK(x.question == y.question && x.steps == y.steps, "the same seed gave two different items");
}

TEST(prosqa_generator_averages) {
    std::vector<ProsqaItem> valid, test, gen(2000);
    std::string err = load_both(&valid, &test);
    CHECK(err.empty(), "%s", err.c_str());
    valid.insert(valid.end(), test.begin(), test.end());
    Rng rng(123);
    for (auto& it : gen) CHECK((err = prosqa_generate(rng, &it)).empty(), "%s", err.c_str());
    GraphAverages r = averages(valid), g = averages(gen);
    printf("  real (800):      %.2f nodes, %.2f edges, %.2f steps, %.2f persons\n", r.nodes, r.edges, r.steps, r.persons);
    printf("  generated (2000): %.2f nodes, %.2f edges, %.2f steps, %.2f persons\n", g.nodes, g.edges, g.steps, g.persons);
    int hist[8] = {0};
    for (auto& it : gen) hist[std::min<size_t>(it.steps.size(), 7)]++;
    printf("  generated steps 3/4/5/6: %.1f%% %.1f%% %.1f%% %.1f%% (real 40.8 43.8 13.1 2.4)\n",
           hist[3] / 20.0, hist[4] / 20.0, hist[5] / 20.0, hist[6] / 20.0);
    // the real files: 22.81 nodes, 36.00 edges, 3.77 steps, 2.56 persons
    CHECK(std::fabs(g.nodes - r.nodes) < 1 && std::fabs(g.edges - r.edges) < 2 && std::fabs(g.steps - r.steps) < 0.15 &&
              std::fabs(g.persons - r.persons) < 0.5,
          "generated averages drifted from the real files");
}

TEST(prosqa_tokenize_round_trip) {
    std::vector<ProsqaItem> valid, test;
    std::string err = load_both(&valid, &test);
    CHECK(err.empty(), "%s", err.c_str());
    Vocab v = prosqa_vocab();
    Rng rng(5);
    std::vector<ProsqaItem> items(valid.begin(), valid.begin() + 50);
    for (int i = 0; i < 50; i++) { items.emplace_back(); prosqa_generate(rng, &items.back()); }
    for (auto& it : items) {
        std::string text = prosqa_prompt(it) + prosqa_target(it);
        std::vector<int> ids;
        CHECK((err = prosqa_tokenize(v, text, &ids)).empty(), "%s", err.c_str());
        std::string back = prosqa_detokenize(v, ids.data(), (int)ids.size());
        CHECK(back == text, "round trip changed the text:\n%s\n---\n%s", text.c_str(), back.c_str());
    }
    std::vector<int> ids;   // the pieces
    CHECK(prosqa_tokenize(v, "Is Tom a lempus or scrompus?\n### Tom is a lempus.", &ids).empty(), "tokenize failed");
    std::string pieces;
    for (int id : ids) pieces += "[" + (v.tokens[id] == "\n" ? std::string("\\n") : v.tokens[id]) + "]";
    CHECK(pieces == "[Is][Tom][a][lempus][or][scrompus][?][\\n][###][Tom][is][a][lempus][.]", "pieces %s", pieces.c_str());
    ids.clear();
    err = prosqa_tokenize(v, "Every florbus is a lempus.", &ids);
    CHECK(err.find("florbus") != std::string::npos, "an unknown word must be named, got '%s'", err.c_str());
}

TEST(prosqa_vocab_covers_real_files) {
    std::vector<ProsqaItem> valid, test;
    std::string err = load_both(&valid, &test);
    CHECK(err.empty(), "%s", err.c_str());
    Vocab base = prosqa_vocab();
    CHECK(base.tokens[0] == "<pad>" && base.tokens[1] == "<eos>" && base.pad == 0 && base.eos == 1, "pad/eos not first");
    std::vector<std::string> c = prosqa_concepts();
    CHECK(std::set<std::string>(c.begin(), c.end()).size() == 375, "concept words not 375 distinct");
    for (auto* items : {&valid, &test}) {
        Vocab with = prosqa_vocab(*items);
        CHECK(with.size() == base.size(), "the real files add %d words the lists miss", with.size() - base.size());
        for (auto& it : *items) {
            std::vector<int> ids;
            err = prosqa_tokenize(base, prosqa_prompt(it) + prosqa_target(it), &ids);
            CHECK(err.empty(), "%s", err.c_str());
        }
    }
    printf("  vocabulary: %d tokens\n", base.size());
}

TEST(prosqa_scoring) {
    std::string ans = "Tom is a lempus.";
    CHECK(prosqa_correct("Tom is a terpus.\nEvery terpus is a lempus.\n### Tom is a lempus.", ans), "plain case");
    CHECK(prosqa_correct("### Tom is a lempus. \n", ans), "trailing space/newline is trimmed");
    CHECK(prosqa_correct("# x ## Tom is a lempus.", ans), "the text after the LAST '#' counts");
    CHECK(!prosqa_correct("### Tom is a scrompus.", ans), "wrong answer accepted");
    CHECK(!prosqa_correct("Tom is a lempus.", ans), "no '#': not an answer");
    CHECK(!prosqa_correct("### Tom is a lempus. Tom", ans), "extra words accepted");
    CHECK(!prosqa_correct("###", ans), "empty answer accepted");
}

static std::string load_text(const std::string& json) {
    const char* path = "/tmp/prosqa_bad_test.json";
    FILE* f = fopen(path, "wb");
    if (!f) return "cannot write the test file";
    fputs(json.c_str(), f);
    fclose(f);
    std::vector<ProsqaItem> items;
    return prosqa_load_json(path, &items);
}

// A small item that prosqa_check accepts: Tom -> lempus (the answer), Bob -> scrompus.
static std::string good_item() {
    return "{\"question\": \"Tom is a lempus. Bob is a scrompus. Is Tom a lempus or scrompus?\", "
           "\"answer\": \"Tom is a lempus.\", \"steps\": [\"Tom is a lempus.\"], \"edges\": [[0, 1], [2, 3]], "
           "\"idx_to_symbol\": [\"Tom\", \"lempus\", \"Bob\", \"scrompus\"], \"root\": 0, \"target\": 1, \"neg_target\": 3}";
}

TEST(prosqa_malformed_json_refused) {
    std::string ok_tail = "\"idx_to_symbol\": [\"Tom\", \"lempus\"], \"root\": 0, \"target\": 1, \"neg_target\": 1}]";
    std::string good = "[" + good_item() + "]";
    CHECK(load_text(good).empty(), "a well-formed file was refused: %s", load_text(good).c_str());
    struct Case { std::string json, expect; } cases[] = {
        {"[{\"question\": ", "at byte"},                                 // not JSON
        {"{\"question\": \"q\"}", "not a JSON list"},
        {"[{\"answer\": \"a\", \"steps\": [], \"edges\": [], " + ok_tail, "item 0: \"question\""},
        {"[{\"question\": \"q\", \"answer\": \"a\", \"steps\": [3], \"edges\": [], " + ok_tail, "\"steps\""},
        {"[{\"question\": \"q\", \"answer\": \"a\", \"steps\": [], \"edges\": [[0]], " + ok_tail,
         "item 0: \"edges\" is not a list of [parent, child] pairs"},
        {"[{\"question\": \"q\", \"answer\": \"a\", \"steps\": [], \"edges\": [[0, 2]], " + ok_tail, "0..1"},
        {"[{\"question\": \"q\", \"answer\": \"a\", \"steps\": [], \"edges\": [[0, 1.5]], " + ok_tail, "not an integer"},
        {"[{\"question\": \"q\", \"answer\": \"a\", \"steps\": [], \"edges\": [], "
         "\"idx_to_symbol\": [\"Tom\", \"lempus\"], \"root\": 0, \"target\": 1}]", "\"neg_target\""},
    };
    for (auto& c : cases) {
        std::string err = load_text(c.json);
        CHECK(err.find(c.expect) != std::string::npos && err.find("prosqa_bad_test.json") != std::string::npos,
              "expected an error with '%s', got '%s'", c.expect.c_str(), err.c_str());
    }
    std::vector<ProsqaItem> items;
    CHECK(!prosqa_load_json("/nonexistent/prosqa.json", &items).empty(), "a missing file was accepted");
}

TEST(prosqa_build_sequences) {
    ProsqaData d;
    std::string err = prosqa_build(200, 1, VALID, &d);
    CHECK(err.empty(), "%s", err.c_str());
    CHECK(d.train.size() == 200 && d.test.size() == 300 && d.test_answers.size() == 300, "sizes");
    std::vector<ProsqaItem> valid;
    prosqa_load_json(VALID, &valid);
    size_t longest = 0;
    for (size_t i = 0; i < d.test.size(); i++) {
        const Sequence& s = d.test[i];
        longest = std::max(longest, s.tokens.size());
        std::string prompt = prosqa_detokenize(d.vocab, s.tokens.data(), s.loss_start);
        CHECK(prompt == valid[i].question + "\n", "test %zu: prompt '%s'", i, prompt.c_str());
        CHECK(s.tokens.back() == d.vocab.eos, "test %zu does not end in <eos>", i);
        std::string rest = prosqa_detokenize(d.vocab, s.tokens.data() + s.loss_start, (int)s.tokens.size() - s.loss_start - 1);
        CHECK(prosqa_correct(rest, d.test_answers[i]), "test %zu: gold continuation not scored correct", i);
    }
    for (auto& s : d.train) {
        longest = std::max(longest, s.tokens.size());
        CHECK(d.vocab.tokens[s.tokens[s.loss_start - 1]] == "\n" && d.vocab.tokens[s.tokens[s.loss_start - 2]] == "?",
              "loss must start right after the question's newline");
    }
    CHECK(d.seq_len == (int)longest - 1, "seq_len %d, longest %zu", d.seq_len, longest);
    ProsqaData again;
    prosqa_build(200, 1, VALID, &again);
    CHECK(again.train[17].tokens == d.train[17].tokens, "the same seed gave different training data");
    printf("  seq_len %d, vocabulary %d\n", d.seq_len, d.vocab.size());
}

// A file is checked for meaning, not only parsed: "[]" used to score "0.0% of
// 0"; a wrong answer, a cycle or a question that does not match the edges
// were scored. The first bad item is named by its index.
TEST(prosqa_meaning_checked_on_load) {
    std::string good = good_item();
    CHECK(load_text("[" + good + "]").empty(), "a good item refused: %s", load_text("[" + good + "]").c_str());
    auto with = [&](const std::string& from, const std::string& to) {
        std::string bad = good;
        size_t at = bad.find(from);
        return at == std::string::npos ? std::string("no '" + from + "' in the item") : "[" + good + ", " + bad.replace(at, from.size(), to) + "]";
    };
    struct Case { std::string json, expect; } cases[] = {
        {"[]", "empty list"},
        {with("\"target\": 1", "\"target\": 3"), "item 1: the root does not reach the target"},
        {with("\"answer\": \"Tom is a lempus.\"", "\"answer\": \"Tom is a scrompus.\""), "item 1: the answer is not"},
        {with("[[0, 1], [2, 3]]", "[[0, 1], [2, 3], [3, 2]]"), "item 1: the edges form a cycle"},
        {with("Bob is a scrompus. Is", "Bob is a lempus. Is"), "item 1: the question's facts are not exactly the edges"},
        {with("Is Tom a lempus or scrompus?", "Is Bob a lempus or scrompus?"), "item 1: the question does not end in"},
    };
    for (auto& c : cases) {
        std::string err = load_text(c.json);
        CHECK(err.find(c.expect) != std::string::npos && err.find("prosqa_bad_test.json") != std::string::npos,
              "expected an error with '%s', got '%s'", c.expect.c_str(), err.c_str());
    }
}
