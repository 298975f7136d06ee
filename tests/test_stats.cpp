// tests/test_stats.cpp — support/lib/stats.h (and support/commands/analyze.cpp's layer_entropy, on inputs
// whose entropy is known in closed form) against values computed independently in
// Python with mpmath 1.3 at 30 digits: the t CDF by numerical integration of
// the t density (mpmath.quad), quantiles by root finding on that integral,
// Welch's t and df from the textbook formulas.
#include "support/lib/stats.h"
#include "support/commands/commands.h"  // layer_entropy
#include "test.h"

static bool near(double got, double want, double tol) { return std::fabs(got - want) <= tol * (1 + std::fabs(want)); }

static const std::vector<double> A = {2.1, 3.4, 1.9, 5.6, 4.2};
static const std::vector<double> B = {1.2, 0.8, 2.5, 1.9, 1.1, 0.4, 1.7};

TEST(stats_mean_std) {
    CHECK(near(stats_mean(A), 3.44, 1e-14), "mean A %.15g", stats_mean(A));
    CHECK(near(stats_mean(B), 1.3714285714285714, 1e-14), "mean B %.15g", stats_mean(B));
    CHECK(near(stats_std(A), 1.5339491516996252, 1e-13), "std A %.15g", stats_std(A));
    CHECK(near(stats_std(B), 0.71113591226592239, 1e-13), "std B %.15g", stats_std(B));
    CHECK(near(stats_std({1, 2, 3, 4}), 1.2909944487358056, 1e-14), "std 1..4 = sqrt(5/3)");
    CHECK(std::isnan(stats_std({1.0})), "the std of one value is %g, want NaN", stats_std({1.0}));
    CHECK(std::isnan(stats_mean({})), "the mean of no values is %g, want NaN", stats_mean({}));
}

TEST(stats_incomplete_beta) {
    // I_0.3(2, 3) = sum_{j=2..4} C(4,j) 0.3^j 0.7^(4-j) = 0.3483 exactly
    CHECK(near(stats_beta_inc(2, 3, 0.3), 0.3483, 1e-13), "I_0.3(2,3) = %.15g", stats_beta_inc(2, 3, 0.3));
    CHECK(near(stats_beta_inc(0.5, 5, 0.9), 0.99999742941030077, 1e-12), "I_0.9(0.5,5) = %.15g", stats_beta_inc(0.5, 5, 0.9));
    CHECK(stats_beta_inc(2, 3, 0) == 0, "I_0(2,3) = %.15g, want 0", stats_beta_inc(2, 3, 0));
    CHECK(stats_beta_inc(2, 3, 1) == 1, "I_1(2,3) = %.15g, want 1", stats_beta_inc(2, 3, 1));
}

TEST(stats_t_cdf_and_quantiles) {
    CHECK(near(stats_t_cdf(2, 3), 0.93033701572057841, 1e-12), "cdf(2; 3) = %.15g", stats_t_cdf(2, 3));
    CHECK(near(stats_t_cdf(-1.5, 7.5), 0.087240285293232117, 1e-12), "cdf(-1.5; 7.5) = %.15g", stats_t_cdf(-1.5, 7.5));
    CHECK(stats_t_cdf(0, 5) == 0.5, "cdf(0) = 0.5");
    struct { double df, q; } table[] = {{1, 12.706204736174705}, {4, 2.7764451051977944},
                                        {10, 2.2281388519862747}, {30, 2.0422724563012383}};
    for (auto& row : table) {
        double q = stats_t_quantile(0.975, row.df);
        CHECK(near(q, row.q, 1e-10), "t_0.975(df=%g) = %.12g, want %.12g", row.df, q, row.q);
        CHECK(near(stats_t_quantile(0.025, row.df), -row.q, 1e-10), "symmetry at df=%g", row.df);
    }
}

