// labs/check.h — what the labs' checkers share: random inputs, one PASS or
// FAIL line per check, and the diagnosis of a wrong answer. A checker
// computes the outputs that each plausible mistake would give and says which
// one the student's output matches, naming the tensor and the first wrong
// index, never the right value.
#pragma once
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "support/lib/rng.h"
#include "labs/lab.h"
#include "support/lib/cli.h"
#include "support/commands/commands.h"  // verify_reference_files
#include "support/model/cpu_fast.h"

// ---------------------------------------------------------------------------
// Who decides. The student's code never runs in the process that prints the
// verdicts, not even a constructor or a static object of the student's file
// (which would run before any main):
//   the worker (labs/run.sh links it: this checker, the student's object, and
//     labs/transcript.cpp recording every call of the lab's functions) runs
//     one check, started by the judge as a program of its own, and sends back
//     the transcript of those calls: their outputs;
//   the judge (built once: this checker and labs/transcript.cpp replaying, no
//     student code) runs the same check in a child of its own with the
//     transcript's outputs in place of the student's calls, and alone prints
//     PASS or FAIL and decides the exit status.
// So what the student's code prints goes nowhere near the verdicts (it is
// kept apart, a few MB of it, on stderr), and only a transcript holding the
// right outputs passes. A crash, an endless loop, an exit() or an endless
// print in the student's code ends only that check, with the reason; a
// process it leaves behind is killed, even one that left the process group.
// FILE=project (lime.cu's own functions, trusted) runs each check in a child
// of the checker itself, with the same limits.

// The seconds a check may take: LAB_TIMEOUT, else 60 (the slowest check takes
// a few seconds; an endless loop takes forever).
inline int lab_timeout_s() {
    const char* t = getenv("LAB_TIMEOUT");
    int s = t ? atoi(t) : 0;
    return s >= 1 && s <= 3600 ? s : 60;
}

// labs/transcript.cpp's calls, weak: the project's checker links none of it.
void lab_record_start(int fd) __attribute__((weak));
void lab_record_finish() __attribute__((weak));
void lab_replay_start(const std::string& transcript) __attribute__((weak));
std::string lab_replay_finish() __attribute__((weak));

// What a check's child prints is kept up to this (on the checker's stderr,
// which labs/run.sh shows a few lines of), the rest counted and dropped: an
// endless print costs neither disk nor memory. A worker's transcript past
// LAB_TRANSCRIPT_MAX is refused (the largest check's is a few MB).
constexpr size_t LAB_PRINT_KEEP = (size_t)4 << 20, LAB_TRANSCRIPT_MAX = (size_t)256 << 20;

// The processes whose parent is `parent` (from /proc/PID/stat).
inline std::vector<pid_t> children_of(pid_t parent) {
    std::vector<pid_t> kids;
    DIR* d = opendir("/proc");
    while (d) {
        struct dirent* e = readdir(d);
        if (!e) break;
        if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE* f = fopen(path, "r");
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f) fclose(f);
        buf[n] = 0;
        const char* after = strrchr(buf, ')');  // the name, in parentheses, may hold anything
        char state;
        int ppid;
        if (after && sscanf(after + 1, " %c %d", &state, &ppid) == 2 && ppid == parent) kids.push_back(atoi(e->d_name));
    }
    if (d) closedir(d);
    return kids;
}

// What a check's child left running is killed: its session (the child made
// one), then every process re-parented to the checker, which is a child
// subreaper (Lab's constructor): a helper that left the session with setsid()
// would otherwise live on, and hold the lab past its limit.
inline void end_leftovers(pid_t child) {
    kill(-child, SIGKILL);
    for (int round = 0; round < 1000; round++) {
        std::vector<pid_t> kids = children_of(getpid());
        if (kids.empty()) return;
        for (pid_t k : kids) kill(k, SIGKILL);
        usleep(1000);
        while (waitpid(-1, nullptr, WNOHANG) > 0) {}
    }
}

// How a child ended and what it sent.
struct ChildEnd {
    std::string sent;     // what it wrote on its answer pipe
    std::string error;    // the checker could not start it: why
    int status = 0;       // waitpid's
    bool timed_out = false, too_much = false;
    size_t printed = 0;   // the bytes it printed, kept or not
};

