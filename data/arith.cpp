// data/arith.cpp — arithmetic expressions modulo a prime p (docs/tasks.md §1),
// after Feng et al. 2023: generation, the sequence formats, an evaluator,
// the checks of a chain step and of brackets, and scoring.
//
// Expressions are built on token ids of arith_vocab(p) (fast: 50,000
// distinct examples of 6 operators take about 0.2 s); the checking
// functions take token strings, the form tests, sample files and decoded
// model output come in.
#include <algorithm>
#include <unordered_set>

#include "data/tasks.h"

namespace {

// Token ids of arith_vocab(p): <pad> <eos>, seven symbols, then the numbers.
enum : int { PAD = 0, EOS = 1, PLUS = 2, MINUS = 3, TIMES = 4, DIVIDE = 5,
             LPAREN = 6, RPAREN = 7, EQUALS = 8, NUM0 = 9 };
const char* const SYMBOLS[NUM0] = {"<pad>", "<eos>", "+", "-", "*", "/", "(", ")", "="};

std::string token_str(int id) { return id < NUM0 ? SYMBOLS[id] : std::to_string(id - NUM0); }

// The id of a symbol token ("+" .. "="), or -1 (numbers and anything else).
int symbol_id(const std::string& s) {
    for (int i = PLUS; i <= EQUALS; i++)
        if (s == SYMBOLS[i]) return i;
    return -1;
}
bool is_operator(int id) { return id >= PLUS && id <= DIVIDE; }

// A number token in canonical decimal (no sign, no leading zeros, at most 9
// digits): "07" is not a token of the vocabulary, so it is not a number here.
bool parse_number(const std::string& s, uint64_t* v) {
    if (s.empty() || s.size() > 9 || (s.size() > 1 && s[0] == '0')) return false;
    uint64_t x = 0;
    for (char c : s) {
        if (c < '0' || c > '9') return false;
        x = x * 10 + (uint64_t)(c - '0');
    }
    *v = x;
    return true;
}

// ---------------------------------------------------------------------------
// Arithmetic in the field of integers mod a prime m (m < 2^32, so a product
// of two residues fits in 64 bits).

uint64_t pow_mod(uint64_t b, uint64_t e, uint64_t m) {
    uint64_t r = 1 % m;
    b %= m;
    for (; e; e >>= 1) {
        if (e & 1) r = r * b % m;
        b = b * b % m;
    }
    return r;
}
// b^-1 = b^(m-2) by Fermat's little theorem; b != 0.
uint64_t inv_mod(uint64_t b, uint64_t m) { return pow_mod(b, m - 2, m); }

// a op b mod m; for DIVIDE, b != 0.
uint64_t apply(uint64_t a, int op, uint64_t b, uint64_t m) {
    switch (op) {
        case PLUS: return (a + b) % m;
        case MINUS: return (a + m - b) % m;
        case TIMES: return a * b % m;
        default: return a * inv_mod(b, m) % m;
    }
}

bool is_prime(int n) {
    if (n < 2) return false;
    for (int d = 2; d * d <= n; d++)
        if (n % d == 0) return false;
    return true;
}

// ---------------------------------------------------------------------------
// Generation (docs/tasks.md §1, step 2).

// "keeping the brackets only where they are needed for ordinary precedence
// (left to right within a level): needed when the token before is `/`; when
// the new op is `+` or `-` and the token before is `*` or `-`, or the token
// after is `*` or `/`. Otherwise drop them."
// before/after: the tokens around the number being replaced, -1 for none.
bool brackets_needed(int before, int after, int op) {
    if (before == DIVIDE) return true;
    bool additive = op == PLUS || op == MINUS;
    return additive && (before == TIMES || before == MINUS || after == TIMES || after == DIVIDE);
}

// "draw `a` uniform in 0..p-1 and an operator uniform among the four; choose
// `b` so that `a op b == x` mod p (for `*`: if a == 0 and x != 0 draw again,
// if a == x == 0 draw b uniform; for `/`: b != 0 always, if a == x == 0 draw
// b uniform non-zero, if exactly one of a, x is 0 draw again)."
// "Draw again" redraws both a and the operator, as Feng's generator does.
void draw_operation(Rng& rng, uint64_t p, uint64_t x, int* a_out, int* op_out, int* b_out) {
    for (;;) {
        uint64_t a = rng.below(p);
        int op = PLUS + (int)rng.below(4);
        uint64_t b;
        if (op == PLUS) {
            b = (x + p - a) % p;                               // a + b = x
        } else if (op == MINUS) {
            b = (a + p - x) % p;                               // a - b = x
        } else if (op == TIMES) {
            if (a == 0 && x != 0) continue;                    // 0 * b is never x
            b = a == 0 ? rng.below(p) : x * inv_mod(a, p) % p;  // any b, or x / a
        } else {
            if (a == 0 && x == 0) b = 1 + rng.below(p - 1);    // 0 / b = 0 for any b != 0
            else if (a == 0 || x == 0) continue;               // a / b = 0 needs a = 0
            else b = a * inv_mod(x, p) % p;                    // a / b = x  <=>  b = a / x
        }
        *a_out = (int)a, *op_out = op, *b_out = (int)b;
        return;
    }
}

// Replace the number at e[pos] by "( a op b )", brackets dropped where the
// rule says they are not needed.
void expand(std::vector<int>* e, size_t pos, int a, int op, int b) {
    int before = pos > 0 ? (*e)[pos - 1] : -1;
    int after = pos + 1 < e->size() ? (*e)[pos + 1] : -1;
    std::vector<int> repl;
    bool br = brackets_needed(before, after, op);
    if (br) repl.push_back(LPAREN);
    repl.insert(repl.end(), {NUM0 + a, op, NUM0 + b});
    if (br) repl.push_back(RPAREN);
    e->erase(e->begin() + (long)pos);
    e->insert(e->begin() + (long)pos, repl.begin(), repl.end());
}

// ---------------------------------------------------------------------------
// Evaluation: recursive descent over token strings, one function per
// precedence level, each level folding left to right.
//   expr   := term   (("+" | "-") term)*
//   term   := factor (("*" | "/") factor)*
//   factor := number | "(" expr ")"

struct Parser {
    const std::vector<std::string>& t;
    uint64_t m;                               // the field: integers mod m
    uint64_t limit;                           // a number token must be < limit
    const std::vector<uint64_t>* subst;       // value of the i-th number, or null: its own
    size_t pos = 0, n_numbers = 0;
    std::string err;                          // first error
    bool div_zero = false;                    // that error is a division by zero
    bool allow_div0 = false;                  // syntax only: x / 0 gives 0, no error
    int depth = 0;                            // brackets open at pos
    // Each open bracket is a level of recursion: without a cap, a line of
    // 100,000 "(" (a model's output, say) would overflow the stack. The
    // generator's lines never nest deeper than their 64 operators.
    static constexpr int MAX_DEPTH = 256;

