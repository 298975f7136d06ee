// support/commands/verify.cpp — `./lime verify`: the implementation against
// reference vectors (docs/checkpoint.md). A reference file holds a model's
// weights, a batch, and what one forward, backward and AdamW step must give:
// the loss, the logits, every gradient and every updated parameter; each is
// compared by its relative error against a tolerance. train.cpp's main calls
// cmd_verify (support/commands/commands.h).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "support/commands/commands.h"
#include "support/lib/cli.h"
#include "support/lib/safetensors.h"
#include "support/model/lime.h"
#include "support/model/names.h"

// ===========================================================================
// ./lime verify: the implementation against reference vectors (docs/checkpoint.md)
// ===========================================================================

struct Verifier {
    int failed = 0, checked = 0;
    bool quiet = false, silent = false;  // quiet: only failures printed; silent: nothing (the labs' checker)
    std::string first_failed;            // the first check that failed, and its error
    void check(const std::string& what, const float* got, const float* want, size_t n, double tol) {
        double num = 0, den = 0;
        for (size_t i = 0; i < n; i++) {
            double diff = (double)got[i] - want[i];
            num += diff * diff;
            den += (double)want[i] * want[i];
        }
        double err = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
        bool ok = err < tol;  // a NaN fails too
        checked++;
        if (!ok && failed++ == 0) first_failed = what + fmt(" (rel err %.2e", err) + fmt(", tol %.0e)", tol);
        if (!silent && (!quiet || !ok))
            printf("  %-4s %-62s rel err %.2e  tol %.0e\n", ok ? "ok" : "FAIL", one_line(what).c_str(), err, tol);
    }
};

static std::string meta_float(const std::map<std::string, std::string>& meta, const char* key, float* out) {
    auto it = meta.find(key);
    if (it == meta.end()) return std::string("no \"") + key + "\" in the metadata";
    char* end = nullptr;
    *out = strtof(it->second.c_str(), &end);
    if (*end || end == it->second.c_str() || !std::isfinite(*out))
        return std::string("metadata \"") + key + "\" is not a finite number";
    return "";
}

// A reference-vector file's batch and the losses it expects.
constexpr int VERIFY_MAX_BATCH = 4096;  // the reference files hold a few sequences
struct RefBatch {
    int B = 0, T = 0;
    std::vector<int> tokens, targets;
    std::vector<float> mask, want_loss, losses;  // expect.loss [1], expect.losses [3]
    // a file with "entropy_reg": batch.valid [B, T], expect.ce [1] and expect.s2 [1]
    std::vector<float> valid, want_ce, want_s2;
};

// Reads the batch (token ids inside the vocabulary of c) and the expected losses.
// A reference file has no checksum: every size in it is checked against what
// the model will index before anything is read or run: B and T from
// batch.tokens' shape (T at most the config's max_position_embeddings, the
// length of the model's tables), the other batch tensors of exactly that shape
// and dtype (st_get_*), every token id and target inside the vocabulary.
static std::string read_ref_batch(const SafeTensors& st, const std::string& path, const Config& c, RefBatch* rb) {
    const StTensor* tk = st.find("batch.tokens");
    if (!tk || tk->shape.size() != 2) return path + ": no batch.tokens [B, T]; is it a reference-vector file?";
    if (tk->shape[0] < 1 || tk->shape[0] > VERIFY_MAX_BATCH || tk->shape[1] < 1 || tk->shape[1] > c.T)
        return path + ": batch.tokens has shape [" + std::to_string(tk->shape[0]) + ", " + std::to_string(tk->shape[1]) + "], but a batch needs 1 .. " +
               std::to_string(VERIFY_MAX_BATCH) + " sequences of 1 .. " + std::to_string(c.T) +
               " positions (the config's max_position_embeddings): the file is damaged or not a reference file";
    int B = rb->B = (int)tk->shape[0], T = rb->T = (int)tk->shape[1];
    rb->tokens.assign((size_t)B * T, 0);
    rb->targets.assign((size_t)B * T, 0);
    rb->mask.assign((size_t)B * T, 0);
    rb->want_loss.assign(1, 0);
    rb->losses.assign(3, 0);
    std::string err = st_get_i32(st, "batch.tokens", {B, T}, rb->tokens.data());
    if (err.empty()) err = st_get_i32(st, "batch.targets", {B, T}, rb->targets.data());
    if (err.empty()) err = st_get_f32(st, "batch.mask", {B, T}, rb->mask.data());
    if (err.empty()) err = st_get_f32(st, "expect.loss", {1}, rb->want_loss.data());
    if (err.empty()) err = st_get_f32(st, "expect.losses", {3}, rb->losses.data());
    if (err.empty() && c.entropy_reg > 0) {  // the regulariser's positions and its parts of the loss
        rb->valid.assign(B * T, 0);
        rb->want_ce.assign(1, 0);
        rb->want_s2.assign(1, 0);
        err = st_get_f32(st, "batch.valid", {B, T}, rb->valid.data());
        if (err.empty()) err = st_get_f32(st, "expect.ce", {1}, rb->want_ce.data());
        if (err.empty()) err = st_get_f32(st, "expect.s2", {1}, rb->want_s2.data());
        for (size_t i = 0; i < (size_t)B * T && err.empty(); i++)
            if (rb->valid[i] != 0 && rb->valid[i] != 1) err = path + ": batch.valid holds a value other than 0 or 1";
    }
    for (size_t i = 0; i < (size_t)B * T && err.empty(); i++) {
        if (rb->tokens[i] < 0 || rb->tokens[i] >= c.V || rb->targets[i] < 0 || rb->targets[i] >= c.V)
            err = path + ": a token id is outside the vocabulary";
        else if (!std::isfinite(rb->mask[i]) || rb->mask[i] < 0)
            err = path + ": batch.mask holds a negative, NaN or infinite weight";
    }
    return err;
}

