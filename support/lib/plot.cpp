// support/lib/plot.cpp — a small PNG plotter (see support/lib/plot.h).
//
// Everything is drawn into a float RGB canvas through coverage masks: a shape
// first records, per pixel, how much of the pixel it covers (0..1; the max
// where its parts overlap), then the mask is blended once with the shape's
// colour and opacity. That gives antialiased lines and text, and translucent
// bands without darker seams. Layout is in "units" (800 x 500 by default);
// PlotSize::scale pixels per unit.
//
// Text comes from stb_easy_font, which describes each glyph (5 x 7 units) as
// axis-aligned rectangles; we scale and rasterise them.
#include "support/lib/plot.h"
#include "support/lib/cli.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>

// stb is third-party: silence its warnings, not ours.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STB_IMAGE_WRITE_STATIC
#include <stb/stb_image_write.h>
#include <stb/stb_easy_font.h>
#pragma GCC diagnostic pop

namespace {

// ---------------------------------------------------------------------------
// Colours.

struct Rgb { float r, g, b; };

Rgb hex(uint32_t h) { return {((h >> 16) & 255) / 255.f, ((h >> 8) & 255) / 255.f, (h & 255) / 255.f}; }

// Okabe & Ito (2008), ordered so the first two (the usual LLaMa vs LIMe pair) contrast most,
// then Tol's wine and olive: learning-speed's 10 models each their own (reviewers' 11th repeats blue).
Rgb palette(size_t i) {
    static const uint32_t colours[] = {0x0072B2, 0xD55E00, 0x009E73, 0xE69F00, 0xCC79A7,
                                       0x56B4E9, 0x000000, 0xF0E442, 0x882255, 0x999933};
    return hex(colours[i % (sizeof colours / sizeof colours[0])]);
}

const Rgb WHITE = hex(0xFFFFFF), GRID = hex(0xE6E6E6), AXIS = hex(0x444444), TEXT = hex(0x222222),
          MUTED = hex(0x555555), BLANK = hex(0xF2F2F2);

// viridis (matplotlib) at t = 0, 0.1, ..., 1, linearly interpolated.
Rgb viridis(double t) {
    static const uint32_t stops[] = {0x440154, 0x482475, 0x414487, 0x355F8D, 0x2A788E, 0x21918C,
                                     0x22A884, 0x44BF70, 0x7AD151, 0xBDDF26, 0xFDE725};
    t = std::min(1.0, std::max(0.0, t)) * 10;
    int i = std::min(9, (int)t);
    float f = (float)(t - i);
    Rgb a = hex(stops[i]), b = hex(stops[i + 1]);
    return {a.r + f * (b.r - a.r), a.g + f * (b.g - a.g), a.b + f * (b.b - a.b)};
}

float luminance(Rgb c) { return 0.2126f * c.r + 0.7152f * c.g + 0.0722f * c.b; }

// ---------------------------------------------------------------------------
// Canvas and coverage masks.

struct Canvas {
    int w, h;                 // pixels
    double s;                 // pixels per layout unit
    std::vector<float> px;    // w * h * 3
    Canvas(int units_w, int units_h, int scale)
        : w(units_w * scale), h(units_h * scale), s(scale), px((size_t)w * h * 3, 1.0f) {}
    void blend(int x, int y, Rgb c, float a) {
        float* p = &px[((size_t)y * w + x) * 3];
        p[0] += a * (c.r - p[0]);
        p[1] += a * (c.g - p[1]);
        p[2] += a * (c.b - p[2]);
    }
};

struct Box { double x0, y0, x1, y1; };   // layout units, x0 < x1, y0 < y1

// Coverage over a pixel rectangle (bounding box of the shape, clipped).
struct Mask {
    int x0, y0, x1, y1;       // pixels, [x0, x1) x [y0, y1)
    std::vector<float> a;
    double s;
    Mask(const Canvas& cv, Box b, const Box* clip = nullptr) : s(cv.s) {
        if (clip) b = {std::max(b.x0, clip->x0), std::max(b.y0, clip->y0), std::min(b.x1, clip->x1), std::min(b.y1, clip->y1)};
        x0 = std::max(0, (int)std::floor(b.x0 * s));
        y0 = std::max(0, (int)std::floor(b.y0 * s));
        x1 = std::min(cv.w, (int)std::ceil(b.x1 * s));
        y1 = std::min(cv.h, (int)std::ceil(b.y1 * s));
        if (x1 < x0) x1 = x0;
        if (y1 < y0) y1 = y0;
        a.assign((size_t)(x1 - x0) * (y1 - y0), 0.f);
    }
    void cover(int x, int y, float c) {
        if (x < x0 || x >= x1 || y < y0 || y >= y1 || c <= 0) return;
        float& m = a[(size_t)(y - y0) * (x1 - x0) + (x - x0)];
        m = std::max(m, std::min(c, 1.f));
    }
    // An axis-aligned rectangle in layout units, with fractional edge coverage.
    void rect(Box b) {
        double X0 = b.x0 * s, X1 = b.x1 * s, Y0 = b.y0 * s, Y1 = b.y1 * s;
        for (int y = std::max(y0, (int)std::floor(Y0)); y < std::min(y1, (int)std::ceil(Y1)); y++) {
            double cy = std::min(Y1, y + 1.0) - std::max(Y0, (double)y);
            for (int x = std::max(x0, (int)std::floor(X0)); x < std::min(x1, (int)std::ceil(X1)); x++)
                cover(x, y, (float)(cy * (std::min(X1, x + 1.0) - std::max(X0, (double)x))));
        }
    }
    // A segment of the given width with round ends: coverage falls off over one
    // pixel around the edge (distance from the pixel centre to the segment).
    void segment(double ax, double ay, double bx, double by, double width) {
        ax *= s, ay *= s, bx *= s, by *= s;
        double r = width * s / 2, dx = bx - ax, dy = by - ay, len2 = dx * dx + dy * dy;
        int xa = std::max(x0, (int)std::floor(std::min(ax, bx) - r - 1)), xb = std::min(x1, (int)std::ceil(std::max(ax, bx) + r + 1));
        int ya = std::max(y0, (int)std::floor(std::min(ay, by) - r - 1)), yb = std::min(y1, (int)std::ceil(std::max(ay, by) + r + 1));
        for (int y = ya; y < yb; y++)
            for (int x = xa; x < xb; x++) {
                double px = x + 0.5 - ax, py = y + 0.5 - ay;
                double t = len2 > 0 ? std::min(1.0, std::max(0.0, (px * dx + py * dy) / len2)) : 0;
                double d = std::hypot(px - t * dx, py - t * dy);
                cover(x, y, (float)(r + 0.5 - d));
            }
    }
    void paint(Canvas& cv, Rgb c, float alpha = 1) const {
        for (int y = y0; y < y1; y++)
            for (int x = x0; x < x1; x++) {
                float m = a[(size_t)(y - y0) * (x1 - x0) + (x - x0)];
                if (m > 0) cv.blend(x, y, c, alpha * m);
            }
    }
};

void fill_rect(Canvas& cv, Box b, Rgb c, float alpha = 1) {
    Mask m(cv, b);
    m.rect(b);
    m.paint(cv, c, alpha);
}

// A one-unit line just outside b.
void outline(Canvas& cv, Box b, Rgb c) {
    fill_rect(cv, {b.x0 - 1, b.y0 - 1, b.x1 + 1, b.y0}, c);
    fill_rect(cv, {b.x0 - 1, b.y1, b.x1 + 1, b.y1 + 1}, c);
    fill_rect(cv, {b.x0 - 1, b.y0, b.x0, b.y1}, c);
    fill_rect(cv, {b.x1, b.y0, b.x1 + 1, b.y1}, c);
}

struct Pt { double x, y; };

void polyline(Canvas& cv, const std::vector<Pt>& p, double width, Rgb c, const Box* clip) {
    if (p.empty()) return;
    Box b = {p[0].x, p[0].y, p[0].x, p[0].y};
    for (auto& q : p) b = {std::min(b.x0, q.x), std::min(b.y0, q.y), std::max(b.x1, q.x), std::max(b.y1, q.y)};
    double pad = width + 2;
    Mask m(cv, {b.x0 - pad, b.y0 - pad, b.x1 + pad, b.y1 + pad}, clip);
    for (size_t i = 0; i + 1 < p.size(); i++) m.segment(p[i].x, p[i].y, p[i + 1].x, p[i + 1].y, width);
    if (p.size() == 1) m.segment(p[0].x, p[0].y, p[0].x, p[0].y, width);
    m.paint(cv, c);
}

// A translucent band between lo[i] and hi[i] at x[i], filled column by column
// (x increasing), interpolating linearly between points.
void band(Canvas& cv, const std::vector<Pt>& lo, const std::vector<Pt>& hi, Rgb c, float alpha, const Box* clip) {
    if (lo.size() < 2) return;
    Box b = {lo[0].x, 1e300, lo.back().x, -1e300};
    for (size_t i = 0; i < lo.size(); i++) b = {b.x0, std::min({b.y0, lo[i].y, hi[i].y}), b.x1, std::max({b.y1, lo[i].y, hi[i].y})};
    Mask m(cv, b, clip);
    double step = 1 / cv.s;   // one pixel column in layout units
    for (size_t i = 0; i + 1 < lo.size(); i++) {
        double xa = lo[i].x, xb = lo[i + 1].x;
        for (double x = std::floor(xa * cv.s) / cv.s; x < xb; x += step) {
            double cx0 = std::max(x, xa), cx1 = std::min(x + step, xb);   // the part of this column inside the segment
            if (cx1 <= cx0) continue;
            double t = xb > xa ? ((cx0 + cx1) / 2 - xa) / (xb - xa) : 0;
            double y0 = lo[i].y + t * (lo[i + 1].y - lo[i].y), y1 = hi[i].y + t * (hi[i + 1].y - hi[i].y);
            m.rect({cx0, std::min(y0, y1), cx1, std::max(y0, y1)});
        }
    }
    m.paint(cv, c, alpha);
}

void disc(Canvas& cv, Pt p, double radius, Rgb c, const Box* clip) {
    Mask m(cv, {p.x - radius - 2, p.y - radius - 2, p.x + radius + 2, p.y + radius + 2}, clip);
    m.segment(p.x, p.y, p.x, p.y, 2 * radius);
    m.paint(cv, c);
}

// ---------------------------------------------------------------------------
// Text.

enum Align { START, MIDDLE, END };
const double CAP = 7;    // cap height of stb_easy_font, in font units
const double FONT = 2;   // font units per layout unit for ordinary text

// stb_easy_font indexes a table by (char - 32): keep to printable ASCII.
std::string ascii(const std::string& s) {
    std::string t = s;
    for (char& c : t)
        if (c < 32 || c > 126) c = '?';
    return t;
}

// Width of the ink, in layout units (stb's width includes the space after the last glyph).
double text_width(const std::string& s, double size) {
    if (s.empty()) return 0;
    std::string t = ascii(s);
    return (stb_easy_font_width(&t[0]) - 1) * size;
}

// Draws one line of text. (x, y) is the anchor: ha/va choose which point of
// the text's box (ink width x cap height) it is. vertical: rotated to read
// bottom to top. bold: each stroke widened by a quarter of a font unit.
void text(Canvas& cv, double x, double y, const std::string& str, double size, Rgb c, Align ha, Align va,
          bool vertical = false, bool bold = false) {
    if (str.empty()) return;
    std::string t = ascii(str);
    double w = text_width(t, 1), ox = ha == START ? 0 : ha == MIDDLE ? w / 2 : w;
    double oy = va == START ? 0 : va == MIDDLE ? CAP / 2 : CAP;
    // the glyphs' origin, snapped to the pixel grid so that strokes stay crisp
    double gx = vertical ? x - oy * size : x - ox * size;
    double gy = vertical ? y + ox * size : y - oy * size;
    gx = std::round(gx * cv.s) / cv.s;
    gy = std::round(gy * cv.s) / cv.s;
    double extent = (w + CAP + 4) * size;
    Mask m(cv, {gx - extent, gy - extent, gx + extent, gy + extent});
    char buf[4096];
    double pen = 0;   // font units along the text
    for (char ch : t) {
        char one[2] = {ch, 0};
        int quads = stb_easy_font_print((float)pen, 0, one, nullptr, buf, (int)sizeof buf);
        for (int q = 0; q < quads; q++) {
            const float* v = (const float*)(buf + 64 * q);   // 4 vertices of 16 bytes: x, y, z, rgba
            double u0 = v[0], u1 = v[0], w0 = v[1], w1 = v[1];
            for (int k = 1; k < 4; k++) {
                u0 = std::min(u0, (double)v[4 * k]), u1 = std::max(u1, (double)v[4 * k]);
                w0 = std::min(w0, (double)v[4 * k + 1]), w1 = std::max(w1, (double)v[4 * k + 1]);
            }
            // stb's zero is slashed; small, the slash makes it read as "C" or "E": drop it
            if (ch == '0' && u0 >= pen + 1 && u1 <= pen + 3 && w0 >= 1 && w1 <= 6) continue;
            if (bold) u1 += 0.25;
            if (!vertical) m.rect({gx + u0 * size, gy + w0 * size, gx + u1 * size, gy + w1 * size});
            else m.rect({gx + w0 * size, gy - u1 * size, gx + w1 * size, gy - u0 * size});
        }
        pen += stb_easy_font_charinfo[ch - 32].advance & 15;
    }
    m.paint(cv, c);
}

// The title: bold, as large as fits (3 font units per layout unit at most).
void title_text(Canvas& cv, double cx, double y, double max_width, const std::string& title) {
    double size = 3;   // whole font units stay crisp; a long title shrinks
    while (size > 1.5 && text_width(title, size) > max_width) size -= size > 2.5 ? 0.5 : 0.25;
    text(cv, cx, y, title, size, TEXT, MIDDLE, START, false, true);
}

// ---------------------------------------------------------------------------
// Axes: ticks at 1-2-5 steps (or powers of 10), and the map data -> layout.

// A tick label: plain decimals for ordinary numbers, "2.5e15" style for huge or tiny.
std::string tick_label(double v, double step) {
    char buf[64];
    double a = std::fabs(v);
    if (a < step * 1e-9) return "0";
    if (a >= 1e5 || a < 1e-3) {
        int e = (int)std::floor(std::log10(a) + 1e-9);
        double mant = v / std::pow(10.0, e);
        snprintf(buf, sizeof buf, "%.3ge%d", mant, e);
        return buf;
    }
    int decimals = std::max(0, (int)-std::floor(std::log10(step) + 1e-9));
    snprintf(buf, sizeof buf, "%.*f", decimals, v);
    return buf;
}

// 1, 2 or 5 times a power of ten, about range / target.
double nice_step(double range, int target) {
    double raw = range / target, p = std::pow(10.0, std::floor(std::log10(raw)));
    for (double m : {1.0, 2.0, 5.0})
        if (m * p >= raw * 0.999) return m * p;
    return 10 * p;
}

struct Axis {
    bool log = false;
    double lo = 0, hi = 1;        // range of the (log10 of the) values
    double p0 = 0, p1 = 1;        // layout coordinates of lo and hi
    std::vector<double> ticks;    // values
    std::vector<std::string> labels;
    double map(double v) const {
        double t = log ? std::log10(v) : v;
        return p0 + (t - lo) / (hi - lo) * (p1 - p0);
    }
    bool valid(double v) const { return std::isfinite(v) && (!log || v > 0); }
};

// Linear axis over [dmin, dmax], widened to whole steps.
Axis linear_axis(double dmin, double dmax, int target) {
    Axis a;
    if (dmax <= dmin) {   // a single value: centre it
        double pad = dmin == 0 ? 1 : std::fabs(dmin) * 0.1;
        dmin -= pad, dmax += pad;
    }
    double step = nice_step(dmax - dmin, target);
    a.lo = std::floor(dmin / step + 1e-9) * step;
    a.hi = std::ceil(dmax / step - 1e-9) * step;
    for (double t = a.lo; t <= a.hi + step * 1e-6; t += step) {
        a.ticks.push_back(std::fabs(t) < step * 1e-9 ? 0 : t);
        a.labels.push_back(tick_label(a.ticks.back(), step));
    }
    return a;
}

// Log axis over whole decades; 2 and 5 ticks too when it spans at most two.
Axis log_axis(double dmin, double dmax) {
    Axis a;
    a.log = true;
    a.lo = std::floor(std::log10(dmin) + 1e-9);
    a.hi = std::ceil(std::log10(dmax) - 1e-9);
    if (a.hi <= a.lo) a.hi = a.lo + 1;
    int every = std::max(1, (int)std::ceil((a.hi - a.lo) / 8));
    for (int e = (int)a.lo; e <= (int)a.hi; e++) {
        for (double m : {1.0, 2.0, 5.0}) {
            double v = m * std::pow(10.0, e);
            if (m > 1 && (a.hi - a.lo > 2 || std::log10(v) > a.hi)) continue;
            if (m == 1 && (e - (int)a.lo) % every) continue;
            a.ticks.push_back(v);
            a.labels.push_back(tick_label(v, v));
        }
    }
    return a;
}

double widest(const std::vector<std::string>& labels, double size) {
    double w = 0;
    for (auto& l : labels) w = std::max(w, text_width(l, size));
    return w;
}

// Frame of a plot with axes: the plot area, from the margins text needs.
struct Frame {
    Box area;
    double width, height;   // of the whole image, layout units
};

// right: the margin right of the area; top_extra: room above it (bar labels).
Frame frame_for(const PlotSize& size, bool has_title, bool has_xlabel, bool has_ylabel, double ytick_width,
                double right = 24, double top_extra = 0) {
    Frame f;
    f.width = size.width, f.height = size.height;
    double left = 16 + (has_ylabel ? CAP * FONT + 14 : 0) + ytick_width + 12;
    double top = (has_title ? 24 + CAP * 3 + 22 : 20) + top_extra;
    double bottom = 12 + CAP * FONT + 12 + (has_xlabel ? CAP * FONT + 14 : 0) + 8;
    f.area = {left, top, f.width - right, f.height - bottom};
    return f;
}

// Grid lines, axes, ticks, tick labels and axis labels. Horizontal grid lines
// for y; vertical ones for x when grid_x.
void draw_grid(Canvas& cv, const Frame& f, const Axis* x, const Axis& y, bool grid_x) {
    const Box& a = f.area;
    for (double t : y.ticks) {
        double py = y.map(t);
        fill_rect(cv, {a.x0, py - 0.5, a.x1, py + 0.5}, GRID);
    }
    if (x && grid_x)
        for (double t : x->ticks) {
            double px = x->map(t);
            fill_rect(cv, {px - 0.5, a.y0, px + 0.5, a.y1}, GRID);
        }
}

void draw_axes(Canvas& cv, const Frame& f, const Axis* x, const Axis& y, const std::string& xlabel, const std::string& ylabel) {
    const Box& a = f.area;
    fill_rect(cv, {a.x0 - 0.75, a.y0, a.x0 + 0.75, a.y1 + 0.75}, AXIS);   // y axis
    fill_rect(cv, {a.x0 - 0.75, a.y1 - 0.75, a.x1, a.y1 + 0.75}, AXIS);   // x axis
    for (size_t i = 0; i < y.ticks.size(); i++) {
        double py = y.map(y.ticks[i]);
        fill_rect(cv, {a.x0 - 6, py - 0.75, a.x0, py + 0.75}, AXIS);
        text(cv, a.x0 - 10, py, y.labels[i], FONT, MUTED, END, MIDDLE);
    }
    if (x)
        for (size_t i = 0; i < x->ticks.size(); i++) {
            double px = x->map(x->ticks[i]);
            fill_rect(cv, {px - 0.75, a.y1, px + 0.75, a.y1 + 6}, AXIS);
            text(cv, px, a.y1 + 12, x->labels[i], FONT, MUTED, MIDDLE, START);
        }
    text(cv, (a.x0 + a.x1) / 2, a.y1 + 12 + CAP * FONT + 14, xlabel, FONT, TEXT, MIDDLE, START);
    text(cv, 16, (a.y0 + a.y1) / 2, ylabel, FONT, TEXT, MIDDLE, START, true);
}

// ---------------------------------------------------------------------------
// Legend: placed in the corner of the plot area where the least is drawn.

struct LegendEntry { std::string label; Rgb colour; bool line; };

double ink(const Canvas& cv, Box b) {   // how much is drawn in b: summed distance from white
    double sum = 0;
    for (int y = std::max(0, (int)(b.y0 * cv.s)); y < std::min(cv.h, (int)(b.y1 * cv.s)); y++)
        for (int x = std::max(0, (int)(b.x0 * cv.s)); x < std::min(cv.w, (int)(b.x1 * cv.s)); x++) {
            const float* p = &cv.px[((size_t)y * cv.w + x) * 3];
            double d = 3 - p[0] - p[1] - p[2];
            if (d > 0.3) sum += d;   // grid lines stay below this
        }
    return sum;
}

void legend(Canvas& cv, const Frame& f, const std::vector<LegendEntry>& entries) {
    std::vector<LegendEntry> shown;
    for (auto& e : entries)
        if (!e.label.empty()) shown.push_back(e);
    if (shown.empty()) return;
    const double pad = 10, row = 24, swatch = 26;
    double w = 0;
    for (auto& e : shown) w = std::max(w, text_width(e.label, FONT));
    w += 2 * pad + swatch + 10;
    double h = 2 * pad + row * (double)shown.size() - (row - CAP * FONT);
    const Box& a = f.area;
    double inset = 10;
    Box corners[4] = {{a.x1 - inset - w, a.y0 + inset, a.x1 - inset, a.y0 + inset + h},
                      {a.x0 + inset, a.y0 + inset, a.x0 + inset + w, a.y0 + inset + h},
                      {a.x1 - inset - w, a.y1 - inset - h, a.x1 - inset, a.y1 - inset},
                      {a.x0 + inset, a.y1 - inset - h, a.x0 + inset + w, a.y1 - inset}};
    Box best = corners[0];
    double least = ink(cv, best);
    for (int i = 1; i < 4; i++) {
        double v = ink(cv, corners[i]);
        if (v < least * 0.9) least = v, best = corners[i];   // prefer earlier corners when close
    }
    fill_rect(cv, best, WHITE, 0.88f);
    outline(cv, best, hex(0xCCCCCC));
    for (size_t i = 0; i < shown.size(); i++) {
        double cy = best.y0 + pad + CAP * FONT / 2 + row * (double)i, sx = best.x0 + pad;
        if (shown[i].line) polyline(cv, {{sx, cy}, {sx + swatch, cy}}, 3, shown[i].colour, nullptr);
        else fill_rect(cv, {sx + 4, cy - 7, sx + swatch - 4, cy + 7}, shown[i].colour);
        text(cv, sx + swatch + 10, cy, shown[i].label, FONT, TEXT, START, MIDDLE);
    }
}

// ---------------------------------------------------------------------------
// Output.

std::string check_size(const PlotSize& s) {
    if (s.width < 200 || s.width > 8000 || s.height < 150 || s.height > 8000 || s.scale < 1 || s.scale > 8)
        return "plot size " + std::to_string(s.width) + "x" + std::to_string(s.height) + " scale " +
               std::to_string(s.scale) + ": need width 200..8000, height 150..8000, scale 1..8";
    return "";
}

// PNG, encoded in memory, then written to a new PATH.tmp-XXXXXX and renamed
// (write_file_atomic), so a reader never sees half a file and a symlink
// planted at either name is never followed.
static void append_bytes(void* context, void* data, int size) {
    ((std::string*)context)->append((const char*)data, (size_t)size);
}
std::string save_png(const Canvas& cv, const std::string& path) {
    std::vector<unsigned char> rgb(cv.px.size());
    for (size_t i = 0; i < rgb.size(); i++) rgb[i] = (unsigned char)std::lround(std::min(1.f, std::max(0.f, cv.px[i])) * 255);
    std::string png;
    if (!stbi_write_png_to_func(append_bytes, &png, cv.w, cv.h, 3, rgb.data(), cv.w * 3))
        return "cannot encode '" + path + "' as PNG";
    return write_file_atomic(path, png);  // its error ends in the errno's own hint (errno_hint)
}

// ---------------------------------------------------------------------------
// Line plots.

std::string check_series(const std::vector<Series>& series, bool logx, bool logy, double* xr, double* yr) {
    if (series.empty()) return "plot_lines: no series to plot";
    xr[0] = yr[0] = INFINITY, xr[1] = yr[1] = -INFINITY;
    for (auto& s : series) {
        std::string name = "series '" + s.label + "'";
        if (s.x.size() != s.y.size())
            return name + ": x has " + std::to_string(s.x.size()) + " values, y " + std::to_string(s.y.size());
        if ((!s.lo.empty() && s.lo.size() != s.y.size()) || (!s.hi.empty() && s.hi.size() != s.y.size()) || s.lo.empty() != s.hi.empty())
            return name + ": lo and hi need one value per point each (or both empty)";
        for (size_t i = 0; i < s.x.size(); i++) {
            if (!std::isfinite(s.x[i]) || (logx && s.x[i] <= 0)) continue;
            xr[0] = std::min(xr[0], s.x[i]), xr[1] = std::max(xr[1], s.x[i]);
            for (double v : {s.y[i], s.lo.empty() ? NAN : s.lo[i], s.hi.empty() ? NAN : s.hi[i]})
                if (std::isfinite(v) && (!logy || v > 0)) yr[0] = std::min(yr[0], v), yr[1] = std::max(yr[1], v);
        }
    }
    if (!(xr[0] <= xr[1]) || !(yr[0] <= yr[1]))
        return std::string("plot_lines: no finite points to plot") + (logx || logy ? " (a log axis needs values > 0)" : "");
    return "";
}

// The runs of consecutive drawable points of a series, in layout coordinates.
std::vector<std::vector<Pt>> runs(const std::vector<double>& xs, const std::vector<double>& ys, const Axis& x, const Axis& y) {
    std::vector<std::vector<Pt>> out(1);
    for (size_t i = 0; i < xs.size(); i++) {
        if (x.valid(xs[i]) && y.valid(ys[i])) out.back().push_back({x.map(xs[i]), y.map(ys[i])});
        else if (!out.back().empty()) out.emplace_back();
    }
    return out;
}

}  // namespace

