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
    CHECK(valid.size() == 300, "%s: %zu items, want 300", VALID, valid.size());
    CHECK(test.size() == 500, "%s: %zu items, want 500", TEST_FILE, test.size());
    for (auto* items : {&valid, &test})
        for (size_t i = 0; i < items->size(); i++) {
            err = prosqa_check((*items)[i]);
            CHECK(err.empty(), "real item %zu: %s", i, err.c_str());
        }
    const ProsqaItem& first = valid[0];   // spot check against the file
    CHECK(first.root == 1, "valid[0]: root %d, want 1", first.root);
    CHECK(first.target == 16, "valid[0]: target %d, want 16", first.target);
    CHECK(first.neg_target == 13, "valid[0]: neg_target %d, want 13", first.neg_target);
    CHECK(first.answer == "Tom is a lempus.", "valid[0]: answer '%s', want 'Tom is a lempus.'", first.answer.c_str());
}

TEST(prosqa_generated_graphs_keep_invariants) {
    for (uint64_t seed = 0; seed < 500; seed++) {
        Rng rng(seed_for(seed, "prosqa-test"));
        ProsqaItem it;
        std::string err = prosqa_generate(rng, &it);
        CHECK(err.empty(), "seed %llu: %s", (unsigned long long)seed, err.c_str());
        err = prosqa_check(it);   // person reaches A, not B; steps follow edges; text matches the graph
        CHECK(err.empty(), "seed %llu: %s\n%s", (unsigned long long)seed, err.c_str(), it.question.c_str());
        CHECK(it.steps.size() >= 3 && it.steps.size() <= 6, "seed %llu: %zu steps, want 3 to 6", (unsigned long long)seed,
              it.steps.size());
    }
    Rng a(7), b(7);   // deterministic
    ProsqaItem x, y;
    prosqa_generate(a, &x);
    prosqa_generate(b, &y);
    CHECK(x.question == y.question, "the same seed gave two different questions");
    CHECK(x.steps == y.steps, "the same seed gave two different chains of steps");
}

TEST(prosqa_generator_averages) {
    std::vector<ProsqaItem> valid, test, gen(2000);
    std::string err = load_both(&valid, &test);
    CHECK(err.empty(), "%s", err.c_str());
    valid.insert(valid.end(), test.begin(), test.end());
    Rng rng(123);
    for (auto& it : gen) CHECK((err = prosqa_generate(rng, &it)).empty(), "%s", err.c_str());
    // the real files: 22.81 nodes, 36.00 edges, 3.77 steps, 2.56 persons
    GraphAverages r = averages(valid), g = averages(gen);
    CHECK(std::fabs(g.nodes - r.nodes) < 1, "generated graphs: %.2f nodes, the real files %.2f", g.nodes, r.nodes);
    CHECK(std::fabs(g.edges - r.edges) < 2, "generated graphs: %.2f edges, the real files %.2f", g.edges, r.edges);
    CHECK(std::fabs(g.steps - r.steps) < 0.15, "generated graphs: %.2f steps, the real files %.2f", g.steps, r.steps);
    CHECK(std::fabs(g.persons - r.persons) < 0.5, "generated graphs: %.2f persons, the real files %.2f", g.persons, r.persons);
    // the share of questions of each length (the real files: 40.8% of 3 steps, 43.8% of 4, 13.1% of 5, 2.4% of 6)
    double real_share[8] = {0}, gen_share[8] = {0};
    for (auto& it : valid) real_share[std::min<size_t>(it.steps.size(), 7)] += 100.0 / valid.size();
    for (auto& it : gen) gen_share[std::min<size_t>(it.steps.size(), 7)] += 100.0 / gen.size();
    for (int steps = 3; steps <= 6; steps++)
        CHECK(std::fabs(gen_share[steps] - real_share[steps]) < 3,
              "%.1f%% of the generated questions take %d steps, %.1f%% of the real ones", gen_share[steps], steps,
              real_share[steps]);
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
    CHECK(base.pad == 0, "<pad> is id %d, want 0", base.pad);
    CHECK(base.eos == 1, "<eos> is id %d, want 1", base.eos);
    CHECK(base.tokens[0] == "<pad>", "token 0 is '%s', want <pad>", base.tokens[0].c_str());
    CHECK(base.tokens[1] == "<eos>", "token 1 is '%s', want <eos>", base.tokens[1].c_str());
    std::vector<std::string> c = prosqa_concepts();
    CHECK(std::set<std::string>(c.begin(), c.end()).size() == 375, "concept words not 375 distinct");
    for (auto* items : {&valid, &test}) {
        Vocab with = prosqa_vocab(*items);
        CHECK(with.size() == base.size(), "the real files add %d words to the lists' %d", with.size() - base.size(), base.size());
        for (auto& it : *items) {
            std::vector<int> ids;
            err = prosqa_tokenize(base, prosqa_prompt(it) + prosqa_target(it), &ids);
            CHECK(err.empty(), "%s", err.c_str());
        }
    }
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
        CHECK(err.find(c.expect) != std::string::npos, "expected an error with '%s', got '%s'", c.expect.c_str(), err.c_str());
        CHECK(err.find("prosqa_bad_test.json") != std::string::npos, "the error does not name the file: '%s'", err.c_str());
    }
    std::vector<ProsqaItem> items;
    CHECK(!prosqa_load_json("/nonexistent/prosqa.json", &items).empty(), "a missing file was accepted");
}

