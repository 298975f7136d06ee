// tests/test_model.cpp — the model on the CPU: each op's backward against
// finite differences, LIMe with identity routers against LLaMa, AdamW and
// the schedule against hand-computed values, determinism.
//
// lime.cu is included, not linked, so that its static ops can be called.
#include "../lime.cu"

#include <sys/wait.h>
#include <unistd.h>

#include <functional>

#include "support/lib/cli.h"  // memory_available
#include "support/model/names.h"  // model_parse
#include "test.h"
#include "test_helpers.h"  // randv, tiny_config, FreeOnReturn

static double dot(const std::vector<float>& a, const std::vector<float>& b) {
    double s = 0;
    for (size_t i = 0; i < a.size(); i++) s += (double)a[i] * b[i];
    return s;
}

// Central differences of loss() with respect to up to `samples` entries of x,
// compared with the analytic gradient; returns the relative error |a-n|/|n|
// over the sampled entries. loss() is a weighted sum of an op's outputs,
// sum(y * w), so its gradient is the op's backward with dy = w. With `only`,
// the entries where it is 0 are left out (weights a router variant holds fixed).
// abs_rms (if given): the root mean square of analytic - numeric over the entries checked.
static double fd_error(std::vector<float>& x, const std::vector<float>& analytic, const std::function<double()>& loss, int samples = 40,
                       const std::vector<char>* only = nullptr, double* abs_rms = nullptr) {
    double num = 0, den = 0;
    int checked = 0;
    size_t step = std::max<size_t>(1, x.size() / samples);
    for (size_t i = 0; i < x.size(); i += step, checked++) {
        if (only && !(*only)[i]) { checked--; continue; }
        float keep = x[i], h = 1e-2f * std::max(1.0f, std::fabs(keep));
        x[i] = keep + h;
        double up = loss();
        x[i] = keep - h;
        double down = loss();
        x[i] = keep;
        double numeric = (up - down) / (2.0 * h);
        num += (analytic[i] - numeric) * (analytic[i] - numeric);
        den += numeric * numeric;
    }
    if (abs_rms) *abs_rms = std::sqrt(num / std::max(checked, 1));
    return std::sqrt(num / std::max(den, 1e-30));
}

static const double FD_TOL = 2e-3;  // float32 forward, h = 1e-2: the truncation error dominates

// ---------------------------------------------------------------------------

TEST(matmul_backward_matches_finite_differences) {
    int N = 7, C = 5, OC = 37;  // 37 columns: a full 32-wide tile and an edge tile
    std::vector<float> inp = randv(N * C, 1), W = randv(OC * C, 2), w = randv(N * OC, 3), out(N * OC);
    std::vector<float> dinp(N * C, 0), dW(OC * C, 0);
    auto loss = [&]() { matmul_forward(out.data(), inp.data(), W.data(), N, C, OC, false); return dot(out, w); };
    matmul_backward(dinp.data(), dW.data(), w.data(), inp.data(), W.data(), N, C, OC, true);
    double e1 = fd_error(inp, dinp, loss), e2 = fd_error(W, dW, loss);
    CHECK(e1 < FD_TOL, "matmul dinp: rel err %.2e", e1);
    CHECK(e2 < FD_TOL, "matmul dW: rel err %.2e", e2);
}

// add_dinp = false writes dinp: what it held does not matter; true adds to it.
TEST(matmul_backward_writes_or_adds_dinp) {
    int N = 4, C = 3, OC = 5;
    std::vector<float> inp = randv(N * C, 1), W = randv(OC * C, 2), dout = randv(N * OC, 3);
    std::vector<float> written(N * C, 9.0f), added(N * C, 1.0f), zero(N * C, 0.0f);
    matmul_backward(written.data(), nullptr, dout.data(), inp.data(), W.data(), N, C, OC, false);
    matmul_backward(added.data(), nullptr, dout.data(), inp.data(), W.data(), N, C, OC, true);
    matmul_backward(zero.data(), nullptr, dout.data(), inp.data(), W.data(), N, C, OC, true);
    int wrong = 0;
    for (int i = 0; i < N * C; i++) wrong += written[i] != zero[i] || added[i] != 1.0f + zero[i];
    CHECK(wrong == 0, "matmul_backward dinp: %d of %d values neither written (add_dinp false) nor added (true)", wrong, N * C);
}

TEST(matmul_forward_matches_naive_product) {
    int N = 9, C = 13, OC = 70;
    std::vector<float> inp = randv(N * C, 4), W = randv(OC * C, 5), out(N * OC), want(N * OC);
    matmul_forward(out.data(), inp.data(), W.data(), N, C, OC, false);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = 0;
            for (int c = 0; c < C; c++) s += (double)inp[n * C + c] * W[o * C + c];
            want[n * OC + o] = (float)s;
        }
    double e = rel_err(out.data(), want.data(), out.size());
    CHECK(e < 1e-6, "matmul out vs naive: rel err %.2e", e);
}

// The K and V projections are matmul's product, laid out per kv head: out[r, n, i] = (inp @ W^T)[n, r*hd + i].
// Same sums in the same order: the same bits, forward and backward (dout read alike).
TEST(kv_projection_is_the_product_written_per_kv_head) {
    int N = 7, C = 5, R = 3, hd = 4, OC = R * hd;
    std::vector<float> inp = randv(N * C, 11), W = randv(OC * C, 12), tokens(N * OC), heads(N * OC);
    matmul_forward(tokens.data(), inp.data(), W.data(), N, C, OC, false);
    kv_projection_forward(heads.data(), inp.data(), W.data(), N, C, R, hd);
    std::vector<float> dheads = randv(N * OC, 13), dtokens(N * OC);
    int wrong = 0;
    for (int n = 0; n < N; n++)
        for (int r = 0; r < R; r++)
            for (int i = 0; i < hd; i++) {
                size_t t = ((size_t)n * R + r) * hd + i, h = ((size_t)r * N + n) * hd + i;
                wrong += heads[h] != tokens[t];
                dtokens[t] = dheads[h];
            }
    std::vector<float> dinp_t(N * C, 0.5f), dinp_h = dinp_t, dW_t(OC * C, 0.25f), dW_h = dW_t;
    matmul_backward(dinp_t.data(), dW_t.data(), dtokens.data(), inp.data(), W.data(), N, C, OC, true);
    kv_projection_backward(dinp_h.data(), dW_h.data(), dheads.data(), inp.data(), W.data(), N, C, R, hd);
    CHECK(wrong == 0, "kv_projection_forward: %d of %d outputs differ from matmul_forward's, placed per head", wrong, N * OC);
    CHECK(dinp_h == dinp_t, "kv_projection_backward: dinp differs from matmul_backward's");
    CHECK(dW_h == dW_t, "kv_projection_backward: dW differs from matmul_backward's");
}

TEST(rmsnorm_backward_matches_finite_differences) {
    int N = 6, d = 10;
    std::vector<float> x = randv(N * d, 6), g = randv(d, 7), w = randv(N * d, 8), out(N * d), rstd(N);
    std::vector<float> dx(N * d, 0), dg(d, 0), part((size_t)CHUNKS * d, NAN);  // rmsnorm_backward zeroes its scratch
    auto loss = [&]() { rmsnorm_forward(out.data(), rstd.data(), nullptr, x.data(), g.data(), N, d, 1e-6f); return dot(out, w); };
    loss();
    rmsnorm_backward(dx.data(), dg.data(), w.data(), x.data(), g.data(), rstd.data(), N, d, part.data());
    double e1 = fd_error(x, dx, loss), e2 = fd_error(g, dg, loss);
    CHECK(e1 < FD_TOL, "rmsnorm dx: rel err %.2e", e1);
    CHECK(e2 < FD_TOL, "rmsnorm dg: rel err %.2e", e2);
}

TEST(rope_backward_matches_finite_differences) {
    int B = 2, T = 5, nh = 3, hd = 6;
    std::vector<float> cs(T * hd / 2), sn(T * hd / 2);
    rope_tables(cs.data(), sn.data(), T, hd, 10000.0f);
    std::vector<float> x = randv(B * T * nh * hd, 9), w = randv(x.size(), 10), y;
    auto loss = [&]() { y = x; rope_forward(y.data(), y.data(), cs.data(), sn.data(), B, T, nh, hd); return dot(y, w); };
    std::vector<float> dx = w;
    rope_backward(dx.data(), dx.data(), cs.data(), sn.data(), B, T, nh, hd, false);
    double e = fd_error(x, dx, loss);
    CHECK(e < FD_TOL, "rope dx: rel err %.2e", e);
}

TEST(rope_position_zero_is_identity_and_rotation_keeps_norm) {
    int T = 4, hd = 8;
    std::vector<float> cs(T * hd / 2), sn(T * hd / 2);
    rope_tables(cs.data(), sn.data(), T, hd, 10000.0f);
    std::vector<float> x = randv(T * hd, 11), y = x;
    rope_forward(y.data(), y.data(), cs.data(), sn.data(), 1, T, 1, hd);
    for (int i = 0; i < hd; i++) CHECK(y[i] == x[i], "rope at t=0 changed entry %d: %g -> %g", i, x[i], y[i]);
    for (int t = 1; t < T; t++) {
        double nx = 0, ny = 0;
        for (int i = 0; i < hd; i++) { nx += x[t * hd + i] * x[t * hd + i]; ny += y[t * hd + i] * y[t * hd + i]; }
        CHECK(std::fabs(nx - ny) < 1e-5 * nx, "rope at t=%d changed the norm: %g -> %g", t, nx, ny);
    }
}

// The router at layer l = 2 of a 3-layer buffer, with R kv heads. `learned`:
// the source layers whose columns get a gradient (router_learned); the others
// must get exactly none. `separate`: one router for keys, another for values.
static void check_router(int R, RouterSpan learned = RouterSpan{0, 0}, bool separate = false) {
    int l = 2, N = 5, hd = 4, J = (l + 1) * R;
    size_t layer = (size_t)N * R * hd;
    std::vector<float> Wk = randv(R * J, 12), Wv = separate ? randv(R * J, 17) : Wk, Kb = randv(3 * layer, 13), Vb = randv(3 * layer, 14);
    std::vector<float> wk = randv(layer, 15), wv = randv(layer, 16), Kr(layer), Vr(layer);
    std::vector<float> dWk(R * J, 0), dWv(R * J, 0), dKb(3 * layer, 0), dVb(3 * layer, 0);
    float *wvals = separate ? Wv.data() : Wk.data(), *dwvals = separate ? dWv.data() : dWk.data();  // the values' router
    auto loss = [&]() {
        router_forward(Kr.data(), Wk.data(), Kb.data(), l, N, R, hd);
        router_forward(Vr.data(), wvals, Vb.data(), l, N, R, hd);
        return dot(Kr, wk) + dot(Vr, wv);
    };
    router_backward(dWk.data(), dKb.data(), wk.data(), Wk.data(), Kb.data(), l, learned, N, R, hd);
    router_backward(dwvals, dVb.data(), wv.data(), wvals, Vb.data(), l, learned, N, R, hd);
    std::vector<char> on(R * J);
    for (int i = 0; i < R * J; i++) on[i] = learned.has(i % J / R);
    double e1 = fd_error(Wk, dWk, loss, 40, &on), e2 = fd_error(Kb, dKb, loss), e3 = fd_error(Vb, dVb, loss);
    CHECK(e1 < FD_TOL, "router dW%s (R=%d, learned <%d or >=%d): rel err %.2e", separate ? "k" : "", R, learned.below,
          learned.from, e1);
    CHECK(e2 < FD_TOL, "router dKbuf (R=%d): rel err %.2e", R, e2);
    CHECK(e3 < FD_TOL, "router dVbuf (R=%d): rel err %.2e", R, e3);
    if (separate) {
        double e4 = fd_error(Wv, dWv, loss, 40, &on);
        CHECK(e4 < FD_TOL, "router dWv (R=%d, learned <%d or >=%d): rel err %.2e", R, learned.below, learned.from, e4);
    }
    for (int i = 0; i < R * J; i++)
        CHECK(on[i] || (dWk[i] == 0 && dWv[i] == 0), "router column %d of a fixed source layer got gradient %g / %g", i % J, dWk[i], dWv[i]);
}
TEST(router_backward_matches_finite_differences_R2) { check_router(2); }
TEST(router_backward_matches_finite_differences_R1) { check_router(1); }
TEST(router_backward_masked_matches_finite_differences) { check_router(2, RouterSpan{1, 2}); }  // layers 0 and 2 learn, 1 is fixed
TEST(router_backward_nothing_learned_gives_no_weight_gradient) { check_router(2, RouterSpan{0, 3}); }  // average, frozen
TEST(router_backward_separate_kv_matches_finite_differences) { check_router(2, RouterSpan{0, 0}, true); }
TEST(router_backward_separate_kv_masked_matches_finite_differences) { check_router(1, RouterSpan{0, 1}, true); }  // layers 1 and 2

TEST(router_with_identity_block_returns_own_layer) {
    int l = 1, N = 3, R = 2, hd = 4, J = (l + 1) * R;
    size_t layer = (size_t)N * R * hd;
    std::vector<float> W(R * J, 0), Kb = randv(2 * layer, 17), Vb = randv(2 * layer, 18), Kr(layer), Vr(layer);
    for (int r = 0; r < R; r++) W[r * J + l * R + r] = 1;  // [0 | I]
    router_forward(Kr.data(), W.data(), Kb.data(), l, N, R, hd);
    router_forward(Vr.data(), W.data(), Vb.data(), l, N, R, hd);
    CHECK(rel_err(Kr.data(), Kb.data() + layer, layer) == 0, "router [0 | I] keys differ from layer %d's own", l);
    CHECK(rel_err(Vr.data(), Vb.data() + layer, layer) == 0, "router [0 | I] values differ from layer %d's own", l);
}

static void check_attention(int H, int R) {
    int B = 2, T = 6, hd = 4;
    size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * R * hd;
    std::vector<float> q = randv(nq, 19), k = randv(nk, 20), v = randv(nk, 21), w = randv(nq, 22);
    std::vector<float> out(nq), att((size_t)B * H * T * T);
    std::vector<float> dq(nq), dk(nk, 0), dv(nk, 0);
    auto loss = [&]() {
        attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), Heads{B, T, H, R, hd, 0});
        return dot(out, w);
    };
    loss();
    attention_backward(dq.data(), dk.data(), dv.data(), w.data(), q.data(), k.data(), v.data(), att.data(), Heads{B, T, H, R, hd, 0});
    double e1 = fd_error(q, dq, loss), e2 = fd_error(k, dk, loss), e3 = fd_error(v, dv, loss);
    CHECK(e1 < FD_TOL, "attention dq (H=%d R=%d): rel err %.2e", H, R, e1);
    CHECK(e2 < FD_TOL, "attention dk (H=%d R=%d): rel err %.2e", H, R, e2);
    CHECK(e3 < FD_TOL, "attention dv (H=%d R=%d): rel err %.2e", H, R, e3);
}
TEST(attention_backward_matches_finite_differences_full) { check_attention(2, 2); }
TEST(attention_backward_matches_finite_differences_gqa) { check_attention(4, 2); }
TEST(attention_backward_matches_finite_differences_R1) { check_attention(3, 1); }

TEST(attention_is_causal) {
    int B = 1, T = 5, H = 2, R = 1, hd = 4;
    size_t nq = (size_t)T * H * hd, nk = (size_t)T * R * hd;
    std::vector<float> q = randv(nq, 23), k = randv(nk, 24), v = randv(nk, 25), out(nq), out2(nq), att(H * T * T);
    attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), Heads{B, T, H, R, hd, 0});
    for (size_t i = (size_t)(T - 1) * R * hd; i < nk; i++) { k[i] += 5; v[i] -= 3; }  // change only the last position
    attention_forward(out2.data(), att.data(), q.data(), k.data(), v.data(), Heads{B, T, H, R, hd, 0});
    size_t before_last = (size_t)(T - 1) * H * hd;
    CHECK(rel_err(out2.data(), out.data(), before_last) == 0, "outputs before the last position changed when only its keys did");
}

// The CPU attention, plain and fast, against the formulas in double, for head
// sizes that take each of the fast path's ways (hd a multiple of 32, of 8, or
// neither) and lengths that leave partial blocks of rows and of 16 positions.
static void check_attention_reference(int B, int T, int H, int R, int hd, bool fast) {
    int n_rep = H / R;
    size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * R * hd;
    std::vector<float> q = randv(nq, 40), k = randv(nk, 41), v = randv(nk, 42), dout = randv(nq, 43), dk0 = randv(nk, 44), dv0 = randv(nk, 45);
    std::vector<float> out(nq), att((size_t)B * H * T * T), dq(nq), dk = dk0, dv = dv0;
    int threads = omp_get_max_threads();
    std::vector<float> scratch(attention_fast_scratch_floats(T, hd, threads), NAN);
    if (fast) {
        attention_forward_fast(out.data(), att.data(), q.data(), k.data(), v.data(), B, T, H, R, hd, scratch.data(), threads);
        attention_backward_fast(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), att.data(), B, T, H, R,
                                hd, scratch.data(), threads);
    } else {
        attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), Heads{B, T, H, R, hd, 0});
        attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), att.data(), Heads{B, T, H, R, hd, 0});
    }
    std::vector<float> want_out(nq), want_att(att.size()), want_dq(nq), want_dk(dk0), want_dv(dv0);
    std::vector<double> dkd(nk, 0), dvd(nk, 0);
    double scale = 1.0 / std::sqrt((double)hd);
    auto Q = [&](int b, int t, int h) { return &q[(((size_t)b * T + t) * H + h) * hd]; };
    auto KV = [&](const std::vector<float>& x, int b, int u, int r) { return &x[(((size_t)r * B + b) * T + u) * hd]; };  // (R, B, T, hd)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                int r = h / n_rep;
                std::vector<double> p(T, 0.0), dp(T, 0.0);
                double mx = -1e300, sum = 0, pdp = 0;
                for (int u = 0; u <= t; u++) {
                    double s = 0;
                    for (int i = 0; i < hd; i++) s += (double)Q(b, t, h)[i] * KV(k, b, u, r)[i];
                    p[u] = s * scale;
                    mx = std::max(mx, p[u]);
                }
                for (int u = 0; u <= t; u++) sum += p[u] = std::exp(p[u] - mx);
                const float* go = &dout[(((size_t)b * T + t) * H + h) * hd];
                for (int u = 0; u <= t; u++) {
                    p[u] /= sum;
                    for (int i = 0; i < hd; i++) dp[u] += (double)go[i] * KV(v, b, u, r)[i];
                    pdp += p[u] * dp[u];
                }
                for (int u = 0; u < T; u++) want_att[(((size_t)b * H + h) * T + t) * T + u] = (float)p[u];
                for (int i = 0; i < hd; i++) {
                    double o = 0, g = 0;
                    for (int u = 0; u <= t; u++) {
                        double ds = p[u] * (dp[u] - pdp);
                        o += p[u] * KV(v, b, u, r)[i];
                        g += ds * KV(k, b, u, r)[i] * scale;
                        dkd[(((size_t)r * B + b) * T + u) * hd + i] += ds * Q(b, t, h)[i] * scale;
                        dvd[(((size_t)r * B + b) * T + u) * hd + i] += p[u] * go[i];
                    }
                    want_out[(((size_t)b * T + t) * H + h) * hd + i] = (float)o;
                    want_dq[(((size_t)b * T + t) * H + h) * hd + i] = (float)g;
                }
            }
    for (size_t i = 0; i < nk; i++) { want_dk[i] = (float)(dk0[i] + dkd[i]); want_dv[i] = (float)(dv0[i] + dvd[i]); }
    double e1 = rel_err(out.data(), want_out.data(), nq), e2 = rel_err(att.data(), want_att.data(), att.size());
    double e3 = rel_err(dq.data(), want_dq.data(), nq), e4 = rel_err(dk.data(), want_dk.data(), nk), e5 = rel_err(dv.data(), want_dv.data(), nk);
    struct { const char* name; double err; } errs[] = {{"out", e1}, {"att", e2}, {"dq", e3}, {"dk", e4}, {"dv", e5}};
    for (auto& e : errs)
        CHECK(e.err < 1e-5, "%s attention vs double B=%d T=%d H=%d R=%d hd=%d: %s rel err %.1e", fast ? "fast" : "plain", B, T,
              H, R, hd, e.name, e.err);
}
TEST(attention_matches_double_hd8) { check_attention_reference(2, 37, 4, 2, 8, false); check_attention_reference(2, 37, 4, 2, 8, true); }
TEST(attention_matches_double_hd32) { check_attention_reference(1, 21, 2, 2, 32, false); check_attention_reference(1, 21, 2, 2, 32, true); }
TEST(attention_matches_double_hd6_T1) { check_attention_reference(2, 1, 3, 1, 6, false); check_attention_reference(2, 1, 3, 1, 6, true); }
TEST(attention_matches_double_hd48_T16) { check_attention_reference(1, 16, 2, 1, 48, false); check_attention_reference(1, 16, 2, 1, 48, true); }

// The CPU loops' e^x against double precision: within 2 ulp from -87 to 88,
// 0 below, infinity above, NaN through.
TEST(exp_fast_is_within_2_ulp) {
    double worst = 0;
    for (float x = -87.0f; x <= 88.0f; x += 0.00137f) {
        double want = std::exp((double)x), ulp = std::nextafter((float)want, INFINITY) - (float)want;
        worst = std::max(worst, std::fabs(exp_fast(x) - want) / ulp);
    }
    CHECK(worst <= 2.0, "exp_fast: %.2f ulp from exp", worst);
    CHECK(exp_fast(0.0f) == 1.0f, "exp_fast(0) = %.9g, want 1", exp_fast(0.0f));
    CHECK(exp_fast(-100.0f) == 0.0f, "exp_fast(-100) = %g, want 0", exp_fast(-100.0f));
    CHECK(exp_fast(-INFINITY) == 0.0f, "exp_fast(-inf) = %g, want 0", exp_fast(-INFINITY));
    CHECK(std::isinf(exp_fast(100.0f)), "exp_fast(100) = %g, want inf", exp_fast(100.0f));
    CHECK(std::isnan(exp_fast(NAN)), "exp_fast(NaN) = %g, want NaN", exp_fast(NAN));
}

