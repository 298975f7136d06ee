// data/tasks.h — what the model learns on: the arithmetic task of docs/tasks.md §1
// (data/arith.cpp) and plain text of docs/tasks.md §3 (data/text.cpp), turned
// into token sequences, batches and a resumable, shuffled order.
//
// Every function that can fail returns a std::string: "" on success, else
// one line naming the problem and, where there is one, the fix.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "support/lib/rng.h"

// ---------------------------------------------------------------------------
// Vocabulary: token strings <-> ids.
//
// Word vocabularies (arithmetic) split text on spaces (and newlines). The
// byte vocabulary (text) has bytes = true: 256 tokens, id = byte value; text
// is encoded byte by byte and decoded by concatenating bytes.
struct Vocab {
    std::vector<std::string> tokens;               // id -> token string
    std::unordered_map<std::string, int> ids;      // token string -> id
    int pad = 0, eos = 1;                          // eos = -1: no end token (bytes)
    bool bytes = false;
    int size() const { return (int)tokens.size(); }
    int id(const std::string& tok) const;          // -1 if unknown
    // Appends the ids of `text` to *out; "" or an error naming the unknown token.
    std::string encode(const std::string& text, std::vector<int>* out) const;
    // Tokens joined by spaces (bytes concatenated for a byte vocabulary);
    // an id outside the vocabulary shows as "<unk:ID>".
    std::string decode(const int* toks, int n) const;
};

// ---------------------------------------------------------------------------
// Sequences, batches and the data order (shared by every task).

// One training sequence: the model reads tokens[0..n-2] and predicts
// tokens[1..n-1]; the loss covers predicting tokens[i] for i >= loss_start.
// For a test sequence, tokens[0..loss_start) is the prompt.
struct Sequence {
    std::vector<int> tokens;
    int loss_start = 1;
};

struct Batch {
    int B = 0, T = 0;
    std::vector<int> tokens, targets;   // (B, T)
    std::vector<float> mask;            // (B, T): 1 where the target counts in the loss
    std::vector<float> valid;           // (B, T): 1 where the position holds a token of the sequence, 0 on padding
};

// Fill a (B, T) batch from seqs[idx[0..B-1]]: tokens[t] = s[t], targets[t] =
// s[t+1], mask[t] = 1 iff t+1 >= loss_start and t+1 < n, valid[t] = 1 iff
// t < n; padding is `pad` with mask 0 and valid 0. A sequence longer than T+1 is cut to its first T+1 tokens:
// pick T >= the longest sequence minus 1 (ArithData::seq_len).
void make_batch(const std::vector<Sequence>& seqs, const int* idx, int B, int T, int pad, Batch* out);

// Shuffled epochs, deterministic: the order of epoch e is a permutation drawn
// from Rng(seed_for(seed, "epoch" + e)), so resuming needs only (epoch, pos).
struct Loader {
    const std::vector<Sequence>* data = nullptr;
    uint64_t seed = 0;
    int epoch = 0;
    size_t pos = 0;                     // next index into order
    std::vector<int> order;             // the permutation of epoch `epoch`
    void start(const std::vector<Sequence>* d, uint64_t seed, int epoch, size_t pos);
    // The next B sequences; wraps to the next epoch, so a batch may straddle two.
    void next(int B, int T, int pad, Batch* out);
    void new_epoch();                   // epoch + 1, pos = 0, its order
};
// The permutation of 0..n-1 used for epoch e (Fisher-Yates).
std::vector<int> epoch_order(size_t n, uint64_t seed, int epoch);

// ---------------------------------------------------------------------------
// Arithmetic modulo a prime p (docs/tasks.md §1).

struct ArithSettings {
    int p = 11;              // the field: integers mod p, p prime
    int ops = 4;             // k, operators per question
    bool chain = true;       // chain of thought, else direct "E_k = x"
    int train_size = 10000;
    int test_size = 1000;
    uint64_t seed = 1;
};

// "" or one line naming the problem and the fix (p prime in 2..997, ops in
// 1..64, sizes >= 1). Whether enough distinct questions exist is checked by
// arith_check_size (task_build calls it); arith_generate itself gives up with
// a clear error after 100,000 draws in a row give nothing new.
std::string arith_check_settings(const ArithSettings& s);

// How many distinct questions E_k the generator can make for (p, k), capped
// at `cap`: every expression of k operators with brackets only where needed
// and no divisor equal to 0 (counted by value mod p, exactly). Fast whenever
// the answer is below cap ~ 1e7 (p^(k+1) distinct sums a + b + ... bound it
// from below, so the count runs only for small p^(k+1)).
uint64_t arith_distinct_questions(int p, int k, uint64_t cap);
// Refuses, before generating, what arith_generate could not do, do in
// reasonable time, or hold: more questions than arith_distinct_questions,
// more than 3/4 of them when there are over 10,000 (the rarest take very long
// to draw), or (mem_bytes > 0) more memory than mem_bytes. "" or one line
// naming the flags to change.
std::string arith_check_size(const ArithSettings& s, uint64_t mem_bytes);

