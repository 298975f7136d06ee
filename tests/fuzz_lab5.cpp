// tests/fuzz_lab5.cpp — libFuzzer target for lab 5's grader
// (labs/lab5/report.h), which reads a student's answers, the run's report.md
// and ./lime analyze's output: text anyone can write. Built and run by
// `make fuzz`; seeds in tests/fuzz_corpus/lab5/.
//
// An input is the three texts separated by lines "@@@": answers, report,
// analyze output. Besides "no crash, no sanitizer report", the grader's
// promises are checked: it gives either the one check report_read, or the
// five answer checks and then heatmap_read or the two heatmap checks; and a
// check passes only when its answer is there.
#include <cstdint>
#include <cstdio>
#include <string>

#include "labs/lab5/report.h"

static void require(bool ok, const char* what) {
    if (!ok) {
        fprintf(stderr, "fuzz_lab5: broken promise: %s\n", what);
        __builtin_trap();
    }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::string text((const char*)data, size), parts[3];
    size_t at = 0;
    for (int i = 0; i < 3; i++) {
        size_t end = i < 2 ? text.find("\n@@@\n", at) : std::string::npos;
        parts[i] = text.substr(at, end == std::string::npos ? std::string::npos : end - at);
        if (end == std::string::npos) break;
        at = end + 5;
    }
    std::vector<Lab5Check> out = lab5_grade(parts[0], parts[1], parts[2], true, "report.md", "model", "answers");
    require(out.size() == 1 || out.size() == 6 || out.size() == 7, "lab5_grade gave an unexpected number of checks");
    if (out.size() == 1) require(out[0].name == "report_read" && !out[0].why.empty(), "a lone check that is not report_read");
    if (out.size() == 6) require(out[5].name == "heatmap_read", "six checks without heatmap_read last");
    std::vector<std::string> answers = lab5_lines(parts[0]);
    for (const Lab5Check& c : out)
        if (c.why.empty()) require(!lab5_answer(answers, c.name).empty(), "a check passed without an answer");
    return 0;
}