// ---------------------------------------------------------------------------

std::string plot_lines(const std::string& path, const std::string& title, const std::string& xlabel,
                       const std::string& ylabel, const std::vector<Series>& series, bool logy, bool logx,
                       const PlotSize& size) {
    std::string err = check_size(size);
    double xr[2] = {0, 0}, yr[2] = {0, 0};
    if (err.empty()) err = check_series(series, logx, logy, xr, yr);
    if (!err.empty()) return err;
    Axis x = logx ? log_axis(xr[0], xr[1]) : linear_axis(xr[0], xr[1], 7);
    Axis y = logy ? log_axis(yr[0], yr[1]) : linear_axis(yr[0], yr[1], 6);
    // room on the right for half of the last x tick label
    double right = std::max(24.0, text_width(x.labels.back(), FONT) / 2 + 10);
    Frame f = frame_for(size, !title.empty(), !xlabel.empty(), !ylabel.empty(), widest(y.labels, FONT), right);
    x.p0 = f.area.x0, x.p1 = f.area.x1, y.p0 = f.area.y1, y.p1 = f.area.y0;

    Canvas cv(size.width, size.height, size.scale);
    Box clip = {f.area.x0, f.area.y0 - 4, f.area.x1 + 4, f.area.y1};   // let lines at the top/right edge show whole
    draw_grid(cv, f, &x, y, true);
    auto colour = [&](size_t i) { return palette(series[i].colour >= 0 ? (size_t)series[i].colour : i); };
    for (size_t i = 0; i < series.size(); i++) {   // bands under every line
        const Series& s = series[i];
        if (s.lo.empty()) continue;
        std::vector<std::vector<Pt>> lo = runs(s.x, s.lo, x, y), hi = runs(s.x, s.hi, x, y);
        for (size_t r = 0; r < lo.size() && r < hi.size(); r++)
            if (lo[r].size() == hi[r].size()) band(cv, lo[r], hi[r], colour(i), 0.2f, &clip);
    }
    std::vector<LegendEntry> entries;
    for (size_t i = 0; i < series.size(); i++) {
        const Series& s = series[i];
        Rgb c = colour(i);
        if (s.faint) c = {0.35f * c.r + 0.65f, 0.35f * c.g + 0.65f, 0.35f * c.b + 0.65f};  // 65% of the way to white
        size_t points = 0;
        for (auto& run : runs(s.x, s.y, x, y)) {
            polyline(cv, run, s.faint ? 1.0 : 2.5, c, &clip);
            points += run.size();
        }
        if (points <= 30 && !s.faint)   // markers where points are few enough to be told apart
            for (auto& run : runs(s.x, s.y, x, y))
                for (auto& p : run) disc(cv, p, 3.5, c, &clip);
        entries.push_back({s.label, c, true});
    }
    draw_axes(cv, f, &x, y, xlabel, ylabel);
    title_text(cv, f.width / 2, 24, f.width - 40, title);
    legend(cv, f, entries);
    return save_png(cv, path);
}

