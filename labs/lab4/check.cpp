// labs/lab4/check.cpp — lab 4's checks: your adamw_numbers (the three groups'
// learning rates and weight decay, the bias corrections), adamw (one
// tensor's update) and clip_scale (global-norm clipping), each against the
// formulas of docs/training.md computed here in double, then one whole
// model_update, then the reference vectors (three AdamW steps).
#include "labs/check.h"

static bool near(double got, double want) { return std::fabs(got - want) <= 1e-5 * (1 + std::fabs(want)); }

static std::string check_numbers() {
    AdamWConfig o;
    o.lr = 2e-3f, o.router_lr = 3e-2f, o.weight_decay = 0.1f, o.beta1 = 0.8f, o.beta2 = 0.9f, o.grad_clip = 0.5f;
    float f = 0.25f;
    int step = 3;
    AdamWNumbers nums = adamw_numbers(o, f, step);
    const char* names[3] = {"matrices", "embedding and gains", "routers"};
    for (int g = 0; g < 3; g++) {
        double lr = (g == GROUP_ROUTER ? o.router_lr : o.lr) * (double)f;
        if (!near(nums.lr[g], lr))
            return strf("lr[%d] (the %s' group) is wrong; hint: %s", g, names[g],
                       g == GROUP_ROUTER ? "the routers have their own learning rate, router_lr, times the schedule "
                                           "factor"
                                         : "this group's learning rate is lr times the schedule factor");
        double wd = g == GROUP_MATRIX ? o.weight_decay : 0.0;
        if (!near(nums.weight_decay[g], wd))
            return strf("weight_decay[%d] (the %s' group) is wrong; hint: weight decay is for the matrices only; "
                       "embedding, gains and routers get none", g, names[g]);
    }
    if (!near(nums.beta1, o.beta1) || !near(nums.beta2, o.beta2) || !near(nums.eps, o.eps) || !near(nums.grad_clip, o.grad_clip))
        return "beta1, beta2, eps or grad_clip is not the config's; hint: copy them from the AdamWConfig";
    if (!near(nums.bc1, 1 - std::pow((double)o.beta1, step)) || !near(nums.bc2, 1 - std::pow((double)o.beta2, step)))
        return strf("bc1 or bc2 is wrong at step %d; hint: the bias corrections are 1 - beta^step", step);
    return "";
}

// One tensor's update, as docs/training.md writes it, with a slip.
enum Slip { NONE, NOTHING, NO_BIAS_CORRECTION, DECAY_WITHOUT_LR, DECAY_IN_GRADIENT, NO_CLIP, EPS_INSIDE_SQRT };
static const char* hint(Slip s) {
    switch (s) {
    case NOTHING: return "p, m and v are as they were: the update writes all three";
    case NO_BIAS_CORRECTION: return "it matches an update without the bias corrections: divide m by bc1 and v by bc2";
    case DECAY_WITHOUT_LR: return "it matches weight decay not scaled by lr: AdamW's decay is p -= lr * wd * p";
    case DECAY_IN_GRADIENT:
        return "it matches weight decay added to the gradient (Adam with L2): AdamW decays the weights "
               "directly, apart from m and v";
    case NO_CLIP: return "it matches the gradient used unclipped: multiply it by grad_scale first";
    case EPS_INSIDE_SQRT: return "it matches eps inside the square root: the denominator is sqrt(vhat) + eps";
    default: return "";
    }
}
static void update_with_slip(Slip s, std::vector<float>* p, std::vector<float>* m, std::vector<float>* v,
                             const std::vector<float>& g, float lr, float wd, float scale, const AdamWNumbers& nums) {
    if (s == NOTHING) return;
    for (size_t i = 0; i < g.size(); i++) {
        double gi = (double)g[i] * (s == NO_CLIP ? 1.0 : scale);
        if (s == DECAY_IN_GRADIENT) gi += wd * (*p)[i];
        double mi = nums.beta1 * (*m)[i] + (1.0 - nums.beta1) * gi, vi = nums.beta2 * (*v)[i] + (1.0 - nums.beta2) * gi * gi;
        double mhat = s == NO_BIAS_CORRECTION ? mi : mi / nums.bc1, vhat = s == NO_BIAS_CORRECTION ? vi : vi / nums.bc2;
        double den = s == EPS_INSIDE_SQRT ? std::sqrt(vhat + nums.eps) : std::sqrt(vhat) + nums.eps;
        double decay = s == DECAY_IN_GRADIENT ? 0 : (s == DECAY_WITHOUT_LR ? 1.0 : lr) * wd * (*p)[i];
        (*p)[i] = (float)((*p)[i] - decay - lr * mhat / den);
        (*m)[i] = (float)mi, (*v)[i] = (float)vi;
    }
}

