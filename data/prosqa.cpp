// data/prosqa.cpp — ProsQA: the real files, the graph generator, text and
// tokens, scoring. See data/prosqa.h and docs/tasks.md §2.
#include "data/prosqa.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <set>

#include "support/lib/safetensors.h"   // Json, json_parse

namespace {

// ---------------------------------------------------------------------------
// Graph helpers (nodes 0..n-1, edges [parent, child]).

std::vector<std::vector<int>> children_of(int n, const std::vector<std::pair<int, int>>& edges) {
    std::vector<std::vector<int>> ch(n);
    for (auto& e : edges) ch[e.first].push_back(e.second);
    return ch;
}

// Breadth-first distances from `from` (-1: unreachable) and each reached
// node's predecessor on one shortest path.
void bfs(const std::vector<std::vector<int>>& ch, int from, std::vector<int>* dist, std::vector<int>* pred) {
    dist->assign(ch.size(), -1);
    pred->assign(ch.size(), -1);
    std::vector<int> queue = {from};
    (*dist)[from] = 0;
    for (size_t q = 0; q < queue.size(); q++)
        for (int c : ch[queue[q]])
            if ((*dist)[c] < 0) {
                (*dist)[c] = (*dist)[queue[q]] + 1;
                (*pred)[c] = queue[q];
                queue.push_back(c);
            }
}

bool is_person(const std::string& symbol) { return !symbol.empty() && symbol[0] >= 'A' && symbol[0] <= 'Z'; }

// "Tom is a terpus." or "Every terpus is a brimpus."
std::string fact(const std::string& parent, const std::string& child) {
    return (is_person(parent) ? parent : "Every " + parent) + " is a " + child + ".";
}

// ---------------------------------------------------------------------------
// Reading the JSON files.

bool as_index(const Json* j, int n, int* out) {
    if (!j || j->kind != Json::NUM || j->num != std::floor(j->num) || j->num < 0 || j->num >= n) return false;
    *out = (int)j->num;
    return true;
}

bool as_strings(const Json* j, std::vector<std::string>* out) {
    if (!j || j->kind != Json::ARR) return false;
    out->clear();
    for (const Json& s : j->arr) {
        if (s.kind != Json::STR) return false;
        out->push_back(s.str);
    }
    return true;
}

// One item; the error names the field (the caller adds file and item).
std::string read_item(const Json& j, ProsqaItem* it) {
    if (j.kind != Json::OBJ) return "is not an object";
    for (const char* key : {"question", "answer"}) {
        const Json* s = j.get(key);
        if (!s || s->kind != Json::STR) return std::string("\"") + key + "\" is missing or not a string";
        (key[0] == 'q' ? it->question : it->answer) = s->str;
    }
    if (!as_strings(j.get("steps"), &it->steps)) return "\"steps\" is missing or not a list of strings";
    if (!as_strings(j.get("idx_to_symbol"), &it->idx_to_symbol) || it->idx_to_symbol.empty())
        return "\"idx_to_symbol\" is missing or not a non-empty list of strings";
    int n = (int)it->idx_to_symbol.size();
    const Json* edges = j.get("edges");
    if (!edges || edges->kind != Json::ARR) return "\"edges\" is not a list of [parent, child] pairs";
    it->edges.clear();
    for (const Json& e : edges->arr) {
        int p, c;
        if (e.kind != Json::ARR || e.arr.size() != 2) return "\"edges\" is not a list of [parent, child] pairs";
        if (!as_index(&e.arr[0], n, &p) || !as_index(&e.arr[1], n, &c))
            return "\"edges\" has a node that is not an integer in 0.." + std::to_string(n - 1);
        it->edges.push_back({p, c});
    }
    const char* keys[3] = {"root", "target", "neg_target"};
    int* dst[3] = {&it->root, &it->target, &it->neg_target};
    for (int k = 0; k < 3; k++)
        if (!as_index(j.get(keys[k]), n, dst[k]))
            return std::string("\"") + keys[k] + "\" is missing or not an integer in 0.." + std::to_string(n - 1);
    return "";
}

// ---------------------------------------------------------------------------
// The generator (Coconut, Algorithm 1).

int poisson(Rng& rng, double mean) {   // Knuth: count uniforms until their product drops below e^-mean
    double limit = std::exp(-mean), p = rng.uniform();
    int k = 0;
    while (p >= limit) { p *= rng.uniform(); k++; }
    return k;
}

// k distinct items of `cand`, each draw proportional to its weight among those left.
std::vector<int> weighted_sample(Rng& rng, std::vector<int> cand, std::vector<double> w, int k) {
    std::vector<int> out;
    for (int draw = 0; draw < k && !cand.empty(); draw++) {
        double total = 0;
        for (double x : w) total += x;
        double u = rng.uniform() * total;
        size_t i = 0;
        while (i + 1 < cand.size() && u >= w[i]) u -= w[i++];
        out.push_back(cand[i]);
        cand.erase(cand.begin() + (long)i);
        w.erase(w.begin() + (long)i);
    }
    return out;
}

// The DAG: node 0 has label 1, node 1 label 2 (bit b: descends from node b);
// each new node takes parents and the OR of their labels.
struct Dag {
    std::vector<int> label, depth;               // depth: shortest distance from a parentless node
    std::vector<std::pair<int, int>> edges;
};

Dag draw_dag(Rng& rng, const ProsqaGenSettings& s) {
    Dag g;
    g.label = {1, 2};
    g.depth = {0, 0};
    for (int node = 2; node < s.nodes; node++) {
        int n = poisson(rng, s.mean_parents);
        while (n == 0 && rng.uniform() >= s.keep_parentless) n = poisson(rng, s.mean_parents);
        // which labels may be parents: the two sides keep A and B apart
        double u = rng.uniform();
        int side = u < s.p_side ? 1 : u < 2 * s.p_side ? 2 : 0;   // 0: any node
        std::vector<int> cand;
        std::vector<double> w;
        for (int c = 0; c < node; c++)
            if (side == 0 || g.label[c] == 0 || g.label[c] == side) {
                cand.push_back(c);
                w.push_back(s.depth_weight * g.depth[c] + 1);
            }
        int label = 0, depth = -1;
        for (int p : weighted_sample(rng, cand, w, std::min(n, (int)cand.size()))) {
            label |= g.label[p];
            depth = depth < 0 ? g.depth[p] + 1 : std::min(depth, g.depth[p] + 1);
            g.edges.push_back({p, node});
        }
        g.label.push_back(label);
        g.depth.push_back(std::max(depth, 0));
    }
    return g;
}

template <class T> void shuffle(Rng& rng, std::vector<T>* v) {
    for (size_t i = v->size(); i > 1; i--) std::swap((*v)[i - 1], (*v)[rng.below(i)]);
}

// Picks A and B, names the nodes and writes the text. false: this graph will
// not do (no suitable A or B, or too few words).
bool make_item(Rng& rng, const Dag& g, const ProsqaGenSettings& s, ProsqaItem* it) {
    // Drop isolated nodes (they would appear in no sentence); keep 0 and 1.
    int drawn = (int)g.label.size();
    std::vector<int> degree(drawn, 0), renum(drawn, -1);
    for (auto& e : g.edges) degree[e.first]++, degree[e.second]++;
    std::vector<int> label;
    for (int v = 0; v < drawn; v++)
        if (v < 2 || degree[v] > 0) { renum[v] = (int)label.size(); label.push_back(g.label[v]); }
    int n = (int)label.size();
    it->edges.clear();
    for (auto& e : g.edges) it->edges.push_back({renum[e.first], renum[e.second]});

    auto ch = children_of(n, it->edges);
    std::vector<bool> has_parent(n, false);
    for (auto& e : it->edges) has_parent[e.second] = true;
    std::vector<int> dist, pred;
    bfs(ch, 0, &dist, &pred);
    // A: the label-1 leaf farthest from the person (as in every real item); B: any label-2 leaf
    std::vector<int> far, neg;
    int best = -1;
    for (int v = 0; v < n; v++) {
        if (!ch[v].empty() || !has_parent[v]) continue;
        if (label[v] == 2) neg.push_back(v);
        if (label[v] != 1) continue;
        if (dist[v] > best) { best = dist[v]; far.clear(); }
        if (dist[v] == best) far.push_back(v);
    }
    if (far.empty() || neg.empty() || best < s.min_steps || best > s.max_steps) return false;
    if (best == s.min_steps && rng.uniform() >= s.keep_shortest) return false;
    it->root = 0;
    it->target = far[rng.below(far.size())];
    it->neg_target = neg[rng.below(neg.size())];

    // Names: parentless nodes are persons, the others concepts; all distinct.
    std::vector<std::string> names = prosqa_names(), concepts = prosqa_concepts();
    shuffle(rng, &names);
    shuffle(rng, &concepts);
    size_t used_names = 0, used_concepts = 0;
    it->idx_to_symbol.assign(n, "");
    for (int v = 0; v < n; v++) {
        if (!has_parent[v] && used_names == names.size()) return false;
        if (has_parent[v] && used_concepts == concepts.size()) return false;
        it->idx_to_symbol[v] = has_parent[v] ? concepts[used_concepts++] : names[used_names++];
    }

    // Text: the facts in random order, then the question with A and B in random order.
    const auto& sym = it->idx_to_symbol;
    std::vector<std::string> facts;
    for (auto& e : it->edges) facts.push_back(fact(sym[e.first], sym[e.second]));
    shuffle(rng, &facts);
    bool a_first = rng.below(2) == 0;
    std::string a = sym[it->target], b = sym[it->neg_target];
    it->question.clear();
    for (auto& f : facts) it->question += f + " ";
    it->question += "Is " + sym[0] + " a " + (a_first ? a : b) + " or " + (a_first ? b : a) + "?";
    std::vector<int> path;   // target back to the person
    for (int v = it->target; v >= 0; v = pred[v]) path.push_back(v);
    std::reverse(path.begin(), path.end());
    it->steps.clear();
    for (size_t i = 0; i + 1 < path.size(); i++) it->steps.push_back(fact(sym[path[i]], sym[path[i + 1]]));
    it->answer = sym[0] + " is a " + a + ".";
    return true;
}

// ---------------------------------------------------------------------------
// Checking an item.

// "X is a Y." / "Every X is a Y." -> (X, Y); false if not of that form.
bool parse_fact(const std::string& s, std::string* x, std::string* y) {
    std::string body = s;
    if (body.rfind("Every ", 0) == 0) body = body.substr(6);
    size_t mid = body.find(" is a ");
    if (mid == std::string::npos || body.size() < 2 || body.back() != '.') return false;
    *x = body.substr(0, mid);
    *y = body.substr(mid + 6, body.size() - mid - 7);
    return fact(*x, *y) == s;   // the exact canonical form, "Every" only for concepts
}

// The question's sentences: split after each ". " / "?".
std::vector<std::string> sentences(const std::string& text) {
    std::vector<std::string> out;
    size_t start = 0;
    for (size_t i = 0; i < text.size(); i++)
        if (text[i] == '.' || text[i] == '?') {
            out.push_back(text.substr(start, i + 1 - start));
            start = i + 1;
            while (start < text.size() && text[start] == ' ') start++;
            i = start - 1;
        }
    if (start < text.size()) out.push_back(text.substr(start));
    return out;
}

std::string check_question(const ProsqaItem& it) {
    const auto& sym = it.idx_to_symbol;
    std::vector<std::string> got = sentences(it.question);
    if (got.empty()) return "the question is empty";
    std::string ask = got.back();
    got.pop_back();
    std::multiset<std::string> want, have(got.begin(), got.end());
    for (auto& e : it.edges) want.insert(fact(sym[e.first], sym[e.second]));
    if (want != have) return "the question's facts are not exactly the edges";
    std::string a = sym[it.target], b = sym[it.neg_target], who = "Is " + sym[it.root] + " a ";
    if (ask != who + a + " or " + b + "?" && ask != who + b + " or " + a + "?")
        return "the question does not end in \"" + who + a + " or " + b + "?\"";
    return "";
}

std::string check_steps(const ProsqaItem& it, const std::vector<std::vector<int>>& ch) {
    const auto& sym = it.idx_to_symbol;
    std::map<std::string, int> node;
    for (int v = 0; v < (int)sym.size(); v++) node[sym[v]] = v;
    int at = it.root;
    for (size_t i = 0; i < it.steps.size(); i++) {
        std::string x, y, where = "step " + std::to_string(i + 1) + " \"" + it.steps[i] + "\"";
        if (!parse_fact(it.steps[i], &x, &y)) return where + " is not \"[Every] X is a Y.\"";
        if (!node.count(x) || node[x] != at) return where + " does not start where the path is (" + sym[at] + ")";
        if (!node.count(y) || std::find(ch[at].begin(), ch[at].end(), node[y]) == ch[at].end())
            return where + " is not an edge";
        at = node[y];
    }
    if (at != it.target) return "the steps end at " + sym[at] + ", not at the target " + sym[it.target];
    if (it.answer != sym[it.root] + " is a " + sym[it.target] + ".") return "the answer is not \"" + sym[it.root] + " is a " + sym[it.target] + ".\"";
    return "";
}

// ---------------------------------------------------------------------------
// Tokens.

// Letters, digits, and every byte of a UTF-8 sequence (>= 0x80): "Tém" is one
// word, never split inside a character (a token must be UTF-8 text: the
// vocabulary goes into each checkpoint's JSON metadata).
bool is_word_char(char c) { return std::isalnum((unsigned char)c) != 0 || (unsigned char)c >= 0x80; }

// The pieces of `text` (see prosqa_tokenize).
std::vector<std::string> split_words(const std::string& text) {
    std::vector<std::string> out;
    size_t i = 0;
    while (i < text.size()) {
        char c = text[i];
        if (c == ' ' || c == '\t' || c == '\r') { i++; continue; }
        size_t j = i + 1;
        if (is_word_char(c)) while (j < text.size() && is_word_char(text[j])) j++;
        if (c == '#') while (j < text.size() && text[j] == '#') j++;
        out.push_back(text.substr(i, j - i));
        i = j;
    }
    return out;
}

void add_token(Vocab* v, const std::string& t) {
    if (v->ids.count(t)) return;
    v->ids[t] = (int)v->tokens.size();
    v->tokens.push_back(t);
}

}  // namespace

