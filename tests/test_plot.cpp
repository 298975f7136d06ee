// tests/test_plot.cpp — every plot kind writes a valid PNG of the asked size
// that is not blank; bad input and bad paths give errors. The figures are
// left in /tmp/lime_plot_*.png to look at.
#include <cmath>
#include <cstdio>
#include <cstring>

#include "support/lib/plot.h"
#include "test.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_STATIC
#include <stb/stb_image.h>
#pragma GCC diagnostic pop

// Reads the PNG signature and IHDR by hand, then decodes with stb_image and
// counts the pixels that are not white. "" or what is wrong.
static std::string check_png(const std::string& path, int want_w, int want_h, int* inked) {
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) return "no file " + path;
    unsigned char head[24];
    size_t got = fread(head, 1, sizeof head, f);
    fclose(f);
    static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    if (got < 24 || memcmp(head, sig, 8) != 0 || memcmp(head + 12, "IHDR", 4) != 0) return "not a PNG";
    auto be32 = [&](int o) { return (int)((unsigned)head[o] << 24 | (unsigned)head[o + 1] << 16 | (unsigned)head[o + 2] << 8 | head[o + 3]); };
    if (be32(16) != want_w || be32(20) != want_h)
        return "IHDR says " + std::to_string(be32(16)) + "x" + std::to_string(be32(20));
    int w, h, n;
    unsigned char* px = stbi_load(path.c_str(), &w, &h, &n, 3);
    if (!px) return "stb_image cannot decode it";
    *inked = 0;
    for (int i = 0; i < w * h; i++) *inked += px[3 * i] + px[3 * i + 1] + px[3 * i + 2] < 3 * 250;
    stbi_image_free(px);
    return "";
}

// Two noisy "loss curves" with min..max bands over 3 seeds.
static std::vector<Series> loss_curves() {
    std::vector<Series> out;
    const char* names[] = {"LLaMa", "LIMe"};
    for (int m = 0; m < 2; m++) {
        Series s;
        s.label = names[m];
        for (int step = 0; step <= 2000; step += 20) {
            double base = 0.35 + 2.2 * std::exp(-step / (m ? 380.0 : 450.0)) + (m ? 0 : 0.05);
            double noise = 0.03 * std::sin(step * 0.13 + m);
            s.x.push_back(step);
            s.y.push_back(base + noise);
            s.lo.push_back(base + noise - 0.06 - 0.1 * std::exp(-step / 600.0));
            s.hi.push_back(base + noise + 0.06 + 0.1 * std::exp(-step / 600.0));
        }
        out.push_back(s);
    }
    return out;
}

TEST(plot_lines_png) {
    int ink = 0;
    std::string path = "/tmp/lime_plot_lines.png";
    std::string err = plot_lines(path, "Arithmetic mod 11, 6 operators: validation loss", "step", "loss", loss_curves());
    CHECK(err.empty(), "%s", err.c_str());
    CHECK((err = check_png(path, 800, 500, &ink)).empty(), "%s", err.c_str());
    CHECK(ink > 8000, "only %d non-white pixels: blank?", ink);
    // log y, few points (markers), a gap (NaN), scale 2
    std::vector<Series> s = loss_curves();
    for (auto& x : s) x.lo.clear(), x.hi.clear();
    Series few = {"ops 4", {1, 2, 3, 4, 5, 6}, {2.0, 0.9, 0.5, NAN, 0.12, 0.05}, {}, {}};
    PlotSize big;
    big.scale = 2;
    path = "/tmp/lime_plot_lines_log.png";
    err = plot_lines(path, "Perplexity (log scale)", "epoch", "loss", {few, {"ops 5", {1, 2, 3, 4, 5, 6}, {2.3, 1.5, 1.1, 0.8, 0.5, 0.3}, {}, {}}}, true, false, big);
    CHECK(err.empty(), "%s", err.c_str());
    CHECK((err = check_png(path, 1600, 1000, &ink)).empty(), "%s", err.c_str());
    CHECK(ink > 20000, "only %d non-white pixels: blank?", ink);
    // log x over many decades (loss against FLOPs, the paper's Figure 1)
    Series a = {"LLaMa", {}, {}, {}, {}}, b = {"LIMe", {}, {}, {}, {}};
    for (double f = 1e13; f <= 3e17; f *= 1.5) {
        a.x.push_back(f), a.y.push_back(2.0 + 30 * std::pow(f / 1e13, -0.3));
        b.x.push_back(f), b.y.push_back(1.95 + 28 * std::pow(f / 1e13, -0.3));
    }
    path = "/tmp/lime_plot_flops.png";
    err = plot_lines(path, "Loss against compute", "FLOPs", "validation loss", {a, b}, false, true);
    CHECK(err.empty(), "%s", err.c_str());
    CHECK((err = check_png(path, 800, 500, &ink)).empty(), "%s", err.c_str());
}

