// support/lib/plot.h — PNG figures for the slides: line plots (with shaded bands), grouped
// bar charts (with error bars) and heatmaps. No dependencies beyond stb
// (stb_image_write for PNG, stb_easy_font for text), see plot.cpp.
//
// Every function returns "" on success, else one line naming the problem.
// Files are written atomically (a new PATH.tmp-XXXXXX, then renamed to PATH: write_file_atomic).
//
// Text is ASCII (other bytes show as '?'). Colours follow the Okabe-Ito
// palette (colour-blind safe) in series order: blue, vermillion, green,
// orange, purple, sky blue, black, yellow, then Paul Tol's wine and olive (10
// series before a colour repeats); heatmaps use viridis.
#pragma once
#include <string>
#include <vector>

// One line of a line plot. Points with a non-finite x or y (or y <= 0 on a
// log axis) break the line. lo/hi: optional band (e.g. min..max over seeds),
// empty or one value per point.
struct Series {
    std::string label;                 // legend entry ("" = not in the legend)
    std::vector<double> x, y, lo, hi;
    int colour = -1;                   // palette index (-1: the series' own place in the list)
    bool faint = false;                // thin and pale, no markers: e.g. each seed under its model's bold median
};

// One group of bars in a bar chart: one value per category, with optional
// error bars (empty, or one half-width per value, e.g. a std or a CI).
struct BarGroup {
    std::string label;
    std::vector<double> values, errors;
};

// Image size in layout units; scale multiplies the pixels (scale 2: the same
// figure at 1600 x 1000 pixels, for sharp slides).
struct PlotSize {
    int width = 800, height = 500;
    int scale = 1;
};

std::string plot_lines(const std::string& path, const std::string& title, const std::string& xlabel,
                       const std::string& ylabel, const std::vector<Series>& series, bool logy = false,
                       bool logx = false, const PlotSize& size = PlotSize());

// Bars per category, one bar per group side by side, from 0.
std::string plot_bars(const std::string& path, const std::string& title, const std::string& ylabel,
                      const std::vector<std::string>& categories, const std::vector<BarGroup>& groups,
                      const PlotSize& size = PlotSize());

// The size of a heatmap of rows x cols cells: the default 800 x 500 where the
// cells fit in it 4 units wide, else as much larger as gives them 4 (at most
// 8000 x 8000). plot_heatmap refuses a size whose cells would be under a pixel.
PlotSize heatmap_size(size_t rows, size_t cols);
// matrix[r][c] drawn with row 0 at the top; a NaN cell is left blank. Values
// are printed in the cells when they fit; the colour bar spans [min, max].
// A size whose cells would be under a pixel is refused (heatmap_size fits them).
std::string plot_heatmap(const std::string& path, const std::string& title, const std::string& xlabel,
                         const std::string& ylabel, const std::vector<std::vector<double>>& matrix,
                         const std::vector<std::string>& row_labels, const std::vector<std::string>& col_labels,
                         const PlotSize& size = PlotSize());