// ---------------------------------------------------------------------------

std::string prosqa_load_json(const std::string& path, std::vector<ProsqaItem>* out) {
    out->clear();
    std::string text;
    std::string err = file_read_all(path, FILE_MAX_JSON, &text);
    if (!err.empty())
        return err + (err.rfind("cannot open", 0) == 0
                          ? "; the real files are data/prosqa/prosqa_test.json and prosqa_valid.json in the "
                            "repository, beside ./lime"
                          : "");
    Json root;
    err = json_parse(text, &root);
    if (!err.empty()) return path + ": " + err;
    if (root.kind != Json::ARR) return path + ": not a JSON list of items";
    if (root.arr.empty()) return path + ": an empty list; a ProsQA file holds at least one item";
    for (size_t i = 0; i < root.arr.size(); i++) {
        ProsqaItem it;
        err = read_item(root.arr[i], &it);
        if (err.empty()) err = prosqa_check(it);
        if (!err.empty()) return path + ": item " + std::to_string(i) + ": " + err;
        out->push_back(std::move(it));
    }
    return "";
}

std::string prosqa_check(const ProsqaItem& it) {
    int n = (int)it.idx_to_symbol.size();
    if (std::set<std::string>(it.idx_to_symbol.begin(), it.idx_to_symbol.end()).size() != (size_t)n)
        return "two nodes share a symbol";
    for (int v : {it.root, it.target, it.neg_target})
        if (v < 0 || v >= n) return "node " + std::to_string(v) + " is out of range";
    for (auto& e : it.edges)
        if (e.first < 0 || e.first >= n || e.second < 0 || e.second >= n) return "an edge's node is out of range";
    auto ch = children_of(n, it.edges);
    std::vector<int> indegree(n, 0), ready;   // Kahn's order: the nodes it cannot reach lie on a cycle
    for (auto& e : it.edges) indegree[e.second]++;
    for (int v = 0; v < n; v++) if (!indegree[v]) ready.push_back(v);
    for (size_t q = 0; q < ready.size(); q++)
        for (int c : ch[ready[q]]) if (--indegree[c] == 0) ready.push_back(c);
    if (ready.size() < (size_t)n) {
        int v = 0;
        while (indegree[v] == 0) v++;
        return "the edges form a cycle (" + it.idx_to_symbol[v] + " is on or below it)";
    }
    std::vector<int> dist, pred;
    bfs(ch, it.root, &dist, &pred);
    if (dist[it.target] < 0) return "the root does not reach the target";
    if (dist[it.neg_target] >= 0) return "the root reaches the negative target";
    if (!ch[it.target].empty() || !ch[it.neg_target].empty()) return "the target or negative target is not a leaf";
    std::string err = check_question(it);
    return err.empty() ? check_steps(it, ch) : err;
}

