// labs/lab5/check.cpp — lab 5's checker (labs/lab5/check.sh runs it):
//   check ANSWERS REPORT ANALYZE_OUTPUT ANALYZE_STATUS MODEL
// grades the answers file against the run's report.md and the output of
// ./lime analyze on MODEL (ANALYZE_STATUS: its exit status), with
// labs/lab5/report.h. One PASS or FAIL line per answer; exit status 0 when
// every answer passed. Files are read as data: regular files of at most 16 MiB each.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "labs/lab5/report.h"

// The whole file into *out: "" or why not, in a few words: it cannot be
// opened, it is not a regular file (a FIFO would block the read forever), or
// it is over 16 MiB (no answers file or report is).
static std::string read_text(const char* path, std::string* out) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // O_NONBLOCK: opening a FIFO does not wait for a writer
    if (fd < 0) return std::string("cannot be read (") + strerror(errno) + ")";
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return "is not a regular file (a FIFO, a device or a directory)";
    }
    const size_t max = 16u << 20;
    char buf[65536];
    ssize_t n = 0;
    while (out->size() <= max && (n = read(fd, buf, sizeof buf)) > 0) out->append(buf, (size_t)n);
    close(fd);
    if (n < 0) return std::string("cannot be read (") + strerror(errno) + ")";
    return out->size() > max ? "is over 16 MiB" : "";
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
    std::string answers, report, analyze, why;
    if (!(why = read_text(argv[1], &answers)).empty()) {
        printf("FAIL answers_read: %s %s; fix: make lab5 FILE=your/answers.txt\n", printable(argv[1]).c_str(),
               why.c_str());
        return 1;
    }
    if (!(why = read_text(argv[2], &report)).empty() && why.rfind("cannot be read (No such file", 0) == 0) {
        printf("FAIL run_found: no report at %s: run the experiment first (labs/lab5/README.md), or name its "
               "directory: make lab5 RUN=dir\n", printable(argv[2]).c_str());
        return 1;
    }
    if (!why.empty()) {
        printf("FAIL run_found: the report %s %s, not one ./lime compare writes: run the experiment again "
               "(labs/lab5/README.md), or name its directory: make lab5 RUN=dir\n", printable(argv[2]).c_str(),
               why.c_str());
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