// Exactly: <pad> <eos> + - * / ( ) = then "0" .. "p-1" (ids 9 .. 9+p-1).
Vocab arith_vocab(int p);

// One example's k+1 expressions E_0 = [x], E_1, ..., E_k as token strings,
// by the generation algorithm of docs/tasks.md §1. E_0[0] is the answer.
std::vector<std::vector<std::string>> arith_chain(Rng& rng, int p, int k);

// The same on token ids of arith_vocab(p) (what arith_generate uses).
std::vector<std::vector<int>> arith_chain_ids(Rng& rng, int p, int k);

struct ArithData {
    ArithSettings s;
    Vocab vocab;
    std::vector<Sequence> train, test;
    std::vector<int> test_answers;      // x of each test example
    int seq_len = 0;                    // longest sequence length minus 1 = the T a model needs
};

// Train and test sets: seeded and deterministic; every question E_k is
// distinct (within train, within test, and between them). The test set
// depends only on (p, ops, seed, test_size), so chain and direct models, and
// models with different train_size, are scored on the same questions.
// loss_start = the index just after the first "=".
std::string arith_generate(const ArithSettings& s, ArithData* out);

// Upper bound on a sequence's length including <eos>; attained (see the
// tests). Every number is one token, so it does not depend on p.
int arith_max_len(int p, int k, bool chain);

// Evaluate tokens mod p: ordinary precedence, left to right within a level,
// a / b = a * b^(p-2). "" or the error (syntax, unknown token, division by 0).
std::string arith_eval(const std::vector<std::string>& toks, int p, int* value);

// One chain step: `next` is `cur` with exactly one "a op b" (with the
// brackets around it, if any) replaced by its value mod p, that "a op b" is
// a sub-expression of `cur` (bare, it is one only where the generation rule
// would drop its brackets), and both have the same value. "" or why not.
std::string arith_check_step(const std::vector<std::string>& cur,
                             const std::vector<std::string>& next, int p);

// The generation rule for brackets: does "( a op b )" put in place of the
// number at e[pos] keep its brackets? (op is "+", "-", "*" or "/")
bool arith_needs_brackets(const std::vector<std::string>& e, size_t pos, const std::string& op);

// Do a and b, two expressions over the same sequence of number positions,
// compute the same function of those numbers? Tested by substituting random
// values mod the prime 2^31-1 (Schwartz-Zippel: a false "yes" has
// probability below 1e-12). Deterministic.
bool arith_same_function(const std::vector<std::string>& a, const std::vector<std::string>& b);

// "" if every bracket pair in `e` is needed, i.e. removing it changes the
// function computed (arith_same_function), else names the first one that is
// not (or the parse error).
std::string arith_unneeded_brackets(const std::vector<std::string>& e);

// Scoring: `generated` are the ids after the prompt "E_k =". Correct iff the
// token just before the first <eos> is the answer.
bool arith_correct(const Vocab& v, const std::vector<int>& generated, int answer);

// Chain quality of a generated chain (prompt "E_k =" plus continuation):
// steps are checked with arith_check_step up to the first <eos>; the chain
// must end in a single number followed by <eos>.
struct ChainQuality {
    bool all_valid = false;
    int first_bad_step = -1;  // = number of valid steps before the first bad one; -1 if none.
                              // A chain whose steps are valid but that stops before a single
                              // number (or has no <eos>) is bad at step = its number of steps.
    std::string why;          // "" or the reason for the first bad step
};
ChainQuality arith_chain_quality(const Vocab& v, const std::vector<int>& prompt_and_generated, int p);

// ---------------------------------------------------------------------------
// Plain text (docs/tasks.md §3): byte-level language modelling.

struct TextData {
    Vocab vocab;                        // byte vocabulary, see text_vocab
    std::vector<Sequence> train, val;   // windows of T+1 bytes, loss_start = 1
};

// 256 tokens, id = byte value; printable ASCII shows as itself, other bytes
// as "<0xNN>". There is no pad or end token: pad = 0 (the NUL byte) is safe
// because padded positions have mask 0, and eos = -1.
Vocab text_vocab();

// Read `path`; the last val_frac (in [0, 1)) of its bytes is held out for
// validation. Each part is cut into windows of T+1 bytes with stride T, so
// every byte after the first of a part is a target exactly once.
// The file is opened with file_open_regular (support/lib/safetensors.h): a
// directory, FIFO or device, or a file over 1 GiB, is refused unread. When
// mem_bytes > 0 (the memory available), a file whose windows would need more
// (text_memory_bytes) is refused before it is read, naming --seq-len.
std::string text_load(const std::string& path, int T, double val_frac, TextData* out, uint64_t mem_bytes = 0);
// The memory text_load takes for a file of `bytes` bytes at window length T:
// the bytes, plus per window a Sequence and its T+1 ints (about 33x the file
// at T = 2, 5x at T = 128).
uint64_t text_memory_bytes(uint64_t bytes, int T);
