// tests/test_data.cpp — the data module (data/tasks.h): arithmetic
// generation against docs/tasks.md §1 and the original generator's samples in
// tests/data/arith/, batches and the resumable order, plain text.
// Run from the repository root (the samples are read by relative path).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include <sys/stat.h>  // mkfifo
#include <unistd.h>

#include "data/tasks.h"
#include "test.h"

namespace {

using Expr = std::vector<std::string>;

Expr split(const std::string& s) {
    std::istringstream in(s);
    Expr out;
    for (std::string w; in >> w;) out.push_back(w);
    return out;
}
std::string join(const Expr& e) {
    std::string s;
    for (const std::string& w : e) s += (s.empty() ? "" : " ") + w;
    return s;
}
// "E_k = ... = E_0" -> its lines
std::vector<Expr> split_lines(const Expr& toks) {
    std::vector<Expr> lines(1);
    for (const std::string& w : toks) {
        if (w == "=") lines.emplace_back();
        else lines.back().push_back(w);
    }
    return lines;
}
std::vector<std::string> read_lines(const std::string& path) {
    std::ifstream f(path);
    std::vector<std::string> out;
    for (std::string l; std::getline(f, l);)
        if (!split(l).empty()) out.push_back(l);
    return out;
}
int count_ops(const Expr& e) {
    int n = 0;
    for (const std::string& w : e) n += w == "+" || w == "-" || w == "*" || w == "/";
    return n;
}
std::vector<int> ids_of(const Vocab& v, const std::string& text) {
    std::vector<int> out;
    v.encode(text, &out);
    return out;
}
const int PRIMES[] = {11, 13, 97};
const char* const TIERS[] = {"feng_p11_ops4", "feng_p11_ops5", "feng_p11_ops6"};

}  // namespace

// ---------------------------------------------------------------------------
// Vocabulary

TEST(arith_vocab_ids) {
    Vocab v = arith_vocab(11);
    const char* want[] = {"<pad>", "<eos>", "+", "-", "*", "/", "(", ")", "="};
    CHECK(v.size() == 9 + 11, "size %d, want 20", v.size());
    for (int i = 0; i < 9; i++) CHECK(v.tokens[i] == want[i], "token %d is '%s', want '%s'", i, v.tokens[i].c_str(), want[i]);
    for (int n = 0; n < 11; n++) CHECK(v.id(std::to_string(n)) == 9 + n, "id('%d') = %d, want %d", n, v.id(std::to_string(n)), 9 + n);
    for (const char* unknown : {"11", "07"})
        CHECK(v.id(unknown) == -1, "'%s' has id %d, want -1 (unknown for p = 11)", unknown, v.id(unknown));
    CHECK(v.pad == 0, "pad is id %d, want 0", v.pad);
    CHECK(v.eos == 1, "eos is id %d, want 1", v.eos);
    CHECK(arith_vocab(997).size() == 1006, "p = 997: size %d, want 1006", arith_vocab(997).size());
}

TEST(vocab_encode_decode) {
    Vocab v = arith_vocab(11);
    std::vector<int> ids;
    std::string err = v.encode("( 10 + 3 )  = 2 <eos>", &ids);
    CHECK(err.empty(), "encode failed: %s", err.c_str());
    std::vector<int> want = {6, 19, 2, 12, 7, 8, 11, 1};
    CHECK(ids == want, "encode gave the wrong ids");
    CHECK(v.decode(ids.data(), (int)ids.size()) == "( 10 + 3 ) = 2 <eos>", "decode: '%s'", v.decode(ids.data(), (int)ids.size()).c_str());
    ids.clear();
    err = v.encode("3 + 12", &ids);
    CHECK(err.find("'12'") != std::string::npos, "unknown token not named: '%s'", err.c_str());
    CHECK(ids.empty(), "a failed encode must not append ids");
}

// ---------------------------------------------------------------------------
// Generation follows docs/tasks.md §1

TEST(arith_every_step_valid) {
    for (int p : PRIMES)
        for (int k = 1; k <= 6; k++) {
            Rng rng(seed_for(7, "steps" + std::to_string(p * 100 + k)));
            for (int n = 0; n < 300; n++) {
                std::vector<Expr> c = arith_chain(rng, p, k);
                CHECK((int)c.size() == k + 1, "p=%d k=%d: %zu expressions, want k+1", p, k, c.size());
                CHECK(c[0].size() == 1, "E_0 must be a single number, got '%s'", join(c[0]).c_str());
                int x = std::stoi(c[0][0]);
                for (int j = 1; j <= k; j++) {
                    CHECK(count_ops(c[j]) == j, "p=%d: E_%d has %d operators: '%s'", p, j, count_ops(c[j]), join(c[j]).c_str());
                    int v = -1;
                    std::string err = arith_eval(c[j], p, &v);
                    CHECK(err.empty(), "p=%d: '%s' does not evaluate: %s", p, join(c[j]).c_str(), err.c_str());
                    CHECK(v == x, "p=%d: '%s' = %d, want the answer %d", p, join(c[j]).c_str(), v, x);
                    err = arith_check_step(c[j], c[j - 1], p);
                    CHECK(err.empty(), "p=%d: step '%s' = '%s' refused: %s", p, join(c[j]).c_str(), join(c[j - 1]).c_str(), err.c_str());
                }
            }
        }
}

TEST(arith_brackets_only_where_needed) {
    for (int p : PRIMES)
        for (int k = 1; k <= 6; k++) {
            Rng rng(seed_for(8, "brackets" + std::to_string(p * 100 + k)));
            for (int n = 0; n < 200; n++) {
                Expr e = arith_chain(rng, p, k).back();
                std::string err = arith_unneeded_brackets(e);
                CHECK(err.empty(), "p=%d: '%s': %s", p, join(e).c_str(), err.c_str());
            }
        }
}

