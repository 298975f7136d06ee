// support/commands/export.cpp — ./lime export (support/commands/export.h): a llama checkpoint
// as a directory that transformers loads with LlamaForCausalLM and
// AutoTokenizer, and no code of ours.
//
// The model needs no conversion: lime.cu already computes what transformers'
// LlamaModel computes (RoPE in the HF half-split convention, the scores scaled
// by 1/sqrt(head_dim), RMSNorm with the config's epsilon, the output layer
// tied to the embedding), under the same tensor names. What the export adds is
// the config in transformers' words and a tokenizer.json whose pieces do what
// the trainer's own tokenisation does:
//   arith   words separated by spaces or newlines (Vocab::encode)
//   prosqa  runs of letters and digits, runs of '#', any other character
//           alone; spaces, tabs and CRs dropped (prosqa_tokenize)
//   text    one token per byte (id = byte): printable ASCII as itself, every
//           other byte as its "<0xNN>" token (BPE with no merges, byte fallback)
// No BOS is added and no EOS: the trainer adds neither to a prompt.
#include "support/commands/export.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

#include "data/tasks.h"   // text_vocab
#include "support/model/models.h"  // model_entry: what a model adds to LLaMa
#include "support/lib/cli.h"  // make_dir, memory_available
#include "support/lib/safetensors.h"

namespace {

// --- JSON values, built ------------------------------------------------------
Json jnull() { return Json(); }
Json jbool(bool b) { Json j; j.kind = Json::BOOL; j.b = b; return j; }
Json jnum(double x) { Json j; j.kind = Json::NUM; j.num = x; return j; }
Json jstr(const std::string& s) { Json j; j.kind = Json::STR; j.str = s; return j; }
Json jarr(std::vector<Json> a) { Json j; j.kind = Json::ARR; j.arr = std::move(a); return j; }
Json jobj(std::vector<std::pair<std::string, Json>> o) { Json j; j.kind = Json::OBJ; j.obj = std::move(o); return j; }
Json jid(int id) { return id < 0 ? jnull() : jnum(id); }  // a token id; null where the vocabulary has none

// A float as the shortest decimal that reads back as the same float (1e-06,
// not 9.99999997e-07): transformers reads it and rounds it to float32 again.
double float_decimal(float x) {
    char buf[32];
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)x);
        if ((float)strtod(buf, nullptr) == x) break;
    }
    return strtod(buf, nullptr);
}

// Objects one key a line, indented; arrays, and what is inside them, compact.
void pretty_into(const Json& v, int indent, std::string* out) {
    if (v.kind != Json::OBJ || v.obj.empty()) {
        *out += json_dump(v);
        return;
    }
    *out += "{\n";
    for (size_t i = 0; i < v.obj.size(); i++) {
        *out += std::string(indent + 2, ' ') + json_quote(v.obj[i].first) + ": ";
        pretty_into(v.obj[i].second, indent + 2, out);
        *out += i + 1 < v.obj.size() ? ",\n" : "\n";
    }
    *out += std::string(indent, ' ') + "}";
}
std::string pretty(const Json& v) {
    std::string s;
    pretty_into(v, 0, &s);
    return s + "\n";
}

// --- the tokenizer -------------------------------------------------------------
struct Tokenizer {
    int pad = -1, eos = -1;             // special token ids; -1: none (the byte vocabulary)
    Json pre_tokenizer, decoder, model;
};

// One character of a ProsQA word as the trainer's is_word_char takes it: an
// ASCII letter or digit, or any character past ASCII (in the regex syntax of
// the tokenizers library, Oniguruma: \x{80}-\x{10FFFF}).
const std::string PROSQA_WORD = "[A-Za-z0-9\\x{80}-\\x{10FFFF}]";

Json split(const std::string& regex, const char* behavior) {
    return jobj({{"type", jstr("Split")}, {"pattern", jobj({{"Regex", jstr(regex)}})},
                 {"behavior", jstr(behavior)}, {"invert", jbool(false)}});
}

// The token strings -> ids, in id order; false if a token repeats.
bool vocab_object(const std::vector<std::string>& vocab, Json* out) {
    std::set<std::string> seen;
    *out = jobj({});
    for (size_t i = 0; i < vocab.size(); i++) {
        if (!seen.insert(vocab[i]).second) return false;
        out->obj.push_back({vocab[i], jnum((double)i)});
    }
    return true;
}