TEST(swiglu_backward_matches_finite_differences) {
    size_t n = 30;
    std::vector<float> gate = randv(n, 26, 3), up = randv(n, 27), w = randv(n, 28), out(n), dg(n), du(n);
    auto loss = [&]() { swiglu_forward(out.data(), gate.data(), up.data(), n); return dot(out, w); };
    swiglu_backward(dg.data(), du.data(), w.data(), gate.data(), up.data(), n);
    double e1 = fd_error(gate, dg, loss), e2 = fd_error(up, du, loss);
    CHECK(e1 < FD_TOL, "swiglu dgate: rel err %.2e", e1);
    CHECK(e2 < FD_TOL, "swiglu dup: rel err %.2e", e2);
}

TEST(crossentropy_backward_matches_finite_differences) {
    int N = 6, V = 7;
    std::vector<float> logits = randv(N * V, 29, 3), probs(N * V), nll(N), mask = {1, 0, 1, 1, 0, 1};
    std::vector<int> targets = {0, 3, 6, 2, 2, 5};
    auto loss = [&]() { return (double)crossentropy_forward(probs.data(), nll.data(), logits.data(), targets.data(), mask.data(), N, V); };
    loss();
    std::vector<float> dlogits = probs;
    crossentropy_backward(dlogits.data(), targets.data(), mask.data(), N, V);
    double e = fd_error(logits, dlogits, loss, 42);
    CHECK(e < FD_TOL, "cross-entropy dlogits: rel err %.2e", e);
    for (int i = V; i < 2 * V; i++) CHECK(dlogits[i] == 0, "masked position 1 has gradient %g at logit %d", dlogits[i], i - V);
}

TEST(crossentropy_all_masked_gives_zero_loss_and_gradient) {
    int N = 3, V = 4;
    std::vector<float> logits = randv(N * V, 30), probs(N * V), nll(N), mask(N, 0);
    std::vector<int> targets = {1, 2, 3};
    float loss = crossentropy_forward(probs.data(), nll.data(), logits.data(), targets.data(), mask.data(), N, V);
    crossentropy_backward(probs.data(), targets.data(), mask.data(), N, V);
    CHECK(loss == 0, "all-masked loss is %g, not 0", loss);
    for (float g : probs) CHECK(g == 0, "all-masked batch has a non-zero logit gradient %g", g);
}

TEST(embedding_backward_adds_rows_of_repeated_tokens) {
    int d = 3;
    std::vector<int> tokens = {2, 0, 2};
    std::vector<float> dout = {1, 2, 3, 4, 5, 6, 7, 8, 9}, dE(4 * d, 0);
    embedding_backward(dE.data(), dout.data(), tokens.data(), 3, d);
    float want[12] = {4, 5, 6, 0, 0, 0, 8, 10, 12, 0, 0, 0};
    for (int i = 0; i < 12; i++) CHECK(dE[i] == want[i], "dE[%d] = %g, want %g", i, dE[i], want[i]);
}


// Runs fn in a child process with its stderr captured: what it wrote, and its exit status (-1: killed, or it returned).
static std::string in_child(const std::function<void()>& fn, int* status) {
    int fd[2];
    if (pipe(fd) != 0) { *status = -1; return "pipe failed"; }
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 2);
        omp_set_num_threads(1);  // no thread pool in a forked child
        // fn exits part way through a step, by design: leave with its status at once, before the
        // sanitizer's exit-time leak check, which cannot stop the parent's OpenMP threads that
        // a forked child does not have ("False leaks are possible") and reports the model as lost
        on_exit([](int code, void*) { _exit(code); }, nullptr);
        alarm(20);
        fn();
        _exit(0);
    }
    close(fd[1]);
    std::string out;
    char buf[256];
    for (ssize_t got; (got = read(fd[0], buf, sizeof buf)) > 0;) out.append(buf, got);
    close(fd[0]);
    int ws = 0;
    waitpid(pid, &ws, 0);
    *status = WIFEXITED(ws) && WEXITSTATUS(ws) != 0 ? WEXITSTATUS(ws) : -1;
    return out;
}

// stage() checks every token id and target once, before any op indexes with them.
TEST(a_token_id_outside_the_vocabulary_stops_the_step_with_one_line) {
    Config c = tiny_config(ARCH_LIME, 2, 2);
    Model m;
    FreeOnReturn guard{&m};
    CHECK(model_create(&m, c, 1, DEVICE_CPU).empty(), "model_create failed");
    model_init(&m, 1);
    std::vector<int> tokens = {1, 2, 3, 11, 4, 5}, targets = {2, 3, 4, 5, -1, 6};
    std::vector<int> good = {1, 2, 3, 4, 5, 6};
    std::vector<float> mask(6, 1.0f);
    struct Case { const char* what; const int* tokens; const int* targets; const char* want; };
    const Case cases[] = {{"token id 11", tokens.data(), good.data(), "lime: token id 11 at position 3 of the batch is outside the vocabulary 0 .. 10"},
                          {"target -1", good.data(), targets.data(), "lime: target -1 at position 4 of the batch is outside the vocabulary 0 .. 10"}};
    for (const Case& k : cases) {
        int status = 0;
        std::string err = in_child([&] { model_forward(&m, k.tokens, k.targets, mask.data(), 1, 6); }, &status);
        CHECK(status > 0, "%s: model_forward did not exit with a non-zero status (stderr: %s)", k.what, err.c_str());
        CHECK(err.rfind(k.want, 0) == 0, "%s: stderr does not begin \"%s\": %s", k.what, k.want, err.c_str());
        CHECK(std::count(err.begin(), err.end(), '\n') == 1, "%s: stderr is not one line: %s", k.what, err.c_str());
    }
}
// ---------------------------------------------------------------------------
// The whole model

struct TinyBatch {
    int B = 2, T = 6;
    std::vector<int> tokens, targets;
    std::vector<float> mask;
    std::vector<float> valid;  // the regulariser's positions: row 0 all, row 1 its first 4 (the rest padding)
    explicit TinyBatch(int V) {
        Rng r(31);
        for (int i = 0; i < B * T; i++) {
            tokens.push_back((int)r.below(V));
            targets.push_back((int)r.below(V));
            mask.push_back(i % 5 == 0 ? 0.0f : 1.0f);
            valid.push_back(i < T || i % T < 4 ? 1.0f : 0.0f);
        }
    }
};

// Which entries of a router tensor (layer l, R kv heads) its variant learns: 1, or 0 where it holds them fixed.
static std::vector<char> learned_entries(const Config& c, int l, size_t numel) {
    if (c.arch != ARCH_LIME) return std::vector<char>(numel, 1);  // a peer's mixing weights all learn
    int J = (l + 1) * c.R;
    std::vector<char> on((size_t)c.R * J);
    for (int i = 0; i < c.R * J; i++) on[i] = router_learned(c, l).learns(i / J, i % J, c.R);
    return on;
}
static int layer_of(const std::string& name) { return atoi(name.c_str() + strlen("model.layers.")); }

// The model's gradient of a few entries of every tensor against central
// differences. Router weights a variant holds fixed keep their init values
// and must get a gradient of exactly 0. `spread`: how far the weights are moved
// from the init; the variants need more (0.2), or their small key gradients
// (average mixes each key in at 1/(l+1)) drown in float32 rounding.
static void check_model_gradients(const Config& c, float spread = 0.05f, const std::function<void(Model&)>& move = nullptr) {
    Model m;
    FreeOnReturn guard{&m};
    std::string err = model_create(&m, c, 2, DEVICE_CPU);
    CHECK(err.empty(), "model_create: %s", err.c_str());
    model_init(&m, 5);
    std::vector<float> init(m.params, m.params + m.n_params);
    for (size_t i = 0; i < m.n_params; i++) m.params[i] += spread * (float)std::sin(1.7 * i);  // away from the init's symmetries
    if (move) move(m);  // a model's own weights moved further
    for (const TensorSpec& t : m.specs)  // ... except the fixed router weights: they stay as initialised
        if (t.group == GROUP_ROUTER) {
            std::vector<char> on = learned_entries(c, layer_of(t.name), t.numel);
            for (size_t i = 0; i < t.numel; i++) if (!on[i]) m.params[t.offset + i] = init[t.offset + i];
        }
    TinyBatch b(c.V);
    const float* valid = c.entropy_reg > 0 ? b.valid.data() : nullptr;  // with the regulariser: its loss
    float loss0 = model_forward(&m, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T, valid);
    model_backward(&m);
    std::vector<float> grads(m.grads, m.grads + m.n_params);
    // What central differences of a float32 loss resolve at all: a few ulp of
    // the loss over 2h (h = 1e-2). A gradient that small (hc's scalar scales)
    // passes when it is within that of the difference; a wrong one of O(1) does not.
    double resolved = 4 * (std::nextafter(loss0, INFINITY) - loss0) / (2 * 1e-2);
    std::string name = model_name(c);
    for (const TensorSpec& t : m.specs) {
        std::vector<float> x(m.params + t.offset, m.params + t.offset + t.numel);
        std::vector<float> g(grads.begin() + t.offset, grads.begin() + t.offset + t.numel);
        std::vector<char> on = t.group == GROUP_ROUTER ? learned_entries(c, layer_of(t.name), t.numel) : std::vector<char>(t.numel, 1);
        auto loss = [&]() {
            std::copy(x.begin(), x.end(), m.params + t.offset);
            return (double)model_forward(&m, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T, valid);
        };
        double abs_rms = 0, e = fd_error(x, g, loss, 16, &on, &abs_rms);
        std::copy(x.begin(), x.end(), m.params + t.offset);
        // the loss is a float32 sum over the whole model: differences of it carry
        // rounding noise of ~1e-2 relative; a wrong backward is off by O(1)
        CHECK(e < 5e-2 || abs_rms < resolved, "%s model gradient of %s: rel err %.2e vs finite differences (abs %.1e, resolved %.1e)",
              name.c_str(), t.name.c_str(), e, abs_rms, resolved);
        for (size_t i = 0; i < t.numel; i++)
            CHECK(on[i] || g[i] == 0, "%s: fixed weight %zu of %s has gradient %g", name.c_str(), i, t.name.c_str(), g[i]);
    }
}
static void check_model_gradients(Arch arch, int H, int R) { check_model_gradients(tiny_config(arch, H, R)); }
// A lime config with a router variant (and 4 layers, where first-1 and last-1 differ from static).
static Config variant_config(const char* model, int H, int R) {
    Config c = tiny_config(ARCH_LIME, H, R);
    c.L = 4;
    if (!model_parse(model, &c)) c.L = 0;  // config_check refuses it, and the test says so
    return c;
}
TEST(lime_model_gradients_match_finite_differences_gqa) { check_model_gradients(ARCH_LIME, 4, 2); }
TEST(lime_model_gradients_match_finite_differences_R1) { check_model_gradients(ARCH_LIME, 2, 1); }
TEST(llama_model_gradients_match_finite_differences) { check_model_gradients(ARCH_LLAMA, 2, 2); }
TEST(lime_average_model_gradients_match_finite_differences) { check_model_gradients(variant_config("lime:average", 4, 2), 0.2f); }
TEST(lime_last1_model_gradients_match_finite_differences) { check_model_gradients(variant_config("lime:last-1", 4, 2), 0.2f); }
TEST(lime_first1_model_gradients_match_finite_differences) { check_model_gradients(variant_config("lime:first-1", 4, 2), 0.2f); }
TEST(lime_separate_kv_model_gradients_match_finite_differences) { check_model_gradients(variant_config("lime:separate", 4, 2), 0.2f); }
TEST(lime_last2_separate_kv_model_gradients_match_finite_differences) { check_model_gradients(variant_config("lime:last-2:separate", 2, 1), 0.2f); }

// Exact, beside the finite differences: a variant is the static router with
// some weights held fixed, so with the same weights it computes the same loss
// and the same gradients, except that the fixed router weights get none.
TEST(router_variant_gradients_equal_static_on_learned_weights) {
    for (const char* model : {"lime:average", "lime:last-1", "lime:first-1", "lime:last-2"}) {
        Config c = variant_config(model, 4, 2), s = variant_config("lime", 4, 2);
        Model v, st;
        FreeOnReturn guard{&v, &st};
        CHECK(model_create(&v, c, 2, DEVICE_CPU).empty(), "model_create %s failed", model);
        CHECK(model_create(&st, s, 2, DEVICE_CPU).empty(), "model_create lime failed");
        model_init(&v, 6);
        for (size_t i = 0; i < v.n_params; i++) v.params[i] += 0.05f * (float)std::sin(0.9 * i);
        memcpy(st.params, v.params, v.n_params * sizeof(float));  // one layout: the same tensors in the same order
        TinyBatch b(c.V);
        float lv = model_forward(&v, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T);
        float ls = model_forward(&st, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T);
        CHECK(lv == ls, "%s: loss %.9g, static with its weights %.9g", model, lv, ls);
        model_backward(&v);
        model_backward(&st);
        for (const TensorSpec& t : v.specs) {
            std::vector<char> on = t.group == GROUP_ROUTER ? learned_entries(c, layer_of(t.name), t.numel) : std::vector<char>(t.numel, 1);
            for (size_t i = 0; i < t.numel; i++) {
                float want = on[i] ? st.grads[t.offset + i] : 0.0f;
                CHECK(v.grads[t.offset + i] == want, "%s: gradient %zu of %s is %g, want %g", model, i, t.name.c_str(), v.grads[t.offset + i], want);
            }
        }
    }
}

TEST(resformer_model_gradients_match_finite_differences) { check_model_gradients(tiny_config(ARCH_RESFORMER, 4, 2), 0.2f); }
TEST(denseformer_model_gradients_match_finite_differences) { check_model_gradients(tiny_config(ARCH_DENSEFORMER, 4, 2), 0.2f); }
// DCA's scores w . g_j are small (the sources are small): w is moved to N(0, 5^2)
// as in the reference file, so that the scores matter and the ReLU cuts some.
TEST(dca_model_gradients_match_finite_differences) {
    check_model_gradients(tiny_config(ARCH_DCA, 4, 2), 0.2f, [](Model& m) {
        for (const TensorSpec& t : m.specs)
            for (size_t i = 0; t.name.find(".dynamic.") != std::string::npos && i < t.numel; i++)
                m.params[t.offset + i] = 5.0f * (float)std::sin(2.3 * (t.offset + i));
    });
}
TEST(lime_same_head_model_gradients_match_finite_differences) { check_model_gradients(variant_config("lime:same-head", 4, 2), 0.2f); }
TEST(lime_last2_same_head_model_gradients_match_finite_differences) {
    check_model_gradients(variant_config("lime:last-2:same-head", 4, 2), 0.2f);
}

// The mixture of whole arrays (support/study/mixing.cuh) against finite differences:
// y = sum_j a[j] X_j, X_0 = first, X_1.. = rest's arrays.
TEST(mix_backward_matches_finite_differences) {
    int K = 3;
    size_t n = 300;  // several of the CPU's CHUNKS slices
    std::vector<float> a = randv(K, 71), first = randv(n, 72), rest = randv((K - 1) * n, 73), w = randv(n, 74), y(n);
    auto loss = [&]() { mix_forward(y.data(), a.data(), first.data(), rest.data(), K, n); return dot(y, w); };
    std::vector<float> da(K, 0.0f), dfirst(n, 0.0f), drest((K - 1) * n, 0.0f), part((size_t)CHUNKS * K);
    mix_backward(dfirst.data(), drest.data(), da.data(), w.data(), a.data(), first.data(), rest.data(), K, n, part.data());
    double ea = fd_error(a, da, loss), e0 = fd_error(first, dfirst, loss), e1 = fd_error(rest, drest, loss);
    CHECK(ea < FD_TOL, "mix da: rel err %.2e", ea);
    CHECK(e0 < FD_TOL, "mix d first: rel err %.2e", e0);
    CHECK(e1 < FD_TOL, "mix d rest: rel err %.2e", e1);
}

// Two models of one seed: the study model (with its mixing weights set by
// `set`) and LLaMa compute the same logits, loss and gradients of every tensor
// LLaMa has, bit for bit.
static void check_equals_llama(Arch arch, const std::function<void(Model&)>& set) {
    Config cl = tiny_config(ARCH_LLAMA, 4, 2), cs = tiny_config(arch, 4, 2);
    Model llama, peer;
    FreeOnReturn guard{&llama, &peer};
    CHECK(model_create(&llama, cl, 2, DEVICE_CPU).empty(), "model_create llama failed");
    CHECK(model_create(&peer, cs, 2, DEVICE_CPU).empty(), "model_create %s failed", arch_name(arch));
    model_init(&llama, 3);
    model_init(&peer, 3);  // same seed: every shared tensor gets the same values
    set(peer);
    TinyBatch b(cl.V);
    float l1 = model_forward(&llama, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T);
    float l2 = model_forward(&peer, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T);
    size_t n = (size_t)b.B * b.T * cl.V;
    CHECK(memcmp(model_logits(&llama), model_logits(&peer), n * sizeof(float)) == 0, "%s logits differ from llama's",
          arch_name(arch));
    CHECK(l1 == l2, "%s loss %.9g, llama's %.9g", arch_name(arch), l2, l1);
    model_backward(&llama);
    model_backward(&peer);
    for (const TensorSpec& t : llama.specs)
        for (const TensorSpec& u : peer.specs)
            if (u.name == t.name)
                CHECK(memcmp(llama.grads + t.offset, peer.grads + u.offset, t.numel * sizeof(float)) == 0,
                      "%s gradient of %s differs from llama's", arch_name(arch), t.name.c_str());
}
TEST(resformer_with_value_residual_1_0_equals_llama) {
    check_equals_llama(ARCH_RESFORMER, [](Model& m) {
        for (const LayerParams& w : m.p.layer)
            if (w.value_residual) w.value_residual[0] = 1, w.value_residual[1] = 0;
    });
}
TEST(denseformer_at_initialisation_equals_llama) { check_equals_llama(ARCH_DENSEFORMER, [](Model&) {}); }