// The bracket rule of docs/tasks.md §1 ("always after a /; for a new + or -,
// also when ...") keeps a pair exactly when dropping it would change the
// function computed: tried on every number of many expressions, every op.
TEST(arith_bracket_rule_is_exactly_precedence) {
    Rng rng(9);
    const char* ops[] = {"+", "-", "*", "/"};
    int kept = 0, dropped = 0;
    for (int n = 0; n < 300; n++) {
        Expr e = arith_chain(rng, 11, 1 + n % 6).back();
        for (size_t pos = 0; pos < e.size(); pos++) {
            if (!isdigit((unsigned char)e[pos][0])) continue;
            for (const char* op : ops) {
                Expr bare(e.begin(), e.begin() + (long)pos), with;
                bare.insert(bare.end(), {"1", op, "2"});
                with = bare;
                with.insert(with.begin() + (long)pos, "(");
                with.push_back(")");
                bare.insert(bare.end(), e.begin() + (long)pos + 1, e.end());
                with.insert(with.end(), e.begin() + (long)pos + 1, e.end());
                bool needed = !arith_same_function(with, bare);
                CHECK(arith_needs_brackets(e, pos, op) == needed, "'%s' vs '%s': rule says %s, precedence says %s",
                      join(with).c_str(), join(bare).c_str(), needed ? "drop" : "keep", needed ? "keep" : "drop");
                (needed ? kept : dropped)++;
            }
        }
    }
    CHECK(kept > 100, "only %d cases that keep their brackets, want more than 100", kept);
    CHECK(dropped > 100, "only %d cases that drop their brackets, want more than 100", dropped);
}

TEST(arith_unneeded_brackets_hand_cases) {
    CHECK(arith_unneeded_brackets(split("( 2 + 3 ) * 4")).empty(), "'( 2 + 3 ) * 4' needs its brackets");
    CHECK(arith_unneeded_brackets(split("7 - ( 2 - 3 )")).empty(), "'7 - ( 2 - 3 )' needs its brackets");
    CHECK(arith_unneeded_brackets(split("7 / ( 2 * 3 )")).empty(), "'7 / ( 2 * 3 )' needs its brackets");
    CHECK(!arith_unneeded_brackets(split("7 + ( 2 - 3 )")).empty(), "'7 + ( 2 - 3 )' has unneeded brackets");
    CHECK(!arith_unneeded_brackets(split("7 * ( 2 / 3 )")).empty(), "'7 * ( 2 / 3 )' has unneeded brackets");
    CHECK(!arith_unneeded_brackets(split("( 5 ) * 2")).empty(), "'( 5 )' is never needed");
    CHECK(!arith_unneeded_brackets(split("( ( 2 + 3 ) ) * 4")).empty(), "double brackets are not needed");
    CHECK(!arith_unneeded_brackets(split("( 2 + 3")).empty(), "unbalanced brackets must be an error");
}

TEST(arith_first_expansion_and_small_primes) {
    // E_1 is "a op b" without brackets; p = 2, 3, 5 generate valid chains too.
    for (int p : {2, 3, 5, 997}) {
        Rng rng(p);
        for (int n = 0; n < 200; n++) {
            std::vector<Expr> c = arith_chain(rng, p, 4);
            CHECK(c[1].size() == 3, "p=%d: E_1 = '%s', want 'a op b'", p, join(c[1]).c_str());
            for (int j = 1; j <= 4; j++) {
                std::string err = arith_check_step(c[j], c[j - 1], p);
                CHECK(err.empty(), "p=%d: '%s' = '%s': %s", p, join(c[j]).c_str(), join(c[j - 1]).c_str(), err.c_str());
            }
        }
    }
}

TEST(arith_operators_uniform) {
    // "an operator uniform among the four" (zero redraws tilt it a little for p = 11)
    Rng rng(10);
    int count[4] = {0, 0, 0, 0};
    const char* ops = "+-*/";
    for (int n = 0; n < 20000; n++) {
        Expr e = arith_chain(rng, 97, 1)[1];
        count[std::string(ops).find(e[1][0])]++;
    }
    for (int i = 0; i < 4; i++)
        CHECK(count[i] > 4700 && count[i] < 5300, "op '%c' drawn %d times of 20000, want about 5000 (4700 .. 5300)", ops[i],
              count[i]);
}

// ---------------------------------------------------------------------------
// Datasets

TEST(arith_formats_and_loss_start) {
    for (bool chain : {true, false}) {
        ArithSettings s;
        s.ops = 3, s.chain = chain, s.train_size = 50, s.test_size = 50;
        ArithData d;
        std::string err = arith_generate(s, &d);
        CHECK(err.empty(), "generate: %s", err.c_str());
        for (size_t i = 0; i < d.test.size(); i++) {
            const Sequence& q = d.test[i];
            Expr toks = split(d.vocab.decode(q.tokens.data(), (int)q.tokens.size()));
            CHECK(toks.back() == "<eos>", "sequence must end in <eos>: '%s'", join(toks).c_str());
            toks.pop_back();
            std::vector<Expr> lines = split_lines(toks);
            CHECK((int)lines.size() == (chain ? 4 : 2), "%s: %zu lines in '%s'", chain ? "chain" : "direct", lines.size(), join(toks).c_str());
            CHECK(lines.back() == Expr{std::to_string(d.test_answers[i])}, "last line '%s' is not the answer %d", join(lines.back()).c_str(), d.test_answers[i]);
            CHECK(q.tokens[q.loss_start - 1] == d.vocab.id("="), "loss_start %d is not just after an '='", q.loss_start);
            CHECK((size_t)q.loss_start == lines[0].size() + 1, "loss_start %d is not just after the first line, %zu tokens",
                  q.loss_start, lines[0].size());
            int v;
            err = arith_eval(lines[0], s.p, &v);
            CHECK(err.empty(), "question '%s' does not evaluate: %s", join(lines[0]).c_str(), err.c_str());
            CHECK(v == d.test_answers[i], "question '%s' = %d, its answer %d", join(lines[0]).c_str(), v, d.test_answers[i]);
        }
    }
}