std::string word_tokenizer(const std::string& task, const std::vector<std::string>& vocab, Tokenizer* tk) {
    if (vocab.size() < 2 || vocab[0] != "<pad>" || vocab[1] != "<eos>")
        return "its vocabulary does not start with <pad> <eos>, as every word vocabulary of ./lime train does";
    Json ids;
    if (!vocab_object(vocab, &ids)) return "its vocabulary holds a token twice";
    tk->pad = 0, tk->eos = 1;
    if (task == "arith")  // Vocab::encode: words between spaces and newlines
        tk->pre_tokenizer = split("[ \\n]+", "Removed");
    else                  // prosqa_tokenize's split_words: a word is letters, digits and any non-ASCII
                          // character (is_word_char: "Tém", "Zoë" whole), then runs of '#', then one other character
        tk->pre_tokenizer = jobj({{"type", jstr("Sequence")},
                                  {"pretokenizers", jarr({split("[ \\t\\r]+", "Removed"),
                                                          split(PROSQA_WORD + "+|#+|[^A-Za-z0-9#\\x{80}-\\x{10FFFF}]",
                                                                "Isolated")})}});
    tk->decoder = jnull();  // tokens joined by spaces, as Vocab::decode does
    // "<unk>" is not in the vocabulary: an unknown word is an error, as in the trainer
    tk->model = jobj({{"type", jstr("WordLevel")}, {"vocab", ids}, {"unk_token", jstr("<unk>")}});
    return "";
}

std::string byte_tokenizer(const std::vector<std::string>& vocab, Tokenizer* tk) {
    if (vocab != text_vocab().tokens)
        return "its vocabulary is not the 256 byte tokens of the text task (text_vocab)";
    Json ids;
    vocab_object(vocab, &ids);
    tk->pre_tokenizer = jnull();  // the whole text is one piece: every byte counts, spaces included
    tk->decoder = jobj({{"type", jstr("Sequence")},
                        {"decoders", jarr({jobj({{"type", jstr("ByteFallback")}}), jobj({{"type", jstr("Fuse")}})})}});
    tk->model = jobj({{"type", jstr("BPE")}, {"dropout", jnull()}, {"unk_token", jnull()},
                      {"continuing_subword_prefix", jnull()}, {"end_of_word_suffix", jnull()},
                      {"fuse_unk", jbool(false)}, {"byte_fallback", jbool(true)}, {"vocab", ids},
                      {"merges", jarr({})}});
    return "";
}

// The special tokens as tokenizer.json lists them (or as tokenizer_config.json's
// added_tokens_decoder maps them, with_id false).
Json special_token(const std::vector<std::string>& vocab, int id, bool with_id) {
    Json t = jobj({{"content", jstr(vocab[id])}, {"lstrip", jbool(false)}, {"normalized", jbool(false)},
                   {"rstrip", jbool(false)}, {"single_word", jbool(false)}, {"special", jbool(true)}});
    if (with_id) t.obj.insert(t.obj.begin(), {"id", jnum(id)});
    return t;
}

Json tokenizer_json(const std::vector<std::string>& vocab, const Tokenizer& tk) {
    Json added = jarr({});
    for (int id : {tk.pad, tk.eos})
        if (id >= 0) added.arr.push_back(special_token(vocab, id, true));
    return jobj({{"version", jstr("1.0")}, {"truncation", jnull()}, {"padding", jnull()}, {"added_tokens", added},
                 {"normalizer", jnull()}, {"pre_tokenizer", tk.pre_tokenizer}, {"post_processor", jnull()},
                 {"decoder", tk.decoder}, {"model", tk.model}});
}

Json tokenizer_config_json(const Config& c, const std::vector<std::string>& vocab, const Tokenizer& tk) {
    Json decoder = jobj({});
    for (int id : {tk.pad, tk.eos})
        if (id >= 0) decoder.obj.push_back({std::to_string(id), special_token(vocab, id, false)});
    auto name = [&](int id) { return id < 0 ? jnull() : jstr(vocab[id]); };
    return jobj({{"added_tokens_decoder", decoder}, {"bos_token", jnull()},
                 {"clean_up_tokenization_spaces", jbool(false)},
                 {"eos_token", name(tk.eos)}, {"model_input_names", jarr({jstr("input_ids"), jstr("attention_mask")})},
                 {"model_max_length", jnum(c.T)}, {"pad_token", name(tk.pad)},
                 {"tokenizer_class", jstr("PreTrainedTokenizerFast")}, {"unk_token", jnull()}});
}

