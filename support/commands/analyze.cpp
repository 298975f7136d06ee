// support/commands/analyze.cpp — `./lime analyze`: what a trained checkpoint
// learned and what it costs. The router heatmap (paper Fig. 5; hc: its static
// mixing weights), the entropy of each layer's values and hidden states
// (Sec. 5.2, as the authors measure it), parameters and FLOPs per token
// against a llama of the same shape; printed, drawn to PNG figures and written
// to entropy.tsv, which compare reads.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "data/task.h"
#include "support/commands/commands.h"
#include "support/lib/cli.h"
#include "support/lib/plot.h"
#include "support/lib/stats.h"
#include "support/model/models.h"  // study_hooks: what a study model names, attends and costs
#include "support/model/lime.h"
#include "support/model/names.h"

// ===========================================================================
// The measures (docs/tasks.md, "./lime analyze")
// ===========================================================================

// Router weights (paper Section 5.4, Figure 5): for layer l and source layer
// l', the mean |W[l][r, l'*R + r']| over r and r', each row normalised to sum
// 1. Row l-1 holds layer l (layers 1..L-1); entries l' > l are NaN (no such source).
// With --router-kv separate the mean runs over the key and the value router.
std::vector<std::vector<double>> router_heatmap(const Model& model) {
    const Config& c = model.c;
    std::vector<std::vector<double>> rows;
    for (int l = 1; l < c.L; l++) {
        std::vector<double> row(c.L, NAN);
        std::vector<const float*> routers;
        for (const float* W : {model.p.layer[l].router, model.p.layer[l].router_v}) if (W) routers.push_back(W);
        if (routers.empty()) continue;
        int J = (l + 1) * c.R;
        double total = 0;
        for (int src = 0; src <= l; src++) {
            double s = 0;
            for (const float* W : routers)
                for (int r = 0; r < c.R; r++)
                    for (int rr = 0; rr < c.R; rr++) s += std::fabs(W[r * J + src * c.R + rr]);
            row[src] = s / (routers.size() * c.R * c.R);
            total += row[src];
        }
        for (int src = 0; src <= l; src++) row[src] /= total > 0 ? total : 1;
        rows.push_back(row);
    }
    return rows;
}

// Eigenvalues of a symmetric n x n matrix (row-major, destroyed) by cyclic
// Jacobi rotations: slow for big n, exact enough, and twenty lines.
static std::vector<double> symmetric_eigenvalues(std::vector<double> a, int n) {
    for (int sweep = 0; sweep < 100; sweep++) {
        double off = 0;
        for (int i = 0; i < n; i++)
            for (int j = i + 1; j < n; j++) off += a[i * n + j] * a[i * n + j];
        if (off < 1e-22) break;
        for (int p = 0; p < n; p++)
            for (int q = p + 1; q < n; q++) {
                if (std::fabs(a[p * n + q]) < 1e-300) continue;
                double theta = (a[q * n + q] - a[p * n + p]) / (2 * a[p * n + q]);
                double t = (theta >= 0 ? 1 : -1) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
                double c = 1 / std::sqrt(t * t + 1), s = t * c;
                for (int k = 0; k < n; k++) {  // rotate columns p and q, then rows p and q
                    double akp = a[k * n + p], akq = a[k * n + q];
                    a[k * n + p] = c * akp - s * akq;
                    a[k * n + q] = s * akp + c * akq;
                }
                for (int k = 0; k < n; k++) {
                    double apk = a[p * n + k], aqk = a[q * n + k];
                    a[p * n + k] = c * apk - s * aqk;
                    a[q * n + k] = s * apk + c * aqk;
                }
            }
    }
    std::vector<double> ev(n);
    for (int i = 0; i < n; i++) ev[i] = a[i * n + i];
    return ev;
}

// Renyi entropy of order alpha of the spectrum of one sequence's z-scored
// rows z (len, D): the eigenvalues of the Gram matrix Z Z^T, clamped at 0
// and divided by their sum (the trace), then log(sum lambda^alpha) / (1 - alpha),
// Shannon's -sum lambda log lambda at alpha = 1. The non-zero eigenvalues of
// Z Z^T (len x len) are those of Z^T Z (D x D): the smaller one is formed.
static double spectrum_entropy(const double* z, int len, int D, double alpha) {
    int n = std::min(len, D);
    std::vector<double> gram((size_t)n * n, 0);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            for (int k = 0; k < (len <= D ? D : len); k++)  // rows i, j (len <= D) or columns i, j
                gram[i * n + j] += len <= D ? z[(size_t)i * D + k] * z[(size_t)j * D + k]
                                            : z[(size_t)k * D + i] * z[(size_t)k * D + j];
    std::vector<double> ev = symmetric_eigenvalues(gram, n);
    double trace = 0;
    for (double& e : ev) { e = std::max(e, 0.0); trace += e; }
    if (trace <= 0) return 0;
    double h = 0;
    if (std::fabs(alpha - 1) < 1e-9) {
        for (double e : ev) if (e > 0) h -= (e / trace) * std::log(e / trace);
        return h;
    }
    for (double e : ev) h += std::pow(e / trace, alpha);
    return std::log(h) / (1 - alpha);
}