    Parser(const std::vector<std::string>& toks, uint64_t mod, uint64_t lim, const std::vector<uint64_t>* s)
        : t(toks), m(mod), limit(lim), subst(s) {}

    void fail(const std::string& msg) {
        if (err.empty()) err = msg;
    }
    std::string where() const { return " at token " + std::to_string(pos); }
    int peek() const { return pos < t.size() ? symbol_id(t[pos]) : -1; }

    uint64_t expr() {
        uint64_t v = term();
        while (err.empty() && (peek() == PLUS || peek() == MINUS)) {
            int op = symbol_id(t[pos++]);
            v = apply(v, op, term(), m);
        }
        return v;
    }
    uint64_t term() {
        uint64_t v = factor();
        while (err.empty() && (peek() == TIMES || peek() == DIVIDE)) {
            int op = symbol_id(t[pos++]);
            size_t at = pos;
            uint64_t w = factor();
            if (!err.empty()) return 0;
            if (op == DIVIDE && w == 0 && !allow_div0) {
                pos = at;
                fail("division by zero" + where());
                div_zero = true;
                return 0;
            }
            v = op == DIVIDE && w == 0 ? 0 : apply(v, op, w, m);
        }
        return v;
    }
    uint64_t factor() {
        if (!err.empty()) return 0;
        if (pos >= t.size()) { fail("the expression ends early" + where()); return 0; }
        if (t[pos] == "(") {
            if (depth == MAX_DEPTH) { fail("brackets nested deeper than " + std::to_string(MAX_DEPTH) + where()); return 0; }
            depth++;
            pos++;
            uint64_t v = expr();
            if (err.empty() && peek() != RPAREN) fail("expected ')'" + where());
            pos++;
            depth--;
            return v;
        }
        uint64_t v;
        if (!parse_number(t[pos], &v)) {
            fail((symbol_id(t[pos]) >= 0 ? "unexpected '" : "unknown token '") + t[pos] + "'" + where());
            return 0;
        }
        if (v >= limit) { fail("'" + t[pos] + "'" + where() + " is not a number mod " + std::to_string(limit)); return 0; }
        if (subst) v = n_numbers < subst->size() ? (*subst)[n_numbers] : 0;
        n_numbers++, pos++;
        return v % m;
    }
    // The whole token list must be one expression.
    uint64_t all() {
        if (t.empty()) { fail("empty expression"); return 0; }
        uint64_t v = expr();
        if (err.empty() && pos < t.size()) fail("unexpected '" + t[pos] + "'" + where());
        return v;
    }
};

const uint64_t BIG_PRIME = 2147483647;  // 2^31 - 1, the field arith_same_function works in

// ---------------------------------------------------------------------------
// Formats (docs/tasks.md §1): chain "E_k = E_{k-1} = ... = E_0 <eos>", direct "E_k = E_0 <eos>".

Sequence to_sequence(const std::vector<std::vector<int>>& chain, bool chain_format) {
    int k = (int)chain.size() - 1;
    Sequence s;
    for (int j = k; j >= 0; j--) {
        if (!chain_format && j != k && j != 0) continue;
        if (j != k) s.tokens.push_back(EQUALS);
        s.tokens.insert(s.tokens.end(), chain[j].begin(), chain[j].end());
    }
    s.tokens.push_back(EOS);
    // "the loss covers every target after the first `=`"
    s.loss_start = (int)chain[k].size() + 1;
    return s;
}

// A hashable key for a question: two bytes per token id (ids < 1006).
std::string question_key(const std::vector<int>& e) {
    std::string key;
    for (int id : e) key += (char)(id & 0xff), key += (char)(id >> 8);
    return key;
}

}  // namespace