// transformers' LlamaConfig, keys in its order of save_pretrained (sorted).
Json config_json(const Config& c, const Tokenizer& tk) {
    return jobj({{"architectures", jarr({jstr("LlamaForCausalLM")})}, {"attention_bias", jbool(false)},
                 {"bos_token_id", jnull()}, {"eos_token_id", jid(tk.eos)}, {"head_dim", jnum(c.hd)},
                 {"hidden_act", jstr("silu")}, {"hidden_size", jnum(c.d)}, {"intermediate_size", jnum(c.F)},
                 {"max_position_embeddings", jnum(c.T)}, {"mlp_bias", jbool(false)}, {"model_type", jstr("llama")},
                 {"num_attention_heads", jnum(c.H)}, {"num_hidden_layers", jnum(c.L)},
                 {"num_key_value_heads", jnum(c.R)}, {"pad_token_id", jid(tk.pad)},
                 {"rms_norm_eps", jnum(float_decimal(c.eps))}, {"rope_scaling", jnull()},
                 {"rope_theta", jnum(float_decimal(c.rope_theta))}, {"tie_word_embeddings", jbool(true)},
                 {"torch_dtype", jstr("float32")}, {"vocab_size", jnum(c.V)}});
}

// Greedy, as ./lime sample and eval decode; max_length: the prompt and the
// continuation together, T positions read plus the last token (train.cpp's generate).
Json generation_config_json(const Config& c, const Tokenizer& tk) {
    return jobj({{"bos_token_id", jnull()}, {"do_sample", jbool(false)}, {"eos_token_id", jid(tk.eos)},
                 {"max_length", jnum(c.T + 1)}, {"pad_token_id", jid(tk.pad)}});
}

}  // namespace

std::string hf_json_files(const Config& c, const std::string& task, const std::vector<std::string>& vocab,
                          std::map<std::string, std::string>* files) {
    if ((int)vocab.size() != c.V)
        return "its vocabulary has " + std::to_string(vocab.size()) + " tokens, the model " + std::to_string(c.V);
    Tokenizer tk;
    std::string err = task == "text" ? byte_tokenizer(vocab, &tk) : word_tokenizer(task, vocab, &tk);
    if (!err.empty()) return err;
    Json special = jobj({});
    if (tk.eos >= 0) special.obj.push_back({"eos_token", jstr(vocab[tk.eos])});
    if (tk.pad >= 0) special.obj.push_back({"pad_token", jstr(vocab[tk.pad])});
    files->clear();
    (*files)["config.json"] = pretty(config_json(c, tk));
    (*files)["generation_config.json"] = pretty(generation_config_json(c, tk));
    (*files)["tokenizer.json"] = pretty(tokenizer_json(vocab, tk));
    (*files)["tokenizer_config.json"] = pretty(tokenizer_config_json(c, vocab, tk));
    (*files)["special_tokens_map.json"] = pretty(special);
    return "";
}

// ===========================================================================
// Writing the directory
// ===========================================================================
namespace {

// Written, flushed and put on disk, or the error.
std::string write_text(const std::string& path, const std::string& text) {
    FILE* f = fopen(path.c_str(), "wb");
    bool ok = f && fwrite(text.data(), 1, text.size(), f) == text.size() && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int e = errno;
    if (f && fclose(f) != 0 && ok) ok = false, e = errno;
    return ok ? "" : "cannot write " + path + ": " + strerror(e);
}

// -1: no such path, 0: an empty directory, 1: a directory with entries, 2: not a directory.
int dir_state(const std::string& path) {
    struct stat sb;
    if (stat(path.c_str(), &sb) != 0) return -1;
    if (!S_ISDIR(sb.st_mode)) return 2;
    DIR* d = opendir(path.c_str());
    if (!d) return 1;
    int state = 0;
    while (struct dirent* e = readdir(d))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) state = 1;
    closedir(d);
    return state;
}

// Our own temporary directory (flat: the export's files), removed.
void remove_flat_dir(const std::string& dir) {
    if (DIR* d = opendir(dir.c_str())) {
        while (struct dirent* e = readdir(d))
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) unlink((dir + "/" + e->d_name).c_str());
        closedir(d);
    }
    rmdir(dir.c_str());
}

// The model's weights alone under their HF names (a llama model's are
// transformers' own), with the "format" transformers requires of a safetensors file.
std::string write_weights(Model* model, const std::string& path) {
    StWriter w;
    w.meta["format"] = "pt";
    for (const TensorSpec& t : model->specs)
        w.add(t.name, "F32", std::vector<int64_t>(t.shape.begin(), t.shape.end()), model->params + t.offset,
              t.numel * sizeof(float));
    return st_write(path, w);
}