// The AdamW settings of the file's three steps, from its metadata.
static std::string read_ref_adamw(const std::map<std::string, std::string>& meta, const std::string& path,
                                  AdamWConfig* opt) {
    const std::vector<std::pair<const char*, float*>> fields = {
        {"lr", &opt->lr}, {"router_lr", &opt->router_lr}, {"weight_decay", &opt->weight_decay},
        {"beta1", &opt->beta1}, {"beta2", &opt->beta2}, {"eps", &opt->eps}, {"grad_clip", &opt->grad_clip}};
    for (auto [key, dst] : fields) {
        std::string err = meta_float(meta, key, dst);
        if (!err.empty()) return path + ": " + err;
    }
    return "";
}

// The file's expected tensor `name` of `shape`, into *want.
static std::string ref_expect(const SafeTensors& st, const std::string& name, const std::vector<int64_t>& shape,
                              std::vector<float>* want) {
    size_t n = 1;
    for (int64_t s : shape) n *= (size_t)s;
    want->assign(n, 0);
    return st_get_f32(st, name, shape, want->data());
}

// Every model tensor of base (the gradients or the weights) against the file's prefix + name.
static std::string check_all(const SafeTensors& st, const Model& model, const std::string& prefix, const float* base,
                             double tol, Verifier* v) {
    std::vector<float> want;
    for (const TensorSpec& t : model.specs) {
        std::string err = ref_expect(st, prefix + t.name, std::vector<int64_t>(t.shape.begin(), t.shape.end()), &want);
        if (!err.empty()) return err;
        v->check(prefix + t.name, base + t.offset, want.data(), t.numel, tol);
    }
    return "";
}

// The checks on a loaded model: logits and loss, every gradient, then three
// AdamW steps on the same batch (weights after steps 1 and 3, not with TF32
// or bf16; the loss before each). loose, TF32's or bf16's products
// (docs/checkpoint.md): logits, losses and gradients at 1e-2, bf16's
// gradients at 2e-2 (bf16 keeps 8 mantissa bits, TF32 11).
static std::string verify_model(Model* model, const SafeTensors& st, const RefBatch& rb, const AdamWConfig& opt,
                                bool loose, bool bf16, Verifier* v) {
    double tol_fwd = loose ? 1e-2 : 1e-5, tol_grad = bf16 ? 2e-2 : loose ? 1e-2 : 1e-4;
    const int* tokens = rb.tokens.data();
    const int* targets = rb.targets.data();
    const float* mask = rb.mask.data();
    const float* valid = rb.valid.empty() ? nullptr : rb.valid.data();  // the regulariser's (its files only)
    std::vector<float> want;
    float loss = model_forward(model, tokens, targets, mask, rb.B, rb.T, valid);
    std::string err = ref_expect(st, "expect.logits", {rb.B, rb.T, model->c.V}, &want);
    if (!err.empty()) return err;
    v->check("logits", model_logits(model), want.data(), want.size(), tol_fwd);
    v->check("loss", &loss, rb.want_loss.data(), 1, tol_fwd);
    if (valid) {
        v->check("ce", &model->last_ce, rb.want_ce.data(), 1, tol_fwd);
        v->check("s2", &model->last_s2, rb.want_s2.data(), 1, tol_fwd);
    }
    model_backward(model);
    model_to_host(model);
    if (!(err = check_all(st, *model, "expect.grad.", model->grads, tol_grad, v)).empty()) return err;
    float got_losses[3];
    for (int step = 1; step <= 3; step++) {
        if (step > 1) {
            got_losses[step - 1] = model_forward(model, tokens, targets, mask, rb.B, rb.T, valid);
            model_backward(model);
        } else {
            got_losses[0] = loss;
        }
        model_update(model, opt, 1.0f);
        model_to_host(model);
        if (!loose && (step == 1 || step == 3)) {
            err = check_all(st, *model, "expect.step" + std::to_string(step) + ".", model->params, tol_grad, v);
            if (!err.empty()) return err;
        }
    }
    v->check("losses (before each of 3 steps)", got_losses, rb.losses.data(), 3, tol_fwd);
    return "";
}

