// support/model/cost.cpp — what one training step of a model costs, per
// token: its floating-point operations (flops_per_token: forward + backward =
// 3x forward, the router and Hyper-Connections counted) and the bytes its ops
// move if every op streams its arrays from memory (bytes_per_token). bench
// turns them into MFU, analyze prints them, docs/model.md has the numbers.
// Declared in support/model/lime.h; it reads only the Config.
#include "support/model/lime.h"

// MUDDFormer's aggregation after block l (support/study/muddformer.cuh): C ways
// over s = l+2 states, K hidden units; false where there is none (other models, kv's last block).
static bool mudd_aggregation(const Config& c, int l, double* C, double* s, double* K) {
    bool kv = c.mudd_ways == MUDD_KV, last = l == c.L - 1;
    *s = l + 2;
    *C = kv ? (last ? 0 : 2) : (last ? 1 : 4);
    *K = (kv ? 2 : 4) * *s;
    return c.arch == ARCH_MUDDFORMER && *C > 0;
}

// FLOPs per token of one training step (forward + backward = 3x forward).
double flops_per_token(const Config& c, int T) {
    double d = c.d, qd = (double)c.H * c.hd, kvd = (double)c.R * c.hd, fwd = 0;
    for (int l = 0; l < c.L; l++) {
        fwd += 2 * d * (qd + 2 * kvd) + 2 * qd * d + 3 * 2 * d * c.F;  // projections and MLP
        fwd += 2 * 2 * qd * (T + 1) / 2.0;                              // causal scores and mixing
        if (has_router(c, l)) fwd += 2 * 2 * (double)c.R * (l + 1) * c.R * c.hd;  // keys and values
        double n = c.hc_rate;  // hc, per sublayer: the mixtures (width and depth), the dynamic weights
        if (c.arch == ARCH_HC) fwd += 2 * (2 * (n + 1) * n * d + (c.hc_dynamic ? 2 * (n + 2) * n * d : 0));
        if (c.arch == ARCH_RESFORMER && l >= 1) fwd += 2 * 2 * kvd;  // values: lam[0] V[l] + lam[1] V[0]
        if (c.arch == ARCH_DENSEFORMER) fwd += 2 * (l + 2) * d;       // the average of l+2 hidden states
        double C, s, K;  // MUDDFormer after block l: z W1^T, hid W2^T, the C ways' sums over s states
        if (mudd_aggregation(c, l, &C, &s, &K)) fwd += 2 * d * K + 2 * K * C * s + 2 * C * s * d;
        if (c.arch == ARCH_DCA) fwd += 3 * 5 * d * (l + 1);  // three GRNs over l+1 sources: scores 2 d, sums 3 d each
    }
    if (c.arch == ARCH_DCA) fwd += 5 * d * (c.L + 1);  // the final GRN
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
// HC (n streams, K = n+1, a = n K mixing weights a token), per sublayer, in
// place of LLaMa's residual add (4 d forward):
//   forward   width K d + n d + a;  weights n d + 2 a + 3 n (static a + n);
//             depth 2 n d + 2 d + n (with the product's output y)
//   backward  depth (n + K + 2) d + 3 n;  width (K + 2 n) d + 2 a;
//             weights 3 n d + 2 a + 4 n (static a + n)
//   and the embedding's copy into the streams and their sum: 4 (n + 1) d.
// ResFormer, a layer l >= 1: forward the mixture, reads 2 kv, writes kv (vr:
// 2 kv more than the keys' copy's 0 for values); backward zero dvr kv, read
// dvr, V[l], V[0] 3 kv, add into dV[l], dV[0] 4 kv: 3 kv + 8 kv.
// DenseFormer, after block l (K = l+2 arrays): forward the block's output
// written to its own array (LLaMa's residual add, no more bytes) and the
// average, K d read + d written; backward K d (X) + d (dY) read, K d
// read-modify-write (dX) plus the copy 2 d, and the zero-fill once (L+1) d;
// the embedding's gradient add 3 d.
// MUDDFormer, a layer l >= 1: forward the k and v norms 4 d, the norm's
// separate copy 2 d, the k and v products' own inputs 2 d; backward the ways'
// zero-fill W d (W = 3 qkvr, 2 kv), the k and v norms 8 d, the products' own
// inputs and gradients 4 d. The aggregation after block l (C ways, s states,
// K hidden units): forward the norm 2 d, z W1^T d + K, the gelu 2 K, hid W2^T
// K + C s, the ways C s + s d + C d; backward the ways C d + 3 s d + 2 C s (and
// a's sum C s), W2's product C s + 2 K, the gelu 3 K, W1's product K + 2 d,
// the norm's backward into dx 4 d (kv 5 d); once the history's zero-fill
// (L+1) d and the embedding's gradient add 3 d.
// DCA, block l (S = l+1 sources): forward the GRNs read S d and write y_q,
// y_k, y_v and the K and V inputs 5 d (and 3 S scores, 2 rstd); the
// projections read two more inputs 2 d; the attention's add writes a, then
// reads y_q and a and writes h 4 d (LLaMa's 2 d); the norms copy nothing (-2 d):
// (S + 7) d + 3 S + 2. Backward the GRNs read dy_q, the K and V inputs'
// gradients and y_k, y_v 5 d, the sources S d, add into dG 2 S d, zero dy_q d,
// read the scores 3 S and rstd 2; the projections write dk, dv 2 d; d a = d h +
// dG[l+1] 3 d: (3 S + 11) d + 3 S + 2. The final GRN (L+1 sources): forward
// (L+2) d + L+1, backward (2 L + 4) d + L+1.
// docs/model.md ("What HC costs") has the numbers at the bench configs.
double bytes_per_token(const Config& c, int T) {
    double d = c.d, q = (double)c.H * c.hd, kv = (double)c.R * c.hd, F = c.F, S = (double)c.H * T, f = 0;
    for (int l = 0; l < c.L; l++) {
        double J = l + 1;  // a router's sources
        f += 17 * d + 6 * q + 6 * kv + 6 * F + S + (has_router(c, l) ? 2 * J * kv + 2 * kv : 2 * kv);
        f += 29 * d + 11 * q + 13 * kv + 13 * F + S + (has_router(c, l) ? 6 * J * kv + 5 * kv : 3 * kv);
        if (c.arch == ARCH_RESFORMER && l >= 1) f += 3 * kv + 8 * kv;
        double terms = l + 2;  // DenseFormer's average after block l
        if (c.arch == ARCH_DENSEFORMER) f += 2 * (terms + 1) * d + 2 * terms * d + 2 * d;
        double mC, ms, mK, mW = c.mudd_ways == MUDD_KV ? 2 : 3;  // MUDDFormer: ways, states, hidden units
        if (c.arch == ARCH_MUDDFORMER && l >= 1) f += 8 * d + (mW + 12) * d;
        if (mudd_aggregation(c, l, &mC, &ms, &mK))
            f += 2 * d + d + mK + 2 * mK + mK + mC * ms + mC * ms + ms * d + mC * d +             // forward
                 mC * d + 3 * ms * d + 3 * mC * ms + 2 * mK + mC * ms + 3 * mK + mK + 2 * d +  // backward
                 (mW == 2 ? 5 : 4) * d;
        if (c.arch != ARCH_HC) continue;
        double n = c.hc_rate, K = n + 1, a = n * K, dyn = c.hc_dynamic;
        double weights_f = dyn ? n * d + 2 * a + 3 * n : a + n, weights_b = dyn ? 3 * n * d + 2 * a + 4 * n : a + n;
        double fwd = K * d + n * d + a + weights_f + 2 * n * d + 2 * d + n - 4 * d;
        double bwd = (n + K + 2) * d + 3 * n + (K + 2 * n) * d + 2 * a + weights_b;
        f += 2 * (fwd + bwd);  // attention and MLP
    }
    if (c.arch == ARCH_HC) f += 4 * (c.hc_rate + 1) * d;
    if (c.arch == ARCH_DENSEFORMER || c.arch == ARCH_MUDDFORMER) f += (c.L + 1) * d + 3 * d;
    for (int l = 0; c.arch == ARCH_DCA && l < c.L; l++) {
        double S = l + 1;
        f += (S + 7) * d + 3 * S + 2 + (3 * S + 11) * d + 3 * S + 2;
    }
    if (c.arch == ARCH_DCA) f += (c.L + 2) * d + (c.L + 1) + (2 * c.L + 4) * d + (c.L + 1);
    f += 15 * d + 7 * c.V;
    return 4 * f;
}
