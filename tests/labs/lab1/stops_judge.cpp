// A file whose first call stops its parent, the judge, with SIGSTOP: the
// judge kept the time limit, so `make lab1` never ended whatever LAB_TIMEOUT
// said. Now the worker cannot signal the judge (another user), or run.sh
// ends a stopped judge (labs/README.md, "The boundary").
// timeout: 5
// passes: 0
// expect: never written || the judge was stopped
#include <signal.h>
#include <unistd.h>

#include "labs/lab.h"

void router_forward(float*, const float*, const float*, int, int, int, int) { kill(getppid(), SIGSTOP); }