TEST(arith_train_test_disjoint) {
    ArithSettings s;
    s.ops = 2, s.train_size = 3000, s.test_size = 500;  // small tier: duplicates are drawn often
    ArithData d;
    std::string err = arith_generate(s, &d);
    CHECK(err.empty(), "generate: %s", err.c_str());
    auto question = [](const Sequence& q) { return std::vector<int>(q.tokens.begin(), q.tokens.begin() + q.loss_start); };
    std::set<std::vector<int>> train, test;
    for (const Sequence& q : d.train) train.insert(question(q));
    for (const Sequence& q : d.test) test.insert(question(q));
    CHECK(train.size() == d.train.size(), "duplicate questions within train: %zu distinct of %zu", train.size(), d.train.size());
    CHECK(test.size() == d.test.size(), "duplicate questions within test: %zu distinct of %zu", test.size(), d.test.size());
    for (const auto& q : test) CHECK(!train.count(q), "a test question appears in train");
}

TEST(arith_seeded_deterministic) {
    ArithSettings s;
    s.train_size = 500, s.test_size = 100;
    ArithData a, b, c;
    arith_generate(s, &a);
    arith_generate(s, &b);
    s.seed = 2;
    arith_generate(s, &c);
    auto same = [](const ArithData& x, const ArithData& y) {
        if (x.train.size() != y.train.size() || x.test_answers != y.test_answers) return false;
        for (size_t i = 0; i < x.train.size(); i++) if (x.train[i].tokens != y.train[i].tokens) return false;
        for (size_t i = 0; i < x.test.size(); i++) if (x.test[i].tokens != y.test[i].tokens) return false;
        return true;
    };
    CHECK(same(a, b), "the same seed gave different data");
    CHECK(!same(a, c), "seeds 1 and 2 gave the same data");
}

TEST(arith_test_set_independent_of_train_size_and_format) {
    ArithSettings s;
    s.train_size = 100, s.test_size = 100;
    ArithData a, b;
    arith_generate(s, &a);
    s.train_size = 1000, s.chain = false;
    arith_generate(s, &b);
    for (size_t i = 0; i < a.test.size(); i++) {
        int n = a.test[i].loss_start;
        CHECK(std::equal(a.test[i].tokens.begin(), a.test[i].tokens.begin() + n, b.test[i].tokens.begin()),
              "test question %zu differs between train_size 100 chain and 1000 direct", i);
    }
}

TEST(arith_lengths_bound_attained) {
    // Our bound: E_j has at most 4j-1 tokens (E_0: 1), so the longest
    // sequences are those of docs/tasks.md §1 (42/62/86 chain, 18/22/26
    // direct, with <eos>); the original generator's samples in
    // tests/data/arith peak at the bound (see arith_samples_lengths).
    const int docs_chain[] = {42, 62, 86}, docs_direct[] = {18, 22, 26};
    for (int k = 4; k <= 6; k++) {
        CHECK(arith_max_len(11, k, true) == docs_chain[k - 4], "k=%d chain bound %d, want %d", k,
              arith_max_len(11, k, true), docs_chain[k - 4]);
        CHECK(arith_max_len(11, k, false) == docs_direct[k - 4], "k=%d direct bound %d, want %d", k,
              arith_max_len(11, k, false), docs_direct[k - 4]);
        CHECK(arith_max_len(97, k, true) == arith_max_len(11, k, true), "the bound must not depend on p");
    }
    for (int k = 1; k <= 6; k++)
        for (bool chain : {true, false}) {
            ArithSettings s;
            s.ops = k, s.chain = chain, s.train_size = k <= 2 ? 300 : 30000, s.test_size = 100;
            ArithData d;
            std::string err = arith_generate(s, &d);
            CHECK(err.empty(), "generate k=%d: %s", k, err.c_str());
            int bound = arith_max_len(s.p, k, chain);
            CHECK(d.seq_len + 1 <= bound, "k=%d %s: longest sequence %d exceeds the bound %d", k, chain ? "chain" : "direct", d.seq_len + 1, bound);
            CHECK(d.seq_len + 1 == bound, "k=%d %s: longest sequence %d of %zu never reaches the bound %d",
                  k, chain ? "chain" : "direct", d.seq_len + 1, d.train.size(), bound);
        }
}