std::string plot_bars(const std::string& path, const std::string& title, const std::string& ylabel,
                      const std::vector<std::string>& categories, const std::vector<BarGroup>& groups,
                      const PlotSize& size) {
    std::string err = check_size(size);
    if (!err.empty()) return err;
    if (categories.empty() || groups.empty()) return "plot_bars: need at least one category and one group";
    double lo = 0, hi = 0;   // bars start at 0
    for (auto& g : groups) {
        if (g.values.size() != categories.size())
            return "plot_bars: group '" + g.label + "' has " + std::to_string(g.values.size()) + " values for " +
                   std::to_string(categories.size()) + " categories";
        if (!g.errors.empty() && g.errors.size() != g.values.size())
            return "plot_bars: group '" + g.label + "': errors need one value per bar (or none)";
        for (size_t i = 0; i < g.values.size(); i++) {
            double v = g.values[i], e = g.errors.empty() || !std::isfinite(g.errors[i]) ? 0 : std::fabs(g.errors[i]);
            if (!std::isfinite(v)) continue;
            lo = std::min(lo, v - e), hi = std::max(hi, v + e);
        }
    }
    if (hi == lo) hi = 1;
    Axis y = linear_axis(lo, hi, 6);
    bool legend_needed = groups.size() > 1 || !groups[0].label.empty();
    // value labels may rise above the area (a 0..100 axis stays 0..100): room for them under the title
    Frame f = frame_for(size, !title.empty(), false, !ylabel.empty(), widest(y.labels, FONT), 24, CAP * FONT + 8);
    y.p0 = f.area.y1, y.p1 = f.area.y0;

    Canvas cv(size.width, size.height, size.scale);
    draw_grid(cv, f, nullptr, y, false);
    double slot = (f.area.x1 - f.area.x0) / (double)categories.size();
    double bar = slot * 0.78 / (double)groups.size(), gap = std::min(4.0, bar * 0.1);
    std::vector<LegendEntry> entries;
    for (size_t g = 0; g < groups.size(); g++) {
        for (size_t c = 0; c < categories.size(); c++) {
            double v = groups[g].values[c];
            if (!std::isfinite(v)) continue;
            double x0 = f.area.x0 + slot * ((double)c + 0.11) + bar * (double)g, cx = x0 + bar / 2;
            double top = y.map(std::max(v, 0.0)), bottom = y.map(std::min(v, 0.0));
            fill_rect(cv, {x0 + gap / 2, top, x0 + bar - gap / 2, bottom}, palette(g));
            double e = groups[g].errors.empty() ? 0 : groups[g].errors[c], label_y = top;
            if (std::isfinite(e) && e != 0) {   // error bar with caps
                e = std::fabs(e);
                double ya = y.map(v + e), yb = y.map(v - e), cap = std::min(8.0, bar * 0.25);
                polyline(cv, {{cx, ya}, {cx, yb}}, 1.5, AXIS, nullptr);
                polyline(cv, {{cx - cap, ya}, {cx + cap, ya}}, 1.5, AXIS, nullptr);
                polyline(cv, {{cx - cap, yb}, {cx + cap, yb}}, 1.5, AXIS, nullptr);
                label_y = std::min(label_y, ya);
            }
            std::string label = tick_label(v, std::fabs(v) >= 100 ? 1 : std::fabs(v) >= 10 ? 0.1 : 0.01);
            if (text_width(label, FONT) <= bar - 2)
                text(cv, cx, label_y - 6, label, FONT, TEXT, MIDDLE, END);
        }
        entries.push_back({groups[g].label, palette(g), false});
    }
    draw_axes(cv, f, nullptr, y, "", ylabel);
    for (size_t c = 0; c < categories.size(); c++)
        text(cv, f.area.x0 + slot * ((double)c + 0.5), f.area.y1 + 12, categories[c], FONT, TEXT, MIDDLE, START);
    title_text(cv, f.width / 2, 24, f.width - 40, title);
    if (legend_needed) legend(cv, f, entries);
    return save_png(cv, path);
}

