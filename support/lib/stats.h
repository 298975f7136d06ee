// support/lib/stats.h — the statistics that compare runs across seeds: mean, sample
// standard deviation, Welch's t-test (unequal variances) with its two-sided
// p-value, and the 95% confidence interval of the difference of means; for
// paired seeds, the paired t interval, median, wins/ties/losses and the
// exact Wilcoxon signed-rank p; the exact sign test; and for times with
// censoring (time to learn), the Kaplan-Meier curve with the median's
// Brookmeyer-Crowley interval.
//
// The Student t distribution comes from the regularized incomplete beta
// function I_x(a, b), evaluated by its continued fraction (modified Lentz;
// Numerical Recipes §6.4). Accurate to ~1e-12, far more than seeds justify.
#pragma once
#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <limits>
#include <vector>

inline double stats_mean(const std::vector<double>& x) {
    if (x.empty()) return std::numeric_limits<double>::quiet_NaN();
    double s = 0;
    for (double v : x) s += v;
    return s / (double)x.size();
}

// Sample standard deviation (divides by n - 1); NaN for fewer than 2 values.
inline double stats_std(const std::vector<double>& x) {
    if (x.size() < 2) return std::numeric_limits<double>::quiet_NaN();
    double m = stats_mean(x), ss = 0;
    for (double v : x) ss += (v - m) * (v - m);
    return std::sqrt(ss / (double)(x.size() - 1));
}

// The continued fraction of I_x(a, b), good for x < (a + 1) / (a + b + 2).
inline double stats_beta_cf(double a, double b, double x) {
    const double tiny = 1e-300, eps = 1e-15;
    double c = 1, d = 1 - (a + b) * x / (a + 1);
    if (std::fabs(d) < tiny) d = tiny;
    d = 1 / d;
    double h = d;
    for (int m = 1; m <= 1000; m++) {
        // two steps per m: the even coefficient d_2m, then the odd d_2m+1
        for (int odd = 0; odd < 2; odd++) {
            double num = odd ? -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
                             : m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m));
            d = 1 + num * d;
            if (std::fabs(d) < tiny) d = tiny;
            c = 1 + num / c;
            if (std::fabs(c) < tiny) c = tiny;
            d = 1 / d;
            h *= d * c;
            if (odd && std::fabs(d * c - 1) < eps) return h;
        }
    }
    return h;   // not converged in 1000 steps: only for extreme a, b, far outside our use
}

// Regularized incomplete beta I_x(a, b) = B(x; a, b) / B(a, b), a, b > 0, x in [0, 1].
inline double stats_beta_inc(double a, double b, double x) {
    if (x <= 0) return 0;
    if (x >= 1) return 1;
    // the prefactor x^a (1-x)^b / B(a, b), in logs to avoid overflow
    double front = std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x));
    // the fraction converges fast on one side of the mean; use the symmetry I_x(a,b) = 1 - I_1-x(b,a) on the other
    if (x < (a + 1) / (a + b + 2)) return front * stats_beta_cf(a, b, x) / a;
    return 1 - front * stats_beta_cf(b, a, 1 - x) / b;
}

// P(T <= t) for Student's t with df > 0 degrees of freedom (df need not be an integer).
inline double stats_t_cdf(double t, double df) {
    double tail = 0.5 * stats_beta_inc(df / 2, 0.5, df / (df + t * t));   // P(T > |t|)
    return t >= 0 ? 1 - tail : tail;
}

// The t with stats_t_cdf(t, df) = p, p in (0, 1), by bisection (the CDF is increasing).
inline double stats_t_quantile(double p, double df) {
    if (!(p > 0 && p < 1)) return std::numeric_limits<double>::quiet_NaN();
    double lo = -1, hi = 1;
    while (stats_t_cdf(lo, df) > p) lo *= 2;
    while (stats_t_cdf(hi, df) < p) hi *= 2;
    for (int i = 0; i < 200 && hi - lo > 1e-13 * (1 + std::fabs(lo)); i++) {
        double mid = 0.5 * (lo + hi);
        (stats_t_cdf(mid, df) < p ? lo : hi) = mid;
    }
    return 0.5 * (lo + hi);
}

struct WelchResult {
    double diff = 0;        // mean(a) - mean(b)
    double t = 0, df = 0;   // Welch's t and the Welch–Satterthwaite degrees of freedom
    double p = 0;           // two-sided p-value
    double lo = 0, hi = 0;  // 95% confidence interval of diff
};