// Value entropy as the authors measure it (paper Section 5.2, their code):
// x (N, T, D) holds one layer's vectors for N sequences, the first lens[s]
// positions of sequence s real (the rest padding, left out). Each feature is
// z-scored over every real position of every sequence, in float64, with the
// standard deviation (dividing by the count) plus 1e-5; then each sequence's
// entropy is spectrum_entropy; the result is their mean and sample std.
EntropyStat layer_entropy(const float* x, int N, int T, int D, const std::vector<int>& lens, double alpha) {
    std::vector<double> mean(D, 0), sd(D, 0);
    double count = 0;
    for (int s = 0; s < N; s++) count += lens[s];
    for (int s = 0; s < N; s++)
        for (int t = 0; t < lens[s]; t++)
            for (int j = 0; j < D; j++) mean[j] += x[((size_t)s * T + t) * D + j] / count;
    for (int s = 0; s < N; s++)
        for (int t = 0; t < lens[s]; t++)
            for (int j = 0; j < D; j++) {
                double v = x[((size_t)s * T + t) * D + j] - mean[j];
                sd[j] += v * v / count;
            }
    for (double& v : sd) v = std::sqrt(v) + 1e-5;
    std::vector<double> per_seq, z;
    for (int s = 0; s < N; s++) {
        z.assign((size_t)lens[s] * D, 0);
        for (int t = 0; t < lens[s]; t++)
            for (int j = 0; j < D; j++) z[(size_t)t * D + j] = (x[((size_t)s * T + t) * D + j] - mean[j]) / sd[j];
        per_seq.push_back(spectrum_entropy(z.data(), lens[s], D, alpha));
    }
    EntropyStat e;
    e.mean = stats_mean(per_seq);
    e.std = per_seq.size() > 1 ? stats_std(per_seq) : 0;
    return e;
}


// ===========================================================================
// ./lime analyze: the router heatmap, value entropy per layer, cost
// ===========================================================================

// Parameters (the routers' share, or the peer's mixing weights') and FLOPs per token against a llama of the same shape.
static void print_cost(const Model& model) {
    const Config& c = model.c;
    Config llama = c;
    model_parse("llama", &llama);
    size_t extra = model.n_params - param_count(llama);  // the routers, or a peer's own mixing weights
    const StudyHooks* study = study_hooks(c);  // a study model names its own weights (its file's StudyHooks)
    const char* what = study && study->weights ? study->weights : "routers";
    printf("parameters: %zu (%s %zu, %.3f%%)\n", model.n_params, what, extra, 100.0 * extra / model.n_params);
    printf("FLOPs per token, training step at T=%d: %.4g (llama of this shape: %.4g, %+.3f%%)\n", c.T,
           flops_per_token(c, c.T), flops_per_token(llama, c.T),
           100 * (flops_per_token(c, c.T) / flops_per_token(llama, c.T) - 1));
}

// The router heatmap (paper Fig. 5) of a lime model: printed, one row per
// layer with its own share and its largest source, and drawn to OUT/router_heatmap.png.
static std::string analyze_routers(const Model& model, const std::string& out) {
    const Config& c = model.c;
    std::vector<std::vector<double>> heat = router_heatmap(model);
    std::vector<std::string> rows, cols;
    for (int l = 1; l < c.L; l++) rows.push_back("layer " + std::to_string(l));
    for (int l = 0; l < c.L; l++) cols.push_back(std::to_string(l));
    printf("router weight by source layer (rows: layer; columns: source layer 0..%d; each row sums to 1):\n", c.L - 1);
    for (size_t i = 0; i < heat.size(); i++) {
        printf("  %-9s", rows[i].c_str());
        for (double v : heat[i]) printf(std::isfinite(v) ? " %5.2f" : "     -", v);
        int l = (int)i + 1;
        double own = heat[i][l], best = 0;
        int best_src = 0;
        for (int s = 0; s < l; s++) if (heat[i][s] > best) { best = heat[i][s]; best_src = s; }
        printf("   own %2.0f%%, most from layer %d (%2.0f%%)\n", 100 * own, best_src, 100 * best);
    }
    std::string err = plot_heatmap(out + "/router_heatmap.png", "Router weight by source layer (rows sum to 1)",
                                   "source layer", "layer", heat, rows, cols, heatmap_size(rows.size(), cols.size()));
    if (!err.empty()) return err;
    printf("wrote %s/router_heatmap.png\n", one_line(out).c_str());
    return "";
}

