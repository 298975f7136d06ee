// support/lib/cli.h — the command line's small tools, which know nothing of
// the model: flags (each command lists its own; anything else is refused with
// one line), errors, threads, files written atomically, this program's path,
// timing and formatting. support/lib/cli.cpp holds the memory probe; the
// model's names and settings from flags are in support/model/names.h.
#pragma once
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif


// What this machine can still give without swapping: MemAvailable of a
// /proc/meminfo-style file, in bytes; 0 where unknown (not Linux).
size_t memory_available(const char* meminfo);

// ===========================================================================
// Flags: each subcommand lists its flags with defaults and help; anything
// else is refused with one line that names it.
// ===========================================================================

struct FlagSpec {
    const char* name;
    const char* def;   // nullptr: a switch (no value); "" : no default
    const char* help;
    bool repeats = false;  // may be given more than once (eval --load A --load B); any other flag given twice is refused
};

struct Args {
    std::string cmd;
    std::map<std::string, std::vector<std::string>> values;  // a flag may repeat (eval --load A --load B)
    std::set<std::string> given;
    std::vector<std::string> positional;
    std::string err;  // the first problem found; checked once all flags are read

    bool has(const std::string& name) const { return given.count(name) > 0; }
    std::string str(const std::string& name) const {
        auto it = values.find(name);
        return it == values.end() || it->second.empty() ? "" : it->second.back();
    }
    void fail(const std::string& msg) { if (err.empty()) err = msg; }
    long long integer(const std::string& name, long long lo, long long hi) {
        std::string s = str(name);
        char* end = nullptr;
        long long v = strtoll(s.c_str(), &end, 10);
        if (s.empty() || *end) { fail("--" + name + " '" + s + "' is not an integer"); return lo; }
        if (v < lo || v > hi) {
            fail("--" + name + " " + s + " is out of range; use " + std::to_string(lo) + " .. " + std::to_string(hi));
            return lo;
        }
        return v;
    }
    double number(const std::string& name, double lo, double hi) {
        std::string s = str(name);
        char* end = nullptr;
        double v = strtod(s.c_str(), &end);
        if (s.empty() || *end || !std::isfinite(v)) { fail("--" + name + " '" + s + "' is not a number"); return lo; }
        if (v < lo || v > hi) {
            char buf[200];
            snprintf(buf, sizeof buf, "--%s %s is out of range; use %g .. %g", name.c_str(), s.c_str(), lo, hi);
            fail(buf);
            return lo;
        }
        return v;
    }
    std::string choice(const std::string& name, const std::vector<std::string>& options) {
        std::string s = str(name);
        for (const std::string& o : options) if (s == o) return s;
        std::string all;
        for (const std::string& o : options) all += (all.empty() ? "" : "|") + o;
        fail("--" + name + " '" + s + "' is not one of " + all);
        return options[0];
    }
};

inline void print_help(const char* cmd, const char* summary, const std::vector<FlagSpec>& flags) {
    printf("usage: ./lime %s [flags]\n%s\n\nflags:\n", cmd, summary);
    for (const FlagSpec& f : flags) {
        std::string left = std::string("--") + f.name + (f.def ? " X" : "");
        printf("  %-20s %s", left.c_str(), f.help);
        if (f.def && *f.def) printf(" (default %s)", f.def);
        printf("\n");
    }
}

// Text for one line of a terminal: control characters (a newline, an escape
// sequence in a flag value or a file name) written as \n, \t, \r or \xNN.
inline std::string one_line(const std::string& s) {
    std::string out;
    for (unsigned char ch : s) {
        if (ch >= 0x20 && ch != 0x7f) { out += (char)ch; continue; }
        char buf[8];
        snprintf(buf, sizeof buf, "\\x%02x", ch);
        out += ch == '\n' ? "\\n" : ch == '\t' ? "\\t" : ch == '\r' ? "\\r" : buf;
    }
    return out;
}

// Where a command's end goes instead of exit(): set by ./lime train-group
// (train.cpp), whose runs share one process and end one by one; else nullptr.
inline void (*g_end_hook)(int status) = nullptr;
// One line on stderr, whatever user text msg echoes, and exit status 2.
inline void die(const std::string& cmd, const std::string& msg) {
    fprintf(stderr, "lime %s: error: %s\n", one_line(cmd).c_str(), one_line(msg).c_str());
    if (g_end_hook) g_end_hook(2);
    exit(2);
}