TEST(arith_settings_errors) {
    ArithSettings s;
    CHECK(arith_check_settings(s).empty(), "defaults refused: %s", arith_check_settings(s).c_str());
    s.p = 12;
    CHECK(arith_check_settings(s) == "p = 12 is not prime; try 11 or 13", "p = 12: '%s'", arith_check_settings(s).c_str());
    s.p = 1;
    CHECK(arith_check_settings(s).find("p = 1 ") == 0, "p = 1: '%s'", arith_check_settings(s).c_str());
    s.p = 1009;
    CHECK(!arith_check_settings(s).empty(), "p = 1009 must be refused (limit 997)");
    s.p = 997;
    CHECK(arith_check_settings(s).empty(), "p = 997 refused: %s", arith_check_settings(s).c_str());
    s.p = 11, s.ops = 0;
    CHECK(arith_check_settings(s).find("ops = 0") == 0, "ops = 0: '%s'", arith_check_settings(s).c_str());
    s.ops = 4, s.train_size = 0;
    CHECK(arith_check_settings(s).find("train_size") == 0, "train_size = 0: '%s'", arith_check_settings(s).c_str());
    s.train_size = 10, s.test_size = 0;
    CHECK(arith_check_settings(s).find("test_size") == 0, "test_size = 0: '%s'", arith_check_settings(s).c_str());
    ArithData d;
    s.test_size = 5, s.p = 12;
    CHECK(!arith_generate(s, &d).empty(), "arith_generate must check the settings");
}

TEST(arith_too_few_distinct_questions) {
    // p = 2, ops = 1: 14 distinct questions (4 each for + - *, 2 for /).
    ArithSettings s;
    s.p = 2, s.ops = 1, s.train_size = 10, s.test_size = 4;
    ArithData d;
    CHECK(arith_generate(s, &d).empty(), "14 questions exist, 14 asked: %s", arith_generate(s, &d).c_str());
    s.train_size = 11;
    std::string err = arith_generate(s, &d);
    CHECK(err.find("found only 14 distinct questions") != std::string::npos, "15 of 14 asked: '%s'", err.c_str());
}

// A large set at the deepest tier is generated (its speed is a benchmark's
// business, not a test's: `time ./lime data --ops 6 --train-size 50000`).
TEST(arith_generates_a_large_set_at_tier_6) {
    ArithSettings s;
    s.ops = 6, s.train_size = 50000, s.test_size = 1000;
    ArithData d;
    std::string err = arith_generate(s, &d);
    CHECK(err.empty(), "generate: %s", err.c_str());
    CHECK(d.train.size() == 50000, "%zu training sequences, want 50000", d.train.size());
    CHECK(d.test.size() == 1000, "%zu test sequences, want 1000", d.test.size());
}

// ---------------------------------------------------------------------------
// Evaluation, steps, scoring

TEST(arith_eval_hand_cases) {
    struct { const char* e; int v; } ok[] = {
        {"2 + 3 * 4", 3}, {"10 - 3 - 4", 3}, {"8 / 2 / 2", 2}, {"2 / 3", 8}, {"( 2 + 3 ) * 4", 9},
        {"4 - ( 4 / 1 - 4 ) + 8", 1}, {"( 7 + 8 ) / ( ( 3 - 10 ) / 4 )", 4}, {"0", 0}};
    for (const auto& c : ok) {
        int v = -1;
        std::string err = arith_eval(split(c.e), 11, &v);
        CHECK(err.empty(), "'%s' does not evaluate: %s", c.e, err.c_str());
        CHECK(v == c.v, "'%s' = %d, want %d", c.e, v, c.v);
    }
    const char* bad[] = {"2 +", "( 2 + 3", "2 + 3 )", "2 / 0", "2 / ( 3 - 3 )", "2 ^ 3", "12 + 1", "", "2 3"};
    for (const char* e : bad) {
        int v;
        CHECK(!arith_eval(split(e), 11, &v).empty(), "'%s' must be an error", e);
    }
    int v;
    CHECK(arith_eval(split("2 / ( 3 - 3 )"), 11, &v).find("division by zero") != std::string::npos, "division by zero not named");
}

TEST(arith_check_step_hand_cases) {
    struct { const char* cur; const char* next; bool valid; } cases[] = {
        {"( 2 + 3 ) * 4", "5 * 4", true},
        {"2 + 3 * 4", "2 + 1", true},
        {"4 * 2 / 5 * 8", "4 * 7 * 8", true},    // as Feng's samples do: (4*2)/5 = 4*(2/5)
        {"2 * 3 + 4 * 5", "2 * 3 + 9", true},    // any valid order, not only generation's
        {"1 * 1 * 1", "1 * 1", true},
        {"2 + 3", "6", false},                   // wrong value
        {"2 + 3 * 4", "3", false},               // two operators at once
        {"2 + 3 * 4", "5 * 4", false},           // against precedence
        {"0 + 3 * 1", "3 * 1", false},           // against precedence, value kept by chance
        {"7 - 2 - 3", "7 - 10", false},
        {"( 2 + 3 ) * 4", "( 5 ) * 4", false},   // brackets left around a number
        {"2 + 3", "5 5", false},
        {"2 + 3", "2 + 3", false},               // nothing collapsed
    };
    for (const auto& c : cases) {
        std::string err = arith_check_step(split(c.cur), split(c.next), 11);
        CHECK(err.empty() == c.valid, "'%s' = '%s' should be %s: %s", c.cur, c.next, c.valid ? "valid" : "refused", err.c_str());
    }
}

TEST(arith_correct_hand_cases) {
    Vocab v = arith_vocab(11);
    CHECK(arith_correct(v, ids_of(v, "5 * 4 = 9 <eos>"), 9), "answer before <eos> must be correct");
    CHECK(arith_correct(v, ids_of(v, "9 <eos> 3 <eos>"), 9), "only the first <eos> counts");
    CHECK(!arith_correct(v, ids_of(v, "5 * 4 = 9 <eos>"), 8), "wrong answer must be incorrect");
    CHECK(!arith_correct(v, ids_of(v, "5 * 4 = 9"), 9), "no <eos>: incorrect");
    CHECK(!arith_correct(v, ids_of(v, "<eos> 9"), 9), "<eos> first: incorrect");
}

