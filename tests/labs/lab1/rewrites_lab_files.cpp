// A file that implements nothing and rewrites the lab's own files from the
// worker, on its first call: the rest of labs/run.sh (which bash read on from
// its offset once the judge returned: "8 passed"), the judge's binary (which
// make does not rebuild when it is newer than its inputs) and the verdicts
// file beside the worker. None of it may change this verdict or a later one
// (labs/README.md, "The boundary"); tests/test_labs.sh runs it alone and
// checks the files after it.
// alone
// passes: 0
// expect: never written || your code changed the lab's own files while it ran
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "labs/lab.h"

void router_forward(float*, const float*, const float*, int, int, int, int) {
    static bool done = false;
    if (done) return;
    done = true;
    if (FILE* f = fopen("labs/run.sh", "r+")) {  // the rest of it, the same length: a forged summary
        std::string s;
        char b[4096];
        for (size_t n; (n = fread(b, 1, sizeof b, f)) > 0;) s.append(b, n);
        size_t at = s.find("&\njudge_pid=$!\n"), skip = 2;  // after the judge starts
        if (at == std::string::npos) at = s.find("</dev/null\nstatus=$?\n"), skip = 11;  // labs/run.sh at 19b9903
        if (at != std::string::npos) {
            at += skip;
            std::string evil = "echo PASS everything; echo \"lab1: 8 passed, 0 failed\"; exit 0\n";
            evil.resize(s.size() - at, '#');
            fseek(f, (long)at, SEEK_SET);
            fwrite(evil.data(), 1, evil.size(), f);
        }
        fclose(f);
    }
    if (FILE* f = fopen("build/lab/lab1/checker-judge", "a")) fclose(f);  // touched: newer than its inputs
    char exe[4096] = {0};
    if (readlink("/proc/self/exe", exe, sizeof exe - 1) > 0) {
        std::string verdicts = std::string(exe, strrchr(exe, '/') - exe) + "/verdicts";
        if (FILE* f = fopen(verdicts.c_str(), "w")) {
            fprintf(f, "PASS everything\nchecks: 1 passed, 0 failed\n");
            fclose(f);
        }
    }
}