TEST(plot_bars_png) {
    int ink = 0;
    std::string path = "/tmp/lime_plot_bars.png";
    std::vector<BarGroup> groups = {{"LLaMa", {97.1, 78.4, 41.3}, {1.2, 3.5, 4.8}},
                                    {"LIMe", {98.0, 86.9, 71.6}, {0.8, 2.9, 3.9}}};
    std::string err = plot_bars(path, "Accuracy by tier (mean and std over 5 seeds)", "accuracy (%)",
                                {"4 operators", "5 operators", "6 operators"}, groups);
    CHECK(err.empty(), "%s", err.c_str());
    CHECK((err = check_png(path, 800, 500, &ink)).empty(), "%s", err.c_str());
    CHECK(ink > 20000, "only %d non-white pixels: blank?", ink);
    err = plot_bars(path, "t", "y", {"a", "b"}, {{"g", {1}, {}}});
    CHECK(err.find("1 values for 2 categories") != std::string::npos, "mismatch not caught: '%s'", err.c_str());
}

TEST(plot_heatmap_png) {
    // router weights: layer l reads layers 0..l-1 (the rest is blank)
    int L = 8;
    std::vector<std::vector<double>> m(L, std::vector<double>(L, NAN));
    std::vector<std::string> rows, cols;
    for (int l = 0; l < L; l++) {
        double sum = 0;
        for (int j = 0; j <= l; j++) sum += m[l][j] = 1.0 + (j == 0 ? 2.0 : 0) + (j == l ? 1.5 : 0) + 0.3 * std::sin(l * 3 + j);
        for (int j = 0; j <= l; j++) m[l][j] /= sum;
        rows.push_back("layer " + std::to_string(l + 1));
        cols.push_back(std::to_string(l));
    }
    int ink = 0;
    std::string path = "/tmp/lime_plot_heatmap.png";
    std::string err = plot_heatmap(path, "LIMe router weights (rows sum to 1)", "source layer", "layer", m, rows, cols);
    CHECK(err.empty(), "%s", err.c_str());
    CHECK((err = check_png(path, 800, 500, &ink)).empty(), "%s", err.c_str());
    CHECK(ink > 40000, "only %d non-white pixels: blank?", ink);
    std::vector<std::vector<double>> ragged = {{1, 2}, {3}};
    CHECK(!plot_heatmap(path, "", "", "", ragged, {}, {}).empty(), "a ragged matrix was accepted");
}

TEST(plot_bad_input) {
    std::string err = plot_lines("/nonexistent_dir/x.png", "t", "x", "y", loss_curves());
    CHECK(err.find("/nonexistent_dir/x.png") != std::string::npos, "bad path not reported: '%s'", err.c_str());
    FILE* f = fopen("/nonexistent_dir/x.png.tmp", "rb");
    CHECK(!f, "a temporary file was left behind");
    CHECK(!plot_lines("/tmp/x.png", "", "", "", {}).empty(), "no series accepted");
    CHECK(!plot_lines("/tmp/x.png", "", "", "", {{"a", {1, 2}, {1}, {}, {}}}).empty(), "x/y size mismatch accepted");
    CHECK(!plot_lines("/tmp/x.png", "", "", "", {{"a", {1, 2}, {-1, 0}, {}, {}}}, true).empty(), "log axis of values <= 0 accepted");
    PlotSize tiny;
    tiny.width = 10;
    CHECK(!plot_lines("/tmp/x.png", "", "", "", loss_curves(), false, false, tiny).empty(), "a 10-unit-wide plot accepted");
    // non-ASCII text must not crash the font (it indexes a table by char - 32)
    CHECK(plot_lines("/tmp/lime_plot_utf8.png", "caf\xc3\xa9 \t", "x", "y", loss_curves()).empty(), "UTF-8 title refused");
}