TEST(arith_chain_quality_hand_cases) {
    Vocab v = arith_vocab(11);
    auto q = [&](const char* s) { return arith_chain_quality(v, ids_of(v, s), 11); };
    struct { const char* what; const char* chain; int first_bad_step; } cases[] = {  // -1: the chain is valid
        {"a valid chain", "( 2 + 3 ) * 4 = 5 * 4 = 9 <eos>", -1},
        {"a wrong last step", "( 2 + 3 ) * 4 = 5 * 4 = 8 <eos>", 1},
        {"two operators at once", "( 2 + 3 ) * 4 = 9 <eos>", 0},
        {"stopping early", "( 2 + 3 ) * 4 = 5 * 4 <eos>", 1},
        {"no <eos>", "( 2 + 3 ) * 4 = 5 * 4 = 9", 2},
        {"a broken line", "( 2 + 3 ) * 4 = 5 * = 9 <eos>", 0},
    };
    for (auto& k : cases) {
        ChainQuality a = q(k.chain);
        CHECK(a.all_valid == (k.first_bad_step == -1), "%s judged %s: %s", k.what, a.all_valid ? "valid" : "bad", a.why.c_str());
        CHECK(a.first_bad_step == k.first_bad_step, "%s: first_bad_step %d (%s), want %d", k.what, a.first_bad_step,
              a.why.c_str(), k.first_bad_step);
    }
    // every generated training sequence is a valid chain
    ArithSettings s;
    s.ops = 6, s.train_size = 300, s.test_size = 10;
    ArithData d;
    arith_generate(s, &d);
    for (const Sequence& seq : d.train) {
        ChainQuality c = arith_chain_quality(d.vocab, seq.tokens, 11);
        CHECK(c.all_valid, "generated chain judged bad: %s", c.why.c_str());
    }
}

// ---------------------------------------------------------------------------
// The original generator's samples (tests/data/arith, Feng et al.)

TEST(arith_samples_chain_steps) {
    Vocab v = arith_vocab(11);
    for (const char* tier : TIERS) {
        std::string path = std::string("tests/data/arith/") + tier + "/chain/train_data.txt";
        std::vector<std::string> lines = read_lines(path);
        CHECK(lines.size() == 2000, "%s: %zu lines, want 2000 (run from the repository root)", path.c_str(), lines.size());
        for (size_t n = 0; n < lines.size(); n++) {
            std::vector<int> ids;
            std::string err = v.encode(lines[n], &ids);
            CHECK(err.empty(), "%s:%zu: %s", path.c_str(), n + 1, err.c_str());
            std::vector<Expr> chain = split_lines(split(lines[n]));
            CHECK(chain.back().size() == 1, "%s:%zu: does not end in a number", path.c_str(), n + 1);
            for (size_t j = 0; j + 1 < chain.size(); j++) {
                err = arith_check_step(chain[j], chain[j + 1], 11);
                CHECK(err.empty(), "%s:%zu step %zu: %s", path.c_str(), n + 1, j, err.c_str());
            }
            err = arith_unneeded_brackets(chain[0]);
            CHECK(err.empty(), "%s:%zu: %s", path.c_str(), n + 1, err.c_str());
            ids.push_back(v.eos);
            ChainQuality q = arith_chain_quality(v, ids, 11);
            CHECK(q.all_valid, "%s:%zu: chain quality: %s", path.c_str(), n + 1, q.why.c_str());
        }
    }
}

TEST(arith_samples_test_answers) {
    for (const char* tier : TIERS) {
        std::string dir = std::string("tests/data/arith/") + tier + "/chain/";
        std::vector<std::string> qs = read_lines(dir + "test_data.txt"), ans = read_lines(dir + "test_ans.txt");
        CHECK(qs.size() == 500, "%stest_data.txt: %zu questions, want 500", dir.c_str(), qs.size());
        CHECK(ans.size() == 500, "%stest_ans.txt: %zu answers, want 500", dir.c_str(), ans.size());
        for (size_t n = 0; n < qs.size(); n++) {
            Expr e = split(qs[n]);
            CHECK(e.back() == "=", "%stest_data.txt:%zu: prompt must end in '='", dir.c_str(), n + 1);
            e.pop_back();
            int v = -1;
            std::string err = arith_eval(e, 11, &v);
            CHECK(err.empty(), "%stest_data.txt:%zu: '%s' does not evaluate: %s", dir.c_str(), n + 1, join(e).c_str(),
                  err.c_str());
            CHECK(std::to_string(v) == split(ans[n])[0], "%stest_data.txt:%zu: '%s' = %d, test_ans.txt says %s", dir.c_str(),
                  n + 1, join(e).c_str(), v, ans[n].c_str());
        }
    }
}

TEST(arith_samples_decoder) {
    for (const char* tier : TIERS)
        for (const char* file : {"train_data.txt", "test_data.txt"}) {
            std::string path = std::string("tests/data/arith/") + tier + "/decoder/" + file;
            std::vector<std::string> lines = read_lines(path);
            CHECK(!lines.empty(), "%s: no lines (run from the repository root)", path.c_str());
            for (size_t n = 0; n < lines.size(); n++) {
                std::vector<Expr> parts = split_lines(split(lines[n]));
                CHECK(parts.size() == 2, "%s:%zu: %zu parts, not 'expr = answer'", path.c_str(), n + 1, parts.size());
                CHECK(parts[1].size() == 1, "%s:%zu: the answer '%s' is not one number", path.c_str(), n + 1,
                      join(parts[1]).c_str());
                int v = -1;
                std::string err = arith_eval(parts[0], 11, &v);
                CHECK(err.empty(), "%s:%zu: '%s' does not evaluate: %s", path.c_str(), n + 1, join(parts[0]).c_str(),
                      err.c_str());
                CHECK(std::to_string(v) == parts[1][0], "%s:%zu: '%s' = %d, the file says %s", path.c_str(), n + 1,
                      join(parts[0]).c_str(), v, parts[1][0].c_str());
            }
        }
}

