// tests/test_export.cpp — ./lime export (support/commands/export.cpp) read back the way
// transformers would read it, without transformers: the JSON files through
// the project's own reader, field by field against the checkpoint; the
// tokenizer.json applied to generated examples by a small reading of its
// pre-tokenizer and model, giving the trainer's ids; the weights alone; two
// exports byte for byte; and transformers' LlamaForCausalLM forward written
// out from its modeling_llama.py (rotate_half RoPE, repeat_kv, 1/sqrt(head_dim),
// tied output layer) on the exported files, against lime.cu's logits.
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "data/task.h"
#include "support/commands/export.h"
#include "support/model/lime.h"
#include "support/lib/safetensors.h"
#include "test.h"

namespace {

int remove_entry(const char* path, const struct stat*, int, struct FTW*) { return remove(path); }

// A scratch directory with a llama checkpoint of a task in it, removed at the end.
struct Exported {
    std::string dir, ckpt, out, err;
    Config c;
    Model model;
    Exported(const std::string& task, const Vocab& vocab, int T) {
        char tmpl[] = "/tmp/lime_export_test_XXXXXX";
        if (!mkdtemp(tmpl)) { err = "cannot create a scratch directory"; return; }
        dir = tmpl;
        ckpt = dir + "/model.safetensors";
        out = dir + "/hf";
        c.V = vocab.size(); c.L = 2; c.d = 32; c.H = 4; c.R = 2; c.hd = 8; c.F = 48; c.T = T;
        c.arch = ARCH_LLAMA;
        c.eps = 1e-5f, c.rope_theta = 500.0f;  // not the defaults: the export must carry them
        err = model_create(&model, c, 1, DEVICE_CPU);
        if (!err.empty()) return;
        // weights large enough that attention is far from uniform, so that RoPE shows in the logits
        Rng rng(5);
        for (const TensorSpec& t : model.specs)
            for (size_t i = 0; i < t.numel; i++)
                model.params[t.offset + i] = t.shape.size() == 1 ? 1.0f + 0.4f * ((float)rng.uniform() - 0.5f)
                                                                 : (float)rng.uniform() - 0.5f;
        std::map<std::string, std::string> meta = {
            {"train_step", "1"}, {"data_epoch", "0"}, {"data_pos", "0"}, {"args", "{\"steps\": \"1\"}"},
            {"task", settings_to_json({{"task", task}})}, {"vocab", vocab_to_json(vocab)}};
        err = model_save(&model, ckpt, meta, true);  // with the optimiser state, which the export leaves out
        if (err.empty()) err = hf_export(ckpt, out, false);
    }
    ~Exported() {
        model_free(&model);
        if (!dir.empty()) nftw(dir.c_str(), remove_entry, 8, FTW_DEPTH | FTW_PHYS);
    }
};

std::string read_text(const std::string& path) {
    std::string s;
    std::string err = file_read_all(path, FILE_MAX_JSON, &s);
    return err.empty() ? s : "";
}

Json read_json(const std::string& path) {
    Json j;
    json_parse(read_text(path), &j);
    return j;
}

double num(const Json& j, const char* key) {
    const Json* v = j.get(key);
    return v && v->kind == Json::NUM ? v->num : NAN;
}
std::string str(const Json& j, const char* key) {
    const Json* v = j.get(key);
    return v && v->kind == Json::STR ? v->str : "(none)";
}
bool is_null(const Json& j, const char* key) {
    const Json* v = j.get(key);
    return v && v->kind == Json::NUL;
}

// --- tokenizer.json, applied: the parts the export uses ----------------------
// The regexes of its Split pre-tokenizers, read as the export writes them (no
// <regex>: it would double this file's compile time): alternatives of one atom
// each, a class [...] (ranges, ^, \n \t \r) or one character, with an optional +.
// Leftmost alternative first, + greedy, as the regex engine of tokenizers does
// for these patterns. ASCII text only (a class here matches one byte).
struct Atom {
    std::vector<bool> in = std::vector<bool>(256, false);
    bool plus = false;
};

char unescape(char c) { return c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c; }

bool parse_regex(const std::string& re, std::vector<Atom>* alts) {
    for (size_t i = 0; i < re.size();) {
        Atom a;
        if (re[i] == '[') {
            bool negate = ++i < re.size() && re[i] == '^';
            if (negate) i++;
            for (; i < re.size() && re[i] != ']'; i++) {
                unsigned char lo = re[i] == '\\' && i + 1 < re.size() ? unescape(re[++i]) : re[i], hi = lo;
                if (i + 2 < re.size() && re[i + 1] == '-' && re[i + 2] != ']') hi = re[i += 2];
                for (int c = lo; c <= hi; c++) a.in[c] = true;
            }
            if (i++ >= re.size()) return false;  // no ]
            if (negate) a.in.flip();
        } else {
            a.in[(unsigned char)(re[i] == '\\' && i + 1 < re.size() ? unescape(re[++i]) : re[i])] = true;
            i++;
        }
        if (i < re.size() && re[i] == '+') a.plus = true, i++;
        alts->push_back(a);
        if (i < re.size() && re[i++] != '|') return false;  // beyond what this reading knows
    }
    return !alts->empty();
}

// Length of the match at s[i], 0 if none.
size_t match_at(const std::vector<Atom>& alts, const std::string& s, size_t i) {
    for (const Atom& a : alts) {
        size_t n = 0;
        while (i + n < s.size() && a.in[(unsigned char)s[i + n]] && (a.plus || n == 0)) n++;
        if (n) return n;
    }
    return 0;
}

// Split: the regex's matches are dropped ("Removed") or kept as pieces of their
// own ("Isolated"); the text between matches is a piece either way.
bool split_pieces(const Json& split, std::vector<std::string>* pieces) {
    std::vector<Atom> re;
    if (!parse_regex(split.get("pattern")->get("Regex")->str, &re)) return false;
    bool removed = str(split, "behavior") == "Removed";
    std::vector<std::string> out;
    for (const std::string& p : *pieces) {
        size_t gap = 0;
        for (size_t i = 0; i < p.size();) {
            size_t n = match_at(re, p, i);
            if (!n) { i++; continue; }
            if (i > gap) out.push_back(p.substr(gap, i - gap));
            if (!removed) out.push_back(p.substr(i, n));
            gap = i += n;
        }
        if (gap < p.size()) out.push_back(p.substr(gap));
    }
    *pieces = out;
    return true;
}

// The ids tokenizer.json gives `text`; "" or the piece it has no id for.
std::string hf_encode(const Json& tok, const std::string& text, std::vector<int>* ids) {
    std::vector<std::string> pieces = {text};
    const Json& pre = *tok.get("pre_tokenizer");
    bool ok = true;
    if (str(pre, "type") == "Split") ok = split_pieces(pre, &pieces);
    if (str(pre, "type") == "Sequence")
        for (const Json& s : pre.get("pretokenizers")->arr) ok = ok && split_pieces(s, &pieces);
    if (!ok) return "(a regex this test cannot read)";
    const Json& model = *tok.get("model");
    std::map<std::string, int> vocab;
    for (const auto& kv : model.get("vocab")->obj) vocab[kv.first] = (int)kv.second.num;
    bool bpe = str(model, "type") == "BPE", fallback = bpe && model.get("byte_fallback")->b;
    for (const std::string& p : pieces) {
        if (!bpe) {  // WordLevel: the piece is one token
            if (!vocab.count(p)) return p;
            ids->push_back(vocab[p]);
            continue;
        }
        for (size_t i = 0; i < p.size();) {  // BPE without merges: a character, else its bytes as <0xNN>
            unsigned char lead = (unsigned char)p[i];
            size_t n = lead < 0x80 ? 1 : lead < 0xe0 ? 2 : lead < 0xf0 ? 3 : 4;
            std::string ch = p.substr(i, n);
            if (vocab.count(ch)) ids->push_back(vocab[ch]);
            else if (!fallback) return ch;
            else
                for (unsigned char b : ch) {
                    char hex[8];
                    snprintf(hex, sizeof hex, "<0x%02X>", b);
                    if (!vocab.count(hex)) return hex;
                    ids->push_back(vocab[hex]);
                }
            i += n;
        }
    }
    return "";
}

std::string ids_str(const std::vector<int>& ids) {
    std::string s;
    for (int id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
    return s;
}

// --- transformers' LlamaForCausalLM, float32, from the exported files ----------
struct HfLlama {
    int V, d, L, H, R, hd, F;
    float eps, theta;
    SafeTensors st;
    const float* w(const std::string& name) const {
        const StTensor* t = st.find(name);
        return t ? (const float*)(st.data.data() + t->begin) : nullptr;
    }
};

std::string hf_load(const std::string& dir, HfLlama* m) {
    Json cfg = read_json(dir + "/config.json");
    m->V = (int)num(cfg, "vocab_size"), m->d = (int)num(cfg, "hidden_size"), m->L = (int)num(cfg, "num_hidden_layers");
    m->H = (int)num(cfg, "num_attention_heads"), m->R = (int)num(cfg, "num_key_value_heads");
    m->hd = (int)num(cfg, "head_dim"), m->F = (int)num(cfg, "intermediate_size");
    m->eps = (float)num(cfg, "rms_norm_eps"), m->theta = (float)num(cfg, "rope_theta");
    if (!cfg.get("tie_word_embeddings") || !cfg.get("tie_word_embeddings")->b) return "config does not tie lm_head";
    return st_read(dir + "/model.safetensors", &m->st);
}

// y (n_out) = W (n_out, n_in) x: nn.Linear without bias
void linear(float* y, const float* W, const float* x, int n_out, int n_in) {
    for (int o = 0; o < n_out; o++) {
        float s = 0;
        for (int i = 0; i < n_in; i++) s += W[(size_t)o * n_in + i] * x[i];
        y[o] = s;
    }
}

// LlamaRMSNorm: weight * x * rsqrt(mean(x^2) + eps)
void rms_norm(float* y, const float* x, const float* g, int d, float eps) {
    float ms = 0;
    for (int i = 0; i < d; i++) ms += x[i] * x[i];
    float r = 1.0f / std::sqrt(ms / d + eps);
    for (int i = 0; i < d; i++) y[i] = g[i] * (x[i] * r);
}

// apply_rotary_pos_emb on one head at position t: x * cos + rotate_half(x) * sin,
// rotate_half(x) = cat(-x[hd/2:], x[:hd/2]), cos/sin of cat(freqs, freqs),
// inv_freq = 1 / theta^(arange(0, hd, 2) / hd) in float32. adjacent: the other
// convention (pairs (2i, 2i+1)), which the test must tell apart.
void rope(float* x, int t, int hd, float theta, bool adjacent) {
    int half = hd / 2;
    std::vector<float> y(hd);
    for (int j = 0; j < hd; j++) {
        int i = adjacent ? j / 2 : j % half;
        float inv = 1.0f / std::pow(theta, (float)(2 * i) / (float)hd), angle = (float)t * inv;
        float rot = adjacent ? (j % 2 ? x[j - 1] : -x[j + 1]) : (j < half ? -x[j + half] : x[j - half]);
        y[j] = x[j] * std::cos(angle) + rot * std::sin(angle);
    }
    std::copy(y.begin(), y.end(), x);
}

// Logits (T, V) of one sequence.
std::vector<float> hf_forward(const HfLlama& m, const std::vector<int>& ids, bool adjacent = false) {
    int T = (int)ids.size(), d = m.d, hd = m.hd, nq = m.H * hd, nkv = m.R * hd;
    std::vector<float> x((size_t)T * d), a(d), q((size_t)T * nq), k((size_t)T * nkv), v((size_t)T * nkv);
    std::vector<float> o(nq), y(d), g(m.F), u(m.F), logits((size_t)T * m.V);
    const float* E = m.w("model.embed_tokens.weight");
    for (int t = 0; t < T; t++) std::copy(E + (size_t)ids[t] * d, E + (size_t)(ids[t] + 1) * d, &x[(size_t)t * d]);
    for (int l = 0; l < m.L; l++) {
        std::string p = "model.layers." + std::to_string(l) + ".";
        for (int t = 0; t < T; t++) {
            rms_norm(a.data(), &x[(size_t)t * d], m.w(p + "input_layernorm.weight"), d, m.eps);
            linear(&q[(size_t)t * nq], m.w(p + "self_attn.q_proj.weight"), a.data(), nq, d);
            linear(&k[(size_t)t * nkv], m.w(p + "self_attn.k_proj.weight"), a.data(), nkv, d);
            linear(&v[(size_t)t * nkv], m.w(p + "self_attn.v_proj.weight"), a.data(), nkv, d);
            for (int h = 0; h < m.H; h++) rope(&q[(size_t)t * nq + h * hd], t, hd, m.theta, adjacent);
            for (int r = 0; r < m.R; r++) rope(&k[(size_t)t * nkv + r * hd], t, hd, m.theta, adjacent);
        }
        for (int t = 0; t < T; t++) {  // causal attention, repeat_kv: query head h reads kv head h / (H / R)
            for (int h = 0; h < m.H; h++) {
                int r = h / (m.H / m.R);
                std::vector<float> s(t + 1);
                float mx = -INFINITY, sum = 0;
                for (int j = 0; j <= t; j++) {
                    float dot = 0;
                    const float* qh = &q[(size_t)t * nq + h * hd];
                    const float* kj = &k[(size_t)j * nkv + r * hd];
                    for (int i = 0; i < hd; i++) dot += qh[i] * kj[i];
                    s[j] = dot / std::sqrt((float)hd);
                    mx = std::max(mx, s[j]);
                }
                for (int j = 0; j <= t; j++) sum += (s[j] = std::exp(s[j] - mx));
                for (int i = 0; i < hd; i++) {
                    float acc = 0;
                    for (int j = 0; j <= t; j++) acc += s[j] / sum * v[(size_t)j * nkv + r * hd + i];
                    o[h * hd + i] = acc;
                }
            }
            linear(y.data(), m.w(p + "self_attn.o_proj.weight"), o.data(), d, nq);
            for (int i = 0; i < d; i++) x[(size_t)t * d + i] += y[i];
            rms_norm(a.data(), &x[(size_t)t * d], m.w(p + "post_attention_layernorm.weight"), d, m.eps);
            linear(g.data(), m.w(p + "mlp.gate_proj.weight"), a.data(), m.F, d);
            linear(u.data(), m.w(p + "mlp.up_proj.weight"), a.data(), m.F, d);
            for (int f = 0; f < m.F; f++) g[f] = g[f] / (1.0f + std::exp(-g[f])) * u[f];  // silu(gate) * up
            linear(y.data(), m.w(p + "mlp.down_proj.weight"), g.data(), d, m.F);
            for (int i = 0; i < d; i++) x[(size_t)t * d + i] += y[i];
        }
    }
    for (int t = 0; t < T; t++) {  // lm_head tied to the embedding
        rms_norm(a.data(), &x[(size_t)t * d], m.w("model.norm.weight"), d, m.eps);
        linear(&logits[(size_t)t * m.V], E, a.data(), m.V, d);
    }
    return logits;
}

ArithData arith_examples() {
    ArithSettings s;
    s.p = 7, s.ops = 2, s.train_size = 6, s.test_size = 2, s.seed = 3;
    ArithData data;
    arith_generate(s, &data);
    return data;
}

}  // namespace

TEST(export_config_holds_the_checkpoints_values) {
    ArithData data = arith_examples();
    Exported ex("arith", data.vocab, data.seq_len);
    CHECK(ex.err.empty(), "export: %s", ex.err.c_str());
    const Config& c = ex.c;
    Json cfg = read_json(ex.out + "/config.json");
    CHECK(cfg.kind == Json::OBJ, "config.json does not parse as a JSON object");
    struct { const char* key; int want; } ints[] = {
        {"vocab_size", c.V}, {"hidden_size", c.d}, {"intermediate_size", c.F}, {"num_hidden_layers", c.L},
        {"num_attention_heads", c.H}, {"num_key_value_heads", c.R}, {"head_dim", c.hd},
        {"max_position_embeddings", c.T}, {"eos_token_id", 1}, {"pad_token_id", 0}};
    for (auto& f : ints)
        CHECK(num(cfg, f.key) == f.want, "config.json %s = %g, want %d", f.key, num(cfg, f.key), f.want);
    CHECK((float)num(cfg, "rms_norm_eps") == c.eps, "config.json rms_norm_eps = %g, want %g",
          num(cfg, "rms_norm_eps"), c.eps);
    CHECK((float)num(cfg, "rope_theta") == c.rope_theta, "config.json rope_theta = %g", num(cfg, "rope_theta"));
    const Json* arch = cfg.get("architectures");
    CHECK(arch, "config.json has no architectures");
    CHECK(arch->arr.size() == 1, "config.json has %zu architectures, want 1", arch->arr.size());
    CHECK(arch->arr[0].str == "LlamaForCausalLM", "config.json architectures[0] = %s, want LlamaForCausalLM",
          arch->arr[0].str.c_str());
    struct { const char* key; const char* want; } strs[] = {{"model_type", "llama"}, {"hidden_act", "silu"}, {"torch_dtype", "float32"}};
    for (auto& f : strs) CHECK(str(cfg, f.key) == f.want, "config.json %s = %s, want %s", f.key, str(cfg, f.key).c_str(), f.want);
    CHECK(cfg.get("tie_word_embeddings")->b, "config.json: tie_word_embeddings is not true");
    CHECK(is_null(cfg, "bos_token_id"), "config.json: bos_token_id is not null (the trainer has no BOS)");
    Json gen = read_json(ex.out + "/generation_config.json");
    struct { const char* key; int want; } gen_ints[] = {{"eos_token_id", 1}, {"pad_token_id", 0}, {"max_length", c.T + 1}};
    for (auto& f : gen_ints)
        CHECK(num(gen, f.key) == f.want, "generation_config.json %s = %g, want %d", f.key, num(gen, f.key), f.want);
    CHECK(!gen.get("do_sample")->b, "generation_config.json: do_sample is true, want false");
    Json tc = read_json(ex.out + "/tokenizer_config.json"), sp = read_json(ex.out + "/special_tokens_map.json");
    CHECK(str(tc, "eos_token") == "<eos>", "tokenizer_config.json eos_token = %s, want <eos>", str(tc, "eos_token").c_str());
    CHECK(str(tc, "pad_token") == "<pad>", "tokenizer_config.json pad_token = %s, want <pad>", str(tc, "pad_token").c_str());
    CHECK(is_null(tc, "bos_token"), "tokenizer_config.json: bos_token is not null (the trainer has no BOS)");
    CHECK(num(tc, "model_max_length") == c.T, "tokenizer_config.json model_max_length = %g, want %d", num(tc, "model_max_length"),
          c.T);
    CHECK(str(sp, "eos_token") == "<eos>", "special_tokens_map.json eos_token = %s, want <eos>", str(sp, "eos_token").c_str());
    CHECK(str(sp, "pad_token") == "<pad>", "special_tokens_map.json pad_token = %s, want <pad>", str(sp, "pad_token").c_str());
    Json tok = read_json(ex.out + "/tokenizer.json");
    const Json* added = tok.get("added_tokens");
    CHECK(added, "tokenizer.json has no added_tokens");
    CHECK(added->arr.size() == 2, "tokenizer.json has %zu added_tokens, want 2 (<pad>, <eos>)", added->arr.size());
    const char* specials[] = {"<pad>", "<eos>"};
    for (int id = 0; id < 2; id++) {
        CHECK(num(added->arr[id], "id") == id, "tokenizer.json added_tokens[%d] has id %g, want %d", id,
              num(added->arr[id], "id"), id);
        CHECK(str(added->arr[id], "content") == specials[id], "tokenizer.json added_tokens[%d] is %s, want %s", id,
              str(added->arr[id], "content").c_str(), specials[id]);
    }
    CHECK(is_null(tok, "post_processor"), "tokenizer.json adds tokens (post_processor); the trainer adds none");
}

TEST(export_tokenizer_gives_the_trainers_ids_arith) {
    ArithData data = arith_examples();
    Exported ex("arith", data.vocab, data.seq_len);
    CHECK(ex.err.empty(), "export: %s", ex.err.c_str());
    Json tok = read_json(ex.out + "/tokenizer.json");
    for (const Sequence& s : data.train) {
        std::string text = data.vocab.decode(s.tokens.data(), (int)s.tokens.size());
        std::string spaced;  // the same words, newlines and runs of spaces between them
        for (char ch : text) spaced += ch == '=' ? std::string("=\n ") : std::string(1, ch);
        for (const std::string& t : {text, spaced}) {
            std::vector<int> ids;
            std::string err = hf_encode(tok, t, &ids);
            CHECK(err.empty(), "tokenizer.json has no id for '%s' of '%s'", err.c_str(), t.c_str());
            CHECK(ids == s.tokens, "tokenizer.json gives [%s] for '%s'; the trainer [%s]", ids_str(ids).c_str(),
                  t.c_str(), ids_str(s.tokens).c_str());
        }
    }
}

TEST(export_tokenizer_gives_the_trainers_ids_prosqa) {
    Rng rng(4);
    std::vector<ProsqaItem> items(3);
    for (ProsqaItem& it : items) CHECK(prosqa_generate(rng, &it).empty(), "prosqa_generate failed");
    Vocab vocab = prosqa_vocab(items);
    Exported ex("prosqa", vocab, 16);
    CHECK(ex.err.empty(), "export: %s", ex.err.c_str());
    Json tok = read_json(ex.out + "/tokenizer.json");
    for (const ProsqaItem& it : items) {
        Sequence s;
        CHECK(prosqa_sequence(vocab, it, &s).empty(), "prosqa_sequence failed");
        s.tokens.pop_back();  // <eos>: the trainer appends it, the text has none
        std::string text = prosqa_prompt(it) + prosqa_target(it);
        std::vector<int> ids;
        std::string err = hf_encode(tok, text, &ids);
        CHECK(err.empty(), "tokenizer.json has no id for '%s'", err.c_str());
        CHECK(ids == s.tokens, "tokenizer.json gives [%s] for '%s'; the trainer [%s]", ids_str(ids).c_str(),
              text.c_str(), ids_str(s.tokens).c_str());
    }
}

TEST(export_tokenizer_gives_the_trainers_ids_text) {
    Exported ex("text", text_vocab(), 16);
    CHECK(ex.err.empty(), "export: %s", ex.err.c_str());
    Json tok = read_json(ex.out + "/tokenizer.json"), cfg = read_json(ex.out + "/config.json");
    CHECK(is_null(cfg, "eos_token_id"), "config.json: eos_token_id is not null, and bytes have no eos");
    CHECK(is_null(cfg, "pad_token_id"), "config.json: pad_token_id is not null, and bytes have no pad");
    std::string text = "Hi,  there!\n\tcaf\xc3\xa9 <0x41> ~\x7f\x01 \xe2\x82\xac";
    std::vector<int> ids, want;
    std::string err = hf_encode(tok, text, &ids);
    CHECK(err.empty(), "tokenizer.json has no id for '%s'", err.c_str());
    text_vocab().encode(text, &want);
    CHECK(ids == want, "tokenizer.json gives [%s]; the trainer [%s]", ids_str(ids).c_str(), ids_str(want).c_str());
}

TEST(export_weights_alone_and_twice_the_same_bytes) {
    ArithData data = arith_examples();
    Exported ex("arith", data.vocab, data.seq_len);
    CHECK(ex.err.empty(), "export: %s", ex.err.c_str());
    SafeTensors st;
    std::string err = st_read(ex.out + "/model.safetensors", &st);
    CHECK(err.empty(), "model.safetensors: %s", err.c_str());
    CHECK(st.tensors.size() == ex.model.specs.size(), "model.safetensors has %zu tensors; the model %zu",
          st.tensors.size(), ex.model.specs.size());
    for (size_t i = 0; i < st.tensors.size(); i++) {
        const TensorSpec& t = ex.model.specs[i];
        CHECK(st.tensors[i].name == t.name, "model.safetensors tensor %zu is %s, want %s", i,
              st.tensors[i].name.c_str(), t.name.c_str());
        CHECK(memcmp(st.data.data() + st.tensors[i].begin, ex.model.params + t.offset, t.numel * 4) == 0,
              "model.safetensors %s differs from the checkpoint's", t.name.c_str());
    }
    CHECK(st.meta.size() == 1, "model.safetensors has %zu metadata entries, want 1 (format)", st.meta.size());
    CHECK(st.meta["format"] == "pt", "model.safetensors metadata format = '%s', want pt", st.meta["format"].c_str());
    err = hf_export(ex.ckpt, ex.dir + "/again", false);
    CHECK(err.empty(), "second export: %s", err.c_str());
    for (const char* f : {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                          "tokenizer_config.json", "special_tokens_map.json"}) {
        std::string a = read_text(ex.out + "/" + f), b = read_text(ex.dir + "/again/" + f);
        CHECK(!a.empty(), "the export has no %s, or it is empty", f);
        CHECK(a == b, "%s differs between two exports of one checkpoint", f);
    }
}

TEST(export_logits_match_transformers_llama_forward) {
    ArithData data = arith_examples();
    Exported ex("arith", data.vocab, data.seq_len);
    CHECK(ex.err.empty(), "export: %s", ex.err.c_str());
    HfLlama hf;
    std::string err = hf_load(ex.out, &hf);
    CHECK(err.empty(), "reading the export: %s", err.c_str());
    const std::vector<int>& ids = data.train[0].tokens;
    int T = std::min((int)ids.size(), ex.c.T);
    std::vector<int> x(ids.begin(), ids.begin() + T);
    model_forward(&ex.model, x.data(), nullptr, nullptr, 1, T);
    std::vector<float> want = hf_forward(hf, x), other = hf_forward(hf, x, true);
    double e = rel_err(model_logits(&ex.model), want.data(), want.size());
    double e_other = rel_err(model_logits(&ex.model), other.data(), other.size());
    CHECK(e < 1e-5, "logits (1, %d, %d): rel err %.2e against transformers' forward on the export", T, ex.c.V, e);
    // the test can tell the RoPE conventions apart: pairs (2i, 2i+1) give other logits
    CHECK(e_other > 1e-2, "logits with adjacent-pair RoPE differ by only %.2e: the test cannot see RoPE", e_other);
}

TEST(export_refuses_lime_and_keeps_other_files_with_force) {
    ArithData data = arith_examples();
    Exported ex("arith", data.vocab, data.seq_len);
    CHECK(ex.err.empty(), "export: %s", ex.err.c_str());
    std::string err = hf_export(ex.ckpt, ex.out, false);
    CHECK(err.find("not empty") != std::string::npos, "export into a full --out: '%s'", err.c_str());
    FILE* f = fopen((ex.out + "/notes.txt").c_str(), "w");
    CHECK(f, "cannot create notes.txt");
    int put = fputs("mine", f), closed = fclose(f);
    CHECK(put >= 0, "cannot write notes.txt");
    CHECK(closed == 0, "cannot close notes.txt");
    err = hf_export(ex.ckpt, ex.out, true);
    CHECK(err.empty(), "export --force: %s", err.c_str());
    CHECK(read_text(ex.out + "/notes.txt") == "mine", "export --force removed a file not its own");
    err = hf_export(ex.ckpt, ex.dir, true);  // the run directory itself: its model.safetensors is lime.cu's
    CHECK(err.find("written by ./lime train") != std::string::npos, "export over the checkpoint: '%s'", err.c_str());
    Config lc = ex.c;
    lc.arch = ARCH_LIME;
    Model lime;
    CHECK(model_create(&lime, lc, 1, DEVICE_CPU).empty(), "model_create lime");
    model_init(&lime, 1);
    err = model_save(&lime, ex.dir + "/lime.safetensors", {}, false);
    model_free(&lime);
    CHECK(err.empty(), "save lime: %s", err.c_str());
    err = hf_export(ex.dir + "/lime.safetensors", ex.dir + "/lime_hf", false);
    CHECK(err.find("is a lime checkpoint (LIMe") != std::string::npos && err.find("transformers has no such model") != std::string::npos,
          "lime checkpoint: '%s'", err.c_str());
    struct stat sb;
    CHECK(stat((ex.dir + "/lime_hf").c_str(), &sb) != 0, "a refused export left %s/lime_hf", ex.dir.c_str());
}

TEST(export_refuses_the_peers_by_name) {
    ArithData data = arith_examples();
    Exported ex("arith", data.vocab, data.seq_len);
    CHECK(ex.err.empty(), "export: %s", ex.err.c_str());
    for (Arch a : {ARCH_RESFORMER, ARCH_DENSEFORMER, ARCH_DCA}) {
        Config pc = ex.c;
        pc.arch = a;
        Model peer;
        CHECK(model_create(&peer, pc, 1, DEVICE_CPU).empty(), "model_create %s", arch_name(a));
        model_init(&peer, 1);
        std::string file = ex.dir + "/" + arch_name(a) + ".safetensors", out = ex.dir + "/" + arch_name(a) + "_hf";
        std::string err = model_save(&peer, file, {}, false);
        model_free(&peer);
        CHECK(err.empty(), "save %s: %s", arch_name(a), err.c_str());
        err = hf_export(file, out, false);
        std::string names = std::string("is a ") + arch_name(a) + " checkpoint";
        CHECK(contains(err, names), "%s checkpoint: the error lacks '%s': '%s'", arch_name(a), names.c_str(), err.c_str());
        CHECK(contains(err, "--arch llama"), "%s checkpoint: the error lacks '--arch llama': '%s'", arch_name(a), err.c_str());
        struct stat sb;
        CHECK(stat(out.c_str(), &sb) != 0, "a refused export left %s", out.c_str());
    }
}