// ---------------------------------------------------------------------------

std::string arith_check_settings(const ArithSettings& s) {
    if (s.p < 2 || s.p > 997)
        return "p = " + std::to_string(s.p) + " is outside 2..997; try 11 (the paper's) or another prime up to 997";
    if (!is_prime(s.p)) {
        int lo = s.p - 1, hi = s.p + 1;
        while (!is_prime(lo)) lo--;
        while (!is_prime(hi)) hi++;
        return "p = " + std::to_string(s.p) + " is not prime; try " + std::to_string(lo) + " or " + std::to_string(hi);
    }
    if (s.ops < 1 || s.ops > 64)
        return "ops = " + std::to_string(s.ops) + " is outside 1..64; the paper trains 4, 5 and 6";
    if (s.train_size < 1) return "train_size = " + std::to_string(s.train_size) + " must be at least 1";
    if (s.test_size < 1) return "test_size = " + std::to_string(s.test_size) + " must be at least 1";
    return "";
}

namespace {
const uint64_t COUNT_CAP = (uint64_t)1 << 62;
uint64_t sat_add(uint64_t a, uint64_t b) { return std::min(a + b, COUNT_CAP); }  // a, b <= COUNT_CAP
uint64_t sat_mul(uint64_t a, uint64_t b) { return a && b > COUNT_CAP / a ? COUNT_CAP : std::min(a * b, COUNT_CAP); }
}  // namespace

