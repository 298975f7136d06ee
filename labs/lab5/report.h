// labs/lab5/report.h — lab 5's grader: the student's answers against their
// own experiment, read as data and never run: RUN/report.md's Accuracy and
// Cost tables (written by ./lime compare) and the router heatmap that
// ./lime analyze printed for the seed-1 LIMe model. labs/lab5/check.cpp is
// the program around it; tests/fuzz_lab5.cpp feeds it any bytes.
//
// Every field is parsed as the exact form it must have (a number is digits
// and at most one point, a count is digits) and anything else counts as
// missing: no text is ever handed to a shell, awk or an evaluator.
#pragma once
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

struct Lab5Check {
    std::string name, why;  // why "" : passed
};

// The lines of text (a "\r" before a newline dropped, and a UTF-8 byte order
// mark at the start, which Windows editors write, so the first line reads as typed).
inline std::vector<std::string> lab5_lines(const std::string& text) {
    std::vector<std::string> lines;
    size_t at = text.compare(0, 3, "\xef\xbb\xbf") == 0 ? 3 : 0;
    while (at < text.size()) {
        size_t end = text.find('\n', at);
        if (end == std::string::npos) end = text.size();
        std::string line = text.substr(at, end - at);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        lines.push_back(line);
        at = end + 1;
    }
    return lines;
}