TEST(stats_welch) {
    WelchResult r = stats_welch(A, B);
    CHECK(near(r.diff, 2.0685714285714285, 1e-13), "diff %.15g", r.diff);
    CHECK(near(r.t, 2.8075832429239481, 1e-12), "t %.15g", r.t);
    CHECK(near(r.df, 5.2400722116867348, 1e-12), "df %.15g", r.df);
    CHECK(near(r.p, 0.03575065534843366, 1e-10), "p %.15g", r.p);
    CHECK(near(r.lo, 0.20042142198664407, 1e-9), "95%% CI low end %.12g, want 0.200421421987", r.lo);
    CHECK(near(r.hi, 3.9367214351562130, 1e-9), "95%% CI high end %.12g, want 3.93672143516", r.hi);
    WelchResult swapped = stats_welch(B, A);   // antisymmetric in the order of the samples
    CHECK(near(swapped.t, -r.t, 1e-14), "swapped samples: t %.15g, want %.15g", swapped.t, -r.t);
    CHECK(near(swapped.p, r.p, 1e-14), "swapped samples: p %.15g, want %.15g", swapped.p, r.p);
    CHECK(near(swapped.lo, -r.hi, 1e-12), "swapped samples: CI low end %.15g, want %.15g", swapped.lo, -r.hi);
    WelchResult same = stats_welch({1, 2, 3}, {1, 2, 3});
    CHECK(same.t == 0, "identical samples: t %g, want 0", same.t);
    CHECK(near(same.p, 1, 1e-14), "identical samples: p %.15g, want 1", same.p);
    CHECK(std::isnan(stats_welch({1}, B).p), "one value against seven: p %g, want NaN", stats_welch({1}, B).p);
    CHECK(std::isnan(stats_welch({2, 2}, {3, 3}).t), "samples without spread: t %g, want NaN", stats_welch({2, 2}, {3, 3}).t);
}

// Exact Wilcoxon p against hand-worked enumerations of the 2^n sign patterns
// and the published table (n = 10: P(W- <= 8) = 25/1024 = 0.0244, the 0.05
// two-sided critical value in e.g. Wilcoxon, Katti & Wilcox 1970).
TEST(stats_wilcoxon_exact) {
    // n = 5, all positive: W+ = 15 is one pattern of 32, and W+ = 0 its mirror: 2/32
    CHECK(near(stats_wilcoxon_p({0.1, 0.2, 0.3, 0.4, 0.5}), 2.0 / 32, 1e-14), "n=5 all +: %.15g",
          stats_wilcoxon_p({0.1, 0.2, 0.3, 0.4, 0.5}));
    // a zero is dropped: the same as n = 5
    CHECK(near(stats_wilcoxon_p({0, 1, 2, 3, 4, 5}), 2.0 / 32, 1e-14), "zero not dropped: %.15g",
          stats_wilcoxon_p({0, 1, 2, 3, 4, 5}));
    // {1, -2, 3}: W+ = 4, mean 3; the 8 subset sums of {1,2,3} are 0,1,2,3,3,4,5,6, six of them 1 or more from 3
    CHECK(near(stats_wilcoxon_p({1, -2, 3}), 6.0 / 8, 1e-14), "{1,-2,3}: %.15g", stats_wilcoxon_p({1, -2, 3}));
    // n = 10, negatives at ranks 3 and 5 (W- = 8): two-sided 2 * 25/1024
    std::vector<double> d = {1, 2, -3, 4, -5, 6, 7, 8, 9, 10};
    CHECK(near(stats_wilcoxon_p(d), 50.0 / 1024, 1e-14), "n=10 W-=8: %.15g, want 0.048828125", stats_wilcoxon_p(d));
    // ties: {1, 2, 2, -3} has ranks 1, 2.5, 2.5, 4 and W+ = 6 (mean 5); of the 16 subset
    // sums only {1,4} and {2.5,2.5} give 5, closer than 1: p = 14/16
    CHECK(near(stats_wilcoxon_p({1, 2, 2, -3}), 14.0 / 16, 1e-14), "ties: %.15g", stats_wilcoxon_p({1, 2, 2, -3}));
    CHECK(stats_wilcoxon_p({0, 0}) == 1, "no nonzero difference: p must be 1");
}

TEST(stats_paired_t_interval_median_and_counts) {
    // differences 1..5: mean 3, sd sqrt(2.5), se sqrt(0.5); t table: t_0.975(4) = 2.776
    PairedResult r = stats_paired({2, 4, 6, 8, 10}, {1, 2, 3, 4, 5});
    double half = 2.7764451051977944 * std::sqrt(0.5);
    CHECK(near(r.mean, 3, 1e-14), "mean %.15g, want 3", r.mean);
    CHECK(near(r.t, 3 / std::sqrt(0.5), 1e-13), "t %.15g, want 3 / sqrt(0.5)", r.t);
    CHECK(near(r.lo, 3 - half, 1e-9), "95%% CI low end %.12g, want %.12g", r.lo, 3 - half);
    CHECK(near(r.hi, 3 + half, 1e-9), "95%% CI high end %.12g, want %.12g", r.hi, 3 + half);
    struct { const char* name; int got, want; } counts[] = {
        {"wins", r.wins, 5}, {"ties", r.ties, 0}, {"losses", r.losses, 0}, {"n", r.n, 5}};
    for (auto& k : counts) CHECK(k.got == k.want, "%s %d, want %d", k.name, k.got, k.want);
    CHECK(near(r.p_wilcoxon, 2.0 / 32, 1e-14), "signed-rank p %g", r.p_wilcoxon);
    PairedResult m = stats_paired({1, 5, 2, 7}, {1, 3, 5, 2});  // d = 0, 2, -3, 5
    struct { const char* name; int got, want; } mixed[] = {{"wins", m.wins, 2}, {"ties", m.ties, 1}, {"losses", m.losses, 1}};
    for (auto& k : mixed) CHECK(k.got == k.want, "d = 0, 2, -3, 5: %s %d, want %d", k.name, k.got, k.want);
    CHECK(near(m.median, 1, 1e-14), "d = 0, 2, -3, 5: median %g, want 1", m.median);
    CHECK(std::isnan(stats_paired({1, 2}, {0, 1}).lo), "differences without spread: no interval");
}