// MUDDFormer (support/study/muddformer.cuh). The weighted sums over the
// history against finite differences: X^c = sum_j (dw[t,c,j] + a[c,j]) Hs[j].
TEST(mudd_ways_backward_matches_finite_differences) {
    int N = 70, d = 5;  // several of the CPU's CHUNKS slices
    MuddShape m{4, 3, 12};
    size_t n = (size_t)N * d, Cs = 12;
    std::vector<float> dw = randv(N * Cs, 81), a = randv(Cs, 82), first = randv(n, 83), rest = randv(2 * n, 84);
    std::vector<float> w = randv(4 * n, 85), X(4 * n);
    auto loss = [&]() {
        MuddWays4 out{{X.data(), X.data() + n, X.data() + 2 * n, X.data() + 3 * n}};
        mudd_ways_forward(out, dw.data(), a.data(), MuddSources{first.data(), rest.data(), n}, m, N, d);
        return dot(X, w);
    };
    std::vector<float> dH(3 * n, 0.0f), ddw(N * Cs), da(Cs, 0.0f), part((size_t)CHUNKS * Cs);
    MuddWays4 dX{{w.data(), w.data() + n, w.data() + 2 * n, w.data() + 3 * n}};
    mudd_ways_backward(dH.data(), ddw.data(), dX, dw.data(), a.data(), MuddSources{first.data(), rest.data(), n}, m, N, d);
    mudd_static_backward(da.data(), ddw.data(), N, (int)Cs, part.data());
    std::vector<float> dfirst(dH.begin(), dH.begin() + n), drest(dH.begin() + n, dH.end());
    double e1 = fd_error(dw, ddw, loss), e2 = fd_error(a, da, loss), e3 = fd_error(first, dfirst, loss),
           e4 = fd_error(rest, drest, loss);
    CHECK(e1 < FD_TOL, "mudd ddw: rel err %.2e", e1);
    CHECK(e2 < FD_TOL, "mudd da (mudd.static.weight): rel err %.2e", e2);
    CHECK(e3 < FD_TOL, "mudd dHs[0]: rel err %.2e", e3);
    CHECK(e4 < FD_TOL, "mudd dHs[1..2]: rel err %.2e", e4);
}
// The norm without gain and the gelu (tanh form) against finite differences.
TEST(mudd_norm_and_gelu_backward_match_finite_differences) {
    int N = 9, d = 6;
    std::vector<float> x = randv(N * d, 86), w = randv(N * d, 87), z(N * d), r(N), dHs(N * d, 0.0f), dx(N * d);
    auto loss = [&]() {
        mudd_norm_forward(z.data(), r.data(), x.data(), N, d, 1e-6f);
        std::vector<float> h(N * d);
        mudd_gelu_forward(h.data(), z.data(), h.size());
        return dot(h, w);
    };
    loss();
    std::vector<float> dz(w);
    mudd_gelu_backward(dz.data(), z.data(), dz.size());  // dz = w * gelu'(z)
    mudd_norm_backward(dx.data(), nullptr, dHs.data(), dz.data(), x.data(), r.data(), N, d);
    double e = fd_error(x, dx, loss);
    CHECK(e < FD_TOL, "mudd norm and gelu: dx rel err %.2e", e);
}
// The plain loops share out positions (and a's gradient fixed slices): the same bits for 1, 2 and 3 threads.
TEST(mudd_ops_same_bits_for_1_to_3_threads) {
    int N = 53, d = 7;
    MuddShape m{4, 4, 16};
    size_t n = (size_t)N * d, Cs = 16;
    std::vector<float> dw = randv(N * Cs, 91), a = randv(Cs, 92), first = randv(n, 93), rest = randv(3 * n, 94),
                       dXv = randv(4 * n, 95);
    std::vector<std::vector<float>> runs;  // X, dH, ddw, da, z for 1, 2 and 3 threads
    int before = omp_get_max_threads();
    for (int threads = 1; threads <= 3; threads++) {
        omp_set_num_threads(threads);
        std::vector<float> X(4 * n), dH(4 * n, 0.5f), ddw(N * Cs), da(Cs, 0.25f), part((size_t)CHUNKS * Cs), z(n), r(N);
        MuddSources H{first.data(), rest.data(), n};
        mudd_ways_forward(MuddWays4{{X.data(), X.data() + n, X.data() + 2 * n, X.data() + 3 * n}}, dw.data(), a.data(), H, m, N, d);
        MuddWays4 dX{{dXv.data(), dXv.data() + n, dXv.data() + 2 * n, dXv.data() + 3 * n}};
        mudd_ways_backward(dH.data(), ddw.data(), dX, dw.data(), a.data(), H, m, N, d);
        mudd_static_backward(da.data(), ddw.data(), N, (int)Cs, part.data());
        mudd_norm_forward(z.data(), r.data(), first.data(), N, d, 1e-6f);
        X.insert(X.end(), dH.begin(), dH.end());
        X.insert(X.end(), ddw.begin(), ddw.end());
        X.insert(X.end(), da.begin(), da.end());
        X.insert(X.end(), z.begin(), z.end());
        runs.push_back(X);
    }
    omp_set_num_threads(before);
    for (int threads = 2; threads <= 3; threads++)
        CHECK(runs[threads - 1] == runs[0], "mudd ops: the ways, dHs, ddw, da (mudd.static.weight) or z differ between 1 and %d threads", threads);
}
TEST(muddformer_model_gradients_match_finite_differences) { check_model_gradients(tiny_config(ARCH_MUDDFORMER, 4, 2), 0.2f); }
TEST(muddformer_kv_model_gradients_match_finite_differences) {
    Config c = tiny_config(ARCH_MUDDFORMER, 4, 2);
    c.mudd_ways = MUDD_KV;
    check_model_gradients(c, 0.2f);
}
// At initialisation (W2 = 0, a one-hot on the newest state, g_k = g_v = g_attn = 1) every way is
// Hs[l+1]: the logits and loss are LLaMa's bit for bit; the gradients are LLaMa's to rounding (the
// history's sums add zeros in another order), and g_attn's is split into the three gains'.
static void check_mudd_is_llama_at_init(MuddWays ways) {
    Config cl = tiny_config(ARCH_LLAMA, 4, 2), cm = tiny_config(ARCH_MUDDFORMER, 4, 2);
    cm.mudd_ways = ways;
    Model llama, mudd;
    FreeOnReturn guard{&llama, &mudd};
    CHECK(model_create(&llama, cl, 2, DEVICE_CPU).empty(), "model_create llama failed");
    CHECK(model_create(&mudd, cm, 2, DEVICE_CPU).empty(), "model_create %s failed", model_name(cm).c_str());
    model_init(&llama, 3);
    model_init(&mudd, 3);
    TinyBatch b(cl.V);
    float l1 = model_forward(&llama, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T);
    float l2 = model_forward(&mudd, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T);
    std::string named = model_name(cm);
    const char* name = named.c_str();
    CHECK(memcmp(model_logits(&llama), model_logits(&mudd), (size_t)b.B * b.T * cl.V * sizeof(float)) == 0,
          "%s logits differ from llama's", name);
    CHECK(l1 == l2, "%s loss %.9g, llama's %.9g", name, l2, l1);
    model_backward(&llama);
    model_backward(&mudd);
    auto grad = [](Model& m, const std::string& tensor) -> std::vector<float> {
        for (const TensorSpec& t : m.specs)
            if (t.name == tensor) return std::vector<float>(m.grads + t.offset, m.grads + t.offset + t.numel);
        return {};
    };
    for (const TensorSpec& t : llama.specs) {
        std::vector<float> want = grad(llama, t.name), got = grad(mudd, t.name);
        std::string base = t.name.substr(0, t.name.rfind("input_layernorm.weight"));
        if (t.name.find("input_layernorm.weight") != std::string::npos && layer_of(t.name) >= 1) {
            std::vector<float> k = grad(mudd, base + "input_layernorm_k.weight"), v = grad(mudd, base + "input_layernorm_v.weight");
            CHECK(k.size() == got.size() && v.size() == got.size(), "%s has no input_layernorm_k/_v beside %s", name, t.name.c_str());
            for (size_t i = 0; i < got.size(); i++) got[i] += k[i] + v[i];  // the three gains' sum is LLaMa's
        }
        double e = rel_err(got.data(), want.data(), want.size());
        CHECK(got.size() == want.size() && e < 1e-5, "%s gradient of %s: rel err %.2e against llama's", name, t.name.c_str(), e);
    }
    std::vector<float> w1 = grad(mudd, "model.layers.0.mudd.w1.weight"), w2 = grad(mudd, "model.layers.0.mudd.w2.weight");
    CHECK(std::all_of(w1.begin(), w1.end(), [](float g) { return g == 0; }), "%s: mudd.w1 of layer 0 has a gradient at the first step (W2 = 0)", name);
    CHECK(std::any_of(w2.begin(), w2.end(), [](float g) { return g != 0; }), "%s: mudd.w2 of layer 0 has no gradient", name);
}
TEST(muddformer_at_initialisation_computes_llamas_logits_exactly) { check_mudd_is_llama_at_init(MUDD_QKVR); }
TEST(muddformer_kv_at_initialisation_computes_llamas_logits_exactly) { check_mudd_is_llama_at_init(MUDD_KV); }

// MUDD-KV is a qkvr model whose Q and R ways read the newest state: copy a
// trained-looking kv model's K and V rows into a qkvr model (its W1's first
// 2s hidden units, W2's K and V rows on them), pin the Q and R rows (W2 = 0,
// a one-hot on the newest source; the last block's R way too) and the two
// models give the same logits.
TEST(muddformer_kv_q_and_r_ways_read_the_newest_state) {
    Config ck = tiny_config(ARCH_MUDDFORMER, 4, 2), cq = ck;
    ck.mudd_ways = MUDD_KV;
    Model kv, qkvr;
    FreeOnReturn guard{&kv, &qkvr};
    CHECK(model_create(&kv, ck, 2, DEVICE_CPU).empty(), "model_create muddformer:kv failed");
    CHECK(model_create(&qkvr, cq, 2, DEVICE_CPU).empty(), "model_create muddformer failed");
    model_init(&kv, 7);
    model_init(&qkvr, 7);
    for (size_t i = 0; i < kv.n_params; i++) kv.params[i] += 0.2f * (float)std::sin(1.3 * i);  // every weight moved
    auto find = [](Model& m, const std::string& name) -> float* {
        for (const TensorSpec& t : m.specs) if (t.name == name) return m.params + t.offset;
        return nullptr;
    };
    for (const TensorSpec& t : qkvr.specs)  // the LLaMa tensors and the gains: the same
        if (t.name.find(".mudd.") == std::string::npos) memcpy(qkvr.params + t.offset, find(kv, t.name), t.numel * sizeof(float));
    int d = cq.d;
    for (int l = 0; l < cq.L - 1; l++) {
        int s = l + 2, Kk = 2 * s, Kq = 4 * s;
        std::string p = "model.layers." + std::to_string(l) + ".mudd.";
        float *W1k = find(kv, p + "w1.weight"), *W2k = find(kv, p + "w2.weight"), *ak = find(kv, p + "static.weight");
        float *W1q = find(qkvr, p + "w1.weight"), *W2q = find(qkvr, p + "w2.weight"), *aq = find(qkvr, p + "static.weight");
        memcpy(W1q, W1k, (size_t)Kk * d * sizeof(float));  // hidden units 0 .. 2s-1; the rest reach nothing
        memset(W2q, 0, (size_t)4 * s * Kq * sizeof(float));
        for (int j = 0; j < s; j++) {
            for (int c : {0, 3}) aq[c * s + j] = j == s - 1 ? 1.0f : 0.0f;  // Q and R: the newest state
            for (int c = 0; c < 2; c++) {  // kv's K, V (rows c*s + j) are qkvr's ways 1, 2
                aq[(c + 1) * s + j] = ak[c * s + j];
                for (int k = 0; k < Kk; k++) W2q[(size_t)((c + 1) * s + j) * Kq + k] = W2k[(size_t)(c * s + j) * Kk + k];
            }
        }
    }
    std::string last = "model.layers." + std::to_string(cq.L - 1) + ".mudd.";
    float *W2l = find(qkvr, last + "w2.weight"), *al = find(qkvr, last + "static.weight");
    int sl = cq.L + 1;
    memset(W2l, 0, (size_t)sl * 4 * sl * sizeof(float));
    for (int j = 0; j < sl; j++) al[j] = j == sl - 1 ? 1.0f : 0.0f;
    TinyBatch b(ck.V);
    float l1 = model_forward(&kv, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T);
    float l2 = model_forward(&qkvr, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T);
    double e = rel_err(model_logits(&qkvr), model_logits(&kv), (size_t)b.B * b.T * ck.V);
    CHECK(e < 1e-6, "muddformer with Q and R pinned to the newest state: logits rel err %.2e against muddformer:kv's", e);
    CHECK(std::fabs(l1 - l2) <= 1e-6f * std::fabs(l1), "muddformer with Q and R pinned: loss %.9g, muddformer:kv's %.9g", l2, l1);
}

// DCA's GRN loops (support/study/dca.cuh, the CPU's only path) give the same
// bits at 1, 2 and 3 threads: the forward splits the tokens, the backward sums
// the weights' gradients over fixed slices, then the slices in order. 150
// tokens, d = 70 (a tile of 64 and a partial one), three sources.
TEST(dca_grn_same_bits_at_1_2_and_3_threads) {
    int C = 3, S = 3, N = 150, d = 70;
    size_t Nd = (size_t)N * d, nB = (size_t)S * d;
    GrnShape s = {C, S, N, d};
    auto G = randv(S * Nd, 1), B = randv(C * nB, 2), w = randv((size_t)C * d, 3, 0.5f), gain = randv(2 * (size_t)d, 4);
    auto dy0 = randv(Nd, 5), da = randv(2 * Nd, 6), dG0 = randv(S * Nd, 7);
    auto tensors = [&](float* Bs, float* ws, float* gains) {
        GrnTensors t = {};
        for (int c = 0; c < C; c++) t.B[c] = Bs + c * nB, t.w[c] = ws + (size_t)c * d;
        t.gain[0] = gains, t.gain[1] = gains + d;
        return t;
    };
    std::vector<float> want;
    int before = omp_get_max_threads();
    for (int threads = 1; threads <= 3; threads++) {
        omp_set_num_threads(threads);
        std::vector<float> y(C * Nd), z((size_t)C * N * S), a(2 * Nd), rstd(2 * N), dy = dy0, dG = dG0;
        std::vector<float> dB(C * nB, 0.5f), dw((size_t)C * d, 0.5f), dgain(2 * (size_t)d, 0.5f);
        std::vector<float> part(grn_cpu_scratch_floats(C, S, d));
        GrnIo io = {G.data(), y.data(), z.data(), a.data(), rstd.data()};
        dca_grn_forward(io, tensors(B.data(), w.data(), gain.data()), s, 1e-6f);
        dca_grn_backward(io, {dy.data(), da.data(), dG.data(), false, true}, tensors(B.data(), w.data(), gain.data()),
                         tensors(dB.data(), dw.data(), dgain.data()), s, part.data());
        std::vector<float> got;
        for (const std::vector<float>* v : {&y, &z, &a, &rstd, &dy, &dG, &dB, &dw, &dgain}) got.insert(got.end(), v->begin(), v->end());
        if (threads == 1) want = got;
        CHECK(got.size() == want.size() && memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0,
              "the GRN's forward and backward at %d threads differ from 1 thread's", threads);
    }
    omp_set_num_threads(before);
}

// DeepCrossAttention with B = 1 and w = 0 is LLaMa to rounding (docs/model.md): every
// GRN is the plain sum of the embedding and the blocks' outputs (a + MLP), where
// LLaMa adds a and the MLP's output to its state one at a time. Logits, loss and
// the gradients of LLaMa's tensors agree to float32's rounding; the q, k and v
// norms' gains (g_attn, g_k, g_v, all 1) share LLaMa's g_attn gradient between
// them. With its initial w (N(0, 0.02^2)), DCA is LLaMa up to the small terms
// relu(w . g_j) g_j: further off than rounding, within 1e-2.
TEST(dca_with_static_1_and_dynamic_0_computes_llama) {
    Config cl = tiny_config(ARCH_LLAMA, 4, 2), cd = tiny_config(ARCH_DCA, 4, 2);
    Model llama, dca;
    FreeOnReturn guard{&llama, &dca};
    CHECK(model_create(&llama, cl, 2, DEVICE_CPU).empty(), "model_create llama failed");
    CHECK(model_create(&dca, cd, 2, DEVICE_CPU).empty(), "model_create dca failed");
    model_init(&llama, 3);
    model_init(&dca, 3);  // same seed: every shared tensor gets the same values
    TinyBatch b(cl.V);
    size_t n = (size_t)b.B * b.T * cl.V;
    float l1 = model_forward(&llama, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T);
    std::vector<float> want(model_logits(&llama), model_logits(&llama) + n);
    float l0 = model_forward(&dca, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T);
    double e0 = rel_err(model_logits(&dca), want.data(), n);
    CHECK(e0 > 1e-6 && e0 < 1e-2, "dca at initialisation: logits rel err %.2e from llama's, want the dynamic "
          "term's 1e-6 .. 1e-2 (loss %.9g, llama's %.9g)", e0, l0, l1);
    for (const TensorSpec& t : dca.specs)
        if (t.name.find(".dynamic.weight") != std::string::npos) memset(dca.params + t.offset, 0, t.numel * sizeof(float));
    float l2 = model_forward(&dca, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T);
    double e = rel_err(model_logits(&dca), want.data(), n);
    CHECK(e < 1e-6, "dca with w = 0: logits rel err %.2e from llama's", e);
    CHECK(std::fabs(l2 - l1) < 1e-6 * l1, "dca with w = 0: loss %.9g, llama's %.9g", l2, l1);
    model_backward(&llama);
    model_backward(&dca);
    auto grad = [](Model& m, const std::string& name) {
        for (const TensorSpec& t : m.specs)
            if (t.name == name) return std::vector<float>(m.grads + t.offset, m.grads + t.offset + t.numel);
        return std::vector<float>();
    };
    for (const TensorSpec& t : llama.specs) {
        std::vector<float> got = grad(dca, t.name), ref = grad(llama, t.name);
        size_t at = t.name.find("input_layernorm.weight");
        if (at != std::string::npos)  // the three norms' gains: their sum is llama's gain's
            for (const char* kv : {"input_layernorm_k.weight", "input_layernorm_v.weight"}) {
                std::vector<float> part = grad(dca, t.name.substr(0, at) + kv);
                for (size_t i = 0; i < got.size() && i < part.size(); i++) got[i] += part[i];
            }
        double eg = got.size() == ref.size() ? rel_err(got.data(), ref.data(), ref.size()) : 1e30;
        CHECK(eg < 1e-5, "dca with w = 0: gradient of %s rel err %.2e from llama's", t.name.c_str(), eg);
    }
}

// The cross-head ablation: the weights that mix kv head r' into head r != r'
// are 0 from model_init and, trained, stay exactly 0; the learned ones move.
TEST(same_head_router_keeps_cross_head_weights_at_zero) {
    Config c = variant_config("lime:same-head", 4, 2);
    Model m;
    FreeOnReturn guard{&m};
    CHECK(model_create(&m, c, 2, DEVICE_CPU).empty(), "model_create failed");
    model_init(&m, 4);
    std::vector<float> init(m.params, m.params + m.n_params);
    TinyBatch b(c.V);
    AdamWConfig opt;
    for (int s = 0; s < 5; s++) model_train_step(&m, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T, opt, 1.0f);
    int moved = 0;
    for (int l = 1; l < c.L; l++) {
        int J = (l + 1) * c.R;
        const float* W = m.p.layer[l].router;
        for (int i = 0; i < c.R * J; i++) {
            bool same = i % J % c.R == i / J;
            CHECK(same || W[i] == 0.0f, "layer %d router weight [%d, %d] mixes head %d into %d: %g, want exactly 0", l,
                  i / J, i % J, i % J % c.R, i / J, W[i]);
            moved += same && W[i] != init[W - m.params + i];
        }
    }
    CHECK(moved > 0, "no same-head router weight moved in 5 steps");
}

TEST(lime_with_identity_routers_equals_llama) {
    Config cl = tiny_config(ARCH_LLAMA, 4, 2), cm = tiny_config(ARCH_LIME, 4, 2);
    Model llama, lime;
    FreeOnReturn guard{&llama, &lime};
    CHECK(model_create(&llama, cl, 2, DEVICE_CPU).empty(), "model_create llama failed");
    CHECK(model_create(&lime, cm, 2, DEVICE_CPU).empty(), "model_create lime failed");
    model_init(&llama, 3);
    model_init(&lime, 3);  // same seed: every shared tensor gets the same values
    for (int l = 1; l < cm.L; l++) {
        int J = (l + 1) * cm.R;
        float* W = lime.p.layer[l].router;
        for (int i = 0; i < cm.R * J; i++) W[i] = 0;
        for (int r = 0; r < cm.R; r++) W[r * J + l * cm.R + r] = 1;  // [0 ... 0 | I]
    }
    TinyBatch b(cl.V);
    float l1 = model_forward(&llama, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T);
    float l2 = model_forward(&lime, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T);
    size_t n = (size_t)b.B * b.T * cl.V;
    double e = rel_err(model_logits(&lime), model_logits(&llama), n);
    CHECK(e == 0, "lime [0|I] logits differ from llama's: rel err %.2e", e);
    CHECK(l1 == l2, "lime [0|I] loss %.9g != llama loss %.9g", l2, l1);
    model_backward(&llama);
    model_backward(&lime);
    for (const TensorSpec& t : llama.specs) {  // every llama tensor exists in lime under the same name
        const TensorSpec* u = nullptr;
        for (const TensorSpec& s : lime.specs) if (s.name == t.name) u = &s;
        CHECK(u, "lime has no tensor %s", t.name.c_str());
        double eg = rel_err(lime.grads + u->offset, llama.grads + t.offset, t.numel);
        CHECK(eg < 1e-6, "lime [0|I] gradient of %s differs from llama's: rel err %.2e", t.name.c_str(), eg);
    }
}

// ---------------------------------------------------------------------------
// Hyper-Connections (--arch hc): each op against finite differences, then the model

// A sublayer's HC weights as separate vectors, n streams of width d, static or dynamic.
struct HcWeights {
    std::vector<float> sb, sa, afn, as, bfn, bs;
    HcWeights(int n, int d, bool dynamic, uint64_t seed) {
        sb = randv(n, seed), sa = randv((size_t)n * (n + 1), seed + 1);
        if (dynamic) afn = randv((size_t)d * (n + 1), seed + 2), as = randv(1, seed + 3), bfn = randv(d, seed + 4), bs = randv(1, seed + 5);
    }
    HcParams view() {
        HcParams h = {sb.data(), sa.data(), nullptr, nullptr, nullptr, nullptr};
        if (!afn.empty()) h.alpha_fn = afn.data(), h.alpha_scale = as.data(), h.beta_fn = bfn.data(), h.beta_scale = bs.data();
        return h;
    }
};

static void check_hc_weights(bool dynamic) {
    int N = 5, n = 3, d = 6, K = n + 1;
    std::vector<float> X = randv((size_t)n * N * d, 40), wA = randv((size_t)N * n * K, 41), wb = randv((size_t)N * n, 42);
    HcWeights w(n, d, dynamic, 43), dw(n, d, dynamic, 43);
    for (auto* v : {&dw.sb, &dw.sa, &dw.afn, &dw.as, &dw.bfn, &dw.bs}) std::fill(v->begin(), v->end(), 0.0f);
    std::vector<float> Aw((size_t)N * n * K), bw((size_t)N * n), rstd((size_t)N * n), ta(Aw.size()), tb(bw.size());
    auto loss = [&]() {
        hc_weights_forward(Aw.data(), bw.data(), rstd.data(), ta.data(), tb.data(), X.data(), w.view(), N, n, d, 1e-6f);
        return dot(Aw, wA) + dot(bw, wb);
    };
    loss();
    std::vector<float> dX(X.size(), 0.0f), scratch((size_t)CHUNKS * (hc_weight_floats(n, d) + d), NAN);
    hc_weights_backward(dX.data(), dw.view(), wA.data(), wb.data(), X.data(), rstd.data(), ta.data(), tb.data(), w.view(), N, n, d,
                        scratch.data());
    const char* names[] = {"static_beta", "static_alpha", "dynamic_alpha_fn", "dynamic_alpha_scale", "dynamic_beta_fn", "dynamic_beta_scale"};
    std::vector<float>* params[] = {&w.sb, &w.sa, &w.afn, &w.as, &w.bfn, &w.bs};
    std::vector<float>* grads[] = {&dw.sb, &dw.sa, &dw.afn, &dw.as, &dw.bfn, &dw.bs};
    for (int i = 0; i < (dynamic ? 6 : 2); i++) {
        double e = fd_error(*params[i], *grads[i], loss);
        CHECK(e < FD_TOL, "hc weights d%s: rel err %.2e", names[i], e);
    }
    double e = dynamic ? fd_error(X, dX, loss) : 0;
    CHECK(e < FD_TOL, "hc weights dX: rel err %.2e", e);
    if (!dynamic)
        for (float g : dX) CHECK(g == 0, "static hc weights: dX %g, want 0 (static weights do not read the streams)", g);
}
TEST(hc_weights_backward_matches_finite_differences_dynamic) { check_hc_weights(true); }
TEST(hc_weights_backward_matches_finite_differences_static) { check_hc_weights(false); }