TEST(arith_samples_lengths) {
    // The samples' longest lines (tokens + <eos>) never exceed our bound.
    for (int k = 4; k <= 6; k++) {
        std::string dir = "tests/data/arith/feng_p11_ops" + std::to_string(k);
        for (bool chain : {true, false}) {
            size_t longest = 0;
            for (const std::string& l : read_lines(dir + (chain ? "/chain/" : "/decoder/") + "train_data.txt"))
                longest = std::max(longest, split(l).size() + 1);
            CHECK((int)longest <= arith_max_len(11, k, chain), "%s %s: sample of %zu tokens exceeds the bound %d",
                  dir.c_str(), chain ? "chain" : "decoder", longest, arith_max_len(11, k, chain));
        }
    }
}

// ---------------------------------------------------------------------------
// Batches and the data order

TEST(make_batch_hand_made) {
    std::vector<Sequence> seqs(2);
    seqs[0].tokens = {10, 11, 12, 13, 14}, seqs[0].loss_start = 3;
    seqs[1].tokens = {20, 21, 22, 23, 24, 25, 26, 27}, seqs[1].loss_start = 1;  // longer than T+1: cut
    int idx[3] = {0, 1, 0};
    Batch b;
    make_batch(seqs, idx, 3, 6, 0, &b);
    CHECK(b.B == 3, "B = %d, want 3", b.B);
    CHECK(b.T == 6, "T = %d, want 6", b.T);
    CHECK(b.tokens.size() == 18, "%zu tokens, want B x T = 18", b.tokens.size());
    CHECK(b.targets.size() == 18, "%zu targets, want B x T = 18", b.targets.size());
    CHECK(b.mask.size() == 18, "%zu mask values, want B x T = 18", b.mask.size());
    std::vector<int> tok0 = {10, 11, 12, 13, 14, 0}, tgt0 = {11, 12, 13, 14, 0, 0};
    // position t predicts token t+1, counted iff t+1 >= loss_start = 3 and t+1 < n = 5
    std::vector<float> m0 = {0, 0, 1, 1, 0, 0};
    std::vector<int> tok1 = {20, 21, 22, 23, 24, 25}, tgt1 = {21, 22, 23, 24, 25, 26};
    std::vector<float> m1 = {1, 1, 1, 1, 1, 1};
    for (int t = 0; t < 6; t++) {
        CHECK(b.tokens[t] == tok0[t], "row 0, t=%d: token %d, want %d", t, b.tokens[t], tok0[t]);
        CHECK(b.targets[t] == tgt0[t], "row 0, t=%d: target %d, want %d", t, b.targets[t], tgt0[t]);
        CHECK(b.mask[t] == m0[t], "row 0, t=%d: mask %g, want %g", t, b.mask[t], m0[t]);
        CHECK(b.tokens[6 + t] == tok1[t], "row 1, t=%d: token %d, want %d", t, b.tokens[6 + t], tok1[t]);
        CHECK(b.targets[6 + t] == tgt1[t], "row 1, t=%d: target %d, want %d", t, b.targets[6 + t], tgt1[t]);
        CHECK(b.mask[6 + t] == m1[t], "row 1, t=%d: mask %g, want %g", t, b.mask[6 + t], m1[t]);
        CHECK(b.tokens[12 + t] == tok0[t], "row 2 must repeat row 0");
    }
}

TEST(make_batch_mask_covers_answer_after_first_equals) {
    ArithSettings s;
    s.ops = 2, s.train_size = 20, s.test_size = 5;
    ArithData d;
    arith_generate(s, &d);
    int idx[1] = {0};
    Batch b;
    make_batch(d.train, idx, 1, d.seq_len, d.vocab.pad, &b);
    const std::vector<int>& q = d.train[0].tokens;
    int first_eq = (int)(std::find(q.begin(), q.end(), d.vocab.id("=")) - q.begin());
    for (int t = 0; t < d.seq_len; t++) {
        bool want = t >= first_eq && t + 1 < (int)q.size();  // targets q[t+1], after the first "="
        CHECK((b.mask[t] == 1) == want, "t=%d: mask %g, want %d", t, b.mask[t], want);
    }
}

TEST(loader_epochs_are_permutations) {
    std::vector<Sequence> data(10);
    for (int i = 0; i < 10; i++) data[i].tokens = {i, i};
    Loader l;
    l.start(&data, 5, 0, 0);
    Batch b;
    std::vector<int> seen;
    for (int n = 0; n < 5; n++) {  // 5 batches of 4: two full epochs
        l.next(4, 1, 0, &b);
        seen.insert(seen.end(), b.tokens.begin(), b.tokens.end());
    }
    for (int e = 0; e < 2; e++) {
        std::set<int> ep(seen.begin() + 10 * e, seen.begin() + 10 * (e + 1));
        CHECK(ep.size() == 10, "epoch %d visits %zu distinct sequences, want 10", e, ep.size());
    }
    CHECK(std::vector<int>(seen.begin(), seen.begin() + 10) != std::vector<int>(seen.begin() + 10, seen.end()),
          "epochs 0 and 1 have the same order: reshuffle each epoch");
    CHECK(l.epoch == 2, "after 20 of 10 the loader is in epoch %d, want 2", l.epoch);
    CHECK(l.pos == 0, "after 20 of 10 the loader is at position %zu, want 0", l.pos);
}