// The questions are the strings of this grammar (brackets_needed puts exactly
// these; a subtree of the generator's tree keeps its value, so a divisor is
// never 0), counted by value v mod p with n operators:
//   X  (any, unbracketed; also the left operand of + - * /, and the right one
//       of -, where an additive one is bracketed: same count)
//   Ea = X (+) P | X (-) X          P (right of +)  = number | Tm
//   Tm = X (*) F | X (/) D          F (right of *)  = number | ( Ea )
//                                   D (right of /)  = (number | ( Tm | Ea )) != 0
// so X[n] = Tm[n] + Ea[n] (n >= 1), and "a + (b - c)" is not a string of its
// own: the generator writes it a + b - c, the same string as (a + b) - c.
uint64_t arith_distinct_questions(int p, int k, uint64_t cap) {
    if (p < 2 || k < 0) return 0;
    uint64_t lower = 1;  // the p^(k+1) sums a + b + ... are distinct questions
    for (int i = 0; i <= k && lower < cap; i++) lower = sat_mul(lower, (uint64_t)p);
    if (lower >= cap) return cap;
    std::vector<uint64_t> inv(p, 0);
    for (int b = 1; b < p; b++) inv[b] = inv_mod((uint64_t)b, (uint64_t)p);
    using Dist = std::vector<uint64_t>;  // count by value
    std::vector<Dist> X(k + 1, Dist(p, 0)), Tm(k + 1, Dist(p, 0)), Ea(k + 1, Dist(p, 0));
    X[0].assign(p, 1);
    auto plus_r = [&](int n) { return n == 0 ? X[0] : Tm[n]; };
    auto times_r = [&](int n) { return n == 0 ? X[0] : Ea[n]; };
    for (int n = 1; n <= k; n++) {
        for (int n1 = 0; n1 < n; n1++) {
            int n2 = n - 1 - n1;
            const Dist &l = X[n1], &r = X[n2];
            Dist pr = plus_r(n2), tr = times_r(n2);
            for (int a = 0; a < p; a++) {
                if (!l[a]) continue;
                for (int b = 0; b < p; b++) {
                    Ea[n][(a + b) % p] = sat_add(Ea[n][(a + b) % p], sat_mul(l[a], pr[b]));
                    Ea[n][(a + p - b) % p] = sat_add(Ea[n][(a + p - b) % p], sat_mul(l[a], r[b]));
                    int ab = (int)((uint64_t)a * b % p);
                    Tm[n][ab] = sat_add(Tm[n][ab], sat_mul(l[a], tr[b]));
                    if (b) {
                        int q = (int)((uint64_t)a * inv[b] % p);
                        Tm[n][q] = sat_add(Tm[n][q], sat_mul(l[a], r[b]));
                    }
                }
            }
        }
        for (int v = 0; v < p; v++) X[n][v] = sat_add(Tm[n][v], Ea[n][v]);
    }
    uint64_t total = 0;
    for (uint64_t c : X[k]) total = sat_add(total, c);
    return std::min(total, cap);
}

