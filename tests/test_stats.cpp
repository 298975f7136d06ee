// tests/test_stats.cpp — stats.h against values computed independently in
// Python with mpmath 1.3 at 30 digits: the t CDF by numerical integration of
// the t density (mpmath.quad), quantiles by root finding on that integral,
// Welch's t and df from the textbook formulas.
#include "support/stats.h"
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
    CHECK(std::isnan(stats_std({1.0})) && std::isnan(stats_mean({})), "undefined cases must be NaN");
}

TEST(stats_incomplete_beta) {
    // I_0.3(2, 3) = sum_{j=2..4} C(4,j) 0.3^j 0.7^(4-j) = 0.3483 exactly
    CHECK(near(stats_beta_inc(2, 3, 0.3), 0.3483, 1e-13), "I_0.3(2,3) = %.15g", stats_beta_inc(2, 3, 0.3));
    CHECK(near(stats_beta_inc(0.5, 5, 0.9), 0.99999742941030077, 1e-12), "I_0.9(0.5,5) = %.15g", stats_beta_inc(0.5, 5, 0.9));
    CHECK(stats_beta_inc(2, 3, 0) == 0 && stats_beta_inc(2, 3, 1) == 1, "ends");
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
    CHECK(near(r.lo, 0.20042142198664407, 1e-9) && near(r.hi, 3.9367214351562130, 1e-9), "95%% CI [%.12g, %.12g]", r.lo, r.hi);
    WelchResult swapped = stats_welch(B, A);   // antisymmetric in the order of the samples
    CHECK(near(swapped.t, -r.t, 1e-14) && near(swapped.p, r.p, 1e-14) && near(swapped.lo, -r.hi, 1e-12), "swap");
    WelchResult same = stats_welch({1, 2, 3}, {1, 2, 3});
    CHECK(same.t == 0 && near(same.p, 1, 1e-14), "identical samples: t 0, p 1 (got %g, %g)", same.t, same.p);
    CHECK(std::isnan(stats_welch({1}, B).p) && std::isnan(stats_welch({2, 2}, {3, 3}).t), "undefined cases must be NaN");
}