// Entropy as the paper's authors measure it, on inputs with a closed form.
// Two sequences (N = 2) of T = 4 real positions, stored with a stride of 5
// positions whose last one is padding (garbage that must be ignored).
static std::vector<float> two_sequences(const std::vector<std::vector<float>>& rows0,
                                        const std::vector<std::vector<float>>& rows1, int D) {
    std::vector<float> x((size_t)2 * 5 * D, 1e6f);  // padding: huge, so using it would show
    for (int t = 0; t < 4; t++)
        for (int j = 0; j < D; j++) x[(size_t)t * D + j] = rows0[t][j], x[((size_t)5 + t) * D + j] = rows1[t][j];
    return x;
}

TEST(entropy_of_rank_one_values_is_zero) {
    // every row a multiple of u: z-scoring each feature keeps them multiples of
    // one vector, so the Gram matrix has one non-zero eigenvalue: entropy 0 for every alpha
    std::vector<float> u = {0.3f, -1.2f, 2.0f};
    std::vector<std::vector<float>> r0, r1;
    for (float a : {1.f, 2.f, 3.f, 4.f}) r0.push_back({a * u[0], a * u[1], a * u[2]});
    for (float b : {-1.f, 0.5f, 2.f, -3.f}) r1.push_back({b * u[0], b * u[1], b * u[2]});
    std::vector<float> x = two_sequences(r0, r1, 3);
    for (double alpha : {0.5, 1.0, 2.0}) {
        EntropyStat e = layer_entropy(x.data(), 2, 5, 3, {4, 4}, alpha);
        CHECK(std::fabs(e.mean) < 1e-6, "rank-1 values, alpha %g: entropy %.3g, want 0", alpha, e.mean);
        CHECK(e.std < 1e-6, "rank-1 values, alpha %g: entropy's std over the sequences %.3g, want 0", alpha, e.std);
    }
}

TEST(entropy_of_orthogonal_equal_norm_rows_is_log_T) {
    // sequence 0: rows 2 e_t; sequence 1 its negation. Each feature then has mean 0 and the same
    // std over the 8 positions, so the z-scored rows stay orthogonal with equal norms:
    // the normalised spectrum is 1/4 four times, whose Renyi entropy is ln 4 for every alpha
    std::vector<std::vector<float>> r0(4, std::vector<float>(4, 0.f)), r1 = r0;
    for (int t = 0; t < 4; t++) r0[t][t] = 2.f, r1[t][t] = -2.f;
    std::vector<float> x = two_sequences(r0, r1, 4);
    for (double alpha : {0.5, 1.0, 2.0, 3.0}) {
        EntropyStat e = layer_entropy(x.data(), 2, 5, 4, {4, 4}, alpha);
        CHECK(near(e.mean, std::log(4.0), 1e-9), "orthogonal rows, alpha %g: entropy %.12g, want ln 4 = %.12g", alpha, e.mean,
              std::log(4.0));
        CHECK(e.std < 1e-9, "orthogonal rows, alpha %g: entropy's std over the sequences %.3g, want 0", alpha, e.std);
    }
}

TEST(stats_sign_test) {
    // 8 wins of 9: p = 2 (C(9,0) + C(9,1)) / 2^9 = 20/512; 5 of 5: 2/32; 3 of 6: capped at 1
    CHECK(near(stats_sign_test_p(8, 1), 20.0 / 512, 1e-13), "8 vs 1: p = %.15g, want 20/512", stats_sign_test_p(8, 1));
    CHECK(near(stats_sign_test_p(1, 8), 20.0 / 512, 1e-13), "1 vs 8: p = %.15g, want 20/512", stats_sign_test_p(1, 8));
    CHECK(near(stats_sign_test_p(5, 0), 2.0 / 32, 1e-13), "5 vs 0: p = %.15g, want 2/32", stats_sign_test_p(5, 0));
    CHECK(stats_sign_test_p(3, 3) == 1, "3 vs 3: p = %.15g, want 1", stats_sign_test_p(3, 3));
    CHECK(stats_sign_test_p(0, 0) == 1, "no pair: p = %.15g, want 1", stats_sign_test_p(0, 0));
}