// Reads what is there on fd (non-blocking), into *to up to `keep` bytes (or,
// with to == nullptr, onto stderr); returns the bytes read, -1 at its end.
inline long drain(int fd, std::string* to, size_t keep, size_t done) {
    char buf[65536];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n == 0) return -1;
    if (n < 0) return errno == EAGAIN || errno == EINTR ? 0 : -1;
    size_t room = done < keep ? std::min((size_t)n, keep - done) : 0;
    if (to) to->append(buf, room);
    else if (room && write(2, buf, room) < 0) {}
    return n;
}

// Runs `child` (given its answer pipe's descriptor; it must end with _exit or
// exec) in a process of its own session, its stdin /dev/null, its stdout and
// stderr one pipe kept up to LAB_PRINT_KEEP. Waits until it ends or the time
// is up (then kills it), and never for a pipe a leftover process still holds:
// the reading ends with the child. Its leftovers are then killed.
inline ChildEnd run_child(const std::function<void(int answer)>& child, int timeout_s) {
    fflush(stdout);
    fflush(stderr);
    ChildEnd end;
    int ans[2], out[2];
    if (pipe2(ans, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
        end.error = strf("the checker could not make a pipe: %s", strerror(errno));
        return end;  // (a descriptor short: the checker ends soon anyway)
    }
    pid_t parent = getpid(), pid = fork();
    if (pid == 0) {
        setsid();  // a session of its own: whatever it starts is killed with it
#ifdef __linux__
        prctl(PR_SET_PDEATHSIG, SIGKILL);  // and it dies with the checker, even one killed
#endif
        if (getppid() != parent) _exit(127);
        int null = open("/dev/null", O_RDONLY);
        dup2(null, 0), dup2(out[1], 1), dup2(out[1], 2);  // dup2 clears close-on-exec on 0, 1, 2
        child(ans[1]);
        _exit(127);
    }
    int fork_errno = errno;
    close(ans[1]), close(out[1]);
    if (pid < 0) {
        close(ans[0]), close(out[0]);
        end.error = strf("the checker could not start the check: %s", strerror(fork_errno));
        return end;
    }
    fcntl(ans[0], F_SETFL, O_NONBLOCK), fcntl(out[0], F_SETFL, O_NONBLOCK);
    double deadline = now_ms() + 1000.0 * timeout_s;
    bool exited = false, ans_open = true, out_open = true;
    while (!exited) {
        struct pollfd p[2] = {{ans_open ? ans[0] : -1, POLLIN, 0}, {out_open ? out[0] : -1, POLLIN, 0}};
        poll(p, 2, 20);  // short slices: the child's end is seen at once, whoever holds the pipes
        long n;
        while (ans_open && (n = drain(ans[0], &end.sent, LAB_TRANSCRIPT_MAX + 1, end.sent.size())) != 0) {
            if (n < 0) ans_open = false;
            if (end.sent.size() > LAB_TRANSCRIPT_MAX) { end.too_much = true; break; }
        }
        while (out_open && (n = drain(out[0], nullptr, LAB_PRINT_KEEP, end.printed)) != 0)
            if (n < 0) out_open = false; else end.printed += (size_t)n;
        exited = waitpid(pid, &end.status, WNOHANG) == pid;
        if (!exited && (end.too_much || now_ms() > deadline)) {
            end.timed_out = !end.too_much;
            kill(-pid, SIGKILL), kill(pid, SIGKILL);
            while (waitpid(pid, &end.status, 0) < 0 && errno == EINTR) {}
            exited = true;
        }
    }
    // what it wrote just before it ended; a bounded read: a leftover process may write on
    for (int i = 0; i < 64 && ans_open && drain(ans[0], &end.sent, LAB_TRANSCRIPT_MAX, end.sent.size()) > 0; i++) {}
    for (long i = 0, n; i < 64 && out_open && (n = drain(out[0], nullptr, LAB_PRINT_KEEP, end.printed)) > 0; i++)
        end.printed += (size_t)n;
    close(ans[0]), close(out[0]);
    end_leftovers(pid);
    if (end.printed > LAB_PRINT_KEEP)
        fprintf(stderr, "(your code printed %zu bytes in all; the first %zu are above, the rest were dropped)\n",
                end.printed, LAB_PRINT_KEEP);
    return end;
}

// "" when the child ended as a check's child does (exit status 0, in time),
// else why not, in the words a student needs.
inline std::string why_child_failed(const ChildEnd& e, int timeout_s) {
    if (!e.error.empty()) return e.error;
    if (e.timed_out)
        return strf("your code did not finish within %d s and was stopped: an endless loop? (LAB_TIMEOUT=%d sets "
                    "the limit)", timeout_s, timeout_s);
    if (e.too_much)
        return strf("your code's calls sent more than %zu MiB of outputs: is a size wrong?", LAB_TRANSCRIPT_MAX >> 20);
    if (WIFSIGNALED(e.status)) {
        int sig = WTERMSIG(e.status);
        const char* hint = sig == SIGSEGV || sig == SIGBUS ? ": a read or write outside an array? (step through it in gdb)"
                           : sig == SIGFPE             ? ": a division by zero?"
                           : sig == SIGABRT            ? ": an assert or abort() failed, or the heap was damaged"
                                                       : "";
        return strf("your code crashed: killed by signal %d (%s)%s", sig, strsignal(sig), hint);
    }
    if (!WIFEXITED(e.status) || WEXITSTATUS(e.status) != 0)
        return strf("your code ended the process (exit status %d) before the check finished: an exit() or _exit() "
                    "call? return from the function instead", WIFEXITED(e.status) ? WEXITSTATUS(e.status) : -1);
    return "";
}

// Writes all of text to fd, or ends the process (a check's child: its answer is lost).
inline void send_all(int fd, const std::string& text) {
    for (size_t done = 0; done < text.size();) {
        ssize_t n = write(fd, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) _exit(3);
        done += (size_t)n;
    }
}

// "" or the check's diagnosis, from run() in a child of this process
// (trusted code: the project's, or the judge's replay); or why the child gave none.
inline std::string run_in_child(const std::function<std::string()>& run, int timeout_s) {
    ChildEnd e = run_child([&](int answer) {
        std::string diagnosis = "R" + run();
        fflush(stdout), fflush(stderr);
        send_all(answer, diagnosis);
        _exit(0);
    }, timeout_s);
    std::string why = why_child_failed(e, timeout_s);
    if (!why.empty()) return why;
    if (e.sent.empty() || e.sent[0] != 'R') return "the check ended without its answer";
    return e.sent.substr(1);
}

// Closes every descriptor from `first` on (those /proc/self/fd lists).
inline void close_from(int first) {
    std::vector<int> fds;
    if (DIR* d = opendir("/proc/self/fd")) {
        while (struct dirent* e = readdir(d)) if (atoi(e->d_name) >= first) fds.push_back(atoi(e->d_name));
        closedir(d);
    }
    for (int fd : fds) close(fd);
}

// Whether a transcript ends as the worker ends one, after its check
// (labs/transcript.cpp's end marker; the replay then checks the rest).
inline bool transcript_ended(const std::string& t) {
    return t.size() >= 4 && t.compare(t.size() - 4, 4, "\xff\xff\xff\xff") == 0;
}

// The worker's user: LIME_LAB_WORKER_UID (labs/run.sh sets it when the lab
// runs as root: 65534, nobody), else 0, the judge's own. As another user the
// worker can neither write the lab's files (the judge, labs/run.sh, the
// verdicts) nor signal the judge or its parents (labs/README.md, "The boundary").
inline uid_t lab_worker_uid() {
    const char* u = getenv("LIME_LAB_WORKER_UID");
    long id = u ? atol(u) : 0;
    return id > 0 && id < 0x7fffffff ? (uid_t)id : 0;
}

// In the worker's process, before it runs any student code: its own user
// (uid, group the same number, no supplementary groups), no way back to
// privileges (no setuid program, no new capabilities), still killed with
// the judge. "" or why not.
inline std::string become_worker_user(uid_t uid, pid_t judge) {
    if (uid != 0) {
        gid_t gid = (gid_t)uid;
        if (setgroups(0, nullptr) != 0 || setgid(gid) != 0 || setuid(uid) != 0 || getuid() != uid || geteuid() != uid)
            return strf("the judge could not run the worker as user %d: %s", (int)uid, strerror(errno));
    }
#ifdef __linux__
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // a change of user clears it
#endif
    struct rlimit procs = {4096, 4096};  // a fork bomb under the worker's user ends there
    if (uid != 0) setrlimit(RLIMIT_NPROC, &procs);
    if (getppid() != judge) _exit(127);  // the judge died meanwhile
    return "";
}

// The worker runs check `name`, recording (labs/transcript.cpp); its
// transcript into *transcript. "" or why it gave none.
inline std::string run_worker(const char* worker, const std::string& name, int timeout_s, std::string* transcript) {
    pid_t judge = getpid();
    uid_t uid = lab_worker_uid();
    ChildEnd e = run_child([&](int answer) {
        dup2(answer, 3);  // the transcript's descriptor (dup2 clears close-on-exec)
        close_from(4);    // nothing else of the checker's (or of make's) reaches the student's code
        std::string why = become_worker_user(uid, judge);
        if (!why.empty()) {
            fprintf(stderr, "%s\n", why.c_str());
            _exit(126);
        }
        setenv("LIME_LAB_CHECK", name.c_str(), 1);
        unsetenv("LIME_LAB_WORKER");  // the worker is no judge
        unsetenv("LIME_LAB_WORKER_UID");
        execl(worker, worker, (char*)nullptr);
        fprintf(stderr, "cannot run the worker %s: %s\n", worker, strerror(errno));
        _exit(126);
    }, timeout_s);
    *transcript = e.sent;
    return why_child_failed(e, timeout_s);
}

struct Lab {
    int passed = 0, failed = 0;
    std::string stuck;       // the first check that ran out of time: the rest are not run (each would wait as long)
    const char* worker = nullptr;       // the judge: the worker program each check runs in (LIME_LAB_WORKER)
    const char* worker_check = nullptr; // the worker: the one check to run and record (LIME_LAB_CHECK)
    Lab() {
        worker = getenv("LIME_LAB_WORKER");
        worker_check = getenv("LIME_LAB_CHECK");
        if (worker && access(worker, X_OK) != 0) {
            fprintf(stderr, "labs/check.h: cannot run the worker '%s' (LIME_LAB_WORKER): %s; run make labN\n",
                    one_line(worker).c_str(), strerror(errno));
            exit(2);
        }
        // which program this is: the judge has the replaying half of labs/transcript.cpp, the worker the
        // recording half, the project's checker neither
        if ((worker && !lab_replay_start) || (worker_check && !lab_record_start) || (lab_replay_start && !worker)) {
            fprintf(stderr, "labs/check.h: a lab's judge runs with its worker, a worker with its judge: run make "
                            "labN\n");
            exit(2);
        }
#ifdef __linux__
        prctl(PR_SET_CHILD_SUBREAPER, 1);  // a check's orphans become ours: end_leftovers finds them
        prctl(PR_SET_DUMPABLE, 0);         // and no other process of the user may open our descriptors in /proc
#endif
    }
    void pass(const std::string& check) {
        printf("PASS %s\n", check.c_str());
        passed++;
    }
    void fail(const std::string& check, const std::string& why) {
        printf("FAIL %s: %s\n", check.c_str(), one_line(why).c_str());
        failed++;
    }
    // One check: run() (the student's code and the comparison) as "Who decides" says; "" from it passes.
    void check(const std::string& check, const std::function<std::string()>& run) {
        if (worker_check) return record(check, run);
        if (!stuck.empty()) return fail(check, "not run: " + stuck + " did not finish in time");
        std::string why, transcript;
        if (worker) {
            why = run_worker(worker, check, lab_timeout_s(), &transcript);
            if (why.empty() && !transcript_ended(transcript))
                why = "your code ended the process (exit status 0) before the check finished: an exit() or _exit() "
                      "call, in a function or a constructor? return from the function instead";
            if (why.empty())
                why = run_in_child([&] {
                    lab_replay_start(transcript);
                    std::string diagnosis = run(), broken = lab_replay_finish();
                    return broken.empty() ? diagnosis : "your code's outputs could not be checked: " + broken;
                }, lab_timeout_s());
        } else {
            why = run_in_child(run, lab_timeout_s());
        }
        if (why.find("did not finish within") != std::string::npos) stuck = check;
        why.empty() ? pass(check) : fail(check, why);
    }
    // The worker's part: this one check, its calls recorded on descriptor 3, then the end.
    void record(const std::string& check, const std::function<std::string()>& run) {
        if (check != worker_check) return;
        lab_record_start(3);
        run();  // its diagnosis is the judge's to make
        fflush(stdout), fflush(stderr);
        lab_record_finish();
        _exit(0);
    }
    // The verdict is the judge's alone: its own counts, in its exit status and last line.
    int exit_status() const {
        printf("checks: %d passed, %d failed\n", passed, failed);
        fflush(stdout);
        return failed || !passed ? 1 : 0;
    }
};

// The reference vectors (docs/checkpoint.md): the whole model, the student's
// function in it, through ./lime verify's checks (verify_reference_files),
// one check. dir's *.safetensors in name order; lab 3's on the GPU harness.
inline std::string reference_vectors(const std::string& dir, Device dev, const std::vector<std::string>& only = {}) {
    std::vector<std::string> files = only;
    if (files.empty()) {
        DIR* d = opendir(dir.c_str());
        while (struct dirent* e = d ? readdir(d) : nullptr) {
            std::string name = e->d_name;
            if (name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0)
                files.push_back(dir + "/" + name);
        }
        if (d) closedir(d);
        std::sort(files.begin(), files.end());
    }
    if (files.empty()) return "no reference files in " + dir;
    ModelSettings settings;
    settings.tf32 = false;  // float32 throughout, at docs/checkpoint.md's tight tolerances
    std::string err = verify_reference_files(files, dev, settings);
    return err.empty() ? "" : "./lime verify with your function: " + err;
}

inline std::vector<float> randn(Rng& rng, size_t n, float scale = 1.0f) {
    std::vector<float> v(n);
    for (float& x : v) x = (float)rng.normal() * scale;
    return v;
}

// A tensor a check compares: its name, its values, and how to name index i.
struct Out {
    std::string name;
    std::vector<float> v;
    std::function<std::string(size_t)> at;
};
// What one known mistake would give, and the hint that names it.
struct Mistake {
    std::string hint;
    std::vector<std::vector<float>> outs;  // one per Out, in the same order
};

inline bool close(float got, float want, double tol) {
    return std::isfinite(got) && std::fabs((double)got - want) <= tol * (1.0 + std::fabs((double)want));
}
// The first index where got and want differ, or -1.
inline long first_wrong(const std::vector<float>& got, const std::vector<float>& want, double tol) {
    for (size_t i = 0; i < want.size(); i++)
        if (!close(got[i], want[i], tol)) return (long)i;
    return -1;
}

// "" when every output matches the reference; else which tensor is wrong
// first, where, and what the answer looks like: a known mistake, NaN (never
// written), zero where it should not be, or none of those.
inline std::string diagnose(const std::vector<Out>& got, const std::vector<std::vector<float>>& want,
                            const std::vector<Mistake>& mistakes, const std::string& shape, double tol = 1e-4) {
    for (size_t t = 0; t < got.size(); t++) {
        long i = first_wrong(got[t].v, want[t], tol);
        if (i < 0) continue;
        std::string where = got[t].name + got[t].at((size_t)i) + " is wrong (" + shape + ")";
        for (const Mistake& m : mistakes) {
            bool all = true;
            for (size_t u = 0; u < got.size() && all; u++) all = first_wrong(got[u].v, m.outs[u], tol) < 0;
            if (all) return where + "; hint: " + m.hint;
        }
        float g = got[t].v[i];
        if (std::isnan(g)) return where + ": it is NaN; hint: that element is never written";
        if (g == 0) return where + ": it is 0; hint: a term or an element left out";
        return where + "; hint: it matches none of the usual mistakes: step through that element in gdb";
    }
    return "";
}

// ---------------------------------------------------------------------------
// The router (Eq. 2), with the mistakes the labs' hints name. router_forward
// (lab 1) mixes one buffer with one router; lime.cu calls it for the keys,
// then the values. Lab 3's kernel does both in one launch, so it alone can
// also mix one buffer with the other's router.
enum RouterSlip { SLIP_NONE, SLIP_TRANSPOSED, SLIP_NO_OWN_LAYER, SLIP_NO_KV_SUM, SLIP_ADDED };
inline const char* router_slip_hint(RouterSlip s) {
    switch (s) {
    case SLIP_TRANSPOSED:
        return "it matches the router read transposed, W[j][r] for W[r][j]: W is (R, (l+1)R), row r holds "
               "output head r's weights";
    case SLIP_NO_OWN_LAYER:
        return "it matches a sum that leaves the layer's own block out (source layers 0..l-1): the sum runs "
               "over l' = 0..l, the layer's own keys and values included";
    case SLIP_NO_KV_SUM:
        return "it matches the sum over kv heads dropped (r' = r only): output head r mixes every kv head r' "
               "of every source layer, column j = l'*R + r'";
    case SLIP_ADDED:
        return "it matches out added to (+=) what it held before the call: the forward sets out (=), it "
               "holds the last step's numbers until then; only a backward adds";
    default: return "";
    }
}
// out (R, N, hd) as router_forward computes it with the slip s, summed in
// double; `before` is what out held (SLIP_ADDED adds to it). buf (L, R, N, hd):
// row j = l'*R + r' (layer l', kv head r') of N*hd floats.
inline void router_with_slip(RouterSlip s, float* out, const float* before, const float* W, const float* buf, int l,
                             int N, int R, int hd) {
    int cols = (l + 1) * R;
    size_t row = (size_t)N * hd;
    for (int r = 0; r < R; r++)
        for (size_t e = 0; e < row; e++) {
            double sum = s == SLIP_ADDED ? before[r * row + e] : 0;
            for (int j = 0; j < cols; j++) {
                if (s == SLIP_NO_OWN_LAYER && j / R == l) continue;
                if (s == SLIP_NO_KV_SUM && j % R != r) continue;
                int w = s == SLIP_TRANSPOSED ? j * R + r : r * cols + j;  // W read as if it were ((l+1)R, R)
                sum += (double)W[w] * buf[j * row + e];
            }
            out[r * row + e] = (float)sum;
        }
}
inline std::function<std::string(size_t)> at_rni(int N, int hd) {
    return [=](size_t x) { return strf("[r=%zu, n=%d, i=%d]", x / ((size_t)N * hd), (int)(x / hd % N), (int)(x % hd)); };
}
// The router as the model runs it: keys and values, out = {Kr, Vr}, W = {Wk, Wv}, buf = {Kbuf, Vbuf}.
using RouterRun = std::function<void(KvPair out, KvConst W, KvConst buf, int l, int N, int R, int hd)>;
// Kr, Vr from `run` (the student's router on the CPU or the harness) against
// Eq. 2 summed in double (router_with_slip without a slip), on one shape; ""
// or the diagnosis. Kr and Vr start with other numbers, as the model's hold
// the last step's. hd even, as the model's (RoPE) needs.
inline std::string check_router_forward(const RouterRun& run, Rng& rng, int l, int N, int R, int hd, bool separate) {
    size_t n_out = (size_t)R * N * hd, n_w = (size_t)R * (l + 1) * R;
    std::vector<float> Wk = randn(rng, n_w), Wv = separate ? randn(rng, n_w) : Wk;
    std::vector<float> Kbuf = randn(rng, (l + 1) * n_out), Vbuf = randn(rng, (l + 1) * n_out);
    std::vector<float> k0 = randn(rng, n_out), v0 = randn(rng, n_out), Kr = k0, Vr = v0;
    run({Kr.data(), Vr.data()}, {Wk.data(), separate ? Wv.data() : Wk.data()}, {Kbuf.data(), Vbuf.data()}, l, N, R,
        hd);
    auto mix = [&](RouterSlip s, const std::vector<float>& before, const std::vector<float>& W,
                   const std::vector<float>& buf) {
        std::vector<float> out(n_out);
        router_with_slip(s, out.data(), before.data(), W.data(), buf.data(), l, N, R, hd);
        return out;
    };
    std::vector<float> wk = mix(SLIP_NONE, k0, Wk, Kbuf), wv = mix(SLIP_NONE, v0, Wv, Vbuf);
    std::vector<Mistake> all;
    for (RouterSlip s : {SLIP_TRANSPOSED, SLIP_NO_OWN_LAYER, SLIP_NO_KV_SUM, SLIP_ADDED})
        all.push_back({router_slip_hint(s), {mix(s, k0, Wk, Kbuf), mix(s, v0, Wv, Vbuf)}});
    all.push_back({"it matches the keys routed with the value router: with separate routers (Wk != Wv) the "
                   "keys take Wk", {mix(SLIP_NONE, k0, Wv, Kbuf), wv}});
    all.push_back({"it matches the values routed with the key router: with separate routers (Wk != Wv) the "
                   "values take Wv", {wk, mix(SLIP_NONE, v0, Wk, Vbuf)}});
    std::vector<Mistake> mistakes;
    for (const Mistake& m : all)
        if (first_wrong(m.outs[0], wk, 1e-4) >= 0 || first_wrong(m.outs[1], wv, 1e-4) >= 0)  // one this shape can show
            mistakes.push_back(m);
    std::string shape = strf("l=%d, N=%d, R=%d, hd=%d, %s router", l, N, R, hd, separate ? "separate key and value" : "one");
    std::vector<Out> got = {{"Kr", Kr, at_rni(N, hd)}, {"Vr", Vr, at_rni(N, hd)}};
    // Out starts with numbers, not NaN: an element that still holds its own was
    // never written (every mistake above writes it), and a NaN was read from
    // memory nobody wrote.
    const std::vector<float>* before[2] = {&k0, &v0};
    const std::vector<float>* want[2] = {&wk, &wv};
    for (int t = 0; t < 2; t++) {
        long i = first_wrong(got[t].v, *want[t], 1e-4);
        if (i < 0) continue;
        std::string where = got[t].name + got[t].at(i) + " is wrong (" + shape + ")";
        if (got[t].v[i] == (*before[t])[i])
            return where + ": it holds what it held before the call; hint: that element is never written";
        if (std::isnan(got[t].v[i])) return where + ": it is NaN; hint: a number read from memory nobody wrote";
        break;
    }
    return diagnose(got, {wk, wv}, mistakes, shape);
}

// ---------------------------------------------------------------------------
// The whole model: its backward against finite differences of its loss.
// "" or the first gradient that disagrees. A tiny LIMe: 3 layers, GQA (H = 4,
// R = 2), routers drawn at random so that every source layer counts.
inline std::string model_finite_differences(bool separate) {
    Config c;
    c.V = 11, c.L = 3, c.d = 16, c.H = 4, c.R = 2, c.hd = 4, c.F = 24, c.T = 6, c.router_kv_separate = separate;
    Model m;
    std::string err = model_create(&m, c, 2, DEVICE_CPU);
    if (!err.empty()) return err;
    model_init(&m, 7);
    Rng rng(11);
    for (int l = 1; l < c.L; l++)
        for (float* w : {m.p.layer[l].router, m.p.layer[l].router_v})
            for (int e = 0; w && e < c.R * (l + 1) * c.R; e++) w[e] = 0.5f * (float)rng.normal();
    int N = 2 * c.T;
    std::vector<int> tokens(N), targets(N);
    for (int n = 0; n < N; n++) tokens[n] = (int)rng.below(c.V), targets[n] = (int)rng.below(c.V);
    std::vector<float> mask(N, 1.0f);
    auto loss = [&] { return model_forward(&m, tokens.data(), targets.data(), mask.data(), 2, c.T); };
    loss();
    model_backward(&m);
    std::vector<float> grads(m.grads, m.grads + m.n_params);
    struct Probe { const char* name; float* p; size_t n; };
    std::vector<Probe> probes = {{"layer 2 router", m.p.layer[2].router, (size_t)c.R * 3 * c.R},
                                 {"layer 0 Wk (reached only through the routers and its own attention)",
                                  m.p.layer[0].Wk, (size_t)c.R * c.hd * c.d},
                                 {"layer 1 Wv", m.p.layer[1].Wv, (size_t)c.R * c.hd * c.d}};
    if (separate) probes.insert(probes.begin() + 1, {"layer 2 value router", m.p.layer[2].router_v, (size_t)c.R * 3 * c.R});
    for (const Probe& pr : probes)
        for (int k = 0; k < 4; k++) {
            size_t e = rng.below(pr.n), at = pr.p + e - m.params;
            float keep = pr.p[e], h = 1e-2f;
            pr.p[e] = keep + h;
            double up = loss();
            pr.p[e] = keep - h;
            double down = loss();
            pr.p[e] = keep;
            double fd = (up - down) / (2 * h), g = grads[at];
            if (std::fabs(fd - g) > 0.05 * std::max(std::fabs(fd), std::fabs(g)) + 2e-3) {
                model_free(&m);
                return strf("d loss / d %s[%zu]: the backward and finite differences of the loss disagree", pr.name, e);
            }
        }
    model_free(&m);
    return "";
}