TEST(hc_width_backward_matches_finite_differences) {
    int N = 4, n = 3, d = 5, K = n + 1;
    std::vector<float> X = randv((size_t)n * N * d, 50), Aw = randv((size_t)N * n * K, 51), w = randv((size_t)K * N * d, 52);
    std::vector<float> M(w.size()), dX(X.size(), 7.0f), dA(Aw.size(), 7.0f);  // 7: both are written, not added to
    auto loss = [&]() { hc_width_forward(M.data(), X.data(), Aw.data(), N, n, d); return dot(M, w); };
    hc_width_backward(dX.data(), dA.data(), w.data(), X.data(), Aw.data(), N, n, d);
    double e1 = fd_error(X, dX, loss), e2 = fd_error(Aw, dA, loss);
    CHECK(e1 < FD_TOL, "hc width dX: rel err %.2e", e1);
    CHECK(e2 < FD_TOL, "hc width dA: rel err %.2e", e2);
}

TEST(hc_depth_backward_matches_finite_differences) {
    int N = 4, n = 3, d = 5;
    std::vector<float> y = randv((size_t)N * d, 60), M = randv((size_t)(n + 1) * N * d, 61), bw = randv((size_t)N * n, 62);
    std::vector<float> w = randv((size_t)n * N * d, 63), Xout(w.size());
    std::vector<float> dy(y.size(), 7.0f), db(bw.size(), 7.0f), dM(M.size(), 7.0f);
    auto loss = [&]() { hc_depth_forward(Xout.data(), y.data(), M.data(), bw.data(), N, n, d); return dot(Xout, w); };
    hc_depth_backward(dy.data(), db.data(), dM.data(), w.data(), y.data(), bw.data(), N, n, d);
    double e1 = fd_error(y, dy, loss), e2 = fd_error(bw, db, loss), e3 = fd_error(M, dM, loss);
    CHECK(e1 < FD_TOL, "hc depth dy: rel err %.2e", e1);
    CHECK(e2 < FD_TOL, "hc depth db: rel err %.2e", e2);
    CHECK(e3 < FD_TOL, "hc depth dM: rel err %.2e", e3);
    for (int e = 0; e < N * d; e++) CHECK(dM[e] == 0, "hc depth dM[0] entry %d is %g, want 0 (mixture 0 feeds the sublayer only)", e, dM[e]);
}

// hc_sum and hc_expand are each other's backward: <sum(X), w> = <X, expand(w)>.
TEST(hc_sum_and_expand_are_adjoint) {
    int n = 3;
    size_t Nd = 20;
    std::vector<float> X = randv(n * Nd, 70), w = randv(Nd, 71), x(Nd), W(n * Nd);
    hc_sum(x.data(), X.data(), n, Nd);
    hc_expand(W.data(), w.data(), n, Nd);
    double a = dot(x, w), b = dot(X, W);
    CHECK(std::fabs(a - b) < 1e-5 * std::fabs(b), "<hc_sum(X), w> = %.9g but <X, hc_expand(w)> = %.9g", a, b);
}

static Config hc_config(int n, bool dynamic, int H, int R) {
    Config c = tiny_config(ARCH_HC, H, R);
    c.hc_rate = n;
    c.hc_dynamic = dynamic;
    return c;
}
TEST(hc_dynamic_model_gradients_match_finite_differences) { check_model_gradients(hc_config(2, true, 2, 2), 0.2f); }
TEST(hc_static_gqa_model_gradients_match_finite_differences) { check_model_gradients(hc_config(3, false, 4, 2), 0.2f); }
// Static: with one stream, RMSNorm(a * X) = RMSNorm(X) makes the gradient of
// the input mixture's weight (alpha column 0, and dynamic_alpha_fn's column 0)
// nearly 0, below what float32 finite differences of the loss resolve.
TEST(hc_rate1_model_gradients_match_finite_differences) { check_model_gradients(hc_config(1, false, 2, 1), 0.2f); }

// a and b's loss, logits and, for every tensor of b's that a has too (same
// name), the gradient: all bit for bit. a and b are initialised with one seed.
static void check_same_model(const Config& ca, const Config& cb, const char* what) {
    Model a, b;
    FreeOnReturn guard{&a, &b};
    CHECK(model_create(&a, ca, 2, DEVICE_CPU).empty(), "%s: model_create of the first failed", what);
    CHECK(model_create(&b, cb, 2, DEVICE_CPU).empty(), "%s: model_create of the second failed", what);
    model_init(&a, 3);
    model_init(&b, 3);
    TinyBatch tb(ca.V);
    float la = model_forward(&a, tb.tokens.data(), tb.targets.data(), tb.mask.data(), tb.B, tb.T);
    float lb = model_forward(&b, tb.tokens.data(), tb.targets.data(), tb.mask.data(), tb.B, tb.T);
    CHECK(la == lb, "%s: loss %.9g vs %.9g", what, la, lb);
    size_t n = (size_t)tb.B * tb.T * ca.V;
    CHECK(memcmp(model_logits(&a), model_logits(&b), n * sizeof(float)) == 0, "%s: the logits differ (rel err %.2e)", what,
          rel_err(model_logits(&a), model_logits(&b), n));
    model_backward(&a);
    model_backward(&b);
    for (const TensorSpec& t : b.specs) {
        const TensorSpec* u = nullptr;
        for (const TensorSpec& s : a.specs) if (s.name == t.name) u = &s;
        if (!u) continue;  // a tensor only b has (hc's mixing weights beside llama)
        CHECK(memcmp(a.grads + u->offset, b.grads + t.offset, t.numel * sizeof(float)) == 0,
              "%s: the gradient of %s differs (rel err %.2e)", what, t.name.c_str(), rel_err(a.grads + u->offset, b.grads + t.offset, t.numel));
    }
}
TEST(hc_rate1_static_at_init_equals_llama_bit_for_bit) {
    check_same_model(hc_config(1, false, 4, 2), tiny_config(ARCH_LLAMA, 4, 2), "hc n=1 static vs llama");
}
TEST(hc_dynamic_at_init_equals_static_bit_for_bit) {
    check_same_model(hc_config(3, true, 4, 2), hc_config(3, false, 4, 2), "hc n=3 dynamic vs static");
}

TEST(hc_init_is_the_authors) {
    Config c = hc_config(2, true, 2, 2);
    Model m;
    FreeOnReturn guard{&m};
    CHECK(model_create(&m, c, 1, DEVICE_CPU).empty(), "model_create failed");
    model_init(&m, 9);
    CHECK(m.p.hc.size() == (size_t)2 * c.L, "%zu HC sublayers, want 2L = %d", m.p.hc.size(), 2 * c.L);
    for (int s = 0; s < 2 * c.L; s++) {
        const HcParams& h = m.p.hc[s];
        int n = c.hc_rate, K = n + 1, l = s / 2;
        for (int i = 0; i < n; i++) {
            CHECK(h.static_beta[i] == 1, "sublayer %d: static_beta[%d] = %g, want 1", s, i, h.static_beta[i]);
            for (int k = 0; k < K; k++) {
                float want = k == 0 ? (i == l % n) : (k == i + 1);
                CHECK(h.static_alpha[i * K + k] == want, "sublayer %d: static_alpha[%d, %d] = %g, want %g", s, i, k, h.static_alpha[i * K + k], want);
            }
        }
        for (int j = 0; j < c.d * K; j++) CHECK(h.alpha_fn[j] == 0, "sublayer %d: dynamic_alpha_fn entry %d is not 0", s, j);
        for (int j = 0; j < c.d; j++) CHECK(h.beta_fn[j] == 0, "sublayer %d: dynamic_beta_fn entry %d is not 0", s, j);
        CHECK(h.alpha_scale[0] == 0.01f, "sublayer %d: dynamic_alpha_scale %g, want 0.01", s, h.alpha_scale[0]);
        CHECK(h.beta_scale[0] == 0.01f, "sublayer %d: dynamic_beta_scale %g, want 0.01", s, h.beta_scale[0]);
    }
    for (const TensorSpec& t : m.specs) {
        bool hc = t.name.find(".hc_") != std::string::npos, dyn = t.name.find(".dynamic_") != std::string::npos;
        if (hc) CHECK(t.group == (dyn ? GROUP_MATRIX : GROUP_EMBED_GAIN), "%s is in AdamW group %d", t.name.c_str(), (int)t.group);
    }
}

// The memory estimate (memory_needed, from acts_carve) holds HC's n streams:
// x and xa n times wider, the mixtures M (n+1 per sublayer), and its parameters.
TEST(hc_memory_estimate_counts_the_streams) {
    int n = 3;
    Config l = tiny_config(ARCH_LLAMA, 4, 2), h = hc_config(n, true, 4, 2);
    size_t B = 2, BT = B * h.T, d = h.d, L = h.L;
    Acts a;
    std::vector<float> mem(acts_carve(&a, h, (int)B, nullptr));
    acts_carve(&a, h, (int)B, mem.data());
    CHECK((size_t)(a.xa - a.x) == (L + 1) * n * BT * d, "hc x holds %zu floats, want (L+1) n B T d = %zu", (size_t)(a.xa - a.x), (L + 1) * n * BT * d);
    double extra = memory_needed(h, (int)B, DEVICE_CPU, false) - memory_needed(l, (int)B, DEVICE_CPU, false);
    double streams = 4.0 * ((n - 1) * (2 * L + 2) * BT * d + 2 * L * (n + 1) * BT * d);  // x, xa and dx wider; M
    double params = 16.0 * 2 * L * (n + n * (n + 1) + d * (n + 1) + d + 2);             // weights, grads, Adam m, v
    CHECK(extra >= streams + params, "hc needs %.0f bytes more than llama, want at least %.0f (streams) + %.0f (params)", extra, streams, params);
    CHECK(param_count(h) - param_count(l) == 2 * L * (n + n * (n + 1) + d * (n + 1) + d + 2), "hc parameters %zu vs llama %zu", param_count(h), param_count(l));
}

TEST(router_init_is_uniform_with_identity_block) {
    Config c = tiny_config(ARCH_LIME, 4, 2);
    Model m;
    FreeOnReturn guard{&m};
    CHECK(model_create(&m, c, 1, DEVICE_CPU).empty(), "model_create failed");
    model_init(&m, 9);
    for (int l = 1; l < c.L; l++) {
        int J = (l + 1) * c.R;
        float b = std::sqrt(3.0f / J), *W = m.p.layer[l].router;
        for (int r = 0; r < c.R; r++)
            for (int j = 0; j < J; j++) {
                float w = W[r * J + j];
                if (j >= J - c.R) CHECK(w == (j - (J - c.R) == r ? 1.0f : 0.0f), "router %d [%d,%d] = %g, not the identity", l, r, j, w);
                else CHECK(std::fabs(w) <= b, "router %d [%d,%d] = %g outside +-%g", l, r, j, w, b);
            }
    }
    CHECK(m.p.layer[0].router == nullptr, "layer 0 has a router");
}

// ---------------------------------------------------------------------------
// Router variants (paper Table 7) and separate key/value routers

// A RouterSpan of layer l as a bit mask (bit l' set: source l' is in it), for the table below.
static uint64_t span_bits(RouterSpan s, int l) {
    uint64_t bits = 0;
    for (int src = 0; src <= l; src++) bits |= (uint64_t)s.has(src) << src;
    return bits;
}

TEST(router_sources_of_each_variant) {
    Config c = tiny_config(ARCH_LIME, 4, 2);
    c.L = 6;
    struct { const char* model; int l; uint64_t sources, learned; } cases[] = {
        {"lime", 4, 0b11111, 0b11111},          {"lime:average", 4, 0b11111, 0},       {"lime:last-1", 4, 0b10000, 0b10000},
        {"lime:last-2", 4, 0b11000, 0b11000},    {"lime:last-6", 3, 0b1111, 0b1111},    {"lime:first-1", 5, 0b110001, 0b110001},
        {"lime:first-2", 5, 0b110011, 0b110011}, {"lime:first-2", 2, 0b111, 0b111},     {"lime:first-1:separate", 3, 0b1101, 0b1101},
        {"lime:frozen", 4, 0b11111, 0},         {"lime:last-2:frozen", 4, 0b11000, 0},
    };
    for (auto& k : cases) {
        CHECK(model_parse(k.model, &c), "model_parse(%s) failed", k.model);
        CHECK(config_check(c).empty(), "%s refused: %s", k.model, config_check(c).c_str());
        uint64_t sources = span_bits(router_sources(c, k.l), k.l), learned = span_bits(router_learned(c, k.l), k.l);
        CHECK(sources == k.sources, "%s layer %d: sources %#llx, want %#llx", k.model, k.l,
              (unsigned long long)sources, (unsigned long long)k.sources);
        CHECK(learned == k.learned, "%s layer %d: learned %#llx, want %#llx", k.model, k.l,
              (unsigned long long)learned, (unsigned long long)k.learned);
        CHECK(model_name(c) == k.model, "model_name %s, want %s", model_name(c).c_str(), k.model);
    }
}

// An ablation that selects every weight at its shape (ablation_vacuous: issue 61, class 4) is
// lime itself: model_init gives it lime's parameters bit for bit (and it learns every weight),
// where an ablation at a shape that leaves something out gets other ones.
TEST(vacuous_ablations_are_lime_itself) {
    struct { const char* model; int L, H, R; bool vacuous; } cases[] = {
        {"lime:same-head", 3, 2, 1, true},  {"lime:same-head", 3, 2, 2, false}, {"lime:last-3", 3, 2, 2, true},
        {"lime:last-2", 3, 2, 2, false},    {"lime:first-1", 3, 2, 2, true},    {"lime:first-1", 4, 2, 2, false},
        {"lime:first-2", 4, 2, 2, true},    {"lime:last-4:frozen", 4, 2, 2, true}, {"lime:last-3:frozen", 4, 2, 2, false},
        {"lime:average", 2, 2, 1, false},
    };
    for (auto& k : cases) {
        Config c = tiny_config(ARCH_LIME, k.H, k.R), plain = c;
        c.L = plain.L = k.L;
        CHECK(model_parse(k.model, &c) && config_check(c).empty(), "%s at L=%d refused", k.model, k.L);
        std::string why = ablation_vacuous(c);
        CHECK(why.empty() != k.vacuous, "%s at L=%d, R=%d: ablation_vacuous says '%s'", k.model, k.L, k.R, why.c_str());
        if (c.router_frozen) plain.router_frozen = true;  // (frozen is no ablation of sources: the control beside it)
        Model a, b;
        FreeOnReturn ga{&a}, gb{&b};
        CHECK(model_create(&a, c, 1, DEVICE_CPU).empty() && model_create(&b, plain, 1, DEVICE_CPU).empty(),
              "model_create failed");
        model_init(&a, 3), model_init(&b, 3);
        bool same = memcmp(a.params, b.params, a.n_params * sizeof(float)) == 0;
        CHECK(same == k.vacuous, "%s at L=%d, R=%d: its initial parameters are %s lime's", k.model, k.L, k.R,
              same ? "the same as" : "other than");
    }
}

TEST(router_variant_names_are_checked) {
    Config c = tiny_config(ARCH_LIME, 4, 2);  // 3 layers
    for (const char* bad : {"bogus", "last-", "last-x", "first--1", "lime", "last-2 ", ""})
        CHECK(!router_parse(bad, &c), "router_parse accepted '%s'", bad);
    for (const char* bad : {"last-0", "first-0", "last-4"}) {
        CHECK(router_parse(bad, &c), "router_parse refused '%s'", bad);
        CHECK(config_check(c).find("J must be 1 .. 3") != std::string::npos, "--router %s: '%s'", bad, config_check(c).c_str());
    }
    Config l = tiny_config(ARCH_LLAMA, 4, 2);
    l.router = ROUTER_AVERAGE;
    CHECK(config_check(l).find("for --arch lime") != std::string::npos, "llama with a router: '%s'", config_check(l).c_str());
    l = tiny_config(ARCH_LLAMA, 4, 2);
    l.router_kv_separate = true;
    CHECK(config_check(l).find("for --arch lime") != std::string::npos, "llama with --router-kv separate: '%s'", config_check(l).c_str());
    for (const char* bad : {"llama:average", "lime:", "lime:sideways"}) CHECK(!model_parse(bad, &l), "model_parse accepted '%s'", bad);
}

// train --resume compares each shape flag typed with the checkpoint's own
// value (shape_flag_value): a flag without one would refuse the checkpoint's own.
TEST(shape_flag_value_gives_every_shape_flag) {
    Config same = tiny_config(ARCH_LIME, 4, 2);
    same.router_same_head = true;
    for (const Config& c : {tiny_config(ARCH_LLAMA, 4, 2), tiny_config(ARCH_LIME, 4, 2), same})
        for (const FlagSpec& f : SHAPE_FLAGS)
            CHECK(!shape_flag_value(c, f.name).empty(), "%s: no value for --%s", model_name(c).c_str(), f.name);
    CHECK(shape_flag_value(same, "router-heads") == "same", "lime:same-head's --router-heads: '%s', want same",
          shape_flag_value(same, "router-heads").c_str());
}

TEST(router_variant_init_zeroes_unread_layers_and_average_is_fixed) {
    for (const char* model : {"lime:last-1", "lime:first-1", "lime:average", "lime:last-2:separate"}) {
        Config c = tiny_config(ARCH_LIME, 4, 2), s = c;
        c.L = s.L = 4;
        model_parse(model, &c);
        Model m, st;
        FreeOnReturn guard{&m, &st};
        CHECK(model_create(&m, c, 1, DEVICE_CPU).empty(), "model_create %s failed", model);
        CHECK(model_create(&st, s, 1, DEVICE_CPU).empty(), "model_create lime failed");
        model_init(&m, 9);
        model_init(&st, 9);
        for (int l = 1; l < c.L; l++) {
            int J = (l + 1) * c.R;
            RouterSpan sources = router_sources(c, l);
            for (const float* W : {m.p.layer[l].router, m.p.layer[l].router_v}) {
                if (!W) continue;
                for (int r = 0; r < c.R; r++)
                    for (int j = 0; j < J; j++) {
                        float w = W[r * J + j], want = c.router == ROUTER_AVERAGE ? (j % c.R == r ? 1.0f / (l + 1) : 0.0f)
                                                       : sources.has(j / c.R) ? st.p.layer[l].router[r * J + j]  // static's value
                                                                                   : 0.0f;
                        CHECK(w == want, "%s router %d [%d,%d] = %g, want %g", model, l, r, j, w, want);
                    }
            }
        }
    }
}

// A few AdamW steps move every learned router weight and none that the variant holds fixed.
TEST(router_variant_fixed_weights_do_not_move_in_training) {
    for (const char* model : {"lime:average", "lime:last-1", "lime:first-1", "lime:last-2:separate", "lime:frozen",
                              "lime:last-2:frozen"}) {
        Config c = tiny_config(ARCH_LIME, 4, 2);
        c.L = 4;
        model_parse(model, &c);
        Model m;
        FreeOnReturn guard{&m};
        CHECK(model_create(&m, c, 2, DEVICE_CPU).empty(), "model_create failed");
        model_init(&m, 4);
        std::vector<float> before(m.params, m.params + m.n_params);
        TinyBatch b(c.V);
        AdamWConfig opt;
        for (int s = 0; s < 3; s++) model_train_step(&m, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T, opt, 1.0f);
        int moved = 0, fixed = 0;
        for (const TensorSpec& t : m.specs) {
            if (t.group != GROUP_ROUTER) continue;
            std::vector<char> on = learned_entries(c, layer_of(t.name), t.numel);
            for (size_t i = 0; i < t.numel; i++) {
                float now = m.params[t.offset + i], was = before[t.offset + i];
                if (on[i]) moved += now != was;
                else { fixed++; CHECK(now == was, "%s: fixed weight %zu of %s moved: %g -> %g", model, i, t.name.c_str(), was, now); }
            }
        }
        bool none = c.router == ROUTER_AVERAGE || c.router_frozen;
        CHECK(none ? moved == 0 : moved > 0, "%s: %d learned router weights moved", model, moved);
        CHECK(fixed > 0, "%s: no fixed router weights to check", model);
    }
}

// The paper's Fig. 6 goes to 128 layers: a 70-layer lime (past the 64 bits
// router_sources once had) is made, runs forward and backward, and its
// deepest router reaches layer 0's values.
TEST(lime_deeper_than_64_layers) {
    Config c = tiny_config(ARCH_LIME, 2, 1);
    c.L = 70;
    CHECK(config_check(c).empty(), "70-layer lime refused: %s", config_check(c).c_str());
    Model m;
    FreeOnReturn guard{&m};
    CHECK(model_create(&m, c, 2, DEVICE_CPU).empty(), "model_create of a 70-layer lime failed");
    model_init(&m, 5);
    TinyBatch b(c.V);
    float loss = model_forward(&m, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T);
    CHECK(std::isfinite(loss) && loss > 0, "70-layer lime: loss %g, want a positive number", loss);
    memset(m.grads, 0, m.n_params * sizeof(float));
    model_backward(&m);
    double top = 0, wv0 = 0;  // layer 69's router weight on source layer 0, layer 0's W_V
    for (int k = 0; k < c.R; k++) top += std::fabs(m.g.layer[69].router[k * 70 * c.R + k]);
    for (int i = 0; i < c.R * c.hd * c.d; i++) wv0 += std::fabs(m.g.layer[0].Wv[i]);
    CHECK(top > 0 && std::isfinite(top), "router of layer 69: gradient on source layer 0 is %g, want a positive number", top);
    CHECK(wv0 > 0 && std::isfinite(wv0), "layer 0 W_V gradient sum |.| is %g, want a positive number", wv0);
}