// Parses argv into args; --help prints the flags and exits 0 (in a run of
// ./lime train-group, whose runs end through g_end_hook, it is refused).
inline Args parse_args(const std::string& cmd, const char* summary, const std::vector<FlagSpec>& flags, int argc, char** argv,
                       bool positional_ok) {
    Args a;
    a.cmd = cmd;
    std::map<std::string, const FlagSpec*> known;
    for (const FlagSpec& f : flags) {
        known[f.name] = &f;
        if (f.def && *f.def) a.values[f.name] = {f.def};
    }
    for (int i = 0; i < argc; i++) {
        std::string tok = argv[i];
        if ((tok == "--help" || tok == "-h") && g_end_hook)  // a run of ./lime train-group: refused, the group not started
            die(cmd, tok + " is not a flag a run of train-group takes; ./lime " + cmd + " --help lists its flags");
        if (tok == "--help" || tok == "-h") { print_help(cmd.c_str(), summary, flags); exit(0); }
        if (tok.rfind("--", 0) != 0) {
            if (!positional_ok) die(cmd, "unexpected argument '" + tok + "'; flags start with --, see ./lime " + cmd + " --help");
            a.positional.push_back(tok);
            continue;
        }
        std::string name = tok.substr(2), value;
        size_t eq = name.find('=');
        bool inline_value = eq != std::string::npos;
        if (inline_value) { value = name.substr(eq + 1); name = name.substr(0, eq); }
        auto it = known.find(name);
        if (it == known.end()) die(cmd, "unknown flag --" + name + "; see ./lime " + cmd + " --help");
        if (a.given.count(name) && !it->second->repeats)  // silently keeping the last would hide a typo
            die(cmd, "--" + name + " is given twice; give it once");
        if (!it->second->def) {  // a switch
            if (inline_value) die(cmd, "--" + name + " takes no value");
            a.values[name] = {"1"};
        } else {
            if (!inline_value) {
                if (i + 1 >= argc) die(cmd, "--" + name + " needs a value; see ./lime " + cmd + " --help");
                value = argv[++i];
            }
            if (!a.given.count(name)) a.values[name].clear();  // the first given value replaces the default
            a.values[name].push_back(value);
        }
        a.given.insert(name);
    }
    return a;
}

// How OpenMP's threads wait, set before the runtime starts. A thread that
// reaches a barrier before the others spins; libgomp's default is 300,000
// rounds of a pause, up to ~20 ms, before it sleeps. On a machine another
// program keeps busy, the thread it waits for is often descheduled, so every
// one of a step's hundreds of barriers spins out a time slice, taking the
// core from the very thread it waits for: --threads 2 beside two busy
// processes ran 6x slower than --threads 1. Here a waiting thread spins for
// 500 rounds (libgomp's GOMP_SPINCOUNT; a round is one pause, whose time
// depends on the CPU: 12 us in all on the AMD EPYCs), then sleeps; other
// runtimes get OMP_WAIT_POLICY=passive. Too short a spin costs an idle
// machine the sleeps and wake-ups (200 rounds ran about 7% slower on a Zen
// 5 EPYC), too long a spin a machine with one other busy process (2,000 ran
// 15-25% slower there): docs/speed.md, "Waiting threads, a fourth machine".
// libgomp reads these variables when the program is loaded, before main, so
// ./lime sets them and runs itself again (exec: same process, same
// arguments), once. A user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT is left as
// it is (no restart).
inline void set_wait_policy(char** argv) {
#if defined(_OPENMP) && defined(__linux__)
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
    setenv("OMP_WAIT_POLICY", "passive", 1);
    setenv("GOMP_SPINCOUNT", "500", 1);
    execv("/proc/self/exe", argv);  // returns only if it failed: run on under the runtime's default
#else
    (void)argv;
#endif
}

// --threads: 0 (all cores) up to 4 x the cores; more only makes the
// threads wait on each other (1024 on 2 cores: 0.14 s became 47 s).
inline void set_threads(Args& a) {
    int n = (int)a.integer("threads", 0, 1024);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    if (n > 4 * cores)
        a.fail("--threads " + std::to_string(n) + " is more than 4 x the " + std::to_string(cores) +
               " cores here: extra threads only wait on each other; use 0 (all cores) or at most " +
               std::to_string(4 * cores));
#ifdef _OPENMP
    if (n > 0) omp_set_num_threads(n);
#else
    (void)n;
#endif
}