static std::string check_update(Rng& rng, size_t n, float wd, float scale) {
    AdamWNumbers nums = {};
    nums.beta1 = 0.9f, nums.beta2 = 0.95f, nums.eps = 1e-3f, nums.bc1 = 1 - 0.9f * 0.9f, nums.bc2 = 1 - 0.95f * 0.95f;
    float lr = 0.05f;
    std::vector<float> p = randn(rng, n), m = randn(rng, n, 0.1f), v = randn(rng, n, 0.1f), g = randn(rng, n);
    for (float& x : v) x = std::fabs(x);
    std::vector<float> gp = p, gm = m, gv = v;
    adamw(gp.data(), gm.data(), gv.data(), g.data(), n, lr, wd, scale, nums);
    std::vector<float> want[3], outs[3];
    std::vector<Mistake> mistakes;
    for (Slip s : {NONE, NOTHING, NO_BIAS_CORRECTION, DECAY_WITHOUT_LR, DECAY_IN_GRADIENT, NO_CLIP, EPS_INSIDE_SQRT}) {
        std::vector<float> sp = p, sm = m, sv = v;
        update_with_slip(s, &sp, &sm, &sv, g, lr, wd, scale, nums);
        if (s == NONE) want[0] = sp, want[1] = sm, want[2] = sv;
        else mistakes.push_back({hint(s), {sp, sm, sv}});
    }
    auto at = [](size_t i) { return strf("[%zu]", i); };
    return diagnose({{"p", gp, at}, {"m", gm, at}, {"v", gv, at}}, {want[0], want[1], want[2]}, mistakes,
                    strf("n=%zu, wd=%g, grad_scale=%g", n, wd, scale));
}

static std::string check_clip() {
    struct Case { float norm, clip; const char* hint; };
    Case cases[] = {{10.0f, 1.0f, "a norm above the clip scales the gradients by clip / (norm + 1e-6)"},
                    {0.5f, 1.0f, "clipping only shrinks: a norm below the clip leaves the gradients as they are (1)"},
                    {3.0f, 0.0f, "clip 0 turns clipping off: the factor is 1"},
                    {0.0f, 1.0f, "a zero gradient leaves the factor at 1 (and must not divide by zero)"}};
    for (const Case& c : cases) {
        double want = c.clip > 0 ? std::min(1.0, c.clip / (c.norm + 1e-6)) : 1.0;
        float got = clip_scale(c.norm, c.clip);
        if (!near(got, want)) return strf("clip_scale(norm %g, clip %g) is wrong; hint: %s", c.norm, c.clip, c.hint);
    }
    return "";
}

// model_update on a tiny LIMe with made-up gradients: every tensor moves as
// its group says, after clipping by the global norm of all the gradients.
static std::string check_model_update() {
    Config c;
    c.V = 7, c.L = 2, c.d = 8, c.H = 2, c.R = 1, c.hd = 4, c.F = 8, c.T = 4;
    Model m;
    std::string err = model_create(&m, c, 1, DEVICE_CPU);
    if (!err.empty()) return err;
    model_init(&m, 3);
    Rng rng(5);
    for (size_t i = 0; i < m.n_params; i++) m.grads[i] = (float)rng.normal();
    std::vector<float> p0(m.params, m.params + m.n_params);
    AdamWConfig o;
    o.lr = 1e-2f, o.router_lr = 1e-1f, o.grad_clip = 1.0f;
    double sumsq = 0;
    for (size_t i = 0; i < m.n_params; i++) sumsq += (double)m.grads[i] * m.grads[i];
    double scale = std::min(1.0, o.grad_clip / (std::sqrt(sumsq) + 1e-6));
    m.step = 0;
    model_update(&m, o, 1.0f);
    for (const TensorSpec& t : m.specs)
        for (size_t i = 0; i < t.numel; i++) {
            size_t k = t.offset + i;
            double lr = t.group == GROUP_ROUTER ? o.router_lr : o.lr, wd = t.group == GROUP_MATRIX ? o.weight_decay : 0;
            double g = m.grads[k] * scale, mhat = g, vhat = g * g;  // step 1: m = (1-b1) g, bc1 = 1-b1
            double want = p0[k] - lr * wd * p0[k] - lr * mhat / (std::sqrt(vhat) + o.eps);
            if (std::fabs(m.params[k] - want) > 1e-4 * (1 + std::fabs(want))) {
                model_free(&m);
                return strf("%s[%zu] after one model_update is wrong; hint: check the group's lr and decay, and that "
                           "the clip uses the global norm", t.name.c_str(), i);
            }
        }
    model_free(&m);
    return "";
}

int main() {
    Lab lab;
    Rng rng(2027);
    // each check runs in a child (labs/check.h): it draws from its own copy of rng
    lab.check("numbers_per_group", [] { return check_numbers(); });
    lab.check("clip_scale", [] { return check_clip(); });
    lab.check("adamw_one_tensor", [&] { return check_update(rng, 50, 0.1f, 1.0f); });
    lab.check("adamw_clipped_no_decay", [&] { return check_update(rng, 50, 0.0f, 0.25f); });
    lab.check("adamw_clipped_with_decay", [&] { return check_update(rng, 50, 0.2f, 0.5f); });
    lab.check("model_update_one_step", [] { return check_model_update(); });
    // the whole model, your function in it, against the reference vectors (docs/checkpoint.md)
    lab.check("reference_vectors", [] { return reference_vectors("tests/golden", DEVICE_CPU); });
    return lab.exit_status();
}