std::string arith_check_size(const ArithSettings& s, uint64_t mem_bytes) {
    std::string err = arith_check_settings(s);
    if (!err.empty()) return err;
    uint64_t want = (uint64_t)s.train_size + (uint64_t)s.test_size;
    uint64_t have = arith_distinct_questions(s.p, s.ops, 2 * want + 2);  // capped: enough to tell
    // Questions are drawn at random until enough are new: the last, rarest ones of a large set take
    // very long (or 100,000 draws in a row give nothing new), so a large set gives at most 3/4 of
    // it; a small one is drawn whole quickly. One bound, the same in every message.
    uint64_t most = have > 10000 ? have / 4 * 3 : have;
    if (want > most)
        return "p = " + std::to_string(s.p) + ", ops = " + std::to_string(s.ops) + " make " +
               (have < want ? "only " : "") + std::to_string(have) + " distinct questions" +
               (most < have ? ", of which random drawing finds at most 3/4 in reasonable time" : "") +
               "; --train-size + --test-size = " + std::to_string(want) + " asks for more: ask for at most " +
               std::to_string(most) + " in all, or raise --ops or --modulus";
    // per example: its Sequence (twice, as the vector grows), the tokens' block, the key in the set of seen questions
    uint64_t len = (uint64_t)arith_max_len(s.p, s.ops, s.chain);
    uint64_t per = 2 * sizeof(Sequence) + (4 * len + 8 + 15) / 16 * 16 + 64 + (2 * (4 * (uint64_t)s.ops) + 16 + 15) / 16 * 16;
    if (mem_bytes > 0 && want * per > mem_bytes)
        return std::to_string(want) + " examples (--train-size + --test-size) would take about " +
               std::to_string(want * per >> 20) + " MiB, more than the " + std::to_string(mem_bytes >> 20) +
               " MiB of memory available; ask for at most " + std::to_string(mem_bytes / per) + " in all";
    return "";
}

Vocab arith_vocab(int p) {
    Vocab v;
    for (int i = 0; i < NUM0 + p; i++) {
        v.tokens.push_back(token_str(i));
        v.ids[v.tokens.back()] = i;
    }
    v.pad = PAD, v.eos = EOS;
    return v;
}

std::vector<std::vector<int>> arith_chain_ids(Rng& rng, int p, int k) {
    // "1. Start from the token list [x], x uniform in 0..p-1. x is the answer."
    std::vector<int> e = {NUM0 + (int)rng.below((uint64_t)p)};
    std::vector<std::vector<int>> history = {e};
    // "2. Repeat k times: pick a uniformly random position holding a number x"
    for (int j = 0; j < k; j++) {
        uint64_t r = rng.below((uint64_t)j + 1);  // E_j holds j+1 numbers; take the r-th
        size_t pos = 0;
        for (;; pos++)
            if (e[pos] >= NUM0 && r-- == 0) break;
        int a, op, b;
        draw_operation(rng, (uint64_t)p, (uint64_t)(e[pos] - NUM0), &a, &op, &b);
        expand(&e, pos, a, op, b);
        history.push_back(e);
    }
    return history;
}

std::vector<std::vector<std::string>> arith_chain(Rng& rng, int p, int k) {
    std::vector<std::vector<std::string>> out;
    for (const std::vector<int>& e : arith_chain_ids(rng, p, k)) {
        out.emplace_back();
        for (int id : e) out.back().push_back(token_str(id));
    }
    return out;
}

std::string arith_generate(const ArithSettings& s, ArithData* out) {
    std::string err = arith_check_settings(s);
    if (!err.empty()) return err;
    *out = ArithData();
    out->s = s;
    out->vocab = arith_vocab(s.p);

    // Questions must be distinct: within train, within test, and between
    // them ("Test examples are distinct from every training example"). When
    // the settings allow fewer distinct questions than asked (p = 2, ops = 1
    // has 14), draws keep repeating; give up after this many in a row.
    const int MAX_DRY = 100000;
    std::unordered_set<std::string> seen;
    auto draw = [&](Rng& rng, int want, std::vector<Sequence>* seqs, std::vector<int>* answers) -> std::string {
        int dry = 0;
        while ((int)seqs->size() < want) {
            std::vector<std::vector<int>> chain = arith_chain_ids(rng, s.p, s.ops);
            if (!seen.insert(question_key(chain.back())).second) {
                if (++dry < MAX_DRY) continue;
                return "p = " + std::to_string(s.p) + ", ops = " + std::to_string(s.ops) + ": found only " +
                       std::to_string(seen.size()) + " distinct questions (" + std::to_string(MAX_DRY) +
                       " draws in a row gave nothing new) but train_size + test_size = " +
                       std::to_string((long long)s.train_size + s.test_size) +
                       "; ask for fewer examples or raise p or ops";
            }
            dry = 0;
            seqs->push_back(to_sequence(chain, s.chain));
            if (answers) answers->push_back(chain[0][0] - NUM0);
        }
        return "";
    };
    // The test set first, from its own stream, so that it depends only on
    // (p, ops, seed, test_size); then training questions not seen so far.
    Rng test_rng(seed_for(s.seed, "arith-test"));
    err = draw(test_rng, s.test_size, &out->test, &out->test_answers);
    if (!err.empty()) return err;
    Rng train_rng(seed_for(s.seed, "arith-train"));
    err = draw(train_rng, s.train_size, &out->train, nullptr);
    if (!err.empty()) return err;

    size_t longest = 0;
    for (const auto* set : {&out->train, &out->test})
        for (const Sequence& q : *set) longest = std::max(longest, q.tokens.size());
    out->seq_len = (int)longest - 1;
    return "";
}