// HC's counterpart of the router heatmap: the static mixing weights of every
// sublayer (rows: layer l's attention, then its MLP; columns: static_alpha[i, k],
// the weight of stream i in mixture k (mixture 0 is what the sublayer reads, 1+i
// what stream i keeps), then static_beta[i], how much of the sublayer's output
// stream i takes). Printed, one row per sublayer, and drawn to OUT/hc_heatmap.png.
// The dynamic correction (per token, scale * tanh) is not in it.
static std::string analyze_hc(const Model& model, const std::string& out) {
    const Config& c = model.c;
    int n = c.hc_rate, K = n + 1;
    std::vector<std::vector<double>> heat;
    std::vector<std::string> rows, cols;
    for (int k = 0; k < K; k++)
        for (int i = 0; i < n; i++) cols.push_back(strf("a%d,%d", i, k));
    for (int i = 0; i < n; i++) cols.push_back(strf("b%d", i));
    printf("hc static mixing weights (rows: sublayer; a_i,k: stream i in mixture k, mixture 0 feeds the sublayer, "
           "1+i is kept by stream i; b_i: stream i's share of the sublayer's output)%s:\n",
           c.hc_dynamic ? ", without the dynamic correction" : "");
    printf("  %-12s", "");
    for (const std::string& col : cols) printf(" %6s", col.c_str());
    printf("\n");
    for (int s = 0; s < 2 * c.L; s++) {
        const HcParams& h = model.p.hc[s];
        std::vector<double> row;
        for (int k = 0; k < K; k++)
            for (int i = 0; i < n; i++) row.push_back(h.static_alpha[i * K + k]);
        for (int i = 0; i < n; i++) row.push_back(h.static_beta[i]);
        rows.push_back(strf("layer %d %s", s / 2, s % 2 ? "mlp" : "attn"));
        printf("  %-12s", rows.back().c_str());
        for (double v : row) printf(" %6.2f", v);
        printf("\n");
        heat.push_back(row);
    }
    std::string err = plot_heatmap(out + "/hc_heatmap.png", "HC static mixing weights (alpha by mixture, then beta)",
                                   "weight", "sublayer", heat, rows, cols, heatmap_size(rows.size(), cols.size()));
    if (!err.empty()) return err;
    printf("wrote %s/hc_heatmap.png\n", one_line(out).c_str());
    return "";
}

// Entropy per layer (paper Sec. 5.2 and Fig. 7a, layer_entropy) of the
// first n test sequences: the raw values (W_V's output), for LIMe the routed
// values attention reads, and the hidden states (residual stream after each
// layer). Printed, drawn to OUT/value_entropy.png and written to
// OUT/entropy.tsv (kind, layer, mean, std over sequences, the order alpha) for compare.
struct EntropyKind { const char* name; Probe probe; };
static std::string analyze_entropy(Model* model, const Task& task, int n, double alpha, const std::string& values,
                                   const std::string& out) {
    const Config& c = model->c;
    const std::vector<Sequence>& seqs = *task.test;
    int B = std::min(n, (int)seqs.size());
    std::vector<int> idx(B), lens(B);
    for (int b = 0; b < B; b++) idx[b] = b, lens[b] = std::min(c.T, (int)seqs[b].tokens.size() - 1);
    Batch batch;
    make_batch(seqs, idx.data(), B, c.T, task.vocab.pad, &batch);
    model_forward(model, batch.tokens.data(), nullptr, nullptr, B, c.T);
    std::vector<EntropyKind> kinds;
    if (values != "routed") kinds.push_back({"raw", PROBE_RAW_VALUES});
    if (values != "raw" && mixes_values(c)) kinds.push_back({"routed", PROBE_VALUES});
    kinds.push_back({"hidden", PROBE_HIDDEN});
    std::vector<Series> series;
    std::string tsv = "kind\tlayer\tmean\tstd\talpha\n";  // alpha in every row: compare --reuse checks it
    printf("entropy (Renyi, alpha = %g; features z-scored over all %d sequences), mean ± std over sequences:\n",
           alpha, B);
    // which values attention attends: the mixture where the model mixes them, else the raw projection
    // (a study model's own where its file says: MUDDFormer's V way, DCA's y_v)
    const StudyHooks* study = study_hooks(c);
    printf("  attended: %s\n", mixes_values(c)                 ? "routed (the mixture attention reads)"
                              : study && study->attended ? study->attended
                                                         : "raw (W_V of the layer's input)");
    printf("  layer");
    for (const EntropyKind& k : kinds) printf("  %-17s", k.name);
    printf("\n");
    series.resize(kinds.size());
    for (int l = 0; l < c.L; l++) {
        printf("  %5d", l);
        for (size_t i = 0; i < kinds.size(); i++) {
            int D = kinds[i].probe == PROBE_HIDDEN ? c.d : c.R * c.hd;
            EntropyStat e = layer_entropy(model_probe(model, kinds[i].probe, l), B, c.T, D, lens, alpha);
            printf("  %7.4f ± %-7.4f", e.mean, e.std);
            series[i].label = kinds[i].name;
            series[i].x.push_back(l);
            series[i].y.push_back(e.mean);
            char row[128];
            snprintf(row, sizeof row, "%s\t%d\t%.6f\t%.6f\t%.17g\n", kinds[i].name, l, e.mean, e.std, alpha);
            tsv += row;
        }
        printf("\n");
    }
    std::string err = plot_lines(out + "/value_entropy.png", "Entropy per layer (" + model_name(c) + ")", "layer",
                                 "Renyi entropy (alpha " + fmt("%g", alpha) + ")", series);
    if (!err.empty()) return err;
    err = write_file_atomic(out + "/entropy.tsv", tsv);
    if (!err.empty()) return err;
    printf("wrote %s/value_entropy.png and %s/entropy.tsv\n", one_line(out).c_str(), one_line(out).c_str());
    const Series& v = series[kinds.size() > 2 ? 1 : 0];
    printf("summary: %s value entropy goes from %.3f at layer 0 to %.3f at layer %d%s\n", v.label.c_str(),
           v.y.front(), v.y.back(), c.L - 1,
           v.y.back() < v.y.front() ? " (later layers' values are less diverse)" : "");
    return "";
}