// Welch's two-sample t-test. Needs at least 2 values per sample and not both
// variances 0; otherwise every field but diff is NaN.
inline WelchResult stats_welch(const std::vector<double>& a, const std::vector<double>& b) {
    WelchResult r;
    const double nan = std::numeric_limits<double>::quiet_NaN();
    r.diff = stats_mean(a) - stats_mean(b);
    r.t = r.df = r.p = r.lo = r.hi = nan;
    if (a.size() < 2 || b.size() < 2) return r;
    double na = (double)a.size(), nb = (double)b.size();
    double va = stats_std(a) * stats_std(a) / na, vb = stats_std(b) * stats_std(b) / nb;   // squared standard errors
    double se = std::sqrt(va + vb);
    if (se == 0) return r;
    r.t = r.diff / se;
    r.df = (va + vb) * (va + vb) / (va * va / (na - 1) + vb * vb / (nb - 1));
    r.p = stats_beta_inc(r.df / 2, 0.5, r.df / (r.df + r.t * r.t));   // = 2 P(T > |t|), without cancellation
    double q = stats_t_quantile(0.975, r.df);
    r.lo = r.diff - q * se;
    r.hi = r.diff + q * se;
    return r;
}

// ---------------------------------------------------------------------------
// Paired comparisons: seed s trains both models on the same data order from
// the same shared initial values, so the per-seed differences d_s = a_s - b_s
// are what to test.

// The median (the mean of the middle two for an even count); NaN when empty.
inline double stats_median(std::vector<double> x) {
    if (x.empty()) return std::numeric_limits<double>::quiet_NaN();
    std::sort(x.begin(), x.end());
    size_t n = x.size();
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

// Exact two-sided p of Wilcoxon's signed-rank test of the differences d.
// Zeros are dropped (|d| < 1e-12: Wilcoxon's own rule); |d| that agree to
// 1e-9 are ties and share their average rank. Under the null each sign is
// + or - with probability 1/2 independently, so the distribution of W+ (the
// rank sum of the positive d) is a convolution, one rank at a time: with
// doubled ranks (average ranks are halves) the sums are integers 0 .. S, and
// p = P(|W+ - S/2| >= |w - S/2|). Exact for any n (n = 25 needs 651 sums); 1 when no d is left.
inline double stats_wilcoxon_p(const std::vector<double>& d) {
    std::vector<double> a;
    for (double v : d) if (std::fabs(v) >= 1e-12) a.push_back(v);
    size_t n = a.size();
    if (n == 0) return 1;
    std::vector<size_t> order(n);
    for (size_t i = 0; i < n; i++) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t i, size_t j) { return std::fabs(a[i]) < std::fabs(a[j]); });
    std::vector<int> rank2(n);  // doubled ranks: ranks i+1 .. j of a tied run share i+1+j (= twice their mean)
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        while (j < n && std::fabs(a[order[j]]) - std::fabs(a[order[i]]) < 1e-9) j++;
        for (size_t k = i; k < j; k++) rank2[order[k]] = (int)(i + 1 + j);
        i = j;
    }
    int S = 0, w = 0;
    for (size_t i = 0; i < n; i++) { S += rank2[i]; if (a[i] > 0) w += rank2[i]; }
    std::vector<double> prob(S + 1, 0.0);  // P(W+ = s), doubled ranks
    prob[0] = 1;
    int reach = 0;
    for (size_t i = 0; i < n; i++) {
        reach += rank2[i];
        for (int s = reach; s >= 0; s--) prob[s] = 0.5 * prob[s] + (s >= rank2[i] ? 0.5 * prob[s - rank2[i]] : 0.0);
    }
    double p = 0;
    for (int s = 0; s <= S; s++) if (std::abs(2 * s - S) >= std::abs(2 * w - S)) p += prob[s];
    return std::min(1.0, p);
}

struct PairedResult {
    int n = 0;                               // pairs
    double mean = 0, lo = 0, hi = 0;         // mean of a - b and its 95% paired-t interval
    double t = 0, p_t = 0;                   // paired t (n - 1 df) and its two-sided p
    double median = 0;                       // median of a - b
    int wins = 0, ties = 0, losses = 0;      // pairs with a > b, a == b (|d| < 1e-12), a < b
    double p_wilcoxon = 1;                   // exact signed-rank p (stats_wilcoxon_p)
};

// Paired comparison of a and b (same length: a[i] and b[i] share seed i).
// Interval, t and p_t are NaN for fewer than 2 pairs or differences without spread.
inline PairedResult stats_paired(const std::vector<double>& a, const std::vector<double>& b) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    PairedResult r;
    std::vector<double> d;
    for (size_t i = 0; i < a.size() && i < b.size(); i++) d.push_back(a[i] - b[i]);
    r.n = (int)d.size();
    r.mean = stats_mean(d);
    r.median = stats_median(d);
    for (double v : d) (std::fabs(v) < 1e-12 ? r.ties : v > 0 ? r.wins : r.losses)++;
    r.p_wilcoxon = stats_wilcoxon_p(d);
    r.lo = r.hi = r.t = r.p_t = nan;
    double sd = stats_std(d);
    if (r.n < 2 || !(sd > 0)) return r;
    double se = sd / std::sqrt((double)r.n), df = r.n - 1;
    r.t = r.mean / se;
    r.p_t = stats_beta_inc(df / 2, 0.5, df / (df + r.t * r.t));
    double q = stats_t_quantile(0.975, df);
    r.lo = r.mean - q * se;
    r.hi = r.mean + q * se;
    return r;
}