TEST(checkpoint_round_trip_of_a_router_variant) {
    Config c = tiny_config(ARCH_LIME, 4, 2);
    c.L = 4;
    model_parse("lime:last-2:separate:frozen", &c);
    Model m, back, other;
    FreeOnReturn guard{&m, &back, &other};
    CHECK(model_create(&m, c, 1, DEVICE_CPU).empty(), "model_create failed");
    model_init(&m, 8);
    // every weight moved (the two routers then differ) but the router entries last-2 holds at 0, which loading
    // checks (router_fixed_check; a frozen router's other values need the run's seed, which this file has not)
    Config unfrozen = c;
    unfrozen.router_frozen = false;
    for (const TensorSpec& t : m.specs)
        for (size_t i = 0; i < t.numel; i++) {
            int cols = t.shape.size() == 2 ? t.shape[1] : 1, r = (int)(i / cols), j = (int)(i % cols);
            if (t.group != GROUP_ROUTER || router_learned(unfrozen, cols / c.R - 1).learns(r, j, c.R))
                m.params[t.offset + i] += 0.01f * (float)std::cos(0.3 * (double)(t.offset + i));
        }
    std::string path = "/tmp/lime_test_variant_ckpt.safetensors";
    std::string err = model_save(&m, path, {}, true);
    CHECK(err.empty(), "model_save: %s", err.c_str());
    Config fc;
    std::map<std::string, std::string> meta;
    err = checkpoint_read_config(path, &fc, &meta);
    CHECK(err.empty(), "checkpoint_read_config: %s", err.c_str());
    CHECK(fc.router == ROUTER_LAST, "config read back as %s: not last-J", model_name(fc).c_str());
    CHECK(fc.router_j == 2, "config read back as %s: J = %d, want 2", model_name(fc).c_str(), fc.router_j);
    CHECK(fc.router_kv_separate, "config read back as %s: not separate", model_name(fc).c_str());
    CHECK(meta["config"].find("\"router\": \"last-2\", \"router_kv\": \"separate\"") != std::string::npos, "config JSON: %s",
          meta["config"].c_str());
    CHECK(model_create(&back, fc, 1, DEVICE_CPU).empty(), "model_create failed");
    err = model_load(&back, path, true);
    CHECK(err.empty(), "model_load: %s", err.c_str());
    CHECK(memcmp(back.params, m.params, 4 * m.n_params * sizeof(float)) == 0, "weights differ after a round trip");
    bool has_v = false;
    for (const TensorSpec& t : back.specs) has_v |= t.name == "model.layers.3.self_attn.router_v.weight";
    CHECK(has_v, "no value router in the loaded model");
    Config st = c;
    model_parse("lime", &st);  // static, shared: another model
    CHECK(model_create(&other, st, 1, DEVICE_CPU).empty(), "model_create failed");
    err = model_load(&other, path, false);
    for (const char* part : {"different model", "router"})
        CHECK(contains(err, part), "loading as static lime: the error lacks '%s': '%s'", part, err.c_str());
    remove(path.c_str());
}

TEST(config_without_router_reads_as_static_shared) {
    Config c = tiny_config(ARCH_LIME, 4, 2);
    std::string json = config_to_json(c);
    CHECK(json.find("\"router\": \"static\", \"router_kv\": \"shared\"") != std::string::npos, "lime config JSON: %s", json.c_str());
    size_t at = json.find(", \"router\"");
    std::string old = json.substr(0, at) + json.substr(json.find(", \"tie_word"));  // as written before the variants
    Config back;
    back.router = ROUTER_AVERAGE;
    back.router_kv_separate = true;
    CHECK(config_from_json(old, &back).empty(), "config without router refused");
    CHECK(back.router == ROUTER_STATIC, "config without router read as %s: not static", model_name(back).c_str());
    CHECK(!back.router_kv_separate, "config without router read as %s: not shared", model_name(back).c_str());
    CHECK(config_to_json(tiny_config(ARCH_LLAMA, 4, 2)).find("router") == std::string::npos, "llama config names a router");
    Config bad;
    CHECK(!config_from_json(json.replace(json.find("static"), 6, "sideways"), &bad).empty(), "router \"sideways\" accepted");
}

TEST(same_seed_same_losses) {
    Config c = tiny_config(ARCH_LIME, 4, 2);
    float losses[2][3];
    for (int run = 0; run < 2; run++) {
        Model m;
        FreeOnReturn guard{&m};
        CHECK(model_create(&m, c, 2, DEVICE_CPU).empty(), "model_create failed");
        model_init(&m, 42);
        TinyBatch b(c.V);
        AdamWConfig opt;
        for (int s = 0; s < 3; s++) {
            model_train_step(&m, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T, opt, 1.0f);
            float norm;
            model_metrics(&m, &losses[run][s], &norm);
        }
    }
    for (int s = 0; s < 3; s++) CHECK(losses[0][s] == losses[1][s], "step %d: loss %.9g then %.9g", s, losses[0][s], losses[1][s]);
}

// ---------------------------------------------------------------------------
// AdamW and the schedule against hand-computed values

TEST(adamw_first_step_matches_hand_values) {
    // one weight p = 1, gradient g = 0.5, lr 0.1, wd 0.1, b1 0.9, b2 0.95, eps 1e-8, step 1:
    // m = 0.05, v = 0.0125, mhat = 0.5, vhat = 0.25, p = 1 - 0.1*0.1*1 - 0.1 * 0.5 / (0.5 + 1e-8) = 0.89
    float p = 1, m = 0, v = 0, g = 0.5f;
    AdamWConfig o;
    o.lr = 0.1f; o.weight_decay = 0.1f;
    AdamWNumbers nums = adamw_numbers(o, 1.0f, 1);
    adamw(&p, &m, &v, &g, 1, nums.lr[GROUP_MATRIX], nums.weight_decay[GROUP_MATRIX], 1.0f, nums);
    CHECK(std::fabs(p - 0.89f) < 1e-6, "p after one step = %.9g, want 0.89", p);
    CHECK(std::fabs(m - 0.05f) < 1e-6, "m after one step = %g, want 0.05", m);
    CHECK(std::fabs(v - 0.0125f) < 1e-6, "v after one step = %g, want 0.0125", v);
}

TEST(adamw_groups_clip_and_decay) {
    Config c = tiny_config(ARCH_LIME, 2, 2);
    Model m;
    FreeOnReturn guard{&m};
    CHECK(model_create(&m, c, 1, DEVICE_CPU).empty(), "model_create failed");
    model_init(&m, 1);
    for (size_t i = 0; i < m.n_params; i++) m.grads[i] = 1.0f;  // norm = sqrt(n)
    std::vector<float> before(m.params, m.params + m.n_params);
    AdamWConfig o;
    o.lr = 0.01f; o.router_lr = 0.05f; o.weight_decay = 0.5f; o.grad_clip = 1.0f;
    float norm = model_update(&m, o, 0.5f);
    CHECK(std::fabs(norm - std::sqrt((float)m.n_params)) < 1e-3, "norm %g, want sqrt(%zu)", norm, m.n_params);
    // clipped gradients are all 1/sqrt(n) > 0; Adam's first step moves each weight by lr*factor (up to eps)
    for (const TensorSpec& t : m.specs) {
        float lr = (t.group == GROUP_ROUTER ? o.router_lr : o.lr) * 0.5f;
        float wd = t.group == GROUP_MATRIX ? o.weight_decay : 0.0f;
        size_t i = t.offset;
        float want = before[i] - lr * wd * before[i] - lr;
        CHECK(std::fabs(m.params[i] - want) < 1e-5, "%s[0] = %.7g, want %.7g (group %d)", t.name.c_str(), m.params[i], want, t.group);
    }
}

TEST(lr_schedule_warmup_then_linear_and_cosine) {
    CHECK(lr_factor(1, 10, 110, SCHED_LINEAR, 0) == 0.1f, "warmup step 1 of 10: %g", lr_factor(1, 10, 110, SCHED_LINEAR, 0));
    CHECK(lr_factor(10, 10, 110, SCHED_LINEAR, 0) == 1.0f, "end of warmup: %g", lr_factor(10, 10, 110, SCHED_LINEAR, 0));
    CHECK(std::fabs(lr_factor(60, 10, 110, SCHED_LINEAR, 0) - 0.5f) < 1e-6, "linear halfway: %g", lr_factor(60, 10, 110, SCHED_LINEAR, 0));
    CHECK(std::fabs(lr_factor(60, 10, 110, SCHED_COSINE, 0) - 0.5f) < 1e-6, "cosine halfway: %g", lr_factor(60, 10, 110, SCHED_COSINE, 0));
    CHECK(std::fabs(lr_factor(35, 10, 110, SCHED_COSINE, 0) - 0.5f * (1 + std::cos(M_PI * 0.25))) < 1e-6, "cosine quarter: %g",
          lr_factor(35, 10, 110, SCHED_COSINE, 0));
    CHECK(lr_factor(110, 10, 110, SCHED_LINEAR, 1e-6f) == 1e-6f, "linear end floors at min_lr_ratio: %g", lr_factor(110, 10, 110, SCHED_LINEAR, 1e-6f));
    CHECK(lr_factor(1, 0, 100, SCHED_LINEAR, 0) == 0.99f, "no warmup, first step: %g", lr_factor(1, 0, 100, SCHED_LINEAR, 0));
    CHECK(lr_factor(7, 0, 100, SCHED_CONSTANT, 0) == 1.0f, "constant: %g", lr_factor(7, 0, 100, SCHED_CONSTANT, 0));
}

TEST(config_check_refuses_impossible_shapes) {
    Config c = tiny_config(ARCH_LIME, 4, 2);
    CHECK(config_check(c).empty(), "a good config was refused: %s", config_check(c).c_str());
    Config bad = c; bad.H = 3; bad.hd = bad.d / 3;
    CHECK(config_check(bad).find("divisible") != std::string::npos, "d %% H: '%s'", config_check(bad).c_str());
    bad = c; bad.R = 3;
    CHECK(config_check(bad).find("divisible") != std::string::npos, "H %% R: '%s'", config_check(bad).c_str());
    bad = c; bad.d = 12; bad.H = 4; bad.R = 4; bad.hd = 3;
    CHECK(config_check(bad).find("odd") != std::string::npos, "odd head size: '%s'", config_check(bad).c_str());
}

// model_create refuses activations larger than the machine's MemAvailable.
TEST(memory_available_reads_meminfo) {
    char path[] = "/tmp/lime_meminfo_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp failed");
    const char text[] = "MemTotal:       16384000 kB\nMemFree:         1000 kB\nMemAvailable:    2048 kB\nBuffers:  1 kB\n";
    CHECK(write(fd, text, sizeof text - 1) == (ssize_t)(sizeof text - 1), "write failed");
    close(fd);
    size_t got = memory_available(path);
    remove(path);
    CHECK(got == 2048u * 1024, "MemAvailable 2048 kB read as %zu bytes", got);
    CHECK(memory_available("/nonexistent/meminfo") == 0, "a missing file should mean unknown (0)");
}

TEST(cpu_activations_beyond_available_memory_are_refused) {
    size_t available = memory_available("/proc/meminfo");
    if (!available) SKIP("no /proc/meminfo here");
    Config c = tiny_config(ARCH_LIME, 4, 2);
    c.T = 1024;
    Acts probe;
    double per_sequence = (double)acts_carve(&probe, c, 1, nullptr) * sizeof(float);
    int B = (int)std::min(1e9, 1.5 * available / per_sequence) + 1;  // 1.5x what is available: calloc alone might still say yes
    Model m;
    ModelSettings settings;
    settings.host_bytes = available;
    std::string err = model_create(&m, c, B, DEVICE_CPU, settings);
    model_free(&m);
    CHECK(err.find("out of memory: needs ") == 0, "B=%d: the error does not begin 'out of memory: needs ': '%s'", B, err.c_str());
    for (const char* part : {"GB is available; lower ", "--batch"})
        CHECK(contains(err, part), "B=%d: the error lacks '%s': '%s'", B, part, err.c_str());
}

// bench holds llama, lime and hc at once: each fits alone in memory that the
// three together do not; models_fit_together refuses their sum (model_create
// asks of one model only), naming the flags that shrink them all.
TEST(models_held_together_are_checked_as_a_sum) {
    Config llama = tiny_config(ARCH_LLAMA, 4, 2), lime = tiny_config(ARCH_LIME, 4, 2), hc = tiny_config(ARCH_HC, 4, 2);
    std::vector<Config> three = {llama, lime, hc};
    int B = 64;
    double biggest = 0, sum = 0;
    for (const Config& c : three) {
        biggest = std::max(biggest, memory_needed(c, B, DEVICE_CPU, false));
        sum += memory_needed(c, B, DEVICE_CPU, false);
    }
    ModelSettings s;
    s.host_bytes = (size_t)(1.01 * biggest);
    for (const Config& c : three) {
        Model m;
        std::string err = model_create(&m, c, B, DEVICE_CPU, s);
        model_free(&m);
        CHECK(err.empty(), "%s alone should fit in %zu bytes: '%s'", arch_name(c.arch), s.host_bytes, err.c_str());
    }
    std::string err = models_fit_together(three, B, DEVICE_CPU, s);
    CHECK(err.find("out of memory: the 3 models held at once need") == 0, "their sum was not refused: '%s'", err.c_str());
    CHECK(err.find("; lower --") != std::string::npos, "no flag to lower named: '%s'", err.c_str());
    s.host_bytes = (size_t)(1.01 * sum);
    CHECK((err = models_fit_together(three, B, DEVICE_CPU, s)).empty(), "their sum fits, yet: '%s'", err.c_str());
}

// One estimate (parameters, gradients, AdamW state, activations, scratch) is
// asked before anything is allocated, and the fix names only the flags the
// command has that would help: a shape for parameters that do not fit, the
// batch for activations; for a loaded checkpoint (eval) no shape flags at all.
TEST(memory_estimate_names_the_flags_that_help) {
    Args eval, bench;
    eval.cmd = "eval";
    bench.cmd = "bench";
    ModelSettings es = model_settings(eval), bs = model_settings(bench);
    es.host_bytes = bs.host_bytes = 100u << 20;  // 100 MB
    Config big = tiny_config(ARCH_LIME, 4, 2);    // parameters alone: 4 x 9.4M floats, 150 MB
    big.d = 512; big.hd = 128; big.F = 1536;
    Model m;
    FreeOnReturn guard{&m};
    std::string e1 = model_create(&m, big, 1, DEVICE_CPU, bs), e2 = model_create(&m, big, 1, DEVICE_CPU, es);
    CHECK(e1.find("out of memory: needs ") == 0, "bench, parameters: the error does not begin 'out of memory: needs ': '%s'",
          e1.c_str());
    for (const char* part : {"GB for the parameters, gradients and AdamW state", "; lower --", "--dim", "--ffn"})
        CHECK(contains(e1, part), "bench, parameters: the error lacks '%s': '%s'", part, e1.c_str());
    CHECK(!contains(e1, "--batch"), "bench, parameters: the error names --batch, which does not help: '%s'", e1.c_str());
    CHECK(contains(e2, "; it needs a machine with more memory"), "eval, parameters: the error lacks 'a machine with more memory': '%s'",
          e2.c_str());
    CHECK(!contains(e2, "--"), "eval, parameters: the error names a flag, which eval cannot change: '%s'", e2.c_str());
    Config wide = tiny_config(ARCH_LIME, 4, 2);   // activations of 4096 sequences: ~1 GB
    wide.T = 512;
    std::string e3 = model_create(&m, wide, 4096, DEVICE_CPU, es);
    CHECK(contains(e3, "; lower --batch"), "eval, activations: the error lacks '; lower --batch': '%s'", e3.c_str());
    CHECK(!contains(e3, "--seq-len"), "eval, activations: the error names --seq-len, which eval cannot change: '%s'", e3.c_str());
    Config vocab = tiny_config(ARCH_LIME, 4, 2);  // embedding and logits' scratch: V x d, not V x V
    vocab.V = 1 << 24;
    std::string e4 = model_create(&m, vocab, 1, DEVICE_CPU, bs);
    CHECK(e4.find("lower --vocab") != std::string::npos, "bench, vocabulary: '%s'", e4.c_str());
    vocab.V = 100000;
    size_t logits_panels = (size_t)vocab.d * ((vocab.V + 31) / 32 * 32);  // the logits' W^T packed, d x V
    CHECK(cpu_scratch_floats(vocab, 1, 1) == logits_panels, "scratch %zu floats for V=%d, d=%d, want %zu",
          cpu_scratch_floats(vocab, 1, 1), vocab.V, vocab.d, logits_panels);
    CHECK(m.params == nullptr, "a refused model allocated its parameters");
    CHECK(m.acts == nullptr, "a refused model allocated its activations");
}

TEST(checkpoint_round_trip_and_wrong_architecture_refused) {
    Config c = tiny_config(ARCH_LIME, 4, 2);
    Model m, back, other;
    FreeOnReturn guard{&m, &back, &other};
    CHECK(model_create(&m, c, 1, DEVICE_CPU).empty(), "model_create failed");
    model_init(&m, 8);
    m.step = 17;
    std::string path = "/tmp/lime_test_ckpt.safetensors";
    std::string err = model_save(&m, path, {{"note", "hello"}}, true);
    CHECK(err.empty(), "model_save: %s", err.c_str());
    CHECK(model_create(&back, c, 1, DEVICE_CPU).empty(), "model_create failed");
    err = model_load(&back, path, true);
    CHECK(err.empty(), "model_load: %s", err.c_str());
    CHECK(memcmp(back.params, m.params, 4 * m.n_params * sizeof(float)) == 0 || rel_err(back.params, m.params, m.n_params) == 0,
          "weights differ after a round trip");
    CHECK(back.step == 17, "step %d after a round trip, want 17", back.step);
    Config cl = c;
    cl.arch = ARCH_LLAMA;
    CHECK(model_create(&other, cl, 1, DEVICE_CPU).empty(), "model_create failed");
    err = model_load(&other, path, false);
    CHECK(err.find("different model") != std::string::npos, "loading a lime checkpoint as llama: '%s'", err.c_str());
    remove(path.c_str());
}

// ---------------------------------------------------------------------------
// The fast CPU path (support/model/cpu_fast.cpp) against lime.cu's plain loops, on
// random shapes: GQA and R = 1, odd T, hd 8/16/64/128, routers reading 1 and 5
// layers. The two sum in different orders, so they agree to rounding.

static const double FAST_TOL = 2e-5;

// The three products of a layer with the kernel in use, against the plain loops.
static void check_fast_matmul(int N, int C, int OC, uint64_t seed) {
    std::vector<float> inp = randv((size_t)N * C, seed), W = randv((size_t)OC * C, seed + 1), dout = randv((size_t)N * OC, seed + 2);
    std::vector<float> plain = randv((size_t)N * OC, seed + 3), fast = plain;  // accumulate onto the same values
    std::vector<float> scratch(matmul_fast_scratch_floats(std::max({N, OC, C}), std::max(C, OC)));
    matmul_forward(plain.data(), inp.data(), W.data(), N, C, OC, true);
    matmul_forward_fast(fast.data(), inp.data(), W.data(), N, C, OC, true, scratch.data());
    double e1 = rel_err(fast.data(), plain.data(), plain.size());
    std::vector<float> over((size_t)N * OC, 7.0f);  // accumulate = false: every value overwritten
    matmul_forward_fast(over.data(), inp.data(), W.data(), N, C, OC, false, scratch.data());
    matmul_forward(plain.data(), inp.data(), W.data(), N, C, OC, false);
    double e0 = rel_err(over.data(), plain.data(), plain.size());
    std::vector<float> dinp_p((size_t)N * C, 0.5f), dinp_f = dinp_p, dW_p((size_t)OC * C, 0.25f), dW_f = dW_p;
    matmul_backward(dinp_p.data(), dW_p.data(), dout.data(), inp.data(), W.data(), N, C, OC, true);
    matmul_backward_fast(dinp_f.data(), dW_f.data(), dout.data(), inp.data(), W.data(), N, C, OC, true);
    double e2 = rel_err(dinp_f.data(), dinp_p.data(), dinp_p.size()), e3 = rel_err(dW_f.data(), dW_p.data(), dW_p.size());
    std::vector<float> dinp_w((size_t)N * C, 7.0f);  // add_dinp = false: every value overwritten
    matmul_backward(dinp_p.data(), nullptr, dout.data(), inp.data(), W.data(), N, C, OC, false);
    matmul_backward_fast(dinp_w.data(), nullptr, dout.data(), inp.data(), W.data(), N, C, OC, false);
    double e4 = rel_err(dinp_w.data(), dinp_p.data(), dinp_p.size());
    struct { const char* name; double err; } errs[] = {
        {"out", e0}, {"out (accumulating)", e1}, {"dinp (adding)", e2}, {"dinp (written)", e4}, {"dW", e3}};
    for (auto& e : errs)
        CHECK(e.err < FAST_TOL, "matmul_*_fast (%s kernel) vs plain N=%d C=%d OC=%d: %s rel err %.1e", matmul_fast_kernel(), N, C,
              OC, e.name, e.err);
}
// Every micro-kernel the build has; sizes that are not multiples of any tile
// (odd, prime), more than a block of k (256) and of rows.
TEST(fast_matmul_equals_plain_on_random_shapes) {
    for (int kernel = 0; kernel < matmul_fast_kernels(); kernel++) {
        matmul_fast_use_kernel(kernel);
        Rng r(77);
        for (int i = 0; i < 6; i++) check_fast_matmul(1 + (int)(r.uniform() * 70), 1 + (int)(r.uniform() * 70), 1 + (int)(r.uniform() * 90), 100 + i);
        check_fast_matmul(64, 32, 96, 7);     // whole tiles and panels only
        check_fast_matmul(601, 37, 13, 8);    // dW sums 601 rows: three blocks of k
        check_fast_matmul(211, 300, 53, 9);   // forward and dinp: k over 256, 27 row tiles
        check_fast_matmul(1, 1, 1, 10);
        check_fast_matmul(3, 4099, 12, 11);   // few outputs, long rows: the forward's sliced dot products
        check_fast_matmul(2, 4099, 7, 14);    // ... with 2 rows (R = 2: its own tile) and 1 (R = 1)
        check_fast_matmul(1, 4103, 5, 15);
        check_fast_matmul(4, 300, 4, 12);     // at most 4 rows (forward, dinp and dW): the 4-row kernel, k over 256
        check_fast_matmul(97, 131, 150, 13);  // 4 panels or more in all three (any kernel): A's blocks packed
    }
    matmul_fast_use_kernel(0);
}

