// labs/lab5/check.cpp — lab 5's checker (labs/lab5/check.sh runs it):
//   check ANSWERS REPORT ANALYZE_OUTPUT ANALYZE_STATUS MODEL
// grades the answers file against the run's report.md and the output of
// ./lime analyze on MODEL (ANALYZE_STATUS: its exit status), with
// labs/lab5/report.h. One PASS or FAIL line per answer; exit status 0 when
// every answer passed. Files are read as data, at most 16 MiB each.
#include <cstdio>
#include <string>

#include "labs/lab5/report.h"

// The whole file, or false when it cannot be read or is over 16 MiB.
static bool read_text(const char* path, std::string* out) {
    FILE* f = fopen(path, "rb");
    if (!f) return false;
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0 && out->size() <= (16u << 20)) out->append(buf, n);
    bool ok = !ferror(f) && out->size() <= (16u << 20);
    fclose(f);
    return ok;
}

// One line for a terminal: control characters as \xNN.
static std::string printable(const std::string& s) {
    std::string out;
    for (unsigned char c : s) {
        if (c >= 0x20 && c != 0x7f) { out += (char)c; continue; }
        char b[8];
        snprintf(b, sizeof b, "\\x%02x", c);
        out += b;
    }
    return out;
}

int main(int argc, char** argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: check ANSWERS REPORT ANALYZE_OUTPUT ANALYZE_STATUS MODEL (labs/lab5/check.sh runs it)\n");
        return 2;
    }
    std::string answers, report, analyze;
    if (!read_text(argv[1], &answers)) {
        printf("FAIL answers_read: %s cannot be read (or is over 16 MiB); fix: make lab5 FILE=your/answers.txt\n",
               printable(argv[1]).c_str());
        return 1;
    }
    if (!read_text(argv[2], &report)) {
        printf("FAIL run_found: no report at %s: run the experiment first (labs/lab5/README.md), or name its "
               "directory: make lab5 RUN=dir\n", printable(argv[2]).c_str());
        return 1;
    }
    read_text(argv[3], &analyze);
    bool analyze_ok = std::string(argv[4]) == "0";
    int failed = 0;
    for (const Lab5Check& c : lab5_grade(answers, report, analyze, analyze_ok, argv[2], argv[5], argv[1])) {
        if (c.why.empty()) printf("PASS %s\n", c.name.c_str());
        else printf("FAIL %s: %s\n", c.name.c_str(), printable(c.why).c_str()), failed++;
    }
    return failed ? 1 : 0;
}