std::vector<std::string> prosqa_names() {
    return {"Alex", "Bob", "Carol", "Davis", "Eva", "Fae", "Gabriel", "Jack", "Max",
            "Oliver", "Polly", "Rex", "Sally", "Sam", "Stella", "Tom", "Wren"};
}

std::vector<std::string> prosqa_concepts() {
    // The syllables of the real files' words ("scr" + "o" + "m" + "pus" = "scrompus").
    const char* onsets[] = {"", "b", "br", "ch", "d", "f", "g", "gr", "gw", "h", "j", "k", "l",
                            "n", "qu", "r", "scr", "sh", "st", "t", "v", "w", "y", "z", "zh"};
    const char* vowels[] = {"e", "i", "o", "u", "oo"};
    const char* codas[] = {"m", "r", "l"};
    std::vector<std::string> out;
    for (const char* on : onsets)
        for (const char* vo : vowels)
            for (const char* co : codas) out.push_back(std::string(on) + vo + co + "pus");
    return out;
}

std::string prosqa_generate(Rng& rng, ProsqaItem* out, const ProsqaGenSettings& s) {
    if (s.nodes < 4 || s.nodes > 200) return "nodes = " + std::to_string(s.nodes) + " must be in 4..200";
    if (!(s.mean_parents > 0) || !(s.p_side >= 0 && s.p_side <= 0.5) || !(s.keep_parentless > 0 && s.keep_parentless <= 1) ||
        !(s.keep_shortest > 0 && s.keep_shortest <= 1) || s.min_steps < 1 || s.max_steps < s.min_steps)
        return "ProsqaGenSettings: need mean_parents > 0, p_side in [0, 0.5], keep_parentless and "
               "keep_shortest in (0, 1], 1 <= min_steps <= max_steps";
    for (int attempt = 0; attempt < 10000; attempt++)
        if (make_item(rng, draw_dag(rng, s), s, out)) return "";
    return "no graph with a target " + std::to_string(s.min_steps) + ".." + std::to_string(s.max_steps) +
           " steps away in 10,000 draws; raise nodes or widen min_steps..max_steps";
}