int cmd_analyze(int argc, char** argv) {
    std::vector<FlagSpec> flags = {
        {"load", "", "a checkpoint written by ./lime train"},
        {"alpha", "0.5", "order of the Renyi entropy (1: Shannon; 0.5: the authors' code)"},
        {"values", "both", "lime, resformer: raw (W_V output), routed (the mixture attention reads) or both; others raw only"},
        {"n", "64", "test sequences the value entropy is averaged over"},
        {"out", "", "directory for the figures (default: the checkpoint's)"},
        {"threads", "0", "OpenMP threads (0: all cores; at most 4 x the cores)"},
        {"device", "auto", "auto, cpu or gpu"},
    };
    const char* summary =
        "The router heatmap (paper Fig. 5; hc: its static mixing weights), value entropy per layer (Sec. 5.2), "
        "parameters and FLOPs\n"
        "of a checkpoint, with figures and a short summary.";
    Args a = parse_args("analyze", summary, flags, argc, argv, false);
    set_threads(a);
    Device dev = pick_device(a);
    double alpha = a.number("alpha", 0, 100);
    if (a.err.empty() && !(alpha > 0))
        a.fail("--alpha " + a.str("alpha") + ": the Renyi order must be positive (1: Shannon, 0.5: the authors')");
    std::string values = a.choice("values", {"raw", "routed", "both"});
    int n = (int)a.integer("n", 1, 100000);
    if (!a.err.empty()) die("analyze", a.err);
    if (!a.has("load")) die("analyze", "needs --load FILE (a model.safetensors written by ./lime train)");
    std::string path = a.str("load");
    size_t slash = path.find_last_of('/');
    std::string out = a.has("out") ? a.str("out") : path.substr(0, slash == std::string::npos ? 0 : slash);
    if (out.empty()) out = ".";
    std::string err;
    Loaded ld;
    err = load_checkpoint(path, dev, model_settings(a), n, &ld, true);
    if (!err.empty()) die("analyze", err);
    if (values == "routed" && !mixes_values(ld.model.c))
        die("analyze", "--values routed: " + path + " is a " + model_name(ld.model.c) +
                           " checkpoint, with no router; use --values raw (or a lime or resformer checkpoint)");
    if (!make_dir(out, &err)) die("analyze", err);
    warn_data_changed("analyze", ld);
    Model& model = ld.model;
    const Config& c = model.c;
    printf("%s: %s, L=%d d=%d H=%d R=%d F=%d V=%d T=%d\n", one_line(path).c_str(), model_name(c).c_str(), c.L, c.d, c.H, c.R,
           c.F, c.V, c.T);
    print_cost(model);
    model_to_host(&model);
    if (c.arch == ARCH_LIME && c.L > 1 && !(err = analyze_routers(model, out)).empty()) die("analyze", err);
    if (c.arch == ARCH_HC && !(err = analyze_hc(model, out)).empty()) die("analyze", err);
    err = analyze_entropy(&model, ld.task, n, alpha, values, out);
    if (!err.empty()) die("analyze", err);
    model_free(&model);
    return 0;
}
