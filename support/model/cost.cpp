// support/model/cost.cpp — what one training step of a model costs, per
// token: its floating-point operations (flops_per_token: forward + backward =
// 3x forward, the router and the study models' ops counted) and the bytes its ops
// move if every op streams its arrays from memory (bytes_per_token). bench
// turns them into MFU, analyze prints them, docs/model.md has the numbers.
// Declared in support/model/lime.h; it reads only the Config. A study model's
// own ops count in its file (StudyHooks::flops, ::floats: support/study/).
#include "support/model/lime.h"
#include "support/model/models.h"

// FLOPs per token of one training step (forward + backward = 3x forward).
double flops_per_token(const Config& c, int T) {
    double d = c.d, qd = (double)c.H * c.hd, kvd = (double)c.R * c.hd, fwd = 0;
    for (int l = 0; l < c.L; l++) {
        fwd += 2 * d * (qd + 2 * kvd) + 2 * qd * d + 3 * 2 * d * c.F;  // projections and MLP
        fwd += 2 * 2 * qd * (T + 1) / 2.0;                              // causal scores and mixing
        if (has_router(c, l)) fwd += 2 * 2 * (double)c.R * (l + 1) * c.R * c.hd;  // keys and values
    }
    const StudyHooks* study = study_hooks(c);
    if (study && study->flops) fwd += study->flops(c, T);  // the study model's own ops
    fwd += 2 * d * c.V;  // output layer
    return 3 * fwd;
}

// Bytes per token of one training step, a streaming model: every activation
// array an op reads or writes counts once for that op (no op finds another's
// output in a cache), forward and backward, zero-fills included; the weights
// and AdamW (per step, not per token) are left out. In floats per token, with
// q = H hd, kv = R hd, S = H T (a token's rows of attention probabilities):
//   a layer, forward   17 d + 6 q + 6 kv + 6 F + S, plus 2 kv (the keys' copy)
//                      or a router's 2 (l+1) kv + 2 kv
//            backward  29 d + 11 q + 13 kv + 13 F + S, plus 3 kv (the keys'
//                      add) or a router's 6 (l+1) kv + 5 kv
//   the embedding, final norm, logits and loss: 15 d + 7 V
// A study model's own ops add their floats (StudyHooks::floats, in its file; docs/model.md
// has each model's numbers at the bench configs).
double bytes_per_token(const Config& c, int T) {
    double d = c.d, q = (double)c.H * c.hd, kv = (double)c.R * c.hd, F = c.F, S = (double)c.H * T, f = 0;
    for (int l = 0; l < c.L; l++) {
        double J = l + 1;  // a router's sources
        f += 17 * d + 6 * q + 6 * kv + 6 * F + S + (has_router(c, l) ? 2 * J * kv + 2 * kv : 2 * kv);
        f += 29 * d + 11 * q + 13 * kv + 13 * F + S + (has_router(c, l) ? 6 * J * kv + 5 * kv : 3 * kv);
    }
    const StudyHooks* study = study_hooks(c);
    if (study && study->floats) f += study->floats(c, T);  // the study model's own ops
    f += 15 * d + 7 * c.V;
    return 4 * f;
}