std::string prosqa_prompt(const ProsqaItem& it) { return it.question + "\n"; }

std::string prosqa_target(const ProsqaItem& it) {
    std::string t;
    for (auto& s : it.steps) t += s + "\n";
    return t + "### " + it.answer;
}

Vocab prosqa_vocab(const std::vector<ProsqaItem>& items) {
    Vocab v;
    for (const char* t : {"<pad>", "<eos>", "\n", ".", "?", "###", "Every", "is", "a", "Is", "or"}) add_token(&v, t);
    for (auto& w : prosqa_names()) add_token(&v, w);
    for (auto& w : prosqa_concepts()) add_token(&v, w);
    for (auto& it : items)
        for (auto& w : split_words(prosqa_prompt(it) + prosqa_target(it))) add_token(&v, w);
    v.pad = 0;
    v.eos = 1;
    return v;
}

std::string prosqa_tokenize(const Vocab& v, const std::string& text, std::vector<int>* out) {
    for (auto& w : split_words(text)) {
        int id = v.id(w);
        if (id < 0) return "unknown word '" + (w == "\n" ? std::string("\\n") : w) + "' (not in the ProsQA vocabulary)";
        out->push_back(id);
    }
    return "";
}

std::string prosqa_detokenize(const Vocab& v, const int* ids, int n) {
    std::string out, prev;
    for (int i = 0; i < n; i++) {
        std::string t = ids[i] >= 0 && ids[i] < v.size() ? v.tokens[ids[i]] : "<unk:" + std::to_string(ids[i]) + ">";
        bool glue = i == 0 || t == "." || t == "?" || t == "\n" || prev == "\n";
        out += (glue ? "" : " ") + t;
        prev = t;
    }
    return out;
}