// The projections into the head-major buffer (C's columns, and dout's, in blocks of hd), against the plain loops.
static void check_fast_kv_projection(int N, int C, int R, int hd, uint64_t seed) {
    int OC = R * hd;
    std::vector<float> inp = randv((size_t)N * C, seed), W = randv((size_t)OC * C, seed + 1), dout = randv((size_t)N * OC, seed + 2);
    std::vector<float> scratch(matmul_fast_scratch_floats(std::max({N, OC, C}), std::max(C, OC)));
    std::vector<float> plain((size_t)N * OC), fast((size_t)N * OC, 7.0f);  // every value overwritten
    kv_projection_forward(plain.data(), inp.data(), W.data(), N, C, R, hd);
    kv_projection_forward_fast(fast.data(), inp.data(), W.data(), N, C, R, hd, scratch.data());
    double e0 = rel_err(fast.data(), plain.data(), plain.size());
    std::vector<float> dinp_p((size_t)N * C, 0.5f), dinp_f = dinp_p, dW_p((size_t)OC * C, 0.25f), dW_f = dW_p;
    kv_projection_backward(dinp_p.data(), dW_p.data(), dout.data(), inp.data(), W.data(), N, C, R, hd);
    kv_projection_backward_fast(dinp_f.data(), dW_f.data(), dout.data(), inp.data(), W.data(), N, C, R, hd);
    double e1 = rel_err(dinp_f.data(), dinp_p.data(), dinp_p.size()), e2 = rel_err(dW_f.data(), dW_p.data(), dW_p.size());
    struct { const char* name; double err; } errs[] = {{"out", e0}, {"dinp", e1}, {"dW", e2}};
    for (auto& e : errs)
        CHECK(e.err < FAST_TOL, "kv_projection_*_fast (%s kernel) vs plain N=%d C=%d R=%d hd=%d: %s rel err %.1e",
              matmul_fast_kernel(), N, C, R, hd, e.name, e.err);
}
// Heads narrower than a tile (several heads a tile), as wide, wider; odd N and C; k over 256.
TEST(fast_kv_projection_equals_plain_on_random_shapes) {
    for (int kernel = 0; kernel < matmul_fast_kernels(); kernel++) {
        matmul_fast_use_kernel(kernel);
        check_fast_kv_projection(37, 13, 4, 8, 20);   // 4 heads in each 32-wide tile
        check_fast_kv_projection(29, 32, 1, 32, 21);  // one head, one tile
        check_fast_kv_projection(53, 70, 2, 64, 22);  // two tiles a head
        check_fast_kv_projection(11, 300, 3, 6, 23);  // heads of 6 across tile edges; k over 256
        check_fast_kv_projection(5, 9, 3, 2, 24);     // at most 8 rows: one row tile
        check_fast_kv_projection(1, 1, 1, 2, 25);
    }
    matmul_fast_use_kernel(0);
}

// The threads share out whole tiles: the products are the same bits for 1, 2 and 3 threads.
static void check_fast_matmul_threads(int N, int C, int OC) {
    std::vector<float> inp = randv((size_t)N * C, 1), W = randv((size_t)OC * C, 2), dout = randv((size_t)N * OC, 3);
    std::vector<float> scratch(matmul_fast_scratch_floats(std::max({N, OC, C}), std::max(C, OC)));
    const char* names[] = {"out", "dinp", "dW"};
    std::vector<std::vector<std::vector<float>>> runs;  // for 1, 2 and 3 threads: out, dinp, dW
    int before = omp_get_max_threads();
    for (int threads = 1; threads <= 3; threads++) {
        omp_set_num_threads(threads);
        std::vector<float> out((size_t)N * OC), dinp((size_t)N * C, 0.5f), dW((size_t)OC * C, 0.25f);
        matmul_forward_fast(out.data(), inp.data(), W.data(), N, C, OC, false, scratch.data());
        matmul_backward_fast(dinp.data(), dW.data(), dout.data(), inp.data(), W.data(), N, C, OC, true);
        runs.push_back({out, dinp, dW});
    }
    omp_set_num_threads(before);
    for (int threads = 2; threads <= 3; threads++)
        for (int k = 0; k < 3; k++)
            CHECK(runs[threads - 1][k] == runs[0][k], "matmul_*_fast (%s kernel) N=%d C=%d OC=%d: %s differs between 1 and %d threads",
                  matmul_fast_kernel(), N, C, OC, names[k], threads);
}
// ... also the forward's sliced dot products (few outputs, long rows: the router's dW).
TEST(fast_matmul_same_bits_for_any_thread_count) {
    check_fast_matmul_threads(300, 70, 45);
    check_fast_matmul_threads(300, 130, 150);  // A's blocks packed in all three products
    check_fast_matmul_threads(4, 5000, 12);
}

// The router (products over the head-major buffer: row j = l'*R + r' of N*hd
// floats) against Eq. 2 written out in double, with gradients that already
// hold numbers: Kr[r][m] = sum_j W[r, j] Kbuf[j][m]; dW[r, j] += sum_m dKr[r][m]
// Kbuf[j][m] on the learned columns only; dKbuf[j][m] += sum_r W[r, j] dKr[r][m].
static void check_router_products(int l, int N, int R, int hd, RouterSpan learned, bool separate) {
    size_t M = (size_t)N * hd, layer = R * M, J = (size_t)(l + 1) * R;
    std::vector<float> Wk = randv(R * J, 1), Wv = separate ? randv(R * J, 2) : Wk, Kb = randv((l + 1) * layer, 3), Vb = randv((l + 1) * layer, 4);
    float* wv = separate ? Wv.data() : Wk.data();
    std::vector<float> Kr(layer), Vr(layer), want_k(layer), want_v(layer);
    router_forward_fast({Kr.data(), Vr.data()}, {Wk.data(), wv}, {Kb.data(), Vb.data()}, l, N, R, hd);
    std::vector<float> dK = randv(layer, 5), dV = randv(layer, 6);
    std::vector<float> dWk(R * J, 0.5f), dWv(R * J, 0.5f), dKb((l + 1) * layer, 0.25f), dVb = dKb;
    std::vector<float> want_dWk = dWk, want_dWv = dWv, want_dKb = dKb, want_dVb = dVb;
    std::vector<float> scratch(2 * R * J + matmul_fast_forward_scratch_floats(R, (int)M, (int)J));  // G, then the panels
    router_backward_fast({dWk.data(), separate ? dWv.data() : dWk.data()}, {dKb.data(), dVb.data()}, {dK.data(), dV.data()},
                         {Wk.data(), wv}, {Kb.data(), Vb.data()}, l, learned, N, R, hd, scratch.data());
    for (size_t r = 0; r < (size_t)R; r++)
        for (size_t j = 0; j < J; j++) {
            double gk = 0, gv = 0;
            for (size_t m = 0; m < M; m++) gk += (double)dK[r * M + m] * Kb[j * M + m], gv += (double)dV[r * M + m] * Vb[j * M + m];
            if (!learned.has((int)(j / R))) continue;
            if (separate) want_dWk[r * J + j] += (float)gk, want_dWv[r * J + j] += (float)gv;
            else want_dWk[r * J + j] += (float)(gk + gv);
        }
    for (size_t m = 0; m < M; m++) {
        for (size_t r = 0; r < (size_t)R; r++) {
            double k = 0, v = 0;
            for (size_t j = 0; j < J; j++) k += (double)Wk[r * J + j] * Kb[j * M + m], v += (double)wv[r * J + j] * Vb[j * M + m];
            want_k[r * M + m] = (float)k, want_v[r * M + m] = (float)v;
        }
        for (size_t j = 0; j < J; j++) {
            double k = 0, v = 0;
            for (size_t r = 0; r < (size_t)R; r++) k += (double)Wk[r * J + j] * dK[r * M + m], v += (double)wv[r * J + j] * dV[r * M + m];
            want_dKb[j * M + m] += (float)k, want_dVb[j * M + m] += (float)v;
        }
    }
    double e1 = std::max(rel_err(Kr.data(), want_k.data(), layer), rel_err(Vr.data(), want_v.data(), layer));
    double e2 = std::max(rel_err(dWk.data(), want_dWk.data(), R * J), rel_err(dWv.data(), want_dWv.data(), R * J));
    double e3 = std::max(rel_err(dKb.data(), want_dKb.data(), dKb.size()), rel_err(dVb.data(), want_dVb.data(), dVb.size()));
    struct { const char* name; double err; } errs[] = {{"Kr/Vr", e1}, {"dW", e2}, {"dKbuf/dVbuf", e3}};
    for (auto& e : errs)
        CHECK(e.err < FAST_TOL, "router products vs Eq. 2 in double (%d sources, N=%d R=%d hd=%d, learned <%d or >=%d%s): %s rel err %.1e",
              l + 1, N, R, hd, learned.below, learned.from, separate ? ", separate" : "", e.name, e.err);
}
// Shapes of the CPU products' paths: hd*N a multiple of the panels or not
// (a packed last panel), N*hd long enough for the sliced dot products of dW.
TEST(router_products_equal_eq2_with_1_and_5_sources) {
    for (int hd : {2, 8, 16, 64, 128}) {
        check_router_products(0, 13, 2, hd, RouterSpan{0, 0}, false);  // 1 source: the layer's own buffer
        check_router_products(4, 11, 3, hd, RouterSpan{0, 0}, false);  // 5 sources, R = 3
        check_router_products(4, 9, 1, hd, RouterSpan{1, 3}, true);    // 5 sources, R = 1, 1 and 2 fixed, separate routers
        check_router_products(3, 7, 2, hd, RouterSpan{0, 4}, false);   // nothing learned (average, frozen)
        check_router_products(3, 7, 2, hd, RouterSpan{0, 2}, false);   // last-2: layers 2 and 3 learned
    }
    check_router_products(2, 300, 2, 16, RouterSpan{0, 0}, true);  // N*hd = 4800: dW by the sliced dot products
    check_router_products(2, 300, 2, 16, RouterSpan{1, 2}, false);
}

static void check_fast_attention(int B, int T, int H, int R, int hd) {
    size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * R * hd, na = (size_t)B * H * T * T;
    std::vector<float> q = randv(nq, 11), k = randv(nk, 12), v = randv(nk, 13), dout = randv(nq, 14);
    std::vector<float> out_p(nq), out_f(nq), att_p(na), att_f(na), dq_p(nq), dq_f(nq), dk_p = randv(nk, 15), dk_f = dk_p, dv_p = randv(nk, 16),
                                                                                                dv_f = dv_p;
    int threads = omp_get_max_threads();
    std::vector<float> scratch(attention_fast_scratch_floats(T, hd, threads), NAN);
    attention_forward(out_p.data(), att_p.data(), q.data(), k.data(), v.data(), Heads{B, T, H, R, hd, 0});
    attention_forward_fast(out_f.data(), att_f.data(), q.data(), k.data(), v.data(), B, T, H, R, hd, scratch.data(), threads);
    attention_backward(dq_p.data(), dk_p.data(), dv_p.data(), dout.data(), q.data(), k.data(), v.data(), att_p.data(), Heads{B, T, H, R, hd, 0});
    attention_backward_fast(dq_f.data(), dk_f.data(), dv_f.data(), dout.data(), q.data(), k.data(), v.data(), att_f.data(), B, T, H, R, hd,
                            scratch.data(), threads);
    double e1 = rel_err(out_f.data(), out_p.data(), nq), e2 = rel_err(att_f.data(), att_p.data(), na);
    double e3 = rel_err(dq_f.data(), dq_p.data(), nq), e4 = rel_err(dk_f.data(), dk_p.data(), nk), e5 = rel_err(dv_f.data(), dv_p.data(), nk);
    struct { const char* name; double err; } errs[] = {{"out", e1}, {"att", e2}, {"dq", e3}, {"dk", e4}, {"dv", e5}};
    for (auto& e : errs)
        CHECK(e.err < FAST_TOL, "attention_*_fast vs plain B=%d T=%d H=%d R=%d hd=%d: %s rel err %.1e", B, T, H, R, hd, e.name, e.err);
}
// Scratch with row buffers for one thread: the attention runs on one thread
// however many OpenMP has, within its scratch (the sanitizer suite catches a
// thread past it), and gives the same bits.
TEST(fast_attention_stays_within_its_threads_buffers) {
    int B = 3, T = 21, H = 4, R = 2, hd = 8, before = omp_get_max_threads();
    size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * R * hd, na = (size_t)B * H * T * T;
    std::vector<float> q = randv(nq, 11), k = randv(nk, 12), v = randv(nk, 13), dout = randv(nq, 14);
    const char* names[] = {"out", "att", "dq", "dk", "dv"};
    std::vector<std::vector<std::vector<float>>> runs;  // with scratch for 3 threads, then for 1: out, att, dq, dk, dv
    omp_set_num_threads(3);
    for (int threads : {3, 1}) {
        std::vector<float> scratch(attention_fast_scratch_floats(T, hd, threads), NAN), out(nq), att(na), dq(nq), dk(nk, 0.5f), dv(nk, 0.25f);
        attention_forward_fast(out.data(), att.data(), q.data(), k.data(), v.data(), B, T, H, R, hd, scratch.data(), threads);
        attention_backward_fast(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), att.data(), B, T, H, R, hd,
                                scratch.data(), threads);
        runs.push_back({out, att, dq, dk, dv});
    }
    omp_set_num_threads(before);
    for (int k = 0; k < 5; k++)
        CHECK(runs[0][k] == runs[1][k], "attention_*_fast: %s differs between scratch for 3 threads and for 1", names[k]);
}
TEST(fast_attention_equals_plain_gqa_and_r1_odd_t) {
    for (int hd : {8, 16, 64, 128}) {
        check_fast_attention(2, 19, 4, 2, hd);  // GQA, odd T
        check_fast_attention(1, 33, 3, 1, hd);  // R = 1
    }
    check_fast_attention(3, 7, 2, 2, 6);        // hd neither a multiple of 8 nor 32
}

// RoPE: the fast rotation (support/model/cpu_fast.cpp) gives the plain loop's
// bits, forward and backward, for half heads of 16 lanes, of 4, and neither.
TEST(fast_rope_equals_plain_bits) {
    for (int hd : {2, 6, 8, 10, 32, 40, 64}) {
        int B = 2, T = 7, nh = 3;
        std::vector<float> cs(T * hd / 2), sn(T * hd / 2);
        rope_tables(cs.data(), sn.data(), T, hd, 10000.0f);
        for (float sign : {1.0f, -1.0f}) {
            std::vector<float> plain = randv(B * T * nh * hd, 12), fast = plain;
            if (sign > 0) rope_forward(plain.data(), plain.data(), cs.data(), sn.data(), B, T, nh, hd);
            else rope_backward(plain.data(), plain.data(), cs.data(), sn.data(), B, T, nh, hd, false);
            rope_rotate_fast(fast.data(), fast.data(), cs.data(), sn.data(), B, T, nh, hd, sign);
            size_t bad = 0;
            while (bad < plain.size() && plain[bad] == fast[bad]) bad++;
            CHECK(bad == plain.size(), "rope %s hd %d: x[%zu] fast %.9g, plain %.9g", sign > 0 ? "forward" : "backward",
                  hd, bad, bad < fast.size() ? fast[bad] : 0.0, bad < plain.size() ? plain[bad] : 0.0);
        }
    }
}

// Hyper-Connections: each fast op (support/model/cpu_fast.cpp) against its plain
// loop, static and dynamic; widths that take each of the fast loops' ways (d a
// multiple of 32, of 8, of 2, odd), 1, 3 and 16 streams, and more positions
// than the weight gradients' 64 slices. Gradients start from random values:
// dX and the HC tensors' gradients are added to, the others written.
static void check_fast_hc(int N, int n, int d, bool dynamic) {
    int K = n + 1;
    size_t Nd = (size_t)N * d, nA = (size_t)N * n * K, nb = (size_t)N * n;
    char what[80];
    snprintf(what, sizeof what, "hc_*_fast vs plain N=%d n=%d d=%d %s", N, n, d, dynamic ? "dynamic" : "static");
    std::vector<float> X = randv(n * Nd, 1);
    HcWeights w(n, d, dynamic, 2);
    for (float& v : w.afn) v *= 0.3f;  // projections of a few units: tanh neither flat nor saturated everywhere
    for (float& v : w.bfn) v *= 0.3f;
    // the mixing weights
    std::vector<float> A_p(nA), b_p(nb), rstd_p(nb), ta_p(nA), tb_p(nb), A_f(nA), b_f(nb), rstd_f(nb), ta_f(nA), tb_f(nb);
    hc_weights_forward(A_p.data(), b_p.data(), rstd_p.data(), ta_p.data(), tb_p.data(), X.data(), w.view(), N, n, d, 1e-6f);
    std::vector<float> scratch(std::max(hc_fast_scratch_floats(n, d), (size_t)CHUNKS * (hc_weight_floats(n, d) + d)), NAN);
    hc_weights_forward_fast(A_f.data(), b_f.data(), rstd_f.data(), ta_f.data(), tb_f.data(), X.data(), w.view(), N, n, d, 1e-6f,
                            scratch.data());
    double e1 = std::max(rel_err(A_f.data(), A_p.data(), nA), rel_err(b_f.data(), b_p.data(), nb));
    double e2 = dynamic ? std::max({rel_err(rstd_f.data(), rstd_p.data(), nb), rel_err(ta_f.data(), ta_p.data(), nA),
                                    rel_err(tb_f.data(), tb_p.data(), nb)}) : 0;
    // their backward, from the plain forward's saved values
    std::vector<float> dA = randv(nA, 3), db = randv(nb, 4), dX_p = randv(n * Nd, 5), dX_f = dX_p;
    HcWeights g_p(n, d, dynamic, 6), g_f(n, d, dynamic, 6);
    hc_weights_backward(dX_p.data(), g_p.view(), dA.data(), db.data(), X.data(), rstd_p.data(), ta_p.data(), tb_p.data(), w.view(), N, n, d,
                        scratch.data());
    hc_weights_backward_fast(dX_f.data(), g_f.view(), dA.data(), db.data(), X.data(), rstd_p.data(), ta_p.data(), tb_p.data(), w.view(), N,
                             n, d, scratch.data());
    double e3 = rel_err(dX_f.data(), dX_p.data(), dX_p.size()), e4 = 0;
    std::vector<float>*gp[] = {&g_p.sb, &g_p.sa, &g_p.afn, &g_p.as, &g_p.bfn, &g_p.bs}, *gf[] = {&g_f.sb, &g_f.sa, &g_f.afn, &g_f.as, &g_f.bfn, &g_f.bs};
    for (int i = 0; i < 6; i++) e4 = std::max(e4, rel_err(gf[i]->data(), gp[i]->data(), gp[i]->size()));
    // the width connection
    std::vector<float> M_p((size_t)K * Nd), M_f(M_p.size()), dM = randv(M_p.size(), 7);
    std::vector<float> wdX_p(n * Nd), wdX_f(n * Nd, 7.0f), wdA_p(nA), wdA_f(nA, 7.0f);  // 7: written, not added to
    hc_width_forward(M_p.data(), X.data(), A_p.data(), N, n, d);
    hc_width_forward_fast(M_f.data(), X.data(), A_p.data(), N, n, d);
    hc_width_backward(wdX_p.data(), wdA_p.data(), dM.data(), X.data(), A_p.data(), N, n, d);
    hc_width_backward_fast(wdX_f.data(), wdA_f.data(), dM.data(), X.data(), A_p.data(), N, n, d);
    double e5 = rel_err(M_f.data(), M_p.data(), M_p.size());
    double e6 = std::max(rel_err(wdX_f.data(), wdX_p.data(), wdX_p.size()), rel_err(wdA_f.data(), wdA_p.data(), nA));
    // the depth connection's backward
    std::vector<float> y = randv(Nd, 8), dXout = randv(n * Nd, 9), dy_p(Nd), dy_f(Nd, 7.0f), ddb_p(nb), ddb_f(nb, 7.0f);
    std::vector<float> ddM_p(M_p.size()), ddM_f(M_p.size(), 7.0f);
    hc_depth_backward(dy_p.data(), ddb_p.data(), ddM_p.data(), dXout.data(), y.data(), b_p.data(), N, n, d);
    hc_depth_backward_fast(dy_f.data(), ddb_f.data(), ddM_f.data(), dXout.data(), y.data(), b_p.data(), N, n, d);
    double e7 = std::max(rel_err(dy_f.data(), dy_p.data(), Nd), rel_err(ddb_f.data(), ddb_p.data(), nb));
    struct { const char* name; double err; } errs[] = {
        {"weights forward: A, b", e1},
        {"weights forward: rstd, ta, tb", e2},
        {"weights backward: dX", e3},
        {"weights backward: the HC tensors' gradients", e4},
        {"width: M", e5},
        {"width: dX, dA", e6},
        {"depth backward: dy, db", e7},
    };
    for (auto& e : errs) CHECK(e.err < FAST_TOL, "%s %s: rel err %.1e", what, e.name, e.err);
    CHECK(ddM_f == ddM_p, "%s depth backward: dM differs from the plain loop's (copies and zeros)", what);
}
TEST(fast_hc_equals_plain_dynamic) {
    check_fast_hc(150, 4, 32, true);  // the paper's 4 streams; d a multiple of 32, 150 positions over the 64 slices
    check_fast_hc(37, 3, 40, true);   // d a multiple of 8
    check_fast_hc(9, 16, 6, true);    // 16 streams, d a multiple of 2 only
    check_fast_hc(70, 1, 5, true);    // 1 stream, d odd
}
TEST(fast_hc_equals_plain_static) {
    check_fast_hc(150, 4, 32, false);
    check_fast_hc(11, 2, 24, false);
    check_fast_hc(3, 1, 7, false);    // fewer positions than slices: most are empty
}