int arith_max_len(int p, int k, bool chain) {
    (void)p;  // every number is one token, so lengths do not depend on p
    // E_0 is one number. E_j (j >= 1) has j+1 numbers, j operators and at
    // most j-1 bracket pairs: the first expansion replaces the lone number,
    // which has no neighbours, so it never keeps brackets; each later one
    // may. Hence at most 4j - 1 tokens, attained when every later one does.
    auto len = [](int j) { return j == 0 ? 1 : 4 * j - 1; };
    if (!chain) return len(k) + 3;  // "E_k = x <eos>"
    int n = 0;
    for (int j = 0; j <= k; j++) n += len(j);
    return n + k + 1;               // k "=" and <eos>
}

std::string arith_eval(const std::vector<std::string>& toks, int p, int* value) {
    Parser ps(toks, (uint64_t)p, (uint64_t)p, nullptr);
    uint64_t v = ps.all();
    if (!ps.err.empty()) return ps.err;
    *value = (int)v;
    return "";
}

bool arith_needs_brackets(const std::vector<std::string>& e, size_t pos, const std::string& op) {
    int before = pos > 0 ? symbol_id(e[pos - 1]) : -1;
    int after = pos + 1 < e.size() ? symbol_id(e[pos + 1]) : -1;
    return brackets_needed(before, after, symbol_id(op));
}

std::string arith_check_step(const std::vector<std::string>& cur, const std::vector<std::string>& next, int p) {
    int vc, vn;
    std::string err = arith_eval(cur, p, &vc);
    if (!err.empty()) return "the line before: " + err;
    err = arith_eval(next, p, &vn);
    if (!err.empty()) return "the line after: " + err;
    if (vc != vn) return "the value changes from " + std::to_string(vc) + " to " + std::to_string(vn);

    // Try every "a op b" of cur; the step is valid if collapsing one of them gives next.
    std::string why = "the line after is not the line before with one 'a op b' replaced by its value";
    for (size_t i = 0; i + 2 < cur.size(); i++) {
        uint64_t a, b;
        int op = symbol_id(cur[i + 1]);
        if (!parse_number(cur[i], &a) || !is_operator(op) || !parse_number(cur[i + 2], &b)) continue;
        if (op == DIVIDE && b == 0) continue;  // (arith_eval has refused it already)
        std::string v = std::to_string(apply(a, op, b, (uint64_t)p));
        // "( a op b )" collapses with its brackets: "( v )" is never a line.
        bool bracketed = i > 0 && cur[i - 1] == "(" && i + 3 < cur.size() && cur[i + 3] == ")";
        size_t lo = bracketed ? i - 1 : i, hi = bracketed ? i + 4 : i + 3;  // cur[lo, hi) -> v
        if (next.size() != cur.size() - (hi - lo) + 1 || next[lo] != v) continue;
        if (!std::equal(cur.begin(), cur.begin() + (long)lo, next.begin())) continue;
        if (!std::equal(cur.begin() + (long)hi, cur.end(), next.begin() + (long)lo + 1)) continue;
        // A bare "a op b" is a sub-expression (up to associativity) exactly
        // where generation would drop its brackets: "2 + 3 * 4 = 5 * 4" is not
        // a step, "4 * 2 / 5 = 4 * 7" is. The value test above cannot always
        // tell ("0 + 3 * 1 = 3 * 1" keeps the value).
        if (!bracketed && arith_needs_brackets(next, lo, cur[i + 1])) {
            why = "'" + cur[i] + " " + cur[i + 1] + " " + cur[i + 2] + "' at token " + std::to_string(i) +
                  " is not a sub-expression: precedence groups it otherwise";
            continue;
        }
        return "";
    }
    return why;
}