TEST(stats_kaplan_meier_leukemia) {
    // Freireich's 6-MP arm (weeks of remission, + censored), the textbook example
    // (Klein & Moeschberger; Kleinbaum): S by hand from the at-risk counts, the
    // Greenwood standard errors as survfit prints them (4 digits)
    std::vector<double> t = {6, 6, 6, 7, 10, 13, 16, 22, 23, 6, 9, 10, 11, 17, 19, 20, 25, 32, 32, 34, 35};
    std::vector<bool> event(t.size(), false);
    for (int i = 0; i < 9; i++) event[i] = true;
    SurvivalResult r = stats_kaplan_meier(t, event);
    struct { double t; int at_risk, events; double s, se; } want[] = {
        {6, 21, 3, 18.0 / 21, 0.0764}, {7, 17, 1, 18.0 / 21 * 16 / 17, 0.0869},
        {10, 15, 1, 18.0 / 21 * 16 / 17 * 14 / 15, 0.0963}, {13, 12, 1, 18.0 / 21 * 16 / 17 * 14 / 15 * 11 / 12, 0.1068},
        {16, 11, 1, 18.0 / 21 * 16 / 17 * 14 / 15 * 11 / 12 * 10 / 11, 0.1141},
        {22, 7, 1, 18.0 / 21 * 16 / 17 * 14 / 15 * 11 / 12 * 10 / 11 * 6 / 7, 0.1282},
        {23, 6, 1, 18.0 / 21 * 16 / 17 * 14 / 15 * 11 / 12 * 10 / 11 * 6 / 7 * 5 / 6, 0.1346}};
    CHECK(r.steps.size() == 7, "%zu event times, want 7", r.steps.size());
    CHECK(r.n == 21 && r.events == 9, "n %d, events %d; want 21 and 9", r.n, r.events);
    for (size_t i = 0; i < r.steps.size() && i < 7; i++) {
        const KaplanMeierStep& k = r.steps[i];
        CHECK(k.t == want[i].t && k.at_risk == want[i].at_risk && k.events == want[i].events,
              "step %zu: t %g, at risk %d, events %d; want %g, %d, %d", i, k.t, k.at_risk, k.events, want[i].t,
              want[i].at_risk, want[i].events);
        CHECK(near(k.survival, want[i].s, 1e-13), "S(%g) = %.15g, want %.15g", k.t, k.survival, want[i].s);
        CHECK(std::fabs(k.se - want[i].se) < 6e-5, "se S(%g) = %.6f, want %.4f", k.t, k.se, want[i].se);
    }
    // median: S first <= 1/2 at 23; the interval: S - 1.96 se first <= 1/2 at 13
    // (0.690 - 0.209; at 10, 0.753 - 0.189 > 1/2); S + 1.96 se never gets there
    CHECK(r.median == 23 && r.lo == 13 && std::isinf(r.hi), "median %g (%g to %g), want 23 (13 to inf)", r.median,
          r.lo, r.hi);
}

TEST(stats_kaplan_meier_no_censoring_is_the_empirical_curve) {
    // every subject's event seen: S is the share of times above t; the median the
    // first time at which half have had theirs; all events at one time: S drops to 0, se 0
    SurvivalResult r = stats_kaplan_meier({40, 10, 30, 20}, {true, true, true, true});
    CHECK(r.steps.size() == 4 && near(r.steps[1].survival, 0.5, 1e-15) && r.median == 20,
          "S(20) = %g, median %g; want 0.5 and 20", r.steps.size() > 1 ? r.steps[1].survival : NAN, r.median);
    SurvivalResult all = stats_kaplan_meier({5, 5, 5}, {true, true, true});
    CHECK(all.steps.size() == 1 && all.steps[0].survival == 0 && all.steps[0].se == 0 && all.median == 5 &&
              all.lo == 5 && all.hi == 5,
          "three events at 5: S %g, se %g, median %g (%g to %g); want 0, 0, 5 (5 to 5)",
          all.steps.empty() ? NAN : all.steps[0].survival, all.steps.empty() ? NAN : all.steps[0].se, all.median,
          all.lo, all.hi);
    SurvivalResult none = stats_kaplan_meier({9, 9}, {false, false});
    CHECK(none.steps.empty() && std::isinf(none.median) && none.events == 0,
          "every subject censored: %zu steps, median %g; want none and inf", none.steps.size(), none.median);
}