// One reference-vector file: its model loaded, then verify_model's checks.
static std::string verify_file(const std::string& path, Device dev, const ModelSettings& settings, Verifier* v) {
    SafeTensors st;
    std::string err = st_read(path, &st);
    if (!err.empty()) return err;
    Config c;
    std::map<std::string, std::string> meta;
    err = checkpoint_read_config(path, &c, &meta);
    if (!err.empty()) return err;
    RefBatch rb;
    if (!(err = read_ref_batch(st, path, c, &rb)).empty()) return err;
    AdamWConfig opt;
    if (!(err = read_ref_adamw(meta, path, &opt)).empty()) return err;
    Model model;
    err = model_create(&model, c, rb.B, dev, settings);
    if (!err.empty()) return err;
    err = model_load(&model, path, false);
    if (err.empty()) {
        // the CPU computes float32 whatever the settings say: checked at float32's tolerances
        bool bf16 = dev == DEVICE_GPU && settings.precision == PRECISION_BF16, tf32 = dev == DEVICE_GPU && settings.tf32;
        std::string where =
            dev == DEVICE_GPU ? std::string("gpu, ") + model_attention_name(&model) + " attention" : "cpu";
        if (!v->silent)
            printf("%s: %s, B=%d T=%d, %s%s\n", one_line(path).c_str(), arch_name(c.arch), rb.B, rb.T, where.c_str(),
                   bf16 ? " (bf16)" : tf32 ? " (tf32)" : "");
        err = verify_model(&model, st, rb, opt, tf32 || bf16, bf16, v);
    }
    model_free(&model);
    return err;
}

std::string verify_reference_files(const std::vector<std::string>& paths, Device dev, const ModelSettings& settings) {
    Verifier v;
    v.silent = true;
    for (const std::string& path : paths) {
        std::string err = verify_file(path, dev, settings, &v);
        if (!err.empty()) return err;
    }
    if (v.failed)
        return std::to_string(v.failed) + " of " + std::to_string(v.checked) + " checks failed, the first: " +
               v.first_failed;
    return v.checked ? "" : "no check ran";
}

int cmd_verify(int argc, char** argv) {
    std::vector<FlagSpec> flags = {
        {"device", "cpu", "cpu or gpu"},
        {"tf32", "0", "gpu: 1 checks with TF32 matrix products at docs/checkpoint.md's looser tolerances"},
        PRECISION_FLAG,
        ATTENTION_FLAG,
        {"threads", "0", "OpenMP threads (0: all cores; at most 4 x the cores)"},
        {"quiet", nullptr, "print only failures and the summary"},
    };
    Args a = parse_args("verify", "Checks the implementation against reference-vector files (docs/checkpoint.md): "
                        "logits, loss, every gradient,\nthree AdamW steps. usage: ./lime verify [flags] FILE...",
                        flags, argc, argv, true);
    set_threads(a);
    std::string d = a.choice("device", {"cpu", "gpu"});
    ModelSettings settings = model_settings(a);
    if (!a.err.empty()) die("verify", a.err);
    Device dev = DEVICE_CPU;
    if (d == "gpu") {
        std::string why;
        if (!gpu_available(&why)) die("verify", "--device gpu: " + why);
        dev = DEVICE_GPU;
    }
    if (dev == DEVICE_CPU && settings.precision == PRECISION_BF16)
        die("verify", "--precision bf16 is for the GPU; the CPU trains in float32: add --device gpu");
    if (dev == DEVICE_CPU && settings.tf32)
        die("verify", "--tf32 1 is for the GPU (its products on TF32 tensor cores); the CPU computes float32, checked at "
                      "float32's tolerances: add --device gpu, or drop --tf32");
    if (a.positional.empty()) die("verify", "needs reference files, e.g. ./lime verify tests/golden/*.safetensors");
    Verifier v;
    v.quiet = a.has("quiet");
    int unchecked = 0;  // files that could not be read or run: counted apart from the checks that failed
    for (const std::string& path : a.positional) {
        std::string err = verify_file(path, dev, settings, &v);
        if (!err.empty()) { printf("  FAIL %s\n", one_line(err).c_str()); unchecked++; }
    }
    printf("verify: %d checks, %d failed", v.checked, v.failed);
    if (unchecked) printf("; %d file%s could not be checked", unchecked, unchecked == 1 ? "" : "s");
    printf("\n");
    return v.failed || unchecked ? 1 : 0;
}