// The weight gradients are summed in 64 fixed slices of the positions: the
// fast HC backward gives the same bits for 1, 2 and 3 threads.
TEST(fast_hc_same_bits_for_any_thread_count) {
    int N = 101, n = 3, d = 16, K = n + 1;
    std::vector<float> X = randv((size_t)n * N * d, 1), dA = randv((size_t)N * n * K, 2), db = randv((size_t)N * n, 3), dM = randv((size_t)K * N * d, 4);
    HcWeights w(n, d, true, 5);
    std::vector<float> Aw((size_t)N * n * K), bw((size_t)N * n), rstd(bw.size()), ta(Aw.size()), tb(bw.size());
    hc_weights_forward(Aw.data(), bw.data(), rstd.data(), ta.data(), tb.data(), X.data(), w.view(), N, n, d, 1e-6f);
    const char* names[] = {"dX", "dA", "dstatic_beta", "dstatic_alpha", "ddynamic_alpha_fn", "ddynamic_alpha_scale",
                           "ddynamic_beta_fn", "ddynamic_beta_scale"};
    std::vector<std::vector<std::vector<float>>> runs;  // for 1, 2 and 3 threads: dX, dA, the HC tensors' gradients
    int before = omp_get_max_threads();
    for (int threads = 1; threads <= 3; threads++) {
        omp_set_num_threads(threads);
        HcWeights g(n, d, true, 6);
        std::vector<float> dX(X.size()), wdA(Aw.size());
        hc_width_backward_fast(dX.data(), wdA.data(), dM.data(), X.data(), Aw.data(), N, n, d);
        std::vector<float> scratch(hc_fast_scratch_floats(n, d), NAN);
        hc_weights_backward_fast(dX.data(), g.view(), dA.data(), db.data(), X.data(), rstd.data(), ta.data(), tb.data(), w.view(), N, n, d,
                                 scratch.data());
        runs.push_back({dX, wdA, g.sb, g.sa, g.afn, g.as, g.bfn, g.bs});
    }
    omp_set_num_threads(before);
    for (int threads = 2; threads <= 3; threads++)
        for (int k = 0; k < 8; k++)
            CHECK(runs[threads - 1][k] == runs[0][k], "hc_width/weights_backward_fast: %s differs between 1 and %d threads", names[k],
                  threads);
}

// tanh_fast (the fast HC weights) against double precision: within 2 ulp
// from -10 to 10; 0 at 0, +-1 far out, NaN through.
TEST(tanh_fast_is_within_2_ulp) {
    double worst = 0;
    for (float x = -10.0f; x <= 10.0f; x += 0.000731f) {
        double want = std::tanh((double)x), ulp = std::nextafter((float)std::fabs(want), INFINITY) - (float)std::fabs(want);
        worst = std::max(worst, std::fabs(tanh_fast(x) - want) / ulp);
    }
    for (float x = 1e-30f; x < 1e-3f; x *= 1.7f) {  // tiny arguments: tanh x = x to float precision
        double ulp = std::nextafter(x, INFINITY) - x;
        worst = std::max(worst, std::fabs(tanh_fast(x) - std::tanh((double)x)) / ulp);
    }
    CHECK(worst <= 2.0, "tanh_fast: %.2f ulp from tanh", worst);
    struct { float x, want; } exact[] = {{0.0f, 0.0f}, {50.0f, 1.0f}, {-50.0f, -1.0f}, {INFINITY, 1.0f}, {-INFINITY, -1.0f}};
    for (auto& k : exact) CHECK(tanh_fast(k.x) == k.want, "tanh_fast(%g) = %.9g, want %g", k.x, tanh_fast(k.x), k.want);
    CHECK(std::isnan(tanh_fast(NAN)), "tanh_fast(NaN) = %g, want NaN", tanh_fast(NAN));
}

// The regulariser's fast path against the plain loops, one layer of B
// sequences (B, T, D), `counts` valid positions each (a gap at 1 when there is
// room, then padding): S2 and its two scales, mu (the same bits), G where the
// fast path keeps G (n >= D), and dV accumulated onto the same values.
static void check_fast_ereg(int T, int D, const std::vector<int>& counts) {
    int B = (int)counts.size();
    std::vector<float> V = randv((size_t)B * T * D, 50 + D, 2.0f), valid((size_t)B * T, 0.0f);
    for (int b = 0; b < B; b++)
        for (int t = 0, n = 0; t < T && n < counts[b]; t++)
            if (t != 1 || counts[b] > T - 1) valid[(size_t)b * T + t] = 1, n++;
    std::vector<float> st_p(4 * B), st_f(4 * B), mu_p((size_t)B * D), mu_f((size_t)B * D);
    std::vector<float> G_p((size_t)B * D * D), G_f((size_t)B * D * D), dV_p = randv(V.size(), 60), dV_f = dV_p;
    std::vector<float> scratch(ereg_fast_scratch_floats(B, T, D));
    ereg_forward(st_p.data(), mu_p.data(), G_p.data(), V.data(), valid.data(), B, T, D);
    ereg_forward_fast(st_f.data(), mu_f.data(), G_f.data(), V.data(), valid.data(), B, T, D, scratch.data());
    ereg_backward(dV_p.data(), V.data(), valid.data(), mu_p.data(), G_p.data(), st_p.data(), -0.3f, B, T, D);
    ereg_backward_fast(dV_f.data(), V.data(), valid.data(), mu_f.data(), G_f.data(), st_f.data(), -0.3f, B, T, D,
                       scratch.data());
    CHECK(mu_f == mu_p, "ereg_forward_fast T=%d D=%d: mu differs from the plain loop's bits", T, D);
    for (int b = 0; b < B; b++) {
        for (int k = 0; k < 3; k++) {
            float f = st_f[4 * b + k], p = st_p[4 * b + k];
            CHECK(std::fabs(f - p) <= FAST_TOL * std::fabs(p) + (k == 0 ? 1e-6 : 0),
                  "ereg_forward_fast T=%d D=%d, sequence %d of %d valid: stat[%d] %.8g, plain %.8g", T, D, b, counts[b], k,
                  f, p);
        }
        if (counts[b] >= D) {
            size_t at = (size_t)b * D * D;
            double e = rel_err(G_f.data() + at, G_p.data() + at, (size_t)D * D);
            CHECK(e < FAST_TOL, "ereg_forward_fast T=%d D=%d, sequence %d of %d valid: G rel err %.1e", T, D, b,
                  counts[b], e);
        }
    }
    double e = rel_err(dV_f.data(), dV_p.data(), dV_p.size());
    CHECK(e < FAST_TOL, "ereg_backward_fast T=%d D=%d: dV rel err %.1e", T, D, e);
}
// n > D (G), n < D (K), n = D, sequences of 1 and 0 valid positions, D off
// the panel width, on every micro-kernel the build has.
TEST(fast_ereg_equals_plain_with_padding_and_short_sequences) {
    for (int kernel = 0; kernel < matmul_fast_kernels(); kernel++) {
        matmul_fast_use_kernel(kernel);
        check_fast_ereg(40, 8, {40, 30, 1, 9, 8});     // n > D: G; n = D; one valid position
        check_fast_ereg(12, 40, {12, 7, 0, 2, 1});     // n < D: K; no valid position
        check_fast_ereg(50, 37, {50, 36, 37, 45, 3});  // both in one batch, D off 16 and 32
        check_fast_ereg(88, 32, {88, 60, 20});         // the d32 bench shape's D and T
    }
    matmul_fast_use_kernel(0);
}

// One thread per sequence, each summing in its own fixed order: the same bits for 1, 2 and 3 threads.
TEST(fast_ereg_same_bits_for_any_thread_count) {
    int B = 5, T = 30, D = 20;
    std::vector<float> V = randv((size_t)B * T * D, 70), valid((size_t)B * T, 1.0f);
    for (int t = 10; t < T; t++) valid[(size_t)3 * T + t] = 0;  // sequence 3: K (10 < D)
    std::vector<float> scratch(ereg_fast_scratch_floats(B, T, D));
    const char* names[] = {"stat", "dV"};
    std::vector<std::vector<std::vector<float>>> runs;  // for 1, 2 and 3 threads: stat, dV
    int before = omp_get_max_threads();
    for (int threads = 1; threads <= 3; threads++) {
        omp_set_num_threads(threads);
        std::vector<float> stat(4 * B), mu((size_t)B * D), G((size_t)B * D * D), dV(V.size(), 0.5f);
        ereg_forward_fast(stat.data(), mu.data(), G.data(), V.data(), valid.data(), B, T, D, scratch.data());
        ereg_backward_fast(dV.data(), V.data(), valid.data(), mu.data(), G.data(), stat.data(), 1.0f, B, T, D,
                           scratch.data());
        runs.push_back({stat, dV});
    }
    omp_set_num_threads(before);
    for (int threads = 2; threads <= 3; threads++)
        for (int k = 0; k < 2; k++)
            CHECK(runs[threads - 1][k] == runs[0][k], "ereg_*_fast: %s differs between 1 and %d threads", names[k], threads);
}

// ---------------------------------------------------------------------------
// The same bits whatever the build's vector width (tests/test_isa.sh trains an
// AVX2 and an AVX-512 ./lime and compares the model files): within one build,
// every micro-kernel it can pick gives the same bits, and the polynomials give
// a vector loop's bits in the scalar loop after it.

// Products (the layer's three, the KV projections, the regulariser's Grams),
// with each micro-kernel of the build against the first, bit for bit.
TEST(fast_products_same_bits_with_every_kernel) {
    auto products = [](std::vector<float>& all) {
        int shapes[][3] = {{64, 32, 96}, {211, 300, 53}, {97, 131, 150}, {4, 300, 4}, {3, 4099, 12},
                           {33, 17, 9}};
        for (auto& s : shapes) {
            int N = s[0], C = s[1], OC = s[2];
            std::vector<float> inp = randv((size_t)N * C, 1), W = randv((size_t)OC * C, 2);
            std::vector<float> dout = randv((size_t)N * OC, 3), out((size_t)N * OC, 0.5f);
            std::vector<float> dinp((size_t)N * C, 0.5f), dW((size_t)OC * C, 0.25f);
            std::vector<float> scratch(matmul_fast_forward_scratch_floats(N, C, OC) +
                                       matmul_fast_scratch_floats(C, OC));
            matmul_forward_fast(out.data(), inp.data(), W.data(), N, C, OC, true, scratch.data());
            matmul_backward_fast(dinp.data(), dW.data(), dout.data(), inp.data(), W.data(), N, C, OC, true);
            for (auto* v : {&out, &dinp, &dW}) all.insert(all.end(), v->begin(), v->end());
        }
        int N = 37, C = 13, R = 4, hd = 8;
        std::vector<float> inp = randv((size_t)N * C, 4), W = randv((size_t)R * hd * C, 5);
        std::vector<float> dout = randv((size_t)N * R * hd, 6);
        std::vector<float> scratch(matmul_fast_scratch_floats(C, R * hd)), out((size_t)N * R * hd);
        std::vector<float> dinp((size_t)N * C, 0.5f), dW((size_t)R * hd * C, 0.25f);
        kv_projection_forward_fast(out.data(), inp.data(), W.data(), N, C, R, hd, scratch.data());
        kv_projection_backward_fast(dinp.data(), dW.data(), dout.data(), inp.data(), W.data(), N, C, R, hd);
        for (auto* v : {&out, &dinp, &dW}) all.insert(all.end(), v->begin(), v->end());
        int B = 3, T = 40, D = 24;  // sequences of 40 (G) and 9 (K) valid positions
        std::vector<float> V = randv((size_t)B * T * D, 7), valid((size_t)B * T, 1.0f);
        for (int t = 9; t < T; t++) valid[(size_t)T + t] = 0;
        std::vector<float> stat(4 * B), mu((size_t)B * D), G((size_t)B * D * D), dV(V.size(), 0.5f);
        std::vector<float> ereg_scratch(ereg_fast_scratch_floats(B, T, D));
        float* es = ereg_scratch.data();
        ereg_forward_fast(stat.data(), mu.data(), G.data(), V.data(), valid.data(), B, T, D, es);
        ereg_backward_fast(dV.data(), V.data(), valid.data(), mu.data(), G.data(), stat.data(), 1, B, T, D, es);
        for (auto* v : {&stat, &dV}) all.insert(all.end(), v->begin(), v->end());
    };
    std::vector<float> first;
    matmul_fast_use_kernel(0);
    std::string first_kernel = matmul_fast_kernel();
    products(first);
    for (int kernel = 1; kernel < matmul_fast_kernels(); kernel++) {
        matmul_fast_use_kernel(kernel);
        std::vector<float> other;
        products(other);
        size_t bad = 0;
        while (bad < first.size() && !memcmp(&first[bad], &other[bad], sizeof(float))) bad++;
        CHECK(bad == first.size(), "the %s kernel's products differ from the %s kernel's at float %zu of %zu",
              matmul_fast_kernel(), first_kernel.c_str(), bad, first.size());
        matmul_fast_use_kernel(0);
    }
}

// exp_fast and tanh_fast in a vector loop (omp simd: the build's widest vectors)
// and one at a time (a call the compiler cannot vectorise): the same bits,
// over their whole range, the edges and NaN.
__attribute__((noinline)) static float exp_one(float x) { return exp_fast(x); }
__attribute__((noinline)) static float tanh_one(float x) { return tanh_fast(x); }
TEST(exp_fast_and_tanh_fast_same_bits_in_vector_and_scalar_loops) {
    std::vector<float> x = randv(100003, 80, 100.0f);
    for (float e : {0.0f, -0.0f, -87.0f, 88.0f, -87.01f, 88.01f, 0.625f, 1e-30f, INFINITY, -INFINITY, NAN})
        x.push_back(e);
    for (int f = 0; f < 2; f++) {
        std::vector<float> vec(x.size()), one(x.size());
        if (f == 0) {
#pragma omp simd
            for (size_t i = 0; i < x.size(); i++) vec[i] = exp_fast(x[i]);
        } else {
#pragma omp simd
            for (size_t i = 0; i < x.size(); i++) vec[i] = tanh_fast(x[i] * 0.05f);
        }
        for (size_t i = 0; i < x.size(); i++) one[i] = f == 0 ? exp_one(x[i]) : tanh_one(x[i] * 0.05f);
        size_t bad = 0;
        while (bad < x.size() && !memcmp(&vec[bad], &one[bad], sizeof(float))) bad++;
        float at = bad < x.size() ? x[bad] * (f == 0 ? 1.0f : 0.05f) : 0.0f;
        CHECK(bad == x.size(), "%s(%.9g): %.9g in a vector loop, %.9g alone", f == 0 ? "exp_fast" : "tanh_fast",
              at, bad < x.size() ? vec[bad] : 0.0f, bad < x.size() ? one[bad] : 0.0f);
    }
}

// RMSNorm's fast loops (their sums over d in 16 lanes) against the plain
// ones, for d under, at and past 16 lanes, and the same bits for 1, 2 and 3 threads.
TEST(fast_rmsnorm_equals_plain) {
    for (int d : {5, 16, 20, 32, 37, 128}) {
        int N = 71;
        std::vector<float> x = randv((size_t)N * d, 90 + d), g = randv(d, 91), dy = randv((size_t)N * d, 92);
        std::vector<float> y_p((size_t)N * d), y_f(y_p.size()), r_p(N), r_f(N), part((size_t)CHUNKS * d, NAN);
        std::vector<float> dx_p = randv((size_t)N * d, 93), dx_f = dx_p, dg_p(d, 0.5f), dg_f = dg_p;
        const float *xp = x.data(), *gp = g.data(), *dyp = dy.data();
        rmsnorm_forward(y_p.data(), r_p.data(), nullptr, xp, gp, N, d, 1e-6f);
        rmsnorm_forward_fast(y_f.data(), r_f.data(), nullptr, xp, gp, N, d, 1e-6f);
        rmsnorm_backward(dx_p.data(), dg_p.data(), dyp, xp, gp, r_p.data(), N, d, part.data());
        rmsnorm_backward_fast(dx_f.data(), dg_f.data(), dyp, xp, gp, r_p.data(), N, d, part.data());
        double e0 = rel_err(y_f.data(), y_p.data(), y_p.size()), e1 = rel_err(r_f.data(), r_p.data(), N);
        double e2 = rel_err(dx_f.data(), dx_p.data(), dx_p.size()), e3 = rel_err(dg_f.data(), dg_p.data(), d);
        struct { const char* name; double err; } errs[] = {{"y", e0}, {"rstd", e1}, {"dx", e2}, {"dg", e3}};
        for (auto& e : errs) CHECK(e.err < FAST_TOL, "rmsnorm_*_fast vs plain d=%d: %s rel err %.1e", d, e.name, e.err);
    }
    int N = 301, d = 48;
    std::vector<float> x = randv((size_t)N * d, 94), g = randv(d, 95), dy = randv((size_t)N * d, 96);
    const char* names[] = {"y", "rstd", "dx", "dg"};
    std::vector<std::vector<std::vector<float>>> runs;  // for 1, 2 and 3 threads: y, rstd, dx, dg
    int before = omp_get_max_threads();
    for (int threads = 1; threads <= 3; threads++) {
        omp_set_num_threads(threads);
        std::vector<float> y((size_t)N * d), r(N), dx((size_t)N * d, 0.5f), dg(d, 0.25f);
        std::vector<float> part((size_t)CHUNKS * d);
        const float *xp = x.data(), *gp = g.data(), *dyp = dy.data();
        rmsnorm_forward_fast(y.data(), r.data(), nullptr, xp, gp, N, d, 1e-6f);
        rmsnorm_backward_fast(dx.data(), dg.data(), dyp, xp, gp, r.data(), N, d, part.data());
        runs.push_back({y, r, dx, dg});
    }
    omp_set_num_threads(before);
    for (int threads = 2; threads <= 3; threads++)
        for (int k = 0; k < 4; k++)
            CHECK(runs[threads - 1][k] == runs[0][k], "rmsnorm_*_fast: %s differs between 1 and %d threads", names[k], threads);
}

// The peers' mixture (support/study/mixing.cuh): ./lime's fast versions give the
// plain loops' bits, at any thread count, for n under and over a block and not
// a multiple of the slices.
TEST(fast_mix_same_bits_as_plain) {
    for (int K : {2, 5})
        for (size_t n : {(size_t)37, (size_t)5003, (size_t)70001}) {
            std::vector<float> a = randv(K, 80 + K), first = randv(n, 81), rest = randv((K - 1) * n, 82);
            std::vector<float> dy = randv(n, 83), y_p(n), part((size_t)CHUNKS * K);
            std::vector<float> dfirst_p = randv(n, 84), drest_p = randv((K - 1) * n, 85), da_p(K, 0.5f);
            mix_forward(y_p.data(), a.data(), first.data(), rest.data(), K, n);
            mix_backward(dfirst_p.data(), drest_p.data(), da_p.data(), dy.data(), a.data(), first.data(),
                         rest.data(), K, n, part.data());
            int before = omp_get_max_threads();
            for (int threads = 1; threads <= 3; threads++) {
                omp_set_num_threads(threads);
                std::vector<float> y_f(n, NAN), dfirst_f = randv(n, 84), drest_f = randv((K - 1) * n, 85), da_f(K, 0.5f);
                mix_forward_fast(y_f.data(), a.data(), first.data(), rest.data(), K, n);
                mix_backward_fast(dfirst_f.data(), drest_f.data(), da_f.data(), dy.data(), a.data(), first.data(),
                                  rest.data(), K, n, part.data());
                CHECK(y_f == y_p, "mix_forward_fast K=%d n=%zu, %d threads: y differs from the plain loop's", K, n, threads);
                CHECK(dfirst_f == dfirst_p, "mix_backward_fast K=%d n=%zu, %d threads: dfirst differs", K, n, threads);
                CHECK(drest_f == drest_p, "mix_backward_fast K=%d n=%zu, %d threads: drest differs", K, n, threads);
                CHECK(da_f == da_p, "mix_backward_fast K=%d n=%zu, %d threads: da differs", K, n, threads);
            }
            omp_set_num_threads(before);
        }
}


// ---------------------------------------------------------------------------
// Shapes the GPU kernels cannot launch (launch_check) are refused by
// model_create on every device, before anything is allocated, with the flag to lower.