TEST(loader_resume_matches_uninterrupted) {
    std::vector<Sequence> data(37);
    for (int i = 0; i < 37; i++) data[i].tokens = {i, i + 100, i + 200};
    Loader a;
    a.start(&data, 42, 0, 0);
    std::vector<Batch> run(20);
    int resume_at = 7;
    int epoch = 0;
    size_t pos = 0;
    for (int n = 0; n < 20; n++) {
        if (n == resume_at) epoch = a.epoch, pos = a.pos;
        a.next(8, 2, 0, &run[n]);  // 8 does not divide 37: batches straddle epochs
    }
    Loader b;
    b.start(&data, 42, epoch, pos);
    for (int n = resume_at; n < 20; n++) {
        Batch x;
        b.next(8, 2, 0, &x);
        CHECK(x.tokens == run[n].tokens, "batch %d after resuming at (epoch %d, pos %zu): the tokens differ", n, epoch, pos);
        CHECK(x.targets == run[n].targets, "batch %d after resuming at (epoch %d, pos %zu): the targets differ", n, epoch, pos);
        CHECK(x.mask == run[n].mask, "batch %d after resuming at (epoch %d, pos %zu): the mask differs", n, epoch, pos);
    }
    Loader c;
    c.start(&data, 43, 0, 0);
    Batch y;
    c.next(8, 2, 0, &y);
    CHECK(y.tokens != run[0].tokens, "seeds 42 and 43 give the same first batch");
}

// ---------------------------------------------------------------------------
// Plain text

namespace {
std::string write_temp(const std::string& name, const std::string& content) {
    std::string path = "/tmp/lime_test_" + name;
    std::ofstream(path, std::ios::binary) << content;
    return path;
}
}  // namespace

TEST(text_vocab_bytes) {
    Vocab v = text_vocab();
    CHECK(v.size() == 256, "size %d, want 256", v.size());
    // printable ASCII as itself, other bytes <0xNN>
    struct { int id; const char* want; } names[] = {{'a', "a"}, {' ', " "}, {10, "<0x0A>"}, {0xE9, "<0xE9>"}};
    for (auto& k : names) CHECK(v.tokens[k.id] == k.want, "token %d is '%s', want '%s'", k.id, v.tokens[k.id].c_str(), k.want);
    std::vector<int> ids;
    std::string s = "h\xC3\xA9 \n";
    v.encode(s, &ids);
    CHECK(ids.size() == 5, "'h\\xC3\\xA9 \\n' encoded as %zu ids, want one per byte, 5", ids.size());
    CHECK(ids[1] == 0xC3, "byte 0xC3 encoded as %d, want the byte itself", ids[1]);
    CHECK(ids[2] == 0xA9, "byte 0xA9 encoded as %d, want the byte itself", ids[2]);
    CHECK(v.decode(ids.data(), (int)ids.size()) == s, "decode must concatenate bytes");
}

TEST(text_load_windows) {
    std::string content;
    for (int i = 0; i < 100; i++) content += (char)('a' + i % 26);
    std::string path = write_temp("text100", content);
    TextData d;
    std::string err = text_load(path, 8, 0.2, &d);  // train: bytes 0..79, val: 80..99
    CHECK(err.empty(), "text_load: %s", err.c_str());
    CHECK(d.train.size() == 9, "train windows: %zu, want 9 (starts 0, 8, .., 64; 72+9 > 80)", d.train.size());
    CHECK(d.val.size() == 2, "val windows: %zu, want 2 (starts 80, 88)", d.val.size());
    for (size_t w = 0; w < d.train.size(); w++) {
        const Sequence& q = d.train[w];
        CHECK(q.tokens.size() == 9, "window %zu: %zu tokens, want 9", w, q.tokens.size());
        CHECK(q.loss_start == 1, "window %zu: loss_start %d, want 1", w, q.loss_start);
        for (int t = 0; t < 9; t++) CHECK(q.tokens[t] == (unsigned char)content[w * 8 + t], "train window %zu token %d wrong", w, t);
    }
    CHECK(d.val[0].tokens[0] == (unsigned char)content[80], "validation starts at the held-out tail (byte 80)");
}

TEST(text_load_refusals) {
    TextData d;
    std::string err = text_load("/tmp/lime_test_does_not_exist", 8, 0.1, &d);
    CHECK(err.find("cannot open") != std::string::npos, "missing file: '%s'", err.c_str());
    err = text_load(write_temp("empty", ""), 8, 0.1, &d);
    CHECK(err.find("empty") != std::string::npos, "empty file: '%s'", err.c_str());
    err = text_load(write_temp("short", std::string(17, 'x')), 8, 0.5, &d);
    CHECK(err.find("fewer than 2*(T+1) = 18") != std::string::npos, "17 bytes, T = 8: '%s'", err.c_str());
    err = text_load(write_temp("short2", std::string(18, 'x')), 8, 0.5, &d);
    CHECK(err.empty(), "18 bytes, T = 8, val_frac 0.5 should fit: '%s'", err.c_str());
    err = text_load(write_temp("short3", std::string(18, 'x')), 8, 0.1, &d);
    CHECK(err.find("raise val_frac") != std::string::npos, "validation tail too short: '%s'", err.c_str());
}

