// tests/test_plot.cpp — every plot kind writes a valid PNG of the asked size
// that is not blank; bad input and bad paths give errors. The figures are
// left in /tmp/lime_plot_*.png to look at.
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
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

// The colour runs along the middle row of a one-row heatmap whose cells
// alternate 0 and 1: each pixel counts as the nearer of viridis' two ends
// (purple 0, yellow 1), white and grey as neither; one run per cell drawn.
static int colour_runs(const std::string& path) {
    int w, h, n;
    unsigned char* px = stbi_load(path.c_str(), &w, &h, &n, 3);
    if (!px) return -1;
    int runs = 0, last = -1;
    for (int x = 0; x < w; x++) {
        const unsigned char* p = px + 3 * ((size_t)(h / 2) * w + x);
        int spread = std::max({p[0], p[1], p[2]}) - std::min({p[0], p[1], p[2]});
        int kind = spread < 60 ? -1 : p[1] > 128 ? 1 : 0;  // white and grey are not a colour of the map
        if (kind >= 0 && kind != last) runs++;
        if (kind >= 0 || spread < 60) last = kind;
    }
    stbi_image_free(px);
    return runs;
}

// 288 columns (Hyper-Connections with 16 streams) in the default 800 units:
// cells of 2 units each, every one drawn (they were inset by a unit each
// side, and so left blank); and heatmap_size gives them 4 units each.
TEST(plot_heatmap_draws_every_narrow_cell) {
    std::vector<std::vector<double>> m(1, std::vector<double>(288));
    for (size_t c = 0; c < m[0].size(); c++) m[0][c] = c % 2;
    std::string path = "/tmp/lime_plot_heatmap_narrow.png";
    std::string err = plot_heatmap(path, "", "", "", m, {}, {});
    CHECK(err.empty(), "%s", err.c_str());
    int runs = colour_runs(path);
    CHECK(runs >= 288, "%d colour runs along the middle row of 288 alternating cells: cells left blank", runs);
    PlotSize fits = heatmap_size(1, 288);
    CHECK(fits.width >= 400 + 4 * 288, "heatmap_size(1, 288) is %d wide, want at least %d (400 + 4 a cell)", fits.width,
          400 + 4 * 288);
    CHECK(fits.height == 500, "heatmap_size(1, 288) is %d high, want 500", fits.height);
    CHECK((err = plot_heatmap(path, "", "", "", m, {}, {}, fits)).empty(), "%s", err.c_str());
    CHECK((runs = colour_runs(path)) >= 288, "%d colour runs at heatmap_size: cells left blank", runs);
}

// More columns than pixels: refused, and no file written (an empty-looking figure is never made).
TEST(plot_heatmap_refuses_cells_under_a_pixel) {
    std::vector<std::vector<double>> m(1, std::vector<double>(2000, 0.5));
    std::string path = "/tmp/lime_plot_heatmap_too_narrow.png";
    remove(path.c_str());
    std::string err = plot_heatmap(path, "", "", "", m, {}, {});
    CHECK(err.find("under a pixel") != std::string::npos, "2000 columns in 800 units were not refused: '%s'", err.c_str());
    FILE* f = fopen(path.c_str(), "rb");
    if (f) fclose(f);
    CHECK(!f, "the refused heatmap was written to %s", path.c_str());
}

// A write that fails for another reason than a missing folder says that
// reason's hint: here the file size limit (ulimit -f), as ENOSPC says "is the disk full?".
TEST(plot_write_error_names_its_cause) {
    struct rlimit keep;
    getrlimit(RLIMIT_FSIZE, &keep);
    struct rlimit small = keep;
    small.rlim_cur = 1000;  // bytes: a PNG is tens of kilobytes
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);  // the write fails with EFBIG, no signal
    setrlimit(RLIMIT_FSIZE, &small);
    std::string err = plot_lines("/tmp/lime_plot_fsize.png", "t", "x", "y", loss_curves());
    setrlimit(RLIMIT_FSIZE, &keep);
    signal(SIGXFSZ, old_handler);
    CHECK(err.find("ulimit -f") != std::string::npos, "EFBIG not named: '%s'", err.c_str());
    CHECK(err.find("does the folder exist") == std::string::npos, "a missing folder blamed: '%s'", err.c_str());
    err = plot_lines("/nonexistent_dir/x.png", "t", "x", "y", loss_curves());
    CHECK(err.find("does the directory exist?") != std::string::npos, "ENOENT's hint missing: '%s'", err.c_str());
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
