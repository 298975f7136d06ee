// data/text.cpp — the task-independent pieces (Vocab, make_batch, Loader)
// and plain text as byte-level language modelling (docs/tasks.md §3).
#include <algorithm>
#include <cstdio>
#include <numeric>

#include "data/tasks.h"
#include "support/lib/safetensors.h"  // file_open_regular

// ---------------------------------------------------------------------------
// Vocab

int Vocab::id(const std::string& tok) const {
    auto it = ids.find(tok);
    return it == ids.end() ? -1 : it->second;
}

std::string Vocab::encode(const std::string& text, std::vector<int>* out) const {
    if (bytes) {
        for (unsigned char c : text) out->push_back(c);
        return "";
    }
    // Word vocabulary: tokens are separated by (any number of) spaces. Ids go
    // to *out only when every token is known.
    std::vector<int> got;
    size_t i = 0;
    while (i < text.size()) {
        if (text[i] == ' ' || text[i] == '\n') { i++; continue; }
        size_t j = text.find_first_of(" \n", i);
        if (j == std::string::npos) j = text.size();
        std::string tok = text.substr(i, j - i);
        int t = id(tok);
        if (t < 0)  // counted as a reader counts: the first word is word 1
            return "unknown token '" + tok + "' (word " + std::to_string(got.size() + 1) + " of the text)";
        got.push_back(t);
        i = j;
    }
    out->insert(out->end(), got.begin(), got.end());
    return "";
}

std::string Vocab::decode(const int* toks, int n) const {
    std::string s;
    for (int i = 0; i < n; i++) {
        bool known = toks[i] >= 0 && toks[i] < size();
        if (bytes) {
            s += known ? std::string(1, (char)toks[i]) : "<unk:" + std::to_string(toks[i]) + ">";
        } else {
            if (i) s += ' ';
            s += known ? tokens[toks[i]] : "<unk:" + std::to_string(toks[i]) + ">";
        }
    }
    return s;
}

// ---------------------------------------------------------------------------
// Batches and the data order

void make_batch(const std::vector<Sequence>& seqs, const int* idx, int B, int T, int pad, Batch* out) {
    out->B = B, out->T = T;
    out->tokens.assign((size_t)B * T, pad);
    out->targets.assign((size_t)B * T, pad);
    out->mask.assign((size_t)B * T, 0.0f);
    out->valid.assign((size_t)B * T, 0.0f);
    for (int b = 0; b < B; b++) {
        const Sequence& s = seqs[idx[b]];
        int n = std::min((int)s.tokens.size(), T + 1);  // cut to T+1 tokens
        size_t row = (size_t)b * T;
        for (int t = 0; t < n && t < T; t++) out->tokens[row + t] = s.tokens[t], out->valid[row + t] = 1.0f;
        // position t predicts token t+1; the loss counts it from loss_start on
        for (int t = 0; t + 1 < n; t++) {
            out->targets[row + t] = s.tokens[t + 1];
            out->mask[row + t] = t + 1 >= s.loss_start ? 1.0f : 0.0f;
        }
    }
}

std::vector<int> epoch_order(size_t n, uint64_t seed, int epoch) {
    Rng rng(seed_for(seed, "epoch" + std::to_string(epoch)));
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    for (size_t i = n; i > 1; i--)  // Fisher-Yates: a uniform permutation
        std::swap(order[i - 1], order[rng.below(i)]);
    return order;
}

void Loader::start(const std::vector<Sequence>* d, uint64_t s, int e, size_t p) {
    data = d, seed = s, epoch = e, pos = p;
    order = epoch_order(d->size(), seed, epoch);
    if (pos >= order.size()) new_epoch();
}

// The end of an epoch: the next one, reshuffled. Done as soon as the last
// sequence is taken, so a saved (epoch, pos) always has pos < size.
void Loader::new_epoch() {
    epoch++, pos = 0;
    order = epoch_order(data->size(), seed, epoch);
}

void Loader::next(int B, int T, int pad, Batch* out) {
    std::vector<int> idx(B);
    for (int b = 0; b < B; b++) {
        idx[b] = order[pos++];
        if (pos == order.size()) new_epoch();
    }
    make_batch(*data, idx.data(), B, T, pad, out);
}

// ---------------------------------------------------------------------------
// Plain text

