// support/lib/cli.cpp — the memory probe the commands pass to model_create
// (through model_settings, support/model/names.h).
#include <cstdio>
#include <cstdlib>

#include "support/lib/cli.h"

// What this machine can still give without swapping: MemAvailable of a
// /proc/meminfo-style file, in bytes; 0 where unknown (not Linux). Checked
// before the activations are allocated, because calloc would succeed anyway
// (pages are promised, not given) and the run would then be killed, or crawl
// in swap, part way through its first step.
size_t memory_available(const char* meminfo) {
    FILE* f = fopen(meminfo, "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (size_t)kb * 1024;
}