inline std::string lab5_trim(const std::string& s) {
    size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
    return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// A number as the report and the answers write one: digits with at most one
// point ("80.7", "3"), at most 30 characters. false for anything else.
inline bool lab5_number(const std::string& s, double* out) {
    if (s.empty() || s.size() > 30 || s.find_first_not_of("0123456789.") != std::string::npos) return false;
    if (s.find('.') != s.rfind('.') || s == ".") return false;
    *out = strtod(s.c_str(), nullptr);
    return std::isfinite(*out);
}
// A count: digits only, at most 15 of them.
inline bool lab5_count(const std::string& s, long long* out) {
    if (s.empty() || s.size() > 15 || s.find_first_not_of("0123456789") != std::string::npos) return false;
    *out = strtoll(s.c_str(), nullptr, 10);
    return true;
}
// The number a cell starts with: "80.7 ± 3.2%" -> "80.7".
inline std::string lab5_leading_number(const std::string& s) {
    size_t end = s.find_first_not_of("0123456789.");
    return s.substr(0, end);
}

// The answer after "key:" on the first line that starts so, a comment after #
// dropped, spaces and tabs removed; "" if none.
inline std::string lab5_answer(const std::vector<std::string>& answers, const std::string& key) {
    for (const std::string& line : answers) {
        if (line.compare(0, key.size() + 1, key + ":") != 0) continue;
        std::string v = line.substr(key.size() + 1);
        v = v.substr(0, v.find('#'));
        std::string out;
        for (char c : v) if (c != ' ' && c != '\t') out += c;
        return out;
    }
    return "";
}

// Cell `field` (1-based, between the |s) of model m's first row (m in cell 2)
// in the table under the line "## title"; "" if none.
inline std::string lab5_cell(const std::vector<std::string>& report, const std::string& title, const std::string& m,
                             size_t field) {
    bool on = false;
    for (const std::string& line : report) {
        if (line == "## " + title) { on = true; continue; }
        if (line.compare(0, 3, "## ") == 0) on = false;
        if (!on) continue;
        std::vector<std::string> cells;  // the text between the |s; cells[0] is before the first
        size_t at = 0;
        for (;;) {
            size_t bar = line.find('|', at);
            cells.push_back(line.substr(at, bar == std::string::npos ? std::string::npos : bar - at));
            if (bar == std::string::npos) break;
            at = bar + 1;
        }
        if (cells.size() > 2 && lab5_trim(cells[2]) == m) return field < cells.size() ? lab5_trim(cells[field]) : "";
    }
    return "";
}

// The last row of the router heatmap as ./lime analyze prints it
// ("  layer 3   0.10 ...   own 42%, most from layer 0 (30%)"): the source
// layer it takes most from and its own share in percent. false if none.
inline bool lab5_heatmap_last_row(const std::vector<std::string>& analyze, std::string* from, std::string* own) {
    const std::string* last = nullptr;
    for (const std::string& line : analyze) {
        if (line.compare(0, 8, "  layer ") != 0 || line.size() < 9 || line[8] < '0' || line[8] > '9') continue;
        if (line.find("own") != std::string::npos) last = &line;
    }
    if (!last) return false;
    auto digits_after = [&](const std::string& mark, bool skip_spaces) {
        size_t at = last->find(mark);
        if (at == std::string::npos) return std::string();
        at += mark.size();
        while (skip_spaces && at < last->size() && (*last)[at] == ' ') at++;
        size_t end = last->find_first_not_of("0123456789", at);
        return last->substr(at, (end == std::string::npos ? last->size() : end) - at);
    };
    *from = digits_after("most from layer ", false);
    *own = digits_after(" own", true);
    return true;
}

// Grades the answers: one Lab5Check per answer, in the lab's order; a report
// without the two models' rows gives the single check report_read, a missing
// heatmap ends with heatmap_read. `where` names the report (for messages),
// `model` the analyzed checkpoint, `analyze_ok` whether ./lime analyze succeeded.
inline std::vector<Lab5Check> lab5_grade(const std::string& answers_text, const std::string& report_text,
                                         const std::string& analyze_text, bool analyze_ok, const std::string& where,
                                         const std::string& model, const std::string& answers_name) {
    std::vector<Lab5Check> out;
    std::vector<std::string> answers = lab5_lines(answers_text), report = lab5_lines(report_text);
    double acc_llama = 0, acc_lime = 0, loss_llama = 0, loss_lime = 0;
    long long par_llama = 0, par_lime = 0;
    bool read = lab5_number(lab5_leading_number(lab5_cell(report, "Accuracy", "llama", 3)), &acc_llama) &&
                lab5_number(lab5_leading_number(lab5_cell(report, "Accuracy", "lime", 3)), &acc_lime) &&
                lab5_count(lab5_cell(report, "Cost", "llama", 3), &par_llama) &&
                lab5_count(lab5_cell(report, "Cost", "lime", 3), &par_lime);
    bool losses = lab5_number(lab5_leading_number(lab5_cell(report, "Accuracy", "llama", 5)), &loss_llama) &&
                  lab5_number(lab5_leading_number(lab5_cell(report, "Accuracy", "lime", 5)), &loss_lime);
    if (!read) {
        out.push_back({"report_read", where + " has no llama and lime rows in its Accuracy and Cost tables: run "
                                              "./lime compare with --archs llama,lime"});
        return out;
    }
    std::string better = acc_lime > acc_llama ? "lime" : acc_lime < acc_llama ? "llama" : "tie";
    std::string lower = losses && loss_lime > loss_llama ? "llama" : "lime";
    // each answer: its key, whether it is right, where to look
    auto check = [&](const std::string& key, const std::string& look, auto right) {
        std::string got = lab5_answer(answers, key);
        if (got.empty()) out.push_back({key, "no answer in " + answers_name + " (a line \"" + key + ": ...\")"});
        else if (right(got)) out.push_back({key, ""});
        else out.push_back({key, "your answer " + got + " does not match your run; look again at " + look});
    };
    auto is_num = [](double want, double tol) {
        return [=](const std::string& got) {
            double v = 0;
            std::string s = !got.empty() && got.back() == '%' ? got.substr(0, got.size() - 1) : got;
            return lab5_number(s, &v) && std::fabs(v - want) <= tol;
        };
    };
    auto is_word = [](const std::string& want) { return [=](const std::string& got) { return got == want; }; };
    std::string table = "the Accuracy table of " + where;
    check("llama_mean_accuracy", table, is_num(acc_llama, 0.051));
    check("lime_mean_accuracy", table, is_num(acc_lime, 0.051));
    check("better_model", "the two means in the Accuracy table (llama, lime or tie)", is_word(better));
    check("lower_test_loss", "the test loss column of the Accuracy table (llama or lime)", is_word(lower));
    check("router_parameters", "the parameters column of the Cost table",
          is_word(std::to_string(par_lime - par_llama)));
    std::string from, own;
    if (!analyze_ok || !lab5_heatmap_last_row(lab5_lines(analyze_text), &from, &own)) {
        std::vector<std::string> lines = lab5_lines(analyze_text);
        out.push_back({"heatmap_read", "cannot analyze " + model + (lines.empty() ? "" : ": " + lines.back())});
        return out;
    }
    double own_share = 0;
    std::string look = "the last row of the router heatmap (./lime analyze --load " + model + ")";
    check("last_layer_leans_on", look, is_word(from));
    if (lab5_number(own, &own_share)) check("last_layer_own_share", look, is_num(own_share, 1.01));
    else out.push_back({"last_layer_own_share", "the heatmap's last row has no own share: " + look});
    return out;
}