// Every file into a new directory beside out, then renamed into place.
std::string write_export(Model* model, const std::map<std::string, std::string>& files, const std::string& out,
                         bool replace_files) {
    size_t slash = out.find_last_of('/');
    std::string err;
    if (slash != std::string::npos && slash > 0 && !make_dir(out.substr(0, slash), &err)) return err;
    std::string tmpl = out + ".tmp-XXXXXX";
    if (!mkdtemp(&tmpl[0])) return "cannot create a directory beside " + out + ": " + strerror(errno);
    const std::string tmp = tmpl;
    mode_t mask = umask(0);  // mkdtemp's 0700 would keep the export from others: the mode mkdir gives, 0777 & ~umask
    umask(mask);
    if (chmod(tmp.c_str(), 0777 & ~mask) != 0) err = "cannot set the mode of " + tmp + ": " + strerror(errno);
    for (const auto& [name, text] : files)
        if (err.empty()) err = write_text(tmp + "/" + name, text);
    if (err.empty()) err = write_weights(model, tmp + "/model.safetensors");
    if (err.empty() && !replace_files && rename(tmp.c_str(), out.c_str()) != 0)
        err = "cannot rename " + tmp + " to " + out + ": " + strerror(errno);
    if (err.empty() && replace_files) {  // --force into a directory with files: ours replace theirs
        std::vector<std::string> names = {"model.safetensors"};
        for (const auto& kv : files) names.push_back(kv.first);
        for (const std::string& name : names)
            if (err.empty() && rename((tmp + "/" + name).c_str(), (out + "/" + name).c_str()) != 0)
                err = "cannot rename " + tmp + "/" + name + " into " + out + ": " + strerror(errno);
    }
    if (!err.empty() || replace_files) remove_flat_dir(tmp);
    return err;
}

// Refuses an --out that the export may not write into.
std::string check_out(const std::string& out, bool force, bool* replace_files) {
    int state = dir_state(out);
    *replace_files = state == 1;
    if (state == 2) return "--out " + out + " exists and is not a directory; choose a new directory";
    if (state == 1 && !force)
        return "--out " + out + " exists and is not empty; choose a new directory, or add --force to replace the "
               "export's files in it";
    std::map<std::string, std::string> meta;
    Config c;
    if (state == 1 && checkpoint_read_config(out + "/model.safetensors", &c, &meta).empty() && meta.count("checksum"))
        return "--out " + out + " holds a model.safetensors written by ./lime train, which the export would "
               "replace; choose another --out";
    return "";
}

}  // namespace

std::string hf_export(const std::string& path, const std::string& out_arg, bool force) {
    std::string out = out_arg;
    while (out.size() > 1 && out.back() == '/') out.pop_back();
    Config c;
    std::map<std::string, std::string> meta;
    std::string err = checkpoint_read_config(path, &c, &meta);
    if (!err.empty()) return err;
    if (c.arch != ARCH_LLAMA)  // transformers' LlamaForCausalLM is LLaMa alone
        return path + " is a " + arch_name(c.arch) + " checkpoint (" + model_entry(c.arch).about +
               "): transformers has no such model, and dropping what it adds to LLaMa would give a different model; "
               "export a checkpoint trained with --arch llama";
    if (!meta.count("vocab"))
        return path + " has no vocabulary (\"vocab\" in its metadata), so no tokenizer can be written; export a "
               "model.safetensors that ./lime train wrote";
    TrainMeta tm;
    err = checkpoint_check_meta(path, c, meta, &tm);
    if (!err.empty()) return err;
    std::map<std::string, std::string> files;
    err = hf_json_files(c, tm.task["task"], tm.vocab, &files);
    if (!err.empty()) return path + ": " + err + "; the file was altered; use an earlier checkpoint or train again";
    bool replace_files = false;
    err = check_out(out, force, &replace_files);
    if (!err.empty()) return err;
    ModelSettings settings;
    settings.host_bytes = memory_available("/proc/meminfo");
    settings.flags = SizeFlags{"", "", "", "", "", ""};  // export cannot change a checkpoint's shape
    Model model;
    err = model_create(&model, c, 1, DEVICE_CPU, settings);
    if (err.empty()) err = model_load(&model, path, false);
    if (err.empty()) err = write_export(&model, files, out, replace_files);
    model_free(&model);
    return err;
}