bool arith_same_function(const std::vector<std::string>& a, const std::vector<std::string>& b) {
    Rng rng(seed_for(0, "arith_same_function"));
    int agreed = 0;
    // Two agreeing random points decide; a point where either side divides by
    // zero (probability ~ 1e-8) is skipped.
    for (int tries = 0; tries < 20 && agreed < 2; tries++) {
        std::vector<uint64_t> vals(a.size());
        for (uint64_t& x : vals) x = rng.below(BIG_PRIME);
        Parser pa(a, BIG_PRIME, UINT64_MAX, &vals), pb(b, BIG_PRIME, UINT64_MAX, &vals);
        uint64_t va = pa.all(), vb = pb.all();
        if (pa.div_zero || pb.div_zero) continue;
        if (!pa.err.empty() || !pb.err.empty() || pa.n_numbers != pb.n_numbers) return false;
        if (va != vb) return false;
        agreed++;
    }
    return agreed == 2;
}

std::string arith_unneeded_brackets(const std::vector<std::string>& e) {
    // Syntax first (then every bracket is matched).
    Parser ps(e, BIG_PRIME, UINT64_MAX, nullptr);
    ps.allow_div0 = true;
    ps.all();
    if (!ps.err.empty()) return ps.err;
    // Each bracket pair: is the expression without it a different function?
    std::vector<size_t> open;
    for (size_t r = 0; r < e.size(); r++) {
        if (e[r] == "(") open.push_back(r);
        if (e[r] != ")") continue;
        size_t l = open.back();
        open.pop_back();
        std::vector<std::string> without;
        for (size_t i = 0; i < e.size(); i++)
            if (i != l && i != r) without.push_back(e[i]);
        if (arith_same_function(e, without))
            return "the brackets at tokens " + std::to_string(l) + " and " + std::to_string(r) +
                   " are not needed: the expression computes the same without them";
    }
    return "";
}

bool arith_correct(const Vocab& v, const std::vector<int>& generated, int answer) {
    // "correct iff the token just before the first generated <eos> is the answer"
    auto eos = std::find(generated.begin(), generated.end(), v.eos);
    if (eos == generated.end() || eos == generated.begin()) return false;
    return *(eos - 1) == v.id(std::to_string(answer));
}

ChainQuality arith_chain_quality(const Vocab& v, const std::vector<int>& toks, int p) {
    // Split at "=" up to the first <eos>: lines[0] is the question E_k.
    std::vector<std::vector<std::string>> lines(1);
    bool ended = false;
    for (int id : toks) {
        if (id == v.eos) { ended = true; break; }
        std::string s = v.decode(&id, 1);
        if (s == "=") lines.emplace_back();
        else lines.back().push_back(s);
    }
    ChainQuality q;
    int steps = (int)lines.size() - 1;
    for (int i = 0; i < steps; i++) {
        std::string err = arith_check_step(lines[i], lines[i + 1], p);
        if (!err.empty()) {
            q.first_bad_step = i;
            q.why = "step " + std::to_string(i) + ": " + err;
            return q;
        }
    }
    uint64_t x;
    bool at_number = lines.back().size() == 1 && parse_number(lines.back()[0], &x);
    if (!ended || !at_number) {
        q.first_bad_step = steps;
        q.why = !ended ? "no <eos>" : "stops before reaching a single number";
        return q;
    }
    q.all_valid = true;
    return q;
}