inline double now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}
// CPU time this process has used, all its threads together, in milliseconds:
// less disturbed by other programs on the machine than the wall clock.
inline double cpu_ms() {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// printf into a std::string: strf for any values (as long as the text is:
// measured first, never cut), fmt for one number.
inline std::string strf(const char* f, ...) __attribute__((format(printf, 1, 2)));
inline std::string strf(const char* f, ...) {
    va_list ap, again;
    va_start(ap, f);
    va_copy(again, ap);
    int n = vsnprintf(nullptr, 0, f, ap);
    va_end(ap);
    std::string out(n > 0 ? (size_t)n : 0, '\0');
    if (n > 0) vsnprintf(&out[0], (size_t)n + 1, f, again);
    va_end(again);
    return out;
}
inline std::string fmt(const char* f, double v) {
    char buf[64];
    snprintf(buf, sizeof buf, f, v);
    return buf;
}

inline std::string duration_str(double seconds) {
    int s = (int)std::lround(seconds);
    char buf[32];
    if (s >= 3600) snprintf(buf, sizeof buf, "%dh%02dm", s / 3600, s / 60 % 60);
    else if (s >= 60) snprintf(buf, sizeof buf, "%dm%02ds", s / 60, s % 60);
    else snprintf(buf, sizeof buf, "%ds", s);
    return buf;
}

inline std::vector<FlagSpec> concat(std::vector<std::vector<FlagSpec>> parts) {
    std::vector<FlagSpec> all;
    for (auto& p : parts) all.insert(all.end(), p.begin(), p.end());
    return all;
}

inline bool make_dir(const std::string& dir, std::string* err) {
    std::string path;
    for (size_t i = 0; i <= dir.size(); i++) {
        if (i == dir.size() || dir[i] == '/') {
            path = dir.substr(0, i);
            if (!path.empty() && mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
                *err = "cannot create directory " + path + ": " + strerror(errno);
                return false;
            }
        }
    }
    return true;
}

// A new file beside PATH for writing, named PATH.tmp-XXXXXX (XXXXXX unique):
// created with O_CREAT | O_EXCL, which never follows a symlink planted there,
// and never opens a file that exists. Its descriptor, or -1 with errno set.
inline int open_temp_beside(const std::string& path, std::string* tmp) {
    std::string name = path + ".tmp-XXXXXX";
    int fd = mkostemp(&name[0], O_CLOEXEC);
    if (fd < 0) return -1;
    fchmod(fd, 0644);  // mkostemp makes it 0600; a checkpoint is as readable as any file
    *tmp = name;
    return fd;
}

// What to look at when a file cannot be written, by its errno: the line
// after "cannot write PATH: <strerror>" (a full disk is not a missing folder).
inline std::string errno_hint(int e) {
    switch (e) {
        case ENOENT: return "does the directory exist?";
        case ENOSPC: return "is the disk full?";
        case EACCES: case EPERM: case EROFS: return "is the directory writable?";
        case EISDIR: return "is a directory in the way?";
        case EMFILE: case ENFILE: return "too many open files: raise the limit, e.g. ulimit -n 1024";
        case EFBIG: return "the file size limit (ulimit -f) or the disk is full";
        default: return "check the path and the disk";
    }
}

// PATH.tmp-XXXXXX written (open_temp_beside), then renamed over PATH: a
// reader sees the old file or the whole new one, and a symlink at PATH is
// replaced, never followed.
inline std::string write_file_atomic(const std::string& path, const std::string& text) {
    std::string tmp;
    int fd = open_temp_beside(path, &tmp);
    if (fd < 0) return "cannot write " + path + ".tmp-XXXXXX: " + strerror(errno) + " (" + errno_hint(errno) + ")";
    bool ok = true;
    for (size_t done = 0; ok && done < text.size();) {
        ssize_t n = write(fd, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) { if (n == 0) errno = ENOSPC; ok = false; break; }
        done += (size_t)n;
    }
    int e = errno;  // the write's error, before close and unlink set their own
    if (close(fd) != 0 && ok) { ok = false; e = errno; }
    if (ok && rename(tmp.c_str(), path.c_str()) == 0) return "";
    if (ok) e = errno;
    unlink(tmp.c_str());
    return "cannot write " + path + ": " + strerror(e) + " (" + errno_hint(e) + ")";
}

inline std::string json_num(double v) { return fmt("%.9g", v); }

// PATH as a lock, flock'ed for the life of the process (the kernel lets go
// when it ends, however it ends; close-on-exec: a child never holds it), with
// this process's pid inside for the next one's message (train locks its run
// directory, compare its --out). The descriptor; -1 when another process holds
// it (*holder: its pid, 0 while not yet written); -2 when PATH cannot be a lock
// (*why: not a regular file, or it cannot be opened).
inline int lock_file(const std::string& path, long* holder, std::string* why) {
    int fd = open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        *why = fd < 0 ? strerror(errno) : "not a regular file";
        if (fd >= 0) close(fd);
        return -2;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        char buf[24] = {0};
        ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
        *holder = n > 0 ? atol(buf) : 0;
        close(fd);
        return -1;
    }
    std::string pid = std::to_string(getpid()) + "\n";
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid.data(), pid.size(), 0) != (ssize_t)pid.size()) {}  // for messages only
    return fd;
}

// This program's own path, "" if it cannot be found (compare re-runs it).
inline std::string exe_path() {
    char path[4096];
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    return n > 0 ? std::string(path, n) : std::string();
}

// The directory this program lives in (where the repository's data/ is).
inline std::string exe_dir() {
    std::string p = exe_path();
    return p.empty() ? "." : p.substr(0, p.find_last_of('/'));
}