// Holm's step-down correction of m p-values for testing them together: sorted
// ascending, the k-th smallest (k = 0..m-1) becomes max over j <= k of
// min(1, (m - j) p_(j)); returned in the input's order. It keeps the chance of
// any false "significant" below alpha over all m tests, whatever their dependence.
inline std::vector<double> stats_holm(const std::vector<double>& p) {
    size_t m = p.size();
    std::vector<size_t> order(m);
    for (size_t i = 0; i < m; i++) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] < p[b]; });
    std::vector<double> out(m);
    double running = 0;
    for (size_t k = 0; k < m; k++) {
        running = std::max(running, std::min(1.0, (double)(m - k) * p[order[k]]));
        out[order[k]] = running;
    }
    return out;
}

// Exact two-sided p of the sign test: `wins` pairs one way, `losses` the
// other (ties dropped). Under the null each is a fair coin, so with
// n = wins + losses and k = min(wins, losses), p = min(1, 2 P(X <= k)),
// X ~ Binomial(n, 1/2). 1 when n = 0. The terms are summed in logs, exact
// to rounding for any n.
inline double stats_sign_test_p(int wins, int losses) {
    int n = wins + losses, k = std::min(wins, losses);
    if (n <= 0) return 1;
    double p = 0;
    for (int i = 0; i <= k; i++)
        p += std::exp(std::lgamma(n + 1.0) - std::lgamma(i + 1.0) - std::lgamma(n - i + 1.0) - n * std::log(2.0));
    return std::min(1.0, 2 * p);
}

// Time to an event with censoring: the Kaplan-Meier estimate of S(t), the
// share of subjects whose event has not happened by time t, from times t[i]
// that are each an event (event[i]) or a censoring (the subject left, the
// event unseen). At each distinct event time t_j, with n_j subjects still at
// risk (time >= t_j: one censored at t_j counts as at risk there) and d_j
// events, S(t_j) = S(t_{j-1}) (1 - d_j / n_j), and Greenwood's variance
// Var S(t_j) = S(t_j)^2 sum_{i <= j} d_i / (n_i (n_i - d_i)) (0 once S is 0).
struct KaplanMeierStep {
    double t = 0;            // an event time
    int at_risk = 0, events = 0;
    double survival = 1, se = 0;  // S(t) just after t, and its Greenwood standard error
};
struct SurvivalResult {
    std::vector<KaplanMeierStep> steps;  // one per distinct event time, ascending
    int n = 0, events = 0;
    // The median time (the first event time with S <= 1/2) and its 95%
    // interval after Brookmeyer and Crowley (1982): the times whose S(t) the
    // test of S = 1/2 does not reject, |S(t) - 1/2| <= z se(t) (z = 1.96, the
    // linear form): lo the first event time with S - z se <= 1/2, hi the first
    // with S + z se <= 1/2. Infinity where S never gets there (not reached).
    double median = 0, lo = 0, hi = 0;
};
inline SurvivalResult stats_kaplan_meier(const std::vector<double>& t, const std::vector<bool>& event) {
    const double inf = std::numeric_limits<double>::infinity(), z = 1.959963984540054;
    SurvivalResult r;
    r.n = (int)std::min(t.size(), event.size());
    std::vector<double> times;
    for (int i = 0; i < r.n; i++) if (event[i]) times.push_back(t[i]), r.events++;
    std::sort(times.begin(), times.end());
    times.erase(std::unique(times.begin(), times.end()), times.end());
    double s = 1, greenwood = 0;
    for (double tj : times) {
        KaplanMeierStep k;
        k.t = tj;
        for (int i = 0; i < r.n; i++) {
            k.at_risk += t[i] >= tj;
            k.events += event[i] && t[i] == tj;
        }
        s *= 1 - (double)k.events / k.at_risk;
        if (k.at_risk > k.events) greenwood += (double)k.events / ((double)k.at_risk * (k.at_risk - k.events));
        k.survival = s;
        k.se = s > 0 ? s * std::sqrt(greenwood) : 0;
        r.steps.push_back(k);
    }
    r.median = r.lo = r.hi = inf;
    for (const KaplanMeierStep& k : r.steps) {
        if (k.survival <= 0.5 && r.median == inf) r.median = k.t;
        if (k.survival - z * k.se <= 0.5 && r.lo == inf) r.lo = k.t;
        if (k.survival + z * k.se <= 0.5 && r.hi == inf) r.hi = k.t;
    }
    return r;
}