// On the GPU (launch_check refuses before anything is allocated, so this runs
// in a CPU-only build too), or on the CPU.
static std::string create_error(const Config& c, int B, Device dev = DEVICE_GPU) {
    Model m;
    std::string err = model_create(&m, c, B, dev);  // host_bytes 0: no memory check first
    model_free(&m);  // also what a refused create (no GPU in this build) allocated before it was refused
    return err;
}
TEST(model_create_refuses_logits_past_32_bit_indices) {
    Config c = tiny_config(ARCH_LIME, 4, 2);
    c.T = 1 << 20;  // 200 x 2^20 positions x 11 logits: 2.3e9 floats
    std::string err = create_error(c, 200);
    for (const char* part : {"logits", "lower --batch"}) CHECK(contains(err, part), "the answer lacks '%s': '%s'", part, err.c_str());
}
TEST(model_create_refuses_more_sequences_than_a_grid_has_rows) {
    std::string err = create_error(tiny_config(ARCH_LLAMA, 4, 2), 70000);
    for (const char* part : {"65535", "lower --batch"}) CHECK(contains(err, part), "the answer lacks '%s': '%s'", part, err.c_str());
}
// The GPU's launch limits are not the CPU's: a CPU run of those shapes is made, not refused in GPU words.
TEST(model_create_on_the_cpu_takes_what_only_the_gpu_cannot) {
    std::string batch = create_error(tiny_config(ARCH_LLAMA, 4, 2), 70000, DEVICE_CPU);
    Config c = tiny_config(ARCH_LIME, 96, 96);
    c.hd = 2, c.d = 192, c.L = 64;
    std::string router = create_error(c, 1, DEVICE_CPU);
    CHECK(batch.empty(), "70000 sequences refused on the CPU: '%s'", batch.c_str());
    CHECK(router.empty(), "64 layers x 96 kv heads refused on the CPU: '%s'", router.c_str());
}
// No router is too wide for the GPU: where the hand-written kernels' shared memory
// is too small, the router runs on cuBLAS (model_create), so launch_check refuses none.
TEST(launch_check_takes_a_router_of_any_width_on_the_gpu) {
    Config c = tiny_config(ARCH_LIME, 96, 96);
    c.hd = 2, c.d = 192, c.L = 64;  // 64 layers x 96 kv heads: a weight gradient of 589,824 floats
    std::string err = launch_check(c, 1, DEVICE_GPU, SizeFlags());
    CHECK(err.empty(), "64 layers x 96 kv heads refused on the GPU: '%s'", err.c_str());
}

// ---------------------------------------------------------------------------
// The value-entropy regulariser

// S2 of one sequence of values V (T, D) with its valid mask, and dS2/dV.
static float ereg_s2(const std::vector<float>& V, const std::vector<float>& valid, int T, int D,
                     std::vector<float>* dV = nullptr) {
    std::vector<float> stat(4), mu(D), G((size_t)D * D);
    ereg_forward(stat.data(), mu.data(), G.data(), V.data(), valid.data(), 1, T, D);
    if (dV) {
        dV->assign((size_t)T * D, 0.0f);
        ereg_backward(dV->data(), V.data(), valid.data(), mu.data(), G.data(), stat.data(), 1.0f, 1, T, D);
    }
    return stat[0];
}

TEST(ereg_backward_matches_finite_differences) {
    int B = 3, T = 7, D = 6;  // rows with 7, 5 (a gap at 2 and the end padded) and 1 valid positions
    std::vector<float> V = randv((size_t)B * T * D, 41), valid(B * T, 0.0f);
    for (int t = 0; t < T; t++) valid[t] = 1, valid[T + t] = t != 2 && t < 6, valid[2 * T + t] = t == 0;
    std::vector<float> stat(4 * B), mu(B * D), G((size_t)B * D * D), dV(V.size(), 0.0f);
    // loss = sum_b S2[b]: the backward with scale 1
    auto loss = [&]() {
        ereg_forward(stat.data(), mu.data(), G.data(), V.data(), valid.data(), B, T, D);
        return (double)stat[0] + stat[4] + stat[8];
    };
    loss();
    ereg_backward(dV.data(), V.data(), valid.data(), mu.data(), G.data(), stat.data(), 1.0f, B, T, D);
    double e = fd_error(V, dV, loss, 60);
    CHECK(e < FD_TOL, "regulariser dV: rel err %.2e vs finite differences", e);
    for (int i = 0; i < B * T * D; i++)
        CHECK(valid[i / D] != 0 || dV[i] == 0, "padding position %d has gradient %g", i / D, dV[i]);
    CHECK(stat[8] == 0, "a sequence with one valid position has S2 %g, not 0", stat[8]);
    for (int i = 2 * T * D; i < 3 * T * D; i++) CHECK(dV[i] == 0, "the one-position sequence has gradient %g", dV[i]);
}

TEST(ereg_rank_one_values_have_s2_zero) {
    int T = 9, D = 5;
    std::vector<float> u = randv(D, 43), a = randv(T, 44), V((size_t)T * D), valid(T, 1.0f);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < D; j++) V[t * D + j] = a[t] * u[j];  // every value on the line of u
    float s2 = ereg_s2(V, valid, T, D);
    CHECK(std::fabs(s2) < 1e-5, "rank-1 values: S2 = %g, want 0", s2);
}

TEST(ereg_orthonormal_directions_have_s2_ln_d) {
    int D = 6, T = 2 * D;
    std::vector<float> V((size_t)T * D, 0.0f), valid(T, 1.0f);
    for (int i = 0; i < D; i++) V[(2 * i) * D + i] = 1, V[(2 * i + 1) * D + i] = -1;  // +-e_i: mean 0, G = 2 I
    float s2 = ereg_s2(V, valid, T, D);
    CHECK(std::fabs(s2 - std::log((double)D)) < 1e-6, "D = %d equal orthonormal directions: S2 = %.7g, want ln D = %.7g", D,
          s2, std::log((double)D));
    // rotated by a random orthogonal-ish mixing of two coordinates, S2 stays ln D (a spectrum, not a basis)
    double c = std::cos(0.7), s = std::sin(0.7);
    for (int t = 0; t < T; t++) {
        float x = V[t * D], y = V[t * D + 1];
        V[t * D] = (float)(c * x - s * y), V[t * D + 1] = (float)(s * x + c * y);
    }
    s2 = ereg_s2(V, valid, T, D);
    CHECK(std::fabs(s2 - std::log((double)D)) < 1e-5, "rotated: S2 = %.7g, want ln D", s2);
}

TEST(ereg_zero_gram_and_single_position_give_zero_without_nan) {
    int T = 4, D = 3;
    std::vector<float> V((size_t)T * D, 0.5f), valid(T, 1.0f), dV;  // every value the same: Z = 0, tr(G) = 0
    float s2 = ereg_s2(V, valid, T, D, &dV);
    CHECK(s2 == 0, "zero Gram matrix: S2 = %g, want 0", s2);
    for (float g : dV) CHECK(g == 0, "zero Gram matrix: gradient %g, want 0 (not NaN)", g);
    V = randv((size_t)T * D, 45);
    valid = {0, 1, 0, 0};  // one valid position
    s2 = ereg_s2(V, valid, T, D, &dV);
    CHECK(s2 == 0, "one valid position: S2 = %g, want 0", s2);
    for (float g : dV) CHECK(g == 0, "one valid position: gradient %g, want 0", g);
    valid.assign(T, 0.0f);  // none
    s2 = ereg_s2(V, valid, T, D, &dV);
    CHECK(s2 == 0, "no valid position: S2 = %g, want 0", s2);
}

TEST(ereg_model_gradients_match_finite_differences) {
    Config c = tiny_config(ARCH_LLAMA, 4, 2);
    c.entropy_reg = 1.0f;
    check_model_gradients(c);
    c = tiny_config(ARCH_LIME, 4, 2);
    c.entropy_reg = 1.0f;
    check_model_gradients(c);
}

TEST(ereg_loss_is_ce_minus_lambda_mean_s2_and_eval_is_plain_ce) {
    Config c = tiny_config(ARCH_LLAMA, 4, 2);
    Model plain, reg;
    FreeOnReturn guard{&plain, &reg};
    CHECK(model_create(&plain, c, 2, DEVICE_CPU).empty(), "model_create failed");
    c.entropy_reg = 0.3f;
    CHECK(model_create(&reg, c, 2, DEVICE_CPU).empty(), "model_create failed");
    model_init(&plain, 7);
    model_init(&reg, 7);
    TinyBatch b(c.V);
    float ce = model_forward(&plain, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T);
    float total = model_forward(&reg, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T, b.valid.data());
    CHECK(reg.last_ce == ce, "regularised model's ce %.9g differs from the plain model's %.9g", reg.last_ce, ce);
    CHECK(reg.last_s2 > 0, "mean S2 %g, want > 0 on random values", reg.last_s2);
    CHECK(total == ce - 0.3f * reg.last_s2, "loss %.9g != ce - 0.3 s2 = %.9g", total, ce - 0.3f * reg.last_s2);
    float eval = model_forward(&reg, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T);  // no valid mask
    CHECK(eval == ce, "forward without a valid mask: loss %.9g, want the plain ce %.9g", eval, ce);
    CHECK(reg.last_s2 == 0, "forward without a valid mask: mean S2 %g, want 0", reg.last_s2);
}

TEST(ereg_lambda_zero_is_bit_identical_and_allocates_nothing) {
    Config c = tiny_config(ARCH_LIME, 4, 2);
    Acts probe;
    size_t off = acts_carve(&probe, c, 2, nullptr);
    c.entropy_reg = 0.1f;
    CHECK(acts_carve(&probe, c, 2, nullptr) > off, "entropy_reg 0.1 adds no activations");
    c.entropy_reg = 0;
    std::vector<float> params[2];
    float losses[2][3];
    for (int run = 0; run < 2; run++) {  // lambda 0: with and without the valid mask, as before the regulariser
        Model m;
        FreeOnReturn guard{&m};
        CHECK(model_create(&m, c, 2, DEVICE_CPU).empty(), "model_create failed");
        model_init(&m, 3);
        TinyBatch b(c.V);
        AdamWConfig opt;
        for (int s = 0; s < 3; s++) {
            model_train_step(&m, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T, opt, 1.0f,
                             run ? b.valid.data() : nullptr);
            float norm;
            model_metrics(&m, &losses[run][s], &norm);
            CHECK(!m.loss_term_on, "lambda 0 turned the regulariser on (step %d)", s + 1);
            CHECK(m.last_s2 == 0, "lambda 0 computed a mean S2 of %g (step %d)", m.last_s2, s + 1);
        }
        params[run].assign(m.params, m.params + m.n_params);
    }
    for (int s = 0; s < 3; s++) CHECK(losses[0][s] == losses[1][s], "step %d: loss %.9g vs %.9g", s, losses[0][s], losses[1][s]);
    CHECK(params[0] == params[1], "lambda 0 with a valid mask moved the weights differently");
}

TEST(ereg_config_round_trip) {
    Config c = tiny_config(ARCH_LLAMA, 4, 2);
    CHECK(config_to_json(c).find("entropy_reg") == std::string::npos, "entropy_reg 0 is written");
    c.entropy_reg = 0.25f;
    std::string json = config_to_json(c);
    Config back;
    std::string err = config_from_json(json, &back);
    CHECK(err.empty(), "config_from_json: %s", err.c_str());
    CHECK(back.entropy_reg == 0.25f, "entropy_reg read back as %g", back.entropy_reg);
    CHECK(!config_diff(c, tiny_config(ARCH_LLAMA, 4, 2)).empty(), "config_diff misses entropy_reg");
    std::string bad = json;
    bad.replace(bad.find("0.25"), 4, "-1.5");
    CHECK(!config_from_json(bad, &back).empty(), "entropy_reg -1.5 accepted");
}

// ---------------------------------------------------------------------------
// The study-model interface is open (support/model/study.h): a peer defined
// here alone, a learned scalar on each residual add, registered, trained and
// checked. Nothing outside this file names it.
//   xout = x + s[l][k] * (inp @ W^T)      s (2) per layer: k = 0 attention, 1 the MLP; init 1 (LLaMa)
// Its activations: y (2L, B, T, d) each sublayer's product, and dy (B, T, d).
// CPU only (its loops are plain, as a first version of a peer would be).
static float* open_peer_y(const StudyAt& at, int s) { return at.acts + (size_t)s * at.model->B * at.model->c.T * at.model->c.d; }
static float* open_peer_dy(const StudyAt& at) { return open_peer_y(at, 2 * at.model->c.L); }
static StudyHooks open_peer_hooks() {
    StudyHooks h = {};
    h.specs = [](const Config& c, int l, const std::string& layer, const AddTensor& add) {
        (void)c, (void)l;
        add(layer + "residual_scale.weight", {2}, GROUP_EMBED_GAIN);
    };
    h.carve = [](const Config&, int l, Params* p, const NextTensor& next) { p->layer[l].study.push_back(next()); };
    h.init = [](Model* model) {
        for (LayerParams& w : model->p.layer) w.study[0][0] = w.study[0][1] = 1.0f;
    };
    h.acts_floats = [](const Config& c, int B) { return (size_t)(2 * c.L + 1) * B * c.T * c.d; };
    h.scratch_floats = [](const Config&, int, Device) -> size_t { return 0; };
    h.residual_add = [](const StudyAt& at, float* xout, const float* inp, const float* W, int C) {
        float* y = open_peer_y(at, at.s);
        at.ops->matmul_forward(at.model, y, inp, W, at.N(), C, at.model->c.d, false);  // y = inp @ W^T
        float s = pass_params(at.model).layer[at.l()].study[0][at.s % 2];
        for (size_t i = 0; i < (size_t)at.N() * at.model->c.d; i++) xout[i] += s * y[i];  // xout holds x
    };
    h.residual_backward = [](const StudyAt& at, const float* dxout) -> const float* {
        // forward: xout = x + s y:  dy = s dxout;  ds += sum dxout . y  (dx = dxout passes on)
        const float* y = open_peer_y(at, at.s);
        float* dy = open_peer_dy(at);
        float s = pass_params(at.model).layer[at.l()].study[0][at.s % 2];
        double ds = 0;
        for (size_t i = 0; i < (size_t)at.N() * at.model->c.d; i++) dy[i] = s * dxout[i], ds += (double)dxout[i] * y[i];
        pass_grads(at.model).layer[at.l()].study[0][at.s % 2] += (float)ds;
        return dy;
    };
    return h;
}
static const StudyHooks OPEN_PEER_HOOKS = open_peer_hooks();
static Arch open_peer_arch() {  // registered once, on first use
    static int arch = -1;
    std::string why;
    if (arch < 0) arch = register_model({"scaled", "LLaMa with a learned scalar on each residual add (a test's peer)",
                                         "", &OPEN_PEER_HOOKS}, &why);
    return (Arch)arch;
}

TEST(an_open_peer_registers_and_parses_by_name) {
    Arch a = open_peer_arch();
    CHECK(a >= 5, "register_model gave Arch %d", (int)a);
    Arch parsed;
    CHECK(arch_parse("scaled", &parsed) && parsed == a, "arch_parse(\"scaled\") did not find the registered peer");
    CHECK(model_names().find("scaled") != std::string::npos, "model_names() lacks the peer: %s", model_names().c_str());
    CHECK(registry_check().empty(), "registry_check: %s", registry_check().c_str());
}
TEST(an_open_peer_at_init_is_llama) {
    Config cp = tiny_config(open_peer_arch(), 2, 2), cl = tiny_config(ARCH_LLAMA, 2, 2);
    Model p, l;
    FreeOnReturn guard{&p, &l};
    CHECK(model_create(&p, cp, 2, DEVICE_CPU).empty() && model_create(&l, cl, 2, DEVICE_CPU).empty(), "model_create");
    model_init(&p, 3), model_init(&l, 3);
    CHECK(p.n_params == l.n_params + 2 * (size_t)cp.L, "the peer has %zu parameters, LLaMa %zu", p.n_params, l.n_params);
    TinyBatch b(cp.V);
    float lp = model_forward(&p, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T);
    float ll = model_forward(&l, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T);
    CHECK(lp == ll, "the peer's loss at init %.9g, LLaMa's %.9g (s = 1: the same sums)", lp, ll);
}
TEST(an_open_peer_gradients_match_finite_differences) { check_model_gradients(tiny_config(open_peer_arch(), 2, 2)); }
TEST(an_open_peer_trains_three_steps) {
    Config c = tiny_config(open_peer_arch(), 2, 2);
    Model m;
    FreeOnReturn guard{&m};
    CHECK(model_create(&m, c, 2, DEVICE_CPU).empty(), "model_create");
    model_init(&m, 7);
    TinyBatch b(c.V);
    AdamWConfig opt;
    float first = 0, loss = 0, norm = 0;
    for (int s = 0; s < 3; s++) {
        model_train_step(&m, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T, opt, 1.0f);
        model_metrics(&m, &loss, &norm);
        if (s == 0) first = loss;
    }
    CHECK(std::isfinite(loss) && loss < first, "3 steps: loss %.4f after %.4f", loss, first);
    float s0 = m.p.layer[0].study[0][0];
    CHECK(s0 != 1.0f, "the attention add's scale of layer 0 did not move from 1 (%g)", s0);
}
// A second peer defined here alone, through the attention's three inputs
// (kv_inputs): the keys and values read their own norm of x, with a gain of
// their own; the queries keep LLaMa's.
//   q = rmsnorm(x, g_attn) @ Wq^T;  K, V = ak @ (Wk, Wv)^T,  ak = rmsnorm(x, g_kv[l])   g_kv (d), init 1
// Its activations: ak (L, B, T, d), rstd (L, B, T), dak (B, T, d) (one layer's at a time).
struct KvNormActs {
    float *ak, *rstd, *dak;
};
static KvNormActs kv_norm_acts(const StudyAt& at) {
    size_t N = (size_t)at.model->B * at.model->c.T, d = at.model->c.d, L = at.model->c.L;
    return {at.acts + at.l() * N * d, at.acts + L * N * d + at.l() * N, at.acts + L * N * (d + 1)};
}
static StudyHooks kv_norm_peer_hooks() {
    StudyHooks h = {};
    h.specs = [](const Config& c, int, const std::string& layer, const AddTensor& add) {
        add(layer + "input_layernorm_kv.weight", {c.d}, GROUP_EMBED_GAIN);
    };
    h.carve = [](const Config&, int l, Params* p, const NextTensor& next) { p->layer[l].study.push_back(next()); };
    h.init = [](Model* model) {
        for (LayerParams& w : model->p.layer) std::fill(w.study[0], w.study[0] + model->c.d, 1.0f);
    };
    h.acts_floats = [](const Config& c, int B) { return (size_t)B * c.T * (c.L * (c.d + 1) + c.d); };
    h.scratch_floats = [](const Config&, int, Device) -> size_t { return 0; };
    h.norm_input = [](const StudyAt& at, const float* x) {  // the attention's: ak beside the q input
        KvNormActs a = kv_norm_acts(at);
        if (at.s % 2 == 0)
            at.ops->rmsnorm_forward(at.model, a.ak, a.rstd, x, pass_params(at.model).layer[at.l()].study[0], at.N(), nullptr);
        return x;
    };
    h.norm_input_backward = [](const StudyAt& at, const NormGrad& g) {  // dx += both norms' backward
        at.ops->rmsnorm_backward(at.model, g.dx, g.dg, at.lime.dnorm, g.x, g.g, g.rstd, at.N());
        if (at.s % 2) return;
        KvNormActs a = kv_norm_acts(at);
        at.ops->rmsnorm_backward(at.model, g.dx, pass_grads(at.model).layer[at.l()].study[0], a.dak, g.x,
                                 pass_params(at.model).layer[at.l()].study[0], a.rstd, at.N());
    };
    h.kv_inputs = [](const StudyAt& at) {  // K and V read ak; their gradients, summed, go to dak
        KvNormActs a = kv_norm_acts(at);
        return KvInputs{a.ak, a.ak, a.dak, a.dak};
    };
    return h;
}
static const StudyHooks KV_NORM_PEER_HOOKS = kv_norm_peer_hooks();
static Arch kv_norm_peer_arch() {
    static int arch = -1;
    std::string why;
    if (arch < 0) arch = register_model({"kv-norm", "LLaMa whose keys and values read a norm of their own (a test's peer)",
                                         "", &KV_NORM_PEER_HOOKS}, &why);
    return (Arch)arch;
}
TEST(an_open_peer_with_its_own_key_and_value_inputs_at_init_is_llama) {
    Config cp = tiny_config(kv_norm_peer_arch(), 4, 2), cl = tiny_config(ARCH_LLAMA, 4, 2);
    Model p, l;
    FreeOnReturn guard{&p, &l};
    CHECK(model_create(&p, cp, 2, DEVICE_CPU).empty() && model_create(&l, cl, 2, DEVICE_CPU).empty(), "model_create");
    model_init(&p, 3), model_init(&l, 3);
    TinyBatch b(cp.V);
    float lp = model_forward(&p, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T);
    float ll = model_forward(&l, b.tokens.data(), b.targets.data(), b.mask.data(), b.B, b.T);
    CHECK(lp == ll, "the peer's loss at init %.9g, LLaMa's %.9g (g_kv = g_attn = 1: the same inputs)", lp, ll);
}
TEST(an_open_peer_with_its_own_key_and_value_inputs_gradients_match_finite_differences) {
    check_model_gradients(tiny_config(kv_norm_peer_arch(), 4, 2));
}

TEST(a_registry_row_without_a_required_hook_is_refused) {
    StudyHooks bad = open_peer_hooks();
    bad.carve = nullptr;
    static StudyHooks keep;  // the row would point at it: it must outlive the call
    keep = bad;
    std::string why;
    int a = register_model({"no-carve", "a peer without its carve hook", "", &keep}, &why);
    CHECK(a == -1, "register_model took a row without carve (Arch %d)", a);
    CHECK(why.find("no-carve") != std::string::npos && why.find("required hook") != std::string::npos,
          "the refusal does not name the row and the hook: '%s'", why.c_str());
    Arch parsed;
    CHECK(!arch_parse("no-carve", &parsed), "the refused row is still in the registry");
    keep = open_peer_hooks(), keep.values = [](const StudyAt&, const float* V) { return V; };  // a forward without its backward
    a = register_model({"half", "a peer with a forward hook and no backward", "", &keep}, &why);
    CHECK(a == -1 && why.find("without its backward") != std::string::npos, "a half hook was taken: '%s'", why.c_str());
}