// Brackets nested 100,000 deep used to overflow the parser's stack (found
// while writing tests/fuzz_tasks.cpp); now they are refused with a line.
TEST(arith_eval_refuses_deep_brackets) {
    std::vector<std::string> e(100000, "(");
    e.push_back("1");
    e.insert(e.end(), 100000, ")");
    int v = -1;
    std::string err = arith_eval(e, 11, &v);
    CHECK(err.find("nested deeper") != std::string::npos, "100,000 nested brackets: '%s'", err.c_str());
    std::vector<std::string> ok(64, "(");
    ok.push_back("3");
    ok.insert(ok.end(), 64, ")");
    err = arith_eval(ok, 11, &v);
    CHECK(err.empty(), "64 nested brackets refused: '%s'", err.c_str());
    CHECK(v == 3, "64 nested brackets around 3: value %d", v);
}

// A directory, a FIFO or a device given as the text file was read as a stream:
// an uncaught exception (a directory), a read that blocks forever (a FIFO) or
// never ends (/dev/zero). Now each is refused before any read, naming what it is.
TEST(text_load_refuses_special_files) {
    TextData d;
    std::string err = text_load("/tmp", 8, 0.1, &d);
    CHECK(err.find("is a directory") != std::string::npos, "a directory: '%s'", err.c_str());
    err = text_load("/dev/zero", 8, 0.1, &d);
    CHECK(err.find("character device") != std::string::npos, "/dev/zero: '%s'", err.c_str());
    std::string fifo = "/tmp/lime_test_fifo_" + std::to_string(getpid());
    unlink(fifo.c_str());
    CHECK(mkfifo(fifo.c_str(), 0600) == 0, "cannot make %s", fifo.c_str());
    auto t0 = std::chrono::steady_clock::now();
    err = text_load(fifo, 8, 0.1, &d);
    double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();  // a bound for a hang (10 s), not a timing
    unlink(fifo.c_str());
    CHECK(contains(err, "FIFO"), "a FIFO: the error does not say FIFO: '%s'", err.c_str());
    CHECK(sec < 10, "a FIFO: refused after %.1f s, want at once", sec);
}

// Text takes about 33x the file's size in memory at T = 2: checked against
// the memory available before the file is read, naming --seq-len.
TEST(text_load_checks_memory) {
    std::string path = write_temp("text_mem", std::string(10000, 'x'));
    TextData d;
    uint64_t need = text_memory_bytes(10000, 2);
    CHECK(need > 30 * 10000 && need < 40 * 10000, "10,000 bytes at T = 2: estimate %llu, want 30x .. 40x",
          (unsigned long long)need);
    CHECK(text_memory_bytes(10000, 128) < 6 * 10000, "T = 128: estimate %llu, want under 6x",
          (unsigned long long)text_memory_bytes(10000, 128));
    std::string err = text_load(path, 2, 0.1, &d, need - 1);
    for (const char* part : {"--seq-len", "memory"})
        CHECK(contains(err, part), "too little memory: the error lacks '%s': '%s'", part, err.c_str());
    err = text_load(path, 2, 0.1, &d, need);
    CHECK(err.empty(), "enough memory refused: '%s'", err.c_str());
}

// The number of distinct questions, counted exactly (checked against the
// questions the generator itself makes), so that an impossible --train-size
// is refused at once instead of after minutes of drawing repeats.
TEST(arith_distinct_questions_exact) {
    CHECK(arith_distinct_questions(2, 1, 1000) == 14, "p = 2, k = 1: %llu, want 14",
          (unsigned long long)arith_distinct_questions(2, 1, 1000));
    for (auto pk : {std::make_pair(2, 2), std::make_pair(3, 2), std::make_pair(2, 3)}) {
        std::set<std::vector<int>> seen;
        Rng rng(pk.first * 10 + pk.second);
        for (int dry = 0; dry < 300000;) dry = seen.insert(arith_chain_ids(rng, pk.first, pk.second).back()).second ? 0 : dry + 1;
        uint64_t n = arith_distinct_questions(pk.first, pk.second, 1 << 30);
        CHECK(n == seen.size(), "p = %d, k = %d: counted %llu, the generator makes %zu", pk.first, pk.second,
              (unsigned long long)n, seen.size());
    }
    CHECK(arith_distinct_questions(11, 3, 1 << 30) == 3289143, "p = 11, k = 3: %llu",
          (unsigned long long)arith_distinct_questions(11, 3, 1 << 30));
    CHECK(arith_distinct_questions(11, 6, 12345) == 12345, "the cap is not applied");
}

TEST(arith_check_size_refuses_at_once) {
    ArithSettings s;
    s.p = 11, s.ops = 3, s.train_size = 10000000, s.test_size = 500;
    auto t0 = std::chrono::steady_clock::now();
    std::string err = arith_check_size(s, 0);
    double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();  // a bound for a hang (10 s), not a timing
    CHECK(contains(err, "only 3289143 distinct questions"), "10,000,000 of 3,289,143: '%s'", err.c_str());
    CHECK(sec < 10, "10,000,000 of 3,289,143: refused after %.2f s, want at once", sec);
    s.train_size = 3000000;
    err = arith_check_size(s, 0);
    CHECK(err.find("3/4") != std::string::npos, "3,000,000 of 3,289,143: '%s'", err.c_str());
    s.train_size = 20000;
    CHECK(arith_check_size(s, 0).empty(), "the default refused: %s", arith_check_size(s, 0).c_str());
    err = arith_check_size(s, 1000);
    CHECK(err.find("memory") != std::string::npos, "1000 bytes of memory: '%s'", err.c_str());
    s.p = 2, s.ops = 1, s.train_size = 10, s.test_size = 4;   // all 14: a small set is drawn whole
    CHECK(arith_check_size(s, 0).empty(), "14 of 14 refused: %s", arith_check_size(s, 0).c_str());
}