PlotSize heatmap_size(size_t rows, size_t cols) {
    PlotSize s;
    s.width = (int)std::min<size_t>(8000, std::max<size_t>(s.width, 400 + 4 * cols));
    s.height = (int)std::min<size_t>(8000, std::max<size_t>(s.height, 300 + 4 * rows));
    return s;
}

std::string plot_heatmap(const std::string& path, const std::string& title, const std::string& xlabel,
                         const std::string& ylabel, const std::vector<std::vector<double>>& matrix,
                         const std::vector<std::string>& row_labels, const std::vector<std::string>& col_labels,
                         const PlotSize& size) {
    std::string err = check_size(size);
    if (!err.empty()) return err;
    size_t rows = matrix.size(), cols = rows ? matrix[0].size() : 0;
    if (rows == 0 || cols == 0) return "plot_heatmap: the matrix is empty";
    double vmin = INFINITY, vmax = -INFINITY;
    for (size_t r = 0; r < rows; r++) {
        if (matrix[r].size() != cols)
            return "plot_heatmap: row " + std::to_string(r) + " has " + std::to_string(matrix[r].size()) + " values, row 0 has " + std::to_string(cols);
        for (double v : matrix[r])
            if (std::isfinite(v)) vmin = std::min(vmin, v), vmax = std::max(vmax, v);
    }
    if (!(vmin <= vmax)) return "plot_heatmap: no finite values";
    if ((!row_labels.empty() && row_labels.size() != rows) || (!col_labels.empty() && col_labels.size() != cols))
        return "plot_heatmap: need one label per row and per column (or none)";
    if (vmax == vmin) vmax = vmin + 1;

    Axis bar = linear_axis(vmin, vmax, 5);   // colour bar ticks: keep those inside [vmin, vmax]
    std::vector<double> ticks;
    std::vector<std::string> labels;
    for (size_t i = 0; i < bar.ticks.size(); i++)
        if (bar.ticks[i] >= vmin - 1e-12 && bar.ticks[i] <= vmax + 1e-12) ticks.push_back(bar.ticks[i]), labels.push_back(bar.labels[i]);
    const double bar_w = 18;
    double right = 20 + bar_w + 9 + widest(labels, FONT) + 20;
    Frame f = frame_for(size, !title.empty(), !xlabel.empty(), !ylabel.empty(), widest(row_labels, FONT), right);
    const Box& a = f.area;
    double cw = (a.x1 - a.x0) / (double)cols, ch = (a.y1 - a.y0) / (double)rows;
    // every cell at least a pixel each way, else some would not be drawn at all:
    // refused, never a figure that looks empty (heatmap_size gives a size that fits)
    if (cw * size.scale < 1 || ch * size.scale < 1)
        return strf("plot_heatmap: %zu columns and %zu rows do not fit %dx%d: a cell would be under a pixel; "
                    "use a larger PlotSize (heatmap_size)", cols, rows, size.width, size.height);
    // a cell is inset by 1 unit each side (a white grid between cells) only where that leaves it 2 units
    double inset_x = cw >= 4 ? 1 : 0, inset_y = ch >= 4 ? 1 : 0;

    Canvas cv(size.width, size.height, size.scale);
    double maxabs = std::max(std::fabs(vmin), std::fabs(vmax));
    // two significant digits of the largest value; weights in [0, 1] get two decimals ("0.12", "1.00")
    int decimals = maxabs <= 1 ? 2 : std::min(3, std::max(0, 1 - (int)std::floor(std::log10(maxabs))));
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) {
            Box cell = {a.x0 + cw * (double)c + inset_x, a.y0 + ch * (double)r + inset_y,
                        a.x0 + cw * (double)(c + 1) - inset_x, a.y0 + ch * (double)(r + 1) - inset_y};
            double v = matrix[r][c];
            if (!std::isfinite(v)) { fill_rect(cv, cell, BLANK); continue; }
            Rgb colour = viridis((v - vmin) / (vmax - vmin));
            fill_rect(cv, cell, colour);
            char buf[32];
            snprintf(buf, sizeof buf, "%.*f", decimals, v);
            if (text_width(buf, FONT) <= cw - 8 && ch >= CAP * FONT + 6)
                text(cv, (cell.x0 + cell.x1) / 2, (cell.y0 + cell.y1) / 2, buf, FONT,
                     luminance(colour) < 0.45f ? WHITE : TEXT, MIDDLE, MIDDLE);
        }
    for (size_t r = 0; r < row_labels.size(); r++)
        text(cv, a.x0 - 10, a.y0 + ch * ((double)r + 0.5), row_labels[r], FONT, MUTED, END, MIDDLE);
    for (size_t c = 0; c < col_labels.size(); c++)
        text(cv, a.x0 + cw * ((double)c + 0.5), a.y1 + 12, col_labels[c], FONT, MUTED, MIDDLE, START);
    text(cv, (a.x0 + a.x1) / 2, a.y1 + 12 + CAP * FONT + 14, xlabel, FONT, TEXT, MIDDLE, START);
    text(cv, 16, (a.y0 + a.y1) / 2, ylabel, FONT, TEXT, MIDDLE, START, true);

    // colour bar: one thin rectangle per layout unit of height
    double bx = a.x1 + 20;
    for (double yy = a.y0; yy < a.y1; yy += 1)
        fill_rect(cv, {bx, yy, bx + bar_w, std::min(yy + 1, a.y1)}, viridis((a.y1 - yy - 0.5) / (a.y1 - a.y0)));
    for (size_t i = 0; i < ticks.size(); i++) {
        double py = a.y1 - (ticks[i] - vmin) / (vmax - vmin) * (a.y1 - a.y0);
        fill_rect(cv, {bx + bar_w, py - 0.75, bx + bar_w + 5, py + 0.75}, AXIS);
        text(cv, bx + bar_w + 9, py, labels[i], FONT, MUTED, START, MIDDLE);
    }
    title_text(cv, f.width / 2, 24, f.width - 40, title);
    return save_png(cv, path);
}
