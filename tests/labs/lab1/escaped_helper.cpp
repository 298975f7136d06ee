// A helper process that leaves the check's session (setsid) and waits for
// ever, holding the check's pipes: the lab still ends within its limits and
// the helper is killed (tests/test_labs.sh reads their pids from
// LAB_TEST_PIDFILE and checks each has ended).
// expect: Kr[r=0, n=0, i=0] is wrong
#include <cstdio>
#include <cstdlib>
#include <unistd.h>

#include "labs/lab.h"

void router_forward(float*, const float*, const float*, int, int, int, int) {
    static bool started = false;
    if (started) return;
    started = true;
    if (fork() == 0) {
        setsid();
        if (FILE* f = getenv("LAB_TEST_PIDFILE") ? fopen(getenv("LAB_TEST_PIDFILE"), "a") : nullptr) {
            fprintf(f, "%d\n", (int)getpid());
            fclose(f);
        }
        for (;;) pause();
    }
}