std::string prosqa_sequence(const Vocab& v, const ProsqaItem& it, Sequence* out) {
    out->tokens.clear();
    std::string err = prosqa_tokenize(v, prosqa_prompt(it), &out->tokens);
    out->loss_start = (int)out->tokens.size();
    if (err.empty()) err = prosqa_tokenize(v, prosqa_target(it), &out->tokens);
    out->tokens.push_back(v.eos);
    return err;
}

std::string prosqa_build(int train_size, uint64_t seed, const std::string& test_json_path, ProsqaData* out,
                         uint64_t mem_bytes, bool with_train) {
    if (train_size < 1 || train_size > PROSQA_MAX_TRAIN)
        return "--train-size " + std::to_string(train_size) + " is outside 1.." + std::to_string(PROSQA_MAX_TRAIN) +
               " for ProsQA (each generated graph takes about 200 us and 1.5 KB)";
    const uint64_t per_item = 2 * sizeof(Sequence) + 4 * 400;  // a Sequence (twice, as the vector grows), <= ~400 tokens
    if (with_train && mem_bytes > 0 && (uint64_t)train_size * per_item > mem_bytes)
        return "--train-size " + std::to_string(train_size) + " ProsQA items would take about " +
               std::to_string((uint64_t)train_size * per_item >> 20) + " MiB, more than the " +
               std::to_string(mem_bytes >> 20) + " MiB of memory available; use at most " +
               std::to_string(mem_bytes / per_item);
    std::vector<ProsqaItem> test;
    std::string err = prosqa_load_json(test_json_path, &test);
    if (!err.empty()) return err;
    *out = ProsqaData();
    out->vocab = prosqa_vocab(test);
    Rng rng(seed_for(seed, "prosqa-train"));
    size_t longest = 0;
    for (int i = 0; with_train && i < train_size; i++) {
        ProsqaItem it;
        Sequence s;
        if (!(err = prosqa_generate(rng, &it)).empty()) return err;
        if (!(err = prosqa_sequence(out->vocab, it, &s)).empty()) return "generated item: " + err;
        longest = std::max(longest, s.tokens.size());
        out->train.push_back(std::move(s));
    }
    for (size_t i = 0; i < test.size(); i++) {
        Sequence s;
        if (!(err = prosqa_sequence(out->vocab, test[i], &s)).empty())
            return test_json_path + ": item " + std::to_string(i) + ": " + err;
        longest = std::max(longest, s.tokens.size());
        out->test.push_back(std::move(s));
        out->test_answers.push_back(test[i].answer);
    }
    out->seq_len = (int)longest - 1;
    return "";
}

bool prosqa_correct(const std::string& generated, const std::string& answer) {
    size_t hash = generated.rfind('#');
    if (hash == std::string::npos) return false;
    std::string rest = generated.substr(hash + 1);
    const char* space = " \t\r\n";
    size_t b = rest.find_first_not_of(space), e = rest.find_last_not_of(space);
    return b != std::string::npos && rest.substr(b, e - b + 1) == answer;
}
