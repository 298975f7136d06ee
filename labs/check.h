// labs/check.h — what the labs' checkers share: random inputs, one PASS or
// FAIL line per check, and the diagnosis of a wrong answer. A checker
// computes the outputs that each plausible mistake would give and says which
// one the student's output matches, naming the tensor and the first wrong
// index, never the right value.
#pragma once
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

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
#include "support/model/cpu_fast.h"

// ---------------------------------------------------------------------------
// Running the student's code. Each check runs in a child process (fork), never
// in the checker's own: the child sends the check's answer back through a pipe
// and only the parent prints PASS or FAIL and decides the exit status. So a
// crash, an endless loop or an exit() in the student's code ends only that
// check, with the reason (the signal, the time limit, the exit status), and
// nothing the student's code prints can pass for a verdict: the child's
// stdout is sent to stderr, which labs/run.sh shows apart from the verdicts.

// The seconds a check may take: LAB_TIMEOUT, else 60 (the slowest check takes
// a few seconds; an endless loop takes forever).
inline int lab_timeout_s() {
    const char* t = getenv("LAB_TIMEOUT");
    int s = t ? atoi(t) : 0;
    return s >= 1 && s <= 3600 ? s : 60;
}

// "" or the check's diagnosis, from run() in a child; or why the child gave none.
inline std::string run_in_child(const std::function<std::string()>& run, int timeout_s) {
    fflush(stdout);
    fflush(stderr);
    int fds[2];
    if (pipe(fds) != 0) return strf("the checker could not make a pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) return strf("the checker could not start the check: %s", strerror(errno));
    if (pid == 0) {  // the child: the student's code runs here
        setpgid(0, 0);  // its own group, so that whatever it starts is stopped with it
        close(fds[0]);
        dup2(2, 1);     // its prints go to stderr, never among the verdicts
        std::string answer = "R" + run();
        fflush(stdout);
        for (size_t done = 0; done < answer.size();) {
            ssize_t n = write(fds[1], answer.data() + done, answer.size() - done);
            if (n <= 0) _exit(3);
            done += (size_t)n;
        }
        _exit(0);
    }
    close(fds[1]);
    std::string got;
    bool timed_out = false;
    double deadline = now_ms() + 1000.0 * timeout_s;
    for (;;) {
        struct pollfd p = {fds[0], POLLIN, 0};
        int wait = (int)std::max(0.0, deadline - now_ms());
        int r = poll(&p, 1, wait);
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) { timed_out = true; break; }
        char buf[4096];
        ssize_t n = read(fds[0], buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;  // end of the answer: the child closed the pipe (or ended)
        got.append(buf, (size_t)n);
    }
    close(fds[0]);
    if (timed_out) kill(-pid, SIGKILL), kill(pid, SIGKILL);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    kill(-pid, SIGKILL);  // anything the student's code left running
    if (timed_out)
        return strf("your code did not finish within %d s and was stopped: an endless loop? (LAB_TIMEOUT=%d sets "
                    "the limit)", timeout_s, timeout_s);
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        const char* hint = sig == SIGSEGV || sig == SIGBUS ? ": a read or write outside an array? (step through it in gdb)"
                           : sig == SIGFPE             ? ": a division by zero?"
                           : sig == SIGABRT            ? ": an assert or abort() failed, or the heap was damaged"
                                                       : "";
        return strf("your code crashed: killed by signal %d (%s)%s", sig, strsignal(sig), hint);
    }
    if (!got.empty() && got[0] == 'R' && WIFEXITED(status) && WEXITSTATUS(status) == 0) return got.substr(1);
    return strf("your code ended the process (exit status %d) before the check finished: an exit() or _exit() "
                "call? return from the function instead", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

struct Lab {
    int passed = 0, failed = 0;
    std::string stuck;  // the first check that ran out of time: the rest are not run (each would wait as long)
    void pass(const std::string& check) {
        printf("PASS %s\n", check.c_str());
        passed++;
    }
    void fail(const std::string& check, const std::string& why) {
        printf("FAIL %s: %s\n", check.c_str(), one_line(why).c_str());
        failed++;
    }
    // One check: run() (the student's code and the comparison) in a child; "" from it passes.
    void check(const std::string& check, const std::function<std::string()>& run) {
        if (!stuck.empty()) return fail(check, "not run: " + stuck + " did not finish in time");
        std::string why = run_in_child(run, lab_timeout_s());
        if (why.find("did not finish within") != std::string::npos) stuck = check;
        why.empty() ? pass(check) : fail(check, why);
    }
    // The verdict is the parent's alone: its own counts, in its exit status and last line.
    int exit_status() const {
        printf("checks: %d passed, %d failed\n", passed, failed);
        fflush(stdout);
        return failed || !passed ? 1 : 0;
    }
};


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