Vocab text_vocab() {
    Vocab v;
    v.bytes = true;
    for (int b = 0; b < 256; b++) {
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        v.tokens.push_back(b >= 0x20 && b < 0x7f ? std::string(1, (char)b) : std::string(hex));
        v.ids[v.tokens.back()] = b;
    }
    v.pad = 0, v.eos = -1;  // no pad or end token: padding is masked out
    return v;
}

namespace {
// "contiguous windows of T tokens": windows of T+1 bytes (T inputs, T
// targets) starting every T bytes, so consecutive windows share one byte and
// every byte but the first is a target exactly once (up to < T left over).
void cut_windows(const std::string& bytes, size_t begin, size_t end, int T, std::vector<Sequence>* out) {
    if (end > begin + (size_t)T) out->reserve((end - begin - 1) / (size_t)T);
    for (size_t s = begin; s + (size_t)T + 1 <= end; s += (size_t)T) {
        Sequence q;
        q.tokens.assign(bytes.begin() + (long)s, bytes.begin() + (long)(s + T + 1));
        for (int& t : q.tokens) t &= 0xff;  // char may be signed
        q.loss_start = 1;
        out->push_back(std::move(q));
    }
}
}  // namespace

uint64_t text_memory_bytes(uint64_t bytes, int T) {
    if (T < 1) T = 1;
    uint64_t windows = bytes / (uint64_t)T + 2;
    uint64_t chunk = std::max<uint64_t>(32, (4 * ((uint64_t)T + 1) + 8 + 15) / 16 * 16);  // malloc's block for T+1 ints
    return bytes + windows * (sizeof(Sequence) + chunk);
}

std::string text_load(const std::string& path, int T, double val_frac, TextData* out, uint64_t mem_bytes) {
    if (T < 1) return "T = " + std::to_string(T) + " must be at least 1";
    if (!(val_frac >= 0 && val_frac < 1)) return "val_frac = " + std::to_string(val_frac) + " must be in [0, 1); try 0.1";
    FILE* f = nullptr;
    uint64_t size = 0;
    std::string err = file_open_regular(path, FILE_MAX_TEXT, &f, &size);
    if (!err.empty()) return err + (err.rfind("cannot open", 0) == 0 ? "; any UTF-8 text file will do" : "");
    uint64_t need_mem = text_memory_bytes(size, T);
    if (mem_bytes > 0 && need_mem > mem_bytes) {
        fclose(f);
        return "--text-file '" + path + "' (" + std::to_string(size >> 20) + " MiB) would take about " +
               std::to_string(need_mem >> 20) + " MiB as windows of --seq-len " + std::to_string(T) + ", more than the " +
               std::to_string(mem_bytes >> 20) + " MiB of memory available; raise --seq-len (memory is about " +
               std::to_string(need_mem / std::max<uint64_t>(size, 1)) + "x the file) or use a shorter file";
    }
    std::string bytes(size, '\0');
    size_t got = size ? fread(&bytes[0], 1, size, f) : 0;
    fclose(f);
    if (got != size) return "'" + path + "': read failed or the file changed while being read";
    size_t need = 2 * ((size_t)T + 1);
    if (bytes.empty()) return "'" + path + "' is empty; give a text file of at least 2*(T+1) = " + std::to_string(need) + " bytes";
    if (bytes.size() < need)
        return "'" + path + "' has " + std::to_string(bytes.size()) + " bytes, fewer than 2*(T+1) = " +
               std::to_string(need) + "; use a longer file or a smaller T";
    // "a held-out tail for validation": the last val_frac of the bytes
    size_t n_val = (size_t)((double)bytes.size() * val_frac), n_train = bytes.size() - n_val;
    if (n_train < (size_t)T + 1)
        return "the training part has " + std::to_string(n_train) + " bytes, fewer than T+1 = " +
               std::to_string(T + 1) + "; lower val_frac or T";
    if (val_frac > 0 && n_val < (size_t)T + 1)
        return "the validation part (last " + std::to_string(val_frac) + " of the file) has " + std::to_string(n_val) +
               " bytes, fewer than T+1 = " + std::to_string(T + 1) + "; raise val_frac to " +
               std::to_string((double)(T + 1) / (double)bytes.size()) + " or more, or lower T";
    *out = TextData();
    out->vocab = text_vocab();
    cut_windows(bytes, 0, n_train, T, &out->train);
    cut_windows(bytes, n_train, bytes.size(), T, &out->val);
    return "";
}