TEST(prosqa_build_sequences) {
    ProsqaData d;
    std::string err = prosqa_build(200, 1, VALID, &d);
    CHECK(err.empty(), "%s", err.c_str());
    CHECK(d.train.size() == 200, "%zu training sequences, want 200", d.train.size());
    CHECK(d.test.size() == 300, "%zu test sequences, want 300", d.test.size());
    CHECK(d.test_answers.size() == 300, "%zu test answers, want 300", d.test_answers.size());
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
        const std::string& before = d.vocab.tokens[s.tokens[s.loss_start - 1]];
        const std::string& two_before = d.vocab.tokens[s.tokens[s.loss_start - 2]];
        CHECK(before == "\n", "the loss starts after '%s', not after the question's newline", before.c_str());
        CHECK(two_before == "?", "the loss starts after '%s' and a newline, not after the question's '?'", two_before.c_str());
    }
    CHECK(d.seq_len == (int)longest - 1, "seq_len %d, longest %zu", d.seq_len, longest);
    ProsqaData again;
    prosqa_build(200, 1, VALID, &again);
    CHECK(again.train[17].tokens == d.train[17].tokens, "the same seed gave different training data");
}

// The test split alone (eval, analyze, data --split test: issue 61, class 10): no training
// item is generated, and the vocabulary and the test items are those of the whole build,
// token for token; its seq_len is the test items' own longest.
TEST(prosqa_test_split_built_alone_is_the_same) {
    ProsqaData all, alone;
    std::string err = prosqa_build(300, 7, VALID, &all);
    CHECK(err.empty(), "%s", err.c_str());
    err = prosqa_build(PROSQA_MAX_TRAIN, 7, VALID, &alone, 1, false);  // a million items and 1 byte of memory: none made
    CHECK(err.empty(), "the test split alone: %s", err.c_str());
    CHECK(alone.train.empty(), "%zu training items generated for the test split alone", alone.train.size());
    CHECK(alone.vocab.tokens == all.vocab.tokens, "the vocabulary differs: %zu tokens alone, %zu in the whole build",
          alone.vocab.tokens.size(), all.vocab.tokens.size());
    CHECK(alone.test.size() == all.test.size(), "%zu test items alone, %zu in the whole build", alone.test.size(),
          all.test.size());
    size_t longest = 0;
    for (size_t i = 0; i < all.test.size() && i < alone.test.size(); i++) {
        CHECK(alone.test[i].tokens == all.test[i].tokens && alone.test[i].loss_start == all.test[i].loss_start,
              "test item %zu differs from the whole build's", i);
        CHECK(alone.test_answers[i] == all.test_answers[i], "test answer %zu differs", i);
        longest = std::max(longest, alone.test[i].tokens.size());
    }
    CHECK(alone.seq_len == (int)longest - 1, "seq_len %d alone, the test items' longest is %zu", alone.seq_len, longest);
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
        CHECK(err.find(c.expect) != std::string::npos, "expected an error with '%s', got '%s'", c.expect.c_str(), err.c_str());
        CHECK(err.find("prosqa_bad_test.json") != std::string::npos, "the error does not name the file: '%s'", err.c_str());
    }
}
